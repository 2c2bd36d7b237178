/*
 * emu_avx512.h -- AVX-512 intrinsics as portable code, for the emulation
 * build of kernels_avx512.c only (tests/isa, -DGQA_EMULATE_AVX512, compiled
 * WITHOUT -mavx512*: the result runs on any x86-64 with AVX2/FMA/F16C, e.g.
 * AMD Zen 3).  Never part of the package build.
 *
 * SIMDe (Debian libsimde-dev 0.7.4) supplies most intrinsics under their
 * native names (SIMDE_ENABLE_NATIVE_ALIASES).  The ones it lacks are defined
 * below, lane by lane, as macros that shadow the compiler's own declarations
 * (an intrinsic missing from both would resolve to the compiler's AVX-512
 * version and fail to compile -- never silently use the hardware).  Masked
 * loads touch only the selected lanes, like the hardware's fault suppression.
 * The *_round_ps shims support round-to-nearest only (all the kernel uses).
 */
#ifndef GQA_EMU_AVX512_H
#define GQA_EMU_AVX512_H
#ifndef GQA_EMULATE_AVX512
#error "emu_avx512.h is for the tests/isa emulation build only"
#endif
#if defined(__AVX512F__)
#error "the emulation build must not be compiled with -mavx512*"
#endif

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "bf16_ref.h"

#define EMU static inline

/* lane access through memcpy (the vector types are plain 16/32/64-byte objects) */
#define EMU_TO(arr, v) memcpy((arr), &(v), sizeof(v))
#define EMU_FROM(v, arr) memcpy(&(v), (arr), sizeof(v))

EMU __m512i emu_mm512_cvtps_epi32(__m512 a) /* rounding: nearest (MXCSR default) */
{
    float f[16];
    int32_t r[16];
    __m512i v;
    EMU_TO(f, a);
    for (int i = 0; i < 16; i++)
        r[i] = (f[i] != f[i] || fabsf(f[i]) >= 2147483648.0f) ? INT32_MIN : (int32_t)nearbyintf(f[i]);
    EMU_FROM(v, r);
    return v;
}

EMU __m512i emu_mm512_cvtps_epu32(__m512 a) /* inputs in [0, 2^32) */
{
    float f[16];
    uint32_t r[16];
    __m512i v;
    EMU_TO(f, a);
    for (int i = 0; i < 16; i++)
        r[i] = (f[i] != f[i] || f[i] < 0.0f || f[i] >= 4294967296.0f) ? UINT32_MAX : (uint32_t)nearbyintf(f[i]);
    EMU_FROM(v, r);
    return v;
}

EMU __m512 emu_mm512_cvtepi32_ps(__m512i a)
{
    int32_t x[16];
    float r[16];
    __m512 v;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        r[i] = (float)x[i];
    EMU_FROM(v, r);
    return v;
}

EMU __m512i emu_mm512_cvtepi8_epi32(__m128i a)
{
    int8_t x[16];
    int32_t r[16];
    __m512i v;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        r[i] = x[i];
    EMU_FROM(v, r);
    return v;
}

EMU __m512i emu_mm512_cvtepu8_epi32(__m128i a)
{
    uint8_t x[16];
    int32_t r[16];
    __m512i v;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        r[i] = x[i];
    EMU_FROM(v, r);
    return v;
}

EMU __m512i emu_mm512_cvtepu8_epi16(__m256i a)
{
    uint8_t x[32];
    int16_t r[32];
    __m512i v;
    EMU_TO(x, a);
    for (int i = 0; i < 32; i++)
        r[i] = x[i];
    EMU_FROM(v, r);
    return v;
}

EMU __m256i emu_mm512_cvtepi32_epi16(__m512i a) /* vpmovdw: truncation */
{
    int32_t x[16];
    int16_t r[16];
    __m256i v;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        r[i] = (int16_t)(uint16_t)(uint32_t)x[i];
    EMU_FROM(v, r);
    return v;
}

EMU void emu_mm512_mask_cvtsepi32_storeu_epi8(void *p, __mmask16 k, __m512i a)
{
    int32_t x[16];
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) {
            int8_t b = (int8_t)(x[i] < -128 ? -128 : x[i] > 127 ? 127 : x[i]);
            memcpy((char *)p + i, &b, 1);
        }
}

EMU void emu_mm512_mask_cvtepi64_storeu_epi8(void *p, __mmask8 k, __m512i a)
{
    uint64_t x[8];
    EMU_TO(x, a);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) {
            uint8_t b = (uint8_t)x[i];
            memcpy((char *)p + i, &b, 1);
        }
}

/* binary16 conversions through F16C on each 256-bit half (Zen 3 has F16C) */
EMU __m256i emu_mm512_cvtps_ph_rn(__m512 a)
{
    float f[16];
    __m256 lo, hi;
    EMU_TO(f, a);
    memcpy(&lo, f, 32);
    memcpy(&hi, f + 8, 32);
    __m128i l = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT), h = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT);
    return _mm256_set_m128i(h, l);
}

EMU __m512 emu_mm512_cvtph_ps(__m256i a)
{
    float r[16];
    __m512 v;
    _mm256_storeu_ps(r, _mm256_cvtph_ps(_mm256_castsi256_si128(a)));
    _mm256_storeu_ps(r + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)));
    EMU_FROM(v, r);
    return v;
}

EMU __m512 emu_mm512_maskz_loadu_ps(__mmask16 k, const void *p)
{
    float r[16] = {0};
    __m512 v;
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            memcpy(r + i, (const char *)p + 4 * i, 4);
    EMU_FROM(v, r);
    return v;
}

/* Lanes i < n of the vector x (lanes of w bytes) whose bit i of k is set, stored to p[i]. */
EMU void emu_mask_store(void *p, uint64_t k, const void *x, int n, size_t w)
{
    for (int i = 0; i < n; i++)
        if (k >> i & 1)
            memcpy((char *)p + w * i, (const char *)x + w * i, w);
}

EMU void emu_mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) { emu_mask_store(p, k, &a, 16, 4); }

EMU void emu_mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) { emu_mask_store(p, k, &a, 16, 2); }

EMU void emu_mm512_mask_storeu_epi16(void *p, __mmask32 k, __m512i a) { emu_mask_store(p, k, &a, 32, 2); }

EMU void emu_mm512_mask_storeu_epi32(void *p, __mmask16 k, __m512i a) { emu_mask_store(p, k, &a, 16, 4); }

/* the n bytes of x whose mask bit k is set copied from p, the others 0 (only selected bytes read) */
EMU void emu_maskz_bytes(void *x, uint64_t k, const void *p, int n)
{
    memset(x, 0, (size_t)n);
    for (int i = 0; i < n; i++)
        if (k >> i & 1)
            ((uint8_t *)x)[i] = ((const uint8_t *)p)[i];
}

EMU __m128i emu_mm_maskz_loadu_epi8(__mmask16 k, const void *p)
{
    __m128i v;
    emu_maskz_bytes(&v, k, p, 16);
    return v;
}

EMU __m256i emu_mm256_maskz_loadu_epi8(__mmask32 k, const void *p)
{
    __m256i v;
    emu_maskz_bytes(&v, k, p, 32);
    return v;
}

/* the n int16 of x whose mask bit k is set copied from p, the others 0 */
EMU void emu_maskz_words(void *x, uint32_t k, const void *p, int n)
{
    uint64_t kb = 0; /* each selected int16: its two bytes */
    for (int i = 0; i < n; i++)
        if (k >> i & 1)
            kb |= (uint64_t)3 << (2 * i);
    emu_maskz_bytes(x, kb, p, 2 * n);
}

EMU __m256i emu_mm256_maskz_loadu_epi16(__mmask16 k, const void *p)
{
    __m256i v;
    emu_maskz_words(&v, k, p, 16);
    return v;
}

EMU __m512i emu_mm512_maskz_loadu_epi16(__mmask32 k, const void *p)
{
    __m512i v;
    emu_maskz_words(&v, k, p, 32);
    return v;
}

EMU __m512i emu_mm512_maskz_loadu_epi8(__mmask64 k, const void *p)
{
    __m512i v;
    emu_maskz_bytes(&v, k, p, 64);
    return v;
}

EMU float emu_mm512_reduce_max_ps(__m512 a)
{
    float x[16], m;
    EMU_TO(x, a);
    m = x[0];
    for (int i = 1; i < 16; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

EMU float emu_mm512_reduce_add_ps(__m512 a) /* halves folded: 16 -> 8 -> 4 -> 2 -> 1 */
{
    float x[16];
    EMU_TO(x, a);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            x[i] = x[i] + x[i + w];
    return x[0];
}

EMU int emu_mm512_reduce_add_epi32(__m512i a)
{
    int32_t x[16];
    uint32_t s = 0;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        s += (uint32_t)x[i]; /* wraps like the hardware */
    return (int)s;
}

/* 128-bit lanes: a[imm & 3], a[imm >> 2 & 3], b[imm >> 4 & 3], b[imm >> 6 & 3] */
EMU __m512 emu_mm512_shuffle_f32x4(__m512 a, __m512 b, int imm)
{
    float x[16], y[16], r[16];
    __m512 v;
    EMU_TO(x, a);
    EMU_TO(y, b);
    for (int l = 0; l < 4; l++)
        memcpy(r + 4 * l, (l < 2 ? x : y) + 4 * ((imm >> (2 * l)) & 3), 16);
    EMU_FROM(v, r);
    return v;
}

/* a * 2^floor(b) per lane, one rounding (ldexpf is exact but for that rounding); lanes
   outside k are 0.  Integral b within the normal exponent range: all the kernel uses. */
EMU __m512 emu_mm512_maskz_scalef_ps(__mmask16 k, __m512 a, __m512 b)
{
    float x[16], y[16], r[16];
    __m512 v;
    EMU_TO(x, a);
    EMU_TO(y, b);
    for (int i = 0; i < 16; i++)
        r[i] = ((k >> i) & 1) ? (y[i] != y[i] ? y[i] + x[i] : ldexpf(x[i], (int)floorf(y[i]))) : 0.0f;
    EMU_FROM(v, r);
    return v;
}

/* AVX512-BF16 (the avx512bf16 unit): float32 -> bfloat16 by bf16_ref (bf16_ref.h);
   vdpbf16ps with bfloat16 inputs' subnormals as zero, the
   odd element's product added first, then the even one's, each a float32 rounding, subnormal
   results flushed to zero (Intel's pseudocode). */
EMU __m512bh emu_mm512_cvtne2ps_pbh(__m512 a, __m512 b)
{
    float fa[16], fb[16];
    uint16_t r[32];
    __m512bh v;
    EMU_TO(fa, a);
    EMU_TO(fb, b);
    for (int i = 0; i < 16; i++)
        r[i] = bf16_ref(fb[i]), r[16 + i] = bf16_ref(fa[i]);
    EMU_FROM(v, r);
    return v;
}

EMU __m256bh emu_mm512_cvtneps_pbh(__m512 a)
{
    float f[16];
    uint16_t r[16];
    __m256bh v;
    EMU_TO(f, a);
    for (int i = 0; i < 16; i++)
        r[i] = bf16_ref(f[i]);
    EMU_FROM(v, r);
    return v;
}

EMU __m512 emu_mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b)
{
    float s[16];
    uint16_t x[32], y[32];
    EMU_TO(s, src);
    EMU_TO(x, a);
    EMU_TO(y, b);
    for (int i = 0; i < 16; i++) {
        volatile float t = s[i] + bf16_daz(x[2 * i + 1]) * bf16_daz(y[2 * i + 1]);
        t = f32_ftz(t);
        t = t + bf16_daz(x[2 * i]) * bf16_daz(y[2 * i]);
        s[i] = f32_ftz(t);
    }
    EMU_FROM(src, s);
    return src;
}


EMU __m128i emu_mm256_cvtepi16_epi8(__m256i a) /* vpmovwb: each word's low byte */
{
    uint16_t x[16];
    uint8_t r[16];
    __m128i v;
    EMU_TO(x, a);
    for (int i = 0; i < 16; i++)
        r[i] = (uint8_t)(x[i] & 0xFFu);
    EMU_FROM(v, r);
    return v;
}

/* (the compiler's headers define some of these as macros without -O) */
#undef _mm512_cvtps_epi32
#undef _mm512_cvtps_epu32
#undef _mm512_cvtepi32_ps
#undef _mm512_cvtepi8_epi32
#undef _mm512_cvtepu8_epi32
#undef _mm512_mask_cvtsepi32_storeu_epi8
#undef _mm512_mask_cvtepi64_storeu_epi8
#undef _mm512_cvtps_ph
#undef _mm512_cvtph_ps
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm256_maskz_loadu_epi16
#undef _mm256_mask_storeu_epi16
#undef _mm_maskz_loadu_epi8
#undef _mm256_maskz_loadu_epi8
#undef _mm512_maskz_loadu_epi16
#undef _mm512_maskz_loadu_epi8
#undef _mm512_reduce_max_ps
#undef _mm512_reduce_add_epi32
#undef _mm512_mul_round_ps
#undef _mm512_add_round_ps
#undef _mm512_shuffle_f32x4
#undef _mm512_maskz_scalef_ps
#undef _mm512_cvtne2ps_pbh
#undef _mm512_cvtneps_pbh
#undef _mm512_dpbf16_ps
#undef _mm512_mask_storeu_epi16
#undef _mm512_reduce_add_ps
#undef _mm512_mask_storeu_epi32
#undef _mm256_cvtepi16_epi8
#define _mm256_cvtepi16_epi8(a) emu_mm256_cvtepi16_epi8(a)
#define _mm512_cvtne2ps_pbh(a, b) emu_mm512_cvtne2ps_pbh((a), (b))
#define _mm512_cvtneps_pbh(a) emu_mm512_cvtneps_pbh(a)
#define _mm512_dpbf16_ps(s, a, b) emu_mm512_dpbf16_ps((s), (a), (b))
#define _mm512_cvtps_epi32(a) emu_mm512_cvtps_epi32(a)
#define _mm512_cvtps_epu32(a) emu_mm512_cvtps_epu32(a)
#define _mm512_cvtepi32_ps(a) emu_mm512_cvtepi32_ps(a)
#define _mm512_cvtepi8_epi32(a) emu_mm512_cvtepi8_epi32(a)
#define _mm512_cvtepu8_epi32(a) emu_mm512_cvtepu8_epi32(a)
#define _mm512_cvtepu8_epi16(a) emu_mm512_cvtepu8_epi16(a)
#define _mm512_cvtepi32_epi16(a) emu_mm512_cvtepi32_epi16(a)
#define _mm512_mask_cvtsepi32_storeu_epi8(p, k, a) emu_mm512_mask_cvtsepi32_storeu_epi8((p), (k), (a))
#define _mm512_mask_cvtepi64_storeu_epi8(p, k, a) emu_mm512_mask_cvtepi64_storeu_epi8((p), (k), (a))
#define _mm512_cvtps_ph(a, r) \
    ((r) == (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) ? emu_mm512_cvtps_ph_rn(a) : (abort(), emu_mm512_cvtps_ph_rn(a)))
#define _mm512_cvtph_ps(a) emu_mm512_cvtph_ps(a)
#define _mm512_maskz_loadu_ps(k, p) emu_mm512_maskz_loadu_ps((k), (p))
#define _mm512_mask_storeu_ps(p, k, a) emu_mm512_mask_storeu_ps((p), (k), (a))
#define _mm256_maskz_loadu_epi16(k, p) emu_mm256_maskz_loadu_epi16((k), (p))
#define _mm256_mask_storeu_epi16(p, k, a) emu_mm256_mask_storeu_epi16((p), (k), (a))
#define _mm512_mask_storeu_epi16(p, k, a) emu_mm512_mask_storeu_epi16((p), (k), (a))
#define _mm512_mask_storeu_epi32(p, k, a) emu_mm512_mask_storeu_epi32((p), (k), (a))
#define _mm_maskz_loadu_epi8(k, p) emu_mm_maskz_loadu_epi8((k), (p))
#define _mm256_maskz_loadu_epi8(k, p) emu_mm256_maskz_loadu_epi8((k), (p))
#define _mm512_maskz_loadu_epi16(k, p) emu_mm512_maskz_loadu_epi16((k), (p))
#define _mm512_maskz_loadu_epi8(k, p) emu_mm512_maskz_loadu_epi8((k), (p))
#define _mm512_reduce_max_ps(a) emu_mm512_reduce_max_ps(a)
#define _mm512_reduce_add_epi32(a) emu_mm512_reduce_add_epi32(a)
#define _mm512_reduce_add_ps(a) emu_mm512_reduce_add_ps(a)
#define _mm512_shuffle_f32x4(a, b, imm) emu_mm512_shuffle_f32x4((a), (b), (imm))
#define _mm512_maskz_scalef_ps(k, a, b) emu_mm512_maskz_scalef_ps((k), (a), (b))
/* round-to-nearest only; fp-contract must be off in this build (plain * and +) */
#define _mm512_mul_round_ps(a, b, r) \
    ((r) == (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) ? _mm512_mul_ps(a, b) : (abort(), _mm512_mul_ps(a, b)))
#define _mm512_add_round_ps(a, b, r) \
    ((r) == (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) ? _mm512_add_ps(a, b) : (abort(), _mm512_add_ps(a, b)))

#endif
