"""The executable graph a scope produces.

A CudaGraph owns its backend executable and pins every allocation its nodes touch: the
tensors stay alive while the graph does (it holds the ops, which hold the tensors), and
``free()`` on any of them raises LifetimeError until ``close()`` (or garbage collection)
releases the pins.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self

from ._errors import LifetimeError, NotAGraphNodeError, SignatureError, diagnostic
from ._ops import GraphNode

if TYPE_CHECKING:
    from ._backends._base import Executable
    from ._scope import Scope
    from ._stream import Stream
    from ._tensor import Allocation

_graph_ids = itertools.count(1)


class RecordedNode:
    """A handle naming one recorded op: its index, the op, its predecessors and where it was recorded."""

    __slots__ = ("index", "op", "deps", "_where")

    def __init__(self, index: int, op: GraphNode, deps: frozenset[int], where: tuple[str, int]) -> None:
        self.index = index
        self.op = op
        self.deps = deps
        self._where = where  # (file, line), formatted only when asked: record is a hot path

    @property
    def location(self) -> str:
        """``file:line`` of the ``s.record`` call."""
        return f"{self._where[0]}:{self._where[1]}"

    def __repr__(self) -> str:
        deps = ", ".join(map(str, sorted(self.deps)))
        return f"<node {self.index}: {self.op.label()} after [{deps}]>"


def release_pins(allocs: Sequence[Allocation], holder: int) -> None:
    for alloc in allocs:
        alloc.pins.pop(holder, None)


class CudaGraph:
    """An instantiated graph: ``launch()`` replays every recorded op with one driver call."""

    def __init__(
        self, executable: Executable, nodes: tuple[RecordedNode, ...], stream: Stream, pins: list[Allocation], order: str
    ) -> None:
        self.id = next(_graph_ids)
        self._exec: Executable | None = executable
        self._nodes = nodes
        self._stream = stream
        self.order = order
        for alloc in pins:
            alloc.pins[id(self)] = f"graph #{self.id} ({len(nodes)} nodes, built on stream #{stream.id})"
        # Pins go when the graph does, even if the user never calls close().
        self._unpin = weakref.finalize(self, release_pins, pins, id(self))

    @classmethod
    def scope(cls, stream: Stream, order: str = "dataflow") -> Scope:
        """Record graph nodes on ``stream``: ``with CudaGraph.scope(stream) as s: s.record(op)``.

        ``order="dataflow"`` (default) orders ops by the data they share, so independent work
        becomes parallel branches; ``order="program"`` chains every op in record order.
        """
        from ._scope import Scope, _caller

        return Scope(stream, order, _caller(1))

    # -- replay -----------------------------------------------------------------------------

    def launch(self, stream: Stream | None = None) -> None:
        """Replay the whole graph on ``graph.stream`` (or ``stream``) with one driver call."""
        exe = self._exec
        if exe is None:
            raise self._closed_error("launch")
        if stream is None:
            stream = self._stream
        elif stream.device is not self._stream.device:
            raise SignatureError(
                f"graph #{self.id} lives on {self._stream.device}; stream #{stream.id} is on {stream.device}\n"
                "help: launch on a stream of the graph's device"
            )
        if stream.recording is not None:
            stream.check_not_recording(f"launch graph #{self.id}")
        exe.launch(stream)

    def update(self, op: GraphNode) -> None:
        """Run ``op`` on the graph's stream now, so it lands before the next replay (e.g. new inputs)."""
        if self._exec is None:
            raise self._closed_error("update")
        if not isinstance(op, GraphNode):
            raise NotAGraphNodeError(
                f"graph.update() takes a GraphNode (sg.memcpy, sg.memset, a kernel launch), not {type(op).__name__}\n"
                "help: e.g. graph.update(sg.memcpy(input.mut(), new_input))"
            )
        self._stream.run(op)

    def sync(self) -> None:
        """Wait for every replay submitted so far on the graph's stream."""
        if self._exec is None:
            raise self._closed_error("sync")
        self._stream.sync()

    def close(self) -> None:
        """Destroy the executable graph and release the pins on its tensors. Idempotent."""
        exe, self._exec = self._exec, None
        if exe is not None:
            exe.close()
            self._unpin()
            self._nodes = ()

    @property
    def closed(self) -> bool:
        return self._exec is None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _closed_error(self, what: str) -> LifetimeError:
        return LifetimeError(
            diagnostic(
                f"cannot {what} graph #{self.id}: it is closed",
                help="build a new graph with CudaGraph.scope(stream); a closed graph has released its tensors",
            )
        )

    # -- inspection ---------------------------------------------------------------------

    @property
    def stream(self) -> Stream:
        return self._stream

    @property
    def executable(self) -> Executable:
        """The backend's executable graph (a cuda.core ``Graph`` wrapper on CUDA)."""
        if self._exec is None:
            raise self._closed_error("inspect")
        return self._exec

    @property
    def nodes(self) -> tuple[RecordedNode, ...]:
        """The recorded ops, in record order (a topological order of the DAG)."""
        if self._exec is None:
            raise self._closed_error("inspect")
        return self._nodes

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Dependency edges as (predecessor index, node index)."""
        return [(d, n.index) for n in self.nodes for d in sorted(n.deps)]

    def __repr__(self) -> str:
        state = "closed" if self._exec is None else f"{len(self._nodes)} nodes"
        return f"<CudaGraph #{self.id} on {self._stream.device}, {state}, order={self.order}>"

    def to_dot(self, include_driver: bool = False) -> str:
        """A Graphviz DOT picture of the DAG: ops labelled with kernel and tensor names, edges with
        the tensors that carry the dependency. ``include_driver=True`` appends the CUDA driver's
        own dump of the graph (``cuGraphDebugDotPrint``) where there is a driver."""
        nodes = self.nodes
        lines = [f'digraph "graph{self.id}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
        for n in nodes:
            lines.append(f'  n{n.index} [label="{_dot_escape(f"{n.index}: {n.op.label()}")}"];')
        for n in nodes:
            for d in sorted(n.deps):
                shared = _shared_tensors(nodes[d].op, n.op)
                label = f' [label="{_dot_escape(shared)}"]' if shared else ""
                lines.append(f"  n{d} -> n{n.index}{label};")
        lines.append("}")
        dot = "\n".join(lines) + "\n"
        driver_dot = getattr(self.executable, "driver_dot", None)
        if include_driver and driver_dot is not None:
            dot += driver_dot()
        return dot


def _shared_tensors(before: GraphNode, after: GraphNode) -> str:
    names = []
    for a in after.borrows:
        for b in before.borrows:
            if (a.mutable or b.mutable) and a.overlaps(b) and b.tensor.name not in names:
                names.append(b.tensor.name)
    return ", ".join(names)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
