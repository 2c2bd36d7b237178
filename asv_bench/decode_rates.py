"""Decode-kernel rates, 1 thread, straight through gqa._kernels (no validation layer).

    PYTHONPATH=. python asv_bench/decode_rates.py [--path avx2] [--reps 7] [--what qk,sv,deqt]

qk : qk_gemm  M x N=2048 x K=128   (one decode step's scores over 2048 keys, head 128)
sv : sv_gemm  M x N=128  x K=2048  (the value pass over the same keys)
     rate = M*N*K / t  in G multiply-adds/s ("G/s"); row rate = rate / M
deqt: dequantize_t of a 256 x 128 tile (flash K tile), us per call
Each figure is the best of --reps repeats of a timed loop of ~20 ms (the machine is shared).
--cold: B streams from memory like a real decode step: each call reads the next slice of
a --cold-mib ring (default 1024 MiB, past the last-level cache); one sweep per repeat.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gqa  # noqa: E402
from gqa import _kernels  # noqa: E402  (raw kernel entry points, documented for benchmarks)

# the C type codes of the static formats and the float rows (gqa.CacheFormat.ctype)
TYPES = {"S8_PT": gqa.CacheFormat.parse("int8-pt").ctype(1), "S8_PC": gqa.CacheFormat.parse("int8-pc").ctype(1),
         "S4_PT": gqa.CacheFormat.parse("int4-pt").ctype(1), "S4_PC": gqa.CacheFormat.parse("int4-pc").ctype(1),
         "F32": gqa.CacheFormat.parse("float").ctype(1),
         "F16": gqa.CacheFormat.parse("float").ctype(1, np.float16)}


def codes(rng, rows, cols, t):
    if t in (0, 1):
        return rng.integers(-128, 128, size=(rows, cols), dtype=np.int8)
    if t in (2, 3):
        return rng.integers(0, 256, size=(rows, (cols + 1) // 2), dtype=np.uint8)
    if t == 4:
        return rng.standard_normal((rows, cols)).astype(np.float32)
    return rng.standard_normal((rows, cols)).astype(np.float16)


def best_time(fn, reps, target=0.02):
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= target / 4:
            break
        n *= 4
    n = max(1, int(n * target / max(dt, 1e-9)))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="avx2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--what", default="qk,sv")
    ap.add_argument("--types", default="S8_PT,S8_PC,S4_PT,S4_PC")
    ap.add_argument("--ms", default="1,2,4,8")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--cold-mib", type=int, default=1024)
    args = ap.parse_args()
    gqa.config(path=args.path)
    rng = np.random.default_rng(0)
    what = args.what.split(",")
    ms = [int(m) for m in args.ms.split(",")]
    print(f"path {gqa.active_path()}, best of {args.reps}")
    if args.cold:
        return cold(args, rng, what, ms)
    for name in args.types.split(","):
        t = TYPES[name]
        if "qk" in what:
            N, K = 2048, 128
            b = codes(rng, N, K, t)
            s = (rng.random(K if t in (1, 3) else 1) * 0.1 + 0.01).astype(np.float32)
            for M in ms:
                a = rng.standard_normal((M, K)).astype(np.float32)
                out = np.empty((M, N), np.float32)
                dt = best_time(lambda: _kernels.qk_gemm(a, b, s, out, M, N, K, 0.125, t), args.reps)
                g = M * N * K / dt / 1e9
                print(f"qk {name:6s} M={M}  {dt * 1e6:8.2f} us  {g:6.2f} G/s  row {g / M:6.2f} G/s")
        if "sv" in what:
            N, K = 128, 2048
            b = codes(rng, K, N, t)
            s = (rng.random(N if t in (1, 3) else 1) * 0.1 + 0.01).astype(np.float32)
            for M in ms:
                a = rng.random((M, K)).astype(np.float32)
                out = np.zeros((M, N), np.float32)
                dt = best_time(lambda: _kernels.sv_gemm(a, b, s, out, M, N, K, 0.0, t), args.reps)
                g = M * N * K / dt / 1e9
                print(f"sv {name:6s} M={M}  {dt * 1e6:8.2f} us  {g:6.2f} G/s  row {g / M:6.2f} G/s")
        if "deqt" in what:
            rows, cols = 256, 128
            b = codes(rng, rows, cols, t)
            s = (rng.random(cols if t in (1, 3) else 1) * 0.1 + 0.01).astype(np.float32)
            out = np.empty((cols, rows), np.float32)
            dt = best_time(lambda: _kernels.dequantize_t(b, out, s, rows, cols, t), args.reps)
            print(f"dequantize_t {name:6s} {rows}x{cols}  {dt * 1e6:8.2f} us")


def cold(args, rng, what, ms):
    ring = rng.integers(0, 256, size=args.cold_mib << 20, dtype=np.uint8)
    print(f"cold: B from a {args.cold_mib} MiB ring, one slice per call")
    for name in args.types.split(","):
        t = TYPES[name]
        if t > 3:
            continue
        dt8 = np.int8 if t in (0, 1) else np.uint8
        for op in ("qk", "sv"):
            if op not in what:
                continue
            N, K = (2048, 128) if op == "qk" else (128, 2048)
            rows, cols = (N, K) if op == "qk" else (K, N)
            width = cols if t in (0, 1) else (cols + 1) // 2
            nsl = ring.size // (rows * width)
            slices = ring[: nsl * rows * width].view(dt8).reshape(nsl, rows, width)
            s = (rng.random(cols if t in (1, 3) else 1) * 0.1 + 0.01).astype(np.float32)
            for M in ms:
                a = rng.standard_normal((M, K)).astype(np.float32)
                out = np.zeros((M, N), np.float32)
                fn = _kernels.qk_gemm if op == "qk" else _kernels.sv_gemm
                arg = 0.125 if op == "qk" else 0.0
                best = float("inf")
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    for i in range(nsl):
                        fn(a, slices[i], s, out, M, N, K, arg, t)
                    best = min(best, (time.perf_counter() - t0) / nsl)
                g = M * N * K / best / 1e9
                print(f"{op} {name:6s} M={M}  {best * 1e6:8.2f} us  {g:6.2f} G/s  "
                      f"({rows * width / best / 1e9:5.1f} GB/s of B)")


if __name__ == "__main__":
    main()
