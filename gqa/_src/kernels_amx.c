/*
 * kernels_amx.c -- AMX BF16 tiles for the flash prompt tiles at accuracy level >= 3
 * (gqa_tiles in gqa_kernels.h): bfloat16 operands, float32 products and sums.
 * ISA flags: the avx512 path's plus -mamx-tile -mamx-bf16 -mavx512bf16 (a unit of the avx512
 * path; its table's `tiles`).  dispatch.c hands the table out only where CPUID has AMX-TILE,
 * AMX-BF16 and AVX512-BF16, XCR0 enables the tile state and the kernel grants it (permit).
 *
 * Operand layouts (every buffer padded by the caller; padding is written as zeros):
 *   rows  A [rows_pad, cols_pad] uint16 bfloat16, row-major: the left operand of gemm.
 *   pairs B [rows_pad / 2, cols_pad] uint32, element (p, c) = bf16(src[2p][c]) in its low
 *         16 bits and bf16(src[2p + 1][c]) in its high 16 bits: AMX's "VNNI" right operand,
 *         two consecutive rows of the K dimension per 32-bit element.
 *   exp_pack  x[i] = exp(x[i] - m) within 2^-16 relative (exp2_16; arguments below -86.6,
 *         -inf included, give 0, NaN stays NaN) for i < n, returning
 *         their float32 sum, and the same values as a row of A (zeros past n, to n_pad).
 *   gemm  C[M, N] = (acc ? C : 0) + A[M, K] B[K, N] with A rows, B pairs; M and N multiples
 *         of 16, K a multiple of 32; C float32 with row stride ldc.
 * Rounding of rows / pairs: float32 -> bfloat16 by vcvtne2ps2bf16: to nearest, ties to even, NaN kept
 * (quiet), overflow to inf, subnormal inputs as zero; tdpbf16ps takes subnormal bfloat16
 * inputs as zero and sums each pair of exact products into the float32 accumulator (round
 * to nearest even, subnormal results flushed to zero).
 *
 * Tile state: begin loads this unit's configuration (palette 1, eight 16 x 64-byte tiles)
 * and end releases it; a caller brackets each stretch of gemm calls on one thread by
 * them, so other code on that thread (oneDNN, between calls) never sees ours, nor we its.
 */
#define _DEFAULT_SOURCE 1 /* syscall() under -std=c99 */
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "kernels_avx512.h" /* <immintrin.h> */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux (5.16+) grants the 8 KB tile data state per process on request: once, then kept. */
static int permit_amx(void)
{
    static volatile int state = 0; /* 0: not asked, 1: granted, -1: refused (a race asks twice) */
    if (state == 0) {
#if defined(__linux__) && defined(SYS_arch_prctl)
        state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
#else
        state = -1;
#endif
    }
    return state == 1;
}

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* A constant in memory: gcc's _tile_loadconfig tells the compiler it reads 8 bytes only, so a
   configuration built on the stack could lose its other stores. */
static _Alignas(64) const tile_config CONFIG = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

static void begin_amx(void) { _tile_loadconfig(&CONFIG); }

static void end_amx(void) { _tile_release(); }

/* Lanes [0, min(n, 16)) / [0, min(n, 32)): kernels_avx512.h's masks, clamped. */
static inline __mmask16 lanes(size_t n) { return mask16(n < 16 ? n : 16); }
static inline __mmask32 lanes32(size_t n) { return (__mmask32)mask64(n < 32 ? n : 32); }

/* 16 floats of src from column c (zeros past cols). */
static inline __m512 cols16(const float *src, size_t c, size_t cols)
{
    return _mm512_maskz_loadu_ps(c < cols ? lanes(cols - c) : 0, src + c);
}

static void pack_rows_amx(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                          size_t cols_pad, uint16_t *dst)
{
    for (size_t r = 0; r < rows_pad; r++) {
        uint16_t *d = dst + r * cols_pad;
        if (r >= rows) {
            memset(d, 0, cols_pad * sizeof(uint16_t));
            continue;
        }
        const float *s = src + r * lds;
        for (size_t c = 0; c < cols_pad; c += 32) {
            /* vcvtne2ps2bf16: the second operand's 16 values become the low 16 words */
            const __m512bh b = _mm512_cvtne2ps_pbh(cols16(s, c + 16, cols), cols16(s, c, cols));
            _mm512_mask_storeu_epi16(d + c, lanes32(cols_pad - c), (__m512i)b);
        }
    }
}

static void pack_pairs_amx(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                           size_t cols_pad, uint32_t *dst)
{
    /* words 0..15 of cvtne2ps(row 2p+1, row 2p) hold row 2p, words 16..31 row 2p + 1:
       interleave them into (2p, 2p+1) pairs per column */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (size_t p = 0; 2 * p < rows_pad; p++) {
        uint32_t *d = dst + p * cols_pad;
        const size_t r = 2 * p;
        if (r >= rows) {
            memset(d, 0, cols_pad * sizeof(uint32_t));
            continue;
        }
        const float *s0 = src + r * lds;
        const float *s1 = s0 + lds;
        const int two = r + 1 < rows;
        for (size_t c = 0; c < cols_pad; c += 16) {
            const __m512 hi = two ? cols16(s1, c, cols) : _mm512_setzero_ps();
            const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(hi, cols16(s0, c, cols));
            _mm512_mask_storeu_epi32(d + c, lanes(cols_pad - c), _mm512_permutexvar_epi16(pairs, b));
        }
    }
}

/* One block of up to 2 x 2 C tiles (32 x 32): tiles 0-3 accumulate, 4-5 hold A, 6-7 B. */
static inline void block_amx(size_t K, const uint16_t *A, size_t lda, const uint32_t *B, size_t ldb,
                             float *C, size_t ldc, int acc, int two_m, int two_n)
{
    const size_t sa = lda * sizeof(uint16_t), sb = ldb * sizeof(uint32_t), sc = ldc * sizeof(float);
    if (acc) {
        _tile_loadd(0, C, sc);
        if (two_n) _tile_loadd(1, C + 16, sc);
        if (two_m) _tile_loadd(2, C + 16 * ldc, sc);
        if (two_m && two_n) _tile_loadd(3, C + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    if (two_m && two_n) {
        for (size_t k = 0; k < K; k += 32) {
            const uint32_t *b = B + (k / 2) * ldb;
            _tile_loadd(4, A + k, sa);
            _tile_loadd(6, b, sb);
            _tile_loadd(7, b + 16, sb);
            _tile_loadd(5, A + 16 * lda + k, sa);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    } else {
        for (size_t k = 0; k < K; k += 32) {
            const uint32_t *b = B + (k / 2) * ldb;
            _tile_loadd(4, A + k, sa);
            _tile_loadd(6, b, sb);
            _tile_dpbf16ps(0, 4, 6);
            if (two_n) {
                _tile_loadd(7, b + 16, sb);
                _tile_dpbf16ps(1, 4, 7);
            }
            if (two_m) {
                _tile_loadd(5, A + 16 * lda + k, sa);
                _tile_dpbf16ps(2, 5, 6);
            }
        }
    }
    _tile_stored(0, C, sc);
    if (two_n) _tile_stored(1, C + 16, sc);
    if (two_m) _tile_stored(2, C + 16 * ldc, sc);
    if (two_m && two_n) _tile_stored(3, C + 16 * ldc + 16, sc);
}

/* Column panels of NP columns: a panel of B and a 32-row block of A stay in L1 (48 KB on
   Sapphire Rapids) while the block's row of C tiles is computed. */
#define NP 128

static void gemm_amx(size_t M, size_t N, size_t K, const uint16_t *A, size_t lda, const uint32_t *B,
                     size_t ldb, float *C, size_t ldc, int acc)
{
    for (size_t n0 = 0; n0 < N; n0 += NP) {
        const size_t n1 = n0 + NP < N ? n0 + NP : N;
        for (size_t m = 0; m < M; m += 32)
            for (size_t n = n0; n < n1; n += 32)
                block_amx(K, A + m * lda, lda, B + n, ldb, C + m * ldc + n, ldc, acc, m + 32 <= M,
                          n + 32 <= n1);
    }
}

/* exp(x - m) = 2^t, t = (x - m) log2(e): 2^f, f = t - rint(t) in [-1/2, 1/2], by a degree-4
   polynomial (relative error 2.7e-6, fitted to 2^f), times 2^rint(t) by vscalefps.  t's
   roundings (x - m, then the product) move the result by at most |x - m| 2^-24 relative, so
   below 2^-16 in all.  t < -125 (x - m < -86.6, -inf included) gives exactly 0, so no result
   is subnormal (each would cost a microcode assist: masked keys are -inf); NaN stays NaN
   (the compare is unordered-true and vmaxps returns its second operand, t, when it is NaN). */
static inline __m512 exp2_16(__m512 x, __m512 m)
{
    __m512 t = _mm512_mul_ps(_mm512_sub_ps(x, m), _mm512_set1_ps(1.44269504088896341f));
    const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    t = _mm512_max_ps(_mm512_set1_ps(-125.0f), t);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(0.009569965302944183f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05591750890016556f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240247443318367f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931218504905701f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999992847442627f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

static float exp_pack_amx(float *x, size_t n, size_t n_pad, float m, uint16_t *dst)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp2_16(_mm512_loadu_ps(x + i), vm);
        _mm512_storeu_ps(x + i, e);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), (__m256i)_mm512_cvtneps_pbh(e));
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        const __mmask16 k = lanes(n - i);
        const __m512 e = _mm512_maskz_mov_ps(k, exp2_16(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, e);
        _mm256_mask_storeu_epi16(dst + i, lanes(n_pad - i), (__m256i)_mm512_cvtneps_pbh(e));
        acc = _mm512_add_ps(acc, e);
        i += 16;
    }
    if (i < n_pad)
        memset(dst + i, 0, (n_pad - i) * sizeof(uint16_t));
    return _mm512_reduce_add_ps(acc);
}

const gqa_tiles gqa_tiles_amx = {"amx",          permit_amx,     begin_amx,    end_amx, pack_rows_amx,
                                 pack_pairs_amx, exp_pack_amx, gemm_amx};
