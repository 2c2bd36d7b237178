"""accuracy_level 4 on per-group codes (INT8 / INT4 / INT2, float32 or binary16 metadata): the
AVX2 unit's QK and P @ V (kernels_avx2_gdot.c, on the avx2 path and on avx512 without VNNI), the
same source built for AVX-VNNI (kernels_avxvnni_gdot.c) and for AVX-512 VNNI
(kernels_avx512vnni_gdot.c; both emulated in tests/isa) and
the NEON sdot unit's (kernels_neon_gdot.c, natively on aarch64; under qemu: tests/isa) against NumPy
statements of the per-group contracts of kernels_s8dot_contract.h, bit for bit; against float64
within the bounds those contracts give; and a decode step over a per-group cache within the
bound of its scores and probabilities."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gqa
from gqa import _dispatch
from _reference import _group_parts, group_quantize_ref

F32 = np.float32
U = 2.0 ** -24
QK_MAX = 32639
SV_KG = 256


# (path, unit): each unit on each path that runs it -- avx512 runs the VNNI unit where the CPU has
# VNNI and the avx2 unit elsewhere; a unit's exact kernels are its own path's
GROUP_UNITS = [("avx2", "avx2"), ("avx2", "avxvnni"), ("avx512", "avx2"), ("avx512", "avx512vnni"),
               ("neon", "neon")]
UNIT_PATH = {"avx2": "avx2", "avxvnni": "avx2", "avx512vnni": "avx512", "neon": "neon"}


@pytest.fixture(params=GROUP_UNITS, ids=["avx2", "avxvnni", "avx512-avx2", "avx512vnni", "neon"])
def group_dot_path(request):
    """A path on which level 4's per-group dots run on the unit of the param."""
    path, unit = request.param
    if not _dispatch.path_runnable(path):
        pytest.skip(f"this CPU (or build) cannot run the {path} path")
    with gqa.config(path=path):
        if _dispatch.group_dot_unit() != unit:
            pytest.skip(f"the {path} path runs per-group dots on {_dispatch.group_dot_unit()} here, not {unit}"
                        + {"neon": "; tests/isa/test_isa.py[neon-dot-qemu] checks it under qemu",
                           "avx512vnni": "; tests/isa/test_isa.py[avx512vnni-emulated] checks it on SIMDe",
                           "avxvnni": "; tests/isa/test_isa.py[avxvnni-emulated] checks it emulated"}.get(unit, ""))
    return path


def _rows(rng, shape, bits, g, meta16, spread=1.0):
    x = (rng.standard_normal(shape) * spread + rng.uniform(-1, 1)).astype(F32)
    return gqa.quantize(x, bits=bits, group_size=g, metadata="fp16" if meta16 else "fp32")


def _parts(rows, bits, g, h, meta16):
    """codes [R, h] (int64), and each group's scale and zero [R, h / g] (float32)."""
    codes, scale, zero = _group_parts(rows, bits, g, h, meta16)
    return codes.astype(np.int64).reshape(-1, h), scale.reshape(-1, h)[:, ::g], zero.reshape(-1, h)[:, ::g]


def gqk_ref(a, rows, bits, g, K, meta16, alpha):
    """qk_gemm_s8_dot's per-group contract for rows whose maximum is finite and > 0."""
    u, s, z = _parts(rows, bits, g, K, meta16)
    J = K // g
    out = np.empty((a.shape[0], u.shape[0]), F32)
    for m in range(a.shape[0]):
        amax = np.abs(a[m]).max()
        inv, sa = F32(QK_MAX) / amax, F32(amax / F32(QK_MAX))
        c = np.clip(np.rint((a[m] * inv).astype(F32)), -QK_MAX, QK_MAX).astype(np.int64)
        D = (u * c).reshape(-1, J, g).sum(axis=2)
        A = c.reshape(J, g).sum(axis=1)
        S = np.zeros(u.shape[0], F32)
        for j in range(J):
            t = (s[:, j] * D[:, j].astype(F32)).astype(F32) + (z[:, j] * F32(A[j])).astype(F32)
            S = (S + t.astype(F32)).astype(F32)
        out[m] = (S * F32(F32(alpha) * sa)).astype(F32)
    return out


def _zero_term(pz):
    """Z of one chunk: eight lane sums in key order, then ((0+4)+(2+6))+((1+5)+(3+7))."""
    pad = np.zeros((-len(pz)) % 8, F32)
    lanes = np.cumsum(np.concatenate([pz, pad]).reshape(-1, 8), axis=0, dtype=F32)[-1]
    a = F32(F32(lanes[0] + lanes[4]) + F32(lanes[2] + lanes[6]))
    b = F32(F32(lanes[1] + lanes[5]) + F32(lanes[3] + lanes[7]))
    return F32(a + b)


def gsv_ref(p, rows, bits, g, N, meta16, beta, c0):
    """sv_gemm_s8_dot's per-group contract for rows of non-negative finite probabilities."""
    u, s, z = _parts(rows, bits, g, N, meta16)
    K, J = u.shape[0], N // g
    out = np.empty((p.shape[0], N), F32)
    for m in range(p.shape[0]):
        r = np.zeros(N, F32) if beta == 0 else (F32(beta) * c0[m]).astype(F32)
        for k0 in range(0, K, SV_KG):
            ks = slice(k0, min(K, k0 + SV_KG))
            for j in range(J):
                cols = slice(j * g, (j + 1) * g)
                w = (p[m, ks] * s[ks, j]).astype(F32)
                wmax = w.max()
                with np.errstate(divide="ignore", over="ignore"):
                    inv = F32(32767) / wmax
                if wmax > 0 and np.isfinite(inv):
                    sp = F32(wmax / F32(32767))
                    pc = np.minimum(32767, np.rint((w * inv).astype(F32))).astype(np.int64)
                else:
                    sp, pc = F32(0), np.zeros(w.shape, np.int64)
                D = pc @ u[ks, cols]
                Z = _zero_term((p[m, ks] * z[ks, j]).astype(F32))
                r[cols] = ((r[cols] + (D.astype(F32) * sp).astype(F32)).astype(F32) + Z).astype(F32)
        out[m] = r
    return out


FORMATS = [(8, 32, False), (8, 64, True), (8, 256, False), (4, 32, False), (4, 32, True), (4, 128, False),
           (2, 32, False), (2, 64, True)]


@pytest.mark.parametrize("bits,g,meta16", FORMATS)
@pytest.mark.parametrize("M,Ncol,K", [(1, 37, 64), (2, 50, 128), (3, 9, 256), (4, 17, 64), (7, 33, 512),
                                      (5, 1, 256), (16, 37, 128), (23, 300, 64), (40, 16, 512)])
def test_group_qk_contract(M, Ncol, K, bits, g, meta16, group_dot_path):
    """Q K^T at level 4 on group rows: bit for bit the contract, and within
    |alpha| (sa (1/2 + 2^-9) sum|x| + 2^-22 sum|a x| + (J + 3) u sa sum_j (|s_j D_j| + |z_j A_j|))
    of float64 over the decoded values x = u s + z."""
    if K % g:
        pytest.skip("the groups must divide the row")
    rng = np.random.default_rng(K * 7 + M + bits)
    a = (rng.standard_normal((M, K)) * np.where(np.arange(K) % 5 == 0, 8, 1)).astype(F32)
    rows = _rows(rng, (Ncol, K), bits, g, meta16)
    kw = dict(bits=bits, group_size=g, metadata="fp16" if meta16 else "fp32", alpha=0.125)
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.qk_gemm(a, rows, **kw)
    assert np.array_equal(got, gqk_ref(a, rows, bits, g, K, meta16, 0.125))
    with gqa.config(path=group_dot_path, accuracy_level=0):
        exact = gqa.qk_gemm(a, rows, **kw)
    assert not np.array_equal(got, exact)   # the integer kernel ran
    u, s, z = _parts(rows, bits, g, K, meta16)
    x = u * np.repeat(s.astype(np.float64), g, axis=1) + np.repeat(z.astype(np.float64), g, axis=1)
    ref = 0.125 * (a.astype(np.float64) @ x.T)
    sa = np.abs(a).max(axis=1, keepdims=True).astype(np.float64) / QK_MAX
    J = K // g
    # |s_j D_j| + |z_j A_j| <= sum over the group of |code| (|u s| + |z|) <= (|a| / sa + 1) (|u s| + |z|)
    mag = np.abs(u * np.repeat(s.astype(np.float64), g, axis=1)) + np.abs(np.repeat(z.astype(np.float64), g, axis=1))
    fin = (np.abs(a.astype(np.float64)) + sa) @ mag.T
    bound = 0.125 * (sa * (0.5 + 2 ** -9) * np.abs(x).sum(axis=1) + 2 ** -22 * (np.abs(a) @ np.abs(x).T)
                     + (J + 3) * U * fin) + 2 * U * np.abs(ref)
    assert (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("bits,g,meta16", FORMATS)
@pytest.mark.parametrize("M,K,Ncol,beta", [(1, 300, 64, 0.0), (2, 513, 128, 0.5), (3, 17, 256, 1.0),
                                           (4, 256, 64, 0.0), (5, 1, 128, 0.0), (2, 1000, 64, 1.0),
                                           (16, 300, 128, 0.5), (23, 513, 64, 1.0), (40, 17, 256, 0.0)])
def test_group_sv_contract(M, K, Ncol, beta, bits, g, meta16, group_dot_path):
    """P @ V at level 4 on group rows: bit for bit the contract (chunks of 256 keys, odd key
    counts, beta), and each chunk's codes within sp (1/2 + 2^-9) sum|u| + 2^-22 sum w|u| (times
    the group's scale) of float64, plus float32 roundings."""
    if Ncol % g:
        pytest.skip("the groups must divide the row")
    rng = np.random.default_rng(K + 3 * M + bits)
    p = (rng.uniform(0, 1, (M, K)) ** 4).astype(F32)
    rows = _rows(rng, (K, Ncol), bits, g, meta16)
    c0 = rng.standard_normal((M, Ncol)).astype(F32)
    kw = dict(bits=bits, group_size=g, metadata="fp16" if meta16 else "fp32", beta=beta, n=Ncol)
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.sv_gemm(p, rows, out=c0.copy(), **kw)
    assert np.array_equal(got, gsv_ref(p, rows, bits, g, Ncol, meta16, beta, c0))
    u, s, z = _parts(rows, bits, g, Ncol, meta16)
    S, Zr = np.repeat(s.astype(np.float64), g, axis=1), np.repeat(z.astype(np.float64), g, axis=1)
    x = u * S + Zr
    p64 = p.astype(np.float64)
    ref = beta * c0.astype(np.float64) + p64 @ x
    bound = np.zeros_like(ref)
    for k0 in range(0, K, SV_KG):
        ks = slice(k0, min(K, k0 + SV_KG))
        w = p64[:, ks, None] * S[None, ks, :]                       # [M, keys, N]
        sp = w.max(axis=1) / 32767
        bound += sp * (0.5 + 2 ** -9) * u[ks].sum(axis=0) + 2 ** -22 * (w * u[None, ks]).sum(axis=1)
    nch = -(-K // SV_KG)
    bound += (2 * nch + SV_KG // 8 + 8) * U * (np.abs(beta * c0) + p64 @ (np.abs(u * S) + np.abs(Zr)))
    assert (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("copies", [1, 5], ids=["few", "packed"])
def test_group_rows_outside_the_contract_are_exact(copies, group_dot_path):
    """Query rows of zeros / NaN / inf, probability rows with a negative, NaN or inf element, and
    groups the contract does not take (16 columns; 512) run the exact kernel; `packed`: the
    same rows among 20 (the avx2 unit's kernels of 16 rows or more)."""
    rng = np.random.default_rng(5)
    with gqa.config(path=group_dot_path):
        exact_path = UNIT_PATH[_dispatch.group_dot_unit()]   # the unit's exact kernels
    rows = _rows(rng, (40, 64), 4, 32, False)
    a = rng.standard_normal((5, 64)).astype(F32)
    a[1], a[2, 3], a[3, 4] = 0.0, np.nan, np.inf
    a = np.tile(a, (copies, 1))
    odd, fine = np.arange(5 * copies) % 5 % 4 != 0, np.arange(5 * copies) % 5 % 4 == 0
    kw = dict(bits=4, group_size=32)
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.qk_gemm(a, rows, **kw)
    with gqa.config(path=exact_path, accuracy_level=0):
        exact = gqa.qk_gemm(a, rows, **kw)
    assert np.array_equal(got[odd], exact[odd], equal_nan=True)
    assert np.array_equal(got[fine], gqk_ref(a[fine], rows, 4, 32, 64, False, 1.0))
    p = rng.uniform(0, 1, (4, 40)).astype(F32)
    p[1, 2], p[2, 5], p[3] = -0.5, np.nan, 0.0
    p = np.tile(p, (copies, 1))
    fine = np.arange(4 * copies) % 4 == 0
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.sv_gemm(p, rows, n=64, **kw)
    with gqa.config(path=exact_path, accuracy_level=0):
        exact = gqa.sv_gemm(p, rows, n=64, **kw)
    assert np.array_equal(got[~fine], exact[~fine], equal_nan=True)
    assert np.array_equal(got[fine], gsv_ref(p[fine], rows, 4, 32, 64, False, 0.0, None))
    for bits, g, h in ((4, 16, 64), (2, 512, 512)):
        rows = _rows(rng, (40, h), bits, g, False)
        a = rng.standard_normal((3, h)).astype(F32)
        outs = []
        for level in (4, 0):
            with gqa.config(path=group_dot_path, accuracy_level=level):
                outs.append((gqa.qk_gemm(a, rows, bits=bits, group_size=g),
                             gqa.sv_gemm(p[:1], rows, bits=bits, group_size=g, n=h)))
        assert all(np.array_equal(x, y) for x, y in zip(*outs))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_group_dots_any_shape(group_dot_path, data):
    """Both per-group contracts bit for bit at drawn shapes, formats and betas."""
    bits = data.draw(st.sampled_from([8, 4, 2]), label="bits")
    g = data.draw(st.sampled_from([32, 64, 128, 256]), label="g")
    meta16 = data.draw(st.booleans(), label="meta16")
    J = data.draw(st.integers(1, 512 // g), label="J")
    H = g * J
    M, N, K = (data.draw(st.integers(1, 40), label="M"), data.draw(st.integers(1, 70), label="N"),
               data.draw(st.integers(1, 700), label="K"))
    beta = data.draw(st.sampled_from([0.0, 0.5, 1.0]), label="beta")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    kw = dict(bits=bits, group_size=g, metadata="fp16" if meta16 else "fp32")
    rows = _rows(rng, (N, H), bits, g, meta16, spread=rng.uniform(0.01, 10))
    x = (rng.standard_normal((M, H)) * rng.uniform(0.1, 10)).astype(F32)
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.qk_gemm(x, rows, alpha=0.3, **kw)
    assert np.array_equal(got, gqk_ref(x, rows, bits, g, H, meta16, 0.3))
    vrows = _rows(rng, (K, H), bits, g, meta16)
    p = (rng.uniform(0, 1, (M, K + 2)).astype(F32) ** 3)[:, :K]     # a view: the API's copy
    c0 = rng.standard_normal((M, H)).astype(F32)
    with gqa.config(path=group_dot_path, accuracy_level=4):
        got = gqa.sv_gemm(p, vrows, beta=beta, out=c0.copy(), n=H, **kw)
    assert np.array_equal(got, gsv_ref(p, vrows, bits, g, H, meta16, beta, c0))


N, NKV, H = 6, 2, 64
G = N // NKV


def _decoded(rows, bits, g, meta16):
    """codes u, values u s + z, |u s| + |z| and the scales s (float64, [rows, H]) of group rows."""
    u, s, z = _parts(rows, bits, g, H, meta16)
    S, Z = np.repeat(s.astype(np.float64), g, axis=1), np.repeat(z.astype(np.float64), g, axis=1)
    return u, u * S + Z, np.abs(u * S) + np.abs(Z), S


def _head_bound(at, K, V, J, mid=2 ** -22, grow=1.0):
    """float64's output of one head over keys K and values V (_decoded's) for the query row at =
    alpha q, and the bound on a level-4 output against it: with E_j the QK contract's bound on
    score j (sa = grow max|at| / QK_MAX, its 2^-22 term `mid`), the output moves by at most
    max|v| (e^{2E} - 1) from the scores, plus P @ V's codes over the row's total l: any chunks of
    keys give at most max_k w_k / 32767 (1/2 + 2^-9) sum|u| + 2^-22 sum w|u| with w the
    probabilities (at most 1, within e^{2E} of p) times V's scales; plus float32 roundings."""
    ku, Kx, kmag, _ = K
    sa = np.abs(at).max() * grow / QK_MAX
    E = (sa * (0.5 + 2 ** -9) * np.abs(Kx).sum(axis=1) + mid * np.abs(Kx) @ np.abs(at)
         + (J + 3) * U * (kmag @ (np.abs(at) * grow + sa)))
    return _out_bound(Kx @ at, E.max(), V)


def _out_bound(sc, E, V, softcap=0.0):
    """float64's output of one head over scores sc (softcapped) and values V (_decoded's), and
    the bound on a level-4 output against it when every score is within E: the output moves by at
    most max|v| (e^{2E} - 1) from the scores (softcap is 1-Lipschitz), plus P @ V's per-group
    codes over the row's total l: any chunks of keys give at most max_k w_k / 32767 (1/2 + 2^-9)
    sum|u| + 2^-22 sum w|u| with w the probabilities (at most 1, within e^{2E} of p) times V's
    scales; plus float32 roundings."""
    vu, Vx, _, VS = V
    if softcap:
        sc = softcap * np.tanh(sc / softcap)
    p = np.exp(sc - sc.max())
    ref = p @ Vx / p.sum()
    w = np.minimum(1.0, p * np.exp(2 * E))[:, None] * VS
    pv = w.max(axis=0) / 32767 * (0.5 + 2 ** -9) * vu.sum(axis=0) + 2 ** -22 * (w * vu).sum(axis=0)
    bound = np.abs(Vx).max() * np.expm1(2 * E) + pv / p.sum() + 1e-5 * (np.abs(ref) + np.abs(Vx).max())
    return ref, bound


def _mode_parts(mode):
    return int(mode[3]), int(mode.split("-g")[1].split("-")[0]), mode.endswith("fp16")


@pytest.mark.parametrize("mode", ["int8-g32", "int4-g32", "int4-g64-fp16", "int2-g32"])
@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_level_4_group_attention_within_its_bound(mode, flash, group_dot_path):
    """One decode step over a per-group cache at level 4 against float64 over the same codes,
    within _head_bound."""
    rng = np.random.default_rng(6)
    T = 600
    bits, g, meta16 = _mode_parts(mode)
    x = lambda n: rng.uniform(-1, 1, (1, n, NKV * H)).astype(F32)  # noqa: E731
    prompt = (rng.uniform(-1, 1, (1, T - 1, N * H)).astype(F32), x(T - 1), x(T - 1))
    q, k, v = rng.uniform(-2, 2, (1, 1, N * H)).astype(F32), x(1), x(1)
    outs = {}
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=T, mode=mode,
                        accuracy_level=level)
        with gqa.config(path=group_dot_path, flash=flash):
            c.attend(0, *prompt)
            outs[level] = c.attend(0, q, k, v)
        cache = c
    assert not np.array_equal(outs[0], outs[4])
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(N, H).astype(np.float64)
    for j in range(NKV):
        K = _decoded(cache.key[0][0, j, :T], bits, g, meta16)
        V = _decoded(cache.value[0][0, j, :T], bits, g, meta16)
        for h in range(j * G, (j + 1) * G):
            ref, bound = _head_bound(alpha * qh[h], K, V, H // g)
            err = np.abs(outs[4][0, 0, h * H:(h + 1) * H] - ref)
            assert (err <= bound).all(), (h, err.max(), bound.min())


@pytest.mark.parametrize("mode", ["int8-g32", "int4-g32", "int4-g64-fp16", "int2-g32", "int4-g32+s4r16"])
@pytest.mark.parametrize("blocks", [(8, 16), (16, 64), None], ids=["8x16", "16x64", "plan"])
def test_avx2_group_prompt_on_the_codes_within_its_bound(mode, blocks, group_dot_path):
    """On the avx2 path (its avx2 and avxvnni units) a prompt's float32 flash tiles at level 4
    take both GEMMs on per-group codes (the packed kernels of kernels_avx2_gdot.c: the per-group
    contracts over a tile's rows; with causal float windows the tiles every row reads as
    codes): against float64 over the same codes (and the windows' floats) every output within
    _head_bound, the query row as the tile holds it, fl(alpha q) (one more rounding: 2^-21 and
    sa (1 + 2^-20)); level 0 (float32 tiles) within the same bound.  A V tile whose scales reach
    1e30 (here inf, at a key every row but the last masks) keeps float32 P @ V (attend_tiled's
    pv_codes), so the masked key adds nothing to the other rows."""
    if group_dot_path != "avx2":
        pytest.skip("the packed kernels of a prompt's tiles are the avx2 path's")
    rng = np.random.default_rng(17)
    S = 160
    base, _, win = mode.partition("+")
    bits, g, meta16 = _mode_parts(base)
    ns, nr = (4, 16) if win else (0, 0)
    q = rng.uniform(-2, 2, (1, S, N * H)).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    outs = {}
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S, mode=mode,
                        accuracy_level=level)
        with gqa.config(path=group_dot_path, flash=True, flash_blocks=blocks):
            outs[level] = c.attend(0, q, k, v)
    assert not np.array_equal(outs[0], outs[4])      # the integer kernels ran
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(S, N, H).astype(np.float64)
    for j in range(NKV):
        K = _decoded(c.key[0][0, j, :S], bits, g, meta16)
        V = _decoded(c.value[0][0, j, :S], bits, g, meta16)
        kf, vf = (x[0, :, j * H:(j + 1) * H].astype(np.float64) for x in (k, v))
        for s in range(S):
            # row s reads keys [0, ns) and [s + 1 - nr, s] as floats, no code error there
            fl = np.zeros(s + 1, bool)
            fl[:ns] = fl[max(0, s + 1 - nr):] = win != ""
            Ks = [x[:s + 1].copy() for x in K]
            Vs = [x[:s + 1].copy() for x in V]
            Ks[1][fl], Ks[2][fl] = kf[:s + 1][fl], np.abs(kf[:s + 1][fl])
            Vs[0][fl], Vs[1][fl], Vs[3][fl] = 0, vf[:s + 1][fl], 0
            for h in range(j * G, (j + 1) * G):
                ref, bound = _head_bound(alpha * qh[s, h], Ks, Vs, H // g, mid=2 ** -21, grow=1 + 2 ** -20)
                for level in (0, 4):
                    err = np.abs(outs[level][0, s, h * H:(h + 1) * H] - ref)
                    assert (err <= bound).all(), (level, h, s, err.max(), bound.min())
    v[0, S - 1 - nr, :H] = np.inf      # a code of the last row, masked by the rows before it
    c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S, mode=mode,
                    accuracy_level=4)
    with gqa.config(path=group_dot_path, flash=True, flash_blocks=blocks):
        out = c.attend(0, q, k, v)
    assert np.isfinite(out[0, :S - 1 - nr]).all()
    assert np.array_equal(out[0, :, G * H:], outs[4][0, :, G * H:])   # KV head 1: as before


def _channel_codes(x):
    """attend_tiled's code_rows on a float32 tile x [n, H] (K): each channel's range over the
    tile in 255 steps, s = fl(hi - lo) / 255 (1 unless > 0), z = fl(lo + 128 s), codes
    clamp(rint(fl(x - z) fl(1 / s)), -128, 127) (float64), s and z."""
    lo, hi = x.min(axis=0), x.max(axis=0)
    s = (hi - lo).astype(F32) / F32(255)
    s = np.where(s > 0, s, F32(1)).astype(F32)
    z = (lo + (F32(128) * s).astype(F32)).astype(F32)
    codes = np.clip(np.rint(((x - z).astype(F32) * (F32(1) / s)).astype(F32)), -128, 127)
    return codes.astype(np.float64), s.astype(np.float64), z.astype(np.float64)


@pytest.mark.parametrize("softcap", [0.0, 6.0], ids=["plain", "softcap"])
@pytest.mark.parametrize("blocks", [(8, 32), (16, 64), None], ids=["8x32", "16x64", "plan"])
def test_avx2_float_prompt_on_tile_codes_within_its_bound(blocks, softcap, group_dot_path):
    """Level 4 on a float32 cache's prompt on the avx2 path: each key tile of Bc keys (the last
    ends where the last query row's keys do, for every query block and thread) as INT8 codes per
    channel with a zero per channel (K, _channel_codes) and as INT8 rows of one group (V, the
    per-group codec, group_quantize_ref), read by the packed kernels; each score takes
    fl(alpha q) . z.
    Against float64 over those codes every output within _out_bound, with E the per-channel QK
    contract's bound (sa = max|a'| / 32639 of the scaled row a' = alpha q s per tile) plus the
    zero term's float32 dot; softcap catches a wrong zero term (plain softmax would not).  The
    same outputs on 1 and 2 threads; a tile whose K holds an inf keeps float32 scores, so rows that
    mask that key stay finite and the other KV head is unchanged."""
    if group_dot_path != "avx2":
        pytest.skip("the packed kernels of a prompt's tiles are the avx2 path's")
    with gqa.config(path=group_dot_path):
        types = _dispatch.float_tile_types_at(4, H)
    if types[0] < 0:
        pytest.skip("level 4 keeps a float32 cache's prompt tiles in float32 here")
    assert types == (_dispatch.TYPE_CODES["GQA_S8_PC"], _dispatch.group_type(_dispatch.TYPE_CODES["GQA_G8"], H, False))
    rng = np.random.default_rng(23)
    S = 200
    Bc = blocks[1] if blocks else 256
    q = rng.uniform(-2, 2, (1, S, N * H)).astype(F32)
    k, v = (rng.normal(0, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    k[0, :, ::7] += 4.0            # channels off zero: the zeros carry them
    k[0, 11] *= 6.0                # a key whose channels reach far

    def run(k, threads, level=4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S, mode="float",
                        accuracy_level=level, softcap=softcap)
        with gqa.config(path=group_dot_path, flash=True, flash_blocks=blocks, num_threads=threads):
            return c.attend(0, q, k, v)
    out = run(k, 2)
    assert np.array_equal(out, run(k, 1))
    assert not np.array_equal(out, run(k, 2, level=0))
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(S, N, H).astype(np.float64)
    for j in range(NKV):
        kf = k[0, :, j * H:(j + 1) * H]
        parts = [_channel_codes(kf[t0:t0 + Bc]) for t0 in range(0, S, Bc)]
        codes = np.concatenate([c for c, _, _ in parts])
        Kx = np.concatenate([c * s + z for c, s, z in parts])
        tile = np.arange(S) // Bc
        V = _decoded(group_quantize_ref(v[0, :, j * H:(j + 1) * H], 8, H), 8, H, False)
        for s in range(S):
            n = s + 1
            for h in range(j * G, (j + 1) * G):
                at = alpha * qh[s, h]
                E = np.zeros(n)
                for t, (_, ts, tz) in enumerate(parts):
                    keys = tile[:n] == t
                    if not keys.any():
                        continue
                    ap = np.abs(at * ts)            # the scaled row a' of tile t
                    sa = ap.max() * (1 + 2 ** -20) / QK_MAX
                    E[keys] = (sa * (0.5 + 2 ** -9) * np.abs(codes[:n][keys]).sum(axis=1)
                               + (H + 4) * U * (np.abs(codes[:n][keys]) @ ap + np.abs(at) @ np.abs(tz))
                               + 2 ** -21 * np.abs(Kx[:n][keys]) @ np.abs(at))
                E_max = E.max() + (2 ** -20 * softcap if softcap else 0.0)
                ref, bound = _out_bound(Kx[:n] @ at, E_max, tuple(x[:n] for x in V), softcap)
                err = np.abs(out[0, s, h * H:(h + 1) * H] - ref)
                assert (err <= bound).all(), (h, s, err.max(), bound.min())
    k[0, S - 1, 3] = np.inf        # K of the last key: every row but the last masks it
    out2 = run(k, 2)
    assert np.isfinite(out2[0, :S - 1]).all()
    assert np.array_equal(out2[0, :, G * H:], out[0, :, G * H:])      # KV head 1: as before
