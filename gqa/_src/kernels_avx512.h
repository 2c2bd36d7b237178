/*
 * kernels_avx512.h -- what the AVX-512 units (kernels_avx512.c, kernels_avx512vnni.c,
 * kernels_avx512bf16.c, kernels_amx.c) share: the intrinsics (<immintrin.h>, or SIMDe for the
 * emulation build of tests/isa: GQA_EMULATE_AVX512; the amx unit's tiles from
 * tests/isa/emu_amx.h in the tests' GQA_EMULATE_AMX builds), the ISA-free helpers, lane masks, the
 * 16-sum reduction tree and the 16 x 16 transpose.
 * Included only by units
 * compiled with the avx512 path's flags.
 */
#ifndef GQA_KERNELS_AVX512_H
#define GQA_KERNELS_AVX512_H

#ifdef GQA_EMULATE_AVX512
#include "emu_avx512.h" /* tests/isa only: SIMDe + shims, portable code */
#else
#include <immintrin.h>
#endif
#ifdef GQA_EMULATE_AMX
#include "emu_amx.h" /* tests only: the amx unit's tile intrinsics, portable code */
#endif
#include <float.h>
#include <stdlib.h>
#include "kernels_common.h"

/* The prefetch hint of level 4's decode kernels on the cache they stream (kernels_avx512vnni.c):
   into L2, not L1.  Those kernels run a few instructions per cache byte, so from DRAM (a model's
   layers in turn) they are bound by the misses in flight, and a prefetch into L1 holds one of
   L1's few miss buffers until its line arrives (Zen 4, perf: the time sat on the prefetcht0s).
   Zen 4, 2 threads, T = 8192, 48 layers' caches in turn, the shapes of bench --shape real:
   decode steps with it 1.13-1.36x faster on INT8 per tensor, 1.0-1.15x on INT4; from L3 level.
   Level 0's float kernels, bound by their arithmetic, measured 0.9-1.1x with it on codes and
   keep L1, except P @ V's prefetch of a key chunk too large for L1 beside the one being read
   (SV_L1_CHUNK in kernels_avx512.c) and the QK of float32 rows (FLOAT_QK_PF). */
#define STREAM_HINT _MM_HINT_T1

/* The QK kernels of float32 rows (level 0's in kernels_avx512.c, the bfloat16 ones in
   kernels_avx512bf16_dot.c) prefetch a block's rows this many bytes ahead, with STREAM_HINT: a
   decode step's float cache comes from DRAM (4 bytes an element), where a stream's rate is about
   the bytes in flight over the latency.  Zen 4, one thread, 8192 keys alone from DRAM (64 buffers
   in turn), against 4 KB into L1: level 0 at 2-8 rows 1.1-1.35x (1 row 1.0-1.15x), the bfloat16
   kernel 1.07-1.22x; from L3 1-2 rows 0.9-0.95x, the others level. */
#define FLOAT_QK_PF 8192

/* Lanes [0, n) set, n <= 16 / n <= 64. */
static inline __mmask16 mask16(size_t n) { return (__mmask16)((1u << n) - 1u); }
static inline __mmask64 mask64(size_t n) { return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1); }

/* sv_gemm's C[m, 0:N] = beta C[m, 0:N] for the M rows (row stride ldc) before the sums are
   added: beta == 0 writes zeros (NaN in C is ignored), beta == 1 leaves C. */
static inline void sv_scale_rows(size_t M, size_t N, float *C, size_t ldc, float beta)
{
    const __m512 vb = _mm512_set1_ps(beta);
    for (size_t m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (beta == 0.0f)
            memset(c, 0, N * sizeof(float));
        else if (beta != 1.0f)
            for (size_t n = 0; n < N; n += 16) {
                const __mmask16 mk = mask16(N - n < 16 ? N - n : 16);
                _mm512_mask_storeu_ps(c + n, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, c + n), vb));
            }
    }
}

/* Lane i of the result = horizontal sum of v[i] (i < 16), by the same tree for every
   slot: 128-bit quarters (Q0 + Q2) + (Q1 + Q3), then the 4 lanes (e0 + e1) + (e2 + e3).
   Each step merges two vectors a, b into one with one permute, one blend and one add
   (out[p] = src(p)[p] + src(p)[partner(p)], src(p) = a or b), so only 15 of the 45
   operations are shuffles (port 5 alone on AVX-512 cores).  The tree leaves v[4e + w(l)]
   in element 4l + e, w = (0 2 1 3); the inputs are taken in that order, so lane i of the
   result is the sum of in[i].  isint: the lanes are int32 (bit patterns in __m512), added
   exactly as integers; else float32. */
INLINE __m512 hsum16x16_add(const int isint, __m512 a, __m512 b)
{
    return isint ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))
                 : _mm512_add_ps(a, b);
}

INLINE __m512 hsum16x16_tree(const int isint, const __m512 in[16])
{
    __m512 v[16], s[8], t[4], r[2];
    UNROLL
    for (int k = 0; k < 16; k++) {
        const int l = (k & 3) == 1 ? 2 : (k & 3) == 2 ? 1 : (k & 3), e = k >> 2;
        v[k] = in[4 * l + e];
    }
    UNROLL
    for (int j = 0; j < 8; j++) /* lanes 0-7: v[2j] folded to 256 bits, 8-15: v[2j+1] */
        s[j] = hsum16x16_add(isint, _mm512_mask_blend_ps(0xFF00, v[2 * j], v[2 * j + 1]),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x4E));
    const __m512i q2 = _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
    UNROLL
    for (int j = 0; j < 4; j++) /* 128-bit lane l: v[4j + w(l)] folded to 128 bits */
        t[j] = hsum16x16_add(isint, _mm512_mask_blend_ps(0xF0F0, s[2 * j], s[2 * j + 1]),
                             _mm512_permutex2var_ps(s[2 * j], q2, s[2 * j + 1]));
    const __m512i e2 = _mm512_setr_epi32(1, 16, 3, 18, 5, 20, 7, 22, 9, 24, 11, 26, 13, 28, 15, 30);
    UNROLL
    for (int j = 0; j < 2; j++) /* per lane: e0 + e1 of t[2j], of t[2j+1], then e2 + e3 of each */
        r[j] = hsum16x16_add(isint, _mm512_mask_blend_ps(0xAAAA, t[2 * j], t[2 * j + 1]),
                             _mm512_permutex2var_ps(t[2 * j], e2, t[2 * j + 1]));
    return hsum16x16_add(isint, _mm512_mask_blend_ps(0xCCCC, r[0], r[1]), _mm512_shuffle_ps(r[0], r[1], 0x4E));
}

INLINE __m512 hsum16x16(const __m512 in[16]) { return hsum16x16_tree(0, in); }

INLINE __m512i hsum16x16_epi32(const __m512i in[16])
{
    __m512 f[16];
    UNROLL
    for (int i = 0; i < 16; i++)
        f[i] = _mm512_castsi512_ps(in[i]);
    return _mm512_castps_si512(hsum16x16_tree(1, f));
}

/* kr[t] = row n + t of B (rows of rb bytes) for the 16 lanes of a block of keys, of which nv
   are rows of B: a last partial block (nv < 16) repeats its last row (read, never stored). */
INLINE void rows16(const void *B, size_t n, size_t nv, size_t rb, const char *kr[16])
{
    UNROLL
    for (int t = 0; t < 16; t++)
        kr[t] = (const char *)B + (n + ((size_t)t < nv ? (size_t)t : nv - 1)) * rb;
}

/* 16 x 16 transpose of r[0..15] in place: 4 x 4 transposes inside each 128-bit
   lane (unpack, shuffle), then a 4 x 4 transpose of the 128-bit lanes. */
INLINE void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    UNROLL
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + c], 128-bit lane j: rows 4i .. 4i+3 of column 4j + c */
    UNROLL
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    UNROLL
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);      /* lanes 0, 2 of rows 0-3, 4-7 */
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);      /* lanes 1, 3 */
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88); /* rows 8-11, 12-15 */
        __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* The 32 bytes at p under byte mask m, 0 where m is clear (never touched). */
INLINE __m256i load32_masked(__mmask32 m, const void *p)
{
    return m == (__mmask32)~0u ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi8(m, p);
}

/* The bytes [0, nb) at p (nb <= 32 / nb <= 16), 0 past nb (never touched); the test on nb
   itself, not on its mask (kl_8's rows: a mask made per row load cost 1.03x). */
INLINE __m256i load_upto32(const char *p, size_t nb)
{
    return nb >= 32 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi8((__mmask32)mask64(nb), p);
}
INLINE __m128i load_upto16(const char *p, size_t nb)
{
    return nb >= 16 ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8((__mmask16)mask64(nb), p);
}

/* chunk16 (below) of at most 16 bytes: four rows a vector (rows 4 L + q in lane L of x[q]), 8
   shuffles. */
INLINE void chunk16_le16(const char *const *kr, size_t off, size_t nb, __m512 W[16])
{
    __m512i x[4], y[4];
    UNROLL
    for (int q = 0; q < 4; q++) { /* x[q] 128-bit lane L: row 4 L + q (immediate lanes: -O0 builds) */
        x[q] = _mm512_castsi128_si512(load_upto16(kr[q] + off, nb));
        x[q] = _mm512_inserti32x4(x[q], load_upto16(kr[4 + q] + off, nb), 1);
        x[q] = _mm512_inserti32x4(x[q], load_upto16(kr[8 + q] + off, nb), 2);
        x[q] = _mm512_inserti32x4(x[q], load_upto16(kr[12 + q] + off, nb), 3);
    }
    y[0] = _mm512_unpacklo_epi32(x[0], x[1]);
    y[1] = _mm512_unpackhi_epi32(x[0], x[1]);
    y[2] = _mm512_unpacklo_epi32(x[2], x[3]);
    y[3] = _mm512_unpackhi_epi32(x[2], x[3]);
    /* lane L element q of W[c]: x[q] lane L's dword c, row 4 L + q */
    W[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi64(y[0], y[2]));
    W[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi64(y[0], y[2]));
    W[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi64(y[1], y[3]));
    W[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi64(y[1], y[3]));
    UNROLL
    for (int i = 4; i < 16; i++) /* never read: zero idioms, for the compiler's flow analysis */
        W[i] = _mm512_setzero_ps();
}

/* chunk16 of at most 32 bytes: two rows a vector (rows a, a + 4), 24 shuffles. */
INLINE void chunk16_le32(const char *const *kr, size_t off, size_t nb, __m512 W[16])
{
    __m512i x[8], y[8], v[8];
    UNROLL
    for (int m = 0; m < 8; m++) { /* x[m]: rows a, a + 4 (a = m for m < 4, else m + 4) */
        const int a = m < 4 ? m : m + 4;
        x[m] = _mm512_inserti64x4(_mm512_castsi256_si512(load_upto32(kr[a] + off, nb)),
                                  load_upto32(kr[a + 4] + off, nb), 1);
    }
    UNROLL
    for (int p = 0; p < 4; p++) {
        y[2 * p] = _mm512_unpacklo_epi32(x[2 * p], x[2 * p + 1]);
        y[2 * p + 1] = _mm512_unpackhi_epi32(x[2 * p], x[2 * p + 1]);
    }
    /* v[2 c + g] lane L element q: x[4 g + q] dword 4 L + c */
    UNROLL
    for (int g = 0; g < 2; g++) {
        v[g] = _mm512_unpacklo_epi64(y[4 * g], y[4 * g + 2]);
        v[2 + g] = _mm512_unpackhi_epi64(y[4 * g], y[4 * g + 2]);
        v[4 + g] = _mm512_unpacklo_epi64(y[4 * g + 1], y[4 * g + 3]);
        v[6 + g] = _mm512_unpackhi_epi64(y[4 * g + 1], y[4 * g + 3]);
    }
    /* W[4 h + c]: lanes h, 2 + h of v[2 c] (rows 0-3, 4-7) and of v[2 c + 1] (rows 8-11, 12-15) */
    UNROLL
    for (int c = 0; c < 4; c++) {
        W[c] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v[2 * c], v[2 * c + 1], 0x88));
        W[4 + c] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(v[2 * c], v[2 * c + 1], 0xDD));
    }
    UNROLL
    for (int i = 8; i < 16; i++)
        W[i] = _mm512_setzero_ps();
}

/* chunk16 by sixteen row loads and the whole 16 x 16 transpose, any nb (every W[i] set). */
INLINE void chunk16_rows(const char *const *kr, size_t off, size_t nb, size_t pf, __m512 W[16])
{
    if (nb >= 64) {
        UNROLL
        for (int t = 0; t < 16; t++) {
            if (pf)
                _mm_prefetch(kr[t] + off + pf, STREAM_HINT);
            W[t] = _mm512_castsi512_ps(_mm512_loadu_si512((const void *)(kr[t] + off)));
        }
    } else {
        const __mmask64 m = mask64(nb);
        UNROLL
        for (int t = 0; t < 16; t++)
            W[t] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(m, kr[t] + off));
    }
    transpose16(W);
}

/* W[i] lane t = dword i of the nb <= 64 bytes at kr[t] + off (bytes past nb read as 0, never
   touched), for i < (nb + 3) / 4 (W[i] past that: 0 or the next dwords): sixteen rows' chunks,
   transposed so that each lane holds one row.  Where pf > 0, a whole chunk, and one of at most
   32 bytes that starts a 64-byte line, also prefetches each row's line pf bytes ahead into L2
   (STREAM_HINT; prefetches never fault; a whole chunk's between its loads: 2-5 % faster than a
   loop of their own).
   Chunks of at most 32 / 16 bytes take chunk16_le32 / _le16: 24 / 8 shuffles instead of 64
   (Zen 4, alone: 2.3-3x faster). */
INLINE void chunk16(const char *const *kr, size_t off, size_t nb, size_t pf, __m512 W[16])
{
    if (pf && nb <= 32 && off % 64 == 0)
        UNROLL
        for (int t = 0; t < 16; t++)
            _mm_prefetch(kr[t] + off + pf, STREAM_HINT);
    if (nb <= 16)
        chunk16_le16(kr, off, nb, W);
    else if (nb <= 32)
        chunk16_le32(kr, off, nb, W);
    else
        chunk16_rows(kr, off, nb, pf, W);
}

#if defined(__AVX512VNNI__) || defined(GQA_EMULATE_AVX512)
#include "kernels_s8dot_contract.h"

#define VNNI_QB (DOT_QK_K + 128) /* bytes of a query row's byte halves: K codes and a chunk's pad */

/* The byte halves of a query row's codes c[0, n) (n <= DOT_QK_K): code = 256 hi + lo, hi =
   (code + 128) >> 8 (both in [-127, 127]: |code| <= QK_CODE_MAX = 127 * 257), into hi / lo
   [0, VNNI_QB), 0 past n, each code k at the place its key codes' dword gives it: with `per`
   codes a byte (1, 2 or 4) a dword holds 4 per codes, the byte set of bits (8 / per) j first
   (elements per b + j of its bytes b, j < per). */
static inline void vnni_code_bytes(const int16_t *c, size_t n, int per, int8_t *hi, int8_t *lo)
{
    /* 32 codes a step (the dword sets lie within 8 / 16 codes): the byte halves in code order,
       then per 2 / 4 reordered within each 16 bytes: out[j] = in[pattern[j]] */
    const __m256i order = per == 1 ? _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3,
                                                      4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : per == 2 ? _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4,
                                                        6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
                                     : _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8,
                                                        12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (size_t k = 0; k < n; k += 32) {
        const __mmask32 m = (__mmask32)mask64(n - k); /* n past a multiple of 32: 0 codes past it */
        const __m512i v = _mm512_maskz_loadu_epi16(m, c + k);
        const __m512i h = _mm512_srai_epi16(_mm512_add_epi16(v, _mm512_set1_epi16(128)), 8);
        const __m512i l = _mm512_sub_epi16(v, _mm512_slli_epi16(h, 8));
        _mm256_storeu_si256((__m256i *)(hi + k), _mm256_shuffle_epi8(_mm512_cvtepi16_epi8(h), order));
        _mm256_storeu_si256((__m256i *)(lo + k), _mm256_shuffle_epi8(_mm512_cvtepi16_epi8(l), order));
    }
    const size_t n32 = (n + 31) & ~(size_t)31;
    memset(hi + n32, 0, VNNI_QB - n32);
    memset(lo + n32, 0, VNNI_QB - n32);
}

/* The VNNI units' dots with a 4-byte operand at p in every lane, the broadcast folded into the
   instruction ({1to16}: GCC 12 issues a separate vpbroadcastd for the intrinsics' form, one more
   vector op per dot); the intrinsics under the tests' emulation build.
   vnni_dpbusd_b: acc + u (unsigned bytes) . the 4 signed bytes at p, per dword;
   vnni_dpwssd_b: acc + u (int16 pairs) . the int16 pair at p, per dword. */
INLINE __m512i vnni_dpbusd_b(__m512i acc, __m512i u, const void *p)
{
#if defined(GQA_EMULATE_AVX512)
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(v));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
#endif
}

INLINE __m512i vnni_dpwssd_b(__m512i acc, __m512i u, const void *p)
{
#if defined(GQA_EMULATE_AVX512)
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpwssd_epi32(acc, u, _mm512_set1_epi32(v));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
#endif
}
#endif

#endif
