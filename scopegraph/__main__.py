"""The command line: ``python -m scopegraph info | demo | bench`` (also installed as ``scopegraph``).

The commands live in the private package ``scopegraph._cli``; this module only parses arguments.
A user's mistake (a bad size, a model too big for the memory, an unknown or missing device, an
output directory that cannot be written, a launch environment that is not right) ends with one
line on stderr (and a ``help:`` line where the error has one) and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from pathlib import Path
from typing import NoReturn

from . import Device, ScopeGraphError, __version__, device
from ._cli.args import UsageError, parse_command_line, writable_dir

DESCRIPTION = "scopegraph: safe, cheap CUDA graphs from Python. Run a command with --help for its options."

EPILOG = """\
examples:
  python -m scopegraph info
  python -m scopegraph demo                      # 22 layers, d=2048 on a GPU; smaller on the host
  python -m scopegraph demo --device host --d 128 --layers 2 --tokens 8
  python -m scopegraph bench --quick --only record --device host
"""

INFO = """\
Print what scopegraph sees on this machine: its version and where it is installed,
Python, numpy, cuda.core and cuda.bindings, NVRTC, the CUDA driver, each GPU with its
architecture, the device sg.device() picks by default and why, and the kernel cache.
Works without a GPU or driver.
"""

DEMO = """\
Record the seed's layer stack (per layer: RMSNorm -> Q matvec -> O matvec -> residual
add) as one CUDA graph, check a replay against eager execution and a float64 numpy
reference, then time eager and graph tokens.

default size: on a GPU, the seed's model: 22 layers, d=2048, 512 tokens;
              on the host backend: 22 layers, d=256, 32 tokens (numpy stands in for the
              GPU there, so its timings mean nothing; pass --d 2048 for the full size).
"""

BENCH = """\
Run the benchmark suites side by side; write DIR/bench.json, a readable DIR/bench.txt
(also printed) and, with matplotlib, plots. On the host backend only the CPU-cost
suites (cpu, build, record) mean anything.

suites:
  launch    launch overhead of N dependent tiny kernels, eager and as graphs
  model     the seed's model in tokens per second, eager and graph (and PyTorch)
  pdl       programmatic dependent launch on and off: a chain of 88 weight-streaming
            kernels and the seed's model in each form, with identical results
  cpu       CPU cost per op: building kernel launches, memcpy and memset, recording
            (the op built inside the clock) and eager runs
  build     record and build cost of graphs of 10 to 10,000 ops
  dataflow  k independent chains replayed in dataflow order against program order
  record    record cost per op on partial writes (1k, 4k, 16k ops), and small
            writes after 2000 readers (time and edges added per write)
  decode    the decode loop: K = 1, 16, 128 tokens inside one launch (a device-side
            while loop) against K launches of the one-token graph, tokens per second
  update    20 tiny kernels whose last scalar changes every iteration (seed 004): eager,
            recapture, whole-graph update (into=), node update (sg.Param) and rebind
"""

# The suites of scopegraph._cli.bench, named here so that `--help` does not import them.
SUITES = ("launch", "model", "pdl", "cpu", "build", "dataflow", "record", "decode", "update")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (pre-wrapped), and commands listed without argparse's extra heading line."""

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return "".join(self._format_action(sub) for sub in action._get_subactions())
        return super()._format_action(action)


class Parser(argparse.ArgumentParser):
    """argparse, with errors on one line: ``prog: error: what (see prog --help)``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(prog: str) -> Parser:
    from ._cli.args import device_spec, directory, positive_int

    parser = Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument(
        "--version", action="version", version=f"scopegraph {__version__}", help="print scopegraph's version and exit"
    )
    # Not required here: parse_command_line names an unknown option before it says a command is missing.
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    device_help = (
        'where to run: "host" (numpy, no GPU needed), "cuda" or "cuda:N"; default: '
        "$SCOPEGRAPH_DEVICE if set, else cuda when a GPU is present, else host"
    )

    info = sub.add_parser(
        "info",
        help="print versions, driver, GPUs, the default device and the kernel cache",
        description=INFO,
        formatter_class=Formatter,
    )

    demo = sub.add_parser(
        "demo",
        help="run the seed's layer stack as one graph, validate it, and time it against eager",
        description=DEMO,
        formatter_class=Formatter,
    )
    demo.add_argument("--device", type=device_spec, default=None, help=device_help)
    demo.add_argument(
        "--tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens in the timed graph loop (default: 512 on a GPU, 32 on the host)",
    )
    demo.add_argument(
        "--d",
        type=positive_int,
        default=None,
        metavar="N",
        help="model width (default: 2048 on a GPU, 256 on the host)",
    )
    demo.add_argument("--layers", type=positive_int, default=None, metavar="N", help="number of layers (default: 22)")
    demo.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        metavar="N",
        help="split the model over N processes, one GPU each (tensor parallel, NCCL); "
        "run under `torchrun --nproc-per-node N`",
    )

    bench = sub.add_parser(
        "bench",
        help="run the benchmarks; writes bench.json, bench.txt and plots",
        description=BENCH,
        formatter_class=Formatter,
    )
    bench.add_argument(
        "--out",
        type=directory,
        default=Path("bench-out"),
        metavar="DIR",
        help="directory for bench.json, bench.txt and plots (default: bench-out)",
    )
    bench.add_argument("--quick", action="store_true", help="fewer sizes and repeats (for a smoke test)")
    bench.add_argument(
        "--only",
        action="append",
        choices=SUITES,
        metavar="SUITE",
        help=f"run only this suite (repeatable): {', '.join(SUITES)}; default: all",
    )
    bench.add_argument("--device", type=device_spec, default=None, help=device_help)
    bench.add_argument(
        "--gpus",
        type=positive_int,
        default=None,
        metavar="N",
        help="run only the tensor-parallel suite: the seed model over N processes, one GPU each, "
        "against 1 GPU; run under `torchrun --nproc-per-node N` (writes DIR/bench-tp.json)",
    )
    for command in (info, demo, bench):
        command.set_defaults(parser=command)  # so that a refusal after parsing names the command
    return parser


def _device(parser: Parser, spec: str | None) -> Device:
    """The requested device, or a one-line refusal (exit 2) when it cannot be had."""
    try:
        return device(spec)
    except ScopeGraphError as exc:
        reason = str(exc).splitlines()[0]
        # sg.device's own message names SCOPEGRAPH_DEVICE when the name came from it
        where = "argument --device: " if spec is not None else ""
        root = parser.prog.rsplit(" ", 1)[0]
        hint = f"; `{root} info` lists the GPUs here, or use --device host" if "cuda" in (spec or reason) else ""
        parser.error(f"{where}{reason}{hint}")


def _prog() -> str:
    name = Path(sys.argv[0]).name
    return name if name == "scopegraph" else "python -m scopegraph"


def _refuse(parser: Parser, error: UsageError) -> NoReturn:
    """A mistake found after parsing, reported as argparse reports one; with the error's own
    ``help:`` line instead of the pointer to --help when it has one."""
    if error.help:
        parser.exit(2, f"{parser.prog}: error: {error}\nhelp: {error.help}\n")
    parser.error(str(error))


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog or _prog())
    args = parse_command_line(parser, argv)
    try:
        if args.command == "info":
            from ._cli.info import main as info_main

            return info_main()
        if args.command == "demo" and args.gpus is not None:  # tensor parallel, one process per GPU
            from ._cli.tp import demo as tp_demo

            return tp_demo(args.device, args.tokens, args.d, args.layers, args.gpus)
        if args.command == "bench" and args.gpus is not None:
            from ._cli.bench._tp import main as tp_bench

            return tp_bench(writable_dir(args.out), args.device, args.quick, args.gpus)
        if args.command == "demo":
            from ._cli.demo import main as demo_main

            return demo_main(_device(args.parser, args.device), args.tokens, args.d, args.layers)
        dev = _device(args.parser, args.device)
        out = writable_dir(args.out)  # before the run, not after it
        from ._cli.bench import run

        run(out, dev, args.quick, args.only)
        return 0
    except UsageError as exc:
        _refuse(args.parser, exc)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _reader_left():
            raise
        return 128 + signal.SIGPIPE  # stop quietly, as a writer killed by SIGPIPE would


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has gone (`| head`: poll says POLLERR), not some other
    broken pipe; if so, stdout now writes nowhere, for Python flushes it again at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
