"""Property tests: random VALID GroupQueryAttention calls.

Every example runs on the naive path and on the flash path (random tiles / decode splits,
kernel path, thread count): present caches bit-identical between the two, outputs within
1e-4 (INT8) / 1e-3 (INT4) / 1e-5 (float caches).  Where onnxruntime 1.31.1 supports the
combination both are compared with it (caches bit-exact, outputs within 1e-5 f32 / 1e-3
f16); mixed K/V modes are compared per cache with onnxruntime's single-mode runs and the
output with the float64 reference.  Inputs are never written; an in-place call writes only
rows [T_b - S, T_b) of its cache.

Profiles (tests/conftest.py): "ci" (default, derandomized) and "long"
(``pytest tests/hardening --hypothesis-profile=long``).  Failures found are kept below as
@example regressions.
"""
import numpy as np
import pytest
from hypothesis import event, example, given, settings

import gqa
import _ort
from _hard_cases import (build, check_flash_vs_naive, check_mixed_vs_ort, check_vs_ort,
                         fresh_call, ort_supports, run)
from _strategies import runtimes, specs


def _snapshot(inp):
    return {k: x.copy() for k, x in inp.items() if isinstance(x, np.ndarray)}


def check_repeat(inp, a, call, rt, flash):
    """The same call twice through one operator, on the same buffers (an in-place cache
    restored in between): the repeat takes the short path of gqa/_signature.pyx where it applies;
    both equal the flash result bit for bit."""
    i3, c3 = fresh_call(inp, call)
    start = (i3["past_key"].copy(), i3["past_value"].copy()) if call else None
    with gqa.config(path=rt["kernel"], flash=True, flash_blocks=rt["blocks"], decode_splits=rt["splits"]):
        op = gqa.GroupQueryAttention(**a)
        for rep in range(2):
            if start is not None:
                i3["past_key"][...], i3["past_value"][...] = start
            got = op(**i3, **c3, num_threads=rt["threads"])
            assert len(got) == len(flash)
            for g, f in zip(got, flash):
                assert np.array_equal(g.view(np.uint8), f.view(np.uint8)), f"repeat {rep} differs"


def check_spec(spec, rt):
    for k in ("phase", "mode", "dtype"):
        event(f"{k}={spec[k]}")
    for k in ("shared_kv", "inplace", "packed", "rotary", "qk_output", "sink", "bias"):
        if spec[k]:
            event(k)
    if spec["v_mode"] != spec["mode"]:
        event("mixed K/V modes")
    if spec["window"] >= 0:
        event("window")
    inp, a, call = build(spec)
    before = _snapshot(inp)
    kw = dict(kernel=rt["kernel"], threads=rt["threads"])
    i1, c1 = fresh_call(inp, call)
    naive = run(i1, a, c1, flash=False, **kw)
    i2, c2 = fresh_call(inp, call)
    flash = run(i2, a, c2, flash=True, blocks=rt["blocks"], splits=rt["splits"], **kw)
    for k, old in before.items():     # inputs are read only (fresh_call copied the in-place ones)
        assert np.array_equal(inp[k].view(np.uint8), old.view(np.uint8)), f"input {k} was written"
    if call:
        assert flash[1] is c2["present_key"] and flash[2] is c2["present_value"]
        S, L = inp["query"].shape[1], (0 if spec["shared_kv"] else inp["query"].shape[1])
        for name, buf in (("past_key", flash[1]), ("past_value", flash[2])):
            old = before[name]
            for b, sk in enumerate(inp["seqlens_k"]):
                keep = np.ones(old.shape[2], bool)
                keep[int(sk) + 1 - L:int(sk) + 1] = False
                assert np.array_equal(buf[b][:, keep].view(np.uint8), old[b][:, keep].view(np.uint8)), \
                    f"in-place {name}[{b}] changed outside rows [T_b - S, T_b)"
    check_flash_vs_naive(spec, naive, flash)
    check_repeat(inp, a, call, rt, flash)
    if ort_supports(spec):
        if len(_ort._cache) > 200:     # sessions are per signature; keep memory bounded
            _ort._cache.clear()
        check_vs_ort(spec, inp, a, call, flash)
        check_vs_ort(spec, inp, a, call, naive)
        event("checked against onnxruntime")
    elif _ort.available():
        check_mixed_vs_ort(spec, inp, a, call, flash)
        event("checked against onnxruntime single-mode caches + float64 reference")


def _spec(**kw):
    base = dict(seed=0, phase="decode", B=1, S=1, past=1, pasts=None, prompt_lens=None, N=1, Nkv=1, H=8,
                mode="NONE", v_mode="NONE", bits=0, dtype="f32", buf_extra=0, T_extra=0, packed=False,
                shared_kv=False, rotary=False, interleaved=False, rot_dim=None, pos_ids=False, bias=None,
                sink=False, smooth=False, window=-1, softcap=0.0, qk_output=0, scale=0.0, causal=True,
                inplace=False, t_array=False)
    base.update(kw)
    return base


_RT = dict(kernel="scalar", threads=1, blocks=None, splits=None)


# Regressions: examples hypothesis found (harness bugs and onnxruntime's cache-length rule, see
# HARD_NOTES.md), kept so they run on every profile.
@example(spec=_spec(shared_kv=True, inplace=True, sink=True, smooth=True, causal=False), rt=_RT)
@example(spec=_spec(phase="subsequent", S=2, past=1, buf_extra=1, T_extra=2, inplace=True,
                    mode="PER_CHANNEL", v_mode="PER_CHANNEL", bits=4, H=32, rotary=True, pos_ids=True),
         rt=dict(_RT, kernel="avx2" if "avx2" in gqa.available_paths() else "scalar", blocks=(1, 1)))
@example(spec=_spec(B=3, pasts=[0, 5, 2], past=5, shared_kv=True, mode="PER_TENSOR", v_mode="PER_CHANNEL",
                    bits=8, H=16, N=4, Nkv=2, window=2), rt=dict(_RT, splits=3))
@given(spec=specs(), rt=runtimes())
def test_valid_calls(spec, rt):
    check_spec(spec, rt)


# a float16 score of 2.32 one float16 step (2^-9) from onnxruntime's: the tolerance's float16
# term (assert_close), found by the "long" profile
@example(spec=_spec(B=2, past=168, N=2, Nkv=2, H=256, mode="PER_CHANNEL", v_mode="PER_CHANNEL",
                    bits=8, dtype="f16", packed=True, sink=True, smooth=True, qk_output=1,
                    scale=1.5, causal=False, inplace=True), rt=_RT)
@settings(max_examples=max(8, settings.default.max_examples // 12))
@given(spec=specs(big=True), rt=runtimes())
def test_valid_calls_multithreaded_sizes(spec, rt):
    """Longer caches and wider heads, so the compute really splits across threads."""
    check_spec(spec, rt)


def test_profile_is_registered():
    assert settings.get_profile("ci").deadline is None
    assert settings.get_profile("long").max_examples > settings.get_profile("ci").max_examples
