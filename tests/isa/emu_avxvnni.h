/*
 * emu_avxvnni.h -- AVX-VNNI's vpdpwssd (VEX, 256-bit) as portable code, for the emulation build
 * of the avxvnni unit only (tests/isa, -DGQA_EMULATE_AVXVNNI, compiled WITHOUT -mavxvnni: the
 * result runs on any x86-64 with AVX2, e.g. AMD Zen 3).  Never part of the package build.
 *
 * _mm256_dpwssd_avx_epi32(src, a, b): lane i (8 int32 lanes) = src_i + a_2i b_2i + a_2i+1 b_2i+1,
 * the int16 products exact and the sum wrapped to 32 bits, no saturation (Intel SDM, VPDPWSSD).
 * Stated lane by lane here, independent of vpmaddwd, which the avx2 unit uses.
 */
#ifndef GQA_EMU_AVXVNNI_H
#define GQA_EMU_AVXVNNI_H
#ifndef GQA_EMULATE_AVXVNNI
#error "emu_avxvnni.h is for the tests/isa emulation build only"
#endif
#if defined(__AVXVNNI__)
#error "the emulation build must not be compiled with -mavxvnni"
#endif
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline __m256i emu_mm256_dpwssd_avx_epi32(__m256i src, __m256i a, __m256i b)
{
    int32_t s[8];
    int16_t x[16], y[16];
    memcpy(s, &src, 32);
    memcpy(x, &a, 32);
    memcpy(y, &b, 32);
    for (int i = 0; i < 8; i++) {
        const uint32_t p = (uint32_t)((int32_t)x[2 * i] * y[2 * i]) + (uint32_t)((int32_t)x[2 * i + 1] * y[2 * i + 1]);
        s[i] = (int32_t)((uint32_t)s[i] + p);
    }
    __m256i r;
    memcpy(&r, s, 32);
    return r;
}
#define _mm256_dpwssd_avx_epi32(src, a, b) emu_mm256_dpwssd_avx_epi32((src), (a), (b))
#endif
