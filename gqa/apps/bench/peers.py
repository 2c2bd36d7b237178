"""The peers of ``python -m gqa bench`` (onnxruntime in process and in a subprocess with its
naive path, PyTorch SDPA, llama.cpp's ggml): each a side with setup / call / teardown over the
same inputs as gqa (the command's docstring says what each one times)."""
import json
import os
import subprocess
import sys
import numpy as np

import gqa
from .cases import PEER_MODES, build_inputs
from .timing import time_batch


PEER_NAMES = ("ort", "ort-naive", "torch", "ggml")


DEFAULT_PEERS = "ort,ort-naive,torch"


# columns of the table, in order, for each peer the user names
PEER_COLUMNS = {"ort": ["ort"], "ort-naive": ["ort-naive"], "torch": ["torch-f32", "torch-bf16", "torch-dq"],
                "ggml": ["ggml"]}


GGML_TYPES = {"int8-pt": "q8_0", "int8-pc": "q8_0", "int4-pt": "q4_0", "float": "f16"}


GGML_SCRIPT = os.path.join("shared", "tools", "peers", "ggml_peer.py")


def ort_side(spec):
    if spec["mode"] not in PEER_MODES:
        return None              # onnxruntime 1.31.1 has no per-group or mixed caches
    from .. import ort_peer as _ort_peer
    inp, attrs = build_inputs(spec)
    kc, vc = inp.pop("past_key"), inp.pop("past_value")
    run = _ort_peer.OrtInPlace(inp, attrs, kc, vc, threads=spec["threads"])
    out = np.empty(inp["query"].shape, np.float32)
    return run.bound(inp, out)


def _torch_setup(spec, dequant, dtype=None):
    """SDPA over the cache's values: float32 (dtype None) or `dtype` (bfloat16: the new rows and
    the query cast per call, oneDNN / AMX where the CPU has them), or (dequant) over gqa's codes
    dequantized into float32 buffers on every call."""
    if spec["mode"] not in PEER_MODES:
        return None
    import torch
    torch.set_num_threads(spec["threads"])
    F = torch.nn.functional
    inp, _ = build_inputs(spec)
    B, N, Nkv, H, S, T = (spec[k] for k in ("B", "N", "Nkv", "H", "S", "T"))
    bits = gqa.CacheFormat.parse(spec["mode"]).bits
    # [B, S, heads*H] -> [B, heads, S, H] views, as a model hands them to SDPA
    q = torch.from_numpy(inp["query"]).view(B, S, N, H).transpose(1, 2)
    k = torch.from_numpy(inp["key"]).view(B, S, Nkv, H).transpose(1, 2)
    v = torch.from_numpy(inp["value"]).view(B, S, Nkv, H).transpose(1, 2)
    causal = spec["phase"] == "prefill"
    rows = slice(T - S, T)
    # a step of S tokens after T - S: row s sees keys [0, T - S + s] (SDPA's is_causal is
    # aligned to the top left, so the mask is explicit)
    mask = None
    if spec["phase"] == "step" and S > 1:
        mask = torch.arange(T).view(1, T) <= torch.arange(T - S, T).view(S, 1)
    # the query in the cache's dtype (a bfloat16 cast per call)
    sdpa = lambda kk, vv: F.scaled_dot_product_attention(q if dtype is None else q.to(dtype), kk, vv,  # noqa: E731
                                                         attn_mask=mask, is_causal=causal, enable_gqa=True)
    if not dequant:
        if bits:  # a float32 cache holding the same values
            kc = torch.from_numpy(_dequant_cache(gqa.dequantize, inp["past_key"], inp["k_scale"], bits, H))
            vc = torch.from_numpy(_dequant_cache(gqa.dequantize, inp["past_value"], inp["v_scale"], bits, H))
        else:
            kc, vc = torch.from_numpy(inp["past_key"]), torch.from_numpy(inp["past_value"])

        if dtype is not None:     # a bfloat16 cache of the same values (new rows cast as copied)
            kc, vc = kc.to(dtype), vc.to(dtype)

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


class Local:
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
        code = ("import sys; sys.path.insert(0, %r); from gqa.apps.bench.peers import _serve; _serve()" % pkg_parent)
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
    from .. import ort_peer as _ort_peer
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
                fn = ort_side(msg["spec"])
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
        if spec["mode"] not in GGML_TYPES or spec["phase"] == "step":
            return None          # ggml_peer.py masks prompts only (S = T), or nothing
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
            from .. import ort_peer as _ort_peer
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
                sides.append(Local("ort", ort_side))
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
                status["torch-f32"] = status["torch-bf16"] = status["torch-dq"] = msg
                continue
            sides.append(Local("torch-f32", lambda s: _torch_setup(s, False)))
            sides.append(Local("torch-bf16", lambda s: _torch_setup(s, False, torch.bfloat16)))
            sides.append(Local("torch-dq", lambda s: _torch_setup(s, True)))
            status["torch-f32"] = f"ok: torch {torch.__version__}, SDPA on a float32 cache"
            status["torch-bf16"] = (f"ok: torch {torch.__version__}, SDPA on a bfloat16 cache, the "
                                    "query and new rows cast per call")
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
            side = Local("ggml", gg.prepare)
            side.teardown = lambda gg=gg, side=side: (gg.teardown(), setattr(side, "fn", None))
            sides.append(side)
            status["ggml"] = f"ok: ggml from {gg.libdir} via {script}; KV types q8_0 / q4_0 / f16"
    return sides, status
