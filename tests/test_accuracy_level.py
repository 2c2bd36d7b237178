"""accuracy_level (onnxruntime's convention: 0 unset, 1 float32, 2 float16, 3 bfloat16, 4 int8):
how a level is chosen (the attribute, else gqa.config / GQA_ACCURACY_LEVEL), that only level 4
on INT8 codes leaves the exact float32 contract, and level 4's integer-dot kernels (AVX2,
AVX-VNNI, AVX-512 VNNI, NEON's sdot, and AMX INT8 tiles where the CPU has them; 15-bit query rows and probabilities)
against NumPy statements of their contracts (kernels_s8dot_contract.h), bit for bit, and
the attention output against float64 within the bound those contracts give.  The emulated
paths (tests/isa: avx512vnni-emulated, avxvnni-emulated, neon-dot-qemu) check the same contracts on
other CPUs."""
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gqa
from gqa import _dispatch
from _reference import pack_int4, unpack_int4

F32 = np.float32
U = 2.0 ** -24
QK_MAX = 32639      # the query codes' limit, 127 * 257 (kernels_s8dot.h)
N, NKV, H = 6, 2, 64
G = N // NKV

# level 4's INT8 dot units: the settings under which each runs (the same contracts, the same bits)
DOT_UNITS = {"avx2": dict(path="avx2"), "avxvnni": dict(path="avx2"), "avx512vnni": dict(path="avx512", tiles=False),
             "amx": dict(path="avx512", tiles="amx"), "neon": dict(path="neon")}


def _unit_settings(unit):
    """DOT_UNITS[unit], or a skip naming what this CPU (or build) lacks."""
    if unit in ("avx2", "avxvnni", "neon"):
        path = DOT_UNITS[unit]["path"]
        if not _dispatch.path_runnable(path):
            pytest.skip(f"this CPU (or build) cannot run the {path} path")
        with gqa.config(path=path):
            there = _dispatch.int8_dot_unit()
        if unit != "neon" and there != unit:   # the avx2 path runs avxvnni where the CPU has AVX-VNNI
            pytest.skip(f"the avx2 path runs level 4 on {there} here, not {unit}"
                        + ("; tests/isa/test_isa.py[avxvnni-emulated] checks its contracts" if unit == "avxvnni"
                           else "; tests/isa/test_isa.py[avx2-dot-native] checks its contracts"))
        if unit == "neon" and not _dispatch.dot_runnable("neon"):
            pytest.skip("this CPU has no dot product (FEAT_DotProd), or the build has no sdot unit;"
                        " tests/isa/test_isa.py[neon-dot-qemu] checks its contracts under qemu")
    elif not _dispatch.approx_vnni_runnable():
        pytest.skip("this CPU (or build) cannot run the AVX-512 VNNI kernels; tests/isa/test_isa.py"
                    "[avx512vnni-emulated] checks their contracts under emulation")
    if unit == "amx" and not _dispatch.tiles_runnable("amx"):
        pytest.skip("this CPU (or its OS, or the build) runs no AMX tiles (a GQA_EMULATE_AMX=1 build runs "
                    "them emulated: tests/hardening/test_sanitizers.py)")
    settings = DOT_UNITS[unit]
    with gqa.config(**settings):
        assert _dispatch.int8_dot_unit() == unit
    return settings


@pytest.fixture(params=list(DOT_UNITS))
def dot_unit(request):
    """The settings under which level 4's INT8 dots run on one unit."""
    return _unit_settings(request.param)


@pytest.fixture(params=["avx2", "avxvnni", "avx512vnni", "neon"])
def vector_dot_unit(request):
    """A unit of vector registers (the AMX tiles' prompts: tests/test_tiles.py)."""
    return _unit_settings(request.param)


def test_levels_are_checked():
    base = dict(num_heads=N, kv_num_heads=NKV)
    for bad in (5, -1):
        with pytest.raises(ValueError, match="accuracy_level must be 0 or 1 or 2 or 3 or 4"):
            gqa.GroupQueryAttention(accuracy_level=bad, **base)
    for bad in (4.0, "4", True):
        with pytest.raises(TypeError, match="accuracy_level must be an int"):
            gqa.GroupQueryAttention(accuracy_level=bad, **base)
    with pytest.raises(ValueError, match="accuracy_level must be 0, 1, 2, 3 or 4"):
        gqa.config(accuracy_level=7)
    with pytest.raises(TypeError, match="accuracy_level must be an int"):
        gqa.config(accuracy_level=4.0)
    with pytest.raises(ValueError, match="accuracy_level must be 0 or 1 or 2 or 3 or 4"):
        gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=8,
                    accuracy_level=9)
    assert gqa.GroupQueryAttention(accuracy_level=4, **base).accuracy_level == 4
    with gqa.config(accuracy_level=4):
        assert gqa.get_config()["accuracy_level"] == 4
    assert gqa.get_config()["accuracy_level"] == 0


def _sv_ref(a, q, s, beta, c0, chunk=512):
    """sv_gemm_s8_dot's contract for rows of finite values >= 0 with a maximum > 0."""
    M, K = a.shape
    out = np.empty((M, q.shape[1]), F32)
    for m in range(M):
        pmax = a[m].max()
        inv, sp = F32(32767) / pmax, F32(pmax / F32(32767))
        code = np.minimum(32767, np.rint((a[m] * inv).astype(F32))).astype(np.int64)
        mult = (sp * s).astype(F32)
        r = np.zeros(q.shape[1], F32) if beta == 0 else (F32(beta) * c0[m]).astype(F32)
        for k0 in range(0, K, chunk):
            d = code[k0:k0 + chunk] @ q[k0:k0 + chunk].astype(np.int64)
            r = (r + (d.astype(F32) * mult).astype(F32)).astype(F32)
        out[m] = r
    return out


def _static_codes(rng, bits, shape):
    """Random static codes of `bits` (logical int8 values) and the array the kernels take."""
    if bits == 8:
        q = rng.integers(-128, 128, shape).astype(np.int8)
        return q, q
    q = rng.integers(-8, 8, shape).astype(np.int8)
    return q, pack_int4(q)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("M,K,Ncol,pc,beta", [(3, 8192, 64, False, 0.0), (4, 100, 64, True, 1.0),
                                              (5, 9001, 96, False, 0.5), (1, 7, 13, True, 0.0),
                                              (8, 20000, 130, True, 1.0), (2, 513, 40, False, 0.0),
                                              (23, 1100, 130, True, 0.5), (16, 256, 16, False, 1.0),
                                              (40, 77, 72, False, 0.0)])
def test_int8_sv_contract(M, K, Ncol, pc, beta, bits, dot_unit):
    """P @ V at level 4: probabilities quantized to 15 bits against their row's maximum,
    integer dots per 512-key chunk, bit for bit (INT8 and INT4 codes, per tensor and per
    channel, beta 0 / 0.5 / 1)."""
    rng = np.random.default_rng(K)
    a = (rng.uniform(0, 1, (M, K)) * rng.uniform(0, 1, (M, K))).astype(F32)
    a[0, ::7] = 0.0
    q, qk = _static_codes(rng, bits, (K, Ncol))
    s = rng.uniform(0.01, 0.02, Ncol if pc else 1).astype(F32)
    c0 = rng.standard_normal((M, Ncol)).astype(F32)
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.sv_gemm(a, qk, s, bits=bits, beta=beta, out=c0.copy(), n=Ncol)
    assert np.array_equal(got, _sv_ref(a, q, s if pc else s[0], beta, c0))
    with gqa.config(path=dot_unit["path"], accuracy_level=0):
        exact = gqa.sv_gemm(a, qk, s, bits=bits, beta=beta, out=c0.copy(), n=Ncol)
    assert not np.array_equal(got, exact)      # the integer kernel ran
    # the stated bound: sp (1/2 + 2^-9) sum|deq q| + 2^-22 sum a|deq q| (+ float32 roundings)
    dq = np.abs(q.astype(np.float64)) * s.astype(np.float64)
    sp = a.max(axis=1, keepdims=True).astype(np.float64) / 32767
    aq = a.astype(np.float64) @ dq
    bound = (sp * (0.5 + 2 ** -9) * dq.sum(axis=0) + aq * 2 ** -22
             + (K // 512 + K + 8) * U * (aq + np.abs(exact)))
    assert (np.abs(got.astype(np.float64) - exact) <= bound).all()


def test_int8_sv_rows_outside_the_contract_are_exact(dot_unit):
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 1, (5, 37)).astype(F32)
    a[0, 3], a[1, 4], a[2, 5], a[3] = -0.25, np.nan, np.inf, 0.0
    q = rng.integers(-128, 128, (37, 20)).astype(np.int8)
    s = np.array([0.03], F32)
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.sv_gemm(a, q, s, bits=8)
    with gqa.config(path=dot_unit["path"], accuracy_level=0):
        exact = gqa.sv_gemm(a, q, s, bits=8)
    assert np.array_equal(got[:4], exact[:4], equal_nan=True)
    assert np.array_equal(got[4], _sv_ref(a[4:], q, s[0], 0.0, None)[0])


def _qk_ref(a, b, s, pc, alpha):
    """qk_gemm_s8_dot's contract for rows whose (scaled) maximum is finite and > 0."""
    out = np.empty((a.shape[0], b.shape[0]), F32)
    for m in range(a.shape[0]):
        x = (a[m] * s).astype(F32) if pc else a[m]
        amax = np.abs(x).max()
        inv, sa = F32(QK_MAX) / amax, F32(amax / F32(QK_MAX))
        c = np.clip(np.rint((x * inv).astype(F32)), -QK_MAX, QK_MAX).astype(np.int64)
        mult = F32(F32(alpha) * sa) if pc else F32(F32(F32(alpha) * sa) * s[0])
        out[m] = ((b.astype(np.int64) @ c).astype(F32) * mult).astype(F32)
    return out


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("M,Ncol,K,pc", [(3, 50, 64, True), (8, 33, 64, False), (1, 7, 100, True),
                                         (5, 130, 128, False), (9, 17, 512, True), (2, 3, 1, False),
                                         (4, 48, 320, False), (16, 31, 256, True), (3, 9, 33, True),
                                         (1, 33, 256, False), (1, 40, 200, True), (1, 21, 257, True),
                                         (1, 19, 512, False), (23, 37, 80, False), (40, 300, 128, True),
                                         (17, 16, 512, True), (100, 5, 64, False)])
def test_int8_qk_contract(M, Ncol, K, pc, bits, dot_unit):
    """Q K^T at level 4: query rows (times the per-channel scales) quantized to 15 bits
    against their absolute maximum, exact integer dots, bit for bit (INT8 and INT4 codes);
    within the bound |alpha| (sa / 2 sum|q s'| + 2^-22 sum|a' q s'|) of the exact kernel."""
    rng = np.random.default_rng(K + M)
    a = (rng.standard_normal((M, K)) * np.where(np.arange(K) % 7 == 0, 30, 1)).astype(F32)
    b, bk = _static_codes(rng, bits, (Ncol, K))
    s = rng.uniform(0.01, 0.02, K if pc else 1).astype(F32)
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.qk_gemm(a, bk, s, bits=bits, alpha=0.125)
    assert np.array_equal(got, _qk_ref(a, b, s, pc, 0.125))
    with gqa.config(path=dot_unit["path"], accuracy_level=0):
        exact = gqa.qk_gemm(a, bk, s, bits=bits, alpha=0.125)
    x = a.astype(np.float64) * (s if pc else 1.0)
    sq = np.abs(b).astype(np.float64) * (1.0 if pc else float(s[0]))
    sa = np.abs(x).max(axis=1, keepdims=True) / QK_MAX
    aq = np.abs(x) @ sq.T
    bound = 0.125 * (sa / 2 * sq.sum(axis=1) + aq * (2 ** -22 + (K + 4) * U)) + 4 * U * np.abs(got)
    assert (np.abs(got.astype(np.float64) - exact) <= bound).all()
    if K > 1:
        assert not np.array_equal(got, exact)      # the integer kernel ran


def test_int8_qk_rows_outside_the_contract_are_exact(dot_unit):
    """Rows of zeros, NaN or inf, and heads wider than 512, take the exact kernel."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, H)).astype(F32)
    a[1], a[2, 3], a[3, 4] = 0.0, np.nan, np.inf
    b = rng.integers(-128, 128, (50, H)).astype(np.int8)
    s = rng.uniform(0.01, 0.02, H).astype(F32)
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.qk_gemm(a, b, s, bits=8, alpha=0.125)
    with gqa.config(path=dot_unit["path"], accuracy_level=0):
        exact = gqa.qk_gemm(a, b, s, bits=8, alpha=0.125)
    assert np.array_equal(got[1:4], exact[1:4], equal_nan=True)
    assert np.array_equal(got[[0, 4]], _qk_ref(a[[0, 4]], b, s, True, 0.125))
    a2, b2, s2 = (rng.standard_normal((2, 1040)).astype(F32), rng.integers(-128, 128, (3, 1040)).astype(np.int8),
                  rng.uniform(0.01, 0.02, 1040).astype(F32))
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.qk_gemm(a2, b2, s2, bits=8)
    with gqa.config(path=dot_unit["path"], accuracy_level=0):
        assert np.array_equal(got, gqa.qk_gemm(a2, b2, s2, bits=8))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_int8_dots_any_shape(dot_unit, data):
    """Both contracts bit for bit at drawn shapes: widths past every block and tail edge, key
    counts across the 512-key chunks, per tensor and per channel (a view of the probability
    rows: the API's copy), row counts of the decode blocks and of the packed kernels (16 or more
    rows on avx2, kernels_avx2_pack.h)."""
    M = data.draw(st.sampled_from([1, 2, 3, 4, 5, 8, 9, 16, 17, 29, 40]), label="M")
    N, pc = data.draw(st.integers(1, 140), label="N"), data.draw(st.booleans(), label="pc")
    bits = data.draw(st.sampled_from([8, 4]), label="bits")
    K = data.draw(st.integers(1, 1100), label="K")
    H = data.draw(st.integers(1, 96), label="H")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    # (one scale is a per-tensor scale: per channel needs two columns or more)
    # P @ V: rows of probabilities (many small), a view with a row stride past K
    a = (rng.uniform(0, 1, (M, K + 3)).astype(F32) ** 3)[:, :K]
    q, qk = _static_codes(rng, bits, (K, N))
    s = rng.uniform(0.01, 0.02, N if pc else 1).astype(F32)
    pc_sv, pc = pc and N > 1, pc and H > 1
    c0 = rng.standard_normal((M, N)).astype(F32)
    beta = data.draw(st.sampled_from([0.0, 0.5, 1.0]), label="beta")
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.sv_gemm(a, qk, s, bits=bits, beta=beta, out=c0.copy(), n=N)
    assert np.array_equal(got, _sv_ref(a, q, s if pc_sv else s[0], beta, c0))
    # Q K^T: H-wide query rows against N keys
    x = (rng.standard_normal((M, H)) * rng.uniform(0.1, 10)).astype(F32)
    b, bk = _static_codes(rng, bits, (N, H))
    ks = rng.uniform(0.01, 0.02, H if pc else 1).astype(F32)
    with gqa.config(accuracy_level=4, **dot_unit):
        got = gqa.qk_gemm(x, bk, ks, bits=bits, alpha=0.3)
    assert np.array_equal(got, _qk_ref(x, b, ks, pc, 0.3))


def _decode_case(mode, rng, T=300):
    """A KVCache of `mode` holding a T - 1 token prompt; (cache, q, k, v) of one decode step."""
    kw = {}
    f = gqa.parse_mode(gqa.cache_options(mode)["mode"])[0]
    if f.static:
        kw = dict(k_scales=np.full(NKV * H if f.per_channel else 1, 0.02, F32),
                  v_scales=np.full(NKV * H if f.per_channel else 1, 0.02, F32))
    x = lambda n: rng.uniform(-1, 1, (1, n, NKV * H)).astype(F32)  # noqa: E731
    caches = []
    prompt = (rng.uniform(-1, 1, (1, T - 1, N * H)).astype(F32), x(T - 1), x(T - 1))
    step = (rng.uniform(-2, 2, (1, 1, N * H)).astype(F32), x(1), x(1))
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=T,
                        mode=mode, accuracy_level=level, **kw)
        c.attend(0, *prompt)
        caches.append(c)
    return caches, step


@pytest.mark.parametrize("mode", ["float", "int4-g16", "int8-g16+s2r4"])
def test_level_4_leaves_other_formats_exact(kernel_path, mode):
    """Formats without an integer-dot contract (float; groups of other than a multiple of 32
    columns) compute in float32 at every level without tiles (float rows on the tiles' bfloat16
    decode kernels: tests/test_tiles.py)."""
    rng = np.random.default_rng(3)
    (c0, c4), step = _decode_case(mode, rng)
    with gqa.config(path=kernel_path, tiles=False):
        assert np.array_equal(c0.attend(0, *step), c4.attend(0, *step))


@pytest.mark.parametrize("mode", ["int8-pt", "int8-pc", "int4-pt", "int4-pc"])
@pytest.mark.parametrize("flash", [False, True], ids=["naive", "flash"])
def test_level_4_attention_within_its_bound(mode, flash, dot_unit):
    """One decode step over an INT8 cache at level 4 against float64 over the same codes.
    With E_j the QK kernel's bound on score j (its per-tensor bound on the rows times the
    scales) and the probabilities quantized against their maximum 1 (15 bits), the output of
    a head moves by at most  max|v| (e^{2E} - 1)  from the scores and
    (1/2 + 2^-9) / 32767 * sum_j |v_j| * m_c / l  from P @ V (m_c: the largest probability of
    a key chunk, 1 on the naive path; l: the row's total), plus float32 roundings."""
    rng = np.random.default_rng(4)
    (c0, c4), (q, k, v) = _decode_case(mode, rng)
    with gqa.config(flash=flash, **dot_unit):
        exact = c0.attend(0, q, k, v)
        got = c4.attend(0, q, k, v)
    assert not np.array_equal(got, exact)
    ks, kq, K, V = _values(c0)
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(N, H).astype(np.float64)
    for h in range(N):
        j = h // G
        a = qh[h] * (ks.reshape(NKV, H)[j] if ks.size > 1 else 1.0)
        sa = np.abs(a.astype(F32)).max() / QK_MAX
        sq = np.abs(kq[j]).sum(axis=1) * (1.0 if ks.size > 1 else ks[0])
        E = alpha * (sa * 0.5 * sq + 2 ** -22 * np.abs(kq[j] * a).sum(axis=1)
                     * (1.0 if ks.size > 1 else ks[0]))
        sc = alpha * (K[j] @ qh[h])
        p = np.exp(sc - sc.max())
        ref = p @ V[j] / p.sum()
        bound = (np.abs(V[j]).max() * np.expm1(2 * E.max())
                 + (0.5 + 2 ** -9) / 32767 * np.abs(V[j]).sum(axis=0) / p.sum()
                 + 1e-5 * (np.abs(ref) + np.abs(V[j]).max()))
        err = np.abs(got[0, 0, h * H:(h + 1) * H] - ref)
        assert (err <= bound).all(), (h, err.max(), bound.min())
        assert np.abs(exact[0, 0, h * H:(h + 1) * H] - ref).max() <= 1e-5 * (np.abs(V[j]).max() + 1)


@pytest.mark.parametrize("mode", ["int8-pt", "int8-pc", "int4-pc", "int8-pc+s2r7"])
def test_level_4_step_within_its_bound(mode, vector_dot_unit):
    """A step of 3 new tokens (9 rows per KV head: the decode kernels, tests/test_direct.py) at
    level 4: each row's scores as a decode step's, its probabilities quantized per key block
    against the running maximum (<= 1) and later rescaled by factors <= 1, so against float64
    over the same codes a head's output moves by at most  max|v| (e^{2E} - 1) + (1/2 + 2^-9) /
    32767 * sum_j |v_j| / l  over its keys (E as in test_level_4_attention_within_its_bound),
    plus float32 roundings.  With float windows (+s2r7) a row reads its windows' positions as
    the floats (float32 products) and the rest as codes: the same bound, taken over every key's
    codes, holds against float64 over the values it reads."""
    rng = np.random.default_rng(9)
    S, T = 3, 900
    f = gqa.parse_mode(gqa.cache_options(mode)["mode"])[0]
    n = NKV * H if f.per_channel else 1
    kw = dict(k_scales=np.full(n, 0.02, F32), v_scales=rng.uniform(0.01, 0.03, n).astype(F32))
    x = lambda m, w, r=1.0: rng.uniform(-r, r, (1, m, w)).astype(F32)  # noqa: E731
    prompt = (x(T - S, N * H), x(T - S, NKV * H), x(T - S, NKV * H))
    q, k, v = x(S, N * H, 2.0), x(S, NKV * H), x(S, NKV * H)
    outs = {}
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=T,
                        mode=mode, accuracy_level=level, **kw)
        c.attend(0, *prompt)
        with gqa.config(**dict(vector_dot_unit, tiles=False, flash=True)):
            outs[level] = c.attend(0, q, k, v)
    assert not np.array_equal(outs[0], outs[4])
    ks, kq, K, V = _values(c)
    kpc = ks.size > 1
    # the rows the float windows hold: [Nkv, T, H]
    Kf, Vf = (np.concatenate([prompt[i], (k, v)[i - 1]], 1)[0].reshape(T, NKV, H)
              .transpose(1, 0, 2).astype(np.float64) for i in (1, 2))
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(S, N, H).astype(np.float64)
    for s in range(S):
        m = T - S + s + 1
        Kr, Vr = K, V
        if c.sink_size + c.recent_size:     # row s reads its windows' positions as floats
            ns = min(c.sink_size, m)
            flo = np.zeros((1, T, 1), bool)
            flo[:, :ns] = flo[:, m - min(c.recent_size, m - ns):m] = True
            Kr, Vr = np.where(flo, Kf, K), np.where(flo, Vf, V)
        for h in range(N):
            j = h // G
            a = qh[s, h] * (ks.reshape(NKV, H)[j] if kpc else 1.0)
            sa = np.abs(a.astype(F32)).max() / QK_MAX
            sq = np.abs(kq[j, :m]).sum(axis=1) * (1.0 if kpc else ks[0])
            E = alpha * (sa * 0.5 * sq + 2 ** -22 * np.abs(kq[j, :m] * a).sum(axis=1)
                         * (1.0 if kpc else ks[0]))
            sc = alpha * (Kr[j, :m] @ qh[s, h])
            p = np.exp(sc - sc.max())
            ref = p @ Vr[j, :m] / p.sum()
            bound = (np.abs(V[j, :m]).max() * np.expm1(2 * E.max())
                     + (0.5 + 2 ** -9) / 32767 * np.abs(V[j, :m]).sum(axis=0) / p.sum()
                     + 1e-5 * (np.abs(ref) + np.abs(V[j, :m]).max()))
            for level in (0, 4):
                err = np.abs(outs[level][0, s, h * H:(h + 1) * H] - ref)
                assert (err <= (bound if level else 1e-5 * (np.abs(V[j, :m]).max() + 1))).all(), \
                    (level, s, h, err.max(), bound.min())


@pytest.mark.parametrize("mode", ["int8-pt", "int8-pc", "int4-pt", "int4-pc"])
@pytest.mark.parametrize("blocks", [(8, 16), (16, 64), None], ids=["8x16", "16x64", "plan"])
@pytest.mark.parametrize("unit", ["avx2", "avxvnni"])
def test_avx2_prompt_on_the_codes_within_its_bound(mode, blocks, unit):
    """On the avx2 path a prompt's float32 flash tiles at level 4 take both GEMMs on the codes
    (the packed kernels of kernels_avx2_pack.h: the QK and P @ V contracts over a tile's rows;
    the plan's tiles are 256 keys): each score moves by at most E_j (the QK contract's bound on
    the row alpha q as the tile holds it, fl(alpha q): one more rounding, so 2^-21 where the
    decode step's test has 2^-22), each tile's probabilities (<= 1 against the running maximum)
    are quantized against their own maximum and later rescaled by factors <= 1, so against
    float64 over the same codes a head's output moves by at most  max|v| (e^{2D} - 1) +
    e^{2D} (1/2 + 2^-9) / 32767 * sum_j |v_j| / l  (D = max_j E_j; l the row's total, which the
    scores' errors move by at most e^{2D}), plus float32 roundings."""
    settings = _unit_settings(unit)
    rng = np.random.default_rng(17)
    S = 300
    f = gqa.parse_mode(gqa.cache_options(mode)["mode"])[0]
    n = NKV * H if f.per_channel else 1
    kw = dict(k_scales=np.full(n, 0.02 if f.bits == 8 else 0.3, F32),
              v_scales=rng.uniform(0.01, 0.03, n).astype(F32))
    q = rng.uniform(-2, 2, (1, S, N * H)).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    outs = {}
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode=mode, accuracy_level=level, **kw)
        with gqa.config(flash=True, flash_blocks=blocks, **settings):
            outs[level] = c.attend(0, q, k, v)
    assert not np.array_equal(outs[0], outs[4])      # the integer kernels ran
    ks, kq, K, V = _values(c)
    alpha = 1 / np.sqrt(H)
    qh = q.reshape(S, N, H).astype(np.float64)
    for h in range(N):
        j = h // G
        kabs = np.abs(kq[j]).astype(np.float64) * (1.0 if ks.size > 1 else ks[0])
        for s in range(S):
            a = qh[s, h] * (ks.reshape(NKV, H)[j] if ks.size > 1 else 1.0)
            sa = np.abs(a).max() * (1 + 2 ** -20) / QK_MAX
            kk = kabs[:s + 1]
            E = alpha * (sa * 0.5 * kk.sum(axis=1) + 2 ** -21 * (kk * np.abs(a)).sum(axis=1))
            e2d = np.exp(2 * E.max())
            sc = alpha * (K[j, :s + 1] @ qh[s, h])
            p = np.exp(sc - sc.max())
            ref = p @ V[j, :s + 1] / p.sum()
            bound = (np.abs(V[j, :s + 1]).max() * (e2d - 1)
                     + e2d * (0.5 + 2 ** -9) / 32767 * np.abs(V[j, :s + 1]).sum(axis=0) / p.sum()
                     + 1e-5 * (np.abs(ref) + np.abs(V[j, :s + 1]).max()))
            for level in (0, 4):
                err = np.abs(outs[level][0, s, h * H:(h + 1) * H] - ref)
                assert (err <= bound).all(), (level, h, s, err.max(), bound.min())


@pytest.mark.parametrize("mode", ["int8-pt", "int8-pc"])
@pytest.mark.parametrize("blocks", [(3, 7), (8, 16), (16, 64)])
def test_level_4_prompt_within_its_bound(mode, blocks):
    """A causal prompt over an INT8 cache at level 4 on the float32 flash tiles (the AMX tiles
    kept off: tests/test_tiles.py checks level 4 on them): P @ V of each tile by
    the integer-dot kernel on the V codes (the scores stay float32), against float64 over the
    same codes.  A tile row's probabilities are exp(s - m) <= 1 against the running maximum m
    and are quantized against their own maximum (<= 1), later rescaled by factors <= 1, so a
    head's output moves by at most (1/2 + 2^-9) / 32767 * sum_j |v_j| / l over its keys,
    plus float32 roundings; level 0 gives the same codes.  (On avx2 the scores run on the
    codes too: test_avx2_prompt_on_the_codes_within_its_bound.)"""
    _unit_settings("avx512vnni")
    rng = np.random.default_rng(6)
    S = 61
    f = gqa.parse_mode(gqa.cache_options(mode)["mode"])[0]
    n = NKV * H if f.per_channel else 1
    kw = dict(k_scales=np.full(n, 0.02, F32), v_scales=rng.uniform(0.01, 0.03, n).astype(F32))
    q = rng.uniform(-2, 2, (1, S, N * H)).astype(F32)
    k, v = (rng.uniform(-1, 1, (1, S, NKV * H)).astype(F32) for _ in range(2))
    outs = {}
    for level in (0, 4):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=S,
                        mode=mode, accuracy_level=level, **kw)
        with gqa.config(flash=True, flash_blocks=blocks, **DOT_UNITS["avx512vnni"]):
            outs[level] = c.attend(0, q, k, v)
    assert not np.array_equal(outs[0], outs[4])
    ks, kq, K, V = _values(c)
    qh = q.reshape(S, N, H).astype(np.float64)
    for h in range(N):
        j = h // G
        for s in range(S):
            sc = (K[j, :s + 1] @ qh[s, h]) / np.sqrt(H)
            p = np.exp(sc - sc.max())
            ref = p @ V[j, :s + 1] / p.sum()
            bound = ((0.5 + 2 ** -9) / 32767 * np.abs(V[j, :s + 1]).sum(axis=0) / p.sum()
                     + 1e-5 * (np.abs(ref) + np.abs(V[j, :s + 1]).max()))
            for level in (0, 4):
                err = np.abs(outs[level][0, s, h * H:(h + 1) * H] - ref)
                assert (err <= bound).all(), (level, h, s, err.max(), bound.min())


def _values(cache):
    """(K's scales as float64, K's codes, K and V dequantized in float64 [Nkv, T, H]) of layer 0."""
    ks = cache.k_scales[0].astype(np.float64)
    vs = cache.v_scales[0].astype(np.float64)
    kq, vq = _codes(cache)
    return (ks, kq, kq * (ks.reshape(NKV, 1, H) if ks.size > 1 else ks[0]),
            vq * (vs.reshape(NKV, 1, H) if vs.size > 1 else vs[0]))


def _codes(cache):
    """The K / V codes of layer 0 that the step attended, [Nkv, T, H] int64 (INT8 or INT4 rows)."""
    T = cache.length
    k, v = cache.key[0][0, :, :T], cache.value[0][0, :, :T]
    if k.dtype == np.uint8:
        return unpack_int4(k, H).astype(np.int64), unpack_int4(v, H).astype(np.int64)
    return k.astype(np.int64), v.astype(np.int64)


def test_the_attribute_wins_over_the_configured_level(vector_dot_unit):
    rng = np.random.default_rng(5)
    mk = lambda level: gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_TENSOR",  # noqa: E731
                                               v_quant_type="PER_TENSOR", kv_cache_bit_width=8,
                                               accuracy_level=level)
    T = 200
    x = lambda n, w: rng.uniform(-1, 1, (1, n, w * H)).astype(F32)  # noqa: E731
    q, k, v = x(1, N), x(1, NKV), x(1, NKV)
    pk = rng.integers(-128, 128, (1, NKV, T, H)).astype(np.int8)
    pv = rng.integers(-128, 128, (1, NKV, T, H)).astype(np.int8)
    s = np.array([0.02], F32)
    call = lambda op: op(q, k, v, pk.copy(), pv.copy(), np.array([T - 1], np.int32), np.array(T, np.int32),  # noqa: E731
                         k_scale=s, v_scale=s)[0]
    with gqa.config(**vector_dot_unit):
        exact, four = call(mk(0)), call(mk(4))
        with gqa.config(accuracy_level=4):
            assert np.array_equal(call(mk(0)), four)        # 0: the configured level
            assert np.array_equal(call(mk(1)), exact)       # 1-3: float32
            assert np.array_equal(call(mk(3)), exact)
    assert not np.array_equal(exact, four)


def test_environment_default():
    import os
    import subprocess
    import sys
    code = "import gqa; print(gqa.get_config()['accuracy_level'])"
    env = dict(os.environ, GQA_ACCURACY_LEVEL="4")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "4", r.stderr
    env["GQA_ACCURACY_LEVEL"] = "high"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "GQA_ACCURACY_LEVEL='high' is not an integer" in r.stderr
    env["GQA_ACCURACY_LEVEL"] = "6"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "GQA_ACCURACY_LEVEL must be 0, 1, 2, 3 or 4" in r.stderr


def test_the_int8_unit_is_reported():
    """get_config()['int8_dot_unit'] names where level 4's INT8 dots run: none on the scalar
    path; on the avx2 path avxvnni where the CPU has AVX-VNNI (and the build the unit), else avx2;
    neon on the neon path where the CPU has the dot product; on avx512 the AMX tiles where they
    run (and are on), else VNNI where it runs."""
    with gqa.config(path="scalar"):
        assert gqa.get_config()["int8_dot_unit"] is None
        assert not gqa.get_config()["int8_dot_effective"]
    if _dispatch.path_runnable("avx2"):
        avxvnni = "AVXVNNI" in _dispatch.cpu_features() and "avxvnni" in _dispatch.COMPILED_UNITS
        with gqa.config(path="avx2"):
            assert gqa.get_config()["int8_dot_unit"] == ("avxvnni" if avxvnni else "avx2")
            assert gqa.get_config()["group_dot_unit"] == ("avxvnni" if avxvnni else "avx2")
            assert gqa.get_config()["int8_dot_effective"]
    if _dispatch.path_runnable("neon"):
        sdot = _dispatch.dot_runnable("neon")   # the CPU's dot product (FEAT_DotProd)
        with gqa.config(path="neon"):
            assert gqa.get_config()["int8_dot_unit"] == ("neon" if sdot else None)
            assert gqa.get_config()["int8_dot_effective"] == sdot
    if not _dispatch.path_runnable("avx512"):
        return
    vnni = "avx512vnni" if _dispatch.approx_vnni_runnable() else None
    with gqa.config(path="avx512", tiles=False):
        assert gqa.get_config()["int8_dot_unit"] == vnni
    with gqa.config(path="avx512"):
        want = "amx" if _dispatch.tiles_runnable("amx") else vnni
        assert gqa.get_config()["int8_dot_unit"] == want
        buf = io.StringIO()
        gqa.show_config(file=buf)
        assert ("level 4's int8 kernels " + (f"run on {want}" if want else "absent")) in buf.getvalue()
