"""Seeded GroupQueryAttention cases: inputs in ONNX names, attributes, and a float64
NumPy reference of the attention math on the (dequantized) present caches."""
import numpy as np


def make_case(seed=0, B=1, S=4, past=0, N=4, Nkv=2, H=16, mode="PER_TENSOR", v_mode=None, bits=8,
              dtype=np.float32, buf=None, ragged=None, packed=False, rotary=None, interleaved=0,
              rot_dim=None, pos_ids=False, bias=None, sink=False, v_bits=None, **attrs):
    """past: rows already cached per batch (decode / subsequent prompt when > 0);
    v_bits: V's code width when it differs from K's (`bits`; attribute v_cache_bit_width);
    ragged: per-batch total lengths (first prompt: <= S; decode: past_b + S);
    buf: past buffer length (>= max past); bias: None | 'full' | 'b1' | 'n1' | 'both1'."""
    rng = np.random.default_rng(seed)
    v_mode = v_mode or mode
    quant = mode != "NONE"
    if ragged is not None:
        Tb = np.array(ragged)
    else:
        Tb = np.full(B, past + S)
    T = int(Tb.max()) if past else S
    first = past == 0
    P = buf if buf is not None else (0 if first else int((Tb - S).max()))
    u = lambda *shape: rng.uniform(-0.5, 0.5, shape).astype(dtype)
    inp = {}
    if packed:
        inp["query"] = u(B, S, (N + 2 * Nkv) * H)
    else:
        inp.update(query=u(B, S, N * H), key=u(B, S, Nkv * H), value=u(B, S, Nkv * H))
    if quant:
        def codes(b):
            if b == 8:
                return rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8)
            return rng.integers(0, 256, (B, Nkv, P, (H + 1) // 2)).astype(np.uint8)
        pk = codes(bits)
        pv = codes(v_bits or bits)
        nk = Nkv * H if mode == "PER_CHANNEL" else 1
        nv = Nkv * H if v_mode == "PER_CHANNEL" else 1
        inp["k_scale"] = rng.uniform(0.002, 0.006, nk).astype(np.float32)
        inp["v_scale"] = rng.uniform(0.002, 0.006, nv).astype(np.float32)
    else:
        pk, pv = u(B, Nkv, P, H), u(B, Nkv, P, H)
    inp.update(past_key=pk, past_value=pv, seqlens_k=(Tb - 1).astype(np.int32), total_sequence_length=T)
    a = dict(num_heads=N, kv_num_heads=Nkv, **attrs)
    if quant:
        a.update(k_quant_type=mode, v_quant_type=v_mode, kv_cache_bit_width=bits)
        if v_bits and v_bits != bits:
            a["v_cache_bit_width"] = v_bits
    if rotary:
        rd = rot_dim or H
        max_pos = T + 5
        ang = rng.uniform(0, 2 * np.pi, (max_pos, rd // 2))
        inp["cos_cache"] = np.cos(ang).astype(dtype)
        inp["sin_cache"] = np.sin(ang).astype(dtype)
        a.update(do_rotary=1, rotary_interleaved=interleaved)
        if pos_ids:
            if first:
                inp["position_ids"] = np.tile(np.arange(S, dtype=np.int64) + 2, (B, 1))
            else:
                inp["position_ids"] = (Tb[:, None] - S + np.arange(S)[None, :]).astype(np.int64)
    if bias:
        bb = 1 if bias in ("b1", "both1") else B
        bn = 1 if bias in ("n1", "both1") else N
        inp["attention_bias"] = rng.uniform(-1, 1, (bb, bn, S, T)).astype(dtype)
    if sink:
        inp["head_sink"] = rng.uniform(-1, 1, N).astype(dtype)
    return inp, a


def dequant_cache(c, scale, mode, bits, H, Nkv):
    """float64 [B, Nkv, L, H] from a present cache (codes or float)."""
    if mode == "NONE":
        return c.astype(np.float64)
    if bits == 8:
        q = c.astype(np.float64)
    else:
        q = np.stack([c & 15, c >> 4], -1).reshape(c.shape[:-1] + (-1,))[..., :H].astype(np.float64) - 8
    s = scale.astype(np.float64).reshape(-1)
    s = s.reshape(1, Nkv, 1, H) if s.size > 1 else s[0]
    return q * s


def row_position(inp, b, s):
    """The key position of query row s of batch b: s in a first prompt (S ==
    total_sequence_length), T_b - S + s after it (T_b = seqlens_k[b] + 1)."""
    S = inp["query"].shape[1]
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    return s if S == T else int(inp["seqlens_k"][b]) + 1 - S + s


def rotary_positions(inp):
    """[B, S] the position each query row is rotated at: position_ids where given, else its
    row_position."""
    if inp.get("position_ids") is not None:
        return np.asarray(inp["position_ids"], np.int64)
    B, S = inp["query"].shape[:2]
    return np.array([[row_position(inp, b, s) for s in range(S)] for b in range(B)], np.int64)


def rotate(x, inp, a):
    """x [B, S, n, H] (float64) rotated as rotary embedding rotates it: over the first d = 2 *
    cos_cache.shape[1] columns, pairs (i, i + d/2), or (2i, 2i + 1) when rotary_interleaved,
    by the angle whose cos / sin the caches hold at the row's rotary_positions."""
    pos = rotary_positions(inp)
    cos = inp["cos_cache"].astype(np.float64)[pos][:, :, None, :]
    sin = inp["sin_cache"].astype(np.float64)[pos][:, :, None, :]
    d = 2 * cos.shape[-1]
    i1, i2 = ((slice(0, d, 2), slice(1, d, 2)) if a.get("rotary_interleaved", 0)
              else (slice(0, d // 2), slice(d // 2, d)))
    y = np.array(x, np.float64)
    y[..., i1] = x[..., i1] * cos - x[..., i2] * sin
    y[..., i2] = x[..., i2] * cos + x[..., i1] * sin
    return y


def window_counts(T, sink, recent):
    """(ns, nr): the float windows of T positions hold positions [0, ns) and [T - nr, T)."""
    ns = min(sink, T)
    return ns, min(recent, T - ns)


def float_positions(partition, sink, recent, Tb, end):
    """Which keys [0, end) a query row whose keys end at `end` reads from the float windows of
    a sequence of Tb positions (README, "Float windows"): "causal", the row's own windows (those
    of its first `end` positions); "per_call", the call's (those of all Tb)."""
    last = end if partition == "causal" else Tb
    ns, nr = window_counts(last, sink, recent)
    flo = np.zeros(end, bool)
    flo[:ns] = True
    flo[last - nr:end] = True
    return flo


def key_range(inp, a, b, s):
    """[start, end) of the key positions query row s of batch b attends: causal (or all T_b
    keys when causal = 0), within local_window_size of the row's own position."""
    Tb = int(inp["seqlens_k"][b]) + 1
    e = row_position(inp, b, s) + 1 if a.get("causal", 1) else Tb
    W = a.get("local_window_size", -1)
    return (max(e - W, 0) if W >= 0 else 0), min(e, Tb)


def query_rows(inp, a, H):
    """The query [B, S, N, H] in float64 as attention reads it (rotated when do_rotary)."""
    N = a["num_heads"]
    q = inp["query"].astype(np.float64)
    q = q[..., :N * H].reshape(q.shape[0], q.shape[1], N, H)
    return rotate(q, inp, a) if a.get("do_rotary", 0) else q


def score_features(inp, a, x, b, s, h, start, c):
    """(x, bias, extra): raw scores x of query row (b, s, h) over keys [start, c) through
    softcap, then attention_bias (bias: the terms added, 0 without it), and the extra logit of
    the softmax's denominator (head_sink, or 0 for smooth_softmax; None without either)."""
    sc = a.get("softcap", 0.0)
    if sc > 0:
        x = sc * np.tanh(x / sc)
    bias = np.zeros(c - start)
    if inp.get("attention_bias") is not None:
        ab = inp["attention_bias"]
        bias = ab[min(b, ab.shape[0] - 1), min(h, ab.shape[1] - 1), s, start:c].astype(np.float64)
    extra = None
    if inp.get("head_sink") is not None:
        extra = float(inp["head_sink"][h])
    elif a.get("smooth_softmax", -1) == 1:
        extra = 0.0
    return x + bias, bias, extra


def softmax(x, extra):
    """(p, l): exp(x - m) over a row's scores x and their total l, with the extra logit's
    term (m: the largest of x and the extra logit)."""
    m = x.max() if extra is None else max(x.max(), extra)
    p = np.exp(x - m)
    return p, p.sum() + (0.0 if extra is None else np.exp(extra - m))


def scores(inp, a, q, kd, b, s, h):
    """(x, sink): float64 scores of query row (b, s, h) over its key_range of kd [B,Nkv,*,H]
    (scale, then score_features), and the softmax's extra logit (or None)."""
    H = kd.shape[-1]
    start, c = key_range(inp, a, b, s)
    scale = a.get("scale", 0.0) or 1.0 / np.sqrt(np.float32(H))
    x = scale * kd[b, h // (a["num_heads"] // a["kv_num_heads"]), start:c] @ q[b, s, h]
    x, _, sink = score_features(inp, a, x, b, s, h, start, c)
    return x, sink


def reference(inp, a, kd, vd):
    """float64 attention of the query (rotated when do_rotary) over dequantized caches kd/vd
    [B,Nkv,*,H] (the present caches: keys already rotated).
    Supports causal/window/softcap/bias/smooth/sink/scale/packed/rotary."""
    N, Nkv = a["num_heads"], a["kv_num_heads"]
    H = kd.shape[-1]
    q = query_rows(inp, a, H)
    B, S = q.shape[:2]
    G = N // Nkv
    out = np.zeros((B, S, N, H))
    for b in range(B):
        for h in range(N):
            for s in range(S):
                start, c = key_range(inp, a, b, s)
                if c <= start:
                    continue
                p, l = softmax(*scores(inp, a, q, kd, b, s, h))
                out[b, s, h] = (p / l) @ vd[b, h // G, start:c]
    return out.reshape(B, S, N * H)
