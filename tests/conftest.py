"""Shared fixtures: which gqa is tested, the ``kernel_path`` parametrization, the header.

Which gqa is imported:

* the source tree, when it holds an in-place build (``python setup.py build_ext --inplace``
  put compiled extensions into ``gqa/``): a developer testing this checkout;
* otherwise the installed package (CI: ``pip install .`` then ``pytest`` from the root).
  The source tree's ``gqa/`` has no compiled extensions then, and when pytest runs as
  ``python -m pytest`` Python puts the root on sys.path, where that half package would
  shadow the installed one: so the root is taken off sys.path for the import.

``GQA_TEST_IMPORT=installed`` or ``=source`` forces one of the two.  The report header
says which gqa was imported, from where.
"""
import glob
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_root(entry):
    try:
        return os.path.samefile(entry or os.curdir, _ROOT)
    except OSError:
        return False


def _inplace_build_present():
    pkg = os.path.join(_ROOT, "gqa")
    return bool(glob.glob(os.path.join(pkg, "_dispatch*.so")) + glob.glob(os.path.join(pkg, "_dispatch*.pyd")))


def _import_gqa():
    want = os.environ.get("GQA_TEST_IMPORT", "").strip().lower()
    if want not in ("", "installed", "source"):
        raise pytest.UsageError(f"GQA_TEST_IMPORT={want!r}: use 'installed' or 'source'")
    source = want == "source" or (want == "" and _inplace_build_present())
    sys.path[:] = [p for p in sys.path if not _is_root(p)]
    if source:
        sys.path.insert(0, _ROOT)
    try:
        import gqa  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"cannot import gqa ({e}); build it in place (python setup.py build_ext --inplace) "
            "or install it (pip install .)") from e
    inside = os.path.abspath(gqa.__file__).startswith(_ROOT + os.sep)
    if want == "installed" and inside:
        raise pytest.UsageError(f"GQA_TEST_IMPORT=installed but gqa came from {gqa.__file__}")
    return "source tree, in-place build" if inside else "installed"


GQA_ORIGIN = _import_gqa()

import gqa  # noqa: E402
from gqa import _dispatch  # noqa: E402

# What each path needs from the CPU (names as gqa's CPU feature detection reports them).
PATH_FEATURES = {
    "scalar": (),
    "avx2": ("AVX", "AVX2", "FMA", "F16C"),
    "avx512": ("AVX", "AVX2", "FMA", "F16C", "AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL"),
    "neon": ("NEON",),
}


def path_skip_reason(name):
    """None when path `name` can run here, else why not."""
    if _dispatch.path_runnable(name):
        return None
    feats = set(_dispatch.cpu_features())
    missing = [f for f in PATH_FEATURES.get(name, ("?",)) if f not in feats]
    cpu = (f"this CPU lacks {', '.join(missing)}" if missing else "this CPU has the features")
    if name not in _dispatch.COMPILED_PATHS:
        return (f"path {name!r} not compiled into this build "
                f"(compiled: {', '.join(_dispatch.COMPILED_PATHS)}); {cpu}")
    return f"path {name!r} cannot run here: {cpu}"


ALL_PATHS = tuple(_dispatch.PATH_NAMES)
SIMD_PATHS = tuple(p for p in ALL_PATHS if p != "scalar")


def pytest_report_header(config):
    return [
        f"gqa {gqa.__version__} ({GQA_ORIGIN}): {os.path.dirname(gqa.__file__)}",
        f"gqa active path: {gqa.active_path()}; available: {', '.join(gqa.available_paths())}; "
        f"compiled: {', '.join(_dispatch.COMPILED_PATHS)}",
        f"gqa CPU features: {', '.join(_dispatch.cpu_features()) or '(none)'}",
    ]


def _activate(name):
    reason = path_skip_reason(name)
    if reason:
        pytest.skip(reason)
    # approx_vnni off: the kernel tests check the exact contract, whatever the environment says.
    return gqa.config(path=name, approx_vnni=False)


@pytest.fixture(params=ALL_PATHS)
def kernel_path(request):
    """Every test that takes this runs once per path name; the path is active inside."""
    with _activate(request.param):
        yield request.param


@pytest.fixture(params=SIMD_PATHS)
def simd_path(request):
    """Non-scalar paths (for cross-path agreement with 'scalar'); active inside."""
    with _activate(request.param):
        yield request.param


@pytest.fixture(scope="session", autouse=True)
def _gguf_files_parsed_once():
    """Each GGUF file opened read-only is parsed once per session: gqa.apps.gguf and
    transformers (which parses a file twice per load, for its config and its weights) share one
    ``gguf.GGUFReader``.  Reading Gemma 3's 262,144-token vocabulary takes 13 s a parse; the
    readers only read the file (a read-only memory map) and copy what they dequantize."""
    try:
        import gguf
    except ImportError:
        yield
        return
    real, parsed = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        if mode != "r":
            return real(path, mode)
        st = os.stat(path)   # a file written again under the same name is parsed again
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in parsed:
            parsed[key] = real(path, mode)
        return parsed[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = real


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct through gqa.apps.llama, read once per session (tests/test_model.py,
    and the tokenizer of tests/test_transformers_model.py); skips where it is not installed."""
    from gqa.apps import gguf
    if not gguf.available():
        pytest.skip(gguf.unavailable_reason())
    from gqa.apps.llama import Llama
    return Llama.load()


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M through gqa.apps.gemma, read once per session (tests/test_gemma.py, and the
    tokenizer of tests/test_transformers_model.py): reading its GGUF file (262,144 tokens of
    vocabulary) takes 10-20 s.  Skips where the package or the readers are missing."""
    from gqa.apps import gemma, gguf
    if gguf.readers_missing() or gemma.model_path() is None:
        pytest.skip(f"needs {gemma.MODEL_PACKAGE} and the demo extra's readers")
    return gemma.Gemma3.load(gemma.model_path())


@pytest.fixture
def rng(request):
    """A generator seeded from the test id: reproducible, different per test."""
    import zlib

    import numpy as np
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# -- hypothesis profiles (tests/hardening): "ci" is the default; select another with
#    `pytest --hypothesis-profile=long` (or HYPOTHESIS_PROFILE=long).  Tests with their own
#    @settings keep them; the hardening property tests scale with max_examples.
try:
    from hypothesis import HealthCheck, settings as _hsettings
except ImportError:  # pragma: no cover  (the test extra is not installed)
    pass
else:
    _hsettings.register_profile(
        "ci", max_examples=500, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    _hsettings.register_profile(
        "long", max_examples=3000, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    _hsettings.register_profile(   # the sanitizer run (tests/hardening/test_sanitizers.py)
        "sanitize", max_examples=200, deadline=None, derandomize=True, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    _hsettings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
