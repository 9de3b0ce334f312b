"""Tensors: typed, shaped, contiguous windows onto an allocation, and ``Mut``, the write borrow.

A :class:`Tensor` is ``offset`` and ``nbytes`` of one :class:`~scopegraph._allocation.Allocation`;
views share the allocation. What makes memory conflict lives in ``_borrow`` (by device address);
what keeps it alive lives in ``_lifetime``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, SupportsIndex, TypeVar, final

import numpy as np

from ._allocation import EXPORTS
from ._errors import (
    BorrowError,
    BoundsError,
    ExportArgumentError,
    ExportError,
    FrozenExportError,
    LifetimeError,
    ScopeStateError,
    SignatureError,
    diagnostic,
    not_copyable,
)
from ._lifetime import pins_writing

if TYPE_CHECKING:
    from ._allocation import Allocation
    from ._device import Device
    from ._dtypes import DType
    from ._stream import Stream

# numpy's limit on dimensions (64 since numpy 2.0, 32 before): every tensor can become a numpy
# array (numpy(), host references), so a shape numpy refuses is refused where it is given.
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0b1" else 32
# More than any device can address (2**48 bytes): refused before the backend is asked.
MAX_ALLOCATION = 1 << 48

# Set by ``_interop`` when the package is imported: wraps a foreign array without a copy.
# (A hook, not an import: interop needs the device registry, which needs tensors.)
foreign_wrapper: Callable[[Any, str | None, Stream | None], Tensor] | None = None


class Tensor:
    """A typed, shaped, contiguous window onto one allocation.

    Create tensors eagerly on a device (``dev.zeros``, ``dev.from_numpy``, ...) or with an
    allocation op run on a stream (``stream.run(sg.zeros(...))``); never inside a scope.

    ``shape`` (a tuple of ints), ``dtype`` (``sg.f32``, ...), ``size`` (elements), ``nbytes``
    (bytes) and ``offset`` (bytes into its allocation) describe it; ``device``, ``name`` and
    ``is_view`` say where it lives, what messages call it and whether it is a view of another.
    """

    __slots__ = ("_alloc", "_base", "_name", "dtype", "nbytes", "offset", "shape", "size")

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
        # Elements and bytes, computed once: op builders read them on every launch.
        self.size: int = math.prod(shape)
        self.nbytes = self.size * dtype.itemsize
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

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:  # copy.copy, copy.deepcopy, pickle
        raise not_copyable(
            f"tensor `{self.name}`",
            "a device copy: stream.run(sg.dup(t)); host data: t.numpy(), and dev.from_numpy(a) back; "
            "the same memory under another name: t itself, or t.view(t.shape)",
        )

    def __repr__(self) -> str:
        state = " freed" if self._alloc.freed else ""
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype!r}, device={self.device}{state})"

    # -- views ---------------------------------------------------------------------------

    def view(self, shape: tuple[int, ...] | list[int], name: str | None = None) -> Tensor:
        """The same memory with a new shape (same number of elements; ``-1`` infers one dim)."""
        if self._alloc.freed:
            self.check_alive()
        if name is not None:
            check_name(name, f"`{self.name}`.view()")
        elif type(shape) is tuple and 0 < len(shape) <= 2 and self.size:
            # The inner-loop case, (n,) or (rows, n) of plain positive ints, checked in place.
            first = shape[0]
            if type(first) is int and first > 0:
                if len(shape) == 1:
                    if first == self.size:
                        return Tensor(self._alloc, self.offset, shape, self.dtype, self.name, self)
                else:
                    second = shape[1]
                    if type(second) is int and second > 0 and first * second == self.size:
                        return Tensor(self._alloc, self.offset, shape, self.dtype, self.name, self)
        try:
            given = tuple(shape)
            for d in given:
                if type(d) is not int:  # (the message only when needed: views are built in inner loops)
                    _refuse_bool(
                        d, f"a dimension of the view {given!r} of `{self.name}`", "pass ints, e.g. t.view((1, 8))"
                    )
            dims = [operator.index(d) for d in given]
        except TypeError:
            raise SignatureError(
                f"cannot view `{self.name}` as {shape!r}: a shape is a tuple of ints\nhelp: pass e.g. t.view((16, 128))"
            ) from None
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
        new_shape = tuple(dims)
        if self.size == 0 or len(new_shape) > MAX_DIMS:  # else its bytes are this tensor's, which fit
            check_shape(new_shape, self.dtype, f"the view {new_shape} of `{self.name}`")
        return Tensor(self._alloc, self.offset, new_shape, self.dtype, name or self.name, self)

    def __getitem__(self, index: int | slice) -> Tensor:
        """``t[a:b]`` is a view of rows a..b; ``t[i]`` is a view of row i with one dim fewer."""
        self.check_alive()
        if not self.shape:
            raise SignatureError(f"cannot index 0-d tensor `{self.name}`\nhelp: view it as (1,) first")
        rows = self.shape[0]
        row_bytes = self.nbytes // rows if rows else 0
        if isinstance(index, slice):
            for bound in (index.start, index.stop, index.step):
                if bound is not None and type(bound) is not int:
                    _refuse_bool(
                        bound, f"a bound of the row slice of `{self.name}`", "slice rows with ints, e.g. t[2:5]"
                    )
            try:
                start, stop, step = index.indices(rows)
            except (TypeError, ValueError):
                raise SignatureError(
                    f"`{self.name}[{index.start}:{index.stop}:{index.step}]` is not a row slice\n"
                    "help: slice rows with ints and step 1, e.g. t[2:5]"
                ) from None
            if step != 1:
                raise SignatureError(
                    f"`{self.name}[{index.start}:{index.stop}:{index.step}]` is strided; "
                    "scopegraph tensors are contiguous\n"
                    "help: slice with step 1, or copy the rows you need with sg.memcpy"
                )
            stop = max(start, stop)
            label = f"{self._rows_label()}[{start}:{stop}]"
            return Tensor(
                self._alloc, self.offset + start * row_bytes, (stop - start, *self.shape[1:]), self.dtype, label, self
            )
        if isinstance(index, (int, np.integer)):
            if type(index) is not int:
                _refuse_bool(
                    index,
                    f"the row index of `{self.name}`[{index!r}]",
                    "index rows with an int (t[1]); scopegraph has no boolean masks",
                )
            i = int(index) + rows if index < 0 else int(index)
            if not 0 <= i < rows:
                raise BoundsError(
                    f"row {index} is out of range for `{self.name}` with {rows} rows\n"
                    f"help: index rows 0..{rows - 1} (or -{rows}..-1)"
                )
            return Tensor(
                self._alloc, self.offset + i * row_bytes, self.shape[1:], self.dtype, f"{self._rows_label()}[{i}]", self
            )
        raise SignatureError(
            f"`{self.name}` can be indexed by an int or a row slice, not {type(index).__name__}\n"
            "help: use t[a:b] for rows a..b, or t.view(shape) to reshape"
        )

    def _rows_label(self) -> str:
        """What this tensor's rows are rows of, in a label: its name, or for a reshaped view that
        kept its tensor's name, the reshape too (the rows of `x.view((4, 4))` are not x's)."""
        base = self._base
        if base is not None and self._name == base.name and self.shape != base.shape:
            return f"{self._name}.view({self.shape})"
        return self.name

    # -- borrows -------------------------------------------------------------------------

    def mut(self) -> Mut[Tensor]:
        """An exclusive (write) borrow of this tensor, for one op."""
        return Mut(self)

    def freeze(self) -> Tensor:
        """Make this tensor's memory read-only (weights): any later mutable borrow is a BorrowError,
        also through an op built before this call. Refused while a live graph writes the tensor,
        and while another library holds a writable zero-copy export of it (DLPack)."""
        self.check_alive()
        alloc = self._alloc
        start = alloc.address + self.offset
        end = start + self.nbytes
        if start == end:
            return self  # an empty range conflicts with nothing
        for pin in pins_writing(alloc, start, end):
            raise BorrowError(
                diagnostic(
                    f"cannot freeze `{self.name}`: {pin.description} writes it",
                    [f"a frozen tensor can never be borrowed mutably, but {pin.description} holds a mutable borrow"],
                    help="close the graph that writes it first (graph.close()), or freeze it before recording",
                )
            )
        exported = self.device.memory.freeze(alloc, start, end)
        if exported:
            raise BorrowError(
                diagnostic(
                    f"cannot freeze `{self.name}`: another library holds a writable zero-copy export of it",
                    [
                        f"{exported} array(s) made through DLPack (torch.from_dlpack, cupy.from_dlpack, "
                        "numpy.from_dlpack) alias its memory and may write it, frozen or not"
                    ],
                    help="drop those arrays first (del them), or freeze before exporting: "
                    "an export of frozen memory is read-only",
                )
            )
        return self

    @property
    def frozen(self) -> bool:
        start = self._alloc.address + self.offset
        return self._alloc.frozen_overlap(start, start + self.nbytes) is not None

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
        """Release the memory now (the GPU work already queued on it still completes first).
        Refused while a live graph or an open scope uses it."""
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
                    [f"`{self.name}` is pinned by {pin.description}" for pin in alloc.pins.values()],
                    help="close the graph first (graph.close() or a `with` block), then free",
                )
            )
        start, end = alloc.address, alloc.address + alloc.nbytes
        wrappers = [
            a
            for a in alloc.aliases()
            if a is not alloc and not a.freed and a.address < end and start < a.address + a.nbytes
        ]
        if wrappers:
            raise LifetimeError(
                diagnostic(
                    f"cannot free `{self.name}`: another tensor wraps the same memory",
                    [
                        f"allocation `{a.label}` (a wrapper made through DLPack or __cuda_array_interface__) is alive"
                        for a in wrappers
                    ],
                    help="drop the wrappers first (del them), or drop this tensor instead of freeing it: "
                    "its memory is then released when the last wrapper goes",
                )
            )
        with EXPORTS:  # an export made meanwhile by another thread must see `freed` (Export)
            exports = alloc.exports
            alloc.freed = not exports
        if exports:  # the message is built outside the lock
            raise LifetimeError(
                diagnostic(
                    f"cannot free `{self.name}`: another library's array still aliases its memory",
                    [f"{exports} zero-copy export(s) through DLPack (torch.from_dlpack, cupy.from_dlpack)"],
                    help="drop those arrays first, or drop this tensor instead of freeing it: its memory is then "
                    "released when the last of them goes",
                )
            )
        alloc.storage = None
        if alloc.release is not None:
            alloc.release()

    # -- host copies ---------------------------------------------------------------------

    def numpy(self) -> np.ndarray[Any, np.dtype[Any]]:
        """A host copy of the contents; waits for pending device work first. Refused while an open
        scope records a write to them: that write runs only when its graph is launched."""
        self.check_alive()
        alloc = self._alloc
        if alloc.pins or len(alloc.region.members) > 1:
            start = alloc.address + self.offset
            for pin in pins_writing(alloc, start, start + self.nbytes):
                if pin.recording and pin.recorder in (0, get_ident()):
                    raise ScopeStateError(
                        diagnostic(
                            f"cannot read `{self.name}` with numpy(): {pin.description} records a write to it",
                            [
                                "recorded ops run when the graph is launched, not now: this copy "
                                "would hold the contents from before the graph"
                            ],
                            help="read it after `graph.launch()` and `graph.sync()`, or before the scope",
                        )
                    )
        raw = self.device.backend.read(alloc, self.offset, self.nbytes)
        return raw.view(self.dtype.numpy).reshape(self.shape)

    # -- interop -------------------------------------------------------------------------

    @property
    def data_ptr(self) -> int:
        """The address of the first element (device address on CUDA, host address on host)."""
        self.check_alive()
        return self._alloc.address + self.offset

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3, with ``stream`` set to a stream on which every write queued so far is visible."""
        if not self.device.is_cuda:
            raise AttributeError("__cuda_array_interface__ exists only for CUDA tensors")
        if self.frozen:  # a consumer's hasattr() passes this on: the refusal reaches the caller
            raise FrozenExportError.refusing(self.name, "__cuda_array_interface__")
        return {
            "shape": self.shape,
            "typestr": self.dtype.numpy.str,
            "data": (self.data_ptr, self.frozen),
            "version": 3,
            "strides": None,
            "stream": self.device.backend.ready_stream(self._alloc),
        }

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        """DLPack export: the consumer's ``stream`` is made to wait for work queued on this memory.
        ``copy=True`` exports a copy (on a GPU, made by scopegraph: cuda.core exports only aliases).

        A frozen tensor (or a view overlapping frozen bytes) is exported only as a copy, or as an
        alias for ``copy=False`` with a DLPack 1.x ``max_version``: flagged read-only, which numpy
        honours and torch and CuPy ignore, so asking for it is the caller's promise not to write.
        Any other request, every consumer's default included, is a FrozenExportError: torch's and
        CuPy's default import would be a writable alias of memory that graphs rely on."""
        self.check_alive()
        if stream is not None and (type(stream) is not int or not -1 <= stream < 2**64):
            raise SignatureError(
                f"__dlpack__(stream={stream!r}) of `{self.name}`: the consumer's stream is None or a stream "
                "handle (an int: -1, 1, 2 or a cudaStream_t)\n"
                "help: import through the consumer (torch.from_dlpack(t), cupy.from_dlpack(t)), which passes it"
            )
        unknown = sorted(set(kwargs) - {"copy", "max_version", "dl_device"})
        if unknown:
            raise ExportArgumentError(
                f"__dlpack__({unknown[0]}=...) of `{self.name}`: DLPack's export takes stream, copy, max_version "
                "and dl_device only\nhelp: import through the consumer (torch.from_dlpack(t), numpy.from_dlpack(t))"
            )
        dl_device = kwargs.get("dl_device")
        if dl_device is not None and (type(dl_device) is not tuple or dl_device != self.__dlpack_device__()):
            what = (
                f"the tensor lives on {self.device} (DLPack device {self.__dlpack_device__()}), and scopegraph "
                "exports it only there"
                if type(dl_device) is tuple
                else "dl_device is a (device type, device id) tuple"
            )
            raise ExportError(
                f"__dlpack__(dl_device={dl_device!r}) of `{self.name}`: {what}\n"
                "help: import through the consumer (torch.from_dlpack(t), numpy.from_dlpack(t)); to move the data, "
                "copy it first (t.numpy() for the host)"
            )
        copy, max_version = kwargs.get("copy"), kwargs.get("max_version")
        if not (copy is None or isinstance(copy, (bool, np.bool_))) or not (
            max_version is None
            or (type(max_version) is tuple and len(max_version) == 2 and all(type(v) is int for v in max_version))
        ):
            raise SignatureError(
                f"__dlpack__(copy={copy!r}, max_version={max_version!r}) of `{self.name}`: copy is None or a "
                "bool, max_version None or a (major, minor) tuple of ints\n"
                "help: import through the consumer (torch.from_dlpack(t), numpy.from_dlpack(t)), which passes these"
            )
        if copy is not None:
            copy = bool(copy)
        frozen = self.frozen  # once: a freeze on another thread meanwhile makes the export refuse (Export)
        if frozen and not copy:
            versioned = max_version is not None and max_version >= (1, 0)
            if not (copy is False and versioned):
                raise FrozenExportError.refusing(self.name, "dlpack" if versioned else "dlpack 0.x")
        # dl_device is now the tensor's own (or None): the same as not asking, and cuda.core refuses any
        options = {k: v for k, v in kwargs.items() if k != "dl_device"}
        if "copy" in kwargs:
            options["copy"] = copy
        return self.device.backend.dlpack(self, stream, options, not frozen)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device.backend.dlpack_device()

    @staticmethod
    def from_dlpack(obj: Any, name: str | None = None, stream: Stream | None = None) -> Tensor:
        """Wrap another library's tensor without a copy (borrowed: scopegraph never frees it).

        The producer's pending work is made visible first: on ``stream`` if given (the wrapper is
        then ready there, and a graph's replay over it waits for that stream, as for eager work
        there), else before this returns. Wrappers of the same memory are one allocation to the
        ownership rules."""
        assert foreign_wrapper is not None, "scopegraph._interop registers the wrapper on import"
        return foreign_wrapper(obj, name, stream)


def check_name(name: object, where: str) -> None:
    """A tensor's ``name=`` is a str or None: error messages and DOT pictures print it."""
    if name is not None and type(name) is not str:
        raise SignatureError(
            diagnostic(
                f"{where} got name={name!r} ({type(name).__name__}); a tensor's name is a string",
                help=f"pass name={str(name)!r}, or leave name out",
            )
        )
    if name is not None and not name.strip():
        raise SignatureError(
            diagnostic(
                f"{where} got name={name!r}: error messages and DOT pictures would show nothing",
                help="pass a name with something in it, or leave name out for one made from the shape and dtype",
            )
        )


def check_shape(dims: tuple[int, ...], dtype: DType, what: str) -> None:
    """Refuse a shape (of non-negative sizes) that numpy cannot represent or no device can hold;
    ``what`` names it in the message. numpy refuses more than MAX_DIMS dimensions, and sizes whose
    product overflows its index type even when another size is 0 (no elements): the bytes that
    the non-zero sizes span are held to what a device can address, which covers that and is the
    tensor's size when no size is 0."""
    if len(dims) > MAX_DIMS:
        raise SignatureError(
            diagnostic(
                f"{what} has {len(dims)} dimensions; numpy, which holds host copies, supports at most {MAX_DIMS}",
                help=f"use at most {MAX_DIMS} dimensions (merge some: tensors are contiguous)",
            )
        )
    span = math.prod(d for d in dims if d) * dtype.itemsize  # Python ints: numpy's int64 would wrap
    if span > MAX_ALLOCATION:
        if 0 in dims:
            head = f"{what} has no elements, but its other sizes span {span} bytes, more than any device addresses"
            help = "check the shape: the other sizes of a tensor with no elements must fit a real tensor"
        else:
            head, help = (
                f"{what} needs {span} bytes, more than any device holds",
                "check the shape; allocate what the program needs",
            )
        raise SignatureError(diagnostic(head, help=help))


def _refuse_bool(value: object, what: str, help: str) -> None:
    """Sizes and indices are ints; a bool is an int to Python, but passing one is a mistake."""
    if isinstance(value, (bool, np.bool_)):
        raise SignatureError(diagnostic(f"{what} is the bool {value!r}, not an integer", help=help))


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
