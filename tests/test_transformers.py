"""gqa.transformers: transformers models over gqa caches.  Small random configs of each family
(seeded ``from_config``) against the same model with transformers' own attention (eager: it
has softcap and sliding windows) and DynamicCache: logits over a prompt and decode steps,
greedy ``generate``, left-padded batches against each sequence alone, beam search, crop, the
quantized formats against the float cache.  Skipped where torch or transformers is missing."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
gt = pytest.importorskip("gqa.transformers")

from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

import gqa  # noqa: E402

C = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
FAMILIES = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=16)),                       # QK norm
    "mistral": (transformers.MistralConfig, dict(sliding_window=6)),
    "phi3": (transformers.Phi3Config, dict(pad_token_id=0)),
    "gemma2": (transformers.Gemma2Config, dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                                               attn_logit_softcapping=3.0, final_logit_softcapping=None)),
    "gemma3": (transformers.Gemma3TextConfig, dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
                                                   layer_types=["sliding_attention", "full_attention",
                                                                "sliding_attention"])),
}
TOL = 1e-4      # relative to the logits' scale: float32 attention in another summation order


def _model(family, seed=0):
    cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = cls(**{**C, **extra})
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():    # weights large enough that attention matters to the logits
        for p in model.parameters():
            p.mul_(3.0 if p.ndim > 1 else 1.0)
    return model


def _steps(model, ids, cache, steps, attention_mask=None):
    """Logits of the prompt, then of `steps` decode steps fed the argmax token."""
    out, logits = ids, []
    pos = None if attention_mask is None else (attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        r = model(ids, attention_mask=attention_mask, position_ids=pos, cache=cache, use_cache=True)
        logits.append(r.logits)
        for _ in range(steps):
            nxt = r.logits[:, -1:].argmax(-1)
            out = torch.cat([out, nxt], 1)
            if attention_mask is not None:    # as generate: positions count the real tokens
                attention_mask = torch.cat([attention_mask, torch.ones_like(nxt)], 1)
                pos = pos[:, -1:] + 1
            r = model(nxt, attention_mask=attention_mask, position_ids=pos, cache=cache, use_cache=True)
            logits.append(r.logits)
    return torch.cat(logits, 1), out


def _close(got, ref, what):
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= TOL * scale, f"{what}: max |diff| {err:.3g} > {TOL} x {scale:.3g}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_float_cache_gives_the_models_own_logits(family):
    model = _model(family)
    ids = torch.randint(1, 96, (1, 11), generator=torch.Generator().manual_seed(1))
    ref, ref_ids = _steps(model, ids, DynamicCache(config=model.config), 8)
    cache = gt.Cache(model, "float", max_length=32)
    got, got_ids = _steps(model, ids, cache, 8)
    _close(got, ref, family)
    assert got_ids.tolist() == ref_ids.tolist()
    assert cache.get_seq_length() == 19 and cache.kv.length == 19


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_generate_is_greedy_identical(family):
    model = _model(family)
    ids = torch.randint(1, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=12, do_sample=False)
        cache = gt.Cache(model, "float", max_length=32)
        got = model.generate(ids, max_new_tokens=12, do_sample=False, cache=cache)
    assert got.tolist() == ref.tolist()


@pytest.mark.parametrize("mode", ["float", "int8-pc", "int4-g16+s2r4+had"])
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_left_padded_batch_gives_each_sequence_what_it_gets_alone(family, mode):
    model = _model(family)
    lens = [7, 4, 9]
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(1, 96, (n,), generator=g) for n in lens]
    S = max(lens)
    ids = torch.zeros((3, S), dtype=torch.long)
    mask = torch.zeros((3, S), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, S - len(s):] = s
        mask[b, S - len(s):] = 1
    kw = {} if mode != "int8-pc" else dict(k_scales=np.full(32, 0.05, np.float32),
                                           v_scales=np.full(32, 0.05, np.float32))
    batch = gt.Cache(model, mode, max_length=32, **kw)
    got, _ = _steps(model, ids, batch, 5, attention_mask=mask)
    assert batch.kv.lengths.tolist() == [n + 5 for n in lens]
    for b, s in enumerate(seqs):
        alone = gt.Cache(model, mode, max_length=32, **kw)
        one, _ = _steps(model, s[None], alone, 5)
        _close(got[b, -6:], one[0, -6:], f"sequence {b}")     # the last prompt row and the steps


def test_quantized_caches_stay_close_to_the_float_cache():
    model = _model("llama")
    ids = torch.randint(1, 96, (1, 20), generator=torch.Generator().manual_seed(4))
    ref, _ = _steps(model, ids, gt.Cache(model, "float", max_length=32), 6)
    cal = gt.calibrate(model, ids)
    errs = {}
    for mode, kw in (("int8-pc", dict(calibration=cal)), ("int8-g16", {}), ("int4-g16+s2r4+had", {})):
        got, _ = _steps(model, ids, gt.Cache(model, mode, max_length=32, **kw), 6)
        errs[mode] = (got - ref).abs().max().item() / ref.abs().max().item()
    # 8-bit codes: within a few % of the logits' scale on this random model; 4 bits: further
    assert 0 < errs["int8-pc"] < 0.05 and 0 < errs["int8-g16"] < 0.05, errs
    assert max(errs["int8-pc"], errs["int8-g16"]) < errs["int4-g16+s2r4+had"] < 1.0, errs


def test_accuracy_level_4_reaches_the_kernels():
    """Cache(accuracy_level=4) gives every layer's operator level 4, and its logits move from
    level 0's by far less than the 8-bit codes themselves moved level 0 from the float cache
    (15-bit query rows and probabilities against 8-bit K and V); with heads of 32 the INT8
    per-channel and the per-group caches (groups of 32) run level 4's integer kernels (the
    matrix tiles off: their bfloat16 prompts are tests/test_tiles.py's)."""
    with gqa.config(tiles=False):
        if gqa._dispatch.int8_dot_unit() is None or gqa._dispatch.group_dot_unit() is None:
            pytest.skip("this CPU runs no integer kernels of level 4 (they need AVX2, or NEON's dot product)")
        _level_4_logits()


def _level_4_logits():
    cls, _ = FAMILIES["llama"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cls(**{**C, "num_attention_heads": 2, "num_key_value_heads": 1}),
                                             attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0 if p.ndim > 1 else 1.0)
    ids = torch.randint(1, 96, (1, 20), generator=torch.Generator().manual_seed(4))
    ref, _ = _steps(model, ids, gt.Cache(model, "float", max_length=32), 6)
    scale = ref.abs().max().item()
    cal = gt.calibrate(model, ids)
    for mode, kw in (("int8-pc", dict(calibration=cal)), ("int8-g32", {}), ("int8-g32+s2r4+had", {})):
        l0, _ = _steps(model, ids, gt.Cache(model, mode, max_length=32, **kw), 6)
        cache = gt.Cache(model, mode, max_length=32, accuracy_level=4, **kw)
        l4, _ = _steps(model, ids, cache, 6)
        assert [op.accuracy_level for op in cache.kv.ops] == [4] * C["num_hidden_layers"]
        d4, d0 = (l4 - l0).abs().max().item() / scale, (l0 - ref).abs().max().item() / scale
        assert 0 < d4 < d0 / 4, (mode, d4, d0)


def test_crop_and_beam_search():
    model = _model("llama")
    ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(5))
    cache = gt.Cache(model, "float", max_length=32)
    full, _ = _steps(model, ids, cache, 4)
    cache.crop(-2)                                  # roll back two decode steps
    assert cache.get_seq_length() == 10 and cache.kv.length == 10
    with torch.no_grad():
        r = model(full[:, 9:10].argmax(-1), cache=cache, use_cache=True).logits
    _close(r[:, 0], full[:, 10], "step after crop")
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False)
        got = model.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False,
                             cache=gt.Cache(model, "float", max_length=32))
    assert got.tolist() == ref.tolist()


def test_speculative_decoding():
    """Prompt-lookup decoding (transformers' speculative decoding without a draft model): each
    step verifies a few candidate tokens in one call (the decode kernels: tests/test_direct.py)
    and crops the rejected ones -- by 0 when all were accepted, which must keep the cache
    (it once emptied it) -- so the tokens are greedy generate's."""
    model = _model("llama")
    ids = torch.tensor([[5, 6, 7, 8, 9] * 4 + [5, 6]])     # n-grams to look up
    cache = gt.Cache(model, "float", max_length=64)
    _steps(model, ids, cache, 2)
    cache.crop(0)
    assert cache.get_seq_length() == 24 and cache.kv.length == 24
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=16, do_sample=False)
        for mode in ("float", "int8-g16"):
            want = _lookup_equals_greedy(model, ids, mode)
            assert mode != "float" or want == ref.tolist()   # transformers' own tokens


def _lookup_equals_greedy(model, ids, mode):
    """Greedy generate's tokens over a Cache of `mode`, which prompt-lookup decoding over
    another must give."""
    want = model.generate(ids, max_new_tokens=16, do_sample=False,
                          cache=gt.Cache(model, mode, max_length=64))
    got = model.generate(ids, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=3,
                         cache=gt.Cache(model, mode, max_length=64))
    assert got.tolist() == want.tolist(), mode
    return want.tolist()


def test_speculative_decoding_over_float_windows():
    """The same over per-group caches with float windows of 4 recent positions: each step's
    rejected candidates have left the recent window by the time they are cropped, and the
    Cache's rollback rows (rollback_size, default ROLLBACK_SIZE) take them back, so the tokens
    are greedy generate's over the same cache.  Without them (rollback_size=0) a crop that
    needs a dropped float row is refused, and says how to allow it."""
    model = _model("llama")
    ids = torch.tensor([[5, 6, 7, 8, 9] * 4 + [5, 6]])
    assert gt.Cache(model, "int4-g16+s2r4", max_length=64)._probe.rollback_size == gt.ROLLBACK_SIZE
    with torch.no_grad():
        for mode in ("int8-g16+s2r4", "int4-g16+s1r4+had"):
            _lookup_equals_greedy(model, ids, mode)
        cache = gt.Cache(model, "int8-g16+s2r4", max_length=64, rollback_size=0)
        _steps(model, ids, cache, 3)
        cache.crop(0)
        with pytest.raises(ValueError, match="rollback_size"):
            cache.crop(-2)
        assert cache.get_seq_length() == 25 and cache.kv.length == 25


def test_without_a_gqa_cache_the_attention_is_sdpas():
    model = _model("mistral")
    ids = torch.randint(1, 96, (2, 10), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        gt.register()
        model.set_attn_implementation("gqa")
        got = model(ids, attention_mask=mask).logits
    _close(got[0], ref[0], "batch 0")
    _close(got[1, 3:], ref[1, 3:], "batch 1")


def test_errors():
    model = _model("llama")
    cache = gt.Cache(model, "int4-g16", max_length=8)
    ids = torch.randint(1, 96, (1, 6))
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="KVCache is full"):
            model(torch.randint(1, 96, (1, 3)), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="not a cache mode"):
        gt.Cache(model, "int3", max_length=8)
    # every option is refused when the Cache is built, not inside the model's first step
    for kw, exc, msg in [
        (dict(mode="int8-pt"), ValueError, "give k_scales and v_scales, or a calibration"),
        (dict(mode="int8-pc", k_scales=0.1, v_scales=0.1), ValueError, r"k_scales\[0\] must have 32 elements"),
        (dict(max_length=0), ValueError, "max_length must be >= 1"),
        (dict(max_length="8"), TypeError, "max_length must be an int"),
        (dict(num_threads=0), ValueError, "num_threads must be >= 1"),
        (dict(accuracy_level=7), ValueError, "accuracy_level must be"),
        (dict(mode="float+had"), ValueError, "rotations apply to a quantized cache"),
        (dict(dtype=np.float16), TypeError, "dtype is read from the model"),
        (dict(foo=1), TypeError, "foo"),
    ]:
        with pytest.raises(exc, match=msg):
            gt.Cache(model, **{"max_length": 8, **kw})
    with pytest.raises(TypeError, match="the layers share one gqa.KVCache"):
        cache.layers[1].crop(-1)           # once per layer would crop every layer N times


def test_the_cache_checked_at_construction_is_the_one_a_single_sequence_uses():
    """The KVCache built to check the options is kept by a first step of one sequence in the
    model's dtype (no second allocation) and replaced for a batch of two."""
    model = _model("llama")
    one = gt.Cache(model, "int4-g16", max_length=16)
    probe = one._probe
    two = gt.Cache(model, "int4-g16", max_length=16)
    with torch.no_grad():
        model(torch.randint(1, 96, (1, 5)), cache=one, use_cache=True)
        model(torch.randint(1, 96, (2, 5)), cache=two, use_cache=True)
    assert one.kv is probe and one._probe is None and one.kv.length == 5
    assert two.kv.batch_size == 2 and two._probe is None and two.kv.length == 5
