"""Argument types for the command line: each refuses a bad value with a one-line reason."""

from __future__ import annotations

import argparse
import re

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
