/*
 * kernels_avx512vnni_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / GQA_G4 / GQA_G2) for
 * the avx512 path's VNNI unit, the per-group contracts of kernels_s8dot_contract.h bit for bit.
 * QK: kernels_avx2_gdot.c's kernels (their layout and blocks) built with each int16 pair dot and
 * its add as one vpdpwssd (256-bit, EVEX; DOT_MADD under GQA_DOT_VNNI).  P @ V: this file's
 * 512-bit kernel (below), which reads each chunk's rows once for all the groups of a block of
 * columns; the metadata transpose, the quantization of the probabilities times scales and the
 * float finish are kernels_avx2_gdot.c's.  The avx512 path's exact kernels take the rows and
 * types the contracts leave.
 * ISA flags: the avx512 path's plus -mavx512vnni (setup.py's avx512vnni unit, whose entries
 * gqa_qk_gemm_s8_dot_avx512vnni / gqa_sv_gemm_s8_dot_avx512vnni hand group types here);
 * dispatch.c calls them only where the CPU has AVX-512 VNNI.  The emulation build of tests/isa
 * (GQA_EMULATE_AVX512) takes vpdpwssd from SIMDe.
 */
#define GQA_DOT_VNNI
#define GQK_WIDE 1 /* 32 vector registers: QK blocks of 2 rows x 8 keys and 4 x 4 */
#define DOT_UNIT avx512vnni
#define DOT_EXACT gqa_kernels_avx512
#define GDOT_GSV gsv512
#include "kernels_avx2_gdot.c"

#if defined(__x86_64__) || defined(_M_X64)

/* ---- sv_gemm_s8_dot on group rows, 512 bits -----------------------------------------------
 *
 * Per chunk of SV_KG keys (the contract's) and block of columns: the block's groups' metadata in
 * columns (gsv_meta) and each row's probabilities times scales quantized per group (gsv_row),
 * once per chunk even where a group spans two blocks; then one pass over the chunk's rows for all
 * the block's pieces (32 columns each, inside one group since groups are multiples of 32):
 * two keys at a time, each piece's codes widened to 32 uint16 words (gp_widen: INT8 word w is
 * column w; INT4 the 16 even columns then the 16 odd ones; INT2 word 8 L + t is column 4 t + L),
 * the two keys' words interleaved by in-lane unpacks (lo: words 8 L + t, hi: 8 L + 4 + t, t < 4,
 * of 128-bit lane L, as dword 4 L + t) and one vpdpwssd per vector and row with the row's two
 * codes of the piece's group broadcast from memory.  Exact in int32: 256 * 32767 * 255 < 2^31, so
 * D is the contract's whatever the order.  The sums return to column order by two vpermt2d per
 * piece (gp_perm's indices) and gsv_finish adds them, scaled, in the contract's order.
 */
#define GP_PIECES 8               /* pieces of a block at most (one row; 4 for two or three, 2 for four) */
#define GP_SLOTS 8                /* groups whose codes a chunk keeps (a block spans at most 8) */
#define GP_CS (SV_KG + 16)        /* int16 codes per (row, group) slot */

/* Pieces per block for mb rows: 2 mb GP_NP accumulators. */
static const int gp_np[SV_MB + 1] = {0, 8, 4, 4, 2};

/* Two keys' codes x 4 for vpdpwssd: acc + the pairs of u times the pair at p in every lane (the
   broadcast folded into the instruction, {1to16}; the intrinsics under the tests' emulation). */
INLINE __m512i gp_dp(__m512i acc, __m512i u, const int16_t *p)
{
#if defined(GQA_EMULATE_AVX512)
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpwssd_epi32(acc, u, _mm512_set1_epi32(v));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(const void *)p));
    return acc;
#endif
}

/* One piece's 32 codes at p as uint16 words in the kind's order (above). */
INLINE __m512i gp_widen(const int KIND, const uint8_t *p)
{
    if (KIND == DOT_U8)
        return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    if (KIND == DOT_U4) {
        const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
        return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w), _mm256_srli_epi16(w, 4), 1),
                                _mm512_set1_epi16(0x0F));
    }
    const __m512i sh = _mm512_set_epi64(0x0006000600060006LL, 0x0006000600060006LL, 0x0004000400040004LL,
                                        0x0004000400040004LL, 0x0002000200020002LL, 0x0002000200020002LL, 0, 0);
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(w), sh), _mm512_set1_epi16(3));
}

/* idx[0] / idx[1]: columns 0-15 / 16-31 of a piece as indices into (lo, hi) for vpermt2d. */
static void gp_perm(int kind, __m512i idx[2])
{
    int32_t ix[32];
    for (int w = 0; w < 32; w++) {
        const int col = kind == DOT_U8 ? w : kind == DOT_U4 ? (w < 16 ? 2 * w : 2 * (w - 16) + 1)
                                                             : 4 * (w % 8) + w / 8;
        ix[col] = (w % 8 < 4 ? 0 : 16) + 4 * (w / 8) + w % 4;
    }
    idx[0] = _mm512_loadu_si512((const void *)ix);
    idx[1] = _mm512_loadu_si512((const void *)(ix + 16));
}

/* D[i * GP_DS + 32 p + c] = the int32 sums of rows i < MB over the kn keys at b (rows of ldb
   bytes) of column c of piece p < NP, row i's codes of that piece's group at cp[i * NP + p]
   (padded with 0 past kn).  pf: NULL, or rows of ldb bytes to bring into L2 along the way, two
   per pair of keys (the next chunk's, for its metadata pass; prefetches never fault). */
#define GP_DS (32 * GP_PIECES)
INLINE void gp_block(const int MB, const int NP, const int KIND, const int16_t *const *cp, size_t kn,
                     const uint8_t *b, size_t ldb, const uint8_t *pf, const __m512i idx[2], int32_t *D)
{
    const size_t pb = KIND == DOT_U8 ? 32 : KIND == DOT_U4 ? 16 : 8; /* bytes of a piece */
    __m512i lo[SV_MB][GP_PIECES], hi[SV_MB][GP_PIECES];
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int p = 0; p < NP; p++)
            lo[i][p] = hi[i][p] = _mm512_setzero_si512();
    for (size_t k = 0; k < kn; k += 2) {
        const uint8_t *r0 = b + k * ldb, *r1 = k + 1 < kn ? r0 + ldb : r0; /* a last odd key: code 0 */
        if (pf)
            for (size_t o = 0; o < 2 * ldb; o += 64)
                _mm_prefetch((const char *)(pf + k * ldb + o), _MM_HINT_T1);
        UNROLL
        for (int p = 0; p < NP; p++) {
            const __m512i x0 = gp_widen(KIND, r0 + p * pb), x1 = gp_widen(KIND, r1 + p * pb);
            const __m512i ul = _mm512_unpacklo_epi16(x0, x1), uh = _mm512_unpackhi_epi16(x0, x1);
            UNROLL
            for (int i = 0; i < MB; i++) {
                lo[i][p] = gp_dp(lo[i][p], ul, cp[i * NP + p] + k);
                hi[i][p] = gp_dp(hi[i][p], uh, cp[i * NP + p] + k);
            }
        }
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int p = 0; p < NP; p++) {
            int32_t *d = D + i * GP_DS + 32 * p;
            _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi32(lo[i][p], idx[0], hi[i][p]));
            _mm512_storeu_si512((void *)(d + 16), _mm512_permutex2var_epi32(lo[i][p], idx[1], hi[i][p]));
        }
}

typedef void (*gp_fn)(const int16_t *const *, size_t, const uint8_t *, size_t, const uint8_t *, const __m512i *,
                      int32_t *);
#define GP_INST(MB, NP, KIND)                                                                          \
    static void gp_##MB##x##NP##_##KIND(const int16_t *const *cp, size_t kn, const uint8_t *b, size_t ldb,  \
                                       const uint8_t *pf, const __m512i *idx, int32_t *D)             \
    {                                                                                                  \
        gp_block(MB, NP, KIND, cp, kn, b, ldb, pf, idx, D);                                            \
    }
/* [rows][log2 pieces]: the widest block of each row count and the narrower ones a block's
   remainder takes */
#define GP_KIND(KIND)                                                                                  \
    GP_INST(1, 1, KIND) GP_INST(1, 2, KIND) GP_INST(1, 4, KIND) GP_INST(1, 8, KIND)                    \
    GP_INST(2, 1, KIND) GP_INST(2, 2, KIND) GP_INST(2, 4, KIND)                                        \
    GP_INST(3, 1, KIND) GP_INST(3, 2, KIND) GP_INST(3, 4, KIND)                                        \
    GP_INST(4, 1, KIND) GP_INST(4, 2, KIND)                                                            \
    static const gp_fn gp_blocks_##KIND[SV_MB + 1][4] = {                                              \
        {NULL, NULL, NULL, NULL},                                                                      \
        {gp_1x1_##KIND, gp_1x2_##KIND, gp_1x4_##KIND, gp_1x8_##KIND},                                  \
        {gp_2x1_##KIND, gp_2x2_##KIND, gp_2x4_##KIND, NULL},                                           \
        {gp_3x1_##KIND, gp_3x2_##KIND, gp_3x4_##KIND, NULL},                                           \
        {gp_4x1_##KIND, gp_4x2_##KIND, NULL, NULL}};
GP_KIND(1) GP_KIND(2) GP_KIND(3) /* DOT_U4, DOT_U8, DOT_U2 */

/* The chunk's codes of groups [j0, j1) for rows r < mb (rows[r] of A from column k0, kn keys):
   metadata four, two or one groups at a time, into slot j % GP_SLOTS of codes, sp and Z. */
static void gp_quantize(int mb, const size_t *rows, const float *A, size_t lda, size_t k0, size_t kn,
                        const uint8_t *bk, size_t rb, size_t cb, int f16, size_t j0, size_t j1,
                        int16_t (*codes)[GP_SLOTS][GP_CS], float (*sp)[GP_SLOTS], float (*Z)[GP_SLOTS])
{
    float sc[4 * SV_KG], zc[4 * SV_KG], w[SV_KG];
    for (size_t jb = j0, nj; jb < j1; jb += nj) {
        nj = j1 - jb >= 4 ? 4 : j1 - jb >= 2 ? 2 : 1;
        gsv_meta(bk, rb, cb, jb, (int)nj, f16, kn, sc, zc);
        for (size_t i = 0; i < nj; i++) {
            const size_t s = (jb + i) % GP_SLOTS;
            for (int r = 0; r < mb; r++)
                gsv_row(A + rows[r] * lda + k0, kn, sc + i * SV_KG, zc + i * SV_KG, w, codes[r][s], &sp[r][s],
                        &Z[r][s]);
        }
    }
}

static void gsv512(size_t M, size_t N, size_t K, const float *A, size_t lda, const uint8_t *B, int type, float *C,
                   size_t ldc, float beta)
{
    int16_t codes[SV_MB][GP_SLOTS][GP_CS] __attribute__((aligned(64)));
    int32_t D[SV_MB * GP_DS];
    float sp[SV_MB][GP_SLOTS], Z[SV_MB][GP_SLOTS];
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, N), bits = gqa_group_bits(type);
    const size_t cb = N * bits / 8, pb = 32 * bits / 8; /* bytes of a piece */
    const int kind = gdot_kind(type), f16 = (type & GQA_META_F16) != 0;
    const gp_fn(*blocks)[4] = kind == DOT_U8 ? gp_blocks_2 : kind == DOT_U4 ? gp_blocks_1 : gp_blocks_3;
    __m512i idx[2];
    gp_perm(kind, idx);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[SV_MB];
        int mb = 0;
        for (; m0 < M && mb < SV_MB; ++m0) {
            float inv, s;
            if (sv_row(A + m0 * lda, K, &inv, &s))
                rows[mb++] = m0;
            else
                DOT_EXACT.sv_gemm(1, N, K, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc, beta);
        }
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KG) {
            const size_t kn = K - k0 < SV_KG ? K - k0 : SV_KG;
            const uint8_t *bk = B + k0 * rb;
            /* the next chunk's rows into L2 during the first block's pass (in one burst they stalled
               it: Zen 4, 2 x 128 INT8 g32 from memory, 1.3x) */
            const size_t nk = k0 + SV_KG < K ? (K - k0 - SV_KG < SV_KG ? K - k0 - SV_KG : SV_KG) : 0;
            size_t done = 0; /* groups [0, done) of this chunk have their codes */
            for (size_t n0 = 0; n0 < N;) {
                const size_t np = (N - n0) / 32 < (size_t)gp_np[mb] ? (N - n0) / 32 : (size_t)gp_np[mb];
                const size_t ja = n0 / g, jz = (n0 + 32 * np - 1) / g + 1; /* the block's groups [ja, jz) */
                if (jz > done) {
                    gp_quantize(mb, rows, A, lda, k0, kn, bk, rb, cb, f16, ja > done ? ja : done, jz, codes, sp, Z);
                    done = jz;
                }
                for (size_t p0 = 0; p0 < np;) { /* the block in runs of 8, 4, 2, 1 pieces */
                    const int l = np - p0 >= 8 ? 3 : np - p0 >= 4 ? 2 : np - p0 >= 2 ? 1 : 0;
                    const size_t run = (size_t)1 << l;
                    const int16_t *cp[SV_MB * GP_PIECES];
                    for (int r = 0; r < mb; r++)
                        for (size_t p = 0; p < run; p++)
                            cp[r * run + p] = codes[r][(n0 + 32 * (p0 + p)) / g % GP_SLOTS];
                    const uint8_t *pf = n0 == 0 && p0 == 0 && nk >= kn ? bk + SV_KG * rb : NULL;
                    blocks[mb][l](cp, kn, bk + (n0 / 32 + p0) * pb, rb, pf, idx, D + 32 * p0);
                    p0 += run;
                }
                for (int r = 0; r < mb; r++)
                    for (size_t p = 0; p < np; p++) {
                        const size_t s = (n0 + 32 * p) / g % GP_SLOTS;
                        gsv_finish(D + r * GP_DS + 32 * p, 32, sp[r][s], Z[r][s], beta, k0 == 0,
                                   C + rows[r] * ldc + n0 + 32 * p);
                    }
                n0 += 32 * np;
            }
        }
    }
}
#endif
