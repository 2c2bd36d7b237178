"""``python -m gqa bench``: this package against its peers, measured in the same run.

Every row (one shape, one cache mode, one thread count) is measured for gqa and for each
peer in alternation -- gqa, peer 1, peer 2, ..., gqa, peer 1, ... -- so that drift of a
shared, noisy machine hits all alike; the table shows medians and the ratio
``peer_time / gqa_time`` (> 1: gqa is faster).

Peers (each optional; a missing one is reported and skipped):

* ``ort``       onnxruntime, one-node com.microsoft.GroupQueryAttention graph; past and present
                bound to the same buffers through IOBinding (in place, like gqa), every input
                and the output bound once: only ``run_with_iobinding`` is timed.
* ``ort-naive`` the same in a subprocess with ``ORT_GQA_DISABLE_FLASH_ATTENTION=1`` (its naive
                path); the subprocess times itself on command, in the same alternation.
* ``torch``     ``torch.nn.functional.scaled_dot_product_attention``: ``torch-f32`` on a float32
                cache, and ``torch-dq`` (quantized modes): the cache kept as gqa's codes, the new
                rows quantized into it, the whole cache dequantized into preallocated float32
                buffers, then SDPA.
* ``ggml``      llama.cpp's ``ggml_flash_attn_ext`` through ``../shared/tools/peers/ggml_peer.py``
                (only when asked, and only with llama-cpp-python installed); KV types q8_0 (INT8),
                q4_0 (INT4), f16 (float).

gqa is timed in both forms a user calls: the kept operator (``gqa``, the reference of every
ratio) and ``gqa.group_query_attention`` (column ``gqa-fn``, its ratio fn/op: 1.00 = as fast).
Decode rows give the cache bytes read per second (GB/s).  ``--shape`` takes several shapes
(``;``-separated) or ``real`` (the seed shape and the heads of common models); ``--layers L``
adds decode rows inside a loop over L layers with a NumPy projection between calls (see
gqa/_bench_layers.py).
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from . import _kvcache

MODES = {  # name -> (k_quant_type, v_quant_type, kv_cache_bit_width)
    "int8-pt": ("PER_TENSOR", "PER_TENSOR", 8),
    "int4-pt": ("PER_TENSOR", "PER_TENSOR", 4),
    "int8-pc": ("PER_CHANNEL", "PER_CHANNEL", 8),
    "float": ("NONE", "NONE", 0),
}
MODE_ALIASES = {"s8_pt": "int8-pt", "s4_pt": "int4-pt", "s8_pc": "int8-pc", "f32": "float",
                "int8": "int8-pt", "int4": "int4-pt", "none": "float"}
PEER_NAMES = ("ort", "ort-naive", "torch", "ggml")
DEFAULT_PEERS = "ort,ort-naive,torch"
# columns of the table, in order, for each peer the user names
PEER_COLUMNS = {"ort": ["ort"], "ort-naive": ["ort-naive"], "torch": ["torch-f32", "torch-dq"],
                "ggml": ["ggml"]}
GGML_TYPES = {"int8-pt": "q8_0", "int8-pc": "q8_0", "int4-pt": "q4_0", "float": "f16"}
SEED_SHAPE = (1, 16, 8, 128)
# --shape real: the seed and the attention heads of real models (N, Nkv, H): SmolLM2-135M,
# Llama-3.2-1B / Qwen-style, 12/4/64, small GQA, multi-query
REAL_SHAPES = [SEED_SHAPE, (1, 9, 3, 64), (1, 32, 8, 64), (1, 12, 4, 64), (1, 8, 2, 64), (1, 8, 1, 256)]
DEFAULTS = dict(threads="1,2", decode_T="16,512,2048,8192", prefill_S="512,1024,2048",
                modes="int8-pt,int4-pt,int8-pc,float")
QUICK = dict(threads=str(min(2, os.cpu_count() or 1)), decode_T="16,512", prefill_S="512",
             modes="int8-pt,int4-pt,int8-pc,float")
BATCH_S = 0.010        # a timed batch of short calls lasts about this long
WARM_BELOW_S = 0.020   # calls shorter than this get untimed calls before each batch ...
WARM_S = 0.003         # ... for this long
GGML_SCRIPT = os.path.join("shared", "tools", "peers", "ggml_peer.py")


# ----------------------------------------------------------------------------------------
# cases: identical inputs for every side (the ort-naive subprocess rebuilds them from the spec)

def flops(spec):
    """Useful FLOPs of one call: QK and PV, 2*B*N*S*T*H each; a causal prefill attends to
    half the square, so S = T gives 2*B*N*S^2*H."""
    B, N, H, S, T = spec["B"], spec["N"], spec["H"], spec["S"], spec["T"]
    if spec["phase"] == "prefill":
        return 2.0 * B * N * S * S * H
    return 4.0 * B * N * S * T * H


def _side_cache(rng, mode, B, Nkv, T, H):
    """One tensor's cache of capacity T in a one-tensor mode (codes of values |x| <= 0.5, like
    the new rows') and its static scale (None for float and per-group caches)."""
    quant, bits, group = _kvcache._side(mode)
    if group:
        from ._api import quantize
        _, g, md = group
        return quantize(rng.uniform(-0.5, 0.5, (B, Nkv, T, H)).astype(np.float32), bits=bits,
                        group_size=g, metadata=md), None
    if bits == 0:
        return rng.uniform(-0.5, 0.5, (B, Nkv, T, H)).astype(np.float32), None
    if bits == 8:
        cache = rng.integers(-128, 128, (B, Nkv, T, H)).astype(np.int8)
    else:
        cache = rng.integers(0, 256, (B, Nkv, T, H // 2)).astype(np.uint8)
    n = Nkv * H if quant == "PER_CHANNEL" else 1
    # scales that cover the new rows' range (|x| <= 0.5), as a calibrated cache would
    qmax = 127 if bits == 8 else 7
    return cache, np.full(n, 0.5 / qmax, np.float32) * rng.uniform(0.9, 1.1, n).astype(np.float32)


def build_inputs(spec):
    """Deterministic inputs of one case: query/key/value of the new rows, caches of capacity T
    already holding T - S rows (in-place mode: seqlens_k = T - 1), and the operator's
    attributes (gqa/_kvcache.py's mode names: K's and V's caches may differ)."""
    B, N, Nkv, H, S, T = (spec[k] for k in ("B", "N", "Nkv", "H", "S", "T"))
    k_mode, v_mode = _kvcache.parse_mode(spec["mode"])
    rng = np.random.default_rng(spec.get("seed", 0))
    u = lambda *shape: rng.uniform(-0.5, 0.5, shape).astype(np.float32)  # noqa: E731
    inp = dict(query=u(B, S, N * H), key=u(B, S, Nkv * H), value=u(B, S, Nkv * H))
    kc, ks = _side_cache(rng, k_mode, B, Nkv, T, H)
    vc, vs = _side_cache(rng, v_mode, B, Nkv, T, H)
    if ks is not None:
        inp["k_scale"] = ks
    if vs is not None:
        inp["v_scale"] = vs
    inp.update(past_key=kc, past_value=vc, seqlens_k=np.full(B, T - 1, np.int32), total_sequence_length=T)
    return inp, dict(num_heads=N, kv_num_heads=Nkv, **_kvcache._op_attributes(k_mode, v_mode))


# ----------------------------------------------------------------------------------------
# sides: prepare(spec) -> a no-argument callable running one call

def _ours(spec, function=False):
    """gqa's call of a case: a kept operator, or (function) gqa.group_query_attention."""
    import gqa
    inp, attrs = build_inputs(spec)
    kc, vc = inp["past_key"], inp["past_value"]
    q, k, v, sl, T = (inp[n] for n in ("query", "key", "value", "seqlens_k", "total_sequence_length"))
    ks, vs, nt = inp.get("k_scale"), inp.get("v_scale"), spec["threads"]
    if function:
        f = gqa.group_query_attention
        return lambda: f(q, k, v, kc, vc, sl, T, k_scale=ks, v_scale=vs, present_key=kc,
                         present_value=vc, num_threads=nt, **attrs)
    op = gqa.GroupQueryAttention(**attrs)
    return lambda: op(q, k, v, kc, vc, sl, T, k_scale=ks, v_scale=vs, present_key=kc,
                      present_value=vc, num_threads=nt)


def _ours_function(spec):
    return _ours(spec, function=True)


def cache_bytes(spec):
    """Bytes of K and V cache one decode call reads (T rows of every KV head)."""
    row = 0
    for m in _kvcache.parse_mode(spec["mode"]):
        width, dtype = _kvcache.cache_layout(m, spec["H"])
        row += width * dtype.itemsize
    return spec["B"] * spec["Nkv"] * spec["T"] * row


def _ort(spec):
    if spec["mode"] not in MODES:
        return None              # onnxruntime 1.31.1 has no per-group or mixed caches
    from . import _ort_peer
    inp, attrs = build_inputs(spec)
    kc, vc = inp.pop("past_key"), inp.pop("past_value")
    run = _ort_peer.OrtInPlace(inp, attrs, kc, vc, threads=spec["threads"])
    out = np.empty(inp["query"].shape, np.float32)
    return run.bound(inp, out)


def _torch_setup(spec, dequant):
    if spec["mode"] not in MODES:
        return None
    import torch
    torch.set_num_threads(spec["threads"])
    F = torch.nn.functional
    inp, _ = build_inputs(spec)
    B, N, Nkv, H, S, T = (spec[k] for k in ("B", "N", "Nkv", "H", "S", "T"))
    kq, vq, bits = MODES[spec["mode"]]
    # [B, S, heads*H] -> [B, heads, S, H] views, as a model hands them to SDPA
    q = torch.from_numpy(inp["query"]).view(B, S, N, H).transpose(1, 2)
    k = torch.from_numpy(inp["key"]).view(B, S, Nkv, H).transpose(1, 2)
    v = torch.from_numpy(inp["value"]).view(B, S, Nkv, H).transpose(1, 2)
    causal = spec["phase"] == "prefill"
    rows = slice(T - S, T)
    sdpa = lambda kk, vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=True)  # noqa: E731
    if not dequant:
        if bits:  # a float32 cache holding the same values
            from . import dequantize
            kc = torch.from_numpy(_dequant_cache(dequantize, inp["past_key"], inp["k_scale"], bits, H))
            vc = torch.from_numpy(_dequant_cache(dequantize, inp["past_value"], inp["v_scale"], bits, H))
        else:
            kc, vc = torch.from_numpy(inp["past_key"]), torch.from_numpy(inp["past_value"])

        def f32():
            with torch.inference_mode():
                kc[:, :, rows].copy_(k)
                vc[:, :, rows].copy_(v)
                return sdpa(kc, vc)
        return f32
    if not bits:
        return None
    codes_k, codes_v = torch.from_numpy(inp["past_key"]), torch.from_numpy(inp["past_value"])

    def scale_t(s):
        s = torch.from_numpy(s)
        return s.view(1, Nkv, 1, H) if s.numel() > 1 else float(s[0])

    sk, sv = scale_t(inp["k_scale"]), scale_t(inp["v_scale"])
    kbuf = torch.empty(B, Nkv, T, H)
    vbuf = torch.empty(B, Nkv, T, H)
    qmax, qmin = (127, -128) if bits == 8 else (7, -8)

    def quant(x, s):  # new rows -> codes
        c = torch.round(x / s).clamp_(qmin, qmax)
        if bits == 8:
            return c.to(torch.int8)
        c = (c + 8).to(torch.uint8)
        return c[..., 0::2] | (c[..., 1::2] << 4)

    def deq(codes, s, buf):
        if bits == 8:
            buf.copy_(codes)
        else:
            pairs = buf.view(B, Nkv, T, H // 2, 2)
            pairs[..., 0].copy_(codes & 15)
            pairs[..., 1].copy_(codes >> 4)
            buf.sub_(8)
        return buf.mul_(s)

    def dq():
        with torch.inference_mode():
            codes_k[:, :, rows] = quant(k, sk)
            codes_v[:, :, rows] = quant(v, sv)
            return sdpa(deq(codes_k, sk, kbuf), deq(codes_v, sv, vbuf))
    return dq


def _dequant_cache(dequantize, codes, scale, bits, H):
    B, Nkv, T, _ = codes.shape
    if scale.size == 1:
        return dequantize(codes, scale, bits=bits, head_size=H)
    out = np.empty((B, Nkv, T, H), np.float32)
    for h in range(Nkv):
        out[:, h] = dequantize(codes[:, h], scale[h * H:(h + 1) * H], bits=bits, head_size=H)
    return out


# ----------------------------------------------------------------------------------------
# timing

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


class _Local:
    """A side run in this process."""

    def __init__(self, name, prepare):
        self.name, self._prepare, self.fn = name, prepare, None

    def setup(self, spec):
        self.fn = self._prepare(spec)
        return self.fn is not None

    def time(self, inner, warm):
        return time_batch(self.fn, inner, warm)

    def teardown(self):
        self.fn = None


class _Worker:
    """A side run in a subprocess (onnxruntime's naive path: the flag must be in the
    environment before onnxruntime starts), driven over a pipe so it alternates with the
    others; it times itself, so the pipe's latency is not in the numbers."""

    def __init__(self, name, env):
        self.name = name
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = ("import sys; sys.path.insert(0, %r); from gqa._bench import _serve; _serve()" % pkg_parent)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **env), bufsize=1)
        self.hello = self._call({"cmd": "hello"})

    def _call(self, msg):
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            raise RuntimeError(f"{self.name} worker exited: {err.strip()[-500:] or 'no message'}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def setup(self, spec):
        return self._call({"cmd": "setup", "spec": spec})["ok"]

    def time(self, inner, warm):
        return self._call({"cmd": "time", "inner": inner, "warm": warm})["s"]

    def teardown(self):
        self._call({"cmd": "teardown"})

    def close(self):
        if self.proc.poll() is None:
            try:
                self._call({"cmd": "quit"})
            except RuntimeError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _serve():
    """The worker's loop: JSON lines on stdin, one JSON reply per line on stdout."""
    from . import _ort_peer
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the pipe
    fn = None
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            cmd = msg["cmd"]
            if cmd == "hello":
                if not _ort_peer.importable():
                    raise RuntimeError("onnxruntime/onnx not importable in the worker")
                reply = {"ok": True, "version": _ort_peer.ort.__version__,
                         "flag": os.environ.get("ORT_GQA_DISABLE_FLASH_ATTENTION")}
            elif cmd == "setup":
                fn = _ort(msg["spec"])
                reply = {"ok": True}
            elif cmd == "time":
                reply = {"s": time_batch(fn, msg["inner"], msg["warm"])}
            elif cmd == "teardown":
                fn = None
                reply = {"ok": True}
            elif cmd == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as e:  # noqa: BLE001  (reported to the parent, which carries on)
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


# ----------------------------------------------------------------------------------------
# peers: discovery

def _find_ggml_script(explicit):
    if explicit:
        return explicit if os.path.isfile(explicit) else None, [explicit]
    cands = []
    if os.environ.get("GQA_GGML_PEER"):
        cands.append(os.environ["GQA_GGML_PEER"])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for base in (os.getcwd(), os.path.dirname(os.getcwd()), os.path.dirname(here)):
        cands.append(os.path.join(base, GGML_SCRIPT))
    for c in cands:
        if os.path.isfile(c):
            return c, cands
    return None, cands


class _Ggml:
    """llama.cpp's ggml through the shared peer script (loaded from its path, never imported
    by the package otherwise)."""

    def __init__(self, script, libdir):
        import importlib.util
        spec = importlib.util.spec_from_file_location("_gqa_ggml_peer", script)
        self.mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.mod)
        self.libdir = self.mod.find_libdir(libdir)
        self.g = self.mod.load(self.libdir)
        self.case = None

    def prepare(self, spec):
        if spec["mode"] not in GGML_TYPES:
            return None
        m = self.mod
        m.B, m.HQ, m.HKV, m.D = spec["B"], spec["N"], spec["Nkv"], spec["H"]
        self.teardown()
        rng = np.random.default_rng(spec.get("seed", 0))
        self.case = m.Case(self.g, spec["S"], spec["T"], GGML_TYPES[spec["mode"]],
                           spec["phase"] == "prefill", spec["threads"], rng)
        return self.case.run

    def teardown(self):
        if self.case is not None:
            self.case.close()
            self.case = None


def discover_peers(names, args):
    """-> (sides: list of side objects, status: {column: "ok: ..." or "missing: ..."})."""
    sides, status = [], {}
    for name in names:
        if name == "ort" or name == "ort-naive":
            from . import _ort_peer
            if not _ort_peer.importable():
                status[name] = ("missing: onnxruntime/onnx not installed "
                                f"(pip install onnxruntime=={_ort_peer.ORT_VERSION} onnx)")
                continue
            ver = _ort_peer.ort.__version__
            note = "" if ver == _ort_peer.ORT_VERSION else f" (gqa follows {_ort_peer.ORT_VERSION})"
            if name == "ort":
                flag = os.environ.get("ORT_GQA_DISABLE_FLASH_ATTENTION")
                if flag == "1":
                    note += "; ORT_GQA_DISABLE_FLASH_ATTENTION=1 is set here, so this is its naive path too"
                sides.append(_Local("ort", _ort))
                status[name] = f"ok: onnxruntime {ver}{note}, in-process, IOBinding in place"
            else:
                try:
                    w = _Worker("ort-naive", {"ORT_GQA_DISABLE_FLASH_ATTENTION": "1"})
                except (RuntimeError, OSError) as e:
                    status[name] = f"missing: could not start the subprocess ({e})"
                    continue
                sides.append(w)
                status[name] = (f"ok: onnxruntime {ver}{note}, subprocess with "
                                "ORT_GQA_DISABLE_FLASH_ATTENTION=1, IOBinding in place")
        elif name == "torch":
            try:
                import torch
            except ImportError:
                msg = "missing: torch not installed (pip install torch)"
                status["torch-f32"] = status["torch-dq"] = msg
                continue
            sides.append(_Local("torch-f32", lambda s: _torch_setup(s, False)))
            sides.append(_Local("torch-dq", lambda s: _torch_setup(s, True)))
            status["torch-f32"] = f"ok: torch {torch.__version__}, SDPA on a float32 cache"
            status["torch-dq"] = (f"ok: torch {torch.__version__}, new rows quantized into the code cache, "
                                  "cache dequantized into float32 buffers, then SDPA")
        elif name == "ggml":
            script, tried = _find_ggml_script(args.ggml_peer)
            if script is None:
                status["ggml"] = (f"missing: peer script not found (looked for {', '.join(tried)}; "
                                  "pass --ggml-peer PATH)")
                continue
            import importlib.util
            if not args.ggml_libdir and importlib.util.find_spec("llama_cpp") is None:
                status["ggml"] = ("missing: llama-cpp-python not installed "
                                  "(pip install llama-cpp-python==0.3.36, or pass --ggml-libdir)")
                continue
            try:
                gg = _Ggml(script, args.ggml_libdir)
            except Exception as e:  # noqa: BLE001
                status["ggml"] = f"missing: could not load ggml ({type(e).__name__}: {e})"
                continue
            side = _Local("ggml", gg.prepare)
            side.teardown = lambda gg=gg, side=side: (gg.teardown(), setattr(side, "fn", None))
            sides.append(side)
            status["ggml"] = f"ok: ggml from {gg.libdir} via {script}; KV types q8_0 / q4_0 / f16"
    return sides, status


# ----------------------------------------------------------------------------------------
# progress bar (stderr, no dependency)

class Progress:
    def __init__(self, total, enabled, stream=None):
        self.total, self.done, self.enabled = max(1, total), 0, enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self._last = 0.0

    def update(self, n=1, label=""):
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        frac = min(1.0, self.done / self.total)
        width = 30
        fill = int(frac * width)
        el = now - self.t0
        eta = el / frac - el if frac > 0 else 0
        self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * frac:5.1f}% "
                          f"{el:6.1f}s elapsed, ~{eta:5.0f}s left  {label[:40]:<40}")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


# ----------------------------------------------------------------------------------------
# the run

def _int_list(s, what):
    try:
        out = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"gqa bench: {what} must be a comma-separated list of integers, got {s!r}") from None
    if not out or any(x < 1 for x in out):
        raise SystemExit(f"gqa bench: {what} must list integers >= 1, got {s!r}")
    return out


def _modes(s):
    out = []
    for m in str(s).split(","):
        m = m.strip().lower()
        if not m:
            continue
        m = MODE_ALIASES.get(m, m)
        try:
            _kvcache.parse_mode(m)
        except ValueError:
            raise SystemExit(f"gqa bench: unknown mode {m!r}; valid: {', '.join(MODES)}, per "
                             "group int8/int4/int2-g<group>[-fp16], or K's mode / V's mode "
                             "(int4-pc/int2-g64)") from None
        out.append(m)
    return out


def _peers(s):
    out = []
    for p in str(s).split(","):
        p = p.strip().lower()
        if not p or p == "none":
            continue
        if p not in PEER_NAMES:
            raise SystemExit(f"gqa bench: unknown peer {p!r}; valid: {', '.join(PEER_NAMES)}")
        if p not in out:
            out.append(p)
    return out


def plan(args):
    """The rows to measure, in order: threads, then decode lengths, then prefill lengths,
    each with every mode."""
    q = QUICK if args.quick else DEFAULTS
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else q[name]  # noqa: E731
    threads = _int_list(pick("threads"), "--threads")
    dec = _int_list(pick("decode_T"), "--decode-T") if pick("decode_T") != "" else []
    pre = _int_list(pick("prefill_S"), "--prefill-S") if pick("prefill_S") != "" else []
    modes = _modes(pick("modes"))
    rows = []
    phases = [("decode", dec), ("prefill", pre)] + ([("layers", dec)] if args.layers else [])
    for nt in threads:
        for phase, lengths in phases:
            for B, N, Nkv, H in _shapes(args.shape):
                for L in lengths:
                    for mode in modes:
                        rows.append(dict(phase=phase, B=B, N=N, Nkv=Nkv, H=H,
                                         S=1 if phase != "prefill" else L, T=L, mode=mode,
                                         threads=nt, seed=L, layers=args.layers))
    return rows, threads


def _shapes(arg):
    """--shape: 'B,N,Nkv,H[;B,N,Nkv,H...]' or 'real' (REAL_SHAPES); default the seed's."""
    if not arg:
        return [SEED_SHAPE]
    if arg.strip().lower() == "real":
        return list(REAL_SHAPES)
    out = []
    for part in arg.split(";"):
        if not part.strip():
            continue
        shape = _int_list(part, "--shape")
        if len(shape) != 4:
            raise SystemExit(f"gqa bench: --shape takes B,N,Nkv,H (or 'real'), got {part!r}")
        B, N, Nkv, H = shape
        if N % Nkv:
            raise SystemExit(f"gqa bench: --shape: N ({N}) must be a multiple of Nkv ({Nkv})")
        if H % 16:
            raise SystemExit(f"gqa bench: --shape: H ({H}) must be a multiple of 16")
        out.append(tuple(shape))
    return out


def _peaks(arg, threads):
    if not arg:
        return {}
    vals = [float(x) for x in str(arg).split(",") if x.strip()]
    if len(vals) == 1:  # per-thread peak, scaled by the thread count
        return {nt: vals[0] * nt for nt in threads}
    if len(vals) != len(threads):
        raise SystemExit("gqa bench: --peak-gflops takes one number (per thread) or one per --threads entry")
    return dict(zip(threads, vals))


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
                              "samples": len(samples), "calls_per_sample": inner}
        _safe_teardown(side)
    return res


def _safe_teardown(side):
    try:
        side.teardown()
    except Exception:  # noqa: BLE001
        pass


def run(args, out=None, argv=None):
    out = out or sys.stdout
    import gqa
    rows, threads = plan(args)
    peaks = _peaks(args.peak_gflops, threads)
    peer_names = _peers(args.peers)
    sides, status = discover_peers(peer_names, args)
    columns = [c for p in peer_names for c in PEER_COLUMNS[p]]
    ours = [_Local("gqa", _ours), _Local("gqa-fn", _ours_function)]
    from ._bench_layers import LayerSide
    in_loop = [LayerSide("gqa", _ours), LayerSide("gqa-fn", _ours_function)]
    if "ort" in peer_names and status.get("ort", "").startswith("ok"):
        in_loop.append(LayerSide("ort", _ort))
    rounds_dec = args.repeats if args.repeats else (5 if args.quick else 15)
    rounds_pre = args.repeats if args.repeats else (3 if args.quick else 5)

    cfg = gqa.get_config()
    header = [f"gqa {gqa.__version__} bench: path {cfg['active_kernel']}, "
              f"{platform.machine()}, {os.cpu_count()} CPUs; Python {platform.python_version()}, "
              f"numpy {np.__version__}"]
    load0 = _loadavg()
    if load0 is not None:
        header.append(f"  load average at start: {load0:.2f} on {os.cpu_count()} CPUs"
                      + ("  (busy: expect noisy numbers)" if load0 > 0.5 else ""))
    for c in columns:
        header.append(f"  {c:10s} {status.get(c, 'not asked')}")
    if not columns:
        header.append("  (no peers asked: --peers ort,ort-naive,torch,ggml)")
    for line in header:
        print(line, file=out)
    out.flush()

    enabled = {"on": True, "off": False}.get(args.progress, sys.stderr.isatty())
    total = sum(1 + (rounds_pre if r["phase"] == "prefill" else rounds_dec) for r in rows)
    progress = Progress(total, enabled)
    results = []
    try:
        for spec in rows:
            label = f"{spec['phase']} {spec['T']} {spec['mode']} {spec['threads']}t"
            rounds = rounds_pre if spec["phase"] == "prefill" else rounds_dec
            layered = spec["phase"] == "layers"
            res = measure_row(spec, in_loop if layered else ours + sides, rounds, progress, label,
                              args.gap_ms / 1e3)
            rec = dict(spec, gqa=res.pop("gqa"), gqa_fn=res.pop("gqa-fn"), peers={})
            o = rec["gqa"].get("median_us")
            if o and rec["gqa_fn"].get("median_us"):
                rec["gqa_fn"]["ratio"] = rec["gqa_fn"]["median_us"] / o
            for c in columns:
                r = res.get(c) or {"error": status.get(c, "missing")}
                if c not in res and status.get(c, "").startswith("missing"):
                    r = {"missing": True}
                elif c not in res and layered:
                    r = {"na": True}
                if o and r.get("median_us"):
                    r["ratio"] = r["median_us"] / o
                rec["peers"][c] = r
            if o and spec["phase"] != "prefill":
                rec["gbps"] = cache_bytes(spec) / (o * 1e3)
            if o:
                rec["flops"] = flops(spec)
                if spec["phase"] == "prefill":
                    rec["gflops"] = rec["flops"] / (o * 1e3)
                    if spec["threads"] in peaks:
                        rec["peak_gflops"] = peaks[spec["threads"]]
                        rec["peak_fraction"] = rec["gflops"] / peaks[spec["threads"]]
            results.append(rec)
    finally:
        progress.close()
        for s in sides:
            if hasattr(s, "close"):
                s.close()

    table = format_table(results, columns)
    load1 = _loadavg()
    if load1 is not None:
        table += f"\nload average at the end: {load1:.2f} (1-minute; this run's own work included)"
    print(table, file=out)
    summary = targets(results, columns)
    if summary:
        print(summary, file=out)
    doc = {"gqa_version": gqa.__version__, "argv": list(argv) if argv is not None else sys.argv[1:],
           "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
                       "kernel_path": cfg["active_kernel"], "python": platform.python_version(),
                       "numpy": np.__version__},
           "settings": {"rounds_decode": rounds_dec, "rounds_prefill": rounds_pre, "threads": threads,
                        "gap_ms": args.gap_ms, "load_average_start": load0, "load_average_end": load1,
                        "peak_gflops": {str(k): v for k, v in peaks.items()}},
           "ratio": "peer median / gqa median (> 1: gqa is faster)",
           "peers": status, "columns": columns, "results": results, "table": table, "targets": summary}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}", file=out)
    if args.png:
        msg = plot(results, columns, args.png)
        print(msg, file=out)
    return doc


# ----------------------------------------------------------------------------------------
# output

def _loadavg():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def fmt_time(us):
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f}us"
    if us < 1e6:
        return f"{us / 1e3:.2f}ms"
    return f"{us / 1e6:.2f}s"


def _cell(r):
    if r.get("missing"):
        return "missing"
    if r.get("na"):
        return "n/a"
    if "error" in r:
        return "error"
    return f"{fmt_time(r['median_us'])} {r['ratio']:5.2f}x" if "ratio" in r else fmt_time(r["median_us"])


def _shape_of(r):
    return f"{r['B']}/{r['N']}/{r['Nkv']}/{r['H']}"


def back_to_back(results, r):
    """The decode row (same threads, shape, mode, T) of a layer row: the call back to back."""
    for d in results:
        if d["phase"] == "decode" and all(d[k] == r[k] for k in ("threads", "B", "N", "Nkv", "H",
                                                                  "mode", "T")):
            return d["gqa"].get("median_us")
    return None


TITLES = {
    "decode": "decode: S=1 at total length T, cache updated in place; GB/s = cache bytes read / time",
    "prefill": "prefill: S=T, causal, cache written in place; GFLOP/s = 2*B*N*S^2*H / time",
    "layers": "decode in a loop over {L} layers (own cache each, a NumPy {P}x{P} projection before every "
              "call): attention time per layer; b2b = the decode row's time (the same call back to back)",
}


def format_table(results, columns):
    from ._bench_layers import PROJ
    lines = []
    errors = []
    shapes = len({_shape_of(r) for r in results}) > 1
    for phase in ("decode", "prefill", "layers"):
        rows = [r for r in results if r["phase"] == phase]
        if not rows:
            continue
        pre, lay = phase == "prefill", phase == "layers"
        lines.append("")
        lines.append(TITLES[phase].format(L=rows[0].get("layers"), P=PROJ))
        lines.append("median time per call; gqa-fn: the function, ratio fn/op; each peer: time and ratio "
                     "peer/gqa (>1: gqa is faster)")
        head = (["thr", "mode", "S" if pre else "T"] + (["shape"] if shapes else []) + ["gqa", "gqa-fn"]
                + (["GFLOP/s", "%peak"] if pre else ["GB/s"]) + (["b2b", "loop/b2b"] if lay else [])
                + columns)
        body = []
        for r in rows:
            g = r["gqa"]
            cells = [str(r["threads"]), r["mode"], str(r["T"])] + ([_shape_of(r)] if shapes else [])
            cells.append(fmt_time(g.get("median_us")) if "median_us" in g else "error")
            cells.append(_cell(r.get("gqa_fn", {"na": True})))
            label = f"{r['mode']} {phase} {r['T']} {_shape_of(r)} {r['threads']}t"
            for who, x in [("gqa", g), ("gqa-fn", r.get("gqa_fn", {}))] + [(c, r["peers"][c]) for c in columns]:
                if "error" in x:
                    errors.append(f"{who} {label}: {x['error']}")
            if pre:
                cells.append(f"{r['gflops']:.1f}" if "gflops" in r else "-")
                cells.append(f"{100 * r['peak_fraction']:.0f}%" if "peak_fraction" in r else "-")
            else:
                cells.append(f"{r['gbps']:.1f}" if "gbps" in r else "-")
            if lay:
                b2b = back_to_back(results, r)
                cells.append(fmt_time(b2b))
                cells.append(f"{g['median_us'] / b2b:.2f}x" if b2b and "median_us" in g else "-")
            for c in columns:
                cells.append(_cell(r["peers"][c]))
            body.append(cells)
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        fmt = lambda cells: "  ".join(  # noqa: E731
            c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        lines.append(fmt(head))
        lines.append("  ".join("-" * w for w in widths))
        lines += [fmt(cells) for cells in body]
    if errors:
        lines.append("")
        lines.append("errors:")
        lines += [f"  {e}" for e in errors[:20]]
    return "\n".join(lines)


def targets(results, columns):
    """The issue's targets, checked on the largest thread count measured."""
    if not results:
        return ""
    nt = max(r["threads"] for r in results)
    rs = [r for r in results if r["threads"] == nt and "median_us" in r["gqa"]]
    have = lambda r, c: c in r["peers"] and "ratio" in r["peers"][c]  # noqa: E731
    lines = [f"targets ({nt} thread{'s' if nt != 1 else ''}; ratio = peer/gqa):"]
    dec = [r for r in rs if r["phase"] == "decode"]
    pre = [r for r in rs if r["phase"] == "prefill"]
    if dec and any(have(r, c) for r in dec for c in columns):
        slow = [f"{c} {r['mode']} T={r['T']} ({r['peers'][c]['ratio']:.2f}x)"
                for r in dec for c in columns if have(r, c) and r["peers"][c]["ratio"] <= 1]
        lines.append("  decode faster than every peer at every T: " +
                     ("met" if not slow else "MISSED: " + ", ".join(slow)))
    for mode, want in (("int8-pt", 3.0), ("int4-pt", 4.0)):
        rr = [r for r in dec if r["mode"] == mode and r["T"] >= 512 and have(r, "ort")]
        if rr:
            worst = min(rr, key=lambda r: r["peers"]["ort"]["ratio"])
            ok = worst["peers"]["ort"]["ratio"] >= want
            lines.append(f"  decode {mode} >= {want:g}x ort at T >= 512: "
                         f"{'met' if ok else 'MISSED'} (lowest {worst['peers']['ort']['ratio']:.2f}x at T={worst['T']})")
    rr = [r for r in dec if r["T"] == 16 and have(r, "ort")]
    if rr:
        worst = min(rr, key=lambda r: r["peers"]["ort"]["ratio"])
        ok = worst["peers"]["ort"]["ratio"] >= 3.0
        lines.append(f"  decode T=16 per call <= 1/3 of ort's run_with_iobinding: {'met' if ok else 'MISSED'} "
                     f"(lowest {worst['peers']['ort']['ratio']:.2f}x, {worst['mode']})")
    fn = [r for r in dec if "ratio" in r.get("gqa_fn", {})]
    rr = [r for r in fn if r["T"] == 16 and have(r, "ort")]
    if rr:
        worst = max(rr, key=lambda r: r["gqa_fn"]["median_us"] / r["peers"]["ort"]["median_us"])
        frac = worst["gqa_fn"]["median_us"] / worst["peers"]["ort"]["median_us"]
        lines.append(f"  the function at T=16 <= 0.4x ort's run_with_iobinding: {'met' if frac <= 0.4 else 'MISSED'} "
                     f"(highest {frac:.2f}x, {worst['mode']}, {fmt_time(worst['gqa_fn']['median_us'])})")
    rr = [r for r in fn if r["T"] >= 512]
    if rr:
        worst = max(rr, key=lambda r: r["gqa_fn"]["ratio"])
        lines.append(f"  the function within 10% of the op at T >= 512: "
                     f"{'met' if worst['gqa_fn']['ratio'] <= 1.10 else 'MISSED'} "
                     f"(highest fn/op {worst['gqa_fn']['ratio']:.2f}, {worst['mode']} T={worst['T']})")
    seed = {(r["mode"], r["T"]): r["gbps"] for r in dec
            if (r["B"], r["N"], r["Nkv"], r["H"]) == SEED_SHAPE and "gbps" in r}
    rr = [r for r in dec if (r["B"], r["N"], r["Nkv"], r["H"]) != SEED_SHAPE and "gbps" in r
          and (r["mode"], r["T"]) in seed and r["T"] >= 2048]
    if rr:
        worst = min(rr, key=lambda r: r["gbps"] / seed[(r["mode"], r["T"])])
        frac = worst["gbps"] / seed[(worst["mode"], worst["T"])]
        lines.append(f"  every shape's decode GB/s >= 80% of the seed shape's (T >= 2048): "
                     f"{'met' if frac >= 0.8 else 'MISSED'} (lowest {100 * frac:.0f}%, "
                     f"{_shape_of(worst)} {worst['mode']} T={worst['T']})")
    lay = [r for r in rs if r["phase"] == "layers" and "median_us" in r["gqa"]]
    for r in lay:
        b2b = back_to_back(results, r)
        if b2b:
            f = r["gqa"]["median_us"] / b2b
            lines.append(f"  in the {r['layers']}-layer loop, {r['mode']} T={r['T']} {_shape_of(r)}: attention "
                         f"{f:.2f}x its back-to-back time (target <= 1.15)"
                         + (f", {r['peers']['ort']['ratio']:.2f}x faster than ort in the same loop "
                            "(target >= 2.5 at int8-pt T=2048)" if have(r, "ort") else ""))
    q = [r for r in pre if r["mode"] != "float"]
    if q and any(have(r, c) for r in q for c in columns):
        slow = [f"{c} {r['mode']} S={r['T']} ({r['peers'][c]['ratio']:.2f}x)"
                for r in q for c in columns if have(r, c) and r["peers"][c]["ratio"] <= 1]
        lines.append("  prefill (quantized) faster than every peer: " +
                     ("met" if not slow else "MISSED: " + ", ".join(slow)))
    rr = [r for r in pre if have(r, "torch-f32")]
    if rr:
        worst = min(rr, key=lambda r: r["peers"]["torch-f32"]["ratio"])
        ok = worst["peers"]["torch-f32"]["ratio"] >= 1 / 1.1
        lines.append(f"  prefill within 10% of torch float32 SDPA or better: {'met' if ok else 'MISSED'} "
                     f"(lowest {worst['peers']['torch-f32']['ratio']:.2f}x, {worst['mode']} S={worst['T']})")
    return "\n".join(lines) if len(lines) > 1 else ""


def plot(results, columns, path):
    """A PNG of the ratios (matplotlib, optional)."""
    try:
        import matplotlib
        import matplotlib.ticker
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (f"--png {path}: matplotlib is not installed (pip install matplotlib, or "
                "pip install 'gqa[bench]'); no chart written")
    phases = [p for p in ("decode", "prefill") if any(r["phase"] == p for r in results)]
    threads = sorted({r["threads"] for r in results})
    fig, axes = plt.subplots(len(threads), max(1, len(phases)), squeeze=False,
                             figsize=(7 * max(1, len(phases)), 4 * len(threads)))
    for i, nt in enumerate(threads):
        for j, phase in enumerate(phases):
            ax = axes[i][j]
            rows = [r for r in results if r["phase"] == phase and r["threads"] == nt]
            labels = [f"{r['mode']}\n{r['T']}" for r in rows]
            x = np.arange(len(rows))
            w = 0.8 / max(1, len(columns))
            for k, c in enumerate(columns):
                ys = [r["peers"][c].get("ratio", np.nan) for r in rows]
                ax.bar(x + (k - (len(columns) - 1) / 2) * w, ys, w, label=c)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_yscale("log")
            fmt = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}x")
            ax.yaxis.set_major_formatter(fmt)
            ax.yaxis.set_minor_formatter(fmt)
            ax.tick_params(axis="y", which="minor", labelsize=7)
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_title(f"{phase}, {nt} thread{'s' if nt > 1 else ''}: peer time / gqa time")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def add_arguments(p):
    p.add_argument("--threads", default=None, help=f"comma list of thread counts (default {DEFAULTS['threads']})")
    p.add_argument("--decode-T", dest="decode_T", default=None,
                   help=f"decode total lengths T (default {DEFAULTS['decode_T']}; '' for none)")
    p.add_argument("--prefill-S", dest="prefill_S", default=None,
                   help=f"prefill lengths S = T (default {DEFAULTS['prefill_S']}; '' for none)")
    p.add_argument("--modes", default=None,
                   help=f"cache modes (default {DEFAULTS['modes']})")
    p.add_argument("--repeats", type=int, default=0,
                   help="alternation rounds per row = samples per side (default 15 decode / 5 prefill; "
                        "--quick: 5 / 3); a decode sample times a batch of ~10 ms of calls")
    p.add_argument("--gap-ms", type=float, default=100.0,
                   help="idle gap before each timed batch, so that the worker threads of the side "
                        "before are asleep when the next side starts: onnxruntime's pool spins "
                        "about 50 ms after its last run (measured: process CPU time keeps rising "
                        "for 40-60 ms of sleep), which took a core from the side timed next "
                        "(default 100)")
    p.add_argument("--shape", default=None,
                   help="B,N,Nkv,H, several separated by ';', or 'real' (%s; default %s)" % (
                       " ".join("/".join(map(str, x)) for x in REAL_SHAPES), ",".join(map(str, SEED_SHAPE))))
    p.add_argument("--layers", type=int, default=0, metavar="L",
                   help="also time decode inside a loop over L layers, each with its own cache, a NumPy "
                        "projection before every call (gqa, gqa-fn and ort in the same loop shape)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: threads {QUICK['threads']}, decode T {QUICK['decode_T']}, "
                        f"prefill S {QUICK['prefill_S']}, fewer rounds (explicit options still win)")
    p.add_argument("--peers", default=DEFAULT_PEERS,
                   help=f"comma list of {', '.join(PEER_NAMES)}, or none (default {DEFAULT_PEERS}; "
                        "ggml only when named)")
    p.add_argument("--ggml-peer", default=None, help=f"path of ggml_peer.py (default: ../{GGML_SCRIPT})")
    p.add_argument("--ggml-libdir", default="", help="folder with libggml-base.so / libggml-cpu.so")
    p.add_argument("--peak-gflops", default=None,
                   help="the machine's FP32 peak: one number per thread, or one per --threads entry; "
                        "adds the %%peak column for prefill")
    p.add_argument("--json", default=None, metavar="PATH", help="write all results as JSON")
    p.add_argument("--png", default=None, metavar="PATH", help="write a chart of the ratios (needs matplotlib)")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="progress bar on stderr (auto: when stderr is a terminal)")
    return p


def check_args(args, parser):
    if args.repeats < 0:
        parser.error("--repeats must be >= 0")
    if not args.gap_ms >= 0:
        parser.error("--gap-ms must be >= 0")
    if args.layers < 0:
        parser.error("--layers must be >= 0")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m gqa bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    check_args(args, p)
    run(args, argv=argv)
    return 0
