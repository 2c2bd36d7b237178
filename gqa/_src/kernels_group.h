/*
 * kernels_group.h -- the per-group asymmetric codec (GQA_G8 / GQA_G4 / GQA_G2, row layout
 * in gqa_kernels.h) and the drivers that give every path the five table operations on
 * group rows.  Included by each path's TU after kernels_common.h; each TU passes its own
 * row decoder and its own float32 GEMMs, so the inner loops run under that TU's flags.
 *
 * Quantize one row x[0:cols] (bit-exact on every path: no product is added to anything):
 *   tau   = the k-th smallest |x[i]| (0-based, NaN counted as +inf), k = min(trunc(fl32(rho *
 *           cols)), cols - 1), when 0 < rho < 1; otherwise no clip (tau = +inf);
 *   v[i]  = min(max(x[i], -tau), tau)                      (NaN stays NaN)
 *   per group: lo = min v, hi = max v over the group (NaN skipped; lo = hi = 0 when all NaN;
 *           lo = fl32(lo + 0): a zero minimum is +0),
 *           scale = fl32(hi - lo) / Q with Q = 2^b - 1, scale = 1 unless scale > 0,
 *           code = clamp(rint(fl32(v - lo) / scale), 0, Q), half to even, NaN -> Q,
 *           stored: scale and zero = lo (as binary16, round to nearest even, with
 *           GQA_META_F16: the codes are computed from the float32 scale and lo).
 * Decode: x = fl32(fl32(code * scale) + zero) with the stored metadata.
 * Metadata bytes are little endian (the byte order of every supported CPU).
 */
#ifndef GQA_KERNELS_GROUP_H
#define GQA_KERNELS_GROUP_H

#include <stdlib.h>
#include "kernels_common.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* Floats of the on-stack tile a driver decodes rows into (rows of at most this many columns;
   wider rows use a heap buffer). */
#define GQA_GROUP_TILE 4096

typedef void (*gqa_group_decode_fn)(const uint8_t *row, float *dst, size_t cols, int type);

static inline void gqa_group_meta(const uint8_t *meta, size_t g, int type, float *scale, float *zero)
{
    if (type & GQA_META_F16) {
        uint16_t h[2];
        memcpy(h, meta + 4 * g, 4);
        *scale = gqa_h2f(h[0]);
        *zero = gqa_h2f(h[1]);
    } else {
        float f[2];
        memcpy(f, meta + 8 * g, 8);
        *scale = f[0];
        *zero = f[1];
    }
}

/* 1 when every scale and zero of rows [0, n) (rb bytes apart, `cols` columns of group type `type`)
   is below `limit` in magnitude (NaN is not): with limit 1e30 every value u scale + zero is
   finite, and a zero probability times it 0. */
static inline int gqa_group_meta_below(const uint8_t *rows, size_t rb, size_t n, size_t cols, int type, float limit)
{
    const size_t cb = cols * gqa_group_bits(type) / 8, J = cols / gqa_group_cols(type);
    for (size_t k = 0; k < n; k++)
        for (size_t j = 0; j < J; j++) {
            float s, z;
            gqa_group_meta(rows + k * rb + cb, j, type, &s, &z);
            if (!(fabsf(s) < limit && fabsf(z) < limit))
                return 0;
        }
    return 1;
}

/* tau of the row (see the header comment); +inf when rho does not clip.  The k-th smallest |x|
   is found by bisection on the bit patterns (non-negative floats order as their bit
   patterns, all below 2^31; NaN counts as +inf, 0x7f800000): the smallest pattern t with more than k elements
   <= t, which is an element's.  Each of the 31 steps is one counting pass, a loop a compiler
   vectorizes; any correct selection gives the same value. */
static inline float gqa_group_tau(const float *x, size_t cols, float rho)
{
    if (!(rho > 0.0f && rho < 1.0f) || cols == 0)
        return INFINITY;
    int32_t stack[1024]; /* the patterns are < 2^31: signed compares order them too */
    int32_t *u = cols <= 1024 ? stack : (int32_t *)malloc(cols * sizeof(int32_t));
    if (u == NULL)
        return INFINITY;
    for (size_t i = 0; i < cols; i++) {
        float v = fabsf(x[i]);
        v = v != v ? INFINITY : v;
        memcpy(u + i, &v, 4);
    }
    float kf = rho * (float)cols;
    size_t k = (size_t)kf;
    if (k >= cols)
        k = cols - 1;
    int32_t lo = 0, hi = 0x7f800000; /* the answer lies in [lo, hi] */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        int32_t n = 0;
        for (size_t i = 0; i < cols; i++)
            n += u[i] <= mid;
        if ((size_t)n > k)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (u != stack)
        free(u);
    float tau;
    memcpy(&tau, &lo, 4);
    return tau;
}

static inline float gqa_group_clip(float x, float tau)
{
    x = x > tau ? tau : x;
    return x < -tau ? -tau : x;
}

/* lo and hi of one group's clipped values x[0:n] (NaN skipped; lo > hi when all NaN): eight
   lane-wise minima and maxima, then combined -- the same values as one running min / max
   (min and max of a set do not depend on the order, zeros aside, and a zero lo is made +0),
   written so that a compiler vectorizes it under each path's flags. */
static inline void gqa_group_range(const float *x, size_t n, float tau, float *lo_out, float *hi_out)
{
    float lo8[8], hi8[8];
    for (int j = 0; j < 8; j++) {
        lo8[j] = INFINITY;
        hi8[j] = -INFINITY;
    }
    size_t c = 0;
#if defined(__AVX__)
    /* the same lanes and comparisons: min_ps(a, b) = a < b ? a : b, max_ps(a, b) = a > b ? a : b
       lane by lane, NaN included (GCC keeps the loop below scalar) */
    if (n >= 8) {
        const __m256 t = _mm256_set1_ps(tau), mt = _mm256_set1_ps(-tau);
        __m256 l = _mm256_set1_ps(INFINITY), h = _mm256_set1_ps(-INFINITY);
        for (; c + 8 <= n; c += 8) {
            const __m256 v = _mm256_max_ps(mt, _mm256_min_ps(t, _mm256_loadu_ps(x + c)));
            l = _mm256_min_ps(v, l);
            h = _mm256_max_ps(v, h);
        }
        _mm256_storeu_ps(lo8, l);
        _mm256_storeu_ps(hi8, h);
    }
#endif
    for (; c + 8 <= n; c += 8)
        for (int j = 0; j < 8; j++) {
            const float v = gqa_group_clip(x[c + j], tau);
            lo8[j] = v < lo8[j] ? v : lo8[j];
            hi8[j] = v > hi8[j] ? v : hi8[j];
        }
    for (; c < n; c++) {
        const float v = gqa_group_clip(x[c], tau);
        lo8[0] = v < lo8[0] ? v : lo8[0];
        hi8[0] = v > hi8[0] ? v : hi8[0];
    }
    float lo = lo8[0], hi = hi8[0];
    for (int j = 1; j < 8; j++) {
        lo = lo8[j] < lo ? lo8[j] : lo;
        hi = hi8[j] > hi ? hi8[j] : hi;
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* The codes of one group's values x[0:n], one per byte (the per-element part of the codec, a
   loop a compiler vectorizes). */
static inline void gqa_group_codes(const float *x, uint8_t *q8, size_t n, float tau, float lo, float scale,
                                   float Q)
{
    for (size_t i = 0; i < n; i++) {
        const float d = gqa_group_clip(x[i], tau) - lo;
        float q = rintf(d / scale);
        q = q < Q ? q : Q; /* NaN fails the compare -> Q */
        q = q > 0.0f ? q : 0.0f;
        q8[i] = (uint8_t)(int)q;
    }
}

static inline void gqa_group_quantize_row(const float *x, uint8_t *dst, size_t cols, int type,
                                          const float *rho)
{
    const unsigned b = gqa_group_bits(type), per = 8 / b;
    const float Q = (float)((1u << b) - 1);
    const size_t g = gqa_group_cols(type), code_bytes = cols * b / 8;
    const float tau = gqa_group_tau(x, cols, rho == NULL ? 0.0f : rho[0]);
    uint8_t *meta = dst + code_bytes;
    uint8_t q8[256];
    for (size_t gi = 0; gi * g < cols; gi++) {
        const size_t c0 = gi * g;
        float lo, hi;
        gqa_group_range(x + c0, g, tau, &lo, &hi);
        if (lo > hi)
            lo = hi = 0.0f;
        lo += 0.0f; /* a zero minimum is +0: which of -0 and +0 a min finds depends on the order */
        float range = hi - lo;
        float scale = range / Q;
        if (!(scale > 0.0f))
            scale = 1.0f;
        for (size_t c = c0; c < c0 + g; c += 256) { /* codes a chunk at a time, then packed */
            const size_t n = c0 + g - c < 256 ? c0 + g - c : 256;
            gqa_group_codes(x + c, q8, n, tau, lo, scale, Q);
            uint8_t *d = dst + c / per;
            if (b == 8)
                memcpy(d, q8, n);
            else if (b == 4)
                for (size_t i = 0; i < n / 2; i++)
                    d[i] = (uint8_t)(q8[2 * i] | q8[2 * i + 1] << 4);
            else
                for (size_t i = 0; i < n / 4; i++)
                    d[i] = (uint8_t)(q8[4 * i] | q8[4 * i + 1] << 2 | q8[4 * i + 2] << 4 | q8[4 * i + 3] << 6);
        }
        if (type & GQA_META_F16) {
            uint16_t h[2] = {gqa_f2h(scale), gqa_f2h(lo)};
            memcpy(meta + 4 * gi, h, 4);
        } else {
            float f[2] = {scale, lo};
            memcpy(meta + 8 * gi, f, 8);
        }
    }
}

/* The portable decoder (the scalar and NEON paths' row decoder, and the reference). */
static inline void gqa_group_decode_row_ref(const uint8_t *row, float *dst, size_t cols, int type)
{
    const unsigned b = gqa_group_bits(type), per = 8 / b, mask = (1u << b) - 1;
    const size_t g = gqa_group_cols(type);
    const uint8_t *meta = row + cols * b / 8;
    for (size_t gi = 0; gi * g < cols; gi++) {
        float s, z;
        gqa_group_meta(meta, gi, type, &s, &z);
        for (size_t c = gi * g; c < (gi + 1) * g; c++) {
            float t = (float)((row[c / per] >> (b * (c % per))) & mask) * s;
            dst[c] = t + z;
        }
    }
}

/* ---- drivers: the table operations on group rows ---- */

static inline void gqa_group_quantize(const float *src, size_t lda, void *dst, size_t rows,
                                      size_t cols, int type, const float *rho)
{
    size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++)
        gqa_group_quantize_row(src + r * lda, (uint8_t *)dst + r * rb, cols, type, rho);
}

static inline void gqa_group_dequantize(const void *src, float *dst, size_t ldd, size_t rows,
                                        size_t cols, int type, gqa_group_decode_fn decode)
{
    size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++)
        decode((const uint8_t *)src + r * rb, dst + r * ldd, cols, type);
}

/* A tile of at least `need` floats: buf when it fits, else the heap (NULL on failure). */
static inline float *gqa_group_tile(float *buf, size_t need)
{
    return need <= GQA_GROUP_TILE ? buf : (float *)malloc(need * sizeof(float));
}

/* dst[c * ldd + r] = row r's value c: 16 rows decoded at a time (8 when rows are wider than
   256 columns, ...), then written out column by column, 16 consecutive floats a column (one
   line, not one line per value). */
static inline void gqa_group_dequantize_t(const void *src, float *dst, size_t ldd, size_t rows,
                                          size_t cols, int type, gqa_group_decode_fn decode)
{
    float buf[GQA_GROUP_TILE];
    size_t nb = cols == 0 ? 1 : GQA_GROUP_TILE / cols;
    nb = nb > 16 ? 16 : nb < 1 ? 1 : nb;
    float *t = gqa_group_tile(buf, nb * cols);
    size_t rb = gqa_row_bytes(type, cols);
    if (t == NULL)
        return;
    for (size_t r0 = 0; r0 < rows; r0 += nb) {
        const size_t n = rows - r0 < nb ? rows - r0 : nb;
        for (size_t i = 0; i < n; i++)
            decode((const uint8_t *)src + (r0 + i) * rb, t + i * cols, cols, type);
        for (size_t c = 0; c < cols; c++)
            for (size_t i = 0; i < n; i++)
                dst[c * ldd + r0 + i] = t[i * cols + c];
    }
    if (t != buf)
        free(t);
}

/* C = alpha A B^T: B decoded a block of rows at a time, then the path's float32 kernel
   (whose C[m, n] depends only on row m of A and row n of B, so blocks do not matter). */
static inline void gqa_group_qk(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                const void *B, int type, float *C, size_t ldc,
                                gqa_group_decode_fn decode, gqa_qk_gemm_fn f32)
{
    float buf[GQA_GROUP_TILE];
    size_t nb = K == 0 ? N : (K <= GQA_GROUP_TILE ? GQA_GROUP_TILE / K : 1);
    float *t = gqa_group_tile(buf, nb * K);
    size_t rb = gqa_row_bytes(type, K);
    if (t == NULL)
        return;
    for (size_t n0 = 0; n0 < N; n0 += nb) {
        size_t n = N - n0 < nb ? N - n0 : nb;
        gqa_group_dequantize((const uint8_t *)B + n0 * rb, t, K, n, K, type, decode);
        f32(M, n, K, alpha, A, lda, t, GQA_F32, NULL, C + n0, ldc);
    }
    if (t != buf)
        free(t);
}

/* C = beta C + A B: B decoded a block of rows (keys) at a time; the first block applies
   beta, the others add (beta 1). */
static inline void gqa_group_sv(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                                int type, float *C, size_t ldc, float beta,
                                gqa_group_decode_fn decode, gqa_sv_gemm_fn f32)
{
    float buf[GQA_GROUP_TILE];
    size_t kb = N == 0 ? K : (N <= GQA_GROUP_TILE ? GQA_GROUP_TILE / N : 1);
    float *t = gqa_group_tile(buf, kb * N);
    size_t rb = gqa_row_bytes(type, N);
    if (t == NULL)
        return;
    if (K == 0)
        f32(M, N, 0, A, lda, t, GQA_F32, NULL, C, ldc, beta);
    for (size_t k0 = 0; k0 < K; k0 += kb) {
        size_t k = K - k0 < kb ? K - k0 : kb;
        gqa_group_dequantize((const uint8_t *)B + k0 * rb, t, N, k, N, type, decode);
        f32(M, N, k, A + k0, lda, t, GQA_F32, NULL, C, ldc, k0 == 0 ? beta : 1.0f);
    }
    if (t != buf)
        free(t);
}

/* ---- lookup order: the SIMD table kernels' element order within a block ----
 * A block of blk elements (per = 8 / bits codes a byte) comes out of its lookups as vectors of
 * `lanes` floats: lane l of lookup k is element per * l + k (INT8, per = 1: in order). */

/* Row a [K] of the GEMMs' A in lookup order (K a multiple of blk). */
static inline void gqa_group_to_lookup_order(const float *a, float *o, size_t K, size_t blk, size_t per,
                                             size_t lanes)
{
    for (size_t c = 0; c < K; c += blk)
        for (size_t k = 0; k < per; k++)
            for (size_t l = 0; l < blk / per; l++)
                o[c + lanes * k + l] = a[c + per * l + k];
}

/* nbk blocks of accumulated SV columns t (lookup order) back into C's row c in column order:
   c[i] = the sum (beta == 0) or beta * c[i] + the sum. */
static inline void gqa_group_from_lookup_order(const float *t, float *c, int nbk, int blk, int per, int lanes,
                                               float beta)
{
    for (int j = 0; j < nbk; j++)
        for (int k = 0; k < per; k++)
            for (int l = 0; l < blk / per; l++) {
                const float o = t[j * blk + lanes * k + l];
                float *d = c + j * blk + per * l + k;
                *d = beta == 0.0f ? o : beta * *d + o;
            }
}

/* ---- the 8-byte blocks of the AVX2 and NEON fused kernels ----
 * Ordered (groups of a multiple of the block): INT4 16 elements from 8 bytes, the low nibbles
 * (elements 0, 2, .., 14) then the high ones; INT2 32 elements from 8 bytes, 8-lane lookup k
 * lane l = element 4l + k.  Otherwise (INT8, or groups of 8 columns, INT2 of 16) 8 elements in
 * order. */
static inline size_t gqa_group_block8(unsigned b, int ordered) { return !ordered ? 8 : b == 4 ? 16 : 32; }

static inline int gqa_group_ordered8(int type)
{   /* INT8 keeps the natural order */
    const unsigned b = gqa_group_bits(type);
    return b != 8 && gqa_group_cols(type) % gqa_group_block8(b, 1) == 0;
}

/* Row a [K] of A in the 8-byte blocks' element order of `type` (8-lane lookups). */
static inline void gqa_group_prep8(const float *a, float *o, size_t K, int type)
{
    const unsigned b = gqa_group_bits(type);
    if (gqa_group_ordered8(type))
        gqa_group_to_lookup_order(a, o, K, gqa_group_block8(b, 1), 8 / b, 8);
    else
        memcpy(o, a, K * sizeof(float));
}

/* Keys per pass of the fused SV: 16 KiB of rows (rb bytes each), so that the pass's column
   blocks find its rows in L1 rather than reading the whole of B once per block. */
static inline size_t gqa_group_pass_keys(size_t rb)
{
    const size_t kp = 16384 / (rb ? rb : 1);
    return kp < 16 ? 16 : kp;
}

/* The fused per-group QK / SV drivers of a path with 8-byte blocks (AVX2, NEON), given its
   kernels qk_blk(MB, NB, b, ORD, N, K, alpha, A', B, type, C, ldc, ms) over MB x NB = 8
   (rows of prepared A x rows of B; shapes 1 x 8, 2 x 4, 4 x 2, ms rows stored), and
   sv_blk_1 / sv_blk_2(b, ORD, N, K, A, lda, B, type, T, ldt, first, c0) over 32 columns and
   1 / 2 rows of A: the K keys' products added to the float32 sums T[m * ldt + c0 ..] (32 a row,
   the blocks' lookup order; first: from 0), each column's sum taken over the keys in order, so
   passes of keys give the sums of one pass (GQA_GROUP_VARIANT_CALL: one call per (bits,
   ordered) variant, from b and ord).
   Rows of A past M in a block of four: copies of the last (never stored).  Expanded in a
   path's unit, whose INLINE forces inlining (the kernels specialize on b and ORD).
   group_fast_<path>: the shapes they take (groups of a multiple of 8 columns, rows of a
   multiple of 32 and at most 1024). */
#define GQA_GROUP_VARIANT_CALL(F, ...)                                                                  \
    do {                                                                                             \
        if (b == 8) F(8, 0, __VA_ARGS__);                                                            \
        else if (b == 4 && ord) F(4, 1, __VA_ARGS__);                                                \
        else if (b == 4) F(4, 0, __VA_ARGS__);                                                       \
        else if (ord) F(2, 1, __VA_ARGS__);                                                          \
        else F(2, 0, __VA_ARGS__);                                                                   \
    } while (0)
#define GQA_GROUP_FUSED(path, qk_blk, sv_blk)                                                       \
    INLINE void group_qk_rows_##path(const unsigned b, const int ORD, size_t mb, size_t N, size_t K, \
                                     float alpha, const float *ap, const uint8_t *B, int type,       \
                                     float *C, size_t ldc)                                           \
    {                                                                                                \
        if (mb == 1)                                                                                 \
            qk_blk(1, 8, b, ORD, N, K, alpha, ap, B, type, C, ldc, 1);                               \
        else if (mb == 2)                                                                            \
            qk_blk(2, 4, b, ORD, N, K, alpha, ap, B, type, C, ldc, 2);                               \
        else                                                                                         \
            qk_blk(4, 2, b, ORD, N, K, alpha, ap, B, type, C, ldc, mb);                              \
    }                                                                                                \
    static int group_fast_##path(int type, size_t cols)                                              \
    {                                                                                                \
        return gqa_group_cols(type) % 8 == 0 && cols % 32 == 0 && cols <= 1024;                      \
    }                                                                                                \
    static void group_qk_fast_##path(size_t M, size_t N, size_t K, float alpha, const float *A,      \
                                     size_t lda, const void *B, int type, float *C, size_t ldc)      \
    {                                                                                                \
        const unsigned b = gqa_group_bits(type);                                                     \
        const int ord = gqa_group_ordered8(type);                                                    \
        float buf[4 * 1024];                                                                         \
        for (size_t m0 = 0; m0 < M; m0 += 4) {                                                       \
            const size_t mb = M - m0 < 4 ? M - m0 : 4;                                               \
            for (size_t m = 0; m < 4; m++)                                                           \
                gqa_group_prep8(A + (m0 + (m < mb ? m : mb - 1)) * lda, buf + m * K, K, type);       \
            GQA_GROUP_VARIANT_CALL(group_qk_rows_##path, mb, N, K, alpha, buf, (const uint8_t *)B, type,  \
                                C + m0 * ldc, ldc);                                                  \
        }                                                                                            \
    }                                                                                                \
    static void group_sv_fast_##path(size_t M, size_t N, size_t K, const float *A, size_t lda,       \
                                     const void *B, int type, float *C, size_t ldc, float beta)      \
    {                                                                                                \
        const unsigned b = gqa_group_bits(type);                                                     \
        const int ord = gqa_group_ordered8(type);                                                    \
        const size_t rb = gqa_row_bytes(type, N), kp = gqa_group_pass_keys(rb);                      \
        const int blk = (int)gqa_group_block8(b, ord), per = ord ? (int)(8 / b) : 1;                 \
        float t[2 * 1024];                                                                           \
        for (size_t m0 = 0; m0 < M; m0 += 2) {                                                       \
            const size_t mb = M - m0 < 2 ? 1 : 2;                                                    \
            for (size_t k0 = 0; k0 == 0 || k0 < K; k0 += kp) {                                       \
                const size_t kn = K - k0 < kp ? K - k0 : kp;                                         \
                const float *a = A + m0 * lda + k0;                                                  \
                const uint8_t *bk = (const uint8_t *)B + k0 * rb;                                    \
                for (size_t c0 = 0; c0 < N; c0 += 32) {                                              \
                    if (mb == 2)                                                                     \
                        GQA_GROUP_VARIANT_CALL(sv_blk##_2, N, kn, a, lda, bk, type, t, 1024, k0 == 0, c0); \
                    else                                                                             \
                        GQA_GROUP_VARIANT_CALL(sv_blk##_1, N, kn, a, lda, bk, type, t, 1024, k0 == 0, c0); \
                }                                                                                    \
            }                                                                                        \
            for (size_t m = 0; m < mb; m++)                                                          \
                for (size_t c0 = 0; c0 < N; c0 += 32)                                                \
                    gqa_group_from_lookup_order(t + m * 1024 + c0, C + (m0 + m) * ldc + c0, 32 / blk, blk, \
                                                per, 8, beta);                                       \
        }                                                                                            \
    }

/* The five group operations of one path, given its decoder and float32 GEMMs. */
/* The group branch that opens a path's qk_gemm (op qk, args GQA_QK_ARGS) or sv_gemm (sv,
   GQA_SV_ARGS): the fused kernels where `fast` holds (the shapes they take), else the tile
   decoder of GQA_GROUP_OPS. */
#define GQA_QK_ARGS (M, N, K, alpha, A, lda, B, type, C, ldc)
#define GQA_SV_ARGS (M, N, K, A, lda, B, type, C, ldc, beta)
#define GQA_GROUP_ENTRY(path, op, fast, args)                                                   \
    if (GQA_IS_GROUP(type)) {                                                                   \
        if (fast)                                                                               \
            group_##op##_fast_##path args;                                                      \
        else                                                                                    \
            group_##op##_##path args;                                                           \
        return;                                                                                 \
    }

#define GQA_GROUP_OPS(path, decode)                                                                  \
    static void qk_gemm_##path(size_t M, size_t N, size_t K, float alpha, const float *A,           \
                               size_t lda, const void *B, int type, const float *s, float *C,      \
                               size_t ldc);                                                         \
    static void sv_gemm_##path(size_t M, size_t N, size_t K, const float *A, size_t lda,            \
                               const void *B, int type, const float *s, float *C, size_t ldc,      \
                               float beta);                                                         \
    static void group_dequantize_##path(const void *src, float *dst, size_t ldd, size_t rows,       \
                                        size_t cols, int type)                                      \
    { gqa_group_dequantize(src, dst, ldd, rows, cols, type, decode); }                              \
    static void group_dequantize_t_##path(const void *src, float *dst, size_t ldd, size_t rows,     \
                                          size_t cols, int type)                                    \
    { gqa_group_dequantize_t(src, dst, ldd, rows, cols, type, decode); }                            \
    static void group_qk_##path(size_t M, size_t N, size_t K, float alpha, const float *A,          \
                                size_t lda, const void *B, int type, float *C, size_t ldc)          \
    { gqa_group_qk(M, N, K, alpha, A, lda, B, type, C, ldc, decode, qk_gemm_##path); }                          \
    static void group_sv_##path(size_t M, size_t N, size_t K, const float *A, size_t lda,           \
                                const void *B, int type, float *C, size_t ldc, float beta)          \
    { gqa_group_sv(M, N, K, A, lda, B, type, C, ldc, beta, decode, sv_gemm_##path); }

#endif
