/*
 * kernels_s8dot_contract.h -- accuracy level 4's integer-dot contracts, the one statement that
 * every unit implementing them follows bit for bit: the AVX-512 VNNI unit (vpdpwssd,
 * kernels_avx512vnni.c), the AMX INT8 unit (kernels_amxint8.c), both through kernels_s8dot.h,
 * and the AVX2 unit (vpmaddwd, kernels_avx2_s8dot.c).  ISA-free: the statement and its limits.
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
 * the AMX unit takes both halves as signed bytes in one tile.
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

#endif
