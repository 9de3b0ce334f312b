"""Captured regions (issue 12, DESIGN.md section 9): another library's GPU work as one child-graph
node, ordered by its declared borrows, with every refusal a ScopeGraphError and the stream usable
after it. Backend-independent tests run on both backends (on CUDA the "foreign" work is a kernel
launched with cuda.core itself on the region's stream); PyTorch and CuPy tests need a GPU and skip
without the library."""

from __future__ import annotations

import collections
import functools
import gc
import re
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, _capture, library

from .helpers import assert_stream_usable, cupy_on

NDArray = np.ndarray[Any, np.dtype[Any]]

SCALE = r"""
extern "C" __global__ void foreign_scale(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


@functools.cache
def _foreign_kernel(arch: str) -> Any:
    from cuda.core import Program, ProgramOptions

    return Program(SCALE, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("foreign_scale")


def foreign_scale(region: sg.Region, out: sg.Tensor, x: sg.Tensor, a: float) -> None:
    """``out = a * x`` as "another library" would launch it: cuda.core directly, on the region's stream."""
    from cuda.core import Device, LaunchConfig, launch

    n = x.size
    kernel = _foreign_kernel(f"sm_{Device(out.device.index).arch}")
    launch(
        region.stream,
        LaunchConfig(grid=(n + 255) // 256, block=256),
        kernel,
        out.data_ptr,
        x.data_ptr,
        np.float32(a),
        np.int32(n),
    )


def scale_region(s: sg.Scope | sg.Body, out: sg.Tensor, x: sg.Tensor, a: float, name: str = "scale") -> sg.Region:
    """``out = a * x`` as foreign work captured into a scope or a loop or branch body (cuda.core's
    own launch on the region's stream; numpy on the host backend)."""
    with s.capture(
        reads=[x], writes=[out.mut()], name=name, host=lambda o, i: np.multiply(i, np.float32(a), out=o)
    ) as region:
        if region.capturing:
            foreign_scale(region, out, x, a)
    return region


# -- on both backends ---------------------------------------------------------------------------


def test_a_region_is_one_node_ordered_by_its_borrows(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x0 = np.arange(1000, dtype=np.float32)
    src = dev.from_numpy(x0, name="src")
    a = dev.zeros((1000,), name="a")
    mid = dev.zeros((1000,), name="mid")
    y = dev.zeros((1000,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memcpy(a.mut(), src))  # 0: a = src
        s.record(library.add_scalar_op(a.mut(), 1.0))  # 1: a += 1
        region = scale_region(s, mid, a, 3.0)  # 2: mid = 3a (foreign)
        s.record(library.add_op(y.mut(), mid, a))  # 3: y = mid + a
        s.record(library.add_scalar_op(a.mut(), 100.0))  # 4: a += 100, after the region read a
    graph = s.graph
    assert region.node is not None and region.node.index == 2
    nodes = graph.nodes
    assert [type(n.op).__name__ for n in nodes] == [
        "Memcpy",
        "KernelLaunch",
        "Captured",
        "KernelLaunch",
        "KernelLaunch",
    ]
    assert nodes[2].deps == {1}
    assert 2 in nodes[3].deps and 2 in nodes[4].deps | set().union(*(nodes[d].deps for d in nodes[4].deps))
    assert "capture:scale(mut mid, a)" in graph.to_dot()
    for step in range(3):
        sg_stream.run(sg.memcpy(src.mut(), dev.from_numpy(x0 + step)))
        graph.launch()
        graph.sync()
        np.testing.assert_allclose(y.numpy(), 4 * (x0 + step + 1))
        np.testing.assert_allclose(a.numpy(), x0 + step + 101)
    graph.close()


def test_a_region_of_one_graph_recorded_into_another(sg_stream: sg.Stream) -> None:
    """Unlike a loop's bodies, a region's captured work is copied into each graph that records it
    (and neither graph can rebind it), so two graphs may share its node."""
    dev = sg_stream.device
    x, y = dev.full((256,), 2.0, name="x"), dev.zeros((256,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        region = scale_region(s, y, x, 3.0)
    with CudaGraph.scope(sg_stream) as again:
        again.record(library.fill_op(x.mut(), 5.0))
        again.record(region.op)
    with s.graph as first, again.graph as second:
        second.launch()
        second.sync()
        np.testing.assert_array_equal(y.numpy(), 15.0)
        first.launch()
        first.sync()
        np.testing.assert_array_equal(y.numpy(), 15.0)  # x is 5 now
    assert_stream_usable(sg_stream)


def test_the_first_region_may_be_recorded_on_the_setup_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The foreign scratch token is made when a device's first region is: it ran sg.zeros on the
    device's setup stream, which a scope recording there refused (ScopeStateError about an op the
    user never ran)."""
    monkeypatch.setattr(_capture, "_scratch", {})  # no region made yet in this process
    dev = sg.device("host")
    a = dev.zeros((4,), name="a")
    with CudaGraph.scope(dev.setup_stream) as s, s.capture(writes=[a.mut()], host=lambda a: a.fill(2.0)):
        pass
    with s.graph as graph:
        graph.launch()
    np.testing.assert_array_equal(a.numpy(), 2.0)


def test_regions_run_one_at_a_time_and_beside_independent_kernels(sg_stream: sg.Stream) -> None:
    """Regions whose declared borrows are disjoint still run one after another: the libraries they
    capture share scratch memory scopegraph cannot see (cuBLAS's workspace of the capture stream:
    two captured GEMMs at once corrupted each other on an H100). Each borrows its device's
    `foreign scratch` token mutably, which its label does not show; an independent kernel still
    runs beside them."""
    dev = sg_stream.device
    x = dev.from_numpy(np.ones(256, np.float32), name="x")
    outs = [dev.zeros((256,), name=f"o{i}") for i in range(3)]
    y = dev.zeros((256,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        for i, o in enumerate(outs):
            scale_region(s, o, x, float(i + 1), name=f"s{i}")
        s.record(library.fill_op(y.mut(), 1.0))
    with s.graph as graph:
        assert [n.deps for n in graph.nodes] == [set(), {0}, {1}, set()]
        assert graph.nodes[1].op.label().startswith("capture:s1(mut o1, x)")  # [n nodes] on a GPU
        assert '[label="foreign scratch"]' in graph.to_dot()
        graph.launch()
        graph.sync()
        for i, o in enumerate(outs):
            np.testing.assert_allclose(o.numpy(), np.full(256, i + 1.0))


@pytest.mark.parametrize("case", ["write-read overlap", "two writes", "frozen write"])
def test_declared_borrows_are_checked_at_the_capture_line(sg_stream: sg.Stream, case: str) -> None:
    dev = sg_stream.device
    x = dev.zeros((1024,), name="x")
    w = dev.zeros((16,), name="w").freeze()
    if case == "write-read overlap":
        kwargs: dict[str, Any] = {"reads": [x[256:768]], "writes": [x[0:512].mut()]}
        message = "cannot borrow `x[256:768]` as immutable because it is also borrowed as mutable in `capture:bad`"
    elif case == "two writes":
        kwargs = {"writes": [x[0:512].mut(), x[500:600].mut()]}
        message = "as mutable more than once"
    else:
        kwargs = {"reads": [x], "writes": [w.mut()]}
        message = "cannot borrow `w` as mutable in `capture:bad`: it is frozen"
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.BorrowError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
            s.capture(name="bad", host=lambda *a: None, **kwargs)
        assert any(str(e.path).endswith("test_capture.py") and "s.capture(" in str(e.statement) for e in info.traceback)
        s.record(library.fill_op(x.mut(), 1.0))  # the scope goes on
    assert len(s.graph.nodes) == 1
    s.graph.close()
    assert_stream_usable(sg_stream)


def test_refusals_around_the_region(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x, y = dev.zeros((64,), name="x"), dev.zeros((64,), name="y")
    host = functools.partial(np.copyto)
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.SignatureError, match="declares no writes"):
            s.capture(reads=[x], writes=[], host=host)
        with pytest.raises(sg.SignatureError, match="take lists of tensors"):
            s.capture(writes=y.mut(), host=host)  # type: ignore[arg-type]
        with pytest.raises(sg.SignatureError, match="needs a mutable borrow"):
            s.capture(writes=[y], host=host)  # type: ignore[list-item]
        with pytest.raises(sg.SignatureError, match="via='numba' is not a way of capturing"):
            s.capture(writes=[y.mut()], host=host, via="numba")
        with pytest.raises(sg.SignatureError, match="mode='loose' is not a capture mode"):
            s.capture(writes=[y.mut()], host=host, mode="loose")
        region = s.capture(reads=[x], writes=[y.mut()], host=host, name="copy")
        with region:
            with pytest.raises(sg.ScopeStateError, match=r"while the captured region opened at .* is open"):
                s.record(library.fill_op(x.mut(), 1.0))
            with pytest.raises(sg.ScopeStateError, match="while the captured region"):
                s.capture(reads=[y], writes=[x.mut()], host=host).__enter__()
            if region.capturing:
                foreign_scale(region, y, x, 1.0)
        with pytest.raises(sg.ScopeStateError, match="already used"):
            region.__enter__()
        op = region.op
    with pytest.raises(sg.NotAGraphNodeError, match="cannot run `capture:copy` eagerly"):
        sg_stream.run(op)
    with pytest.raises(sg.ScopeStateError, match="finished"):
        s.capture(reads=[y], writes=[x.mut()], host=host).__enter__()
    graph = s.graph
    with pytest.raises(sg.SignatureError, match=r"cannot rebind node 0 .*capture:copy") as info:
        graph.rebind({x: dev.zeros((64,), name="x2")})
    assert "it uses `x`" in str(info.value)  # the tensor the node uses now, not the one offered
    graph.close()
    assert_stream_usable(sg_stream)


def test_an_error_inside_the_region_leaves_the_scope_and_stream_usable(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x, y = dev.full((64,), 2.0, name="x"), dev.zeros((64,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.CaptureError) as info, s.capture(reads=[x], writes=[y.mut()], host=np.copyto):
            raise ValueError("the library failed")  # the same error on every backend
        assert "the capture of captured region `capture` failed: ValueError: the library failed" in str(info.value)
        assert isinstance(info.value.__cause__, ValueError)
        assert s.nodes == ()  # the region was not recorded
        scale_region(s, y, x, 5.0)
    with s.graph as graph:
        graph.launch()
        graph.sync()
        np.testing.assert_allclose(y.numpy(), np.full(64, 10.0))
    assert_stream_usable(sg_stream)


# -- host backend -------------------------------------------------------------------------------


def test_memory_dropped_while_a_region_captures_is_freed_after_it(sg_stream: sg.Stream) -> None:
    """Garbage collection may drop a tensor while a region captures (here, on purpose): its free
    waits for the capture's end, since the stream waits and frees it makes would invalidate the
    user's capture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at the next launch in the region)."""
    dev = sg_stream.device
    x, y = dev.full((256,), 3.0, name="x"), dev.zeros((256,), name="y")
    dropped = dev.zeros((1 << 20,), name="dropped")
    double = lambda o, i: np.multiply(i, np.float32(2), out=o)  # noqa: E731
    with CudaGraph.scope(sg_stream) as s, s.capture(reads=[x], writes=[y.mut()], host=double) as region:
        del dropped
        gc.collect()
        if region.capturing:
            foreign_scale(region, y, x, 2.0)
    assert not getattr(dev.backend, "_deferred", ())  # freed when the capture ended
    with s.graph as graph:
        graph.launch()
        np.testing.assert_array_equal(y.numpy(), np.full(256, 6.0))
    assert_stream_usable(sg_stream)


@pytest.mark.sg_cuda
def test_numpy_in_one_thread_while_another_thread_captures_a_region() -> None:
    """x.numpy() made a device-wide synchronisation, which the driver refuses while any stream
    captures (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and which invalidates that capture: both the
    read and the other thread's region failed. The read now waits for x's own writers then."""
    from cuda.bindings import driver  # a raw fill as another library's work (cuda.core has none)

    dev = sg.device("cuda")
    n = 1 << 16
    x, c = dev.full((n,), 1.0, name="x"), dev.zeros((n,), name="c")
    inside, read = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def capture() -> None:
        try:
            with CudaGraph.scope(dev.stream()) as s, s.capture(writes=[c.mut()]) as region:
                (err,) = driver.cuMemsetD32Async(c.data_ptr, 0x40400000, n, driver.CUstream(region.handle))  # 3.0f
                inside.set()
                read.wait(20)
            with s.graph as g:
                g.launch()
                g.sync()
            outcome["capture"] = err
        except Exception as exc:
            outcome["capture"] = exc
        finally:
            inside.set()

    def numpy() -> None:
        inside.wait(20)
        try:
            outcome["numpy"] = float(x.numpy()[0])
        except Exception as exc:
            outcome["numpy"] = exc
        finally:
            read.set()

    threads = [threading.Thread(target=capture), threading.Thread(target=numpy)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcome == {"capture": driver.CUresult.CUDA_SUCCESS, "numpy": 1.0}
    np.testing.assert_array_equal(c.numpy(), 3.0)


@pytest.mark.sg_cuda
def test_threads_each_capture_a_torch_region() -> None:
    """Four threads each record graphs holding a via="torch" region: PyTorch's capture of one
    thread synchronised the device while another's captured (cudaErrorIllegalState), and they
    shared one capture stream. They now take turns for the capture itself."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    n = 4096
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            stream = dev.stream()
            a, c = dev.full((n,), float(tid), name=f"a{tid}"), dev.zeros((n,), name=f"c{tid}")
            ta, tc = torch.from_dlpack(a), torch.from_dlpack(c)
            barrier.wait(30)
            for r in range(3):
                with CudaGraph.scope(stream) as s:
                    s.record(library.add_scalar_op(a.mut(), 1.0))
                    with s.capture(
                        reads=[a], writes=[c.mut()], via="torch", host=lambda c, a: np.multiply(a, 2, out=c)
                    ):
                        torch.mul(ta, 2.0, out=tc)
                with s.graph as g:
                    g.launch()
                    g.sync()
                np.testing.assert_array_equal(c.numpy(), 2.0 * (tid + r + 1))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures


@pytest.mark.sg_cuda
def test_captured_gemms_do_not_share_cublas_scratch_at_once() -> None:
    """Skinny GEMMs (split-K) use cuBLAS's workspace, one buffer per capture stream: two torch
    regions over disjoint, declared tensors ran as parallel branches of one graph (and two graphs
    of one region each replayed at once on two streams) and wrote each other's partial sums: every
    replay wrong on the H100. Regions now run one at a time, in a graph and across graphs."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    m, k, n = 16, 65536, 16
    a = [torch.randn(m, k, device="cuda", generator=gen) for _ in range(4)]
    b = [torch.randn(k, n, device="cuda", generator=gen) for _ in range(4)]
    c = [torch.zeros(m, n, device="cuda") for _ in range(4)]
    want = [(x.double() @ y.double()).float() for x, y in zip(a, b, strict=True)]
    sa, sb, sc = ([sg.Tensor.from_dlpack(t) for t in ts] for ts in (a, b, c))

    def region(s: sg.Scope, i: int) -> None:
        with s.capture(reads=[sa[i], sb[i]], writes=[sc[i].mut()], via="torch", name=f"mm{i}"):
            torch.mm(a[i], b[i], out=c[i])

    def errors(indices: range) -> float:
        return float(max(((c[i] - want[i]).abs().max() / want[i].abs().max()).item() for i in indices))

    with CudaGraph.scope(dev.stream()) as s:  # one graph, dataflow order: the regions are independent
        region(s, 0)
        region(s, 1)
    graphs = []
    for i in (2, 3):  # two graphs, one region each, on two streams
        with CudaGraph.scope(dev.stream()) as own:
            region(own, i)
        graphs.append(own.graph)
    with s.graph as g:
        worst = 0.0
        for _ in range(10):
            g.launch()
            for other in graphs:
                other.launch()
            g.sync()
            for other in graphs:
                other.sync()
            worst = max(worst, errors(range(4)))
    for other in graphs:
        other.close()
    assert worst < 1e-4, worst


@pytest.mark.sg_cuda
def test_torch_gemm_regions_capture_on_every_thread() -> None:
    """PyTorch keeps a cuBLAS handle per thread: cuBLAS was warmed up on the capture stream by the
    first thread only, so a GEMM region recorded on another thread failed
    (CUBLAS_STATUS_NOT_INITIALIZED), and the first thread's next one then allocated its workspace
    during the capture. Each thread now warms its own handle before its first capture."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    a = torch.arange(16 * 64, device="cuda", dtype=torch.float32).reshape(16, 64) % 7
    b = torch.arange(64 * 16, device="cuda", dtype=torch.float32).reshape(64, 16) % 5
    want = (a.double() @ b.double()).float().cpu().numpy()

    def record_and_run(tag: str) -> None:
        c = torch.zeros(16, 16, device="cuda")
        sa, sb, sc = (sg.Tensor.from_dlpack(t) for t in (a, b, c))
        with CudaGraph.scope(dev.stream()) as s, s.capture(reads=[sa, sb], writes=[sc.mut()], via="torch", name=tag):
            torch.mm(a, b, out=c)
        with s.graph as g:
            g.launch()
            g.sync()
        np.testing.assert_array_equal(sc.numpy(), want)

    record_and_run("main")
    failures: list[BaseException] = []

    def worker(tag: str) -> None:
        try:
            record_and_run(tag)
        except BaseException as exc:
            failures.append(exc)

    for i in range(2):  # one after another: each a thread of its own
        thread = threading.Thread(target=worker, args=(f"worker{i}",))
        thread.start()
        thread.join(60)
    record_and_run("main again")
    assert not failures, failures


@pytest.mark.sg_cuda
def test_a_torch_region_inside_a_torch_region_is_refused_not_a_hang() -> None:
    """The lock that makes threads take turns for PyTorch captures would wait for itself."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    a, c, d = dev.full((64,), 1.0, name="a"), dev.zeros((64,), name="c"), dev.zeros((64,), name="d")
    ta, tc, td = (torch.from_dlpack(t) for t in (a, c, d))
    outer = pytest.raises(sg.CaptureError, match=r"already capturing on this thread")
    with outer, CudaGraph.scope(dev.stream()) as s, s.capture(reads=[a], writes=[c.mut()], via="torch"):
        torch.mul(ta, 2.0, out=tc)
        with CudaGraph.scope(dev.stream()) as inner, inner.capture(reads=[a], writes=[d.mut()], via="torch"):
            torch.mul(ta, 3.0, out=td)
    with CudaGraph.scope(dev.stream()) as again, again.capture(reads=[a], writes=[c.mut()], via="torch"):
        torch.mul(ta, 2.0, out=tc)  # the lock was let go
    with again.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(c.numpy(), 2.0)


@pytest.mark.sg_cuda
def test_numpy_during_another_threads_global_capture_is_refused_not_a_broken_capture() -> None:
    """A mode="global" capture forbids every thread's synchronisation: numpy() then says so,
    and the capture goes on."""
    from cuda.bindings import driver

    dev = sg.device("cuda")
    x, c = dev.full((64,), 1.0, name="x"), dev.zeros((64,), name="c")
    inside, read = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def numpy() -> None:
        inside.wait(20)
        try:
            x.numpy()
        except BaseException as exc:
            seen.append(exc)
        finally:
            read.set()

    reader = threading.Thread(target=numpy)
    reader.start()
    with CudaGraph.scope(dev.stream()) as s, s.capture(writes=[c.mut()], mode="global") as region:
        (err,) = driver.cuMemsetD32Async(c.data_ptr, 0x40400000, 64, driver.CUstream(region.handle))  # 3.0f
        inside.set()
        read.wait(20)
    reader.join(20)
    assert err == driver.CUresult.CUDA_SUCCESS
    assert len(seen) == 1 and isinstance(seen[0], sg.ScopeStateError) and 'mode="global"' in str(seen[0])
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(c.numpy(), 3.0)
    np.testing.assert_array_equal(x.numpy(), 1.0)


@pytest.mark.sg_cuda
def test_memory_another_thread_drops_during_a_global_capture_is_freed_after_it() -> None:
    """A capture in mode "global" forbids the event records and queries of a free on every thread,
    not only on its own: foreign memory that another thread lets go of meanwhile (its free records
    an event on each stream that used it and asks which have passed) is freed at the capture's end."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    stream = dev.stream()
    x, y = dev.full((256,), 3.0, name="x"), dev.zeros((256,), name="y")
    dropped = [sg.Tensor.from_dlpack(torch.zeros(1 << 20, device="cuda"), name="dropped")]
    stream.run(sg.memset(dropped[0].mut(), 0.0))
    stream.sync()
    with CudaGraph.scope(stream) as s:
        with s.capture(reads=[x], writes=[y.mut()], mode="global") as region:
            foreign_scale(region, y, x, 1.0)
            dropper = threading.Thread(target=lambda: (dropped.pop(), gc.collect()))
            dropper.start()
            dropper.join()
            foreign_scale(region, y, y, 2.0)
        assert not dev.backend._deferred  # type: ignore[attr-defined]  # freed when the capture ended
    with s.graph as graph:
        graph.launch()
        np.testing.assert_array_equal(y.numpy(), np.full(256, 6.0))
    assert_stream_usable(stream)


def test_frees_a_capture_deferred_are_made_when_it_ends_on_any_thread() -> None:
    """The CUDA backend's deferral with stand-ins (so CI runs it): frees on the capturing thread
    wait for the capture's end, which may come on another thread (before, the count lived in the
    entering thread's locals: the exit raised, and that thread deferred every later free)."""
    from scopegraph._backends._cuda import CudaBackend

    freed: list[object] = []

    class Storage:
        def close(self, stream: object) -> None:
            freed.append(self)

    backend: Any = object.__new__(CudaBackend)
    backend.__dict__.update(
        _deferred=collections.deque(),
        _deferring={},
        _deferring_lock=threading.Lock(),
        memory_stream=types.SimpleNamespace(wait=lambda stream: None),
        make_current=lambda: None,
    )
    capturing = backend.defer_frees()
    backend.retire(Storage(), set(), False)
    assert freed == [] and len(backend._deferred) == 1
    ender = threading.Thread(target=backend.resume_frees, args=(capturing,))
    ender.start()
    ender.join()
    assert len(freed) == 1 and backend._deferring == {}
    backend.retire(Storage(), set(), False)  # this thread captures no more: freed at once
    assert len(freed) == 2
    everywhere = backend.defer_frees(every_thread=True)  # a capture in mode "global"
    other = threading.Thread(target=backend.retire, args=(Storage(), set(), False))
    other.start()
    other.join()
    assert len(freed) == 2 and len(backend._deferred) == 1
    backend.resume_frees(everywhere)
    assert len(freed) == 3 and backend._deferring == {}
    # A capture on this thread ends while a global one is still open: what it queued waits on (it
    # looped for ever, queueing the free again and again), and goes with the global one's end.
    everywhere, here = backend.defer_frees(every_thread=True), backend.defer_frees()
    backend.retire(Storage(), set(), False)
    backend.resume_frees(here)
    assert len(freed) == 3 and len(backend._deferred) == 1
    backend.resume_frees(everywhere)
    assert len(freed) == 4 and backend._deferring == {}


def test_the_host_backend_needs_a_host_callable() -> None:
    dev = sg.device("host")
    stream = dev.stream()
    y = dev.zeros((4,), name="y")
    with CudaGraph.scope(stream) as s:
        with pytest.raises(sg.NoHostReferenceError, match="captured region `gemm` has no host callable"):
            s.capture(writes=[y.mut()], name="gemm")
        with s.capture(writes=[y.mut()], name="fill", host=lambda y: y.fill(7)) as region:
            assert not region.capturing and region.stream is None and region.handle == 0
    with s.graph as graph:
        graph.launch()
        np.testing.assert_array_equal(y.numpy(), np.full(4, 7.0, np.float32))


def test_the_host_callable_gets_writable_writes_and_read_only_reads() -> None:
    dev = sg.device("host")
    stream = dev.stream()
    a, b = dev.from_numpy(np.ones((2, 3), np.float32), name="a"), dev.from_numpy(np.ones((3, 4), np.float32), name="b")
    c = dev.zeros((2, 4), name="c")
    seen: list[tuple[tuple[int, ...], bool]] = []

    def gemm(c: NDArray, a: NDArray, b: NDArray) -> None:
        seen.extend((v.shape, bool(v.flags.writeable)) for v in (c, a, b))
        np.matmul(a, b, out=c)

    with CudaGraph.scope(stream) as s, s.capture(reads=[a, b], writes=[c.mut()], host=gemm, name="gemm"):
        pass
    with s.graph as graph:
        graph.launch()
        assert seen == [((2, 4), True), ((2, 3), False), ((3, 4), False)]
        np.testing.assert_array_equal(c.numpy(), np.full((2, 4), 3.0, np.float32))


@pytest.mark.parametrize(
    "what, host, message",
    [
        ("writes a declared read", lambda c, a: a.__setitem__(0, 5.0), r"read-only"),
        ("indexes past a view", lambda c, a: c.__setitem__(7, 1.0), r"index 7 is out of bounds"),
        ("slices past a view", lambda c, a: c.__setitem__(slice(0, 8), a[:8]), r"slice \[:8\] reaches past axis 0"),
    ],
    ids=["read-only", "index", "slice"],
)
def test_a_host_callable_that_goes_past_its_views_is_a_bounds_error(
    what: str, host: Callable[[NDArray, NDArray], None], message: str
) -> None:
    """As for a kernel's host reference: an error naming the region and its tensors, with help,
    instead of numpy's bare ValueError or IndexError (or a silently clipped slice)."""
    dev = sg.device("host")
    stream = dev.stream()
    a, c = dev.zeros((4,), name="a"), dev.zeros((4,), name="c")
    with CudaGraph.scope(stream) as s, s.capture(writes=[c.mut()], reads=[a], host=host, name="bad_host"):
        pass
    with s.graph as graph:
        with pytest.raises(sg.BoundsError, match=message) as info:
            graph.launch()
        text = str(info.value)
        assert "captured region `bad_host`" in text and "writes c (4,)" in text and "reads a (4,)" in text, text
        assert "foreign scratch" not in text  # the ordering token is no view the callable got
        assert re.search(r"(?m)^help: \S", text), text
    np.testing.assert_array_equal(a.numpy(), 0.0)
    assert_stream_usable(stream)


def test_a_host_callable_that_fails_on_its_own_is_a_host_reference_error() -> None:
    """numpy's TypeError (a UFuncTypeError) and a KeyError from a region's host callable escaped
    bare at the replay."""
    dev = sg.device("host")
    stream = dev.stream()
    c = dev.zeros((4,), name="c")
    for host, message in (
        (lambda c: c + "x", r"raised UFuncTypeError"),
        (lambda c: dict[str, float]()["k"], r"raised KeyError"),
    ):
        with CudaGraph.scope(stream) as s, s.capture(writes=[c.mut()], host=host, name="buggy"):
            pass
        with s.graph as graph, pytest.raises(sg.HostReferenceError, match=message) as info:
            graph.launch()
        assert "host callable of captured region `buggy`" in str(info.value) and info.value.__cause__ is not None
    assert_stream_usable(stream)


@pytest.mark.parametrize("what", ["launch", "sync", "update", "rebind", "close", "read the edges of"])
def test_a_host_callable_that_touches_its_own_graph_is_refused(what: str) -> None:
    """The host backend runs a region's callable inside the graph's launch, which holds the
    graph's lock: a callable that launched, synced, updated, rebound or closed that graph waited
    for itself forever. It is a ScopeStateError now, and the graph replays again afterwards."""
    dev = sg.device("host")
    c = dev.zeros((4,), name="c")
    graphs: list[CudaGraph] = []
    touch = [True]

    def host(view: NDArray) -> None:
        view += 1.0
        if touch[0]:
            graph = graphs[0]
            actions: dict[str, Callable[[], object]] = {
                "launch": graph.launch,
                "sync": graph.sync,
                "update": lambda: graph.update(sg.memset(c.mut(), 0.0)),
                "rebind": lambda: graph.rebind({}),
                "close": graph.close,
                "read the edges of": lambda: graph.edges,
            }
            actions[what]()

    with CudaGraph.scope(dev.stream()) as s, s.capture(writes=[c.mut()], host=host):
        pass
    graphs.append(s.graph)
    with pytest.raises(sg.ScopeStateError, match=rf"cannot {what} graph #\d+ from inside its own replay"):
        s.graph.launch()
    touch[0] = False
    s.graph.launch()
    s.graph.sync()
    np.testing.assert_array_equal(c.numpy(), 2.0)
    s.graph.close()


# -- CUDA: PyTorch, CuPy, and the refusals the driver makes -------------------------------------


@pytest.mark.sg_cuda
def test_a_graph_keeps_what_its_captured_work_needs_alive() -> None:
    """Issue 12: "the region keeps whatever the captured graph needs alive for as long as the
    scopegraph graph lives": every name the capture used is dropped, torch's pool is churned,
    and the replays still compute what torch eager does."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    stream = dev.stream()
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((32, 48), dtype=np.float32)
    a, b, c = dev.from_numpy(A, name="a"), dev.from_numpy(B, name="b"), dev.zeros((64, 48), name="c")
    ta, tb, tc = torch.from_dlpack(a), torch.from_dlpack(b), torch.from_dlpack(c)
    with CudaGraph.scope(stream) as s, s.capture(reads=[a, b], writes=[c.mut()], via="torch", name="mm") as region:
        torch.matmul(ta, tb, out=tc)
    graph = s.graph
    del s, region, ta, tb, tc
    gc.collect()
    torch.cuda.empty_cache()
    churn = [torch.full((1 << 20,), -7.0, device="cuda") for _ in range(8)]
    want = (torch.from_numpy(A) @ torch.from_numpy(B)).numpy()
    with graph:
        for _ in range(3):
            graph.launch()
            graph.sync()
            np.testing.assert_allclose(c.numpy(), want, rtol=1e-4, atol=1e-3)
    del churn


@pytest.mark.sg_cuda
def test_torch_matmul_between_scopegraph_kernels() -> None:
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    stream = dev.stream()
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((32, 48), dtype=np.float32)
    a, b = dev.from_numpy(A, name="a"), dev.from_numpy(B, name="b")
    c, y = dev.zeros((64, 48), name="c"), dev.zeros((64, 48), name="y")
    ta, tb, tc = torch.from_dlpack(a), torch.from_dlpack(b), torch.from_dlpack(c)
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(a.mut(), 1.0))
        with s.capture(reads=[a, b], writes=[c.mut()], via="torch", name="matmul") as region:
            assert region.capturing and region.torch_stream is not None
            torch.matmul(ta, tb, out=tc)
        s.record(library.axpy_op(y.mut(), c, 2.0))
    op = region.op
    assert op.nodes_captured >= 1 and any(type(k).__name__ == "CUDAGraph" for k in op.kept)
    with s.graph as graph:
        for step in range(1, 4):
            graph.launch()
            graph.sync()
            ea = torch.from_numpy(A + step).cuda()
            want = torch.matmul(ea, torch.from_numpy(B).cuda())
            np.testing.assert_allclose(c.numpy(), want.cpu().numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(y.numpy(), 2 * sum(((A + k) @ B) for k in range(1, 4)), rtol=1e-3, atol=1e-2)
    assert_stream_usable(stream)


@pytest.mark.sg_cuda
@pytest.mark.parametrize("via", ["cuda", "torch"])
def test_a_region_that_captured_no_gpu_work_is_refused(via: str) -> None:
    """Work launched on another stream than the region's runs eagerly at record time and never at
    the replays; the region's node would be empty. Refused when the region ends, with help."""
    torch: Any = pytest.importorskip("torch") if via == "torch" else None
    dev = sg.device("cuda")
    stream = dev.stream()
    a, c = dev.zeros((64,), name="a"), dev.zeros((64,), name="c")
    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(a.mut(), 1.0))
        with (
            pytest.raises(sg.CaptureError, match="captured no GPU work") as info,
            s.capture(reads=[a], writes=[c.mut()], via=via, name="forgot"),
        ):
            if via == "cuda":
                dev.stream().run(library.add_op(c.mut(), a, a))  # on a stream of its own: eager
            else:
                torch.ones(64).add_(1)  # tensors on the CPU: nothing for the GPU to capture
        assert "help: launch the work inside the `with` block" in str(info.value)
        s.record(library.add_op(c.mut(), a, a))
    with s.graph as graph:
        assert len(graph.nodes) == 2
        graph.launch()
        graph.sync()
    np.testing.assert_array_equal(c.numpy(), 2.0)
    assert_stream_usable(stream)


@pytest.mark.sg_cuda
def test_a_region_opened_inside_another_librarys_capture_is_a_capture_error() -> None:
    """The region's capture cannot start while PyTorch captures on this thread (global mode):
    a CaptureError that says so, not PyTorch's or the driver's own exception. (PyTorch's own
    capture is invalidated by the attempt: its end raises PyTorch's error, outside scopegraph.)"""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    stream = dev.stream()
    a, c = dev.zeros((64,), name="a"), dev.zeros((64,), name="c")
    outer = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    scratch = torch.zeros(4, device="cuda")
    with CudaGraph.scope(stream) as s:
        with pytest.raises(Exception) as outer_end, torch.cuda.graph(outer, stream=side):
            scratch.add_(1)
            with (
                pytest.raises(sg.CaptureError, match="could not start") as info,
                s.capture(reads=[a], writes=[c.mut()], via="torch"),
            ):
                pass
        assert "help: end any capture already running" in str(info.value)
        assert not isinstance(outer_end.value, sg.ScopeGraphError)  # PyTorch's own, at its capture's end
    torch.cuda.synchronize()
    assert_stream_usable(stream)


@pytest.mark.sg_cuda
def test_cupy_kernel_between_scopegraph_kernels() -> None:
    cupy = pytest.importorskip("cupy")
    dev = sg.device("cuda")
    stream = dev.stream()
    x0 = np.linspace(-1, 1, 4096, dtype=np.float32)
    x, out = dev.from_numpy(x0, name="x"), dev.zeros((4096,), name="out")
    cx, cout = cupy.from_dlpack(x), cupy.from_dlpack(out)
    square_plus = cupy.ElementwiseKernel("float32 v", "float32 r", "r = v * v + 1.0f", "sg_square_plus")
    square_plus(cx, cout)  # compiled before the scope
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
        region = s.capture(reads=[x], writes=[out.mut()], name="square_plus")
        with region, cupy_on(region):
            square_plus(cx, cout)
        s.record(library.add_scalar_op(out.mut(), 0.5))
    with s.graph as graph:
        for step in range(1, 3):
            graph.launch()
            graph.sync()
            np.testing.assert_allclose(out.numpy(), (x0 + step) ** 2 + 1.5, rtol=1e-5)


def _refused(stream: sg.Stream, body: Any, match: str, via: str = "cuda", views: Any = None) -> None:
    """``body(region, x, y, *views(x, y))`` inside a region must be refused with a CaptureError
    matching ``match``; afterwards nothing is capturing and the stream is usable. Foreign views are
    made before the scope (DLPack export orders streams, which a capturing stream must not do)."""
    dev = stream.device
    x, y = dev.full((1024,), 2.0, name="x"), dev.zeros((1024,), name="y")
    extra = views(x, y) if views is not None else ()
    with pytest.raises(sg.CaptureError, match=match), CudaGraph.scope(stream) as s:  # noqa: SIM117 (the region needs s)
        with s.capture(reads=[x], writes=[y.mut()], via=via, name="bad") as region:
            body(region, x, y, *extra)
    from scopegraph._capture import capture_stream

    assert not dev.backend.captures(int(capture_stream(dev.backend).handle))
    assert_stream_usable(stream)


@pytest.mark.sg_cuda
def test_cupy_allocation_during_capture_is_refused() -> None:
    cupy = pytest.importorskip("cupy")
    stream = sg.device("cuda").stream()

    def body(region: sg.Region, x: sg.Tensor, y: sg.Tensor, cx: Any) -> None:
        with cupy_on(region):
            cx * 2  # a new array: CuPy allocates

    _refused(
        stream,
        body,
        "CuPy allocated 4096 bytes inside the captured region `bad`",
        views=lambda x, y: (cupy.from_dlpack(x),),
    )


@pytest.mark.sg_cuda
def test_torch_allocation_during_capture_is_refused() -> None:
    torch = pytest.importorskip("torch")
    stream = sg.device("cuda").stream()
    kept: list[Any] = []

    def body(region: sg.Region, x: sg.Tensor, y: sg.Tensor, tx: Any) -> None:
        kept.append(tx * 2)  # a new tensor that outlives the region

    _refused(
        stream,
        body,
        "allocated .* bytes during capture that are still in use",
        via="torch",
        views=lambda x, y: (torch.from_dlpack(x),),
    )


@pytest.mark.sg_cuda
def test_a_capture_that_fails_is_refused() -> None:
    torch = pytest.importorskip("torch")
    stream = sg.device("cuda").stream()

    def body(region: sg.Region, x: sg.Tensor, y: sg.Tensor, ty: Any) -> None:
        ty.add_(1.0)
        ty.sum().item()  # a copy to the host: not capturable

    _refused(
        stream,
        body,
        "the capture of captured region `bad` failed",
        via="torch",
        views=lambda x, y: (torch.from_dlpack(y),),
    )


@pytest.mark.sg_cuda
def test_a_synchronising_call_in_a_cuda_capture_is_refused() -> None:
    stream = sg.device("cuda").stream()

    def body(region: sg.Region, x: sg.Tensor, y: sg.Tensor) -> None:
        foreign_scale(region, y, x, 2.0)
        region.stream.sync()

    _refused(stream, body, "the capture of captured region `bad` failed")


@pytest.mark.sg_cuda
def test_work_left_on_another_stream_is_refused() -> None:
    from cuda.core import Device

    stream = sg.device("cuda").stream()
    side = Device(stream.device.index).create_stream()

    def body(region: sg.Region, x: sg.Tensor, y: sg.Tensor) -> None:
        side.wait(region.stream)  # the side stream joins the capture ...
        from cuda.core import LaunchConfig, launch

        kernel = _foreign_kernel(f"sm_{Device(stream.device.index).arch}")
        launch(side, LaunchConfig(grid=4, block=256), kernel, y.data_ptr, x.data_ptr, np.float32(2.0), np.int32(1024))
        # ... and is never joined back (region.stream.wait(side) is missing)

    _refused(stream, body, "(?s)failed when it ended.*(joined|UNJOINED)")


class Meanwhile:
    """``act`` run at one point of a capture's body (where the body calls the object): on this
    thread, or on another thread that waits for that point while the body waits for it to end.
    ``finish()`` after the capture re-raises what the other thread raised."""

    def __init__(self, act: Callable[[], object], other_thread: bool) -> None:
        self.act = act
        self.failures: list[BaseException] = []
        self.go, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._other) if other_thread else None
        if self.thread is not None:
            self.thread.start()

    def _other(self) -> None:
        try:
            self.go.wait(30)
            self.act()
        except BaseException as exc:  # re-raised by finish()
            self.failures.append(exc)
        finally:
            self.done.set()

    def __call__(self) -> None:
        if self.thread is None:
            self.act()
        else:
            self.go.set()
            self.done.wait(60)

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(60)
        assert not self.failures, self.failures

    def in_a_torch_capture(self, torch: Any, x: Any, z: Any) -> None:
        """PyTorch captures ``z = 2 * x + 1`` (in its default global mode) with ``act`` at its
        middle; the capture is replayed."""
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            torch.mul(x, 2.0, out=z)
            self()
            torch.add(z, 1.0, out=z)
        self.finish()
        captured.replay()
        torch.cuda.synchronize()


@pytest.mark.sg_cuda
@pytest.mark.parametrize("where", ["torch capture, other thread", "torch capture, same thread", "region"])
@pytest.mark.parametrize("action", ["close", "collect", "rebind"])
def test_a_graph_closed_or_rebound_during_a_capture_leaves_the_capture_valid(where: str, action: str) -> None:
    """Garbage collection closes graphs anywhere, a capture's thread included, and another thread
    may rebind or close a graph while PyTorch captures in its default global mode: the capture
    must survive. (Destroying the executable graph invalidated it; so did the event query of a
    rebind or a close that drops the marks of replays that have passed, since 58ef565.)"""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    n = 1 << 12
    inp, inp2, out = dev.full((n,), 1.0, name="inp"), dev.full((n,), 2.0, name="inp2"), dev.zeros((n,), name="out")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(library.axpy_op(out.mut(), inp, 1.0))
    graphs = {"g": s.graph}
    del s
    graphs["g"].launch()
    graphs["g"].sync()
    x, z = dev.full((n,), 4.0, name="x"), dev.zeros((n,), name="z")
    tx, tz = torch.from_dlpack(x), torch.from_dlpack(z)
    torch.cuda.synchronize()

    def act() -> None:
        if action == "close":
            graphs["g"].close()
        elif action == "collect":
            graphs.clear()
            gc.collect()
        else:
            graphs["g"].rebind({inp: inp2})

    inside = Meanwhile(act, other_thread=where == "torch capture, other thread")
    if where == "region":
        with (
            CudaGraph.scope(dev.stream()) as region_scope,
            region_scope.capture(reads=[x], writes=[z.mut()], via="torch"),
        ):
            torch.mul(tx, 2.0, out=tz)
            inside()
            torch.add(tz, 1.0, out=tz)
        with region_scope.graph as g:
            g.launch()
            g.sync()
        inside.finish()
    else:
        inside.in_a_torch_capture(torch, tx, tz)
    np.testing.assert_array_equal(z.numpy(), 9.0)
    if action == "rebind":
        graphs["g"].launch()
        graphs["g"].sync()
        np.testing.assert_array_equal(out.numpy(), 3.0)  # out += inp2 after out = 1.0
        graphs["g"].close()


@pytest.mark.sg_cuda
@pytest.mark.parametrize("thread", ["same thread", "other thread"])
@pytest.mark.parametrize("tensor", ["dropped", "freed", "read by a closed graph", "a wrapper of a torch tensor"])
def test_a_tensor_released_during_a_torch_capture_leaves_the_capture_valid(thread: str, tensor: str) -> None:
    """Garbage collection releases tensors anywhere, also while PyTorch captures (in its default
    global mode) on this thread or another: the release's stream waits and frees must not
    invalidate that capture (they did, each one)."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    n = 1 << 12
    owner = torch.ones(n, device="cuda")
    held = {"t": sg.Tensor.from_dlpack(owner) if tensor == "a wrapper of a torch tensor" else dev.full((n,), 1.0)}
    if tensor == "read by a closed graph":
        out = dev.zeros((n,), name="out")
        with CudaGraph.scope(dev.stream()) as s:
            s.record(library.axpy_op(out.mut(), held["t"], 1.0))
        with s.graph as g:
            g.launch()
        del s, g
    x, z = torch.full((n,), 4.0, device="cuda"), torch.zeros(n, device="cuda")
    torch.cuda.synchronize()

    def release() -> None:
        if tensor == "freed":
            held["t"].free()
        held.clear()
        gc.collect()

    Meanwhile(release, other_thread=thread == "other thread").in_a_torch_capture(torch, x, z)
    assert float(z[0]) == 9.0


def test_work_on_a_foreign_stream_that_another_library_captures_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager work and graph launches on another library's stream while that library captures it
    (PyTorch's torch.cuda.graph) are refused before anything is queued or noted: they would become
    part of a graph whose replays scopegraph never sees. (On a GPU the capture status comes from
    the driver; here the backend is told.)"""
    dev = sg.device("host")
    x = dev.zeros((4,), name="x")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(sg.memset(x.mut(), 2.0))
    foreign = dev.stream()
    foreign.foreign = True  # as Stream.from_handle makes it
    monkeypatch.setattr(dev.backend, "captures", lambda native: True)
    with pytest.raises(sg.ScopeStateError, match="another library is capturing it") as info:
        foreign.run(sg.memset(x.mut(), 1.0))
    assert "run `memset`" in str(info.value) and "help: do it before or after the capture" in str(info.value)
    with pytest.raises(sg.ScopeStateError, match=f"cannot launch graph #{s.graph.id} on stream"):
        s.graph.launch(stream=foreign)
    with pytest.raises(sg.ScopeStateError, match=r"cannot copy an array to the device \(dev.from_numpy\)"):
        dev.from_numpy(np.ones(4, np.float32), stream=foreign)
    with pytest.raises(sg.ScopeStateError, match="cannot synchronise on stream"):
        foreign.sync()
    np.testing.assert_array_equal(x.numpy(), 0.0)  # nothing ran
    monkeypatch.setattr(dev.backend, "captures", lambda native: False)  # the capture has ended
    foreign.run(sg.memset(x.mut(), 1.0))
    s.graph.launch(stream=foreign)
    np.testing.assert_array_equal(x.numpy(), 2.0)
    s.graph.close()


@pytest.mark.sg_cuda
def test_scopegraph_tensors_cross_into_and_out_of_a_torch_capture() -> None:
    """Inside PyTorch's capture (its default global mode): torch.from_dlpack of a scopegraph tensor
    and sg.Tensor.from_dlpack of a torch tensor work and leave the capture valid (each made a
    stream wait that invalidated it); eager work, a graph launch or a graph.update on the stream
    being captured is a ScopeStateError, after which the capture still completes; and a tensor
    that eager work used on that stream before the capture, dropped during it, is released after
    that work (an event recorded after it), not after the stream (a wait for the capturing stream
    joined the release's stream to the capture)."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    n = 1 << 12
    side = torch.cuda.Stream()
    capturing = sg.Stream.from_handle(side)
    assert capturing.handle == side.cuda_stream and capturing.foreign and not dev.stream().foreign
    t = dev.full((n,), 3.0, name="t")
    dev.stream().run(library.add_scalar_op(t.mut(), 1.0))  # t = 4, eager work queued on a side stream
    used = {"u": dev.zeros((n,), name="u")}
    capturing.run(library.add_scalar_op(used["u"].mut(), 1.0))  # eager work on the stream torch will capture
    x, z = torch.full((n,), 4.0, device="cuda"), torch.zeros(n, device="cuda")
    with CudaGraph.scope(capturing) as s:
        s.record(library.add_scalar_op(t.mut(), 0.0))
    s.graph.launch(stream=dev.stream())  # last launched elsewhere: an update would wait for it
    s.graph.sync()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured, stream=side):
        torch.mul(x, 2.0, out=z)
        z.add_(torch.from_dlpack(t))  # z = 8 + 4
        wrapped = sg.Tensor.from_dlpack(z)
        with pytest.raises(sg.ScopeStateError, match="another library is capturing it"):
            capturing.run(library.add_scalar_op(wrapped.mut(), 100.0))
        with pytest.raises(sg.ScopeStateError, match="another library is capturing it"):
            s.graph.launch(stream=capturing)
        with pytest.raises(sg.ScopeStateError, match="another library is capturing it"):
            s.graph.update(library.add_scalar_op(t.mut(), 100.0))
        used.clear()
        gc.collect()  # u's release waits for the eager work on `side`, which is being captured
        z.add_(1.0)
    captured.replay()
    torch.cuda.synchronize()
    assert float(z[0]) == 13.0 and wrapped.shape == (n,)
    assert not dev.backend._deferred  # type: ignore[attr-defined]  # released, not held back
    capturing.run(library.add_scalar_op(wrapped.mut(), 1.0))  # the capture has ended
    capturing.sync()
    assert float(z[0]) == 14.0
    s.graph.close()


@pytest.mark.sg_cuda
def test_work_ordered_after_a_stream_that_pytorch_then_captures_runs() -> None:
    """A graph replayed on a PyTorch stream S, then PyTorch captures on S: scopegraph's later work
    on its own stream, which waits for that replay, must run, not join the capture. (The wait on S
    joined scopegraph's stream to the capture: the next eager op was captured, never ran, and the
    capture ended with unjoined work.)"""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    own, side = dev.stream(), torch.cuda.Stream()
    t = dev.full((1024,), 1.0, name="t")
    with CudaGraph.scope(own) as s:
        s.record(library.add_scalar_op(t.mut(), 1.0))
    s.graph.launch(stream=sg.Stream.from_handle(side))  # t = 2, the last replay on S
    torch.cuda.synchronize()
    x, z = torch.full((1024,), 4.0, device="cuda"), torch.zeros(1024, device="cuda")
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured, stream=side):
        torch.mul(x, 2.0, out=z)
        own.run(library.add_scalar_op(t.mut(), 1.0))  # t = 3: waits for the replay on S first
        s.graph.launch()  # t = 4
        s.graph.update(library.add_scalar_op(t.mut(), 10.0))  # t = 14
        own.sync()
        z.add_(1.0)
    captured.replay()
    torch.cuda.synchronize()
    assert float(z[0]) == 9.0
    np.testing.assert_array_equal(t.numpy(), 14.0)
    s.graph.close()


@pytest.mark.sg_cuda
@pytest.mark.parametrize("work", ["allocate", "record, launch and sync a graph", "wrap a torch tensor", "sync"])
def test_scopegraph_work_on_another_thread_leaves_a_torch_capture_valid(work: str) -> None:
    """While PyTorch captures in its default global mode, another thread allocates, builds and
    launches graphs, wraps tensors and synchronises its own streams: none of it touches the
    capturing stream, so the capture stays valid (each invalidated it) and the work is done."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    n = 1024
    source = torch.full((n,), 7.0, device="cuda")
    x, z = torch.full((n,), 4.0, device="cuda"), torch.zeros(n, device="cuda")
    stream = dev.stream()
    made: list[sg.Tensor] = []

    def do_work() -> None:
        if work == "allocate":
            made.append(dev.zeros((n,), name="made"))
        elif work == "record, launch and sync a graph":
            out = dev.zeros((n,), name="out")
            with CudaGraph.scope(stream) as s:
                s.record(library.add_scalar_op(out.mut(), 2.0))
            with s.graph as g:
                g.launch()
                g.sync()
            made.append(out)
        elif work == "wrap a torch tensor":
            made.append(sg.Tensor.from_dlpack(source))
        else:
            out = dev.zeros((n,), name="out")
            stream.run(library.add_scalar_op(out.mut(), 7.0))
            stream.sync()
            made.append(out)

    Meanwhile(do_work, other_thread=True).in_a_torch_capture(torch, x, z)
    assert float(z[0]) == 9.0
    want = {"allocate": 0.0, "record, launch and sync a graph": 2.0, "wrap a torch tensor": 7.0, "sync": 7.0}
    np.testing.assert_array_equal(made[0].numpy(), want[work])


@pytest.mark.sg_cuda
def test_cupy_reads_a_finished_tensor_inside_a_torch_capture() -> None:
    """`__cuda_array_interface__` names no stream once the work on the tensor has finished, so
    CuPy, which synchronises the named stream on the host, can take a scopegraph tensor inside
    PyTorch's capture (which synchronised the device when it began) without invalidating it."""
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    dev = sg.device("cuda")
    t = dev.full((1024,), 3.0, name="t")
    dev.stream().run(library.add_scalar_op(t.mut(), 1.0))  # t = 4, eager work on a side stream
    x, z = torch.full((1024,), 4.0, device="cuda"), torch.zeros(1024, device="cuda")
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        assert t.__cuda_array_interface__["stream"] is None  # done: torch synchronised first
        view = cp.asarray(t)
        torch.mul(x, 2.0, out=z)
    captured.replay()
    torch.cuda.synchronize()
    assert float(z[0]) == 8.0 and float(view[0]) == 4.0


@pytest.mark.sg_cuda
def test_numpy_works_and_a_device_sync_is_refused_inside_a_region() -> None:
    """Inside a region's block, `t.numpy()` of a tensor reads it (it waits for t's writers, not
    the device: the copy's stream sync invalidated the capture, as a CudaError with no help), and
    `dev.sync()`, which would wait for the capturing stream too, is a ScopeStateError; the
    region's capture survives both."""
    torch = pytest.importorskip("torch")
    dev = sg.device("cuda")
    x, y, other = dev.full((1024,), 2.0, name="x"), dev.zeros((1024,), name="y"), dev.full((8,), 5.0, name="other")
    tx, ty = torch.from_dlpack(x), torch.from_dlpack(y)
    with CudaGraph.scope(dev.stream()) as s, s.capture(reads=[x], writes=[y.mut()], via="torch"):
        torch.mul(tx, 3.0, out=ty)
        np.testing.assert_array_equal(other.numpy(), 5.0)
        with pytest.raises(sg.ScopeStateError, match="cannot synchronise the device while a captured region"):
            dev.sync()
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(y.numpy(), 6.0)
