"""gqa: Group Query Attention over an INT8/INT4 quantized KV cache, on CPU.

Re-implements ONNX Runtime's ``com.microsoft.GroupQueryAttention`` (CPU, with
its quantized KV cache) with per-ISA kernels chosen at runtime.
"""
import os as _os
import sys as _sys

# libgomp (loaded with the extensions below) spins 300,000 iterations at every barrier by
# default: where another process holds a core, a 2-thread call then waits a whole scheduler
# time slice (measured 20-60x slower).  Spin briefly, then sleep -- unless the user chose.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "1000"
# NumPy's OpenBLAS keeps its idle workers spinning for 2^28 cycles (~0.1 s) after every call,
# so in a model's loop they take a core from every attention call between two matrix products
# (measured: 213 us per layer instead of 101).  OPENBLAS_THREAD_TIMEOUT=4 makes them sleep at
# once, which costs back-to-back small matrix products up to ~25 %, so it is set only for gqa's
# own commands (`python -m gqa ...`: sys.argv[0] is "-m" while Python locates the module),
# and only before NumPy has loaded OpenBLAS, which reads it once.  The README says when to set it.
if _sys.argv[:1] == ["-m"] and "numpy" not in _sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in _os.environ:
    _os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"


def _installed_copy():
    """Run from a source checkout without built extensions (e.g. `python -m gqa` in the
    repository root after `pip install .`), defer to the installed package, if any."""
    import importlib.machinery
    import importlib.util
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in _sys.path:
        pkg = os.path.join(os.path.abspath(entry or os.curdir), "gqa")
        built = any(os.path.exists(os.path.join(pkg, "_dispatch" + suffix))
                    for suffix in importlib.machinery.EXTENSION_SUFFIXES)
        if os.path.abspath(pkg) == here or not built:
            continue
        spec = importlib.util.spec_from_file_location(
            "gqa", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
        mod = importlib.util.module_from_spec(spec)
        _sys.modules["gqa"] = mod
        spec.loader.exec_module(mod)
        return mod
    raise ImportError("gqa's compiled extensions are missing here: install with `pip install .` "
                      "or build in place with `python setup.py build_ext --inplace`")


try:
    from . import _dispatch  # noqa: F401
except ImportError:
    if __name__ != "gqa":
        raise
    _sys.modules["gqa"] = _installed_copy()
else:
    from ._version import __version__
    from ._config import (active_kernel, active_path, available_kernels, available_paths,
                          available_tiles, config, get_config)
    from ._api import dequantize, qk_gemm, quantize, sv_gemm
    from ._show import show_config
    from ._dispatch import cpu_features
    from ._operator import GroupQueryAttention, MixedPrecisionGroupQueryAttention
    from ._function import group_query_attention, mixed_precision_group_query_attention
    from ._rotation import calibrate_rotations, hadamard, oscar_rotation
    from ._kvcache import Calibration, KVCache, rotary_caches
    from ._window import window_resident
    from ._formats import (CacheFormat, cache_options, group_row_bytes, mode_name, needs_scales,
                           operator_attributes, parse_mode)

__all__ = [
    "__version__", "config", "get_config", "available_paths", "available_tiles", "active_path",
    "available_kernels", "active_kernel",
    "show_config", "cpu_features",
    "quantize", "dequantize", "qk_gemm", "sv_gemm", "GroupQueryAttention", "group_query_attention",
    "MixedPrecisionGroupQueryAttention", "mixed_precision_group_query_attention", "hadamard",
    "oscar_rotation", "calibrate_rotations",
    "KVCache", "Calibration", "rotary_caches", "window_resident", "group_row_bytes",
    "CacheFormat", "parse_mode", "mode_name", "cache_options", "needs_scales",
    "operator_attributes",
]
