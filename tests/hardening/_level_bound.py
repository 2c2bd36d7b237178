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
"""
import numpy as np

from _hard_cases import F16_STEP
from _cases import dequant_cache, float_positions, key_range, query_rows, rotate, scores, window_counts
from _reference import _group_parts

U = 2.0 ** -24
QK_MAX = 32639          # the query codes' limit (kernels_s8dot.h)
PV_MAX = 32767          # the probability codes' limit
HALF = 0.5 + 2.0 ** -9  # half a code step, with the contracts' rounding slack


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


def level4_bounds(spec, inp, a, out0, present_key, present_value, float_tiles):
    """(bound on |out4 - out0| [B, S, N*H], bound on |qk4 - qk0| [B, N, S, T] or None), in
    float64.  float_tiles: a float cache's prompt tiles may run on codes (the avx2 path)."""
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
                    if np.ndim(ks):
                        w, kst = ar * ks[j], 1.0
                    else:
                        w, kst = ar, ks
                    sa = w.max() * (1 + 2.0 ** -20) / QK_MAX
                    E = alpha * kst * (sa * HALF * kq[b, j, keys].sum(1) + 2.0 ** -21 * (kq[b, j, keys] @ w))
                elif float_tiles:
                    E = np.full(Tb, _float_tile_qk(kd[b, j, :max(Tb, S)], ar, alpha, H))
                else:
                    E = np.zeros(Tb)
                E = E + 2 * f32
                start, c = key_range(inp, a, b, s)
                if c <= start:
                    out_bound[b, s, h] = 2 * 64 * U * o0[b, s, h]
                    continue
                n = c - start
                x, sink = scores(inp, a, q, kd, b, s, h)
                mx = x.max()
                p = np.exp(x - mx)
                l = p.sum() + (0.0 if sink is None else np.exp(sink - mx))
                D = E[start:c].max()
                V = vd[b, j, start:c]
                M = np.abs(V).max()
                if spec["v_mode"] != "NONE":
                    PV = HALF / PV_MAX * np.abs(V).sum(0) / l
                elif float_tiles:
                    sv = (V.max(1) - V.min(1)).max() * (1 + 2.0 ** -20) / 255
                    M += sv
                    PV = (0.5 + 2.0 ** -8) * sv + HALF / PV_MAX * 255 * sv * n / l
                else:
                    PV = 0.0
                R = 2 * (n + 64) * U * (o0[b, s, h] + M)
                bound = M * np.expm1(2 * D) + np.exp(2 * D) * PV + R
                if f16:
                    bound = f16_allowance(bound, o0[b, s, h])
                out_bound[b, s, h] = bound
                if qk_bound is not None:
                    qk_bound[b, h, s, :Tb] = _qk_allowance(a, E, p / l, start, c, n)
    return out_bound.reshape(B, S, N * H), qk_bound


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
        bound[start:c] = prob * np.expm1(2 * D) * (1 + 2.0 ** -20) + 2 * (n + 64) * U * prob
    return bound


# ---------------------------------------------------------------- the newer surface

def _normed(x, w, eps):
    """The QK RMS norm in float64: x / sqrt(mean(x^2) + eps) * w over the last axis."""
    if w is None:
        return x
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def _turned(x, R, G):
    """x [B, S, n, H] times R[head // G] ([Nkv, H, H]; None: x)."""
    if R is None:
        return x
    R = R.astype(np.float64)
    return np.einsum("bsnh,nhk->bsnk", x, R[np.arange(x.shape[2]) // G])


def _float_rows(side, inp, attrs, spec, new):
    """Float rows [B, Nkv, T, H] (rotated basis) of the positions the windows can hold: the past
    window's rows (past_hp_*) and the call's new rows `new`; NaN elsewhere."""
    B, Nkv, H, S = spec["B"], spec["Nkv"], spec["H"], spec["S"]
    P = spec["past"]
    out = np.full((B, Nkv, P + S, H), np.nan)
    out[:, :, P:] = new.transpose(0, 2, 1, 3)
    past = inp.get(f"past_hp_{side}")
    if past is not None and P:
        ns, nr = window_counts(P, attrs["sink_size"], attrs["recent_size"])
        past = past.astype(np.float64)
        out[:, :, :ns] = past[:, :, :ns]
        out[:, :, P - nr:P] = past[:, :, ns:ns + nr]
    return out


def level4_bounds_newer(spec, attrs, inp, out0, present_key, present_value, group_kernels):
    """Bound on |out4 - out0| [B, S, N*H] of a valid call of the newer surface (_newer_cases):
    per-group K and V codes (the per-group contracts where `group_kernels`, else float32),
    float windows read in float32, QK norm, rotary, rotations.  In the rotated basis each score
    of a key read as codes moves by at most
      E_j = alpha (sa (1/2 + 2^-9) sum|x| + 2^-21 sum|a x| + (J + 3) 2^-24 sum (|a| + sa) m)
    (x = code scale + zero, m = |code scale| + |zero|: the per-group finish), a key read from a
    window by float32 roundings only; P @ V of the codes by (1/2 + 2^-9) / 32767 max_k w_k
    sum_k u_k / l per column (u the codes, w_k = p_k s_k: the probabilities, each within e^{2D}
    of float64's, times their groups' scales, quantized against their maximum); the output
    turned back by R_V^T, so its bound is |R_V| times the rotated one's.  The query row a is
    the float64 norm, rotary and rotation, widened by 2^-9 of its maximum (the operator's
    float16 / float32 roundings of those steps)."""
    B, S, N, Nkv, H, P = spec["B"], spec["S"], spec["N"], spec["Nkv"], spec["H"], spec["past"]
    G, T = N // Nkv, P + S
    eps = attrs.get("qk_norm_epsilon", 1e-6)
    RK, RV = inp.get("oscar_rotation_k"), inp.get("oscar_rotation_v")
    rot = lambda x: rotate(x, inp, attrs) if attrs.get("do_rotary", 0) else x  # noqa: E731
    f = lambda name, n: inp[name].astype(np.float64).reshape(B, S, n, H)  # noqa: E731
    qt = _turned(rot(_normed(f("query", N), inp.get("q_norm_weight"), eps)), RK, G)
    kt = _turned(rot(_normed(f("key", Nkv), inp.get("k_norm_weight"), eps)), RK, 1)
    vt = _turned(f("value", Nkv), RV, 1)
    Kf, Vf = _float_rows("key", inp, attrs, spec, kt), _float_rows("value", inp, attrs, spec, vt)
    parts = {}
    g = spec["group"] or H
    J = H // g
    for side, cache, bits in (("k", present_key, spec["k_bits"]), ("v", present_value, spec["v_bits"])):
        codes, scale, zero = _group_parts(cache[:, :, :T], bits, g, H, spec["metadata"] == "fp16")
        shp = (B, Nkv, T, H)
        codes, scale, zero = (y.reshape(shp).astype(np.float64) for y in (codes, scale, zero))
        parts[side] = (codes, scale, codes * scale + zero, np.abs(codes * scale) + np.abs(zero))
    alpha = attrs.get("scale", 0.0) or 1.0 / np.sqrt(np.float32(H))
    f16 = inp["query"].dtype == np.float16
    o0 = np.abs(out0.astype(np.float64)).reshape(B, S, N, H)
    bound = np.zeros((B, S, N, H))
    _, _, xk, mk = parts["k"]
    uv, sv, xv, _ = parts["v"]
    for b in range(B):
        for s in range(S):
            end = P + s + 1
            flo = float_positions(attrs.get("window_partition", "causal"), attrs["sink_size"],
                                  attrs["recent_size"], T, end)
            for h in range(N):
                j = h // G
                a = qt[b, s, h]
                aw = np.abs(a) + 2.0 ** -9 * np.abs(a).max()
                k = np.where(flo[:, None], Kf[b, j, :end], xk[b, j, :end])
                v = np.where(flo[:, None], Vf[b, j, :end], xv[b, j, :end])
                assert np.isfinite(k).all() and np.isfinite(v).all(), "a window position without its row"
                E = 2 * (H + 8) * U * alpha * (np.abs(k) @ aw)
                code = ~flo
                if group_kernels and code.any():
                    sa = aw.max() * (1 + 2.0 ** -20) / QK_MAX
                    x = np.abs(xk[b, j, :end][code])
                    E[code] += alpha * (sa * HALF * x.sum(1) + 2.0 ** -21 * (x @ aw)
                                        + (J + 3) * U * (mk[b, j, :end][code] @ (aw + sa)))
                D = E.max()
                x = alpha * (k @ a)
                p = np.exp(x - x.max())
                l = p.sum()
                M = np.abs(v).max()
                PV = 0.0
                if group_kernels and code.any():
                    w = (p[code, None] * sv[b, j, :end][code]).max(0) * np.exp(2 * D)
                    PV = HALF / PV_MAX * w * uv[b, j, :end][code].sum(0) / l
                rb = M * np.expm1(2 * D) + np.exp(2 * D) * PV + 2 * (end + 64) * U * 2 * M + np.zeros(H)
                if RV is not None:
                    Ra = np.abs(RV[j].astype(np.float64))
                    rb = Ra @ rb + 2 * (H + 8) * U * M * Ra.sum(1)
                if f16:
                    rb = f16_allowance(rb, o0[b, s, h])
                bound[b, s, h] = rb
    return bound.reshape(B, S, N * H)
