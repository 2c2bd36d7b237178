"""Shared fixtures: which gqa is tested, the ``kernel_path`` parametrization, the header.

Which gqa is imported (see TEST_NOTES.md): the *installed* package is preferred.  When
pytest runs as ``python -m pytest`` from the repository root, Python puts the root on
sys.path, and the source tree's ``gqa/`` (which has no compiled extensions after a plain
``pip install .``) would shadow the installed package.  So the root is taken off sys.path
while gqa is imported; only if no installed gqa exists is the root used, which is the
in-place developer build (``python setup.py build_ext --inplace``).  The report header
says which one was picked.
"""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_root(entry):
    try:
        return os.path.samefile(entry or os.curdir, _ROOT)
    except OSError:
        return False


def _import_gqa():
    """Import gqa, preferring an installed package over the source tree (GQA_TEST_SOURCE=1:
    the source tree's in-place build, e.g. a sanitizer build, whatever is installed)."""
    if os.environ.get("GQA_TEST_SOURCE") == "1":
        sys.path.insert(0, _ROOT)
        import gqa  # noqa: F401
        return _origin(gqa)
    sys.path[:] = [p for p in sys.path if not _is_root(p)]
    try:
        import gqa  # noqa: F401  (the installed package, if there is one)
        return _origin(gqa)
    except ImportError:
        for name in [m for m in sys.modules if m == "gqa" or m.startswith("gqa.")]:
            del sys.modules[name]
    sys.path.insert(0, _ROOT)
    import gqa  # noqa: F401,F811  (the in-place build in the source tree)
    return _origin(gqa)


def _origin(mod):
    inside = os.path.abspath(mod.__file__).startswith(_ROOT + os.sep)
    return "source tree" if inside else "installed"


def _inplace_build_present():
    import glob
    return bool(glob.glob(os.path.join(_ROOT, "gqa", "_dispatch*.so")) +
                glob.glob(os.path.join(_ROOT, "gqa", "_dispatch*.pyd")))


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
        f"gqa {gqa.__version__} ({GQA_ORIGIN}): {os.path.dirname(gqa.__file__)}"
        + ("  [note: the source tree also holds an in-place build, not the one tested]"
           if GQA_ORIGIN == "installed" and _inplace_build_present() else ""),
        f"gqa active path: {gqa.active_kernel()}; available: {', '.join(gqa.available_kernels())}; "
        f"compiled: {', '.join(_dispatch.COMPILED_PATHS)}",
        f"gqa CPU features: {', '.join(_dispatch.cpu_features()) or '(none)'}",
    ]


def _activate(name):
    reason = path_skip_reason(name)
    if reason:
        pytest.skip(reason)
    # approx_vnni off: the kernel tests check the exact contract, whatever the environment says.
    return gqa.config(kernel=name, approx_vnni=False)


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
