"""The windowed KV cache (sliding_window_cache=1): onnxruntime 1.31.1's contract, checked
against onnxruntime itself (caches bit-exact on the resident rows [0, L), outputs within
float32 rounding), against gqa's own full-length cache masked by local_window_size (head
sizes and mixed modes onnxruntime refuses), and its errors."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import gqa
import _ort
from gqa import _signature as _call
from gqa._window import resident

needs_ort = pytest.mark.skipif(not _ort.available(), reason="onnxruntime==1.31.1 not installed")
PATHS = gqa.available_paths()         # every path this CPU runs (the fixture reports the rest)
MODES = {"float": ("NONE", "NONE", 0), "int8-pt": ("PER_TENSOR", "PER_TENSOR", 8),
         "int8-pc": ("PER_CHANNEL", "PER_CHANNEL", 8), "int4-pt": ("PER_TENSOR", "PER_TENSOR", 4),
         "int4-pc": ("PER_CHANNEL", "PER_CHANNEL", 4), "int8-pc/pt": ("PER_CHANNEL", "PER_TENSOR", 8)}


class Loop:
    """One decoding run: its attributes, buffers and per-step inputs (same data for every
    side: gqa windowed, onnxruntime windowed, gqa full-length)."""

    def __init__(self, seed, C, W, mode, B=1, N=4, Nkv=2, H=32, rotary=False, bias=False,
                 start=None, qk_norm=False, max_T=64):
        self.rng = np.random.default_rng(seed)
        self.C, self.W, self.B, self.N, self.Nkv, self.H = C, W, B, N, Nkv, H
        kq, vq, bits = MODES[mode]
        self.bits, self.kq, self.vq = bits, kq, vq
        self.attrs = dict(num_heads=N, kv_num_heads=Nkv, local_window_size=W)
        if bits:
            self.attrs.update(k_quant_type=kq, v_quant_type=vq, kv_cache_bit_width=bits)
        self.Hp = H if bits != 4 else (H + 1) // 2
        self.dt = np.float32 if not bits else np.int8 if bits == 8 else np.uint8
        self.T = np.zeros(B, np.int64) if start is None else np.array(start, np.int64)
        self.fixed = {}
        if bits:
            nk = Nkv * H if kq == "PER_CHANNEL" else 1
            nv = Nkv * H if vq == "PER_CHANNEL" else 1
            self.fixed["k_scale"] = self.rng.uniform(0.006, 0.01, nk).astype(np.float32)
            self.fixed["v_scale"] = self.rng.uniform(0.006, 0.01, nv).astype(np.float32)
        if rotary:
            ang = self.rng.uniform(0, 2 * np.pi, (max_T + 8, H // 2))
            self.fixed.update(cos_cache=np.cos(ang).astype(np.float32), sin_cache=np.sin(ang).astype(np.float32))
            self.attrs.update(do_rotary=1)
        if qk_norm:
            self.fixed.update(q_norm_weight=self.rng.uniform(0.5, 1.5, H).astype(np.float32),
                              k_norm_weight=self.rng.uniform(0.5, 1.5, H).astype(np.float32))
        self.bias = bias

    def buffers(self, rows):
        return np.zeros((self.B, self.Nkv, rows, self.Hp), self.dt), np.zeros((self.B, self.Nkv, rows, self.Hp), self.dt)

    def step(self, S):
        """The inputs of the next step of S tokens (every entry advances by S)."""
        self.T = self.T + S
        T = int(self.T.max())
        u = lambda *shape: self.rng.uniform(-0.4, 0.4, shape).astype(np.float32)  # noqa: E731
        B, N, Nkv, H = self.B, self.N, self.Nkv, self.H
        inp = dict(query=u(B, S, N * H), key=u(B, S, Nkv * H), value=u(B, S, Nkv * H),
                   seqlens_k=(self.T - 1).astype(np.int32), total_sequence_length=T, **self.fixed)
        if self.bias:
            inp["attention_bias"] = self.rng.uniform(-1, 1, (1, N, S, T)).astype(np.float32)
        return inp


def _windowed(attrs):
    return dict(attrs, sliding_window_cache=1)


def _ort_step(inp, attrs, pk, pv):
    out = _ort.run_ort(dict(inp, past_key=pk, past_value=pv), _windowed(attrs))
    return out[0], out[1], out[2]


def _check_step(loop, T, got, want, label):
    """Caches bit-exact on each entry's resident rows, outputs within float32 rounding."""
    for b in range(loop.B):
        L = resident(int(T[b]), loop.C, loop.W)
        for g, w, name in ((got[1], want[1], "K"), (got[2], want[2], "V")):
            assert np.array_equal(g[b, :, :L], w[b, :, :L]), f"{label}: {name} rows of entry {b} (L={L})"
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-6, err_msg=label)


@needs_ort
@settings(deadline=None)
@given(seed=st.integers(0, 2 ** 16), W=st.integers(1, 9), slack=st.integers(0, 6),
       mode=st.sampled_from(["float", "int8-pt", "int8-pc", "int4-pt", "int4-pc"]),
       steps=st.lists(st.integers(1, 12), min_size=3, max_size=12), rotary=st.booleans(),
       bias=st.booleans(), in_place=st.booleans(), kernel=st.sampled_from(PATHS),
       flash=st.booleans())
def test_random_step_sequences_match_onnxruntime(seed, W, slack, mode, steps, rotary, bias, in_place,
                                                 kernel, flash):
    """Decode, multi-token steps (speculative decoding, chunked prefill) and steps longer than
    the capacity, crossing several evictions, in place and into fresh present buffers."""
    C = W + slack
    loop = Loop(seed, C, W, mode, rotary=rotary, bias=bias, max_T=sum(steps))
    pk, pv = loop.buffers(C)
    ok, ov = loop.buffers(C)
    with gqa.config(path=kernel, flash=flash):
        for i, S in enumerate(steps):
            inp = loop.step(S)
            want = _ort_step(inp, loop.attrs, ok, ov)
            ok, ov = want[1], want[2]
            if in_place:
                got = gqa.group_query_attention(**inp, past_key=pk, past_value=pv, present_key=pk,
                                                present_value=pv, **_windowed(loop.attrs))
            else:
                got = gqa.group_query_attention(**inp, past_key=pk, past_value=pv, **_windowed(loop.attrs))
                pk, pv = got[1], got[2]
            assert got[1].shape == (1, loop.Nkv, C, loop.Hp)        # C rows whatever T is
            _check_step(loop, loop.T, got, want, f"step {i} S={S} T={int(loop.T[0])}")


@needs_ort
@pytest.mark.parametrize("mode", ["int8-pt", "int4-pc", "float"])
def test_ragged_batch_decode_matches_onnxruntime(mode):
    """Batch 3 with different lengths: every entry has its own resident range."""
    loop = Loop(5, 11, 6, mode, B=3, start=[0, 4, 9], rotary=True)
    pk, pv = loop.buffers(11)
    ok, ov = loop.buffers(11)
    for i in range(40):
        inp = loop.step(1)
        want = _ort_step(inp, loop.attrs, ok, ov)
        ok, ov = want[1], want[2]
        got = gqa.group_query_attention(**inp, past_key=pk, past_value=pv, present_key=pk, present_value=pv,
                                        **_windowed(loop.attrs))
        _check_step(loop, loop.T, got, want, f"step {i}")


@needs_ort
@pytest.mark.parametrize("mode", ["int8-pt", "int4-pt"])
def test_long_in_place_loop_against_onnxruntimes_own_buffer(mode):
    """2,000 in-place decode steps with C = W + 7 (an eviction every 8 steps): onnxruntime
    runs on its own shared buffer through IOBinding, gqa on its own, compared every step."""
    W = 25
    C = W + 7
    loop = Loop(9, C, W, mode, rotary=True, max_T=2100)
    pk, pv = loop.buffers(C)
    ok, ov = loop.buffers(C)
    first = loop.step(1)
    ort = _ort.OrtInPlace(first, _windowed(loop.attrs), ok, ov)
    op = gqa.GroupQueryAttention(**_windowed(loop.attrs))
    inp = first
    for i in range(2000):
        if i:
            inp = loop.step(1)
        want = ort.step(inp)
        got = op(**inp, past_key=pk, past_value=pv, present_key=pk, present_value=pv)
        kc, vc = ort.caches()
        L = resident(int(loop.T[0]), C, W)
        assert np.array_equal(pk[:, :, :L], kc[:, :, :L]) and np.array_equal(pv[:, :, :L], vc[:, :, :L]), i
        np.testing.assert_allclose(got[0], want, rtol=0, atol=2e-6, err_msg=f"step {i}")


@pytest.mark.parametrize("case", [
    dict(mode="int4-pc", H=16),                 # a head size onnxruntime refuses for 4-bit windows
    dict(mode="int8-pc/pt", H=32),              # K and V modes differ
    dict(mode="int8-pt", H=32, qk_norm=True, rotary=True),
    dict(mode="float", H=64, bias=True, rotary=True),
])
def test_windowed_equals_a_full_cache_masked_by_the_window(case, kernel_path):
    """The same tokens through a windowed cache and through a full-length cache with the same
    local_window_size: every resident row is bit-identical to the full cache's row of that
    position, and the outputs agree within float32 rounding (the same keys, summed in other
    chunks)."""
    case = dict(case)
    mode, H = case.pop("mode"), case.pop("H")
    C, W, steps = 10, 7, [5, 1, 1, 3, 1, 1, 1, 12, 1, 2, 1, 1, 1, 1]
    loop = Loop(21, C, W, mode, H=H, max_T=sum(steps), **case)
    pk, pv = loop.buffers(C)
    fk, fv = loop.buffers(sum(steps))
    with gqa.config(path=kernel_path):
        for i, S in enumerate(steps):
            inp = loop.step(S)
            got = gqa.group_query_attention(**inp, past_key=pk, past_value=pv, present_key=pk,
                                            present_value=pv, **_windowed(loop.attrs))
            want = gqa.group_query_attention(**inp, past_key=fk, past_value=fv, present_key=fk,
                                             present_value=fv, **loop.attrs)
            T = int(loop.T[0])
            L = resident(T, C, W)
            assert np.array_equal(pk[0, :, :L], fk[0, :, T - L:T]), i
            assert np.array_equal(pv[0, :, :L], fv[0, :, T - L:T]), i
            np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-6, err_msg=f"step {i}")


def test_rollback_where_the_contract_says_it_is_exact():
    """Re-running a step with a smaller total length, leaving the buffer as it is, equals the
    original run when L(T - k) == L(T) - k."""
    C, W = 12, 8
    loop = Loop(3, C, W, "int8-pt", rotary=True)
    pk, pv = loop.buffers(C)
    attrs = _windowed(loop.attrs)
    for S in (5, 1, 1, 1):
        gqa.group_query_attention(**loop.step(S), past_key=pk, past_value=pv, present_key=pk,
                                  present_value=pv, **attrs)
    T = int(loop.T[0])                            # 8: nothing evicted yet
    draft = loop.step(3)                          # speculative draft tokens: T = 11
    keep = pk.copy(), pv.copy()
    gqa.group_query_attention(**draft, past_key=pk, past_value=pv, present_key=pk, present_value=pv, **attrs)
    k = 2                                         # reject the last two drafts
    assert resident(T + 3 - k, C, W) == resident(T + 3, C, W) - k
    redo = dict(draft, query=draft["query"][:, :1], key=draft["key"][:, :1], value=draft["value"][:, :1],
                seqlens_k=draft["seqlens_k"] - k, total_sequence_length=T + 1)
    fresh_k, fresh_v = keep[0].copy(), keep[1].copy()
    want = gqa.group_query_attention(**redo, past_key=fresh_k, past_value=fresh_v, present_key=fresh_k,
                                     present_value=fresh_v, **attrs)
    got = gqa.group_query_attention(**redo, past_key=pk, past_value=pv, present_key=pk, present_value=pv,
                                    **attrs)
    np.testing.assert_array_equal(got[0], want[0])
    L = resident(T + 1, C, W)
    np.testing.assert_array_equal(pk[:, :, :L], fresh_k[:, :, :L])


def test_a_windowed_decode_repeat_keeps_its_signature():
    loop = Loop(4, 9, 5, "int8-pt")
    pk, pv = loop.buffers(9)
    op = gqa.GroupQueryAttention(**_windowed(loop.attrs))
    op(**loop.step(3), past_key=pk, past_value=pv, present_key=pk, present_value=pv)
    op(**loop.step(1), past_key=pk, past_value=pv, present_key=pk, present_value=pv)
    before = _call.signatures_built()
    for _ in range(20):
        op(**loop.step(1), past_key=pk, past_value=pv, present_key=pk, present_value=pv)
    assert _call.signatures_built() == before


@pytest.mark.parametrize("T, C, W, L", [(1, 5, 3, 1), (5, 5, 3, 5), (6, 5, 3, 3), (8, 5, 3, 5), (9, 5, 3, 3),
                                        (7, 4, 4, 4), (100, 10, 1, 10), (11, 10, 1, 1)])
def test_resident_count(T, C, W, L):
    """L(T) = T for T <= C, else T - G*ceil((T - C)/G), G = C - W + 1 (computed by hand)."""
    assert resident(T, C, W) == L


def _attr_error(**kw):
    return gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2, **kw)


def test_attribute_errors():
    with pytest.raises(ValueError, match="sliding_window_cache=1 requires local_window_size > 0"):
        _attr_error(sliding_window_cache=1)
    with pytest.raises(ValueError, match="sliding_window_cache=1 requires local_window_size > 0"):
        _attr_error(sliding_window_cache=1, local_window_size=0)
    with pytest.raises(ValueError, match="qk_output is not implemented with sliding_window_cache=1"):
        _attr_error(sliding_window_cache=1, local_window_size=4, qk_output=1)
    with pytest.raises(ValueError, match="sliding_window_cache must be 0 or 1"):
        _attr_error(sliding_window_cache=2, local_window_size=4)
    with pytest.raises(TypeError, match="sliding_window_cache must be an int"):
        _attr_error(sliding_window_cache=True, local_window_size=4)


@pytest.mark.parametrize("bad, msg", [
    ("capacity_below_window", r"capacity past_key.shape\[2\] = 5 must be >= local_window_size = 6"),
    ("no_past", "sliding_window_cache=1 needs past_key and past_value"),
    ("shared_kv", "does not take shared KV"),
    ("ragged_prompt", r"seqlens_k\[1\] = 1 is too small for sequence_length 3"),
    ("seqlens_beyond_T", r"seqlens_k\[0\] = 3 is out of range \[0, total_sequence_length = 3\)"),
    ("present_capacity", "present_key must have shape"),
    ("positions_beyond_cos", r"position_ids\[0, 2\] = 40 is out of range \[0, 16\)"),
])
def test_call_errors_write_nothing(bad, msg):
    W = 6 if bad == "capacity_below_window" else 4
    loop = Loop(2, 5 if bad == "capacity_below_window" else 8, W, "int8-pt", B=2, rotary=bad == "positions_beyond_cos",
                max_T=8)
    pk, pv = loop.buffers(loop.C)
    inp = loop.step(3)
    call = dict(inp, past_key=pk, past_value=pv, present_key=pk, present_value=pv)
    if bad == "no_past":
        call.update(past_key=None, past_value=None, present_key=None, present_value=None)
    elif bad == "shared_kv":
        call.update(key=inp["key"][:, :0], value=inp["value"][:, :0])
    elif bad == "ragged_prompt":
        call["seqlens_k"] = np.array([2, 1], np.int32)
    elif bad == "seqlens_beyond_T":
        call["seqlens_k"] = np.array([3, 2], np.int32)
    elif bad == "present_capacity":
        call.update(present_key=np.zeros((2, 2, 9, 32), np.int8), present_value=np.zeros((2, 2, 9, 32), np.int8))
    elif bad == "positions_beyond_cos":
        call["position_ids"] = np.array([[0, 1, 40], [0, 1, 2]], np.int64)
    before = pk.copy(), pv.copy()
    with pytest.raises(ValueError, match=msg):
        gqa.group_query_attention(**call, **_windowed(loop.attrs))
    np.testing.assert_array_equal(pk, before[0])
    np.testing.assert_array_equal(pv, before[1])


def test_window_resident_states_the_contract_and_refuses_the_rest():
    """L = T for T <= C, else T - G ceil((T - C) / G), G = C - W + 1 (the module's statement),
    counted here by simulating the evictions; bad arguments name themselves."""
    for C, W in [(1, 1), (5, 1), (5, 3), (5, 5), (8, 2)]:
        G, L = C - W + 1, 0
        for T in range(0, 40):
            if T:
                if L == C:           # full: drop the oldest G rows, then append
                    L -= G
                L += 1
            assert gqa.window_resident(T, C, W) == L, (T, C, W)
    assert gqa.window_resident(2 ** 40, 2 ** 31, 2 ** 31) == 2 ** 31
    for args, exc, msg in [((-1, 4, 2), ValueError, "T must be in"), ((4, 0, 1), ValueError, "C must be in"),
                           ((4, 4, 5), ValueError, r"W must be in \[1, C = 4\]"),
                           ((4, 4, 0), ValueError, "W must be in"), ((4.0, 4, 2), TypeError, "T must be an int"),
                           ((4, 4, True), TypeError, "W must be an int")]:
        with pytest.raises(exc, match=msg):
            gqa.window_resident(*args)
