"""Cache formats: the one vocabulary of how a K or V cache stores its rows.

A *format* describes one tensor's cache (K's or V's): :class:`CacheFormat` ``(quant, bits,
group, metadata)``.  It is spelled in four ways, each parsed here and nowhere else:

* a format name (one tensor): ``"float"``, ``"int8-pt"``, ``"int8-pc"``, ``"int4-pt"``,
  ``"int4-pc"`` (static scales per tensor / per channel) or ``"int{8,4,2}-g<group>[-fp16]"``
  (per group of ``group`` channels, 0: the whole head; inline float32 or float16 scale and
  zero point);
* a *mode* (both tensors, :func:`parse_mode`): one format name for both, ``"int4-pc/pt"`` (K's
  scaling, then V's) or ``"<K's format>/<V's format>"`` of two quantized formats;
* a *configuration* (:func:`cache_options`): a mode, then ``+s<sink>r<recent>``, ``+had`` /
  ``+rot`` and ``+rho<k>[/<v>]``, e.g. ``"int4-g32+s4r64+had"``;
* the operator's attributes (:func:`side_formats`, :func:`attributes`): ``k_quant_type`` /
  ``v_quant_type`` with ``kv_cache_bit_width`` (or ``k_`` / ``v_cache_bit_width``),
  ``kv_quant_group_size`` and ``metadata_type``.

Row layouts (gqa_kernels.h has the byte contract): float rows of ``head_size`` elements of the
query's dtype; INT8 rows of ``head_size`` int8 codes; INT4 rows of ``(head_size + 1) // 2``
uint8 bytes (two +8-biased nibbles, element 2i low); per-group rows of
``head_size * bits / 8`` code bytes then ``head_size / group`` (scale, zero) pairs.  The C
type numbering (``gqa_type_t``) is the header's, read through gqa._dispatch.
"""
import numbers
import re
from typing import NamedTuple

import numpy as np

from . import _dispatch

QUANT_TYPES = ("NONE", "PER_TENSOR", "PER_CHANNEL", "PER_GROUP")
METADATA = ("fp32", "fp16")
STATIC_BITS = (8, 4)
GROUP_BITS = (8, 4, 2)
_CT = _dispatch.TYPE_CODES          # gqa_type_t names -> values, from gqa_kernels.h
_GROUP_KIND = {8: _CT["GQA_G8"], 4: _CT["GQA_G4"], 2: _CT["GQA_G2"]}
_STATIC_NAMES = {"float": ("NONE", 0), "int8-pt": ("PER_TENSOR", 8), "int8-pc": ("PER_CHANNEL", 8),
                 "int4-pt": ("PER_TENSOR", 4), "int4-pc": ("PER_CHANNEL", 4)}
_GROUP_NAME = re.compile(r"int([842])-g([0-9]+)(-fp16)?", re.ASCII)
_OPTION = re.compile(r"\+s([0-9]+)r([0-9]+)|\+(had|rot)|\+rho([0-9]*\.?[0-9]+)(?:/([0-9]*\.?[0-9]+))?",
                     re.ASCII)
FORMAT_NAMES_HELP = f"{', '.join(_STATIC_NAMES)} or int8/int4/int2-g<group>[-fp16]"


def _int(x, name):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


class CacheFormat(NamedTuple):
    """How one tensor's cache stores a row.

    quant    : "NONE" (float), "PER_TENSOR" / "PER_CHANNEL" (static scales), "PER_GROUP"
    bits     : 0 (float), 8 or 4 (static), 8, 4 or 2 (per group)
    group    : channels per group of a PER_GROUP format (0: the whole head), else 0
    metadata : "fp32" or "fp16", the stored scale and zero point of a PER_GROUP format
    """
    quant: str
    bits: int
    group: int = 0
    metadata: str = "fp32"

    # -- the spellings ------------------------------------------------------------------------
    @classmethod
    def parse(cls, name):
        """The format of one tensor's format name (module docstring)."""
        if not isinstance(name, str):
            raise TypeError(f"a cache format name must be a str, got {type(name).__name__}")
        if name in _STATIC_NAMES:
            return cls(*_STATIC_NAMES[name])
        m = _GROUP_NAME.fullmatch(name)
        if m is None:
            raise ValueError(f"{name!r} is not a cache mode of one tensor; valid: {FORMAT_NAMES_HELP}")
        return cls("PER_GROUP", int(m.group(1)), int(m.group(2)), "fp16" if m.group(3) else "fp32")

    @classmethod
    def group_format(cls, bits, group_size, metadata, names=("bits", "group_size", "metadata")):
        """A validated PER_GROUP format; `names` name the three arguments in messages."""
        bits = _int(bits, names[0])
        if bits not in GROUP_BITS:
            raise ValueError(f"{names[0]} must be 2, 4 or 8 for a per-group cache, got {bits}")
        g = _int(group_size, names[1])
        if g < 0:
            raise ValueError(f"{names[1]} must be >= 0 (0: one group per head), got {g}")
        if metadata not in METADATA:
            raise ValueError(f"{names[2]} must be 'fp32' or 'fp16', got {metadata!r}")
        return cls("PER_GROUP", bits, g, metadata)

    @property
    def name(self):
        """The format name (the inverse of :meth:`parse`)."""
        if self.quant == "NONE":
            return "float"
        if self.quant == "PER_GROUP":
            return f"int{self.bits}-g{self.group}" + ("-fp16" if self.metadata == "fp16" else "")
        return f"int{self.bits}-{'pc' if self.quant == 'PER_CHANNEL' else 'pt'}"

    # -- what it is ---------------------------------------------------------------------------
    @property
    def quantized(self):
        return self.quant != "NONE"

    @property
    def grouped(self):
        return self.quant == "PER_GROUP"

    @property
    def static(self):
        """Quantized with static scales (k_scale / v_scale inputs)."""
        return self.quant in ("PER_TENSOR", "PER_CHANNEL")

    @property
    def per_channel(self):
        return self.quant == "PER_CHANNEL"

    @property
    def top_code(self):
        """The largest code magnitude of a static format (127 INT8, 7 INT4)."""
        return {8: 127.0, 4: 7.0}[self.bits]

    # -- its rows -----------------------------------------------------------------------------
    def group_size(self, head_size, names=("group_size", "head_size")):
        """Columns per group for rows of `head_size` (0 resolved to the head), checked to
        divide the head and to fill whole bytes."""
        h = _int(head_size, names[1])
        if h <= 0:
            raise ValueError(f"{names[1]} must be positive for a per-group cache, got {h}")
        g = self.group or h
        if h % g:
            raise ValueError(f"{names[0]}={g} must divide {names[1]}={h}")
        if (g * self.bits) % 8:
            raise ValueError(f"{names[0]}={g} with {self.bits}-bit codes does not fill whole bytes: "
                             f"groups of {self.bits}-bit codes need a multiple of {8 // self.bits} "
                             "columns")
        return g

    def ctype(self, head_size, float_dtype=np.float32, names=("group_size", "head_size")):
        """The C type value (gqa_type_t of gqa_kernels.h) of rows of `head_size` elements."""
        if self.quant == "NONE":
            return _CT["GQA_F16"] if np.dtype(float_dtype) == np.float16 else _CT["GQA_F32"]
        if self.grouped:
            return _dispatch.group_type(_GROUP_KIND[self.bits], self.group_size(head_size, names),
                                        self.metadata == "fp16")
        base = _CT["GQA_S8_PT"] if self.bits == 8 else _CT["GQA_S4_PT"]
        return base + (_CT["GQA_S8_PC"] - _CT["GQA_S8_PT"]) * self.per_channel

    def row_width(self, head_size, names=("group_size", "head_size")):
        """Elements of one row of the cache array: head_size (float, INT8), (head_size + 1) // 2
        (INT4 bytes) or the per-group row's bytes."""
        if self.grouped:
            return _dispatch.row_bytes(self.ctype(head_size, names=names), head_size)
        return (head_size + 1) // 2 if self.bits == 4 else head_size

    def dtype(self, float_dtype=np.float32):
        """The cache array's element type."""
        if self.quant == "NONE":
            return np.dtype(float_dtype)
        return np.dtype(np.int8) if self.bits == 8 and not self.grouped else np.dtype(np.uint8)

    def layout(self, head_size, float_dtype=np.float32):
        """(row width, dtype) of the cache array's rows."""
        return self.row_width(head_size), self.dtype(float_dtype)

    def __repr__(self):
        return f"CacheFormat({self.name!r})"


FLOAT = CacheFormat("NONE", 0)


# -- modes: both tensors --------------------------------------------------------------------------

def parse_mode(mode):
    """A mode name -> (K's CacheFormat, V's CacheFormat): one format name for both tensors,
    ``"int4-pc/pt"`` (K's scaling / V's, one width) or ``"<K's format>/<V's format>"`` of two
    quantized formats, e.g. ``"int4-pc/int2-g32"`` (two per-group sides share one group size
    and metadata type)."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str, got {type(mode).__name__}")
    head, sep, tail = mode.partition("/")
    try:
        if not sep:
            f = CacheFormat.parse(mode)
            return f, f
        k = CacheFormat.parse(head)
        if k.static and tail in ("pt", "pc"):
            return k, CacheFormat("PER_CHANNEL" if tail == "pc" else "PER_TENSOR", k.bits)
        v = CacheFormat.parse(tail)
        if k.quantized and v.quantized:
            return k, v
    except ValueError:
        pass
    raise ValueError(f"mode={mode!r} is not a cache mode; valid: {FORMAT_NAMES_HELP} (per group), "
                     "or K's mode / V's mode: int4-pc/pt (K's scaling / V's) or two quantized "
                     "modes (int4-pc/int2-g32)")


def mode_name(k, v):
    """The mode name of two formats (the inverse of :func:`parse_mode`)."""
    if k == v:
        return k.name
    if k.static and v.static and k.bits == v.bits:
        return f"{k.name}/{v.name.split('-')[1]}"
    return f"{k.name}/{v.name}"


def cache_options(name):
    """KVCache keywords of a configuration name: a mode, then at most once each
    ``+s<sink>r<recent>`` (float windows of the first sink and last recent positions),
    ``+had`` (Hadamard rotations) or ``+rot`` (calibrated rotations, given separately), and
    ``+rho<k>[/<v>]`` (the clip quantiles of a per-group cache), e.g.
    ``"int2-g32+s4r64+rot+rho0.9"``."""
    if not isinstance(name, str):
        raise TypeError(f"a cache configuration must be a str, got {type(name).__name__}")
    base, plus, rest = name.partition("+")
    out = dict(mode=base)
    rest = plus + rest
    pos = 0
    seen = set()
    bad = None
    for m in _OPTION.finditer(rest):
        if m.start() != pos:
            break
        pos = m.end()
        kind = "rotations" if m.group(3) else "rho" if m.group(4) else "windows"
        if kind in seen:
            bad = f"{name!r} gives {'+had / +rot' if kind == 'rotations' else '+' + kind} twice"
            break
        seen.add(kind)
        if m.group(3):
            out["rotations"] = "hadamard" if m.group(3) == "had" else "calibrated"
        elif m.group(4):
            out["k_rho"] = rho_value(float(m.group(4)), f"{name!r}: k_rho")
            out["v_rho"] = rho_value(float(m.group(5) or m.group(4)), f"{name!r}: v_rho")
        else:
            out["sink_size"], out["recent_size"] = int(m.group(1)), int(m.group(2))
    if bad or pos != len(rest):
        raise ValueError(f"{name!r} is not a cache configuration: a mode, then at most once each "
                         "+s<sink>r<recent>, +had or +rot, and +rho<k>[/<v>]"
                         + (f" ({bad})" if bad else ""))
    parse_mode(base)
    return out


def needs_scales(config):
    """True when K or V of a mode or configuration name has static scales (from k_scales /
    v_scales or a calibration)."""
    return any(f.static for f in parse_mode(cache_options(config)["mode"]))


# -- the operator's attributes --------------------------------------------------------------------

def quant_type(name, value):
    """A k_quant_type / v_quant_type attribute, upper-cased."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    u = value.upper()
    if u not in QUANT_TYPES:
        raise ValueError(f"Invalid KV quantization type {name}={value!r}. "
                         f"Valid values are: {', '.join(QUANT_TYPES)}")
    return u


def side_formats(kq, vq, bits, k_bits, v_bits, group_size, metadata):
    """(K's, V's) CacheFormat of the operator's attributes (quant types already upper-cased):
    ``k_cache_bit_width`` / ``v_cache_bit_width`` where given (> 0), else
    ``kv_cache_bit_width``.  K and V are both float or both quantized, each side with its own
    type: PER_TENSOR / PER_CHANNEL take 4 or 8 bits, PER_GROUP 2, 4 or 8; two per-group sides
    share ``kv_quant_group_size`` and ``metadata_type``."""
    bits, k_bits, v_bits = (_int(b, n) for b, n in ((bits, "kv_cache_bit_width"),
                                                    (k_bits, "k_cache_bit_width"),
                                                    (v_bits, "v_cache_bit_width")))
    group_size = _int(group_size, "kv_quant_group_size")
    if group_size < 0:
        raise ValueError(f"kv_quant_group_size must be >= 0 (0: one group per head), got {group_size}")
    if not isinstance(metadata, str):
        raise TypeError(f"metadata_type must be a str, got {type(metadata).__name__}")
    if metadata not in METADATA:
        raise ValueError(f"metadata_type must be 'fp32' or 'fp16', got {metadata!r}")
    if (kq == "NONE") != (vq == "NONE"):
        raise ValueError(f"k_quant_type ({kq}) and v_quant_type ({vq}) must both be NONE or "
                         "both quantized")
    if "PER_GROUP" not in (kq, vq) and (group_size or metadata != "fp32"):
        raise ValueError("kv_quant_group_size and metadata_type apply to PER_GROUP caches only")
    if kq == "NONE":
        for name, b in (("kv_cache_bit_width", bits), ("k_cache_bit_width", k_bits),
                        ("v_cache_bit_width", v_bits)):
            if b != 0:
                raise ValueError(f"{name} must be 0 when quantization is disabled, got {b}")
        return FLOAT, FLOAT
    out = []
    for side, q, own in (("k", kq, k_bits), ("v", vq, v_bits)):
        if own < 0:
            raise ValueError(f"{side}_cache_bit_width must be >= 0 (0: kv_cache_bit_width), got {own}")
        b = own or bits
        name = f"{side}_cache_bit_width" if own else "kv_cache_bit_width"
        if q == "PER_GROUP":
            if b not in GROUP_BITS:
                raise ValueError(f"{name} must be 2, 4 or 8 for PER_GROUP caches, got {b} "
                                 f"({side.upper()} is PER_GROUP)")
            out.append(CacheFormat(q, b, group_size, metadata))
        else:
            if b not in STATIC_BITS:
                raise ValueError(f"{name} must be 4 or 8 when quantization is enabled, got {b} "
                                 f"({side.upper()} is {q}; 2 bits need PER_GROUP)")
            out.append(CacheFormat(q, b))
    if bits not in (0, 2, 4, 8):  # unused when both sides give their own width: still no junk
        raise ValueError(f"kv_cache_bit_width must be 0, 2, 4 or 8, got {bits}")
    return tuple(out)


def attributes(k, v, k_rho=1.0, v_rho=1.0):
    """The operator attributes of K's and V's formats (the inverse of :func:`side_formats`),
    with the clip quantiles of per-group sides."""
    if k.quantized != v.quantized:
        raise ValueError(f"k_mode={k.name!r} and v_mode={v.name!r}: K and V must both be float or "
                         "both quantized")
    attrs = dict(k_quant_type=k.quant, v_quant_type=v.quant, kv_cache_bit_width=k.bits)
    if k.bits != v.bits:
        attrs.update(kv_cache_bit_width=0, k_cache_bit_width=k.bits, v_cache_bit_width=v.bits)
    if k.grouped and v.grouped and (k.group, k.metadata) != (v.group, v.metadata):
        raise ValueError(f"k_mode={k.name!r} and v_mode={v.name!r}: per-group K and V share one "
                         "group size and metadata type (kv_quant_group_size, metadata_type)")
    for name, rho, f in (("k_rho", k_rho, k), ("v_rho", v_rho, v)):
        if not f.grouped and rho != 1.0:
            raise ValueError(f"{name}={rho!r}: the clip quantile applies to a per-group mode, "
                             f"{name[0].upper()}'s is {f.name!r}")
    g = k if k.grouped else v if v.grouped else None
    if g is not None:
        attrs.update(kv_quant_group_size=g.group, metadata_type=g.metadata,
                     k_quant_rho=rho_value(k_rho, "k_rho") if k.grouped else k_rho,
                     v_quant_rho=rho_value(v_rho, "v_rho") if v.grouped else v_rho)
    return attrs


def rho_value(rho, name):
    """The clip quantile: a real in (0, 1] that stays positive in float32 (the kernels read it
    as float32); 1 keeps every value (no clip)."""
    if isinstance(rho, (bool, np.bool_)) or not isinstance(rho, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(rho).__name__}")
    rho = float(rho)
    if not (0.0 < rho <= 1.0 and np.float32(rho) > 0):
        raise ValueError(f"{name} must be in (0, 1] (1: no clip) and at least the smallest "
                         f"positive float32, got {rho!r}")
    return rho


def group_row_bytes(head_size, bits, group_size=0, metadata="fp32"):
    """Bytes of one per-group cache row (onnxruntime main's ``packed_head_size`` for 2 bits:
    ``head_size / 4 + num_groups * 2 * meta_bytes``)."""
    return CacheFormat.group_format(bits, group_size, metadata).row_width(head_size)


def operator_attributes(mode, k_rho=1.0, v_rho=1.0):
    """The GroupQueryAttention attributes of a mode name (both tensors' formats), with the clip
    quantiles of per-group sides: ``GroupQueryAttention(num_heads=N, kv_num_heads=Nkv,
    **gqa.operator_attributes("int4-g32"))``."""
    return attributes(*parse_mode(mode), k_rho=k_rho, v_rho=v_rho)
