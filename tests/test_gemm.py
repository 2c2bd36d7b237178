"""gqa.qk_gemm / gqa.sv_gemm on every kernel path, against a float64 oracle on the
dequantized B with a derived float32 error bound (see _reference.qk_bound / sv_bound);
beta semantics, empty dimensions, split invariance, cross-path agreement, validation."""
import math

import numpy as np
import pytest

import gqa
from _reference import (F32, MODES, assert_within, dequantize_ref, packed_width, qk_bound,
                        qk_oracle, random_codes, random_scale, sv_bound, sv_oracle)

MODE_IDS = list(MODES)
MS = [1, 2, 3, 4, 8, 16, 128]
QK_SHAPES = [(1, 1), (3, 7), (17, 33), (64, 64), (9, 128), (130, 129), (40, 256), (11, 8)]
SV_SHAPES = [(1, 1), (7, 3), (33, 17), (64, 64), (128, 9), (129, 130), (300, 128), (5, 256)]


def qk_case(rng, mode, m, n, k, scale_kind="typical"):
    bits, pc = MODES[mode]
    a = rng.standard_normal((m, k)).astype(F32)
    b = random_codes(rng, (n, packed_width(bits, k)), bits)
    if scale_kind == "wide" and pc:
        scale = np.geomspace(1e-6, 1e3, k).astype(F32)
        rng.shuffle(scale)
    else:
        scale = random_scale(rng, k, pc)
    return a, b, scale, dequantize_ref(b, scale, bits, k)


def sv_case(rng, mode, m, k, n, probs=False):
    bits, pc = MODES[mode]
    a = rng.standard_normal((m, k)).astype(F32)
    if probs:
        a = np.abs(a)
        a = (a / a.sum(axis=1, keepdims=True)).astype(F32)
    b = random_codes(rng, (k, packed_width(bits, n)), bits)
    scale = random_scale(rng, n, pc)
    return a, b, scale, dequantize_ref(b, scale, bits, n)


# ---------------------------------------------------------------- QK vs oracle

@pytest.mark.parametrize("mode", MODE_IDS)
@pytest.mark.parametrize("m", MS)
def test_qk_matches_oracle(kernel_path, mode, m, rng):
    bits, _ = MODES[mode]
    for n, k in QK_SHAPES:
        a, b, scale, bd = qk_case(rng, mode, m, n, k)
        alpha = 1.0 / math.sqrt(k)
        c = gqa.qk_gemm(a, b, scale, bits=bits, alpha=alpha)
        assert c.shape == (m, n) and c.dtype == F32
        assert_within(c, qk_oracle(a, bd, alpha), qk_bound(a, bd, alpha),
                      f"{kernel_path} {mode} M={m} N={n} K={k}")


@pytest.mark.parametrize("mode", MODE_IDS)
def test_qk_alpha_wide_scales_and_out(kernel_path, mode, rng):
    bits, _ = MODES[mode]
    for alpha in (1.0, -0.3, 2.5e-3):
        for k in (24, 128, 131):
            a, b, scale, bd = qk_case(rng, mode, 5, 37, k, scale_kind="wide")
            out = np.full((5, 37), np.nan, F32)
            r = gqa.qk_gemm(a, b, scale, bits=bits, alpha=alpha, out=out)
            assert r is out
            assert_within(out, qk_oracle(a, bd, alpha), qk_bound(a, bd, alpha),
                          f"{kernel_path} {mode} alpha={alpha} K={k}")


@pytest.mark.parametrize("mode", MODE_IDS)
def test_qk_large_sampled(kernel_path, mode):
    """The benchmark shape M=128, N=2048, K=128 (fixed seed), checked on sampled rows/cols."""
    bits, _ = MODES[mode]
    rng = np.random.default_rng(20261129)
    a, b, scale, bd = qk_case(rng, mode, 128, 2048, 128)
    c = gqa.qk_gemm(a, b, scale, bits=bits, alpha=0.125)
    rows = rng.choice(128, 16, replace=False)
    cols = rng.choice(2048, 256, replace=False)
    assert_within(c[np.ix_(rows, cols)], qk_oracle(a[rows], bd[cols], 0.125),
                  qk_bound(a[rows], bd[cols], 0.125), f"{kernel_path} {mode} 128x2048x128")


def test_qk_preserves_fp32_query(kernel_path):
    """Contract section 6.4: S8 per-tensor must not quantize the float32 query.
    M=1, N=3, K=128, A = [1024, 3, 3, ...], B all 1 (scale 1): exactly 1024 + 127*3 = 1405
    (an 8-bit query with amax 1024 would turn the 3s into 0 and give 1024)."""
    a = np.full((1, 128), 3.0, F32)
    a[0, 0] = 1024.0
    b = np.ones((3, 128), np.int8)
    with gqa.config(approx_vnni=False):
        c = gqa.qk_gemm(a, b, np.array([1.0], F32), bits=8, alpha=1.0)
        assert np.all(np.abs(c - 1405.0) <= 1e-3), c
        c = gqa.qk_gemm(a, b, np.array([1.0], F32), bits=8, alpha=1.0 / math.sqrt(128))
        assert np.all(np.abs(c - 1405.0 / math.sqrt(128)) <= 1e-3), c


def test_qk_rows_and_keys_split_bit_identical(kernel_path, rng):
    """gqa_kernels.h: C[m, n] depends only on row m of A, row n of B and K, so splitting a
    QK GEMM over rows (query heads) or keys gives bit-identical results."""
    for mode in MODE_IDS:
        bits, _ = MODES[mode]
        for k in (64, 128, 131):
            a, b, scale, _ = qk_case(rng, mode, 11, 45, k)
            full = gqa.qk_gemm(a, b, scale, bits=bits, alpha=0.3)
            for m in range(11):
                row = gqa.qk_gemm(a[m:m + 1], b, scale, bits=bits, alpha=0.3)
                assert np.array_equal(row, full[m:m + 1]), (mode, k, m)
            for lo, hi in ((0, 1), (1, 9), (9, 26), (26, 45)):
                part = gqa.qk_gemm(a, b[lo:hi], scale, bits=bits, alpha=0.3)
                assert np.array_equal(part, full[:, lo:hi]), (mode, k, lo, hi)
            four = np.concatenate([gqa.qk_gemm(a[i:i + 4], b, scale, bits=bits, alpha=0.3)
                                   for i in range(0, 11, 4)])
            assert np.array_equal(four, full), (mode, k)


# ---------------------------------------------------------------- SV vs oracle

@pytest.mark.parametrize("mode", MODE_IDS)
@pytest.mark.parametrize("m", MS)
def test_sv_matches_oracle(kernel_path, mode, m, rng):
    bits, _ = MODES[mode]
    for k, n in SV_SHAPES:
        a, b, scale, bd = sv_case(rng, mode, m, k, n, probs=(k % 2 == 0))
        out = np.full((m, n), np.nan, F32)  # beta 0 must overwrite NaN
        nn = n if (bits == 4 and n % 2) else None
        r = gqa.sv_gemm(a, b, scale, bits=bits, out=out, n=nn)
        assert r is out
        assert_within(out, sv_oracle(a, bd, 0.0, None), sv_bound(a, bd, 0.0, None),
                      f"{kernel_path} {mode} M={m} K={k} N={n}")
        c2 = gqa.sv_gemm(a, b, scale, bits=bits, n=nn)  # beta 0 without out
        assert np.array_equal(c2, out)


@pytest.mark.parametrize("mode", MODE_IDS)
@pytest.mark.parametrize("beta", [1.0, 0.5, -2.0])
def test_sv_beta(kernel_path, mode, beta, rng):
    bits, _ = MODES[mode]
    for m, k, n in ((1, 33, 64), (4, 200, 128), (6, 17, 9), (16, 70, 40)):
        a, b, scale, bd = sv_case(rng, mode, m, k, n)
        c0 = (rng.standard_normal((m, n)) * 3).astype(F32)
        out = c0.copy()
        gqa.sv_gemm(a, b, scale, bits=bits, beta=beta, out=out, n=n if bits == 4 and n % 2 else None)
        assert_within(out, sv_oracle(a, bd, beta, c0), sv_bound(a, bd, beta, c0),
                      f"{kernel_path} {mode} beta={beta} M={m} K={k} N={n}")


@pytest.mark.parametrize("mode", MODE_IDS)
def test_sv_beta1_accumulates_split_keys(kernel_path, mode, rng):
    """The flash pattern: beta 0 on the first block of keys, beta 1 on the next ones,
    equals one call over all keys (within the bound)."""
    bits, _ = MODES[mode]
    a, b, scale, bd = sv_case(rng, mode, 4, 300, 128, probs=True)
    out = np.full((4, 128), np.nan, F32)
    for lo, hi, beta in ((0, 100, 0.0), (100, 256, 1.0), (256, 300, 1.0)):
        gqa.sv_gemm(np.ascontiguousarray(a[:, lo:hi]), b[lo:hi], scale, bits=bits, beta=beta, out=out)
    assert_within(out, sv_oracle(a, bd, 0.0, None), sv_bound(a, bd, 0.0, None) * 1.5,
                  f"{kernel_path} {mode} split keys")


@pytest.mark.parametrize("mode", MODE_IDS)
def test_sv_large_sampled(kernel_path, mode):
    """M=128 query rows x 2048 keys x head 128 (fixed seed), sampled check."""
    bits, _ = MODES[mode]
    rng = np.random.default_rng(1129)
    a, b, scale, bd = sv_case(rng, mode, 128, 2048, 128, probs=True)
    c = gqa.sv_gemm(a, b, scale, bits=bits)
    rows = rng.choice(128, 16, replace=False)
    assert_within(c[rows], sv_oracle(a[rows], bd, 0.0, None), sv_bound(a[rows], bd, 0.0, None),
                  f"{kernel_path} {mode} SV 128x2048x128")


def test_sv_rows_split_bit_identical(kernel_path, rng):
    for mode in MODE_IDS:
        bits, _ = MODES[mode]
        a, b, scale, _ = sv_case(rng, mode, 13, 150, 72)
        full = gqa.sv_gemm(a, b, scale, bits=bits)
        for m in range(13):
            assert np.array_equal(gqa.sv_gemm(a[m:m + 1], b, scale, bits=bits), full[m:m + 1]), (mode, m)


def test_sv_columns_split_bit_identical(kernel_path, rng):
    """gqa_kernels.h: a column of C never depends on N or on the column block it falls in, so
    the column ranges of one SV GEMM (blocks of 64, 32, 16 columns and a masked tail here; on
    avx512 float32 tails of several blocks in one masked wide block) give bit-identical
    columns; every row count up to a block's limit."""
    cuts = (0, 64, 96, 112, 150)     # even: INT4 rows split on whole bytes
    for mode in MODE_IDS:
        bits, pc = MODES[mode]
        for m in (1, 2, 3, 4, 6, 7):
            a, b, scale, _ = sv_case(rng, mode, m, 150, cuts[-1], probs=True)
            full = gqa.sv_gemm(a, b, scale, bits=bits)
            for lo, hi in zip(cuts, cuts[1:]):
                cols = b[:, lo // 2:hi // 2] if bits == 4 else b[:, lo:hi]
                part = gqa.sv_gemm(a, np.ascontiguousarray(cols), scale[lo:hi] if pc else scale, bits=bits)
                assert np.array_equal(part, full[:, lo:hi]), (mode, m, lo, hi)


# ---------------------------------------------------------------- cross-path agreement

@pytest.mark.parametrize("mode", MODE_IDS)
def test_cross_path_agreement(simd_path, mode, rng):
    """Each SIMD path against 'scalar': identical codes; QK/SV within both bounds."""
    bits, pc = MODES[mode]
    x = (rng.standard_normal((9, 131)) * 5).astype(F32)
    qs = random_scale(rng, 131, pc, 0.01, 0.1)
    for m in MS:
        a, b, scale, bd = qk_case(rng, mode, m, 67, 128)
        sa, sb, sscale, sbd = sv_case(rng, mode, m, 130, 64, probs=True)
        codes = gqa.quantize(x, qs, bits=bits)
        qk = gqa.qk_gemm(a, b, scale, bits=bits, alpha=0.125)
        sv = gqa.sv_gemm(sa, sb, sscale, bits=bits)
        with gqa.config(path="scalar"):
            assert gqa.active_path() == "scalar"
            codes_s = gqa.quantize(x, qs, bits=bits)
            qk_s = gqa.qk_gemm(a, b, scale, bits=bits, alpha=0.125)
            sv_s = gqa.sv_gemm(sa, sb, sscale, bits=bits)
        assert gqa.active_path() == simd_path
        assert np.array_equal(codes, codes_s)
        assert_within(qk, qk_s.astype(np.float64), 2 * qk_bound(a, bd, 0.125), f"QK {simd_path} vs scalar")
        assert_within(sv, sv_s.astype(np.float64), 2 * sv_bound(sa, sbd, 0.0, None), f"SV {simd_path} vs scalar")


# ---------------------------------------------------------------- empty dimensions

@pytest.mark.parametrize("mode", MODE_IDS)
def test_empty_dims(kernel_path, mode):
    bits, pc = MODES[mode]
    cd = np.int8 if bits == 8 else np.uint8

    def sc(h):
        return np.full(h if pc else 1, 0.5, F32)

    # QK: M == 0 or N == 0 -> empty result; K == 0 -> zeros (overwriting whatever was in out)
    assert gqa.qk_gemm(np.zeros((0, 16), F32), np.zeros((5, packed_width(bits, 16)), cd), sc(16),
                       bits=bits).shape == (0, 5)
    assert gqa.qk_gemm(np.ones((3, 16), F32), np.zeros((0, packed_width(bits, 16)), cd), sc(16),
                       bits=bits).shape == (3, 0)
    out = np.full((3, 5), np.nan, F32)
    gqa.qk_gemm(np.ones((3, 0), F32), np.zeros((5, 0), cd), sc(0) if pc else sc(1), bits=bits,
                alpha=2.0, out=out)
    assert np.array_equal(out, np.zeros((3, 5), F32))
    assert np.array_equal(gqa.qk_gemm(np.ones((2, 0), F32), np.zeros((4, 0), cd), sc(1), bits=bits),
                          np.zeros((2, 4), F32))
    # SV: M == 0 or N == 0 -> empty; K == 0 -> only the beta treatment of out
    assert gqa.sv_gemm(np.zeros((0, 7), F32), np.zeros((7, packed_width(bits, 16)), cd), sc(16),
                       bits=bits).shape == (0, 16)
    assert gqa.sv_gemm(np.ones((3, 7), F32), np.zeros((7, 0), cd), sc(0) if pc else sc(1),
                       bits=bits).shape == (3, 0)
    b0 = np.zeros((0, packed_width(bits, 16)), cd)
    for beta, want in ((0.0, 0.0), (1.0, 3.0), (0.5, 1.5)):
        out = np.full((2, 16), 3.0, F32)
        if beta == 0.0:
            out[0, 0] = np.nan
        gqa.sv_gemm(np.ones((2, 0), F32), b0, sc(16), bits=bits, beta=beta, out=out)
        assert np.array_equal(out, np.full((2, 16), want, F32)), beta
    assert np.array_equal(gqa.sv_gemm(np.ones((2, 0), F32), b0, sc(16), bits=bits),
                          np.zeros((2, 16), F32))


# ---------------------------------------------------------------- inputs

@pytest.mark.parametrize("mode", MODE_IDS)
def test_noncontiguous_inputs_and_inputs_untouched(kernel_path, mode, rng):
    bits, pc = MODES[mode]
    a, b, scale, _ = qk_case(rng, mode, 4, 19, 64)
    want = gqa.qk_gemm(a, b, scale, bits=bits)
    a_nc = np.asfortranarray(a)
    b_big = np.zeros((19, 2 * b.shape[1]), b.dtype)
    b_big[:, ::2] = b
    b_nc = b_big[:, ::2]
    s_nc = np.repeat(scale, 2)[::2] if pc else scale
    copies = [x.copy() for x in (a_nc, b_nc, s_nc)]
    assert np.array_equal(gqa.qk_gemm(a_nc, b_nc, s_nc, bits=bits), want)
    assert all(np.array_equal(x, y) for x, y in zip((a_nc, b_nc, s_nc), copies))
    sa, sb, ss, _ = sv_case(rng, mode, 3, 40, 32)
    want = gqa.sv_gemm(sa, sb, ss, bits=bits)
    assert np.array_equal(gqa.sv_gemm(np.asfortranarray(sa), np.asfortranarray(sb), ss, bits=bits), want)
    # unaligned float32 inputs are copied, not refused
    assert np.array_equal(gqa.sv_gemm(unaligned(sa), sb, unaligned(ss), bits=bits), want)


def test_tolerance_catches_one_wrong_code():
    """The bounds are tight enough that a single code off by one is an error."""
    rng = np.random.default_rng(7)
    for mode in MODE_IDS:
        bits, _ = MODES[mode]
        a, b, scale, bd = qk_case(rng, mode, 4, 16, 128)
        bad = bd.copy()
        s = scale[0] if scale.size == 1 else scale[37]
        bad[5, 37] += s  # one element one step off
        wrong = (a.astype(np.float64) @ bad.astype(np.float64).T).astype(F32)
        with pytest.raises(AssertionError):
            assert_within(wrong, qk_oracle(a, bd, 1.0), qk_bound(a, bd, 1.0))
        sa, sb, ss, sbd = sv_case(rng, mode, 4, 512, 64, probs=True)
        bad = sbd.copy()
        bad[300, 11] += ss[0] if ss.size == 1 else ss[11]
        wrong = (sa.astype(np.float64) @ bad.astype(np.float64)).astype(F32)
        with pytest.raises(AssertionError):
            assert_within(wrong, sv_oracle(sa, sbd, 0.0, None), sv_bound(sa, sbd, 0.0, None))


# ---------------------------------------------------------------- argument errors

def _names(exc_info, name):
    msg = str(exc_info.value)
    assert msg.startswith(name + " ") or msg.startswith(name + "="), \
        f"message does not start with the argument name {name!r}: {msg!r}"


def _qk_args(bits, pc, m=2, n=8, k=16):
    return {"a": np.ones((m, k), F32),
            "b": np.ones((n, packed_width(bits, k)), np.int8 if bits == 8 else np.uint8),
            "scale": np.ones(k if pc else 1, F32), "bits": bits}


QK_BAD = [
    ({"a": [[1.0] * 16] * 2}, TypeError, "a"),
    ({"a": np.ones((2, 16), np.float64)}, TypeError, "a"),
    ({"a": np.ones(16, F32)}, ValueError, "a"),
    ({"a": np.ones((1, 2, 16), F32)}, ValueError, "a"),
    ({"a": np.ones((2, 12), F32)}, ValueError, "b"),  # K mismatch is reported on b
    ({"b": np.ones((8, 16), F32)}, TypeError, "b"),
    ({"b": np.ones((8, 16), np.int16)}, TypeError, "b"),
    ({"b": np.ones(16, np.int8), "bits": 8}, ValueError, "b"),
    ({"b": np.ones((8, 15), np.int8), "bits": 8}, ValueError, "b"),
    ({"b": np.ones((8, 16), np.uint8), "bits": 4}, ValueError, "b"),  # unpacked width for INT4
    ({"b": np.ones((8, 8), np.uint8), "bits": 8}, TypeError, "b"),
    ({"b": np.ones((8, 8), np.int8), "bits": 4}, TypeError, "b"),
    ({"scale": np.ones(3, F32)}, ValueError, "scale"),
    ({"scale": np.ones(8, F32)}, ValueError, "scale"),
    ({"scale": np.ones(16, np.float64)}, TypeError, "scale"),
    ({"scale": [1.0]}, TypeError, "scale"),
    ({"bits": 3}, ValueError, "bits"),
    ({"bits": "8"}, ValueError, "bits"),
    ({"alpha": "1"}, TypeError, "alpha"),
    ({"alpha": None}, TypeError, "alpha"),
    ({"alpha": True}, TypeError, "alpha"),
    ({"alpha": 1j}, TypeError, "alpha"),
    ({"alpha": float("nan")}, ValueError, "alpha"),
    ({"alpha": -float("inf")}, ValueError, "alpha"),
    ({"scale": np.array([np.inf], F32)}, ValueError, "scale"),
]


def _for_bits(cases):
    """(bits, case index) pairs; a case that fixes a valid bit width runs only for it."""
    return [(bits, i) for bits in (8, 4) for i, (change, _, _) in enumerate(cases)
            if change.get("bits") not in (4, 8) or change.get("bits") == bits]


@pytest.mark.parametrize("bits,i", _for_bits(QK_BAD))
def test_qk_bad_args(bits, i):
    change, exc, name = QK_BAD[i]
    kw = _qk_args(bits, False)
    kw.update(change)
    out = np.full((2, 8), 7.0, F32)
    a, b, s = kw.pop("a"), kw.pop("b"), kw.pop("scale")
    with pytest.raises(exc) as ei:
        gqa.qk_gemm(a, b, s, **kw, out=out)
    _names(ei, name)
    assert np.all(out == 7.0), "out was written although the call failed"


def unaligned(x):
    """A writeable copy of x whose data pointer is not aligned for its dtype."""
    buf = np.zeros(x.nbytes + 1, np.uint8)
    y = buf[1:].view(x.dtype).reshape(x.shape)
    y[...] = x
    assert not y.flags.aligned
    return y


def _bad_outs(shape, overlapping):
    ro = np.zeros(shape, F32)
    ro.flags.writeable = False
    big = np.zeros((shape[0], 2 * shape[1]), F32)
    yield "dtype", np.zeros(shape, np.float64), TypeError
    yield "dtype16", np.zeros(shape, np.float16), TypeError
    yield "shape", np.zeros((shape[0], shape[1] + 1), F32), ValueError
    yield "transposed shape", np.zeros(shape[::-1], F32), ValueError
    yield "rank", np.zeros((1,) + shape, F32), ValueError
    yield "readonly", ro, ValueError
    yield "noncontig", big[:, ::2], ValueError
    yield "fortran", np.asfortranarray(np.zeros(shape, F32)), ValueError
    yield "list", np.zeros(shape, F32).tolist(), TypeError
    yield "unaligned", unaligned(np.zeros(shape, F32)), ValueError
    for j, x in enumerate(overlapping):
        yield f"overlap{j}", x, ValueError


@pytest.mark.parametrize("mode", MODE_IDS)
def test_qk_bad_out(mode):
    bits, pc = MODES[mode]
    m, n, k = 2, 8, 16
    buf_a = np.ones(4 * m * k, F32)
    a = buf_a[: m * k].reshape(m, k)
    bbytes = n * packed_width(bits, k)
    buf_b = np.ones(bbytes + 64 * 4, np.uint8)
    b = buf_b[:bbytes].view(np.int8 if bits == 8 else np.uint8).reshape(n, -1)
    buf_s = np.ones(64, F32)
    s = buf_s[: (k if pc else 1)]
    overl = [a.reshape(-1)[: m * n].reshape(m, n),                         # out is a's memory
             buf_b[bbytes - 32: bbytes - 32 + 4 * m * n].view(F32).reshape(m, n)]  # overlaps b
    if pc:
        overl.append(buf_s[:m * n].reshape(m, n))                        # overlaps the scales
    for what, out, exc in _bad_outs((m, n), overl):
        before = np.array(out, copy=True)
        ins = [x.copy() for x in (a, b, s)]
        with pytest.raises(exc) as ei:
            gqa.qk_gemm(a, b, s, bits=bits, out=out)
        _names(ei, "out")
        assert np.array_equal(np.asarray(out), before), what
        assert all(np.array_equal(x, y) for x, y in zip((a, b, s), ins)), what


def _sv_args(bits, pc, m=2, k=5, n=16):
    return {"a": np.ones((m, k), F32),
            "b": np.ones((k, packed_width(bits, n)), np.int8 if bits == 8 else np.uint8),
            "scale": np.ones(n if pc else 1, F32), "bits": bits}


SV_BAD = [
    ({"a": np.ones((2, 5), np.float16)}, TypeError, "a"),
    ({"a": np.ones(5, F32)}, ValueError, "a"),
    ({"a": np.ones((2, 6), F32)}, ValueError, "b"),  # K (rows of b) mismatch
    ({"b": np.ones((6, 16), np.int8), "bits": 8}, ValueError, "b"),
    ({"b": np.ones((5, 16), np.int8, order="C")[None], "bits": 8}, ValueError, "b"),
    ({"b": np.ones((5, 8), F32)}, TypeError, "b"),
    ({"scale": np.ones(15, F32)}, ValueError, "scale"),
    ({"scale": np.ones(1, np.int32)}, TypeError, "scale"),
    ({"bits": 0}, ValueError, "bits"),
    ({"beta": "0"}, TypeError, "beta"),
    ({"beta": None}, TypeError, "beta"),
    ({"beta": float("nan")}, ValueError, "beta"),
    ({"beta": float("inf")}, ValueError, "beta"),
    ({"scale": np.array([np.nan], F32)}, ValueError, "scale"),
    ({"n": 14, "bits": 4}, ValueError, "n"),
    ({"n": 17, "bits": 4}, ValueError, "n"),
    ({"n": -2, "bits": 4}, ValueError, "n"),
    ({"n": 15, "bits": 8}, ValueError, "n"),
    ({"n": 2.0, "bits": 8}, ValueError, "n"),
]


@pytest.mark.parametrize("bits,i", _for_bits(SV_BAD))
def test_sv_bad_args(bits, i):
    change, exc, name = SV_BAD[i]
    kw = _sv_args(bits, False)
    kw.update(change)
    out = np.full((2, 16), 7.0, F32)
    a, b, s = kw.pop("a"), kw.pop("b"), kw.pop("scale")
    with pytest.raises(exc) as ei:
        gqa.sv_gemm(a, b, s, **kw, out=out)
    _names(ei, name)
    assert np.all(out == 7.0), "out was written although the call failed"


@pytest.mark.parametrize("beta", [1.0, 0.5, -1.0])
def test_sv_beta_needs_out(beta):
    kw = _sv_args(8, False)
    a, b, s = kw.pop("a"), kw.pop("b"), kw.pop("scale")
    with pytest.raises(ValueError) as ei:
        gqa.sv_gemm(a, b, s, beta=beta, **kw)
    _names(ei, "out")


def test_sv_odd_int4_width_needs_n(rng):
    """INT4 rows of 8 bytes are 16 wide unless n says 15; the pad nibble is ignored."""
    a = rng.standard_normal((3, 10)).astype(F32)
    b = random_codes(rng, (10, 8), 4)
    s = np.ones(1, F32)
    c16 = gqa.sv_gemm(a, b, s, bits=4)
    c15 = gqa.sv_gemm(a, b, s, bits=4, n=15)
    assert c16.shape == (3, 16) and c15.shape == (3, 15)
    bd = dequantize_ref(b, s, 4, 15)
    assert_within(c15, sv_oracle(a, bd, 0.0, None), sv_bound(a, bd, 0.0, None))
    with pytest.raises(ValueError) as ei:
        gqa.sv_gemm(a, b, np.ones(16, F32), bits=4, n=15)  # per-channel needs 15 scales
    _names(ei, "scale")


@pytest.mark.parametrize("mode", MODE_IDS)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_sv_bad_out(mode, beta):
    bits, pc = MODES[mode]
    m, k, n = 2, 40, 16
    buf_a = np.ones(m * k, F32)
    a = buf_a.reshape(m, k)
    bbytes = k * packed_width(bits, n)
    buf_b = np.ones(bbytes, np.uint8)
    b = buf_b.view(np.int8 if bits == 8 else np.uint8).reshape(k, -1)
    s = np.ones(n if pc else 1, F32)
    overl = [buf_a[: m * n].reshape(m, n), buf_b[: 4 * m * n].view(F32).reshape(m, n)]
    for what, out, exc in _bad_outs((m, n), overl):
        before = np.array(out, copy=True)
        ins = [x.copy() for x in (a, b, s)]
        with pytest.raises(exc) as ei:
            gqa.sv_gemm(a, b, s, bits=bits, beta=beta, out=out)
        _names(ei, "out")
        assert np.array_equal(np.asarray(out), before, equal_nan=True), what
        assert all(np.array_equal(x, y) for x, y in zip((a, b, s), ins)), what
