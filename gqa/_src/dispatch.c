/*
 * dispatch.c -- CPU feature detection and the table of compiled paths.
 * ISA flags: none (baseline only; it must run on every x86-64 / aarch64 CPU).
 *
 * x86: cpuid leaves 1 and 7 plus XGETBV: AVX/FMA/F16C need XCR0 bits 1-2
 * (SSE and AVX state); AVX-512 also needs bits 5-7 (opmask, ZMM0-15 high,
 * ZMM16-31).  aarch64: NEON (ASIMD) is baseline; the dot product and BFloat16 via getauxval.
 * Which paths exist is told by the build: GQA_HAVE_<PATH> macros.
 */
#include <stdlib.h>
#include <unistd.h>
#include "gqa_kernels.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define GQA_X86 1
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#define GQA_ARM64 1
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#endif

#ifdef GQA_HAVE_AVX2
extern const gqa_kernels gqa_kernels_avx2;
#endif
#ifdef GQA_HAVE_AVXVNNI /* the avx2 path's kernels with level 4 on AVX-VNNI (kernels_avx2.c) */
extern const gqa_kernels gqa_kernels_avxvnni;
#endif
#ifdef GQA_HAVE_AVX512
extern const gqa_kernels gqa_kernels_avx512;
#endif
#ifdef GQA_HAVE_NEON
extern const gqa_kernels gqa_kernels_neon;
#endif

static const char *const path_names[GQA_PATH_COUNT] = {"scalar", "avx2", "avx512", "neon"};
static const char *const feature_names[] = {
    "SSE2", "AVX", "AVX2", "FMA", "F16C", "AVX512F", "AVX512BW", "AVX512DQ",
    "AVX512VL", "AVX512VNNI", "NEON", "ASIMDDP", "AVX512BF16", "AMX", "BF16", "AVXVNNI"};

const char *gqa_path_name(int path)
{
    return (path >= 0 && path < GQA_PATH_COUNT) ? path_names[path] : NULL;
}

const char *gqa_cpu_feature_name(unsigned bit_index)
{
    return bit_index < sizeof(feature_names) / sizeof(feature_names[0]) ? feature_names[bit_index] : NULL;
}

#ifdef GQA_X86
static unsigned long long read_xcr0(void)
{
    unsigned int eax, edx;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0)); /* xgetbv */
    return ((unsigned long long)edx << 32) | eax;
}
#endif

static unsigned detect(void)
{
    unsigned f = 0;
#ifdef GQA_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    if (d & (1u << 26)) f |= GQA_CPU_SSE2;
    int osxsave = (c & (1u << 27)) != 0;
    int avx = (c & (1u << 28)) != 0, fma = (c & (1u << 12)) != 0, f16c = (c & (1u << 29)) != 0;
    unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6;
    int os_avx512 = (xcr0 & 0xE6) == 0xE6;
    if (!(avx && os_avx))
        return f;
    f |= GQA_CPU_AVX;
    if (fma) f |= GQA_CPU_FMA;
    if (f16c) f |= GQA_CPU_F16C;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        const unsigned subleaves = a; /* the highest subleaf of leaf 7 */
        if (b & (1u << 5)) f |= GQA_CPU_AVX2;
        if (os_avx512) {
            if (b & (1u << 16)) f |= GQA_CPU_AVX512F;
            if (b & (1u << 17)) f |= GQA_CPU_AVX512DQ;
            if (b & (1u << 30)) f |= GQA_CPU_AVX512BW;
            if (b & (1u << 31)) f |= GQA_CPU_AVX512VL;
            if (c & (1u << 11)) f |= GQA_CPU_AVX512VNNI;
        }
        /* EDX bits 22, 24, 25: AMX-BF16, AMX-TILE, AMX-INT8; XCR0 bits 17-18: tile config and data */
        const int amx = (d & (1u << 22)) && (d & (1u << 24)) && (d & (1u << 25)) && (xcr0 & 0x60000) == 0x60000;
        a = 0;
        if (subleaves >= 1)
            __cpuid_count(7, 1, a, b, c, d);
        if (a & (1u << 4)) f |= GQA_CPU_AVXVNNI; /* reached only with the AVX state on */
        if (os_avx512 && (a & (1u << 5))) f |= GQA_CPU_AVX512BF16;
#ifdef GQA_EMULATE_AMX
        (void)amx; /* the tests' build with emulated tiles (setup.py): AMX wherever AVX512-BF16 is */
        if (f & GQA_CPU_AVX512BF16) f |= GQA_CPU_AMX;
#else
        if (amx) f |= GQA_CPU_AMX;
#endif
#ifdef GQA_EMULATE_AVX512
        /* the tests' build with every x86 unit beyond avx2 emulated (setup.py): all of them
           wherever the avx2 path runs */
        const unsigned base = GQA_CPU_AVX | GQA_CPU_AVX2 | GQA_CPU_FMA | GQA_CPU_F16C;
        if ((f & base) == base)
            f |= GQA_CPU_AVX512F | GQA_CPU_AVX512BW | GQA_CPU_AVX512DQ | GQA_CPU_AVX512VL |
                 GQA_CPU_AVX512VNNI | GQA_CPU_AVX512BF16 | GQA_CPU_AMX | GQA_CPU_AVXVNNI;
#endif
    }
#elif defined(GQA_ARM64)
    f |= GQA_CPU_NEON;
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) f |= GQA_CPU_ASIMDDP;
#endif
#if defined(__linux__) && defined(HWCAP2_BF16)
    if (getauxval(AT_HWCAP2) & HWCAP2_BF16) f |= GQA_CPU_BF16;
#endif
#endif
    return f;
}

unsigned gqa_cpu_features(void)
{
    /* Idempotent: a racing first call computes the same value. */
    static volatile int done = 0;
    static volatile unsigned cached = 0;
    if (!done) {
        cached = detect();
        done = 1;
    }
    return cached;
}

const gqa_kernels *gqa_path_table(int path)
{
    switch (path) {
    case GQA_PATH_SCALAR: return &gqa_kernels_scalar;
#ifdef GQA_HAVE_AVX2
    case GQA_PATH_AVX2: return &gqa_kernels_avx2;
#endif
#ifdef GQA_HAVE_AVX512
    case GQA_PATH_AVX512: return &gqa_kernels_avx512;
#endif
#ifdef GQA_HAVE_NEON
    case GQA_PATH_NEON: return &gqa_kernels_neon;
#endif
    default: return NULL;
    }
}

int gqa_path_runnable(int path)
{
    unsigned f = gqa_cpu_features();
    const unsigned need_avx2 = GQA_CPU_AVX | GQA_CPU_AVX2 | GQA_CPU_FMA | GQA_CPU_F16C;
    const unsigned need_avx512 = need_avx2 | GQA_CPU_AVX512F | GQA_CPU_AVX512BW |
                                 GQA_CPU_AVX512DQ | GQA_CPU_AVX512VL;
    if (gqa_path_table(path) == NULL)
        return 0;
    switch (path) {
    case GQA_PATH_SCALAR: return 1;
    case GQA_PATH_AVX2: return (f & need_avx2) == need_avx2;
    case GQA_PATH_AVX512: return (f & need_avx512) == need_avx512;
    case GQA_PATH_NEON: return (f & GQA_CPU_NEON) != 0;
    default: return 0;
    }
}

int gqa_approx_vnni_runnable(void)
{
    const gqa_kernels *t = gqa_path_table(GQA_PATH_AVX512);
    return t != NULL && t->qk_gemm_s8_approx != NULL && gqa_path_runnable(GQA_PATH_AVX512) &&
           (gqa_cpu_features() & GQA_CPU_AVX512VNNI) != 0;
}

const gqa_kernels *gqa_s8_dot_table(int path)
{
    const gqa_kernels *t = gqa_path_table(path);
    const unsigned f = gqa_cpu_features();
    if (t == NULL || t->qk_gemm_s8_dot == NULL || t->sv_gemm_s8_dot == NULL || !gqa_path_runnable(path))
        return NULL;
    /* avx512's are the VNNI unit's (vpdpwssd), neon's the dot product's (sdot); avx2's need
       nothing beyond the path, and the avxvnni table's AVX-VNNI */
    switch (path) {
    case GQA_PATH_AVX512: return (f & GQA_CPU_AVX512VNNI) ? t : NULL;
    case GQA_PATH_NEON: return (f & GQA_CPU_ASIMDDP) ? t : NULL;
#ifdef GQA_HAVE_AVXVNNI
    case GQA_PATH_AVX2: return (f & GQA_CPU_AVXVNNI) ? &gqa_kernels_avxvnni : t;
#endif
    default: return t;
    }
}

const gqa_tiles *gqa_path_tiles_at(int path, int i)
{
    const gqa_kernels *t = gqa_path_table(path);
    if (t == NULL || t->tiles == NULL || i < 0)
        return NULL;
    for (int k = 0; k < i; k++)
        if (t->tiles[k] == NULL)
            return NULL;
    return t->tiles[i];
}

int gqa_tiles_runnable(int path, const gqa_tiles *x)
{
    /* permit asks the kernel's grant once per process and keeps the answer (kernels_amx.c) */
    return x != NULL && gqa_path_runnable(path) && (gqa_cpu_features() & x->cpu) == x->cpu && x->permit();
}

const gqa_tiles *gqa_path_tiles(int path)
{
    for (int i = 0; gqa_path_tiles_at(path, i) != NULL; i++)
        if (gqa_tiles_runnable(path, gqa_path_tiles_at(path, i)))
            return gqa_path_tiles_at(path, i);
    return NULL;
}

size_t gqa_l2_cache_bytes(void)
{
#if defined(_SC_LEVEL2_CACHE_SIZE)
    long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (v > 0)
        return (size_t)v;
#endif
    return 0;
}
