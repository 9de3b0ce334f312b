"""Graphs pin what they use: dropped names stay alive, free() is refused, close() releases."""

from __future__ import annotations

import gc
import types
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import pinned


def test_graph_keeps_deleted_tensors_alive(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    out = sg_device.zeros((128,), name="out")
    a = sg_device.from_numpy(np.arange(128, dtype=np.float32), name="a")
    b = sg_device.from_numpy(np.ones(128, np.float32), name="b")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_op(out.mut(), a, b))
    graph = s.graph
    del a, b, s
    gc.collect()
    for _ in range(3):
        graph.launch()
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), np.arange(128) + 1)
    graph.close()


def test_free_of_a_pinned_tensor_is_refused_until_close(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    w = sg_device.zeros((16,), name="w")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(w[0:8].mut(), 1.0))
    graph = s.graph
    assert pinned(w)
    with pytest.raises(sg.LifetimeError) as info:
        w.free()
    assert f"`w` is pinned by graph #{graph.id}" in str(info.value)
    graph.launch()
    graph.sync()
    assert w.numpy()[:8].sum() == 8
    graph.close()
    assert not pinned(w)
    w.free()
    with pytest.raises(sg.LifetimeError, match="freed"):
        w.numpy()


def test_graph_as_context_manager_and_gc_release_pins(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    with s.graph as g:
        g.launch()
    assert g.closed and not pinned(x)
    with CudaGraph.scope(sg_stream) as s2:
        s2.record(sg.memset(x.mut(), 1.0))
    assert pinned(x)
    del s2
    gc.collect()
    assert not pinned(x)  # the graph went away without close(): its pins went with it
    x.free()


def test_two_graphs_pin_independently(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4,), name="x")
    graphs = []
    for value in (1.0, 2.0):
        with CudaGraph.scope(sg_stream) as s:
            s.record(sg.memset(x.mut(), value))
        graphs.append(s.graph)
    graphs[0].close()
    with pytest.raises(sg.LifetimeError, match=f"graph #{graphs[1].id}"):
        x.free()
    graphs[1].close()
    x.free()


def test_a_freeze_outlives_the_tensor_that_made_it(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """DESIGN.md section 2: "Identity is memory, not wrappers" (README: "A freeze made through one
    wrapper holds through every other"). Frozen ranges were kept by the wrapper that froze them, so
    dropping it unfroze the bytes for every other wrapper of them; now dropping it unfreezes
    nothing, and freezes nothing more."""
    x = sg_device.from_numpy(np.arange(16, dtype=np.float32), name="x")
    x[4:8].freeze()
    part = sg.Tensor.from_dlpack(x[2:10], name="part")
    del x
    gc.collect()
    assert part[2:6].frozen and not part[0:2].frozen and not part[6:8].frozen
    with pytest.raises(sg.BorrowError, match="frozen"):
        sg.memset(part.mut(), 0.0)
    sg_stream.run(sg.memset(part[0:2].mut(), -1.0))
    sg_stream.run(sg.memset(part[6:8].mut(), -1.0))
    np.testing.assert_array_equal(part.numpy(), [-1, -1, 4, 5, 6, 7, -1, -1])


def test_frozen_bytes_stay_frozen_exactly_while_a_wrapper_covers_them() -> None:
    """The freeze is the memory's while wrappers of it live. Bytes that only dropped wrappers
    covered are frozen no longer (a wrapper made there later starts writable, as one made after
    every wrapper is gone does); the bytes a live wrapper covers stay frozen; freezing the same
    bytes again, through fresh wrappers, adds nothing that the memory keeps."""
    base = np.arange(16, dtype=np.float32)
    a = sg.Tensor.from_dlpack(base, name="a").freeze()
    b = sg.Tensor.from_dlpack(base[0:8], name="b")
    for _ in range(100):
        sg.Tensor.from_dlpack(base[0:8]).freeze()
    assert len(b.allocation.region.frozen) == 1
    del a
    gc.collect()
    assert b.frozen
    c = sg.Tensor.from_dlpack(base[4:16], name="c")  # overlaps b only where b keeps the bytes frozen
    assert b.allocation.region is c.allocation.region
    assert c[0:4].frozen and not c[4:12].frozen
    with pytest.raises(sg.BorrowError, match="frozen"):
        sg.memset(c.mut(), 0.0)
    sg.device("host").stream().run(sg.memset(c[4:12].mut(), -1.0))
    del b, c
    gc.collect()
    assert not sg.Tensor.from_dlpack(base).frozen  # no wrapper lived: the memory is the user's again
    np.testing.assert_array_equal(base, [*range(8), *[-1] * 8])


def replayed(pin: Any, stream: str, backend: Any) -> None:
    """What graph.launch does for ordering on a GPU (streams by name): order, launch, then note the
    replay queued."""
    from scopegraph._lifetime import order_replay, replay_queued

    order_replay(pin, stream, backend)
    replay_queued(pin)


def graph_on_x_and_waits() -> tuple[sg.Tensor, CudaGraph, list[tuple[str, str]], Any]:
    """A host graph that writes `x`, and a backend stand-in that logs each stream wait
    (stream, waited-for stream): the ordering a GPU launch would make, with streams by name."""
    dev = sg.device("host")
    x = dev.zeros((8,), name="x")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(sg.memset(x.mut(), 1.0))
    waits: list[tuple[str, str]] = []
    backend: Any = types.SimpleNamespace(wait_stream=lambda stream, last: waits.append((stream, last)))
    return x, s.graph, waits, backend


def test_graphs_that_share_written_memory_follow_each_others_replays() -> None:
    """Which graphs a replay waits for (on a GPU, when they last ran on another stream): those that
    share memory with it where either writes, not those that share only what both read; and the
    list follows graphs being built, re-pinned and closed."""
    from scopegraph._lifetime import _sharers_of

    dev = sg.device("host")
    stream = dev.stream()
    cache, out, other = dev.zeros((8,), name="cache"), dev.zeros((8,), name="out"), dev.zeros((8,), name="other")
    weights = dev.full((8,), 1.0, name="weights").freeze()

    def graph(*ops: sg.GraphNode) -> CudaGraph:
        with CudaGraph.scope(stream) as s:
            for op in ops:
                s.record(op)
        return s.graph

    writer = graph(sg.memcpy(cache.mut(), weights))
    reader = graph(sg.memcpy(out.mut(), cache))
    bystander = graph(sg.memcpy(other.mut(), weights))
    pins = {g: g._pin for g in (writer, reader, bystander)}
    assert _sharers_of(pins[writer]) == [pins[reader]] and _sharers_of(pins[reader]) == [pins[writer]]
    assert _sharers_of(pins[bystander]) == []  # weights are read by all: no order needed
    waits: list[tuple[str, str]] = []
    backend: Any = types.SimpleNamespace(wait_stream=lambda stream, last: waits.append((stream, last)))
    replayed(pins[writer], "a", backend)  # what a launch does on a GPU, with streams by name
    replayed(pins[reader], "b", backend)
    replayed(pins[bystander], "c", backend)
    assert waits == [("b", "a")]
    reader.rebind({cache: other})  # now reads `other`, which the bystander writes
    assert _sharers_of(pins[writer]) == [] and _sharers_of(pins[reader]) == [pins[bystander]]
    # The writer's next replay: its own last one, and the reader's on "b", which read `cache` until
    # the rebind (it may still run), but not later reader replays (they no longer touch `cache`).
    replayed(pins[writer], "d", backend)
    replayed(pins[bystander], "e", backend)
    assert waits == [("b", "a"), ("d", "a"), ("d", "b"), ("e", "b"), ("e", "c")]
    bystander.close()  # its replay on "e" may still run: the reader's next replay waits for it
    assert _sharers_of(pins[reader]) == []
    del waits[:]
    replayed(pins[reader], "f", backend)
    assert set(waits) == {("f", "b"), ("f", "e")}
    reader.rebind({other: cache})  # back to `cache`: the bystander is gone, the writer shares again
    del waits[:]
    replayed(pins[writer], "g", backend)
    assert set(waits) == {("g", "f"), ("g", "d")}
    writer.rebind({cache: out})  # moves off `cache` while its replay on "g" may still run
    assert pins[writer].written == {out.allocation.id}  # what it writes now, for its sharers
    del waits[:]
    replayed(pins[reader], "h", backend)
    assert ("h", "g") in waits


def test_a_replay_between_eager_works_note_and_its_enqueue_does_not_use_up_the_wait() -> None:
    """Eager work on another thread (stream S2) is noted, then a replay on S1 takes the streams it
    must wait for, then the eager work is enqueued: the replay after it must wait for S2. Noting
    S2 as pending before the enqueue let the first replay use it up (a wait for nothing yet
    queued), and the next replay waited for nothing at all."""
    from scopegraph._lifetime import note_eager_use, queued_on

    x, graph, waits, backend = graph_on_x_and_waits()
    pin = graph._pin
    fill = sg.memset(x.mut(), 2.0)
    note_eager_use(fill.borrows, "S2", backend)  # thread B, about to enqueue
    replayed(pin, "S1", backend)  # thread A's replay meanwhile: nothing of S2 queued yet
    queued_on(fill.borrows, "S2")  # thread B's work is enqueued
    waits.clear()
    replayed(pin, "S1", backend)  # thread A's next replay
    assert waits == [("S1", "S2")]
    graph.close()


@pytest.mark.parametrize("how", ["rebind", "into"])
def test_eager_work_on_memory_a_graph_let_go_waits_for_its_last_replay(how: str) -> None:
    """A graph's last replay (on stream "a") may still read `x` when a rebind or a new recording
    moves the graph off it: eager work on `x` from another stream waits for that replay, as after
    close() (a rebind forgot it: the GPU then overwrote what the replay was still reading)."""
    from scopegraph._lifetime import note_eager_use

    dev = sg.device("host")
    x, x2, out = dev.zeros((8,), name="x"), dev.zeros((8,), name="x2"), dev.zeros((8,), name="out")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(sg.memcpy(out.mut(), x))
    graph = s.graph
    waits: list[tuple[str, str]] = []
    backend: Any = types.SimpleNamespace(wait_stream=lambda stream, last: waits.append((stream, last)))
    replayed(graph._pin, "a", backend)  # what a replay on stream "a" does on a GPU
    if how == "rebind":
        graph.rebind({x: x2})
    else:
        with CudaGraph.scope(dev.stream(), into=graph) as again:
            again.record(sg.memcpy(out.mut(), x2))
    note_eager_use(sg.memset(x.mut(), 9.0).borrows, "b", backend)
    assert waits == [("b", "a")]
    graph.close()


def test_a_stream_that_waited_before_a_replay_was_launched_has_not_caught_up_with_it() -> None:
    """Eager work on S2 reads which replay of a graph to wait for (the one on S1) and waits for it,
    and meanwhile another replay is launched on S1 before S2 notes that it caught up. S2 waited
    for the replay before, not this one: its next eager work must wait again. (The set of streams
    that caught up was renewed before the launch, and only when it was not empty: S2's note went
    into the set of the new replay.)"""
    from scopegraph._lifetime import _after_replay, ordered_already

    _, graph, waits, backend = graph_on_x_and_waits()
    pin = graph._pin
    replayed(pin, "S1", backend)  # replay 1
    caught, last = pin.caught_up, pin.last_stream  # thread B (eager on S2) reads, and is preempted
    assert ordered_already(pin, "S1")  # replay 2 on S1 (thread A) has nothing to wait for ...
    backend.wait_stream("S2", last)  # ... and thread B's wait is made before replay 2 is launched
    replayed(pin, "S1", backend)  # replay 2
    caught.add("S2")  # thread B notes that S2 caught up (with replay 1)
    waits.clear()
    _after_replay("S2", pin.last_stream, pin.caught_up, backend)  # S2's next eager work on x
    assert waits == [("S2", "S1")]  # waits for replay 2
    graph.close()


# -- graphs let go of memory while other work uses it (a race audit; streams by name, as above) ----


class Log:
    """A backend stand-in that logs stream waits; ``hook`` (a stream, a function) runs the function
    once, inside the first wait for that stream: another thread's step at that moment."""

    def __init__(self) -> None:
        self.waits: list[tuple[str, str]] = []
        self.hook: tuple[str, Any] | None = None

    def wait_stream(self, stream: str, last: str) -> None:
        self.waits.append((stream, last))
        if self.hook is not None and self.hook[0] == last:
            step, self.hook = self.hook[1], None
            step()


def reading(x: sg.Tensor, name: str) -> CudaGraph:
    out = x.device.zeros(x.shape, name=f"out_{name}")
    with CudaGraph.scope(x.device.stream()) as s:
        s.record(sg.memcpy(out.mut(), x))
    return s.graph


def eager_write(x: sg.Tensor, stream: str, log: Any) -> None:
    """What the CUDA backend's run does around enqueueing a write of x on ``stream``."""
    from scopegraph._lifetime import note_eager_use, queued_on

    fill = sg.memset(x.mut(), 9.0)
    note_eager_use(fill.borrows, stream, log)
    queued_on(fill.borrows, stream)


def test_a_stream_that_waited_for_one_closed_replay_waits_for_the_next_on_that_stream() -> None:
    """Two graphs read x and were closed after replays on S1. Eager work on S2 waited for the
    first one's; the second replayed later (after that work) and was closed: S2's next write must
    wait for it. The streams that caught up with the first were merged into the second's."""
    dev, log = sg.device("host"), Log()
    x = dev.zeros((8,), name="x")
    first, second = reading(x, "a"), reading(x, "b")
    replayed(first._pin, "S1", log)
    first.close()
    eager_write(x, "S2", log)
    replayed(second._pin, "S1", log)
    second.close()
    log.waits.clear()
    eager_write(x, "S2", log)
    assert log.waits == [("S2", "S1")]


def test_a_graph_closed_while_a_scope_records_a_write_of_its_memory_hands_it_its_last_replay() -> None:
    """A graph that reads x replayed on S1 and is closed while a scope records a write of x: the
    new graph's first replay waits for that replay. (What an open scope writes is summed up only
    when its graph is built, so the hand-on skipped it.)"""
    dev, log = sg.device("host"), Log()
    x = dev.zeros((8,), name="x")
    old = reading(x, "old")
    replayed(old._pin, "S1", log)
    with CudaGraph.scope(dev.stream()) as s:
        s.record(sg.memset(x.mut(), 1.0))
        old.close()
    replayed(s.graph._pin, "S2", log)
    assert log.waits == [("S2", "S1")]
    s.graph.close()


@pytest.mark.parametrize("other", ["eager write", "free"])
def test_work_on_memory_a_closing_graph_just_unpinned_finds_its_last_replay(other: str) -> None:
    """Another thread acts on x the moment a closing graph has unpinned it: an eager write waits
    for the graph's last replay, and a free() releases the memory after it. (The pin went first,
    and the replay was noted after: the memory looked unpinned with no replay to wait for.)"""
    dev, log = sg.device("host"), Log()
    x = dev.zeros((8,), name="x")
    graph = reading(x, "g")
    replayed(graph._pin, "S1", log)
    retired: list[set[object]] = []

    class Pins(dict[int, Any]):
        def pop(self, *args: Any) -> Any:
            found = super().pop(*args)
            x.allocation.pins = dict(self)  # once
            if other == "eager write":
                eager_write(x, "S2", log)  # the other thread, right after the pin went
            else:
                backend: Any = dev.backend
                storage = x.allocation.storage
                backend.retire = lambda s, users, borrowed: retired.append(set(users)) if s is storage else None
                x.free()
            return found

    x.allocation.pins = Pins(x.allocation.pins)
    graph.close()
    if other == "eager write":
        assert log.waits == [("S2", "S1")]
    else:
        backend: Any = dev.backend
        del backend.retire
        assert retired == [{"S1"}]


def test_eager_work_whose_wait_meets_another_graphs_close_still_runs() -> None:
    """Eager work waits for the closed replays on x while another thread closes a graph on x (which
    notes its replay there): the walk over the closed replays must not break (a dict that changed
    size during iteration), and the next write waits for the newly closed replay too."""
    dev, log = sg.device("host"), Log()
    x = dev.zeros((8,), name="x")
    first, second = reading(x, "a"), reading(x, "b")
    replayed(first._pin, "S1", log)
    first.close()
    replayed(second._pin, "S3", log)
    log.hook = ("S1", second.close)  # the other thread, while the eager work walks the closed replays
    eager_write(x, "S2", log)
    log.waits.clear()
    eager_write(x, "S4", log)
    assert set(log.waits) == {("S4", "S1"), ("S4", "S3")}


@pytest.mark.parametrize("how", ["recorded", "rebound"])
def test_a_graph_that_takes_memory_between_eager_works_note_and_enqueue_waits_for_it(how: str) -> None:
    """Eager work on S2 notes x's users, then (another thread) a graph starts to hold x (recorded,
    or rebound onto it) and replays on S1, then the work is enqueued. The graph's replay after that
    waits for S2. (Its new pin took S2 from x's users before anything was queued there, the early
    replay used it up, and the enqueue told only the pins it had noted.)"""
    from scopegraph._lifetime import note_eager_use, queued_on

    dev, log = sg.device("host"), Log()
    backend: Any = log
    x, y = dev.zeros((8,), name="x"), dev.zeros((8,), name="y")
    graph = reading(y, "g") if how == "rebound" else None
    fill = sg.memset(x.mut(), 9.0)
    note_eager_use(fill.borrows, "S2", backend)
    if graph is None:
        graph = reading(x, "g")
    else:
        graph.rebind({y: x})
    replayed(graph._pin, "S1", log)
    queued_on(fill.borrows, "S2")
    log.waits.clear()
    replayed(graph._pin, "S1", log)
    assert log.waits == [("S1", "S2")]
    graph.close()


class Marks:
    """A backend's marks, by name: ``mark("S1")`` is "S1@1" (an event recorded on S1 after what is
    queued there so far), and a mark has passed once the test says so."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, backend: Any) -> None:
        self.made = 0
        self.passed: set[str] = set()
        monkeypatch.setattr(backend, "mark", self.mark)
        monkeypatch.setattr(backend, "finished", lambda mark: mark in self.passed)

    def mark(self, stream: str) -> str:
        self.made += 1
        return f"{stream}@{self.made}"


def test_memory_keeps_marks_of_closed_graphs_replays_and_drops_those_that_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Graphs that read a long-lived x, each replayed on a stream of its own and closed in turn:
    x keeps a mark of each replay (an event), not its stream, and drops the marks that have
    passed. Work that comes later still waits for the replays that may run. (x kept every
    stream: they stayed alive, and a new graph's first replay waited on each of them.)"""
    dev, log = sg.device("host"), Log()
    marks = Marks(monkeypatch, dev.backend)
    x = dev.zeros((8,), name="x")
    for i in range(50):
        graph = reading(x, f"g{i}")
        replayed(graph._pin, f"S{i}", log)
        graph.close()
        marks.passed.add(f"S{i}@{marks.made}")  # that replay has finished
    assert marks.made == 50 and x.allocation.users == {"S49@50"}  # the last close found the rest passed
    assert set(x.allocation.closed_replays or {}) == {"S49@50"}

    running = reading(x, "running")  # its replay may still run when it is closed
    replayed(running._pin, "R", log)
    running.close()
    assert x.allocation.users == {"R@51"} and set(x.allocation.closed_replays or {}) == {"R@51"}
    log.waits.clear()
    eager_write(x, "E", log)  # waits for the closed replay that has not passed, by its mark
    assert log.waits == [("E", "R@51")]

    after = reading(x, "after")  # a new graph's first replay waits for what x's users hold
    log.waits.clear()
    replayed(after._pin, "S2", log)
    assert sorted(log.waits) == [("S2", "E"), ("S2", "R@51")]
    after.close()


def test_a_capture_keeps_the_streams_a_mark_would_stand_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a capture forbids events the backend marks a replay with its stream itself (and
    nothing passes): a graph closed then (say by garbage collection) leaves x its stream, as
    before marks, and later work waits for that stream."""
    dev, log = sg.device("host"), Log()
    monkeypatch.setattr(dev.backend, "mark", lambda stream: stream)
    monkeypatch.setattr(dev.backend, "finished", lambda mark: False)
    x = dev.zeros((8,), name="x")
    graph = reading(x, "g")
    replayed(graph._pin, "S1", log)
    graph.close()
    assert x.allocation.users == {"S1"}
    log.waits.clear()
    eager_write(x, "S2", log)
    assert log.waits == [("S2", "S1")]


class Wrapper:
    """A program's Stream for a backend stream named by a string."""

    def __init__(self, native: str) -> None:
        self.native = native


def test_memory_used_eagerly_on_many_streams_lets_the_finished_ones_go() -> None:
    """A long-lived x written eagerly on a new stream each time (a stream per request): x kept
    every stream alive, and a new graph's first replay waited on each. Once x holds MANY_USERS,
    those whose work has finished go (idle streams), never the one whose work is being queued; a
    stream that another thread was about to queue work on comes back once that work is queued.
    With every stream busy, the next look waits until the users have doubled (a look per op cost
    each op a query per stream)."""
    from scopegraph._lifetime import MANY_USERS, hold, note_eager_use, queued_on

    dev, log = sg.device("host"), Log()
    busy: set[object] = {"S3"}
    asked: list[object] = []

    def idle(user: object) -> bool:
        asked.append(user)
        return user not in busy

    # A GPU's, streams by name (the marks here are streams: no event has passed).
    backend = types.SimpleNamespace(wait_stream=log.wait_stream, finished=lambda mark: False, idle=idle)
    x = dev.zeros((8,), name="x")
    names = [f"S{i}" for i in range(MANY_USERS - 2)]
    kept = Wrapper(names[7])  # the program still holds a Stream for S7: it lives anyway, and stays
    hold(names[7], kept)
    for name in names:
        eager_write(x, name, backend)
    other = sg.memset(x.mut(), 5.0)
    note_eager_use(other.borrows, "T", backend)  # another thread, about to queue work on T
    assert x.allocation.users == {*names, "T"} and not asked
    eager_write(x, "U", backend)
    assert x.allocation.users == {"S3", "S7", "U"}  # S3's work still runs; U's is being queued
    assert "S7" not in asked
    queued_on(other.borrows, "T")  # the other thread's work is queued now
    assert x.allocation.users == {"S3", "S7", "T", "U"}

    after = reading(x, "after")  # its first replay waits for what may still run, not for 16 streams
    log.waits.clear()
    replayed(after._pin, "R", log)
    assert sorted(log.waits) == [("R", "S3"), ("R", "S7"), ("R", "T"), ("R", "U")]
    after.close()

    users = x.allocation.users
    busy |= (
        {f"B{i}" for i in range(2 * MANY_USERS)} | {"B-last", "B-next"} | users
    )  # (users: the closed graph's replay too)
    asked.clear()
    for i in range(MANY_USERS - len(users) - 1):
        eager_write(x, f"B{i}", backend)
    assert not asked and len(users) == MANY_USERS - 1
    eager_write(x, "B-last", backend)  # MANY_USERS users, all busy: nothing goes ...
    assert set(asked) == users - {"B-last", names[7]} and len(users) == MANY_USERS
    asked.clear()
    for i in range(MANY_USERS, 2 * MANY_USERS - 1):  # ... and the next look waits for twice as many
        eager_write(x, f"B{i}", backend)
    assert not asked and len(users) == 2 * MANY_USERS - 1
    eager_write(x, "B-next", backend)
    assert set(asked) == users - {"B-next", names[7]} and len(users) == 2 * MANY_USERS


def test_a_graph_that_lets_memory_go_keeps_its_idle_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a graph drops the marks of x's users that have passed, but not a stream that was
    idle when asked: another thread may queue work on x there the moment after (then finding the
    stream among the users, it adds nothing), and x's release would not wait for that work."""
    dev, log = sg.device("host"), Log()
    monkeypatch.setattr(dev.backend, "mark", lambda stream: stream)
    monkeypatch.setattr(dev.backend, "finished", lambda mark: False)
    monkeypatch.setattr(dev.backend, "idle", lambda stream: True)  # every stream idle when asked
    x = dev.zeros((8,), name="x")
    eager_write(x, "S", log)
    graph = reading(x, "g")
    replayed(graph._pin, "R", log)
    graph.close()
    assert x.allocation.users == {"S", "R"}


def test_a_stream_wrapped_again_while_its_idleness_is_asked_stays() -> None:
    """Another thread wraps a dropped stream again (Stream.from_handle) and may queue work on it
    right after x's look asked whether it is idle: x keeps it."""
    from scopegraph._lifetime import MANY_USERS, hold

    dev, log = sg.device("host"), Log()
    names = [f"S{i}" for i in range(MANY_USERS)]
    wrapped = []

    def idle(user: object) -> bool:
        if user is names[5]:
            wrapped.append(Wrapper(names[5]))  # meanwhile, on another thread
            hold(names[5], wrapped[-1])
        return True

    backend = types.SimpleNamespace(wait_stream=log.wait_stream, finished=lambda mark: False, idle=idle)
    x = dev.zeros((8,), name="x")
    for name in names:
        eager_write(x, name, backend)
    assert x.allocation.users == {names[5], names[-1]} and wrapped


def test_every_wrapper_of_memory_used_on_many_streams_lets_the_finished_ones_go() -> None:
    """Foreign memory wrapped twice, used through one wrapper on a new stream each time: the other
    wrapper kept every stream (and a new graph over it waited on each), as the first one did."""
    from scopegraph._lifetime import MANY_USERS

    log = Log()
    backend = types.SimpleNamespace(wait_stream=log.wait_stream, finished=lambda mark: False, idle=lambda s: True)
    memory = np.zeros(8, np.float32)  # host memory: the wrappers are the host backend's
    used, other = sg.Tensor.from_dlpack(memory, name="used"), sg.Tensor.from_dlpack(memory, name="other")
    for i in range(3 * MANY_USERS):
        eager_write(used, f"S{i}", backend)
    assert len(used.allocation.users) < MANY_USERS and len(other.allocation.users) < MANY_USERS
    del used, other
