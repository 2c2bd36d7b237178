# The work of one call (included by _attention.pyx; `run` drives it): which path, how the
# (batch, KV head) units split into work items, the per-call buffers, and the loops that run
# the items on one thread or on a team.
#
#   mode 0  every unit whole: the naive path, or decode units not worth splitting
#   mode 1  tiled flash (S > 1): units x nq query tiles x chunks (chunks > 1 only for `direct`)
#   mode 2  flash decoding (S == 1): units in nsplit contiguous ranges, the last unit of each
#           split into p.chunks key chunks
#
# Buffers (freed by release_work; none is allocated twice):
#   scratch    num_threads x scratch_len floats, each thread's on a 64-byte line
#   partials   mode 2: nsplit x chunks x G x (m, l, P @ V[H]) + prepared queries nsplit x G x H;
#              direct with chunks > 1: units x chunks x S*G x (m, l, P @ V[H])
#   items      mode 2: items [work_units], split [units], merged [units] (ints);
#              direct with chunks > 1: merged [units]
#   ranges     the home ranges of the team (modes 0 and 2, more than one thread)
#   stage      the float windows' staging rows of a causal multi-token step (p.hstage)

cdef struct Work:
    int mode, units, nq, nsplit, work_units, num_threads
    bint item_write       # decode items write their own unit's cache rows (else all first)
    size_t scratch_len    # floats per thread
    float *scratch
    void *scratch_raw
    void *items_raw
    void *ranges_raw
    void *stage_raw
    gqa_work_range *ranges
    gqa_qk_gemm_fn qk     # the QK kernel of the call's codes at its accuracy level
    const gqa_tiles *dt   # the decode kernels' matrix tiles (accuracy level 4), or NULL


cdef int stage_windows(Params *p, Work *w) except -1:
    """Causal float windows of a multi-token step: p.fk / p.fv become staging rows, per
    (b, j) min(windows, past length) + S <= Tmax rows (fits an int, counted in 64 bits)."""
    cdef long long past_rows
    if p.hk == NULL or not p.hcausal or p.S <= 1:
        return 0
    p.hstage = 1
    past_rows = <long long>p.Tmax - p.S if p.Tmax > p.S else 0
    if <long long>p.nsink + p.nrecent < past_rows:
        past_rows = <long long>p.nsink + p.nrecent
    if past_rows + p.S > INT32_MAX:
        raise ValueError(f"the float windows' staging rows ({past_rows} + {p.S}) exceed "
                         f"{INT32_MAX}")
    p.fcap = <int>(past_rows + p.S)
    w.stage_raw = malloc(2 * <size_t>p.B * p.Nkv * p.fcap * p.hp_rb + 1)
    if w.stage_raw == NULL:
        raise MemoryError("gqa: cannot allocate the float windows' staging rows")
    p.fk = <uint8_t *>w.stage_raw
    p.fv = p.fk + <size_t>p.B * p.Nkv * p.fcap * p.hp_rb
    return 0


cdef void plan_path(Params *p, Work *w, bint flash, int q_block, int kv_block,
                    int decode_chunks, int decode_ranges, bint direct, int accuracy) noexcept nogil:
    """The path (w.mode), the tiles (p.Br x p.Bc, p.tiles, p.direct), the key chunks
    (p.chunks x p.chunk_len) and the work items (w.work_units) of the call."""
    cdef int S = p.S, units = w.units
    p.Br = q_block if q_block < S else S
    p.Bc = kv_block
    p.chunks = 1
    p.tiles = NULL
    p.direct = 0
    p.keep = 0
    w.mode = 0
    w.nq = 0
    w.nsplit = 0
    w.work_units = units
    if not flash or p.qk_mode:
        return
    if S > 1:
        w.mode = 1
        # accuracy level >= 3: the flash tiles' GEMMs on matrix tiles where the CPU has them
        p.tiles = tile_kernels(accuracy, p.H)
        p.direct = direct and p.Br == S
        w.nq = (S + p.Br - 1) // p.Br
        if p.direct:        # the plan left these rows to the decode kernels (step_rows)
            p.tiles = NULL
            w.nq = 1
            # work items units * chunks stay below 2^31
            if units > 0 and <long long>units * decode_chunks > 0x7fffffff:
                decode_chunks = 0x7fffffff // units
            if decode_chunks > 1 and p.Tmax > 1:
                p.chunk_len = (p.Tmax + decode_chunks - 1) // decode_chunks
                p.chunks = (p.Tmax + p.chunk_len - 1) // p.chunk_len
        w.work_units = units * w.nq * p.chunks
    elif decode_chunks > 1 and p.Tmax > 1 and units > 0:
        # item codes unit * (chunks + 1) + chunk + 1 stay below 2^31
        if <long long>units * (decode_chunks + 1) > 0x7fffffff:
            decode_chunks = 0x7fffffff // units - 1
        if decode_chunks > 1:
            p.chunk_len = (p.Tmax + decode_chunks - 1) // decode_chunks
            p.chunks = (p.Tmax + p.chunk_len - 1) // p.chunk_len
        w.nsplit = decode_ranges if decode_ranges < units else units
        if p.chunks > 1 and w.nsplit > 0:
            w.mode = 2
            w.work_units = units + w.nsplit * (p.chunks - 1)
        else:
            p.chunks = 1


cdef void plan_kernels(Params *p, const gqa_kernels *t, Work *w, int accuracy) noexcept nogil:
    """Accuracy level 4: integer-dot kernels for the codes; the decode steps' and the naive
    path's on the active tiles where they have them (AMX INT8), each thread's calls bracketed
    by the tiles' begin / end (run_items); the float32 flash tiles' P @ V on VNNI (INT8) and
    AVX2 (sv_kernel), and their scores on AVX2 (prompt_qk_kernel);
    per-group codes: the decode steps' and the naive path's, on the group-dot unit (qk_kernel),
    and on AVX2 the float32 flash tiles' QK and P @ V (prompt_qk_kernel, sv_kernel); a float32
    cache's tiles there quantized per key tile (p.kqtype, p.vqtype: float_tile_types).
    Their query rows: a KV head's G, S x G in a direct step."""
    cdef bint decode = w.mode != 1 or p.direct
    cdef int rows = p.G * p.S if p.direct else p.G
    w.qk = qk_kernel(t, p.ktype, accuracy, decode, rows)
    p.sv = sv_kernel(t, p.vtype, accuracy, decode, rows, p.H)
    p.qk_tiles = NULL if decode else prompt_qk_kernel(p.ktype, accuracy, p.H)
    p.sv_tiles = p.sv
    p.kqtype = p.vqtype = -1
    if not decode and p.ktype == GQA_F32 and p.vtype == GQA_F32:
        float_tile_types(accuracy, p.H, &p.kqtype, &p.vqtype)
        if p.vqtype >= 0:
            p.qk_tiles = prompt_qk_kernel(p.kqtype, accuracy, p.H)
            p.sv_tiles = sv_kernel(t, p.vqtype, accuracy, decode, rows, p.H)
    w.dt = NULL
    if decode:
        w.dt = dot_tiles(p.ktype, accuracy)
        if w.dt == NULL:
            w.dt = dot_tiles(p.vtype, accuracy)
    p.exp_sum = exp_kernel(t)
    p.row_max = t.row_max


cdef void plan_team(Params *p, Work *w, int num_threads) noexcept nogil:
    """The team's size and each thread's scratch (floats; a decode item's G x H query rows
    and G x Tmax scores, or the tiles' layout), and the rows a rotation turns at once."""
    w.scratch_len = <size_t>p.G * p.H + <size_t>p.G * (p.Tmax if p.Tmax > 0 else 1) + p.H + p.G
    if w.mode == 1:
        plan_keep(p)
        w.scratch_len = tiled_layout(p, NULL, NULL)
        # static codes with scales below 1e30: finite codes' values; without float windows
        # finite values only (attend_tiled)
        p.k_codes_ok = (static_codes(p.ktype)
                        and scales_below(p.ks, p.Nkv * p.H if p.k_pc else 1, 1e30))
        p.v_codes_ok = (static_codes(p.vtype)
                        and scales_below(p.vs, p.Nkv * p.H if p.v_pc else 1, 1e30))
        p.k_finite = p.k_codes_ok and p.hk == NULL
        p.v_finite = p.v_codes_ok and p.hv == NULL
    # Below ~2^17 multiply-adds the team's wake-up costs more than it saves (results do
    # not depend on the thread count, so this is only a speed decision).
    if num_threads < 1 or <size_t>p.Tmax * p.B * p.Nkv * p.H * p.S < (1 << 17):
        num_threads = 1
    if num_threads > w.work_units:
        num_threads = w.work_units if w.work_units > 0 else 1
    w.num_threads = num_threads
    # rotations turn rows in groups (write_cache, unrotate): tmp [2, turn_rows, H] with
    # G <= turn_rows <= max(G, 64), 64 rows keeping R's reuse high and the items many
    if w.scratch_len < 2 * <size_t>p.G * p.H:
        w.scratch_len = 2 * <size_t>p.G * p.H
    p.turn_rows = <int>(min(<size_t>64, w.scratch_len // (2 * <size_t>p.H)) if p.H > 0 else 1)
    p.turn_rows = p.G if p.turn_rows < p.G else p.turn_rows
    # each thread's scratch starts on a 64-byte line (whole-line vector loads and stores)
    w.scratch_len = (w.scratch_len + 15) & ~(<size_t>15)


cdef void release_work(Params *p, Work *w) noexcept nogil:
    """Every buffer of the call (NULL ones included)."""
    free(w.stage_raw)
    free(w.scratch_raw)
    free(p.partials)
    free(w.items_raw)
    free(w.ranges_raw)
    w.stage_raw = w.scratch_raw = w.items_raw = w.ranges_raw = NULL
    p.partials = NULL


cdef int allocate_work(Params *p, Work *w) except -1:
    """The buffers of the plan (the header's list); all or none (MemoryError)."""
    cdef bint split_direct = p.direct and p.chunks > 1
    w.scratch_raw = malloc(w.scratch_len * w.num_threads * sizeof(float) + 64)
    w.scratch = <float *>((<size_t>w.scratch_raw + 63) & ~(<size_t>63))
    if w.mode == 2:
        p.partials = <float *>malloc((<size_t>w.nsplit * p.chunks * p.G * (p.H + 2)
                                      + <size_t>w.nsplit * p.G * p.H) * sizeof(float))
        w.items_raw = malloc((<size_t>w.work_units + 2 * <size_t>w.units) * sizeof(int))
    elif split_direct:      # attend_direct's partials, and chunks merged per unit
        p.partials = <float *>malloc(<size_t>w.units * p.chunks * p.S * p.G * (p.H + 2)
                                     * sizeof(float))
        w.items_raw = calloc(<size_t>w.units, sizeof(int))
        p.merged = <int *>w.items_raw
    if w.mode != 1 and w.num_threads > 1:
        w.ranges_raw = malloc(<size_t>w.num_threads * sizeof(gqa_work_range) + 64)
        w.ranges = <gqa_work_range *>((<size_t>w.ranges_raw + 63) & ~(<size_t>63))
    if (w.scratch_raw == NULL
            or ((w.mode == 2 or split_direct) and (p.partials == NULL or w.items_raw == NULL))
            or (w.mode != 1 and w.num_threads > 1 and w.ranges_raw == NULL)):
        release_work(p, w)
        raise MemoryError("gqa: cannot allocate attention scratch")
    if w.ranges != NULL:
        gqa_work_ranges_init(w.ranges, w.work_units, w.num_threads)
    return 0


cdef void order_items(Params *p, Work *w) noexcept nogil:
    """Mode 2's items in unit order; unit `u` is split when it ends range r of nsplit ranges.
    A chunk reads rows that other units' items would copy, so every unit of a copying cache
    is written first (in place, each item writes what it alone reads -- but the float windows
    move rows that every chunk of the unit may read)."""
    cdef int u, c, i = 0, r = 0, units = w.units
    w.item_write = True
    if w.mode != 2:
        return
    p.items = <int *>w.items_raw
    p.split = p.items + w.work_units
    p.merged = p.split + units
    for u in range(units):
        p.merged[u] = 0
        if r < w.nsplit and u == <int>((<long long>units * (r + 1)) // w.nsplit) - 1:
            p.split[u] = r
            for c in range(p.chunks):
                p.items[i + c] = u * (p.chunks + 1) + c + 1
            i = i + p.chunks
            r = r + 1
        else:
            p.split[u] = -1
            p.items[i] = u * (p.chunks + 1)
            i = i + 1
    w.item_write = p.shared and p.hk == NULL
    if prepared(p, p.qn, p.rk):
        p.qprep = p.partials + <size_t>w.nsplit * p.chunks * p.G * (p.H + 2)
        split_queries(p, w.scratch)     # no thread's scratch is in use yet


cdef void tiled_item(const Params *p, const gqa_kernels *t, const Work *w, int u,
                     float *scratch) noexcept nogil:
    """Tiled item u (of units x nq), the last query blocks (most keys under a causal mask) of
    each unit first: unit by unit with p.keep (a thread's kept tiles serve a unit's blocks in
    turn), else the units interleaved."""
    cdef int unit = u // w.nq if p.keep else u % w.units
    cdef int qb = w.nq - 1 - (u % w.nq if p.keep else u // w.units)
    attend_tiled(p, t, unit // p.Nkv, unit % p.Nkv, qb, scratch)


cdef void tiled_start(const Params *p, float *scratch) noexcept nogil:
    """A thread's kept tiles (p.keep) start empty."""
    cdef Tiled sc
    if p.keep:
        tiled_layout(p, scratch, &sc)
        sc.kept[0] = -1
        sc.kept[1] = 0


cdef void run_items(const Params *p, const gqa_kernels *t, const Work *w) noexcept nogil:
    """The call's items on the calling thread.  Decode items (modes 0 / 2) read only cache
    rows that they write themselves or that no one writes (decode_item), so the cache is
    written first only when item_write is off; tiled units always."""
    cdef int u, units = w.units, Nkv = p.Nkv
    if w.mode == 1 or not w.item_write:
        for u in range(units):
            write_cache(p, t, u // Nkv, u % Nkv, w.scratch)
    if w.dt != NULL:
        w.dt.begin()
    if p.direct:
        for u in range(w.work_units):
            attend_direct(p, t, w.qk, (u % units) // Nkv, (u % units) % Nkv, u // units, w.scratch)
    elif w.mode == 1:
        tiled_start(p, w.scratch)
        for u in range(w.work_units):
            tiled_item(p, t, w, u, w.scratch)
    else:
        for u in range(w.work_units):
            decode_item(p, t, w.qk, u, w.item_write, w.scratch)
    if w.dt != NULL:
        w.dt.end()


cdef void run_team(const Params *p, const gqa_kernels *t, const Work *w) noexcept nogil:
    """run_items on a team of w.num_threads: the cache write (statically split, then a
    barrier), then the items: direct and tiled ones dynamically (the last query blocks, most
    keys under a causal mask, first), decode items from home ranges with stealing
    (work_ranges.h: a thread computes the same items on every call, so their cache slices
    are still in its own L2 from the call before, and a slower core hands its last items to
    a faster one)."""
    cdef int u, me = 0, it = 0, units = w.units, Nkv = p.Nkv
    cdef size_t sl = w.scratch_len
    cdef uint64_t taken = gqa_cpu_bit()
    with parallel(num_threads=w.num_threads):
        me = threadid()
        if me > 0:
            gqa_team_spread(&taken)     # not on the caller's CPU (team_spread.h)
        if w.mode == 1 or not w.item_write:
            for u in prange(units, schedule='static'):
                write_cache(p, t, u // Nkv, u % Nkv, w.scratch + threadid() * sl)
            gqa_team_barrier()      # the loop is `omp for nowait`: wait for every write
        if w.dt != NULL:
            w.dt.begin()
        if p.direct:
            for u in prange(w.work_units, schedule='dynamic'):
                attend_direct(p, t, w.qk, (u % units) // Nkv, (u % units) % Nkv, u // units,
                              w.scratch + threadid() * sl)
        elif w.mode == 1:
            tiled_start(p, w.scratch + me * sl)
            for u in prange(w.work_units, schedule='dynamic'):
                tiled_item(p, t, w, u, w.scratch + threadid() * sl)
        else:
            it = gqa_work_next(w.ranges, w.num_threads, me)
            while it >= 0:
                decode_item(p, t, w.qk, it, w.item_write, w.scratch + me * sl)
                it = gqa_work_next(w.ranges, w.num_threads, me)
        if w.dt != NULL:
            w.dt.end()


cdef void run_unrotate(const Params *p, const gqa_kernels *t, const Work *w) noexcept nogil:
    """The outputs back from V's rotated basis, o = o' R_V^T, on the call's threads."""
    cdef int u, nturn = p.B * p.Nkv * ((p.S + turn_positions(p) - 1) // turn_positions(p))
    cdef size_t sl = w.scratch_len
    if w.num_threads == 1:
        for u in range(nturn):
            unrotate(p, t, u, w.scratch)
    else:
        with parallel(num_threads=w.num_threads):
            for u in prange(nturn, schedule='static'):
                unrotate(p, t, u, w.scratch + threadid() * sl)
