"""Independent work becomes parallel branches (seed 002: linear chains waste parallelism).

Four buffers are each normalised 50 times. In dataflow order (the default) the graph has four
independent chains the GPU runs side by side; ``order="program"`` chains all 200 ops.
"""

from __future__ import annotations

import time

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library


def build(stream: sg.Stream, order: str, pairs: list[tuple[sg.Tensor, sg.Tensor]], w: sg.Tensor) -> CudaGraph:
    with CudaGraph.scope(stream, order=order) as s:
        for _ in range(25):
            for a, b in pairs:
                s.record(library.rms_norm_op(b.mut(), a, w, 1e-5))
            for a, b in pairs:
                s.record(library.rms_norm_op(a.mut(), b, w, 1e-5))
    return s.graph


def main() -> None:
    dev = sg.device()
    stream = dev.stream()
    rng = np.random.default_rng(0)
    w = dev.from_numpy(np.ones(2048, np.float32), name="w").freeze()
    pairs = [
        (dev.from_numpy(rng.standard_normal(2048).astype(np.float32), name=f"a{i}"), dev.zeros((2048,), name=f"b{i}"))
        for i in range(4)
    ]
    for order in ("dataflow", "program"):
        with build(stream, order, pairs, w) as graph:
            roots = sum(1 for n in graph.nodes if not n.deps)
            graph.launch()
            graph.sync()
            t0 = time.perf_counter()
            for _ in range(20):
                graph.launch()
            graph.sync()
            ms = (time.perf_counter() - t0) / 20 * 1e3
            print(
                f"{order:>8}: {len(graph.nodes)} nodes, {roots} root(s), "
                f"{len(graph.edges)} edges, {ms:.3f} ms per replay"
            )
    if dev.is_host:
        print("(host backend: replays run one op at a time, so both orders take the same time)")


if __name__ == "__main__":
    main()
