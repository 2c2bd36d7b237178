/*
 * kernels_s8dot.h -- what the AVX-512 units implementing accuracy level 4's integer-dot
 * contracts (kernels_s8dot_contract.h) share: the quantization of query rows and probability
 * rows to 15-bit codes and the float finish of P @ V.  Included by kernels_avx512vnni.c
 * (vpdpwssd, vpdpbusd) and kernels_amxint8.c (AMX INT8 tiles), both compiled with the avx512 path's
 * flags; the two give the same results bit for bit.
 */
#ifndef GQA_KERNELS_S8DOT_H
#define GQA_KERNELS_S8DOT_H

#include "kernels_avx512.h"
#include "kernels_s8dot_contract.h"

/* The avx512 path's table (kernels_avx512.c): its exact kernels take what the contracts leave
   to them, and its VNNI entries (NULL without the VNNI unit) the AMX unit's calls of fewer than
   AMX_MIN_ROWS rows. */
extern const gqa_kernels gqa_kernels_avx512;

/* Row a's codes into c (int16, padded with 0 to cs, a multiple of 16) and its multiplier;
   0 when the row takes the exact kernel (qk_gemm_s8_dot's contract). */
static inline int dot_row(const float *a, size_t K, const float *s, int pc, float alpha, int16_t *c,
                          size_t cs, float *mult)
{
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (size_t k = 0; k < K; k += 16) {
        const __mmask16 m = mask16(K - k < 16 ? K - k : 16);
        __m512 v = _mm512_maskz_loadu_ps(m, a + k);
        if (pc)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, s + k));
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    const float amax = _mm512_reduce_max_ps(mx);
    if (bad || !(amax <= FLT_MAX) || amax == 0.0f || !(QK_CODE_MAX / amax <= FLT_MAX))
        return 0;
    const float inv = QK_CODE_MAX / amax, sa = amax / QK_CODE_MAX;
    const __m512 vinv = _mm512_set1_ps(inv), lim = _mm512_set1_ps(QK_CODE_MAX);
    for (size_t k = 0; k < cs; k += 16) {
        const __mmask16 m = mask16(K > k ? (K - k < 16 ? K - k : 16) : 0);
        __m512 v = _mm512_maskz_loadu_ps(m, a + k);
        if (pc)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, s + k));
        v = _mm512_roundscale_ps(_mm512_mul_round_ps(v, vinv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_max_ps(_mm512_min_ps(v, lim), _mm512_sub_ps(_mm512_setzero_ps(), lim));
        _mm256_store_si256((__m256i *)(c + k), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(v)));
    }
    *mult = pc ? alpha * sa : (alpha * sa) * s[0];
    return 1;
}

/* From row *m0 of A on, up to max rows the contract covers: their indices into rows, codes into
   c + i * cs and multipliers into mult; each row it does not cover is computed by the exact
   qk_gemm on the spot.  *m0 moves past the last row looked at; returns the count. */
static inline int qk_take_rows(size_t M, size_t *m0, int max, size_t N, size_t K, float alpha, const float *A,
                               size_t lda, const void *B, int type, const float *s, float *C, size_t ldc,
                               int16_t *c, size_t cs, size_t *rows, float *mult)
{
    const int pc = GQA_IS_PC(type);
    int mb = 0;
    for (; *m0 < M && mb < max; ++*m0) {
        const size_t m = *m0;
        if (dot_row(A + m * lda, K, s, pc, alpha, c + mb * cs, cs, &mult[mb]))
            rows[mb++] = m;
        else
            gqa_kernels_avx512.qk_gemm(1, N, K, alpha, A + m * lda, lda, B, type, s, C + m * ldc, ldc);
    }
    return mb;
}

/* inv and sp of a probability row; 0 when the row takes the exact kernel (sv_gemm_s8_dot's
   contract). */
static inline int sv_row_params(const float *a, size_t K, float *inv, float *sp)
{
    __m512 mx, m4[4];
    __mmask16 bad, b4[4] = {0, 0, 0, 0};
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    size_t k = 0;
    /* four chains over whole blocks of 64 (max and or are exact in any order; one chain was
       bound by vmaxps' latency), then the rest */
    UNROLL
    for (int j = 0; j < 4; j++)
        m4[j] = _mm512_setzero_ps();
    for (; k + 64 <= K; k += 64) {
        UNROLL
        for (int j = 0; j < 4; j++) {
            const __m512 v = _mm512_loadu_ps(a + k + 16 * j);
            b4[j] |= _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NGE_UQ) | _mm512_cmp_ps_mask(v, big, _CMP_NLE_UQ);
            m4[j] = _mm512_max_ps(m4[j], v);
        }
    }
    mx = _mm512_max_ps(_mm512_max_ps(m4[0], m4[1]), _mm512_max_ps(m4[2], m4[3]));
    bad = (__mmask16)(b4[0] | b4[1] | b4[2] | b4[3]);
    for (; k < K; k += 16) {
        const __mmask16 m = mask16(K - k < 16 ? K - k : 16);
        __m512 v = _mm512_maskz_loadu_ps(m, a + k);
        /* not (0 <= v <= FLT_MAX): negative, NaN or infinite (lanes past the row: 0) */
        bad |= _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NGE_UQ) |
               _mm512_cmp_ps_mask(v, big, _CMP_NLE_UQ);
        mx = _mm512_max_ps(mx, v);
    }
    const float pmax = _mm512_reduce_max_ps(mx);
    if (bad || pmax == 0.0f)
        return 0;
    *inv = SV_CODE_MAX / pmax;
    *sp = pmax / SV_CODE_MAX;
    return *inv <= FLT_MAX;
}

/* sv_gemm_s8_dot's twin of qk_take_rows: up to max covered rows from *m0 on, with their inv
   and sp; each other row is computed by the exact sv_gemm on the spot. */
static inline int sv_take_rows(size_t M, size_t *m0, int max, size_t N, size_t K, const float *A, size_t lda,
                               const void *B, int type, const float *s, float *C, size_t ldc, float beta,
                               size_t *rows, float *inv, float *sp)
{
    int mb = 0;
    for (; *m0 < M && mb < max; ++*m0) {
        const size_t m = *m0;
        if (sv_row_params(A + m * lda, K, &inv[mb], &sp[mb]))
            rows[mb++] = m;
        else
            gqa_kernels_avx512.sv_gemm(1, N, K, A + m * lda, lda, B, type, s, C + m * ldc, ldc, beta);
    }
    return mb;
}

/* The codes of 16 probabilities x of a row with multiplier inv, as int32: min(32767,
   rint(fl(x inv))) (half to even), in [0, 32767] for the rows the contract covers; x = 0 gives 0. */
static inline __m512i sv_code16(__m512 x, __m512 vinv)
{
    const __m512 t = _mm512_mul_round_ps(x, vinv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                            _mm512_set1_ps(SV_CODE_MAX)));
}

/* int16 codes of a[k0, k1) into c[0, kp), kp = k1 - k0 rounded up to 16, padded with 0. */
static inline void sv_codes(const float *a, size_t k0, size_t k1, float inv, int16_t *c)
{
    const size_t n = k1 - k0;
    const __m512 vinv = _mm512_set1_ps(inv);
    for (size_t k = 0; k < n; k += 16) {
        const __mmask16 m = mask16(n - k < 16 ? n - k : 16);
        /* lanes past the row are 0 */
        _mm256_storeu_si256((__m256i *)(c + k),
                            _mm512_cvtsepi32_epi16(sv_code16(_mm512_maskz_loadu_ps(m, a + k0 + k), vinv)));
    }
}

/* One chunk's sums d[j] (columns n0 + 16 j .., j < 4, w <= 64 columns) into row crow of C:
   crow[n] = (first ? (beta == 0 ? 0 : fl(beta * crow[n])) : crow[n]) + fl(float(d) * mult[n]). */
static inline void sv_finish(const __m512i d[4], size_t w, size_t n0, float *crow, int pc, const float *s,
                             float sp, float beta, int first)
{
    const __m512 spv = _mm512_set1_ps(sp);
    for (size_t j = 0; 16 * j < w; j++) {
        const __mmask16 m = mask16(w - 16 * j < 16 ? w - 16 * j : 16);
        const __m512 sc = pc ? _mm512_maskz_loadu_ps(m, s + n0 + 16 * j) : _mm512_set1_ps(s[0]);
        const __m512 mult = _mm512_mul_ps(spv, sc);
        __m512 base = _mm512_maskz_loadu_ps(m, crow + 16 * j);
        if (first)
            base = beta == 0.0f ? _mm512_setzero_ps() : _mm512_mul_ps(_mm512_set1_ps(beta), base);
        _mm512_mask_storeu_ps(crow + 16 * j, m, _mm512_add_ps(base, _mm512_mul_ps(_mm512_cvtepi32_ps(d[j]), mult)));
    }
}

#endif
