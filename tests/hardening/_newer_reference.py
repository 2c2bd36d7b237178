"""A float64 statement of a valid call of the newer surface (_newer_cases.py), and how far
accuracy level 0 may be from it.

The statement (README "Per-group caches, float windows and rotations", onnxruntime main's
two-basis attention stated in the rotated basis): each query row a = (RMS norm, rotary, then
R_K) of its query, in float64; its keys [start, c) (_cases.key_range: causal or not, local
window, a ragged first prompt's cap); of those, the positions its float windows hold
(_cases.float_positions: the row's own windows under window_partition "causal", the call's
under "per_call") are read as float rows -- a past window's row as given, a new row as its
float64 norm, rotary and rotation -- and the others as the present caches' codes, decoded in
float64 (code * scale + zero); scores alpha a . k, softcap, attention bias; softmax with the
head sink or smooth softmax's zero logit; P @ V in the rotated basis, turned back by R_V^T.

Level 0 computes it in float32 (float16 inputs: the norm, rotary and rotation rounded to
half, windows in half).  Per key j of a row it may move the score by at most

    E_j = alpha (|k_j| . eta_a + |a| . eta_kj + (H + 8) 2^-24 (|a| + eta_a) . m_j)
          + 12 2^-24 (|x_j| + |bias_j|)

eta_a (elementwise, `transformed`): how far the operator's query row may be from a -- 0 for a
row taken as given; the norm's and rotary's roundings (4 2^-24 of the value, plus 2^-11 when
rounded to half; rotary over each pair's magnitudes), carried through |R_K| with R_K's H + 2
roundings; eta_kj the same for a new key row read as floats, 0 for a past window's row and
for codes; m_j = |code scale| + |zero| (|k| for floats) bounds the decoding's and the dot's
roundings, the per-group contracts' finish among them; x_j the score: 12 roundings for
alpha, softcap's tanh and the bias add.  With D = max_j E_j over the row's n keys and M the
largest |v| or m_v, its output (rotated basis) moves by at most
M (e^{2D} - 1) + e^{2D} p . eta_V + 2 (n + 64) 2^-24 (|o| + M) (eta_V the value rows'
eta), then |R_V| times that plus R_V^T's H + 8 roundings; float16 outputs one rounding more
(f16_allowance).  output_qk: E_j for scores, p_j (e^{2D} - 1) plus the softmax's roundings
for probabilities.
"""
import numpy as np

from _cases import (dequant_cache, float_positions, key_range, rotate, score_features, softmax,
                    window_counts)
from _newer_cases import lengths, side_type
from _reference import _group_parts

U = 2.0 ** -24
TINY = 2.0 ** -125    # a probability under float32's normal range may be flushed to 0


def normed(x, w, eps):
    """The QK RMS norm in float64: x / sqrt(mean(x^2) + eps) * w over the last axis."""
    if w is None:
        return x
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def turned(x, R, G):
    """x [B, S, n, H] times R[head // G] ([Nkv, H, H]; None: x)."""
    if R is None:
        return x
    R = R.astype(np.float64)
    return np.einsum("bsnh,nhk->bsnk", x, R[np.arange(x.shape[2]) // G])


def _pair_sum(x, inp, attrs):
    """x plus its rotary partner's (pairs (i, i + d/2), or (2i, 2i + 1) interleaved) over the
    first d = 2 cos_cache.shape[1] columns; x beyond them."""
    d = 2 * inp["cos_cache"].shape[1]
    y = np.array(x)
    if attrs.get("rotary_interleaved", 0):
        y[..., 0:d:2] += x[..., 1:d:2]
        y[..., 1:d:2] += x[..., 0:d:2]
    else:
        y[..., :d // 2] += x[..., d // 2:d]
        y[..., d // 2:d] += x[..., :d // 2]
    return y


def transformed(x, w, R, G, inp, attrs):
    """(y, eta), each [B, S, n, H]: rows x [B, S, n, H] (float64 of the inputs) through the
    RMS norm with weights w (None: none), rotary (do_rotary), then R (None: none), in float64,
    and how far the operator's rows may be from them, elementwise: the norm's and rotary's
    outputs each rounded once (4 2^-24, and to half for float16 inputs, 2^-11, of the value;
    rotary's three roundings of its pair's magnitudes plus its inputs' errors), the rotation's
    H + 2 roundings (|x| @ |R|) plus its inputs' errors through |R|, and for float16 inputs
    the rotated rows rounded to half (gqa/_prepare.pxi)."""
    f16 = inp["query"].dtype == np.float16
    one = (2.0 ** -11 if f16 else 0.0) + 4 * U
    eta = np.zeros_like(x)
    if w is not None:
        x = normed(x, w, attrs.get("qk_norm_epsilon", 1e-6))
        eta = one * np.abs(x)
    if attrs.get("do_rotary", 0):
        eta = (one + 3 * U) * _pair_sum(np.abs(x), inp, attrs) + _pair_sum(eta, inp, attrs)
        x = rotate(x, inp, attrs)
    if R is not None:
        Ra = np.abs(R.astype(np.float64))[np.arange(x.shape[2]) // G]
        eta = (np.einsum("bsnh,nhk->bsnk", eta, Ra)
               + (x.shape[-1] + 2) * U * np.einsum("bsnh,nhk->bsnk", np.abs(x), Ra))
        x = turned(x, R, G)
        if f16:
            eta = eta + 2.0 ** -11 * np.abs(x)
    return x, eta


def decoded(spec, side, cache, scale):
    """(codes, scales, code * scale + zero, |code scale| + |zero|), each float64 [B, Nkv, T, H],
    of side "k" / "v"'s cache rows: per group (scale and zero per group), or a static side's
    codes (INT4: the nibble - 8) and scales (no zero)."""
    B, Nkv, T = cache.shape[:3]
    H = spec["H"]
    kind = side_type(spec, side)
    if kind == "PER_GROUP":
        codes, sc, zero = _group_parts(cache, spec[f"{side}_bits"], spec["group"] or H, H,
                                       spec["metadata"] == "fp16")
        codes, sc, zero = (y.reshape(B, Nkv, T, H).astype(np.float64) for y in (codes, sc, zero))
    else:
        codes = dequant_cache(cache, np.ones(1, np.float32), kind, spec[f"{side}_bits"], H, Nkv)
        sc = scale.astype(np.float64).reshape(1, Nkv if scale.size > 1 else 1, 1, -1)
        sc, zero = np.broadcast_to(sc, codes.shape), np.zeros(codes.shape)
    return codes, sc, codes * sc + zero, np.abs(codes * sc) + np.abs(zero)


class Statement:
    """The float64 rows of one call (its inputs before the call and its present caches).

    q [B, S, N, H]: query rows (rotated basis); eta_q [B, S, N, H]: their eta (`transformed`).
    kf, vf [B, Nkv, T, H]: float rows (rotated basis) of the positions a window may hold (past
    windows, the step's new rows), NaN elsewhere; eta_kf, eta_vf [B, Nkv, T, H]: their eta.
    ck, sk / uv, sv [B, Nkv, T, H]: the present K / V codes and their scales; xk, xv the
    codes decoded; mk, mv their |code scale| + |zero|; types: (K's, V's) quant type."""

    def __init__(self, spec, attrs, inp, present_key, present_value):
        B, S, N, Nkv, H = spec["B"], spec["S"], spec["N"], spec["Nkv"], spec["H"]
        self.spec, self.attrs, self.inp = spec, attrs, inp
        self.G, self.H = N // Nkv, H
        self.lens = lengths(spec)
        self.first = spec["phase"] == "prompt"
        T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
        self.alpha = attrs.get("scale", 0.0) or 1.0 / np.sqrt(np.float32(H))
        self.RK, self.RV = inp.get("oscar_rotation_k"), inp.get("oscar_rotation_v")
        f = lambda name, n: inp[name].astype(np.float64).reshape(B, S, n, H)  # noqa: E731
        self.q, self.eta_q = transformed(f("query", N), inp.get("q_norm_weight"), self.RK, self.G,
                                         inp, attrs)
        kt, eta_k = transformed(f("key", Nkv), inp.get("k_norm_weight"), self.RK, 1, inp, attrs)
        vt, eta_v = transformed(f("value", Nkv), None, self.RV, 1, inp,
                                dict(attrs, do_rotary=0))
        self.kf, self.eta_kf = self._float_rows("key", kt, eta_k, T)
        self.vf, self.eta_vf = self._float_rows("value", vt, eta_v, T)
        self.types = side_type(spec, "k"), side_type(spec, "v")
        (self.ck, self.sk, self.xk, self.mk), (self.uv, self.sv, self.xv, self.mv) = (
            decoded(spec, side, cache[:, :, :T], inp.get(f"{side}_scale"))
            for side, cache in (("k", present_key), ("v", present_value)))

    def past_len(self, b):
        return 0 if self.first else int(self.lens[b]) - self.spec["S"]

    def _float_rows(self, side, new, eta_new, T):
        """(float rows, their eta), each [B, Nkv, T, H]: each batch's past window rows
        (past_hp_*, exact) at their positions, its new rows after them; NaN elsewhere."""
        B, Nkv, H, S = self.spec["B"], self.spec["Nkv"], self.H, self.spec["S"]
        out, eta = np.full((B, Nkv, T, H), np.nan), np.zeros((B, Nkv, T, H))
        past = self.inp.get(f"past_hp_{side}")
        for b in range(B):
            P = self.past_len(b)
            n = min(S, int(self.lens[b]) - P)
            out[b, :, P:P + n] = new[b, :n].transpose(1, 0, 2)
            eta[b, :, P:P + n] = eta_new[b, :n].transpose(1, 0, 2)
            if past is not None and P:
                ns, nr = window_counts(P, self.attrs["sink_size"], self.attrs["recent_size"])
                out[b, :, :ns] = past[b, :, :ns].astype(np.float64)
                out[b, :, P - nr:P] = past[b, :, ns:ns + nr].astype(np.float64)
        return out, eta

    def row(self, b, s, h):
        """(start, c, flo, k, v, eta_k, eta_v, mk, mv) of query row (b, s, h): its keys
        [start, c) (empty: c <= start), which of them its float windows give (flo), their
        rows k, v [n, H] (rotated basis), those rows' eta (0 for codes), and |code scale| +
        |zero| (|k|, |v| for floats)."""
        start, c = key_range(self.inp, self.attrs, b, s)
        if c <= start:
            return start, c, None, None, None, None, None, None, None
        j, sl = h // self.G, slice(start, c)
        flo = float_positions(self.attrs.get("window_partition", "causal"), self.attrs["sink_size"],
                              self.attrs["recent_size"], int(self.lens[b]), c)[sl]
        k = np.where(flo[:, None], self.kf[b, j, sl], self.xk[b, j, sl])
        v = np.where(flo[:, None], self.vf[b, j, sl], self.xv[b, j, sl])
        assert np.isfinite(k).all() and np.isfinite(v).all(), "a window position without its row"
        ek = np.where(flo[:, None], self.eta_kf[b, j, sl], 0.0)
        ev = np.where(flo[:, None], self.eta_vf[b, j, sl], 0.0)
        mk = np.where(flo[:, None], np.abs(k), self.mk[b, j, sl])
        mv = np.where(flo[:, None], np.abs(v), self.mv[b, j, sl])
        return start, c, flo, k, v, ek, ev, mk, mv

    def rows(self):
        """(b, s, h) + row(b, s, h) of every query row that attends a key."""
        B, S, N = self.spec["B"], self.spec["S"], self.spec["N"]
        for b in range(B):
            for s in range(S):
                for h in range(N):
                    r = self.row(b, s, h)
                    if r[2] is not None:
                        yield (b, s, h) + r

    def scores(self, b, s, h, k, start, c):
        """(x, bias, extra): the row's scores over keys k (alpha a . k, then
        _cases.score_features: softcap, attention bias), the bias added, and the softmax's
        extra logit (head_sink, 0 for smooth softmax, None)."""
        return score_features(self.inp, self.attrs, self.alpha * (k @ self.q[b, s, h]), b, s, h, start, c)

    def back(self, o, j):
        """A rotated-basis output row turned back by R_V^T."""
        return o if self.RV is None else self.RV[j].astype(np.float64) @ o


def reference(st):
    """(output [B, S, N, H], output_qk [B, N, S, T] or None, bound [B, S, N, H], qk bound or
    None): the statement's float64 output (and output_qk: scores, or probabilities, on each
    row's keys, 0 elsewhere) and how far level 0 may be from them (the module's bound)."""
    spec, B, S, N, H = st.spec, st.spec["B"], st.spec["S"], st.spec["N"], st.H
    T = st.xk.shape[2]
    qk_mode = st.attrs.get("qk_output", 0)
    out, bound = np.zeros((B, S, N, H)), np.zeros((B, S, N, H))
    qk = np.zeros((B, N, S, T)) if qk_mode else None
    qk_bound = np.zeros((B, N, S, T)) if qk_mode else None
    for b, s, h, start, c, flo, k, v, ek, ev, mk, mv in st.rows():
        x, bias, extra = st.scores(b, s, h, k, start, c)
        p, l = softmax(x, extra)
        o = st.back((p / l) @ v, h // st.G)
        out[b, s, h] = o
        aa, ea = np.abs(st.q[b, s, h]), st.eta_q[b, s, h]
        E = (st.alpha * (np.abs(k) @ ea + ek @ aa + (H + 8) * U * (mk @ (aa + ea)))
             + 12 * U * (np.abs(x) + np.abs(bias)))
        D, n, M = E.max(), c - start, mv.max()
        rb = M * np.expm1(2 * D) + np.exp(2 * D) * ((p / l) @ ev) + 2 * (n + 64) * U * (np.abs(o) + M)
        if st.RV is not None:
            Ra = np.abs(st.RV[h // st.G].astype(np.float64))
            rb = Ra @ rb + 2 * (H + 8) * U * M * Ra.sum(1)
        bound[b, s, h] = rb
        if qk_mode == 1:
            qk[b, h, s, start:c] = x
            qk_bound[b, h, s, start:c] = E
        elif qk_mode == 2:
            qk[b, h, s, start:c] = p / l
            qk_bound[b, h, s, start:c] = (p / l) * np.expm1(2 * D) + 2 * (n + 64) * U * p / l + TINY
    return out, qk, bound, qk_bound
