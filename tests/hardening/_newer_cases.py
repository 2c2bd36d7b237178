"""Valid calls of the surface beyond onnxruntime 1.31.1 -- per-group INT8/INT4/INT2 caches
(beside a static per-tensor / per-channel INT8 / INT4 cache on the other side, or both static),
float sink/recent windows (in place, new, or the caller's), rotations, QK norm, K and V of
their own widths and types, GroupQueryAttention and MixedPrecisionGroupQueryAttention, with
onnxruntime's score features (causal 0, local window, softcap, scale, attention bias, head
sink, smooth softmax, qk_output) and ragged batches -- from a small JSON-able spec, for the
newer-surface fuzzer (_newer_mutations.py, _fuzz_worker.py), the property test against the
float64 statement (test_hard_newer_property.py, _newer_reference.py) and the level tests.

Every caller buffer a call may write (caches, float windows, present buffers) is allocated
by ``Guarded``: inside a larger byte buffer whose CANARY bytes on both sides must survive the
call, so a write past either end is seen even where it does not fault.
"""
import numpy as np

import gqa

CANARY = 0xA5
PAD = 64          # canary bytes on each side (a multiple of every alignment used here)


class Guarded:
    """Allocations with canary bytes around them; ``intact()`` lists those overwritten."""

    def __init__(self):
        self.blocks = []

    def empty(self, shape, dtype):
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = np.full(n + 2 * PAD, CANARY, np.uint8)
        self.blocks.append(raw)
        return raw[PAD:PAD + n].view(dtype).reshape(shape)

    def array(self, x):
        y = self.empty(x.shape, x.dtype)
        y[...] = x
        return y

    def broken(self):
        """Indices of the blocks whose canaries changed."""
        return [i for i, raw in enumerate(self.blocks)
                if not ((raw[:PAD] == CANARY).all() and (raw[-PAD:] == CANARY).all())]


def orthogonal(rng, nkv, h, dtype=np.float32):
    """Random orthogonal [nkv, h, h] (QR of a Gaussian, float64, then rounded)."""
    q, r = np.linalg.qr(rng.standard_normal((nkv, h, h)))
    return (q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]).astype(dtype)


def random_spec(rng):
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    phase = pick(["prompt", "decode", "decode", "subsequent"])
    Nkv, G = int(rng.integers(1, 4)), pick([1, 2, 3, 4])
    H = pick([16, 32, 48, 64])
    B = 1 if phase == "subsequent" else int(rng.integers(1, 4))
    S = int(rng.integers(1, 9)) if phase == "prompt" else 1 if phase == "decode" else int(rng.integers(2, 7))
    past = 0 if phase == "prompt" else int(rng.integers(1, 30))
    kb, vb = pick([8, 4, 2]), pick([8, 4, 2])
    spec = dict(
        seed=int(rng.integers(2 ** 16)), cls=pick(["gqa", "gqa", "mixed"]), phase=phase, B=B, S=S,
        past=past, N=Nkv * G, Nkv=Nkv, H=H, k_bits=kb, v_bits=vb,
        group=pick([0, 8, 16, H]), metadata=pick(["fp32", "fp16"]),
        sink=pick([0, 0, 1, 2, 4]), recent=pick([0, 1, 3, 8]),
        partition=pick(["causal", "per_call"]),
        rot=pick([None, "k", "v", "kv"]), rot_dtype=pick(["f32", "f32", "f16"]),
        qk_norm=bool(rng.integers(3) == 0), rotary=bool(rng.integers(2)),
        dtype=pick(["f32", "f32", "f16"]), inplace=phase != "prompt" and bool(rng.integers(2)),
        windows=pick(["inplace", "inplace", "fresh", "caller"]), extra_rows=pick([0, 0, 3]),
        rho=pick([1.0, 1.0, 0.95]), accuracy=pick([0, 0, 3, 4]))
    # the score features and ragged batches (drawn last: the draws above keep their values)
    causal = bool(rng.integers(6))
    spec.update(
        causal=causal, window=pick([-1, -1, -1, 0, 1, 2, 3, 5, 8]) if causal else -1,
        softcap=pick([0.0, 0.0, 0.0, 0.3, 2.0]), scale=pick([0.0, 0.0, 0.0, 0.21, 1.5]),
        bias=pick([None, None, None, "full", "b1", "n1", "both1"]),
        head_sink=rng.integers(5) == 0, smooth=rng.integers(5) == 0,
        qk_output=pick([0, 0, 0, 0, 1, 2]), pasts=None, prompt_lens=None)
    if B > 1 and rng.integers(2):
        if phase == "prompt":
            spec["prompt_lens"] = [int(x) for x in rng.integers(1, S + 1, B)]
        else:
            pasts = [int(x) for x in rng.integers(0, past + 1, B)]
            pasts[int(rng.integers(B))] = past
            spec["pasts"] = pasts
    # each side's type (GroupQueryAttention: per group, or a static per-tensor / per-channel
    # INT8 / INT4 cache beside a per-group one or both; the mixed-precision operator: per group)
    kt = vt = "PER_GROUP"
    if spec["cls"] == "gqa":
        kt, vt = pick(TYPES), pick(TYPES)
    spec.update(k_type=kt, v_type=vt)
    for side in "kv":
        if spec[f"{side}_type"] != "PER_GROUP" and spec[f"{side}_bits"] == 2:
            spec[f"{side}_bits"] = pick([8, 4])
    return {k: bool(v) if isinstance(v, np.bool_) else v for k, v in spec.items()}


TYPES = ["PER_GROUP", "PER_GROUP", "PER_TENSOR", "PER_CHANNEL"]


def side_type(spec, side):
    """The quant type of side "k" or "v" (PER_GROUP, PER_TENSOR or PER_CHANNEL)."""
    return spec.get(f"{side}_type", "PER_GROUP")


def static_scale(spec, side):
    """A static side's scales (per tensor [1], per channel [Nkv * H]; INT4's 8x wider), from a
    generator of their own so the call's other inputs do not depend on them."""
    r = np.random.default_rng([spec["seed"], "kv".index(side) + 1])
    n = spec["Nkv"] * spec["H"] if side_type(spec, side) == "PER_CHANNEL" else 1
    return (r.uniform(0.02, 0.03, n) * (8 if spec[f"{side}_bits"] == 4 else 1)).astype(np.float32)


def encode(rows, spec, side):
    """The cache rows of float32 rows [B, Nkv, L, H] on side "k" / "v": the per-group codec
    (rho 1), or a static side's codes with its scales (static_scale)."""
    bits = spec[f"{side}_bits"]
    if side_type(spec, side) == "PER_GROUP":
        return gqa.quantize(rows, bits=bits, group_size=spec["group"], metadata=spec["metadata"])
    H, scale = spec["H"], static_scale(spec, side)
    out = []
    for j in range(spec["Nkv"]):
        sj = scale[j * H:(j + 1) * H] if scale.size > 1 else scale
        out.append(gqa.quantize(np.ascontiguousarray(rows[:, j]), sj, bits=bits))
    return np.stack(out, 1)


def lengths(spec):
    """T_b, each batch's total length: a first prompt's prompt_lens (all S when None), else
    the batch's past rows (pasts; all `past` when None) plus S."""
    if spec["phase"] == "prompt":
        return np.array(spec.get("prompt_lens") or [spec["S"]] * spec["B"])
    return np.array(spec.get("pasts") or [spec["past"]] * spec["B"]) + spec["S"]


SCORE_ATTRS = (("causal", "causal", True), ("window", "local_window_size", -1),
               ("softcap", "softcap", 0.0), ("scale", "scale", 0.0), ("smooth", "smooth_softmax", False),
               ("qk_output", "qk_output", 0))


def _dtype(spec):
    return np.dtype(np.float32 if spec["dtype"] == "f32" else np.float16)


def make_op(cls, attrs):
    """The operator of a case: cls "gqa" (GroupQueryAttention, PER_GROUP both sides) or
    "mixed" (MixedPrecisionGroupQueryAttention)."""
    if cls == "mixed":
        return gqa.MixedPrecisionGroupQueryAttention(**attrs)
    return gqa.GroupQueryAttention(**attrs)


def build(spec, guard=None):
    """(cls, attributes, inputs, call keywords, guard) of the valid call `spec` describes;
    every buffer the call may write is the guard's."""
    s, g = spec, guard or Guarded()
    rng = np.random.default_rng(s["seed"])
    B, S, N, Nkv, H, P = s["B"], s["S"], s["N"], s["Nkv"], s["H"], s["past"]
    dt = _dtype(s)
    win = s["sink"] + s["recent"] > 0
    attrs = dict(num_heads=N, kv_num_heads=Nkv, kv_quant_group_size=s["group"],
                 metadata_type=s["metadata"], k_cache_bit_width=s["k_bits"],
                 v_cache_bit_width=s["v_bits"], sink_size=s["sink"], recent_size=s["recent"],
                 window_partition=s["partition"], k_quant_rho=s["rho"], do_rotary=int(s["rotary"]),
                 accuracy_level=s.get("accuracy", 0))
    attrs["kv_cache_bit_width"] = 4
    kt, vt = side_type(s, "k"), side_type(s, "v")
    if s["cls"] == "gqa":
        attrs.update(k_quant_type=kt, v_quant_type=vt)
    if kt != "PER_GROUP":
        del attrs["k_quant_rho"]
    if "PER_GROUP" not in (kt, vt):
        del attrs["kv_quant_group_size"], attrs["metadata_type"]
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(dt)  # noqa: E731
    T = P + S
    inp = dict(query=u(B, S, N * H), key=u(B, S, Nkv * H), value=u(B, S, Nkv * H),
               seqlens_k=(lengths(s) - 1).astype(np.int32), total_sequence_length=T)
    rows = P + S + s["extra_rows"] if s["inplace"] else P
    if P or s["inplace"]:
        for name, side in (("past_key", "k"), ("past_value", "v")):
            inp[name] = g.array(encode(rng.uniform(-1, 1, (B, Nkv, rows, H)).astype(np.float32), s, side))
    for side in "kv":
        if side_type(s, side) != "PER_GROUP":
            inp[f"{side}_scale"] = static_scale(s, side)
    if s["rotary"]:
        cos, sin = gqa.rotary_caches(T + 4, H)
        inp.update(cos_cache=cos.astype(dt), sin_cache=sin.astype(dt))
    if s["qk_norm"]:
        inp.update(q_norm_weight=rng.uniform(0.5, 1.5, H).astype(dt),
                   k_norm_weight=rng.uniform(0.5, 1.5, H).astype(dt))
    rdt = np.float32 if s["rot_dtype"] == "f32" else np.float16
    if s["rot"] in ("k", "kv"):
        inp["oscar_rotation_k"] = orthogonal(rng, Nkv, H, rdt)
    if s["rot"] in ("v", "kv"):
        inp["oscar_rotation_v"] = orthogonal(rng, Nkv, H, rdt)
    call = {}
    if s["inplace"]:
        call.update(present_key=inp["past_key"], present_value=inp["past_value"])
    if win:
        cap = s["sink"] + s["recent"]
        if P:
            prow = min(P, cap) + (s["extra_rows"] if s["windows"] == "inplace" else 0)
            if s["windows"] == "inplace":
                prow = max(prow, min(T, cap))
            inp["past_hp_key"] = g.array(u(B, Nkv, prow, H))
            inp["past_hp_value"] = g.array(u(B, Nkv, prow, H))
        if s["windows"] == "inplace" and P:
            call.update(present_hp_key=inp["past_hp_key"], present_hp_value=inp["past_hp_value"])
        elif s["windows"] == "caller" or (s["windows"] == "inplace" and not P):
            nrow = min(T, cap) + s["extra_rows"]
            call.update(present_hp_key=g.empty((B, Nkv, nrow, H), dt),
                        present_hp_value=g.empty((B, Nkv, nrow, H), dt))
    for key, name, default in SCORE_ATTRS:
        if s.get(key, default) != default:
            attrs[name] = int(s[key]) if isinstance(default, bool) else s[key]
    if s.get("bias"):
        bb = 1 if s["bias"] in ("b1", "both1") else B
        bn = 1 if s["bias"] in ("n1", "both1") else N
        inp["attention_bias"] = u(bb, bn, S, T)
    if s.get("head_sink"):
        inp["head_sink"] = u(N)
    return s["cls"], attrs, inp, call, g
