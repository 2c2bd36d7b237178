# The one statement of the C int bound that sizes and lengths are checked against.
cdef enum:
    INT32_MAX = 2147483647

# The one-argument rules of the operator's call (see _checks.pyx), for gqa/_signature.pyx.
# x: an ndarray of type number t1 (or t2; -1: none) and rank ndim (-1: any), else the refusal.
cdef int _array(object x, str name, int t1, int t2, int ndim) except -1
# x is None, or of that dtype, C-contiguous and aligned (the compute reads it as it is).
cdef bint _ready(object x, int type_num) noexcept
# A float32, C-contiguous, aligned view or copy of a float input (None stays None).
cdef object _f32(object x)
# A C-contiguous, aligned view or copy of an input (inputs are never written).
cdef object _contiguous(object x)
# total_sequence_length: a Python int or a one-element int32 array, in [1, INT32_MAX].
cdef long long _total_length(object t) except -1
# The threads of a call: num_threads, else gqa.config's, else OpenMP's default.
cdef int _threads(object n) except -1
# x (float32 / float16) as the compute reads it, once every element is finite.
cdef object _finite(object x, str name, str why)
# The scale as the compute reads it, once every element is finite.
cdef object _finite_scale(object s, str name)
# Rotations [Nkv, H, H]: finite and orthogonal within ORTHOGONAL_TOLERANCE.
cdef double _orthogonal(object r, str name) except -1.0
# One quantized cache's (NumPy type, row width, C type, per-channel, width's name).
cdef tuple _side_format(op, str side, object scale, int Nkv, int H)
# The signature checks of the rotary inputs: rotary_dim / 2 where rotary applies, else 0.
cdef int _rotary(int do_rotary, cos, sin, pos, int ft, int B, int S, int H) except -1
# A caller's present buffer (not in place): dtype, shape (B, Nkv, *, Hp), flags.
cdef int _present(object out, str name, int B, int Nkv, int Hp, object dtype) except -1
# Arrays a and b share a byte (anything but two ndarrays: False).
cdef bint overlap(object a, object b)
# Index of the first of `inputs` sharing memory with kc or vc, else -1.
cdef Py_ssize_t first_alias(kc, vc, tuple inputs)
# The caller's buffers a call writes share no byte with the inputs or with each other.
cdef int apart(tuple outs, tuple out_names, tuple ins, tuple in_names, str where) except -1
