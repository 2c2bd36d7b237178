"""python -m gqa [config | bench | demo | eval | hf]

Without a subcommand: print the configuration, then run the demo.
"""
import argparse
import sys


class _WithDefaults(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and every option's default."""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    from .apps import bench as _bench, demo as _demo, eval as _eval, hf as _hf
    p = argparse.ArgumentParser(
        prog="python -m gqa",
        description="gqa: Group Query Attention over an INT8/INT4 quantized KV cache, on CPU. "
                    "Without a subcommand: print the configuration, then run the demo.")
    sub = p.add_subparsers(dest="command", metavar="{config,bench,demo,eval,hf}")
    sub.add_parser("config", help="print version, compiled/available kernel paths, CPU features, threads")
    b = sub.add_parser("bench", help="time gqa against onnxruntime, PyTorch, llama.cpp (same run, alternating)",
                       description=_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _bench.add_arguments(b)
    d = sub.add_parser("demo", help="a real model (SmolLM2-135M) answers through gqa with float, INT8 and INT4 caches",
                       description=_demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _demo.add_arguments(d)
    e = sub.add_parser("eval", help="perplexity per cache mode and decode speed against NumPy and onnxruntime, "
                       "in the real model's loop", description=_eval.__doc__,
                       formatter_class=_WithDefaults)
    _eval.add_arguments(e)
    h = sub.add_parser("hf", help="SmolLM2 through transformers: DynamicCache + sdpa beside gqa's caches "
                       "(perplexity, ms per token, cache bytes)", description=_hf.__doc__,
                       formatter_class=_WithDefaults)
    _hf.add_arguments(h)
    args = p.parse_args(argv)

    from . import show_config
    if args.command == "config":
        show_config()
        return 0
    if args.command == "bench":
        _bench.run(args, argv=argv)
        return 0
    if args.command == "demo":
        return _demo.run(args)
    if args.command == "eval":
        return _eval.run(args)
    if args.command == "hf":
        return _hf.run(args)
    show_config()
    print()
    return _demo.run(d.parse_args([]))


if __name__ == "__main__":
    sys.exit(main())
