"""Fuzz worker, run in a subprocess by test_hard_fuzz.py (so a crash is caught and reported).

  python tests/hardening/_fuzz_worker.py invalid --seed 1 --count 3000 --progress FILE
  python tests/hardening/_fuzz_worker.py layout  --seed 1 --count 400  --progress FILE
  python tests/hardening/_fuzz_worker.py invalid --seed 1 --only 1234     # one case, verbose

invalid: a random valid call, then one mutation (_mutations.py).  Must raise ValueError or
         TypeError whose message names the argument, with every caller buffer (inputs and
         present buffers) byte-for-byte unchanged.
layout:  a random valid call whose inputs are given non-contiguous, Fortran-ordered, with
         negative strides, read-only or unaligned: the results must equal (bit for bit) the
         contiguous call's, and the inputs must be unchanged.
Before each case its description is written to the progress file (one JSON line, flushed),
so when the process dies the parent knows which case killed it.  The summary is one JSON
object on stdout.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import numpy as np  # noqa: E402

import gqa  # noqa: E402
from _hard_cases import build, fresh_call, random_spec  # noqa: E402
from _mutations import MAYBE_VALID, MUTATIONS, _bad_layout  # noqa: E402

LAYOUTS = ("noncontiguous", "readonly", "unaligned", "fortran", "negative")


def _snap(objs):
    out = []
    for x in objs:
        if isinstance(x, np.ndarray):
            out.append((x, x.tobytes()))
        elif isinstance(x, memoryview):
            out.append((x, x.tobytes()))
    return out


def _changed(snap):
    return [i for i, (x, b) in enumerate(snap) if x.tobytes() != b]


def _describe(v):
    if isinstance(v, np.ndarray):
        return f"ndarray{v.shape}:{v.dtype}{'' if v.flags.c_contiguous else ':noncontig'}" \
               f"{'' if v.flags.aligned else ':unaligned'}{'' if v.flags.writeable else ':ro'}"
    if isinstance(v, (list, memoryview)):
        return type(v).__name__
    return repr(v)[:40]


def _attempt(fn, allowed=(ValueError, TypeError)):
    """(outcome, message, result, seconds) of fn(): "raised" (an allowed exception),
    "wrong_exception" (any other) or "accepted"."""
    t0 = time.perf_counter()
    outcome, msg, out = "accepted", "", None
    try:
        out = fn()
    except allowed as e:
        outcome, msg = "raised", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001  (any other type is a failure)
        outcome, msg = "wrong_exception", f"{type(e).__name__}: {e}"
    return outcome, msg, out, time.perf_counter() - t0


def _verdict(outcome, msg, out, words, maybe_valid, snap, dt):
    """The problems of an invalid call's outcome: a refusal names one of `words` and leaves
    the caller buffers of `snap` unchanged; an accepted call must be a maybe-valid mutation
    with a finite output; nothing takes over 5 s."""
    problems = []
    if outcome == "wrong_exception":
        problems.append("raised " + msg)
    elif outcome == "accepted":
        if not maybe_valid:
            problems.append("invalid call accepted")
        elif not np.isfinite(np.asarray(out[0], np.float64)).all():
            problems.append("accepted call gave non-finite output")
    else:
        if not any(w in msg for w in words):
            problems.append(f"message names none of {words}: {msg}")
        changed = _changed(snap)
        if changed:
            problems.append(f"caller buffers {changed} modified by a rejected call")
    if dt > 5:
        problems.append(f"took {dt:.1f} s")
    return problems


def invalid_case(seed, i):
    rng = np.random.default_rng([seed, i])
    spec = random_spec(rng)
    names = sorted(MUTATIONS)
    for _ in range(20):
        mname = names[int(rng.integers(len(names)))]
        inp, a, call = build(spec)
        res = MUTATIONS[mname](rng, inp, a, call, spec)
        if res is not None:
            return spec, mname, res
    raise RuntimeError("no applicable mutation")


def run_invalid(seed, i, progress, verbose=False):
    spec, mname, (inp, a, call, words) = invalid_case(seed, i)
    desc = dict(i=i, seed=seed, kind="invalid", mutation=mname, spec=spec,
                args={k: _describe(v) for k, v in list(inp.items()) + list(call.items())},
                attrs={k: repr(v) for k, v in a.items()})
    progress.write(json.dumps(desc) + "\n")
    progress.flush()
    snap = _snap(list(inp.values()) + list(call.values()))
    outcome, msg, out, dt = _attempt(lambda: gqa.group_query_attention(**inp, **a, **call))
    problems = _verdict(outcome, msg, out, words, mname in MAYBE_VALID, snap, dt)
    if verbose:
        print(json.dumps(desc, indent=1), "\n->", outcome, msg, problems)
    return dict(desc, outcome=outcome, message=msg[:300], problems=problems)


def run_newer(seed, i, progress, verbose=False):
    """A valid call of the newer surface (_newer_cases.py), then one mutation
    (_newer_mutations.py): ValueError / TypeError naming the argument, every caller buffer
    and the canary bytes around the written ones unchanged."""
    import _newer_cases as nc
    import _newer_mutations as nm
    rng = np.random.default_rng([seed, i, 11])
    names = sorted(nm.MUTATIONS)
    for _ in range(20):
        spec = nc.random_spec(rng)
        mname = names[int(rng.integers(len(names)))]
        cls, attrs, inp, call, guard = nc.build(spec)
        res = nm.MUTATIONS[mname](rng, cls, attrs, dict(inp), dict(call), spec, guard)
        if res is not None:
            break
    else:
        raise RuntimeError("no applicable mutation")
    cls, attrs, inp, call, words = res
    desc = dict(i=i, seed=seed, kind="newer", mutation=mname, spec=spec, cls=cls,
                args={k: _describe(v) for k, v in list(inp.items()) + list(call.items())},
                attrs={k: repr(v) for k, v in attrs.items()})
    progress.write(json.dumps(desc) + "\n")
    progress.flush()
    snap = _snap(list(inp.values()) + list(call.values()))
    outcome, msg, out, dt = _attempt(lambda: nc.make_op(cls, attrs)(**inp, **call))
    problems = _verdict(outcome, msg, out, words, mname in nm.MAYBE_VALID, snap, dt)
    if guard.broken():
        problems.append(f"canary bytes around written buffers {guard.broken()} overwritten")
    if verbose:
        print(json.dumps(desc, indent=1), "\n->", outcome, msg, problems)
    return dict(desc, outcome=outcome, message=msg[:300], problems=problems)


def _cache_state(cache):
    rows = cache.key + cache.value + cache.hp_key + cache.hp_value + (cache.undo_key or []) + \
        (cache.undo_value or [])
    return [a.tobytes() for a in rows if a is not None] + [
        cache.length, cache._step_size, list(cache._in_step), cache.rollback_floor.tolist()]


def run_kvcache(seed, i, progress, verbose=False):
    """A valid KVCache and a few steps (_kvcache_mutations.py), then one mutation of its
    construction or use: ValueError / TypeError naming the problem (MemoryError allowed for
    a construction larger than memory); a refused use leaves buffers and length unchanged."""
    import _kvcache_mutations as km
    rng = np.random.default_rng([seed, i, 13])
    names = sorted(km.MUTATIONS)
    for _ in range(20):
        spec = km.random_spec(rng)
        mname = names[int(rng.integers(len(names)))]
        res = km.MUTATIONS[mname](rng, spec, km.kwargs(spec))
        if res is not None:
            break
    else:
        raise RuntimeError("no applicable mutation")
    what, arg, words = res
    desc = dict(i=i, seed=seed, kind="kvcache", mutation=mname, spec=spec, what=what,
                kwargs={k: _describe(v) for k, v in (arg.items() if what == "construct" else ())})
    progress.write(json.dumps(desc) + "\n")
    progress.flush()
    state = {}

    def act():
        if what == "construct":
            return gqa.KVCache(**arg)
        cache = state["cache"] = gqa.KVCache(**km.kwargs(spec))
        km.steps(spec, cache)
        prepare, bad = arg
        if prepare is not None:
            prepare(cache)
        state["before"] = _cache_state(cache)
        return bad(cache)
    # a construction larger than memory may raise MemoryError; a use may not
    allowed = (ValueError, TypeError) + ((MemoryError,) if what == "construct" else ())
    outcome, msg, _, dt = _attempt(act, allowed)
    problems = []
    if outcome == "wrong_exception":
        problems.append("raised " + msg)
    elif outcome == "accepted":
        problems.append("invalid construction or use accepted")
    elif not msg.startswith("MemoryError") and not any(w in msg for w in words):
        problems.append(f"message names none of {words}: {msg}")
    if "before" in state and outcome != "accepted" and _cache_state(state["cache"]) != state["before"]:
        problems.append("a refused use changed the cache")
    if dt > 5:
        problems.append(f"took {dt:.1f} s")
    if verbose:
        print(json.dumps(desc, indent=1), "\n->", outcome, msg, problems)
    return dict(desc, outcome=outcome, message=msg[:300], problems=problems)


def _layout(rng, x):
    how = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
    if how == "negative":
        if x.ndim == 0 or x.shape[0] == 0:
            return x, how
        return x[::-1].copy()[::-1], how
    if how == "fortran" and x.ndim < 2:
        how = "noncontiguous"
    return _bad_layout(rng, x, how), how


def run_layout_kernels(seed, i, progress, rng, verbose=False):
    """The kernel API (quantize, dequantize, qk_gemm, sv_gemm) with odd-layout inputs."""
    bits = 8 if rng.integers(2) else 4
    M, K, Nn = (int(x) for x in rng.integers(1, 40, 3))
    pc = bool(rng.integers(2))
    kernel = gqa.available_paths()[int(rng.integers(len(gqa.available_paths())))]
    x = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    sk = rng.uniform(0.01, 0.1, K if pc else 1).astype(np.float32)
    sn = rng.uniform(0.01, 0.1, Nn if pc else 1).astype(np.float32)
    with gqa.config(path=kernel):
        bq = gqa.quantize(rng.uniform(-1, 1, (Nn, K)).astype(np.float32), sk, bits=bits)   # [N, K]
        bs = gqa.quantize(rng.uniform(-1, 1, (K, Nn)).astype(np.float32), sn, bits=bits)   # [K, N]
        calls = {
            "quantize": (gqa.quantize, [x, sk], dict(bits=bits)),
            "dequantize": (gqa.dequantize, [bq, sk], dict(bits=bits, head_size=K)),
            "qk_gemm": (gqa.qk_gemm, [x, bq, sk], dict(bits=bits, alpha=0.5)),
            "sv_gemm": (gqa.sv_gemm, [x, bs, sn], dict(bits=bits, n=Nn)),
        }
        name = sorted(calls)[int(rng.integers(4))]
        fn, args, kw = calls[name]
        odd, hows = [], []
        for arg in args:
            y, how = _layout(rng, arg) if rng.integers(3) else (arg, "contiguous")
            odd.append(y)
            hows.append(how)
        desc = dict(i=i, seed=seed, kind="layout", api=name, kernel=kernel, layouts=hows)
        progress.write(json.dumps(desc) + "\n")
        progress.flush()
        snap = _snap(odd)
        problems = []
        want = fn(*args, **kw)
        try:
            got = fn(*odd, **kw)
            if got.tobytes() != want.tobytes():
                problems.append(f"{name} result differs from the contiguous call's")
        except Exception as e:  # noqa: BLE001
            problems.append(f"valid {name} call with {hows} raised {type(e).__name__}: {e}")
        if _changed(snap):
            problems.append("an input was written")
    if verbose:
        print(json.dumps(desc, indent=1), "\n->", problems)
    return dict(desc, problems=problems)


def run_layout(seed, i, progress, verbose=False):
    rng = np.random.default_rng([seed, i, 7])
    if rng.integers(4) == 0:
        return run_layout_kernels(seed, i, progress, rng, verbose)
    spec = random_spec(rng)
    inp, a, call = build(spec)
    kernel = gqa.available_paths()[int(rng.integers(len(gqa.available_paths())))]
    flash = bool(rng.integers(2))
    changed_inputs = {}
    odd = dict(inp)
    for name, x in inp.items():
        if not isinstance(x, np.ndarray) or rng.integers(3) == 0:
            continue
        if call and name in ("past_key", "past_value"):
            continue
        odd[name], changed_inputs[name] = _layout(rng, x)
    desc = dict(i=i, seed=seed, kind="layout", spec=spec, kernel=kernel, flash=flash,
                layouts=changed_inputs)
    progress.write(json.dumps(desc) + "\n")
    progress.flush()
    problems = []
    with gqa.config(path=kernel, flash=flash):
        i1, c1 = fresh_call(inp, call)
        want = gqa.group_query_attention(**i1, **a, **c1)
        snap = _snap([odd[k] for k in changed_inputs])
        i2, c2 = fresh_call(odd, call)
        try:
            got = gqa.group_query_attention(**i2, **a, **c2)
        except Exception as e:  # noqa: BLE001
            problems.append(f"valid call with {changed_inputs} raised {type(e).__name__}: {e}")
            got = None
    if got is not None:
        for k, (x, y) in enumerate(zip(want, got)):
            if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                problems.append(f"output {k} differs from the contiguous call's")
        if _changed(snap):
            problems.append("an input was written")
    if verbose:
        print(json.dumps(desc, indent=1), "\n->", problems)
    return dict(desc, problems=problems)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("invalid", "layout", "newer", "kvcache"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--only", type=int, default=None)
    ap.add_argument("--progress", default=os.devnull)
    ap.add_argument("--keep", type=int, default=40, help="failures reported in full")
    ap.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    args = ap.parse_args()
    fn = dict(invalid=run_invalid, layout=run_layout, newer=run_newer,
              kvcache=run_kvcache)[args.kind]
    with open(args.progress, "w") as progress:
        if args.only is not None:
            r = fn(args.seed, args.only, progress, verbose=True)
            sys.exit(1 if r["problems"] else 0)
        t0 = time.perf_counter()
        counts, outcomes, failures, n = {}, {}, [], 0
        for i in range(args.start, args.start + args.count):
            r = fn(args.seed, i, progress)
            n += 1
            key = r.get("mutation", r.get("api", "operator"))
            counts[key] = counts.get(key, 0) + 1
            outcomes[r.get("outcome", "ran")] = outcomes.get(r.get("outcome", "ran"), 0) + 1
            if r["problems"]:
                failures.append(r)
            if args.budget is not None and time.perf_counter() - t0 > args.budget:
                break
    print(json.dumps(dict(kind=args.kind, seed=args.seed, cases=n, by_mutation=counts,
                          outcomes=outcomes, n_failures=len(failures), failures=failures[:args.keep],
                          seconds=round(time.perf_counter() - t0, 2))))


if __name__ == "__main__":
    main()
