"""Dependency tracking: which earlier ops each recorded op must wait for.

The in-op ownership rules live with the borrows (``_tensor.check_borrows``); this module orders
ops *between* each other, from their read and write sets:

- read after write: a read waits for the last writers of the bytes it reads;
- write after read: a write waits for the readers since the last write of its bytes;
- write after write: a write waits for the last writers of its bytes, unless it already waits
  for a reader that waits for that writer (the edge would be redundant).

Per allocation it keeps only the accesses still visible: a write that covers earlier accesses
retires them, since anything later that touches those bytes waits for the covering write.
So ``add`` costs a few list scans over live accesses of the touched allocations, never a scan
over every earlier op.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._tensor import Borrow


class _Accesses:
    """The live reads and writes of one allocation: lists of (start, end, node index)."""

    __slots__ = ("reads", "writes")

    def __init__(self) -> None:
        self.reads: list[tuple[int, int, int]] = []
        self.writes: list[tuple[int, int, int]] = []


class DataflowTracker:
    """Computes each op's predecessors from what it reads and writes."""

    def __init__(self) -> None:
        self._by_alloc: dict[int, _Accesses] = {}
        self._deps: list[frozenset[int]] = []

    def add(self, borrows: Sequence[Borrow]) -> frozenset[int]:
        node = len(self._deps)
        deps: set[int] = set()
        by_alloc = self._by_alloc
        for b in borrows:
            acc = by_alloc.get(b.alloc.id)
            if acc is None:
                continue
            start, end = b.start, b.end
            if not b.mutable:
                for s, e, n in acc.writes:
                    if s < end and start < e:
                        deps.add(n)
                continue
            readers = [n for s, e, n in acc.reads if s < end and start < e]
            deps.update(readers)
            for s, e, n in acc.writes:
                if s < end and start < e and not any(n in self._deps[r] for r in readers):
                    deps.add(n)
        for b in borrows:
            acc = by_alloc.get(b.alloc.id)
            if acc is None:
                acc = by_alloc[b.alloc.id] = _Accesses()
            start, end = b.start, b.end
            if b.mutable:
                acc.reads = [a for a in acc.reads if not (start <= a[0] and a[1] <= end)]
                acc.writes = [a for a in acc.writes if not (start <= a[0] and a[1] <= end)]
                acc.writes.append((start, end, node))
            else:
                acc.reads.append((start, end, node))
        frozen = frozenset(deps)
        self._deps.append(frozen)
        return frozen


class ProgramOrderTracker:
    """Chains every op after the one recorded before it."""

    def __init__(self) -> None:
        self._count = 0

    def add(self, borrows: Sequence[Borrow]) -> frozenset[int]:
        node = self._count
        self._count += 1
        return frozenset((node - 1,)) if node else frozenset()


def make_tracker(order: str) -> DataflowTracker | ProgramOrderTracker:
    if order == "dataflow":
        return DataflowTracker()
    if order == "program":
        return ProgramOrderTracker()
    from ._errors import SignatureError

    raise SignatureError(f'order={order!r} is not an ordering\nhelp: use order="dataflow" (default) or order="program"')
