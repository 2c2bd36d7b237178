"""Mutations that turn a valid call of the newer surface (_newer_cases.build) into an invalid
one: window sizes near and past 2^31, float-window buffers of the wrong rows, kind or layout,
any caller buffer the call writes aliasing any other argument (every pair), non-finite or
non-orthogonal rotations, non-finite QK-norm weights and rotary caches, per-group attributes
and cache widths, lengths near 2^31.

Each takes (rng, cls, attrs, inp, call, spec, guard) -- copies it may modify -- and returns
(cls, attrs, inp, call, words): `words` are those of which the error message must contain at
least one; None when it does not apply to this base call.  A mutation in MAYBE_VALID may
produce a valid call: accepted, it must still run cleanly (finite output, canaries intact).
"""
import numpy as np

from _newer_cases import lengths, orthogonal, side_type

INT32_MAX = 2 ** 31 - 1
WINDOW_WORDS = ("sink_size", "recent_size", "past_hp_key", "past_hp_value", "present_hp_key",
                "present_hp_value")
# the arguments a call writes: caches (in place, the past ones) and float windows
WRITTEN = ("present_key", "present_value", "present_hp_key", "present_hp_value")


def _pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def _win(spec):
    return spec["sink"] + spec["recent"] > 0


def m_window_sizes(rng, cls, attrs, inp, call, spec, g):
    """sink_size / recent_size at and past the C int range, whatever buffers are given."""
    sizes = _pick(rng, [(INT32_MAX, 1), (INT32_MAX, INT32_MAX), (2 ** 30, 2 ** 30),
                        (1, INT32_MAX), (2 ** 31, 0), (0, 2 ** 32), (-1, 2), (3, -(2 ** 31)),
                        (INT32_MAX - 1, 1), (INT32_MAX, 0)])
    attrs = dict(attrs, sink_size=sizes[0], recent_size=sizes[1])
    return cls, attrs, inp, call, WINDOW_WORDS


def m_window_buffers(rng, cls, attrs, inp, call, spec, g):
    """Float windows of too few rows, the wrong dtype, head size or batch, only one of a pair,
    half in place, unwritable present windows, or windows without sink_size / recent_size."""
    if not _win(spec):
        if "past_key" not in inp:
            return None
        hp = np.zeros(inp["past_key"].shape[:2] + (2, spec["H"]), inp["query"].dtype)
        return cls, attrs, dict(inp, past_hp_key=hp, past_hp_value=hp.copy()), call, WINDOW_WORDS
    kind = _pick(rng, ["few_past", "few_present", "dtype", "head", "batch", "one", "half_inplace",
                       "readonly", "noncontiguous", "zero_sizes"])
    dt = inp["query"].dtype
    if kind == "few_past":
        if "past_hp_key" not in inp:
            return None
        phk = inp["past_hp_key"]
        need = min(spec["past"], spec["sink"] + spec["recent"])
        short = g.array(phk[:, :, :need - 1].copy())
        shortv = g.array(inp["past_hp_value"][:, :, :need - 1].copy())
        inp = dict(inp, past_hp_key=short, past_hp_value=shortv)
        if call.get("present_hp_key") is phk:
            call = dict(call, present_hp_key=short, present_hp_value=shortv)
        return cls, attrs, inp, call, WINDOW_WORDS
    if kind == "few_present":
        need = min(int(lengths(spec).max()), spec["sink"] + spec["recent"])   # the longest batch's
        shape = (spec["B"], spec["Nkv"], need - 1, spec["H"])
        if call.get("present_hp_key") is not None and call["present_hp_key"] is inp.get("past_hp_key"):
            return None      # in place: few_past
        return cls, attrs, inp, dict(call, present_hp_key=g.empty(shape, dt),
                                     present_hp_value=g.empty(shape, dt)), WINDOW_WORDS
    if kind == "zero_sizes":
        if not any(k in inp or k in call for k in ("past_hp_key", "present_hp_key")):
            return None
        return cls, dict(attrs, sink_size=0, recent_size=0), inp, call, WINDOW_WORDS
    names = [n for n in ("past_hp_key", "past_hp_value") if n in inp] + [
        n for n in ("present_hp_key", "present_hp_value") if n in call]
    if not names:
        return None
    name = _pick(rng, names)
    x = inp.get(name, call.get(name))
    where = inp if name in inp else call
    if kind == "one":
        where = dict(where)
        del where[name]
        return (cls, attrs, where, call, WINDOW_WORDS) if where is not call else \
            (cls, attrs, inp, where, WINDOW_WORDS)
    if kind == "half_inplace":
        if "past_hp_key" not in inp:
            return None
        return cls, attrs, inp, dict(call, present_hp_key=inp["past_hp_key"],
                                     present_hp_value=g.array(inp["past_hp_value"].copy())), WINDOW_WORDS
    if kind in ("dtype", "head", "batch"):
        if kind == "dtype":
            y = g.array(x.astype(np.float16 if x.dtype == np.float32 else np.float32))
        elif kind == "head":
            y = g.empty(x.shape[:3] + (x.shape[3] + 8,), x.dtype)
        else:
            y = g.empty((x.shape[0] + 1,) + x.shape[1:], x.dtype)
    elif kind == "readonly":
        if name.startswith("past") and call.get("present_hp_key") is not inp.get("past_hp_key"):
            return None      # a past window that is only read may be read-only
        y = g.array(x.copy())
        y.flags.writeable = False
    else:    # noncontiguous: a written window must be C-contiguous
        if name.startswith("past") and call.get("present_hp_key") is not inp.get("past_hp_key"):
            return None
        big = g.empty(x.shape[:3] + (2 * x.shape[3],), x.dtype)
        y = big[..., ::2]
        y[...] = x
    inp, call = _replace(inp, call, x, y)
    return cls, attrs, inp, call, (name,) + WINDOW_WORDS


def _replace(inp, call, old, new):
    """Every reference to array `old` (an in-place pair shares one) replaced by `new`."""
    inp = {k: (new if v is old else v) for k, v in inp.items()}
    call = {k: (new if v is old else v) for k, v in call.items()}
    return inp, call


def m_alias(rng, cls, attrs, inp, call, spec, g):
    """Any argument placed in the memory of a buffer the call writes (caches in place or
    present, float windows in place or present): refused, whichever the pair."""
    written = [n for n in WRITTEN if isinstance(call.get(n), np.ndarray)]
    if not written:
        return None
    wname = _pick(rng, written)
    w = call[wname]
    others = [(n, x) for n, x in list(inp.items()) + list(call.items())
              if isinstance(x, np.ndarray) and x is not w and x.size]
    if not others:
        return None
    oname, x = _pick(rng, others)
    raw = w.view(np.uint8).reshape(-1)
    if x.nbytes > raw.size:
        return None
    item = x.dtype.itemsize
    start = int(rng.integers(0, (raw.size - x.nbytes) // item + 1)) * item
    alias = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    alias[...] = x
    inp, call = _replace(inp, call, x, alias)
    return cls, attrs, inp, call, ("overlap",)


def m_rotation_value(rng, cls, attrs, inp, call, spec, g):
    """A rotation with a NaN or infinity, or not orthogonal (random, zero, scaled, perturbed
    beyond the tolerance, a reflection's half)."""
    name = _pick(rng, ["oscar_rotation_k", "oscar_rotation_v"])
    Nkv, H = spec["Nkv"], spec["H"]
    r = inp.get(name)
    if r is None:
        r = orthogonal(rng, Nkv, H)
    r = r.copy()
    kind = _pick(rng, ["nan", "inf", "random", "zero", "scaled", "perturbed", "identity_plus"])
    j = int(rng.integers(Nkv))
    if kind in ("nan", "inf"):
        r[j, int(rng.integers(H)), int(rng.integers(H))] = np.nan if kind == "nan" else -np.inf
    elif kind == "random":
        r[j] = rng.standard_normal((H, H))
    elif kind == "zero":
        r[j] = 0
    elif kind == "scaled":
        r[j] *= _pick(rng, [2.0, 0.5, 1.01])
    elif kind == "perturbed":
        r[j, int(rng.integers(H)), int(rng.integers(H))] += _pick(rng, [0.05, -0.2, 1.0])
    else:
        r[j] = np.eye(H) + 0.1
    return cls, attrs, dict(inp, **{name: r}), call, (name,)


def m_norm_value(rng, cls, attrs, inp, call, spec, g):
    """A NaN or infinite QK-norm weight."""
    dt, H = inp["query"].dtype, spec["H"]
    q = inp.get("q_norm_weight", np.ones(H, dt)).copy()
    k = inp.get("k_norm_weight", np.ones(H, dt)).copy()
    name = _pick(rng, ["q_norm_weight", "k_norm_weight"])
    x = q if name == "q_norm_weight" else k
    x[int(rng.integers(H))] = _pick(rng, [np.nan, np.inf, -np.inf])
    return cls, attrs, dict(inp, q_norm_weight=q, k_norm_weight=k), call, (name,)


def m_rotary_value(rng, cls, attrs, inp, call, spec, g):
    """A NaN or infinity in the rotary caches (multiplied into the keys written)."""
    if not spec["rotary"]:
        return None
    name = _pick(rng, ["cos_cache", "sin_cache"])
    x = inp[name].copy()
    x.reshape(-1)[int(rng.integers(x.size))] = _pick(rng, [np.nan, np.inf])
    return cls, attrs, dict(inp, **{name: x}), call, (name,)


def m_group_attrs(rng, cls, attrs, inp, call, spec, g):
    """Per-group attributes out of their domain (or given where they do not apply)."""
    H = spec["H"]
    options = [
        ("kv_quant_group_size", [5, H + 8, 7, -1, 2 ** 31, 2 ** 40, 1.5, True]),
        ("k_cache_bit_width", [3, 1, 16, -4, 2 ** 31, 4.0]),
        ("v_cache_bit_width", [6, 0.5, "4"]),
        ("kv_cache_bit_width", [5, 16, -2]),
        ("metadata_type", ["bf16", "fp8", 16, None]),
        ("k_quant_rho", [1e-50, 0.0, -0.5, 1.5, float("nan"), float("inf"), None, "0.9"]),
        ("v_quant_rho", [5e-46, 2.0, True]),
        ("window_partition", ["fixed", "", None, 1]),
    ]
    if cls == "mixed":
        options += [("cache_format_version", [0, 2, 1.0, "1"]),
                    ("k_quant_type", ["PER_GROUP", "PER_TENSOR"]), ("v_quant_type", ["NONE"])]
    else:
        options += [("k_quant_type", ["PER_TENSOR", "NONE"]), ("v_quant_type", ["PER_CHANNEL"])]
    options = [(n, [v for v in vals if v != attrs.get(n)]) for n, vals in options]
    name, vals = _pick(rng, [(n, vals) for n, vals in options if vals])
    attrs = dict(attrs, **{name: _pick(rng, vals)})
    words = (name,)
    if name in ("kv_quant_group_size", "k_quant_type", "v_quant_type", "k_cache_bit_width",
                "v_cache_bit_width", "kv_cache_bit_width"):
        words += ("head_size", "group", "past_key", "past_value", "k_scale", "v_scale", "quant",
                  "bit_width", "sink_size")
    return cls, attrs, inp, call, words


def m_group_cache(rng, cls, attrs, inp, call, spec, g):
    """Past caches of another row width (another bit width, group or metadata) or dtype, or
    a k_scale / v_scale given to a per-group cache (a static side's of the wrong size)."""
    kind = _pick(rng, ["width", "dtype", "scale"])
    if kind == "scale":
        name = _pick(rng, ["k_scale", "v_scale"])
        if side_type(spec, name[0]) == "PER_GROUP":       # a scale the per-group cache has not
            return cls, attrs, dict(inp, **{name: np.ones(1, np.float32)}), call, (name,)
        right = spec["Nkv"] * spec["H"] if side_type(spec, name[0]) == "PER_CHANNEL" else 1
        wrong = _pick(rng, [0, 2, right + 1])           # a static side's, mis-sized
        return cls, attrs, dict(inp, **{name: np.ones(wrong, np.float32)}), call, (name,)
    if "past_key" not in inp:
        return None
    name = _pick(rng, ["past_key", "past_value"])
    x = inp[name]
    if kind == "width":
        w = x.shape[3] + _pick(rng, [1, -1, 4, x.shape[3]])
        y = g.empty(x.shape[:3] + (max(w, 1),), np.uint8)
        y[...] = 0
    else:
        y = g.array(x.view(np.uint8 if x.dtype == np.int8 else np.int8))
    inp, call = _replace(inp, call, x, y)
    return cls, attrs, inp, call, ("past_key", "past_value", "present_key", "present_value")


def m_lengths(rng, cls, attrs, inp, call, spec, g):
    """seqlens_k / total_sequence_length near and past 2^31 with the windows' buffers."""
    inp = dict(inp)
    b = int(rng.integers(spec["B"]))
    kinds = ["seq_big", "seq_neg", "total_past"]
    if "present_key" in call:      # else a present of T rows would be allocated: a valid call
        kinds += ["total_big", "both_big"]
    kind = _pick(rng, kinds)
    sk = inp["seqlens_k"].copy()
    if kind == "seq_big":
        sk[b] = _pick(rng, [INT32_MAX, INT32_MAX - 1, 2 ** 30])
    elif kind == "seq_neg":
        sk[b] = _pick(rng, [-1, -(2 ** 31)])
    elif kind == "total_big":
        inp["total_sequence_length"] = _pick(rng, [INT32_MAX, 2 ** 31, 2 ** 40])
    elif kind == "total_past":
        inp["total_sequence_length"] = _pick(rng, [0, -1, int(sk.max())])
    else:
        sk[:] = INT32_MAX - 1
        inp["total_sequence_length"] = INT32_MAX
    inp["seqlens_k"] = sk
    return cls, attrs, inp, call, ("seqlens_k", "total_sequence_length", "cos_cache",
                                   "past_key", "shared buffer")


MUTATIONS = {
    "window_sizes": m_window_sizes, "window_buffers": m_window_buffers, "alias": m_alias,
    "rotation_value": m_rotation_value, "norm_value": m_norm_value,
    "rotary_value": m_rotary_value, "group_attrs": m_group_attrs, "group_cache": m_group_cache,
    "lengths": m_lengths,
}
# sizes within range with buffers that suffice, e.g. fresh windows of min(T, sink + recent) rows
MAYBE_VALID = {"window_sizes", "lengths"}
