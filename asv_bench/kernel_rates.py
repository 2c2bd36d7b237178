"""Kernel throughput table (benchmark figures, not tests): 1 thread, this machine.

    python asv_bench/kernel_rates.py [--paths avx2,avx512] [--modes s8_pt,s4_pt]
                                     [--min-time 0.2] [--repeats 7] [--box-limits 13.8,10.9]

For each runnable path, times QK and SV GEMM on the decode shapes of issue 2:

  QK: A [M, 128] float32 x B [2048, 128] codes  (N = 2048 keys, K = 128 head size)
  SV: A [M, 2048] float32 x B [2048, 128] codes (K = 2048 keys, N = 128 head size)

and prints G elements/s = M * N * K / t (for QK with M = 1: K-elements per second), the
M = 4 row-throughput relative to M = 1, and ratios to the issue's targets (per-tensor:
QK/SV INT8 >= 16, INT4 >= 11 G/s; M=4 >= 2.5x M=1) and to the 1-thread limits of
the project's measured anchors (Zen 3: 20.6 INT8, 14.5 INT4) or, with --box-limits, to this
machine's limits measured with a roofline probe.

Two timings per case:
  kernel  the compiled entry point gqa._kernels.<op> (no argument validation): the kernel's
          own throughput, what the targets are about; ratios use this one;
  api     the public gqa.qk_gemm / gqa.sv_gemm with out= (validation included).
Each is the best of --repeats loops of >= --min-time seconds (the median is printed too;
on a shared machine trust the best).  Importing this module does nothing (asv imports
every module of asv_bench/).
"""
import argparse
import os
import statistics
import sys
import timeit

TARGETS = {8: 16.0, 4: 11.0}       # G elem/s, per-tensor, M = 1 (QK; "SV in the same range")
M4_TARGET = 2.5                    # M=4 row-throughput / M=1
LIMITS_ZEN3 = {8: 20.6, 4: 14.5}   # anchors.md, 1 thread


def _gqa():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from common import gqa  # this checkout's in-place build, else the installed gqa
    return gqa


def measure(fn, min_time, repeats):
    """Seconds per call: (best, median) of `repeats` loops of >= min_time seconds."""
    fn()
    n = 1
    while True:
        t = timeit.timeit(fn, number=n)
        if t >= min_time / 4:
            break
        n *= 4
    n = max(1, int(n * min_time / max(t, 1e-9)))
    times = [timeit.timeit(fn, number=n) / n for _ in range(repeats)]
    return min(times), statistics.median(times)


def _case(np, rng, op, bits, pc, m):
    if op == "qk":
        n, k = 2048, 128
        a = rng.standard_normal((m, k)).astype(np.float32)
        rows, cols = n, k
    else:
        k, n = 2048, 128
        p = rng.random((m, k)).astype(np.float32)
        a = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
        rows, cols = k, n
    b = (rng.integers(-128, 128, (rows, cols)).astype(np.int8) if bits == 8 else
         rng.integers(0, 256, (rows, cols // 2)).astype(np.uint8))
    s = rng.uniform(0.005, 0.05, cols if pc else 1).astype(np.float32)
    return a, b, s, np.empty((m, n), np.float32), n, k


def run(paths, modes, min_time, repeats):
    import numpy as np
    gqa = _gqa()
    try:
        from gqa import _kernels
    except ImportError:
        _kernels = None
    rng = np.random.default_rng(20261129)
    rows = []
    for path in paths:
        if path not in gqa.available_paths():
            print(f"# {path}: not runnable here (available: {', '.join(gqa.available_paths())})")
            continue
        with gqa.config(path=path, approx_vnni=False):
            for mode in modes:
                bits, pc = (8 if mode.startswith("s8") else 4), mode.endswith("pc")
                qtype = gqa.CacheFormat("PER_CHANNEL" if pc else "PER_TENSOR", bits).ctype(k)
                for op in ("qk", "sv"):
                    base = None
                    for m in (1, 4):
                        a, b, s, out, n, k = _case(np, rng, op, bits, pc, m)
                        if op == "qk":
                            api = lambda: gqa.qk_gemm(a, b, s, bits=bits, alpha=0.0883883, out=out)  # noqa: E731
                            raw = (lambda: _kernels.qk_gemm(a, b, s, out, m, n, k, 0.0883883, qtype))  # noqa: E731
                        else:
                            api = lambda: gqa.sv_gemm(a, b, s, bits=bits, out=out)  # noqa: E731
                            raw = (lambda: _kernels.sv_gemm(a, b, s, out, m, n, k, 0.0, qtype))  # noqa: E731
                        t_api, med_api = measure(api, min_time, repeats)
                        t_raw, med_raw = measure(raw, min_time, repeats) if _kernels else (t_api, med_api)
                        rate = m * n * k / t_raw / 1e9
                        base = rate if m == 1 else base
                        rows.append(dict(path=path, op=op, mode=mode, bits=bits, pc=pc, M=m, N=n, K=k,
                                         raw=t_raw * 1e6, raw_med=med_raw * 1e6, api=t_api * 1e6,
                                         api_med=med_api * 1e6, rate=rate,
                                         rate_api=m * n * k / t_api / 1e9,
                                         m4=rate / base if m == 4 else None))
    return rows


def print_table(rows, box_limits=None):
    cols = (f"{'path':7}{'op':3}{'mode':>6}{'M':>3}{'N':>6}{'K':>6}{'kernel us':>10}{'(median)':>9}"
            f"{'api us':>8}{'G/s kern':>9}{'G/s api':>8}{'target':>7}{'vs tgt':>7}{'vs Zen3':>8}"
            + (f"{'vs box':>7}" if box_limits else "") + f"{'M4/M1':>6}")
    print(cols)
    print("-" * len(cols))
    for r in rows:
        tgt = vs = "-"
        if not r["pc"]:
            if r["M"] == 1:
                tgt, vs = f"{TARGETS[r['bits']]:.1f}", f"{r['rate'] / TARGETS[r['bits']]:.2f}"
            else:
                tgt, vs = f"{M4_TARGET:.1f}x", f"{r['m4'] / M4_TARGET:.2f}"
        line = (f"{r['path']:7}{r['op']:3}{r['mode']:>6}{r['M']:>3}{r['N']:>6}{r['K']:>6}"
                f"{r['raw']:>10.2f}{r['raw_med']:>9.2f}{r['api']:>8.2f}{r['rate']:>9.2f}"
                f"{r['rate_api']:>8.2f}{tgt:>7}{vs:>7}{r['rate'] / LIMITS_ZEN3[r['bits']]:>8.2f}")
        if box_limits:
            line += f"{r['rate'] / box_limits[r['bits']]:>7.2f}"
        line += f"{r['m4']:>6.2f}" if r["m4"] is not None else ""
        print(line)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="scalar,avx2,avx512,neon")
    ap.add_argument("--modes", default="s8_pt,s4_pt,s8_pc,s4_pc")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--box-limits", default=None, metavar="I8,I4",
                    help="this machine's 1-thread fused-dequant dot limits in G elem/s "
                         "(roofline.c, L2 column); adds a 'vs box' column")
    args = ap.parse_args(argv)
    box = None
    if args.box_limits:
        i8, i4 = (float(v) for v in args.box_limits.split(","))
        box = {8: i8, 4: i4}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    gqa = _gqa()
    print(f"# gqa {gqa.__version__} from {os.path.dirname(gqa.__file__)}; 1 thread")
    print(f"# CPU features: {', '.join(gqa.cpu_features())}; available: "
          f"{', '.join(gqa.available_paths())}")
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
        print(f"# CPU: {model}")
    except OSError:
        pass
    print("# G/s = M*N*K/t; ratios use the kernel time; targets for per-tensor modes; "
          "'vs Zen3' = / anchors.md limits (20.6 INT8, 14.5 INT4)"
          + (f"; 'vs box' = / {box[8]} INT8, {box[4]} INT4" if box else ""))
    print_table(run(args.paths.split(","), args.modes.split(","), args.min_time, args.repeats), box)
    return 0


if __name__ == "__main__":
    sys.exit(main())
