/*
 * kernels_avx2_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / GQA_G4 / GQA_G2, rows of
 * kernels_group.h's layout: codes, then each group's scale and zero as float32 or binary16):
 * QK and P @ V with 15-bit query rows and probabilities times scales, integer dots per group,
 * the per-group contracts of kernels_s8dot_contract.h bit for bit.
 * ISA flags: the avx2 path's (-mavx2 -mfma -mf16c); part of the avx2_s8dot unit (setup.py), whose
 * entries gqa_qk_gemm_s8_dot_avx2 / gqa_sv_gemm_s8_dot_avx2 hand group types here.  Every AVX2
 * CPU runs them.  The avxvnni unit (kernels_avxvnni_gdot.c) and the avx512 path's VNNI unit
 * (kernels_avx512vnni_gdot.c) build this source again (DOT_UNIT, kernels_avx2_dot.h: their
 * entries, each DOT_MADD one vpdpwssd, their path's exact kernels for what the contracts
 * leave); the latter replaces the drivers with its own 512-bit ones (GDOT_GSV, GDOT_GQK) and
 * keeps gqk for what they leave.  The integer sums are exact either way, so all give the
 * contracts' bits.
 *
 * QK: a step is 16 bytes of INT8 (16 codes, zero-extended), 16 of INT4 (32 codes: the low
 * nibbles the even elements, the high ones the odd), or 16 of INT2 (64 codes: element 4i + j from
 * bits 2j of byte i, taken phase by phase; 8 bytes where rows or groups do not fit), against the
 * query codes put in the same order (dot_order); DOT_MADD sums a group's products
 * exactly (INT2 in groups of 32: two groups a step, one per 128-bit half), hsum4_halves reduces
 * four (row, key) sums at a time, and the group's scale and zero of four keys finish them in
 * float32 in the contract's order (gqk_group).  P @ V: each chunk's metadata put in columns once,
 * four, two or one groups at a time by an in-register transpose (gsv_meta), the probability row
 * times each group's scales quantized per chunk of
 * SV_KG keys and group (gsv_rows), against the codes by the INT8 unit's blocks over pairs of keys
 * (sv_block; INT4 of one or two rows: sv_block_eo), plus the zeros' term in float32.  Calls of
 * PK_MIN_ROWS rows or more (a prompt's flash tiles) take the packed kernels (gpk_*, below) in
 * the units that keep these drivers (avx2, avxvnni).
 *
 * Layout: QK: A float32 [M, K] (lda), B rows [N] of gqa_row_bytes(type, K) bytes, C float32 [M, N]
 * (ldc), overwritten.  SV: A float32 [M, K] (lda), B rows [K] of gqa_row_bytes(type, N) bytes, C
 * float32 [M, N] (ldc), C = beta C + A @ deq(B).  Neither reads B past its last byte.
 */
#if defined(__x86_64__) || defined(_M_X64)
#define SV_ROWS_IN_L2 1 /* gsv prefetches each next chunk of V rows into L2 (sv_step) */
#include "kernels_avx2_dot.h"

/* The units that keep this file's drivers (avx2, avxvnni) take calls of many rows to the packed
   kernels below. */
#if !defined(GDOT_GQK) && !defined(GDOT_GSV)
#define GDOT_PACKED 1
#endif


/* The kind of a group type's codes. */
static int gdot_kind(int type)
{
    const unsigned b = gqa_group_bits(type);
    return b == 8 ? DOT_U8 : b == 4 ? DOT_U4 : DOT_U2;
}

/* ---- qk_gemm_s8_dot on group rows ----------------------------------------------------------- */

/* QK's INT2 in steps of 16 bytes (64 codes) where rows are a multiple of 64 and groups of 32
   or of a multiple of 64: half the widening of 8-byte steps.  With groups of 32 a step's int32
   sums hold group 2i in their low 128 bits and group 2i + 1 in their high ones. */
#define GQK_U2W 4

/* Codes c[0, n) in a step's element order (n a multiple of the step): INT4 the 16 even elements
   then the 16 odd ones of each 32; INT2 the elements 4i, then 4i + 1, 4i + 2, 4i + 3 of each 32
   (i < 8), or of each 64 (GQK_U2W, i < 16). */
static void dot_order(int16_t *c, size_t n, int kind)
{
    if (kind == DOT_U8)
        return;
    const int per = kind == DOT_U4 ? 2 : 4, w = kind == GQK_U2W ? 64 : 32;
    for (size_t k = 0; k < n; k += (size_t)w) {
        int16_t t[64];
        for (int j = 0; j < per; j++)
            for (int i = 0; i < w / per; i++)
                t[j * (w / per) + i] = c[k + per * i + j];
        memcpy(c + k, t, (size_t)w * sizeof(int16_t));
    }
}

/* One step of a row's codes at p for rows mb < MB of the query codes c (stride cs), in c's
   order: acc[mb * NB] += the products. */
INLINE void gqk_step(const int MB, const int NB, const int KIND, const uint8_t *p, const int16_t *c, size_t cs,
                     __m256i *acc)
{
    __m256i x[4];
    int nv = 2;
    if (KIND == GQK_U2W) {
        const __m128i v = _mm_loadu_si128((const __m128i *)p), f = _mm_set1_epi8(3);
        UNROLL
        for (int j = 0; j < 4; j++)
            x[j] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 2 * j), f));
        nv = 4;
    } else if (KIND == DOT_U8) {
        x[0] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
        nv = 1;
    } else if (KIND == DOT_U4) {
        const __m128i v = _mm_loadu_si128((const __m128i *)p), f = _mm_set1_epi8(0x0F);
        x[0] = _mm256_cvtepu8_epi16(_mm_and_si128(v, f));
        x[1] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), f));
    } else {
        const __m128i v = _mm_loadl_epi64((const __m128i *)p), f = _mm_set1_epi8(3);
        const __m128i t0 = _mm_and_si128(v, f), t1 = _mm_and_si128(_mm_srli_epi16(v, 2), f);
        const __m128i t2 = _mm_and_si128(_mm_srli_epi16(v, 4), f), t3 = _mm_and_si128(_mm_srli_epi16(v, 6), f);
        x[0] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(t0, t1));
        x[1] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(t2, t3));
    }
    UNROLL
    for (int mb = 0; mb < MB; mb++) {
        __m256i d = acc[mb * NB];
        UNROLL
        for (int j = 0; j < nv; j++)
            d = DOT_MADD(d, _mm256_load_si256((const __m256i *)(c + mb * cs + 16 * j)), x[j]);
        acc[mb * NB] = d;
    }
}

/* Scales and zeros of group j of four rows r[0..3] (metadata at byte cb of each). */
INLINE void gqk_meta4(const uint8_t *const *r, size_t cb, size_t j, int f16, __m128 *s, __m128 *z)
{
    __m128 lo, hi;
    if (f16) {
        int32_t w[4];
        for (int i = 0; i < 4; i++)
            memcpy(w + i, r[i] + cb + 4 * j, 4);
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
        lo = _mm256_castps256_ps128(v);
        hi = _mm256_extractf128_ps(v, 1);
    } else {
        lo = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(r[0] + cb + 8 * j)),
                          (const __m64 *)(r[1] + cb + 8 * j));
        hi = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(r[2] + cb + 8 * j)),
                          (const __m64 *)(r[3] + cb + 8 * j));
    }
    *s = _mm_shuffle_ps(lo, hi, 0x88);
    *z = _mm_shuffle_ps(lo, hi, 0xDD);
}

#define GQK_PF 4096

/* Lanes of a QK block (rows x keys): 16 where the unit has 32 vector registers (the avx512vnni
   build: GQK_WIDE, blocks of 2 x 8 and 4 x 4; Zen 4, one thread: 1.12-1.31x 2 x 4 and 4 x 2),
   else 12. */
#ifndef GQK_WIDE
#define GQK_WIDE 0
#endif
#define GQK_L (GQK_WIDE ? 16 : 12)

/* Group j's finish for the block's lanes (rows r of B): S[q] += s * float(D) + z * float(A_j) in
   the contract's order, with dj[q] the quad's four D_j.  The scales and zeros of the lanes' keys:
   keys 0-3 (NB >= 4: every quad of NB = 4; NB = 2: keys 0, 1, 0, 1), keys 4-7 (NB = 8: the odd
   quads). */
INLINE void gqk_group(const int MB, const int NB, const uint8_t *const *r, size_t cb, size_t j, int f16,
                      const __m128i *dj, const float *aq, __m128 *S)
{
    __m128 s[2], z[2];
    const uint8_t *k4[4] = {r[0], r[1], r[NB >= 4 ? 2 : 0], r[NB >= 4 ? 3 : 1]};
    gqk_meta4(k4, cb, j, f16, &s[0], &z[0]);
    if (NB == 8) {
        const uint8_t *k8[4] = {r[4 % NB], r[5 % NB], r[6 % NB], r[7 % NB]};
        gqk_meta4(k8, cb, j, f16, &s[1], &z[1]);
    }
    UNROLL
    for (int q = 0; q < MB * NB / 4; q++) {
        const int h = NB == 8 ? q % 2 : 0;
        const __m128 t = _mm_add_ps(_mm_mul_ps(s[h], _mm_cvtepi32_ps(dj[q])),
                                    _mm_mul_ps(z[h], _mm_loadu_ps(aq + j * GQK_L + 4 * q)));
        S[q] = _mm_add_ps(S[q], t);
    }
}

/* C[mb, n] for rows mb < MB of the codes c (stride cs) and the N rows of B, NB rows at a time (a
   last partial block repeats B's last row and stores only its own).  Lane i of quad q (the
   accumulators 4q .. 4q + 3) is row (4q + i) / NB and key (4q + i) % NB; mq[q] their
   multipliers, aq[j * GQK_L + l] lane l's float(A_j). */
INLINE void gqk_block(const int MB, const int NB, const int KIND, const int16_t *c, size_t cs, const uint8_t *B,
                      size_t N, size_t K, int type, const __m128 *mq, const float *aq, float *C, size_t ldc)
{
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, K), J = K / g;
    const size_t cb = K * gqa_group_bits(type) / 8, E = KIND == DOT_U8 ? 16 : KIND == GQK_U2W ? 64 : 32;
    const size_t SB = KIND == DOT_U2 ? 8 : 16;
    const int f16 = (type & GQA_META_F16) != 0, NQ = MB * NB / 4, span = g < E ? 2 : 1; /* groups a step holds */
    /* prefetch lines per step: the block's rows (contiguous) spread over its K / E steps */
    const size_t nl = (rb * NB + 64 * (K / E) - 1) / (64 * (K / E));
    for (size_t n = 0; n < N; n += (size_t)NB) {
        const size_t nv = N - n < (size_t)NB ? N - n : (size_t)NB;
        const uint8_t *r[8];
        UNROLL
        for (int nb = 0; nb < NB; nb++)
            r[nb] = B + (n + ((size_t)nb < nv ? (size_t)nb : nv - 1)) * rb;
        __m128 S[GQK_L / 4];
        UNROLL
        for (int q = 0; q < NQ; q++)
            S[q] = _mm_setzero_ps();
        const char *pf = (const char *)r[0] + GQK_PF;
        for (size_t j = 0; j < J; j += (size_t)span) {
            __m256i acc[GQK_L];
            UNROLL
            for (int i = 0; i < MB * NB; i++)
                acc[i] = _mm256_setzero_si256();
            for (size_t k = j * g; k < (j + (size_t)span) * g; k += E) {
                for (size_t l = 0; l < nl; l++, pf += 64)
                    _mm_prefetch(pf, _MM_HINT_T0);
                UNROLL
                for (int nb = 0; nb < NB; nb++)
                    gqk_step(MB, NB, KIND, r[nb] + k / E * SB, c + k, cs, acc + nb);
                UNROLL
                for (int i = 0; i < MB * NB; i++)
                    DOT_KEEP(acc[i]);
            }
            /* each quad's four sums per group: both halves of the accumulators (span 1), or the
               low halves for group j and the high ones for j + 1 (span 2) */
            __m256i d[GQK_L / 4];
            UNROLL
            for (int q = 0; q < NQ; q++)
                d[q] = hsum4_halves(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
            for (int h = 0; h < span; h++) {
                __m128i dj[GQK_L / 4];
                UNROLL
                for (int q = 0; q < NQ; q++)
                    dj[q] = span == 2 ? (h ? _mm256_extracti128_si256(d[q], 1) : _mm256_castsi256_si128(d[q]))
                                      : _mm_add_epi32(_mm256_castsi256_si128(d[q]), _mm256_extracti128_si256(d[q], 1));
                gqk_group(MB, NB, r, cb, j + (size_t)h, f16, dj, aq, S);
            }
        }
        float out[GQK_L];
        UNROLL
        for (int q = 0; q < NQ; q++)
            qk_store_lanes(MB, NB, 4 * q, _mm_mul_ps(S[q], mq[q]), nv, C, ldc, n, out);
        qk_store_rest(MB, NB, nv, out, C, ldc, n);
    }
}

#define GQK_INST(MB, NB, KIND)                                                                        \
    static void gqk_##MB##x##NB##_##KIND(const int16_t *c, size_t cs, const uint8_t *B, size_t N, size_t K, \
                                        int type, const __m128 *mq, const float *aq, float *C, size_t ldc) \
    {                                                                                                 \
        gqk_block(MB, NB, KIND, c, cs, B, N, K, type, mq, aq, C, ldc);                                \
    }
/* rows of A x rows of B per block (the INT8 unit's): 1x8 2x4 3x4 4x2; GQK_WIDE 1x8 2x8 3x4 4x4 */
#if GQK_WIDE
#define GQK_NB2 8
#define GQK_NB4 4
#else
#define GQK_NB2 4
#define GQK_NB4 2
#endif
#define GQK_KIND_(KIND, NB2, NB4)                                                                     \
    GQK_INST(1, 8, KIND) GQK_INST(2, NB2, KIND) GQK_INST(3, 4, KIND) GQK_INST(4, NB4, KIND)           \
    static const gqk_fn gqk_blocks_##KIND[5] = {NULL, gqk_1x8_##KIND, gqk_2x##NB2##_##KIND,           \
                                                gqk_3x4_##KIND, gqk_4x##NB4##_##KIND};
#define GQK_KIND__(KIND, NB2, NB4) GQK_KIND_(KIND, NB2, NB4)
#define GQK_KIND(KIND) GQK_KIND__(KIND, GQK_NB2, GQK_NB4)
typedef void (*gqk_fn)(const int16_t *, size_t, const uint8_t *, size_t, size_t, int, const __m128 *, const float *,
                       float *, size_t);
GQK_KIND(2) GQK_KIND(1) GQK_KIND(3) GQK_KIND(4) /* DOT_U8, DOT_U4, DOT_U2, GQK_U2W */
static const gqk_fn *const gqk_blocks[5] = {NULL, gqk_blocks_1, gqk_blocks_2, gqk_blocks_3, gqk_blocks_4};
static const int gqk_nb[5] = {0, 8, GQK_NB2, 4, GQK_NB4};

/* Rows m < mb (codes c, stride cs; mult[m]; asum[m * J + j] = A_j) against all of B. */
static void gqk_rows(int mb, int kind, const int16_t *c, size_t cs, const float *mult, const int32_t *asum, size_t J,
                     const uint8_t *B, size_t N, size_t K, int type, float *C, size_t ldc)
{
    const int nb = gqk_nb[mb];
    __m128 mq[GQK_L / 4];
    float aq[DOT_QK_K / 32 * GQK_L];
    for (int q = 0; q < mb * nb / 4; q++) {
        float m4[4];
        for (int i = 0; i < 4; i++)
            m4[i] = mult[(4 * q + i) / nb];
        mq[q] = _mm_loadu_ps(m4);
    }
    for (size_t j = 0; j < J; j++)
        for (int l = 0; l < mb * nb; l++)
            aq[j * GQK_L + l] = (float)asum[(l / nb) * J + j];
    gqk_blocks[kind][mb](c, cs, B, N, K, type, mq, aq, C, ldc);
}

static void gqk(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const uint8_t *B, int type,
                float *C, size_t ldc)
{
    int16_t c[4 * DOT_QK_K] __attribute__((aligned(32)));
    const size_t g = gqa_group_cols(type), J = K / g, cs = K; /* K is a multiple of 32 */
    int kind = gdot_kind(type);
    if (kind == DOT_U2 && K % 64 == 0 && (g == 32 || g % 64 == 0))
        kind = GQK_U2W;
    const float one = 1.0f; /* the per-tensor multiplier's scale: mult = fl(alpha * sa) */
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[4];
        float mult[4];
        int32_t asum[4 * (DOT_QK_K / 32)];
        int mb = 0;
        for (; m0 < M && mb < 4; ++m0) {
            int16_t *cm = c + mb * cs;
            if (qk_row(A + m0 * lda, K, &one, 0, alpha, cm, cs, &mult[mb])) {
                for (size_t j = 0; j < J; j++)
                    asum[mb * J + j] = code_sum(cm + j * g, g);
                dot_order(cm, K, kind);
                rows[mb++] = m0;
            } else {
                DOT_EXACT.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc);
            }
        }
        if (mb == 0)
            continue;
        if (rows[mb - 1] - rows[0] == (size_t)(mb - 1))
            gqk_rows(mb, kind, c, cs, mult, asum, J, B, N, K, type, C + rows[0] * ldc, ldc);
        else
            for (int i = 0; i < mb; i++)
                gqk_rows(1, kind, c + i * cs, cs, mult + i, asum + i * J, J, B, N, K, type, C + rows[i] * ldc, ldc);
    }
}

/* ---- sv_gemm_s8_dot on group rows ----------------------------------------------------------- */

/* 4, 2 or 1 groups' (scale, zero) pairs of one row's metadata at p, as float32 (8, 4 or 2
   floats; the last two lanes of gsv_pairs2 are not used). */
INLINE __m256 gsv_pairs8(const uint8_t *p, int f16)
{
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)) : _mm256_loadu_ps((const float *)(const void *)p);
}

INLINE __m128 gsv_pairs4(const uint8_t *p, int f16)
{
    return f16 ? _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)) : _mm_loadu_ps((const float *)(const void *)p);
}

INLINE __m128 gsv_pairs2(const uint8_t *p, int f16)
{
    if (f16) {
        int32_t w;
        memcpy(&w, p, 4);
        return _mm_cvtph_ps(_mm_cvtsi32_si128(w));
    }
    return _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(const void *)p);
}

/* sc[i * SV_KG + k], zc[i * SV_KG + k] = the scale and zero of group jb + i (i < nj: 4, 2 or 1) of
   rows k < kn of B (rb bytes each, metadata at byte cb): 8 rows' pairs loaded whole and
   transposed in registers; rows past kn read as 0. */
static void gsv_meta(const uint8_t *B, size_t rb, size_t cb, size_t jb, int nj, int f16, size_t kn, float *sc,
                     float *zc)
{
    const uint8_t *base = B + cb + (f16 ? 4 : 8) * jb;
    const __m256 zero = _mm256_setzero_ps();
    for (size_t k = 0; k < kn; k += 8) {
        __m256 c[8];
        if (nj == 1) { /* rows of 2 floats: keys 0, 1 | 4, 5 and 2, 3 | 6, 7 paired, then split */
            __m128 q[8];
            for (int i = 0; i < 8; i++)
                q[i] = k + (size_t)i < kn ? gsv_pairs2(base + (k + i) * rb, f16) : _mm_setzero_ps();
            const __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_movelh_ps(q[0], q[1])),
                                                   _mm_movelh_ps(q[4], q[5]), 1);
            const __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_movelh_ps(q[2], q[3])),
                                                   _mm_movelh_ps(q[6], q[7]), 1);
            c[0] = _mm256_shuffle_ps(lo, hi, 0x88);
            c[1] = _mm256_shuffle_ps(lo, hi, 0xDD);
        } else if (nj == 4) { /* rows of 8 floats: an 8 x 8 transpose */
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++)
                r[i] = k + (size_t)i < kn ? gsv_pairs8(base + (k + i) * rb, f16) : zero;
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                c[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
                c[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
            }
        } else { /* rows of 4 floats, rows i and i + 4 in one register: 4 x 4 transposes */
            __m256 r[4], t[4];
            for (int i = 0; i < 4; i++) {
                const __m128 lo = k + (size_t)i < kn ? gsv_pairs4(base + (k + i) * rb, f16) : _mm_setzero_ps();
                const __m128 hi = k + (size_t)i + 4 < kn ? gsv_pairs4(base + (k + i + 4) * rb, f16) : _mm_setzero_ps();
                r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
            }
            t[0] = _mm256_unpacklo_ps(r[0], r[1]);
            t[1] = _mm256_unpackhi_ps(r[0], r[1]);
            t[2] = _mm256_unpacklo_ps(r[2], r[3]);
            t[3] = _mm256_unpackhi_ps(r[2], r[3]);
            c[0] = _mm256_shuffle_ps(t[0], t[2], 0x44);
            c[1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
            c[2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
            c[3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
        }
        for (int i = 0; i < nj; i++) { /* column 2i: group jb + i's scales, 2i + 1 its zeros */
            _mm256_storeu_ps(sc + i * SV_KG + k, c[2 * i]);
            _mm256_storeu_ps(zc + i * SV_KG + k, c[2 * i + 1]);
        }
    }
}

/* Rows i < MB's chunks a[i] (kn keys) against one group's scales sc and zeros zc: the codes of
   fl(a_k sc[k]) into codes[i] (padded with 0 to a multiple of 16), their sp[i], and the zeros'
   term Z[i] (the contract's eight-lane order), with w a scratch of MB rows of SV_KG floats.  The
   rows' sums of the zeros' term are independent chains of adds, interleaved (one row alone was
   bound by their latency). */
INLINE void gsv_rows(const int MB, const float *const *a, size_t kn, const float *sc, const float *zc, float *w,
                     int16_t *const *codes, float *sp, float *Z)
{
    __m256 mx[SV_MB], zs[SV_MB];
    UNROLL
    for (int i = 0; i < MB; i++)
        mx[i] = zs[i] = _mm256_setzero_ps();
    for (size_t k = 0; k < kn; k += 8) {
        const __m256 s = _mm256_loadu_ps(sc + k), z = _mm256_loadu_ps(zc + k); /* 0 past the chunk */
        UNROLL
        for (int i = 0; i < MB; i++) {
            /* lanes past the chunk: 0 */
            const __m256 p = kn - k >= 8 ? _mm256_loadu_ps(a[i] + k) : _mm256_maskload_ps(a[i] + k, lanes8(kn - k));
            const __m256 v = _mm256_mul_ps(p, s);
            mx[i] = _mm256_max_ps(mx[i], v);
            zs[i] = _mm256_add_ps(zs[i], _mm256_mul_ps(p, z));
            _mm256_storeu_ps(w + i * SV_KG + k, v);
        }
    }
    UNROLL
    for (int i = 0; i < MB; i++) {
        /* Z = ((Z0 + Z4) + (Z2 + Z6)) + ((Z1 + Z5) + (Z3 + Z7)) */
        __m128 x = _mm_add_ps(_mm256_castps256_ps128(zs[i]), _mm256_extractf128_ps(zs[i], 1));
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        Z[i] = _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
        const float wmax = hmax8(mx[i]), inv = SV_CODE_MAX / wmax;
        if (wmax > 0.0f && inv <= FLT_MAX) {
            sp[i] = wmax / SV_CODE_MAX;
            sv_codes(w + i * SV_KG, kn, inv, codes[i]);
        } else {
            sp[i] = 0.0f;
            memset(codes[i], 0, ((kn + 15) & ~(size_t)15) * sizeof(int16_t));
        }
    }
}

/* gsv_rows for mb <= SV_MB rows (the row count a constant in each instance). */
static void gsv_rows_n(int mb, const float *const *a, size_t kn, const float *sc, const float *zc, float *w,
                       int16_t *const *codes, float *sp, float *Z)
{
    switch (mb) {
    case 1: gsv_rows(1, a, kn, sc, zc, w, codes, sp, Z); break;
    case 2: gsv_rows(2, a, kn, sc, zc, w, codes, sp, Z); break;
    case 3: gsv_rows(3, a, kn, sc, zc, w, codes, sp, Z); break;
    default: gsv_rows(4, a, kn, sc, zc, w, codes, sp, Z); break;
    }
}

/* The per-group P @ V contract's finish of 8 columns: fl(fl(base + fl(float(d) sp)) + Z), base = c
   (later chunks), 0 or fl(beta c) (the first). */
INLINE __m256 gsv_finish8(__m256 c, __m256i d, __m256 sp, __m256 Z, float beta, int first)
{
    if (first)
        c = beta == 0.0f ? _mm256_setzero_ps() : _mm256_mul_ps(_mm256_set1_ps(beta), c);
    return _mm256_add_ps(_mm256_add_ps(c, _mm256_mul_ps(_mm256_cvtepi32_ps(d), sp)), Z);
}

/* crow[0, g) by gsv_finish8 from the int32 sums d[0, g). */
static void gsv_finish(const int32_t *d, size_t g, float sp, float Z, float beta, int first, float *crow)
{
    const __m256 vsp = _mm256_set1_ps(sp), vz = _mm256_set1_ps(Z);
    for (size_t n = 0; n < g; n += 8)
        _mm256_storeu_ps(crow + n, gsv_finish8(_mm256_loadu_ps(crow + n),
                                               _mm256_loadu_si256((const __m256i *)(d + n)), vsp, vz, beta, first));
}

/* Keys of the chunk after the one at k0 (0 at the last). */
static inline size_t gsv_next_keys(size_t K, size_t k0)
{
    return k0 + SV_KG < K ? (K - k0 - SV_KG < SV_KG ? K - k0 - SV_KG : SV_KG) : 0;
}

/* P @ V's driver: the one below, or the including unit's own (GDOT_GSV, declared here; it uses
   sv_take_rows, gsv_next_keys, gsv_meta, gsv_rows_n and gsv_finish above). */
#ifdef GDOT_GSV
static void GDOT_GSV(size_t M, size_t N, size_t K, const float *A, size_t lda, const uint8_t *B, int type, float *C,
                     size_t ldc, float beta);
#else
#define GDOT_GSV gsv

#define GSV_INST(MB, NV, KIND)                                                                        \
    static void gsv_##MB##x##NV##_##KIND(const int16_t *codes, size_t kn, const int8_t *b, size_t ldb,   \
                                        int32_t *D, size_t ldd, int first)                            \
    {                                                                                                 \
        sv_block(MB, NV, KIND, codes, kn, b, ldb, D, ldd, first);                                     \
    }
#define GSV_KIND(KIND)                                                                                \
    GSV_INST(1, 4, KIND) GSV_INST(1, 2, KIND) GSV_INST(2, 2, KIND) GSV_INST(3, 1, KIND) GSV_INST(4, 1, KIND) \
    static const sv_fn gsv_blocks_##KIND[SV_MB + 1][3] = {{NULL, NULL, NULL},                          \
                                                          {gsv_1x2_##KIND, gsv_1x4_##KIND, NULL},      \
                                                          {gsv_2x2_##KIND, NULL, NULL},                \
                                                          {gsv_3x1_##KIND, NULL, NULL},                \
                                                          {gsv_4x1_##KIND, NULL, NULL}};
typedef void (*sv_fn)(const int16_t *, size_t, const int8_t *, size_t, int32_t *, size_t, int);
GSV_KIND(2) GSV_KIND(3) /* DOT_U8, DOT_U2; DOT_U4's three and four rows: */
GSV_INST(3, 1, 1) GSV_INST(4, 1, 1)
static const int gsv_nv[SV_MB + 1] = {0, 2, 2, 1, 1};

/* INT4 with one or two rows: the even and odd columns apart (sv_block_eo), the same widths */
#define GSV_EO(MB, NG)                                                                                \
    static void gsv_eo_##MB##x##NG(const int16_t *codes, size_t kn, const int8_t *b, size_t ldb, int32_t *D, \
                                   size_t ldd, int first)                                            \
    {                                                                                                 \
        sv_block_eo(MB, NG, codes, kn, b, ldb, D, ldd, first);                                        \
    }
GSV_EO(1, 1) GSV_EO(1, 2) GSV_EO(2, 1)
static const sv_fn gsv_blocks_eo[SV_MB + 1][3] = {{NULL, NULL, NULL}, {gsv_eo_1x1, gsv_eo_1x2, NULL},
                                                  {gsv_eo_2x1, NULL, NULL}, {gsv_3x1_1, NULL, NULL},
                                                  {gsv_4x1_1, NULL, NULL}};

/* D[i][0, g) (rows of GDOT_GMAX) = the int32 sums of rows i < mb (codes, stride SV_KS + 16) over
   the kn keys of the g columns at b (rows of ldb bytes, `bits` a code). */
static void gsv_dots(int mb, int kind, size_t bits, const int16_t *codes, size_t kn, const uint8_t *b, size_t ldb,
                     size_t g, int32_t *D)
{
    const sv_fn *blocks = kind == DOT_U8 ? gsv_blocks_2[mb] : kind == DOT_U4 ? gsv_blocks_eo[mb] : gsv_blocks_3[mb];
    const int wide = mb == 1 && g % 64 == 0; /* one row: 64 columns a block */
    const size_t nvc = 16 * (size_t)(wide ? 4 : gsv_nv[mb]);
    const sv_fn blk = blocks[wide];
    const size_t ke = kn & ~(size_t)1;
    for (size_t n = 0; n < g; n += nvc)
        if (ke)
            blk(codes, ke, (const int8_t *)(b + n * bits / 8), ldb, D + n, GDOT_GMAX, 1);
        else
            for (int i = 0; i < mb; i++)
                memset(D + i * GDOT_GMAX + n, 0, nvc * sizeof(int32_t));
    if (kn & 1) { /* the last key, paired with a row of zeros (its pair's code is the pad's 0) */
        int8_t t[2][GDOT_GMAX] = {{0}};
        memcpy(t[0], b + ke * ldb, g * bits / 8);
        for (size_t n = 0; n < g; n += nvc)
            blk(codes + ke, 2, &t[0][0] + n * bits / 8, GDOT_GMAX, D + n, GDOT_GMAX, 0);
    }
}

static void gsv(size_t M, size_t N, size_t K, const float *A, size_t lda, const uint8_t *B, int type, float *C,
                size_t ldc, float beta)
{
    int16_t codes[SV_MB][SV_KS + 16] __attribute__((aligned(32)));
    int32_t D[SV_MB * GDOT_GMAX];
    float sc[4 * SV_KG], zc[4 * SV_KG], w[SV_MB * SV_KG];
    int16_t *const cr[SV_MB] = {codes[0], codes[1], codes[2], codes[3]};
    const size_t g = gqa_group_cols(type), J = N / g, rb = gqa_row_bytes(type, N), bits = gqa_group_bits(type);
    const size_t cb = N * bits / 8;
    const int kind = gdot_kind(type), f16 = (type & GQA_META_F16) != 0;
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[SV_MB];
        float inv[SV_MB], sp0[SV_MB]; /* sv_row's, unused: each chunk and group scales its own */
        const int mb = sv_take_rows(M, &m0, SV_MB, N, K, A, lda, B, type, NULL, C, ldc, beta, rows, inv, sp0);
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KG) {
            const size_t kn = K - k0 < SV_KG ? K - k0 : SV_KG;
            const uint8_t *bk = B + k0 * rb;
            const float *ar[SV_MB];
            for (int r = 0; r < mb; r++)
                ar[r] = A + rows[r] * lda + k0;
            /* the next chunk's rows, a J-th of their bytes per group (its metadata loads then hit),
               into L2: into L1 with the chunk being read (together more than L1) they evicted it
               (Zen 4, one thread, 2 x 128 INT8 g32 from memory: 1.25-1.4x) */
            const size_t next = gsv_next_keys(K, k0) * rb;
            for (size_t jb = 0, nj; jb < J; jb += nj) {
                /* groups jb .. jb + nj - 1: their metadata in columns once, then each group */
                nj = J - jb >= 4 ? 4 : J - jb >= 2 ? 2 : 1;
                gsv_meta(bk, rb, cb, jb, (int)nj, f16, kn, sc, zc);
                for (size_t i = 0; i < nj; i++) {
                    const size_t j = jb + i;
                    float sp[SV_MB], Z[SV_MB];
                    for (size_t o = next * j / J; o < next * (j + 1) / J; o += 64)
                        _mm_prefetch((const char *)(bk + SV_KG * rb + o), _MM_HINT_T1);
                    gsv_rows_n(mb, ar, kn, sc + i * SV_KG, zc + i * SV_KG, w, cr, sp, Z);
                    gsv_dots(mb, kind, bits, &codes[0][0], kn, bk + j * g * bits / 8, rb, g, D);
                    for (int r = 0; r < mb; r++)
                        gsv_finish(D + r * GDOT_GMAX, g, sp[r], Z[r], beta, k0 == 0, C + rows[r] * ldc + j * g);
                }
            }
        }
    }
}

#endif /* GDOT_GSV */

/* ---- calls of PK_MIN_ROWS rows or more: the packed operands of kernels_avx2_pack.h -----------
 *
 * The units with this file's own drivers (avx2, avxvnni; GDOT_PACKED).  QK: each block of 16 keys'
 * codes widened once into int16 pairs (pk_pack_keys, u as it is) and their scales and zeros in
 * columns (gpk_meta), then per register block of rows and group j the exact int32 dots over the
 * group's pairs (pk_dots) and gqk's finish of 16 keys at once: S = fl(S + fl(fl(s_j float(D_j)) +
 * fl(z_j float(A_j)))), C = fl(S mult).  P @ V: per chunk of SV_KG keys and group, every row's
 * probabilities times the group's scales quantized (gsv_rows, gsv_meta: the decode blocks' own),
 * each 16 columns of the group packed once into pairs of keys (pk_pack_values) and read by all
 * rows; finish gsv_finish8 from the registers.  The integer sums are exact, so the results are
 * the blocks' bits.  Stack: QK 63 KiB (codes 32, widened rows 8, Bq 16, metadata 2, A_j 2, the
 * rows' indices and multipliers 3); P @ V 54 KiB (codes 32, Bv 8.5, metadata columns 8, w 4,
 * the rows' 1.5). */
#ifdef GDOT_PACKED
#include "kernels_avx2_pack.h"

/* sm[j * 16 + i], zm[j * 16 + i] = the scale and zero of group j < J of key n0 + i (i < nv; past
   nv key n0 + nv - 1's, whose lanes are not stored), rows of rb bytes with their metadata at byte
   cb. */
static void gpk_meta(const uint8_t *B, size_t rb, size_t cb, size_t n0, size_t nv, size_t J, int f16, float *sm,
                     float *zm)
{
    const uint8_t *r[16];
    for (size_t i = 0; i < 16; i++)
        r[i] = B + (n0 + (i < nv ? i : nv - 1)) * rb;
    for (size_t j = 0; j < J; j++)
        for (size_t q = 0; q < 4; q++) {
            __m128 s, z;
            gqk_meta4(r + 4 * q, cb, j, f16, &s, &z);
            _mm_storeu_ps(sm + 16 * j + 4 * q, s);
            _mm_storeu_ps(zm + 16 * j + 4 * q, z);
        }
}

/* QK of MR rows (codes c, stride cs; multipliers mult; aj[i * J + j] = float(A_j) of row i)
   against one packed block of 16 keys (Bq, their metadata sm / zm), groups of g columns: the
   first nv keys' scores into out[i]. */
INLINE void gpk_qk_rows(const int MR, const int16_t *c, size_t cs, const float *mult, const float *aj, size_t J,
                        size_t g, float *const *out, const int32_t *Bq, const float *sm, const float *zm, size_t nv)
{
    __m256 S[2 * PK_MR];
    UNROLL
    for (int i = 0; i < 2 * MR; i++)
        S[i] = _mm256_setzero_ps();
    for (size_t j = 0; j < J; j++) {
        __m256i acc[2 * PK_MR];
        pk_dots(MR, c + j * g, cs, Bq + j * g * 8, g / 2, acc);
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256 s = _mm256_loadu_ps(sm + 16 * j + 8 * h), z = _mm256_loadu_ps(zm + 16 * j + 8 * h);
            UNROLL
            for (int i = 0; i < MR; i++) {
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(acc[2 * i + h])),
                                               _mm256_mul_ps(z, _mm256_set1_ps(aj[i * J + j])));
                S[2 * i + h] = _mm256_add_ps(S[2 * i + h], t);
            }
        }
    }
    UNROLL
    for (int i = 0; i < MR; i++) {
        const __m256 m = _mm256_set1_ps(mult[i]);
        pk_store16(out[i], _mm256_mul_ps(S[2 * i], m), _mm256_mul_ps(S[2 * i + 1], m), nv);
    }
}

#define GPK_QK_INST(MR)                                                                                \
    static void gpk_qk_##MR(const int16_t *c, size_t cs, const float *mult, const float *aj, size_t J,   \
                            size_t g, float *const *out, const int32_t *Bq, const float *sm,           \
                            const float *zm, size_t nv)                                                \
    {                                                                                                  \
        gpk_qk_rows(MR, c, cs, mult, aj, J, g, out, Bq, sm, zm, nv);                                   \
    }
GPK_QK_INST(1) GPK_QK_INST(2) GPK_QK_INST(3) GPK_QK_INST(4) GPK_QK_INST(5) GPK_QK_INST(6)
typedef void (*gpk_qk_fn)(const int16_t *, size_t, const float *, const float *, size_t, size_t, float *const *,
                          const int32_t *, const float *, const float *, size_t);
static const gpk_qk_fn gpk_qk_blocks[PK_MR + 1] = {NULL, gpk_qk_1, gpk_qk_2, gpk_qk_3, gpk_qk_4, gpk_qk_5, gpk_qk_6};

/* qk_gemm_s8_dot of M rows on group codes (the entry has checked K and the groups): rows in
   groups of at most PK_CODES codes, each group's keys packed 16 at a time and read by all its
   rows. */
static void gpk_qk_gemm(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const uint8_t *B,
                        int type, float *C, size_t ldc)
{
    int16_t c[PK_CODES] __attribute__((aligned(32)));
    int16_t rows[8 * DOT_QK_K] __attribute__((aligned(32)));
    int32_t Bq[8 * DOT_QK_K] __attribute__((aligned(32)));
    float sm[DOT_QK_K / 2], zm[DOT_QK_K / 2], aj[PK_CODES / 32];
    const size_t g = gqa_group_cols(type), J = K / g, cs = K, rb = gqa_row_bytes(type, K); /* K: groups of 32k */
    const size_t cb = K * gqa_group_bits(type) / 8, RG = PK_CODES / cs < PK_ROWS ? PK_CODES / cs : PK_ROWS;
    const int f16 = (type & GQA_META_F16) != 0;
    const float one = 1.0f; /* the per-tensor multiplier's scale: mult = fl(alpha * sa) */
    float mult[PK_ROWS];
    size_t idx[PK_ROWS];
    for (size_t m0 = 0; m0 < M;) {
        size_t n = 0;
        for (; m0 < M && n < RG; ++m0) {
            int16_t *cm = c + n * cs;
            if (qk_row(A + m0 * lda, K, &one, 0, alpha, cm, cs, &mult[n])) {
                for (size_t j = 0; j < J; j++)
                    aj[n * J + j] = (float)code_sum(cm + j * g, g);
                idx[n++] = m0;
            } else {
                DOT_EXACT.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc);
            }
        }
        for (size_t n0 = 0; n > 0 && n0 < N; n0 += 16) {
            const size_t nv = N - n0 < 16 ? N - n0 : 16;
            pk_pack_keys(type, (const int8_t *)B, rb, n0, nv, K, cs, rows, Bq);
            gpk_meta(B, rb, cb, n0, nv, J, f16, sm, zm);
            for (size_t i = 0; i < n; i += PK_MR) {
                float *out[PK_MR];
                const size_t mr = pk_block_rows(C, ldc, idx, i, n, n0, out);
                gpk_qk_blocks[mr](c + i * cs, cs, mult + i, aj + i * J, J, g, out, Bq, sm, zm, nv);
            }
        }
    }
}

/* P @ V of MR rows (codes c, stride cs; the chunk's np key pairs of one group, sp / Z per row)
   against one packed block of 16 columns, finished into out[i]. */
INLINE void gpk_sv_rows(const int MR, const int16_t *c, size_t cs, const int16_t *Bv, size_t np, float *const *out,
                        const float *sp, const float *Z, float beta, int first)
{
    __m256i d[PK_MR][2];
    pk_sv_dots(MR, c, cs, Bv, np, d);
    UNROLL
    for (int i = 0; i < MR; i++) {
        const __m256 vsp = _mm256_set1_ps(sp[i]), vz = _mm256_set1_ps(Z[i]);
        UNROLL
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(out[i] + 8 * h,
                             gsv_finish8(_mm256_loadu_ps(out[i] + 8 * h), d[i][h], vsp, vz, beta, first));
    }
}

#define GPK_SV_INST(MR)                                                                                \
    static void gpk_sv_##MR(const int16_t *c, size_t cs, const int16_t *Bv, size_t np, float *const *out,  \
                            const float *sp, const float *Z, float beta, int first)                    \
    {                                                                                                  \
        gpk_sv_rows(MR, c, cs, Bv, np, out, sp, Z, beta, first);                                       \
    }
GPK_SV_INST(1) GPK_SV_INST(2) GPK_SV_INST(3) GPK_SV_INST(4) GPK_SV_INST(5) GPK_SV_INST(6)
typedef void (*gpk_sv_fn)(const int16_t *, size_t, const int16_t *, size_t, float *const *, const float *,
                          const float *, float, int);
static const gpk_sv_fn gpk_sv_blocks[PK_MR + 1] = {NULL, gpk_sv_1, gpk_sv_2, gpk_sv_3, gpk_sv_4, gpk_sv_5, gpk_sv_6};

/* sv_gemm_s8_dot of M rows on group codes (the entry has checked the groups): rows in groups of
   at most PK_CODES / SV_KG, each chunk's groups quantized for all of them, then the group's
   16-column blocks packed once and read by all. */
static void gpk_sv_gemm(size_t M, size_t N, size_t K, const float *A, size_t lda, const uint8_t *B, int type,
                        float *C, size_t ldc, float beta)
{
    int16_t c[PK_CODES] __attribute__((aligned(32)));
    int16_t Bv[16 * (SV_KG + 16)] __attribute__((aligned(32)));
    float sc[4 * SV_KG], zc[4 * SV_KG], w[SV_MB * SV_KG];
    const size_t cs = SV_KG, RG = PK_CODES / SV_KG;
    float inv[PK_CODES / SV_KG], sp[PK_CODES / SV_KG], Z[PK_CODES / SV_KG];
    size_t idx[PK_CODES / SV_KG];
    const size_t g = gqa_group_cols(type), J = N / g, rb = gqa_row_bytes(type, N), cb = N * gqa_group_bits(type) / 8;
    const int f16 = (type & GQA_META_F16) != 0;
    for (size_t m0 = 0; m0 < M;) {
        /* the rows the contract covers (sv_row's inv / sp unused: each chunk and group scales its
           own); the others exact on the spot */
        const size_t n = (size_t)sv_take_rows(M, &m0, (int)RG, N, K, A, lda, B, type, NULL, C, ldc, beta, idx, inv,
                                              sp);
        for (size_t k0 = 0; n > 0 && k0 < K; k0 += SV_KG) {
            const size_t kn = K - k0 < SV_KG ? K - k0 : SV_KG;
            const uint8_t *bk = B + k0 * rb;
            for (size_t jb = 0, nj; jb < J; jb += nj) {
                nj = J - jb >= 4 ? 4 : J - jb >= 2 ? 2 : 1;
                gsv_meta(bk, rb, cb, jb, (int)nj, f16, kn, sc, zc);
                for (size_t q = 0; q < nj; q++) {
                    const size_t j = jb + q;
                    for (size_t i = 0; i < n; i += SV_MB) {
                        const int mb = n - i < SV_MB ? (int)(n - i) : SV_MB;
                        const float *ar[SV_MB];
                        int16_t *cr[SV_MB];
                        for (int r = 0; r < mb; r++) {
                            ar[r] = A + idx[i + r] * lda + k0;
                            cr[r] = c + (i + r) * cs;
                        }
                        gsv_rows_n(mb, ar, kn, sc + q * SV_KG, zc + q * SV_KG, w, cr, sp + i, Z + i);
                    }
                    for (size_t n0 = j * g; n0 < (j + 1) * g; n0 += 16) {
                        pk_pack_values(type, (const int8_t *)bk, rb, kn, n0, 16, Bv);
                        for (size_t i = 0; i < n; i += PK_MR) {
                            float *out[PK_MR];
                            const size_t mr = pk_block_rows(C, ldc, idx, i, n, n0, out);
                            gpk_sv_blocks[mr](c + i * cs, cs, Bv, (kn + 1) / 2, out, sp + i, Z + i, beta, k0 == 0);
                        }
                    }
                }
            }
        }
    }
}
#endif /* GDOT_PACKED */

/* QK's driver: gqk, or the including unit's own (GDOT_GQK, declared here; it may hand rows to
   gqk). */
#ifdef GDOT_GQK
static void GDOT_GQK(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const uint8_t *B,
                     int type, float *C, size_t ldc);
#else
#define GDOT_GQK gqk
#endif

void DOT_ENTRY(gqa_qk_gemm_g_dot_)(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                            int type, const float *s, float *C, size_t ldc)
{
    if (!gqa_group_dot_takes(type, K) || K == 0 || K > DOT_QK_K) {
        DOT_EXACT.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
#ifdef GDOT_PACKED
    if (M >= PK_MIN_ROWS) {
        gpk_qk_gemm(M, N, K, alpha, A, lda, (const uint8_t *)B, type, C, ldc);
        return;
    }
#endif
    GDOT_GQK(M, N, K, alpha, A, lda, (const uint8_t *)B, type, C, ldc);
}

void DOT_ENTRY(gqa_sv_gemm_g_dot_)(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                            const float *s, float *C, size_t ldc, float beta)
{
    if (!gqa_group_dot_takes(type, N) || K == 0) {
        DOT_EXACT.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
#ifdef GDOT_PACKED
    if (M >= PK_MIN_ROWS) {
        gpk_sv_gemm(M, N, K, A, lda, (const uint8_t *)B, type, C, ldc, beta);
        return;
    }
#endif
    GDOT_GSV(M, N, K, A, lda, (const uint8_t *)B, type, C, ldc, beta);
}
#endif
