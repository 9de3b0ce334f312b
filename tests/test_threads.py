"""Threads: what scopegraph promises when several Python threads use it at once.

Tested here, on every backend (``sg_device``):

- Threads that each own a stream and tensors can allocate, record, instantiate, replay, read
  back, fail a scope and free, all at the same time, and every result is right.
- One graph can be launched from several threads at once, on its own stream or on each thread's
  stream: replays of one graph never overlap (on CUDA the library orders a graph's replays
  across streams; on the host, where a launch runs synchronously in the caller's thread, it
  serialises them), so a graph that increments a counter by read-modify-write through a
  temporary ends at exactly the number of launches.
- Threads that only read shared (frozen) tensors can replay their own graphs over them.

- A scope is recorded into only by the thread that opened it: another thread's record, loop,
  branch or captured region (in a body too) is a ScopeStateError, and the scope goes on.

Not promised (and not tested): one stream used by two threads for unordered work; record per
thread, on a stream of its own.

The switch interval is shortened while these tests run, so threads interleave between the
library's Python steps instead of running whole launches in one time slice.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import assert_stream_usable, pinned

THREADS = 6
TIMEOUT_S = 300.0


@pytest.fixture(autouse=True)
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_threads(n: int, fn: Callable[[int], None]) -> None:
    """Run ``fn(0..n-1)`` in ``n`` threads started together; re-raise the first failure."""
    barrier = Barrier(n)

    def start(i: int) -> None:
        barrier.wait(timeout=TIMEOUT_S)
        fn(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(start, i) for i in range(n)]
        for f in futures:
            f.result(timeout=TIMEOUT_S)


def test_threads_record_and_replay_their_own_graphs(sg_device: sg.Device) -> None:
    rounds, width = 40, 512
    weights = sg_device.from_numpy(np.arange(width, dtype=np.float32) % 7 - 3, name="shared_w").freeze()
    w = weights.numpy()

    def worker(tid: int) -> None:
        stream = sg_device.stream()
        x = sg_device.from_numpy(np.arange(width, dtype=np.float32) + tid, name=f"x{tid}")
        for r in range(rounds):
            y = sg_device.zeros((width,), name=f"y{tid}")
            z = sg_device.zeros((width,), name=f"z{tid}")
            with CudaGraph.scope(stream) as s:
                s.record(library.fill_op(y[0 : width // 2].mut(), float(r)))
                s.record(library.fill_op(y[width // 2 :].mut(), float(tid)))  # parallel branch
                s.record(library.add_op(z.mut(), x, y))
                s.record(library.axpy_op(z.mut(), weights, 2.0))  # shared, frozen: read only
                s.record(library.add_scalar_op(y.mut(), 1.0))  # WAR on the add
            with s.graph as graph:
                for _ in range(1 + r % 3):
                    graph.launch()
                graph.sync()
                y_want = np.concatenate([np.full(width // 2, r + 1.0), np.full(width // 2, tid + 1.0)])
                z_want = x.numpy() + y_want - 1.0 + 2.0 * w
                np.testing.assert_array_equal(z.numpy(), z_want, err_msg=f"thread {tid} round {r}")
                np.testing.assert_array_equal(y.numpy(), y_want, err_msg=f"thread {tid} round {r}")
            if r % 8 == 3:  # a scope that fails: nothing left pinned or recording on this stream
                with pytest.raises(sg.BorrowError), CudaGraph.scope(stream) as bad:
                    bad.record(library.fill_op(z.mut(), 1.0))
                    bad.record(sg.memcpy(y.mut(), y))  # type: ignore[scopegraph-borrow]  # the runtime check under test
                assert stream.recording is None and not pinned(y) and not pinned(z)
            y.free()
            z.free()
        assert_stream_usable(stream)
        x.free()

    run_threads(THREADS, worker)
    assert not pinned(weights)


@pytest.mark.parametrize("where", ["graph_stream", "own_streams"])
def test_one_graph_launched_from_many_threads(sg_device: sg.Device, where: str) -> None:
    width, launches = 4096, 60
    counter = sg_device.zeros((width,), name="counter")
    tmp = sg_device.zeros((width,), name="tmp")
    stream = sg_device.stream()
    with CudaGraph.scope(stream) as s:
        # counter += 1 through a temporary: two overlapping replays would lose increments.
        s.record(sg.memcpy(tmp.mut(), counter))
        s.record(library.add_scalar_op(tmp.mut(), 1.0))
        s.record(sg.memcpy(counter.mut(), tmp))
    graph = s.graph
    streams = [sg_device.stream() for _ in range(THREADS)]

    def worker(tid: int) -> None:
        for _ in range(launches):
            if where == "own_streams":
                graph.launch(stream=streams[tid])
            else:
                graph.launch()

    run_threads(THREADS, worker)
    for st in streams:
        st.sync()
    graph.sync()
    np.testing.assert_array_equal(counter.numpy(), float(THREADS * launches))
    graph.close()
    assert not pinned(counter) and not pinned(tmp)


def test_threads_update_and_launch_one_graph(sg_device: sg.Device) -> None:
    """graph.update from several threads, each followed by its own launch on the thread's stream:
    every launch sees some thread's update (never a half-written input), and the final count is exact."""
    width, rounds = 1024, 40
    inc = sg_device.zeros((width,), name="inc")
    total = sg_device.zeros((width,), name="total")
    stream = sg_device.stream()
    with CudaGraph.scope(stream) as s:
        s.record(library.axpy_op(total.mut(), inc, 1.0))  # total += inc
    graph = s.graph
    streams = [sg_device.stream() for _ in range(THREADS)]
    ones = sg_device.full((width,), 1.0, name="ones")

    def worker(tid: int) -> None:
        for _ in range(rounds):
            graph.update(sg.memcpy(inc.mut(), ones))  # every thread writes the same value
            graph.launch(stream=streams[tid])

    run_threads(THREADS, worker)
    for st in streams:
        st.sync()
    graph.sync()
    np.testing.assert_array_equal(total.numpy(), float(THREADS * rounds))
    graph.close()


def test_only_the_thread_that_opened_a_scope_records_into_it(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """The tracker's state is not guarded against two threads recording at once (edges would go
    missing): another thread is refused at its first step, and the scope builds what its own
    thread recorded."""
    x, flag = sg_device.zeros((16,), name="x"), sg_device.zeros((1,), sg.i32, name="flag")
    other_thread = r"(?s)cannot record into a scope from a thread other than the one that opened it.*help: record from"

    def from_another_thread(step: Callable[[], object]) -> None:
        with ThreadPoolExecutor(1) as pool, pytest.raises(sg.ScopeStateError, match=other_thread):
            pool.submit(step).result(timeout=TIMEOUT_S)

    def open_and_enter(block: Callable[[], Any]) -> Callable[[], object]:
        return lambda: block().__enter__()

    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
        from_another_thread(lambda: s.record(library.add_scalar_op(x.mut(), 1.0)))
        from_another_thread(open_and_enter(lambda: s.while_(flag)))
        from_another_thread(open_and_enter(lambda: s.if_(flag)))
        from_another_thread(open_and_enter(lambda: s.capture(writes=[x.mut()], host=lambda out: None)))
        with s.if_(flag) as then:
            from_another_thread(lambda: then.record(library.add_scalar_op(x.mut(), 1.0)))
            then.record(library.add_scalar_op(x.mut(), 1.0))
        s.record(library.add_scalar_op(x.mut(), 1.0))
    with s.graph as graph:
        assert len(graph.nodes) == 3
        graph.launch()
        graph.sync()
    np.testing.assert_array_equal(x.numpy(), np.full(16, 2.0, np.float32))  # flag 0: the branch is skipped
    assert_stream_usable(sg_stream)


def test_a_launch_waits_while_sync_reads_and_resets_the_loop_counters() -> None:
    """graph.sync() reads a bounded loop's counter, then resets it by a copy that the graph's
    streams do not order (CUDA backend: after_sync): another thread's launch must come after the
    reset, or the reset lands in that replay. Here after_sync lets another thread launch between
    the read and the reset; the launch has to wait for the graph's lock."""
    dev = sg.device("host")
    stream = dev.stream()
    flag, x = dev.zeros((1,), sg.i32, name="done"), dev.zeros((4,), name="x")
    with CudaGraph.scope(stream) as s, s.while_(flag, max_iterations=2) as body:
        body.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    host_executable = graph.executable
    seen: list[str] = []
    other: list[threading.Thread] = []

    class WithCounters:  # the host executable, with the CUDA executable's after_sync hook
        def __getattr__(self, name: str) -> Any:
            return getattr(host_executable, name)

        def launch(self, on: sg.Stream) -> None:
            host_executable.launch(on)
            seen.append("replay enqueued")

        def after_sync(self, last: sg.Stream) -> None:
            seen.append("counters read")
            other.append(threading.Thread(target=graph.launch))
            other[0].start()
            other[0].join(0.5)
            seen.append("counters reset")

    graph._exec = WithCounters()
    graph.sync()
    other[0].join()
    assert seen == ["counters read", "counters reset", "replay enqueued"]
    graph._exec = host_executable
    graph.close()
