"""Programmatic dependent launch: which edges of a graph may be programmatic (DESIGN.md section 7).

A full edge A -> B starts B when A has finished. A *programmatic* edge starts B as soon as every
block of A has executed ``griddepcontrol.launch_dependents`` (or exited), so B's blocks can load
what does not depend on A (weights) while A still runs; B's ``griddepcontrol.wait`` then blocks
until A has finished and its writes are visible. That is only correct when B keeps the PDL
contract, which a kernel declares with ``@sg.kernel(SOURCE, pdl=True, reads_before_wait=(...))``:
every thread waits before it writes memory, before it reads anything but the parameters named in
``reads_before_wait``, and before it exits.

An edge d -> n of a recording is programmatic when

- both ops are launches of ``pdl=True`` kernels (so n waits, and d, which also waits before it
  finishes, has finished only once everything before d has: completion stays transitive along
  chains of programmatic edges, which the tracker's pruned edges rely on), and
- nothing d writes overlaps what n reads before its wait (a weight written by d must be complete
  before n starts loading it).

Every other edge (memcpy, memset, join, loop and non-PDL kernel nodes at either end) stays full.
The scope works this out once per recorded op (``EdgeKinds``; ``RecordedNode.programmatic`` keeps
it); the CUDA backend makes those edges programmatic on sm_90 and later and full below, and the
host backend ignores them. ``CudaGraph.scope(stream, pdl=False)`` records every edge as a full one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ._errors import SignatureError, diagnostic
from ._kernel import KernelLaunch
from ._tracker import without_implied

if TYPE_CHECKING:
    from ._borrow import Borrow
    from ._ops import GraphNode
    from ._scope import RecordedNode

NONE: frozenset[int] = frozenset()


class EdgeKinds:
    """Which edges into the ops of one recording (a scope, or a loop or branch body) may be
    programmatic, worked out as each op is recorded. ``full`` holds the indices of the nodes
    every edge out of which is full (anything but a launch of a ``pdl=True`` kernel), so a chain
    of PDL kernels costs one set test per op however many predecessors it has."""

    __slots__ = ("full", "written")

    def __init__(self, order: str) -> None:
        self.full: set[int] = set()
        # In program order an op's one predecessor is the op recorded before it, not the writer of
        # what it loads before its wait, which may be any earlier node. So the memory regions the
        # recording has written so far are kept (None in dataflow order, where the writer is a
        # direct predecessor), and an op that loads any of them early gets full edges: its
        # predecessor has then finished, and so has everything before it.
        self.written: set[object] | None = set() if order == "program" else None

    def join(self, index: int) -> None:
        """The tracker made node ``index`` a join: not a kernel, so its edges out are full."""
        self.full.add(index)

    def clear(self) -> None:
        """The recording is over: its node indices and regions are of no use now."""
        self.full.clear()
        if self.written is not None:
            self.written.clear()

    def of(self, op: GraphNode, deps: frozenset[int], nodes: Sequence[RecordedNode]) -> frozenset[int]:
        """The subset of ``deps`` (indices into ``nodes``) whose edges into ``op``, recorded as node
        ``len(nodes)``, may be programmatic."""
        written = self.written
        if written is not None:
            loads_written = _loads_early(op, written)
            for b in op.borrows:
                if b.mutable:
                    written.add(b.alloc.region)
            if loads_written:
                return NONE
        if type(op) is not KernelLaunch or not op.kernel.pdl:
            self.full.add(len(nodes))
            return NONE
        early = op.kernel.reads_before_wait
        full = self.full
        if not early:
            if full.isdisjoint(deps):
                return deps  # every edge (the common case in a chain of PDL kernels): no new set
            chosen = [d for d in deps if d not in full]
        else:
            loads = [b for b in op.borrows if b.param in early]
            chosen = [d for d in deps if d not in full and _overlapping_write(nodes[d].op, loads) is None]
        if len(chosen) == len(deps):
            return deps
        return frozenset(chosen) if chosen else NONE


def _loads_early(op: GraphNode, regions: set[object]) -> bool:
    """Whether ``op`` loads, before its wait, memory in ``regions``."""
    if type(op) is not KernelLaunch or not op.kernel.pdl or not op.kernel.reads_before_wait:
        return False
    names = op.kernel.reads_before_wait
    return any(b.param in names and b.alloc.region in regions for b in op.borrows)


def early_load_of(op: GraphNode, before: GraphNode) -> Borrow | None:
    """The borrow that ``op`` loads before its wait and ``before`` writes, if any. Then ``op`` must
    not start until ``before`` has finished: its edge from ``before`` stays a full, direct one."""
    if type(op) is not KernelLaunch or not op.kernel.pdl or not op.kernel.reads_before_wait:
        return None
    names = op.kernel.reads_before_wait
    return _overlapping_write(before, [b for b in op.borrows if b.param in names])


def _overlapping_write(before: GraphNode, loads: list[Borrow]) -> Borrow | None:
    """The first of ``loads`` that ``before`` writes a byte of, if any."""
    for e in loads:
        for w in before.borrows:
            if w.mutable and w.overlaps(e):
                return e
    return None


def executable_deps(nodes: Sequence[RecordedNode]) -> list[frozenset[int]]:
    """Each node's predecessors in the executable graph: its deps less the implied ones
    (``without_implied``), keeping an implied edge into a node that loads, before its wait, what
    the earlier node writes."""
    return without_implied([n.deps for n in nodes], lambda n, d: early_load_of(nodes[n].op, nodes[d].op) is not None)


def check_programmatic(
    graph_id: int,
    nodes: Sequence[RecordedNode],
    changes: Mapping[int, GraphNode],
    ancestors: Sequence[int],
    direct: Sequence[frozenset[int]],
) -> None:
    """A rebind keeps the graph's edges (``direct``: as the backend built them), so it must not make
    a node load, before its wait, memory that an earlier node writes unless that node has finished
    whenever the loading node starts. A node starts once its full predecessors have finished and
    its programmatic ones have started, so the writer must be (an ancestor of) a full predecessor
    of the node or, recursively, of a programmatic one. ``ancestors[i]`` is node i's ancestor bit
    set. Checked on every backend (what the host accepts, a GPU runs); linear in the graph's
    borrows plus the pairs it finds."""
    if not changes or not any(n.programmatic for n in nodes):
        return  # only full edges: every node starts after all its ancestors have finished
    ops = {i: changes.get(i, n.op) for i, n in enumerate(nodes)}
    # Who writes and who loads early, by memory region (wrappers of one memory share a region).
    writers: dict[object, list[int]] = defaultdict(list)
    loaders: dict[object, list[int]] = defaultdict(list)
    for i, op in ops.items():
        names = op.kernel.reads_before_wait if type(op) is KernelLaunch and op.kernel.pdl else NO_NAMES
        for b in op.borrows:
            if b.mutable:
                writers[b.alloc.region].append(i)
            elif b.param in names:
                loaders[b.alloc.region].append(i)
    pairs: set[tuple[int, int]] = set()  # (n, d): n may load early what d, earlier, writes
    for c in changes:
        for b in ops[c].borrows:
            region = b.alloc.region
            if c in loaders.get(region, ()):
                pairs.update((c, d) for d in writers.get(region, ()) if d < c)
            if b.mutable:
                pairs.update((n, c) for n in loaders.get(region, ()) if n > c)
    for n, d in sorted(pairs):
        early = early_load_of(ops[n], ops[d])
        if early is not None and not _finished_before_start(d, n, nodes, ancestors, direct):
            raise _rebind_error(graph_id, n, ops[n], d, ops[d], early, d in nodes[n].programmatic)


def _finished_before_start(
    d: int, n: int, nodes: Sequence[RecordedNode], ancestors: Sequence[int], direct: Sequence[frozenset[int]]
) -> bool:
    """Has node d always finished when node n starts? Walks n's programmatic predecessors back
    (each starts only once its own full predecessors have finished) until a full edge from d or
    from a node d precedes."""
    todo, seen = [n], {n}
    while todo:
        x = todo.pop()
        programmatic = nodes[x].programmatic
        for p in direct[x]:
            if p not in programmatic:
                if p == d or (ancestors[p] >> d) & 1:
                    return True
            elif p > d and p not in seen:  # p may still run; what has finished before p starts has before x
                seen.add(p)
                todo.append(p)
    return False


NO_NAMES: frozenset[str] = frozenset()


def _rebind_error(
    graph_id: int, index: int, op: GraphNode, d: int, before: GraphNode, early: Borrow, programmatic: bool
) -> SignatureError:
    return SignatureError(
        diagnostic(
            f"cannot rebind graph #{graph_id}: node {index} (`{op.name}`) would load `{early.tensor.name}` "
            f"before it waits, while node {d} (`{before.name}`) writes it",
            [
                f"the edge {d} -> {index} is programmatic: node {index} starts while node {d} runs"
                if programmatic
                else f"node {index} may start while node {d} runs: every path from {d} ends in programmatic edges",
                f"`{early.param}` is read before griddepcontrol.wait (reads_before_wait)",
                "checked on every backend: the host and GPUs below sm_90 make no edge programmatic, "
                "but what they accept must run on an sm_90 GPU",
            ],
            help="record the graph again with the new tensors (or with CudaGraph.scope(stream, pdl=False))",
        )
    )
