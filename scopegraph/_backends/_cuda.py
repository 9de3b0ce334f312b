"""The CUDA backend, on NVIDIA's cuda.core.

Who owns what:

- Device memory is a cuda.core ``Buffer`` owned by an :class:`Allocation`; views are the
  allocation's address plus an offset, passed to kernels and graph nodes as plain ints (the
  graph's pins keep the memory alive, so cuda.core need not retain anything).
- Each kernel launch op caches its bound form (cuda.core ``Kernel``, ``LaunchConfig`` and the
  argument tuple) in ``op.native``, made once, so eager launches and graph building do no
  argument work twice.
- A graph is a cuda.core ``GraphDefinition`` built node by node with the tracker's
  predecessors, instantiated and uploaded once; ``_CudaExecutable`` owns the resulting
  ``Graph`` and closes it.

Only construct this backend when ``_driver.cuda_device_count()`` says a GPU exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.core import Buffer, LaunchConfig, launch
from cuda.core import Device as CoreDevice
from cuda.core import Stream as CoreStream
from cuda.core.graph import GraphDefinition
from cuda.core.utils import StridedMemoryView

from .._compile import compile_kernel
from .._errors import CudaError
from .._kernel import KernelLaunch
from .._ops import GraphNode, Memcpy, Memset
from .._tensor import Tensor

if TYPE_CHECKING:
    from cuda.core.graph import Graph
    from cuda.core.graph import GraphNode as CoreNode

    from .._graph import RecordedNode
    from .._stream import Stream
    from .._tensor import Allocation

_RESULT = re.compile(r"CUDA_ERROR_[A-Z0-9_]+")


def cuda_error(operation: str, exc: Exception) -> CudaError:
    """A CudaError naming the CUresult that cuda.core's exception carries."""
    found = _RESULT.search(str(exc))
    return CudaError(operation, found.group(0) if found else type(exc).__name__, str(exc))


@contextlib.contextmanager
def driver_call(operation: str) -> Iterator[None]:
    """Turn any failure of cuda.core or the driver into a CudaError (for paths off the hot loop)."""
    try:
        yield
    except CudaError:
        raise
    except Exception as exc:
        raise cuda_error(operation, exc) from exc


class _CudaExecutable:
    """An instantiated CUDA graph, with the definition nodes that name its kernels for updates."""

    def __init__(self, graph: Graph, definition: GraphDefinition, nodes: list[CoreNode]) -> None:
        self.graph = graph
        self.definition = definition
        self.nodes = nodes

    def launch(self, stream: Stream) -> None:
        try:
            self.graph.launch(stream.native)  # type: ignore[arg-type]
        except Exception as exc:
            raise cuda_error("cuGraphLaunch", exc) from exc

    def close(self) -> None:
        self.graph.close()

    def driver_dot(self) -> str:
        """The driver's own DOT dump of the graph definition."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "graph.dot")
            with driver_call("cuGraphDebugDotPrint"):
                self.definition.debug_dot_print(path)
            with open(path) as f:
                return f.read()


class CudaBackend:
    name = "cuda"

    def __init__(self, index: int) -> None:
        with driver_call(f"initialising cuda:{index}"):
            self.core = CoreDevice(index)
            self.core.set_current()
            self.arch = f"sm_{self.core.arch}"
            # Allocations and frees are ordered on this stream, then waited for, so a tensor
            # made eagerly is ready for any stream.
            self.memory_stream = self.core.create_stream()

    # -- memory ---------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> object:
        with driver_call(f"allocating {nbytes} bytes on cuda:{self.core.device_id}"):
            buf = self.core.allocate(max(nbytes, 1), stream=self.memory_stream)
            self.memory_stream.sync()
        return buf

    def release(self, storage: object) -> None:
        buf: Buffer = storage  # type: ignore[assignment]
        with driver_call("freeing device memory"):
            self.core.sync()  # work still queued on any stream may use it
            buf.close(self.memory_stream)

    def address(self, alloc: Allocation) -> int:
        buf: Buffer = alloc.storage  # type: ignore[assignment]
        return int(buf.handle)

    def _view(self, tensor: Tensor) -> Buffer:
        """A non-owning Buffer over a tensor's bytes (mr=None: closing it frees nothing)."""
        return Buffer.from_handle(self.address(tensor.allocation) + tensor.offset, tensor.nbytes, owner=tensor.allocation.storage)

    def read(self, alloc: Allocation, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        host = np.empty(nbytes, np.uint8)
        if nbytes:
            with driver_call("copying device memory to the host"):
                self.core.sync()  # waits for pending work on every stream that may write it
                src = Buffer.from_handle(self.address(alloc) + offset, nbytes, owner=alloc.storage)
                Buffer.from_handle(host.ctypes.data, nbytes, owner=host).copy_from(src, stream=self.memory_stream)
                self.memory_stream.sync()
        return host

    def write(self, tensor: Tensor, array: np.ndarray[Any, Any], stream: Stream | None) -> None:
        host = np.ascontiguousarray(array, dtype=tensor.dtype.numpy)
        if not tensor.nbytes:
            return
        core_stream: CoreStream = stream.native if stream is not None else self.memory_stream  # type: ignore[assignment]
        with driver_call("copying host memory to the device"):
            self._view(tensor).copy_from(Buffer.from_handle(host.ctypes.data, tensor.nbytes, owner=host), stream=core_stream)
            # Pageable host memory: wait, so the caller may reuse `array` at once.
            core_stream.sync()

    # -- streams --------------------------------------------------------------------------

    def create_stream(self) -> object:
        with driver_call("creating a stream"):
            return self.core.create_stream()

    def stream_from_handle(self, obj: object) -> object:
        if isinstance(obj, CoreStream):
            return obj
        with driver_call("wrapping a foreign stream"):
            return self.core.create_stream(obj)

    def sync_stream(self, native: object) -> None:
        with driver_call("synchronising a stream"):
            native.sync()  # type: ignore[attr-defined]

    def sync(self) -> None:
        with driver_call("synchronising the device"):
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
            with driver_call(f"loading kernel `{kernel.name_expression}`"):
                fn = kernel.compiled[self] = code.get_kernel(kernel.name_expression)
        with driver_call(f"configuring `{kernel.name_expression}`[{op.grid}, {op.block}]"):
            config = LaunchConfig(grid=op.grid, block=op.block, shmem_size=op.shmem)
        args = tuple(self.address(a.allocation) + a.offset if isinstance(a, Tensor) else a for a in op.args)
        return fn, config, args

    def run_memcpy(self, op: Memcpy, stream: Stream) -> None:
        with driver_call("memcpy"):
            self._view(op.dst).copy_from(self._view(op.src), stream=stream.native)  # type: ignore[arg-type]

    def run_memset(self, op: Memset, stream: Stream) -> None:
        with driver_call("memset"):
            self._view(op.dst).fill(_fill_value(op.pattern), stream=stream.native)  # type: ignore[arg-type]

    def run_kernel(self, op: KernelLaunch, stream: Stream) -> None:
        native = op.native
        if native is None:
            native = op.native = self._bind(op)
        fn, config, args = native
        try:
            launch(stream.native, config, fn, *args)  # type: ignore[arg-type]
        except Exception as exc:
            raise cuda_error(f"launching `{op.name}`", exc) from exc

    # -- graphs ---------------------------------------------------------------------------

    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> _CudaExecutable:
        with driver_call("building the graph definition"):
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
        with driver_call("instantiating the graph"):
            graph = definition.instantiate()
            graph.upload(stream.native)  # type: ignore[arg-type]
        return _CudaExecutable(graph, definition, made)

    def _add_node(self, parent: Any, op: GraphNode) -> CoreNode:
        if isinstance(op, KernelLaunch):
            if op.native is None:
                op.native = self._bind(op)
            fn, config, args = op.native
            return parent.launch(config, fn, *args)  # type: ignore[no-any-return]
        if isinstance(op, Memcpy):
            dst, src = op.dst, op.src
            return parent.memcpy(  # type: ignore[no-any-return]
                self.address(dst.allocation) + dst.offset, self.address(src.allocation) + src.offset, dst.nbytes
            )
        assert isinstance(op, Memset)
        dst, pattern = op.dst, op.pattern
        return parent.memset(  # type: ignore[no-any-return]
            self.address(dst.allocation) + dst.offset, _fill_value(pattern), dst.nbytes // len(pattern)
        )

    # -- interop --------------------------------------------------------------------------

    def dlpack(self, tensor: Tensor, stream: int | None) -> object:
        view = StridedMemoryView.from_buffer(self._view(tensor), tensor.shape, dtype=tensor.dtype.numpy)
        return view.__dlpack__(stream=stream)

    def dlpack_device(self) -> tuple[int, int]:
        return (2, int(self.core.device_id))  # kDLCUDA


def _fill_value(pattern: bytes) -> int | bytes:
    """cuda.core takes an int for a 1-byte fill and a buffer of 2 or 4 bytes otherwise."""
    return pattern[0] if len(pattern) == 1 else pattern
