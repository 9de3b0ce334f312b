"""``graph.rebind({old: new})`` (issue 9): nodes move to new tensors by node update, with the
ownership rules checked again and the pins moved; every refusal leaves the graph exactly as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import pinned

NDArray = np.ndarray[Any, np.dtype[Any]]
N = 64


def record(s: sg.Scope, inp: sg.Tensor, acc: sg.Tensor, tmp: sg.Tensor, a: float | sg.Param[float] = 2.0) -> None:
    """tmp = inp + inp; acc += a * tmp; inp[0:32] += 1 (a view of inp)."""
    s.record(library.add_op(tmp.mut(), inp, inp))
    s.record(library.axpy[1, N](acc.mut(), tmp, a, N))
    s.record(library.add_scalar_op(inp[0:32].mut(), 1.0))


def reference(inp: NDArray, acc: NDArray, a: float) -> tuple[NDArray, NDArray]:
    """One replay of a freshly recorded graph on host copies (host backend: exact numpy semantics)."""
    dev = sg.device("host")
    i, c, t = dev.from_numpy(inp), dev.from_numpy(acc), dev.zeros((N,))
    with CudaGraph.scope(dev.stream()) as s:
        record(s, i, c, t, a)
    with s.graph as g:
        g.launch()
    return i.numpy(), c.numpy()


def test_rebinding_gives_a_fresh_graphs_results_replay_after_replay(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(3)
    inputs = [sg_device.from_numpy(rng.integers(-8, 8, N).astype(np.float32), name=f"in{i}") for i in range(3)]
    accs = [sg_device.from_numpy(rng.integers(-8, 8, N).astype(np.float32), name=f"acc{i}") for i in range(2)]
    tmp = sg_device.zeros((N,), name="tmp")
    a = sg.Param("a", sg.f32, 2.0)
    with CudaGraph.scope(sg_stream) as s:
        record(s, inputs[0], accs[0], tmp, a)
    graph = s.graph
    graph.launch(a=0.5)  # a parameter value survives rebinds
    graph.sync()
    current_in, current_acc = inputs[0], accs[0]
    for step in range(12):
        new_in = inputs[(step + 1) % 3]
        new_acc = accs[step % 2] if step % 4 == 3 else current_acc
        mapping = {current_in: new_in} | ({current_acc: new_acc} if new_acc is not current_acc else {})
        want_in, want_acc = reference(new_in.numpy(), new_acc.numpy(), 0.5)
        graph.rebind(mapping)
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(new_in.numpy(), want_in, err_msg=f"step {step}")
        np.testing.assert_array_equal(new_acc.numpy(), want_acc, err_msg=f"step {step}")
        current_in, current_acc = new_in, new_acc
        assert graph.last_update == "nodes"
    # The handles and labels name the new tensors; the view moved with its tensor.
    assert [n.op.label() for n in graph.nodes] == [
        f"add(mut tmp, {current_in.name}, {current_in.name})",
        f"axpy(mut {current_acc.name}, tmp)",
        f"add_scalar(mut {current_in.name}[0:32])",
    ]
    assert graph.params == {"a": np.float32(0.5)}
    graph.close()


def test_pins_move_from_old_to_new(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, acc, tmp = (
        sg_device.full((N,), 1.0, name="x"),
        sg_device.zeros((N,), name="acc"),
        sg_device.zeros((N,), name="tmp"),
    )
    x2 = sg_device.full((N,), 3.0, name="x2")
    with CudaGraph.scope(sg_stream) as s:
        record(s, x, acc, tmp)
    graph = s.graph
    graph.launch()
    assert pinned(x) and not pinned(x2)
    with pytest.raises(sg.BorrowError, match="cannot freeze `x`"):
        x.freeze()  # the graph writes x[0:32]
    graph.rebind({x: x2})
    assert pinned(x2) and not pinned(x)
    x.freeze()  # no live graph writes it any more
    x.free()
    with pytest.raises(sg.LifetimeError, match="cannot free `x2` while it is in use"):
        x2.free()
    with pytest.raises(sg.BorrowError, match="cannot freeze `x2`"):
        x2.freeze()
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(acc.numpy(), np.full(N, 4.0 + 2 * 2 * 3.0))
    graph.close()
    assert not pinned(x2)
    x2.free()


def test_rebind_into_memory_the_dag_already_orders(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Program order chains every node: two nodes may come to share memory, and the result is the fresh graph's."""
    p, q = sg_device.zeros((N,), name="p"), sg_device.zeros((N,), name="q")
    with CudaGraph.scope(sg_stream, order="program") as s:
        s.record(library.fill_op(p.mut(), 1.0))
        s.record(library.fill_op(q.mut(), 2.0))
        s.record(library.add_scalar_op(p.mut(), 5.0))
    with s.graph as graph:
        graph.rebind({q: p})
        for _ in range(3):
            graph.launch()
        graph.sync()
        np.testing.assert_array_equal(p.numpy(), np.full(N, 7.0))


class Setup:
    def __init__(self, dev: sg.Device, stream: sg.Stream) -> None:
        self.dev = dev
        self.p = dev.zeros((N,), name="p")
        self.q = dev.zeros((N,), name="q")
        self.src = dev.full((N,), 2.0, name="src")
        self.out = dev.zeros((N,), name="out")
        with CudaGraph.scope(stream) as s:
            s.record(library.fill_op(self.p.mut(), 1.0))  # node 0
            s.record(library.fill_op(self.q.mut(), 3.0))  # node 1: independent of node 0
            s.record(library.add_op(self.out.mut(), self.src, self.src))  # node 2
            s.record(library.add_scalar_op(self.out[0:16].mut(), 1.0))  # node 3, after node 2
        self.graph = s.graph


def refused(setup: Setup, mapping: Any, expect: type[Exception], match: str) -> None:
    """The rebind raises with a help line, and the graph is exactly as before: same ops, pins, and results."""
    graph = setup.graph
    ops = [n.op for n in graph.nodes]
    pins = {a: dict(a.pins) for a in (t.allocation for t in (setup.p, setup.q, setup.src, setup.out))}
    with pytest.raises(expect, match=match) as info:
        graph.rebind(mapping)
    assert "help:" in str(info.value)
    assert [n.op for n in graph.nodes] == ops
    assert {a: dict(a.pins) for a in pins} == pins
    assert graph.last_update is None
    for t in (setup.p, setup.q, setup.out):
        setup.dev.stream().run(sg.memset(t.mut(), 0.0))
    for _ in range(2):
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(setup.p.numpy(), np.full(N, 1.0))
    np.testing.assert_array_equal(setup.q.numpy(), np.full(N, 3.0))
    np.testing.assert_array_equal(setup.out.numpy(), np.r_[np.full(16, 5.0), np.full(N - 16, 4.0)])


def test_rebinding_nothing_updates_nothing(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    setup.graph.rebind({})
    assert setup.graph.last_update is None  # it tells what happened: nothing


def test_refused_dtype(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    refused(
        setup,
        {setup.p: sg_device.zeros((N,), sg.i32, name="ints")},
        sg.SignatureError,
        r"cannot rebind `p` to `ints`(.|\n)*`ints`: i32\[64\]",
    )


def test_refused_shape(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    refused(
        setup,
        {setup.p: sg_device.zeros((N + 1,), name="long")},
        sg.SignatureError,
        r"cannot rebind `p` to `long`(.|\n)*f32\[65\]",
    )
    refused(
        setup, {setup.p: sg_device.zeros((8, 8), name="square")}, sg.SignatureError, r"cannot rebind `p` to `square`"
    )


def test_refused_device(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    from scopegraph._driver import cuda_device_count

    if cuda_device_count() == 0:
        pytest.skip("needs a second backend (a GPU) for a tensor on another device")
    other = sg.device("host" if sg_device.is_cuda else "cuda")
    setup = Setup(sg_device, sg_stream)
    refused(
        setup, {setup.p: other.zeros((N,), name="elsewhere")}, sg.SignatureError, r"cannot rebind `p` to `elsewhere`"
    )


def test_refused_tensor_the_graph_does_not_use(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    unused = sg_device.zeros((N,), name="unused")
    refused(
        setup,
        {unused: sg_device.zeros((N,), name="other")},
        sg.SignatureError,
        r"graph #\d+ does not use `unused`, so it cannot be rebound",
    )


def test_refused_part_of_a_tensor_a_node_uses_whole(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    refused(
        setup,
        {setup.p[0:32]: sg_device.zeros((32,), name="half")},
        sg.SignatureError,
        r"cannot rebind `p\[0:32\]`: node 0 \(`fill`\) uses `p`, which extends beyond it",
    )


def test_refused_overlapping_keys_and_bad_arguments(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    a, b = sg_device.zeros((N,), name="a"), sg_device.zeros((16,), name="b")
    refused(
        setup,
        {setup.out: a, setup.out[0:16]: b},
        sg.SignatureError,
        r"overlapping tensors to move: `out` and `out\[0:16\]`",
    )
    refused(setup, [(setup.p, a)], sg.SignatureError, r"takes a mapping \{old: new\}, not list")
    refused(
        setup, {setup.p: np.zeros(N, np.float32)}, sg.SignatureError, r"maps tensors to tensors, got Tensor: ndarray"
    )


def test_refused_freed_tensor(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    gone = sg_device.zeros((N,), name="gone")
    gone.free()
    refused(setup, {setup.p: gone}, sg.LifetimeError, r"use of freed tensor `gone`")


def test_refused_aliasing_within_one_node(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    # node 2 writes `out` and reads `src`: reading what it writes in the same op
    refused(
        setup,
        {setup.src: setup.out},
        sg.BorrowError,
        r"cannot borrow `out` as immutable because it is also borrowed as mutable in `add`",
    )


def test_refused_aliasing_between_unordered_nodes(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    # nodes 0 and 1 are independent (no edge): both would write `p`
    refused(
        setup,
        {setup.q: setup.p},
        sg.BorrowError,
        r"rebinding would make nodes 0 and 1 of graph #\d+ share memory that the graph does not order"
        r"(.|\n)*node 1 \(`fill`\): `out` borrows `p` mutably",
    )
    # a read that the graph does not order after the write: node 2 reads src, node 0 writes p
    refused(setup, {setup.src: setup.p}, sg.BorrowError, r"rebinding would make nodes 0 and 2")


def test_refused_writing_a_frozen_tensor(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    weights = sg_device.zeros((N,), name="weights").freeze()
    refused(setup, {setup.q: weights}, sg.BorrowError, r"cannot borrow `weights` as mutable in `fill`: it is frozen")
    setup.graph.rebind({setup.src: weights})  # reading it is fine
    setup.graph.launch()
    setup.graph.sync()
    np.testing.assert_array_equal(setup.out.numpy(), np.r_[np.ones(16), np.zeros(N - 16)])


def test_refused_on_a_closed_graph(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    setup = Setup(sg_device, sg_stream)
    setup.graph.close()
    with pytest.raises(sg.LifetimeError, match=r"cannot rebind graph #\d+: it is closed"):
        setup.graph.rebind({setup.p: sg_device.zeros((N,))})


def test_a_tensor_used_inside_a_device_loop_is_rebound(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Body nodes move too (more in tests/test_bodies.py), and the pins with them."""
    x, x2 = sg_device.zeros((8,), name="x"), sg_device.full((8,), 10.0, name="x2")
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        graph.rebind({x: x2})
        assert graph.last_update in ("nodes", "whole")
        loop = graph.nodes[1].op
        assert isinstance(loop, sg.While) and loop.label() == "while(flag) [2 nodes]"
        assert loop.body.nodes[0].op.label() == "add_scalar(mut x2)"
        assert pinned(x2) and not pinned(x)
        x.free()  # no longer the graph's
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(x2.numpy(), np.full(8, 12.0))


def test_rebinding_copies_and_fills(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Memcpy and memset nodes (4-byte and 1-byte fill patterns) take new tensors by node update too."""
    a, b = sg_device.zeros((N,), name="a"), sg_device.zeros((N,), name="b")
    flags = sg_device.zeros((N,), sg.u8, name="flags")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(a.mut(), 7.0))
        s.record(sg.memcpy(b.mut(), a))
        s.record(sg.memset(flags.mut(), 3))
    graph = s.graph
    a2, b2 = sg_device.zeros((N,), name="a2"), sg_device.zeros((N,), name="b2")
    flags2 = sg_device.zeros((N,), sg.u8, name="flags2")
    graph.rebind({a: a2, b: b2, flags: flags2})
    for _ in range(2):
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(b2.numpy(), np.full(N, 7.0))
    np.testing.assert_array_equal(flags2.numpy(), np.full(N, 3))
    for t in (a, b, flags):
        assert not t.numpy().any() and not pinned(t)
    assert [n.op.label() for n in graph.nodes] == ["memset(mut a2, 7.0)", "memcpy(mut b2, a2)", "memset(mut flags2, 3)"]
    graph.close()
