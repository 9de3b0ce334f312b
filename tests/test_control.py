"""Device-side control flow (issue 10, DESIGN.md section 8): ``s.while_``, ``s.if_`` and
``s.if_else`` on both backends: iteration counts, data-dependent loops, nesting, branches, the
outer DAG around a loop, refusals inside bodies, iteration bounds, pictures, and the seed model's
decode loop against K launches of its one-token graph."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library
from scopegraph._cli.seed_model import Config, LayerStack, reference_forward, relative_error

from .helpers import assert_stream_usable, pinned

HERE = Path(__file__).resolve()

# Kernels the tests' loops use; each has a numpy reference for the host backend.
SOURCE = r"""
// Collatz: n <- n / 2 (even) or 3n + 1 (odd); steps += 1; flag = n != 1.
extern "C" __global__ void collatz(int* n, int* steps, int* flag) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        int v = n[0];
        v = (v & 1) ? 3 * v + 1 : v / 2;
        n[0] = v;
        steps[0] += 1;
        flag[0] = v != 1;
    }
}
// x[0] <- x[0] * 0.5; flag = x[0] > tol.
extern "C" __global__ void halve(float* x, int* flag, float tol) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        x[0] *= 0.5f;
        flag[0] = x[0] > tol;
    }
}
// out <- a copy of what src holds (one int).
extern "C" __global__ void copy_int(int* out, const int* src) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = src[0];
}
"""

NDArray = np.ndarray


@sg.kernel(SOURCE, touches={"n": "1", "steps": "1", "flag": "1"})
def collatz(n: Mut[Tensor], steps: Mut[Tensor], flag: Mut[Tensor]) -> None: ...


@collatz.host
def _collatz(n: NDArray, steps: NDArray, flag: NDArray) -> None:
    v = int(n[0])
    v = 3 * v + 1 if v & 1 else v // 2
    n[0], flag[0] = v, int(v != 1)
    steps[0] += 1


@sg.kernel(SOURCE, touches={"x": "1", "flag": "1"})
def halve(x: Mut[Tensor], flag: Mut[Tensor], tol: sg.f32) -> None: ...


@halve.host
def _halve(x: NDArray, flag: NDArray, tol: np.float32) -> None:
    x[0] = x[0] * np.float32(0.5)
    flag[0] = int(x[0] > tol)


@sg.kernel(SOURCE, touches={"out": "1", "src": "1"})
def copy_int(out: Mut[Tensor], src: Tensor) -> None: ...


@copy_int.host
def _copy_int(out: NDArray, src: NDArray) -> None:
    out[0] = src[0]


def i32(dev: sg.Device, value: int, name: str) -> sg.Tensor:
    return dev.from_numpy(np.array([value], np.int32), name=name)


def raised_at_this_line(info: pytest.ExceptionInfo[BaseException], text: str) -> bool:
    """The traceback passes through this file at a line containing ``text`` (the user's line)."""
    return any(Path(str(e.path)) == HERE and text in str(e.statement) for e in info.traceback)


# -- iteration bounds (first: on a GPU a broken bound would hang the rest) ------------------------


def test_a_runaway_loop_stops_at_max_iterations_with_a_clear_error(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = i32(sg_device, 1, "stuck"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=5) as body:
        body.record(library.add_scalar_op(x.mut(), 1.0))  # never writes the flag
    graph = s.graph
    with pytest.raises(sg.LoopLimitError) as info:
        graph.launch()
        graph.sync()  # the GPU ends the loop at its bound and reports it here
    msg = str(info.value)
    assert "`while(stuck)` recorded at" in msg and "max_iterations=5" in msg and "still non-zero" in msg
    assert "help:" in msg and str(HERE) in msg
    np.testing.assert_array_equal(x.numpy(), 5.0)  # exactly the bound's iterations ran
    graph.sync()  # reported once
    # The graph and stream stay usable: with the flag cleared, a replay runs no iteration.
    graph.update(sg.memset(flag.mut(), 0))
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(x.numpy(), 5.0)
    graph.close()
    assert_stream_usable(sg_stream)


def test_two_runaway_loops_in_one_replay_are_reported_once(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Both loops overrun in one replay (on a GPU both run to their bounds): the sync reports it,
    and once the flags are cleared the next replay and sync report nothing."""
    first, second, x = i32(sg_device, 1, "first"), i32(sg_device, 1, "second"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with s.while_(first, max_iterations=2) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
        with s.while_(second, max_iterations=3) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    with pytest.raises(sg.LoopLimitError, match="while\\(first\\)"):
        graph.launch()
        graph.sync()
    graph.sync()
    graph.update(sg.memset(first.mut(), 0))
    graph.update(sg.memset(second.mut(), 0))
    graph.launch()
    graph.sync()  # nothing left over from the first replay
    graph.close()
    assert_stream_usable(sg_stream)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_max_iterations_equal_to_the_count_is_no_error(sg_device: sg.Device, sg_stream: sg.Stream, n: int) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="n"), sg_device.zeros((2,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), n))
        with s.while_(flag, max_iterations=n) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as g:
        for _ in range(3):
            g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 3.0 * n)


# -- loops ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 37])
@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bounded"])
def test_a_loop_runs_flag_times(sg_device: sg.Device, sg_stream: sg.Stream, n: int, bounded: bool) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="remaining")
    x, y = sg_device.zeros((8,), name="x"), sg_device.zeros((8,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), n))
        with s.while_(flag, max_iterations=100 if bounded else None) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.axpy_op(y.mut(), x, 1.0))  # y += x: 1 + 2 + ... + n
            body.record(library.count_down_op(flag.mut()))
    with s.graph as g:
        g.launch()
        g.sync()
        np.testing.assert_array_equal(x.numpy(), n)
        np.testing.assert_array_equal(y.numpy(), n * (n + 1) / 2)
        assert flag.numpy()[0] == 0
        g.launch()  # the memset re-arms the loop: each replay runs n iterations again
        g.sync()
        np.testing.assert_array_equal(x.numpy(), 2 * n)


def test_the_flag_is_checked_before_the_first_iteration(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A loop whose flag starts at zero runs no iteration, even if the body would set the flag."""
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=3) as body:
        body.record(library.add_scalar_op(x.mut(), 1.0))
        body.record(sg.memset(flag.mut(), 1))  # would loop forever (to the bound) if entered
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 0.0)


@pytest.mark.parametrize("start", [27, 1, 6, 97])
def test_a_data_dependent_loop_runs_until_the_data_converges(
    sg_device: sg.Device, sg_stream: sg.Stream, start: int
) -> None:
    """The iteration count comes from the data (Collatz steps), decided on the device."""
    n, steps, flag = i32(sg_device, start, "n"), i32(sg_device, 0, "steps"), i32(sg_device, int(start != 1), "flag")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=1000) as body:
        body.record(collatz[1, 1](n.mut(), steps.mut(), flag.mut()))
    with s.graph as g:
        g.launch()
        g.sync()
    want, v = 0, start
    while v != 1:
        v, want = (3 * v + 1 if v & 1 else v // 2), want + 1
    assert (int(n.numpy()[0]), int(steps.numpy()[0])) == (1, want)
    assert start != 27 or want == 111


def test_a_convergence_loop_over_floats(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, flag = sg_device.from_numpy(np.array([1000.0], np.float32), name="x"), i32(sg_device, 1, "flag")
    count = sg_device.zeros((1,), name="count")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=100) as body:
        body.record(halve[1, 1](x.mut(), flag.mut(), 1e-3))
        body.record(library.add_scalar_op(count.mut(), 1.0))
    with s.graph as g:
        g.launch()
        g.sync()
    want = int(np.ceil(np.log2(1000.0 / 1e-3)))  # halvings until x <= tol
    assert count.numpy()[0] == want
    assert x.numpy()[0] == np.float32(1000.0) / np.float32(2.0**want)


def test_nested_loops(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """An outer loop of 3 runs an inner loop whose count is the outer counter: 3 + 2 + 1 inner iterations."""
    i, j = sg_device.zeros((1,), sg.i32, name="i"), sg_device.zeros((1,), sg.i32, name="j")
    inner, outer = sg_device.zeros((4,), name="inner"), sg_device.zeros((4,), name="outer")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(i.mut(), 3))
        with s.while_(i, max_iterations=10) as body:
            body.record(copy_int[1, 1](j.mut(), i))
            with body.while_(j, max_iterations=10) as inner_body:
                inner_body.record(library.add_scalar_op(inner.mut(), 1.0))
                inner_body.record(library.count_down_op(j.mut()))
            body.record(library.add_scalar_op(outer.mut(), 1.0))
            body.record(library.count_down_op(i.mut()))
    graph = s.graph
    for _ in range(2):
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(outer.numpy(), 6.0)
    np.testing.assert_array_equal(inner.numpy(), 12.0)
    loop = graph.nodes[1].op
    assert isinstance(loop, sg.While)
    labels = [n.op.label() for n in loop.body.nodes]
    assert labels[1] == "while(j, max 10) [2 nodes]"
    # In the outer body the inner loop follows the copy into j; i's count-down waits only for that copy's read of i.
    assert [n.deps for n in loop.body.nodes] == [set(), {0}, set(), {0}]
    graph.close()


def test_a_nested_bound_is_reported(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    i, stuck, x = i32(sg_device, 2, "i"), i32(sg_device, 1, "stuck"), sg_device.zeros((1,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(i, max_iterations=5) as body:
        with body.while_(stuck, max_iterations=4) as inner:
            inner.record(library.add_scalar_op(x.mut(), 1.0))
        body.record(library.count_down_op(i.mut()))
    with s.graph as g, pytest.raises(sg.LoopLimitError, match=r"`while\(stuck\)`.*max_iterations=4"):
        g.launch()
        g.sync()


def test_the_body_is_a_dataflow_dag_of_its_own(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    a, b, c = (sg_device.zeros((16,), name=name) for name in "abc")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(a.mut(), 5.0))  # outer node 0: the body's tracker does not see it
        s.record(sg.memset(flag.mut(), 4))
        with s.while_(flag, max_iterations=10) as body:
            na = body.record(library.add_scalar_op(a.mut(), 1.0))
            nb = body.record(library.add_scalar_op(b.mut(), 2.0))
            nc = body.record(library.add_op(c.mut(), a, b))
            nd = body.record(library.count_down_op(flag.mut()))
    assert [na.deps, nb.deps, nc.deps, nd.deps] == [set(), set(), {0, 1}, set()]
    assert [n.index for n in (na, nb, nc, nd)] == [0, 1, 2, 3]
    assert na.location == f"{HERE}:{na._where[1]}"
    loop = s.graph.nodes[2]
    assert loop.deps == {0, 1}  # after the fill of a and the memset of the flag
    for _ in range(3):  # on the host: a new random order inside the body every iteration
        s.graph.launch()
    s.graph.sync()
    np.testing.assert_array_equal(a.numpy(), 9.0)
    np.testing.assert_array_equal(b.numpy(), 24.0)  # b is not reset: 3 launches of 4 iterations
    np.testing.assert_array_equal(c.numpy(), 33.0)
    s.graph.close()


def test_program_order_bodies_chain_their_ops(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, a, b = i32(sg_device, 2, "flag"), sg_device.zeros((4,), name="a"), sg_device.zeros((4,), name="b")
    with CudaGraph.scope(sg_stream, order="program") as s, s.while_(flag, max_iterations=5) as body:
        body.record(library.add_scalar_op(a.mut(), 1.0))
        body.record(library.add_scalar_op(b.mut(), 1.0))
        body.record(library.count_down_op(flag.mut()))
    loop = s.graph.nodes[0].op
    assert isinstance(loop, sg.While)
    assert [n.deps for n in loop.body.nodes] == [set(), {0}, {1}]
    s.graph.launch()
    s.graph.sync()
    np.testing.assert_array_equal(b.numpy(), 2.0)
    s.graph.close()


# -- branches ---------------------------------------------------------------------------------


def test_a_branch_taken_and_not_taken(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="go"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with s.if_(flag) as then:
            then.record(library.add_scalar_op(x.mut(), 1.0))
            then.record(library.add_scalar_op(x.mut(), 10.0))
        s.record(library.add_scalar_op(x.mut(), 100.0))
    with s.graph as g:
        g.launch()  # flag 0: not taken
        g.sync()
        np.testing.assert_array_equal(x.numpy(), 100.0)
        for value in (1, -7):  # any non-zero value takes it
            g.update(sg.memset(flag.mut(), value))
            g.launch()
        g.sync()
        np.testing.assert_array_equal(x.numpy(), 100.0 + 2 * 111.0)
        assert g.nodes[0].op.label() == "if(go) [2 nodes]"


def test_if_else_takes_exactly_one_side(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="cond")
    taken, other, x = (
        sg_device.zeros((4,), name="taken"),
        sg_device.zeros((4,), name="other"),
        sg_device.zeros((4,), name="x"),
    )
    with CudaGraph.scope(sg_stream) as s, s.if_else(flag) as (then, otherwise):
        then.record(library.add_scalar_op(taken.mut(), 1.0))
        otherwise.record(library.add_scalar_op(other.mut(), 1.0))
        otherwise.record(library.add_scalar_op(x.mut(), 1.0))
    with s.graph as g:
        for value in (0, 1, 0, 0, 5):
            g.update(sg.memset(flag.mut(), value))
            g.launch()
        g.sync()
        assert (taken.numpy()[0], other.numpy()[0], x.numpy()[0]) == (2.0, 3.0, 3.0)
        assert g.nodes[0].op.label() == "if_else(cond) [1 | 2 nodes]"


def test_the_bodies_of_an_if_else_used_as_one_say_how_to_unpack_them(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """`with s.if_else(flag) as then:` binds both bodies to `then`: `then.record(op)` raised
    AttributeError ('tuple' object has no attribute 'record'). The scope is left as if it raised."""
    flag, x = sg_device.zeros((1,), sg.i32, name="cond"), sg_device.zeros((4,), name="x")
    with (
        pytest.raises(sg.ScopeStateError, match="it gives two") as info,
        CudaGraph.scope(sg_stream) as s,
        s.if_else(flag) as then,
    ):
        then.record(library.add_scalar_op(x.mut(), 1.0))  # type: ignore[attr-defined]
    assert "help: unpack them: `with s.if_else(flag) as (then, otherwise):`" in str(info.value)
    assert not hasattr(then, "no_such_thing")
    x.free()  # nothing pinned
    assert_stream_usable(sg_stream)


def test_a_branch_with_an_empty_side_and_a_loop_inside_a_branch(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    go, n, x = i32(sg_device, 1, "go"), sg_device.zeros((1,), sg.i32, name="n"), sg_device.zeros((2,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with s.if_else(go) as (then, _otherwise):  # nothing on the else side
            then.record(sg.memset(n.mut(), 4))
            with then.while_(n, max_iterations=10) as body:
                body.record(library.add_scalar_op(x.mut(), 1.0))
                body.record(library.count_down_op(n.mut()))
        with s.if_(go) as empty_then:
            assert empty_then.nodes == ()
    with s.graph as g:
        g.launch()
        g.update(sg.memset(go.mut(), 0))
        g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 4.0)


# -- the outer DAG ------------------------------------------------------------------------------


def test_the_outer_dag_orders_a_loop_after_its_producers_and_before_its_consumers(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    src, acc, out, unrelated = (sg_device.zeros((32,), name=name) for name in ("src", "acc", "out", "unrelated"))
    with CudaGraph.scope(sg_stream) as s:
        produce = s.record(library.fill_op(src.mut(), 2.0))
        arm = s.record(sg.memset(flag.mut(), 3))
        other = s.record(library.fill_op(unrelated.mut(), 7.0))
        with s.while_(flag, max_iterations=10) as body:
            body.record(library.axpy_op(acc.mut(), src, 1.0))  # reads src, writes acc
            body.record(library.count_down_op(flag.mut()))
        consume = s.record(library.add_op(out.mut(), acc, src))  # reads what the loop wrote
        overwrite = s.record(library.fill_op(src.mut(), -1.0))  # writes what the loop read
        reuse_flag = s.record(sg.memset(flag.mut(), 9))
    loop = s.graph.nodes[3]
    assert isinstance(loop.op, sg.While)
    assert loop.deps == {produce.index, arm.index}
    assert loop.index in consume.deps and loop.index in overwrite.deps and loop.index in reuse_flag.deps
    assert other.index not in loop.deps and all(other.index not in n.deps for n in s.graph.nodes)
    # What the loop borrows as a whole: the body's borrows (src read, acc and flag written) and the flag.
    borrowed = {(b.tensor.name, b.mutable) for b in loop.op.borrows}
    counter = loop.op.counter  # the loop's own iteration counter (max_iterations on the GPU)
    assert counter is not None and counter.shape == (2,)
    assert borrowed == {("flag", True), ("src", False), ("acc", True), (counter.name, True)}
    with s.graph as g:
        for _ in range(5):  # random replay orders on the host: a missing edge would show
            g.launch()
        g.sync()
    np.testing.assert_array_equal(acc.numpy(), 5 * 3 * 2.0)
    np.testing.assert_array_equal(out.numpy(), 5 * 3 * 2.0 + 2.0)  # the last replay: src is 2 when out is computed...
    np.testing.assert_array_equal(src.numpy(), -1.0)  # ...and overwritten after


def test_a_loop_waits_for_earlier_readers_of_what_it_writes(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x, snapshot = (
        i32(sg_device, 0, "flag"),
        sg_device.zeros((8,), name="x"),
        sg_device.zeros((8,), name="snapshot"),
    )
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 2))
        read = s.record(sg.memcpy(snapshot.mut(), x))
        with s.while_(flag, max_iterations=3) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    assert read.index in s.graph.nodes[2].deps
    with s.graph as g:
        for _ in range(4):
            g.launch()
        g.sync()
    np.testing.assert_array_equal(snapshot.numpy(), 6.0)
    np.testing.assert_array_equal(x.numpy(), 8.0)


# -- refusals -------------------------------------------------------------------------------------


def fails_in_body(
    stream: sg.Stream, error: type[Exception], match: str, step: Callable[[sg.Body], object], builds: list[int]
) -> None:
    """``step`` inside a loop body must raise ``error``; no graph, nothing pinned, the stream usable."""
    dev = stream.device
    flag, x = dev.zeros((1,), sg.i32, name="flag"), dev.zeros((8,), name="x")
    before = len(builds)
    with pytest.raises(error, match=match), CudaGraph.scope(stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
        with s.while_(flag, max_iterations=2) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            step(body)
    assert len(builds) == before  # nothing was instantiated
    assert stream.recording is None and not pinned(x) and not pinned(flag)
    with pytest.raises(sg.ScopeStateError, match="ended with an exception"):
        s.graph
    assert_stream_usable(stream)


def test_an_allocation_op_in_a_body_is_refused(sg_stream: sg.Stream, builds: list[int]) -> None:
    fails_in_body(
        sg_stream,
        sg.NotAGraphNodeError,
        "cannot record `sg.zeros` in a graph: it allocates memory",
        lambda body: body.record(sg.zeros((4,))),  # type: ignore[arg-type]
        builds,
    )
    fails_in_body(sg_stream, sg.NotAGraphNodeError, "takes a GraphNode", lambda body: body.record("memset"), builds)  # type: ignore[arg-type]


def test_aliasing_in_a_body_is_refused_at_the_users_line(
    sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]
) -> None:
    y = sg_device.zeros((64,), name="y")
    fails_in_body(
        sg_stream,
        sg.BorrowError,
        "cannot borrow `y` as immutable because it is also borrowed as mutable",
        lambda body: body.record(library.add_op(y.mut(), y, y)),  # type: ignore[scopegraph-borrow]  # the runtime check
        builds,
    )
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    with pytest.raises(sg.BorrowError) as info, CudaGraph.scope(sg_stream) as s, s.while_(flag) as body:
        body.record(sg.memcpy(y[0:8].mut(), y[4:12]))  # overlapping views: the runtime check
    assert raised_at_this_line(info, "body.record(sg.memcpy(y[0:8].mut(), y[4:12]))")
    assert_stream_usable(sg_stream)


def test_a_loop_or_branch_that_raised_pins_nothing_in_the_graph(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """DESIGN.md section 2: a graph pins the tensors it touches. A loop or branch whose block
    raised (the user caught the error and went on recording) is not in the graph, so what only its
    bodies touched stays free to freeze and free; what the graph does touch stays pinned."""
    flag = sg_device.from_numpy(np.array([1], np.int32), name="flag")
    x, kept = sg_device.zeros((4,), name="x"), sg_device.zeros((4,), name="kept")
    only_if, only_loop, only_inner = (sg_device.zeros((4,), name=n) for n in ("only_if", "only_loop", "only_inner"))
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(x.mut(), 1.0))
        with pytest.raises(sg.BorrowError), s.if_(flag) as then:
            then.record(library.fill_op(only_if.mut(), 2.0))
            then.record(library.add_op(x.mut(), x, x))  # type: ignore[scopegraph-borrow]  # the runtime check
        with pytest.raises(RuntimeError), s.while_(flag) as body:
            body.record(library.fill_op(only_loop.mut(), 3.0))
            raise RuntimeError("the user's own error")
        with s.if_(flag) as outer:  # an inner block raises, the outer one is recorded
            outer.record(library.fill_op(kept.mut(), 4.0))
            with pytest.raises(RuntimeError), outer.while_(flag) as inner:
                inner.record(library.fill_op(only_inner.mut(), 5.0))
                raise RuntimeError("the user's own error")
    graph = s.graph
    assert len(graph.nodes) == 2
    assert pinned(x) and pinned(kept)
    for t in (only_if, only_loop, only_inner):
        assert not pinned(t), t.name
        t.freeze()
        t.free()
    with pytest.raises(sg.LifetimeError):
        kept.free()
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(kept.numpy(), np.full(4, 4.0, np.float32))
    graph.close()
    assert_stream_usable(sg_stream)


def test_a_loop_refused_when_its_block_ends_pins_nothing(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """The loop is refused as a whole at the end of its block (its flag was freed inside it, which
    the flag, not pinned until then, allows): what its body touched is not pinned either."""
    flag = sg_device.from_numpy(np.array([1], np.int32), name="flag")
    x, only_loop = sg_device.zeros((4,), name="x"), sg_device.zeros((4,), name="only_loop")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(x.mut(), 1.0))
        with pytest.raises(sg.LifetimeError, match="freed tensor `flag`"), s.while_(flag) as body:
            body.record(library.fill_op(only_loop.mut(), 3.0))
            flag.free()
    with s.graph as graph:
        assert len(graph.nodes) == 1 and pinned(x) and not pinned(only_loop)
        only_loop.freeze()
        only_loop.free()
    assert_stream_usable(sg_stream)


class HostCallback(sg.GraphNode):
    """A node kind a CUDA conditional body cannot hold (like a host callback or an event node)."""

    __slots__ = ()

    def __init__(self, x: sg.Tensor) -> None:
        self._claim([sg._borrow.Borrow(x, False, "x")])

    @property
    def name(self) -> str:
        return "host_callback"


def test_a_node_kind_bodies_cannot_hold_is_refused_when_recorded(
    sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]
) -> None:
    x = sg_device.zeros((4,), name="cb")
    fails_in_body(
        sg_stream,
        sg.NotAGraphNodeError,
        r"cannot record `host_callback` \(HostCallback\) in a loop body",
        lambda body: body.record(HostCallback(x)),
        builds,
    )
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    with (
        pytest.raises(sg.NotAGraphNodeError, match="in a then") as info,
        CudaGraph.scope(sg_stream) as s,
        s.if_else(flag) as (then, _),
    ):
        then.record(HostCallback(x))
    assert raised_at_this_line(info, "then.record(HostCallback(x))")
    assert "help: record this op outside the loop or branch" in str(info.value)
    assert_stream_usable(sg_stream)


def test_recording_into_the_scope_while_a_body_is_open_is_refused(
    sg_device: sg.Device, sg_stream: sg.Stream, builds: list[int]
) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with (
        pytest.raises(
            sg.ScopeStateError,
            match=r"cannot record into the scope while the loop opened at .*test_control.py:\d+ is recording",
        ) as info,
        CudaGraph.scope(sg_stream) as s,
        s.while_(flag),
    ):
        s.record(library.add_scalar_op(x.mut(), 1.0))
    assert "help: record into the handle" in str(info.value)
    assert raised_at_this_line(info, "s.record(library.add_scalar_op(x.mut(), 1.0))")
    fails_in_body(
        sg_stream,
        sg.ScopeStateError,
        "cannot record into the enclosing loop body while the branch",
        lambda body: _record_into_outer(body, flag, x),
        builds,
    )
    assert_stream_usable(sg_stream)


def _record_into_outer(body: sg.Body, flag: sg.Tensor, x: sg.Tensor) -> None:
    with body.if_(flag):
        body.record(library.add_scalar_op(x.mut(), 1.0))


def test_a_closed_body_and_a_finished_scope_refuse_records(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with s.while_(flag) as body:
            pass
        with pytest.raises(sg.ScopeStateError, match="cannot record into a loop body that is closed"):
            body.record(library.add_scalar_op(x.mut(), 1.0))
        used = s.while_(flag)
        with used:
            pass
        with pytest.raises(sg.ScopeStateError, match="this loop or branch block was already used"), used:
            pass
    block = s.if_(flag)
    with pytest.raises(sg.ScopeStateError, match="cannot open a loop or branch in a scope that is finished"), block:
        pass
    with pytest.raises(sg.ScopeStateError, match="not open yet"), CudaGraph.scope(sg_stream).while_(flag):
        pass
    assert_stream_usable(sg_stream)


def test_a_block_never_entered_is_refused_when_the_scope_ends(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """``s.while_(flag)`` (or ``s.if_``, ``s.if_else``, ``s.capture``, in the scope or a body)
    without ``with`` recorded nothing, and the scope built a graph without it: its clean exit now
    refuses the block, naming where it was made. A block whose entry was refused counts as tried."""
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    makers: list[tuple[Callable[[Any], object], str]] = [
        (lambda s: s.while_(flag, max_iterations=3), r"the loop made at .*:\d+ was never entered"),
        (lambda s: s.if_(flag), r"with s\.if_\(flag\) as then:"),
        (lambda s: s.if_else(flag), r"with s\.if_else\(flag\) as \(then, otherwise\):"),
        (lambda s: s.capture(writes=[x.mut()], host=lambda x: None, name="forgot"), "captured region `forgot`"),
    ]
    for make, match in makers:
        with pytest.raises(sg.ScopeStateError, match=match), CudaGraph.scope(sg_stream) as s:
            s.record(library.add_scalar_op(x.mut(), 1.0))
            make(s)
        assert_stream_usable(sg_stream)
        x.free()  # nothing pinned it
        x = sg_device.zeros((4,), name="x")
    with (
        pytest.raises(sg.ScopeStateError, match="the branch made at"),
        CudaGraph.scope(sg_stream) as s,
        s.while_(flag, max_iterations=1) as body,
    ):
        body.if_(flag)
    # A loop dropped by an exception the program catches drops the blocks made in its body too; a
    # block made on a finished scope is kept by nothing.
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
        with contextlib.suppress(KeyError), s.while_(flag, max_iterations=1) as body:
            body.if_(flag)
            raise KeyError
    assert len(s.graph.nodes) == 1
    late = weakref.ref(s.while_(flag))
    gc.collect()
    assert late() is None
    with CudaGraph.scope(sg_stream) as s:
        refused = s.if_(flag)
        with s.while_(flag, max_iterations=1), pytest.raises(sg.ScopeStateError, match="is recording"), refused:
            pass  # the scope is busy with the loop
        later = s.if_(flag)  # made first, entered later in the scope: fine
        s.record(library.add_scalar_op(x.mut(), 1.0))
        with later as then:
            then.record(library.add_scalar_op(x.mut(), 1.0))
    assert len(s.graph.nodes) == 3


@pytest.mark.parametrize(
    ("make_flag", "match"),
    [
        (lambda d: d.zeros((1,), name="f32_flag"), r"flag `f32_flag` is f32\[1\]"),
        (lambda d: d.zeros((2,), sg.i32, name="two"), r"flag `two` is i32\[2\]"),
        (lambda d: d.zeros((1,), sg.i32, name="m").mut(), r"got a mutable borrow \(`m.mut\(\)`\)"),
        (lambda d: 1, "not int"),
    ],
    ids=["f32", "two-elements", "mut", "int"],
)
def test_bad_flags_are_refused(
    sg_device: sg.Device, sg_stream: sg.Stream, make_flag: Callable[[sg.Device], object], match: str
) -> None:
    flag: sg.Tensor = make_flag(sg_device)  # type: ignore[assignment]  # deliberately not always a Tensor
    for kind in ("while_", "if_", "if_else"):
        with pytest.raises(sg.SignatureError, match=match) as info, CudaGraph.scope(sg_stream) as s:
            getattr(s, kind)(flag)
        assert f"`{kind}`" in str(info.value)
        assert "help:" in str(info.value)
    assert_stream_usable(sg_stream)


@pytest.mark.parametrize("bound", [-1, 2**31, 2.5, True, "3"])
def test_bad_bounds_are_refused(sg_device: sg.Device, sg_stream: sg.Stream, bound: object) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    with (
        pytest.raises(sg.SignatureError, match=r"max_iterations=.* is not a whole number"),
        CudaGraph.scope(sg_stream) as s,
    ):
        s.while_(flag, max_iterations=bound)  # type: ignore[arg-type]
    assert_stream_usable(sg_stream)


def test_a_freed_flag_and_a_flag_of_another_device_are_refused(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag = sg_device.zeros((1,), sg.i32, name="gone")
    flag.free()
    with pytest.raises(sg.LifetimeError, match="gone"), CudaGraph.scope(sg_stream) as s:
        s.while_(flag)
    if sg_device.is_cuda:
        other = sg.device("host").zeros((1,), sg.i32, name="elsewhere")
        with (
            pytest.raises(sg.SignatureError, match="flag `elsewhere` is on host"),
            CudaGraph.scope(sg_stream) as s,
            s.while_(other),
        ):
            pass
    assert_stream_usable(sg_stream)


def test_a_loop_node_is_not_run_eagerly(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag) as body:
        body.record(library.add_scalar_op(x.mut(), 1.0))
    loop = s.graph.nodes[0].op
    with pytest.raises(sg.NotAGraphNodeError, match="cannot run `while` eagerly"):
        sg_stream.run(loop)
    with pytest.raises(sg.NotAGraphNodeError, match="runs only inside a graph"):
        s.graph.update(loop)
    s.graph.close()
    assert_stream_usable(sg_stream)


def test_an_error_caught_inside_the_scope_leaves_it_recording(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.NotAGraphNodeError), s.while_(flag) as body:
            body.record(sg.zeros((4,)))  # type: ignore[arg-type]
        s.record(library.add_scalar_op(x.mut(), 1.0))  # the failed loop is not recorded; the scope goes on
    assert [n.op.name for n in s.graph.nodes] == ["add_scalar"]
    s.graph.launch()
    s.graph.sync()
    np.testing.assert_array_equal(x.numpy(), 1.0)
    s.graph.close()


def test_a_graph_with_a_loop_pins_what_its_body_uses(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=2) as body:
        assert pinned(flag) is False  # the flag is pinned when the loop is recorded
        body.record(library.add_scalar_op(x.mut(), 1.0))
        assert pinned(x)
    assert pinned(x) and pinned(flag)
    with pytest.raises(sg.LifetimeError):
        x.free()
    with pytest.raises(sg.BorrowError, match="writes it"):
        x.freeze()
    loop = s.graph.nodes[0].op
    assert isinstance(loop, sg.While) and loop.body._root is None  # no cycle graph -> body -> scope -> graph
    s.graph.close()
    assert not pinned(x) and not pinned(flag)
    x.free()


# -- pictures ----------------------------------------------------------------------------------


def test_dot_draws_bodies_as_clusters(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    i, j, go = (sg_device.zeros((1,), sg.i32, name=name) for name in ("i", "j", "go"))
    x = sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(i.mut(), 2))
        with s.while_(i, max_iterations=4) as body:
            with body.while_(j) as inner:
                inner.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.add_scalar_op(x.mut(), 5.0))
            body.record(library.count_down_op(i.mut()))
        with s.if_else(go) as (then, otherwise):
            then.record(library.add_scalar_op(x.mut(), 2.0))
            otherwise.record(library.add_scalar_op(x.mut(), 3.0))
    dot = s.graph.to_dot()
    assert 'n1 [label="1: while(i, max 4) [3 nodes]"];' in dot and "n1 [shape=diamond];" in dot
    assert 'subgraph "cluster_n1_body" {' in dot and 'label="loop body of i";' in dot
    assert 'subgraph "cluster_n1_body_0_body" {' in dot  # the inner loop, nested in the outer cluster
    assert dot.index('"cluster_n1_body_0_body"') > dot.index('"cluster_n1_body"')
    assert 'n1_body_0_body_0 [label="0: add_scalar(mut x)"];' in dot
    assert "n1 -> n1_body_0 [style=dotted];" in dot and 'n1_body_0 -> n1_body_1 [label="x"];' in dot
    assert "n1 -> n1_body_2 [style=dotted];" in dot  # count_down(i) is a root of the body
    assert "dashed" not in dot  # programmatic edges only (none on the host backend)
    assert 'subgraph "cluster_n2_then" {' in dot and 'subgraph "cluster_n2_else" {' in dot
    assert 'label="else of go";' in dot
    assert "n1 -> n2" in dot  # x: the branch comes after the loop
    assert dot.count("{") == dot.count("}")
    s.graph.close()


def test_the_condition_kernel_compiles_for_sm_90() -> None:
    pytest.importorskip("cuda.core")
    from scopegraph._compile import compile_kernel
    from scopegraph._control import sg_condition

    assert compile_kernel(sg_condition, "sm_90") is not None


# -- the seed model's decode loop ------------------------------------------------------------------

CFG = Config(d=64, n_layers=3)


def decode_both_ways(device: sg.Device, k: int, launches: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens from the decode loop (``launches`` launches of K tokens) and from K x launches
    launches of the one-token graph, from the same start; and the start itself."""
    x0 = np.random.default_rng(3).standard_normal(CFG.d).astype(np.float32)
    model = LayerStack(device, CFG)
    stream = device.stream()
    start = device.from_numpy(x0, name="x0")
    buf = model.decode_buffers(k)
    loop_out = []
    with model.record_decode_graph(stream, buf) as g:
        g.update(sg.memcpy(model.hidden.mut(), start))
        for _ in range(launches):
            g.launch()
            g.sync()
            loop_out.append(buf.out.numpy())
        assert buf.position.numpy()[0] == k and buf.flag.numpy()[0] == 0
    stream.run(sg.memcpy(model.hidden.mut(), start))
    token_out = []
    with model.record_token_graph(stream, buf) as g:
        for _ in range(launches):
            g.update(sg.memset(buf.position.mut(), 0))
            for _ in range(k):
                g.launch()
            g.sync()
            token_out.append(buf.out.numpy())
    return np.stack(loop_out), np.stack(token_out), x0


@pytest.mark.parametrize("k", [1, 5])
def test_the_decode_loop_equals_k_launches_of_the_one_token_graph(sg_device: sg.Device, k: int) -> None:
    loop_tokens, token_tokens, x0 = decode_both_ways(sg_device, k, launches=2)
    np.testing.assert_array_equal(loop_tokens, token_tokens)  # exactly
    model = LayerStack(sg.device("host"), CFG)
    for i in range(k):  # token i is the hidden state after i + 1 passes; the second launch continues
        assert relative_error(loop_tokens[0][i], reference_forward(model.host_weights, x0, CFG.eps, steps=i + 1)) < 1e-4
        assert (
            relative_error(loop_tokens[1][i], reference_forward(model.host_weights, x0, CFG.eps, steps=k + i + 1))
            < 1e-4
        )


def test_the_decode_graph_is_one_loop_node(sg_device: sg.Device) -> None:
    model = LayerStack(sg_device, CFG)
    buf = model.decode_buffers(4)
    with model.record_decode_graph(sg_device.stream(), buf) as g:
        assert [n.op.name for n in g.nodes] == ["memset", "memset", "while"]
        loop = g.nodes[2].op
        assert isinstance(loop, sg.While) and loop.max_iterations == 4
        assert len(loop.body.nodes) == 5 * CFG.n_layers + 1
        assert loop.body.nodes[-1].op.label() == "append_row(mut tokens, mut position, mut more, hidden)"
        assert loop.body.condition_deps == {len(loop.body.nodes) - 1}  # the flag's last writer


def test_a_decode_loop_of_zero_tokens_runs_no_layer(sg_device: sg.Device) -> None:
    model = LayerStack(sg_device, CFG)
    buf = model.decode_buffers(0)
    stream = sg_device.stream()
    stream.run(sg.memcpy(model.hidden.mut(), sg_device.from_numpy(np.ones(CFG.d, np.float32))))
    with model.record_decode_graph(stream, buf) as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(model.hidden.numpy(), 1.0)
    assert buf.position.numpy()[0] == 0


def test_two_parameters_of_one_name_are_refused_in_a_body_too(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Bodies take sg.Params (graph.launch(name=value) updates their nodes: tests/test_bodies.py);
    one name is one parameter across the scope and its bodies."""
    flag, x = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="x")
    with (
        pytest.raises(sg.SignatureError, match=r"two different parameters are named `step` in one scope") as info,
        CudaGraph.scope(sg_stream) as s,
    ):
        s.record(library.add_scalar[1, 4](x.mut(), sg.Param("step", sg.f32, 1.0), 4))
        with s.while_(flag) as body:
            body.record(library.add_scalar[1, 4](x.mut(), sg.Param("step", sg.f32, 2.0), 4))
    assert raised_at_this_line(info, 'body.record(library.add_scalar[1, 4](x.mut(), sg.Param("step", sg.f32, 2.0)')
    assert "help: use one sg.Param object" in str(info.value)
    assert_stream_usable(sg_stream)


# -- the command line ------------------------------------------------------------------------------


def test_the_demo_and_the_bench_run_the_decode_loop_on_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scopegraph._cli import bench, demo

    assert demo.main(sg.device("host"), tokens=6, d=32, n_layers=2) == 0
    out = capsys.readouterr().out
    assert "decode loop: 6 tokens per graph.launch(), a while loop of 11 nodes on the device" in out
    assert "6 launches of the one-token graph: identical: OK" in out
    assert "decode, one launch:" in out and "decode, 6 launches:" in out
    result = bench.run(tmp_path, sg.device("host"), quick=True, only=["decode"])
    rows = result["decode"]["rows"]
    assert [row["k"] for row in rows] == [1, 16]
    assert all(
        row["identical"] and min(row["loop_tok_s"], row["launches_tok_s"], row["host_decides_tok_s"]) > 0
        for row in rows
    )
    assert "## 7. decode loop" in (tmp_path / "bench.txt").read_text()


PDL_SOURCE = r"""
extern "C" __global__ void pdl_add(float* out, float value, int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += value;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"""


@sg.kernel(PDL_SOURCE, touches={"out": "n"}, pdl=True)
def pdl_add(out: Mut[Tensor], value: sg.f32, n: sg.i32) -> None: ...


@pdl_add.host
def _pdl_add(out: NDArray, value: np.float32, n: np.int32) -> None:
    out[:n] += value


def test_edges_between_pdl_kernels_in_a_body_are_programmatic(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag, x = i32(sg_device, 3, "flag"), sg_device.zeros((64,), name="x")
    with CudaGraph.scope(sg_stream) as s, s.while_(flag, max_iterations=5) as body:
        first = body.record(pdl_add[1, 64](x.mut(), 1.0, 64))
        second = body.record(pdl_add[1, 64](x.mut(), 2.0, 64))
        down = body.record(library.count_down_op(flag.mut()))
    assert second.deps == {first.index} and second.programmatic == {first.index}
    assert first.programmatic == set() and down.programmatic == set()
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(x.numpy(), 9.0)


def test_the_loop_kernels_of_the_library(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    flag = i32(sg_device, 3, "flag")
    sg_stream.run(library.count_down_op(flag.mut()))
    out = sg_device.from_numpy(np.full((2, 5), -1.0, np.float32), name="out")
    position, more = i32(sg_device, 0, "position"), i32(sg_device, 1, "more")
    x = sg_device.from_numpy(np.arange(5, dtype=np.float32), name="x")
    for _ in range(3):  # the third call is past the last row: nothing written, the flag stays 0
        sg_stream.run(library.append_row_op(out.mut(), position.mut(), more.mut(), x))
        sg_stream.run(library.add_scalar_op(x.mut(), 10.0))
    sg_stream.sync()
    assert flag.numpy()[0] == 2 and position.numpy()[0] == 3 and more.numpy()[0] == 0
    np.testing.assert_array_equal(out.numpy(), [np.arange(5), np.arange(5) + 10])
    with pytest.raises(sg.SignatureError, match=r"append_row_op needs `out` of shape \(rows, 5\)"):
        library.append_row_op(sg_device.zeros((4, 3)).mut(), position.mut(), more.mut(), x)
    with pytest.raises(sg.SignatureError, match="count_down` parameter `flag` got"):
        library.count_down_op(sg_device.zeros((1,)).mut())  # an f32 flag


def test_a_loop_of_one_graph_is_not_recorded_into_another(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Its bodies belong to the graph its `with` block recorded it into: a rebind or re-recording
    of that graph would change them under the other one."""
    flag, w = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((4,), name="w")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag, max_iterations=5) as body:
            body.record(library.add_scalar_op(w.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    loop = s.graph.nodes[1].op
    with CudaGraph.scope(sg_stream) as again:
        with pytest.raises(sg.ScopeStateError, match=r"(?s)`while` is recorded already.*\nhelp: open the loop"):
            again.record(loop)
        with again.if_(flag) as then, pytest.raises(sg.ScopeStateError, match="recorded already"):
            then.record(loop)
        again.record(sg.memset(w.mut(), 0.0))
    assert len(again.graph.nodes) == 2  # the branch (empty) and the memset
    again.graph.close()
    s.graph.launch()
    s.graph.sync()
    np.testing.assert_array_equal(w.numpy(), 2.0)
    s.graph.close()
    assert not pinned(w) and not pinned(flag)
    assert_stream_usable(sg_stream)
