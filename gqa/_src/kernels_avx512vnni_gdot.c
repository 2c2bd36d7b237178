/*
 * kernels_avx512vnni_gdot.c -- accuracy level 4 on per-group codes (GQA_G8 / GQA_G4 / GQA_G2) for
 * the avx512 path's VNNI unit: kernels_avx2_gdot.c's kernels (their layout, blocks and the
 * per-group contracts of kernels_s8dot_contract.h, bit for bit) built with each int16 pair dot
 * and its add as one vpdpwssd (256-bit, EVEX; DOT_MADD under GQA_DOT_VNNI), and the avx512
 * path's exact kernels for the rows and types the contracts leave.
 * ISA flags: the avx512 path's plus -mavx512vnni (setup.py's avx512vnni unit, whose entries
 * gqa_qk_gemm_s8_dot_avx512vnni / gqa_sv_gemm_s8_dot_avx512vnni hand group types here);
 * dispatch.c calls them only where the CPU has AVX-512 VNNI.  The emulation build of tests/isa
 * (GQA_EMULATE_AVX512) takes vpdpwssd from SIMDe.
 */
#define GQA_DOT_VNNI
#define GQK_WIDE 1 /* 32 vector registers: QK blocks of 2 rows x 8 keys and 4 x 4 */
#define DOT_UNIT avx512vnni
#define DOT_EXACT gqa_kernels_avx512
#include "kernels_avx2_gdot.c"
