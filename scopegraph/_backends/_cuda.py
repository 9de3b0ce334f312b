"""The CUDA backend, on NVIDIA's cuda.core.

Who owns what:

- Device memory is a cuda.core ``Buffer`` owned by an :class:`~scopegraph._allocation.Allocation`;
  views are the allocation's address plus an offset, passed to kernels and graph nodes as plain
  ints (the graph's pin keeps the memory alive, so cuda.core need not retain anything).
- Memory is allocated on ``memory_stream`` from the device's stream-ordered pool and released by
  :meth:`CudaBackend.retire` once the allocation is freed or collected: ``memory_stream`` first
  waits (with events) for every stream that used the memory, then frees it in stream order, so
  nothing waits on the host and the pool hands the bytes out again only after that work is done.
  Borrowed (foreign) memory is not freed; its owner is kept in ``_graveyard`` until the events of
  its users have completed.
- Each kernel launch op caches its bound form (cuda.core ``Kernel``, ``LaunchConfig`` and the
  argument tuple) in ``op.native``, made once, so eager launches and graph building do no
  argument work twice.
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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.core import Buffer, Event, LaunchConfig, launch
from cuda.core import Device as CoreDevice
from cuda.core import Stream as CoreStream
from cuda.core.graph import GraphDefinition
from cuda.core.utils import StridedMemoryView

from .._compile import compile_kernel
from .._errors import CudaError
from .._kernel import KernelLaunch
from .._lifetime import note_eager_use
from .._ops import GraphNode, Join, Memcpy, Memset
from .._tensor import Tensor

if TYPE_CHECKING:
    from cuda.core.graph import Graph
    from cuda.core.graph import GraphNode as CoreNode

    from .._allocation import Allocation
    from .._scope import RecordedNode
    from .._stream import Stream

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


class _CudaExecutable:
    """An instantiated CUDA graph, with the definition nodes that name its kernels for updates."""

    def __init__(self, backend: CudaBackend, graph: Graph, definition: GraphDefinition, nodes: list[CoreNode]) -> None:
        self.backend = backend
        self.graph = graph
        self.definition = definition
        self.nodes = nodes

    def launch(self, stream: Stream) -> None:
        backend = self.backend
        backend.make_current()
        backend.last_work = f"{stream.last_work} on stream #{stream.id}"
        try:
            self.graph.launch(stream.native)  # type: ignore[arg-type]
        except Exception as exc:
            raise cuda_error("cuGraphLaunch", exc, backend.last_work) from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):  # after a sticky fault the driver refuses; the process is ending anyway
            self.graph.close()

    def driver_dot(self) -> str:
        """The driver's own DOT dump of the graph definition."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.dot")
            with self.backend.driver_call("cuGraphDebugDotPrint"):
                self.definition.debug_dot_print(path)
            with open(path) as f:
                return f.read()


class CudaBackend:
    name = "cuda"

    def __init__(self, index: int) -> None:
        self.last_work = ""
        self._current = threading.local()
        with self.driver_call(f"initialising cuda:{index}"):
            self.core = CoreDevice(index)
            self.make_current()
            self.arch = f"sm_{self.core.arch}"
            # Allocations and frees are ordered on this stream; allocations are waited for, so a
            # tensor made eagerly is ready for any stream.
            self.memory_stream = self.core.create_stream()
        # Foreign owners kept alive until the events of the work that used them complete. A deque:
        # retire runs from garbage collection, anywhere, so this takes no lock.
        self._graveyard: collections.deque[tuple[list[Event], object]] = collections.deque()

    def make_current(self) -> None:
        """Make this device's primary context current on the calling thread (once per thread)."""
        if not getattr(self._current, "done", False):
            self.core.set_current()
            self._current.done = True

    @contextlib.contextmanager
    def driver_call(self, operation: str) -> Iterator[None]:
        """Turn any failure of cuda.core or the driver into a CudaError (for paths off the hot loop)."""
        try:
            yield
        except CudaError:
            raise
        except Exception as exc:
            raise cuda_error(operation, exc, self.last_work) from exc

    # -- memory ---------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> tuple[object, int]:
        self.make_current()
        self._bury()
        with self.driver_call(f"allocating {nbytes} bytes on cuda:{self.core.device_id}"):
            buf = self.core.allocate(max(nbytes, 1), stream=self.memory_stream)
            self.memory_stream.sync()
        return buf, int(buf.handle)

    def retire(self, storage: object, users: set[object], borrowed: bool) -> None:
        """Release memory after the work of every stream in ``users`` (see the module docstring).
        Runs from free() and from garbage collection, so it never raises."""
        try:
            self.make_current()
            if borrowed:
                self._graveyard.append(([stream.record() for stream in users], storage))  # type: ignore[attr-defined]
                self._bury()
                return
            for stream in users:
                self.memory_stream.wait(stream)  # type: ignore[arg-type]
            storage.close(self.memory_stream)  # type: ignore[attr-defined]
        except Exception:  # noqa: S110  (a lost context frees everything when the process ends)
            pass

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

    def address(self, alloc: Allocation) -> int:
        return alloc.address

    def _view(self, tensor: Tensor) -> Buffer:
        """A non-owning Buffer over a tensor's bytes, keeping the allocation alive while it lives."""
        alloc = tensor.allocation
        return Buffer.from_handle(alloc.address + tensor.offset, tensor.nbytes, owner=alloc)

    def read(self, alloc: Allocation, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        host = np.empty(nbytes, np.uint8)
        if nbytes:
            self.make_current()
            with self.driver_call("copying device memory to the host"):
                self.core.sync()  # waits for pending work on every stream that may write it
                src = Buffer.from_handle(alloc.address + offset, nbytes, owner=alloc)
                Buffer.from_handle(host.ctypes.data, nbytes, owner=host).copy_from(src, stream=self.memory_stream)
                self.memory_stream.sync()
        return host

    def write(self, tensor: Tensor, array: np.ndarray[Any, Any], stream: Stream | None) -> None:
        host = np.ascontiguousarray(array, dtype=tensor.dtype.numpy)
        if not tensor.nbytes:
            return
        self.make_current()
        core_stream: CoreStream = stream.native if stream is not None else self.memory_stream  # type: ignore[assignment]
        with self.driver_call("copying host memory to the device"):
            self._view(tensor).copy_from(Buffer.from_handle(host.ctypes.data, tensor.nbytes, owner=host), stream=core_stream)
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
            native = obj if isinstance(obj, CoreStream) else self.core.create_stream(obj)
            return native, int(native.device.device_id)

    def sync_stream(self, stream: Stream) -> None:
        self.make_current()
        with self.driver_call(f"synchronising stream #{stream.id}"):
            stream.native.sync()  # type: ignore[attr-defined]

    def wait_stream(self, waiter: object, waited: object) -> None:
        """``waiter`` waits (with an event, not the host) for the work queued on ``waited`` so far."""
        with self.driver_call("ordering two streams"):
            waiter.wait(waited)  # type: ignore[attr-defined]

    def sync(self) -> None:
        self.make_current()
        with self.driver_call("synchronising the device"):
            self.core.sync()

    # -- eager ops ------------------------------------------------------------------------

    def prepare(self, op: GraphNode) -> None:
        if type(op) is KernelLaunch and op.native is None:
            op.native = self._bind(op)

    def _bind(self, op: KernelLaunch) -> tuple[Any, Any, tuple[Any, ...]]:
        """The cuda.core form of a launch: (Kernel, LaunchConfig, args with pointers as ints)."""
        kernel = op.kernel
        fn = kernel.compiled.get(self)
        if fn is None:
            code = compile_kernel(kernel, self.arch)
            self.make_current()
            with self.driver_call(f"loading kernel `{kernel.name_expression}`"):
                fn = kernel.compiled[self] = code.get_kernel(kernel.name_expression)
        with self.driver_call(f"configuring `{kernel.name_expression}`[{op.grid}, {op.block}]"):
            config = LaunchConfig(grid=op.grid, block=op.block, shmem_size=op.shmem)
        args = tuple(a.allocation.address + a.offset if isinstance(a, Tensor) else a for a in op.args)
        return fn, config, args

    def run(self, op: GraphNode, stream: Stream) -> None:
        self.make_current()
        native_stream = stream.native
        if op.borrows:
            note_eager_use(op.borrows, native_stream)
        self.last_work = stream.last_work = f"`{op.name}` on stream #{stream.id}"
        try:
            if type(op) is KernelLaunch:
                native = op.native
                if native is None:
                    native = op.native = self._bind(op)
                fn, config, args = native
                launch(native_stream, config, fn, *args)  # type: ignore[arg-type]
            elif isinstance(op, Memcpy):
                if op.dst.nbytes:
                    self._view(op.dst).copy_from(self._view(op.src), stream=native_stream)  # type: ignore[arg-type]
            elif isinstance(op, Memset):
                if op.dst.nbytes:
                    self._view(op.dst).fill(_fill_value(op.pattern), stream=native_stream)  # type: ignore[arg-type]
        except CudaError:
            raise
        except Exception as exc:
            raise cuda_error(f"running `{op.name}` on stream #{stream.id}", exc, self.last_work) from exc

    # -- graphs ---------------------------------------------------------------------------

    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> _CudaExecutable:
        self.make_current()
        with self.driver_call("building the graph definition"):
            definition = GraphDefinition()
            made: list[CoreNode] = []
            for rec in nodes:
                deps = rec.deps
                if len(deps) == 1:
                    (only,) = deps
                    parent: Any = made[only]
                else:
                    parent = definition
                node = self._add_node(parent, rec.op)
                if len(deps) > 1:
                    node.pred = [made[d] for d in deps]
                made.append(node)
        with self.driver_call("instantiating the graph"):
            graph = definition.instantiate()
            graph.upload(stream.native)  # type: ignore[arg-type]
        return _CudaExecutable(self, graph, definition, made)

    def _add_node(self, parent: Any, op: GraphNode) -> CoreNode:
        if type(op) is KernelLaunch:
            if op.native is None:
                op.native = self._bind(op)
            fn, config, args = op.native
            return parent.launch(config, fn, *args)  # type: ignore[no-any-return]
        # A 0-byte copy or fill is no work (the driver refuses it as a node): an empty node keeps the edges.
        if isinstance(op, Memcpy) and op.dst.nbytes:
            dst, src = op.dst, op.src
            return parent.memcpy(  # type: ignore[no-any-return]
                dst.allocation.address + dst.offset, src.allocation.address + src.offset, dst.nbytes
            )
        if isinstance(op, Memset) and op.dst.nbytes:
            dst, pattern = op.dst, op.pattern
            return parent.memset(  # type: ignore[no-any-return]
                dst.allocation.address + dst.offset, _fill_value(pattern), dst.nbytes // len(pattern)
            )
        assert isinstance(op, (Join, Memcpy, Memset))
        return parent.empty() if isinstance(parent, GraphDefinition) else parent.join()

    # -- interop --------------------------------------------------------------------------

    def _users_of(self, alloc: Allocation) -> set[object]:
        """Every stream whose queued work may touch ``alloc``'s memory: its eager users and the
        streams live graphs that pin it were replayed on."""
        found: set[object] = set()
        for a in alloc.aliases():
            found |= a.users
            for pin in a.pins.values():
                found |= pin.replayed_on
        return found

    def ready_stream(self, alloc: Allocation) -> int | None:
        """A stream on which all work queued on ``alloc`` is complete, for ``__cuda_array_interface__``."""
        users = self._users_of(alloc)
        if not users:
            return None
        for stream in users:
            self.wait_stream(self.memory_stream, stream)
        return int(self.memory_stream.handle)

    def dlpack(self, tensor: Tensor, stream: int | None, options: dict[str, Any]) -> object:
        if stream is not None and stream != -1:
            consumer = CoreStream.from_handle(stream)
            for user in self._users_of(tensor.allocation):
                self.wait_stream(consumer, user)
        elif stream is None:
            self.core.sync()  # DLPack's None: the consumer gives no stream, so the data must be complete
        view = StridedMemoryView.from_buffer(self._view(tensor), tensor.shape, dtype=tensor.dtype.numpy)
        return view.__dlpack__(stream=-1, **options)

    def dlpack_device(self) -> tuple[int, int]:
        return (2, int(self.core.device_id))  # kDLCUDA
def _fill_value(pattern: bytes) -> int | bytes:
    """cuda.core takes an int for a 1-byte fill and a buffer of 2 or 4 bytes otherwise."""
    return pattern[0] if len(pattern) == 1 else pattern
