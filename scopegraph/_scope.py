"""The recording scope: ``with CudaGraph.scope(stream) as s: s.record(op)``.

A scope owns, while it is open: the stream's recording flag (so eager work on that stream is
refused), a :class:`~scopegraph._lifetime.Pin` on every allocation a recorded op touches (so
``free()``, and ``freeze()`` of what it writes, are refused), and the dependency tracker. On a
clean exit it hands the pin and the records to a new CudaGraph; on an exception it releases
everything, so the stream stays usable and nothing leaks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from enum import Enum
from threading import get_ident
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ._errors import LifetimeError, NotAGraphNodeError, ScopeStateError, SignatureError, diagnostic
from ._kernel import KernelLaunch
from ._lifetime import Pin
from ._ops import AllocationOp, GraphNode, Join, RecordedOnce
from ._params import Param, note_params
from ._pdl import NONE, EdgeKinds
from ._stream import Stream, check_runnable
from ._tracker import ORDERS, DataflowTracker, ProgramOrderTracker

if TYPE_CHECKING:
    from ._capture import Region
    from ._control import Block, Body, Entry
    from ._graph import CudaGraph
    from ._tensor import Mut, Tensor

# Device-side control flow (``s.while_``, ``s.if_``, ``s.if_else``) lives in ``_control``, which
# imports this module; it registers its entry points here on import (a hook, not an import).
control: type[Entry] | None = None

# Captured regions (``s.capture``, DESIGN.md section 9) live in ``_capture``, which registers its
# entry point here on import. ``finishing`` holds checks that a clean exit runs on the records
# before the graph is built (``_collectives`` registers the check that every rank recorded the
# same collectives).
capture: type[Region] | None = None
finishing: list[Callable[[Sequence[RecordedNode]], None]] = []


_opening = threading.Lock()


class _State(Enum):
    NEW = "not entered"
    OPEN = "open"
    DONE = "finished"
    FAILED = "failed"


_OPEN = _State.OPEN  # read on every record
_getframe = sys._getframe


class RecordedNode:
    """A handle naming one recorded op: its index, the op, its predecessors and where it was recorded."""

    __slots__ = ("_where", "deps", "index", "op", "programmatic")

    def __init__(
        self,
        index: int,
        op: GraphNode,
        deps: frozenset[int],
        where: tuple[str, int],
        programmatic: frozenset[int] = NONE,
    ) -> None:
        self.index = index
        self.op = op
        self.deps = deps
        # The deps whose edges may be programmatic (both ends PDL kernels; see scopegraph._pdl):
        # the CUDA backend makes them programmatic on sm_90+, every other edge is a full one.
        self.programmatic = programmatic
        self._where = where  # (file, line), formatted only when asked: record is a hot path

    @property
    def location(self) -> str:
        """``file:line`` of the ``s.record`` call."""
        return f"{self._where[0]}:{self._where[1]}"

    def __repr__(self) -> str:
        deps = ", ".join(map(str, sorted(self.deps)))
        return f"<node {self.index}: {self.op.label()} after [{deps}]>"


class _Superseded(RecordedNode):
    """A handle from a recording that ``CudaGraph.scope(stream, into=graph)`` replaced: the graph's
    node at its index is another recording's now, so reading its op or edges fails rather than
    show what the graph no longer runs (its index and location still say where it was recorded).
    A class swap: the hot path's RecordedNode keeps plain slots."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name in ("op", "deps", "programmatic"):
            raise LifetimeError(
                diagnostic(
                    f"node {self.index}'s handle, recorded at {self.location}, names a node of a recording "
                    f"that was replaced: its `{name}` is no longer the graph's",
                    ["the graph was recorded again with CudaGraph.scope(stream, into=graph)"],
                    help="use graph.nodes, or the handles that the latest recording's s.record returned",
                )
            )
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:
        return f"<node {self.index} of a replaced recording>"


def supersede(nodes: Sequence[RecordedNode]) -> None:
    """The handles of a recording that a graph no longer runs (see _Superseded), those of its loop
    and branch bodies included."""
    todo = list(nodes)
    while todo:
        node = todo.pop()
        for body in getattr(node.op, "bodies", ()):  # a loop or branch (scopegraph._control)
            todo.extend(body.nodes)
        node.__class__ = _Superseded


def _frame(depth: int) -> tuple[str, int]:
    frame = sys._getframe(depth + 1)
    return frame.f_code.co_filename, frame.f_lineno


def caller(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _other_thread(opened_at: str) -> ScopeStateError:
    """Recording into a scope (or one of its loop and branch bodies) from a thread that did not open it."""
    return ScopeStateError(
        diagnostic(
            "cannot record into a scope from a thread other than the one that opened it",
            [f"the scope was opened at {opened_at}, on another thread"],
            help="record from the thread that opened it; other threads may record their own scopes at once",
        )
    )


class Scope:
    """Records graph nodes on one stream; ``s.graph`` is the instantiated graph after a clean exit."""

    def __init__(
        self,
        stream: Stream,
        graph_type: type[CudaGraph],
        order: str = "dataflow",
        opened_at: str = "",
        into: CudaGraph | None = None,
    ) -> None:
        if not isinstance(stream, Stream):
            raise ScopeStateError(
                f"CudaGraph.scope() needs a scopegraph Stream, not {type(stream).__name__}\n"
                "help: use dev.stream(), or sg.Stream.from_handle(obj) for another library's stream"
            )
        tracker = checked_order(order)
        self.stream = stream
        # What a clean exit builds (CudaGraph, passed in by CudaGraph.scope: the graph module
        # imports this one, not the other way round).
        self._graph_type = graph_type
        self.order = order
        # Programmatic dependent launch between PDL kernels (scopegraph._pdl); False: full edges only.
        self.pdl = True
        self.opened_at = opened_at
        self._nodes: list[RecordedNode] = []
        self._edge_kinds = EdgeKinds(order)
        # Dropped when the scope ends: its join callback refers back to the scope.
        self._tracker: DataflowTracker | ProgramOrderTracker | None = tracker(self._add_join)
        self._pin = Pin(f"the open scope at {opened_at}", recording=True)
        self._where = ("", 0)
        self._where_code: object = None  # the code object of the last record's caller
        self._state = _State.NEW
        self._graph: CudaGraph | None = None
        # The graph a clean exit records into again (CudaGraph.scope(stream, into=graph)), and the
        # parameters recorded so far, by name (see _params).
        self._into = into
        self._params: dict[str, Param[Any]] = {}
        # The loop or branch block open in this scope, if any (see _control): record is refused meanwhile.
        self._inner: Block[object] | Region | None = None
        # The loop, branch and capture blocks made in this scope (not in its bodies, which keep their
        # own) and not entered yet, by id: a clean exit refuses them (a block never entered records
        # nothing, silently).
        self._unentered: dict[int, Block[object] | Region] = {}
        # The thread that opened the scope, the only one that may record into it: the tracker's
        # state is not guarded against two threads recording at once (edges would go missing).
        self.thread = 0
        # What opened it when the user did not ("GraphCache.get()"): then only the recording
        # thread's eager work on the stream is refused, since no other thread's belongs to it.
        self.opened_by = ""

    def __repr__(self) -> str:
        return f"<Scope on stream #{self.stream.id}, {len(self._nodes)} nodes, {self._state.value}>"

    def __enter__(self) -> Self:
        if self._state is not _State.NEW:
            raise ScopeStateError("this scope was already used\nhelp: open a new one with CudaGraph.scope(stream)")
        into = self._into
        with _opening:  # two threads must not both open a scope on one stream (or into one graph)
            outer = self.stream.recording
            rival = into.rerecording if into is not None else None
            if outer is None and rival is None:
                self.stream.recording = self
                if into is not None:
                    into.rerecording = self
        if outer is not None:
            raise ScopeStateError(
                diagnostic(
                    f"cannot open a scope on stream #{self.stream.id}: another scope is recording on it",
                    [f"the open scope was opened at {outer.opened_at}", f"the new one at {self.opened_at}"],
                    help="finish the outer scope first, or record the inner work on another stream",
                )
            )
        if rival is not None:
            assert into is not None
            raise ScopeStateError(
                diagnostic(
                    f"cannot record into graph #{into.id}: another scope is recording into it",
                    [f"that scope was opened at {rival.opened_at}", f"this one at {self.opened_at}"],
                    help="finish that scope first: each recording replaces the graph's whole program",
                )
            )
        self.thread = get_ident()
        if self.opened_by:
            self._pin.recorder = self.thread
        self._state = _State.OPEN
        return self

    def record(self, op: GraphNode) -> RecordedNode:
        """Add ``op`` to the graph; returns a handle naming the node. Only GraphNode ops are accepted."""
        if self._state is not _OPEN or self._inner is not None or get_ident() != self.thread:
            raise self._not_recording()
        if not isinstance(op, GraphNode):
            raise _not_a_graph_node(op)
        check_runnable(op, self.stream)
        if type(op) is KernelLaunch:
            if op.params:
                note_params(self._params, op)
        elif isinstance(op, RecordedOnce):
            op.take()
        borrows = op.borrows
        frame = _getframe(1)
        code = frame.f_code
        if frame.f_lineno != self._where[1] or code is not self._where_code:  # a loop shares one tuple
            self._where = (code.co_filename, frame.f_lineno)
            self._where_code = code
        assert self._tracker is not None  # open scopes have one
        deps = self._tracker.add(borrows)
        self._pin.add(borrows)
        node = RecordedNode(
            len(self._nodes), op, deps, self._where, self._edge_kinds.of(op, deps, self._nodes) if self.pdl else NONE
        )
        self._nodes.append(node)
        return node

    def check_thread(self) -> None:
        """Refuse a thread other than the one that opened the scope (its loops, branches, regions)."""
        if get_ident() != self.thread:
            raise _other_thread(self.opened_at)

    def _not_recording(self) -> Exception:
        if self._state is _OPEN and get_ident() != self.thread:
            return _other_thread(self.opened_at)
        if self._inner is not None and self._state is _OPEN:
            return self._inner.busy("record into the scope")
        return ScopeStateError(
            diagnostic(
                f"cannot record into a scope that is {'not open yet' if self._state is _State.NEW else 'finished'}",
                [f"the scope was opened at {self.opened_at}"],
                help="record inside the `with CudaGraph.scope(stream) as s:` block",
            )
        )

    # -- device-side control flow (scopegraph._control) --------------------------------------

    def while_(self, flag: Tensor, max_iterations: int | None = None) -> Block[Body]:
        """A loop the GPU runs while ``flag`` (a one-element sg.i32 tensor) is non-zero, checked
        before each iteration: ``with s.while_(flag) as body: body.record(op)``. The body's ops may
        write ``flag``. ``max_iterations`` bounds a runaway loop (see ``scopegraph._control``)."""
        assert control is not None, "scopegraph._control registers itself on import"
        return control.while_(self, flag, max_iterations, _frame(1))

    def if_(self, flag: Tensor) -> Block[Body]:
        """A branch taken when ``flag`` is non-zero: ``with s.if_(flag) as then: then.record(op)``."""
        assert control is not None, "scopegraph._control registers itself on import"
        return control.if_(self, flag, _frame(1))

    def if_else(self, flag: Tensor) -> Block[tuple[Body, Body]]:
        """A two-way branch: ``with s.if_else(flag) as (then, otherwise):`` records ``then`` (run
        when ``flag`` is non-zero) and ``otherwise`` (run when it is zero)."""
        assert control is not None, "scopegraph._control registers itself on import"
        return control.if_else(self, flag, _frame(1))

    # -- foreign work (scopegraph._capture) -------------------------------------------------

    def capture(
        self,
        *,
        writes: Sequence[Mut[Tensor]],
        reads: Sequence[Tensor] = (),
        host: Callable[..., object] | None = None,
        via: str = "cuda",
        name: str = "capture",
        keep: Sequence[object] = (),
        mode: str = "thread_local",
    ) -> Region:
        """A captured region: another library's GPU work, launched inside
        ``with s.capture(reads=[a], writes=[c.mut()], host=fn) as region:`` on ``region.stream``
        (``via="cuda"``) or ``region.torch_stream`` (``via="torch"``), becomes one child-graph node
        ordered by the declared borrows; the host backend runs ``host(*writes, *reads)`` on numpy
        views instead. See ``scopegraph._capture``."""
        assert capture is not None, "scopegraph._capture registers itself on import"
        return capture(self, writes, reads, host, via, name, keep, mode, _frame(1))

    def _add_join(self, index: int, deps: frozenset[int]) -> None:
        """The tracker's join nodes, recorded where the op that needed them was."""
        assert index == len(self._nodes)
        self._edge_kinds.join(index)
        self._nodes.append(RecordedNode(index, Join(), deps, self._where))

    @property
    def nodes(self) -> tuple[RecordedNode, ...]:
        return tuple(self._nodes)

    @property
    def graph(self) -> CudaGraph:
        """The instantiated graph; available after the ``with`` block ends without an exception."""
        if self._graph is None:
            if self._state is _State.OPEN:
                msg = diagnostic(
                    "`s.graph` read inside the scope that is building it",
                    [f"the scope was opened at {self.opened_at}"],
                    help="read s.graph after the `with` block",
                )
            elif self._state is _State.FAILED:
                msg = "this scope ended with an exception, so it made no graph\nhelp: fix the error and record again"
            else:
                msg = "this scope has not been entered\nhelp: use it as `with CudaGraph.scope(stream) as s:`"
            raise ScopeStateError(msg)
        return self._graph

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._state is not _State.OPEN:  # an ExitStack unwinding twice, or a scope never entered
            if exc_type is not None:
                return  # the exception in flight says more
            raise not_open("this scope", "with CudaGraph.scope(stream) as s:")
        self.stream.recording = None
        if self._into is not None:
            self._into.rerecording = None
        unclosed = end_inner(self, "scope", exc_type)
        if unclosed is not None:
            self._abandon()
            raise unclosed
        if exc_type is not None:
            self._abandon()
            return
        if self._unentered:
            block = next(iter(self._unentered.values()))
            self._abandon()
            raise never_entered(block)
        try:
            for check in finishing:  # before anything is built (see ``finishing``)
                check(self._nodes)
            if self._into is not None:  # the graph takes the records, and the pin's allocations, itself
                self._into._rerecord(tuple(self._nodes), self.stream, self._pin, self.order)
            else:
                executable = self.stream.device.backend.build(self._nodes, self.stream)
        except BaseException:
            self._abandon()
            raise
        if self._into is not None:
            self._graph = self._into
        else:
            self._graph = self._graph_type(executable, tuple(self._nodes), self.stream, self._pin, self.order)
        self._state = _State.DONE
        self._nodes = []
        self._tracker = None
        self._edge_kinds.clear()

    def _abandon(self) -> None:
        self._pin.release()
        self._unentered = {}
        self._nodes = []
        self._tracker = None
        self._edge_kinds.clear()
        self._state = _State.FAILED


def unentered_in(owner: Scope | Body) -> dict[int, Block[object] | Region]:
    """Where a block made in ``owner`` (a scope, or a loop or branch body) waits to be entered: the
    owner's ``_unentered``, which its clean end checks (the scope's exit, the loop's or branch's
    block's). An owner that is not open gives a dict of its own, which nothing reads or keeps
    (entering such a block is refused)."""
    if isinstance(owner, Scope):
        return owner._unentered if owner._state is _State.OPEN else {}
    return owner._unentered if owner._open else {}


def never_entered(block: Block[object] | Region) -> ScopeStateError:
    return ScopeStateError(
        diagnostic(
            f"the {block.description} made at {block.location} was never entered, so nothing of it was recorded",
            ["a loop, branch or captured region records its work when its `with` block ends"],
            help=f"use it as a `with` block: `{block.usage}`",
        )
    )


def not_open(what: str, usage: str) -> ScopeStateError:
    """The error for ``__exit__`` of a scope, block or region that is not open."""
    return ScopeStateError(
        f"{what} is not open: it was never entered, or it has ended already\n"
        f"help: use it as `{usage}`, which enters and ends it once"
    )


def end_inner(owner: Scope | Body, described: str, exc_type: type[BaseException] | None) -> ScopeStateError | None:
    """End a region or block left open in ``owner`` (entered without ``with``, e.g. through an
    ExitStack, and never exited) as failed: its capture is aborted and its pins taken back. The
    error to raise when ``owner`` itself ends cleanly, None when nothing was left open."""
    inner = owner._inner
    if inner is None:
        return None
    unclosed = ScopeStateError(
        diagnostic(
            f"the {described} ended while the {inner.description} opened at {inner.location} was still open",
            ["what it holds is not in the graph"],
            help="end its `with` block inside the enclosing `with` block",
        )
    )
    inner.__exit__(ScopeStateError, unclosed, None)
    return unclosed if exc_type is None else None


def checked_order(order: object) -> type[DataflowTracker] | type[ProgramOrderTracker]:
    """The tracker that ``order`` names (``CudaGraph.scope``'s and ``GraphCache``'s ``order=``)."""
    tracker = ORDERS.get(order) if isinstance(order, str) else None
    if tracker is None:
        raise SignatureError(
            f'order={order!r} is not an ordering\nhelp: use order="dataflow" (default) or order="program"'
        )
    return tracker


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
