# cython: language_level=3
"""GroupQueryAttention compute: cache write, then attention, over (batch, KV head)
units in parallel.  All inputs were validated by gqa/_signature.pyx; every pointer
here addresses a buffer whose bounds that module checked.

Layouts (float32 unless noted):
  query      [B, S, q_tok] with head h at h*H      (packed QKV: K head j at (N+j)*H,
                                                    V head j at (N+Nkv+j)*H)
  key/value  [B, L, kv_tok] with head j at j*H
  caches     [B, Nkv, Pres, row_bytes]              (codes, float32 or float16 rows)
  output     [B, S, N, H]; output_qk [B, N, S, T]
The G = N/Nkv query heads of KV head j (h = j*G + g) are computed together, so each
cached K/V element is converted once per query row for the whole group.
"""
from cython.parallel cimport prange, parallel, threadid
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset, memcpy, memmove
from libc.math cimport expf, tanhf, fabsf, sqrt
from libc.stdint cimport uint8_t, uint16_t, uint32_t, int64_t, uint64_t
cimport numpy as cnp
import numpy as np

from gqa._dispatch cimport (active_table, qk_kernel, sv_kernel, prompt_qk_kernel, float_tile_types,
                            dot_tiles, exp_kernel,
                            tile_kernels, gqa_kernels, gqa_tiles, gqa_qk_gemm_fn,
                            round_to_half, GQA_F32, GQA_F16, GQA_S8_PT, GQA_S8_PC,
                            GQA_S4_PT, GQA_S4_PC, GQA_ROT_MAX,
                            gqa_row_bytes, GQA_IS_GROUP)

cnp.import_array()

cdef extern from "work_ranges.h" nogil:
    ctypedef struct gqa_work_range:
        pass
    void gqa_work_ranges_init(gqa_work_range *r, int n, int nt)
    int gqa_work_next(gqa_work_range *r, int nt, int me)
    int gqa_work_done(int *count)
    void gqa_team_barrier()

cdef extern from "kernels_group.h" nogil:
    bint gqa_group_meta_below(const uint8_t *rows, size_t rb, size_t n, size_t cols, int type,
                              float limit)

cdef extern from "team_spread.h" nogil:
    uint64_t gqa_cpu_bit()
    void gqa_team_spread(uint64_t *taken)

from gqa._checks cimport INT32_MAX

cdef extern from "float.h":
    float FLT_MAX

cdef extern from "math.h":
    float INFINITY


include "_prepare.pxi"
include "_cache_rows.pxi"
include "_work.pxi"


cdef float nan_or_max(const Params *p, const float *x, int n) noexcept nogil:
    """The row maximum (the table's row_max skips NaN), but NaN when any of x[0:n] is NaN
    (a NaN score makes its row NaN, as on the naive path); the NaN scan runs only when the
    maximum is -inf, where exp_sum could not carry the NaN on."""
    cdef float m = p.row_max(x, n)
    cdef int i
    if m == -INFINITY:
        for i in range(n):
            if x[i] != x[i]:
                return x[i]
    return m


cdef float softmax_row(const Params *p, float *x, int n, int h, bint normalise) noexcept nogil:
    """x[0:n] -> exp(x - max) in place, divided by their total when `normalise`; returns
    1 / total (0 when every score is -inf, NaN when a score or the sink is NaN).  Smooth
    softmax / head sink adds a virtual logit to the total."""
    cdef int i
    cdef float m = -FLT_MAX, total = 0.0, sink = 0.0, inv
    cdef bint smooth = p.smooth or p.sink != NULL
    m = p.row_max(x, n)      # a NaN score is skipped here and makes the total NaN below
    if m < -FLT_MAX:
        m = -FLT_MAX
    if smooth:
        if p.sink != NULL:
            sink = p.sink[h]
        if sink > m:
            m = sink
    total = p.exp_sum(x, n, m)
    if smooth:
        total = total + expf(sink - m)
    # every score -inf: total 0, probabilities 0; a NaN total (a NaN score or sink) stays NaN
    inv = 1.0 / total if total != 0 else 0.0
    if normalise:
        for i in range(n):
            x[i] = x[i] * inv
    return inv


cdef void write_qk(const Params *p, const float *row, int b, int h, int s, int start, int n) noexcept nogil:
    cdef float *o = p.qk_out + ((<size_t>b * p.N + h) * p.S + s) * p.T
    memset(o, 0, p.T * sizeof(float))
    memcpy(o + start, row, n * sizeof(float))


cdef inline void key_range(const Params *p, int b, int s, int *start, int *end) noexcept nogil:
    """Keys [start, end) attended by query row s of batch b (end <= start: none).  The
    causal end e is the row's position + 1 (all T_b keys when causal = 0), capped to the
    valid keys; the window keeps the W keys ending at e even when e lies past T_b."""
    cdef int Tb = p.seqlens[b] + 1
    cdef int e = causal_past(p, b) + s + 1 if p.causal else Tb
    end[0] = e if e < Tb else Tb
    start[0] = e - p.W if (p.W >= 0 and e > p.W) else 0


cdef void score_features(const Params *p, float *row, int n, int b, int h, int s, int col0) noexcept nogil:
    """softcap, then + attention_bias, on scores row[0:n] of cache rows col0 .. col0+n-1 (bias
    columns col_base[b] + col0 .. : a windowed cache's row 0 is not position 0)."""
    cdef int i
    cdef const float *brow
    if p.softcap > 0:
        for i in range(n):
            row[i] = p.softcap * tanhf(row[i] / p.softcap)
    if p.bias != NULL:
        brow = (p.bias + ((<size_t>(0 if p.bias_bb else b) * (1 if p.bias_nb else p.N)
                           + (0 if p.bias_nb else h)) * p.S + s) * p.bias_T + col0
                + (p.col_base[b] if p.col_base != NULL else 0))
        for i in range(n):
            row[i] = row[i] + brow[i]


cdef void attend_naive(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk,
                       int b, int j, float *scratch) noexcept nogil:
    """All S query rows of the G heads of KV head j, batch b: scores over the attended
    range [start, c) only, softcap/bias and exp(x - max) per row, P @ V, then each output
    row divided by its row's total (normalised probabilities only for qk_output = 2)."""
    cdef int G = p.G, H = p.H, s, g, h, c, start, n
    cdef float *qbuf = scratch
    cdef float *sc = scratch + <size_t>G * H
    cdef float *inv = sc + <size_t>G * (p.Tmax if p.Tmax > 0 else 1)
    cdef const float *a
    cdef float *row
    cdef float *orow
    cdef int i
    cdef const float *rk = rotation(p.rk, p, j)
    for s in range(p.S):
        key_range(p, b, s, &start, &c)
        n = c - start if c > start else 0
        a = p.q + (<size_t>b * p.S + s) * p.q_tok + <size_t>j * G * H
        if prepared(p, p.qn, rk):
            prep_heads(p, a, qbuf, sc, position(p, b, s), rk)    # sc: free until qk_keys
            a = qbuf
        elif (<size_t>a) & 63:    # whole-line loads of the rows the QK kernel reads for every key
            memcpy(qbuf, a, <size_t>G * H * sizeof(float))
            a = qbuf
        orow = p.out + ((<size_t>b * p.S + s) * p.N + <size_t>j * G) * H
        if n == 0:
            memset(orow, 0, <size_t>G * H * sizeof(float))
            if p.qk_mode:
                for g in range(G):
                    write_qk(p, sc, b, j * G + g, s, 0, 0)
            continue
        qk_keys(p, t, qk, b, j, c, start, n, a, sc, n)
        for g in range(G):
            h = j * G + g
            row = sc + <size_t>g * n
            score_features(p, row, n, b, h, s, start)
            if p.qk_mode == 1:
                write_qk(p, row, b, h, s, start, n)
            inv[g] = softmax_row(p, row, n, h, p.qk_mode == 2)
            if p.qk_mode == 2:
                write_qk(p, row, b, h, s, start, n)
        sv_keys(p, t, b, j, c, start, n, sc, n, orow, H)
        if p.qk_mode != 2:     # P @ V of the unnormalised row, then the row's 1 / total
            for g in range(G):
                for i in range(H):
                    orow[<size_t>g * H + i] = orow[<size_t>g * H + i] * inv[g]


cdef bint all_finite(const float *x, size_t n) noexcept nogil:
    """No NaN or infinity in x[0:n] (an exponent field of all ones carries into bit 31)."""
    cdef const uint32_t *u = <const uint32_t *>x
    cdef uint32_t m = 0
    cdef size_t i
    for i in range(n):
        m = m | ((u[i] & 0x7f800000u) + 0x00800000u)
    return (m & 0x80000000u) == 0


cdef inline void tile_keys(int lo, int hi, int k0, int nb, int *a0, int *z0) noexcept nogil:
    """[a0, z0): the part of key tile [k0, k0 + nb) inside a row's keys [lo, hi), relative to
    k0 (z0 <= a0: none)."""
    a0[0] = lo - k0 if lo > k0 else 0
    z0[0] = hi - k0 if hi - k0 < nb else nb


cdef inline bint static_codes(int type) noexcept nogil:
    """INT8 / INT4 codes with static (per tensor / per channel) scales."""
    return type == GQA_S8_PT or type == GQA_S8_PC or type == GQA_S4_PT or type == GQA_S4_PC


cdef bint scales_below(const float *s, size_t n, float limit) noexcept nogil:
    """|s[u]| < limit for every u < n (NaN is not)."""
    cdef size_t u
    for u in range(n):
        if not fabsf(s[u]) < limit:
            return False
    return True


cdef int strip_keys(int r, int n, int M, int G, const int *rlo, const int *rhi, int k0, int nb,
                    int nbx) noexcept nogil:
    """The keys [0, z) of tile [k0, k0 + nb) that rows [r, r + n) (of M, G per position) read,
    z rounded up to 32 and at most nbx: a strip's scores and P @ V on tiles stop there (a
    causal diagonal tile's later keys are masked for its early rows)."""
    cdef int z = 0, q, a0, z0
    for q in range(r, r + n if r + n < M else M):
        tile_keys(rlo[q // G], rhi[q // G], k0, nb, &a0, &z0)
        if z0 > a0 and z0 > z:
            z = z0
    z = (z + 31) & ~31
    return z if z < nbx else nbx


cdef inline float sink_logit(const Params *p, int h) noexcept nogil:
    return p.sink[h] if p.sink != NULL else 0.0


cdef inline void float_runs(int ns, int rl, int k0, int a0, int z0, int *f1, int *q0, int *q1,
                            int *f2) noexcept nogil:
    """A causal-windows row's keys [a0, z0) of a tile starting at k0 (relative to k0), whose
    float positions are [0, ns) and [rl, end): floats [a0, f1), codes [q0, q1), floats [f2, z0)
    (each run empty where its end <= its start; rl >= ns)."""
    f1[0] = ns - k0 if ns - k0 < z0 else z0
    q0[0] = ns - k0 if ns - k0 > a0 else a0
    q1[0] = rl - k0 if rl - k0 < z0 else z0
    f2[0] = rl - k0 if rl - k0 > a0 else a0


cdef void move_runs(float *dst, float *src, int a, int z) noexcept nogil:
    """dst[a:z] = src[a:z] (nothing when z <= a)."""
    if z > a:
        memcpy(dst + a, src + a, (z - a) * sizeof(float))


cdef void split_runs(uint16_t *src, uint16_t *dst, int a, int z) noexcept nogil:
    """dst[a:z] = src[a:z], then src[a:z] = 0 (nothing when z <= a)."""
    if z > a:
        memcpy(dst + a, src + a, (z - a) * sizeof(uint16_t))
        memset(src + a, 0, (z - a) * sizeof(uint16_t))


cdef inline const uint8_t *float_keys(const Params *p, const uint8_t *f, int b, int j,
                                      int pos) noexcept nogil:
    """The readers' float rows f (p.fk or p.fv) from position pos on (rows follow positions
    within a window run)."""
    return f + hp_at(p, p.fcap, b, j, float_row(p, b, pos))


cdef void stage_tile(const Params *p, const gqa_kernels *t, int b, int j, int k0, int nb,
                     int lo, int hi, bint k_rows, float *Kt, float *Vt) noexcept nogil:
    """Positions [lo, hi) of key tile [k0, k0 + nb) from the staged float rows (they follow
    positions), into Kt [H, nb] (transposed; with k_rows K's rows [nb, H]) and Vt [nb, H]."""
    if hi <= lo:
        return
    if k_rows:
        t.dequantize(float_keys(p, p.fk, b, j, lo), Kt + <size_t>(lo - k0) * p.H, p.H, hi - lo,
                     p.H, p.hp_type, NULL)
    else:
        t.dequantize_t(float_keys(p, p.fk, b, j, lo), Kt + (lo - k0), nb, hi - lo, p.H,
                       p.hp_type, NULL)
    t.dequantize(float_keys(p, p.fv, b, j, lo), Vt + <size_t>(lo - k0) * p.H, p.H, hi - lo, p.H,
                 p.hp_type, NULL)


cdef void row_ranges(const Params *p, int b, int s0, int s1, bint runs, int *rlo, int *rhi,
                     int *rns, int *rrl, int *lo, int *hi, int *cut) noexcept nogil:
    """The keys [rlo, rhi) of query positions [s0, s1) of batch b (index s - s0) and their span
    [lo, hi) (empty: lo > hi); with `runs` (float windows) each row's float runs, sinks [0, rns)
    and recent [rrl, its end), of its own end (window_partition "causal") or of the call's,
    and cut = the largest sink end, the smallest and the largest recent start: key blocks
    that end there (cut_block) are read one way by every row but those between the recent
    starts (at most s1 - s0 - 1 keys)."""
    cdef int s, i, e, nr
    lo[0] = 1 << 30
    hi[0] = 0
    cut[0] = 0
    cut[1] = 1 << 30
    cut[2] = 0
    for s in range(s0, s1):
        i = s - s0
        key_range(p, b, s, &rlo[i], &rhi[i])
        if runs:
            e = rhi[i] if p.hcausal else p.seqlens[b] + 1
            hp_counts(p, e, &rns[i], &nr)
            rrl[i] = e - nr
        if rhi[i] > rlo[i]:
            lo[0] = rlo[i] if rlo[i] < lo[0] else lo[0]
            hi[0] = rhi[i] if rhi[i] > hi[0] else hi[0]
            if runs:
                cut[0] = rns[i] if rns[i] > cut[0] else cut[0]
                cut[1] = rrl[i] if rrl[i] < cut[1] else cut[1]
                cut[2] = rrl[i] if rrl[i] > cut[2] else cut[2]


cdef inline int cut_block(const int *cut, int k0, int nb) noexcept nogil:
    """Key block [k0, k0 + nb) ended at the first of row_ranges' cut points inside it."""
    cdef int i
    for i in range(3):
        if k0 < cut[i] < k0 + nb:
            nb = cut[i] - k0
    return nb


cdef int tile_reads(int k0, int nb, int R, const int *rlo, const int *rhi, const int *rns,
                    const int *rrl, int *fs_hi, int *fr_lo, int *fr_hi, int *c_lo,
                    int *c_hi) noexcept nogil:
    """How R query rows with float windows read keys [k0, k0 + nb): 1 when every row that
    reads one reads codes, 2 floats, 3 both ways (a row's float runs: float_runs of its rns,
    rrl); the floats read span sinks [k0, fs_hi) and recent [fr_lo, fr_hi), the codes read
    [c_lo, c_hi) (each empty where the end <= the start)."""
    cdef int i, a0, z0, f1, q0, q1, f2
    cdef bint codes = False, floats = False
    fs_hi[0] = k0
    fr_lo[0] = k0 + nb
    fr_hi[0] = k0
    c_lo[0] = k0 + nb
    c_hi[0] = k0
    for i in range(R):
        tile_keys(rlo[i], rhi[i], k0, nb, &a0, &z0)
        if z0 <= a0:
            continue
        float_runs(rns[i], rrl[i], k0, a0, z0, &f1, &q0, &q1, &f2)
        if f1 > a0:
            floats = True
            fs_hi[0] = k0 + f1 if k0 + f1 > fs_hi[0] else fs_hi[0]
        if q1 > q0:
            codes = True
            c_lo[0] = k0 + q0 if k0 + q0 < c_lo[0] else c_lo[0]
            c_hi[0] = k0 + q1 if k0 + q1 > c_hi[0] else c_hi[0]
        if z0 > f2:
            floats = True
            fr_lo[0] = k0 + f2 if k0 + f2 < fr_lo[0] else fr_lo[0]
            fr_hi[0] = k0 + z0 if k0 + z0 > fr_hi[0] else fr_hi[0]
    return 3 if codes and floats else (2 if floats else 1)


cdef int staged_tiles(const Params *p, const gqa_kernels *t, int b, int j, int k0, int nb, int R,
                      const int *rlo, const int *rhi, const int *rns, const int *rrl, bint k_rows,
                      bint k_codes, bint v_codes, float *Kt, float *Vt, float *Kf,
                      float *Vf) noexcept nogil:
    """The tiles of keys [k0, k0 + nb) for R query rows with causal float windows: 1 when
    every row reads them as codes (Kt / Vt from the codes; none of K with k_codes, of V with
    v_codes: the integer kernels read the codes), 2 as floats (Kt / Vt from the
    staged rows; zero where no row reads them), 3 mixed (Kt / Vt from the codes, Kf / Vf from
    the staged rows, zero where no row reads a float).  K's tiles are transposed [H, nb], or
    with k_rows (matrix tiles) K's rows [nb, H]."""
    cdef int fs_hi, fr_lo, fr_hi, c_lo, c_hi
    cdef int kind = tile_reads(k0, nb, R, rlo, rhi, rns, rrl, &fs_hi, &fr_lo, &fr_hi, &c_lo, &c_hi)
    cdef bint codes = kind != 2, floats = kind != 1
    if fr_lo <= fs_hi:      # the runs meet: one run [k0, max end)
        fs_hi = fs_hi if fs_hi > fr_hi else fr_hi
        fr_hi = k0
    if codes:
        if k_rows:
            t.dequantize(k_row(p, b, j, k0), Kt, p.H, nb, p.H, p.ktype, k_scales(p, j))
        elif floats or not k_codes:
            t.dequantize_t(k_row(p, b, j, k0), Kt, nb, nb, p.H, p.ktype, k_scales(p, j))
        if floats or not v_codes:
            t.dequantize(v_row(p, b, j, k0), Vt, p.H, nb, p.H, p.vtype, v_scales(p, j))
        if not floats:
            return 1
        memset(Kf, 0, <size_t>p.H * nb * sizeof(float))
        memset(Vf, 0, <size_t>nb * p.H * sizeof(float))
        Kt = Kf
        Vt = Vf
    else:
        memset(Kt, 0, <size_t>p.H * nb * sizeof(float))
        memset(Vt, 0, <size_t>nb * p.H * sizeof(float))
    stage_tile(p, t, b, j, k0, nb, k0, fs_hi, k_rows, Kt, Vt)
    stage_tile(p, t, b, j, k0, nb, fr_lo, fr_hi, k_rows, Kt, Vt)
    return 3 if codes else 2


cdef void runs_pv(const gqa_kernels *t, int H, const float *x, int nx, int a0, int f1, int q0,
                  int q1, int f2, int z0, const float *Vt, const float *Vf,
                  float *o) noexcept nogil:
    """o [H] += one row's probabilities x [nx] over its float runs [a0, f1), [f2, z0) with the
    staged rows Vf and its code run [q0, q1) with Vt (float32; each run empty where its end
    <= its start), reading no other key: a NaN / inf value stays out of the rows that mask it."""
    if f1 > a0:
        t.sv_gemm(1, H, f1 - a0, x + a0, nx, Vf + <size_t>a0 * H, GQA_F32, NULL, o, H, 1.0)
    if q1 > q0:
        t.sv_gemm(1, H, q1 - q0, x + q0, nx, Vt + <size_t>q0 * H, GQA_F32, NULL, o, H, 1.0)
    if z0 > f2:
        t.sv_gemm(1, H, z0 - f2, x + f2, nx, Vf + <size_t>f2 * H, GQA_F32, NULL, o, H, 1.0)


cdef void mixed_pv(const Params *p, const gqa_kernels *t, int k0, int nb, int M,
                   const int *rlo, const int *rhi, const int *rns, const int *rrl,
                   float *Sx, float *Sf, const float *Vt, const float *Vf, float *O) noexcept nogil:
    """O += P @ V over a mixed tile: each row's probabilities Sx split into the code runs (kept
    in Sx) and the float runs (moved to Sf, the rest of Sf zeroed), then Sx @ Vt + Sf @ Vf;
    per row and run straight from Sx where a value is NaN / inf (0 * inf would reach other
    rows)."""
    cdef int G = p.G, H = p.H, r, i, a0, z0, f1, q0, q1, f2
    cdef float *x
    cdef float *f
    cdef bint finite = all_finite(Vt, <size_t>nb * H) and all_finite(Vf, <size_t>nb * H)
    for r in range(M):
        i = r // G
        x = Sx + <size_t>r * nb
        f = Sf + <size_t>r * nb
        tile_keys(rlo[i], rhi[i], k0, nb, &a0, &z0)
        if z0 <= a0:
            if finite:
                memset(f, 0, nb * sizeof(float))
            continue
        float_runs(rns[i], rrl[i], k0, a0, z0, &f1, &q0, &q1, &f2)
        if not finite:
            runs_pv(t, H, x, nb, a0, f1, q0, q1, f2, z0, Vt, Vf, O + <size_t>r * H)
            continue
        memset(f, 0, nb * sizeof(float))
        move_runs(f, x, a0, f1)
        move_runs(f, x, f2, z0)
        if f1 > a0:
            memset(x + a0, 0, (f1 - a0) * sizeof(float))
        if z0 > f2:
            memset(x + f2, 0, (z0 - f2) * sizeof(float))
    if finite:
        t.sv_gemm(M, H, nb, Sx, nb, Vt, GQA_F32, NULL, O, H, 1.0)
        t.sv_gemm(M, H, nb, Sf, nb, Vf, GQA_F32, NULL, O, H, 1.0)


cdef enum:
    TILE_STRIP = 32     # rows of a score strip on matrix tiles (a multiple of 16; 32 x 256 keys: 32 KB)


cdef struct Tiled:
    # attend_tiled's scratch regions, each on a 64-byte line (see tiled_layout)
    float *Qt           # [Mmax, H] the prepared query rows, times alpha
    float *Sx           # [Mx, Bx] the scores, then the probabilities, of a tile
    float *O            # [Mx, H] the unnormalised output rows
    float *mrow         # [Mmax] online softmax: each row's maximum so far
    float *lrow         # [Mmax] and its sum
    float *Kt           # [H, Bc] the K tile, transposed
    float *Vt           # [Bc, H] the V tile
    int *rlo            # [Br] each query row's keys [rlo, rhi)
    int *rhi
    int *rns            # [Br] p.hstage: a row's float sinks [0, ns) and recent [rl, end)
    int *rrl
    float *Sf           # p.hstage: [Mmax, Bc] the staged floats' scores ([Mx, Bx] with
    float *Kf           #   p.tiles), and their tiles [H, Bc] (K's rows [Bc, H] with p.tiles)
    float *Vf           #   [Bc, H]
    uint16_t *Qb        # p.tiles: [Mx, Hk] the query rows in bfloat16
    uint16_t *Pb        #   [Mx, Bx] the probabilities in bfloat16
    uint32_t *Kp        #   [Hk / 2, Bx] the K tile as row pairs (p.keep: [nkept] such tiles,
    uint32_t *Vp        #   [Bx / 2, H] the V tile as row pairs    tile i keys [i Bc, (i+1) Bc))
    float *one          #   [H] ones: the scales that dequantize static codes to themselves
    uint16_t *Pf        # p.hstage and p.tiles: [TILE_STRIP, Bx] a strip's float-run probabilities
    uint32_t *Kfp       #   [Hk / 2, Bx] and the staged floats' K and V tiles as pairs
    uint32_t *Vfp       #   [Bx / 2, H]
    int *kept           # p.keep: [2 + nkept] the kept tiles' unit, their keys [0, hi), and
                        #   per tile whether its V rows hold a NaN / inf (keep_tiles); p.kqtype:
                        #   per tile whether its K (1) and V (2) codes stand in (code_tile)
    uint8_t *Kq         # p.kqtype: [nkept, Bc] rows of a float32 cache's K and V as p.kqtype's /
    uint8_t *Vq         #   p.vqtype's codes (code_tile; one tile without p.keep)
    float *Kz           #   [nkept, 2, H] K's per-channel scales and zeros (code_rows)
    float *Zr           #   [Mmax] each query row's fl(alpha q) . z of the tile's K
    size_t kslot, vslot #   bytes of one slot of Kq / Vq (Bc rows)
    int Mx, Bx, Hk      # rows, keys and head padded for p.tiles (16, 32, 32), else Mmax, Bc, H
    int Kx              # p.keep: the kept K tiles' rows of pairs, Bx + 16 (a row stride of 2^n
                        #   bytes would put a block's rows in few L1 sets)


cdef enum:
    KEEP_BYTES = 16 << 20   # at most this much more scratch a thread for kept K / V tiles


cdef size_t kept_tiles(const Params *p) noexcept nogil:
    """The K / V tiles each thread keeps: Tmax / Bc rounded up with p.keep, else 1 (the tile
    being made)."""
    return (<size_t>p.Tmax + p.Bc - 1) // p.Bc if p.keep else 1


cdef void plan_keep(Params *p) noexcept nogil:
    """p.keep: on matrix tiles (not a direct step, no staged float windows) each thread keeps
    the bfloat16 pairs of one unit's K and V tiles from query block to query block (keep_tiles),
    and with p.kqtype their codes (keep_codes), where they add at most KEEP_BYTES to its scratch
    (tiled_layout's two layouts), instead of packing them again for every block."""
    cdef size_t plain
    p.keep = 0
    if (p.tiles == NULL and p.vqtype < 0) or p.direct or p.hstage or p.Tmax < 1:
        return
    plain = tiled_layout(p, NULL, NULL)
    p.keep = 1
    p.keep = (tiled_layout(p, NULL, NULL) - plain) * sizeof(float) <= KEEP_BYTES


cdef inline size_t take(size_t *at, size_t n) noexcept nogil:
    """The offset of a region of n floats at at[0], which moves past it to the next line."""
    cdef size_t o = at[0]
    at[0] = o + ((n + 15) & ~(<size_t>15))
    return o


cdef size_t tiled_layout(const Params *p, float *base, Tiled *s) noexcept nogil:
    """attend_tiled's scratch of one thread: its length in floats, and its regions in s
    (pointers into base, which starts on a 64-byte line; NULL: the length only)."""
    cdef size_t H = p.H, Br = p.Br, Mmax = Br * p.G, Bc = p.Bc, at = 0
    cdef size_t Mx = Mmax, Bx = Bc, Hk = H, nk = kept_tiles(p), Kx
    cdef size_t o[24]
    cdef int i
    if p.tiles != NULL:
        Mx = (Mmax + 15) & ~(<size_t>15)
        Bx = (Bc + 31) & ~(<size_t>31)
        Hk = (H + 31) & ~(<size_t>31)
    Kx = Bx + 16 if p.keep else Bx
    o[0] = take(&at, Mmax * H)
    # tile_strips: two strips' scores at least
    o[1] = take(&at, (Mx if p.tiles == NULL or Mx >= 2 * TILE_STRIP else 2 * TILE_STRIP) * Bx)
    o[2] = take(&at, Mx * H)
    o[3] = take(&at, Mmax)
    o[4] = take(&at, Mmax)
    o[5] = take(&at, 0 if p.direct else H * Bc)      # attend_direct reads no float tiles
    o[6] = take(&at, 0 if p.direct else Bc * H)
    o[7] = take(&at, 4 * Br)
    for i in range(8, 24):
        o[i] = 0
    if p.hstage:
        o[8] = take(&at, Mx * Bx if p.tiles != NULL else Mmax * Bc)
        o[9] = take(&at, H * Bc)
        o[10] = take(&at, Bc * H)
    if p.tiles != NULL:
        o[11] = take(&at, (Mx * Hk + 1) // 2)
        o[12] = take(&at, (Mx * Bx + 1) // 2)
        o[13] = take(&at, nk * (Hk // 2 * Kx))
        o[14] = take(&at, nk * (Bx // 2 * H))
        o[15] = take(&at, H)
        if p.keep:
            o[19] = take(&at, 2 + nk)
        if p.hstage:
            o[16] = take(&at, (TILE_STRIP * Bx + 1) // 2)
            o[17] = take(&at, Hk // 2 * Bx)
            o[18] = take(&at, Bx // 2 * H)
    cdef size_t kslot = Bc * gqa_row_bytes(p.kqtype, H) if p.vqtype >= 0 else 0
    cdef size_t vslot = Bc * gqa_row_bytes(p.vqtype, H) if p.vqtype >= 0 else 0
    if p.vqtype >= 0:
        o[19] = take(&at, 2 + nk)
        o[20] = take(&at, (nk * kslot + 3) // 4)
        o[21] = take(&at, (nk * vslot + 3) // 4)
        o[22] = take(&at, nk * 2 * H)
        o[23] = take(&at, Mmax)
    if base != NULL:
        s.Qt = base + o[0]
        s.Sx = base + o[1]
        s.O = base + o[2]
        s.mrow = base + o[3]
        s.lrow = base + o[4]
        s.Kt = base + o[5]
        s.Vt = base + o[6]
        s.rlo = <int *>(base + o[7])
        s.rhi = s.rlo + Br
        s.rns = s.rhi + Br
        s.rrl = s.rns + Br
        s.Sf = base + o[8]
        s.Kf = base + o[9]
        s.Vf = base + o[10]
        s.Qb = <uint16_t *>(base + o[11])
        s.Pb = <uint16_t *>(base + o[12])
        s.Kp = <uint32_t *>(base + o[13])
        s.Vp = <uint32_t *>(base + o[14])
        s.one = base + o[15]
        s.Pf = <uint16_t *>(base + o[16])
        s.Kfp = <uint32_t *>(base + o[17])
        s.Vfp = <uint32_t *>(base + o[18])
        s.kept = <int *>(base + o[19])
        s.Kq = <uint8_t *>(base + o[20])
        s.Vq = <uint8_t *>(base + o[21])
        s.Kz = base + o[22]
        s.Zr = base + o[23]
        s.kslot = kslot
        s.vslot = vslot
        s.Mx = <int>Mx
        s.Bx = <int>Bx
        s.Hk = <int>Hk
        s.Kx = <int>Kx
    return at


cdef inline bint tile_codes_ok(const Params *p, int b, int j, int k0, int nb) noexcept nogil:
    """V's codes of keys [k0, k0 + nb) may enter P @ V as they are (attend_tiled's pv_codes):
    static codes with scales below 1e30, or per-group rows whose scales and zeros are, so that
    every value is finite and a masked key's zero probability adds 0."""
    if p.v_codes_ok:
        return True
    return GQA_IS_GROUP(p.vtype) and gqa_group_meta_below(
        <const uint8_t *>v_row(p, b, j, k0), gqa_row_bytes(p.vtype, p.H), nb, p.H, p.vtype, 1e30)


cdef bint nan_values(const Params *p, const float *Vr, int R, const int *rlo, const int *rhi,
                     int k0, int nb) noexcept nogil:
    """Whether a key of tile [k0, k0 + nb) that some of the R positions mask has a NaN / inf
    value in V's tile rows Vr [nb, p.H]: 0 * inf is NaN, so such a tile's P @ V must skip each
    row's masked keys (float32, per row) instead of multiplying them by zero probabilities."""
    cdef int q, a0, z0, hi_a = 0, lo_z = nb
    if p.v_finite:
        return False
    for q in range(R):
        tile_keys(rlo[q], rhi[q], k0, nb, &a0, &z0)
        # the keys some row masks: [0, hi_a) and [lo_z, nb); a row without keys here masks
        # them all (its z0 may be negative: never an end)
        if z0 <= a0:
            hi_a = nb
        else:
            hi_a = a0 if a0 > hi_a else hi_a
            lo_z = z0 if z0 < lo_z else lo_z
    return not (all_finite(Vr, <size_t>hi_a * p.H) and
                all_finite(Vr + <size_t>lo_z * p.H, <size_t>(nb - lo_z) * p.H))


cdef void online_row(const Params *p, const gqa_tiles *x, float *row, uint16_t *prow, float *orow,
                     float *m, float *l, int a0, int z0, int nb, int nbx, int b, int h, int s,
                     int k0, bint store) noexcept nogil:
    """One query row's step of the online softmax over key tile [k0, k0 + nb), its keys
    [a0, z0) (relative to k0; z0 <= a0: none): row [nb] holds its scores, and becomes
    exp(score - m'), -inf past its keys (0 on tiles, x != NULL, whose float row past z0 is
    never read; on tiles only where `store`, else the row is left to be overwritten), with m'
    its new maximum; on tiles prow [nbx] gets those probabilities in bfloat16 (zeros past z0);
    orow [H] and the sum l are rescaled to m', and l gains the row's sum.  A row without keys
    or whose maximum is still -inf gets zero probabilities."""
    cdef int i
    cdef float mx, mnew = 0.0, corr, total
    if z0 > a0:
        score_features(p, row + a0, z0 - a0, b, h, s, k0 + a0)
        mx = nan_or_max(p, row + a0, z0 - a0)
        mnew = mx if (mx > m[0] or mx != mx) else m[0]
    if z0 <= a0 or mnew == -INFINITY:   # -inf: every score so far is masked by the bias
        memset(row, 0, nb * sizeof(float))
        if x != NULL:
            memset(prow, 0, nbx * sizeof(uint16_t))
        return
    for i in range(a0):
        row[i] = -INFINITY
    if x != NULL:
        total = x.exp_pack(row, z0, nbx, mnew, prow, store)
    else:
        for i in range(z0, nb):
            row[i] = -INFINITY
        total = p.exp_sum(row, nb, mnew)
    corr = expf(m[0] - mnew)
    if corr != 1.0:
        for i in range(p.H):
            orow[i] = orow[i] * corr
    l[0] = l[0] * corr + total
    m[0] = mnew


cdef int kept_start(const Tiled *sc, int unit, int hi, int Bc) noexcept nogil:
    """The first key from which the thread's kept tiles (keep_tiles, keep_codes) must be made so
    that they hold `unit`'s keys [0, hi) -- the start of the tile where they end, a partial tile
    made again whole -- or -1 when they hold them; another unit's are dropped."""
    if sc.kept[0] != unit:
        sc.kept[0] = unit
        sc.kept[1] = 0
    if hi <= sc.kept[1]:
        return -1
    return sc.kept[1] - sc.kept[1] % Bc


cdef void keep_tiles(const Params *p, const gqa_kernels *t, const Tiled *sc, int b, int j, int hi,
                     bint kdirect, bint vdirect, const float *kscale,
                     const float *vscale) noexcept nogil:
    """p.keep: the thread's kept tiles (sc.Kp, sc.Vp) made to hold unit (b, j)'s keys [0, hi):
    another unit's are dropped; tile i, keys [i Bc, min((i + 1) Bc, hi)) and zeros to Bx, is
    packed where the kept ones end short of hi (a partial last tile again whole).  A kept tile
    may hold keys past an item's: they meet zero probabilities (the strips stop at the item's
    keys rounded up to 32), and kept[2 + i] marks a tile whose V rows hold a NaN / inf, which
    takes P @ V per row.  The rows as kv_tiles gives them (kdirect / vdirect: a float32 cache's
    own; kscale / vscale as there)."""
    cdef const gqa_tiles *x = p.tiles
    cdef int H = p.H, Bc = p.Bc, unit = b * p.Nkv + j, k0, nb, i
    cdef const float *Kr
    cdef const float *Vr
    k0 = kept_start(sc, unit, hi, Bc)
    if k0 < 0:
        return
    while k0 < hi:
        nb = hi - k0 if hi - k0 < Bc else Bc
        i = k0 // Bc
        Kr = <const float *>k_row(p, b, j, k0) if kdirect else sc.Kt
        Vr = <const float *>v_row(p, b, j, k0) if vdirect else sc.Vt
        if not (kdirect and vdirect):
            kv_tiles(p, t, b, j, k0, nb, NULL if kdirect else sc.Kt, NULL if vdirect else sc.Vt,
                     True, kscale, vscale)
        x.pack_pairs_t(Kr, H, nb, H, sc.Kx, sc.Hk, sc.Kp + <size_t>i * (sc.Hk // 2) * sc.Kx)
        x.pack_pairs(Vr, H, nb, H, sc.Bx, H, sc.Vp + <size_t>i * (sc.Bx // 2) * H)
        sc.kept[2 + i] = not (p.v_finite or all_finite(Vr, <size_t>nb * H))
        k0 = k0 + nb
    sc.kept[1] = hi


cdef bint code_rows(const Params *p, const gqa_kernels *t, const float *x, int nb, int type,
                    uint8_t *q, float *meta, float *tmp) noexcept nogil:
    """Rows x [nb, H] of a float32 cache as `type`'s codes q; whether they may stand in for the
    rows: every float finite and every scale and zero below 1e30 (a masked key's zero
    probability then adds 0).  Per group: the per-group caches' codec (their codes and metadata,
    bit for bit).  INT8 per channel (K): each channel's range [lo_c, hi_c] over the rows, scale
    s_c = fl(hi_c - lo_c) / 255 (1 unless > 0) and zero z_c = fl(lo_c + fl(128 s_c)) into meta
    [2, H], codes clamp(rint(fl(x - z_c) fl(1 / s_c)), -128, 127) by the path's codec of the
    static per-channel caches (fl(x - z_c) staged in tmp [nb, H]): |x - (s_c code + z_c)| <=
    s_c / 2 (1 + 2^-22) + 2^-24 |x - z_c|, and each score takes fl(alpha q) . z as a constant of
    its row (attend_tiled)."""
    cdef int H = p.H, r, c
    cdef float a
    cdef float *lo = meta + H
    cdef const float *xr
    if not all_finite(x, <size_t>nb * H):
        return False
    if GQA_IS_GROUP(type):
        t.quantize(x, H, q, nb, H, type, NULL)
        return gqa_group_meta_below(q, gqa_row_bytes(type, H), nb, H, type, 1e30)
    for c in range(H):
        meta[c] = x[c]      # the maxima, then the scales
        lo[c] = x[c]        # the minima, then the zeros
    for r in range(1, nb):
        xr = x + <size_t>r * H
        for c in range(H):
            a = xr[c]
            meta[c] = a if a > meta[c] else meta[c]
            lo[c] = a if a < lo[c] else lo[c]
    for c in range(H):
        meta[c] = (meta[c] - lo[c]) / 255.0
        if not meta[c] > 0.0:
            meta[c] = 1.0
        lo[c] = lo[c] + 128.0 * meta[c]
    for r in range(nb):
        xr = x + <size_t>r * H
        for c in range(H):
            tmp[<size_t>r * H + c] = xr[c] - lo[c]
    t.quantize(tmp, H, q, nb, H, type, meta)
    return scales_below(meta, 2 * H, 1e30)


cdef void code_tile(const Params *p, const gqa_kernels *t, const Tiled *sc, int b, int j, int k0,
                    int nb, int i) noexcept nogil:
    """p.vqtype: a float32 cache's K and V rows of keys [k0, k0 + nb) as p.kqtype's and
    p.vqtype's codes (float_tile_types) in slot i of sc.Kq / sc.Vq (code_rows; K's scales and
    zeros in sc.Kz), and sc.kept[2 + i] = 1 where K's codes stand in for its rows, | 2 where V's
    do; a tile whose rows fail keeps float32 there (kv_tiles).  sc.Kt is code_rows' staging."""
    cdef size_t H = p.H
    cdef uint8_t *kq = sc.Kq + i * sc.kslot
    cdef uint8_t *vq = sc.Vq + i * sc.vslot
    sc.kept[2 + i] = (code_rows(p, t, <const float *>k_row(p, b, j, k0), nb, p.kqtype, kq,
                                sc.Kz + i * 2 * H, sc.Kt)
                      | code_rows(p, t, <const float *>v_row(p, b, j, k0), nb, p.vqtype, vq, NULL,
                                  NULL) << 1)


cdef void keep_codes(const Params *p, const gqa_kernels *t, const Tiled *sc, int b, int j,
                     int hi) noexcept nogil:
    """p.keep with p.vqtype: the thread's kept codes made to hold unit (b, j)'s keys [0, hi) (hi:
    the keys its last query row reads, the same for all its blocks), as keep_tiles does for
    matrix tiles (code_tile's slot i holds keys [i Bc, min((i + 1) Bc, hi)))."""
    cdef int Bc = p.Bc, k0 = kept_start(sc, b * p.Nkv + j, hi, Bc)
    if k0 < 0:
        return
    while k0 < hi:
        code_tile(p, t, sc, b, j, k0, hi - k0 if hi - k0 < Bc else Bc, k0 // Bc)
        k0 = k0 + Bc
    sc.kept[1] = hi


cdef inline void strip_row(const Params *p, const gqa_tiles *x, const Tiled *sc, const float *S,
                           int r, int r0, int M, int G, const int *rlo, const int *rhi, int k0,
                           int nb, int nbx, int b, int j, int s0) noexcept nogil:
    """Row r of the strip from r0 (tile_strips): its online softmax step from its scores in
    S [., nbx] into its bfloat16 probabilities in sc.Pb (zeros for a row past M)."""
    cdef int a0, z0
    cdef uint16_t *prow = sc.Pb + <size_t>(r - r0) * sc.Bx
    if r >= M:
        memset(prow, 0, nbx * sizeof(uint16_t))
        return
    tile_keys(rlo[r // G], rhi[r // G], k0, nb, &a0, &z0)
    online_row(p, x, <float *>S + <size_t>(r - r0) * nbx, prow, sc.O + <size_t>r * p.H,
               &sc.mrow[r], &sc.lrow[r], a0, z0, nb, nbx, b, j * G + r % G, s0 + r // G, k0,
               False)


cdef void tile_strips(const Params *p, const gqa_tiles *x, const Tiled *sc, const uint32_t *Kp,
                      int ldk, const uint32_t *Vp, int M, int R, int G, const int *rlo,
                      const int *rhi, int k0, int nb, int b, int j, int s0) noexcept nogil:
    """Key tile [k0, k0 + nb) on matrix tiles, K and V packed (Kp [Hk / 2, ldk], Vp), strip by
    strip: each TILE_STRIP rows' scores, online softmax and P @ V, so a strip's scores and
    probabilities (sc.Pb) are reused from its first rows, in L1, by every strip; rows of a
    strip past M get zero probabilities.  The GEMMs of a strip stop at the keys its rows read
    (strip_keys).  The next strip's scores (sc.Sx's two strips in turn) are made 32 keys at a
    time between the rows of this one's softmax, so that the matrix unit works through its
    products while the vector units take the exp (out of order, on AMX: 1.07x on the seed
    shape's prompts; its P @ V so interleaved gained nothing more)."""
    cdef int H = p.H, nbx = (nb + 31) & ~31, r0 = 0, n, z, r, r1, nn, zn, c, blocks
    cdef float *S = sc.Sx
    cdef float *Sn = sc.Sx + <size_t>TILE_STRIP * nbx
    cdef float *swap
    n = TILE_STRIP if sc.Mx >= TILE_STRIP else sc.Mx
    z = strip_keys(0, n, M, G, rlo, rhi, k0, nb, nbx)
    if z > 0:   # scores past z are never read
        x.gemm(n, z, sc.Hk, sc.Qb, sc.Hk, Kp, ldk, S, nbx, 0)
    while r0 < sc.Mx:
        n = TILE_STRIP if sc.Mx - r0 >= TILE_STRIP else sc.Mx - r0
        r1 = r0 + n
        nn = 0 if r1 >= sc.Mx else (TILE_STRIP if sc.Mx - r1 >= TILE_STRIP else sc.Mx - r1)
        zn = strip_keys(r1, nn, M, G, rlo, rhi, k0, nb, nbx) if nn > 0 else 0
        blocks = zn // 32
        r = r0
        for c in range(blocks):
            x.gemm(nn, 32, sc.Hk, sc.Qb + <size_t>r1 * sc.Hk, sc.Hk, Kp + 32 * c, ldk,
                   Sn + 32 * c, nbx, 0)
            while z > 0 and r < r0 + (c + 1) * n // blocks:
                strip_row(p, x, sc, S, r, r0, M, G, rlo, rhi, k0, nb, nbx, b, j, s0)
                r = r + 1
        if z > 0:
            while r < r1:
                strip_row(p, x, sc, S, r, r0, M, G, rlo, rhi, k0, nb, nbx, b, j, s0)
                r = r + 1
            # the probabilities past z are zeros: P @ V stops there
            x.gemm(n, H, z, sc.Pb, sc.Bx, Vp, H, sc.O + <size_t>r0 * H, H, 1)
        swap = S
        S = Sn
        Sn = swap
        z = zn
        r0 = r1


cdef void mixed_strips(const Params *p, const gqa_kernels *t, const gqa_tiles *x,
                       const Tiled *sc, int M, int G, const int *rlo, const int *rhi,
                       const int *rns, const int *rrl, int k0, int nb, int b, int j,
                       int s0) noexcept nogil:
    """A mixed key tile [k0, k0 + nb) of causal float windows (staged_tiles' kind 3) on matrix
    tiles, strip by strip as tile_strips: the codes' K and V packed in sc.Kp / sc.Vp, the
    staged floats' in sc.Kfp / sc.Vfp.  A strip's scores come from the codes over the keys its
    rows read as codes (sc.Sx) and from the floats over those they read as floats (sc.Sf),
    each GEMM over its keys' span rounded out to 32, each row's score from the run it reads;
    its probabilities split the same way (sc.Pb: the code runs', sc.Pf: the float runs') for
    the two P @ V.  Where V's tiles (sc.Vt / sc.Vf) hold a NaN / inf, each row's P @ V runs
    in float32 over its own runs (runs_pv), so 0 * inf reaches no row that masks it."""
    cdef int H = p.H, nbx = (nb + 31) & ~31, r0 = 0, n, r, i, a0, z0, f1, q0, q1, f2
    cdef int c0, c1, g0, g1     # the strip's keys read as codes [c0, c1), as floats [g0, g1)
    cdef int i1, fs_hi, fr_lo, fr_hi, c_lo, c_hi
    cdef float *row
    cdef float *frow
    cdef uint16_t *prow
    cdef uint16_t *pf
    cdef bint finite = (all_finite(sc.Vt, <size_t>nb * H) and
                        all_finite(sc.Vf, <size_t>nb * H))
    while r0 < M:       # strips past M: no rows, no GEMMs (tile_strips: z = 0)
        n = TILE_STRIP if sc.Mx - r0 >= TILE_STRIP else sc.Mx - r0
        i = r0 // G         # the strip's positions [i, i1)
        i1 = ((r0 + n if r0 + n < M else M) + G - 1) // G
        tile_reads(k0, nb, i1 - i, rlo + i, rhi + i, rns + i, rrl + i, &fs_hi, &fr_lo, &fr_hi,
                   &c_lo, &c_hi)
        c0 = c1 = g0 = g1 = 0       # relative to k0, rounded out to 32
        if c_hi > c_lo:
            c0 = (c_lo - k0) & ~31
            c1 = (c_hi - k0 + 31) & ~31
        if fs_hi > k0 or fr_hi > fr_lo:
            g0 = 0 if fs_hi > k0 else (fr_lo - k0) & ~31
            g1 = ((fs_hi if fs_hi > fr_hi else fr_hi) - k0 + 31) & ~31
        if c1 > c0:
            x.gemm(n, c1 - c0, sc.Hk, sc.Qb + <size_t>r0 * sc.Hk, sc.Hk, sc.Kp + c0, nbx,
                   sc.Sx + c0, nbx, 0)
        if g1 > g0:
            x.gemm(n, g1 - g0, sc.Hk, sc.Qb + <size_t>r0 * sc.Hk, sc.Hk, sc.Kfp + g0, nbx,
                   sc.Sf + g0, nbx, 0)
        for r in range(r0, r0 + n):
            row = sc.Sx + <size_t>(r - r0) * nbx
            frow = sc.Sf + <size_t>(r - r0) * nbx
            prow = sc.Pb + <size_t>(r - r0) * sc.Bx
            pf = sc.Pf + <size_t>(r - r0) * sc.Bx
            memset(pf, 0, nbx * sizeof(uint16_t))
            if r >= M:
                memset(prow, 0, nbx * sizeof(uint16_t))
                continue
            i = r // G
            tile_keys(rlo[i], rhi[i], k0, nb, &a0, &z0)
            float_runs(rns[i], rrl[i], k0, a0, z0, &f1, &q0, &q1, &f2)
            move_runs(row, frow, a0, f1)
            move_runs(row, frow, f2, z0)
            online_row(p, x, row, prow, sc.O + <size_t>r * H, &sc.mrow[r], &sc.lrow[r], a0, z0,
                       nb, nbx, b, j * G + r % G, s0 + i, k0, not finite)
            if not finite:
                runs_pv(t, H, row, nbx, a0, f1, q0, q1, f2, z0, sc.Vt, sc.Vf,
                        sc.O + <size_t>r * H)
                continue
            split_runs(prow, pf, a0, f1)
            split_runs(prow, pf, f2, z0)
        if finite and c1 > c0:
            x.gemm(n, H, c1 - c0, sc.Pb + c0, sc.Bx, sc.Vp + <size_t>(c0 // 2) * H, H,
                   sc.O + <size_t>r0 * H, H, 1)
        if finite and g1 > g0:
            x.gemm(n, H, g1 - g0, sc.Pf + g0, sc.Bx, sc.Vfp + <size_t>(g0 // 2) * H, H,
                   sc.O + <size_t>r0 * H, H, 1)
        r0 = r0 + n


cdef inline void alpha_row(const Params *p, const float *x, float *q,
                           const float *ks) noexcept nogil:
    """q = x times alpha, and times K's scales ks (per channel or per tensor) where not NULL (q
    may be x)."""
    cdef int i
    if ks != NULL:
        for i in range(p.H):
            q[i] = x[i] * (p.alpha * ks[i if p.k_pc else 0])
    else:
        for i in range(p.H):
            q[i] = x[i] * p.alpha


cdef void tile_queries(const Params *p, int b, int j, int s0, int s1, float *Qt, float *tmp,
                       const float *ks, float *mrow, float *lrow, bint sink) noexcept nogil:
    """The query rows of positions [s0, s1) of the G heads of KV head j, as a tile reads them:
    row r = (s - s0) * G + g of Qt [., H] is head j * G + g's row prepared (prep_plain, then
    K's rotation turning all the rows at once, through tmp [., H]) times alpha, and times K's
    scales ks where ks != NULL (alpha_row; rows that need no preparing in one pass); the
    online softmax starts at mrow[r] = the sink's logit, lrow[r] = 1 where `sink`, else -inf
    and 0."""
    cdef int G = p.G, H = p.H, M = (s1 - s0) * G, s, g, r
    cdef const float *R = rotation(p.rk, p, j)
    cdef bint plain = R == NULL and p.qn == NULL and not p.do_rotary
    cdef const float *src
    for s in range(s0, s1):
        for g in range(G):
            r = (s - s0) * G + g
            src = p.q + (<size_t>b * p.S + s) * p.q_tok + (<size_t>j * G + g) * H
            if plain:
                alpha_row(p, src, Qt + <size_t>r * H, ks)
            else:
                prep_plain(p, src, (tmp if R != NULL else Qt) + <size_t>r * H, p.qn,
                           position(p, b, s))
    if R != NULL:
        turn_rows(p, tmp, H, Qt, R, p.rk_c, M)
    for r in range(M):
        if not plain:
            alpha_row(p, Qt + <size_t>r * H, Qt + <size_t>r * H, ks)
        mrow[r] = sink_logit(p, j * G + r % G) if sink else -INFINITY
        lrow[r] = 1.0 if sink else 0.0


cdef void tile_out(const Params *p, int b, int j, int s0, int M, const float *O, const float *lrow,
                   const float *vs) noexcept nogil:
    """The output rows of a tile's M rows (row r: position s0 + r // G, head j * G + r % G):
    O[r] / lrow[r] (NaN stays NaN), times V's scales vs (per channel or tensor) where not NULL."""
    cdef int G = p.G, H = p.H, r, i
    cdef float *row
    cdef float inv
    for r in range(M):
        row = p.out + ((<size_t>b * p.S + s0 + r // G) * p.N + <size_t>j * G + r % G) * H
        inv = 1.0 / lrow[r] if lrow[r] != 0 else 0.0
        if vs != NULL:
            for i in range(H):
                row[i] = O[<size_t>r * H + i] * inv * vs[i if p.v_pc else 0]
        else:
            for i in range(H):
                row[i] = O[<size_t>r * H + i] * inv


cdef void direct_pv(const Params *p, const gqa_kernels *t, int b, int j, int k0, int nb, int M,
                    const int *rlo, const int *rhi, const float *P, float *O,
                    bint floats) noexcept nogil:
    """O [M, H] += P [M, nb] @ V over keys [k0, k0 + nb) by p.sv on V's rows as stored (with
    `floats` by the float32 kernel on the float windows' rows): one call for all M rows, or,
    where V's values may be NaN / inf (not p.v_finite) and some row masks keys of the block,
    each row over its own keys (0 * inf would be NaN)."""
    cdef int G = p.G, H = p.H, r, a0, z0
    cdef bint masked = False
    if not p.v_finite:
        for r in range(M // G):
            tile_keys(rlo[r], rhi[r], k0, nb, &a0, &z0)
            if a0 > 0 or z0 < nb:
                masked = True
                break
    for r in range(0 if masked else M, M):
        tile_keys(rlo[r // G], rhi[r // G], k0, nb, &a0, &z0)
        if z0 <= a0:
            continue
        if floats:
            t.sv_gemm(1, H, z0 - a0, P + <size_t>r * nb + a0, nb,
                      float_keys(p, p.fv, b, j, k0 + a0), p.hp_type, NULL, O + <size_t>r * H, H,
                      1.0)
        else:
            p.sv(1, H, z0 - a0, P + <size_t>r * nb + a0, nb, v_row(p, b, j, k0 + a0), p.vtype,
                 v_scales(p, j), O + <size_t>r * H, H, 1.0)
    if masked:
        return
    if floats:
        t.sv_gemm(M, H, nb, P, nb, float_keys(p, p.fv, b, j, k0), p.hp_type, NULL, O, H, 1.0)
    else:
        p.sv(M, H, nb, P, nb, v_row(p, b, j, k0), p.vtype, v_scales(p, j), O, H, 1.0)


cdef void direct_mixed(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk, int b, int j,
                       int k0, int nb, int M, const Tiled *sc) noexcept nogil:
    """Keys [k0, k0 + nb) that the rows of a direct step read both ways (float windows: at
    most S - 1 keys, where the rows' recent windows start): row by row and run by run, its
    float runs on the windows' rows by the float32 kernels, its code run on the codes by qk
    and p.sv, with the online softmax between scores and P @ V."""
    cdef int G = p.G, H = p.H, r, i, a0, z0, f1, q0, q1, f2
    cdef float *row
    cdef const float *q
    cdef float *o
    for r in range(M):
        i = r // G
        row = sc.Sx + <size_t>r * nb
        q = sc.Qt + <size_t>r * H
        o = sc.O + <size_t>r * H
        tile_keys(sc.rlo[i], sc.rhi[i], k0, nb, &a0, &z0)
        float_runs(sc.rns[i], sc.rrl[i], k0, a0, z0, &f1, &q0, &q1, &f2)
        if f1 > a0:
            t.qk_gemm(1, f1 - a0, H, 1.0, q, H, float_keys(p, p.fk, b, j, k0 + a0), p.hp_type,
                      NULL, row + a0, nb)
        if q1 > q0:
            qk(1, q1 - q0, H, 1.0, q, H, k_row(p, b, j, k0 + q0), p.ktype, k_scales(p, j),
               row + q0, nb)
        if z0 > f2:
            t.qk_gemm(1, z0 - f2, H, 1.0, q, H, float_keys(p, p.fk, b, j, k0 + f2), p.hp_type,
                      NULL, row + f2, nb)
        online_row(p, NULL, row, NULL, o, &sc.mrow[r], &sc.lrow[r], a0, z0, nb, 0, b,
                   j * G + r % G, i, k0, True)
        if f1 > a0:
            t.sv_gemm(1, H, f1 - a0, row + a0, nb, float_keys(p, p.fv, b, j, k0 + a0), p.hp_type,
                      NULL, o, H, 1.0)
        if q1 > q0:
            p.sv(1, H, q1 - q0, row + q0, nb, v_row(p, b, j, k0 + q0), p.vtype, v_scales(p, j), o,
                 H, 1.0)
        if z0 > f2:
            t.sv_gemm(1, H, z0 - f2, row + f2, nb, float_keys(p, p.fv, b, j, k0 + f2), p.hp_type,
                      NULL, o, H, 1.0)


cdef void attend_direct(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk, int b, int j,
                        int c, float *scratch) noexcept nogil:
    """A multi-token step of few rows (p.direct: no matrix tiles): the S x G query rows of KV
    head j, batch b, read the cache through the decode kernels -- qk on K's rows and p.sv on
    V's, as stored, Bc keys at a time -- with attend_tiled's online softmax and no float
    tiles, so each K / V row is read once for all rows and never dequantized into a tile.
    With float windows the key blocks end where the rows' float runs do (as attend_tiled's):
    a block every row reads as codes goes as above, one read as floats the same way on the
    windows' rows (float32 kernels), one read both ways row by row (direct_mixed).  With key
    chunks (p.chunks > 1) only keys [c * chunk_len, (c + 1) * chunk_len) of the rows' range,
    as (m, l, unnormalised P @ V) per row into the unit's partials; the item that finishes
    the unit's last chunk merges them (decode_merge adds the sink)."""
    cdef Tiled sc
    tiled_layout(p, scratch, &sc)
    cdef int G = p.G, H = p.H, M = p.S * G, r, k0, nb, a0, z0, lo, hi
    cdef int u = b * p.Nkv + j, kind, e0, e1, e2, e3, e4
    cdef int cut[3]
    cdef bint chunked = p.chunks > 1
    cdef float *parts
    cdef float *pr
    row_ranges(p, b, 0, p.S, p.fk != NULL, sc.rlo, sc.rhi, sc.rns, sc.rrl, &lo, &hi, cut)
    if chunked:
        lo = c * p.chunk_len if c * p.chunk_len > lo else lo
        hi = (c + 1) * p.chunk_len if (c + 1) * p.chunk_len < hi else hi
    tile_queries(p, b, j, 0, p.S, sc.Qt, sc.O, NULL, sc.mrow, sc.lrow,
                 (p.smooth or p.sink != NULL) and not chunked)
    memset(sc.O, 0, <size_t>M * H * sizeof(float))
    k0 = lo
    while k0 < hi:
        nb = hi - k0 if hi - k0 < p.Bc else p.Bc
        kind = 1
        if p.fk != NULL:
            nb = cut_block(cut, k0, nb)
            kind = tile_reads(k0, nb, p.S, sc.rlo, sc.rhi, sc.rns, sc.rrl, &e0, &e1, &e2, &e3,
                              &e4)
        if kind == 3:
            direct_mixed(p, t, qk, b, j, k0, nb, M, &sc)
            k0 = k0 + nb
            continue
        if kind == 2:
            t.qk_gemm(M, nb, H, 1.0, sc.Qt, H, float_keys(p, p.fk, b, j, k0), p.hp_type, NULL,
                      sc.Sx, nb)
        else:
            qk(M, nb, H, 1.0, sc.Qt, H, k_row(p, b, j, k0), p.ktype, k_scales(p, j), sc.Sx, nb)
        for r in range(M):
            tile_keys(sc.rlo[r // G], sc.rhi[r // G], k0, nb, &a0, &z0)
            online_row(p, NULL, sc.Sx + <size_t>r * nb, NULL, sc.O + <size_t>r * H, &sc.mrow[r],
                       &sc.lrow[r], a0, z0, nb, 0, b, j * G + r % G, r // G, k0, True)
        direct_pv(p, t, b, j, k0, nb, M, sc.rlo, sc.rhi, sc.Sx, sc.O, kind == 2)
        k0 = k0 + nb
    if not chunked:
        tile_out(p, b, j, 0, M, sc.O, sc.lrow, NULL)
        return
    parts = p.partials + <size_t>u * p.chunks * M * (H + 2)
    for r in range(M):
        pr = parts + (<size_t>c * M + r) * (H + 2)
        pr[0] = sc.mrow[r]
        pr[1] = sc.lrow[r]
        memcpy(pr + 2, sc.O + <size_t>r * H, H * sizeof(float))
    if gqa_work_done(&p.merged[u]) == p.chunks:
        decode_merge(p, b, j, parts)


cdef void attend_tiled(const Params *p, const gqa_kernels *t, int b, int j, int qb,
                       float *scratch) noexcept nogil:
    """Flash attention for query rows [qb*Br, qb*Br + Br) of the G heads of KV head j:
    each K/V block is dequantized once into float32 tiles (K transposed) shared by all
    M = rows x G query rows; scores and P @ V are float32 GEMMs; online softmax (m, l).
    Causal float windows of a multi-token step (p.hstage): a row reads positions [0, ns) and
    [rl, end) of its own end as floats, the rest as codes, so a tile that some row reads both
    ways gets two tile pairs (codes: Kt / Vt, staged floats: Kf / Vf), both score GEMMs, each
    row's scores taken from the pair it reads, and P split between the two P @ V GEMMs.
    p.tiles (accuracy level >= 3): both GEMMs on matrix tiles in bfloat16 (scores in rows of
    ls = nb padded to 32), softmax in float32: K's tile made as rows [nb, H] (a float32 cache's
    own rows, no copy) and packed into K^T's pairs, V's into pairs of keys; static INT8 / INT4
    codes without float windows enter the tiles as they are (K's scales in the query rows,
    V's on the output); with causal float windows, K's tiles as rows too, a mixed tile's two
    pairs strip by strip (mixed_strips); each 32-row strip takes its scores, softmax and P @ V
    in turn (tile_strips); a tile whose masked keys have NaN / inf values (nan_values) takes
    its scores on the tiles strip by strip, and the float32 P @ V per row as below.
    Level 4 without matrix tiles on static INT8 / INT4 codes (scales below 1e30): P @ V by p.sv
    on V's codes (VNNI: INT8; AVX2), and on AVX2 the scores by p.qk_tiles on K's codes (the
    packed kernels of kernels_avx2_pack.h), also on per-group codes (P @ V where a tile's
    metadata is below 1e30), with no float32 tile; with causal float windows, on the tiles every
    row reads as codes (staged_tiles' kind 1); a float32 cache's tiles as p.kqtype's /
    p.vqtype's codes where they stand in (code_tile; kept from block to block with p.keep,
    keep_codes)."""
    cdef Tiled sc
    tiled_layout(p, scratch, &sc)
    cdef int G = p.G, H = p.H, Bc = p.Bc
    cdef int s0 = qb * p.Br, s1, R, M, r, s, i, k0, nb, a0, z0, kv_lo, kv_hi
    cdef float *Qt = sc.Qt
    cdef float *Sx = sc.Sx
    cdef float *O = sc.O
    cdef float *mrow = sc.mrow
    cdef float *lrow = sc.lrow
    cdef float *Kt = sc.Kt
    cdef float *Vt = sc.Vt
    cdef int *rlo = sc.rlo
    cdef int *rhi = sc.rhi
    cdef int *rns = sc.rns
    cdef int *rrl = sc.rrl
    cdef float *Sf = sc.Sf
    cdef float *Kf = sc.Kf
    cdef float *Vf = sc.Vf
    cdef const gqa_tiles *x = p.tiles
    cdef int ls, nbx = 0, z, ldk = 0
    cdef bint smooth = p.smooth or p.sink != NULL
    cdef bint nanv = 0, codes_pv, codes_qk, pv_codes = 0, kcodes, vcodes, kdirect, vdirect, keep
    cdef const uint32_t *Kp = sc.Kp     # the packed tiles: sc's, or p.keep's kept ones
    cdef const uint32_t *Vp = sc.Vp
    cdef size_t kstep = <size_t>(sc.Hk // 2) * sc.Kx, vstep = <size_t>(sc.Bx // 2) * p.H
    cdef const float *Kr = Kt     # the rows the tiles pack: Kt / Vt, or a float32 cache's own
    cdef const float *Vr = Vt
    cdef const float *ks
    cdef const float *vs
    cdef int kind, f1, q0, q1, f2
    cdef float zr
    cdef float *row
    cdef int qend = 0
    cdef int cut[3]
    # the codes the integer kernels read: the cache's, or a float32 cache's quantized (p.kqtype)
    cdef bint quant = p.vqtype >= 0
    cdef int ktc = p.kqtype if quant else p.ktype, vtc = p.vqtype if quant else p.vtype
    cdef const uint8_t *kq = NULL
    cdef const uint8_t *vq = NULL
    cdef const float *kcs       # their scales: the cache's, or the tile's
    cdef const float *vcs
    s1 = s0 + p.Br if s0 + p.Br < p.S else p.S
    R = s1 - s0
    M = R * G
    # tiles over static INT8 / INT4 codes without float windows: the tiles hold the codes
    # themselves (exact in bfloat16: one rounding fewer per product), K's scales folded into
    # the query rows (times alpha), V's applied to the output rows
    kcodes = x != NULL and p.fk == NULL and p.k_finite
    vcodes = x != NULL and p.fk == NULL and p.v_finite
    ks = k_scales(p, j)
    vs = v_scales(p, j)
    kcs = ks
    vcs = vs
    if quant:
        vcs = NULL
    if kcodes or vcodes:
        for i in range(H):
            sc.one[i] = 1.0
    # p.hstage: tiles end where the rows' float runs do (cut_block)
    row_ranges(p, b, s0, s1, p.hstage, rlo, rhi, rns, rrl, &kv_lo, &kv_hi, cut)
    tile_queries(p, b, j, s0, s1, Qt, O, ks if kcodes else NULL, mrow, lrow, smooth)
    memset(O, 0, <size_t>sc.Mx * H * sizeof(float))
    # accuracy level 4 on INT8 / INT4 V codes (scales below 1e30): P @ V by the integer-dot
    # kernel on the codes themselves, and no V tile; per-group codes where a tile's scales and
    # zeros are below 1e30 (pv_codes, tile_codes_ok); with causal float windows on the tiles of
    # codes only (kind 1)
    codes_pv = (p.sv_tiles != t.sv_gemm and (p.fk == NULL or p.hstage) and x == NULL
                and (p.v_codes_ok or GQA_IS_GROUP(p.vtype) or quant))
    # ... and the scores, where the path's integer dots beat float32 products (p.qk_tiles: AVX2;
    # masked keys' scores are never read, so any per-group metadata will do)
    codes_qk = (p.qk_tiles != NULL and (p.fk == NULL or p.hstage) and x == NULL
                and (p.k_codes_ok or GQA_IS_GROUP(p.ktype) or quant))
    kdirect = x != NULL and p.fk == NULL and p.ktype == GQA_F32
    vdirect = x != NULL and p.fk == NULL and p.vtype == GQA_F32
    # p.keep: the tiles of keys [0, kv_hi) packed once for every query block of the unit
    keep = p.keep and kv_lo == 0 and <size_t>kv_hi <= kept_tiles(p) * Bc
    if x != NULL:
        x.begin()
        x.pack_rows(Qt, H, M, H, sc.Mx, sc.Hk, sc.Qb)
        if keep:
            keep_tiles(p, t, &sc, b, j, kv_hi, kdirect, vdirect, sc.one if kcodes else NULL,
                       sc.one if vcodes else NULL)
    elif quant:
        # the tiles' codes cover keys [k0, min(k0 + Bc, qend)): each tile's the same for every
        # query block and thread (K's per-channel ranges depend on the keys they cover)
        key_range(p, b, p.S - 1, &a0, &qend)
        keep = keep and <size_t>qend <= kept_tiles(p) * Bc
        if keep:
            keep_codes(p, t, &sc, b, j, qend)
    k0 = kv_lo
    while k0 < kv_hi:
        nb = kv_hi - k0 if kv_hi - k0 < Bc else Bc
        kind = 0
        if p.hstage:
            nb = cut_block(cut, k0, nb)
            pv_codes = codes_pv and tile_codes_ok(p, b, j, k0, nb)
            kind = staged_tiles(p, t, b, j, k0, nb, R, rlo, rhi, rns, rrl, x != NULL, codes_qk,
                                pv_codes, Kt, Vt, Kf, Vf)
        elif quant:
            i = k0 // Bc if keep else 0
            if not keep:
                code_tile(p, t, &sc, b, j, k0, qend - k0 if qend - k0 < Bc else Bc, 0)
            kq = sc.Kq + i * sc.kslot if codes_qk and sc.kept[2 + i] & 1 else NULL
            vq = sc.Vq + i * sc.vslot if codes_pv and sc.kept[2 + i] & 2 else NULL
            kcs = sc.Kz + <size_t>i * 2 * H
            pv_codes = vq != NULL
            if kq == NULL or vq == NULL:
                kv_tiles(p, t, b, j, k0, nb, NULL if kq != NULL else Kt, NULL if pv_codes else Vt,
                         False, NULL, NULL)
        elif keep:
            i = k0 // Bc
            Kp = sc.Kp + <size_t>i * kstep
            Vp = sc.Vp + <size_t>i * vstep
            # a tile with a NaN / inf in V: P @ V per row over its own keys, from V's rows
            nanv = sc.kept[2 + i]
            if nanv:
                Vr = <const float *>v_row(p, b, j, k0) if vdirect else Vt
                if not vdirect:
                    kv_tiles(p, t, b, j, k0, nb, NULL, Vt, True, NULL, sc.one if vcodes else NULL)
        else:
            # a float32 cache's rows (no windows) are the tiles' rows as they are
            Kr = <const float *>k_row(p, b, j, k0) if kdirect else Kt
            Vr = <const float *>v_row(p, b, j, k0) if vdirect else Vt
            pv_codes = codes_pv and tile_codes_ok(p, b, j, k0, nb)
            if not (kdirect and vdirect):
                kv_tiles(p, t, b, j, k0, nb, NULL if (kdirect or codes_qk) else Kt,
                         NULL if (pv_codes or vdirect) else Vt, x != NULL,
                         sc.one if kcodes else NULL, sc.one if vcodes else NULL)
        ls = nb
        if x != NULL:
            nbx = (nb + 31) & ~31
            ls = nbx
            ldk = sc.Kx if keep else nbx
            if not keep:
                x.pack_pairs_t(Kr, H, nb, H, nbx, sc.Hk, sc.Kp)
            if kind == 3:       # mixed: both pairs of tiles, strip by strip
                x.pack_pairs_t(Kf, H, nb, H, nbx, sc.Hk, sc.Kfp)
                x.pack_pairs(Vt, H, nb, H, nbx, H, sc.Vp)
                x.pack_pairs(Vf, H, nb, H, nbx, H, sc.Vfp)
                mixed_strips(p, t, x, &sc, M, G, rlo, rhi, rns, rrl, k0, nb, b, j, s0)
                k0 = k0 + nb
                continue
        if not keep:
            # kind 3: mixed_pv; V's codes (pv_codes, kind <= 1): finite, checked
            nanv = (kind != 3 and not (pv_codes and kind <= 1)
                    and nan_values(p, Vr, R, rlo, rhi, k0, nb))
        if x != NULL:
            if not nanv:
                if not keep:
                    x.pack_pairs(Vr, H, nb, H, nbx, H, sc.Vp)
                tile_strips(p, x, &sc, Kp, ldk, Vp, M, R, G, rlo, rhi, k0, nb, b, j, s0)
                k0 = k0 + nb
                continue
            # else: the float32 P @ V below, from every row's float probabilities
        elif codes_qk and kind <= 1 and not (quant and kq == NULL):
            p.qk_tiles(M, nb, H, 1.0, Qt, H, kq if quant else k_row(p, b, j, k0), ktc, kcs, Sx,
                       nb)
            if quant:       # K's zeros: each row's constant (code_rows)
                t.qk_gemm(M, 1, H, 1.0, Qt, H, kcs + H, GQA_F32, NULL, sc.Zr, 1)
                for r in range(M):
                    zr = sc.Zr[r]
                    row = Sx + <size_t>r * nb
                    for i in range(nb):
                        row[i] += zr
        else:
            t.sv_gemm(M, nb, H, Qt, H, Kt, GQA_F32, NULL, Sx, nb, 0.0)
        if kind == 3:       # mixed: each row's float runs take the staged rows' scores
            t.sv_gemm(M, nb, H, Qt, H, Kf, GQA_F32, NULL, Sf, nb, 0.0)
            for r in range(M):
                i = r // G
                tile_keys(rlo[i], rhi[i], k0, nb, &a0, &z0)
                float_runs(rns[i], rrl[i], k0, a0, z0, &f1, &q0, &q1, &f2)
                move_runs(Sx + <size_t>r * nb, Sf + <size_t>r * nb, a0, f1)
                move_runs(Sx + <size_t>r * nb, Sf + <size_t>r * nb, f2, z0)
        for r in range(M):
            if x != NULL and r % TILE_STRIP == 0:
                # the scores of rows [r, r + TILE_STRIP) (16 or 32 of Mx), softmaxed while
                # they are in L1
                i = TILE_STRIP if sc.Mx - r >= TILE_STRIP else sc.Mx - r
                z = strip_keys(r, i, M, G, rlo, rhi, k0, nb, nbx)
                if z > 0:   # scores past z are never read (set to -inf below)
                    x.gemm(i, z, sc.Hk, sc.Qb + <size_t>r * sc.Hk, sc.Hk, Kp, ldk,
                           Sx + <size_t>r * ls, ls, 0)
            tile_keys(rlo[r // G], rhi[r // G], k0, nb, &a0, &z0)
            online_row(p, x, Sx + <size_t>r * ls, sc.Pb + <size_t>r * sc.Bx, O + <size_t>r * H,
                       &mrow[r], &lrow[r], a0, z0, nb, nbx, b, j * G + r % G, s0 + r // G, k0,
                       True)
        if kind == 3:
            mixed_pv(p, t, k0, nb, M, rlo, rhi, rns, rrl, Sx, Sf, Vt, Vf, O)
        elif nanv:
            # a key masked for some rows of the tile has a NaN / inf value: 0 * inf is NaN,
            # so each row takes P @ V over its own keys only (as the naive path does)
            for r in range(M):
                tile_keys(rlo[r // G], rhi[r // G], k0, nb, &a0, &z0)
                if z0 > a0:
                    t.sv_gemm(1, H, z0 - a0, Sx + <size_t>r * ls + a0, ls, Vr + <size_t>a0 * H,
                              GQA_F32, NULL, O + <size_t>r * H, H, 1.0)
        elif pv_codes and kind <= 1:
            p.sv_tiles(M, H, nb, Sx, nb, vq if quant else v_row(p, b, j, k0), vtc, vcs, O, H,
                       1.0)
        else:
            t.sv_gemm(M, H, nb, Sx, nb, Vt, GQA_F32, NULL, O, H, 1.0)
        k0 = k0 + nb
    if x != NULL:
        x.end()
    tile_out(p, b, j, s0, M, O, lrow, vs if vcodes else NULL)


cdef void decode_chunk(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk, int b, int j,
                       int c, float *parts, float *scratch) noexcept nogil:
    """Flash decoding, phase 1: keys [c*chunk_len, (c+1)*chunk_len) of the single query row
    of the G heads of KV head j -> per head (m, l, unnormalised P @ V) in chunk c of the
    unit's partials `parts`."""
    cdef int G = p.G, H = p.H, g, h, start, end, a0, z0, n
    cdef float *part = parts + <size_t>c * G * (H + 2)
    cdef float *qbuf = scratch
    cdef float *sc = scratch + <size_t>G * H
    cdef float *row
    cdef float *pr
    cdef const float *a = p.q + <size_t>b * p.q_tok + <size_t>j * G * H
    cdef float mx
    cdef int i
    key_range(p, b, 0, &start, &end)
    a0 = c * p.chunk_len if c * p.chunk_len > start else start
    z0 = (c + 1) * p.chunk_len if (c + 1) * p.chunk_len < end else end
    n = z0 - a0
    for g in range(G):
        pr = part + g * (H + 2)
        pr[0] = -INFINITY
        pr[1] = 0.0
    if n <= 0:
        for g in range(G):
            memset(part + g * (H + 2) + 2, 0, H * sizeof(float))
        return
    if p.qprep != NULL:        # prepared once per call (split_queries)
        a = p.qprep + <size_t>p.split[b * p.Nkv + j] * G * H
    if (<size_t>a) & 63:
        memcpy(qbuf, a, <size_t>G * H * sizeof(float))
        a = qbuf
    qk_keys(p, t, qk, b, j, end, a0, n, a, sc, n)
    for g in range(G):
        h = j * G + g
        row = sc + <size_t>g * n
        pr = part + g * (H + 2)
        score_features(p, row, n, b, h, 0, a0)
        mx = nan_or_max(p, row, n)
        if mx == -INFINITY:
            memset(row, 0, n * sizeof(float))
            continue
        pr[0] = mx
        pr[1] = p.exp_sum(row, n, mx)
    sv_keys(p, t, b, j, end, a0, n, sc, n, part + 2, H + 2)


cdef void split_queries(const Params *p, float *tmp) noexcept nogil:
    """The query rows of every split decode unit as attention reads them (prep_heads, through
    tmp [G, H]), into p.qprep: once per call instead of once per key chunk."""
    cdef int u, b, j
    cdef const float *a
    for u in range(p.B * p.Nkv):
        if p.split[u] < 0:
            continue
        b = u // p.Nkv
        j = u % p.Nkv
        a = p.q + <size_t>b * p.q_tok + <size_t>j * p.G * p.H
        prep_heads(p, a, p.qprep + <size_t>p.split[u] * p.G * p.H, tmp, position(p, b, 0),
                   rotation(p.rk, p, j))


cdef void decode_merge(const Params *p, int b, int j, const float *parts) noexcept nogil:
    """Flash decoding, phase 2: log-sum-exp merge of the unit's chunks, in chunk order (the
    same bits whichever threads computed them), into the output of (b, j): its S x G rows
    (row r: position r // G, head j * G + r % G; chunk c's at parts[(c * S * G + r) * (H + 2)])."""
    cdef int G = p.G, H = p.H, R = p.S * p.G, r, c, h
    cdef size_t i
    cdef const float *pr
    cdef const float *pv
    cdef float *o
    cdef float M, L, w, inv
    for r in range(R):
        h = j * G + r % G
        o = p.out + ((<size_t>b * p.S + r // G) * p.N + h) * H
        M = sink_logit(p, h) if (p.smooth or p.sink != NULL) else -INFINITY
        for c in range(p.chunks):
            pr = parts + (<size_t>c * R + r) * (H + 2)
            if pr[0] > M or pr[0] != pr[0]:   # a NaN chunk makes the row NaN
                M = pr[0]
        memset(o, 0, H * sizeof(float))
        if M == -INFINITY:
            continue
        L = expf(sink_logit(p, h) - M) if (p.smooth or p.sink != NULL) else 0.0
        for c in range(p.chunks):
            pr = parts + (<size_t>c * R + r) * (H + 2)
            if pr[1] != 0:
                w = expf(pr[0] - M)
                L = L + w * pr[1]
                pv = pr + 2     # unsigned index, no offset: a loop the compiler vectorises
                for i in range(<size_t>H):
                    o[i] = o[i] + w * pv[i]
        inv = 1.0 / L if L != 0 else 0.0
        for i in range(<size_t>H):
            o[i] = o[i] * inv


cdef void decode_item(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk, int item,
                      bint write, float *scratch) noexcept nogil:
    """Decode work item `item`: a whole (b, j) unit (its cache write when `write`, then
    attend_naive) or key chunk c of a split unit.  A split unit is written by its items only
    in place, where the write is the new row alone: the chunk holding that row writes it
    before reading it, and no other chunk reads it.  The thread that finishes a unit's last
    chunk merges the unit's chunks."""
    cdef int u = item, c = -1, b, j, pb
    cdef float *parts
    if p.items != NULL:
        u = p.items[item] // (p.chunks + 1)
        c = p.items[item] % (p.chunks + 1) - 1
    b = u // p.Nkv
    j = u % p.Nkv
    if c < 0:
        if write:
            write_cache(p, t, b, j, scratch)
        attend_naive(p, t, qk, b, j, scratch)
        return
    parts = p.partials + <size_t>p.split[u] * p.chunks * p.G * (p.H + 2)
    pb = past_len(p, b)
    if write and c * p.chunk_len <= pb < (c + 1) * p.chunk_len:
        write_cache(p, t, b, j, scratch)
    decode_chunk(p, t, qk, b, j, c, parts, scratch)
    if gqa_work_done(&p.merged[u]) == p.chunks:
        decode_merge(p, b, j, parts)


cdef inline int turn_positions(const Params *p) noexcept nogil:
    """Positions of the G output rows each that unrotate turns at once (turn_rows >= G)."""
    return p.turn_rows // p.G


cdef void unrotate(const Params *p, const gqa_kernels *t, int u, float *tmp) noexcept nogil:
    """The output rows of the G heads of KV head j at positions [s0, s0 + cs) of batch b
    (u = (b * Nkv + j) * chunks + c, s0 = c * cs, cs = turn_positions), turned back from V's
    rotated basis: o = o' R_V[j]^T (the QK kernel: o[n] = sum_k o'[k] R_V[j][n, k], summed in
    order for any number of rows; gqa_hadamard_rows for the `+had` rotation), through tmp
    [2, turn_rows, H]."""
    cdef int cs = turn_positions(p), nc = (p.S + cs - 1) // cs
    cdef int c = u % nc, j = (u // nc) % p.Nkv, b = u // nc // p.Nkv, s
    cdef int s0 = c * cs, s1 = s0 + cs if s0 + cs < p.S else p.S
    cdef size_t gh = <size_t>p.G * p.H
    cdef float *rows = tmp + <size_t>p.turn_rows * p.H
    for s in range(s0, s1):
        memcpy(rows + (s - s0) * gh, p.out + ((<size_t>b * p.S + s) * p.N + <size_t>j * p.G) * p.H,
               gh * sizeof(float))
    if p.rv_c > 0:      # the `+had` rotation: gqa_hadamard_rows' x R^T
        t.hadamard_rows((s1 - s0) * p.G, p.H, rows, p.H, tmp, p.H, p.rv_c, 1)
    else:
        t.qk_gemm((s1 - s0) * p.G, p.H, p.H, 1.0, rows, p.H, rotation(p.rv, p, j), GQA_F32, NULL,
                  tmp, p.H)
    for s in range(s0, s1):
        memcpy(p.out + ((<size_t>b * p.S + s) * p.N + <size_t>j * p.G) * p.H, tmp + (s - s0) * gh,
               gh * sizeof(float))


cdef int length_error(Params *p, int64_t max_pos, int *where) noexcept nogil:
    """The rules on seqlens_k and rotary positions that keep every read and write inside
    its buffer, stated once for both callers (run, and the call checks of gqa/_signature.pyx):
    0 when all hold, with p.Tmax = max_b T_b; else the broken rule -- 1 seqlens_k[b] out
    of [0, min(Pres, T)), 2 too small for S, 3 more past rows than past_key has, 4 rotary
    position of (b, s) outside [0, max_pos) -- with where = {b, s}."""
    cdef int b, s, sk
    cdef int64_t pos
    p.Tmax = 0
    for b in range(p.B):
        where[0] = b
        where[1] = 0
        sk = p.seqlens[b]
        if sk < 0 or sk >= p.Pres or sk + 1 > p.T:
            return 1
        if not p.first_prompt and sk + 1 < p.S:
            return 2
        if p.has_past and not p.shared and p.L != 0 and not p.first_prompt and sk + 1 - p.S > p.Pbuf:
            return 3
        if p.do_rotary:
            for s in range(p.S):
                where[1] = s
                pos = position(p, b, s)
                if pos < 0 or pos >= max_pos:
                    return 4
        if sk + 1 > p.Tmax:
            p.Tmax = sk + 1
    return 0


cdef int check_lengths(Params *p, int64_t max_pos) except -1:
    """length_error as the operator's ValueError (one statement of the rules and their
    messages, for the call's checks in gqa/_signature.pyx and for run's own copies)."""
    cdef int where[2]
    where[0] = 0
    where[1] = 0
    cdef int e = length_error(p, max_pos, where)
    cdef int b = where[0], s = where[1], sk = p.seqlens[where[0]] if e else 0
    if e == 1:
        if sk < 0 or sk >= p.Pres:
            raise ValueError(f"seqlens_k[{b}] = {sk} is out of range [0, {p.Pres})")
        raise ValueError(f"seqlens_k[{b}] = {sk} exceeds total_sequence_length - 1 = {p.T - 1}")
    if e == 2:
        raise ValueError(f"seqlens_k[{b}] = {sk} is too small for sequence_length {p.S}")
    if e == 3:
        raise ValueError(f"seqlens_k[{b}] = {sk} requires {sk + 1 - p.S} past KV rows, which "
                         f"exceeds the past buffer sequence length {p.Pbuf}.")
    if e == 4:
        if p.first_prompt:
            base = p.pos_ids[0] if p.pos_ids != NULL else 0
            raise ValueError(f"position_ids base value {base} with sequence_length {p.S} exceeds "
                             f"cos/sin cache range [0, {max_pos})")
        if p.pos_ids != NULL:
            raise ValueError(f"position_ids[{b}, {s}] = {position(p, b, s)} is out of range "
                             f"[0, {max_pos})")
        raise ValueError(f"seqlens_k[{b}] = {sk} is out of range for rotary cache dimension 0 "
                         f"({max_pos})")
    return 0


cdef class Consts:
    """The parameters of one input signature (see gqa/_signature.pyx, Signature); reused across calls."""

    def __init__(self, *, int B, int S, int N, int Nkv, int H, int L, int Pbuf, size_t q_tok,
                 size_t kv_tok, bint has_past, bint shared, bint packed, int ktype, int vtype, size_t k_rb,
                 size_t v_rb, bint k_pc, bint v_pc, float alpha, float softcap, int W, bint causal,
                 int rot_half, bint do_rotary, bint interleaved, int pos_stride, bint bias_bb,
                 bint bias_nb, bint smooth, int qk_mode, bint round_half, float qk_eps=0.0,
                 int sink=0, int recent=0, int hp_type=GQA_F32, bint hp_causal=True):
        memset(&self.p, 0, sizeof(Params))
        self.p.B = B; self.p.S = S; self.p.N = N; self.p.Nkv = Nkv; self.p.G = N // Nkv
        self.p.H = H; self.p.L = L; self.p.Pbuf = Pbuf
        self.p.q_tok = q_tok; self.p.kv_tok = kv_tok; self.p.packed = packed
        self.p.has_past = has_past; self.p.shared = shared
        self.p.ktype = ktype; self.p.vtype = vtype; self.p.k_rb = k_rb; self.p.v_rb = v_rb
        self.p.k_pc = k_pc; self.p.v_pc = v_pc
        self.p.alpha = alpha; self.p.softcap = softcap; self.p.W = W; self.p.causal = causal
        self.p.rot_half = rot_half; self.p.do_rotary = do_rotary; self.p.interleaved = interleaved
        self.p.pos_stride = pos_stride
        self.p.bias_bb = bias_bb; self.p.bias_nb = bias_nb
        self.p.smooth = smooth; self.p.qk_mode = qk_mode; self.p.round_half = round_half
        self.p.qk_eps = qk_eps
        self.p.nsink = sink; self.p.nrecent = recent; self.p.hp_type = hp_type
        self.p.hcausal = hp_causal
        self.p.hp_rb = gqa_row_bytes(hp_type, H)

    cdef Consts with_rows(self, int rows):
        """The same parameters over an in-place buffer of `rows` rows (a windowed step's
        staging buffer)."""
        cdef Consts c = Consts.__new__(Consts)
        c.p = self.p
        c.p.Pbuf = rows
        return c


cpdef run(Consts c, q, k, v, seqlens, kc, vc, pk, pv, ks, vs, cos, sin, pos_ids, bias, sink,
          qn, kn, out, qk_out, int T, int Pres, bint first_prompt, int num_threads, bint flash,
          int q_block, int kv_block, int decode_chunks, int decode_ranges, bint direct=False,
          col_base=None, int bias_T=0, rk=None, rv=None, hk=None, hv=None, phk=None, phv=None,
          int accuracy=0, float rk_c=0, float rv_c=0, ring_k=None, ring_v=None):
    """One call: cache write, then attention (naive, tiled flash or decode work items;
    _work.pxi).  Decode (S == 1, flash): the units are split into `decode_ranges` contiguous
    ranges and the last unit of each is split into `decode_chunks` key chunks (flash
    decoding; every unit when decode_ranges >= units), so a thread that runs out of work can
    take a chunk of another's last unit.  `direct` (the plan's, S > 1): the step's rows are
    one tile per unit on the decode kernels (attend_direct), each unit in `decode_chunks` key
    chunks, where the CPU's matrix tiles and float windows leave it to them.  rk_c / rv_c > 0:
    rk / rv is the `+had` rotation c Sy P (the caller's _orthogonal), turned by
    gqa_hadamard_rows."""
    cdef Params p = c.p
    cdef const gqa_kernels *t = active_table()
    cdef Work w
    memset(&w, 0, sizeof(Work))
    p.T = T; p.Pres = Pres; p.first_prompt = first_prompt
    p.q = <const float *>ptr(q); p.k = <const float *>ptr(k); p.v = <const float *>ptr(v)
    if p.packed:        # k and v are None: the query's K and V columns
        p.k = p.q + <size_t>p.N * p.H
        p.v = p.k + <size_t>p.Nkv * p.H
    p.seqlens = <const int *>ptr(seqlens)
    p.kc = <uint8_t *>ptr(kc); p.vc = <uint8_t *>ptr(vc)
    p.pk = <const uint8_t *>ptr(pk); p.pv = <const uint8_t *>ptr(pv)
    p.ks = <const float *>ptr(ks); p.vs = <const float *>ptr(vs)
    p.cos = <const float *>ptr(cos); p.sin = <const float *>ptr(sin)
    p.pos_ids = <const int64_t *>ptr(pos_ids)
    p.bias = <const float *>ptr(bias); p.sink = <const float *>ptr(sink)
    p.qn = <const float *>ptr(qn); p.kn = <const float *>ptr(kn)
    p.rk = <const float *>ptr(rk); p.rv = <const float *>ptr(rv)
    p.rk_c = rk_c if rk is not None and p.H <= GQA_ROT_MAX else 0.0
    p.rv_c = rv_c if rv is not None and p.H <= GQA_ROT_MAX else 0.0
    p.hk = <uint8_t *>ptr(hk); p.hv = <uint8_t *>ptr(hv)
    p.phk = <const uint8_t *>ptr(phk); p.phv = <const uint8_t *>ptr(phv)
    p.fk = p.fv = NULL
    p.hstage = 0
    p.rk_ring = <uint8_t *>ptr(ring_k); p.rv_ring = <uint8_t *>ptr(ring_v)
    p.ring_m = cnp.PyArray_DIM(<cnp.ndarray>ring_k, 2) if ring_k is not None else 0
    if hk is not None:       # [B, Nkv, rows, H] window buffers (validated by the caller)
        p.hcap = cnp.PyArray_DIM(<cnp.ndarray>hk, 2)
        p.hpast = cnp.PyArray_DIM(<cnp.ndarray>phk, 2) if phk is not None else p.hcap
        p.fk, p.fv, p.fcap = p.hk, p.hv, p.hcap
    p.bias_T = bias_T if bias_T > 0 else T     # int32 [B] col_base, validated by the caller
    p.col_base = <const int *>ptr(col_base)
    p.out = <float *>ptr(out); p.qk_out = <float *>ptr(qk_out)
    p.partials = NULL
    p.qprep = NULL
    p.items = NULL
    # The lengths and positions that drive addressing are copied and checked here, so that
    # nothing written during the call (an input aliasing a cache) or changed by another
    # thread since the Python checks can move a read or write outside its buffer.
    cdef int lens_local[64]
    cdef int64_t pos_local[256]
    cdef size_t npos = 0 if pos_ids is None else <size_t>cnp.PyArray_SIZE(<cnp.ndarray>pos_ids)
    if p.B > 64 or npos > 256:        # large batches: copies owned by NumPy
        lens = np.array(seqlens, dtype=np.int32, copy=True)
        p.seqlens = <const int *>ptr(lens)
        if pos_ids is not None:
            pos_ids = np.array(pos_ids, dtype=np.int64, copy=True)
            p.pos_ids = <const int64_t *>ptr(pos_ids)
    else:
        memcpy(lens_local, p.seqlens, p.B * sizeof(int))
        p.seqlens = lens_local
        if npos:
            memcpy(pos_local, p.pos_ids, npos * sizeof(int64_t))
            p.pos_ids = pos_local
    check_lengths(&p, 0 if cos is None else cnp.PyArray_DIM(<cnp.ndarray>cos, 0))  # sets p.Tmax

    w.units = p.B * p.Nkv
    stage_windows(&p, &w)       # first: the tiles' layout depends on p.fcap
    plan_path(&p, &w, flash, q_block, kv_block, decode_chunks, decode_ranges, direct, accuracy)
    plan_kernels(&p, t, &w, accuracy)
    plan_team(&p, &w, num_threads)
    try:
        allocate_work(&p, &w)
        with nogil:
            order_items(&p, &w)
            if w.num_threads == 1:
                run_items(&p, t, &w)
            else:
                run_team(&p, t, &w)
            if p.rv != NULL:
                run_unrotate(&p, t, &w)
    finally:
        release_work(&p, &w)
