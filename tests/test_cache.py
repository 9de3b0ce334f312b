"""``sg.GraphCache`` and ``sg.bucket`` (issue 9, seed 003): exact hit, miss and eviction counts,
least-recently-used eviction that closes graphs (now, or when the user lets go), and failed
builds that cache nothing."""

from __future__ import annotations

import gc
import pickle
import threading
import weakref
from collections.abc import Callable
from typing import Annotated, NamedTuple

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import assert_stream_usable, pinned

SIZES = (16, 32, 64)


class Workload:
    """One output buffer per bucket, so a graph's pins show whether it is alive."""

    def __init__(self, dev: sg.Device) -> None:
        self.x = dev.from_numpy(np.arange(64, dtype=np.float32), name="x")
        self.outs = {b: dev.zeros((b,), name=f"out{b}") for b in SIZES}
        self.built: list[int] = []

    def record(self, s: sg.Scope, n: int) -> None:
        self.built.append(n)
        s.record(library.add_op(self.outs[n].mut(), self.x[0:n], self.x[0:n]))


def closed(graph: CudaGraph) -> bool:
    return graph.closed  # (read through a call: mypy would keep an earlier narrowing of the property)


def test_hits_misses_evictions_and_lru_order(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    work = Workload(sg_device)
    cache = sg.GraphCache(sg_stream, work.record, maxsize=2)
    counts = []
    for n in (16, 16, 32, 16, 64, 32, 16, 16):
        cache.get(n).launch()
        counts.append((cache.hits, cache.misses, cache.evictions, len(cache)))
    # 16 miss, 16 hit, 32 miss, 16 hit (32 is now LRU), 64 miss evicts 32, 32 miss evicts 16, 16 miss evicts 64, 16 hit
    assert counts == [
        (0, 1, 0, 1),
        (1, 1, 0, 1),
        (1, 2, 0, 2),
        (2, 2, 0, 2),
        (2, 3, 1, 2),
        (2, 4, 2, 2),
        (2, 5, 3, 2),
        (3, 5, 3, 2),
    ]
    assert work.built == [16, 32, 64, 32, 16]
    assert cache.keys() == [32, 16] and 16 in cache and 64 not in cache and [1] not in cache
    sg_stream.sync()
    for n in SIZES:
        np.testing.assert_array_equal(work.outs[n].numpy(), 2 * np.arange(n, dtype=np.float32))
    assert repr(cache).endswith("3 hits, 5 misses, 3 evictions>")


def test_evicted_graphs_are_closed_and_unpinned(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    work = Workload(sg_device)
    cache = sg.GraphCache(sg_stream, work.record, maxsize=1)
    gc.disable()  # closing must not wait for the cycle collector
    try:
        first = weakref.ref(cache.get(16))
        assert pinned(work.outs[16])
        cache.get(32)
        assert cache.evictions == 1
        evicted = first()  # (the scope that built it may still refer to it until a collection)
        assert evicted is None or evicted.closed
        del evicted
        assert not pinned(work.outs[16])  # (x is pinned by the graph for 32)
        work.outs[16].free()  # nothing holds it any more
    finally:
        gc.enable()


def test_an_evicted_graph_the_user_holds_closes_when_they_are_done(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    work = Workload(sg_device)
    cache = sg.GraphCache(sg_stream, work.record, maxsize=1)
    held = cache.get(16)
    cache.get(32)
    assert cache.evictions == 1 and 16 not in cache
    assert not held.closed and pinned(work.outs[16])
    held.launch()  # still the user's to use
    held.sync()
    np.testing.assert_array_equal(work.outs[16].numpy(), 2 * np.arange(16, dtype=np.float32))
    with held:
        pass  # done with it: a with block (or close(), or dropping it) closes it
    assert closed(held) and not pinned(work.outs[16])
    again = cache.get(16)  # the key is built anew
    assert again is not held and cache.misses == 3
    dropped = weakref.ref(again)
    cache.get(64)
    assert not again.closed
    del again  # its last reference: closed at once, or by the next collection (the scope that built it is a cycle)
    gc.collect()
    assert dropped() is None and not pinned(work.outs[16])


def test_a_failing_build_caches_nothing(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    work = Workload(sg_device)

    def record(s: sg.Scope, n: int) -> None:
        work.record(s, min(n, 64))
        if n == 99:
            raise ValueError("the user's recording failed")
        if n == 100:
            s.record(sg.zeros((4,)))  # type: ignore[arg-type]

    cache = sg.GraphCache(sg_stream, record, maxsize=1)
    cache.get(16)
    with pytest.raises(ValueError, match="the user's recording failed"):
        cache.get(99)
    with pytest.raises(sg.NotAGraphNodeError):
        cache.get(100)
    assert (cache.hits, cache.misses, cache.evictions, len(cache)) == (0, 3, 0, 1)
    assert cache.keys() == [16] and 99 not in cache
    assert not pinned(work.outs[64])  # the failed scopes left nothing pinned
    assert pinned(work.outs[16])  # and evicted nothing
    cache.get(16).launch()
    assert cache.hits == 1
    assert_stream_usable(sg_stream)


def test_a_graph_the_user_closed_is_built_again(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    work = Workload(sg_device)
    cache = sg.GraphCache(sg_stream, work.record)
    cache.get(16).close()
    g = cache.get(16)
    assert not g.closed and (cache.hits, cache.misses, cache.evictions, len(cache)) == (0, 2, 0, 1)
    cache.clear()
    assert len(cache) == 0 and not g.closed  # still held here
    del g


def test_a_graph_the_user_closed_gives_up_its_slot(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A closed graph holds no slot: the next miss evicts no live graph for it."""
    work = Workload(sg_device)
    cache = sg.GraphCache(sg_stream, work.record, maxsize=2)
    first = cache.get(16)
    cache.get(32).close()
    assert len(cache) == 1 and cache.keys() == [16] and 32 not in cache
    cache.get(64)
    assert cache.evictions == 0 and not first.closed and cache.keys() == [16, 64]
    assert cache.get(16) is first and (cache.hits, cache.misses) == (1, 3)
    cache.clear()


def test_keys_may_be_any_hashable(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((8,), name="x")

    def record(s: sg.Scope, key: tuple[str, float]) -> None:
        s.record(library.fill_op(x.mut(), key[1]))

    cache: sg.GraphCache[tuple[str, float]] = sg.GraphCache(sg_stream, record, maxsize=3)
    cache.get(("fill", 1.5)).launch()
    cache.get(("fill", 1.5)).launch()
    assert (cache.hits, cache.misses) == (1, 1)
    with pytest.raises(sg.SignatureError, match="keys must be hashable") as info:
        cache.get(["fill", 2.0])  # type: ignore[arg-type]
    assert "help:" in str(info.value)
    assert cache.misses == 1


class Pair(NamedTuple):
    a: int
    b: int


def test_keys_of_different_types_never_share_a_graph(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """1, True, 1.0 and np.int64(1) are one dict key in Python (equal, same hash): the graph
    recorded for the int was replayed for the bool and the float. Each type is its own key now,
    inside tuples (shapes) and frozensets too; a hit still needs no more than an equal key."""
    x = sg_device.zeros((1,), name="x")
    built: list[object] = []

    def record(s: sg.Scope, key: object) -> None:
        built.append(key)
        s.record(library.fill_op(x.mut(), float(len(built))))  # each graph writes its own value

    keys: list[object] = [
        1, True, 1.0, np.int64(1), np.float32(1), 1 + 0j,
        (1, 2), (True, 2), (1.0, 2), (np.int64(1), 2), Pair(1, 2),
        ((1,), 2), ((True,), 2), ((1, 2),), (frozenset({1}), 2),
        ((1, 2), "a"), ((True, 2), "a"), ((1, 2), "a", 1.0), ((1, 2), "a", True), ((1, 2), ("a", 1.0)),
        frozenset({1}), frozenset({True}), frozenset({(1, 2)}), frozenset({(1.0, 2)}),
    ]  # fmt: skip
    cache: sg.GraphCache[object] = sg.GraphCache(sg_stream, record, maxsize=len(keys))
    for i, key in enumerate(keys):
        assert key not in cache
        cache.get(key).launch()
        assert x.numpy()[0] == i + 1, f"{key!r} replayed the graph of another key"
    assert (cache.hits, cache.misses, cache.evictions) == (0, len(keys), 0)
    listed = cache.keys()  # the keys as given, with their types
    assert built == keys and [type(k) for k in listed] == [type(k) for k in keys]
    for i, key in enumerate(keys):  # an equal key of the same types (another object) hits, as before
        copy = pickle.loads(pickle.dumps(key))
        assert copy in cache
        cache.get(copy).launch()
        assert x.numpy()[0] == i + 1
    assert cache.get(Pair(1, 2)[:]) is cache.get((1, 2))  # a slice of a named tuple is a tuple
    assert (cache.hits, cache.misses) == (len(keys) + 2, len(keys))
    with pytest.raises(sg.SignatureError, match="keys must be hashable"):
        cache.get((1, [2]))


def test_a_dtype_alias_is_the_dtype_it_names_in_a_key(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """sg.f32 compares equal to an f32 tensor's dtype (and to sg.float32): as a key, or in one,
    it is that dtype, so a cache keyed by (shape, dtype) builds one graph for both spellings."""
    x = sg_device.zeros((8,), sg.f32, name="x")
    users_f32 = Annotated[float, sg.float32]  # an alias of the user's own, naming the DType itself
    cache: sg.GraphCache[object] = sg.GraphCache(sg_stream, lambda s, key: None, maxsize=16)
    for same in (
        [sg.f32, sg.float32, x.dtype, users_f32],
        [(8, sg.f32), (8, sg.float32), (8, x.dtype), (8, users_f32)],
        [(x.shape, sg.f32), ((8,), x.dtype)],
        [frozenset({sg.f32}), frozenset({x.dtype})],
    ):
        first = cache.get(same[0])
        assert all(cache.get(key) is first for key in same[1:])
    assert (cache.hits, cache.misses) == (8, 4)
    for other in (sg.f64, sg.i32, (8, sg.i32), (8.0, sg.f32), (np.int64(8), x.dtype), Annotated[float, "f32"]):
        assert other not in cache
    assert len(cache) == 4


def test_record_calling_get_is_refused_not_deadlocked(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((8,), name="x")
    holder: list[sg.GraphCache[int]] = []

    def record(s: sg.Scope, n: int) -> None:
        s.record(library.fill_op(x.mut(), float(n)))
        if n == 1:
            holder[0].get(2)

    holder.append(sg.GraphCache(sg_stream, record))
    with pytest.raises(sg.ScopeStateError, match="another scope is recording on it"):
        holder[0].get(1)
    assert len(holder[0]) == 0
    assert_stream_usable(sg_stream)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda s: sg.GraphCache(s, lambda sc, k: None, maxsize=0), r"maxsize=0 is not a positive int"),
        (lambda s: sg.GraphCache(s, lambda sc, k: None, maxsize=True), r"maxsize=True is not a positive int"),
        (lambda s: sg.GraphCache(None, lambda sc, k: None), r"GraphCache needs a scopegraph Stream, not NoneType"),  # type: ignore[arg-type]
        (lambda s: sg.GraphCache(s, 3), r"record must be a function record\(s, key\), not int"),  # type: ignore[arg-type]
        (lambda s: sg.GraphCache(s, lambda sc, k: None, order="bogus"), r"order='bogus' is not an ordering"),
        # A TypeError escaped the first get() (the call record(s, key)).
        (lambda s: sg.GraphCache(s, lambda sc: None), r"record\(sc\) cannot be called as record\(s, key\)"),  # type: ignore[arg-type, misc]
        (lambda s: sg.GraphCache(s, lambda sc, k, n: None), r"record\(sc, k, n\) cannot be called"),  # type: ignore[arg-type, misc]
    ],
    ids=["zero", "bool", "stream", "record", "order", "one_parameter", "three_parameters"],
)
def test_cache_arguments_are_checked(sg_stream: sg.Stream, make: Callable[[sg.Stream], object], match: str) -> None:
    with pytest.raises(sg.SignatureError, match=match) as info:
        make(sg_stream)
    assert "help:" in str(info.value)


def test_bucket() -> None:
    assert [sg.bucket(n, (64, 128, 256)) for n in (0, 1, 64, 65, 128, 200, 256)] == [64, 64, 64, 128, 128, 256, 256]
    assert sg.bucket(5, [32, 8, 16]) == 8  # any order
    assert sg.bucket(np.int64(9), range(8, 40, 8)) == 16


@pytest.mark.parametrize(
    ("n", "buckets", "match"),
    [
        (
            257,
            (64, 128, 256),
            r"size 257 is larger than the largest bucket, 256(.|\n)*help: add a bucket of at least 257",
        ),
        (-1, (64,), r"got size -1"),
        (True, (64,), r"got size True"),
        (1.5, (64,), r"takes an int size, not float"),
        (1, (), r"got no buckets"),
        (1, (1.5,), r"iterable of int bucket sizes"),
        (5, (True, 64), r"iterable of int bucket sizes"),
        (0, (-4, 0), r"got bucket size -4"),
    ],
    ids=["above", "negative", "bool", "float", "empty", "float-bucket", "bool-bucket", "negative-bucket"],
)
def test_bucket_refusals(n: object, buckets: object, match: str) -> None:
    with pytest.raises(sg.SignatureError, match=match) as info:
        sg.bucket(n, buckets)  # type: ignore[arg-type]
    assert "help:" in str(info.value)


def test_cache_of_graphs_with_params_serves_many_sizes(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Seed 003's pattern: a few bucketed graphs, each taking the exact size as a parameter."""
    x = sg_device.zeros((256,), name="x")
    n = sg.Param("n", sg.i32, 0)

    def record(s: sg.Scope, b: int) -> None:
        s.record(library.add_scalar[-(-b // 64), 64](x[0:b].mut(), 1.0, n))

    cache = sg.GraphCache(sg_stream, record, maxsize=3)
    want = np.zeros(256, np.float32)
    for size in (3, 64, 65, 200, 1, 128, 129, 256, 7):
        cache.get(sg.bucket(size, (64, 128, 256))).launch(n=size)
        want[:size] += 1
    sg_stream.sync()
    np.testing.assert_array_equal(x.numpy(), want)
    assert (cache.hits, cache.misses, cache.evictions) == (6, 3, 0)
    with pytest.raises(sg.SignatureError, match="would touch 65 elements"):
        cache.get(64).launch(n=65)


def test_a_miss_in_one_thread_does_not_block_launches_of_cached_graphs_in_another() -> None:
    """get() records a miss in a scope on the cache's stream; another thread's launch of a cached
    graph there is not part of that recording, so it runs, and so does its numpy() of what the
    miss records a write to. Eager work from the recording thread, inside record(), is still
    refused."""
    dev = sg.device("host")
    stream = dev.stream()
    xs = {k: dev.zeros((8,), name=f"x{k}") for k in (1, 2, 3)}
    recording, go_on = threading.Event(), threading.Event()

    def record(s: sg.Scope, key: int) -> None:
        s.record(library.add_scalar_op(xs[key].mut(), 1.0))
        if key == 2:
            recording.set()
            go_on.wait(5)
        if key == 3:
            stream.run(sg.memset(xs[1].mut(), 0.0))  # the recording thread's own eager work

    cache = sg.GraphCache(stream, record, maxsize=4)
    first = cache.get(1)
    builder = threading.Thread(target=cache.get, args=(2,))
    builder.start()
    recording.wait(5)
    try:
        first.launch()
        first.update(sg.memset(xs[3].mut(), 5.0))
        first.sync()
        np.testing.assert_array_equal(xs[2].numpy(), 0.0)  # the miss's write runs at its replays
    finally:
        go_on.set()
        builder.join()
    np.testing.assert_array_equal(xs[1].numpy(), 1.0)
    with pytest.raises(sg.ScopeStateError, match=r"opened by GraphCache.get\(\) at"):
        cache.get(3)
    cache.get(2).launch()
    np.testing.assert_array_equal(xs[2].numpy(), 1.0)
    cache.clear()
