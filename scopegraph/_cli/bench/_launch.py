"""Suite 1, launch overhead: N tiny dependent kernels (x += 1), eager and as graphs, scopegraph
against a hand-built cuda.core graph of the same kernels, cuda.core's eager launch, and PyTorch
eager and ``torch.cuda.CUDAGraph``.

Like for like: scopegraph's eager side builds every op inside the clock (``add_scalar_op`` then
``stream.run``), as PyTorch eager pays its dispatch inside its clock; cuda.core's eager side
reuses prebuilt launch arguments (its cheapest form). The scopegraph graph is recorded with
``pdl=False`` to match cuda.core's full edges; "sg graph PDL" is the same chain with programmatic
edges (sm_90+). Every side is timed the same way (``_timing.interleaved``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from ... import CudaGraph, Device, Stream, Tensor, library
from ._table import markdown
from ._timing import Side, interleaved, ratio, us

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
    stream = dev.stream()
    x = dev.zeros((256,), name="x")
    rows = [_row(dev, stream, x, n, quick) for n in SIZES]
    x.free()
    return {"rows": rows}


def _row(dev: Device, stream: Stream, x: Tensor, n: int, quick: bool) -> dict[str, Any]:
    calls = max(4, 2000 // n) if not quick else max(2, 200 // n)
    ops = [library.add_scalar_op(x.mut(), 1.0) for _ in range(n)]
    graphs = {}
    for pdl in (False, True):
        with CudaGraph.scope(stream, pdl=pdl) as s:
            for op in ops:
                s.record(op)
        graphs[pdl] = s.graph

    def eager() -> None:
        for _ in range(n):
            stream.run(library.add_scalar_op(x.mut(), 1.0))

    sides: dict[str, Side] = {
        "sg_eager": (eager, stream.sync, calls),
        "sg_graph": (graphs[False].launch, stream.sync, calls * 4),
        "sg_graph_pdl": (graphs[True].launch, stream.sync, calls * 4),
    }
    core_graph = None
    if dev.is_cuda:
        from cuda.core import launch

        core_graph = _core_graph(ops)
        native = cast("CoreStream", stream.native)

        def core_eager() -> None:
            for op in ops:
                fn, config, args = op.native
                launch(native, config, fn, *args)

        sides["core_eager"] = (core_eager, stream.sync, calls)
        sides["core_graph"] = (functools.partial(core_graph.launch, native), stream.sync, calls * 4)
        sides |= _torch(n, calls)
    timed = interleaved(sides, rounds=5 if not quick else 2, inner=3 if not quick else 1)
    if core_graph is not None:
        core_graph.close()
    for g in graphs.values():
        g.close()
    row: dict[str, Any] = {"n": n}
    for key, t in timed.items():
        row[key] = {k: v if k.endswith("spread") else v / n for k, v in t.items()} | {"per": "node"}
    return row


def _torch(n: int, calls: int) -> dict[str, Side]:
    try:
        import torch
    except ImportError:
        return {}
    t = torch.zeros(256, device="cuda")
    side = torch.cuda.Stream()

    def eager() -> None:
        for _ in range(n):
            t.add_(1)

    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager()  # warm up on the side stream, as PyTorch's docs ask before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        eager()
    return {
        "torch_eager": (eager, torch.cuda.synchronize, calls),
        "torch_graph": (g.replay, torch.cuda.synchronize, calls * 4),
    }


def format_rows(r: dict[str, Any]) -> list[str]:
    heads = ["N", "sg eager", "sg graph", "cuda.core graph", "sg/core", "sg graph PDL", "cuda.core eager"]
    heads += ["torch eager", "torch graph"]

    def cell(row: dict[str, Any], key: str) -> str:
        v = row.get(key)
        return f"{us(v['wall'])} ({us(v['submit'])})" if v else "-"

    rows = []
    for row in r["rows"]:
        sg_core = ratio(row["sg_graph"]["wall"], row["core_graph"]["wall"]) if "core_graph" in row else "-"
        cells = [str(row["n"]), *(cell(row, k) for k in ("sg_eager", "sg_graph", "core_graph")), sg_core]
        rows.append(cells + [cell(row, k) for k in ("sg_graph_pdl", "core_eager", "torch_eager", "torch_graph")])
    return [
        "## 1. launch overhead: N dependent tiny kernels (x += 1), microseconds per node: best of 5 interleaved "
        "round medians (CPU submit); sg eager builds each op inside the clock",
        *markdown(heads, rows),
    ]
