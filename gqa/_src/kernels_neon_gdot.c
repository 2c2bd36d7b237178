/*
 * kernels_neon_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / G4 / G2, float32 or
 * binary16 metadata) for path `neon`: the per-group contracts of kernels_s8dot_contract.h (groups
 * where gqa_group_dot_takes), bit for bit the results of the AVX2 unit's kernels_avx2_gdot.c.
 * ISA flags: the sdot unit's (-march=armv8.2-a+dotprod); the second source of setup.py's
 * neon_s8dot unit, reached through its entries (kernels_neon_s8dot.c) for group types.  Empty
 * elsewhere than aarch64.
 *
 * Codes u are unsigned; sdot takes INT4 and INT2 codes as they are and INT8 codes as u - 128,
 * the sums corrected exactly (+ 128 times the other operand's sum).
 *
 * QK, blocks of MB <= 2 query rows x 4 keys: per group j, a step of a key row is 16 INT8 codes
 * (16 bytes), 32 INT4 codes (16 bytes: the low nibbles, then the high ones) or 32 INT2 codes
 * (8 bytes: the crumbs of each of the four bit positions), against the query row's halves in
 * that order (kernels_neon_dot.h's dot_place).  The exact D_j of the block's 4 keys lands in one
 * int32x4, and the group's finish fl(S + fl(fl(s_j D_j) + fl(z_j A_j))) runs on those 4 lanes
 * with the 4 keys' scales and zeros.
 *
 * P @ V, per chunk of SV_KG keys and group j: the chunk's scales and zeros of group j are read
 * once; each row's w_k = fl(p_k s_kj), its 15-bit codes against their maximum (as halves), and
 * the zeros' term Z (8 lanes by key mod 8 in key order, combined as the contract states); then,
 * per 16 columns of the group, the tile of 4 keys a lane (kernels_neon_dot.h) that every row reads.
 *
 * Layout: as kernels_neon_s8dot.c, with group rows (codes, then each group's scale and zero,
 * kernels_group.h).  Reads no byte past a row.
 */
#if defined(__aarch64__)
#include "kernels_neon_dot.h"
#include "kernels_group.h"

/* ---- qk_gemm_s8_dot on group rows ---------------------------------------------------------- */

/* The 4 keys' scale and zero of group j (rows b[i], metadata at byte cb of each). */
INLINE void gqk_meta4(const uint8_t *const *b, size_t cb, size_t j, int type, float32x4_t *s4, float32x4_t *z4)
{
    float s[4], z[4];
    for (int i = 0; i < 4; i++)
        gqa_group_meta(b[i] + cb, j, type, &s[i], &z[i]);
    *s4 = vld1q_f32(s);
    *z4 = vld1q_f32(z);
}

/* C[mb, n] for rows mb < MB of the halves (stride cs; group sums Aj[mb * J + j]) and the N key
   rows of B (rb bytes each), 4 keys at a time (a last partial block repeats B's last row and
   stores only its own). */
INLINE void gqk_block(const int MB, const int BITS, const int8_t *hi, const int8_t *lo, size_t cs, const int32_t *Aj,
                      const uint8_t *B, size_t rb, size_t N, size_t K, int type, const float *mult, float *C,
                      size_t ldc)
{
    const size_t g = gqa_group_cols(type), J = K / g, cb = K * BITS / 8;
    const size_t CPS = BITS == 8 ? 16 : 32, BPS = BITS == 2 ? 8 : 16; /* codes and bytes a step */
    const int KIND = BITS == 8 ? DOT_U8 : BITS == 4 ? DOT_U4 : DOT_U2;
    for (size_t n = 0; n < N; n += 4) {
        const size_t nv = N - n < 4 ? N - n : 4;
        const uint8_t *b[4];
        for (int i = 0; i < 4; i++)
            b[i] = B + (n + ((size_t)i < nv ? (size_t)i : nv - 1)) * rb;
        float32x4_t S[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (size_t j = 0; j < J; j++) {
            int32x4_t ah[2][4], al[2][4];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                UNROLL
                for (int i = 0; i < 4; i++)
                    ah[mb][i] = al[mb][i] = vdupq_n_s32(0);
            for (size_t k = j * g; k < (j + 1) * g; k += CPS) {
                const size_t off = k / CPS * BPS;
                UNROLL
                for (int i = 0; i < 4; i++) {
                    int8x16_t v[2];
                    const int NV = dot_step_codes(KIND, b[i] + off, v);
                    UNROLL
                    for (int mb = 0; mb < MB; mb++)
                        UNROLL
                        for (int x = 0; x < NV; x++) {
                            ah[mb][i] = vdotq_s32(ah[mb][i], vld1q_s8(hi + mb * cs + k + 16 * x), v[x]);
                            al[mb][i] = vdotq_s32(al[mb][i], vld1q_s8(lo + mb * cs + k + 16 * x), v[x]);
                        }
                }
            }
            float32x4_t s4, z4;
            gqk_meta4(b, cb, j, type, &s4, &z4);
            UNROLL
            for (int mb = 0; mb < MB; mb++) {
                int32x4_t t[4];
                UNROLL
                for (int i = 0; i < 4; i++)
                    t[i] = vaddq_s32(vshlq_n_s32(ah[mb][i], 8), al[mb][i]);
                /* lane i: key i's D_j (INT8: plus 128 A_j for the codes taken as u - 128) */
                int32x4_t d = vpaddq_s32(vpaddq_s32(t[0], t[1]), vpaddq_s32(t[2], t[3]));
                const int32_t a = Aj[mb * J + j];
                if (BITS == 8)
                    d = vaddq_s32(d, vdupq_n_s32(128 * a));
                const float32x4_t t1 = vmulq_f32(s4, vcvtq_f32_s32(d)), t2 = vmulq_f32(z4, vdupq_n_f32((float)a));
                S[mb] = vaddq_f32(S[mb], vaddq_f32(t1, t2));
            }
        }
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            float out[4];
            vst1q_f32(out, vmulq_f32(S[mb], vdupq_n_f32(mult[mb])));
            memcpy(C + mb * ldc + n, out, nv * sizeof(float));
        }
    }
}

#define GQK_INST(MB, BITS)                                                                             \
    static void gqk_##MB##_##BITS(const int8_t *hi, const int8_t *lo, size_t cs, const int32_t *Aj,     \
                                  const uint8_t *B, size_t rb, size_t N, size_t K, int type, const float *mult, \
                                  float *C, size_t ldc)                                                \
    {                                                                                                  \
        gqk_block(MB, BITS, hi, lo, cs, Aj, B, rb, N, K, type, mult, C, ldc);                          \
    }
typedef void (*gqk_fn)(const int8_t *, const int8_t *, size_t, const int32_t *, const uint8_t *, size_t, size_t,
                       size_t, int, const float *, float *, size_t);
GQK_INST(1, 8) GQK_INST(2, 8) GQK_INST(1, 4) GQK_INST(2, 4) GQK_INST(1, 2) GQK_INST(2, 2)
static gqk_fn gqk_pick(int rows, unsigned bits)
{
    static const gqk_fn f[3][2] = {{gqk_1_8, gqk_2_8}, {gqk_1_4, gqk_2_4}, {gqk_1_2, gqk_2_2}};
    return f[bits == 8 ? 0 : bits == 4 ? 1 : 2][rows - 1];
}

void gqa_qk_gemm_g_dot_neon(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                            int type, float *C, size_t ldc)
{
    int8_t hi[2 * DOT_QK_K] __attribute__((aligned(16))), lo[2 * DOT_QK_K] __attribute__((aligned(16)));
    int32_t Aj[2 * DOT_QK_K / 32];
    if (K == 0 || K > DOT_QK_K || !gqa_group_dot_takes(type, K)) {
        gqa_kernels_neon.qk_gemm(M, N, K, alpha, A, lda, B, type, NULL, C, ldc);
        return;
    }
    const unsigned bits = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type), J = K / g, rb = gqa_row_bytes(type, K);
    const int order = bits == 8 ? DOT_NATURAL : bits == 4 ? DOT_EO : DOT_PHASE;
    for (size_t m0 = 0; m0 < M;) {
        /* blocks of at most 2 consecutive rows the contract covers; each other row exact */
        size_t rows[2];
        float mult[2];
        int mb = 0;
        for (; m0 < M && mb < 2; ++m0) {
            if (dot_qk_row(A + m0 * lda, K, NULL, 0, alpha, order, hi + mb * K, lo + mb * K, K, g, Aj + mb * J,
                           &mult[mb]))
                rows[mb++] = m0;
            else
                gqa_kernels_neon.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc);
        }
        if (mb == 2 && rows[1] == rows[0] + 1)
            gqk_pick(2, bits)(hi, lo, K, Aj, (const uint8_t *)B, rb, N, K, type, mult, C + rows[0] * ldc, ldc);
        else
            for (int i = 0; i < mb; i++)
                gqk_pick(1, bits)(hi + i * K, lo + i * K, K, Aj + i * J, (const uint8_t *)B, rb, N, K, type, mult + i,
                                  C + rows[i] * ldc, ldc);
    }
}

/* ---- sv_gemm_s8_dot on group rows ---------------------------------------------------------- */

/* One row's part of a chunk and group: w_k = fl(p_k s_k) quantized against its maximum (halves
   ph / pl; all zero, with sp 0, when the maximum is 0 or 32767 / it is not finite), sum of the
   codes, and Z, the zeros' term. */
static void gsv_row(const float *p, const float *sc, const float *zc, size_t kn, int8_t *ph, int8_t *pl, float *sp,
                    int32_t *psum, float *Z)
{
    float w[SV_KG + 4];
    float32x4_t mx = vdupq_n_f32(0.0f), z0 = vdupq_n_f32(0.0f), z1 = vdupq_n_f32(0.0f);
    for (size_t k = 0; k < kn; k += 8) {
        float pb[8] = {0}, sb[8] = {0}, zb[8] = {0};
        const float *pp = p + k, *ss = sc + k, *zz = zc + k;
        if (kn - k < 8) { /* keys past the chunk: 0, which leaves every lane as it is */
            memcpy(pb, p + k, (kn - k) * sizeof(float));
            memcpy(sb, sc + k, (kn - k) * sizeof(float));
            memcpy(zb, zc + k, (kn - k) * sizeof(float));
            pp = pb, ss = sb, zz = zb;
        }
        const float32x4_t p0 = vld1q_f32(pp), p1 = vld1q_f32(pp + 4);
        const float32x4_t w0 = vmulq_f32(p0, vld1q_f32(ss)), w1 = vmulq_f32(p1, vld1q_f32(ss + 4));
        vst1q_f32(w + k, w0);
        vst1q_f32(w + k + 4, w1);
        mx = vmaxq_f32(mx, vmaxq_f32(w0, w1));
        z0 = vaddq_f32(z0, vmulq_f32(p0, vld1q_f32(zz)));      /* lanes 0-3: keys 0-3 mod 8 */
        z1 = vaddq_f32(z1, vmulq_f32(p1, vld1q_f32(zz + 4)));  /* lanes 4-7 */
    }
    float l[4];
    vst1q_f32(l, vaddq_f32(z0, z1)); /* lanes i + (i + 4) */
    *Z = (l[0] + l[2]) + (l[1] + l[3]);
    const float wmax = vmaxvq_f32(mx), inv = SV_CODE_MAX / wmax;
    if (wmax > 0.0f && inv <= FLT_MAX) {
        *sp = wmax / SV_CODE_MAX;
        *psum = dot_sv_codes(w, kn, inv, ph, pl);
    } else {
        *sp = 0.0f;
        *psum = 0;
        memset(ph, 0, (kn + 15) & ~(size_t)15);
        memset(pl, -128, (kn + 15) & ~(size_t)15);
    }
}

/* One chunk's sums d (16 columns, w of them) into crow: crow[n] = fl(fl(r + fl(float(d[n]) sp)) +
   Z) with r = crow[n], or on the first chunk (beta == 0 ? 0 : fl(beta crow[n])). */
static void gsv_finish(const int32x4_t d[4], size_t w, float *crow, float sp, float Z, float beta, int first)
{
    float cb[16];
    memcpy(cb, crow, w * sizeof(float));
    for (size_t j = 0; 4 * j < w; j++) {
        float32x4_t r = vld1q_f32(cb + 4 * j);
        if (first)
            r = beta == 0.0f ? vdupq_n_f32(0.0f) : vmulq_f32(vdupq_n_f32(beta), r);
        r = vaddq_f32(r, vmulq_f32(vcvtq_f32_s32(d[j]), vdupq_n_f32(sp)));
        vst1q_f32(cb + 4 * j, vaddq_f32(r, vdupq_n_f32(Z)));
    }
    memcpy(crow, cb, w * sizeof(float));
}

void gqa_sv_gemm_g_dot_neon(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                            float *C, size_t ldc, float beta)
{
    int8_t ph[DOT_SV_MB][SV_KG] __attribute__((aligned(16))), pl[DOT_SV_MB][SV_KG] __attribute__((aligned(16)));
    int8x16_t tile[SV_KG];
    float sc[SV_KG], zc[SV_KG];
    if (K == 0 || !gqa_group_dot_takes(type, N)) {
        gqa_kernels_neon.sv_gemm(M, N, K, A, lda, B, type, NULL, C, ldc, beta);
        return;
    }
    const unsigned bits = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type), J = N / g, rb = gqa_row_bytes(type, N), cb = N * bits / 8;
    const int kind = bits == 8 ? DOT_U8 : bits == 4 ? DOT_U4 : DOT_U2;
    const uint8_t *Bb = (const uint8_t *)B;
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[DOT_SV_MB];
        float inv_row, sp_row, sp[DOT_SV_MB], Z[DOT_SV_MB];
        int32_t corr[DOT_SV_MB];
        int mb = 0;
        for (; m0 < M && mb < DOT_SV_MB; ++m0) {
            if (dot_sv_row(A + m0 * lda, K, &inv_row, &sp_row)) /* the row's cases only: codes per chunk */
                rows[mb++] = m0;
            else
                gqa_kernels_neon.sv_gemm(1, N, K, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc, beta);
        }
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KG) {
            const size_t kn = K - k0 < SV_KG ? K - k0 : SV_KG, np = (kn + 15) & ~(size_t)15;
            const uint8_t *bk = Bb + k0 * rb;
            for (size_t j = 0; j < J; j++) {
                for (size_t k = 0; k < kn; k++)
                    gqa_group_meta(bk + k * rb + cb, j, type, &sc[k], &zc[k]);
                for (int i = 0; i < mb; i++) { /* INT8: + 128 sum p, for the codes taken as u - 128 */
                    gsv_row(A + rows[i] * lda + k0, sc, zc, kn, ph[i], pl[i], &sp[i], &corr[i], &Z[i]);
                    corr[i] = bits == 8 ? 128 * corr[i] : 0;
                }
                for (size_t n0 = j * g; n0 < (j + 1) * g; n0 += 16) {
                    int32x4_t colsum[4], d[2][4];
                    dot_sv_tile(bk + n0 * bits / 8, rb, kn, np, kind, 16, tile, colsum);
                    for (int i = 0; i < mb; i += 2) {
                        const int two = i + 1 < mb;
                        dot_sv_dots_n(two, ph[i], pl[i], SV_KG, tile, np, colsum, corr + i, d);
                        for (int r = 0; r <= two; r++)
                            gsv_finish(d[r], 16, C + rows[i + r] * ldc + n0, sp[i + r], Z[i + r], beta, k0 == 0);
                    }
                }
            }
        }
    }
}
#endif
