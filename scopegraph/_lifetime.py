"""Lifetimes: pins (Python lifetime) and device lifetime, the whole policy in one place.

Two rules keep memory valid while the GPU uses it:

1. **Pins.** A graph, and a scope while it records, *pins* every allocation its ops touch: the
   :class:`Pin` is listed in ``alloc.pins``, the graph holds the tensors (so dropping the user's
   names frees nothing) and ``free()`` is refused. ``graph.close()``, or collection of the graph,
   unpins.
2. **Device lifetime.** Memory goes back to the pool only after every piece of GPU work that used
   it has finished. Each allocation records what ran work on it
   (``alloc.users``: the streams of eager ops, and at unpin marks of its graphs' replays:
   events, which let the streams go; see :class:`ReplayMarks`); those whose work has finished
   are dropped now and then (passed marks; and idle streams the program dropped, by eager use
   only: :func:`let_finished_users_go`), so memory used on many streams does not keep them all
   alive. Its
   release (:func:`track`: on ``free()``, or when the allocation is collected) hands the storage
   to the backend's ``retire``, which orders the free after that work with events and
   stream-ordered deallocation. Nothing synchronises the device.

Ordering between streams is kept here too (:func:`order_replay`): a replay waits for eager work
on the graph's memory from other streams since its last replay (``graph.update`` included), for
its own previous replay when it moves to another stream, so a graph never overlaps itself, and
for the last replay of every other graph that shares memory with it where either one writes
(a prefill graph on one stream, a decode graph reading its cache on another);
eager work (``graph.update`` included) waits for the last replay of each graph that pins its
memory when that replay ran on another stream (:func:`note_eager_use`).
The host backend runs work synchronously, so it keeps no stream bookkeeping at all.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._allocation import Allocation, MemoryMap
    from ._backends._base import Backend
    from ._borrow import Borrow


class Pin:
    """What one graph or open scope holds on the allocations it uses.

    ``writes`` lists the absolute ranges it writes, flat (``freeze()`` is refused on them, and so is
    ``numpy()`` while ``recording``: an open scope's writes have not run yet), and ``written``, for
    a graph's pin, the ids of the allocations they are in (which graphs' replays must be ordered:
    ``sharers``);
    ``pending`` the streams that ran eager work on its memory since its last replay, and marks of
    the replays of graphs that let go of memory it holds (``ReplayMarks``);
    ``replayed_on`` every stream it was replayed on (when it lets memory go, the memory keeps marks
    of those replays);
    ``last_stream`` the stream of its last replay, and ``caught_up`` the streams made to wait for
    that replay since (eager work on its memory comes after it).
    """

    __slots__ = (
        "allocations",
        "caught_up",
        "description",
        "last_stream",
        "pending",
        "recorder",
        "recording",
        "replayed_on",
        "sharers",
        "sharers_made",
        "writes",
        "written",
    )

    def __init__(self, description: str, recording: bool = False) -> None:
        self.description = description
        self.recording = recording  # an open scope's: the graph that takes it over clears it
        # While recording: the one thread whose reads of what it writes are refused (a GraphCache's
        # scope: other threads' reads are no part of its program); 0, every thread's.
        self.recorder = 0
        self.allocations: dict[int, Allocation] = {}
        # start, end, start, end, ...: flat, so recording an op adds no object that lives on
        # (and ranges, not borrows: a pin must not keep tensors alive).
        self.writes: list[int] = []
        self.written: set[int] = set()
        self.pending: set[object] = set()
        self.replayed_on: set[object] = set()
        self.last_stream: object = None
        self.caught_up: set[object] = set()
        # The other pins whose replays this one's must follow (see _sharers_of), as of the count
        # of holding changes `sharers_made`: made again on the first replay after a change.
        self.sharers: list[Pin] = []
        self.sharers_made = -1

    def add(self, borrows: Iterable[Borrow]) -> None:
        """Pin what an op touches (and, for foreign memory, every wrapper of the same bytes)."""
        held = self.allocations
        for b in borrows:
            if b.mutable and b.start != b.end:
                self.writes += (b.start, b.end)
            alloc = b.alloc
            if alloc.id not in held:
                for a in alloc.aliases() if len(alloc.region.members) > 1 else (alloc,):
                    held[a.id] = a
                    a.pins[id(self)] = self
                    if a.users:  # the first replay comes after the eager work (and replays) so far
                        self.pending |= a.users

    def mark(self) -> tuple[int, int]:
        """Where the pin stands now (see :meth:`roll_back`)."""
        return len(self.writes), len(self.allocations)

    def hand_to_graph(self, description: str) -> None:
        """An open scope's pin becomes its graph's: replayable from now on, by the graphs it shares
        memory with too (their next replays look again). What it writes is worked out here, once,
        not on each record (recording sits in users' inner loops)."""
        self.description = description
        self.recording = False
        self.written = _written_by(self)
        holdings_changed()

    def roll_back(self, mark: tuple[int, int]) -> None:
        """Unpin what was added since ``mark``: the ops of loop and branch bodies whose block
        raised, which the graph will not hold (``allocations`` keeps insertion order)."""
        writes, held = mark
        del self.writes[writes:]
        key = id(self)
        for alloc_id in list(self.allocations)[held:]:
            self.allocations.pop(alloc_id).pins.pop(key, None)

    def writes_to(self, start: int, end: int) -> bool:
        w = self.writes
        return any(w[i] < end and start < w[i + 1] for i in range(0, len(w), 2))

    def release(self) -> None:
        """Unpin; the memory's eventual release waits for every replay of this holder, and eager
        work on it from other streams for the last one (``Allocation.closed_replays``)."""
        marks = ReplayMarks()
        for alloc in self.allocations.values():
            self.let_go(alloc, marks)
        self.allocations = {}
        holdings_changed()

    def let_go(self, alloc: Allocation, marks: ReplayMarks) -> None:
        """Unpin ``alloc`` (closed, or no longer used after a rebind or a new recording): its
        release waits for every replay so far, and eager work on it from another stream, and the
        next replays of the graphs that stay on it, for the last one (it may still run).

        The replays are noted before the pin goes: another thread's ``free()`` or eager work that
        finds the memory unpinned must find them."""
        self.hand_on(alloc, alloc.id in self.written, marks)
        last = self.last_stream
        if last is not None:
            backend = alloc.device.backend
            key = marks.of(backend, last)
            passed = {m for m in list(alloc.closed_replays or ()) if marks.passed(backend, m)}  # (not under the lock)
            with PENDING:  # one writer at a time (two graphs closed at once), and a new dict each time
                closed = {m: caught for m, caught in (alloc.closed_replays or {}).items() if m not in passed}
                earlier = closed.get(key)  # another graph's last replay on that stream (unmarked), before or after
                # Caught up with each: a stream that waited for one of them only waits again.
                closed[key] = set(self.caught_up) if earlier is None else earlier & self.caught_up
                alloc.closed_replays = closed
        alloc.pins.pop(id(self), None)

    def hand_on(self, alloc: Allocation, wrote: bool, marks: ReplayMarks) -> None:
        """This holder lets go of ``alloc``, or stops writing it (closed, or re-pinned), while its
        replays may still run (and write it, if ``wrote``): graphs built on the memory from now on
        wait for them, and the next replays of the graphs and open scopes that hold it, where
        either writes it, wait for the last one, as they did while this holder was their sharer
        (what an open scope writes is summed up only when its graph is built).

        The memory keeps marks of the replays, not their streams, and drops the marks that have
        passed: a long-lived tensor (weights, a device's scratch token) used by many graphs, each
        closed in turn, would otherwise keep every stream they ran on alive, and a new graph's
        first replay would wait on them all."""
        last = self.last_stream
        if last is None:
            return  # never replayed (an open scope's pin, say): nothing to hand on
        backend = alloc.device.backend
        users = alloc.users  # changed in place: its release (``track``) holds this set
        users.update(marks.of(backend, stream) for stream in list(self.replayed_on))
        users.difference_update([user for user in list(users) if marks.passed(backend, user)])
        end = alloc.address + alloc.nbytes
        for other in list(alloc.pins.values()):  # a copy: other threads record and build meanwhile
            if other is not self and (
                wrote or alloc.id in other.written or (other.recording and other.writes_to(alloc.address, end))
            ):
                with PENDING:
                    other.pending.add(marks.of(backend, last))


class ReplayMarks:
    """What stands for a holder's replays on each stream once it lets memory go: the backend's mark
    (on CUDA an event recorded after them), made on first use and once per stream, for all the
    allocations it lets go of at once; and whether a mark has passed, asked once per mark. The
    marks are made when the holder lets go, so they cover every replay so far; a holder that stays
    (re-pinned) tracks its later replays itself."""

    __slots__ = ("_made", "_passed")

    def __init__(self) -> None:
        self._made: dict[object, object] = {}
        self._passed: dict[object, bool] = {}

    def of(self, backend: Backend, stream: object) -> object:
        mark = self._made.get(stream)
        if mark is None:
            mark = self._made[stream] = backend.mark(stream)
        return mark

    def passed(self, backend: Backend, mark: object) -> bool:
        """Whether ``mark``'s work has completed (a stream never has: more may be queued on it)."""
        known = self._passed.get(mark)
        if known is None:
            known = self._passed[mark] = backend.finished(mark)
        return known


def pins_writing(alloc: Allocation, start: int, end: int) -> Iterator[Pin]:
    """The graphs and open scopes that write any of ``[start, end)`` of ``alloc``'s memory, through
    whichever wrapper of it (``freeze()`` and ``numpy()`` ask)."""
    for alias in alloc.aliases():
        for pin in list(alias.pins.values()):  # a copy: other threads record and build meanwhile
            if pin.writes_to(start, end):
                yield pin


def _written_by(pin: Pin) -> set[int]:
    """The ids of the allocations ``pin`` holds that any of its writes overlaps (a write through
    one wrapper of foreign memory may start in another wrapper's bytes): the writes sorted by
    start, with the furthest end reached so far, and one bisection per allocation."""
    w = pin.writes
    ranges = sorted(zip(w[0::2], w[1::2], strict=True))
    starts = [start for start, _ in ranges]
    reach = list(itertools.accumulate((end for _, end in ranges), max))
    found: set[int] = set()
    for alloc in pin.allocations.values():
        i = bisect.bisect_left(starts, alloc.address + alloc.nbytes)  # the writes that start before its end
        if i and reach[i - 1] > alloc.address:
            found.add(alloc.id)
    return found


_change_ids = itertools.count(1)
_holding_changes = [0]


def holdings_changed() -> None:
    """What pins hold has changed (a graph built, re-pinned or closed): every pin makes its list of
    sharers again before its next replay. A new id, not an increment: two threads' changes at
    once must not store one value twice (a pin that made its list in between would keep it)."""
    _holding_changes[0] = next(_change_ids)


def _sharers_of(pin: Pin) -> list[Pin]:
    """The other pins that hold an allocation ``pin`` holds, where one of the two writes it. Graphs
    that only read the same memory (frozen weights) need no order between their replays."""
    found: dict[int, Pin] = {}
    written = pin.written
    for alloc in list(pin.allocations.values()):
        mine = alloc.id in written
        for other in list(alloc.pins.values()):  # copies: other threads record and build meanwhile
            if other is not pin and (mine or alloc.id in other.written):
                found[id(other)] = other
    return list(found.values())


def repin(pin: Pin, borrows: Iterable[Borrow]) -> None:
    """Make ``pin`` hold exactly what ``borrows`` touch. Allocations no longer used lose the pin (their
    release then waits for the replays so far, as at close, and so do the next replays of the
    graphs that share them); newly used ones gain it, and the next replay waits for the eager work
    already queued on them."""
    held: dict[int, Allocation] = {}
    writes: list[int] = []
    for b in borrows:
        alloc = b.alloc
        if b.mutable and b.start != b.end:
            writes += (b.start, b.end)
        if alloc.id in held:
            continue
        for a in alloc.aliases() if len(alloc.region.members) > 1 else (alloc,):
            held[a.id] = a
    key = id(pin)
    marks = ReplayMarks()
    for aid, a in pin.allocations.items():
        if aid not in held:
            pin.let_go(a, marks)
    for aid, a in held.items():
        if aid not in pin.allocations:
            a.pins[key] = pin
            pin.pending |= a.users
    wrote = pin.written
    pin.allocations = held
    pin.writes = writes
    pin.written = _written_by(pin)
    for aid in wrote - pin.written:
        kept = held.get(aid)
        if kept is not None:  # still used, no longer written: the last replay may still write it
            pin.hand_on(kept, True, marks)
    holdings_changed()


def note_eager_use(borrows: Iterable[Borrow], native_stream: object, backend: Backend) -> None:
    """Eager work is about to be enqueued on ``native_stream``: it waits for the last replay of
    every graph that pins its memory (launched on another stream, the replay may still read or
    write it), and the memory's release waits for it. Once it is enqueued, ``queued_on`` makes the
    next replays of those graphs wait for it too."""
    for b in borrows:
        alloc = b.alloc
        if native_stream not in alloc.users:
            _add_user(alloc, native_stream, backend)
        if alloc.pins or alloc.closed_replays or len(alloc.region.members) > 1:
            for a in alloc.aliases():
                # Every wrapper of the memory: the one used here may be dropped first, and the
                # graphs and the release of the others must still wait for this work.
                if native_stream not in a.users:
                    _add_user(a, native_stream, backend)
                for pin in list(a.pins.values()):  # a copy: other threads record and build meanwhile
                    caught = pin.caught_up  # before last_stream: a replay meanwhile replaces the set
                    _after_replay(native_stream, pin.last_stream, caught, backend)
                closed = a.closed_replays  # never changed in place (let_go makes a new one)
                if closed:
                    for last, caught in closed.items():
                        _after_replay(native_stream, last, caught, backend)


# How many streams and marks an eager use lets an allocation hold before it looks for those whose
# work has finished (see let_finished_users_go).
MANY_USERS = 16


def _add_user(alloc: Allocation, native_stream: object, backend: Backend) -> None:
    """``native_stream`` (not yet among ``alloc``'s users) is about to run work on its memory."""
    alloc.users.add(native_stream)
    if len(alloc.users) >= alloc.look_at:
        let_finished_users_go(alloc, native_stream, backend)


def let_finished_users_go(alloc: Allocation, current: object, backend: Backend) -> None:
    """Memory used eagerly on many streams (a long-lived tensor, a stream per request) kept every
    one of them alive, and a new graph's first replay waited on each. Once it holds
    ``alloc.look_at`` users, those whose work has finished go (marks that have passed, idle
    streams the program no longer holds a Stream for), but never ``current``, whose work is about
    to be queued. A stream the program holds stays: it lives anyway, asking after it cost each op
    a query in a program that takes turns on a pool of streams, and above all "idle" can go
    stale: work may be queued there the moment after the query (a stream no Stream wraps has no
    one to queue it; one wrapped again meanwhile is held by the time of the second look below).
    The next look comes when the users that stay have doubled, so a busy GPU costs an op O(1)
    queries. ``queued_on`` puts a stream back after its work is queued: another thread may be
    between its own note and enqueue here."""
    users = alloc.users
    done = [u for u in list(users) if u is not current and not held(u) and (backend.finished(u) or backend.idle(u))]
    users.difference_update([u for u in done if not held(u)])
    alloc.look_at = max(MANY_USERS, 2 * len(users))


# The program's Stream for each backend stream, by the backend stream's id (stable while ``users``
# hold it): see let_finished_users_go.
_held_streams: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()


def hold(native_stream: object, stream: object) -> None:
    """``stream`` (a Stream) wraps ``native_stream`` for as long as the program keeps it."""
    _held_streams[id(native_stream)] = stream


def held(user: object) -> bool:
    """Whether the program still holds a Stream for ``user`` (a backend stream; a mark: never)."""
    stream = _held_streams.get(id(user))
    return stream is not None and getattr(stream, "native", None) is user


def queued_on(borrows: Iterable[Borrow], native_stream: object) -> None:
    """Eager work on the memory of ``borrows`` is now enqueued on ``native_stream``: the next replay
    of every graph that pins that memory waits for it. After the enqueue, with the pins as they are
    now: a replay (on another thread) that took the pending streams in between would wait for
    nothing yet queued, and the replay after it not at all; and a graph that began to hold the
    memory in between (recorded, rebound) took the stream from ``users`` too early in the same way."""
    for b in borrows:
        alloc = b.alloc
        alloc.users.add(native_stream)  # again, if another thread let it go meanwhile (idle before this work)
        if alloc.pins or len(alloc.region.members) > 1:
            for a in alloc.aliases():
                a.users.add(native_stream)  # (likewise)
                pins = list(a.pins.values())
                if pins:
                    with PENDING:
                        for pin in pins:
                            pin.pending.add(native_stream)


def _after_replay(native_stream: object, last: object, caught: set[object], backend: Backend) -> None:
    """``native_stream`` waits for the replay last queued on ``last``, once (``caught`` remembers)."""
    if last is not None and last is not native_stream and native_stream not in caught:
        backend.wait_stream(native_stream, last)
        caught.add(native_stream)


# Held while a pin's `pending` streams are added to (eager work, other threads) or taken for a
# replay: an add between the replay's copy of the set and its clear would be lost, and the next
# replay would not wait for that eager work.
PENDING = threading.RLock()  # re-entrant: a collected graph's close may run inside (let_go)

# Held around the ordering and launch of a replay of a graph that has sharers: two of them launched
# from two threads at once would each read the other's previous replay, and then overlap.
SHARED_REPLAYS = threading.Lock()


def sharers(pin: Pin) -> list[Pin]:
    """The pins whose replays ``pin``'s must follow (_sharers_of), made again after a change."""
    if pin.sharers_made != _holding_changes[0]:
        pin.sharers_made = _holding_changes[0]
        pin.sharers = _sharers_of(pin)
    return pin.sharers


def ordered_already(pin: Pin, native_stream: object) -> bool:
    """Whether a replay of ``pin``'s graph on ``native_stream`` has nothing to wait for and nothing
    to note (``order_replay`` would change nothing): its last replay was on that stream, no eager
    work touched its memory since, and every graph sharing its memory (``sharers``, made first)
    last replayed there too, or that stream waited for it. The launch's hot path."""
    if pin.last_stream is not native_stream or pin.pending:
        return False
    for sharer in pin.sharers:
        last = sharer.last_stream
        if last is not None and last is not native_stream and native_stream not in sharer.caught_up:
            return False
    return True


def order_replay(pin: Pin, native_stream: object, backend: Backend) -> None:
    """Make ``native_stream`` wait for what must precede a replay of ``pin``'s graph on it (with
    SHARED_REPLAYS held, when ``pin`` has sharers)."""
    for sharer in sharers(pin):  # another graph's replay on another stream may still use the memory
        caught = sharer.caught_up  # before last_stream: a replay meanwhile replaces the set
        _after_replay(native_stream, sharer.last_stream, caught, backend)
    last = pin.last_stream
    if last is not None and last is not native_stream:
        backend.wait_stream(native_stream, last)
    if pin.pending:
        with PENDING:
            waiting, pin.pending = pin.pending, set()
        for other in waiting:
            if other is not native_stream and other is not last:
                backend.wait_stream(native_stream, other)
    pin.last_stream = native_stream
    pin.replayed_on.add(native_stream)


def replay_queued(pin: Pin) -> None:
    """A replay of ``pin``'s graph is now enqueued: no other stream has waited for it yet. A new
    set, made after the launch: an eager thread that read the old one and waited before the launch
    (for the replay before) adds to that one, also when it was empty; this replay's readers and
    writers on other streams then wait for it (``_after_replay``)."""
    pin.caught_up = set()


def track(alloc: Allocation, memory_map: MemoryMap) -> None:
    """Register ``alloc`` by address and arrange its release (see the module docstring)."""
    memory_map.register(alloc)
    release = weakref.finalize(
        alloc,
        _release,
        alloc.device.backend,
        memory_map,
        alloc.storage,
        alloc.users,
        alloc.borrowed,
        alloc.address,
        alloc.id,
    )
    release.atexit = False  # at exit the driver may be gone; the process frees everything anyway
    alloc.release = release


def _release(
    backend: Backend,
    memory_map: MemoryMap,
    storage: object,
    users: set[object],
    borrowed: bool,
    address: int,
    alloc_id: int,
) -> None:
    memory_map.unregister(address, alloc_id)
    backend.retire(storage, users, borrowed)
