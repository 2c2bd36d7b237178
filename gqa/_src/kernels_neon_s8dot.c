/*
 * kernels_neon_s8dot.c -- accuracy level 4's integer-dot kernels of path `neon`: QK and P @ V on
 * INT8 and INT4 per-tensor and per-channel codes with 15-bit query rows and probabilities, the
 * contracts of kernels_s8dot_contract.h, bit for bit the results of the AVX2, AVX-512 VNNI and
 * AMX INT8 units.
 * ISA flags: -march=armv8.2-a+dotprod (FEAT_DotProd's sdot); setup.py compiles it with the neon
 * path and then defines GQA_HAVE_NEON_S8DOT for kernels_neon.c, whose table holds
 * gqa_qk_gemm_s8_dot_neon and gqa_sv_gemm_s8_dot_neon; the dispatch runs them only where the CPU
 * reports the dot product (HWCAP_ASIMDDP, gqa_s8_dot_runnable).  The whole file is empty
 * elsewhere.
 *
 * sdot multiplies signed bytes four at a time into int32 lanes, so each 15-bit code is taken as
 * two byte halves and the integer sums are recombined exactly (int32 arithmetic wraps, and every
 * recombined sum is within the contract's int32 limits, so the wrapped result is the sum):
 *  - QK: a query code c in [-32639, 32639] is 256 hi + lo with hi = (c + 128) >> 8 and
 *    lo = c - 256 hi, both in [-127, 127] (QK_CODE_MAX = 127 * 257); D = 256 D_hi + D_lo.
 *  - P @ V: a probability code p in [0, 32767] is 256 ph + pl + 128 with ph = p >> 8 in [0, 127]
 *    and pl = (p & 255) - 128 in [-128, 127]; D[n] = 256 D_ph[n] + D_pl[n] + 128 sum_k v[k, n],
 *    the column sums shared by every row of a call.
 * INT4 codes are taken as their nibbles u = q + 8 in [0, 15] and the sums corrected exactly:
 * sum_k c_k q_k = sum_k c_k u_k - 8 sum_k c_k.  Integer sums do not depend on their order, and
 * the float finish is the contract's, so these kernels give its bits.
 *
 * Layout: QK: A float32 [M, K] (lda), B codes [N, K] (rows of gqa_row_bytes(type, K) bytes), C
 * float32 [M, N] (ldc), overwritten.  A 16-byte step of a B row is 16 INT8 codes, or 32 INT4
 * codes (the low nibbles are the even elements, the high ones the odd: the query halves are kept
 * in that order within each 32).  SV: A float32 [M, K] (lda), B codes [K, N] (rows of
 * gqa_row_bytes(type, N) bytes), C float32 [M, N] (ldc), C = beta * C + A @ deq(B): per chunk
 * of SV_KS keys and 16 columns, the chunk's rows are put four keys to a 32-bit lane once (a
 * stack tile of at most 8 KiB) and every row's halves read it.  Neither reads B past its last
 * byte (partial steps and blocks go through zero-padded copies).
 */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <float.h>
#include "kernels_common.h"
#include "kernels_s8dot_contract.h"

/* The neon path's table (kernels_neon.c): its exact kernels take what the contracts leave. */
extern const gqa_kernels gqa_kernels_neon;

/* ---- qk_gemm_s8_dot ------------------------------------------------------------------------ */

/* Row a's codes (a_k = a[k], or fl(a[k] s[k]) per channel) as byte halves into hi[0, cs) and
   lo[0, cs) (padded with 0; eo: each 32 reordered to the 16 even elements, then the 16 odd), its
   multiplier and the sum of its codes; 0 when the row takes the exact kernel. */
static int qk_row(const float *a, size_t K, const float *s, int pc, float alpha, int eo, int8_t *hi, int8_t *lo,
                  size_t cs, float *mult, int32_t *sum)
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
    int32_t total = 0;
    for (size_t k = 0; k < cs; k++) {
        float q = 0.0f;
        if (k < K) {
            q = rintf((pc ? a[k] * s[k] : a[k]) * inv);
            q = q > QK_CODE_MAX ? QK_CODE_MAX : q < -QK_CODE_MAX ? -QK_CODE_MAX : q;
        }
        const int32_t c = (int32_t)q, h = (c + 128) >> 8;
        /* element k's place: INT4 puts element 2i + j of each 32 at 16 j + i */
        const size_t at = eo ? (k & ~(size_t)31) + 16 * (k & 1) + (k & 31) / 2 : k;
        hi[at] = (int8_t)h;
        lo[at] = (int8_t)(c - 256 * h);
        total += c;
    }
    *mult = pc ? alpha * sa : (alpha * sa) * s[0];
    *sum = total;
    return 1;
}

/* One 16-byte step p of each of NB rows of B for rows mb < MB of the halves (stride cs):
   ah / al[mb * NB + nb] += the products of its codes with the high / low halves. */
INLINE void qk_step(const int MB, const int NB, const int S4, const int8_t *const *p, const int8_t *hi,
                    const int8_t *lo, size_t cs, int32x4_t *ah, int32x4_t *al)
{
    UNROLL
    for (int nb = 0; nb < NB; nb++) {
        if (!S4) {
            const int8x16_t b = vld1q_s8(p[nb]);
            UNROLL
            for (int mb = 0; mb < MB; mb++) {
                ah[mb * NB + nb] = vdotq_s32(ah[mb * NB + nb], vld1q_s8(hi + mb * cs), b);
                al[mb * NB + nb] = vdotq_s32(al[mb * NB + nb], vld1q_s8(lo + mb * cs), b);
            }
        } else {
            const uint8x16_t x = vld1q_u8((const uint8_t *)p[nb]);
            const int8x16_t ev = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F)));
            const int8x16_t od = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
            UNROLL
            for (int mb = 0; mb < MB; mb++) {
                const int8_t *h = hi + mb * cs, *l = lo + mb * cs;
                ah[mb * NB + nb] = vdotq_s32(vdotq_s32(ah[mb * NB + nb], vld1q_s8(h), ev), vld1q_s8(h + 16), od);
                al[mb * NB + nb] = vdotq_s32(vdotq_s32(al[mb * NB + nb], vld1q_s8(l), ev), vld1q_s8(l + 16), od);
            }
        }
    }
}

/* C[mb, n] for rows mb < MB of the halves and the N rows of B (rb bytes each), NB rows of B at a
   time (a last partial block repeats B's last row and stores only its own): fl(float(D - corr)
   mult).  The columns past the last whole step come from a zero-padded copy of their bytes. */
INLINE void qk_block(const int MB, const int NB, const int S4, const int8_t *hi, const int8_t *lo, size_t cs,
                     const int8_t *B, size_t rb, size_t N, size_t K, const float *mult, const int32_t *corr,
                     float *C, size_t ldc)
{
    const size_t KS = S4 ? 32 : 16, Kf = K / KS * KS;
    for (size_t n = 0; n < N; n += (size_t)NB) {
        const size_t nv = N - n < (size_t)NB ? N - n : (size_t)NB;
        const int8_t *b[8];
        int32x4_t ah[8], al[8];
        UNROLL
        for (int nb = 0; nb < NB; nb++)
            b[nb] = B + (n + ((size_t)nb < nv ? (size_t)nb : nv - 1)) * rb;
        UNROLL
        for (int i = 0; i < MB * NB; i++)
            ah[i] = al[i] = vdupq_n_s32(0);
        size_t k = 0;
        for (; k < Kf; k += KS) {
            const int8_t *p[8];
            UNROLL
            for (int nb = 0; nb < NB; nb++)
                p[nb] = b[nb] + k / KS * 16;
            qk_step(MB, NB, S4, p, hi + k, lo + k, cs, ah, al);
        }
        if (k < K) {
            int8_t t[8][16] = {{0}};
            const int8_t *p[8];
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                memcpy(t[nb], b[nb] + k / KS * 16, rb - k / KS * 16);
                p[nb] = t[nb];
            }
            qk_step(MB, NB, S4, p, hi + k, lo + k, cs, ah, al);
        }
        UNROLL
        for (int mb = 0; mb < MB; mb++)
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                if ((size_t)nb >= nv)
                    continue;
                const int32x4_t d = vaddq_s32(vshlq_n_s32(ah[mb * NB + nb], 8), al[mb * NB + nb]);
                C[mb * ldc + n + nb] = (float)(vaddvq_s32(d) - corr[mb]) * mult[mb];
            }
    }
}

#define QK_INST(MB, NB, S4)                                                                            \
    static void qk_##MB##x##NB##_##S4(const int8_t *hi, const int8_t *lo, size_t cs, const int8_t *B, size_t rb, \
                                      size_t N, size_t K, const float *mult, const int32_t *corr, float *C,   \
                                      size_t ldc)                                                      \
    {                                                                                                  \
        qk_block(MB, NB, S4, hi, lo, cs, B, rb, N, K, mult, corr, C, ldc);                             \
    }
typedef void (*qk_fn)(const int8_t *, const int8_t *, size_t, const int8_t *, size_t, size_t, size_t,
                      const float *, const int32_t *, float *, size_t);
/* rows of A x rows of B per block, at most 8 pairs of accumulators (INT4: 4 query vectors a row) */
QK_INST(1, 8, 0) QK_INST(2, 4, 0) QK_INST(3, 2, 0) QK_INST(4, 2, 0)
QK_INST(1, 4, 1) QK_INST(2, 2, 1) QK_INST(3, 2, 1) QK_INST(4, 1, 1)
static const qk_fn qk_blocks[2][5] = {{NULL, qk_1x8_0, qk_2x4_0, qk_3x2_0, qk_4x2_0},
                                      {NULL, qk_1x4_1, qk_2x2_1, qk_3x2_1, qk_4x1_1}};

void gqa_qk_gemm_s8_dot_neon(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                             int type, const float *s, float *C, size_t ldc)
{
    int8_t hi[4 * DOT_QK_K] __attribute__((aligned(16))), lo[4 * DOT_QK_K] __attribute__((aligned(16)));
    if (!gqa_dot_codes(type) || K == 0 || K > DOT_QK_K) {
        gqa_kernels_neon.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    const size_t cs = s4 ? (K + 31) & ~(size_t)31 : (K + 15) & ~(size_t)15, rb = gqa_row_bytes(type, K);
    for (size_t m0 = 0; m0 < M;) {
        /* blocks of at most 4 consecutive rows the contract covers; each other row exact */
        size_t rows[4];
        float mult[4];
        int32_t corr[4], sum;
        int mb = 0;
        for (; m0 < M && mb < 4; ++m0) {
            if (qk_row(A + m0 * lda, K, s, pc, alpha, s4, hi + mb * cs, lo + mb * cs, cs, &mult[mb], &sum)) {
                corr[mb] = s4 ? 8 * sum : 0;
                rows[mb++] = m0;
            } else {
                gqa_kernels_neon.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc);
            }
        }
        if (mb == 0)
            continue;
        if (rows[mb - 1] - rows[0] == (size_t)(mb - 1))
            qk_blocks[s4][mb](hi, lo, cs, (const int8_t *)B, rb, N, K, mult, corr, C + rows[0] * ldc, ldc);
        else
            for (int i = 0; i < mb; i++)
                qk_blocks[s4][1](hi + i * cs, lo + i * cs, cs, (const int8_t *)B, rb, N, K, mult + i, corr + i,
                                 C + rows[i] * ldc, ldc);
    }
}

/* ---- sv_gemm_s8_dot ------------------------------------------------------------------------ */

#define SV_MB 4 /* rows of A a pass over a chunk's tiles serves */

/* inv and sp of a probability row; 0 when the row takes the exact kernel (an element negative,
   NaN or infinite, or a maximum of 0, or 32767 / max not finite). */
static int sv_row(const float *a, size_t K, float *inv, float *sp)
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

/* The codes p_k = min(32767, rint(fl(a[k] inv))) of a[0, n) as ph = p >> 8 and pl = (p & 255) -
   128 into ph[0, np), pl[0, np) (np = n rounded up to 16; past n: 0 and -128, p = 0); returns
   sum_k p_k. */
static int32_t sv_codes(const float *a, size_t n, float inv, int8_t *ph, int8_t *pl)
{
    const float32x4_t vinv = vdupq_n_f32(inv), lim = vdupq_n_f32(SV_CODE_MAX);
    int32x4_t total = vdupq_n_s32(0);
    for (size_t k = 0; k < n; k += 16) {
        float x[16] = {0};
        const float *src = a + k;
        if (n - k < 16) {
            memcpy(x, a + k, (n - k) * sizeof(float));
            src = x;
        }
        int16x8_t h16[2], l16[2];
        for (int j = 0; j < 2; j++) {
            int32x4_t p[2];
            for (int i = 0; i < 2; i++) {
                const float32x4_t t = vmulq_f32(vld1q_f32(src + 8 * j + 4 * i), vinv);
                p[i] = vcvtq_s32_f32(vminq_f32(vrndnq_f32(t), lim)); /* integral: exact */
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

/* 16 columns of one B row as bytes in column order: INT8 codes, or INT4 nibbles u (low nibble
   the even column); w < 16 columns (a last block) through a zero-padded copy. */
INLINE int8x16_t sv_cols16(const int8_t *p, int s4, size_t w)
{
    const size_t nb = s4 ? (w + 1) / 2 : w;
    int8_t t[16] = {0};
    if (w < 16) {
        memcpy(t, p, nb);
        p = t;
    }
    if (!s4)
        return vld1q_s8(p);
    const uint8x8_t x = vld1_u8((const uint8_t *)p);
    const uint8x8x2_t z = vzip_u8(vand_u8(x, vdup_n_u8(0x0F)), vshr_n_u8(x, 4));
    return vreinterpretq_s8_u8(vcombine_u8(z.val[0], z.val[1]));
}

/* The tile of keys [0, kn) (rows b + k ldb) and 16 columns: tile[4 g + j] holds, for columns
   4 j .. 4 j + 3, keys 4 g .. 4 g + 3 in each 32-bit lane (zeros past kn, up to np, a multiple of
   16); colsum[j] the columns' sums over the keys. */
static void sv_tile(const int8_t *b, size_t ldb, size_t kn, size_t np, int s4, size_t w, int8x16_t *tile,
                    int32x4_t colsum[4])
{
    const int8x16_t ones = vdupq_n_s8(1);
    for (int j = 0; j < 4; j++)
        colsum[j] = vdupq_n_s32(0);
    for (size_t k = 0; k < np; k += 4) {
        int8x16_t r[4];
        for (int i = 0; i < 4; i++)
            r[i] = k + i < kn ? sv_cols16(b + (k + i) * ldb, s4, w) : vdupq_n_s8(0);
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
   d[i][j] = 256 D_ph + D_pl (the 128 sum v term is the caller's). */
INLINE void sv_dots(const int MB, const int8_t *ph, const int8_t *pl, size_t ps, const int8x16_t *tile, size_t np,
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
#define SV_GROUP(g)                                                                                    \
        UNROLL                                                                                         \
        for (int j = 0; j < 4; j++) {                                                                  \
            const int8x16_t v = t[4 * (g) + j];                                                        \
            UNROLL                                                                                     \
            for (int i = 0; i < MB; i++) {                                                             \
                ah[i][j] = vdotq_laneq_s32(ah[i][j], v, h[i], g);                                      \
                al[i][j] = vdotq_laneq_s32(al[i][j], v, l[i], g);                                      \
            }                                                                                          \
        }
        SV_GROUP(0) SV_GROUP(1) SV_GROUP(2) SV_GROUP(3)
#undef SV_GROUP
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int j = 0; j < 4; j++)
            d[i][j] = vaddq_s32(vshlq_n_s32(ah[i][j], 8), al[i][j]);
}

static void sv_dots_1(const int8_t *ph, const int8_t *pl, size_t ps, const int8x16_t *tile, size_t np,
                      int32x4_t d[][4])
{
    sv_dots(1, ph, pl, ps, tile, np, d);
}

static void sv_dots_2(const int8_t *ph, const int8_t *pl, size_t ps, const int8x16_t *tile, size_t np,
                      int32x4_t d[][4])
{
    sv_dots(2, ph, pl, ps, tile, np, d);
}

/* One chunk's sums d[0, w) (w <= 16) into crow: crow[n] = (first ? (beta == 0 ? 0 : fl(beta
   crow[n])) : crow[n]) + fl(float(d[n]) fl(sp s[n or 0])). */
static void sv_finish(const int32x4_t d[4], size_t w, float *crow, const float *s, int pc, float sp, float beta,
                      int first)
{
    float cb[16], sb[16] = {0};
    memcpy(cb, crow, w * sizeof(float));
    if (pc)
        memcpy(sb, s, w * sizeof(float));
    const float32x4_t vsp = vdupq_n_f32(sp);
    for (size_t j = 0; 4 * j < w; j++) {
        float32x4_t base = vld1q_f32(cb + 4 * j);
        if (first)
            base = beta == 0.0f ? vdupq_n_f32(0.0f) : vmulq_f32(vdupq_n_f32(beta), base);
        const float32x4_t mult = vmulq_f32(vsp, pc ? vld1q_f32(sb + 4 * j) : vdupq_n_f32(s[0]));
        vst1q_f32(cb + 4 * j, vaddq_f32(base, vmulq_f32(vcvtq_f32_s32(d[j]), mult)));
    }
    memcpy(crow, cb, w * sizeof(float));
}

void gqa_sv_gemm_s8_dot_neon(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                             const float *s, float *C, size_t ldc, float beta)
{
    int8_t ph[SV_MB][SV_KS] __attribute__((aligned(16))), pl[SV_MB][SV_KS] __attribute__((aligned(16)));
    int8x16_t tile[SV_KS];
    if (!gqa_dot_codes(type) || K == 0) {
        gqa_kernels_neon.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    const size_t rb = gqa_row_bytes(type, N);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[SV_MB];
        float inv[SV_MB], sp[SV_MB];
        int mb = 0;
        for (; m0 < M && mb < SV_MB; ++m0) {
            if (sv_row(A + m0 * lda, K, &inv[mb], &sp[mb]))
                rows[mb++] = m0;
            else
                gqa_kernels_neon.sv_gemm(1, N, K, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc, beta);
        }
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS, np = (kn + 15) & ~(size_t)15;
            int32_t corr[SV_MB];
            for (int i = 0; i < mb; i++)
                corr[i] = 8 * sv_codes(A + rows[i] * lda + k0, kn, inv[i], ph[i], pl[i]) * s4;
            const int8_t *bk = (const int8_t *)B + k0 * rb;
            for (size_t n0 = 0; n0 < N; n0 += 16) {
                const size_t w = N - n0 < 16 ? N - n0 : 16;
                int32x4_t colsum[4], d[2][4];
                sv_tile(bk + gqa_row_bytes(type, n0), rb, kn, np, s4, w, tile, colsum);
                for (int i = 0; i < mb; i += 2) {
                    const int two = i + 1 < mb;
                    (two ? sv_dots_2 : sv_dots_1)(ph[i], pl[i], SV_KS, tile, np, d);
                    for (int r = 0; r <= two; r++) {
                        for (int j = 0; j < 4; j++)
                            d[r][j] = vsubq_s32(vaddq_s32(d[r][j], vshlq_n_s32(colsum[j], 7)),
                                                vdupq_n_s32(corr[i + r]));
                        sv_finish(d[r], w, C + rows[i + r] * ldc + n0, pc ? s + n0 : s, pc, sp[i + r], beta,
                                  k0 == 0);
                    }
                }
            }
        }
    }
}
#endif
