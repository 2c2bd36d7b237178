"""Multi-token steps of few query rows on the decode kernels (the plan's `direct`:
_attention.attend_direct): each K / V row read once for all S x G rows as stored, no float
tiles, the online softmax of the flash tiles, key chunks merged per unit.  Checked against
the naive path (each row over its own keys) within the flash path's tolerances
(tests/test_flash.py), on every kernel path; at accuracy level 4 against float64 within the
level's bound in tests/test_accuracy_level.py (test_level_4_step_within_its_bound)."""
import numpy as np
import pytest

import gqa
from _cases import make_case
from _flash import TOL, MODES, MODE_IDS, flash_vs_naive
from gqa._plan import flash_plan, direct_row_limit, step_row_limit

F32 = np.float32


def test_the_plan_takes_small_steps_direct():
    """S > 1 and S x G within the cache's limit, without matrix tiles: one query tile of all S
    rows, 256 keys per block, split in key chunks where the units are fewer than 8."""
    q_block, kv_block, splits, ranges, direct = flash_plan(1, 4, 2, 2, 64, 8192, 0, 8)
    assert direct and q_block == 4 and kv_block == 256 and splits == 4 and ranges == 2
    assert flash_plan(1, 4, 2, 2, 64, 8192, 0, 7)[4] is False         # 8 rows > 7
    assert flash_plan(1, 1, 2, 2, 64, 8192, 0, 64)[4] is False        # a decode step
    assert flash_plan(1, 4, 2, 2, 64, 8192, 512, 8)[:3] == (4, 256, 4)   # rows the tiles leave
    assert flash_plan(8, 4, 2, 2, 64, 8192, 0, 64)[2:] == (1, 16, True)   # 16 units: whole
    with gqa.config(flash_blocks=(2, 16), decode_splits=3):
        assert flash_plan(1, 4, 2, 2, 64, 8192, 0, 8) == (4, 16, 3, 2, True)


def test_the_row_limits():
    """Static codes and float rows: a limit that grows with the head (24 / 64 rows at 128 columns,
    levels 0 / 4; 16 for float rows), doubled where the units are fewer than 8; per-group codes:
    8 rows (16 at level 4); a step takes the smaller of K's and V's."""
    S8, F32_, G4 = 0, 4, 7 | (32 << 8)      # GQA_S8_PT, GQA_F32, INT4 in groups of 32
    assert direct_row_limit(S8, S8, 0, 128, 8) == 24 and direct_row_limit(S8, S8, 4, 128, 8) == 64
    assert direct_row_limit(S8, S8, 0, 64, 8) == 12 and direct_row_limit(S8, S8, 0, 64, 3) == 24
    assert direct_row_limit(F32_, F32_, 0, 256, 16) == 32 and direct_row_limit(F32_, F32_, 0, 8, 16) == 4
    assert direct_row_limit(G4, G4, 0, 64, 1) == 8 and direct_row_limit(G4, G4, 4, 256, 16) == 16
    assert direct_row_limit(S8, G4, 0, 128, 8) == 8 and direct_row_limit(F32_, S8, 4, 128, 8) == 16


def test_the_row_limits_with_matrix_tiles():
    """step_rows: without tiles (0) and on AVX-512 BF16's (2) direct_rows at the call's level
    (level 4 the integer decode kernels' own limit); tiles that take every step (1: AMX,
    BFDOT) none."""
    S8, F32_, G4 = 0, 4, 7 | (32 << 8)
    for args in [(S8, S8, 4, 128, 8), (S8, S8, 0, 64, 3), (F32_, F32_, 3, 256, 16), (G4, G4, 4, 64, 1)]:
        assert step_row_limit(*args, 0) == direct_row_limit(*args) == step_row_limit(*args, 2)
        assert step_row_limit(*args, 1) == 0
    assert step_row_limit(S8, S8, 4, 128, 8, 2) == 64 and step_row_limit(S8, S8, 3, 128, 8, 2) == 24
    assert step_row_limit(S8, S8, 4, 64, 3, 2) == 64 and step_row_limit(G4, G4, 4, 64, 1, 2) == 16
    assert step_row_limit(G4, G4, 3, 64, 1, 2) == 8
    assert step_row_limit(F32_, S8, 4, 128, 8, 2) == 16 == step_row_limit(F32_, S8, 4, 128, 8, 0)


FEATURES = {
    "plain": {}, "rotary": dict(rotary=True), "packed": dict(packed=True, rotary=True, interleaved=1),
    "bias": dict(bias="full"), "window5": dict(local_window_size=5), "window0": dict(local_window_size=0),
    "softcap": dict(softcap=0.4), "smooth": dict(smooth_softmax=1), "sink": dict(sink=True),
    "noncausal": dict(causal=0),
    "combo": dict(rotary=True, bias="n1", local_window_size=9, softcap=0.6, sink=True),
}


@pytest.mark.parametrize("mode,bits", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("blocks,splits", [(None, None), ((4, 16), None), ((4, 16), 5), (None, 1)],
                         ids=["auto", "k16", "k16-split5", "whole"])
def test_direct_step_matches_naive(kernel_path, mode, bits, feature, blocks, splits):
    """Three new tokens (6 rows per KV head: direct for every cache) after 90 (onnxruntime's
    contract: one sequence when a step of several tokens has a past)."""
    inp, a = make_case(seed=23, B=1, S=3, past=90, N=4, Nkv=2, H=32, mode=mode, bits=bits or 8,
                       **FEATURES[feature])
    assert flash_plan(1, 3, 2, 2, 32, 93, 0, 8)[4]
    with gqa.config(path=kernel_path):
        flash_vs_naive(inp, a, TOL[(mode, bits)], blocks=blocks, splits=splits)


@pytest.mark.parametrize("G,S", [(1, 2), (2, 5), (4, 2), (8, 2), (16, 4)])
def test_direct_groups(kernel_path, G, S):
    inp, a = make_case(seed=G, B=1, S=S, past=600, N=16, Nkv=16 // G, H=64, mode="PER_CHANNEL",
                       bits=8, rotary=True, bias="both1")
    with gqa.config(path=kernel_path):
        flash_vs_naive(inp, a, 1e-4)


def _cache_pair(mode, rng, T, S, dtype=F32, level=0):
    """Two KVCaches of `mode` holding the same T - S token prompt, and a step of S tokens."""
    kw = {}
    N, Nkv, H = 6, 2, 64
    for name, f in zip(("k_scales", "v_scales"), gqa.parse_mode(gqa.cache_options(mode)["mode"])):
        if f.static:
            kw[name] = np.full(Nkv * H if f.per_channel else 1, 0.02, F32)
    x = lambda n, w: rng.uniform(-1, 1, (1, n, w)).astype(dtype)  # noqa: E731
    prompt = (x(T - S, N * H), x(T - S, Nkv * H), x(T - S, Nkv * H))
    step = (x(S, N * H), x(S, Nkv * H), x(S, Nkv * H))
    caches = []
    for _ in range(2):
        c = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=Nkv, head_size=H, max_length=T,
                        mode=mode, dtype=dtype, accuracy_level=level, **kw)
        c.attend(0, *prompt)
        caches.append(c)
    return caches, step


@pytest.mark.parametrize("mode", ["int8-g32", "int4-g32", "int2-g32", "int4-g64+had", "int8-g32/int4-pt",
                                  "float16", "int4-g32+s3r5", "int8-g32+s4r64+had", "int8-pt+s2r7"])
def test_direct_step_on_every_format(kernel_path, mode):
    """Per-group caches (rotations too), mixed K / V formats, float16 rows and float windows
    (causal: blocks of codes, of the windows' floats, and the key where the rows' recent
    windows start, row by row): a step of 2 tokens (6 rows) over 700 keys on the decode
    kernels against the naive path."""
    rng = np.random.default_rng(5)
    dtype = np.float16 if mode == "float16" else F32
    (c0, c1), step = _cache_pair("float" if mode == "float16" else mode, rng, 700, 2, dtype)
    with gqa.config(path=kernel_path, flash=False):
        naive = c0.attend(0, *step)
    with gqa.config(path=kernel_path, flash=True):
        direct = c1.attend(0, *step)
    assert np.array_equal(c0.key[0], c1.key[0]) and np.array_equal(c0.value[0], c1.value[0])
    tol = 2e-3 if dtype == np.float16 else 2e-5
    np.testing.assert_allclose(direct.astype(np.float64), naive.astype(np.float64), atol=tol, rtol=0)


@pytest.mark.parametrize("partition", ["causal", "per_call"])
@pytest.mark.parametrize("splits", [None, 3])
def test_direct_step_with_float_windows(kernel_path, partition, splits):
    """A step of 2 tokens (6 rows) over a per-group INT4 cache of 300 positions with float
    windows (sink 3, recent 5) of either partition, in key chunks or not: the plan takes it to
    the decode kernels, and it equals the naive path (each row over its own floats and codes)
    within float32 summation orders."""
    rng = np.random.default_rng(8)
    N, Nkv, H, S, T = 6, 2, 64, 2, 300
    g4 = 7 | (32 << 8)       # INT4 in groups of 32 (gqa_kernels.h)
    assert flash_plan(1, S, Nkv, N // Nkv, H, T, 0, direct_row_limit(g4, g4, 0, H, Nkv))[4]
    x = lambda *shape: rng.uniform(-1, 1, shape).astype(F32)  # noqa: E731
    past = [gqa.quantize(x(1, Nkv, T - S, H), bits=4, group_size=32) for _ in range(2)]
    a = dict(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
             kv_cache_bit_width=4, kv_quant_group_size=32, sink_size=3, recent_size=5,
             window_partition=partition)
    inp = dict(query=x(1, S, N * H), key=x(1, S, Nkv * H), value=x(1, S, Nkv * H),
               past_key=past[0], past_value=past[1], seqlens_k=np.array([T - 1], np.int32),
               total_sequence_length=T, past_hp_key=x(1, Nkv, 8, H), past_hp_value=x(1, Nkv, 8, H))
    with gqa.config(path=kernel_path):
        flash_vs_naive(inp, a, 2e-5, splits=splits)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("splits", [None, 3])
def test_nonfinite_value_of_a_masked_key_stays_masked(kernel_path, bad, splits):
    """A float cache whose new value row 2 of 4 is NaN / inf: the step's rows 0 and 1 cannot
    see it (causal) and stay finite -- the key block they share with rows 2 and 3 must not
    carry 0 * inf into them -- and every row equals the naive path's."""
    inp, a = make_case(seed=31, B=1, S=4, past=300, N=4, Nkv=2, H=32, mode="NONE", bits=8)
    inp["value"][0, 2, :32] = bad            # KV head 0 of new token 2
    outs = []
    for flash in (False, True):
        with gqa.config(path=kernel_path, flash=flash, decode_splits=splits):
            outs.append(gqa.group_query_attention(**inp, **a)[0].reshape(4, 4, 32))
    naive, direct = outs
    assert np.isfinite(naive[:2]).all() and np.isfinite(naive[:, 2:]).all()
    assert not np.isfinite(naive[2:, :2]).any()
    np.testing.assert_allclose(direct, naive, atol=1e-5, rtol=0)   # NaN where naive has NaN


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_direct_results_do_not_depend_on_threads(threads):
    """Key chunks come from the plan (the CPU count), merged in chunk order."""
    inp, a = make_case(seed=8, B=1, S=3, past=3000, N=6, Nkv=2, H=64, mode="PER_TENSOR", bits=4)
    assert flash_plan(1, 3, 2, 3, 64, 3003, 0, 64)[2] > 1
    one = gqa.group_query_attention(**inp, **a, num_threads=1)[0]
    assert np.array_equal(gqa.group_query_attention(**inp, **a, num_threads=threads)[0], one)
