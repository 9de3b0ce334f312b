"""The executable graph a scope produces.

A CudaGraph owns its backend executable and the scope's :class:`~scopegraph._lifetime.Pin` on
every allocation its nodes touch: the tensors stay alive while the graph does (it holds the ops,
which hold the tensors), ``free()`` on any of them raises LifetimeError until ``close()`` (or
garbage collection) releases the pin, and the memory itself is released only after the last
replay has finished on the GPU.

Thread safety: one graph may be launched, updated and closed from several threads; each call
takes the graph's lock, so replays of one graph never overlap and ordering across streams holds.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Self

from ._errors import LifetimeError, NotAGraphNodeError, SignatureError, diagnostic
from ._lifetime import Pin, order_replay
from ._ops import GraphNode

from ._scope import RecordedNode, Scope, caller
from ._stream import Stream

if TYPE_CHECKING:
    from ._backends._base import Executable

_graph_ids = itertools.count(1)


class CudaGraph:
    """An instantiated graph: ``launch()`` replays every recorded op with one driver call."""

    def __init__(self, executable: Executable, nodes: tuple[RecordedNode, ...], stream: Stream, pin: Pin, order: str) -> None:
        self.id = next(_graph_ids)
        self._exec: Executable | None = executable
        self._nodes = nodes
        self._stream = stream
        self.order = order
        pin.description = f"graph #{self.id} ({len(nodes)} nodes, built on stream #{stream.id})"
        self._pin = pin
        # Host streams run work synchronously: only a device with streams needs replay ordering.
        self._ordered = stream.device.is_cuda
        self._lock = threading.Lock()
        # The pin goes when the graph does, even if the user never calls close().
        self._unpin = weakref.finalize(self, _close, executable, pin)

    @classmethod
    def scope(cls, stream: Stream, order: str = "dataflow") -> Scope:
        """Record graph nodes on ``stream``: ``with CudaGraph.scope(stream) as s: s.record(op)``.

        ``order="dataflow"`` (default) orders ops by the data they share, so independent work
        becomes parallel branches; ``order="program"`` chains every op in record order.
        """
        return Scope(stream, cls, order, caller(1))

    # -- replay -----------------------------------------------------------------------------

    def launch(self, stream: Stream | None = None) -> None:
        """Replay the whole graph on ``graph.stream`` (or ``stream``) with one driver call."""
        exe = self._exec
        if exe is None:
            raise self._closed_error("launch")
        if stream is None:
            stream = self._stream
        elif not isinstance(stream, Stream):
            raise SignatureError(
                f"graph.launch(stream=) takes a scopegraph Stream, not {type(stream).__name__}\n"
                "help: pass dev.stream(), or sg.Stream.from_handle(obj) for another library's stream"
            )
        elif stream.device is not self._stream.device:
            raise SignatureError(
                f"graph #{self.id} lives on {self._stream.device}; stream #{stream.id} is on {stream.device}\n"
                "help: launch on a stream of the graph's device"
            )
        if stream.recording is not None:
            stream.check_not_recording(f"launch graph #{self.id}")
        with self._lock:
            if self._ordered:
                order_replay(self._pin, stream.native, stream.device.backend)
            stream.last_work = f"graph #{self.id}"
            exe.launch(stream)

    def update(self, op: GraphNode) -> None:
        """Run ``op`` on the graph's stream now, ordered after earlier replays (on any stream) and
        before the next one, wherever it is launched: e.g. new inputs."""
        if self._exec is None:
            raise self._closed_error("update")
        if not isinstance(op, GraphNode):
            raise NotAGraphNodeError(
                f"graph.update() takes a GraphNode (sg.memcpy, sg.memset, a kernel launch), not {type(op).__name__}\n"
                "help: e.g. graph.update(sg.memcpy(input.mut(), new_input))"
            )
        stream = self._stream
        if stream.recording is not None:
            stream.check_not_recording(f"update graph #{self.id}")
        with self._lock:
            last = self._pin.last_stream
            if self._ordered and last is not None and last is not stream.native:
                stream.device.backend.wait_stream(stream.native, last)
            stream.run(op)

    def sync(self) -> None:
        """Wait for every replay submitted so far on the graph's stream."""
        if self._exec is None:
            raise self._closed_error("sync")
        self._stream.sync()

    def close(self) -> None:
        """Destroy the executable graph and release the pins on its tensors. Idempotent, and safe
        while a replay still runs: the memory is released after it (see ``_lifetime``)."""
        with self._lock:
            exe, self._exec = self._exec, None
            if exe is not None:
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


def _close(executable: Executable, pin: Pin) -> None:
    executable.close()  # an in-flight replay completes; the driver frees the executable after it
    pin.release()


def _shared_tensors(before: GraphNode, after: GraphNode) -> str:
    names = []
    for a in after.borrows:
        for b in before.borrows:
            if (a.mutable or b.mutable) and a.overlaps(b) and b.tensor.name not in names:
                names.append(b.tensor.name)
    return ", ".join(names)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
