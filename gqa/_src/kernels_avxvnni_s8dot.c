/*
 * kernels_avxvnni_s8dot.c -- accuracy level 4's integer dots of the avx2 path on CPUs with
 * AVX-VNNI (VEX vpdpwssd on 256-bit registers, without AVX-512: Intel Alder Lake and later
 * cores, Xeon 6 E-cores; AMD Zen 5): kernels_avx2_s8dot.c's kernels on INT8 / INT4 per-tensor
 * and per-channel codes (their layout, blocks and the contracts of kernels_s8dot_contract.h,
 * bit for bit) built with each int16 pair dot and its add as one vpdpwssd (DOT_MADD under
 * GQA_DOT_AVXVNNI), the entries gqa_qk_gemm_s8_dot_avxvnni / gqa_sv_gemm_s8_dot_avxvnni, and
 * the avx2 path's exact kernels for the rows and types the contracts leave.
 * ISA flags: the avx2 path's plus -mavxvnni (setup.py's avxvnni unit; kernels_avx2.c then puts
 * the entries in the table gqa_kernels_avxvnni, which dispatch.c hands out only where the CPU
 * has AVX-VNNI).  The emulation build of tests/isa (GQA_EMULATE_AVXVNNI) states vpdpwssd lane
 * by lane.
 */
#define GQA_DOT_AVXVNNI
#define DOT_UNIT avxvnni
#define DOT_EXACT gqa_kernels_avx2
#include "kernels_avx2_s8dot.c"
