/*
 * bf16_ref.h -- the contract's float32 -> bfloat16 rounding (vcvtne2ps2bf16 / vcvtneps2bf16):
 * to nearest, ties to even, NaN quieted, subnormal inputs as (signed) zero; and the bfloat16
 * dot instructions' input and output flushing.  tests/isa only: the driver's reference and the
 * emulation shims (emu_avx512.h, emu_amx.h) state them once here.
 */
#ifndef GQA_BF16_REF_H
#define GQA_BF16_REF_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_ref(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7F800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000u);
    if (x != x)
        return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* A bfloat16's value with subnormals as (signed) zero (vdpbf16ps' and tdpbf16ps' inputs). */
static inline float bf16_daz(uint16_t b)
{
    const uint32_t u = (b & 0x7F80u) == 0 ? (uint32_t)(b & 0x8000u) << 16 : (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* A float32 result with subnormals flushed to (signed) zero (those instructions' outputs). */
static inline float f32_ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }
#endif
