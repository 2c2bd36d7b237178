"""Numerics at the edges (README "Numerics at the edges"; rules drafted in HARD_NOTES.md).

* Containment: a NaN / +-inf in query, key, value (or a float cache) of batch entry b and
  KV group j never reaches another batch entry or another KV group: those outputs are
  bit-identical to the clean call's.  Within (b, j) only the rules' region may change.
* A NaN never turns into a finite number: a NaN score, value or sink gives NaN in the
  affected output rows on every path (naive, flash, flash decoding); a non-finite k_scale /
  v_scale element is refused (ValueError naming it) before anything is written.
* Quantized caches never hold or produce non-finite values from non-finite K/V: NaN -> the
  top code, +-inf -> the clamp codes (the same codes as onnxruntime).
* All-masked rows give exactly 0; zero scales, denormals and |x| = 1e30 behave as stated.
"""
import itertools

import numpy as np
import pytest

import gqa
import _ort
from _cases import dequant_cache, key_range, make_case, reference, row_position

needs_ort = pytest.mark.skipif(not _ort.available(), reason="onnxruntime==1.31.1 not installed")
PATHS = sorted({"scalar", gqa.available_paths()[-1]})
MODES = {"float": ("NONE", 0), "s8pt": ("PER_TENSOR", 8), "s4pc": ("PER_CHANNEL", 4)}
PHASES = {  # make_case arguments; decode long enough for flash decoding to split
    "prompt": dict(B=3, S=9, past=0, ragged=[9, 5, 7]),
    "decode": dict(B=3, S=1, past=40, ragged=[12, 41, 30]),
    "subsequent": dict(B=1, S=5, past=20),
}
N, NKV, H = 4, 2, 16
G = N // NKV


def _call(inp, a, kernel, flash):
    with gqa.config(path=kernel, flash=flash, flash_blocks=(4, 4) if flash else None,
                    decode_splits=4 if flash else None):
        return gqa.group_query_attention(**inp, **a)


def attends(inp, a, b, s, t):
    """Does query row s of batch b attend key position t (README semantics)?"""
    start, end = key_range(inp, a, b, s)
    return start <= t < end


def regions(inp, a, kind, where, mode):
    """(may_change, must_be_nan) masks over (B, S, N) for one poisoned element."""
    B, S = inp["query"].shape[:2]
    may = np.zeros((B, S, N), bool)
    must = np.zeros((B, S, N), bool)
    b, s, head = where
    if kind == "query":
        may[b, s, head] = True
        must[b, s, head] = any(attends(inp, a, b, s, t) for t in range(int(inp["seqlens_k"][b]) + 1))
        return may, must
    t = row_position(inp, b, s) if kind in ("key", "value") else s
    rows = np.array([attends(inp, a, b, r, t) for r in range(S)])
    j = head
    may[b, :, j * G:(j + 1) * G] = rows[:, None]
    if mode == "NONE":
        must[b, :, j * G:(j + 1) * G] = rows[:, None]
    return may, must


# past rows only for float caches (quantized past caches hold codes) and calls that read a past
CASES = [c for c in itertools.product(MODES, PHASES, ["query", "key", "value", "past_key", "past_value"],
                                      [np.nan, np.inf, -np.inf])
         if not c[2].startswith("past") or (c[0] == "float" and c[1] != "prompt")]


@pytest.mark.parametrize("kernel", PATHS)
@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
@pytest.mark.parametrize("mode,phase,kind,bad", CASES,
                         ids=[f"{m}-{p}-{k}-{b}" for m, p, k, b in CASES])
def test_nonfinite_inputs_are_contained(kernel, flash, mode, phase, kind, bad):
    qmode, bits = MODES[mode]
    rng = np.random.default_rng(abs(hash((mode, phase, kind, str(bad)))) % 2 ** 32)
    inp, a = make_case(seed=int(rng.integers(1000)), N=N, Nkv=NKV, H=H, mode=qmode, bits=bits or 8,
                       local_window_size=int(rng.choice([-1, 4])), **PHASES[phase])
    clean = _call(inp, a, kernel, flash)
    B, S = inp["query"].shape[:2]
    b = int(rng.integers(B))
    tb = int(inp["seqlens_k"][b]) + 1
    c = int(rng.integers(H))
    if kind == "query":
        s, head = int(rng.integers(S)), int(rng.integers(N))
        inp["query"][b, s, head * H + c] = bad
    elif kind in ("key", "value"):
        s, head = int(rng.integers(S)), int(rng.integers(NKV))   # a prompt's padding rows too
        inp[kind][b, s, head * H + c] = bad
    else:
        s, head = int(rng.integers(max(tb - S, 1))), int(rng.integers(NKV))   # a past row
        inp[kind][b, head, s, c] = bad
    out = _call(inp, a, kernel, flash)
    o = out[0].reshape(B, S, N, H)
    o_clean = clean[0].reshape(B, S, N, H)
    may, must = regions(inp, a, kind, (b, s, head), qmode)
    nonfinite = ~np.isfinite(o).all(-1)
    assert not (nonfinite & ~may).any(), \
        f"non-finite outputs outside the allowed region: {np.argwhere(nonfinite & ~may)[:5].tolist()}"
    assert np.array_equal(o[~may].view(np.uint32), o_clean[~may].view(np.uint32)), \
        "outputs outside the poisoned (batch, KV group) region changed"
    has_nan = np.isnan(o).any(-1)
    if bad != bad:  # NaN never becomes finite
        assert has_nan[must].all(), f"NaN lost in rows {np.argwhere(must & ~has_nan)[:5].tolist()}"
    if qmode != "NONE" and kind != "query":
        assert np.isfinite(o).all(), "quantized caches must absorb non-finite K/V"
        for i in (1, 2):
            assert np.array_equal(out[i][:b], clean[i][:b]) and np.array_equal(out[i][b + 1:], clean[i][b + 1:])


@needs_ort
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 8), ("PER_CHANNEL", 8), ("PER_TENSOR", 4),
                                       ("PER_CHANNEL", 4)])
def test_nonfinite_kv_quantize_to_clamp_codes_like_onnxruntime(mode, bits):
    """NaN -> 127 / 7, +inf -> 127 / 7, -inf -> -128 / -8, |x| = 1e30 clamps: codes as onnxruntime."""
    inp, a = make_case(seed=4, B=2, S=1, past=6, N=N, Nkv=NKV, H=H, mode=mode, bits=bits)
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -3e38, 0.0], np.float32)
    for name in ("key", "value"):
        x = inp[name].reshape(-1)
        x[:specials.size] = specials
    ours = gqa.group_query_attention(**inp, **a)
    ref = _ort.run_ort(inp, a)
    for i in (1, 2):
        assert np.array_equal(ours[i], ref[i])
    lo, hi = (-128, 127) if bits == 8 else (-8, 7)
    row = ours[1][0, 0, 6]
    codes = row.astype(np.int16) if bits == 8 else \
        np.stack([row & 15, row >> 4], -1).reshape(-1).astype(np.int16) - 8
    want = [hi, hi, lo, hi, lo, hi, lo, 0]
    if mode == "PER_CHANNEL":   # 1e30 and 0 depend on nothing; the rest clamp whatever the scale
        assert list(codes[:7]) == want[:7]
    else:
        assert list(codes[:8]) == want
    assert np.isfinite(ours[0]).all()


@pytest.mark.parametrize("kernel", PATHS)
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_nan_sink_poisons_only_its_heads_and_nonfinite_scales_are_refused(kernel, phase):
    kw = PHASES[phase]
    for flash in (False, True):
        # head_sink[h] NaN: every row of head h, on every path
        inp, a = make_case(seed=8, N=N, Nkv=NKV, H=H, mode="PER_TENSOR", bits=8, sink=True, **kw)
        clean = _call(inp, a, kernel, flash)[0].reshape(kw["B"], kw["S"], N, H)
        inp["head_sink"][1] = np.nan
        o = _call(inp, a, kernel, flash)[0].reshape(kw["B"], kw["S"], N, H)
        assert np.isnan(o[:, :, 1]).all()
        keep = np.ones(N, bool)
        keep[1] = False
        assert np.array_equal(o[:, :, keep], clean[:, :, keep])
        # a non-finite scale element (here of KV head 1) would make every quantized write and
        # read of its channels garbage: refused, naming the scale and the element, with the
        # caller's present buffers untouched (README: where we differ from onnxruntime)
        for sc, bad in itertools.product(("k_scale", "v_scale"), (np.nan, np.inf, -np.inf)):
            inp, a = make_case(seed=9, N=N, Nkv=NKV, H=H, mode="PER_CHANNEL", bits=8, **kw)
            T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
            P = inp["past_key"].shape[2] if inp.get("past_key") is not None else 0
            inp["present_key"] = np.full((kw["B"], NKV, max(T, P), H), 7, np.int8)
            inp["present_value"] = inp["present_key"].copy()
            _call(inp, a, kernel, flash)
            before = inp["present_key"].copy(), inp["present_value"].copy()
            inp[sc][H + 3] = bad
            with pytest.raises(ValueError, match=f"^{sc} element {H + 3} is {float(bad)}: scales "
                                                 "must be finite"):
                _call(inp, a, kernel, flash)
            assert np.array_equal(inp["present_key"], before[0])
            assert np.array_equal(inp["present_value"], before[1])


@pytest.mark.parametrize("kernel", PATHS)
@pytest.mark.parametrize("bias", ["full", "b1", "n1"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_bias_reaches_only_the_rows_it_is_added_to(kernel, bias, bad):
    B, S = 2, 6
    for flash in (False, True):
        inp, a = make_case(seed=5, B=B, S=S, past=0, N=N, Nkv=NKV, H=H, mode="PER_TENSOR", bits=8, bias=bias)
        clean = _call(inp, a, kernel, flash)[0].reshape(B, S, N, H)
        inp["attention_bias"][0, 0, 4, 2] = bad
        o = _call(inp, a, kernel, flash)[0].reshape(B, S, N, H)
        rows = np.zeros((B, S, N), bool)
        rows[slice(None) if bias == "b1" else 0, 4, slice(None) if bias == "n1" else 0] = True
        assert np.isfinite(o[~rows]).all() and np.array_equal(o[~rows], clean[~rows])
        if bad != bad:
            assert np.isnan(o[rows]).all()
        if bad == -np.inf:     # masks the key: finite
            assert np.isfinite(o).all()


@pytest.mark.parametrize("kernel", PATHS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_all_masked_rows_are_exactly_zero(kernel, mode):
    """W = 0 and an all -inf attention_bias row give exactly 0 on every path, never NaN."""
    qmode, bits = MODES[mode]
    for phase in ("prompt", "decode"):
        for flash in (False, True):
            inp, a = make_case(seed=6, N=N, Nkv=NKV, H=H, mode=qmode, bits=bits or 8, local_window_size=0,
                               **PHASES[phase])
            out = _call(inp, a, kernel, flash)[0]
            assert np.array_equal(out, np.zeros_like(out))
            inp, a = make_case(seed=6, N=N, Nkv=NKV, H=H, mode=qmode, bits=bits or 8, bias="full",
                               sink=True, **PHASES[phase])
            inp["attention_bias"][...] = -np.inf
            out = _call(inp, a, kernel, flash)[0]
            assert np.array_equal(out, np.zeros_like(out))


@needs_ort
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 8), ("PER_CHANNEL", 4)])
def test_zero_scales(mode, bits):
    """scale 0 quantizes with multiplier 1 (codes as onnxruntime) and dequantizes to 0:
    k_scale 0 -> uniform attention over the attended keys; v_scale 0 -> output exactly 0."""
    kw = dict(B=2, S=5, past=0, N=N, Nkv=NKV, H=H, mode=mode, bits=bits)
    inp, a = make_case(seed=7, **kw)
    inp["k_scale"][...] = 0
    ours = gqa.group_query_attention(**inp, **a)
    ref = _ort.run_ort(inp, a)
    assert np.array_equal(ours[1], ref[1]) and np.array_equal(ours[2], ref[2])
    np.testing.assert_allclose(ours[0], ref[0], atol=1e-5, rtol=0)
    kd = dequant_cache(ours[1], inp["k_scale"], mode, bits, H, NKV)
    vd = dequant_cache(ours[2], inp["v_scale"], mode, bits, H, NKV)
    assert not kd.any()
    np.testing.assert_allclose(ours[0], reference(inp, a, kd, vd), atol=2e-6, rtol=0)
    inp["v_scale"][...] = 0
    out = gqa.group_query_attention(**inp, **a)[0]
    assert np.array_equal(out, np.zeros_like(out))


@needs_ort
@pytest.mark.parametrize("mode,bits", [("NONE", 0), ("PER_TENSOR", 8), ("PER_CHANNEL", 4)])
def test_denormals_are_not_flushed(mode, bits):
    """Denormal inputs and scales: codes bit-exact with onnxruntime, outputs within 1e-5, and
    no flush-to-zero (a float cache of denormal values gives a denormal, non-zero output)."""
    tiny = np.float32(1e-39)                      # a float32 denormal
    inp, a = make_case(seed=3, B=1, S=6, past=0, N=N, Nkv=NKV, H=H, mode=mode, bits=bits or 8)
    for name in ("query", "key", "value"):
        inp[name] *= tiny
    if mode != "NONE":
        inp["k_scale"][...] = tiny               # 1/s overflows to inf: 0 * inf -> NaN -> top code
        inp["v_scale"][...] = np.float32(1e-40)
    ours = gqa.group_query_attention(**inp, **a)
    ref = _ort.run_ort(inp, a)
    assert np.array_equal(ours[1].view(np.uint8), ref[1].view(np.uint8))
    assert np.array_equal(ours[2].view(np.uint8), ref[2].view(np.uint8))
    np.testing.assert_allclose(ours[0], ref[0], atol=1e-5, rtol=0)
    assert np.isfinite(ours[0]).all()
    if mode == "NONE":
        assert np.array_equal(ours[1], inp["key"].reshape(1, 6, NKV, H).transpose(0, 2, 1, 3))
        inp["value"][...] = tiny
        out = gqa.group_query_attention(**inp, **a)[0]
        np.testing.assert_allclose(out, tiny, rtol=1e-3)


@needs_ort
@pytest.mark.parametrize("mode,bits", [("NONE", 0), ("PER_TENSOR", 8), ("PER_CHANNEL", 8), ("PER_TENSOR", 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_huge_values(mode, bits, dtype):
    """|K|, |V| = 1e30 (float16: 65504): quantized codes clamp, outputs stay finite while every
    score |scale * q.k| is below FLT_MAX; results as onnxruntime."""
    big = 1e30 if dtype == np.float32 else 65504.0
    inp, a = make_case(seed=2, B=2, S=4, past=0, N=N, Nkv=NKV, H=H, mode=mode, bits=bits or 8, dtype=dtype)
    rng = np.random.default_rng(0)
    for name in ("key", "value"):
        inp[name][...] = (rng.choice([-1, 1], inp[name].shape) * big).astype(dtype)
    if mode == "NONE":
        inp["query"] *= dtype(1e-12 if dtype == np.float32 else 1e-4)   # keep q.k finite
    ours = gqa.group_query_attention(**inp, **a)
    ref = _ort.run_ort(inp, a)
    assert np.isfinite(ours[0].astype(np.float32)).all()
    assert np.array_equal(ours[1].view(np.uint8), ref[1].view(np.uint8))
    assert np.array_equal(ours[2].view(np.uint8), ref[2].view(np.uint8))
    tol = (1e-5 if dtype == np.float32 else 1e-3) * (big if mode == "NONE" else 1)
    np.testing.assert_allclose(ours[0].astype(np.float64), ref[0].astype(np.float64), atol=tol, rtol=1e-5)
    if mode != "NONE":
        lo, hi = (-128, 127) if bits == 8 else (0, 15)   # INT4: stored nibbles
        codes = ours[1] if bits == 8 else np.stack([ours[1] & 15, ours[1] >> 4], -1)
        assert set(np.unique(codes)) <= {lo, hi}
