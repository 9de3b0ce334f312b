"""Dependency tracking: which earlier ops each recorded op must wait for.

The in-op ownership rules live in ``_borrow``; this module orders ops *between* each other, by
the device-address ranges they read and write:

- read after write: a read waits for the last writer of every byte it reads;
- write after read: a write waits for the readers of its bytes since their last write;
- write after write: a write waits for the last writer of its bytes, unless it waits for a
  reader of them (every such reader already waits for that writer, so the edge is redundant).

State is a *segment map*: a ``SortedDict`` from start address to :class:`_Segment`, disjoint
ranges each with its last writer and the readers since. An op that touches a range splits at
most two segments and visits only the segments inside the range, so recording costs
O(log n + k) for k segments touched, never a scan of earlier ops. Accesses to exactly one whole
segment (the common case: an op that uses whole tensors) are plain dict hits, and so is a
recording's first touch of an allocation that shares its memory with no other (most tensors of a
program): its segment waits in a plain dict until an interval lookup needs the sorted map.

Readers are a persistent linked list, so splitting a segment shares its readers for free. When
a second write must wait for more than :data:`JOIN_THRESHOLD` readers of one list (the first
waits for each of them), the tracker adds a *join* node that waits for them, remembers it on the
list, and later writes to any piece of that memory wait for the join alone: many readers meeting
many writes cost one join node and one edge per reader, not one edge per reader per write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sortedcontainers import SortedDict

from ._borrow import Borrow
from ._intervals import overlapping

# A second write that must wait for more readers than this (the same ones as an earlier write:
# pieces of memory they read) waits for a join node instead. The first write waits for each reader
# itself, so a program with one write after its readers sees only its own ops in graph.nodes, with
# the write's edges to its readers (DESIGN section 4).
JOIN_THRESHOLD = 8


class _Readers:
    """A reader node and the readers before it (shared between segments split from one)."""

    __slots__ = ("join", "node", "rest", "walked")

    def __init__(self, node: int, rest: _Readers | None) -> None:
        self.node = node
        self.rest = rest
        # A join node that waits for this reader and every one behind it, once one is made.
        self.join = -1
        # Whether a write already waited for these readers one by one (the next one makes the join).
        self.walked = False


class _Segment:
    __slots__ = ("end", "readers", "writer")

    def __init__(self, end: int, writer: int, readers: _Readers | None) -> None:
        self.end = end
        self.writer = writer  # -1: not written in this scope
        self.readers = readers


def _read_by(seg: _Segment, node: int) -> None:
    """``node`` reads ``seg``: one entry per op, however often it reads the segment (add() has
    the same test inline, on its hot path)."""
    if seg.readers is None or seg.readers.node != node:
        seg.readers = _Readers(node, seg.readers)


class DataflowTracker:
    """Computes each op's predecessors from what it reads and writes.

    The tracker numbers nodes itself: ``add`` gives the op the next index, and a join it needs
    first is announced with ``add_join(index, deps)``, so the caller appends nodes in the order
    the tracker numbers them.
    """

    def __init__(self, add_join: Callable[[int, frozenset[int]], None]) -> None:
        self._segments: SortedDict[int, _Segment] = SortedDict()
        self._add_join = add_join
        self.count = 0
        # The allocations (ids) that this recording has touched. Bytes of any other allocation
        # that shares its memory with none (a region of one member) have no segment yet: every
        # allocation is registered in the memory map, which puts allocations whose bytes overlap
        # in one region, and every allocation a recording touched stays alive while it records
        # (the scope pins it), so no later allocation can overlap it unless both share a region.
        # (A loop or branch body whose block raised unpins what it touched, but its tracker goes
        # with it: this one never saw those borrows.)
        self._seen: set[int] = set()
        # Segments made by such first touches, by start: a plain dict, no sorted insertion (most
        # tensors of a program, weights and per-layer activations, are touched once or twice, and
        # as a whole). They join the sorted map (`_settle`) before any interval lookup.
        self._lone: dict[int, _Segment] = {}

    def add(self, borrows: Sequence[Borrow]) -> frozenset[int]:
        deps: set[int] = set()
        segments = self._segments
        lone = self._lone
        seen = self._seen
        # Accesses to exactly one whole segment (the common case, inlined) are noted (`reads`,
        # `writes`) and updated in place once the deps are known; first touches make new lone
        # segments; the rest (`ranged`) split segments, so they are redone from scratch last.
        reads: list[_Segment] = []
        writes: list[_Segment] = []
        first: list[Borrow] | None = None
        ranged: list[Borrow] | None = None
        for b in borrows:
            start, end = b.start, b.end
            if start == end:
                continue
            seg = lone.get(start)
            if seg is None:
                seg = segments.get(start)
            if seg is None:
                alloc = b.alloc
                if alloc.id not in seen:
                    seen.add(alloc.id)  # (so another borrow of it in this op takes the ranged path)
                    if len(alloc.region.members) == 1:
                        if first is None:
                            first = [b]
                        else:
                            first.append(b)
                        continue
            elif seg.end == end:
                if not b.mutable:
                    if seg.writer >= 0:
                        deps.add(seg.writer)
                    reads.append(seg)
                    continue
                writes.append(seg)
                readers = seg.readers
                if readers is None:
                    if seg.writer >= 0:
                        deps.add(seg.writer)
                elif readers.rest is None and readers.join < 0:
                    deps.add(readers.node)
                else:
                    self._wait_for_readers(readers, deps)
                continue
            if ranged is None:
                ranged = [b]
            else:
                ranged.append(b)
            if lone:
                self._settle()
            touched = overlapping(segments, start, end)
            if b.mutable:
                for seg in touched:
                    if seg.readers is not None:
                        self._wait_for_readers(seg.readers, deps)
                    elif seg.writer >= 0:
                        deps.add(seg.writer)
            else:
                for seg in touched:
                    if seg.writer >= 0:
                        deps.add(seg.writer)
        node = self.count
        self.count = node + 1
        for seg in reads:  # before any split
            if seg.readers is None or seg.readers.node != node:  # one read per segment and op
                seg.readers = _Readers(node, seg.readers)
        for seg in writes:
            seg.writer, seg.readers = node, None
        if first is not None:  # before the ranged accesses, which may split them
            for b in first:
                lone[b.start] = _Segment(b.end, node, None) if b.mutable else _Segment(b.end, -1, _Readers(node, None))
        if ranged is not None:
            if lone:
                self._settle()  # a first touch of this op may share its memory
            for b in ranged:
                self._write(b.start, b.end, node) if b.mutable else self._read(b.start, b.end, node)
        return frozenset(deps)

    def _settle(self) -> None:
        """Move the lone segments into the sorted map, where interval lookups find them: each
        segment is inserted once, as it would have been on its first touch."""
        self._segments.update(self._lone)
        self._lone.clear()

    def _wait_for_readers(self, readers: _Readers, deps: set[int]) -> None:
        head: _Readers | None = readers
        collected: list[int] = []
        while head is not None:
            if head.join >= 0:
                collected.append(head.join)
                break
            collected.append(head.node)
            head = head.rest
        if len(collected) > JOIN_THRESHOLD and not readers.walked:
            readers.walked = True
            deps.update(collected)
        elif len(collected) > JOIN_THRESHOLD:
            join = self.count
            self.count += 1
            self._add_join(join, frozenset(collected))
            readers.join = join
            deps.add(join)
        else:
            deps.update(collected)

    # -- updates -----------------------------------------------------------------------------

    def _split(self, at: int) -> None:
        """Make ``at`` a segment boundary if a segment straddles it."""
        segments = self._segments
        if at in segments:
            return
        i = segments.bisect_right(at) - 1
        if i < 0:
            return
        _, seg = segments.peekitem(i)
        if seg.end > at:
            segments[at] = _Segment(seg.end, seg.writer, seg.readers)
            seg.end = at

    def _write(self, start: int, end: int, node: int) -> None:
        segments = self._segments
        exact = segments.get(start)
        if exact is not None and exact.end == end:
            exact.writer, exact.readers = node, None
            return
        self._split(start)
        self._split(end)
        for k in list(segments.irange(start, end, inclusive=(True, False))):
            del segments[k]
        segments[start] = _Segment(end, node, None)

    def _read(self, start: int, end: int, node: int) -> None:
        segments = self._segments
        exact = segments.get(start)
        if exact is not None and exact.end == end:
            _read_by(exact, node)
            return
        self._split(start)
        self._split(end)
        cursor = start
        gaps: list[tuple[int, int]] = []
        for k in segments.irange(start, end, inclusive=(True, False)):
            seg = segments[k]
            if k > cursor:
                gaps.append((cursor, k))
            _read_by(seg, node)
            cursor = seg.end
        if cursor < end:
            gaps.append((cursor, end))
        for gap_start, gap_end in gaps:
            segments[gap_start] = _Segment(gap_end, -1, _Readers(node, None))


def without_implied(deps: Sequence[frozenset[int]], keep: Callable[[int, int], bool]) -> list[frozenset[int]]:
    """Each node's deps less the edges that other edges imply, for the executable graph.

    When node n waits for two nodes of one *chain* (a path of nodes that each wait for exactly
    the node before them), waiting for the later one is enough: it finishes only after the earlier
    one has (a PDL kernel finishes only after its wait, so this holds along programmatic edges
    too). A read-modify-write chain such as ``h = norm(x); a = W1 @ h; b = W2 @ a; x += b`` has
    write-after-read edges that skip back over the chain; left out, the graph is a plain chain,
    which matters for programmatic launch (a kernel with two programmatic predecessors starts
    late). ``keep(n, d)`` keeps an implied edge d -> n that n needs itself (n loads d's output
    before its wait). One pass, O(1) per edge: each node knows its chain and its place on it.
    The recorded deps (``RecordedNode.deps``, ``graph.edges``) stay as the tracker found them."""
    chain: list[int] = []  # per node: the chain it is on (the index of the chain's first node)
    place: list[int] = []  # per node: its place on that chain
    tip: list[int] = []  # per chain (by its first node): its last node, the only one it may grow from
    out: list[frozenset[int]] = []
    for n, ds in enumerate(deps):
        if len(ds) > 1:
            latest: dict[int, int] = {}
            for d in ds:
                other = latest.get(chain[d])
                if other is None or place[d] > place[other]:
                    latest[chain[d]] = d
            if len(latest) < len(ds):
                ds = frozenset(d for d in ds if latest[chain[d]] == d or keep(n, d))
        out.append(ds)
        tip.append(n)
        if len(ds) == 1:
            (p,) = ds
            if tip[chain[p]] == p:  # grows only from its last node: a chain is one path
                chain.append(chain[p])
                place.append(place[p] + 1)
                tip[chain[p]] = n
                continue
        chain.append(n)
        place.append(0)
    return out


class ProgramOrderTracker:
    """Chains every op after the one recorded before it."""

    def __init__(self, add_join: Callable[[int, frozenset[int]], None]) -> None:
        self.count = 0

    def add(self, borrows: Sequence[Borrow]) -> frozenset[int]:
        node = self.count
        self.count += 1
        return frozenset((node - 1,)) if node else frozenset()


ORDERS: dict[str, type[DataflowTracker] | type[ProgramOrderTracker]] = {
    "dataflow": DataflowTracker,
    "program": ProgramOrderTracker,
}
