/*
 * kernels_avx2_dot.h -- the AVX2 level-4 units' shared pieces (kernels_avx2_s8dot.c: INT8 / INT4
 * per tensor and per channel; kernels_avx2_gdot.c: per-group INT8 / INT4 / INT2): the query
 * rows' and probability rows' 15-bit codes of kernels_s8dot_contract.h, the widening of stored
 * codes to int16, the QK blocks' output stores, and the P @ V blocks over pairs of keys
 * (DOT_MADD: vpmaddwd + vpaddd, exact; sv_block_eo: INT4's even and odd columns apart).
 * ISA flags: the avx2 path's (-mavx2 -mfma -mf16c); included only by those units and their
 * builds as other units (DOT_UNIT below): the avxvnni unit (plus -mavxvnni) and
 * kernels_avx512vnni_gdot.c (the avx512 path's flags plus -mavx512vnni).
 */
#ifndef GQA_KERNELS_AVX2_DOT_H
#define GQA_KERNELS_AVX2_DOT_H

#include <float.h>
#if defined(GQA_EMULATE_AVX512)
#include "emu_avx512.h" /* tests/isa's emulation build of the avx512vnni unit: SIMDe */
#else
#include <immintrin.h>
#endif
#ifdef GQA_EMULATE_AVXVNNI
#include "emu_avxvnni.h" /* tests/isa's emulation build of the avxvnni unit */
#endif
#include "kernels_common.h"
#include "kernels_s8dot_contract.h"

/* The unit these sources are built for: DOT_UNIT, the suffix of their entries, and DOT_EXACT,
   the table whose exact kernels take the rows and types the contracts leave.  avx2 here;
   kernels_avxvnni_s8dot.c / kernels_avxvnni_gdot.c (avxvnni, the avx2 path's) and
   kernels_avx512vnni_gdot.c (avx512vnni, the avx512 path's) build them again. */
#ifndef DOT_UNIT
#define DOT_UNIT avx2
#define DOT_EXACT gqa_kernels_avx2
#endif
#define DOT_CAT(a, b) a##b
#define DOT_PASTE(a, b) DOT_CAT(a, b)
#define DOT_ENTRY(name) DOT_PASTE(name, DOT_UNIT)

extern const gqa_kernels DOT_EXACT;

/* The per-group kernels (kernels_avx2_gdot.c), which the unit's entries hand group types. */
void DOT_ENTRY(gqa_qk_gemm_g_dot_)(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                   const void *B, int type, const float *s, float *C, size_t ldc);
void DOT_ENTRY(gqa_sv_gemm_g_dot_)(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                                   int type, const float *s, float *C, size_t ldc, float beta);

/* acc + the pairwise int16 products of a and b, exact (int32 lanes; no sum here reaches 2^31):
   vpmaddwd + vpaddd, or one vpdpwssd where the unit has it: 256-bit EVEX under GQA_DOT_VNNI (the
   avx512vnni unit), VEX under GQA_DOT_AVXVNNI (the avxvnni unit).  vpdpwssd adds the two
   products to the lane without saturation, so every form gives the same bits. */
#if defined(GQA_DOT_VNNI)
#if !defined(GQA_EMULATE_AVX512) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
#error "GQA_DOT_VNNI needs -mavx512vnni -mavx512vl (or the tests' emulation build)"
#endif
#define DOT_MADD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(GQA_DOT_AVXVNNI)
#if !defined(GQA_EMULATE_AVXVNNI) && !defined(__AVXVNNI__)
#error "GQA_DOT_AVXVNNI needs -mavxvnni (or the tests' emulation build)"
#endif
#define DOT_MADD(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
#define DOT_MADD(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif

/* The first min(n, 8) lanes all ones: a maskload mask. */
INLINE __m256i lanes8(size_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INLINE int32_t hsum8_epi32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1)));
}

/* The low halves of v0..v3 summed (lanes 0-3 of the result, one per vector) and the high halves
   (lanes 4-7), exact. */
INLINE __m256i hsum4_halves(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    const __m256i w01 = _mm256_add_epi32(_mm256_unpacklo_epi32(v0, v1), _mm256_unpackhi_epi32(v0, v1));
    const __m256i w23 = _mm256_add_epi32(_mm256_unpacklo_epi32(v2, v3), _mm256_unpackhi_epi32(v2, v3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(w01, w23), _mm256_unpackhi_epi64(w01, w23));
}

/* Lane i = the sum of v_i's 8 lanes (exact). */
INLINE __m128i hsum4_epi32(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    const __m256i t = hsum4_halves(v0, v1, v2, v3);
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

INLINE float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* 16 int32 lanes (two vectors) -> 16 int16 in order (saturating; the values fit). */
INLINE __m256i pack16(__m256i lo, __m256i hi)
{
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
}

/* QK blocks of MB rows x NB keys (lane l: row l / NB, key n + l % NB): lanes g .. g + 3 of the
   outputs, v, stored straight into C when the block is whole (NB a multiple of 4: four keys of one
   row; NB = 2: two keys of two rows), else into out[g ..] for qk_store_rest. */
INLINE void qk_store_lanes(const int MB, const int NB, int g, __m128 v, size_t nv, float *C, size_t ldc, size_t n,
                           float *out)
{
    if (NB % 4 == 0 && nv == (size_t)NB) {
        _mm_storeu_ps(C + (g / NB) * ldc + n + g % NB, v);
    } else if (NB == 2 && nv == 2) {
        _mm_storel_pi((__m64 *)(C + (g / 2) * ldc + n), v);
        if (g + 2 < MB * NB)
            _mm_storeh_pi((__m64 *)(C + (g / 2 + 1) * ldc + n), v);
    } else {
        _mm_storeu_ps(out + g, v);
    }
}

/* The outputs qk_store_lanes left in out (a partial block: nv < NB keys) into C. */
INLINE void qk_store_rest(const int MB, const int NB, size_t nv, const float *out, float *C, size_t ldc, size_t n)
{
    if ((NB % 4 == 0 || NB == 2) && nv == (size_t)NB)
        return;
    UNROLL
    for (int mb = 0; mb < MB; mb++)
        for (size_t i = 0; i < nv; i++)
            C[mb * ldc + n + i] = out[mb * NB + i];
}

/* The kinds of codes the blocks widen (KIND): INT8 per tensor / channel (signed bytes), INT4's
   nibbles (unsigned, element 2i the low nibble of byte i), per-group INT8 (unsigned bytes) and
   INT2 (element 4i + j in bits 2j, 2j + 1 of byte i). */
enum { DOT_S8 = 0, DOT_U4 = 1, DOT_U8 = 2, DOT_U2 = 3 };

/* Bytes of 16 codes of a kind. */
#define DOT_BYTES16(KIND) ((KIND) == DOT_U4 ? 8 : (KIND) == DOT_U2 ? 4 : 16)

/* 16 codes from p as int16 in element order. */
INLINE __m256i widen16(const int KIND, const int8_t *p)
{
    if (KIND == DOT_S8)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    if (KIND == DOT_U8)
        return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    if (KIND == DOT_U4) {
        const __m128i x = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0F);
        const __m128i u = _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
        return _mm256_cvtepu8_epi16(u);
    }
    /* INT2: each byte to four lanes, shifted left by 6 - 2j (a multiply), then down by 6 */
    int32_t w;
    memcpy(&w, p, 4);
    const __m128i x = _mm_shuffle_epi8(_mm_cvtsi32_si128(w), _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m256i v = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(x), _mm256_setr_epi16(64, 16, 4, 1, 64, 16, 4, 1, 64, 16,
                                                                                     4, 1, 64, 16, 4, 1));
    return _mm256_and_si256(_mm256_srli_epi16(v, 6), _mm256_set1_epi16(3));
}

/* The sum of n int16 codes c[0, n) (n a multiple of 16), exact. */
static inline int32_t code_sum(const int16_t *c, size_t n)
{
    __m256i t = _mm256_setzero_si256();
    for (size_t k = 0; k < n; k += 16)
        t = DOT_MADD(t, _mm256_load_si256((const __m256i *)(c + k)), _mm256_set1_epi16(1));
    return hsum8_epi32(t);
}

/* Row a's codes into c (int16, padded with 0 to cs, a multiple of 16) and its multiplier; 0
   when the row takes the exact kernel (the contract's first case). */
static inline int qk_row(const float *a, size_t K, const float *s, int pc, float alpha, int16_t *c, size_t cs,
                  float *mult)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    /* whole vectors loaded plainly (the masked loads cost a prompt's tiles, which quantize each
       query row once per key tile, about 5 % of their time), the rest masked (lanes past K: 0) */
    const size_t K8 = K & ~(size_t)7;
    for (size_t k = 0; k < K; k += 8) {
        const __m256i m = lanes8(K - k);
        __m256 v = k < K8 ? _mm256_loadu_ps(a + k) : _mm256_maskload_ps(a + k, m);
        if (pc)
            v = _mm256_mul_ps(v, k < K8 ? _mm256_loadu_ps(s + k) : _mm256_maskload_ps(s + k, m));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
    }
    const float amax = hmax8(mx);
    if (_mm256_movemask_ps(bad) || !(amax <= FLT_MAX) || amax == 0.0f || !(QK_CODE_MAX / amax <= FLT_MAX))
        return 0;
    const float inv = QK_CODE_MAX / amax, sa = amax / QK_CODE_MAX;
    const __m256 vinv = _mm256_set1_ps(inv), lim = _mm256_set1_ps(QK_CODE_MAX), nlim = _mm256_set1_ps(-QK_CODE_MAX);
    for (size_t k = 0; k < cs; k += 16) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            const size_t kk = k + 8 * (size_t)h;
            const __m256i m = lanes8(K > kk ? K - kk : 0); /* lanes past the row: 0 */
            __m256 v = kk < K8 ? _mm256_loadu_ps(a + kk) : _mm256_maskload_ps(a + kk, m);
            if (pc)
                v = _mm256_mul_ps(v, kk < K8 ? _mm256_loadu_ps(s + kk) : _mm256_maskload_ps(s + kk, m));
            v = _mm256_round_ps(_mm256_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[h] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, lim), nlim));
        }
        _mm256_store_si256((__m256i *)(c + k), pack16(q[0], q[1]));
    }
    *mult = pc ? alpha * sa : (alpha * sa) * s[0];
    return 1;
}

/* inv and sp of a probability row; 0 when the row takes the exact kernel (the contract's first
   case). */
static inline int sv_row(const float *a, size_t K, float *inv, float *sp)
{
    const __m256 zero = _mm256_setzero_ps();
    __m256 mx, bad, m4[4] = {zero, zero, zero, zero}, b4[4] = {zero, zero, zero, zero};
    size_t k = 0;
    /* not (v >= 0): negative or NaN; an infinite element becomes the maximum.  Four chains
       (max and or are exact in any order; one chain was bound by vmaxps' latency) */
    for (; k + 32 <= K; k += 32) {
        UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256 v = _mm256_loadu_ps(a + k + 8 * j);
            b4[j] = _mm256_or_ps(b4[j], _mm256_cmp_ps(v, zero, _CMP_NGE_UQ));
            m4[j] = _mm256_max_ps(m4[j], v);
        }
    }
    mx = _mm256_max_ps(_mm256_max_ps(m4[0], m4[1]), _mm256_max_ps(m4[2], m4[3]));
    bad = _mm256_or_ps(_mm256_or_ps(b4[0], b4[1]), _mm256_or_ps(b4[2], b4[3]));
    for (; k + 8 <= K; k += 8) {
        const __m256 v = _mm256_loadu_ps(a + k);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, zero, _CMP_NGE_UQ));
        mx = _mm256_max_ps(mx, v);
    }
    if (k < K) {
        const __m256 v = _mm256_maskload_ps(a + k, lanes8(K - k)); /* lanes past the row: 0 */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, zero, _CMP_NGE_UQ));
        mx = _mm256_max_ps(mx, v);
    }
    const float pmax = hmax8(mx);
    if (_mm256_movemask_ps(bad) || pmax == 0.0f || !(pmax <= FLT_MAX))
        return 0;
    *inv = SV_CODE_MAX / pmax;
    *sp = pmax / SV_CODE_MAX;
    return *inv <= FLT_MAX;
}

/* The P @ V contract's row taking (kernels_s8dot.h's twin for the AVX-512 units): up to max
   rows from *m0 on that the contract covers, with their inv and sp (sv_row), their indices into
   rows; each other row is computed by the unit's exact sv_gemm on the spot (scales s).  *m0 moves
   past the last row looked at; returns the count. */
static inline int sv_take_rows(size_t M, size_t *m0, int max, size_t N, size_t K, const float *A, size_t lda,
                               const void *B, int type, const float *s, float *C, size_t ldc, float beta,
                               size_t *rows, float *inv, float *sp)
{
    int mb = 0;
    for (; *m0 < M && mb < max; ++*m0) {
        if (sv_row(A + *m0 * lda, K, &inv[mb], &sp[mb]))
            rows[mb++] = *m0;
        else
            DOT_EXACT.sv_gemm(1, N, K, A + *m0 * lda, lda, B, type, s, C + *m0 * ldc, ldc, beta);
    }
    return mb;
}

/* int16 codes min(32767, rint(fl(a[k] inv))) of a[0, n) into c[0, n rounded up to 16), 0 past n:
   vcvtps2dq rounds half to even (the MXCSR default), and vpackssdw's saturation is the min
   (the products are >= 0). */
static inline void sv_codes(const float *a, size_t n, float inv, int16_t *c)
{
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + k), vinv));
        const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + k + 8), vinv));
        _mm256_store_si256((__m256i *)(c + k), pack16(q0, q1));
    }
    if (k < n) {
        const __m256 v0 = _mm256_maskload_ps(a + k, lanes8(n - k));
        const __m256 v1 = _mm256_maskload_ps(a + k + 8, lanes8(n - k > 8 ? n - k - 8 : 0));
        _mm256_store_si256((__m256i *)(c + k), pack16(_mm256_cvtps_epi32(_mm256_mul_ps(v0, vinv)),
                                                      _mm256_cvtps_epi32(_mm256_mul_ps(v1, vinv))));
    }
}

#define SV_MB 4
#define SV_PFR 64
#ifndef SV_ROWS_IN_L2
#define SV_ROWS_IN_L2 0
#endif

/* The step of keys k, k + 1 (rows r0, r1 of ldb bytes): their rows SV_PFR keys ahead prefetched
   (decode streams V from memory; prefetches never fault), and p[i] = the pair (codes_i[k],
   codes_i[k + 1]) of rows i < MB of codes (stride SV_KS + 16) in every int32 lane.  Rows longer
   than a line are prefetched into L2, the others into L1; where the driver brings each chunk of
   rows into L2 ahead (SV_ROWS_IN_L2: kernels_avx2_gdot.c's gsv), into L1 (per-group INT8 g32
   16/8/128, decode steps from DRAM: into L2 0.92-0.95x).  Zen 4 running the avx2 path, 8192
   keys from DRAM: into L2, P @ V alone (one thread) ran 1.3-1.9x faster at INT8 H = 128 and 256,
   and decode steps (2 threads, 16 layers' caches in turn) 1.03-1.35x at INT8 16/8/128, 8/1/256
   and 4/1/256; INT4 H = 256 level; at H = 64 INT8 was level and INT4 (32-byte rows) 0.92-0.95x. */
INLINE void sv_step(const int MB, const int16_t *codes, size_t k, const int8_t *r0, const int8_t *r1, size_t ldb,
                    __m256i *p)
{
    if (!SV_ROWS_IN_L2 && ldb > 64) {
        _mm_prefetch((const char *)(r0 + SV_PFR * ldb), _MM_HINT_T1);
        _mm_prefetch((const char *)(r1 + SV_PFR * ldb), _MM_HINT_T1);
    } else {
        _mm_prefetch((const char *)(r0 + SV_PFR * ldb), _MM_HINT_T0);
        _mm_prefetch((const char *)(r1 + SV_PFR * ldb), _MM_HINT_T0);
    }
    UNROLL
    for (int i = 0; i < MB; i++) {
        int32_t pair;
        memcpy(&pair, codes + i * (SV_KS + 16) + k, 4);
        p[i] = _mm256_set1_epi32(pair);
    }
}

/* The 8 int32 sums of lanes (t < 4 ? t : t + 4) and (t < 4 ? t + 4 : t + 8) (sv_block's lo / hi
   order) as 16 sums in order: out[0] columns 0..7, out[1] 8..15. */
INLINE void sv_order(__m256i lo, __m256i hi, __m256i out[2])
{
    out[0] = _mm256_permute2x128_si256(lo, hi, 0x20);
    out[1] = _mm256_permute2x128_si256(lo, hi, 0x31);
}

/* The P @ V contract's finish of 8 columns (kernels_s8dot_contract.h): c's new values
   (first ? (beta == 0 ? 0 : fl(beta c)) : c) + fl(float(d) scale), scale = fl(sp s[n]). */
INLINE __m256 sv_finish8(__m256 c, __m256i d, __m256 scale, float beta, int first)
{
    if (first)
        c = beta == 0.0f ? _mm256_setzero_ps() : _mm256_mul_ps(_mm256_set1_ps(beta), c);
    return _mm256_add_ps(c, _mm256_mul_ps(_mm256_cvtepi32_ps(d), scale));
}

/* 16 sums c into d: stored (first) or added. */
INLINE void sv_store16(int32_t *d, const __m256i c[2], int first)
{
    UNROLL
    for (int j = 0; j < 2; j++) {
        __m256i *q = (__m256i *)(d + 8 * j);
        _mm256_storeu_si256(q, first ? c[j] : _mm256_add_epi32(_mm256_loadu_si256(q), c[j]));
    }
}

/* Keys [k, k + kn) (kn even, codes padded) against 16 NV columns of B at b (rows of ldb bytes;
   INT4: the columns' nibbles u), for rows i < MB of codes (stride SV_KS + 16); the int32 sums
   added to D[i][16 NV] (column order).  Two keys at a time: their 16-column rows widened to int16
   and interleaved by in-lane
   word unpacks, so that lane t of `lo` holds the two keys' codes of column (t < 4 ? t : t + 4)
   and of `hi` column (t < 4 ? t + 4 : t + 8); one DOT_MADD per vector and row with the row's two
   codes broadcast.  |one pair's products| <= 2 * 32767 * 128, SV_KS / 2 of them < 2^31.  first: the
   sums are stored into D rather than added. */
INLINE void sv_block(const int MB, const int NV, const int KIND, const int16_t *codes, size_t kn, const int8_t *b,
                     size_t ldb, int32_t *D, size_t ldd, int first)
{
    __m256i lo[SV_MB][4], hi[SV_MB][4];
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int j = 0; j < NV; j++)
            lo[i][j] = hi[i][j] = _mm256_setzero_si256();
    for (size_t k = 0; k < kn; k += 2) {
        const int8_t *r0 = b + k * ldb, *r1 = r0 + ldb;
        __m256i p[SV_MB];
        sv_step(MB, codes, k, r0, r1, ldb, p);
        UNROLL
        for (int j = 0; j < NV; j++) {
            const __m256i x0 = widen16(KIND, r0 + DOT_BYTES16(KIND) * j), x1 = widen16(KIND, r1 + DOT_BYTES16(KIND) * j);
            const __m256i ul = _mm256_unpacklo_epi16(x0, x1), uh = _mm256_unpackhi_epi16(x0, x1);
            UNROLL
            for (int i = 0; i < MB; i++) {
                lo[i][j] = DOT_MADD(lo[i][j], p[i], ul);
                hi[i][j] = DOT_MADD(hi[i][j], p[i], uh);
            }
        }
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int j = 0; j < NV; j++) {
            __m256i c[2];
            sv_order(lo[i][j], hi[i][j], c);
            sv_store16(D + i * ldd + 16 * j, c, first);
        }
}

/* sv_block for INT4, NG groups of 32 columns at b (16 bytes of a row each): the low nibbles are
   the 16 even columns, the high ones the 16 odd columns, each widened once (no interleave) and
   paired across the two keys as in sv_block; the even and odd sums are put back in column
   order at the end. */
INLINE void sv_block_eo(const int MB, const int NG, const int16_t *codes, size_t kn, const int8_t *b, size_t ldb,
                        int32_t *D, size_t ldd, int first)
{
    __m256i acc[2][2][4]; /* [row][group][even lo, even hi, odd lo, odd hi] */
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int g = 0; g < NG; g++)
            UNROLL
            for (int v = 0; v < 4; v++)
                acc[i][g][v] = _mm256_setzero_si256();
    const __m128i f = _mm_set1_epi8(0x0F);
    for (size_t k = 0; k < kn; k += 2) {
        const int8_t *r0 = b + k * ldb, *r1 = r0 + ldb;
        __m256i p[2];
        sv_step(MB, codes, k, r0, r1, ldb, p);
        UNROLL
        for (int g = 0; g < NG; g++) {
            const __m128i x0 = _mm_loadu_si128((const __m128i *)(r0 + 16 * g));
            const __m128i x1 = _mm_loadu_si128((const __m128i *)(r1 + 16 * g));
            const __m256i e0 = _mm256_cvtepu8_epi16(_mm_and_si128(x0, f));
            const __m256i o0 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x0, 4), f));
            const __m256i e1 = _mm256_cvtepu8_epi16(_mm_and_si128(x1, f));
            const __m256i o1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x1, 4), f));
            const __m256i u[4] = {_mm256_unpacklo_epi16(e0, e1), _mm256_unpackhi_epi16(e0, e1),
                                  _mm256_unpacklo_epi16(o0, o1), _mm256_unpackhi_epi16(o0, o1)};
            UNROLL
            for (int i = 0; i < MB; i++)
                UNROLL
                for (int v = 0; v < 4; v++)
                    acc[i][g][v] = DOT_MADD(acc[i][g][v], p[i], u[v]);
        }
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int g = 0; g < NG; g++) {
            __m256i ev[2], od[2]; /* even columns 0, 2, .., 30 and odd 1, .., 31, as two halves */
            sv_order(acc[i][g][0], acc[i][g][1], ev);
            sv_order(acc[i][g][2], acc[i][g][3], od);
            int32_t *d = D + i * ldd + 32 * g;
            UNROLL
            for (int h = 0; h < 2; h++) { /* columns 16 h .. 16 h + 15 */
                __m256i c[2];
                sv_order(_mm256_unpacklo_epi32(ev[h], od[h]), _mm256_unpackhi_epi32(ev[h], od[h]), c);
                sv_store16(d + 16 * h, c, first);
            }
        }
}

/* Keys per pass over the columns: 16 KiB of B (rows of `bytes`), so that each column block finds
   the keys' rows in L1 (an even count, at least 32). */
static inline size_t sv_pass_keys(size_t bytes)
{
    size_t kp = 16384 / (bytes ? bytes : 1);
    kp = kp < 32 ? 32 : kp > SV_KS ? SV_KS : kp;
    return kp & ~(size_t)1;
}

#endif
