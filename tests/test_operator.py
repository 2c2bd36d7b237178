"""GroupQueryAttention against onnxruntime 1.31.1 (the oracle) over the feature matrix,
plus what onnxruntime cannot check: mixed K/V modes, threads, in-place semantics."""
import numpy as np
import pytest

import gqa
import _ort
from _cases import dequant_cache, make_case, reference

needs_ort = pytest.mark.skipif(not _ort.available(), reason="onnxruntime==1.31.1 not installed (test extra)")

MODES = [("NONE", 0), ("PER_TENSOR", 8), ("PER_CHANNEL", 8), ("PER_TENSOR", 4), ("PER_CHANNEL", 4)]
MODE_IDS = ["float", "s8pt", "s8pc", "s4pt", "s4pc"]


def compare(inp, a, ours=None, threads=1):
    """Our outputs vs onnxruntime's: caches bit-exact, output within float rounding,
    output_qk equal on each batch's valid columns."""
    ref = _ort.run_ort(inp, a)
    if ours is None:
        ours = gqa.group_query_attention(**inp, **a, num_threads=threads)
    assert len(ours) == len(ref)
    f16 = inp["query"].dtype == np.float16
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    atol = 1e-3 if f16 else 1e-5
    rows = np.ones(ours[0].shape[:2], bool)
    S, T = ours[0].shape[1], inp["total_sequence_length"]
    if a.get("local_window_size", -1) >= 0 and S == T:
        # Right-padding query rows (s >= T_b) of a windowed prompt: onnxruntime's flash and
        # naive paths disagree there (window ending at the row's own position vs at T_b); we
        # follow its flash path on every path.  These rows are padding, discarded by callers.
        rows = np.arange(S)[None, :] < (inp["seqlens_k"][:, None] + 1)
    np.testing.assert_allclose(ours[0][rows].astype(np.float64), ref[0][rows].astype(np.float64),
                               atol=atol, rtol=0)
    for i in (1, 2):
        assert ours[i].dtype == ref[i].dtype and ours[i].shape == ref[i].shape
        assert np.array_equal(ours[i].view(np.uint8), ref[i].view(np.uint8)), f"present cache {i} differs"
    if len(ref) == 4:
        for b in range(ref[3].shape[0]):
            tb = int(inp["seqlens_k"][b]) + 1
            srows = rows[b]  # valid columns [0, T_b); padded windowed rows as above
            np.testing.assert_allclose(ours[3][b][:, srows, :tb].astype(np.float64),
                                       ref[3][b][:, srows, :tb].astype(np.float64), atol=atol, rtol=0)
    return ours


# -- the matrix --------------------------------------------------------------------------
SHAPES = [  # (B, S, past, N, Nkv, H, ragged)
    (1, 4, 0, 2, 1, 8, None),          # prompt, G=2
    (1, 1, 9, 4, 4, 16, None),         # decode, G=1
    (1, 1, 33, 8, 2, 64, None),        # decode, G=4
    (1, 5, 11, 8, 1, 16, None),        # subsequent prompt, G=8
    (3, 1, 6, 4, 2, 80, [3, 7, 12]),   # ragged decode
    (3, 6, 0, 4, 2, 16, [2, 6, 4]),    # ragged right-padded prompt
    (2, 1, 20, 4, 2, 128, None),       # decode, B=2
    (1, 3, 0, 2, 2, 256, None),        # prompt, H=256
]


@needs_ort
@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}S{}P{}N{}K{}H{}".format(*s[:6]))
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_shapes_vs_ort(kernel_path, mode, bits, shape, dtype):
    B, S, past, N, Nkv, H, ragged = shape
    inp, a = make_case(seed=hash((B, S, past, H, bits, mode)) & 0xFFFF, B=B, S=S, past=past, N=N,
                       Nkv=Nkv, H=H, mode=mode, bits=bits or 8, dtype=dtype, ragged=ragged)
    compare(inp, a)


FEATURES = {
    "rotary": dict(rotary=True),
    "rotary_interleaved": dict(rotary=True, interleaved=1),
    "rotary_partial": dict(rotary=True, rot_dim=16),
    "rotary_posids": dict(rotary=True, pos_ids=True),
    "packed": dict(packed=True),
    "packed_rotary": dict(packed=True, rotary=True),
    "bias": dict(bias="full"),
    "bias_b1": dict(bias="b1"),
    "bias_n1": dict(bias="n1"),
    "bias_both1": dict(bias="both1"),
    "window3": dict(local_window_size=3),
    "window1": dict(local_window_size=1),
    "window0": dict(local_window_size=0),
    "softcap": dict(softcap=0.3),
    "smooth": dict(smooth_softmax=1),
    "sink": dict(sink=True),
    "smooth_sink": dict(smooth_softmax=1, sink=True),
    "qk1": dict(qk_output=1),
    "qk2": dict(qk_output=2),
    "scale": dict(scale=0.37),
    "noncausal": dict(causal=0),
    "prealloc_buffer": dict(buf=40),
    "combo": dict(rotary=True, bias="n1", local_window_size=4, softcap=0.5, sink=True, qk_output=1),
    "combo2": dict(packed=True, rotary=True, interleaved=1, smooth_softmax=1, qk_output=2, scale=0.2),
}
PHASES = {"prompt": dict(B=2, S=7, past=0, ragged=[7, 5]),
          "decode": dict(B=3, S=1, past=9, ragged=[4, 10, 13]),
          "subsequent": dict(B=1, S=4, past=8)}


@needs_ort
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 8), ("PER_CHANNEL", 4), ("NONE", 0)],
                         ids=["s8pt", "s4pc", "float"])
def test_features_vs_ort(feature, phase, mode, bits):
    kw = dict(PHASES[phase])
    kw.update(FEATURES[feature])
    if kw.get("buf") is not None and kw["past"] == 0:
        kw["buf"] = 0
    inp, a = make_case(seed=len(feature) * 31 + len(phase), N=4, Nkv=2, H=32, mode=mode, bits=bits or 8, **kw)
    compare(inp, a)


@needs_ort
@pytest.mark.parametrize("feature", ["rotary", "bias_n1", "window3", "softcap", "sink", "qk2", "packed"])
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 4), ("PER_CHANNEL", 8)], ids=["s4pt", "s8pc"])
def test_features_f16_vs_ort(feature, mode, bits):
    kw = dict(PHASES["decode"])
    kw.update(FEATURES[feature])
    inp, a = make_case(seed=7, N=4, Nkv=2, H=32, mode=mode, bits=bits, dtype=np.float16, **kw)
    compare(inp, a)


# -- golden cases of ONNX Runtime's own C++ tests (contract §6.1) ---------------------------
@pytest.mark.parametrize("bits", [8, 4])
def test_golden_fp16_decode(kernel_path, bits):
    N, Nkv, H = 2, 1, 8
    q = np.zeros((1, 1, N * H), np.float16)
    k = np.zeros((1, 1, H), np.float16)
    v = np.full((1, 1, H), 0.3, np.float16)
    if bits == 8:
        s = np.array([0.01], np.float32)
        pk = np.zeros((1, 1, 2, H), np.int8)
        pv = np.zeros((1, 1, 2, H), np.int8)
        pv[0, 0, 0] = 10
        want_v0, want_v1, want_k = 10, 30, 0
    else:
        s = np.array([0.05], np.float32)
        pk = np.full((1, 1, 2, H // 2), 0x88, np.uint8)
        pv = np.full((1, 1, 2, H // 2), 0x88, np.uint8)
        pv[0, 0, 0] = 0xAA
        want_v0, want_v1, want_k = 0xAA, 0xEE, 0x88
    out, pk2, pv2 = gqa.group_query_attention(
        q, k, v, pk, pv, np.array([1], np.int32), 2, k_scale=s, v_scale=s, num_heads=N,
        kv_num_heads=Nkv, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=bits)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), 0.2, atol=1e-3)
    assert (pv2[0, 0, 0] == np.array(want_v0).astype(pv2.dtype)).all()
    assert (pv2[0, 0, 1] == np.array(want_v1).astype(pv2.dtype)).all()
    assert (pk2 == np.array(want_k).astype(pk2.dtype)).all()


# -- beyond onnxruntime ------------------------------------------------------------------------
@pytest.mark.parametrize("kmode,vmode", [("PER_CHANNEL", "PER_TENSOR"), ("PER_TENSOR", "PER_CHANNEL")])
@pytest.mark.parametrize("bits", [8, 4])
def test_mixed_kv_modes(kernel_path, kmode, vmode, bits):
    """K per-channel with V per-tensor (KIVI), and the converse: caches equal the single-mode
    runs', output equals a float64 reference on the dequantized caches."""
    kw = dict(B=2, S=1, past=12, N=8, Nkv=2, H=64, bits=bits, ragged=[6, 13])
    inp, a = make_case(seed=5, mode=kmode, v_mode=vmode, **kw)
    out, pk, pv = gqa.group_query_attention(**inp, **a)
    ink, ak = make_case(seed=5, mode=kmode, **kw)
    ink["k_scale"] = inp["k_scale"]
    ink["v_scale"] = inp["k_scale"] if kmode == "PER_CHANNEL" else inp["k_scale"][:1]
    _, pk_ref, _ = gqa.group_query_attention(**ink, **ak)
    assert np.array_equal(pk, pk_ref)
    kd = dequant_cache(pk, inp["k_scale"], kmode, bits, 64, 2)
    vd = dequant_cache(pv, inp["v_scale"], vmode, bits, 64, 2)
    np.testing.assert_allclose(out, reference(inp, a, kd, vd), atol=2e-6, rtol=0)


@pytest.mark.parametrize("kmode,vmode", [("PER_CHANNEL", "PER_TENSOR"), ("PER_TENSOR", "PER_TENSOR")])
@pytest.mark.parametrize("kbits,vbits", [(8, 4), (4, 8)])
@pytest.mark.parametrize("case", ["prompt", "decode", "decode-in-place"])
def test_mixed_kv_widths(kernel_path, kmode, vmode, kbits, vbits, case):
    """K and V of their own widths (v_cache_bit_width): each cache equals the run whose
    caches both take its mode and width, and the output a float64 reference on the
    dequantized caches."""
    kw = dict(B=2, S=5, past=0) if case == "prompt" else dict(B=2, S=1, past=12, ragged=[6, 13])
    kw.update(N=8, Nkv=2, H=64, buf=16 if case.endswith("place") else None)
    inp, a = make_case(seed=7, mode=kmode, v_mode=vmode, bits=kbits, v_bits=vbits, **kw)
    assert a["v_cache_bit_width"] == vbits
    call = dict(present_key=inp["past_key"], present_value=inp["past_value"]) if case.endswith("place") else {}
    pk0, pv0 = inp["past_key"].copy(), inp["past_value"].copy()
    out, pk, pv = gqa.group_query_attention(**inp, **a, **call)
    assert pk.dtype == (np.int8 if kbits == 8 else np.uint8) and pv.shape[3] == (64 if vbits == 8 else 32)
    for i, (mode, bits, past, scale) in enumerate(((kmode, kbits, pk0, "k_scale"),
                                                   (vmode, vbits, pv0, "v_scale"))):
        one = make_case(seed=7, mode=mode, bits=bits, **kw)[1]
        single = dict(inp, past_key=past, past_value=past.copy(), k_scale=inp[scale], v_scale=inp[scale])
        ref = gqa.group_query_attention(**single, **one)[1 + i]
        for b, t in enumerate(inp["seqlens_k"] + 1):    # in place, rows >= T_b are the caller's
            assert np.array_equal((pk, pv)[i][b, :, :t], ref[b, :, :t]), f"{'KV'[i]} codes"
    kd = dequant_cache(pk, inp["k_scale"], kmode, kbits, 64, 2)
    vd = dequant_cache(pv, inp["v_scale"], vmode, vbits, 64, 2)
    np.testing.assert_allclose(out, reference(inp, a, kd, vd), atol=2e-6, rtol=0)


def test_reference_agrees_with_features(kernel_path):
    """The float64 reference itself matches our output for every score feature (so it can
    judge the cases onnxruntime does not support)."""
    for extra in (dict(local_window_size=2), dict(softcap=0.4, bias="n1"), dict(sink=True),
                  dict(smooth_softmax=1), dict(causal=0), dict(scale=0.3)):
        inp, a = make_case(seed=3, B=2, S=5, past=0, N=4, Nkv=2, H=16, mode="PER_CHANNEL", bits=8, **extra)
        out, pk, pv = gqa.group_query_attention(**inp, **a)
        kd = dequant_cache(pk, inp["k_scale"], "PER_CHANNEL", 8, 16, 2)
        vd = dequant_cache(pv, inp["v_scale"], "PER_CHANNEL", 8, 16, 2)
        np.testing.assert_allclose(out, reference(inp, a, kd, vd), atol=2e-6, rtol=0)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_thread_count_does_not_change_results(threads):
    # large enough (T_max * B * Nkv * H >= 2^17) that the call really runs multi-threaded
    inp, a = make_case(seed=11, B=3, S=1, past=700, N=8, Nkv=4, H=64, mode="PER_TENSOR", bits=4,
                       ragged=[5, 701, 300], rotary=True, bias="full")
    base = gqa.group_query_attention(**inp, **a, num_threads=1)
    other = gqa.group_query_attention(**inp, **a, num_threads=threads)
    for x, y in zip(base, other):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("S,past", [(1, 8), (4, 0)], ids=["decode", "prompt"])
def test_empty_batch_gives_empty_outputs(flash, S, past):
    """batch_size 0: empty outputs, twice (the signature checks, then a repeat on the kept signature).
    The decode plan once divided by the unit count here (SIGFPE)."""
    B, H = 0, 16
    op = gqa.GroupQueryAttention(num_heads=4, kv_num_heads=2, k_quant_type="PER_TENSOR",
                                 v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    q = np.zeros((B, S, 4 * H), np.float32)
    k = np.zeros((B, S, 2 * H), np.float32)
    cache = np.zeros((B, 2, past, H), np.int8) if past else None
    one = np.ones(1, np.float32)
    with gqa.config(flash=flash):
        for _ in range(2):
            out, pk, pv = op(q, k, k.copy(), cache, None if cache is None else cache.copy(),
                             np.zeros(B, np.int32), past or S,
                             k_scale=one, v_scale=one)
            assert out.shape == (0, S, 4 * H) and pk.shape == pv.shape == (0, 2, past or S, H)


STOLEN_RANGES = """
import sys, numpy as np, gqa
sys.path.insert(0, sys.argv[1])
from _cases import make_case
inp, a = make_case(seed=12, B=2, S=1, past=900, N=8, Nkv=4, H=64, mode="PER_TENSOR", bits=8,
                   ragged=[901, 40])
base = gqa.group_query_attention(**inp, **a, num_threads=1)
for nt in (2, 3, 8):
    other = gqa.group_query_attention(**inp, **a, num_threads=nt)
    assert all(np.array_equal(x, y) for x, y in zip(base, other)), nt
print("ok")
"""


def test_units_of_threads_the_runtime_did_not_start_are_still_computed(tmp_path):
    """Decode units are split into one home range per requested thread (work_ranges.h);
    with OMP_THREAD_LIMIT=1 the team has one thread, which must take every other range too
    (an untaken unit would leave its rows of the uninitialised output as garbage)."""
    import os
    import subprocess
    import sys
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, OMP_THREAD_LIMIT="1",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gqa.__file__))))
    r = subprocess.run([sys.executable, "-c", STOLEN_RANGES, tests], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# -- in-place (shared buffer) mode ---------------------------------------------------------------
@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
def test_inplace_writes_only_new_rows(kernel_path, mode, bits):
    B, Nkv, H, L = 2, 2, 32, 24
    inp, a = make_case(seed=2, B=B, S=1, past=10, N=4, Nkv=Nkv, H=H, mode=mode, bits=bits or 8,
                       ragged=[5, 11], buf=L)
    pk, pv = inp["past_key"], inp["past_value"]
    before_k, before_v = pk.copy(), pv.copy()
    out, rk, rv = gqa.group_query_attention(**inp, **a, present_key=pk, present_value=pv)
    assert rk is pk and rv is pv
    fresh = gqa.group_query_attention(**dict(inp, past_key=before_k.copy(), past_value=before_v.copy()), **a)
    np.testing.assert_array_equal(out, fresh[0])
    for b, tb in enumerate([5, 11]):
        changed = np.nonzero((pk[b].view(np.uint8) != before_k[b].view(np.uint8)).any(axis=(0, 2)))[0]
        assert set(changed) <= {tb - 1}
        for buf, old in ((pk, before_k), (pv, before_v)):
            rows = np.ones(L, bool)
            rows[tb - 1] = False
            assert np.array_equal(buf[b][:, rows].view(np.uint8), old[b][:, rows].view(np.uint8))
            assert np.array_equal(buf[b][:, tb - 1].view(np.uint8), fresh[1 if buf is pk else 2][b][:, tb - 1].view(np.uint8))


@needs_ort
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 8), ("PER_CHANNEL", 4), ("NONE", 0)],
                         ids=["s8pt", "s4pc", "float"])
def test_100_decode_steps_inplace_vs_ort(mode, bits):
    rng = np.random.default_rng(99)
    N, Nkv, H, L, P0 = 4, 2, 32, 128, 8
    inp, a = make_case(seed=4, B=1, S=P0, past=0, N=N, Nkv=Nkv, H=H, mode=mode, bits=bits or 8,
                       buf=L, rotary=True)
    cdt = inp["past_key"].dtype
    Hp = H if (mode == "NONE" or bits == 8) else H // 2
    ours_k = np.zeros((1, Nkv, L, Hp), cdt)
    ours_v = np.zeros((1, Nkv, L, Hp), cdt)
    ref = _ort.OrtInPlace(dict(inp, total_sequence_length=P0), a, ours_k.copy(), ours_v.copy())
    cos, sin = np.tile(inp["cos_cache"], (10, 1)), np.tile(inp["sin_cache"], (10, 1))
    op = gqa.GroupQueryAttention(**a)
    for step in range(100 + 1):
        S = P0 if step == 0 else 1
        T = P0 + step
        x = dict(query=rng.uniform(-.5, .5, (1, S, N * H)).astype(np.float32),
                 key=rng.uniform(-.5, .5, (1, S, Nkv * H)).astype(np.float32),
                 value=rng.uniform(-.5, .5, (1, S, Nkv * H)).astype(np.float32),
                 seqlens_k=np.array([T - 1], np.int32), total_sequence_length=T,
                 cos_cache=cos, sin_cache=sin, k_scale=inp.get("k_scale"), v_scale=inp.get("v_scale"))
        want = ref.step(x)
        got = op(x["query"], x["key"], x["value"], ours_k, ours_v, x["seqlens_k"], T, cos, sin,
                 k_scale=x["k_scale"], v_scale=x["v_scale"], present_key=ours_k, present_value=ours_v)[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    rk, rv = ref.caches()
    assert np.array_equal(ours_k.view(np.uint8), rk.view(np.uint8))
    assert np.array_equal(ours_v.view(np.uint8), rv.view(np.uint8))


@needs_ort
@pytest.mark.parametrize("S,past", [(1, 10), (3, 10), (5, 0)], ids=["decode", "subsequent", "prompt"])
@pytest.mark.parametrize("mode,bits", [("PER_TENSOR", 8), ("PER_CHANNEL", 4), ("NONE", 0)],
                         ids=["s8pt", "s4pc", "float"])
def test_shared_kv_mode_vs_ort(kernel_path, S, past, mode, bits):
    """key/value of sequence length 0: the past already holds all T keys (shared-KV layers);
    nothing is appended, rotary applies to Q only."""
    T = past + S
    inp, a = make_case(seed=3, B=1, S=S, past=max(past, 1), N=4, Nkv=2, H=16, mode=mode,
                       bits=bits or 8, rotary=True)
    full, _ = make_case(seed=4, B=1, S=S, past=T, N=4, Nkv=2, H=16, mode=mode, bits=bits or 8)
    inp.update(past_key=full["past_key"], past_value=full["past_value"], key=inp["key"][:, :0],
               value=inp["value"][:, :0], seqlens_k=np.array([T - 1], np.int32), total_sequence_length=T)
    inp["cos_cache"] = np.tile(inp["cos_cache"], (4, 1))
    inp["sin_cache"] = np.tile(inp["sin_cache"], (4, 1))
    compare(inp, a)
