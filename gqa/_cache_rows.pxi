# Included by gqa/_attention.pyx (one translation unit: these inline into the compute).
# The cache rows: addressing ([B, Nkv, Pres, row bytes] per cache), the float windows' rows
# (sink_size / recent_size), the key segments each reader takes from codes or floats, and the
# write of a step's new rows (quantized, rotated) into the caches and windows.

cdef inline uint8_t *k_row(const Params *p, int b, int j, size_t r) noexcept nogil:
    """Row r of the K cache slice of batch b, KV head j (rows of p.k_rb bytes, Pres per slice)."""
    return p.kc + ((<size_t>b * p.Nkv + j) * p.Pres + r) * p.k_rb


cdef inline uint8_t *v_row(const Params *p, int b, int j, size_t r) noexcept nogil:
    return p.vc + ((<size_t>b * p.Nkv + j) * p.Pres + r) * p.v_rb


cdef inline const float *k_scales(const Params *p, int j) noexcept nogil:
    """The scales of KV head j: its H channels (per channel) or the one scale (per tensor)."""
    return p.ks + (<size_t>j * p.H if p.k_pc else 0)


cdef inline const float *v_scales(const Params *p, int j) noexcept nogil:
    return p.vs + (<size_t>j * p.H if p.v_pc else 0)


# -- float windows (sink_size / recent_size): for a query row whose keys end at Tq, positions
#    [0, ns) and [Tq - nr, Tq) (hp_counts of Tq) are read as floats, the others from the codes;
#    Tq is the row's own causal end (window_partition "causal") or the call's Tb ("per_call",
#    onnxruntime main's).  The readers' float rows (p.fk / p.fv, p.fcap rows per (b, j)) are
#    the present windows, or for a causal multi-token step the staging rows: the past windows
#    followed by the step's S new rows.  Both map position pos to row pos < A ? pos : A + pos - C.

cdef inline void hp_counts(const Params *p, int Tb, int *ns, int *nr) noexcept nogil:
    """Window rows of a sequence of Tb positions: the first ns = min(sink, Tb), then the
    last nr = min(recent, Tb - ns)."""
    ns[0] = p.nsink if p.nsink < Tb else Tb
    nr[0] = p.nrecent if p.nrecent < Tb - ns[0] else Tb - ns[0]


cdef inline size_t hp_at(const Params *p, int cap, int b, int j, int r) noexcept nogil:
    """The byte offset of row r of window rows (cap rows per (b, j)) of batch b, KV head j."""
    return ((<size_t>b * p.Nkv + j) * cap + r) * p.hp_rb


cdef inline uint8_t *hp_row(const Params *p, uint8_t *w, int cap, int b, int j, int r) noexcept nogil:
    """Row r of writable window rows w (hp_at); readers of const rows add hp_at themselves."""
    return w + hp_at(p, cap, b, j, r)


cdef inline int float_row(const Params *p, int b, int pos) noexcept nogil:
    """The row of position pos among the readers' float rows."""
    cdef int T0, A, nr
    T0 = past_len(p, b) if p.hstage else p.seqlens[b] + 1
    hp_counts(p, T0, &A, &nr)
    return pos if pos < A else A + pos - (T0 - nr)


cdef inline bint segment(const Params *p, int b, int Tq, int r0, int r1, int *e, int *hrow) noexcept nogil:
    """The run [r0, e) (e <= r1) of positions of batch b that a query row with keys ending at
    Tq reads from one place: True with hrow = the float row of position r0 (rows follow
    positions), False for the codes."""
    cdef int ns, nr
    if p.fk == NULL:
        e[0] = r1
        return False
    if not p.hcausal:
        Tq = p.seqlens[b] + 1
    hp_counts(p, Tq, &ns, &nr)
    if r0 < ns:
        e[0] = ns if ns < r1 else r1
    elif r0 < Tq - nr:
        e[0] = Tq - nr if Tq - nr < r1 else r1
        return False
    else:
        e[0] = r1
    hrow[0] = float_row(p, b, r0)
    return True


cdef void qk_keys(const Params *p, const gqa_kernels *t, gqa_qk_gemm_fn qk, int b, int j, int Tq,
                  int r0, int n, const float *a, float *sc, int ldc) noexcept nogil:
    """sc[g, i] = alpha * a[g] . K[r0 + i] for the G query rows a (row stride H), i < n."""
    cdef int r = r0, e, hrow
    while r < r0 + n:
        if segment(p, b, Tq, r, r0 + n, &e, &hrow):
            t.qk_gemm(p.G, e - r, p.H, p.alpha, a, p.H, p.fk + hp_at(p, p.fcap, b, j, hrow),
                      p.hp_type, NULL, sc + (r - r0), ldc)
        else:
            qk(p.G, e - r, p.H, p.alpha, a, p.H, k_row(p, b, j, r), p.ktype, k_scales(p, j),
               sc + (r - r0), ldc)
        r = e


cdef void sv_keys(const Params *p, const gqa_kernels *t, int b, int j, int Tq, int r0, int n,
                  const float *P, int ldp, float *o, int ldo) noexcept nogil:
    """o[g] = sum_i P[g, i] V[r0 + i] over i < n (n >= 1; o overwritten)."""
    cdef int r = r0, e, hrow
    cdef float beta = 0.0
    while r < r0 + n:
        if segment(p, b, Tq, r, r0 + n, &e, &hrow):
            t.sv_gemm(p.G, p.H, e - r, P + (r - r0), ldp, p.fv + hp_at(p, p.fcap, b, j, hrow),
                      p.hp_type, NULL, o, ldo, beta)
        else:
            p.sv(p.G, p.H, e - r, P + (r - r0), ldp, v_row(p, b, j, r), p.vtype,
                      v_scales(p, j), o, ldo, beta)
        beta = 1.0
        r = e


cdef void kv_tiles(const Params *p, const gqa_kernels *t, int b, int j, int k0, int nb,
                   float *Kt, float *Vt, bint k_rows, const float *kscale, const float *vscale) noexcept nogil:
    """The flash tiles of keys [k0, k0 + nb): Kt [H, nb] (K transposed), or with k_rows K's
    rows [nb, H], and Vt [nb, H] (each not made when NULL); the tiles are shared by the query
    rows, so the windows are the call's (per_call).  kscale / vscale: the scales the codes
    dequantize with instead of KV head j's (NULL: j's)."""
    cdef int r = k0, e, hrow, Tb = p.seqlens[b] + 1
    while r < k0 + nb:
        if segment(p, b, Tb, r, k0 + nb, &e, &hrow):
            if Kt == NULL:
                pass
            elif k_rows:
                t.dequantize(p.fk + hp_at(p, p.fcap, b, j, hrow), Kt + <size_t>(r - k0) * p.H, p.H,
                             e - r, p.H, p.hp_type, NULL)
            else:
                t.dequantize_t(p.fk + hp_at(p, p.fcap, b, j, hrow), Kt + (r - k0), nb, e - r, p.H,
                               p.hp_type, NULL)
            if Vt != NULL:
                t.dequantize(p.fv + hp_at(p, p.fcap, b, j, hrow), Vt + <size_t>(r - k0) * p.H, p.H,
                             e - r, p.H, p.hp_type, NULL)
        else:
            if Kt == NULL:
                pass
            elif k_rows:
                t.dequantize(k_row(p, b, j, r), Kt + <size_t>(r - k0) * p.H, p.H, e - r, p.H, p.ktype,
                             k_scales(p, j) if kscale == NULL else kscale)
            else:
                t.dequantize_t(k_row(p, b, j, r), Kt + (r - k0), nb, e - r, p.H, p.ktype,
                               k_scales(p, j) if kscale == NULL else kscale)
            if Vt != NULL:
                t.dequantize(v_row(p, b, j, r), Vt + <size_t>(r - k0) * p.H, p.H, e - r, p.H, p.vtype,
                             v_scales(p, j) if vscale == NULL else vscale)
        r = e


# -- KVCache's rollback rows (p.rk_ring / p.rv_ring, ring_m rows per (b, j); causal windows in
#    place): the float row of each position that becomes history with the call (in [ns, Tb -
#    nr) after it) and is among its last ring_m (>= Tb - nr - ring_m), at row pos % ring_m --
#    a recent row that leaves (hp_move; a decode step's new row always enters the window) or
#    a multi-token step's staged row, old or new (hp_settle); other rows are left as they are.

cdef inline void ring_span(const Params *p, int b, int first, int *lo, int *hi) noexcept nogil:
    """The positions [lo, hi) from `first` on that go into batch b's rollback rows."""
    cdef int Tb = p.seqlens[b] + 1, ns, nr
    hp_counts(p, Tb, &ns, &nr)
    hi[0] = Tb - nr
    lo[0] = first if first > ns else ns
    if <long long>Tb - nr - p.ring_m > lo[0]:
        lo[0] = Tb - nr - p.ring_m


cdef inline uint8_t *ring_row(const Params *p, uint8_t *ring, int b, int j, int pos) noexcept nogil:
    return ring + ((<size_t>b * p.Nkv + j) * p.ring_m + pos % p.ring_m) * p.hp_rb


cdef void hp_put(const Params *p, const gqa_kernels *t, const uint8_t *f, int b, int j, int pos,
                 const float *row) noexcept nogil:
    """Store a new row (as attention reads it) of position pos among the readers' float rows f
    (p.fk or p.fv): every new row when they are a causal multi-token step's staging rows, else
    the rows of the window positions after this call."""
    cdef int Tb = p.seqlens[b] + 1, ns, nr
    if pos >= Tb:           # a ragged first prompt's rows past the entry's length: never read
        return
    if not p.hstage:
        hp_counts(p, Tb, &ns, &nr)
        if ns <= pos < Tb - nr:
            return          # history: in the codes only
    t.quantize(row, p.H, hp_row(p, <uint8_t *>f, p.fcap, b, j, float_row(p, b, pos)), 1, p.H,
               p.hp_type, NULL)


cdef void hp_move(const Params *p, uint8_t *w, const uint8_t *past, uint8_t *stage, uint8_t *ring,
                  int b, int j, int Told) noexcept nogil:
    """Before the new rows arrive: the past windows of Told positions (past: a separate buffer,
    or NULL in place) -- into the staging rows (stage != NULL) as they are, or into window
    buffer w: the sink rows, and the recent rows that stay recent moved down to their new
    place (rows not written are zeroed when w is a new buffer); the recent rows that leave,
    into the rollback rows that keep them."""
    cdef int Tb = p.seqlens[b] + 1, ns_o, nr_o, ns, nr, lo, hi, pos
    cdef uint8_t *dst = hp_row(p, w, p.hcap, b, j, 0)
    cdef const uint8_t *src = dst
    cdef size_t rb = p.hp_rb
    hp_counts(p, Told, &ns_o, &nr_o)
    if past != NULL:
        src = past + (<size_t>b * p.Nkv + j) * p.hpast * rb
    if stage != NULL:
        memcpy(hp_row(p, stage, p.fcap, b, j, 0), src, (ns_o + nr_o) * rb)
        return
    hp_counts(p, Tb, &ns, &nr)
    if ring != NULL:
        ring_span(p, b, Told - nr_o, &lo, &hi)
        for pos in range(lo, hi if hi < Told else Told):
            memcpy(ring_row(p, ring, b, j, pos), src + (ns_o + pos - (Told - nr_o)) * rb, rb)
    if past != NULL:
        memset(dst, 0, p.hcap * rb)
        memcpy(dst, src, ns_o * rb)
    # an old recent row stays when its position is >= Tb - nr (ns == ns_o whenever nr_o > 0)
    lo = Tb - nr if Tb - nr > Told - nr_o else Told - nr_o
    if lo < Told:
        memmove(dst + (ns + lo - (Tb - nr)) * rb, src + (ns_o + lo - (Told - nr_o)) * rb,
                (Told - lo) * rb)


cdef void hp_settle(const Params *p, uint8_t *w, const uint8_t *stage, uint8_t *ring, int b,
                    int j) noexcept nogil:
    """After a causal multi-token step's rows are staged: window buffer w of (b, j) gets the
    windows of the new length from the staging rows (the rest zeroed), the rollback rows the
    staged positions they keep."""
    cdef int Tb = p.seqlens[b] + 1, ns, nr, ns_o, nr_o, pos, lo, hi, Told = past_len(p, b)
    cdef size_t rb = p.hp_rb
    cdef uint8_t *dst = hp_row(p, w, p.hcap, b, j, 0)
    if ring != NULL:
        hp_counts(p, Told, &ns_o, &nr_o)
        ring_span(p, b, Told - nr_o, &lo, &hi)
        for pos in range(lo, hi):
            memcpy(ring_row(p, ring, b, j, pos), stage + hp_at(p, p.fcap, b, j, float_row(p, b, pos)), rb)
    hp_counts(p, Tb, &ns, &nr)
    memset(dst, 0, p.hcap * rb)
    memcpy(dst, stage + hp_at(p, p.fcap, b, j, 0), ns * rb)
    memcpy(dst + ns * rb, stage + hp_at(p, p.fcap, b, j, float_row(p, b, Tb - nr)),
           nr * rb)


cdef void write_cache(const Params *p, const gqa_kernels *t, int b, int j, float *tmp) noexcept nogil:
    """present[b, j]: zero-fill and copy past rows unless sharing the past buffer, then
    quantize the L new rows at row past_len(b) (K after its QK norm and rotary; K and V turned
    by their rotations, p.turn_rows rows at a time through tmp [2, turn_rows, H]); the float
    windows rolled forward and given the new rows they keep."""
    cdef int s, n, i, pb = past_len(p, b), H = p.H, c = p.turn_rows
    cdef size_t slot = <size_t>b * p.Nkv + j, ld
    cdef uint8_t *kd = k_row(p, b, j, 0)
    cdef uint8_t *vd = v_row(p, b, j, 0)
    cdef const float *src
    cdef const float *rk = rotation(p.rk, p, j)
    cdef const float *rv = rotation(p.rv, p, j)
    cdef float *plain = tmp + <size_t>c * H if rk != NULL else tmp    # rows before K's turn
    cdef bint kplain = p.do_rotary or p.kn != NULL
    cdef uint8_t *sk = <uint8_t *>p.fk if p.hstage else NULL
    cdef uint8_t *sv = <uint8_t *>p.fv if p.hstage else NULL
    if not p.shared:
        memset(kd, 0, p.Pres * p.k_rb)
        memset(vd, 0, p.Pres * p.v_rb)
        if p.has_past and pb > 0:
            memcpy(kd, p.pk + slot * p.Pbuf * p.k_rb, pb * p.k_rb)
            memcpy(vd, p.pv + slot * p.Pbuf * p.v_rb, pb * p.v_rb)
    if p.hk != NULL:
        hp_move(p, p.hk, p.phk, sk, p.rk_ring, b, j, pb)
        hp_move(p, p.hv, p.phv, sv, p.rv_ring, b, j, pb)
    if p.L == 0:
        return
    s = 0
    while s < p.L:
        n = c if p.L - s > c else p.L - s
        src = p.k + (<size_t>b * p.L + s) * p.kv_tok + <size_t>j * H
        ld = p.kv_tok
        if kplain:
            for i in range(n):
                prep_plain(p, src + i * ld, plain + <size_t>i * H, p.kn, position(p, b, s + i))
            src = plain
            ld = H
        if rk != NULL:
            turn_rows(p, src, ld, tmp, rk, p.rk_c, n)
            src = tmp
            ld = H
        t.quantize(src, ld, k_row(p, b, j, pb + s), n, H, p.ktype, k_scales(p, j))
        if p.hk != NULL:
            for i in range(n):
                hp_put(p, t, p.fk, b, j, pb + s + i, src + i * ld)
        s = s + n
    if rv == NULL and p.hv == NULL:
        t.quantize(p.v + <size_t>b * p.L * p.kv_tok + <size_t>j * H, p.kv_tok,
                   v_row(p, b, j, pb), p.L, H, p.vtype, v_scales(p, j))
        return
    s = 0
    while s < p.L:
        n = c if p.L - s > c else p.L - s
        src = p.v + (<size_t>b * p.L + s) * p.kv_tok + <size_t>j * H
        ld = p.kv_tok
        if rv != NULL:
            turn_rows(p, src, ld, tmp, rv, p.rv_c, n)
            src = tmp
            ld = H
        t.quantize(src, ld, v_row(p, b, j, pb + s), n, H, p.vtype, v_scales(p, j))
        if p.hv != NULL:
            for i in range(n):
                hp_put(p, t, p.fv, b, j, pb + s + i, src + i * ld)
        s = s + n
    if p.hstage:
        hp_settle(p, p.hk, sk, p.rk_ring, b, j)
        hp_settle(p, p.hv, sv, p.rv_ring, b, j)
