"""The per-head QK RMS norm (q_norm_weight / k_norm_weight, qk_norm_epsilon): beyond
onnxruntime's CPU kernel, so checked against a float64 NumPy statement of norm + rotary +
attention, and against gqa itself fed Q and K normalised in NumPy."""
import numpy as np
import pytest

import gqa
from _cases import dequant_cache, make_case, reference

N, NKV, H = 4, 2, 32
CASES = {  # make_case arguments
    "prompt": dict(B=2, S=6, past=0, ragged=[6, 4]),
    "decode": dict(B=2, S=1, past=9, ragged=[10, 7], buf=16),
    "subsequent": dict(B=1, S=3, past=5, buf=12),
    "packed-prompt": dict(B=1, S=5, past=0, packed=True),
}
ROTARY = {"none": {}, "half": dict(rotary=True), "interleaved-partial": dict(rotary=True, interleaved=1,
                                                                            rot_dim=16, pos_ids=True)}
MODES = {"float": ("NONE", 0), "int8-pt": ("PER_TENSOR", 8), "int4-pc": ("PER_CHANNEL", 4)}
EPS = 1e-5


def _case(case, rotary, mode, seed=3, dtype=np.float32):
    m, bits = MODES[mode]
    kw = dict(CASES[case], **ROTARY[rotary])
    inp, a = make_case(seed=seed, N=N, Nkv=NKV, H=H, mode=m, bits=bits or 8, dtype=dtype, **kw)
    rng = np.random.default_rng(seed + 100)
    inp["q_norm_weight"] = rng.uniform(0.5, 1.5, H).astype(dtype)
    inp["k_norm_weight"] = rng.uniform(0.5, 1.5, H).astype(dtype)
    a["qk_norm_epsilon"] = EPS
    if m != "NONE":   # normed, rotated K reaches |x| ~ 3.7 (unit RMS x weights <= 1.5): no clipping
        lo = 0.03 if bits == 8 else 0.55
        inp["k_scale"] = rng.uniform(lo, 1.1 * lo, inp["k_scale"].size).astype(np.float32)
    if kw.get("buf"):           # in place, the decoding loop's mode
        inp.update(present_key=inp["past_key"], present_value=inp["past_value"])
    return inp, a


def _rms64(x, w):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w.astype(np.float64)


def _rope64(x, inp, a, pos):
    """x [..., H] float64 rotated at integer positions pos (broadcast over x's leading axes)."""
    if not a.get("do_rotary"):
        return x
    cos = inp["cos_cache"].astype(np.float64)[pos]
    sin = inp["sin_cache"].astype(np.float64)[pos]
    r2 = cos.shape[-1]
    out = x.copy()
    if a.get("rotary_interleaved"):
        x0, x1 = x[..., 0:2 * r2:2], x[..., 1:2 * r2:2]
        out[..., 0:2 * r2:2] = x0 * cos - x1 * sin
        out[..., 1:2 * r2:2] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., :r2], x[..., r2:2 * r2]
        out[..., :r2] = x0 * cos - x1 * sin
        out[..., r2:2 * r2] = x0 * sin + x1 * cos
    return out


def _positions(inp, S):
    """[B, S] rotary positions (ONNX Runtime's rules, as gqa applies them)."""
    T = inp["total_sequence_length"]
    B = inp["query"].shape[0]
    pos = inp.get("position_ids")
    if S == T:
        base = int(pos[0, 0]) if pos is not None else 0
        return np.tile(np.arange(S) + base, (B, 1))
    if pos is not None:
        return pos[:, :S]
    return (inp["seqlens_k"].astype(np.int64)[:, None] + 1 - S) + np.arange(S)[None, :]


def _split(inp):
    """query [B, S, N, H] and the new key/value rows [B, S, Nkv, H] of a call."""
    q = inp["query"]
    B, S, _ = q.shape
    if inp.get("key") is None:
        return (q[..., :N * H].reshape(B, S, N, H), q[..., N * H:(N + NKV) * H].reshape(B, S, NKV, H),
                q[..., (N + NKV) * H:].reshape(B, S, NKV, H))
    return (q.reshape(B, S, N, H), inp["key"].reshape(B, S, NKV, H), inp["value"].reshape(B, S, NKV, H))


def _prepared(inp, a):
    """float64 Q and new K as attention reads them: RMS norm, then rotary."""
    q, k, _ = _split(inp)
    pos = _positions(inp, q.shape[1])[:, :, None]
    return (_rope64(_rms64(q, inp["q_norm_weight"]), inp, a, pos),
            _rope64(_rms64(k, inp["k_norm_weight"]), inp, a, pos))


def _call(inp, a):
    call = {k: (v.copy() if isinstance(v, np.ndarray) and k not in ("present_key", "present_value",
                                                                    "past_key", "past_value") else v)
            for k, v in inp.items()}
    if "present_key" in inp:
        call["past_key"], call["past_value"] = inp["past_key"].copy(), inp["past_value"].copy()
        call["present_key"], call["present_value"] = call["past_key"], call["past_value"]
    else:
        call["past_key"], call["past_value"] = inp["past_key"].copy(), inp["past_value"].copy()
    return gqa.group_query_attention(**call, **a)


def _new_rows(inp, S):
    """Per batch entry b: (first cache row, number of rows) of the call's real new tokens
    (a ragged first prompt's padding rows s >= T_b are not tokens)."""
    Tb = inp["seqlens_k"].astype(np.int64) + 1
    first = S == inp["total_sequence_length"]
    return [(0, min(S, int(t))) if first else (int(t) - S, S) for t in Tb]


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("rotary", list(ROTARY))
@pytest.mark.parametrize("case", list(CASES))
def test_qk_norm_against_float64_reference(kernel_path, case, rotary, mode, flash):
    """The cache holds normed, rotated K (within half a quantization step, or float32
    rounding), and the output is attention of the normed, rotated query over that cache."""
    inp, a = _case(case, rotary, mode)
    with gqa.config(path=kernel_path, flash=flash, flash_blocks=(2, 4) if flash else None):
        out, pk, pv = _call(inp, a)[:3]
    m, bits = MODES[mode]
    qr, kr = _prepared(inp, a)
    S = qr.shape[1]
    kd = dequant_cache(pk, inp.get("k_scale"), m, bits, H, NKV)
    vd = dequant_cache(pv, inp.get("v_scale"), m, bits, H, NKV)
    if m == "NONE":
        tol = 4e-6 * np.abs(kr).max()
    else:
        step = inp["k_scale"].astype(np.float64).reshape(-1)
        tol = (step.reshape(NKV, 1, H) if step.size > 1 else step[0]) / 2 * (1 + 1e-5) + 1e-7
    for b, (r0, n) in enumerate(_new_rows(inp, S)):
        err = np.abs(kd[b][:, r0:r0 + n] - kr[b, :n].transpose(1, 0, 2))
        assert (err <= tol).all(), (b, err.max())
    want = reference(dict(inp, query=qr.reshape(qr.shape[0], S, N * H)), dict(a, do_rotary=0), kd, vd)
    valid = np.zeros(want.shape[:2], bool)
    for b, (_, n) in enumerate(_new_rows(inp, S)):
        valid[b, :n] = True
    np.testing.assert_allclose(out[valid], want[valid], rtol=0, atol=2e-5)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("rotary", ["none", "half"])
@pytest.mark.parametrize("case", ["prompt", "decode", "packed-prompt"])
def test_weights_equal_normalising_q_and_k_yourself(case, rotary, mode):
    """Q and K normalised in NumPy (float32, the README's formula) and gqa called without the
    weights give the same caches and outputs, within float32 rounding; a code may differ by
    one step only where its value sits on a rounding boundary."""
    inp, a = _case(case, rotary, mode, seed=7)
    with_w = _call(inp, a)
    plain = dict(inp)
    q, k, _ = _split(inp)
    qn, kn = [(_rms64(x, w)).astype(np.float32) for x, w in
              ((q, inp["q_norm_weight"]), (k, inp["k_norm_weight"]))]
    B, S = q.shape[:2]
    if inp.get("key") is None:
        plain["query"] = np.concatenate([qn.reshape(B, S, -1), kn.reshape(B, S, -1),
                                         inp["query"][..., (N + NKV) * H:]], -1)
    else:
        plain.update(query=qn.reshape(B, S, -1), key=kn.reshape(B, S, -1))
    del plain["q_norm_weight"], plain["k_norm_weight"]
    attrs = {k: v for k, v in a.items() if k != "qk_norm_epsilon"}
    without = _call(plain, attrs)
    np.testing.assert_allclose(with_w[0], without[0], rtol=0, atol=5e-6)
    m, bits = MODES[mode]
    for c1, c2 in zip(with_w[1:3], without[1:3]):
        if m == "NONE":
            np.testing.assert_allclose(c1, c2, rtol=0, atol=4e-6)
        else:
            d1 = dequant_cache(c1, inp["k_scale"], m, bits, H, NKV)   # codes, in units of one step
            d2 = dequant_cache(c2, inp["k_scale"], m, bits, H, NKV)
            step = np.abs(d1 - d2)
            steps = inp["k_scale"].astype(np.float64).reshape(-1)
            one = steps.max()
            assert (step <= one * (1 + 1e-6)).all()
            assert (step > 0).mean() < 0.01


def test_qk_norm_on_every_decode_step_and_rewritten_weights():
    """An in-place decoding loop on one kept operator: every step's cache row and output equal
    a fresh operator's; new weight values written into the same arrays are used."""
    inp, a = _case("decode", "half", "int8-pt", seed=11)
    op = gqa.GroupQueryAttention(**a)
    pk, pv = inp["past_key"].copy(), inp["past_value"].copy()
    for step in range(4):
        x = dict(inp, seqlens_k=inp["seqlens_k"] + step,
                 total_sequence_length=inp["total_sequence_length"] + step)
        if step == 2:
            inp["q_norm_weight"][...] = inp["q_norm_weight"][::-1].copy()
            inp["k_norm_weight"][...] = 2 * inp["k_norm_weight"]
        fresh_k, fresh_v = pk.copy(), pv.copy()
        got = op(**dict(x, past_key=pk, past_value=pv, present_key=pk, present_value=pv))
        want = gqa.GroupQueryAttention(**a)(**dict(x, past_key=fresh_k, past_value=fresh_v,
                                                   present_key=fresh_k, present_value=fresh_v,
                                                   q_norm_weight=x["q_norm_weight"].copy(),
                                                   k_norm_weight=x["k_norm_weight"].copy()))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(pk, fresh_k)


def test_qk_norm_float16_is_computed_in_float32():
    """float16 inputs and weights: the float32 computation rounded to half (outputs within
    float16 rounding of the float32 call on the same values)."""
    i16, a = _case("prompt", "half", "float", seed=5, dtype=np.float16)
    i32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float16 else v)
           for k, v in i16.items()}
    o16 = _call(i16, a)[0]
    o32 = _call(i32, a)[0]
    assert o16.dtype == np.float16
    np.testing.assert_allclose(o16.astype(np.float32), o32, rtol=0, atol=4e-3)


@pytest.mark.parametrize("bad, exc, msg", [
    (dict(k_norm_weight=None), ValueError, "q_norm_weight and k_norm_weight must be given together"),
    (dict(q_norm_weight=np.ones(H + 8, np.float32)), ValueError, r"q_norm_weight must have shape \(head_size,\)"),
    (dict(k_norm_weight=np.ones((1, H), np.float32)), ValueError, "k_norm_weight must have 1 dimensions"),
    (dict(q_norm_weight=np.ones(H, np.float64)), TypeError, "q_norm_weight must have dtype float32"),
    (dict(k_norm_weight=[1.0] * H), TypeError, "k_norm_weight must be a numpy.ndarray"),
])
def test_qk_norm_input_errors(bad, exc, msg):
    inp, a = _case("decode", "none", "int8-pt")
    before = inp["past_key"].copy()
    with pytest.raises(exc, match=msg):
        gqa.group_query_attention(**dict(inp, **bad), **a)
    np.testing.assert_array_equal(inp["past_key"], before)


@pytest.mark.parametrize("eps, exc", [(-1e-6, ValueError), (float("nan"), ValueError),
                                      (float("inf"), ValueError), (True, TypeError), ("1e-6", TypeError)])
def test_qk_norm_epsilon_is_checked(eps, exc):
    with pytest.raises(exc, match="qk_norm_epsilon"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, qk_norm_epsilon=eps)
