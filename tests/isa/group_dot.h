/*
 * group_dot.h -- part of driver.c (included after its helpers): accuracy level 4's per-group
 * contracts (kernels_s8dot_contract.h) stated in plain C, and check_group_dot, which runs a
 * table's qk_gemm_s8_dot / sv_gemm_s8_dot on per-group rows (GQA_G8 / G4 / G2, float32 and
 * binary16 metadata, groups of 32 to 256) against them bit for bit:
 *   dot.group.qk   rows of A 1..5, 16 and 23 (the avx2 unit's packed kernels of 16 rows or
 *                  more; a row of zeros and one with a NaN: the exact kernel's), heads 64..512,
 *                  1..37 keys;
 *   dot.group.sv   1..700 keys (across the 256-key chunks, a chunk of zero probabilities), heads
 *                  32..256, beta 0 / 1 / 0.5 (a row with a negative element: the exact kernel's);
 *                  rows 1..4, 16 and 23; and 1-4 and 17 rows of heads 96..480 with groups of
 *                  32, 96 and 160 (blocks of columns that end inside a group);
 *   dot.group.out  groups of 16 columns (outside the contracts) as the exact kernels.
 */
#include "kernels_group.h"

#define GDOT_KC 256 /* the contract's SV_KG */

/* Codes u[0, cols) and each group's scale and zero of one stored row. */
static void gdot_parts(const uint8_t *row, size_t cols, int type, int32_t *u, float *s, float *z)
{
    const unsigned b = gqa_group_bits(type), per = 8 / b;
    const size_t g = gqa_group_cols(type);
    for (size_t k = 0; k < cols; k++)
        u[k] = (row[k / per] >> (b * (k % per))) & ((1u << b) - 1);
    for (size_t j = 0; j < cols / g; j++)
        gqa_group_meta(row + cols * b / 8, j, type, &s[j], &z[j]);
}

/* qk_gemm_s8_dot's per-group contract for row a (finite, not all zero) against N rows of B. */
static void gqk_oracle_row(size_t N, size_t K, float alpha, const float *a, const uint8_t *B, int type, float *c)
{
    const size_t g = gqa_group_cols(type), J = K / g, rb = gqa_row_bytes(type, K);
    int32_t *code = xmalloc(K * 4), *u = xmalloc(K * 4);
    int64_t *Aj = xmalloc(J * 8);
    float *s = xmalloc(J * 4), *z = xmalloc(J * 4);
    float amax = 0.0f;
    for (size_t k = 0; k < K; k++)
        amax = fabsf(a[k]) > amax ? fabsf(a[k]) : amax;
    const float inv = 32639.0f / amax, sa = amax / 32639.0f, mult = alpha * sa;
    for (size_t j = 0; j < J; j++)
        Aj[j] = 0;
    for (size_t k = 0; k < K; k++) {
        float q = rintf(a[k] * inv);
        q = q > 32639.0f ? 32639.0f : q < -32639.0f ? -32639.0f : q;
        code[k] = (int32_t)q;
        Aj[k / g] += code[k];
    }
    for (size_t n = 0; n < N; n++) {
        gdot_parts(B + n * rb, K, type, u, s, z);
        float S = 0.0f;
        for (size_t j = 0; j < J; j++) {
            int64_t D = 0;
            for (size_t k = j * g; k < (j + 1) * g; k++)
                D += (int64_t)code[k] * u[k];
            const float t1 = s[j] * (float)D, t2 = z[j] * (float)Aj[j];
            S = S + (t1 + t2);
        }
        c[n] = S * mult;
    }
    free(code), free(u), free(Aj), free(s), free(z);
}

/* sv_gemm_s8_dot's per-group contract for row a (finite, >= 0, not all zero) over K rows of B. */
static void gsv_oracle_row(size_t N, size_t K, const float *a, const uint8_t *B, int type, float *c, float beta)
{
    const size_t g = gqa_group_cols(type), J = N / g, rb = gqa_row_bytes(type, N);
    int32_t *u = xmalloc(K * N * 4), *pc = xmalloc(GDOT_KC * 4);
    float *s = xmalloc(K * J * 4), *z = xmalloc(K * J * 4), *r = xmalloc(N * 4);
    for (size_t k = 0; k < K; k++)
        gdot_parts(B + k * rb, N, type, u + k * N, s + k * J, z + k * J);
    for (size_t n = 0; n < N; n++)
        r[n] = beta == 0.0f ? 0.0f : beta * c[n];
    for (size_t k0 = 0; k0 < K; k0 += GDOT_KC) {
        const size_t kn = K - k0 < GDOT_KC ? K - k0 : GDOT_KC;
        for (size_t j = 0; j < J; j++) {
            float wmax = 0.0f, lane[8] = {0};
            for (size_t k = 0; k < kn; k++) {
                const float w = a[k0 + k] * s[(k0 + k) * J + j];
                wmax = w > wmax ? w : wmax;
                lane[k % 8] = lane[k % 8] + a[k0 + k] * z[(k0 + k) * J + j];
            }
            const float inv = 32767.0f / wmax;
            const int ok = wmax > 0.0f && inv <= FLT_MAX;
            const float sp = ok ? wmax / 32767.0f : 0.0f;
            for (size_t k = 0; k < kn; k++) {
                const float q = rintf((a[k0 + k] * s[(k0 + k) * J + j]) * inv);
                pc[k] = ok ? (int32_t)(q < 32767.0f ? q : 32767.0f) : 0;
            }
            const float Z = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
            for (size_t n = j * g; n < (j + 1) * g; n++) {
                int64_t D = 0;
                for (size_t k = 0; k < kn; k++)
                    D += (int64_t)pc[k] * u[(k0 + k) * N + n];
                r[n] = (r[n] + (float)D * sp) + Z;
            }
        }
    }
    memcpy(c, r, N * 4);
    free(u), free(pc), free(s), free(z), free(r);
}

/* n rows of `cols` values of one group type, quantized by the scalar path (each row its own
   spread and offset, so that scales and zeros differ). */
static uint8_t *gdot_rows(size_t n, size_t cols, int type)
{
    float *x = xmalloc(n * cols * 4);
    uint8_t *q = xmalloc(n * gqa_row_bytes(type, cols)); /* exactly: ASan sees a read past the rows */
    for (size_t i = 0; i < n * cols; i++)
        x[i] = normal() * (0.5f + (float)((i / cols) % 5)) + (float)((int)((i / cols) % 3) - 1);
    R->quantize(x, cols, q, n, cols, type, NULL);
    free(x);
    return q;
}

/* One P @ V case: sv on M rows of A [M, K] against B (K rows of N columns of `type`), into C
   rows filled with normal values first (beta), against the contract's statement row by row (row
   exact_row, if < M, against the table's own exact kernel: its elements send it there); 1 on
   a mismatch (the first five shown). */
static int gsv_check(gqa_sv_gemm_fn sv, size_t M, size_t N, size_t K, const float *A, const uint8_t *B, int type,
                     float beta, size_t exact_row, int *shown)
{
    float *got = xmalloc(M * N * 4), *want = xmalloc(M * N * 4);
    for (size_t i = 0; i < M * N; i++)
        got[i] = want[i] = normal();
    sv(M, N, K, A, K, B, type, NULL, got, N, beta);
    for (size_t m = 0; m < M; m++)
        if (m == exact_row)
            T->sv_gemm(1, N, K, A + m * K, K, B, type, NULL, want + m * N, N, beta);
        else
            gsv_oracle_row(N, K, A + m * K, B, type, want + m * N, beta);
    int bad = 0;
    for (size_t i = 0; i < M * N; i++)
        bad |= !same_float(got[i], want[i]);
    if (bad && (*shown)++ < 5)
        printf("  dot.group.sv mismatch: type %#x K %zu N %zu M %zu beta %g\n", type, K, N, M, (double)beta);
    free(got), free(want);
    return bad;
}

static void check_group_dot(gqa_qk_gemm_fn qk, gqa_sv_gemm_fn sv)
{
    static const int kinds[3] = {GQA_G8, GQA_G4, GQA_G2};
    static const size_t gs[4] = {32, 64, 128, 256};
    static const size_t QK_K[4] = {64, 128, 256, 512}, QK_N[4] = {1, 4, 13, 37};
    static const size_t SV_K[6] = {1, 7, 255, 256, 300, 700}, SV_N[3] = {32, 64, 256};
    static const float betas[3] = {0.0f, 1.0f, 0.5f};
    static const size_t QK_M[7] = {1, 2, 3, 4, 5, 16, 23}, SV_M[6] = {1, 2, 3, 4, 16, 23};
    long cases[3] = {0}, fails[3] = {0};
    int shown = 0;
    for (int ki = 0; ki < 3; ki++)
        for (int meta16 = 0; meta16 < 2; meta16++)
            for (int gi = 0; gi < 4; gi++) {
                const int type = gqa_group_type(kinds[ki], gs[gi], meta16);
                for (int t = 0; t < 4; t++) { /* Q K^T */
                    const size_t K = QK_K[t], N = QK_N[(t + gi + ki) % 4], M = QK_M[(t + gi + ki + meta16) % 7];
                    if (K % gs[gi])
                        continue;
                    uint8_t *B = gdot_rows(N, K, type);
                    float *A = xmalloc(M * K * 4), *got = xmalloc(M * (N + 1) * 4), *want = xmalloc(M * (N + 1) * 4);
                    for (size_t i = 0; i < M * K; i++)
                        A[i] = normal() * ((i % K) % 5 == 0 ? 8.0f : 1.0f);
                    if (M > 2) { /* rows the contract leaves to the exact kernel */
                        memset(A + K, 0, K * 4);
                        A[2 * K + K / 3] = NAN;
                    }
                    for (size_t i = 0; i < M * (N + 1); i++)
                        got[i] = want[i] = GUARD_F;
                    qk(M, N, K, 0.125f, A, K, B, type, NULL, got, N + 1);
                    for (size_t m = 0; m < M; m++)
                        if (M > 2 && (m == 1 || m == 2))
                            T->qk_gemm(1, N, K, 0.125f, A + m * K, K, B, type, NULL, want + m * (N + 1), N + 1);
                        else
                            gqk_oracle_row(N, K, 0.125f, A + m * K, B, type, want + m * (N + 1));
                    int bad = 0;
                    for (size_t i = 0; i < M * (N + 1); i++)
                        bad |= !same_float(got[i], want[i]);
                    cases[0]++, fails[0] += bad;
                    if (bad && shown++ < 5)
                        printf("  dot.group.qk mismatch: type %#x K %zu N %zu M %zu\n", type, K, N, M);
                    free(A), free(got), free(want), free(B);
                }
                for (int t = 0; t < 6; t++) { /* P @ V */
                    const size_t K = SV_K[t], N = SV_N[(t + gi) % 3], M = SV_M[(t + ki + gi) % 6];
                    const float beta = betas[(t + gi + meta16) % 3];
                    if (N % gs[gi])
                        continue;
                    uint8_t *B = gdot_rows(K, N, type);
                    float *A = xmalloc(M * K * 4);
                    for (size_t i = 0; i < M * K; i++)
                        A[i] = unif() * unif();
                    for (size_t m = 0; m < M; m++)
                        A[m * K + rnd() % K] = 1.0f;
                    if (K > 300)
                        for (size_t k = 256; k < 512; k++) /* a chunk of zeros (its codes and sp are 0) */
                            A[k] = 0.0f;
                    if (M > 1)
                        A[K + K / 2] = -0.25f; /* the exact kernel's */
                    cases[1]++, fails[1] += gsv_check(sv, M, N, K, A, B, type, beta, M > 1 ? 1 : M, &shown);
                    free(A), free(B);
                }
            }
    /* P @ V of widths and groups that are not powers of two (a head of 96 or 160 is one group
       with kv_quant_group_size 0): blocks of columns that end inside a group, or hold a part of
       a group, for every row count */
    static const size_t ODD[4][2] = {{32, 96}, {32, 160}, {96, 480}, {160, 480}}; /* (g, N) */
    for (int ki = 0; ki < 3; ki++)
        for (int o = 0; o < 4; o++)
            for (size_t M = 1; M <= 17; M = M == 4 ? 17 : M + 1) {
                const size_t g = ODD[o][0], N = ODD[o][1], K = M % 2 ? 255 : 513;
                const int type = gqa_group_type(kinds[ki], g, (int)(M + (size_t)o) % 2);
                const float beta = betas[(M + (size_t)o) % 3];
                uint8_t *B = gdot_rows(K, N, type);
                float *A = xmalloc(M * K * 4);
                for (size_t i = 0; i < M * K; i++)
                    A[i] = unif() * unif();
                cases[1]++, fails[1] += gsv_check(sv, M, N, K, A, B, type, beta, M, &shown);
                free(A), free(B);
            }
    for (int ki = 0; ki < 3; ki++) { /* groups of 16: the exact kernels */
        const int type = gqa_group_type(kinds[ki], 16, 0);
        const size_t K = 64, N = 9, M = 3;
        uint8_t *B = gdot_rows(N, K, type);
        float A[3 * 64], got[3 * 64], want[3 * 64];
        for (size_t i = 0; i < M * K; i++)
            A[i] = unif();
        qk(M, N, K, 0.5f, A, K, B, type, NULL, got, N);
        T->qk_gemm(M, N, K, 0.5f, A, K, B, type, NULL, want, N);
        int bad = memcmp(got, want, M * N * 4) != 0;
        free(B);
        B = gdot_rows(N, K, type);
        for (size_t i = 0; i < M * K; i++)
            got[i] = want[i] = normal();
        sv(M, K, N, A, N, B, type, NULL, got, K, 1.0f);
        T->sv_gemm(M, K, N, A, N, B, type, NULL, want, K, 1.0f);
        bad |= memcmp(got, want, M * K * 4) != 0;
        cases[2]++, fails[2] += bad;
        if (bad && shown++ < 5)
            printf("  dot.group.out mismatch: type %#x\n", type);
        free(B);
    }
    static const char *const names[3] = {"dot.group.qk", "dot.group.sv", "dot.group.out"};
    for (int i = 0; i < 3; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
}
