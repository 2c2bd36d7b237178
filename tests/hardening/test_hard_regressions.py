"""Regressions for the defects the hardening work found (HARD_NOTES.md, "Defects found").
Each test names its defect; all of them failed before the fix in this branch."""
import subprocess
import sys

import numpy as np
import pytest

import gqa
from _subproc import gqa_env

S8 = dict(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)


def _decode_case(B=1, N=1, Nkv=1, H=16, L=8):
    rng = np.random.default_rng(0)
    return (rng.uniform(-1, 1, (B, 1, N * H)).astype(np.float32),
            rng.uniform(-1, 1, (B, 1, Nkv * H)).astype(np.float32),
            np.zeros((B, Nkv, L, H), np.int8), np.zeros((B, Nkv, L, H), np.int8),
            np.full(B, 6, np.int32), np.array([0.01], np.float32))


REPRO_D1 = """
import numpy as np, gqa
raw = np.zeros(2 * 8 * 16, np.int8)
pk = raw[:128].reshape(1, 1, 8, 16)
pv = np.zeros((1, 1, 8, 16), np.int8)
seqlens = pk[0, 0, 6, :4].view(np.int32)    # lives in row 6 = T_b - 1, the row the call writes
seqlens[0] = 6
q = np.ones((1, 1, 16), np.float32)
k = np.full((1, 1, 16), 100.0, np.float32)   # quantizes to 127: seqlens would become 0x7f7f7f7f
s = np.array([0.01], np.float32)
try:
    gqa.group_query_attention(q, k, k.copy(), pk, pv, seqlens, 7, k_scale=s, v_scale=s, num_heads=1,
                              kv_num_heads=1, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                              kv_cache_bit_width=8, present_key=pk, present_value=pv)
except ValueError as e:
    print("ValueError:", e)
"""


def test_d1_inplace_cache_aliasing_an_input_is_refused():
    """D1: an in-place cache sharing memory with seqlens_k segfaulted (the cache write
    overwrote the lengths the attention then used); with the query, silently wrong output."""
    r = subprocess.run([sys.executable, "-c", REPRO_D1], capture_output=True, text=True, env=gqa_env(),
                       timeout=120)
    assert r.returncode == 0, f"crashed with status {r.returncode}: {r.stderr[-1000:]}"
    assert "past_key must not overlap seqlens_k" in r.stdout
    q, k, pk, pv, seq, s = _decode_case(N=2, Nkv=2, H=16)
    pf = np.zeros((1, 2, 8, 16), np.float32)
    qa = pf[0, 0, 6:8].reshape(1, 1, 32)     # the query inside the rows being written
    pv2 = np.zeros_like(pf)
    with pytest.raises(ValueError, match="past_key must not overlap query"):
        gqa.group_query_attention(qa, k[..., :32], k[..., :32].copy(), pf, pv2, seq, 7,
                                  num_heads=2, kv_num_heads=2, present_key=pf, present_value=pv2)


@pytest.mark.parametrize("what,kw,word", [
    ("num_threads", dict(num_threads=2 ** 31), "num_threads"),                     # D2
    ("num_threads", dict(num_threads=2 ** 64), "num_threads"),
    ("local_window_size", dict(local_window_size=2 ** 31), "local_window_size"),  # D3
    ("total_sequence_length", dict(total_sequence_length=2 ** 31), "total_sequence_length"),  # D4
    ("total_sequence_length", dict(total_sequence_length=10 ** 30), "total_sequence_length"),
])
def test_d2_d4_out_of_range_ints_raise_value_error(what, kw, word):
    """D2-D4: ints beyond int32 raised OverflowError (threads, window) or tried to allocate
    (64 GiB+: MemoryError / "Maximum allowed dimension exceeded") instead of ValueError."""
    q, k, pk, pv, seq, s = _decode_case()
    args = dict(total_sequence_length=7)
    call = {}
    for key, v in kw.items():
        (args if key == "total_sequence_length" else call)[key] = v
    attrs = dict(num_heads=1, kv_num_heads=1, **S8)
    if "local_window_size" in call:
        attrs["local_window_size"] = call.pop("local_window_size")
    with pytest.raises(ValueError, match=word):
        gqa.group_query_attention(q, k, k.copy(), pk, pv, seq, args["total_sequence_length"], k_scale=s,
                                  v_scale=s, **attrs, **call)


def test_d5_query_longer_than_total_names_total_sequence_length():
    """D5: S > total_sequence_length with B > 1 said 'batch_size must be 1 ...'."""
    rng = np.random.default_rng(1)
    q = rng.uniform(-1, 1, (2, 4, 16)).astype(np.float32)
    z = np.zeros((2, 1, 0, 16), np.float32)
    with pytest.raises(ValueError, match="total_sequence_length"):
        gqa.group_query_attention(q, q.copy(), q.copy(), z, z.copy(), np.array([2, 2], np.int32), 3,
                                  num_heads=1, kv_num_heads=1)


def test_d6_unaligned_inputs_reach_the_kernels_aligned():
    """D6: np.ascontiguousarray keeps an unaligned array, so misaligned float/int pointers
    reached the C kernels (UBSan: 'load of misaligned address')."""
    from gqa import _validate
    buf = bytearray(4 * 33)
    x = np.frombuffer(buf, np.float32, count=32, offset=1)
    assert not x.flags.aligned
    y = _validate.contiguous(x)
    assert y.flags.aligned and y.flags.c_contiguous and np.array_equal(x, y)
    assert _validate.contiguous(x, np.float32).flags.aligned
    assert _validate.scale(x[:1], "s", 8)[0].flags.aligned


@pytest.mark.parametrize("phase", ["prompt", "decode_splits"])
def test_d7_nan_never_becomes_zero(phase):
    """D7: flash attention (prefill tiles, split decoding) turned a row of NaN scores into 0,
    and the naive path a NaN head_sink into 0.  NaN in, NaN out, on every path."""
    from _cases import make_case
    kw = dict(B=1, S=6, past=0) if phase == "prompt" else dict(B=1, S=1, past=600)
    for flash in (False, True):
        inp, a = make_case(seed=3, N=4, Nkv=1, H=16, mode="PER_TENSOR", bits=8, sink=True, **kw)
        inp["query"][0, -1, :16] = np.nan
        inp["head_sink"][2] = np.nan
        with gqa.config(flash=flash, decode_splits=4 if flash else None):
            out = gqa.group_query_attention(**inp, **a)[0].reshape(inp["query"].shape[:2] + (4, 16))
        assert np.isnan(out[0, -1, 0]).all()
        assert np.isnan(out[:, :, 2]).all()
        assert np.isfinite(out[:, :-1, [0, 1, 3]]).all() and np.isfinite(out[:, -1, [1, 3]]).all()


def test_d8_negative_stride_input_beside_inplace_cache_is_not_an_overlap():
    """D8 (CI, fuzz layout case 1787): the in-place alias check took an array's bytes as
    [data, data + nbytes), but a negative-stride view extends *below* its data pointer, so an
    input reversed in the bytes just before past_key was refused as overlapping it."""
    q, k, _, pv, seq, s = _decode_case(H=16, L=8)
    raw = np.zeros(64 + 8 * 16, np.int8)
    below = raw[:64].view(np.float32)[::-1]          # data pointer at raw[60]: 4 bytes below pk
    pk = raw[64:].reshape(1, 1, 8, 16)
    assert not np.shares_memory(below, pk)
    attrs = dict(num_heads=1, kv_num_heads=1, **S8)
    want = gqa.group_query_attention(q, k, k.copy(), pk.copy(), pv.copy(), seq, 7, k_scale=s,
                                     v_scale=s, **attrs)[0]
    below[:] = q.ravel()
    got = gqa.group_query_attention(below.reshape(1, 1, 16), k, k.copy(), pk, pv, seq, 7, k_scale=s,
                                    v_scale=s, present_key=pk, present_value=pv, **attrs)[0]
    np.testing.assert_array_equal(got, want)
    # a reversed view that truly reaches into past_key is still refused
    into = raw[:128].view(np.float32)[16:][::-1][:16]
    assert np.shares_memory(into, pk)
    with pytest.raises(ValueError, match="past_key must not overlap query"):
        gqa.group_query_attention(into.reshape(1, 1, 16), k, k.copy(), pk, pv, seq, 7, k_scale=s,
                                  v_scale=s, present_key=pk, present_value=pv, **attrs)


@pytest.mark.parametrize("phase", ["prompt", "decode", "decode_splits"])
def test_d9_one_nan_score_among_masked_ones_makes_the_row_nan(phase):
    """A row whose scores are one NaN and otherwise -inf (bias): the running maximum skips
    NaN, so the row would look fully masked (output 0); it must come out NaN on every path."""
    from _cases import make_case
    kw = dict(B=1, S=6, past=0) if phase == "prompt" else dict(B=1, S=1, past=600)
    for flash in (False, True):
        inp, a = make_case(seed=4, N=4, Nkv=2, H=16, mode="PER_TENSOR", bits=8, bias="full", **kw)
        bias = inp["attention_bias"]
        bias[0, 1, -1, :] = -np.inf
        bias[0, 1, -1, 0] = np.nan
        with gqa.config(flash=flash, decode_splits=4 if (flash and phase == "decode_splits") else None):
            out = gqa.group_query_attention(**inp, **a)[0].reshape(inp["query"].shape[:2] + (4, 16))
        assert np.isnan(out[0, -1, 1]).all(), (flash, out[0, -1, 1])
        assert np.isfinite(out[0, -1, [0, 2, 3]]).all() and np.isfinite(out[0, :-1]).all()
