"""Suite 2c, CPU costs per op: building an op (``kernel[grid, block](...)``, a library helper,
``sg.memcpy``, ``sg.memset``: argument, size and borrow checks included), recording it (built
inside the clock, tracker included) and running it eagerly (built inside the clock). Best of 5
interleaved round medians, microseconds per op. Targets (issue 11): build <= 3 us, record <= 5 us
(the "built inside" rows: argument binding and every borrow check inside the clock). Recording a
prebuilt op is shown too: it re-checks liveness, frozen memory and the device, and runs the tracker.

Two programs are recorded: 1000 axpy ops over 16 buffers (each tensor touched again and again),
and the seed model's forward pass (``MODEL``: 1000 ops, 5 a layer: rms_norm, two matvecs, add,
memcpy), whose weights and activations are tensors of their own in each layer, as in a real
program: most of its borrows are a recording's first touch of a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ... import CudaGraph, Device, GraphNode, Stream, library, memcpy, memset
from ..seed_model import Config, LayerStack
from ._table import markdown
from ._timing import Side, interleaved

OPS = 1000
MODEL = Config(d=64, n_layers=OPS // 5)  # the seed model's form records 5 ops a layer


class _Stop(Exception):
    pass


def _record_and_leave(stream: Stream, ops: Iterable[GraphNode]) -> None:
    """Record ``ops`` (a generator builds each inside the clock) and leave the scope without
    building the graph (suite 3 times building)."""
    try:
        with CudaGraph.scope(stream) as s:
            for op in ops:
                s.record(op)
            raise _Stop
    except _Stop:
        pass


def run(dev: Device, quick: bool) -> dict[str, Any]:
    stream = dev.stream()
    a, b, c = (dev.zeros((256,), name=n) for n in "abc")
    add = library.add

    def kernel_ops() -> None:
        for _ in range(OPS):
            add[1, 256](c.mut(), a, b, 256)

    def helper_ops() -> None:
        for _ in range(OPS):
            library.add_op(c.mut(), a, b)

    def memcpy_ops() -> None:
        for _ in range(OPS):
            memcpy(c.mut(), a)

    def memset_ops() -> None:
        for _ in range(OPS):
            memset(c.mut(), 1.0)

    bufs = [dev.zeros((256,), name=f"r{i}") for i in range(16)]

    def record_ops() -> None:
        _record_and_leave(stream, (library.axpy_op(bufs[(i + 1) % 16].mut(), bufs[i % 16], 1.0) for i in range(OPS)))

    prebuilt = [library.axpy_op(bufs[(i + 1) % 16].mut(), bufs[i % 16], 1.0) for i in range(OPS)]
    model = LayerStack(dev, MODEL)
    model_ops = model.ops()

    def eager_kernels() -> None:
        for _ in range(OPS):
            stream.run(library.add_scalar_op(c.mut(), 1.0))

    def eager_memcpy() -> None:
        for _ in range(OPS):
            stream.run(memcpy(c.mut(), a))

    def eager_memset() -> None:
        for _ in range(OPS):
            stream.run(memset(c.mut(), 1.0))

    nothing = lambda: None  # noqa: E731
    sides: dict[str, Side] = {
        "build_kernel": (kernel_ops, nothing, 1),
        "build_helper": (helper_ops, nothing, 1),
        "build_memcpy": (memcpy_ops, nothing, 1),
        "build_memset": (memset_ops, nothing, 1),
        "record_kernel": (record_ops, nothing, 1),
        "record_prebuilt": (lambda: _record_and_leave(stream, prebuilt), nothing, 1),
        "record_model": (lambda: _record_and_leave(stream, model.ops()), nothing, 1),
        "record_model_prebuilt": (lambda: _record_and_leave(stream, model_ops), nothing, 1),
        "eager_kernel": (eager_kernels, stream.sync, 1),
        "eager_memcpy": (eager_memcpy, stream.sync, 1),
        "eager_memset": (eager_memset, stream.sync, 1),
    }
    timed = interleaved(sides, rounds=5 if not quick else 2, inner=3 if not quick else 1)
    rows = {name: {k: v if k.endswith("spread") else v / OPS for k, v in t.items()} for name, t in timed.items()}
    del prebuilt[:], model_ops[:]
    for t in (a, b, c, *bufs, *model.tensors()):
        t.free()
    return {"ops": OPS, "rows": rows}


LABELS = {
    "build_kernel": "build add[1, 256](out.mut(), a, b, n)",
    "build_helper": "build library.add_op(out.mut(), a, b)",
    "build_memcpy": "build sg.memcpy(dst.mut(), src)",
    "build_memset": "build sg.memset(dst.mut(), 1.0)",
    "record_kernel": "s.record(axpy_op(...)), built inside; tracker included",
    "record_prebuilt": "s.record(op) of a built op (run-time checks, tracker)",
    "record_model": f"s.record() of the seed model's ops (d={MODEL.d}, {MODEL.n_layers} layers), built inside",
    "record_model_prebuilt": "s.record() of the seed model's ops, built before",
    "eager_kernel": "eager stream.run(add_scalar_op(...)), built inside",
    "eager_memcpy": "eager stream.run(sg.memcpy(...)), built inside",
    "eager_memset": "eager stream.run(sg.memset(...)), built inside",
}


def format_rows(r: dict[str, Any]) -> list[str]:
    rows = [
        [LABELS.get(name, name), f"{row['wall'] * 1e6:.2f}", f"{row['median'] * 1e6:.2f}", f"{row['spread']:.1%}"]
        for name, row in r["rows"].items()
    ]
    return [
        f"## 2c. CPU cost per op, microseconds (best of 5 interleaved round medians of {r['ops']} ops; median, spread)",
        *markdown(["what", "best", "median", "spread"], rows, labels=1),
    ]
