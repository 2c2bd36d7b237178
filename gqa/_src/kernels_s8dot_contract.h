/*
 * kernels_s8dot_contract.h -- accuracy level 4's integer-dot contracts, the one statement that
 * every unit implementing them follows bit for bit: the AVX-512 VNNI unit (vpdpwssd, vpdpbusd,
 * kernels_avx512vnni.c, kernels_avx512vnni_gdot.c), the AMX INT8 unit (kernels_amxint8.c), both through kernels_s8dot.h,
 * the AVX2 unit (vpmaddwd, kernels_avx2_s8dot.c, kernels_avx2_gdot.c) and the NEON unit (sdot,
 * kernels_neon_s8dot.c, kernels_neon_gdot.c).
 * ISA-free: the statement and its limits.
 *
 * qk_gemm_s8_dot, codes q [N, K] of GQA_S8_PT / GQA_S8_PC, or of GQA_S4_PT / GQA_S4_PC
 * (q = nibble - 8), K <= DOT_QK_K (wider heads, and other types: the exact kernel).  For each row m of A, with a_k = A[m,k] (per tensor) or
 * fl(A[m,k] * s[k]) (per channel):
 *   amax = max_k |a_k| not finite, 0, or QK_CODE_MAX / amax not finite: the row is the
 *               path's exact qk_gemm;
 *   otherwise:  inv = fl(QK_CODE_MAX / amax), sa = fl(amax / QK_CODE_MAX),
 *               code_k = clamp(rint(fl(a_k * inv)), -QK_CODE_MAX, QK_CODE_MAX)  (half to even),
 *               D[m,n] = sum_k code_k * q[n,k]           (exact in int32: |D| <= 512 * 32639 * 128 < 2^31;
 *                                                         a unit may form INT4's as sum code_k (q + 8) - 8 sum code_k),
 *               C[m,n] = fl(float(D) * mult), mult = fl(fl(alpha * sa) * s[0]) per tensor,
 *               fl(alpha * sa) per channel.
 * So |sum_k a_k q[n,k] - sa D[m,n]| <= sa / 2 sum_k |q[n,k]| + 2^-22 sum_k |a_k q[n,k]|:
 * 15 bits where onnxruntime's approximate VNNI kernel gives 8 (whose query rounding cost
 * SmolLM2 about 1 % of its top-1 agreement with level 0).  QK_CODE_MAX = 32639 = 127 * 257:
 * every code is 256 hi + lo with hi and lo both in [-127, 127] (hi = (code + 128) >> 8), so
 * the AMX and NEON units take both halves as signed bytes.
 *
 * sv_gemm_s8_dot, codes q [K, N] of the same types, scales s[0] or s[n].  For each row m
 * of A:
 *   an element negative, NaN or infinite, a row maximum pmax of 0, or 32767 / pmax not
 *   finite:     the row is the path's exact sv_gemm;
 *   otherwise:  inv = fl(32767 / pmax), sp = fl(pmax / 32767),
 *               code_k = min(32767, rint(fl(A[m,k] * inv)))       (15 bits, half to even),
 *               per chunk c of SV_KS keys, in order:
 *                 D_c[n] = sum_{k in c} code_k * q[k,n]           (exact in int32),
 *               r = (beta == 0 ? 0 : fl(beta * C[m,n])), then r = fl(r + fl(float(D_c[n]) * mult[n]))
 *               chunk by chunk, mult[n] = fl(sp * s[0]) or fl(sp * s[n]); C[m,n] = r.
 * Probabilities are quantized with 15 bits against their row's maximum, so
 *   |sum_k A[m,k] deq(q)[k,n] - sp sum_k code_k deq(q)[k,n]| <= sp (1/2 + 2^-9) sum_k |deq(q)[k,n]|
 *                                                              + 2^-22 sum_k A[m,k] |deq(q)[k,n]|.
 * (The 8-bit probabilities of vpdpbusd lost the many small probabilities of a row whose
 * maximum is an attention sink: SmolLM2's top-1 agreement with level 0 fell to 97 %.)
 *
 * Per-group codes (GQA_G8 / GQA_G4 / GQA_G2, kernels_group.h: u in [0, 2^b - 1], value u s_j + z_j
 * with the group's float32 metadata, binary16 widened exactly), groups of g columns where
 * gqa_group_dot_takes(type, cols) holds (g a multiple of 32 and at most GDOT_GMAX):
 *
 * qk_gemm_s8_dot, K <= DOT_QK_K: each row's codes code_k, sa and its exact-kernel cases as above
 * (a_k = A[m,k]); per group j of row n of B:
 *               D_j = sum_{k in j} code_k u[n,k],  A_j = sum_{k in j} code_k  (exact in int32:
 *                     g * 32639 * 255 < 2^31),
 *               S = 0, then for j = 0, 1, ..: S = fl(S + fl(fl(s_j * float(D_j)) + fl(z_j * float(A_j)))),
 *               C[m,n] = fl(S * mult), mult = fl(alpha * sa).
 * So |sum_k a_k x_k - sa (sum_j s_j D_j + z_j A_j)| <= sa / 2 sum_k |x_k| + 2^-22 sum_k |a_k x_k|
 * with x_k = u s_j + z_j, plus the float32 roundings of the J + 2 operations per group.
 *
 * sv_gemm_s8_dot, B [K, N] with groups along N: each row's exact-kernel cases as above; per
 * chunk c of SV_KG keys (in order) and group j of columns:
 *               w_k = fl(A[m,k] * s_kj), wmax = max_{k in c} w_k; inv = fl(32767 / wmax) and
 *               sp = fl(wmax / 32767) when wmax > 0 and inv is finite, else the chunk's codes
 *               and sp are 0;
 *               pcode_k = min(32767, rint(fl(w_k * inv))),
 *               D[n] = sum_{k in c} pcode_k u[k,n]        (exact in int32: 256 * 32767 * 255 < 2^31),
 *               Z_i = the sum in key order of fl(A[m,k] z_kj) over the chunk's keys k = c0 + i (mod 8)
 *                   (float32, from 0), Z = fl(fl(fl(Z_0 + Z_4) + fl(Z_2 + Z_6)) + fl(fl(Z_1 + Z_5) + fl(Z_3 + Z_7)));
 *               r = fl(fl(r + fl(float(D[n]) * sp)) + Z)   for n in group j,
 *               with r = (beta == 0 ? 0 : fl(beta * C[m,n])) before the first chunk; C[m,n] = r.
 * So the codes' part of a chunk moves by at most sp (1/2 + 2^-9) sum_k |u[k,n]| +
 * 2^-22 sum_k w_k |u[k,n]|: each chunk's probabilities times scales take 15 bits against their own
 * maximum.
 */
#ifndef GQA_KERNELS_S8DOT_CONTRACT_H
#define GQA_KERNELS_S8DOT_CONTRACT_H

#include "gqa_kernels.h"

/* 1 for the types whose codes the contracts take: INT8 and INT4, per tensor or per channel
   (the other types go to the exact kernels; the dispatch asks the same). */
static inline int gqa_dot_codes(int type)
{
    return type == GQA_S8_PT || type == GQA_S8_PC || type == GQA_S4_PT || type == GQA_S4_PC;
}

#define DOT_QK_K 512         /* the widest query row the QK contract covers */
#define QK_CODE_MAX 32639.0f /* query codes within +-(127 * 257) */
#define SV_CODE_MAX 32767.0f /* probability codes in [0, 32767] */
#define SV_KS 512            /* keys per integer chunk of P @ V */
#define SV_KG 256            /* ... on per-group codes */

#define GDOT_GMAX 256        /* the widest group they take (INT8's int32 limit of D_j) */

/* 1 where the per-group contracts take rows of `cols` elements of `type` (the others go to the
   exact kernels): groups of a multiple of 32 columns (one 16-byte step of INT4 codes, two of
   INT8, 8 bytes of INT2: a step never spans two groups) and of at most GDOT_GMAX; QK rows of at
   most DOT_QK_K (the caller checks K). */
static inline int gqa_group_dot_takes(int type, size_t cols)
{
    if (!GQA_IS_GROUP(type))
        return 0;
    const size_t g = gqa_group_cols(type);
    return g % 32 == 0 && g <= GDOT_GMAX && cols % g == 0;
}

#endif
