"""A bounded cache of graphs by key (shapes, dtypes, user values), and buckets so that a few graphs
serve many sizes (seed 003).

    def record(s: sg.Scope, n: int) -> None: ...      # records the program for key n
    cache = sg.GraphCache(stream, record, maxsize=4)
    cache.get(sg.bucket(n, (64, 128, 256))).launch()

- ``get(key)``: a hit returns the cached graph and makes it the most recently used; a miss opens a
  scope on the cache's stream, calls ``record(s, key)`` and caches ``s.graph``. A closed graph
  found in the cache (the user closed it) is dropped and built again: a miss.
- A build that raises (in ``record`` or when the graph is instantiated) caches nothing; it still
  counts as a miss.
- Least-recently-used eviction past ``maxsize``: the cache drops the graph, which closes it
  (executable destroyed, tensors unpinned) unless the user still holds it; then it closes when
  the user is done with it (``close()``, a ``with`` block, or its last reference going).
- ``hits``, ``misses`` and ``evictions`` count exactly; ``len(cache)`` is the number of graphs held.
- Keys are compared with their types: ``1``, ``True``, ``1.0`` and ``np.int64(1)`` are four keys
  (Python takes them for one dict key), so a graph recorded for an int is never replayed for a
  bool or a float. The type of each item of a tuple key (a shape, a named tuple) and of a
  frozenset key counts too, recursively: ``(64, 128)`` and ``(64, 128.0)`` are two keys. A dtype
  alias is the dtype it names (``sg.f32`` and ``t.dtype`` of an f32 tensor are one key, as they
  compare equal). Other objects are compared as they compare themselves, with their type.
"""

from __future__ import annotations

import inspect
import operator
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, NoReturn, SupportsIndex, TypeVar

import numpy as np

from . import _dtypes
from ._dtypes import DType
from ._errors import SignatureError, diagnostic, not_copyable
from ._graph import CudaGraph
from ._scope import Scope, checked_order
from ._stream import Stream

K = TypeVar("K", bound=Hashable)


class GraphCache(Generic[K]):
    """One graph per key, built on demand by ``record(s, key)``, at most ``maxsize`` of them.

    Keys are compared with their types, and so are the items of a tuple or frozenset key: ``1``,
    ``True``, ``1.0`` and ``np.int64(1)`` are four keys (one to a dict), and ``(64, 128)`` and
    ``(64, 128.0)`` two, so a graph recorded for one is never replayed for another. A dtype
    alias is the dtype it names: ``(n, sg.f32)`` and ``(n, t.dtype)`` of an f32 tensor are one key."""

    def __init__(
        self,
        stream: Stream,
        record: Callable[[Scope, K], object],
        maxsize: int | np.integer[Any] = 8,
        order: str = "dataflow",
    ) -> None:
        if not isinstance(stream, Stream):
            raise SignatureError(
                f"GraphCache needs a scopegraph Stream, not {type(stream).__name__}\nhelp: pass dev.stream()"
            )
        if not callable(record):
            raise SignatureError(
                f"GraphCache's record must be a function record(s, key), not {type(record).__name__}\n"
                "help: pass a function that records the program for a key into the scope it is given"
            )
        _check_takes_scope_and_key(record)
        if isinstance(maxsize, (bool, np.bool_)) or not isinstance(maxsize, (int, np.integer)) or maxsize < 1:
            raise SignatureError(f"GraphCache maxsize={maxsize!r} is not a positive int\nhelp: pass e.g. maxsize=8")
        maxsize = int(maxsize)
        checked_order(order)
        self.stream = stream
        self.record = record
        self.maxsize = maxsize
        self.order = order
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # typed(key) -> (key, graph, the scope that built it: it refers to the graph too, see _drop)
        self._graphs: OrderedDict[Hashable, tuple[K, CudaGraph, Scope]] = OrderedDict()
        # Reentrant: a record() that calls get() meets the scope's own refusal, not a deadlock.
        self._lock = threading.RLock()

    def get(self, key: K) -> CudaGraph:
        """The graph for ``key``: cached, or recorded now by ``record(s, key)``."""
        typed = _typed(key)
        with self._lock:
            try:
                entry = self._graphs.get(typed)
            except TypeError:
                raise SignatureError(
                    f"GraphCache keys must be hashable; got {type(key).__name__}\nhelp: use a tuple, an int or a string"
                ) from None
            if entry is not None and not entry[1].closed:
                self._graphs.move_to_end(typed)
                self.hits += 1
                return entry[1]
            self.misses += 1
            if entry is not None:
                del self._graphs[typed]  # closed by the user: build it again
            del entry
            building = CudaGraph.scope(self.stream, self.order)
            building.opened_by = "GraphCache.get()"  # other threads may launch the cached graphs meanwhile
            with building as s:
                self.record(s, key)
            graph = s.graph
            self._forget_closed()
            self._graphs[typed] = (key, graph, s)
            while len(self._graphs) > self.maxsize:
                _, (_, evicted, scope) = self._graphs.popitem(last=False)
                self.evictions += 1
                _drop(evicted, scope)
            return graph

    def _forget_closed(self) -> None:
        """Drop the graphs the user closed: they hold no slot, so no live graph is evicted for them."""
        for typed in [t for t, (_, graph, _) in self._graphs.items() if graph.closed]:
            del self._graphs[typed]

    def clear(self) -> None:
        """Drop every graph (each closes now unless the user holds it, as on eviction). The counts stay."""
        with self._lock:
            while self._graphs:
                _, (_, graph, scope) = self._graphs.popitem(last=False)
                _drop(graph, scope)

    def __len__(self) -> int:
        with self._lock:
            self._forget_closed()
            return len(self._graphs)

    def __contains__(self, key: object) -> bool:
        try:
            entry = self._graphs.get(_typed(key))
        except TypeError:
            return False
        return entry is not None and not entry[1].closed

    def keys(self) -> list[K]:
        """The cached keys, least recently used first."""
        with self._lock:
            self._forget_closed()
            return [key for key, _, _ in self._graphs.values()]

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:  # copy.copy, copy.deepcopy, pickle
        raise not_copyable(
            "a GraphCache",
            "share the cache itself (get() takes a lock), or make another: sg.GraphCache(stream, record)",
        )

    def __repr__(self) -> str:
        return (
            f"<GraphCache {len(self)}/{self.maxsize} graphs on stream #{self.stream.id}: "
            f"{self.hits} hits, {self.misses} misses, {self.evictions} evictions>"
        )


# Keys kept as they are: an int, a str, bytes, None, and tuples of those or of such tuples (a
# shape, a shape and a name). No value of another type is equal to one of them (True == 1 is, but
# a bool is not kept as it is), and every other key becomes a tuple that starts with a type.
_AS_IS: frozenset[type] = frozenset({int, str, bytes, type(None)})
# A dtype alias (``sg.f32``) is equal to the DType it names: a key's types count it as that DType.
# (An alias that names no dtype is equal to no DType, so nothing is merged.)
_ALIAS = type(_dtypes.f32)


def _exact(key: object) -> bool:
    """Whether ``key`` is kept as it is (see _AS_IS)."""
    kind = type(key)
    return kind in _AS_IS or (
        kind is tuple and (_AS_IS.issuperset(map(type, key)) or all(map(_exact, key)))  # type: ignore[call-overload]
    )


def _typed(key: object) -> Hashable:
    """What the cache compares for ``key``: ``key`` with its types. A key kept as it is stays so
    (see _AS_IS); another tuple, or a frozenset, is ``(type, items)`` with each item's types in
    turn; a dtype, or an alias naming one, the dtype's fields (compared in C, where comparing
    aliases runs typing's __eq__ and DType's); anything else ``(type, key)``. Two of these are
    equal when the keys are (as Python compares them) and so are all their types: ``1``, ``True``
    and ``1.0`` are different keys. Unhashable items stay in: hashing the result raises
    TypeError, as hashing ``key`` would."""
    if _exact(key):
        return key
    kind = type(key)
    if isinstance(key, tuple):
        return (kind, tuple(map(_typed, key)))
    if isinstance(key, frozenset):
        return (kind, frozenset(map(_typed, key)))
    if kind is _ALIAS:  # the dtype it names, found as dtype_of_annotation finds it (without typing's calls)
        for meta in key.__metadata__:  # type: ignore[attr-defined]
            if type(meta) is _dtypes.Names:
                key, kind = meta.dtype, DType
                break
            if isinstance(meta, DType):
                key, kind = meta, DType
                break
    if kind is DType:
        return (DType, key.name, key.numpy, key.ctype)  # type: ignore[attr-defined]
    return (kind, key)


def _drop(graph: CudaGraph, scope: Scope) -> None:
    """The cache lets go of ``graph``: close it now unless someone else (the user) refers to it.
    Then it closes when they are done: ``close()``, or its finalizer once the last reference goes.

    Its references here are the caller's name, this frame's, the argument of getrefcount and
    ``scope`` (a finished scope keeps its graph for ``s.graph``); ``probe`` is referred to in the
    same four ways, so any count above the probe's is a reference from outside."""
    probe = object()
    callers_name = probe
    scopes_reference = [probe]
    if sys.getrefcount(graph) <= sys.getrefcount(probe):
        graph.close()
    del callers_name, scopes_reference, scope


def bucket(n: SupportsIndex, buckets: Iterable[SupportsIndex]) -> int:
    """The smallest of ``buckets`` that is at least ``n``: ``bucket(100, (64, 128, 256)) == 128``."""
    try:
        size = operator.index(n)
    except TypeError:
        raise SignatureError(
            f"sg.bucket() takes an int size, not {type(n).__name__}\n"
            "help: pass e.g. sg.bucket(len(batch), (64, 128, 256))"
        ) from None
    if isinstance(n, bool) or size < 0:
        raise SignatureError(f"sg.bucket() got size {n!r}\nhelp: pass a size >= 0")
    try:
        given = list(buckets)
        if any(isinstance(b, (bool, np.bool_)) for b in given):
            raise TypeError
        sizes = sorted(operator.index(b) for b in given)
    except TypeError:
        raise SignatureError(
            "sg.bucket() takes an iterable of int bucket sizes\nhelp: pass e.g. (64, 128, 256)"
        ) from None
    if sizes and sizes[0] < 1:
        raise SignatureError(f"sg.bucket() got bucket size {sizes[0]}\nhelp: pass positive sizes, e.g. (64, 128, 256)")
    if not sizes:
        raise SignatureError(
            "sg.bucket() got no buckets\nhelp: pass the sizes graphs are recorded for, e.g. (64, 128, 256)"
        )
    for b in sizes:
        if b >= size:
            return b
    raise SignatureError(
        diagnostic(
            f"size {size} is larger than the largest bucket, {sizes[-1]}",
            [f"buckets: {', '.join(map(str, sizes))}"],
            help=f"add a bucket of at least {size}, or split the work into pieces of at most {sizes[-1]}",
        )
    )


def _check_takes_scope_and_key(record: Callable[..., object]) -> None:
    """``record`` is called as ``record(s, key)``: refused here, not at the first miss."""
    try:
        signature = inspect.signature(record)
    except (TypeError, ValueError):  # a builtin without a signature: it fails when called
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise SignatureError(
            diagnostic(
                f"GraphCache's record{signature} cannot be called as record(s, key) ({exc})",
                ["on a miss, cache.get(key) records the key's graph with record(scope, key)"],
                help="give it two positional parameters: the scope to record into, then the key",
            )
        ) from None
