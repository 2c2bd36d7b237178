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
  format (``CacheFormat.layout``): ``Hp = H`` (float32/float16 or int8 codes), ``(H + 1) // 2``
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
import copy
import numbers

import numpy as np

from ._validate import finite_real
from ._formats import CacheFormat, attributes, cache_options, mode_name, parse_mode
from ._config import _check_threads
from ._operator import INT32_MAX, GroupQueryAttention
from ._steps import Steps, frontier

SCALE_FLOOR = 1e-6


def rotary_caches(max_positions, rotary_dim, base=10000.0):
    """cos/sin caches ``[max_positions, rotary_dim // 2]`` (float32) of the rotary embedding
    with frequencies ``base ** (-2i / rotary_dim)``, computed in float64; ``max_positions >=
    1``, ``rotary_dim`` even and >= 2, ``base`` finite and > 0."""
    max_positions = _positive_int("max_positions", max_positions)
    if _positive_int("rotary_dim", rotary_dim, minimum=2) % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    if not finite_real(base, "base") > 0:
        raise ValueError(f"base must be > 0, got {base}")
    inv = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.arange(max_positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class Calibration:
    """Per-layer channel-wise absolute maxima of cached K and V (``k_absmax[layer]``,
    ``v_absmax[layer]``: float64 ``[Nkv * H]``, element ``kvh * H + c``), from which a
    quantized KVCache takes its scales.  ``a.combined(b)`` is the elementwise maximum of two
    calibrations (several calibration texts)."""

    def __init__(self, k_absmax, v_absmax, tokens):
        self.k_absmax = _absmax_list(k_absmax, "k_absmax")
        self.v_absmax = _absmax_list(v_absmax, "v_absmax")
        if len(self.k_absmax) != len(self.v_absmax) or any(
                a.shape != b.shape for a, b in zip(self.k_absmax, self.v_absmax)):
            raise ValueError("k_absmax and v_absmax must hold arrays of the same shapes, one per "
                             f"layer: got {[a.shape for a in self.k_absmax]} and "
                             f"{[a.shape for a in self.v_absmax]}")
        self.tokens = _positive_int("tokens", tokens, minimum=0)

    @property
    def num_layers(self):
        return len(self.k_absmax)

    def combined(self, other):
        if not isinstance(other, Calibration):
            raise TypeError(f"other must be a gqa.Calibration, got {type(other).__name__}")
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


def _absmax_list(arrays, name):
    """One float64 [Nkv * H] array per layer (at least one), finite and >= 0."""
    if isinstance(arrays, (str, bytes, np.ndarray)) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{name} must be a list of one array per layer, got {type(arrays).__name__}")
    if not arrays:
        raise ValueError(f"{name} must hold at least one layer")
    out = []
    for i, a in enumerate(arrays):
        try:
            a = np.array(a, np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{name}[{i}] must be an array of real numbers") from None
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"{name}[{i}] must be 1-D [kv_num_heads * head_size], got shape {a.shape}")
        if not (np.isfinite(a).all() and (a >= 0).all()):
            raise ValueError(f"{name}[{i}] must hold finite absolute maxima >= 0")
        out.append(a)
    return out


def _scale(absmax, mode, margin):
    f = CacheFormat.parse(mode)
    if not f.static:
        return None
    a = absmax if f.per_channel else np.array([absmax.max()])
    return np.maximum(a * margin / f.top_code, SCALE_FLOOR).astype(np.float32)


def _configuration(name, given):
    """The KVCache keywords of a mode or configuration name (gqa/_formats.py's
    cache_options), merged with those given: an option the name sets may not also be given
    otherwise.  Returns mode, k_rho, v_rho, sink_size, recent_size and rotations."""
    if not isinstance(name, str):
        raise TypeError(f"mode must be a str, got {type(name).__name__}")
    options = cache_options(name)
    defaults = dict(k_rho=1.0, v_rho=1.0, sink_size=0, recent_size=0, rotations=None)
    out = dict(given, mode=options.pop("mode"))
    rot = options.pop("rotations", None)
    for key, value in options.items():
        if not _is_default(given[key], defaults[key]):
            raise ValueError(f"mode={name!r} sets {key}; it must not be given as well "
                             f"(got {key}={given[key]!r})")
        out[key] = value
    if rot == "hadamard":
        if given["rotations"] is not None:
            raise ValueError(f"mode={name!r} sets rotations ('+had'); it must not be given as well")
        out["rotations"] = "hadamard"
    elif rot == "calibrated" and (given["rotations"] is None or isinstance(given["rotations"], str)):
        raise ValueError(f"mode={name!r} names calibrated rotations ('+rot'): give them as "
                         "rotations=[(R_K, R_V), ...] (gqa.calibrate_rotations)")
    return out


def _is_default(value, default):
    return value is default or (default is not None and isinstance(value, numbers.Real)
                                and not isinstance(value, bool) and value == default)


def _positive_int(name, value, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > INT32_MAX:      # lengths, heads and layers reach the operator as C int
        raise ValueError(f"{name} must be <= {INT32_MAX}, got {value}")
    return int(value)


def _rotation_array(r):
    """A rotation as the operator takes it: float16 kept (its tolerance is float16's), any
    other type as float32."""
    if r is None:
        return None
    r = np.asarray(r)
    return np.ascontiguousarray(r, np.float16 if r.dtype == np.float16 else np.float32)


class KVCache(Steps):
    """Per-layer KV caches of a batch of sequences, with one GroupQueryAttention per layer.

    ``KVCache(num_layers=30, num_heads=9, kv_num_heads=3, head_size=64, max_length=2048,
    mode="int8-pc/pt", calibration=cal, rotary=rotary_caches(2048, 64, 1e5),
    rotary_interleaved=1)``; then per step and layer ``out = cache.attend(layer, q, k, v)``
    with ``q [B, S, num_heads * head_size]`` and ``k``, ``v`` ``[B, S, kv_num_heads *
    head_size]`` (before rotary; float32, or float16 with ``dtype=np.float16``).

    mode: a name of :func:`parse_mode` (or ``k_mode``/``v_mode`` separately).  Quantized modes
    need scales: ``k_scales``/``v_scales`` (one array per layer of 1 or ``kv_num_heads *
    head_size`` float32 > 0, or one number or array for every layer) or a :class:`Calibration` (and
    ``margin``).  ``rotary``: ``(cos_cache, sin_cache)`` covering ``max_length`` positions, or
    None for no rotary.  ``local_window_size``, ``softcap``, ``scale`` and ``accuracy_level``
    are the operator's attributes; ``num_threads`` its per-call thread count.  With float
    windows (``sink_size`` / ``recent_size``, or a configuration name's ``+s<sink>r<recent>``),
    ``rollback_size`` positions that left the recent window keep their float rows, so
    ``truncate`` can take that many back (``rollback_floor``).
    """

    def __init__(self, *, num_layers, num_heads, kv_num_heads, head_size, max_length, batch_size=1,
                 mode="float", k_mode=None, v_mode=None, k_scales=None, v_scales=None,
                 calibration=None, margin=1.0, dtype=np.float32, rotary=None, rotary_interleaved=0,
                 local_window_size=-1, softcap=0.0, scale=0.0, num_threads=None, k_rho=1.0,
                 v_rho=1.0, sink_size=0, recent_size=0, rotations=None, accuracy_level=0,
                 rollback_size=0):
        self.num_layers = _positive_int("num_layers", num_layers)
        self.num_heads = _positive_int("num_heads", num_heads)
        self.kv_num_heads = _positive_int("kv_num_heads", kv_num_heads)
        self.head_size = _positive_int("head_size", head_size)
        self.max_length = _positive_int("max_length", max_length)
        self.batch_size = _positive_int("batch_size", batch_size)
        rollback_size = _positive_int("rollback_size", rollback_size, minimum=0)
        if (k_mode is None) != (v_mode is None):
            raise ValueError("k_mode and v_mode go together (or use mode= for both)")
        if k_mode is None:
            options = _configuration(mode, dict(k_rho=k_rho, v_rho=v_rho, sink_size=sink_size,
                                                recent_size=recent_size, rotations=rotations))
            k_rho, v_rho = options["k_rho"], options["v_rho"]
            sink_size, recent_size = options["sink_size"], options["recent_size"]
            rotations = options["rotations"]
            self.k_format, self.v_format = parse_mode(options["mode"])
        else:
            self.k_format, self.v_format = CacheFormat.parse(k_mode), CacheFormat.parse(v_mode)
        attrs = attributes(self.k_format, self.v_format, k_rho, v_rho)
        self.k_mode, self.v_mode = self.k_format.name, self.v_format.name
        self.mode = mode_name(self.k_format, self.v_format)
        self.quantized = self.k_format.quantized
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:       # a name NumPy does not know here ("bfloat16" without ml_dtypes)
            raise TypeError(f"dtype must be float32 or float16, got {dtype!r}") from None
        if self.dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise TypeError(f"dtype must be float32 or float16, got {self.dtype}")
        self.k_scales, self.v_scales = self._scales(k_scales, v_scales, calibration, margin)
        self.cos_cache = self.sin_cache = None
        do_rotary = 0
        if rotary is not None:
            if not (isinstance(rotary, (tuple, list)) and len(rotary) == 2):
                raise TypeError(f"rotary must be None or a pair (cos_cache, sin_cache), got "
                                f"{type(rotary).__name__}")
            cos, sin = rotary
            cos, sin = np.ascontiguousarray(cos, self.dtype), np.ascontiguousarray(sin, self.dtype)
            if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[0] < self.max_length:
                raise ValueError(f"rotary must be (cos_cache, sin_cache) of one shape [P, rotary_dim/2] "
                                 f"with P >= max_length ({self.max_length}), got {cos.shape} and {sin.shape}")
            self.cos_cache, self.sin_cache, do_rotary = cos, sin, 1
        per_layer = [self._per_layer(n, x) for n, x in (("local_window_size", local_window_size),
                                                          ("softcap", softcap), ("scale", scale))]
        self.ops = [GroupQueryAttention(num_heads=self.num_heads, kv_num_heads=self.kv_num_heads,
                                        do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                                        local_window_size=w, softcap=c, scale=a,
                                        sink_size=sink_size, recent_size=recent_size,
                                        accuracy_level=accuracy_level, **attrs)
                    for w, c, a in zip(*per_layer)]
        self.sink_size, self.recent_size = self.ops[0].sink_size, self.ops[0].recent_size
        self.rotations = self._rotations(rotations)
        for i, f in enumerate((self.k_format, self.v_format)):
            if (calibration is not None and f.static
                    and any(pair[i] is not None for pair in self.rotations)):
                raise ValueError(f"a calibration holds the maxima of unrotated rows, and "
                                 f"{'K' if i == 0 else 'V'}'s static scales would be applied to "
                                 "rotated ones: with rotations give k_scales / v_scales measured "
                                 "on the rotated rows")
        self.num_threads = _check_threads(num_threads, "num_threads")
        (kw, kdt), (vw, vdt) = (f.layout(self.head_size, self.dtype)
                                for f in (self.k_format, self.v_format))
        rows = (self.batch_size, self.kv_num_heads, self.max_length)
        self.key = [np.zeros(rows + (kw,), kdt) for _ in range(self.num_layers)]
        self.value = [np.zeros(rows + (vw,), vdt) for _ in range(self.num_layers)]
        # the float windows (in place): [B, Nkv, min(sink_size + recent_size, max_length), H] of
        # the query dtype (a sequence never holds more positions than max_length)
        hp = (self.batch_size, self.kv_num_heads, min(self.sink_size + self.recent_size,
                                                      self.max_length), self.head_size)
        windows = self.sink_size + self.recent_size > 0
        self.hp_key = [np.zeros(hp, self.dtype) if windows else None for _ in range(self.num_layers)]
        self.hp_value = [np.zeros(hp, self.dtype) if windows else None for _ in range(self.num_layers)]
        # the rollback rows: [B, Nkv, m, H], the float rows of the last m positions that became
        # history, which the operator writes (m = min(rollback_size, max_length); none without
        # a recent window)
        self.rollback_size = min(rollback_size, self.max_length) if windows and self.recent_size else 0
        ring = hp[:2] + (self.rollback_size,) + hp[3:]
        self.undo_key = self.undo_value = None
        if self.rollback_size:
            self.undo_key = [np.zeros(ring, self.dtype) for _ in range(self.num_layers)]
            self.undo_value = [np.zeros(ring, self.dtype) for _ in range(self.num_layers)]
        self._undo_lo = np.zeros(self.batch_size, np.int64)
        self._seqlens = np.zeros(self.batch_size, np.int32)
        self._set_length(0)
        self._check_layers((kw, kdt), (vw, vdt), hp)

    def _check_layers(self, k_layout, v_layout, hp):
        """Each layer's operator checks now, on a one-token step into one-row scratch caches,
        everything it can before the first attend: the head size against the formats and the
        rotary caches, the kept inputs' values (scales, rotary caches, rotations)."""
        B, S = self.batch_size, 1
        q = np.zeros((B, S, self.num_heads * self.head_size), self.dtype)
        kv = np.zeros((B, S, self.kv_num_heads * self.head_size), self.dtype)
        rows = (B, self.kv_num_heads, 1)
        for li, op in enumerate(self.ops):
            kc, vc = np.zeros(rows + (k_layout[0],), k_layout[1]), np.zeros(rows + (v_layout[0],), v_layout[1])
            hk = hv = None
            if self.hp_key[li] is not None:
                hk, hv = np.zeros(rows + hp[3:], self.dtype), np.zeros(rows + hp[3:], self.dtype)
            rk, rv = self.rotations[li]
            op(q, kv, kv, kc, vc, np.zeros(B, np.int32), S, self.cos_cache, self.sin_cache,
               k_scale=self.k_scales[li], v_scale=self.v_scales[li], past_hp_key=hk,
               past_hp_value=hv, oscar_rotation_k=rk, oscar_rotation_v=rv, present_key=kc,
               present_value=vc, present_hp_key=hk, present_hp_value=hv, num_threads=1)
            op._signatures.clear()

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
        try:
            rotations = list(rotations)
        except TypeError:
            raise TypeError(f"rotations must be None, 'hadamard' or a list of one (R_K, R_V) pair "
                            f"per layer, got {type(rotations).__name__}") from None
        if len(rotations) != self.num_layers:
            raise ValueError(f"rotations must hold one (R_K, R_V) pair per layer ({self.num_layers}), "
                             f"got {len(rotations)}")
        shape = (self.kv_num_heads, self.head_size, self.head_size)
        out = []
        for i, pair in enumerate(rotations):
            if isinstance(pair, (str, np.ndarray)) or not hasattr(pair, "__len__") or len(pair) != 2:
                raise TypeError(f"rotations[{i}] must be a pair (R_K, R_V) of arrays "
                                f"{shape} or None, got {type(pair).__name__}"
                                + (f" of length {len(pair)}" if hasattr(pair, "__len__") else ""))
            rk, rv = pair
            rk, rv = _rotation_array(rk), _rotation_array(rv)
            for name, r in (("R_K", rk), ("R_V", rv)):
                if r is not None and r.shape != shape:
                    raise ValueError(f"rotations[{i}] {name} must have shape {shape}, got {r.shape}")
            out.append((rk, rv))
        return out

    def _per_layer(self, name, value):
        """An operator attribute given once for every layer or as one value per layer."""
        if isinstance(value, (list, tuple, np.ndarray)):
            if len(value) != self.num_layers:
                raise ValueError(f"{name} must be one value or one per layer ({self.num_layers}), "
                                 f"got {len(value)}")
            return list(value)
        return [value] * self.num_layers

    def _set_length(self, length):
        """Every sequence of every layer holds `length` positions; no step in progress."""
        self._set_lengths(np.full(self.batch_size, length, np.int64))

    def _set_lengths(self, lengths):
        """Sequence b of every layer holds lengths[b] positions; no step in progress."""
        self._lengths = lengths = np.ascontiguousarray(lengths, np.int64)
        self._length = int(lengths.max())
        self._step_size = 0                       # S of the step in progress (0: none)
        self._step_new = None                     # its new positions per sequence
        self._step_uniform = False                # ... all S (no lengths=)
        self._step_total = 0                      # its total length T (_seqlens holds Tb - 1)
        self._in_step = [False] * self.num_layers  # layers that have had the step
        self._step_layers = 0

    def _scales(self, k_scales, v_scales, calibration, margin):
        static = [self.k_format.static, self.v_format.static]
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
        """One flat float32 array per layer: `scales` is one scale for every layer (a real
        number or an array of at most one dimension) or a sequence of one per layer; each
        finite and > 0 (a zero scale would store every value as 0, a negative one is no
        calibrated range)."""
        n = self.kv_num_heads * self.head_size if CacheFormat.parse(mode).per_channel else 1
        if (isinstance(scales, numbers.Real) and not isinstance(scales, (bool, np.bool_))) or (
                isinstance(scales, np.ndarray) and scales.ndim <= 1):
            scales = [scales] * self.num_layers
        elif isinstance(scales, (str, bytes)) or not isinstance(scales, (np.ndarray, list, tuple)):
            raise TypeError(f"{name} must be a number or float32 array for every layer, or a "
                            f"list of one per layer, got {type(scales).__name__}")
        scales = list(scales)
        if len(scales) != self.num_layers:
            raise ValueError(f"{name} must hold one array per layer ({self.num_layers}), got {len(scales)}")
        out = []
        for i, s in enumerate(scales):
            if isinstance(s, (bool, np.bool_, str, bytes)) or not (
                    isinstance(s, numbers.Real) or isinstance(s, (np.ndarray, list, tuple))):
                raise TypeError(f"{name}[{i}] must be a number or a float32 array, got {type(s).__name__}")
            try:
                s = np.ascontiguousarray(s, np.float32).reshape(-1)
            except (TypeError, ValueError):
                raise TypeError(f"{name}[{i}] must be a number or a float32 array, got {s!r}") from None
            if s.size != n:
                raise ValueError(f"{name}[{i}] must have {n} element{'s' if n > 1 else ''} for "
                                 f"{mode}, got {s.size}")
            if not np.all(np.isfinite(s)):
                raise ValueError(f"{name}[{i}] holds a non-finite scale")
            if not np.all(s > 0):
                bad = int(np.argmin(s > 0))
                raise ValueError(f"{name}[{i}] element {bad} is {float(s[bad])}: scales must be > 0")
            out.append(s)
        return out

    # -- state ----------------------------------------------------------------------------
    @property
    def length(self):
        """Positions every layer holds: the longest sequence's (``lengths`` per sequence)."""
        return self._length

    @property
    def lengths(self):
        """Positions each sequence of the batch holds (int64 ``[batch_size]``, a copy)."""
        return self._lengths.copy()

    @property
    def ragged(self):
        """The sequences hold different lengths (a prompt step given ``lengths=``)."""
        return bool((self._lengths != self._length).any())

    @property
    def nbytes(self):
        """Bytes of all K/V caches and scales."""
        scales = sum(s.nbytes for s in self.k_scales + self.v_scales if s is not None)
        windows = sum(a.nbytes for a in self.hp_key + self.hp_value if a is not None)
        windows += sum(a.nbytes for a in (self.undo_key or []) + (self.undo_value or []))
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
        speculative tokens); a step in progress is abandoned (the layers that had it are taken
        back too).  ``length``: one length, which no sequence then exceeds, or one per sequence
        (each at most its own).  With float windows a sequence goes back to any length up to
        ``sink_size`` and from ``rollback_floor`` on (the float rows its windows then need);
        elsewhere ValueError, nothing changed."""
        if isinstance(length, (list, tuple, np.ndarray)):
            new = np.array([_positive_int(f"length[{b}]", n, minimum=0) for b, n in enumerate(length)],
                           np.int64)
            if new.shape != (self.batch_size,) or (new > self._lengths).any():
                raise ValueError(f"length must hold one length per sequence ({self.batch_size}), "
                                 f"each <= its current one {self._lengths.tolist()}, got {new.tolist()}")
        else:
            length = _positive_int("length", length, minimum=0)
            if length > self._length:
                raise ValueError(f"length must be <= the cache's length ({self._length}), got {length}")
            new = np.minimum(self._lengths, length)
        if self.hp_key[0] is not None:
            self._truncate_windows(new)
            self._undo_lo = np.minimum(self._undo_lo, [frontier(int(n), self.sink_size, self.recent_size)
                                                       for n in new]).astype(np.int64)
        self._set_lengths(new)

    @property
    def rollback_floor(self):
        """Per sequence (int64 ``[batch_size]``) the smallest length above ``sink_size`` that
        ``truncate`` takes it back to: the float windows of a length hold the first sink_size
        positions and the last recent_size, so going back to n needs the float rows of
        positions ``[n - recent_size, n)``; the cache keeps those of its windows and of the
        last ``rollback_size`` positions that became history (left its recent window, or went
        straight into the codes).  0: any length; without windows always 0."""
        if self.hp_key[0] is None or not self.recent_size:
            return np.zeros(self.batch_size, np.int64)
        lo = self._undo_lo
        return np.where(lo <= self.sink_size, 0, np.minimum(lo + self.recent_size, self._lengths))

    def _truncate_windows(self, new):
        """Each layer's float windows of its current positions (those of a step in progress
        included) rearranged into the windows of `new`: every plan is made (ValueError where a
        position it needs is held in codes only) before any buffer changes."""
        lens = self._lengths
        ahead = lens + (self._step_new if self._step_size else 0)
        held = [ahead if self._step_size and self._in_step[li] else lens
                for li in range(self.num_layers)]       # each layer's positions
        plans = {}
        for got in held:
            for b in range(self.batch_size):
                key = (int(got[b]), b)
                if key not in plans:
                    plans[key] = self._window_sources(b, key[0], int(new[b]))
        for li, got in enumerate(held):
            for b in range(self.batch_size):
                plan = plans[(int(got[b]), b)]
                if plan is None:
                    continue
                sink, slots, rows = plan
                for hp, ring in ((self.hp_key[li], self.undo_key and self.undo_key[li]),
                                 (self.hp_value[li], self.undo_value and self.undo_value[li])):
                    parts = [hp[b, :, :sink], hp[b][:, rows]]
                    if len(slots):
                        parts.insert(1, ring[b][:, slots])
                    kept = np.concatenate(parts, axis=1)
                    hp[b] = 0
                    hp[b, :, :kept.shape[1]] = kept

    def _window_sources(self, b, L, n):
        """Where the windows of n <= L positions of sequence b find their float rows, given its
        windows of L positions and rollback rows: (sink rows, rollback rows, window rows), in
        position order, or None (nothing moves); ValueError where one is held in codes only."""
        if n == L:
            return None
        s, r, m = self.sink_size, self.recent_size, self.rollback_size
        ns, ns_o = min(s, n), min(s, L)
        start, f, lo = frontier(n, s, r), frontier(L, s, r), int(self._undo_lo[b])
        if max(start, ns_o) < min(n, lo):
            raise ValueError(
                f"truncate({n}): sequence {b}'s recent window (recent_size={r}) needs the float "
                f"rows of positions [{start}, {n}), and positions [{max(start, ns_o)}, "
                f"{min(n, lo)}) of this cache are held in its codes only. A KVCache keeps the "
                f"float rows of its windows and of the last rollback_size={m} positions that "
                f"left its recent window, so truncate reaches lengths up to sink_size = {s} and "
                f"from cache.rollback_floor = {lo + r} on; to go back to {n}, allocate it with a "
                f"larger rollback_size, copy_from() a float KVCache that kept every position "
                f"(cache.copy_from(float_cache, {n})), or reset() and attend the tokens again")
        ring = range(start, min(n, f))
        return ns, [p % m for p in ring], [ns_o + p - f for p in range(max(start, f), n)]

    def take(self, indices):
        """A cache of the sequences ``indices`` (any order, repeats allowed, e.g. beam search's
        reorder or a batch expanded per returned sequence): new buffers, this cache's formats,
        scales, rotations and operators; no step in progress."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu" or \
                (idx < 0).any() or (idx >= self.batch_size).any():
            raise ValueError(f"indices must be a non-empty 1-D sequence of ints in [0, "
                             f"{self.batch_size}), got {np.asarray(indices).tolist()!r}")
        if self._step_size:
            raise ValueError(f"take() during a step: layers {[i for i, d in enumerate(self._in_step) if d]} "
                             "have had it and the others not; give them the step, or truncate() "
                             "to abandon it, first")
        out = copy.copy(self)
        out.batch_size = int(idx.size)
        out.key = [a[idx] for a in self.key]
        out.value = [a[idx] for a in self.value]
        out.hp_key = [None if a is None else a[idx] for a in self.hp_key]
        out.hp_value = [None if a is None else a[idx] for a in self.hp_value]
        if self.undo_key is not None:
            out.undo_key = [a[idx] for a in self.undo_key]
            out.undo_value = [a[idx] for a in self.undo_value]
        out._undo_lo = self._undo_lo[idx].copy()
        out._seqlens = np.zeros(out.batch_size, np.int32)
        out._set_lengths(self._lengths[idx].copy())
        return out

    def calibration(self, rotary_pairs=True):
        """A :class:`Calibration` from rows ``[0, length)`` of this float cache (after rotary).
        ``rotary_pairs=False``: plain per-channel maxima of K too, tighter for contexts no longer
        than the calibration run (INT4 gains from it there) and too small beyond (module
        docstring)."""
        if self.quantized:
            raise ValueError(f"calibration() reads a float cache; this one is {self.mode!r}")
        if self._length == 0 or self._step_size or self.ragged:
            raise ValueError("calibration() needs a cache holding a whole calibration run (length > 0, "
                             "the same for every sequence, no step in progress)")
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
        if other.ragged:
            raise ValueError("copy_from takes a cache whose sequences hold the same length")
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
        self._undo_lo[:] = frontier(length, self.sink_size, self.recent_size)
        self._set_length(length)

    def _copy_float(self, other, length):
        """copy_from a float cache into this quantized one: rows turned by the rotations,
        quantized as the operator writes them (scales per tensor / channel, or per group), and
        the float windows of `length` positions.  The rotation is NumPy's product here, the
        kernel's in the operator: where they round apart a code may differ by one step."""
        from ._api import quantize
        rho = (self.ops[0].k_quant_rho, self.ops[0].v_quant_rho)
        ns = min(self.sink_size, length)
        start = frontier(length, self.sink_size, self.recent_size)
        keep = list(range(ns)) + list(range(start, length))
        lo = max(ns, start - self.rollback_size)      # the rollback rows: positions [lo, start)
        for li in range(self.num_layers):
            for i, (dst, hp, src) in enumerate(((self.key, self.hp_key, other.key),
                                                (self.value, self.hp_value, other.value))):
                rows = np.ascontiguousarray(src[li][:, :, :length], np.float32)
                r = self.rotations[li][i]
                if r is not None:
                    rows = np.einsum("bjtd,jde->bjte", rows, r).astype(np.float32)
                f = (self.k_format, self.v_format)[i]
                if f.grouped:
                    dst[li][:, :, :length] = quantize(rows, bits=f.bits, group_size=f.group,
                                                      rho=rho[i], metadata=f.metadata)
                else:
                    scales = (self.k_scales, self.v_scales)[i][li]
                    H = self.head_size
                    for h in range(self.kv_num_heads):
                        s = scales[h * H:(h + 1) * H] if f.per_channel else scales
                        dst[li][:, h, :length] = quantize(rows[:, h], s, bits=f.bits)
                if hp[li] is not None:
                    hp[li][...] = 0
                    hp[li][:, :, :len(keep)] = rows[:, :, keep].astype(self.dtype)
                ring = (self.undo_key, self.undo_value)[i]
                if ring is not None:
                    ring[li][:, :, [p % self.rollback_size for p in range(lo, start)]] = \
                        rows[:, :, lo:start].astype(self.dtype)
        self._undo_lo[:] = lo
        self._set_length(length)

    # -- the step (attend, _run: gqa/_steps.pyx) ------------------------------------------
    def _given_positions(self, S, lengths):
        """A prompt's ``lengths=``: the positions a step of S rows adds to each sequence (int64
        [B]), each in [1, S], into an empty cache only."""
        if self._length:
            raise ValueError("lengths= is for a prompt into an empty cache (reset() first); "
                             "later steps give every sequence its S tokens")
        try:
            new = np.array([_positive_int(f"lengths[{b}]", n) for b, n in enumerate(lengths)],
                           np.int64)
        except TypeError:
            raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}") from None
        if new.shape != (self.batch_size,) or (new > S).any():
            raise ValueError(f"lengths must hold one count in [1, S = {S}] per sequence "
                             f"({self.batch_size}), got {new.tolist()}")
        return new

    def __repr__(self):
        return (f"KVCache(layers={self.num_layers}, B={self.batch_size}, N={self.num_heads}, "
                f"Nkv={self.kv_num_heads}, H={self.head_size}, mode={self.mode!r}, "
                f"length={self._length if not self.ragged else self._lengths.tolist()}/"
                f"{self.max_length})")
