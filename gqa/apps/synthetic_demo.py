"""``python -m gqa demo --synthetic``: a decoding loop shaped like a real model, on embedded
defaults (what ``python -m gqa demo`` runs when the real model is not installed).

A stack of ``--layers`` GroupQueryAttention layers (Llama-class shape by default: N=32 query
heads, Nkv=8 KV heads, head size 128, rotary embeddings from cos/sin caches computed here) runs
a prompt of ``--prompt-tokens`` tokens in one call per layer, then ``--steps`` decode steps of one token.
The layers' attention is one ``gqa.KVCache`` (a GroupQueryAttention and a cache per layer,
preallocated for the whole sequence and updated in place).

The "model" around the attention is a fixed random network (seeded, no download): token
embeddings, and per layer an RMS norm, Q/K/V projections into the attention and an output
projection back into a residual stream, so each layer's input depends on the previous layer's
output.  The decode tokens are fixed (teacher forcing), so every run sees the same tokens.

The loop runs three times: with a float32 cache (the reference), with an INT8 cache and with an
INT4 cache (K per channel, V per tensor, as KIVI recommends; scales calibrated from the float32
run's prompt K/V by the KVCache calibration rule).
Reported: tokens/s of prefill and decode (the whole loop, and the attention calls alone), KV
cache memory against float32, and the error of the final hidden states of every token against
the float32 run (max / mean absolute error, cosine similarity).
"""
import argparse
import sys
import time

import numpy as np

from gqa import rotary_caches
from .blas import blas_threads
from .terminal import Progress, accuracy_levels, at_least, format_bytes, format_table, int_list, leveled

MODES = {"float32": "float", "int8": "int8-pc/pt", "int4": "int4-pc/pt"}  # gqa.KVCache modes
DEFAULTS = dict(layers=8, prompt=256, steps=256, heads=32, kv_heads=8, head_size=128, model_dim=256,
                vocab=1000, seed=0)


class Model:
    """Seeded random weights of the demo network."""

    def __init__(self, layers, heads, kv_heads, head_size, model_dim, vocab, seed):
        rng = np.random.default_rng(seed)
        self.L, self.N, self.Nkv, self.H, self.D = layers, heads, kv_heads, head_size, model_dim
        g = lambda *shape, std=1.0: (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))  # noqa: E731
        D, N, Nkv, H = model_dim, heads, kv_heads, head_size
        self.emb = g(vocab, D)
        self.wq, self.wk, self.wv, self.wo = [], [], [], []
        for _ in range(layers):
            self.wq.append(g(D, N * H, std=1.0 / np.sqrt(D)))
            # keys with a few large channels, as real models have (what per-channel K scales are for)
            gain = np.exp(rng.normal(0.0, 0.6, Nkv * H)).astype(np.float32)
            self.wk.append(g(D, Nkv * H, std=1.0 / np.sqrt(D)) * gain)
            self.wv.append(g(D, Nkv * H, std=1.0 / np.sqrt(D)))
            self.wo.append(g(N * H, D, std=0.5 / np.sqrt(N * H)))


def _rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))


def run_loop(model, tokens, prompt, steps, mode, calibration, threads, cos, sin, progress, level=0):
    """One pass over prompt + decode steps.  mode: "float32" | "int8" | "int4" (K per channel,
    V per tensor, scales from `calibration`), at accuracy level `level`.  -> dict(outputs
    [prompt+steps, D], cache, times)."""
    from gqa import KVCache
    L, D = model.L, model.D
    cap = prompt + steps
    cache = KVCache(num_layers=L, num_heads=model.N, kv_num_heads=model.Nkv, head_size=model.H,
                    max_length=cap, mode=MODES[mode], calibration=calibration, rotary=(cos, sin),
                    num_threads=threads, accuracy_level=level)
    outs = np.empty((cap, D), np.float32)
    attn_t = {"prefill": 0.0, "decode": 0.0}

    def forward(x, phase):
        S = x.shape[1]
        for li in range(L):
            h = _rms(x)
            q, k, v = h @ model.wq[li], h @ model.wk[li], h @ model.wv[li]
            t0 = time.perf_counter()
            a = cache.attend(li, q, k, v)
            attn_t[phase] += time.perf_counter() - t0
            x = x + a @ model.wo[li]
            if S > 1:
                progress.update(1, f"{mode} prefill")
        return x

    t0 = time.perf_counter()
    y = forward(model.emb[tokens[:prompt]][None], "prefill")
    outs[:prompt] = _rms(y[0])
    t_pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(steps):
        y = forward(model.emb[tokens[prompt + i:prompt + i + 1]][None], "decode")
        outs[prompt + i] = _rms(y[0, 0])
        progress.update(1, f"{mode} decode")
    t_dec = time.perf_counter() - t0
    return dict(outputs=outs, cache=cache, t_prefill=t_pre, t_decode=t_dec,
                attn_prefill=attn_t["prefill"], attn_decode=attn_t["decode"])


def compare(a, b):
    """Errors of a against the reference b (rows = tokens)."""
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    af, bf = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    cos = float(af @ bf / (np.linalg.norm(af) * np.linalg.norm(bf)))
    per_tok = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return dict(max_abs=float(d.max()), mean_abs=float(d.mean()), cosine=cos, min_token_cosine=float(per_tok.min()))


def run(args, out=None):
    out = out or sys.stdout
    import gqa
    for name in ("layers", "prompt_tokens", "steps", "heads", "kv_heads", "head_size", "model_dim"):
        if getattr(args, name) < 1:
            raise SystemExit(f"gqa demo: --{name.replace('_', '-')} must be >= 1")
    if args.heads % args.kv_heads:
        raise SystemExit("gqa demo: --heads must be a multiple of --kv-heads")
    if args.head_size % 16:
        raise SystemExit("gqa demo: --head-size must be a multiple of 16 (rotary)")
    threads = args.threads
    nt = gqa.get_config()["effective_num_threads"] if threads is None else threads
    model = Model(args.layers, args.heads, args.kv_heads, args.head_size, args.model_dim, DEFAULTS["vocab"],
                  args.seed)
    P, St = args.prompt_tokens, args.steps
    tokens = np.random.default_rng(args.seed + 1).integers(0, DEFAULTS["vocab"], P + St)
    cos, sin = rotary_caches(P + St, args.head_size)
    print(f"gqa demo: {args.layers} layers of GroupQueryAttention (N={args.heads}, Nkv={args.kv_heads}, "
          f"H={args.head_size}, rotary), model dim {args.model_dim}; prompt {P} tokens, then {St} decode "
          f"steps; path {gqa.active_path()}, {nt} thread{'s' if nt != 1 else ''}", file=out)
    print("  each layer: RMS norm -> Q/K/V projections -> gqa.GroupQueryAttention (KV cache in place) "
          "-> output projection + residual", file=out)
    out.flush()
    enabled = {"on": True, "off": False}.get(args.progress, sys.stderr.isatty())
    lvls = accuracy_levels(args.accuracy_levels, "demo")
    progress = Progress(3 * len(lvls) * (args.layers + St), enabled)
    runs = {}
    blas = blas_threads(1)
    try:
        blas.__enter__()
        runs["float32"] = run_loop(model, tokens, P, St, "float32", None, threads, cos, sin, progress)
        ref = runs["float32"]["cache"]
        ref.truncate(P)                  # calibrate on the prompt's rows
        calibration = ref.calibration()
        for mode in MODES:
            for level in lvls:
                if mode != "float32" or level:
                    runs[leveled(mode, level)] = run_loop(model, tokens, P, St, mode,
                                                          calibration if mode != "float32" else None,
                                                          threads, cos, sin, progress, level)
    finally:
        blas.__exit__(None, None, None)
        progress.close()

    f32_bytes = runs["float32"]["cache"].nbytes
    rows = []
    for name, r in runs.items():
        mem = r["cache"].nbytes
        acc = compare(r["outputs"], runs["float32"]["outputs"]) if name != "float32" else None
        r.update(cache_bytes=mem, accuracy=acc)
        mode, _, level = name.partition("@")
        label = {"float32": "float32", "int8": "int8 (K per-channel, V per-tensor)",
                 "int4": "int4 (K per-channel, V per-tensor)"}[mode] + (f" @ level {level}" if level else "")
        rows.append([label, format_bytes(mem), f"{100 * mem / f32_bytes:.1f}%",
                     f"{P / r['t_prefill']:.0f}", f"{P / r['attn_prefill']:.0f}",
                     f"{St / r['t_decode']:.0f}", f"{St / r['attn_decode']:.0f}",
                     "-" if acc is None else f"{acc['max_abs']:.2e}",
                     "-" if acc is None else f"{acc['mean_abs']:.2e}",
                     "-" if acc is None else f"{acc['cosine']:.6f}",
                     "-" if acc is None else f"{acc['min_token_cosine']:.6f}"])
    head = ["KV cache", "memory", "vs f32", "prefill tok/s", "(attn only)", "decode tok/s", "(attn only)",
            "max|err|", "mean|err|", "cosine", "min token cos"]
    print("", file=out)
    print(format_table(head, rows), file=out)
    print("", file=out)
    print(f"NumPy's BLAS during the loop: {blas.how}.", file=out)
    print("tok/s: the whole loop (projections in NumPy included); (attn only): time inside the "
          f"{args.layers} GroupQueryAttention calls per token.", file=out)
    print("Errors: final hidden states of all prompt and decode tokens against the float32-cache run "
          "at level 0 (cosine over all of them; min token cos: the worst single token).", file=out)
    if len(lvls) > 1:
        print(f"@ level L: KVCache(accuracy_level=L); here {units_line()}", file=out)
    return 0


def units_line():
    """Where levels 3-4 run with the active settings (gqa.get_config), as one sentence."""
    import gqa
    cfg = gqa.get_config()
    return (f"level 4's integer dots run on {cfg['int8_dot_unit'] or 'none (float32)'} (per-group codes: "
            f"{cfg['group_dot_unit'] or 'float32'}), levels 3-4's prompt tiles on "
            f"{cfg['tiles_effective'] or 'none (float32)'}.")


def add_arguments(p):
    d = DEFAULTS
    p.add_argument("--layers", type=at_least(1), default=d["layers"], help=f"attention layers (default {d['layers']})")
    p.add_argument("--prompt-tokens", dest="prompt_tokens", type=at_least(1), default=d["prompt"],
                   help=f"prompt tokens (default {d['prompt']})")
    p.add_argument("--steps", type=at_least(0), default=d["steps"], help=f"decode steps (default {d['steps']})")
    p.add_argument("--heads", type=at_least(1), default=d["heads"], help=f"query heads N (default {d['heads']})")
    p.add_argument("--kv-heads", type=at_least(1), default=d["kv_heads"], help=f"KV heads Nkv (default {d['kv_heads']})")
    p.add_argument("--head-size", type=at_least(1), default=d["head_size"], help=f"head size H (default {d['head_size']})")
    p.add_argument("--model-dim", type=at_least(1), default=d["model_dim"],
                   help=f"width of the residual stream between layers (default {d['model_dim']})")
    p.add_argument("--threads", type=at_least(1), default=None, help="threads of the attention calls (default: gqa's)")
    p.add_argument("--seed", type=int, default=d["seed"], help="seed of the random model and tokens")
    p.add_argument("--accuracy-levels", type=int_list, default=[0],
                   help="accuracy levels (0-4, onnxruntime's convention) each cache also runs at, "
                        "beside level 0, e.g. 0,4 (default: 0 only)")
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="progress bar on stderr (auto: when stderr is a terminal)")
    return p


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m gqa demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
