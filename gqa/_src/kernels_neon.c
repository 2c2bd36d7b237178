/*
 * kernels_neon.c -- path `neon` (aarch64).  ISA flags: none (Advanced SIMD is
 * part of the aarch64 baseline); the whole file is empty elsewhere.
 *
 * Same operations and layouts as gqa_kernels.h, 4 float32 lanes per vector,
 * elements taken 8 at a time (one pair of vectors):
 *  - quantize: x * (1/s), round-to-nearest-even (vrndnq), clamp by compare
 *    and select so that NaN -> hi (NEON fmin/fmax would keep the NaN);
 *    identical codes to the scalar path.  INT4: nibbles q+8 paired inside
 *    32-bit lanes and narrowed; the row tail (and an odd width's pad nibble 8)
 *    goes through the scalar reference.
 *  - dequantize: code * s, one rounding, bit-identical to the scalar path.
 *  - qk_gemm: register blocks of MB (<= 8) rows of A x NB rows of B.  Each
 *    8-element B chunk is converted to float once and used for every row of
 *    the block.  Per-tensor INT8/INT4 defer the scale: (alpha * s) * sum(a * q).
 *    The K tail is one more step of the same loop on zero-padded copies, and
 *    every accumulator is reduced by vaddvq ((l0 + l1) + (l2 + l3)), so C[m,n]
 *    depends only on row m of A, row n of B and K -- never on M, N or blocking.
 *  - sv_gemm: blocks of MB (<= 8) rows of C x NV * 8 columns; the last partial
 *    8-column chunk runs the same lane operations on zero-padded copies.
 *    Keys go in chunks of a fixed KC per type (16 KiB of B at a head size of
 *    128), so a chunk stays in L1 while every column block reads it and a
 *    column's value never depends on N or M.  beta 0 overwrites C (NaN in C
 *    ignored), beta 1 accumulates, any other beta scales C first.
 *  - qk_gemm_s8_approx: none (the approximate kernel is AVX-512 VNNI only); level 4's integer
 *    dots: kernels_neon_s8dot.c (sdot), levels 3-4's prompt tiles: kernels_neonbf16.c (BFDOT),
 *    in the table where setup.py built them.
 *  - exp_sum: the AVX2 path's exp on 4 lanes (same operations), tail through a
 *    copy padded with -inf.
 *  - row_max: 4-lane compare-and-select maxima, NaN skipped (exact).
 *  - rope_row: 4 pairs a vector (vld2q / vst2q for interleaved ones), vfmaq fused as the
 *    contract states (the scalar path's bits), the last pairs by gqa_rope_pairs.
 *  - hadamard_rows: the statement's bits, 4 blocks' sums in registers, the bit reversal by
 *    4 x 4 transposes (kernels_avx2_hadamard.h's layout).
 *  - per-group rows: quantized by the shared codec (kernels_group.h); qk / sv fused over the
 *    rows (groups of a multiple of 8 columns, rows of a multiple of 32: see "per-group rows,
 *    fused"), otherwise decoded 8 elements at a time (group_decode_row_neon, the reference's
 *    bits) into a tile that the float32 GEMMs read (kernels_group.h's drivers); dequantize
 *    through the same decoder.
 * Packed rows have no alignment: every load and store goes through bytes.
 */
#if defined(__aarch64__)
#include <arm_neon.h>
#include "kernels_common.h"
#include "kernels_group.h"


typedef struct {
    float32x4_t lo, hi;
} f32x8;

/* Element k without the per-tensor scale (what load8 gives for lane k). */
static inline float decode_unscaled(const uint8_t *row, size_t k, int type, const float *s)
{
    static const float one = 1.0f;
    return (type == GQA_S8_PT || type == GQA_S4_PT) ? gqa_decode(row, k, type, &one)
                                                    : gqa_decode(row, k, type, s);
}

/* ---- quantize ------------------------------------------------------------ */

INLINE int32x4_t quant4(float32x4_t x, float32x4_t inv, float32x4_t lo, float32x4_t hi)
{
    float32x4_t q = vrndnq_f32(vmulq_f32(x, inv));
    q = vbslq_f32(vcltq_f32(q, hi), q, hi); /* NaN fails q < hi -> hi */
    q = vbslq_f32(vcgtq_f32(q, lo), q, lo);
    return vcvtq_s32_f32(q); /* q is integral: exact */
}

INLINE float32x4_t inv_scale4(const float *s)
{
    float32x4_t v = vld1q_f32(s);
    float32x4_t one = vdupq_n_f32(1.0f);
    return vbslq_f32(vceqq_f32(v, vdupq_n_f32(0.0f)), one, vdivq_f32(one, v));
}

/* Codes [c, c + 8) of a group row in order (c % 8 == 0), one per u8 lane: element e is bits
   [b * (e % per), +b) of byte e / per (per = 8 / b codes a byte), picked by one table lookup
   and one per-lane shift. */
INLINE uint8x8_t group_codes8_neon(const uint8_t *row, size_t c, const unsigned b)
{
    static const uint8_t idx[3][8] = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 2, 2, 3, 3},
                                      {0, 0, 0, 0, 1, 1, 1, 1}};
    static const int8_t shr[3][8] = {{0, 0, 0, 0, 0, 0, 0, 0}, {0, -4, 0, -4, 0, -4, 0, -4},
                                     {0, -2, -4, -6, 0, -2, -4, -6}};
    const int k = b == 8 ? 0 : b == 4 ? 1 : 2;
    uint64_t w = 0;
    memcpy(&w, row + c * b / 8, b); /* the 8 elements' b bytes */
    return vand_u8(vshl_u8(vtbl1_u8(vcreate_u8(w), vld1_u8(idx[k])), vld1_s8(shr[k])),
                   vdup_n_u8((uint8_t)((1u << b) - 1)));
}

/* Eight codes (u8 lanes) as two float32 vectors (exact). */
INLINE void group_float8(uint8x8_t q, float32x4_t *f)
{
    const uint16x8_t h = vmovl_u8(q);
    f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
    f[1] = vcvtq_f32_u32(vmovl_high_u16(h));
}

/* One group row decoded to float32, 8 elements at a time (group_codes8_neon), then
   x = fl(fl(code * scale) + zero) -- a multiply and an add, never fused: the reference
   decoder's bits.  Groups narrower than 8 columns go through the reference decoder. */
static void group_decode_row_neon(const uint8_t *row, float *dst, size_t cols, int type)
{
    const unsigned b = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type);
    if (g % 8) {
        gqa_group_decode_row_ref(row, dst, cols, type);
        return;
    }
    const uint8_t *meta = row + cols * b / 8;
    for (size_t gi = 0; gi * g < cols; gi++) {
        float sc, zr;
        gqa_group_meta(meta, gi, type, &sc, &zr);
        const float32x4_t s = vdupq_n_f32(sc), z = vdupq_n_f32(zr);
        for (size_t c = gi * g; c < (gi + 1) * g; c += 8) {
            float32x4_t f[2];
            group_float8(group_codes8_neon(row, c, b), f);
            vst1q_f32(dst + c, vaddq_f32(vmulq_f32(f[0], s), z));
            vst1q_f32(dst + c + 4, vaddq_f32(vmulq_f32(f[1], s), z));
        }
    }
}
GQA_GROUP_OPS(neon, group_decode_row_neon)

static void quantize_neon(const float *src, size_t lda, void *dst, size_t rows, size_t cols, int type,
                          const float *s)
{
    if (GQA_IS_GROUP(type)) { gqa_group_quantize(src, lda, dst, rows, cols, type, s); return; }
    const size_t rb = gqa_row_bytes(type, cols);
    if (!GQA_IS_QUANT(type)) {
        for (size_t r = 0; r < rows; r++) {
            const float *x = src + r * lda;
            uint8_t *d = (uint8_t *)dst + r * rb;
            size_t c = 0;
            if (type == GQA_F16)
                for (; c + 4 <= cols; c += 4)
                    vst1_u8(d + 2 * c, vreinterpret_u8_f16(vcvt_f16_f32(vld1q_f32(x + c))));
            gqa_quantize_row_ref(x, d, c, cols, type, s);
        }
        return;
    }
    const int s4 = GQA_IS_S4(type), pc = GQA_IS_PC(type);
    const float32x4_t lo = vdupq_n_f32(s4 ? -8.0f : -128.0f), hi = vdupq_n_f32(s4 ? 7.0f : 127.0f);
    const float32x4_t inv_pt = vdupq_n_f32(gqa_inv_scale(s[0]));
    for (size_t r = 0; r < rows; r++) {
        const float *x = src + r * lda;
        uint8_t *d = (uint8_t *)dst + r * rb;
        size_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            int32x4_t q0 = quant4(vld1q_f32(x + c), pc ? inv_scale4(s + c) : inv_pt, lo, hi);
            int32x4_t q1 = quant4(vld1q_f32(x + c + 4), pc ? inv_scale4(s + c + 4) : inv_pt, lo, hi);
            int16x8_t q16 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1)); /* in range: exact */
            if (!s4) {
                vst1_s8((int8_t *)(d + c), vmovn_s16(q16));
            } else {
                /* nibble n = q + 8; 32-bit lane i = n[2i] | n[2i+1] << 16, and
                   its low byte after n | n >> 12 is n[2i] | n[2i+1] << 4. */
                uint32x4_t n = vreinterpretq_u32_s16(vaddq_s16(q16, vdupq_n_s16(8)));
                uint32x4_t b = vorrq_u32(n, vshrq_n_u32(n, 12));
                uint8x8_t bytes = vmovn_u16(vcombine_u16(vmovn_u32(b), vdup_n_u16(0)));
                uint32_t w = vget_lane_u32(vreinterpret_u32_u8(bytes), 0);
                memcpy(d + c / 2, &w, 4);
            }
        }
        gqa_quantize_row_ref(x, d, c, cols, type, s);
    }
}

/* ---- element loads --------------------------------------------------------- */

/* Elements [k, k + 8) of a packed row as float32 (k % 8 == 0): scaled for
   per-channel types, unscaled codes for per-tensor ones (see gqa_post_scale). */
INLINE f32x8 load8(const uint8_t *row, size_t k, const int type, const float *s)
{
    f32x8 r;
    switch (type) {
    case GQA_S8_PT:
    case GQA_S8_PC: {
        int16x8_t v = vmovl_s8(vreinterpret_s8_u8(vld1_u8(row + k)));
        r.lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
        r.hi = vcvtq_f32_s32(vmovl_high_s16(v));
        break;
    }
    case GQA_S4_PT:
    case GQA_S4_PC: {
        uint32_t w;
        memcpy(&w, row + k / 2, 4);
        uint8x8_t v = vreinterpret_u8_u32(vdup_n_u32(w));
        uint8x8_t e = vzip1_u8(vand_u8(v, vdup_n_u8(0x0F)), vshr_n_u8(v, 4)); /* n0 n1 ... n7 */
        int16x8_t n = vsubq_s16(vreinterpretq_s16_u16(vmovl_u8(e)), vdupq_n_s16(8));
        r.lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(n)));
        r.hi = vcvtq_f32_s32(vmovl_high_s16(n));
        break;
    }
    case GQA_F32:
        r.lo = vreinterpretq_f32_u8(vld1q_u8(row + 4 * k));
        r.hi = vreinterpretq_f32_u8(vld1q_u8(row + 4 * k + 16));
        return r;
    default:
        r.lo = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(row + 2 * k)));
        r.hi = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(row + 2 * k + 8)));
        return r;
    }
    if (type == GQA_S8_PC || type == GQA_S4_PC) {
        r.lo = vmulq_f32(r.lo, vld1q_f32(s + k));
        r.hi = vmulq_f32(r.hi, vld1q_f32(s + k + 4));
    }
    return r;
}

/* Elements [k, k + n) (n < 8) decoded like load8, zero past n. */
static f32x8 load8_tail(const uint8_t *row, size_t k, size_t n, int type, const float *s)
{
    float t[8] = {0};
    for (size_t i = 0; i < n; i++)
        t[i] = decode_unscaled(row, k + i, type, s);
    f32x8 r = {vld1q_f32(t), vld1q_f32(t + 4)};
    return r;
}

/* ---- dequantize ------------------------------------------------------------ */

INLINE void dequant_row(const uint8_t *row, float *d, size_t cols, const int type, const float *s)
{
    const float32x4_t vps = vdupq_n_f32(gqa_post_scale(type, s));
    const int pt = type == GQA_S8_PT || type == GQA_S4_PT;
    size_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        f32x8 v = load8(row, c, type, s);
        vst1q_f32(d + c, pt ? vmulq_f32(v.lo, vps) : v.lo);
        vst1q_f32(d + c + 4, pt ? vmulq_f32(v.hi, vps) : v.hi);
    }
    for (; c < cols; c++)
        d[c] = gqa_decode(row, c, type, s);
}

GQA_DEQUANTIZE_BY_TYPE(neon)

static void dequantize_t_neon(const void *src, float *dst, size_t ldd, size_t rows, size_t cols, int type,
                              const float *s)
{
    if (GQA_IS_GROUP(type)) { group_dequantize_t_neon(src, dst, ldd, rows, cols, type); return; }
    const size_t rb = gqa_row_bytes(type, cols);
    float tmp[256];
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * rb;
        for (size_t c0 = 0; c0 < cols; c0 += 256) {
            size_t nc = cols - c0 < 256 ? cols - c0 : 256;
            deq_rows[type](row + gqa_row_bytes(type, c0), tmp, nc, GQA_IS_PC(type) ? s + c0 : s);
            for (size_t c = 0; c < nc; c++)
                dst[(c0 + c) * ldd + r] = tmp[c];
        }
    }
}

/* ---- qk_gemm ----------------------------------------------------------------- */

/* C[mb, nb] = mult * sum_k A[mb, k] * B[nb, k] for an MB x NB block. */
INLINE void qk_block(const int MB, const int NB, const int type, size_t K, float mult, const float *A,
                     size_t lda, const uint8_t *B, size_t rb, const float *s, float *C, size_t ldc)
{
    float32x4_t acc[16];
    UNROLL
    for (int i = 0; i < MB * NB; i++)
        acc[i] = vdupq_n_f32(0.0f);
    size_t k = 0;
    for (; k + 8 <= K; k += 8) {
        UNROLL
        for (int nb = 0; nb < NB; nb++) {
            f32x8 b = load8(B + nb * rb, k, type, s);
            UNROLL
            for (int mb = 0; mb < MB; mb++) {
                acc[mb * NB + nb] = vfmaq_f32(acc[mb * NB + nb], vld1q_f32(A + mb * lda + k), b.lo);
                acc[mb * NB + nb] = vfmaq_f32(acc[mb * NB + nb], vld1q_f32(A + mb * lda + k + 4), b.hi);
            }
        }
    }
    if (k < K) { /* same step on zero-padded copies: the extra lanes add +-0 */
        const size_t n = K - k;
        float at[8 * 8] = {0};
        for (int mb = 0; mb < MB; mb++)
            memcpy(at + 8 * mb, A + mb * lda + k, n * sizeof(float));
        for (int nb = 0; nb < NB; nb++) {
            f32x8 b = load8_tail(B + nb * rb, k, n, type, s);
            for (int mb = 0; mb < MB; mb++) {
                acc[mb * NB + nb] = vfmaq_f32(acc[mb * NB + nb], vld1q_f32(at + 8 * mb), b.lo);
                acc[mb * NB + nb] = vfmaq_f32(acc[mb * NB + nb], vld1q_f32(at + 8 * mb + 4), b.hi);
            }
        }
    }
    UNROLL
    for (int mb = 0; mb < MB; mb++)
        UNROLL
        for (int nb = 0; nb < NB; nb++)
            C[mb * ldc + nb] = vaddvq_f32(acc[mb * NB + nb]) * mult;
}

/* Block shapes by rows of A: (1,8) (2,8) (3,4) (4,4) (5,2) (6,2) (7,2) (8,2);
   the last N % NB rows of B go one at a time (1 x 1, row by row of A). */
#define QK_INST(T, MB, NB)                                                                         \
    static void qk_##T##_##MB##x##NB(size_t K, float mult, const float *A, size_t lda,             \
                                     const uint8_t *B, size_t rb, const float *s, float *C,        \
                                     size_t ldc)                                                   \
    {                                                                                              \
        qk_block(MB, NB, T, K, mult, A, lda, B, rb, s, C, ldc);                                    \
    }
#define QK_TYPE(T)                                                                                  \
    QK_INST(T, 1, 8) QK_INST(T, 2, 8) QK_INST(T, 3, 4) QK_INST(T, 4, 4) QK_INST(T, 5, 2)            \
    QK_INST(T, 6, 2) QK_INST(T, 7, 2) QK_INST(T, 8, 2) QK_INST(T, 1, 1)
#define QK_ROW(T) {qk_##T##_1x1, qk_##T##_1x8, qk_##T##_2x8, qk_##T##_3x4, qk_##T##_4x4,            \
                   qk_##T##_5x2, qk_##T##_6x2, qk_##T##_7x2, qk_##T##_8x2}
QK_TYPE(GQA_S8_PT) QK_TYPE(GQA_S8_PC) QK_TYPE(GQA_S4_PT) QK_TYPE(GQA_S4_PC) QK_TYPE(GQA_F32)
QK_TYPE(GQA_F16)

typedef void (*qk_fn)(size_t, float, const float *, size_t, const uint8_t *, size_t, const float *,
                      float *, size_t);
static const qk_fn qk_blocks[6][9] = {QK_ROW(GQA_S8_PT), QK_ROW(GQA_S8_PC), QK_ROW(GQA_S4_PT),
                                      QK_ROW(GQA_S4_PC), QK_ROW(GQA_F32), QK_ROW(GQA_F16)};
static const int qk_nbs[9] = {1, 8, 8, 4, 4, 2, 2, 2, 2};

/* ---- per-group rows, fused (groups of a multiple of 8 columns, rows of a multiple of 32) ----
 * Each block of elements is formed as fma(code, scale, zero) in registers (one rounding;
 * gqa.dequantize keeps the contract's two) and used at once by every row of A, in the 8-byte
 * blocks of kernels_group.h (gqa_group_block8).  A is put in the blocks' order once per call
 * (qk), the accumulated columns back in column order once per call (sv).  QK sums each (row of
 * A, row of B) into one 4-lane accumulator in a fixed order and reduces it by vaddvq; SV
 * accumulates 32-column blocks over the keys in order: C[m, n] depends only on row m of A, row
 * (qk) or column (sv) n of B and K. */

INLINE void group_meta_neon(const uint8_t *meta, size_t gi, int type, float32x4_t *s, float32x4_t *z)
{
    float32x4_t f;
    if (type & GQA_META_F16) {
        uint32_t w;
        memcpy(&w, meta + 4 * gi, 4);
        f = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(w))); /* s z s z */
    } else {
        f = vcombine_f32(vld1_f32((const float *)(const void *)(meta + 8 * gi)), vdup_n_f32(0.0f));
    }
    *s = vdupq_laneq_f32(f, 0);
    *z = vdupq_laneq_f32(f, 1);
}

/* Eight codes (u8 lanes) as two vectors of fma(code, s, z). */
INLINE void group_values8(uint8x8_t q, float32x4_t s, float32x4_t z, float32x4_t *x)
{
    float32x4_t f[2];
    group_float8(q, f);
    x[0] = vfmaq_f32(z, f[0], s);
    x[1] = vfmaq_f32(z, f[1], s);
}

/* The block at element c of a row (its group's s, z broadcast): blk / 4 vectors. */
INLINE void group_decode_blk(const uint8_t *row, size_t c, const float32x4_t s, const float32x4_t z,
                             const unsigned b, const int ORD, float32x4_t *x)
{
    if (b == 8) {
        group_values8(vld1_u8(row + c), s, z, x);
    } else if (!ORD) { /* 8 codes in order */
        group_values8(group_codes8_neon(row, c, b), s, z, x);
    } else if (b == 4) {
        const uint8x8_t v = vld1_u8(row + c / 2);
        group_values8(vand_u8(v, vdup_n_u8(0x0F)), s, z, x);
        group_values8(vshr_n_u8(v, 4), s, z, x + 2);
    } else {
        const uint8x8_t v = vld1_u8(row + c / 4), three = vdup_n_u8(3);
        group_values8(vand_u8(v, three), s, z, x);
        group_values8(vand_u8(vshr_n_u8(v, 2), three), s, z, x + 2);
        group_values8(vand_u8(vshr_n_u8(v, 4), three), s, z, x + 4);
        group_values8(vshr_n_u8(v, 6), s, z, x + 6);
    }
}

/* C = alpha A B^T for MB rows of A (prepared: the blocks' order) and rows of B NB at a time
   (MB * NB = 8); rows past N repeat the block's first row (computed, never stored); ms rows
   of C are stored. */
INLINE void group_qk_blk_neon(const int MB, const int NB, const unsigned b, const int ORD, size_t N, size_t K,
                              float alpha, const float *Ap, const uint8_t *B, int type, float *C, size_t ldc,
                              size_t ms)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, K), cb = K * b / 8;
    const size_t blk = gqa_group_block8(b, ORD);
    const int nv = (int)(blk / 4);
    for (size_t n0 = 0; n0 < N; n0 += NB) {
        const size_t nb = N - n0 < (size_t)NB ? N - n0 : (size_t)NB;
        float32x4_t acc[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            acc[i] = vdupq_n_f32(0.0f);
        UNROLL
        for (int r = 0; r < NB; r++) {
            const uint8_t *row = B + (n0 + ((size_t)r < nb ? (size_t)r : 0)) * rb;
            __builtin_prefetch(row + 4096);
            for (size_t c0 = 0, gi = 0; c0 < K; c0 += g, gi++) {
                float32x4_t s, z;
                group_meta_neon(row + cb, gi, type, &s, &z);
                for (size_t c = c0; c < c0 + g; c += blk) {
                    float32x4_t x[8];
                    group_decode_blk(row, c, s, z, b, ORD, x);
                    UNROLL
                    for (int v = 0; v < nv; v++)
                        UNROLL
                        for (int m = 0; m < MB; m++)
                            acc[m * NB + r] = vfmaq_f32(acc[m * NB + r], vld1q_f32(Ap + m * K + c + 4 * v), x[v]);
                }
            }
        }
        for (size_t m = 0; m < ms; m++)
            for (size_t r = 0; r < nb; r++)
                C[m * ldc + n0 + r] = vaddvq_f32(acc[m * NB + r]) * alpha;
    }
}

/* SV over columns [c0, c0 + 32) for MB (1 or 2) rows of A: the K keys added to the sums T (GQA_GROUP_FUSED). */
INLINE void group_sv_blk_neon(const int MB, const unsigned b, const int ORD, size_t N, size_t K, const float *A,
                              size_t lda, const uint8_t *B, int type, float *T, size_t ldt, int first, size_t c0)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, N), cb = N * b / 8;
    const int blk = (int)gqa_group_block8(b, ORD), nv = blk / 4, nbk = 32 / blk;
    size_t gidx[4]; /* the group of each block (divisions once per call, not per key) */
    for (int j = 0; j < nbk; j++)
        gidx[j] = (c0 + (size_t)(j * blk)) / g;
    float32x4_t acc[2][8];
    UNROLL
    for (int m = 0; m < MB; m++)
        UNROLL
        for (int v = 0; v < 8; v++)
            acc[m][v] = first ? vdupq_n_f32(0.0f) : vld1q_f32(T + m * ldt + c0 + 4 * v);
    for (size_t k = 0; k < K; k++) {
        const uint8_t *row = B + k * rb;
        __builtin_prefetch(row + c0 * b / 8 + 4096);
        float32x4_t p[2], s = vdupq_n_f32(0.0f), z = s;
        UNROLL
        for (int m = 0; m < MB; m++)
            p[m] = vdupq_n_f32(A[m * lda + k]);
        UNROLL
        for (int j = 0; j < nbk; j++) {
            float32x4_t x[8];
            if (j == 0 || gidx[j] != gidx[j - 1])
                group_meta_neon(row + cb, gidx[j], type, &s, &z);
            group_decode_blk(row, c0 + (size_t)(j * blk), s, z, b, ORD, x);
            UNROLL
            for (int v = 0; v < nv; v++)
                UNROLL
                for (int m = 0; m < MB; m++)
                    acc[m][j * nv + v] = vfmaq_f32(acc[m][j * nv + v], x[v], p[m]);
        }
    }
    UNROLL
    for (int m = 0; m < MB; m++)
        UNROLL
        for (int v = 0; v < 8; v++)
            vst1q_f32(T + m * ldt + c0 + 4 * v, acc[m][v]);
}

#define group_sv_blk_neon_1(...) group_sv_blk_neon(1, __VA_ARGS__)
#define group_sv_blk_neon_2(...) group_sv_blk_neon(2, __VA_ARGS__)
GQA_GROUP_FUSED(neon, group_qk_blk_neon, group_sv_blk_neon)

static void qk_gemm_neon(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                         const void *B, int type, const float *s, float *C, size_t ldc)
{
    GQA_GROUP_ENTRY(neon, qk, group_fast_neon(type, K), GQA_QK_ARGS)
    const size_t rb = gqa_row_bytes(type, K);
    const float mult = alpha * gqa_post_scale(type, s);
    const uint8_t *Bb = (const uint8_t *)B;
    const qk_fn *fns = qk_blocks[type];
    if (K == 0) { /* contract: C zero-filled */
        for (size_t m = 0; m < M; m++)
            memset(C + m * ldc, 0, N * sizeof(float));
        return;
    }
    for (size_t m0 = 0; m0 < M; m0 += 8) {
        const int mb = (int)(M - m0 < 8 ? M - m0 : 8);
        const size_t nb = (size_t)qk_nbs[mb];
        const float *a = A + m0 * lda;
        float *c = C + m0 * ldc;
        size_t n = 0;
        for (; n + nb <= N; n += nb)
            fns[mb](K, mult, a, lda, Bb + n * rb, rb, s, c + n, ldc);
        for (; n < N; n++)
            for (int i = 0; i < mb; i++)
                fns[0](K, mult, a + i * lda, lda, Bb + n * rb, rb, s, c + i * ldc + n, ldc);
    }
}

/* ---- sv_gemm ----------------------------------------------------------------- */

/* C[mb, n0 + j] += mult * sum_{k0 <= k < k1} A[mb, k] * B[k, n0 + j] for an
   MB x (NV * 8) block; with `part`, NV == 1 and only the first n (< 8)
   columns exist (decoded into zero-padded copies, stored lane by lane). */
INLINE void sv_block(const int MB, const int NV, const int type, const int part, size_t n, size_t k0,
                     size_t k1, const float *A, size_t lda, const uint8_t *B, size_t rb, size_t n0,
                     const float *s, float mult, float *C, size_t ldc)
{
    f32x8 acc[24];
    UNROLL
    for (int i = 0; i < MB * NV; i++)
        acc[i].lo = acc[i].hi = vdupq_n_f32(0.0f);
    for (size_t k = k0; k < k1; k++) {
        const uint8_t *row = B + k * rb;
        f32x8 b[4];
        UNROLL
        for (int v = 0; v < NV; v++)
            b[v] = part ? load8_tail(row, n0, n, type, s) : load8(row, n0 + 8 * v, type, s);
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            const float32x4_t a = vdupq_n_f32(A[mb * lda + k]);
            UNROLL
            for (int v = 0; v < NV; v++) {
                acc[mb * NV + v].lo = vfmaq_f32(acc[mb * NV + v].lo, a, b[v].lo);
                acc[mb * NV + v].hi = vfmaq_f32(acc[mb * NV + v].hi, a, b[v].hi);
            }
        }
    }
    const float32x4_t vm = vdupq_n_f32(mult);
    UNROLL
    for (int mb = 0; mb < MB; mb++)
        UNROLL
        for (int v = 0; v < NV; v++) {
            float *c = C + mb * ldc + n0 + 8 * v;
            if (part) {
                float t[8] = {0};
                memcpy(t, c, n * sizeof(float));
                vst1q_f32(t, vfmaq_f32(vld1q_f32(t), acc[mb].lo, vm));
                vst1q_f32(t + 4, vfmaq_f32(vld1q_f32(t + 4), acc[mb].hi, vm));
                memcpy(c, t, n * sizeof(float));
            } else {
                vst1q_f32(c, vfmaq_f32(vld1q_f32(c), acc[mb * NV + v].lo, vm));
                vst1q_f32(c + 4, vfmaq_f32(vld1q_f32(c + 4), acc[mb * NV + v].hi, vm));
            }
        }
}

/* Wide blocks MB x NV: (1, 2) x 4, (3) x 3, (4..6) x 2, (7, 8) x 1; then
   8-column chunks, then the partial chunk. */
#define SV_INST(T, MB, NV)                                                                          \
    static void sv_##T##_##MB##x##NV(size_t n, size_t k0, size_t k1, const float *A, size_t lda,    \
                                     const uint8_t *B, size_t rb, size_t n0, const float *s,        \
                                     float mult, float *C, size_t ldc)                              \
    {                                                                                               \
        sv_block(MB, NV, T, 0, n, k0, k1, A, lda, B, rb, n0, s, mult, C, ldc);                      \
    }                                                                                               \
    static void sv1_##T##_##MB(size_t n, size_t k0, size_t k1, const float *A, size_t lda,          \
                               const uint8_t *B, size_t rb, size_t n0, const float *s, float mult,  \
                               float *C, size_t ldc)                                                \
    {                                                                                               \
        sv_block(MB, 1, T, 0, n, k0, k1, A, lda, B, rb, n0, s, mult, C, ldc);                       \
    }                                                                                               \
    static void svp_##T##_##MB(size_t n, size_t k0, size_t k1, const float *A, size_t lda,          \
                               const uint8_t *B, size_t rb, size_t n0, const float *s, float mult,  \
                               float *C, size_t ldc)                                                \
    {                                                                                               \
        sv_block(MB, 1, T, 1, n, k0, k1, A, lda, B, rb, n0, s, mult, C, ldc);                       \
    }
#define SV_TYPE(T)                                                                                  \
    SV_INST(T, 1, 4) SV_INST(T, 2, 4) SV_INST(T, 3, 3) SV_INST(T, 4, 2) SV_INST(T, 5, 2)            \
    SV_INST(T, 6, 2) SV_INST(T, 7, 1) SV_INST(T, 8, 1)
#define SV_ROW(P, T) {0, P##_##T##_1, P##_##T##_2, P##_##T##_3, P##_##T##_4, P##_##T##_5,            \
                      P##_##T##_6, P##_##T##_7, P##_##T##_8}
#define SV_WIDE(T) {0, sv_##T##_1x4, sv_##T##_2x4, sv_##T##_3x3, sv_##T##_4x2, sv_##T##_5x2,         \
                    sv_##T##_6x2, sv_##T##_7x1, sv_##T##_8x1}
SV_TYPE(GQA_S8_PT) SV_TYPE(GQA_S8_PC) SV_TYPE(GQA_S4_PT) SV_TYPE(GQA_S4_PC) SV_TYPE(GQA_F32)
SV_TYPE(GQA_F16)

typedef void (*sv_fn)(size_t, size_t, size_t, const float *, size_t, const uint8_t *, size_t, size_t,
                      const float *, float, float *, size_t);
static const sv_fn sv_wide[6][9] = {SV_WIDE(GQA_S8_PT), SV_WIDE(GQA_S8_PC), SV_WIDE(GQA_S4_PT),
                                    SV_WIDE(GQA_S4_PC), SV_WIDE(GQA_F32), SV_WIDE(GQA_F16)};
static const sv_fn sv_one[6][9] = {SV_ROW(sv1, GQA_S8_PT), SV_ROW(sv1, GQA_S8_PC), SV_ROW(sv1, GQA_S4_PT),
                                   SV_ROW(sv1, GQA_S4_PC), SV_ROW(sv1, GQA_F32), SV_ROW(sv1, GQA_F16)};
static const sv_fn sv_part[6][9] = {SV_ROW(svp, GQA_S8_PT), SV_ROW(svp, GQA_S8_PC), SV_ROW(svp, GQA_S4_PT),
                                    SV_ROW(svp, GQA_S4_PC), SV_ROW(svp, GQA_F32), SV_ROW(svp, GQA_F16)};
static const int sv_nvs[9] = {0, 4, 4, 3, 2, 2, 2, 1, 1};
/* Keys per chunk: 16 KiB of B at N = 128; fixed per type so that the chunk
   boundaries (where partial sums meet C) never depend on N. */
static const size_t sv_kc[6] = {128, 128, 256, 256, 32, 64};

static void sv_gemm_neon(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                         int type, const float *s, float *C, size_t ldc, float beta)
{
    GQA_GROUP_ENTRY(neon, sv, group_fast_neon(type, N), GQA_SV_ARGS)
    const size_t rb = gqa_row_bytes(type, N);
    const uint8_t *Bb = (const uint8_t *)B;
    const float mult = gqa_post_scale(type, s);
    for (size_t m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (beta == 0.0f)
            memset(c, 0, N * sizeof(float));
        else if (beta != 1.0f)
            for (size_t n = 0; n < N; n++)
                c[n] *= beta;
    }
    const size_t kc = sv_kc[type];
    const size_t nfull = N & ~(size_t)7;
    for (size_t k0 = 0; k0 < K; k0 += kc) {
        const size_t k1 = K - k0 < kc ? K : k0 + kc;
        for (size_t m0 = 0; m0 < M; m0 += 8) {
            const int mb = (int)(M - m0 < 8 ? M - m0 : 8);
            const float *a = A + m0 * lda;
            float *c = C + m0 * ldc;
            const size_t step = 8 * (size_t)sv_nvs[mb];
            size_t n = 0;
            for (; n + step <= nfull; n += step)
                sv_wide[type][mb](8, k0, k1, a, lda, Bb, rb, n, s, mult, c, ldc);
            for (; n < nfull; n += 8)
                sv_one[type][mb](8, k0, k1, a, lda, Bb, rb, n, s, mult, c, ldc);
            if (n < N)
                sv_part[type][mb](N - n, k0, k1, a, lda, Bb, rb, n, s, mult, c, ldc);
        }
    }
}

/* ---- exp_sum ---------------------------------------------------------------------- */

/* exp(d), the AVX2 path's exp8 on 4 lanes (same operations): d = n ln2 + r,
   |r| <= ln2/2 (two-constant Cody-Waite), exp(r) by the degree-6 Cephes expf
   polynomial (~1 ulp), times 2^n built in the exponent field.  d below
   GQA_EXP_MIN (and -inf) gives exactly +0; NaN stays NaN (fmax / fmin propagate
   it, the compare is false). */
INLINE float32x4_t exp4(float32x4_t d)
{
    const uint32x4_t below = vcltq_f32(d, vdupq_n_f32(GQA_EXP_MIN));
    d = vmaxq_f32(d, vdupq_n_f32(GQA_EXP_MIN));
    d = vminq_f32(d, vdupq_n_f32(GQA_EXP_MAX));
    const float32x4_t n = vrndnq_f32(vmulq_f32(d, vdupq_n_f32(GQA_EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(d, n, vdupq_n_f32(GQA_EXP_LN2_HI)); /* d - n * c, fused */
    r = vfmsq_f32(r, n, vdupq_n_f32(GQA_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(GQA_EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(GQA_EXP_P1), p, r); /* p * r + c, fused */
    p = vfmaq_f32(vdupq_n_f32(GQA_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(GQA_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(GQA_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(GQA_EXP_P5), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    /* n is integral (or NaN: 0 here, and p is NaN anyway) */
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), below));
}

/* x[i] = exp(x[i] - m); the sum in 8 lanes (two vectors, like the AVX2 path's
   one), the tail through a copy padded with -inf (exp gives +0 there). */
static float exp_sum_neon(float *x, size_t n, float m)
{
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t e0 = exp4(vsubq_f32(vld1q_f32(x + i), vm));
        float32x4_t e1 = exp4(vsubq_f32(vld1q_f32(x + i + 4), vm));
        vst1q_f32(x + i, e0);
        vst1q_f32(x + i + 4, e1);
        acc0 = vaddq_f32(acc0, e0);
        acc1 = vaddq_f32(acc1, e1);
    }
    if (i < n) {
        float buf[8];
        const size_t rem = n - i;
        for (size_t k = 0; k < 8; k++)
            buf[k] = k < rem ? x[i + k] - m : -INFINITY;
        float32x4_t e0 = exp4(vld1q_f32(buf)), e1 = exp4(vld1q_f32(buf + 4));
        vst1q_f32(buf, e0);
        vst1q_f32(buf + 4, e1);
        acc0 = vaddq_f32(acc0, e0);
        acc1 = vaddq_f32(acc1, e1);
        memcpy(x + i, buf, rem * sizeof(float));
    }
    float out[8];
    vst1q_f32(out, acc0);
    vst1q_f32(out + 4, acc1);
    return ((out[0] + out[1]) + (out[2] + out[3])) + ((out[4] + out[5]) + (out[6] + out[7]));
}

/* ---- row_max ---------------------------------------------------------------------- */

/* m = x > m ? x : m lane by lane (compare and select: vmaxq would propagate NaN);
   four independent maxima, the tail in scalar. */
static float row_max_neon(const float *x, size_t n)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    float32x4_t m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
#define GQA_MAX4(m, p) do { float32x4_t v_ = vld1q_f32(p); m = vbslq_f32(vcgtq_f32(v_, m), v_, m); } while (0)
    for (; i + 16 <= n; i += 16) {
        GQA_MAX4(m0, x + i);
        GQA_MAX4(m1, x + i + 4);
        GQA_MAX4(m2, x + i + 8);
        GQA_MAX4(m3, x + i + 12);
    }
    for (; i + 4 <= n; i += 4)
        GQA_MAX4(m0, x + i);
#undef GQA_MAX4
    float buf[16];
    vst1q_f32(buf, m0);
    vst1q_f32(buf + 4, m1);
    vst1q_f32(buf + 8, m2);
    vst1q_f32(buf + 12, m3);
    return gqa_max_of(x + i, n - i, gqa_max_of(buf, 16, -INFINITY));
}

/* ---- rope_row ---------------------------------------------------------------------- */

/* gqa_rope_pairs' bits, 4 pairs a vector (interleaved ones split by vld2q / joined by vst2q):
   x0' = vfmaq(-(x1 s), x0, c), x1' = vfmaq(x1 c, x0, s), fused; each vector's loads before its
   stores (o may be x); the last r2 % 4 pairs by gqa_rope_pairs. */
static void rope_row_neon(size_t r2, int interleaved, const float *x, const float *c, const float *s, float *o)
{
    size_t i = 0;
    for (; i + 4 <= r2; i += 4) {
        const float32x4_t vc = vld1q_f32(c + i), vs = vld1q_f32(s + i);
        float32x4x2_t v;
        if (interleaved)
            v = vld2q_f32(x + 2 * i);
        else
            v.val[0] = vld1q_f32(x + i), v.val[1] = vld1q_f32(x + r2 + i);
        float32x4x2_t r;
        r.val[0] = vfmaq_f32(vnegq_f32(vmulq_f32(v.val[1], vs)), v.val[0], vc);
        r.val[1] = vfmaq_f32(vmulq_f32(v.val[1], vc), v.val[0], vs);
        if (interleaved) {
            vst2q_f32(o + 2 * i, r);
        } else {
            vst1q_f32(o + i, r.val[0]);
            vst1q_f32(o + r2 + i, r.val[1]);
        }
    }
    gqa_rope_pairs(i, r2, interleaved, x, c, s, o);
}

/* ---- hadamard_rows ----------------------------------------------------------------- */

/* gqa_hadamard_rows' statement and bits, 4 lanes a vector (the layout of kernels_avx2_hadamard.h:
   element 16 q + k of the Sylvester product w lands at o[rev4(k) m + rev_m(q)], m = H / 16):
   w[i0 + 16 q + k] = x_(i0 + 16 q) + sum_{l = 1..15} x_(i0 + 16 q + l) sy[l][k] in that order (one
   fused vfmaq_n per step: +-1 products are exact), x_e = xr[e] (ix NULL) or xr[ix[e]], four
   blocks' chains at once, then their butterflies at distances 16 and 32 in registers. */
INLINE void had_blocks_neon(int NB, const float *xr, const int32_t *ix, float *w, size_t i0,
                            const float (*sy)[16])
{
    float32x4_t v[4][4];
    UNROLL for (int q = 0; q < NB; q++) {
        const size_t e = i0 + 16 * (size_t)q;
        const float x0 = ix ? xr[ix[e]] : xr[e];
        UNROLL for (int u = 0; u < 4; u++)
            v[q][u] = vmulq_n_f32(vdupq_n_f32(1.0f), x0);
    }
    UNROLL for (int l = 1; l < 16; l++) {
        float32x4_t sl[4];
        UNROLL for (int u = 0; u < 4; u++)
            sl[u] = vld1q_f32(sy[l] + 4 * u);
        UNROLL for (int q = 0; q < NB; q++) {
            const size_t e = i0 + 16 * (size_t)q + (size_t)l;
            const float xl = ix ? xr[ix[e]] : xr[e];
            UNROLL for (int u = 0; u < 4; u++)
                v[q][u] = vfmaq_n_f32(v[q][u], sl[u], xl);
        }
    }
    UNROLL for (int d = 1; d < NB; d <<= 1)
        UNROLL for (int q = 0; q < NB; q++)
            if (!(q & d))
                UNROLL for (int u = 0; u < 4; u++) {
                    const float32x4_t a = v[q][u], b = v[q + d][u];
                    v[q][u] = vaddq_f32(a, b);
                    v[q + d][u] = vsubq_f32(a, b);
                }
    UNROLL for (int q = 0; q < NB; q++)
        UNROLL for (int u = 0; u < 4; u++)
            vst1q_f32(w + i0 + 16 * q + 4 * u, v[q][u]);
}

/* The `+had` rotation: heads below 16 by gqa_hadamard_rows; the blocks (had_blocks_neon), the
   butterflies at 64 .. H / 2 over the row, then o = c w (inverse: the inputs were read in the order
   x[rev(e)]) or, H >= 64, o[rev[k] + a] = c w[16 rev[16 a] + k] (rev[k] = rev4(k) m, rev[16 a] =
   rev_m(a)) by 4 x 4 transposes of rows rev_m(a) .. rev_m(a + 3), H = 16, 32 element by element. */
static void hadamard_rows_neon(size_t n, size_t H, const float *x, size_t ldx, float *o, size_t ldo,
                               float c, int inverse)
{
    if (H < 16) {
        gqa_hadamard_rows(n, H, x, ldx, o, ldo, c, inverse);
        return;
    }
    const float (*sy)[16] = gqa_sylvester16();
    float w[GQA_ROT_MAX];
    int32_t rev[GQA_ROT_MAX];
    const size_t m = H / 16;
    size_t r, i, h, j;
    gqa_bit_reversal(H, rev);
    for (r = 0; r < n; r++) {
        const float *xr = x + r * ldx;
        float *orow = o + r * ldo;
        GQA_HAD_ROW_BLOCKS(had_blocks_neon, H, xr, rev, inverse, w, sy);
        for (h = 64; h < H; h <<= 1)
            for (i = 0; i < H; i += 2 * h)
                for (j = i; j < i + h; j += 4) {
                    const float32x4_t a = vld1q_f32(w + j), b = vld1q_f32(w + j + h);
                    vst1q_f32(w + j, vaddq_f32(a, b));
                    vst1q_f32(w + j + h, vsubq_f32(a, b));
                }
        if (inverse) {
            for (i = 0; i < H; i += 4)
                vst1q_f32(orow + i, vmulq_n_f32(vld1q_f32(w + i), c));
        } else if (H >= 64) {
            for (size_t a = 0; a < m; a += 4) {
                const float *r0 = w + 16 * rev[16 * a], *r1 = w + 16 * rev[16 * (a + 1)];
                const float *r2 = w + 16 * rev[16 * (a + 2)], *r3 = w + 16 * rev[16 * (a + 3)];
                for (size_t k = 0; k < 16; k += 4) {
                    const float32x4x2_t t0 = vtrnq_f32(vld1q_f32(r0 + k), vld1q_f32(r1 + k));
                    const float32x4x2_t t1 = vtrnq_f32(vld1q_f32(r2 + k), vld1q_f32(r3 + k));
                    const float32x4_t col[4] = {
                        vcombine_f32(vget_low_f32(t0.val[0]), vget_low_f32(t1.val[0])),
                        vcombine_f32(vget_low_f32(t0.val[1]), vget_low_f32(t1.val[1])),
                        vcombine_f32(vget_high_f32(t0.val[0]), vget_high_f32(t1.val[0])),
                        vcombine_f32(vget_high_f32(t0.val[1]), vget_high_f32(t1.val[1]))};
                    UNROLL for (int u = 0; u < 4; u++)
                        vst1q_f32(orow + rev[k + (size_t)u] + a, vmulq_n_f32(col[u], c));
                }
            }
        } else {
            for (i = 0; i < H; i++)
                orow[i] = c * w[rev[i]];
        }
    }
}

/* The tiles: Arm BFloat16 dot products (kernels_neonbf16.c) */
#ifdef GQA_HAVE_NEONBF16
extern const gqa_tiles gqa_tiles_neonbf16;
static const gqa_tiles *const tiles_neon[] = {&gqa_tiles_neonbf16, NULL};
#define TILES_NEON tiles_neon
#else
#define TILES_NEON NULL
#endif
#ifdef GQA_HAVE_NEON_S8DOT /* accuracy level 4's integer dots: kernels_neon_s8dot.c */
void gqa_qk_gemm_s8_dot_neon(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                             int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_s8_dot_neon(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                             const float *s, float *C, size_t ldc, float beta);
GQA_KERNEL_TABLE(neon, NULL, gqa_qk_gemm_s8_dot_neon, gqa_sv_gemm_s8_dot_neon, TILES_NEON)
#else
GQA_KERNEL_TABLE(neon, NULL, NULL, NULL, TILES_NEON)
#endif
#endif
