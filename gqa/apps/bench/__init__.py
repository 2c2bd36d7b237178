"""``python -m gqa bench``: this package against its peers, measured in the same run.

Every row (one shape, one cache mode, one thread count) is measured for gqa and for each
peer in alternation -- gqa, peer 1, peer 2, ..., gqa, peer 1, ... -- so that drift of a
shared, noisy machine hits all alike; the table shows medians and the ratio
``peer_time / gqa_time`` (> 1: gqa is faster).  Rows where some side's samples spread
widely (upper over lower quartile above 1.25: on a shared virtual machine a core can be taken
for milliseconds, and a call then runs at about one thread's speed) are listed after the
targets as noisy; ``--json`` keeps each side's ``min_us`` and ``spread``.

Peers (each optional; a missing one is reported and skipped):

* ``ort``       onnxruntime, one-node com.microsoft.GroupQueryAttention graph; past and present
                bound to the same buffers through IOBinding (in place, like gqa), every input
                and the output bound once: only ``run_with_iobinding`` is timed.
* ``ort-naive`` the same in a subprocess with ``ORT_GQA_DISABLE_FLASH_ATTENTION=1`` (its naive
                path); the subprocess times itself on command, in the same alternation.
* ``torch``     ``torch.nn.functional.scaled_dot_product_attention``: ``torch-f32`` on a float32
                cache, ``torch-bf16`` on a bfloat16 cache (the query and the new rows cast per
                call; oneDNN, AMX where the CPU has it), and ``torch-dq`` (quantized modes): the cache kept as gqa's codes, the new
                rows quantized into it, the whole cache dequantized into preallocated float32
                buffers, then SDPA.
* ``ggml``      llama.cpp's ``ggml_flash_attn_ext`` through a ``ggml_peer.py`` script (``--ggml-peer``)
                (only when asked, and only with llama-cpp-python installed); KV types q8_0 (INT8),
                q4_0 (INT4), f16 (float).

gqa is timed in both forms a user calls: the kept operator (``gqa``, the reference of every
ratio) and ``gqa.group_query_attention`` (column ``gqa-fn``, its ratio fn/op: 1.00 = as fast).
Decode rows give the cache bytes read per second (GB/s).  ``--shape`` takes several shapes
(``;``-separated) or ``real`` (the seed shape and the heads of common models); ``--layers L``
adds decode rows inside a loop over L layers with a NumPy projection between calls (see
gqa/apps/bench/layers.py); ``--step-S`` adds steps of several new tokens at the decode lengths
(speculative decoding's verification; every peer but ggml).
"""
import argparse
import json
import os
import platform
import sys
import numpy as np
from .cases import REAL_SHAPES, SEED_SHAPE, ours, ours_at, ours_function, cache_bytes, flops
from .peers import DEFAULT_PEERS, GGML_SCRIPT, PEER_COLUMNS, PEER_NAMES, Local, ort_side, discover_peers
from .plan import DEFAULTS, QUICK, peak_rates, peer_list, plan_rows
from .report import loadavg, noisy, plot, results_table, targets
from ..terminal import Progress, at_least, real_at_least
from .timing import measure_row


def run(args, out=None, argv=None):
    import gqa
    with gqa.config(accuracy_level=args.accuracy_level):    # gqa's sides, for the run
        return _run(args, out, argv)


def _run(args, out, argv):
    out = out or sys.stdout
    import gqa
    rows, threads = plan_rows(args)
    peaks = peak_rates(args.peak_gflops, threads)
    peer_names = peer_list(args.peers)
    sides, status = discover_peers(peer_names, args)
    columns = [c for p in peer_names for c in PEER_COLUMNS[p]]
    own = [Local("gqa", ours), Local("gqa-fn", ours_function)]
    shown = list(columns)     # the table's columns: the peers', then --vs-level's gqa@L
    from .layers import LayerSide
    in_loop = [LayerSide("gqa", ours), LayerSide("gqa-fn", ours_function)]
    if args.vs_level is not None:
        name = f"gqa@{args.vs_level}"
        own.append(Local(name, ours_at(args.vs_level)))
        in_loop.append(LayerSide(name, ours_at(args.vs_level)))
        status[name] = (f"gqa's kept operator with its own accuracy_level={args.vs_level}, "
                        "in the same alternation (ratio gqa@L / gqa: > 1, the run's level is faster)")
        shown.append(name)
    if "ort" in peer_names and status.get("ort", "").startswith("ok"):
        in_loop.append(LayerSide("ort", ort_side))
    rounds_dec = args.repeats if args.repeats else (5 if args.quick else 15)
    rounds_pre = args.repeats if args.repeats else (3 if args.quick else 5)

    cfg = gqa.get_config()
    header = [f"gqa {gqa.__version__} bench: path {cfg['active_path']}, "
              f"{platform.machine()}, {os.cpu_count()} CPUs; Python {platform.python_version()}, "
              f"numpy {np.__version__}"]
    header.append(f"  accuracy level {cfg['accuracy_level']}"
                  + ("" if cfg["accuracy_level"] < 4 else
                     f" (integer dot products on INT8 / INT4 codes: {cfg['int8_dot_unit']}; per-group"
                     f" codes: {cfg['group_dot_unit'] or 'float32'})"
                     if cfg["int8_dot_effective"] else
                     " (no integer-dot kernels on this path: float32)"))
    load0 = loadavg()
    if load0 is not None:
        header.append(f"  load average at start: {load0:.2f} on {os.cpu_count()} CPUs"
                      + ("  (busy: expect noisy numbers)" if load0 > 0.5 else ""))
    for c in shown:
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
            res = measure_row(spec, in_loop if layered else own + sides, rounds, progress, label,
                              args.gap_ms / 1e3)
            rec = dict(spec, gqa=res.pop("gqa"), gqa_fn=res.pop("gqa-fn"), peers={})
            o = rec["gqa"].get("median_us")
            if o and rec["gqa_fn"].get("median_us"):
                rec["gqa_fn"]["ratio"] = rec["gqa_fn"]["median_us"] / o
            for c in shown:
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

    table = results_table(results, shown)
    load1 = loadavg()
    if load1 is not None:
        table += f"\nload average at the end: {load1:.2f} (1-minute; this run's own work included)"
    print(table, file=out)
    summary = targets(results, columns)
    if summary:
        print(summary, file=out)
    noise = noisy(results, columns)
    if noise:
        print(noise, file=out)
    doc = {"gqa_version": gqa.__version__, "argv": list(argv) if argv is not None else sys.argv[1:],
           "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
                       "kernel_path": cfg["active_path"], "python": platform.python_version(),
                       "numpy": np.__version__},
           "settings": {"rounds_decode": rounds_dec, "rounds_prefill": rounds_pre, "threads": threads,
                        "gap_ms": args.gap_ms, "load_average_start": load0, "load_average_end": load1,
                        "peak_gflops": {str(k): v for k, v in peaks.items()}},
           "ratio": "peer median / gqa median (> 1: gqa is faster)",
           "peers": status, "columns": shown, "results": results, "table": table, "targets": summary,
           "noisy": noise}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}", file=out)
    if args.png:
        msg = plot(results, columns, args.png)
        print(msg, file=out)
    return doc


def add_arguments(p):
    p.add_argument("--threads", default=None, help=f"comma list of thread counts (default {DEFAULTS['threads']})")
    p.add_argument("--decode-T", dest="decode_T", default=None,
                   help=f"decode total lengths T (default {DEFAULTS['decode_T']}; '' for none)")
    p.add_argument("--prefill-S", dest="prefill_S", default=None,
                   help=f"prefill lengths S = T (default {DEFAULTS['prefill_S']}; '' for none)")
    p.add_argument("--step-S", dest="step_S", default="",
                   help="also steps of S new tokens (comma list) at each decode T: speculative "
                        "decoding's verification, causal after T - S cached tokens, batch 1 "
                        "(onnxruntime's rule for a step of several tokens with a past); default none")
    p.add_argument("--modes", default=None,
                   help=f"cache modes (default {DEFAULTS['modes']})")
    p.add_argument("--accuracy-level", dest="accuracy_level", type=int, default=0,
                   choices=[0, 1, 2, 3, 4],
                   help="gqa's accuracy_level for the run (4: integer dot products on INT8 / INT4 codes "
                        "on AMX INT8, AVX-512 VNNI or AVX2; default 0, float32)")
    p.add_argument("--vs-level", dest="vs_level", type=int, default=None, choices=[1, 2, 3, 4],
                   help="also time gqa's kept operator with its own accuracy_level attribute L in the "
                        "same alternation (column gqa@L, ratio gqa@L / gqa): --accuracy-level 4 "
                        "--vs-level 1 gives level 4's speed-up over float32 products (1: as level 0)")
    p.add_argument("--repeats", type=at_least(0), default=0,
                   help="alternation rounds per row = samples per side (default 15 decode / 5 prefill; "
                        "--quick: 5 / 3); a decode sample times a batch of ~10 ms of calls")
    p.add_argument("--gap-ms", type=real_at_least(0), default=100.0,
                   help="idle gap before each timed batch, so that the worker threads of the side "
                        "before are asleep when the next side starts: onnxruntime's pool spins "
                        "about 50 ms after its last run (measured: process CPU time keeps rising "
                        "for 40-60 ms of sleep), which took a core from the side timed next "
                        "(default 100)")
    p.add_argument("--shape", default=None,
                   help="B,N,Nkv,H, several separated by ';', or 'real' (%s; default %s)" % (
                       " ".join("/".join(map(str, x)) for x in REAL_SHAPES), ",".join(map(str, SEED_SHAPE))))
    p.add_argument("--layers", type=at_least(0), default=0, metavar="L",
                   help="also time decode inside a loop over L layers, each with its own cache, a NumPy "
                        "projection before every call (gqa, gqa-fn, --vs-level's gqa@L and ort in the "
                        "same loop shape)")
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


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m gqa bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    run(args, argv=argv)
    return 0
