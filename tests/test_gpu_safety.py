"""Issue 8's device cases, made visible on the GPU: each test makes the race happen if the library
did not prevent it, by a kernel that spins for tens of milliseconds before it reads or writes.

With device lifetimes and stream ordering switched off (a throwaway plugin that frees memory at
once and skips the replay ordering), the use-after-free, free and stream-ordering tests fail on
an H100; the close-and-drop-a-graph test passed there even so (the driver's executable-graph
teardown seems to wait for the replay), so it guards less than the others. Marked `cuda`: they
skip without a GPU."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from typing import Annotated, Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

from .helpers import assert_stream_usable, child_env

pytestmark = pytest.mark.sg_cuda

SPIN = """
__device__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
// out = in, after spinning: a reader that is still reading long after it was launched.
extern "C" __global__ void slow_copy(float* out, const float* in, int n, long long cycles) {
    spin(cycles);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
// x += 1 with a long gap between the read and the write: two overlapping runs lose an update.
extern "C" __global__ void slow_increment(float* x, long long cycles) {
    float v = x[0];
    spin(cycles);
    x[0] = v + 1.0f;
}
// x = value, after spinning: a slow writer.
extern "C" __global__ void slow_fill(float* x, float value, int n, long long cycles) {
    spin(cycles);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
"""
CYCLES = 200_000_000  # about 0.1 s at the H100's clock
F32 = Annotated[Tensor, sg.TensorSpec(sg.f32)]


@sg.kernel(SPIN, touches={"out": "n", "x": "n"})
def slow_copy(out: Mut[Tensor], x: F32, n: sg.i32, cycles: sg.i64) -> None: ...


@sg.kernel(SPIN, touches={"x": "1"})
def slow_increment(x: Mut[Tensor], cycles: sg.i64) -> None: ...


@sg.kernel(SPIN, touches={"x": "n"})
def slow_fill(x: Mut[Tensor], value: sg.f32, n: sg.i32, cycles: sg.i64) -> None: ...


N = 1 << 16


@pytest.fixture
def cuda() -> sg.Device:
    return sg.device("cuda")


def _reuse_freed_memory(cuda: sg.Device, value: float) -> list[Tensor]:
    """Allocate and fill what a premature free would hand out again."""
    return [cuda.full((N,), value) for _ in range(4)]


def test_dropping_a_tensor_while_a_kernel_reads_it(cuda: sg.Device) -> None:
    """Issue 8 case 1: `del src` while a kernel still copies from it."""
    stream = cuda.stream()
    src = cuda.full((N,), 1.0, name="src")
    dst = cuda.zeros((N,), name="dst")
    stream.run(slow_copy[N // 256, 256](dst.mut(), src, N, CYCLES))
    del src
    gc.collect()
    others = _reuse_freed_memory(cuda, 7.0)
    stream.sync()
    np.testing.assert_array_equal(dst.numpy(), 1.0)
    assert all(float(o.numpy()[0]) == 7.0 for o in others)


def test_an_allocation_does_not_wait_for_the_work_on_memory_freed_before(cuda: sg.Device) -> None:
    """Freeing a tensor that a slow kernel still reads queues its release after that kernel; a
    new allocation, and a host copy, are made without waiting for it (the kernel still runs when
    they return) and the kernel reads what it should."""
    stream = cuda.stream()
    x, out = cuda.full((N,), 1.0, name="x"), cuda.zeros((N,), name="out")
    stream.run(slow_copy[N // 256, 256](out.mut(), x, N, 10 * CYCLES))  # about a second
    finished = stream.native.record()  # type: ignore[attr-defined]
    x.free()
    fresh = [cuda.zeros((N,), name="fresh"), cuda.from_numpy(np.full(N, 3.0, np.float32), name="copied")]
    assert not finished.is_done, "the allocation waited for the kernel that reads the freed memory"
    stream.sync()
    np.testing.assert_array_equal(out.numpy(), 1.0)
    np.testing.assert_array_equal(fresh[1].numpy(), 3.0)


def test_free_while_a_kernel_reads_it(cuda: sg.Device) -> None:
    stream = cuda.stream()
    src = cuda.full((N,), 1.0, name="src")
    dst = cuda.zeros((N,), name="dst")
    stream.run(slow_copy[N // 256, 256](dst.mut(), src, N, CYCLES))
    src.free()  # returns at once: no device-wide wait
    _reuse_freed_memory(cuda, 7.0)
    stream.sync()
    np.testing.assert_array_equal(dst.numpy(), 1.0)


def test_memory_read_on_many_streams_lets_them_go_and_still_outlives_their_work(cuda: sg.Device) -> None:
    """A slow kernel reads `src` on one stream, then quick copies read it on many streams the
    program drops at once (a stream per request): `src` lets go of those whose work has finished
    (it kept them all alive), and its release still waits for the slow kernel (a stream let go
    while busy would free `src` under it)."""
    from scopegraph._lifetime import MANY_USERS

    src, dst = cuda.full((N,), 1.0, name="src"), cuda.zeros((N,), name="dst")
    slow = cuda.stream()
    slow.run(slow_copy[N // 256, 256](dst.mut(), src, N, 10 * CYCLES))  # about a second
    slow_native, finished = slow.native, slow.native.record()  # type: ignore[attr-defined]
    del slow  # dropped too: only its work keeps it among the users
    copies = []  # each copy's backend stream (not its Stream: the program dropped that) and output
    for i in range(MANY_USERS + 8):  # (with 32 or so streams alive, creating one more waited for the GPU)
        stream, out = cuda.stream(), cuda.zeros((N,), name=f"out{i}")
        stream.run(sg.memcpy(out.mut(), src))
        copies.append((stream.native, out))
    users = src.allocation.users  # the busy slow stream, the copies' streams since the last look
    assert slow_native in users and sum(native in users for native, _ in copies) < MANY_USERS
    assert not finished.is_done, "the slow kernel finished before the free: the test proves nothing"
    src.free()
    _reuse_freed_memory(cuda, 7.0)
    np.testing.assert_array_equal(dst.numpy(), 1.0)  # (waits for the slow kernel)
    for _, out in copies:
        np.testing.assert_array_equal(out.numpy(), 1.0)


def test_closing_and_dropping_a_graph_while_it_replays(cuda: sg.Device) -> None:
    """Issue 8 case 1, second half: the graph is closed and dropped while its replay still runs."""
    stream = cuda.stream()
    src = cuda.full((N,), 1.0, name="src")
    dst = cuda.zeros((N,), name="dst")
    with CudaGraph.scope(stream) as s:
        s.record(slow_copy[N // 256, 256](dst.mut(), src, N, CYCLES))
    graph = s.graph
    graph.launch()
    graph.close()
    del graph, s, src
    gc.collect()
    _reuse_freed_memory(cuda, 7.0)
    stream.sync()
    np.testing.assert_array_equal(dst.numpy(), 1.0)


def test_two_torch_wrappers_are_one_allocation(cuda: sg.Device) -> None:
    """Issue 8 case 2: a write through one wrapper and a read through the other get an edge."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(N, dtype=torch.float32, device="cuda")
    a, b = sg.Tensor.from_dlpack(t, name="a"), sg.Tensor.from_dlpack(t, name="b")
    with pytest.raises(sg.BorrowError, match="wrap the same device memory"):
        sg.memcpy(a.mut(), b)
    out = cuda.zeros((N,), name="out")
    stream = cuda.stream()
    with CudaGraph.scope(stream) as s:
        write = s.record(slow_fill[N // 256, 256](a.mut(), 3.0, N, CYCLES))
        read = s.record(sg.memcpy(out.mut(), b))
    assert read.deps == {write.index}
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 3.0)


@pytest.mark.parametrize("how", ["graph.update", "eager on a third stream"])
def test_work_queued_before_a_replay_on_another_stream_is_ordered(cuda: sg.Device, how: str) -> None:
    """Issue 8 case 5: graph.update(op) on the graph's stream, or an eager op on any stream, then a
    replay launched elsewhere: the replay waits for it."""
    home, other, side = cuda.stream(), cuda.stream(), cuda.stream()
    inp = cuda.full((N,), 1.0, name="inp")
    out = cuda.zeros((N,), name="out")
    with CudaGraph.scope(home) as s:
        s.record(sg.memcpy(out.mut(), inp))
    with s.graph as g:
        slow = slow_fill[N // 256, 256](inp.mut(), 2.0, N, CYCLES)  # still running at the launch
        if how == "graph.update":
            g.update(slow)
        else:
            side.run(slow)
        g.launch(stream=other)
        other.sync()
        np.testing.assert_array_equal(out.numpy(), 2.0)


@pytest.mark.parametrize("how", ["graph.update", "eager on a third stream", "eager after the graph is closed"])
def test_work_queued_after_a_replay_on_another_stream_waits_for_it(cuda: sg.Device, how: str) -> None:
    """The mirror of the test above: a replay launched on another stream still reads `inp` (it
    spins first) when an update or an eager op that overwrites `inp` is queued: that write waits
    for the replay, which copies the old values. Closing the graph does not wait for the replay;
    eager work queued after it still does."""
    home, other, side = cuda.stream(), cuda.stream(), cuda.stream()
    inp = cuda.full((N,), 1.0, name="inp")
    out = cuda.zeros((N,), name="out")
    with CudaGraph.scope(home) as s:
        s.record(slow_copy[N // 256, 256](out.mut(), inp, N, CYCLES))
    graph = s.graph
    graph.launch(stream=other)
    overwrite = sg.memset(inp.mut(), 9.0)
    if how == "graph.update":
        graph.update(overwrite)  # on the graph's stream, home
    else:
        if how == "eager after the graph is closed":
            graph.close()
        side.run(overwrite)
    for stream in (home, other, side):
        stream.sync()
    np.testing.assert_array_equal(out.numpy(), 1.0)
    np.testing.assert_array_equal(inp.numpy(), 9.0)
    graph.close()


def test_the_first_replay_waits_for_eager_work_queued_before_the_graph_was_recorded(cuda: sg.Device) -> None:
    home, side = cuda.stream(), cuda.stream()
    inp = cuda.full((N,), 1.0, name="inp")
    out = cuda.zeros((N,), name="out")
    side.run(slow_fill[N // 256, 256](inp.mut(), 2.0, N, CYCLES))  # still running at the launch
    np.testing.assert_array_equal(copied_by_a_graph(home, inp, out), 2.0)


def copied_by_a_graph(home: sg.Stream, src: Tensor, out: Tensor) -> Any:
    """What a graph recorded and launched on ``home`` copies from ``src`` into ``out``."""
    with CudaGraph.scope(home) as s:
        s.record(sg.memcpy(out.mut(), src))
    with s.graph as g:
        g.launch()
        home.sync()
        return out.numpy()


def test_a_graph_launched_on_two_streams_in_turn_never_overlaps_itself(cuda: sg.Device) -> None:
    a, b = cuda.stream(), cuda.stream()
    x = cuda.zeros((1,), name="x")
    with CudaGraph.scope(a) as s:
        s.record(slow_increment[1, 1](x.mut(), CYCLES // 10))
    with s.graph as g:
        for i in range(10):
            g.launch(stream=a if i % 2 else b)
        a.sync()
        b.sync()
        assert float(x.numpy()[0]) == 10.0


@pytest.mark.parametrize("order", ["writer first", "reader first", "writer first, closed"])
def test_two_graphs_sharing_memory_on_two_streams_are_ordered(cuda: sg.Device, order: str) -> None:
    """A prefill graph writes `cache` on one stream, a decode graph reads it on another: each
    replay waits for the other graph's last one, also once the other is closed. The graph launched
    first is the slow one (it spins before it touches `cache`), so a second graph that started at
    once would read the old values (writer first) or overwrite them before they are read (reader
    first)."""
    a, b = cuda.stream(), cuda.stream()
    cache, out = cuda.full((N,), 1.0, name="cache"), cuda.zeros((N,), name="out")
    slow = order.startswith("writer first")
    with CudaGraph.scope(a) as s:
        s.record(slow_fill[N // 256, 256](cache.mut(), 2.0, N, CYCLES if slow else 0))
    writer = s.graph
    with CudaGraph.scope(b) as s:
        s.record(slow_copy[N // 256, 256](out.mut(), cache, N, 0 if slow else CYCLES))
    reader = s.graph
    with writer, reader:
        first, second = (writer, reader) if slow else (reader, writer)
        first.launch()
        if order.endswith("closed"):
            first.close()
        second.launch()
        second.stream.sync()
        np.testing.assert_array_equal(out.numpy(), 2.0 if slow else 1.0)
        np.testing.assert_array_equal(cache.numpy(), 2.0)


def test_graphs_that_only_read_the_same_memory_run_side_by_side(cuda: sg.Device) -> None:
    a, b = cuda.stream(), cuda.stream()
    weights = cuda.full((N,), 5.0, name="weights").freeze()
    out, copy = cuda.zeros((N,), name="out"), cuda.zeros((N,), name="copy")
    with CudaGraph.scope(a) as s:
        s.record(slow_copy[N // 256, 256](out.mut(), weights, N, CYCLES))
    with CudaGraph.scope(b) as t:
        t.record(sg.memcpy(copy.mut(), weights))
    with s.graph as first, t.graph as second:
        first.launch()
        second.launch()
        b.sync()
        assert not a.native.record().is_done  # type: ignore[attr-defined]  # the slow copy still runs
        np.testing.assert_array_equal(copy.numpy(), 5.0)


def test_from_handle_finds_the_device_and_refuses_non_streams(cuda: sg.Device) -> None:
    torch = pytest.importorskip("torch")
    stream = sg.Stream.from_handle(torch.cuda.Stream(device=0))
    assert stream.device is sg.device("cuda:0")
    with pytest.raises(sg.SignatureError, match="not a CUDA stream"):
        sg.Stream.from_handle(object())


def test_eager_work_marks_the_graphs_on_its_memory_pending_once_enqueued(
    cuda: sg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next replay of a graph on the memory must wait for eager work: the stream is marked
    pending after the launch is enqueued, not before (a replay on another thread in between would
    take the mark and wait for nothing yet queued; tests/test_lifetime.py has that sequence)."""
    from scopegraph._backends import _cuda

    stream, x = cuda.stream(), cuda.zeros((256,), name="x")
    with CudaGraph.scope(cuda.stream()) as s:
        s.record(library.fill_op(x.mut(), 1.0))
    pin = s.graph._pin
    marked_at_launch: list[bool] = []
    real_launch = _cuda.launch  # type: ignore[attr-defined]

    def spying_launch(native: Any, *args: Any) -> None:
        marked_at_launch.append(native in pin.pending)
        real_launch(native, *args)

    monkeypatch.setattr(_cuda, "launch", spying_launch)
    stream.run(library.add_scalar_op(x.mut(), 1.0))
    assert marked_at_launch == [False] and stream.native in pin.pending
    s.graph.close()


def test_graph_sync_waits_for_a_replay_launched_on_another_stream(cuda: sg.Device) -> None:
    """graph.sync() synchronised the graph's own stream only: a replay launched with
    graph.launch(stream=other) could still run after it returned."""
    x = cuda.zeros((N,), name="x")
    home, other = cuda.stream(), cuda.stream()
    with CudaGraph.scope(home) as s:
        s.record(slow_fill[N // 256, 256](x.mut(), 4.0, N, CYCLES))
    with s.graph as g:
        g.launch(stream=other)
        g.sync()
        assert other.native.record().is_done  # type: ignore[attr-defined]
    np.testing.assert_array_equal(x.numpy(), 4.0)


def test_one_cuda_stream_has_one_stream_wrapper(cuda: sg.Device) -> None:
    """Wrapping one CUDA stream again (its cuda.core stream, or a torch stream twice) gives the
    same Stream, so a scope recording on it refuses eager work and nested scopes through either."""
    torch = pytest.importorskip("torch")
    stream = cuda.stream()
    again = sg.Stream.from_handle(stream.native)
    assert again is stream
    foreign = torch.cuda.Stream(device=0)
    assert sg.Stream.from_handle(foreign) is sg.Stream.from_handle(foreign)
    legacy = sg.Stream.from_handle(torch.cuda.default_stream(0))  # handle 0: the legacy default stream
    assert sg.Stream.from_handle(torch.cuda.default_stream(0)) is legacy
    with CudaGraph.scope(legacy) as on_legacy:
        on_legacy.record(sg.memset(cuda.zeros((8,)).mut(), 1.0))
        with pytest.raises(sg.ScopeStateError, match="while a scope is recording"):
            sg.Stream.from_handle(torch.cuda.default_stream(0)).run(sg.memset(cuda.zeros((8,)).mut(), 2.0))
    on_legacy.graph.close()
    z = cuda.zeros((8,), name="z")
    with CudaGraph.scope(stream) as s:
        s.record(sg.memset(z.mut(), 1.0))
        with pytest.raises(sg.ScopeStateError, match="while a scope is recording"):
            sg.Stream.from_handle(stream.native).run(sg.memset(z.mut(), 2.0))
        with pytest.raises(sg.ScopeStateError):
            CudaGraph.scope(sg.Stream.from_handle(stream.native)).__enter__()
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(z.numpy(), 1.0)


def test_dlpack_export_orders_the_consumer_stream(cuda: sg.Device) -> None:
    """Exporting while a slow kernel still writes: torch's stream waits for it."""
    torch = pytest.importorskip("torch")
    x = cuda.zeros((N,), name="x")
    stream = cuda.stream()
    stream.run(slow_fill[N // 256, 256](x.mut(), 4.0, N, CYCLES))
    t = torch.from_dlpack(x)  # torch passes its current stream
    total = t.sum()
    torch.cuda.synchronize()
    assert total.item() == 4.0 * N


def test_dlpack_copy_is_made_after_the_writes_queued_on_another_stream(cuda: sg.Device) -> None:
    """copy=True while a slow kernel still writes the tensor on another stream: the copy (made by
    scopegraph on its setup stream) holds what the kernel wrote."""
    torch = pytest.importorskip("torch")
    x = cuda.zeros((N,), name="x")
    stream = cuda.stream()
    stream.run(slow_fill[N // 256, 256](x.mut(), 4.0, N, CYCLES))
    t = torch.from_dlpack(x, copy=True)
    assert t.data_ptr() != x.data_ptr
    total = t.sum()
    torch.cuda.synchronize()
    assert total.item() == 4.0 * N


def _filled_late(value: float) -> tuple[Any, Any]:
    """A torch tensor that a side stream of torch's fills with ``value`` after a spin, and that stream."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(N, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(CYCLES)
        t.fill_(value)
    return t, side


def test_dlpack_import_waits_for_the_producer(cuda: sg.Device) -> None:
    """Importing while torch's stream still writes: the wrapper is ready on every stream."""
    torch = pytest.importorskip("torch")
    t, side = _filled_late(6.0)
    with torch.cuda.stream(side):
        x = sg.Tensor.from_dlpack(t, name="x")  # producer stream: `side`
    out = cuda.zeros((N,), name="out")
    stream = cuda.stream()
    stream.run(sg.memcpy(out.mut(), x))
    stream.sync()
    np.testing.assert_array_equal(out.numpy(), 6.0)


def test_numpy_waits_for_the_work_queued_on_the_tensor_on_any_stream(cuda: sg.Device) -> None:
    """DESIGN section 1: numpy() "waits for pending work that writes x", with no sync of the
    user's: an eager write on a stream of its own, and a replay launched on another stream."""
    x = cuda.zeros((N,), name="x")
    writer, other = cuda.stream(), cuda.stream()
    writer.run(slow_fill[N // 256, 256](x.mut(), 3.0, N, CYCLES))
    np.testing.assert_array_equal(x.numpy(), 3.0)
    with CudaGraph.scope(writer) as s:
        s.record(slow_fill[N // 256, 256](x.mut(), 5.0, N, CYCLES))
    with s.graph as graph:
        graph.launch(stream=other)
        np.testing.assert_array_equal(x.numpy(), 5.0)


def test_memory_scopegraph_borrowed_is_never_freed_by_it(cuda: sg.Device) -> None:
    """A wrapper of torch's memory, used by a graph, freed, dropped and collected: torch's memory
    is not handed out again (new scopegraph tensors filled with -7 would overwrite it)."""
    torch = pytest.importorskip("torch")
    t = torch.full((N,), 4.0, device="cuda")
    x = sg.Tensor.from_dlpack(t, name="t")
    out = cuda.zeros((N,), name="out")
    stream = cuda.stream()
    with CudaGraph.scope(stream) as s:
        s.record(sg.memcpy(out.mut(), x))
    with s.graph as graph:
        graph.launch()
        graph.sync()
    x.free()
    del x, s, graph
    gc.collect()
    fresh = [cuda.full((N,), -7.0) for _ in range(16)]
    torch.cuda.synchronize()
    assert torch.all(t == 4.0).item() and all(f.data_ptr != t.data_ptr() for f in fresh)


class _OnlyCai:
    """A producer that speaks only __cuda_array_interface__ (version 3, with its stream)."""

    def __init__(self, t: Any, stream: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
            "strides": None,
            "stream": stream,
        }
        self.keep = t


def test_cuda_array_interface_exchanges_streams_both_ways(cuda: sg.Device) -> None:
    """Import: the producer's stream (still writing) is waited for; the wrapper is one allocation
    with a DLPack wrapper of the same memory. Export: a consumer (CuPy) that reads the tensor while
    a slow kernel still writes it sees the final values."""
    t, side = _filled_late(6.0)
    x = sg.Tensor.from_dlpack(_OnlyCai(t, side.cuda_stream), name="x")
    out = cuda.zeros((N,), name="out")
    stream = cuda.stream()
    stream.run(sg.memcpy(out.mut(), x))
    stream.sync()
    np.testing.assert_array_equal(out.numpy(), 6.0)
    same = sg.Tensor.from_dlpack(t, name="same")
    with pytest.raises(sg.BorrowError):
        sg.memcpy(x.mut(), same)
    cp = pytest.importorskip("cupy")
    y = cuda.zeros((N,), name="y")
    stream.run(slow_fill[N // 256, 256](y.mut(), 2.0, N, CYCLES))
    total = float(cp.asarray(y).sum())  # through __cuda_array_interface__ and its stream
    assert total == 2.0 * N


def test_zero_byte_copies_build_and_run(cuda: sg.Device) -> None:
    """Issue 8 case 6: a 0-byte memcpy or memset is no work, not CUDA_ERROR_INVALID_VALUE."""
    x = cuda.full((8,), 2.0, name="x")
    stream = cuda.stream()
    with CudaGraph.scope(stream) as s:
        s.record(sg.memcpy(x[0:0].mut(), x[4:4]))
        s.record(sg.memset(x[3:3].mut(), 9.0))
        s.record(library.add_scalar_op(x.mut(), 1.0))
    with s.graph as g:
        g.launch()
        g.sync()
    stream.run(sg.memcpy(x[0:0].mut(), x[8:8]))
    stream.sync()
    np.testing.assert_array_equal(x.numpy(), 3.0)


def test_kernel_with_an_include_path_runs(cuda: sg.Device, tmp_path: object) -> None:
    """Issue 8 case 6: include_path kernels compile (the headers are in the cache key) and run."""
    import pathlib

    root = pathlib.Path(str(tmp_path))
    (root / "twice.h").write_text("__device__ inline float twice(float v) { return 2.0f * v; }\n")
    source = (
        '#include "twice.h"\n'
        'extern "C" __global__ void doubler(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = twice(x[i]); }\n'
    )

    @sg.kernel(source, options={"include_path": [str(root)]}, touches={"x": "n"})
    def doubler(x: Mut[Tensor], n: sg.i32) -> None: ...

    x = cuda.full((32,), 3.0)
    stream = cuda.stream()
    stream.run(doubler[1, 32](x.mut(), 32))
    stream.sync()
    np.testing.assert_array_equal(x.numpy(), 6.0)


def test_launch_limits_are_checked_before_the_gpu_sees_them(cuda: sg.Device) -> None:
    """Issue 8 case 7: the host backend and the GPU refuse the same launches, when they are built."""
    x = cuda.zeros((4,), name="x")
    for grid, block in (((1,), (2048,)), ((1,), (32, 32, 2)), ((1, 70000), (32,))):
        with pytest.raises(sg.SignatureError):
            library.fill[grid, block](x.mut(), 1.0, 4)
    with pytest.raises(sg.SignatureError, match="cannot hold exactly"):
        library.fill[1, 32](x.mut(), 1.0, 2**40)


def test_free_is_refused_while_a_wrapper_of_the_memory_lives(cuda: sg.Device) -> None:
    """A wrapper made through DLPack would dangle (and keep a stale freeze) after free()."""
    t = cuda.zeros((8,), name="t")
    a = sg.Tensor.from_dlpack(t, name="a")
    a.freeze()
    with pytest.raises(sg.LifetimeError, match="another tensor wraps the same memory"):
        t.free()
    del a
    gc.collect()
    t.free()
    fresh = cuda.zeros((8,))  # may reuse t's memory: no stale freeze follows it
    cuda.stream().run(library.fill_op(fresh.mut(), 1.0))


def test_eager_work_waits_for_each_closed_replay_on_one_stream(cuda: sg.Device) -> None:
    """Two graphs read `inp`, replayed on one stream and closed in turn; eager work on a side stream
    waited for the first one's replay (before the second was recorded). The second one's replay
    still reads `inp` (it spins first) when the side stream overwrites `inp` again: that write
    waits for it. (The streams that caught up with the first closed replay on that stream were
    taken as caught up with the second one too.)"""
    home, side = cuda.stream(), cuda.stream()
    inp = cuda.full((N,), 1.0, name="inp")
    first_out, second_out = cuda.zeros((N,), name="first_out"), cuda.zeros((N,), name="second_out")
    with CudaGraph.scope(home) as s:
        s.record(slow_copy[N // 256, 256](first_out.mut(), inp, N, 0))
    with s.graph as first:
        first.launch()
    side.run(sg.memset(inp.mut(), 2.0))  # waits for the first replay
    with CudaGraph.scope(home) as s:
        s.record(slow_copy[N // 256, 256](second_out.mut(), inp, N, CYCLES))
    with s.graph as second:
        second.launch()  # waits for the memset, then spins, then reads 2.0
    side.run(sg.memset(inp.mut(), 9.0))  # must wait for the second replay
    for stream in (home, side):
        stream.sync()
    np.testing.assert_array_equal(second_out.numpy(), 2.0)
    np.testing.assert_array_equal(inp.numpy(), 9.0)


def test_a_graph_closed_while_a_scope_records_a_write_of_its_memory_is_waited_for(cuda: sg.Device) -> None:
    """A graph that reads `inp` is replayed (it spins, then reads) and closed while a scope on
    another stream records a write of `inp`: the new graph's first replay waits for the closed
    graph's replay, which copies the old values."""
    a, b = cuda.stream(), cuda.stream()
    inp, out = cuda.full((N,), 1.0, name="inp"), cuda.zeros((N,), name="out")
    with CudaGraph.scope(a) as s:
        s.record(slow_copy[N // 256, 256](out.mut(), inp, N, CYCLES))
    reader = s.graph
    reader.launch()
    with CudaGraph.scope(b) as s:
        s.record(sg.memset(inp.mut(), 5.0))
        reader.close()  # its replay still runs
    with s.graph as writer:
        writer.launch()
        for stream in (a, b):
            stream.sync()
    np.testing.assert_array_equal(out.numpy(), 1.0)
    np.testing.assert_array_equal(inp.numpy(), 5.0)


def test_graphs_sharing_bytes_through_a_wrapper_made_later_are_ordered(cuda: sg.Device) -> None:
    """A graph reads the second half of a torch buffer through one wrapper; a wrapper made later
    covers the middle of the buffer, and a graph writes through it. The writer's replay waits for
    the reader's, which spins before it reads. (The write starts outside the reader's wrapper, so
    the writer was not taken to write what the reader holds, and neither waited for the other.)"""
    torch = pytest.importorskip("torch")
    base = torch.zeros(2 * N, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    second_half = sg.Tensor.from_dlpack(base[N:], name="second_half")
    a, b = cuda.stream(), cuda.stream()
    out = cuda.full((N,), 7.0, name="out")
    with CudaGraph.scope(a) as s:
        s.record(slow_copy[N // 256, 256](out.mut(), second_half, N, CYCLES))
    reader = s.graph
    middle = sg.Tensor.from_dlpack(base[N // 2 : N // 2 + N], name="middle")
    with CudaGraph.scope(b) as s:
        s.record(sg.memset(middle.mut(), 5.0))
    writer = s.graph
    with reader, writer:
        reader.launch()
        writer.launch()
        for stream in (a, b):
            stream.sync()
    np.testing.assert_array_equal(out.numpy(), 0.0)  # read before the write
    np.testing.assert_array_equal(base[N // 2 : N // 2 + N].cpu().numpy(), 5.0)


def test_a_graph_waits_for_eager_work_through_a_wrapper_dropped_since(cuda: sg.Device) -> None:
    """Eager work on a side stream fills the middle of a torch buffer through a wrapper (slowly),
    and the wrapper is dropped; a graph that reads the second half through another wrapper then
    replays on its own stream: it waits for the fill. (The side stream was noted only on the
    dropped wrapper.)"""
    torch = pytest.importorskip("torch")
    base = torch.zeros(2 * N, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    second_half = sg.Tensor.from_dlpack(base[N:], name="second_half")
    side, home = cuda.stream(), cuda.stream()
    middle = sg.Tensor.from_dlpack(base[N // 2 : N // 2 + N], name="middle")
    side.run(slow_fill[N // 256, 256](middle.mut(), 4.0, N, CYCLES))
    del middle
    gc.collect()
    out = cuda.zeros((N,), name="out")
    with CudaGraph.scope(home) as s:
        s.record(sg.memcpy(out.mut(), second_half))
    with s.graph as graph:
        graph.launch()
        for stream in (home, side):
            stream.sync()
    want = np.concatenate([np.full(N // 2, 4.0, np.float32), np.zeros(N // 2, np.float32)])
    np.testing.assert_array_equal(out.numpy(), want)


def test_a_rebind_that_stops_a_graph_writing_memory_keeps_its_replay_ordered(cuda: sg.Device) -> None:
    """A graph fills the first half of `whole` slowly (it spins first) and reads the second half;
    it is replayed, then rebound to fill another tensor: it still reads `whole`, but writes it no
    more. A graph that reads the first half, replayed on another stream, waits for that replay.
    (Re-pinned, the graph no longer counted as writing `whole`, and the reader stopped waiting.)"""
    a, b = cuda.stream(), cuda.stream()
    whole = cuda.zeros((2 * N,), name="whole")
    first, second = whole[:N], whole[N:]
    elsewhere, copied, out = cuda.zeros((N,), name="elsewhere"), cuda.zeros((N,), name="copied"), cuda.zeros((N,))
    with CudaGraph.scope(a) as s:
        s.record(slow_fill[N // 256, 256](first.mut(), 3.0, N, CYCLES))
        s.record(sg.memcpy(copied.mut(), second))
    writer = s.graph
    with CudaGraph.scope(b) as s:
        s.record(sg.memcpy(out.mut(), first))
    reader = s.graph
    with writer, reader:
        writer.launch()
        writer.rebind({first: elsewhere})
        reader.launch()
        for stream in (a, b):
            stream.sync()
    np.testing.assert_array_equal(out.numpy(), 3.0)


# -- a bounded loop's overrun report (scopegraph._control): its counter is read and reset by
# graph.sync() after the replays, with copies the graph's streams do not order


BOUND = 3


def _stuck_loop(s: sg.Scope, flag: Tensor, x: Tensor, cycles: int, tail: Tensor | None = None) -> None:
    """A loop that never clears its flag: each replay stops at BOUND iterations of x += 1."""
    with s.while_(flag, max_iterations=BOUND) as body:
        body.record(slow_increment[1, 1](x.mut(), cycles))
    if tail is not None:  # a slow node after the loop
        s.record(slow_increment[1, 1](tail.mut(), CYCLES // 2))


@pytest.mark.parametrize("case", ["finished", "in flight", "rebuilt"])
def test_recording_into_a_graph_keeps_the_overrun_of_an_earlier_replay(cuda: sg.Device, case: str) -> None:
    """A replay of the first recording stopped its loop at the bound; `into=` then took a new
    recording, with a counter of its own: in place (the replay done or still running) or rebuilt.
    The next graph.sync() still reports the first replay's overrun."""
    stream = cuda.stream()
    flag = cuda.from_numpy(np.array([1], np.int32), name="stuck")
    x, y = cuda.zeros((1,), name="x"), cuda.zeros((1,), name="y")
    cycles = CYCLES // 4 if case == "in flight" else 0
    with CudaGraph.scope(stream) as s:
        _stuck_loop(s, flag, x, cycles)
    graph = s.graph
    graph.launch()
    if case != "in flight":
        stream.sync()  # reports nothing, as documented: graph.sync() does
    with CudaGraph.scope(stream, into=graph) as again:
        _stuck_loop(again, flag, x, cycles, y if case == "rebuilt" else None)
    assert graph.last_update == ("rebuilt" if case == "rebuilt" else "whole")
    with pytest.raises(sg.LoopLimitError):
        graph.sync()
    graph.close()


@pytest.mark.parametrize("late", [False, True], ids=["reset during the loop", "reset after it"])
def test_a_launch_from_another_thread_during_sync_keeps_its_bound_and_its_report(
    cuda: sg.Device, late: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread launches the graph while graph.sync() has read the loop's counter and not yet
    reset it: the reset must not land in that replay (its loop would run past the bound, or its
    overrun go unreported)."""
    stream = cuda.stream()
    flag = cuda.from_numpy(np.array([1], np.int32), name="stuck")
    x, y = cuda.zeros((1,), name="x"), cuda.zeros((1,), name="y")
    with CudaGraph.scope(stream) as s:
        _stuck_loop(s, flag, x, 0 if late else CYCLES // 5, y if late else None)
    graph = s.graph
    graph.launch()
    backend, write = cuda.backend, type(cuda.backend).write
    launcher: list[threading.Thread] = []

    def reset(tensor: Tensor, array: Any, on: Any) -> None:  # the counter's reset: another launch first
        monkeypatch.undo()
        launcher.append(threading.Thread(target=graph.launch))
        launcher[0].start()
        time.sleep(0.02 if late else 0.005)
        write(backend, tensor, array, on)

    monkeypatch.setattr(backend, "write", reset)
    with pytest.raises(sg.LoopLimitError):
        graph.sync()  # the first replay's overrun
    launcher[0].join()
    with pytest.raises(sg.LoopLimitError):
        graph.sync()  # the second one's
    assert x.numpy()[0] == 2 * BOUND  # each replay ran the loop exactly BOUND times
    graph.close()


def test_a_replay_waits_for_an_import_made_ready_on_another_stream(cuda: sg.Device) -> None:
    """Tensor.from_dlpack(t, stream=S) makes torch's pending write visible on S only: a graph over
    the wrapper, launched on another stream, waits for S as it would for eager work there."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(N, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(CYCLES)  # the producer writes late
        t.fill_(6.0)
        x = sg.Tensor.from_dlpack(t, name="x", stream=cuda.stream())
    np.testing.assert_array_equal(copied_by_a_graph(cuda.stream(), x, cuda.zeros((N,), name="out")), 6.0)


PER_THREAD = """
import time, torch, scopegraph as sg
stream = sg.Stream.from_handle(torch.cuda.current_stream())  # the device is set up by now
torch.cuda.synchronize()
torch.cuda._sleep(400_000_000)  # about 0.2 s of work on torch's default (legacy) stream
start = time.perf_counter()
stream.sync()
print(time.perf_counter() - start)
"""


def test_handle_0_is_the_legacy_default_stream_under_per_thread_default_streams() -> None:
    """With CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, cuda.bindings reads handle 0 as the
    thread's per-thread stream; torch means the legacy one, and a sync must wait for its work."""
    pytest.importorskip("torch")
    env = child_env(CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    done = subprocess.run([sys.executable, "-c", PER_THREAD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) > 0.1  # it waited for torch's work


class _OnTheSecondGpu:
    """What an array of cuda:1 shows before it is imported."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 1)

    def __dlpack__(self, **kwargs: Any) -> object:
        raise AssertionError("refused before the import")


def test_an_import_on_a_stream_of_another_gpu_is_refused(cuda: sg.Device) -> None:
    stream = cuda.stream()
    refused = r"(?s)cannot import memory of cuda:1 on .*\nhelp: pass a stream of cuda:1"
    with pytest.raises(sg.SignatureError, match=refused):
        sg.Tensor.from_dlpack(_OnTheSecondGpu(), stream=stream)
    assert_stream_usable(stream)


def test_closed_graphs_let_their_streams_go_and_later_work_still_waits_for_their_replays(cuda: sg.Device) -> None:
    """Graphs that read a long-lived `inp` (weights, say), each replayed on a fresh stream and
    closed while its replay still spins: `inp` keeps an event of each replay, not its stream, and
    drops the events that have passed. The streams can be collected, and a write of `inp` from
    another stream still waits for the replays that run. (`inp` kept every stream alive, and a new
    graph's first replay waited on each of them.)"""
    import weakref

    inp = cuda.full((N,), 1.0, name="inp")
    outs = [cuda.zeros((N,), name=f"out{i}") for i in range(8)]
    streams = []
    for i, out in enumerate(outs):
        stream = cuda.stream()
        streams.append(weakref.ref(stream.native))
        with CudaGraph.scope(stream) as s:
            s.record(slow_copy[N // 256, 256](out.mut(), inp, N, CYCLES if i == len(outs) - 1 else 0))
        s.graph.launch()
        if i < len(outs) - 1:
            s.graph.sync()  # its replay passes before the next graph closes
        s.graph.close()  # the last one's replay still spins
        del s, stream
    assert len(inp.allocation.users) <= 2  # the last replay's event, and the stream that filled `inp`
    writer = cuda.stream()
    writer.run(sg.memset(inp.mut(), 5.0))  # waits for the last replay, which spins, then reads 1.0
    writer.sync()
    np.testing.assert_array_equal(outs[-1].numpy(), 1.0)
    np.testing.assert_array_equal(inp.numpy(), 5.0)
    gc.collect()  # (the backend names the last work's stream in a fault's message: the writer's now)
    assert [ref() for ref in streams] == [None] * len(streams)
