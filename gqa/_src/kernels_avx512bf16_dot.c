/*
 * kernels_avx512bf16_dot.c -- the decode kernels of float rows at accuracy levels 3-4
 * (gqa_tiles.qk_f / sv_f of the AVX-512 BF16 tiles) on AVX-512 BF16 dot products (vdpbf16ps):
 * gqa_kernels.h's qk_gemm and sv_gemm on float32 rows (GQA_F32) as stored, with the bfloat16
 * tiles' roundings (kernels_avx512bf16.c):
 *   qk  C[m, n] = sum_k bf16(fl(alpha A[m, k])) bf16(B[n, k])                  (C overwritten)
 *   sv  C[m, n] = beta C[m, n] + sum_k bf16(A[m, k]) bf16(B[k, n])   (beta == 0 overwrites C)
 * bf16() rounds to nearest even (vcvtne2ps2bf16: NaN kept, overflow to inf, subnormal inputs as
 * zero).  vdpbf16ps takes subnormal inputs as zero, forms each product exactly in float32 and
 * adds it to its lane with one rounding (to nearest even, subnormal results flushed).  The
 * order of the sums depends on K only, never on M, N or the register block of (m, n), so a
 * caller may split a call and get the same bits:
 *   qk  each (m, n) in 16 lanes, two products per lane and step of 32 columns in order of k
 *       (the columns past K read as zero), then the 16 lanes by kernels_avx512.h's hsum16x16;
 *   sv  each (m, n) in one lane, the pair of keys (2p, 2p + 1) per step in order of p (a
 *       missing key 2p + 1 is zero), in chunks of SVF_KC keys, each chunk's sum added to C.
 * Other types take the avx512 path's float32 kernels.
 * ISA flags: the avx512 path's plus -mavx512bf16 (a source of the avx512bf16 unit).
 */
#include <stdint.h>
#include <string.h>
#include "kernels_avx512.h" /* <immintrin.h> */
#include "gqa_kernels.h"

extern const gqa_kernels gqa_kernels_avx512;

/* 16 floats of a row from column c, lanes [0, n) (n <= 16; full: n == 16, unmasked). */
INLINE __m512 row16(const int full, const float *row, size_t c, size_t n)
{
    return full ? _mm512_loadu_ps(row + c) : _mm512_maskz_loadu_ps(mask16(n), row + c);
}

/* Columns [c, c + 32) of a row as bfloat16 in order, zeros from column K on. */
INLINE __m512bh row32(const int full, const float *row, size_t c, size_t K)
{
    if (full)
        return _mm512_cvtne2ps_pbh(row16(1, row, c + 16, 16), row16(1, row, c, 16));
    const size_t n = K - c;
    const __m512 hi = n > 16 ? row16(0, row, c + 16, n - 16) : _mm512_setzero_ps();
    return _mm512_cvtne2ps_pbh(hi, row16(0, row, c, n < 16 ? n : 16));
}

/* dst[0 : Kp] = bf16(fl(alpha x[k])) for k < K, zeros to Kp (a multiple of 32). */
static void bf16_row(const float *x, size_t K, size_t Kp, float alpha, uint16_t *dst)
{
    const __m512 va = _mm512_set1_ps(alpha);
    for (size_t k = 0; k < Kp; k += 32) {
        const __m512 lo = k < K ? _mm512_maskz_loadu_ps(mask16(K - k < 16 ? K - k : 16), x + k) : _mm512_setzero_ps();
        const __m512 hi = k + 16 < K ? _mm512_maskz_loadu_ps(mask16(K - k - 16 < 16 ? K - k - 16 : 16), x + k + 16)
                                     : _mm512_setzero_ps();
        _mm512_storeu_si512((void *)(dst + k),
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, va), _mm512_mul_ps(lo, va)));
    }
}

/* Bytes of A's bfloat16 rows kept on the stack (larger calls allocate). */
#define A_STACK_BYTES 32768

/* The M rows of A as bfloat16 (bf16_row, times alpha) in `stack` (A_STACK_BYTES) or, past it,
   in an allocation the caller frees (!= stack); NULL when that fails. */
static uint16_t *bf16_rows(size_t M, size_t K, size_t Kp, float alpha, const float *A, size_t lda, uint16_t *stack)
{
    uint16_t *Ab = M * Kp * 2 > A_STACK_BYTES ? (uint16_t *)malloc(M * Kp * 2) : stack;
    if (Ab != NULL)
        for (size_t m = 0; m < M; m++)
            bf16_row(A + m * lda, K, Kp, alpha, Ab + m * Kp);
    return Ab;
}

/* ---- qk ------------------------------------------------------------------------------------ */

/* Keys per pass of the row blocks: about this many bytes of B, which the next block of rows
   then reads from L1 / L2. */
#define QKF_PASS_BYTES 16384

/* Rows [n0, n1) of B (n1 - n0 a multiple of NB; row stride K) against MB packed rows of A (Ab,
   stride Kp), NB rows at a time: MB * NB <= 16 accumulators, one vdpbf16ps per (row, key) and
   32 columns. */
INLINE void qkf_block(const int MB, const int NB, size_t n0, size_t n1, size_t K, size_t Kp,
                      const uint16_t *Ab, const float *B, float *C, size_t ldc)
{
    const size_t K32 = K & ~(size_t)31;
    for (size_t n = n0; n < n1; n += NB) {
        const float *Bn = B + n * K;
        __m512 acc[16];
        UNROLL
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_ps();
        size_t k = 0;
        for (; k < K32; k += 32) {
            /* B streams from memory in decode: the block's rows FLOAT_QK_PF bytes ahead into L2
               (kernels_avx512.h), one prefetch per line spread over the steps */
            for (int j = 0; j < (128 * NB + 63) / 64; j++)
                _mm_prefetch((const char *)Bn + FLOAT_QK_PF + k * NB * 4 + 64 * j, STREAM_HINT);
            __m512bh a[8];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = (__m512bh)_mm512_loadu_si512((const void *)(Ab + mb * Kp + k));
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                const __m512bh b = row32(1, Bn + nb * K, k, K);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm512_dpbf16_ps(acc[mb * NB + nb], a[mb], b);
            }
        }
        if (k < K)
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                const __m512bh b = row32(0, Bn + nb * K, k, K);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm512_dpbf16_ps(
                        acc[mb * NB + nb], (__m512bh)_mm512_loadu_si512((const void *)(Ab + mb * Kp + k)), b);
            }
        const __m512 h = hsum16x16(acc);
        if (MB == 1 && NB == 16) {
            _mm512_storeu_ps(C + n, h);
        } else {
            float out[16];
            _mm512_storeu_ps(out, h);
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                UNROLL
                for (int nb = 0; nb < NB; nb++)
                    C[mb * ldc + n + nb] = out[mb * NB + nb];
        }
    }
}

/* One function per (rows MB, keys NB): wide blocks 1x16 2x8 3x4 4x4 5x2 6x2 7x2 8x2 (the keys
   per step divide 16, so a pass of a multiple of 16 keys needs no narrow block), MB x 1 for
   the last keys of the call. */
#define QKF_INST(MB, NB)                                                                              \
    static void qkf_##MB##x##NB(size_t n0, size_t n1, size_t K, size_t Kp, const uint16_t *Ab,        \
                                const float *B, float *C, size_t ldc)                                 \
    {                                                                                                 \
        qkf_block(MB, NB, n0, n1, K, Kp, Ab, B, C, ldc);                                              \
    }
typedef void (*qkf_fn)(size_t, size_t, size_t, size_t, const uint16_t *, const float *, float *, size_t);
QKF_INST(1, 16) QKF_INST(2, 8) QKF_INST(3, 4) QKF_INST(4, 4) QKF_INST(5, 2) QKF_INST(6, 2) QKF_INST(7, 2)
QKF_INST(8, 2) QKF_INST(1, 1) QKF_INST(2, 1) QKF_INST(3, 1) QKF_INST(4, 1) QKF_INST(5, 1) QKF_INST(6, 1)
QKF_INST(7, 1) QKF_INST(8, 1)
static const qkf_fn qkf_wide[9] = {0, qkf_1x16, qkf_2x8, qkf_3x4, qkf_4x4, qkf_5x2, qkf_6x2, qkf_7x2, qkf_8x2};
static const qkf_fn qkf_narrow[9] = {0, qkf_1x1, qkf_2x1, qkf_3x1, qkf_4x1, qkf_5x1, qkf_6x1, qkf_7x1, qkf_8x1};
static const int qkf_nb[9] = {0, 16, 8, 4, 4, 2, 2, 2, 2};

void gqa_qk_gemm_f_avx512bf16(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                              const void *B, int type, const float *s, float *C, size_t ldc)
{
    if (type != GQA_F32 || K == 0 || M == 0 || N == 0) {
        gqa_kernels_avx512.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    const size_t Kp = (K + 31) & ~(size_t)31;
    uint16_t stack_buf[A_STACK_BYTES / 2];
    uint16_t *Ab = bf16_rows(M, K, Kp, alpha, A, lda, stack_buf);
    if (Ab == NULL) {
        gqa_kernels_avx512.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc); /* out of memory */
        return;
    }
    const size_t bm = gqa_row_block(M, 8);
    size_t pass = (QKF_PASS_BYTES / (4 * K)) & ~(size_t)15;
    pass = bm >= M ? N : pass < 16 ? 16 : pass; /* one block of rows: one pass */
    for (size_t n0 = 0; n0 < N; n0 += pass) {
        const size_t n1 = N - n0 < pass ? N : n0 + pass;
        for (size_t m0 = 0; m0 < M; m0 += bm) {
            const int mb = (int)(M - m0 < bm ? M - m0 : bm);
            const size_t nw = n0 + (n1 - n0) / (size_t)qkf_nb[mb] * (size_t)qkf_nb[mb];
            qkf_wide[mb](n0, nw, K, Kp, Ab + m0 * Kp, (const float *)B, C + m0 * ldc, ldc);
            qkf_narrow[mb](nw, n1, K, Kp, Ab + m0 * Kp, (const float *)B, C + m0 * ldc, ldc);
        }
    }
    if (Ab != stack_buf)
        free(Ab);
}

/* ---- sv ------------------------------------------------------------------------------------ */

/* Keys per chunk (even; fixed, so the points where sums meet C depend on K only). */
#define SVF_KC 256

/* Columns n0 .. n0 + 16 NV of C[MB, .] += sum over keys [k0, k1) (k0 even; B's row stride N) of
   Ab[m, k] B[k, col]: per pair of keys, each vector of 16 columns converted once
   (vcvtne2ps2bf16, then vpermw puts key 2p's and 2p + 1's values of a column in one 32-bit
   lane) and one vdpbf16ps per row with the row's pair of probabilities broadcast.  `masked`
   (NV == 1): only np < 16 columns.  `pf`: the bytes from a row to the same row of the next
   chunk, whose lines in the block's columns (gqa_block_lines) are prefetched into L2, or 0. */
INLINE void svf_block(const int MB, const int NV, const int masked, size_t np, size_t k0, size_t k1,
                      const uint16_t *Ab, size_t Kp, const float *B, size_t N, size_t n0, float *C, size_t ldc,
                      size_t pf)
{
    size_t pf0 = 0;
    const int npf = pf ? gqa_block_lines(gqa_element_bits(GQA_EL_F32), n0, masked ? np : 16 * (size_t)NV, &pf0) : 0;
    pf0 += pf;
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 acc[16];
    UNROLL
    for (int i = 0; i < MB * NV; i++)
        acc[i] = _mm512_setzero_ps();
    for (size_t k = k0; k < k1; k += 2) {
        const float *r0 = B + k * N;
        const int two = k + 1 < k1;
        for (int j = 0; j < npf; j++) {
            _mm_prefetch((const char *)r0 + pf0 + 64 * j, STREAM_HINT);
            _mm_prefetch((const char *)(r0 + N) + pf0 + 64 * j, STREAM_HINT);
        }
        __m512bh b[8];
        UNROLL
        for (int v = 0; v < NV; v++) {
            const size_t c = n0 + 16 * (size_t)v;
            const __m512 x0 = row16(!masked, r0, c, np);
            const __m512 x1 = two ? row16(!masked, r0 + N, c, np) : _mm512_setzero_ps();
            b[v] = (__m512bh)_mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
        }
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            uint32_t a2;
            memcpy(&a2, Ab + mb * Kp + k, sizeof a2);
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)a2);
            UNROLL
            for (int v = 0; v < NV; v++)
                acc[mb * NV + v] = _mm512_dpbf16_ps(acc[mb * NV + v], a, b[v]);
        }
    }
    UNROLL
    for (int mb = 0; mb < MB; mb++)
        UNROLL
        for (int v = 0; v < NV; v++) {
            float *c = C + mb * ldc + n0 + 16 * v;
            if (masked)
                _mm512_mask_storeu_ps(c, mask16(np), _mm512_add_ps(_mm512_maskz_loadu_ps(mask16(np), c), acc[mb]));
            else
                _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), acc[mb * NV + v]));
        }
}

#define SVF_INST(MB, NV)                                                                              \
    static void svf_##MB##x##NV(size_t np, size_t k0, size_t k1, const uint16_t *Ab, size_t Kp,        \
                                const float *B, size_t N, size_t n0, float *C, size_t ldc, size_t pf) \
    {                                                                                                 \
        svf_block(MB, NV, 0, np, k0, k1, Ab, Kp, B, N, n0, C, ldc, pf);                               \
    }
#define SVF_MASKED(MB)                                                                                \
    static void svfm_##MB(size_t np, size_t k0, size_t k1, const uint16_t *Ab, size_t Kp, const float *B, \
                          size_t N, size_t n0, float *C, size_t ldc, size_t pf)                       \
    {                                                                                                 \
        svf_block(MB, 1, 1, np, k0, k1, Ab, Kp, B, N, n0, C, ldc, pf);                                \
    }
typedef void (*svf_fn)(size_t, size_t, size_t, const uint16_t *, size_t, const float *, size_t, size_t,
                       float *, size_t, size_t);
/* Per row count MB: blocks of {8, 4, 2, 1} vectors of 16 columns (those with MB x NV <= 16
   accumulators, NULL for the others) and the masked block.  Columns go to the widest block that
   fits them; a column's value never depends on its block. */
#define SVF_WIDE(MB) SVF_INST(MB, 8) SVF_INST(MB, 4) SVF_INST(MB, 2) SVF_INST(MB, 1) SVF_MASKED(MB)
#define SVF_MID(MB) SVF_INST(MB, 4) SVF_INST(MB, 2) SVF_INST(MB, 1) SVF_MASKED(MB)
#define SVF_NARROW(MB) SVF_INST(MB, 2) SVF_INST(MB, 1) SVF_MASKED(MB)
SVF_WIDE(1) SVF_WIDE(2) SVF_MID(3) SVF_MID(4) SVF_NARROW(5) SVF_NARROW(6) SVF_NARROW(7) SVF_NARROW(8)
static const svf_fn svf_fns[9][5] = {{0},
                                     {svf_1x8, svf_1x4, svf_1x2, svf_1x1, svfm_1},
                                     {svf_2x8, svf_2x4, svf_2x2, svf_2x1, svfm_2},
                                     {0, svf_3x4, svf_3x2, svf_3x1, svfm_3},
                                     {0, svf_4x4, svf_4x2, svf_4x1, svfm_4},
                                     {0, 0, svf_5x2, svf_5x1, svfm_5},
                                     {0, 0, svf_6x2, svf_6x1, svfm_6},
                                     {0, 0, svf_7x2, svf_7x1, svfm_7},
                                     {0, 0, svf_8x2, svf_8x1, svfm_8}};

void gqa_sv_gemm_f_avx512bf16(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                              int type, const float *s, float *C, size_t ldc, float beta)
{
    if (type != GQA_F32 || M == 0 || N == 0) {
        gqa_kernels_avx512.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    /* the rows of A as bfloat16 in order: 32-bit element p is the pair of keys (2p, 2p + 1) */
    const size_t Kp = (K + 31) & ~(size_t)31;
    uint16_t stack_buf[A_STACK_BYTES / 2];
    uint16_t *Ab = bf16_rows(M, K, Kp, 1.0f, A, lda, stack_buf);
    if (Ab == NULL) {
        gqa_kernels_avx512.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta); /* out of memory */
        return;
    }
    sv_scale_rows(M, N, C, ldc, beta);
    const size_t bm = gqa_row_block(M, 8), n16 = N & ~(size_t)15;
    for (size_t k0 = 0; k0 < K; k0 += SVF_KC) {
        const size_t k1 = K - k0 < SVF_KC ? K : k0 + SVF_KC;
        for (size_t m0 = 0; m0 < M; m0 += bm) {
            const int mb = (int)(M - m0 < bm ? M - m0 : bm);
            const svf_fn *f = svf_fns[mb];
            const uint16_t *a = Ab + m0 * Kp;
            float *c = C + m0 * ldc;
            /* the first block of rows prefetches the next chunk (gqa_sv_prefetches says where) */
            const size_t widest = (size_t)16 << (f[0] ? 3 : f[1] ? 2 : 1);
            const size_t pf = m0 == 0 && k1 < K && gqa_sv_prefetches(GQA_EL_F32, N, widest) ? SVF_KC * N * 4 : 0;
            size_t n = 0;
            for (int w = 0; w < 4; w++) {
                const size_t step = (size_t)16 << (3 - w);
                for (; f[w] && n + step <= n16; n += step)
                    f[w](16, k0, k1, a, Kp, (const float *)B, N, n, c, ldc, pf);
            }
            if (n < N)
                f[4](N - n, k0, k1, a, Kp, (const float *)B, N, n, c, ldc, pf);
        }
    }
    if (Ab != stack_buf)
        free(Ab);
}
