/*
 * kernels_neon_s8dot.c -- accuracy level 4's integer-dot kernels of path `neon`: QK and P @ V on
 * INT8 and INT4 per-tensor and per-channel codes with 15-bit query rows and probabilities, the
 * contracts of kernels_s8dot_contract.h, bit for bit the results of the AVX2, AVX-512 VNNI and
 * AMX INT8 units.
 * ISA flags: -march=armv8.2-a+dotprod (FEAT_DotProd's sdot); setup.py compiles it with the neon
 * path and then defines GQA_HAVE_NEON_S8DOT for kernels_neon.c, whose table holds
 * gqa_qk_gemm_s8_dot_neon and gqa_sv_gemm_s8_dot_neon; the dispatch runs them only where the CPU
 * reports the dot product (HWCAP_ASIMDDP, gqa_s8_dot_table).  The whole file is empty
 * elsewhere.
 *
 * sdot multiplies signed bytes four at a time into int32 lanes, so each 15-bit code is taken as
 * two byte halves (kernels_neon_dot.h) and the sums recombined exactly: QK's D = 256 D_hi + D_lo;
 * P @ V's D[n] = 256 D_ph[n] + D_pl[n] + 128 sum_k v[k, n] (the probabilities' low halves are
 * offset by 128; the column sums serve every row of a call).
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
#include "kernels_neon_dot.h"

/* The per-group kernels (kernels_neon_gdot.c), which the entries hand group types to. */
void gqa_qk_gemm_g_dot_neon(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                            int type, float *C, size_t ldc);
void gqa_sv_gemm_g_dot_neon(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                            float *C, size_t ldc, float beta);

/* ---- qk_gemm_s8_dot ------------------------------------------------------------------------ */

/* One 16-byte step p of each of NB rows of B for rows mb < MB of the halves (stride cs):
   ah / al[mb * NB + nb] += the products of its codes with the high / low halves. */
INLINE void qk_step(const int MB, const int NB, const int S4, const int8_t *const *p, const int8_t *hi,
                    const int8_t *lo, size_t cs, int32x4_t *ah, int32x4_t *al)
{
    UNROLL
    for (int nb = 0; nb < NB; nb++) {
        int8x16_t v[2];
        const int nv = dot_step_codes(S4 ? DOT_U4 : DOT_S8, (const uint8_t *)p[nb], v);
        UNROLL
        for (int mb = 0; mb < MB; mb++)
            UNROLL
            for (int x = 0; x < nv; x++) {
                ah[mb * NB + nb] = vdotq_s32(ah[mb * NB + nb], vld1q_s8(hi + mb * cs + 16 * x), v[x]);
                al[mb * NB + nb] = vdotq_s32(al[mb * NB + nb], vld1q_s8(lo + mb * cs + 16 * x), v[x]);
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
    if (GQA_IS_GROUP(type)) {
        gqa_qk_gemm_g_dot_neon(M, N, K, alpha, A, lda, B, type, C, ldc);
        return;
    }
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
            if (dot_qk_row(A + m0 * lda, K, s, pc, alpha, s4 ? DOT_EO : DOT_NATURAL, hi + mb * cs, lo + mb * cs, cs,
                           cs, &sum, &mult[mb])) {
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
    int8_t ph[DOT_SV_MB][SV_KS] __attribute__((aligned(16))), pl[DOT_SV_MB][SV_KS] __attribute__((aligned(16)));
    int8x16_t tile[SV_KS];
    if (GQA_IS_GROUP(type)) {
        gqa_sv_gemm_g_dot_neon(M, N, K, A, lda, B, type, C, ldc, beta);
        return;
    }
    if (!gqa_dot_codes(type) || K == 0) {
        gqa_kernels_neon.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    const size_t rb = gqa_row_bytes(type, N);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[DOT_SV_MB];
        float inv[DOT_SV_MB], sp[DOT_SV_MB];
        int mb = 0;
        for (; m0 < M && mb < DOT_SV_MB; ++m0) {
            if (dot_sv_row(A + m0 * lda, K, &inv[mb], &sp[mb]))
                rows[mb++] = m0;
            else
                gqa_kernels_neon.sv_gemm(1, N, K, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc, beta);
        }
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS, np = (kn + 15) & ~(size_t)15;
            int32_t corr[DOT_SV_MB]; /* INT4's - 8 sum p */
            for (int i = 0; i < mb; i++)
                corr[i] = -8 * dot_sv_codes(A + rows[i] * lda + k0, kn, inv[i], ph[i], pl[i]) * s4;
            const int8_t *bk = (const int8_t *)B + k0 * rb;
            for (size_t n0 = 0; n0 < N; n0 += 16) {
                const size_t w = N - n0 < 16 ? N - n0 : 16;
                int32x4_t colsum[4], d[2][4];
                dot_sv_tile((const uint8_t *)bk + gqa_row_bytes(type, n0), rb, kn, np, s4 ? DOT_U4 : DOT_S8, w, tile,
                            colsum);
                for (int i = 0; i < mb; i += 2) {
                    const int two = i + 1 < mb;
                    dot_sv_dots_n(two, ph[i], pl[i], SV_KS, tile, np, colsum, corr + i, d);
                    for (int r = 0; r <= two; r++)
                        sv_finish(d[r], w, C + rows[i + r] * ldc + n0, pc ? s + n0 : s, pc, sp[i + r], beta,
                                  k0 == 0);
                }
            }
        }
    }
}
#endif
