"""Regressions of the newer surface (the issue on memory safety of per-group caches, windows,
rotations, QK norm and KVCache) and the numeric policy of the README ("What is refused"):
each failed, crashed or silently corrupted a buffer before its fix."""
import subprocess
import sys

import numpy as np
import pytest

import gqa
from _newer_cases import orthogonal
from _subproc import gqa_env

F32, F16 = np.float32, np.float16
H, N, NKV = 32, 4, 2
GROUP = dict(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP", kv_cache_bit_width=4,
             kv_quant_group_size=8)

REPRO_WINDOW_OVERFLOW = """
import numpy as np, gqa
H, N, Nkv, t = 32, 4, 2, 200000
rb = gqa.group_row_bytes(H, 4, 8)
kc = np.zeros((1, Nkv, t + 1, rb), np.uint8); vc = np.zeros_like(kc)
hk = np.zeros((1, Nkv, 2, H), np.float32); hv = np.zeros_like(hk)
x = lambda n: np.ones((1, 1, n), np.float32)
try:
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_GROUP",
                                 v_quant_type="PER_GROUP", kv_cache_bit_width=4,
                                 kv_quant_group_size=8, sink_size=2**31 - 1, recent_size=1)
    op(x(N*H), x(Nkv*H), x(Nkv*H), kc, vc, np.array([t], np.int32), t + 1, past_hp_key=hk,
       past_hp_value=hv, present_key=kc, present_value=vc, present_hp_key=hk, present_hp_value=hv)
except ValueError as e:
    print("ValueError:", e)
print("untouched:", not (kc.any() or vc.any() or hk.any() or hv.any()))
"""


def test_window_sizes_that_overflow_a_c_int_are_refused():
    """sink_size + recent_size past 2^31 - 1 with in-place windows wrote past the caller's
    arrays (SIGSEGV, heap corruption): now refused at construction, naming both."""
    r = subprocess.run([sys.executable, "-c", REPRO_WINDOW_OVERFLOW], capture_output=True,
                       text=True, env=gqa_env(), timeout=120)
    assert r.returncode == 0, f"crashed with status {r.returncode}: {r.stderr[-1000:]}"
    assert "ValueError: sink_size + recent_size" in r.stdout and "2147483648" in r.stdout
    assert "untouched: True" in r.stdout


@pytest.mark.parametrize("S", [1, 5])
def test_windows_near_the_c_int_limit_still_work(S):
    """sink_size + recent_size = 2^31 - 1 is legal: the new windows take min(T, sink + recent)
    rows and a multi-token step's staging rows min(windows, past) + S (counted in 64 bits)."""
    rng = np.random.default_rng(S)
    big = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=2 ** 31 - 2,
                                  recent_size=1, **GROUP)
    small = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, sink_size=64, **GROUP)
    rb = gqa.group_row_bytes(H, 4, 8)
    u = lambda *s: rng.uniform(-1, 1, s).astype(F32)  # noqa: E731
    steps = [(u(1, 6, N * H), u(1, 6, NKV * H), u(1, 6, NKV * H)),
             (u(1, S, N * H), u(1, S, NKV * H), u(1, S, NKV * H))]
    outs = []
    for op in (big, small):
        kc, vc = np.zeros((1, NKV, 16, rb), np.uint8), np.zeros((1, NKV, 16, rb), np.uint8)
        hk = hv = None
        T = 0
        for q, k, v in steps:
            T += q.shape[1]
            r = op(q, k, v, kc, vc, np.array([T - 1], np.int32), T, past_hp_key=hk,
                   past_hp_value=hv, present_key=kc, present_value=vc)
            hk, hv = r[3], r[4]
        outs.append((r[0], hk))
    # every position is within the sink window either way: the same floats, the same output
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1][:, :, :6 + S])


def _group_call(op_cls=gqa.GroupQueryAttention, **kw):
    rng = np.random.default_rng(3)
    attrs = dict(num_heads=N, kv_num_heads=NKV, sink_size=1, recent_size=2,
                 kv_quant_group_size=8, kv_cache_bit_width=4)
    if op_cls is gqa.GroupQueryAttention:
        attrs.update(k_quant_type="PER_GROUP", v_quant_type="PER_GROUP")
    op = op_cls(**attrs)
    rb = gqa.group_row_bytes(H, 4, 8)
    inp = dict(query=rng.uniform(-1, 1, (1, 1, N * H)).astype(F32),
               key=rng.uniform(-1, 1, (1, 1, NKV * H)).astype(F32),
               value=rng.uniform(-1, 1, (1, 1, NKV * H)).astype(F32),
               past_key=np.zeros((1, NKV, 4, rb), np.uint8),
               past_value=np.zeros((1, NKV, 4, rb), np.uint8),
               seqlens_k=np.array([4], np.int32), total_sequence_length=5,
               past_hp_key=rng.uniform(-1, 1, (1, NKV, 3, H)).astype(F32),
               past_hp_value=rng.uniform(-1, 1, (1, NKV, 3, H)).astype(F32))
    inp.update(kw)
    return op, inp


@pytest.mark.parametrize("op_cls", [gqa.GroupQueryAttention, gqa.MixedPrecisionGroupQueryAttention])
@pytest.mark.parametrize("which", ["present_key", "present_value"])
@pytest.mark.parametrize("window", ["past_hp_key", "past_hp_value"])
def test_present_buffers_must_not_overlap_the_past_windows(op_cls, which, window):
    """A caller's present_key / present_value in the memory of past_hp_key / past_hp_value
    (not in place) was accepted, and the call overwrote that input while reading it."""
    op, inp = _group_call(op_cls)
    rb = gqa.group_row_bytes(H, 4, 8)
    shape = (1, NKV, 5, rb)
    raw = inp[window].view(np.uint8).reshape(-1)
    alias = raw[:int(np.prod(shape))].reshape(shape)
    present = dict(present_key=np.zeros(shape, np.uint8), present_value=np.zeros(shape, np.uint8))
    present[which] = alias
    before = inp[window].copy()
    with pytest.raises(ValueError, match=f"{which} must not overlap {window}"):
        op(**inp, **present)
    np.testing.assert_array_equal(inp[window], before)


def test_in_place_caches_must_not_overlap_the_windows():
    op, inp = _group_call()
    rb = gqa.group_row_bytes(H, 4, 8)
    hk = np.zeros((1, NKV, 3 + 8 * rb // (4 * H) + 8, H), F32)
    cache = hk.view(np.uint8).reshape(-1)[:NKV * 8 * rb].reshape(1, NKV, 8, rb)
    inp.update(past_key=cache, past_value=np.zeros((1, NKV, 8, rb), np.uint8), past_hp_key=hk,
               past_hp_value=np.zeros_like(hk))
    with pytest.raises(ValueError, match="past_key must not overlap past_hp_key"):
        op(**inp, present_key=inp["past_key"], present_value=inp["past_value"])


# -- the numeric policy (README "What is refused") ------------------------------------------

def _rotated(rot_k=None, rot_v=None, **kw):
    op, inp = _group_call(**kw)
    if rot_k is not None:
        inp["oscar_rotation_k"] = rot_k
    if rot_v is not None:
        inp["oscar_rotation_v"] = rot_v
    return op, inp


@pytest.mark.parametrize("bad", ["nan", "inf", "random", "zero", "twice", "perturbed"])
@pytest.mark.parametrize("name", ["oscar_rotation_k", "oscar_rotation_v"])
def test_rotations_must_be_finite_and_orthogonal(name, bad):
    r = orthogonal(np.random.default_rng(0), NKV, H)
    if bad == "nan":
        r[1, 2, 3] = np.nan
    elif bad == "inf":
        r[0, 0, 0] = np.inf
    elif bad == "random":
        r = np.random.default_rng(1).standard_normal((NKV, H, H)).astype(F32)
    elif bad == "zero":
        r[1] = 0
    elif bad == "twice":
        r = 2 * r
    else:      # one element off by 5e-3: some (RR^T)[4, j] moves by >= 5e-3 / sqrt(H), 9x the tolerance
        r[1, 4, 5] += 5e-3
    op, inp = _rotated(**{name.replace("oscar_rotation_", "rot_"): r})
    before = inp["past_hp_key"].copy()
    match = "must be finite" if bad in ("nan", "inf") else r"is not orthogonal: max \|R R\^T - I\|"
    with pytest.raises(ValueError, match=f"{name}.*{match}"):
        op(**inp, present_hp_key=inp["past_hp_key"], present_hp_value=inp["past_hp_value"])
    np.testing.assert_array_equal(inp["past_hp_key"], before)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_rotations_rounded_to_their_dtype_are_orthogonal_enough(dtype):
    """An exactly orthogonal matrix rounded to float32 / float16 deviates by at most 2u(1+u)
    (u: the unit roundoff), within gqa's tolerance; one computed in float32 (QR in float32) too."""
    rng = np.random.default_rng(5)
    r = orthogonal(rng, NKV, H, dtype)
    a = r.astype(np.float64)
    dev = np.abs(a @ a.transpose(0, 2, 1) - np.eye(H)).max()
    u = np.finfo(dtype).eps / 2
    assert dev <= 2 * u * (1 + u) + 1e-12    # |(E R^T)_ij| <= u sum_k |R_ik R_jk| <= u
    op, inp = _rotated(rot_k=r, rot_v=r)
    op(**inp)
    q32 = np.linalg.qr(rng.standard_normal((NKV, H, H)).astype(F32))[0].astype(F32)
    op2, inp2 = _rotated(rot_k=q32)
    op2(**inp2)


def test_a_rotation_just_past_the_tolerance_is_refused_just_inside_accepted():
    from gqa._checks import ORTHOGONAL_TOLERANCE as TOL
    tol = TOL[np.dtype(F32)]
    base = np.broadcast_to(np.eye(H, dtype=F32), (NKV, H, H)).copy()
    inside, outside = base.copy(), base.copy()
    inside[0, 0, 0] = np.sqrt(1 + 0.5 * tol)      # (RR^T)[0, 0] = 1 + tol / 2
    outside[0, 0, 0] = np.sqrt(1 + 2 * tol)       # 1 + 2 tol
    op, inp = _rotated(rot_k=inside)
    op(**inp)
    op, inp = _rotated(rot_k=outside)
    with pytest.raises(ValueError, match="oscar_rotation_k.0. is not orthogonal"):
        op(**inp)


@pytest.mark.parametrize("where, accepted", [(0.99, True), (1.01, False)])
def test_a_rotation_within_float32_error_of_the_tolerance_is_decided_in_float64(where, accepted):
    """The check computes R R^T in float32 first; a deviation within that product's error
    (H 2^-24 (1 + dev)) of the tolerance is decided in float64: 1 % inside accepted, 1 %
    outside refused."""
    from gqa._checks import ORTHOGONAL_TOLERANCE as TOL
    tol = TOL[np.dtype(F32)]
    r = np.broadcast_to(np.eye(H, dtype=F32), (NKV, H, H)).copy()
    r[1, 3, 3] = np.sqrt(1 + where * tol)
    dev = abs(float(r[1, 3, 3]) ** 2 - 1)
    assert (dev < tol) == accepted and abs(dev - tol) < 1.01 * H * 2.0 ** -24 * (1 + dev)
    op, inp = _rotated(rot_v=r)
    if accepted:
        op(**inp)
    else:
        with pytest.raises(ValueError, match=r"oscar_rotation_v.1. is not orthogonal"):
            op(**inp)


def test_a_refused_rotation_states_its_float64_deviation():
    """An element of 1e25 (finite in float32, its square not): the float32 product overflows,
    the message states float64's max |R R^T - I| = 1e50."""
    r = np.broadcast_to(np.eye(H, dtype=F32), (NKV, H, H)).copy()
    r[0, 2, 7] = 1e25
    op, inp = _rotated(rot_k=r)
    with pytest.raises(ValueError, match=r"oscar_rotation_k.0. is not orthogonal: max \|R R\^T - I\| = 1e\+50 >"):
        op(**inp)


@pytest.mark.parametrize("name", ["q_norm_weight", "k_norm_weight"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_qk_norm_weights_must_be_finite(name, value, dtype):
    rng = np.random.default_rng(2)
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV)
    q = rng.uniform(-1, 1, (1, 3, N * H)).astype(dtype)
    k = rng.uniform(-1, 1, (1, 3, NKV * H)).astype(dtype)
    w = dict(q_norm_weight=np.ones(H, dtype), k_norm_weight=np.ones(H, dtype))
    cache = np.zeros((1, NKV, 3, H), dtype)
    op(q, k, k, cache, cache.copy(), np.array([2], np.int32), 3, **w)      # finite: accepted
    w[name] = w[name].copy()
    w[name][7] = value
    with pytest.raises(ValueError, match=f"{name} element 7 is .*must be finite"):
        op(q, k, k, cache, cache.copy(), np.array([2], np.int32), 3, **w)


@pytest.mark.parametrize("name", ["cos_cache", "sin_cache"])
def test_rotary_caches_must_be_finite(name):
    cos, sin = gqa.rotary_caches(8, H)
    caches = dict(cos_cache=cos.copy(), sin_cache=sin.copy())
    caches[name][3, 1] = np.nan
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, do_rotary=1)
    q = np.ones((1, 2, N * H), F32)
    k = np.ones((1, 2, NKV * H), F32)
    with pytest.raises(ValueError, match=fr"{name} element \(3, 1\) is nan"):
        op(q, k, k, seqlens_k=np.array([1], np.int32), total_sequence_length=2, **caches)


def test_rho_that_is_zero_in_float32_and_rho_none_are_refused():
    with pytest.raises(ValueError, match="k_quant_rho"):
        gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_rho=1e-50, **GROUP)
    x = np.ones((2, 16), F32)
    with pytest.raises(TypeError, match="rho must be a real number"):
        gqa.quantize(x, bits=4, group_size=8, rho=None)
    with pytest.raises(ValueError, match="rho applies to a per-group format"):
        gqa.quantize(x, np.ones(1, F32), rho=0.5)


@pytest.mark.parametrize("name", ["int4-g32+", "int4-g32+had+rot", "int4-g32+s4r64+s4r64",
                                  "int4-g\uff18", "int4-g32++had"])
def test_configuration_names_are_parsed_strictly(name):
    with pytest.raises(ValueError):
        gqa.cache_options(name)
    with pytest.raises(ValueError):
        gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=8,
                    mode=name)


def test_packed_qkv_of_the_wrong_width_states_the_widths_it_takes():
    op = gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2)
    with pytest.raises(ValueError, match=r"100 must be .* = 8 \* head_size, a multiple of 8 \* 8 = "
                                         r"64 .*: 64 \(head_size 8\) or 128 \(head_size 16\)"):
        op(np.ones((1, 1, 100), F32), seqlens_k=np.array([0], np.int32), total_sequence_length=1)
