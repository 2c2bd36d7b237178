/*
 * kernels_avx2_pack.h -- the AVX2 level-4 unit's QK and P @ V for calls of many rows (a prompt's
 * flash tiles: rows x G query rows against a tile of keys): INT8 / INT4 per-tensor and
 * per-channel codes widened once per block of keys (QK) or of columns (P @ V) into packed int16
 * pairs that every row of the call then reads, so that each DOT_MADD is 16 products with no
 * widening, interleave or horizontal sum in the inner loop (Zen 3, operands in L1: 77 G
 * products/s a core in 6 x 16 blocks, against 46 G multiply-adds/s of the float32 kernels' FMA
 * blocks).  The contracts of kernels_s8dot_contract.h, bit for bit the results of
 * kernels_avx2_s8dot.c's blocks: each row's codes and multipliers come from the same qk_row /
 * sv_row / sv_codes, int32 sums are exact in any order (INT4 packed as the signed q = u - 8,
 * whose dots equal the blocks' sum c (q + 8) - 8 sum c), and the finish is the same float32
 * operations (qk: fl(float(D) mult); P @ V: sv_finish8 chunk by chunk).
 * ISA flags: the including unit's (kernels_avx2_s8dot.c: the avx2 path's; the avxvnni build).
 *
 * Packed layouts (on the stack: QK 59 KiB, codes 32 + widened rows 8 + Bq 16; P @ V 53 KiB):
 *   QK, a block of 16 keys n0 .. n0 + 15: Bq[p][16] int32, lane i the pair (q[n0 + i][2p],
 *     q[n0 + i][2p + 1]) (p < cs / 2; keys past N and columns past K are 0); rows' codes
 *     c[cs] (qk_row's, zero past K): acc[key lanes] += pair(c[2p], c[2p + 1]) . Bq[p].
 *   P @ V, a block of 16 columns n0 .. n0 + 15 and a chunk's keys: Bv[kp][32] int16, the pairs
 *     (q[2kp][n], q[2kp + 1][n]) in sv_block's lane order (`lo`: columns 0-3, 8-11; `hi`: 4-7,
 *     12-15), 0 past the chunk's keys and past N; rows' codes per chunk (sv_codes, zero past kn).
 */
#ifndef GQA_KERNELS_AVX2_PACK_H
#define GQA_KERNELS_AVX2_PACK_H

/* Calls of at least this many rows (the contracts' rows) take the packed kernels: below it the
   blocks of kernels_avx2_s8dot.c (1-4 rows a pass, each key's codes widened per pass) measured
   as fast or faster (a decode step's 1-8 query rows). */
#define PK_MIN_ROWS 16
/* Rows per group (each group packs the keys once): at most PK_ROWS rows of at most PK_CODES
   int16 codes together. */
#define PK_CODES 16384
#define PK_ROWS 256
/* Rows per register block: 6 x 16 sums in 12 accumulators. */
#define PK_MR 6

/* 16 codes at p as exact signed int16 in element order: INT8 as stored, INT4 as q = u - 8. */
INLINE __m256i pk_codes16(int type, const int8_t *p)
{
    return GQA_IS_S4(type) ? _mm256_sub_epi16(widen16(DOT_U4, p), _mm256_set1_epi16(8)) : widen16(DOT_S8, p);
}

/* Row r's n codes from p (stored codes of `type`, INT4 as q = u - 8) widened to int16 into
   dst[0, cs), 0 past n; never reads past the row's gqa_row_bytes(type, n) bytes. */
static void pk_widen_row(int type, const int8_t *p, size_t n, int16_t *dst, size_t cs)
{
    const size_t nf = n & ~(size_t)15;
    size_t k = 0;
    for (; k < nf; k += 16) {
        _mm256_storeu_si256((__m256i *)(dst + k), pk_codes16(type, p + gqa_row_bytes(type, k)));
    }
    if (k < n) {
        int8_t t[16] = {0};
        int16_t w[16];
        memcpy(t, p + gqa_row_bytes(type, k), gqa_row_bytes(type, n) - gqa_row_bytes(type, k));
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
                _mm256_store_si256((__m256i *)(dst + k), pk_widen16(type, r + gqa_row_bytes(type, k), 16));
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

/* QK of MR rows (codes c, multipliers mult, outputs at out[i]) against one packed block of
   16 keys, the first nv of which are stored. */
INLINE void pk_qk_rows(const int MR, const int16_t *c, size_t cs, const float *mult, float *const *out,
                       const int32_t *Bq, size_t nv)
{
    __m256i acc[2 * PK_MR];
    pk_dots(MR, c, cs, Bq, cs / 2, acc);
    UNROLL
    for (int i = 0; i < MR; i++) {
        const __m256 m = _mm256_set1_ps(mult[i]);
        const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[2 * i]), m);
        const __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[2 * i + 1]), m);
        if (nv == 16) {
            _mm256_storeu_ps(out[i], s0);
            _mm256_storeu_ps(out[i] + 8, s1);
        } else {
            float t[16];
            _mm256_storeu_ps(t, s0);
            _mm256_storeu_ps(t + 8, s1);
            memcpy(out[i], t, nv * sizeof(float));
        }
    }
}

#define PK_QK_INST(MR)                                                                                 \
    static void pk_qk_##MR(const int16_t *c, size_t cs, const float *mult, float *const *out,          \
                           const int32_t *Bq, size_t nv)                                               \
    {                                                                                                  \
        pk_qk_rows(MR, c, cs, mult, out, Bq, nv);                                                      \
    }
PK_QK_INST(1) PK_QK_INST(2) PK_QK_INST(3) PK_QK_INST(4) PK_QK_INST(5) PK_QK_INST(6)
typedef void (*pk_qk_fn)(const int16_t *, size_t, const float *, float *const *, const int32_t *, size_t);
static const pk_qk_fn pk_qk_blocks[PK_MR + 1] = {NULL, pk_qk_1, pk_qk_2, pk_qk_3, pk_qk_4, pk_qk_5, pk_qk_6};

/* qk_gemm_s8_dot of M rows (the entry's contract; K <= DOT_QK_K): rows in groups of at most
   PK_CODES codes, each group's keys packed 16 at a time and read by all its rows. */
static void pk_qk_gemm(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const int8_t *B,
                       int type, const float *s, float *C, size_t ldc)
{
    int16_t c[PK_CODES] __attribute__((aligned(32)));
    int16_t rows[8 * DOT_QK_K] __attribute__((aligned(32)));
    int32_t Bq[8 * DOT_QK_K] __attribute__((aligned(32)));
    const int pc = GQA_IS_PC(type);
    const size_t cs = (K + 15) & ~(size_t)15, rb = gqa_row_bytes(type, K);
    const size_t RG = PK_CODES / cs < PK_ROWS ? PK_CODES / cs : PK_ROWS;
    float mult[PK_ROWS];
    size_t idx[PK_ROWS];
    for (size_t m0 = 0; m0 < M;) {
        size_t g = 0;
        for (; m0 < M && g < RG; ++m0) {
            if (qk_row(A + m0 * lda, K, s, pc, alpha, c + g * cs, cs, &mult[g]))
                idx[g++] = m0;
            else
                DOT_EXACT.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc);
        }
        for (size_t n0 = 0; g > 0 && n0 < N; n0 += 16) {
            const size_t nv = N - n0 < 16 ? N - n0 : 16;
            pk_pack_keys(type, B, rb, n0, nv, K, cs, rows, Bq);
            for (size_t i = 0; i < g; i += PK_MR) {
                const size_t mr = g - i < PK_MR ? g - i : PK_MR;
                float *out[PK_MR];
                for (size_t r = 0; r < mr; r++)
                    out[r] = C + idx[i + r] * ldc + n0;
                pk_qk_blocks[mr](c + i * cs, cs, mult + i, out, Bq, nv);
            }
        }
    }
}

/* Bv of keys [0, kn) (kn <= SV_KS) and columns [n0, n0 + nv) of b (rows of ldb bytes), in
   sv_block's lane order. */
static void pk_pack_values(int type, const int8_t *b, size_t ldb, size_t kn, size_t n0, size_t nv, int16_t *Bv)
{
    const int8_t *r = b + gqa_row_bytes(type, n0);
    for (size_t k = 0; k < kn; k += 2) {
        const __m256i x0 = pk_widen16(type, r + k * ldb, nv);
        const __m256i x1 = k + 1 < kn ? pk_widen16(type, r + (k + 1) * ldb, nv) : _mm256_setzero_si256();
        _mm256_store_si256((__m256i *)(Bv + 16 * k), _mm256_unpacklo_epi16(x0, x1));
        _mm256_store_si256((__m256i *)(Bv + 16 * k + 16), _mm256_unpackhi_epi16(x0, x1));
    }
}

/* P @ V of MR rows (codes c, stride cs; the chunk's np key pairs) against one packed block of
   16 columns: the int32 sums of its first nv columns finished into out[i] as sv_finish does
   (sp[i]; scales sc: s[0], or the block's s[n0 ..] per channel). */
INLINE void pk_sv_rows(const int MR, const int16_t *c, size_t cs, const int16_t *Bv, size_t np, size_t nv,
                       float *const *out, const float *sc, int pc, const float *sp, float beta, int first)
{
    __m256i acc[2 * PK_MR];
    pk_dots(MR, c, cs, (const int32_t *)(const void *)Bv, np, acc);
    UNROLL
    for (int i = 0; i < MR; i++) {
        __m256i d[2];
        sv_order(acc[2 * i], acc[2 * i + 1], d);
        if (nv < 16) {
            int32_t D[16];
            _mm256_storeu_si256((__m256i *)D, d[0]);
            _mm256_storeu_si256((__m256i *)(D + 8), d[1]);
            sv_finish(D, 0, nv, out[i], sc, pc, sp[i], beta, first);
            continue;
        }
        /* a whole block finished from the registers */
        const __m256 vsp = _mm256_set1_ps(sp[i]);
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256 scale = _mm256_mul_ps(vsp, pc ? _mm256_loadu_ps(sc + 8 * h) : _mm256_set1_ps(sc[0]));
            _mm256_storeu_ps(out[i] + 8 * h, sv_finish8(_mm256_loadu_ps(out[i] + 8 * h), d[h], scale, beta, first));
        }
    }
}

#define PK_SV_INST(MR)                                                                                 \
    static void pk_sv_##MR(const int16_t *c, size_t cs, const int16_t *Bv, size_t np, size_t nv,       \
                           float *const *out, const float *sc, int pc, const float *sp, float beta,    \
                           int first)                                                                  \
    {                                                                                                  \
        pk_sv_rows(MR, c, cs, Bv, np, nv, out, sc, pc, sp, beta, first);                               \
    }
PK_SV_INST(1) PK_SV_INST(2) PK_SV_INST(3) PK_SV_INST(4) PK_SV_INST(5) PK_SV_INST(6)
typedef void (*pk_sv_fn)(const int16_t *, size_t, const int16_t *, size_t, size_t, float *const *, const float *,
                         int, const float *, float, int);
static const pk_sv_fn pk_sv_blocks[PK_MR + 1] = {NULL, pk_sv_1, pk_sv_2, pk_sv_3, pk_sv_4, pk_sv_5, pk_sv_6};

/* sv_gemm_s8_dot of M rows (the entry's contract): rows in groups of at most PK_CODES codes of a
   chunk, each chunk's 16-column blocks packed once per group and read by all its rows. */
static void pk_sv_gemm(size_t M, size_t N, size_t K, const float *A, size_t lda, const int8_t *B, int type,
                       const float *s, float *C, size_t ldc, float beta)
{
    int16_t c[PK_CODES] __attribute__((aligned(32)));
    int16_t Bv[16 * (SV_KS + 16)] __attribute__((aligned(32)));
    const int pc = GQA_IS_PC(type);
    const size_t rb = gqa_row_bytes(type, N), cs = ((K < SV_KS ? K : SV_KS) + 15) & ~(size_t)15;
    const size_t RG = PK_CODES / cs < PK_ROWS ? PK_CODES / cs : PK_ROWS;
    float inv[PK_ROWS], sp[PK_ROWS];
    size_t idx[PK_ROWS];
    for (size_t m0 = 0; m0 < M;) {
        size_t g = 0;
        for (; m0 < M && g < RG; ++m0) {
            if (sv_row(A + m0 * lda, K, &inv[g], &sp[g]))
                idx[g++] = m0;
            else
                DOT_EXACT.sv_gemm(1, N, K, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc, beta);
        }
        for (size_t k0 = 0; g > 0 && k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS;
            for (size_t i = 0; i < g; i++)
                sv_codes(A + idx[i] * lda + k0, kn, inv[i], c + i * cs);
            for (size_t n0 = 0; n0 < N; n0 += 16) {
                const size_t nv = N - n0 < 16 ? N - n0 : 16;
                pk_pack_values(type, B + k0 * rb, rb, kn, n0, nv, Bv);
                for (size_t i = 0; i < g; i += PK_MR) {
                    const size_t mr = g - i < PK_MR ? g - i : PK_MR;
                    float *out[PK_MR];
                    for (size_t r = 0; r < mr; r++)
                        out[r] = C + idx[i + r] * ldc + n0;
                    pk_sv_blocks[mr](c + i * cs, cs, Bv, (kn + 1) / 2, nv, out, pc ? s + n0 : s, pc, sp + i, beta,
                                     k0 == 0);
                }
            }
        }
    }
}

#endif
