# cython: language_level=3
"""The argument rules that the call's checks (gqa/_signature.pyx) apply to one argument at a
time: kinds, dtypes, shapes, flags, finite scales, lengths, thread counts and memory overlap.
Each raises before anything is written, naming the argument and what was expected
(ValueError for values and shapes, TypeError for kinds and dtypes)."""
cimport numpy as cnp
from libc.stdint cimport uint16_t, uint32_t

import numbers

import numpy as np

from gqa._dispatch cimport omp_max_threads, active_table, GQA_F32
from gqa import _config
from gqa import _validate
from gqa._rotation import hadamard_scale

cnp.import_array()

cdef int READY = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED
cdef dict _SETTINGS = _config._settings   # updated in place by gqa.config


cdef int _array(object x, str name, int t1, int t2, int ndim) except -1:
    """x must be an ndarray of type number t1 (or t2, -1: none) and rank ndim (-1: any); a
    refusal is gqa/_validate.py's (one statement of the rule and its messages)."""
    cdef int t
    if isinstance(x, cnp.ndarray):
        t = cnp.PyArray_TYPE(<cnp.ndarray>x)
        if (t == t1 or t == t2) and (ndim < 0 or cnp.PyArray_NDIM(<cnp.ndarray>x) == ndim):
            return 0
    dtypes = tuple(np.dtype(cnp.PyArray_DescrFromType(d)) for d in (t1, t2) if d >= 0)
    _validate.array(x, name, dtypes, ndim=ndim if ndim >= 0 else None)
    raise AssertionError(f"gqa/_validate.py accepted {name}, which gqa/_checks.pyx refused")


cdef bint _ready(object x, int type_num) noexcept:
    """The compute can read x as it is: that dtype, C-contiguous, aligned (None: nothing)."""
    if x is None:
        return True
    cdef cnp.ndarray a = <cnp.ndarray>x
    return cnp.PyArray_TYPE(a) == type_num and (cnp.PyArray_FLAGS(a) & READY) == READY


cdef object _f32(object x):
    """A float32, C-contiguous, aligned view or copy of a float input (None stays None)."""
    if x is None or _ready(x, cnp.NPY_FLOAT32):
        return x
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x if x.flags.aligned else x.copy()


cdef object _contiguous(object x):
    """A C-contiguous, aligned view or copy of an input (inputs are never written)."""
    if x is None or (cnp.PyArray_FLAGS(<cnp.ndarray>x) & READY) == READY:
        return x
    return np.require(x, requirements=["C", "A"])


cdef long long _total_length(object t) except -1:
    """total_sequence_length: a Python int or a one-element int32 array, in [1, INT32_MAX]."""
    if type(t) is int and 1 <= t <= INT32_MAX:
        return t
    if isinstance(t, (bool, np.bool_)):
        raise TypeError("total_sequence_length must be an int or a one-element int32 array")
    if isinstance(t, cnp.ndarray):
        if cnp.PyArray_TYPE(<cnp.ndarray>t) != cnp.NPY_INT32:
            raise TypeError(f"total_sequence_length must have dtype int32, got {t.dtype}")
        if cnp.PyArray_SIZE(<cnp.ndarray>t) != 1:
            raise ValueError("total_sequence_length tensor must be of one element, "
                             f"got shape {t.shape}")
        v = int(t.reshape(-1)[0])
    elif isinstance(t, numbers.Integral):
        v = int(t)
    else:
        raise TypeError("total_sequence_length must be an int or a one-element int32 array, "
                        f"got {type(t).__name__}")
    if v < 1:
        raise ValueError(f"total_sequence_length must be >= 1, got {v}")
    if v > INT32_MAX:
        raise ValueError(f"total_sequence_length must be <= {INT32_MAX} (int32), got {v}")
    return v


cdef int _threads(object n) except -1:
    """Threads of a call: num_threads, else gqa.config's, else OpenMP's default."""
    if n is None:
        nt = _SETTINGS["num_threads"]
        return nt if nt is not None else max(1, omp_max_threads())
    if type(n) is int and 1 <= n <= INT32_MAX:
        return n
    return _config._check_threads(n, "num_threads")


cdef object _finite(object x, str name, str why):
    """x (float32 or float16) as the compute reads it (C-contiguous, aligned), once every
    element is finite, else ValueError naming the element and `why` it must be (the README's
    numeric contract: nothing non-finite is multiplied into a cache)."""
    x = _contiguous(x)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(<cnp.ndarray>x)
    cdef const uint32_t *u = <const uint32_t *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef const uint16_t *h = <const uint16_t *>u
    if cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_FLOAT32:
        for i in range(n):
            if (u[i] & 0x7f800000u) == 0x7f800000u:     # exponent all ones: inf or NaN
                break
        else:
            return x
    else:
        for i in range(n):
            if (h[i] & 0x7c00u) == 0x7c00u:
                break
        else:
            return x
    at = i if x.ndim == 1 else tuple(int(j) for j in np.unravel_index(i, x.shape))
    raise ValueError(f"{name} element {at} is {x.reshape(-1)[i]}: {why}")


cdef object _finite_scale(object s, str name):
    """A quantization scale as the compute reads it, once finite (every call: a kept scale may
    be rewritten between calls, and it is a few floats)."""
    return _finite(s, name, "scales must be finite (a non-finite scale makes every quantized "
                   "write and read of its channels garbage)")


def finite_scale(s, name):
    """_finite_scale for the standalone kernels (gqa/_api.py): the same rule and message."""
    return _finite_scale(s, name)


# max |R R^T - I| of an orthogonal matrix rounded to float32 / float16 is at most 2u(1 + u)
# (u = 2^-24 / 2^-11); the tolerances leave room for rotations computed in that precision
ORTHOGONAL_TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float16): 2e-3}


cdef void _gram_deviation32(const float *a, Py_ssize_t nkv, Py_ssize_t H, float *g,
                            double *dev) noexcept nogil:
    """dev[j] = max |G - I| of G = R R^T computed in float32 by the active path's QK kernel, its
    upper triangle in blocks of 16 rows (g: H x H scratch), R = a[j]: within H 2^-24 (1 + max
    |R R^T - I|) of the float64 value (each entry a sum of H products, |sum_d r_id r_kd| <=
    |r_i| |r_k|); NaN where a product overflowed."""
    cdef Py_ssize_t j, i0, m, i, k
    cdef const float *r
    cdef double x, d
    for j in range(nkv):
        r = a + j * H * H
        d = 0.0
        for i0 in range(0, H, 16):
            m = H - i0 if H - i0 < 16 else 16
            active_table().qk_gemm(m, H - i0, H, 1.0, r + i0 * H, H, r + i0 * H, GQA_F32, NULL, g, H)
            for i in range(m):
                for k in range(i, H - i0):
                    x = <double>g[i * H + k] - (1.0 if i == k else 0.0)
                    x = -x if x < 0 else x
                    if not x <= d:      # NaN too
                        d = x
        dev[j] = d


cdef double _orthogonal(object r, str name) except -1.0:
    """Rotations r [Nkv, H, H]: finite, and each orthogonal within ORTHOGONAL_TOLERANCE (the
    output is turned back by R_V^T and the scores use R_K R_K^T = I): max |R R^T - I| in
    float64 (closed form for scaled Hadamard rotations, hadamard_scale; else O(H^3), in float32
    where that decides).
    Returns the Hadamard rotation's scale c (hadamard_scale), 0.0 for any other rotation."""
    _finite(r, name, "rotations must be finite")
    cdef double tol = ORTHOGONAL_TOLERANCE[r.dtype]
    cdef cnp.ndarray a, g, dev
    cdef double c = hadamard_scale(r)
    if c > 0:       # R R^T = H c^2 I exactly
        dev = np.full(r.shape[0], abs(r.shape[1] * c * c - 1.0))
    else:
        # float32 first (the active path's kernel); float64 where that cannot decide:
        # |dev32 - dev| <= H 2^-24 (1 + dev) / (1 - H 2^-24).  Never NumPy's BLAS (matmul):
        # OpenBLAS's workers keep spinning ~0.1 s after a product and would take the cores
        # from the call this check precedes; einsum without optimize= runs its own loops (not BLAS)
        a = np.ascontiguousarray(r, np.float32)
        g = np.empty(16 * a.shape[1], np.float32)
        dev = np.empty(a.shape[0])
        with nogil:
            _gram_deviation32(<const float *>cnp.PyArray_DATA(a), a.shape[0], a.shape[1],
                              <float *>cnp.PyArray_DATA(g), <double *>cnp.PyArray_DATA(dev))
        err = 1.01 * a.shape[1] * 2.0 ** -24 * (1.0 + dev)
        if not bool((dev + err <= tol).all()):
            a = np.asarray(r, np.float64)
            dev = np.abs(np.einsum("jik,jlk->jil", a, a, optimize=False) - np.eye(a.shape[1])).max(axis=(1, 2))
    j = int(np.argmax(dev))
    if dev[j] > tol:
        raise ValueError(f"{name}[{j}] is not orthogonal: max |R R^T - I| = {dev[j]:.3g} > "
                         f"{tol:g} ({r.dtype} rotations; an orthogonal matrix rounded to "
                         f"{r.dtype} is within {float(np.finfo(r.dtype).eps):.2g})")
    return c


cdef tuple _side_format(op, str side, object scale, int Nkv, int H):
    """One quantized cache (side "k" or "v", its gqa.CacheFormat op.k_format / op.v_format):
    (NumPy element type, row width, C type of gqa_kernels.h, per-channel scales, the width's
    name in messages)."""
    fmt = op.k_format if side == "k" else op.v_format
    cdef bint pc
    if fmt.grouped:
        if scale is not None:
            raise ValueError(f"{side}_scale must not be given when {side}_quant_type is PER_GROUP "
                             "(its scales and zero points are stored in the cache rows)")
        names = ("kv_quant_group_size", "head_size")
        return (cnp.NPY_UINT8, fmt.row_width(H, names), fmt.ctype(H, names=names), False,
                "gqa.group_row_bytes(head_size, bits, group, metadata)")
    pc = _scale(scale, f"{side}_scale", fmt.quant, Nkv * H)
    return (fmt.dtype().num, fmt.row_width(H), fmt.ctype(H), pc,
            "head_size" if fmt.bits == 8 else "(head_size+1)//2")


cdef bint _scale(object s, str name, str qtype, int nch) except -1:
    """A quantization scale: float32, 1 element (PER_TENSOR) or nch (PER_CHANNEL)."""
    if s is None:
        raise ValueError(f"{name} must be provided when {name[0]}_quant_type is not NONE")
    if not isinstance(s, cnp.ndarray):
        raise TypeError(f"{name} must be a float32 numpy.ndarray, got {type(s).__name__}")
    if cnp.PyArray_TYPE(<cnp.ndarray>s) != cnp.NPY_FLOAT32:
        raise TypeError(f"{name} must be float tensor (float32), got {s.dtype}")
    cdef bint pc = qtype == "PER_CHANNEL"
    cdef Py_ssize_t want = nch if pc else 1
    if cnp.PyArray_SIZE(<cnp.ndarray>s) != want:
        raise ValueError(f"{name} shape mismatch: expected {want} elements "
                         f"({'kv_num_heads * head_size' if want != 1 else 'per-tensor'}), got {s.size}")
    return pc


cdef int _rotary(int do_rotary, cos, sin, pos, int ft, int B, int S, int H) except -1:
    """Signature checks of the rotary inputs; rotary_dim / 2 when rotary applies, else 0."""
    if (cos is None) != (sin is None):
        raise ValueError("Input 'cos_cache' and 'sin_cache' shall be both present or both absent.")
    if pos is not None:
        _array(pos, "position_ids", cnp.NPY_INT64, -1, 2)
    if cos is None:
        if do_rotary == 1:
            raise ValueError("cos_cache and sin_cache must be provided when do_rotary is true")
        return 0
    _array(cos, "cos_cache", ft, -1, 2)
    _array(sin, "sin_cache", ft, -1, 2)
    if cos.shape != sin.shape:
        raise ValueError(f"cos_cache and sin_cache must have the same shape; got {cos.shape} and {sin.shape}")
    if H % 16:
        raise ValueError(f"head_size shall be a multiple of 16 when rotary caches are given. "
                         f"Got head_size % 16 == {H % 16}")
    cdef Py_ssize_t half = cos.shape[1]
    if half > (H // 16) * 8 or half % 8 or half == 0:
        raise ValueError(f"cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8; "
                         f"got {half} (head_size {H})")
    if pos is not None:
        if pos.shape[0] != B:
            raise ValueError(f"position_ids dimension 0 must be equal to the batch size, got {pos.shape[0]}")
        if pos.shape[1] < S:
            raise ValueError(f"position_ids dimension 1 must be at least sequence length, got {pos.shape[1]}")
    return half if do_rotary == 1 else 0


cdef int _present(object out, str name, int B, int Nkv, int Hp, object dtype) except -1:
    """A caller-supplied present buffer (not in place): dtype, shape (B, Nkv, *, Hp) --
    dimension 2 is checked on every call, against max(T, past length) --, C-contiguous,
    aligned, writeable."""
    if not isinstance(out, cnp.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {out.dtype}")
    if out.ndim != 4 or out.shape[0] != B or out.shape[1] != Nkv or out.shape[3] != Hp:
        raise ValueError(f"{name} must have shape ({B}, {Nkv}, max(total_sequence_length, "
                         f"past_sequence_length), {Hp}), got {tuple(out.shape)}")
    if (cnp.PyArray_FLAGS(<cnp.ndarray>out) & READY) != READY:
        raise ValueError(f"{name} must be C-contiguous and aligned")
    if not (cnp.PyArray_FLAGS(<cnp.ndarray>out) & cnp.NPY_ARRAY_WRITEABLE):
        raise ValueError(f"{name} must be writeable")
    return 0


# -- memory overlap ---------------------------------------------------------------------------

cdef inline void _extent(cnp.ndarray a, char **lo, char **hi):
    """[lo, hi): the bytes an array of any strides (negative included) can address."""
    cdef char *p = <char *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t d, step, low = 0, high = cnp.PyArray_ITEMSIZE(a)
    for d in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIM(a, d) == 0:
            lo[0] = p
            hi[0] = p
            return
        step = cnp.PyArray_STRIDE(a, d) * (cnp.PyArray_DIM(a, d) - 1)
        if step < 0:
            low += step
        else:
            high += step
    lo[0] = p + low
    hi[0] = p + high


cdef bint _meets(object x, char *lo, char *hi, object c):
    """x shares a byte with array c, whose bytes span [lo, hi) (see _extent): a bounds test,
    confirmed exactly (np.shares_memory) only when the bounds meet, so interleaved strided
    views of one buffer are not refused.  Anything but an ndarray shares none."""
    cdef char *xlo
    cdef char *xhi
    if not isinstance(x, cnp.ndarray):
        return False
    _extent(<cnp.ndarray>x, &xlo, &xhi)
    return xlo < hi and lo < xhi and bool(np.shares_memory(x, c))


cdef bint overlap(object a, object b):
    """True when arrays a and b share a byte (anything else -- None, an int -- shares none)."""
    cdef char *lo
    cdef char *hi
    if not isinstance(b, cnp.ndarray):
        return False
    _extent(<cnp.ndarray>b, &lo, &hi)
    return _meets(a, lo, hi, b)


cdef Py_ssize_t first_alias(kc, vc, tuple inputs):
    """Index of the first of `inputs` sharing memory with kc or vc, else -1 (overlap, with
    the two caches' byte ranges taken once)."""
    cdef Py_ssize_t i
    cdef char *klo = NULL
    cdef char *khi = NULL
    cdef char *vlo = NULL
    cdef char *vhi = NULL
    if isinstance(kc, cnp.ndarray):     # else an empty range: nothing meets it
        _extent(<cnp.ndarray>kc, &klo, &khi)
    if isinstance(vc, cnp.ndarray):
        _extent(<cnp.ndarray>vc, &vlo, &vhi)
    for i in range(len(inputs)):
        if _meets(inputs[i], klo, khi, kc) or _meets(inputs[i], vlo, vhi, vc):
            return i
    return -1


cdef int apart(tuple outs, tuple out_names, tuple ins, tuple in_names, str where) except -1:
    """The one rule of the caller's buffers that a call writes (outs): none shares a byte
    with any of `ins` or with another of `outs` (None entries are skipped), else
    ValueError "<out> must not overlap <input>" (+ where)."""
    cdef Py_ssize_t i, j
    cdef char *lo
    cdef char *hi
    for i in range(len(outs)):
        o = outs[i]
        if not isinstance(o, cnp.ndarray):
            continue
        _extent(<cnp.ndarray>o, &lo, &hi)
        for j in range(len(ins)):
            if _meets(ins[j], lo, hi, o):
                raise ValueError(f"{out_names[i]} must not overlap {in_names[j]}{where}")
        for j in range(i + 1, len(outs)):
            if _meets(outs[j], lo, hi, o):
                raise ValueError(f"{out_names[i]} and {out_names[j]} must not overlap{where}")
    return 0
