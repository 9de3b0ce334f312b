"""Suite 8, changing a graph every iteration (seed 004): a launch-bound workflow of 20 tiny
dependent kernels whose last kernel's argument changes every iteration, run five ways:

- ``no_graph``: eager launches (the 19 unchanging launch ops are built once, the last one each
  iteration with its new scalar, as a user writes it);
- ``recapture``: a new scope records the 20 ops, the graph is instantiated, launched and closed;
- ``whole_update``: the 20 ops are recorded again into the graph (``into=``: a whole-graph update),
  then it is launched;
- ``node_update``: the scalar is an ``sg.Param``: ``graph.launch(a=value)`` updates one node;
- ``rebind``: the last kernel reads its input from another buffer each iteration:
  ``graph.rebind({current: next})``, then a launch.

Every way runs the same 20 kernels per iteration, and everything the user pays is inside the
clock (building ops, recording, instantiating, updating, closing). The ways are sampled alike:
rounds of the same number of back-to-back iterations, interleaved way by way; per way the best,
median and spread of the rounds (the plain figures and the ratios are the medians).
Before timing, each way runs a few iterations from the same state and must produce exactly the
results of eager launches (``agree``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import CudaGraph, Device, KernelLaunch, Param, Scope, Stream, Tensor, f32, library
from ._table import markdown
from ._timing import Side, cell, figure, figures, interleaved, part

KERNELS = 20
ELEMENTS = 256
BLOCK = library.ELEMENTWISE_BLOCK
WAYS = ("no_graph", "recapture", "whole_update", "node_update", "rebind")


def value(i: int) -> float:
    """The last kernel's scalar in iteration i: a new value every iteration, exact in f32."""
    return 1.0 + (i % 8) * 0.125


class Workflow:
    """x += 1 nineteen times, then y += a * x (or y += 1 * input, for rebind)."""

    def __init__(self, dev: Device, stream: Stream) -> None:
        self.stream = stream
        self.x = dev.zeros((ELEMENTS,), name="x")
        self.y = dev.zeros((ELEMENTS,), name="y")
        self.inputs = [dev.full((ELEMENTS,), float(k + 1), name=f"input{k}") for k in range(2)]
        self.statics = [library.add_scalar_op(self.x.mut(), 1.0) for _ in range(KERNELS - 1)]
        self.i = 0

    def last(self, a: float | Param[float], src: Tensor | None = None) -> KernelLaunch:
        blocks = -(-ELEMENTS // BLOCK)
        return library.axpy[blocks, BLOCK](self.y.mut(), self.x if src is None else src, a, ELEMENTS)

    def record(self, s: Scope, a: float | Param[float], src: Tensor | None = None) -> None:
        for op in self.statics:
            s.record(op)
        s.record(self.last(a, src))

    def reset(self) -> None:
        for t in (self.x, self.y):
            self.stream.run(library.fill_op(t.mut(), 0.0))
        self.i = 0

    def ways(self) -> tuple[dict[str, Callable[[], None]], Callable[[], None], list[CudaGraph]]:
        """One iteration of each way; the eager equivalent of ``rebind``; the graphs to close."""
        stream = self.stream
        with CudaGraph.scope(stream) as s:
            self.record(s, value(0))
        whole = s.graph
        with CudaGraph.scope(stream) as s:
            self.record(s, Param("a", f32, value(0)))
        node = s.graph
        with CudaGraph.scope(stream) as s:
            self.record(s, 1.0, self.inputs[0])
        moved = s.graph
        current = [self.inputs[0]]

        def no_graph() -> None:
            a, self.i = value(self.i), self.i + 1
            for op in self.statics:
                stream.run(op)
            stream.run(self.last(a))

        def recapture() -> None:
            a, self.i = value(self.i), self.i + 1
            with CudaGraph.scope(stream) as s:
                self.record(s, a)
            graph = s.graph
            graph.launch()
            graph.close()

        def whole_update() -> None:
            a, self.i = value(self.i), self.i + 1
            with CudaGraph.scope(stream, into=whole) as s:
                self.record(s, a)
            whole.launch()

        def node_update() -> None:
            a, self.i = value(self.i), self.i + 1
            node.launch(a=a)

        def rebind() -> None:
            self.i += 1
            new = self.inputs[self.i % 2]
            moved.rebind({current[0]: new})
            current[0] = new
            moved.launch()

        def eager_rebind() -> None:
            self.i += 1
            for op in self.statics:
                stream.run(op)
            stream.run(self.last(1.0, self.inputs[self.i % 2]))

        ways = {
            "no_graph": no_graph,
            "recapture": recapture,
            "whole_update": whole_update,
            "node_update": node_update,
            "rebind": rebind,
        }
        return ways, eager_rebind, [whole, node, moved]


def _result(work: Workflow, step: Callable[[], None], iterations: int) -> np.ndarray[Any, Any]:
    work.reset()
    for _ in range(iterations):
        step()
    work.stream.sync()
    return np.concatenate([work.x.numpy(), work.y.numpy()])


def run(dev: Device, quick: bool) -> dict[str, Any]:
    stream = dev.stream()
    work = Workflow(dev, stream)
    ways, eager_rebind, graphs = work.ways()
    # The same results, exactly: each way from the same state, for a few iterations.
    checks = 9
    want = _result(work, ways["no_graph"], checks)
    agree = all(
        np.array_equal(_result(work, ways[w], checks), want) for w in ("recapture", "whole_update", "node_update")
    )
    agree = agree and np.array_equal(_result(work, ways["rebind"], checks), _result(work, eager_rebind, checks))
    last_update = {
        "whole_update": graphs[0].last_update,
        "node_update": graphs[1].last_update,
        "rebind": graphs[2].last_update,
    }
    if dev.is_cuda:
        calls, rounds = (50, 3) if quick else (200, 7)
    else:
        calls, rounds = (3, 3) if quick else (20, 3)
    # Interleaved rounds, each way one untimed iteration then `calls` timed ones per round.
    sides: dict[str, Side] = {w: (ways[w], stream.sync, calls) for w in WAYS}
    timed = interleaved(sides, rounds=rounds, inner=1, warmup=0, rewarm=1)
    for g in graphs:
        g.close()
    # The plain figures (per_iteration_s, submit_s) and every ratio are the medians, as before.
    by_figure = {
        key: figures(key, {w: figure(key, part(timed[w], of), plain="median") for w in WAYS})
        for key, of in (("per_iteration_s", "wall"), ("submit_s", "submit"))
    }
    per = by_figure["per_iteration_s"]["per_iteration_s"]
    return {
        "kernels": KERNELS,
        "elements": ELEMENTS,
        "calls": calls,
        "rounds": rounds,
        "agree": bool(agree),
        "last_update": last_update,
        **by_figure["per_iteration_s"],
        **by_figure["submit_s"],
        "speedup_over_no_graph": {w: per["no_graph"] / per[w] for w in WAYS},
        "ratios": {
            "whole_update/node_update": per["whole_update"] / per["node_update"],
            "recapture/whole_update": per["recapture"] / per["whole_update"],
            "rebind/node_update": per["rebind"] / per["node_update"],
        },
    }


LABELS = {
    "no_graph": "no graph (eager)",
    "recapture": "recapture",
    "whole_update": "whole-graph update (into=)",
    "node_update": "node update (sg.Param)",
    "rebind": "rebind",
}


def format_rows(u: dict[str, Any]) -> list[str]:
    speedup = u["speedup_over_no_graph"]
    rows = [
        [LABELS[w], *(cell(u, key, ".2f", 1e6, w) for key in ("per_iteration_s", "submit_s")), f"{speedup[w]:.2f}"]
        for w in WAYS
    ]
    r = u["ratios"]
    return [
        *markdown(["way", "us/iteration", "CPU submit us", "speedup vs eager"], rows, labels=1),
        "",
        f"whole update / node update: {r['whole_update/node_update']:.2f}x; recapture / whole update: "
        f"{r['recapture/whole_update']:.2f}x; rebind / node update: {r['rebind/node_update']:.2f}x; "
        f"results identical to eager: {'yes' if u['agree'] else 'NO'}",
    ]
