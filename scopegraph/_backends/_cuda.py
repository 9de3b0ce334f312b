"""The CUDA backend, on NVIDIA's cuda.core.

Who owns what:

- Device memory is a cuda.core ``Buffer`` owned by an :class:`~scopegraph._allocation.Allocation`;
  views are the allocation's address plus an offset, passed to kernels and graph nodes as plain
  ints (the graph's pin keeps the memory alive, so cuda.core need not retain anything).
- Memory is allocated on ``allocation_stream`` from the device's stream-ordered pool and released
  by :meth:`CudaBackend.retire` once the allocation is freed or collected: ``memory_stream`` first
  waits (with events) for every stream that used the memory, then frees it in stream order, so
  nothing waits on the host and the pool hands the bytes out again only after that work is done
  (an allocation waits for its own stream only, not for the work that still uses freed memory).
  Borrowed (foreign) memory is not freed; its owner is kept in ``_graveyard`` until the events of
  its users have completed.
- Each kernel launch op caches its bound form (cuda.core ``Kernel``, ``LaunchConfig`` and the
  argument tuple) in ``op.native``, made once, so eager launches and graph building do no
  argument work twice; a launch without tensor arguments belongs to no device and is bound by
  each use (:meth:`CudaBackend.bound`).
- A graph is a cuda.core ``GraphDefinition`` built node by node with the tracker's
  predecessors, instantiated and uploaded once; ``_CudaExecutable`` owns the resulting
  ``Graph`` and closes it (an in-flight replay completes first: the driver defers the free).

The primary context is made current on each thread before its first driver call, so any thread
may use a device.

Only construct this backend when ``_driver.cuda_device_count()`` says a GPU exists.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from cuda.bindings import driver
from cuda.core import Buffer, Event, LaunchConfig, launch
from cuda.core import Device as CoreDevice
from cuda.core import Kernel as CoreKernel
from cuda.core import Stream as CoreStream
from cuda.core.graph import GraphDefinition
from cuda.core.utils import StridedMemoryView

from .._allocation import Export
from .._capture import Captured, check_body_graph
from .._compile import compile_kernel
from .._control import ControlNode, If, LoopLimitError, While, levels, sg_condition
from .._errors import CudaError, LaunchResourceError, ScopeGraphError, ScopeStateError, diagnostic
from .._kernel import MAX_DYNAMIC_SHARED_BYTES, Kernel, KernelLaunch
from .._lifetime import note_eager_use, queued_on
from .._ops import GraphNode, Join, Memcpy, Memset, dup, unknown_kind
from .._pdl import executable_deps
from .._tensor import Tensor

if TYPE_CHECKING:
    from cuda.core.graph import Graph
    from cuda.core.graph import GraphNode as CoreNode

    from .._allocation import Allocation
    from .._scope import RecordedNode
    from .._stream import Stream
    from ._base import Executable

# defer_frees's key for a capture that forbids frees on every thread (threading.get_ident() is never 0).
EVERY_THREAD = 0
_RESULT = re.compile(r"CUDA_ERROR_[A-Z0-9_]+|cudaError[A-Za-z0-9]+")
# The first sticky fault seen in this process: every later failure is a consequence of it.
_context_lost = ""


def _result_name(text: str) -> str:
    """The driver's CUresult name (a runtime ``cudaErrorIllegalAddress`` becomes
    ``CUDA_ERROR_ILLEGAL_ADDRESS``), or "" if the text names none."""
    found = _RESULT.search(text)
    if found is None:
        return ""
    name = found.group(0)
    if name.startswith("cudaError"):
        name = "CUDA_ERROR_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name[len("cudaError") :]).upper()
    return {"CUDA_ERROR_LAUNCH_FAILURE": "CUDA_ERROR_LAUNCH_FAILED"}.get(name, name)


def describe_work(last: tuple[object, Stream] | None) -> str:
    """What was submitted last (an op's name, or a graph's id), for fault messages: formatted
    only when an error needs it, since recording it sits on the launch path. Neither keeps the
    op or the graph alive."""
    if last is None:
        return ""
    work, stream = last
    what = f"graph #{work}" if isinstance(work, int) else f"`{work}`"
    return f"{what} on stream #{stream.id}"


def cuda_error(operation: str, exc: Exception, last_work: str = "") -> CudaError:
    """A CudaError naming the CUresult that cuda.core's exception carries (and, since a fault
    surfaces at a later call, the work submitted last)."""
    global _context_lost
    result = _result_name(str(exc)) or type(exc).__name__
    detail = str(exc)
    if last_work:
        detail += f"\nthe last work submitted before it: {last_work}"
    error = CudaError(operation, result, detail, context_lost=bool(_context_lost))
    if error.context_lost and not _context_lost:
        _context_lost = f"{result} ({operation})"
    elif _context_lost:
        error.add_note(f"the first fault: {_context_lost}")
    return error


class _Built:
    """What building a definition made, beyond its nodes in record order: each recorded node's
    definition node (bodies included), each loop's or branch's condition kernels, the bounded loops."""

    def __init__(self) -> None:
        self.core: dict[RecordedNode, CoreNode] = {}
        # A loop's or branch's kernels that set its condition: (node before it, node at the end of
        # each loop iteration or None, their arguments but the flag's address: handle, counter, limit).
        self.conditions: dict[RecordedNode, tuple[Any, Any, tuple[Any, int, np.int32]]] = {}
        self.bounded: list[While] = []


class _CudaExecutable:
    """An instantiated CUDA graph, with the definition nodes that name its kernels for updates."""

    def __init__(
        self, backend: CudaBackend, graph: Graph, definition: GraphDefinition, nodes: list[CoreNode], top: int
    ) -> None:
        self.backend = backend
        self.graph = graph
        self.definition = definition
        # The definition nodes the graph was instantiated from, by slot (record order, then the
        # bodies' nodes: scopegraph._control.levels): they name its nodes for node updates, also
        # after a whole-graph update (the driver pairs nodes in order).
        self.nodes = nodes
        self.top = top  # the graph's own nodes; the slots from `top` on are in loop and branch bodies
        self._views: dict[Any, Any] = {}  # definition node -> cuda.core executable-node view, made on first update
        # Loops and branches by slot: their condition kernels (see _Built.conditions).
        self.conditions: dict[int, tuple[Any, Any, tuple[Any, int, np.int32]]] = {}
        # With loops or branches: the updates made to the executable's nodes since the definition was
        # last brought up to date, by definition node (see _set).
        self._unsynced: dict[Any, dict[str, Any]] | None = None
        # Whether the driver takes node updates of nodes inside conditional bodies; once it refuses
        # one, those updates are whole-graph updates (see _set), counted in whole_updates.
        self.body_node_updates = True
        self.whole_updates = 0
        # Loops recorded with max_iterations: the GPU stops one at its bound and marks its counter;
        # graph.sync() then calls after_sync, which reports it (see scopegraph._control).
        self.bounded: tuple[While, ...] = ()
        # The counters of bounded loops of recordings this executable no longer runs (into= took
        # a new one), by address, with the error each would raise: replays launched before may
        # have marked them, and the next after_sync still reports that. Only the counter is kept,
        # not the loop's body.
        self.retired: dict[int, tuple[Tensor, LoopLimitError]] = {}

    def launch(self, stream: Stream) -> None:
        backend = self.backend
        backend.keep_current()
        backend.last_work = (stream.last_work, stream)
        try:
            self.graph.launch(stream.native)  # type: ignore[arg-type]
        except Exception as exc:
            raise cuda_error("cuGraphLaunch", exc, describe_work(backend.last_work)) from exc
        if stream.foreign:
            backend.worked_on(stream)

    def close(self) -> None:
        # Garbage collection closes graphs anywhere, also inside a capture (a region's, or another
        # library's): the executable's destruction must not invalidate it.
        with contextlib.suppress(Exception), relaxed_capture_mode():  # after a sticky fault the driver refuses
            self.graph.close()

    # -- changes (scopegraph._params and _rebind) --------------------------------------------

    def update_node(self, index: int, op: GraphNode, values: Mapping[str, np.generic]) -> None:
        """Node update: the node of slot ``index`` (in a body too: scopegraph._control.levels)
        runs ``op`` (the same kind of node, e.g. with new parameter values or new tensors) in the
        replays launched from now on; those already launched are unaffected. A kernel node takes
        its whole argument list again; a loop or branch, its condition kernels with its (new) flag."""
        backend = self.backend
        try:
            if isinstance(op, ControlNode):
                setter, again, (handle, counter, limit) = self.conditions[index]
                if isinstance(op, While) and op.max_iterations is not None:
                    # A new recording's loop (into=) counts in its own counter, to its own bound.
                    self._replace_bounded(tuple(op if _counter_address(b) == counter else b for b in self.bounded))
                    counter, limit = _counter_address(op), np.int32(op.max_iterations)
                    self.conditions[index] = (setter, again, (handle, counter, limit))
                fn, config = backend._condition_kernel()
                flag = op.flag.allocation.address + op.flag.offset
                for node, first, at in ((setter, _FIRST, index), (again, _AGAIN, -1)):  # `again`: in a loop's body
                    if node is not None:
                        self._set(
                            node, {"config": config, "kernel": fn, "args": (handle, flag, counter, limit, first)}, at
                        )
                return
            params = _node_params(backend, op, values)
            if params is not None:  # an empty node (a join, or a 0-byte copy or fill) has nothing to change
                self._set(self.nodes[index], params, index)
        except CudaError:
            raise
        except Exception as exc:
            what = f"updating node {index} (`{op.name}`) of an executable graph"
            raise cuda_error(what, exc, describe_work(backend.last_work)) from exc

    def _set(self, node: Any, params: dict[str, Any], index: int) -> None:
        """Give the executable's ``node`` (of slot ``index``; -1 for a condition kernel in a loop's
        body) these parameters: a node update, or, for a node in a conditional body where the driver
        refuses those, a whole-graph update from the definition with the same change (the
        definition's own nodes take every update made since it was last brought up to date, so the
        whole-graph update changes nothing else)."""
        unsynced = self._unsynced
        in_body = index < 0 or index >= self.top
        if not in_body or self.body_node_updates:
            try:
                view = self._views.get(node)
                if view is None:
                    self.backend.keep_current()
                    view = self._views[node] = self.graph[node]
                view.update(**params)
            except Exception:
                if not in_body:
                    raise
                self.body_node_updates = False  # the driver refuses node updates in bodies: see below
            else:
                if unsynced is not None:
                    unsynced[node] = params
                return
        assert unsynced is not None  # a graph with bodies
        unsynced[node] = params
        for changed, p in unsynced.items():
            changed.update(**p)
        # A refusal leaves the definition holding the refused change: the caller's roll-back
        # (scopegraph._update.update_executable) sets the node's old parameters again, which puts
        # the definition back too.
        self.graph.update(self.definition)  # cuGraphExecUpdate: the same definition, its handles included
        unsynced.clear()
        self.whole_updates += 1

    def update_whole(self, nodes: Sequence[RecordedNode]) -> bool:
        """Whole-graph update from a new recording of the same topology (the caller compared it):
        False when the driver refuses it, and the caller instantiates the recording instead.
        Recordings with loops or branches come by node updates instead (scopegraph._update.take_in_place):
        a new definition would bring new conditional handles, which this graph's condition kernels do not name."""
        backend = self.backend
        backend.make_current()
        with backend.driver_call("building the graph definition"):
            definition = GraphDefinition()
            built = _Built()
            backend._define(definition, nodes, built, False)
        try:
            self.graph.update(definition)  # cuGraphExecUpdate: a refusal leaves a graph we then replace
        except Exception:
            return False
        return True

    def _replace_bounded(self, bounded: tuple[While, ...]) -> None:
        kept = {_counter_address(loop) for loop in bounded}
        self.retired = {address: r for address, r in self.retired.items() if address not in kept} | _counters(
            loop for loop in self.bounded if _counter_address(loop) not in kept
        )
        self.bounded = bounded

    def take_reports_of(self, replaced: Executable) -> None:
        """This executable replaces ``replaced`` (into= rebuilt the graph): overruns of its replays
        are reported by this one's next after_sync."""
        assert isinstance(replaced, _CudaExecutable)  # one graph, one backend
        self.retired = replaced.retired | _counters(replaced.bounded)

    def after_sync(self, last: Stream) -> None:
        """graph.sync(), with the graph's lock held (no replay is enqueued meanwhile): report, and
        reset, the counter of each bounded loop stopped at its bound, once the last replay (on
        ``last``, each replay ordered after the one before) has finished. Only the replays and
        this reset write a counter, so no device-wide sync is needed to read it."""
        if not (self.bounded or self.retired):
            return
        last.sync()
        checked, self.retired = self.retired | _counters(self.bounded), {}
        overrun = [
            (counter, error)
            for counter, error in checked.values()
            if self.backend.read(counter.allocation, counter.offset, counter.nbytes, settle=False).view(np.int32)[1]
        ]
        for counter, _ in overrun:  # each reported once: all reset, the first raised, the others named in it
            self.backend.write(counter, np.zeros(2, np.int32), None)
        if overrun:
            first = overrun[0][1]
            for _, other in overrun[1:]:
                first.add_note(f"also: {str(other).splitlines()[0]}")
            raise first

    # Whether edges between PDL kernels are programmatic in this graph (sm_90+; scopegraph._pdl).
    pdl = False

    def driver_edges(self) -> list[tuple[int, int, bool]]:
        """The graph's edges as the driver has them: (predecessor index, node index, programmatic),
        indices in record order, top level only. Read with cuGraphGetEdges and its edge data
        (cuda.bindings): cuda.core's ``edges()`` raises CUDA_ERROR_LOSSY_QUERY on programmatic edges."""
        from cuda.bindings import driver

        handle = self.definition.handle
        with self.backend.driver_call("cuGraphGetEdges"):
            err, _, _, _, count = driver.cuGraphGetEdges(handle, 0)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuGraphGetEdges: {err.name}")
            err, froms, tos, data, count = driver.cuGraphGetEdges(handle, count)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuGraphGetEdges: {err.name}")
        index = {int(n.handle): i for i, n in enumerate(self.nodes[: self.top])}
        programmatic = int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
        succ: dict[int, list[tuple[int, bool]]] = collections.defaultdict(list)
        for f, t, e in zip(froms[:count], tos[:count], data[:count], strict=True):
            succ[int(f)].append((int(t), int(e.type) == programmatic))
        found = set()
        for start, i in index.items():
            # Nodes the backend adds on its own (a loop's condition kernel) are looked through.
            todo, seen = list(succ[start]), set()
            while todo:
                t, kind = todo.pop()
                if t in index:
                    found.add((i, index[t], kind))
                elif t not in seen:
                    seen.add(t)
                    todo += [(u, False) for u, _ in succ[t]]
        return sorted(found)

    def driver_dot(self) -> str:
        """The driver's own DOT dump of the graph definition."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.dot")
            with self.backend.driver_call("cuGraphDebugDotPrint"):
                self.definition.debug_dot_print(path)
            with open(path) as f:
                return f.read()


class _Loaded(NamedTuple):
    """A kernel loaded on one device, with the launch limits it was compiled to: the driver
    refuses a launch past them, at launch or when a graph of it is built (see _does_not_fit)."""

    fn: CoreKernel
    max_threads: int  # a block's threads: its __launch_bounds__, or what its registers allow
    max_shared: int  # dynamic shared memory: what its static shared memory leaves of shared_limit
    static_shared: int
    registers: int  # a thread's
    # A block's shared memory, static and dynamic: 48 KiB, or what the GPU gives a kernel that
    # opts in (declared max_shared_bytes past 48 KiB).
    shared_limit: int


def _does_not_fit(op: KernelLaunch, loaded: _Loaded, arch: str, registers_per_block: int) -> LaunchResourceError:
    """Why a launch is more than its kernel, as compiled, takes; raised before the driver is asked."""
    threads = op.block[0] * op.block[1] * op.block[2]
    name = op.name
    if threads > loaded.max_threads:
        by_registers = loaded.registers * threads > registers_per_block
        return LaunchResourceError(
            f"launching `{name}`",
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" if by_registers else "CUDA_ERROR_INVALID_VALUE",
            diagnostic(
                f"`{name}` is launched with {threads} threads a block, but as compiled for {arch} it "
                f"takes at most {loaded.max_threads}",
                [
                    f"its {loaded.registers} registers a thread set that limit"
                    if by_registers
                    else "its __launch_bounds__ set that limit"
                ],
                help=f"launch it with at most {loaded.max_threads} threads a block, and more blocks",
            ),
        )
    return LaunchResourceError(
        f"launching `{name}`",
        "CUDA_ERROR_INVALID_VALUE",
        diagnostic(
            f"`{name}` asks for {op.shmem} bytes of dynamic shared memory, but as compiled for {arch} "
            f"it can have at most {loaded.max_shared}",
            [
                f"it has {loaded.static_shared} bytes of static shared memory; static and dynamic share "
                + (
                    "48 KiB"
                    if loaded.shared_limit == MAX_DYNAMIC_SHARED_BYTES
                    else f"the {loaded.shared_limit} bytes this GPU gives a kernel that opts in"
                )
            ],
            help=f"launch it with at most {loaded.max_shared} bytes of dynamic shared memory",
        ),
    )


class CudaBackend:
    name = "cuda"

    def __init__(self, index: int) -> None:
        self.last_work: tuple[object, Stream] | None = None
        self._configs: dict[tuple[Any, ...], LaunchConfig] = {}
        with self.driver_call(f"initialising cuda:{index}"):
            self.core = CoreDevice(index)
            self.make_current()
            self.arch = f"sm_{self.core.arch}"
            # Programmatic edges between PDL kernels need sm_90 (Hopper) or later.
            self.pdl = int(self.core.arch) >= 90
            # Frees are ordered on this stream, after the work of the streams that used the memory
            # (retire). Allocations and host copies with no stream of their own go on another one,
            # and are waited for (a tensor made eagerly is ready for any stream): waiting on this
            # stream would wait for the work that still uses memory freed before.
            self.memory_stream = self.core.create_stream()
            self.allocation_stream = self.core.create_stream()
        # Foreign owners kept alive until the events of the work that used them complete. A deque:
        # retire runs from garbage collection, anywhere, so this takes no lock.
        self._graveyard: collections.deque[tuple[list[Event], object]] = collections.deque()
        # What retire was given while a thread captured (defer_frees): freed when the capture ends.
        self._deferred: collections.deque[tuple[object, set[object], bool]] = collections.deque()
        self._deferring: dict[int, int] = {}  # thread id (or EVERY_THREAD) -> captures open on it
        self._deferring_lock = threading.Lock()
        # Other libraries' streams (from_handle), each with the event after scopegraph's last
        # work on it (None before any): a wait for such a stream once its library captures it
        # waits for that event, as a wait for the stream itself would join the capture (_waitable).
        self._foreign: weakref.WeakKeyDictionary[object, Event | None] = weakref.WeakKeyDictionary()

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread. Always switches:
        another library (``torch.cuda.set_device``) may have made another GPU's context current
        on this thread since, and allocations, copies to the host and graph builds act on the
        current context."""
        self.core.set_current()
        _current.backend = self

    def keep_current(self) -> None:
        """make_current() for the hot paths (eager launches, graph replays, stream waits), which
        name their stream and so act in its context: switches only when scopegraph's last switch
        on this thread was to another GPU."""
        if getattr(_current, "backend", None) is not self:
            self.core.set_current()
            _current.backend = self

    @contextlib.contextmanager
    def driver_call(self, operation: str) -> Iterator[None]:
        """Turn any failure of cuda.core or the driver into a CudaError (for paths off the hot loop)."""
        try:
            yield
        except ScopeGraphError:  # CudaError, and a capture's or a collective's own errors (scopegraph._capture)
            raise
        except Exception as exc:
            raise cuda_error(operation, exc, describe_work(self.last_work)) from exc

    # -- memory ---------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> tuple[object, int]:
        self.make_current()
        # Relaxed: scopegraph's own streams are never captured, so allocating while another
        # library captures (PyTorch, on this thread or another) leaves that capture valid.
        with self.driver_call(f"allocating {nbytes} bytes on cuda:{self.core.device_id}"), relaxed_capture_mode():
            self._bury()
            buf = self.core.allocate(max(nbytes, 1), stream=self.allocation_stream)
            self.allocation_stream.sync()
        return buf, int(buf.handle)

    def retire(self, storage: object, users: set[object], borrowed: bool) -> None:
        """Release memory after the work ``users`` stand for (streams, and marks of closed graphs'
        replays; for a foreign stream being captured, the event after scopegraph's work there),
        or queue it while a region's capture forbids this thread the calls (``defer_frees``).
        Runs from free() and from garbage collection, so it never raises: if the ordering cannot
        be set up (another thread adding a user meanwhile, a stream already gone), it falls back
        to waiting for the whole device, which is slow but never frees memory early."""
        if self._capturing():
            self._deferred.append((storage, users, borrowed))
            return
        # Relaxed: garbage collection frees anywhere, also while another library captures
        # (PyTorch's torch.cuda.graph), whose capture these calls, on streams it does not capture,
        # would otherwise invalidate.
        with relaxed_capture_mode():
            try:
                self.make_current()
                waited = [w for w in map(self._waitable, list(users)) if w is not None]
                if borrowed:
                    events = [w if isinstance(w, Event) else w.record() for w in waited]  # type: ignore[attr-defined]
                    self._graveyard.append((events, storage))
                    self._bury()
                    return
                for w in waited:
                    self.memory_stream.wait(w)  # type: ignore[arg-type]
            except Exception:
                with contextlib.suppress(Exception):  # after a sticky fault nothing works; the process is ending
                    self.core.sync()
            with contextlib.suppress(Exception):
                storage.close(self.memory_stream)  # type: ignore[attr-defined]

    def defer_frees(self, every_thread: bool = False) -> int:
        """While this thread captures foreign work (a captured region), memory that garbage
        collection lets go of on it is queued, not freed: retire's stream waits, event records and
        frees are calls a capture forbids on its thread, and one would invalidate the user's
        capture. A capture in mode "global" forbids them on every thread of the process, so then
        every thread's frees wait. Returns what resume_frees (which may run on another thread) takes."""
        thread = EVERY_THREAD if every_thread else threading.get_ident()
        with self._deferring_lock:
            self._deferring[thread] = self._deferring.get(thread, 0) + 1
        return thread

    def resume_frees(self, thread: int) -> None:
        """The capture whose defer_frees returned ``thread`` has ended: free what was queued."""
        with self._deferring_lock:
            left = self._deferring.get(thread, 0) - 1
            if left > 0:
                self._deferring[thread] = left
                return
            self._deferring.pop(thread, None)
        # Each queued free once: retire queues it again while another capture still forbids it
        # (a global one, or the one of the thread that queued it, if that thread drains).
        for _ in range(len(self._deferred)):
            try:  # another thread whose capture ended may drain the queue at the same time
                storage, users, borrowed = self._deferred.popleft()
            except IndexError:
                return
            self.retire(storage, users, borrowed)

    def _waitable(self, user: object) -> object | None:
        """What a wait for ``user`` (a stream that ran work on some memory, or a mark) waits for:
        ``user`` itself, except for another library's stream that the library captures now,
        where it is the event after scopegraph's last work there (None: there was none). A wait
        for the capturing stream itself would join scopegraph's waiting stream to the capture:
        its next work would be captured, never run."""
        if isinstance(user, Event) or user not in self._foreign:
            return user
        if self.captures(int(user.handle)):  # type: ignore[attr-defined]
            return self._foreign[user]
        return user

    def worked_on(self, stream: Stream) -> None:
        """Scopegraph has just queued work on another library's stream: note the event after it.
        Never raises (it runs after a failed launch too): without the event a later wait falls
        back to the one before."""
        with contextlib.suppress(Exception):
            self._foreign[stream.native] = stream.native.record()  # type: ignore[attr-defined]

    def _bury(self) -> None:
        """Drop the foreign owners whose users have finished."""
        graveyard = self._graveyard
        for _ in range(len(graveyard)):
            try:
                entry = graveyard.popleft()
            except IndexError:
                return
            if not all(e.is_done for e in entry[0]):
                graveyard.append(entry)

    def _view(self, tensor: Tensor, owner: object = None) -> Buffer:
        """A non-owning Buffer over a tensor's bytes, keeping ``owner`` (by default the allocation)
        alive while it lives."""
        alloc = tensor.allocation
        return Buffer.from_handle(alloc.address + tensor.offset, tensor.nbytes, owner=owner or alloc)

    def read(
        self, alloc: Allocation, offset: int, nbytes: int, settle: bool = True
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Copy device memory to the host, after whatever may still write it (``settle=False``: the
        caller has waited for every writer itself)."""
        host = np.empty(nbytes, np.uint8)
        if nbytes:
            self.make_current()
            # Relaxed, as allocate: inside a region, _settle waits for the writers, not the device.
            with self.driver_call("copying device memory to the host"), relaxed_capture_mode():
                if settle:
                    self._settle(alloc, self.allocation_stream)
                src = Buffer.from_handle(alloc.address + offset, nbytes, owner=alloc)
                Buffer.from_handle(host.ctypes.data, nbytes, owner=host).copy_from(src, stream=self.allocation_stream)
                self.allocation_stream.sync()
        return host

    def write(self, tensor: Tensor, array: np.ndarray[Any, Any], stream: Stream | None) -> None:
        host = np.ascontiguousarray(array, dtype=tensor.dtype.numpy)
        if not tensor.nbytes:
            return
        self.make_current()
        core_stream: CoreStream = stream.native if stream is not None else self.allocation_stream  # type: ignore[assignment]
        # Relaxed on scopegraph's own streams, as allocate.
        relaxed = relaxed_capture_mode() if stream is None or not stream.foreign else contextlib.nullcontext()
        with self.driver_call("copying host memory to the device"), relaxed:
            self._view(tensor).copy_from(
                Buffer.from_handle(host.ctypes.data, tensor.nbytes, owner=host), stream=core_stream
            )
            # Pageable host memory: wait, so the caller may reuse `array` at once.
            core_stream.sync()

    # -- streams --------------------------------------------------------------------------

    def create_stream(self) -> object:
        self.make_current()
        with self.driver_call("creating a stream"):
            return self.core.create_stream()

    def stream_from_handle(self, obj: object) -> tuple[object, int]:
        """A cuda.core Stream for a foreign stream, and the index of the device it belongs to."""
        self.make_current()
        with self.driver_call("wrapping a foreign stream"):
            if int(obj.__cuda_stream__()[1]) == 0:  # type: ignore[attr-defined]
                obj = _LEGACY_DEFAULT_STREAM
            native = obj if isinstance(obj, CoreStream) else self.core.create_stream(obj)
            self._foreign.setdefault(native, None)
            return native, int(native.device.device_id)

    def sync_stream(self, stream: Stream) -> None:
        self.make_current()
        # Relaxed, as allocate: Stream.sync refuses a foreign stream that another library captures.
        with self.driver_call(f"synchronising stream #{stream.id}"), relaxed_capture_mode():
            stream.native.sync()  # type: ignore[attr-defined]

    def wait_stream(self, waiter: object, waited: object) -> None:
        """``waiter`` waits (with an event, not the host) for the work queued on ``waited`` so far
        (a stream, or a mark); for another library's stream that the library captures now, for
        scopegraph's own work queued there before (``_waitable``)."""
        self.keep_current()
        target = self._waitable(waited)
        if target is None:
            return  # nothing of scopegraph's was queued there
        with self.driver_call("ordering two streams"):
            waiter.wait(target)  # type: ignore[attr-defined]

    def sync(self) -> None:
        if self._deferring:  # a device-wide synchronisation waits for the capturing stream too
            raise ScopeStateError(
                diagnostic(
                    "cannot synchronise the device while a captured region is being recorded",
                    ["a device-wide synchronisation would invalidate the region's capture, on any thread"],
                    help="synchronise the streams you used (stream.sync(), graph.sync()), or wait for "
                    "the region's `with` block to end",
                )
            )
        self.make_current()
        with self.driver_call("synchronising the device"):
            self.core.sync()

    def mark(self, stream: object) -> object:
        """An event recorded on ``stream`` after the work queued on it so far: bookkeeping that
        keeps it, not the stream, lets the stream go and can drop it once it has passed. For
        another library's stream that it captures now, the event after scopegraph's own work
        there (``_waitable``; an event recorded there would be part of the capture). The stream
        itself while a region's capture forbids events to this thread (garbage collection closes
        graphs anywhere), while a captured stream has no such event, or when the record fails
        (after a sticky fault): never raises, for it runs from finalizers."""
        if self._capturing():
            return stream
        try:
            self.keep_current()
            waited = self._waitable(stream)
            if waited is not stream:  # a foreign stream being captured: the event after our work
                return stream if waited is None else waited
            with relaxed_capture_mode():
                return stream.record()  # type: ignore[attr-defined]
        except Exception:
            return stream

    def captures(self, handle: int) -> bool:
        """Whether the stream ``handle`` (a raw cudaStream_t) is being captured into a CUDA graph
        now; also True for the legacy default stream while another stream captures (work there
        would synchronise with the capture, which invalidates it). Another failure of the query
        says False: the work that follows reports it. cuda.bindings: cuda.core 1.2 has no
        capture status of a stream."""
        status, capture = driver.cuStreamIsCapturing(handle)
        if status == _SUCCESS:
            return bool(capture != _NOT_CAPTURING)
        return bool(status == _CAPTURE_IMPLICIT)

    def finished(self, mark: object) -> bool:
        """Whether ``mark``'s work has completed: an event that has passed (an answer that stays
        true). A stream never counts here (see ``idle``), and nothing is asked while a region's
        capture forbids this thread the query (see ``_capturing``). Never raises."""
        if not isinstance(mark, Event) or self._capturing():
            return False
        try:
            with relaxed_capture_mode():
                return bool(mark.is_done)
        except Exception:
            return False

    def idle(self, stream: object) -> bool:
        """Whether one of scopegraph's own streams has nothing left to run: an answer that may go
        stale the moment after (see ``_lifetime.let_finished_users_go``). Never an event, never
        another library's stream (a query of a stream it captures would break the capture), and
        nothing is asked while a region's capture forbids this thread the query. Never raises."""
        if isinstance(stream, Event) or self._capturing() or stream in self._foreign:
            return False
        try:
            with relaxed_capture_mode():
                return _finished_now(stream)
        except Exception:
            return False

    def _capturing(self) -> bool:
        """Whether a capture forbids this thread the driver's stream and event calls now."""
        deferring = self._deferring
        return bool(deferring) and (EVERY_THREAD in deferring or threading.get_ident() in deferring)

    # -- eager ops ------------------------------------------------------------------------

    def prepare(self, op: GraphNode) -> None:
        if type(op) is KernelLaunch:
            if op.native is None:
                self.bound(op)
        elif not op.built_in:  # off the hot path: kernel launches are scopegraph's own kind
            raise unknown_kind(op)

    def bound(self, op: KernelLaunch) -> tuple[Any, Any, tuple[Any, ...]]:
        """The launch's cuda.core form on this device, kept in ``op.native`` when the op has a
        device. A launch without tensor arguments has none (``op.device`` is None): it may run on
        any GPU, and the form of one GPU's loaded kernel would be an invalid handle on another."""
        native = self._bind(op)
        if op.device is not None:
            op.native = native
        return native

    def _load(self, kernel: Kernel[Any]) -> _Loaded:
        """The kernel compiled and loaded for this device (once), with its launch limits."""
        loaded: _Loaded | None = kernel.compiled.get(self)
        if loaded is None:
            code = compile_kernel(kernel, self.arch)
            self.make_current()
            with self.driver_call(f"loading kernel `{kernel.name_expression}`"), relaxed_capture_mode():
                fn = code.get_kernel(kernel.name_expression)
                attributes = fn.attributes[self.core.device_id]  # this device's, whichever is current
                static = attributes.shared_size_bytes
                limit = MAX_DYNAMIC_SHARED_BYTES
                max_shared = min(attributes.max_dynamic_shared_size_bytes, limit - static)
                if kernel.max_shared_bytes > limit:  # it opts in to more (see sg.kernel)
                    limit = self.core.properties.max_shared_memory_per_block_optin
                    max_shared = min(kernel.max_shared_bytes, limit - static)
                    # The GPU's whole limit, whatever this declaration asks: another declaration of
                    # the same code shares the loaded kernel, and must not lower what it was given.
                    _allow_dynamic_shared(fn, limit - static, self.core.device_id)
                loaded = kernel.compiled[self] = _Loaded(
                    fn, attributes.max_threads_per_block, max_shared, static, attributes.num_regs, limit
                )
        return loaded

    def _bind(self, op: KernelLaunch) -> tuple[Any, Any, tuple[Any, ...]]:
        """The cuda.core form of a launch: (Kernel, LaunchConfig, args with pointers as ints)."""
        loaded = op.kernel.compiled.get(self) or self._load(op.kernel)
        block = op.block
        if block[0] * block[1] * block[2] > loaded.max_threads or op.shmem > loaded.max_shared:
            raise _does_not_fit(op, loaded, self.arch, self.core.properties.max_registers_per_block)
        fn = loaded.fn
        # One LaunchConfig per launch shape, made once (building ops is a hot path: issue 11).
        shape = (op.grid, op.block, op.shmem)
        config = self._configs.get(shape)
        if config is None:
            if len(self._configs) > 4096:
                self._configs.clear()
            with self.driver_call(f"configuring `{op.name}`[{op.grid}, {op.block}]"):
                config = self._configs[shape] = LaunchConfig(grid=op.grid, block=op.block, shmem_size=op.shmem)
        # sg.Params bound to their defaults (a graph's node update binds its own values).
        values = op.resolved(None) if op.params else op.args
        # a._alloc: the allocation, without the property call (recording binds every launch).
        args = tuple([a._alloc.address + a.offset if isinstance(a, Tensor) else a for a in values])
        return fn, config, args

    def run(self, op: GraphNode, stream: Stream) -> None:
        self.keep_current()
        native_stream = stream.native
        borrows = op.borrows
        if borrows:
            note_eager_use(borrows, native_stream, self)
        stream.last_work = name = op.name
        self.last_work = (name, stream)
        try:  # the next replays of the graphs that pin the memory wait for this work, once enqueued
            if isinstance(op, Captured):  # a collective (scopegraph._collectives); regions never run eagerly
                op.run_cuda(self, native_stream)
                return
            try:
                if type(op) is KernelLaunch:
                    fn, config, args = op.native or self.bound(op)
                    launch(native_stream, config, fn, *args)  # type: ignore[arg-type]
                # Copies and fills through the driver with raw addresses: cuda.core 1.2 copies and fills
                # only between Buffer objects, and two Buffer wrappers per eager call cost more than the
                # copy's own launch. note_eager_use above keeps the memory alive for the queued work.
                elif isinstance(op, Memcpy):
                    dst, src = op.dst, op.src
                    if dst.nbytes:
                        (err,) = driver.cuMemcpyAsync(
                            dst.allocation.address + dst.offset,
                            src.allocation.address + src.offset,
                            dst.nbytes,
                            native_stream.handle,  # type: ignore[attr-defined]
                        )
                        if err != _SUCCESS:
                            raise RuntimeError(f"cuMemcpyAsync: {err.name}")
                elif isinstance(op, Memset):
                    dst = op.dst
                    if dst.nbytes:
                        pattern = op.pattern  # 1, 2 or 4 bytes (Memset refuses anything else)
                        width = len(pattern)
                        (err,) = _MEMSET[width](
                            dst.allocation.address + dst.offset,
                            int.from_bytes(pattern, "little"),
                            dst.nbytes // width,
                            native_stream.handle,  # type: ignore[attr-defined]
                        )
                        if err != _SUCCESS:
                            raise RuntimeError(f"cuMemsetD{8 * width}Async: {err.name}")
            except CudaError:
                raise
            except Exception as exc:
                raise cuda_error(
                    f"running `{op.name}` on stream #{stream.id}", exc, describe_work(self.last_work)
                ) from exc
        finally:
            # The event after this work first: once queued_on makes the stream pending, another
            # thread's replay may wait for it, by that event while another library captures it.
            if stream.foreign:
                self.worked_on(stream)
            if borrows:
                queued_on(borrows, native_stream)

    # -- graphs ---------------------------------------------------------------------------

    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> _CudaExecutable:
        self.make_current()
        # Relaxed: loading kernels and instantiating touch no stream, so a graph built while
        # another library captures (PyTorch, on this thread or another) leaves that capture valid.
        with self.driver_call("building the graph definition"), relaxed_capture_mode():
            definition = GraphDefinition()
            built = _Built()
            self._define(definition, nodes, built, False)
        with self.driver_call("instantiating the graph"), relaxed_capture_mode():
            graph = definition.instantiate()
            if not (stream.foreign and stream.captured):  # (the upload only saves the first launch's)
                graph.upload(stream.native)  # type: ignore[arg-type]
        flat, _ = levels(nodes)
        core = built.core
        executable = _CudaExecutable(self, graph, definition, [core[rec] for rec in flat], len(nodes))
        if built.conditions:  # loops or branches (empty bodies too): their nodes can be updated too
            slot = {rec: i for i, rec in enumerate(flat)}
            executable.conditions = {slot[rec]: made for rec, made in built.conditions.items()}
            executable._unsynced = {}
        executable.bounded = tuple(built.bounded)
        executable.pdl = self.pdl
        return executable

    def _define(self, definition: GraphDefinition, nodes: Sequence[RecordedNode], built: _Built, in_body: bool) -> None:
        """Add ``nodes`` to ``definition`` (the graph, or a loop or branch body: ``in_body``) with
        their edges; each recorded node's definition node goes into ``built.core``."""
        made: list[CoreNode] = []
        # Edges that other edges imply are left out of the driver's graph (see _tracker.without_implied).
        direct = executable_deps(nodes)
        # Edges between PDL kernels (scopegraph._pdl) are added as programmatic edges after the
        # nodes; below sm_90 they are full edges like the rest.
        programmatic = self.pdl and any(rec.programmatic for rec in nodes)
        for rec, all_deps in zip(nodes, direct, strict=True):
            deps = all_deps - rec.programmatic if programmatic and rec.programmatic else all_deps
            if len(deps) == 1:
                (only,) = deps
                parent: Any = made[only]
            else:
                parent = definition
            if isinstance(rec.op, ControlNode):
                preds = [made[d] for d in deps] if len(deps) > 1 else []
                node = self._add_control(definition, parent, preds, rec, built)
            else:
                node = self._add_node(parent, rec.op, in_body)
                if len(deps) > 1:
                    node.pred = [made[d] for d in deps]
            made.append(node)
            built.core[rec] = node
        if programmatic:
            kept = [rec.programmatic & deps for rec, deps in zip(nodes, direct, strict=True)]
            _add_programmatic_edges(definition, made, kept)

    def _add_node(self, parent: Any, op: GraphNode, in_body: bool) -> CoreNode:
        if type(op) is KernelLaunch:
            fn, config, args = op.native or self.bound(op)
            return parent.launch(config, fn, *args)  # type: ignore[no-any-return]
        if isinstance(op, Captured):  # foreign work or a collective: a child-graph node (scopegraph._capture)
            child = op.child(self)
            if in_body:  # a region was checked when its block ended; a collective is captured only now
                check_body_graph(op, child.handle)
            return parent.embed(child)  # type: ignore[no-any-return]
        params = _node_params(self, op, _NO_VALUES)
        if params is None:
            # A 0-byte copy or fill is no work (the driver refuses it as a node): an empty node keeps the edges.
            assert isinstance(op, (Join, Memcpy, Memset))
            return parent.empty() if isinstance(parent, GraphDefinition) else parent.join()
        if isinstance(op, Memcpy):
            return parent.memcpy(params["dst"], params["src"], params["size"])  # type: ignore[no-any-return]
        return parent.memset(params["dst"], params["value"], params["width"])  # type: ignore[no-any-return]

    # -- loops and branches (scopegraph._control) -------------------------------------------

    def _add_control(
        self, definition: GraphDefinition, parent: Any, preds: list[CoreNode], rec: RecordedNode, built: _Built
    ) -> CoreNode:
        """A conditional node for a loop or branch, after a one-thread kernel that sets its condition
        from the flag; a loop's body ends with the same kernel, after the body's last writes of the flag."""
        op = rec.op
        assert isinstance(op, ControlNode)
        condition = definition.create_condition(default_value=0)
        try:
            handle: Any = np.uint64(int(condition.handle))  # the CUgraphConditionalHandle, a u64 kernel argument
        except (TypeError, ValueError):
            handle = condition  # cuda.core unwraps a GraphCondition passed as a kernel argument itself
        fn, config = self._condition_kernel()
        flag = op.flag.allocation.address + op.flag.offset
        counter, limit = 0, np.int32(-1)
        if isinstance(op, While) and op.max_iterations is not None:
            counter = _counter_address(op)
            limit = np.int32(op.max_iterations)
            built.bounded.append(op)
        setter = parent.launch(config, fn, handle, flag, counter, limit, _FIRST)
        if preds:
            setter.pred = preds
        again: Any = None
        if isinstance(op, While):
            node = setter.while_loop(condition)
            body = node.body
            self._define(body, op.body.nodes, built, True)
            made = [built.core[n] for n in op.body.nodes]
            deps = op.body.condition_deps
            last: Any = made[next(iter(deps))] if len(deps) == 1 else body
            again = last.launch(config, fn, handle, flag, counter, limit, _AGAIN)
            if len(deps) > 1:
                again.pred = [made[d] for d in deps]
        else:
            assert isinstance(op, If)
            node = setter.if_then(condition) if op.otherwise is None else setter.if_else(condition)
            branches = [(node.then, op.then)] + ([] if op.otherwise is None else [(node.else_, op.otherwise)])
            for graph, body_records in branches:
                records = body_records.nodes
                self._define(graph, records, built, True)
                if not records:
                    graph.empty()  # a branch with nothing in it still needs a graph the driver accepts
        built.conditions[rec] = (setter, again, (handle, counter, limit))
        return node  # type: ignore[no-any-return]

    def _condition_kernel(self) -> tuple[CoreKernel, LaunchConfig]:
        """The condition kernel, loaded, and its one-thread launch."""
        fn = self._load(sg_condition).fn
        config = self._configs.get(((1, 1, 1), (1, 1, 1), 0))
        if config is None:
            config = self._configs[((1, 1, 1), (1, 1, 1), 0)] = LaunchConfig(grid=1, block=1)
        return fn, config

    # -- interop --------------------------------------------------------------------------

    def _users_of(self, alloc: Allocation) -> set[object]:
        """Every stream or mark whose work may touch ``alloc``'s memory: its users (eager streams,
        marks of closed graphs' replays) and the streams live graphs that pin it were replayed on."""
        found: set[object] = set()
        for a in alloc.aliases():
            found |= a.users
            for pin in list(a.pins.values()):  # a copy: other threads record and close meanwhile
                found |= pin.replayed_on
        return found

    def _settle(self, alloc: Allocation, stream: CoreStream) -> None:
        """Order ``stream`` after the work that may write ``alloc``: a device-wide sync (which also
        covers other libraries' work on wrapped memory), except while a thread captures a region,
        whose capture a device-wide sync would break: then ``stream`` waits for scopegraph's own
        users of the memory (eager streams, replays)."""
        if EVERY_THREAD in self._deferring:
            raise ScopeStateError(
                diagnostic(
                    'cannot wait for device memory while a region captures in mode="global"',
                    ["a global capture forbids every thread's synchronisation until it ends"],
                    help='read it after the region\'s block ends, or capture with mode="thread_local" (the default)',
                )
            )
        if self._deferring:
            for user in self._users_of(alloc):
                self.wait_stream(stream, user)
        else:
            self.core.sync()

    def relaxed(self) -> AbstractContextManager[None]:
        return relaxed_capture_mode()

    def _finish_queued_work(self, alloc: Allocation) -> None:
        """Wait on the host for the work queued on ``alloc``'s memory, during another library's
        capture: relaxed (a synchronisation is a call the capture forbids, but it touches no
        capturing stream). For a stream being captured, which cannot be waited for, the event
        after scopegraph's own work there (``_waitable``)."""
        with relaxed_capture_mode(), self.driver_call("waiting for the work on exported memory"):
            for user in self._users_of(alloc):
                waited = self._waitable(user)
                if waited is not None:
                    waited.sync()  # type: ignore[attr-defined]

    def ready_stream(self, alloc: Allocation) -> int | None:
        """A stream on which all work queued on ``alloc`` is complete, for ``__cuda_array_interface__``;
        None when that work has finished already. Consumers synchronise the stream on the host
        (CuPy does), which a capture in progress forbids (PyTorch synchronises the device before
        it begins one, so its capture then gets None); the queries run relaxed for that reason."""
        with relaxed_capture_mode():
            pending = [w for w in map(self._waitable, self._users_of(alloc)) if w is not None and not _finished_now(w)]
        if not pending:
            return None
        for waited in pending:
            self.wait_stream(self.memory_stream, waited)
        return int(self.memory_stream.handle)

    def dlpack(self, tensor: Tensor, stream: int | None, options: dict[str, Any], writable: bool) -> object:
        if options.get("copy"):
            # cuda.core exports only aliases, so the copy is scopegraph's own: a new allocation that
            # the capsule keeps alive (through the Buffer's owner), made after the work queued on the
            # tensor on any stream, and complete before it is exported.
            setup = tensor.device.setup_stream
            for user in self._users_of(tensor.allocation):
                self.wait_stream(setup.native, user)
            tensor = setup.run(dup(tensor, name=f"copy of {tensor.name}"))
            setup.sync()
            options, writable = {**options, "copy": None}, True  # the consumer's own memory
        if stream is not None and stream != -1:
            if self.captures(stream):
                # Another library captures there (torch.from_dlpack(t) inside torch.cuda.graph):
                # nothing it captures runs now, and its capture cannot wait for work outside it, so
                # the work queued on the memory is waited for here, on the host, once.
                self._finish_queued_work(tensor.allocation)
            else:
                consumer = CoreStream.from_handle(stream)
                for user in self._users_of(tensor.allocation):
                    self.wait_stream(consumer, user)
        elif stream is None:  # DLPack's None: the consumer gives no stream, so the data must be complete
            self._settle(tensor.allocation, self.memory_stream)
            self.memory_stream.sync()
        # cuda.core would drop the read-only flag from an unversioned capsule: Tensor.__dlpack__
        # refuses those for frozen tensors.
        # Owned by an Export as long as the consumer's array lives: free() refuses meanwhile.
        view = StridedMemoryView.from_buffer(
            self._view(tensor, Export.of(tensor, writable)),
            tensor.shape,
            dtype=tensor.dtype.numpy,
            is_readonly=not writable,
        )
        try:
            return view.__dlpack__(stream=-1, **options)
        finally:
            del view  # a refused export, its traceback kept, must not hold the Export

    def dlpack_device(self) -> tuple[int, int]:
        return (2, int(self.core.device_id))  # kDLCUDA


def _add_programmatic_edges(
    definition: GraphDefinition, made: Sequence[CoreNode], programmatic: Sequence[frozenset[int]]
) -> None:
    """Add the programmatic edges (``programmatic[i]``: node i's predecessors over such edges) as
    programmatic dependencies (DESIGN.md section 7).

    cuda.bindings, not cuda.core: cuda.core 1.2 makes only full edges (``pred``/``succ``,
    ``join``) and ignores ``LaunchConfig(programmatic_stream_serialization=True)`` on graph
    nodes, so the edge data (from the kernel node's programmatic port) needs the driver call. Added
    after every node exists: once a graph has such edges, cuda.core's ``edges()``, ``pred`` and
    ``succ`` raise CUDA_ERROR_LOSSY_QUERY (scopegraph reads edges from its own records, and
    ``_CudaExecutable.driver_edges`` asks the driver with the edge data)."""
    from cuda.bindings import driver

    edge = driver.CUgraphEdgeData()
    edge.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
    edge.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
    froms, tos = [], []
    for i, preds in enumerate(programmatic):
        for d in sorted(preds):
            froms.append(made[d].handle)
            tos.append(made[i].handle)
    (err,) = driver.cuGraphAddDependencies(definition.handle, froms, tos, [edge] * len(froms), len(froms))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuGraphAddDependencies (programmatic edges): {err.name}")


# The backend whose context scopegraph last made current on each thread (CudaBackend.make_current).
_current = threading.local()


def _allow_dynamic_shared(fn: CoreKernel, nbytes: int, device_id: int) -> None:
    """Let launches of ``fn`` on this device have ``nbytes`` of dynamic shared memory (past the
    48 KiB every kernel gets). cuda.bindings, not cuda.core: cuda.core 1.2's kernel attributes
    are read-only (``Kernel.attributes``), and the driver refuses a larger launch until this is set."""
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = fn.handle
    if isinstance(handle, driver.CUkernel):  # loaded through a library: per device
        (err,) = driver.cuKernelSetAttribute(attribute, nbytes, handle, device_id)
    else:  # a module's function: this context's
        (err,) = driver.cuFuncSetAttribute(handle, attribute, nbytes)
    if err != _SUCCESS:
        raise RuntimeError(f"setting the dynamic shared memory of a kernel to {nbytes} bytes: {err.name}")


def _node_params(backend: CudaBackend, op: GraphNode, values: Mapping[str, np.generic]) -> dict[str, Any] | None:
    """What a kernel, copy or fill node is given (when made, and again by a node update), as
    cuda.core's node ``update`` takes it; sg.Params take ``values`` (or their defaults). None for
    a node with nothing to give: a join, a 0-byte copy or fill (an empty node)."""
    if type(op) is KernelLaunch:
        fn, config, args = op.native or backend.bound(op)
        if op.params and values:
            resolved = list(args)
            for i, p in op.params:
                resolved[i] = values.get(p.name, p.default)
            args = tuple(resolved)
        return {"config": config, "kernel": fn, "args": args}
    if isinstance(op, Memcpy) and op.dst.nbytes:
        dst, src = op.dst, op.src
        return {
            "dst": dst.allocation.address + dst.offset,
            "src": src.allocation.address + src.offset,
            "size": dst.nbytes,
        }
    if isinstance(op, Memset) and op.dst.nbytes:
        dst, pattern = op.dst, op.pattern
        return {
            "dst": dst.allocation.address + dst.offset,
            "value": _fill_value(pattern),
            "width": dst.nbytes // len(pattern),
        }
    return None


_NO_VALUES: dict[str, np.generic] = {}
# The condition kernel's `first` argument: before a loop or branch, and at the end of a loop's iteration.
_FIRST, _AGAIN = np.int32(1), np.int32(0)


def _counter_address(loop: While) -> int:
    """Where a bounded loop counts its iterations (scopegraph._control.sg_condition)."""
    assert loop.counter is not None  # a loop with max_iterations has a counter
    return loop.counter.allocation.address + loop.counter.offset


class _LegacyDefault:
    """CU_STREAM_LEGACY (handle 1), wrapped where a foreign stream's handle is 0: torch and CuPy
    mean the legacy default stream by 0, but with CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1
    cuda.bindings would read 0 as the calling thread's per-thread stream (see Stream.from_handle)."""

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 1)


_LEGACY_DEFAULT_STREAM = _LegacyDefault()


def _counters(loops: Iterable[While]) -> dict[int, tuple[Tensor, LoopLimitError]]:
    """Bounded loops' counters by address, each with the error its overrun raises."""
    found: dict[int, tuple[Tensor, LoopLimitError]] = {}
    for loop in loops:
        assert loop.counter is not None  # a bounded loop has a counter
        found[_counter_address(loop)] = (loop.counter, loop.limit_error(0))
    return found


def _fill_value(pattern: bytes) -> int | bytes:
    """cuda.core takes an int for a 1-byte fill and a buffer of 2 or 4 bytes otherwise."""
    return pattern[0] if len(pattern) == 1 else pattern


_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NOT_CAPTURING = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_CAPTURE_IMPLICIT = driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT


def _finished_now(waited: object) -> bool:
    """Whether the work a stream or an event stands for has completed (an idle stream).
    cuda.bindings for the stream: cuda.core 1.2's Stream has no query."""
    if isinstance(waited, Event):
        return bool(waited.is_done)
    (status,) = driver.cuStreamQuery(int(waited.handle))  # type: ignore[attr-defined]
    return bool(status == _SUCCESS)


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """Let this thread make calls that CUDA forbids during a stream capture but that touch no
    capturing stream: allocations, frees and synchronisations on scopegraph's own streams, event
    records and queries outside any capture, loading kernels, instantiating and destroying
    executable graphs. Another library's capture in CUDA's default global mode (PyTorch's
    ``torch.cuda.graph``), on any thread, and a capture on this thread, are invalidated by such a
    call unless this thread is in relaxed mode (PyTorch's allocator does the same around its event
    queries). cuda.bindings: cuda.core 1.2 has no cuThreadExchangeStreamCaptureMode."""
    try:  # never raises: finalizers use it
        status, previous = driver.cuThreadExchangeStreamCaptureMode(_RELAXED)
    except Exception:
        status = previous = None
    try:
        yield
    finally:
        if status == driver.CUresult.CUDA_SUCCESS:
            with contextlib.suppress(Exception):
                driver.cuThreadExchangeStreamCaptureMode(previous)


_RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED

# The eager fill for each pattern width: (address, value, count of units, stream). The pattern's
# bytes are in memory order; the driver stores its value in the device's (little-endian) order.
_MEMSET = {1: driver.cuMemsetD8Async, 2: driver.cuMemsetD16Async, 4: driver.cuMemsetD32Async}
