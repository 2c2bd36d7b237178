"""Standalone kernels: quantize, dequantize, QK GEMM and SV GEMM on the active path.

Codes follow ONNX Runtime's MLAS contract (see README): INT8 codes are int8;
INT4 codes are uint8 with two +8-biased nibbles per byte, the even element in the
low nibble.  Every function releases the GIL while computing.
"""
import numpy as np

from . import _kernels
from . import _validate as v

_F32 = (np.dtype(np.float32),)


def _code_dtype(b):
    return np.dtype(np.int8) if b == 8 else np.dtype(np.uint8)


def _codes(x, name, b, ndim=None, min_ndim=None):
    return v.array(x, name, (_code_dtype(b),), ndim=ndim, min_ndim=min_ndim)


def quantize(x, scale, *, bits=8, out=None):
    """Quantize float32 ``x[..., H]`` -> int8 ``[..., H]`` (bits=8) or packed uint8
    ``[..., (H+1)//2]`` (bits=4).  ``scale``: 1 element (per-tensor) or H (per-channel)."""
    b = v.bits(bits)
    v.array(x, "x", _F32, min_ndim=1)
    h = x.shape[-1]
    s, pc = v.scale(scale, "scale", h)
    shape = x.shape[:-1] + (v.packed_width(b, h),)
    if out is None:
        out = np.empty(shape, dtype=_code_dtype(b))
    else:
        v.out_array(out, "out", shape, _code_dtype(b), x, s)
    xc = v.contiguous(x)
    _kernels.quantize(xc, out, s, x.size // h if h else 0, h, v.quant_type(b, pc))
    return out


def dequantize(codes, scale, *, bits=8, head_size=None, out=None):
    """Dequantize codes ``[..., Hp]`` -> float32 ``[..., H]``; ``head_size`` gives H for
    INT4 rows of odd width (default 2*Hp)."""
    b = v.bits(bits)
    _codes(codes, "codes", b, min_ndim=1)
    h = v.unpacked_width(b, codes.shape[-1], head_size, "head_size")
    s, pc = v.scale(scale, "scale", h)
    shape = codes.shape[:-1] + (h,)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    else:
        v.out_array(out, "out", shape, np.float32, codes, s)
    rows = codes.size // codes.shape[-1] if codes.shape[-1] else 0
    _kernels.dequantize(v.contiguous(codes), out, s, rows, h, v.quant_type(b, pc))
    return out


def qk_gemm(a, b, scale, *, bits=8, alpha=1.0, out=None):
    """``out[m, n] = alpha * sum_k a[m, k] * dequant(b)[n, k]``; a float32 [M, K],
    b codes [N, K] (INT4: [N, (K+1)//2]); out float32 [M, N] is overwritten."""
    nb = v.bits(bits)
    v.array(a, "a", _F32, ndim=2)
    _codes(b, "b", nb, ndim=2)
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != v.packed_width(nb, k):
        raise ValueError(f"b must have shape (N, {v.packed_width(nb, k)}) for K={k} "
                         f"({'INT8' if nb == 8 else 'INT4 packed'}), got {b.shape}")
    s, pc = v.scale(scale, "scale", k)
    alpha = v.real(alpha, "alpha")
    if out is None:
        out = np.empty((m, n), dtype=np.float32)
    else:
        v.out_array(out, "out", (m, n), np.float32, a, b, s)
    _kernels.qk_gemm(v.contiguous(a), v.contiguous(b), s, out, m, n, k, alpha, v.quant_type(nb, pc))
    return out


def sv_gemm(a, b, scale, *, bits=8, beta=0.0, out=None, n=None):
    """``out[m, n] = beta * out[m, n] + sum_k a[m, k] * dequant(b)[k, n]``; a float32
    [M, K], b codes [K, N] (INT4: [K, (N+1)//2], ``n`` gives odd N). beta != 0 needs ``out``."""
    nb = v.bits(bits)
    v.array(a, "a", _F32, ndim=2)
    _codes(b, "b", nb, ndim=2)
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"b must have K={k} rows (a is {a.shape}), got shape {b.shape}")
    width = v.unpacked_width(nb, b.shape[1], n, "n")
    s, pc = v.scale(scale, "scale", width)
    beta = v.real(beta, "beta")
    if out is None:
        if beta != 0.0:
            raise ValueError("out is required when beta != 0")
        out = np.empty((m, width), dtype=np.float32)
    else:
        v.out_array(out, "out", (m, width), np.float32, a, b, s)
    _kernels.sv_gemm(v.contiguous(a), v.contiguous(b), s, out, m, width, k, beta, v.quant_type(nb, pc))
    return out
