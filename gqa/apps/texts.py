"""Texts for calibration and evaluation, read at run time from a file every CPython has.

``pydoc_data.topics`` (the help() topics: the language reference's prose with code examples).
The evaluation text is the topic ``specialnames`` (the data model's special method names,
about 15,000 SmolLM2 tokens), the calibration text ``compound`` (compound statements, about
12,000): different sections, so scales calibrated on one are measured on the other.  Their
wording follows the Python version, so figures name it (``describe()``).
"""
import sys

EVAL_TOPIC = "specialnames"
CALIBRATION_TOPIC = "compound"


def topic(name):
    from pydoc_data import topics
    return topics.topics[name]


def evaluation_text():
    return topic(EVAL_TOPIC)


def calibration_text():
    return topic(CALIBRATION_TOPIC)


def describe(name):
    v = sys.version_info
    return f"pydoc_data.topics[{name!r}] of Python {v.major}.{v.minor}.{v.micro}"
