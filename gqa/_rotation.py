"""Rotations for the quantized cache (onnxruntime main's OSCAR design): orthogonal
``(kv_num_heads, head_size, head_size)`` matrices R applied to post-rotary Q and K (and V, the
output rotated back), so that quantization error falls on directions attention uses little.

* :func:`hadamard`: the normalized Walsh-Hadamard matrix (Sylvester order), any power of two.
* :func:`oscar_rotation`: ``R = U @ Hd @ P`` per KV head -- U the eigenvectors of a covariance
  in descending eigenvalue order (identity without one), Hd the normalized Hadamard matrix and P
  the bit-reversal permutation (``(X @ P)[:, bitrev(i)] = X[:, i]``): the rotation a user
  without calibration data gets from ``oscar_rotation(None, head_size, kv_num_heads)``.
* :func:`calibrate_rotations`: R_K from the covariance of the post-rotary queries of each KV
  head's query group (``sum q^T q``), R_V from that of the attention outputs (``sum (SV)^T
  (SV)``), gathered from a model's forward over a calibration text (gqa/apps/llama.py
  ``Llama.calibrate_rotations``).
"""
import functools
import numbers

import numpy as np


def _power_of_two(n, name):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two (a padding-free Hadamard matrix), got {n!r}")
    return int(n)


def hadamard(n, dtype=np.float32):
    """The normalized n x n Walsh-Hadamard matrix (n a power of two): symmetric, orthogonal,
    entries +-1/sqrt(n), built by Sylvester's doubling in float64."""
    n = _power_of_two(n, "n")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a float dtype, got {dtype!r}") from None
    if dt.kind != "f":
        raise TypeError(f"dtype must be a float dtype (entries are +-1/sqrt(n)), got {dt}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(dt)


def bit_reversal(n):
    """The bit-reversal permutation of range(n) (n a power of two)."""
    n = _power_of_two(n, "n")
    bits = n.bit_length() - 1
    return np.array([int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(n)])


def oscar_rotation(eigenvectors, head_size, kv_num_heads=None):
    """float32 ``(kv_num_heads, head_size, head_size)`` rotations ``U @ Hd @ P``.
    ``eigenvectors``: None (U = identity: the Hadamard rotation alone, ``kv_num_heads``
    copies, default 1), or ``(kv_num_heads, head_size, head_size)`` finite orthonormal columns
    in descending eigenvalue order (``kv_num_heads``, if given, must be their count)."""
    d = _power_of_two(head_size, "head_size")
    if kv_num_heads is not None and (isinstance(kv_num_heads, (bool, np.bool_))
                                     or not isinstance(kv_num_heads, numbers.Integral)):
        raise TypeError(f"kv_num_heads must be an int, got {type(kv_num_heads).__name__}")
    if kv_num_heads is not None and kv_num_heads < 1:
        raise ValueError(f"kv_num_heads must be >= 1, got {kv_num_heads}")
    hd = hadamard(d, np.float64)[:, np.argsort(bit_reversal(d))]   # (Hd @ P)
    if eigenvectors is None:
        n = 1 if kv_num_heads is None else int(kv_num_heads)
        return np.broadcast_to(hd.astype(np.float32), (n, d, d)).copy()
    u = _float64(eigenvectors, "eigenvectors")
    if u.ndim != 3 or u.shape[1:] != (d, d) or (kv_num_heads is not None and u.shape[0] != kv_num_heads):
        n = "kv_num_heads" if kv_num_heads is None else kv_num_heads
        raise ValueError(f"eigenvectors must have shape ({n}, {d}, {d}), got {u.shape}")
    return (u @ hd).astype(np.float32)


def _float64(x, name):
    """A float64 copy of a real array, every element finite."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):      # ragged nested sequences
        raise TypeError(f"{name} must be a real array, got {type(x).__name__}") from None
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise TypeError(f"{name} must be a real array, got dtype {a.dtype}")
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds a non-finite element at {np.argwhere(~np.isfinite(a))[0].tolist()}")
    return a


@functools.lru_cache(maxsize=16)
def _hadamard_signs(d):
    """The +-1 pattern of oscar_rotation(None, d) (read-only, cached)."""
    s = np.sign(oscar_rotation(None, d)[0]).astype(np.int8)
    s.flags.writeable = False
    return s


def hadamard_scale(r):
    """c > 0 when every KV head of the rotations ``r [Nkv, H, H]`` is c times the sign pattern
    of ``oscar_rotation(None, H)`` exactly (the rotation of ``+had``, in any float type and
    scale), else 0.0.  Then ``R R^T = H c^2 I`` exactly: the check of orthogonality is O(H^2)."""
    r = np.asarray(r)
    H = r.shape[-1]
    if r.ndim != 3 or r.shape[1] != H or H < 1 or H & (H - 1) or r.size == 0:
        return 0.0
    c = abs(r.flat[0])
    if not c > 0:
        return 0.0
    return float(c) if bool((r == _hadamard_signs(H) * c).all()) else 0.0


def eigenvectors(cov):
    """Eigenvectors of symmetric ``(..., D, D)`` covariances (symmetrized first) as columns, in
    descending eigenvalue order."""
    c = np.asarray(cov, np.float64)
    w, v = np.linalg.eigh(0.5 * (c + np.swapaxes(c, -1, -2)))
    return v[..., ::-1]


def calibrate_rotations(query_cov, output_cov):
    """Per layer ``(R_K, R_V)`` from per-layer covariances ``(kv_num_heads, D, D)`` of the
    post-rotary queries (key target) and of the attention outputs (value target)."""
    for name, covs in (("query_cov", query_cov), ("output_cov", output_cov)):
        if isinstance(covs, (str, bytes)) or not hasattr(covs, "__len__"):
            raise TypeError(f"{name} must be a sequence of one covariance array per layer, "
                            f"got {type(covs).__name__}")
    if len(query_cov) != len(output_cov):
        raise ValueError(f"query_cov and output_cov must hold one array per layer each, got "
                         f"{len(query_cov)} and {len(output_cov)}")
    out = []
    for i, (cq, cs) in enumerate(zip(query_cov, output_cov)):
        pair = []
        for name, c in ((f"query_cov[{i}]", cq), (f"output_cov[{i}]", cs)):
            c = _float64(c, name)
            if c.ndim != 3 or c.shape[1] != c.shape[2] or c.shape[0] < 1:
                raise ValueError(f"{name} must have shape (kv_num_heads, D, D), got {c.shape}")
            _power_of_two(c.shape[-1], f"{name}'s D")
            pair.append(oscar_rotation(eigenvectors(c), c.shape[-1], c.shape[0]))
        out.append(tuple(pair))
    return out
