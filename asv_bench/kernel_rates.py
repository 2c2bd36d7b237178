"""Kernel throughput table (benchmark figures, not tests): 1 thread, this machine.

    python asv_bench/kernel_rates.py [--paths avx2,avx512] [--min-time 0.2] [--repeats 7]
                                     [--box-limits 13.8,10.9]

For each runnable path, times QK and SV GEMM on the decode shapes of issue 2 and prints
G elements/s = M * N * K / t (K-elements per second for QK with M = 1), the ratio of
M = 4 row-throughput to M = 1, and the ratio to the issue's targets and to the machine
limits of ../shared/bench/anchors.md (measured on a Zen 3 box, 1 thread).

  QK: A [M, 128] float32 x B [2048, 128] codes  (N = 2048 keys, K = 128 head size)
  SV: A [M, 2048] float32 x B [2048, 128] codes (K = 2048 keys, N = 128 head size)

Each figure is the best of --repeats timings of a loop that runs >= --min-time seconds
(median reported alongside), with out= preallocated so no allocation is timed.
Importing this module does nothing (asv imports every module of asv_bench/).
"""
import argparse
import os
import statistics
import sys
import timeit

TARGETS = {("qk", 8): 16.0, ("qk", 4): 11.0, ("sv", 8): 16.0, ("sv", 4): 11.0}  # G elem/s, M=1
LIMITS_ZEN3 = {8: 20.6, 4: 14.5}  # anchors.md: exact fused-dequant dot, 1 thread, Zen 3
M4_TARGET = 2.5


def _gqa():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from common import gqa  # installed gqa preferred, else the in-place build
    return gqa


def measure(fn, min_time, repeats):
    """Seconds per call: best and median of `repeats` loops of >= min_time seconds."""
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


def run(paths, min_time, repeats, modes):
    import numpy as np
    gqa = _gqa()
    rng = np.random.default_rng(20261129)
    rows = []
    for path in paths:
        if path not in gqa.available_kernels():
            print(f"# {path}: not runnable here (available: {', '.join(gqa.available_kernels())})")
            continue
        with gqa.config(kernel=path, approx_vnni=False):
            for mode in modes:
                bits = 8 if mode.startswith("s8") else 4
                pc = mode.endswith("pc")
                for op in ("qk", "sv"):
                    base = None
                    for m in (1, 4):
                        if op == "qk":
                            n, k = 2048, 128
                            a = rng.standard_normal((m, k)).astype(np.float32)
                            b = (rng.integers(-128, 128, (n, k)).astype(np.int8) if bits == 8 else
                                 rng.integers(0, 256, (n, k // 2)).astype(np.uint8))
                            s = rng.uniform(0.005, 0.05, k if pc else 1).astype(np.float32)
                            out = np.empty((m, n), np.float32)

                            def fn(a=a, b=b, s=s, out=out):
                                gqa.qk_gemm(a, b, s, bits=bits, alpha=0.0883883, out=out)
                        else:
                            k, n = 2048, 128
                            p = rng.random((m, k)).astype(np.float32)
                            a = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
                            b = (rng.integers(-128, 128, (k, n)).astype(np.int8) if bits == 8 else
                                 rng.integers(0, 256, (k, n // 2)).astype(np.uint8))
                            s = rng.uniform(0.005, 0.05, n if pc else 1).astype(np.float32)
                            out = np.empty((m, n), np.float32)

                            def fn(a=a, b=b, s=s, out=out):
                                gqa.sv_gemm(a, b, s, bits=bits, out=out)
                        best, med = measure(fn, min_time, repeats)
                        rate = m * n * k / best / 1e9
                        if m == 1:
                            base = rate
                        rows.append(dict(path=path, op=op, mode=mode, M=m, N=n, K=k, us=best * 1e6,
                                         us_med=med * 1e6, rate=rate,
                                         m4=(rate / base) if m == 4 else None, bits=bits, pc=pc))
    return rows


def print_table(rows, box_limits=None):
    box = f"{'vs box lim':>10}" if box_limits else ""
    hdr = (f"{'path':7} {'op':3} {'mode':6} {'M':>2} {'N':>5} {'K':>5} {'best us':>9} "
           f"{'median':>9} {'G elem/s':>9} {'target':>7} {'vs tgt':>7} {'vs Zen3 lim':>11} {box}{'M4/M1':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        tgt_s = vs_t = "-"
        if not r["pc"] and r["M"] == 1:
            tgt = TARGETS[(r["op"], r["bits"])]
            tgt_s, vs_t = f"{tgt:.1f}", f"{r['rate'] / tgt:.2f}"
        elif not r["pc"]:
            tgt_s, vs_t = f"{M4_TARGET:.1f}x", f"{r['m4'] / M4_TARGET:.2f}"
        ratio = f"{r['m4']:.2f}" if r["m4"] is not None else ""
        lim = LIMITS_ZEN3[r["bits"]]
        bl = f"{r['rate'] / box_limits[r['bits']]:>10.2f}" if box_limits else ""
        print(f"{r['path']:7} {r['op']:3} {r['mode']:6} {r['M']:>2} {r['N']:>5} {r['K']:>5} "
              f"{r['us']:>9.2f} {r['us_med']:>9.2f} {r['rate']:>9.2f} {tgt_s:>7} {vs_t:>7} "
              f"{r['rate'] / lim:>11.2f} {bl}{ratio:>6}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="scalar,avx2,avx512,neon")
    ap.add_argument("--modes", default="s8_pt,s4_pt,s8_pc,s4_pc")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--box-limits", default=None, metavar="I8,I4",
                    help="this machine's 1-thread fused-dequant dot limits in G elem/s "
                         "(from ../shared/tools/roofline.c, L2 column), adds a 'vs box lim' column")
    args = ap.parse_args(argv)
    box = None
    if args.box_limits:
        i8, i4 = (float(v) for v in args.box_limits.split(","))
        box = {8: i8, 4: i4}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    gqa = _gqa()
    from gqa import _dispatch
    print(f"# gqa {gqa.__version__} from {os.path.dirname(gqa.__file__)}; 1 thread")
    print(f"# CPU features: {', '.join(_dispatch.cpu_features())}; available: "
          f"{', '.join(gqa.available_kernels())}")
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
        print(f"# CPU: {model}")
    except OSError:
        pass
    print("# rate = M*N*K/t (QK M=1: K-elements/s); targets apply to per-tensor modes; "
          "'vs Zen3 lim' = rate / anchors.md 1-thread limit (20.6 INT8, 14.5 INT4)")
    rows = run(args.paths.split(","), args.min_time, args.repeats, args.modes.split(","))
    if box:
        print(f"# 'vs box lim' = rate / this machine's limits: INT8 {box[8]}, INT4 {box[4]} G elem/s")
    print_table(rows, box)
    return 0


if __name__ == "__main__":
    sys.exit(main())
