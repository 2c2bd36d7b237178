"""The x86 units beyond avx2 through the whole package, emulated, on a CPU that has none of them.

setup.py's ``GQA_EMULATE_AVX512=1`` builds the avx512 path and every unit of it (AVX-512 VNNI,
AVX-512 BF16, the AMX tiles) on SIMDe and tests/isa's emulation headers (emu_avx512.h,
emu_amx.h) with the avx2 path's flags, and the avx2 path's AVX-VNNI unit on emu_avxvnni.h; its
dispatch reports their features wherever the avx2 path runs.  In a copy of the tree built so,
the tests below run the public API on those units -- the matrix tiles' bounds against float64
(tests/test_tiles.py), level 4's integer kernels (tests/test_accuracy_level*.py), float windows
on every path, and the property tests of random valid calls on each kind of tiles and at levels
3-4 (tests/hardening/test_hard_levels.py) -- so that an AVX2-only host (AMD Zen 2/3, where the
suite otherwise skips them) checks what Intel's AMX hosts and AMD Zen 4/5 run natively.
tests/isa checks the same units' kernels against their contracts bit for bit; this checks the
package around them: dispatch, plans, tile state per thread, the bounds of random calls.

The emulated instructions follow the Intel SDM lane by lane (bfloat16 dot products in its
order; the hardware's internal order may differ, which the bounds allow for) and run about
10-50x slower, so shapes stay small.  On when ``CI`` or ``GQA_EMULATE_TESTS=1`` is set, on
x86-64 Linux whose CPU lacks AVX512-BF16 (with it, the suite runs the tiles natively and
test_sanitizers.py runs emulated AMX tiles under ASan); needs SIMDe (Debian libsimde-dev).
About 100 s of build and 4-5 min of tests on 2 vCPU (AMD EPYC Zen 3).
"""
import os
import platform
import shutil
import subprocess
import sys

import pytest

import gqa
from _rebuilt import build, run_suite, simde_found

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "isa"))
from _objdump import avx512_amx_lines, vpdpwssd_lines  # noqa: E402  (tests/isa's checks of emulated objects)

ENABLED = os.environ.get("GQA_EMULATE_TESTS") == "1" or bool(os.environ.get("CI"))
X86_LINUX = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")
pytestmark = [
    pytest.mark.skipif(not ENABLED, reason="the emulated build + run (~6 min): set GQA_EMULATE_TESTS=1 "
                                           "(on when CI is set)"),
    pytest.mark.skipif(os.environ.get("GQA_IN_EMULATED_RUN") == "1", reason="already inside the run"),
    pytest.mark.skipif(not X86_LINUX, reason="the emulated x86 units: x86-64 Linux only"),
    pytest.mark.skipif("AVX512BF16" in gqa.cpu_features(),
                       reason="this CPU runs AVX-512 and its bfloat16 tiles natively (the suite checks them; "
                              "test_sanitizers.py emulates AMX where it is missing)"),
    pytest.mark.skipif(not {"AVX2", "FMA", "F16C"} <= set(gqa.cpu_features()),
                       reason="the emulated units are built on the avx2 path's AVX2 / FMA / F16C"),
]

SUBSET = ["tests/test_tiles.py", "tests/test_accuracy_level.py", "tests/test_accuracy_level_group.py",
          "tests/test_float_windows.py", "tests/test_config.py", "tests/hardening/test_hard_levels.py"]
UNITS = ["avx512", "avx512vnni", "avx512bf16", "amx", "avxvnni"]
PROBE = ("import gqa, gqa._dispatch as d\n"
         "c = gqa.get_config()\n"
         "print(','.join(d.EMULATED_UNITS), gqa.available_paths()[-1], c['tiles_effective'], "
         "c['int8_dot_unit'], c['group_dot_unit'], gqa._dispatch.tiles_runnable('avx512bf16'))\n")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """(tree, env): the copy built with GQA_EMULATE_AVX512=1, and the run environment.
    GQA_EMULATE_TREE=/dir reuses /dir/gqa-emulated (local reruns)."""
    if not simde_found():
        pytest.skip("SIMDe headers (simde/x86/avx512.h) not found: install libsimde-dev (Debian)")
    tree = build(tmp_path_factory, "gqa-emulated", {"GQA_EMULATE_AVX512": "1"},
                 reuse=os.environ.get("GQA_EMULATE_TREE"), marker="-DGQA_EMULATE_AVX512")
    env = dict(os.environ, GQA_TEST_IMPORT="source", GQA_IN_EMULATED_RUN="1", OMP_NUM_THREADS="2",
               PYTHONPATH=tree)
    for k in ("GQA_PATH", "GQA_TILES", "GQA_ACCURACY_LEVEL", "GQA_SANITIZE_TESTS"):
        env.pop(k, None)
    return tree, env


def test_emulated_build_hands_out_every_unit(emulated):
    """The build states the units in portable code (no AVX-512, AMX or vpdpwssd instruction in
    their objects: tests/isa's checks) and hands them out here: the avx512 path, AMX tiles
    first, level 4 on them."""
    tree, env = emulated
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    units, path, tiles, int8, group, bf16 = r.stdout.split()
    assert sorted(units.split(",")) == sorted(UNITS), units
    assert (path, tiles, int8, group, bf16) == ("avx512", "amx", "amx", "avx512vnni", "True"), r.stdout
    objects = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(tree, "build")) for f in fs
               if f.startswith(("kernels_avx512", "kernels_amx", "kernels_avxvnni")) and f.endswith(".o")]
    assert len(objects) == 9, objects   # 7 of the avx512 path, 2 of avxvnni
    if shutil.which("objdump") is None:
        pytest.skip("objdump not found (Debian: binutils)")
    for o in objects:
        bad = avx512_amx_lines(o) + vpdpwssd_lines(o)
        assert not bad, f"{o} issues instructions this CPU may lack:\n" + "\n".join(bad[:10])


def test_units_pass_the_tiles_and_levels_tests(emulated):
    tree, env = emulated
    rc, out, summary = run_suite(tree, env, SUBSET, timeout=1800)
    assert rc == 0, f"the emulated run failed:\n{out[-6000:]}"
    assert " passed" in summary and " failed" not in summary
    print("emulated run:", summary)
