"""Valid GroupQueryAttention calls from a small JSON-able *spec* (for hypothesis and the
fuzzers), and the checks every valid call must pass: flash vs naive always, onnxruntime
1.31.1 where it supports the combination, the float64 reference for mixed K/V modes.

A spec is a plain dict, so a failing example prints as something that can be pasted into
``@example(spec=...)`` or ``build(spec)`` to reproduce it.
"""
import numpy as np

import gqa
import _ort
from _cases import dequant_cache, make_case, reference

# flash vs naive (README "Attention paths"); ours vs onnxruntime (README "Numeric contract")
FLASH_TOL = {8: 1e-4, 4: 1e-3, 0: 1e-5}
ORT_TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3}
F16_STEP = 2.0 ** -10         # float16's rounding step relative to the value (normal numbers)
_DT = {"f32": np.float32, "f16": np.float16}


def build(spec):
    """(inputs, attributes, call kwargs) of the valid call that `spec` describes.

    spec keys: seed, phase ('prompt' | 'decode' | 'subsequent'), B, S, past (max past rows),
    pasts (per-batch past rows, or None), prompt_lens (first prompt: per-batch T_b <= S, or
    None), N, Nkv, H, mode, v_mode, bits, dtype ('f32' | 'f16'), buf_extra (extra past buffer
    rows), T_extra (total_sequence_length beyond max T_b), packed, shared_kv (key/value of
    length 0, all keys already cached), rotary, interleaved, rot_dim, pos_ids, bias, sink,
    smooth, window, softcap, qk_output, scale, causal, inplace, t_array."""
    s = spec
    B, S, H = s["B"], s["S"], s["H"]
    kw = dict(B=B, S=S, N=s["N"], Nkv=s["Nkv"], H=H, mode=s["mode"], bits=s["bits"] or 8,
              dtype=_DT[s["dtype"]], packed=s["packed"], rotary=s["rotary"],
              interleaved=int(s["interleaved"]), rot_dim=s["rot_dim"], pos_ids=s["pos_ids"],
              bias=s["bias"], sink=s["sink"])
    if s["mode"] != "NONE":
        kw["v_mode"] = s["v_mode"]
    attrs = {}
    if s["smooth"]:
        attrs["smooth_softmax"] = 1
    if s["window"] >= 0:
        attrs["local_window_size"] = s["window"]
    if s["softcap"]:
        attrs["softcap"] = s["softcap"]
    if s["qk_output"]:
        attrs["qk_output"] = s["qk_output"]
    if s["scale"]:
        attrs["scale"] = s["scale"]
    if not s["causal"]:
        attrs["causal"] = 0
    if s["phase"] == "prompt":
        if s["prompt_lens"] is not None:
            kw["ragged"] = list(s["prompt_lens"])
        kw["past"] = 0
    else:
        pasts = s["pasts"] if s["pasts"] is not None else [s["past"]] * B
        kw["ragged"] = [p + S for p in pasts]
        kw["past"] = max(pasts)
        # Past buffer: exactly the past rows (onnxruntime's "dynamic" cache, T = P + S), or a
        # "static" buffer holding at least T rows (buf_extra > 0; in-place and shared-KV calls
        # need one).  onnxruntime refuses P < T < P + S; we accept it (present gets T rows).
        static = s["inplace"] or s["shared_kv"] or s["buf_extra"] > 0
        kw["buf"] = max(pasts) + s["T_extra"] + (S + s["buf_extra"] if static else 0)
    inp, a = make_case(seed=s["seed"], **kw, **attrs)
    a = dict(a)
    T = inp["total_sequence_length"]
    if s["phase"] != "prompt" and s["T_extra"]:
        T = T + s["T_extra"]               # a larger total length changes only shapes
        inp["total_sequence_length"] = T
        if inp.get("attention_bias") is not None:
            rng = np.random.default_rng(s["seed"] + 1)
            shp = inp["attention_bias"].shape[:3] + (T,)
            inp["attention_bias"] = rng.uniform(-1, 1, shp).astype(inp["attention_bias"].dtype)
    if s["shared_kv"]:
        # the new K/V rows are already in the cache: key/value of length 0
        assert s["phase"] != "prompt" and not s["packed"]
        inp["key"] = inp["key"][:, :0]
        inp["value"] = inp["value"][:, :0]
    if s["t_array"]:
        inp["total_sequence_length"] = np.array([T], np.int32)
    call = {}
    if s["inplace"]:
        call = dict(present_key=inp["past_key"], present_value=inp["past_value"])
    return inp, a, call


def total_length(inp):
    return int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])


def ort_supports(spec):
    """onnxruntime 1.31.1 runs this combination (and we define it the same way)."""
    return _ort.available() and spec["mode"] == spec["v_mode"]


def run(inp, a, call, *, kernel, flash, threads, blocks=None, splits=None):
    with gqa.config(path=kernel, flash=flash, flash_blocks=blocks, decode_splits=splits):
        return gqa.group_query_attention(**inp, **a, **call, num_threads=threads)


def fresh_call(inp, call):
    """Copies of the caller buffers an in-place call would write, so a spec can run twice."""
    if not call:
        return inp, call
    inp = dict(inp, past_key=inp["past_key"].copy(), past_value=inp["past_value"].copy())
    return inp, dict(present_key=inp["past_key"], present_value=inp["past_value"])


def valid_rows(inp, a, out):
    """Query rows whose output is defined the same way by onnxruntime's two paths: all but
    the right-padding rows (s >= T_b) of a windowed first prompt (see README)."""
    B, S = out.shape[:2]
    rows = np.ones((B, S), bool)
    if a.get("local_window_size", -1) >= 0 and S == total_length(inp):
        rows = np.arange(S)[None, :] < (inp["seqlens_k"][:, None] + 1)
    return rows


def assert_caches_equal(ours, ref, inp, inplace, what):
    """Bit-exact caches; in-place buffers are compared on each batch's rows [0, T_b) (the rest
    is the caller's and was checked unchanged separately)."""
    assert ours.dtype == ref.dtype, (what, ours.dtype, ref.dtype)
    if not inplace:
        assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
        assert np.array_equal(ours.view(np.uint8), ref.view(np.uint8)), f"{what} codes differ"
        return
    for b, sk in enumerate(inp["seqlens_k"]):
        tb = int(sk) + 1
        assert np.array_equal(ours[b, :, :tb].view(np.uint8), ref[b, :, :tb].view(np.uint8)), \
            f"{what} codes differ (batch {b}, rows < {tb})"


def assert_close(x, y, atol, rows, what):
    """|x - y| <= atol, plus for float16 results one float16 step of y (2^-10 |y|): each is a
    float32 result rounded once more, and two float32 results a last bit apart round to
    neighbouring float16 values where a rounding boundary lies between them."""
    rtol = F16_STEP if np.dtype(x.dtype) == np.float16 else 0.0
    x = x.astype(np.float64)[rows]
    y = y.astype(np.float64)[rows]
    assert np.isfinite(x).all(), f"{what}: non-finite output from finite inputs"
    np.testing.assert_allclose(x, y, atol=atol, rtol=rtol, err_msg=what)


def within(got, want, bound, what, names=("got", "want")):
    """|got - want| <= bound elementwise (NaN where both are NaN, and equal infinities, pass;
    finite where the other is finite), else AssertionError at the worst element, the two
    sides named by `names`."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert (np.isfinite(got) == np.isfinite(want)).all(), f"{what}: finite on one side only"
    equal = (got == want) | (np.isnan(got) & np.isnan(want))
    err = np.where(equal, 0.0, np.abs(got - want))
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} elements outside the bound; at "
                             f"{tuple(int(v) for v in i)} {names[0]} {got[i]!r}, {names[1]} "
                             f"{want[i]!r}, |diff| {err[i]:.3g} > {bound[i]:.3g}")


def check_vs_ort(spec, inp, a, call, ours):
    """Ours (either path) against onnxruntime: caches bit-exact, outputs within ORT_TOL."""
    ref = _ort.run_ort(fresh_call(inp, call)[0], a)
    assert len(ours) == len(ref)
    atol = ORT_TOL[inp["query"].dtype]
    rows = valid_rows(inp, a, ref[0])
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    assert_close(ours[0], ref[0], atol, rows, "output vs onnxruntime")
    assert_caches_equal(ours[1], ref[1], inp, bool(call), "present_key vs onnxruntime")
    assert_caches_equal(ours[2], ref[2], inp, bool(call), "present_value vs onnxruntime")
    if len(ref) == 4:
        assert ours[3].shape == ref[3].shape
        for b in range(ref[3].shape[0]):
            tb = int(inp["seqlens_k"][b]) + 1
            assert_close(ours[3][b][:, rows[b], :tb], ref[3][b][:, rows[b], :tb], atol, slice(None),
                         f"output_qk[{b}] vs onnxruntime")


def check_mixed_vs_ort(spec, inp, a, call, ours):
    """Mixed K/V modes (onnxruntime refuses them): K codes equal onnxruntime's run with both
    modes = K's, V codes its run with both = V's; the output equals the float64 reference
    on the dequantized caches."""
    base = fresh_call(inp, call)[0]
    for which, mode, sc in (("present_key", spec["mode"], "k_scale"),
                            ("present_value", spec["v_mode"], "v_scale")):
        a1 = dict(a, k_quant_type=mode, v_quant_type=mode)
        i1 = dict(base, k_scale=base[sc], v_scale=base[sc])
        ref = _ort.run_ort(fresh_call(i1, call)[0], a1)
        idx = 1 if which == "present_key" else 2
        assert_caches_equal(ours[idx], ref[idx], inp, bool(call), which + " vs onnxruntime (single mode)")
    if not spec["qk_output"]:
        H = spec["H"]
        kd = dequant_cache(ours[1], inp["k_scale"], spec["mode"], spec["bits"], H, spec["Nkv"])
        vd = dequant_cache(ours[2], inp["v_scale"], spec["v_mode"], spec["bits"], H, spec["Nkv"])
        want = reference(inp, a, kd, vd)
        atol = ORT_TOL[inp["query"].dtype]
        assert_close(ours[0], want, atol, slice(None), "output vs float64 reference")


def check_flash_vs_naive(spec, naive, flash):
    assert len(naive) == len(flash)
    for i in (1, 2):
        assert np.array_equal(naive[i].view(np.uint8), flash[i].view(np.uint8)), \
            f"{'present_key' if i == 1 else 'present_value'}: flash and naive codes differ"
    tol = FLASH_TOL[spec["bits"] if spec["mode"] != "NONE" else 0]
    if spec["dtype"] == "f16":
        tol = max(tol, 1e-3)
    assert_close(flash[0], naive[0], tol, slice(None), "flash vs naive")


def random_spec(rng, big=False):
    """A valid spec from a NumPy generator (the fuzzers' base calls; same space as the
    hypothesis strategy in _strategies.py, drawn uniformly)."""
    pick = lambda xs: xs[int(rng.integers(len(xs)))]
    phase = pick(["prompt", "decode", "decode", "subsequent"])
    Nkv, G = int(rng.integers(1, 5)), pick([1, 2, 3, 4, 8])
    rotary = bool(rng.integers(2))
    H = pick([8, 16, 24, 32, 48, 64, 80, 128] + ([256] if big else []))
    if rotary and H % 16:
        H += 8
    B = 1 if phase == "subsequent" else int(rng.integers(1, 4))
    past, pasts, prompt_lens = 0, None, None
    if phase == "prompt":
        S = int(rng.integers(1, 13))
        if rng.integers(2):
            prompt_lens = [int(x) for x in rng.integers(1, S + 1, B)]
    else:
        S = 1 if phase == "decode" else int(rng.integers(2, 9))
        past = int(rng.integers(1, 301 if big else 41))
        if rng.integers(2):
            pasts = [int(x) for x in rng.integers(0, past + 1, B)]
            pasts[int(rng.integers(B))] = past
    mode, bits = pick([("NONE", 0), ("PER_TENSOR", 8), ("PER_CHANNEL", 8), ("PER_TENSOR", 4),
                       ("PER_CHANNEL", 4)])
    v_mode = mode
    if mode != "NONE" and rng.integers(4) == 0:
        v_mode = "PER_CHANNEL" if mode == "PER_TENSOR" else "PER_TENSOR"
    packed = bool(rng.integers(2))
    causal = bool(rng.integers(6))
    spec = dict(
        seed=int(rng.integers(2 ** 16)), phase=phase, B=B, S=S, past=past, pasts=pasts,
        prompt_lens=prompt_lens, N=Nkv * G, Nkv=Nkv, H=H, mode=mode, v_mode=v_mode, bits=bits,
        dtype=pick(["f32", "f32", "f16"]),
        buf_extra=0 if phase == "prompt" else pick([0, 0, 1, 7]),
        T_extra=0 if phase == "prompt" else pick([0, 0, 0, 2]),
        packed=packed, shared_kv=phase != "prompt" and not packed and rng.integers(10) == 0,
        rotary=rotary, interleaved=rotary and bool(rng.integers(2)),
        rot_dim=pick([None] + list(range(16, H + 1, 16))) if rotary else None,
        pos_ids=rotary and bool(rng.integers(2)),
        bias=pick([None, None, "full", "b1", "n1", "both1"]), sink=rng.integers(4) == 0,
        smooth=rng.integers(4) == 0,
        window=pick([-1, -1, -1, 0, 1, 2, 3, 5, 8]) if causal else -1,
        softcap=pick([0.0, 0.0, 0.0, 0.3, 2.0]), qk_output=pick([0, 0, 0, 0, 1, 2]),
        scale=pick([0.0, 0.0, 0.0, 0.21, 1.5]), causal=causal,
        inplace=phase != "prompt" and rng.integers(3) == 0, t_array=bool(rng.integers(2)))
    return {k: bool(v) if isinstance(v, np.bool_) else v for k, v in spec.items()}
