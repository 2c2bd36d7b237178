"""Independent statements of the numeric contract, for the tests.

Nothing here calls gqa: these are the oracles the kernels are compared against.

* ``quantize_ref`` / ``dequantize_ref``: the quantization contract in NumPy
  (``../shared/spec/gqa-contract.md`` section 1 and ``ort-verified-facts.md``):
  code = clamp(rint(x * fl32(1/s)), lo, hi) in float32, half to even, s == 0 -> multiplier 1,
  NaN -> hi, INT4 as +8-biased nibbles with the even element in the low nibble and pad nibble 8.
* ``qk_oracle`` / ``sv_oracle``: float64 GEMMs on *dequantized* B, with a rigorous
  float32 error bound (``*_bound``) for a kernel that accumulates in float32.
* ``ort_present``: quantized codes from onnxruntime 1.31.1 itself (present_key /
  present_value of a one-node com.microsoft GroupQueryAttention graph with a
  zero-length past, so present holds exactly the quantized new K / V).
"""

import numpy as np

F32 = np.float32
U32 = 2.0 ** -24  # unit roundoff of float32 (round to nearest)

LIMITS = {8: (-128, 127), 4: (-8, 7)}
MODES = {  # asv / test mode name -> (bits, per_channel)
    "s8_pt": (8, False),
    "s8_pc": (8, True),
    "s4_pt": (4, False),
    "s4_pc": (4, True),
}


def packed_width(bits, h):
    return h if bits == 8 else (h + 1) // 2


def _scale_row(scale, h):
    s = np.asarray(scale, dtype=F32).reshape(-1)
    if s.size == 1:
        return np.full(h, s[0], dtype=F32)
    assert s.size == h, (s.size, h)
    return s


# ---------------------------------------------------------------- quantization

def quantize_codes_ref(x, scale, bits):
    """Signed codes (int32) of float32 x[..., H]: the contract before packing."""
    x = np.asarray(x)
    assert x.dtype == F32
    h = x.shape[-1]
    s = _scale_row(scale, h)
    # The multiplier is the float32 reciprocal (an IEEE float32 division), 1 where s == 0.
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(s == 0, F32(1.0), F32(1.0) / s).astype(F32)
        prod = (x * inv).astype(F32)  # float32 x float32 -> float32, one rounding
    q = np.rint(prod)  # NumPy rint: round half to even
    lo, hi = LIMITS[bits]
    q = np.where(np.isnan(q), F32(hi), np.clip(q, lo, hi))  # NaN -> hi, +-inf -> hi/lo
    return q.astype(np.int32)


def pack_int4(codes):
    """Signed INT4 codes [..., H] -> uint8 [..., (H+1)//2]: nibble = code + 8,
    element 2i in the low nibble of byte i, 2i+1 in the high nibble, pad nibble 8."""
    codes = np.asarray(codes, dtype=np.int32)
    assert codes.min(initial=-8) >= -8 and codes.max(initial=7) <= 7
    h = codes.shape[-1]
    nib = codes + 8
    if h % 2:
        nib = np.concatenate([nib, np.full(nib.shape[:-1] + (1,), 8, np.int32)], axis=-1)
    lo = nib[..., 0::2]
    hi = nib[..., 1::2]
    return (lo | (hi << 4)).astype(np.uint8)


def unpack_int4(packed, h=None):
    """uint8 [..., Hp] -> signed codes (int32) [..., h] (h defaults to 2*Hp)."""
    packed = np.asarray(packed, dtype=np.uint8).astype(np.int32)
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), dtype=np.int32)
    out[..., 0::2] = (packed & 0xF) - 8
    out[..., 1::2] = (packed >> 4) - 8
    return out[..., : (out.shape[-1] if h is None else h)]


def quantize_ref(x, scale, bits):
    """What gqa.quantize must return, bit for bit."""
    q = quantize_codes_ref(x, scale, bits)
    return q.astype(np.int8) if bits == 8 else pack_int4(q)


def dequantize_ref(codes, scale, bits, h=None):
    """float32 code * s (one float32 multiply); s == 0 gives 0 (no zero -> 1 rule here)."""
    if bits == 8:
        q = np.asarray(codes, dtype=np.int8).astype(np.int32)
    else:
        q = unpack_int4(codes, h)
    s = _scale_row(scale, q.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        return (q.astype(F32) * s).astype(F32)


# ---------------------------------------------------------------- per-group formats

def group_tau_ref(row, rho):
    """The row's clip threshold: the k-th smallest |x| (NaN counted as +inf),
    k = min(trunc(fl32(rho) * fl32(H)), H - 1), for 0 < rho < 1; +inf otherwise."""
    h = row.shape[-1]
    if not (0.0 < rho < 1.0):
        return F32(np.inf)
    a = np.abs(row)
    a = np.where(np.isnan(a), F32(np.inf), a).astype(F32)
    k = min(int(F32(rho) * F32(h)), h - 1)
    return np.sort(a)[k]


def group_quantize_ref(x, bits, group, rho=1.0, meta16=False):
    """uint8 rows [..., H*bits/8 + (H/group)*2*meta_bytes] of float32 x[..., H] in the per-group
    asymmetric format, written from its definition (README, numeric contract):
    per group lo/hi of the clipped values (NaN skipped; 0, 0 when all NaN; a zero lo is +0), scale =
    fl32(hi - lo) / (2^bits - 1) (1 unless > 0), code = clamp(rint(fl32(v - lo) / scale), 0, Q)
    with NaN -> Q, codes LSB first, then (scale, lo) per group as float32 or float16."""
    x = np.asarray(x)
    assert x.dtype == F32
    h = x.shape[-1]
    rows = x.reshape(-1, h)
    q_max = F32(2 ** bits - 1)
    per = 8 // bits
    out = []
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for row in rows:
            tau = group_tau_ref(row, rho)
            v = np.minimum(np.maximum(row, -tau), tau).astype(F32)
            codes = np.zeros(h, np.int64)
            meta = []
            for c0 in range(0, h, group):
                gv = v[c0:c0 + group]
                ok = gv[~np.isnan(gv)]
                lo, hi = (ok.min(), ok.max()) if ok.size else (F32(0), F32(0))
                lo = F32(lo + F32(0))            # a zero minimum is +0 (not -0)
                scale = F32(F32(hi - lo) / q_max)
                if not scale > 0:
                    scale = F32(1.0)
                q = np.rint((gv - lo).astype(F32) / scale).astype(F32)
                q = np.where(np.isnan(q), q_max, np.clip(q, 0, q_max))
                codes[c0:c0 + group] = q.astype(np.int64)
                meta.append((scale, lo))
            packed = np.zeros(h // per, np.int64)
            for i in range(per):
                packed |= codes[i::per] << (bits * i)
            mdt = np.float16 if meta16 else F32
            out.append(np.concatenate([packed.astype(np.uint8),
                                       np.array(meta, dtype=mdt).reshape(-1).view(np.uint8)]))
    return np.stack(out).reshape(x.shape[:-1] + (-1,))


def _group_parts(rows, bits, group, h, meta16):
    """(codes int64, scale float64, zero float64), each [rows, h], of per-group rows."""
    flat = np.asarray(rows, np.uint8).reshape(-1, np.shape(rows)[-1])
    per = 8 // bits
    nb = h * bits // 8
    codes = np.zeros((flat.shape[0], h), np.int64)
    for i in range(per):
        codes[:, i::per] = (flat[:, :nb].astype(np.int64) >> (bits * i)) & (2 ** bits - 1)
    mdt = np.float16 if meta16 else F32
    meta = np.ascontiguousarray(flat[:, nb:]).view(mdt).astype(F32).reshape(flat.shape[0], -1, 2)
    return codes, np.repeat(meta[:, :, 0], group, axis=1), np.repeat(meta[:, :, 1], group, axis=1)


def group_magnitude_ref(rows, bits, group, h, meta16=False):
    """float64 |code * scale| + |zero| per element: the magnitudes a kernel may round when it
    forms code * scale + zero (once, fused, or as the contract's two roundings)."""
    codes, scale, zero = _group_parts(rows, bits, group, h, meta16)
    mag = np.abs(codes * scale.astype(np.float64)) + np.abs(zero.astype(np.float64))
    return mag.reshape(np.shape(rows)[:-1] + (h,))


def group_dequantize_ref(rows, bits, group, h, meta16=False):
    """float32 [..., h] of per-group rows: fl32(fl32(code * scale) + zero)."""
    codes, scale, zero = _group_parts(rows, bits, group, h, meta16)
    with np.errstate(invalid="ignore", over="ignore"):
        out = (codes.astype(F32) * scale).astype(F32) + zero
    return out.astype(F32).reshape(np.shape(rows)[:-1] + (h,))


# ---------------------------------------------------------------- GEMM oracles

def qk_oracle(a, b_deq, alpha):
    """alpha * a @ b_deq.T in float64; alpha is rounded to float32 first (the C API takes float)."""
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b_deq, dtype=np.float64)
    return np.float64(F32(alpha)) * (a64 @ b64.T)


def qk_bound(a, b_deq, alpha):
    """Worst-case |C - exact| for a float32 kernel: any summation order of K products
    (with or without FMA) is within gamma_K * sum|a||b|; deferring a per-tensor scale
    (s * sum(a*q) instead of sum(a*fl(q*s))), multiplying by alpha*s and the final
    multiply add at most 3 more roundings. So (K + 4) * u * |alpha| * sum_k |a_k||b_k|,
    with 1 % slack for second-order terms."""
    k = np.asarray(a).shape[1]
    mag = np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b_deq, np.float64)).T
    return 1.01 * (k + 4) * U32 * abs(float(F32(alpha))) * mag


def sv_oracle(a, b_deq, beta, c0):
    """beta * c0 + a @ b_deq in float64 (beta == 0 ignores c0, even NaN)."""
    acc = np.asarray(a, np.float64) @ np.asarray(b_deq, np.float64)
    if beta == 0:
        return acc
    return np.float64(F32(beta)) * np.asarray(c0, np.float64) + acc


def sv_bound(a, b_deq, beta, c0):
    """As qk_bound, for K = number of keys plus the beta*C term. A kernel may split the
    keys into chunks that are each scaled and added into C: one more rounding per chunk
    (chunks of >= 16 keys), hence K + K//16 + 8 roundings at most."""
    k = np.asarray(a).shape[1]
    mag = np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b_deq, np.float64))
    if beta != 0:
        mag = mag + abs(float(F32(beta))) * np.abs(np.asarray(c0, np.float64))
    return 1.01 * (k + k // 16 + 8) * U32 * mag


def assert_within(c, ref, bound, what=""):
    """|c - ref| <= bound elementwise (plus the smallest normal float32 for underflow)."""
    c = np.asarray(c, np.float64)
    assert c.shape == ref.shape, (c.shape, ref.shape)
    assert np.all(np.isfinite(c)), f"{what}: non-finite values in the result"
    err = np.abs(c - ref)
    lim = bound + np.finfo(F32).tiny
    bad = err > lim
    if bad.any():
        i = np.unravel_index(np.argmax(err / lim), err.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements outside the float32 bound; "
            f"worst at {tuple(int(v) for v in i)}: got {c[i]!r}, exact {ref[i]!r}, "
            f"|err| {err[i]:.3g} > bound {lim[i]:.3g}")


# ---------------------------------------------------------------- data helpers

def random_codes(rng, shape, bits):
    """Random stored codes covering the full range (INT8 -128..127; INT4 every byte)."""
    if bits == 8:
        return rng.integers(-128, 128, size=shape, dtype=np.int16).astype(np.int8)
    return rng.integers(0, 256, size=shape, dtype=np.int16).astype(np.uint8)


def random_scale(rng, h, per_channel, lo=1e-3, hi=1e-1):
    """float32 scale: 1 element or h elements, log-uniform in [lo, hi]."""
    n = h if per_channel else 1
    return np.exp(rng.uniform(np.log(lo), np.log(hi), size=n)).astype(F32)


# ---------------------------------------------------------------- onnxruntime

def ort_present(key, value, k_scale, v_scale, bits, per_channel, num_heads=None):
    """Quantize with onnxruntime: key/value float32 [B, S, Nkv, H] -> (present_key,
    present_value) codes [B, Nkv, S, Hp] (int8 for INT8, packed uint8 for INT4).
    Per-channel scales have Nkv*H elements (head j uses scale[j*H:(j+1)*H])."""
    import _ort

    key = np.asarray(key, F32)
    value = np.asarray(value, F32)
    b, s, nkv, h = key.shape
    n = num_heads or nkv
    hp = packed_width(bits, h)
    ct = np.int8 if bits == 8 else np.uint8
    qt = "PER_CHANNEL" if per_channel else "PER_TENSOR"
    inputs = {
        "query": np.zeros((b, s, n * h), F32),
        "key": np.ascontiguousarray(key.reshape(b, s, nkv * h)),
        "value": np.ascontiguousarray(value.reshape(b, s, nkv * h)),
        "past_key": np.zeros((b, nkv, 0, hp), ct),  # zero-length past: present = the new rows
        "past_value": np.zeros((b, nkv, 0, hp), ct),
        "seqlens_k": np.full(b, s - 1, np.int32),
        "total_sequence_length": s,
        "k_scale": np.asarray(k_scale, F32).reshape(-1),
        "v_scale": np.asarray(v_scale, F32).reshape(-1),
    }
    attrs = dict(num_heads=n, kv_num_heads=nkv, k_quant_type=qt, v_quant_type=qt, kv_cache_bit_width=bits)
    _, pk, pv = _ort.run_ort(inputs, attrs)
    assert pk.shape == (b, nkv, s, hp) and pk.dtype == ct, (pk.shape, pk.dtype)
    return pk, pv
