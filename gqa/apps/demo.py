"""``python -m gqa demo``: a real language model answers a chat prompt through gqa.

SmolLM2-135M-Instruct (30 layers, 9 query heads, 3 KV heads, head size 64), read from its GGUF
file and run by gqa's NumPy forward (gqa/apps/llama.py) with one ``gqa.GroupQueryAttention`` per
layer and the caches of a ``gqa.KVCache`` updated in place.  The prompt (built in, or
``--prompt``) is rendered with the model's own chat template and answered greedily three
times and more: with a float32 cache, an INT8 and an INT4 cache (``--modes``; by default K per
channel and V per tensor, scales calibrated on the first 512 tokens of a documentation text,
gqa/apps/texts.py), and per-group INT4 and INT2 caches with float windows (4 + 64 positions) and
Hadamard rotations, and INT4 K with INT2 V (configuration names of gqa/_kvcache.py
``cache_options``).  Each answer is streamed as it is generated, the prefill shown as a progress
bar; then a table: prefill and decode tokens/s, the attention's share of decode time, KV cache
bytes per position and allocated, and whether the answer equals the float cache's.

Needs the demo extra (``pip install "gqa[demo]"``); without it the demo says how to get it and
runs the synthetic decoding loop (``--synthetic``: gqa/apps/synthetic_demo.py) instead.
"""
import os
import sys


from . import synthetic_demo as _synthetic_demo
from .terminal import Progress, accuracy_levels, at_least, format_bytes, format_table, leveled

PROMPT = "What is the capital of France, and what is the city known for?"
MODES = ("float", "int8-pc/pt", "int4-pc/pt", "int4-g32+s4r64+had", "int2-g32+s4r64+had+rho0.9",
         "int4-g32/int2-g32+s4r64+had+rho1/0.9")
CALIBRATION_TOKENS = 512


class _Stream:
    """Prints the text of a growing token sequence as it grows."""

    def __init__(self, model, out):
        self.model, self.out, self.ids, self.shown = model, out, [], ""

    def __call__(self, tok):
        self.ids.append(tok)
        text = self.model.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            self.out.write(text[len(self.shown):])
            self.out.flush()
            self.shown = text


def run_model(args, out):
    import gqa
    from .llama import Llama
    from . import texts as _texts
    from gqa import cache_options, needs_scales
    modes = args.modes.split(",")
    for m in modes:
        try:
            cache_options(m)
        except ValueError as e:
            raise SystemExit(f"gqa demo: {e}")
    if "float" not in modes:
        modes = ["float"] + modes
    levels = accuracy_levels(args.accuracy_levels, "demo")
    model = Llama.load()
    nt = args.threads or gqa.get_config()["effective_num_threads"]
    print(f"gqa demo: {model.name} ({model.num_layers} layers, N={model.num_heads}, "
          f"Nkv={model.kv_num_heads}, H={model.head_size}), NumPy forward with gqa's attention; path "
          f"{gqa.active_path()}, {nt} thread{'s' if nt != 1 else ''}", file=out)
    cal_ids = model.encode(_texts.calibration_text())[:CALIBRATION_TOKENS]
    calibration = model.calibration(cal_ids)
    print(f"scales of the quantized caches: calibrated on {len(cal_ids)} tokens of "
          f"{_texts.describe(_texts.CALIBRATION_TOPIC)} (absolute maximum per channel / per tensor, K's "
          "rotary pairs by their norm)",
          file=out)
    prompt = model.chat_prompt(args.prompt)
    print(f"\nprompt ({len(prompt)} tokens with the chat template): {args.prompt}", file=out)
    enabled = {"on": True, "off": False}.get(args.progress, sys.stderr.isatty())
    cap = len(prompt) + args.max_new_tokens
    results = {}
    rotations = None
    for mode in modes:
        kw = cache_options(mode)
        if needs_scales(mode):
            kw["calibration"] = calibration
        if kw.get("rotations") == "calibrated":
            rotations = rotations or model.calibrate_rotations(cal_ids)
            kw["rotations"] = rotations
        for level in levels:
            name = leveled(mode, level)
            cache = model.new_cache(cap, num_threads=args.threads, accuracy_level=level, **kw)
            bar = Progress(model.num_layers, enabled)
            print(f"\n[{name}] ", end="", file=out)
            out.flush()
            r = model.generate(prompt, cache, args.max_new_tokens, on_token=_Stream(model, out),
                               on_layer=lambda i, name=name: bar.update(1, f"{name} prefill"))
            bar.close()
            print("", file=out)
            r.update(cache_bytes=cache.nbytes, per_position=cache.bytes_per_position)
            results[name] = r
    ref = results["float"]["ids"]
    rows = []
    for name, r in results.items():
        same = r["ids"] == ref
        if not same:
            first = next((i for i, (a, b) in enumerate(zip(r["ids"], ref)) if a != b), min(len(ref), len(r["ids"])))
            verdict = f"no (from token {first})"
        rows.append([name, f"{len(prompt) / r['prefill_s']:.0f}",
                     f"{r['decode_steps'] / r['decode_s']:.1f}" if r["decode_steps"] else "-",
                     f"{100 * r['decode_attention_s'] / r['decode_s']:.1f}%" if r["decode_steps"] else "-",
                     format_bytes(r["per_position"]), format_bytes(r["cache_bytes"]),
                     "reference" if name == "float" else ("yes" if same else verdict)])
    head = ["KV cache", "prefill tok/s", "decode tok/s", "attention share", "KV bytes/position",
            f"KV allocated ({cap} pos.)", "answer = float"]
    print("\n" + format_table(head, rows), file=out)
    print("\ntok/s: the whole model (NumPy projections and MLP included); attention share: time inside "
          "the 30 attention calls of a decode step.", file=out)
    if len(levels) > 1:
        print(f"MODE@L: the cache at accuracy level L (KVCache(accuracy_level=L)); the reference is "
              f"the float cache at level 0. Here {_synthetic_demo.units_line()}", file=out)
    if any(r["ids"] != ref for r in results.values()):
        print("answer = float: greedy decoding picks the most likely token, so one token that a "
              "cache's rounding changes sends the rest of the answer elsewhere -- a small model "
              "may then repeat itself. Static scales (int8/int4-pc/pt) are calibrated on another "
              "text and round every channel alike; per-group caches (g32) fit each group of 32 "
              "channels, and float windows (+s4r64) keep the first and last positions exact. "
              "`python -m gqa eval` measures what each cache costs (perplexity, top-1 agreement).",
              file=out)
    return 0


def add_arguments(p):
    p.add_argument("--prompt", default=PROMPT, help=f"the user's message (default: {PROMPT!r})")
    p.add_argument("--max-new-tokens", type=at_least(1), default=64, help="answer length limit (default 64)")
    p.add_argument("--modes", default=",".join(MODES[1:]),
                   help="quantized caches beside float (default: int8-pc/pt, int4-pc/pt -- K per channel, "
                        "V per tensor -- and per group int4-g32 and int2-g32 with float windows and "
                        "Hadamard rotations)")
    p.add_argument("--synthetic", action="store_true",
                   help="run the synthetic decoding loop (no model needed) with the options below")
    _synthetic_demo.add_arguments(p)
    return p


def run(args, out=None):
    out = out or sys.stdout
    from . import gguf as _gguf
    if not args.synthetic:
        why = _gguf.unavailable_reason()
        if why is None:
            return run_model(args, out)
        if os.environ.get("GQA_GGUF"):      # the user named a model: no silent substitute
            print(f"gqa demo: {why}", file=sys.stderr)
            return 2
        print(f"gqa demo: the real model (SmolLM2-135M-Instruct) is not available here ({why}).\n"
              f"  To run it: {_gguf.INSTALL_HINT}\n  Running the synthetic decoding loop instead.\n",
              file=out)
    return _synthetic_demo.run(args, out)
