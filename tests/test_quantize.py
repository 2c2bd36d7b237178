"""gqa.quantize / gqa.dequantize: codes bit-exact to the contract and to onnxruntime 1.31.1,
on every kernel path; edge cases; argument validation."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gqa
from _reference import (F32, LIMITS, MODES, dequantize_ref, ort_present,
                        packed_width, quantize_codes_ref, quantize_ref, unpack_int4)

WIDTHS = list(range(1, 34)) + [63, 64, 65, 127, 128, 129, 256]
MODE_IDS = list(MODES)


def _scale_row(scale, h):
    s = np.asarray(scale, F32).reshape(-1)
    return np.full(h, s[0], F32) if s.size == 1 else s


def half_boundaries(scale_row, ks):
    """x per column such that fl32(x * fl32(1/s)) == k + 0.5 exactly.
    Returns (x, k) for the columns where such an x exists (almost all)."""
    inv = (F32(1) / scale_row).astype(F32)
    xs, kk, cols = [], [], []
    for c, (i, k) in enumerate(zip(inv, ks)):
        t = F32(k + 0.5)
        x0 = F32(float(t) / float(i))
        up, down, cands = x0, x0, [x0]
        for _ in range(4):
            up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(-np.inf))
            cands += [up, down]
        for cand in cands:
            if F32(cand * i) == t:
                xs.append(cand)
                kk.append(k)
                cols.append(c)
                break
    return np.array(xs, F32), np.array(kk, np.int64), np.array(cols, np.int64)


def even_of(k):
    """round-half-even of k + 0.5: the even one of k and k + 1."""
    return np.where(k % 2 == 0, k, k + 1)


def mixed_data(rng, rows, h, scale_row, bits):
    """Rows of x mixing typical values, exact .5 boundaries, clamp edges and specials."""
    lo, hi = LIMITS[bits]
    s = np.where(scale_row == 0, F32(1), scale_row).astype(F32)
    x = (rng.standard_normal((rows, h)) * (hi / 3.0) * s).astype(F32)
    if rows > 1:  # one row of exact half boundaries
        ks = rng.integers(lo - 2, hi + 2, size=h)
        xb, _, cols = half_boundaries(s, ks)
        x[1, cols] = xb
    if rows > 2:  # one row sprinkled with specials
        specials = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 0.0, -0.0, 1e-40, -1e-40],
                            F32)
        idx = rng.choice(h, size=min(h, specials.size), replace=False)
        x[2, idx] = specials[: idx.size]
    if rows > 3:  # far out of range both ways
        x[3] = (rng.choice([-1, 1], size=h) * rng.uniform(1, 50, size=h) * hi * s).astype(F32)
    return x


# ---------------------------------------------------------------- bit-exact vs the contract

@pytest.mark.parametrize("mode", MODE_IDS)
def test_codes_match_contract_all_widths(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    failures = []
    for h in WIDTHS:
        scale = (rng.uniform(0.01, 0.2, size=h if pc else 1)).astype(F32)
        x = mixed_data(rng, 5, h, _scale_row(scale, h), bits)
        got = gqa.quantize(x, scale, bits=bits)
        want = quantize_ref(x, scale, bits)
        assert got.dtype == want.dtype and got.shape == (5, packed_width(bits, h))
        if not np.array_equal(got, want):
            failures.append((h, int(np.argwhere(got != want)[0][1])))
    assert not failures, f"{kernel_path}/{mode}: codes differ at (width, first byte) {failures}"


@pytest.mark.parametrize("mode", MODE_IDS)
def test_leading_dims_and_noncontiguous_input(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    h = 24
    scale = rng.uniform(0.01, 0.1, size=h if pc else 1).astype(F32)
    base = (rng.standard_normal((2, 3, 2 * h)) * 3).astype(F32)
    x = base[:, :, ::2]  # not contiguous
    assert not x.flags.c_contiguous
    got = gqa.quantize(x, scale, bits=bits)
    assert got.shape == (2, 3, packed_width(bits, h))
    assert np.array_equal(got, quantize_ref(np.ascontiguousarray(x), scale, bits))
    # the per-tensor scale may be a python float or any 1-element array; per-channel any shape
    s2 = float(scale[0]) if not pc else scale.reshape(1, 1, 1, h)
    assert np.array_equal(gqa.quantize(x, s2, bits=bits), quantize_ref(np.ascontiguousarray(x), s2, bits))


def test_hand_computed_int8(kernel_path):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5, 128.0, -129.0,
                  np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 3.49, -3.51], F32)
    want = np.array([0, 2, 2, 0, -2, -2, 126, 127, -128, -128, 127, -128,
                     127, 127, -128, 127, -128, 0, 0, 3, -4], np.int8)
    # width 21: exercises the SIMD body and the tail on every path
    assert np.array_equal(gqa.quantize(x, np.array([1.0], F32)), want)
    # scale 0 is treated as 1 when quantizing
    assert np.array_equal(gqa.quantize(x, np.array([0.0], F32)), want)
    # scale 2: x * 0.5
    x2 = np.array([1.0, 3.0, 5.0, -1.0, -3.0, -5.0, 255.0, 257.0, -256.0, -258.0], F32)
    assert np.array_equal(gqa.quantize(x2, 2.0), np.array([0, 2, 2, 0, -2, -2, 127, 127, -128, -128],
                                                          np.int8))


def test_hand_computed_int4(kernel_path):
    # codes:     7     6    -8    -8   2   7     7    -8   0  -2   -2  3
    x = np.array([7.5, 6.5, -8.5, -7.5, 2.5, np.nan, np.inf, -np.inf, 0.0, -1.5, -2.5, 3.2], F32)
    nib = np.array([7, 6, -8, -8, 2, 7, 7, -8, 0, -2, -2, 3]) + 8
    want = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)
    assert np.array_equal(gqa.quantize(x, np.array([1.0], F32), bits=4), want)
    assert np.array_equal(gqa.quantize(x, np.array([0.0], F32), bits=4), want)
    # ort-verified-facts: codes (0, 2) -> byte 0xA8
    assert gqa.quantize(np.array([0.0, 2.0], F32), 1.0, bits=4).tolist() == [0xA8]
    # odd widths end with pad nibble 8 in the high half
    assert gqa.quantize(np.array([0.0], F32), 1.0, bits=4).tolist() == [0x88]
    assert gqa.quantize(np.array([-8.0], F32), 1.0, bits=4).tolist() == [0x80]
    assert gqa.quantize(np.array([1.0, 2.0, -3.0], F32), 1.0, bits=4).tolist() == [0xA9, 0x85]
    # every width 1..33: pad nibble exactly where the width is odd
    for h in range(1, 34):
        got = gqa.quantize(np.full((2, h), 5.0, F32), 1.0, bits=4)
        want = np.full((2, (h + 1) // 2), 0xDD, np.uint8)
        if h % 2:
            want[:, -1] = 0x8D
        assert np.array_equal(got, want), h


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("s", [0.037, 0.1, 1 / 3, 0.01, 3.7, 1e-3, 0.7, 1e-6])
def test_half_boundaries_round_to_even(kernel_path, bits, s, rng):
    lo, hi = LIMITS[bits]
    h = 130
    row = np.full(h, F32(s), F32)
    ks = rng.integers(lo - 1, hi + 1, size=h)
    xb, kk, cols = half_boundaries(row, ks)
    # for a few k no float32 x has x * inv == k + 0.5 exactly; most do
    assert cols.size >= 0.5 * h, "could not construct exact .5 products"
    want = np.clip(even_of(kk), lo, hi)
    got = gqa.quantize(xb, F32(s), bits=bits)
    codes = got.astype(np.int32) if bits == 8 else unpack_int4(got, xb.size)
    bad = np.flatnonzero(codes != want)
    assert bad.size == 0, (f"{bits}-bit, s={s}: x={xb[bad[:5]]!r} x*inv={(xb[bad[:5]] * (F32(1) / F32(s))).astype(F32)!r}"
                           f" -> {codes[bad[:5]]}, want {want[bad[:5]]}")
    # per-channel with one .5 boundary per column, different scales per column
    if bits == 8:
        rowpc = rng.uniform(0.005, 0.5, size=h).astype(F32)
        xb, kk, cols = half_boundaries(rowpc, rng.integers(lo, hi, size=h))
        x = np.zeros(h, F32)
        x[cols] = xb
        got = gqa.quantize(x, rowpc).astype(np.int32)
        assert np.array_equal(got[cols], even_of(kk))


def _multiply_divide_differ(s=0.037):
    """float32 x near (k+0.5)*s where rint(x * fl(1/s)) != rint(fl(x / s))."""
    s = F32(s)
    inv = F32(1) / s
    found = []
    for k in range(-140, 140):
        x = F32((k + 0.5) * float(s))
        for _ in range(6):
            x = np.nextafter(x, F32(-np.inf))
        for _ in range(12):
            x = np.nextafter(x, F32(np.inf))
            if np.rint(F32(x * inv)) != np.rint(F32(x / s)):
                found.append(x)
    return np.array(found, F32)


def test_scale_0037_multiply_not_divide(kernel_path):
    x = _multiply_divide_differ(0.037)
    assert x.size >= 3, "expected values where multiply and divide round differently"
    inv = F32(1) / F32(0.037)
    mult = np.clip(np.rint((x * inv).astype(F32)), -128, 127)
    div = np.clip(np.rint((x / F32(0.037)).astype(F32)), -128, 127)
    got = gqa.quantize(x, F32(0.037)).astype(np.float32)
    assert np.array_equal(got, mult)
    assert np.sum(got != div) >= 1


def test_per_channel_scales_1e6_to_1e3(kernel_path, rng):
    for h in (7, 64, 129, 256):
        scale = np.geomspace(1e-6, 1e3, h).astype(F32)
        rng.shuffle(scale)
        for bits in (8, 4):
            hi = LIMITS[bits][1]
            x = (rng.uniform(-1.3 * hi, 1.3 * hi, size=(4, h)) * scale).astype(F32)
            x[3] = x[3] * F32(1e3)  # mostly clamped
            got = gqa.quantize(x, scale, bits=bits)
            assert np.array_equal(got, quantize_ref(x, scale, bits)), (h, bits)
            # sanity of the data: codes are spread over the whole range, not all clamped
            c = quantize_codes_ref(x[:3], scale, bits)
            assert (np.abs(c) < hi).mean() > 0.5


def test_huge_tiny_and_odd_scales(kernel_path, rng):
    """Products that overflow float32, subnormal inputs, scales that are tiny, huge,
    negative, zero in some channels: still exactly the contract."""
    h = 37
    x = np.concatenate([
        np.array([3.4e38, -3.4e38, 1e-45, -1e-45, 1.17e-38, 1e20, -1e20, 65504.0, -65504.0], F32),
        (rng.standard_normal(h - 9) * 100).astype(F32)])
    for scale in (F32(1e-30), F32(1e30), F32(3e-39), F32(-0.05), F32(0.0)):
        for bits in (8, 4):
            assert np.array_equal(gqa.quantize(x, scale, bits=bits), quantize_ref(x, scale, bits))
    s = rng.uniform(0.01, 1, size=h).astype(F32)
    s[::5] = 0.0
    s[1::7] = -s[1::7]
    for bits in (8, 4):
        assert np.array_equal(gqa.quantize(x, s, bits=bits), quantize_ref(x, s, bits))


# hypothesis: any float32 (specials included), any scale, every mode
_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_scale = st.one_of(st.just(0.0),
                   st.floats(min_value=float(F32(1e-7)), max_value=1e4, width=32),
                   st.floats(min_value=-10, max_value=float(F32(-1e-3)), width=32))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), mode=st.sampled_from(MODE_IDS))
def test_property_codes_match_contract(kernel_path, data, mode):
    bits, pc = MODES[mode]
    h = data.draw(st.integers(1, 70), label="h")
    rows = data.draw(st.integers(1, 3), label="rows")
    x = data.draw(hnp.arrays(F32, (rows, h), elements=_f32), label="x")
    scale = data.draw(hnp.arrays(F32, h if pc else 1, elements=_scale), label="scale")
    assert np.array_equal(gqa.quantize(x, scale, bits=bits), quantize_ref(x, scale, bits))


# ---------------------------------------------------------------- vs onnxruntime 1.31.1

def _gqa_present(x_bsnh, scale, bits, pc):
    """gqa.quantize per KV head, laid out as ORT's present [B, Nkv, S, Hp]."""
    b, s, nkv, h = x_bsnh.shape
    bnsh = np.ascontiguousarray(x_bsnh.transpose(0, 2, 1, 3))
    out = np.empty((b, nkv, s, packed_width(bits, h)), np.int8 if bits == 8 else np.uint8)
    for j in range(nkv):
        sj = scale[j * h:(j + 1) * h] if pc else scale
        out[:, j] = gqa.quantize(bnsh[:, j], sj, bits=bits)
    return out


@pytest.mark.parametrize("mode", MODE_IDS)
@pytest.mark.parametrize("h", [8, 16, 64, 128, 256])
def test_codes_match_onnxruntime(kernel_path, mode, h, rng):
    bits, pc = MODES[mode]
    b, s, nkv = 2, 6, 2
    lo, hi = LIMITS[bits]
    ks = rng.uniform(0.01, 0.2, size=nkv * h if pc else 1).astype(F32)
    vs = rng.uniform(0.01, 0.2, size=nkv * h if pc else 1).astype(F32)
    if pc:
        ks[::11] = 0.0  # zero scales, treated as 1
    key = np.empty((b, s, nkv, h), F32)
    val = np.empty((b, s, nkv, h), F32)
    for j in range(nkv):
        kr = _scale_row(ks[j * h:(j + 1) * h] if pc else ks, h)
        vr = _scale_row(vs[j * h:(j + 1) * h] if pc else vs, h)
        key[:, :, j] = mixed_data(rng, b * s, h, kr, bits).reshape(b, s, h)
        val[:, :, j] = mixed_data(rng, b * s, h, vr, bits).reshape(b, s, h)
    pk, pv = ort_present(key, val, ks, vs, bits, pc)
    gk, gv = _gqa_present(key, ks, bits, pc), _gqa_present(val, vs, bits, pc)
    assert np.array_equal(gk, pk), f"present_key differs in {int((gk != pk).sum())} bytes"
    assert np.array_equal(gv, pv), f"present_value differs in {int((gv != pv).sum())} bytes"
    # our NumPy statement of the contract agrees with ORT too (validates the oracle)
    ref = np.stack([quantize_ref(key[:, :, j], ks[j * h:(j + 1) * h] if pc else ks, bits)
                    for j in range(nkv)], axis=1)
    assert np.array_equal(ref, pk)
    # the data really exercised the range (not all zeros / all clamped)
    codes = unpack_int4(pk) if bits == 4 else pk.astype(np.int32)
    assert codes.min() == lo and codes.max() == hi and np.unique(codes).size > (hi - lo) // 4


def test_onnxruntime_special_scales_and_boundaries(kernel_path, rng):
    """Scale 0, the 0.037 multiply/divide cases, .5 boundaries and per-channel scales
    spanning 1e-6..1e3, through ORT and gqa."""
    h, nkv, b = 64, 1, 1
    x037 = _multiply_divide_differ(0.037)
    for bits, pc in MODES.values():
        lo, hi = LIMITS[bits]
        rows = []
        if pc:
            scale = np.geomspace(1e-6, 1e3, h).astype(F32)
            rng.shuffle(scale)
            scale[5] = 0.0
        else:
            scale = np.array([0.037], F32)
        row = _scale_row(scale, h)
        xb, _, cols = half_boundaries(np.where(row == 0, F32(1), row).astype(F32),
                                      rng.integers(lo, hi + 1, size=h))
        r = np.zeros(h, F32)
        r[cols] = xb
        rows.append(r)
        if not pc:
            rows.append(np.resize(x037, h).astype(F32))
        rows.append((rng.uniform(-1.2 * hi, 1.2 * hi, size=h) * row).astype(F32))
        x = np.stack(rows)[None, :, None, :]  # [B=1, S, Nkv=1, H]
        pk, _ = ort_present(x, x, scale, scale, bits, pc)
        assert np.array_equal(_gqa_present(x, scale, bits, pc), pk), (bits, pc)
    # scale exactly 0 per tensor
    x = (rng.standard_normal((b, 3, nkv, h)) * 4).astype(F32)
    for bits in (8, 4):
        pk, _ = ort_present(x, x, np.zeros(1, F32), np.zeros(1, F32), bits, False)
        assert np.array_equal(_gqa_present(x, np.zeros(1, F32), bits, False), pk)


# ---------------------------------------------------------------- dequantize

@pytest.mark.parametrize("mode", MODE_IDS)
def test_dequantize_matches_contract(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    for h in WIDTHS:
        codes = rng.integers(-128, 128, size=(3, h)).astype(np.int8) if bits == 8 else \
            rng.integers(0, 256, size=(3, packed_width(4, h))).astype(np.uint8)
        if bits == 4 and h % 2:
            codes[:, -1] = (codes[:, -1] & 0xF) | 0x80
        scale = np.geomspace(1e-4, 10, h if pc else 1).astype(F32)
        got = gqa.dequantize(codes, scale, bits=bits, head_size=h if bits == 4 else None)
        want = dequantize_ref(codes, scale, bits, h)
        assert got.dtype == F32 and got.shape == (3, h)
        assert np.array_equal(got, want), h  # one float32 multiply: exact


def test_dequantize_hand_values(kernel_path):
    # INT8: code * s; s == 0 gives 0 (the zero -> 1 rule is for quantizing only)
    codes = np.array([-128, -1, 0, 1, 127] * 4, np.int8)
    assert np.array_equal(gqa.dequantize(codes, 0.5), np.array([-64, -0.5, 0, 0.5, 63.5] * 4, F32))
    assert np.array_equal(gqa.dequantize(codes, 0.0), np.zeros(20, F32))
    # INT4: byte 0 decodes to -8*s (both nibbles), 0x88 to 0, 0xA8 -> (0, 2)
    b = np.array([0x00, 0x88, 0xA8, 0xF7] * 3, np.uint8)
    want = np.array([-8, -8, 0, 0, 0, 2, -1, 7] * 3, F32) * F32(0.25)
    assert np.array_equal(gqa.dequantize(b, 0.25, bits=4), want)
    # odd head_size drops the pad nibble
    assert np.array_equal(gqa.dequantize(b, 0.25, bits=4, head_size=23), want[:23])


@pytest.mark.parametrize("mode", MODE_IDS)
def test_roundtrip_within_half_step(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    h = 65
    scale = rng.uniform(0.01, 0.05, size=h if pc else 1).astype(F32)
    row = _scale_row(scale, h)
    x = (rng.uniform(-0.95, 0.95, size=(8, h)) * LIMITS[bits][1] * row).astype(F32)
    back = gqa.dequantize(gqa.quantize(x, scale, bits=bits), scale, bits=bits, head_size=h)
    # |x - q*s| <= s/2 (plus float32 rounding of x*inv and q*s)
    assert np.all(np.abs(back - x) <= row * (0.5 + 1e-5)), mode


# ---------------------------------------------------------------- empty and out=

def test_empty_shapes(kernel_path):
    for bits in (8, 4):
        for shape in [(0, 8), (3, 0), (0,), (2, 0, 5)]:
            x = np.zeros(shape, F32)
            h = shape[-1]
            out = gqa.quantize(x, np.ones(h if h and bits == 8 else 1, F32), bits=bits)
            assert out.shape == shape[:-1] + (packed_width(bits, h),)
            back = gqa.dequantize(out, 1.0, bits=bits, head_size=h)
            assert back.shape == shape and back.dtype == F32


@pytest.mark.parametrize("mode", MODE_IDS)
def test_out_is_filled_and_returned(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    h = 33
    scale = rng.uniform(0.01, 0.1, size=h if pc else 1).astype(F32)
    x = (rng.standard_normal((4, h)) * 2).astype(F32)
    x_copy, s_copy = x.copy(), scale.copy()
    out = np.full((4, packed_width(bits, h)), 0x55, np.int8 if bits == 8 else np.uint8)
    r = gqa.quantize(x, scale, bits=bits, out=out)
    assert r is out and np.array_equal(out, quantize_ref(x, scale, bits))
    dq = np.full((4, h), np.nan, F32)
    r = gqa.dequantize(out, scale, bits=bits, head_size=h, out=dq)
    assert r is dq and np.array_equal(dq, dequantize_ref(out, scale, bits, h))
    assert np.array_equal(x, x_copy) and np.array_equal(scale, s_copy)  # inputs untouched


# ---------------------------------------------------------------- argument errors

def _names(exc_info, name):
    msg = str(exc_info.value)
    assert msg.startswith(name + " ") or msg.startswith(name + "=") or f"'{name}'" in msg, \
        f"message does not name {name!r}: {msg!r}"


Q_BAD = [  # (kwargs changes, exception, argument named)
    ({"x": [[1.0, 2.0]]}, TypeError, "x"),
    ({"x": np.ones((2, 8), np.float64)}, TypeError, "x"),
    ({"x": np.ones((2, 8), np.float16)}, TypeError, "x"),
    ({"x": np.ones((), F32)}, ValueError, "x"),
    ({"scale": np.ones(1, np.float64)}, TypeError, "scale"),
    ({"scale": np.ones(3, F32)}, ValueError, "scale"),
    ({"scale": np.ones(16, F32)}, ValueError, "scale"),
    ({"scale": "0.1"}, TypeError, "scale"),
    ({"scale": True}, TypeError, "scale"),
    ({"scale": np.array([np.nan], F32)}, ValueError, "scale"),
    ({"scale": float("inf")}, ValueError, "scale"),
    ({"bits": 5}, ValueError, "bits"),
    ({"bits": 16}, ValueError, "bits"),
    ({"bits": True}, ValueError, "bits"),
    ({"bits": None}, ValueError, "bits"),
]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("i", range(len(Q_BAD)))
def test_quantize_bad_args(bits, i):
    change, exc, name = Q_BAD[i]
    kw = {"x": np.ones((2, 8), F32), "scale": np.ones(1, F32), "bits": bits}
    kw.update(change)
    out_bits = kw["bits"] if kw["bits"] in (4, 8) and kw["bits"] is not True else bits
    out = np.full((2, packed_width(out_bits, 8)), 0x33, np.int8 if out_bits == 8 else np.uint8)
    before = out.copy()
    x = kw.pop("x")
    with pytest.raises(exc) as ei:
        gqa.quantize(x, **kw, out=out)
    _names(ei, name)
    assert np.array_equal(out, before), "out was written although the call failed"


def _bad_outs(shape, dtype, other_dtype, inputs):
    ro = np.zeros(shape, dtype)
    ro.flags.writeable = False
    big = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    yield "dtype", np.zeros(shape, other_dtype), TypeError
    yield "shape", np.zeros(shape[:-1] + (shape[-1] + 1,), dtype), ValueError
    yield "rank", np.zeros((1,) + shape, dtype), ValueError
    yield "readonly", ro, ValueError
    yield "noncontig", big[..., ::2], ValueError
    yield "fortran", np.asfortranarray(np.zeros(shape[::-1], dtype).T), ValueError
    yield "list", np.zeros(shape, dtype).tolist(), TypeError
    for j, x in enumerate(inputs):
        yield f"overlap{j}", x, ValueError


@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_bad_out(bits):
    x = np.ones((2, 8), F32)
    cd = np.int8 if bits == 8 else np.uint8
    shape = (2, packed_width(bits, 8))
    # a view of x's memory with exactly the right shape/dtype: must be refused as overlapping
    overlap = x.reshape(-1).view(cd)[: shape[0] * shape[1]].reshape(shape)
    for what, out, exc in _bad_outs(shape, cd, np.int16 if bits == 8 else np.int8, [overlap]):
        before = np.array(out, copy=True)
        x_before = x.copy()
        with pytest.raises(exc) as ei:
            gqa.quantize(x, 1.0, bits=bits, out=out)
        _names(ei, "out")
        assert np.array_equal(np.asarray(out), before) and np.array_equal(x, x_before), what


D_BAD = [
    ({"codes": np.ones((2, 8), np.uint8), "bits": 8}, TypeError, "codes"),
    ({"codes": np.ones((2, 4), np.int8), "bits": 4}, TypeError, "codes"),
    ({"codes": np.ones((), np.int8), "bits": 8}, ValueError, "codes"),
    ({"codes": [1, 2], "bits": 8}, TypeError, "codes"),
    ({"scale": np.ones(5, F32)}, ValueError, "scale"),
    ({"scale": np.ones(1, np.float16)}, TypeError, "scale"),
    ({"scale": np.array([-np.inf], F32)}, ValueError, "scale"),
    ({"bits": 2}, ValueError, "bits"),
    ({"head_size": 9, "bits": 4}, ValueError, "head_size"),
    ({"head_size": 6, "bits": 4}, ValueError, "head_size"),
    ({"head_size": -1, "bits": 4}, ValueError, "head_size"),
    ({"head_size": 7, "bits": 8}, ValueError, "head_size"),
    ({"head_size": 7.0, "bits": 4}, ValueError, "head_size"),
]


@pytest.mark.parametrize("i", range(len(D_BAD)))
def test_dequantize_bad_args(i):
    change, exc, name = D_BAD[i]
    bits = change.get("bits", 4)
    kw = {"codes": np.ones((2, 8), np.int8) if bits == 8 else np.ones((2, 4), np.uint8),
          "scale": np.ones(1, F32), "bits": bits}
    kw.update(change)
    out = np.full((2, 8), 7.0, F32)
    codes = kw.pop("codes")
    with pytest.raises(exc) as ei:
        gqa.dequantize(codes, **kw, out=out)
    _names(ei, name)
    assert np.all(out == 7.0)


def test_dequantize_bad_out():
    codes = np.ones((2, 8), np.int8)
    # a float32 view of the codes' memory with the right shape is an overlapping out
    buf = np.zeros(64, np.uint8)
    codes_in_buf = buf[:16].view(np.int8).reshape(2, 8)
    overlap = buf.view(F32)[:16].reshape(2, 8)
    for what, out, exc in _bad_outs((2, 8), F32, np.float64, [overlap]):
        before = np.array(out, copy=True)
        with pytest.raises(exc) as ei:
            gqa.dequantize(codes_in_buf if what.startswith("overlap") else codes, 1.0, out=out)
        _names(ei, "out")
        assert np.array_equal(np.asarray(out), before), what


@pytest.mark.parametrize("mode", MODE_IDS)
def test_dequantize_transposed_kernel(kernel_path, mode, rng):
    """The kernel table's dequantize_t (used to build flash K tiles; reached through the
    private gqa._kernels module): out[c, r] == dequantize(codes)[r, c], exactly."""
    from gqa import _kernels
    from gqa._formats import CacheFormat
    bits, pc = MODES[mode]
    for rows, h in ((1, 1), (5, 7), (9, 64), (33, 129)):
        codes = (rng.integers(-128, 128, size=(rows, h)).astype(np.int8) if bits == 8 else
                 rng.integers(0, 256, size=(rows, packed_width(4, h))).astype(np.uint8))
        scale = np.geomspace(1e-3, 10, h if pc else 1).astype(F32)
        out = np.full((h, rows), np.nan, F32)
        ctype = CacheFormat("PER_CHANNEL" if pc else "PER_TENSOR", bits).ctype(h)
        _kernels.dequantize_t(codes, out, scale, rows, h, ctype)
        assert np.array_equal(out, dequantize_ref(codes, scale, bits, h).T), (rows, h)
