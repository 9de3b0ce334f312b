"""Argument types for the command line: each refuses a bad value with a one-line reason."""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

_DEVICE = re.compile(r"host|cuda(:\d+)?")


def device_spec(text: str) -> str:
    """``host``, ``cuda`` or ``cuda:N`` (any case), normalised to lower case."""
    spec = text.strip().lower()
    if not _DEVICE.fullmatch(spec):
        raise argparse.ArgumentTypeError(f"expected host, cuda or cuda:N, got {text!r}")
    return spec


def positive_int(text: str) -> int:
    """A whole number of at least 1 (a size or a count: zero would run nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def directory(text: str) -> Path:
    """A directory to write into, named (an empty name, which Path reads as ".", names none)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty name (use . for this one)")
    return Path(text)


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` for a parser whose commands are optional subparsers (``dest="command"``,
    each with ``parser=`` set to itself): an option nobody knows is named first, by the command it
    follows (argparse would say only that the command is missing, for ``--bogus`` alone), then a
    missing command is refused as argparse refuses it."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error("the following arguments are required: COMMAND")
    return args


class UsageError(Exception):
    """A user's mistake found after the arguments were parsed: a size that cannot fit, an output
    directory that cannot be written, a launch environment that is not right. ``scopegraph.__main__``
    reports it as one line (and a ``help:`` line when ``help`` is given), with exit status 2 and
    no traceback."""

    def __init__(self, message: str, help: str = "") -> None:
        super().__init__(message)
        self.help = help

    @classmethod
    def from_error(cls, exc: BaseException) -> UsageError:
        """The first line of ``exc``'s message, and its ``help:`` line."""
        lines = str(exc).splitlines() or [type(exc).__name__]
        advice = next((line.removeprefix("help: ") for line in lines if line.startswith("help: ")), "")
        return cls(lines[0], advice)


def writable_dir(path: Path, option: str = "--out") -> Path:
    """Make the directory ``path`` (and its parents) now, and check that a file can be written in
    it: a bad ``--out`` is refused before a long run, not after it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        if isinstance(exc, FileExistsError) or (path.exists() and not path.is_dir()):
            reason = "it is a file, not a directory"
        elif isinstance(exc, NotADirectoryError):
            reason = "a part of the path is a file, not a directory"
        else:
            reason = exc.strerror or str(exc)
        raise UsageError(f"argument {option}: cannot write to {str(path)!r}: {reason}") from None
    return path


def size_text(nbytes: float) -> str:
    """``nbytes`` in binary units: 1.5 GiB, 35.5 PiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            break
        nbytes /= 1024
    return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
