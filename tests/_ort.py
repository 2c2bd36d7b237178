"""onnxruntime 1.31.1 as the oracle: a one-node com.microsoft.GroupQueryAttention graph.

The graph builder lives in the package (gqa/apps/ort_peer.py, also used by `python -m gqa bench`);
this module keeps the names the tests use: `available()`, `run_ort(inputs, attrs)` (same
names as gqa.group_query_attention, returns onnxruntime's outputs), `session`, `feeds`, and
`OrtInPlace` (decode steps with past and present bound to the same buffers through
IOBinding, the decoding-loop mode).
"""
from gqa.apps.ort_peer import (ATTRS, INPUT_NAMES, OrtInPlace, _cache, _elem, available, feeds,  # noqa: F401
                           onnx, ort, run_ort, session)
