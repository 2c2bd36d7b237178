# cython: language_level=3
"""GIL-free entry points for the standalone kernels.  Arguments are validated
by gqa/_api.py: arrays arrive C-contiguous, of the right dtype and size.

The one internal API the library documents beyond its public names: kernel benchmarks
(asv_bench) and kernel tests call these directly, with the C type code of
``gqa.CacheFormat.ctype``, to time a kernel without the argument checks.  Nothing here
checks its arguments: wrong sizes are out-of-bounds accesses."""
cimport numpy as cnp
from gqa._dispatch cimport active_table, qk_kernel, gqa_kernels, gqa_qk_gemm_fn

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


def dequantize(cnp.ndarray codes, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols, int type):
    cdef const gqa_kernels *t = active_table()
    cdef const void *pc = data(codes)
    cdef float *po = <float *>data(out)
    cdef const float *ps = <const float *>data(scale)
    if rows == 0 or cols == 0:
        return
    with nogil:
        t.dequantize(pc, po, cols, rows, cols, type, ps)


def dequantize_t(cnp.ndarray codes, cnp.ndarray out, cnp.ndarray scale, size_t rows, size_t cols, int type):
    """out[c, r] = dequant(codes)[r, c] (out is [cols, rows])."""
    cdef const gqa_kernels *t = active_table()
    cdef const void *pc = data(codes)
    cdef float *po = <float *>data(out)
    cdef const float *ps = <const float *>data(scale)
    if rows == 0 or cols == 0:
        return
    with nogil:
        t.dequantize_t(pc, po, rows, rows, cols, type, ps)


def qk_gemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray scale, cnp.ndarray out,
            size_t M, size_t N, size_t K, float alpha, int type):
    cdef const gqa_kernels *t = active_table()
    cdef gqa_qk_gemm_fn fn = qk_kernel(t, type)
    cdef const float *pa = <const float *>data(a)
    cdef const void *pb = data(b)
    cdef const float *ps = <const float *>data(scale)
    cdef float *pc = <float *>data(out)
    if M == 0 or N == 0:
        return
    with nogil:
        fn(M, N, K, alpha, pa, K, pb, type, ps, pc, N)


def sv_gemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray scale, cnp.ndarray out,
            size_t M, size_t N, size_t K, float beta, int type):
    cdef const gqa_kernels *t = active_table()
    cdef const float *pa = <const float *>data(a)
    cdef const void *pb = data(b)
    cdef const float *ps = <const float *>data(scale)
    cdef float *pc = <float *>data(out)
    if M == 0 or N == 0:
        return
    with nogil:
        t.sv_gemm(M, N, K, pa, K, pb, type, ps, pc, N, beta)
