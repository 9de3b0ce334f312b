"""The seed's layer stack (the model the demo and the benchmarks run): graph replay equals eager
execution, and both equal a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import scopegraph as sg
from scopegraph._cli.seed_model import Config, LayerStack, reference_forward, relative_error

CFG = Config(d=256, n_layers=3)
REPLAYS = 4


def run_graph(device: sg.Device, x0: np.ndarray, order: str) -> np.ndarray:
    model = LayerStack(device, CFG)
    stream = device.stream()
    graph = model.record_graph(stream, order=order)
    assert len(graph.nodes) == 5 * CFG.n_layers
    for _ in range(REPLAYS):
        graph.update(sg.memcpy(model.hidden.mut(), device.from_numpy(x0)))  # the seed's forward(): new input, replay
        graph.launch()
    graph.sync()
    out = model.hidden.numpy()
    graph.close()
    return out


def run_eager(device: sg.Device, x0: np.ndarray) -> np.ndarray:
    model = LayerStack(device, CFG)
    stream = device.stream()
    ops = model.ops()
    for _ in range(REPLAYS):
        stream.run(sg.memcpy(model.hidden.mut(), device.from_numpy(x0)))
        model.run_eager(stream, ops)
    stream.sync()
    return model.hidden.numpy()


@pytest.mark.parametrize("order", ["dataflow", "program"])
def test_replay_matches_eager_and_reference(sg_device: sg.Device, order: str) -> None:
    x0 = np.random.default_rng(1).standard_normal(CFG.d).astype(np.float32)
    graph_out = run_graph(sg_device, x0, order)
    eager_out = run_eager(sg_device, x0)
    if sg_device.is_host:
        np.testing.assert_array_equal(graph_out, eager_out)  # same numpy calls in the same order
    else:
        assert relative_error(graph_out, eager_out) < 1e-6
    model = LayerStack(sg.device("host"), CFG)
    want = reference_forward(model.host_weights, x0, CFG.eps)
    assert relative_error(graph_out, want) < 1e-5


def test_replays_chain_through_the_hidden_buffer(sg_device: sg.Device) -> None:
    """Without new input, each replay continues from the last: N replays == N eager passes."""
    x0 = np.random.default_rng(2).standard_normal(CFG.d).astype(np.float32)
    model = LayerStack(sg_device, CFG)
    stream = sg_device.stream()
    stream.run(sg.memcpy(model.hidden.mut(), sg_device.from_numpy(x0)))
    with model.record_graph(stream) as graph:
        for _ in range(3):
            graph.launch()
        graph.sync()
        got = model.hidden.numpy()
    want = reference_forward(model.host_weights, x0, CFG.eps, steps=3)
    assert relative_error(got, want) < 1e-5


def test_layer_graph_shape(sg_device: sg.Device) -> None:
    model = LayerStack(sg_device, CFG)
    with model.record_graph(sg_device.stream()) as graph:
        # every layer is a chain: norm -> q -> o -> add -> copy back; layers follow each other
        for n in graph.nodes[1:]:
            assert n.deps, n
        labels = [n.op.label() for n in graph.nodes[:5]]
        assert labels[0] == "rms_norm<128>(mut norm0, hidden, norm_w0)"
        assert labels[4] == "memcpy(mut hidden, residual0)"
