"""Mutations that turn a valid GroupQueryAttention call into an invalid one.

Each mutation takes (rng, inp, attrs, call, spec) -- copies it may modify -- and returns
(inp, attrs, call, names) where `names` lists the words of which the error message must
contain at least one (the argument mutated, or the argument it is checked against), or
None when it does not apply to this base call.  A mutation in MAYBE_VALID may produce a
valid call (e.g. a shape that happens to be a legal broadcast); there an accepted call is
not a failure, but it must still run cleanly.
"""
import numpy as np

FLOAT_INPUTS = ("query", "key", "value", "cos_cache", "sin_cache", "attention_bias", "head_sink")
ARRAY_INPUTS = FLOAT_INPUTS + ("past_key", "past_value", "seqlens_k", "position_ids", "k_scale",
                               "v_scale")
# what an off-by-one in each argument may be reported against
PARTNERS = {
    "query": ("query", "key", "value", "num_heads", "head_size", "seqlens_k", "sequence_length",
              "past_key", "batch_size", "attention_bias", "position_ids", "total_sequence_length"),
    "key": ("key", "value"), "value": ("key", "value"),
    "past_key": ("past_key", "past_value"), "past_value": ("past_key", "past_value"),
    "cos_cache": ("cos_cache", "sin_cache"), "sin_cache": ("cos_cache", "sin_cache"),
}


def _arrays(inp):
    return [n for n in ARRAY_INPUTS if isinstance(inp.get(n), np.ndarray)]


def _cache_dtype(spec):
    if spec["mode"] == "NONE":
        return np.dtype(np.float32 if spec["dtype"] == "f32" else np.float16)
    return np.dtype(np.int8 if spec["bits"] == 8 else np.uint8)


def m_dtype(rng, inp, a, call, spec):
    name = _arrays(inp)[int(rng.integers(len(_arrays(inp))))]
    x = inp[name]
    if name == "query":
        choices = [np.float64, np.int32]   # f32 <-> f16 is valid for a packed query alone
    elif name in FLOAT_INPUTS:
        choices = [np.float64, np.int32, np.float16 if x.dtype == np.float32 else np.float32]
    elif name in ("past_key", "past_value"):
        choices = [d for d in (np.int8, np.uint8, np.float32, np.float16, np.float64, np.int16)
                   if np.dtype(d) != x.dtype]
    elif name == "seqlens_k":
        choices = [np.int64, np.uint32, np.float32, np.int16]
    elif name == "position_ids":
        choices = [np.int32, np.uint64, np.float64]
    else:  # scales
        choices = [np.float64, np.float16, np.int32]
    dt = choices[int(rng.integers(len(choices)))]
    inp[name] = x.astype(dt)
    if name in ("past_key", "past_value"):
        call = {}
    names = (name,) + PARTNERS.get(name, ())
    if name == "query":
        names += FLOAT_INPUTS   # the others are checked against the query's dtype
    return inp, a, call, names


def m_off_by_one(rng, inp, a, call, spec):
    """One dimension of one array one too large or too small (one array of a pair only)."""
    name = _arrays(inp)[int(rng.integers(len(_arrays(inp))))]
    x = inp[name]
    if x.ndim == 0:
        return None
    d = int(rng.integers(x.ndim))
    delta = 1 if (rng.integers(2) or x.shape[d] == 0) else -1
    B, N = x.shape[0], a["num_heads"]
    if name == "position_ids" and d == 1 and delta == 1:
        return None                                  # longer position_ids are allowed
    if name in ("k_scale", "v_scale") and x.size + delta == 1 and x.size != 1:
        return None
    if name == "attention_bias" and d in (0, 1):
        full = spec["B"] if d == 0 else N
        if x.shape[d] + delta in (1, full):
            return None                               # a legal broadcast
    shape = list(x.shape)
    shape[d] += delta
    rng2 = np.random.default_rng(int(rng.integers(2 ** 31)))
    if delta < 0:
        y = x[tuple(slice(0, s) for s in shape)].copy()
    else:
        pad = [(0, 0)] * x.ndim
        pad[d] = (0, 1)
        y = np.pad(x, pad, mode="edge" if x.shape[d] else "constant")
    if name == "seqlens_k" and y.size > x.size:
        y[-1] = min(int(y[0]), 0)
    inp[name] = y
    if name in ("past_key", "past_value"):
        call = {}
    return inp, a, call, (name,) + PARTNERS.get(name, ())


def m_rank(rng, inp, a, call, spec):
    names = [n for n in _arrays(inp) if n not in ("k_scale", "v_scale")]
    name = names[int(rng.integers(len(names)))]
    x = inp[name]
    inp[name] = x[None] if rng.integers(2) or x.ndim < 2 else x[0]
    if name in ("past_key", "past_value"):
        call = {}
    return inp, a, call, (name,) + PARTNERS.get(name, ())


def m_seqlens_value(rng, inp, a, call, spec):
    sk = inp["seqlens_k"].copy()
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    Pbuf = inp["past_key"].shape[2]
    Pres = Pbuf if call else max(T, Pbuf)
    S = inp["query"].shape[1]
    bad = [-1, -2 ** 31, 2 ** 31 - 1, Pres, Pres + 1000, T]
    if S != T and S >= 2:
        bad.append(S - 2)                           # fewer rows than the new tokens
    b = int(rng.integers(len(sk)))
    v = bad[int(rng.integers(len(bad)))]
    if v == T and T < Pres and spec["phase"] != "prompt":
        v = Pres                                     # T <= sk < Pres is caught as sk + 1 > T
    sk[b] = v
    inp["seqlens_k"] = sk
    return inp, a, call, ("seqlens_k",)


def m_total_value(rng, inp, a, call, spec):
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    Tmax = int(inp["seqlens_k"].max()) + 1
    choices = [0, -1, -2 ** 31, Tmax - 1, 2 ** 31, 2 ** 63, 10 ** 30, True, 7.0, None, "7",
               np.array([T], np.int64), np.array([T, T], np.int32), np.array([], np.int32),
               np.float32(T)]
    if call:
        choices.append(inp["past_key"].shape[2] + 1)  # beyond the in-place buffer
    v = choices[int(rng.integers(len(choices)))]
    inp["total_sequence_length"] = v
    return inp, a, call, ("total_sequence_length", "seqlens_k")


def m_scale(rng, inp, a, call, spec):
    if spec["mode"] == "NONE":
        inp["k_scale" if rng.integers(2) else "v_scale"] = np.ones(1, np.float32)
        return inp, a, call, ("k_scale", "v_scale")
    name = "k_scale" if rng.integers(2) else "v_scale"
    x = inp[name]
    n = x.size
    choices = [np.ones(n + 1, np.float32), np.ones(max(n - 1, 0) if n > 1 else 0, np.float32),
               x.astype(np.float64), x.astype(np.float16), x.astype(np.int32), None, 0.5, [0.5],
               np.ones(2 * spec["Nkv"] * spec["H"], np.float32)]
    if n == 1:
        choices.append(np.ones(2, np.float32))
    inp[name] = choices[int(rng.integers(len(choices)))]
    return inp, a, call, (name,)


def m_scale_value(rng, inp, a, call, spec):
    """A NaN or infinite element in a well-formed k_scale / v_scale (refused on every call)."""
    if spec["mode"] == "NONE":
        return None
    name = "k_scale" if rng.integers(2) else "v_scale"
    x = inp[name].copy()
    x.reshape(-1)[int(rng.integers(x.size))] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
    inp[name] = x
    return inp, a, call, (name,)


def m_qk_norm(rng, inp, a, call, spec):
    """QK norm weights of the wrong kind, dtype or shape, or only one of the two."""
    H = spec["H"]
    dt = inp["query"].dtype
    good = np.ones(H, dt)
    bad = [None, np.ones(H + 8, dt), np.ones((1, H), dt), np.ones(H, np.float64), [1.0] * H]
    names = ["q_norm_weight", "k_norm_weight"]
    rng.shuffle(names)
    inp[names[0]] = good
    inp[names[1]] = bad[int(rng.integers(len(bad)))]
    return inp, a, call, tuple(names)


def m_attr(rng, inp, a, call, spec):
    N, Nkv = a["num_heads"], a["kv_num_heads"]
    options = [
        ("num_heads", [0, -1, N + 1 if (N + 1) % Nkv else N + 2, 2.0, True, "4", 2 ** 31]),
        ("kv_num_heads", [0, -2, N + 1, 1.0, None]),
        ("scale", ["x", None, True, float("nan"), float("inf")]),
        ("softcap", [-1.0, -1e-30, "1", None, float("inf")]),
        ("local_window_size", [-2, -(2 ** 31), 2 ** 31, 2 ** 63, 1.5, True]),
        ("causal", [2, -1, True, 1.0]),
        ("qk_output", [3, -1, 1.0]),
        ("accuracy_level", [5, -1, 4.0, True, "4", None]),
        ("k_quant_type", ["PER_GROUP", "", None, 8]),
        ("v_quant_type", ["PER_ROW", None]),
        ("kv_cache_bit_width", [6, 16, -8, 2, 8.0] if spec["mode"] != "NONE" else [4, 8]),
        ("k_cache_bit_width", [3, 6, -4, 16, 4.0, True] if spec["mode"] != "NONE" else [4, 2]),
        ("v_cache_bit_width", [1, -2, "8"] if spec["mode"] != "NONE" else [8]),
        ("do_rotary", [1.0, "1", 2, -1]),
        ("rotary_interleaved", [2, -1, True]),
        ("smooth_softmax", [None, 2, -2]),
        ("qk_norm_epsilon", [-1e-6, float("nan"), float("inf"), "1e-6", True]),
        ("sliding_window_cache", [2, -1, True, 1.0]),
        ("kv_quant_group_size", [-1, 1.5, True] + ([32] if spec["mode"] != "PER_GROUP" else [])),
        ("k_quant_rho", [0.0, 1.5, float("nan"), "1"]),
        ("v_quant_rho", [-0.5, True]),
        ("metadata_type", ["fp8", 16, "FP16"]),
        ("sink_size", [-1, 1.5, True] + ([4] if spec["mode"] == "NONE" else [])),
        ("recent_size", [-3, "2"]),
        ("window_partition", ["fixed", 1, None]),
    ]
    name, vals = options[int(rng.integers(len(options)))]
    v = vals[int(rng.integers(len(vals)))]
    a = dict(a)
    a[name] = v
    names = (name,)
    if name == "num_heads":
        names += ("kv_num_heads", "query", "head_size")
    if name == "kv_num_heads":
        names += ("num_heads", "key")
    if name == "v_quant_type" or name == "k_quant_type":
        names += ("quant",)
    if name == "kv_cache_bit_width":
        names += ("quant",)
    return inp, a, call, names


def m_threads(rng, inp, a, call, spec):
    v = [0, -1, 1.5, True, "2", 2 ** 31, 2 ** 64][int(rng.integers(7))]
    call = dict(call, num_threads=v)
    return inp, a, call, ("num_threads",)


def m_not_array(rng, inp, a, call, spec):
    name = _arrays(inp)[int(rng.integers(len(_arrays(inp))))]
    inp[name] = inp[name].tolist() if rng.integers(2) else memoryview(np.ascontiguousarray(inp[name]))
    if name in ("past_key", "past_value"):
        call = {}
    return inp, a, call, (name,) + PARTNERS.get(name, ())


def m_missing(rng, inp, a, call, spec):
    opts = ["query", "seqlens_k", "total_sequence_length", "key", "past_key", "sin_cache"]
    if spec["mode"] != "NONE":
        opts += ["k_scale", "v_scale"]
    name = opts[int(rng.integers(len(opts)))]
    if name == "sin_cache" and inp.get("cos_cache") is None:
        inp["cos_cache"] = np.zeros((64, 8), inp["query"].dtype)
    if name == "key" and inp.get("key") is None:
        inp["key"] = inp["query"][..., :0]            # packed QKV given a key but no value
        return inp, a, call, ("key", "value")
    if name == "past_key" and call:
        call = {}
    inp[name] = None
    return inp, a, call, (name,) + PARTNERS.get(name, ()) + {
        "key": ("head_size", "num_heads"), "total_sequence_length": ()}.get(name, ())


def _bad_layout(rng, x, how):
    if how == "noncontiguous":
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1] + 1,), x.dtype)
        y = big[..., ::2][..., :x.shape[-1]] if x.shape[-1] else big[..., :0]
        y[...] = x
        return y
    if how == "readonly":
        y = x.copy()
        y.flags.writeable = False
        return y
    if how == "unaligned":
        buf = bytearray(x.nbytes + 8)
        y = np.frombuffer(buf, x.dtype, count=x.size, offset=1).reshape(x.shape)
        y[...] = x
        return y
    if how == "fortran":
        return np.asfortranarray(x)
    raise KeyError(how)


def m_present_layout(rng, inp, a, call, spec, inplace=False):
    """present buffers (or, in-place, the shared past buffers) that cannot be written."""
    hows = ["noncontiguous", "readonly"] + (["unaligned"] if _cache_dtype(spec).itemsize > 1 else []) + \
        ["fortran"]
    how = hows[int(rng.integers(len(hows)))]
    which = "key" if rng.integers(2) else "value"
    if inplace:
        if not call:
            return None
        x = inp["past_" + which]
        if how == "fortran" and (x.flags.c_contiguous and x.flags.f_contiguous):
            return None
        y = _bad_layout(rng, x, how)
        inp["past_" + which] = y
        call = dict(present_key=inp["past_key"], present_value=inp["past_value"])
        return inp, a, call, ("past_" + which,)
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    shape = (spec["B"], spec["Nkv"], max(T, inp["past_key"].shape[2])) + inp["past_key"].shape[3:]
    pk, pv = np.ones(shape, inp["past_key"].dtype), np.ones(shape, inp["past_key"].dtype)
    bad = _bad_layout(rng, pk if which == "key" else pv, how)
    if how == "fortran" and bad.flags.c_contiguous:
        return None
    call = dict(present_key=bad if which == "key" else pk, present_value=bad if which == "value" else pv)
    return inp, a, call, ("present_" + which,)


def m_inplace_layout(rng, inp, a, call, spec):
    return m_present_layout(rng, inp, a, call, spec, inplace=True)


def m_cache_type(rng, inp, a, call, spec):
    """Past (both) or present (both) of the wrong dtype or packed width."""
    dt = _cache_dtype(spec)
    x = inp["past_key"]
    H = spec["H"]
    widths = {H, H // 2, H + 1, (H + 1) // 2 + 1, H * 2} - {x.shape[3]}
    dts = [d for d in (np.int8, np.uint8, np.float32, np.float16) if np.dtype(d) != dt]
    target = "past" if rng.integers(2) else "present"
    if rng.integers(2):
        shape, d = x.shape[:3] + (sorted(widths)[int(rng.integers(len(widths)))],), dt
    else:
        shape, d = x.shape, np.dtype(dts[int(rng.integers(len(dts)))])
    if target == "past":
        inp["past_key"], inp["past_value"] = np.zeros(shape, d), np.zeros(shape, d)
        return inp, a, {}, ("past_key", "past_value")
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    shape = (shape[0], shape[1], max(T, x.shape[2]), shape[3])
    return inp, a, dict(present_key=np.zeros(shape, d), present_value=np.zeros(shape, d)), \
        ("present_key", "present_value")


def m_alias(rng, inp, a, call, spec):
    """present_* aliasing the inputs (or each other) in the ways that must be refused."""
    dt = _cache_dtype(spec)
    T = int(np.asarray(inp["total_sequence_length"]).reshape(-1)[0])
    pshape = inp["past_key"].shape[:2] + (max(T, inp["past_key"].shape[2]),) + inp["past_key"].shape[3:]
    fresh = lambda: np.zeros(pshape, dt)
    kind = ["same_array", "half_inplace_k", "half_inplace_v", "swapped", "view_of_past", "overlap_input",
            "inplace_overlap_input", "inplace_same_buffer"][int(rng.integers(8))]
    names = ("present_key", "present_value", "in-place", "overlap")
    if kind == "same_array":
        p = fresh()
        return inp, a, dict(present_key=p, present_value=p), names
    if kind == "half_inplace_k":
        return inp, a, dict(present_key=inp["past_key"], present_value=fresh()), names
    if kind == "half_inplace_v":
        return inp, a, dict(present_key=fresh(), present_value=inp["past_value"]), names
    if kind == "swapped":
        if inp["past_key"].shape != pshape:
            return None
        return inp, a, dict(present_key=inp["past_value"], present_value=inp["past_key"]), names
    if kind == "view_of_past":
        if inp["past_key"].shape != pshape or inp["past_key"].size == 0:
            return None
        return inp, a, dict(present_key=inp["past_key"][...], present_value=fresh()), names
    # an input living in the same memory as a present / in-place buffer
    targets = [n for n in _arrays(inp) if n not in ("past_key", "past_value") and inp[n].size]
    name = targets[int(rng.integers(len(targets)))]
    x = inp[name]
    if kind == "inplace_same_buffer":
        if not call:
            return None
        return inp, a, dict(present_key=inp["past_key"], present_value=inp["past_key"]) if rng.integers(2) \
            else dict(present_key=inp["past_value"], present_value=inp["past_value"]), \
            names + ("past_key", "past_value")
    if kind == "inplace_overlap_input":
        if not call:
            return None
        cache = inp["past_key" if rng.integers(2) else "past_value"]
        raw = cache.view(np.uint8).reshape(-1)
        # the input's bytes placed over the rows this call writes (row T_b - 1 of batch 0)
        b0 = cache[0, 0, int(inp["seqlens_k"][0])].view(np.uint8)
        start = b0.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
        nbytes = x.nbytes
        if start + nbytes > raw.size:
            start = max(0, raw.size - nbytes)
        if nbytes > raw.size or nbytes == 0 or x.dtype.itemsize > 1 and start % x.dtype.itemsize:
            return None
        alias = raw[start:start + nbytes].view(x.dtype).reshape(x.shape)
        alias[...] = x
        inp[name] = alias
        return inp, a, call, names + ("past_key", "past_value", name)
    # overlap_input: a (non-in-place) present buffer overlapping an input's memory
    p = fresh()
    raw = p.view(np.uint8).reshape(-1)
    if x.nbytes > raw.size or x.nbytes == 0:
        return None
    alias = raw[:x.nbytes].view(x.dtype).reshape(x.shape)
    alias[...] = x
    inp[name] = alias
    return inp, a, dict(present_key=p, present_value=fresh()), names


def _head_size(inp, a):
    if inp.get("key") is not None:
        return inp["key"].shape[2] // a["kv_num_heads"]
    return inp["query"].shape[2] // (a["num_heads"] + 2 * a["kv_num_heads"])


def m_ext(rng, inp, a, call, spec):
    """The inputs beyond onnxruntime 1.31.1: float windows without sink_size / recent_size,
    rotations of the wrong shape, dtype or kind."""
    B, Nkv, H = inp["query"].shape[0], a["kv_num_heads"], _head_size(inp, a)
    kind = int(rng.integers(4))
    if kind == 0:
        hp = np.zeros((B, Nkv, 2, H), np.float32)
        inp.update(past_hp_key=hp, past_hp_value=hp.copy())
        return inp, a, call, ("past_hp_key", "sink_size")
    name = ("oscar_rotation_k", "oscar_rotation_v")[int(rng.integers(2))]
    r = np.broadcast_to(np.eye(H, dtype=np.float32), (Nkv, H, H)).copy()
    if kind == 1:
        r = r[:, :, :H - 1] if rng.integers(2) else r[:max(Nkv - 1, 0)]
    elif kind == 2:
        r = r.astype(np.int32 if rng.integers(2) else np.float64)
    else:
        r = r.tolist()
    inp[name] = r
    return inp, a, call, (name,)


MUTATIONS = {
    "dtype": m_dtype, "off_by_one": m_off_by_one, "rank": m_rank, "seqlens_value": m_seqlens_value,
    "total_value": m_total_value, "scale": m_scale, "scale_value": m_scale_value, "qk_norm": m_qk_norm,
    "attr": m_attr, "threads": m_threads,
    "not_array": m_not_array, "missing": m_missing, "present_layout": m_present_layout,
    "inplace_layout": m_inplace_layout, "cache_type": m_cache_type, "alias": m_alias,
    "ext": m_ext,
}
# mutations whose result may happen to be a valid call on some bases
MAYBE_VALID = {"off_by_one"}
