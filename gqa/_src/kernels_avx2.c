/*
 * kernels_avx2.c -- path `avx2`.  ISA flags: -mavx2 -mfma -mf16c.
 *
 * Same operations and layouts as gqa_kernels.h, 8 float32 lanes at a time:
 *  - quantize: x * (1/s), round-to-nearest-even (vroundps), clamp with
 *    min/max ordered so that NaN -> hi; identical codes to the scalar path.
 *  - dequantize(_t): code * s, one rounding, bit-identical to the scalar path;
 *    the transpose in 8 x 8 register blocks, column blocks outer.
 *  - GEMMs read B as unscaled codes.  Per-tensor scales multiply the finished
 *    dot product (alpha * s * sum(a * q)); per-channel scales are folded into A
 *    for qk_gemm (A[m,k] * s[k], one rounding per product, like the scalar
 *    path's q * s) and applied per column after each key chunk for sv_gemm.
 *    INT4 is decoded 16 nibbles per 8-byte load: the low nibbles (even elements)
 *    and the high nibbles (odd elements) become two vectors, three integer
 *    operations and one conversion per 8 elements; qk_gemm reorders A to match
 *    (each 16-element block: even elements, then odd), sv_gemm accumulates the
 *    even and odd columns apart and restores their order before the store.
 *  - qk_gemm: register blocks of MB rows of A x NB rows of B (<= 12
 *    accumulators: 1x8 2x6 3x4 4x3 ..).  Each B chunk is converted once and used
 *    for all MB rows, which is what makes GQA decode (M = group size) cheap.
 *    The K tail is one more step on zero-padded copies; every accumulator is
 *    reduced by the same tree (hsum4), so C[m,n] depends only on row m of A,
 *    row n of B and K -- never on M, N or the block.
 *  - sv_gemm: blocks of MB rows of C x NV*8 columns, keys in chunks of a fixed
 *    size per type (16 KiB of B at H = 128) so the chunk stays in L1 while every
 *    column block reads it; partial column blocks decode into zero-padded
 *    vectors (the same lane arithmetic).
 *  - Decode streams the KV cache from memory: both GEMMs prefetch B (qk 4 KiB
 *    ahead, sv the next key chunk), one prefetch per cache line, spread over the
 *    inner loop.
 *  - exp_sum: range reduction + degree-6 polynomial (exp8), exact zeros below
 *    GQA_EXP_MIN, NaN kept.
 *  - row_max: 8-lane maxima, NaN skipped (exact).
 *  - rope_row: 8 pairs a vector (interleaved: 4), fused as the contract states (the scalar
 *    path's bits), the last pairs by gqa_rope_pairs.
 *  - hadamard_rows: kernels_avx2_hadamard.h (gqa_hadamard_rows' bits, blocks of 16 sums in
 *    vectors, the bit reversal by transposes in registers).
 *  - qk_gemm_s8_dot, sv_gemm_s8_dot (accuracy level 4): kernels_avx2_s8dot.c (per-group codes:
 *    kernels_avx2_gdot.c).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <stdlib.h>
#include "kernels_common.h"
#include "kernels_group.h"
#include "kernels_avx2_hadamard.h"


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

/* Group rows -> float32 (kernels_group.h): 8 codes at a time when the group is a multiple
   of 8 columns (bytes replicated, shifted into place, masked), else the portable decoder;
   x = code * scale + zero as a product then a sum, like the reference (bit for bit). */
static void group_decode_row_avx2(const uint8_t *row, float *dst, size_t cols, int type)
{
    const unsigned b = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type);
    if (g % 8) {
        gqa_group_decode_row_ref(row, dst, cols, type);
        return;
    }
    const uint8_t *meta = row + cols * b / 8;
    const __m128i rep = b == 8 ? _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                      : b == 4 ? _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
                               : _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m256i shift = b == 8 ? _mm256_setzero_si256()
                        : b == 4 ? _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)
                                 : _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
    for (size_t gi = 0; gi * g < cols; gi++) {
        float s, z;
        gqa_group_meta(meta, gi, type, &s, &z);
        const __m256 vs = _mm256_set1_ps(s), vz = _mm256_set1_ps(z);
        for (size_t c = gi * g; c < (gi + 1) * g; c += 8) {
            __m128i bytes;
            if (b == 8) {
                bytes = _mm_loadl_epi64((const __m128i *)(row + c));
            } else if (b == 4) {
                uint32_t w;
                memcpy(&w, row + c / 2, 4);
                bytes = _mm_cvtsi32_si128((int)w);
            } else {
                uint16_t w;
                memcpy(&w, row + c / 4, 2);
                bytes = _mm_cvtsi32_si128((int)w);
            }
            __m256i q = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(bytes, rep));
            q = _mm256_and_si256(_mm256_srlv_epi32(q, shift), mask);
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(q), vs);
            _mm256_storeu_ps(dst + c, _mm256_add_ps(f, vz));
        }
    }
}

GQA_GROUP_OPS(avx2, group_decode_row_avx2)

static void quantize_avx2(const float *src, size_t lda, void *dst, size_t rows,
                          size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { gqa_group_quantize(src, lda, dst, rows, cols, type, s); return; }
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

/* Elements [k, k + 8) in order (k even), unscaled. */
INLINE __m256 dec8(const int elem, const uint8_t *row, size_t k)
{
    switch (elem) {
    case GQA_EL_S8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k))));
    case GQA_EL_S4: {
        uint32_t w;
        memcpy(&w, row + k / 2, 4);
        __m128i v = _mm_cvtsi32_si128((int)w);
        __m128i m = _mm_set1_epi8(0x0F);
        __m128i e = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
        return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(e), _mm256_set1_epi32(8)));
    }
    case GQA_EL_F32:
        return _mm256_loadu_ps((const float *)(const void *)row + k);
    default:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * k)));
    }
}

/* 8 consecutive elements starting at element k (k % 8 == 0) as float32: dec8, scaled for
   per-channel types, unscaled (codes) for per-tensor types. */
INLINE __m256 load8(const uint8_t *row, size_t k, int type, const float *s)
{
    const __m256 f = dec8(gqa_element(type), row, k);
    return GQA_IS_PC(type) ? _mm256_mul_ps(f, _mm256_loadu_ps(s + k)) : f;
}

static void dequantize_avx2(const void *src, float *dst, size_t ldd, size_t rows,
                            size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { group_dequantize_avx2(src, dst, ldd, rows, cols, type); return; }
    size_t rb = gqa_row_bytes(type, cols);
    const float ps = gqa_post_scale(type, s);
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
    if (GQA_IS_GROUP(type)) { group_dequantize_t_avx2(src, dst, ldd, rows, cols, type); return; }
    const size_t rb = gqa_row_bytes(type, cols);
    const __m256 vps = _mm256_set1_ps(gqa_post_scale(type, s));
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

/* ---- decode for the GEMMs ------------------------------------------------
 *
 * The GEMM kernels read B as unscaled codes (per-tensor scales are applied to
 * the finished dot products, per-channel ones are folded into A for qk_gemm and
 * applied per column after the key sum for sv_gemm), as one of four elements: */
/* (gqa_element of kernels_common.h: GQA_EL_S8, GQA_EL_S4, GQA_EL_F32, GQA_EL_F16) */


/* Elements [k, k + 16) (k % 16 == 0), unscaled, as two vectors.  INT4: the 16
   nibbles of one 8-byte load, v0 = the low nibbles (elements k, k+2, .., k+14),
   v1 = the high ones (k+1, .., k+15) -- three integer operations and a
   conversion per 8 elements; callers pair them with A or C in the same order.
   Other kinds: v0 = [k, k + 8), v1 = [k + 8, k + 16) in order. */
INLINE void dec16(const int elem, const uint8_t *row, size_t k, __m256 *v0, __m256 *v1)
{
    if (elem == GQA_EL_S4) {
        const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + k / 2)));
        const __m256i eight = _mm256_set1_epi32(8);
        *v0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(z, _mm256_set1_epi32(15)), eight));
        *v1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(z, 4), eight));
    } else {
        *v0 = dec8(elem, row, k);
        *v1 = dec8(elem, row, k + 8);
    }
}

/* Elements [k, k + n) (n < 8) in order, unscaled, zero past n. */
static __m256 dec_tail(const uint8_t *row, size_t k, size_t n, int type)
{
    static const float one = 1.0f;
    float t[8] = {0};
    for (size_t i = 0; i < n; i++)
        t[i] = gqa_decode(row, k + i, type == GQA_S8_PC ? GQA_S8_PT : type == GQA_S4_PC ? GQA_S4_PT : type, &one);
    return _mm256_loadu_ps(t);
}


/* ---- qk_gemm ------------------------------------------------------------ */

/* Lane i of the result = horizontal sum of v_i (8 lanes), always by the same tree:
   ((l0 + l2) + (l1 + l3)) + ((l4 + l6) + (l5 + l7)), whatever the slot.  In-lane unpacks
   and shuffles with plain adds: vhaddps takes 3 uops and 2 cycles on Zen 3 (uops.info). */
INLINE __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    /* per 128-bit half: (v0 l0+l2, v1 l0+l2, v0 l1+l3, v1 l1+l3), the same for v2, v3 */
    const __m256 w01 = _mm256_add_ps(_mm256_unpacklo_ps(v0, v1), _mm256_unpackhi_ps(v0, v1));
    const __m256 w23 = _mm256_add_ps(_mm256_unpacklo_ps(v2, v3), _mm256_unpackhi_ps(v2, v3));
    /* per half: (vi (l0+l2) + (l1+l3)) for i = 0..3 */
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(w01, w23, 0x44), _mm256_shuffle_ps(w01, w23, 0xEE));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Rows of A as the qk kernels read them, for one block of rows: per-channel scales
   folded in (A[m,k] * s[k], one rounding per product like the scalar path's
   q * s), and for INT4 each 16-element block reordered as its even elements then
   its odd ones (the order of dec16).  Returns the rows to use (A itself when
   nothing changes).  `tail` gets A[m, K8 .. K) zero-padded to 8 (K8 = K & ~7). */
static const float *qk_prep(const float *A, size_t lda, int mb, size_t K, int type, const float *s, float *buf,
                            float *tail, size_t *ld)
{
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    const size_t K8 = K & ~(size_t)7;
    const float *src = A;
    if (pc || s4) {
        for (int m = 0; m < mb; m++) {
            const float *a = A + m * lda;
            float *o = buf + m * K;
            size_t k = 0;
            if (s4)
                for (; k + 16 <= K; k += 16) {
                    __m256 x0 = _mm256_loadu_ps(a + k), x1 = _mm256_loadu_ps(a + k + 8);
                    if (pc) {
                        x0 = _mm256_mul_ps(x0, _mm256_loadu_ps(s + k));
                        x1 = _mm256_mul_ps(x1, _mm256_loadu_ps(s + k + 8));
                    }
                    __m256 ev = _mm256_shuffle_ps(x0, x1, 0x88), od = _mm256_shuffle_ps(x0, x1, 0xDD);
                    _mm256_storeu_ps(o + k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ev), 0xD8)));
                    _mm256_storeu_ps(o + k + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(od), 0xD8)));
                }
            for (; k < K; k++)
                o[k] = pc ? a[k] * s[k] : a[k];
        }
        src = buf;
        *ld = K;
    } else {
        *ld = lda;
    }
    for (int m = 0; m < mb; m++)
        for (size_t i = 0; i < 8; i++)
            tail[m * 8 + i] = K8 + i < K ? src[m * *ld + K8 + i] : 0.0f;
    return src;
}

#define QK_PF 4096

/* Rows n0 .. n1-1 of B (n1 - n0 a multiple of NB) against MB rows of A (prepared by
   qk_prep), NB rows at a time (MB * NB <= 12 accumulators).  Per accumulator:
   INT4 16-element steps (dec16) then one in-order 8-element step when K % 16 >= 8,
   other kinds 8-element steps with the A rows in registers; one zero-padded step
   for K % 8; then hsum4 and mult -- the same operations for every (m, n). */
INLINE void qk_block(const int MB, const int NB, const int elem, size_t n0, size_t n1, size_t K, float mult,
                     const float *A, size_t lda, const float *at, const uint8_t *B, size_t rb, int type,
                     float *C, size_t ldc)
{
    const size_t K16 = K & ~(size_t)15, K8 = K & ~(size_t)7;
    const int nacc = (MB * NB + 3) & ~3;
    const __m128 vm = _mm_set1_ps(mult);
    for (size_t n = n0; n < n1; n += NB) {
        const uint8_t *Bn = B + n * rb;
        __m256 acc[12];
        UNROLL
        for (int i = 0; i < nacc; i++)
            acc[i] = _mm256_setzero_ps();
        size_t k = 0;
        if (elem == GQA_EL_S4)
            for (; k < K16; k += 16) {
                /* B streams from memory in decode: the block's rows QK_PF bytes ahead, spread
                   over the steps (hardware prefetchers stop at page boundaries; prefetches
                   never fault) */
                _mm_prefetch((const char *)Bn + QK_PF + k * NB / 2, _MM_HINT_T0);
                UNROLL
                for (int nb = 0; nb < NB; nb++) {
                    __m256 b0, b1;
                    dec16(elem, Bn + nb * rb, k, &b0, &b1);
                    UNROLL
                    for (int mb = 0; mb < MB; mb++) {
                        acc[mb * NB + nb] = _mm256_fmadd_ps(_mm256_loadu_ps(A + mb * lda + k), b0, acc[mb * NB + nb]);
                        acc[mb * NB + nb] =
                            _mm256_fmadd_ps(_mm256_loadu_ps(A + mb * lda + k + 8), b1, acc[mb * NB + nb]);
                    }
                }
            }
        for (; k < K8; k += 8) { /* other kinds: A rows loaded once per step */
            const int bpe = elem == GQA_EL_S8 ? 1 : elem == GQA_EL_F32 ? 4 : elem == GQA_EL_F16 ? 2 : 0; /* S4: tail only */
            UNROLL
            for (int j = 0; j < (8 * NB * bpe + 63) / 64; j++)
                _mm_prefetch((const char *)Bn + QK_PF + k * NB * bpe + 64 * j, _MM_HINT_T0);
            __m256 a[8];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = _mm256_loadu_ps(A + mb * lda + k);
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                __m256 b = dec8(elem, Bn + nb * rb, k);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm256_fmadd_ps(a[mb], b, acc[mb * NB + nb]);
            }
        }
        if (K8 < K) {
            for (int nb = 0; nb < NB; nb++) {
                __m256 b = dec_tail(Bn + nb * rb, K8, K - K8, type);
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm256_fmadd_ps(_mm256_loadu_ps(at + mb * 8), b, acc[mb * NB + nb]);
            }
        }
        if (NB % 4 == 0) { /* each group of 4 is 4 outputs of one row */
            UNROLL
            for (int g = 0; g < nacc; g += 4)
                _mm_storeu_ps(C + (g / NB) * ldc + n + g % NB,
                              _mm_mul_ps(hsum4(acc[g], acc[g + 1], acc[g + 2], acc[g + 3]), vm));
        } else {
            float out[12];
            UNROLL
            for (int g = 0; g < nacc; g += 4)
                _mm_storeu_ps(out + g, _mm_mul_ps(hsum4(acc[g], acc[g + 1], acc[g + 2], acc[g + 3]), vm));
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                UNROLL
                for (int nb = 0; nb < NB; nb++)
                    C[mb * ldc + n + nb] = out[mb * NB + nb];
        }
    }
}

/* One function per (elem, MB, NB): the elem is a compile-time constant inside each,
   so the decode switch disappears from the inner loop. */
#define QK_INST(T, MB, NB)                                                                       \
    static void qk_##T##_##MB##x##NB(size_t n0, size_t n1, size_t K, float mult, const float *A,  \
                                     size_t lda, const float *at, const uint8_t *B, size_t rb,    \
                                     int type, float *C, size_t ldc)                              \
    {                                                                                             \
        qk_block(MB, NB, T, n0, n1, K, mult, A, lda, at, B, rb, type, C, ldc);                    \
    }
/* Wide shapes (rows of A x rows of B, up to 12 accumulators): 1x8 2x6 3x4 4x3 5x2
   6x2 7x1 8x1, then MB x 1 for the last N % NB rows of B. */
#define QK_KIND(T)                                                                                \
    QK_INST(T, 1, 8) QK_INST(T, 2, 6) QK_INST(T, 3, 4) QK_INST(T, 4, 3) QK_INST(T, 5, 2)          \
    QK_INST(T, 6, 2) QK_INST(T, 1, 1) QK_INST(T, 2, 1) QK_INST(T, 3, 1) QK_INST(T, 4, 1)          \
    QK_INST(T, 5, 1) QK_INST(T, 6, 1) QK_INST(T, 7, 1) QK_INST(T, 8, 1)                           \
    static const qk_fn qk_wide_##T[9] = {0, qk_##T##_1x8, qk_##T##_2x6, qk_##T##_3x4,            \
        qk_##T##_4x3, qk_##T##_5x2, qk_##T##_6x2, qk_##T##_7x1, qk_##T##_8x1};                    \
    static const qk_fn qk_narrow_##T[9] = {0, qk_##T##_1x1, qk_##T##_2x1, qk_##T##_3x1,          \
        qk_##T##_4x1, qk_##T##_5x1, qk_##T##_6x1, qk_##T##_7x1, qk_##T##_8x1};

typedef void (*qk_fn)(size_t, size_t, size_t, float, const float *, size_t, const float *, const uint8_t *,
                      size_t, int, float *, size_t);
QK_KIND(0) QK_KIND(1) QK_KIND(2) QK_KIND(3)
static const qk_fn *const qk_wide[4] = {qk_wide_0, qk_wide_1, qk_wide_2, qk_wide_3};
static const qk_fn *const qk_narrow[4] = {qk_narrow_0, qk_narrow_1, qk_narrow_2, qk_narrow_3};
static const int qk_nbs[9] = {0, 8, 6, 4, 3, 2, 2, 1, 1};
/* Rows of A per block: INT8 / float rows at most 4 (M = 8 as 4 + 4 beats 8 x 1 by
   ~20% here), INT4 up to 8 (its decode is the larger cost, shared by more rows). */
static const size_t qk_maxmb[4] = {4, 8, 4, 4};

/* Prepared rows of A live on the stack up to this many floats (32 KiB). */
#define QK_STACK_FLOATS 8192

/* ---- per-group rows, fused (groups of a multiple of 8 columns) ------------------------------
 * Each 8 elements are formed as fma(code, scale, zero) in registers (one rounding; gqa.dequantize
 * keeps the contract's two) and used at once: QK accumulates every row's products in column
 * order, 8 (row, A-row) sums reduced at a time by hsum4; SV accumulates 32-column blocks over
 * the keys in order.  C[m, n] depends only on row m of A, row (qk) or column (sv) n of B and K. */

INLINE void group_meta_avx2(const uint8_t *meta, size_t gi, int type, __m256 *s, __m256 *z)
{
    if (type & GQA_META_F16) {
        uint32_t w;
        memcpy(&w, meta + 4 * gi, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)w));
        *s = _mm256_broadcastss_ps(f);
        *z = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
    } else {
        *s = _mm256_broadcast_ss((const float *)(const void *)(meta + 8 * gi));
        *z = _mm256_broadcast_ss((const float *)(const void *)(meta + 8 * gi + 4));
    }
}

/* The 8 codes of a group row from element c (c % 8 == 0), as float32. */
INLINE __m256 group_codes8(const uint8_t *row, size_t c, const unsigned b)
{
    if (b == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c))));
    if (b == 4) {
        uint32_t w;
        memcpy(&w, row + c / 2, 4);
        const __m128i v = _mm_cvtsi32_si128((int)w), m = _mm_set1_epi8(0x0F);
        const __m128i e = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e));
    }
    uint16_t w;
    memcpy(&w, row + c / 4, 2);
    const __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)w),
                                       _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m256i q = _mm256_srlv_epi32(_mm256_cvtepu8_epi32(v), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(3)));
}

/* Blocks of elements decoded together: kernels_group.h's 8-byte blocks (gqa_group_block8).  A
   is reordered to match once per call (qk), the accumulated columns put back in order once per
   call (sv). */

/* Ordered INT2: the group's values fma(c, s, z) for c = i & 3 in an 8-entry vpermps table t[0]
   (an index's bit 2 is the next code: the table repeats), the value fma(code, s, z) gives.
   (INT4 keeps fma(code, s, z): two tables and a blend per 8 values measured slower here.) */
INLINE void group_tables_avx2(const __m256 s, const __m256 z, __m256 *t)
{
    t[0] = _mm256_fmadd_ps(_mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3), s, z);
}

/* The block at element c, with its group's scale s and zero z broadcast (ordered INT2: its table
   t, group_tables_avx2). */
INLINE void group_decode_ord(const uint8_t *row, size_t c, const __m256 s, const __m256 z, const __m256 *t,
                             const unsigned b, const int ORD, __m256 *x)
{
    if (!ORD) {
        x[0] = _mm256_fmadd_ps(group_codes8(row, c, b), s, z);
    } else if (b == 8) {
        x[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c)))),
                               s, z);
    } else if (b == 4) {
        const __m128i v = _mm_loadl_epi64((const __m128i *)(row + c / 2)), m = _mm_set1_epi8(0x0F);
        x[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, m))), s, z);
        x[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m))),
                               s, z);
    } else {
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c / 4)));
        x[0] = _mm256_permutevar8x32_ps(t[0], q);
        x[1] = _mm256_permutevar8x32_ps(t[0], _mm256_srli_epi32(q, 2));
        x[2] = _mm256_permutevar8x32_ps(t[0], _mm256_srli_epi32(q, 4));
        x[3] = _mm256_permutevar8x32_ps(t[0], _mm256_srli_epi32(q, 6));
    }
}

INLINE void group_qk_ord_avx2(const int MB, const int NB, const unsigned b, const int ORD, size_t N, size_t K,
                              float alpha, const float *Ap, const uint8_t *B, int type, float *C, size_t ldc,
                              size_t ms)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, K), cb = K * b / 8;
    const size_t blk = gqa_group_block8(b, ORD);
    const int nv = (int)(blk / 8);
    const __m128 va = _mm_set1_ps(alpha);
    for (size_t n0 = 0; n0 < N; n0 += NB) {
        const size_t nb = N - n0 < (size_t)NB ? N - n0 : (size_t)NB;
        const uint8_t *row[8];
        __m256 acc[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_setzero_ps();
        UNROLL
        for (int r = 0; r < NB; r++) /* rows past N repeat row n0: computed, never stored */
            row[r] = B + (n0 + ((size_t)r < nb ? (size_t)r : 0)) * rb;
        /* B streams from memory in decode: the block's rows 4 KiB ahead, rows of more than
           two lines every line, shorter ones their first (the hardware brings the line beside
           it).  Zen 4 running this path, 2 threads, T = 8192, 16 layers' caches in turn from
           DRAM: every line made decode steps 1.29x faster at INT8 g32 16/8/128 (160-byte rows)
           and 1.05-1.08x at 8/1/256, 0.94-0.96x at INT8 g32 H = 64 (80-byte rows); prefetches
           never fault */
        if (rb > 128)
            for (size_t off = 0; off < NB * rb; off += 64)
                _mm_prefetch((const char *)row[0] + 4096 + off, _MM_HINT_T0);
        else
            UNROLL
            for (int r = 0; r < NB; r++)
                _mm_prefetch((const char *)row[r] + 4096, _MM_HINT_T0);
        /* the NB keys side by side within each group: NB * MB independent chains of fma
           (each accumulator still sums its own row's products in column order) */
        for (size_t c0 = 0, gi = 0; c0 < K; c0 += g, gi++) {
            __m256 s[8], z[8], t[8][1];
            UNROLL
            for (int r = 0; r < NB; r++) {
                group_meta_avx2(row[r] + cb, gi, type, &s[r], &z[r]);
                if (ORD && b == 2)
                    group_tables_avx2(s[r], z[r], t[r]);
            }
            for (size_t c = c0; c < c0 + g; c += blk)
                UNROLL
                for (int r = 0; r < NB; r++) {
                    __m256 x[4];
                    group_decode_ord(row[r], c, s[r], z[r], t[r], b, ORD, x);
                    UNROLL
                    for (int v = 0; v < nv; v++)
                        UNROLL
                        for (int m = 0; m < MB; m++)
                            acc[m * NB + r] = _mm256_fmadd_ps(_mm256_loadu_ps(Ap + m * K + c + 8 * v), x[v],
                                                              acc[m * NB + r]);
                }
        }
        float h[8];
        _mm_storeu_ps(h, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), va));
        _mm_storeu_ps(h + 4, _mm_mul_ps(hsum4(acc[4], acc[5], acc[6], acc[7]), va));
        for (size_t m = 0; m < ms; m++)
            for (size_t r = 0; r < nb; r++)
                C[m * ldc + n0 + r] = h[m * NB + r];
    }
}

INLINE void group_sv_ord_avx2(const int MB, const unsigned b, const int ORD, size_t N, size_t K, const float *A,
                              size_t lda, const uint8_t *B, int type, float *T, size_t ldt, int first, size_t c0)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, N), cb = N * b / 8;
    const int blk = (int)gqa_group_block8(b, ORD), nv = blk / 8, nbk = 32 / blk;
    size_t gidx[4];   /* the group of each block (divisions once per call, not per key) */
    for (int j = 0; j < nbk; j++)
        gidx[j] = (c0 + (size_t)(j * blk)) / g;
    __m256 acc[2][4];
    UNROLL
    for (int m = 0; m < MB; m++)
        UNROLL
        for (int v = 0; v < 4; v++)
            acc[m][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(T + m * ldt + c0 + 8 * v);
    for (size_t k = 0; k < K; k++) {
        const uint8_t *row = B + k * rb;
        _mm_prefetch((const char *)row + c0 * b / 8 + 4096, _MM_HINT_T0);
        __m256 p[2];
        UNROLL
        for (int m = 0; m < MB; m++)
            p[m] = _mm256_broadcast_ss(A + m * lda + k);
        __m256 s, z, t[1];
        UNROLL
        for (int j = 0; j < nbk; j++) {
            __m256 x[4];
            const size_t c = c0 + (size_t)(j * blk);
            if (j == 0 || gidx[j] != gidx[j - 1]) {
                group_meta_avx2(row + cb, gidx[j], type, &s, &z);
                if (ORD && b == 2)
                    group_tables_avx2(s, z, t);
            }
            group_decode_ord(row, c, s, z, t, b, ORD, x);
            UNROLL
            for (int v = 0; v < nv; v++)
                UNROLL
                for (int m = 0; m < MB; m++)
                    acc[m][j * nv + v] = _mm256_fmadd_ps(x[v], p[m], acc[m][j * nv + v]);
        }
    }
    UNROLL
    for (int m = 0; m < MB; m++)
        UNROLL
        for (int v = 0; v < 4; v++)
            _mm256_storeu_ps(T + m * ldt + c0 + 8 * v, acc[m][v]);
}

#define group_sv_ord_avx2_1(...) group_sv_ord_avx2(1, __VA_ARGS__)
#define group_sv_ord_avx2_2(...) group_sv_ord_avx2(2, __VA_ARGS__)
GQA_GROUP_FUSED(avx2, group_qk_ord_avx2, group_sv_ord_avx2)

static void qk_gemm_avx2(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                         const void *B, int type, const float *s, float *C, size_t ldc)
{
    GQA_GROUP_ENTRY(avx2, qk, group_fast_avx2(type, K), GQA_QK_ARGS)
    if (K == 0) { /* contract: C zero-filled */
        for (size_t m = 0; m < M; m++)
            memset(C + m * ldc, 0, N * sizeof(float));
        return;
    }
    const int elem = gqa_element(type), prep = GQA_IS_PC(type) || GQA_IS_S4(type);
    const qk_fn *wide = qk_wide[elem], *narrow = qk_narrow[elem];
    const size_t rb = gqa_row_bytes(type, K);
    const float mult = alpha * gqa_post_scale(type, s);
    const uint8_t *Bb = (const uint8_t *)B;
    float stack_buf[QK_STACK_FLOATS], tail[8 * 8];
    float *buf = stack_buf;
    size_t bm = gqa_row_block(M, qk_maxmb[elem]);
    if (prep && bm * K > QK_STACK_FLOATS) {
        if (K <= QK_STACK_FLOATS) {
            bm = QK_STACK_FLOATS / K; /* fewer rows per block: the same values */
        } else if ((buf = (float *)malloc(bm * K * sizeof(float))) == NULL) {
            gqa_kernels_scalar.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc); /* out of memory */
            return;
        }
    }
    for (size_t m0 = 0; m0 < M; m0 += bm) {
        const int mb = (int)(M - m0 < bm ? M - m0 : bm);
        size_t ld;
        const float *a = qk_prep(A + m0 * lda, lda, mb, K, type, s, buf, tail, &ld);
        float *c = C + m0 * ldc;
        const size_t nw = N - N % (size_t)qk_nbs[mb];
        wide[mb](0, nw, K, mult, a, ld, tail, Bb, rb, type, c, ldc);
        narrow[mb](nw, N, K, mult, a, ld, tail, Bb, rb, type, c, ldc);
    }
    if (buf != stack_buf)
        free(buf);
}

/* ---- sv_gemm ------------------------------------------------------------ */

/* P @ V's prefetch of the next key chunk goes into L1 (T0) while the chunk is at most
   SV_L1_CHUNK bytes, else into L2 (T1), where it cannot evict the chunk that every column block
   (32 columns or fewer) reads again.  Zen 4 running this path, 2 threads, T = 8192, 16 layers'
   caches in turn from DRAM: decode steps into L2 1.12-1.48x faster at INT8 H = 128 and 256 (16
   and 32 KiB chunks: 16/8/128, 8/1/256, 4/1/256), INT4 level (0.98-1.04x). */
#define SV_L1_CHUNK 8192

/* Columns n0 .. n0 + 8 NV of C[mb, .] += scale[col] * sum_{k0 <= k < k1} A[mb, k] * B[k, col]
   for MB rows.  Pairs of vectors come from dec16 (INT4: the even columns of 16,
   then the odd ones; put back in order before the store).  `part` (NV == 1):
   only the first `np` < 8 columns exist, decoded element by element into a
   zero-padded vector -- the same lane arithmetic.  Scale per column: `spc` (per
   channel) or `vs` (per tensor, 1 for float rows), applied once per key chunk. */
INLINE void sv_block(const int MB, const int NV, const int elem, const int part, size_t np, size_t k0,
                     size_t k1, const float *A, size_t lda, const uint8_t *B, size_t rb, size_t n0,
                     int type, const float *spc, __m256 vs, float *C, size_t ldc, size_t pf)
{
    __m256 acc[16];
    UNROLL
    for (int i = 0; i < MB * NV; i++)
        acc[i] = _mm256_setzero_ps();
    size_t pf0 = 0;
    const int npf = pf ? gqa_block_lines(gqa_element_bits(elem), n0, part ? np : 8 * (size_t)NV, &pf0) : 0;
    pf0 += pf;
    const int to_l2 = pf > SV_L1_CHUNK;
    for (size_t k = k0; k < k1; k++) {
        const uint8_t *row = B + k * rb;
        for (int j = 0; j < npf; j++) /* the block's lines of the same row of the next key chunk */
            if (to_l2)
                _mm_prefetch((const char *)row + pf0 + 64 * j, _MM_HINT_T1);
            else
                _mm_prefetch((const char *)row + pf0 + 64 * j, _MM_HINT_T0);
        __m256 b[8];
        if (part) {
            b[0] = dec_tail(row, n0, np, type);
        } else {
            UNROLL
            for (int v = 0; v + 1 < NV; v += 2)
                dec16(elem, row, n0 + 8 * v, &b[v], &b[v + 1]);
            if (NV & 1)
                b[NV - 1] = dec8(elem, row, n0 + 8 * (NV - 1));
        }
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            __m256 a = _mm256_broadcast_ss(A + mb * lda + k);
            UNROLL
            for (int v = 0; v < NV; v++)
                acc[mb * NV + v] = _mm256_fmadd_ps(a, b[v], acc[mb * NV + v]);
        }
    }
    UNROLL
    for (int mb = 0; mb < MB; mb++) {
        if (elem == GQA_EL_S4 && !part)
            UNROLL
            for (int v = 0; v + 1 < NV; v += 2) { /* even | odd columns -> in order */
                __m256 lo = _mm256_unpacklo_ps(acc[mb * NV + v], acc[mb * NV + v + 1]);
                __m256 hi = _mm256_unpackhi_ps(acc[mb * NV + v], acc[mb * NV + v + 1]);
                acc[mb * NV + v] = _mm256_permute2f128_ps(lo, hi, 0x20);
                acc[mb * NV + v + 1] = _mm256_permute2f128_ps(lo, hi, 0x31);
            }
        UNROLL
        for (int v = 0; v < NV; v++) {
            float *c = C + mb * ldc + n0 + 8 * v;
            if (part) {
                float t[8] = {0}, sp[8] = {0};
                memcpy(t, c, np * sizeof(float));
                if (spc)
                    memcpy(sp, spc + n0, np * sizeof(float));
                __m256 sc = spc ? _mm256_loadu_ps(sp) : vs;
                _mm256_storeu_ps(t, _mm256_fmadd_ps(acc[mb], sc, _mm256_loadu_ps(t)));
                memcpy(c, t, np * sizeof(float));
            } else {
                __m256 sc = spc ? _mm256_loadu_ps(spc + n0 + 8 * v) : vs;
                _mm256_storeu_ps(c, _mm256_fmadd_ps(acc[mb * NV + v], sc, _mm256_loadu_ps(c)));
            }
        }
    }
}

#define SV_INST(T, MB, NV) SV_INST_(T, MB, NV)
#define SV_INST_(T, MB, NV)                                                                       \
    static void sv_##T##_##MB##x##NV(size_t np, size_t k0, size_t k1, const float *A, size_t lda,  \
                                     const uint8_t *B, size_t rb, size_t n0, int type,            \
                                     const float *spc, __m256 vs, float *C, size_t ldc, size_t pf) \
    {                                                                                             \
        sv_block(MB, NV, T, 0, np, k0, k1, A, lda, B, rb, n0, type, spc, vs, C, ldc, pf);         \
    }
#define SV_PART(T, MB)                                                                            \
    static void svp_##T##_##MB(size_t np, size_t k0, size_t k1, const float *A, size_t lda,        \
                               const uint8_t *B, size_t rb, size_t n0, int type,                  \
                               const float *spc, __m256 vs, float *C, size_t ldc, size_t pf)      \
    {                                                                                             \
        sv_block(MB, 1, T, 1, np, k0, k1, A, lda, B, rb, n0, type, spc, vs, C, ldc, pf);          \
    }
typedef void (*sv_fn)(size_t, size_t, size_t, const float *, size_t, const uint8_t *, size_t, size_t, int,
                      const float *, __m256, float *, size_t, size_t);
/* Per row count MB: {wide block, 16-column block, 8-column block, partial block}.
   Wide shapes (rows x 8-column vectors, accumulators <= 12): INT8 / float rows
   1x4 2x4 3x3 4x3 5x2 6x2 7x1 8x1; INT4 (vectors in pairs) 1x8 2x4 3x2 4x2 5x2 6x2. */
#define SV_SET(T, MB, NVW) SV_SET_(T, MB, NVW)
#define SV_SET_(T, MB, NVW) {sv_##T##_##MB##x##NVW, sv_##T##_##MB##x2, sv_##T##_##MB##x1, svp_##T##_##MB}
#define SV_KIND(T)                                                                                \
    SV_INST(T, 1, 4) SV_INST(T, 2, 4) SV_INST(T, 3, 3) SV_INST(T, 4, 3)                         \
    SV_INST(T, 1, 2) SV_INST(T, 2, 2) SV_INST(T, 3, 2) SV_INST(T, 4, 2) SV_INST(T, 5, 2)          \
    SV_INST(T, 6, 2) SV_INST(T, 7, 2) SV_INST(T, 8, 2)                                            \
    SV_INST(T, 1, 1) SV_INST(T, 2, 1) SV_INST(T, 3, 1) SV_INST(T, 4, 1) SV_INST(T, 5, 1)          \
    SV_INST(T, 6, 1) SV_INST(T, 7, 1) SV_INST(T, 8, 1)                                            \
    SV_PART(T, 1) SV_PART(T, 2) SV_PART(T, 3) SV_PART(T, 4) SV_PART(T, 5) SV_PART(T, 6)           \
    SV_PART(T, 7) SV_PART(T, 8)                                                                   \
    static const sv_fn sv_fns_##T[9][4] = {{0}, SV_SET(T, 1, 4), SV_SET(T, 2, 4), SV_SET(T, 3, 3),  \
        SV_SET(T, 4, 3), SV_SET(T, 5, 2), SV_SET(T, 6, 2), SV_SET(T, 7, 1), SV_SET(T, 8, 1)};
SV_KIND(0) SV_KIND(2) SV_KIND(3)
SV_INST(1, 1, 8) SV_INST(1, 2, 4)
SV_INST(1, 1, 2) SV_INST(1, 2, 2) SV_INST(1, 3, 2) SV_INST(1, 4, 2) SV_INST(1, 5, 2) SV_INST(1, 6, 2)
SV_INST(1, 1, 1) SV_INST(1, 2, 1) SV_INST(1, 3, 1) SV_INST(1, 4, 1) SV_INST(1, 5, 1) SV_INST(1, 6, 1)
SV_PART(1, 1) SV_PART(1, 2) SV_PART(1, 3) SV_PART(1, 4) SV_PART(1, 5) SV_PART(1, 6)
static const sv_fn sv_fns_1[9][4] = {{0}, SV_SET(1, 1, 8), SV_SET(1, 2, 4), SV_SET(1, 3, 2), SV_SET(1, 4, 2),
                                     SV_SET(1, 5, 2), SV_SET(1, 6, 2), {0}, {0}};
static const sv_fn (*const sv_fns[4])[4] = {sv_fns_0, sv_fns_1, sv_fns_2, sv_fns_3};
static const int sv_nvw[4][9] = {{0, 4, 4, 3, 3, 2, 2, 1, 1}, {0, 8, 4, 2, 2, 2, 2, 0, 0},
                                 {0, 4, 4, 3, 3, 2, 2, 1, 1}, {0, 4, 4, 3, 3, 2, 2, 1, 1}};
static const size_t sv_maxmb[4] = {6, 6, 6, 6};

static void sv_gemm_avx2(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                         int type, const float *s, float *C, size_t ldc, float beta)
{
    GQA_GROUP_ENTRY(avx2, sv, group_fast_avx2(type, N), GQA_SV_ARGS)
    const int elem = gqa_element(type);
    const size_t rb = gqa_row_bytes(type, N);
    const uint8_t *Bb = (const uint8_t *)B;
    const float *spc = GQA_IS_PC(type) ? s : NULL;
    const __m256 vs = _mm256_set1_ps(gqa_post_scale(type, s));
    for (size_t m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (beta == 0.0f)
            memset(c, 0, N * sizeof(float));
        else if (beta != 1.0f)
            for (size_t n = 0; n < N; n++)
                c[n] *= beta;
    }
    /* Codes: chunks of keys (16 KiB of rows at H = 128) stay in L1 while every
       column block reads them; float32 rows: 256 keys (a flash tile is one pass; a decode
       step's float cache gets a next chunk to prefetch); float16 rows: one pass.  The chunk
       depends on the type only, so C[m, n] does not depend on N. */
    const size_t kc = elem == GQA_EL_S8 ? 128 : elem == GQA_EL_S4 || elem == GQA_EL_F32 ? 256 : (K ? K : 1);
    const size_t n16 = elem == GQA_EL_S4 ? N & ~(size_t)15 : 0, n8 = N & ~(size_t)7;
    const size_t bm = gqa_row_block(M, sv_maxmb[elem]);
    for (size_t k0 = 0; k0 < K; k0 += kc) {
        const size_t k1 = K - k0 < kc ? K : k0 + kc;
        for (size_t m0 = 0; m0 < M; m0 += bm) {
            const int mb = (int)(M - m0 < bm ? M - m0 : bm);
            const sv_fn *f = sv_fns[elem][mb];
            const float *a = A + m0 * lda;
            float *c = C + m0 * ldc;
            const size_t step = 8 * (size_t)sv_nvw[elem][mb];
            /* first block of rows: each column block prefetches the lines of the next chunk's
               rows that start in its bytes (gqa_block_lines; gqa_sv_prefetches says where) */
            const size_t pf = m0 == 0 && k1 < K && gqa_sv_prefetches(elem, N, step) ? kc * rb : 0;
            /* INT4 blocks of 2+ vectors decode 16-column pairs: they stop at n16; the other
               kinds take 16-column blocks too before single vectors (more accumulators in
               flight: a 64-column head at MB = 3 is 24 + 24 + 16, not 24 + 24 + 8 + 8) */
            const size_t wide_end = elem == GQA_EL_S4 ? n16 : n8;
            size_t n = 0;
            for (; n + step <= wide_end; n += step)
                f[0](8, k0, k1, a, lda, Bb, rb, n, type, spc, vs, c, ldc, pf);
            for (; n + 16 <= wide_end; n += 16)
                f[1](8, k0, k1, a, lda, Bb, rb, n, type, spc, vs, c, ldc, pf);
            for (; n < n8; n += 8)
                f[2](8, k0, k1, a, lda, Bb, rb, n, type, spc, vs, c, ldc, pf);
            if (n < N)
                f[3](N - n, k0, k1, a, lda, Bb, rb, n, type, spc, vs, c, ldc, pf);
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
    d = _mm256_min_ps(_mm256_set1_ps(GQA_EXP_MAX), d);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(d, _mm256_set1_ps(GQA_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(GQA_EXP_LN2_HI), d);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(GQA_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(GQA_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GQA_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GQA_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GQA_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GQA_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(GQA_EXP_P5));
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

/* ---- row_max ------------------------------------------------------------ */

/* max_ps(x, m) is x > m ? x : m: a NaN x leaves m.  Four independent maxima (one
   chain would wait a max latency per vector); the last n % 8 elements one by one. */
static float row_max_avx2(const float *x, size_t n)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    for (; i + 8 <= n; i += 8)
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    float buf[8];
    _mm256_storeu_ps(buf, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    return gqa_max_of(x + i, n - i, gqa_max_of(buf, 8, -INFINITY));
}

/* ---- rope_row ----------------------------------------------------------- */

/* gqa_rope_pairs' bits, 8 pairs a vector: x0' = fmsub(x0, c, x1 s) (= fma(x0, c, -(x1 s))),
   x1' = fmadd(x0, s, x1 c); interleaved pairs as (x0, x0) and (x1, x1) against (c, s) and
   (-s, c) (x1 (-s) = -(x1 s) exactly); each vector's loads before its stores (o may be x);
   the last r2 % 8 (interleaved: % 4) pairs by gqa_rope_pairs. */
static void rope_row_avx2(size_t r2, int interleaved, const float *x, const float *c, const float *s, float *o)
{
    size_t i = 0;
    if (!interleaved)
        for (; i + 8 <= r2; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + r2 + i);
            const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
            const __m256 a = _mm256_fmsub_ps(x0, vc, _mm256_mul_ps(x1, vs));
            const __m256 b = _mm256_fmadd_ps(x0, vs, _mm256_mul_ps(x1, vc));
            _mm256_storeu_ps(o + i, a);
            _mm256_storeu_ps(o + r2 + i, b);
        }
    else
        for (; i + 4 <= r2; i += 4) {
            const __m256 v = _mm256_loadu_ps(x + 2 * i);
            const __m128 vc = _mm_loadu_ps(c + i), vs = _mm_loadu_ps(s + i);
            const __m128 ns = _mm_xor_ps(vs, _mm_set1_ps(-0.0f));
            const __m256 cs = _mm256_set_m128(_mm_unpackhi_ps(vc, vs), _mm_unpacklo_ps(vc, vs));
            const __m256 sc = _mm256_set_m128(_mm_unpackhi_ps(ns, vc), _mm_unpacklo_ps(ns, vc));
            _mm256_storeu_ps(o + 2 * i, _mm256_fmadd_ps(_mm256_moveldup_ps(v), cs,
                                                        _mm256_mul_ps(_mm256_movehdup_ps(v), sc)));
        }
    gqa_rope_pairs(i, r2, interleaved, x, c, s, o);
}

#ifdef GQA_HAVE_AVX2_S8DOT /* accuracy level 4's integer dots: kernels_avx2_s8dot.c */
void gqa_qk_gemm_s8_dot_avx2(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                             int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_s8_dot_avx2(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                             const float *s, float *C, size_t ldc, float beta);
GQA_KERNEL_TABLE(avx2, NULL, gqa_qk_gemm_s8_dot_avx2, gqa_sv_gemm_s8_dot_avx2, NULL)
#else
GQA_KERNEL_TABLE(avx2, NULL, NULL, NULL, NULL)
#endif
#ifdef GQA_HAVE_AVXVNNI /* the same kernels with level 4 on AVX-VNNI (kernels_avxvnni_*.c): dispatch.c
                           hands this table out for level 4 where the CPU has AVX-VNNI */
void gqa_qk_gemm_s8_dot_avxvnni(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                const void *B, int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_s8_dot_avxvnni(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                                const float *s, float *C, size_t ldc, float beta);
GQA_KERNEL_TABLE_AS(avxvnni, avx2, NULL, gqa_qk_gemm_s8_dot_avxvnni, gqa_sv_gemm_s8_dot_avxvnni, NULL)
#endif
#endif
