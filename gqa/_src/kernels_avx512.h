/*
 * kernels_avx512.h -- what the AVX-512 units (kernels_avx512.c, kernels_avx512vnni.c) share:
 * the intrinsics (<immintrin.h>, or SIMDe for the emulation build of tests/isa:
 * GQA_EMULATE_AVX512), the ISA-free helpers, and lane masks.  Included only by units
 * compiled with the avx512 path's flags.
 */
#ifndef GQA_KERNELS_AVX512_H
#define GQA_KERNELS_AVX512_H

#ifdef GQA_EMULATE_AVX512
#include "emu_avx512.h" /* tests/isa only: SIMDe + shims, portable code */
#else
#include <immintrin.h>
#endif
#include <float.h>
#include <stdlib.h>
#include "kernels_common.h"

/* Lanes [0, n) set, n <= 16 / n <= 64. */
static inline __mmask16 mask16(size_t n) { return (__mmask16)((1u << n) - 1u); }
static inline __mmask64 mask64(size_t n) { return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1); }

#endif
