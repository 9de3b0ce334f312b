"""A model-based test of scopegraph's ordering across streams (DESIGN.md section 2, "Device
lifetime" and "Ordering across streams"; README "Streams are ordered for you").

The host backend runs work synchronously, so it keeps no stream bookkeeping; this test gives it
what a GPU has: four streams named "S0".."S3" (``stream.native``), a backend whose ``run`` does
what ``CudaBackend.run`` does around an enqueue (``note_eager_use``, enqueue, ``queued_on``),
whose ``wait_stream(s, last)`` makes every later event on ``s`` follow the latest event queued on
``last``, and whose ``retire`` is an event on a memory stream after the latest event of each
stream it is given. Graphs are made ``_ordered`` (as on a GPU) and their executable's launch
logs a replay event, so the real ``CudaGraph.launch`` orders them.

Property (checked as each event is enqueued): two events that touch overlapping bytes, one of
them writing, are ordered by happens-before (program order on a stream plus stream waits,
transitively), unless both are eager work (on two streams of the user's: the user orders those,
README); and a released allocation's retire comes after every event that used it.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import scopegraph as sg
from scopegraph import CudaGraph
from scopegraph._lifetime import note_eager_use, queued_on

STREAMS = ("S0", "S1", "S2", "S3")
MEMORY_STREAM = "MEM"  # where retire's stream-ordered free runs

# An op a graph records, or eager work: ("copy", dst, src) or ("fill", dst, -).
op_specs = st.tuples(st.sampled_from(["copy", "fill"]), st.integers(0, 9), st.integers(0, 9))
stream_ids = st.integers(0, len(STREAMS) - 1)
picks = st.integers(0, 9)


@dataclass
class Access:
    alloc: int  # the allocation's id (for retire)
    start: int  # absolute addresses
    end: int
    write: bool

    def conflicts(self, other: Access) -> bool:
        return (self.write or other.write) and self.start < other.end and other.start < self.end


@dataclass
class Event:
    id: int
    stream: str
    label: str
    eager: bool
    accesses: list[Access]
    before: set[int] = field(default_factory=set)  # every event that happens before this one


class OrderingModel(RuleBasedStateMachine):
    # Whether a foreign wrapper may be dropped (the graphs and releases of the other wrappers of its
    # memory must still wait for the work done through it).
    drop_wrappers = True

    def __init__(self) -> None:
        super().__init__()
        self.dev = sg.device("host")
        dev = self.dev
        # Made before the backend is patched: their setup work runs on the host setup stream.
        whole = dev.zeros((16,), name="A")
        self.base = np.zeros(16, np.float32)  # foreign memory, wrapped
        b, c = dev.zeros((8,), name="B"), dev.zeros((8,), name="C")
        f1 = sg.Tensor.from_dlpack(self.base[0:8], name="F1")
        f2 = sg.Tensor.from_dlpack(self.base[8:16], name="F2")  # apart from F1 until a wrapper bridges them
        b_wrapped = sg.Tensor.from_dlpack(b, name="B'")  # a wrapper of scopegraph memory (one region with B)
        views = [whole[i : i + 8].view((8,), name=f"A[{i}:{i + 8}]") for i in (0, 4, 8)]
        self.tensors: list[sg.Tensor | None] = [*views, b, c, f1, f2, b_wrapped]
        # What freeing each index releases: an owner (A for its views) is freed, a foreign wrapper dropped.
        self.roots: dict[int, sg.Tensor] = {0: whole, 1: whole, 2: whole, 3: b, 4: c, 5: f1, 6: f2, 7: b_wrapped}
        self.scratch = [dev.zeros((8,), name=f"T{i}") for i in range(len(STREAMS))]  # eager reads land here
        # Storage kept alive, so no address is reused while the model runs; retire finds its allocation.
        self.storage: dict[int, tuple[object, Access, str]] = {}
        for t in (whole, b, c, f1, f2, b_wrapped):
            self._keep(t)
        self.streams = [dev.stream() for _ in STREAMS]
        for s, name in zip(self.streams, STREAMS, strict=True):
            s.native = name
        self.graphs: list[CudaGraph] = []
        self.scope: Any = None  # an open scope (at most one), entered by hand
        self.events: list[Event] = []
        self.last: dict[str, int] = {}  # the latest event on each stream
        self.waits: dict[str, set[int]] = {s: set() for s in (*STREAMS, MEMORY_STREAM)}
        self.trace: list[str] = []
        self.problems: list[str] = []
        backend: Any = dev.backend
        self.backend = backend
        backend.run = self._run
        backend.wait_stream = self._wait_stream
        backend.retire = self._retire

    def teardown(self) -> None:
        try:
            if self.scope is not None:
                self.scope.__exit__(RuntimeError, RuntimeError(), None)
            for g in self.graphs:
                g.close()
        finally:
            for name in ("run", "wait_stream", "retire"):
                self.backend.__dict__.pop(name, None)

    # -- the fake device -----------------------------------------------------------------

    def _enqueue(self, stream: str, label: str, eager: bool, accesses: list[Access]) -> Event:
        e = Event(len(self.events), stream, label, eager, accesses)
        preds = set(self.waits[stream])
        self.waits[stream].clear()
        if stream in self.last:
            preds.add(self.last[stream])
        for p in preds:
            e.before |= self.events[p].before | {p}
        self.last[stream] = e.id
        self.trace.append(f"  e{e.id} on {stream}: {label}")
        for other in self.events:
            if other.eager and eager:
                continue  # eager work on two streams is the user's to order (README)
            if other.id in e.before:
                continue
            for a in other.accesses:
                for b in accesses:
                    if a.conflicts(b):
                        self.problems.append(
                            f"e{other.id} ({other.label} on {other.stream}) and e{e.id} ({label} on {stream}) "
                            f"overlap at {max(a.start, b.start):#x}.. with a write, and nothing orders them"
                        )
        self.events.append(e)
        return e

    def _wait_stream(self, waiter: object, waited: object) -> None:
        assert isinstance(waiter, str) and isinstance(waited, str), (waiter, waited)
        self.trace.append(f"  wait {waiter} <- {waited}")
        if waited in self.last:
            self.waits[waiter].add(self.last[waited])

    def _run(self, op: sg.GraphNode, stream: sg.Stream) -> None:
        """CudaBackend.run, around the enqueue."""
        native = stream.native
        assert isinstance(native, str)
        borrows = op.borrows
        if borrows:
            note_eager_use(borrows, native, self.backend)
        self._enqueue(native, f"eager {describe(op)}", True, accesses(op))
        if borrows:
            queued_on(borrows, native)

    def _retire(self, storage: object, users: set[object], borrowed: bool) -> None:
        found = self.storage.get(id(storage))
        if found is None:
            return
        _, whole, name = found
        # Owned memory is freed on the memory stream after waiting for each user; a foreign wrapper's
        # owner is kept (events recorded on its users) until they are done, ordering no stream.
        where = f"keep {name}" if borrowed else MEMORY_STREAM
        self.waits.setdefault(where, set())
        for u in users:
            assert isinstance(u, str)
            self._wait_stream(where, u)
        free = self._enqueue(where, f"retire {name} (users {sorted(map(str, users))})", False, [])
        # Owned memory goes back to the pool: every event on its bytes, through any wrapper, must be
        # done. A foreign wrapper's retire only keeps its owner alive: for the work through it.
        for e in self.events:
            if e.id == free.id or e.id in free.before:
                continue
            if any(a.alloc == whole.alloc if borrowed else a.conflicts(whole) for a in e.accesses):
                self.problems.append(f"retire of {name} (e{free.id}) is not after e{e.id} ({e.label} on {e.stream})")

    # -- helpers ------------------------------------------------------------------------

    def _keep(self, t: sg.Tensor) -> None:
        """Keep ``t``'s storage (not its allocation: it must be collectable) and what retire checks."""
        a = t.allocation
        self.storage[id(a.storage)] = (a.storage, Access(a.id, a.address, a.address + a.nbytes, True), t.name)

    def _tensor(self, i: int) -> sg.Tensor | None:
        return self.tensors[i % len(self.tensors)]

    def _op(self, spec: tuple[str, int, int], scratch: sg.Tensor | None = None) -> sg.GraphNode | None:
        kind, d, s = spec
        dst = self._tensor(d)
        if dst is None:
            return None
        if kind == "fill":
            return sg.memset(dst.mut(), 1.0)
        src = self._tensor(s)
        if src is None or overlaps(dst, src):
            return None
        return sg.memcpy(dst.mut(), src)

    def _graph(self, i: int) -> CudaGraph:
        return self.graphs[i % len(self.graphs)]

    def _made(self, g: CudaGraph) -> None:
        g._ordered = True  # as on a GPU
        self.graphs.append(g)

    # -- operations ------------------------------------------------------------------------

    @rule(stream=stream_ids, specs=st.lists(op_specs, min_size=1, max_size=3))
    def build(self, stream: int, specs: list[tuple[str, int, int]]) -> None:
        ops = [op for op in (self._op(spec) for spec in specs) if op is not None]
        if not ops:
            return
        try:
            with CudaGraph.scope(self.streams[stream]) as s:
                for op in ops:
                    s.record(op)
        except sg.ScopeGraphError:
            return
        self._made(s.graph)
        self.trace.append(f"g{len(self.graphs) - 1} = build on S{stream}: {', '.join(map(describe, ops))}")

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids)
    def launch(self, g: int, stream: int) -> None:
        graph = self._graph(g)
        if graph.closed:
            return
        label = f"replay g{self.graphs.index(graph)}"

        def replay(native_stream: sg.Stream) -> None:
            assert native_stream is self.streams[stream]
            touched = [a for rec in graph.nodes for a in accesses(rec.op)]
            self._enqueue(STREAMS[stream], label, False, touched)

        exe: Any = graph._exec
        exe.launch = replay
        self.trace.append(f"g{self.graphs.index(graph)}.launch(S{stream})")
        try:
            graph.launch(stream=self.streams[stream])
        except sg.ScopeStateError:
            self.trace.pop()
        finally:
            if exe is not None:
                del exe.__dict__["launch"]

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids)
    def launch_again(self, g: int, stream: int) -> None:
        """Replays are the point: twice as likely as the other rules."""
        self.launch(g, stream)

    @rule(stream=stream_ids, write=st.booleans(), t=picks)
    def eager(self, stream: int, write: bool, t: int) -> None:
        x = self._tensor(t)
        if x is None:
            return
        op = sg.memset(x.mut(), 2.0) if write else sg.memcpy(self.scratch[stream].mut(), x)
        self.trace.append(f"S{stream}.run({describe(op)})")
        try:
            self.streams[stream].run(op)
        except sg.ScopeStateError:
            self.trace.pop()

    @precondition(lambda self: self.graphs)
    @rule(g=picks, spec=op_specs)
    def update(self, g: int, spec: tuple[str, int, int]) -> None:
        graph = self._graph(g)
        op = self._op(spec)
        if graph.closed or op is None:
            return
        self.trace.append(f"g{self.graphs.index(graph)}.update({describe(op)})")
        try:
            graph.update(op)
        except sg.ScopeStateError:
            self.trace.pop()

    @precondition(lambda self: self.graphs)
    @rule(g=picks)
    def close(self, g: int) -> None:
        graph = self._graph(g)
        if not graph.closed:
            self.trace.append(f"g{self.graphs.index(graph)}.close()")
            graph.close()

    @precondition(lambda self: self.graphs)
    @rule(g=picks, old=picks, new=picks)
    def rebind(self, g: int, old: int, new: int) -> None:
        graph, b = self._graph(g), self._tensor(new)
        if graph.closed or b is None:
            return
        used = [borrow.tensor for rec in graph.nodes for borrow in rec.op.borrows]
        a = used[old % len(used)] if used else None
        if a is None or a is b:
            return
        try:
            graph.rebind({a: b})
        except sg.ScopeGraphError:
            return
        self.trace.append(f"g{self.graphs.index(graph)}.rebind({{{a.name}: {b.name}}})")

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids, specs=st.lists(op_specs, min_size=1, max_size=3))
    def rerecord(self, g: int, stream: int, specs: list[tuple[str, int, int]]) -> None:
        graph = self._graph(g)
        ops = [op for op in (self._op(spec) for spec in specs) if op is not None]
        if graph.closed or not ops:
            return
        try:
            with CudaGraph.scope(self.streams[stream], into=graph) as s:
                for op in ops:
                    s.record(op)
        except sg.ScopeGraphError:
            return
        self.trace.append(f"record into g{self.graphs.index(graph)} on S{stream}: {', '.join(map(describe, ops))}")

    @rule(t=picks)
    def free(self, t: int) -> None:
        """free() an owner (a view's owner: its views go too), or drop a foreign wrapper."""
        i = t % len(self.tensors)
        x = self.tensors[i]
        if x is None or x.allocation.pins or self.scope is not None:
            return
        if x.allocation.borrowed and not self.drop_wrappers:
            return
        root = self.roots[i]
        alloc = root.allocation
        if x.allocation.borrowed:
            self.trace.append(f"drop {x.name}")
        else:
            self.trace.append(f"{root.name}.free()")
        if not alloc.borrowed:
            try:
                root.free()
            except sg.LifetimeError:  # a wrapper of it is alive
                self.trace.pop()
                return
        gone = [j for j, y in enumerate(self.tensors) if y is not None and y.allocation is alloc]
        for j in gone:
            self.tensors[j] = None
        if alloc.borrowed:
            del x, root, alloc
            self.roots = {k: v for k, v in self.roots.items() if k not in gone}
            gc.collect(0)

    @precondition(lambda self: len(self.tensors) < 10)
    @rule(which=st.booleans())
    def wrap(self, which: bool) -> None:
        """Another wrapper of memory already in use: of the foreign buffer (overlapping F1 and F2), or
        of B (if alive)."""
        if which:
            source: Any = self.base[4:12]
            name = f"F{len(self.tensors)}"
        else:
            source = self.tensors[3]
            if source is None:
                return
            name = f"B{len(self.tensors)}"
        w = sg.Tensor.from_dlpack(source, name=name)
        self._keep(w)
        self.roots[len(self.tensors)] = w
        self.tensors.append(w)
        self.trace.append(f"{name} = wrap {'base[4:12]' if which else 'B'}")

    # Scopes held open while other work goes on.

    @precondition(lambda self: self.scope is None)
    @rule(stream=stream_ids, into=st.none() | picks)
    def open_scope(self, stream: int, into: int | None) -> None:
        graph = self._graph(into) if into is not None and self.graphs else None
        if graph is not None and graph.closed:
            return
        scope = CudaGraph.scope(self.streams[stream], into=graph)
        try:
            scope.__enter__()
        except sg.ScopeStateError:
            return
        self.scope = scope
        where = f" into g{self.graphs.index(graph)}" if graph is not None else ""
        self.trace.append(f"open scope on S{stream}{where}")

    @precondition(lambda self: self.scope is not None)
    @rule(spec=op_specs)
    def record(self, spec: tuple[str, int, int]) -> None:
        op = self._op(spec)
        if op is None:
            return
        try:
            self.scope.record(op)
        except sg.ScopeGraphError:
            return
        self.trace.append(f"  scope records {describe(op)}")

    @precondition(lambda self: self.scope is not None)
    @rule()
    def close_scope(self) -> None:
        scope, self.scope = self.scope, None
        try:
            scope.__exit__(None, None, None)
        except sg.ScopeGraphError:
            self.trace.append("scope exit refused")
            return
        if scope._into is None:
            self._made(scope.graph)
            self.trace.append(f"g{len(self.graphs) - 1} = the scope's graph")
        else:
            self.trace.append("scope exit (recorded into its graph)")

    @invariant()
    def ordered(self) -> None:
        assert not self.problems, "\n".join([*self.problems, "trace:", *self.trace])


def accesses(op: sg.GraphNode) -> list[Access]:
    return [Access(b.alloc.id, b.start, b.end, b.mutable) for b in op.borrows if b.start != b.end]


def overlaps(a: sg.Tensor, b: sg.Tensor) -> bool:
    sa, sb = a.allocation.address + a.offset, b.allocation.address + b.offset
    return sa < sb + b.nbytes and sb < sa + a.nbytes


def describe(op: sg.GraphNode) -> str:
    parts = [f"{'w' if b.mutable else 'r'} {b.tensor.name}" for b in op.borrows]
    return f"{type(op).__name__.lower()}({', '.join(parts)})"


OrderingModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestOrderingModel = OrderingModel.TestCase


# -- the holes the model found, shrunk (each is a run of the machine's rules); fixed in _lifetime ---


def run_steps(*steps: tuple[str, dict[str, Any]]) -> list[str]:
    """Run the machine's rules in order; the ordering problems found."""
    machine = OrderingModel()
    try:
        for name, args in steps:
            getattr(machine, name)(**args)
        return machine.problems
    finally:
        machine.teardown()


def test_a_graph_on_memory_a_dropped_wrapper_wrote_waits_for_that_write() -> None:
    """Eager work through wrapper F8 (base[4:12]) on S0, F8 dropped, then a graph reading F2
    (base[8:16], the same bytes) replays on S1: it must wait for S0. (The stream was noted in F8's
    users only, and went with it.)"""
    assert not run_steps(
        ("wrap", {"which": True}),  # F8, base[4:12]
        ("eager", {"stream": 0, "write": True, "t": 8}),
        ("free", {"t": 8}),  # drop F8
        ("build", {"stream": 0, "specs": [("copy", 4, 6)]}),  # C <- F2
        ("launch", {"g": 0, "stream": 1}),
    )


def test_freeing_memory_waits_for_work_through_a_dropped_wrapper_of_it() -> None:
    """Eager work through B' (a wrapper of B) on S1, B' dropped, then B.free(): B's memory goes back
    to the pool only after that work. (B's users never had S1.)"""
    assert not run_steps(
        ("eager", {"stream": 1, "write": True, "t": 7}),
        ("free", {"t": 7}),  # drop B'
        ("free", {"t": 3}),  # B.free()
    )


def test_graphs_sharing_bytes_through_a_later_wrapper_follow_each_other() -> None:
    """g0 reads F2 (base[8:16]) and holds only F2; F8 (base[4:12]) is made later; g1 writes F8. Their
    replays on two streams must be ordered. (g1's write starts outside F2, so F2 was not in g1's
    `written`, and neither graph was the other's sharer.)"""
    assert not run_steps(
        ("build", {"stream": 0, "specs": [("copy", 4, 6)]}),  # g0: C <- F2
        ("wrap", {"which": True}),  # F8, base[4:12]
        ("build", {"stream": 0, "specs": [("fill", 8, 0)]}),  # g1: F8 <- 1
        ("launch", {"g": 1, "stream": 0}),
        ("launch", {"g": 0, "stream": 1}),
    )
