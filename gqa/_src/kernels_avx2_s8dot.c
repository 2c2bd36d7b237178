/*
 * kernels_avx2_s8dot.c -- accuracy level 4's integer-dot kernels of path `avx2`: QK and P @ V on
 * INT8 and INT4 per-tensor and per-channel codes with 15-bit query rows and probabilities, the
 * contracts of kernels_s8dot_contract.h, bit for bit the results of the AVX-512 VNNI unit (and,
 * on INT8, the AMX INT8 unit).
 * ISA flags: the avx2 path's (-mavx2 -mfma -mf16c); setup.py compiles it with the path and then
 * defines GQA_HAVE_AVX2_S8DOT for kernels_avx2.c, whose table holds gqa_qk_gemm_s8_dot_avx2 and
 * gqa_sv_gemm_s8_dot_avx2.  Every AVX2 CPU runs them.  The avxvnni unit builds this source again
 * (kernels_avxvnni_s8dot.c: DOT_UNIT avxvnni, each vpmaddwd + vpaddd one vpdpwssd).
 *
 * The integer dots are vpmaddwd (int16 pairs x int16 pairs, summed to int32) plus vpaddd (DOT_MADD):
 * exact, since no pair reaches -32768 * -32768 (query codes within +-32639, probability codes in
 * [0, 32767], cache codes in [-128, 127]), and the sums stay within the contract's int32 limits;
 * integer sums do not depend on their order, so these kernels give the contract's bits.
 *
 * INT4 codes are taken as their nibbles u = q + 8 in [0, 15], widened to int16, and the dots
 * corrected exactly: sum_k c_k q_k = sum_k c_k u_k - 8 sum_k c_k.  QK takes 16 bytes a step, the
 * low nibbles as 16 even elements and the high ones as 16 odd ones, against the query codes in
 * that order (even_odd); P @ V widens 16 columns in column order (widen16).
 *
 * Layout: QK: A float32 [M, K] (lda), B codes [N, K] (rows of gqa_row_bytes(type, K) bytes), C
 * float32 [M, N] (ldc), overwritten.  SV: A float32 [M, K] (lda), B codes [K, N] (rows of
 * gqa_row_bytes(type, N) bytes), C float32 [M, N] (ldc), C = beta * C + A @ deq(B).  Neither
 * reads B past its last byte.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels_avx2_dot.h"


/* ---- qk_gemm_s8_dot ------------------------------------------------------------------------ */

#define QK_PF 4096

/* One step of a B row (its 16 bytes x) for rows mb < MB of the codes c (stride cs):
   acc[mb * NB] += the products of its codes.  INT4: the low nibbles are the even elements of 32,
   the high nibbles the odd ones, against c's even-then-odd order. */
INLINE void qk_step(const int MB, const int NB, const int S4, const __m128i x, const int16_t *c, size_t cs,
                    __m256i *acc)
{
    if (!S4) {
        const __m256i bv = _mm256_cvtepi8_epi16(x);
        UNROLL
        for (int mb = 0; mb < MB; mb++)
            acc[mb * NB] = DOT_MADD(acc[mb * NB], _mm256_load_si256((const __m256i *)(c + mb * cs)), bv);
        return;
    }
    const __m128i f = _mm_set1_epi8(0x0F);
    const __m256i ev = _mm256_cvtepu8_epi16(_mm_and_si128(x, f));
    const __m256i od = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x, 4), f));
    UNROLL
    for (int mb = 0; mb < MB; mb++) {
        const __m256i e = DOT_MADD(acc[mb * NB], _mm256_load_si256((const __m256i *)(c + mb * cs)), ev);
        acc[mb * NB] = DOT_MADD(e, _mm256_load_si256((const __m256i *)(c + mb * cs + 16)), od);
    }
}

/* The n < 16 bytes at p in the low bytes of a vector, the rest 0, never reading past p + n: whole
   dwords by a masked load (its masked-off dwords are not read), a last 1-3 bytes copied.  (A
   memcpy of the whole tail into a zeroed buffer, read back at once, cost a store-forwarding
   stall per row: Zen 4, one thread, INT4 QK at K = 80 and 112 2.3-4x slower than at 96.) */
INLINE __m128i load_tail16(const int8_t *p, size_t n)
{
    const __m128i lane = _mm_setr_epi32(0, 1, 2, 3), w = _mm_set1_epi32((int)(n / 4));
    __m128i v = _mm_maskload_epi32((const int *)(const void *)p, _mm_cmpgt_epi32(w, lane));
    if (n % 4) {
        uint32_t t = 0;
        memcpy(&t, p + n / 4 * 4, n % 4);
        v = _mm_or_si128(v, _mm_and_si128(_mm_set1_epi32((int)t), _mm_cmpeq_epi32(w, lane)));
    }
    return v;
}

/* C[mb, n] for rows mb < MB of c (stride cs) and the N rows of B (rb bytes each), NB rows of B at
   a time (a last partial block repeats B's last row and stores only its own); INT4 (S4) sums
   less corr[mb] = 8 sum_k c[mb, k].  The columns past the last whole step (K % 16, INT4 K % 32)
   come from load_tail16, so B is never read past a row. */
INLINE void qk_block(const int MB, const int NB, const int S4, const int16_t *c, size_t cs, const int8_t *B,
                     size_t rb, size_t N, size_t K, const float *mult, const int32_t *corr, float *C, size_t ldc)
{
    /* a step: 16 codes (INT8: 16 bytes), or 32 (INT4: 16 bytes, even elements then odd, the
       order qk_row leaves A's codes in) */
    const size_t KS = S4 ? 32 : 16, Kf = K / KS * KS;
    __m128 mu[3];   /* lane i of mu[g]: the multiplier of accumulator 4 g + i's row */
    __m128i cq[3];  /* ... and its correction */
    UNROLL
    for (int g = 0; g < 3; g++) {
        float m4[4];
        int32_t c4[4];
        for (int i = 0; i < 4; i++) {
            m4[i] = 4 * g + i < MB * NB ? mult[(4 * g + i) / NB] : 0.0f;
            c4[i] = S4 && 4 * g + i < MB * NB ? corr[(4 * g + i) / NB] : 0;
        }
        mu[g] = _mm_loadu_ps(m4);
        cq[g] = _mm_loadu_si128((const __m128i *)c4);
    }
    for (size_t n = 0; n < N; n += (size_t)NB) {
        const size_t nv = N - n < (size_t)NB ? N - n : (size_t)NB;
        const int8_t *b[8];
        __m256i acc[12];
        UNROLL
        for (int nb = 0; nb < NB; nb++)
            b[nb] = B + (n + ((size_t)nb < nv ? (size_t)nb : nv - 1)) * rb;
        UNROLL
        for (int i = 0; i < MB * NB; i++)
            acc[i] = _mm256_setzero_si256();
        size_t k = 0;
        for (; k < Kf; k += KS) {
            /* B streams from memory in decode: the block's rows QK_PF bytes ahead, one prefetch
               per line spread over the steps (a block's rows are contiguous) */
            UNROLL
            for (int j = 0; j < (16 * NB + 63) / 64; j++)
                _mm_prefetch((const char *)b[0] + QK_PF + k / KS * 16 * NB + 64 * j, _MM_HINT_T0);
            UNROLL
            for (int nb = 0; nb < NB; nb++)
                qk_step(MB, NB, S4, _mm_loadu_si128((const __m128i *)(b[nb] + k / KS * 16)), c + k, cs, acc + nb);
            UNROLL
            for (int i = 0; i < MB * NB; i++)
                DOT_KEEP(acc[i]);
        }
        if (k < K) {
            UNROLL
            for (int nb = 0; nb < NB; nb++)
                qk_step(MB, NB, S4, load_tail16(b[nb] + k / KS * 16, rb - k / KS * 16), c + k, cs, acc + nb);
        }
        /* sums of 4 accumulators at a time, times their rows' multipliers (mu) */
        float out[12];
        UNROLL
        for (int g = 0; g < MB * NB; g += 4) {
            const __m256i z = _mm256_setzero_si256();
            __m128i d = hsum4_epi32(acc[g], g + 1 < MB * NB ? acc[g + 1] : z, g + 2 < MB * NB ? acc[g + 2] : z,
                                    g + 3 < MB * NB ? acc[g + 3] : z);
            if (S4)
                d = _mm_sub_epi32(d, cq[g / 4]);
            qk_store_lanes(MB, NB, g, _mm_mul_ps(_mm_cvtepi32_ps(d), mu[g / 4]), nv, C, ldc, n, out);
        }
        qk_store_rest(MB, NB, nv, out, C, ldc, n);
    }
}

/* Codes c[0, n) (n a multiple of 32) reordered within each 32: the 16 even elements, then the 16
   odd ones (qk_step's INT4 order). */
static void even_odd(int16_t *c, size_t n)
{
    for (size_t k = 0; k < n; k += 32) {
        int16_t t[32];
        for (int i = 0; i < 16; i++) {
            t[i] = c[k + 2 * i];
            t[16 + i] = c[k + 2 * i + 1];
        }
        memcpy(c + k, t, sizeof(t));
    }
}

#define QK_INST(MB, NB, S4)                                                                            \
    static void qk_##MB##x##NB##_##S4(const int16_t *c, size_t cs, const int8_t *B, size_t rb, size_t N,      \
                                      size_t K, const float *mult, const int32_t *corr, float *C, size_t ldc) \
    {                                                                                                  \
        qk_block(MB, NB, S4, c, cs, B, rb, N, K, mult, corr, C, ldc);                                  \
    }
/* rows of A x rows of B per block: 1x8 2x4 3x4 4x2, at most 12 accumulators */
#define QK_KIND(S4)                                                                                    \
    QK_INST(1, 8, S4) QK_INST(2, 4, S4) QK_INST(3, 4, S4) QK_INST(4, 2, S4)                            \
    static const qk_fn qk_blocks_##S4[5] = {NULL, qk_1x8_##S4, qk_2x4_##S4, qk_3x4_##S4, qk_4x2_##S4};
typedef void (*qk_fn)(const int16_t *, size_t, const int8_t *, size_t, size_t, size_t, const float *,
                      const int32_t *, float *, size_t);
QK_KIND(0) QK_KIND(1)


static void sv_finish(const int32_t *d, int32_t corr, size_t w, float *crow, const float *s, int pc,
                      float sp, float beta, int first);
#include "kernels_avx2_pack.h"

/* ---- calls of PK_MIN_ROWS rows or more: the packed operands of kernels_avx2_pack.h ----------
 * Stack: QK 59 KiB (codes 32, widened rows 8, Bq 16), P @ V 53 KiB (codes 32, Bv 16.5). */

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
        pk_store16(out[i], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[2 * i]), m),
                   _mm256_mul_ps(_mm256_cvtepi32_ps(acc[2 * i + 1]), m), nv);
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
                float *out[PK_MR];
                const size_t mr = pk_block_rows(C, ldc, idx, i, g, n0, out);
                pk_qk_blocks[mr](c + i * cs, cs, mult + i, out, Bq, nv);
            }
        }
    }
}

/* P @ V of MR rows (codes c, stride cs; the chunk's np key pairs) against one packed block of
   16 columns: the int32 sums of its first nv columns finished into out[i] as sv_finish does
   (sp[i]; scales sc: s[0], or the block's s[n0 ..] per channel). */
INLINE void pk_sv_rows(const int MR, const int16_t *c, size_t cs, const int16_t *Bv, size_t np, size_t nv,
                       float *const *out, const float *sc, int pc, const float *sp, float beta, int first)
{
    __m256i d[PK_MR][2];
    pk_sv_dots(MR, c, cs, Bv, np, d);
    UNROLL
    for (int i = 0; i < MR; i++) {
        if (nv < 16) {
            int32_t D[16];
            _mm256_storeu_si256((__m256i *)D, d[i][0]);
            _mm256_storeu_si256((__m256i *)(D + 8), d[i][1]);
            sv_finish(D, 0, nv, out[i], sc, pc, sp[i], beta, first);
            continue;
        }
        /* a whole block finished from the registers */
        const __m256 vsp = _mm256_set1_ps(sp[i]);
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256 scale = _mm256_mul_ps(vsp, pc ? _mm256_loadu_ps(sc + 8 * h) : _mm256_set1_ps(sc[0]));
            _mm256_storeu_ps(out[i] + 8 * h,
                             sv_finish8(_mm256_loadu_ps(out[i] + 8 * h), d[i][h], scale, beta, first));
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
        const size_t g = (size_t)sv_take_rows(M, &m0, (int)RG, N, K, A, lda, B, type, s, C, ldc, beta, idx, inv, sp);
        for (size_t k0 = 0; g > 0 && k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS;
            for (size_t i = 0; i < g; i++)
                sv_codes(A + idx[i] * lda + k0, kn, inv[i], c + i * cs);
            for (size_t n0 = 0; n0 < N; n0 += 16) {
                const size_t nv = N - n0 < 16 ? N - n0 : 16;
                pk_pack_values(type, B + k0 * rb, rb, kn, n0, nv, Bv);
                for (size_t i = 0; i < g; i += PK_MR) {
                    float *out[PK_MR];
                    const size_t mr = pk_block_rows(C, ldc, idx, i, g, n0, out);
                    pk_sv_blocks[mr](c + i * cs, cs, Bv, (kn + 1) / 2, nv, out, pc ? s + n0 : s, pc, sp + i, beta,
                                     k0 == 0);
                }
            }
        }
    }
}

void DOT_ENTRY(gqa_qk_gemm_s8_dot_)(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda, const void *B,
                             int type, const float *s, float *C, size_t ldc)
{
    int16_t c[4 * DOT_QK_K] __attribute__((aligned(32)));
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    if (GQA_IS_GROUP(type)) {
        DOT_ENTRY(gqa_qk_gemm_g_dot_)(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    if (!gqa_dot_codes(type) || K == 0 || K > DOT_QK_K) {
        DOT_EXACT.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    if (M >= PK_MIN_ROWS) {
        pk_qk_gemm(M, N, K, alpha, A, lda, (const int8_t *)B, type, s, C, ldc);
        return;
    }
    const qk_fn *blocks = s4 ? qk_blocks_1 : qk_blocks_0;
    const size_t cs = s4 ? (K + 31) & ~(size_t)31 : (K + 15) & ~(size_t)15, rb = gqa_row_bytes(type, K);
    for (size_t m0 = 0; m0 < M;) {
        /* blocks of at most 4 consecutive rows the contract covers; each other row exact */
        size_t rows[4];
        float mult[4];
        int32_t corr[4];
        int mb = 0;
        for (; m0 < M && mb < 4; ++m0) {
            if (qk_row(A + m0 * lda, K, s, pc, alpha, c + mb * cs, cs, &mult[mb])) {
                corr[mb] = 0;
                if (s4) {
                    corr[mb] = 8 * code_sum(c + mb * cs, cs);
                    even_odd(c + mb * cs, cs);
                }
                rows[mb++] = m0;
            } else {
                DOT_EXACT.qk_gemm(1, N, K, alpha, A + m0 * lda, lda, B, type, s, C + m0 * ldc, ldc);
            }
        }
        if (mb == 0)
            continue;
        if (rows[mb - 1] - rows[0] == (size_t)(mb - 1))
            blocks[mb](c, cs, (const int8_t *)B, rb, N, K, mult, corr, C + rows[0] * ldc, ldc);
        else
            for (int i = 0; i < mb; i++)
                blocks[1](c + i * cs, cs, (const int8_t *)B, rb, N, K, mult + i, corr + i, C + rows[i] * ldc, ldc);
    }
}

/* ---- sv_gemm_s8_dot ------------------------------------------------------------------------ */

static void sv_eo_1x2(const int16_t *codes, size_t kn, const int8_t *b, size_t ldb, int32_t *D, size_t ldd,
                      int first)
{
    sv_block_eo(1, 2, codes, kn, b, ldb, D, ldd, first);
}

static void sv_eo_2x1(const int16_t *codes, size_t kn, const int8_t *b, size_t ldb, int32_t *D, size_t ldd,
                      int first)
{
    sv_block_eo(2, 1, codes, kn, b, ldb, D, ldd, first);
}

/* Columns of one block width, for MB rows. */
#define SV_INST(MB, NV, S4)                                                                            \
    static void sv_##MB##x##NV##_##S4(const int16_t *codes, size_t kn, const int8_t *b, size_t ldb,       \
                                      int32_t *D, size_t ldd, int first)                               \
    {                                                                                                  \
        sv_block(MB, NV, S4, codes, kn, b, ldb, D, ldd, first);                                        \
    }
/* the wide blocks of INT8 (INT4's: sv_block_eo), then the narrow ones of both */
SV_INST(1, 4, 0) SV_INST(2, 2, 0)
SV_INST(3, 1, 0) SV_INST(4, 1, 0) SV_INST(1, 1, 0) SV_INST(2, 1, 0)
SV_INST(3, 1, 1) SV_INST(4, 1, 1) SV_INST(1, 1, 1) SV_INST(2, 1, 1)
typedef void (*sv_fn)(const int16_t *, size_t, const int8_t *, size_t, int32_t *, size_t, int);
/* per INT4 flag and row count: the wide block (16 NV columns; INT4 with one or two rows: even and
   odd columns apart), its NV, the 16-column block */
static const sv_fn sv_wide[2][SV_MB + 1] = {{NULL, sv_1x4_0, sv_2x2_0, sv_3x1_0, sv_4x1_0},
                                            {NULL, sv_eo_1x2, sv_eo_2x1, sv_3x1_1, sv_4x1_1}};
static const int sv_nv[SV_MB + 1] = {0, 4, 2, 1, 1};
static const sv_fn sv_one[2][SV_MB + 1] = {{NULL, sv_1x1_0, sv_2x1_0, sv_3x1_0, sv_4x1_0},
                                           {NULL, sv_1x1_1, sv_2x1_1, sv_3x1_1, sv_4x1_1}};

/* Columns per call of sv_chunk: its int32 sums D live on the stack. */
#define SV_NC 512

/* The int32 sums of rows i < mb (codes, kn keys) with the w <= SV_NC columns of B's rows at b
   (stride ldb; INT4: the nibbles u), into D[i][0, w) (overwritten).  Pairs of keys and whole
   16-column blocks first; then an odd last key and the last w % 16 columns, through zero-padded
   copies of their bytes. */
static void sv_chunk(int mb, int type, const int16_t *codes, size_t kn, const int8_t *b, size_t ldb, size_t w,
                     int32_t *D, size_t ldd)
{
    const int s4 = GQA_IS_S4(type);
    const size_t w16 = w & ~(size_t)15, nvw = 16 * (size_t)sv_nv[mb];
    const size_t kp = sv_pass_keys(gqa_row_bytes(type, w));
    const sv_fn wide = sv_wide[s4][mb], one = sv_one[s4][mb];
    if (kn < 2 || w16 < w) /* sums the first pass does not store */
        for (int i = 0; i < mb; i++)
            memset(D + i * ldd, 0, w * sizeof(int32_t));
    for (size_t k = 0; k < kn; k += kp) {
        const size_t kk = kn - k < kp ? kn - k : kp, ke = kk & ~(size_t)1;
        const int8_t *bk = b + k * ldb;
        const int16_t *ck = codes + k;
        const int first = k == 0 && kn >= 2;
        size_t n = 0;
        if (ke) {
            for (; n + nvw <= w16; n += nvw)
                wide(ck, ke, bk + gqa_row_bytes(type, n), ldb, D + n, ldd, first);
            for (; n < w16; n += 16)
                one(ck, ke, bk + gqa_row_bytes(type, n), ldb, D + n, ldd, first);
        }
        for (size_t n0 = 0; n0 < w; n0 += 16) {
            const size_t wn = w - n0 < 16 ? w - n0 : 16, nbytes = gqa_row_bytes(type, wn);
            for (size_t k2 = n0 < w16 ? ke : 0; k2 < kk; k2 += 2) {
                /* rows k2 and k2 + 1 (zeros past the chunk: its code there is sv_codes' 0 pad) */
                int8_t t[2][16] = {{0}};
                int32_t d[SV_MB][16];
                memcpy(t[0], bk + k2 * ldb + gqa_row_bytes(type, n0), nbytes);
                if (k2 + 1 < kk)
                    memcpy(t[1], bk + (k2 + 1) * ldb + gqa_row_bytes(type, n0), nbytes);
                one(ck + k2, 2, &t[0][0], 16, &d[0][0], 16, 1);
                for (int i = 0; i < mb; i++)
                    for (size_t x = 0; x < wn; x++)
                        D[i * ldd + n0 + x] += d[i][x];
            }
        }
    }
}

/* One chunk's sums d[0, w) into crow: crow[n] = (first ? (beta == 0 ? 0 : fl(beta crow[n])) :
   crow[n]) + fl(float(d[n] - corr) fl(sp s[n or 0])). */
static void sv_finish(const int32_t *d, int32_t corr, size_t w, float *crow, const float *s, int pc, float sp,
                      float beta, int first)
{
    const __m256 vsp = _mm256_set1_ps(sp);
    const __m256i vc = _mm256_set1_epi32(corr);
    /* the last w % 8 columns through a copy: vmaskmovps stores are microcoded on AMD (Zen 3:
       most of a short decode step's finish) */
    for (size_t n = 0; n < w; n += 8) {
        const size_t nv = w - n < 8 ? w - n : 8;
        float cb[8] = {0}, sb[8] = {0};
        int32_t db[8] = {0};
        float *cr = crow + n;
        const float *sc = s + n;
        const int32_t *dn = d + n;
        if (nv < 8) {
            memcpy(cb, cr, nv * sizeof(float));
            memcpy(db, dn, nv * sizeof(int32_t));
            if (pc)
                memcpy(sb, sc, nv * sizeof(float));
            cr = cb, sc = sb, dn = db;
        }
        const __m256 scale = _mm256_mul_ps(vsp, pc ? _mm256_loadu_ps(sc) : _mm256_set1_ps(s[0]));
        const __m256i dv = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)dn), vc);
        _mm256_storeu_ps(cr, sv_finish8(_mm256_loadu_ps(cr), dv, scale, beta, first));
        if (nv < 8)
            memcpy(crow + n, cb, nv * sizeof(float));
    }
}

void DOT_ENTRY(gqa_sv_gemm_s8_dot_)(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                             const float *s, float *C, size_t ldc, float beta)
{
    int16_t codes[SV_MB][SV_KS + 16] __attribute__((aligned(32)));
    int32_t D[SV_MB * SV_NC];
    const int8_t *Bb = (const int8_t *)B;
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    if (GQA_IS_GROUP(type)) {
        DOT_ENTRY(gqa_sv_gemm_g_dot_)(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    if (!gqa_dot_codes(type) || K == 0) {
        DOT_EXACT.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    if (M >= PK_MIN_ROWS) {
        pk_sv_gemm(M, N, K, A, lda, Bb, type, s, C, ldc, beta);
        return;
    }
    const size_t rb = gqa_row_bytes(type, N);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[SV_MB];
        float inv[SV_MB], sp[SV_MB];
        const int mb = sv_take_rows(M, &m0, SV_MB, N, K, A, lda, B, type, s, C, ldc, beta, rows, inv, sp);
        if (mb == 0)
            continue;
        for (size_t k0 = 0; k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS;
            int32_t corr[SV_MB];
            for (int i = 0; i < mb; i++) {
                sv_codes(A + rows[i] * lda + k0, kn, inv[i], codes[i]);
                corr[i] = s4 ? 8 * code_sum(codes[i], (kn + 15) & ~(size_t)15) : 0;
            }
            for (size_t n0 = 0; n0 < N; n0 += SV_NC) { /* SV_NC is even: column n0 starts a byte */
                const size_t w = N - n0 < SV_NC ? N - n0 : SV_NC;
                sv_chunk(mb, type, &codes[0][0], kn, Bb + k0 * rb + gqa_row_bytes(type, n0), rb, w, D, SV_NC);
                for (int i = 0; i < mb; i++)
                    sv_finish(D + i * SV_NC, corr[i], w, C + rows[i] * ldc + n0, pc ? s + n0 : s, pc, sp[i], beta,
                              k0 == 0);
            }
        }
    }
}
#endif
