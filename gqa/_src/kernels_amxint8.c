/*
 * kernels_amxint8.c -- accuracy level 4's integer dots on AMX INT8 tiles: qk_gemm_s8_dot and
 * sv_gemm_s8_dot (contracts in kernels_s8dot.h), bit for bit the results of the VNNI unit's,
 * for the decode steps' few query rows (G per KV head) against INT8 per-tensor / per-channel
 * codes.  ISA flags: the avx512 path's plus -mamx-tile -mamx-int8 -mamx-bf16 -mavx512bf16
 * (with kernels_amx.c, the amx unit; its tiles table holds these two).  Tile state: the caller
 * brackets the calls of one thread by the amx tiles' begin / end (eight 16 x 64-byte tiles).
 * Calls with fewer than AMX_MIN_ROWS rows run the VNNI kernels (the same results).
 *
 * A 15-bit code is two bytes in one tile: the rows (or columns) [0, mb) of the operand hold
 * the high parts of mb <= 8 rows, [mb, 2 mb) the low parts, and the int32 sums D_hi, D_lo give
 * D = 256 D_hi + D_lo exactly.
 *   QK: code = 256 hi + lo, hi = (code + 128) >> 8 and lo both in [-127, 127] (|code| <=
 *       32639), both signed: tdpbssd.  A = 16 rows of K codes as stored (row stride K bytes,
 *       64 columns per step), B = the query halves in the tiles' 4-byte groups (row r, group j:
 *       codes 4 r .. 4 r + 3 of column j), C = 16 keys x 16 columns, transposed to the
 *       output's rows.
 *   SV: code in [0, 32767], hi = code >> 8 in [0, 127], lo = code & 255: unsigned x the
 *       signed V codes, tdpbusd.  A = the probability halves (rows, 64 keys per step), B = 64
 *       V rows x 64 columns regrouped by four keys (vb below), C = 4 tiles x 16 columns.
 */
#include <stdint.h>
#include <string.h>
#include "kernels_s8dot.h"

/* Sapphire Rapids, T = 8192 decode: 2 rows (G = 2) ran 10-15 % slower on the tiles than on
   VNNI, 3 the same, 4 and 8 faster (8: 1.5x); the tiles' fixed costs (the 16 x 16 transpose
   of every C tile, the regrouping of V) are per key, whatever the rows. */
#define AMX_MIN_ROWS 3

/* ---- qk_gemm_s8_dot ------------------------------------------------------------------- */

#define QK_MB 8 /* rows per block: 2 * 8 columns of B */

/* B tiles of rows i < mb (codes c + i * cs, ks steps of 64): qb[step][r][4 j + b] = byte b of
   group r of column j (hi of row j for j < mb, lo of row j - mb for mb <= j < 2 mb, else 0). */
static void qk_pack_query(const int16_t *c, size_t cs, int mb, size_t ks, int8_t (*qb)[16][64])
{
    for (size_t st = 0; st < ks; st++) {
        __m512 col[16]; /* col[j]: the 16 groups of 4 bytes of column j, as bit patterns */
        for (int j = 0; j < 16; j++)
            col[j] = _mm512_setzero_ps();
        for (int i = 0; i < mb; i++) {
            const int16_t *ci = c + i * cs + 64 * st;
            __m128i hb[4], lb[4];
            for (int q = 0; q < 4; q++) {
                const __m256i v = _mm256_load_si256((const __m256i *)(ci + 16 * q));
                const __m256i hi = _mm256_srai_epi16(_mm256_add_epi16(v, _mm256_set1_epi16(128)), 8);
                const __m256i lo = _mm256_sub_epi16(v, _mm256_slli_epi16(hi, 8));
                hb[q] = _mm256_cvtepi16_epi8(hi);
                lb[q] = _mm256_cvtepi16_epi8(lo);
            }
            __m512i h = _mm512_castsi128_si512(hb[0]), l = _mm512_castsi128_si512(lb[0]);
            h = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(h, hb[1], 1), hb[2], 2), hb[3], 3);
            l = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(l, lb[1], 1), lb[2], 2), lb[3], 3);
            col[i] = _mm512_castsi512_ps(h);
            col[mb + i] = _mm512_castsi512_ps(l);
        }
        transpose16(col); /* col[r]: group r of every column */
        for (int r = 0; r < 16; r++)
            _mm512_store_ps((float *)qb[st][r], col[r]);
    }
}

/* C[rows[i], n .. n + nv) from one stored C tile (16 keys x columns hi 0..mb-1, lo 0..mb-1). */
INLINE void qk_finish(const int32_t (*cb)[16], int mb, const size_t *rows, const float *mult, size_t n,
                      size_t nv, float *C, size_t ldc)
{
    __m512 t[16];
    UNROLL
    for (int r = 0; r < 16; r++)
        t[r] = _mm512_load_ps((const float *)cb[r]);
    transpose16(t); /* t[j]: column j over the 16 keys */
    for (int i = 0; i < mb; i++) {
        const __m512i d = _mm512_add_epi32(_mm512_slli_epi32(_mm512_castps_si512(t[i]), 8),
                                           _mm512_castps_si512(t[mb + i]));
        _mm512_mask_storeu_ps(C + rows[i] * ldc + n, mask16(nv),
                              _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(mult[i])));
    }
}

/* Bytes [j pl, (j + 1) pl) from pf into L1, one prefetch per line. */
INLINE void qk_prefetch(const char *pf, size_t j, size_t pl)
{
    for (size_t l = j * pl; l < (j + 1) * pl; l += 64)
        _mm_prefetch(pf + l, _MM_HINT_T0);
}

/* The step of 64 codes j of two 16-key blocks a0, a1 (row strides s0, s1) with B in tile bt. */
#define QK_STEP(j, bt)                                                                             \
    do {                                                                                           \
        _tile_loadd(2, a0 + 64 * (j), s0);                                                         \
        _tile_dpbssd(0, 2, bt);                                                                    \
        if (two) {                                                                                 \
            _tile_loadd(3, a1 + 64 * (j), s1);                                                     \
            _tile_dpbssd(1, 3, bt);                                                                \
        }                                                                                          \
    } while (0)

/* The A operand of the 16-key block from row b: a tile's 16 rows of Kp bytes (stride *stride),
   which read B's bytes [b K, (b + 15) K + Kp) whatever N.  A block whose read would pass B's
   N K bytes (its rows past N, or K below Kp, near B's end: with K < Kp / 2 more than one block)
   reads a zero-padded copy of its rows in `tail` (16 rows of Kp bytes); the columns past K meet
   the query's zero groups. */
INLINE const int8_t *qk_block(const int8_t *Bb, size_t N, size_t K, size_t Kp, size_t b, int8_t *tail,
                              size_t *stride)
{
    if ((b + 15) * K + Kp <= N * K) {
        *stride = K;
        return Bb + b * K;
    }
    memset(tail, 0, 16 * Kp);
    for (size_t r = b; r < N && r < b + 16; r++)
        memcpy(tail + (r - b) * Kp, Bb + r * K, K);
    *stride = Kp;
    return tail;
}

/* Tiles 0 and 1 = the key blocks [n, n + 16) and [n + 16, n + 32) (the second where n + 16 < N)
   against the query's B tiles (in tiles 4 .. 3 + ks where ks <= 4, else loaded per step); tail:
   2 x 16 rows of Kp bytes, the blocks' copies where qk_block takes them. */
INLINE void qk_pair(const int8_t *Bb, size_t N, size_t K, size_t Kp, size_t ks, int8_t (*qb)[16][64],
                    int8_t *tail, size_t n)
{
    const int two = n + 16 < N;
    size_t s0, s1 = 0;
    const int8_t *a0 = qk_block(Bb, N, K, Kp, n, tail, &s0);
    const int8_t *a1 = two ? qk_block(Bb, N, K, Kp, n + 16, tail + 16 * Kp, &s1) : NULL;
    /* decode streams K: the rows two pairs ahead (contiguous; prefetches never fault), a ks-th
       of them before each step (Sapphire Rapids, H = 256: QK about 1.25x the rate of one burst
       per pair, whose misses outnumber the fill buffers and stall the tiles' loads) */
    const char *pf = (const char *)(Bb + (n + 64) * K);
    const size_t pl = 32 * K / ks;
    _tile_zero(0);
    _tile_zero(1);
    if (ks <= 4) {
        qk_prefetch(pf, 0, pl);
        QK_STEP(0, 4);
        if (ks > 1) { qk_prefetch(pf, 1, pl); QK_STEP(1, 5); }
        if (ks > 2) { qk_prefetch(pf, 2, pl); QK_STEP(2, 6); }
        if (ks > 3) { qk_prefetch(pf, 3, pl); QK_STEP(3, 7); }
    } else {
        for (size_t j = 0; j < ks; j++) {
            qk_prefetch(pf, j, pl);
            _tile_loadd(4, qb[j], 64);
            QK_STEP(j, 4);
        }
    }
}

void gqa_qk_gemm_s8_dot_amx(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                            const void *B, int type, const float *s, float *C, size_t ldc)
{
    int16_t c[QK_MB * DOT_QK_K] __attribute__((aligned(64)));
    int8_t qb[DOT_QK_K / 64][16][64] __attribute__((aligned(64)));
    int8_t tail[2 * 16 * DOT_QK_K] __attribute__((aligned(64)));
    int32_t cb[2][16][16] __attribute__((aligned(64)));
    const int8_t *Bb = (const int8_t *)B;
    const int pc = type == GQA_S8_PC;
    if ((type != GQA_S8_PT && !pc) || K == 0 || K > DOT_QK_K) {
        gqa_kernels_avx512.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    if (M < AMX_MIN_ROWS && gqa_kernels_avx512.qk_gemm_s8_dot != NULL) {
        gqa_kernels_avx512.qk_gemm_s8_dot(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    const size_t Kp = (K + 63) & ~(size_t)63, ks = Kp / 64;
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[QK_MB];
        float mult[QK_MB];
        const int mb = qk_take_rows(M, &m0, QK_MB, N, K, alpha, A, lda, B, type, s, C, ldc, c, Kp, rows, mult);
        if (mb == 0)
            continue;
        qk_pack_query(c, Kp, mb, ks, qb);
        if (ks <= 4) { /* B stays in tiles 4 .. 3 + ks */
            _tile_loadd(4, qb[0], 64);
            if (ks > 1) _tile_loadd(5, qb[1], 64);
            if (ks > 2) _tile_loadd(6, qb[2], 64);
            if (ks > 3) _tile_loadd(7, qb[3], 64);
        }
        /* the tiles of the pair of key blocks at n + 32 compute while the pair at n is finished */
        qk_pair(Bb, N, K, Kp, ks, qb, tail, 0);
        for (size_t n = 0; n < N; n += 32) {
            const int two = n + 16 < N;
            _tile_stored(0, cb[0], 64);
            if (two)
                _tile_stored(1, cb[1], 64);
            if (n + 32 < N)
                qk_pair(Bb, N, K, Kp, ks, qb, tail, n + 32);
            qk_finish(cb[0], mb, rows, mult, n, N - n < 16 ? N - n : 16, C, ldc);
            if (two)
                qk_finish(cb[1], mb, rows, mult, n + 16, N - n - 16 < 16 ? N - n - 16 : 16, C, ldc);
        }
    }
}

/* ---- sv_gemm_s8_dot ------------------------------------------------------------------- */

#define SV_MB 8

/* Row i's A tile bytes of one chunk, keys [k0, k0 + kn) of probability row a: ab[st][i] = the
   hi parts (code >> 8) of codes 64 st .., ab[st][mb + i] the lo parts (code & 255), 0 past kn.
   The codes are sv_code16's (kernels_s8dot.h), without sv_codes' int16 copy. */
static void sv_halves(const float *a, size_t k0, size_t kn, float inv, int mb, int i, uint8_t (*ab)[16][64])
{
    const __m512 vinv = _mm512_set1_ps(inv);
    /* after the two in-lane packs, 128-bit lane L, dword d holds codes 16 d + 4 L .. + 3 */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i low = _mm512_set1_epi32(255);
    for (size_t k = 0; k < kn; k += 64) {
        __m512i c[4];
        for (int q = 0; q < 4; q++) {
            const size_t kq = k + 16 * (size_t)q;
            const __mmask16 m = mask16(kn > kq ? (kn - kq < 16 ? kn - kq : 16) : 0);
            c[q] = sv_code16(_mm512_maskz_loadu_ps(m, a + k0 + kq), vinv); /* lanes past the row: 0 */
        }
        const __m512i hi = _mm512_packus_epi16(
            _mm512_packus_epi32(_mm512_srli_epi32(c[0], 8), _mm512_srli_epi32(c[1], 8)),
            _mm512_packus_epi32(_mm512_srli_epi32(c[2], 8), _mm512_srli_epi32(c[3], 8)));
        const __m512i lo = _mm512_packus_epi16(
            _mm512_packus_epi32(_mm512_and_si512(c[0], low), _mm512_and_si512(c[1], low)),
            _mm512_packus_epi32(_mm512_and_si512(c[2], low), _mm512_and_si512(c[3], low)));
        _mm512_store_si512((void *)ab[k / 64][i], _mm512_permutexvar_epi32(order, hi));
        _mm512_store_si512((void *)ab[k / 64][mb + i], _mm512_permutexvar_epi32(order, lo));
    }
}

/* B tiles of keys [k, k + 64) (kn of them valid) x columns [0, w) of rows V (stride ldb):
   vb[t][r][4 j + b] = V[k + 4 r + b][16 (j / 4) + 4 t + j % 4], zero past the keys and columns.
   So C tile t, column j, is the output column 16 (j / 4) + 4 t + j % 4. */
static void sv_pack_values(const int8_t *V, size_t ldb, size_t kn, size_t w, int8_t (*vb)[16][64], int pf)
{
    const __mmask64 cm = mask64(w);
    for (size_t r = 0; r < 16; r++) {
        __m512i x[4];
        if (pf) /* decode streams V: the whole rows of the next 64 keys (contiguous), a 16th per r */
            for (size_t l = 0; l < 4 * ldb; l += 64)
                _mm_prefetch((const char *)(V + 64 * ldb + 4 * r * ldb) + l, _MM_HINT_T0);
        for (int b = 0; b < 4; b++) {
            const size_t key = 4 * r + (size_t)b;
            x[b] = key < kn ? _mm512_maskz_loadu_epi8(cm, V + key * ldb) : _mm512_setzero_si512();
        }
        const __m512i t0 = _mm512_unpacklo_epi8(x[0], x[1]), t1 = _mm512_unpackhi_epi8(x[0], x[1]);
        const __m512i t2 = _mm512_unpacklo_epi8(x[2], x[3]), t3 = _mm512_unpackhi_epi8(x[2], x[3]);
        _mm512_store_si512((void *)vb[0][r], _mm512_unpacklo_epi16(t0, t2)); /* columns 16 L + 0..3 */
        _mm512_store_si512((void *)vb[1][r], _mm512_unpackhi_epi16(t0, t2)); /* 16 L + 4..7 */
        _mm512_store_si512((void *)vb[2][r], _mm512_unpacklo_epi16(t1, t3)); /* 16 L + 8..11 */
        _mm512_store_si512((void *)vb[3][r], _mm512_unpackhi_epi16(t1, t3)); /* 16 L + 12..15 */
    }
}

/* Row i's sums of the four stored C tiles, in column order: d[L] = columns 16 L .. 16 L + 15. */
INLINE void sv_columns_amx(const int32_t (*cb)[16][16], int mb, int i, __m512i d[4])
{
    __m512i u[4];
    UNROLL
    for (int t = 0; t < 4; t++)
        u[t] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512((const void *)cb[t][i]), 8),
                                _mm512_load_si512((const void *)cb[t][mb + i]));
    /* u[t], 128-bit lane L: columns 16 L + 4 t .. + 3; d[L] lane t = u[t] lane L */
    const __m512i a = _mm512_shuffle_i32x4(u[0], u[1], 0x44), b = _mm512_shuffle_i32x4(u[0], u[1], 0xEE);
    const __m512i c = _mm512_shuffle_i32x4(u[2], u[3], 0x44), e = _mm512_shuffle_i32x4(u[2], u[3], 0xEE);
    d[0] = _mm512_shuffle_i32x4(a, c, 0x88);
    d[1] = _mm512_shuffle_i32x4(a, c, 0xDD);
    d[2] = _mm512_shuffle_i32x4(b, e, 0x88);
    d[3] = _mm512_shuffle_i32x4(b, e, 0xDD);
}

void gqa_sv_gemm_s8_dot_amx(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B, int type,
                            const float *s, float *C, size_t ldc, float beta)
{
    uint8_t ab[SV_KS / 64][16][64] __attribute__((aligned(64)));
    int8_t vb[2][4][16][64] __attribute__((aligned(64)));
    int32_t cb[4][16][16] __attribute__((aligned(64)));
    const int8_t *Bb = (const int8_t *)B;
    const int pc = type == GQA_S8_PC;
    if ((type != GQA_S8_PT && !pc) || K == 0) {
        gqa_kernels_avx512.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    if (M < AMX_MIN_ROWS && gqa_kernels_avx512.sv_gemm_s8_dot != NULL) {
        gqa_kernels_avx512.sv_gemm_s8_dot(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[SV_MB];
        float inv[SV_MB], sp[SV_MB];
        const int mb = sv_take_rows(M, &m0, SV_MB, N, K, A, lda, B, type, s, C, ldc, beta, rows, inv, sp);
        if (mb == 0)
            continue;
        for (size_t st = 0; st < SV_KS / 64; st++) /* the A tiles' rows past the block's halves */
            memset(ab[st][2 * mb], 0, (size_t)(16 - 2 * mb) * 64);
        for (size_t k0 = 0; k0 < K; k0 += SV_KS) {
            const size_t kn = K - k0 < SV_KS ? K - k0 : SV_KS, steps = (kn + 63) / 64;
            for (int i = 0; i < mb; i++)
                sv_halves(A + rows[i] * lda, k0, kn, inv[i], mb, i, ab);
            for (size_t n0 = 0; n0 < N; n0 += 64) {
                const size_t w = N - n0 < 64 ? N - n0 : 64;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                /* step st + 1 is regrouped before step st's tiles load theirs: the stores are
                   not the next instructions' inputs */
                sv_pack_values(Bb + k0 * N + n0, N, kn, w, vb[0], n0 == 0);
                for (size_t st = 0; st < steps; st++) {
                    int8_t (*v)[16][64] = vb[st & 1];
                    const size_t k = 64 * st;
                    if (st + 1 < steps)
                        sv_pack_values(Bb + (k0 + k + 64) * N + n0, N, kn - k - 64, w, vb[(st + 1) & 1], n0 == 0);
                    _tile_loadd(4, ab[st], 64);
                    _tile_loadd(5, v[0], 64);
                    _tile_dpbusd(0, 4, 5);
                    _tile_loadd(6, v[1], 64);
                    _tile_dpbusd(1, 4, 6);
                    _tile_loadd(7, v[2], 64);
                    _tile_dpbusd(2, 4, 7);
                    _tile_loadd(5, v[3], 64);
                    _tile_dpbusd(3, 4, 5);
                }
                _tile_stored(0, cb[0], 64);
                _tile_stored(1, cb[1], 64);
                _tile_stored(2, cb[2], 64);
                _tile_stored(3, cb[3], 64);
                for (int i = 0; i < mb; i++) {
                    __m512i d[4];
                    sv_columns_amx((const int32_t (*)[16][16])cb, mb, i, d);
                    sv_finish(d, w, n0, C + rows[i] * ldc + n0, pc, s, sp[i], beta, k0 == 0);
                }
            }
        }
    }
}
