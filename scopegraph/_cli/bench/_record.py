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

Both run on every backend: on the host the figures are the tracker's own cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ... import CudaGraph, Device, GraphNode, Tensor, library, memset

SIZES = (1000, 4000, 16000)
QUICK_SIZES = (1000, 4000)
ROW = 16  # floats per row: 64 bytes, a small write
READERS = 2000
WRITES, QUICK_WRITES = 256, 64


def _record_rows(dev: Device, x: Tensor, make: Callable[[Tensor], GraphNode], rounds: int) -> dict[str, float]:
    """Best of ``rounds``: record ``make(x[i])`` for every row i; seconds per op, build time, edges."""
    stream = dev.stream()
    n = x.shape[0]
    best: dict[str, float] = {}
    for _ in range(rounds):
        with CudaGraph.scope(stream) as s:
            t0 = time.perf_counter()
            for i in range(n):
                s.record(make(x[i]))
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        with s.graph as graph:
            sample = {"record_s": (t1 - t0) / n, "build_s": t2 - t1}
            best |= {k: min(v, best.get(k, v)) for k, v in sample.items()}
            best |= {"edges": len(graph.edges), "nodes": len(graph.nodes)}
    return best


def partial_writes(dev: Device, n: int, rounds: int) -> dict[str, Any]:
    x = dev.zeros((n, ROW), name="x")
    by_memset = _record_rows(dev, x, lambda row: memset(row.mut(), 1.0), rounds)
    by_kernel = _record_rows(dev, x, lambda row: library.fill_op(row.mut(), 1.0), rounds)
    x.free()
    return {
        "n": n,
        "memset_us_per_op": by_memset["record_s"] * 1e6,
        "kernel_us_per_op": by_kernel["record_s"] * 1e6,
        "memset_build_s": by_memset["build_s"],
        "kernel_build_s": by_kernel["build_s"],
        "edges": int(by_memset["edges"]),
        "kernel_edges": int(by_kernel["edges"]),
    }


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
    best = float("inf")
    for _ in range(rounds):
        readers = _readers(x, out)
        with CudaGraph.scope(stream) as s:
            for op in readers:
                s.record(op)
            t0 = time.perf_counter()
            for i in range(writes):
                s.record(memset(x[i].mut(), 2.0))
            best = min(best, (time.perf_counter() - t0) / writes)
        with s.graph as graph:
            edges, nodes = len(graph.edges), len(graph.nodes)
            last_write_deps = len(graph.nodes[-1].deps)  # recorded last: a write in the steady state
    x.free()
    out.free()
    return {
        "readers": READERS,
        "writes": writes,
        "us_per_write": best * 1e6,
        "edges_per_write": (edges - reader_edges) / writes,  # join nodes' edges included, amortised
        "last_write_edges": last_write_deps,
        "reader_edges": reader_edges,
        "extra_nodes": nodes - reader_nodes - writes,  # join nodes the tracker added, if any
    }


def run(dev: Device, quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 3
    return {
        "row_floats": ROW,
        "partial_writes": [partial_writes(dev, n, rounds) for n in (QUICK_SIZES if quick else SIZES)],
        "after_readers": writes_after_readers(dev, QUICK_WRITES if quick else WRITES, rounds),
    }
