"""A loop whose last kernel's scalar changes every iteration (seed 004: update, don't recapture).

Each step runs 20 small kernels; only the last one's scale changes. Three ways keep one graph
and change it in place, each checked against eager launches of the same kernels:

1. ``sg.Param``: ``graph.launch(scale=v)`` updates the one node that uses ``scale``;
2. ``graph.rebind({old: new})``: the last kernel reads a different buffer each step;
3. ``CudaGraph.scope(stream, into=graph)``: the step is recorded again and the graph takes it by a
   whole-graph update (the topology is the same).

``python -m scopegraph bench --only update`` times these against eager launches and recapture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]
STEPS = 50
N = 512


def scale_at(step: int) -> float:
    return 0.5 + (step % 5) * 0.25


def main() -> None:
    dev = sg.device()
    stream = dev.stream()
    x = dev.zeros((N,), name="x")
    y = dev.zeros((N,), name="y")
    inputs = [dev.full((N,), float(k + 1), name=f"input{k}") for k in range(2)]
    chain = [library.add_scalar_op(x.mut(), 1.0) for _ in range(19)]  # the 19 kernels that never change

    def record(s: sg.Scope, scale: float | sg.Param[float], src: sg.Tensor) -> None:
        for op in chain:
            s.record(op)
        s.record(library.axpy[N // 256, 256](y.mut(), src, scale, N))  # y += scale * src

    def eager(step: int, src: sg.Tensor) -> None:
        for op in chain:
            stream.run(op)
        stream.run(library.axpy[N // 256, 256](y.mut(), src, scale_at(step), N))

    def reference(src_of: int) -> NDArray:
        for t in (x, y):
            stream.run(sg.memset(t.mut(), 0.0))
        for step in range(STEPS):
            eager(step, inputs[step % 2] if src_of else x)
        return np.concatenate([x.numpy(), y.numpy()])

    def result() -> NDArray:
        stream.sync()
        return np.concatenate([x.numpy(), y.numpy()])

    want_x, want_inputs = reference(0), reference(1)

    # 1. a graph parameter: one node update per step
    for t in (x, y):
        stream.run(sg.memset(t.mut(), 0.0))
    scale = sg.Param("scale", sg.f32, scale_at(0))
    with CudaGraph.scope(stream) as s:
        record(s, scale, x)
    with s.graph as graph:
        for step in range(STEPS):
            graph.launch(scale=scale_at(step))
        print(
            f"on {dev}: sg.Param: {STEPS} steps, last_update={graph.last_update}, "
            f"graph.params={ {k: v.item() for k, v in graph.params.items()} }, "
            f"matches eager: {np.array_equal(result(), want_x)}"
        )

    # 2. rebind: the last kernel reads input0, input1, input0, ... (scale fixed per step via the Param)
    for t in (x, y):
        stream.run(sg.memset(t.mut(), 0.0))
    with CudaGraph.scope(stream) as s:
        record(s, scale, inputs[0])
    with s.graph as graph:
        for step in range(STEPS):
            if step:
                graph.rebind({inputs[(step - 1) % 2]: inputs[step % 2]})
            graph.launch(scale=scale_at(step))
        print(
            f"rebind: {STEPS} steps, last_update={graph.last_update}, last node: {graph.nodes[-1].op.label()}, "
            f"matches eager: {np.array_equal(result(), want_inputs)}"
        )

    # 3. record the step again into the graph: a whole-graph update
    for t in (x, y):
        stream.run(sg.memset(t.mut(), 0.0))
    with CudaGraph.scope(stream) as s:
        record(s, scale_at(0), x)
    with s.graph as graph:
        for step in range(STEPS):
            with CudaGraph.scope(stream, into=graph) as again:
                record(again, scale_at(step), x)
            graph.launch()
        print(
            f"into=: {STEPS} steps, last_update={graph.last_update}, matches eager: {np.array_equal(result(), want_x)}"
        )


if __name__ == "__main__":
    main()
