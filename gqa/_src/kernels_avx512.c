/*
 * kernels_avx512.c -- path `avx512`.  ISA flags: -mavx512f -mavx512bw -mavx512dq
 * -mavx512vl -mavx2 -mfma -mf16c (never -mavx512vnni: the approximate VNNI QK kernel
 * is its own unit, kernels_avx512vnni.c, whose entry this table holds where the build
 * compiled it, GQA_HAVE_AVX512VNNI; dispatch.c calls it only where the CPU has VNNI).
 * Likewise the tiles, kernels_amx.c (GQA_HAVE_AMX) and kernels_avx512bf16.c
 * (GQA_HAVE_AVX512BF16), handed out by gqa_path_tiles.
 *
 * Same operations and layouts as gqa_kernels.h, 16 float32 lanes at a time;
 * tails use AVX-512 masked loads/stores (masked-off lanes read as 0).
 *  - quantize: x * (1/s), round-to-nearest-even (vrndscaleps), clamp with
 *    min/max ordered so that NaN -> hi; identical codes to the scalar path.
 *    INT4: nibbles q+8 paired inside 64-bit lanes and narrowed with vpmovqb;
 *    an odd width's pad nibble is 8.
 *  - dequantize: code * s, one rounding, bit-identical to the scalar path.
 *    dequantize_t (flash K tiles; group rows decoded 16 at a time first): 16 x 16 blocks
 *    transposed in registers,
 *    column blocks outer so each pass fills 16 destination rows front to back;
 *    the ragged edges are the same blocks with masked loads and stores.
 *  - GEMMs read B as unscaled codes.  Per-tensor scales multiply the finished
 *    dot product ((alpha * s) * sum(a * q)); per-channel scales are folded into
 *    A for qk_gemm (A[m,k] * s[k], one rounding per product) and applied per
 *    column after each key chunk for sv_gemm.  INT4: 32 nibbles per 16-byte
 *    load, looked up (vpermps) in a 16-entry table nib -> nib - 8: low nibbles =
 *    even elements, high nibbles = odd ones; qk_gemm reorders A to match (each
 *    32-element block: even, then odd), sv_gemm restores the column order
 *    before the store.
 *  - qk_gemm: register blocks of MB (<= 4; M = 8 runs as 4 + 4) rows of A x NB
 *    rows of B, 16 accumulators (1x16 2x8 3x5 4x4).  Each B chunk is converted
 *    to float once and used for every row of the block.  The K tail is one more
 *    masked step of the same loop; every accumulator is reduced by the same
 *    tree (hsum16x16: 16 sums in 45 operations, 15 of them shuffles), so C[m,n] depends only on row m
 *    of A, row n of B and K -- never on M, N or blocking.
 *  - sv_gemm: blocks of MB (<= 8) rows of C x NV * 16 columns (<= 24
 *    accumulators, the last block masked).  Keys go in chunks of a fixed KC per
 *    type (16 KiB of B at a head size of 128), so a chunk stays in L1 while
 *    every column block reads it and a column's value never depends on N or M.
 *    beta 0 overwrites C (NaN in C ignored), beta 1 accumulates, any other beta
 *    scales C first.
 *  - Both GEMMs prefetch B like the AVX2 path (decode streams the cache).
 *  - qk_gemm_s8_approx, qk_gemm_s8_dot, sv_gemm_s8_dot: kernels_avx512vnni.c.
 *  - exp_sum: the AVX2 path's exp on 16 lanes (identical values), masked tail.
 *  - row_max: 16-lane maxima, NaN skipped (exact), masked tail.
 *  - rope_row: 16 pairs a vector (interleaved: 8), fused as the contract states (the scalar
 *    path's bits), masked tail.
 *  - hadamard_rows: the AVX2 path's (kernels_avx2_hadamard.h, 256-bit).
 *
 * The emulation build of tests/isa (GQA_EMULATE_AVX512, never set by setup.py)
 * takes the intrinsics from SIMDe instead of <immintrin.h> so this code can run
 * on CPUs without AVX-512.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels_avx512.h"
#include "kernels_group.h"
#include "kernels_avx2_hadamard.h"
#define hadamard_rows_avx512 hadamard_rows_avx2

/* ---- quantize ------------------------------------------------------------ */

INLINE __m512i quant16_epi32(__m512 x, __m512 inv, __m512 lo, __m512 hi)
{
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(q, hi); /* vminps returns the 2nd operand for NaN -> hi */
    q = _mm512_max_ps(q, lo);
    return _mm512_cvtps_epi32(q);
}

/* 1/s per lane, 1 where s == 0 (masked-off lanes read s = 0 -> 1). */
INLINE __m512 inv_scale16(const float *s, __mmask16 m)
{
    __m512 v = _mm512_maskz_loadu_ps(m, s);
    __mmask16 zero = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ);
    __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), v);
    return _mm512_mask_blend_ps(zero, inv, _mm512_set1_ps(1.0f));
}

/* Group rows -> float32 (kernels_group.h): 16 codes at a time when the group is a multiple
   of 16 columns (bytes replicated, shifted into place, masked), else the portable decoder;
   x = code * scale + zero as a product then a sum, like the reference (bit for bit). */
static void group_decode_row_avx512(const uint8_t *row, float *dst, size_t cols, int type)
{
    const unsigned b = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type);
    if (g % 16) {
        gqa_group_decode_row_ref(row, dst, cols, type);
        return;
    }
    const uint8_t *meta = row + cols * b / 8;
    const __m128i rep = b == 8 ? _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                      : b == 4 ? _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)
                               : _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i shift = b == 8 ? _mm512_setzero_si512()
                        : b == 4 ? _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4)
                                 : _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6);
    const __m512i mask = _mm512_set1_epi32((1 << b) - 1);
    for (size_t gi = 0; gi * g < cols; gi++) {
        float s, z;
        gqa_group_meta(meta, gi, type, &s, &z);
        const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z);
        for (size_t c = gi * g; c < (gi + 1) * g; c += 16) {
            __m128i bytes;
            if (b == 8) {
                bytes = _mm_loadu_si128((const __m128i *)(row + c));
            } else if (b == 4) {
                uint64_t w;
                memcpy(&w, row + c / 2, 8);
                bytes = _mm_cvtsi64_si128((long long)w);
            } else {
                uint32_t w;
                memcpy(&w, row + c / 4, 4);
                bytes = _mm_cvtsi32_si128((int)w);
            }
            __m512i q = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, rep));
            q = _mm512_and_si512(_mm512_srlv_epi32(q, shift), mask);
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(q), vs);
            _mm512_storeu_ps(dst + c, _mm512_add_ps(f, vz));
        }
    }
}

GQA_GROUP_OPS(avx512, group_decode_row_avx512)

static void quantize_avx512(const float *src, size_t lda, void *dst, size_t rows,
                            size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { gqa_group_quantize(src, lda, dst, rows, cols, type, s); return; }
    const size_t rb = gqa_row_bytes(type, cols);
    if (type == GQA_F32) {
        for (size_t r = 0; r < rows; r++)
            memcpy((uint8_t *)dst + r * rb, src + r * lda, rb);
        return;
    }
    if (type == GQA_F16) {
        for (size_t r = 0; r < rows; r++) {
            const float *x = src + r * lda;
            uint8_t *d = (uint8_t *)dst + r * rb;
            for (size_t c = 0; c < cols; c += 16) {
                __mmask16 m = mask16(cols - c < 16 ? cols - c : 16);
                __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + c),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_mask_storeu_epi16(d + 2 * c, m, h);
            }
        }
        return;
    }
    const int s4 = GQA_IS_S4(type), pc = GQA_IS_PC(type);
    const __m512 lo = _mm512_set1_ps(s4 ? -8.0f : -128.0f), hi = _mm512_set1_ps(s4 ? 7.0f : 127.0f);
    const __m512 inv_pt = _mm512_set1_ps(gqa_inv_scale(s[0]));
    const __m512i eight = _mm512_set1_epi32(8);
    for (size_t r = 0; r < rows; r++) {
        const float *x = src + r * lda;
        uint8_t *d = (uint8_t *)dst + r * rb;
        for (size_t c = 0; c < cols; c += 16) {
            const size_t n = cols - c < 16 ? cols - c : 16;
            const __mmask16 m = mask16(n);
            __m512i q = quant16_epi32(_mm512_maskz_loadu_ps(m, x + c), pc ? inv_scale16(s + c, m) : inv_pt,
                                      lo, hi);
            if (!s4) {
                _mm512_mask_cvtsepi32_storeu_epi8(d + c, m, q);
            } else {
                /* nibble = q + 8 (8 in lanes past the row: the pad nibble);
                   64-bit lane i holds nibbles 2i (low half) and 2i+1 (high
                   half): its low byte after n | n >> 28 is n[2i] | n[2i+1] << 4. */
                __m512i nib = _mm512_mask_add_epi32(eight, m, q, eight);
                __m512i b = _mm512_or_si512(nib, _mm512_srli_epi64(nib, 28));
                _mm512_mask_cvtepi64_storeu_epi8(d + c / 2, (__mmask8)mask16((n + 1) / 2), b);
            }
        }
    }
}

/* ---- element loads --------------------------------------------------------- */

/* Elements [k, k + 16) in order (k even), unscaled; with `masked` only the first
   n are read and the rest are 0. */
INLINE __m512 dec16(const int elem, const uint8_t *row, size_t k, const int masked, size_t n)
{
    const __mmask16 m = masked ? mask16(n) : (__mmask16)0xFFFF;
    switch (elem) {
    case GQA_EL_S8: {
        __m128i v = masked ? _mm_maskz_loadu_epi8(m, row + k) : _mm_loadu_si128((const __m128i *)(row + k));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
    }
    case GQA_EL_S4: {
        __m128i v = masked ? _mm_maskz_loadu_epi8(mask16((n + 1) / 2), row + k / 2)
                           : _mm_loadl_epi64((const __m128i *)(row + k / 2));
        const __m128i lo4 = _mm_set1_epi8(0x0F);
        __m128i e = _mm_unpacklo_epi8(_mm_and_si128(v, lo4), _mm_and_si128(_mm_srli_epi16(v, 4), lo4));
        __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(e), _mm512_set1_epi32(8)));
        return masked ? _mm512_maskz_mov_ps(m, f) : f; /* a pad nibble past n would give -8 */
    }
    case GQA_EL_F32: {
        const float *p = (const float *)(const void *)row + k;
        return masked ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
    }
    default: {
        __m256i h = masked ? _mm256_maskz_loadu_epi16(m, row + 2 * k)
                           : _mm256_loadu_si256((const __m256i *)(row + 2 * k));
        return _mm512_cvtph_ps(h);
    }
    }
}

/* Elements [k, k + 16) of a packed row as float32 (k % 16 == 0): dec16, scaled for
   per-channel types (unscaled codes for per-tensor ones, see gqa_post_scale).  With
   `masked`, only the first n elements are read and the rest are 0. */
INLINE __m512 load16(const uint8_t *row, size_t k, const int type, const float *s, const int masked,
                     size_t n)
{
    const __m512 f = dec16(gqa_element(type), row, k, masked, n);
    if (!GQA_IS_PC(type))
        return f;
    return _mm512_mul_ps(f, masked ? _mm512_maskz_loadu_ps(mask16(n), s + k) : _mm512_loadu_ps(s + k));
}

/* ---- dequantize ------------------------------------------------------------ */

INLINE void dequant_row(const uint8_t *row, float *d, size_t cols, const int type, const float *s)
{
    const __m512 vps = _mm512_set1_ps(gqa_post_scale(type, s));
    const int pt = type == GQA_S8_PT || type == GQA_S4_PT;
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m512 v = load16(row, c, type, s, 0, 16);
        _mm512_storeu_ps(d + c, pt ? _mm512_mul_ps(v, vps) : v);
    }
    if (c < cols) {
        __m512 v = load16(row, c, type, s, 1, cols - c);
        _mm512_mask_storeu_ps(d + c, mask16(cols - c), pt ? _mm512_mul_ps(v, vps) : v);
    }
}

GQA_DEQUANTIZE_BY_TYPE(avx512)

/* Rows r .. r+nr-1, columns c .. c+nc-1 (nr, nc <= 16; c % 16 == 0) of the packed
   rows, transposed into dst[(c + j) * ldd + r + i].  Missing rows read as 0 and
   are not stored; missing columns are not read (masked loads) nor stored. */
INLINE void deqt_block(const uint8_t *B, size_t rb, size_t r, size_t c, size_t nr, size_t nc, const int type,
                       const float *s, __m512 vps, float *dst, size_t ldd, const int partial)
{
    const int pt = type == GQA_S8_PT || type == GQA_S4_PT;
    __m512 v[16];
    UNROLL
    for (int i = 0; i < 16; i++) {
        if (partial && (size_t)i >= nr) {
            v[i] = _mm512_setzero_ps();
            continue;
        }
        __m512 x = load16(B + (r + i) * rb, c, type, s, partial, nc);
        v[i] = pt ? _mm512_mul_ps(x, vps) : x;
    }
    transpose16(v);
    const __mmask16 m = partial ? mask16(nr) : (__mmask16)0xFFFF;
    UNROLL
    for (int j = 0; j < 16; j++) {
        if (partial && (size_t)j >= nc)
            break;
        if (partial)
            _mm512_mask_storeu_ps(dst + (c + j) * ldd + r, m, v[j]);
        else
            _mm512_storeu_ps(dst + (c + j) * ldd + r, v[j]);
    }
}

#define DEQT_INST(T)                                                                                \
    static void deqt_##T(const void *src, float *dst, size_t ldd, size_t rows, size_t cols,          \
                         const float *s)                                                             \
    {                                                                                                \
        const uint8_t *B = (const uint8_t *)src;                                                     \
        const size_t rb = gqa_row_bytes(T, cols);                                                    \
        const __m512 vps = _mm512_set1_ps(gqa_post_scale(T, s));                                         \
        const size_t rfull = rows & ~(size_t)15, cfull = cols & ~(size_t)15;                         \
        /* column blocks outer: each pass fills 16 destination rows front to back */                 \
        for (size_t c = 0; c < cols; c += 16) {                                                      \
            const size_t nc = cols - c < 16 ? cols - c : 16;                                         \
            size_t r = 0;                                                                            \
            if (c < cfull)                                                                           \
                for (; r < rfull; r += 16)                                                           \
                    deqt_block(B, rb, r, c, 16, 16, T, s, vps, dst, ldd, 0);                         \
            for (; r < rows; r += 16)                                                                \
                deqt_block(B, rb, r, c, rows - r < 16 ? rows - r : 16, nc, T, s, vps, dst, ldd, 1);  \
        }                                                                                            \
    }
DEQT_INST(GQA_S8_PT) DEQT_INST(GQA_S8_PC) DEQT_INST(GQA_S4_PT) DEQT_INST(GQA_S4_PC) DEQT_INST(GQA_F32)
DEQT_INST(GQA_F16)

typedef void (*deqt_fn)(const void *, float *, size_t, size_t, size_t, const float *);
static const deqt_fn deqt_fns[6] = {deqt_GQA_S8_PT, deqt_GQA_S8_PC, deqt_GQA_S4_PT,
                                    deqt_GQA_S4_PC, deqt_GQA_F32, deqt_GQA_F16};

/* Group rows transposed (flash K tiles): 16 rows decoded (group_decode_row_avx512, the
   decoder's bits) into a tile, then 16 x 16 blocks transposed in registers as deqt_block does;
   rows of more than 256 columns or not a multiple of 16: kernels_group.h's driver. */
static void group_deqt_avx512(const void *src, float *dst, size_t ldd, size_t rows, size_t cols, int type)
{
    if (cols % 16 || cols > 256) {
        group_dequantize_t_avx512(src, dst, ldd, rows, cols, type);
        return;
    }
    float t[16 * 256];
    const size_t rb = gqa_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r += 16) {
        const size_t nr = rows - r < 16 ? rows - r : 16;
        for (size_t i = 0; i < nr; i++)
            group_decode_row_avx512((const uint8_t *)src + (r + i) * rb, t + i * cols, cols, type);
        const __mmask16 m = mask16(nr);
        for (size_t c = 0; c < cols; c += 16) {
            __m512 v[16];
            UNROLL
            for (int i = 0; i < 16; i++) /* missing rows read as 0 and are not stored */
                v[i] = (size_t)i < nr ? _mm512_loadu_ps(t + i * cols + c) : _mm512_setzero_ps();
            transpose16(v);
            UNROLL
            for (int j = 0; j < 16; j++)
                _mm512_mask_storeu_ps(dst + (c + j) * ldd + r, m, v[j]);
        }
    }
}

static void dequantize_t_avx512(const void *src, float *dst, size_t ldd, size_t rows,
                                size_t cols, int type, const float *s)
{
    if (GQA_IS_GROUP(type)) { group_deqt_avx512(src, dst, ldd, rows, cols, type); return; }
    deqt_fns[type](src, dst, ldd, rows, cols, s);
}

/* ---- decode for the GEMMs ---------------------------------------------------------
 *
 * The GEMM kernels read B as unscaled codes: per-tensor scales are applied to the
 * finished dot products, per-channel ones are folded into A for qk_gemm and applied
 * per column after the key sum for sv_gemm.  Four elements: */
/* (gqa_element of kernels_common.h: GQA_EL_S8, GQA_EL_S4, GQA_EL_F32, GQA_EL_F16) */


/* INT4 elements [k, k + 32) (k % 32 == 0) from one 16-byte load: v0 = the low
   nibbles (elements k, k+2, .., k+30), v1 = the high ones (k+1, .., k+31), each
   looked up in a 16-entry table nib -> nib - 8 (vpermps reads the low 4 bits of
   each index) -- two table lookups and a shift per 32 elements. */
INLINE void dec32_s4(const uint8_t *row, size_t k, __m512 *v0, __m512 *v1)
{
    const __m512 table = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f, 0.0f, 1.0f, 2.0f,
                                        3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + k / 2)));
    *v0 = _mm512_permutexvar_ps(z, table);
    *v1 = _mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), table);
}

/* ---- qk_gemm ----------------------------------------------------------------- */

/* 512 -> 256 bits: low half + high half. */
INLINE __m256 fold256(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* A block's sums h (lane m * NB + r: row m of A, row r of B) into C[m * ldc + r] for the first
   nb <= NB rows of B. */
INLINE void qk_store(const int MB, const int NB, const __m512 h, float *C, size_t ldc, size_t nb)
{
    if (nb == (size_t)NB && NB == 16) {
        _mm512_storeu_ps(C, h);
    } else if (nb == (size_t)NB && NB == 8) {
        _mm256_storeu_ps(C, _mm512_castps512_ps256(h));
        _mm256_storeu_ps(C + ldc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(h), 1)));
    } else {
        float out[16];
        _mm512_storeu_ps(out, h);
        UNROLL
        for (int m = 0; m < MB; m++)
            UNROLL
            for (int r = 0; r < NB; r++)
                if ((size_t)r < nb)
                    C[m * ldc + r] = out[m * NB + r];
    }
}

/* Rows of A as the qk kernels read them, for one block of rows: per-channel scales
   folded in (A[m,k] * s[k], one rounding per product like the scalar path's
   q * s), and for INT4 each 32-element block reordered as its even elements then
   its odd ones (the order of dec32_s4).  Returns the rows to use (A itself when
   nothing changes) and their stride. */
static const float *qk_prep(const float *A, size_t lda, int mb, size_t K, int type, const float *s, float *buf,
                            size_t *ld)
{
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    if (!pc && !s4) {
        *ld = lda;
        return A;
    }
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int m = 0; m < mb; m++) {
        const float *a = A + m * lda;
        float *o = buf + m * K;
        size_t k = 0;
        if (s4)
            for (; k + 32 <= K; k += 32) {
                __m512 x0 = _mm512_loadu_ps(a + k), x1 = _mm512_loadu_ps(a + k + 16);
                if (pc) {
                    x0 = _mm512_mul_ps(x0, _mm512_loadu_ps(s + k));
                    x1 = _mm512_mul_ps(x1, _mm512_loadu_ps(s + k + 16));
                }
                _mm512_storeu_ps(o + k, _mm512_permutex2var_ps(x0, ev, x1));
                _mm512_storeu_ps(o + k + 16, _mm512_permutex2var_ps(x0, od, x1));
            }
        for (; k < K; k += 16) {
            const __mmask16 msk = mask16(K - k < 16 ? K - k : 16);
            __m512 x = _mm512_maskz_loadu_ps(msk, a + k);
            if (pc)
                x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(msk, s + k));
            _mm512_mask_storeu_ps(o + k, msk, x);
        }
    }
    *ld = K;
    return buf;
}

#define QK_PF 4096

/* Rows n0 .. n1-1 of B (n1 - n0 a multiple of NB) against MB rows of A (prepared
   by qk_prep), NB rows at a time (MB * NB <= 24 accumulators).  Per accumulator:
   INT4 32-element steps (dec32_s4), then in-order 16-element steps, then one
   masked step for K % 16 (masked-off lanes read 0 from A and B); the fixed
   hsum16x16 tree and mult -- the same operations for every (m, n). */
INLINE void qk_block(const int MB, const int NB, const int elem, size_t n0, size_t n1, size_t K, float mult,
                     const float *A, size_t lda, const uint8_t *B, size_t rb, float *C, size_t ldc)
{
    const size_t K32 = elem == GQA_EL_S4 ? K & ~(size_t)31 : 0, K16 = K & ~(size_t)15;
    const __mmask16 mt = mask16(K - K16);
    const __m512 vm = _mm512_set1_ps(mult);
    for (size_t n = n0; n < n1; n += NB) {
        const uint8_t *Bn = B + n * rb;
        __m512 acc[16];
        UNROLL
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_ps();
        size_t k = 0;
        /* B streams from memory in decode: the block's rows QK_PF bytes ahead (float32
           rows: FLOAT_QK_PF, into L2), one prefetch per line spread over the steps (hardware
           prefetchers stop at page boundaries; prefetches never fault) */
        for (; k < K32; k += 32) {
            UNROLL
            for (int j = 0; j < (16 * NB + 63) / 64; j++)
                _mm_prefetch((const char *)Bn + QK_PF + k * NB / 2 + 64 * j, _MM_HINT_T0);
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                __m512 b0, b1;
                dec32_s4(Bn + nb * rb, k, &b0, &b1);
                UNROLL
                for (int mb = 0; mb < MB; mb++) {
                    acc[mb * NB + nb] = _mm512_fmadd_ps(_mm512_loadu_ps(A + mb * lda + k), b0, acc[mb * NB + nb]);
                    acc[mb * NB + nb] =
                        _mm512_fmadd_ps(_mm512_loadu_ps(A + mb * lda + k + 16), b1, acc[mb * NB + nb]);
                }
            }
        }
        for (; k < K16; k += 16) {
            const int bpe = elem == GQA_EL_S8 ? 1 : elem == GQA_EL_F32 ? 4 : elem == GQA_EL_F16 ? 2 : 0; /* S4: tail only */
            UNROLL
            for (int j = 0; j < (16 * NB * bpe + 63) / 64; j++)
                if (elem == GQA_EL_F32)
                    _mm_prefetch((const char *)Bn + FLOAT_QK_PF + k * NB * bpe + 64 * j, STREAM_HINT);
                else
                    _mm_prefetch((const char *)Bn + QK_PF + k * NB * bpe + 64 * j, _MM_HINT_T0);
            __m512 a[8];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = _mm512_loadu_ps(A + mb * lda + k);
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                __m512 b = dec16(elem, Bn + nb * rb, k, 0, 16);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm512_fmadd_ps(a[mb], b, acc[mb * NB + nb]);
            }
        }
        if (K16 < K)
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                __m512 b = dec16(elem, Bn + nb * rb, K16, 1, K - K16);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] =
                        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, A + mb * lda + K16), b, acc[mb * NB + nb]);
            }
        qk_store(MB, NB, _mm512_mul_ps(hsum16x16(acc), vm), C + n, ldc, NB);
    }
}

/* One function per (elem, MB, NB): the elem is a compile-time constant inside each.
   Blocks of at most 4 rows of A (M = 8 runs as 4 + 4: faster than 8 x 2 here).
   Wide shapes (rows of A x rows of B): 1x16 2x8 3x5 4x4, then MB x 1 for the last
   N % NB rows of B. */
#define QK_INST(T, MB, NB)                                                                         \
    static void qk_##T##_##MB##x##NB(size_t n0, size_t n1, size_t K, float mult, const float *A,   \
                                     size_t lda, const uint8_t *B, size_t rb, float *C, size_t ldc) \
    {                                                                                              \
        qk_block(MB, NB, T, n0, n1, K, mult, A, lda, B, rb, C, ldc);                               \
    }
#define QK_KIND(T)                                                                                 \
    QK_INST(T, 1, 16) QK_INST(T, 2, 8) QK_INST(T, 3, 5) QK_INST(T, 4, 4) QK_INST(T, 1, 1)          \
    QK_INST(T, 2, 1) QK_INST(T, 3, 1) QK_INST(T, 4, 1)                                             \
    static const qk_fn qk_wide_##T[5] = {0, qk_##T##_1x16, qk_##T##_2x8, qk_##T##_3x5, qk_##T##_4x4}; \
    static const qk_fn qk_narrow_##T[5] = {0, qk_##T##_1x1, qk_##T##_2x1, qk_##T##_3x1, qk_##T##_4x1};
typedef void (*qk_fn)(size_t, size_t, size_t, float, const float *, size_t, const uint8_t *, size_t, float *,
                      size_t);
QK_KIND(0) QK_KIND(1) QK_KIND(2) QK_KIND(3)
static const qk_fn *const qk_wide[4] = {qk_wide_0, qk_wide_1, qk_wide_2, qk_wide_3};
static const qk_fn *const qk_narrow[4] = {qk_narrow_0, qk_narrow_1, qk_narrow_2, qk_narrow_3};
static const int qk_nbs[5] = {0, 16, 8, 5, 4};

/* Prepared rows of A live on the stack up to this many floats (32 KiB). */
#define QK_STACK_FLOATS 8192

/* ---- per-group rows: table kernels -------------------------------------------------------
 * A group's values are looked up, not computed: its 16-entry table holds c * scale + zero for
 * every code c (2-bit: the 4 values repeated; one fused rounding), so a vpermps per 16
 * elements gives the dequantized values.  Elements come out of a block
 * in the order the lookups give them, and A is reordered to match once per call (qk) or the
 * accumulated columns are put back in order once per call (sv):
 *   INT4, 32-element blocks (16 bytes): the low nibbles (elements 0, 2, .., 30), then the high;
 *   INT2, 64-element blocks (16 bytes): lane l of lookup k is element 4l + k;
 *   INT2 in groups of 32 (G32), 32-element blocks (8 bytes, the block's group): the bytes in
 *   both halves of the lanes, so a vector holds two 8-lane lookups (lane l of 8-lane lookup k
 *   is element 4l + k);
 *   INT8, 16-element blocks: in order (convert, multiply, add: no table).
 * A block lies in one group (groups of a multiple of 32 / 64 / 16 columns; INT2 of 32).
 * C[m, n] depends only on row m of A, row (qk) or column (sv) n of B and K: qk sums each row's
 * products in a fixed order and reduces 16 sums at a time with the hsum16x16 tree. */

/* The lookup tables of group gi from the float32 (scale, zero) pairs at meta (a row's inline
   fp32 metadata, or fp16 metadata converted by group_f16_pairs): INT4 / INT2 t[0] = fma(i, s, z)
   for i = 0..15 (INT2: i mod 4), one rounding (the GEMMs' values may differ from the decoder's
   fl(fl(i * s) + z) by that rounding); INT8 t[0] = scale, t[1] = zero, broadcast. */
INLINE void group_tables(const uint8_t *meta, size_t gi, const unsigned b, __m512 *t)
{
    const float *f = (const float *)(const void *)meta + 2 * gi;
    const __m512 s = _mm512_set1_ps(f[0]), z = _mm512_set1_ps(f[1]);
    if (b == 8) {
        t[0] = s;
        t[1] = z;
    } else {
        const __m512 iota = b == 2 ? _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3)
                                   : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        t[0] = _mm512_fmadd_ps(iota, s, z);
    }
}

/* fp16 metadata: the ng pairs of a row converted to float32 at dst (2 ng floats, written in
   16-float steps; exact-size loads for 1, 2 and 4 pairs -- masked 16-bit loads measured slow
   per row).  The kernels convert a chunk of rows at a time, ahead of the table builds. */
INLINE void group_f16_pairs(const uint8_t *meta, size_t ng, float *dst)
{
    if (ng == 1) {
        _mm_storel_pi((__m64 *)(void *)dst, _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int *)(const void *)meta)));
        return;
    }
    if (ng == 2) {
        _mm_storeu_ps(dst, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)meta)));
        return;
    }
    if (ng == 4) {
        _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)meta)));
        return;
    }
    for (size_t i = 0; i < ng; i += 8) {
        const size_t n = ng - i < 8 ? ng - i : 8;
        _mm512_storeu_ps(dst + 2 * i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(2 * n), meta + 4 * i)));
    }
}

/* The 8 bytes at p (the fp16 pairs of two groups) in the low half of a vector. */
INLINE __m128i load8_lo(const uint8_t *p) { return _mm_loadl_epi64((const __m128i *)(const void *)p); }

/* The fp16 pairs of n rows (stride rb, the first at meta, ng pairs each) as float32 at dst,
   rows one after another (2 ng floats each): four rows per conversion where their pairs fill
   one (1 and 2 pairs a row), so the conversion costs about two instructions a row. */
INLINE void group_f16_rows(const uint8_t *meta, size_t rb, size_t n, size_t ng, float *dst)
{
    size_t r = 0;
    if (ng == 1)
        for (; r + 4 <= n; r += 4) {
            const uint8_t *m = meta + r * rb;
            __m128i h = _mm_cvtsi32_si128(*(const int *)(const void *)m);
            h = _mm_insert_epi32(h, *(const int *)(const void *)(m + rb), 1);
            h = _mm_insert_epi32(h, *(const int *)(const void *)(m + 2 * rb), 2);
            h = _mm_insert_epi32(h, *(const int *)(const void *)(m + 3 * rb), 3);
            _mm256_storeu_ps(dst + 2 * r, _mm256_cvtph_ps(h));
        }
    else if (ng == 2)
        for (; r + 4 <= n; r += 4) {
            const uint8_t *m = meta + r * rb;
            const __m128i a = _mm_unpacklo_epi64(load8_lo(m), load8_lo(m + rb));
            const __m128i c = _mm_unpacklo_epi64(load8_lo(m + 2 * rb), load8_lo(m + 3 * rb));
            _mm512_storeu_ps(dst + 4 * r, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1)));
        }
    for (; r < n; r++)
        group_f16_pairs(meta + r * rb, ng, dst + 2 * ng * r);
}

#define GROUP_QK_MAXK 1024

/* Rows per fp16 conversion chunk, and the floats of its buffer (pairs of up to
   GROUP_QK_MAXK / 16 groups per row). */
#define GROUP_CHUNK 64

/* Elements per block, and whether the table kernels take this type and width.  G32: INT2 in
   groups of 32, one group a block (32 elements from 8 bytes). */
INLINE size_t group_block(const unsigned b, const int G32) { return b == 8 ? 16 : b == 4 || G32 ? 32 : 64; }

/* Lanes per lookup in a block's element order: 16, or 8 for G32 (a 16-lane vector holds two
   8-lane lookups of one 8-byte group). */
INLINE size_t group_lanes(const int G32) { return G32 ? 8 : 16; }

static int group_fast_avx512(int type, size_t cols)
{
    const unsigned b = gqa_group_bits(type);
    const size_t g = gqa_group_cols(type), blk = group_block(b, 0);
    /* whole blocks in every group (so in every row), and rows of whole 32-column blocks of P @ V */
    return cols % 32 == 0 && (g % blk == 0 || (b == 2 && g == 32));
}

/* The decoded vectors of one block (x[0 .. blk/16), in lookup order) from its code bytes q8 and
   its group's tables t.  G32 (INT2 in groups of 32): the block's 8 bytes in both halves of the
   lanes, shifted per half, so vector v holds 8-lane lookups 2v (lanes 0-7) and 2v + 1. */
INLINE void group_lookup(const uint8_t *q8, const unsigned b, const int G32, const __m512 *t, __m512 *x)
{
    if (G32) {
        uint64_t w; /* rows of 96 columns with fp16 metadata leave q8 unaligned */
        memcpy(&w, q8, 8);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_set1_epi64x((long long)w));
        x[0] = _mm512_permutexvar_ps(
            _mm512_srlv_epi32(q, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2)), t[0]);
        x[1] = _mm512_permutexvar_ps(
            _mm512_srlv_epi32(q, _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6)), t[0]);
        return;
    }
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q8));
    if (b == 8) {
        x[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), t[0], t[1]);
    } else if (b == 4) {
        x[0] = _mm512_permutexvar_ps(q, t[0]);
        x[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), t[0]);
    } else {
        x[0] = _mm512_permutexvar_ps(q, t[0]);
        x[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 2), t[0]);
        x[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), t[0]);
        x[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 6), t[0]);
    }
}

/* Row m of A in lookup order (INT4: per 32-block evens then odds; INT2: per 64-block
   element 4l + k at 16k + l; G32: per 32-block element 4l + k at 8k + l). */
static void group_prep_a(const float *a, float *o, size_t K, const unsigned b, const int g32)
{
    if (b == 8) {
        memcpy(o, a, K * sizeof(float));
        return;
    }
    gqa_group_to_lookup_order(a, o, K, group_block(b, g32), 8 / b, group_lanes(g32));
}

/* MB rows of A (prepared) against rows [n0s, N) of B, NB rows at a time (MB * NB <= 16); FULL:
   N - n0s is a multiple of NB, else one block whose missing rows are computed on a repeat of its
   first row and never stored.  fp16 metadata is converted a chunk of rows at a time. */
INLINE void group_qk_block(const int MB, const int NB, const unsigned b, const int G32, const int FULL,
                           size_t n0s, size_t N, size_t K, float alpha, const float *Ap, const uint8_t *B, int type,
                           float *C, size_t ldc)
{
    const int f16 = (type & GQA_META_F16) != 0;
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, K), cb = K * b / 8;
    const size_t blk = group_block(b, G32);
    const int nv = (int)(blk / 16);
    const __m512 va = _mm512_set1_ps(alpha);
    const size_t ng = K / g, ch = GROUP_CHUNK / NB * NB; /* chunk: whole blocks */
    /* fp16: the chunk's conversion reads up to ch rows ahead, so the prefetches run that far
       further ahead (the rows it reads are in cache by then) */
    const size_t pf = QK_PF + (f16 ? ch * rb : 0);
    float scr[GROUP_CHUNK * 2 * (GROUP_QK_MAXK / 16)];
    for (size_t q0 = n0s; q0 < N; q0 += ch) {
    const size_t q1 = N - q0 < ch ? N : q0 + ch;
    if (f16)
        group_f16_rows(B + q0 * rb + cb, rb, q1 - q0, ng, scr);
    for (size_t n0 = q0; n0 < q1; n0 += NB) {
        const size_t nb = FULL ? (size_t)NB : N - n0;
        const uint8_t *rows[16], *meta[16]; /* NB <= 16 (a fixed size: no VLA in the loop) */
        UNROLL
        for (int r = 0; r < NB; r++) { /* rows past N repeat row n0: computed, never stored */
            const size_t n = n0 + (FULL || (size_t)r < nb ? (size_t)r : 0);
            rows[r] = B + n * rb;
            meta[r] = f16 ? (const uint8_t *)(scr + (n - q0) * 2 * ng) : rows[r] + cb;
        }
        __m512 acc[16];
        UNROLL
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_ps();
        /* B streams from memory in decode: every line of the block's rows QK_PF bytes ahead,
           once (rows of 80-96 bytes span two lines; hardware prefetchers stop at page
           boundaries; prefetches never fault) */
        {
            const char *p0 = (const char *)rows[0] + pf;
            const size_t span = (size_t)NB * rb;
            if (span <= 128 * (size_t)NB) {
                UNROLL
                for (int i = 0; i < 2 * NB; i++)
                    if (64 * (size_t)i < span)
                        _mm_prefetch(p0 + 64 * i, _MM_HINT_T0);
            } else {
                for (size_t off = 0; off < span; off += 64)
                    _mm_prefetch(p0 + off, _MM_HINT_T0);
            }
        }
        size_t gi = 0, gend = g; /* the group of block c */
        for (size_t c = 0; c < K; c += blk) {
            if (c == gend) {
                gi++;
                gend += g;
            }
            __m512 a[4][4];
            UNROLL
            for (int m = 0; m < MB; m++)
                UNROLL
                for (int v = 0; v < nv; v++)
                    a[m][v] = _mm512_loadu_ps(Ap + m * K + c + 16 * v);
            UNROLL
            for (int r = 0; r < NB; r++) {
                __m512 t[2], x[4];
                group_tables(meta[r], gi, b, t);
                group_lookup(rows[r] + c * b / 8, b, G32, t, x);
                UNROLL
                for (int v = 0; v < nv; v++)
                    UNROLL
                    for (int m = 0; m < MB; m++)
                        acc[m * NB + r] = _mm512_fmadd_ps(a[m][v], x[v], acc[m * NB + r]);
            }
        }
        qk_store(MB, NB, _mm512_mul_ps(hsum16x16(acc), va), C + n0, ldc, nb);
    }
    }
}

/* One function per (rows of A x rows of B, variant): full blocks of NB rows of B, then one block
   for the last N % NB (its missing rows computed on a repeat of its first row, never stored).
   Separate functions keep each variant's register allocation its own. */
typedef void (*gqk_fn)(size_t, size_t, float, const float *, const uint8_t *, int, float *, size_t);
#define GQK_INST(MB, NB, B_, P)                                                                      \
    static __attribute__((noinline)) void gqk_##MB##_##B_##_##P(size_t N, size_t K, float alpha,        \
        const float *ap, const uint8_t *B, int type, float *C, size_t ldc)                           \
    {                                                                                                \
        const size_t nw = N - N % NB;                                                                \
        group_qk_block(MB, NB, B_, P, 1, 0, nw, K, alpha, ap, B, type, C, ldc);                      \
        if (nw < N)                                                                                  \
            group_qk_block(MB, NB, B_, P, 0, nw, N, K, alpha, ap, B, type, C, ldc);                  \
    }
#define GQK_SHAPE(MB, NB) GQK_INST(MB, NB, 8, 0) GQK_INST(MB, NB, 4, 0) GQK_INST(MB, NB, 2, 0) GQK_INST(MB, NB, 2, 1)
GQK_SHAPE(1, 16) GQK_SHAPE(2, 8) GQK_SHAPE(3, 5) GQK_SHAPE(4, 4)
#define GQK_ROW(MB) {gqk_##MB##_8_0, gqk_##MB##_4_0, gqk_##MB##_2_0, gqk_##MB##_2_1}
/* [rows of A - 1][variant: INT8, INT4, INT2, INT2 in groups of 32] */
static const gqk_fn gqk_fns[4][4] = {GQK_ROW(1), GQK_ROW(2), GQK_ROW(3), GQK_ROW(4)};
#undef GQK_INST
#undef GQK_SHAPE
#undef GQK_ROW

/* The variant index of gqk_fns / gsv_fns. */
static int group_variant(int type)
{
    const unsigned b = gqa_group_bits(type);
    return b == 8 ? 0 : b == 4 ? 1 : gqa_group_cols(type) == 32 ? 3 : 2;
}

static void group_qk_fast_avx512(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                 const void *B, int type, float *C, size_t ldc)
{
    const unsigned b = gqa_group_bits(type);
    const int variant = group_variant(type);
    float ap[4 * GROUP_QK_MAXK];
    for (size_t m0 = 0; m0 < M; m0 += 4) {
        const size_t mb = M - m0 < 4 ? M - m0 : 4;
        for (size_t m = 0; m < mb; m++)
            group_prep_a(A + (m0 + m) * lda, ap + m * K, K, b, variant == 3);
        gqk_fns[mb - 1][variant](N, K, alpha, ap, (const uint8_t *)B, type, C + m0 * ldc, ldc);
    }
}

/* SV over columns [c0, c0 + 16 CB) for MB rows of A: accumulators in lookup order, put back
   in column order once at the end.  A block's tables are built once per row of B and group:
   consecutive blocks of one group share them. */
INLINE void group_sv_block(const int MB, const int CB, const unsigned b, const int G32, const int F16, size_t N,
                           size_t K, const float *A, size_t lda, const uint8_t *B, int type, float *C,
                           size_t ldc, float beta, size_t c0)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, N), cb = N * b / 8;
    const int blk = (int)group_block(b, G32), nv = blk / 16, nbk = 16 * CB / blk;
    const size_t g0 = c0 / g, ng = (c0 + 16 * (size_t)CB - 1) / g - g0 + 1;
    size_t rel[8]; /* block j's group, from g0 */
    for (int j = 0; j < nbk; j++)
        rel[j] = (c0 + (size_t)(j * blk)) / g - g0;
    __m512 acc[4][8];
    UNROLL
    for (int m = 0; m < MB; m++)
        UNROLL
        for (int v = 0; v < CB; v++)
            acc[m][v] = _mm512_setzero_ps();
    float scr[GROUP_CHUNK * 16];
    const size_t pf = QK_PF + (F16 ? GROUP_CHUNK * rb : 0); /* as in group_qk_block */
    for (size_t k0 = 0; k0 < K; k0 += GROUP_CHUNK) {
    const size_t k1 = K - k0 < GROUP_CHUNK ? K : k0 + GROUP_CHUNK;
    if (F16)
        group_f16_rows(B + k0 * rb + cb + 4 * g0, rb, k1 - k0, ng, scr);
    for (size_t k = k0; k < k1; k++) {
        const uint8_t *row = B + k * rb;
        const uint8_t *meta = F16 ? (const uint8_t *)(scr + 2 * ng * (k - k0)) : row + cb + 8 * g0;
        __m512 p[4], t[2];
        UNROLL
        for (int m = 0; m < MB; m++)
            p[m] = _mm512_set1_ps(A[m * lda + k]);
        UNROLL
        for (int j = 0; j < nbk; j++) {
            __m512 x[4];
            if (j == 0 || rel[j] != rel[j - 1])
                group_tables(meta, rel[j], b, t);
            group_lookup(row + (c0 + (size_t)(j * blk)) * b / 8, b, G32, t, x);
            UNROLL
            for (int v = 0; v < nv; v++)
                UNROLL
                for (int m = 0; m < MB; m++)
                    acc[m][j * nv + v] = _mm512_fmadd_ps(x[v], p[m], acc[m][j * nv + v]);
        }
        /* the rows stream from memory in decode: QK_PF bytes ahead, the first and the last
           byte of each */
        _mm_prefetch((const char *)row + pf, _MM_HINT_T0);
        if (rb > 64) /* shorter rows: every line holds a row's first byte */
            _mm_prefetch((const char *)row + pf + rb - 1, _MM_HINT_T0);
    }
    }
    const int per = b == 8 ? 1 : (int)(8 / b);
    for (int m = 0; m < MB; m++) {
        float t[128];
        UNROLL
        for (int v = 0; v < CB; v++)
            _mm512_storeu_ps(t + 16 * v, acc[m][v]);
        gqa_group_from_lookup_order(t, C + m * ldc + c0, nbk, blk, per, (int)group_lanes(G32), beta);
    }
}

/* One function per (rows of A x 16-column vectors, variant, metadata), as for qk. */
typedef void (*gsv_fn)(size_t, size_t, const float *, size_t, const uint8_t *, int, float *, size_t, float,
                       size_t);
#define GSV_INST(MB, CB, B_, P, F)                                                                   \
    static __attribute__((noinline)) void gsv_##MB##x##CB##_##B_##_##P##_##F(size_t N, size_t K,        \
        const float *A, size_t lda, const uint8_t *B, int type, float *C, size_t ldc, float beta,    \
        size_t c0)                                                                                   \
    {                                                                                                \
        group_sv_block(MB, CB, B_, P, F, N, K, A, lda, B, type, C, ldc, beta, c0);                   \
    }
#define GSV_KINDS(MB, CB, F) GSV_INST(MB, CB, 8, 0, F) GSV_INST(MB, CB, 4, 0, F) GSV_INST(MB, CB, 2, 0, F) \
    GSV_INST(MB, CB, 2, 1, F)
#define GSV_SHAPE(MB, CB) GSV_KINDS(MB, CB, 0) GSV_KINDS(MB, CB, 1)
GSV_SHAPE(1, 8) GSV_SHAPE(2, 8) GSV_SHAPE(1, 4) GSV_SHAPE(2, 4) GSV_SHAPE(3, 4) GSV_SHAPE(4, 4)
GSV_SHAPE(1, 2) GSV_SHAPE(2, 2) GSV_SHAPE(3, 2) GSV_SHAPE(4, 2)
#define GSV_ROW(MB, CB, F)                                                                           \
    {gsv_##MB##x##CB##_8_0_##F, gsv_##MB##x##CB##_4_0_##F, gsv_##MB##x##CB##_2_0_##F, gsv_##MB##x##CB##_2_1_##F}
/* [shape: 1x8 2x8 1x4 2x4 3x4 4x4 1x2 2x2 3x2 4x2][fp16 metadata][variant] (x2: the last 32
   columns of rows of 64 k + 32; never INT2 in groups of 64 or more, whose blocks are 64 wide) */
static const gsv_fn gsv_fns[10][2][4] = {
    {GSV_ROW(1, 8, 0), GSV_ROW(1, 8, 1)}, {GSV_ROW(2, 8, 0), GSV_ROW(2, 8, 1)},
    {GSV_ROW(1, 4, 0), GSV_ROW(1, 4, 1)}, {GSV_ROW(2, 4, 0), GSV_ROW(2, 4, 1)},
    {GSV_ROW(3, 4, 0), GSV_ROW(3, 4, 1)}, {GSV_ROW(4, 4, 0), GSV_ROW(4, 4, 1)},
    {GSV_ROW(1, 2, 0), GSV_ROW(1, 2, 1)}, {GSV_ROW(2, 2, 0), GSV_ROW(2, 2, 1)},
    {GSV_ROW(3, 2, 0), GSV_ROW(3, 2, 1)}, {GSV_ROW(4, 2, 0), GSV_ROW(4, 2, 1)}};
#undef GSV_INST
#undef GSV_KINDS
#undef GSV_SHAPE
#undef GSV_ROW

static void group_sv_fast_avx512(size_t M, size_t N, size_t K, const float *A, size_t lda,
                                 const void *B, int type, float *C, size_t ldc, float beta)
{
    const int variant = group_variant(type), f16 = (type & GQA_META_F16) != 0;
    const uint8_t *Bb = (const uint8_t *)B;
    size_t m0 = 0;
    while (m0 < M) {   /* blocks of rows: up to 2 over 128-column blocks, or up to 4 over 64 (and 32) */
        const size_t left = M - m0;
        const int cb8 = N % 128 == 0 && left <= 2;
        const size_t mb = left >= 4 ? 4 : left;
        for (size_t c0 = 0; c0 < N;) {
            const size_t w = cb8 ? 128 : N - c0 >= 64 ? 64 : 32;
            const int shape = w == 128 ? (int)mb - 1 : w == 64 ? 1 + (int)mb : 5 + (int)mb;
            gsv_fns[shape][f16][variant](N, K, A + m0 * lda, lda, Bb, type, C + m0 * ldc, ldc, beta, c0);
            c0 += w;
        }
        m0 += mb;
    }
}

static void qk_gemm_avx512(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                           const void *B, int type, const float *s, float *C, size_t ldc)
{
    GQA_GROUP_ENTRY(avx512, qk, group_fast_avx512(type, K) && K <= GROUP_QK_MAXK, GQA_QK_ARGS)
    if (K == 0) { /* contract: C zero-filled */
        for (size_t m = 0; m < M; m++)
            memset(C + m * ldc, 0, N * sizeof(float));
        return;
    }
    const int elem = gqa_element(type), prep = GQA_IS_PC(type) || GQA_IS_S4(type);
    const qk_fn *wide = qk_wide[elem], *narrow = qk_narrow[elem];
    const size_t rb = gqa_row_bytes(type, K);
    const float mult = alpha * gqa_post_scale(type, s);
    const uint8_t *Bb = (const uint8_t *)B;
    float stack_buf[QK_STACK_FLOATS];
    float *buf = stack_buf;
    size_t bm = gqa_row_block(M, 4);
    if (prep && bm * K > QK_STACK_FLOATS) {
        if (K <= QK_STACK_FLOATS) {
            bm = QK_STACK_FLOATS / K; /* fewer rows per block: the same values */
        } else if ((buf = (float *)malloc(bm * K * sizeof(float))) == NULL) {
            gqa_kernels_scalar.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc); /* out of memory */
            return;
        }
    }
    for (size_t m0 = 0; m0 < M; m0 += bm) {
        const int mb = (int)(M - m0 < bm ? M - m0 : bm);
        size_t ld;
        const float *a = qk_prep(A + m0 * lda, lda, mb, K, type, s, buf, &ld);
        float *c = C + m0 * ldc;
        const size_t nw = N - N % (size_t)qk_nbs[mb];
        wide[mb](0, nw, K, mult, a, ld, Bb, rb, c, ldc);
        narrow[mb](nw, N, K, mult, a, ld, Bb, rb, c, ldc);
    }
    if (buf != stack_buf)
        free(buf);
}

/* ---- sv_gemm ----------------------------------------------------------------- */

/* P @ V's prefetch of the next key chunk goes into L1 (T0) while the two chunks fit there, into
   L2 (STREAM_HINT) past SV_L1_CHUNK bytes of chunk, where it would evict the chunk that every
   column block reads again.  Zen 4, one thread, 8192 INT8 keys from DRAM (64 buffers in turn):
   H = 256 (32 KiB chunks) 1 row 1.2-1.6x and 8 rows 1.05-1.1x faster into L2, H = 64 and 128
   (<= 16 KiB) 1.0-1.17x slower; decode steps, 2 threads, 16 layers' caches in turn: H = 256
   INT8 1.03-1.08x faster, INT4 level. */
#define SV_L1_CHUNK 16384

/* Columns n0 .. n0 + 16 NV of C[mb, .] += scale[col] * sum_{k0 <= k < k1} A[mb, k] * B[k, col]
   for MB rows.  INT4 vectors come in pairs from dec32_s4 (the even columns of 32,
   then the odd ones; put back in order before the store).  `masked`: only the
   first np < 16 NV columns exist; vector v holds min(16, np - 16 v) of them or
   none (masked loads and stores, the same lane arithmetic).  Scale per column:
   `spc` (per channel) or `vs` (per tensor, 1 for float rows), applied once per key chunk.  `pf`: prefetch distance (bytes) for
   the rows of the next key chunk, 0 for none. */
INLINE void sv_block(const int MB, const int NV, const int elem, const int masked, size_t np, size_t k0,
                     size_t k1, const float *A, size_t lda, const uint8_t *B, size_t rb, size_t n0,
                     const float *spc, __m512 vs, float *C, size_t ldc, size_t pf)
{
    __m512 acc[24];
    UNROLL
    for (int i = 0; i < MB * NV; i++)
        acc[i] = _mm512_setzero_ps();
    size_t nv[8]; /* columns of each vector */
    UNROLL
    for (int v = 0; v < NV; v++)
        nv[v] = !masked ? 16 : np <= 16 * (size_t)v ? 0 : np - 16 * (size_t)v < 16 ? np - 16 * (size_t)v : 16;
    size_t pf0 = 0;
    const int npf = pf ? gqa_block_lines(gqa_element_bits(elem), n0, masked ? np : 16 * (size_t)NV, &pf0) : 0;
    pf0 += pf;
    const int to_l2 = pf > SV_L1_CHUNK;
    for (size_t k = k0; k < k1; k++) {
        const uint8_t *row = B + k * rb;
        for (int j = 0; j < npf; j++) /* the block's lines of the same row of the next key chunk */
            if (to_l2)
                _mm_prefetch((const char *)row + pf0 + 64 * j, STREAM_HINT);
            else
                _mm_prefetch((const char *)row + pf0 + 64 * j, _MM_HINT_T0);
        __m512 b[8];
        if (elem == GQA_EL_S4 && !masked && NV % 2 == 0) {
            UNROLL
            for (int v = 0; v < NV; v += 2)
                dec32_s4(row, n0 + 16 * v, &b[v], &b[v + 1]);
        } else {
            UNROLL
            for (int v = 0; v < NV; v++)
                b[v] = dec16(elem, row, n0 + 16 * v, masked, nv[v]);
        }
        UNROLL
        for (int mb = 0; mb < MB; mb++) {
            const __m512 a = _mm512_set1_ps(A[mb * lda + k]);
            UNROLL
            for (int v = 0; v < NV; v++)
                acc[mb * NV + v] = _mm512_fmadd_ps(a, b[v], acc[mb * NV + v]);
        }
    }
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    UNROLL
    for (int mb = 0; mb < MB; mb++) {
        if (elem == GQA_EL_S4 && !masked && NV % 2 == 0)
            UNROLL
            for (int v = 0; v < NV; v += 2) { /* even | odd columns -> in order */
                __m512 lo = _mm512_unpacklo_ps(acc[mb * NV + v], acc[mb * NV + v + 1]);
                __m512 hi = _mm512_unpackhi_ps(acc[mb * NV + v], acc[mb * NV + v + 1]);
                acc[mb * NV + v] = _mm512_permutex2var_ps(lo, lo_idx, hi);
                acc[mb * NV + v + 1] = _mm512_permutex2var_ps(lo, hi_idx, hi);
            }
        UNROLL
        for (int v = 0; v < NV; v++) {
            float *c = C + mb * ldc + n0 + 16 * v;
            if (masked) {
                const __mmask16 m = mask16(nv[v]);
                __m512 sc = spc ? _mm512_maskz_loadu_ps(m, spc + n0 + 16 * v) : vs;
                _mm512_mask_storeu_ps(c, m, _mm512_fmadd_ps(acc[mb * NV + v], sc, _mm512_maskz_loadu_ps(m, c)));
            } else {
                __m512 sc = spc ? _mm512_loadu_ps(spc + n0 + 16 * v) : vs;
                _mm512_storeu_ps(c, _mm512_fmadd_ps(acc[mb * NV + v], sc, _mm512_loadu_ps(c)));
            }
        }
    }
}

#define SV_INST(T, MB, NV)                                                                          \
    static void sv_##T##_##MB##x##NV(size_t np, size_t k0, size_t k1, const float *A, size_t lda,    \
                                     const uint8_t *B, size_t rb, size_t n0, const float *spc,      \
                                     __m512 vs, float *C, size_t ldc, size_t pf)                    \
    {                                                                                               \
        sv_block(MB, NV, T, 0, np, k0, k1, A, lda, B, rb, n0, spc, vs, C, ldc, pf);                 \
    }
#define SV_MASKED(T, MB)                                                                            \
    static void svm_##T##_##MB(size_t np, size_t k0, size_t k1, const float *A, size_t lda,          \
                               const uint8_t *B, size_t rb, size_t n0, const float *spc, __m512 vs,  \
                               float *C, size_t ldc, size_t pf)                                     \
    {                                                                                               \
        sv_block(MB, 1, T, 1, np, k0, k1, A, lda, B, rb, n0, spc, vs, C, ldc, pf);                  \
    }
/* The masked wide block of MB rows over float32 rows (GQA_EL_F32). */
#define SVW_F32(MB, NVW)                                                                            \
    static void svw_##MB(size_t np, size_t k0, size_t k1, const float *A, size_t lda, const uint8_t *B, \
                         size_t rb, size_t n0, const float *spc, __m512 vs, float *C, size_t ldc,      \
                         size_t pf)                                                                 \
    {                                                                                               \
        sv_block(MB, NVW, GQA_EL_F32, 1, np, k0, k1, A, lda, B, rb, n0, spc, vs, C, ldc, pf);       \
    }
typedef void (*sv_fn)(size_t, size_t, size_t, const float *, size_t, const uint8_t *, size_t, size_t,
                      const float *, __m512, float *, size_t, size_t);
/* Per row count MB: {wide block, 64-column block (none for MB > 6: 28+ accumulators
   would not fit the 32 registers), 32-column block, 16-column block, masked block}.
   Wide shapes (rows x 16-column vectors, accumulators <= 24): 1x8 2x8 3x6 4x4 5x4
   6x4 7x2 8x2.  Columns go to the widest block that fits them, so a head of 64 columns
   is one pass of MB x 4 accumulators, not four of MB x 1 (latency-bound on the FMA
   chains); a column's value never depends on the block it is in. */
#define SV_SET(T, MB, NVW, X4) \
    {sv_##T##_##MB##x##NVW, X4, sv_##T##_##MB##x2, sv_##T##_##MB##x1, svm_##T##_##MB}
#define SV_KIND(T)                                                                                  \
    SV_INST(T, 1, 8) SV_INST(T, 2, 8) SV_INST(T, 3, 6) SV_INST(T, 4, 4) SV_INST(T, 5, 4)            \
    SV_INST(T, 6, 4) SV_INST(T, 1, 4) SV_INST(T, 2, 4) SV_INST(T, 3, 4)                             \
    SV_INST(T, 1, 2) SV_INST(T, 2, 2) SV_INST(T, 3, 2) SV_INST(T, 4, 2)                             \
    SV_INST(T, 5, 2) SV_INST(T, 6, 2) SV_INST(T, 7, 2) SV_INST(T, 8, 2) SV_INST(T, 1, 1)            \
    SV_INST(T, 2, 1) SV_INST(T, 3, 1) SV_INST(T, 4, 1) SV_INST(T, 5, 1) SV_INST(T, 6, 1)            \
    SV_INST(T, 7, 1) SV_INST(T, 8, 1) SV_MASKED(T, 1) SV_MASKED(T, 2) SV_MASKED(T, 3)               \
    SV_MASKED(T, 4) SV_MASKED(T, 5) SV_MASKED(T, 6) SV_MASKED(T, 7) SV_MASKED(T, 8)                 \
    static const sv_fn sv_fns_##T[9][5] = {{0}, SV_SET(T, 1, 8, sv_##T##_1x4),                      \
        SV_SET(T, 2, 8, sv_##T##_2x4), SV_SET(T, 3, 6, sv_##T##_3x4), SV_SET(T, 4, 4, sv_##T##_4x4),  \
        SV_SET(T, 5, 4, sv_##T##_5x4), SV_SET(T, 6, 4, sv_##T##_6x4), SV_SET(T, 7, 2, 0),             \
        SV_SET(T, 8, 2, 0)};
SV_KIND(0) SV_KIND(1) SV_KIND(2) SV_KIND(3)
SVW_F32(1, 8) SVW_F32(2, 8) SVW_F32(3, 6) SVW_F32(4, 4) SVW_F32(5, 4) SVW_F32(6, 4) SVW_F32(7, 2) SVW_F32(8, 2)
static const sv_fn sv_wide_masked_f32[9] = {0, svw_1, svw_2, svw_3, svw_4, svw_5, svw_6, svw_7, svw_8};
/* Whether the last `tail` columns of float32 rows (after the wide blocks; tail < the wide
   block's width) take several of sv_gemm_avx512's narrow blocks: all but a tail of one 64- (MB
   <= 6), 32- or 16-column block or of one masked one. */
static inline int sv_tail_splits(size_t tail, int has64)
{
    return !(tail <= 16 || tail == 32 || (has64 && tail == 64));
}
static const sv_fn (*const sv_fns[4])[5] = {sv_fns_0, sv_fns_1, sv_fns_2, sv_fns_3};
static const int sv_nvw[9] = {0, 8, 8, 6, 4, 4, 4, 2, 2};
/* Keys per chunk, fixed per type so that the chunk boundaries (where partial sums
   meet C) never depend on M or N.  Codes: 16 KiB of B at N = 128.  float32 rows
   (the flash path's tiles, K <= 256): the whole tile, so C is read and written once
   (32 keys cost ~10% of the tile GEMM in C round trips). */
static const size_t sv_kc[6] = {128, 128, 256, 256, 256, 64};

static void sv_gemm_avx512(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                           int type, const float *s, float *C, size_t ldc, float beta)
{
    GQA_GROUP_ENTRY(avx512, sv, group_fast_avx512(type, N), GQA_SV_ARGS)
    const int elem = gqa_element(type);
    const size_t rb = gqa_row_bytes(type, N);
    const uint8_t *Bb = (const uint8_t *)B;
    const float *spc = GQA_IS_PC(type) ? s : NULL;
    const __m512 vs = _mm512_set1_ps(gqa_post_scale(type, s));
    sv_scale_rows(M, N, C, ldc, beta);
    const size_t kc = sv_kc[type];
    const size_t n32 = elem == GQA_EL_S4 ? N & ~(size_t)31 : 0, n16 = N & ~(size_t)15;
    /* float32 tiles with many rows (flash): 6 x 64-column blocks, 24 accumulators for
       10 loads per key (8 x 32 columns: 16 for 10), ~10% faster measured here */
    const size_t bm = gqa_row_block(M, elem == GQA_EL_F32 && M >= 16 ? 6 : 8);
    for (size_t k0 = 0; k0 < K; k0 += kc) {
        const size_t k1 = K - k0 < kc ? K : k0 + kc;
        for (size_t m0 = 0; m0 < M; m0 += bm) {
            const int mb = (int)(M - m0 < bm ? M - m0 : bm);
            const sv_fn *f = sv_fns[elem][mb];
            const float *a = A + m0 * lda;
            float *c = C + m0 * ldc;
            const size_t step = 16 * (size_t)sv_nvw[mb];
            /* first block of rows: each column block prefetches the lines of the next chunk's
               rows that start in its bytes (gqa_block_lines; gqa_sv_prefetches says where) */
            const size_t pf = m0 == 0 && k1 < K && gqa_sv_prefetches(elem, N, step) ? kc * rb : 0;
            /* INT4 blocks of 2+ vectors decode 32-column pairs: they stop at n32 */
            const size_t wide_end = elem == GQA_EL_S4 ? n32 : n16;
            size_t n = 0;
            for (; n + step <= wide_end; n += step)
                f[0](16, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
            if (elem == GQA_EL_F32 && sv_tail_splits(N - n, f[1] != 0)) {
                /* float32 rows whose last columns would take several narrow blocks (heads of 80,
                   96, 112 columns): one pass of the masked wide block, so each row is read once
                   (Zen 4, one thread, 8192 keys: 1 x 96 from DRAM 1.24x, from L3 1.28x; 2 x 80
                   1.1-1.2x).  Codes, whose chunks stay in L1 for every pass, measured 0.45-0.8x
                   with it. */
                sv_wide_masked_f32[mb](N - n, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
                continue;
            }
            for (; f[1] && n + 64 <= wide_end; n += 64)
                f[1](16, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
            for (; n + 32 <= wide_end; n += 32)
                f[2](16, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
            for (; n < n16; n += 16)
                f[3](16, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
            if (n < N)
                f[4](N - n, k0, k1, a, lda, Bb, rb, n, spc, vs, c, ldc, pf);
        }
    }
}

/* ---- exp_sum -------------------------------------------------------------------- */

/* exp(d), the same values as the AVX2 path's exp8: d = n ln2 + r, |r| <= ln2/2
   (two-constant Cody-Waite), exp(r) by the degree-6 Cephes expf polynomial (~1 ulp),
   times 2^n.  n = rint(d log2e) by the 1.5 * 2^23 shift (exact for |n| < 2^22, the
   value vroundps gives) and p * 2^n by vscalefps (one rounding, the value of p times
   2^n built in the exponent field), fewer operations than exp8's.  d below
   GQA_EXP_MIN (and -inf) gives exactly +0; NaN stays NaN (vmaxps / vminps return
   their second operand when one is NaN, and the compare is false). */
INLINE __m512 exp16(__m512 d)
{
    const __mmask16 keep = _mm512_cmp_ps_mask(d, _mm512_set1_ps(GQA_EXP_MIN), _CMP_NLT_UQ);
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23: x + magic - magic = rint(x), |x| < 2^22 */
    d = _mm512_max_ps(_mm512_set1_ps(GQA_EXP_MIN), d);
    d = _mm512_min_ps(_mm512_set1_ps(GQA_EXP_MAX), d);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(d, _mm512_set1_ps(GQA_EXP_LOG2E)), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(GQA_EXP_LN2_HI), d);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(GQA_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(GQA_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GQA_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GQA_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GQA_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GQA_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(GQA_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, p, n); /* p * 2^n, one rounding, as p * (float)2^n */
}

/* x[i] = exp(x[i] - m); the sum in 16 lanes (the tail masked: lanes past n are
   neither read, written nor summed), then 16 -> 8 and the AVX2 path's tree. */
static float exp_sum_avx512(float *x, size_t n, float m)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        const __mmask16 k = mask16(n - i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    float out[8];
    _mm256_storeu_ps(out, fold256(acc));
    return ((out[0] + out[1]) + (out[2] + out[3])) + ((out[4] + out[5]) + (out[6] + out[7]));
}

/* max_ps(x, m) is x > m ? x : m: a NaN x leaves m.  Four independent maxima; the
   tail under a mask. */
static float row_max_avx512(const float *x, size_t n)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
        m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 32), m2);
        m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 48), m3);
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    if (i < n) { /* lanes past n keep m1 */
        const __mmask16 k = mask16(n - i);
        m1 = _mm512_mask_max_ps(m1, k, _mm512_maskz_loadu_ps(k, x + i), m1);
    }
    /* no lane holds NaN (vmaxps returns its second operand, the lane's maximum so far, for a
       NaN load), so the in-register reduction is the scalar one's value (up to the sign of
       a zero maximum, which no caller tells apart) */
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* gqa_rope_pairs' bits, 16 pairs a vector (interleaved: 8), the last ones under a mask: x0' =
   fmsub(x0, c, x1 s) (= fma(x0, c, -(x1 s))), x1' = fmadd(x0, s, x1 c); interleaved pairs as
   (x0, x0) and (x1, x1) against (c, s) and (-s, c) (x1 (-s) = -(x1 s) exactly); each vector's
   loads before its stores (o may be x). */
static void rope_row_avx512(size_t r2, int interleaved, const float *x, const float *c, const float *s, float *o)
{
    if (!interleaved) {
        for (size_t i = 0; i < r2; i += 16) {
            const __mmask16 m = mask16(r2 - i < 16 ? r2 - i : 16);
            const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i), x1 = _mm512_maskz_loadu_ps(m, x + r2 + i);
            const __m512 vc = _mm512_maskz_loadu_ps(m, c + i), vs = _mm512_maskz_loadu_ps(m, s + i);
            const __m512 a = _mm512_fmsub_ps(x0, vc, _mm512_mul_ps(x1, vs));
            const __m512 b = _mm512_fmadd_ps(x0, vs, _mm512_mul_ps(x1, vc));
            _mm512_mask_storeu_ps(o + i, m, a);
            _mm512_mask_storeu_ps(o + r2 + i, m, b);
        }
        return;
    }
    /* lane 2 j: pair j's first (from the first operand), lane 2 j + 1: its second */
    const __m512i pairs = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    for (size_t i = 0; i < r2; i += 8) {
        const size_t n = r2 - i < 8 ? r2 - i : 8;
        const __mmask16 m = mask16(2 * n), mp = mask16(n);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + 2 * i);
        const __m512 vc = _mm512_maskz_loadu_ps(mp, c + i), vs = _mm512_maskz_loadu_ps(mp, s + i);
        const __m512 cs = _mm512_permutex2var_ps(vc, pairs, vs);
        const __m512 sc = _mm512_permutex2var_ps(_mm512_xor_ps(vs, _mm512_set1_ps(-0.0f)), pairs, vc);
        /* (x0, x0) and (x1, x1) of each pair */
        const __m512 x0 = _mm512_shuffle_ps(v, v, 0xA0), x1 = _mm512_shuffle_ps(v, v, 0xF5);
        _mm512_mask_storeu_ps(o + 2 * i, m, _mm512_fmadd_ps(x0, cs, _mm512_mul_ps(x1, sc)));
    }
}

/* The tiles, best first: AMX (kernels_amx.c), then AVX-512 BF16 dots (kernels_avx512bf16.c) */
#ifdef GQA_HAVE_AMX
extern const gqa_tiles gqa_tiles_amx;
#endif
#ifdef GQA_HAVE_AVX512BF16
extern const gqa_tiles gqa_tiles_avx512bf16;
#endif
#if defined(GQA_HAVE_AMX) || defined(GQA_HAVE_AVX512BF16)
static const gqa_tiles *const tiles_avx512[] = {
#ifdef GQA_HAVE_AMX
    &gqa_tiles_amx,
#endif
#ifdef GQA_HAVE_AVX512BF16
    &gqa_tiles_avx512bf16,
#endif
    NULL};
#define TILES_AVX512 tiles_avx512
#else
#define TILES_AVX512 NULL
#endif
#ifdef GQA_HAVE_AVX512VNNI
void gqa_qk_gemm_s8_approx_avx512vnni(size_t M, size_t N, size_t K, float alpha, const float *A,
                                      size_t lda, const void *B, int type, const float *s, float *C,
                                      size_t ldc);
void gqa_qk_gemm_s8_dot_avx512vnni(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                   const void *B, int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_s8_dot_avx512vnni(size_t M, size_t N, size_t K, const float *A, size_t lda,
                                   const void *B, int type, const float *s, float *C, size_t ldc,
                                   float beta);
GQA_KERNEL_TABLE(avx512, gqa_qk_gemm_s8_approx_avx512vnni, gqa_qk_gemm_s8_dot_avx512vnni,
                 gqa_sv_gemm_s8_dot_avx512vnni, TILES_AVX512)
#else
GQA_KERNEL_TABLE(avx512, NULL, NULL, NULL, TILES_AVX512)
#endif
#endif
