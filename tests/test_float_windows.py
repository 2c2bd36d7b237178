"""Float windows (sink_size / recent_size, past_hp_* -> present_hp_*) and rotations
(oscar_rotation_k / _v) beside a quantized cache, and MixedPrecisionGroupQueryAttention:
beyond onnxruntime 1.31.1, so checked against a float64 NumPy statement of onnxruntime main's
two-basis attention (window rows exact in the original basis, history rows quantized in the
rotated basis: scores with q R_K, values turned back by R_V^T), under both window partitions;
codes and windows bit for bit over long in-place loops; chunking invariance; errors."""
import numpy as np
import pytest

import gqa
from _cases import float_positions, window_counts
from _reference import F32, group_dequantize_ref, group_quantize_ref

N, NKV, H = 4, 2, 32
G = N // NKV
FORMATS = {  # id -> attributes, (quantize rows -> codes, dequantize codes -> rows) in NumPy
    "g2-16": dict(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP", kv_cache_bit_width=2,
                  kv_quant_group_size=16, k_quant_rho=0.9, v_quant_rho=0.9),
    "g4-8-fp16": dict(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP", kv_cache_bit_width=4,
                      kv_quant_group_size=8, metadata_type="fp16"),
    "int8-pt": dict(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8),
    "int4-pc": dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=4),
    # K and V of different types and widths (beyond onnxruntime main: one type for both)
    "k4pc-v2g16": dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_GROUP", k_cache_bit_width=4,
                       v_cache_bit_width=2, kv_quant_group_size=16, v_quant_rho=0.9),
    "k8g8-v4pt": dict(k_quant_type="PER_GROUP", v_quant_type="PER_TENSOR", kv_cache_bit_width=4,
                      k_cache_bit_width=8, kv_quant_group_size=8, metadata_type="fp16"),
}
WINDOWS = {"s2r3": (2, 3), "s0r4": (0, 4), "s3r0": (3, 0)}


def _perm(seed):
    """Per-KV-head permutation matrices: x @ R is exact, so the codes can be compared bit for bit."""
    r = np.random.default_rng(seed)
    out = np.zeros((NKV, H, H), F32)
    for j in range(NKV):
        out[j][np.arange(H), r.permutation(H)] = 1.0
    return out


def _orth(seed):
    r = np.random.default_rng(seed)
    out = np.zeros((NKV, H, H), F32)
    for j in range(NKV):
        q, rr = np.linalg.qr(r.standard_normal((H, H)))
        out[j] = (q * np.sign(np.diag(rr))).astype(F32)
    return out


class Side:
    """NumPy statement of one cache's codes (for bit-exact checks) and dequantized rows."""

    def __init__(self, a, side, rng):
        self.group = a[f"{side}_quant_type"] == "PER_GROUP"
        self.bits = a.get(f"{side}_cache_bit_width") or a["kv_cache_bit_width"]
        self.scale = None
        if self.group:
            g = a["kv_quant_group_size"] or H
            self.g, self.m16 = g, a.get("metadata_type") == "fp16"
            self.rho = a.get(f"{side}_quant_rho", 1.0)
            self.width = gqa.group_row_bytes(H, self.bits, g, a.get("metadata_type", "fp32"))
            self.dtype = np.uint8
        else:
            n = NKV * H if a[f"{side}_quant_type"] == "PER_CHANNEL" else 1
            self.scale = rng.uniform(0.02, 0.03, n).astype(F32) * (8 if self.bits == 4 else 1)
            self.width = H if self.bits == 8 else H // 2
            self.dtype = np.int8 if self.bits == 8 else np.uint8

    def codes(self, rows):
        """rows float32 [..., Nkv, T, H] -> the cache rows."""
        if self.group:
            return group_quantize_ref(np.ascontiguousarray(rows), self.bits, self.g, self.rho, self.m16)
        out = np.empty(rows.shape[:-1] + (self.width,), self.dtype)
        for j in range(NKV):
            sj = self.scale[j * H:(j + 1) * H] if self.scale.size > 1 else self.scale
            out[..., j, :, :] = gqa.quantize(np.ascontiguousarray(rows[..., j, :, :]), sj, bits=self.bits)
        return out

    def rows(self, codes):
        if self.group:
            return group_dequantize_ref(codes, self.bits, self.g, H, self.m16).astype(np.float64)
        out = np.empty(codes.shape[:-1] + (H,))
        for j in range(NKV):
            sj = self.scale[j * H:(j + 1) * H] if self.scale.size > 1 else self.scale
            out[..., j, :, :] = gqa.dequantize(np.ascontiguousarray(codes[..., j, :, :]), sj,
                                               bits=self.bits, head_size=H)
        return out


class Codec:
    """A format's two caches: K (i = 0) and V (i = 1), each with its own type and width."""

    def __init__(self, fmt, rng):
        self.attrs = dict(FORMATS[fmt])
        self.sides = (Side(self.attrs, "k", rng), Side(self.attrs, "v", rng))
        self.kw = {f"{n}_scale": s.scale for n, s in zip("kv", self.sides) if s.scale is not None}

    def codes(self, rows, i):
        return self.sides[i].codes(rows)

    def rows(self, codes, i):
        return self.sides[i].rows(codes)


def reference(q, K, V, Kq, Vq, RK, RV, sink, recent, partition, lens, S, first=False):
    """float64 outputs [B, S, N*H]: q [B, S, N, H]; K, V [B, Nkv, T, H] float rows (original
    basis); Kq, Vq the dequantized history rows (rotated basis); lens[b] total positions; the
    S query rows are the last S positions, causal (a ragged first prompt: row s sees
    min(s + 1, lens[b]) keys, onnxruntime's rule)."""
    B = q.shape[0]
    out = np.zeros((B, S, N, H))
    eye = np.broadcast_to(np.eye(H), (NKV, H, H))
    RK = eye if RK is None else RK.astype(np.float64)
    RV = eye if RV is None else RV.astype(np.float64)
    for b in range(B):
        Tb = lens[b]
        for s in range(S):
            end = min(s + 1, Tb) if first else Tb - S + s + 1
            flo = float_positions(partition, sink, recent, Tb, end)
            for h in range(N):
                j = h // G
                qq = q[b, s, h].astype(np.float64)
                sc = np.where(flo, K[b, j, :end] @ qq, Kq[b, j, :end] @ (qq @ RK[j])) / np.sqrt(H)
                p = np.exp(sc - sc.max())
                p /= p.sum()
                o = (p * flo) @ V[b, j, :end] + ((p * ~flo) @ Vq[b, j, :end]) @ RV[j].T
                out[b, s, h] = o
    return out.reshape(B, S, N * H)


class Run:
    """One sequence batch driven through the operator step by step, with every K/V row kept
    in float so that each step can be checked completely."""

    def __init__(self, fmt, window, partition, rot, inplace, B=1, C=48, seed=0, ragged=None):
        self.rng = np.random.default_rng(seed)
        self.codec = Codec(fmt, self.rng)
        self.sink, self.recent = WINDOWS[window] if window != "none" else (0, 0)
        self.partition = partition
        self.RK = self.RV = None
        if rot == "perm":
            self.RK, self.RV = _perm(1), _perm(2)
        elif rot == "orth":
            self.RK, self.RV = _orth(1), _orth(2)
        elif rot == "k-only":
            self.RK = _orth(3)
        elif rot == "had":      # `+had`'s rotation: the kernels' O(H log H) transform
            self.RK = self.RV = gqa.oscar_rotation(None, H, NKV)
        self.op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=self.sink,
                                          recent_size=self.recent, window_partition=partition,
                                          **self.codec.attrs)
        self.inplace, self.B, self.C = inplace, B, C
        ks, vs = self.codec.sides
        self.pk = np.zeros((B, NKV, C, ks.width), ks.dtype)
        self.pv = np.zeros((B, NKV, C, vs.width), vs.dtype)
        cap = self.sink + self.recent
        self.hk = np.zeros((B, NKV, cap, H), F32) if inplace else None
        self.hv = np.zeros((B, NKV, cap, H), F32) if inplace else None
        self.K = np.zeros((B, NKV, 0, H), F32)
        self.V = np.zeros((B, NKV, 0, H), F32)
        self.lens = np.zeros(B, int)
        self.ragged = ragged

    def _rot(self, x, R):
        return x if R is None else np.einsum("bjtd,jde->bjte", x, R).astype(F32)

    def step(self, S):
        B = self.B
        u = lambda *shape: self.rng.uniform(-1, 1, shape).astype(F32)  # noqa: E731
        q, k, v = u(B, S, N * H), u(B, S, NKV * H), u(B, S, NKV * H)
        first = self.lens.max() == 0
        new_lens = (np.array(self.ragged) if first and self.ragged else self.lens + S)
        T = int(new_lens.max())
        kn = k.reshape(B, S, NKV, H).transpose(0, 2, 1, 3)
        vn = v.reshape(B, S, NKV, H).transpose(0, 2, 1, 3)
        Kf = np.zeros((B, NKV, T, H), F32)
        Vf = np.zeros((B, NKV, T, H), F32)
        for b in range(B):
            p0 = new_lens[b] - S if not first else 0
            Kf[b, :, :p0] = self.K[b, :, :p0]
            Vf[b, :, :p0] = self.V[b, :, :p0]
            n = new_lens[b] - p0
            Kf[b, :, p0:p0 + n] = kn[b, :, :n]
            Vf[b, :, p0:p0 + n] = vn[b, :, :n]
        ext = dict(oscar_rotation_k=self.RK, oscar_rotation_v=self.RV)
        windows = self.sink + self.recent > 0
        if self.inplace:
            ext.update(present_key=self.pk, present_value=self.pv)
        if windows and self.inplace:
            ext.update(past_hp_key=self.hk, past_hp_value=self.hv, present_hp_key=self.hk,
                       present_hp_value=self.hv)
        elif windows and not first:
            ext.update(past_hp_key=self.hk, past_hp_value=self.hv)
        res = self.op(q, k, v, self.pk, self.pv, (new_lens - 1).astype(np.int32),
                      np.array(T, np.int32), **self.codec.kw, **ext)
        out, pk, pv, hk, hv = res if windows else res + (self.hk, self.hv)
        if not self.inplace:
            self.pk, self.pv, self.hk, self.hv = pk, pv, hk, hv
        self.K, self.V, self.lens, self.first = Kf, Vf, new_lens, first
        return q, out, T, S

    def check(self, q, out, T, S, tol, exact_codes):
        """Codes of every written row, the windows, and the output against float64."""
        Kr, Vr = self._rot(self.K, self.RK), self._rot(self.V, self.RV)
        for b in range(self.B):
            Tb = self.lens[b]
            if exact_codes:
                assert np.array_equal(self.pk[b, :, :Tb], self.codec.codes(Kr[b, :, :Tb], 0))
                assert np.array_equal(self.pv[b, :, :Tb], self.codec.codes(Vr[b, :, :Tb], 1))
            ns, nr = window_counts(Tb, self.sink, self.recent)
            if ns + nr == 0:
                continue
            keep = list(range(ns)) + list(range(Tb - nr, Tb))
            assert self.hk.shape[2] >= len(keep)
            np.testing.assert_allclose(self.hk[b, :, :len(keep)], Kr[b][:, keep], atol=2e-6, rtol=0)
            np.testing.assert_allclose(self.hv[b, :, :len(keep)], Vr[b][:, keep], atol=2e-6, rtol=0)
            if exact_codes and self.RK is None:
                assert np.array_equal(self.hk[b, :, :len(keep)], self.K[b][:, keep])
        Kq = self.codec.rows(self.pk, 0)
        Vq = self.codec.rows(self.pv, 1)
        ref = reference(q.reshape(self.B, S, N, H), self.K.astype(np.float64),
                        self.V.astype(np.float64), Kq, Vq, self.RK, self.RV, self.sink,
                        self.recent, self.partition, self.lens, S, first=self.first)
        err = np.abs(out - ref).max()
        assert err <= tol, err


# |out - ref| <= (T + 2 H + 16) u max|v| (a rotation adds H roundings): ~1.5e-5 at T <= 48
TOL = 2e-5


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("partition", ["causal", "per_call"])
@pytest.mark.parametrize("rot", ["none", "perm", "orth", "k-only", "had"])
@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_steps_against_float64(kernel_path, fmt, window, rot, partition, flash):
    """A prompt, decode steps and multi-token steps, in place: codes of every row, the
    windows, and the outputs of every step."""
    run = Run(fmt, window, partition, rot, inplace=True, seed=hash((fmt, window, rot)) % 1000)
    with gqa.config(path=kernel_path, flash=flash, flash_blocks=(2, 4) if flash else None):
        for S in (7, 1, 1, 3, 1, 5, 1, 1, 1, 1):
            q, out, T, S = run.step(S)
            run.check(q, out, T, S, TOL, exact_codes=rot in ("none", "perm"))


MIXED = [f for f in FORMATS if f.startswith("k")]


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("rot", ["none", "orth"])
@pytest.mark.parametrize("fmt", MIXED)
def test_mixed_sides_long_decode(kernel_path, fmt, rot, flash):
    """K and V of different types and widths, no windows: a prompt, then decode steps to
    T = 120 with the keys split into chunks (flash decoding) or whole (naive); codes of
    every row and every output against float64."""
    run = Run(fmt, "none", "causal", rot, inplace=True, B=2, C=124, seed=17)
    with gqa.config(path=kernel_path, flash=flash, decode_splits=3 if flash else None):
        for S in [9] + [1] * 111:
            q, out, T, S = run.step(S)
            if T % 37 == 0 or T == 120:     # (T + 2 H + 16) u |v| ~ 1.2e-5 at T = 120
                run.check(q, out, T, S, 2e-5, exact_codes=rot == "none")


@pytest.mark.parametrize("partition", ["causal", "per_call"])
@pytest.mark.parametrize("fmt", ["g2-16", "int4-pc"])
def test_new_buffers_and_ragged_batch(kernel_path, fmt, partition):
    """Not in place (present_hp fed back as past_hp, onnxruntime's way), a ragged batch."""
    run = Run(fmt, "s2r3", partition, "orth", inplace=False, B=2, seed=4, ragged=[6, 3])
    with gqa.config(path=kernel_path):
        for S in (6, 1, 1, 1, 1, 1, 1):
            q, out, T, S = run.step(S)
            run.check(q, out, T, S, TOL, exact_codes=False)
            cap = run.sink + run.recent
            assert run.hk.shape == (2, NKV, min(T, cap), H)        # onnxruntime main's shape


@pytest.mark.parametrize("fmt", ["g2-16", "int8-pt"])
def test_causal_prefill_equals_token_by_token(kernel_path, fmt):
    """window_partition="causal": a prompt gives the same caches, windows and outputs whether
    it is prefilled at once, in chunks or one token per step (the rotations turn up to 64 rows
    at a time: the same bits as one)."""
    runs = [Run(fmt, "s2r3", "causal", "orth", inplace=True, C=80, seed=9) for _ in range(3)]
    outs = []
    with gqa.config(path=kernel_path):
        for run, steps in zip(runs, ([70], [25, 30, 15], [1] * 70)):
            run.rng = np.random.default_rng(21)
            q = run.rng.uniform(-1, 1, (1, 70, (N + 2 * NKV) * H)).astype(F32)
            o = []
            T = 0
            for S in steps:
                x = q[:, T:T + S]
                T += S
                ext = dict(oscar_rotation_k=run.RK, oscar_rotation_v=run.RV, past_hp_key=run.hk,
                           past_hp_value=run.hv, present_hp_key=run.hk, present_hp_value=run.hv,
                           present_key=run.pk, present_value=run.pv)
                o.append(run.op(x, None, None, run.pk, run.pv, np.array([T - 1], np.int32),
                                np.array(T, np.int32), **run.codec.kw, **ext)[0])
            outs.append(np.concatenate(o, axis=1))
    for run in runs[1:]:
        assert np.array_equal(run.pk, runs[0].pk) and np.array_equal(run.pv, runs[0].pv)
        assert np.array_equal(run.hk, runs[0].hk) and np.array_equal(run.hv, runs[0].hv)
    np.testing.assert_allclose(outs[1], outs[0], atol=2e-6, rtol=0)
    np.testing.assert_allclose(outs[2], outs[0], atol=2e-6, rtol=0)


def _wide_windows_run(fmt, rot, seed):
    """A Run with windows wider than the flash tiles: sink 9, recent 17."""
    run = Run(fmt, "s2r3", "causal", rot, inplace=True, C=80, seed=seed)
    run.sink, run.recent = 9, 17
    run.op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=9, recent_size=17,
                                     **run.codec.attrs)
    run.hk, run.hv = np.zeros((1, NKV, 26, H), F32), np.zeros((1, NKV, 26, H), F32)
    return run


@pytest.mark.parametrize("blocks", [(3, 7), (8, 16), (16, 64)], ids=["3x7", "8x16", "16x64"])
@pytest.mark.parametrize("fmt", ["g4-8-fp16", "int4-pc"])
def test_causal_windows_in_flash_tiles(kernel_path, fmt, blocks):
    """Causal windows of multi-token steps on the tiled flash path: tiles a row reads as codes,
    as floats and both ways (sinks and recent rows of every row's own end), against float64."""
    run = _wide_windows_run(fmt, "orth", seed=31)
    with gqa.config(path=kernel_path, flash=True, flash_blocks=blocks):
        for S in (40, 1, 30, 1):    # T <= 72: (T + 2 H + 16) u |v| ~ 1e-5
            q, out, T, S = run.step(S)
            run.check(q, out, T, S, TOL, exact_codes=False)


def test_causal_windows_in_flash_tiles_keep_nan_and_inf_to_their_rows(kernel_path):
    """An infinite value and a NaN key in a prompt: the tiled path gives the rows that read
    them the per-row path's NaN / inf, and every other row its finite value."""
    outs = []
    for flash in (True, False):
        run = _wide_windows_run("int4-pc", "none", seed=32)
        q, k, v = (run.rng.uniform(-1, 1, (1, 40, w * H)).astype(F32) for w in (N, NKV, NKV))
        v[0, 20, 3] = np.inf        # a recent row of rows 20-36, history for the rows after
        k[0, 2, 5] = np.nan         # a sink: every row from 2 on
        q[0, 0:2] = 0.0
        with gqa.config(path=kernel_path, flash=flash, flash_blocks=(8, 16) if flash else None):
            outs.append(run.op(q, k, v, run.pk, run.pv, np.array([39], np.int32), np.array(40, np.int32),
                               present_key=run.pk, present_value=run.pv, past_hp_key=run.hk,
                               past_hp_value=run.hv, present_hp_key=run.hk, present_hp_value=run.hv,
                               **run.codec.kw)[0])
    tiled, per_row = outs
    assert np.isfinite(per_row[0, :2]).all() and np.isnan(per_row[0, 2:]).any()
    assert np.array_equal(np.isnan(tiled), np.isnan(per_row))
    assert np.array_equal(np.isinf(tiled), np.isinf(per_row))
    ok = np.isfinite(per_row)
    np.testing.assert_allclose(tiled[ok], per_row[ok], atol=2e-6, rtol=0)


def test_per_call_prefill_differs_from_causal():
    """The two partitions agree on decode steps and differ on a multi-token step (onnxruntime
    main's per-call partition quantizes a prompt row's recent neighbours)."""
    a = Run("g2-16", "s2r3", "causal", "none", inplace=True, seed=5)
    b = Run("g2-16", "s2r3", "per_call", "none", inplace=True, seed=5)
    qa, oa, _, _ = a.step(9)
    qb, ob, _, _ = b.step(9)
    assert np.array_equal(qa, qb) and np.abs(oa - ob).max() > 1e-3
    assert np.array_equal(a.pk, b.pk) and np.array_equal(a.hk, b.hk)
    _, oa, _, _ = a.step(1)
    _, ob, _, _ = b.step(1)
    assert np.array_equal(oa, ob)


def test_long_in_place_hand_over(kernel_path):
    """400 decode steps with sink 3 / recent 5: at every step the windows hold exactly the
    float rows of positions [0, 3) and [T - 5, T), and every row's codes are the codec of its
    values (the rows leaving the recent window were quantized when written)."""
    run = Run("g2-16", "s2r3", "causal", "none", inplace=True, C=420, seed=8)
    run.sink, run.recent = 3, 5
    run.op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=3, recent_size=5,
                                     **run.codec.attrs)
    run.hk, run.hv = np.zeros((1, NKV, 8, H), F32), np.zeros((1, NKV, 8, H), F32)
    with gqa.config(path=kernel_path):
        run.step(4)
        for i in range(400):
            q, out, T, S = run.step(1)
            ns, nr = window_counts(T, 3, 5)
            assert np.array_equal(run.hk[0, :, :ns], run.K[0, :, :ns])
            assert np.array_equal(run.hk[0, :, ns:ns + nr], run.K[0, :, T - nr:T])
            assert np.array_equal(run.hv[0, :, ns:ns + nr], run.V[0, :, T - nr:T])
            assert np.array_equal(run.pk[0, :, T - 1], run.codec.codes(run.K[:, :, T - 1:T], 0)[0, :, 0])
            if i % 100 == 99:    # T ~ 400 keys: (T + 2H + 16) u |v| ~ 4e-5
                run.check(q, out, T, S, 6e-5, exact_codes=True)


def test_mixed_precision_operator_is_group_query_attention():
    rng = np.random.default_rng(3)
    RK, RV = _orth(5), _orth(6)
    mp = gqa.MixedPrecisionGroupQueryAttention(num_heads=N, kv_num_heads=NKV, kv_quant_group_size=16,
                                               k_quant_rho=0.95, sink_size=2, recent_size=4)
    gq = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP",
                                 v_quant_type="PER_GROUP", kv_cache_bit_width=2,
                                 kv_quant_group_size=16, k_quant_rho=0.95, sink_size=2, recent_size=4)
    w = gqa.group_row_bytes(H, 2, 16)
    x = rng.uniform(-1, 1, (1, 9, (N + 2 * NKV) * H)).astype(F32)
    args = (x, None, None, np.zeros((1, NKV, 9, w), np.uint8), np.zeros((1, NKV, 9, w), np.uint8),
            np.array([8], np.int32), np.array(9, np.int32))
    ext = dict(oscar_rotation_k=RK, oscar_rotation_v=RV)
    a = mp(*args, **ext)
    b = gq(*args, **ext)
    c = gqa.mixed_precision_group_query_attention(*args, num_heads=N, kv_num_heads=NKV,
                                                  kv_quant_group_size=16, k_quant_rho=0.95,
                                                  sink_size=2, recent_size=4, **ext)
    assert len(a) == 5
    for x1, x2, x3 in zip(a, b, c):
        assert np.array_equal(x1, x2) and np.array_equal(x1, x3)
    assert a[3].shape == (1, NKV, 6, H)


def test_hadamard_and_oscar_rotation():
    h = gqa.hadamard(8)
    np.testing.assert_allclose(h @ h.T, np.eye(8), atol=1e-6)
    assert set(np.round(np.abs(h.ravel()) * np.sqrt(8), 6)) == {1.0}
    assert np.allclose(h[0], 1 / np.sqrt(8)) and np.allclose(h[:, 0], 1 / np.sqrt(8))
    r = gqa.oscar_rotation(None, 16, 3)
    assert r.shape == (3, 16, 16)
    np.testing.assert_allclose(r[1] @ r[1].T, np.eye(16), atol=1e-6)
    # the bit-reversal permutation: column bitrev(i) of Hd @ P is column i of Hd
    hd = gqa.hadamard(16)
    for i, br in enumerate([0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15]):
        np.testing.assert_array_equal(r[0][:, br], hd[:, i])
    # calibrated: eigenvectors of a covariance with a known spectrum
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    cov = (u * np.arange(16, 0, -1.0)) @ u.T
    rk, rv = gqa.calibrate_rotations([np.stack([cov, cov])], [np.stack([cov, 2 * cov])])[0]
    assert rk.shape == (2, 16, 16)
    np.testing.assert_allclose(rk[0] @ rk[0].T, np.eye(16), atol=1e-5)
    # R^T C R: U's first column (largest eigenvalue) spread over every coordinate equally
    d = np.diag(rk[0].T.astype(np.float64) @ cov @ rk[0])
    np.testing.assert_allclose(d, np.full(16, np.trace(cov) / 16), rtol=1e-4)
    with pytest.raises(ValueError, match="power of two"):
        gqa.hadamard(12)


def test_rotation_helpers_refuse_by_name():
    """hadamard, oscar_rotation and calibrate_rotations name the argument they cannot take
    (a covariance with a NaN has no eigenvectors; zip() would have dropped a layer)."""
    cov = np.eye(16)[None].repeat(2, 0)
    nan = cov.copy()
    nan[1, 3, 4] = np.nan
    for f, exc, msg in [
        (lambda: gqa.hadamard(8, np.int8), TypeError, "dtype must be a float dtype"),
        (lambda: gqa.hadamard(8, "nonsense"), TypeError, "dtype must be a float dtype"),
        (lambda: gqa.oscar_rotation(None, 16, 0), ValueError, "kv_num_heads must be >= 1"),
        (lambda: gqa.oscar_rotation(None, 16, 2.0), TypeError, "kv_num_heads must be an int"),
        (lambda: gqa.oscar_rotation(cov, 16, 3), ValueError, r"eigenvectors must have shape \(3, 16, 16\)"),
        (lambda: gqa.oscar_rotation(nan, 16), ValueError, r"eigenvectors holds a non-finite element at \[1, 3, 4\]"),
        (lambda: gqa.calibrate_rotations([cov, cov], [cov]), ValueError, "got 2 and 1"),
        (lambda: gqa.calibrate_rotations([cov], [nan]), ValueError, r"output_cov\[0\] holds a non-finite"),
        (lambda: gqa.calibrate_rotations([cov[0]], [cov]), ValueError, r"query_cov\[0\] must have shape"),
        (lambda: gqa.calibrate_rotations([cov[:, :12, :12]], [cov[:, :12, :12]]), ValueError,
         "power of two"),
        (lambda: gqa.calibrate_rotations(3, [cov]), TypeError, "query_cov must be a sequence"),
        (lambda: gqa.calibrate_rotations([np.array([["a"]])], [cov]), TypeError, "query_cov\\[0\\] must be a real array"),
    ]:
        with pytest.raises(exc, match=msg):
            f()
    assert gqa.hadamard(8, np.float16).dtype == np.float16
    np.testing.assert_array_equal(gqa.oscar_rotation(cov, 16, 2), gqa.oscar_rotation(cov, 16))


def test_hadamard_scale_names_the_had_rotation_only():
    """hadamard_scale: c for c times the sign pattern of oscar_rotation(None, H) in every KV
    head (any float type, any scale; the kernels then turn rows in O(H log H)), 0.0 for
    anything else -- one element off by one ulp, one head another rotation, a column's sign."""
    from gqa._rotation import hadamard_scale
    for H in (1, 2, 16, 32, 128, 1024):
        r = gqa.oscar_rotation(None, H, 3)
        assert hadamard_scale(r) == float(np.float32(1 / np.sqrt(H)))
        assert hadamard_scale(r.astype(np.float16)) == float(np.float16(1 / np.sqrt(H)))
        assert hadamard_scale(2 * r) == 2 * hadamard_scale(r)
    r = gqa.oscar_rotation(None, 64, 2)
    bad = r.copy()
    bad[1, 5, 7] = np.nextafter(bad[1, 5, 7], F32(1))
    assert hadamard_scale(bad) == 0.0
    bad = r.copy()
    bad[:, :, 3] *= -1
    assert hadamard_scale(bad) == 0.0
    assert hadamard_scale(np.stack([r[0], r[1][::-1]])) == 0.0          # one head's rows reordered
    assert hadamard_scale(np.stack([gqa.hadamard(64)] * 2)) == 0.0      # Hd without P
    assert hadamard_scale(np.eye(4, dtype=F32)[None]) == 0.0
    assert hadamard_scale(np.zeros((1, 8, 8), F32)) == 0.0


@pytest.mark.parametrize("fmt", ["g4-8-fp16", "int8-pt"])
def test_hadamard_rotation_gives_the_same_bits_on_every_path(fmt):
    """With `+had`'s rotation every path writes the same codes and window rows (each row
    turned by one order of additions, gqa_hadamard_rows), and its outputs agree within the
    float32 contract."""
    paths = [p for p in ("scalar", "avx2", "avx512", "neon") if p in gqa.available_paths()]
    if len(paths) < 2:
        pytest.skip(f"one path here ({paths})")
    got = {}
    for path in paths:
        run = Run(fmt, "s2r3", "causal", "none", inplace=True, seed=5)
        run.RK = run.RV = gqa.oscar_rotation(None, H, NKV)
        outs = []
        with gqa.config(path=path):
            for S in (9, 1, 3, 1):
                q, out, T, S = run.step(S)
                run.check(q, out, T, S, TOL, exact_codes=False)
                outs.append(out)
        got[path] = (run.pk.copy(), run.pv.copy(), run.hk.copy(), run.hv.copy(), outs)
    for path in paths[1:]:
        for a, b in zip(got[paths[0]][:4], got[path][:4]):
            assert np.array_equal(a, b), path
        for a, b in zip(got[paths[0]][4], got[path][4]):
            np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


def test_errors():
    w = gqa.group_row_bytes(H, 2, 16)
    base = dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                kv_cache_bit_width=2, kv_quant_group_size=16)
    with pytest.raises(ValueError, match="beside a quantized cache"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=4)
    with pytest.raises(ValueError, match="sink_size must be in"):
        gqa.GroupQueryAttention(sink_size=-1, **base)
    with pytest.raises(ValueError, match="window_partition must be 'causal' or 'per_call'"):
        gqa.GroupQueryAttention(sink_size=1, window_partition="fixed", **base)
    with pytest.raises(ValueError, match="do not combine with sliding_window_cache"):
        gqa.GroupQueryAttention(sink_size=1, local_window_size=8, sliding_window_cache=1, **base)
    with pytest.raises(TypeError, match="has no k_quant_type"):
        gqa.MixedPrecisionGroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP")
    with pytest.raises(ValueError, match="cache_format_version must be 1"):
        gqa.MixedPrecisionGroupQueryAttention(num_heads=N, kv_num_heads=NKV, cache_format_version=2)
    op = gqa.GroupQueryAttention(sink_size=2, recent_size=3, **base)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 1, (N + 2 * NKV) * H)).astype(F32)
    pk, pv = np.zeros((1, NKV, 8, w), np.uint8), np.zeros((1, NKV, 8, w), np.uint8)
    seq, tot = np.array([4], np.int32), np.array(5, np.int32)
    hk, hv = np.zeros((1, NKV, 5, H), F32), np.zeros((1, NKV, 5, H), F32)
    call = lambda **kw: op(x, None, None, pk, pv, seq, tot, **kw)  # noqa: E731
    before = pk.copy()
    with pytest.raises(ValueError, match="past_hp_key and past_hp_value are required"):
        call()
    with pytest.raises(ValueError, match="past_hp_key has 3 rows; batch entry 0 with 4 past positions needs"):
        call(past_hp_key=hk[:, :, :3], past_hp_value=hv[:, :, :3])
    with pytest.raises(ValueError, match="shall be both present or both absent"):
        call(past_hp_key=hk)
    with pytest.raises(TypeError, match="past_hp_key must have dtype float32"):
        call(past_hp_key=hk.astype(np.float16), past_hp_value=hv.astype(np.float16))
    with pytest.raises(ValueError, match=r"past_hp_key must have shape \(batch_size, kv_num_heads, rows, head_size\)"):
        call(past_hp_key=hk[..., :16], past_hp_value=hv[..., :16])
    with pytest.raises(ValueError, match="present_hp_key has 3 rows"):
        call(past_hp_key=hk, past_hp_value=hv, present_hp_key=np.zeros((1, NKV, 3, H), F32),
             present_hp_value=np.zeros((1, NKV, 3, H), F32))
    with pytest.raises(ValueError, match="in-place windows need present_hp_key is past_hp_key"):
        call(past_hp_key=hk, past_hp_value=hv, present_hp_key=hk, present_hp_value=hv.copy())
    with pytest.raises(ValueError, match="present_hp_value must not overlap past_hp_key"):
        call(past_hp_key=hk, past_hp_value=hv, present_hp_key=hk[:, :, :5].copy(),
             present_hp_value=hk)
    with pytest.raises(ValueError, match=r"oscar_rotation_k must have shape \(kv_num_heads, head_size, head_size\)"):
        call(past_hp_key=hk, past_hp_value=hv, oscar_rotation_k=np.zeros((NKV, H, H - 1), F32))
    with pytest.raises(TypeError, match="oscar_rotation_v must have dtype"):
        call(past_hp_key=hk, past_hp_value=hv, oscar_rotation_v=np.zeros((NKV, H, H), np.int32))
    noww = gqa.GroupQueryAttention(**base)
    with pytest.raises(ValueError, match="past_hp_key needs sink_size or recent_size > 0"):
        noww(x, None, None, pk, pv, seq, tot, past_hp_key=hk, past_hp_value=hv)
    with pytest.raises(ValueError, match="do not take shared KV"):
        op(x[..., :N * H], np.zeros((1, 0, NKV * H), F32), np.zeros((1, 0, NKV * H), F32), pk, pv,
           seq, tot, past_hp_key=hk, past_hp_value=hv)
    assert np.array_equal(pk, before) and not hk.any()


def test_step_inputs_must_not_alias_the_windows():
    """Checked on every call (the query changes from step to step), before anything is written."""
    base = dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
                kv_cache_bit_width=4, kv_quant_group_size=16, sink_size=1, recent_size=2)
    op = gqa.GroupQueryAttention(**base)
    w = gqa.group_row_bytes(H, 4, 16)
    pk, pv = np.zeros((1, NKV, 8, w), np.uint8), np.zeros((1, NKV, 8, w), np.uint8)
    hk, hv = np.zeros((1, NKV, 3, H), F32), np.zeros((1, NKV, 3, H), F32)
    ext = dict(past_hp_key=hk, past_hp_value=hv, present_hp_key=hk, present_hp_value=hv)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 1, (N + 2 * NKV) * H)).astype(F32)
    k = x[..., N * H:(N + NKV) * H].copy()
    op(x[..., :N * H].copy(), k, k.copy(), pk, pv, np.array([0], np.int32), np.array(1, np.int32), **ext)
    before = (pk.copy(), hk.copy())
    # in place the past windows are the buffers written, and are named so (as past_key in place)
    alias = hv.reshape(-1)[:N * H].reshape(1, 1, -1)
    with pytest.raises(ValueError, match="past_hp_value must not overlap query"):
        op(alias, k, k.copy(), pk, pv, np.array([1], np.int32), np.array(2, np.int32), **ext)
    assert np.array_equal(pk, before[0]) and np.array_equal(hk, before[1])


def test_float16_inputs_keep_float16_windows(kernel_path):
    """float16 inputs: the windows are float16 buffers; against the same steps in float32 (inputs
    rounded to half), the outputs agree within what half rounding allows -- an output rounding
    (2^-11 relative) plus codes of rows rounded to half before quantization, at most one INT4
    step (range / 15) apart -- and the window rows within half rounding."""
    a = dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
             kv_cache_bit_width=4, kv_quant_group_size=16, sink_size=2, recent_size=3)
    w = gqa.group_row_bytes(H, 4, 16)
    R = gqa.oscar_rotation(None, H, NKV)
    runs = {}
    for dt in (np.float32, np.float16):
        op = gqa.GroupQueryAttention(**a)
        pk = np.zeros((1, NKV, 20, w), np.uint8)
        pv = pk.copy()
        hk, hv = np.zeros((1, NKV, 5, H), dt), np.zeros((1, NKV, 5, H), dt)
        r = np.random.default_rng(1)
        outs, T = [], 0
        for S in (6, 1, 1, 3, 1):
            x = r.uniform(-1, 1, (1, S, (N + 2 * NKV) * H)).astype(np.float16).astype(dt)
            T += S
            res = op(x, None, None, pk, pv, np.array([T - 1], np.int32), np.array(T, np.int32),
                     past_hp_key=hk, past_hp_value=hv, oscar_rotation_k=R, oscar_rotation_v=R,
                     present_key=pk, present_value=pv, present_hp_key=hk, present_hp_value=hv)
            assert res[0].dtype == dt and len(res) == 5
            outs.append(res[0].astype(np.float32))
        runs[dt] = (np.concatenate(outs, 1), hk.astype(np.float32))
    (o32, h32), (o16, h16) = runs[np.float32], runs[np.float16]
    assert np.all(np.isfinite(o16))
    np.testing.assert_allclose(h16, h32, atol=2e-3, rtol=0)     # |x| <= ~2: half's step 2^-10
    np.testing.assert_allclose(o16, o32, atol=2e-2, rtol=0)
