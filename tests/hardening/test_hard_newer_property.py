"""Property tests: random VALID calls of the newer surface against its float64 statement.

_newer_cases.random_spec draws per-group INT8 / INT4 / INT2 caches (fp32 / fp16 metadata,
rho; GroupQueryAttention's K or V, or both, may be a static per-tensor / per-channel INT8 /
INT4 cache instead), float windows in both partitions and all three ways of passing them,
rotations, QK norm, rotary, both operators, and the score features with ragged batches: causal 0, local
window, softcap, scale, attention bias (every broadcast), head sink, smooth softmax,
qk_output 1 / 2.  Each call runs at accuracy level 0 on the flash path (drawn tiles, decode
splits, kernel path, threads) and on the naive path, and must give:

* nothing written outside the caller buffers it may write (canaries), inputs unwritten, the
  past rows of the caches (and of an in-place buffer, every row but the step's) unchanged;
* flash and naive the same caches and windows, bit for bit;
* the step's new codes within half a code step of the statement's rows (rho = 1; fp16
  metadata adds the scale's and zero's rounding), the present windows the statement's rows
  (a past window's row bit for bit);
* output and output_qk within _newer_reference's bound of the statement (0 where a row
  attends nothing, and outside a row's keys in output_qk).
"""
import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import gqa
import _newer_cases as nc
from _hard_cases import valid_rows, within
from _level_bound import f16_allowance
from _cases import window_counts
from _newer_reference import U, Statement, reference
from _strategies import runtimes


def _call(spec, rt, flash, gain):
    """(outputs, inputs before the call, the names of the inputs it wrote in place, attributes)."""
    cls, attrs, inp, call, guard = nc.build(dict(spec, accuracy=0))
    inp["query"] = inp["query"] * inp["query"].dtype.type(gain)
    before = {k: x.copy() if isinstance(x, np.ndarray) else x for k, x in inp.items()}
    with gqa.config(path=rt["kernel"], flash=flash, flash_blocks=rt["blocks"] if flash else None,
                    decode_splits=rt["splits"] if flash else None):
        out = nc.make_op(cls, attrs)(**inp, **call, num_threads=rt["threads"])
    assert not guard.broken(), "a write past a caller buffer"
    written = {k for k, x in inp.items() if any(x is y for y in call.values())}
    for k, x in before.items():
        if isinstance(x, np.ndarray) and k not in written:
            assert np.array_equal(inp[k].view(np.uint8), x.view(np.uint8)), f"input {k} was written"
    return out, before, written, attrs


def _parts(out, attrs):
    """(output, present_key, present_value, output_qk or None, windows or None)."""
    qk = out[3] if attrs.get("qk_output", 0) else None
    rest = out[4:] if qk is not None else out[3:]
    return out[0], out[1], out[2], qk, (tuple(rest) if rest else None)


def _within(got, want, bound, what):
    within(got, want, bound, what, ("gqa", "float64"))


def _check_caches(spec, st, before, written, pk, pv):
    """Past rows unchanged (an in-place buffer: all but the step's rows); the new codes within
    half a step of the statement's rows (a static side: of the rows clipped to its codes'
    range; fp16 metadata: plus the scale's and zero's roundings to half; not with rho < 1)."""
    for i, (name, cache, rows, eta) in enumerate((("past_key", pk, st.kf, st.eta_kf),
                                                 ("past_value", pv, st.vf, st.eta_vf))):
        codes, scale, x, m = (st.ck, st.sk, st.xk, st.mk) if i == 0 else (st.uv, st.sv, st.xv, st.mv)
        kind, bits = st.types[i], spec["kv"[i] + "_bits"]
        check = kind != "PER_GROUP" or i == 1 or spec["rho"] == 1.0
        for b in range(spec["B"]):
            P, Tb = st.past_len(b), int(st.lens[b])
            if name in before:
                old = before[name][b]
                keep = np.zeros(old.shape[1], bool)
                keep[:P] = True
                if name in written:
                    keep[:] = True
                    keep[P:Tb] = False
                assert np.array_equal(cache[b][:, :old.shape[1]][:, keep], old[:, keep]), \
                    f"{name}[{b}]: rows outside the step's [{P}, {Tb}) changed"
            if not check:
                continue
            sl = (b, slice(None), slice(P, Tb))
            want, sc = rows[sl], scale[sl]
            tol = sc * (0.5 + 2.0 ** -9) + 4 * U * m[sl] + eta[sl]
            if kind != "PER_GROUP":
                tol = tol + np.maximum(np.abs(want) - (2 ** (bits - 1) - 1) * sc, 0)
            elif spec["metadata"] == "fp16":
                zero = x[sl] - codes[sl] * sc
                tol = tol + 2.0 ** -10 * ((2 ** bits - 1) * sc + np.abs(zero))
            _within(x[sl], want, tol, f"{name}[{b}]'s new codes")


def _check_windows(spec, st, attrs, windows):
    """The present windows: rows [0, ns) positions [0, ns), rows [ns, ns + nr) the last nr
    positions, each the statement's row within its eta (a past window's: bit for bit)."""
    for (side, rows, eta), w in zip((("key", st.kf, st.eta_kf), ("value", st.vf, st.eta_vf)), windows):
        for b in range(spec["B"]):
            Tb = int(st.lens[b])
            ns, nr = window_counts(Tb, attrs["sink_size"], attrs["recent_size"])
            pos = list(range(ns)) + list(range(Tb - nr, Tb))
            want, e = rows[b][:, pos], eta[b][:, pos]
            if w.dtype == np.float16:
                e = f16_allowance(e, np.abs(want)) * (e > 0)
            _within(w[b][:, :len(pos)], want, e + np.zeros_like(want), f"present_hp_{side}[{b}]")


def check_newer_valid(spec, rt, gain):
    for k in ("phase", "cls", "k_bits", "v_bits", "dtype"):
        event(f"{k}={spec[k]}")
    for k in ("bias", "head_sink", "smooth", "qk_output", "pasts", "prompt_lens", "softcap"):
        if spec[k]:
            event(k)
    if spec["window"] >= 0:
        event("local window")
    if not spec["causal"]:
        event("causal 0")
    flash, before, written, attrs = _call(spec, rt, True, gain)
    naive = _call(spec, rt, False, gain)[0]
    fo, pk, pv, fqk, fw = _parts(flash, attrs)
    no, npk, npv, nqk, nw = _parts(naive, attrs)
    for x, y, what in ((pk, npk, "present_key"), (pv, npv, "present_value")) + tuple(
            zip(fw or (), nw or (), ("present_hp_key", "present_hp_value"))):
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"{what}: flash and naive differ"
    st = Statement(spec, attrs, before, pk, pv)
    ref, ref_qk, bound, qk_bound = reference(st)
    B, S, N, H = spec["B"], spec["S"], spec["N"], spec["H"]
    _check_caches(spec, st, before, written, pk, pv)
    if fw is not None:
        _check_windows(spec, st, attrs, fw)
    rows = valid_rows(before, attrs, fo)
    f16 = before["query"].dtype == np.float16
    if f16:
        bound = f16_allowance(bound, np.abs(ref))
    for got, qk, what in ((fo, fqk, "flash"), (no, nqk, "naive")):
        _within(got.reshape(B, S, N, H)[rows], ref[rows], bound[rows], f"output ({what})")
        if qk is None:
            continue
        for b in range(B):
            tb = int(st.lens[b])
            want, qb = ref_qk[b][:, rows[b], :tb], qk_bound[b][:, rows[b], :tb]
            if f16:
                qb = f16_allowance(qb, np.abs(want))
            _within(qk[b][:, rows[b], :tb], want, qb, f"output_qk[{b}] ({what})")


GAINS = st.sampled_from([1.0, 1.0, 6.0])


@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS)
def test_newer_valid_calls_against_float64(seed, rt, gain):
    check_newer_valid(nc.random_spec(np.random.default_rng(seed)), rt, gain)


@settings(max_examples=max(4, settings.default.max_examples // 10))
@given(seed=st.integers(0, 2 ** 32 - 1), rt=runtimes(), gain=GAINS,
       phase=st.sampled_from(["prompt", "decode", "subsequent"]), H=st.sampled_from([64, 128, 256]),
       group=st.sampled_from([32, 64, 128, 0]), rows=st.integers(16, 80), past=st.integers(60, 300))
def test_newer_longer_calls_against_float64(seed, rt, gain, phase, H, group, rows, past):
    """Prompts of 16-80 rows and steps over 60-300 cached positions, heads of 64-256: the
    prompt kernels' blocks, flash tiles and decode splits that short calls do not reach."""
    spec = nc.random_spec(np.random.default_rng(seed))
    B = 1 if phase == "subsequent" else spec["B"]
    S = rows if phase == "prompt" else 1 if phase == "decode" else 2 + rows % 15
    spec.update(phase=phase, B=B, S=S, past=0 if phase == "prompt" else past, H=H,
                group=group if group < H else 0, pasts=None, prompt_lens=None,
                inplace=spec["inplace"] and phase != "prompt", extra_rows=0)
    check_newer_valid(spec, rt, gain)
