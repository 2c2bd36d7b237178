# Declarations of the C kernel contract (gqa_kernels.h) and the accessors
# through which every other Cython module reaches the one active table.
from libc.stdint cimport uint8_t, uint16_t, uint32_t

cdef extern from "gqa_kernels.h" nogil:
    ctypedef enum gqa_type_t:
        GQA_S8_PT
        GQA_S8_PC
        GQA_S4_PT
        GQA_S4_PC
        GQA_F32
        GQA_F16
        GQA_G8
        GQA_G4
        GQA_G2
    ctypedef void (*gqa_quantize_fn)(const float *src, size_t lda, void *dst, size_t rows,
                                     size_t cols, int type, const float *scales) noexcept nogil
    ctypedef void (*gqa_dequantize_fn)(const void *src, float *dst, size_t ldd, size_t rows,
                                       size_t cols, int type, const float *scales) noexcept nogil
    ctypedef void (*gqa_qk_gemm_fn)(size_t M, size_t N, size_t K, float alpha, const float *A,
                                    size_t lda, const void *B, int type, const float *scales,
                                    float *C, size_t ldc) noexcept nogil
    ctypedef void (*gqa_sv_gemm_fn)(size_t M, size_t N, size_t K, const float *A, size_t lda,
                                    const void *B, int type, const float *scales, float *C,
                                    size_t ldc, float beta) noexcept nogil
    ctypedef float (*gqa_exp_sum_fn)(float *x, size_t n, float m) noexcept nogil
    ctypedef float (*gqa_row_max_fn)(const float *x, size_t n) noexcept nogil
    ctypedef void (*gqa_hadamard_fn)(size_t n, size_t H, const float *x, size_t ldx, float *o,
                                     size_t ldo, float c, int inverse) noexcept nogil
    ctypedef void (*gqa_rope_fn)(size_t r2, int interleaved, const float *x, const float *c,
                                 const float *s, float *o) noexcept nogil
    ctypedef struct gqa_tiles:
        const char *name
        int rows
        int steps_direct
        void (*begin)() noexcept nogil
        void (*end)() noexcept nogil
        void (*pack_rows)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                          size_t cols_pad, uint16_t *dst) noexcept nogil
        void (*pack_pairs)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                           size_t cols_pad, uint32_t *dst) noexcept nogil
        void (*pack_pairs_t)(const float *src, size_t lds, size_t rows, size_t cols, size_t rows_pad,
                             size_t cols_pad, uint32_t *dst) noexcept nogil
        float (*exp_pack)(float *x, size_t n, size_t n_pad, float m, uint16_t *dst,
                          int store) noexcept nogil
        void (*gemm)(size_t M, size_t N, size_t K, const uint16_t *A, size_t lda, const uint32_t *B,
                     size_t ldb, float *C, size_t ldc, int acc) noexcept nogil
        gqa_qk_gemm_fn qk_s8
        gqa_sv_gemm_fn sv_s8
        gqa_qk_gemm_fn qk_f
        gqa_sv_gemm_fn sv_f
    ctypedef struct gqa_kernels:
        const char *name
        gqa_quantize_fn quantize
        gqa_dequantize_fn dequantize
        gqa_dequantize_fn dequantize_t
        gqa_qk_gemm_fn qk_gemm
        gqa_sv_gemm_fn sv_gemm
        gqa_qk_gemm_fn qk_gemm_s8_approx
        gqa_qk_gemm_fn qk_gemm_s8_dot
        gqa_sv_gemm_fn sv_gemm_s8_dot
        gqa_exp_sum_fn exp_sum
        gqa_row_max_fn row_max
        gqa_hadamard_fn hadamard_rows
        gqa_rope_fn rope_row
    size_t gqa_row_bytes(int type, size_t cols)
    bint GQA_IS_GROUP(int type)
    int GQA_ROT_MAX

# The active table (set by gqa.config / GQA_KERNEL).
cdef const gqa_kernels *active_table() noexcept nogil
# The QK / SV kernels for `type` at accuracy `level` under the active settings, where the
# table has them and the CPU runs them: level >= 4 on per-tensor and per-channel INT8 / INT4, the
# level-4 integer-dot kernels (with `tiles` -- decode steps, the naive path, the standalone
# kernels -- the active tiles' where they have them, called between dot_tiles' begin and end;
# without -- the flash prompt's float32 tiles -- SV's on avx512 (INT8) and avx2 (INT8 and INT4,
# and per-group codes as prompt_qk_kernel takes them), where they beat float32 products on a V
# tile dequantized once); with `tiles`, level >= 3 on float32 rows and calls of `rows` query rows
# or more (float_tiles), the active tiles' bfloat16 kernels where they have them; else, for QK of
# per-tensor INT8 with the approximate VNNI switch on, onnxruntime's approximate kernel; else the
# exact kernels.  `rows`: the rows of A in each call; H: the heads' columns.
cdef gqa_qk_gemm_fn qk_kernel(const gqa_kernels *t, int type, int level, bint tiles, int rows) noexcept nogil
cdef gqa_sv_gemm_fn sv_kernel(const gqa_kernels *t, int type, int level, bint tiles, int rows,
                             int H) noexcept nogil
# The level-4 QK kernel of the flash prompt's float32 tiles on `type`'s codes, heads of H columns
# (avx2's packed kernels: INT8 / INT4 per tensor and per channel, per-group codes in groups the
# per-group contracts take), else NULL (scores on a dequantized K tile).
cdef gqa_qk_gemm_fn prompt_qk_kernel(int type, int level, int H) noexcept nogil
# The types a float32 cache's K and V tiles are quantized to, a key tile at a time, for those
# kernels in a flash prompt at `level` (-1 and -1: float32 tiles).
cdef void float_tile_types(int level, int H, int *ktype, int *vtype) noexcept nogil
# The active tiles whose integer kernels qk_kernel / sv_kernel give for `type` at `level` with
# `tiles` (a caller brackets their calls on each thread by its begin / end), else NULL.
cdef const gqa_tiles *dot_tiles(int type, int level) noexcept nogil
# The active tiles whose bfloat16 kernels of float rows (qk_f / sv_f: no begin / end) qk_kernel /
# sv_kernel give for `type` at `level` with `tiles` and `rows` rows per call, else NULL.
cdef const gqa_tiles *float_tiles(int type, int level, int rows) noexcept nogil
# The active path's matrix tiles for flash tiles of heads of H columns at accuracy `level`:
# where this CPU runs them, level >= 3 and H a multiple of 16; else NULL.
cdef const gqa_tiles *tile_kernels(int level, int H) noexcept nogil
# Their `rows` (the flash plan's query tile on them), 0 where tile_kernels is NULL.
cdef int tile_rows(int level, int H) noexcept nogil
# What they leave multi-token steps of few rows (_plan.step_rows): 0 no tiles, 1 tiles that take
# every step, 2 tiles that leave few rows to the decode kernels (gqa_tiles.steps_direct).
cdef int tile_steps(int level, int H) noexcept nogil
# OpenMP's default team size (omp_get_max_threads), 1 in a build without OpenMP.
cdef int omp_max_threads() noexcept nogil
# The table's exp_sum, or the scalar path's where the table has none.
cdef gqa_exp_sum_fn exp_kernel(const gqa_kernels *t) noexcept nogil

# Round float32 values to the nearest binary16 value (half to even), in place.
cdef void round_to_half(float *x, size_t n) noexcept nogil
