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
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(dtype)


def bit_reversal(n):
    """The bit-reversal permutation of range(n) (n a power of two)."""
    n = _power_of_two(n, "n")
    bits = n.bit_length() - 1
    return np.array([int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(n)])


def oscar_rotation(eigenvectors, head_size, kv_num_heads=1):
    """float32 ``(kv_num_heads, head_size, head_size)`` rotations ``U @ Hd @ P``.
    ``eigenvectors``: None (U = identity: the Hadamard rotation alone), or ``(kv_num_heads,
    head_size, head_size)`` orthonormal columns in descending eigenvalue order."""
    d = _power_of_two(head_size, "head_size")
    hd = hadamard(d, np.float64)[:, np.argsort(bit_reversal(d))]   # (Hd @ P)
    if eigenvectors is None:
        return np.broadcast_to(hd.astype(np.float32), (int(kv_num_heads), d, d)).copy()
    u = np.asarray(eigenvectors, np.float64)
    if u.ndim != 3 or u.shape[1:] != (d, d):
        raise ValueError(f"eigenvectors must have shape (kv_num_heads, {d}, {d}), got {u.shape}")
    return (u @ hd).astype(np.float32)


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
    out = []
    for cq, cs in zip(query_cov, output_cov):
        cq, cs = np.asarray(cq, np.float64), np.asarray(cs, np.float64)
        out.append((oscar_rotation(eigenvectors(cq), cq.shape[-1], cq.shape[0]),
                    oscar_rotation(eigenvectors(cs), cs.shape[-1], cs.shape[0])))
    return out
