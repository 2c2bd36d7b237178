/*
 * kernels_avx512vnni.c -- the integer-dot kernels of path `avx512`, the one unit that issues
 * vpdpbusd / vpdpwssd: onnxruntime's approximate INT8 QK (GQA_QKGEMM_S8_APPROX_VNNI, per-tensor
 * codes, 8-bit query, opt-in) and accuracy level 4's QK and P @ V on INT8 and INT4 per-tensor
 * and per-channel codes (query rows and probabilities with 15 bits; kernels_s8dot_contract.h),
 * and on per-group codes (kernels_avx512vnni_gdot.c, which the entries hand group types).
 * ISA flags: the avx512 path's (-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma
 * -mf16c) plus -mavx512vnni; setup.py compiles it where the compiler can and then defines GQA_HAVE_AVX512VNNI for
 * kernels_avx512.c, whose table holds gqa_qk_gemm_s8_approx_avx512vnni,
 * gqa_qk_gemm_s8_dot_avx512vnni and gqa_sv_gemm_s8_dot_avx512vnni.  dispatch.c calls them
 * only where the CPU has AVX-512 VNNI (gqa_approx_vnni_runnable, gqa_s8_dot_table).
 *
 * Layout: QK: A float32 [M, K] (lda), B codes [N, K] (rows of gqa_row_bytes(type, K) bytes), C
 * float32 [M, N] (ldc), overwritten.  SV: A float32 [M, K] (lda), B codes [K, N] (rows of
 * gqa_row_bytes(type, N) bytes), C float32 [M, N] (ldc), C = beta * C + A @ deq(B).  INT4 codes
 * are widened as their nibbles u = q + 8 and the dots less 8 sum_k c_k (exact).
 *
 * The emulation build of tests/isa (GQA_EMULATE_AVX512) takes the intrinsics from SIMDe.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include "kernels_s8dot.h" /* kernels_avx512.h, level 4's contracts and quantizers */

/* Level 4 on per-group codes (kernels_avx512vnni_gdot.c), which the entries hand group types. */
void gqa_qk_gemm_g_dot_avx512vnni(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                  const void *B, int type, const float *s, float *C, size_t ldc);
void gqa_sv_gemm_g_dot_avx512vnni(size_t M, size_t N, size_t K, const float *A, size_t lda, const void *B,
                                  int type, const float *s, float *C, size_t ldc, float beta);

/* ---- qk_gemm_s8_approx (opt-in, AVX-512 VNNI) ---------------------------------
 *
 * Contract (onnxruntime MLAS's approximate VNNI QK, stated here), GQA_S8_PT only.  For each row m of A:
 *   amax = max_k |A[m,k]|;
 *   amax == 0 (or 127 / amax overflows, amax < ~3.7e-37): every code is 128
 *               and sa = 1, so the row's results are 0;
 *   otherwise:  sa = amax / 127, inv = 127 / amax (float32 divisions) and
 *               code_k = clamp(rint(fl(fl(A[m,k] * inv) + 128)), 0, 255)
 *               (product and sum each rounded to float32, never fused; rint
 *               rounds half to even), i.e. u8 with zero point 128;
 *   D[m,n] = sum_k code_k * q[n,k] - 128 * sum_k q[n,k]     (exact integer);
 *   C[m,n] = fl(float(D) * fl(fl(alpha * sa) * s)).
 * A row containing NaN or +-inf gives a row of NaN.
 *
 * How D is formed: with c = code - 128 in [-127, 127] (signed) and
 * q' = q + 128 in [0, 255] (unsigned, = q ^ 0x80), D = sum c*q
 * = sum q'*c - 128 * sum c: one vpdpbusd (u8 q' x s8 c) per 64 keys and row
 * pair, and a correction per row of A.  int32 lanes over chunks of at most
 * APPROX_KS keys (|partial| < 2^27), chunks summed in int64, so D never
 * overflows.  K not a multiple of 64: c is padded with 0, so whatever the
 * masked B bytes read (0 -> q' = 128), they add nothing.
 */

#define APPROX_KS 2048

/* Per-row quantization parameters; returns 0 when the row is not finite. */
static int approx_row_params(const float *a, size_t K, float *inv, float *sa)
{
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    *inv = 0.0f;
    *sa = 1.0f;
    for (size_t k = 0; k < K; k += 16) {
        __m512 v = _mm512_maskz_loadu_ps(mask16(K - k < 16 ? K - k : 16), a + k);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    const float amax = _mm512_reduce_max_ps(mx);
    if (bad || !(amax <= FLT_MAX))
        return 0;
    const float r = amax == 0.0f ? 0.0f : 127.0f / amax;
    const int zero = !(r <= FLT_MAX); /* amax == 0, or 127 / amax overflows */
    *inv = zero ? 0.0f : r;           /* inv 0 makes every code 128 */
    *sa = zero ? 1.0f : amax / 127.0f;
    return 1;
}

/* Signed codes c = code - 128 of A[k0, k1) into c[0, kp), kp = k1 - k0
   rounded up to 64, padded with 0; returns sum c. */
static int32_t approx_codes(const float *a, size_t k0, size_t k1, float inv, int8_t *c)
{
    const size_t n = k1 - k0, kp = (n + 63) & ~(size_t)63;
    const __m512 vinv = _mm512_set1_ps(inv), zp = _mm512_set1_ps(128.0f);
    const __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
    __m512i sum = _mm512_setzero_si512();
    size_t k = 0;
    for (; k < n; k += 16) {
        const __mmask16 m = mask16(n - k < 16 ? n - k : 16);
        __m512 t = _mm512_mul_round_ps(_mm512_maskz_loadu_ps(m, a + k0 + k), vinv,
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_add_round_ps(t, zp, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm512_max_ps(_mm512_min_ps(t, hi), lo);
        /* lanes past the row: 0 * inv + 128 = 128 -> c = 0 */
        __m512i v = _mm512_sub_epi32(_mm512_cvtps_epi32(t), _mm512_set1_epi32(128));
        sum = _mm512_add_epi32(sum, v);
        _mm_storeu_si128((__m128i *)(c + k), _mm512_cvtsepi32_epi8(v));
    }
    if (k < kp)
        memset(c + k, 0, kp - k);
    return _mm512_reduce_add_epi32(sum);
}

/* Lane i of the result = sum of the 16 int32 lanes of v_i (exact). */
INLINE __m256i fold256_epi32(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

INLINE __m256i hsum16x8_epi32(__m512i v0, __m512i v1, __m512i v2, __m512i v3, __m512i v4, __m512i v5,
                              __m512i v6, __m512i v7)
{
    __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(fold256_epi32(v0), fold256_epi32(v1)),
                                   _mm256_hadd_epi32(fold256_epi32(v2), fold256_epi32(v3)));
    __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(fold256_epi32(v4), fold256_epi32(v5)),
                                   _mm256_hadd_epi32(fold256_epi32(v6), fold256_epi32(v7)));
    return _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
}

/* sum_k q'[nb, k] * c[mb, k] over one chunk of n <= APPROX_KS keys (c rows
   at stride cs, padded to 64; B rows at stride rb), for an MB x NB block.
   D == NULL (the chunk is the whole row): C[mb, nb] = float(sum - corr[mb])
   * mult[mb].  Otherwise D[mb * NB + nb] += sum, and the caller finishes. */
INLINE void approx_block(const int MB, const int NB, const int8_t *c, size_t cs,
                                         const uint8_t *B, size_t rb, size_t n, const int32_t *corr,
                                         const float *mult, float *C, size_t ldc, int64_t *D)
{
    __m512i acc[16];
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const int nacc = (MB * NB + 7) & ~7;
    UNROLL
    for (int i = 0; i < nacc; i++)
        acc[i] = _mm512_setzero_si512();
    size_t k = 0;
    for (; k + 64 <= n; k += 64) {
        UNROLL
        for (int nb = 0; nb < NB; nb++) {
            __m512i b = _mm512_xor_si512(_mm512_loadu_si512((const void *)(B + nb * rb + k)), flip);
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                acc[mb * NB + nb] = _mm512_dpbusd_epi32(acc[mb * NB + nb], b,
                                                        _mm512_loadu_si512((const void *)(c + mb * cs + k)));
        }
    }
    if (k < n) { /* B read only up to the row's end */
        const __mmask64 m = mask64(n - k);
        UNROLL
        for (int nb = 0; nb < NB; nb++) {
            __m512i b = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, B + nb * rb + k), flip);
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                acc[mb * NB + nb] = _mm512_dpbusd_epi32(acc[mb * NB + nb], b,
                                                        _mm512_loadu_si512((const void *)(c + mb * cs + k)));
        }
    }
    UNROLL
    for (int g = 0; g < nacc; g += 8) {
        __m256i sum = hsum16x8_epi32(acc[g], acc[g + 1], acc[g + 2], acc[g + 3], acc[g + 4], acc[g + 5],
                                     acc[g + 6], acc[g + 7]); /* lane i: (g + i) / NB, (g + i) % NB */
        if (D == NULL) {
            int32_t cr[8];
            float mu[8], out[8];
            UNROLL
            for (int i = 0; i < 8; i++) {
                cr[i] = corr[((g + i) / NB) % MB];
                mu[i] = mult[((g + i) / NB) % MB];
            }
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum, _mm256_loadu_si256((const __m256i *)cr))),
                                     _mm256_loadu_ps(mu));
            if (NB == 8) {
                _mm256_storeu_ps(C + (g / 8) * ldc, v);
            } else {
                _mm256_storeu_ps(out, v);
                for (int i = 0; i < 8 && g + i < MB * NB; i++)
                    C[((g + i) / NB) * ldc + (g + i) % NB] = out[i];
            }
        } else {
            int32_t out[8];
            _mm256_storeu_si256((__m256i *)out, sum);
            for (int i = 0; i < 8 && g + i < MB * NB; i++)
                D[g + i] += out[i];
        }
    }
}

#define AP_INST(MB, NB)                                                                            \
    static void ap_##MB##x##NB(const int8_t *c, size_t cs, const uint8_t *B, size_t rb, \
                                               size_t n, const int32_t *corr, const float *mult,   \
                                               float *C, size_t ldc, int64_t *D)                   \
    {                                                                                              \
        approx_block(MB, NB, c, cs, B, rb, n, corr, mult, C, ldc, D);                              \
    }
AP_INST(1, 1) AP_INST(1, 8) AP_INST(2, 8) AP_INST(3, 4) AP_INST(4, 4) AP_INST(5, 2) AP_INST(6, 2)
AP_INST(7, 2) AP_INST(8, 2)
typedef void (*ap_fn)(const int8_t *, size_t, const uint8_t *, size_t, size_t, const int32_t *,
                      const float *, float *, size_t, int64_t *);

static void approx_qk_pt(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                         const void *B, int type, const float *s, float *C, size_t ldc)
{
    static const ap_fn blocks[9] = {ap_1x1, ap_1x8, ap_2x8, ap_3x4, ap_4x4, ap_5x2, ap_6x2, ap_7x2, ap_8x2};
    static const int nbs[9] = {1, 8, 8, 4, 4, 2, 2, 2, 2};
    int8_t c[8 * APPROX_KS] __attribute__((aligned(64)));
    const uint8_t *Bb = (const uint8_t *)B;
    (void)type;
    if (K == 0) { /* no codes: D = 0 */
        for (size_t m = 0; m < M; m++)
            memset(C + m * ldc, 0, N * sizeof(float));
        return;
    }
    const int once = K <= APPROX_KS; /* one int32 chunk: codes made once per block of rows */
    const size_t cs = once ? (K + 63) & ~(size_t)63 : APPROX_KS;
    for (size_t m0 = 0; m0 < M; m0 += 8) {
        const int mb = (int)(M - m0 < 8 ? M - m0 : 8), nb = nbs[mb];
        const float *a = A + m0 * lda;
        float *cm = C + m0 * ldc;
        float inv[8], mult[8];
        int32_t corr[8] = {0};
        for (int i = 0; i < mb; i++) {
            float sa = 1.0f;
            const int ok = approx_row_params(a + i * lda, K, &inv[i], &sa);
            mult[i] = ok ? (alpha * sa) * s[0] : NAN; /* a non-finite row gives NaN */
            if (once)
                corr[i] = 128 * approx_codes(a + i * lda, 0, K, inv[i], c + i * cs);
        }
        size_t n = 0;
        if (once) {
            for (; n + (size_t)nb <= N; n += (size_t)nb)
                blocks[mb](c, cs, Bb + n * K, K, K, corr, mult, cm + n, ldc, NULL);
            for (; n < N; n++)
                for (int i = 0; i < mb; i++)
                    blocks[0](c + i * cs, cs, Bb + n * K, K, K, corr + i, mult + i, cm + i * ldc + n, ldc, NULL);
            continue;
        }
        /* K > APPROX_KS: per block of B rows, chunk by chunk, remaking the
           codes of each chunk (the same codes), summing in int64. */
        for (; n < N;) {
            const int w = n + (size_t)nb <= N ? nb : 1;
            int64_t D[16] = {0}, csum[8] = {0};
            for (size_t k0 = 0; k0 < K; k0 += APPROX_KS) {
                const size_t k1 = K - k0 < APPROX_KS ? K : k0 + APPROX_KS;
                for (int i = 0; i < mb; i++)
                    csum[i] += approx_codes(a + i * lda, k0, k1, inv[i], c + i * cs);
                if (w > 1)
                    blocks[mb](c, cs, Bb + n * K + k0, K, k1 - k0, NULL, NULL, NULL, 0, D);
                else
                    for (int i = 0; i < mb; i++)
                        blocks[0](c + i * cs, cs, Bb + n * K + k0, K, k1 - k0, NULL, NULL, NULL, 0, D + i * w);
            }
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < w; j++)
                    cm[i * ldc + n + j] = (float)(D[i * w + j] - 128 * csum[i]) * mult[i];
            n += (size_t)w;
        }
    }
}

void gqa_qk_gemm_s8_approx_avx512vnni(size_t M, size_t N, size_t K, float alpha, const float *A,
                                      size_t lda, const void *B, int type, const float *s, float *C,
                                      size_t ldc)
{
    if (type != GQA_S8_PT) {
        gqa_kernels_avx512.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    approx_qk_pt(M, N, K, alpha, A, lda, B, type, s, C, ldc);
}

/* ---- qk_gemm_s8_dot (accuracy level 4, AVX-512 VNNI) -----------------------------------
 *
 * The contract: kernels_s8dot.h.  How D is formed, two ways (qk_block picks): INT8 with 1-2
 * rows, 32 codes of a B row widened to int16 (vpmovsxbw), one vpdpwssd per row of the block
 * (two rows: dot_block; one row: dot_seq, each key's codes read in order);
 * |lane| <= K / 32 * 2 * 32639 * 128 and the sum of the 16 lanes <= 512 * 32639 * 128 < 2^31,
 * padding codes 0.  The other rows and INT4: the keys across the lanes (kl_block, below).
 */
/* The QK kernels' prefetch distance (bytes of B ahead).  From DRAM the QK is bound by the lines in
   flight, about DOT_PF / latency: Zen 4, one thread, 64 buffers in turn, 2 rows x 128 INT8 74-75
   -> 60-67 µs at 8192 against 4096 (1 row level, 3 x 64 1.07x); decode steps from DRAM (2
   threads, 32 layers in turn) seed INT8 1.14-1.36x, the other shapes 1.0-1.05x; from L3 level. */
#define DOT_PF 8192

/* 32 INT8 codes as int16 (sign-extended) from the bytes at p under byte mask m (32 bytes at most). */
INLINE __m512i widen32(__mmask32 m, const int8_t *p)
{
    return _mm512_cvtepi8_epi16(load32_masked(m, p));
}

/* C[mb, n] for rows mb < MB of c (stride cs) and the N INT8 rows of B (stride rb), NB = 16 / MB
   rows of B at a time (a last partial block repeats B's last row and stores only its own). */
INLINE void dot_block(const int MB, const int16_t *c, size_t cs, const int8_t *B, size_t rb, size_t N, size_t K,
                      const float *mult, float *C, size_t ldc)
{
    const int NB = 16 / MB;
    float mu[16];
    UNROLL
    for (int i = 0; i < 16; i++)
        mu[i] = i < MB * NB ? mult[i / NB] : 0.0f;
    const __m512 vmu = _mm512_loadu_ps(mu);
    for (size_t n = 0; n < N; n += (size_t)NB) {
        const size_t nv = N - n < (size_t)NB ? N - n : (size_t)NB;
        __m512i acc[16];
        const int8_t *b[16];
        UNROLL
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_si512();
        UNROLL
        for (int nb = 0; nb < NB; nb++)
            b[nb] = B + (n + ((size_t)nb < nv ? (size_t)nb : nv - 1)) * rb;
        size_t k = 0;
        for (; k + 32 <= K; k += 32) {
            /* B streams from memory in decode: the block's rows DOT_PF bytes ahead (rows of a
               block are contiguous), one prefetch per line spread over the steps */
            UNROLL
            for (int j = 0; j < (32 * NB + 63) / 64; j++)
                _mm_prefetch((const char *)b[0] + DOT_PF + k * NB + 64 * j, STREAM_HINT);
            __m512i a[4];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = _mm512_load_si512((const void *)(c + mb * cs + k));
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                const __m512i bv = widen32((__mmask32)~0u, b[nb] + k);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm512_dpwssd_epi32(acc[mb * NB + nb], a[mb], bv);
            }
            UNROLL
            for (int i = 0; i < MB * NB; i++)
                DOT_KEEP(acc[i]);
        }
        if (k < K) { /* B read only up to the row's end */
            const __mmask32 m = (__mmask32)mask64(rb - k);
            __m512i a[4];
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                a[mb] = _mm512_load_si512((const void *)(c + mb * cs + k));
            UNROLL
            for (int nb = 0; nb < NB; nb++) {
                const __m512i bv = widen32(m, b[nb] + k);
                UNROLL
                for (int mb = 0; mb < MB; mb++)
                    acc[mb * NB + nb] = _mm512_dpwssd_epi32(acc[mb * NB + nb], a[mb], bv);
            }
        }
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(hsum16x16_epi32(acc)), vmu);
        /* lanes mb NB .. mb NB + nv - 1 -> C[mb, n ..]: a full block of 2 rows as 256-bit halves,
           the others permuted (with vcompressps here and without DOT_KEEP, Zen 4's INT8 QK of 4
           rows, H = 64, ran 1.13x slower, before those rows moved to kl_block) */
        if (MB == 2 && nv == 8) {
            _mm256_storeu_ps(C + n, _mm512_castps512_ps256(v));
            _mm256_storeu_ps(C + ldc + n, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        } else {
            UNROLL
            for (int mb = 0; mb < MB; mb++)
                _mm512_mask_storeu_ps(C + mb * ldc + n, mask16(nv),
                                      mb ? _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                                                  _mm512_set1_epi32(mb * NB)), v)
                                         : v);
        }
    }
}

/* ---- QK with the keys across the lanes (vpdpbusd on the query codes' bytes) ----
 *
 * The same D as dot_block.  Each query code as two signed bytes, code = 256 hi + lo (hi =
 * (code + 128) >> 8 in [-127, 127], lo in [-128, 127]), and each key code as an unsigned byte u
 * (INT8: q ^ 0x80 = q + 128; INT4: the nibble u = q + 8), so that D = 256 sum_k hi_k u_k +
 * sum_k lo_k u_k - z sum_k code_k (z = 128 or 8), each sum from vpdpbusd (u8 x s8, four products
 * a lane).  Sixteen keys' rows are loaded 64 bytes at a time and transposed, so that lane t of
 * vector i holds key t's dword i; one vpdpbusd per vector, row and byte half, with the row's four
 * bytes of that dword broadcast, sums each key in its own lane: no horizontal sums, and the
 * transposes are shared by the block's rows.  INT4 dwords split into their low nibbles (codes
 * 8i, 8i + 2, 8i + 4, 8i + 6) and high ones (8i + 1, ..), the query bytes stored in that order.
 * int32 lanes wrap alike in every order and |D| < 2^31 (the contract), so the sums give D
 * exactly.  Bytes past a row are loaded as 0 against query bytes of 0.
 */
/* C[mb, n .. n + 15] for rows mb < MB (byte halves qh / ql, stride VNNI_QB) and the N rows of B
   (stride rb), 16 keys a block (a last partial block repeats B's last row and stores only its
   own); D less corr[mb] (z sum_k code_k), times mult[mb].  Up to 4 rows the chunks are 64 bytes;
   5-8 rows take 32-byte chunks (chunk16_le32: 8 vectors, leaving registers for 16 sums), so
   that 8 rows go one pass over the keys. */
INLINE void kl_block(const int MB, const int S4, const int8_t *qh, const int8_t *ql, const int8_t *B, size_t rb,
                     size_t N, const float *mult, const int32_t *corr, float *C, size_t ldc)
{
    const size_t cw = MB > 4 ? 32 : 64, nch = (rb + cw - 1) / cw; /* chunk bytes, chunks a row */
    const __m512i flip = _mm512_set1_epi8((char)0x80), nib = _mm512_set1_epi8(0x0F);
    for (size_t n = 0; n < N; n += 16) {
        const size_t nv = N - n < 16 ? N - n : 16;
        const char *kr[16];
        rows16(B, n, nv, rb, kr);
        __m512i ah[8], al[8];
        UNROLL
        for (int i = 0; i < MB; i++)
            ah[i] = al[i] = _mm512_setzero_si512();
        for (size_t c = 0; c < nch; c++) {
            const size_t off = cw * c, nb = rb - off < cw ? rb - off : cw, nd = (nb + 3) / 4;
            __m512 W[16];
            /* W[i] lane t: key t's dword i of the chunk; B streams from memory in decode: each
               row DOT_PF bytes ahead into L2, every row width (INT4 at H = 64, 32-byte rows:
               from DRAM 1.05-1.1x with it, from L3 level; into L1 it had cost 0.97x there) */
            chunk16(kr, off, nb, DOT_PF, W);
            UNROLL
            for (int i = 0; i < 16; i++) {
                if ((size_t)i >= nd)
                    break;
                const __m512i w = _mm512_castps_si512(W[i]);
                const size_t q = 4 * (off / 4 + (size_t)i) * (S4 ? 2 : 1); /* the dword's query bytes */
                if (!S4) {
                    const __m512i u = _mm512_xor_si512(w, flip);
                    UNROLL
                    for (int r = 0; r < MB; r++) {
                        ah[r] = vnni_dpbusd_b(ah[r], u, qh + r * VNNI_QB + q);
                        al[r] = vnni_dpbusd_b(al[r], u, ql + r * VNNI_QB + q);
                    }
                } else {
                    const __m512i ue = _mm512_and_si512(w, nib), uo = _mm512_and_si512(_mm512_srli_epi32(w, 4), nib);
                    UNROLL
                    for (int r = 0; r < MB; r++) {
                        ah[r] = vnni_dpbusd_b(ah[r], ue, qh + r * VNNI_QB + q);
                        al[r] = vnni_dpbusd_b(al[r], ue, ql + r * VNNI_QB + q);
                        ah[r] = vnni_dpbusd_b(ah[r], uo, qh + r * VNNI_QB + q + 4);
                        al[r] = vnni_dpbusd_b(al[r], uo, ql + r * VNNI_QB + q + 4);
                    }
                }
            }
            UNROLL
            for (int r = 0; r < MB; r++) {
                DOT_KEEP(ah[r]);
                DOT_KEEP(al[r]);
            }
        }
        UNROLL
        for (int r = 0; r < MB; r++) {
            const __m512i d = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ah[r], 8), al[r]),
                                               _mm512_set1_epi32(corr[r]));
            _mm512_mask_storeu_ps(C + r * ldc + n, mask16(nv),
                                  _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(mult[r])));
        }
    }
}

/* C[0, n] for one row of c (K <= 32 KS codes, KS <= DOT_QK_K / 32) and the N INT8 rows of B
   (stride rb): 16 keys a block, each key's row read in order from its first byte to its last (a
   last partial block repeats B's last row and stores only its own), one prefetch of STREAM_HINT
   per 256 bytes of B, DOT_PF ahead.  Against dot_block's 32-byte steps across the block's 16
   rows, Zen 4, one thread, 8192 keys, 64 buffers in turn from DRAM: 84-91 -> 47-59 µs at K =
   128, 140-158 -> 88-94 at 256, 1.2-1.3x at 320 and 512, level at 64; from L3 1.02-1.05x at
   K <= 256, level at 320-512.  (A prefetch per line measured 1.15-1.3x slower at 256.) */
INLINE void dot_seq(const int KS, const int16_t *c, const int8_t *B, size_t rb, size_t N, float mult, float *C)
{
    const int every = KS >= 8 ? 1 : 8 / KS; /* keys per prefetch: 256 bytes at K = 32 KS */
    __m512i a[8]; /* the first 8 code vectors in registers, the others read where used */
    UNROLL
    for (int s = 0; s < KS && s < 8; s++)
        a[s] = _mm512_load_si512((const void *)(c + 32 * s));
    const __mmask32 mt = (__mmask32)mask64(rb - 32 * (size_t)(KS - 1)); /* the last step's bytes */
    const __m512 vmu = _mm512_set1_ps(mult);
    for (size_t n = 0; n < N; n += 16) {
        const size_t nv = N - n < 16 ? N - n : 16;
        __m512i acc[16];
        UNROLL
        for (int nb = 0; nb < 16; nb++) {
            const int8_t *r = B + (n + ((size_t)nb < nv ? (size_t)nb : nv - 1)) * rb;
            if (nb % every == 0)
                _mm_prefetch((const char *)r + DOT_PF, STREAM_HINT);
            acc[nb] = _mm512_setzero_si512();
            UNROLL
            for (int s = 0; s < KS; s++)
                acc[nb] = _mm512_dpwssd_epi32(acc[nb], s < 8 ? a[s] : _mm512_load_si512((const void *)(c + 32 * s)),
                                              widen32(s == KS - 1 ? mt : (__mmask32)~0u, r + 32 * s));
        }
        _mm512_mask_storeu_ps(C + n, mask16(nv), _mm512_mul_ps(_mm512_cvtepi32_ps(hsum16x16_epi32(acc)), vmu));
    }
}

#define SEQ_INST(KS)                                                                                   \
    static void dot_seq_##KS(const int16_t *c, const int8_t *B, size_t rb, size_t N, float mult, float *C) \
    {                                                                                                  \
        dot_seq(KS, c, B, rb, N, mult, C);                                                             \
    }
SEQ_INST(1) SEQ_INST(2) SEQ_INST(3) SEQ_INST(4) SEQ_INST(5) SEQ_INST(6) SEQ_INST(7) SEQ_INST(8)
SEQ_INST(9) SEQ_INST(10) SEQ_INST(11) SEQ_INST(12) SEQ_INST(13) SEQ_INST(14) SEQ_INST(15) SEQ_INST(16)
typedef void (*seq_fn)(const int16_t *, const int8_t *, size_t, size_t, float, float *);

#define KL_INST(MB, S4)                                                                                \
    static void kl_##MB##_##S4(const int8_t *qh, const int8_t *ql, const int8_t *B, size_t rb, size_t N,    \
                               const float *mult, const int32_t *corr, float *C, size_t ldc)                \
    {                                                                                                  \
        kl_block(MB, S4, qh, ql, B, rb, N, mult, corr, C, ldc);                                        \
    }
KL_INST(3, 0) KL_INST(4, 0) KL_INST(8, 0) KL_INST(1, 1) KL_INST(2, 1) KL_INST(3, 1) KL_INST(4, 1) KL_INST(8, 1)
typedef void (*kl_fn)(const int8_t *, const int8_t *, const int8_t *, size_t, size_t, const float *, const int32_t *,
                      float *, size_t);

/* Two INT8 rows (one: dot_seq). */
static void dot_2(const int16_t *c, size_t cs, const int8_t *B, size_t rb, size_t N, size_t K, const float *mult,
                  float *C, size_t ldc)
{
    dot_block(2, c, cs, B, rb, N, K, mult, C, ldc);
}

/* The sum of n int16 codes c[0, n) (n a multiple of 32), exact. */
static int32_t code_sum(const int16_t *c, size_t n)
{
    __m512i t = _mm512_setzero_si512();
    for (size_t k = 0; k < n; k += 32)
        t = _mm512_dpwssd_epi32(t, _mm512_load_si512((const void *)(c + k)), _mm512_set1_epi16(1));
    return _mm512_reduce_add_epi32(t);
}


/* The QK of nb <= 8 consecutive rows (codes c of stride cs, multipliers mult) against B into C
   (the first row's): keys across the lanes where kl_blocks has them (3-4 rows of INT8, 1-4 of INT4;
   8 consecutive rows through kl_8_*), else dot_seq (one row) or dot_2 (two).  The
   keys across the lanes against dot_block, Zen 4, one thread, 8192 keys: INT8 3-8 rows
   1.16-1.34x at H = 64-128, 1.00-1.04x at 256, 1-2 rows 0.61-0.98x (so they stay off them); INT4
   1 row 1.28-1.32x at H = 64-256, 2 rows 1.08-1.51x, 4 rows 1.06-1.42x. */
static void qk_block(int nb, const int16_t *c, size_t cs, const float *mult, const int8_t *B, size_t rb, size_t N,
                     size_t K, int s4, float *C, size_t ldc)
{
    static const kl_fn kl_blocks[2][5] = {{NULL, NULL, NULL, kl_3_0, kl_4_0}, {NULL, kl_1_1, kl_2_1, kl_3_1, kl_4_1}};
    static const kl_fn kl_eight[2] = {kl_8_0, kl_8_1};
    static const seq_fn seqs[DOT_QK_K / 32 + 1] = {NULL,       dot_seq_1,  dot_seq_2,  dot_seq_3,  dot_seq_4,
                                                  dot_seq_5,  dot_seq_6,  dot_seq_7,  dot_seq_8,  dot_seq_9,
                                                  dot_seq_10, dot_seq_11, dot_seq_12, dot_seq_13, dot_seq_14,
                                                  dot_seq_15, dot_seq_16};
    int8_t qb[2][8][VNNI_QB]; /* the rows' query codes' high and low bytes */
    int32_t corr[8];
    const kl_fn kl = nb == 8 ? kl_eight[s4] : kl_blocks[s4][nb];
    if (kl != NULL) {
        for (int i = 0; i < nb; i++) {
            corr[i] = (s4 ? 8 : 128) * code_sum(c + i * cs, cs);
            vnni_code_bytes(c + i * cs, cs, s4 ? 2 : 1, qb[0][i], qb[1][i]);
        }
        kl(&qb[0][0][0], &qb[1][0][0], B, rb, N, mult, corr, C, ldc);
    } else if (nb == 1) {
        seqs[(K + 31) / 32](c, B, rb, N, mult[0], C);
    } else {
        dot_2(c, cs, B, rb, N, K, mult, C, ldc);
    }
}

/* The QK of mb <= 8 taken rows (indices rows, codes c of stride cs, multipliers mult) against B:
   8 consecutive rows in one pass, else blocks of at most 4 consecutive ones, one row at a time
   where rows are apart (a row the contract leaves lies between them). */
static void qk_rows(int mb, const size_t *rows, const int16_t *c, size_t cs, const float *mult, const int8_t *B,
                    size_t rb, size_t N, size_t K, int s4, float *C, size_t ldc)
{
    for (int b0 = 0; b0 < mb;) {
        const int together8 = b0 == 0 && mb == 8 && rows[7] - rows[0] == 7;
        const int nb = together8 ? 8 : mb - b0 < 4 ? mb - b0 : 4;
        const size_t *r = rows + b0;
        const int16_t *cb = c + (size_t)b0 * cs;
        if (r[nb - 1] - r[0] == (size_t)(nb - 1))
            qk_block(nb, cb, cs, mult + b0, B, rb, N, K, s4, C + r[0] * ldc, ldc);
        else
            for (int i = 0; i < nb; i++)
                qk_block(1, cb + i * cs, cs, mult + b0 + i, B, rb, N, K, s4, C + r[i] * ldc, ldc);
        b0 += nb;
    }
}

void gqa_qk_gemm_s8_dot_avx512vnni(size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
                                   const void *B, int type, const float *s, float *C, size_t ldc)
{
    int16_t c[8 * DOT_QK_K] __attribute__((aligned(64)));
    if (GQA_IS_GROUP(type)) {
        gqa_qk_gemm_g_dot_avx512vnni(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    if (!gqa_dot_codes(type) || K == 0 || K > DOT_QK_K) {
        gqa_kernels_avx512.qk_gemm(M, N, K, alpha, A, lda, B, type, s, C, ldc);
        return;
    }
    const size_t cs = (K + 31) & ~(size_t)31, rb = gqa_row_bytes(type, K);
    for (size_t m0 = 0; m0 < M;) {
        size_t rows[8];
        float mult[8];
        const int mb = qk_take_rows(M, &m0, 8, N, K, alpha, A, lda, B, type, s, C, ldc, c, cs, rows, mult);
        qk_rows(mb, rows, c, cs, mult, (const int8_t *)B, rb, N, K, GQA_IS_S4(type), C, ldc);
    }
}

/* ---- sv_gemm_s8_dot (accuracy level 4, AVX-512 VNNI) -----------------------------------
 *
 * The contract: kernels_s8dot.h.
 * How D is formed: two keys at a time, each key's 64-column block becomes two vectors of 32
 * int16 codes -- INT8 its 32-column halves (vpmovsxbw; half h holds column 32 h + e in word e),
 * INT4 its 32 bytes zero-extended (vpmovzxbw) and split into the low nibbles (half 0: column 2 e
 * in word e) and the high ones (half 1: column 2 e + 1), the unsigned nibbles u = q + 8 --, the
 * two keys' halves interleaved by in-lane word unpacks, so that lane t of vector v holds the two
 * keys' codes of word e = 8 (t / 4) + 4 (v % 2) + t % 4 of half v / 2; one vpdpwssd per vector
 * and row adds the two products with the row's two codes (broadcast).  |one vpdpwssd| <= 2 *
 * 32767 * 128, 256 of them (SV_KS keys) < 2^31.  The sums return to column order by vpermt2d
 * (sv_columns).  Blocks go one pass over the chunk's keys each, two at a time for one or two
 * rows (each V row then read once).
 */
#define SV_PFR 64
#define SV_MB 4

/* One key's 64-column block at r as the two halves of the order above, the bytes under masks m0 /
   m1 (INT8: of the two 32-column halves; INT4: m0 of the block's 32 bytes). */
INLINE void sv_halves(const int S4, const int full, const int8_t *r, __mmask32 m0, __mmask32 m1, __m512i *h0,
                      __m512i *h1)
{
    if (!S4) {
        *h0 = widen32(full ? (__mmask32)~0u : m0, r);
        *h1 = widen32(full ? (__mmask32)~0u : m1, r + 32);
        return;
    }
    const __m512i x = _mm512_cvtepu8_epi16(load32_masked(full ? (__mmask32)~0u : m0, r));
    *h0 = _mm512_and_si512(x, _mm512_set1_epi16(0x0F));
    *h1 = _mm512_srli_epi16(x, 4);
}

/* Two keys' 64-column blocks (rows r0, r1 of codes; w columns: byte masks m0 / m1 of sv_halves)
   -> o[v] in the order above; then D[i][v] += (codes_i[k], codes_i[k+1]) . o[v] for rows i < MB. */
INLINE void sv_pair(const int MB, const int S4, const int full, const int8_t *r0, const int8_t *r1, __mmask32 m0,
                    __mmask32 m1, const int16_t *const *codes, size_t k, __m512i D[SV_MB][4])
{
    __m512i a0, a1, b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
    sv_halves(S4, full, r0, m0, m1, &a0, &a1);
    if (r1)
        sv_halves(S4, full, r1, m0, m1, &b0, &b1);
    const __m512i o[4] = {_mm512_unpacklo_epi16(a0, b0), _mm512_unpackhi_epi16(a0, b0),
                          _mm512_unpacklo_epi16(a1, b1), _mm512_unpackhi_epi16(a1, b1)};
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int v = 0; v < 4; v++) /* the row's code pair broadcast within the instruction */
            D[i][v] = vnni_dpwssd_b(D[i][v], o[v], codes[i] + k);
}

/* D[i][v] = the int32 dots of rows i < MB (codes, kn keys, padded with 0 to a multiple of
   2) with the 64-column block of B at b (w <= 64 columns, rows of ldb bytes), in sv_pair's lane
   order.  The sums build in local accumulators and reach D once (an out-of-line instance keeps
   all 4 x 4 in registers; summing into D itself spilled them at 4 rows). */
INLINE void sv_block(const int MB, const int S4, const int16_t *const *codes, size_t kn, const int8_t *B,
                     size_t ldb, size_t w, __m512i D[SV_MB][4])
{
    /* INT8: each 32-column half's bytes below w; INT4: the block's (w + 1) / 2 bytes */
    const __mmask32 m0 = (__mmask32)mask64(S4 ? (w + 1) / 2 : w < 32 ? w : 32),
                    m1 = (__mmask32)mask64(S4 || w <= 32 ? 0 : w - 32);
    __m512i acc[SV_MB][4];
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int v = 0; v < 4; v++)
            acc[i][v] = _mm512_setzero_si512();
    size_t k = 0;
    if (w == 64)
        for (; k + 2 <= kn; k += 2) {
            /* the rows SV_PFR ahead (decode streams the cache; prefetches never fault) */
            _mm_prefetch((const char *)(B + (k + SV_PFR) * ldb), STREAM_HINT);
            _mm_prefetch((const char *)(B + (k + SV_PFR + 1) * ldb) + (S4 ? 31 : 63), STREAM_HINT);
            sv_pair(MB, S4, 1, B + k * ldb, B + (k + 1) * ldb, m0, m1, codes, k, acc);
        }
    else
        for (; k + 2 <= kn; k += 2)
            sv_pair(MB, S4, 0, B + k * ldb, B + (k + 1) * ldb, m0, m1, codes, k, acc);
    if (k < kn) /* the last key; its partner's code is 0 */
        sv_pair(MB, S4, 0, B + k * ldb, NULL, m0, m1, codes, k, acc);
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int v = 0; v < 4; v++)
            D[i][v] = acc[i][v];
}

#define SVB_INST(MB, S4)                                                                               \
    static void svb_##MB##_##S4(const int16_t *const *codes, size_t kn, const int8_t *B, size_t ldb, size_t w, \
                                __m512i D[SV_MB][4])                                                  \
    {                                                                                                  \
        sv_block(MB, S4, codes, kn, B, ldb, w, D);                                                     \
    }
SVB_INST(1, 0) SVB_INST(2, 0) SVB_INST(3, 0) SVB_INST(4, 0) SVB_INST(1, 1) SVB_INST(2, 1) SVB_INST(3, 1)
SVB_INST(4, 1)
typedef void (*svb_fn)(const int16_t *const *, size_t, const int8_t *, size_t, size_t, __m512i[SV_MB][4]);

/* sv_block of two full 64-column blocks at once, B and the next 64 columns (D and D2), each V row
   read in one pass; MB <= 2 (the accumulators of more rows outnumber the registers).  Local
   accumulators, as in sv_block. */
INLINE void sv_block2(const int MB, const int S4, const int16_t *const *codes, size_t kn, const int8_t *B,
                      size_t ldb, __m512i D[SV_MB][4], __m512i D2[SV_MB][4])
{
    const size_t blk = S4 ? 32 : 64; /* bytes of 64 columns */
    __m512i acc[SV_MB][4], acc2[SV_MB][4];
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int v = 0; v < 4; v++)
            acc[i][v] = acc2[i][v] = _mm512_setzero_si512();
    size_t k = 0;
    for (; k + 2 <= kn; k += 2) {
        const int8_t *r0 = B + k * ldb, *r1 = r0 + ldb;
        /* the rows SV_PFR ahead: INT8 one prefetch a key pair, INT4 one a line.  Zen 4, one row
           and two, 128 columns, 8192 keys from DRAM (64 buffers in turn): for INT8 one a pair ran
           1.16-1.3x faster than one a line (the hardware prefetcher fills the other lines), for
           INT4 0.82-0.9x */
        _mm_prefetch((const char *)(r0 + SV_PFR * ldb), STREAM_HINT);
        if (S4) {
            _mm_prefetch((const char *)(r0 + SV_PFR * ldb) + 2 * blk - 1, STREAM_HINT);
            _mm_prefetch((const char *)(r1 + SV_PFR * ldb), STREAM_HINT);
            _mm_prefetch((const char *)(r1 + SV_PFR * ldb) + 2 * blk - 1, STREAM_HINT);
        }
        sv_pair(MB, S4, 1, r0, r1, 0, 0, codes, k, acc);
        sv_pair(MB, S4, 1, r0 + blk, r1 + blk, 0, 0, codes, k, acc2);
    }
    if (k < kn) {
        sv_pair(MB, S4, 1, B + k * ldb, NULL, 0, 0, codes, k, acc);
        sv_pair(MB, S4, 1, B + k * ldb + blk, NULL, 0, 0, codes, k, acc2);
    }
    UNROLL
    for (int i = 0; i < MB; i++)
        UNROLL
        for (int v = 0; v < 4; v++) {
            D[i][v] = acc[i][v];
            D2[i][v] = acc2[i][v];
        }
}

#define SVB2_INST(MB, S4)                                                                              \
    static void svb2_##MB##_##S4(const int16_t *const *codes, size_t kn, const int8_t *B, size_t ldb,        \
                                 __m512i D[SV_MB][4], __m512i D2[SV_MB][4])                          \
    {                                                                                                  \
        sv_block2(MB, S4, codes, kn, B, ldb, D, D2);                                                   \
    }
SVB2_INST(1, 0) SVB2_INST(2, 0) SVB2_INST(1, 1) SVB2_INST(2, 1)
typedef void (*svb2_fn)(const int16_t *const *, size_t, const int8_t *, size_t, __m512i[SV_MB][4],
                        __m512i[SV_MB][4]);

/* One row's sums D[4] back in column order: out[0..3] = columns 16 j .. 16 j + 15. */
INLINE void sv_columns(const int S4, const __m512i D[4], __m512i out[4])
{
    /* D[2h] lane group g (4 dwords): words 8 g + 0..3 of half h; D[2h+1]: + 4 */
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    /* h[2h + i]: words 16 i .. 16 i + 15 of half h, which are INT8's columns */
    const __m512i h[4] = {_mm512_permutex2var_epi32(D[0], lo, D[1]), _mm512_permutex2var_epi32(D[0], hi, D[1]),
                          _mm512_permutex2var_epi32(D[2], lo, D[3]), _mm512_permutex2var_epi32(D[2], hi, D[3])};
    if (!S4) {
        UNROLL
        for (int j = 0; j < 4; j++)
            out[j] = h[j];
        return;
    }
    /* INT4: word e of half 0 is column 2 e, of half 1 column 2 e + 1 */
    const __m512i e0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i e1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    out[0] = _mm512_permutex2var_epi32(h[0], e0, h[2]);
    out[1] = _mm512_permutex2var_epi32(h[0], e1, h[2]);
    out[2] = _mm512_permutex2var_epi32(h[1], e0, h[3]);
    out[3] = _mm512_permutex2var_epi32(h[1], e1, h[3]);
}

/* One chunk's sums D of rows i < mb (block at column n0, w columns), less corr[i] (INT4: S4), into
   their rows of C. */
INLINE void sv_rows_finish(const int S4, const __m512i D[SV_MB][4], int mb, const size_t *rows, const int32_t *corr, size_t w,
                           size_t n0, float *C, size_t ldc, int pc, const float *s, const float *sp, float beta,
                           int first)
{
    for (int i = 0; i < mb; i++) {
        __m512i d[4];
        sv_columns(S4, D[i], d);
        if (S4)
            for (int j = 0; j < 4; j++)
                d[j] = _mm512_sub_epi32(d[j], _mm512_set1_epi32(corr[i]));
        sv_finish(d, w, n0, C + rows[i] * ldc + n0, pc, s, sp[i], beta, first);
    }
}

void gqa_sv_gemm_s8_dot_avx512vnni(size_t M, size_t N, size_t K, const float *A, size_t lda,
                                   const void *B, int type, const float *s, float *C, size_t ldc,
                                   float beta)
{
    static const svb_fn sv_blocks[2][SV_MB + 1] = {{NULL, svb_1_0, svb_2_0, svb_3_0, svb_4_0},
                                                   {NULL, svb_1_1, svb_2_1, svb_3_1, svb_4_1}};
    static const svb2_fn sv_blocks2[2][3] = {{NULL, svb2_1_0, svb2_2_0}, {NULL, svb2_1_1, svb2_2_1}};
    int16_t codes[SV_MB][SV_KS + 32] __attribute__((aligned(64)));
    const int16_t *const cr[SV_MB] = {codes[0], codes[1], codes[2], codes[3]};
    const int8_t *Bb = (const int8_t *)B;
    const int pc = GQA_IS_PC(type), s4 = GQA_IS_S4(type);
    if (GQA_IS_GROUP(type)) {
        gqa_sv_gemm_g_dot_avx512vnni(M, N, K, A, lda, B, type, s, C, ldc, beta);
        return;
    }
    if (!gqa_dot_codes(type) || K == 0) {
        gqa_kernels_avx512.sv_gemm(M, N, K, A, lda, B, type, s, C, ldc, beta);
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
                sv_codes(A + rows[i] * lda, k0, k0 + kn, inv[i], codes[i]);
                corr[i] = 0;
                if (s4) { /* code_sum takes a multiple of 32 codes; sv_codes pads to 16 */
                    const size_t k16 = (kn + 15) & ~(size_t)15;
                    if (k16 & 16)
                        memset(codes[i] + k16, 0, 16 * sizeof(int16_t));
                    corr[i] = 8 * code_sum(codes[i], (k16 + 31) & ~(size_t)31);
                }
            }
            const int8_t *Bk = Bb + k0 * rb;
            size_t n0 = 0;
            if (mb <= 2) /* one or two rows: 128 columns per pass (Sapphire Rapids, seed shape, one thread:
                             the decode step about 1.4x faster than 64-column passes) */
                for (; n0 + 128 <= N; n0 += 128) {
                    __m512i D[SV_MB][4], D2[SV_MB][4];
                    const int8_t *Bn = Bk + gqa_row_bytes(type, n0);
                    sv_blocks2[s4][mb](cr, kn, Bn, rb, D, D2);
                    sv_rows_finish(s4, D, mb, rows, corr, 64, n0, C, ldc, pc, s, sp, beta, k0 == 0);
                    sv_rows_finish(s4, D2, mb, rows, corr, 64, n0 + 64, C, ldc, pc, s, sp, beta, k0 == 0);
                }
            for (; n0 < N; n0 += 64) {
                const size_t w = N - n0 < 64 ? N - n0 : 64;
                __m512i D[SV_MB][4];
                const int8_t *Bn = Bk + gqa_row_bytes(type, n0);
                sv_blocks[s4][mb](cr, kn, Bn, rb, w, D);
                sv_rows_finish(s4, D, mb, rows, corr, w, n0, C, ldc, pc, s, sp, beta, k0 == 0);
            }
        }
    }
}
#endif
