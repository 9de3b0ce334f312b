"""Tensors, the allocations behind them, and borrows.

An :class:`Allocation` owns one block of memory. A :class:`Tensor` is a typed, shaped window
(``offset`` and ``nbytes``) onto one allocation; views share the allocation. A borrow is a byte
range of one allocation, so two views conflict exactly when their ranges overlap.

Who owns what: the allocation owns the backend storage and releases it on ``free()`` or when
the last tensor referring to it is collected. A live graph or an open scope *pins* the
allocation: it holds a reference to the tensors it uses and ``free()`` is refused until the
pin is released. Wrapped third-party memory (DLPack, ``__cuda_array_interface__``) is
*borrowed*: scopegraph never frees it.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, final

import numpy as np

from ._dtypes import DType
from ._errors import BorrowError, LifetimeError, SignatureError, diagnostic

if TYPE_CHECKING:
    from ._device import Device

_allocation_ids = itertools.count(1)


class Allocation:
    """One block of device (or host-backend) memory and the bookkeeping the tracker needs."""

    __slots__ = ("id", "device", "nbytes", "storage", "name", "freed", "pins", "frozen", "borrowed", "__weakref__")

    def __init__(self, device: Device, nbytes: int, storage: object, name: str | None, borrowed: bool = False) -> None:
        self.id: Final = next(_allocation_ids)
        self.device: Final = device
        self.nbytes: Final = nbytes
        # Backend-specific: a numpy uint8 array on the host backend, a cuda.core Buffer on CUDA.
        self.storage = storage
        self.name = name
        self.freed = False
        # holder id -> what holds it ("graph #2", "the open scope on stream #1"), for messages.
        self.pins: dict[int, str] = {}
        # Byte ranges made read-only by Tensor.freeze().
        self.frozen: list[tuple[int, int]] = []
        self.borrowed = borrowed

    def frozen_overlap(self, start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in self.frozen)

    def release(self) -> None:
        if not self.freed:
            self.freed = True
            if not self.borrowed:
                self.device.backend.release(self.storage)
            self.storage = None


class Tensor:
    """A typed, shaped, contiguous window onto one allocation.

    Create tensors eagerly on a device (``dev.zeros``, ``dev.from_numpy``, ...) or with an
    allocation op run on a stream (``stream.run(sg.zeros(...))``); never inside a scope.
    """

    __slots__ = ("_alloc", "offset", "shape", "dtype", "nbytes", "_name", "_base")

    def __init__(
        self,
        alloc: Allocation,
        offset: int,
        shape: tuple[int, ...],
        dtype: DType,
        name: str | None = None,
        base: Tensor | None = None,
    ) -> None:
        self._alloc = alloc
        self.offset = offset
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * dtype.itemsize
        self._name = name
        # The tensor this one is a view of (None for the tensor that owns the allocation).
        self._base = base

    # -- description --------------------------------------------------------------------

    @property
    def device(self) -> Device:
        return self._alloc.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        """The label error messages and DOT pictures use: ``name=`` if given, else a made-up one."""
        if self._name is not None:
            return self._name
        if self._alloc.name is not None and self._base is None:
            return self._alloc.name
        return f"<{self.dtype.name}{list(self.shape)} #{self._alloc.id}>"

    @property
    def allocation(self) -> Allocation:
        return self._alloc

    @property
    def is_view(self) -> bool:
        return self._base is not None

    @property
    def byte_range(self) -> tuple[int, int]:
        return self.offset, self.offset + self.nbytes

    def __repr__(self) -> str:
        state = " freed" if self._alloc.freed else ""
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype!r}, device={self.device}{state})"

    # -- views ---------------------------------------------------------------------------

    def view(self, shape: tuple[int, ...] | list[int], name: str | None = None) -> Tensor:
        """The same memory with a new shape (same number of elements; ``-1`` infers one dim)."""
        self.check_alive()
        dims = [int(d) for d in shape]
        if dims.count(-1) == 1:
            known = math.prod(d for d in dims if d != -1)
            if known and self.size % known == 0:
                dims[dims.index(-1)] = self.size // known
        if any(d < 0 for d in dims) or math.prod(dims) != self.size:
            raise SignatureError(
                diagnostic(
                    f"cannot view `{self.name}` (shape {self.shape}, {self.size} elements) as {tuple(shape)}",
                    help="a view keeps every element: pick a shape with the same number of elements, "
                    "or slice rows first (`t[a:b]`)",
                )
            )
        return Tensor(self._alloc, self.offset, tuple(dims), self.dtype, name or self.name, self)

    def __getitem__(self, index: int | slice) -> Tensor:
        """``t[a:b]`` is a view of rows a..b; ``t[i]`` is a view of row i with one dim fewer."""
        self.check_alive()
        if not self.shape:
            raise SignatureError(f"cannot index 0-d tensor `{self.name}`\nhelp: view it as (1,) first")
        rows = self.shape[0]
        row_bytes = self.nbytes // rows if rows else 0
        if isinstance(index, slice):
            start, stop, step = index.indices(rows)
            if step != 1:
                raise SignatureError(
                    f"`{self.name}[{index.start}:{index.stop}:{index.step}]` is strided; scopegraph tensors are contiguous\n"
                    "help: slice with step 1, or copy the rows you need with sg.memcpy"
                )
            stop = max(start, stop)
            label = f"{self.name}[{start}:{stop}]"
            return Tensor(self._alloc, self.offset + start * row_bytes, (stop - start, *self.shape[1:]), self.dtype, label, self)
        if isinstance(index, (int, np.integer)):
            i = int(index) + rows if index < 0 else int(index)
            if not 0 <= i < rows:
                raise IndexError(f"row {index} is out of range for `{self.name}` with {rows} rows")
            return Tensor(self._alloc, self.offset + i * row_bytes, self.shape[1:], self.dtype, f"{self.name}[{i}]", self)
        raise SignatureError(
            f"`{self.name}` can be indexed by an int or a row slice, not {type(index).__name__}\n"
            "help: use t[a:b] for rows a..b, or t.view(shape) to reshape"
        )

    # -- borrows -------------------------------------------------------------------------

    def mut(self) -> Mut[Tensor]:
        """An exclusive (write) borrow of this tensor, for one op."""
        return Mut(self)

    def freeze(self) -> Tensor:
        """Make this tensor's memory read-only (weights): any later mutable borrow is a BorrowError."""
        self.check_alive()
        self._alloc.frozen.append(self.byte_range)
        return self

    @property
    def frozen(self) -> bool:
        return self._alloc.frozen_overlap(*self.byte_range)

    # -- lifetime ------------------------------------------------------------------------

    def check_alive(self) -> None:
        if self._alloc.freed:
            raise LifetimeError(
                diagnostic(
                    f"use of freed tensor `{self.name}`",
                    [f"`{self.name}` was released by free()"],
                    help="allocate it again, or free it only after its last use",
                )
            )

    def free(self) -> None:
        """Release the memory now. Refused while a live graph or an open scope uses it."""
        alloc = self._alloc
        if self._base is not None:
            raise LifetimeError(
                diagnostic(
                    f"cannot free `{self.name}`: it is a view",
                    help="free the tensor that owns the memory; its views go with it",
                )
            )
        if alloc.freed:
            return
        if alloc.pins:
            raise LifetimeError(
                diagnostic(
                    f"cannot free `{self.name}` while it is in use",
                    [f"`{self.name}` is pinned by {holder}" for holder in alloc.pins.values()],
                    help="close the graph first (graph.close() or a `with` block), then free",
                )
            )
        alloc.release()

    # -- host copies ---------------------------------------------------------------------

    def numpy(self) -> np.ndarray[Any, np.dtype[Any]]:
        """A host copy of the contents; waits for pending device work first."""
        self.check_alive()
        raw = self.device.backend.read(self._alloc, self.offset, self.nbytes)
        return raw.view(self.dtype.numpy).reshape(self.shape)

    # -- interop -------------------------------------------------------------------------

    @property
    def data_ptr(self) -> int:
        """The address of the first element (device address on CUDA, host address on host)."""
        self.check_alive()
        return self.device.backend.address(self._alloc) + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self.device.is_cuda:
            raise AttributeError("__cuda_array_interface__ exists only for CUDA tensors")
        return {
            "shape": self.shape,
            "typestr": self.dtype.numpy.str,
            "data": (self.data_ptr, self.frozen),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        self.check_alive()
        return self.device.backend.dlpack(self, stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device.backend.dlpack_device()

    @staticmethod
    def from_dlpack(obj: Any, name: str | None = None) -> Tensor:
        """Wrap another library's tensor without a copy (borrowed: scopegraph never frees it)."""
        from ._interop import tensor_from_foreign

        return tensor_from_foreign(obj, name)


T = TypeVar("T", bound=Tensor)


@final
class Mut(Generic[T]):
    """An exclusive borrow of a tensor for one op: the op writes it.

    Kernels declare written parameters as ``Mut[Tensor]``; callers pass ``x.mut()``.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: T) -> None:
        if not isinstance(tensor, Tensor):
            raise SignatureError(
                f"Mut() wraps a Tensor, not {type(tensor).__name__}\nhelp: call x.mut() on the tensor the op writes"
            )
        self.tensor: Final[T] = tensor

    def __repr__(self) -> str:
        return f"Mut({self.tensor.name})"


def mut(tensor: T) -> Mut[T]:
    """``sg.mut(x)`` is ``x.mut()``: an exclusive borrow for one op."""
    return Mut(tensor)


class Borrow:
    """One argument's claim on a byte range of an allocation, as an op makes it."""

    __slots__ = ("tensor", "alloc", "start", "end", "mutable", "param")

    def __init__(self, tensor: Tensor, mutable: bool, param: str) -> None:
        self.tensor = tensor
        self.alloc = tensor._alloc
        self.start = tensor.offset
        self.end = tensor.offset + tensor.nbytes
        self.mutable = mutable
        self.param = param

    def overlaps(self, other: Borrow) -> bool:
        return self.alloc is other.alloc and self.start < other.end and other.start < self.end

    def describe(self) -> str:
        kind = "mutably" if self.mutable else "as shared"
        span = f"bytes {self.start}..{self.end}"
        owner = self.alloc.name or f"#{self.alloc.id}"
        return f"`{self.param}` borrows `{self.tensor.name}` {kind} ({span} of allocation `{owner}`)"


def check_borrows(op_name: str, borrows: list[Borrow]) -> None:
    """The in-op rules: live memory, no write to frozen memory, no mutable overlap."""
    for b in borrows:
        b.tensor.check_alive()
        if b.mutable and b.alloc.frozen and b.alloc.frozen_overlap(b.start, b.end):
            raise BorrowError(
                diagnostic(
                    f"cannot borrow `{b.tensor.name}` as mutable in `{op_name}`: it is frozen",
                    [b.describe(), f"`{b.tensor.name}` was made read-only by freeze()"],
                    help="write into a separate buffer; frozen tensors (weights) can only be read",
                )
            )
    n = len(borrows)
    for i in range(n):
        a = borrows[i]
        for j in range(i + 1, n):
            b = borrows[j]
            if (a.mutable or b.mutable) and a.overlaps(b):
                first, second = (a, b) if a.mutable else (b, a)
                if second.mutable:
                    head = f"cannot borrow `{second.tensor.name}` as mutable more than once at a time in `{op_name}`"
                else:
                    head = (
                        f"cannot borrow `{second.tensor.name}` as immutable because it is also "
                        f"borrowed as mutable in `{op_name}`"
                    )
                raise BorrowError(
                    diagnostic(
                        head,
                        [f"mutable borrow: {first.describe()}", f"conflicting borrow: {second.describe()}"],
                        help="give the op separate buffers (or disjoint views) for what it writes and what it reads; "
                        "copy first with sg.memcpy if you need the old contents",
                    )
                )
