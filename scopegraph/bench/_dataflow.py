"""Suite 4, dataflow parallelism: k independent chains of small kernels, recorded in dataflow
order (k parallel branches) against program order (one chain)."""

from __future__ import annotations

from typing import Any

from .. import library
from .._device import Device
from .._graph import CudaGraph
from ._timing import time_calls

CHAINS = (1, 2, 4, 8)
LENGTH = 200


def run(dev: Device, quick: bool) -> dict[str, Any]:
    stream = dev.stream()
    rows = []
    for k in CHAINS if not quick else (1, 4):
        bufs = [dev.zeros((4096,), name=f"chain{i}") for i in range(k)]
        ops = [library.add_scalar_op(b.mut(), 1.0) for _ in range(LENGTH) for b in bufs]
        times = {}
        for order in ("dataflow", "program"):
            with CudaGraph.scope(stream, order=order) as s:
                for op in ops:
                    s.record(op)
            with s.graph as g:
                times[order] = time_calls(g.launch, stream.sync, 20)["wall"]
        rows.append({"chains": k, "length": LENGTH, "dataflow_s": times["dataflow"], "program_s": times["program"],
                     "speedup": times["program"] / times["dataflow"]})
    return {"rows": rows}
