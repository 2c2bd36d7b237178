"""The flash path (tiled online softmax; split-KV flash decoding) against the naive path,
on every kernel path: within 1e-4 (INT8), 1e-3 (INT4), 1e-5 (float caches)."""
import os

import numpy as np
import pytest

import gqa
from _cases import make_case
from _flash import TOL, MODES, MODE_IDS, flash_vs_naive
from gqa._plan import flash_plan


FEATURES = {
    "plain": {}, "rotary": dict(rotary=True), "packed": dict(packed=True, rotary=True, interleaved=1),
    "bias": dict(bias="full"), "bias_b1": dict(bias="b1"), "bias_n1": dict(bias="n1"),
    "window5": dict(local_window_size=5), "window1": dict(local_window_size=1),
    "window0": dict(local_window_size=0), "softcap": dict(softcap=0.4), "smooth": dict(smooth_softmax=1),
    "sink": dict(sink=True), "scale": dict(scale=0.21), "noncausal": dict(causal=0),
    "combo": dict(rotary=True, bias="n1", local_window_size=9, softcap=0.6, sink=True),
}


@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("blocks", [(1, 1), (3, 17), (17, 3), None], ids=["b1x1", "b3x17", "b17x3", "auto"])
def test_prefill_flash_matches_naive(kernel_path, mode, bits, feature, blocks):
    inp, a = make_case(seed=17, B=2, S=23, past=0, ragged=[23, 14], N=8, Nkv=2, H=32, mode=mode,
                       bits=bits or 8, **FEATURES[feature])
    flash_vs_naive(inp, a, TOL[(mode, bits)], blocks=blocks)


@pytest.mark.parametrize("G", [1, 2, 4, 8])
@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
def test_subsequent_prompt_groups(kernel_path, G, mode, bits):
    inp, a = make_case(seed=G, B=1, S=9, past=30, N=8, Nkv=8 // G, H=64, mode=mode, bits=bits or 8,
                       rotary=True, bias="both1")
    flash_vs_naive(inp, a, TOL[(mode, bits)], blocks=(4, 16))


@pytest.mark.parametrize("splits", [2, 3, 7, 64])
@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("feature", ["plain", "window5", "window0", "sink", "bias", "combo"])
def test_flash_decoding_matches_naive(kernel_path, splits, mode, bits, feature):
    inp, a = make_case(seed=splits, B=3, S=1, past=60, ragged=[3, 61, 40], N=4, Nkv=1, H=32,
                       mode=mode, bits=bits or 8, **FEATURES[feature])
    flash_vs_naive(inp, a, TOL[(mode, bits)], splits=splits)


CPUS = gqa.get_config()["plan_cpus"]   # the CPU count the decode plan is made for


def tail_case(mode, bits, feature, seed=41):
    """A decode case whose automatic plan splits the last unit of each CPU's home range:
    B x 2 KV heads = 2 x max(4, CPUs) units (>= 8, so no flash decoding of every unit), 1100+
    keys (chunks of >= 512); batch row 1 has 5 keys only (a split unit of it: empty chunk)."""
    B = max(4, CPUS)
    ragged = [1100 + 37 * b for b in range(B)]
    ragged[1] = 5
    inp, a = make_case(seed=seed, B=B, S=1, past=1, ragged=ragged, N=4, Nkv=2, H=16, mode=mode,
                       bits=bits or 8, **FEATURES[feature])
    splits, ranges = flash_plan(B, 1, 2, 2, 16, max(ragged))[2:4]
    assert (splits, ranges) == (2, CPUS), "the automatic plan no longer splits these units"
    return inp, a


@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("feature", ["plain", "rotary", "window5", "sink", "softcap", "bias", "combo"])
def test_decode_with_split_range_ends_matches_naive(kernel_path, mode, bits, feature):
    """Decode whose plan splits each range's last unit into key chunks: caches bit for bit and
    outputs within the flash tolerance against the naive path (whole rows)."""
    inp, a = tail_case(mode, bits, feature)
    flash_vs_naive(inp, a, TOL[(mode, bits)])


@pytest.mark.parametrize("feature", ["plain", "combo"])
def test_decode_with_split_range_ends_same_bits_everywhere(feature):
    """Split units give the same bits for 1-4 threads, repeated (the chunks of a unit land on
    different threads from call to call), and in place as with fresh present buffers
    (in place, the chunk holding the new row writes it; copying, every unit is copied first)."""
    inp, a = tail_case("PER_TENSOR", 8, feature)
    want = gqa.group_query_attention(**inp, **a, num_threads=1)
    for threads in (2, 3, 4, 2, 2):
        got = gqa.group_query_attention(**inp, **a, num_threads=threads)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    T = inp["total_sequence_length"]
    for threads in (1, 2, 3):
        bufs = []
        for name in ("past_key", "past_value"):   # the same past rows in buffers of T rows
            c = np.zeros(inp[name].shape[:2] + (T,) + inp[name].shape[3:], inp[name].dtype)
            c[:, :, :inp[name].shape[2]] = inp[name]
            bufs.append(c)
        got = gqa.group_query_attention(**dict(inp, past_key=bufs[0], past_value=bufs[1]), **a,
                                        present_key=bufs[0], present_value=bufs[1], num_threads=threads)
        np.testing.assert_array_equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:]):     # rows past a batch row's length differ by design
            for b, n in enumerate(inp["seqlens_k"] + 1):
                np.testing.assert_array_equal(g[b, :, :n], w[b, :, :n])


@pytest.mark.parametrize("splits", [2, 7])
@pytest.mark.parametrize("prep", ["norm", "rotation", "both"])
def test_flash_decoding_prepared_queries_match_naive(kernel_path, splits, prep):
    """Split decode units read their query rows prepared once per call (QK norm, rotary, OSCAR
    rotation): the same caches, and outputs within float rounding of the naive path."""
    rng = np.random.default_rng(splits)
    B, N, Nkv, H, past = 2, 4, 2, 32, 70
    T = past + 1
    q = rng.standard_normal((B, 1, N * H)).astype(np.float32)
    k = rng.standard_normal((B, 1, Nkv * H)).astype(np.float32)
    v = rng.standard_normal((B, 1, Nkv * H)).astype(np.float32)
    cache = [gqa.quantize(rng.standard_normal((B, Nkv, T, H)).astype(np.float32), bits=4, group_size=16)
             for _ in range(2)]
    pos = np.arange(T, dtype=np.float32)[:, None] / 10000 ** (np.arange(H // 2) / (H // 2))
    inp = dict(query=q, key=k, value=v, past_key=cache[0], past_value=cache[1],
               seqlens_k=np.array([past, past - 9], np.int32), total_sequence_length=T,
               cos_cache=np.cos(pos).astype(np.float32), sin_cache=np.sin(pos).astype(np.float32))
    if prep in ("norm", "both"):
        inp.update(q_norm_weight=rng.uniform(0.5, 1.5, H).astype(np.float32),
                   k_norm_weight=rng.uniform(0.5, 1.5, H).astype(np.float32))
    if prep in ("rotation", "both"):
        rot = [np.stack([np.linalg.qr(rng.standard_normal((H, H)))[0] for _ in range(Nkv)]).astype(np.float32)
               for _ in range(2)]
        inp.update(oscar_rotation_k=rot[0], oscar_rotation_v=rot[1])
    a = dict(num_heads=N, kv_num_heads=Nkv, do_rotary=1, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
             kv_cache_bit_width=4, kv_quant_group_size=16)
    with gqa.config(path=kernel_path):
        flash_vs_naive(inp, a, 2e-5, splits=splits)


def test_copying_split_decode_waits_for_the_copy():
    """One unit in 8 chunks with fresh present buffers: every chunk reads rows that one
    thread copies from the past buffer first.  Found racing (a thread reading the far end of
    the cache before it was copied) in 36 of 40 two-thread calls; the same bits every time."""
    inp, a = make_case(seed=6, B=1, S=1, past=3000, N=4, Nkv=1, H=64, mode="PER_TENSOR", bits=4)
    assert flash_plan(1, 1, 1, 4, 64, 3001)[2:4] == (min(max(8, CPUS), 3001 // 256), 1)
    want = gqa.group_query_attention(**inp, **a, num_threads=1)[0]
    for _ in range(20):
        np.testing.assert_array_equal(gqa.group_query_attention(**inp, **a, num_threads=2)[0], want)


def test_fully_masked_rows_give_zero():
    """W = 0 masks every key: output 0 on every path (and no NaN)."""
    inp, a = make_case(seed=1, B=1, S=6, past=0, N=4, Nkv=2, H=16, local_window_size=0)
    for flash in (False, True):
        with gqa.config(flash=flash, flash_blocks=(2, 4)):
            out = gqa.group_query_attention(**inp, **a)[0]
        assert np.array_equal(out, np.zeros_like(out))


def test_bias_minus_inf_rows():
    """A bias of -inf on every attended key of a row: zeros on both paths, other rows finite."""
    inp, a = make_case(seed=2, B=1, S=5, past=0, N=2, Nkv=1, H=16, bias="full")
    inp["attention_bias"][0, 0, 3, :] = -np.inf
    outs = []
    for flash in (False, True):
        with gqa.config(flash=flash, flash_blocks=(2, 2)):
            outs.append(gqa.group_query_attention(**inp, **a)[0])
    for out in outs:
        assert np.array_equal(out[0, 3, :16], np.zeros(16, np.float32))
        assert np.isfinite(out).all()
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("feature", ["plain", "window3"])
@pytest.mark.parametrize("blocks", [(2, 8), (3, 5), None], ids=["b2x8", "b3x5", "auto"])
def test_nonfinite_value_of_a_masked_key_stays_masked(kernel_path, bad, feature, blocks):
    """A float cache whose value row t is NaN / inf: rows that cannot see key t (causal, or
    outside their window) stay finite on the flash path -- a key tile shared with rows that
    do see it must not carry 0 * inf into them -- and every row equals the naive path's."""
    extra = {"local_window_size": 3} if feature == "window3" else {}
    inp, a = make_case(seed=31, B=1, S=12, past=0, N=4, Nkv=2, H=32, mode="NONE", bits=8, **extra)
    t = 6
    inp["value"][0, t, :32] = bad            # KV head 0 of token t
    outs = []
    for flash in (False, True):
        with gqa.config(flash=flash, flash_blocks=blocks):
            outs.append(gqa.group_query_attention(**inp, **a)[0].reshape(12, 4, 32))
    naive, flash = outs
    sees_t = np.array([s >= t and (not extra or s - 3 < t) for s in range(12)])
    assert np.isfinite(naive[~sees_t]).all() and np.isfinite(naive[:, 2:]).all()
    assert not np.isfinite(naive[sees_t, :2]).any()    # heads 0, 1 of the rows that see it
    np.testing.assert_allclose(flash, naive, atol=1e-5, rtol=0)   # NaN where naive has NaN


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_flash_results_do_not_depend_on_threads(threads):
    inp, a = make_case(seed=5, B=1, S=300, past=0, N=8, Nkv=2, H=64, mode="PER_TENSOR", bits=8, rotary=True)
    one = gqa.group_query_attention(**inp, **a, num_threads=1)
    other = gqa.group_query_attention(**inp, **a, num_threads=threads)
    assert np.array_equal(one[0], other[0])
    inp, a = make_case(seed=6, B=1, S=1, past=3000, N=4, Nkv=1, H=64, mode="PER_TENSOR", bits=4)
    one = gqa.group_query_attention(**inp, **a, num_threads=1)
    other = gqa.group_query_attention(**inp, **a, num_threads=threads)
    assert np.array_equal(one[0], other[0])


def test_flash_setting_and_env(tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(gqa.__file__)))
    assert gqa.get_config()["flash"] is True
    with gqa.config(flash=False):
        assert gqa.get_config()["flash"] is False
    assert gqa.get_config()["flash"] is True
    for var in ("GQA_DISABLE_FLASH_ATTENTION", "ORT_GQA_DISABLE_FLASH_ATTENTION"):
        out = subprocess.run([sys.executable, "-c", "import gqa; print(gqa.get_config()['flash'])"],
                             env=dict(env, **{var: "1"}), capture_output=True, text=True,
                             cwd=str(tmp_path))
        assert out.stdout.strip() == "False", out.stderr
    with pytest.raises(ValueError, match="flash_blocks"):
        gqa.config(flash_blocks=(0, 4))
