/*
 * kernels_avx2_hadamard.h -- the `+had` rotation, 8 float32 lanes at a time: hadamard_rows_avx2,
 * gqa_hadamard_rows' statement (kernels_common.h) and its bits, for the avx2 and avx512 units
 * (ISA flags: -mavx2 -mfma; included after <immintrin.h> and kernels_common.h).
 *
 * Layout: n rows of H floats (ldx apart) -> o [n, H] (ldo apart), H a power of two up to
 * GQA_ROT_MAX; heads below 16 take gqa_hadamard_rows itself.  Viewed as m = H / 16 rows of 16,
 * element 16 q + k of the Sylvester product w lands at o[rev4(k) m + rev_m(q)] (rev: bit
 * reversal, rev(16 q + k) = rev4(k) m + rev_m(q)), so the permutation is a transpose.
 *  - The 16 x 16 blocks: a block's 16 sums in two vectors (lanes = the block's outputs k), each
 *    input x_l broadcast and added as x_l * sy[l][k] by one fused multiply-add (+-1 products are
 *    exact, so each step rounds once, as the statement's), l = 1 .. 15 in order.  A block's sums
 *    are a chain of 15 dependent additions: four blocks run together so that the chains
 *    overlap.  inverse: the inputs read in the order x[rev(e)].
 *  - The butterflies (a, b) -> (a + b, a - b): at distances 16 and 32 among those four blocks in
 *    registers, then at 64, 128, .., H / 2 over the row, 8 pairs a vector.
 *  - The output: inverse, o = c w; else the transpose, 8 x 8 (H = 64: 4 x 8) blocks of w's rows
 *    rev_m(a) in registers, each column k of a block stored at o's run rev4(k) m + a; H = 16, 32
 *    element by element.
 */
#ifndef GQA_KERNELS_AVX2_HADAMARD_H
#define GQA_KERNELS_AVX2_HADAMARD_H

/* w[i0 + 16 q + k] = x_(i0 + 16 q) + sum_{l = 1..15} x_(i0 + 16 q + l) sy[l][k] (in that order),
   x_e = xr[e] (ix NULL) or xr[ix[e]], for NB blocks q at once; then the butterflies among those
   blocks (each 2h-run's butterflies at h need only that run's at h / 2: the statement's values). */
INLINE void had_blocks(int NB, const float *xr, const int32_t *ix, float *w, size_t i0, const float (*sy)[16])
{
    __m256 lo[4], hi[4];
    UNROLL for (int q = 0; q < NB; q++) {
        const size_t e = i0 + 16 * (size_t)q;
        lo[q] = hi[q] = _mm256_mul_ps(_mm256_set1_ps(ix ? xr[ix[e]] : xr[e]), _mm256_set1_ps(1.0f));
    }
    UNROLL for (int l = 1; l < 16; l++) {
        const __m256 s0 = _mm256_load_ps(sy[l]), s1 = _mm256_load_ps(sy[l] + 8);
        UNROLL for (int q = 0; q < NB; q++) {
            const size_t e = i0 + 16 * (size_t)q + (size_t)l;
            const __m256 xl = _mm256_set1_ps(ix ? xr[ix[e]] : xr[e]);
            lo[q] = _mm256_fmadd_ps(xl, s0, lo[q]);
            hi[q] = _mm256_fmadd_ps(xl, s1, hi[q]);
        }
    }
    UNROLL for (int d = 1; d < NB; d <<= 1)
        UNROLL for (int q = 0; q < NB; q++)
            if (!(q & d)) {
                const __m256 a0 = lo[q], a1 = hi[q];
                lo[q] = _mm256_add_ps(a0, lo[q + d]);
                hi[q] = _mm256_add_ps(a1, hi[q + d]);
                lo[q + d] = _mm256_sub_ps(a0, lo[q + d]);
                hi[q + d] = _mm256_sub_ps(a1, hi[q + d]);
            }
    UNROLL for (int q = 0; q < NB; q++) {
        _mm256_store_ps(w + i0 + 16 * q, lo[q]);
        _mm256_store_ps(w + i0 + 16 * q + 8, hi[q]);
    }
}

/* The first half of an 8 x 8 transpose for rows x0 .. x3 (8 floats each): b[j] = (x0[j], x1[j],
   x2[j], x3[j] | x0[j + 4], .., x3[j + 4]), j < 4. */
INLINE void had_transpose4(__m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 b[4])
{
    const __m256 a0 = _mm256_unpacklo_ps(x0, x1), a1 = _mm256_unpackhi_ps(x0, x1);
    const __m256 a2 = _mm256_unpacklo_ps(x2, x3), a3 = _mm256_unpackhi_ps(x2, x3);
    b[0] = _mm256_shuffle_ps(a0, a2, 0x44);
    b[1] = _mm256_shuffle_ps(a0, a2, 0xEE);
    b[2] = _mm256_shuffle_ps(a1, a3, 0x44);
    b[3] = _mm256_shuffle_ps(a1, a3, 0xEE);
}

/* o[rev[k] + a] = c w[16 rev[16 a] + k] (rev[k] = rev4(k) m, rev[16 a] = rev_m(a)), m = H / 16 >= 4:
   H = 64, the 4 rows at once (rev[k + 8] = rev[k] + 4: columns k and k + 8 make one vector);
   else 8 x 8 blocks, a in runs of 8. */
INLINE void had_out(const float *w, const int32_t *rev, size_t m, __m256 cv, float *orow)
{
    if (m == 4) {
        const float *r0 = w + 16 * rev[0], *r1 = w + 16 * rev[16], *r2 = w + 16 * rev[32], *r3 = w + 16 * rev[48];
        __m256 lo[4], hi[4];
        had_transpose4(_mm256_load_ps(r0), _mm256_load_ps(r1), _mm256_load_ps(r2), _mm256_load_ps(r3), lo);
        had_transpose4(_mm256_load_ps(r0 + 8), _mm256_load_ps(r1 + 8), _mm256_load_ps(r2 + 8),
                       _mm256_load_ps(r3 + 8), hi);
        UNROLL for (int j = 0; j < 4; j++) {
            _mm256_storeu_ps(orow + rev[j], _mm256_mul_ps(cv, _mm256_permute2f128_ps(lo[j], hi[j], 0x20)));
            _mm256_storeu_ps(orow + rev[j + 4], _mm256_mul_ps(cv, _mm256_permute2f128_ps(lo[j], hi[j], 0x31)));
        }
        return;
    }
    for (size_t a = 0; a < m; a += 8) {
        const float *r[8];
        UNROLL for (int i = 0; i < 8; i++)
            r[i] = w + 16 * rev[16 * (a + (size_t)i)];
        UNROLL for (int k = 0; k < 16; k += 8) {
            __m256 b0[4], b1[4];
            had_transpose4(_mm256_load_ps(r[0] + k), _mm256_load_ps(r[1] + k), _mm256_load_ps(r[2] + k),
                           _mm256_load_ps(r[3] + k), b0);
            had_transpose4(_mm256_load_ps(r[4] + k), _mm256_load_ps(r[5] + k), _mm256_load_ps(r[6] + k),
                           _mm256_load_ps(r[7] + k), b1);
            UNROLL for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(orow + rev[k + j] + a, _mm256_mul_ps(cv, _mm256_permute2f128_ps(b0[j], b1[j], 0x20)));
                _mm256_storeu_ps(orow + rev[k + j + 4] + a, _mm256_mul_ps(cv, _mm256_permute2f128_ps(b0[j], b1[j], 0x31)));
            }
        }
    }
}

static void hadamard_rows_avx2(size_t n, size_t H, const float *x, size_t ldx, float *o,
                               size_t ldo, float c, int inverse)
{
    if (H < 16) {
        gqa_hadamard_rows(n, H, x, ldx, o, ldo, c, inverse);
        return;
    }
    const float (*sy)[16] = gqa_sylvester16();
    float w[GQA_ROT_MAX] __attribute__((aligned(32)));
    int32_t rev[GQA_ROT_MAX];
    const __m256 cv = _mm256_set1_ps(c);
    size_t r, i, h, j;
    gqa_bit_reversal(H, rev);
    for (r = 0; r < n; r++) {
        const float *xr = x + r * ldx;
        float *orow = o + r * ldo;
        GQA_HAD_ROW_BLOCKS(had_blocks, H, xr, rev, inverse, w, sy);
        for (h = 64; h < H; h <<= 1)
            for (i = 0; i < H; i += 2 * h)
                for (j = i; j < i + h; j += 8) {
                    const __m256 a = _mm256_load_ps(w + j), b = _mm256_load_ps(w + j + h);
                    _mm256_store_ps(w + j, _mm256_add_ps(a, b));
                    _mm256_store_ps(w + j + h, _mm256_sub_ps(a, b));
                }
        if (inverse)
            for (i = 0; i < H; i += 8)
                _mm256_storeu_ps(orow + i, _mm256_mul_ps(cv, _mm256_load_ps(w + i)));
        else if (H >= 64)
            had_out(w, rev, H / 16, cv, orow);
        else
            for (i = 0; i < H; i++)
                orow[i] = c * w[rev[i]];
    }
}

#endif
