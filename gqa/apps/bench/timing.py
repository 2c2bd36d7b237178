"""The timing of ``python -m gqa bench``: batches of calls, and the alternation of every side
of one row (gqa, peer 1, peer 2, ..., gqa, ...) so that drift of a shared machine hits all alike."""
import math
import statistics
import time


BATCH_S = 0.010        # a timed batch of short calls lasts about this long


WARM_BELOW_S = 0.020   # calls shorter than this get untimed calls before each batch ...


WARM_S = 0.003         # ... for this long


NOISY_SPREAD = 1.25    # a side whose samples' upper quartile exceeds its lower one by more is noisy


def spread(samples):
    """The upper quartile of the samples over the lower one (1.0: fewer than 4 samples)."""
    if len(samples) < 4:
        return 1.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return q3 / q1 if q1 > 0 else 1.0


def time_batch(fn, inner, warm):
    """Seconds per call over `inner` back-to-back calls.  With `warm`, untimed calls first
    for WARM_S (at least one): after the idle gap the core needs a few milliseconds to
    return to its running clock, which a decoding loop never leaves."""
    if warm:
        t0 = time.perf_counter()
        fn()
        while time.perf_counter() - t0 < WARM_S:
            fn()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def measure_row(spec, sides, rounds, progress, label, gap=0.0):
    """Alternate all sides `rounds` times; -> {name: {"median_us", "min_us", "samples"} or {"error"}}."""
    res, live = {}, []
    for side in sides:
        try:
            ok = side.setup(spec)
        except Exception as e:  # noqa: BLE001
            res[side.name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        if not ok:
            res[side.name] = {"na": True}
            continue
        try:
            t1 = side.time(1, False)  # first call: warms caches and lazy set-up
            t1 = min(t1, side.time(1, False))
        except Exception as e:  # noqa: BLE001
            res[side.name] = {"error": f"{type(e).__name__}: {e}"}
            _safe_teardown(side)
            continue
        t1 = t1 * getattr(side, "per_call", 1)    # a layer side's time is per layer of a token
        inner = max(1, min(2000, int(math.ceil(BATCH_S / max(t1, 1e-7))))) if t1 < BATCH_S else 1
        live.append((side, inner, t1 < WARM_BELOW_S, []))
    progress.update(1, label)
    for _ in range(rounds):
        for side, inner, warm, samples in live:
            if side.name in res:
                continue
            if gap:  # let the previous side's spinning worker threads go to sleep
                time.sleep(gap)
            try:
                samples.append(side.time(inner, warm))
            except Exception as e:  # noqa: BLE001
                res[side.name] = {"error": f"{type(e).__name__}: {e}"}
        progress.update(1, label)
    for side, inner, warm, samples in live:
        if side.name not in res:
            res[side.name] = {"median_us": 1e6 * statistics.median(samples), "min_us": 1e6 * min(samples),
                              "spread": spread(samples), "samples": len(samples),
                              "calls_per_sample": inner}
        _safe_teardown(side)
    return res


def _safe_teardown(side):
    try:
        side.teardown()
    except Exception:  # noqa: BLE001
        pass
