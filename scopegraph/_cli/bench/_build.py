"""Suite 3, record and build cost: microseconds per recorded op (the scope opened, each op built,
its arguments and borrows checked, the tracker: all inside the clock) and the time to build and
instantiate graphs of 10 to 10,000 ops, against cuda.core defining and instantiating the same
nodes with the same edges. Both sides in interleaved rounds (``_timing.interleaved_laps``): each
figure's best, median and spread."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ... import CudaGraph, Device, GraphNode, Stream, library
from ._timing import Lap, figure, interleaved_laps, record_lap

if TYPE_CHECKING:
    from cuda.core import Stream as CoreStream

SIZES = (10, 100, 1000, 10000)
BUFFERS = 16


def run(dev: Device, quick: bool) -> dict[str, Any]:
    stream = dev.stream()
    bufs = [dev.zeros((256,), name=f"b{i}") for i in range(BUFFERS)]
    rows = []
    for n in SIZES if not quick else SIZES[:3]:

        def make(i: int) -> GraphNode:
            # Each op reads one buffer and writes the next: a DAG of interleaved chains. Built
            # inside the clock: the argument and borrow checks are part of recording.
            return library.axpy_op(bufs[(i + 1) % BUFFERS].mut(), bufs[i % BUFFERS], 1.0)

        laps: dict[str, Lap] = {"sg": record_lap(stream, n, make)}
        core = _core_lap(stream, n, make) if dev.is_cuda else None
        if core is not None:
            laps["core"] = core
        timed = interleaved_laps(laps, rounds=3 if quick else 5)
        row: dict[str, Any] = {"n": n} | figure("record_us_per_op", timed["sg"]["record"], scale=1e6)
        row |= figure("build_s", timed["sg"]["build"])
        if "core" in timed:
            row |= figure("core_define_instantiate_s", timed["core"]["define_instantiate"])
            row["build_over_core"] = row["build_s"] / row["core_define_instantiate_s"]
        rows.append(row)
    return {"rows": rows}


def _core_lap(stream: Stream, n: int, make: Callable[[int], GraphNode]) -> Lap | None:
    """cuda.core's side: the kernels and edges scopegraph records (once, untimed), for
    ``_core_define_instantiate``; None when the graph holds nodes other than kernel launches."""
    found: list[Lap] = []

    def seen(graph: CudaGraph) -> None:
        if all(hasattr(r.op, "native") for r in graph.nodes):
            nodes = [(r.op.native, sorted(r.deps)) for r in graph.nodes]  # type: ignore[attr-defined]
            found.append(functools.partial(_core_define_instantiate, nodes, graph.stream.native))

    record_lap(stream, n, make, seen)()
    return found[0] if found else None


def _core_define_instantiate(nodes: list[tuple[Any, list[int]]], stream: object) -> dict[str, float]:
    """cuda.core alone: kernel launches (``(fn, config, args)``, predecessors), defined with their
    edges, instantiated and uploaded; seconds."""
    from cuda.core.graph import GraphDefinition

    t0 = time.perf_counter()
    definition = GraphDefinition()
    made: list[Any] = []
    for (fn, config, args), pred in nodes:
        node = (made[pred[0]] if len(pred) == 1 else definition).launch(config, fn, *args)
        if len(pred) > 1:
            node.pred = [made[p] for p in pred]
        made.append(node)
    exe = definition.instantiate()
    exe.upload(cast("CoreStream", stream))
    elapsed = time.perf_counter() - t0
    exe.close()
    return {"define_instantiate": elapsed}
