"""The decoding-loop API: per-layer KV caches of one sequence batch, one operator per layer.

``KVCache`` owns, for each of a model's attention layers, a key and a value cache allocated
once for ``max_length`` positions (float, INT8 or INT4 codes with per-tensor or per-channel
scales, or per-group INT8 / INT4 / INT2 rows; K and V modes and widths may differ), optional
float windows and rotations, the layer's ``GroupQueryAttention`` (kept, so every call
after the first reuses the operator's checked signature) and the sequence length.  A model calls
``cache.attend(layer, q, k, v)`` once per layer per step; the cache writes the step's S new
positions in place and returns the attention output.

Layout and bookkeeping (the contract):
- ``cache.key[layer]`` / ``cache.value[layer]``: ``[B, Nkv, max_length, Hp]``, each of its own
  mode (:func:`cache_layout`): ``Hp = H`` (float32/float16 or int8 codes), ``(H + 1) // 2``
  (INT4, two codes per uint8, README "INT4 layout") or ``gqa.group_row_bytes(H, bits, group,
  metadata)`` (per-group uint8 rows).  Rows ``[0, length)`` hold the sequence; rows past it are
  never read.
- ``length`` is the number of positions every layer holds.  A step gives each layer the same
  S tokens once, in any layer order; the length advances by S when the last layer has had
  them.  Every batch entry has the same length (no ragged batches here); after the first
  step a batch of more than one sequence takes one token per step (the operator's contract:
  a multi-token step over a past needs batch size 1).
- Calibration rule (``calibration()`` on a float cache after a calibration run): per layer and
  per channel, the absolute maximum of V and of the cached K over rows ``[0, length)``; K's
  channels that rotary turns in pairs take the pair's largest norm ``sqrt(k_a^2 + k_b^2)``
  instead: the rotation moves a pair's magnitude between its two channels with the position,
  so maxima seen over a calibration text shorter than the served context would leave one
  channel of a slowly turning pair far too small (SmolLM2, INT8 K per channel at 4096 tokens
  of context, calibrated on 1024: +25 % perplexity with plain maxima).  A quantized cache built from it takes, per tensor, the
  maximum over all channels, per channel each channel's own, times ``margin``, divided by the
  top code (127 INT8, 7 INT4), floored at 1e-6 so that a channel that stayed zero still
  quantizes.  Values beyond the calibrated range saturate to the top code (never wrap);
  ``margin > 1`` buys headroom for texts that exceed the calibration text's range at the cost
  of resolution (a margin of 1.25 on INT4 leaves 5.6 of the 7 steps to the calibrated range).
"""
import numbers
import re

import numpy as np

from . import _group
from ._operator import GroupQueryAttention

# one cache mode per tensor: (quant type, bits)
_TENSOR_MODES = {"float": ("NONE", 0), "int8-pt": ("PER_TENSOR", 8), "int8-pc": ("PER_CHANNEL", 8),
                 "int4-pt": ("PER_TENSOR", 4), "int4-pc": ("PER_CHANNEL", 4)}
_QMAX = {8: 127.0, 4: 7.0}
SCALE_FLOOR = 1e-6


_GROUP_MODE = re.compile(r"int([842])-g(\d+)(-fp16)?")


def group_mode(mode):
    """(bits, group_size, metadata) of a per-group mode name such as ``"int4-g32"`` (groups of
    32 channels, float32 scale and zero point) or ``"int2-g64-fp16"`` (float16 metadata);
    ``g0`` is one group per head.  None for the other modes."""
    m = _GROUP_MODE.fullmatch(mode) if isinstance(mode, str) else None
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), "fp16" if m.group(3) else "fp32"


_OPTION = re.compile(r"\+s(\d+)r(\d+)|\+(had|rot)|\+rho(\d*\.?\d+)(?:/(\d*\.?\d+))?")


def cache_options(name):
    """KVCache keywords of a configuration name: a mode, then optionally ``+s<sink>r<recent>``
    (float windows of the first sink and last recent positions), ``+had`` (Hadamard
    rotations) or ``+rot`` (calibrated rotations, given separately), and ``+rho<k>[/<v>]`` (the
    clip quantiles of a per-group cache), e.g. ``"int2-g32+s4r64+rot+rho0.9"``."""
    if not isinstance(name, str):
        raise TypeError(f"a cache configuration must be a str, got {type(name).__name__}")
    base, _, rest = name.partition("+")
    out = dict(mode=base)
    rest = "+" + rest if rest else ""
    pos = 0
    for m in _OPTION.finditer(rest):
        if m.start() != pos:
            break
        pos = m.end()
        if m.group(3):
            out["rotations"] = "hadamard" if m.group(3) == "had" else "calibrated"
        elif m.group(4):
            out["k_rho"] = float(m.group(4))
            out["v_rho"] = float(m.group(5) or m.group(4))
        else:
            out["sink_size"], out["recent_size"] = int(m.group(1)), int(m.group(2))
    if pos != len(rest):
        raise ValueError(f"{name!r} is not a cache configuration: a mode, then +s<sink>r<recent>, "
                         "+had / +rot and +rho<k>[/<v>]")
    parse_mode(base)
    return out


def _side(mode):
    """(quant type, bits, (bits, group, metadata) or None) of one tensor's mode name."""
    g = group_mode(mode)
    if g:
        return "PER_GROUP", g[0], g
    if mode in _TENSOR_MODES:
        return _TENSOR_MODES[mode] + (None,)
    raise ValueError(f"{mode!r} is not a cache mode of one tensor; valid: {', '.join(_TENSOR_MODES)} "
                     "or int8/int4/int2-g<group>[-fp16]")


def _static(mode):
    """A one-tensor mode with static scales (per tensor or per channel)?"""
    return _side(mode)[0] in ("PER_TENSOR", "PER_CHANNEL")


def cache_layout(mode, head_size, dtype=np.float32):
    """(row width, dtype) of one tensor's cache rows in a one-tensor mode: head_size floats of
    `dtype`, head_size int8 codes, (head_size + 1) // 2 uint8 bytes of INT4 codes, or a
    per-group row of gqa.group_row_bytes bytes (uint8)."""
    _, bits, group = _side(mode)
    if group:
        return _group.group_format(*group, head_size).row_bytes, np.dtype(np.uint8)
    width = head_size if bits != 4 else (head_size + 1) // 2
    return width, {0: np.dtype(dtype), 8: np.dtype(np.int8), 4: np.dtype(np.uint8)}[bits]


def needs_scales(mode):
    """True when K or V is a static quantized mode (scales from k_scales/v_scales or a
    calibration)."""
    return any(_static(m) for m in parse_mode(cache_options(mode)["mode"]))


def parse_mode(mode):
    """A cache mode name -> (k_mode, v_mode).

    ``"float"``, ``"int8-pt"``, ``"int8-pc"``, ``"int4-pt"``, ``"int4-pc"`` name both tensors,
    as do the per-group modes ``"int{8,4,2}-g{group}[-fp16]"`` (:func:`group_mode`);
    ``"int4-pc/pt"`` names K's scaling, then V's (here K per channel, V per tensor), and
    ``"<K's mode>/<V's mode>"`` any two quantized modes, e.g. ``"int4-pc/int2-g32"`` (static
    per-channel INT4 K, per-group INT2 V; two per-group sides share one group size and
    metadata type)."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str, got {type(mode).__name__}")
    if mode in _TENSOR_MODES or group_mode(mode):
        return mode, mode
    head, sep, tail = mode.partition("/")
    if sep and head in _TENSOR_MODES and head != "float" and tail in ("pt", "pc"):
        return head, head.split("-")[0] + "-" + tail
    quantized = lambda m: m != "float" and (m in _TENSOR_MODES or group_mode(m))  # noqa: E731
    if sep and quantized(head) and quantized(tail):
        return head, tail
    raise ValueError(f"mode={mode!r} is not a cache mode; valid: {', '.join(_TENSOR_MODES)}, "
                     "int8/int4/int2-g<group>[-fp16] (per group), or K's mode / V's mode: "
                     "int4-pc/pt (K's scaling / V's) or two quantized modes (int4-pc/int2-g32)")


def mode_name(k_mode, v_mode):
    """The inverse of parse_mode."""
    if k_mode == v_mode:
        return k_mode
    if k_mode in _TENSOR_MODES and v_mode in _TENSOR_MODES and (
            _TENSOR_MODES[k_mode][1] == _TENSOR_MODES[v_mode][1]):
        return f"{k_mode}/{v_mode.split('-')[1]}"
    return f"{k_mode}/{v_mode}"


def _op_attributes(k_mode, v_mode, k_rho=1.0, v_rho=1.0):
    (kq, kb, kg), (vq, vb, vg) = _side(k_mode), _side(v_mode)
    if (kb == 0) != (vb == 0):
        raise ValueError(f"k_mode={k_mode!r} and v_mode={v_mode!r}: K and V must both be float or "
                         "both quantized")
    attrs = dict(k_quant_type=kq, v_quant_type=vq, kv_cache_bit_width=kb)
    if kb != vb:
        attrs.update(kv_cache_bit_width=0, k_cache_bit_width=kb, v_cache_bit_width=vb)
    if kg and vg and kg[1:] != vg[1:]:
        raise ValueError(f"k_mode={k_mode!r} and v_mode={v_mode!r}: per-group K and V share one "
                         "group size and metadata type (kv_quant_group_size, metadata_type)")
    for name, rho, g, mode in (("k_rho", k_rho, kg, k_mode), ("v_rho", v_rho, vg, v_mode)):
        if g is None and rho != 1.0:
            raise ValueError(f"{name}={rho!r}: the clip quantile applies to a per-group mode, "
                             f"{name[0].upper()}'s is {mode!r}")
    g = kg or vg
    if g:
        attrs.update(kv_quant_group_size=g[1], metadata_type=g[2], k_quant_rho=k_rho,
                     v_quant_rho=v_rho)
    return attrs


def rotary_caches(max_positions, rotary_dim, base=10000.0):
    """cos/sin caches ``[max_positions, rotary_dim // 2]`` (float32) of the rotary embedding
    with frequencies ``base ** (-2i / rotary_dim)``, computed in float64."""
    inv = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.arange(max_positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class Calibration:
    """Per-layer channel-wise absolute maxima of cached K and V (``k_absmax[layer]``,
    ``v_absmax[layer]``: float64 ``[Nkv * H]``, element ``kvh * H + c``), from which a
    quantized KVCache takes its scales.  ``a.combined(b)`` is the elementwise maximum of two
    calibrations (several calibration texts)."""

    def __init__(self, k_absmax, v_absmax, tokens):
        self.k_absmax = [np.asarray(a, np.float64) for a in k_absmax]
        self.v_absmax = [np.asarray(a, np.float64) for a in v_absmax]
        self.tokens = int(tokens)

    @property
    def num_layers(self):
        return len(self.k_absmax)

    def combined(self, other):
        if other.num_layers != self.num_layers or any(
                a.shape != b.shape for a, b in zip(self.k_absmax, other.k_absmax)):
            raise ValueError("calibrations of different model shapes cannot be combined")
        return Calibration([np.maximum(a, b) for a, b in zip(self.k_absmax, other.k_absmax)],
                           [np.maximum(a, b) for a, b in zip(self.v_absmax, other.v_absmax)],
                           self.tokens + other.tokens)

    def scales(self, k_mode, v_mode, margin=1.0):
        """(k_scales, v_scales): one float32 array per layer for these modes (module docstring)."""
        return ([_scale(a, k_mode, margin) for a in self.k_absmax],
                [_scale(a, v_mode, margin) for a in self.v_absmax])


def _scale(absmax, mode, margin):
    quant, bits, group = _side(mode)
    if bits == 0 or group:
        return None
    a = absmax if quant == "PER_CHANNEL" else np.array([absmax.max()])
    return np.maximum(a * margin / _QMAX[bits], SCALE_FLOOR).astype(np.float32)


def _positive_int(name, value, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class KVCache:
    """Per-layer KV caches of a batch of sequences, with one GroupQueryAttention per layer.

    ``KVCache(num_layers=30, num_heads=9, kv_num_heads=3, head_size=64, max_length=2048,
    mode="int8-pc/pt", calibration=cal, rotary=rotary_caches(2048, 64, 1e5),
    rotary_interleaved=1)``; then per step and layer ``out = cache.attend(layer, q, k, v)``
    with ``q [B, S, num_heads * head_size]`` and ``k``, ``v`` ``[B, S, kv_num_heads *
    head_size]`` (before rotary; float32, or float16 with ``dtype=np.float16``).

    mode: a name of :func:`parse_mode` (or ``k_mode``/``v_mode`` separately).  Quantized modes
    need scales: ``k_scales``/``v_scales`` (one array per layer of 1 or ``kv_num_heads *
    head_size`` float32, or one array for every layer) or a :class:`Calibration` (and
    ``margin``).  ``rotary``: ``(cos_cache, sin_cache)`` covering ``max_length`` positions, or
    None for no rotary.  ``local_window_size``, ``softcap``, ``scale`` are the operator's
    attributes; ``num_threads`` its per-call thread count.
    """

    def __init__(self, *, num_layers, num_heads, kv_num_heads, head_size, max_length, batch_size=1,
                 mode="float", k_mode=None, v_mode=None, k_scales=None, v_scales=None,
                 calibration=None, margin=1.0, dtype=np.float32, rotary=None, rotary_interleaved=0,
                 local_window_size=-1, softcap=0.0, scale=0.0, num_threads=None, k_rho=1.0,
                 v_rho=1.0, sink_size=0, recent_size=0, rotations=None):
        self.num_layers = _positive_int("num_layers", num_layers)
        self.num_heads = _positive_int("num_heads", num_heads)
        self.kv_num_heads = _positive_int("kv_num_heads", kv_num_heads)
        self.head_size = _positive_int("head_size", head_size)
        self.max_length = _positive_int("max_length", max_length)
        self.batch_size = _positive_int("batch_size", batch_size)
        if (k_mode is None) != (v_mode is None):
            raise ValueError("k_mode and v_mode go together (or use mode= for both)")
        if k_mode is None:
            k_mode, v_mode = parse_mode(mode)
        attrs = _op_attributes(k_mode, v_mode, k_rho, v_rho)
        self.k_mode, self.v_mode = k_mode, v_mode
        self.mode = mode_name(k_mode, v_mode)
        # per side (K, V): (quant type, bits, (bits, group, metadata) of a per-group mode or None)
        self._sides = (_side(k_mode), _side(v_mode))
        self.quantized = self._sides[0][1] != 0
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise TypeError(f"dtype must be float32 or float16, got {self.dtype}")
        self.k_scales, self.v_scales = self._scales(k_scales, v_scales, calibration, margin)
        self.cos_cache = self.sin_cache = None
        do_rotary = 0
        if rotary is not None:
            cos, sin = rotary
            cos, sin = np.ascontiguousarray(cos, self.dtype), np.ascontiguousarray(sin, self.dtype)
            if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[0] < self.max_length:
                raise ValueError(f"rotary must be (cos_cache, sin_cache) of one shape [P, rotary_dim/2] "
                                 f"with P >= max_length ({self.max_length}), got {cos.shape} and {sin.shape}")
            self.cos_cache, self.sin_cache, do_rotary = cos, sin, 1
        self.ops = [GroupQueryAttention(num_heads=self.num_heads, kv_num_heads=self.kv_num_heads,
                                        do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                                        local_window_size=local_window_size, softcap=softcap,
                                        scale=scale, sink_size=sink_size, recent_size=recent_size,
                                        **attrs) for _ in range(self.num_layers)]
        self.sink_size, self.recent_size = self.ops[0].sink_size, self.ops[0].recent_size
        self.rotations = self._rotations(rotations)
        for i, m in enumerate((k_mode, v_mode)):
            if (calibration is not None and _static(m)
                    and any(pair[i] is not None for pair in self.rotations)):
                raise ValueError(f"a calibration holds the maxima of unrotated rows, and "
                                 f"{'K' if i == 0 else 'V'}'s static scales would be applied to "
                                 "rotated ones: with rotations give k_scales / v_scales measured "
                                 "on the rotated rows")
        self.num_threads = num_threads
        (kw, kdt), (vw, vdt) = self._layout(0), self._layout(1)
        rows = (self.batch_size, self.kv_num_heads, self.max_length)
        self.key = [np.zeros(rows + (kw,), kdt) for _ in range(self.num_layers)]
        self.value = [np.zeros(rows + (vw,), vdt) for _ in range(self.num_layers)]
        # the float windows (in place): [B, Nkv, sink_size + recent_size, H] of the query dtype
        hp = (self.batch_size, self.kv_num_heads, self.sink_size + self.recent_size, self.head_size)
        windows = self.sink_size + self.recent_size > 0
        self.hp_key = [np.zeros(hp, self.dtype) if windows else None for _ in range(self.num_layers)]
        self.hp_value = [np.zeros(hp, self.dtype) if windows else None for _ in range(self.num_layers)]
        self._seqlens = np.zeros(self.batch_size, np.int32)
        self._set_length(0)

    def _layout(self, i):
        """(row width, dtype) of K's (i = 0) or V's (1) cache."""
        return cache_layout((self.k_mode, self.v_mode)[i], self.head_size, self.dtype)

    def _rotations(self, rotations):
        """Per layer (R_K, R_V) float32 [Nkv, H, H] or (None, None)."""
        none = [(None, None)] * self.num_layers
        if rotations is None:
            return none
        if not self.quantized:
            raise ValueError("rotations apply to a quantized cache, this one is float")
        if isinstance(rotations, str):
            if rotations != "hadamard":
                raise ValueError(f"rotations must be None, 'hadamard' or one (R_K, R_V) pair per "
                                 f"layer, got {rotations!r}")
            from ._rotation import oscar_rotation
            r = oscar_rotation(None, self.head_size, self.kv_num_heads)
            return [(r, r)] * self.num_layers
        rotations = list(rotations)
        if len(rotations) != self.num_layers:
            raise ValueError(f"rotations must hold one (R_K, R_V) pair per layer ({self.num_layers}), "
                             f"got {len(rotations)}")
        shape = (self.kv_num_heads, self.head_size, self.head_size)
        out = []
        for i, pair in enumerate(rotations):
            rk, rv = pair
            rk = None if rk is None else np.ascontiguousarray(rk, np.float32)
            rv = None if rv is None else np.ascontiguousarray(rv, np.float32)
            for name, r in (("R_K", rk), ("R_V", rv)):
                if r is not None and r.shape != shape:
                    raise ValueError(f"rotations[{i}] {name} must have shape {shape}, got {r.shape}")
            out.append((rk, rv))
        return out

    def _set_length(self, length):
        """Every layer holds `length` positions; no step in progress."""
        self._length = length
        self._step_size = 0                       # S of the step in progress (0: none)
        self._in_step = [False] * self.num_layers  # layers that have had the step
        self._step_layers = 0

    def _scales(self, k_scales, v_scales, calibration, margin):
        static = [_static(self.k_mode), _static(self.v_mode)]
        if not any(static):
            if k_scales is not None or v_scales is not None or calibration is not None:
                raise ValueError(f"mode {self.mode!r} is a {'per-group' if self.quantized else 'float'} "
                                 "cache: it takes no k_scales, v_scales or calibration")
            return [None] * self.num_layers, [None] * self.num_layers
        for name, given, st, m in (("k_scales", k_scales, static[0], self.k_mode),
                                   ("v_scales", v_scales, static[1], self.v_mode)):
            if given is not None and not st:
                raise ValueError(f"{name} must not be given: {name[0].upper()}'s mode {m!r} is "
                                 "per-group (its scales are stored in the cache rows)")
        if calibration is not None:
            if k_scales is not None or v_scales is not None:
                raise ValueError("give either calibration or k_scales/v_scales, not both")
            if not isinstance(calibration, Calibration):
                raise TypeError(f"calibration must be a gqa.Calibration, got {type(calibration).__name__}")
            if calibration.num_layers != self.num_layers or any(
                    a.shape != (self.kv_num_heads * self.head_size,) for a in calibration.k_absmax):
                raise ValueError("calibration is for another model shape: it has "
                                 f"{calibration.num_layers} layers of {calibration.k_absmax[0].shape[0]} "
                                 f"channels, this cache {self.num_layers} of "
                                 f"{self.kv_num_heads * self.head_size}")
            if not (isinstance(margin, numbers.Real) and np.isfinite(margin) and margin > 0):
                raise ValueError(f"margin must be a finite number > 0, got {margin!r}")
            k_scales, v_scales = calibration.scales(self.k_mode, self.v_mode, float(margin))
        needed = [n for n, st in zip(("k_scales", "v_scales"), static) if st]
        if any(x is None for x, st in zip((k_scales, v_scales), static) if st):
            raise ValueError(f"mode {self.mode!r} is quantized with static scales: give "
                             f"{' and '.join(needed)}, or a calibration (KVCache.calibration() of a "
                             "float cache)")
        return (self._layer_scales("k_scales", k_scales, self.k_mode) if static[0]
                else [None] * self.num_layers,
                self._layer_scales("v_scales", v_scales, self.v_mode) if static[1]
                else [None] * self.num_layers)

    def _layer_scales(self, name, scales, mode):
        n = self.kv_num_heads * self.head_size if _TENSOR_MODES[mode][0] == "PER_CHANNEL" else 1
        if isinstance(scales, np.ndarray) and scales.ndim <= 1:
            scales = [scales] * self.num_layers
        scales = list(scales)
        if len(scales) != self.num_layers:
            raise ValueError(f"{name} must hold one array per layer ({self.num_layers}), got {len(scales)}")
        out = []
        for i, s in enumerate(scales):
            s = np.ascontiguousarray(s, np.float32).reshape(-1)
            if s.size != n:
                raise ValueError(f"{name}[{i}] must have {n} element{'s' if n > 1 else ''} for "
                                 f"{mode}, got {s.size}")
            if not np.all(np.isfinite(s)):
                raise ValueError(f"{name}[{i}] holds a non-finite scale")
            out.append(s)
        return out

    # -- state ----------------------------------------------------------------------------
    @property
    def length(self):
        """Positions every layer holds."""
        return self._length

    @property
    def nbytes(self):
        """Bytes of all K/V caches and scales."""
        scales = sum(s.nbytes for s in self.k_scales + self.v_scales if s is not None)
        windows = sum(a.nbytes for a in self.hp_key + self.hp_value if a is not None)
        return sum(a.nbytes for a in self.key + self.value) + scales + windows

    @property
    def bytes_per_position(self):
        """Bytes of K and V codes (or floats) one position takes over all layers (no scales)."""
        return sum(a.nbytes for a in self.key + self.value) // self.max_length

    def reset(self):
        """Start a new sequence (the buffers are kept; old rows are never read again)."""
        self.truncate(0)

    def truncate(self, length):
        """Drop positions ``[length, self.length)`` of every layer (rollback, e.g. rejected
        speculative tokens); a step in progress is abandoned."""
        length = _positive_int("length", length, minimum=0)
        if length > self._length:
            raise ValueError(f"length must be <= the cache's length ({self._length}), got {length}")
        if self.recent_size and 0 < length < self._length:
            raise ValueError("truncate() to a length other than 0 is not possible with a recent "
                             "window: the float rows of positions that left it are gone "
                             "(copy_from() a float cache instead)")
        self._set_length(length)

    def calibration(self, rotary_pairs=True):
        """A :class:`Calibration` from rows ``[0, length)`` of this float cache (after rotary).
        ``rotary_pairs=False``: plain per-channel maxima of K too, tighter for contexts no longer
        than the calibration run (INT4 gains from it there) and too small beyond (module
        docstring)."""
        if self.quantized:
            raise ValueError(f"calibration() reads a float cache; this one is {self.mode!r}")
        if self._length == 0 or self._step_size:
            raise ValueError("calibration() needs a cache holding a whole calibration run (length > 0, "
                             "no step in progress)")
        n, c = self._length, self.kv_num_heads * self.head_size
        pairs = None
        if self.cos_cache is not None and rotary_pairs:
            r = 2 * self.cos_cache.shape[1]
            pairs = ((slice(0, r, 2), slice(1, r, 2)) if self.ops[0].rotary_interleaved
                     else (slice(0, r // 2), slice(r // 2, r)))

        def absmax(a, pairs=None):
            x = np.abs(a[:, :, :n].astype(np.float64))
            if pairs is not None:        # rotary moves a pair's magnitude between its channels
                norm = np.sqrt(x[..., pairs[0]] ** 2 + x[..., pairs[1]] ** 2)
                x[..., pairs[0]] = norm
                x[..., pairs[1]] = norm
            return x.max(axis=(0, 2)).reshape(c)
        return Calibration([absmax(k, pairs) for k in self.key], [absmax(v) for v in self.value],
                           n * self.batch_size)

    def copy_from(self, other, length=None):
        """Make this cache hold the first ``length`` (default all) positions of ``other``, a
        cache of the same model shape: a float source is quantized with this cache's scales
        (as the operator would have written it), a source of the same mode is copied."""
        if not isinstance(other, KVCache):
            raise TypeError(f"other must be a KVCache, got {type(other).__name__}")
        length = other.length if length is None else _positive_int("length", length, minimum=0)
        same_shape = (other.num_layers, other.batch_size, other.kv_num_heads, other.head_size) == (
            self.num_layers, self.batch_size, self.kv_num_heads, self.head_size)
        if not same_shape:
            raise ValueError("other has another shape (layers, batch, KV heads, head size)")
        if length > other.length or length > self.max_length:
            raise ValueError(f"length ({length}) must be <= other's length ({other.length}) and "
                             f"<= max_length ({self.max_length})")
        if other.mode != self.mode and other.quantized:
            raise ValueError(f"copy_from takes a float cache or one of this mode ({self.mode!r}), "
                             f"got {other.mode!r}")
        if self.quantized and not other.quantized:
            self._copy_float(other, length)
            return
        rotated = any(r is not None for pair in self.rotations for r in pair)
        if self.sink_size + self.recent_size > 0 or rotated:
            raise ValueError("copy_from into a cache with float windows or rotations takes a float "
                             "cache")
        for li in range(self.num_layers):
            self.key[li][:, :, :length] = other.key[li][:, :, :length]
            self.value[li][:, :, :length] = other.value[li][:, :, :length]
        self._set_length(length)

    def _copy_float(self, other, length):
        """copy_from a float cache into this quantized one: rows turned by the rotations,
        quantized as the operator writes them (scales per tensor / channel, or per group), and
        the float windows of `length` positions.  The rotation is NumPy's product here, the
        kernel's in the operator: where they round apart a code may differ by one step."""
        from ._api import quantize
        rho = (self.ops[0].k_quant_rho, self.ops[0].v_quant_rho)
        ns = min(self.sink_size, length)
        nr = min(self.recent_size, length - ns)
        keep = list(range(ns)) + list(range(length - nr, length))
        for li in range(self.num_layers):
            for i, (dst, hp, src) in enumerate(((self.key, self.hp_key, other.key),
                                                (self.value, self.hp_value, other.value))):
                rows = np.ascontiguousarray(src[li][:, :, :length], np.float32)
                r = self.rotations[li][i]
                if r is not None:
                    rows = np.einsum("bjtd,jde->bjte", rows, r).astype(np.float32)
                quant, bits, group = self._sides[i]
                if group:
                    _, size, metadata = group
                    dst[li][:, :, :length] = quantize(rows, bits=bits, group_size=size, rho=rho[i],
                                                      metadata=metadata)
                else:
                    scales = (self.k_scales, self.v_scales)[i][li]
                    H = self.head_size
                    for h in range(self.kv_num_heads):
                        s = scales[h * H:(h + 1) * H] if quant == "PER_CHANNEL" else scales
                        dst[li][:, h, :length] = quantize(rows[:, h], s, bits=bits)
                if hp[li] is not None:
                    hp[li][...] = 0
                    hp[li][:, :, :len(keep)] = rows[:, :, keep].astype(self.dtype)
        self._set_length(length)

    # -- the step -------------------------------------------------------------------------
    def attend(self, layer, query, key, value):
        """Attention of layer ``layer`` for the step's S new tokens: their K/V are written at
        positions ``[length, length + S)`` (in place) and the output ``[B, S, num_heads *
        head_size]`` returned.  Every check (layer, step size, capacity, then the operator's
        own) passes before anything is written."""
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, numbers.Integral):
            raise TypeError(f"layer must be an int, got {type(layer).__name__}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        S = np.shape(query)[1] if np.ndim(query) == 3 else None
        if S is None or S < 1:
            raise ValueError(f"query must be [B, S, {self.num_heads * self.head_size}] with S >= 1, "
                             f"got shape {np.shape(query)}")
        if self._in_step[layer]:
            raise ValueError(f"layer {layer} already holds this step's tokens: give every layer the "
                             "step once (length advances when the last layer has it)")
        if self._step_size and S != self._step_size:
            raise ValueError(f"this step gives {self._step_size} tokens to the other layers; layer "
                             f"{layer} got {S}")
        T = self._length + S
        if T > self.max_length:
            raise ValueError(f"KVCache is full: {self._length} + {S} positions exceed max_length "
                             f"({self.max_length}); reset() or truncate() it, or allocate more")
        self._seqlens.fill(T - 1)
        out = self._run(layer, query, key, value, T)
        self._in_step[layer] = True
        self._step_size = S
        self._step_layers += 1
        if self._step_layers == self.num_layers:
            self._set_length(T)
        return out

    def _run(self, layer, query, key, value, T):
        """The attention of one layer, caches updated in place to total length T (the
        operator; gqa/_model_peers.py substitutes other implementations)."""
        kc, vc = self.key[layer], self.value[layer]
        hk, hv = self.hp_key[layer], self.hp_value[layer]
        rk, rv = self.rotations[layer]
        return self.ops[layer](query, key, value, kc, vc, self._seqlens, T, self.cos_cache,
                               self.sin_cache, k_scale=self.k_scales[layer],
                               v_scale=self.v_scales[layer], past_hp_key=hk, past_hp_value=hv,
                               oscar_rotation_k=rk, oscar_rotation_v=rv, present_key=kc,
                               present_value=vc, present_hp_key=hk, present_hp_value=hv,
                               num_threads=self.num_threads)[0]

    def __repr__(self):
        return (f"KVCache(layers={self.num_layers}, B={self.batch_size}, N={self.num_heads}, "
                f"Nkv={self.kv_num_heads}, H={self.head_size}, mode={self.mode!r}, "
                f"length={self._length}/{self.max_length})")
