"""How far accuracy level 4 may move a valid call of the onnxruntime surface from level 0
(README "Accuracy levels"), for the property test test_hard_levels.py.

Level 4 changes products only: the caches it writes are level 0's, and against float64 over
those caches each score moves by at most the integer contracts' bound (quantized K) or the
float tiles' bound (a float cache's prompt tiles coded on the avx2 path), each probability row
is quantized to 15 bits against its maximum, and both levels add float32 roundings.  With
E_j the bound on score j of a row and D = max_j E_j over the keys it attends, a head's output
moves by at most

    M (e^{2D} - 1) + e^{2D} PV + R

M: the largest |v| those keys hold (plus the coding error of a coded V); PV: P @ V's own
bound (quantized V: (1/2 + 2^-9) / 32767 * sum_j |v_j| / l per column, l the softmax's
denominator with the largest probability 1; a float V tile: its rows' coding error plus
the per-group contract's); R: both levels' float32 roundings, 2 (n + 64) 2^-24 (|out| + M)
over n keys.  Softcap (1-Lipschitz) and attention bias (added exactly) keep E_j.  Every
kernel's stated bound is under the union taken here: the decode kernels' (sa / 2, 2^-22),
the packed prompt blocks' (sa (1 + 2^-20) / 2, 2^-21) and the per-group ones' (1/2 + 2^-9).

With the matrix tiles on (`tiles`: AMX, AVX-512 BF16, BFDOT), levels 3 and 4 may also run a
score or a P @ V on bfloat16 (README's table): score j moves by a further
(2^-8 + 2^-18 + (H + 4) 2^-24) alpha sum_i |q_i| |k_ji| (the query row times alpha and the K
values rounded to bfloat16, exact products summed in float32), and P @ V, whose probabilities
(exp within 2^-16, in P and in the row sum alike) and V values round to bfloat16, by a factor
within G = (1 + 2^-16) / (1 - 2^-16) (1 + 2^-9)^2 (1 + (n + 16) 2^-24) of sum_j w_j |v_j|: PV
gains (G - 1) sum_j w_j |v_j|.  A call may run some keys on the tiles and others on the
integer or float32 kernels (causal float windows' mixed tiles, decode steps at level 4), so
the tiles' terms are added to the others, never put in their place.
"""
import numpy as np

from _hard_cases import F16_STEP
from _cases import dequant_cache, key_range, query_rows, scores, softmax
from _newer_reference import TINY

U = 2.0 ** -24
QK_MAX = 32639          # the query codes' limit (kernels_s8dot.h)
PV_MAX = 32767          # the probability codes' limit
HALF = 0.5 + 2.0 ** -9  # half a code step, with the contracts' rounding slack
UB = 2.0 ** -9          # bfloat16's unit roundoff (8-bit significand, to nearest)


def _tile_qk(alpha, aw, K, H):
    """A score's further bound on bfloat16 tiles, per key of K [n, H] for the row's
    magnitudes aw."""
    return (2 * UB + UB * UB + (H + 4) * U) * alpha * (np.abs(K) @ aw)


def _tile_pv(w, V):
    """P @ V's further bound on bfloat16 tiles per column: w the row's weights (p / l) over the
    n keys of V [n, H]."""
    grow = (1 + 2.0 ** -16) / (1 - 2.0 ** -16) * (1 + UB) ** 2 * (1 + (len(w) + 16) * U)
    return (grow - 1) * (w @ np.abs(V))


def f16_allowance(bound, ref):
    """A float32 bound on |x4 - x0| widened for float16 results: each of x4 and x0 rounded once
    more, by at most half a float16 step (2^-11 of the value, 2^-25 below the normal range)."""
    return bound * (1 + 2.0 ** -11) + F16_STEP * (1 + 2.0 ** -10) * ref + 2.0 ** -24


def _codes(spec, cache, which):
    """|codes| [B, Nkv, L, H] (float64) of a static INT8 / INT4 cache (INT4: the nibble - 8)."""
    mode = spec["mode"] if which == "k" else spec["v_mode"]
    codes = dequant_cache(cache, np.ones(1, np.float32), mode, spec["bits"], spec["H"], spec["Nkv"])
    return np.abs(codes)


def _scales(inp, spec, which):
    """The scales: per channel [Nkv, H], or one float."""
    s = inp[f"{which}_scale"].astype(np.float64).reshape(-1)
    return s.reshape(spec["Nkv"], spec["H"]) if s.size > 1 else float(s[0])


def _query_magnitudes(inp, a, spec):
    """(q, |q| as the kernels may read it): the float64 rotation, each element widened by the
    rotation's rounding in the I/O dtype, at most 2^-10 (float16; 2^-22 float32) of |x1| + |x2|
    of its pair, which is at most twice the row's largest rotated element."""
    q = query_rows(inp, a, spec["H"])
    if not a.get("do_rotary", 0):
        return q, np.abs(q)
    eps = 2.0 ** -10 if inp["query"].dtype == np.float16 else 2.0 ** -22
    return q, np.abs(q) + eps * 2 * np.abs(q).max(-1, keepdims=True)


def level4_bounds(spec, inp, a, out0, present_key, present_value, float_tiles, tiles=False):
    """(bound on |out4 - out0| [B, S, N*H], bound on |qk4 - qk0| [B, N, S, T] or None), in
    float64.  float_tiles: a float cache's prompt tiles may run on codes (the avx2 path);
    tiles: scores and P @ V may run on bfloat16 tiles (levels 3 and 4 alike)."""
    B, S, N, Nkv, H = spec["B"], inp["query"].shape[1], spec["N"], spec["Nkv"], spec["H"]
    G = N // Nkv
    quant = spec["mode"] != "NONE"
    kd = dequant_cache(present_key, inp.get("k_scale"), spec["mode"], spec["bits"], H, Nkv)
    vd = dequant_cache(present_value, inp.get("v_scale"), spec["v_mode"], spec["bits"], H, Nkv)
    if quant:
        kq, ks = _codes(spec, present_key, "k"), _scales(inp, spec, "k")
    q, qa = _query_magnitudes(inp, a, spec)
    alpha = a.get("scale", 0.0) or 1.0 / np.sqrt(np.float32(H))
    f16 = inp["query"].dtype == np.float16
    o0 = np.abs(out0.astype(np.float64)).reshape(B, S, N, H)
    out_bound = np.zeros((B, S, N, H))
    qk_bound = None
    T = kd.shape[2]
    if a.get("qk_output", 0):
        qk_bound = np.zeros((B, N, S, T))
    for b in range(B):
        Tb = int(inp["seqlens_k"][b]) + 1
        for h in range(N):
            j = h // G
            for s in range(S):
                ar = qa[b, s, h]
                keys = slice(0, Tb)
                # every key's score bound E (all of [0, T_b): output_qk covers them)
                f32 = (H + 8) * U * alpha * (np.abs(kd[b, j, keys]) @ ar)   # each level's float32 QK
                if quant:
                    pc = np.ndim(ks) > 0
                    E = _static_qk(alpha, ar, kq[b, j, keys], ks[j] if pc else ks, pc)
                elif float_tiles:
                    E = np.full(Tb, _float_tile_qk(kd[b, j, :max(Tb, S)], ar, alpha, H))
                else:
                    E = np.zeros(Tb)
                E = E + 2 * f32
                if tiles:
                    E = E + _tile_qk(alpha, ar, kd[b, j, keys], H)
                start, c = key_range(inp, a, b, s)
                if c <= start:
                    out_bound[b, s, h] = 2 * 64 * U * o0[b, s, h]
                    continue
                n = c - start
                p, l = softmax(*scores(inp, a, q, kd, b, s, h))
                D = E[start:c].max()
                V = vd[b, j, start:c]
                M = np.abs(V).max()
                if spec["v_mode"] != "NONE":
                    PV = _static_pv(V, l)
                elif float_tiles:
                    sv = (V.max(1) - V.min(1)).max() * (1 + 2.0 ** -20) / 255
                    M += sv
                    PV = (0.5 + 2.0 ** -8) * sv + HALF / PV_MAX * 255 * sv * n / l
                else:
                    PV = 0.0
                if tiles:
                    PV = PV + _tile_pv(p / l, V)
                R = 2 * (n + 64) * U * (o0[b, s, h] + M)
                bound = M * np.expm1(2 * D) + np.exp(2 * D) * PV + R
                if f16:
                    bound = f16_allowance(bound, o0[b, s, h])
                out_bound[b, s, h] = bound
                if qk_bound is not None:
                    qk_bound[b, h, s, :Tb] = _qk_allowance(a, E, p / l, start, c, n)
    return out_bound.reshape(B, S, N * H), qk_bound


def _static_qk(alpha, ar, codes, s, per_channel):
    """A score's bound over static INT8 / INT4 codes (|codes| [n, H], float64) for the row's
    magnitudes ar: the scales folded into the row (per channel, s [H]) or applied after (per
    tensor, s a float), the row coded to 15 bits against its largest element (the decode
    kernels' sa / 2 and 2^-22, the packed prompt blocks' sa (1 + 2^-20) / 2 and 2^-21: the
    union)."""
    w, ks = (ar * s, 1.0) if per_channel else (ar, s)
    sa = w.max() * (1 + 2.0 ** -20) / QK_MAX
    return alpha * ks * (sa * HALF * codes.sum(1) + 2.0 ** -21 * (codes @ w))


def _static_pv(V, l):
    """P @ V's bound over static codes decoded to V [n, H] per column: the probabilities (the
    largest 1) coded to 15 bits, half a step each, over the softmax's total l."""
    return HALF / PV_MAX * np.abs(V).sum(0) / l


def _float_tile_qk(K, ar, alpha, H):
    """A score's bound where a float K tile is coded (README's table: per channel, a zero per
    channel, s_c = fl(hi_c - lo_c) / 255 over the tile, codes within s_c / 2 of K): the coding
    error alpha sum_c |q_c| s_c / 2, then the per-channel contract over codes |c| <= 128 with
    the row q s, plus the zeros' term (H + 4) 2^-24 alpha sum_c |q_c z_c|.  The tile holds some
    of the rows K [n, H] (every row the call could put in it), so their range bounds s_c."""
    sc = (K.max(0) - K.min(0)) * (1 + 2.0 ** -20) / 255
    z = np.abs(K).max(0) + sc
    w = ar * sc
    return alpha * ((0.5 + 2.0 ** -8) * (ar @ sc) + 128 * H * HALF * w.max() * (1 + 2.0 ** -20) / QK_MAX
                    + 2.0 ** -21 * 128 * w.sum() + (H + 4) * U * (ar @ z))


def _qk_allowance(a, E, prob, start, c, n):
    """output_qk's bound over keys [0, T_b): scores (qk_output 1) move by E_j; probabilities
    (qk_output 2) by at most p_j (e^{2D} - 1) plus roundings, 0 outside the attended keys."""
    if a["qk_output"] == 1:
        bound = E * (1 + 2.0 ** -20)
    else:
        bound = np.zeros_like(E)
        D = E[start:c].max()
        bound[start:c] = prob * np.expm1(2 * D) * (1 + 2.0 ** -20) + 2 * (n + 64) * U * prob + TINY
    return bound


# ---------------------------------------------------------------- the newer surface

def level4_bounds_newer(st, out0, group_kernels, tiles=False):
    """(bound on |out4 - out0| [B, S, N*H], bound on |qk4 - qk0| [B, N, S, T] or None) of a
    valid call of the newer surface, st its float64 statement (_newer_reference.Statement):
    per-group K and V codes (the per-group contracts where `group_kernels`, else float32) or
    a static side's (level4_bounds' contracts),
    float windows read in float32, QK norm, rotary, rotations, the score features.  In the
    rotated basis each score of a key read as codes moves by at most
      E_j = alpha (sa (1/2 + 2^-9) sum|x| + 2^-21 sum|a x| + (J + 3) 2^-24 sum (|a| + sa) m)
    (x = code scale + zero, m = |code scale| + |zero|: the per-group finish), a key read from a
    window by float32 roundings only (softcap and bias: 12 roundings of |x| + |bias| at each
    level); P @ V of the codes by (1/2 + 2^-9) / 32767 max_k w_k sum_k u_k / l per column (u
    the codes, w_k = p_k s_k: the probabilities, each within e^{2D} of float64's, times their
    groups' scales, quantized against their maximum); the output turned back by R_V^T, so its
    bound is |R_V| times the rotated one's.  The query row a is the statement's, widened by
    its eta (the operator's roundings of the norm, rotary and rotation).  tiles: scores and
    P @ V may run on bfloat16 tiles too (the module's terms, in the rotated basis)."""
    spec, B, S, N, H = st.spec, st.spec["B"], st.spec["S"], st.spec["N"], st.H
    g = spec["group"] or H
    J = H // g
    T = st.xk.shape[2]
    f16 = st.inp["query"].dtype == np.float16
    o0 = np.abs(out0.astype(np.float64)).reshape(B, S, N, H)
    bound = np.zeros((B, S, N, H))
    qk_bound = np.zeros((B, N, S, T)) if st.attrs.get("qk_output", 0) else None
    for b, s, h, start, c, flo, k, v, _, _, mk, _ in st.rows():
        j, sl = h // st.G, slice(start, c)
        aw = np.abs(st.q[b, s, h]) + st.eta_q[b, s, h]
        x, bias, extra = st.scores(b, s, h, k, start, c)
        E = 2 * (H + 8) * U * st.alpha * (np.abs(k) @ aw) + 24 * U * (np.abs(x) + np.abs(bias))
        code = ~flo
        coded = code.any()
        if coded and st.types[0] != "PER_GROUP":       # the static contracts, as level4_bounds
            pc, sc = st.types[0] == "PER_CHANNEL", st.sk[b, j, start]
            E[code] += _static_qk(st.alpha, aw, np.abs(st.ck[b, j, sl][code]), sc if pc else sc[0], pc)
        elif coded and group_kernels:
            sa = aw.max() * (1 + 2.0 ** -20) / QK_MAX
            xa = np.abs(k[code])
            E[code] += st.alpha * (sa * HALF * xa.sum(1) + 2.0 ** -21 * (xa @ aw)
                                   + (J + 3) * U * (mk[code] @ (aw + sa)))
        if tiles:
            E += _tile_qk(st.alpha, aw, k, H)
        D = E.max()
        p, l = softmax(x, extra)
        M = np.abs(v).max()
        PV = 0.0
        if coded and st.types[1] != "PER_GROUP":
            PV = _static_pv(v[code], l)
        elif coded and group_kernels:
            w = (p[code, None] * st.sv[b, j, sl][code]).max(0) * np.exp(2 * D)
            PV = HALF / PV_MAX * w * st.uv[b, j, sl][code].sum(0) / l
        if tiles:
            PV = PV + _tile_pv(p / l, v)
        rb = M * np.expm1(2 * D) + np.exp(2 * D) * PV + 2 * (c - start + 64) * U * 2 * M + np.zeros(H)
        if st.RV is not None:
            Ra = np.abs(st.RV[j].astype(np.float64))
            rb = Ra @ rb + 2 * (H + 8) * U * M * Ra.sum(1)
        if f16:
            rb = f16_allowance(rb, o0[b, s, h])
        bound[b, s, h] = rb
        if qk_bound is not None:
            full = np.zeros(c)
            full[sl] = E
            qk_bound[b, h, s, :c] = _qk_allowance(st.attrs, full, p / l, start, c, c - start)
    return bound.reshape(B, S, N * H), qk_bound
