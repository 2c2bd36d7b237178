/*
 * kernels_avx2.c -- path `avx2`.  ISA flags: -mavx2 -mfma -mf16c.
 *
 * Same operations and layouts as gqa_kernels.h, 8 float32 lanes at a time:
 *  - quantize: x * (1/s), round-to-nearest-even (vroundps), clamp with
 *    min/max ordered so that NaN -> hi; identical codes to the scalar path.
 *  - qk_gemm: register blocks of MB rows of A x NB rows of B (MB * NB <= 8
 *    accumulators).  Each B row chunk of 8 elements is converted to float once
 *    and used for all MB rows, which is what makes GQA decode (M = group size)
 *    cheap.  Per-tensor INT8/INT4 defer the scale: alpha * s * sum(a * q).
 *    Every accumulator is reduced by the same fixed tree, and the K tail is
 *    added in order afterwards, so C[m,n] does not depend on M, N or blocking.
 *  - sv_gemm: blocks of MB rows of C x NV*8 columns, keys in chunks of ~16 KiB
 *    of B so the chunk stays in L1 while every column block reads it.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include "kernels_common.h"

#define INLINE static inline __attribute__((always_inline))
/* Unroll the loops over a register block before register allocation, so the
   accumulator arrays below live in registers. */
#define UNROLL _Pragma("GCC unroll 32")

/* ---- quantize / dequantize --------------------------------------------- */

INLINE __m256i quant8_epi32(__m256 x, __m256 inv, __m256 lo, __m256 hi)
{
    __m256 q = _mm256_round_ps(_mm256_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(q, hi); /* vminps returns the 2nd operand for NaN -> hi */
    q = _mm256_max_ps(q, lo);
    return _mm256_cvtps_epi32(q);
}

INLINE __m256 inv_scale8(const float *s)
{
    __m256 v = _mm256_loadu_ps(s);
    __m256 zero = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ);
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), v);
    return _mm256_blendv_ps(inv, _mm256_set1_ps(1.0f), zero);
}

static void quantize_avx2(const float *src, size_t lda, void *dst, size_t rows,
                          size_t cols, int type, const float *s)
{
    size_t rb = gqa_row_bytes(type, cols);
    if (!GQA_IS_QUANT(type)) {
        for (size_t r = 0; r < rows; r++) {
            const float *x = src + r * lda;
            uint8_t *d = (uint8_t *)dst + r * rb;
            size_t c = 0;
            if (type == GQA_F16)
                for (; c + 8 <= cols; c += 8)
                    _mm_storeu_si128((__m128i *)(d + 2 * c),
                                     _mm256_cvtps_ph(_mm256_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT));
            gqa_quantize_row_ref(x, d, c, cols, type, s);
        }
        return;
    }
    const int s4 = GQA_IS_S4(type), pc = GQA_IS_PC(type);
    const __m256 lo = _mm256_set1_ps(s4 ? -8.0f : -128.0f), hi = _mm256_set1_ps(s4 ? 7.0f : 127.0f);
    const __m256 inv_pt = _mm256_set1_ps(gqa_inv_scale(s[0]));
    const __m128i shuf_lo = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (size_t r = 0; r < rows; r++) {
        const float *x = src + r * lda;
        uint8_t *d = (uint8_t *)dst + r * rb;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256i q = quant8_epi32(_mm256_loadu_ps(x + c), pc ? inv_scale8(s + c) : inv_pt, lo, hi);
            __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            if (!s4) {
                _mm_storel_epi64((__m128i *)(d + c), _mm_packs_epi16(q16, q16));
            } else {
                /* nibble n = q + 8; byte i = n[2i] | n[2i+1] << 4 */
                __m128i n = _mm_add_epi16(q16, _mm_set1_epi16(8));
                __m128i even = _mm_and_si128(n, _mm_set1_epi32(0xFFFF));
                __m128i odd = _mm_srli_epi32(n, 16);
                __m128i b = _mm_or_si128(even, _mm_slli_epi32(odd, 4)); /* 4 x u32 */
                b = _mm_shuffle_epi8(b, shuf_lo);
                uint32_t w = (uint32_t)_mm_cvtsi128_si32(b);
                memcpy(d + c / 2, &w, 4);
            }
        }
        gqa_quantize_row_ref(x, d, c, cols, type, s);
    }
}

/* 8 consecutive elements starting at element k (k % 8 == 0) as float32,
   scaled for per-channel types, unscaled (codes) for per-tensor types. */
INLINE __m256 load8(const uint8_t *row, size_t k, int type, const float *s)
{
    switch (type) {
    case GQA_S8_PT:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k))));
    case GQA_S8_PC:
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k)))),
                             _mm256_loadu_ps(s + k));
    case GQA_S4_PT:
    case GQA_S4_PC: {
        uint32_t w;
        memcpy(&w, row + k / 2, 4);
        __m128i v = _mm_cvtsi32_si128((int)w);
        __m128i m = _mm_set1_epi8(0x0F);
        __m128i e = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
        __m256 f = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(e), _mm256_set1_epi32(8)));
        return type == GQA_S4_PT ? f : _mm256_mul_ps(f, _mm256_loadu_ps(s + k));
    }
    case GQA_F32:
        return _mm256_loadu_ps((const float *)(const void *)row + k);
    default:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    }
}

/* Scale applied after accumulation: per-tensor codes carry s, others 1. */
static inline float post_scale(int type, const float *s)
{
    return (type == GQA_S8_PT || type == GQA_S4_PT) ? s[0] : 1.0f;
}

/* Element k decoded without the per-tensor scale (matches load8). */
static inline float decode_unscaled(const uint8_t *row, size_t k, int type, const float *s)
{
    static const float one = 1.0f;
    return (type == GQA_S8_PT || type == GQA_S4_PT) ? gqa_decode(row, k, type, &one)
                                                    : gqa_decode(row, k, type, s);
}

static void dequantize_avx2(const void *src, float *dst, size_t ldd, size_t rows,
                            size_t cols, int type, const float *s)
{
    size_t rb = gqa_row_bytes(type, cols);
    const float ps = post_scale(type, s);
    const __m256 vps = _mm256_set1_ps(ps);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * rb;
        float *d = dst + r * ldd;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8)
            _mm256_storeu_ps(d + c, _mm256_mul_ps(load8(row, c, type, s), vps));
        for (; c < cols; c++)
            d[c] = gqa_decode(row, c, type, s);
    }
}

/* 8x8 transpose of r[0..7] in place. */
INLINE void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Transposed dequantize in 8 x 8 register blocks (rows r..r+7, columns c..c+7);
   the ragged edges element by element. */
static void dequantize_t_avx2(const void *src, float *dst, size_t ldd, size_t rows,
                              size_t cols, int type, const float *s)
{
    const size_t rb = gqa_row_bytes(type, cols);
    const __m256 vps = _mm256_set1_ps(post_scale(type, s));
    const uint8_t *B = (const uint8_t *)src;
    const size_t rfull = rows & ~(size_t)7, cfull = cols & ~(size_t)7;
    /* column blocks outer: each pass fills 8 destination rows front to back */
    for (size_t c = 0; c < cfull; c += 8) {
        for (size_t r = 0; r < rfull; r += 8) {
            __m256 v[8];
            UNROLL
            for (int i = 0; i < 8; i++)
                v[i] = _mm256_mul_ps(load8(B + (r + i) * rb, c, type, s), vps);
            transpose8(v);
            UNROLL
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(dst + (c + i) * ldd + r, v[i]);
        }
    }
    for (size_t r = 0; r < rfull; r++)
        for (size_t c = cfull; c < cols; c++)
            dst[c * ldd + r] = gqa_decode(B + r * rb, c, type, s);
    for (size_t r = rfull; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            dst[c * ldd + r] = gqa_decode(B + r * rb, c, type, s);
}

/* ---- qk_gemm ------------------------------------------------------------ */

/* Lane i of the result = horizontal sum of v[i], always by the same tree. */
INLINE __m256 hsum8x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5,
                      __m256 v6, __m256 v7)
{
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* Rows n0 .. n1-1 of B (n1 - n0 a multiple of NB) against MB rows of A, NB rows at
   a time.  The loop over B rows lives here, not in the caller, so one block's
   reduction overlaps the next block's loads. */
INLINE void qk_block(const int MB, const int NB, size_t n0, size_t n1, size_t K, float mult,
                     const float *A, size_t lda, const uint8_t *B, size_t rb, const int type,
                     const float *s, float *C, size_t ldc)
{
    const size_t kfull = K & ~(size_t)7;
    for (size_t n = n0; n < n1; n += NB) {
        const uint8_t *Bn = B + n * rb;
        __m256 acc[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_setzero_ps();
        for (size_t k = 0; k < kfull; k += 8) {
            __m256 a[8];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = _mm256_loadu_ps(A + mb * lda + k);
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                __m256 b = load8(Bn + nb * rb, k, type, s);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm256_fmadd_ps(a[mb], b, acc[mb * NB + nb]);
            }
        }
        float out[8];
        _mm256_storeu_ps(out, hsum8x8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
        UNROLL
        for (int mb = 0; mb < MB; mb++)
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                float v = out[mb * NB + nb];
                for (size_t kk = kfull; kk < K; kk++)
                    v += A[mb * lda + kk] * decode_unscaled(Bn + nb * rb, kk, type, s);
                C[mb * ldc + n + nb] = v * mult;
            }
    }
}

/* One function per (element type, MB, NB): the type is a compile-time constant
   inside each, so load8's switch disappears from the inner loop. */
#define QK_INST(T, MB, NB)                                                                        \
    static void qk_##T##_##MB##x##NB(size_t n0, size_t n1, size_t K, float mult, const float *A,  \
                                     size_t lda, const uint8_t *B, size_t rb, const float *s,     \
                                     float *C, size_t ldc)                                        \
    {                                                                                             \
        qk_block(MB, NB, n0, n1, K, mult, A, lda, B, rb, T, s, C, ldc);                           \
    }
#define QK_TYPE(T)                                                                                \
    QK_INST(T, 1, 8) QK_INST(T, 1, 1) QK_INST(T, 2, 4) QK_INST(T, 2, 1) QK_INST(T, 3, 2)          \
    QK_INST(T, 3, 1) QK_INST(T, 4, 2) QK_INST(T, 4, 1) QK_INST(T, 5, 1) QK_INST(T, 6, 1)          \
    QK_INST(T, 7, 1) QK_INST(T, 8, 1)                                                             \
    static const qk_fn qk_wide_##T[9] = {0, qk_##T##_1x8, qk_##T##_2x4, qk_##T##_3x2,            \
        qk_##T##_4x2, qk_##T##_5x1, qk_##T##_6x1, qk_##T##_7x1, qk_##T##_8x1};                    \
    static const qk_fn qk_narrow_##T[9] = {0, qk_##T##_1x1, qk_##T##_2x1, qk_##T##_3x1,          \
        qk_##T##_4x1, qk_##T##_5x1, qk_##T##_6x1, qk_##T##_7x1, qk_##T##_8x1};

typedef void (*qk_fn)(size_t, size_t, size_t, float, const float *, size_t, const uint8_t *, size_t,
                      const float *, float *, size_t);
QK_TYPE(0) QK_TYPE(1) QK_TYPE(2) QK_TYPE(3) QK_TYPE(4) QK_TYPE(5)
static const qk_fn *const qk_wide[6] = {qk_wide_0, qk_wide_1, qk_wide_2, qk_wide_3, qk_wide_4, qk_wide_5};
static const qk_fn *const qk_narrow[6] = {qk_narrow_0, qk_narrow_1, qk_narrow_2, qk_narrow_3,
                                          qk_narrow_4, qk_narrow_5};

static void qk_gemm_avx2(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                         const void *B, int type, const float *s, float *C, size_t ldc)
{
    static const int nbs[9] = {0, 8, 4, 2, 2, 1, 1, 1, 1};
    const qk_fn *wide = qk_wide[type], *narrow = qk_narrow[type];
    const size_t rb = gqa_row_bytes(type, K);
    const float mult = alpha * post_scale(type, s);
    const uint8_t *Bb = (const uint8_t *)B;
    for (size_t m0 = 0; m0 < M; m0 += 8) {
        int mb = (int)(M - m0 < 8 ? M - m0 : 8);
        const float *a = A + m0 * lda;
        float *c = C + m0 * ldc;
        size_t nw = N - N % (size_t)nbs[mb];
        wide[mb](0, nw, K, mult, a, lda, Bb, rb, s, c, ldc);
        narrow[mb](nw, N, K, mult, a, lda, Bb, rb, s, c, ldc);
    }
}

/* ---- sv_gemm ------------------------------------------------------------ */

INLINE void sv_block(const int MB, const int NV, size_t k0, size_t k1, const float *A, size_t lda,
                     const uint8_t *B, size_t rb, size_t n0, const int type, const float *s, float mult,
                     float *C, size_t ldc)
{
    __m256 acc[12];
    UNROLL
    for (int i = 0; i < MB * NV; i++)
        acc[i] = _mm256_setzero_ps();
    for (size_t k = k0; k < k1; k++) {
        const uint8_t *row = B + k * rb;
        __m256 b[4];
        UNROLL
        for (int v = 0; v < NV; v++)
            b[v] = load8(row, n0 + 8 * v, type, s);
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            __m256 a = _mm256_broadcast_ss(A + mb * lda + k);
            UNROLL
            for (int v = 0; v < NV; v++)
                acc[mb * NV + v] = _mm256_fmadd_ps(a, b[v], acc[mb * NV + v]);
        }
    }
    const __m256 vm = _mm256_set1_ps(mult);
    UNROLL
    for (int mb = 0; mb < MB; mb++)
        UNROLL
        for (int v = 0; v < NV; v++) {
            float *c = C + mb * ldc + n0 + 8 * v;
            _mm256_storeu_ps(c, _mm256_fmadd_ps(acc[mb * NV + v], vm, _mm256_loadu_ps(c)));
        }
}

#define SV_INST(T, MB, NV)                                                                        \
    static void sv_##T##_##MB##x##NV(size_t k0, size_t k1, const float *A, size_t lda,            \
                                     const uint8_t *B, size_t rb, size_t n0, const float *s,      \
                                     float mult, float *C, size_t ldc)                            \
    {                                                                                             \
        sv_block(MB, NV, k0, k1, A, lda, B, rb, n0, T, s, mult, C, ldc);                          \
    }
#define SV_TYPE(T)                                                                                \
    SV_INST(T, 1, 4) SV_INST(T, 1, 1) SV_INST(T, 2, 4) SV_INST(T, 2, 1) SV_INST(T, 3, 3)          \
    SV_INST(T, 3, 1) SV_INST(T, 4, 3) SV_INST(T, 4, 1) SV_INST(T, 5, 2) SV_INST(T, 5, 1)          \
    SV_INST(T, 6, 2) SV_INST(T, 6, 1)                                                             \
    static const sv_fn sv_wide_##T[7] = {0, sv_##T##_1x4, sv_##T##_2x4, sv_##T##_3x3,            \
        sv_##T##_4x3, sv_##T##_5x2, sv_##T##_6x2};                                                \
    static const sv_fn sv_narrow_##T[7] = {0, sv_##T##_1x1, sv_##T##_2x1, sv_##T##_3x1,          \
        sv_##T##_4x1, sv_##T##_5x1, sv_##T##_6x1};

typedef void (*sv_fn)(size_t, size_t, const float *, size_t, const uint8_t *, size_t, size_t,
                      const float *, float, float *, size_t);
SV_TYPE(0) SV_TYPE(1) SV_TYPE(2) SV_TYPE(3) SV_TYPE(4) SV_TYPE(5)
static const sv_fn *const sv_wide[6] = {sv_wide_0, sv_wide_1, sv_wide_2, sv_wide_3, sv_wide_4, sv_wide_5};
static const sv_fn *const sv_narrow[6] = {sv_narrow_0, sv_narrow_1, sv_narrow_2, sv_narrow_3,
                                          sv_narrow_4, sv_narrow_5};

static void sv_gemm_avx2(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                         int type, const float *s, float *C, size_t ldc, float beta)
{
    static const int nvs[7] = {0, 4, 4, 3, 3, 2, 2};
    const sv_fn *wide = sv_wide[type], *narrow = sv_narrow[type];
    const size_t rb = gqa_row_bytes(type, N);
    const uint8_t *Bb = (const uint8_t *)B;
    const float mult = post_scale(type, s);
    for (size_t m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (beta == 0.0f)
            memset(c, 0, N * sizeof(float));
        else if (beta != 1.0f)
            for (size_t n = 0; n < N; n++)
                c[n] *= beta;
    }
    /* Codes: chunks of 128 keys (16 KiB of INT8 rows at H = 128) stay in L1 while every
       column block reads them; float rows (flash tiles, already cache-resident): one pass.
       The chunk depends on the type only, so C[m, n] does not depend on N. */
    const size_t kc = GQA_IS_QUANT(type) ? 128 : (K ? K : 1);
    const size_t nfull = N & ~(size_t)7;
    for (size_t k0 = 0; k0 < K; k0 += kc) {
        size_t k1 = K - k0 < kc ? K : k0 + kc;
        for (size_t m0 = 0; m0 < M; m0 += 6) {
            int mb = (int)(M - m0 < 6 ? M - m0 : 6);
            const float *a = A + m0 * lda;
            float *c = C + m0 * ldc;
            size_t n = 0, step = 8 * (size_t)nvs[mb];
            for (; n + step <= nfull; n += step)
                wide[mb](k0, k1, a, lda, Bb, rb, n, s, mult, c, ldc);
            for (; n < nfull; n += 8)
                narrow[mb](k0, k1, a, lda, Bb, rb, n, s, mult, c, ldc);
        }
        for (size_t n = nfull; n < N; n++)
            for (size_t m = 0; m < M; m++) {
                float v = 0.0f;
                for (size_t k = k0; k < k1; k++)
                    v += A[m * lda + k] * gqa_decode(Bb + k * rb, n, type, s);
                C[m * ldc + n] += v;
            }
    }
}

/* ---- exp_sum ------------------------------------------------------------ */

/* exp(d) for d >= GQA_EXP_MIN: d = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6
   polynomial (Cephes expf coefficients, ~1 ulp), times 2^n built in the exponent. */
INLINE __m256 exp8(__m256 d)
{
    const __m256 zero_below = _mm256_cmp_ps(d, _mm256_set1_ps(GQA_EXP_MIN), _CMP_LT_OQ);
    d = _mm256_max_ps(_mm256_set1_ps(GQA_EXP_MIN), d); /* operand order keeps NaN */
    d = _mm256_min_ps(_mm256_set1_ps(88.3f), d);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(d, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), d);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero_below, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static float exp_sum_avx2(float *x, size_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        float buf[8];
        size_t rem = n - i;
        for (size_t k = 0; k < 8; k++)
            buf[k] = k < rem ? x[i + k] - m : -INFINITY;
        __m256 e = exp8(_mm256_loadu_ps(buf));
        _mm256_storeu_ps(buf, e);
        acc = _mm256_add_ps(acc, e);
        for (size_t k = 0; k < rem; k++)
            x[i + k] = buf[k];
    }
    float out[8];
    _mm256_storeu_ps(out, acc);
    return ((out[0] + out[1]) + (out[2] + out[3])) + ((out[4] + out[5]) + (out[6] + out[7]));
}

const gqa_kernels gqa_kernels_avx2 = {
    "avx2",
    quantize_avx2,
    dequantize_avx2,
    dequantize_t_avx2,
    qk_gemm_avx2,
    sv_gemm_avx2,
    NULL,
    exp_sum_avx2,
};
#endif
