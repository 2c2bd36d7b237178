"""Per-group asymmetric formats (INT8 / INT4 / INT2 codes with inline scale and zero point):
the codec bit for bit against its NumPy statement (_reference.group_quantize_ref), on every
path; GEMMs against float64 on the dequantized rows; the PER_GROUP operator's caches and
attention against float64; argument and attribute errors."""
import numpy as np
import pytest

import gqa
from _cases import reference
from _reference import (F32, U32, assert_within, group_dequantize_ref, group_magnitude_ref,
                        group_quantize_ref, qk_bound, qk_oracle, sv_bound, sv_oracle)

GROUPS = {8: (1, 8, 16, 32, 64), 4: (2, 8, 16, 32, 64), 2: (4, 8, 16, 32, 64)}
META = ("fp32", "fp16")
RHOS = (1.0, 0.96, 0.5, 0.05)


def _rows(rng, rows, h):
    """Rows of mixed magnitudes and offsets, so groups have very different ranges."""
    mag = np.exp(rng.uniform(-8, 4, (rows, 1)))
    return (rng.standard_normal((rows, h)) * mag + rng.uniform(-1, 1, (rows, 1)) * mag).astype(F32)


def _same_bits(a, b):
    """float32 arrays equal bit for bit, NaN payloads aside."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(nan | (a.view(np.uint32) == b.view(np.uint32))))


# ---------------------------------------------------------------- codec

@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("metadata", META)
def test_quantize_matches_reference(kernel_path, bits, metadata, rng):
    for h in (64, 128, 96):
        x = _rows(rng, 40, h)
        for g in GROUPS[bits] + (0,):
            if g and h % g:
                continue
            for rho in RHOS:
                got = gqa.quantize(x, bits=bits, group_size=g, rho=rho, metadata=metadata)
                want = group_quantize_ref(x, bits, g or h, rho, metadata == "fp16")
                assert got.dtype == np.uint8 and got.shape == want.shape
                bad = np.argwhere(got != want)
                assert bad.size == 0, (f"{kernel_path} bits={bits} g={g} h={h} rho={rho}: "
                                       f"{len(bad)} bytes differ, first at {bad[0]}")


def test_quantize_hand_checked_codes(kernel_path):
    """Values written out by hand: group [0, 3] has scale 1 and zero 0, so the codes are the
    values rounded half to even; 2-bit codes pack four to a byte, the first in the low bits."""
    x = np.array([[0.0, 3.0, 0.5, 1.5, 2.5, 1.0, 2.0, 3.0]], F32)
    c = gqa.quantize(x, bits=2, group_size=8)
    codes = [0, 3, 0, 2, 2, 1, 2, 3]
    assert list(c[0, :2]) == [codes[0] | codes[1] << 2 | codes[2] << 4 | codes[3] << 6,
                              codes[4] | codes[5] << 2 | codes[6] << 4 | codes[7] << 6]
    assert list(c[0, 2:].view(F32)) == [1.0, 0.0]
    # a constant group: scale 1 (not > 0 otherwise), zero the value, codes 0
    c = gqa.quantize(np.full((1, 8), -2.5, F32), bits=4, group_size=8)
    assert list(c[0, :4]) == [0, 0, 0, 0] and list(c[0, 4:].view(F32)) == [1.0, -2.5]
    # rho = 0.5 of 8 values clips at the 4th smallest |x| (index 4): |x| sorted 0,1,2,3,4,...
    x = np.array([[0.0, -1.0, 2.0, -3.0, 4.0, -50.0, 60.0, -7.0]], F32)
    d = gqa.dequantize(gqa.quantize(x, bits=8, group_size=8, rho=0.5), bits=8, group_size=8,
                       head_size=8)
    assert d.max() <= 4.0 + 1e-6 and d.min() >= -4.0 - 1e-6


def test_clip_quantile_on_ties_and_orders(kernel_path, rng):
    """The clip's k-th smallest |x| (a selection over the row) on rows that stress it: sorted
    either way, few distinct values, all equal, signed zeros and NaN, and rows wider than the
    stack buffer (2048 columns)."""
    for h in (24, 64, 256, 2048):
        base = rng.standard_normal(h).astype(F32)
        rows = np.stack([np.sort(base), np.sort(base)[::-1], np.round(base * 2) / 2,
                         np.full(h, 0.75, F32), np.where(np.arange(h) % 3 == 0, -0.0, base),
                         np.where(np.arange(h) % 5 == 1, np.nan, base), rng.permutation(np.tile(base[:4], h // 4))])
        for rho in (0.999, 0.96, 0.9, 0.5, 0.05, 1e-6):
            got = gqa.quantize(rows.astype(F32), bits=4, group_size=8, rho=rho)
            want = group_quantize_ref(rows.astype(F32), 4, 8, rho, False)
            assert np.array_equal(got, want), (kernel_path, h, rho)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_edge_rows(kernel_path, bits):
    """NaN, infinities, denormals, all-NaN and constant groups, float32 extremes."""
    h, g = 32, 8
    rows = np.array([
        [np.nan] * 8 + [1.0] * 8 + [np.inf] + [0.0] * 7 + [-np.inf] + [1.0] * 7,
        [1e-40, -1e-40, 3e-45, 0.0] * 2 + [3e38, -3e38] * 4 + [5.0] * 8 + [-0.0] * 8,
        [np.nan, 1.0, 2.0, np.nan] * 2 + list(np.linspace(-1, 1, 24)),
        [1e-30] * 8 + [1e30, -1e30, 0.0, 1.0] * 2 + [7.0, 7.0 + 1e-6] * 4 + [0.25] * 8,
    ], F32)
    for metadata in META:
        for rho in (1.0, 0.5):
            got = gqa.quantize(rows, bits=bits, group_size=g, rho=rho, metadata=metadata)
            want = group_quantize_ref(rows, bits, g, rho, metadata == "fp16")
            assert np.array_equal(got, want), (kernel_path, bits, metadata, rho)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("metadata", META)
def test_dequantize_bit_exact(kernel_path, bits, metadata, rng):
    """Any stored row: random codes and metadata (every byte value, so NaN and infinite
    metadata too), decoded as code * scale + zero with two roundings on every path."""
    for h, g in ((64, 8), (64, 16), (128, 32), (128, 128), (96, 48 if bits != 2 else 32)):
        rb = gqa.group_row_bytes(h, bits, g, metadata)
        rows = rng.integers(0, 256, (37, rb)).astype(np.uint8)
        # half the rows with moderate metadata (finite values)
        nb = h * bits // 8
        mdt = np.float16 if metadata == "fp16" else F32
        meta = rng.uniform(-2, 2, (18, (rb - nb) // np.dtype(mdt).itemsize)).astype(mdt)
        rows[:18, nb:] = meta.view(np.uint8)
        got = gqa.dequantize(rows, bits=bits, group_size=g, head_size=h, metadata=metadata)
        want = group_dequantize_ref(rows, bits, g, h, metadata == "fp16")
        assert _same_bits(got, want), (kernel_path, h, g)
        # three leading dimensions, and the transposing decoder behind the flash tiles
        got3 = gqa.dequantize(rows[:36].reshape(3, 4, 3, rb), bits=bits, group_size=g,
                              head_size=h, metadata=metadata)
        assert _same_bits(got3.reshape(36, h), want[:36])


def _decode_bound(a, b, bits, g, k, metadata, alpha):
    """What forming code * scale + zero may add beyond the contract's two roundings: a kernel
    may fuse them (one rounding of the exact value) -- within 2 u (|code * scale| + |zero|)
    of the contract's value -- times |a|, summed."""
    mag = group_magnitude_ref(b, bits, g, k, metadata == "fp16")
    return 2 * U32 * abs(float(F32(alpha))) * (np.abs(a.astype(np.float64)) @ mag.T)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 17])
def test_qk_gemm_matches_oracle(kernel_path, bits, m, rng):
    for n, k, g in ((1, 64, 64), (7, 64, 16), (33, 128, 32), (130, 128, 8), (40, 256, 64),
                    (19, 96, 48), (21, 96, 24),      # groups that straddle 32- and 64-column blocks
                    (23, 96, 32), (5, 96, 96),       # rows of 64 k + 32 columns in whole blocks
                    (70, 128, 64), (9, 64, 64)):     # fp16 pairs converted 4 rows at a time + the rest
        for metadata in META:
            a = rng.standard_normal((m, k)).astype(F32)
            b = gqa.quantize(_rows(rng, n, k), bits=bits, group_size=g, metadata=metadata)
            bd = group_dequantize_ref(b, bits, g, k, metadata == "fp16")
            alpha = 1.0 / np.sqrt(k)
            c = gqa.qk_gemm(a, b, bits=bits, group_size=g, metadata=metadata, alpha=alpha)
            assert_within(c, qk_oracle(a, bd, alpha), qk_bound(a, bd, alpha) + _decode_bound(
                a, b, bits, g, k, metadata, alpha), f"{kernel_path} bits={bits} M={m} N={n} K={k} g={g}")


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 17])
def test_sv_gemm_matches_oracle(kernel_path, bits, m, rng):
    for k, n, g in ((1, 64, 64), (7, 64, 16), (33, 128, 32), (300, 128, 8), (70, 256, 64), (0, 64, 32),
                    (45, 96, 48), (38, 96, 24), (71, 128, 64), (9, 64, 64), (29, 96, 32), (66, 96, 96),
                    (40, 160, 32)):
        for beta, metadata in ((0.0, "fp32"), (1.0, "fp32"), (0.5, "fp32"), (0.0, "fp16"), (1.0, "fp16")):
            f16 = metadata == "fp16"
            a = np.abs(rng.standard_normal((m, k))).astype(F32)
            b = gqa.quantize(_rows(rng, k, n), bits=bits, group_size=g, metadata=metadata)
            bd = group_dequantize_ref(b, bits, g, n, f16) if k else np.zeros((0, n), F32)
            c0 = rng.standard_normal((m, n)).astype(F32)
            c = np.full((m, n), np.nan, F32) if beta == 0 else c0.copy()
            gqa.sv_gemm(a, b, bits=bits, group_size=g, beta=beta, out=c, n=n, metadata=metadata)
            extra = (2 * U32 * np.abs(a.astype(np.float64)) @ group_magnitude_ref(b, bits, g, n, f16)
                     if k else 0.0)
            assert_within(c, sv_oracle(a, bd, beta, c0), sv_bound(a, bd, beta, c0) + extra,
                          f"{kernel_path} bits={bits} M={m} K={k} N={n} beta={beta} {metadata}")


def test_group_split_invariance(kernel_path, rng):
    """C[m, n] is the same whether computed in one call or one row / column at a time."""
    a = rng.standard_normal((5, 128)).astype(F32)
    b = gqa.quantize(_rows(rng, 70, 128), bits=4, group_size=32)
    whole = gqa.qk_gemm(a, b, bits=4, group_size=32)
    for i in range(5):
        assert _same_bits(gqa.qk_gemm(a[i:i + 1], b, bits=4, group_size=32), whole[i:i + 1])
    for j in (0, 33, 69):
        assert _same_bits(gqa.qk_gemm(a, b[j:j + 1], bits=4, group_size=32), whole[:, j:j + 1])


def test_kernel_api_errors():
    x = np.zeros((2, 64), F32)
    with pytest.raises(ValueError, match="bits must be 2, 4 or 8"):
        gqa.quantize(x, bits=3, group_size=32)
    with pytest.raises(ValueError, match="group_size=24 must divide head_size=64"):
        gqa.quantize(x, bits=4, group_size=24)
    with pytest.raises(ValueError, match="multiple of 4 columns"):
        gqa.quantize(np.zeros((2, 6), F32), bits=2, group_size=6)
    with pytest.raises(ValueError, match="group_size must be >= 0"):
        gqa.quantize(x, bits=4, group_size=-1)
    with pytest.raises(ValueError, match="scale must be None for a per-group format"):
        gqa.quantize(x, 0.1, bits=4, group_size=32)
    with pytest.raises(TypeError, match="scale is required"):
        gqa.quantize(x, bits=4)
    with pytest.raises(ValueError, match=r"rho must be in \(0, 1\]"):
        gqa.quantize(x, bits=4, group_size=32, rho=0.0)
    with pytest.raises(ValueError, match="metadata must be 'fp32' or 'fp16'"):
        gqa.quantize(x, bits=4, group_size=32, metadata="bf16")
    c = gqa.quantize(x, bits=4, group_size=32)
    with pytest.raises(TypeError, match="head_size is required"):
        gqa.dequantize(c, bits=4, group_size=32)
    with pytest.raises(ValueError, match="rows of 48 bytes"):
        gqa.dequantize(c[:, :40], bits=4, group_size=32, head_size=64)
    with pytest.raises(ValueError, match=r"b must have shape \(N, 48\)"):
        gqa.qk_gemm(np.zeros((1, 64), F32), c[:, :47], bits=4, group_size=32)
    with pytest.raises(TypeError, match="n is required"):
        gqa.sv_gemm(np.zeros((1, 2), F32), c, bits=4, group_size=32)
    assert gqa.group_row_bytes(128, 2, 64) == 48 and gqa.group_row_bytes(128, 2, 64, "fp16") == 40


# ---------------------------------------------------------------- the operator

N, NKV, H = 4, 2, 64
FORMATS = {  # id -> (bits, group, metadata, k_rho, v_rho)
    "g8-32": (8, 32, "fp32", 1.0, 1.0),
    "g4-32": (4, 32, "fp32", 0.96, 0.92),
    "g4-16-fp16": (4, 16, "fp16", 1.0, 1.0),
    "g4-head": (4, 0, "fp32", 1.0, 1.0),
    "g2-32": (2, 32, "fp32", 0.96, 0.92),
    "g2-8-fp16": (2, 8, "fp16", 1.0, 0.9),
}
CASES = {  # B, S, per-batch past lengths, buffer rows (None: a new present), packed
    "prompt": (2, 6, [0, 0], None, False),
    "decode-in-place": (2, 1, [9, 6], 16, False),
    "subsequent-in-place": (1, 3, [5], 12, False),
    "decode-new-present": (2, 1, [7, 4], 8, False),
    "packed-prompt": (1, 5, [0], None, True),
}
# |out - ref| <= (T + H + 16) u max|v| with T <= 16, H = 64 and |v| <= 0.6: ~3e-6
TOL = 4e-6


def _attrs(fmt):
    bits, g, md, kr, vr = FORMATS[fmt]
    return dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                kv_cache_bit_width=bits, kv_quant_group_size=g, metadata_type=md, k_quant_rho=kr,
                v_quant_rho=vr)


def _op_case(case, fmt, seed=5):
    """Inputs (valid quantized past rows, ragged lengths) and the float rows they came from."""
    bits, g, md, kr, vr = FORMATS[fmt]
    B, S, past, buf, packed = CASES[case]
    rng = np.random.default_rng(seed)
    u = lambda *shape: rng.uniform(-0.5, 0.5, shape).astype(F32)  # noqa: E731
    rb = gqa.group_row_bytes(H, bits, g, md)
    inp = {}
    if packed:
        inp["query"] = u(B, S, (N + 2 * NKV) * H)
    else:
        inp.update(query=u(B, S, N * H), key=u(B, S, NKV * H), value=u(B, S, NKV * H))
    lens = np.array(past) + S
    if buf is not None:
        pk = group_quantize_ref(u(B, NKV, buf, H), bits, g or H, kr, md == "fp16")
        pv = group_quantize_ref(u(B, NKV, buf, H), bits, g or H, vr, md == "fp16")
        inp.update(past_key=pk, past_value=pv)
        if "in-place" in case:
            inp.update(present_key=pk, present_value=pv)
    inp["seqlens_k"] = (lens - 1).astype(np.int32)
    inp["total_sequence_length"] = np.array(int(lens.max()) if buf is not None else S, np.int32)
    return inp, rb


def _new_rows(inp, B, S):
    q = inp["query"]
    if "key" in inp:
        k, v = inp["key"], inp["value"]
    else:
        k, v = q[..., N * H:(N + NKV) * H], q[..., (N + NKV) * H:]
    return (k.reshape(B, S, NKV, H).transpose(0, 2, 1, 3), v.reshape(B, S, NKV, H).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_operator_against_float64(kernel_path, fmt, case, flash):
    bits, g, md, kr, vr = FORMATS[fmt]
    inp, rb = _op_case(case, fmt)
    B, S, past, buf, _ = CASES[case]
    before = {n: inp[n].copy() for n in ("past_key", "past_value") if n in inp}
    with gqa.config(path=kernel_path, flash=flash, flash_blocks=(2, 4) if flash else None):
        out, pk, pv = gqa.GroupQueryAttention(**_attrs(fmt))(**inp)
    kn, vn = _new_rows(inp, B, S)
    for b in range(B):
        p0 = past[b]
        # the new rows: the codec of the new K / V; the past rows: unchanged
        assert np.array_equal(pk[b, :, p0:p0 + S], group_quantize_ref(np.ascontiguousarray(kn[b]), bits, g or H, kr, md == "fp16"))
        assert np.array_equal(pv[b, :, p0:p0 + S], group_quantize_ref(np.ascontiguousarray(vn[b]), bits, g or H, vr, md == "fp16"))
        if before:
            assert np.array_equal(pk[b, :, :p0], before["past_key"][b, :, :p0])
            assert np.array_equal(pv[b, :, :p0], before["past_value"][b, :, :p0])
    kd = group_dequantize_ref(pk, bits, g or H, H, md == "fp16").astype(np.float64)
    vd = group_dequantize_ref(pv, bits, g or H, H, md == "fp16").astype(np.float64)
    a = dict(num_heads=N, kv_num_heads=NKV)
    ref = reference(inp, a, kd, vd)
    assert np.abs(out - ref).max() <= TOL, (kernel_path, fmt, case, np.abs(out - ref).max())


@pytest.mark.parametrize("fmt", ["g4-32", "g2-8-fp16"])
def test_operator_rotary_caches_are_the_codec_of_the_float_cache(kernel_path, fmt):
    """With rotary and the QK norm, the per-group K rows are the codec of the float cache's
    rows (whose bits match onnxruntime: tests/test_operator.py) and V likewise."""
    bits, g, md, kr, vr = FORMATS[fmt]
    rng = np.random.default_rng(11)
    B, S = 1, 7
    ang = rng.uniform(0, 2 * np.pi, (16, H // 2))
    inp = dict(query=rng.uniform(-1, 1, (B, S, N * H)).astype(F32),
               key=rng.uniform(-1, 1, (B, S, NKV * H)).astype(F32),
               value=rng.uniform(-1, 1, (B, S, NKV * H)).astype(F32),
               seqlens_k=np.array([S - 1], np.int32), total_sequence_length=np.array(S, np.int32),
               cos_cache=np.cos(ang).astype(F32), sin_cache=np.sin(ang).astype(F32),
               q_norm_weight=rng.uniform(0.5, 1.5, H).astype(F32),
               k_norm_weight=rng.uniform(0.5, 1.5, H).astype(F32))
    _, fk, fv = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, do_rotary=1)(**inp)
    out, pk, pv = gqa.GroupQueryAttention(do_rotary=1, **_attrs(fmt))(**inp)
    assert np.array_equal(pk, group_quantize_ref(fk, bits, g or H, kr, md == "fp16"))
    assert np.array_equal(pv, group_quantize_ref(fv, bits, g or H, vr, md == "fp16"))
    # and attention reads them: the float cache's attention over the dequantized rows
    kd = gqa.dequantize(pk, bits=bits, group_size=g, head_size=H, metadata=md)
    vd = gqa.dequantize(pv, bits=bits, group_size=g, head_size=H, metadata=md)
    # the query is normed and rotated inside: compare against the float operator fed the
    # dequantized caches as its past (seqlens cover them; the new rows are a zero-length key)
    f_out, _, _ = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, do_rotary=1)(
        inp["query"], np.zeros((B, 0, NKV * H), F32), np.zeros((B, 0, NKV * H), F32), kd, vd,
        inp["seqlens_k"], inp["total_sequence_length"], inp["cos_cache"], inp["sin_cache"],
        q_norm_weight=inp["q_norm_weight"], k_norm_weight=inp["k_norm_weight"])
    np.testing.assert_allclose(out, f_out, atol=TOL, rtol=0)


def test_operator_long_in_place_loop(kernel_path):
    """A 300-step in-place decode loop: every step's new rows are the codec of its K / V and
    the output stays within float32 rounding of float64 over the dequantized cache."""
    bits, g = 2, 32
    op = gqa.GroupQueryAttention(**_attrs("g2-32"))
    rng = np.random.default_rng(2)
    T0, steps, C = 4, 300, 320
    rb = gqa.group_row_bytes(H, bits, g)
    pk, pv = np.zeros((1, NKV, C, rb), np.uint8), np.zeros((1, NKV, C, rb), np.uint8)
    x = rng.uniform(-0.5, 0.5, (1, T0, (N + 2 * NKV) * H)).astype(F32)
    op(x, None, None, pk, pv, np.array([T0 - 1], np.int32), np.array(T0, np.int32),
       present_key=pk, present_value=pv)
    for t in range(T0, T0 + steps):
        x = rng.uniform(-0.5, 0.5, (1, 1, (N + 2 * NKV) * H)).astype(F32)
        out, _, _ = op(x, None, None, pk, pv, np.array([t], np.int32), np.array(t + 1, np.int32),
                       present_key=pk, present_value=pv)
        k = x[0, 0, N * H:(N + NKV) * H].reshape(NKV, H)
        assert np.array_equal(pk[0, :, t], group_quantize_ref(k, bits, g, 0.96))
        if t % 50 == 0 or t == T0 + steps - 1:
            kd = group_dequantize_ref(pk[:, :, :t + 1], bits, g, H).astype(np.float64)
            vd = group_dequantize_ref(pv[:, :, :t + 1], bits, g, H).astype(np.float64)
            ref = reference(dict(query=x[..., :N * H], seqlens_k=np.array([t], np.int32),
                                 total_sequence_length=t + 1), dict(num_heads=N, kv_num_heads=NKV), kd, vd)
            # T up to 304 keys: (T + H + 16) u |v| ~ 1.1e-5
            assert np.abs(out - ref).max() <= 1.5e-5, (t, np.abs(out - ref).max())


def test_operator_errors():
    def op(**kw):
        a = dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                 kv_cache_bit_width=4, kv_quant_group_size=32)
        a.update(kw)
        return gqa.GroupQueryAttention(**a)
    with pytest.raises(ValueError, match="must both be NONE or both quantized"):
        op(v_quant_type="NONE")
    with pytest.raises(ValueError, match=r"kv_cache_bit_width must be 4 or 8 when quantization "
                                         r"is enabled, got 2 \(V is PER_TENSOR; 2 bits need PER_GROUP\)"):
        op(v_quant_type="PER_TENSOR", kv_cache_bit_width=2)
    with pytest.raises(ValueError, match="kv_cache_bit_width must be 2, 4 or 8 for PER_GROUP"):
        op(kv_cache_bit_width=3)
    with pytest.raises(ValueError, match=r"k_cache_bit_width must be 2, 4 or 8 for PER_GROUP caches, got 3"):
        op(k_cache_bit_width=3)
    with pytest.raises(ValueError, match=r"v_cache_bit_width must be >= 0"):
        op(v_cache_bit_width=-4)
    with pytest.raises(ValueError, match=r"kv_cache_bit_width must be 0, 2, 4 or 8, got 3"):
        op(kv_cache_bit_width=3, k_cache_bit_width=4, v_cache_bit_width=2)
    with pytest.raises(ValueError, match="k_cache_bit_width must be 0 when quantization is disabled"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_cache_bit_width=4)
    with pytest.raises(ValueError, match="v_quant_rho applies to a PER_GROUP V cache only"):
        op(v_quant_type="PER_CHANNEL", v_quant_rho=0.9)
    with pytest.raises(ValueError, match="kv_cache_bit_width must be 4 or 8"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_TENSOR",
                                v_quant_type="PER_TENSOR", kv_cache_bit_width=2)
    with pytest.raises(ValueError, match="kv_quant_group_size must be >= 0"):
        op(kv_quant_group_size=-8)
    with pytest.raises(ValueError, match=r"k_quant_rho must be in \(0, 1\]"):
        op(k_quant_rho=1.5)
    with pytest.raises(ValueError, match="metadata_type must be 'fp32' or 'fp16'"):
        op(metadata_type="FP16")
    with pytest.raises(ValueError, match="apply to PER_GROUP caches only"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, kv_quant_group_size=32)
    inp, rb = _op_case("decode-in-place", "g4-32")
    with pytest.raises(ValueError, match="kv_quant_group_size=24 must divide head_size=64"):
        op(kv_quant_group_size=24)(**inp)
    bad = dict(inp, k_scale=np.ones(1, F32), v_scale=np.ones(1, F32))
    with pytest.raises(ValueError, match="k_scale must not be given when k_quant_type is PER_GROUP"):
        op()(**bad)
    # K and V of their own types: each side's scale and row width
    mixed = op(v_quant_type="PER_TENSOR", v_cache_bit_width=8)
    with pytest.raises(ValueError, match="v_scale must be provided when v_quant_type is not NONE"):
        mixed(**inp)
    with pytest.raises(ValueError, match="k_scale must not be given when k_quant_type is PER_GROUP"):
        mixed(**bad)
    with pytest.raises(TypeError, match="past_value must have dtype int8"):
        mixed(**dict(inp, v_scale=np.ones(1, F32)))
    pv8 = np.zeros(inp["past_value"].shape[:3] + (H,), np.int8)
    with pytest.raises(ValueError, match=r"past_sequence_length \(dimension 2\)"):
        mixed(**dict(inp, v_scale=np.ones(1, F32), past_value=pv8[:, :, :-1], present_key=None,
                     present_value=None))
    with pytest.raises(ValueError, match=r"Input 'past_value' must have shape .*head_size\) = \(2, 2, \*, 64\)"):
        mixed(**dict(inp, v_scale=np.ones(1, F32), past_value=pv8[..., :32], present_key=None,
                     present_value=None))
    before = inp["past_key"].copy()
    with pytest.raises(ValueError, match=r"gqa.group_row_bytes\(head_size, bits, group, metadata\)"):
        op(metadata_type="fp16")(**inp)          # rows are 48 bytes, fp16 metadata wants 40
    with pytest.raises(TypeError, match="past_key must have dtype uint8"):
        op()(**dict(inp, past_key=inp["past_key"].view(np.int8), present_key=None,
                    present_value=None))
    assert np.array_equal(inp["past_key"], before)
