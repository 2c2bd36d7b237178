/*
 * gqa_kernels.h -- the kernel contract shared by every instruction-set path.
 *
 * Intrinsic-free: this is the only kernel header Cython sees.  Each path
 * (kernels_<path>.c) exports one constant table `gqa_kernels_<path>` whose
 * fields point at its implementation of the operations below.
 *
 * Cache element types (gqa_type_t).  A "row" of B is `gqa_row_bytes(type, cols)`
 * bytes; rows are contiguous (no row stride):
 *   GQA_S8_PT / GQA_S8_PC  int8 codes, one per byte            x = q * s
 *   GQA_S4_PT / GQA_S4_PC  two codes per byte, +8 biased nibbles; element 2i in
 *                          the low nibble of byte i, 2i+1 in the high nibble;
 *                          odd widths end with a pad nibble 8  x = (nib - 8) * s
 *   GQA_F32 / GQA_F16      unquantized float32 / IEEE binary16 rows (no scale)
 * PT scales point at 1 float; PC scales at `cols` floats (one per column).
 *
 * Per-group asymmetric types (kernels_group.h has the codec).  The type value is
 *   gqa_group_type(kind, group, meta16) = kind | GQA_META_F16 (fp16 metadata) | group << 8
 * with kind GQA_G8 / GQA_G4 / GQA_G2 (b = 8, 4, 2 bits) and `group` columns per group
 * (group divides cols; group * b is a multiple of 8).  A row of cols elements is
 *   cols * b / 8 code bytes: unsigned codes, element i in bits [b*(i % (8/b)), +b) of
 *                            byte i*b/8 (the lowest bits hold the first element);
 *   then cols / group pairs (scale, zero) of float32 or binary16, little endian,
 *   x = code * scale + zero   (two roundings: a product, then a sum; every path).
 * The quantizer's `scales` argument points at one float, rho (the clip quantile), or is
 * NULL; the other operations ignore `scales` for these types.
 *
 * Numeric contract (ONNX Runtime MLAS qkv_quant):
 *   quantize   q = clamp(rint(x * (1/s)), lo, hi) in float32, half to even,
 *              s == 0 -> multiplier 1, NaN -> hi, +-inf -> hi / lo.
 *   qk_gemm    C[m,n] = alpha * sum_k A[m,k] * deq(B)[n,k]      (C overwritten)
 *   sv_gemm    C[m,n] = beta * C[m,n] + sum_k A[m,k] * deq(B)[k,n]
 *              beta == 0 overwrites C (NaN in C is ignored).
 *   A (float32) is never quantized, except by the opt-in integer-dot kernels
 *   (AVX-512 VNNI, AMX INT8, AVX2): qk_gemm_s8_approx quantizes A rows to u8 with zero point
 *   128, qk_gemm_s8_dot to int16 against the row's absolute maximum, sv_gemm_s8_dot
 *   (non-negative rows) to 15 bits against the row's maximum.
 *   Where a scale is applied is the path's choice (the scalar path decodes
 *   q * s per element; SIMD paths multiply per-tensor scales into the finished
 *   sum, fold per-channel QK scales into A as A[m,k] * s[k] and apply per-channel
 *   SV scales per column after the key sum): results agree to float rounding.
 * The value of C[m,n] depends only on row m of A, row/column n of B and K --
 * never on M, N or the position of (m, n) in a register block -- so a caller
 * may split a GEMM into pieces and get identical results.
 */
#ifndef GQA_KERNELS_H
#define GQA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    GQA_S8_PT = 0,
    GQA_S8_PC = 1,
    GQA_S4_PT = 2,
    GQA_S4_PC = 3,
    GQA_F32 = 4,
    GQA_F16 = 5,
    GQA_G8 = 6,
    GQA_G4 = 7,
    GQA_G2 = 8
} gqa_type_t;

#define GQA_META_F16 0x10
#define GQA_GROUP_SHIFT 8
#define GQA_KIND(t) ((t) & 0xF)
#define GQA_IS_GROUP(t) (GQA_KIND(t) >= GQA_G8 && GQA_KIND(t) <= GQA_G2)

static inline int gqa_group_type(int kind, size_t group, int meta16)
{
    return kind | (meta16 ? GQA_META_F16 : 0) | (int)(group << GQA_GROUP_SHIFT);
}

/* Code bits, columns per group and bytes per metadata value of a group type. */
static inline unsigned gqa_group_bits(int type) { return 8u >> (GQA_KIND(type) - GQA_G8); }
static inline size_t gqa_group_cols(int type) { return (size_t)((unsigned)type >> GQA_GROUP_SHIFT); }
static inline size_t gqa_meta_bytes(int type) { return (type & GQA_META_F16) ? 2 : 4; }

typedef enum {
    GQA_PATH_SCALAR = 0,
    GQA_PATH_AVX2 = 1,
    GQA_PATH_AVX512 = 2,
    GQA_PATH_NEON = 3,
    GQA_PATH_COUNT = 4
} gqa_path_t;

/* Bytes of one stored row of `cols` elements. */
static inline size_t gqa_row_bytes(int type, size_t cols)
{
    if (GQA_IS_GROUP(type))
        return cols * gqa_group_bits(type) / 8 + cols / gqa_group_cols(type) * 2 * gqa_meta_bytes(type);
    switch (type) {
    case GQA_S4_PT: case GQA_S4_PC: return (cols + 1) / 2;
    case GQA_F32: return 4 * cols;
    case GQA_F16: return 2 * cols;
    default: return cols;
    }
}

typedef void (*gqa_quantize_fn)(const float *src, size_t lda, void *dst,
                                size_t rows, size_t cols, int type,
                                const float *scales);
typedef void (*gqa_dequantize_fn)(const void *src, float *dst, size_t ldd,
                                  size_t rows, size_t cols, int type,
                                  const float *scales);
typedef void (*gqa_qk_gemm_fn)(size_t M, size_t N, size_t K, float alpha,
                               const float *A, size_t lda, const void *B,
                               int type, const float *scales,
                               float *C, size_t ldc);
typedef void (*gqa_sv_gemm_fn)(size_t M, size_t N, size_t K,
                               const float *A, size_t lda, const void *B,
                               int type, const float *scales,
                               float *C, size_t ldc, float beta);

typedef float (*gqa_exp_sum_fn)(float *x, size_t n, float m);

/* Matrix tiles for the flash prompt tiles at accuracy level >= 3 (kernels_avx512bf16.c states
   the operand layouts and roundings; kernels_amx.c the AMX gemm, kernels_neonbf16.c Arm's BFDOT
   one): bfloat16 operands, float32 sums.  Bracket the gemm calls of one thread by begin / end; permit once per process before
   any (dispatch.c does). */
typedef struct gqa_tiles {
    const char *name;
    unsigned cpu; /* the GQA_CPU_* features it needs, beyond its path's */
    int rows;     /* the flash plan's query tile on these tiles: rows (positions x G heads) */
    /* 1: a multi-token step of few rows runs on the decode kernels, up to the rows where they beat
       the float32 tiles at the call's level (gqa/_plan.pyx, step_rows); 0: every step on these tiles */
    int steps_direct;
    int (*permit)(void); /* the OS's grant, asked once per process; 1 where none is needed */
    void (*begin)(void);
    void (*end)(void);
    /* src [rows, cols] (row stride lds) -> dst [rows_pad, cols_pad] bfloat16, zero padded. */
    void (*pack_rows)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                      size_t cols_pad, uint16_t *dst);
    /* src [rows, cols] -> dst [rows_pad / 2, cols_pad] pairs of rows, zero padded. */
    void (*pack_pairs)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                       size_t cols_pad, uint32_t *dst);
    /* src [rows, cols] -> dst [cols_pad / 2, rows_pad] pairs of columns of src (the pairs
       of src's transpose), zero padded; rows_pad a multiple of 16, cols_pad of 32. */
    void (*pack_pairs_t)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                         size_t cols_pad, uint32_t *dst);
    /* e_i = exp(x[i] - m) for i < n within 2^-16 relative (-inf gives 0, NaN stays NaN),
       returning their sum, dst[0:n_pad] = bfloat16(e_i) for i < n, 0 past n, and x[i] = e_i
       where `store` (else x is left as it is). */
    float (*exp_pack)(float *x, size_t n, size_t n_pad, float m, uint16_t *dst, int store);
    /* C[M, N] = (acc ? C : 0) + A B; M, N multiples of 16, K of 32. */
    void (*gemm)(size_t M, size_t N, size_t K, const uint16_t *A, size_t lda, const uint32_t *B,
                 size_t ldb, float *C, size_t ldc, int acc);
    /* Accuracy level 4's qk_gemm_s8_dot / sv_gemm_s8_dot on these tiles (the contracts and
       results of the VNNI unit's, kernels_s8dot_contract.h), or NULL; called between begin and end. */
    gqa_qk_gemm_fn qk_s8;
    gqa_sv_gemm_fn sv_s8;
    /* Levels 3-4's qk_gemm / sv_gemm on float32 rows (GQA_F32; other types: the path's
       kernels) as the decode kernels read them, with these tiles' roundings: each operand to
       bfloat16 (qk: the query times alpha, then rounded), exact products summed in float32
       (kernels_avx512bf16_dot.c states it), or NULL (float32 products); no begin / end. */
    gqa_qk_gemm_fn qk_f;
    gqa_sv_gemm_fn sv_f;
} gqa_tiles;
typedef float (*gqa_row_max_fn)(const float *x, size_t n);
typedef void (*gqa_hadamard_fn)(size_t n, size_t H, const float *x, size_t ldx, float *o,
                                size_t ldo, float c, int inverse);
#define GQA_ROT_MAX 1024 /* the widest head a rotation takes (hadamard_rows' buffers; the call's checks) */
typedef void (*gqa_rope_fn)(size_t r2, int interleaved, const float *x, const float *c, const float *s,
                            float *o);

typedef struct gqa_kernels {
    const char *name;
    /* src [rows, cols] float32 with row stride lda -> packed rows of dst. */
    gqa_quantize_fn quantize;
    /* packed rows of src -> dst [rows, cols] float32 with row stride ldd. */
    gqa_dequantize_fn dequantize;
    /* packed rows of src -> dst [cols, rows] float32 with row stride ldd
       (the transpose of dequantize; used to build flash K tiles). */
    gqa_dequantize_fn dequantize_t;
    gqa_qk_gemm_fn qk_gemm;
    gqa_sv_gemm_fn sv_gemm;
    /* Integer-dot kernels, approximate; NULL where the path has none.
       qk_gemm_s8_approx: GQA_S8_PT, onnxruntime's approximate VNNI QK (8-bit query, opt-in;
       avx512 with VNNI);  qk_gemm_s8_dot / sv_gemm_s8_dot: accuracy level 4 on INT8 and INT4
       codes per tensor / per channel (gqa_dot_codes), query rows and probabilities quantized to
       15 bits (kernels_s8dot_contract.h;
       avx512: vpdpwssd, where the CPU has VNNI; avx2: vpmaddwd (the avxvnni table's: VEX
       vpdpwssd); neon: sdot, where the CPU has the dot product; gqa_s8_dot_table says).
       avx2's (and avxvnni's), avx512's (the VNNI unit) and neon's take per-group codes too
       (gqa_group_dot_takes; on avx512 without VNNI the dispatch uses avx2's).
       Other types (and, per row, what the contracts leave) run the path's exact kernel. */
    gqa_qk_gemm_fn qk_gemm_s8_approx;
    gqa_qk_gemm_fn qk_gemm_s8_dot;
    gqa_sv_gemm_fn sv_gemm_s8_dot;
    /* x[i] = exp(x[i] - m) for i < n; returns their float32 sum.  Accurate to ~2 ulp;
       an argument x[i] - m below -87.3 (including -inf) gives exactly 0, NaN stays NaN.
       NULL in a table: callers use the scalar path's. */
    gqa_exp_sum_fn exp_sum;
    /* The largest of x[0:n], NaN elements skipped (a softmax row's maximum; a NaN score
       reaches the row through exp_sum); -inf when n == 0 or no element is larger.  Exact:
       every path returns the same value (+0 and -0 may differ). */
    gqa_row_max_fn row_max;
    /* o = x R (inverse: x R^T) for n rows of the `+had` rotation R = c Sy P (kernels_common.h,
       gqa_hadamard_rows: the same bits on every path). */
    gqa_hadamard_fn hadamard_rows;
    /* The rotary embedding of one head row at one position, o[0, 2 r2) from x with cos c[0, r2)
       and sin s[0, r2): pairs (x[i], x[i + r2]), interleaved (x[2i], x[2i + 1]), each turned as
       x0' = fma(x0, c[i], -(x1 s[i])), x1' = fma(x0, s[i], x1 c[i]) (the products rounded to
       float32, then one fused multiply-add: onnxruntime's x86 rounding, so that float caches
       match its bits; gqa_rope_pairs, kernels_common.h).  The same bits on every path; o may be
       x but must not otherwise overlap it; o[2 r2 ..] is not touched. */
    gqa_rope_fn rope_row;
    /* The path's matrix tiles, best first, NULL-terminated (avx512: AMX, then AVX-512 BF16
       dot products), or NULL where the build has none; callers take them through
       gqa_path_tiles, which checks the CPU. */
    const gqa_tiles *const *tiles;
} gqa_kernels;

/* Tables, one per compiled path (dispatch.c knows which exist). */
extern const gqa_kernels gqa_kernels_scalar;

/* dispatch.c: CPU detection and table lookup; baseline code only. */
#define GQA_CPU_SSE2      (1u << 0)
#define GQA_CPU_AVX       (1u << 1)
#define GQA_CPU_AVX2      (1u << 2)
#define GQA_CPU_FMA       (1u << 3)
#define GQA_CPU_F16C      (1u << 4)
#define GQA_CPU_AVX512F   (1u << 5)
#define GQA_CPU_AVX512BW  (1u << 6)
#define GQA_CPU_AVX512DQ  (1u << 7)
#define GQA_CPU_AVX512VL  (1u << 8)
#define GQA_CPU_AVX512VNNI (1u << 9)
#define GQA_CPU_NEON      (1u << 10)
#define GQA_CPU_ASIMDDP   (1u << 11)
#define GQA_CPU_AVX512BF16 (1u << 12)
#define GQA_CPU_AMX       (1u << 13) /* AMX-TILE + AMX-BF16 + AMX-INT8, tile state enabled in XCR0 */
#define GQA_CPU_BF16      (1u << 14) /* aarch64: the BFloat16 extension (HWCAP2_BF16: BFDOT, BFMMLA) */
#define GQA_CPU_AVXVNNI   (1u << 15) /* x86: AVX-VNNI, VEX vpdpwssd on ymm (CPUID.(7,1):EAX[4], AVX state on) */

unsigned gqa_cpu_features(void);
const char *gqa_cpu_feature_name(unsigned bit_index);
const char *gqa_path_name(int path);
/* Table of a path, or NULL when it was not compiled into this build. */
const gqa_kernels *gqa_path_table(int path);
/* 1 when the path was compiled and this CPU (and OS) can run it. */
int gqa_path_runnable(int path);
/* 1 when the approximate VNNI QK kernel can run here. */
int gqa_approx_vnni_runnable(void);
/* The table whose qk_gemm_s8_dot / sv_gemm_s8_dot run path `path`'s accuracy level 4 on this
   CPU: on avx2 the avxvnni table (the same kernels, level 4 on AVX-VNNI) where the build has it
   and the CPU has AVX-VNNI, else the path's own table where it has the entries and the CPU runs
   them (avx512: VNNI; neon: the dot product); NULL where none runs. */
const gqa_kernels *gqa_s8_dot_table(int path);
/* The i-th tiles of a path's table (best first), NULL past the last or where it has none. */
const gqa_tiles *gqa_path_tiles_at(int path, int i);
/* 1 when path `path` runs here and this CPU, its OS and (AMX) the kernel's grant of the tile
   state run tiles x, one of the path's. */
int gqa_tiles_runnable(int path, const gqa_tiles *x);
/* The best tiles of a path this CPU runs, else NULL. */
const gqa_tiles *gqa_path_tiles(int path);
size_t gqa_l2_cache_bytes(void);

/* Half-precision conversion helpers shared by all paths (kernels_scalar.c). */
float gqa_half_to_float(uint16_t h);
uint16_t gqa_float_to_half(float f);

#ifdef __cplusplus
}
#endif
#endif
