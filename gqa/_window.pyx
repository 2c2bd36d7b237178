# cython: language_level=3
"""The windowed KV cache (sliding_window_cache = 1): which positions a cache of capacity C
holds, and how one call's rows are laid out around the ordinary in-place compute
(onnxruntime 1.31.1's contract; the README's "Windowed cache").

Rows [0, L) of batch entry b's cache hold its positions [T - L, T) in order, T = seqlens_k[b]
+ 1, with L = resident(T, C, W):  G = C - W + 1;  L = T if T <= C else T - G * ceil((T - C) / G).

A step of S tokens (positions [T - S, T), L(T - S) rows resident before it) runs the compute
in place on a *work* buffer whose rows [0, keep) hold the last `keep` resident positions, with
cache-relative lengths (keep + S rows), absolute rotary positions and absolute bias columns
(row r is position base + r, base = T - S - keep):
  * direct: the present buffer itself, keep = L(T) - S, when the first new token's window
    (W - 1 earlier keys) lies inside those rows -- always for S = 1.  The kept rows move down
    in place (compaction), or come from a separate past buffer.
  * staged: a multi-token step that would evict keys it still reads (or S > C) runs on a
    staging buffer holding every resident row, keep = L(T - S), and its last L(T) rows are
    then copied to rows [0, L(T)) of the present buffer.
Rows [L(T), C) of the present buffer are left as they were (unspecified by the contract).
"""
import numbers

import numpy as np
cimport numpy as cnp
from libc.string cimport memmove

cnp.import_array()


cpdef long long resident(long long T, long long C, long long W):
    """Positions a windowed cache of capacity C (window W <= C) holds after T tokens."""
    cdef long long G = C - W + 1
    if T <= C:
        return T
    return T - G * ((T - C + G - 1) // G)


def window_resident(T, C, W):
    """L = resident(T, C, W), the public form: rows [0, L) of a windowed cache of capacity C
    (window 1 <= W <= C) hold positions [T - L, T) after T >= 0 tokens."""
    names = ("T", "C", "W")
    for name, x in zip(names, (T, C, W)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if not 0 <= T < 2 ** 62:
        raise ValueError(f"T must be in [0, 2**62), got {T}")
    if not 1 <= C < 2 ** 62:
        raise ValueError(f"C must be in [1, 2**62), got {C}")
    if not 1 <= W <= C:
        raise ValueError(f"W must be in [1, C = {C}], got {W}")
    return resident(T, C, W)


cdef bint plan(const int *seqlens, int B, int S, int C, int W, int *keep, int *src0, int *base,
               int *lnew) noexcept:
    """Per batch entry: rows kept (keep), the past row they start at (src0), the position of
    work row 0 (base) and L(T) (lnew); True when the step must be staged."""
    cdef int b
    cdef long long T, Tp, Lp, Ln
    cdef bint staged = False
    for b in range(B):
        T = <long long>seqlens[b] + 1
        Tp = T - S
        Ln = resident(T, C, W)
        keep[b] = <int>(Ln - S)
        lnew[b] = <int>Ln
        if Ln - S < 0 or Ln - S < (W - 1 if W - 1 < Tp else Tp):
            staged = True
    for b in range(B):
        T = <long long>seqlens[b] + 1
        Tp = T - S
        Lp = resident(Tp, C, W)
        if staged:
            keep[b] = <int>Lp
        src0[b] = <int>(Lp - keep[b])
        base[b] = <int>(Tp - keep[b])
    return staged


cdef void move_rows(cnp.ndarray dst, const int *dst0, cnp.ndarray src, const int *src0,
                    const int *n, int B, int Nkv) noexcept:
    """For every (b, j): rows [src0[b], src0[b] + n[b]) of src -> rows [dst0[b], ...) of dst
    (whole rows of codes, packed INT4 bytes or floats; dst may be src: memmove).  Both are
    C-contiguous [B, Nkv, rows, row_bytes] of one dtype and row width."""
    cdef size_t rb = <size_t>cnp.PyArray_STRIDE(dst, 2)
    cdef size_t drows = <size_t>cnp.PyArray_DIM(dst, 2), srows = <size_t>cnp.PyArray_DIM(src, 2)
    cdef char *d = <char *>cnp.PyArray_DATA(dst)
    cdef const char *s = <const char *>cnp.PyArray_DATA(src)
    cdef int b, j
    cdef size_t u
    for b in range(B):
        if n[b] <= 0 or (d == s and dst0[b] == src0[b]):
            continue
        for j in range(Nkv):
            u = <size_t>b * Nkv + j
            memmove(d + (u * drows + <size_t>dst0[b]) * rb, s + (u * srows + <size_t>src0[b]) * rb,
                    <size_t>n[b] * rb)


cdef int check_window_lengths(const int *seqlens, int B, int S, long long T) except -1:
    """seqlens_k of a windowed call: absolute, so bounded by total_sequence_length only, and
    every entry holds the step's S tokens (no right-padded prompt rows)."""
    cdef int b, sk
    for b in range(B):
        sk = seqlens[b]
        if sk < 0 or sk + 1 > T:
            raise ValueError(f"seqlens_k[{b}] = {sk} is out of range [0, total_sequence_length = {T})")
        if sk + 1 < S:
            raise ValueError(f"seqlens_k[{b}] = {sk} is too small for sequence_length {S} "
                             "(sliding_window_cache=1: every entry holds the step's tokens)")
    return 0
