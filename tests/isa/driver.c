/*
 * driver.c -- compares one kernel path against the scalar reference on the
 * kernel contract (gqa_kernels.h), without Python, so that a path this CPU
 * cannot run natively can be run under qemu or an emulation layer.
 *
 * Build: this file + kernels_scalar.c + the path's TU, with
 *   -DGQA_TEST_TABLE=gqa_kernels_<path>   (the table under test).
 * Run:   driver [exact] [approx] [dot] [tiles=NAME]   (default: the first two; `approx` needs a
 *        table with qk_gemm_s8_approx; `dot` checks a path's own level-4 unit).
 *
 * Checks (each prints one line; a failure prints its first cases):
 *   quantize        codes / packed bytes / binary16 bit for bit, all six
 *                   types, specials (ties, NaN, +-inf, zero and tiny scales),
 *                   row strides; bytes past the rows untouched.
 *   dequantize(_t)  bit for bit (NaN-aware), from every byte value; 1 to 35
 *                   rows (the transposing kernels work in 8 x 8 / 16 x 16 blocks).
 *   qk_gemm         |C - C_scalar| <= 1e-5 (1 + |alpha| sum|a||b|); C prefilled
 *                   with NaN; padding of C untouched.
 *   qk_gemm.split   C bit-identical when computed row by row and column by
 *                   column (C[m,n] never depends on M, N or blocking).
 *   sv_gemm         beta 0 (C prefilled with NaN), 1, 0.5; |C - C_scalar| <=
 *                   1e-5 (1 + |beta C0| + sum|a||b|); padding untouched.
 *   sv_gemm.split   C bit-identical when computed row by row.
 *   exp_sum         x[i] = exp(x[i] - m) within 4 ulp of libm expf, exactly +0
 *                   below GQA_EXP_MIN and for -inf, NaN kept, x[n..] untouched;
 *   exp_sum.sum     the returned sum close to the scalar one (see check_exp).
 *   group.*         per-group types (G8 / G4 / G2, fp32 and fp16 metadata, groups of 4 to
 *                   128 columns): quantize bytes and dequantize(_t) values bit for bit (rows
 *                   with NaN, inf, constant groups; rho 1 and 0.5); qk / sv within the
 *                   bounds above, for 1..9 and 16 rows of A.
 *   row_max         the same value as a plain loop (NaN skipped, -inf for n = 0),
 *                   rows of NaN, +-inf, +-0 and finite values, lengths 0 .. 4099.
 *   hadamard_rows   the `+had` rotation and its transpose: the scalar table's bits, and
 *                   within the stated bound of float64 over R built from its definition.
 *   rope_row        the rotary embedding of a row (plain and interleaved pairs, in place too):
 *                   the contract's bits, the scalar table's, within 2^-24 of float64.
 *   approx.*        the approximate INT8 QK kernel: bit for bit against the
 *                   contract (oracle below), the integer dot read back exactly,
 *                   the error bound against the exact scalar path, edge rows;
 *                   per-channel codes bit for bit as per-tensor codes of the
 *                   rows times the scales.
 *   tiles.*      (mode `tiles=NAME`: the table's tiles NAME, amx or avx512bf16) pack_rows / pack_pairs /
 *                   pack_pairs_t bit for bit against
 *                   the bfloat16 rounding of the contract (ties, NaN, inf, subnormals) with
 *                   zero padding; gemm exact on small integers (acc 0 over NaN in C, acc 1),
 *                   within (K + 2) 2^-24 sum|ab| on normal operands, strides, C's padding kept;
 *                   exp_pack within 2^-16 of exp, 0 below -86.7 and for -inf, no subnormal,
 *                   NaN kept, its sum, its bfloat16 row with zeros to n_pad; without `store`
 *                   x untouched, the same sum and row.
 *   dot.group.*  (modes `dot`: a path's own level-4 unit, and `approx`: the VNNI unit's) the
 *                   per-group contracts, group_dot.h.
 *   dot.sv.*     the INT8 P @ V kernel of accuracy level 4: bit for bit against
 *                   its contract (keys 1 .. 20000, across its 8192-key chunks,
 *                   columns 1 .. 130, beta 0 / 1 / 0.5, per tensor and per channel),
 *                   the bound against the exact scalar path, and rows with a
 *                   negative / NaN / inf element or all zeros as the path's exact kernel.
 * Widths 1..33, 63, 64, 65, 127, 128, 129, 256 (and K = 0; qk_gemm also K 2500,
 * 9000); M 1..9 and 16;
 * sv_gemm keys 0, 1, 7, 29, 300.
 * The last line is "driver <path>: <n> checks, <f> failed" and the exit
 * status is 1 when anything failed.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels_common.h" /* gqa_kernels.h, GQA_EXP_MIN */
#include "bf16_ref.h"       /* bf16_ref, bf16_daz: the tiles' bfloat16 rounding and inputs */

#ifndef GQA_TEST_TABLE
#error "define GQA_TEST_TABLE as the kernel table under test, e.g. gqa_kernels_neon"
#endif
extern const gqa_kernels GQA_TEST_TABLE;
static const gqa_kernels *const T = &GQA_TEST_TABLE;
static const gqa_kernels *const R = &gqa_kernels_scalar;

static const char *const TYPE_NAMES[6] = {"S8_PT", "S8_PC", "S4_PT", "S4_PC", "F32", "F16"};
static const size_t WIDTHS[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14,  15,  16,  17,  18,  19, 20,
                                21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 63, 64, 65, 127, 128, 129, 256};
#define NW (sizeof(WIDTHS) / sizeof(WIDTHS[0]))
static const size_t MS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
#define NM (sizeof(MS) / sizeof(MS[0]))
#define GUARD 0x5A
#define GUARD_F (-1234.5f)

/* ---- bookkeeping -------------------------------------------------------- */

static long n_checks, n_failed;
static long check_cases, check_fails;
static const char *check_name;

static void begin(const char *name)
{
    check_name = name;
    check_cases = check_fails = 0;
}

static void end(void)
{
    printf("%-14s %s: %ld cases, %ld failed\n", check_name, check_fails ? "FAIL" : "ok", check_cases, check_fails);
    n_checks++;
    n_failed += check_fails != 0;
}

/* Record one case; print the first few failures of a check. */
static void expect(int ok, const char *fmt, ...)
{
    check_cases++;
    if (ok)
        return;
    if (check_fails++ < 5) {
        va_list ap;
        va_start(ap, fmt);
        printf("  %s mismatch: ", check_name);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}

/* ---- data ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float unif(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)); } /* [0, 1) */
static float normal(void)
{
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += unif();
    return (s - 2.0f) * 1.7320508f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static int same_float(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (a != a && b != b);
}

static int is_pt(int type) { return type == GQA_S8_PT || type == GQA_S4_PT; }

/* Scales for a type and width: per-tensor from a list including 0, a power of
   two (exact ties) and a denormal (1/s overflows); per-channel random with a
   zero and a power of two. */
static void make_scales(float *s, int type, size_t cols, int variant)
{
    static const float pt[4] = {0.05f, 0.25f, 0.0f, 1e-40f};
    if (type >= GQA_F32) {
        s[0] = 1.0f;
        return;
    }
    if (is_pt(type)) {
        s[0] = pt[variant % 4];
        return;
    }
    for (size_t c = 0; c < cols; c++)
        s[c] = 0.01f + 0.09f * unif();
    if (cols > 2)
        s[cols / 2] = 0.0f;
    if (cols > 3)
        s[1] = 0.125f;
}

/* A float input row for quantize: spread over the code range (and past it),
   with exact ties and specials sprinkled in. */
static void make_row(float *x, size_t cols, int type, const float *s)
{
    const float range = type == GQA_S4_PT || type == GQA_S4_PC ? 9.0f : 140.0f;
    for (size_t c = 0; c < cols; c++) {
        float sc = is_pt(type) ? s[0] : (type >= GQA_F32 ? 1.0f : s[c]);
        float v;
        switch (rnd() % 8) {
        case 0: v = ((float)(int)(normal() * range / 3) + 0.5f) * sc; break; /* a tie when sc is 2^k */
        case 1: {
            static const float sp[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 0.0f, -0.0f, 1e-42f,
                                       65519.0f, 65520.0f, 1.00048828125f, 2.98023224e-8f, 6e-8f, -3.5f};
            v = sp[rnd() % (sizeof(sp) / sizeof(sp[0]))];
            break;
        }
        default: v = normal() * range / 3 * (sc == 0.0f ? 1.0f : sc);
        }
        x[c] = v;
    }
}

/* Random bytes for a packed B buffer: every byte value is a valid code; F32
   rows get finite normals, F16 rows finite halves. */
static void make_codes(uint8_t *b, size_t rows, size_t cols, int type)
{
    size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = b + r * rb;
        if (type == GQA_F32) {
            for (size_t c = 0; c < cols; c++) {
                float v = normal();
                memcpy(row + 4 * c, &v, 4);
            }
        } else if (type == GQA_F16) {
            for (size_t c = 0; c < cols; c++) {
                uint16_t h = gqa_float_to_half(normal());
                memcpy(row + 2 * c, &h, 2);
            }
        } else {
            for (size_t i = 0; i < rb; i++)
                row[i] = (uint8_t)rnd();
            if ((type == GQA_S4_PT || type == GQA_S4_PC) && (cols & 1))
                row[rb - 1] = (uint8_t)((row[rb - 1] & 0x0F) | 0x80); /* pad nibble 8 */
        }
    }
}

/* Dequantized copy of B (rows x cols) through the scalar reference. */
static float *dequant_ref(const uint8_t *b, size_t rows, size_t cols, int type, const float *s)
{
    float *d = xmalloc(rows * cols * sizeof(float) + 1);
    if (rows && cols)
        R->dequantize(b, d, cols, rows, cols, type, s);
    return d;
}

/* ---- quantize / dequantize ------------------------------------------------- */

static void check_quantize(void)
{
    begin("quantize");
    for (int type = 0; type < 6; type++)
        for (size_t w = 0; w < NW; w++)
            for (int variant = 0; variant < (is_pt(type) ? 4 : 2); variant++) {
                const size_t cols = WIDTHS[w], rows = 3, lda = cols + 5, rb = gqa_row_bytes(type, cols);
                float *s = xmalloc(cols * sizeof(float)), *x = xmalloc(rows * lda * sizeof(float));
                uint8_t *got = xmalloc(rows * rb + 64), *want = xmalloc(rows * rb + 64);
                make_scales(s, type, cols, variant);
                for (size_t r = 0; r < rows; r++)
                    make_row(x + r * lda, cols, type, s);
                memset(got, GUARD, rows * rb + 64);
                memset(want, GUARD, rows * rb + 64);
                T->quantize(x, lda, got, rows, cols, type, s);
                R->quantize(x, lda, want, rows, cols, type, s);
                size_t i = 0;
                while (i < rows * rb + 64 && got[i] == want[i])
                    i++;
                const int ok = i == rows * rb + 64;
                expect(ok, "%s cols=%zu scale#%d byte %zu (row %zu): got 0x%02x want 0x%02x%s", TYPE_NAMES[type],
                       cols, variant, i, i / rb, ok ? 0 : got[i], ok ? 0 : want[i],
                       i >= rows * rb ? " (past the rows)" : "");
                free(s), free(x), free(got), free(want);
            }
    end();
}

/* Row counts for dequantize(_t): below, at and past the 8 x 8 / 16 x 16 transpose blocks. */
static const size_t DEQ_ROWS[] = {1, 5, 8, 16, 19, 35};

static void check_dequantize(void)
{
    for (int transposed = 0; transposed < 2; transposed++) {
        begin(transposed ? "dequantize_t" : "dequantize");
        for (int type = 0; type < 6; type++)
            for (size_t w = 0; w < NW; w++)
                for (size_t ri = 0; ri < sizeof(DEQ_ROWS) / sizeof(DEQ_ROWS[0]); ri++) {
                    const size_t cols = WIDTHS[w], rows = DEQ_ROWS[ri], rb = gqa_row_bytes(type, cols);
                    const size_t ldd = transposed ? rows + 2 : cols + 2, n = transposed ? cols * ldd : rows * ldd;
                    float *s = xmalloc(cols * sizeof(float)), *got = xmalloc(n * 4), *want = xmalloc(n * 4);
                    uint8_t *b = xmalloc(rows * rb);
                    make_scales(s, type, cols, (int)w);
                    for (size_t i = 0; i < rows * rb; i++) /* every byte value; F16: any half, NaNs too */
                        b[i] = (uint8_t)rnd();
                    if ((type == GQA_S4_PT || type == GQA_S4_PC) && (cols & 1))
                        for (size_t r = 0; r < rows; r++)
                            b[r * rb + rb - 1] = (uint8_t)((b[r * rb + rb - 1] & 0x0F) | 0x80);
                    for (size_t i = 0; i < n; i++)
                        got[i] = want[i] = GUARD_F;
                    (transposed ? T->dequantize_t : T->dequantize)(b, got, ldd, rows, cols, type, s);
                    (transposed ? R->dequantize_t : R->dequantize)(b, want, ldd, rows, cols, type, s);
                    int bad = 0;
                    for (size_t i = 0; i < n && !bad; i++)
                        if (!same_float(got[i], want[i])) {
                            expect(0, "%s rows=%zu cols=%zu at %zu: got %.9g want %.9g", TYPE_NAMES[type], rows, cols,
                                   i, (double)got[i], (double)want[i]);
                            bad = 1;
                        }
                    if (!bad)
                        expect(1, "");
                    free(s), free(got), free(want), free(b);
                }
        end();
    }
}

/* ---- qk_gemm ----------------------------------------------------------------- */

static const size_t LONG_K[2] = {2500, 9000};

static void check_qk(void)
{
    long split_cases = 0, split_fails = 0;
    begin("qk_gemm");
    for (int type = 0; type < 6; type++)
        for (size_t w = 0; w < NW + 3; w++) /* w == NW: K = 0 (C zero-filled); then long rows */
            for (size_t mi = 0; mi < NM; mi++) {
                if (w > NW && mi % 4) /* long rows (a kernel's A scratch outgrows the stack): M 1, 5, 9 */
                    continue;
                const size_t K = w < NW ? WIDTHS[w] : w == NW ? 0 : LONG_K[w - NW - 1];
                const size_t M = MS[mi], N = 37, lda = K + 3, ldc = N + 4;
                const size_t rb = gqa_row_bytes(type, K);
                const float alpha = mi & 1 ? -0.37f : 0.125f;
                float *s = xmalloc((K + 1) * sizeof(float)), *A = xmalloc(M * lda * 4);
                float *got = xmalloc(M * ldc * 4), *want = xmalloc(M * ldc * 4), *piece = xmalloc(M * ldc * 4);
                uint8_t *B = xmalloc(N * rb);
                make_scales(s, type, K, (int)mi % 2);
                for (size_t i = 0; i < M * lda; i++)
                    A[i] = normal();
                make_codes(B, N, K, type);
                for (size_t i = 0; i < M * ldc; i++)
                    got[i] = want[i] = piece[i] = (i % ldc) < N ? NAN : GUARD_F;
                T->qk_gemm(M, N, K, alpha, A, lda, B, type, s, got, ldc);
                R->qk_gemm(M, N, K, alpha, A, lda, B, type, s, want, ldc);
                float *deq = dequant_ref(B, N, K, type, s);
                int bad = 0;
                for (size_t m = 0; m < M && !bad; m++)
                    for (size_t n = 0; n < ldc && !bad; n++) {
                        size_t i = m * ldc + n;
                        if (n >= N) {
                            if (!same_float(got[i], GUARD_F))
                                expect(0, "%s K=%zu M=%zu: C padding [%zu,%zu] overwritten", TYPE_NAMES[type], K,
                                       M, m, n), bad = 1;
                            continue;
                        }
                        double mag = 0;
                        for (size_t k = 0; k < K; k++)
                            mag += fabs((double)A[m * lda + k] * deq[n * K + k]);
                        double tol = 1e-5 * (1 + fabs(alpha) * mag);
                        if (!(fabs((double)got[i] - want[i]) <= tol))
                            expect(0, "%s K=%zu M=%zu C[%zu,%zu]: got %.9g want %.9g (tol %.3g)", TYPE_NAMES[type],
                                   K, M, m, n, (double)got[i], (double)want[i], tol), bad = 1;
                    }
                if (!bad)
                    expect(1, "");
                /* the same C, row by row and column by column */
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++)
                        T->qk_gemm(1, 1, K, alpha, A + m * lda, lda, B + n * rb, type, s, piece + m * ldc + n, ldc);
                split_cases++;
                for (size_t m = 0; m < M; m++)
                    for (size_t n = 0; n < N; n++)
                        if (!same_float(piece[m * ldc + n], got[m * ldc + n])) {
                            if (split_fails++ < 5)
                                printf("  qk_gemm.split mismatch: %s K=%zu M=%zu C[%zu,%zu]: 1x1 call %.9g, "
                                       "full call %.9g\n", TYPE_NAMES[type], K, M, m, n,
                                       (double)piece[m * ldc + n], (double)got[m * ldc + n]);
                            m = M;
                            break;
                        }
                free(s), free(A), free(got), free(want), free(piece), free(B), free(deq);
            }
    end();
    begin("qk_gemm.split");
    check_cases = split_cases, check_fails = split_fails;
    end();
}

/* ---- sv_gemm ----------------------------------------------------------------- */

static void check_sv(void)
{
    static const size_t KS[] = {0, 1, 7, 29, 300}; /* 300 crosses every type's key chunk */
    static const float BETAS[] = {0.0f, 1.0f, 0.5f};
    long split_cases = 0, split_fails = 0;
    begin("sv_gemm");
    for (int type = 0; type < 6; type++)
        for (size_t w = 0; w < NW; w++)
            for (size_t mi = 0; mi < NM; mi++)
                for (size_t ki = 0; ki < sizeof(KS) / sizeof(KS[0]); ki++) {
                    const size_t N = WIDTHS[w], M = MS[mi], K = KS[ki], lda = K + 2, ldc = N + 3;
                    const size_t rb = gqa_row_bytes(type, N);
                    const float beta = BETAS[(mi + ki) % 3];
                    float *s = xmalloc(N * sizeof(float)), *A = xmalloc(M * lda * 4), *C0 = xmalloc(M * ldc * 4);
                    float *got = xmalloc(M * ldc * 4), *want = xmalloc(M * ldc * 4), *piece = xmalloc(M * ldc * 4);
                    uint8_t *B = xmalloc(K * rb);
                    make_scales(s, type, N, (int)ki % 2);
                    for (size_t i = 0; i < M * lda; i++)
                        A[i] = unif();
                    make_codes(B, K, N, type);
                    for (size_t i = 0; i < M * ldc; i++)
                        C0[i] = (i % ldc) >= N ? GUARD_F : beta == 0.0f ? NAN : normal();
                    memcpy(got, C0, M * ldc * 4);
                    memcpy(want, C0, M * ldc * 4);
                    memcpy(piece, C0, M * ldc * 4);
                    T->sv_gemm(M, N, K, A, lda, B, type, s, got, ldc, beta);
                    R->sv_gemm(M, N, K, A, lda, B, type, s, want, ldc, beta);
                    float *deq = dequant_ref(B, K, N, type, s);
                    int bad = 0;
                    for (size_t m = 0; m < M && !bad; m++)
                        for (size_t n = 0; n < ldc && !bad; n++) {
                            size_t i = m * ldc + n;
                            if (n >= N) {
                                if (!same_float(got[i], GUARD_F))
                                    expect(0, "%s N=%zu M=%zu K=%zu: C padding [%zu,%zu] overwritten",
                                           TYPE_NAMES[type], N, M, K, m, n), bad = 1;
                                continue;
                            }
                            double mag = beta == 0.0f ? 0 : fabs((double)beta * C0[i]);
                            for (size_t k = 0; k < K; k++)
                                mag += fabs((double)A[m * lda + k] * deq[k * N + n]);
                            double tol = 1e-5 * (1 + mag);
                            if (!(fabs((double)got[i] - want[i]) <= tol))
                                expect(0, "%s N=%zu M=%zu K=%zu beta=%g C[%zu,%zu]: got %.9g want %.9g (tol %.3g)",
                                       TYPE_NAMES[type], N, M, K, (double)beta, m, n, (double)got[i],
                                       (double)want[i], tol), bad = 1;
                        }
                    if (!bad)
                        expect(1, "");
                    for (size_t m = 0; m < M; m++) /* row by row */
                        T->sv_gemm(1, N, K, A + m * lda, lda, B, type, s, piece + m * ldc, ldc, beta);
                    split_cases++;
                    for (size_t i = 0; i < M * ldc; i++)
                        if (!same_float(piece[i], got[i])) {
                            if (split_fails++ < 5)
                                printf("  sv_gemm.split mismatch: %s N=%zu M=%zu K=%zu C[%zu,%zu]: row call %.9g, "
                                       "full call %.9g\n", TYPE_NAMES[type], N, M, K, i / ldc, i % ldc,
                                       (double)piece[i], (double)got[i]);
                            break;
                        }
                    free(s), free(A), free(C0), free(got), free(want), free(piece), free(B), free(deq);
                }
    end();
    begin("sv_gemm.split");
    check_cases = split_cases, check_fails = split_fails;
    end();
}

/* ---- exp_sum ------------------------------------------------------------------- */

/* Distance in ulps between two positive finite floats (their bit patterns are ordered). */
static long ulp_dist(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x > y ? (long)(x - y) : (long)(y - x);
}

/* exp_sum(x, n, m) against the scalar path (libm expf), element by element:
 *   scalar NaN     -> NaN;
 *   scalar 0       (x - m below GQA_EXP_MIN, or -inf) -> exactly +0;
 *   otherwise      a positive float within EXP_ULPS ulps of expf (the path's
 *                  polynomial is ~1 ulp, the range reduction adds < 1 ulp);
 *   x[n ..]        untouched;
 *   the sum        NaN when an element is NaN, else within (2 EXP_ULPS + 2n) 2^-24
 *                  of the scalar sum (element errors plus both summation orders).
 * Arguments x - m: mostly [-100, 0] (softmax), the knee GQA_EXP_MIN and its float
 * neighbours, -inf, NaN, +-0, tiny, arguments near (j + 1/2) ln2 (rounding of n),
 * a few positive up to 60; lengths 0 .. 33, around 64 and 128, and long rows. */
#define EXP_ULPS 4
static void check_exp(void)
{
    static const size_t NS[] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,  12,  13,  14,  15,   16,  17,
                                18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,  30,  31,  32,   33,  63,  64,
                                65, 127, 128, 129, 1000, 4099};
    static const float MSH[] = {0.0f, 1.5f, -2.25f, 30.0f};
    long sum_cases = 0, sum_fails = 0, worst = 0;
    begin("exp_sum");
    if (T->exp_sum == NULL) {
        expect(0, "the %s table has no exp_sum", T->name);
        end();
        return;
    }
    for (size_t ni = 0; ni < sizeof(NS) / sizeof(NS[0]); ni++)
        for (size_t mi = 0; mi < sizeof(MSH) / sizeof(MSH[0]); mi++)
            for (int rep = 0; rep < 3; rep++) {
                const size_t n = NS[ni];
                const float m = MSH[mi];
                float *got = xmalloc((n + 4) * 4), *want = xmalloc((n + 4) * 4);
                int has_nan = 0;
                for (size_t i = 0; i < n; i++) {
                    float d;
                    switch (rnd() % 16) {
                    case 0: d = -INFINITY; break;
                    case 1: d = NAN; break;
                    case 2: { /* the knee and its neighbours (exact when m == 0) */
                        const float knee[3] = {GQA_EXP_MIN, nextafterf(GQA_EXP_MIN, -INFINITY),
                                               nextafterf(GQA_EXP_MIN, INFINITY)};
                        d = knee[rnd() % 3];
                        break;
                    }
                    case 3: d = GQA_EXP_MIN + (unif() - 0.5f) * 0.05f; break;
                    case 4: d = unif() * 60.0f; break;
                    case 5: {
                        static const float tiny[4] = {0.0f, -0.0f, 1e-30f, -1e-30f};
                        d = tiny[rnd() % 4];
                        break;
                    }
                    case 6: d = -((float)(rnd() % 126) + 0.5f) * 0.693147181f; break;
                    default: d = -unif() * 100.0f;
                    }
                    got[i] = want[i] = isinf(d) || isnan(d) ? d : m + d;
                }
                for (size_t i = n; i < n + 4; i++)
                    got[i] = want[i] = GUARD_F;
                const float sg = T->exp_sum(got, n, m), sw = R->exp_sum(want, n, m);
                int bad = 0;
                double ref = 0;
                for (size_t i = 0; i < n + 4 && !bad; i++) {
                    const float g = got[i], w = want[i];
                    int ok;
                    if (i >= n) {
                        ok = same_float(g, GUARD_F);
                    } else if (isnan(w)) {
                        ok = isnan(g);
                        has_nan = 1;
                    } else if (w == 0.0f) {
                        uint32_t b;
                        memcpy(&b, &g, 4);
                        ok = b == 0; /* exactly +0 */
                    } else {
                        long u = g > 0.0f && isfinite(g) ? ulp_dist(g, w) : 1L << 30;
                        worst = u > worst ? u : worst;
                        ok = u <= EXP_ULPS;
                        ref += w;
                    }
                    if (!ok) {
                        expect(0, "n=%zu m=%g x[%zu]: got %.9g want %.9g%s", n, (double)m, i, (double)g, (double)w,
                               i >= n ? " (past n)" : "");
                        bad = 1;
                    }
                }
                if (!bad)
                    expect(1, "");
                sum_cases++;
                const double tol = (2.0 * EXP_ULPS + 2.0 * (double)n) * ref / 16777216.0;
                const int sum_ok = has_nan ? isnan(sg) && isnan(sw) : fabs((double)sg - (double)sw) <= tol;
                if (!sum_ok && sum_fails++ < 5)
                    printf("  exp_sum.sum mismatch: n=%zu m=%g: got %.9g want %.9g (tol %.3g)\n", n, (double)m,
                           (double)sg, (double)sw, tol);
                free(got), free(want);
            }
    printf("  exp_sum: worst %ld ulp against libm expf (bound %d)\n", worst, EXP_ULPS);
    end();
    begin("exp_sum.sum");
    check_cases = sum_cases, check_fails = sum_fails;
    end();
}

/* ---- block_lines --------------------------------------------------------------- */

/* gqa_block_lines: blocks of columns of any widths (multiples of 8, the last partial), laid end
   to end over a row, name each 64-byte line of the row once, each inside its block's bytes. */
static void check_block_lines(void)
{
    static const size_t NS[] = {1, 7, 8, 24, 32, 63, 64, 65, 96, 128, 200, 256, 512, 1000};
    begin("block_lines");
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t ni = 0; ni < sizeof(NS) / sizeof(NS[0]); ni++)
            for (int rep = 0; rep < 20; rep++) {
                const size_t n = NS[ni], rb = (n * bits + 7) / 8, lines = (rb + 63) / 64;
                int seen[32] = {0}, ok = 1;
                for (size_t n0 = 0; n0 < n;) {
                    const size_t w0 = 8 * (1 + rnd() % 16), w = n - n0 < w0 ? n - n0 : w0;
                    size_t first;
                    const int cnt = gqa_block_lines((size_t)bits, n0, w, &first);
                    for (int j = 0; j < cnt; j++) {
                        const size_t off = first + 64 * (size_t)j;
                        ok &= off % 64 == 0 && off < rb && off >= (n0 * bits + 7) / 8 &&
                              off < ((n0 + w) * bits + 7) / 8;
                        if (off / 64 < 32)
                            seen[off / 64]++;
                    }
                    n0 += w;
                }
                for (size_t l = 0; l < lines; l++)
                    ok &= seen[l] == 1;
                expect(ok, "bits %d n %zu rep %d", bits, n, rep);
            }
    end();
}

/* ---- row_max ------------------------------------------------------------------- */

/* row_max(x, n) == the largest non-NaN x[i] (-inf when there is none), by value
   (+0 and -0 compare equal); x is not written.  The maximum is placed at every
   position class (first, last, in the vector tail, in each of the unrolled lanes). */
static void check_row_max(void)
{
    static const size_t NS[] = {0,  1,  2,  3,  4,  5,  7,  8,  9,  15, 16, 17, 31,  32,  33,
                                47, 63, 64, 65, 79, 127, 128, 129, 255, 256, 257, 1000, 4099};
    begin("row_max");
    if (T->row_max == NULL) {
        expect(0, "the %s table has no row_max", T->name);
        end();
        return;
    }
    for (size_t ni = 0; ni < sizeof(NS) / sizeof(NS[0]); ni++)
        for (int rep = 0; rep < 12; rep++) {
            const size_t n = NS[ni];
            float *x = xmalloc((n + 1) * 4), *copy = xmalloc((n + 1) * 4);
            for (size_t i = 0; i < n; i++) {
                switch (rep < 4 ? rep : (int)(rnd() % 8)) {
                case 0: x[i] = NAN; break;                        /* rep 0: all NaN */
                case 1: x[i] = -INFINITY; break;                  /* rep 1: all -inf */
                case 2: x[i] = i % 2 ? NAN : -INFINITY; break;
                case 3: x[i] = (rnd() % 2) ? 0.0f : -0.0f; break;
                case 4: x[i] = NAN; break;
                case 5: x[i] = -INFINITY; break;
                default: x[i] = (unif() - 0.5f) * 200.0f;
                }
            }
            if (rep >= 4 && n > 0) /* a unique maximum at a chosen position */
                x[rep == 4 ? 0 : rep == 5 ? n - 1 : rnd() % n] = rep == 6 ? INFINITY : 150.0f;
            memcpy(copy, x, n * 4);
            float want = -INFINITY;
            for (size_t i = 0; i < n; i++)
                want = x[i] > want ? x[i] : want;
            const float got = T->row_max(x, n), ref = R->row_max(x, n);
            const int ok = got == want && ref == want && memcmp(copy, x, n * 4) == 0;
            expect(ok, "n=%zu rep=%d: got %.9g, scalar %.9g, want %.9g", n, rep, (double)got, (double)ref,
                   (double)want);
            free(x), free(copy);
        }
    end();
}

/* ---- hadamard_rows ------------------------------------------------------------- */

/* hadamard_rows (kernels_common.h, gqa_hadamard_rows: the `+had` rotation R = c Sy P):
   bit for bit the scalar table's, and within its stated bound of float64's x R (inverse:
   x R^T), R built here from its definition (R[d, rev(i)] = c (-1)^popcount(d & i)); x not
   written, o's padding kept; heads 1 .. 1024, 1 / 3 / 16 rows, strides past the row. */
static size_t bit_reverse(size_t i, size_t bits)
{
    size_t r = 0;
    for (size_t b = 0; b < bits; b++)
        r |= ((i >> b) & 1) << (bits - 1 - b);
    return r;
}

static void check_hadamard(void)
{
    static const size_t NS[] = {1, 3, 16};
    begin("hadamard_rows");
    if (T->hadamard_rows == NULL) {
        expect(0, "the %s table has no hadamard_rows", T->name);
        end();
        return;
    }
    for (size_t bits = 0; bits <= 10; bits++)
        for (size_t ni = 0; ni < 3; ni++)
            for (int inverse = 0; inverse < 2; inverse++) {
                const size_t H = (size_t)1 << bits, n = NS[ni], ldx = H + 3, ldo = H + 5;
                const size_t B = H < 16 ? H : 16;
                const float c = bits % 2 ? (float)(1.0 / sqrt((double)H)) : 0.75f;
                float *x = xmalloc(n * ldx * 4), *xc = xmalloc(n * ldx * 4);
                float *o = xmalloc(n * ldo * 4), *ref = xmalloc(n * ldo * 4);
                for (size_t i = 0; i < n * ldx; i++)
                    x[i] = (i % 7 == 3) ? (float)(rnd() % 9) - 4.0f : normal() * 3.0f;
                memcpy(xc, x, n * ldx * 4);
                for (size_t i = 0; i < n * ldo; i++)
                    o[i] = ref[i] = -7.0f;
                T->hadamard_rows(n, H, x, ldx, o, ldo, c, inverse);
                R->hadamard_rows(n, H, x, ldx, ref, ldo, c, inverse);
                int ok = memcmp(o, ref, n * ldo * 4) == 0 && memcmp(x, xc, n * ldx * 4) == 0;
                double worst = 0.0;
                for (size_t r = 0; r < n && ok; r++) {
                    const float *xr = x + r * ldx;
                    double sum_abs = 0.0;
                    for (size_t d = 0; d < H; d++)
                        sum_abs += fabs((double)xr[d]);
                    for (size_t e = 0; e < H; e++) {
                        double want = 0.0;  /* sum_d x[d] R[d, e] (inverse: R[e, d]) */
                        for (size_t d = 0; d < H; d++) {
                            const size_t row = inverse ? e : d, col = inverse ? d : e;
                            const size_t i = bit_reverse(col, bits); /* R[row, rev(i)] */
                            want += (double)xr[d] * (__builtin_popcountll(row & i) & 1 ? -1.0 : 1.0);
                        }
                        want *= (double)c;
                        const double bound = ((double)B + (double)bits + 2.0) * 0x1p-24 * (double)c * sum_abs;
                        const double err = fabs((double)o[r * ldo + e] - want);
                        worst = err / (bound + 1e-300) > worst ? err / (bound + 1e-300) : worst;
                        ok = ok && err <= bound;
                    }
                    for (size_t e = H; e < ldo; e++)
                        ok = ok && o[r * ldo + e] == -7.0f;
                }
                expect(ok, "H=%zu n=%zu inverse=%d: %s (worst err / bound %.3g)", H, n, inverse,
                       memcmp(o, ref, n * ldo * 4) ? "not the scalar table's bits" : "off", worst);
                free(x), free(xc), free(o), free(ref);
            }
    end();
}

/* ---- rope_row -------------------------------------------------------------------- */

/* rope_row (gqa_kernels.h): pairs [0, r2) of a row, plain and interleaved, out of place and in
   place, bit for bit the contract's statement here (fmaf of libm: fused, correctly rounded) and
   the scalar table's (NaN-aware: a NaN's payload may differ), within 2^-24 (|x0 c| + 2 |x1 s|)
   of float64's x0 c - x1 s (x1' likewise), o[2 r2 ..] and, out of place, x untouched; r2 0 .. 40,
   63 .. 65, 128, 256, elements with NaN, +-inf and +-0 among them. */
static void check_rope(void)
{
    static const size_t EXTRA[] = {63, 64, 65, 128, 256};
    begin("rope_row");
    if (T->rope_row == NULL) {
        expect(0, "the %s table has no rope_row", T->name);
        end();
        return;
    }
    for (size_t t = 0; t <= 40 + sizeof EXTRA / sizeof EXTRA[0]; t++)
        for (int il = 0; il < 2; il++)
            for (int inplace = 0; inplace < 2; inplace++) {
                const size_t r2 = t <= 40 ? t : EXTRA[t - 41], n = 2 * r2 + 9;
                float *x = xmalloc(n * 4 + 4), *xc = xmalloc(n * 4 + 4), *o = xmalloc(n * 4 + 4);
                float *ref = xmalloc(n * 4 + 4), *sc = xmalloc(n * 4 + 4), *c = xmalloc(r2 * 4 + 4);
                float *s = xmalloc(r2 * 4 + 4);
                for (size_t i = 0; i < n; i++)
                    x[i] = (i % 11 == 5) ? (float)(rnd() % 9) - 4.0f : normal() * 3.0f;
                if (r2 > 6 && t % 3 == 0) { /* specials */
                    x[1] = NAN, x[2] = INFINITY, x[3] = -INFINITY, x[4] = -0.0f, x[5] = 0.0f;
                }
                for (size_t i = 0; i < r2; i++) {
                    const double a = 0.37 * (double)(i + 1) + 0.1 * (double)t;
                    c[i] = (float)cos(a), s[i] = (float)sin(a);
                }
                memcpy(xc, x, n * 4);
                for (size_t i = 0; i < n; i++)
                    o[i] = sc[i] = -7.0f;
                const size_t step = il ? 1 : r2;
                for (size_t i = 0; i < n; i++) /* the statement: past 2 r2, what o held */
                    ref[i] = i < 2 * r2 ? NAN : (inplace ? x[i] : -7.0f);
                for (size_t i = 0; i < r2; i++) {
                    const size_t e = il ? 2 * i : i;
                    ref[e] = fmaf(x[e], c[i], -(x[e + step] * s[i]));
                    ref[e + step] = fmaf(x[e], s[i], x[e + step] * c[i]);
                }
                float *out = inplace ? x : o;
                T->rope_row(r2, il, x, c, s, out);
                if (inplace)
                    memcpy(sc, xc, n * 4);
                R->rope_row(r2, il, inplace ? sc : xc, c, s, sc);
                int ok = 1, bits = 1;
                double worst = 0.0;
                for (size_t i = 0; i < n; i++) {
                    bits = bits && same_float(out[i], ref[i]) && same_float(out[i], sc[i]);
                    if (i < 2 * r2) {
                        const size_t pi = il ? i / 2 : i % (r2 ? r2 : 1), e = il ? 2 * pi : pi;
                        const int second = il ? (int)(i & 1) : i >= r2;
                        const double x0 = xc[e], x1 = xc[e + step], cc = c[pi], ss = s[pi];
                        const double want = second ? x0 * ss + x1 * cc : x0 * cc - x1 * ss;
                        const double bound = (second ? fabs(x0 * ss) + 2.0 * fabs(x1 * cc)
                                                     : fabs(x0 * cc) + 2.0 * fabs(x1 * ss)) * 0x1p-24 * (1.0 + 0x1p-23);
                        if (want == want && fabs(want) < INFINITY && bound < INFINITY) {
                            const double err = fabs((double)out[i] - want);
                            worst = err / (bound + 1e-300) > worst ? err / (bound + 1e-300) : worst;
                            ok = ok && err <= bound;
                        }
                    }
                }
                if (!inplace)
                    ok = ok && memcmp(x, xc, n * 4) == 0;
                expect(ok && bits, "r2=%zu interleaved=%d in place=%d: %s (worst err / bound %.3g)", r2, il,
                       inplace, bits ? "off" : "not the statement's bits", worst);
                free(x), free(xc), free(o), free(ref), free(sc), free(c), free(s);
            }
    end();
}

/* ---- approximate INT8 QK ------------------------------------------------------ */

/* The contract of qk_gemm_s8_approx (stated in kernels_avx512.c),
   stated plainly; D (may be NULL) receives the integer dots. */
static void approx_oracle(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                          const int8_t *B, float s, float *C, size_t ldc, int64_t *D)
{
    int *code = xmalloc((K + 1) * sizeof(int));
    for (size_t m = 0; m < M; m++) {
        const float *a = A + m * lda;
        float amax = 0.0f;
        int bad = 0;
        for (size_t k = 0; k < K; k++) {
            if (isnan(a[k]) || isinf(a[k]))
                bad = 1;
            if (fabsf(a[k]) > amax)
                amax = fabsf(a[k]);
        }
        float r = amax == 0.0f ? 0.0f : 127.0f / amax;
        int zero = !(r <= FLT_MAX);
        float inv = zero ? 0.0f : r, sa = zero ? 1.0f : amax / 127.0f;
        for (size_t k = 0; k < K; k++) {
            float t = a[k] * inv;  /* rounded */
            float u = t + 128.0f;  /* rounded (never fused: -ffp-contract=off) */
            float q = rintf(u);    /* half to even */
            q = q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
            code[k] = (int)q;
        }
        float mult = (alpha * sa) * s;
        for (size_t n = 0; n < N; n++) {
            int64_t d = 0, sq = 0;
            for (size_t k = 0; k < K; k++) {
                d += (int64_t)code[k] * B[n * K + k];
                sq += B[n * K + k];
            }
            d -= 128 * sq;
            if (D)
                D[m * N + n] = d;
            C[m * ldc + n] = bad ? NAN : (float)d * mult;
        }
    }
    free(code);
}

static void check_approx(void)
{
    static const size_t KA[] = {1, 2, 3, 5, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 256, 2047, 2048, 2049,
                                4200};
    const size_t NK = sizeof(KA) / sizeof(KA[0]);
    const double u = 1.0 / 16777216.0;
    long cases[4] = {0}, fails[4] = {0}, shown[4] = {0}; /* contract, bound, integer, edges */
    for (size_t ki = 0; ki < NK; ki++)
        for (size_t mi = 0; mi < NM; mi++) {
            const size_t K = KA[ki], M = MS[mi], N = 19, lda = K + 1, ldc = N + 2;
            const float s = 0.031f, alpha = 0.17f;
            float *A = xmalloc(M * lda * 4), *got = xmalloc(M * ldc * 4), *want = xmalloc(M * ldc * 4);
            float *exact = xmalloc(M * ldc * 4);
            int8_t *B = xmalloc(N * K);
            float big = 0.1f + 10 * unif();
            for (size_t i = 0; i < M * lda; i++)
                A[i] = normal() * big;
            A[rnd() % K] *= 4; /* one large element */
            if (M > 2)
                for (size_t k = 0; k < K; k++)
                    A[2 * lda + k] = 0.0f; /* amax == 0 */
            for (size_t i = 0; i < N * K; i++)
                B[i] = (int8_t)rnd();
            for (size_t i = 0; i < M * ldc; i++)
                got[i] = (i % ldc) < N ? NAN : GUARD_F;
            T->qk_gemm_s8_approx(M, N, K, alpha, A, lda, B, GQA_S8_PT, &s, got, ldc);
            approx_oracle(M, N, K, alpha, A, lda, B, s, want, ldc, NULL);
            R->qk_gemm(M, N, K, alpha, A, lda, B, GQA_S8_PT, &s, exact, ldc);
            int bad_c = 0, bad_b = 0;
            for (size_t m = 0; m < M; m++) {
                /* bound (derived in tests/isa/test_avx512vnni_api.py): with sa the row scale,
                   |approx - exact| <= |alpha| s (sa (1/2 + 2^-16) sum|q| + 2^-22 sum|a q|)
                                       + 8u |approx| + (K + 2) u |alpha| s sum|a q| */
                const float *a = A + m * lda;
                float amax = 0;
                for (size_t k = 0; k < K; k++)
                    amax = fabsf(a[k]) > amax ? fabsf(a[k]) : amax;
                float r = amax == 0.0f ? 0.0f : 127.0f / amax;
                double sa = !(r <= FLT_MAX) ? 1.0 : (double)(amax / 127.0f);
                for (size_t n = 0; n < ldc; n++) {
                    size_t i = m * ldc + n;
                    if (n >= N) {
                        if (!same_float(got[i], GUARD_F) && (bad_c = 1) && shown[0]++ < 5)
                            printf("  approx.contract mismatch: K=%zu M=%zu padding [%zu,%zu] overwritten\n", K, M,
                                   m, n);
                        continue;
                    }
                    if (!same_float(got[i], want[i]) && (bad_c = 1) && shown[0]++ < 5)
                        printf("  approx.contract mismatch: K=%zu M=%zu C[%zu,%zu]: got %.9g want %.9g\n", K, M, m,
                               n, (double)got[i], (double)want[i]);
                    double sq = 0, aq = 0;
                    for (size_t k = 0; k < K; k++) {
                        sq += abs(B[n * K + k]);
                        aq += fabs((double)a[k]) * abs(B[n * K + k]);
                    }
                    double ks = fabs((double)alpha) * s;
                    double bound = ks * (sa * (0.5 + 1.0 / 65536) * sq + aq / 4194304.0) + 8 * u * fabs(got[i]) +
                                   (K + 2) * u * ks * aq;
                    if (!(fabs((double)got[i] - exact[i]) <= bound) && (bad_b = 1) && shown[1]++ < 5)
                        printf("  approx.bound mismatch: K=%zu M=%zu C[%zu,%zu]: approx %.9g exact %.9g bound %.3g\n",
                               K, M, m, n, (double)got[i], (double)exact[i], bound);
                }
            }
            cases[0]++, fails[0] += bad_c;
            cases[1]++, fails[1] += bad_b;
            free(A), free(got), free(want), free(exact), free(B);
        }
    /* integer dot read back: amax = 127 * 2^-4 makes sa = 2^-4 and inv = 2^4
       exact; with alpha = 1 and s = 2^-3, C = D * 2^-7 exactly. */
    for (size_t ki = 0; ki < NK; ki++) {
        const size_t K = KA[ki], M = 5, N = 13;
        const float s = 0.125f, top = 127.0f / 16.0f;
        float *A = xmalloc(M * K * 4), *C = xmalloc(M * N * 4), *W = xmalloc(M * N * 4);
        int8_t *B = xmalloc(N * K);
        int64_t *D = xmalloc(M * N * sizeof(int64_t));
        for (size_t i = 0; i < M * K; i++)
            A[i] = (2 * unif() - 1) * top;
        for (size_t m = 0; m < M; m++)
            A[m * K + rnd() % K] = top;
        for (size_t i = 0; i < N * K; i++)
            B[i] = (int8_t)rnd();
        for (size_t k = 0; k < K; k++)
            B[k] = -128, B[K + k] = 127; /* extreme codes */
        T->qk_gemm_s8_approx(M, N, K, 1.0f, A, K, B, GQA_S8_PT, &s, C, N);
        approx_oracle(M, N, K, 1.0f, A, K, B, s, W, N, D);
        int bad = 0;
        for (size_t i = 0; i < M * N; i++) { /* D is exact in C below 2^24 */
            double d = (double)C[i] * 128.0;
            if (fabs((double)D[i]) < 16777216.0 && d != (double)D[i] && (bad = 1) && shown[2]++ < 5)
                printf("  approx.integer mismatch: K=%zu dot %zu: got %.1f want %lld\n", K, i, d, (long long)D[i]);
        }
        cases[2]++, fails[2] += bad;
        free(A), free(C), free(W), free(B), free(D);
    }
    { /* edge rows: NaN, inf -> NaN; tiny amax (127 / amax overflows) -> 0 */
        const size_t K = 40, N = 6;
        float A[4 * 40], C[4 * 6];
        int8_t B[6 * 40];
        const float s = 0.05f;
        for (size_t i = 0; i < 4 * K; i++)
            A[i] = normal();
        for (size_t i = 0; i < N * K; i++)
            B[i] = (int8_t)rnd();
        A[1 * K + 3] = NAN;
        A[2 * K + 5] = INFINITY;
        for (size_t k = 0; k < K; k++)
            A[3 * K + k] = 1e-38f;
        T->qk_gemm_s8_approx(4, N, K, 1.0f, A, K, B, GQA_S8_PT, &s, C, N);
        int bad = 0;
        for (size_t n = 0; n < N; n++)
            bad += !isfinite(C[n]) || !isnan(C[N + n]) || !isnan(C[2 * N + n]) || C[3 * N + n] != 0.0f;
        if (bad)
            printf("  approx.edges mismatch: finite / NaN / inf / tiny rows give %g %g %g %g\n", (double)C[0],
                   (double)C[N], (double)C[2 * N], (double)C[3 * N]);
        cases[3]++, fails[3] += bad != 0;
    }
    static const char *const names[4] = {"approx.contract", "approx.bound", "approx.integer", "approx.edges"};
    for (int i = 0; i < 4; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
}

/* INT4 codes [rows, cols] in [-8, 7] packed as the cache stores them (gqa_kernels.h): nibble
   q + 8, element 2i in the low nibble of byte i, pad nibble 8. */
static uint8_t *pack_s4(const int8_t *q, size_t rows, size_t cols)
{
    const size_t rb = (cols + 1) / 2;
    uint8_t *p = xmalloc(rows * rb + 1);
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < rb; i++) {
            const int lo = q[r * cols + 2 * i] + 8, hi = 2 * i + 1 < cols ? q[r * cols + 2 * i + 1] + 8 : 8;
            p[r * rb + i] = (uint8_t)(lo | hi << 4);
        }
    return p;
}

/* The contract of sv_gemm_s8_dot (stated in kernels_s8dot_contract.h), for rows whose elements
   are finite and >= 0 with a maximum > 0: C = beta * C + the chunked integer dots. */
static void sv_dot_oracle(size_t M, size_t N, size_t K, const float *A, size_t lda, const int8_t *B,
                             const float *s, int pc, float *C, size_t ldc, float beta)
{
    const size_t KS = 512;
    for (size_t m = 0; m < M; m++) {
        const float *a = A + m * lda;
        float pmax = 0.0f;
        for (size_t k = 0; k < K; k++)
            pmax = a[k] > pmax ? a[k] : pmax;
        const float inv = 32767.0f / pmax, sp = pmax / 32767.0f;
        for (size_t n = 0; n < N; n++) {
            const float mult = sp * s[pc ? n : 0];
            float r = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
            for (size_t k0 = 0; k0 < K; k0 += KS) {
                int64_t d = 0;
                for (size_t k = k0; k < K && k < k0 + KS; k++) {
                    float t = a[k] * inv;
                    float q = rintf(t);
                    q = q > 32767.0f ? 32767.0f : q;
                    d += (int64_t)q * B[k * N + n];
                }
                r = r + (float)d * mult;
            }
            C[m * ldc + n] = r;
        }
    }
}

/* with_s4: also INT4 codes (the units whose contract covers them: VNNI, AVX2) */
static void check_sv_dot(gqa_sv_gemm_fn dot, int with_s4)
{
    static const size_t KA[] = {1, 2, 3, 4, 5, 7, 29, 64, 300, 511, 512, 513, 1025, 8193, 20000};
    static const size_t NA[] = {1, 13, 64, 65, 130};
    /* 8 and 9: the VNNI unit's 8-row pass; 16 and 23: the AVX2 unit's packed kernels */
    static const size_t SV_MS[] = {1, 2, 3, 4, 5, 6, 8, 9, 16, 23};
    static const float BETAS[] = {0.0f, 1.0f, 0.5f};
    const size_t NK = sizeof(KA) / sizeof(KA[0]), NN = sizeof(NA) / sizeof(NA[0]);
    const double u = 1.0 / 16777216.0;
    long cases[3] = {0}, fails[3] = {0}, shown[3] = {0}; /* contract, bound, edges */
    for (int s4 = 0; s4 <= with_s4; s4++)
    for (size_t ki = 0; ki < NK; ki++)
        for (size_t ni = 0; ni < NN; ni++)
            for (int pc = 0; pc < 2; pc++) {
                const size_t K = KA[ki], N = NA[ni], M = SV_MS[(ki + ni) % 10], lda = K + 3, ldc = N + 2;
                const float beta = BETAS[(ki + ni + pc) % 3];
                float *A = xmalloc(M * lda * 4), *got = xmalloc(M * ldc * 4), *want = xmalloc(M * ldc * 4);
                float *exact = xmalloc(M * ldc * 4), *s = xmalloc(N * 4);
                int8_t *B = xmalloc(K * N);
                for (size_t i = 0; i < M * lda; i++)
                    A[i] = unif() * unif();
                for (size_t m = 0; m < M; m++)
                    A[m * lda + rnd() % K] = 1.0f;
                if (K > 2)
                    A[1 % M * lda + 1] = 0.0f;
                for (size_t i = 0; i < K * N; i++)
                    B[i] = s4 ? (int8_t)((int)(rnd() % 16) - 8) : (int8_t)rnd();
                B[0] = s4 ? -8 : -128, B[K * N - 1] = s4 ? 7 : 127;
                for (size_t n = 0; n < N; n++)
                    s[n] = 0.01f + 0.02f * unif();
                for (size_t i = 0; i < M * ldc; i++)
                    got[i] = want[i] = exact[i] = (i % ldc) < N ? normal() : GUARD_F;
                const int type = s4 ? (pc ? GQA_S4_PC : GQA_S4_PT) : (pc ? GQA_S8_PC : GQA_S8_PT);
                const void *Bk = s4 ? (const void *)pack_s4(B, K, N) : (const void *)B;
                dot(M, N, K, A, lda, Bk, type, s, got, ldc, beta);
                sv_dot_oracle(M, N, K, A, lda, B, s, pc, want, ldc, beta);
                R->sv_gemm(M, N, K, A, lda, Bk, type, s, exact, ldc, beta);
                if (s4)
                    free((void *)Bk);
                int bad_c = 0, bad_b = 0;
                for (size_t m = 0; m < M; m++) {
                    const float *a = A + m * lda;
                    float pmax = 0.0f;
                    for (size_t k = 0; k < K; k++)
                        pmax = a[k] > pmax ? a[k] : pmax;
                    const double sp = pmax / 32767.0f;
                    for (size_t n = 0; n < ldc; n++) {
                        const size_t i = m * ldc + n;
                        if (n >= N) {
                            if (!same_float(got[i], GUARD_F) && (bad_c = 1) && shown[0]++ < 5)
                                printf("  dot.sv.contract mismatch: K=%zu N=%zu padding [%zu,%zu] overwritten\n",
                                       K, N, m, n);
                            continue;
                        }
                        if (!same_float(got[i], want[i]) && (bad_c = 1) && shown[0]++ < 5)
                            printf("  dot.sv.contract mismatch: K=%zu N=%zu int4=%d pc=%d beta=%g C[%zu,%zu]: got %.9g "
                                   "want %.9g\n", K, N, s4, pc, (double)beta, m, n, (double)got[i], (double)want[i]);
                        /* bound (kernels_avx512vnni.c): with dq = |q| s,
                           |approx - exact| <= sp (1/2 + 2^-9) sum dq + 2^-22 sum a dq
                                               + (chunks + 3) u (|got| + |beta C0| + sum a dq) + exact's (K + 2) u sum a dq */
                        double sq = 0, aq = 0;
                        const double sn = s[pc ? n : 0];
                        for (size_t k = 0; k < K; k++) {
                            sq += abs(B[k * N + n]) * sn;
                            aq += (double)a[k] * abs(B[k * N + n]) * sn;
                        }
                        const double chunks = (double)(K / 512 + 1);
                        const double bound = sp * (0.5 + 1.0 / 512) * sq + aq / 4194304.0 +
                                             (chunks + 3 + K + 2) * u * (fabs(got[i]) + fabs(exact[i]) + aq);
                        if (!(fabs((double)got[i] - exact[i]) <= bound) && (bad_b = 1) && shown[1]++ < 5)
                            printf("  dot.sv.bound mismatch: K=%zu N=%zu C[%zu,%zu]: approx %.9g exact %.9g "
                                   "bound %.3g\n", K, N, m, n, (double)got[i], (double)exact[i], bound);
                    }
                }
                cases[0]++, fails[0] += bad_c;
                cases[1]++, fails[1] += bad_b;
                free(A), free(got), free(want), free(exact), free(s), free(B);
            }
    { /* rows the contract leaves to the exact kernel: negative, NaN, inf, all zero */
        const size_t K = 37, N = 20, M = 5;
        float A[5 * 37], got[5 * 20], want[5 * 20];
        int8_t B[37 * 20];
        const float s = 0.03f;
        for (size_t i = 0; i < M * K; i++)
            A[i] = unif();
        for (size_t i = 0; i < K * N; i++)
            B[i] = (int8_t)rnd();
        A[0 * K + 3] = -0.25f;
        A[1 * K + 4] = NAN;
        A[2 * K + 5] = INFINITY;
        for (size_t k = 0; k < K; k++)
            A[3 * K + k] = 0.0f;
        for (size_t i = 0; i < M * N; i++)
            got[i] = want[i] = normal();
        dot(M, N, K, A, K, B, GQA_S8_PT, &s, got, N, 1.0f);
        T->sv_gemm(4, N, K, A, K, B, GQA_S8_PT, &s, want, N, 1.0f);
        sv_dot_oracle(1, N, K, A + 4 * K, K, B, &s, 0, want + 4 * N, N, 1.0f);
        int bad = 0;
        for (size_t i = 0; i < M * N; i++)
            bad += !same_float(got[i], want[i]);
        if (bad && shown[2]++ < 5)
            printf("  dot.sv.edges mismatch: %d values differ from the exact kernel / the contract\n", bad);
        cases[2]++, fails[2] += bad != 0;
    }
    static const char *const names[3] = {"dot.sv.contract", "dot.sv.bound", "dot.sv.edges"};
    for (int i = 0; i < 3; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
}

/* The contract of qk_gemm_s8_dot (stated in kernels_s8dot_contract.h) for rows whose (scaled)
   maximum is finite and > 0; returns the row's sa. */
static float qk_dot_oracle_row(size_t N, size_t K, float alpha, const float *a, const int8_t *B, int pc,
                               const float *s, float *c)
{
    float amax = 0.0f;
    for (size_t k = 0; k < K; k++) {
        const float x = pc ? a[k] * s[k] : a[k];
        amax = fabsf(x) > amax ? fabsf(x) : amax;
    }
    const float inv = 32639.0f / amax, sa = amax / 32639.0f;
    const float mult = pc ? alpha * sa : (alpha * sa) * s[0];
    for (size_t n = 0; n < N; n++) {
        int64_t d = 0;
        for (size_t k = 0; k < K; k++) {
            const float x = pc ? a[k] * s[k] : a[k];
            float q = rintf(x * inv);
            q = q > 32639.0f ? 32639.0f : q < -32639.0f ? -32639.0f : q;
            d += (int64_t)q * B[n * K + k];
        }
        c[n] = (float)d * mult;
    }
    return sa;
}

static void check_dot_qk(gqa_qk_gemm_fn dot, int with_s4)
{ /* bit for bit against the contract; the bound against the exact scalar kernel; rows of
     zeros / NaN / inf and heads wider than 512 as the path's exact kernel */
    static const size_t KA[] = {1, 5, 16, 31, 32, 33, 64, 80, 88, 100, 128, 200, 256, 257, 512, 513};
    const double u = 1.0 / 16777216.0;
    long cases[3] = {0}, fails[3] = {0};
    for (int s4 = 0; s4 <= with_s4; s4++)
    for (size_t ki = 0; ki < sizeof(KA) / sizeof(KA[0]); ki++)
        for (size_t mi = 0; mi < NM; mi++)
            for (int pc = 0; pc < 2; pc++) {
                /* N past 16 keys on every K too (pc): AMX reads 16-key blocks of K's rows, B's
                   exact size below (the ASan run of the emulated units) */
                const size_t K = KA[ki], M = MS[mi], N = 11 + ki + 16 * (size_t)pc, ldc = N + 1;
                const float alpha = 0.3f;
                float *A = xmalloc(M * K * 4), *s = xmalloc(K * 4);
                float *got = xmalloc(M * ldc * 4), *want = xmalloc(M * ldc * 4), *exact = xmalloc(M * ldc * 4);
                int8_t *B = xmalloc(N * K);
                for (size_t k = 0; k < K; k++)
                    s[k] = 0.01f + 0.05f * unif();
                for (size_t i = 0; i < M * K; i++)
                    A[i] = normal() * (i % 7 == 0 ? 30.0f : 1.0f); /* outlier channels */
                for (size_t i = 0; i < N * K; i++)
                    B[i] = s4 ? (int8_t)((int)(rnd() % 16) - 8) : (int8_t)rnd();
                B[0] = s4 ? -8 : -128;
                /* rows the contract leaves (zeros, a NaN, an inf): 1 and 2, or the last two of 16
                   rows, whose first 8 then go one pass (kl_8_*) */
                const size_t e1 = M >= 16 ? M - 2 : 1, e2 = M >= 16 ? M - 1 : 2;
                if (M > 2) {
                    for (size_t k = 0; k < K; k++)
                        A[e1 * K + k] = 0.0f;
                    A[e2 * K + K / 2] = (mi & 1) ? NAN : INFINITY;
                }
                for (size_t i = 0; i < M * ldc; i++)
                    got[i] = want[i] = exact[i] = GUARD_F;
                const int type = s4 ? (pc ? GQA_S4_PC : GQA_S4_PT) : (pc ? GQA_S8_PC : GQA_S8_PT);
                const void *Bk = s4 ? (const void *)pack_s4(B, N, K) : (const void *)B;
                dot(M, N, K, alpha, A, K, Bk, type, s, got, ldc);
                T->qk_gemm(M, N, K, alpha, A, K, Bk, type, s, want, ldc);
                R->qk_gemm(M, N, K, alpha, A, K, Bk, type, s, exact, ldc);
                if (s4)
                    free((void *)Bk);
                int bad_c = 0, bad_b = 0, bad_e = 0;
                for (size_t m = 0; m < M; m++) {
                    const int edge = M > 2 && (m == e1 || m == e2);
                    float sa = 0.0f;
                    if (!edge && K <= 512)
                        sa = qk_dot_oracle_row(N, K, alpha, A + m * K, B, pc, s, want + m * ldc);
                    for (size_t n = 0; n < ldc; n++) {
                        const size_t i = m * ldc + n;
                        if (!same_float(got[i], want[i])) {
                            if (edge || K > 512)
                                bad_e = 1;
                            else
                                bad_c = 1;
                        }
                        if (n >= N || edge || K > 512)
                            continue;
                        /* |got - exact| <= |alpha| (sa/2 sum|q| s' + 2^-22 sum|a' q|) + roundings,
                           s' = s (per tensor) or 1 (per channel: a' = a s) */
                        double sq = 0, aq = 0;
                        for (size_t k = 0; k < K; k++) {
                            const double x = pc ? (double)A[m * K + k] * s[k] : A[m * K + k];
                            sq += abs(B[n * K + k]) * (pc ? 1.0 : s[0]);
                            aq += fabs(x * B[n * K + k]) * (pc ? 1.0 : s[0]);
                        }
                        const double bound = fabs(alpha) * (sa * 0.5 * sq + aq / 4194304.0 + (K + 4) * u * aq)
                                             + 4 * u * fabs(got[i]);
                        if (!(fabs((double)got[i] - exact[i]) <= bound))
                            bad_b = 1;
                    }
                }
                if (bad_c || bad_b || bad_e)
                    printf("  dot.qk mismatch: K=%zu M=%zu int4=%d pc=%d: contract %d bound %d edges %d\n", K, M,
                           s4, pc, bad_c, bad_b, bad_e);
                cases[0]++, fails[0] += bad_c;
                cases[1]++, fails[1] += bad_b;
                cases[2]++, fails[2] += bad_e;
                free(A), free(s), free(got), free(want), free(exact), free(B);
            }
    static const char *const names[3] = {"dot.qk.contract", "dot.qk.bound", "dot.qk.edges"};
    for (int i = 0; i < 3; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
}

/* ---- per-group types ------------------------------------------------------ */

static void check_group(void)
{
    static const int kinds[3] = {GQA_G8, GQA_G4, GQA_G2};
    static const size_t heads[3] = {64, 128, 96};
    static const size_t groups[5] = {4, 8, 16, 32, 128};
    static const float rhos[2] = {1.0f, 0.5f};
    long cases[4] = {0}, fails[4] = {0};
    int shown[4] = {0};
    for (int ki = 0; ki < 3; ki++)
        for (int meta16 = 0; meta16 < 2; meta16++)
            for (int hi = 0; hi < 3; hi++)
                for (int gi = 0; gi < 5; gi++) {
                    const size_t H = heads[hi], g = groups[gi], rows = 19;
                    if (H % g)
                        continue;
                    const int type = gqa_group_type(kinds[ki], g, meta16);
                    const size_t rb = gqa_row_bytes(type, H);
                    float *x = xmalloc(rows * H * 4), *d1 = xmalloc(rows * H * 4), *d2 = xmalloc(rows * H * 4);
                    uint8_t *c1 = xmalloc(rows * rb), *c2 = xmalloc(rows * rb);
                    for (size_t i = 0; i < rows * H; i++)
                        x[i] = normal() * (float)(1 + (i / H) % 7) + (float)((i / H) % 3);
                    for (size_t c = 0; c < g; c++)
                        x[2 * H + c] = 0.75f; /* a constant group */
                    x[3 * H + 1] = NAN, x[3 * H + 5] = INFINITY, x[4 * H + 2] = -INFINITY;
                    x[5 * H + 0] = 3e38f, x[5 * H + 1] = -3e38f, x[6 * H + 3] = 1e-40f;
                    for (int r = 0; r < 2; r++) { /* quantize */
                        memset(c1, GUARD, rows * rb), memset(c2, GUARD, rows * rb);
                        T->quantize(x, H, c1, rows, H, type, &rhos[r]);
                        R->quantize(x, H, c2, rows, H, type, &rhos[r]);
                        int bad = memcmp(c1, c2, rows * rb) != 0;
                        cases[0]++, fails[0] += bad;
                        if (bad && shown[0]++ < 5)
                            printf("  group.quantize mismatch: kind %d meta16 %d H %zu g %zu rho %g\n", kinds[ki],
                                   meta16, H, g, (double)rhos[r]);
                    }
                    for (size_t i = 0; i < rows * rb; i++) /* dequantize: any bytes */
                        c1[i] = (uint8_t)rnd();
                    memcpy(c1 + rb, c2 + rb, 10 * rb); /* and quantized rows */
                    T->dequantize(c1, d1, H, rows, H, type, NULL);
                    R->dequantize(c1, d2, H, rows, H, type, NULL);
                    int bad = 0;
                    for (size_t i = 0; i < rows * H; i++)
                        bad |= !same_float(d1[i], d2[i]);
                    T->dequantize_t(c1, d1, rows, rows, H, type, NULL);
                    for (size_t r = 0; r < rows; r++)
                        for (size_t c = 0; c < H; c++)
                            bad |= !same_float(d1[c * rows + r], d2[r * H + c]);
                    cases[1]++, fails[1] += bad;
                    if (bad && shown[1]++ < 5)
                        printf("  group.dequantize mismatch: kind %d meta16 %d H %zu g %zu\n", kinds[ki], meta16, H, g);
                    /* qk and sv on the quantized rows (finite values) */
                    R->quantize(x + 7 * H, H, c2, 12, H, type, NULL);
                    R->dequantize(c2, d2, H, 12, H, type, NULL);
                    for (size_t mi = 0; mi < NM; mi++) {
                        const size_t M = MS[mi], N = 12;
                        float *A = xmalloc(M * H * 4), *C1 = xmalloc(M * H * 4), *C2 = xmalloc(M * H * 4);
                        for (size_t i = 0; i < M * H; i++)
                            A[i] = normal();
                        T->qk_gemm(M, N, H, 0.125f, A, H, c2, type, NULL, C1, N);
                        int qbad = 0, sbad = 0;
                        for (size_t m = 0; m < M; m++)
                            for (size_t n = 0; n < N; n++) {
                                double ex = 0, mag = 0;
                                for (size_t k = 0; k < H; k++) {
                                    ex += (double)A[m * H + k] * d2[n * H + k];
                                    mag += fabs((double)A[m * H + k] * d2[n * H + k]);
                                }
                                qbad |= fabs(C1[m * N + n] - 0.125 * ex) > 1e-5 * (1 + 0.125 * mag);
                            }
                        for (size_t i = 0; i < M * N; i++)
                            A[i] = unif();
                        T->sv_gemm(M, H, N, A, N, c2, type, NULL, C1, H, 0.0f);
                        for (size_t m = 0; m < M; m++)
                            for (size_t n = 0; n < H; n++) {
                                double ex = 0, mag = 0;
                                for (size_t k = 0; k < N; k++) {
                                    ex += (double)A[m * N + k] * d2[k * H + n];
                                    mag += fabs((double)A[m * N + k] * d2[k * H + n]);
                                }
                                sbad |= fabs(C1[m * H + n] - ex) > 1e-5 * (1 + mag);
                            }
                        cases[2]++, fails[2] += qbad;
                        cases[3]++, fails[3] += sbad;
                        if (qbad && shown[2]++ < 5)
                            printf("  group.qk mismatch: kind %d H %zu g %zu M %zu\n", kinds[ki], H, g, M);
                        if (sbad && shown[3]++ < 5)
                            printf("  group.sv mismatch: kind %d H %zu g %zu M %zu\n", kinds[ki], H, g, M);
                        free(A), free(C1), free(C2);
                    }
                    free(x), free(d1), free(d2), free(c1), free(c2);
                }
    static const char *const names[4] = {"group.quantize", "group.dequant", "group.qk", "group.sv"};
    for (int i = 0; i < 4; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
}

/* ---- matrix tiles (a table's tiles by name: AMX and AVX-512 BF16, natively or emulated) */

/* Floats that exercise the rounding: ties both ways, NaN, +-inf, overflow, subnormals. */
static float tile_float(size_t i)
{
    static const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x7FC00001u, 0xFF800001u,
                                       0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x00000001u, 0x807FFFFFu,
                                       0x00800000u, 0x80000000u};
    float x;
    if (i % 13 == 7) {
        memcpy(&x, &special[(i / 13) % (sizeof(special) / sizeof(special[0]))], 4);
        return x;
    }
    return normal() * 10.0f;
}

static void check_tiles(const gqa_tiles *x)
{
    static const size_t ROWS[] = {1, 2, 3, 15, 16, 17, 33};
    static const size_t COLS[] = {1, 5, 16, 17, 31, 32, 33, 64, 70};
    x->begin();
    /* pack_rows / pack_pairs bit for bit, zero padding, stride lds > cols */
    long cases[3] = {0}, fails[3] = {0};
    for (size_t ri = 0; ri < sizeof(ROWS) / sizeof(ROWS[0]); ri++)
        for (size_t ci = 0; ci < sizeof(COLS) / sizeof(COLS[0]); ci++) {
            const size_t rows = ROWS[ri], cols = COLS[ci], lds = cols + 3;
            const size_t rp = (rows + 15) / 16 * 16 + 16 * (ci & 1), cp = (cols + 31) / 32 * 32 + 32 * (ri & 1);
            float *src = xmalloc(rows * lds * 4);
            uint16_t *rw = xmalloc(rp * cp * 2);
            uint32_t *pw = xmalloc(rp / 2 * cp * 4);
            uint32_t *tw = xmalloc(cp / 2 * rp * 4);
            for (size_t i = 0; i < rows * lds; i++)
                src[i] = tile_float(i);
            memset(rw, 0xAB, rp * cp * 2);
            memset(pw, 0xAB, rp / 2 * cp * 4);
            memset(tw, 0xAB, cp / 2 * rp * 4);
            x->pack_rows(src, lds, rows, cols, rp, cp, rw);
            x->pack_pairs(src, lds, rows, cols, rp, cp, pw);
            x->pack_pairs_t(src, lds, rows, cols, rp, cp, tw);
            int bad_r = 0, bad_p = 0, bad_t = 0;
            for (size_t r = 0; r < rp; r++)
                for (size_t c = 0; c < cp; c++) {
                    const uint16_t want = r < rows && c < cols ? bf16_ref(src[r * lds + c]) : 0;
                    bad_r |= rw[r * cp + c] != want;
                    const uint32_t got = pw[(r / 2) * cp + c] >> (16 * (r & 1)) & 0xFFFFu;
                    bad_p |= got != want;
                    /* pairs_t: element (c / 2, r), column c's half */
                    bad_t |= (tw[(c / 2) * rp + r] >> (16 * (c & 1)) & 0xFFFFu) != want;
                }
            if (bad_r || bad_p || bad_t)
                printf("  tiles.pack mismatch: rows=%zu cols=%zu pads %zu x %zu: rows %d pairs %d pairs_t %d\n",
                       rows, cols, rp, cp, bad_r, bad_p, bad_t);
            cases[0]++, fails[0] += bad_r;
            cases[1]++, fails[1] += bad_p;
            cases[2]++, fails[2] += bad_t;
            free(src), free(rw), free(pw), free(tw);
        }
    begin("tiles.rows");
    check_cases = cases[0], check_fails = fails[0];
    end();
    begin("tiles.pairs");
    check_cases = cases[1], check_fails = fails[1];
    end();
    begin("tiles.pairs_t");
    check_cases = cases[2], check_fails = fails[2];
    end();

    /* exp_pack: within 2^-16 of exp (float64), 0 below -86.7 and for -inf, NaN kept; the
       returned sum within float32 summation of the written values; dst the written values'
       bfloat16 (bf16_ref: no result is subnormal), zeros to n_pad, nothing past it; without
       `store` x untouched, the same sum and dst */
    static const size_t EN[] = {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 256, 1000};
    long ecases[4] = {0}, efails[4] = {0};
    for (size_t ni = 0; ni < sizeof(EN) / sizeof(EN[0]); ni++)
        for (int pad = 0; pad < 3; pad++) {
            const size_t n = EN[ni], n_pad = pad == 0 ? n : pad == 1 ? (n + 31) / 32 * 32 : n + 40;
            const float m = 3.0f * normal();
            float *xv = xmalloc((n + 1) * 4), *x0 = xmalloc((n + 1) * 4);
            uint16_t *dst = xmalloc((n_pad + 8) * 2), *dst0 = xmalloc((n_pad + 8) * 2);
            for (size_t i = 0; i < n; i++) {
                const size_t c = i % 11;
                x0[i] = c == 3 ? -INFINITY : c == 5 ? m - 86.0f - 2.0f * unif() : c == 7 && n > 50 ? NAN
                        : m - 30.0f * unif();
                xv[i] = x0[i];
            }
            for (size_t i = 0; i < n_pad + 8; i++)
                dst[i] = dst0[i] = 0xABCD;
            const float sum0 = x->exp_pack(xv, n, n_pad, m, dst0, 0);
            const int bad_0 = memcmp(xv, x0, n * 4) != 0;
            const float sum = x->exp_pack(xv, n, n_pad, m, dst, 1);
            const int bad_n = bad_0 || memcmp(&sum0, &sum, 4) != 0 ||
                              memcmp(dst0, dst, (n_pad + 8) * 2) != 0;
            int bad_v = 0, bad_s = 0, bad_d = 0, nan = 0;
            double s = 0, mag = 0;
            for (size_t i = 0; i < n; i++) {
                const double d = (double)x0[i] - m, want = exp(d);
                if (x0[i] != x0[i]) {
                    bad_v |= xv[i] == xv[i];
                    nan = 1;
                } else if (d < -86.7) { /* t = d log2(e) < -125 from d < -86.64 */
                    bad_v |= xv[i] != 0.0f;
                } else if (d < -86.5) {
                    bad_v |= !(xv[i] == 0.0f || fabs(xv[i] - want) <= want / 65536.0);
                } else {
                    bad_v |= !(fabs(xv[i] - want) <= want / 65536.0);
                }
                bad_v |= xv[i] != 0.0f && fabsf(xv[i]) < FLT_MIN;
                s += xv[i], mag += fabsf(xv[i]);
                bad_d |= dst[i] != bf16_ref(xv[i]);
            }
            for (size_t i = n; i < n_pad + 8; i++)
                bad_d |= dst[i] != (i < n_pad ? 0 : 0xABCD);
            bad_s = nan ? sum == sum : !(fabs(sum - s) <= (n + 2) * mag / 16777216.0);
            if (bad_v || bad_s || bad_d || bad_n)
                printf("  tiles.exp mismatch: n=%zu n_pad=%zu: values %d sum %d dst %d no-store %d\n",
                       n, n_pad, bad_v, bad_s, bad_d, bad_n);
            ecases[0]++, efails[0] += bad_v;
            ecases[1]++, efails[1] += bad_s;
            ecases[2]++, efails[2] += bad_d;
            ecases[3]++, efails[3] += bad_n;
            free(xv), free(x0), free(dst), free(dst0);
        }
    static const char *const enames[4] = {"tiles.exp", "tiles.exp.sum", "tiles.exp.dst",
                                          "tiles.exp.nostore"};
    for (int i = 0; i < 4; i++) {
        begin(enames[i]);
        check_cases = ecases[i], check_fails = efails[i];
        end();
    }

    /* gemm: integers exact in bfloat16 with exact float32 sums (|sum| < 2^24) give exactly the
       integer product; acc = 0 ignores NaN in C, acc = 1 adds to C; columns past N and rows'
       padding of C untouched.  Random normal operands within the float32 summation bound. */
    static const size_t GM[] = {16, 32, 48, 80}, GN[] = {16, 32, 48, 96, 144}, GK[] = {32, 64, 96, 256, 1024};
    long gcases[2] = {0}, gfails[2] = {0};
    for (size_t mi = 0; mi < 4; mi++)
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t ki = 0; ki < 5; ki++)
                for (int acc = 0; acc < 2; acc++) {
                    const size_t M = GM[mi], N = GN[ni], K = GK[ki], lda = K + 32 * (ni & 1),
                                 ldb = N + 16 * (mi & 1), ldc = N + 5;
                    uint16_t *A = xmalloc(M * lda * 2);
                    uint32_t *B = xmalloc(K / 2 * ldb * 4);
                    float *C = xmalloc(M * ldc * 4), *C0 = xmalloc(M * ldc * 4);
                    int ints = 1, bad[2] = {0, 0};
                    for (int pass = 0; pass < 2; pass++, ints = 0) {
                        for (size_t i = 0; i < M * lda; i++)
                            A[i] = bf16_ref(ints ? (float)((int)(rnd() % 17) - 8) : normal());
                        for (size_t i = 0; i < K / 2 * ldb; i++)
                            B[i] = (uint32_t)bf16_ref(ints ? (float)((int)(rnd() % 17) - 8) : normal()) |
                                   (uint32_t)bf16_ref(ints ? (float)((int)(rnd() % 17) - 8) : normal()) << 16;
                        for (size_t i = 0; i < M * ldc; i++)
                            C[i] = C0[i] = (i % ldc) >= N ? GUARD_F : acc ? (float)((int)(rnd() % 101) - 50) : NAN;
                        x->gemm(M, N, K, A, lda, B, ldb, C, ldc, acc);
                        for (size_t m = 0; m < M; m++)
                            for (size_t n = 0; n < ldc; n++) {
                                const float got = C[m * ldc + n];
                                if (n >= N) {
                                    bad[pass] |= !same_float(got, GUARD_F);
                                    continue;
                                }
                                double sum = acc ? C0[m * ldc + n] : 0.0, mag = fabs(sum);
                                for (size_t k = 0; k < K; k++) {
                                    const uint32_t pr = B[(k / 2) * ldb + n];
                                    const double p = (double)bf16_daz(A[m * lda + k]) *
                                                     bf16_daz((uint16_t)(pr >> (16 * (k & 1))));
                                    sum += p, mag += fabs(p);
                                }
                                if (ints)
                                    bad[0] |= got != (float)sum;
                                else
                                    bad[1] |= !(fabs(got - sum) <= (K + 2) * mag / 16777216.0 + 1e-30);
                            }
                    }
                    if (bad[0] || bad[1])
                        printf("  tiles.gemm mismatch: M=%zu N=%zu K=%zu acc=%d: exact %d bound %d\n", M, N, K,
                               acc, bad[0], bad[1]);
                    for (int i = 0; i < 2; i++)
                        gcases[i]++, gfails[i] += bad[i];
                    free(A), free(B), free(C), free(C0);
                }
    x->end();
    begin("tiles.gemm.exact");
    check_cases = gcases[0], check_fails = gfails[0];
    end();
    begin("tiles.gemm.bound");
    check_cases = gcases[1], check_fails = gfails[1];
    end();
}

/* qk_f / sv_f (levels 3-4's decode kernels of float32 rows): against float64 over the operands
   as the contract rounds them (bf16_ref; QK's query times alpha in float32 first), within
   float32 summation of K terms ((K + 2) 2^-24 of the sum of |products|; sv adds beta C); small
   integers exactly (exact in bfloat16, sums below 2^24); beta == 0 ignores NaN in C; columns
   past N untouched (M = 40 at K = 513: A's rows past the stack buffer); other types give the
   avx512 path's float32 kernels' bits. */
static void check_float_dot(const gqa_tiles *x)
{
    static const size_t FM[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 40}, FN[] = {1, 5, 16, 17, 33, 100},
                        FK[] = {1, 16, 31, 32, 33, 64, 100, 256, 513};
    long cases[4] = {0}, fails[4] = {0};
    for (size_t mi = 0; mi < sizeof FM / sizeof FM[0]; mi++)
        for (size_t ni = 0; ni < sizeof FN / sizeof FN[0]; ni++)
            for (size_t ki = 0; ki < sizeof FK / sizeof FK[0]; ki++)
                for (int pass = 0; pass < 3; pass++) {
                    const size_t M = FM[mi], N = FN[ni], K = FK[ki], lda = K + 3, ldc = N + 5;
                    const int ints = pass == 0;
                    const float alpha = ints ? 1.0f : 0.37f, beta = pass == 0 ? 0.0f : pass == 1 ? 1.0f : 0.5f;
                    float *A = xmalloc(M * lda * 4), *Bq = xmalloc(N * K * 4), *Bs = xmalloc(K * N * 4);
                    float *P = xmalloc(M * lda * 4), *C = xmalloc(M * ldc * 4), *C0 = xmalloc(M * ldc * 4);
                    for (size_t i = 0; i < M * lda; i++) {
                        A[i] = ints ? (float)((int)(rnd() % 17) - 8) : normal();
                        P[i] = ints ? (float)(rnd() % 9) : unif();
                    }
                    for (size_t i = 0; i < N * K; i++) {
                        Bq[i] = ints ? (float)((int)(rnd() % 17) - 8) : normal();
                        Bs[i] = ints ? (float)((int)(rnd() % 17) - 8) : normal();
                    }
                    int bad_qk = 0, bad_sv = 0;
                    /* qk: C[m, n] = sum_k bf16(alpha A[m, k]) bf16(Bq[n, k]) */
                    for (size_t i = 0; i < M * ldc; i++)
                        C[i] = (i % ldc) < N ? NAN : GUARD_F;
                    x->qk_f(M, N, K, alpha, A, lda, Bq, GQA_F32, NULL, C, ldc);
                    for (size_t m = 0; m < M; m++)
                        for (size_t n = 0; n < ldc; n++) {
                            const float got = C[m * ldc + n];
                            if (n >= N) {
                                bad_qk |= !same_float(got, GUARD_F);
                                continue;
                            }
                            double sum = 0, mag = 0;
                            for (size_t k = 0; k < K; k++) {
                                const double p = (double)bf16_daz(bf16_ref(alpha * A[m * lda + k])) *
                                                 bf16_daz(bf16_ref(Bq[n * K + k]));
                                sum += p, mag += fabs(p);
                            }
                            bad_qk |= ints ? got != (float)sum : !(fabs(got - sum) <= (K + 2) * mag / 16777216.0 + 1e-30);
                        }
                    /* sv: C[m, n] = beta C0[m, n] + sum_k bf16(P[m, k]) bf16(Bs[k, n]) */
                    for (size_t i = 0; i < M * ldc; i++)
                        C[i] = C0[i] = (i % ldc) >= N ? GUARD_F : beta == 0.0f ? NAN : (float)((int)(rnd() % 101) - 50);
                    x->sv_f(M, N, K, P, lda, Bs, GQA_F32, NULL, C, ldc, beta);
                    for (size_t m = 0; m < M; m++)
                        for (size_t n = 0; n < ldc; n++) {
                            const float got = C[m * ldc + n];
                            if (n >= N) {
                                bad_sv |= !same_float(got, GUARD_F);
                                continue;
                            }
                            double sum = beta == 0.0f ? 0.0 : (double)beta * C0[m * ldc + n], mag = fabs(sum);
                            for (size_t k = 0; k < K; k++) {
                                const double p = (double)bf16_daz(bf16_ref(P[m * lda + k])) *
                                                 bf16_daz(bf16_ref(Bs[k * N + n]));
                                sum += p, mag += fabs(p);
                            }
                            bad_sv |= ints ? got != (float)sum : !(fabs(got - sum) <= (K + 4) * mag / 16777216.0 + 1e-30);
                        }
                    if (bad_qk || bad_sv)
                        printf("  tiles.float mismatch: M=%zu N=%zu K=%zu pass %d: qk %d sv %d\n", M, N, K, pass,
                               bad_qk, bad_sv);
                    cases[ints ? 0 : 1]++, fails[ints ? 0 : 1] += bad_qk;
                    cases[ints ? 2 : 3]++, fails[ints ? 2 : 3] += bad_sv;
                    free(A), free(Bq), free(Bs), free(P), free(C), free(C0);
                }
    static const char *const names[4] = {"tiles.float.qk.exact", "tiles.float.qk.bound", "tiles.float.sv.exact",
                                         "tiles.float.sv.bound"};
    for (int i = 0; i < 4; i++) {
        begin(names[i]);
        check_cases = cases[i], check_fails = fails[i];
        end();
    }
    /* other types: the avx512 path's float32 kernels, bit for bit */
    begin("tiles.float.other_types");
    {
        const size_t M = 4, N = 37, K = 64;
        float A[4 * 64], C1[4 * 64], C2[4 * 64], S[1] = {0.05f};
        int8_t Bc[64 * 64];
        for (size_t i = 0; i < M * K; i++)
            A[i] = unif();
        for (size_t i = 0; i < sizeof Bc; i++)
            Bc[i] = (int8_t)((int)(rnd() % 255) - 127);
        x->qk_f(M, N, K, 0.3f, A, K, Bc, GQA_S8_PT, S, C1, N);
        T->qk_gemm(M, N, K, 0.3f, A, K, Bc, GQA_S8_PT, S, C2, N);
        check_cases++, check_fails += memcmp(C1, C2, M * N * 4) != 0;
        memset(C1, 0, sizeof C1), memset(C2, 0, sizeof C2);
        x->sv_f(M, K, N, A, K, Bc, GQA_S8_PT, S, C1, K, 0.0f);
        T->sv_gemm(M, K, N, A, K, Bc, GQA_S8_PT, S, C2, K, 0.0f);
        check_cases++, check_fails += memcmp(C1, C2, M * K * 4) != 0;
    }
    end();
}

#include "group_dot.h" /* check_group_dot: the per-group contracts of level 4 */

int main(int argc, char **argv)
{
    int exact = argc < 2, approx = argc < 2, dot = 0, group_dot = 0;
    const char *tiles = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "exact"))
            exact = 1;
        else if (!strcmp(argv[i], "approx"))
            approx = 1;
        else if (!strcmp(argv[i], "dot"))
            dot = group_dot = 1; /* a path's own unit, which takes per-group codes too */
        else if (!strncmp(argv[i], "tiles=", 6))
            tiles = argv[i] + 6;
        else {
            fprintf(stderr, "usage: %s [exact] [approx] [dot] [tiles=NAME]\n", argv[0]);
            return 2;
        }
    }
    printf("driver %s vs scalar\n", T->name);
    if (exact) {
        check_quantize();
        check_dequantize();
        check_qk();
        check_sv();
        check_group();
        check_exp();
        check_row_max();
        check_hadamard();
        check_rope();
        check_block_lines();
    }
    if (approx) {
        if (T->qk_gemm_s8_approx == NULL) {
            printf("approx: the %s table has no qk_gemm_s8_approx\n", T->name);
            n_checks++, n_failed++;
        } else {
            check_approx();
        }
        dot = group_dot = 1; /* the VNNI unit's level 4, which takes per-group codes too */
    }
    if (dot) { /* accuracy level 4's integer dots (approx: the VNNI unit's; dot: a path's own) */
        if (T->qk_gemm_s8_dot == NULL || T->sv_gemm_s8_dot == NULL) {
            printf("dot: the %s table has no qk_gemm_s8_dot / sv_gemm_s8_dot\n", T->name);
            n_checks++, n_failed++;
        } else {
            check_dot_qk(T->qk_gemm_s8_dot, 1);
            check_sv_dot(T->sv_gemm_s8_dot, 1);
            if (group_dot)
                check_group_dot(T->qk_gemm_s8_dot, T->sv_gemm_s8_dot);
        }
    }
    if (tiles) {
        const gqa_tiles *x = NULL;
        for (size_t i = 0; T->tiles != NULL && T->tiles[i] != NULL; i++)
            if (!strcmp(T->tiles[i]->name, tiles))
                x = T->tiles[i];
        if (x == NULL || !x->permit()) {
            printf("tiles: the %s table has no tiles %s, or the kernel refused the tile state\n", T->name,
                   tiles);
            n_checks++, n_failed++;
        } else {
            check_tiles(x);
            if (x->qk_f != NULL)
                check_float_dot(x);
            if (x->qk_s8 != NULL) { /* level 4's integer dots on these tiles: the same contracts */
                x->begin();
                check_dot_qk(x->qk_s8, 0); /* INT8 only: INT4 calls take the VNNI unit */
                check_sv_dot(x->sv_s8, 0);
                x->end();
            }
        }
    }
    printf("driver %s: %ld checks, %ld failed\n", T->name, n_checks, n_failed);
    return n_failed ? 1 : 0;
}
