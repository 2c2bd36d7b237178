"""Property tests: random VALID calls at accuracy levels 3 and 4, of both surfaces.

The onnxruntime surface (the features of test_hard_property.py: rotary, packed QKV, shared
KV, bias, window, softcap, smooth softmax, sink, qk_output, scale, causal 0, ragged batches,
float16, in-place caches, INT8 / INT4 per tensor / per channel and mixed, float caches) and
the newer one (_newer_cases.py: per-group caches beside static ones, float windows,
rotations, QK norm, the mixed-precision operator, the score features and ragged batches).  Each example runs at levels 0, 3 and 4 on one kernel path, thread
count and tiling, with the matrix tiles off, and level 4 on the naive path too:

* inputs are never written (the newer cases: nothing past a caller buffer); the caches and
  windows levels 3 and 4 write are level 0's, bit for bit;
* level 3 is level 0, every output bit for bit (without tiles no level-3 kernel runs);
* level 4's output (and output_qk) is within _level_bound's bound of level 0's.

The same calls again on each kind of matrix tiles this CPU (or an emulated build:
tests/hardening/test_emulated.py) runs -- AMX, AVX-512 BF16, BFDOT -- on the tiles' path:
levels 3 and 4 (flash; level 4 naive too) write level 0's caches and windows bit for bit, and
their outputs and output_qk stay within _level_bound's bound with the tiles' bfloat16 terms.

The query rows are scaled by a drawn gain so that scores span small to peaked softmaxes.
"""
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import gqa
from gqa import _dispatch
from _hard_cases import build, fresh_call, run, valid_rows, within
import _newer_cases as nc
from _level_bound import f16_allowance, level4_bounds, level4_bounds_newer
from _newer_reference import Statement
from _strategies import runtimes, specs


# each kind of matrix tiles and the path that runs it
TILE_PATHS = {"amx": "avx512", "avx512bf16": "avx512", "neonbf16": "neon"}
ELSEWHERE = {"amx": "tests/hardening/test_emulated.py runs them emulated on x86-64",
             "avx512bf16": "tests/hardening/test_emulated.py runs them emulated on x86-64",
             "neonbf16": "they need aarch64's BFloat16 extension; tests/isa neonbf16-qemu checks their kernels"}
on_tiles = pytest.mark.parametrize("tiles", [
    pytest.param(name, marks=pytest.mark.skipif(
        not _dispatch.tiles_runnable(name),
        reason=f"this CPU, OS or build does not run the {name} tiles ({ELSEWHERE[name]})"))
    for name in TILE_PATHS])


def _levels(inp, a, call, rt, tiles=False):
    """{(level, flash): outputs} of one call at levels 0, 3, 4 (flash) and 4 (naive); level 0
    without tiles, the others with `tiles` (False, or a kind's name)."""
    outs = {}
    for level, flash in ((0, True), (3, True), (4, True), (4, False)):
        i, c = fresh_call(inp, call)
        with gqa.config(tiles=tiles if level else False):
            outs[level, flash] = run(i, dict(a, accuracy_level=level), c, kernel=rt["kernel"], flash=flash,
                                     threads=rt["threads"], blocks=rt["blocks"] if flash else None,
                                     splits=rt["splits"] if flash else None)
    return outs


def _same(x, y):
    return np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


def _within(got, want, bound, what):
    within(got, want, bound, what, (what.split(" output")[0], "level 0"))


def _check_qk(spec, lens, rows, got, base, qk_bound, what):
    """output_qk of level 3 / 4 within qk_bound of level 0's, each batch's rows over its T_b keys."""
    for b in range(spec["B"]):
        tb = int(lens[b])
        qb = qk_bound[b][:, rows[b], :tb]
        want = base[b][:, rows[b], :tb]
        if spec["dtype"] == "f16":     # each level's scores rounded to float16 once
            qb = f16_allowance(qb, np.abs(want.astype(np.float64)))
        _within(got[b][:, rows[b], :tb], want, qb, what.replace(" output", f" output_qk[{b}]", 1))


def check_levels(spec, rt, gain, tiles=False):
    """One call at levels 0, 3 and 4 (tiles: a kind of matrix tiles, on its path)."""
    for k in ("phase", "mode", "dtype"):
        event(f"{k}={spec[k]}")
    if tiles:
        rt = dict(rt, kernel=TILE_PATHS[tiles])
    inp, a, call = build(spec)
    N, H = spec["N"], spec["H"]
    q = inp["query"].copy()
    q[..., :N * H] *= q.dtype.type(gain)
    inp["query"] = q
    before = {k: x.copy() for k, x in inp.items() if isinstance(x, np.ndarray)}
    outs = _levels(inp, a, call, rt, tiles)
    for k, old in before.items():
        assert _same(inp[k], old), f"input {k} was written"
    base = outs[0, True]
    if not tiles:
        for i, (x, y) in enumerate(zip(outs[3, True], base)):
            assert _same(x, y), f"level 3 output {i} differs from level 0's (no tiles)"
    with gqa.config(path=rt["kernel"], tiles=tiles):   # a float cache's prompt tiles as codes?
        float_tiles = _dispatch.float_tile_types_at(4, H) != (-1, -1)
    bound, qk_bound = level4_bounds(spec, inp, a, base[0], base[1], base[2], float_tiles, bool(tiles))
    rows = valid_rows(inp, a, base[0])
    runs = [(4, True), (4, False)] + ([(3, True)] if tiles else [])
    for level, flash in runs:
        got = outs[level, flash]
        what = f"level {level}{' on ' + tiles if tiles else ''} output ({'flash' if flash else 'naive'})"
        assert len(got) == len(base)
        for i in (1, 2):
            assert _same(got[i], base[i]), f"{what}: cache {i} differs from level 0's"
        _within(got[0][rows], base[0][rows], bound[rows], what)
        if qk_bound is not None:
            _check_qk(spec, inp["seqlens_k"] + 1, rows, got[3], base[3], qk_bound, what)
        if not _same(got[0], base[0]):
            event(f"level {level} moved the output ({'flash' if flash else 'naive'})")


GAINS = st.sampled_from([1.0, 6.0, 40.0])


@settings(max_examples=max(12, settings.default.max_examples // 2))
@given(spec=specs(), rt=runtimes(), gain=GAINS)
def test_valid_calls_at_levels_3_and_4(spec, rt, gain):
    check_levels(spec, rt, gain)


@settings(max_examples=max(4, settings.default.max_examples // 6))
@given(spec=specs(big=True), rt=runtimes(), gain=GAINS)
def test_longer_calls_at_level_4(spec, rt, gain):
    """Longer caches and wider heads: flash decoding's splits."""
    check_levels(spec, rt, gain)


@settings(max_examples=max(4, settings.default.max_examples // 10))
@given(spec=specs(big=True, phase="prompt", prompt_rows=(16, 96)), rt=runtimes(), gain=GAINS)
def test_long_prompts_at_level_4(spec, rt, gain):
    """Prompts long enough for the prompt kernels (on avx2 a float cache's tiles as codes)."""
    check_levels(spec, rt, gain)


def _newer_call(spec, level, rt, flash, gain, tiles=False):
    """(outputs, inputs before the call, attributes) of the newer-surface call `spec` at
    `level`, its query times `gain`, with `tiles` (False or a kind's name) at levels 3-4."""
    cls, attrs, inp, call, guard = nc.build(dict(spec, accuracy=level))
    q = inp["query"].copy()
    q *= q.dtype.type(gain)
    inp["query"] = q
    before = {k: x.copy() if isinstance(x, np.ndarray) else x for k, x in inp.items()}
    with gqa.config(path=rt["kernel"], flash=flash, tiles=tiles if level else False,
                    flash_blocks=rt["blocks"] if flash else None,
                    decode_splits=rt["splits"] if flash else None):
        out = nc.make_op(cls, attrs)(**inp, **call, num_threads=rt["threads"])
    assert not guard.broken(), "a write past a caller buffer"
    return out, before, attrs


@settings(max_examples=max(8, settings.default.max_examples // 4))
@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS)
def test_newer_surface_at_levels_3_and_4(seed, rt, gain):
    """The newer surface (_newer_cases.py: per-group INT8 / INT4 / INT2 caches or static
    sides, float windows in both partitions, rotations, QK norm, rotary, the mixed-precision
    operator, the score features, ragged batches) at levels 0, 3 and 4: level 3 is level 0 bit
    for bit, level 4 writes the same caches and windows and its output and output_qk (flash
    and naive) stay within level4_bounds_newer of level 0's."""
    check_newer(nc.random_spec(np.random.default_rng(seed)), rt, gain)


@settings(max_examples=max(4, settings.default.max_examples // 12))
@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS, H=st.sampled_from([64, 128, 256]),
       S=st.integers(16, 80), group=st.sampled_from([32, 64, 128, 0]))
def test_newer_surface_long_prompts_at_level_4(seed, rt, gain, H, S, group):
    """Prompts of 16-80 rows with wide heads over per-group caches: the prompt kernels' packed
    per-group blocks (on avx2), windows and rotations among them."""
    spec = nc.random_spec(np.random.default_rng(seed))
    spec.update(phase="prompt", S=S, past=0, H=H, group=group if group < H else 0, inplace=False,
                extra_rows=0)
    check_newer(spec, rt, gain)


def check_newer(spec, rt, gain, tiles=False):
    """One newer-surface call at levels 0, 3 and 4 (tiles: a kind of matrix tiles, on its path)."""
    for k in ("phase", "cls", "k_bits", "v_bits"):
        event(f"{k}={spec[k]}")
    if tiles:
        rt = dict(rt, kernel=TILE_PATHS[tiles])
    base, before, attrs = _newer_call(spec, 0, rt, True, gain)
    if not tiles:
        for x, y in zip(_newer_call(spec, 3, rt, True, gain)[0], base):
            assert _same(x, y), "level 3 differs from level 0 (no tiles)"
    g = spec["group"] or spec["H"]
    with gqa.config(path=rt["kernel"], tiles=tiles):
        group_kernels = _dispatch.group_dot_unit() is not None and g % 32 == 0 and g <= 256
    st = Statement(spec, attrs, before, base[1], base[2])
    bound, qk_bound = level4_bounds_newer(st, base[0], group_kernels, bool(tiles))
    rows = valid_rows(before, attrs, base[0])
    qk = 3 if qk_bound is not None else None
    for level, flash in [(4, True), (4, False)] + ([(3, True)] if tiles else []):
        got = _newer_call(spec, level, rt, flash, gain, tiles)[0]
        what = f"level {level}{' on ' + tiles if tiles else ''} output ({'flash' if flash else 'naive'})"
        assert len(got) == len(base)
        for i in range(1, len(base)):
            if i != qk:
                assert _same(got[i], base[i]), f"{what}: output {i} (caches, windows) differs from level 0's"
        _within(got[0][rows], base[0][rows], bound[rows], what)
        if qk is not None:
            _check_qk(spec, st.lens, rows, got[qk], base[qk], qk_bound, what)
        if not _same(got[0], base[0]):
            event(f"level {level} moved the output ({'flash' if flash else 'naive'})")


# ---------------------------------------------------------------- on matrix tiles

@on_tiles
@settings(max_examples=max(8, settings.default.max_examples // 4))
@given(spec=specs(), rt=runtimes(), gain=GAINS)
def test_valid_calls_on_tiles(tiles, spec, rt, gain):
    """Every phase on the tiles' path (decode steps of a float cache with 3+ query rows run the
    bfloat16 decode kernels where the tiles are AVX-512 BF16's; level 4's INT8 on AMX's)."""
    check_levels(spec, rt, gain, tiles)


@on_tiles
@settings(max_examples=max(6, settings.default.max_examples // 6))
@given(spec=specs(big=True, phase="prompt", prompt_rows=(16, 96)), rt=runtimes(), gain=GAINS)
def test_long_prompts_on_tiles(tiles, spec, rt, gain):
    """Prompts of 16-96 rows: the flash tiles on the matrix tiles, every score feature."""
    check_levels(spec, rt, gain, tiles)


@on_tiles
@settings(max_examples=max(6, settings.default.max_examples // 6))
@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS)
def test_newer_surface_on_tiles(tiles, seed, rt, gain):
    """The newer surface (per-group and static sides, float windows -- a multi-token step's mixed
    tiles --, rotations, QK norm, the score features) on the tiles' path."""
    check_newer(nc.random_spec(np.random.default_rng(seed)), rt, gain, tiles)


@on_tiles
@settings(max_examples=max(4, settings.default.max_examples // 12))
@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS, H=st.sampled_from([64, 128, 256]),
       S=st.integers(16, 80), group=st.sampled_from([32, 64, 128, 0]))
def test_newer_surface_long_prompts_on_tiles(tiles, seed, rt, gain, H, S, group):
    """Prompts of 16-80 rows with wide heads over per-group caches on the tiles."""
    spec = nc.random_spec(np.random.default_rng(seed))
    spec.update(phase="prompt", S=S, past=0, H=H, group=group if group < H else 0, inplace=False,
                extra_rows=0)
    check_newer(spec, rt, gain, tiles)
