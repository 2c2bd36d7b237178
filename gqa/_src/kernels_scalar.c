/*
 * kernels_scalar.c -- portable reference path `scalar`.  ISA flags: none.
 *
 * Computes the operations of gqa_kernels.h one element at a time: each B
 * element is decoded (q * s, in float32) once per B chunk and then used for
 * every row of A, summing over k in increasing order.  This is the path every
 * other path is compared against, and the one used on CPUs without SIMD.
 */
#include "kernels_common.h"
#include "kernels_group.h"

#define CHUNK 64

float gqa_half_to_float(uint16_t h) { return gqa_h2f(h); }
uint16_t gqa_float_to_half(float f) { return gqa_f2h(f); }

GQA_GROUP_OPS(scalar, gqa_group_decode_row_ref)

static void quantize_scalar(const float *src, size_t lda, void *dst, size_t rows,
                            size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { gqa_group_quantize(src, lda, dst, rows, cols, type, s); return; }
    size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++)
        gqa_quantize_row_ref(src + r * lda, (uint8_t *)dst + r * rb, 0, cols, type, s);
}

/* dst[r * rs + c * cs] = element c of static or float row r (gqa_decode). */
static void decode_rows(const void *src, float *dst, size_t rs, size_t cs, size_t rows,
                        size_t cols, int type, const float *s)
{
    size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)src + r * rb;
        for (size_t c = 0; c < cols; c++)
            dst[r * rs + c * cs] = gqa_decode(row, c, type, s);
    }
}

static void dequantize_scalar(const void *src, float *dst, size_t ldd, size_t rows,
                              size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { group_dequantize_scalar(src, dst, ldd, rows, cols, type); return; }
    decode_rows(src, dst, ldd, 1, rows, cols, type, s);
}

static void dequantize_t_scalar(const void *src, float *dst, size_t ldd, size_t rows,
                                size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { group_dequantize_t_scalar(src, dst, ldd, rows, cols, type); return; }
    decode_rows(src, dst, 1, ldd, rows, cols, type, s);
}

static void qk_gemm_scalar(size_t M, size_t N, size_t K, float alpha, const float *A,
                           size_t lda, const void *B, int type, const float *s,
                           float *C, size_t ldc)
{
    if (GQA_IS_GROUP(type)) { group_qk_scalar(M, N, K, alpha, A, lda, B, type, C, ldc); return; }
    size_t rb = gqa_row_bytes(type, K);
    float b[CHUNK];
    for (size_t n = 0; n < N; n++) {
        const uint8_t *row = (const uint8_t *)B + n * rb;
        for (size_t m = 0; m < M; m++)
            C[m * ldc + n] = 0.0f;
        for (size_t k0 = 0; k0 < K; k0 += CHUNK) {
            size_t kc = K - k0 < CHUNK ? K - k0 : CHUNK;
            for (size_t k = 0; k < kc; k++)
                b[k] = gqa_decode(row, k0 + k, type, s);
            for (size_t m = 0; m < M; m++) {
                const float *a = A + m * lda + k0;
                float acc = C[m * ldc + n];
                for (size_t k = 0; k < kc; k++)
                    acc += a[k] * b[k];
                C[m * ldc + n] = acc;
            }
        }
        for (size_t m = 0; m < M; m++)
            C[m * ldc + n] *= alpha;
    }
}

static void sv_gemm_scalar(size_t M, size_t N, size_t K, const float *A, size_t lda,
                           const void *B, int type, const float *s, float *C,
                           size_t ldc, float beta)
{
    if (GQA_IS_GROUP(type)) { group_sv_scalar(M, N, K, A, lda, B, type, C, ldc, beta); return; }
    size_t rb = gqa_row_bytes(type, N);
    float b[CHUNK];
    for (size_t m = 0; m < M; m++)
        for (size_t n = 0; n < N; n++)
            C[m * ldc + n] = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
    for (size_t n0 = 0; n0 < N; n0 += CHUNK) {
        size_t nc = N - n0 < CHUNK ? N - n0 : CHUNK;
        for (size_t k = 0; k < K; k++) {
            const uint8_t *row = (const uint8_t *)B + k * rb;
            for (size_t n = 0; n < nc; n++)
                b[n] = gqa_decode(row, n0 + n, type, s);
            for (size_t m = 0; m < M; m++) {
                float a = A[m * lda + k];
                float *c = C + m * ldc + n0;
                for (size_t n = 0; n < nc; n++)
                    c[n] += a * b[n];
            }
        }
    }
}

static float exp_sum_scalar(float *x, size_t n, float m)
{
    float total = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = x[i] - m;
        x[i] = d < GQA_EXP_MIN ? 0.0f : expf(d);
        total += x[i];
    }
    return total;
}

static float row_max_scalar(const float *x, size_t n)
{
    return gqa_max_of(x, n, -INFINITY);
}

static void rope_row_scalar(size_t r2, int interleaved, const float *x, const float *c, const float *s, float *o)
{
    gqa_rope_pairs(0, r2, interleaved, x, c, s, o);
}

static void hadamard_rows_scalar(size_t n, size_t H, const float *x, size_t ldx, float *o, size_t ldo,
                                 float c, int inverse)
{
    gqa_hadamard_rows(n, H, x, ldx, o, ldo, c, inverse);
}

GQA_KERNEL_TABLE(scalar, NULL, NULL, NULL, NULL)
