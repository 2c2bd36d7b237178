"""The per-group asymmetric cache formats (INT8 / INT4 / INT2 with inline metadata): the one
statement of what a valid format is and how wide its rows are, used by the kernel API, the
operators and the KV cache.  The byte layout and the codec are in gqa/_src/gqa_kernels.h and
gqa/_src/kernels_group.h (and the README's numeric contract)."""
import numbers
from typing import NamedTuple

from . import _dispatch

METADATA = ("fp32", "fp16")


class GroupFormat(NamedTuple):
    bits: int          # 8, 4 or 2
    group: int         # columns per group (the head size when 0 was given)
    metadata: str      # "fp32" or "fp16": the stored scale and zero point
    head_size: int

    @property
    def type(self):
        """The C type value of gqa_kernels.h."""
        return _dispatch.group_type(self.bits, self.group, self.metadata == "fp16")

    @property
    def row_bytes(self):
        """Bytes of one cache row: head_size * bits / 8 codes, then (scale, zero) per group."""
        return _dispatch.row_bytes(self.type, self.head_size)


def _int(x, name):
    if isinstance(x, (bool,)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return int(x)


def group_format(bits, group_size, metadata, head_size, who=""):
    """A validated GroupFormat; `who` prefixes the argument names in messages (e.g. "k_")."""
    bits = _int(bits, f"{who}bits" if who else "bits")
    if bits not in (2, 4, 8):
        raise ValueError(f"{who or ''}bits must be 2, 4 or 8 for a per-group cache, got {bits}")
    g = _int(group_size, "kv_quant_group_size" if who else "group_size")
    name = "kv_quant_group_size" if who else "group_size"
    if g < 0:
        raise ValueError(f"{name} must be >= 0 (0: one group per head), got {g}")
    if metadata not in METADATA:
        raise ValueError(f"{'metadata_type' if who else 'metadata'} must be 'fp32' or 'fp16', "
                         f"got {metadata!r}")
    h = _int(head_size, "head_size")
    if h <= 0:
        raise ValueError(f"head_size must be positive for a per-group cache, got {h}")
    g = g or h
    if h % g:
        raise ValueError(f"{name}={g} must divide head_size={h}")
    if (g * bits) % 8:
        raise ValueError(f"{name}={g} with {bits}-bit codes does not fill whole bytes: groups of "
                         f"{bits}-bit codes need a multiple of {8 // bits} columns")
    return GroupFormat(bits, g, metadata, h)


def rho_value(rho, name):
    """The clip quantile: a real in (0, 1]; 1 keeps every value (no clip)."""
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(rho).__name__}")
    rho = float(rho)
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"{name} must be in (0, 1] (1: no clip), got {rho!r}")
    return rho


def row_bytes(head_size, bits, group_size=0, metadata="fp32"):
    """Bytes of one per-group cache row (onnxruntime main's ``packed_head_size`` for 2 bits:
    ``head_size / 4 + num_groups * 2 * meta_bytes``)."""
    return group_format(bits, group_size, metadata, head_size).row_bytes
