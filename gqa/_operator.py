"""The GroupQueryAttention operator (ONNX Runtime 1.31.1 CPU contract).

``ATTRIBUTES`` is the one statement of the operator's attributes: name, kind, default, the
check of its own value and what it means.  The class, the functional forms
(gqa/_function.pyx), their signatures and the reprs are made from it; the rules that join several attributes are in
``GroupQueryAttention._combine``; cache formats are gqa/_formats.py's.  A call's inputs are
validated in gqa/_signature.pyx, completely, before any output or caller buffer is written,
and the compute (gqa/_attention.pyx) then runs without the GIL.
"""
import inspect
import numbers
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import _signature
from . import _formats
from ._config import ACCURACY_LEVELS
from . import _validate as v

INT32_MAX = 2 ** 31 - 1   # sizes and lengths reach the compute as C int
_REQUIRED = inspect.Parameter.empty


def _int(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _real(name, value):
    return v.real(value, name)


def _rho(name, value):
    return _formats.rho_value(value, name)


def _str(name, value):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _in(*allowed):
    def check(name, value):
        if value not in allowed:
            raise ValueError(f"{name} must be {' or '.join(map(repr, allowed))}, got {value!r}")
    return check


def _range(lo, hi=INT32_MAX):
    def check(name, value):
        if not lo <= value <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return check


def _positive(name, value):
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if value > INT32_MAX:
        raise ValueError(f"{name} must be <= {INT32_MAX}, got {value}")


def _qk_output(name, value):
    if value not in (0, 1, 2):
        raise ValueError(f"qk_output attribute received unsupported value {value}; "
                         "valid: 0 (none), 1 (before softmax), 2 (after softmax)")


def _softcap(name, value):
    if not 0 <= value < float("inf"):
        raise ValueError(f"softcap must be finite and >= 0 (0 disables it), got {value}")


def _finite(name, value):
    v.finite_real(value, name)


def _epsilon(name, value):
    if not (0.0 <= value < float("inf")):
        raise ValueError(f"qk_norm_epsilon must be a finite number >= 0, got {value}")


def _local_window(name, value):
    if value < -1:
        raise ValueError(f"local_window_size must be -1 (disabled) or >= 0, got {value}")
    if value > INT32_MAX:
        raise ValueError(f"local_window_size must be <= {INT32_MAX}, got {value}")


class Attribute(NamedTuple):
    name: str
    parse: Callable            # (name, value) -> the value of its kind, or TypeError
    default: object            # _REQUIRED: no default
    check: Optional[Callable]  # (name, parsed value) -> None, or ValueError
    doc: str


ATTRIBUTES = (
    Attribute("num_heads", _int, _REQUIRED, _positive, "query heads N"),
    Attribute("kv_num_heads", _int, _REQUIRED, _positive, "key / value heads Nkv (N % Nkv == 0)"),
    Attribute("scale", _real, 0.0, _finite, "score scale; 0: 1/sqrt(head_size)"),
    Attribute("softcap", _real, 0.0, _softcap, "softcap * tanh(score / softcap); 0: off"),
    Attribute("local_window_size", _int, -1, _local_window, "keys a query sees; -1: all"),
    Attribute("causal", _int, 1, _in(0, 1), "1: causal mask (0: none, no local window)"),
    Attribute("do_rotary", _int, 0, _in(0, 1), "1: rotary on Q and K (cos_cache / sin_cache)"),
    Attribute("rotary_interleaved", _int, 0, _in(0, 1), "1: rotary pairs (2i, 2i+1), else halves"),
    Attribute("smooth_softmax", _int, -1, _in(-1, 0, 1), "1: softmax with an extra zero logit"),
    Attribute("qk_output", _int, 0, _qk_output, "output_qk: 0 none, 1 before, 2 after softmax"),
    Attribute("k_quant_type", _formats.quant_type, "NONE", None,
              "NONE, PER_TENSOR, PER_CHANNEL or PER_GROUP"),
    Attribute("v_quant_type", _formats.quant_type, "NONE", None,
              "NONE, PER_TENSOR, PER_CHANNEL or PER_GROUP"),
    Attribute("kv_cache_bit_width", _int, 0, None, "code bits of both caches (0: float)"),
    Attribute("qk_norm_epsilon", _real, 1e-6, _epsilon, "epsilon of the QK RMS norm"),
    Attribute("sliding_window_cache", _int, 0, _in(0, 1),
              "1: the cache holds the last local_window_size positions"),
    Attribute("kv_quant_group_size", _int, 0, None, "channels per group (PER_GROUP; 0: head)"),
    Attribute("k_quant_rho", _rho, 1.0, None, "K's clip quantile (PER_GROUP)"),
    Attribute("v_quant_rho", _rho, 1.0, None, "V's clip quantile (PER_GROUP)"),
    Attribute("metadata_type", _str, "fp32", None, "fp32 / fp16 group scale and zero point"),
    Attribute("sink_size", _int, 0, _range(0), "first positions kept in float"),
    Attribute("recent_size", _int, 0, _range(0), "last positions kept in float"),
    Attribute("window_partition", _str, "causal", _in("causal", "per_call"),
              "which rows of a step the float windows take"),
    Attribute("k_cache_bit_width", _int, 0, None, "K's code bits (0: kv_cache_bit_width)"),
    Attribute("v_cache_bit_width", _int, 0, None, "V's code bits (0: kv_cache_bit_width)"),
    Attribute("accuracy_level", _int, 0, _in(*ACCURACY_LEVELS),
              "products: 0 gqa.config's, 1-3 float32, 4 integer dots on INT8/INT4 codes (AMX, VNNI, AVX2)"),
)
ATTRIBUTE_NAMES = tuple(a.name for a in ATTRIBUTES)
# the call's inputs and keywords: gqa/_signature.pyx's op_call, their one statement
_CALL_PARAMETERS = tuple(inspect.signature(_signature.op_call).parameters.values())[1:]


def _keyword_signature(attributes):
    """The signature of an __init__ taking these attributes as keywords."""
    kw = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default)
          for a in attributes]
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)] + kw)


class GroupQueryAttention:
    """One GroupQueryAttention node: attributes validated once, then called per step.

    ``GroupQueryAttention(num_heads=32, kv_num_heads=8, k_quant_type="PER_TENSOR",
    v_quant_type="PER_TENSOR", kv_cache_bit_width=8)(query, key, value, past_key, ...)``
    returns ``(output, present_key, present_value[, output_qk])``.  Attribute names,
    meanings and defaults are ONNX Runtime's (``gqa._operator.ATTRIBUTES``, the README's
    table); ``q_norm_weight`` / ``k_norm_weight`` with ``qk_norm_epsilon`` (the per-head RMS
    norm of Q and K before rotary) go beyond its CPU kernel.

    K and V may each have their own type (beyond onnxruntime: ``k_quant_type`` and
    ``v_quant_type`` any of PER_TENSOR, PER_CHANNEL and PER_GROUP) and width
    (``k_cache_bit_width`` / ``v_cache_bit_width``; 0 takes ``kv_cache_bit_width``).
    ``k_format`` / ``v_format`` are the resulting :class:`gqa.CacheFormat` of each side.

    ``k_quant_type = v_quant_type = "PER_GROUP"`` (onnxruntime main's name) selects the
    per-group asymmetric caches: ``kv_cache_bit_width`` 8, 4 or 2, ``kv_quant_group_size``
    channels per group (0: the whole head), the clip quantiles ``k_quant_rho`` /
    ``v_quant_rho`` and ``metadata_type`` ("fp32" / "fp16") of the inline scale and zero point;
    the caches are uint8 ``[B, Nkv, T, gqa.group_row_bytes(H, bits, group, metadata)]`` and
    there are no k_scale / v_scale inputs.
    """

    def __init__(self, **attributes):
        for name in attributes:
            if name not in ATTRIBUTE_NAMES:
                raise TypeError(f"{type(self).__name__} got an unexpected attribute {name!r}")
        for a in ATTRIBUTES:
            value = attributes.get(a.name, a.default)
            if value is _REQUIRED:
                raise TypeError(f"{type(self).__name__} needs the attribute {a.name!r}")
            value = a.parse(a.name, value)
            if a.check is not None:
                a.check(a.name, value)
            setattr(self, a.name, value)
        self._combine()
        self._signatures = {}     # gqa/_signature.pyx: checked call signatures, by past buffer

    __init__.__signature__ = _keyword_signature(ATTRIBUTES)

    def _combine(self):
        """The rules that join several attributes, and what is derived from them."""
        if self.num_heads % self.kv_num_heads:
            raise ValueError("num_heads must be a multiple of kv_num_heads. Got num_heads % "
                             f"kv_num_heads == {self.num_heads % self.kv_num_heads}")
        if self.causal == 0 and self.local_window_size != -1:
            raise ValueError("local_window_size must be -1 when causal is 0, got "
                             f"{self.local_window_size}")
        self.k_format, self.v_format = _formats.side_formats(
            self.k_quant_type, self.v_quant_type, self.kv_cache_bit_width, self.k_cache_bit_width,
            self.v_cache_bit_width, self.kv_quant_group_size, self.metadata_type)
        self.k_cache_bit_width, self.v_cache_bit_width = self.k_format.bits, self.v_format.bits
        self.quantized = self.k_format.quantized
        for name, f in (("k_quant_rho", self.k_format), ("v_quant_rho", self.v_format)):
            if not f.grouped and getattr(self, name) != 1.0:
                raise ValueError(f"{name} applies to a PER_GROUP {name[0].upper()} cache only, "
                                 f"k_quant_type is {self.k_quant_type} and v_quant_type "
                                 f"{self.v_quant_type}")
        windows = self.sink_size or self.recent_size
        if self.sink_size + self.recent_size > INT32_MAX:
            raise ValueError(f"sink_size + recent_size (the float windows' rows) must be <= "
                             f"{INT32_MAX}, got {self.sink_size} + {self.recent_size} = "
                             f"{self.sink_size + self.recent_size}")
        if windows and not self.quantized:
            raise ValueError("sink_size / recent_size keep float windows beside a quantized cache: "
                             "k_quant_type must not be NONE")
        if self.sliding_window_cache and self.local_window_size <= 0:
            raise ValueError("sliding_window_cache=1 requires local_window_size > 0, got "
                             f"{self.local_window_size}")
        if self.sliding_window_cache and self.qk_output:
            raise ValueError("qk_output is not implemented with sliding_window_cache=1 (as in "
                             "onnxruntime)")
        if windows and self.sliding_window_cache:
            raise ValueError("sink_size / recent_size do not combine with sliding_window_cache=1")
        # the quantizer's parameter of each cache (gqa_kernels.h: rho for group types)
        self._rho = (np.array([self.k_quant_rho], np.float32), np.array([self.v_quant_rho], np.float32))

    def attributes(self):
        """Every attribute's value, in the table's order."""
        return {name: getattr(self, name) for name in ATTRIBUTE_NAMES}

    def __getstate__(self):
        """Copies and pickles keep the attributes; the checked signatures (this process's
        buffers, by address) start empty, so the copy checks its first call again."""
        return dict(self.__dict__, _signatures={})

    def __repr__(self):
        shown = [f"{a.name}={getattr(self, a.name)!r}" for a in ATTRIBUTES
                 if a.default is _REQUIRED or getattr(self, a.name) != a.default]
        return f"{type(self).__name__}({', '.join(shown)})"

    # op(query, key, ..., oscar_rotation_v, *, present_key, ..., num_threads): every check and
    # the compute are in gqa/_signature.pyx, which keeps the checked signatures of recent calls
    # in _signatures.
    __call__ = _signature.op_call


def function_signature(attributes=ATTRIBUTES):
    """The signature of the functional form (gqa/_function.pyx): op_call's inputs, the
    attributes, then op_call's keywords."""
    inputs = [p for p in _CALL_PARAMETERS if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keywords = [p for p in _CALL_PARAMETERS if p.kind is inspect.Parameter.KEYWORD_ONLY]
    attrs = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default)
             for a in attributes]
    return inspect.Signature(inputs + attrs + keywords)


def format_version(value):
    x = _int("cache_format_version", value)
    if x != 1:
        raise ValueError(f"cache_format_version must be 1 (the packed row layout of this release), "
                         f"got {x}")
    return x


MIXED_FIXED = ("k_quant_type", "v_quant_type")


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

    def __init__(self, *, kv_cache_bit_width=2, cache_format_version=1, **attributes):
        for name in MIXED_FIXED:
            if name in attributes:
                raise TypeError(f"MixedPrecisionGroupQueryAttention has no {name}: its caches are "
                                "PER_GROUP")
        self.cache_format_version = format_version(cache_format_version)
        super().__init__(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                         kv_cache_bit_width=kv_cache_bit_width, **attributes)

    __init__.__signature__ = inspect.Signature(
        [p.replace(default=2) if p.name == "kv_cache_bit_width" else p
         for p in _keyword_signature([a for a in ATTRIBUTES if a.name not in MIXED_FIXED]).parameters.values()]
        + [inspect.Parameter("cache_format_version", inspect.Parameter.KEYWORD_ONLY, default=1)])
