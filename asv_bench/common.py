"""Shared pieces of the gqa benchmarks: importing the gqa under test, the parameter
axes, seeded data, and the skip helper for paths this CPU cannot run."""
import os
import sys
import timeit

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_root(entry):
    try:
        return os.path.samefile(entry or os.curdir, _ROOT)
    except OSError:
        return False


def _import_gqa():
    """The gqa under test: this checkout's in-place build when it has one (compiled
    extensions in gqa/), otherwise the installed package.  After a plain `pip install .`
    the source tree's gqa/ has no compiled extensions and must not shadow the installed
    package, so the repository root is taken off sys.path.  GQA_BENCH_IMPORT=installed
    or =source forces one of the two."""
    import glob
    want = os.environ.get("GQA_BENCH_IMPORT", "").strip().lower()
    pkg = os.path.join(_ROOT, "gqa")
    inplace = bool(glob.glob(os.path.join(pkg, "_dispatch*.so")) + glob.glob(os.path.join(pkg, "_dispatch*.pyd")))
    sys.path[:] = [p for p in sys.path if not _is_root(p)]
    if want == "source" or (want != "installed" and inplace):
        sys.path.insert(0, _ROOT)
    import gqa
    return gqa


gqa = _import_gqa()

PATHS = ["scalar", "avx2", "avx512", "neon"]
MODES = {"s8_pt": (8, False), "s8_pc": (8, True), "s4_pt": (4, False), "s4_pc": (4, True)}
MS = [1, 128]          # query rows: decode (one head) and prefill
SEQS = [512, 2048]     # keys: N of QK, K of SV
HEADS = [64, 128]      # head size: K of QK, N of SV


def skip_unless_runnable(path):
    """asv skips a parameter combination whose setup raises NotImplementedError."""
    if path not in gqa.available_paths():
        raise NotImplementedError(f"path {path!r} cannot run on this machine/build "
                                  f"(available: {', '.join(gqa.available_paths())})")


def packed_width(bits, cols):
    return cols if bits == 8 else (cols + 1) // 2


def codes(rng, rows, cols, bits):
    """Random stored codes [rows, packed cols] over the full range."""
    if bits == 8:
        return rng.integers(-128, 128, size=(rows, cols), dtype=np.int16).astype(np.int8)
    return rng.integers(0, 256, size=(rows, packed_width(4, cols)), dtype=np.int16).astype(np.uint8)


def scales(rng, cols, per_channel):
    return rng.uniform(0.005, 0.05, size=cols if per_channel else 1).astype(np.float32)


class Benchmark:
    """Base: wall-clock timer (kernels may use threads), fixed seed, active path set in
    setup and restored in teardown."""
    timer = timeit.default_timer
    timeout = 120
    seed = 20261129

    def _activate(self, path):
        skip_unless_runnable(path)
        self._prev = gqa.get_config()["path"]
        gqa.config(path=path, approx_vnni=False)
        self.rng = np.random.default_rng(self.seed)

    def teardown(self, *params):
        if hasattr(self, "_prev"):
            gqa.config(path=self._prev)
