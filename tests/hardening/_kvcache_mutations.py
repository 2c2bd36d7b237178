"""gqa.KVCache under hostile use, for the fuzzer (_fuzz_worker.py kvcache): a valid cache
from a JSON-able spec, a few valid steps, then one mutation -- of its construction
(keywords out of their domain, configuration names not strictly formed, rotations of the
wrong structure or values, scales, threads, head sizes the formats or rotary cannot take) or
of its use (attend with arrays of the wrong shape, dtype or kind, layers out of range or
repeated, steps past max_length, truncate to lengths it cannot reach, one short of its
rollback_floor, rollback rows put by hand over the step's own memory).

Each mutation takes (rng, spec, kwargs) and returns ("construct", kwargs, words) or
("use", (prepare, bad), words): prepare(cache) (or None) does valid things first, bad(cache)
the bad one; None when it does not apply.  A refused
construction raises ValueError / TypeError (MemoryError where the cache asked for is larger
than memory) naming one of `words`; a refused use leaves every buffer and the length as
they were.
"""
import numpy as np

import gqa
from _newer_cases import orthogonal

MODES = ["float", "int8-pt", "int8-pc", "int4-pc/pt", "int8-g16", "int4-g16+s2r4",
         "int4-g16+s1r3+had", "int2-g16-fp16+s2r2", "int4-g16/int8-g16", "int8-pc/int4-g16"]


def _pick(rng, xs):
    return xs[int(rng.integers(len(xs)))]


def random_spec(rng):
    nkv, G = int(rng.integers(1, 3)), _pick(rng, [1, 2, 3])
    return dict(seed=int(rng.integers(2 ** 16)), layers=int(rng.integers(1, 4)), N=nkv * G,
                Nkv=nkv, H=_pick(rng, [16, 32, 64]), M=int(rng.integers(12, 40)),
                B=int(rng.integers(1, 3)), mode=_pick(rng, MODES), rotary=bool(rng.integers(2)),
                dtype=_pick(rng, ["f32", "f32", "f16"]), prompt=int(rng.integers(1, 8)),
                decode=int(rng.integers(0, 4)), accuracy=_pick(rng, [0, 0, 3, 4]),
                rollback=_pick(rng, [0, 0, 1, 3]))


def kwargs(spec):
    """The keywords of the valid KVCache of `spec` (static modes: scales given)."""
    s = spec
    kw = dict(num_layers=s["layers"], num_heads=s["N"], kv_num_heads=s["Nkv"], head_size=s["H"],
              max_length=s["M"], batch_size=s["B"], mode=s["mode"],
              dtype=np.float32 if s["dtype"] == "f32" else np.float16,
              accuracy_level=s.get("accuracy", 0), rollback_size=s.get("rollback", 0))
    if s["rotary"]:
        kw["rotary"] = gqa.rotary_caches(s["M"], s["H"])
    kf, vf = gqa.parse_mode(gqa.cache_options(s["mode"])["mode"])
    for name, f in (("k_scales", kf), ("v_scales", vf)):
        if f.static:
            kw[name] = np.full(s["Nkv"] * s["H"] if f.per_channel else 1, 0.05, np.float32)
    return kw


def steps(spec, cache):
    """The valid steps run before the mutation: a prompt, then single tokens."""
    rng = np.random.default_rng(spec["seed"] + 1)
    dt = cache.dtype
    B, N, Nkv, H = spec["B"], spec["N"], spec["Nkv"], spec["H"]
    for S in [spec["prompt"]] + [1] * spec["decode"]:
        for li in range(spec["layers"]):
            cache.attend(li, rng.uniform(-1, 1, (B, S, N * H)).astype(dt),
                         rng.uniform(-1, 1, (B, S, Nkv * H)).astype(dt),
                         rng.uniform(-1, 1, (B, S, Nkv * H)).astype(dt))


def m_construct(rng, spec, kw):
    """One keyword out of its domain."""
    H, Nkv, L = spec["H"], spec["Nkv"], spec["layers"]
    options = [
        ("num_threads", [0, -1, 1.5, True, "2", 2 ** 31]),
        ("num_layers", [0, -1, 2.0, None]),
        ("head_size", [12, 20, 0, -8, 16.0]),
        ("max_length", [0, -5, 3.5, 2 ** 31, 2 ** 62]),
        ("batch_size", [0, True]),
        ("num_heads", [0, -3]),
        ("kv_num_heads", [0, spec["N"] + 1]),
        ("mode", ["int4-g16+", "int4-g１6", "int4-g16+s2r4+s2r4", "int4-g16+had+rot",
                  "int3-g16", "int4-g12", "int4-g16+s-1r2", "int4-g16+rho0", "int4-g16+rho1e-50",
                  "int8-pt+s2r2", "float+had", 7, None, ""]),
        ("dtype", [np.int8, np.float64, "bfloat16"]),
        ("sink_size", [-1, 2 ** 31, 1.5]),     # (2^31 - 1 alone is legal: rows min(it, max_length))
        ("windows", [(2 ** 31 - 1, 1), (2 ** 30, 2 ** 30)]),
        ("recent_size", [2 ** 31, -2]),
        ("k_rho", [0.0, 1e-50, 2.0, float("nan")]),
        ("rotations", [3, "identity", [(None, None, None)] * L, [None] * L, [(1, 2)] * L,
                       [(None, None)] * (L + 1), "rotations"]),
        ("rotation_values", ["nan", "random", "scaled", "shape"]),
        ("k_scales", ["nan", "size", "dtype", "zero", "negative", "str", "layers"]),
        ("rotary", ["short", "shape", "nan", 3]),
        ("calibration", [3, "x"]),
        ("local_window_size", [-2, 1.5]),
        ("softcap", [-1.0, "x", float("inf"), float("nan")]),
        ("scale", [float("nan"), float("inf"), "x", None]),
        ("accuracy_level", [5, 2.0, "4"]),
        ("rollback_size", [-1, 1.5, True, 2 ** 31, "2"]),
    ]
    name, vals = _pick(rng, options)
    v = _pick(rng, vals)
    kw = dict(kw)
    words = (name,)
    if name == "rotation_values":
        if not gqa.parse_mode(gqa.cache_options(spec["mode"])["mode"])[0].quantized:
            return None
        r = orthogonal(rng, Nkv, H)
        if v == "nan":
            r[0, 0, 0] = np.nan
        elif v == "random":
            r = rng.standard_normal((Nkv, H, H)).astype(np.float32)
        elif v == "scaled":
            r = 2 * r
        else:
            r = r[:, :, :H - 8]
        kw["rotations"] = [(r, None)] * L
        if "+had" in spec["mode"]:
            return None
        words = ("rotations", "oscar_rotation_k", "R_K")
    elif name == "k_scales":
        if "k_scales" not in kw:
            return None
        s = kw["k_scales"].copy()
        if v == "nan":
            s[0] = np.nan
        elif v == "size":
            s = s[:-1]
        elif v == "zero":
            s[-1] = 0.0
        elif v == "negative":
            s[0] = -s[0]
        elif v == "str":
            s = "0.01"
        elif v == "layers":
            s = [s] * (L + 1)
        else:
            s = s.astype(np.float64) * np.inf
        kw["k_scales"] = s
        words = ("k_scales", "k_scale")
    elif name == "rotary":
        cos, sin = gqa.rotary_caches(spec["M"], H)
        if v == "short":
            v = (cos[:-1], sin[:-1])
        elif v == "shape":
            v = (cos, sin[:, :-1])
        elif v == "nan":
            cos = cos.copy()
            cos[1, 1] = np.nan
            v = (cos, sin)
        kw["rotary"] = v
        words = ("rotary", "cos_cache", "sin_cache")
    elif name == "mode":
        kw["mode"] = v
        kw.pop("k_scales", None)
        kw.pop("v_scales", None)
        words = ("mode", "configuration", "group_size", "head_size", "rho", "sink", "recent",
                 "rotations", "k_scales")
    elif name == "windows":
        kw["sink_size"], kw["recent_size"] = v
        if "+s" in spec["mode"]:
            kw["mode"] = spec["mode"].split("+")[0]
        words = ("sink_size", "recent_size")
    elif name == "sink_size" or name == "recent_size":
        kw[name] = v
        words = ("sink_size", "recent_size", "mode", "float")
    elif name == "k_rho":
        kw[name] = v
        words = ("k_rho", "k_quant_rho", "mode", "rho")
    else:
        kw[name] = v
        words += {"head_size": ("group_size", "head_size", "Hadamard", "rotary", "k_scales",
                                "v_scales"),
                  "kv_num_heads": ("num_heads", "k_scales", "v_scales"), "calibration": ("Calibration", "scales"),
                  "rotations": ("rotations", "R_K", "float"),
                  "max_length": ("max_length", "rotary")}.get(name, ())
    return "construct", kw, words


def m_attend(rng, spec, kw):
    """attend() given what the cache cannot take."""
    B, N, Nkv, H, dt = spec["B"], spec["N"], spec["Nkv"], spec["H"], np.dtype(kw["dtype"])
    S = 1
    q, k, v = (np.zeros((B, S, n * H), dt) for n in (N, Nkv, Nkv))
    kind = _pick(rng, ["q_short", "k_short", "q_batch", "dtype", "not_array", "S_mismatch",
                       "S0", "layer", "layer_type", "full", "twice", "step_size", "packed_bad"])
    layer = 0
    if kind == "q_short":
        q = q[..., :-8]
    elif kind == "k_short":
        k = k[..., :-8]
    elif kind == "q_batch":
        q = np.zeros((B + 1, S, N * H), dt)
    elif kind == "dtype":
        q = q.astype(np.float16 if dt == np.float32 else np.float32)
    elif kind == "not_array":
        v = v.tolist()
    elif kind == "S_mismatch":
        k = np.zeros((B, S + 1, Nkv * H), dt)
    elif kind == "S0":
        q, k, v = q[:, :0], k[:, :0], v[:, :0]
    elif kind == "layer":
        layer = _pick(rng, [-1, spec["layers"], 2 ** 40])
    elif kind == "layer_type":
        layer = _pick(rng, [1.0, True, "0", None])
    elif kind == "full":
        S = spec["M"]
        q, k, v = (np.zeros((B, S, n * H), dt) for n in (N, Nkv, Nkv))
    elif kind == "packed_bad":
        q, k, v = np.zeros((B, S, (N + 2 * Nkv) * H - 8), dt), None, None

    prepare = None
    if kind in ("twice", "step_size"):
        if spec["layers"] < 2:      # one layer: the step is complete after it
            return None

        def prepare(cache, q=q, k=k, v=v):      # valid: the step starts at layer 0
            cache.attend(0, q, k, v)
        if kind == "step_size":
            layer = 1
            q, k, v = (np.zeros((B, 2, n * H), dt) for n in (N, Nkv, Nkv))

    def bad(cache):
        return cache.attend(layer, q, k, v)
    words = {"layer": ("layer",), "layer_type": ("layer",), "full": ("max_length", "full"),
             "twice": ("already holds",), "step_size": ("tokens", "batch_size"),
             "S0": ("query", "S >= 1"), "not_array": ("value",), "S_mismatch": ("key",),
             "k_short": ("key",), "packed_bad": ("query",)}.get(kind, ("query",))
    return "use", (prepare, bad), words


def m_truncate(rng, spec, kw):
    """truncate() to lengths out of range, of the wrong type, or that the windows lost."""
    kind = _pick(rng, ["negative", "beyond", "float", "lost"])

    def bad(cache):
        n = {"negative": -1, "beyond": cache.length + 1, "float": 1.5}.get(kind)
        if kind == "lost":            # one position short of how far back it can go
            n = int(cache.rollback_floor.max()) - 1
            if n <= cache.sink_size:
                return cache.truncate(-1)           # nothing lost here: an out-of-range one
        return cache.truncate(n)
    return "use", (None, bad), ("length", "truncate", "recent")


def m_undo(rng, spec, kw):
    """attend() with rollback rows put by hand over memory the step reads or writes: the other
    side's rows, the float windows, or the query's own buffer (the spec gets windows and rows
    where it has none)."""
    if "+s" not in spec["mode"]:
        spec["mode"] = _pick(rng, [m for m in MODES if "+s" in m])
    spec["rollback"] = spec.get("rollback") or _pick(rng, [1, 3])
    kw = kwargs(spec)
    B, N, Nkv, H, dt = spec["B"], spec["N"], spec["Nkv"], spec["H"], np.dtype(kw["dtype"])
    kind = _pick(rng, ["other_side", "window", "query"])
    big = np.zeros(B * (N + 3 * Nkv) * H, dt)
    q = big[:B * N * H].reshape(B, 1, N * H) if kind == "query" else np.zeros((B, 1, N * H), dt)
    k, v = (np.zeros((B, 1, Nkv * H), dt) for _ in range(2))

    def prepare(cache):
        ring = cache.undo_value[0]
        over = {"other_side": cache.undo_key[0], "query": big,
                "window": cache.hp_key[0]}[kind].reshape(-1)
        cache.undo_value[0] = over[:ring.size].reshape(ring.shape)

    def bad(cache):
        return cache.attend(0, q, k, v)
    return "use", (prepare, bad), ("undo_value",)


MUTATIONS = {"construct": m_construct, "attend": m_attend, "truncate": m_truncate, "undo": m_undo}
