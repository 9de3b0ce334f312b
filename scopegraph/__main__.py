"""The command line: ``python -m scopegraph demo`` and ``python -m scopegraph bench``."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scopegraph", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the seed's layer stack as a graph and validate it")
    demo.add_argument("--device", default=None, help='"cuda", "cuda:N" or "host" (default: cuda if present)')
    demo.add_argument("--tokens", type=int, default=None)
    demo.add_argument("--d", type=int, default=None, help="model width")
    demo.add_argument("--layers", type=int, default=None)
    bench = sub.add_parser("bench", help="run the benchmarks; writes bench.json, bench.txt and plots")
    bench.add_argument("--out", type=Path, default=Path("bench-out"))
    bench.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    bench.add_argument("--only", action="append", choices=["launch", "model", "build", "dataflow"])
    bench.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(args.device, args.tokens, args.d, args.layers)
    from .bench import run

    run(args.out, args.quick, args.only, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
