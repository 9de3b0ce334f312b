"""Timing helpers shared by the benchmark suites: medians of repeated rounds, interleaved sides, environment facts."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ... import Device


def time_calls(
    fn: Callable[[], object], sync: Callable[[], object], calls: int, rounds: int = 5, warmup: int = 2
) -> dict[str, float]:
    """Median seconds per call over ``rounds`` rounds of ``calls`` back-to-back calls.

    ``wall`` includes waiting for the device at the end of each round (the throughput a loop of
    these calls reaches); ``submit`` is the CPU time to issue the calls (before the wait).
    """
    for _ in range(warmup):
        fn()
    sync()
    walls, submits = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        walls.append((t2 - t0) / calls)
        submits.append((t1 - t0) / calls)
    return {"wall": statistics.median(walls), "submit": statistics.median(submits)}


Side = tuple[Callable[[], object], Callable[[], object], int]  # (call, sync, calls per timing)


def interleaved(
    sides: dict[str, Side], rounds: int = 5, inner: int = 3, warmup: int = 2
) -> dict[str, dict[str, float]]:
    """Every side timed the same way: ``rounds`` rounds, each side in turn within a round (so drift
    and clocks affect all alike), each round's figure the median of ``inner`` timings of
    ``calls`` back-to-back calls. Per side: ``wall`` = the best (minimum) of the round medians,
    ``median`` = their median, ``spread`` = (max - min) / median, ``submit`` = the CPU time to
    issue the calls in the best round, all in seconds per call."""
    for fn, sync, _ in sides.values():
        for _ in range(warmup):
            fn()
        sync()
    walls: dict[str, list[float]] = {name: [] for name in sides}
    submits: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, (fn, sync, calls) in sides.items():
            t = time_calls(fn, sync, calls, rounds=inner, warmup=0)
            walls[name].append(t["wall"])
            submits[name].append(t["submit"])
    out = {}
    for name in sides:
        w = walls[name]
        best = min(range(len(w)), key=w.__getitem__)
        med = statistics.median(w)
        out[name] = {
            "wall": w[best],
            "median": med,
            "spread": (max(w) - min(w)) / med if med else 0.0,
            "submit": submits[name][best],
        }
    return out


def once(fn: Callable[[], object], rounds: int = 3) -> float:
    """Median seconds of ``fn()`` over a few rounds."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def environment(dev: Device) -> dict[str, Any]:
    """Versions and the device the suites ran on (a package that is missing reads "not installed")."""
    import numpy

    from ... import __version__
    from ..info import package_version, probe_driver

    env: dict[str, Any] = {"scopegraph": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    env["device"] = str(dev)
    if dev.is_cuda:
        gpus = probe_driver().gpus
        if dev.index < len(gpus):
            env |= {"gpu": gpus[dev.index].name, "arch": gpus[dev.index].arch}
        env |= {"cuda.core": package_version("cuda-core"), "cuda.bindings": package_version("cuda-bindings")}
    env["torch"] = package_version("torch")
    return env


def num(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` when it was not measured (a table cell: rich pads it)."""
    return "-" if value is None else format(value, spec)


def us(seconds: float | None) -> str:
    """Seconds as microseconds, two decimals."""
    return num(None if seconds is None else seconds * 1e6, ".2f")


def ratio(a: float | None, b: float | None) -> str:
    """a / b, three decimals (``-`` when either was not measured)."""
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"
