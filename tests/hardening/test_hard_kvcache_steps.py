"""Property test: random valid programs of gqa.KVCache -- prompts (ragged or not), decode and
multi-token steps with the layers in any order, truncate (one length or one per sequence),
take (reorder, drop, repeat sequences), reset -- over its cache formats (float, static INT8 /
INT4, per-group INT8 / INT4 / INT2, K / V pairs), float windows and rotations, float32 and
float16, accuracy levels 0 and 4, and the model's local windows (per layer) and softcap.

The cache's state is a function of each sequence's history alone: its codes and float windows
after any program must be, bit for bit, those of a fresh cache given each sequence's kept
positions as one (ragged) prompt, its lengths the histories' lengths, and a step's output that
fresh cache's output of the same step.  So a truncation that rearranges the windows wrongly,
a take that mixes sequences, or a ragged step at a wrong position is seen at once.  A
truncation the float windows cannot follow (positions the windows no longer hold) must raise
ValueError and change nothing; every other must succeed.
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


def make(config, B, seed, dtype, level, scores=None):
    opts = dict(gqa.cache_options(config), **(scores or {}))
    ks, vs = _scales(opts["mode"], np.random.default_rng(seed))
    cos, sin = gqa.rotary_caches(M, H)
    return gqa.KVCache(num_layers=L, num_heads=N, kv_num_heads=NKV, head_size=H, max_length=M,
                       batch_size=B, rotary=(cos.astype(dtype), sin.astype(dtype)), k_scales=ks,
                       v_scales=vs, dtype=dtype, accuracy_level=level, **opts)


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
    (k, v) rows, so a fresh cache can be given it again."""

    def __init__(self, config, B, seed, dtype=np.float32, level=0, scores=None):
        self.make = lambda B: make(config, B, seed, dtype, level, scores)  # noqa: E731
        self.dtype = dtype
        self.cache = self.make(B)
        self.hist = [[] for _ in range(B)]     # per sequence: [(k [L, Nkv*H], v [L, Nkv*H])]
        self.rng = np.random.default_rng(seed + 1)

    def replay(self):
        """A fresh cache given each sequence's history as one ragged prompt."""
        B = len(self.hist)
        c = self.make(B)
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

    def step(self, S, order, ragged=None):
        B = len(self.hist)
        ref = self.replay()
        u = lambda *shape: self.rng.uniform(-1, 1, shape).astype(self.dtype)  # noqa: E731
        q, k, v = u(L, B, S, N * H), u(L, B, S, NKV * H), u(L, B, S, NKV * H)
        for li in order:
            got = self.cache.attend(li, q[li], k[li], v[li], lengths=ragged)
            want = ref.attend(li, q[li], k[li], v[li], lengths=ragged)
            for b in range(B):
                rows = ragged[b] if ragged else S
                assert np.array_equal(got[b, :rows].view(np.uint8), want[b, :rows].view(np.uint8)), \
                    f"step of {S}: layer {li}, sequence {b}'s output differs from the fresh cache's"
        for b in range(B):
            for p in range(ragged[b] if ragged else S):
                self.hist[b].append((k[:, b, p].copy(), v[:, b, p].copy()))

    def truncate(self, target):
        """truncate(target): refused (ValueError, nothing changed) exactly where a sequence's
        windows would need a position they no longer hold as floats."""
        c = self.cache
        new = [min(len(h), target) for h in self.hist] if np.isscalar(target) else list(target)
        ok = all(self._windows_follow(len(h), n) for h, n in zip(self.hist, new))
        before = state(c)
        try:
            c.truncate(target)
        except ValueError as e:
            assert not ok, f"truncate({target}) refused: {e}"
            assert "truncate" in str(e)
            same_state(state(c), before, "a refused truncate")
            return False
        assert ok, f"truncate({target}) accepted though the windows had lost positions"
        self.hist = [h[:n] for h, n in zip(self.hist, new)]
        return True

    def _windows_follow(self, old, n):
        """The windows of n <= old positions are among those of old (README "Float windows")."""
        s, r = self.cache.sink_size, self.cache.recent_size
        if self.cache.hp_key[0] is None or n == old:
            return True
        ns_o = min(s, old)
        held = set(range(ns_o)) | set(range(old - min(r, old - ns_o), old))
        ns = min(s, n)
        return set(range(ns)) | set(range(n - min(r, n - ns), n)) <= held

    def take(self, idx):
        self.cache = self.cache.take(idx)
        self.hist = [list(self.hist[i]) for i in idx]


WINDOWED = [c for c in CONFIGS if "+s" in c]
# the model's score options: none, a local window in one layer (Gemma's alternating layers),
# in both, softcap, both together
SCORES = [None, None, dict(local_window_size=[-1, 3]), dict(local_window_size=2),
          dict(softcap=5.0), dict(local_window_size=[4, -1], softcap=2.0)]


@settings(max_examples=max(10, settings.default.max_examples * 3 // 5))
@given(config=st.sampled_from(CONFIGS) | st.sampled_from(WINDOWED), B=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16), dtype=st.sampled_from([np.float32, np.float32, np.float16]),
       level=st.sampled_from([0, 0, 4]), scores=st.sampled_from(SCORES), data=st.data())
def test_kvcache_programs_keep_the_state_of_their_histories(config, B, seed, dtype, level, scores, data):
    event(config)
    prog = Program(config, B, seed, dtype, level, scores)
    for _ in range(data.draw(st.integers(3, 9), label="ops")):
        B, held = len(prog.hist), min(len(h) for h in prog.hist)
        room = M - max(len(h) for h in prog.hist)
        ops = (["prompt"] if held == 0 else ["decode", "decode", "steps", "truncate",
                                             "truncate_each", "take", "reset"])
        op = data.draw(st.sampled_from(ops), label="op")
        order = data.draw(st.permutations(list(range(L))), label="order")
        if op == "prompt":
            S = data.draw(st.integers(1, 12), label="S")
            ragged = data.draw(st.none() | st.lists(st.integers(1, S), min_size=B, max_size=B), label="lens")
            prog.step(S, order, ragged)
        elif op in ("decode", "steps") and room >= 1:
            # a batch takes one token per step after its prompt (the operator's contract)
            multi = op == "steps" and B == 1 and room >= 2
            prog.step(data.draw(st.integers(2, min(6, room)), label="S") if multi else 1, order)
        elif op == "truncate":
            ok = prog.truncate(data.draw(st.integers(1, max(len(h) for h in prog.hist)), label="n"))
            event("truncated" if ok else "truncate refused (the windows lost a position)")
        elif op == "truncate_each":
            target = [data.draw(st.integers(1, len(h)), label="n_b") for h in prog.hist]
            ok = prog.truncate(target)
            event("truncated per sequence" if ok else "truncate refused (the windows lost a position)")
        elif op == "take":
            prog.take(data.draw(st.lists(st.integers(0, B - 1), min_size=1, max_size=3), label="idx"))
        elif op == "reset":
            prog.cache.reset()
            prog.hist = [[] for _ in prog.hist]
        prog.check(f"after {op}")
