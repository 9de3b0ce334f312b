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
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self, SupportsIndex

import numpy as np

from ._control import ControlNode
from ._errors import LifetimeError, NotAGraphNodeError, ScopeStateError, SignatureError, diagnostic, not_copyable
from ._kernel import KernelLaunch
from ._lifetime import SHARED_REPLAYS, Pin, order_replay, ordered_already, repin, replay_queued, sharers
from ._ops import GraphNode
from ._params import ParamTable
from ._scope import RecordedNode, Scope, caller, supersede
from ._stream import Stream
from ._tensor import Tensor
from ._update import (
    Structure,
    all_borrows,
    check_rebind,
    commit,
    plan_rebind,
    take_in_place,
    topology,
    update_executable,
)

if TYPE_CHECKING:
    from ._backends._base import Executable

_graph_ids = itertools.count(1)


class CudaGraph:
    """An instantiated graph: ``launch()`` replays every recorded op with one driver call."""

    def __init__(
        self, executable: Executable, nodes: tuple[RecordedNode, ...], stream: Stream, pin: Pin, order: str
    ) -> None:
        self.id = next(_graph_ids)
        self._exec: Executable | None = executable
        self._nodes = nodes
        self._stream = stream
        self.order = order
        pin.hand_to_graph(f"graph #{self.id} ({len(nodes)} nodes, built on stream #{stream.id})")
        self._pin = pin
        # Host streams run work synchronously: only a device with streams needs replay ordering.
        self._ordered = stream.device.is_cuda
        # Where the last replay was launched (graph.launch(stream=) may name another stream): it
        # ends after every earlier one, which it was ordered after, so sync() waits for it.
        self._last_launch = stream
        self._lock = threading.Lock()
        # The thread whose launch replays the graph on the host backend (0: none), which runs the
        # users' host references and region callables under the lock (see _locked).
        self._replaying = 0
        # The pin goes when the graph does, even if the user never calls close().
        self._unpin = weakref.finalize(self, _close, executable, pin)
        # Changes without a rebuild (see the "changes" section): what the last one was ("nodes",
        # "whole" or "rebuilt"; None while the graph is as first built), the parameters (made
        # on first use), and the nodes by slot, bodies included, with the DAGs' ancestor sets and
        # edges (scopegraph._update.Structure: a rebind changes ops, not edges; made on first use).
        self.last_update: str | None = None
        # The open CudaGraph.scope(stream, into=self), whose clean exit replaces the program.
        self.rerecording: Scope | None = None
        self._params: ParamTable | None = None
        self._structure: Structure | None = None

    @classmethod
    def scope(cls, stream: Stream, order: str = "dataflow", into: CudaGraph | None = None, pdl: bool = True) -> Scope:
        """Record graph nodes on ``stream``: ``with CudaGraph.scope(stream) as s: s.record(op)``.

        ``order="dataflow"`` (default) orders ops by the data they share, so independent work
        becomes parallel branches; ``order="program"`` chains every op in record order.

        ``into=graph`` records the program again into an existing graph: on a clean exit the
        graph is updated in place when the new recording has the same topology (a whole-graph
        update) and instantiated again when not; ``graph.last_update`` says which ("whole" or
        "rebuilt"), ``s.graph`` is ``graph``, and its parameters start at their defaults. Until
        then, and if the block raises, the graph is unchanged.

        ``pdl=False`` makes every edge a full dependency; by default an edge between two kernels
        declared ``pdl=True`` is programmatic on sm_90+ GPUs (``graph.programmatic_edges``; see
        ``scopegraph._pdl``). Results are the same either way.
        """
        if into is not None:
            _check_into(into, stream)
        if type(pdl) is not bool:
            raise SignatureError(
                f"pdl= takes True or False, not {pdl!r}\n"
                "help: CudaGraph.scope(stream, pdl=False) turns programmatic edges off"
            )
        scope = Scope(stream, cls, order, caller(1), into)
        scope.pdl = pdl
        return scope

    # -- replay -----------------------------------------------------------------------------

    def launch(self, stream: Stream | None = None, **params: float | np.number[Any] | np.bool_) -> None:
        """Replay the whole graph on ``graph.stream`` (or ``stream``) with one driver call.

        ``name=value`` sets a parameter (``sg.Param``) first: only the nodes that use a changed
        parameter are updated, and the values stay for later replays. Every value is checked
        before anything is updated or launched (see ``scopegraph._params``)."""
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
        if stream.foreign and stream.captured:
            raise stream.captured_error(f"launch graph #{self.id}")
        with self._lock if not self._replaying else self._locked("launch"):
            exe = self._exec  # again, under the lock: recording into the graph may replace it
            if exe is None:
                raise self._closed_error("launch")
            if params:
                self._set_params(exe, params)
            stream.last_work = self.id
            self._last_launch = stream
            if self._ordered:
                pin, native = self._pin, stream.native
                if sharers(pin):
                    with SHARED_REPLAYS:
                        if not ordered_already(pin, native):
                            order_replay(pin, native, stream.device.backend)
                        exe.launch(stream)
                        replay_queued(pin)
                    return
                if not ordered_already(pin, native):
                    order_replay(pin, native, stream.device.backend)
                exe.launch(stream)
                replay_queued(pin)
            else:  # the host backend: the replay runs Python (host references, region callables)
                self._replaying = threading.get_ident()
                try:
                    exe.launch(stream)
                finally:
                    self._replaying = 0

    def _locked(self, what: str) -> threading.Lock:
        """The graph's lock, refused to the host backend's replay of this graph itself: a host
        reference or region callable that launches, syncs, updates, rebinds or closes the graph
        it runs in would wait for its own launch forever."""
        if self._replaying and self._replaying == threading.get_ident():
            raise ScopeStateError(
                diagnostic(
                    f"cannot {what} graph #{self.id} from inside its own replay",
                    [
                        "a host reference or a captured region's host callable is running as part of this "
                        "graph's launch on the host backend (on a GPU the replay runs no Python at all)"
                    ],
                    help=f"{what} the graph after graph.launch() returns, not from the work it replays",
                )
            )
        return self._lock

    def update(self, op: GraphNode) -> None:
        """Run ``op`` on the graph's stream now, ordered after earlier replays (on any stream) and
        before the next one, wherever it is launched: e.g. new inputs.

        ``op`` runs as part of this graph's program: a kernel launch's ``sg.Param`` whose name the
        graph has takes the graph's current value (the last ``launch(name=value)``, else the
        default), whichever Param object the op was built with; a Param the graph does not have
        keeps its default, as in ``stream.run(op)``. An update changes no parameter value. A
        Param of the graph's name but another dtype, or values that would make the op reach past
        its tensors, is a SignatureError, and nothing runs (see ``scopegraph._params``)."""
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
        if stream.foreign and stream.captured:  # before the wait below, which would join the capture
            raise stream.captured_error(f"update graph #{self.id}")
        with self._locked("update"):
            if self._exec is None:  # closed by another thread since the check above
                raise self._closed_error("update")
            if type(op) is KernelLaunch and op.params:  # under the lock: the values of the launches before
                op = self._param_table().for_update(self.id, op)
            last = self._pin.last_stream
            if self._ordered and last is not None and last is not stream.native:
                stream.device.backend.wait_stream(stream.native, last)
            stream.run(op)

    def sync(self) -> None:
        """Wait for every replay of this graph submitted so far, on whichever stream it was
        launched, and for the work on the graph's stream (graph.update)."""
        exe = self._exec
        if exe is None:
            raise self._closed_error("sync")
        if self._last_launch is not self._stream:
            self._last_launch.sync()
        self._stream.sync()
        # Reports a GPU loop stopped by its max_iterations (_control). Under the lock: a replay
        # enqueued between the counters' read and their reset (a copy not ordered with the graph's
        # streams) would have its count and its report wiped.
        with self._locked("sync"):
            exe = self._exec  # the executable into= may have replaced
            if exe is not None:
                exe.after_sync(self._last_launch)

    def close(self) -> None:
        """Destroy the executable graph and release the pins on its tensors. Idempotent, and safe
        while a replay still runs: the memory is released after it (see ``_lifetime``)."""
        with self._locked("close"):
            exe, self._exec = self._exec, None
            self._last_launch = self._stream  # not another library's stream, kept alive
            if exe is not None:
                self._unpin()
                self._nodes = ()

    @property
    def closed(self) -> bool:
        return self._exec is None

    def __enter__(self) -> Self:
        if self._exec is None:  # as `with` a closed file: the block would only meet this error later
            raise self._closed_error("enter")
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

    # -- changes without a rebuild (scopegraph._params, _update) ----------------------------

    @property
    def params(self) -> dict[str, np.generic]:
        """The graph's parameters (``sg.Param``) by name, with their current values."""
        if self._exec is None:
            raise self._closed_error("inspect")
        return dict(self._param_table().values)

    def _param_table(self) -> ParamTable:
        table = self._params
        if table is None:
            table = self._params = ParamTable(self._structure_of().flat)
        return table

    def _structure_of(self) -> Structure:
        structure = self._structure
        if structure is None:
            structure = self._structure = Structure(self._nodes)
        return structure

    def _set_params(self, exe: Executable, params: Mapping[str, object]) -> None:
        """Update the nodes (in bodies too) that use a parameter whose value changes."""
        table = self._param_table()
        planned = table.plan(self.id, params)
        if planned is not None:
            values, slots = planned
            self.last_update = update_executable(exe, table.flat, slots, values, table.values)
            table.values = values

    def rebind(self, mapping: Mapping[Tensor, Tensor]) -> None:
        """Point every node that uses ``old`` (or a view of it) at ``new`` instead, for each
        ``old: new``, in loop and branch bodies too (a loop's flag included): node updates, no
        rebuild (``graph.last_update``: "nodes", or "whole" where the CUDA driver refuses node
        updates inside conditional bodies). Same dtype, shape and device; the ownership rules are
        checked again with the new tensors and the pins move from ``old`` to ``new``. On any
        refusal the graph is unchanged (see ``scopegraph._update``)."""
        with self._locked("rebind"):
            exe = self._exec
            if exe is None:
                raise self._closed_error("rebind")
            if self.rerecording is not None:
                raise ScopeStateError(
                    diagnostic(
                        f"cannot rebind graph #{self.id} while a scope records into it",
                        [f"the scope opened at {self.rerecording.opened_at} replaces the graph's program when it ends"],
                        help="record the new tensors in that scope, or rebind after it ends",
                    )
                )
            structure = self._structure_of()
            changes = plan_rebind(self.id, structure, mapping)
            check_rebind(self.id, structure, changes)
            values = self._params.values if self._params is not None else {}
            kind = update_executable(exe, structure.flat, changes, values, values, changes)
            commit(structure.flat, changes)
            repin(self._pin, all_borrows(self._nodes))
            if changes:
                self.last_update = kind

    def _rerecord(self, nodes: tuple[RecordedNode, ...], stream: Stream, pin: Pin, order: str) -> None:
        """A clean exit of ``CudaGraph.scope(stream, into=self)``: take the new recording, by a
        whole-graph update when the topology matches, else by instantiating it. Raises with the
        graph unchanged; on success the scope's ``pin`` is merged into the graph's and released."""
        with self._locked("record into"):
            exe = self._exec
            if exe is None:
                raise self._closed_error("record into")
            shape = topology(nodes, exe.pdl)
            same = shape is not None and shape == topology(self._nodes, exe.pdl)
            if same and take_in_place(exe, self._param_table(), nodes):
                self.last_update = "whole"
            else:
                rebuilt = stream.device.backend.build(nodes, stream)
                rebuilt.take_reports_of(exe)
                self._unpin.detach()
                self._exec = rebuilt
                self._unpin = weakref.finalize(self, _close, rebuilt, self._pin)
                exe.close()  # a replay in flight completes first
                self.last_update = "rebuilt"
            supersede(self._nodes)
            self._nodes = nodes
            self.order = order
            self._params = None
            self._structure = None
            graph_pin = self._pin
            repin(graph_pin, all_borrows(nodes))
            graph_pin.pending |= pin.pending
            graph_pin.description = f"graph #{self.id} ({len(nodes)} nodes, built on stream #{self._stream.id})"
            pin.release()

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
        """Dependency edges as (predecessor index, node index), programmatic ones included: every
        ordering the tracker found. The CUDA graph itself leaves out the edges that others imply
        (a node waiting for two nodes of one chain waits for the later one only; see
        ``scopegraph._tracker.without_implied``), which orders the same work."""
        with self._locked("read the edges of"):  # a recording into= the graph replaces its nodes
            return [(d, n.index) for n in self.nodes for d in sorted(n.deps)]

    @property
    def programmatic_edges(self) -> list[tuple[int, int]]:
        """The edges that are programmatic (a subset of ``edges``; those the CUDA graph keeps are
        programmatic there): between PDL kernels, on a GPU of sm_90 or later; empty on the host
        backend, below sm_90 and for ``CudaGraph.scope(stream, pdl=False)`` (see ``scopegraph._pdl``)."""
        with self._locked("read the edges of"):
            if not self.executable.pdl:
                return []
            return [(d, n.index) for n in self.nodes for d in sorted(n.programmatic)]

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:  # copy.copy, copy.deepcopy, pickle
        # A copy would share the executable and the pins: closing one would leave the other
        # replaying a destroyed graph.
        raise not_copyable(
            f"graph #{self.id}",
            "share the graph object itself (threads may launch it), or record another: CudaGraph.scope(stream)",
        )

    def __repr__(self) -> str:
        state = "closed" if self._exec is None else f"{len(self._nodes)} nodes"
        return f"<CudaGraph #{self.id} on {self._stream.device}, {state}, order={self.order}>"

    def to_dot(self, include_driver: bool = False) -> str:
        """A Graphviz DOT picture of the DAG: ops labelled with kernel and tensor names, edges with
        the tensors that carry the dependency, programmatic edges dashed (in loop and branch bodies
        too; a body's entry from its loop or branch node is dotted). ``include_driver=True``
        appends the CUDA driver's own dump of the graph (``cuGraphDebugDotPrint``) where there is a driver."""
        if not isinstance(include_driver, (bool, np.bool_)):
            raise SignatureError(
                f"include_driver={include_driver!r} is not True or False\n"
                "help: pass include_driver=True for the driver's dump as well, or leave it out"
            )
        nodes = self.nodes
        in_effect = self.executable.pdl  # programmatic edges, as programmatic_edges
        lines = [f'digraph "graph{self.id}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
        for n in nodes:
            lines.append(f'  n{n.index} [label="{_dot_escape(f"{n.index}: {n.op.label()}")}"];')
            if isinstance(n.op, ControlNode):  # a loop or branch: its bodies as clusters
                lines += n.op.dot(f"n{n.index}", in_effect)
        programmatic = set(self.programmatic_edges)
        for n in nodes:
            for d in sorted(n.deps):
                shared = _shared_tensors(nodes[d].op, n.op)
                attrs = [f'label="{_dot_escape(shared)}"'] if shared else []
                if (d, n.index) in programmatic:  # the dependent may start while its predecessor runs
                    attrs.append("style=dashed")
                label = f" [{', '.join(attrs)}]" if attrs else ""
                lines.append(f"  n{d} -> n{n.index}{label};")
        lines.append("}")
        dot = "\n".join(lines) + "\n"
        driver_dot = getattr(self.executable, "driver_dot", None)
        if include_driver and driver_dot is not None:
            dot += driver_dot()
        return dot


def _check_into(graph: object, stream: Stream) -> None:
    """``CudaGraph.scope(stream, into=graph)``: refused before anything is recorded."""
    if not isinstance(graph, CudaGraph):
        raise SignatureError(
            f"into= takes a CudaGraph, not {type(graph).__name__}\nhelp: pass a graph that s.graph returned"
        )
    if graph.closed:
        raise graph._closed_error("record into")
    if isinstance(stream, Stream) and stream.device is not graph.stream.device:
        raise SignatureError(
            f"graph #{graph.id} lives on {graph.stream.device}; stream #{stream.id} is on {stream.device}\n"
            "help: record into a graph from a stream of the graph's device"
        )


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
