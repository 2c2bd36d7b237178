"""Leak worker, run in a subprocess by test_hard_resources.py:

  python tests/hardening/_leak_worker.py --calls 100000 [--warmup 5000]

Runs `calls` tiny GroupQueryAttention calls, cycling through the code paths that allocate:
in-place decode (the decoding loop), decode with fresh present buffers, flash decoding (split
partials), a flash prefill (tile scratch), a naive call, and a rejected call (the error path),
on 1 and 2 threads.  Prints one JSON object: resident memory (VmRSS), open file descriptors,
OS threads and Python threads after the warm-up and at the end.
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np

import gqa


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def os_threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def snapshot():
    return dict(rss_kib=rss_kib(), fds=len(os.listdir("/proc/self/fd")), os_threads=os_threads(),
                py_threads=threading.active_count())


def make_calls():
    rng = np.random.default_rng(0)
    B, N, Nkv, H, L = 1, 2, 1, 8, 64
    s8 = np.array([0.02], np.float32)
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_TENSOR",
                                 v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    opf = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=Nkv, local_window_size=16)
    kc = rng.integers(-128, 128, (B, Nkv, L, H)).astype(np.int8)
    vc = rng.integers(-128, 128, (B, Nkv, L, H)).astype(np.int8)
    q = rng.uniform(-1, 1, (B, 1, N * H)).astype(np.float32)
    k = rng.uniform(-1, 1, (B, 1, Nkv * H)).astype(np.float32)
    qp = rng.uniform(-1, 1, (B, 6, N * H)).astype(np.float32)
    kp = rng.uniform(-1, 1, (B, 6, Nkv * H)).astype(np.float32)
    fk = np.zeros((B, Nkv, 0, H), np.float32)
    pk_out, pv_out = np.empty((B, Nkv, L, H), np.int8), np.empty((B, Nkv, L, H), np.int8)
    seq = [np.array([t], np.int32) for t in range(L)]
    bad_seq = np.array([L + 5], np.int32)

    def inplace(i):
        t = i % L
        op(q, k, k, kc, vc, seq[t], t + 1, k_scale=s8, v_scale=s8, present_key=kc, present_value=vc,
           num_threads=1 + i % 2)

    def fresh_present(i):
        t = 1 + i % (L - 1)
        op(q, k, k, kc, vc, seq[t], L, k_scale=s8, v_scale=s8, present_key=pk_out, present_value=pv_out)

    def allocating(i):
        t = 1 + i % (L - 1)
        op(q, k, k, kc[:, :, :t], vc[:, :, :t], seq[t], t + 1, k_scale=s8, v_scale=s8)

    def flash_decoding(i):
        with gqa.config(decode_splits=3):
            op(q, k, k, kc, vc, seq[L - 1], L, k_scale=s8, v_scale=s8, present_key=kc, present_value=vc,
               num_threads=2)

    def prefill(i):
        with gqa.config(flash_blocks=(2, 4)):
            opf(qp, kp, kp, fk, fk, seq[5], 6)

    def naive(i):
        with gqa.config(flash=False):
            opf(qp, kp, kp, fk, fk, seq[5], 6, num_threads=2)

    def rejected(i):
        try:
            op(q, k, k, kc, vc, bad_seq, L, k_scale=s8, v_scale=s8, present_key=kc, present_value=vc)
        except ValueError:
            return
        raise AssertionError("invalid call accepted")

    return [inplace, inplace, inplace, fresh_present, allocating, flash_decoding, prefill, naive, rejected]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--warmup", type=int, default=5000)
    ap.add_argument("--progress", default=os.devnull)   # accepted for the shared runner
    args = ap.parse_args()
    calls = make_calls()
    t0 = time.perf_counter()
    for i in range(args.warmup):
        calls[i % len(calls)](i)
    before = snapshot()
    samples = []
    for i in range(args.calls):
        calls[i % len(calls)](i)
        if i % 10000 == 0:
            samples.append(rss_kib())
    after = snapshot()
    print(json.dumps(dict(calls=args.calls, warmup=args.warmup, before=before, after=after,
                          rss_samples_kib=samples, seconds=round(time.perf_counter() - t0, 2))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
