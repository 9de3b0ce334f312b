"""A model-based test of scopegraph's ordering across streams (DESIGN.md section 2, "Device
lifetime" and "Ordering across streams"; README "Streams are ordered for you").

The host backend runs work synchronously, so it keeps no stream bookkeeping; this test gives it
what a GPU has: four streams named "S0".."S3" (``stream.native``), a backend whose ``run`` does
what ``CudaBackend.run`` does around an enqueue (``note_eager_use``, enqueue, ``queued_on``),
whose ``wait_stream(s, last)`` makes every later event on ``s`` follow the latest event queued on
``last``, and whose ``retire`` is an event on a memory stream after the latest event of each
stream it is given. Graphs are made ``_ordered`` (as on a GPU) and their executable's launch
logs a replay event, so the real ``CudaGraph.launch`` orders them.

A replay touches every node of the graph, loop and branch bodies included
(``scopegraph._control.levels``), each loop's or branch's flag (read by its condition kernels) and
a bounded loop's iteration counter (written by them). What the host executable's bound nodes
touch (the numpy views its thunks hold) is checked against that: the executable must run nothing
``graph.nodes`` does not show.

Beyond plain graphs the machine records loops and branches (nested one deep), records them again
``into=`` a graph (with the same topology too, which takes them in place by node updates), rebinds
tensors in their bodies and flags, gets graphs from a ``GraphCache`` (whose evictions close the
graphs the user does not hold), makes views and row slices of live tensors, and freezes tensors.

Property (checked as each event is enqueued): two events that touch overlapping bytes, one of
them writing, are ordered by happens-before (program order on a stream plus stream waits,
transitively), unless both are eager work (on two streams of the user's: the user orders those,
README); and a released allocation's retire comes after every event that used it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import scopegraph as sg
from scopegraph import CudaGraph
from scopegraph._backends._host import _HostGraph
from scopegraph._control import Body, ControlNode, If, While, levels
from scopegraph._lifetime import note_eager_use, queued_on
from scopegraph._ops import Join, Memcpy, Memset
from scopegraph._scope import RecordedNode

STREAMS = ("S0", "S1", "S2", "S3")
MEMORY_STREAM = "MEM"  # where retire's stream-ordered free runs

# An op a graph records, or eager work: ("copy", dst, src) or ("fill", dst, -).
op_specs = st.tuples(st.sampled_from(["copy", "fill"]), st.integers(0, 15), st.integers(0, 15))
stream_ids = st.integers(0, len(STREAMS) - 1)
picks = st.integers(0, 15)
# A loop or branch: (kind, flag, bounded, ops of its (then) body, ops of its else body, a loop or
# branch nested in its (then) body: (kind, flag, ops) or None).
ControlSpec = tuple[str, int, bool, list[tuple[str, int, int]], list[tuple[str, int, int]], Any]
control_kinds = st.sampled_from(["while", "if", "if_else"])
control_specs = st.tuples(
    control_kinds,
    st.integers(0, 3),
    st.booleans(),
    st.lists(op_specs, min_size=1, max_size=2),
    st.lists(op_specs, max_size=2),
    st.none() | st.tuples(control_kinds, st.integers(0, 3), st.lists(op_specs, min_size=1, max_size=2)),
)


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
        # Loop and branch flags (one i32 each): two rows of Q, and two wrappers of the same foreign
        # word (G, G'); then the views and slices the machine makes. After self.tensors in the
        # numbering the rules use (`picks`), each with what freeing it releases.
        q = dev.zeros((2,), sg.i32, name="Q")
        self.flag_base = np.zeros(2, np.int32)
        g1 = sg.Tensor.from_dlpack(self.flag_base[0:1], name="G")
        g2 = sg.Tensor.from_dlpack(self.flag_base[0:1], name="G'")
        self.more: list[sg.Tensor | None] = [q[0:1], q[1:2], g1, g2]
        self.more_roots: list[sg.Tensor | None] = [q, q, g1, g2]
        # Eager reads land here (a prefix of the right dtype and size).
        self.scratch = [dev.zeros((8,), name=f"T{i}") for i in range(len(STREAMS))]
        self.scratch_i = [dev.zeros((2,), sg.i32, name=f"TI{i}") for i in range(len(STREAMS))]
        # Storage kept alive, so no address is reused while the model runs; retire finds its allocation.
        self.storage: dict[int, tuple[object, Access, str]] = {}
        for t in (whole, b, c, f1, f2, b_wrapped, q, g1, g2):
            self._keep(t)
        self.streams = [dev.stream() for _ in STREAMS]
        for s, name in zip(self.streams, STREAMS, strict=True):
            s.native = name
        self.graphs: list[CudaGraph] = []
        self.names: dict[int, str] = {}  # how the trace names each graph the machine holds (by id)
        self.scope: Any = None  # an open scope (at most one), entered by hand
        self.block: Any = None  # a loop or branch held open in it, entered by hand
        self.bodies: tuple[Body, ...] = ()
        self.froze = False
        # Graphs by key, built on S1 from the ops first asked for with the key.
        self.cache: sg.GraphCache[int] = sg.GraphCache(self.streams[1], self._cache_record, maxsize=2)
        self.cache_specs: dict[int, list[tuple[str, int, int]]] = {}
        self.events: list[Event] = []
        self.last: dict[str, int] = {}  # the latest event on each stream
        self.waits: dict[str, set[int]] = {s: set() for s in (*STREAMS, MEMORY_STREAM)}
        self.trace: list[str] = []
        self.problems: list[str] = []
        backend: Any = dev.backend
        self.backend = backend
        allocate = backend.allocate

        def keep_allocated(nbytes: int) -> tuple[object, int]:
            """A loop's iteration counter (made while recording): kept, and its retire checked."""
            storage, address = allocate(nbytes)
            self.storage[id(storage)] = (storage, Access(-1, address, address + nbytes, True), f"@{address:#x}")
            return storage, address

        backend.allocate = keep_allocated
        backend.run = self._run
        backend.wait_stream = self._wait_stream
        backend.retire = self._retire

    def teardown(self) -> None:
        try:
            if self.block is not None:
                self.block.__exit__(RuntimeError, RuntimeError(), None)
            if self.scope is not None:
                self.scope.__exit__(RuntimeError, RuntimeError(), None)
            for g in self.graphs:
                g.close()
            self.cache.clear()
        finally:
            for name in ("run", "wait_stream", "retire", "allocate"):
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
        if native is None:
            return  # the setup stream (a loop's new counter): complete when its constructor returns
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

    def _all(self) -> list[sg.Tensor | None]:
        return [*self.tensors, *self.more]

    def _tensor(self, i: int) -> sg.Tensor | None:
        every = self._all()
        return every[i % len(every)]

    def _root(self, i: int) -> sg.Tensor | None:
        n = len(self.tensors)
        return self.roots.get(i) if i < n else self.more_roots[i - n]

    def _flag(self, i: int) -> sg.Tensor | None:
        return self.more[i % 4]

    def _op(self, spec: tuple[str, int, int]) -> sg.GraphNode | None:
        kind, d, s = spec
        dst = self._tensor(d)
        if dst is None:
            return None
        try:
            if kind == "fill":
                return sg.memset(dst.mut(), 1)
            src = self._tensor(s)
            if src is None or overlaps(dst, src):
                return None
            return sg.memcpy(dst.mut(), src)
        except sg.ScopeGraphError:  # sizes or dtypes differ, frozen memory
            return None

    def _ops(self, specs: Sequence[tuple[str, int, int]]) -> list[sg.GraphNode]:
        return [op for op in (self._op(spec) for spec in specs) if op is not None]

    def _graph(self, i: int) -> CudaGraph:
        return self.graphs[i % len(self.graphs)]

    def _name(self, g: CudaGraph) -> str:
        return self.names.get(g.id, f"#{g.id}")

    def _made(self, g: CudaGraph) -> None:
        g._ordered = True  # as on a GPU
        self.names[g.id] = f"g{len(self.names)}"
        self.graphs.append(g)

    def _record_control(self, owner: Any, spec: ControlSpec) -> str | None:
        """Record a loop or branch into ``owner`` (a scope or body); its description, or None when
        there is nothing to record. Raises what recording raises."""
        kind, f, bounded, then_specs, else_specs, nested = spec
        flag = self._flag(f)
        then_ops, else_ops = self._ops(then_specs), self._ops(else_specs)
        if flag is None or not then_ops:
            return None
        inner = None
        if nested is not None:
            inner_flag, inner_ops = self._flag(nested[1]), self._ops(nested[2])
            if inner_flag is not None and inner_ops:
                inner = (nested[0], inner_flag, inner_ops)
        bound = 3 if bounded else None
        record_block(owner, kind, flag, bound, then_ops, else_ops, inner)
        limit = ", max 3" if bound and kind == "while" else ""
        text = f"{kind}({flag.name}{limit}) {{{', '.join(map(describe, then_ops))}"
        if inner is not None:
            text += f", {inner[0]}({inner[1].name}) {{{', '.join(map(describe, inner[2]))}}}"
        text += "}"
        if kind == "if_else":
            text += f" else {{{', '.join(map(describe, else_ops))}}}"
        return text

    def _cache_record(self, s: sg.Scope, key: int) -> None:
        for op in self._ops(self.cache_specs[key]):
            s.record(op)

    def _launch(self, graph: CudaGraph, stream: int) -> None:
        if graph.closed:
            return
        label = f"replay {self._name(graph)}"

        def replay(native_stream: sg.Stream) -> None:
            assert native_stream is self.streams[stream]
            touched = replay_accesses(graph.nodes)
            for start, end, write in executable_ranges(exe):
                if not any(a.start <= start and end <= a.end and (a.write or not write) for a in touched):
                    what = "writes" if write else "reads"
                    self.problems.append(f"{label} {what} {start:#x}..{end:#x}, which graph.nodes does not show")
            self._enqueue(STREAMS[stream], label, False, touched)

        exe: Any = graph._exec
        exe.launch = replay
        self.trace.append(f"{self._name(graph)}.launch(S{stream})")
        try:
            graph.launch(stream=self.streams[stream])
        except sg.ScopeStateError:
            self.trace.pop()
        finally:
            if exe is not None:
                del exe.__dict__["launch"]

    # -- operations ------------------------------------------------------------------------

    @rule(stream=stream_ids, specs=st.lists(op_specs, min_size=1, max_size=3))
    def build(self, stream: int, specs: list[tuple[str, int, int]]) -> None:
        ops = self._ops(specs)
        if not ops:
            return
        try:
            with CudaGraph.scope(self.streams[stream]) as s:
                for op in ops:
                    s.record(op)
        except sg.ScopeGraphError:
            return
        self._made(s.graph)
        self.trace.append(f"{self._name(s.graph)} = build on S{stream}: {', '.join(map(describe, ops))}")

    @rule(
        stream=stream_ids,
        before=st.lists(op_specs, max_size=1),
        control=control_specs,
        after=st.lists(op_specs, max_size=1),
    )
    def build_control(
        self,
        stream: int,
        before: list[tuple[str, int, int]],
        control: ControlSpec,
        after: list[tuple[str, int, int]],
    ) -> None:
        """A graph with a loop or branch (maybe nested), between plain ops."""
        first, last = self._ops(before), self._ops(after)
        try:
            with CudaGraph.scope(self.streams[stream]) as s:
                for op in first:
                    s.record(op)
                text = self._record_control(s, control)
                if text is None:
                    raise sg.ScopeStateError("nothing to record")
                for op in last:
                    s.record(op)
        except sg.ScopeGraphError:
            return
        self._made(s.graph)
        parts = [*map(describe, first), text, *map(describe, last)]
        self.trace.append(f"{self._name(s.graph)} = build on S{stream}: {', '.join(parts)}")

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids)
    def launch(self, g: int, stream: int) -> None:
        self._launch(self._graph(g), stream)

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
        scratch = self.scratch_i[stream] if x.dtype == sg.i32 else self.scratch[stream]
        try:
            op = sg.memset(x.mut(), 2) if write else sg.memcpy(scratch[0 : x.size].mut(), x)
        except sg.ScopeGraphError:  # frozen
            return
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
        self.trace.append(f"{self._name(graph)}.update({describe(op)})")
        try:
            graph.update(op)
        except sg.ScopeStateError:
            self.trace.pop()

    @precondition(lambda self: self.graphs)
    @rule(g=picks)
    def close(self, g: int) -> None:
        graph = self._graph(g)
        if not graph.closed:
            self.trace.append(f"{self._name(graph)}.close()")
            graph.close()

    def _like(self, a: sg.Tensor, i: int) -> sg.Tensor | None:
        """A live tensor of ``a``'s dtype and shape, other than ``a``."""
        found = [t for t in self._all() if t is not None and t is not a and t.dtype == a.dtype and t.shape == a.shape]
        return found[i % len(found)] if found else None

    @precondition(lambda self: self.graphs)
    @rule(g=picks)
    def forget(self, g: int) -> None:
        """Drop the last reference to a graph without closing it: it closes when collected (or, if
        the cache holds it, when the cache evicts it)."""
        graph = self._graph(g)
        self.graphs.remove(graph)
        self.trace.append(f"forget {self._name(graph)}")
        del graph
        gc.collect(0)

    @precondition(lambda self: self.graphs)
    @rule(g=picks, old=picks, new=picks)
    def rebind(self, g: int, old: int, new: int) -> None:
        """Rebind a tensor a node uses, in a loop's or branch's body or its flag too."""
        graph = self._graph(g)
        if graph.closed:
            return
        used = used_tensors(graph.nodes)
        # A tensor a node uses, or any (one whose view a node uses moves that view; else refused).
        a = used[old % len(used)] if used and old < 12 else self._tensor(old)
        b = self._like(a, new) if a is not None else None
        if a is None or b is None:
            return
        try:
            graph.rebind({a: b})
        except sg.ScopeGraphError:
            return
        self.trace.append(f"{self._name(graph)}.rebind({{{a.name}: {b.name}}})")

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids, specs=st.lists(op_specs, min_size=1, max_size=3))
    def rerecord(self, g: int, stream: int, specs: list[tuple[str, int, int]]) -> None:
        graph = self._graph(g)
        ops = self._ops(specs)
        if graph.closed or not ops:
            return
        try:
            with CudaGraph.scope(self.streams[stream], into=graph) as s:
                for op in ops:
                    s.record(op)
        except sg.ScopeGraphError:
            return
        self.trace.append(f"record into {self._name(graph)} on S{stream}: {', '.join(map(describe, ops))}")

    @precondition(lambda self: self.graphs)
    @rule(g=picks, stream=stream_ids, old=picks, new=picks)
    def rerecord_same(self, g: int, stream: int, old: int, new: int) -> None:
        """Record a graph's program again into it with one tensor (maybe) replaced: often the same
        topology, taken in place (by node updates where it has loops or branches)."""
        graph = self._graph(g)
        if graph.closed:
            return
        used = used_tensors(graph.nodes)
        a = used[old % len(used)] if used and old < 12 else None  # else the same tensors
        b = self._like(a, new) if a is not None else None

        def sub(t: sg.Tensor) -> sg.Tensor:
            return b if t is a and b is not None else t

        try:
            with CudaGraph.scope(self.streams[stream], into=graph) as s:
                record_again(s, graph.nodes, sub)
        except sg.ScopeGraphError:
            return
        change = f" with {a.name} -> {b.name}" if a is not None and b is not None else ""
        self.trace.append(f"record {self._name(graph)} again into it on S{stream}{change}: {graph.last_update}")

    @rule(t=picks)
    def free(self, t: int) -> None:
        """free() an owner (a view's owner: its views go too), or drop a foreign wrapper."""
        every = self._all()
        i = t % len(every)
        x, root = every[i], self._root(i)
        if x is None or root is None or x.allocation.pins or self.scope is not None:
            return
        if x.allocation.borrowed and not self.drop_wrappers:
            return
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
        for tensors in (self.tensors, self.more):
            for j, y in enumerate(tensors):
                if y is not None and y.allocation is alloc:
                    tensors[j] = None
        if alloc.borrowed:
            self.roots = {k: v for k, v in self.roots.items() if v.allocation is not alloc}
            self.more_roots = [None if r is not None and r.allocation is alloc else r for r in self.more_roots]
            del x, root, alloc, every
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

    @precondition(lambda self: len(self.more) < 10)
    @rule(t=picks, reshape=st.booleans(), start=st.integers(0, 7), rows=st.integers(1, 4))
    def view(self, t: int, reshape: bool, start: int, rows: int) -> None:
        """A view (`t.view((2, -1))`) or a row slice (`t[a:b]`) of a live tensor, as one more tensor."""
        every = self._all()
        i = t % len(every)
        x, root = every[i], self._root(i)
        if x is None or root is None or not x.shape:
            return
        if reshape:
            if x.size % 2:
                return
            v = x.view((2, -1))
            text = f"{x.name}.view((2, -1))"
        else:
            a = start % x.shape[0]
            v = x[a : min(x.shape[0], a + rows)]
            text = f"{x.name}[{a}:{min(x.shape[0], a + rows)}]"
        name = f"V{len(self.more)}"
        v = v.view(v.shape, name=name)
        self.more.append(v)
        self.more_roots.append(root)
        self.trace.append(f"{name} = {text}")

    @precondition(lambda self: not self.froze)
    @rule(t=picks)
    def freeze(self, t: int) -> None:
        """Freeze a tensor (once: frozen memory takes no more writes)."""
        x = self._tensor(t)
        if x is None or x.frozen:
            return
        try:
            x.freeze()
        except sg.ScopeGraphError:  # a live graph writes it
            return
        self.froze = True
        self.trace.append(f"{x.name}.freeze()")

    @rule(
        key=st.integers(0, 3),
        specs=st.lists(op_specs, min_size=1, max_size=2),
        stream=stream_ids,
        hold=st.booleans(),
    )
    def cache_get(self, key: int, specs: list[tuple[str, int, int]], stream: int, hold: bool) -> None:
        """cache.get(key) (maxsize 2, on S1) and a replay of what it returns; the user holds it or not
        (an eviction then closes it)."""
        self.cache_specs.setdefault(key, specs)
        misses = self.cache.misses
        try:
            graph = self.cache.get(key)
        except sg.ScopeGraphError:
            self.trace.append(f"cache.get({key}) refused")
            return
        graph._ordered = True
        how = "miss" if self.cache.misses != misses else "hit"
        self.trace.append(f"cache.get({key}) -> {self._name(graph)} ({how}, {len(graph.nodes)} nodes)")
        self._launch(graph, stream)
        if hold and graph not in self.graphs:
            self._made(graph)
            self.trace.append(f"  {self._name(graph)} = #{graph.id}, held")
        del graph

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
        where = f" into {self._name(graph)}" if graph is not None else ""
        self.trace.append(f"open scope on S{stream}{where}")

    @precondition(lambda self: self.scope is not None)
    @rule(spec=op_specs, body=st.integers(0, 1))
    def record(self, spec: tuple[str, int, int], body: int) -> None:
        """Record an op into the open scope, or into the loop or branch held open in it."""
        op = self._op(spec)
        if op is None:
            return
        where = self.bodies[body % len(self.bodies)] if self.block is not None else self.scope
        try:
            where.record(op)
        except sg.ScopeGraphError:
            return
        self.trace.append(
            f"  {'body ' + str(body % len(self.bodies)) if self.block else 'scope'} records {describe(op)}"
        )

    @precondition(lambda self: self.scope is not None and self.block is None)
    @rule(kind=control_kinds, flag=st.integers(0, 3))
    def open_block(self, kind: str, flag: int) -> None:
        """A loop or branch held open in the open scope while other work goes on."""
        f = self._flag(flag)
        if f is None:
            return
        scope = self.scope
        block = scope.while_(f) if kind == "while" else scope.if_(f) if kind == "if" else scope.if_else(f)
        try:
            entered = block.__enter__()
        except sg.ScopeGraphError:
            return
        self.block = block
        self.bodies = entered if isinstance(entered, tuple) else (entered,)
        self.trace.append(f"  scope opens {kind}({f.name})")

    @precondition(lambda self: self.block is not None)
    @rule(fail=st.booleans())
    def close_block(self, fail: bool) -> None:
        """End the loop or branch held open: recorded, or (its block raised) not."""
        block, self.block, self.bodies = self.block, None, ()
        try:
            if fail:
                block.__exit__(RuntimeError, RuntimeError(), None)
            else:
                block.__exit__(None, None, None)
        except sg.ScopeGraphError:
            self.trace.append("  block exit refused")
            return
        self.trace.append(f"  block {'raised: not recorded' if fail else 'recorded'}")

    @precondition(lambda self: self.scope is not None and self.block is None)
    @rule(control=control_specs)
    def record_control(self, control: ControlSpec) -> None:
        try:
            text = self._record_control(self.scope, control)
        except sg.ScopeGraphError:
            return
        if text is not None:
            self.trace.append(f"  scope records {text}")

    @precondition(lambda self: self.scope is not None)
    @rule()
    def close_scope(self) -> None:
        if self.block is not None:
            self.close_block(False)
        scope, self.scope = self.scope, None
        try:
            scope.__exit__(None, None, None)
        except sg.ScopeGraphError:
            self.trace.append("scope exit refused")
            return
        if scope._into is None:
            self._made(scope.graph)
            self.trace.append(f"{self._name(scope.graph)} = the scope's graph")
        else:
            self.trace.append(f"scope exit (recorded into its graph: {scope.graph.last_update})")

    @invariant()
    def ordered(self) -> None:
        assert not self.problems, "\n".join([*self.problems, "trace:", *self.trace])


def accesses(op: sg.GraphNode) -> list[Access]:
    return [Access(b.alloc.id, b.start, b.end, b.mutable) for b in op.borrows if b.start != b.end]


def replay_accesses(nodes: Sequence[RecordedNode]) -> list[Access]:
    """What a replay touches: every node's op, bodies included, and each loop's or branch's own
    borrows (its flag; a bounded loop's counter) rather than the sum of its bodies'."""
    flat, _ = levels(nodes)
    found: list[Access] = []
    for rec in flat:
        op = rec.op
        borrows = op.own if isinstance(op, ControlNode) else op.borrows
        found += [Access(b.alloc.id, b.start, b.end, b.mutable) for b in borrows if b.start != b.end]
    return found


def executable_ranges(exe: object) -> list[tuple[int, int, bool]]:
    """The byte ranges the host executable's nodes are bound to (the numpy views their thunks
    hold; a loop's or branch's bodies' too), and whether each is written."""
    found: list[tuple[int, int, bool]] = []
    seen: set[int] = set()
    graphs = [exe]
    while graphs:
        g = graphs.pop()
        if id(g) in seen or not isinstance(g, _HostGraph):
            continue
        seen.add(id(g))
        for thunk in g.thunks:
            for cell in getattr(thunk, "__closure__", None) or ():
                value = cell.cell_contents
                if isinstance(value, np.ndarray) and value.nbytes:
                    start = int(value.__array_interface__["data"][0])
                    found.append((start, start + value.nbytes, bool(value.flags.writeable)))
                elif isinstance(value, _HostGraph):
                    graphs.append(value)
    return found


def used_tensors(nodes: Sequence[RecordedNode]) -> list[sg.Tensor]:
    """The tensors a graph's nodes use, bodies and flags included (not a loop's counter)."""
    flat, _ = levels(nodes)
    found: list[sg.Tensor] = []
    for rec in flat:
        op = rec.op
        if isinstance(op, ControlNode):
            found.append(op.flag)
        else:
            found += [b.tensor for b in op.borrows]
    return found


def record_block(
    owner: Any,
    kind: str,
    flag: sg.Tensor,
    bound: int | None,
    then_ops: list[sg.GraphNode],
    else_ops: list[sg.GraphNode],
    inner: tuple[str, sg.Tensor, list[sg.GraphNode]] | None = None,
) -> None:
    """Record ``kind`` ("while", "if", "if_else") on ``flag`` into ``owner`` (a scope or a body),
    with ``inner`` (kind, flag, ops) nested in its (then) body after its ops."""

    def fill(body: Body, ops: list[sg.GraphNode], nested: bool) -> None:
        for op in ops:
            body.record(op)
        if nested and inner is not None:
            record_block(body, inner[0], inner[1], None, inner[2], [])

    if kind == "while":
        with owner.while_(flag, max_iterations=bound) as body:
            fill(body, then_ops, True)
    elif kind == "if":
        with owner.if_(flag) as body:
            fill(body, then_ops, True)
    else:
        with owner.if_else(flag) as (then, otherwise):
            fill(then, then_ops, True)
            fill(otherwise, else_ops, False)


def record_again(owner: Any, nodes: Sequence[RecordedNode], sub: Callable[[sg.Tensor], sg.Tensor]) -> None:
    """Record ``nodes``' program into ``owner`` (a scope or a body), each tensor ``t`` as ``sub(t)``."""
    for rec in nodes:
        op = rec.op
        if isinstance(op, Join):
            continue  # the tracker adds its own
        if isinstance(op, Memcpy):
            owner.record(sg.memcpy(sub(op.dst).mut(), sub(op.src)))
        elif isinstance(op, Memset):
            owner.record(sg.memset(sub(op.dst).mut(), op.value.item()))
        elif isinstance(op, While):
            with owner.while_(sub(op.flag), max_iterations=op.max_iterations) as body:
                record_again(body, op.body.nodes, sub)
        elif isinstance(op, If) and op.otherwise is None:
            with owner.if_(sub(op.flag)) as body:
                record_again(body, op.then.nodes, sub)
        elif isinstance(op, If):
            assert op.otherwise is not None
            with owner.if_else(sub(op.flag)) as (then, otherwise):
                record_again(then, op.then.nodes, sub)
                record_again(otherwise, op.otherwise.nodes, sub)
        else:
            raise AssertionError(f"the model records no {type(op).__name__}")


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


# -- a hole the extended model found: repin (rebind, record into=) kept an allocation the graph no
# longer wrote without handing on its last replay, so the graphs that only read it stopped
# counting it as a sharer (fixed in scopegraph._lifetime.repin) ----------------------------------


def test_a_graph_reading_memory_another_graph_wrote_before_it_was_recorded_again_waits_for_that_replay() -> None:
    """g0 writes A[0:8] (and reads A[8:16]) and replays on S0; recorded again (into=g0) it writes C
    and still reads A[8:16], so it keeps A, now read only. g1 reads A[0:8] and replays on S1: it
    must wait for g0's replay on S0, which may still be writing A[0:8]."""
    assert not run_steps(
        ("build", {"stream": 0, "specs": [("copy", 0, 2)]}),  # g0: A[0:8] <- A[8:16]
        ("launch", {"g": 0, "stream": 0}),
        ("rerecord", {"g": 0, "stream": 0, "specs": [("copy", 4, 2)]}),  # g0: C <- A[8:16]
        ("build", {"stream": 0, "specs": [("copy", 3, 0)]}),  # g1: B <- A[0:8]
        ("launch", {"g": 1, "stream": 1}),
    )


def test_a_graph_reading_memory_another_graph_wrote_before_a_rebind_waits_for_that_replay() -> None:
    """g0 reads A[0:8]; g1 writes A[0:8] (and reads A[8:16]) and replays on S0, then
    g1.rebind({A[0:8]: C}): g1 keeps A, now read only. g0's replay on S1 must still wait for g1's
    replay on S0 (they were sharers until the rebind)."""
    assert not run_steps(
        ("build", {"stream": 0, "specs": [("copy", 3, 0)]}),  # g0: B <- A[0:8]
        ("build", {"stream": 0, "specs": [("copy", 0, 2)]}),  # g1: A[0:8] <- A[8:16]
        ("launch", {"g": 1, "stream": 0}),
        ("rebind", {"g": 1, "old": 0, "new": 3}),  # {A[0:8]: C}
        ("launch", {"g": 0, "stream": 1}),
    )
