"""The reports of ``python -m gqa bench``: the tables, the targets and the chart."""
import os
import numpy as np
from .cases import SEED_SHAPE
from ..terminal import format_table, format_time


def loadavg():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _cell(r):
    if r.get("missing"):
        return "missing"
    if r.get("na"):
        return "n/a"
    if "error" in r:
        return "error"
    return f"{format_time(r['median_us'])} {r['ratio']:5.2f}x" if "ratio" in r else format_time(r["median_us"])


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
    "step": "step: S new tokens at total length T (causal after T - S), cache updated in place; "
            "GB/s = cache bytes read / time",
    "layers": "decode in a loop over {L} layers (own cache each, a NumPy {P}x{P} projection before every "
              "call): attention time per layer; b2b = the decode row's time (the same call back to back)",
}


def results_table(results, columns):
    from .layers import PROJ
    lines = []
    errors = []
    shapes = len({_shape_of(r) for r in results}) > 1
    for phase in ("decode", "step", "prefill", "layers"):
        rows = [r for r in results if r["phase"] == phase]
        if not rows:
            continue
        pre, lay, step = phase == "prefill", phase == "layers", phase == "step"
        lines.append("")
        lines.append(TITLES[phase].format(L=rows[0].get("layers"), P=PROJ))
        lines.append("median time per call; gqa-fn: the function, ratio fn/op; each peer: time and ratio "
                     "peer/gqa (>1: gqa is faster)")
        head = (["thr", "mode", "S" if pre else "T"] + (["S"] if step else []) + (["shape"] if shapes else [])
                + ["gqa", "gqa-fn"]
                + (["GFLOP/s", "%peak"] if pre else ["GB/s"]) + (["b2b", "loop/b2b"] if lay else [])
                + columns)
        body = []
        for r in rows:
            g = r["gqa"]
            cells = ([str(r["threads"]), r["mode"], str(r["T"])] + ([str(r["S"])] if step else [])
                     + ([_shape_of(r)] if shapes else []))
            cells.append(format_time(g.get("median_us")) if "median_us" in g else "error")
            cells.append(_cell(r.get("gqa_fn", {"na": True})))
            label = (f"{r['mode']} {phase} {r['T']}" + (f" S={r['S']}" if step else "")
                     + f" {_shape_of(r)} {r['threads']}t")
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
                cells.append(format_time(b2b))
                cells.append(f"{g['median_us'] / b2b:.2f}x" if b2b and "median_us" in g else "-")
            for c in columns:
                cells.append(_cell(r["peers"][c]))
            body.append(cells)
        lines.append(format_table(head, body, left=1))
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
    stp = [r for r in rs if r["phase"] == "step"]
    if dec and any(have(r, c) for r in dec for c in columns):
        slow = [f"{c} {r['mode']} T={r['T']} ({r['peers'][c]['ratio']:.2f}x)"
                for r in dec for c in columns if have(r, c) and r["peers"][c]["ratio"] <= 1]
        lines.append("  decode faster than every peer at every T: " +
                     ("met" if not slow else "MISSED: " + ", ".join(slow)))
    if stp and any(have(r, c) for r in stp for c in columns):
        slow = [f"{c} {r['mode']} T={r['T']} S={r['S']} ({r['peers'][c]['ratio']:.2f}x)"
                for r in stp for c in columns if have(r, c) and r["peers"][c]["ratio"] <= 1]
        lines.append("  steps of several tokens faster than every peer: " +
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
                     f"(highest {frac:.2f}x, {worst['mode']}, {format_time(worst['gqa_fn']['median_us'])})")
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


def noisy(results, columns):
    """The rows whose samples spread (p75 / p25) beyond NOISY_SPREAD on some side: their
    medians, and the ratios and targets read from them, carry the machine's noise (on shared
    virtual machines a core is taken for milliseconds at a time, and a call then runs at about
    one thread's speed)."""
    from .timing import NOISY_SPREAD
    rows = []
    for r in results:
        sides = [("gqa", r["gqa"]), ("gqa-fn", r.get("gqa_fn", {}))] + [(c, r["peers"].get(c, {})) for c in columns]
        wide = [f"{who} {x['spread']:.2f}x" for who, x in sides if x.get("spread", 1.0) > NOISY_SPREAD]
        if wide:
            label = f"{r['phase']} {r['mode']} {'S' if r['phase'] == 'prefill' else 'T'}={r['T']}"
            rows.append(f"{label} {_shape_of(r)} {r['threads']}t ({', '.join(wide)})")
    if not rows:
        return ""
    return (f"noisy rows (samples' p75/p25 > {NOISY_SPREAD:g}; compare within a row, rerun on a quiet "
            "machine, or read min_us in --json):\n" + "\n".join(f"  {x}" for x in rows[:20])
            + (f"\n  ... and {len(rows) - 20} more" if len(rows) > 20 else ""))


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
