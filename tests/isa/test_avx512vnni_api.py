"""The opt-in approximate INT8 per-tensor QK kernel (AVX-512 VNNI), run natively.

Checked through the public API against a NumPy statement of its contract
(the contract stated in kernels_avx512.c):
  - bit for bit against the formula, and the integer dot exactly (rows whose
    scale is a power of two, so the integer can be read back from C);
  - against the exact path within the worst-case error bound derived below;
  - off unless opted in.
Skips where the CPU has no AVX-512 VNNI; tests/isa/test_isa.py runs the same
kernel under emulation there (`avx512vnni-emulated`).
"""
import numpy as np
import pytest

import gqa
from gqa import _dispatch

if not _dispatch.approx_vnni_runnable():
    pytest.skip("this CPU (or build) cannot run the AVX-512 VNNI kernel; "
                "test_isa.py[avx512vnni-emulated] covers it", allow_module_level=True)

F32 = np.float32
U = 2.0 ** -24  # float32 unit roundoff


def approx_ref(a, q, s, alpha):
    """(C, D): the approximate kernel's output and its integer dots, in NumPy."""
    a = a.astype(F32)
    amax = np.max(np.abs(a), axis=1) if a.shape[1] else np.zeros(a.shape[0], F32)
    with np.errstate(divide="ignore", over="ignore"):
        r = np.where(amax == 0, F32(0), F32(127) / amax).astype(F32)
    zero = ~(r <= np.finfo(F32).max)
    inv = np.where(zero, F32(0), r).astype(F32)
    sa = np.where(zero, F32(1), amax / F32(127)).astype(F32)
    t = (a * inv[:, None]).astype(F32)           # rounded product
    u = (t + F32(128)).astype(F32)               # rounded sum, never fused
    code = np.clip(np.rint(u), 0, 255).astype(np.int64)
    D = code @ q.astype(np.int64).T - 128 * q.astype(np.int64).sum(axis=1)[None, :]
    mult = ((F32(alpha) * sa).astype(F32) * F32(s)).astype(F32)
    return (D.astype(F32) * mult[:, None]).astype(F32), D, sa


def run(a, q, s, alpha, approx):
    with gqa.config(path="avx512", approx_vnni=approx):
        assert _dispatch.approx_vnni_effective() == approx
        return gqa.qk_gemm(a, q, np.array([s], F32), bits=8, alpha=alpha)


def bound(a, q, s, alpha, sa, approx_out, K):
    """Worst-case |approx - exact|, elementwise.  With c_k the signed code,
    sa*inv = 1 + e (|e| <= 2u), |c_k - a_k*inv| <= 1/2 + 2^-16 (rint, plus the
    two float32 roundings of a_k*inv <= 127 and of +128 < 256), so
      |a_k - sa*c_k| <= sa*(1/2 + 2^-16) + |a_k|*2^-22,
    and the exact dot differs from alpha*s*sa*D by at most
      |alpha|*s*(sa*(1/2 + 2^-16)*sum|q| + 2^-22*sum|a*q|);
    the four roundings of float(D)*((alpha*sa)*s) add 4u|C| (8u taken), and the
    exact path's own float32 error is at most (K + 2)u * |alpha|*s*sum|a*q|."""
    qa = np.abs(q.astype(np.float64))  # (np.abs of int8 -128 is -128)
    aq = np.abs(a.astype(np.float64)) @ qa.T
    sq = qa.sum(axis=1)[None, :]
    k = abs(alpha) * s
    return (k * (sa[:, None] * (0.5 + 2.0 ** -16) * sq + 2.0 ** -22 * aq)
            + 8 * U * np.abs(approx_out) + (K + 2) * U * k * aq)


WIDTHS = list(range(1, 34)) + [63, 64, 65, 127, 128, 129, 256, 2047, 2048, 2049, 4200]


@pytest.mark.parametrize("K", WIDTHS)
def test_matches_contract_and_bound(K):
    rng = np.random.default_rng(K)
    for M in (1, 2, 3, 4, 5, 8, 9, 16):
        N = 19
        a = (rng.standard_normal((M, K)) * rng.uniform(0.1, 10)).astype(F32)
        a[0, rng.integers(K)] *= 4  # one large element: amax not typical
        if M > 2:
            a[2] = 0  # amax == 0: codes 128, results 0
        q = rng.integers(-128, 128, (N, K)).astype(np.int8)
        s, alpha = 0.031, 0.17
        out = run(a, q, s, alpha, True)
        ref, D, sa = approx_ref(a, q, s, alpha)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (K, M)
        exact = run(a, q, s, alpha, False)
        err = np.abs(out.astype(np.float64) - exact)
        assert np.all(err <= bound(a, q, s, alpha, sa, out, K)), (K, M, err.max())


@pytest.mark.parametrize("K", [1, 7, 16, 63, 64, 65, 128, 129, 2049])
def test_integer_dot_exact(K):
    """amax = 127 * 2^-j makes sa = 2^-j and inv = 2^j exact; with alpha = 1 and
    s = 2^-3, C = D * 2^-(j+3) exactly, so D is read back and compared."""
    rng = np.random.default_rng(100 + K)
    M, N, j = 5, 13, 4
    a = (rng.uniform(-1, 1, (M, K)) * 127 * 2.0 ** -j).astype(F32)
    a[np.arange(M), rng.integers(K, size=M)] = F32(127 * 2.0 ** -j)
    q = rng.integers(-128, 128, (N, K)).astype(np.int8)
    q[0] = -128  # extreme codes
    q[1] = 127
    out = run(a, q, 2.0 ** -3, 1.0, True)
    D = out.astype(np.float64) * 2.0 ** (j + 3)
    assert np.all(D == np.round(D))
    _, D_ref, _ = approx_ref(a, q, 2.0 ** -3, 1.0)
    assert np.array_equal(D.astype(np.int64), D_ref)


def test_edge_rows():
    K, N = 40, 6
    rng = np.random.default_rng(7)
    q = rng.integers(-128, 128, (N, K)).astype(np.int8)
    a = rng.standard_normal((4, K)).astype(F32)
    a[1, 3] = np.nan
    a[2, 5] = np.inf
    a[3] = F32(1e-38)  # 127 / amax overflows: treated like amax == 0
    out = run(a, q, 0.05, 1.0, True)
    assert np.all(np.isfinite(out[0]))
    assert np.all(np.isnan(out[1])) and np.all(np.isnan(out[2]))
    assert np.all(out[3] == 0)


def test_off_unless_opted_in():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 128)).astype(F32)
    q = rng.integers(-128, 128, (64, 128)).astype(np.int8)
    with gqa.config(path="avx512"):
        assert not _dispatch.approx_vnni_effective()
        default = gqa.qk_gemm(a, q, np.array([0.02], F32), bits=8, alpha=0.5)
    exact = 0.5 * a.astype(np.float64) @ (q.astype(np.float64) * np.float64(F32(0.02))).T
    assert np.allclose(default, exact, rtol=1e-5, atol=1e-4)
    approx = run(a, q, 0.02, 0.5, True)
    assert not np.array_equal(default, approx)
    # never for the other cache types
    with gqa.config(path="avx512", approx_vnni=True):
        for bits, sc in ((8, np.full(128, 0.02, F32)), (4, np.array([0.02], F32))):
            qq = gqa.quantize(rng.standard_normal((8, 128)).astype(F32), sc, bits=bits)
            with gqa.config(approx_vnni=False):
                want = gqa.qk_gemm(a, qq, sc, bits=bits)
            assert np.array_equal(gqa.qk_gemm(a, qq, sc, bits=bits), want)
