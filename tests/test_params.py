"""Graph parameters (issue 9): ``sg.Param`` where a kernel takes a scalar, ``graph.launch(name=value)``
updating only the nodes that use a changed value, ``graph.params``, and every refusal leaving the
graph exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import assert_stream_usable

B = library.ELEMENTWISE_BLOCK
N = 300  # two blocks, the second partial


def program(s: sg.Scope, x: sg.Tensor, y: sg.Tensor, a: float | sg.Param[float], n: int | sg.Param[int] = N) -> None:
    """x += 1; y += a * x; x += a; y[:n] += 0.25 (a used twice, n once)."""
    s.record(library.add_scalar_op(x.mut(), 1.0))
    s.record(library.axpy[2, B](y.mut(), x, a, N))
    s.record(library.add_scalar[2, B](x.mut(), a, N))
    s.record(library.add_scalar[2, B](y.mut(), 0.25, n))


def spy(graph: CudaGraph) -> list[int]:
    """The node indices the executable is asked to update from now on."""
    exe = graph.executable
    calls: list[int] = []
    original = exe.update_node

    def update_node(index: int, op: sg.GraphNode, values: Any) -> None:
        calls.append(index)
        original(index, op, values)

    setattr(exe, "update_node", update_node)  # noqa: B010  (a method of a Protocol-typed object)
    return calls


def last_update(graph: CudaGraph) -> str | None:
    return graph.last_update  # (read through a call: mypy would keep an earlier narrowing of the attribute)


def state(dev: sg.Device, seed: int) -> tuple[sg.Tensor, sg.Tensor, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(N).astype(np.float32)
    y0 = rng.standard_normal(N).astype(np.float32)
    return dev.from_numpy(x0, name="x"), dev.from_numpy(y0, name="y"), x0, y0


def fresh(
    stream: sg.Stream, x0: np.ndarray[Any, Any], y0: np.ndarray[Any, Any], a: float, n: int = N
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """One replay of a graph freshly recorded with the literal values, from the given state."""
    dev = stream.device
    x, y = dev.from_numpy(x0, name="fx"), dev.from_numpy(y0, name="fy")
    with CudaGraph.scope(stream) as s:
        program(s, x, y, a, n)
    with s.graph as g:
        g.launch()
        g.sync()
    return x.numpy(), y.numpy()


def test_parameter_changes_give_a_fresh_graphs_results_replay_after_replay(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    x, y, x0, y0 = state(sg_device, 1)
    a = sg.Param("a", sg.f32, 0.5)
    n = sg.Param("n", sg.i32, N)
    with CudaGraph.scope(sg_stream) as s:
        program(s, x, y, a, n)
    graph = s.graph
    assert graph.params == {"a": np.float32(0.5), "n": np.int32(N)}
    assert graph.last_update is None
    calls = spy(graph)
    steps: list[tuple[dict[str, Any], float, int]] = [
        ({}, 0.5, N),
        ({"a": 2.0}, 2.0, N),
        ({"a": 2.0}, 2.0, N),  # unchanged: no update
        ({"a": -0.0}, -0.0, N),
        ({"a": 0.1, "n": 17}, 0.1, 17),
        ({"n": 17}, 0.1, 17),
        ({"a": 1e-7}, 1e-7, 17),
        ({"n": 0}, 1e-7, 0),
        ({"a": np.float32(3.25), "n": np.int64(N)}, 3.25, N),
        ({}, 3.25, N),
    ]
    for i, (given, a_now, n_now) in enumerate(steps):
        want_x, want_y = fresh(sg_stream, x0, y0, a_now, n_now)
        graph.launch(**given)
        graph.sync()
        x0, y0 = x.numpy(), y.numpy()
        np.testing.assert_array_equal(x0, want_x, err_msg=f"step {i}: {given}")
        np.testing.assert_array_equal(y0, want_y, err_msg=f"step {i}: {given}")
        assert graph.params == {"a": np.float32(a_now), "n": np.int32(n_now)}
    # Only the nodes that use a changed parameter were updated, once per change: a in nodes 1, 2; n in node 3.
    assert calls == [1, 2, 1, 2, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert last_update(graph) == "nodes"
    graph.close()


def test_one_param_object_in_many_nodes_and_the_eager_default(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((8,), name="out")
    step = sg.Param("step", sg.f32, 1.0)
    op = library.add_scalar[1, 32](out.mut(), step, 8)
    sg_stream.run(op)  # eagerly: the default
    np.testing.assert_array_equal(out.numpy(), np.ones(8))
    with CudaGraph.scope(sg_stream) as s:
        for _ in range(3):
            s.record(op)
    with s.graph as g:
        g.launch(step=2.0)
        g.launch()
        g.sync()
        np.testing.assert_array_equal(out.numpy(), np.full(8, 13.0))
    sg_stream.run(op)  # still the default: parameter values belong to graphs
    np.testing.assert_array_equal(out.numpy(), np.full(8, 14.0))


def refused_launch(graph: CudaGraph, out: sg.Tensor, expect: type[Exception], match: str, **given: Any) -> None:
    """The launch raises before anything is updated or launched; the graph then replays as before."""
    before_params, before_update = graph.params, graph.last_update
    before_ops = [n.op for n in graph.nodes]
    calls = spy(graph)
    graph.sync()
    snapshot = out.numpy()
    with pytest.raises(expect, match=match) as info:
        graph.launch(**given)
    assert "help:" in str(info.value)
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), snapshot)  # nothing ran
    assert calls == [] and graph.params == before_params and graph.last_update == before_update
    assert [n.op for n in graph.nodes] == before_ops
    graph.launch()
    graph.sync()
    assert not np.array_equal(out.numpy(), snapshot)  # and it still replays


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"b": 1.0}, r"graph #\d+ has no parameter `b`(.|\n)*its parameters: a \(sg.f32\), n \(sg.i32\)"),
        ({"n": 1.5}, r"parameter `n` of graph #\d+ is float 1.5, but the parameter is sg.i32"),
        ({"n": 4.0}, r"parameter `n` of graph #\d+ is float 4.0, but the parameter is sg.i32"),  # as a direct argument
        ({"n": 2**31}, r"sg.i32 holds -2147483648..2147483647"),
        ({"a": 1e39}, r"overflows sg.f32"),
        ({"a": "2"}, r"sg.f32 takes a number, not str"),
        ({"n": True}, r"sg.i32 takes an integer, not bool"),
        (
            {"a": 3.0, "n": 301},
            r"`add_scalar` would touch 301 elements of `out`, but `y` has 300",
        ),  # a valid, n not: neither applies
        ({"n": -1}, r"would touch -1 elements"),
    ],
    ids=[
        "unknown-name",
        "inexact-int",
        "integral-float-for-int",
        "int-range",
        "float-overflow",
        "not-a-number",
        "bool-for-int",
        "size-past-tensor",
        "negative-size",
    ],
)
def test_a_refused_value_changes_nothing(
    sg_device: sg.Device, sg_stream: sg.Stream, given: dict[str, Any], match: str
) -> None:
    x, y, _, _ = state(sg_device, 2)
    with CudaGraph.scope(sg_stream) as s:
        program(s, x, y, sg.Param("a", sg.f32, 0.5), sg.Param("n", sg.i32, N))
    with s.graph as graph:
        graph.launch(a=1.5)
        refused_launch(graph, y, sg.SignatureError, match, **given)
        assert graph.params["a"] == np.float32(1.5)


def test_a_graph_without_parameters_refuses_names(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((8,), name="out")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(out.mut(), 1.0))
    with s.graph as graph:
        assert graph.params == {}
        refused_launch(graph, out, sg.SignatureError, r"has no parameter `eps`(.|\n)*its parameters: none", eps=1.0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: sg.Param("stream", sg.f32, 1.0),
            r"sg.Param name 'stream' cannot be a keyword argument of graph.launch",
        ),
        (
            lambda: sg.Param("self", sg.f32, 1.0),
            r"sg.Param name 'self' cannot be a keyword argument of graph.launch",
        ),
        (lambda: sg.Param("two words", sg.f32, 1.0), r"name 'two words' cannot"),
        (lambda: sg.Param("class", sg.f32, 1.0), r"name 'class' cannot"),
        (lambda: sg.Param(3, sg.f32, 1.0), r"name 3 cannot"),  # type: ignore[call-overload]
        (lambda: sg.Param("n", sg.i32, 1.5), r"the default of parameter `n` is float 1.5, but the parameter is sg.i32"),
        (lambda: sg.Param("n", sg.i32, 8.0), r"the default of parameter `n` is float 8.0, but the parameter is sg.i32"),
        (lambda: sg.Param("n", "complex128", 1), r"is not a dtype scopegraph supports"),
    ],
    ids=[
        "reserved",
        "reserved-self",
        "not-identifier",
        "keyword",
        "not-a-string",
        "inexact-default",
        "float-default",
        "bad-dtype",
    ],
)
def test_param_declarations_are_checked(make: Callable[[], object], match: str) -> None:
    with pytest.raises(sg.SignatureError, match=match) as info:
        make()
    assert "help:" in str(info.value)


def test_a_param_must_have_the_declared_type(sg_device: sg.Device) -> None:
    out = sg_device.zeros((8,), name="out")
    wide = sg.Param("a", sg.f64, 1.0)
    with pytest.raises(
        sg.SignatureError,
        match=r"`add_scalar` parameter `value` expects sg.f32, got sg.Param\('a', sg.f64, 1.0\) of sg.f64",
    ) as info:
        library.add_scalar[1, 32](out.mut(), wide, 8)  # (mypy sees float either way: the width is checked here)
    assert "help: declare the parameter as sg.Param('a', sg.f32, ...)" in str(info.value)
    with pytest.raises(sg.SignatureError, match=r"`add_scalar` would touch 9 elements of `out`"):
        library.add_scalar[1, 32](out.mut(), 1.0, sg.Param("n", sg.i32, 9))  # the default is checked like a literal


def test_two_params_of_one_name_in_a_scope_are_refused_at_record(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((8,), name="out")
    same = sg.Param("v", sg.f32, 1.0)
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar[1, 32](out.mut(), same, 8))
        s.record(library.add_scalar[1, 32](out.mut(), sg.Param("v", sg.f32, 1.0), 8))  # equal: one parameter
    with s.graph as g:
        g.launch(v=2.0)
        g.sync()
        np.testing.assert_array_equal(out.numpy(), np.full(8, 4.0))  # both nodes took the value
    refused = pytest.raises(sg.SignatureError, match=r"two different parameters are named `v` in one scope")
    with refused as info, CudaGraph.scope(sg_stream) as s2:
        s2.record(library.add_scalar[1, 32](out.mut(), same, 8))
        s2.record(library.add_scalar[1, 32](out.mut(), sg.Param("v", sg.f32, 2.0), 8))
    assert "help:" in str(info.value)
    assert not out.allocation.pins
    assert_stream_usable(sg_stream)


def test_params_of_a_closed_graph(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((8,), name="out")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar[1, 32](out.mut(), sg.Param("v", sg.f32, 1.0), 8))
    graph = s.graph
    graph.close()
    with pytest.raises(sg.LifetimeError, match="is closed"):
        graph.params
    with pytest.raises(sg.LifetimeError, match="is closed"):
        graph.launch(v=2.0)


def test_a_param_inside_a_device_loop_takes_its_launch_value(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A loop body's node uses the parameter's current value in every iteration (more in tests/test_bodies.py)."""
    out = sg_device.zeros((8,), name="out")
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    inner = sg.Param("inner", sg.f32, 1.0)
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag) as body:
            body.record(library.add_scalar[1, 32](out.mut(), inner, 8))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        assert graph.params == {"inner": np.float32(1.0)}
        calls = spy(graph)
        graph.launch(inner=3.0)
        graph.launch(inner=3.0)  # unchanged: nothing updated
        graph.sync()
        assert calls == [2] and graph.last_update in ("nodes", "whole")  # slot 2: the body's first node
        np.testing.assert_array_equal(out.numpy(), np.full(8, 12.0))
    assert_stream_usable(sg_stream)


def test_update_runs_an_op_with_the_graphs_current_parameter_values(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """graph.update(op) is the op as part of the graph's program: each sg.Param the graph has (by
    name) takes the graph's current value, whichever Param object the op was built with; a Param
    the graph does not have keeps its default. stream.run(op) still takes the defaults."""
    out = sg_device.zeros((8,), name="out")
    other = sg_device.zeros((8,), name="other")
    step = sg.Param("step", sg.f32, 1.0)
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar[1, 32](out.mut(), step, 8))
    with s.graph as graph:
        graph.update(library.add_scalar[1, 32](other.mut(), step, 8))  # never launched with a value: the default
        graph.sync()
        np.testing.assert_array_equal(other.numpy(), np.full(8, 1.0))
        graph.launch(step=2.0)
        graph.update(library.add_scalar[1, 32](other.mut(), step, 8))  # the graph's value, not the default
        graph.update(library.add_scalar[1, 32](other.mut(), sg.Param("step", sg.f32, 5.0), 8))  # by name
        graph.update(graph.nodes[0].op)  # the graph's own node: out = 2 + 2
        graph.update(library.add_scalar[1, 32](other.mut(), sg.Param("elsewhere", sg.f32, 0.5), 8))  # its default
        graph.sync()
        np.testing.assert_array_equal(other.numpy(), np.full(8, 1.0 + 2.0 + 2.0 + 0.5))
        np.testing.assert_array_equal(out.numpy(), np.full(8, 4.0))
        graph.launch()  # the value stays: out = 4 + 2
        graph.update(library.add_scalar[1, 32](out.mut(), step, 8))
        graph.sync()
        np.testing.assert_array_equal(out.numpy(), np.full(8, 8.0))
        assert graph.params == {"step": np.float32(2.0)}  # an update changes no parameter
    sg_stream.run(library.add_scalar[1, 32](other.mut(), step, 8))  # eagerly: still the default
    np.testing.assert_array_equal(other.numpy(), np.full(8, 6.5))


def test_update_takes_the_values_of_parameters_in_loop_bodies_and_after_a_rerecording(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    out = sg_device.zeros((8,), name="out")
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    inner = sg.Param("inner", sg.f32, 1.0)

    def record(s: sg.Scope) -> None:
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag) as body:
            body.record(library.add_scalar[1, 32](out.mut(), inner, 8))
            body.record(library.count_down_op(flag.mut()))

    with CudaGraph.scope(sg_stream) as s:
        record(s)
    with s.graph as graph:
        graph.launch(inner=3.0)  # out = 6
        graph.update(library.add_scalar[1, 32](out.mut(), inner, 8))  # a body's parameter: out = 9
        graph.sync()
        np.testing.assert_array_equal(out.numpy(), np.full(8, 9.0))
        with CudaGraph.scope(sg_stream, into=graph) as again:  # parameters start again at their defaults
            record(again)
        graph.update(library.add_scalar[1, 32](out.mut(), inner, 8))  # out = 10
        graph.sync()
        np.testing.assert_array_equal(out.numpy(), np.full(8, 10.0))


def test_update_refuses_a_parameter_of_the_graphs_name_and_another_dtype(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    out = sg_device.zeros((8,), name="out")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar[1, 32](out.mut(), sg.Param("v", sg.f32, 1.0), 8))
    with s.graph as graph:
        graph.launch(v=2.0)
        graph.sync()
        other = sg_device.zeros((8,), name="other")
        op = library.add_scalar[1, 32](other.mut(), 1.0, sg.Param("v", sg.i32, 8))
        with pytest.raises(
            sg.SignatureError,
            match=r"graph #\d+ cannot run `add_scalar` with its parameter `v`: the graph's `v` is sg.f32, "
            r"the op's is sg.i32(.|\n)*help: ",
        ) as info:
            graph.update(op)
        assert "give the op's sg.Param another name" in str(info.value)
        graph.sync()
        np.testing.assert_array_equal(other.numpy(), np.zeros(8))  # nothing ran
        assert graph.params == {"v": np.float32(2.0)}
        sg_stream.run(op)  # the op itself is fine: eagerly, its default
        np.testing.assert_array_equal(other.numpy(), np.ones(8))


def test_update_checks_sizes_with_the_graphs_values(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A graph's value that would make the op reach past its tensors is refused, and nothing runs."""
    big = sg_device.zeros((N,), name="big")
    small = sg_device.zeros((8,), name="small")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar[2, B](big.mut(), 1.0, sg.Param("n", sg.i32, N)))
    with s.graph as graph:
        op = library.add_scalar[2, B](small.mut(), 1.0, sg.Param("n", sg.i32, 8))  # fits with its default
        with pytest.raises(
            sg.SignatureError, match=r"`add_scalar` would touch 300 elements of `out`, but `small` has 8(.|\n)*help: "
        ) as info:
            graph.update(op)
        assert f"graph.update() runs it with graph #{graph.id}'s current values: n=300" in str(info.value)
        graph.sync()
        np.testing.assert_array_equal(small.numpy(), np.zeros(8))  # nothing ran
        graph.launch(n=8)
        graph.update(op)
        graph.sync()
        np.testing.assert_array_equal(small.numpy(), np.ones(8))
    assert_stream_usable(sg_stream)
