/*
 * kernels_avx512bf16.c -- bfloat16 tiles for the flash prompt tiles at accuracy level >= 3
 * (gqa_tiles in gqa_kernels.h) on AVX-512 BF16 dot products (vdpbf16ps): bfloat16 operands,
 * float32 products and sums.  Also the packing and the softmax exp that the AMX unit
 * (kernels_amx.c) shares.  ISA flags: the avx512 path's plus -mavx512bf16 (a unit of the
 * avx512 path); dispatch.c hands the table out only where CPUID has AVX512-BF16.
 *
 * Operand layouts (every buffer padded by the caller; padding is written as zeros):
 *   rows  A [rows_pad, cols_pad] uint16 bfloat16, row-major: the left operand of gemm.
 *   pairs B [rows_pad / 2, cols_pad] uint32, element (p, c) = bf16(src[2p][c]) in its low
 *         16 bits and bf16(src[2p + 1][c]) in its high 16 bits: two consecutive rows of the
 *         K dimension per 32-bit element (AMX's "VNNI" layout; a zmm of 16 pairs is the
 *         right operand of vdpbf16ps).
 *   pairs_t B [cols_pad / 2, rows_pad] uint32, element (p, r) = bf16(src[r][2p]) low,
 *         bf16(src[r][2p + 1]) high: the pairs of the transpose of src (K^T's pairs from K's
 *         rows); rows_pad a multiple of 16, cols_pad of 32.
 *   exp_pack  e_i = exp(x[i] - m) within 2^-16 relative (exp2_16; arguments below -86.6,
 *         -inf included, give 0, NaN stays NaN) for i < n, returning their float32 sum, the
 *         same values as a row of A (zeros past n, to n_pad), and in x where `store`.
 *   gemm  C[M, N] = (acc ? C : 0) + A[M, K] B[K, N] with A rows, B pairs; M and N multiples
 *         of 16, K a multiple of 32; C float32 with row stride ldc.
 * Rounding of rows / pairs: float32 -> bfloat16 by vcvtne2ps2bf16: to nearest, ties to even,
 * NaN kept (quiet), overflow to inf, subnormal inputs as zero.  vdpbf16ps takes subnormal
 * bfloat16 inputs as zero; each product of two bfloat16 values is exact in float32, and each
 * is added to its lane's accumulator with at most one rounding (to nearest even, subnormal
 * results flushed to zero): a C element is a float32 sum of its K exact products in order
 * of k, rounded at most K times.
 */
#include <stdint.h>
#include <string.h>
#include "kernels_avx512.h" /* <immintrin.h> */

/* Lanes [0, min(n, 16)) / [0, min(n, 32)): kernels_avx512.h's masks, clamped. */
static inline __mmask16 lanes(size_t n) { return mask16(n < 16 ? n : 16); }
static inline __mmask32 lanes32(size_t n) { return (__mmask32)mask64(n < 32 ? n : 32); }

/* 16 floats of src from column c (zeros past cols). */
static inline __m512 cols16(const float *src, size_t c, size_t cols)
{
    return _mm512_maskz_loadu_ps(c < cols ? lanes(cols - c) : 0, src + c);
}

void gqa_pack_rows_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                              size_t rows_pad, size_t cols_pad, uint16_t *dst)
{
    for (size_t r = 0; r < rows_pad; r++) {
        uint16_t *d = dst + r * cols_pad;
        if (r >= rows) {
            memset(d, 0, cols_pad * sizeof(uint16_t));
            continue;
        }
        const float *s = src + r * lds;
        for (size_t c = 0; c < cols_pad; c += 32) {
            /* vcvtne2ps2bf16: the second operand's 16 values become the low 16 words */
            const __m512bh b = _mm512_cvtne2ps_pbh(cols16(s, c + 16, cols), cols16(s, c, cols));
            _mm512_mask_storeu_epi16(d + c, lanes32(cols_pad - c), (__m512i)b);
        }
    }
}

void gqa_pack_pairs_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                               size_t rows_pad, size_t cols_pad, uint32_t *dst)
{
    /* words 0..15 of cvtne2ps(row 2p+1, row 2p) hold row 2p, words 16..31 row 2p + 1:
       interleave them into (2p, 2p+1) pairs per column */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (size_t p = 0; 2 * p < rows_pad; p++) {
        uint32_t *d = dst + p * cols_pad;
        const size_t r = 2 * p;
        if (r >= rows) {
            memset(d, 0, cols_pad * sizeof(uint32_t));
            continue;
        }
        const float *s0 = src + r * lds;
        const float *s1 = s0 + lds;
        const int two = r + 1 < rows;
        for (size_t c = 0; c < cols_pad; c += 16) {
            const __m512 hi = two ? cols16(s1, c, cols) : _mm512_setzero_ps();
            const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(hi, cols16(s0, c, cols));
            _mm512_mask_storeu_epi32(d + c, lanes(cols_pad - c), _mm512_permutexvar_epi16(pairs, b));
        }
    }
}

void gqa_pack_pairs_t_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                                 size_t rows_pad, size_t cols_pad, uint32_t *dst)
{
    /* per 16 rows x 32 columns: each row's 32 bfloat16 in column order are 16 pairs (one
       zmm); the 16 x 16 transpose makes zmm p the pair p of the 16 rows */
    for (size_t r0 = 0; r0 < rows_pad; r0 += 16)
        for (size_t c = 0; c < cols_pad; c += 32) {
            __m512 v[16];
            UNROLL
            for (int i = 0; i < 16; i++) {
                const size_t r = r0 + i;
                const float *s = src + r * lds;
                v[i] = r < rows ? (__m512)_mm512_cvtne2ps_pbh(cols16(s, c + 16, cols), cols16(s, c, cols))
                                : _mm512_setzero_ps();
            }
            transpose16(v);
            UNROLL
            for (int e = 0; e < 16; e++)
                _mm512_storeu_ps((float *)(void *)(dst + (c / 2 + e) * rows_pad + r0), v[e]);
        }
}

/* exp(x - m) = 2^t, t = (x - m) log2(e): 2^f, f = t - rint(t) in [-1/2, 1/2], by a degree-4
   polynomial (relative error 2.7e-6, fitted to 2^f), times 2^rint(t) by vscalefps.  t's
   roundings (x - m, then the product) move the result by at most |x - m| 2^-24 relative, so
   below 2^-16 in all.  t < -125 (x - m < -86.6, -inf included) gives exactly 0, so no result
   is subnormal (each would cost a microcode assist: masked keys are -inf); NaN stays NaN
   (the compare is unordered-true and vmaxps returns its second operand, t, when it is NaN). */
static inline __m512 exp2_16(__m512 x, __m512 m)
{
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, m), _mm512_set1_ps(1.44269504088896341f));
    const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    t = _mm512_max_ps(_mm512_set1_ps(-125.0f), t);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(0.009569965302944183f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05591750890016556f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240247443318367f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931218504905701f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999992847442627f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* exp_pack's whole vectors, with `store` a constant in each inlined copy (the store of e to
   x is a fifth of the loop's time) */
static inline size_t exp_pack_vectors(float *x, size_t n, __m512 vm, uint16_t *dst, __m512 *acc,
                                      const int store)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp2_16(_mm512_loadu_ps(x + i), vm);
        if (store)
            _mm512_storeu_ps(x + i, e);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), (__m256i)_mm512_cvtneps_pbh(e));
        *acc = _mm512_add_ps(*acc, e);
    }
    return i;
}

float gqa_exp_pack_avx512bf16(float *x, size_t n, size_t n_pad, float m, uint16_t *dst, int store)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    size_t i = store ? exp_pack_vectors(x, n, vm, dst, &acc, 1)
                     : exp_pack_vectors(x, n, vm, dst, &acc, 0);
    if (i < n) {
        const __mmask16 k = lanes(n - i);
        const __m512 e = _mm512_maskz_mov_ps(k, exp2_16(_mm512_maskz_loadu_ps(k, x + i), vm));
        if (store)
            _mm512_mask_storeu_ps(x + i, k, e);
        _mm256_mask_storeu_epi16(dst + i, lanes(n_pad - i), (__m256i)_mm512_cvtneps_pbh(e));
        acc = _mm512_add_ps(acc, e);
        i += 16;
    }
    if (i < n_pad)
        memset(dst + i, 0, (n_pad - i) * sizeof(uint16_t));
    return _mm512_reduce_add_ps(acc);
}


/* Register block of C: MR rows x NR vectors of 16 columns, accumulated in zmm over all of K.
   Per pair p of K: NR loads of B (16 pairs each), MR broadcasts of A's pair (p) of a row. */
#define MR 8
static inline void block_bf16(size_t K, const uint16_t *A, size_t lda, const uint32_t *B,
                              size_t ldb, float *C, size_t ldc, int acc, const int NR)
{
    __m512 c[MR][2];
    UNROLL
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++)
            c[r][j] = acc ? _mm512_loadu_ps(C + r * ldc + 16 * j) : _mm512_setzero_ps();
    for (size_t p = 0; 2 * p < K; p++) {
        __m512bh b[2];
        for (int j = 0; j < NR; j++)
            b[j] = (__m512bh)_mm512_loadu_si512((const void *)(B + p * ldb + 16 * j));
        UNROLL
        for (int r = 0; r < MR; r++) {
            uint32_t a2;
            memcpy(&a2, A + r * lda + 2 * p, sizeof a2);
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)a2);
            for (int j = 0; j < NR; j++)
                c[r][j] = _mm512_dpbf16_ps(c[r][j], a, b[j]);
        }
    }
    UNROLL
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++)
            _mm512_storeu_ps(C + r * ldc + 16 * j, c[r][j]);
}

/* Column panels of 32 (a 16-column tail): the panel of B (K/2 x 32 pairs, 16 KB at K = 256)
   stays in L1 while the blocks of 8 rows of A pass over it. */
static void gemm_avx512bf16(size_t M, size_t N, size_t K, const uint16_t *A, size_t lda,
                            const uint32_t *B, size_t ldb, float *C, size_t ldc, int acc)
{
    size_t n = 0;
    for (; n + 32 <= N; n += 32)
        for (size_t m = 0; m < M; m += MR)
            block_bf16(K, A + m * lda, lda, B + n, ldb, C + m * ldc + n, ldc, acc, 2);
    if (n < N)
        for (size_t m = 0; m < M; m += MR)
            block_bf16(K, A + m * lda, lda, B + n, ldb, C + m * ldc + n, ldc, acc, 1);
}

/* kernels_avx512bf16_dot.c: levels 3-4's decode kernels of float rows */
void gqa_qk_gemm_f_avx512bf16(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                              const void *B, int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_f_avx512bf16(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                              int type, const float *s, float *C, size_t ldc, float beta);

static int permit_none(void) { return 1; } /* no state to grant, load or release */
static void nothing(void) {}

const gqa_tiles gqa_tiles_avx512bf16 = {"avx512bf16",
                                        GQA_CPU_AVX512BF16,
                                        512, /* Zen 4, S = 2048 / 8192: 7-11 % faster than 256 */
                                        1,   /* Zen 4, S = 2-8 at T = 8192: within level 3's limit the
                                                decode kernels up to 3.8x faster (_plan.step_rows) */
                                        permit_none,
                                        nothing,
                                        nothing,
                                        gqa_pack_rows_avx512bf16,
                                        gqa_pack_pairs_avx512bf16,
                                        gqa_pack_pairs_t_avx512bf16,
                                        gqa_exp_pack_avx512bf16,
                                        gemm_avx512bf16,
                                        NULL, /* level 4's integer dots: the VNNI unit's */
                                        NULL,
                                        gqa_qk_gemm_f_avx512bf16, /* kernels_avx512bf16_dot.c */
                                        gqa_sv_gemm_f_avx512bf16};
