"""A real model through gqa: SmolLM2-135M-Instruct (the demo extra; `.ci/run` installs it).

The NumPy forward with gqa's float cache against the same forward with plain NumPy attention
and with onnxruntime's operator; the greedy answer to the demo's factual prompt; perplexity of
the INT8 cache against the float cache measured in the same test; the tokenizer; the demo and
eval commands.  Skipped, naming what is missing, where the model is not installed.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import gqa
from gqa.apps import gguf as _gguf, ort_peer as _ort_peer, texts as _texts

pytestmark = pytest.mark.skipif(
    not _gguf.available(), reason=f"the real model is not installed: {_gguf.INSTALL_HINT}")

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__)))


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


def _prompt_and_tail(model):
    prompt = model.chat_prompt("Name three rivers of Europe.")
    tail = model.encode(" The Danube, the Rhine and the Seine. Which of them is the longest?")[:16]
    return prompt, tail


def _logits(model, cache, prompt, tail):
    """Logits of every prompt position, then of 16 decode steps (teacher forced), in place."""
    out = [model.logits(model.forward(np.array(prompt)[None], cache)[0])]
    for t in tail:
        out.append(model.logits(model.forward(np.array([[t]]), cache)[0]))
    return np.concatenate(out)


def test_forward_with_gqa_matches_numpy_attention(model):
    """Float cache: logits within 1e-4 of their scale (max |logit|) over a prompt and 16
    decode steps.  Float32 attention in two summation orders differs by ~1e-6 per layer; 30
    layers and the output matrix keep the logits within a few 1e-6 of their scale (seen 2e-6)."""
    from gqa.apps.model_peers import NumpyAttention
    prompt, tail = _prompt_and_tail(model)
    n = len(prompt) + len(tail)
    ref = _logits(model, model.new_cache(n, cls=NumpyAttention), prompt, tail)
    got = _logits(model, model.new_cache(n), prompt, tail)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.skipif(not _ort_peer.available(), reason=f"onnxruntime {_ort_peer.ORT_VERSION} not installed")
def test_onnxruntime_in_the_loop_matches(model):
    """The eval's onnxruntime side computes the same model: float cache logits within 1e-4 of
    their scale; INT8 per tensor layer 0 caches bit-exact (later layers see inputs that differ
    by float rounding, so their codes may differ by a step)."""
    from gqa.apps.model_peers import OrtAttention
    prompt, tail = _prompt_and_tail(model)
    tail = tail[:4]
    n = len(prompt) + len(tail)
    ref = _logits(model, model.new_cache(n), prompt, tail)
    got = _logits(model, model.new_cache(n, cls=OrtAttention, threads=1, spinning=False), prompt, tail)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    cal = model.calibration(prompt)
    a = model.new_cache(n, "int8-pt", calibration=cal)
    b = model.new_cache(n, "int8-pt", cls=OrtAttention, calibration=cal, threads=1, spinning=False)
    _logits(model, a, prompt, tail)
    _logits(model, b, prompt, tail)
    np.testing.assert_array_equal(a.key[0][:, :, :n], b.key[0][:, :, :n])
    np.testing.assert_array_equal(a.value[0][:, :, :n], b.value[0][:, :, :n])


def test_greedy_answer_names_paris(model):
    from gqa.apps.demo import PROMPT
    prompt = model.chat_prompt(PROMPT)
    r = model.generate(prompt, model.new_cache(len(prompt) + 24), 24)
    assert "Paris" in model.decode(r["ids"])
    assert len(r["ids"]) == 24 or r["ids"][-1] == model.eos_id


def test_tokenizer_and_chat_template(model):
    text = _texts.evaluation_text()[:3000]
    assert model.decode(model.encode(text)) == text
    ids = model.chat_prompt("Hi")
    im_start, im_end = model.encode("<|im_start|>"), model.encode("<|im_end|>")
    assert len(im_start) == 1 and len(im_end) == 1          # control tokens, not split
    assert ids[0] == im_start[0] and ids.count(im_end[0]) == 2
    assert model.tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert model.encode("2024") == [model.encode(d)[0] for d in "2024"]     # digits split


def test_int8_perplexity_close_to_float(model):
    """INT8 per channel: at most 1 % above the float cache's perplexity (computed here), scales
    calibrated on another text; INT4 per tensor, far coarser, is visibly worse (the measure
    sees quantization at all)."""
    from gqa.apps.eval import perplexities
    ev = np.array(model.encode(_texts.evaluation_text()))[:257]
    cal = model.calibration(model.encode(_texts.calibration_text())[:256])
    r = perplexities(model, ev, cal, modes=("int8-pc", "int4-pt"), decode_tail=8)
    assert r["int8-pc"]["ppl"] <= 1.01 * r["float"]["ppl"]
    assert r["int8-pc"]["top1_agreement"] >= 0.9
    assert r["int4-pt"]["ppl"] > 1.05 * r["float"]["ppl"]


def test_perplexity_floor_row(model):
    """The floor row: the float cache at level 0 on the next path down is float32 too, so it
    agrees with level 0 on nearly every position and its perplexity is within 0.1 %; the row
    names its path and level 0."""
    from gqa.apps.eval import floor_path, perplexities
    path = floor_path()
    if path is None:
        pytest.skip("the active path is the lowest runnable: no floor path")
    ev = np.array(model.encode(_texts.evaluation_text()))[:129]
    cal = model.calibration(model.encode(_texts.calibration_text())[:128])
    r = perplexities(model, ev, cal, modes=("float",), decode_tail=4, floor=path)
    row = r[f"float:{path}"]
    assert row["path"] == path and row["accuracy_level"] == 0
    assert row["top1_vs_level0"] >= 0.99
    assert abs(row["rel_vs_level0"]) <= 1e-3


@pytest.mark.parametrize("mode", ["float", "int8-pt"])
def test_speculative_steps_score_as_decode_steps(model, mode):
    """The last 16 positions scored in steps of 4 tokens (the multi-token steps of speculative
    decoding: the decode kernels, tests/test_direct.py) against one decode step each.  Float
    cache: the same next tokens, log-likelihoods within float32 summation orders.  INT8 cache: a
    last-bit change of a layer's output can move a code the next layer writes (README, "The
    disagreements are the INT8 cache's own"), so the tail's mean log-likelihood within 1 % and
    at most 2 of 16 next tokens differing; a step that saw its own later tokens would score
    them far better."""
    ev = np.array(model.encode(_texts.evaluation_text()))[:97]
    kw = {}
    if mode != "float":
        kw = dict(calibration=model.calibration(model.encode(_texts.calibration_text())[:128]))
    runs = [model.score(ev, model.new_cache(len(ev), **gqa.cache_options(mode), **kw), decode_tail=16,
                        tail_step=s) for s in (1, 4)]
    (nll1, top1), (nll4, top4) = runs
    assert np.array_equal(top1[:-16], top4[:-16]) and np.array_equal(nll1[:-16], nll4[:-16])   # the prefill
    if mode == "float":
        assert np.array_equal(top1, top4)
        assert np.abs(nll1 - nll4).max() <= 2e-3, np.abs(nll1 - nll4).max()
    else:
        assert (top1[-16:] != top4[-16:]).sum() <= 2
        assert abs(nll4[-16:].mean() / nll1[-16:].mean() - 1) <= 0.01


def test_full_cache_is_a_value_error(model):
    cache = model.new_cache(8)
    with pytest.raises(ValueError, match=r"KVCache is full: 0 \+ 9 positions exceed max_length \(8\)"):
        model.forward(np.arange(9)[None], cache)
    assert cache.length == 0


def _run(args, tmp_path, timeout=300):
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "gqa"] + args, cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_demo_command(tmp_path):
    out = _run(["demo", "--max-new-tokens", "12", "--threads", "1", "--progress", "off"], tmp_path)
    assert "[float] The capital of France is Paris" in out
    mixed = "int4-g32/int2-g32+s4r64+had+rho1/0.9"
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in ("float", "int8-pc/pt", "int4-pc/pt", mixed)}
    assert set(rows) == {"float", "int8-pc/pt", "int4-pc/pt", mixed}
    assert rows["float"].rstrip().endswith("reference")
    # SmolLM2: 30 layers x (K, V) x 3 KV heads x 64 channels; per group of 32: 8 metadata bytes
    per_pos = {"float": 30 * 2 * 3 * 64 * 4, "int8-pc/pt": 30 * 2 * 3 * 64, "int4-pc/pt": 30 * 2 * 3 * 32,
               mixed: 30 * 3 * ((32 + 16) + (16 + 16))}
    for mode, n in per_pos.items():
        assert f"{n / 1024:.2f} KiB" in rows[mode], (mode, rows[mode])


def test_eval_command(tmp_path):
    import json
    js = tmp_path / "eval.json"
    _run(["eval", "--contexts", "160", "--modes", "int8-pc,int4-pc/pt", "--calib-tokens", "128",
          "--decode-T", "64", "--steps", "1", "--rounds", "1", "--gap-ms", "0", "--threads", "1",
          "--peers", "numpy,ort-nospin", "--json", str(js)], tmp_path)
    res = json.loads(js.read_text())
    ppl = res["perplexity"]["160"]
    assert set(ppl) == {"float", "int8-pc", "int4-pc/pt"}
    assert ppl["float"]["top1_agreement"] == 1.0 and ppl["float"]["rel_change"] == 0.0
    sides = res["speed"]["64"]
    assert {"gqa int8-pt", "gqa float", "numpy float"} <= set(sides)
    assert all(0 < s["attention_ms"] < s["token_ms"] for s in sides.values())
    assert "perplexity, context 160" in res["table"]
