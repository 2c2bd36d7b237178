/*
 * emu_amx.h -- the AMX tile intrinsics the amx unit uses (kernels_amx.c, kernels_amxint8.c), as
 * portable code, for tests only (-DGQA_EMULATE_AMX, compiled WITHOUT -mamx-*): tests/isa's
 * emulation build (beside SIMDe's AVX-512: runs on any x86-64 with AVX2/FMA/F16C), and the
 * package built with GQA_EMULATE_AMX=1 (setup.py; the rest of the unit native AVX-512 and
 * AVX512-BF16).  Never part of a release build.
 *
 * State: one tile file per thread (eight tiles of at most 16 rows x 64 bytes, the palette-1
 * configuration), shared by every unit of the binary (a weak definition).  Each intrinsic
 * follows the Intel SDM's operation on that file:
 *   _tile_loadconfig   palette 0 releases; palette 1 takes rows / colsb per tile (at most 16 /
 *                      64, colsb a multiple of 4 where used by a dot); tiles zeroed.
 *   _tile_release      back to the initial state (palette 0, tiles zeroed).
 *   _tile_loadd        rows [0, rows) of colsb bytes each from base + r * stride (memcpy: the
 *                      bytes it reads are exactly the hardware's), the rest of the tile zeroed.
 *   _tile_stored       the same rows and bytes back to memory, nothing else written.
 *   _tile_zero         zeroes the tile.
 *   _tile_dpbf16ps     C[m][n] (float32) += sum over the K pairs of A[m][k] . B[k][n] (pairs of
 *                      bfloat16), in the SDM's order: two float32 FMA chains over k, the even and
 *                      the odd elements', with bfloat16 inputs' subnormals as zero and subnormal
 *                      results flushed, then their sum added to C (each a float32 rounding to
 *                      nearest even).  The hardware's internal order may differ: the driver's
 *                      checks of these tiles are exact only on integer operands, else bounds.
 *   _tile_dpbssd / _tile_dpbusd
 *                      C[m][n] (int32, wrapping) += sum over k of the four byte products of
 *                      A[m][k] and B[k][n], signed x signed / unsigned x signed: exact.
 * A use the hardware faults on (a tile or shape the configuration does not allow, palette 0)
 * aborts, so the emulation finds what a native run would fault on.
 */
#ifndef GQA_EMU_AMX_H
#define GQA_EMU_AMX_H
#ifndef GQA_EMULATE_AMX
#error "emu_amx.h is for the tests/isa emulation build only"
#endif
#if defined(__AMX_TILE__)
#error "the AMX emulation build must not be compiled with -mamx-*"
#endif
#include <math.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16_ref.h"

typedef struct {
    int palette;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} emu_tile_file;

__attribute__((weak)) __thread emu_tile_file gqa_emu_tiles;

static inline void emu_tile_need(int i) /* a tile the configuration can use */
{
    if (gqa_emu_tiles.palette != 1 || i < 0 || i > 7 || gqa_emu_tiles.rows[i] == 0 || gqa_emu_tiles.colsb[i] == 0)
        abort();
}

static inline void emu_tile_loadconfig(const void *p)
{
    const uint8_t *c = (const uint8_t *)p; /* palette, start_row, 14 reserved, colsb[16] (u16), rows[16] */
    memset(&gqa_emu_tiles, 0, sizeof gqa_emu_tiles);
    if (c[0] == 0)
        return;
    if (c[0] != 1 || c[1] != 0)
        abort();
    for (int i = 0; i < 8; i++) {
        uint16_t cb;
        memcpy(&cb, c + 16 + 2 * i, 2);
        const uint8_t r = c[48 + i];
        if (cb > 64 || r > 16 || (cb == 0) != (r == 0))
            abort();
        gqa_emu_tiles.colsb[i] = cb, gqa_emu_tiles.rows[i] = r;
    }
    gqa_emu_tiles.palette = 1;
}

static inline void emu_tile_release(void) { memset(&gqa_emu_tiles, 0, sizeof gqa_emu_tiles); }

static inline void emu_tile_loadd(int i, const void *base, long stride)
{
    emu_tile_need(i);
    memset(gqa_emu_tiles.t[i], 0, sizeof gqa_emu_tiles.t[i]);
    for (int r = 0; r < gqa_emu_tiles.rows[i]; r++)
        memcpy(gqa_emu_tiles.t[i][r], (const uint8_t *)base + (long)r * stride, gqa_emu_tiles.colsb[i]);
}

static inline void emu_tile_stored(int i, void *base, long stride)
{
    emu_tile_need(i);
    for (int r = 0; r < gqa_emu_tiles.rows[i]; r++)
        memcpy((uint8_t *)base + (long)r * stride, gqa_emu_tiles.t[i][r], gqa_emu_tiles.colsb[i]);
}

static inline void emu_tile_zero(int i)
{
    emu_tile_need(i);
    memset(gqa_emu_tiles.t[i], 0, sizeof gqa_emu_tiles.t[i]);
}

/* The shapes a dot needs (else #UD): C rows = A rows, A's 4-byte groups = B's rows, C and B
   the same bytes a row; returns K, the 4-byte groups of a row of A. */
static inline int emu_tile_shape(int c, int a, int b)
{
    emu_tile_need(c), emu_tile_need(a), emu_tile_need(b);
    const emu_tile_file *f = &gqa_emu_tiles;
    if (c == a || c == b || a == b || f->rows[c] != f->rows[a] || f->colsb[a] % 4 ||
        f->colsb[a] / 4 != f->rows[b] || f->colsb[c] != f->colsb[b] || f->colsb[c] % 4)
        abort();
    return f->colsb[a] / 4;
}

static inline void emu_tile_dpbf16ps(int c, int a, int b)
{
    const int K = emu_tile_shape(c, a, b), M = gqa_emu_tiles.rows[c], N = gqa_emu_tiles.colsb[c] / 4;
    uint16_t ra[16][32], rb[16][32];
    float fa[16][32], fb[16][32], d[16][16];
    /* the operands as floats once (the loops below then touch no memory the tests watch) */
    memcpy(ra, gqa_emu_tiles.t[a], sizeof ra);
    memcpy(rb, gqa_emu_tiles.t[b], sizeof rb);
    memcpy(d, gqa_emu_tiles.t[c], sizeof d);
    for (int r = 0; r < 16; r++)
        for (int e = 0; e < 32; e++)
            fa[r][e] = bf16_daz(ra[r][e]), fb[r][e] = bf16_daz(rb[r][e]);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < K; k++) {
                even = f32_ftz(fmaf(fa[m][2 * k], fb[k][2 * n], even));
                odd = f32_ftz(fmaf(fa[m][2 * k + 1], fb[k][2 * n + 1], odd));
            }
            d[m][n] = f32_ftz(f32_ftz(d[m][n] + even) + odd);
        }
    memcpy(gqa_emu_tiles.t[c], d, sizeof d);
}

/* sa / sb: whether A's / B's bytes are signed */
static inline void emu_tile_dpb(int c, int a, int b, int sa, int sb)
{
    const int K = emu_tile_shape(c, a, b), M = gqa_emu_tiles.rows[c], N = gqa_emu_tiles.colsb[c] / 4;
    int32_t xa[16][64], xb[16][64];
    uint32_t d[16][16];
    for (int r = 0; r < 16; r++)
        for (int e = 0; e < 64; e++) {
            const uint8_t x = gqa_emu_tiles.t[a][r][e], y = gqa_emu_tiles.t[b][r][e];
            xa[r][e] = sa ? (int32_t)(int8_t)x : (int32_t)x;
            xb[r][e] = sb ? (int32_t)(int8_t)y : (int32_t)y;
        }
    memcpy(d, gqa_emu_tiles.t[c], sizeof d);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            uint32_t acc = d[m][n]; /* int32 sums, wrapping like the hardware's */
            for (int k = 0; k < K; k++)
                for (int j = 0; j < 4; j++)
                    acc += (uint32_t)(xa[m][4 * k + j] * xb[k][4 * n + j]);
            d[m][n] = acc;
        }
    memcpy(gqa_emu_tiles.t[c], d, sizeof d);
}

/* (the compiler's headers define these as macros or target-specific inline functions) */
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbssd
#undef _tile_dpbusd
#define _tile_loadconfig(p) emu_tile_loadconfig(p)
#define _tile_release() emu_tile_release()
#define _tile_loadd(i, base, stride) emu_tile_loadd((i), (base), (long)(stride))
#define _tile_stored(i, base, stride) emu_tile_stored((i), (base), (long)(stride))
#define _tile_zero(i) emu_tile_zero(i)
#define _tile_dpbf16ps(c, a, b) emu_tile_dpbf16ps((c), (a), (b))
#define _tile_dpbssd(c, a, b) emu_tile_dpb((c), (a), (b), 1, 1)
#define _tile_dpbusd(c, a, b) emu_tile_dpb((c), (a), (b), 0, 1)

#endif
