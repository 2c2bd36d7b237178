/*
 * kernels_neonbf16.c -- bfloat16 tiles for the flash prompt tiles at accuracy level >= 3
 * (gqa_tiles in gqa_kernels.h) on the Arm BFloat16 extension's dot product (BFDOT): bfloat16
 * operands, float32 sums.  ISA flags: -march=armv8.2-a+bf16 (a unit of the neon path; setup.py
 * defines GQA_HAVE_NEONBF16 for kernels_neon.c, whose table lists these tiles); the dispatch runs
 * them only where the kernel reports the extension (HWCAP2_BF16, GQA_CPU_BF16).  Empty elsewhere
 * than aarch64.
 *
 * Operand layouts and packing: kernels_avx512bf16.c's, the same bits (rows, pairs, pairs_t; the
 * rounding of bf16_ref: to nearest, ties to even, NaN quieted, subnormal inputs as signed zero),
 * done here with integer vector operations.
 *   exp_pack  e_i = exp(x[i] - m) within 2^-16 relative (the AVX-512 unit's polynomial;
 *         arguments below -86.6, -inf included, give 0, so no result is subnormal; NaN stays
 *         NaN) for i < n, their float32 sum returned, their bfloat16 as a row of A (zeros past
 *         n, to n_pad), and in x where `store`.
 *   gemm  C[M, N] = (acc ? C : 0) + A[M, K] B[K, N], A rows, B pairs; M and N multiples of 16,
 *         K of 32.  BFDOT adds to each float32 lane the two products of a pair (bfloat16 inputs
 *         exact in float32), their sum rounded once (to odd, without FEAT_EBF16) and the lane's
 *         sum once more: a C element is a float32 sum of its K / 2 pair sums in order of k, each
 *         within 2^-23 of its exact value, with at most K / 2 further roundings of 2^-24 --
 *         within (K / 2 + 2) 2^-24 sum|a b| of the exact sum, inside the tiles' stated (K + 2)
 *         2^-24 (subnormal inputs and results flushed to zero).
 */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>
#include "kernels_common.h"

/* bf16_ref on 4 lanes: to nearest even, NaN quieted, a zero exponent (zero, subnormal) to the
   sign's zero. */
static inline uint16x4_t bf16x4(float32x4_t x)
{
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t tiny = vceqq_u32(vandq_u32(u, vdupq_n_u32(0x7F800000u)), vdupq_n_u32(0));
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
    const uint32x4_t rne = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7FFFu), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))));
    uint32x4_t r = vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x00400000u)), rne);
    r = vbslq_u32(tiny, vandq_u32(u, vdupq_n_u32(0x80000000u)), r);
    return vshrn_n_u32(r, 16);
}

/* 8 floats of row s from column c (zeros past cols). */
static inline void cols8(const float *s, size_t c, size_t cols, float32x4_t *lo, float32x4_t *hi)
{
    if (c + 8 <= cols) {
        *lo = vld1q_f32(s + c);
        *hi = vld1q_f32(s + c + 4);
        return;
    }
    float t[8] = {0};
    if (c < cols)
        memcpy(t, s + c, (cols - c) * sizeof(float));
    *lo = vld1q_f32(t);
    *hi = vld1q_f32(t + 4);
}

/* Row s's bfloat16 for columns [0, cols_pad) (zeros past cols) into d; cols_pad a multiple of 8
   or the row's last partial 8 through a copy. */
static void pack_row(const float *s, size_t cols, size_t cols_pad, uint16_t *d)
{
    for (size_t c = 0; c < cols_pad; c += 8) {
        float32x4_t lo, hi;
        cols8(s, c, cols, &lo, &hi);
        const uint16x8_t b = vcombine_u16(bf16x4(lo), bf16x4(hi));
        if (c + 8 <= cols_pad) {
            vst1q_u16(d + c, b);
        } else {
            uint16_t t[8];
            vst1q_u16(t, b);
            memcpy(d + c, t, (cols_pad - c) * sizeof(uint16_t));
        }
    }
}

static void pack_rows_neonbf16(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                               size_t cols_pad, uint16_t *dst)
{
    for (size_t r = 0; r < rows_pad; r++) {
        if (r < rows)
            pack_row(src + r * lds, cols, cols_pad, dst + r * cols_pad);
        else
            memset(dst + r * cols_pad, 0, cols_pad * sizeof(uint16_t));
    }
}

static void pack_pairs_neonbf16(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                                size_t cols_pad, uint32_t *dst)
{
    for (size_t p = 0; 2 * p < rows_pad; p++) {
        uint32_t *d = dst + p * cols_pad;
        const size_t r = 2 * p;
        if (r >= rows) {
            memset(d, 0, cols_pad * sizeof(uint32_t));
            continue;
        }
        const float *s0 = src + r * lds, *s1 = s0 + lds;
        const int two = r + 1 < rows;
        for (size_t c = 0; c < cols_pad; c += 8) {
            float32x4_t a[2], b[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            cols8(s0, c, cols, &a[0], &a[1]);
            if (two)
                cols8(s1, c, cols, &b[0], &b[1]);
            uint32_t t[8];
            for (int h = 0; h < 2; h++) { /* (row 2p, row 2p + 1) per column: low, high half */
                const uint16x4x2_t z = vzip_u16(bf16x4(a[h]), bf16x4(b[h]));
                vst1q_u32(t + 4 * h, vreinterpretq_u32_u16(vcombine_u16(z.val[0], z.val[1])));
            }
            memcpy(d + c, t, (cols_pad - c < 8 ? cols_pad - c : 8) * sizeof(uint32_t));
        }
    }
}

/* rows_pad a multiple of 16 and cols_pad of 32 (the interface's): per 4 rows x 8 columns, each
   row's 4 pairs of columns are one uint32x4; a 4 x 4 transpose makes them the 4 rows of pair p. */
static void pack_pairs_t_neonbf16(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                                  size_t cols_pad, uint32_t *dst)
{
    for (size_t r0 = 0; r0 < rows_pad; r0 += 4)
        for (size_t c = 0; c < cols_pad; c += 8) {
            uint32x4_t v[4];
            for (int i = 0; i < 4; i++) {
                const size_t r = r0 + i;
                float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
                if (r < rows)
                    cols8(src + r * lds, c, cols, &lo, &hi);
                v[i] = vreinterpretq_u32_u16(vcombine_u16(bf16x4(lo), bf16x4(hi))); /* pairs c/2 .. c/2 + 3 */
            }
            const uint32x4x2_t a = vtrnq_u32(v[0], v[1]), b = vtrnq_u32(v[2], v[3]);
            const uint32x4_t t[4] = {
                vreinterpretq_u32_u64(vzip1q_u64(vreinterpretq_u64_u32(a.val[0]), vreinterpretq_u64_u32(b.val[0]))),
                vreinterpretq_u32_u64(vzip1q_u64(vreinterpretq_u64_u32(a.val[1]), vreinterpretq_u64_u32(b.val[1]))),
                vreinterpretq_u32_u64(vzip2q_u64(vreinterpretq_u64_u32(a.val[0]), vreinterpretq_u64_u32(b.val[0]))),
                vreinterpretq_u32_u64(vzip2q_u64(vreinterpretq_u64_u32(a.val[1]), vreinterpretq_u64_u32(b.val[1])))};
            for (int e = 0; e < 4; e++)
                vst1q_u32(dst + (c / 2 + e) * rows_pad + r0, t[e]);
        }
}

/* exp(x - m) = 2^t, t = (x - m) log2(e): 2^f, f = t - rint(t) in [-1/2, 1/2], by kernels_avx512bf16.c's
   degree-4 polynomial (relative error 2.7e-6), times 2^rint(t) as two exact power-of-two
   products (2^(e >> 1) then 2^(e - (e >> 1)), both normal for e in [-125, 128]).  t < -125
   (x - m < -86.6, -inf included) gives exactly 0; NaN stays NaN (t NaN, the polynomial NaN). */
static inline float32x4_t exp2_16(float32x4_t x, float32x4_t m)
{
    float32x4_t t = vmulq_f32(vsubq_f32(x, m), vdupq_n_f32(1.44269504088896341f));
    const uint32x4_t zero = vcltq_f32(t, vdupq_n_f32(-125.0f)); /* NaN: false */
    t = vminq_f32(vmaxq_f32(t, vdupq_n_f32(-125.0f)), vdupq_n_f32(128.0f)); /* NaN stays NaN */
    const float32x4_t n = vrndnq_f32(t), f = vsubq_f32(t, n);
    float32x4_t p = vdupq_n_f32(0.009569965302944183f);
    p = vfmaq_f32(vdupq_n_f32(0.05591750890016556f), p, f);
    p = vfmaq_f32(vdupq_n_f32(0.240247443318367f), p, f);
    p = vfmaq_f32(vdupq_n_f32(0.6931218504905701f), p, f);
    p = vfmaq_f32(vdupq_n_f32(0.9999992847442627f), p, f);
    const int32x4_t e = vcvtq_s32_f32(n), e1 = vshrq_n_s32(e, 1), e2 = vsubq_s32(e, e1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e1, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e2, vdupq_n_s32(127)), 23));
    const float32x4_t r = vmulq_f32(vmulq_f32(p, s1), s2);
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), zero));
}

static float exp_pack_neonbf16(float *x, size_t n, size_t n_pad, float m, uint16_t *dst, int store)
{
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t acc = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp2_16(vld1q_f32(x + i), vm);
        if (store)
            vst1q_f32(x + i, e);
        vst1_u16(dst + i, bf16x4(e));
        acc = vaddq_f32(acc, e);
    }
    if (i < n) { /* the last 1-3 through a copy padded with -inf (exp 0) */
        float t[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        uint16_t d[4];
        memcpy(t, x + i, (n - i) * sizeof(float));
        const float32x4_t e = exp2_16(vld1q_f32(t), vm);
        vst1q_f32(t, e);
        vst1_u16(d, bf16x4(e));
        if (store)
            memcpy(x + i, t, (n - i) * sizeof(float));
        memcpy(dst + i, d, ((n_pad < i + 4 ? n_pad : i + 4) - i) * sizeof(uint16_t));
        acc = vaddq_f32(acc, e);
        i += 4;
    }
    if (i < n_pad)
        memset(dst + i, 0, (n_pad - i) * sizeof(uint16_t));
    return vaddvq_f32(acc);
}

/* Register block of C: MR rows x 16 columns (4 vectors), accumulated over all of K.  Per 4 pairs
   of K: A's 4 pairs of each row in one register; for each of them (lane l), B's 16 columns of
   that pair (4 loads), one BFDOT per row and vector with the row's pair l. */
#define MR 4
static void block_neonbf16(size_t K, const uint16_t *A, size_t lda, const uint32_t *B, size_t ldb, float *C,
                           size_t ldc, int acc)
{
    float32x4_t c[MR][4];
    UNROLL
    for (int r = 0; r < MR; r++)
        UNROLL
        for (int j = 0; j < 4; j++)
            c[r][j] = acc ? vld1q_f32(C + r * ldc + 4 * j) : vdupq_n_f32(0.0f);
    for (size_t p = 0; 2 * p < K; p += 4) {
        bfloat16x8_t a[MR];
        UNROLL
        for (int r = 0; r < MR; r++)
            a[r] = vreinterpretq_bf16_u16(vld1q_u16(A + r * lda + 2 * p));
#define BF16_LANE(l)                                                                                   \
        {                                                                                              \
            bfloat16x8_t b[4];                                                                         \
            UNROLL                                                                                     \
            for (int j = 0; j < 4; j++)                                                                \
                b[j] = vreinterpretq_bf16_u32(vld1q_u32(B + (p + (l)) * ldb + 4 * j));                 \
            UNROLL                                                                                     \
            for (int r = 0; r < MR; r++)                                                               \
                UNROLL                                                                                 \
                for (int j = 0; j < 4; j++)                                                            \
                    c[r][j] = vbfdotq_laneq_f32(c[r][j], b[j], a[r], l);                               \
        }
        BF16_LANE(0) BF16_LANE(1) BF16_LANE(2) BF16_LANE(3)
#undef BF16_LANE
    }
    UNROLL
    for (int r = 0; r < MR; r++)
        UNROLL
        for (int j = 0; j < 4; j++)
            vst1q_f32(C + r * ldc + 4 * j, c[r][j]);
}

/* Column panels of 16: the panel of B (K / 2 x 16 pairs, 8 KiB at K = 256) stays in L1 while the
   blocks of MR rows of A pass over it. */
static void gemm_neonbf16(size_t M, size_t N, size_t K, const uint16_t *A, size_t lda, const uint32_t *B,
                          size_t ldb, float *C, size_t ldc, int acc)
{
    for (size_t n = 0; n < N; n += 16)
        for (size_t m = 0; m < M; m += MR)
            block_neonbf16(K, A + m * lda, lda, B + n, ldb, C + m * ldc + n, ldc, acc);
}

static int permit_none(void) { return 1; } /* no state to grant, load or release */
static void nothing(void) {}

const gqa_tiles gqa_tiles_neonbf16 = {"neonbf16",
                                      GQA_CPU_BF16,
                                      512, /* the query tile of the other tiles; not timed on Arm */
                                      0,   /* not timed on Arm */
                                      permit_none,
                                      nothing,
                                      nothing,
                                      pack_rows_neonbf16,
                                      pack_pairs_neonbf16,
                                      pack_pairs_t_neonbf16,
                                      exp_pack_neonbf16,
                                      gemm_neonbf16,
                                      NULL, /* level 4's integer dots: the sdot unit's */
                                      NULL,
                                      NULL, /* float rows' decode: float32 */
                                      NULL};
#endif
