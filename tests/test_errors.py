"""Every error class of DESIGN.md section 1: raised at the user's line, before instantiation,
with nothing left pinned or recording, and the stream still usable afterwards."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

from .helpers import assert_stream_usable, pinned


def fails_in_scope(
    stream: sg.Stream, error: type[Exception], match: str, step: Callable[[sg.Scope], object]
) -> sg.Scope:
    """Run ``step`` inside a scope; it must raise ``error``; no graph, no pins, stream usable."""
    with pytest.raises(error, match=match), CudaGraph.scope(stream) as s:
        step(s)
    assert stream.recording is None
    with pytest.raises(sg.ScopeStateError, match="ended with an exception"):
        s.graph
    assert_stream_usable(stream)
    return s


# -- NotAGraphNodeError ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: sg.zeros((4,)),
        lambda: sg.empty((4,)),
        lambda: sg.full((4,), 1.0),
        lambda: sg.from_numpy(np.zeros(4, np.float32)),
    ],
    ids=["zeros", "empty", "full", "from_numpy"],
)
def test_recording_an_allocation_op_is_rejected(
    sg_stream: sg.Stream, builds: list[int], make: Callable[[], sg.AllocationOp]
) -> None:
    fails_in_scope(sg_stream, sg.NotAGraphNodeError, "it allocates memory", lambda s: s.record(make()))  # type: ignore[arg-type]
    assert builds == [1]  # only assert_stream_usable's graph


def test_recording_dup_or_a_non_op_is_rejected(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    x = sg_device.zeros((4,), name="x")
    fails_in_scope(sg_stream, sg.NotAGraphNodeError, "allocate before the scope", lambda s: s.record(sg.dup(x)))  # type: ignore[arg-type]
    fails_in_scope(sg_stream, TypeError, "takes a GraphNode", lambda s: s.record("memcpy"))  # type: ignore[arg-type]
    with pytest.raises(sg.NotAGraphNodeError, match=r"stream.run\(\) takes an op"):
        sg_stream.run("memcpy")  # type: ignore[arg-type]
    assert builds == [1, 1]
    assert not pinned(x)


def test_graph_update_takes_graph_nodes_only(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,))
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    with pytest.raises(sg.NotAGraphNodeError, match=r"graph\.update"):
        s.graph.update(sg.zeros((4,)))  # type: ignore[arg-type]
    s.graph.close()


# -- BorrowError -----------------------------------------------------------------------------


def test_mutable_and_shared_borrow_of_one_tensor(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    y = sg_device.zeros((64,), name="y")
    with pytest.raises(sg.BorrowError) as info:
        library.add_op(y.mut(), y, y)  # type: ignore[scopegraph-borrow]  # the runtime check under test
    msg = str(info.value)
    assert "cannot borrow `y` as immutable because it is also borrowed as mutable in `add`" in msg
    assert "`out` borrows `y` mutably" in msg and "`a` borrows `y` as shared" in msg and "help:" in msg
    fails_in_scope(sg_stream, sg.BorrowError, "also borrowed as mutable", lambda s: s.record(sg.memcpy(y.mut(), y)))  # type: ignore[scopegraph-borrow]  # the runtime check under test
    assert builds == [1]


def test_overlapping_views_conflict_and_disjoint_views_do_not(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.from_numpy(np.arange(8, dtype=np.float32), name="x")
    with pytest.raises(sg.BorrowError, match=r"`x\[2:6\]` as immutable"):
        sg.memcpy(x[0:4].mut(), x[2:6])
    with pytest.raises(sg.BorrowError, match=r"bytes 8\.\.24"):
        sg.memcpy(x[2:6].mut(), x.view((2, 4))[0])
    sg_stream.run(sg.memcpy(x[0:4].mut(), x[4:8]))
    sg_stream.sync()
    np.testing.assert_array_equal(x.numpy(), [4, 5, 6, 7, 4, 5, 6, 7])
    assert_stream_usable(sg_stream)


def test_two_mutable_borrows_of_one_tensor(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    @sg.kernel('extern "C" __global__ void swap2(float* a, float* b) {}')
    def swap2(a: Mut[Tensor], b: Mut[Tensor]) -> None: ...

    @swap2.host
    def _(a: np.ndarray, b: np.ndarray) -> None:
        a[...], b[...] = b.copy(), a.copy()

    x = sg_device.zeros((8,), name="x")
    with pytest.raises(sg.BorrowError, match="cannot borrow `x` as mutable more than once at a time in `swap2`"):
        swap2[1, 1](x.mut(), x.mut())  # type: ignore[scopegraph-borrow]  # the runtime check under test
    with pytest.raises(sg.BorrowError, match="more than once"):
        swap2[1, 1](x[0:5].mut(), x[4:8].mut())
    fails_in_scope(
        sg_stream, sg.BorrowError, "more than once", lambda s: s.record(swap2[1, 1](x.view((2, 4)).mut(), x.mut()))
    )


def test_writing_a_frozen_tensor(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    w = sg_device.from_numpy(np.ones(16, np.float32), name="w").freeze()
    out = sg_device.zeros((16,), name="out")
    with pytest.raises(sg.BorrowError, match="cannot borrow `w` as mutable in `memset`: it is frozen"):
        sg.memset(w.mut(), 0.0)
    fails_in_scope(
        sg_stream, sg.BorrowError, "frozen", lambda s: s.record(library.axpy_op(w[0:8].mut(), out[0:8], 1.0))
    )
    sg_stream.run(library.add_op(out.mut(), w, w))  # reading a frozen tensor is fine
    sg_stream.sync()
    np.testing.assert_array_equal(out.numpy(), 2.0)
    assert builds == [1]


# -- LifetimeError ---------------------------------------------------------------------------


def test_using_a_freed_tensor(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    x = sg_device.zeros((8,), name="x")
    y = sg_device.zeros((8,), name="y")
    op = sg.memcpy(y.mut(), x)  # built while x is alive
    x.free()
    with pytest.raises(sg.LifetimeError, match="use of freed tensor `x`"):
        sg.memcpy(y.mut(), x)
    with pytest.raises(sg.LifetimeError, match="freed"):
        sg_stream.run(op)
    with pytest.raises(sg.LifetimeError, match="freed"):
        x.numpy()
    fails_in_scope(sg_stream, sg.LifetimeError, "use of freed tensor `x`", lambda s: s.record(op))
    assert builds == [1]
    assert not pinned(y)
    x.free()  # freeing twice is harmless


def test_freeing_a_tensor_pinned_by_an_open_scope(
    sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]
) -> None:
    x = sg_device.zeros((8,), name="x")

    def step(s: sg.Scope) -> None:
        s.record(sg.memset(x.mut(), 1.0))
        x.free()

    fails_in_scope(sg_stream, sg.LifetimeError, "pinned by the open scope", step)
    assert builds == [1] and not pinned(x)
    x.free()


def test_freeing_a_view_is_refused(sg_device: sg.Device) -> None:
    x = sg_device.zeros((8,), name="x")
    with pytest.raises(sg.LifetimeError, match="it is a view"):
        x[0:2].free()


def test_closed_graph_cannot_be_used(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((8,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    graph = s.graph
    graph.close()
    graph.close()  # idempotent
    assert graph.closed
    for use in (
        graph.launch,
        graph.sync,
        lambda: graph.update(sg.memset(x.mut(), 2.0)),
        lambda: graph.nodes,
        graph.__enter__,  # `with graph:`
    ):
        with pytest.raises(sg.LifetimeError, match="it is closed"):
            use()
    assert_stream_usable(sg_stream)


# -- SignatureError --------------------------------------------------------------------------


def test_kernel_arguments_are_checked_against_the_declaration(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((16,), name="out")
    x = sg_device.zeros((16,), name="x")
    xi = sg_device.zeros((16,), sg.i32, name="xi")
    launch = library.axpy[1, 16]
    with pytest.raises(sg.SignatureError, match=r"takes 4 arguments"):
        launch(out.mut(), x, 1.0)  # type: ignore[call-arg]
    with pytest.raises(
        sg.SignatureError, match=r"writes `out`, so it needs a mutable borrow\n(.*\n)+help: pass `out.mut\(\)`"
    ):
        launch(out, x, 1.0, 16)  # type: ignore[arg-type]
    with pytest.raises(sg.SignatureError, match="only reads `x`, but it got a mutable borrow"):
        launch(out.mut(), x.mut(), 1.0, 16)  # type: ignore[arg-type]
    with pytest.raises(sg.SignatureError, match="got `xi` of dtype i32"):
        launch(out.mut(), xi, 1.0, 16)
    with pytest.raises(sg.SignatureError, match=r"parameter `n` expects sg\.i32, got float"):
        launch(out.mut(), x, 1.0, 16.0)  # type: ignore[arg-type]
    with pytest.raises(sg.SignatureError, match=r"parameter `a` expects sg\.f32, got str"):
        launch(out.mut(), x, "1", 16)  # type: ignore[arg-type]
    with pytest.raises(sg.SignatureError, match="rank 1"):
        library.matvec[1, 32](out.mut(), x, x, 16, 16)
    with pytest.raises(sg.SignatureError, match="positive integers"):
        library.axpy[0, 16]
    # keywords bind by name
    op = library.axpy[1, 16](out=out.mut(), x=x, a=2.0, n=16)
    assert [b.param for b in op.borrows] == ["out", "x"]
    fails_in_scope(sg_stream, sg.SignatureError, "takes 4 arguments", lambda s: s.record(launch(out.mut(), x)))  # type: ignore[call-arg]


def test_memcpy_sizes_must_match(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    a = sg_device.zeros((8,), name="a")
    b = sg_device.zeros((4,), name="b")
    c = sg_device.zeros((8,), sg.i32, name="c")
    with pytest.raises(sg.SignatureError, match="memcpy sizes differ") as info:
        sg.memcpy(a.mut(), b)
    assert "`dst` is `a`: f32[8], 32 bytes" in str(info.value)
    with pytest.raises(sg.SignatureError, match="memcpy dtypes differ"):  # 32 bytes each
        sg.memcpy(a.mut(), c)
    fails_in_scope(sg_stream, sg.SignatureError, "sizes differ", lambda s: s.record(sg.memcpy(b.mut(), a)))
    assert builds == [1]


def test_memset_value_must_be_a_driver_pattern(sg_device: sg.Device) -> None:
    d = sg_device.zeros((4,), sg.f64, name="d")
    with pytest.raises(sg.SignatureError, match="with a kernel of your own for f64"):
        sg.memset(d.mut(), 1.5)
    sg.memset(d.mut(), 0.0)  # all-zero 8 bytes repeat


def test_bad_declarations() -> None:
    with pytest.raises(sg.SignatureError, match="has annotation"):

        @sg.kernel("")
        def bad(out: list[int]) -> None: ...

    with pytest.raises(sg.SignatureError, match="no annotation"):

        @sg.kernel("")
        def bare(out) -> None: ...  # type: ignore[no-untyped-def]


def test_kernel_without_host_reference_on_host() -> None:
    dev = sg.device("host")
    stream = dev.stream()

    @sg.kernel('extern "C" __global__ void gpu_only(float* out) {}')
    def gpu_only(out: Mut[Tensor]) -> None: ...

    x = dev.zeros((4,), name="x")
    with pytest.raises(
        sg.NoHostReferenceError, match=r"no host reference.*\n.*\nhelp: add a numpy reference with @gpu_only.host"
    ):
        stream.run(gpu_only[1, 1](x.mut()))
    fails_in_scope(stream, sg.SignatureError, "no host reference", lambda s: s.record(gpu_only[1, 1](x.mut())))


# -- ScopeStateError -------------------------------------------------------------------------


def test_record_after_the_scope_ended(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,))
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    with pytest.raises(sg.ScopeStateError, match="finished"):
        s.record(sg.memset(x.mut(), 2.0))
    with pytest.raises(sg.ScopeStateError, match="already used"), s:
        pass
    s.graph.close()
    assert_stream_usable(sg_stream)


def test_a_scope_block_or_region_ended_twice_or_never_entered(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """An ExitStack unwinding twice, or __exit__ called by hand: refused, recording nothing twice
    and unpinning nothing that a graph still uses."""
    x, y = sg_device.full((4,), 1.0, name="x"), sg_device.zeros((4,), name="y")
    scope = CudaGraph.scope(sg_stream)
    scope.__enter__()
    scope.record(sg.memcpy(y.mut(), x))
    scope.__exit__(None, None, None)
    with pytest.raises(sg.ScopeStateError, match=r"this scope is not open: .* ended already\nhelp: use it as `with"):
        scope.__exit__(None, None, None)
    scope.__exit__(ValueError, ValueError("in flight"), None)  # an exception in flight says more
    graph = scope.graph
    with pytest.raises(sg.LifetimeError):
        y.free()  # the graph still holds it
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.ScopeStateError, match=r"this scope is not open: it was never entered"):
            CudaGraph.scope(sg_stream).__exit__(None, None, None)
        with pytest.raises(sg.ScopeStateError, match="while a scope is recording on it"):
            sg_stream.run(sg.memset(x.mut(), 2.0))  # the stream still records
        block = s.while_(sg_device.zeros((1,), sg.i32, name="flag"))
        with pytest.raises(sg.ScopeStateError, match="this loop block is not open"):
            block.__exit__(None, None, None)
        block.__enter__()
        block.__exit__(None, None, None)
        with pytest.raises(sg.ScopeStateError, match=r"this loop block is not open: .* ended already"):
            block.__exit__(None, None, None)
        if not sg_device.is_cuda:  # a region with no foreign work in it is refused on a GPU
            region = s.capture(writes=[y.mut()], host=lambda out: np.add(out, 1.0, out=out), name="plus_one")
            region.__enter__()
            region.__exit__(None, None, None)
            with pytest.raises(sg.ScopeStateError, match="this captured region is not open"):
                region.__exit__(None, None, None)
    assert len(s.graph.nodes) == (1 if sg_device.is_cuda else 2)  # each recorded once
    s.graph.close()
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(y.numpy(), 1.0)
    graph.close()
    assert_stream_usable(sg_stream)


def test_scope_used_before_it_is_entered(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    scope = CudaGraph.scope(sg_stream)
    with pytest.raises(sg.ScopeStateError, match="not open yet"):
        scope.record(sg.memset(x.mut(), 1.0))
    with pytest.raises(sg.ScopeStateError, match="has not been entered"):
        scope.graph
    assert not pinned(x)
    assert_stream_usable(sg_stream)


def test_graph_read_inside_the_block(sg_stream: sg.Stream, builds: list[int]) -> None:
    fails_in_scope(sg_stream, sg.ScopeStateError, r"`s.graph` read inside the scope", lambda s: s.graph)
    assert builds == [1]


def test_eager_work_on_the_recording_stream(sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]) -> None:
    x = sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s0:
        s0.record(sg.memset(x.mut(), 1.0))
    other = sg_device.stream()

    def step(s: sg.Scope) -> None:
        other.run(sg.memset(x.mut(), 5.0))  # another stream: fine
        s0.graph.launch(stream=other)  # another stream: fine
        s.record(sg.memset(x.mut(), 2.0))
        sg_stream.run(sg.memset(x.mut(), 3.0))

    fails_in_scope(sg_stream, sg.ScopeStateError, "while a scope is recording on it", step)
    with pytest.raises(sg.ScopeStateError, match="launch graph"), CudaGraph.scope(sg_stream):
        s0.graph.launch()
    with pytest.raises(sg.ScopeStateError, match="recording"), CudaGraph.scope(sg_stream):
        sg_stream.run(sg.zeros((4,)))
    s0.graph.close()
    assert builds == [1, 1]


def test_nested_scopes_on_one_stream(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    y = sg_device.zeros((4,), name="y")

    def step(s: sg.Scope) -> None:
        with CudaGraph.scope(sg_stream):
            pass

    fails_in_scope(sg_stream, sg.ScopeStateError, "another scope is recording on it", step)
    other = sg_device.stream()
    with CudaGraph.scope(sg_stream) as outer:  # nesting on different streams is fine
        outer.record(sg.memset(x.mut(), 1.0))
        with CudaGraph.scope(other) as inner:
            inner.record(sg.memset(y.mut(), 2.0))
    for g in (outer.graph, inner.graph):
        g.launch()
        g.sync()
        g.close()
    np.testing.assert_array_equal(x.numpy() + y.numpy(), 3.0)


def test_scope_needs_a_stream() -> None:
    with pytest.raises(sg.ScopeStateError, match="needs a scopegraph Stream"):
        CudaGraph.scope("stream")  # type: ignore[arg-type]
    with pytest.raises(sg.SignatureError, match="not an ordering"):
        CudaGraph.scope(sg.device("host").stream(), order="random")


def test_every_error_is_a_scopegraph_error() -> None:
    for cls in (
        sg.NotAGraphNodeError,
        sg.BorrowError,
        sg.LifetimeError,
        sg.SignatureError,
        sg.ScopeStateError,
        sg.CompileError,
        sg.CudaError,
    ):
        assert issubclass(cls, sg.ScopeGraphError)
    assert issubclass(sg.NotAGraphNodeError, TypeError)


@pytest.mark.parametrize(
    "error",
    [
        sg.CudaError("launching `k`", "CUDA_ERROR_ILLEGAL_ADDRESS", "the last work: `k`"),
        sg.CudaError("building the graph definition", "CUDA_ERROR_INVALID_VALUE"),
        sg.LaunchResourceError("launching `k`", "CUDA_ERROR_INVALID_VALUE", "`k` ...\nhelp: launch it with fewer"),
    ],
    ids=["sticky", "plain", "launch_resource"],
)
def test_driver_errors_survive_pickling(error: sg.CudaError) -> None:
    """Errors cross process boundaries (multiprocessing, pytest-xdist): a CudaError's args hold
    only its message, so unpickling must not call __init__ with it."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert (again.operation, again.result, again.context_lost) == (error.operation, error.result, error.context_lost)


@pytest.mark.parametrize(
    "error",
    [
        sg.CompileError("k", "k.cu(3): error: expected a ';'", ["--std=c++17"]),
        sg.PdlWaitError("k", "sm_90", ["a note"]),
        sg.FrozenExportError.refusing("w", "dlpack"),
        sg.BoundsError("row 9 is out of range\nhelp: index rows 0..3"),
    ],
    ids=["compile", "pdl_wait", "frozen_export", "bounds"],
)
def test_every_error_survives_pickling_with_its_fields(error: sg.ScopeGraphError) -> None:
    """CompileError's __init__ takes (kernel_name, log): unpickling called it with the message alone."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and again.__dict__ == error.__dict__


# -- CudaError: a help line where the user can act --------------------------------------------


def test_a_driver_error_the_user_can_act_on_says_what_to_do() -> None:
    """Every ScopeGraphError ends with what to do instead: a CudaError takes its help line from its
    CUresult when the caller gives none, and keeps the caller's own when the detail has one."""
    for result in ("CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INVALID_DEVICE", "CUDA_ERROR_OUT_OF_MEMORY"):
        message = str(sg.CudaError("allocating 4 bytes on cuda:0", result, "the driver said no"))
        assert message.splitlines()[-1].startswith("help: "), message
    assert "tensor.free()" in str(sg.CudaError("allocating", "CUDA_ERROR_OUT_OF_MEMORY"))
    own = str(sg.CudaError("launching `k`", "CUDA_ERROR_OUT_OF_MEMORY", "k failed\nhelp: launch fewer"))
    assert own.count("help: ") == 1 and own.endswith("help: launch fewer")
    given = str(sg.CudaError("selecting device 'cuda'", "CUDA_ERROR_NO_DEVICE", "no GPU", help="use the host"))
    assert given.endswith("\nhelp: use the host")
    sticky = str(sg.CudaError("launching `k`", "CUDA_ERROR_ILLEGAL_ADDRESS"))
    assert sticky.count("help: ") == 1 and "restart the process" in sticky
    again = pickle.loads(pickle.dumps(sg.CudaError("allocating", "CUDA_ERROR_OUT_OF_MEMORY")))
    assert str(again) == str(sg.CudaError("allocating", "CUDA_ERROR_OUT_OF_MEMORY"))


class _ForeignStream:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)


@pytest.mark.parametrize(
    "ask",
    [lambda: sg.device("cuda"), lambda: sg.device("cuda:1"), lambda: sg.Stream.from_handle(_ForeignStream())],
    ids=["device_cuda", "device_cuda_1", "stream_from_handle"],
)
def test_asking_for_a_gpu_without_one_says_what_to_do(ask: Callable[[], object]) -> None:
    from scopegraph._driver import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(sg.CudaError) as info:
        ask()
    message = str(info.value)
    assert info.value.result == "CUDA_ERROR_NO_DEVICE"
    assert re.search(r"^help: .*sg\.device\('host'\)", message, re.M), message
