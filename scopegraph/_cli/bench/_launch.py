"""Suite 1, launch overhead: N tiny dependent kernels (x += 1), eager and as graphs, scopegraph
against a hand-built cuda.core graph of the same kernels, cuda.core's eager launch, and PyTorch
eager and ``torch.cuda.CUDAGraph``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ... import CudaGraph, Device, library
from ._timing import time_calls

if TYPE_CHECKING:
    from cuda.core import Stream as CoreStream

SIZES = (1, 10, 100, 1000)


def _core_graph(ops: list[Any]) -> Any:
    """The same chain built directly with cuda.core's GraphDefinition: the baseline."""
    from cuda.core.graph import GraphDefinition

    definition = GraphDefinition()
    node: Any = definition
    for op in ops:
        fn, config, args = op.native
        node = node.launch(config, fn, *args)
    return definition.instantiate()


def run(dev: Device, quick: bool) -> dict[str, Any]:
    rows = []
    stream = dev.stream()
    x = dev.zeros((256,), name="x")
    for n in SIZES:
        calls = max(4, 2000 // n) if not quick else max(2, 200 // n)
        ops = [library.add_scalar_op(x.mut(), 1.0) for _ in range(n)]
        with CudaGraph.scope(stream) as s:
            for op in ops:
                s.record(op)
        graph = s.graph
        row: dict[str, Any] = {"n": n}

        def eager() -> None:
            for op in ops:
                stream.run(op)

        row["sg_eager"] = time_calls(eager, stream.sync, calls)
        row["sg_graph"] = time_calls(graph.launch, stream.sync, calls * 4)
        if dev.is_cuda:
            from cuda.core import launch

            core_graph = _core_graph(ops)
            native = cast("CoreStream", stream.native)

            def core_eager() -> None:
                for op in ops:
                    fn, config, args = op.native
                    launch(native, config, fn, *args)

            row["core_eager"] = time_calls(core_eager, stream.sync, calls)
            # Interleave the two replays so drift affects both alike; keep each one's best median.
            sg_runs, core_runs = [], []
            for _ in range(5):
                sg_runs.append(time_calls(graph.launch, stream.sync, calls * 4))
                core_runs.append(time_calls(lambda: core_graph.launch(native), stream.sync, calls * 4))
            row["sg_graph"] = min(sg_runs, key=lambda r: r["wall"])
            row["core_graph"] = min(core_runs, key=lambda r: r["wall"])
            core_graph.close()
            row |= _torch(n, calls)
        graph.close()
        for key in list(row):
            if isinstance(row[key], dict):
                row[key] = {k: v / n for k, v in row[key].items()} | {"per": "node"}
        rows.append(row)
    return {"rows": rows}


def _torch(n: int, calls: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    t = torch.zeros(256, device="cuda")
    side = torch.cuda.Stream()

    def eager() -> None:
        for _ in range(n):
            t.add_(1)

    out: dict[str, Any] = {"torch_eager": time_calls(eager, torch.cuda.synchronize, calls)}
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager()  # warm up on the side stream, as PyTorch's docs ask before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        eager()
    out["torch_graph"] = time_calls(g.replay, torch.cuda.synchronize, calls * 4)
    return out
