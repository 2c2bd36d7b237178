"""Argument checks shared by the kernel API and the operator.  Every check
raises before anything is written, naming the argument and what was expected."""
import numbers

import numpy as np

from ._formats import CacheFormat


def array(x, name, dtypes, ndim=None, min_ndim=None):
    """x must be a NumPy array of one of `dtypes` (and the given rank)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype not in dtypes:
        want = " or ".join(np.dtype(d).name for d in dtypes)
        raise TypeError(f"{name} must have dtype {want}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got {x.ndim} (shape {x.shape})")
    if min_ndim is not None and x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {x.shape}")
    return x


def contiguous(x, dtype=None):
    """A C-contiguous, aligned view or copy of an input (inputs are never written).
    (np.ascontiguousarray alone keeps an unaligned array, e.g. np.frombuffer at an odd
    offset, and the C kernels must not read misaligned elements.)"""
    return np.require(x, dtype=dtype, requirements=["C", "A"])


def out_array(out, name, shape, dtype, *inputs):
    """A caller-supplied output buffer: exact shape and dtype, C-contiguous, writeable,
    not overlapping any input."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if not (out.flags.c_contiguous and out.flags.aligned):
        raise ValueError(f"{name} must be C-contiguous and aligned")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    for x in inputs:
        if x is not None and np.may_share_memory(out, x):
            raise ValueError(f"{name} must not overlap the inputs")
    return out


def scale(s, name, h):
    """float32 scale with 1 element (per-tensor) or h elements (per-channel);
    returns (flat contiguous float32 array, per_channel)."""
    if isinstance(s, numbers.Real) and not isinstance(s, (bool, np.bool_)):
        s = np.array([s], dtype=np.float32)
    if not isinstance(s, np.ndarray):
        raise TypeError(f"{name} must be a float32 numpy.ndarray or a real number, got {type(s).__name__}")
    if s.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {s.dtype}")
    if s.size != 1 and s.size != h:
        raise ValueError(f"{name} must have 1 element (per-tensor) or {h} elements (per-channel), "
                         f"got {s.size} (shape {s.shape})")
    return contiguous(s.reshape(-1)), (s.size != 1)


def bits(b):
    if isinstance(b, bool) or b not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {b!r}")
    return int(b)


def real(x, name):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return float(x)


def finite_real(x, name):
    """A real number that multiplies results (alpha, beta, an attribute's scale): finite, or
    every output would be NaN or infinite."""
    x = real(x, name)
    if not np.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def unpacked_width(b, packed, given, name):
    """Logical width of rows stored in `packed` bytes; `given` disambiguates odd INT4 widths."""
    if given is None:
        return packed if b == 8 else 2 * packed
    if isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < 0:
        raise ValueError(f"{name} must be a non-negative int, got {given!r}")
    if CacheFormat("PER_TENSOR", b).row_width(given) != packed:
        raise ValueError(f"{name}={given} does not match packed rows of {packed} bytes "
                         f"(expected {name} with {'(n+1)//2' if b == 4 else 'n'} == {packed})")
    return int(given)
