"""gqa.KVCache, the decoding-loop API: the same bits as a hand-written loop over the operator,
the calibration rule, copy_from against the NumPy quantizer, rollback, and its errors (each a
ValueError/TypeError naming the problem, nothing written, the length unchanged).  Small
synthetic shapes: no model needed."""
import copy

import numpy as np
import pytest

import gqa
from gqa import CacheFormat, needs_scales


def parse_mode(mode):
    """(K's, V's) format names of a mode."""
    return tuple(f.name for f in gqa.parse_mode(mode))


def mode_name(k, v):
    return gqa.mode_name(CacheFormat.parse(k), CacheFormat.parse(v))

from _reference import quantize_ref

L, B, N, NKV, H, M = 3, 1, 6, 2, 16, 40
MODES = ["float", "int8-pt", "int8-pc", "int4-pt", "int4-pc", "int8-pc/pt", "int4-pt/pc"]


def _steps(seed, sizes=(7, 1, 1, 3, 1), B=B):
    """Per step and layer (q, k, v) float32, drawn once."""
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal((B, S, N * H), np.float32), rng.standard_normal((B, S, NKV * H), np.float32),
              rng.standard_normal((B, S, NKV * H), np.float32)) for _ in range(L)] for S in sizes]


def _scales(mode, seed=1):
    rng = np.random.default_rng(seed)
    k_mode, v_mode = parse_mode(mode)
    if k_mode == "float":
        return None, None
    size = lambda m: NKV * H if m.endswith("pc") else 1  # noqa: E731
    return ([rng.uniform(0.01, 0.05, size(k_mode)).astype(np.float32) for _ in range(L)],
            [rng.uniform(0.01, 0.05, size(v_mode)).astype(np.float32) for _ in range(L)])


def _cache(mode="float", rotary=True, B=B, **kw):
    if not {"k_scales", "v_scales", "calibration"} & set(kw) and needs_scales(mode):
        kw["k_scales"], kw["v_scales"] = _scales(mode)
    return gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=M,
                       batch_size=B, mode=mode, rotary=gqa.rotary_caches(M, H) if rotary else None, **kw)


@pytest.mark.parametrize("B, sizes", [(1, (7, 1, 1, 3, 1)), (3, (5, 1, 1))], ids=["B1", "B3"])
@pytest.mark.parametrize("mode", MODES)
def test_loop_equals_the_hand_written_operator_loop(mode, B, sizes):
    """The same outputs and caches, bit for bit, as per-layer buffers, seqlens_k / total
    bookkeeping and group_query_attention calls written by hand; layers in any order.
    (A batch takes one token per step after its prompt: the operator's contract.)"""
    cache = _cache(mode, B=B)
    k_mode, v_mode = parse_mode(mode)
    ks, vs = _scales(mode)
    attrs = dict(num_heads=N, kv_num_heads=NKV, do_rotary=1)
    if k_mode != "float":
        attrs.update(k_quant_type="PER_CHANNEL" if k_mode.endswith("pc") else "PER_TENSOR",
                     v_quant_type="PER_CHANNEL" if v_mode.endswith("pc") else "PER_TENSOR",
                     kv_cache_bit_width=int(k_mode[3]))
    kc = [np.zeros_like(a) for a in cache.key]
    vc = [np.zeros_like(a) for a in cache.value]
    cos, sin = gqa.rotary_caches(M, H)
    T = 0
    for i, step in enumerate(_steps(0, sizes, B)):
        S = step[0][0].shape[1]
        T += S
        order = range(L) if i % 2 else reversed(range(L))
        for li in order:
            q, k, v = step[li]
            got = cache.attend(li, q, k, v)
            want = gqa.group_query_attention(
                q, k, v, kc[li], vc[li], np.full(B, T - 1, np.int32), T, cos, sin,
                k_scale=None if ks is None else ks[li], v_scale=None if vs is None else vs[li],
                present_key=kc[li], present_value=vc[li], **attrs)[0]
            np.testing.assert_array_equal(got, want)
        assert cache.length == T
    for li in range(L):
        np.testing.assert_array_equal(cache.key[li][:, :, :T], kc[li][:, :, :T])
        np.testing.assert_array_equal(cache.value[li][:, :, :T], vc[li][:, :, :T])


def test_packed_qkv_and_layout():
    cache = _cache("int4-pc/pt")
    assert cache.key[0].shape == (B, NKV, M, H // 2) and cache.key[0].dtype == np.uint8
    assert _cache("int8-pt").value[1].dtype == np.int8 and _cache().key[0].dtype == np.float32
    (q, k, v), = _steps(3, (2,))[0][:1]
    a = cache.attend(0, np.concatenate([q, k, v], -1), None, None)
    ref = _cache("int4-pc/pt")
    np.testing.assert_array_equal(a, ref.attend(0, q, k, v))
    np.testing.assert_array_equal(cache.key[0], ref.key[0])
    per_pos = L * 2 * B * NKV * (H // 2)
    assert cache.nbytes == per_pos * M + sum(s.nbytes for s in cache.k_scales + cache.v_scales)


def test_calibration_rule():
    """Per channel: absmax over the calibration rows (and batch) / top code; per tensor: the
    maximum over channels; margin multiplies; the floor keeps an all-zero channel quantizable."""
    f = _cache(rotary=False, B=2)
    steps = _steps(5, (6, 1, 1), B=2)
    kin = [[] for _ in range(L)]
    vin = [[] for _ in range(L)]
    for step in steps:
        for li, (q, k, v) in enumerate(step):
            k = k.copy()
            k[..., 3] = 0.0                       # channel 3 of KV head 0 never moves
            f.attend(li, q, k, v)
            kin[li].append(k)
            vin[li].append(v)
    cal = f.calibration()
    assert cal.tokens == 2 * f.length
    for li in range(L):
        ka = np.abs(np.concatenate(kin[li], 1)).max(axis=(0, 1))      # [Nkv*H], element j*H + c
        va = np.abs(np.concatenate(vin[li], 1)).max(axis=(0, 1))
        np.testing.assert_array_equal(cal.k_absmax[li], ka)
        q = _cache("int8-pc/pt", rotary=False, calibration=cal, B=2)
        np.testing.assert_allclose(q.k_scales[li], np.maximum(ka / 127, 1e-6), rtol=1e-7)
        assert q.k_scales[li][3] == np.float32(1e-6)
        np.testing.assert_allclose(q.v_scales[li], [va.max() / 127], rtol=1e-7)
        q4 = _cache("int4-pt", rotary=False, calibration=cal, margin=1.5, B=2)
        np.testing.assert_allclose(q4.k_scales[li], [ka.max() * 1.5 / 7], rtol=1e-7)
    both = cal.combined(f.calibration())
    np.testing.assert_array_equal(both.k_absmax[0], cal.k_absmax[0])
    assert both.tokens == 2 * cal.tokens


@pytest.mark.parametrize("k_scales, v_scales", [
    (0.03125, np.float32(0.0625)),                                    # numbers
    (np.array(0.03125, np.float32), [0.0625, np.float32(0.0625), np.array([0.0625], np.float32)]),
    ([[0.03125]] * L, (0.0625,) * L),                                # nested sequences
], ids=["numbers", "0-d-and-mixed", "nested"])
def test_per_tensor_scales_in_every_spelling_store_the_same_codes(k_scales, v_scales):
    """One scale for every layer (a number, a 0-d or 1-element array) or one per layer (numbers,
    arrays, sequences) are the same per-tensor scales as one float32 array per layer."""
    ref = _cache("int8-pt", k_scales=[np.array([0.03125], np.float32)] * L,
                 v_scales=[np.array([0.0625], np.float32)] * L)
    got = _cache("int8-pt", k_scales=k_scales, v_scales=v_scales)
    for li in range(L):
        assert got.k_scales[li].dtype == np.float32 and got.k_scales[li].shape == (1,)
        assert got.k_scales[li][0] == np.float32(0.03125) and got.v_scales[li][0] == np.float32(0.0625)
    for step in _steps(3, (4, 1)):
        for li, (q, k, v) in enumerate(step):
            np.testing.assert_array_equal(got.attend(li, q, k, v), ref.attend(li, q, k, v))
    for a, b in zip(got.key + got.value, ref.key + ref.value):
        np.testing.assert_array_equal(a, b)


def test_rotary_caches_refuse_what_has_no_embedding():
    for args, exc, msg in [((0, 16), ValueError, "max_positions must be >= 1"),
                           ((8, 15), ValueError, "rotary_dim must be even"),
                           ((8, 0), ValueError, "rotary_dim must be >= 2"),
                           ((8.0, 16), TypeError, "max_positions must be an int"),
                           ((8, 16, 0.0), ValueError, "base must be > 0"),
                           ((8, 16, float("nan")), ValueError, "base must be finite"),
                           ((8, 16, "1e4"), TypeError, "base must be a real number")]:
        with pytest.raises(exc, match=msg):
            gqa.rotary_caches(*args)
    cos, sin = gqa.rotary_caches(np.int64(3), np.uint32(4), np.float32(100.0))
    ang = np.arange(3)[:, None] * 100.0 ** (-np.arange(0, 4, 2) / 4)[None]
    np.testing.assert_array_equal(cos, np.cos(ang).astype(np.float32))
    np.testing.assert_array_equal(sin, np.sin(ang).astype(np.float32))


@pytest.mark.parametrize("mode", ["int8-pc/pt", "int4-pc", "int4-pt"])
def test_copy_from_quantizes_as_the_operator_writes(mode):
    """A float cache copied into a quantized one: codes equal the NumPy quantizer's of the
    float rows, and equal the cache the operator wrote itself from the same steps."""
    src, direct = _cache(), _cache(mode)
    for step in _steps(7):
        for li, (q, k, v) in enumerate(step):
            src.attend(li, q, k, v)
            direct.attend(li, q, k, v)
    dst = _cache(mode)
    dst.copy_from(src, 10)
    assert dst.length == 10
    bits = int(mode[3])
    for li in range(L):
        for got, rows, scale, m in ((dst.key, src.key, dst.k_scales, parse_mode(mode)[0]),
                                    (dst.value, src.value, dst.v_scales, parse_mode(mode)[1])):
            for h in range(NKV):
                s = scale[li][h * H:(h + 1) * H] if m.endswith("pc") else scale[li]
                np.testing.assert_array_equal(got[li][:, h, :10], quantize_ref(rows[li][:, h, :10], s, bits))
        np.testing.assert_array_equal(dst.key[li][:, :, :10], direct.key[li][:, :, :10])
        np.testing.assert_array_equal(dst.value[li][:, :, :10], direct.value[li][:, :, :10])
    with pytest.raises(ValueError, match="float cache or one of this mode"):
        _cache("int8-pt").copy_from(dst)


@pytest.mark.parametrize("kw", [dict(mode="int4-pc", rotations="hadamard"),
                                dict(mode="int4-g8", sink_size=2, recent_size=3, rotations="hadamard"),
                                dict(mode="int2-g16", sink_size=1, recent_size=4, k_rho=0.9)],
                         ids=["static+rotation", "group+windows+rotation", "group+windows"])
def test_copy_from_with_groups_windows_and_rotations(kw):
    """A float cache copied into per-group / windowed / rotated caches holds what the operator
    writes from the same steps: codes and float windows (the Hadamard product is exact)."""
    src, direct = _cache(), _cache(**kw)
    for step in _steps(7):
        for li, (q, k, v) in enumerate(step):
            src.attend(li, q, k, v)
            direct.attend(li, q, k, v)
    dst = _cache(**kw)
    dst.copy_from(src)
    for li in range(L):
        np.testing.assert_array_equal(dst.key[li], direct.key[li])
        np.testing.assert_array_equal(dst.value[li], direct.value[li])
        if dst.hp_key[li] is not None:
            np.testing.assert_array_equal(dst.hp_key[li], direct.hp_key[li])
            np.testing.assert_array_equal(dst.hp_value[li], direct.hp_value[li])
    if kw.get("recent_size"):
        with pytest.raises(ValueError, match="held in its codes only"):
            dst.truncate(3)


def test_truncate_rolls_back_exactly():
    steps = _steps(9)
    a = _cache("int8-pc")
    for step in steps[:3]:
        for li, (q, k, v) in enumerate(step):
            a.attend(li, q, k, v)
    n = a.length
    for li, (q, k, v) in enumerate(steps[3]):     # a speculative step, then rejected
        a.attend(li, q, k, v)
    a.truncate(n)
    b = _cache("int8-pc")
    for step in steps[:3]:
        for li, (q, k, v) in enumerate(step):
            b.attend(li, q, k, v)
    for li, (q, k, v) in enumerate(steps[4]):
        np.testing.assert_array_equal(a.attend(li, q, k, v), b.attend(li, q, k, v))
    a.reset()
    assert a.length == 0


@pytest.mark.parametrize("mode", ["int8-pc", "int4-g16+s2r3+had"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_cache_goes_on_as_the_original(mode, how):
    """copy.deepcopy / pickle of a cache in use (its operators hold checked signatures of its
    own buffers): the copy's next steps equal the original's, bit for bit, and neither writes
    the other's buffers."""
    import copy
    import pickle
    steps = _steps(13)
    a = _cache(mode)
    for step in steps[:3]:
        for li, (q, k, v) in enumerate(step):
            a.attend(li, q, k, v)
    b = copy.deepcopy(a) if how == "deepcopy" else pickle.loads(pickle.dumps(a))
    assert b.length == a.length and b.mode == a.mode
    before = [x.copy() for x in a.key + a.value]
    for step in steps[3:]:
        for li, (q, k, v) in enumerate(step):
            np.testing.assert_array_equal(b.attend(li, q, k, v), a.attend(li, q, k, v))
    for x, y in zip(a.key + a.value, b.key + b.value):
        assert not np.shares_memory(x, y)
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, y) for x, y in zip(a.key + a.value, before))


def _snapshot(c):
    return [x.copy() for x in c.key + c.value], c.length


def _unchanged(c, snap):
    arrays, length = snap
    assert c.length == length
    for x, y in zip(c.key + c.value, arrays):
        np.testing.assert_array_equal(x, y)


def test_errors_name_the_problem_and_write_nothing():
    c = _cache("int8-pt")
    q, k, v = _steps(11, (1,))[0][0]
    c.attend(0, q, k, v)
    snap = _snapshot(c)
    for layer, exc, msg in ((3, ValueError, r"layer must be in \[0, 3\)"), (-1, ValueError, "layer must be"),
                            (1.0, TypeError, "layer must be an int"),
                            (0, ValueError, "layer 0 already holds this step")):
        with pytest.raises(exc, match=msg):
            c.attend(layer, q, k, v)
        _unchanged(c, snap)
    q2, k2, v2 = _steps(12, (2,))[0][0]
    with pytest.raises(ValueError, match="this step gives 1 tokens to the other layers; layer 1 got 2"):
        c.attend(1, q2, k2, v2)
    with pytest.raises(ValueError, match="query"):        # the operator's own check
        c.attend(1, q[:, :, :-1], k, v)
    _unchanged(c, snap)
    full = _cache()
    qf, kf, vf = _steps(13, (M,))[0][0]
    for li in range(L):
        full.attend(li, qf, kf, vf)
    snap = _snapshot(full)
    with pytest.raises(ValueError, match=f"KVCache is full: {M} \\+ 1 positions exceed max_length \\({M}\\)"):
        full.attend(0, q, k, v)
    _unchanged(full, snap)


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(mode="int3"), ValueError, "mode='int3' is not a cache mode"),
    (dict(mode="int8-pc/pq"), ValueError, "is not a cache mode"),
    (dict(mode=8), TypeError, "mode must be a str"),
    (dict(k_mode="int4-g16", v_mode="int2-g8"), ValueError, "share one group size and metadata type"),
    (dict(mode="int4-pc/int2-g16", k_scales=[np.ones(32, np.float32)] * L, v_scales=[np.ones(1, np.float32)] * L),
     ValueError, "v_scales must not be given: V's mode 'int2-g16' is per-group"),
    (dict(mode="int4-pc/int2-g16"), ValueError, r"give k_scales, or a calibration"),
    (dict(mode="int4-pt/int2-g16", k_rho=0.9, k_scales=np.ones(1, np.float32)), ValueError,
     "k_rho=0.9: the clip quantile applies to a per-group mode"),
    (dict(mode="int4-g16/float"), ValueError, "is not a cache mode"),
    (dict(k_mode="float", v_mode="int8-pt"), ValueError, "must both be float or both quantized"),
    (dict(k_mode="int8-pt"), ValueError, "k_mode and v_mode go together"),
    (dict(mode="int8-pt", k_scales=None, v_scales=None), ValueError, "give k_scales and v_scales, or a calibration"),
    (dict(mode="float", k_scales=[np.ones(1, np.float32)] * L), ValueError, "float cache: it takes no k_scales"),
    (dict(mode="int8-pc", k_scales=[np.ones(3, np.float32)] * L, v_scales=[np.ones(32, np.float32)] * L),
     ValueError, r"k_scales\[0\] must have 32 elements for int8-pc, got 3"),
    (dict(mode="int8-pt", k_scales=[np.ones(1, np.float32)] * 2, v_scales=np.ones(1, np.float32)),
     ValueError, r"k_scales must hold one array per layer \(3\), got 2"),
    (dict(mode="int8-pt", k_scales=np.array([np.nan], np.float32), v_scales=np.ones(1, np.float32)),
     ValueError, r"k_scales\[0\] holds a non-finite scale"),
    (dict(mode="int8-pt", k_scales=[np.ones(1, np.float32), np.zeros(1, np.float32), np.ones(1, np.float32)],
          v_scales=1.0), ValueError, r"k_scales\[1\] element 0 is 0.0: scales must be > 0"),
    (dict(mode="int8-pc", k_scales=np.r_[np.ones(31), -1].astype(np.float32), v_scales=0.5), ValueError,
     r"k_scales\[0\] element 31 is -1.0: scales must be > 0"),
    (dict(mode="int8-pc", k_scales=0.5, v_scales=0.5), ValueError, r"k_scales\[0\] must have 32 elements"),
    (dict(mode="int8-pt", k_scales="0.5", v_scales=0.5), TypeError, "k_scales must be a number or float32 array"),
    (dict(mode="int8-pt", k_scales=True, v_scales=0.5), TypeError, "k_scales must be a number or float32 array"),
    (dict(mode="int8-pt", k_scales=0.5, v_scales=[0.5, "a", 0.5]), TypeError, r"v_scales\[1\] must be a number"),
    (dict(mode="int8-pt", k_scales=0.5, v_scales=[0.5, None, 0.5]), TypeError, r"v_scales\[1\] must be a number"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(softcap=float("inf")), ValueError, "softcap must be finite and >= 0"),
    (dict(max_length=0), ValueError, "max_length must be >= 1"),
    (dict(num_layers=2.5), TypeError, "num_layers must be an int"),
    (dict(dtype=np.float64), TypeError, "dtype must be float32 or float16"),
    (dict(rotary=gqa.rotary_caches(M - 1, H)), ValueError, "P >= max_length"),
    (dict(rotary=3), TypeError, r"rotary must be None or a pair \(cos_cache, sin_cache\)"),
    # checked at construction, not at the first attend
    (dict(num_threads=0), ValueError, "num_threads must be >= 1"),
    (dict(num_threads=1.5), TypeError, "num_threads must be a positive int"),
    (dict(max_length=2 ** 31), ValueError, "max_length must be <= 2147483647"),
    (dict(head_size=12, rotary=None), ValueError, "head_size must be a multiple of 8"),
    (dict(head_size=24), ValueError, "head_size shall be a multiple of 16 when rotary"),
    (dict(mode="int4-g16+s2r2+had", head_size=24, rotary=None), ValueError, "power of two"),
    (dict(mode="int4-g16", rotations=3), TypeError, "rotations must be None, 'hadamard' or a list"),
    (dict(mode="int4-g16", rotations=[(1, 2, 3)] * L), TypeError,
     r"rotations\[0\] must be a pair \(R_K, R_V\) .* got tuple of length 3"),
    (dict(mode="int4-g16", rotations=[np.eye(H)] * L), TypeError, r"rotations\[0\] must be a pair"),
    (dict(mode="int4-g16", rotations=[(2 * np.eye(H)[None].repeat(NKV, 0), None)] * L), ValueError,
     r"oscar_rotation_k\[0\] is not orthogonal"),
    (dict(mode="int4-g16+s2r2", sink_size=2 ** 31 - 1, recent_size=1), ValueError, "sets sink_size"),
    (dict(mode="int4-g16", sink_size=2 ** 31 - 1, recent_size=1), ValueError,
     r"sink_size \+ recent_size .* must be <= 2147483647"),
    (dict(mode="int4-g16+s2r2", rollback_size=-1), ValueError, "rollback_size must be >= 0"),
    (dict(mode="int4-g16+s2r2", rollback_size=2.0), TypeError, "rollback_size must be an int"),
    (dict(mode="int4-g16+s2r2", rollback_size=2 ** 31), ValueError, "rollback_size must be <= 2147483647"),
])
def test_construction_errors(kw, exc, msg):
    args = dict(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=M,
                rotary=gqa.rotary_caches(M, H))
    args.update(kw)
    with pytest.raises(exc, match=msg):
        gqa.KVCache(**args)


def test_construction_leaves_the_caches_untouched():
    """The construction-time checks run the operator on scratch rows, not on the caches."""
    c = _cache("int4-g16+s2r2+had")
    assert not any(a.any() for a in c.key + c.value + c.hp_key + c.hp_value)
    assert all(not op._signatures for op in c.ops)


def test_attend_errors_speak_in_the_caches_terms():
    c = _cache("int4-g16", B=2)
    q, k, v = _steps(21, (1,), B=2)[0][0]
    cases = [
        ((q[..., :-8], k, v), ValueError,
         rf"query must have shape \[batch_size, S, num_heads \* head_size\] = \[2, 1, {N} \* {H} = {N * H}\], "
         rf"got \(2, 1, {N * H - 8}\)"),
        ((q, k[..., :-8], v), ValueError, rf"key must have shape .* = \[2, 1, {NKV} \* {H} = {NKV * H}\]"),
        ((q[:1], k[:1], v[:1]), ValueError, r"query must have shape .* = \[2, 1,"),
        ((q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)), TypeError,
         "query must have this KVCache's dtype float32, got float16"),
        ((q, k, v.tolist()), TypeError, "value must be a numpy.ndarray"),
        ((np.concatenate([q, k, v], -1)[..., :-8], None, None), ValueError,
         r"query must have shape \[batch_size, S, \(num_heads \+ 2 \* kv_num_heads\) \* head_size\]"),
    ]
    snap = _snapshot(c)
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            c.attend(0, *args)
        _unchanged(c, snap)


@pytest.mark.parametrize("mode, steps, n", [
    ("int4-g16+s4r3", (2, 1, 1, 1, 1), 3),     # length 6 > 4 + 3 - 1: back to n <= sink_size
    ("int4-g16+s4r3", (2, 1, 1, 1, 1), 0),
    ("int4-g16+s2r6", (3, 1, 1, 1), 4),        # length 6 <= sink + recent: every float row held
    ("int2-g16+s0r8", (2, 1, 1, 1), 2),
])
def test_truncate_keeps_windows_exact_where_it_can(mode, steps, n):
    """Truncating a windowed cache to n positions gives the cache that attended n positions
    (codes and windows), so the next steps give the same outputs bit for bit."""
    sizes = list(steps) + [1, 1]
    all_steps = _steps(31, tuple(sizes))
    a, b = _cache(mode), _cache(mode)
    pos = 0
    for step, S in zip(all_steps, sizes):
        if pos >= 6:
            break
        for li, (q, k, v) in enumerate(step):
            a.attend(li, q, k, v)
        pos += S
    a.truncate(n)
    # b: the first n positions alone (token by token where the steps split them)
    rng = np.random.default_rng(5)
    flat = [np.concatenate([st[li][i] for st in all_steps], axis=1) for li in range(L) for i in range(3)]
    if n:
        for li in range(L):
            q, k, v = (flat[3 * li + i][:, :n] for i in range(3))
            b.attend(li, q, k, v)
    assert a.length == b.length == n
    for li in range(L):
        np.testing.assert_array_equal(a.key[li][:, :, :n], b.key[li][:, :, :n])
        np.testing.assert_array_equal(a.hp_key[li], b.hp_key[li])
        np.testing.assert_array_equal(a.hp_value[li], b.hp_value[li])
    q, k, v = (rng.standard_normal(s, np.float32) for s in ((B, 1, N * H), (B, 1, NKV * H), (B, 1, NKV * H)))
    for li in range(L):
        np.testing.assert_array_equal(a.attend(li, q, k, v), b.attend(li, q, k, v))


def test_truncate_that_the_windows_lost_says_how_to_get_there():
    c = _cache("int4-g16+s2r3")
    for step in _steps(41, (6, 1, 1)):
        for li, (q, k, v) in enumerate(step):
            c.attend(li, q, k, v)
    snap = _snapshot(c)
    hp = [x.copy() for x in c.hp_key]
    with pytest.raises(ValueError, match=r"truncate\(5\): .* positions \[2, 5\) of this cache are held in its "
                                         r"codes only.* up to sink_size = 2 .*copy_from\(float_cache, 5\)"):
        c.truncate(5)
    _unchanged(c, snap)
    assert all(np.array_equal(x, y) for x, y in zip(hp, c.hp_key))


def _run(c, steps):
    for step in steps:
        for li, (q, k, v) in enumerate(step):
            c.attend(li, q, k, v)


@pytest.mark.parametrize("mode", ["int4-g16+s2r3", "int8-g16+s1r4+had"])
def test_rollback_rows_take_rejected_steps_back(mode):
    """With rollback_size = m the float rows of the last m positions that left the recent
    window are kept: truncate takes any of the last m positions back (speculative decoding's
    rejected tokens), and the cache equals one that never had them -- codes, windows and the
    next step's outputs, bit for bit; one position further back is refused and changes
    nothing.  rollback_floor says where that line is."""
    steps = _steps(43, (6, 1, 1, 3, 1, 2, 1))
    m = 4
    a = _cache(mode, rollback_size=m)
    assert a.rollback_size == m and a.undo_key[0].shape == (B, NKV, m, H)
    _run(a, steps[:-1])                      # 14 positions: the recent window holds [11, 14)
    n = a.length
    assert a.rollback_floor.tolist() == [n - m]
    for back in range(m + 1):
        c = copy.deepcopy(a)
        target = n - back
        c.truncate(target)
        ref = _cache(mode)
        flat = [np.concatenate([st[li][i] for st in steps[:-1]], axis=1) for li in range(L) for i in range(3)]
        for li in range(L):
            ref.attend(li, *(flat[3 * li + i][:, :target] for i in range(3)))
        for li in range(L):
            for x, y in ((c.hp_key, ref.hp_key), (c.hp_value, ref.hp_value)):
                np.testing.assert_array_equal(x[li], y[li])
            np.testing.assert_array_equal(c.key[li][:, :, :target], ref.key[li][:, :, :target])
        for li, (q, k, v) in enumerate(steps[-1]):
            np.testing.assert_array_equal(c.attend(li, q, k, v), ref.attend(li, q, k, v))
    snap, hp = _snapshot(a), [x.copy() for x in a.hp_key + a.undo_key]
    with pytest.raises(ValueError, match=rf"truncate\({n - m - 1}\): .*rollback_size={m} .*"
                                         rf"rollback_floor = {n - m} on"):
        a.truncate(n - m - 1)
    _unchanged(a, snap)
    assert all(np.array_equal(x, y) for x, y in zip(hp, a.hp_key + a.undo_key))
    a.truncate(a.sink_size)                  # within the sink: always
    assert a.length == a.sink_size and a.rollback_floor.tolist() == [0]


def test_a_step_abandoned_part_way_is_taken_back():
    """truncate during a step (some layers had it) takes those layers' float windows back as
    well: they had rolled one step ahead, and were left so (every later output of those layers
    read a wrong window).  Without rollback rows that needs a position the windows dropped, so
    it is refused and the step can be finished."""
    steps = _steps(47, (9, 1, 1, 1))
    ref = _cache("int4-g16+s1r4")
    _run(ref, steps[:2])
    for m, ok in ((1, True), (0, False)):
        c = _cache("int4-g16+s1r4", rollback_size=m)
        _run(c, steps[:2])
        for li in (0, 2):                              # a step given to layers 0 and 2 only
            c.attend(li, *steps[2][li])
        if not ok:
            with pytest.raises(ValueError, match=r"truncate\(10\): .*held in its codes only"):
                c.truncate(c.length)
            c.attend(1, *steps[2][1])                  # finish it instead
            assert c.length == 11
            continue
        c.truncate(c.length)
        assert c.length == 10
        for li in range(L):
            np.testing.assert_array_equal(c.hp_key[li], ref.hp_key[li])
            np.testing.assert_array_equal(c.hp_value[li], ref.hp_value[li])
        for li, (q, k, v) in enumerate(steps[3]):
            np.testing.assert_array_equal(c.attend(li, q, k, v), ref.attend(li, q, k, v))


def test_rollback_rows_follow_take_copy_from_and_copies():
    """take() carries each sequence's rollback rows, copy_from a float cache fills them (so a
    cached prefix can be rolled back too), a deep copy holds its own; take() during a step is
    refused (its layers' windows would disagree); the rows count in nbytes."""
    import pickle
    steps = _steps(53, (8, 1, 1, 1), B=2)
    c = _cache("int8-g16+s2r3", B=2, rollback_size=3)
    _run(c, steps[:3])
    base = _cache("int8-g16+s2r3", B=2)
    assert c.nbytes - base.nbytes == 2 * L * 2 * NKV * 3 * H * 4
    assert _cache("int8-g16", rollback_size=5).undo_key is None       # no windows: nothing kept
    assert _cache("int8-g16+s2r3", rollback_size=10 ** 6).rollback_size == M
    t = c.take([1, 0, 1])
    assert t.rollback_floor.tolist() == c.rollback_floor[[1, 0, 1]].tolist()
    for x, y in zip(t.undo_key, c.undo_key):
        np.testing.assert_array_equal(x, y[[1, 0, 1]])
    p = pickle.loads(pickle.dumps(c))
    for x, y in zip(p.undo_value, c.undo_value):
        assert not np.shares_memory(x, y)
        np.testing.assert_array_equal(x, y)
    assert c.rollback_floor.tolist() == [7, 7]     # the prompt's own rows 4 and 5 among them
    p.truncate(7)
    c.truncate(7)
    for li in range(L):
        np.testing.assert_array_equal(p.hp_key[li], c.hp_key[li])
    c.attend(0, *steps[3][0])
    with pytest.raises(ValueError, match=r"take\(\) during a step: layers \[0\]"):
        c.take([0])
    # copy_from a float cache: the rollback rows are the source's rows, so truncate reaches back
    src, one = _cache(), _cache("int8-g16+s2r3", rollback_size=3)
    _run(src, _steps(59, (12,)))
    one.copy_from(src)
    assert one.rollback_floor.tolist() == [9]
    one.truncate(9)
    ref = _cache("int8-g16+s2r3")
    ref.copy_from(src, 9)
    for li in range(L):
        np.testing.assert_array_equal(one.hp_key[li], ref.hp_key[li])
        np.testing.assert_array_equal(one.hp_value[li], ref.hp_value[li])


def test_rollback_rows_replaced_by_hand_are_refused():
    """cache.undo_key / undo_value are the operator's to write: an array put in their place
    of another shape, dtype or layout, or read-only, is refused before anything is written
    (RuntimeError: the cache's own state is broken), never written out of bounds."""
    c = _cache("int8-g16+s2r3", rollback_size=2)
    step = _steps(61, (6,))[0]
    ring = c.undo_value[0]
    ro = np.zeros_like(ring)
    ro.flags.writeable = False
    for bad in (np.zeros((B, NKV, 3, H), np.float32), ring.astype(np.float16),
                np.zeros((B, NKV, 2, 2 * H), np.float32)[..., ::2], ro):
        c.undo_value[0] = bad
        snap = _snapshot(c)
        with pytest.raises(RuntimeError, match="rollback rows must be"):
            c.attend(0, *step[0])
        _unchanged(c, snap)
    c.undo_value[0] = ring
    _run(c, [step])
    assert c.length == 6


def test_rollback_rows_overlapping_the_call_are_refused():
    """Rollback rows put by hand over memory the call reads or writes (the other side's rows,
    the float windows, the query) are refused by name before anything is written, the
    buffers under them included (the step's writes would land in each other), and the refused
    step leaves rollback_floor where it was."""
    c = _cache("int8-g16+s2r3", rollback_size=2)
    first, second = _steps(62, (6, 1))
    _run(c, [first])
    q, k, v = second[0]
    ring, n = c.undo_value[0], c.undo_value[0].size
    shape = ring.shape
    for bad, name in ((c.undo_key[0], "undo_key and undo_value must not overlap"),
                      (c.hp_key[0].reshape(-1)[:n].reshape(shape), "undo_value must not overlap past_hp_key"),
                      (q.reshape(-1)[:n].reshape(shape), "undo_value must not overlap query")):
        c.undo_value[0] = bad
        snap, floor = _snapshot(c), c.rollback_floor.copy()
        kept = [x.copy() for x in c.hp_key + c.hp_value + c.undo_key + [ring, q]]
        with pytest.raises(ValueError, match=name):
            c.attend(0, q, k, v)
        _unchanged(c, snap)
        np.testing.assert_array_equal(c.rollback_floor, floor)     # the refused step kept none
        for x, y in zip(c.hp_key + c.hp_value + c.undo_key + [ring, q], kept):
            np.testing.assert_array_equal(x, y)
    c.undo_value[0] = ring
    _run(c, [second])
    assert c.length == 7


def test_calibration_errors():
    f = _cache()
    with pytest.raises(ValueError, match="needs a cache holding a whole calibration run"):
        f.calibration()
    with pytest.raises(ValueError, match="calibration\\(\\) reads a float cache"):
        _cache("int8-pt").calibration()
    q, k, v = _steps(14, (2,))[0][0]
    for li in range(L):
        f.attend(li, q, k, v)
    cal = f.calibration()
    other = gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=2 * H, max_length=M)
    with pytest.raises(ValueError, match="calibration is for another model shape"):
        gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=2 * H, max_length=M,
                    mode="int8-pt", calibration=cal)
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        _cache("int8-pt", calibration=cal, margin=0)
    with pytest.raises(ValueError, match="either calibration or k_scales"):
        _cache("int8-pt", calibration=cal, k_scales=[np.ones(1, np.float32)] * L)
    with pytest.raises(ValueError, match="a calibration holds the maxima of unrotated rows, and V's"):
        _cache("int4-g16/int4-pt", calibration=cal, rotations="hadamard")
    assert _cache("int4-pt/int4-g16", calibration=cal, rotations=[(None, gqa.hadamard(H)[None].repeat(NKV, 0))] * L)
    with pytest.raises(TypeError, match="calibration must be a gqa.Calibration"):
        _cache("int8-pt", calibration={"k": 1})
    assert other.length == 0


def test_configuration_names_refuse_what_the_cache_would():
    """A configuration name is refused when it is read, with the cache's own reason (a clip
    quantile outside (0, 1] was accepted by the name and refused only by KVCache)."""
    for name, msg in [("int4-g32+rho2", r"'int4-g32\+rho2': k_rho must be in \(0, 1\]"),
                      ("int4-g32+rho0.5/1.5", r"v_rho must be in \(0, 1\]"),
                      ("int4-g32+rho0", "k_rho must be in"),
                      ("int4-g32+had+had", "gives \\+had / \\+rot twice"),
                      ("int4-g32+s4", "is not a cache configuration")]:
        with pytest.raises(ValueError, match=msg):
            gqa.cache_options(name)
    assert gqa.cache_options("int4-g32+rho0.9/1") == dict(mode="int4-g32", k_rho=0.9, v_rho=1.0)
    with pytest.raises(ValueError, match="k_rho must be in"):
        gqa.operator_attributes("int4-g32", 0.0)
    with pytest.raises(ValueError, match="v_rho must be in"):
        gqa.operator_attributes("int4-pc/int2-g32", 1.0, float("nan"))
    assert gqa.operator_attributes("int4-pc/int2-g32", 1.0, 0.5)["v_quant_rho"] == 0.5


def test_mode_names_round_trip():
    for m in MODES + MIXED + ["int4-g32", "int2-g64-fp16"]:
        assert mode_name(*parse_mode(m)) == m
    assert parse_mode("int4-pc/pt") == ("int4-pc", "int4-pt")
    assert parse_mode("int4-pc/int2-g16") == ("int4-pc", "int2-g16")
    assert mode_name("int8-pt", "int8-pc") == "int8-pt/pc"


# K and V of their own types and widths: (mode, the operator's attributes written by hand)
MIXED = ["int4-pc/int2-g16", "int8-pt/int4-pt", "int2-g8/int4-g8", "int8-g16-fp16/int4-pc"]
MIXED_ATTRS = {
    "int4-pc/int2-g16": dict(k_quant_type="PER_CHANNEL", v_quant_type="PER_GROUP", k_cache_bit_width=4,
                             v_cache_bit_width=2, kv_quant_group_size=16),
    "int8-pt/int4-pt": dict(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", k_cache_bit_width=8,
                            v_cache_bit_width=4),
    "int2-g8/int4-g8": dict(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP", k_cache_bit_width=2,
                            v_cache_bit_width=4, kv_quant_group_size=8),
    "int8-g16-fp16/int4-pc": dict(k_quant_type="PER_GROUP", v_quant_type="PER_CHANNEL",
                                  k_cache_bit_width=8, v_cache_bit_width=4, kv_quant_group_size=16,
                                  metadata_type="fp16"),
}


@pytest.mark.parametrize("mode", MIXED)
def test_mixed_modes_equal_the_hand_written_operator_loop(mode):
    """K and V of different types and widths: each cache's layout, the static side's scales,
    and outputs and caches bit for bit against operator calls written by hand."""
    k_mode, v_mode = parse_mode(mode)
    rng = np.random.default_rng(4)
    scales = {}
    for side, m in (("k", k_mode), ("v", v_mode)):
        if m.endswith(("-pc", "-pt")):
            n = NKV * H if m.endswith("pc") else 1
            scales[f"{side}_scales"] = [rng.uniform(0.01, 0.05, n).astype(np.float32) for _ in range(L)]
    cache = _cache(mode, **scales)
    assert cache.mode == mode and needs_scales(mode) == bool(scales)
    widths = MIXED_ATTRS[mode]
    assert f"v_cache_bit_width={widths['v_cache_bit_width']}" in repr(cache.ops[0])
    for arr, m in ((cache.key[0], k_mode), (cache.value[0], v_mode)):
        f = CacheFormat.parse(m)
        g = (f.bits, f.group, f.metadata) if f.grouped else None
        width = (gqa.group_row_bytes(H, g[0], g[1], g[2]) if g else H if m.startswith("int8") else H // 2)
        assert arr.shape == (B, NKV, M, width)
        assert arr.dtype == (np.int8 if m.startswith("int8") and not g else np.uint8)
    attrs = dict(num_heads=N, kv_num_heads=NKV, do_rotary=1, **MIXED_ATTRS[mode])
    kc = [np.zeros_like(a) for a in cache.key]
    vc = [np.zeros_like(a) for a in cache.value]
    cos, sin = gqa.rotary_caches(M, H)
    T = 0
    for step in _steps(8):
        S = step[0][0].shape[1]
        T += S
        for li in range(L):
            q, k, v = step[li]
            ks = scales.get("k_scales", [None] * L)[li]
            vs = scales.get("v_scales", [None] * L)[li]
            want = gqa.group_query_attention(q, k, v, kc[li], vc[li], np.full(B, T - 1, np.int32), T,
                                             cos, sin, k_scale=ks, v_scale=vs, present_key=kc[li],
                                             present_value=vc[li], **attrs)[0]
            np.testing.assert_array_equal(cache.attend(li, q, k, v), want)
    for li in range(L):
        np.testing.assert_array_equal(cache.key[li][:, :, :T], kc[li][:, :, :T])
        np.testing.assert_array_equal(cache.value[li][:, :, :T], vc[li][:, :, :T])
    # a float cache copied in: the codes the operator wrote (no rotation: exact)
    src = _cache()
    for step in _steps(8):
        for li, (q, k, v) in enumerate(step):
            src.attend(li, q, k, v)
    dst = _cache(mode, **scales)
    dst.copy_from(src)
    for li in range(L):
        np.testing.assert_array_equal(dst.key[li][:, :, :T], kc[li][:, :, :T])
        np.testing.assert_array_equal(dst.value[li][:, :, :T], vc[li][:, :, :T])


def test_readme_decoding_loop_runs(capsys):
    """The README's first decoding loop, as a user copies it."""
    import os
    import re
    readme = open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md"), encoding="utf-8").read()
    code = re.search(r"A decoding loop .*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith("48 KVCache(layers=4, B=1, N=8, Nkv=2, H=64, mode='int8-pc/pt'")


@pytest.mark.parametrize("interleaved", [0, 1])
def test_calibration_takes_rotary_pair_norms(interleaved):
    """With rotary, K's channel pairs (2i, 2i+1) interleaved, (i, i + r/2) otherwise, both take
    the largest norm of the pair over the rows (rotation keeps the norm; computed here from the
    unrotated inputs); the channels past a partial rotary width and V keep plain maxima."""
    H, rot = 32, 16                                   # partial rotary: half the head
    cos, sin = gqa.rotary_caches(M, rot)
    f = gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=M,
                    rotary=(cos, sin), rotary_interleaved=interleaved)
    rng = np.random.default_rng(15)
    ks = []
    for S in (9, 1, 1):
        for li in range(L):
            q = rng.standard_normal((1, S, N * H), np.float32)
            k, v = (rng.standard_normal((1, S, NKV * H), np.float32) for _ in range(2))
            f.attend(li, q, k, v)
            if li == 0:
                ks.append(k.reshape(1, -1, NKV, H))
    k = np.concatenate(ks, 1).astype(np.float64)       # [1, T, Nkv, H] before rotary
    a, b = (np.arange(0, rot, 2), np.arange(1, rot, 2)) if interleaved else (
        np.arange(rot // 2), np.arange(rot // 2, rot))
    norm = np.sqrt(k[..., a] ** 2 + k[..., b] ** 2).max(axis=(0, 1))      # [Nkv, rot/2]
    want = np.abs(k).max(axis=(0, 1))
    want[:, a], want[:, b] = norm, norm
    cal = f.calibration()
    np.testing.assert_allclose(cal.k_absmax[0], want.reshape(-1), rtol=1e-6)
    rotated_k = f.key[0][0, :, :f.length].astype(np.float64)               # [Nkv, T, H]
    assert (np.abs(rotated_k).max(axis=1).reshape(-1) <= cal.k_absmax[0] * (1 + 1e-6)).all()
    plain = f.calibration(rotary_pairs=False)
    np.testing.assert_array_equal(plain.k_absmax[0], np.abs(rotated_k).max(axis=1).reshape(-1))
    np.testing.assert_array_equal(plain.v_absmax[0], cal.v_absmax[0])


@pytest.mark.parametrize("lens", [[5, 2, 7], [5, 2, 6]], ids=["longest-S", "all-under-S"])
@pytest.mark.parametrize("mode", ["float", "int8-pc", "int4-g16+s2r3"])
def test_ragged_prompts_give_each_sequence_what_it_gets_alone(mode, lens):
    """A prompt step of 7 rows with lengths= (rows [0, lengths[b]) real; all under 7 too: its
    last row padding everywhere, which raised the operator's total_sequence_length error), then
    decode steps: each sequence's outputs, codes and windows are those of a batch-of-one cache
    given it alone."""
    Bn = len(lens)
    rng = np.random.default_rng(8)
    u = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    prompt = [(u(Bn, 7, N * H), u(Bn, 7, NKV * H), u(Bn, 7, NKV * H)) for _ in range(L)]
    decode = [[(u(Bn, 1, N * H), u(Bn, 1, NKV * H), u(Bn, 1, NKV * H)) for _ in range(L)] for _ in range(3)]
    batch = _cache(mode, B=Bn)
    for li, (q, k, v) in enumerate(prompt):
        batch.attend(li, q, k, v, lengths=lens)
    assert batch.lengths.tolist() == lens and batch.length == max(lens) and batch.ragged
    outs = [[batch.attend(li, q, k, v) for li, (q, k, v) in enumerate(step)] for step in decode]
    assert batch.lengths.tolist() == [n + 3 for n in lens]
    for b, n in enumerate(lens):
        alone = _cache(mode)
        for li, (q, k, v) in enumerate(prompt):
            alone.attend(li, q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n])
        for step, got in zip(decode, outs):
            for li, (q, k, v) in enumerate(step):
                np.testing.assert_array_equal(alone.attend(li, q[b:b + 1], k[b:b + 1], v[b:b + 1]),
                                              got[li][b:b + 1])
        for li in range(L):
            np.testing.assert_array_equal(alone.key[li][0, :, :n + 3], batch.key[li][b, :, :n + 3])
            if alone.hp_key[li] is not None:
                np.testing.assert_array_equal(alone.hp_key[li][0], batch.hp_key[li][b])
    if "r3" not in mode:        # (the recent window lost the rows: see the truncate tests)
        batch.truncate([n + 2 for n in lens])          # one rollback step per sequence
        assert batch.lengths.tolist() == [n + 2 for n in lens]
    with pytest.raises(ValueError, match="lengths= is for a prompt into an empty cache"):
        batch.attend(0, *decode[0][0], lengths=[1, 1, 1])
    with pytest.raises(ValueError, match=r"lengths must hold one count in \[1, S = 7\]"):
        _cache(mode, B=Bn).attend(0, *prompt[0], lengths=[8, 1, 1])


def test_a_steps_lengths_hold_for_all_its_layers():
    """The lengths of a step are its first layer's: a later layer given other lengths, or none
    where the first had them, or lengths where the first had none, is refused before anything
    is written, and the step then goes on as it began."""
    lens = [3, 1]
    rng = np.random.default_rng(9)
    u = lambda *s: rng.standard_normal(s, np.float32)  # noqa: E731
    step = [(u(2, 3, N * H), u(2, 3, NKV * H), u(2, 3, NKV * H)) for _ in range(L)]
    c = _cache("int8-pc", B=2)
    c.attend(0, *step[0], lengths=lens)
    before = [a.copy() for a in c.key + c.value]
    for bad in (None, [3, 2], [2, 1]):
        with pytest.raises(ValueError, match=r"this step gives the other layers lengths \[3, 1\]"):
            c.attend(1, *step[1], lengths=bad)
    assert all(np.array_equal(a, b) for a, b in zip(c.key + c.value, before))
    for li in range(1, L):
        c.attend(li, *step[li], lengths=lens)
    assert c.lengths.tolist() == lens
    c = _cache("int8-pc", B=2)
    c.attend(0, *step[0])
    with pytest.raises(ValueError, match=r"this step gives the other layers lengths \[3, 3\]"):
        c.attend(1, *step[1], lengths=lens)
    for li in range(1, L):
        c.attend(li, *step[li], lengths=[3, 3])
    assert c.lengths.tolist() == [3, 3] and c.length == 3
    with pytest.raises(ValueError, match="lengths= is for a prompt into an empty cache"):
        c.attend(0, step[0][0][:, :1], step[0][1][:, :1], step[0][2][:, :1], lengths=[1, 1])


def test_per_layer_windows():
    """local_window_size (and softcap, scale) may be given per layer: each layer's operator
    has its own, as Gemma's alternating sliding layers need."""
    c = _cache("float", local_window_size=[-1, 4, 2])
    assert [op.local_window_size for op in c.ops] == [-1, 4, 2]
    with pytest.raises(ValueError, match=r"local_window_size must be one value or one per layer \(3\)"):
        _cache("float", local_window_size=[4, 2])
