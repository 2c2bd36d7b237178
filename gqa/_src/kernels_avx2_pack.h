/*
 * kernels_avx2_pack.h -- the packed operands of the AVX2 level-4 unit's kernels for calls of many
 * rows (a prompt's flash tiles: rows x G query rows against a tile of keys): a block of keys (QK)
 * or of columns (P @ V) widened once into int16 pairs that every row of the call then reads, so
 * that each DOT_MADD is 16 products with no widening, interleave or horizontal sum in the inner
 * loop (Zen 3, operands in L1: 77 G products/s a core in 6 x 16 blocks, against 46 G
 * multiply-adds/s of the float32 kernels' FMA blocks).  Codes: INT8 / INT4 per tensor or per
 * channel (INT4 as the signed q = u - 8) and per-group codes (their u).  The drivers are the
 * contracts' units: kernels_avx2_s8dot.c (per tensor / channel: pk_qk_gemm, pk_sv_gemm) and
 * kernels_avx2_gdot.c (per group: gpk_qk_gemm, gpk_sv_gemm); integer sums are exact in any
 * order, so they give the decode blocks' bits.
 * ISA flags: the including unit's (the avx2 path's; the avxvnni build).
 *
 * Packed layouts:
 *   QK, a block of 16 keys n0 .. n0 + 15: Bq[p][16] int32, lane i the pair (q[n0 + i][2p],
 *     q[n0 + i][2p + 1]) (p < cs / 2; keys past N and columns past K are 0); rows' codes
 *     c[cs] (qk_row's, zero past K): acc[key lanes] += pair(c[2p], c[2p + 1]) . Bq[p].
 *   P @ V, a block of 16 columns n0 .. n0 + 15 and a chunk's keys: Bv[kp][32] int16, the pairs
 *     (q[2kp][n], q[2kp + 1][n]) in sv_block's lane order (`lo`: columns 0-3, 8-11; `hi`: 4-7,
 *     12-15), 0 past the chunk's keys and past N; rows' codes per chunk (zero past kn).
 */
#ifndef GQA_KERNELS_AVX2_PACK_H
#define GQA_KERNELS_AVX2_PACK_H

/* Calls of at least this many rows (the contracts' rows) take the packed kernels: below it the
   decode blocks (1-4 rows a pass, each key's codes widened per pass) measured as fast or faster
   (a decode step's 1-8 query rows; kernels_avx2_s8dot.c's). */
#define PK_MIN_ROWS 16
/* Rows per group (each group packs the keys once): at most PK_ROWS rows of at most PK_CODES
   int16 codes together. */
#define PK_CODES 16384
#define PK_ROWS 256
/* Rows per register block: 6 x 16 sums in 12 accumulators. */
#define PK_MR 6

/* Bytes of a row's first n codes: INT8 / INT4 per tensor or channel, or a group type's codes
   (its metadata follows them). */
static inline size_t pk_code_bytes(int type, size_t n)
{
    const size_t bits = GQA_IS_GROUP(type) ? gqa_group_bits(type) : GQA_IS_S4(type) ? 4 : 8;
    return (n * bits + 7) / 8;
}

/* 16 codes at p as exact int16 in element order: INT8 as stored, INT4 as q = u - 8, group codes
   as their u (kernels_group.h's element order: widen16's U8 / U4 / U2). */
INLINE __m256i pk_codes16(int type, const int8_t *p)
{
    if (GQA_IS_GROUP(type)) {
        const unsigned b = gqa_group_bits(type);
        return b == 8 ? widen16(DOT_U8, p) : b == 4 ? widen16(DOT_U4, p) : widen16(DOT_U2, p);
    }
    return GQA_IS_S4(type) ? _mm256_sub_epi16(widen16(DOT_U4, p), _mm256_set1_epi16(8)) : widen16(DOT_S8, p);
}

/* Row r's n codes from p (stored codes of `type`, INT4 as q = u - 8) widened to int16 into
   dst[0, cs), 0 past n; never reads past the row's pk_code_bytes(type, n) bytes. */
static void pk_widen_row(int type, const int8_t *p, size_t n, int16_t *dst, size_t cs)
{
    const size_t nf = n & ~(size_t)15;
    size_t k = 0;
    for (; k < nf; k += 16) {
        _mm256_storeu_si256((__m256i *)(dst + k), pk_codes16(type, p + pk_code_bytes(type, k)));
    }
    if (k < n) {
        int8_t t[16] = {0};
        int16_t w[16];
        memcpy(t, p + pk_code_bytes(type, k), pk_code_bytes(type, n) - pk_code_bytes(type, k));
        _mm256_storeu_si256((__m256i *)w, pk_codes16(type, t));
        memcpy(dst + k, w, (n - k) * sizeof(int16_t));
        k = n;
    }
    memset(dst + k, 0, (cs - k) * sizeof(int16_t));
}

/* The 16 codes of columns [n0, n0 + nv) of row r (INT4 as q = u - 8), 0 past nv: straight from
   the row when the block is whole, else through pk_widen_row. */
INLINE __m256i pk_widen16(int type, const int8_t *r, size_t nv)
{
    if (nv == 16)
        return pk_codes16(type, r);
    int16_t w[16] __attribute__((aligned(32)));
    pk_widen_row(type, r, nv, w, 16);
    return _mm256_load_si256((const __m256i *)w);
}

/* The 8 x 8 int32 transpose: out[i] lane k = in[k] lane i. */
INLINE void pk_transpose8(const __m256i in[8], __m256i out[8])
{
    __m256i t[8], u[8];
    UNROLL
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    UNROLL
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    UNROLL
    for (int i = 0; i < 4; i++) {
        out[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
        out[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
}

/* Bq (cs / 2 pairs x 16 keys) of keys [n0, n0 + nv) of B (rows of rb bytes, K codes each),
   eight keys at a time through rows [8][cs] of their widened codes. */
static void pk_pack_keys(int type, const int8_t *B, size_t rb, size_t n0, size_t nv, size_t K, size_t cs,
                         int16_t *rows, int32_t *Bq)
{
    for (size_t h = 0; h < 2; h++) {
        for (size_t i = 0; i < 8; i++) {
            int16_t *dst = rows + i * cs;
            if (8 * h + i >= nv) {
                memset(dst, 0, cs * sizeof(int16_t));
                continue;
            }
            const int8_t *r = B + (n0 + 8 * h + i) * rb;
            if (K < cs) {
                pk_widen_row(type, r, K, dst, cs);
                continue;
            }
            for (size_t k = 0; k < K; k += 16)
                _mm256_store_si256((__m256i *)(dst + k), pk_widen16(type, r + pk_code_bytes(type, k), 16));
        }
        for (size_t p = 0; p < cs / 2; p += 8) {
            __m256i in[8], out[8];
            UNROLL
            for (int k = 0; k < 8; k++)
                in[k] = _mm256_load_si256((const __m256i *)(rows + (size_t)k * cs + 2 * p));
            pk_transpose8(in, out);
            UNROLL
            for (int i = 0; i < 8; i++)
                _mm256_store_si256((__m256i *)(Bq + (p + i) * 16 + 8 * h), out[i]);
        }
    }
}

/* The pair (c[0], c[1]) in every int32 lane. */
INLINE __m256i pk_pair(const int16_t *c)
{
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *)(const void *)c));
}

/* acc[2 i + h] (rows i < MR, key lanes 8 h ..) = sum over the np pairs of rows c (stride cs) and
   the packed block B (16 lanes a pair). */
INLINE void pk_dots(const int MR, const int16_t *c, size_t cs, const int32_t *B, size_t np, __m256i acc[2 * PK_MR])
{
    UNROLL
    for (int i = 0; i < 2 * MR; i++)
        acc[i] = _mm256_setzero_si256();
    for (size_t p = 0; p < np; p++) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(B + 16 * p));
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(B + 16 * p + 8));
        UNROLL
        for (int i = 0; i < MR; i++) {
            const __m256i x = pk_pair(c + i * cs + 2 * p);
            acc[2 * i] = DOT_MADD(acc[2 * i], x, b0);
            acc[2 * i + 1] = DOT_MADD(acc[2 * i + 1], x, b1);
        }
        UNROLL
        for (int i = 0; i < 2 * MR; i++)
            DOT_KEEP(acc[i]);
    }
}

/* 16 scores s0 (keys 0-7), s1 (8-15) of a block into out: its first nv (the keys of the block
   that exist). */
INLINE void pk_store16(float *out, __m256 s0, __m256 s1, size_t nv)
{
    float t[16];
    float *o = nv == 16 ? out : t;
    _mm256_storeu_ps(o, s0);
    _mm256_storeu_ps(o + 8, s1);
    if (nv < 16)
        memcpy(out, t, nv * sizeof(float));
}

/* P @ V's int32 sums of MR rows (codes c, stride cs; np key pairs) against one packed block of 16
   columns Bv, in column order: d[i][0] columns 0-7, d[i][1] columns 8-15. */
INLINE void pk_sv_dots(const int MR, const int16_t *c, size_t cs, const int16_t *Bv, size_t np, __m256i d[][2])
{
    __m256i acc[2 * PK_MR];
    pk_dots(MR, c, cs, (const int32_t *)(const void *)Bv, np, acc);
    UNROLL
    for (int i = 0; i < MR; i++)
        sv_order(acc[2 * i], acc[2 * i + 1], d[i]);
}

/* A register block's rows from row i of the n rows idx[] of C: out[r] = row idx[i + r] at column
   n0, for the min(PK_MR, n - i) rows it returns. */
static inline size_t pk_block_rows(float *C, size_t ldc, const size_t *idx, size_t i, size_t n, size_t n0,
                                   float **out)
{
    const size_t mr = n - i < PK_MR ? n - i : PK_MR;
    for (size_t r = 0; r < mr; r++)
        out[r] = C + idx[i + r] * ldc + n0;
    return mr;
}

/* Bv of keys [0, kn) (kn <= SV_KS) and columns [n0, n0 + nv) of b (rows of ldb bytes), in
   sv_block's lane order. */
static void pk_pack_values(int type, const int8_t *b, size_t ldb, size_t kn, size_t n0, size_t nv, int16_t *Bv)
{
    const int8_t *r = b + pk_code_bytes(type, n0);
    for (size_t k = 0; k < kn; k += 2) {
        const __m256i x0 = pk_widen16(type, r + k * ldb, nv);
        const __m256i x1 = k + 1 < kn ? pk_widen16(type, r + (k + 1) * ldb, nv) : _mm256_setzero_si256();
        _mm256_store_si256((__m256i *)(Bv + 16 * k), _mm256_unpacklo_epi16(x0, x1));
        _mm256_store_si256((__m256i *)(Bv + 16 * k + 16), _mm256_unpackhi_epi16(x0, x1));
    }
}

#endif
