/*
 * kernels_avxvnni_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / GQA_G4 / GQA_G2) for
 * the avx2 path's AVX-VNNI unit: kernels_avx2_gdot.c's kernels (their layout, blocks and the
 * per-group contracts of kernels_s8dot_contract.h, bit for bit) built with each int16 pair dot
 * and its add as one VEX vpdpwssd (DOT_MADD under GQA_DOT_AVXVNNI), the entries
 * gqa_*_gemm_g_dot_avxvnni, and the avx2 path's exact kernels for what the contracts leave.
 * ISA flags: the avx2 path's plus -mavxvnni (the avxvnni unit, with kernels_avxvnni_s8dot.c,
 * whose entries hand group types here).
 */
#define GQA_DOT_AVXVNNI
#define DOT_UNIT avxvnni
#define DOT_EXACT gqa_kernels_avx2
#include "kernels_avx2_gdot.c"
