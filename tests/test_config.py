"""Runtime dispatch and configuration: available/active paths, gqa.config as setter and
context manager, get_config, errors, environment variables read at import, show_config
and ``python -m gqa``."""
import io
import os
import subprocess
import sys
from fractions import Fraction

import pytest

import gqa
from gqa import _dispatch
from gqa._plan import flash_plan

BEST_FIRST = ("avx512", "avx2", "neon", "scalar")  # the preference order
ENV_NAMES = ("GQA_PATH", "GQA_KERNEL", "GQA_QKGEMM_S8_APPROX_VNNI", "ORT_MLAS_QKGEMM_S8_APPROX_VNNI",
             "GQA_NUM_THREADS", "GQA_DISABLE_FLASH_ATTENTION", "ORT_GQA_DISABLE_FLASH_ATTENTION",
             "GQA_TILES", "GQA_ACCURACY_LEVEL")


def unavailable_path():
    """A path name this CPU cannot run (neon on x86, avx2/avx512 on arm), or None."""
    for p in ("neon", "avx512", "avx2"):
        if p not in gqa.available_paths():
            return p
    return None


@pytest.fixture(autouse=True)
def restore_config():
    before = gqa.get_config()
    yield
    gqa.config(path=before["path"], approx_vnni=before["approx_vnni"])
    assert gqa.active_path() == before["active_path"]


def run_python(code, tmp_path, **env):
    """Run `python -c code` with the gqa under test importable, in an empty directory
    (so the source tree cannot shadow it), with the given gqa environment variables."""
    e = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__)))
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=e,
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- introspection

def test_available_paths():
    av = gqa.available_paths()
    assert isinstance(av, list) and "scalar" in av
    assert set(av) <= set(_dispatch.PATH_NAMES) and set(av) <= set(_dispatch.COMPILED_PATHS)
    assert av == [p for p in _dispatch.PATH_NAMES if p in av]  # stable order, no duplicates
    assert set(_dispatch.PATH_NAMES) == {"scalar", "avx2", "avx512", "neon"}
    feats = set(_dispatch.cpu_features())
    if "avx2" in av:
        assert {"AVX", "AVX2", "FMA"} <= feats
    if "avx512" in av:
        assert {"AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL"} <= feats
    if "neon" in av:
        assert "NEON" in feats


def test_default_path_is_best_available(tmp_path):
    r = run_python("import gqa; print(gqa.active_path()); print(','.join(gqa.available_paths()))",
                   tmp_path)
    assert r.returncode == 0, r.stderr
    active, av = r.stdout.split()
    assert active == next(p for p in BEST_FIRST if p in av.split(","))


def test_get_config_keys():
    cfg = gqa.get_config()
    for key in ("path", "active_path", "approx_vnni", "approx_vnni_effective", "plan_cpus"):
        assert key in cfg, key
    assert cfg["active_path"] == gqa.active_path()
    assert cfg["path"] in ("auto",) + tuple(_dispatch.PATH_NAMES)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_decode_plan_counts_the_cpus_this_process_may_use(tmp_path):
    """The decode plan is made for the CPUs of the process's affinity mask (a container's or
    taskset's CPU set), not for every CPU of the host: a process started on k CPUs plans the
    seed shape's 8 units (2048 keys) as k home ranges, each ending in a unit cut in 4."""
    assert gqa.get_config()["plan_cpus"] == len(os.sched_getaffinity(0))
    cpus = sorted(os.sched_getaffinity(0))
    for k in sorted({1, min(2, len(cpus))}):
        code = (f"import os; os.sched_setaffinity(0, {cpus[:k]}); "
                "import gqa; from gqa._plan import flash_plan; "
                "print(gqa.get_config()['plan_cpus'], *flash_plan(1, 1, 8, 2, 128, 2048)[2:4])")
        r = run_python(code, tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [str(k), "4", str(k)], (k, r.stdout)


def _shared_out(units, splits, cpus):
    """How evenly units x splits equal pieces share out over the CPUs: pieces / (CPUs x rounds)."""
    n = units * splits
    return Fraction(n, cpus * -(-n // cpus))


def test_decode_plan_splits_few_units_evenly(tmp_path):
    """Fewer units than max(8, CPUs): each unit's keys in at least ceil(max(8, CPUs) / units)
    chunks (of >= 256 keys) and at most twice that, the count whose pieces share out most evenly
    over the CPUs, the fewest on a tie.  The ceiling was once C division (-(-8 // 3) == 2): 3
    units took 2 chunks and 5-7 units none, so on 2 CPUs 5 or 7 pieces left one CPU idle for
    the last."""
    cpus = gqa.get_config()["plan_cpus"]
    for units in range(1, max(8, cpus)):
        for T in (100, 700, 3001, 8192):
            got = flash_plan(1, 1, units, 2, 64, T)[2]
            most = T // 256
            if most < 1:
                assert got == 1
                continue
            s0 = min(-(-max(8, cpus) // units), most)
            want = max(range(s0, min(2 * s0, most) + 1), key=lambda s: (_shared_out(units, s, cpus), -s))
            assert got == want, (units, T, cpus)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) >= 2:     # on 2 CPUs: 3 units in 4 chunks (6 pieces a CPU), 5-7 in 2
        code = (f"import os; os.sched_setaffinity(0, {allowed[:2]}); from gqa._plan import flash_plan; "
                "print(*[flash_plan(1, 1, u, 3, 64, 8192)[2] for u in (3, 5, 6, 7)])")
        r = run_python(code, tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["4", "2", "2", "2"]


# ---------------------------------------------------------------- gqa.config

@pytest.mark.parametrize("name", ["scalar", "avx2", "avx512", "neon"])
def test_config_setter(name):
    if name not in gqa.available_paths():
        pytest.skip(f"{name} cannot run here")
    gqa.config(path=name)
    assert gqa.active_path() == name
    assert gqa.get_config()["path"] == name
    assert gqa.get_config()["active_path"] == name
    gqa.config(path="auto")
    assert gqa.active_path() == next(p for p in BEST_FIRST if p in gqa.available_paths())
    assert gqa.get_config()["path"] == "auto"


def test_config_context_manager_restores():
    approx0 = gqa.get_config()["approx_vnni"]
    gqa.config(path="auto")
    auto = gqa.active_path()
    with gqa.config(path="scalar") as c:
        assert c is not None
        assert gqa.active_path() == "scalar"
        for other in gqa.available_paths():
            with gqa.config(path=other):
                assert gqa.active_path() == other
            assert gqa.active_path() == "scalar"
    assert gqa.active_path() == auto and gqa.get_config()["path"] == "auto"
    # restored also when the body raises
    with pytest.raises(RuntimeError):
        with gqa.config(path="scalar"):
            raise RuntimeError("boom")
    assert gqa.active_path() == auto
    # a setting not named is left as it is
    with gqa.config(approx_vnni=not approx0):
        assert gqa.active_path() == auto and gqa.get_config()["approx_vnni"] is (not approx0)
    assert gqa.get_config()["approx_vnni"] is approx0


def test_unknown_path_name():
    before = gqa.get_config()
    with pytest.raises(ValueError) as ei:
        gqa.config(path="avx3")
    msg = str(ei.value)
    assert "path" in msg and "avx3" in msg
    for valid in ("auto", "scalar", "avx2", "avx512", "neon"):
        assert valid in msg, f"{valid!r} not listed in: {msg}"
    assert gqa.get_config() == before
    with pytest.raises(TypeError) as ei:
        gqa.config(path=2)
    assert "path" in str(ei.value)


def test_forcing_a_path_this_cpu_cannot_run():
    bad = unavailable_path()
    if bad is None:
        pytest.skip("this CPU runs every path")
    before = gqa.get_config()
    with pytest.raises(ValueError) as ei:
        gqa.config(path=bad)
    msg = str(ei.value)
    assert "path" in msg and bad in msg and "scalar" in msg  # names what can run
    assert gqa.get_config() == before and gqa.active_path() == before["active_path"]
    with pytest.raises(ValueError):
        with gqa.config(path=bad):
            pytest.fail("entered a context for a path that cannot run")
    assert gqa.active_path() == before["active_path"]


def test_approx_vnni_setting():
    approx0 = gqa.get_config()["approx_vnni"]
    with gqa.config(approx_vnni=True):
        cfg = gqa.get_config()
        assert cfg["approx_vnni"] is True
        assert cfg["approx_vnni_effective"] == (_dispatch.approx_vnni_runnable()
                                                and gqa.active_path() == "avx512")
        with gqa.config(path="scalar"):
            assert gqa.get_config()["approx_vnni_effective"] is False  # only on AVX-512 VNNI
    assert gqa.get_config()["approx_vnni"] is approx0
    with gqa.config(approx_vnni=False):
        assert gqa.get_config()["approx_vnni_effective"] is False


# ---------------------------------------------------------------- environment at import

def test_env_kernel_bogus(tmp_path):
    r = run_python("import gqa", tmp_path, GQA_PATH="bogus")
    assert r.returncode != 0
    assert "GQA_PATH" in r.stderr and "bogus" in r.stderr
    for valid in ("auto", "scalar", "avx2", "avx512", "neon"):
        assert valid in r.stderr.splitlines()[-1], r.stderr
    assert "Illegal instruction" not in r.stderr


def test_env_kernel_unrunnable(tmp_path):
    bad = unavailable_path()
    if bad is None:
        pytest.skip("this CPU runs every path")
    r = run_python("import gqa; print('imported')", tmp_path, GQA_PATH=bad)
    assert r.returncode != 0 and "imported" not in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert "GQA_PATH" in last and bad in last and "scalar" in last, r.stderr
    assert r.returncode > 0  # an exception, not a signal (SIGILL would be negative)


@pytest.mark.parametrize("value", ["scalar", "auto", ""])
def test_env_kernel_valid(tmp_path, value):
    r = run_python("import gqa; c = gqa.get_config(); print(c['kernel'], gqa.active_path(), "
                   "','.join(gqa.available_paths()))", tmp_path, GQA_PATH=value)
    assert r.returncode == 0, r.stderr
    kernel, active, av = r.stdout.split()
    if value == "scalar":
        assert kernel == "scalar" and active == "scalar"
    else:
        assert kernel == "auto" and active == next(p for p in BEST_FIRST if p in av.split(","))


@pytest.mark.parametrize("name", ["GQA_QKGEMM_S8_APPROX_VNNI", "ORT_MLAS_QKGEMM_S8_APPROX_VNNI"])
def test_env_approx_vnni(tmp_path, name):
    code = ("import gqa; from gqa import _dispatch; c = gqa.get_config(); "
            "print(c['approx_vnni'], c['approx_vnni_effective'], _dispatch.approx_vnni_runnable(), "
            "gqa.active_path())")
    r = run_python(code, tmp_path, **{name: "1"})
    assert r.returncode == 0, r.stderr
    req, eff, runnable, active = r.stdout.split()
    assert req == "True"
    assert eff == str(runnable == "True" and active == "avx512")  # effective only where runnable
    r = run_python(code, tmp_path, **{name: "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["False", "False"]
    r = run_python(code, tmp_path)
    assert r.stdout.split()[:2] == ["False", "False"]


# ---------------------------------------------------------------- show_config / python -m gqa

def _check_config_text(text, active):
    assert gqa.__version__ in text
    low = text.lower()
    for word in ("compiled", "cpu features", "available", "active", "openmp", "thread"):
        assert word in low, f"{word!r} missing from:\n{text}"
    for p in _dispatch.COMPILED_PATHS:
        assert p in text
    for f in _dispatch.cpu_features():
        assert f in text
    active_line = next(line for line in text.splitlines() if "active" in line.lower())
    assert active in active_line, text
    emulated = [line for line in text.splitlines() if "emulated units" in line]
    if _dispatch.EMULATED_UNITS:   # a tests-only build (setup.py GQA_EMULATE_*) says so
        assert len(emulated) == 1 and all(u in emulated[0] for u in _dispatch.EMULATED_UNITS), text
    else:
        assert not emulated, text


def test_show_config():
    buf = io.StringIO()
    with gqa.config(path="scalar"):
        gqa.show_config(file=buf)
    _check_config_text(buf.getvalue(), "scalar")


def test_python_m_gqa(tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__)))
    e["GQA_PATH"] = "scalar"
    # `python -m gqa` alone also runs the demo (tests/test_cli.py); `config` is the print
    r = subprocess.run([sys.executable, "-m", "gqa", "config"], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check_config_text(r.stdout, "scalar")


def test_the_earlier_names_of_path_are_aliases(tmp_path):
    """GQA_KERNEL, config(kernel=), available_kernels(), active_kernel() and get_config()'s
    kernel / active_kernel keys: the earlier spellings of path, the same settings."""
    assert gqa.available_kernels() == gqa.available_paths()
    with gqa.config(kernel="scalar"):
        assert gqa.active_kernel() == gqa.active_path() == "scalar"
        cfg = gqa.get_config()
        assert cfg["kernel"] == cfg["path"] == "scalar" and cfg["active_kernel"] == "scalar"
    with pytest.raises(TypeError, match="not both"):
        gqa.config(path="scalar", kernel="scalar")
    with pytest.raises(ValueError, match="kernel='avx3'"):
        gqa.config(kernel="avx3")
    r = run_python("import gqa; print(gqa.active_path())", tmp_path, GQA_KERNEL="scalar")
    assert r.stdout.strip() == "scalar", r.stderr


@pytest.mark.parametrize("value", ["0", "1", "amx", "avx512bf16", "sme"])
def test_env_tiles(tmp_path, value):
    """GQA_TILES: a boolean, or the name of tiles this CPU runs; another name, or tiles the
    CPU lacks, is an error at import naming the variable (never a crash)."""
    code = "import gqa; c = gqa.get_config(); print(repr(c['tiles']), c['tiles_effective'])"
    r = run_python(code, tmp_path, GQA_TILES=value)
    runs = value in ("0", "1") or (value in _dispatch.tile_names() and _dispatch.tiles_runnable(value))
    if not runs:
        assert r.returncode > 0, r.stdout
        last = r.stderr.strip().splitlines()[-1]
        assert "GQA_TILES" in last and value in last, r.stderr
        return
    assert r.returncode == 0, r.stderr
    setting, effective = r.stdout.split()
    if value == "0":
        assert setting == "False" and effective == "None"
    elif value == "1":   # the best tiles this CPU runs (tile_names: best first)
        best = next((n for n in _dispatch.tile_names() if _dispatch.tiles_runnable(n)), None)
        assert setting == "True" and effective == str(best if "avx512" in gqa.available_paths() else None)
    else:
        assert setting == repr(value) and effective == (value if "avx512" in gqa.available_paths() else "None")
