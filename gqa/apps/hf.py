"""python -m gqa hf: SmolLM2 through Hugging Face transformers, DynamicCache + sdpa beside
gqa's caches (gqa.transformers.Cache), in one run.

Per cache: perplexity of the evaluation text with a prompt of --prompt tokens attended in one
step and then --decode tokens fed one per step (over all tokens and over the decode tokens),
top-1 agreement with DynamicCache over the decode tokens; then, per --lengths T, the prompt
time of T tokens and the median ms per decoded token over --steps steps after it, and the
cache's bytes at T; then the peak RSS of a --rss-length prompt and its decode steps, each cache in
a process of its own (the peak counted from the loaded model's RSS: Linux's VmHWM reset through
/proc/self/clear_refs).  transformers' QuantizedCache (quanto / HQQ) runs where its backend is
installed.  Needs the demo and transformers extras.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np

from . import gguf, texts
from .terminal import accuracy_levels, at_least, format_bytes, format_table, int_list, leveled

DEFAULT_MODES = ("float", "int8-pc", "int4-g32-fp16+s4r64+had", "int2-g32+s4r128+had+rho0.9")


def add_arguments(p):
    p.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), help="gqa cache modes")
    p.add_argument("--accuracy-levels", type=int_list, default=[0],
                   help="accuracy levels (0-4) each gqa cache also runs at, as 'gqa MODE@L' beside "
                        "level 0, e.g. 0,4 (default: 0 only)")
    p.add_argument("--prompt", type=at_least(1), default=1024, help="perplexity: prompt tokens")
    p.add_argument("--decode", type=at_least(0), default=128, help="perplexity: decode tokens after it")
    p.add_argument("--lengths", type=at_least(1), nargs="*", default=[1024, 4096, 8192],
                   help="speed: prompt lengths T")
    p.add_argument("--steps", type=at_least(1), default=16, help="speed: decode steps timed per T")
    p.add_argument("--threads", type=at_least(1), default=2, help="torch's threads (gqa: its default)")
    p.add_argument("--rss-length", type=at_least(0), default=8192,
                   help="peak RSS: prompt length, one process per cache (0: not measured)")
    p.add_argument("--rss-child", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the figures to this file")


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def peak_rss(model, ids, make, attention, steps):
    """(peak RSS, RSS before) in bytes of a prompt of ids and `steps` decode steps: VmHWM reset
    to the current RSS first (Linux's /proc/self/clear_refs "5")."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    speed(model, ids, make, attention, steps)
    return 1024 * _status_kib("VmHWM"), 1024 * before


def _rss_in_child(args, name):
    """peak_rss of cache `name` in a new process (python -m gqa hf --rss-child name)."""
    cmd = [sys.executable, "-m", "gqa", "hf", "--rss-child", name, "--rss-length", str(args.rss_length),
           "--steps", str(args.steps), "--threads", str(args.threads),
           "--accuracy-levels", ",".join(map(str, args.accuracy_levels)), "--modes", *args.modes]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def load_model():
    """(model, tokenizer): SmolLM2 read by transformers from its GGUF file, the tokenizer from
    the same file (gqa.apps.gguf)."""
    import torch
    from transformers import AutoModelForCausalLM
    import transformers
    transformers.logging.set_verbosity_error()
    path = gguf.model_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    import gguf as reader
    tok = gguf.tokenizer(reader.GGUFReader(path))
    return model, tok


def _caches(model, tok, modes, levels=(0,)):
    """(name, attention, make(max_length) -> cache) of every cache compared: gqa's at each
    accuracy level of `levels` (accuracy_levels'), ``gqa MODE@L``."""
    import torch
    from transformers import DynamicCache, QuantizedCache
    import gqa.transformers as gt
    out = [("DynamicCache + sdpa", "sdpa", lambda n: DynamicCache(config=model.config))]
    for backend, module in (("quanto", "optimum.quanto"), ("hqq", "hqq")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            out.append((f"QuantizedCache {backend} int4", "sdpa",
                        lambda n, b=backend: QuantizedCache(backend=b, config=model.config, nbits=4)))
    import gqa
    calibration = None
    for mode in modes:
        kw = {}
        if gqa.needs_scales(mode):      # static scales: measured on the calibration text
            if calibration is None:
                ids = torch.tensor([tok.encode(texts.calibration_text()).ids[:1024]])
                calibration = gt.calibrate(model, ids)
            kw["calibration"] = calibration
        for level in levels:
            out.append((f"gqa {leveled(mode, level)}", "gqa",
                        lambda n, m=mode, kw=kw, level=level: gt.Cache(model, m, max_length=n, set_attention=False,
                                                                       accuracy_level=level, **kw)))
    return out


def _held_bytes(x):
    """Bytes of the tensors held in x: a tensor (a subclass, quanto's, by its inner tensors), or
    a tuple / list / dict of them (HQQ's codes and metadata)."""
    import torch
    if isinstance(x, torch.Tensor):
        if type(x) is not torch.Tensor and hasattr(x, "__tensor_flatten__"):
            return sum(_held_bytes(getattr(x, name)) for name in x.__tensor_flatten__()[0])
        return x.numel() * x.element_size()
    if isinstance(x, (tuple, list)):
        return sum(_held_bytes(v) for v in x)
    if isinstance(x, dict):
        return sum(_held_bytes(v) for v in x.values())
    return 0


def _cache_bytes(cache):
    if hasattr(cache, "nbytes"):
        return cache.nbytes
    return sum(_held_bytes(getattr(layer, name, None)) for layer in cache.layers
               for name in ("keys", "values", "_quantized_keys", "_quantized_values"))


def perplexity(model, ids, make, attention, prompt):
    """(nll of every token after the first, per token) with a prompt step, then one token per step."""
    import torch
    model.set_attn_implementation(attention)
    cache = make(ids.shape[1])
    with torch.no_grad():
        logits = [model(ids[:, :prompt], cache=cache, use_cache=True).logits[0]]
        for t in range(prompt, ids.shape[1]):
            logits.append(model(ids[:, t:t + 1], cache=cache, use_cache=True).logits[0])
    lg = torch.cat(logits)[:-1].double()
    nll = torch.nn.functional.cross_entropy(lg, ids[0, 1:], reduction="none").numpy()
    return nll, lg.argmax(-1).numpy()


def speed(model, ids, make, attention, steps):
    """(prompt seconds, median ms per decode step, cache bytes) after a prompt of ids (the last
    row's logits only, as generate() asks for)."""
    import torch
    model.set_attn_implementation(attention)
    cache = make(ids.shape[1] + steps + 1)
    with torch.no_grad():
        t0 = time.perf_counter()
        r = model(ids, cache=cache, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        nxt, times = r.logits[:, -1:].argmax(-1), []
        for _ in range(steps):
            t0 = time.perf_counter()
            r = model(nxt, cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            nxt = r.logits[:, -1:].argmax(-1)
    return prefill, 1e3 * float(np.median(times)), _cache_bytes(cache)


def run(args):
    if not gguf.available():
        print(gguf.unavailable_reason())
        return 1
    missing = [m for m in ("torch", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"python -m gqa hf needs {', '.join(missing)}: pip install torch==2.13.0 && "
              "pip install 'gqa[transformers]'")
        return 1
    import torch
    torch.set_num_threads(args.threads)
    model, tok = load_model()
    all_ids = tok.encode(texts.evaluation_text()).ids
    if args.rss_child:
        caches = {name: (att, make)
                  for name, att, make in _caches(model, tok, args.modes, accuracy_levels(args.accuracy_levels, "hf"))}
        att, make = caches[args.rss_child]
        ids = torch.tensor([all_ids[:args.rss_length]])
        peak, before = peak_rss(model, ids, make, att, args.steps)
        print(json.dumps(dict(peak_rss=peak, rss_before=before)))
        return 0
    need = max([args.prompt + args.decode, args.rss_length] + list(args.lengths)) + args.steps + 1
    ids = torch.tensor([all_ids[:need]])
    caches = _caches(model, tok, args.modes, accuracy_levels(args.accuracy_levels, "hf"))
    print(f"SmolLM2 through transformers, torch {torch.__version__}, {args.threads} threads; "
          f"text: {texts.describe('evaluation')}")
    results = {name: {} for name, _, _ in caches}
    ref_top = None
    rows = []
    pid = ids[:, :args.prompt + args.decode]
    for name, attention, make in caches:
        nll, top = perplexity(model, pid, make, attention, args.prompt)
        dec = slice(args.prompt - 1, None)
        if ref_top is None:
            ref_top = top
        agree = float((top[dec] == ref_top[dec]).mean())
        results[name].update(ppl_all=float(np.exp(nll.mean())), ppl_decode=float(np.exp(nll[dec].mean())),
                             top1_decode=agree)
        rows.append([name, f"{np.exp(nll.mean()):.3f}", f"{np.exp(nll[dec].mean()):.3f}", f"{100 * agree:.1f} %"])
    print(f"\nperplexity: a {args.prompt}-token prompt in one step, then {args.decode} tokens one per step")
    print(format_table(["cache", "ppl (all)", "ppl (decode)", "top-1 = DynamicCache"], rows, left=0))
    rows = []
    for name, attention, make in caches:        # warm-up: each path's first calls
        speed(model, ids[:, :64], make, attention, 2)
    for T in args.lengths:
        for name, attention, make in caches:
            pre, ms, nbytes = speed(model, ids[:, :T], make, attention, args.steps)
            results[name][f"T{T}"] = dict(prefill_s=pre, decode_ms=ms, cache_bytes=nbytes)
            rows.append([str(T), name, f"{pre:.2f} s", f"{ms:.2f}", format_bytes(nbytes)])
            print("  measured:", " ".join(rows[-1]), file=sys.stderr, flush=True)   # progress
    if rows:
        print(f"\nspeed: prompt of T tokens, then the median of {args.steps} decode steps")
        print(format_table(["T", "cache", "prompt", "ms/token", "cache bytes"], rows, left=2))
    if args.rss_length > 0:
        rows = []
        for name, _, _ in caches:
            r = _rss_in_child(args, name)
            results[name][f"rss_T{args.rss_length}"] = r
            rows.append([name, format_bytes(r["peak_rss"]), format_bytes(r["peak_rss"] - r["rss_before"])])
            print("  measured:", " ".join(rows[-1]), file=sys.stderr, flush=True)   # progress
        print(f"\npeak RSS: a {args.rss_length}-token prompt and {args.steps} decode steps, "
              "one process per cache")
        print(format_table(["cache", "peak RSS", "above the loaded model"], rows, left=0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
    return 0
