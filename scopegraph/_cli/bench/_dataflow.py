"""Suite 4, dataflow parallelism: k independent chains of small kernels (RMSNorm of one 2048-wide
row: one block, a small part of the GPU), recorded in dataflow order (k parallel branches)
against program order (one chain). Both orders in interleaved rounds: each figure's best, median
and spread; ``dataflow_s`` and ``program_s`` (and ``speedup``) are the medians, as before."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import CudaGraph, Device, library
from ._timing import figure, interleaved, part

CHAINS = (1, 2, 4, 8)
LENGTH = 100
WIDTH = 2048


def run(dev: Device, quick: bool) -> dict[str, Any]:
    stream = dev.stream()
    rng = np.random.default_rng(0)
    w = dev.from_numpy(np.ones(WIDTH, np.float32), name="w").freeze()
    rows = []
    for k in CHAINS if not quick else (1, 4):
        pairs = [
            (
                dev.from_numpy(rng.standard_normal(WIDTH, dtype=np.float32), name=f"a{i}"),
                dev.zeros((WIDTH,), name=f"b{i}"),
            )
            for i in range(k)
        ]
        ops = []
        for _ in range(LENGTH // 2):
            for a, b in pairs:  # ping-pong: a -> b -> a, each step depends on the last
                ops.append(library.rms_norm_op(b.mut(), a, w, 1e-5))
            for a, b in pairs:
                ops.append(library.rms_norm_op(a.mut(), b, w, 1e-5))
        graphs = {}
        for order in ("dataflow", "program"):
            with CudaGraph.scope(stream, order=order) as s:
                for op in ops:
                    s.record(op)
            graphs[order] = s.graph
        # Interleaved rounds of one timing of 20 replays each; the plain figures are the medians.
        timed = interleaved({o: (g.launch, stream.sync, 20) for o, g in graphs.items()}, rounds=5, inner=1)
        for g in graphs.values():
            g.close()
        row: dict[str, Any] = {"chains": k, "length": LENGTH}
        for order, t in timed.items():
            row |= figure(f"{order}_s", part(t), plain="median")
        row["speedup"] = row["program_s"] / row["dataflow_s"]
        rows.append(row)
    return {"rows": rows}
