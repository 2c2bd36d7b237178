"""GroupQueryAttention operator on the seed shape (B=1, N=16, Nkv=8, H=128): prefill S = T
and decode (S = 1) with the in-place cache, per kernel path and cache mode."""
import timeit

import numpy as np

try:
    import gqa
except ImportError:  # pragma: no cover
    gqa = None

N, NKV, H = 16, 8, 128
MODES = {  # name -> (k_quant_type, v_quant_type, bits)
    "s8_pt": ("PER_TENSOR", "PER_TENSOR", 8),
    "s4_pt": ("PER_TENSOR", "PER_TENSOR", 4),
    "s8_pc": ("PER_CHANNEL", "PER_CHANNEL", 8),
    "float": ("NONE", "NONE", 0),
}
PATHS = ["scalar", "avx2", "avx512", "neon"]


def _skip_unless_runnable(path):
    if gqa is None or path not in gqa.available_paths():
        raise NotImplementedError(f"path {path} not runnable here")


def _case(mode, S, T, capacity, seed=0):
    kq, vq, bits = MODES[mode]
    rng = np.random.default_rng(seed)
    hp = H if bits != 4 else H // 2
    cdt = {8: np.int8, 4: np.uint8, 0: np.float32}[bits]
    u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)
    if bits == 0:
        kc, vc = u(1, NKV, capacity, H), u(1, NKV, capacity, H)
    elif bits == 8:
        kc = rng.integers(-128, 128, (1, NKV, capacity, hp)).astype(cdt)
        vc = rng.integers(-128, 128, (1, NKV, capacity, hp)).astype(cdt)
    else:
        kc = rng.integers(0, 256, (1, NKV, capacity, hp)).astype(cdt)
        vc = rng.integers(0, 256, (1, NKV, capacity, hp)).astype(cdt)
    nk = NKV * H if kq == "PER_CHANNEL" else 1
    nv = NKV * H if vq == "PER_CHANNEL" else 1
    scales = {} if bits == 0 else dict(k_scale=np.full(nk, 0.004, np.float32),
                                       v_scale=np.full(nv, 0.004, np.float32))
    op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type=kq, v_quant_type=vq,
                                 kv_cache_bit_width=bits)
    args = (u(1, S, N * H), u(1, S, NKV * H), u(1, S, NKV * H), kc, vc,
            np.array([T - 1], np.int32), T)
    return op, args, dict(scales, present_key=kc, present_value=vc)


class Decode:
    """One decode step (S = 1) at total length T, cache updated in place."""
    params = (PATHS, list(MODES), [512, 2048, 8192])
    param_names = ["path", "mode", "T"]
    timer = timeit.default_timer

    def setup(self, path, mode, T):
        _skip_unless_runnable(path)
        self.cfg = gqa.config(path=path)
        self.op, self.args, self.kw = _case(mode, 1, T, T)

    def teardown(self, path, mode, T):
        if getattr(self, "cfg", None) is not None:    # setup skipped (a path not runnable here)
            self.cfg.__exit__(None, None, None)

    def time_decode(self, path, mode, T):
        self.op(*self.args, **self.kw)


class _AtLevel:
    """A call of S new tokens at total length T under gqa.config(accuracy_level=level)."""
    timer = timeit.default_timer

    def _set_up(self, level, mode, S, T):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        self.cfg = gqa.config(accuracy_level=level)
        self.op, self.args, self.kw = _case(mode, S, T, T)

    def teardown(self, *params):
        if getattr(self, "cfg", None) is not None:
            self.cfg.__exit__(None, None, None)


class DecodeAccuracy(_AtLevel):
    """A decode step over an INT8 / INT4 cache at accuracy_level 0 (float32 products) and 4
    (integer dot products: AMX INT8 tiles, AVX-512 VNNI or AVX2, whichever the automatic path's
    unit is; float32 where it has none)."""
    params = ([0, 4], ["s8_pt", "s8_pc", "s4_pt"], [2048, 8192])
    param_names = ["level", "mode", "T"]

    def setup(self, level, mode, T):
        self._set_up(level, mode, 1, T)

    def time_decode(self, level, mode, T):
        self.op(*self.args, **self.kw)


class Step(_AtLevel):
    """A step of S new tokens (speculative decoding's verification, assisted generation) at
    total length T = 8192, cache updated in place, at accuracy_level 0 and 4: S x G rows per KV
    head few enough for the decode kernels (gqa/_plan.pyx, direct_rows)."""
    params = ([0, 4], ["s8_pt", "s4_pt", "float"], [2, 4, 8])
    param_names = ["level", "mode", "S"]

    def setup(self, level, mode, S):
        self._set_up(level, mode, S, 8192)

    def time_step(self, level, mode, S):
        self.op(*self.args, **self.kw)


class PrefillAccuracy:
    """A first prompt S = T (causal) over a float32 / INT8 / INT4 cache at accuracy_level 0, 3 and
    4 (levels 3-4 where the CPU has bfloat16 tiles, AMX or AVX-512 BF16: each flash tile's QK and
    P @ V on them; level 4 elsewhere: on VNNI each tile's P @ V by the integer-dot kernel on the
    INT8 V codes, on AVX2 both GEMMs on the codes (kernels_avx2_pack.h), a float32 cache's tiles
    quantized once per thread (K per channel with zeros, V per row); level 3 elsewhere: level 0)."""
    params = ([0, 3, 4], ["float", "s8_pt", "s8_pc", "s4_pt"], [2048])
    param_names = ["level", "mode", "S"]
    timer = timeit.default_timer
    timeout = 300

    def setup(self, level, mode, S):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        self.cfg = gqa.config(accuracy_level=level)
        self.op, self.args, self.kw = _case(mode, S, S, S)

    def teardown(self, level, mode, S):
        if getattr(self, "cfg", None) is not None:
            self.cfg.__exit__(None, None, None)

    def time_prefill(self, level, mode, S):
        self.op(*self.args, **self.kw)


class PrefillTiles(PrefillAccuracy):
    """A first prompt S = T (causal) at accuracy_level 3 on each kind of bfloat16 tiles
    (gqa.config(tiles=name): "amx", "avx512bf16"); a kind this CPU does not run is skipped.
    Teardown and the timed call: PrefillAccuracy's."""
    params = (["amx", "avx512bf16"], ["float", "s8_pc"], [2048])
    param_names = ["tiles", "mode", "S"]

    def setup(self, tiles, mode, S):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        if tiles not in gqa.available_tiles():
            raise NotImplementedError(f"this CPU does not run the {tiles} tiles")
        self.cfg = gqa.config(accuracy_level=3, tiles=tiles)
        self.op, self.args, self.kw = _case(mode, S, S, S)


class WindowedPrefill(PrefillAccuracy):
    """A first prompt S = T (causal) into a gqa.KVCache with float windows (sink 4, recent 64:
    the staged tiles, each row's windows its own), with and without Hadamard rotations, at
    accuracy_level 0 and 3 (level 3 where the CPU has bfloat16 tiles: codes and floats on
    them, the tiles that some rows read both ways strip by strip; level 0 elsewhere).  Each
    call starts a new sequence (KVCache.reset).  Parameter names and limits: PrefillAccuracy's."""
    params = ([0, 3], ["int4-g32+s4r64+had", "int8-g32+s4r64"], [2048])

    def setup(self, level, mode, S):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        rng = np.random.default_rng(0)
        u = lambda w: rng.uniform(-0.5, 0.5, (1, S, w * H)).astype(np.float32)  # noqa: E731
        self.q, self.k, self.v = u(N), u(NKV), u(NKV)
        self.cache = gqa.KVCache(num_layers=1, num_heads=N, kv_num_heads=NKV, head_size=H,
                                 max_length=S, mode=mode, accuracy_level=level)

    def time_prefill(self, level, mode, S):
        self.cache.reset()
        self.cache.attend(0, self.q, self.k, self.v)


class CallOverhead:
    """A decode step at T = 16 (the attention itself is ~1 us): what a call costs beyond the
    kernels -- a repeat on a kept signature (gqa/_signature.pyx, "short"), the signature checks
    of a first call (a new operator each time, "full") and the function
    (gqa.group_query_attention, which keeps an operator per attribute set)."""
    params = (["short", "full", "function"],)
    param_names = ["path"]
    timer = timeit.default_timer

    def setup(self, path):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        self.op, self.args, self.kw = _case("s8_pt", 1, 16, 16)
        self.attrs = dict(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_TENSOR",
                          v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
        self.op(*self.args, **self.kw)

    def time_call(self, path):
        if path == "function":
            gqa.group_query_attention(*self.args, **self.kw, **self.attrs)
            return
        op = self.op if path == "short" else gqa.GroupQueryAttention(**self.attrs)
        op(*self.args, **self.kw)


class KVCacheStep:
    """One decode step of a 30-layer model through ``gqa.KVCache`` at T = 65 (SmolLM2-135M's
    heads 9/3/64, INT8 per tensor): ``kvcache`` is 30 ``attend`` calls (each layer's
    operator plus KVCache's own checks and bookkeeping), ``operator`` the same 30 kept
    operators called by hand on the cache's buffers.  Both end with ``truncate(64)``, so every
    step is at T = 65; the difference is what KVCache adds per step."""
    params = (["kvcache", "operator"],)
    param_names = ["side"]
    timer = timeit.default_timer

    def setup(self, side):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        n, nkv, h, layers = 9, 3, 64, 30
        rng = np.random.default_rng(0)
        self.c = gqa.KVCache(num_layers=layers, num_heads=n, kv_num_heads=nkv, head_size=h,
                             max_length=128, mode="int8-pt", k_scales=np.full(1, 0.02, np.float32),
                             v_scales=np.full(1, 0.02, np.float32))
        u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)  # noqa: E731
        prompt = (u(1, 64, n * h), u(1, 64, nkv * h), u(1, 64, nkv * h))
        for li in range(layers):
            self.c.attend(li, *prompt)
        self.step = (u(1, 1, n * h), u(1, 1, nkv * h), u(1, 1, nkv * h))
        self.seqlens = np.array([64], np.int32)

    def time_step(self, side):
        c, (q, k, v) = self.c, self.step
        if side == "kvcache":
            for li in range(c.num_layers):
                c.attend(li, q, k, v)
        else:
            for li in range(c.num_layers):
                c.ops[li](q, k, v, c.key[li], c.value[li], self.seqlens, 65, k_scale=c.k_scales[li],
                          v_scale=c.v_scales[li], present_key=c.key[li], present_value=c.value[li])
        c.truncate(64)

    def track_cold_layer_us(self, side):
        """µs of one layer's call when 48 MB were streamed before it (a model's own matrix
        products between its layers leave every cache cold): the minimum over 5 steps of each
        step's mean."""
        c, (q, k, v) = self.c, self.step
        other = np.ones(12 << 20, np.float32)
        best = float("inf")
        for _ in range(5):
            spent = 0.0
            for li in range(c.num_layers):
                other.sum()
                t0 = timeit.default_timer()
                if side == "kvcache":
                    c.attend(li, q, k, v)
                else:
                    c.ops[li](q, k, v, c.key[li], c.value[li], self.seqlens, 65,
                              k_scale=c.k_scales[li], v_scale=c.v_scales[li],
                              present_key=c.key[li], present_value=c.value[li])
                spent += timeit.default_timer() - t0
            c.truncate(64)
            best = min(best, 1e6 * spent / c.num_layers)
        return best
    track_cold_layer_us.unit = "us"


class Prefill:
    """A first prompt S = T (causal)."""
    params = (PATHS, list(MODES), [512, 2048])
    param_names = ["path", "mode", "S"]
    timer = timeit.default_timer
    timeout = 300

    def setup(self, path, mode, S):
        _skip_unless_runnable(path)
        if path == "scalar" and S > 512:
            raise NotImplementedError("scalar prefill at S > 512 is too slow to be useful here")
        self.cfg = gqa.config(path=path)
        self.op, self.args, self.kw = _case(mode, S, S, S)

    def teardown(self, path, mode, S):
        if getattr(self, "cfg", None) is not None:    # setup skipped (a path not runnable here)
            self.cfg.__exit__(None, None, None)

    def time_prefill(self, path, mode, S):
        self.op(*self.args, **self.kw)


class PrefillMemory:
    """Peak memory of a first prompt S = T = 4096 (INT8, in place): flash against naive."""
    params = (["flash", "naive"],)
    param_names = ["attention"]
    timeout = 300

    def setup(self, attention):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        self.op, self.args, self.kw = _case("s8_pt", 4096, 4096, 4096)

    def peakmem_prefill(self, attention):
        with gqa.config(flash=attention == "flash"):
            self.op(*self.args, **self.kw)


class Accuracy:
    """Max abs error of the quantized operator against a float32-cache run of the same
    inputs (decode, T = 2048): tracks accuracy drift of the kernels."""
    params = (PATHS, ["s8_pt", "s4_pt", "s8_pc"])
    param_names = ["path", "mode"]

    def setup(self, path, mode):
        _skip_unless_runnable(path)

    track_max_abs_error_vs_float_unit = "abs"

    def track_max_abs_error_vs_float(self, path, mode):
        kq, vq, bits = MODES[mode]
        T = 2048
        rng = np.random.default_rng(1)
        kf = rng.uniform(-1, 1, (1, NKV, T, H)).astype(np.float32)
        vf = rng.uniform(-1, 1, (1, NKV, T, H)).astype(np.float32)
        q = rng.uniform(-1, 1, (1, 1, N * H)).astype(np.float32)
        k = rng.uniform(-1, 1, (1, 1, NKV * H)).astype(np.float32)
        v = rng.uniform(-1, 1, (1, 1, NKV * H)).astype(np.float32)
        qmax = 127 if bits == 8 else 7

        def calibrate(x, qtype):  # amax / qmax, per (KV head, channel) or per tensor
            if qtype == "PER_CHANNEL":
                return (np.abs(x).max(axis=(0, 2)).reshape(-1) / qmax).astype(np.float32)
            return np.array([np.abs(x).max() / qmax], np.float32)

        def quantize(x, scale):  # [1, Nkv, T, H] with 1 or Nkv*H scales
            if scale.size == 1:
                return gqa.quantize(x, scale, bits=bits)
            return np.stack([gqa.quantize(x[:, j], scale[j * H:(j + 1) * H], bits=bits)
                             for j in range(NKV)], axis=1)

        sk, sv = calibrate(kf, kq), calibrate(vf, vq)
        with gqa.config(path=path):
            kc, vc = quantize(kf, sk), quantize(vf, sv)
            seq = np.array([T - 1], np.int32)
            ref = gqa.group_query_attention(q, k, v, kf, vf, seq, T, num_heads=N, kv_num_heads=NKV)[0]
            out = gqa.group_query_attention(q, k, v, kc, vc, seq, T, k_scale=sk, v_scale=sv,
                                            num_heads=N, kv_num_heads=NKV, k_quant_type=kq,
                                            v_quant_type=vq, kv_cache_bit_width=bits)[0]
        return float(np.abs(out - ref).max())


class WindowedDecode:
    """In-place decode on a windowed cache (sliding_window_cache=1, INT8 per tensor) in its
    steady state: window W, capacity W + 64 (a compaction every 65 steps), T advancing by one
    per call past the capacity."""
    params = ([512, 4096],)
    param_names = ["W"]
    timer = timeit.default_timer

    def setup(self, W):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        C = W + 64
        _, args, self.kw = _case("s8_pt", 1, C, C)
        self.q, self.k, self.v, self.kc, self.vc = args[:5]
        self.op = gqa.GroupQueryAttention(num_heads=N, kv_num_heads=NKV, k_quant_type="PER_TENSOR",
                                          v_quant_type="PER_TENSOR", kv_cache_bit_width=8,
                                          local_window_size=W, sliding_window_cache=1)
        self.T = C
        self.seqlens = np.array([C - 1], np.int32)

    def time_decode(self, W):
        self.T += 1
        self.seqlens[0] = self.T - 1
        self.op(self.q, self.k, self.v, self.kc, self.vc, self.seqlens, self.T, **self.kw)


GROUP_MODES = {  # name -> K's and V's (bits, group, metadata) (gqa.KVCache mode names)
    "int4-g32": [(4, 32, "fp32")] * 2, "int4-g32-fp16": [(4, 32, "fp16")] * 2,
    "int2-g64": [(2, 64, "fp32")] * 2, "int2-g32-fp16": [(2, 32, "fp16")] * 2,
    "int8-g32": [(8, 32, "fp32")] * 2, "int4-g32/int2-g32": [(4, 32, "fp32"), (2, 32, "fp32")],
}


class GroupDecode:
    """One decode step (S = 1) at total length T on a per-group cache (PER_GROUP; K and V
    may have their own widths), in place, with float windows (sink 4, recent 64) and Hadamard
    rotations or without them."""
    params = (PATHS, list(GROUP_MODES), [2048, 8192], ["plain", "windows+rotations"])
    param_names = ["path", "mode", "T", "extras"]
    timer = timeit.default_timer

    def setup(self, path, mode, T, extras, level=0):
        _skip_unless_runnable(path)
        self.cfg = gqa.config(path=path, accuracy_level=level)
        (kb, g, md), (vb, _, _) = GROUP_MODES[mode]
        rng = np.random.default_rng(0)
        u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)  # noqa: E731
        kc = gqa.quantize(u(1, NKV, T, H), bits=kb, group_size=g, metadata=md)
        vc = gqa.quantize(u(1, NKV, T, H), bits=vb, group_size=g, metadata=md)
        win = extras != "plain"
        widths = dict(kv_cache_bit_width=kb) if kb == vb else dict(k_cache_bit_width=kb,
                                                                    v_cache_bit_width=vb)
        self.op = gqa.GroupQueryAttention(
            num_heads=N, kv_num_heads=NKV, k_quant_type="PER_GROUP", v_quant_type="PER_GROUP",
            kv_quant_group_size=g, metadata_type=md, sink_size=4 if win else 0,
            recent_size=64 if win else 0, **widths)
        self.args = (u(1, 1, N * H), u(1, 1, NKV * H), u(1, 1, NKV * H), kc, vc,
                     np.array([T - 1], np.int32), T)
        self.kw = dict(present_key=kc, present_value=vc)
        if win:
            hk, hv = u(1, NKV, 68, H), u(1, NKV, 68, H)
            r = gqa.oscar_rotation(None, H, NKV)
            self.kw.update(past_hp_key=hk, past_hp_value=hv, present_hp_key=hk,
                           present_hp_value=hv, oscar_rotation_k=r, oscar_rotation_v=r)

    def teardown(self, path, mode, T, extras):
        if getattr(self, "cfg", None) is not None:    # setup skipped (a path not runnable here)
            self.cfg.__exit__(None, None, None)

    def time_decode(self, path, mode, T, extras):
        self.op(*self.args, **self.kw)


class GroupDecodeAccuracy(GroupDecode):
    """GroupDecode on the automatic path at accuracy_level 0 (float32 products) and 4 (integer dots
    per group on gqa.get_config()["group_dot_unit"]: avx512vnni, avxvnni, avx2 or neon; float32
    where there is none)."""
    params = ([0, 4], ["int8-g32", "int4-g32", "int2-g64", "int4-g32/int2-g32"], [8192],
              ["plain", "windows+rotations"])
    param_names = ["level", "mode", "T", "extras"]

    def setup(self, level, mode, T, extras):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        super().setup(gqa.get_config()["active_path"], mode, T, extras, level)

    def teardown(self, level, mode, T, extras):
        super().teardown(None, mode, T, extras)

    def time_decode(self, level, mode, T, extras):
        self.op(*self.args, **self.kw)


class GroupPrefillAccuracy(GroupDecode):
    """A first prompt S = T (causal) over a per-group cache, plain or with windows and rotations,
    at accuracy_level 0 and 4 (on avx2 both GEMMs of each flash tile on the codes: the packed
    kernels of kernels_avx2_gdot.c, with windows on the tiles every row reads as codes;
    elsewhere level 4 leaves prompts to the float32 or bfloat16 tiles)."""
    params = ([0, 4], ["int8-g32", "int4-g32"], [2048], ["plain", "windows+rotations"])
    param_names = ["level", "mode", "S", "extras"]
    timeout = 300

    def setup(self, level, mode, S, extras):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        super().setup(gqa.get_config()["active_path"], mode, S, extras, level)
        rng = np.random.default_rng(1)
        u = lambda *s: rng.uniform(-0.5, 0.5, s).astype(np.float32)  # noqa: E731
        self.args = (u(1, S, N * H), u(1, S, NKV * H), u(1, S, NKV * H)) + self.args[3:]

    def teardown(self, level, mode, S, extras):
        super().teardown(None, mode, S, extras)

    def time_prefill(self, level, mode, S, extras):
        self.op(*self.args, **self.kw)


class HeadWidths:
    """One decode step (S = 1, T = 4096) of a multi-head layer (32 heads, 32 KV heads) at head
    sizes 80 (Phi-2's), 96 (Phi-3's) and 128, through the kept operator `python -m gqa bench`
    builds, on the automatic path at accuracy levels 0 and 4: widths whose last columns took
    slower kernels until a later session (AVX-512's float P @ V and per-group table kernels, the
    AVX2 unit's INT4 QK)."""
    params = ([0, 4], ["float", "int4-pt", "int4-g32"], [80, 96, 128])
    param_names = ["level", "mode", "H"]
    timer = timeit.default_timer

    def setup(self, level, mode, H):
        if gqa is None:
            raise NotImplementedError("gqa not importable")
        if mode == "int4-g32" and H % 32:
            raise NotImplementedError(f"groups of 32 columns do not divide a head of {H}")
        from gqa.apps.bench.cases import ours
        self.step = ours(dict(B=1, N=32, Nkv=32, H=H, S=1, T=4096, mode=mode, threads=None,
                              phase="decode"), level=level)

    def time_decode(self, level, mode, H):
        self.step()
