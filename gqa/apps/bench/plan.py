"""The plan of ``python -m gqa bench``: which rows (shapes, modes, lengths, threads) and which
peers the command line asks for."""
import os

import gqa
from .cases import LEGACY_NAMES, REAL_SHAPES, SEED_SHAPE
from .peers import PEER_NAMES


DEFAULTS = dict(threads="1,2", decode_T="16,512,2048,8192", prefill_S="512,1024,2048",
                modes="int8-pt,int4-pt,int8-pc,float")


QUICK = dict(threads=str(min(2, os.cpu_count() or 1)), decode_T="16,512", prefill_S="512",
             modes="int8-pt,int4-pt,int8-pc,float")


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
        m = LEGACY_NAMES.get(m, m)
        try:
            opts = gqa.cache_options(m)
        except ValueError:
            raise SystemExit(f"gqa bench: unknown mode {m!r}; valid: float, int8-pt, int8-pc, "
                             "int4-pt, int4-pc, per group int8/int4/int2-g<group>[-fp16], or K's "
                             "mode / V's mode (int4-pc/int2-g64), each with +s<sink>r<recent>, "
                             "+had and +rho<k>[/<v>] (int4-g32+s4r64+had)") from None
        if opts.get("rotations") == "calibrated":
            raise SystemExit(f"gqa bench: {m!r}: +rot rotations are calibrated on a text (python "
                             "-m gqa eval --speed-modes takes them); bench takes +had")
        out.append(m)
    return out


def peer_list(s):
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


def plan_rows(args):
    """The rows to measure, in order: threads, then decode lengths, then prefill lengths,
    each with every mode."""
    q = QUICK if args.quick else DEFAULTS
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else q[name]  # noqa: E731
    threads = _int_list(pick("threads"), "--threads")
    dec = _int_list(pick("decode_T"), "--decode-T") if pick("decode_T") != "" else []
    pre = _int_list(pick("prefill_S"), "--prefill-S") if pick("prefill_S") != "" else []
    steps = _int_list(args.step_S, "--step-S") if args.step_S else []
    modes = _modes(pick("modes"))
    rows = []
    phases = ([("decode", dec, [1]), ("step", dec, steps), ("prefill", pre, [None])]
              + ([("layers", dec, [1])] if args.layers else []))
    for nt in threads:
        for phase, lengths, sizes in phases:
            for B, N, Nkv, H in _shapes(args.shape):
                for L in lengths:
                    for S in sizes:
                        if S is not None and S > L:
                            continue
                        for mode in modes:
                            rows.append(dict(phase=phase, B=1 if phase == "step" else B, N=N, Nkv=Nkv,
                                             H=H, S=L if S is None else S, T=L, mode=mode,
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


def peak_rates(arg, threads):
    if not arg:
        return {}
    vals = [float(x) for x in str(arg).split(",") if x.strip()]
    if len(vals) == 1:  # per-thread peak, scaled by the thread count
        return {nt: vals[0] * nt for nt in threads}
    if len(vals) != len(threads):
        raise SystemExit("gqa bench: --peak-gflops takes one number (per thread) or one per --threads entry")
    return dict(zip(threads, vals))
