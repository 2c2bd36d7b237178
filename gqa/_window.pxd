# The windowed KV cache's layout rules (see _window.pyx), for gqa/_signature.pyx.
cimport numpy as cnp

cpdef long long resident(long long T, long long C, long long W)
cdef bint plan(const int *seqlens, int B, int S, int C, int W, int *keep, int *src0, int *base,
               int *lnew) noexcept
cdef void move_rows(cnp.ndarray dst, const int *dst0, cnp.ndarray src, const int *src0,
                    const int *n, int B, int Nkv) noexcept
cdef int check_window_lengths(const int *seqlens, int B, int S, long long T) except -1
