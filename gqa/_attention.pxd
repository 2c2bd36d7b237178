# Declarations shared with gqa/_signature.pyx (the operator's call and its checks).
from libc.stdint cimport uint8_t, int64_t
from gqa._dispatch cimport gqa_exp_sum_fn, gqa_row_max_fn, gqa_qk_gemm_fn, gqa_sv_gemm_fn, gqa_tiles

cdef struct Params:
    int B, S, N, Nkv, G, H, L, T, Pres, Pbuf, Tmax
    const float *q
    const float *k
    const float *v
    size_t q_tok, kv_tok
    int packed            # packed QKV: K head j at q + (N + j) * H, V head j at q + (N + Nkv + j) * H
    const int *seqlens
    int first_prompt, has_past, shared
    uint8_t *kc
    uint8_t *vc
    const uint8_t *pk
    const uint8_t *pv
    int ktype, vtype, k_pc, v_pc
    size_t k_rb, v_rb
    const float *ks
    const float *vs
    float alpha, softcap
    int W, causal
    const float *cos
    const float *sin
    int rot_half, do_rotary, interleaved
    const int64_t *pos_ids
    int pos_stride
    const float *bias
    int bias_bb, bias_nb
    int bias_T            # row length of attention_bias (its last dimension)
    const int *col_base   # per batch entry: bias column of cache row 0 (NULL: 0; windowed caches)
    const float *sink
    const float *qn       # q_norm_weight / k_norm_weight [H] (NULL: no QK norm)
    const float *kn
    float qk_eps
    const float *rk       # rotations [Nkv, H, H] of K (and Q) and of V (NULL: none): x -> x R
    const float *rv
    float rk_c, rv_c      # > 0: rk / rv is the `+had` rotation c Sy P (gqa_hadamard_rows' O(H log H))
    uint8_t *hk           # float windows [B, Nkv, hcap, H] of present K / V (NULL: none):
    uint8_t *hv           #   rows [0, ns) the first ns positions, then the last nr (hp_rb bytes)
    const uint8_t *phk    # the past windows [B, Nkv, hpast, H] when a separate buffer, else NULL
    const uint8_t *phv
    int nsink, nrecent, hcap, hpast, hp_type   # sink_size, recent_size; window rows
    size_t hp_rb
    int hcausal           # window_partition "causal" (1) or "per_call" (0)
    const uint8_t *fk     # the float rows the readers use (fcap per (b, j)): the present windows,
    const uint8_t *fv     #   or a causal multi-token step's staging rows (hstage)
    int fcap, hstage
    uint8_t *rk_ring      # KVCache's rollback rows [B, Nkv, ring_m, H] of K / V (NULL: none):
    uint8_t *rv_ring      #   the float row of a position p that becomes history (leaves the
    int ring_m            #   recent window or never enters it) at row p % ring_m, while
                          #   p >= Tb - nr - ring_m (gqa/_cache_rows.pxi)
    int smooth
    float *out
    float *qk_out
    int qk_mode
    int round_half
    gqa_exp_sum_fn exp_sum
    gqa_row_max_fn row_max
    gqa_sv_gemm_fn sv     # P @ V over the codes (the accuracy level's kernel)
    gqa_qk_gemm_fn qk_tiles   # the float32 flash tiles' scores over K's codes, or NULL (prompt_qk_kernel)
    gqa_sv_gemm_fn sv_tiles   # ... and their P @ V over V's codes (p.sv, or vqtype's kernel)
    int kqtype, vqtype    # a float32 cache's K / V tiles quantized to these codes (float_tile_types;
                          # attend_tiled's code_tile), else -1
    const gqa_tiles *tiles  # flash tiles' GEMMs on matrix tiles (accuracy level >= 3), or NULL
    int direct            # a multi-token step of few rows on the decode kernels (attend_direct)
    int keep              # p.tiles: each thread keeps its unit's packed K / V tiles (keep_tiles)
    int Br, Bc, chunks, chunk_len
    float *partials       # split decode units: chunks x G x (m, l, P @ V[H]) per split unit
                          # (p.direct: chunks x S*G x (m, l, P @ V[H]) per unit)
    float *qprep          # split decode units whose query rows are prepared: G x H per unit, once per call
    int *items            # decode work item -> unit * (chunks + 1) + chunk + 1 (0: whole unit)
    int *split            # unit -> its index among the split units, or -1
    int *merged           # unit -> chunks finished so far
    int turn_rows         # rows write_cache and unrotate turn by a rotation at once: their
                          # scratch holds 2 x turn_rows x H floats
    int k_finite          # every dequantized K value is finite (static codes, moderate scales,
                          # no float windows); likewise V:
    int v_finite
    int k_codes_ok        # static codes with moderate scales (float windows or not); likewise V:
    int v_codes_ok


cdef class Consts:
    cdef Params p
    cdef Consts with_rows(self, int rows)


# One call: cache write, then attention (see _attention.pyx).
cpdef run(Consts c, q, k, v, seqlens, kc, vc, pk, pv, ks, vs, cos, sin, pos_ids, bias, sink,
          qn, kn, out, qk_out, int T, int Pres, bint first_prompt, int num_threads, bint flash,
          int q_block, int kv_block, int decode_chunks, int decode_ranges, bint direct=*,
          col_base=*, int bias_T=*, rk=*, rv=*, hk=*, hv=*, phk=*, phv=*, int accuracy=*,
          float rk_c=*, float rv_c=*, ring_k=*, ring_v=*)
# The seqlens_k / rotary-position rules that keep accesses in bounds: 0 (and p.Tmax set)
# or the number of the broken rule, where = {b, s} (see _attention.pyx).
cdef int length_error(Params *p, int64_t max_pos, int *where) noexcept nogil
# The same rules as the operator's ValueError (messages name the argument).
cdef int check_lengths(Params *p, int64_t max_pos) except -1
