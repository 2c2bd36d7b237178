"""The cases of ``python -m gqa bench``: one call's inputs for every side (the ort-naive
subprocess rebuilds them from the spec), its FLOPs and cache bytes, and gqa's two forms (the
kept operator and the function)."""
import numpy as np

import gqa


# the modes every peer computes (onnxruntime 1.31.1, PyTorch, ggml); gqa takes any mode
PEER_MODES = ("int8-pt", "int4-pt", "int8-pc", "float")
# earlier spellings of --modes
LEGACY_NAMES = {"s8_pt": "int8-pt", "s4_pt": "int4-pt", "s8_pc": "int8-pc", "f32": "float",
                "int8": "int8-pt", "int4": "int4-pt", "none": "float"}


SEED_SHAPE = (1, 16, 8, 128)


# --shape real: the seed and the attention heads of real models (N, Nkv, H): SmolLM2-135M,
# Llama-3.2-1B / Qwen-style, 12/4/64, small GQA, multi-query
REAL_SHAPES = [SEED_SHAPE, (1, 9, 3, 64), (1, 32, 8, 64), (1, 12, 4, 64), (1, 8, 2, 64), (1, 8, 1, 256)]


def flops(spec):
    """Useful FLOPs of one call: QK and PV, 2*B*N*S*T*H each; a causal prefill attends to
    half the square, so S = T gives 2*B*N*S^2*H."""
    B, N, H, S, T = spec["B"], spec["N"], spec["H"], spec["S"], spec["T"]
    if spec["phase"] == "prefill":
        return 2.0 * B * N * S * S * H
    return 4.0 * B * N * S * T * H


def _side_cache(rng, mode, B, Nkv, T, H):
    """One tensor's cache of capacity T in a one-tensor mode (codes of values |x| <= 0.5, like
    the new rows') and its static scale (None for float and per-group caches)."""
    f = gqa.CacheFormat.parse(mode)
    bits = f.bits
    if f.grouped:
        return gqa.quantize(rng.uniform(-0.5, 0.5, (B, Nkv, T, H)).astype(np.float32), bits=bits,
                            group_size=f.group, metadata=f.metadata), None
    if bits == 0:
        return rng.uniform(-0.5, 0.5, (B, Nkv, T, H)).astype(np.float32), None
    if bits == 8:
        cache = rng.integers(-128, 128, (B, Nkv, T, H)).astype(np.int8)
    else:
        cache = rng.integers(0, 256, (B, Nkv, T, H // 2)).astype(np.uint8)
    n = Nkv * H if f.per_channel else 1
    # scales that cover the new rows' range (|x| <= 0.5), as a calibrated cache would
    return cache, np.full(n, 0.5 / f.top_code, np.float32) * rng.uniform(0.9, 1.1, n).astype(np.float32)


def window_rows(spec):
    """Rows of each float window buffer of a case ([B, Nkv, rows, H], float32): the
    configuration's sink + recent positions, at most T (0: no windows)."""
    o = gqa.cache_options(spec["mode"])
    return min(o.get("sink_size", 0) + o.get("recent_size", 0), spec["T"])


def build_inputs(spec):
    """Deterministic inputs of one case: query/key/value of the new rows, caches of capacity T
    already holding T - S rows (in-place mode: seqlens_k = T - 1), and the operator's
    attributes.  The mode is a configuration (gqa.cache_options: K's and V's caches may
    differ; +s<sink>r<recent> float windows, updated in place like KVCache's; +had the
    Hadamard rotations; +rho)."""
    B, N, Nkv, H, S, T = (spec[k] for k in ("B", "N", "Nkv", "H", "S", "T"))
    opts = gqa.cache_options(spec["mode"])
    k_mode, v_mode = (f.name for f in gqa.parse_mode(opts["mode"]))
    rng = np.random.default_rng(spec.get("seed", 0))
    u = lambda *shape: rng.uniform(-0.5, 0.5, shape).astype(np.float32)  # noqa: E731
    inp = dict(query=u(B, S, N * H), key=u(B, S, Nkv * H), value=u(B, S, Nkv * H))
    kc, ks = _side_cache(rng, k_mode, B, Nkv, T, H)
    vc, vs = _side_cache(rng, v_mode, B, Nkv, T, H)
    if ks is not None:
        inp["k_scale"] = ks
    if vs is not None:
        inp["v_scale"] = vs
    inp.update(past_key=kc, past_value=vc, seqlens_k=np.full(B, T - 1, np.int32), total_sequence_length=T)
    attrs = dict(num_heads=N, kv_num_heads=Nkv,
                 **gqa.operator_attributes(opts["mode"], opts.get("k_rho", 1.0), opts.get("v_rho", 1.0)))
    rows = window_rows(spec)
    if rows:
        attrs.update(sink_size=opts["sink_size"], recent_size=opts["recent_size"])
        inp.update(past_hp_key=u(B, Nkv, rows, H), past_hp_value=u(B, Nkv, rows, H))
    if opts.get("rotations") == "hadamard":
        inp["oscar_rotation_k"] = inp["oscar_rotation_v"] = gqa.oscar_rotation(None, H, Nkv)
    return inp, attrs


def ours(spec, function=False, level=None):
    """gqa's call of a case: a kept operator, or (function) gqa.group_query_attention; `level`:
    the operator's own accuracy_level attribute (None: the run's configured level)."""
    inp, attrs = build_inputs(spec)
    if level is not None:
        attrs = dict(attrs, accuracy_level=level)
    kc, vc = inp["past_key"], inp["past_value"]
    q, k, v, sl, T = (inp[n] for n in ("query", "key", "value", "seqlens_k", "total_sequence_length"))
    ks, vs, nt = inp.get("k_scale"), inp.get("v_scale"), spec["threads"]
    # windows and rotations: the windows in place (past = present), as KVCache passes them
    ext = {n: inp[n] for n in ("past_hp_key", "past_hp_value", "oscar_rotation_k", "oscar_rotation_v")
           if n in inp}
    if "past_hp_key" in inp:
        ext.update(present_hp_key=inp["past_hp_key"], present_hp_value=inp["past_hp_value"])
    if function:
        f = gqa.group_query_attention
        return lambda: f(q, k, v, kc, vc, sl, T, k_scale=ks, v_scale=vs, present_key=kc,
                         present_value=vc, num_threads=nt, **ext, **attrs)
    op = gqa.GroupQueryAttention(**attrs)
    return lambda: op(q, k, v, kc, vc, sl, T, k_scale=ks, v_scale=vs, present_key=kc,
                      present_value=vc, num_threads=nt, **ext)


def ours_function(spec):
    return ours(spec, function=True)


def ours_at(level):
    """gqa's kept operator with its own accuracy_level attribute `level` (bench --vs-level)."""
    return lambda spec: ours(spec, level=level)


def cache_bytes(spec):
    """Bytes of K and V cache one decode call reads (T positions of every KV head: the float
    windows' rows, float32, and the other positions' codes)."""
    row = 0
    for f in gqa.parse_mode(gqa.cache_options(spec["mode"])["mode"]):
        width, dtype = f.layout(spec["H"])
        row += width * dtype.itemsize
    rows = window_rows(spec)
    return spec["B"] * spec["Nkv"] * ((spec["T"] - rows) * row + rows * 2 * 4 * spec["H"])
