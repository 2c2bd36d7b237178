"""The GroupQueryAttention operator (ONNX Runtime 1.31.1 CPU contract).

The attributes are validated here, once, when the operator is made; a call's inputs are
validated in gqa/_call.pyx, completely, before any output or caller buffer is written, and
the compute (gqa/_attention.pyx) then runs without the GIL.
"""
import numbers

import numpy as np

from . import _call
from . import _group
from . import _validate as v

_QUANT_TYPES = ("NONE", "PER_TENSOR", "PER_CHANNEL", "PER_GROUP")

_INT32_MAX = 2 ** 31 - 1   # sizes and lengths reach the compute as C int


def _int_attr(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _quant_attr(name, value):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    u = value.upper()
    if u not in _QUANT_TYPES:
        raise ValueError(f"Invalid KV quantization type {name}={value!r}. "
                         f"Valid values are: NONE, PER_TENSOR, PER_CHANNEL, PER_GROUP")
    return u


def _side_bits(kq, vq, bits, k_bits, v_bits):
    """(K's, V's) code widths: k_cache_bit_width / v_cache_bit_width where given (> 0), else
    kv_cache_bit_width; 0 for float caches.  K and V are both float or both quantized, each
    side with its own type: PER_TENSOR / PER_CHANNEL take 4 or 8 bits, PER_GROUP 2, 4 or 8."""
    if (kq == "NONE") != (vq == "NONE"):
        raise ValueError(f"k_quant_type ({kq}) and v_quant_type ({vq}) must both be NONE or "
                         "both quantized")
    if kq == "NONE":
        for name, b in (("kv_cache_bit_width", bits), ("k_cache_bit_width", k_bits),
                        ("v_cache_bit_width", v_bits)):
            if b != 0:
                raise ValueError(f"{name} must be 0 when quantization is disabled, got {b}")
        return 0, 0
    out = []
    for side, q, own in (("k", kq, k_bits), ("v", vq, v_bits)):
        if own < 0:
            raise ValueError(f"{side}_cache_bit_width must be >= 0 (0: kv_cache_bit_width), got {own}")
        b = own or bits
        name = f"{side}_cache_bit_width" if own else "kv_cache_bit_width"
        if q == "PER_GROUP" and b not in (2, 4, 8):
            raise ValueError(f"{name} must be 2, 4 or 8 for PER_GROUP caches, got {b} "
                             f"({side.upper()} is PER_GROUP)")
        if q != "PER_GROUP" and b not in (4, 8):
            raise ValueError(f"{name} must be 4 or 8 when quantization is enabled, got {b} "
                             f"({side.upper()} is {q}; 2 bits need PER_GROUP)")
        out.append(b)
    if bits not in (0, 2, 4, 8):  # unused when both sides give their own width: still no junk
        raise ValueError(f"kv_cache_bit_width must be 0, 2, 4 or 8, got {bits}")
    return tuple(out)


class GroupQueryAttention:
    """One GroupQueryAttention node: attributes validated once, then called per step.

    ``GroupQueryAttention(num_heads=32, kv_num_heads=8, k_quant_type="PER_TENSOR",
    v_quant_type="PER_TENSOR", kv_cache_bit_width=8)(query, key, value, past_key, ...)``
    returns ``(output, present_key, present_value[, output_qk])``.  Attribute names,
    meanings and defaults are ONNX Runtime's (see the README); ``q_norm_weight`` /
    ``k_norm_weight`` with ``qk_norm_epsilon`` (the per-head RMS norm of Q and K before
    rotary) go beyond its CPU kernel.

    K and V may each have their own type (beyond onnxruntime: ``k_quant_type`` and
    ``v_quant_type`` any of PER_TENSOR, PER_CHANNEL and PER_GROUP) and width
    (``k_cache_bit_width`` / ``v_cache_bit_width``; 0 takes ``kv_cache_bit_width``).

    ``k_quant_type = v_quant_type = "PER_GROUP"`` (onnxruntime main's name) selects the
    per-group asymmetric caches: ``kv_cache_bit_width`` 8, 4 or 2, ``kv_quant_group_size``
    channels per group (0: the whole head), the clip quantiles ``k_quant_rho`` /
    ``v_quant_rho`` and ``metadata_type`` ("fp32" / "fp16") of the inline scale and zero point;
    the caches are uint8 ``[B, Nkv, T, gqa.group_row_bytes(H, bits, group, metadata)]`` and
    there are no k_scale / v_scale inputs.
    """

    def __init__(self, *, num_heads, kv_num_heads, scale=0.0, softcap=0.0, local_window_size=-1,
                 causal=1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1, qk_output=0,
                 k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0,
                 qk_norm_epsilon=1e-6, sliding_window_cache=0, kv_quant_group_size=0,
                 k_quant_rho=1.0, v_quant_rho=1.0, metadata_type="fp32", sink_size=0, recent_size=0,
                 window_partition="causal", k_cache_bit_width=0, v_cache_bit_width=0):
        self.num_heads = _int_attr("num_heads", num_heads)
        self.kv_num_heads = _int_attr("kv_num_heads", kv_num_heads)
        if self.num_heads <= 0:
            raise ValueError(f"num_heads must be > 0, got {self.num_heads}")
        if self.kv_num_heads <= 0:
            raise ValueError(f"kv_num_heads must be > 0, got {self.kv_num_heads}")
        for name in ("num_heads", "kv_num_heads"):
            if getattr(self, name) > _INT32_MAX:
                raise ValueError(f"{name} must be <= {_INT32_MAX}, got {getattr(self, name)}")
        if self.num_heads % self.kv_num_heads:
            raise ValueError("num_heads must be a multiple of kv_num_heads. Got num_heads % "
                             f"kv_num_heads == {self.num_heads % self.kv_num_heads}")
        self.scale = v.real(scale, "scale")
        self.softcap = v.real(softcap, "softcap")
        if self.softcap < 0:
            raise ValueError(f"softcap must be >= 0 (0 disables it), got {self.softcap}")
        self.local_window_size = _int_attr("local_window_size", local_window_size)
        if self.local_window_size < -1:
            raise ValueError(f"local_window_size must be -1 (disabled) or >= 0, got {self.local_window_size}")
        if self.local_window_size > _INT32_MAX:
            raise ValueError(f"local_window_size must be <= {_INT32_MAX}, got {self.local_window_size}")
        self.causal = _int_attr("causal", causal)
        if self.causal not in (0, 1):
            raise ValueError(f"causal must be 0 or 1, got {self.causal}")
        if self.causal == 0 and self.local_window_size != -1:
            raise ValueError("local_window_size must be -1 when causal is 0, got "
                             f"{self.local_window_size}")
        self.do_rotary = _int_attr("do_rotary", do_rotary)
        self.rotary_interleaved = _int_attr("rotary_interleaved", rotary_interleaved)
        self.smooth_softmax = _int_attr("smooth_softmax", smooth_softmax)
        self.qk_output = _int_attr("qk_output", qk_output)
        if self.qk_output not in (0, 1, 2):
            raise ValueError(f"qk_output attribute received unsupported value {self.qk_output}; "
                             "valid: 0 (none), 1 (before softmax), 2 (after softmax)")
        self.k_quant_type = _quant_attr("k_quant_type", k_quant_type)
        self.v_quant_type = _quant_attr("v_quant_type", v_quant_type)
        self.kv_cache_bit_width = _int_attr("kv_cache_bit_width", kv_cache_bit_width)
        kq, vq = self.k_quant_type, self.v_quant_type
        self.k_cache_bit_width, self.v_cache_bit_width = _side_bits(kq, vq, self.kv_cache_bit_width,
                                              _int_attr("k_cache_bit_width", k_cache_bit_width),
                                              _int_attr("v_cache_bit_width", v_cache_bit_width))
        self.k_group, self.v_group = kq == "PER_GROUP", vq == "PER_GROUP"
        self.per_group = self.k_group or self.v_group
        self.quantized = kq != "NONE"
        self.kv_quant_group_size = _int_attr("kv_quant_group_size", kv_quant_group_size)
        if self.kv_quant_group_size < 0:
            raise ValueError(f"kv_quant_group_size must be >= 0 (0: one group per head), got "
                             f"{self.kv_quant_group_size}")
        self.k_quant_rho = _group.rho_value(k_quant_rho, "k_quant_rho")
        self.v_quant_rho = _group.rho_value(v_quant_rho, "v_quant_rho")
        if not isinstance(metadata_type, str):
            raise TypeError(f"metadata_type must be a str, got {type(metadata_type).__name__}")
        if metadata_type not in _group.METADATA:
            raise ValueError(f"metadata_type must be 'fp32' or 'fp16', got {metadata_type!r}")
        self.metadata_type = metadata_type
        if not self.per_group and (self.kv_quant_group_size or metadata_type != "fp32"):
            raise ValueError("kv_quant_group_size and metadata_type apply to PER_GROUP caches only")
        for name, grouped in (("k_quant_rho", self.k_group), ("v_quant_rho", self.v_group)):
            if not grouped and getattr(self, name) != 1.0:
                raise ValueError(f"{name} applies to a PER_GROUP {name[0].upper()} cache only, "
                                 f"k_quant_type is {kq} and v_quant_type {vq}")
        self.sink_size = _int_attr("sink_size", sink_size)
        self.recent_size = _int_attr("recent_size", recent_size)
        for name in ("sink_size", "recent_size"):
            if not 0 <= getattr(self, name) <= _INT32_MAX:
                raise ValueError(f"{name} must be in [0, {_INT32_MAX}], got {getattr(self, name)}")
        if window_partition not in ("causal", "per_call"):
            raise ValueError(f"window_partition must be 'causal' or 'per_call', got {window_partition!r}")
        self.window_partition = window_partition
        if (self.sink_size or self.recent_size) and not self.quantized:
            raise ValueError("sink_size / recent_size keep float windows beside a quantized cache: "
                             "k_quant_type must not be NONE")
        # the quantizer's parameter for each cache (gqa_kernels.h: rho for group types)
        self._rho = (np.array([self.k_quant_rho], np.float32), np.array([self.v_quant_rho], np.float32))
        self.sliding_window_cache = _int_attr("sliding_window_cache", sliding_window_cache)
        if self.sliding_window_cache not in (0, 1):
            raise ValueError(f"sliding_window_cache must be 0 or 1, got {self.sliding_window_cache}")
        if self.sliding_window_cache and self.local_window_size <= 0:
            raise ValueError("sliding_window_cache=1 requires local_window_size > 0, got "
                             f"{self.local_window_size}")
        if self.sliding_window_cache and self.qk_output:
            raise ValueError("qk_output is not implemented with sliding_window_cache=1 (as in "
                             "onnxruntime)")
        if (self.sink_size or self.recent_size) and self.sliding_window_cache:
            raise ValueError("sink_size / recent_size do not combine with sliding_window_cache=1")
        self.qk_norm_epsilon = v.real(qk_norm_epsilon, "qk_norm_epsilon")
        if not (0.0 <= self.qk_norm_epsilon < float("inf")):
            raise ValueError(f"qk_norm_epsilon must be a finite number >= 0, got {self.qk_norm_epsilon}")
        self._signatures = {}     # gqa/_call.pyx: checked call signatures, by past buffer

    def _widths(self):
        if self.k_cache_bit_width == self.v_cache_bit_width == self.kv_cache_bit_width:
            return f"kv_cache_bit_width={self.kv_cache_bit_width}"
        return f"k_cache_bit_width={self.k_cache_bit_width}, v_cache_bit_width={self.v_cache_bit_width}"

    def __repr__(self):
        return (f"GroupQueryAttention(num_heads={self.num_heads}, kv_num_heads={self.kv_num_heads}, "
                f"k_quant_type={self.k_quant_type!r}, v_quant_type={self.v_quant_type!r}, "
                f"{self._widths()})")

    # -- the call ------------------------------------------------------------------
    # op(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
    #    total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
    #    attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
    #    k_norm_weight=None, past_hp_key=None, past_hp_value=None, oscar_rotation_k=None,
    #    oscar_rotation_v=None, *, present_key=None, present_value=None, present_hp_key=None,
    #    present_hp_value=None, num_threads=None)
    # -> (output, present_key, present_value[, output_qk][, present_hp_key, present_hp_value]);
    # every check and the compute are in
    # gqa/_call.pyx, which keeps the checked signatures of recent calls in _signatures.
    __call__ = _call.op_call


group_query_attention = _call.group_query_attention


def _format_version(value):
    v = _int_attr("cache_format_version", value)
    if v != 1:
        raise ValueError(f"cache_format_version must be 1 (the packed row layout of this release), "
                         f"got {v}")
    return v


class MixedPrecisionGroupQueryAttention(GroupQueryAttention):
    """onnxruntime main's ``com.microsoft.MixedPrecisionGroupQueryAttention`` (the OSCAR cache):
    GroupQueryAttention with PER_GROUP asymmetric caches inherent -- no k_quant_type /
    v_quant_type -- plus its attributes ``kv_quant_group_size``, ``k_quant_rho``,
    ``v_quant_rho``, ``metadata_type``, ``sink_size``, ``recent_size`` and
    ``cache_format_version`` (1), the float windows ``past_hp_key`` / ``past_hp_value`` ->
    ``present_hp_key`` / ``present_hp_value`` and the rotations ``oscar_rotation_k`` /
    ``oscar_rotation_v`` ``(kv_num_heads, head_size, head_size)``.

    Beyond onnxruntime: ``kv_cache_bit_width`` 2 (default: onnxruntime's layout), 4 or 8;
    rotations without windows; attention_bias and every score feature with float16 inputs.
    """

    def __init__(self, *, num_heads, kv_num_heads, kv_cache_bit_width=2, kv_quant_group_size=0,
                 k_quant_rho=1.0, v_quant_rho=1.0, metadata_type="fp32", sink_size=0,
                 recent_size=0, cache_format_version=1, window_partition="causal", **attributes):
        for name in ("k_quant_type", "v_quant_type"):
            if name in attributes:
                raise TypeError(f"MixedPrecisionGroupQueryAttention has no {name}: its caches are "
                                "PER_GROUP")
        self.cache_format_version = _format_version(cache_format_version)
        super().__init__(num_heads=num_heads, kv_num_heads=kv_num_heads, k_quant_type="PER_GROUP",
                         v_quant_type="PER_GROUP", kv_cache_bit_width=kv_cache_bit_width,
                         kv_quant_group_size=kv_quant_group_size, k_quant_rho=k_quant_rho,
                         v_quant_rho=v_quant_rho, metadata_type=metadata_type, sink_size=sink_size,
                         recent_size=recent_size, window_partition=window_partition, **attributes)

    def __repr__(self):
        return (f"MixedPrecisionGroupQueryAttention(num_heads={self.num_heads}, "
                f"kv_num_heads={self.kv_num_heads}, {self._widths()}, "
                f"kv_quant_group_size={self.kv_quant_group_size}, sink_size={self.sink_size}, "
                f"recent_size={self.recent_size})")


def mixed_precision_group_query_attention(*inputs, kv_cache_bit_width=2, cache_format_version=1,
                                          **keywords):
    """Functional form of :class:`MixedPrecisionGroupQueryAttention` (inputs in ONNX order and
    names, attributes as keywords): the kept PER_GROUP operator of the function
    ``group_query_attention``, so a loop pays what a kept operator pays."""
    for name in ("k_quant_type", "v_quant_type"):
        if name in keywords:
            raise TypeError(f"mixed_precision_group_query_attention has no {name}: its caches are "
                            "PER_GROUP")
    _format_version(cache_format_version)
    return group_query_attention(*inputs, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                                 kv_cache_bit_width=kv_cache_bit_width, **keywords)
