"""Soak: thousands of scopes built, replayed and closed (or dropped, or failed), and afterwards
live graphs, pins, allocations and device memory are back where they started.

One test, run per backend by ``sg_device``: 2000 cycles on the host (a few seconds, in CI) and
3000 on CUDA (marked ``cuda``, run by the GPU script), where the device memory pool's bytes in
use must return exactly to the baseline and the device's free memory to within a few MiB (the
driver's own bookkeeping for graphs may be cached). The figures are printed (``-s``).

Each cycle allocates fresh tensors, records a small DAG over them and over long-lived tensors
(frozen weights, an accumulator), replays it one to three times and checks the result. The
cycles rotate through the ways a graph and its tensors end:

0. ``graph.close()``, then ``tmp.free()``;
1. the graph as a context manager; the tensors' names dropped;
2. nothing closed: graph and tensors dropped while the graph's work may still run (GC cleans up);
3. an exception inside the ``with`` block after some records: no graph at all;
4. ``graph.update`` between replays, and a foreign wrapper (``Tensor.from_dlpack``) of the
   fresh tensor recorded as well; dropped without ``close()``.
"""

from __future__ import annotations

import gc
import os
import time
import weakref

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import assert_stream_usable, device_memory, pinned

CYCLES = {"host": 2000, "cuda": 3000}
WIDTH = 64
FREE_SLACK = 16 << 20  # device free memory may differ by this much (driver caches)


class Boom(Exception):
    pass


def _cycles(device: sg.Device) -> int:
    override = os.environ.get("SCOPEGRAPH_SOAK_CYCLES")
    return int(override) if override else CYCLES["cuda" if device.is_cuda else "host"]


def _live(cls: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is cls)


def settle(device: sg.Device) -> None:
    """Let deferred releases run: collect garbage, wait for the device, and once more."""
    for _ in range(3):
        gc.collect()
        device.sync()


def _cycle(
    i: int,
    device: sg.Device,
    stream: sg.Stream,
    x: sg.Tensor,
    w: sg.Tensor,
    acc: sg.Tensor,
    graphs: weakref.WeakSet[sg.CudaGraph],
) -> int:
    """One scope built, replayed and ended; returns how many times it added ``w`` to ``acc``."""
    kind = i % 5
    value = float(i % 7)
    size = WIDTH * (1 + i % 4)  # varying sizes churn the pool
    tmp = device.full((size,), -1.0, name=f"tmp{i}")
    out = device.zeros((WIDTH,), name=f"out{i}")
    replays = 1 + i % 3
    alias = (
        sg.Tensor.from_dlpack(tmp[WIDTH : 2 * WIDTH] if size > WIDTH else tmp, name=f"alias{i}") if kind == 4 else None
    )
    try:
        with CudaGraph.scope(stream) as s:
            s.record(library.fill_op(tmp[0:WIDTH].mut(), value))
            s.record(library.add_op(out.mut(), x, tmp[0:WIDTH]))  # out = x + value
            s.record(library.axpy_op(acc.mut(), w, 1.0))  # acc += w
            if alias is not None:
                s.record(sg.memcpy(alias.mut(), out))  # through the wrapper
                s.record(library.add_scalar_op(out.mut(), 0.0))  # WAR on the memcpy
            if kind == 3:
                raise Boom
    except Boom:
        assert stream.recording is None and not pinned(tmp) and not pinned(out)
        tmp.free()
        return 0
    graph = s.graph
    graphs.add(graph)
    for r in range(replays):
        if kind == 4 and r:
            graph.update(sg.memset(out.mut(), 99.0))  # overwritten by the replay
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), x.numpy() + value)
    if alias is not None:
        np.testing.assert_array_equal(alias.numpy(), x.numpy() + value)
    if kind == 0:
        graph.close()
        assert not pinned(tmp)
        tmp.free()
    elif kind == 1:
        with graph:
            graph.launch()  # one more replay, then close()
        replays += 1
    # kinds 2 and 4: dropped with the graph still live; the names go when this frame returns
    return replays


def test_soak_scopes_leave_nothing_behind(sg_device: sg.Device) -> None:
    cycles = _cycles(sg_device)
    stream = sg_device.stream()
    x = sg_device.from_numpy(np.arange(WIDTH, dtype=np.float32), name="x")
    w = sg_device.from_numpy(np.arange(WIDTH, dtype=np.float32) % 5 - 2, name="w").freeze()
    acc = sg_device.zeros((WIDTH,), name="acc")
    graphs: weakref.WeakSet[sg.CudaGraph] = weakref.WeakSet()
    added = 0
    for i in range(10):  # warm up: kernels compiled, streams and pools made
        added += _cycle(i, sg_device, stream, x, w, acc, graphs)
    settle(sg_device)
    alloc_type = type(x.allocation)
    live_graphs, live_allocs = _live(sg.CudaGraph), _live(alloc_type)
    before = device_memory(sg_device)

    start = time.perf_counter()
    for i in range(cycles):
        added += _cycle(i, sg_device, stream, x, w, acc, graphs)
    stream.sync()
    elapsed = time.perf_counter() - start

    settle(sg_device)
    after = device_memory(sg_device)
    print(
        f"\nsoak[{sg_device}]: {cycles} cycles in {elapsed:.2f} s ({1e3 * elapsed / cycles:.2f} ms each); "
        f"graphs live {live_graphs} -> {_live(sg.CudaGraph)}, allocations {live_allocs} -> {_live(alloc_type)}"
        + (f"; device memory before {before}, after {after}" if before else "")
    )
    np.testing.assert_array_equal(acc.numpy(), added * w.numpy())
    assert len(graphs) == 0, f"{len(graphs)} graphs still alive"
    assert _live(sg.CudaGraph) == live_graphs
    assert _live(alloc_type) == live_allocs, "allocations leaked"
    for t in (x, w, acc):
        assert not pinned(t), f"{t.name} still pinned by {t.allocation.pins}"
    if before:
        assert after["pool_used"] == before["pool_used"], (
            f"pool bytes in use: {before['pool_used']} -> {after['pool_used']}"
        )
        assert after["free"] >= before["free"] - FREE_SLACK, f"device free memory: {before['free']} -> {after['free']}"
    assert_stream_usable(stream)
    acc.free()
    x.free()
    w.free()


@pytest.mark.sg_cuda
def test_soak_dropping_busy_memory_does_not_leak_or_corrupt() -> None:
    """Tensors and graphs dropped while their GPU work is still queued: the memory is reused only
    afterwards (results stay right), and the pool is back at its baseline once the device is idle."""
    dev = sg.device("cuda")
    stream = dev.stream()
    settle(dev)
    before = device_memory(dev)
    n = 1 << 16
    for i in range(300):
        src = dev.full((n,), float(i), name="src")
        dst = dev.zeros((n,), name="dst")
        with CudaGraph.scope(stream) as s:
            for _ in range(4):
                s.record(library.axpy_op(dst.mut(), src, 1.0))
        s.graph.launch()
        keep = dst
        del src, s  # the graph (and src) go while the replay may still run
        fresh = dev.full((n,), -7.0, name="fresh")  # may reuse src's memory only after the replay
        stream.sync()
        got = keep.numpy()
        assert got[0] == 4.0 * i and got[-1] == 4.0 * i, f"cycle {i}: {got[:4]}"
        del keep, dst, fresh
    settle(dev)
    after = device_memory(dev)
    print(f"\nsoak[busy drops]: device memory before {before}, after {after}")
    assert after["pool_used"] == before["pool_used"]
    assert after["free"] >= before["free"] - FREE_SLACK
