"""Standalone kernels: quantize, dequantize, QK GEMM and SV GEMM on the active path.

Static formats (a scale argument) follow ONNX Runtime's MLAS contract (see README): INT8
codes are int8; INT4 codes are uint8 with two +8-biased nibbles per byte, the even element
in the low nibble.  Per-group formats (``group_size=``, no scale) are uint8 rows of codes
and inline (scale, zero) metadata (gqa/_formats.py, README).  Every function releases the GIL
while computing.
"""
import numbers

import numpy as np

from . import _checks, _kernels
from ._formats import CacheFormat, rho_value
from . import _validate as v

_F32 = (np.dtype(np.float32),)
_U8 = np.dtype(np.uint8)
_NO_SCALE = np.zeros(1, dtype=np.float32)
_NO_RHO = object()      # a reader's format: no clip quantile


class _Format:
    """One call's row format: static (bits + scale) or per group (bits + group_size)."""

    def __init__(self, bits, scale, group_size, metadata, cols, rho=_NO_RHO):
        if group_size is None:
            self.bits = v.bits(bits)
            if scale is None:
                raise TypeError("scale is required for the static INT8/INT4 formats "
                                "(pass group_size= for a per-group format)")
            self.scale, pc = v.scale(scale, "scale", cols)
            self.scale = _checks.finite_scale(self.scale, "scale")
            f = CacheFormat("PER_CHANNEL" if pc else "PER_TENSOR", self.bits)
            self.type, self.dtype, self.width = f.ctype(cols), f.dtype(), f.row_width(cols)
        else:
            if scale is not None:
                raise ValueError("scale must be None for a per-group format (its scales are "
                                 "stored in the rows)")
            f = CacheFormat.group_format(bits, group_size, metadata)
            self.bits, self.type, self.dtype, self.width = (f.bits, f.ctype(cols), f.dtype(),
                                                            f.row_width(cols))
            self.scale = (_NO_SCALE if rho is _NO_RHO else
                          np.array([rho_value(rho, "rho")], dtype=np.float32))

    def codes(self, x, name, ndim=None, min_ndim=None):
        return v.array(x, name, (self.dtype,), ndim=ndim, min_ndim=min_ndim)


def _group_width(group_size, given, name):
    if given is None:
        raise TypeError(f"{name} is required for a per-group format (the row width in elements)")
    if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
        raise ValueError(f"{name} must be a positive int, got {given!r}")
    return given


def quantize(x, scale=None, *, bits=8, group_size=None, rho=1.0, metadata="fp32", out=None):
    """Quantize float32 ``x[..., H]``.  Static: ``scale`` of 1 element (per-tensor) or H
    (per-channel) -> int8 ``[..., H]`` (bits=8) or packed uint8 ``[..., (H+1)//2]`` (bits=4).
    Per group (``group_size`` columns, 0: the whole row; bits 8, 4 or 2): uint8 rows of
    ``gqa.group_row_bytes(H, bits, group_size, metadata)`` bytes, each group's scale and
    zero point computed from its values after the row's ``rho`` clip."""
    v.array(x, "x", _F32, min_ndim=1)
    h = x.shape[-1]
    if group_size is not None and h == 0:
        raise ValueError("x must have a non-empty last dimension for a per-group format")
    if group_size is None and not (isinstance(rho, numbers.Real) and not isinstance(rho, bool)
                                   and rho == 1):
        raise ValueError(f"rho applies to a per-group format (group_size=...); a static one "
                         f"clips nothing, got rho={rho!r}")
    f = _Format(bits, scale, group_size, metadata, h, rho if group_size is not None else _NO_RHO)
    shape = x.shape[:-1] + (f.width,)
    if out is None:
        out = np.empty(shape, dtype=f.dtype)
    else:
        v.out_array(out, "out", shape, f.dtype, x, f.scale)
    _kernels.quantize(v.contiguous(x), out, f.scale, x.size // h if h else 0, h, f.type)
    return out


def dequantize(codes, scale=None, *, bits=8, head_size=None, group_size=None, metadata="fp32",
               out=None):
    """Dequantize codes ``[..., Hp]`` -> float32 ``[..., H]``.  Static: ``head_size`` gives H
    for INT4 rows of odd width (default 2*Hp).  Per group: ``head_size`` is required."""
    if group_size is None:
        b = v.bits(bits)
        v.array(codes, "codes", (np.dtype(np.int8) if b == 8 else _U8,), min_ndim=1)
        h = v.unpacked_width(b, codes.shape[-1], head_size, "head_size")
    else:
        h = _group_width(group_size, head_size, "head_size")
    f = _Format(bits, scale, group_size, metadata, h)
    f.codes(codes, "codes", min_ndim=1)
    if codes.shape[-1] != f.width:
        raise ValueError(f"codes must have rows of {f.width} bytes for head_size={h}, got "
                         f"shape {codes.shape}")
    shape = codes.shape[:-1] + (h,)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    else:
        v.out_array(out, "out", shape, np.float32, codes, f.scale)
    rows = codes.size // codes.shape[-1] if codes.shape[-1] else 0
    _kernels.dequantize(v.contiguous(codes), out, f.scale, rows, h, f.type)
    return out


def qk_gemm(a, b, scale=None, *, bits=8, group_size=None, metadata="fp32", alpha=1.0, out=None):
    """``out[m, n] = alpha * sum_k a[m, k] * dequant(b)[n, k]``; a float32 [M, K], b rows
    [N, width of K] (INT8: K, INT4: (K+1)//2, per group: its row bytes); out float32 [M, N]
    is overwritten."""
    v.array(a, "a", _F32, ndim=2)
    m, k = a.shape
    f = _Format(bits, scale, group_size, metadata, k)
    f.codes(b, "b", ndim=2)
    n = b.shape[0]
    if b.shape[1] != f.width:
        raise ValueError(f"b must have shape (N, {f.width}) for K={k}, got {b.shape}")
    alpha = v.finite_real(alpha, "alpha")
    if out is None:
        out = np.empty((m, n), dtype=np.float32)
    else:
        v.out_array(out, "out", (m, n), np.float32, a, b, f.scale)
    _kernels.qk_gemm(v.contiguous(a), v.contiguous(b), f.scale, out, m, n, k, alpha, f.type)
    return out


def sv_gemm(a, b, scale=None, *, bits=8, group_size=None, metadata="fp32", beta=0.0, out=None,
            n=None):
    """``out[m, n] = beta * out[m, n] + sum_k a[m, k] * dequant(b)[k, n]``; a float32
    [M, K], b rows [K, width of N] (``n`` gives odd INT4 widths and is required per group).
    beta != 0 needs ``out``."""
    v.array(a, "a", _F32, ndim=2)
    m, k = a.shape
    if group_size is None:
        nb = v.bits(bits)
        v.array(b, "b", (np.dtype(np.int8) if nb == 8 else _U8,), ndim=2)
        width = v.unpacked_width(nb, b.shape[1], n, "n")
    else:
        width = _group_width(group_size, n, "n")
    f = _Format(bits, scale, group_size, metadata, width)
    f.codes(b, "b", ndim=2)
    if b.shape[0] != k or b.shape[1] != f.width:
        raise ValueError(f"b must have shape ({k}, {f.width}) (K={k} rows of N={width}; a is "
                         f"{a.shape}), got {b.shape}")
    beta = v.finite_real(beta, "beta")
    if out is None:
        if beta != 0.0:
            raise ValueError("out is required when beta != 0")
        out = np.empty((m, width), dtype=np.float32)
    else:
        v.out_array(out, "out", (m, width), np.float32, a, b, f.scale)
    _kernels.sv_gemm(v.contiguous(a), v.contiguous(b), f.scale, out, m, width, k, beta, f.type)
    return out
