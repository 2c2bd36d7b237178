# cython: language_level=3
"""GIL-free entry points for the standalone kernels.  Arguments are validated
by gqa/_api.py: arrays arrive C-contiguous, of the right dtype and size.

The one internal API the library documents beyond its public names: kernel benchmarks
(asv_bench) and kernel tests call these directly, with the C type code of
``gqa.CacheFormat.ctype``, to time a kernel without the argument checks.  Nothing here
checks its arguments: wrong sizes are out-of-bounds accesses."""
cimport numpy as cnp
from gqa._dispatch cimport (active_table, qk_kernel, sv_kernel, dot_tiles, gqa_kernels, gqa_tiles,
                            gqa_qk_gemm_fn, gqa_sv_gemm_fn, gqa_dequantize_fn)
from gqa import _config

cnp.import_array()


cdef inline void *data(cnp.ndarray a):
    return cnp.PyArray_DATA(a)


def quantize(cnp.ndarray x, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols, int type):
    cdef const gqa_kernels *t = active_table()
    cdef const float *px = <const float *>data(x)
    cdef void *po = data(out)
    cdef const float *ps = <const float *>data(scale)
    if rows == 0 or cols == 0:
        return
    with nogil:
        t.quantize(px, cols, po, rows, cols, type, ps)


cdef _dequantize(cnp.ndarray codes, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols,
                 int type, bint transposed):
    cdef const gqa_kernels *t = active_table()
    cdef gqa_dequantize_fn fn = t.dequantize_t if transposed else t.dequantize
    cdef size_t ldd = rows if transposed else cols
    cdef const void *pc = data(codes)
    cdef float *po = <float *>data(out)
    cdef const float *ps = <const float *>data(scale)
    if rows == 0 or cols == 0:
        return
    with nogil:
        fn(pc, po, ldd, rows, cols, type, ps)


def dequantize(cnp.ndarray codes, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols, int type):
    """out[r, c] = dequant(codes)[r, c] (out is [rows, cols])."""
    _dequantize(codes, out, scale, rows, cols, type, False)


def dequantize_t(cnp.ndarray codes, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols, int type):
    """out[c, r] = dequant(codes)[r, c] (out is [cols, rows])."""
    _dequantize(codes, out, scale, rows, cols, type, True)


cdef _gemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray scale, cnp.ndarray out, size_t M, size_t N,
           size_t K, float v, int type, bint sv):
    """qk_gemm (v = alpha) or sv_gemm (v = beta) of a [M, K] and b, into out [M, N]."""
    cdef const gqa_kernels *t = active_table()
    cdef int level = _config._settings["accuracy_level"]
    cdef gqa_qk_gemm_fn qk = qk_kernel(t, type, level, True, M)
    cdef gqa_sv_gemm_fn svk = sv_kernel(t, type, level, True, M, N)
    cdef const gqa_tiles *x = dot_tiles(type, level)
    cdef const float *pa = <const float *>data(a)
    cdef const void *pb = data(b)
    cdef const float *ps = <const float *>data(scale)
    cdef float *pc = <float *>data(out)
    if M == 0 or N == 0:
        return
    with nogil:
        if x != NULL:
            x.begin()
        if sv:
            svk(M, N, K, pa, K, pb, type, ps, pc, N, v)
        else:
            qk(M, N, K, v, pa, K, pb, type, ps, pc, N)
        if x != NULL:
            x.end()


def qk_gemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray scale, cnp.ndarray out,
            size_t M, size_t N, size_t K, float alpha, int type):
    """out = alpha * a @ dequant(b).T (the integer-dot kernel where opted in: approx_vnni or
    accuracy_level 4)."""
    _gemm(a, b, scale, out, M, N, K, alpha, type, False)


def sv_gemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray scale, cnp.ndarray out,
            size_t M, size_t N, size_t K, float beta, int type):
    """out = beta * out + a @ dequant(b) (the integer-dot kernel at accuracy_level 4)."""
    _gemm(a, b, scale, out, M, N, K, beta, type, True)
