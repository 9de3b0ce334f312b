"""The smallest useful scope: y = 2*x + y, recorded once, replayed three times.

Runs on the GPU when there is one, else on the host backend (numpy).
"""

from __future__ import annotations

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library


def main() -> None:
    dev = sg.device()
    stream = dev.stream()
    x = dev.from_numpy(np.arange(8, dtype=np.float32), name="x")
    y = dev.zeros((8,), sg.f32, name="y")

    with CudaGraph.scope(stream) as s:
        s.record(library.axpy[1, 32](y.mut(), x, 2.0, 8))  # y += 2 * x

    with s.graph as graph:  # closing the graph releases its hold on x and y
        for _ in range(3):
            graph.launch()
        graph.sync()
        print(f"on {dev}: y = {y.numpy()}")  # 6 * x
        print(graph.to_dot())


if __name__ == "__main__":
    main()
