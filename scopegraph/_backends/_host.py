"""The host backend: numpy memory, ops run at once, graphs replayed in dependency order.

It runs the same records the CUDA backend would, with each kernel's ``@k.host`` reference, so
the whole library (and users' graph programs) can be tested on machines without a GPU.
Streams are synchronous here: work runs when it is submitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import NoHostReferenceError, diagnostic
from .._kernel import KernelLaunch
from .._ops import GraphNode, Memcpy, Memset
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._graph import RecordedNode
    from .._stream import Stream
    from .._tensor import Allocation

NDArray = np.ndarray[Any, np.dtype[Any]]


def _array(tensor: Tensor, writable: bool) -> NDArray:
    """A numpy view of a tensor's memory (read-only for shared borrows)."""
    storage: NDArray = tensor.allocation.storage  # type: ignore[assignment]
    view = storage[tensor.offset : tensor.offset + tensor.nbytes].view(tensor.dtype.numpy).reshape(tensor.shape)
    if not writable:
        view.flags.writeable = False
    return view


def _thunk(op: GraphNode) -> Callable[[], None]:
    """Bind an op to numpy views once, so replay only calls functions."""
    if isinstance(op, Memcpy):
        dst, src = _array(op.dst, True).reshape(-1), _array(op.src, False).reshape(-1)
        return lambda: np.copyto(dst, src)
    if isinstance(op, Memset):
        dst, value = _array(op.dst, True), op.value
        return lambda: dst.fill(value)
    assert isinstance(op, KernelLaunch)
    fn = op.kernel.host_fn
    assert fn is not None
    borrows = iter(op.borrows)  # one per tensor argument, in order
    bound = tuple(_array(a, next(borrows).mutable) if isinstance(a, Tensor) else a for a in op.args)
    return lambda: fn(*bound)


class _HostGraph:
    """An instantiated host graph: the ops' thunks in a topological (record) order."""

    def __init__(self, thunks: list[Callable[[], None]]) -> None:
        self.thunks = thunks

    def launch(self, stream: Stream) -> None:
        for thunk in self.thunks:
            thunk()

    def close(self) -> None:
        self.thunks = []


class HostBackend:
    name = "host"

    def allocate(self, nbytes: int) -> object:
        return np.empty(nbytes, np.uint8)

    def release(self, storage: object) -> None:
        pass  # numpy frees the array once nothing refers to it

    def address(self, alloc: Allocation) -> int:
        storage: NDArray = alloc.storage  # type: ignore[assignment]
        return int(storage.ctypes.data)

    def read(self, alloc: Allocation, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        storage: NDArray = alloc.storage  # type: ignore[assignment]
        return storage[offset : offset + nbytes].copy()

    def write(self, tensor: Tensor, array: NDArray, stream: Stream | None) -> None:
        _array(tensor, True)[...] = array.reshape(tensor.shape)

    def create_stream(self) -> object:
        return None

    def stream_from_handle(self, obj: object) -> object:
        return obj

    def sync_stream(self, native: object) -> None:
        pass

    def sync(self) -> None:
        pass

    def prepare(self, op: GraphNode) -> None:
        if type(op) is KernelLaunch and op.kernel.host_fn is None:
            raise NoHostReferenceError(
                diagnostic(
                    f"kernel `{op.name}` has no host reference, so the host backend cannot run it",
                    [f"declared as {op.kernel!r}"],
                    help=f"add a numpy reference with @{op.kernel.__name__}.host, or run on a CUDA device",
                )
            )

    def run_memcpy(self, op: Memcpy, stream: Stream) -> None:
        _thunk(op)()

    def run_memset(self, op: Memset, stream: Stream) -> None:
        _thunk(op)()

    def run_kernel(self, op: KernelLaunch, stream: Stream) -> None:
        _thunk(op)()

    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> _HostGraph:
        return _HostGraph([_thunk(n.op) for n in nodes])

    def dlpack(self, tensor: Tensor, stream: int | None) -> object:
        return _array(tensor, True).__dlpack__()

    def dlpack_device(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU
