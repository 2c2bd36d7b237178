"""AddressSanitizer + UndefinedBehaviorSanitizer run of a representative part of the suite.

The extension is rebuilt with ``GQA_SANITIZE=address,undefined`` (``GQA_SANITIZE_OPT=-Og``: on
an AMD EPYC of 2 vCPU 78 s, against 5.3 min at -O1 -- 4 of them kernels_avx512.c -- while the
subset runs in about the same 2 min) in a copy of the tree, then the subset below runs against that
build (``GQA_TEST_IMPORT=source``) with libasan preloaded into the Python host
(``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``, ``ASAN_OPTIONS=detect_leaks=0`` for
CPython, ``allocator_may_return_null=1`` so that an allocation larger than memory is a
MemoryError as without ASan) and every UBSan report fatal.  A canary first checks that ASan really reports an
out-of-bounds write in this setup, so "clean" means something.

Off by default (about 1.5 min of build and 2 min of tests on 2 cores): set
``GQA_SANITIZE_TESTS=1``; on when the CI variable ``CI`` is set.  Local reruns:
``GQA_SANITIZE_TREE=/some/dir`` builds there once and later only rebuilds what changed.

A second build (``GQA_EMULATE_AMX=1``, setup.py) runs the AMX tier with its tile instructions
stated in portable code (tests/isa/emu_amx.h), where every tile load and store is a ``memcpy``
that ASan checks; the hardware's tile loads are invisible to it (about 1.5 min of build and 2 min
of tests more).  The rest of the amx unit runs natively where the CPU has AVX-512 and
AVX512-BF16; elsewhere the whole avx512 path and its units run on SIMDe
(``GQA_EMULATE_AVX512=1``, as test_emulated.py builds it, here at -Og), where each masked lane is
portable code that ASan checks too (AMD EPYC Zen 3, 2 vCPU: about 4 min of build and 9 min of
tests).
"""
import os
import subprocess
import sys

import pytest

import gqa
from _rebuilt import build, run_suite, simde_found

ENABLED = os.environ.get("GQA_SANITIZE_TESTS") == "1" or bool(os.environ.get("CI"))
pytestmark = [
    pytest.mark.skipif(not ENABLED, reason="sanitizer builds + runs (~7 min): set GQA_SANITIZE_TESTS=1 "
                                           "(on when CI is set)"),
    pytest.mark.skipif(os.environ.get("GQA_IN_SANITIZER_RUN") == "1", reason="already inside the run"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD of libasan: Linux only"),
]

# The subset: every hardening check that is quick under ASan (the fuzzers run thousands of
# hostile and odd-layout calls, of the 1.31.1 surface, the newer one and KVCache), the
# regressions of the newer surface (the window-size overflow reproducer among them), the
# operator against onnxruntime, the kernels at their edge widths on every path, the per-group,
# float-window, rotation and QK-norm kernels, KVCache, flash vs naive except most of the
# tile-size matrix, accuracy level 4's integer-dot units (their tails and masked loads; random
# valid calls at levels 3-4), random valid calls of the newer surface with every score feature, random KVCache programs,
# and levels 3-4's bfloat16 tiles where the CPU has them (their
# strips, float windows' mixed tiles).
SUBSET = [
    "tests/hardening/test_hard_fuzz.py", "tests/hardening/test_hard_property.py",
    "tests/hardening/test_hard_numerics.py", "tests/hardening/test_hard_threads.py",
    "tests/hardening/test_hard_newer.py", "tests/hardening/test_hard_regressions.py",
    "tests/hardening/test_hard_levels.py", "tests/hardening/test_hard_newer_property.py",
    "tests/hardening/test_hard_kvcache_steps.py",
    "tests/test_operator.py", "tests/test_operator_validation.py", "tests/test_quantize.py",
    "tests/test_gemm.py", "tests/test_flash.py", "tests/test_group.py", "tests/test_float_windows.py",
    "tests/test_qk_norm.py", "tests/test_kvcache.py", "tests/test_accuracy_level.py",
    "tests/test_accuracy_level_group.py", "tests/test_tiles.py",
]
DESELECT = "not test_prefill_flash_matches_naive or auto"
# the AMX tier's run (its tiles emulated): what reaches the amx unit; where the avx512 path is
# native (AVX512-BF16 without AMX: Zen 4 / 5), the levels' property tests on the amx tiles too,
# which nothing else runs there (on AVX2-only hosts test_emulated.py runs them, unsanitized)
AMX_SUBSET = ["tests/test_tiles.py", "tests/test_accuracy_level.py", "tests/test_accuracy_level_group.py",
              "tests/test_float_windows.py", "tests/test_kvcache.py", "tests/hardening/test_hard_threads.py"]
AMX_NATIVE_AVX512 = ["tests/hardening/test_hard_levels.py"]
CANARY = ("import numpy as np, gqa._kernels as k\n"
          "k.quantize(np.ones(64, np.float32), np.empty(8, np.int8), np.ones(1, np.float32), 1, 64, 0)\n")


def _libasan():
    cc = os.environ.get("CC", "gcc")
    try:
        out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def _build(tmp_path_factory, name, **build_env):
    """(tree, env): a copy of the repository built with ASan + UBSan (and `build_env`), and the
    run environment.  GQA_SANITIZE_TREE=/dir reuses /dir/<name> (local reruns)."""
    libasan = _libasan()
    if libasan is None:
        pytest.skip("no libasan.so next to the C compiler (gcc -print-file-name=libasan.so)")
    tree = build(tmp_path_factory, name, dict(GQA_SANITIZE="address,undefined", GQA_SANITIZE_OPT="-Og", **build_env),
                 reuse=os.environ.get("GQA_SANITIZE_TREE"), marker="-fsanitize=address,undefined")
    env = dict(os.environ, LD_PRELOAD=libasan, GQA_TEST_IMPORT="source", GQA_IN_SANITIZER_RUN="1",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:allocator_may_return_null=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1", OMP_NUM_THREADS="2",
               HYPOTHESIS_PROFILE="sanitize", PYTHONPATH=tree)
    return tree, env


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory):
    return _build(tmp_path_factory, "gqa-src")


@pytest.fixture(scope="module")
def sanitized_amx(tmp_path_factory):
    """The same with the amx unit's tiles emulated (setup.py's GQA_EMULATE_AMX=1: every tile
    load and store a memcpy, which ASan sees; the hardware's are invisible to it).  On a CPU
    without AVX-512 and AVX512-BF16 the whole avx512 path and its units emulated on SIMDe
    (GQA_EMULATE_AVX512=1, as test_emulated.py builds it)."""
    native = {"AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512BF16"} <= set(gqa.cpu_features())
    if not native and not {"AVX2", "FMA", "F16C"} <= set(gqa.cpu_features()):
        pytest.skip("the emulated AMX tiles need AVX-512 and AVX512-BF16, or AVX2 / FMA / F16C for "
                    "the emulated avx512 path; tests/isa amx-emulated checks the kernels on any x86-64")
    if not native and not simde_found():
        pytest.skip("the emulated avx512 path needs SIMDe (simde/x86/avx512.h): install libsimde-dev (Debian)")
    tree, env = _build(tmp_path_factory, "gqa-src-amx", **({"GQA_EMULATE_AMX": "1"} if native else
                                                           {"GQA_EMULATE_AVX512": "1"}))
    return tree, env, native


def _reports(text):
    return [line for line in text.splitlines()
            if "runtime error:" in line or "ERROR: AddressSanitizer" in line or "ERROR: LeakSanitizer" in line]


def test_asan_is_live(sanitized):
    """An out-of-bounds write through the raw kernel binding (no validation) is reported."""
    tree, env = sanitized
    # scalar path: GCC's ASan does not see the AVX-512 masked loads/stores (see HARD_NOTES.md)
    r = subprocess.run([sys.executable, "-c", CANARY], cwd=tree, env=dict(env, GQA_PATH="scalar"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in r.stderr, \
        f"ASan did not report a deliberate overflow (rc {r.returncode}):\n{r.stderr[-2000:]}"


def _run_clean(tree, env, files, deselect):
    rc, out, summary = run_suite(tree, env, files, deselect)
    found = _reports(out)
    assert not found, "sanitizer reports:\n" + "\n".join(found[:20]) + "\n" + out[-4000:]
    assert rc == 0, f"subset failed under the sanitizers:\n{out[-6000:]}"
    print("sanitizer run:", summary)


def test_subset_runs_clean_under_asan_ubsan(sanitized):
    tree, env = sanitized
    _run_clean(tree, env, SUBSET, DESELECT)


def test_amx_tier_runs_clean_under_asan_ubsan(sanitized_amx):
    """The AMX tier (prompts' bfloat16 tiles, level 4's INT8 tiles, the tile state per thread)
    with its tiles emulated, where they are the build's first choice: the tile and accuracy-level
    tests, float windows' mixed strips, KVCache's steps."""
    tree, env, native = sanitized_amx
    probe = subprocess.run([sys.executable, "-c", "import gqa; print(gqa.get_config()['tiles_effective'])"],
                           cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "amx", f"the emulated build does not pick the amx tiles:\n{probe.stderr[-2000:]}"
    _run_clean(tree, env, AMX_SUBSET + (AMX_NATIVE_AVX512 if native else []), DESELECT)
