"""Timing helpers shared by the benchmark suites: medians of repeated rounds, interleaved sides, environment facts."""

from __future__ import annotations

import functools
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ... import CudaGraph

if TYPE_CHECKING:
    from ... import Device, GraphNode, Stream


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
# One round of a side that keeps its own clock (what it times is its own business: setup outside,
# every cost it reports inside): the seconds of each of its figures, by name.
Lap = Callable[[], Mapping[str, float]]
# A figure over interleaved rounds, in seconds: the best (minimum) round, the median round and the
# spread, (max - min) / median.
Summary = dict[str, float]


def summary(values: Sequence[float]) -> Summary:
    """``best`` (the minimum), ``median`` and ``spread`` ((max - min) / median) of round figures."""
    med = statistics.median(values)
    return {"best": min(values), "median": med, "spread": (max(values) - min(values)) / med if med else 0.0}


def _rounds(laps: Mapping[str, Lap], rounds: int) -> dict[str, dict[str, list[float]]]:
    """``rounds`` rounds, each side in turn within a round (so drift and clocks affect all alike):
    per side, per figure, its value in each round."""
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in laps}
    for _ in range(rounds):
        for name, lap in laps.items():
            for figure_name, seconds in lap().items():
                samples[name].setdefault(figure_name, []).append(seconds)
    return samples


def interleaved_laps(laps: Mapping[str, Lap], rounds: int = 5, warmup: int = 1) -> dict[str, dict[str, Summary]]:
    """Sides that time themselves (``Lap``), run as ``interleaved`` runs its sides: ``warmup``
    untimed laps of each, then ``rounds`` interleaved rounds. Per side, per figure: its ``summary``."""
    for lap in laps.values():
        for _ in range(warmup):
            lap()
    return {name: {k: summary(v) for k, v in figures.items()} for name, figures in _rounds(laps, rounds).items()}


def interleaved(
    sides: dict[str, Side], rounds: int = 5, inner: int = 3, warmup: int = 2, rewarm: int = 0
) -> dict[str, dict[str, float]]:
    """Every side timed the same way: ``rounds`` rounds, each side in turn within a round (so drift
    and clocks affect all alike), each round's figure the median of ``inner`` timings of
    ``calls`` back-to-back calls (after ``rewarm`` untimed calls). Per side: ``wall`` = the best
    (minimum) of the round medians, ``median`` = their median, ``spread`` = (max - min) / median,
    ``submit`` = the CPU time to issue the calls in the best round, and ``submit_best``,
    ``submit_median``, ``submit_spread`` of the CPU times alone, all in seconds per call."""
    for fn, sync, _ in sides.values():
        for _ in range(warmup):
            fn()
        sync()
    laps = {
        name: functools.partial(time_calls, fn, sync, calls, rounds=inner, warmup=rewarm)
        for name, (fn, sync, calls) in sides.items()
    }
    out = {}
    for name, samples in _rounds(laps, rounds).items():
        walls, submits = samples["wall"], samples["submit"]
        best = min(range(len(walls)), key=walls.__getitem__)
        wall, submit = summary(walls), summary(submits)
        out[name] = {"wall": wall["best"], "median": wall["median"], "spread": wall["spread"]}
        out[name] |= {"submit": submits[best]} | {f"submit_{k}": v for k, v in submit.items()}
    return out


def part(timed: Mapping[str, float], name: str = "wall") -> Summary:
    """One figure of an ``interleaved`` side as a ``Summary``: its wall time, or ``submit``."""
    if name == "wall":
        return {"best": timed["wall"], "median": timed["median"], "spread": timed["spread"]}
    return {k: timed[f"{name}_{k}"] for k in ("best", "median", "spread")}


def figure(key: str, s: Summary, scale: float = 1.0, rate: bool = False, plain: str = "best") -> dict[str, float]:
    """A figure's JSON keys: ``key_best``, ``key_median`` (seconds times ``scale``, or with ``rate``
    ``scale`` / seconds: a rate, whose best is its highest) and ``key_spread`` (of the times, a
    fraction); ``key`` itself is the ``plain`` one of them, the meaning it had in older records."""

    def value(seconds: float) -> float:
        return scale / seconds if rate else seconds * scale

    out = {f"{key}_best": value(s["best"]), f"{key}_median": value(s["median"]), f"{key}_spread": s["spread"]}
    return {key: out[f"{key}_{plain}"]} | out


def figures(key: str, per: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """``figure(key, ...)`` of several named things (``per``: name -> that figure's keys), as one
    dict a key: ``{key: {name: ...}, key_best: {name: ...}, key_median: ..., key_spread: ...}``."""
    keys = (key, *(f"{key}_{k}" for k in ("best", "median", "spread")))
    return {k: {name: f[k] for name, f in per.items()} for k in keys}


def record_lap(
    stream: Stream, n: int, make: Callable[[int], GraphNode], seen: Callable[[CudaGraph], object] | None = None
) -> Lap:
    """A ``Lap``: open a scope on ``stream``, record ``make(i)`` for i < n (each op built inside the
    clock), build the graph. Figures: ``record`` (seconds per op, the scope's opening included)
    and ``build`` (seconds). ``seen`` gets the graph (outside the clock) before it is closed."""

    def lap() -> dict[str, float]:
        t0 = time.perf_counter()
        with CudaGraph.scope(stream) as s:
            for i in range(n):
                s.record(make(i))
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        with s.graph as graph:
            if seen is not None:
                seen(graph)
        return {"record": (t1 - t0) / n, "build": t2 - t1}

    return lap


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


def cell(d: Mapping[str, Any], key: str, spec: str, scale: float = 1.0, name: str | None = None) -> str:
    """A figure's table cell, ``best (median, spread)``, from the keys ``figure`` writes in ``d``
    (``figures``' with ``name``), times ``scale`` and formatted with ``spec``; the single figure
    ``d[key]`` of an older record; ``-`` when it was not measured."""

    def get(k: str) -> float | None:
        v = d.get(k)
        return v.get(name) if name is not None and v is not None else v

    best, median, spread = get(f"{key}_best"), get(f"{key}_median"), get(f"{key}_spread")
    if best is None or median is None or spread is None:
        plain = get(key)
        return num(None if plain is None else plain * scale, spec)
    return f"{best * scale:{spec}} ({median * scale:{spec}}, {spread:.1%})"
