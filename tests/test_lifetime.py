"""Graphs pin what they use: dropped names stay alive, free() is refused, close() releases."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import pinned


def test_graph_keeps_deleted_tensors_alive(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((128,), name="out")
    a = sg_device.from_numpy(np.arange(128, dtype=np.float32), name="a")
    b = sg_device.from_numpy(np.ones(128, np.float32), name="b")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_op(out.mut(), a, b))
    graph = s.graph
    del a, b, s
    gc.collect()
    for _ in range(3):
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), np.arange(128) + 1)
    graph.close()


def test_free_of_a_pinned_tensor_is_refused_until_close(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    w = sg_device.zeros((16,), name="w")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(w[0:8].mut(), 1.0))
    graph = s.graph
    assert pinned(w)
    with pytest.raises(sg.LifetimeError) as info:
        w.free()
    assert f"`w` is pinned by graph #{graph.id}" in str(info.value)
    graph.launch()
    graph.sync()
    assert w.numpy()[:8].sum() == 8
    graph.close()
    assert not pinned(w)
    w.free()
    with pytest.raises(sg.LifetimeError, match="freed"):
        w.numpy()


def test_graph_as_context_manager_and_gc_release_pins(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    with s.graph as g:
        g.launch()
    assert g.closed and not pinned(x)
    with CudaGraph.scope(sg_stream) as s2:
        s2.record(sg.memset(x.mut(), 1.0))
    assert pinned(x)
    del s2
    gc.collect()
    assert not pinned(x)  # the graph went away without close(): its pins went with it
    x.free()


def test_two_graphs_pin_independently(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    graphs = []
    for value in (1.0, 2.0):
        with CudaGraph.scope(sg_stream) as s:
            s.record(sg.memset(x.mut(), value))
        graphs.append(s.graph)
    graphs[0].close()
    with pytest.raises(sg.LifetimeError, match=f"graph #{graphs[1].id}"):
        x.free()
    graphs[1].close()
    x.free()
