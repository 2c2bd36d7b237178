"""Property test: random valid programs of gqa.KVCache -- prompts (ragged or not), decode and
multi-token steps with the layers in any order, truncate (one length or one per sequence),
steps abandoned part way (some layers had them) and truncated, copy_from a float cache, take
(reorder, drop, repeat sequences), reset -- over its cache formats (float, static INT8 /
INT4, per-group INT8 / INT4 / INT2, K / V pairs), float windows with and without rollback
rows and rotations, float32 and float16, accuracy levels 0 and 4, and the model's local
windows (per layer) and softcap.

The cache's state is a function of each sequence's history alone: its codes and float windows
after any program must be, bit for bit, those of a fresh cache given each sequence's kept
positions as one (ragged) prompt, its lengths the histories' lengths, and a step's output that
fresh cache's output of the same step.  So a truncation that rearranges the windows wrongly,
a take that mixes sequences, or a ragged step at a wrong position is seen at once.  A
truncation the float rows cannot follow must raise ValueError and change nothing; every other
must succeed.  Which float rows a sequence keeps is tracked here as sets (README "Float
windows", "Rollback"): its windows' positions, and `rollback_size` rows: the positions that
left the recent window or went straight into the codes, while within rollback_size of its
start (copy_from fills them from the float source).
"""
import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import gqa

L, N, NKV, H, M = 2, 4, 2, 32, 40
CONFIGS = ["float", "int8-pt", "int4-pc", "int8-pc/pt", "int4-g16", "int2-g16", "int8-g32",
           "int4-pc/int2-g16", "int8-g32+s2r3", "int4-g16+s1r4+had", "int2-g16+s0r3",
           "int4-pt+s2r2", "int4-g32+had", "int8-pc/int4-g16+s3r2+had"]


def _scales(mode, rng):
    """Per-layer static scales of each side (None for float and per-group sides)."""
    out = []
    for f in gqa.parse_mode(mode):
        if f.name.endswith(("-pt", "-pc")):
            n = NKV * H if f.name.endswith("-pc") else 1
            wide = 8 if f.name.startswith("int4") else 1
            out.append([rng.uniform(0.02, 0.04, n).astype(np.float32) * wide for _ in range(L)])
        else:
            out.append(None)
    return out


def make(config, B, seed, dtype, level, scores=None, rollback=0):
    opts = dict(gqa.cache_options(config), **(scores or {}))
    ks, vs = _scales(opts["mode"], np.random.default_rng(seed))
    cos, sin = gqa.rotary_caches(M, H)
    return gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=M,
                       batch_size=B, rotary=(cos.astype(dtype), sin.astype(dtype)), k_scales=ks,
                       v_scales=vs, dtype=dtype, accuracy_level=level, rollback_size=rollback, **opts)


def windows(n, s, r):
    """The positions the float windows of n positions hold: the first s and the last r."""
    ns = min(s, n)
    return set(range(ns)) | set(range(n - min(r, n - ns), n))


def state(c):
    """Per layer: (codes K, codes V, windows K, windows V) of each sequence's held rows."""
    out = []
    lens = c.lengths
    for li in range(L):
        per = []
        for b, n in enumerate(lens):
            n = int(n)
            rows = [c.key[li][b, :, :n].copy(), c.value[li][b, :, :n].copy()]
            if c.hp_key[li] is not None:
                ns = min(c.sink_size, n)
                w = ns + min(c.recent_size, n - ns)
                rows += [c.hp_key[li][b, :, :w].copy(), c.hp_value[li][b, :, :w].copy()]
            per.append(rows)
        out.append(per)
    return out


def same_state(a, b, what):
    for li, (x, y) in enumerate(zip(a, b)):
        for s, (xs, ys) in enumerate(zip(x, y)):
            for i, (u, v) in enumerate(zip(xs, ys)):
                assert u.shape == v.shape and np.array_equal(u.view(np.uint8), v.view(np.uint8)), \
                    f"{what}: layer {li}, sequence {s}, {['K codes', 'V codes', 'K window', 'V window'][i]} differ"


class Program:
    """A cache driven by a program, and each sequence's history: per position and layer its
    (k, v) rows, so a fresh cache can be given it again; and the positions of each sequence's
    rollback rows (`ring`)."""

    def __init__(self, config, B, seed, dtype=np.float32, level=0, scores=None, rollback=0):
        self.make = lambda B, config=config: make(config, B, seed, dtype, level, scores, rollback)  # noqa: E731
        self.dtype = dtype
        self.cache = self.make(B)
        self.hist = [[] for _ in range(B)]     # per sequence: [(k [L, Nkv*H], v [L, Nkv*H])]
        self.ring = [set() for _ in range(B)]
        self.s, self.r = self.cache.sink_size, self.cache.recent_size
        self.m = rollback if self.cache.hp_key[0] is not None and self.r else 0
        self.rng = np.random.default_rng(seed + 1)

    def replay(self, config=None):
        """A fresh cache given each sequence's history as one ragged prompt."""
        B = len(self.hist)
        c = self.make(B) if config is None else self.make(B, config)
        n = [len(h) for h in self.hist]
        if max(n) == 0:
            return c
        assert min(n) > 0
        S = max(n)
        k = np.zeros((L, B, S, NKV * H), self.dtype)
        v = np.zeros_like(k)
        for b, h in enumerate(self.hist):
            for p, (kr, vr) in enumerate(h):
                k[:, b, p], v[:, b, p] = kr, vr
        q = self.rng.uniform(-1, 1, (B, S, N * H)).astype(self.dtype)
        for li in range(L):
            c.attend(li, q, k[li], v[li], lengths=n if len(set(n)) > 1 else None)
        return c

    def check(self, what):
        assert self.cache.lengths.tolist() == [len(h) for h in self.hist], what
        same_state(state(self.cache), state(self.replay()), what)

    def _inputs(self, S):
        u = lambda *shape: self.rng.uniform(-1, 1, shape).astype(self.dtype)  # noqa: E731
        B = len(self.hist)
        return u(L, B, S, N * H), u(L, B, S, NKV * H), u(L, B, S, NKV * H)

    def _ring_after_step(self, b, n0, n1):
        """Sequence b's rollback rows after a step from n0 to n1 positions."""
        if self.m == 0:
            return set()
        kept = windows(n1, self.s, self.r)
        start = n1 - min(self.r, n1 - min(self.s, n1))
        # the positions that left the recent window, or went straight into the codes
        out = (self.ring[b] | windows(n0, self.s, self.r) | set(range(n0, n1))) - kept
        return {p for p in out if p >= start - self.m}

    def _attend(self, layers, ref, q, k, v, ragged, S):
        for li in layers:
            got = self.cache.attend(li, q[li], k[li], v[li], lengths=ragged)
            want = ref.attend(li, q[li], k[li], v[li], lengths=ragged)
            for b in range(len(self.hist)):
                rows = ragged[b] if ragged else S
                assert np.array_equal(got[b, :rows].view(np.uint8), want[b, :rows].view(np.uint8)), \
                    f"step of {S}: layer {li}, sequence {b}'s output differs from the fresh cache's"

    def _add(self, k, v, ragged, S):
        for b in range(len(self.hist)):
            for p in range(ragged[b] if ragged else S):
                self.hist[b].append((k[:, b, p].copy(), v[:, b, p].copy()))

    def step(self, S, order, ragged=None):
        ref = self.replay()
        q, k, v = self._inputs(S)
        n0 = [len(h) for h in self.hist]
        self._attend(order, ref, q, k, v, ragged, S)
        self._add(k, v, ragged, S)
        self.ring = [self._ring_after_step(b, n0[b], len(h)) for b, h in enumerate(self.hist)]

    def held(self, b, n):
        """The positions sequence b of n positions holds in floats."""
        return windows(n, self.s, self.r) | self.ring[b]

    def truncate(self, target, ahead=None):
        """truncate(target): refused (ValueError, nothing changed) exactly where a sequence
        would need the float row of a position it no longer holds; `ahead`: the positions each
        sequence holds in the layers that had an abandoned step."""
        c = self.cache
        new = [min(len(h), target) for h in self.hist] if np.isscalar(target) else list(target)
        ok = all(windows(n, self.s, self.r) <= self.held(b, len(h))
                 and (ahead is None or windows(n, self.s, self.r) <= self.held(b, ahead[b]))
                 for b, (h, n) in enumerate(zip(self.hist, new))) or c.hp_key[0] is None
        before = [x.copy() for x in c.hp_key + c.hp_value + (c.undo_key or []) + (c.undo_value or [])
                  if x is not None]
        try:
            c.truncate(target)
        except ValueError as e:
            assert not ok, f"truncate({target}) refused: {e}"
            assert "truncate" in str(e) and "rollback_size" in str(e)
            after = [x for x in c.hp_key + c.hp_value + (c.undo_key or []) + (c.undo_value or [])
                     if x is not None]
            assert all(np.array_equal(x, y) for x, y in zip(before, after)), "a refused truncate wrote"
            assert c.lengths.tolist() == [len(h) for h in self.hist]
            return False
        assert ok, f"truncate({target}) accepted though a position's float rows were gone"
        if any(windows(n, self.s, self.r) & self.ring[b] for b, n in enumerate(new)):
            event("truncate took float rows back from the rollback rows")
        self.hist = [h[:n] for h, n in zip(self.hist, new)]
        for b, n in enumerate(new):
            start = n - min(self.r, n - min(self.s, n))
            self.ring[b] = {p for p in self.ring[b] if p < start}
        if c.hp_key[0] is not None:
            floor = c.rollback_floor.tolist()
            for b, h in enumerate(self.hist):
                reach = [n for n in range(self.s + 1, len(h) + 1)
                         if windows(n, self.s, self.r) <= self.held(b, len(h))]
                assert floor[b] == (0 if reach == list(range(self.s + 1, len(h) + 1)) else min(reach)), \
                    f"rollback_floor {floor} against the held rows"
        return True

    def abandon(self, S, layers, target):
        """A step of S tokens given to `layers` only (not all), then truncate(target): the
        layers that had it are taken back as well; refused, the step is finished instead."""
        ref = self.replay()
        q, k, v = self._inputs(S)
        n0 = [len(h) for h in self.hist]
        self._attend(layers, ref, q, k, v, None, S)
        self.ring = [self._ring_after_step(b, n, n + S) for b, n in enumerate(n0)]
        if self.truncate(target, ahead=[n + S for n in n0]):
            event("abandoned step taken back")
            return
        event("abandoned step's truncate refused")
        self._attend([li for li in range(L) if li not in layers], ref, q, k, v, None, S)
        self._add(k, v, None, S)

    def copy_from(self, n):
        """copy_from a float cache of the histories (first n positions): this mode's codes and
        windows as the operator writes them, its rollback rows filled."""
        src = self.replay("float")
        self.cache.copy_from(src, n)
        self.hist = [h[:n] for h in self.hist]
        if self.m:
            start = n - min(self.r, n - min(self.s, n))
            self.ring = [set(range(max(min(self.s, n), start - self.m), start)) for _ in self.hist]
        else:
            self.ring = [set() for _ in self.hist]

    def take(self, idx):
        self.cache = self.cache.take(idx)
        self.hist = [list(self.hist[i]) for i in idx]
        self.ring = [set(self.ring[i]) for i in idx]


WINDOWED = [c for c in CONFIGS if "+s" in c]
# the model's score options: none, a local window in one layer (Gemma's alternating layers),
# in both, softcap, both together
SCORES = [None, None, dict(local_window_size=[-1, 3]), dict(local_window_size=2),
          dict(softcap=5.0), dict(local_window_size=[4, -1], softcap=2.0)]


@settings(max_examples=max(10, settings.default.max_examples * 3 // 5))
@given(config=st.sampled_from(CONFIGS) | st.sampled_from(WINDOWED), B=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16), dtype=st.sampled_from([np.float32, np.float32, np.float16]),
       level=st.sampled_from([0, 0, 4]), scores=st.sampled_from(SCORES),
       rollback=st.sampled_from([0, 0, 1, 3, 6]), data=st.data())
def test_kvcache_programs_keep_the_state_of_their_histories(config, B, seed, dtype, level, scores,
                                                            rollback, data):
    event(config)
    prog = Program(config, B, seed, dtype, level, scores, rollback)
    for _ in range(data.draw(st.integers(3, 9), label="ops")):
        B, held = len(prog.hist), min(len(h) for h in prog.hist)
        lens = [len(h) for h in prog.hist]
        room = M - max(lens)
        ops = (["prompt"] if held == 0 else ["decode", "decode", "steps", "truncate", "truncate",
                                             "truncate_each", "abandon", "copy_from", "take", "reset"])
        op = data.draw(st.sampled_from(ops), label="op")
        order = data.draw(st.permutations(list(range(L))), label="order")
        if op == "prompt":
            S = data.draw(st.integers(1, 12), label="S")
            ragged = data.draw(st.none() | st.lists(st.integers(1, S), min_size=B, max_size=B), label="lens")
            prog.step(S, order, ragged)
        elif op in ("decode", "steps", "abandon") and room >= 1:
            # a batch takes one token per step after its prompt (the operator's contract)
            multi = op != "decode" and B == 1 and room >= 2
            S = data.draw(st.integers(2, min(6, room)), label="S") if multi else 1
            if op != "abandon":
                prog.step(S, order)
            else:
                some = order[:data.draw(st.integers(1, L - 1), label="layers")]
                target = data.draw(st.integers(1, max(lens)) | st.just(lens) |
                                   st.tuples(*[st.integers(1, n) for n in lens]).map(list), label="n")
                prog.abandon(S, some, target)
        elif op == "truncate":
            ok = prog.truncate(data.draw(st.integers(1, max(lens)), label="n"))
            event("truncated" if ok else "truncate refused (a float row is gone)")
        elif op == "truncate_each":
            target = [data.draw(st.integers(1, n), label="n_b") for n in lens]
            ok = prog.truncate(target)
            event("truncated per sequence" if ok else "truncate refused (a float row is gone)")
        elif op == "copy_from" and len(set(lens)) == 1 and "+had" not in config:
            # (the Hadamard product is NumPy's in copy_from: a code may differ by one step)
            prog.copy_from(data.draw(st.integers(1, lens[0]), label="n"))
            event("copy_from")
        elif op == "take":
            prog.take(data.draw(st.lists(st.integers(0, B - 1), min_size=1, max_size=3), label="idx"))
        elif op == "reset":
            prog.cache.reset()
            prog.hist = [[] for _ in prog.hist]
            prog.ring = [set() for _ in prog.hist]
        prog.check(f"after {op}")
