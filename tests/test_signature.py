"""The checked signature of a repeated call (gqa/_signature.pyx): a repeat skips the signature
checks but never the value checks -- same results as a fresh operator (which checks
everything), the same error and message for every invalid value, and any change of the
signature checks it again."""
import re

import numpy as np
import pytest

import gqa
from gqa import _signature as _call
from _cases import make_case

ARGS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
        "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale",
        "v_scale", "present_key", "present_value")


def _counted(op, inp, **kw):
    """(the call's result, how many signatures it checked and built)."""
    before = _call.signatures_built()
    res = op(**inp, **kw)
    return res, _call.signatures_built() - before


def _builds(op, inp, **kw):
    """How many signatures a call checked and built (it may raise)."""
    before = _call.signatures_built()
    try:
        op(**inp, **kw)
    except (ValueError, TypeError):
        pass
    return _call.signatures_built() - before


FEATURES = {
    "int8": dict(mode="PER_TENSOR", bits=8),
    "int4-pc": dict(mode="PER_CHANNEL", bits=4),
    "float": dict(mode="NONE"),
    "rotary-pos": dict(mode="PER_TENSOR", bits=8, rotary=True, pos_ids=True),
    "rotary": dict(mode="PER_TENSOR", bits=4, rotary=True, interleaved=1),
    "packed-bias-sink": dict(mode="PER_TENSOR", bits=8, packed=True, bias="n1", sink=True,
                             smooth_softmax=1),
    "softcap-window": dict(mode="PER_CHANNEL", bits=8, softcap=3.0, local_window_size=5),
    "qk-output": dict(mode="PER_TENSOR", bits=8, qk_output=1),
}


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "fresh-present"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_decode_loop_on_a_kept_signature_equals_fresh_operators(feature, in_place):
    """Four decode steps through one operator, steps 2-4 on the signature step 1 checked,
    against a new operator per step (every check): outputs and caches bit for bit.  In place
    the loop advances one token a step; with fresh present buffers it repeats one step on the
    same past buffers (a new past each step would be a new signature)."""
    inp, a = make_case(seed=5, B=2, S=1, past=9, N=4, Nkv=2, H=16, buf=16 if in_place else None,
                       ragged=[7, 10], **FEATURES[feature])
    reused = gqa.GroupQueryAttention(**a)
    caches = {w: (inp["past_key"].copy(), inp["past_value"].copy()) for w in ("short", "full")}
    rng = np.random.default_rng(7)
    for step in range(4):
        adv = step if in_place else 0
        x = {n: (rng.uniform(-0.5, 0.5, v.shape).astype(np.float32)
                 if n in ("query", "key", "value") else v) for n, v in inp.items()}
        x["seqlens_k"] = inp["seqlens_k"] + adv
        x["total_sequence_length"] = inp["total_sequence_length"] + adv
        if "position_ids" in inp:
            x["position_ids"] = inp["position_ids"] + adv
        if "attention_bias" in inp:
            x["attention_bias"] = rng.uniform(-1, 1, inp["attention_bias"].shape[:3] + (
                x["total_sequence_length"],)).astype(np.float32)
        res = {}
        for who in ("short", "full"):
            pk, pv = caches[who]
            call = dict(x, past_key=pk, past_value=pv)
            if in_place:
                call.update(present_key=pk, present_value=pv)
            if who == "full":
                res[who] = gqa.GroupQueryAttention(**a)(**call)
            elif step == 0:
                res[who] = reused(**call)
            else:
                res[who], built = _counted(reused, call)
                assert built == 0, "a valid repeat checked its signature again"
        assert len(res["short"]) == len(res["full"])
        for got, want in zip(res["short"], res["full"]):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(caches["short"][0], caches["full"][0])
        np.testing.assert_array_equal(caches["short"][1], caches["full"][1])


def _bad(name, x, buf):
    """One invalid (or not short-path-ready) variation of a valid in-place decode call."""
    T = x["total_sequence_length"]
    kw = {}
    if name == "T_below_seqlens":
        x["total_sequence_length"] = T - 1
    elif name == "T_beyond_buffer":
        x["total_sequence_length"] = buf + 1
        x["seqlens_k"] = x["seqlens_k"] * 0 + buf
    elif name == "T_zero":
        x["total_sequence_length"] = 0
    elif name == "T_huge":
        x["total_sequence_length"] = 2 ** 40
    elif name == "T_bool":
        x["total_sequence_length"] = True
    elif name == "T_float":
        x["total_sequence_length"] = float(T)
    elif name == "T_int64_array":
        x["total_sequence_length"] = np.array([T], np.int64)
    elif name == "T_two_elements":
        x["total_sequence_length"] = np.array([T, T], np.int32)
    elif name == "seqlens_negative":
        x["seqlens_k"] = np.array([-1], np.int32)
    elif name == "seqlens_too_small_for_S":       # S = 2 needs seqlens_k >= 1
        x["seqlens_k"] = np.array([0], np.int32)
    elif name == "pos_negative":
        x["position_ids"] = x["position_ids"].copy()
        x["position_ids"][0, 0] = -1
    elif name == "pos_beyond_cos":
        x["position_ids"] = x["position_ids"].copy()
        x["position_ids"][0, 1] = x["cos_cache"].shape[0]
    elif name == "pos_beyond_int32":              # low 32 bits in range: must not wrap
        x["position_ids"] = x["position_ids"].copy()
        x["position_ids"][0, 0] += 2 ** 32
    elif name == "rotary_row_beyond_cos":            # no position_ids: the row is seqlens_k
        x["cos_cache"], x["sin_cache"] = x["cos_cache"][:T - 1], x["sin_cache"][:T - 1]
    elif name == "bias_width":
        x["attention_bias"] = np.zeros(x["attention_bias"].shape[:3] + (T + 1,), np.float32)
    elif name == "query_in_cache":
        x["query"] = x["past_key"].reshape(-1)[:x["query"].size].view(np.float32).reshape(
            x["query"].shape) if x["past_key"].dtype == np.float32 else None
    elif name == "seqlens_in_cache":
        s = x["past_value"].reshape(-1).view(np.uint8)[:4].view(np.int32)
        s[:] = x["seqlens_k"]
        x["seqlens_k"] = s
    elif name == "threads_zero":
        kw["num_threads"] = 0
    elif name == "threads_bool":
        kw["num_threads"] = True
    elif name == "threads_float":
        kw["num_threads"] = 2.0
    elif name == "query_float64":
        x["query"] = x["query"].astype(np.float64)
    else:
        raise AssertionError(name)
    return x, kw


BAD = ["T_below_seqlens", "T_beyond_buffer", "T_zero", "T_huge", "T_bool", "T_float",
       "T_int64_array", "T_two_elements", "seqlens_negative", "seqlens_too_small_for_S",
       "pos_negative", "pos_beyond_cos", "pos_beyond_int32", "rotary_row_beyond_cos", "bias_width", "query_in_cache",
       "seqlens_in_cache", "threads_zero", "threads_bool", "threads_float", "query_float64"]


@pytest.mark.parametrize("bad", BAD)
def test_every_invalid_value_on_a_kept_signature_raises_what_a_fresh_operator_raises(bad):
    """After a valid call kept the signature, each invalid variation raises exactly what a
    fresh operator raises, before any caller buffer changes."""
    mode = "NONE" if bad == "query_in_cache" else "PER_TENSOR"
    pos = bad != "rotary_row_beyond_cos"
    inp, a = make_case(seed=9, B=1, S=2, past=6, N=4, Nkv=2, H=16, mode=mode, bits=8, buf=12,
                       rotary=True, pos_ids=pos, bias="full")
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"], inp["past_value"]
    call = dict(inp, present_key=pk, present_value=pv)
    op(**call)
    assert _builds(op, call) == 0                  # the valid repeat keeps the signature
    x, kw = _bad(bad, dict(call), 12)
    assert x.get("query") is not None
    before = (pk.copy(), pv.copy())
    with pytest.raises((ValueError, TypeError)) as want:
        gqa.GroupQueryAttention(**a)(**x, **kw)
    np.testing.assert_array_equal(pk, before[0])
    with pytest.raises(want.type, match="^" + re.escape(str(want.value)) + "$"):
        op(**x, **kw)
    np.testing.assert_array_equal(pk, before[0])
    np.testing.assert_array_equal(pv, before[1])


def test_a_strided_per_step_input_is_copied_on_the_kept_signature():
    """A valid repeat whose per-step input is not C-contiguous keeps the signature (per-step
    inputs are matched by dtype and shape), is copied for the compute, and gives the same
    result as a fresh operator; new past objects are a new signature."""
    inp, a = make_case(seed=3, B=1, S=1, past=5, N=4, Nkv=2, H=16, buf=8)
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"], inp["past_value"]
    call = dict(inp, present_key=pk, present_value=pv)
    fresh_past = lambda: dict(call, past_key=pk.copy(), past_value=pv.copy(), present_key=None,
                              present_value=None)
    first = fresh_past()                          # kept alive: no other array takes its address
    op(**first)
    wide = np.zeros((1, 1, 2 * inp["query"].shape[2]), np.float32)
    wide[..., ::2] = inp["query"]
    strided = dict(call, query=wide[..., ::2])
    op(**call)
    second = fresh_past()
    assert _builds(op, second) == 1                # new past objects: a new signature
    start = pk.copy(), pv.copy()
    got, built = _counted(op, strided)
    assert built == 0
    written = pk.copy()
    pk[...], pv[...] = start
    want = gqa.GroupQueryAttention(**a)(**fresh_past())
    np.testing.assert_array_equal(got[0], want[0])
    T = inp["total_sequence_length"]
    np.testing.assert_array_equal(written[:, :, :T], want[1][:, :, :T])   # rows past T: unwritten


def _other_signature(name, x):
    """x with one argument of a different signature (dtype, shape, rank, identity, flags)."""
    q = x["query"]
    if name == "query_f64":
        x["query"] = q.astype(np.float64)
    elif name == "query_f16":
        x["query"] = q.astype(np.float16)
    elif name == "query_wider":
        x["query"] = np.zeros(q.shape[:2] + (q.shape[2] + 16,), np.float32)
    elif name == "query_rank":
        x["query"] = q[0]
    elif name == "key_missing":
        x["key"] = None
    elif name == "key_list":
        x["key"] = x["key"].tolist()
    elif name == "seqlens_int64":
        x["seqlens_k"] = x["seqlens_k"].astype(np.int64)
    elif name == "seqlens_2d":
        x["seqlens_k"] = x["seqlens_k"][:, None]
    elif name == "pos_int32":
        x["position_ids"] = x["position_ids"].astype(np.int32)
    elif name == "bias_heads":
        x["attention_bias"] = np.ascontiguousarray(x["attention_bias"][:, :1])
    elif name == "past_copy":                      # same values, another array
        x["past_key"] = x["past_key"].copy()
    elif name == "past_view":                      # the same memory through another view
        x["past_key"] = x["past_key"][:, :, :]
    elif name == "scale_copy":
        x["k_scale"] = x["k_scale"].copy()
    elif name == "cos_copy":
        x["cos_cache"] = x["cos_cache"].copy()
    elif name == "sink_added":
        x["head_sink"] = np.zeros(4, np.float32)
    elif name == "present_readonly":
        x["present_key"].flags.writeable = False
    elif name == "present_dropped":
        x["present_key"] = x["present_value"] = None
    else:
        raise AssertionError(name)
    return x


OTHER = ["query_f64", "query_f16", "query_wider", "query_rank", "key_missing", "key_list",
         "seqlens_int64", "seqlens_2d", "pos_int32", "bias_heads", "past_copy", "past_view",
         "scale_copy", "cos_copy", "sink_added", "present_readonly", "present_dropped"]


@pytest.mark.parametrize("other", OTHER)
def test_another_signature_is_checked_again(other):
    """Any argument whose dtype, shape, rank, identity or flags differ from the kept call's
    has its signature checked again; a valid call's result equals a fresh operator's, an
    invalid one raises what a fresh operator raises."""
    inp, a = make_case(seed=11, B=1, S=1, past=6, N=4, Nkv=2, H=16, mode="PER_TENSOR", bits=8,
                       buf=12, rotary=True, pos_ids=True, bias="full")
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"], inp["past_value"]
    call = dict(inp, present_key=pk, present_value=pv)
    op(**call)
    assert _builds(op, call) == 0
    x = _other_signature(other, dict(call))
    try:
        twin = _clone(x)
        try:
            want = gqa.GroupQueryAttention(**a)(**twin)
        except (ValueError, TypeError) as e:
            with pytest.raises(type(e), match="^" + re.escape(str(e)) + "$"):
                op(**x)
            return
        got, built = _counted(op, x)
        assert built == 1
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    finally:
        pk.flags.writeable = True


def _clone(x):
    """Copies of every array of a call, in-place buffers still the past ones (and flags kept)."""
    memo = {}
    def cp(v):
        if not isinstance(v, np.ndarray):
            return v
        if id(v) not in memo:
            c = v.copy()
            c.flags.writeable = v.flags.writeable
            memo[id(v)] = c
        return memo[id(v)]
    return {k: cp(v) for k, v in x.items()}


def test_scales_rewritten_in_place_are_seen_even_when_strided():
    """The operator reads the scales through what the full path prepared: a view of a
    C-contiguous scale, but a copy of a strided one.  A caller who rewrites a strided scale
    between calls must get the new values (the copy is never reused)."""
    for strided in (False, True):
        inp, a = make_case(seed=13, B=1, S=1, past=6, N=4, Nkv=2, H=16, mode="PER_CHANNEL", bits=8,
                           buf=12)
        if strided:
            wide = np.zeros(2 * inp["k_scale"].size, np.float32)
            wide[::2] = inp["k_scale"]
            inp["k_scale"] = wide[::2]
        op = gqa.GroupQueryAttention(**a)
        pk, pv = inp["past_key"], inp["past_value"]
        call = dict(inp, present_key=pk, present_value=pv)
        start = (pk.copy(), pv.copy())
        op(**call)
        inp["k_scale"][...] = inp["k_scale"] * 3       # the same array, new values
        pk[...], pv[...] = start
        got = op(**call)[0]
        fresh = dict(call, past_key=start[0].copy(), past_value=start[1].copy(),
                     k_scale=np.ascontiguousarray(inp["k_scale"]))
        fresh.update(present_key=fresh["past_key"], present_value=fresh["past_value"])
        want = gqa.GroupQueryAttention(**a)(**fresh)[0]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kept", ["cos_cache", "head_sink", "k_scale"])
def test_kept_input_inside_the_cache_fails_on_every_repeat(kept):
    """In place, a kept input (rotary cache, head_sink, scale) overlapping past_key is an
    error of the signature checks, so the failed signature is not kept: every repeat checks
    it again and raises the same error, with the buffers untouched."""
    mode = "PER_TENSOR" if kept == "k_scale" else "NONE"
    inp, a = make_case(seed=10, B=1, S=1, past=6, N=4, Nkv=2, H=16, mode=mode, bits=8, buf=12,
                       rotary=kept == "cos_cache", sink=kept == "head_sink")
    pk, pv = inp["past_key"], inp["past_value"]
    n = inp[kept].size
    inp[kept] = pk.reshape(-1).view(np.uint8)[:4 * n].view(np.float32).reshape(inp[kept].shape)
    call = dict(inp, present_key=pk, present_value=pv)
    op = gqa.GroupQueryAttention(**a)
    before = (pk.copy(), pv.copy())
    for _ in range(3):
        before_built = _call.signatures_built()
        with pytest.raises(ValueError, match=f"past_key must not overlap {kept}"):
            op(**call)
        assert _call.signatures_built() == before_built     # raised while checking it
        np.testing.assert_array_equal(pk, before[0])
        np.testing.assert_array_equal(pv, before[1])


def test_the_function_keeps_an_operator_per_attribute_set():
    """gqa.group_query_attention reuses the operator (and so the checked signatures) of the
    same attributes: a loop over layers and steps builds one signature per cache; attributes
    of the wrong type are refused even after an equal-comparing valid set was kept (True == 1,
    1.0 == 1 in a dict), and NumPy integers, valid, give the same results."""
    layers = [make_case(seed=30 + i, B=1, S=1, past=5, N=4, Nkv=2, H=16, mode="PER_TENSOR", bits=8,
                        buf=12)[0] for i in range(3)]
    a = make_case(seed=30, B=1, S=1, past=5, N=4, Nkv=2, H=16, mode="PER_TENSOR", bits=8, buf=12)[1]
    calls = [dict(inp, present_key=inp["past_key"], present_value=inp["past_value"]) for inp in layers]
    before = _call.signatures_built()
    for step in range(3):
        for call in calls:
            gqa.group_query_attention(**call, **a)
            call["seqlens_k"] = call["seqlens_k"] + 1
            call["total_sequence_length"] += 1
    assert _call.signatures_built() - before == len(calls)
    with pytest.raises(TypeError, match="num_heads must be an int"):
        gqa.group_query_attention(**calls[0], **dict(a, num_heads=4.0))
    with pytest.raises(TypeError, match="causal must be an int"):
        gqa.group_query_attention(**calls[0], **dict(a, causal=True))
    x = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in calls[1].items()}
    x.update(present_key=x["past_key"], present_value=x["past_value"])
    y = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in x.items()}
    y.update(present_key=y["past_key"], present_value=y["past_value"])
    got = gqa.group_query_attention(**x, **dict(a, num_heads=np.int64(4)))
    want = gqa.GroupQueryAttention(**a)(**y)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_call_never_binds_the_calling_thread():
    """gqa's worker threads may bind themselves away from the caller's CPU; the caller's own
    affinity mask never changes."""
    import os
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no per-thread affinity on this OS")
    inp, a = make_case(seed=4, B=1, S=1, past=600, N=4, Nkv=2, H=64, mode="PER_TENSOR", bits=8, buf=1024)
    mask = os.sched_getaffinity(0)
    for _ in range(20):
        gqa.GroupQueryAttention(**a)(**inp, num_threads=2)
    assert os.sched_getaffinity(0) == mask
