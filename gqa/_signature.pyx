# cython: language_level=3
"""Every call of the GroupQueryAttention operator: the one statement of its input rules.

A call is checked in two parts, both before anything is written:
  * the signature checks (Signature.__init__): everything that depends only on the
    arguments' kinds, dtypes, shapes, strides, flags and identities -- and, for the arrays
    kept across calls, their addresses (caches, scales, rotary caches, head_sink, present
    buffers): shapes against the attributes, in-place aliasing among kept arrays, present
    buffers' layout;
  * the value checks (Signature.call): everything that can change between calls with the
    same signature -- total_sequence_length, seqlens_k, rotary positions, the attention_bias
    width, the per-step inputs' aliasing of the caches, finite scales, num_threads.
The operator keeps the Signatures of recent calls (one per past buffer), so a decoding loop
pays the value checks only; any difference in the signature (see _matches) builds a new one.
The compute (gqa/_attention.pyx) copies the lengths it addresses with and re-proves them.

Messages name the argument and what was expected (ValueError for values and shapes,
TypeError for kinds and dtypes), in ONNX Runtime's words where it has them.
"""
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, int32_t, uint32_t
from cpython.object cimport PyObject

import numpy as np

from gqa._attention cimport Consts, Params, run, check_lengths
from gqa cimport _window
from gqa._checks cimport (INT32_MAX, _array, _ready, _f32, _contiguous, _total_length, _threads,
                          _finite, _finite_scale, _orthogonal, _side_format, _rotary, _present,
                          apart)
from gqa._dispatch cimport (GQA_F32, GQA_F16, GQA_ROT_MAX, tile_rows, tile_steps, prompt_qk_kernel,
                            float_tile_types)
from gqa._plan cimport _plan, step_rows
from gqa import _config

cnp.import_array()

cdef enum:
    NARGS = 23          # query .. present_value, then the six of _EXT_NAMES (see op_call)
    MAXD = 4
    MAX_SIGNATURES = 64  # per operator: one per past buffer of a loop over layers

cdef int FLAGS = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED | cnp.NPY_ARRAY_WRITEABLE

cdef dict _SETTINGS = _config._settings   # updated in place by gqa.config
cdef object _ONES = np.ones(1, np.float32)   # the scales of a float cache (never read)
# the arrays that may not share memory with the caches in place, as the checks list them
cdef tuple _KEPT_NAMES = ("k_scale", "v_scale", "cos_cache", "sin_cache", "head_sink",
                          "q_norm_weight", "k_norm_weight", "oscar_rotation_k", "oscar_rotation_v")
# the inputs and buffers beyond onnxruntime 1.31.1's (onnxruntime main's names): float windows
# and rotations; passed around as one tuple, _NO_EXT when none is given
cdef tuple _EXT_NAMES = ("past_hp_key", "past_hp_value", "oscar_rotation_k", "oscar_rotation_v",
                         "present_hp_key", "present_hp_value")
cdef tuple _NO_EXT = (None, None, None, None, None, None)
# the caller's buffers a call may write (Signature._written_slots picks those it does)
cdef tuple _WRITTEN_NAMES = ("past_key", "past_value", "present_key", "present_value",
                             "past_hp_key", "past_hp_value", "present_hp_key", "present_hp_value")
cdef tuple _STEP_NAMES = ("query", "key", "value", "seqlens_k", "position_ids", "attention_bias",
                          "total_sequence_length")
# KVCache's rollback rows (Signature.call's ring): written by a call, apart from all it reads or writes
cdef tuple _RING_NAMES = ("undo_key", "undo_value")
cdef str _widths(long long D, long long k):
    """The widths next to D that k heads of a head size (a multiple of 8) make."""
    cdef long long lo = D // (8 * k) * 8 * k, hi = lo + 8 * k
    return (f", a multiple of {k} * 8 = {8 * k} (head_size is a multiple of 8): "
            + (f"{lo} (head_size {lo // k}) or " if lo else "") + f"{hi} (head_size {hi // k})")


cdef str _NORM_FINITE = ("QK-norm weights must be finite (k_norm_weight is multiplied into "
                         "the keys written into the cache)")
cdef long long _built = 0                 # Signatures built (tests: a repeat builds none)


def signatures_built():
    """How many call signatures have been checked and built in this process."""
    return _built


cdef struct Key:
    int present, type_num, ndim, flags
    size_t ident
    void *data
    Py_ssize_t shape[MAXD]
    Py_ssize_t strides[MAXD]


cdef inline bint _key(Key *k, object x):
    """Fill k from x (None or an ndarray); False if x is neither or has ndim > MAXD."""
    cdef cnp.ndarray a
    cdef int d
    k.present = x is not None
    if not k.present:
        return True
    if type(x) is not cnp.ndarray:
        return False
    a = <cnp.ndarray>x
    k.ndim = cnp.PyArray_NDIM(a)
    if k.ndim > MAXD:
        return False
    k.type_num = cnp.PyArray_TYPE(a)
    k.flags = cnp.PyArray_FLAGS(a) & FLAGS
    k.ident = <size_t><PyObject *>x
    k.data = cnp.PyArray_DATA(a)
    for d in range(k.ndim):
        k.shape[d] = cnp.PyArray_DIM(a, d)
        k.strides[d] = cnp.PyArray_STRIDE(a, d)
    return True


cdef inline bint _same(const Key *k, object x, bint kept, int ndims) noexcept:
    """x has the signature recorded in k (ndims: how many leading dimensions must match)."""
    cdef cnp.ndarray a
    cdef int d
    if x is None:
        return not k.present
    if not k.present or type(x) is not cnp.ndarray:
        return False
    a = <cnp.ndarray>x
    if cnp.PyArray_NDIM(a) != k.ndim or cnp.PyArray_TYPE(a) != k.type_num:
        return False
    for d in range(ndims if ndims < k.ndim else k.ndim):
        if cnp.PyArray_DIM(a, d) != k.shape[d]:
            return False
    if kept:
        if (<size_t><PyObject *>x != k.ident or cnp.PyArray_DATA(a) != k.data
                or (cnp.PyArray_FLAGS(a) & FLAGS) != k.flags):
            return False
        for d in range(k.ndim):
            if cnp.PyArray_STRIDE(a, d) != k.strides[d]:
                return False
    return True


cdef tuple _step_inputs(query, key, value, int N, int Nkv):
    """query, key and value of a step (or packed QKV: key = value = None): (ft, B, S, D, H, L,
    packed), ft the query's NumPy type, L the new K/V rows (0: shared KV)."""
    cdef int ft, B, S, D, H, L
    cdef bint packed
    _array(query, "query", cnp.NPY_FLOAT32, cnp.NPY_FLOAT16, 3)
    ft = cnp.PyArray_TYPE(<cnp.ndarray>query)
    B, S, D = query.shape
    if (key is None) != (value is None):
        raise ValueError("Input 'key' and 'value' shall be both present, or both absent in the "
                         "case of packed qkv.")
    packed = key is None
    if packed:
        if D % (N + 2 * Nkv):
            raise ValueError(f"query (packed QKV) last dimension {D} must be (num_heads + 2 * "
                             f"kv_num_heads) * head_size = {N + 2 * Nkv} * head_size"
                             + _widths(D, N + 2 * Nkv))
        H = D // (N + 2 * Nkv)
        L = S
    else:
        if D % N:
            raise ValueError(f"query last dimension {D} must be num_heads * head_size = "
                             f"{N} * head_size" + _widths(D, N))
        H = D // N
        for name, x in (("key", key), ("value", value)):
            _array(x, name, ft, -1, 3)
            if x.shape[0] != B:
                raise ValueError(f"Input 'query' and '{name}' shall have same dim 0 (batch size); "
                                 f"got {B} and {x.shape[0]}")
            if x.shape[2] != Nkv * H:
                raise ValueError(f"Input '{name}' last dimension must be kv_num_heads * head_size = "
                                 f"{Nkv} * {H} = {Nkv * H}, got {x.shape[2]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"Input 'key' and 'value' shall have same dim 1 (sequence length); "
                             f"got {key.shape[1]} and {value.shape[1]}")
        L = key.shape[1]
        if L != S and L != 0:
            raise ValueError(f"Input 'query' and 'key' shall have same dim 1 (sequence length) "
                             f"unless key has length 0 (shared KV); got {S} and {L}")
    if H % 8:
        raise ValueError(f"head_size must be a multiple of 8. Got head_size % 8 == {H % 8}")
    if H == 0:
        raise ValueError("head_size must be > 0 (query last dimension is 0)")
    return ft, B, S, D, H, L, packed


cdef tuple _cache_side(op, str side, scale, int ft, int Nkv, int H):
    """One side's cache element: (NumPy type, row width, gqa type, per channel, the row
    width's name) -- the operator's format, or the query's float type."""
    if op.quantized:
        return _side_format(op, side, scale, Nkv, H)
    if scale is not None:
        raise ValueError("k_scale / v_scale must not be given when k_quant_type is NONE")
    return ft, H, GQA_F32 if ft == cnp.NPY_FLOAT32 else GQA_F16, False, "head_size"


cdef tuple _past_present(op, past_key, past_value, present_key, present_value, int B, int Nkv,
                         int L, tuple k_side, tuple v_side):
    """The past and present buffers against each other and the cache formats: (has_past,
    Pbuf, shared (in place: present is past), windowed (sliding_window_cache=1))."""
    cdef int Pbuf = 0
    if (past_key is None) != (past_value is None):
        raise ValueError("Input 'past_key' and 'past_value' shall be both present or both absent.")
    has_past = past_key is not None
    if has_past:
        for name, x, (ct, Hp, _, _, hp_name) in (("past_key", past_key, k_side),
                                                 ("past_value", past_value, v_side)):
            _array(x, name, ct, -1, 4)
            want = (B, Nkv, x.shape[2], Hp)
            if x.shape != want:
                raise ValueError(f"Input '{name}' must have shape (batch_size, kv_num_heads, "
                                 f"past_sequence_length, {hp_name}) "
                                 f"= ({B}, {Nkv}, *, {Hp}), got {x.shape}")
        if past_key.shape[2] != past_value.shape[2]:
            raise ValueError(f"Input 'past_key' and 'past_value' shall have the same "
                             f"past_sequence_length (dimension 2); got {past_key.shape} and "
                             f"{past_value.shape}")
        Pbuf = past_key.shape[2]
    shared = (present_key is not None and present_key is past_key) or \
             (present_value is not None and present_value is past_value)
    if shared and not (present_key is past_key and present_value is past_value):
        raise ValueError("in-place mode needs present_key is past_key and present_value is past_value")
    if shared:
        for name, x in (("past_key", past_key), ("past_value", past_value)):
            if (cnp.PyArray_FLAGS(<cnp.ndarray>x) & FLAGS) != FLAGS:
                raise ValueError(f"{name} must be C-contiguous, aligned and writeable in "
                                 "in-place mode (present is past)")
    elif (present_key is None) != (present_value is None):
        raise ValueError("present_key and present_value must be given together")
    if L == 0 and not has_past:
        raise ValueError("key/value with sequence length 0 (shared KV) need past_key and past_value")
    windowed = op.sliding_window_cache == 1
    if windowed:
        if not has_past:
            raise ValueError("sliding_window_cache=1 needs past_key and past_value: their dimension 2 "
                             "is the cache capacity")
        if L == 0:
            raise ValueError("sliding_window_cache=1 does not take shared KV (key/value of sequence "
                             "length 0)")
        if Pbuf < op.local_window_size:
            raise ValueError(f"sliding_window_cache=1: the cache capacity past_key.shape[2] = {Pbuf} "
                             f"must be >= local_window_size = {op.local_window_size}")
        if present_key is not None and not shared:
            for name, x, Hp in (("present_key", present_key, k_side[1]),
                                ("present_value", present_value, v_side[1])):
                if x.shape[2] != Pbuf:
                    raise ValueError(f"{name} must have shape ({B}, {Nkv}, {Pbuf}, {Hp}) "
                                     f"(sliding_window_cache=1: the capacity of past_key), got "
                                     f"{x.shape}")
    return has_past, Pbuf, shared, windowed


cdef tuple _optional_inputs(attention_bias, head_sink, q_norm_weight, k_norm_weight, int ft,
                            int B, int S, int N, int H):
    """attention_bias, head_sink and the QK-norm weights: (bias broadcast over the batch,
    over the heads)."""
    cdef bint bias_bb = False, bias_nb = False
    if attention_bias is not None:
        _array(attention_bias, "attention_bias", ft, -1, 4)
        bb, bn, bs, _ = attention_bias.shape
        if bb not in (1, B) or bn not in (1, N) or bs != S:
            raise ValueError(f"attention_bias must have shape (batch_size or 1, num_heads or 1, "
                             f"sequence_length, total_sequence_length) = ({B} or 1, {N} or 1, {S}, "
                             f"T), got {attention_bias.shape}")
        bias_bb, bias_nb = bb == 1, bn == 1
    if head_sink is not None:
        _array(head_sink, "head_sink", ft, -1, 1)
        if head_sink.shape != (N,):
            raise ValueError(f"head_sink must have shape (num_heads,) = ({N},), got {head_sink.shape}")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight must be given together (the QK norm "
                         "applies to both) or not at all")
    for name, x in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if x is not None:
            _array(x, name, ft, -1, 1)
            if x.shape != (H,):
                raise ValueError(f"{name} must have shape (head_size,) = ({H},), got {x.shape}")
    return bias_bb, bias_nb


@cython.final
cdef inline bint code_tiles(int ktype, int level, int H) noexcept nogil:
    """_plan's code_tiles: a prompt's float32 tiles read K's codes (prompt_qk_kernel), or a
    float32 cache's quantized per tile (float_tile_types); with float windows those every row
    reads as codes (attend_tiled's codes_qk; int8-pt+s4r64, S = 2048, level 4 against level 0:
    1.08x on the float plan's tiles, 1.2-1.4x on these)."""
    cdef int kt = -1, vt = -1
    if ktype == GQA_F32:
        float_tile_types(level, H, &kt, &vt)
        return vt >= 0
    return prompt_qk_kernel(ktype, level, H) != NULL


cdef class Signature:
    """The checks of one input signature, and what they derived (see the module docstring)."""
    cdef Key keys[NARGS]
    cdef bint valid        # every argument was None or an ndarray of rank <= MAXD
    cdef Consts consts
    cdef int k_ct, v_ct, k_Hp, v_Hp, rot_half     # the caches' NumPy types and row widths
    cdef bint packed, f16, has_past, shared, quantized, k_group, v_group, fresh_present, copy_past, windowed
    cdef bint win, hp_inplace, hp_fresh
    cdef int level         # the operator's accuracy_level (0: gqa.config's, per call)
    cdef float rk_c, rv_c  # > 0: the rotations are the `+had` rotation c Sy P (_orthogonal)
    cdef tuple out_slots, out_names   # the caller's buffers a call writes (_written_slots)
    cdef object rho

    def __init__(self, op, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                 sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                 q_norm_weight, k_norm_weight, present_key, present_value, tuple ext,
                 Signature prev=None):
        global _built
        cdef list args = [query, key, value, past_key, past_value, seqlens_k, cos_cache,
                          sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                          q_norm_weight, k_norm_weight, present_key, present_value] + list(ext)
        cdef int i
        self._check(op, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                    sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                    q_norm_weight, k_norm_weight, present_key, present_value, ext, prev)
        self.valid = True
        for i in range(NARGS):
            if not _key(&self.keys[i], args[i]):
                self.valid = False
        _built += 1

    cdef _check(self, op, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                q_norm_weight, k_norm_weight, present_key, present_value, tuple ext,
                Signature prev):
        """Every check of a new signature, in the order of their messages: the step's inputs,
        the caches' formats, seqlens_k, past and present, the optional inputs, the kept
        inputs' values, the float windows, then the written buffers apart from the rest;
        then what the calls keep (_keep)."""
        cdef int N = op.num_heads, Nkv = op.kv_num_heads
        cdef int B, S, D, H, L, ft, rot_half
        cdef bint packed
        ft, B, S, D, H, L, packed = _step_inputs(query, key, value, N, Nkv)
        self.quantized = op.quantized
        k_side = _cache_side(op, "k", k_scale, ft, Nkv, H)
        v_side = _cache_side(op, "v", v_scale, ft, Nkv, H)
        _array(seqlens_k, "seqlens_k", cnp.NPY_INT32, -1, -1)
        if seqlens_k.shape != (B,):
            raise ValueError(f"seqlens_k must be shape (batch_size,) = ({B},), got {seqlens_k.shape}")
        has_past, Pbuf, shared, windowed = _past_present(op, past_key, past_value, present_key,
                                                         present_value, B, Nkv, L, k_side, v_side)
        rot_half = _rotary(op.do_rotary, cos_cache, sin_cache, position_ids, ft, B, S, H)
        bias_bb, bias_nb = _optional_inputs(attention_bias, head_sink, q_norm_weight,
                                            k_norm_weight, ft, B, S, N, H)
        self._kept_values(ext, cos_cache, sin_cache, rot_half, Nkv, H, prev)
        phk, phv, rot_k, rot_v, hpk, hpv = ext
        self._check_windows(op, B, Nkv, H, L, ft, phk, phv, hpk, hpv)
        cdef object k_dt = np.dtype(cnp.PyArray_DescrFromType(k_side[0]))
        cdef object v_dt = np.dtype(cnp.PyArray_DescrFromType(v_side[0]))
        self._written_apart(past_key, past_value, present_key, present_value, ext, has_past,
                            shared, B, Nkv, k_side[1], v_side[1], k_dt, v_dt,
                            (k_scale, v_scale, cos_cache, sin_cache, head_sink, q_norm_weight,
                             k_norm_weight, rot_k, rot_v))
        self._keep(op, B, S, D, H, L, Pbuf, ft, packed, has_past, shared, windowed, rot_half,
                   bias_bb, bias_nb, position_ids, past_key, past_value, k_side, v_side, k_dt,
                   v_dt)

    cdef int _kept_values(self, tuple ext, cos_cache, sin_cache, int rot_half, int Nkv, int H,
                          Signature prev) except -1:
        """The rotations' shapes, then the values of the large kept inputs multiplied into a
        cache (rotations orthogonal, rotary caches finite) when this operator first meets the
        array (prev: the signature this one replaces)."""
        rot_k, rot_v = ext[2], ext[3]
        for name, x in (("oscar_rotation_k", rot_k), ("oscar_rotation_v", rot_v)):
            if x is not None:
                _array(x, name, cnp.NPY_FLOAT32, cnp.NPY_FLOAT16, 3)
                if x.shape != (Nkv, H, H):
                    raise ValueError(f"{name} must have shape (kv_num_heads, head_size, head_size) = "
                                     f"({Nkv}, {H}, {H}), got {x.shape}")
                if H > GQA_ROT_MAX:
                    raise ValueError(f"{name}: rotations take head sizes up to {GQA_ROT_MAX}, got {H}")
        self.rk_c = self.rv_c = 0.0
        for i, name, x in ((19, "oscar_rotation_k", rot_k), (20, "oscar_rotation_v", rot_v)):
            if x is None:
                continue
            c = (prev.rk_c if i == 19 else prev.rv_c) if _seen(prev, i, x) else _orthogonal(x, name)
            if i == 19:
                self.rk_c = c
            else:
                self.rv_c = c
        if rot_half:
            for i, name, x in ((6, "cos_cache", cos_cache), (7, "sin_cache", sin_cache)):
                if not _seen(prev, i, x):
                    _finite(x, name, "rotary caches must be finite (rotary is applied to the "
                            "keys written into the cache)")
        return 0

    cdef int _written_apart(self, past_key, past_value, present_key, present_value, tuple ext,
                            bint has_past, bint shared, int B, int Nkv, int k_Hp, int v_Hp,
                            k_dt, v_dt, tuple kept) except -1:
        """Present buffers of a call that is not in place: their exact layout.  Then the
        caller's buffers a call writes, apart from every kept input and from each other (the
        per-step inputs: on every call, Signature.call)."""
        phk, phv = ext[0], ext[1]
        if present_key is not None and not shared:
            _present(present_key, "present_key", B, Nkv, k_Hp, k_dt)
            _present(present_value, "present_value", B, Nkv, v_Hp, v_dt)
        self.shared, self.fresh_present = shared, present_key is None    # _written_slots reads them
        self.out_slots = self._written_slots()
        self.out_names = tuple([_WRITTEN_NAMES[i] for i in self.out_slots])
        ins = kept + ((past_key, past_value) if has_past and not shared else ()) + (
            (phk, phv) if self.win and not self.hp_inplace else ())
        in_names = _KEPT_NAMES + (("past_key", "past_value") if has_past and not shared else ()) + (
            ("past_hp_key", "past_hp_value") if self.win and not self.hp_inplace else ())
        apart(self._written(past_key, past_value, present_key, present_value, ext),
              self.out_names, ins, in_names, self._where())
        return 0

    cdef int _keep(self, op, int B, int S, int D, int H, int L, int Pbuf, int ft, bint packed,
                   bint has_past, bint shared, bint windowed, int rot_half, bint bias_bb,
                   bint bias_nb, position_ids, past_key, past_value, tuple k_side,
                   tuple v_side, k_dt, v_dt) except -1:
        """What every call of this signature reads: the compute's constants and the flags of
        Signature.call."""
        cdef int N = op.num_heads, Nkv = op.kv_num_heads
        k_ct, k_Hp, ktype, k_pc, _ = k_side
        v_ct, v_Hp, vtype, v_pc, _ = v_side
        alpha = op.scale if op.scale != 0.0 else float(np.float32(1.0) / np.sqrt(np.float32(H)))
        self.consts = Consts(
            B=B, S=S, N=N, Nkv=Nkv, H=H, L=L, Pbuf=Pbuf, q_tok=D, kv_tok=D if packed else Nkv * H,
            has_past=has_past, shared=shared or windowed, packed=packed, ktype=ktype, vtype=vtype,
            k_rb=k_Hp * k_dt.itemsize, v_rb=v_Hp * v_dt.itemsize, k_pc=k_pc, v_pc=v_pc,
            alpha=alpha, softcap=op.softcap,
            W=op.local_window_size, causal=bool(op.causal), rot_half=rot_half,
            do_rotary=bool(op.do_rotary == 1 and rot_half), interleaved=op.rotary_interleaved == 1,
            pos_stride=(position_ids.shape[1] if position_ids is not None else S if windowed else 0),
            bias_bb=bias_bb, bias_nb=bias_nb, smooth=op.smooth_softmax == 1,
            qk_mode=op.qk_output, round_half=ft == cnp.NPY_FLOAT16, qk_eps=op.qk_norm_epsilon,
            sink=op.sink_size, recent=op.recent_size, hp_type=GQA_F32 if ft == cnp.NPY_FLOAT32 else GQA_F16,
            hp_causal=op.window_partition == "causal")
        self.k_ct, self.v_ct, self.k_Hp, self.v_Hp, self.rot_half = k_ct, v_ct, k_Hp, v_Hp, rot_half
        self.level = op.accuracy_level      # 0: gqa.config's accuracy_level, read per call
        self.k_group, self.v_group, self.rho = op.k_format.grouped, op.v_format.grouped, op._rho
        self.packed, self.f16, self.has_past = packed, ft == cnp.NPY_FLOAT16, has_past
        self.windowed = windowed
        self.copy_past = has_past and not shared and not (
            _ready(past_key, k_ct) and _ready(past_value, v_ct))
        return 0

    cdef int _check_windows(self, op, int B, int Nkv, int H, int L, int ft, phk, phv, hpk,
                            hpv) except -1:
        """The float windows' buffers (sink_size / recent_size): past windows [B, Nkv, *, H]
        of the query's dtype, present ones in place (present_hp_* is past_hp_*), the
        caller's or new; their row counts are checked on every call (_window_rows)."""
        cdef tuple names = ("past_hp_key", "past_hp_value", "present_hp_key", "present_hp_value")
        self.win = op.sink_size + op.recent_size > 0
        self.hp_inplace = self.hp_fresh = False
        if not self.win:
            for name, x in zip(names, (phk, phv, hpk, hpv)):
                if x is not None:
                    raise ValueError(f"{name} needs sink_size or recent_size > 0 (the float windows)")
            return 0
        if L == 0:
            raise ValueError("sink_size / recent_size do not take shared KV (key/value of sequence "
                             "length 0)")
        if (phk is None) != (phv is None):
            raise ValueError("Input 'past_hp_key' and 'past_hp_value' shall be both present or both absent.")
        if (hpk is None) != (hpv is None):
            raise ValueError("present_hp_key and present_hp_value must be given together")
        for name, x in zip(names, (phk, phv, hpk, hpv)):
            if x is not None:
                _array(x, name, ft, -1, 4)
                if x.shape[0] != B or x.shape[1] != Nkv or x.shape[3] != H:
                    raise ValueError(f"{name} must have shape (batch_size, kv_num_heads, rows, "
                                     f"head_size) = ({B}, {Nkv}, *, {H}), got {x.shape}")
        if phk is not None and phk.shape != phv.shape:
            raise ValueError(f"past_hp_key and past_hp_value shall have the same shape; got "
                             f"{phk.shape} and {phv.shape}")
        self.hp_inplace = hpk is not None and (hpk is phk or hpv is phv)
        if self.hp_inplace and not (hpk is phk and hpv is phv):
            raise ValueError("in-place windows need present_hp_key is past_hp_key and "
                             "present_hp_value is past_hp_value")
        self.hp_fresh = hpk is None
        if hpk is not None:
            if hpk.shape != hpv.shape:
                raise ValueError(f"present_hp_key and present_hp_value shall have the same shape; "
                                 f"got {hpk.shape} and {hpv.shape}")
            for name, x in (("present_hp_key", hpk), ("present_hp_value", hpv)):
                if (cnp.PyArray_FLAGS(<cnp.ndarray>x) & FLAGS) != FLAGS:
                    raise ValueError(f"{name} must be C-contiguous, aligned and writeable")
        return 0

    cdef tuple _written_slots(self):
        """Which of _WRITTEN_NAMES a call of this signature writes: its caches (in place: the
        past ones) and its float windows (in place: the past ones), when the caller's."""
        cdef tuple caches = (0, 1) if self.shared else () if self.fresh_present else (2, 3)
        if not self.win:
            return caches
        return caches + ((4, 5) if self.hp_inplace else () if self.hp_fresh else (6, 7))

    cdef tuple _written(self, past_key, past_value, present_key, present_value, tuple ext):
        """The buffers of _written_slots, in that order."""
        cdef tuple every = (past_key, past_value, present_key, present_value, ext[0], ext[1],
                            ext[4], ext[5])
        return tuple([every[i] for i in self.out_slots])

    cdef int _accuracy(self):
        """The call's accuracy level: the operator's, or gqa.config's where that is 0."""
        return self.level if self.level else _SETTINGS["accuracy_level"]

    cdef str _where(self):
        return " in in-place mode (present is past)" if self.shared else ""

    # which arguments are kept across calls (identity, address, strides, flags compared) and
    # which are per step (dtype and shape): stated here only
    cdef bint _matches(self, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                       sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                       q_norm_weight, k_norm_weight, present_key, present_value, tuple ext):
        cdef int i
        for i in range(6):      # the six of _EXT_NAMES, all kept
            if not _same(&self.keys[17 + i], ext[i], True, MAXD):
                return False
        return (self.valid
                and _same(&self.keys[0], query, False, MAXD) and _same(&self.keys[1], key, False, MAXD)
                and _same(&self.keys[2], value, False, MAXD)
                and _same(&self.keys[3], past_key, True, MAXD)
                and _same(&self.keys[4], past_value, True, MAXD)
                and _same(&self.keys[5], seqlens_k, False, MAXD)
                and _same(&self.keys[6], cos_cache, True, MAXD)
                and _same(&self.keys[7], sin_cache, True, MAXD)
                and _same(&self.keys[8], position_ids, False, MAXD)
                and _same(&self.keys[9], attention_bias, False, 3)
                and _same(&self.keys[10], head_sink, True, MAXD)
                and _same(&self.keys[11], k_scale, True, MAXD)
                and _same(&self.keys[12], v_scale, True, MAXD)
                and _same(&self.keys[13], q_norm_weight, True, MAXD)
                and _same(&self.keys[14], k_norm_weight, True, MAXD)
                and _same(&self.keys[15], present_key, True, MAXD)
                and _same(&self.keys[16], present_value, True, MAXD))

    cdef call(self, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
              cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
              q_norm_weight, k_norm_weight, present_key, present_value, num_threads, tuple ext,
              tuple ring=None):
        """The value checks, then the compute: the call's (output, present_key,
        present_value[, output_qk]).  ring: KVCache's rollback rows (K's, V's), with in-place
        float windows only, apart from each other and from every buffer the call reads or
        writes."""
        cdef const Params *p = &self.consts.p
        cdef int B = p.B, S = p.S, L = p.L, Pbuf = p.Pbuf, Nkv = p.Nkv, N = p.N, H = p.H
        cdef long long T = _total_length(total_sequence_length)
        cdef int Pres, Tmax, nt, q_block, kv_block, splits, ranges, level = self._accuracy()
        cdef bint direct
        cdef int64_t max_pos = 0
        cdef bint first_prompt
        cdef Params q
        cdef cnp.npy_intp dims[4]
        cdef tuple steps
        cdef Py_ssize_t i
        cdef object ks = _ONES, vs = _ONES
        if self.quantized:     # per side: the clip quantile of a group cache, else the scale
            ks = self.rho[0] if self.k_group else _finite_scale(k_scale, "k_scale")
            vs = self.rho[1] if self.v_group else _finite_scale(v_scale, "v_scale")
        if q_norm_weight is not None:     # H floats each: every call, as the scales
            q_norm_weight = _finite(q_norm_weight, "q_norm_weight", _NORM_FINITE)
            k_norm_weight = _finite(k_norm_weight, "k_norm_weight", _NORM_FINITE)
        cdef tuple written = self._written(past_key, past_value, present_key, present_value, ext)
        cdef tuple step_in = (query, key, value, seqlens_k, position_ids, attention_bias,
                              total_sequence_length)
        if self.out_names:
            apart(written, self.out_names, step_in, _STEP_NAMES, self._where())
        if S > T:
            raise ValueError(f"total_sequence_length ({T}) must be >= sequence_length ({S}, query "
                             "dimension 1): the new tokens are part of the total")
        if self.windowed:
            return self._windowed(query, key, value, past_key, past_value, seqlens_k, T, cos_cache,
                                  sin_cache, position_ids, attention_bias, head_sink, ks, vs,
                                  q_norm_weight, k_norm_weight, present_key, present_value,
                                  num_threads)
        if self.shared and T > Pbuf:
            raise ValueError(f"total_sequence_length ({T}) exceeds the shared buffer length "
                             f"past_key.shape[2] = {Pbuf} (in-place mode)")
        Pres = Pbuf if (self.shared or T <= Pbuf) else <int>T
        if L == 0 and T > Pbuf:
            raise ValueError(f"total_sequence_length ({T}) exceeds past buffer size ({Pbuf}) in "
                             "shared KV mode")
        first_prompt = S == T and L != 0
        if S > 1 and S != T and B != 1 and self.has_past:
            raise ValueError("batch_size must be 1 when sequence_length > 1 and past context is given.")
        if S != T and not self.has_past:
            raise ValueError(f"sequence_length ({S}) < total_sequence_length ({T}) needs past_key and "
                             "past_value (the earlier tokens' cache)")
        seqlens_k = _contiguous(seqlens_k)
        if self.rot_half:
            max_pos = cnp.PyArray_DIM(<cnp.ndarray>cos_cache, 0)
            if max_pos < T:
                raise ValueError(f"cos_cache dimension 0 shall not be less than total_sequence_length "
                                 f"({max_pos} < {T})")
            if position_ids is not None:
                position_ids = _contiguous(position_ids)
        q = p[0]
        q.T = <int>T; q.Pres = Pres; q.first_prompt = first_prompt
        q.seqlens = <const int *>cnp.PyArray_DATA(<cnp.ndarray>seqlens_k)
        q.pos_ids = (<const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>position_ids)
                     if self.rot_half and position_ids is not None else NULL)
        check_lengths(&q, max_pos)
        Tmax = q.Tmax
        self._bias_width(attention_bias, T)
        if not self.shared and not self.fresh_present:
            for name, x, Hp in (("present_key", present_key, self.k_Hp),
                                ("present_value", present_value, self.v_Hp)):
                if cnp.PyArray_DIM(<cnp.ndarray>x, 2) != Pres:
                    raise ValueError(f"{name} must have shape {(B, Nkv, Pres, Hp)}, got "
                                     f"{x.shape}")
        nt = _threads(num_threads)
        _plan(B, S, Nkv, p.G, H, Tmax, tile_rows(level, H), code_tiles(p.ktype, level, H),
              step_rows(p.ktype, p.vtype, level, H, B * Nkv, tile_steps(level, H)), &q_block, &kv_block,
              &splits, &ranges, &direct)
        phk, phv, rot_k, rot_v, hpk, hpv = ext
        hp_rows = 0
        if self.win:
            hp_rows = self._window_rows(seqlens_k, <int>T, first_prompt, phk, hpk)
        ring_k = ring_v = None
        if ring is not None:
            ring_k, ring_v = ring
            self._check_ring(ring_k, B, Nkv, H, 0)
            self._check_ring(ring_v, B, Nkv, H, cnp.PyArray_DIM(<cnp.ndarray>ring_k, 2))
            apart(ring, _RING_NAMES,
                  written + step_in + (k_scale, v_scale, cos_cache, sin_cache, head_sink, q_norm_weight,
                                       k_norm_weight, rot_k, rot_v),
                  self.out_names + _STEP_NAMES + _KEPT_NAMES, self._where())

        # every check passed: inputs as the compute reads them, outputs, the compute
        query, key, value = self._qkv(query, key, value)
        present_key, present_value = self._presents(past_key, past_value, present_key,
                                                    present_value, Pres)
        if self.copy_past:
            past_key, past_value = _contiguous(past_key), _contiguous(past_value)
        dims[0] = B; dims[1] = S; dims[2] = N * H
        out = cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT32, 0)
        qk_out = None
        if p.qk_mode:
            dims[0] = B; dims[1] = N; dims[2] = S; dims[3] = T
            qk_out = cnp.PyArray_EMPTY(4, dims, cnp.NPY_FLOAT32, 0)
        if self.win:
            if self.hp_fresh:
                dims[0] = B; dims[1] = Nkv; dims[2] = hp_rows; dims[3] = H
                hpk = cnp.PyArray_ZEROS(4, dims, cnp.NPY_FLOAT32 if not self.f16 else cnp.NPY_FLOAT16, 0)
                hpv = cnp.PyArray_ZEROS(4, dims, cnp.NPY_FLOAT32 if not self.f16 else cnp.NPY_FLOAT16, 0)
            elif phk is None:
                hpk[...] = 0
                hpv[...] = 0
            if not self.hp_inplace and phk is not None:
                phk, phv = _contiguous(phk), _contiguous(phv)
            else:
                phk = phv = None
        run(self.consts, query, key, value, seqlens_k, present_key, present_value,
            past_key if self.has_past and not self.shared else None,
            past_value if self.has_past and not self.shared else None,
            ks, vs,
            _f32(cos_cache) if self.rot_half else None, _f32(sin_cache) if self.rot_half else None,
            position_ids if self.rot_half else None, _f32(attention_bias), _f32(head_sink),
            _f32(q_norm_weight), _f32(k_norm_weight), out, qk_out, <int>T, Pres, first_prompt, nt, _SETTINGS["flash"],
            q_block, kv_block, splits, ranges, direct=direct, col_base=None, bias_T=0, rk=_f32(rot_k),
            rv=_f32(rot_v), rk_c=self.rk_c, rv_c=self.rv_c,
            hk=hpk if self.win else None, hv=hpv if self.win else None, phk=phk, phv=phv,
            accuracy=level, ring_k=ring_k, ring_v=ring_v)
        if self.f16:
            out = out.astype(np.float16)
            qk_out = qk_out.astype(np.float16) if qk_out is not None else None
        res = (out, present_key, present_value) + ((qk_out,) if qk_out is not None else ())
        if self.win:
            return res + (hpk, hpv)
        return res

    cdef int _check_ring(self, x, int B, int Nkv, int H, Py_ssize_t m) except -1:
        """Rollback rows (KVCache's): [B, Nkv, m >= 1, H] of the windows' dtype (m as given,
        unless 0), C-contiguous and writable, beside in-place windows."""
        if not (self.win and self.hp_inplace):
            raise RuntimeError("gqa: rollback rows need the float windows in place")
        if (not isinstance(x, cnp.ndarray) or cnp.PyArray_NDIM(<cnp.ndarray>x) != 4
                or cnp.PyArray_DIM(<cnp.ndarray>x, 0) != B or cnp.PyArray_DIM(<cnp.ndarray>x, 1) != Nkv
                or cnp.PyArray_DIM(<cnp.ndarray>x, 2) < 1 or cnp.PyArray_DIM(<cnp.ndarray>x, 3) != H
                or (m and cnp.PyArray_DIM(<cnp.ndarray>x, 2) != m)
                or cnp.PyArray_TYPE(<cnp.ndarray>x) != <int>(cnp.NPY_FLOAT16 if self.f16 else cnp.NPY_FLOAT32)
                or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x)
                or not cnp.PyArray_ISWRITEABLE(<cnp.ndarray>x)):
            raise RuntimeError(f"gqa: rollback rows must be writable C-contiguous [{B}, {Nkv}, m, "
                               f"{H}] of the windows' dtype")
        return 0

    cdef int _window_rows(self, seqlens_k, int T, bint first_prompt, phk, hpk) except -1:
        """The value checks of the float windows; returns the rows of new present windows,
        min(T, sink_size + recent_size) (onnxruntime main's present_hp shape)."""
        cdef const Params *p = &self.consts.p
        cdef const int *sl = <const int *>cnp.PyArray_DATA(<cnp.ndarray>seqlens_k)
        cdef int b, Tb, Told, cap = p.nsink + p.nrecent, need_past, need
        cdef int past_rows = cnp.PyArray_DIM(<cnp.ndarray>phk, 2) if phk is not None else 0
        cdef int rows = T if T < cap else cap
        for b in range(p.B):
            Tb = sl[b] + 1
            Told = 0 if (first_prompt or not self.has_past) else Tb - p.S
            need_past = Told if Told < cap else cap
            need = Tb if Tb < cap else cap
            if need_past > past_rows:
                if phk is None:
                    raise ValueError(f"past_hp_key and past_hp_value are required: batch entry {b} "
                                     f"has {Told} past positions, whose first sink_size and last "
                                     "recent_size are kept in the float windows")
                raise ValueError(f"past_hp_key has {past_rows} rows; batch entry {b} with {Told} "
                                 f"past positions needs min(past length, sink_size + recent_size) "
                                 f"= {need_past}")
            if not self.hp_fresh and need > cnp.PyArray_DIM(<cnp.ndarray>hpk, 2):
                raise ValueError(f"present_hp_key has {hpk.shape[2]} rows; batch entry {b} with "
                                 f"{Tb} positions needs min(total length, sink_size + recent_size) "
                                 f"= {need}")
        return rows


    cdef int _bias_width(self, attention_bias, long long T) except -1:
        """attention_bias is indexed by absolute key position: its last dimension is T."""
        cdef const Params *p = &self.consts.p
        if attention_bias is not None and cnp.PyArray_DIM(<cnp.ndarray>attention_bias, 3) != T:
            raise ValueError(f"attention_bias must have shape (batch_size or 1, num_heads or 1, "
                             f"sequence_length, total_sequence_length) = ({p.B} or 1, {p.N} or 1, "
                             f"{p.S}, {T}), got {attention_bias.shape}")
        return 0

    cdef tuple _new_caches(self, int rows):
        """New K and V caches [B, Nkv, rows, Hp] of their dtypes (contents unset)."""
        cdef const Params *p = &self.consts.p
        cdef cnp.npy_intp dims[4]
        dims[0] = p.B; dims[1] = p.Nkv; dims[2] = rows; dims[3] = self.k_Hp
        k = cnp.PyArray_EMPTY(4, dims, self.k_ct, 0)
        dims[3] = self.v_Hp
        return k, cnp.PyArray_EMPTY(4, dims, self.v_ct, 0)

    cdef tuple _presents(self, past_key, past_value, present_key, present_value, int rows):
        """The present buffers of a call: the past ones in place, the caller's, or new ones
        of `rows` rows."""
        if self.shared:
            return past_key, past_value
        if self.fresh_present:
            return self._new_caches(rows)
        return present_key, present_value

    cdef tuple _qkv(self, query, key, value):
        """float32 query, key and value as the compute reads them (packed: key and value None,
        the compute reads the query's columns)."""
        if self.packed:
            return _f32(query), None, None
        return _f32(query), _f32(key), _f32(value)

    cdef _windowed(self, query, key, value, past_key, past_value, seqlens_k, long long T,
                   cos_cache, sin_cache, position_ids, attention_bias, head_sink, ks, vs,
                   q_norm_weight, k_norm_weight, present_key, present_value, num_threads):
        """A call with sliding_window_cache=1 (gqa/_window.pyx): the value checks on absolute
        lengths, then the kept rows placed at the front of the work buffer, the compute in
        place on it with cache-relative lengths, and a staged step's rows copied out."""
        cdef const Params *p = &self.consts.p
        cdef int B = p.B, S = p.S, Nkv = p.Nkv, C = p.Pbuf, b, rows, Trel = 0, nt
        cdef int q_block, kv_block, splits, ranges, level = self._accuracy()
        cdef bint direct
        cdef int64_t max_pos = 0
        cdef Params q
        cdef cnp.npy_intp dims[4]
        cdef bint staged
        cdef int[:, ::1] l
        cdef int[::1] z, s0
        if S > 1 and B != 1 and S != T:
            raise ValueError("batch_size must be 1 when sequence_length > 1 and past context is given.")
        seqlens_k = _contiguous(seqlens_k)
        _window.check_window_lengths(<const int *>cnp.PyArray_DATA(<cnp.ndarray>seqlens_k), B, S, T)
        if self.rot_half:
            max_pos = cnp.PyArray_DIM(<cnp.ndarray>cos_cache, 0)
            if max_pos < T:
                raise ValueError(f"cos_cache dimension 0 shall not be less than total_sequence_length "
                                 f"({max_pos} < {T})")
        self._bias_width(attention_bias, T)
        nt = _threads(num_threads)
        # the layout of the step (one int32 [5, B] block: keep, src0, base, lnew, relative seqlens)
        lay = np.empty((5, B), np.int32)
        l = lay
        staged = B > 0 and _window.plan(<const int *>cnp.PyArray_DATA(<cnp.ndarray>seqlens_k), B, S,
                                        C, p.W, &l[0, 0], &l[1, 0], &l[2, 0], &l[3, 0])
        for b in range(B):
            l[4, b] = l[0, b] + S - 1
            if l[0, b] + S > Trel:
                Trel = l[0, b] + S
        # rotary positions are absolute: the given position_ids, else T_b - S + s
        if self.rot_half:
            if position_ids is not None:
                position_ids = _contiguous(position_ids)
            else:
                position_ids = (np.asarray(seqlens_k, np.int64)[:, None] + (1 - S)
                                + np.arange(S, dtype=np.int64)[None, :])
        q = p[0]
        rows = Trel if staged else C       # the work buffer: staging, or the present buffer
        q.T = Trel; q.Pres = rows; q.first_prompt = False
        q.seqlens = &l[4, 0] if B else NULL
        q.pos_ids = (<const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>position_ids)
                     if self.rot_half else NULL)
        check_lengths(&q, max_pos)      # positions; the relative lengths hold by construction
        # every check passed: buffers and the compute
        query, key, value = self._qkv(query, key, value)
        present_key, present_value = self._presents(past_key, past_value, present_key,
                                                    present_value, C)
        past_key, past_value = _contiguous(past_key), _contiguous(past_value)
        consts = self.consts
        work_k, work_v = present_key, present_value
        if staged:
            work_k, work_v = self._new_caches(rows)
            consts = self.consts.with_rows(rows)
        zeros = np.zeros(B, np.int32)
        z = zeros
        if B:
            _window.move_rows(work_k, &z[0], past_key, &l[1, 0], &l[0, 0], B, Nkv)
            _window.move_rows(work_v, &z[0], past_value, &l[1, 0], &l[0, 0], B, Nkv)
        _plan(B, S, Nkv, p.G, p.H, Trel, tile_rows(level, p.H), code_tiles(p.ktype, level, p.H),
              step_rows(p.ktype, p.vtype, level, p.H, B * Nkv, tile_steps(level, p.H)), &q_block, &kv_block,
              &splits,
              &ranges, &direct)
        dims[0] = B; dims[1] = S; dims[2] = p.N * p.H
        out = cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT32, 0)
        run(consts, query, key, value, lay[4], work_k, work_v, None, None, ks, vs,
            _f32(cos_cache) if self.rot_half else None, _f32(sin_cache) if self.rot_half else None,
            position_ids if self.rot_half else None, _f32(attention_bias), _f32(head_sink),
            _f32(q_norm_weight), _f32(k_norm_weight), out, None, Trel, cnp.PyArray_DIM(<cnp.ndarray>work_k, 2),
            False, nt, _SETTINGS["flash"], q_block, kv_block, splits, ranges, direct=direct,
            col_base=lay[2], bias_T=<int>T, rk=None, rv=None, hk=None, hv=None, phk=None, phv=None,
            accuracy=level)
        if staged and B:
            # the last L(T_b) rows of the staging buffer: rows [keep + S - L(T_b), keep + S)
            s0 = lay[0] + S - lay[3]
            _window.move_rows(present_key, &z[0], work_k, &s0[0], &l[3, 0], B, Nkv)
            _window.move_rows(present_value, &z[0], work_v, &s0[0], &l[3, 0], B, Nkv)
        if self.f16:
            out = out.astype(np.float16)
        return out, present_key, present_value


cdef inline bint _seen(Signature prev, int i, object x):
    """Argument i was x (same array, address, shape, strides) in signature prev too, whose
    checks therefore covered its values."""
    return prev is not None and prev.valid and _same(&prev.keys[i], x, True, MAXD)



# -- the operator's call ------------------------------------------------------------------

cdef inline size_t _slot(object past_key, object query):
    """The key of a call's Signature among an operator's recent ones: its past buffer (each
    layer of a loop has its own), else its query."""
    return <size_t><PyObject *>(past_key if past_key is not None else query)


def op_call(self, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
            total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
            attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
            k_norm_weight=None, past_hp_key=None, past_hp_value=None, oscar_rotation_k=None,
            oscar_rotation_v=None, *, present_key=None, present_value=None, present_hp_key=None,
            present_hp_value=None, num_threads=None):
    """GroupQueryAttention.__call__ (gqa/_operator.py)."""
    return call_op(self, query, key, value, past_key, past_value, seqlens_k,
                    total_sequence_length, cos_cache, sin_cache, position_ids, attention_bias,
                    head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, past_hp_key,
                    past_hp_value, oscar_rotation_k, oscar_rotation_v, present_key, present_value,
                    present_hp_key, present_hp_value, num_threads)


cdef object kept_call(op, query, key, value, past_key, past_value, seqlens_k,
                      total_sequence_length, cos_cache, sin_cache, k_scale, v_scale, hp_key,
                      hp_value, rotation_k, rotation_v, num_threads, tuple ring=None):
    """The call of a KVCache layer (gqa/_steps.pyx): in place (present is past, the float
    windows' present are their past), without position_ids, attention_bias, head_sink and QK
    norm, with its rollback rows (ring: K's, V's, or None); the same checks and compute as
    op_call."""
    return call_op(op, query, key, value, past_key, past_value, seqlens_k,
                    total_sequence_length, cos_cache, sin_cache, None, None, None, k_scale,
                    v_scale, None, None, hp_key, hp_value, rotation_k, rotation_v, past_key,
                    past_value, hp_key, hp_value, num_threads, ring)


cdef object call_op(self, query, key, value, past_key, past_value, seqlens_k,
                     total_sequence_length, cos_cache, sin_cache, position_ids, attention_bias,
                     head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, past_hp_key,
                     past_hp_value, oscar_rotation_k, oscar_rotation_v, present_key,
                     present_value, present_hp_key, present_hp_value, num_threads,
                     tuple ring=None):
    """op_call by position: the operator's kept signature for these arguments (checked when
    new), then its call."""
    cdef dict sigs = self._signatures
    cdef size_t slot = _slot(past_key, query)
    cdef object found = sigs.get(slot)
    cdef Signature sig
    cdef tuple ext = _NO_EXT
    if (past_hp_key is not None or past_hp_value is not None or oscar_rotation_k is not None
            or oscar_rotation_v is not None or present_hp_key is not None
            or present_hp_value is not None):
        ext = (past_hp_key, past_hp_value, oscar_rotation_k, oscar_rotation_v, present_hp_key,
               present_hp_value)
    if found is None or not (<Signature>found)._matches(
            query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
            position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight,
            k_norm_weight, present_key, present_value, ext):
        sig = Signature(self, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                        sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                        q_norm_weight, k_norm_weight, present_key, present_value, ext, found)
        if len(sigs) >= MAX_SIGNATURES:
            sigs.clear()
        sigs[slot] = sig        # one store: threads may share the operator
    else:
        sig = <Signature>found
    return sig.call(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                    cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale,
                    v_scale, q_norm_weight, k_norm_weight, present_key, present_value, num_threads,
                    ext, ring)
