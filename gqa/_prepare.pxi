# Included by gqa/_attention.pyx (one translation unit: these inline into the compute).
# The query and key rows as the compute uses them: positions, rotary, the QK RMS norm and the
# rotations, in float32 (rows of H elements; rotations [Nkv, H, H], x -> x R).

cdef inline void *ptr(object a):
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline int past_len(const Params *p, int b) noexcept nogil:
    """Rows of past K/V kept for batch b: the write offset of the new rows."""
    cdef int Tb = p.seqlens[b] + 1
    if p.L == 0:
        return Tb
    if not p.has_past or p.first_prompt:
        return 0
    return Tb - p.S


cdef inline int causal_past(const Params *p, int b) noexcept nogil:
    """Absolute position of query row 0 of batch b."""
    if not p.has_past or p.first_prompt:
        return 0
    return p.seqlens[b] + 1 - p.S


cdef inline int64_t position(const Params *p, int b, int s) noexcept nogil:
    """Rotary position of token s of batch b (ONNX Runtime's rules: a first prompt
    uses position_ids[0, 0] + s, other calls position_ids[b, s] or past + s); in
    int64, as given, so that length_error sees a position no int can hold."""
    if p.first_prompt:
        return p.pos_ids[0] + s if p.pos_ids != NULL else s
    if p.pos_ids != NULL:
        return p.pos_ids[<size_t>b * p.pos_stride + s]
    return causal_past(p, b) + s


cdef void rope(const Params *p, const float *x, float *o, int pos) noexcept nogil:
    """Rotary embedding of one head row (the active path's rope_row: onnxruntime's x86
    rounding, the same bits on every path); channels >= 2*rot_half are copied (o may be x)."""
    cdef int R2 = p.rot_half
    active_table().rope_row(R2, p.interleaved, x, p.cos + <size_t>pos * R2, p.sin + <size_t>pos * R2, o)
    if 2 * R2 < p.H and o != x:
        memcpy(o + 2 * R2, x + 2 * R2, (p.H - 2 * R2) * sizeof(float))
    if p.round_half:
        round_to_half(o, p.H)


cdef void rms_norm(const Params *p, const float *x, float *o, const float *w) noexcept nogil:
    """The per-head RMS norm of the QK-norm inputs: o[i] = (x[i] * r) * w[i] in float32 with
    r = 1 / sqrt(mean(x^2) + eps), the mean of squares summed in double in channel order
    (the same bits on every path and thread count); float16 calls round o to half."""
    cdef int i, H = p.H
    cdef double ss = 0.0
    cdef float r
    for i in range(H):
        ss = ss + <double>x[i] * x[i]
    r = <float>(1.0 / sqrt(ss / H + p.qk_eps))
    for i in range(H):
        o[i] = (x[i] * r) * w[i]
    if p.round_half:
        round_to_half(o, H)


cdef inline bint prepared(const Params *p, const float *w, const float *R) noexcept nogil:
    """Rows weighted by w (p.qn or p.kn) or turned by R are changed before attention reads them."""
    return p.do_rotary or w != NULL or R != NULL


cdef inline const float *rotation(const float *R, const Params *p, int j) noexcept nogil:
    """The rotation [H, H] of KV head j (R: p.rk or p.rv), or NULL."""
    return R + <size_t>j * p.H * p.H if R != NULL else NULL


cdef void turn_rows(const Params *p, const float *x, size_t ldx, float *o, const float *R,
                    float c, int n) noexcept nogil:
    """o [n, H] = x R for n head rows x (ldx floats apart; R [H, H] row-major: o[e] = sum_d
    x[d] R[d, e]): where c > 0 (R is the `+had` rotation c Sy P: p.rk_c / p.rv_c) by
    gqa_hadamard_rows, the same bits on every path, else by the active path's float32 SV
    kernel, whose sums run over d in order for any number of rows; either way a row's bits do
    not depend on n.  Rounded to half on float16 calls; o must not overlap x."""
    cdef int r
    if c > 0:
        active_table().hadamard_rows(n, p.H, x, ldx, o, p.H, c, 0)
    else:
        active_table().sv_gemm(n, p.H, p.H, x, ldx, R, GQA_F32, NULL, o, p.H, 0.0)
    if p.round_half:
        for r in range(n):
            round_to_half(o + <size_t>r * p.H, p.H)


cdef void prep_heads(const Params *p, const float *x, float *o, float *tmp, int pos,
                     const float *R) noexcept nogil:
    """o [G, H] = the G query rows x [G, H] of one position as attention reads them: prep_plain
    with p.qn, then o = x R where R != NULL (the OSCAR rotation of post-rotary Q), turning the
    G rows at once (through tmp [G, H] where a norm or rotary comes first; neither x nor tmp
    may overlap o)."""
    cdef int g
    cdef size_t H = p.H
    if R == NULL:
        for g in range(p.G):
            prep_plain(p, x + g * H, o + g * H, p.qn, pos)
        return
    if p.qn != NULL or p.do_rotary:
        for g in range(p.G):
            prep_plain(p, x + g * H, tmp + g * H, p.qn, pos)
        x = tmp
    turn_rows(p, x, H, o, R, p.rk_c, p.G)


cdef void prep_plain(const Params *p, const float *x, float *o, const float *w, int pos) noexcept nogil:
    """o = head row x as attention reads it before a rotation (turn_rows): RMS-normed with
    weight w (when w != NULL), then rotated at position pos (when p.do_rotary), in that order;
    a copy when neither applies."""
    if w != NULL:
        rms_norm(p, x, o, w)
        if p.do_rotary:
            rope(p, o, o, pos)
    elif p.do_rotary:
        rope(p, x, o, pos)
    else:
        memcpy(o, x, p.H * sizeof(float))
