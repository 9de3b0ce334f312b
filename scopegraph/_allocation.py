"""Allocations and memory identity.

An :class:`Allocation` is one block of memory a tensor lives in: memory scopegraph allocated
(owned) or another library's memory it wraps (borrowed: DLPack, ``__cuda_array_interface__``,
numpy). Identity is memory, not wrappers: every borrow and every dependency is a range of
*device addresses* (``alloc.address + offset``), so two wrappers of the same torch tensor, or of
overlapping views of it, conflict exactly where their bytes overlap.

Each device keeps a :class:`MemoryMap` of live allocations, grouped into *regions*: maximal sets of
allocations whose address ranges overlap. A scopegraph allocation is a region of its own; foreign
wrappers of one buffer share a region. Rules that concern memory rather than one wrapper (frozen
bytes, graphs that write a range) consult the allocation's region, so they hold whichever wrapper
the user passes. Frozen ranges are kept by the region itself, not by the wrapper that froze them:
dropping that wrapper unfreezes nothing while another wrapper of the bytes lives. The region
lookup is an interval search over a ``SortedDict`` of disjoint regions, made once when an
allocation is created, never on the record path.

A region's span (and its frozen ranges) can outlive the members that made it: when a wrapper is
released its region keeps them (and is marked ``stale``), since releases arrive from finalizers at
any point of any code and must never change another allocation's ``region`` there. The next registration that touches a
stale region, and the next reader of a stale region's members (``aliases()``: pins, eager work,
updates), first split it into the connected groups of its live members (under the map's lock,
where merges change regions too), so a wrapper is grouped only with wrappers whose bytes it
overlaps through live members, never with one that a dropped wrapper once bridged to. Splitting keeps every
pair of overlapping live allocations in one region: it refuses nothing that overlaps. Each group
keeps the frozen bytes within its span: bytes that only dropped wrappers covered are frozen memory
no longer (a wrapper made there later starts writable), the others stay frozen.

Who owns what: an owned allocation's storage (a cuda.core ``Buffer`` or a numpy array) is released
by ``_lifetime`` once the allocation is freed or collected *and* the GPU work that used it has
finished. Borrowed storage is never freed by scopegraph; the foreign object is kept alive until
the same point.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from sortedcontainers import SortedDict

from ._errors import BorrowError, LifetimeError
from ._intervals import overlapping
from ._lifetime import MANY_USERS

if TYPE_CHECKING:
    from ._device import Device
    from ._lifetime import Pin
    from ._tensor import Tensor

_allocation_ids = itertools.count(1)


class Region:
    """Live allocations whose address ranges overlap (transitively), the span they cover, and the
    bytes in it that are frozen."""

    __slots__ = ("end", "frozen", "members", "stale", "start")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        # allocation id -> weak reference: the map must not keep wrappers alive.
        self.members: dict[int, weakref.ref[Allocation]] = {}
        # Absolute address ranges made read-only by Tensor.freeze() through any member. The
        # memory's, not the freezing wrapper's: they stay while the region lives (see _split).
        # Empty (false) for most regions: the frozen checks on the op paths test that first.
        self.frozen: list[tuple[int, int]] = []
        # A member was released since the span was computed: the span may cover no live member's
        # bytes, or bridge groups that no longer overlap (split on the next registration).
        self.stale = False

    def allocations(self) -> list[Allocation]:
        # A copy first: another thread's release (or a finalizer) may pop a member meanwhile.
        return [a for ref in tuple(self.members.values()) if (a := ref()) is not None]


class MemoryMap:
    """One device's live allocations by address, as disjoint regions (see the module docstring)."""

    def __init__(self) -> None:
        self._regions: SortedDict[int, Region] = SortedDict()
        self._lock = threading.Lock()
        # Releases reported by finalizers, applied under the lock by the next register. A
        # finalizer may run inside register (garbage collection), so it must never take the lock.
        self._released: collections.deque[tuple[int, int]] = collections.deque()

    def register(self, alloc: Allocation) -> None:
        start, end = alloc.address, alloc.address + alloc.nbytes
        if start == end:
            return  # an empty range overlaps nothing: the allocation keeps its private region
        with self._lock:
            self._apply_releases()
            regions = self._regions
            touching = overlapping(regions, start, end)
            if any(r.stale for r in touching):
                for r in touching:
                    if r.stale:
                        self._split(r)
                touching = overlapping(regions, start, end)
            if not touching:
                region = alloc.region
                region.start, region.end = start, end
            else:
                region = Region(min(start, touching[0].start), max(end, touching[-1].end))
                for old in touching:
                    del regions[old.start]
                    # Before its members move: a reader without the lock sees their frozen bytes in
                    # either region.
                    region.frozen += old.frozen
                    for member in old.allocations():
                        member.region = region
                        region.members[member.id] = weakref.ref(member)
                alloc.region = region  # new: nothing frozen through it yet
            region.members[alloc.id] = weakref.ref(alloc)
            regions[region.start] = region

    def _split(self, region: Region) -> None:
        """Replace a stale region by the connected groups of its live members (under the lock)."""
        del self._regions[region.start]
        groups: list[tuple[Region, list[Allocation]]] = []
        for member in sorted(region.allocations(), key=lambda a: a.address):
            start, end = member.address, member.address + member.nbytes
            if not groups or start >= groups[-1][0].end:  # overlap as register() sees it: a shared byte
                groups.append((Region(start, end), []))
            group, members = groups[-1]
            group.end = max(group.end, end)
            group.members[member.id] = weakref.ref(member)
            members.append(member)
        for group, members in groups:
            # The frozen bytes that live members still cover (see the module docstring), set
            # before the members move to the group: a reader without the lock never sees them unfrozen.
            group.frozen = [
                (max(s, group.start), min(e, group.end)) for s, e in region.frozen if s < group.end and group.start < e
            ]
            self._regions[group.start] = group
            for member in members:
                member.region = group

    def refresh(self, region: Region) -> None:
        """Split ``region`` if it is stale (see the module docstring), under the lock: for readers of
        a region's members, so that a dropped wrapper bridges no two live ones there either. Only
        if the lock is free: a reader may run inside register() (a finalizer or __del__ during
        garbage collection there), and a region left whole is only over-cautious."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._apply_releases()
            if region.stale and self._regions.get(region.start) is region:
                self._split(region)
        finally:
            self._lock.release()

    def freeze(self, alloc: Allocation, start: int, end: int) -> int:
        """Make [start, end) of ``alloc``'s memory read-only, unless a writable zero-copy export
        of any of it is alive (another library may write through it): returns how many are (0:
        frozen). Under the lock, where register() and splits move frozen ranges between regions,
        and EXPORTS inside it, where exports are made and checked (``Export``; a finalizer that
        drops one takes only EXPORTS, so it may run inside register without a deadlock)."""
        with self._lock, EXPORTS:
            exported = sum(1 for a in alloc.aliases() for s, e in tuple(a.writable_exports) if s < end and start < e)
            if exported:
                return exported
            frozen = alloc.region.frozen
            # A range already frozen is not added again: the list lives as long as the memory's
            # wrappers do, and a program may freeze a fresh wrapper of its weights every step.
            if not any(s <= start and end <= e for s, e in frozen):
                frozen.append((start, end))
            return 0

    def unregister(self, address: int, alloc_id: int) -> None:
        """Called when an allocation is released (it may already be garbage, so by id and address).
        Its frozen bytes stay frozen while another member covers them (see the module docstring)."""
        self._released.append((address, alloc_id))
        if self._lock.acquire(blocking=False):
            try:
                self._apply_releases()
            finally:
                self._lock.release()

    def _apply_releases(self) -> None:
        regions = self._regions
        while self._released:
            address, alloc_id = self._released.popleft()
            i = regions.bisect_right(address) - 1
            if i < 0:
                continue
            region = regions.peekitem(i)[1]
            if region.members.pop(alloc_id, None) is None:
                continue
            if not region.members:
                del regions[region.start]
            else:
                region.stale = True  # its span may now bridge members that do not overlap

    def __len__(self) -> int:
        return len(self._regions)


class Export:
    """What a zero-copy DLPack export of an allocation holds on to (the exported buffer's owner),
    for as long as the other library's array lives: it keeps the allocation alive and counts it
    in ``exports``, so that free() can refuse to release memory that array still aliases; and
    the absolute byte range of a writable export in ``writable_exports``, so that freeze() can
    refuse to freeze memory that array may still write."""

    __slots__ = ("alloc", "writes")

    def __init__(self, alloc: Allocation, writes: tuple[int, int] | None) -> None:
        with EXPORTS:  # Tensor.free() and freeze() check the exports under it too
            if alloc.freed:
                raise LifetimeError(
                    f"cannot export allocation `{alloc.label}`: it was freed meanwhile\n"
                    "help: export it before another thread frees it"
                )
            if writes is not None and alloc.frozen_overlap(*writes) is not None:
                raise BorrowError(
                    f"cannot export allocation `{alloc.label}` writable: it was frozen meanwhile\n"
                    "help: export it again (an export of frozen memory is read-only)"
                )
            alloc.exports += 1
            if writes is not None:
                alloc.writable_exports.append(writes)
        self.alloc = alloc
        self.writes = writes

    @classmethod
    def of(cls, tensor: Tensor, writable: bool) -> Export:
        """The export of ``tensor``'s bytes (``writable``: not frozen when the export began)."""
        alloc = tensor.allocation
        start = alloc.address + tensor.offset
        return cls(alloc, (start, start + tensor.nbytes) if writable else None)

    def __del__(self) -> None:
        if hasattr(self, "alloc"):  # not one whose __init__ refused
            with EXPORTS:
                self.alloc.exports -= 1
                if self.writes is not None:
                    self.alloc.writable_exports.remove(self.writes)


EXPORTS = threading.RLock()  # re-entrant: a collection may run __del__ inside __init__


class Allocation:
    """One block of device (or host-backend) memory and the bookkeeping the ownership rules need."""

    __slots__ = (
        "__weakref__",
        "address",
        "borrowed",
        "closed_replays",
        "device",
        "exports",
        "freed",
        "id",
        "look_at",
        "name",
        "nbytes",
        "pins",
        "region",
        "release",
        "storage",
        "users",
        "writable_exports",
    )

    def __init__(
        self, device: Device, nbytes: int, storage: object, address: int, name: str | None, borrowed: bool
    ) -> None:
        self.id: Final = next(_allocation_ids)
        self.device: Final = device
        # The device address of byte 0: borrows and dependencies are ranges of addresses.
        self.address: Final = address
        self.nbytes: Final = nbytes
        # Backend-specific: a numpy uint8 array on the host backend, a cuda.core Buffer on CUDA.
        self.storage: object = storage
        self.name = name
        self.borrowed: Final = borrowed
        self.freed = False
        # Holder id -> the graph or open scope that pins this allocation (see _lifetime.Pin).
        self.pins: dict[int, Pin] = {}
        self.region = Region(address, address + nbytes)
        # What ran work on this memory, its release waits for it (_lifetime): the native streams
        # of eager work, and marks (events) of the replays of graphs that let it go; those whose
        # work has finished are dropped now and then (_lifetime.let_finished_users_go, hand_on).
        self.users: set[object] = set()
        # How many users an eager use may leave before it drops those whose work has finished.
        self.look_at = MANY_USERS
        # A mark of the last replay of each graph released since it pinned this memory (on CUDA
        # an event; its stream while a capture forbids events), with the streams whose eager work
        # has waited for that replay (_lifetime.note_eager_use); passed marks are dropped. Replaced
        # whole (under _lifetime.PENDING), never changed in place: readers iterate what they found.
        self.closed_replays: dict[object, set[object]] | None = None
        # Set by _lifetime.track: releases the storage once the GPU is done with it. Idempotent.
        self.release: Callable[[], object] | None = None
        # Zero-copy exports (DLPack) another library still holds: free() is refused meanwhile.
        self.exports = 0
        self.writable_exports: list[tuple[int, int]] = []  # their absolute byte ranges (see Export)

    @property
    def label(self) -> str:
        return self.name or f"#{self.id}"

    def frozen_overlap(self, start: int, end: int) -> tuple[int, int] | None:
        """A frozen range of this allocation's region that overlaps [start, end), if any."""
        if start < end:
            for s, e in self.region.frozen:
                if s < end and start < e:
                    return s, e
        return None

    def aliases(self) -> list[Allocation]:
        """Every live allocation whose memory may overlap this one's (itself included)."""
        if self.region.stale:
            self.device.memory.refresh(self.region)
        found = self.region.allocations()
        return found if found else [self]
