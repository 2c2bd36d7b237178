/*
 * kernels_avx512vnni_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / GQA_G4 / GQA_G2) for
 * the avx512 path's VNNI unit, the per-group contracts of kernels_s8dot_contract.h bit for bit.
 * QK: this file's 512-bit kernel with the keys across the lanes (below) where kq_blocks has one,
 * else kernels_avx2_gdot.c's blocks built with each int16 pair dot and its add as one vpdpwssd
 * (256-bit, EVEX; DOT_MADD under GQA_DOT_VNNI).  P @ V: this file's 512-bit kernel, which reads
 * each chunk's rows once for all the groups of a block of columns; the metadata transpose, the
 * quantization of the probabilities times scales and the float finish are kernels_avx2_gdot.c's.
 * The avx512 path's exact kernels take the rows and types the contracts leave.
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
#define GDOT_GQK gqk512
#include "kernels_avx2_gdot.c"

#if defined(__x86_64__) || defined(_M_X64)
#include "kernels_avx512.h"

/* ---- sv_gemm_s8_dot on group rows, 512 bits -----------------------------------------------
 *
 * Blocks of up to GP_MB rows.  Per chunk of SV_KG keys (the contract's) and block of columns: the
 * block's groups' metadata in columns (gsv_meta, once for all the rows) and each row's
 * probabilities times scales quantized per group (gsv_rows), once per chunk even where a group
 * spans two blocks; then one pass over the chunk's rows for all the block's pieces (32 columns
 * each, inside one group since groups are multiples of 32):
 * two keys at a time, each piece's codes widened to 32 uint16 words (gp_widen: INT8 word w is
 * column w; INT4 the 16 even columns then the 16 odd ones; INT2 word 8 L + t is column 4 t + L),
 * the two keys' words interleaved by in-lane unpacks (lo: words 8 L + t, hi: 8 L + 4 + t, t < 4,
 * of 128-bit lane L, as dword 4 L + t) and one vpdpwssd per vector and row with the row's two
 * codes of the piece's group broadcast from memory.  Exact in int32: 256 * 32767 * 255 < 2^31, so
 * D is the contract's whatever the order.  The sums return to column order by two vpermt2d per
 * piece (gp_perm's indices) and gsv_finish adds them, scaled, in the contract's order.
 */
#define GP_PIECES 8               /* pieces of a block at most (one row; 4 for two or three, 2 for four,
                                     1 for five to eight) */
#define GP_SLOTS 8                /* groups whose codes a chunk keeps (a block spans at most 8) */
#define GP_CS (SV_KG + 16)        /* int16 codes per (row, group) slot */
#define GP_MB 8                   /* rows of a block: each chunk's metadata and code rows read once for
                                     them (Zen 4, 8 rows x 256 columns: 1.03-1.12x two blocks of 4) */

/* Pieces per block for mb rows (2 mb gp_np[mb] accumulators of 32). */
static const int gp_np[GP_MB + 1] = {0, 8, 4, 4, 2, 1, 1, 1, 1};

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
    __m512i lo[GP_MB][GP_PIECES], hi[GP_MB][GP_PIECES];
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
                lo[i][p] = vnni_dpwssd_b(lo[i][p], ul, cp[i * NP + p] + k);
                hi[i][p] = vnni_dpwssd_b(hi[i][p], uh, cp[i * NP + p] + k);
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
    GP_INST(5, 1, KIND) GP_INST(6, 1, KIND) GP_INST(7, 1, KIND) GP_INST(8, 1, KIND)                    \
    static const gp_fn gp_blocks_##KIND[GP_MB + 1][4] = {                                              \
        {NULL, NULL, NULL, NULL},                                                                      \
        {gp_1x1_##KIND, gp_1x2_##KIND, gp_1x4_##KIND, gp_1x8_##KIND},                                  \
        {gp_2x1_##KIND, gp_2x2_##KIND, gp_2x4_##KIND, NULL},                                           \
        {gp_3x1_##KIND, gp_3x2_##KIND, gp_3x4_##KIND, NULL},                                           \
        {gp_4x1_##KIND, gp_4x2_##KIND, NULL, NULL},                                                    \
        {gp_5x1_##KIND, NULL, NULL, NULL},                                                             \
        {gp_6x1_##KIND, NULL, NULL, NULL},                                                             \
        {gp_7x1_##KIND, NULL, NULL, NULL},                                                             \
        {gp_8x1_##KIND, NULL, NULL, NULL}};
GP_KIND(1) GP_KIND(2) GP_KIND(3) /* DOT_U4, DOT_U8, DOT_U2 */

/* The chunk's codes of groups [j0, j1) for rows r < mb (rows[r] of A from column k0, kn keys):
   metadata four, two or one groups at a time, into slot j % GP_SLOTS of codes, sp and Z. */
static void gp_quantize(int mb, const size_t *rows, const float *A, size_t lda, size_t k0, size_t kn,
                        const uint8_t *bk, size_t rb, size_t cb, int f16, size_t j0, size_t j1,
                        int16_t (*codes)[GP_SLOTS][GP_CS], float (*sp)[GP_SLOTS], float (*Z)[GP_SLOTS])
{
    float sc[4 * SV_KG], zc[4 * SV_KG], w[SV_MB * SV_KG];
    const float *ar[GP_MB];
    for (int r = 0; r < mb; r++)
        ar[r] = A + rows[r] * lda + k0;
    for (size_t jb = j0, nj; jb < j1; jb += nj) {
        nj = j1 - jb >= 4 ? 4 : j1 - jb >= 2 ? 2 : 1;
        gsv_meta(bk, rb, cb, jb, (int)nj, f16, kn, sc, zc);
        for (size_t i = 0; i < nj; i++) {
            const size_t s = (jb + i) % GP_SLOTS;
            int16_t *cr[GP_MB];
            float spr[GP_MB], Zr[GP_MB];
            for (int r = 0; r < mb; r++)
                cr[r] = codes[r][s];
            for (int r0 = 0; r0 < mb; r0 += SV_MB) /* gsv_rows' blocks of rows */
                gsv_rows_n(mb - r0 < SV_MB ? mb - r0 : SV_MB, ar + r0, kn, sc + i * SV_KG, zc + i * SV_KG, w,
                           cr + r0, spr + r0, Zr + r0);
            for (int r = 0; r < mb; r++)
                sp[r][s] = spr[r], Z[r][s] = Zr[r];
        }
    }
}

static void gsv512(size_t M, size_t N, size_t K, const float *A, size_t lda, const uint8_t *B, int type, float *C,
                   size_t ldc, float beta)
{
    int16_t codes[GP_MB][GP_SLOTS][GP_CS] __attribute__((aligned(64)));
    int32_t D[GP_MB * GP_DS];
    float sp[GP_MB][GP_SLOTS], Z[GP_MB][GP_SLOTS];
    const size_t g = gqa_group_cols(type), rb = gqa_row_bytes(type, N), bits = gqa_group_bits(type);
    const size_t cb = N * bits / 8, pb = 32 * bits / 8; /* bytes of a piece */
    const int kind = gdot_kind(type), f16 = (type & GQA_META_F16) != 0;
    const gp_fn(*blocks)[4] = kind == DOT_U8 ? gp_blocks_2 : kind == DOT_U4 ? gp_blocks_1 : gp_blocks_3;
    __m512i idx[2];
    gp_perm(kind, idx);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[GP_MB];
        float inv[GP_MB], sp0[GP_MB]; /* sv_row's, unused: each chunk and group scales its own */
        const int mb = sv_take_rows(M, &m0, GP_MB, N, K, A, lda, B, type, NULL, C, ldc, beta, rows, inv, sp0);
        for (size_t k0 = 0; mb > 0 && k0 < K; k0 += SV_KG) {
            const size_t kn = K - k0 < SV_KG ? K - k0 : SV_KG;
            const uint8_t *bk = B + k0 * rb;
            /* the next chunk's rows into L2 during the first block's pass (in one burst they stalled
               it: Zen 4, 2 x 128 INT8 g32 from memory, 1.3x) */
            const size_t nk = gsv_next_keys(K, k0);
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
                    const int16_t *cp[GP_MB * GP_PIECES];
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

/* ---- qk_gemm_s8_dot on group rows, 512 bits: the keys across the lanes ---------------------
 *
 * Sixteen keys at a time: their rows read 64 bytes at a time and transposed (transpose16), so
 * that lane t of vector i holds key t's dword i of the chunk; a dword holds 4 (INT8), 8 (INT4) or
 * 16 (INT2) codes of one group.  Each query code enters as its two signed bytes (code = 256 hi +
 * lo, both in [-127, 127] since QK_CODE_MAX = 127 * 257), in the order the dword gives its codes
 * (vnni_code_bytes), against the codes as unsigned bytes: INT8 the bytes; INT4 the low nibbles (the even
 * elements), then the high ones; INT2 bits 2 j of each byte (elements 4 b + j), j = 0 .. 3.  One
 * vpdpbusd per byte set, row and half; at a group's last dword D_j = 256 D_hi + D_lo (the
 * contract's exact int32: |D_hi| <= 256 * 127 * 255, 256 of it < 2^31) and
 * S = fl(S + fl(fl(s_j D_j) + fl(z_j A_j))) for the sixteen keys, in group order, with s_j and
 * z_j from the keys' metadata transposed the same way (fp32: dwords 2 j, 2 j + 1; fp16: the
 * halves of dword j).  C = fl(S mult).  No horizontal sums.
 */
#define KQ_PF 64 /* rows ahead to prefetch (four blocks of keys) */

/* The code bytes of a row of K codes of kind (DOT_U8, _U4, _U2). */
static inline size_t kq_code_bytes(int kind, size_t K)
{
    return K * (kind == DOT_U8 ? 8 : kind == DOT_U4 ? 4 : 2) / 8;
}

/* chunk16 without its prefetch: SM (rows of at most 32 code bytes) through its small paths, the
   others through chunk16_rows (the instances kept at their code: see kq_blocks). */
INLINE void kq_chunk(const int SM, const char *const *kr, size_t off, size_t nb, __m512 W[16])
{
    if (SM)
        chunk16(kr, off, nb, 0, W);
    else
        chunk16_rows(kr, off, nb, 0, W);
}

/* meta[2 j], meta[2 j + 1] = the scales and zeros of group j < J of the sixteen keys at kr (their
   metadata at byte cb of rows of rb bytes); SM: through chunk16's small paths (kq_block's). */
INLINE void kq_meta(const int SM, const char *const *kr, size_t cb, size_t J, int f16, __m512 *meta)
{
    const size_t bytes = J * (f16 ? 4 : 8);
    for (size_t off = 0; off < bytes; off += 64) {
        __m512 W[16];
        kq_chunk(SM, kr, cb + off, bytes - off, W);
        if (f16) {
            const size_t j0 = off / 4;
            for (size_t i = 0; i < 16 && j0 + i < J; i++) {
                const __m512i w = _mm512_castps_si512(W[i]);
                meta[2 * (j0 + i)] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
                meta[2 * (j0 + i) + 1] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
            }
        } else {
            const size_t d0 = off / 4;
            for (size_t i = 0; i < 16 && d0 + i < 2 * J; i++)
                meta[d0 + i] = W[i];
        }
    }
}

/* C[r, n .. n + 15] for rows r < MB (byte halves qh / ql, stride VNNI_QB; mult[r]; aj[r * J + j] =
   float(A_j)) and the N rows of B (rb bytes; K codes in groups of g, metadata fp16 or fp32), 16
   keys a block (a last partial block repeats B's last row and stores only its own).  SM: rows of at
   most 32 code bytes, through chunk16's small paths (the others: chunk16_rows). */
INLINE void kq_block(const int MB, const int KIND, const int SM, const int8_t *qh, const int8_t *ql, const uint8_t *B, size_t rb,
                     size_t N, size_t K, size_t g, int f16, const float *mult, const float *aj, float *C, size_t ldc)
{
    const int per = KIND == DOT_U8 ? 1 : KIND == DOT_U4 ? 2 : 4; /* byte sets per dword */
    const size_t cb = kq_code_bytes(KIND, K), J = K / g;
    const size_t gd = cb / J / 4, lines = (16 * rb + 63) / 64; /* dwords per group, lines per block */
    const __m512i f = _mm512_set1_epi8(KIND == DOT_U4 ? 0x0F : 0x03);
    __m512 meta[2 * (DOT_QK_K / 32)];
    for (size_t n = 0; n < N; n += 16) {
        const size_t nv = N - n < 16 ? N - n : 16;
        const char *kr[16];
        rows16(B, n, nv, rb, kr);
        kq_meta(SM, kr, cb, J, f16, meta);
        __m512i ah[4], al[4];
        __m512 S[4];
        UNROLL
        for (int r = 0; r < MB; r++) {
            ah[r] = al[r] = _mm512_setzero_si512();
            S[r] = _mm512_setzero_ps();
        }
        size_t j = 0, dw = 0; /* the group, its dwords done */
        for (size_t off = 0; off < cb; off += 64) {
            const size_t nd = (cb - off < 64 ? cb - off : 64) / 4;
            __m512 W[16];
            /* B streams from memory in decode: the block's rows KQ_PF rows ahead, a share per
               chunk (prefetches never fault) */
            for (size_t l = lines * off / cb; l < lines * (off + 64) / cb && l < lines; l++)
                _mm_prefetch(kr[0] + KQ_PF * rb + 64 * l, _MM_HINT_T0);
            kq_chunk(SM, kr, off, 4 * nd, W);
            UNROLL
            for (int i = 0; i < 16; i++) {
                if ((size_t)i >= nd)
                    break;
                const __m512i w = _mm512_castps_si512(W[i]);
                const size_t q = 4 * (size_t)per * (off / 4 + (size_t)i); /* the dword's query bytes */
                UNROLL
                for (int b = 0; b < per; b++) {
                    const __m512i u = KIND == DOT_U8 ? w : _mm512_and_si512(_mm512_srli_epi32(w, 8 / per * b), f);
                    UNROLL
                    for (int r = 0; r < MB; r++) {
                        ah[r] = vnni_dpbusd_b(ah[r], u, qh + r * VNNI_QB + q + 4 * b);
                        al[r] = vnni_dpbusd_b(al[r], u, ql + r * VNNI_QB + q + 4 * b);
                    }
                }
                if (++dw == gd) { /* the group's last dword: its finish */
                    const __m512 s = meta[2 * j], z = meta[2 * j + 1];
                    UNROLL
                    for (int r = 0; r < MB; r++) {
                        const __m512i d = _mm512_add_epi32(_mm512_slli_epi32(ah[r], 8), al[r]);
                        const __m512 t = _mm512_add_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(d)),
                                                       _mm512_mul_ps(z, _mm512_set1_ps(aj[r * J + j])));
                        S[r] = _mm512_add_ps(S[r], t);
                        ah[r] = al[r] = _mm512_setzero_si512();
                    }
                    j++, dw = 0;
                }
            }
        }
        UNROLL
        for (int r = 0; r < MB; r++)
            _mm512_mask_storeu_ps(C + r * ldc + n, mask16(nv), _mm512_mul_ps(S[r], _mm512_set1_ps(mult[r])));
    }
}

typedef void (*kq_fn)(const int8_t *, const int8_t *, const uint8_t *, size_t, size_t, size_t, size_t, int,
                      const float *, const float *, float *, size_t);
#define KQ_INST(MB, KIND, SM)                                                                          \
    static void kq_##MB##_##KIND##_##SM(const int8_t *qh, const int8_t *ql, const uint8_t *B, size_t rb,       \
                                        size_t N, size_t K, size_t g, int f16, const float *mult,             \
                                        const float *aj, float *C, size_t ldc)                                \
    {                                                                                                  \
        kq_block(MB, KIND, SM, qh, ql, B, rb, N, K, g, f16, mult, aj, C, ldc);                         \
    }
#define KQ_INSTS(SM)                                                                                   \
    KQ_INST(1, 1, SM) KQ_INST(2, 1, SM) KQ_INST(3, 1, SM) KQ_INST(4, 1, SM) /* DOT_U4 */              \
    KQ_INST(3, 2, SM) KQ_INST(4, 2, SM)                                     /* DOT_U8 */              \
    KQ_INST(1, 3, SM) KQ_INST(2, 3, SM) KQ_INST(3, 3, SM) KQ_INST(4, 3, SM) /* DOT_U2 */
KQ_INSTS(0)
KQ_INSTS(1)
/* [small][kind][rows]: the keys across the lanes where an entry is set, else gqk's blocks (INT8 of
   one or two rows: there the three transposes a block of 16 keys takes at H = 128 outweigh its
   dots; Zen 4, one thread, from memory: 0.7-0.97x); small: rows of at most 32 code bytes */
static const kq_fn kq_blocks[2][4][5] = {{{NULL, NULL, NULL, NULL, NULL},
                                          {NULL, kq_1_1_0, kq_2_1_0, kq_3_1_0, kq_4_1_0},
                                          {NULL, NULL, NULL, kq_3_2_0, kq_4_2_0},
                                          {NULL, kq_1_3_0, kq_2_3_0, kq_3_3_0, kq_4_3_0}},
                                         {{NULL, NULL, NULL, NULL, NULL},
                                          {NULL, kq_1_1_1, kq_2_1_1, kq_3_1_1, kq_4_1_1},
                                          {NULL, NULL, NULL, kq_3_2_1, kq_4_2_1},
                                          {NULL, kq_1_3_1, kq_2_3_1, kq_3_3_1, kq_4_3_1}}};

static void gqk512(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const uint8_t *B, int type,
                   float *C, size_t ldc)
{
    int16_t c[DOT_QK_K] __attribute__((aligned(64)));
    int8_t qb[2][4][VNNI_QB]; /* the rows' query codes' high and low bytes */
    float aj[4 * (DOT_QK_K / 32)];
    const size_t g = gqa_group_cols(type), J = K / g, rb = gqa_row_bytes(type, K);
    const int kind = gdot_kind(type), f16 = (type & GQA_META_F16) != 0;
    const int sm = kq_code_bytes(kind, K) <= 32; /* kq_block's small instances */
    const kq_fn(*const blocks)[5] = kq_blocks[sm];
    const float one = 1.0f; /* the per-tensor multiplier's scale: mult = fl(alpha * sa) */
    if (blocks[kind][M < 4 ? M : 4] == NULL) { /* gqk's blocks: its own row codes, made once */
        gqk(M, N, K, alpha, A, lda, B, type, C, ldc);
        return;
    }
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[4];
        float mult[4];
        int mb = 0;
        for (; m0 < M && mb < 4; ++m0) {
            if (qk_row(A + m0 * lda, K, &one, 0, alpha, c, K, &mult[mb])) {
                for (size_t j = 0; j < J; j++)
                    aj[mb * J + j] = (float)code_sum(c + j * g, g);
                vnni_code_bytes(c, K, kind == DOT_U8 ? 1 : kind == DOT_U4 ? 2 : 4, qb[0][mb], qb[1][mb]);
                rows[mb++] = m0;
            } else {
                DOT_EXACT.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, NULL, C + m0 * ldc, ldc);
            }
        }
        if (mb == 0)
            continue;
        const int together = rows[mb - 1] - rows[0] == (size_t)(mb - 1);
        if (blocks[kind][together ? mb : 1] == NULL) /* gqk's blocks (a remainder of 1-2 rows: its codes again) */
            for (int i = 0; i < mb; i += together ? mb : 1)
                gqk(together ? (size_t)mb : 1, N, K, alpha, A + rows[i] * lda, lda, B, type, C + rows[i] * ldc, ldc);
        else if (together)
            blocks[kind][mb](&qb[0][0][0], &qb[1][0][0], B, rb, N, K, g, f16, mult, aj, C + rows[0] * ldc, ldc);
        else
            for (int i = 0; i < mb; i++)
                blocks[kind][1](qb[0][i], qb[1][i], B, rb, N, K, g, f16, mult + i, aj + i * J, C + rows[i] * ldc,
                                   ldc);
    }
}
#endif
