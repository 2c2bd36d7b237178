# cython: language_level=3
"""The repeated call of a decoding loop, without Python-level work.

GroupQueryAttention (gqa/_operator.py) validates a call in full once per input signature and
keeps a Step for it.  Step.call proves, in C, that a later call has that signature and passes
every value-dependent rule of the full path (total length, seqlens_k, rotary positions,
attention_bias width, in-place aliasing), then runs the compute.  Whenever anything differs or
would fail it returns None and the operator takes the full path, which raises the error with
its message: this module never decides an error, it only proves the short path safe.

The signature: for every array kept across calls (caches, scales, rotary caches, head_sink,
present buffers) its identity, data pointer, dtype, shape, strides and flags; for every
per-step array (query, key, value, seqlens_k, position_ids, attention_bias) its dtype and
shape (attention_bias: all but the last dimension), and None-ness of every argument.
"""
cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, int32_t
from cpython.object cimport PyObject

import numpy as np

from gqa._attention cimport Consts, Params, run, first_alias, length_error
from gqa._dispatch cimport omp_max_threads
from gqa import _config, _dispatch

cnp.import_array()

cdef enum:
    NARGS = 15          # query .. present_value, in __call__'s order (total_sequence_length apart)
    MAXD = 4
    INT32_MAX = 2147483647

cdef struct Key:
    int present, type_num, ndim, flags
    size_t ident
    void *data
    Py_ssize_t shape[MAXD]
    Py_ssize_t strides[MAXD]

cdef int FLAGS = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED | cnp.NPY_ARRAY_WRITEABLE

cdef dict _SETTINGS = _config._settings   # updated in place by gqa.config
cdef size_t _L2 = _dispatch.l2_cache_bytes() or 512 * 1024   # unknown: assume a small (Zen 3) L2
cdef int _CPUS = _config.PLAN_CPUS       # CPUs this process may run on (affinity mask)
cdef int _UNITS = max(8, _CPUS)


cdef void _plan(int B, int S, int Nkv, int G, int H, int Tmax, int *q_block, int *kv_block,
                int *splits, int *ranges):
    """Tile sizes of the flash path and the split of decode work (see _attention.run: the
    (batch, KV head) units form `ranges` contiguous ranges and the last unit of each range is
    cut into `splits` key chunks).  They depend on the shapes, the L2 size and the CPU count
    only -- never on the thread count -- so results do not either.
    K and V tiles (2 x kv_rows x H float32) take about 1/8 of L2; a query tile holds
    ~128 rows (query rows x G heads) so each dequantized K/V element is reused 128 times."""
    cdef int units = B * Nkv
    blocks = _SETTINGS["flash_blocks"]
    if blocks is not None:
        q_block[0], kv_block[0] = blocks
    else:
        kv_block[0] = max(16, min(256, <int>(_L2 // (64 * H))))
        q_block[0] = max(4, 128 // G)
    sp = _SETTINGS["decode_splits"]
    splits[0] = 1
    ranges[0] = units
    if sp is not None:
        splits[0] = sp
    elif S == 1 and 0 < units < _UNITS:
        # fewer units than max(8, CPUs) leave cores idle or unevenly loaded: split every
        # unit's keys so there are that many pieces, in chunks of >= 256 keys (no units, an
        # empty batch: nothing to split)
        splits[0] = max(1, min(-(-_UNITS // units), Tmax // 256))
    elif S == 1 and units >= 2 * _CPUS:
        # one range per CPU, and each range's last unit in up to 4 chunks of >= 512 keys:
        # whole units keep their cache rows in one core's L2 from call to call, and the
        # chunks let the cores finish together when one runs slower (shared machines)
        splits[0] = max(1, min(4, Tmax // 512))
        ranges[0] = _CPUS


def flash_plan(int B, int S, int Nkv, int G, int H, int Tmax):
    """(q_block, kv_block, splits, ranges) of a call: see _plan."""
    cdef int q_block, kv_block, splits, ranges
    _plan(B, S, Nkv, G, H, Tmax, &q_block, &kv_block, &splits, &ranges)
    return q_block, kv_block, splits, ranges


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


cdef inline bint _in_place_ready(object x, int type_num) noexcept:
    """A per-step array the compute can read as it is: that dtype, C-contiguous, aligned."""
    if x is None:
        return True
    cdef cnp.ndarray a = <cnp.ndarray>x
    return (cnp.PyArray_TYPE(a) == type_num and
            (cnp.PyArray_FLAGS(a) & (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED)) ==
            (cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED))


@cython.final
cdef class Step:
    """The short path of one input signature (see the module docstring)."""
    cdef Key keys[NARGS]
    cdef bint valid        # every argument was None or an ndarray: the signature exists
    cdef bint short        # the short path applies to this signature at all
    cdef readonly object st  # what the full path derived from the signature (_operator._Static)
    cdef Consts consts
    cdef object ks, vs     # st.ks, st.vs: the scales as the full path prepared them
    cdef int cache_type, Hp, qk_mode, packed   # the rest of the shapes: consts.p

    def __init__(self, st, int qk_mode, query, key, value, past_key, past_value, seqlens_k,
                 cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                 present_key, present_value):
        cdef list args = [query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                          position_ids, attention_bias, head_sink, k_scale, v_scale, present_key,
                          present_value]
        cdef int i
        self.valid = True
        for i in range(NARGS):
            if not _key(&self.keys[i], args[i]):
                self.valid = False
        # The scales are read through st.ks / st.vs: a view keeps the caller's array alive
        # (so no other array can take its identity and address), but a copy (a strided
        # scale) would go stale if the caller rewrote or replaced the array: no reuse then.
        for given, used in ((k_scale, st.ks), (v_scale, st.vs)):
            if given is not None and not np.shares_memory(given, used):
                self.valid = False
        self.st = st
        self.consts = st.consts
        self.ks, self.vs = st.ks, st.vs
        self.cache_type = np.dtype(st.cache_dt).num
        self.Hp, self.packed = st.Hp, st.packed
        self.qk_mode = qk_mode
        # The short path: float32 inputs; kept arrays the compute reads in place as they are
        # (rotary caches, head_sink, a past buffer it copies from); present buffers either
        # the past (in place) or allocated per call.
        self.short = self.valid and st.dt == np.float32 and (st.shared or present_key is None)
        for x in (cos_cache, sin_cache, head_sink) + (
                (past_key, past_value) if st.has_past and not st.shared else ()):
            if x is not None and not _in_place_ready(x, cnp.PyArray_TYPE(<cnp.ndarray>x)):
                self.short = False
        # in place: call() checks only the per-step inputs against the past buffers, since
        # the kept ones cannot move; a kept one that overlaps them (an error of the full
        # path, which made this Step before checking) keeps every repeat on the full path
        if self.short and st.shared and first_alias(past_key, past_value, (
                k_scale, v_scale, cos_cache, sin_cache, head_sink)) >= 0:
            self.short = False

    def matches(self, query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                position_ids, attention_bias, head_sink, k_scale, v_scale, present_key,
                present_value):
        """The call has this signature (the full path may reuse its static checks)."""
        return self.valid and self._matches(
            query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
            attention_bias, head_sink, k_scale, v_scale, present_key, present_value)

    # which arguments are kept across calls (identity, address, strides, flags compared) and
    # which are per step (dtype and shape): stated here only
    cdef bint _matches(self, query, key, value, past_key, past_value, seqlens_k, cos_cache,
                       sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
                       present_key, present_value):
        return (_same(&self.keys[0], query, False, MAXD) and _same(&self.keys[1], key, False, MAXD)
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
                and _same(&self.keys[13], present_key, True, MAXD)
                and _same(&self.keys[14], present_value, True, MAXD))

    cpdef call(self, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
               cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale,
               present_key, present_value, num_threads):
        """The call's result, or None: take the full path."""
        cdef long long T
        cdef int Pres, Tmax, nt, q_block, kv_block, splits, ranges
        cdef int64_t max_pos
        cdef int where[2]
        cdef Params q
        cdef bint first_prompt
        cdef const Params *p = &self.consts.p
        cdef int B = p.B, S = p.S, L = p.L, Pbuf = p.Pbuf
        cdef cnp.npy_intp dims[4]
        if not self.short or not self._matches(
                query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                position_ids, attention_bias, head_sink, k_scale, v_scale, present_key,
                present_value):
            return None
        if not (_in_place_ready(query, cnp.NPY_FLOAT32) and _in_place_ready(key, cnp.NPY_FLOAT32)
                and _in_place_ready(value, cnp.NPY_FLOAT32)
                and _in_place_ready(seqlens_k, cnp.NPY_INT32)
                and _in_place_ready(position_ids, cnp.NPY_INT64)
                and _in_place_ready(attention_bias, cnp.NPY_FLOAT32)):
            return None
        # total_sequence_length: a Python int or a one-element int32 array
        if type(total_sequence_length) is int:
            if not 1 <= total_sequence_length <= INT32_MAX:
                return None
            T = total_sequence_length
        elif (type(total_sequence_length) is cnp.ndarray
              and cnp.PyArray_TYPE(<cnp.ndarray>total_sequence_length) == cnp.NPY_INT32
              and cnp.PyArray_SIZE(<cnp.ndarray>total_sequence_length) == 1):
            T = (<int32_t *>cnp.PyArray_DATA(<cnp.ndarray>total_sequence_length))[0]
        else:
            return None
        if T < 1 or S > T:
            return None
        if p.shared:
            if T > Pbuf:
                return None
            # only the per-step inputs: the kept ones (scales, rotary caches, head_sink)
            # have the address, shape and strides __init__ checked against these same
            # past buffers
            if first_alias(past_key, past_value, (
                    query, key, value, seqlens_k, position_ids, attention_bias,
                    total_sequence_length)) >= 0:
                return None
            Pres = Pbuf
        else:
            Pres = <int>(T if T > Pbuf else Pbuf)
        if L == 0 and T > Pbuf:
            return None
        first_prompt = S == T and L != 0
        if (S > 1 and S != T and B != 1 and p.has_past) or (S != T and not p.has_past):
            return None
        # seqlens_k and rotary positions: the compute's own rules (one statement of them)
        max_pos = cnp.PyArray_DIM(<cnp.ndarray>cos_cache, 0) if p.rot_half else 0
        if p.rot_half and max_pos < T:
            return None
        q = p[0]
        q.T = <int>T; q.Pres = Pres; q.first_prompt = first_prompt
        q.seqlens = <const int *>cnp.PyArray_DATA(<cnp.ndarray>seqlens_k)
        q.pos_ids = (<const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>position_ids)
                     if p.rot_half and position_ids is not None else NULL)
        if length_error(&q, max_pos, where):
            return None
        Tmax = q.Tmax
        if attention_bias is not None and cnp.PyArray_DIM(<cnp.ndarray>attention_bias, 3) != T:
            return None
        # threads and plan
        if num_threads is None:
            nt_set = _SETTINGS["num_threads"]
            nt = nt_set if nt_set is not None else max(1, omp_max_threads())
        elif type(num_threads) is int and 1 <= num_threads <= INT32_MAX:
            nt = num_threads
        else:
            return None
        _plan(B, S, p.Nkv, p.G, p.H, Tmax, &q_block, &kv_block, &splits, &ranges)
        # outputs
        if p.shared:
            present_key, present_value = past_key, past_value
        else:
            dims[0] = B; dims[1] = p.Nkv; dims[2] = Pres; dims[3] = self.Hp
            present_key = cnp.PyArray_EMPTY(4, dims, self.cache_type, 0)
            present_value = cnp.PyArray_EMPTY(4, dims, self.cache_type, 0)
        dims[0] = B; dims[1] = S; dims[2] = p.N * p.H
        out = cnp.PyArray_EMPTY(3, dims, cnp.NPY_FLOAT32, 0)
        qk_out = None
        if self.qk_mode:
            dims[0] = B; dims[1] = p.N; dims[2] = S; dims[3] = T
            qk_out = cnp.PyArray_EMPTY(4, dims, cnp.NPY_FLOAT32, 0)
        if self.packed:
            key = query[..., p.N * p.H:]
            value = query[..., (p.N + p.Nkv) * p.H:]
        run(self.consts, query, key, value, seqlens_k, present_key, present_value,
            None if p.shared or not p.has_past else past_key,
            None if p.shared or not p.has_past else past_value,
            self.ks, self.vs, cos_cache if p.rot_half else None,
            sin_cache if p.rot_half else None,
            position_ids if p.rot_half else None, attention_bias, head_sink,
            out, qk_out, <int>T, Pres, first_prompt, nt, _SETTINGS["flash"],
            q_block, kv_block, splits, ranges)
        if qk_out is not None:
            return out, present_key, present_value, qk_out
        return out, present_key, present_value


def op_call(self, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
            total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
            attention_bias=None, head_sink=None, k_scale=None, v_scale=None, *,
            present_key=None, present_value=None, num_threads=None):
    """GroupQueryAttention.__call__ (gqa/_operator.py): a repeat of the operator's input
    signature runs from here, without a Python frame, when Step.call proves it valid; any
    other call goes to the operator's full path (_call), which owns every check and error."""
    cdef object step = self._step
    cdef object r
    if step is not None:
        r = (<Step?>step).call(query, key, value, past_key, past_value, seqlens_k,
                               total_sequence_length, cos_cache, sin_cache, position_ids,
                               attention_bias, head_sink, k_scale, v_scale, present_key,
                               present_value, num_threads)
        if r is not None:
            return r
    return self._call(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                      cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale,
                      v_scale, present_key, present_value, num_threads)
