/*
 * kernels_common.h -- scalar building blocks shared by every path's TU:
 * the exact quantizer, nibble access, binary16 conversion and the scalar
 * element decoder (and DOT_KEEP, the integer-dot loops' register pin).
 * Everything is `static inline` so that each TU keeps its own copy
 * compiled under its own flags; none of it contains an addition
 * that could be contracted into an FMA, so the quantized codes are identical
 * whichever TU computes them.
 */
#ifndef GQA_KERNELS_COMMON_H
#define GQA_KERNELS_COMMON_H

#include <math.h>
#include <string.h>
#include "gqa_kernels.h"

/* Forced inlining, and the unrolling of the loops over a register block before register
   allocation so that accumulator arrays live in registers (the emulated AVX-512 build of
   tests/isa skips it: the same arithmetic, a third of the compile time). */
#define INLINE static inline __attribute__((always_inline))
#ifdef GQA_EMULATE_AVX512
#define UNROLL
#else
#define UNROLL _Pragma("GCC unroll 32")
#endif

/* Keeps a loop-carried accumulator in one register across a step of the integer-dot QK loops (an
   empty asm, no instruction).  Without it GCC 12 gives a step's sums new registers and copies
   them back: the AVX2 INT8 qk_3x4 inner loop was 52 instructions, 16 of them vmovdqa, and is 39
   with 3; the AVX-512 VNNI QK loop of 4 rows (dot_block then) had 30 zmm copies and a spill for 16
   vpdpwssd.  The P @ V blocks keep their sums without it (there it adds copies).  None in the
   emulated builds of tests/isa, whose vectors are SIMDe's structures. */
#if defined(GQA_EMULATE_AVX512)
#define DOT_KEEP(v) ((void)0)
#elif defined(__AVX512F__)
#define DOT_KEEP(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(_M_X64)
#define DOT_KEEP(v) __asm__("" : "+x"(v))
#else
#define DOT_KEEP(v) ((void)0)
#endif

#define GQA_IS_S4(t) ((t) == GQA_S4_PT || (t) == GQA_S4_PC)
#define GQA_IS_PC(t) ((t) == GQA_S8_PC || (t) == GQA_S4_PC)
#define GQA_IS_QUANT(t) ((t) <= GQA_S4_PC)

/* The scale a SIMD path applies after accumulation: per-tensor codes carry s[0], the others
   (per channel: folded into A or applied per column; floats) 1. */
static inline float gqa_post_scale(int type, const float *s)
{
    return (type == GQA_S8_PT || type == GQA_S4_PT) ? s[0] : 1.0f;
}

/* P @ V's prefetch of the next key chunk (decode streams V from memory) for rows of packed
   `bits`-bit elements (codes 8 or 4, float32 32): the block of columns [n0, n0 + w) of a row prefetches the 64-byte
   lines of the row (counted from its first byte) that start inside the block's bytes, so that
   blocks of any widths together prefetch each line of the row once.  -> the number of those
   lines; *first: the offset of the first in the row. */
static inline int gqa_block_lines(size_t bits, size_t n0, size_t w, size_t *first)
{
    const size_t b0 = (n0 * bits + 7) / 8, b1 = ((n0 + w) * bits + 7) / 8;
    *first = (b0 + 63) & ~(size_t)63;
    return *first < b1 ? (int)((b1 - *first + 63) / 64) : 0;
}

/* The element of a static or float row as the SIMD GEMMs read it, unscaled (gqa_element):
   int8 codes, +8-biased nibbles, float32 or binary16.  (GQA_KIND is the group kind.) */
#define GQA_EL_S8 0
#define GQA_EL_S4 1
#define GQA_EL_F32 2
#define GQA_EL_F16 3

/* Rows of A per block of a GEMM: at most maxb, as even as possible (M = 9, maxb 8 -> 5 + 4). */
static inline size_t gqa_row_block(size_t M, size_t maxb)
{
    const size_t nblk = (M + maxb - 1) / maxb;
    return (M + nblk - 1) / nblk;
}

/* Bits of an element (gqa_block_lines' `bits`). */
static inline size_t gqa_element_bits(int elem)
{
    return elem == GQA_EL_S4 ? 4 : elem == GQA_EL_F32 ? 32 : elem == GQA_EL_F16 ? 16 : 8;
}

/* Whether P @ V's blocks of columns prefetch the next key chunk (gqa_block_lines) in a call of
   N columns whose widest block is `widest` columns: codes always; float32 rows when a row takes
   several blocks, which read it in strided passes, not where one block reads each row whole and
   the hardware's stream prefetch already runs ahead (Zen 4, one thread, 8192 keys from DRAM:
   8 x 256 2.2-3.2x, 1-4 x 256 1.6-2.4x; 2 x 128 and 3 x 64 with it 0.8-0.9x). */
static inline int gqa_sv_prefetches(int elem, size_t N, size_t widest)
{
    return elem <= GQA_EL_S4 || (elem == GQA_EL_F32 && N > widest);
}

/* max(m, x[0], ..., x[n-1]) with x > m ? x : m, so NaN is skipped: the scalar statement of
   row_max, and every path's tail. */
static inline float gqa_max_of(const float *x, size_t n, float m)
{
    for (size_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* The 16 x 16 Sylvester matrix, sy[l][k] = (-1)^popcount(l & k), 32-byte aligned rows: the `+had`
   rotation's block (gqa_hadamard_rows and the vector units' versions of it). */
static inline const float (*gqa_sylvester16(void))[16]
{
    static const float sy[16][16] __attribute__((aligned(32))) = {
        { 1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f},
        { 1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f},
        { 1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f},
        { 1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f},
        { 1.f,  1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f},
        { 1.f, -1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f},
        { 1.f,  1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f},
        { 1.f, -1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f},
        { 1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f},
        { 1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f},
        { 1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f},
        { 1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f},
        { 1.f,  1.f,  1.f,  1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f,  1.f,  1.f},
        { 1.f, -1.f,  1.f, -1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f,  1.f, -1.f},
        { 1.f,  1.f, -1.f, -1.f, -1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f,  1.f,  1.f, -1.f, -1.f},
        { 1.f, -1.f, -1.f,  1.f, -1.f,  1.f,  1.f, -1.f, -1.f,  1.f,  1.f, -1.f,  1.f, -1.f, -1.f,  1.f}};
    return sy;
}

/* rev[i] = i with its log2(H) bits reversed, i < H (H a power of two up to GQA_ROT_MAX): the
   `+had` rotation's permutation P. */
static inline void gqa_bit_reversal(size_t H, int32_t *rev)
{
    size_t bits = 0;
    while (((size_t)1 << bits) < H)
        bits++;
    rev[0] = 0;
    for (size_t i = 1; i < H; i++)
        rev[i] = (rev[i >> 1] >> 1) | (int32_t)((i & 1) << (bits - 1));
}

/* The `+had` rotation (gqa/_rotation.py: oscar_rotation(None, H), scaled): R = c Sy P, Sy the
   H x H Sylvester matrix of +-1 (Sy[d, e] = (-1)^popcount(d & e)), P the bit-reversal
   permutation ((X P)[:, rev(i)] = X[:, i]), H a power of two up to GQA_ROT_MAX.
   n rows x [H] (ldx floats apart) -> o [n, H] (ldo apart; o must not overlap x):
   inverse == 0: o = x R, i.e. o[rev(i)] = c (x Sy)[i];  inverse != 0: o = x R^T = c (x P^T) Sy,
   i.e. o = c ((x[rev(i)])_i Sy).
   x Sy in this order, the same on every path: each block of B = min(H, 16) columns times the
   B x B Sylvester matrix, each output the sum over the block's inputs in order (the first
   product exact, then one addition each: +-1 products are exact, so a fused multiply-add gives
   the same bits), then the butterflies (a, b) -> (a + b, a - b) at the distances B, 2B, ...,
   H / 2 in turn, then one multiplication by c: to first order |o_e - (x R)_e| <= (B +
   log2(H / B)) 2^-24 c sum_d |x_d|.  O(H (B + log2 H)) operations per row, not H^2. */
static inline void gqa_hadamard_rows(size_t n, size_t H, const float *x, size_t ldx, float *o,
                                     size_t ldo, float c, int inverse)
{
    const float (*sy)[16] = gqa_sylvester16();
    float w[GQA_ROT_MAX], in[GQA_ROT_MAX];
    int32_t rev[GQA_ROT_MAX];
    size_t B = H < 16 ? H : 16, i, l, k, h, j, r;
    gqa_bit_reversal(H, rev);
    for (r = 0; r < n; r++) {
        const float *xr = x + r * ldx;
        float *orow = o + r * ldo;
        if (inverse) {
            for (i = 0; i < H; i++)
                in[i] = xr[rev[i]];
            xr = in;
        }
        if (B == 16) {      /* the block's 16 sums in registers */
            for (i = 0; i < H; i += 16) {
                float acc[16];
                UNROLL for (k = 0; k < 16; k++)
                    acc[k] = xr[i] * sy[0][k];
                UNROLL for (l = 1; l < 16; l++) {
                    const float xl = xr[i + l];
                    UNROLL for (k = 0; k < 16; k++)
                        acc[k] += xl * sy[l][k];
                }
                UNROLL for (k = 0; k < 16; k++)
                    w[i + k] = acc[k];
            }
        } else {
            for (k = 0; k < B; k++)
                w[k] = xr[0] * sy[0][k];
            for (l = 1; l < B; l++)
                for (k = 0; k < B; k++)
                    w[k] += xr[l] * sy[l][k];
        }
        for (h = B; h < H; h <<= 1)
            for (i = 0; i < H; i += 2 * h)
                for (j = i; j < i + h; j++) {
                    const float a = w[j], b = w[j + h];
                    w[j] = a + b;
                    w[j + h] = a - b;
                }
        if (inverse)
            for (i = 0; i < H; i++)
                orow[i] = c * w[i];
        else /* o[rev(i)] = c w[i]: rev is its own inverse, so a gather */
            for (i = 0; i < H; i++)
                orow[i] = c * w[rev[i]];
    }
}

/* A vector unit's `+had` blocks of one row (kernels_avx2_hadamard.h, kernels_neon.c): blocks(NB, xr,
   ix, w, i0, sy) sums NB blocks of 16 from column i0 and their butterflies among them, inputs
   xr[e] (ix NULL) or xr[ix[e]]; NB and ix literal in each call so that the unit's register arrays
   and loads specialize: H = 16 one block, 32 two, else four at a time; inverse: ix = rev. */
#define GQA_HAD_ROW_BLOCKS(blocks, H, xr, rev, inverse, w, sy)                                      \
    do {                                                                                          \
        if ((H) == 16)                                                                            \
            (inverse) ? blocks(1, xr, rev, w, 0, sy) : blocks(1, xr, NULL, w, 0, sy);             \
        else if ((H) == 32)                                                                       \
            (inverse) ? blocks(2, xr, rev, w, 0, sy) : blocks(2, xr, NULL, w, 0, sy);             \
        else if (inverse)                                                                         \
            for (size_t i0_ = 0; i0_ < (H); i0_ += 64)                                            \
                blocks(4, xr, rev, w, i0_, sy);                                                   \
        else                                                                                      \
            for (size_t i0_ = 0; i0_ < (H); i0_ += 64)                                            \
                blocks(4, xr, NULL, w, i0_, sy);                                                  \
    } while (0)

/* gqa_kernels.rope_row's statement for pairs [i0, r2) of a row (a path's table entry, or the
   pairs its vectors leave).  fmaf is the fused operation on every compiler this builds with (an
   FMA instruction where the unit's flags have one, libm's correctly rounded fmaf elsewhere). */
static inline void gqa_rope_pairs(size_t i0, size_t r2, int interleaved, const float *x, const float *c,
                                  const float *s, float *o)
{
    const size_t step = interleaved ? 1 : r2; /* x1's distance from x0 */
    for (size_t i = i0; i < r2; i++) {
        const size_t e = interleaved ? 2 * i : i;
        const float x0 = x[e], x1 = x[e + step];
        o[e] = fmaf(x0, c[i], -(x1 * s[i]));
        o[e + step] = fmaf(x0, s[i], x1 * c[i]);
    }
}

/* A path's kernel table: every operation named <op>_<path>, and the integer-dot kernels
   (or NULL): onnxruntime's approximate QK, level 4's QK and SV; the path's tiles (or NULL). */
#define GQA_KERNEL_TABLE(path, approx_qk, dot_qk, dot_sv, tiles) GQA_KERNEL_TABLE_AS(path, path, approx_qk, dot_qk, dot_sv, tiles)
/* A table named `unit` (gqa_kernels_<unit>) with path `path`'s kernels and its own level-4 entries. */
#define GQA_KERNEL_TABLE_AS(unit, path, approx_qk, dot_qk, dot_sv, tiles)                       \
    const gqa_kernels gqa_kernels_##unit = {#unit, quantize_##path, dequantize_##path,          \
                                            dequantize_t_##path, qk_gemm_##path, sv_gemm_##path, \
                                            approx_qk, dot_qk, dot_sv, exp_sum_##path,           \
                                            row_max_##path, hadamard_rows_##path, rope_row_##path, tiles};

/* dequantize_<path> of a path whose row decoder dequant_row(row, d, cols, type, s) is
   specialized on a constant type: one instance per static or float type in deq_rows[type]
   (also the path's own table), the group types to group_dequantize_<path> (GQA_GROUP_OPS). */
#define GQA_DEQ_ROW(T)                                                                          \
    static void deq_row_##T(const uint8_t *row, float *d, size_t cols, const float *s)          \
    { dequant_row(row, d, cols, T, s); }
typedef void (*gqa_deq_row_fn)(const uint8_t *, float *, size_t, const float *);
#define GQA_DEQUANTIZE_BY_TYPE(path)                                                            \
    GQA_DEQ_ROW(GQA_S8_PT) GQA_DEQ_ROW(GQA_S8_PC) GQA_DEQ_ROW(GQA_S4_PT) GQA_DEQ_ROW(GQA_S4_PC) \
    GQA_DEQ_ROW(GQA_F32) GQA_DEQ_ROW(GQA_F16)                                                   \
    static const gqa_deq_row_fn deq_rows[6] = {deq_row_GQA_S8_PT, deq_row_GQA_S8_PC,            \
                                               deq_row_GQA_S4_PT, deq_row_GQA_S4_PC,            \
                                               deq_row_GQA_F32, deq_row_GQA_F16};               \
    static void dequantize_##path(const void *src, float *dst, size_t ldd, size_t rows,          \
                                  size_t cols, int type, const float *s)                        \
    {                                                                                           \
        if (GQA_IS_GROUP(type)) { group_dequantize_##path(src, dst, ldd, rows, cols, type); return; } \
        const size_t rb = gqa_row_bytes(type, cols);                                            \
        for (size_t r = 0; r < rows; r++)                                                       \
            deq_rows[type]((const uint8_t *)src + r * rb, dst + r * ldd, cols, s);              \
    }

static inline int gqa_element(int type)
{
    return type <= GQA_S8_PC ? GQA_EL_S8 : type <= GQA_S4_PC ? GQA_EL_S4
         : type == GQA_F32 ? GQA_EL_F32 : GQA_EL_F16;
}

/* Multiplier used when quantizing: 1/s in float32, 1 when s == 0. */
static inline float gqa_inv_scale(float s)
{
    return s == 0.0f ? 1.0f : 1.0f / s;
}

/* clamp(rint(x * inv), lo, hi) with NaN -> hi; rint rounds half to even. */
static inline int gqa_quant_code(float x, float inv, float lo, float hi)
{
    float q = rintf(x * inv);
    q = (q < hi) ? q : hi; /* NaN fails the compare -> hi */
    q = (q > lo) ? q : lo;
    return (int)q;
}

static inline uint16_t gqa_f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520 -> inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* subnormal half or zero */
        if (absx < 0x33000000u) /* below half of the smallest subnormal */
            return (uint16_t)sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) ... gives shift in [14, 24] */
        uint32_t h = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

static inline float gqa_h2f(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) { m <<= 1; e--; }
            m &= 0x3ffu;
            x = sign | (e << 23) | (m << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Element k of a packed row, dequantized (scales: 1 float for PT, per column for PC). */
static inline float gqa_decode(const uint8_t *row, size_t k, int type, const float *s)
{
    switch (type) {
    case GQA_S8_PT: return (float)(int8_t)row[k] * s[0];
    case GQA_S8_PC: return (float)(int8_t)row[k] * s[k];
    case GQA_S4_PT:
    case GQA_S4_PC: {
        int nib = (k & 1) ? (row[k >> 1] >> 4) : (row[k >> 1] & 0xF);
        return (float)(nib - 8) * (type == GQA_S4_PT ? s[0] : s[k]);
    }
    case GQA_F32: { float f; memcpy(&f, row + 4 * k, 4); return f; }
    default: { uint16_t h; memcpy(&h, row + 2 * k, 2); return gqa_h2f(h); }
    }
}

/* exp(x) for the softmax kernels (every SIMD path, so they agree bit for bit):
   exactly 0 below the float32 underflow knee; d = n ln2 + r with ln2 split in two,
   exp(r) = 1 + r + r^2 (P5 + r (P4 + ... r P0)) (Cephes expf coefficients, ~1 ulp). */
#define GQA_EXP_MIN (-87.3f)
#define GQA_EXP_MAX 88.3f
#define GQA_EXP_LOG2E 1.44269504088896341f
#define GQA_EXP_LN2_HI 0.693359375f
#define GQA_EXP_LN2_LO (-2.12194440e-4f)
#define GQA_EXP_P0 1.9875691500e-4f
#define GQA_EXP_P1 1.3981999507e-3f
#define GQA_EXP_P2 8.3334519073e-3f
#define GQA_EXP_P3 4.1665795894e-2f
#define GQA_EXP_P4 1.6666665459e-1f
#define GQA_EXP_P5 5.0000001201e-1f

/* One row of the exact quantizer (also the tail of the SIMD quantizers). */
static inline void gqa_quantize_row_ref(const float *x, uint8_t *dst, size_t c0,
                                        size_t cols, int type, const float *s)
{
    size_t c;
    switch (type) {
    case GQA_S8_PT: case GQA_S8_PC:
        for (c = c0; c < cols; c++) {
            float inv = gqa_inv_scale(type == GQA_S8_PT ? s[0] : s[c]);
            dst[c] = (uint8_t)(int8_t)gqa_quant_code(x[c], inv, -128.0f, 127.0f);
        }
        break;
    case GQA_S4_PT: case GQA_S4_PC:
        for (c = c0; c < cols; c += 2) { /* c0 is even */
            float inv0 = gqa_inv_scale(type == GQA_S4_PT ? s[0] : s[c]);
            int lo = gqa_quant_code(x[c], inv0, -8.0f, 7.0f) + 8, hi = 8;
            if (c + 1 < cols) {
                float inv1 = gqa_inv_scale(type == GQA_S4_PT ? s[0] : s[c + 1]);
                hi = gqa_quant_code(x[c + 1], inv1, -8.0f, 7.0f) + 8;
            }
            dst[c >> 1] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
        }
        break;
    case GQA_F32:
        memcpy(dst + 4 * c0, x + c0, 4 * (cols - c0));
        break;
    default:
        for (c = c0; c < cols; c++) {
            uint16_t h = gqa_f2h(x[c]);
            memcpy(dst + 2 * c, &h, 2);
        }
    }
}

#endif
