"""Progress of the command line's timed loops, readable in a terminal and in a log alike.

A loop of ``total`` calls runs in at most ``steps`` steps. In a terminal, with tqdm installed, a
tqdm bar advances once per step. Anywhere else (a pipe, a log file, CI, or no tqdm) each step
prints one plain line, ``  graph   64/512 tokens     0.021 s``: no carriage returns, no step left out,
and the last line always shows the total.

tqdm is optional on purpose: a log needs the plain lines anyway (tqdm writes carriage returns
into files), so the plain form is the one CI reads, and a bar is no reason for one more runtime
dependency (the tables need one: rich, see ``bench._table``).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

DEFAULT_STEPS = 8


def _tqdm() -> Any | None:
    """tqdm's bar class, or None when tqdm is not installed (imported untyped: it ships no stubs)."""
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


def step_sizes(total: int, steps: int) -> list[int]:
    """``total`` calls split into ``min(total, steps)`` steps whose sizes differ by at most one."""
    n = max(1, min(total, steps))
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)] if total > 0 else []


def timed_loop(
    label: str,
    total: int,
    call: Callable[[], object],
    finish: Callable[[], object],
    *,
    unit: str = "token",
    steps: int = DEFAULT_STEPS,
    out: TextIO | None = None,
) -> float:
    """Run ``call()`` ``total`` times, then ``finish()``, reporting progress; wall seconds per call.

    The clock runs from the first call to the end of ``finish()`` (the wait for the device), so
    work the device does while a step is reported is counted; at most ``steps`` reports are
    made, which costs microseconds against a loop of milliseconds.
    """
    if total < 1:
        raise ValueError(f"timed_loop needs at least one call, got {total}")
    stream = out if out is not None else sys.stdout
    bar_class = _tqdm() if stream.isatty() else None
    bar = bar_class(total=total, desc=f"  {label}", unit=unit, file=stream, leave=True) if bar_class else None
    done, width = 0, len(str(total))
    t0 = end = time.perf_counter()
    try:
        for size in step_sizes(total, steps):
            for _ in range(size):
                call()
            done += size
            if done == total:
                finish()
                end = time.perf_counter()
            if bar is not None:
                bar.update(size)
            else:
                stream.write(f"  {label:<6} {done:>{width}}/{total} {unit}s  {time.perf_counter() - t0:8.3f} s\n")
                stream.flush()
    finally:
        if bar is not None:
            bar.close()
    return (end - t0) / total
