/*
 * kernels_neon_dot.h -- what the NEON sdot unit's two sources share (kernels_neon_s8dot.c: per
 * tensor / per channel codes; kernels_neon_gdot.c: per-group codes): the quantization of query
 * rows and probability rows to the 15-bit codes of kernels_s8dot_contract.h as two signed byte
 * halves, the tiles of 4 keys x 16 columns that P @ V's sdot reads, and its dot products.
 * ISA flags: the unit's (-march=armv8.2-a+dotprod).
 *
 * Halves: a query code c in [-32639, 32639] is 256 hi + lo, hi = (c + 128) >> 8 and lo = c - 256 hi
 * both in [-127, 127]; a probability code p in [0, 32767] is 256 ph + pl + 128, ph = p >> 8 in
 * [0, 127] and pl = (p & 255) - 128 in [-128, 127].  int32 lanes wrap, and every sum recombined
 * from them is within the contracts' int32 limits, so the recombined sums are exact.
 */
#ifndef GQA_KERNELS_NEON_DOT_H
#define GQA_KERNELS_NEON_DOT_H

#include <arm_neon.h>
#include <float.h>
#include "kernels_common.h"
#include "kernels_s8dot_contract.h"

/* The neon path's table (kernels_neon.c): its exact kernels take what the contracts leave. */
extern const gqa_kernels gqa_kernels_neon;

#define DOT_SV_MB 4 /* rows of A that one pass of P @ V over a chunk's tiles serves */

/* How a B row's bytes hold its codes (kernels_avx2_dot.h's names): DOT_S8 signed codes, DOT_U8
   unsigned codes (taken as u - 128), DOT_U4 nibbles (the low one the even element), DOT_U2 crumbs
   (element 4 i + p in bits 2 p of byte i). */
#define DOT_S8 0
#define DOT_U4 1
#define DOT_U8 2
#define DOT_U2 3

/* Where element k of a query row goes among the halves, for the code order of a key row's step:
   DOT_NATURAL (INT8), DOT_EO (INT4: within each 32, the 16 even elements then the 16 odd, the
   low then the high nibbles of 16 bytes), DOT_PHASE (INT2: within each 32, element 4 i + p at
   8 p + i, the p-th crumbs of 8 bytes). */
#define DOT_NATURAL 0
#define DOT_EO 1
#define DOT_PHASE 2

static inline size_t dot_place(size_t k, int order)
{
    const size_t b = k & ~(size_t)31, i = k & 31;
    return order == DOT_EO ? b + 16 * (i & 1) + i / 2 : order == DOT_PHASE ? b + 8 * (i & 3) + i / 4 : k;
}

/* Row a's codes (a_k = a[k], or fl(a[k] s[k]) with pc) as byte halves into hi[0, cs) and
   lo[0, cs) (padded with 0, in `order`), the sums of its codes over each g elements into
   sums[0, cs / g) and its multiplier fl(alpha sa) (times s[0] where s is a per-tensor scale:
   s != NULL and !pc); 0 when the row takes the exact kernel (qk_gemm_s8_dot's contract). */
static int dot_qk_row(const float *a, size_t K, const float *s, int pc, float alpha, int order, int8_t *hi,
                      int8_t *lo, size_t cs, size_t g, int32_t *sums, float *mult)
{
    float amax = 0.0f;
    int bad = 0;
    for (size_t k = 0; k < K; k++) {
        const float x = pc ? a[k] * s[k] : a[k];
        bad |= x != x;
        const float ax = fabsf(x);
        amax = ax > amax ? ax : amax;
    }
    if (bad || !(amax <= FLT_MAX) || amax == 0.0f || !(QK_CODE_MAX / amax <= FLT_MAX))
        return 0;
    const float inv = QK_CODE_MAX / amax, sa = amax / QK_CODE_MAX;
    for (size_t j = 0; j < cs / g; j++)
        sums[j] = 0;
    for (size_t k = 0; k < cs; k++) {
        float q = 0.0f;
        if (k < K) {
            q = rintf((pc ? a[k] * s[k] : a[k]) * inv);
            q = q > QK_CODE_MAX ? QK_CODE_MAX : q < -QK_CODE_MAX ? -QK_CODE_MAX : q;
        }
        const int32_t c = (int32_t)q, h = (c + 128) >> 8;
        hi[dot_place(k, order)] = (int8_t)h;
        lo[dot_place(k, order)] = (int8_t)(c - 256 * h);
        sums[k / g] += c;
    }
    *mult = s != NULL && !pc ? (alpha * sa) * s[0] : alpha * sa;
    return 1;
}

/* One QK step of a key row at p, as sdot reads it against dot_place's order: DOT_S8 / DOT_U8 16
   bytes, 16 codes in v[0]; DOT_U4 16 bytes, 32 codes (v[0] the low nibbles, v[1] the high);
   DOT_U2 8 bytes, 32 codes (v[0] crumbs 0 and 1 of the 8 bytes, v[1] crumbs 2 and 3).  Returns the
   vectors written. */
static inline __attribute__((always_inline)) int dot_step_codes(const int kind, const uint8_t *p, int8x16_t *v)
{
    if (kind == DOT_S8) {
        v[0] = vld1q_s8((const int8_t *)p);
        return 1;
    }
    if (kind == DOT_U8) {
        v[0] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80)));
        return 1;
    }
    if (kind == DOT_U4) {
        const uint8x16_t x = vld1q_u8(p);
        v[0] = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F)));
        v[1] = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
        return 2;
    }
    const uint8x8_t x = vld1_u8(p), m = vdup_n_u8(3);
    v[0] = vreinterpretq_s8_u8(vcombine_u8(vand_u8(x, m), vand_u8(vshr_n_u8(x, 2), m)));
    v[1] = vreinterpretq_s8_u8(vcombine_u8(vand_u8(vshr_n_u8(x, 4), m), vshr_n_u8(x, 6)));
    return 2;
}

/* inv and sp of a probability row; 0 when the row takes the exact kernel (an element negative,
   NaN or infinite, a maximum of 0, or 32767 / max not finite). */
static int dot_sv_row(const float *a, size_t K, float *inv, float *sp)
{
    const float32x4_t zero = vdupq_n_f32(0.0f), big = vdupq_n_f32(FLT_MAX);
    float32x4_t mx = zero;
    uint32x4_t ok = vdupq_n_u32(~0u);
    size_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float32x4_t v = vld1q_f32(a + k);
        ok = vandq_u32(ok, vandq_u32(vcgeq_f32(v, zero), vcleq_f32(v, big))); /* NaN fails both */
        mx = vmaxq_f32(mx, v);
    }
    float pmax = vmaxvq_f32(mx);
    int good = vminvq_u32(ok) != 0;
    for (; k < K; k++) {
        good &= a[k] >= 0.0f && a[k] <= FLT_MAX;
        pmax = a[k] > pmax ? a[k] : pmax;
    }
    if (!good || pmax == 0.0f)
        return 0;
    *inv = SV_CODE_MAX / pmax;
    *sp = pmax / SV_CODE_MAX;
    return *inv <= FLT_MAX;
}

/* The codes p_k = min(32767, rint(fl(x[k] inv))) of x[0, n) (x >= 0) as halves into ph[0, np),
   pl[0, np) (np = n rounded up to 16; past n the halves of p = 0); returns sum_k p_k. */
static int32_t dot_sv_codes(const float *x, size_t n, float inv, int8_t *ph, int8_t *pl)
{
    const float32x4_t vinv = vdupq_n_f32(inv), lim = vdupq_n_f32(SV_CODE_MAX);
    int32x4_t total = vdupq_n_s32(0);
    for (size_t k = 0; k < n; k += 16) {
        float t[16] = {0};
        const float *src = x + k;
        if (n - k < 16) {
            memcpy(t, x + k, (n - k) * sizeof(float));
            src = t;
        }
        int16x8_t h16[2], l16[2];
        for (int j = 0; j < 2; j++) {
            int32x4_t p[2];
            for (int i = 0; i < 2; i++) {
                const float32x4_t v = vmulq_f32(vld1q_f32(src + 8 * j + 4 * i), vinv);
                p[i] = vcvtq_s32_f32(vminq_f32(vrndnq_f32(v), lim)); /* integral: exact */
                total = vaddq_s32(total, p[i]);
            }
            const int16x8_t p16 = vcombine_s16(vmovn_s32(p[0]), vmovn_s32(p[1]));
            h16[j] = vshrq_n_s16(p16, 8);
            l16[j] = vsubq_s16(vandq_s16(p16, vdupq_n_s16(255)), vdupq_n_s16(128));
        }
        vst1q_s8(ph + k, vcombine_s8(vmovn_s16(h16[0]), vmovn_s16(h16[1])));
        vst1q_s8(pl + k, vcombine_s8(vmovn_s16(l16[0]), vmovn_s16(l16[1])));
    }
    return vaddvq_s32(total);
}


/* 16 columns of one B row at p as bytes in column order; w < 16 columns (a last block) through a
   zero-padded copy of their bytes. */
static inline int8x16_t dot_cols16(const uint8_t *p, int kind, size_t w)
{
    const size_t nb = kind == DOT_U4 ? (w + 1) / 2 : kind == DOT_U2 ? (w + 3) / 4 : w;
    uint8_t t[16] = {0};
    if (w < 16) {
        memcpy(t, p, nb);
        p = t;
    }
    if (kind == DOT_S8)
        return vld1q_s8((const int8_t *)p);
    if (kind == DOT_U8)
        return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80)));
    if (kind == DOT_U4) {
        const uint8x8_t x = vld1_u8(p);
        const uint8x8x2_t z = vzip_u8(vand_u8(x, vdup_n_u8(0x0F)), vshr_n_u8(x, 4));
        return vreinterpretq_s8_u8(vcombine_u8(z.val[0], z.val[1]));
    }
    uint8_t q[8] = {0};
    memcpy(q, p, 4);
    const uint8x8_t x = vld1_u8(q), m = vdup_n_u8(3);
    const uint8x8x2_t a = vzip_u8(vand_u8(x, m), vand_u8(vshr_n_u8(x, 4), m));          /* crumbs 0, 2 */
    const uint8x8x2_t b = vzip_u8(vand_u8(vshr_n_u8(x, 2), m), vshr_n_u8(x, 6));        /* crumbs 1, 3 */
    const uint8x8x2_t c = vzip_u8(a.val[0], b.val[0]); /* byte i's crumbs 0 1 2 3, bytes 0..3 */
    return vreinterpretq_s8_u8(vcombine_u8(c.val[0], c.val[1]));
}

/* The tile of keys [0, kn) (rows b + k ldb, 16 columns from each) for sdot: tile[4 q + j] holds,
   for columns 4 j .. 4 j + 3, keys 4 q .. 4 q + 3 in each 32-bit lane (zeros past kn, up to np,
   a multiple of 16); colsum[j] the columns' sums over the keys (of the bytes as sdot reads them). */
static void dot_sv_tile(const uint8_t *b, size_t ldb, size_t kn, size_t np, int kind, size_t w, int8x16_t *tile,
                        int32x4_t colsum[4])
{
    const int8x16_t ones = vdupq_n_s8(1);
    for (int j = 0; j < 4; j++)
        colsum[j] = vdupq_n_s32(0);
    for (size_t k = 0; k < np; k += 4) {
        int8x16_t r[4];
        for (int i = 0; i < 4; i++)
            r[i] = k + i < kn ? dot_cols16(b + (k + i) * ldb, kind, w) : vdupq_n_s8(0);
        /* 4 rows x 16 columns -> 4 columns x 4 keys per 32-bit lane */
        const int16x8_t a0 = vreinterpretq_s16_s8(vzip1q_s8(r[0], r[1]));
        const int16x8_t a1 = vreinterpretq_s16_s8(vzip2q_s8(r[0], r[1]));
        const int16x8_t b0 = vreinterpretq_s16_s8(vzip1q_s8(r[2], r[3]));
        const int16x8_t b1 = vreinterpretq_s16_s8(vzip2q_s8(r[2], r[3]));
        int8x16_t *t = tile + k;
        t[0] = vreinterpretq_s8_s16(vzip1q_s16(a0, b0));
        t[1] = vreinterpretq_s8_s16(vzip2q_s16(a0, b0));
        t[2] = vreinterpretq_s8_s16(vzip1q_s16(a1, b1));
        t[3] = vreinterpretq_s8_s16(vzip2q_s16(a1, b1));
        for (int j = 0; j < 4; j++)
            colsum[j] = vdotq_s32(colsum[j], t[j], ones);
    }
}

/* The 16 column sums of rows i < MB (halves ph / pl at stride ps, keys [0, np)) against a tile:
   d[i][j] = 256 D_ph + D_pl + 128 colsum[j] + corr[i], in the lanes of columns 4 j .. (corr: the
   caller's exact correction of its code offsets, e.g. INT4's - 8 sum p). */
static inline __attribute__((always_inline)) void dot_sv_dots(const int MB, const int8_t *ph, const int8_t *pl,
                                                              size_t ps, const int8x16_t *tile, size_t np,
                                                              const int32x4_t colsum[4], const int32_t *corr,
                                                              int32x4_t d[][4])
{
    int32x4_t ah[2][4], al[2][4];
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int j = 0; j < 4; j++)
            ah[i][j] = al[i][j] = vdupq_n_s32(0);
    for (size_t k = 0; k < np; k += 16) {
        int8x16_t h[2], l[2];
        UNROLL
        for (int i = 0; i < MB; i++) {
            h[i] = vld1q_s8(ph + i * ps + k);
            l[i] = vld1q_s8(pl + i * ps + k);
        }
        const int8x16_t *t = tile + k;
#define DOT_SV_GROUP(q)                                                                                \
        UNROLL                                                                                         \
        for (int j = 0; j < 4; j++) {                                                                  \
            const int8x16_t v = t[4 * (q) + j];                                                        \
            UNROLL                                                                                     \
            for (int i = 0; i < MB; i++) {                                                             \
                ah[i][j] = vdotq_laneq_s32(ah[i][j], v, h[i], q);                                      \
                al[i][j] = vdotq_laneq_s32(al[i][j], v, l[i], q);                                      \
            }                                                                                          \
        }
        DOT_SV_GROUP(0) DOT_SV_GROUP(1) DOT_SV_GROUP(2) DOT_SV_GROUP(3)
#undef DOT_SV_GROUP
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int j = 0; j < 4; j++)
            d[i][j] = vaddq_s32(vaddq_s32(vshlq_n_s32(ah[i][j], 8), al[i][j]),
                                vaddq_s32(vshlq_n_s32(colsum[j], 7), vdupq_n_s32(corr[i])));
}

/* dot_sv_dots of one row or two (two: rows ph, ph + ps; corr[0], corr[1]) */
static void dot_sv_dots_n(int two, const int8_t *ph, const int8_t *pl, size_t ps, const int8x16_t *tile, size_t np,
                          const int32x4_t colsum[4], const int32_t *corr, int32x4_t d[][4])
{
    if (two)
        dot_sv_dots(2, ph, pl, ps, tile, np, colsum, corr, d);
    else
        dot_sv_dots(1, ph, pl, ps, tile, np, colsum, corr, d);
}

#endif
