"""The recording scope: ``with CudaGraph.scope(stream) as s: s.record(op)``.

A scope owns, while it is open: the stream's recording flag (so eager work on that stream is
refused), a pin on every allocation a recorded op touches (so ``free()`` is refused), and the
dependency tracker. On a clean exit it hands the pins and the records to a new CudaGraph; on an
exception it releases everything, so the stream stays usable and nothing leaks.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Self

from ._errors import NotAGraphNodeError, ScopeStateError, diagnostic
from ._graph import CudaGraph, RecordedNode, release_pins
from ._ops import AllocationOp, GraphNode
from ._stream import Stream, check_runnable
from ._tensor import Allocation
from ._tracker import make_tracker

_OPEN, _NEW, _DONE, _FAILED = "open", "new", "done", "failed"


def _caller(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Scope:
    """Records graph nodes on one stream; ``s.graph`` is the instantiated graph after a clean exit."""

    def __init__(self, stream: Stream, order: str = "dataflow", opened_at: str = "") -> None:
        if not isinstance(stream, Stream):
            raise ScopeStateError(
                f"CudaGraph.scope() needs a scopegraph Stream, not {type(stream).__name__}\n"
                "help: use dev.stream(), or sg.Stream.from_handle(obj) for another library's stream"
            )
        self.stream = stream
        self.order = order
        self.opened_at = opened_at
        self._tracker = make_tracker(order)
        self._nodes: list[RecordedNode] = []
        self._pinned: dict[int, Allocation] = {}
        self._state = _NEW
        self._graph: CudaGraph | None = None

    def __repr__(self) -> str:
        return f"<Scope on stream #{self.stream.id}, {len(self._nodes)} nodes, {self._state}>"

    def __enter__(self) -> Self:
        if self._state != _NEW:
            raise ScopeStateError("this scope was already used\nhelp: open a new one with CudaGraph.scope(stream)")
        outer = self.stream.recording
        if outer is not None:
            raise ScopeStateError(
                diagnostic(
                    f"cannot open a scope on stream #{self.stream.id}: another scope is recording on it",
                    [f"the open scope was opened at {outer.opened_at}", f"the new one at {self.opened_at}"],
                    help="finish the outer scope first, or record the inner work on another stream",
                )
            )
        self.stream.recording = self
        self._state = _OPEN
        return self

    def record(self, op: GraphNode) -> RecordedNode:
        """Add ``op`` to the graph; returns a handle naming the node. Only GraphNode ops are accepted."""
        if self._state is not _OPEN:
            raise ScopeStateError(
                diagnostic(
                    f"cannot record into a scope that is {'not open yet' if self._state is _NEW else 'finished'}",
                    [f"the scope was opened at {self.opened_at}"],
                    help="record inside the `with CudaGraph.scope(stream) as s:` block",
                )
            )
        if not isinstance(op, GraphNode):
            raise _not_a_graph_node(op)
        check_runnable(op, self.stream)
        deps = self._tracker.add(op.borrows)
        pinned = self._pinned
        for b in op.borrows:
            alloc = b.alloc
            if alloc.id not in pinned:
                pinned[alloc.id] = alloc
                alloc.pins[id(self)] = f"the open scope at {self.opened_at}"
        frame = sys._getframe(1)
        node = RecordedNode(len(self._nodes), op, deps, (frame.f_code.co_filename, frame.f_lineno))
        self._nodes.append(node)
        return node

    @property
    def nodes(self) -> tuple[RecordedNode, ...]:
        return tuple(self._nodes)

    @property
    def graph(self) -> CudaGraph:
        """The instantiated graph; available after the ``with`` block ends without an exception."""
        if self._graph is None:
            if self._state is _OPEN:
                msg = diagnostic(
                    "`s.graph` read inside the scope that is building it",
                    [f"the scope was opened at {self.opened_at}"],
                    help="read s.graph after the `with` block",
                )
            elif self._state is _FAILED:
                msg = "this scope ended with an exception, so it made no graph\nhelp: fix the error and record again"
            else:
                msg = "this scope has not been entered\nhelp: use it as `with CudaGraph.scope(stream) as s:`"
            raise ScopeStateError(msg)
        return self._graph

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stream.recording = None
        if exc_type is not None:
            self._abandon()
            return
        pins = list(self._pinned.values())
        try:
            executable = self.stream.device.backend.build(self._nodes, self.stream)
        except BaseException:
            self._abandon()
            raise
        self._graph = CudaGraph(executable, tuple(self._nodes), self.stream, pins, self.order)
        release_pins(pins, id(self))
        self._state = _DONE
        self._nodes = []
        self._pinned = {}

    def _abandon(self) -> None:
        release_pins(list(self._pinned.values()), id(self))
        self._nodes = []
        self._pinned = {}
        self._state = _FAILED


def _not_a_graph_node(op: object) -> NotAGraphNodeError:
    if isinstance(op, AllocationOp):
        return NotAGraphNodeError(
            diagnostic(
                f"cannot record `{op.name}` in a graph: it allocates memory",
                ["an allocation's address would change on replay, so the graph would use freed or stale memory"],
                help=f"allocate before the scope (`x = stream.run({op.name}(...))` or dev.zeros(...)) "
                "and record ops that write into it",
            )
        )
    return NotAGraphNodeError(
        diagnostic(
            f"s.record() takes a GraphNode (kernel launch, sg.memcpy, sg.memset), not {type(op).__name__}",
            help="build the op first, e.g. s.record(sg.memcpy(dst.mut(), src)) or s.record(kernel[grid, block](...))",
        )
    )

