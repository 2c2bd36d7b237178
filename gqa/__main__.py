"""python -m gqa [config | bench | demo]

Without a subcommand: print the configuration, then run the decoding-loop demo.
"""
import argparse
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    from . import _bench, _demo
    p = argparse.ArgumentParser(
        prog="python -m gqa",
        description="gqa: Group Query Attention over an INT8/INT4 quantized KV cache, on CPU. "
                    "Without a subcommand: print the configuration, then run the demo.")
    sub = p.add_subparsers(dest="command", metavar="{config,bench,demo}")
    sub.add_parser("config", help="print version, compiled/available kernel paths, CPU features, threads")
    b = sub.add_parser("bench", help="time gqa against onnxruntime, PyTorch, llama.cpp (same run, alternating)",
                       description=_bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _bench.add_arguments(b)
    d = sub.add_parser("demo", help="a decoding loop shaped like a real model (INT8/INT4 vs float32 cache)",
                       description=_demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _demo.add_arguments(d)
    args = p.parse_args(argv)

    from . import show_config
    if args.command == "config":
        show_config()
        return 0
    if args.command == "bench":
        _bench.check_args(args, b)
        _bench.run(args, argv=argv)
        return 0
    if args.command == "demo":
        return _demo.run(args)
    show_config()
    print()
    return _demo.run(d.parse_args([]))


if __name__ == "__main__":
    sys.exit(main())
