/*
 * kernels_amx.c -- AMX BF16 tiles for the flash prompt tiles at accuracy level >= 3
 * (gqa_tiles in gqa_kernels.h): bfloat16 operands, float32 products and sums; the table also
 * holds level 4's INT8 dots (kernels_amxint8.c) and the tile state both use.
 * ISA flags: the avx512 path's plus -mamx-tile -mamx-bf16 -mamx-int8 -mavx512bf16 (the amx unit
 * of the avx512 path, with kernels_amxint8.c; first of its table's `tiles`).  dispatch.c hands
 * the table out only where CPUID has AMX-TILE, AMX-BF16, AMX-INT8 and AVX512-BF16, XCR0 enables
 * the tile state and the kernel grants it (permit).
 *
 * Operand layouts, the packing and exp_pack: kernels_avx512bf16.c's (rows A, pairs B); gemm
 * C[M, N] = (acc ? C : 0) + A[M, K] B[K, N], M and N multiples of 16, K of 32, in 2 x 2 blocks
 * of 16 x 16 C tiles.  tdpbf16ps takes subnormal bfloat16 inputs as zero and sums each pair of
 * exact products into the float32 accumulator (round to nearest even, subnormal results
 * flushed to zero).
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
#if defined(GQA_EMULATE_AMX)
        state = 1; /* the tests' emulated tiles (tests/isa/emu_amx.h): no tile state to grant */
#elif defined(__linux__) && defined(SYS_arch_prctl)
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

/* The packing and the softmax exp: kernels_avx512bf16.c's (the same layouts). */
void gqa_pack_rows_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                              size_t rows_pad, size_t cols_pad, uint16_t *dst);
void gqa_pack_pairs_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                               size_t rows_pad, size_t cols_pad, uint32_t *dst);
void gqa_pack_pairs_t_avx512bf16(const float *src, size_t lds, size_t rows, size_t cols,
                                 size_t rows_pad, size_t cols_pad, uint32_t *dst);
float gqa_exp_pack_avx512bf16(float *x, size_t n, size_t n_pad, float m, uint16_t *dst, int store);
/* Level 4's integer dots on the INT8 tiles: kernels_amxint8.c. */
void gqa_qk_gemm_s8_dot_amx(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                            const void *B, int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_s8_dot_amx(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                            const float *s, float *C, size_t ldc, float beta);

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

const gqa_tiles gqa_tiles_amx = {"amx",
                                 GQA_CPU_AMX | GQA_CPU_AVX512BF16,
                                 512, /* Sapphire Rapids: S = 2048, 5 % faster than 256 (K / V packed half as often) */
                                 0,   /* steps of few rows: not timed against the decode kernels here */
                                 permit_amx,
                                 begin_amx,
                                 end_amx,
                                 gqa_pack_rows_avx512bf16,
                                 gqa_pack_pairs_avx512bf16,
                                 gqa_pack_pairs_t_avx512bf16,
                                 gqa_exp_pack_avx512bf16,
                                 gemm_amx,
                                 gqa_qk_gemm_s8_dot_amx,
                                 gqa_sv_gemm_s8_dot_amx,
                                 /* float rows' decode: float32 (AVX-512 BF16 dot products, 1.2x
                                    FP32 FMA on Sapphire Rapids, not timed against it) */
                                 NULL,
                                 NULL};
