/*
 * bf16_ref.h -- the contract's float32 -> bfloat16 rounding (vcvtne2ps2bf16 / vcvtneps2bf16):
 * to nearest, ties to even, NaN quieted, subnormal inputs as (signed) zero.  tests/isa only:
 * the driver's reference and the emulation build's shims (emu_avx512.h) state it once here.
 */
#ifndef GQA_BF16_REF_H
#define GQA_BF16_REF_H
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
#endif
