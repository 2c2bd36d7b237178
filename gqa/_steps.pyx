# cython: language_level=3
"""KVCache's step (gqa/_kvcache.py subclasses Steps): the per-layer buffers and operators a
step passes, the step's bookkeeping and KVCache.attend, in C.

A model calls attend once per layer per step, between its own matrix products, so each call
meets cold caches: every Python-level operation of the call path (attribute dictionaries,
frames, NumPy's Python helpers) then costs microseconds.  Here the step's state lives in this
object's C fields, its arrays are checked through the C API and the layer's operator is
called by position (gqa/_signature.pyx kept_call); the rules and messages are those of the
Python code they replace.

State (the contract of gqa/_kvcache.py, which reads and sets these fields by name):
  _lengths     int64 [batch_size], C-contiguous: positions each sequence holds
  _length      the longest of them
  _seqlens     int32 [batch_size]: the operator's seqlens_k of the step in progress (Tb - 1)
  _step_size   S of the step in progress (0: none); _step_new its new positions per sequence
               (int64 [batch_size]), _step_uniform all S (no lengths=), _step_total its total
               length T, _in_step the layers that have had it, _step_layers how many
With float windows (sink_size s, recent_size r; hp_key / hp_value [B, Nkv, rows, H]: rows
[0, ns) the sink, rows [ns, ns + nr) positions [f, L) with f = frontier(L) = max(min(s, L),
L - r)) and rollback_size m:
  undo_key, undo_value  per layer [B, Nkv, m, H] of the windows' dtype (None when m = 0):
               the rollback rows, which the operator writes: the float row of a position p
               that left the recent window (or never entered it), at row p % m
  _undo_lo     int64 [batch_size]: sequence b's floats are positions [0, s) and [_undo_lo[b],
               its length) (the rollback rows hold [_undo_lo[b], f); _undo_lo[b] <= f)
"""
import numbers

from cpython.object cimport PyObject
cimport numpy as cnp
import numpy as np

from gqa._signature cimport kept_call

cnp.import_array()


cdef class Steps:
    """The base of gqa.KVCache: what its attend reads on every call."""
    cdef public int num_layers, batch_size, num_heads, kv_num_heads, head_size, max_length
    cdef public list ops, key, value, hp_key, hp_value, rotations, k_scales, v_scales
    cdef public list undo_key, undo_value
    cdef public long long sink_size, recent_size, rollback_size
    cdef public object cos_cache, sin_cache, num_threads
    cdef public object _seqlens, _lengths, _step_new, _undo_lo
    cdef public long long _length
    cdef public int _step_size, _step_total, _step_layers
    cdef public bint _step_uniform
    cdef public list _in_step
    cdef object _dtype
    cdef int _own_run       # 0: not yet known; 1: _run is Steps'; 2: a subclass's (the peers)

    @property
    def dtype(self):
        """The query, key, value and output dtype: float32 or float16."""
        return self._dtype

    @dtype.setter
    def dtype(self, value):
        self._dtype = np.dtype(value)

    def attend(self, layer, query, key, value, *, lengths=None):
        """Attention of layer ``layer`` for the step's S new tokens: their K/V are written at
        positions ``[length, length + S)`` (in place) and the output ``[B, S, num_heads *
        head_size]`` returned.  Every check (layer, step size, capacity, then the operator's
        own) passes before anything is written.

        ``lengths`` (a prompt into an empty cache only): how many of its S rows each sequence
        has, rows ``[0, lengths[b])`` (the rest is padding: its output rows are not defined);
        the sequences then hold different lengths (``lengths``), and every later step gives
        each sequence its S tokens at its own length."""
        cdef int li = self._layer(layer)
        cdef int S = self._rows(query)
        cdef int T
        cdef bint first
        new = None
        if self._in_step[li]:
            raise ValueError(f"layer {li} already holds this step's tokens: give every layer the "
                             "step once (length advances when the last layer has it)")
        if self._step_size and S != self._step_size:
            raise ValueError(f"this step gives {self._step_size} tokens to the other layers; layer "
                             f"{li} got {S}")
        self._check_step(query, key, value, S)
        first = not self._step_size
        if not first:
            # a later layer of the step: its lengths, total and _seqlens are the first layer's
            if lengths is not None or not self._step_uniform:
                self._same_positions(self._positions(S, lengths))
            T = self._step_total
        else:
            new = self._positions(S, lengths)
            T = self._begin(new, S)
        out = self._call(li, query, key, value, T) if self._plain_run() else \
            self._run(li, query, key, value, T)
        self._in_step[li] = True
        if first:
            self._step_size, self._step_new = S, new
            self._step_uniform, self._step_total = lengths is None, T
            if self.hp_key is not None and self.hp_key[0] is not None:
                self._advance_floor(new)     # after the call: a refused one leaves the floor
        self._step_layers += 1
        if self._step_layers == self.num_layers:
            self._set_lengths(self._lengths + self._step_new)
        return out

    def _run(self, layer, query, key, value, T):
        """The attention of one layer, caches updated in place to total length T (the
        operator; gqa/apps/model_peers.py substitutes other implementations)."""
        return self._call(layer, query, key, value, T)

    cdef object _call(self, int li, query, key, value, int T):
        rk, rv = self.rotations[li]
        ring = None if self.undo_key is None else (self.undo_key[li], self.undo_value[li])
        return kept_call(self.ops[li], query, key, value, self.key[li], self.value[li],
                         self._seqlens, T, self.cos_cache, self.sin_cache, self.k_scales[li],
                         self.v_scales[li], self.hp_key[li], self.hp_value[li], rk, rv,
                         self.num_threads, ring)[0]

    cdef bint _plain_run(self):
        """The layer's call is the kept operator's (not a subclass's _run)."""
        if self._own_run == 0:
            self._own_run = 1 if getattr(type(self), "_run") is _STEPS_RUN else 2
        return self._own_run == 1

    cdef int _layer(self, layer) except -1:
        if type(layer) is not int and (isinstance(layer, (bool, np.bool_))
                                       or not isinstance(layer, numbers.Integral)):
            raise TypeError(f"layer must be an int, got {type(layer).__name__}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        return <int>layer

    cdef int _rows(self, query) except -1:
        """S of a query [B, S, *] (S >= 1)."""
        cdef object shape
        if isinstance(query, cnp.ndarray):
            if cnp.PyArray_NDIM(<cnp.ndarray>query) == 3 and cnp.PyArray_DIM(<cnp.ndarray>query, 1) >= 1:
                return <int>min(cnp.PyArray_DIM(<cnp.ndarray>query, 1), 0x7fffffff)
            shape = query.shape
        else:
            shape = np.shape(query)
        S = shape[1] if len(shape) == 3 else None
        if S is None or S < 1:
            raise ValueError(f"query must be [B, S, {self.num_heads * self.head_size}] with S >= 1, "
                             f"got shape {shape}")
        return <int>min(S, 0x7fffffff)

    cdef int _check_step(self, query, key, value, int S) except -1:
        """q, k and v of a step of S tokens, in this cache's terms: [batch_size, S, num_heads *
        head_size] and [batch_size, S, kv_num_heads * head_size], of its dtype (or packed QKV:
        query [batch_size, S, (num_heads + 2 * kv_num_heads) * head_size], key = value = None)."""
        cdef int N = self.num_heads, Nkv = self.kv_num_heads
        if key is None and value is None:
            _step_array(query, "query", self, S, N + 2 * Nkv, "(num_heads + 2 * kv_num_heads)")
            return 0
        _step_array(query, "query", self, S, N, "num_heads")
        _step_array(key, "key", self, S, Nkv, "kv_num_heads")
        _step_array(value, "value", self, S, Nkv, "kv_num_heads")
        return 0

    cdef object _positions(self, int S, lengths):
        """The positions a step of S rows adds to each sequence (int64 [batch_size]): S each,
        or the prompt's lengths= (KVCache._given_positions checks them)."""
        if lengths is None:
            return _full(self.batch_size, S)
        return self._given_positions(S, lengths)

    cdef int _same_positions(self, new) except -1:
        """A later layer's positions are the step's (its first layer's)."""
        if not np.array_equal(new, self._step_new):
            raise ValueError(f"this step gives the other layers lengths {self._step_new.tolist()}; "
                             f"layer got {new.tolist()}")
        return 0

    cdef int _begin(self, new, int S) except -1:
        """The first layer of a step: T = max_b (lengths[b] + new[b]) within max_length (at
        least S: a prompt's lengths= may all be under S, its last rows padding everywhere),
        then _seqlens[b] = lengths[b] + new[b] - 1."""
        cdef cnp.ndarray lens = self._lengths, add = new, sl = self._seqlens
        _own_array(lens, cnp.NPY_INT64, self.batch_size, "_lengths")
        _own_array(add, cnp.NPY_INT64, self.batch_size, "the step's new positions")
        _own_array(sl, cnp.NPY_INT32, self.batch_size, "_seqlens")
        cdef const long long *a = <const long long *>cnp.PyArray_DATA(lens)
        cdef const long long *n = <const long long *>cnp.PyArray_DATA(add)
        cdef int *out = <int *>cnp.PyArray_DATA(sl)
        cdef long long T = 0
        cdef int b
        for b in range(self.batch_size):
            if a[b] + n[b] > T:
                T = a[b] + n[b]
        if T < S:
            T = S
        if T > self.max_length:
            raise ValueError(f"KVCache is full: {self._length} + {S} positions exceed max_length "
                             f"({self.max_length}); reset() or truncate() it, or allocate more")
        for b in range(self.batch_size):
            out[b] = <int>(a[b] + n[b] - 1)
        return <int>T

    cdef int _advance_floor(self, new) except -1:
        """The step's floats (_undo_lo), once its first layer's call has run: the operator
        puts every position that becomes history among the last m before the new frontier f'
        into the rollback rows, so a sequence then holds [max(lo, f' - m), f') there."""
        cdef cnp.ndarray lens = self._lengths, add = new, lo_a = self._undo_lo
        _own_array(lens, cnp.NPY_INT64, self.batch_size, "_lengths")
        _own_array(add, cnp.NPY_INT64, self.batch_size, "the step's new positions")
        _own_array(lo_a, cnp.NPY_INT64, self.batch_size, "_undo_lo")
        cdef const long long *a = <const long long *>cnp.PyArray_DATA(lens)
        cdef const long long *n = <const long long *>cnp.PyArray_DATA(add)
        cdef long long *lo = <long long *>cnp.PyArray_DATA(lo_a)
        cdef long long f
        cdef int b
        for b in range(self.batch_size):
            f = _frontier(a[b] + n[b], self.sink_size, self.recent_size) - self.rollback_size
            if f > lo[b]:
                lo[b] = f
        return 0


cdef object _STEPS_RUN = Steps.__dict__["_run"]


cdef inline long long _frontier(long long L, long long s, long long r):
    """The first position of the recent window of L positions: max(min(s, L), L - r)."""
    cdef long long ns = s if s < L else L
    return L - r if L - r > ns else ns


def frontier(L, s, r):
    """The first position of the recent window of L positions (sink_size s, recent_size r)."""
    return _frontier(L, s, r)


cdef object _full(int n, long long value):
    """int64 [n] filled with value."""
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    cdef cnp.ndarray x = cnp.PyArray_EMPTY(1, dims, cnp.NPY_INT64, 0)
    cdef long long *p = <long long *>cnp.PyArray_DATA(x)
    cdef int i
    for i in range(n):
        p[i] = value
    return x


cdef int _own_array(cnp.ndarray x, int type, int n, str name) except -1:
    """The bookkeeping arrays _begin addresses: C-contiguous [n] of `type` (KVCache keeps them so)."""
    if (x is None or cnp.PyArray_TYPE(x) != type or cnp.PyArray_NDIM(x) != 1
            or cnp.PyArray_DIM(x, 0) != n or not cnp.PyArray_IS_C_CONTIGUOUS(x)):
        raise RuntimeError(f"gqa.KVCache: {name} is not a C-contiguous array of {n} elements of "
                           f"type {type}")
    return 0


cdef int _step_array(x, str name, Steps c, int S, int heads, str what) except -1:
    """x is [batch_size, S, heads * head_size] of c's dtype."""
    cdef int B = c.batch_size, H = c.head_size
    if not isinstance(x, cnp.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if not cnp.PyArray_EquivTypes(<cnp.dtype><PyObject *>cnp.PyArray_DESCR(<cnp.ndarray>x), <cnp.dtype>c._dtype):
        raise TypeError(f"{name} must have this KVCache's dtype {c._dtype}, got {x.dtype}")
    if (cnp.PyArray_NDIM(<cnp.ndarray>x) != 3 or cnp.PyArray_DIM(<cnp.ndarray>x, 0) != B
            or cnp.PyArray_DIM(<cnp.ndarray>x, 1) != S
            or cnp.PyArray_DIM(<cnp.ndarray>x, 2) != <cnp.npy_intp>heads * H):
        raise ValueError(f"{name} must have shape [batch_size, S, {what} * head_size] = "
                         f"[{B}, {S}, {heads} * {H} = {heads * H}], got {x.shape}")
    return 0
