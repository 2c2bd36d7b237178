"""Concurrency: 8 Python threads calling the operator at once give the serial results, bit
for bit -- on independent buffers (in-place caches included) and on a shared read-only past
cache -- and the GIL is released while the compute runs."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import gqa
import _newer_cases as nc
from _hard_cases import build, fresh_call, random_spec

THREADS = 8
ROUNDS = 10


def _specs(n, seed):
    out = []
    for i in range(n):
        s = random_spec(np.random.default_rng([seed, i]), big=i % 2 == 1)
        out.append(build(s))
    return out


def _same(x, y):
    return len(x) == len(y) and all(a.dtype == b.dtype and a.shape == b.shape and
                                    a.tobytes() == b.tobytes() for a, b in zip(x, y))


def test_independent_buffers_match_serial():
    cases = _specs(THREADS * 3, seed=31)

    def one(i):
        inp, a, call = cases[i]
        inp, call = fresh_call(inp, call)         # in-place calls write their own copy
        return gqa.group_query_attention(**inp, **a, **call, num_threads=1 + i % 2)

    serial = [one(i) for i in range(len(cases))]
    with ThreadPoolExecutor(THREADS) as ex:
        for _ in range(ROUNDS):
            order = list(range(len(cases)))[::-1]
            got = dict(zip(order, ex.map(one, order)))
            for i in range(len(cases)):
                assert _same(serial[i], got[i]), f"case {i} differs when run concurrently"


def test_level_4_calls_match_serial():
    """Accuracy level 4's kernels from 8 threads at once -- the integer dots of decode steps,
    the prompt kernels' packed blocks (a float cache's tiles coded per thread and kept), the
    per-group codes with windows and rotations -- give the serial results, bit for bit."""
    rng = np.random.default_rng(41)
    calls = []
    for i in range(THREADS * 3):
        kind = i % 3
        if kind == 0:           # the 1.31.1 surface, any phase
            inp, a, call = build(random_spec(np.random.default_rng([43, i]), big=True))
        elif kind == 1:         # a prompt long enough for the packed blocks and key tiles
            spec = random_spec(np.random.default_rng([47, i]), big=True)
            mode = ("NONE", "PER_TENSOR", "PER_CHANNEL")[i // 3 % 3]
            spec.update(phase="prompt", S=int(rng.integers(40, 200)), past=0, pasts=None,
                        prompt_lens=None, buf_extra=0, T_extra=0, shared_kv=False, inplace=False,
                        H=64, mode=mode, v_mode=mode, bits=0 if mode == "NONE" else 8)
            inp, a, call = build(spec)
        else:                   # the newer surface
            spec = dict(nc.random_spec(np.random.default_rng([53, i])), accuracy=4)
            calls.append(("newer", spec))
            continue
        calls.append(("ort", (inp, dict(a, accuracy_level=4), call)))

    def one(i):
        kind, c = calls[i]
        if kind == "newer":
            cls, attrs, inp, call, _ = nc.build(c)
            return nc.make_op(cls, attrs)(**inp, **call, num_threads=1 + i % 2)
        inp, a, call = c
        inp, call = fresh_call(inp, call)
        return gqa.group_query_attention(**inp, **a, **call, num_threads=1 + i % 2)

    with gqa.config(tiles=False):
        serial = [one(i) for i in range(len(calls))]
        with ThreadPoolExecutor(THREADS) as ex:
            for _ in range(ROUNDS // 2):
                order = list(range(len(calls)))[::-1]
                got = dict(zip(order, ex.map(one, order)))
                for i in range(len(calls)):
                    assert _same(serial[i], got[i]), f"call {i} ({calls[i][0]}) differs when run concurrently"


def test_shared_readonly_cache_matches_serial():
    """One past cache shared by every thread (read-only: no in-place writes; each call gets
    its own present), different queries per thread."""
    rng = np.random.default_rng(5)
    B, N, Nkv, H, P = 2, 8, 2, 64, 700
    pk = rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8)
    pv = rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8)
    pk.flags.writeable = pv.flags.writeable = False
    before = (pk.tobytes(), pv.tobytes())
    ks = rng.uniform(0.002, 0.006, Nkv * H).astype(np.float32)
    vs = np.array([0.004], np.float32)
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_CHANNEL",
                                 v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    qs = [rng.uniform(-1, 1, (B, 1, N * H)).astype(np.float32) for _ in range(THREADS)]
    kvs = [rng.uniform(-1, 1, (B, 1, Nkv * H)).astype(np.float32) for _ in range(THREADS)]
    seq = np.array([P, P - 300], np.int32)

    def one(i):
        return op(qs[i], kvs[i], kvs[i], pk, pv, seq, P + 1, k_scale=ks, v_scale=vs,
                  num_threads=1 + i % 2)

    serial = [one(i) for i in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as ex:
        for _ in range(ROUNDS):
            got = list(ex.map(one, range(THREADS)))
            for i in range(THREADS):
                assert _same(serial[i], got[i])
    assert (pk.tobytes(), pv.tobytes()) == before


def test_one_operator_shared_by_threads_with_different_signatures():
    """One operator, 8 threads, each with its own in-place cache and shapes (so each call
    replaces the operator's cached signature under the others' feet): every result equals
    the serial one.  The signature and its derived checks live in one attribute (a Step),
    never in two that a racing thread could pair wrongly."""
    rng = np.random.default_rng(8)
    N, Nkv, H = 4, 2, 32
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_TENSOR",
                                 v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    s = np.array([0.01], np.float32)
    cases = []
    for i in range(THREADS):
        B, P = 1 + i % 3, 40 + 8 * i
        cases.append((rng.uniform(-1, 1, (B, 1, N * H)).astype(np.float32),
                      rng.uniform(-1, 1, (B, 1, Nkv * H)).astype(np.float32),
                      rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8),
                      rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8),
                      np.full(B, P - 1 - i, np.int32), P - i))

    def one(i, rounds=1):
        q, kv, pk0, pv0, seq, T = cases[i]
        pk, pv = pk0.copy(), pv0.copy()       # this thread's cache, restored every round:
        for _ in range(rounds):               # repeats take the short path unless another
            pk[...], pv[...] = pk0, pv0       # thread's call replaced the signature
            r = op(q, kv, kv, pk, pv, seq, T, k_scale=s, v_scale=s, present_key=pk,
                   present_value=pv, num_threads=1)
        return r[0], pk, pv

    serial = [one(i) for i in range(THREADS)]
    with ThreadPoolExecutor(THREADS) as ex:
        for _ in range(ROUNDS):
            got = list(ex.map(lambda i: one(i, 20), range(THREADS)))
            for i in range(THREADS):
                assert _same(serial[i], got[i]), f"thread {i} differs"


def test_gil_is_released_during_compute():
    """Another Python thread keeps running while one long call computes."""
    rng = np.random.default_rng(0)
    S, N, Nkv, H = 512, 8, 2, 128
    q = rng.uniform(-1, 1, (1, S, N * H)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, S, Nkv * H)).astype(np.float32)
    empty = np.zeros((1, Nkv, 0, H), np.float32)
    seq = np.array([S - 1], np.int32)
    state = {"inside": False, "ticks": 0, "stop": False}

    def spinner():
        while not state["stop"]:
            if state["inside"]:
                state["ticks"] += 1

    t = threading.Thread(target=spinner)
    t.start()
    try:
        with gqa.config(flash=False):
            for _ in range(3):
                state["inside"] = True
                t0 = time.perf_counter()
                gqa.group_query_attention(q, k, k, empty, empty, seq, S, num_heads=N, kv_num_heads=Nkv,
                                          num_threads=1)
                state["inside"] = False
                took = time.perf_counter() - t0
                if state["ticks"] > 10_000:
                    break
    finally:
        state["stop"] = True
        t.join()
    assert state["ticks"] > 10_000, \
        f"only {state['ticks']} Python steps ran beside a {took * 1e3:.0f} ms call: the GIL was held"
