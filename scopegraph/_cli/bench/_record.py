"""Suite 5, record cost where the tracker works hardest (issue 8): many ops on one allocation.

- *Partial writes*: op i writes row ``x[i]`` of one allocation, for 1k, 4k and 16k ops, either
  as a memset node or as a small kernel (``library.fill_op``). Microseconds per recorded op,
  with the op's construction (view, borrow, signature checks) inside the clock. The rows are
  disjoint, so the minimum is no edges at all; a tracker that scans the allocation's history
  costs O(n) per op here.
- *Small writes after many readers*: 2000 ops each read the whole ``x`` (copying it into their
  own row of ``out``), then small writes each overwrite one row of ``x``. Each write must come
  after every reader: microseconds per write and the edges each write adds (2000 if every
  reader gets its own edge; about one when the readers meet in a join node), both amortised
  over all the writes (a join node's fan-in included) and for the last write alone.

Both run on every backend: on the host the figures are the tracker's own cost. Every time is
given as its best, median and spread over rounds (``_timing.interleaved_laps``; the memset and
kernel ways alternate within a round); the plain keys are the best, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ... import CudaGraph, Device, GraphNode, Tensor, library, memset
from ._timing import figure, interleaved_laps, record_lap

SIZES = (1000, 4000, 16000)
QUICK_SIZES = (1000, 4000)
ROW = 16  # floats per row: 64 bytes, a small write
READERS = 2000
WRITES, QUICK_WRITES = 256, 64


def partial_writes(dev: Device, n: int, rounds: int) -> dict[str, Any]:
    """Record ``memset(x[i])`` (or ``fill_op(x[i])``) for every row i, the two ways in interleaved
    rounds: microseconds per op and build time, and the edges the graph got."""
    x = dev.zeros((n, ROW), name="x")
    stream = dev.stream()
    edges: dict[str, int] = {}

    def count(way: str) -> Callable[[CudaGraph], None]:
        return lambda graph: edges.__setitem__(way, len(graph.edges))

    makes: dict[str, Callable[[int], GraphNode]] = {
        "memset": lambda i: memset(x[i].mut(), 1.0),
        "kernel": lambda i: library.fill_op(x[i].mut(), 1.0),
    }
    timed = interleaved_laps({w: record_lap(stream, n, make, count(w)) for w, make in makes.items()}, rounds)
    x.free()
    row: dict[str, Any] = {"n": n}
    for way, t in timed.items():
        row |= figure(f"{way}_us_per_op", t["record"], scale=1e6) | figure(f"{way}_build_s", t["build"])
    return row | {"edges": edges["memset"], "kernel_edges": edges["kernel"]}


def _readers(x: Tensor, out: Tensor) -> list[GraphNode]:
    return [library.axpy_op(out[j].mut(), x.view((x.size,)), 1.0) for j in range(out.shape[0])]


def writes_after_readers(dev: Device, writes: int, rounds: int) -> dict[str, Any]:
    """``writes`` one-row writes of ``x`` after READERS ops that each read all of ``x``."""
    x = dev.zeros((writes, ROW), name="x")
    out = dev.zeros((READERS, writes * ROW), name="out")
    stream = dev.stream()
    with CudaGraph.scope(stream) as s:
        for op in _readers(x, out):
            s.record(op)
    with s.graph as graph:
        reader_edges, reader_nodes = len(graph.edges), len(graph.nodes)
    counts: dict[str, int] = {}

    def lap() -> dict[str, float]:
        readers = _readers(x, out)
        with CudaGraph.scope(stream) as s:
            for op in readers:
                s.record(op)
            t0 = time.perf_counter()
            for i in range(writes):
                s.record(memset(x[i].mut(), 2.0))
            t1 = time.perf_counter()
        with s.graph as graph:
            counts["edges"], counts["nodes"] = len(graph.edges), len(graph.nodes)
            counts["last"] = len(graph.nodes[-1].deps)  # recorded last: a write in the steady state
        return {"write": (t1 - t0) / writes}

    timed = interleaved_laps({"writes": lap}, rounds)
    edges, nodes = counts["edges"], counts["nodes"]
    x.free()
    out.free()
    return {
        "readers": READERS,
        "writes": writes,
        **figure("us_per_write", timed["writes"]["write"], scale=1e6),
        "edges_per_write": (edges - reader_edges) / writes,  # join nodes' edges included, amortised
        "last_write_edges": counts["last"],
        "reader_edges": reader_edges,
        "extra_nodes": nodes - reader_nodes - writes,  # join nodes the tracker added, if any
    }


def run(dev: Device, quick: bool) -> dict[str, Any]:
    rounds = 3 if quick else 5
    return {
        "row_floats": ROW,
        "partial_writes": [partial_writes(dev, n, rounds) for n in (QUICK_SIZES if quick else SIZES)],
        "after_readers": writes_after_readers(dev, QUICK_WRITES if quick else WRITES, rounds),
    }
