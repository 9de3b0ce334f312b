"""Operations. Every op knows the byte ranges it reads and writes (its borrows).

``GraphNode`` ops (memcpy, memset, kernel launches) touch only memory that exists before the
graph does, so they can be recorded and replayed. Allocation ops create memory: they only run
eagerly (``stream.run(op)`` returns the new Tensor), since their addresses would change on replay.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from ._borrow import Borrow, check_borrows
from ._dtypes import DType, DTypeLike, as_dtype, float32
from ._errors import NotAGraphNodeError, ScopeStateError, SignatureError, diagnostic
from ._tensor import Mut, Tensor, _refuse_bool, check_name, check_shape

if TYPE_CHECKING:
    from ._device import Device
    from ._stream import Stream

R_co = TypeVar("R_co", covariant=True)


class Op(Generic[R_co]):
    """Something a stream can run. ``R_co`` is what running it returns."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return type(self).__name__  # every op scopegraph builds has its own; messages name a bare one

    def execute(self, stream: Stream) -> R_co:
        raise not_an_op(self)  # every op scopegraph builds has its own


_PACKAGE = __name__.rpartition(".")[0] + "."  # "scopegraph.", or wherever a copy of it lives


def unknown_kind(op: GraphNode) -> NotAGraphNodeError:
    """The refusal of a GraphNode subclass that scopegraph does not define."""
    return NotAGraphNodeError(
        diagnostic(
            f"`{type(op).__name__}` is a GraphNode subclass that scopegraph does not define: "
            "the backends run only the kinds of node scopegraph builds",
            help="write the work as a kernel (@sg.kernel) and launch it, or launch another library's work "
            "inside `with s.capture(reads=[...], writes=[...]) as region:`",
        )
    )


def not_an_op(op: Op[Any]) -> NotAGraphNodeError:
    """The refusal of an op that no scopegraph constructor built (a bare ``sg.Op()`` or
    ``sg.GraphNode()``): it names nothing to read, write or make."""
    return NotAGraphNodeError(
        diagnostic(
            f"`{type(op).__name__}()` is not an op that can run or be recorded: no op constructor built it, "
            "so it names no tensors it reads or writes",
            help="run or record a real op: a kernel launch (kernel[grid, block](...)), sg.memcpy(dst.mut(), src), "
            "sg.memset(dst.mut(), value); stream.run also takes allocation ops (sg.zeros(...))",
        )
    )


class GraphNode(Op[None]):
    """An op that can be recorded into a graph: it reads and writes existing tensors only."""

    __slots__ = ("borrows", "device")

    borrows: list[Borrow]
    # None for an op that touches no tensor (e.g. an argument-less kernel): it runs on any stream's device.
    device: Device | None
    # Whether scopegraph defines this kind of node: the backends run only those (a user's subclass
    # would be nothing on the host and a failed graph build on a GPU).
    built_in: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.built_in = cls.__module__.startswith(_PACKAGE)

    def _claim(self, borrows: list[Borrow]) -> None:
        """Validate this op's borrows (one device, alive, not frozen, no aliasing) and remember its device."""
        device = borrows[0].alloc.device  # a tensor's device is its allocation's
        for b in borrows:
            if b.alloc.device is not device:
                raise SignatureError(
                    diagnostic(
                        f"`{self.name}` mixes devices",
                        [f"`{borrows[0].param}` is on {device}", f"`{b.param}` is on {b.tensor.device}"],
                        help="move the data to one device first (t.numpy() and dev.from_numpy())",
                    )
                )
        check_borrows(self.name, borrows)
        self.borrows = borrows
        self.device = device

    def execute(self, stream: Stream) -> None:
        stream.device.backend.run(self, stream)

    @property
    def tensors(self) -> list[Tensor]:
        return [b.tensor for b in self.borrows]

    def label(self) -> str:
        """One line for graph.nodes and DOT pictures: the op and the tensors it touches."""
        args = ", ".join(("mut " if b.mutable else "") + b.tensor.name for b in self.borrows)
        return f"{self.name}({args})"

    def __repr__(self) -> str:
        if not hasattr(self, "borrows"):  # a bare sg.GraphNode(), which no op constructor built
            return f"<{type(self).__name__}: not an op>"
        return self.label()


class RecordedOnce(GraphNode):
    """A node that its ``with`` block makes and records: a loop or a branch. Its bodies belong to
    that one recording (a rebind or a re-recording of the graph changes them in place), so
    recording it again, say ``g.nodes[i].op`` into another scope, is refused rather than leaving
    two graphs sharing one body. (scopegraph._control's ControlNode; the scope checks this base,
    as it cannot import that module.)"""

    __slots__ = ("taken",)

    taken: bool

    def take(self) -> None:
        """Called as the node is recorded: the first time only."""
        if self.taken:
            raise ScopeStateError(
                diagnostic(
                    f"`{self.name}` is recorded already, in the graph its `with` block recorded it into",
                    ["its bodies belong to that graph: a change to one graph would change the other"],
                    help="open the loop or branch again in this scope (s.while_, s.if_, s.if_else), "
                    "or launch the other graph",
                )
            )
        self.taken = True


def borrowed_tensor(value: object, mutable: bool, op: str, param: str, declared: str = "") -> Tensor:
    """The tensor an argument borrows, if it borrows the way the parameter is declared
    (``Mut[Tensor]`` when ``mutable``, else ``Tensor``); SignatureError says how to fix it."""
    if mutable and type(value) is Mut:
        tensor: Tensor = value.tensor
        return tensor
    if not mutable and isinstance(value, Tensor):
        return value
    notes = [declared] if declared else []
    if mutable and isinstance(value, Tensor):
        head, help = f"`{op}` writes `{param}`, so it needs a mutable borrow", f"pass `{value.name}.mut()`"
        notes.insert(0, f"`{param}` got `{value.name}` (a shared borrow)")
    elif not mutable and isinstance(value, Mut):
        head, help = (
            f"`{op}` only reads `{param}`, but it got a mutable borrow",
            f"pass `{value.tensor.name}` without .mut()",
        )
        notes.insert(0, f"`{param}` got `{value.tensor.name}.mut()`")
    else:
        expected = "Mut[Tensor]" if mutable else "Tensor"
        head, help = f"`{op}` parameter `{param}` expects {expected}, got {type(value).__name__}", "pass a tensor"
    raise SignatureError(diagnostic(head, notes, help=help))


class Memcpy(GraphNode):
    """Copy ``src`` into ``dst`` (same dtype and byte size; shapes may differ)."""

    __slots__ = ("dst", "src")

    def __init__(self, dst: Mut[Tensor], src: Tensor) -> None:
        self.dst = d = dst.tensor if type(dst) is Mut else borrowed_tensor(dst, True, "memcpy", "dst")
        self.src = s = src if isinstance(src, Tensor) else borrowed_tensor(src, False, "memcpy", "src")
        if d.nbytes != s.nbytes or (d.dtype is not s.dtype and d.dtype != s.dtype):
            raise SignatureError(
                diagnostic(
                    "memcpy sizes differ" if d.nbytes != s.nbytes else "memcpy dtypes differ",
                    [
                        f"`dst` is `{self.dst.name}`: {self.dst.dtype.name}{list(self.dst.shape)}, "
                        f"{self.dst.nbytes} bytes",
                        f"`src` is `{self.src.name}`: {self.src.dtype.name}{list(self.src.shape)}, "
                        f"{self.src.nbytes} bytes",
                    ],
                    help="copy between tensors of the same dtype and size; slice rows (t[a:b]) or view() to match",
                )
            )
        borrows = [Borrow(d, True, "dst"), Borrow(s, False, "src")]
        b0, b1 = borrows
        m0, m1 = b0.alloc, b1.alloc
        # What _claim checks, where it plainly holds; anything else gets its closer look (and errors).
        if (
            m0.device is not m1.device
            or m0.freed
            or m1.freed
            or m0.region.frozen
            or (b1.start < b0.end and b0.start < b1.end)
        ):
            self._claim(borrows)
        else:
            self.borrows = borrows
            self.device = m0.device

    @property
    def name(self) -> str:
        return "memcpy"


class Memset(GraphNode):
    """Set every element of ``dst`` to ``value``: elements of 1, 2 or 4 bytes, or 8-byte values whose
    two 4-byte halves are equal (0, -1: what the driver's 4-byte fill repeats); another 8-byte value
    is a SignatureError that names a kernel to use instead."""

    __slots__ = ("dst", "pattern", "value")

    def __init__(self, dst: Mut[Tensor], value: float | np.number[Any] | np.bool_) -> None:
        self.dst = d = dst.tensor if type(dst) is Mut else borrowed_tensor(dst, True, "memset", "dst")
        # Fills repeat a few values: (numpy scalar, pattern) by (dtype, type, value), for plain
        # ints and non-zero floats (0.0 == -0.0 as keys, but their bytes differ).
        kind = type(value)
        key = (d.dtype.name, kind, value)
        hit = _FILLS.get(key) if kind is int or (kind is float and value != 0.0) else None
        if hit is not None:
            self.value, self.pattern = hit
            borrow = Borrow(d, True, "dst")
            alloc = borrow.alloc
            if alloc.freed or alloc.region.frozen:
                self._claim([borrow])  # the closer look (and its errors)
            else:
                self.borrows = [borrow]
                self.device = alloc.device
            return
        self.value = d.dtype.scalar(value, f"the memset value for `{d.name}`")
        raw = memset_pattern(self.value)
        if raw is None:
            raise SignatureError(
                diagnostic(
                    f"memset cannot fill `{self.dst.name}` ({self.dst.dtype.name}) with {value!r}",
                    ["the driver fills 1-, 2- or 4-byte patterns; this value's 8 bytes do not repeat"],
                    help=f"fill it with a kernel of your own for {self.dst.dtype.name} (sg.library.fill is for f32), "
                    "or memset a value whose 8 bytes repeat in 4-byte halves (0, -1)",
                )
            )
        # The repeating unit the driver writes, as raw bytes.
        self.pattern = raw
        if kind is int or (kind is float and value != 0.0):
            if len(_FILLS) >= 1024:
                _FILLS.clear()
            _FILLS[key] = (self.value, raw)
        self._claim([Borrow(self.dst, True, "dst")])

    @property
    def name(self) -> str:
        return "memset"

    def label(self) -> str:
        return f"memset(mut {self.dst.name}, {self.value.item()!r})"


_FILLS: dict[tuple[str, type, object], tuple[np.generic, bytes]] = {}


def memset_pattern(value: np.generic) -> bytes | None:
    """The 1-, 2- or 4-byte unit the driver repeats to write ``value``, or None if there is none."""
    raw = value.tobytes()
    if len(raw) == 8 and raw[:4] == raw[4:]:
        raw = raw[:4]
    return raw if len(raw) in (1, 2, 4) else None


def memcpy(dst: Mut[Tensor], src: Tensor) -> Memcpy:
    """A graph node that copies ``src`` into ``dst``."""
    return Memcpy(dst, src)


def memset(dst: Mut[Tensor], value: float | np.number[Any] | np.bool_) -> Memset:
    """A graph node that fills ``dst`` with ``value`` (for 8-byte dtypes, see :class:`Memset`)."""
    return Memset(dst, value)


class Join(GraphNode):
    """An empty node the dependency tracker inserts where many readers meet one writer: the
    writer waits for the join, the join for the readers (see ``_tracker``). It touches nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        self.borrows = []
        self.device = None

    @property
    def name(self) -> str:
        return "join"


class AllocationOp(Op[Tensor]):
    """Creates a tensor. Not a GraphNode: run it with ``stream.run(op)``, before any scope."""

    __slots__ = ("dtype", "fill", "kind", "label_name", "shape", "source")

    def __init__(
        self,
        kind: str,
        shape: tuple[int, ...],
        dtype: DType,
        fill: object = None,
        source: np.ndarray[Any, Any] | Tensor | None = None,
        name: str | None = None,
    ) -> None:
        self.kind = kind
        self.shape = shape
        self.dtype = dtype
        self.fill = fill
        self.source = source
        self.label_name = name

    @property
    def name(self) -> str:
        return f"sg.{self.kind}"

    def __repr__(self) -> str:
        return f"{self.name}({self.shape}, {self.dtype!r})"

    def execute(self, stream: Stream) -> Tensor:
        device = stream.device
        if self.kind == "dup":
            assert isinstance(self.source, Tensor)
            tensor = device.empty(self.shape, self.dtype, name=self.label_name)
            Memcpy(tensor.mut(), self.source).execute(stream)
            return tensor
        if self.kind == "from_numpy":
            assert isinstance(self.source, np.ndarray)
            return device.from_numpy(self.source, name=self.label_name, stream=stream)
        tensor = device.empty(self.shape, self.dtype, name=self.label_name)
        if self.kind != "empty":
            if memset_pattern(self.dtype.scalar(self.fill)) is not None:
                Memset(tensor.mut(), self.fill).execute(stream)  # type: ignore[arg-type]
            else:
                device.backend.write(tensor, np.full(self.shape, self.fill, self.dtype.numpy), stream)
        return tensor


def _shape(shape: object, dtype: DType) -> tuple[int, ...]:
    """The shape of a new tensor of ``dtype``, as a tuple of ints; SignatureError if it is not one
    or cannot be allocated. (An int, a tuple or list of them, or a 1-d integer array, as numpy takes.)"""
    given: tuple[Any, ...]
    if isinstance(shape, (tuple, list)) or (isinstance(shape, np.ndarray) and shape.ndim == 1):
        given = tuple(shape)
    else:
        given = (shape,)
    for d in given:
        _refuse_bool(d, f"a size in shape {shape!r}", "pass sizes as ints, e.g. (1,) rather than (True,)")
    try:
        dims = tuple(operator.index(d) for d in given)
    except TypeError:
        raise SignatureError(f"shape {shape!r} is not an int or a tuple of ints\nhelp: pass e.g. (16, 128)") from None
    if any(d < 0 for d in dims):
        raise SignatureError(f"shape {dims} has a negative dimension\nhelp: use non-negative sizes")
    check_shape(dims, dtype, f"a tensor of shape {dims} and dtype {dtype.name}")
    return dims


def _zero(dtype: DType) -> bool | int:
    """The fill of ``zeros``: False for the boolean type (which takes only bools), else 0."""
    return False if dtype.numpy.kind == "b" else 0


def zeros(
    shape: int | tuple[int, ...] | list[int], dtype: DTypeLike = float32, name: str | None = None
) -> AllocationOp:
    """An allocation op: a new tensor filled with zeros. Run with ``stream.run``."""
    check_name(name, "sg.zeros()")
    dt = as_dtype(dtype)
    return AllocationOp("zeros", _shape(shape, dt), dt, _zero(dt), name=name)


def empty(
    shape: int | tuple[int, ...] | list[int], dtype: DTypeLike = float32, name: str | None = None
) -> AllocationOp:
    """An allocation op: a new, uninitialised tensor. Run with ``stream.run``."""
    check_name(name, "sg.empty()")
    dt = as_dtype(dtype)
    return AllocationOp("empty", _shape(shape, dt), dt, name=name)


def full(
    shape: int | tuple[int, ...] | list[int], value: float, dtype: DTypeLike = float32, name: str | None = None
) -> AllocationOp:
    """An allocation op: a new tensor with every element ``value``. Run with ``stream.run``."""
    check_name(name, "sg.full()")
    dt = as_dtype(dtype)
    return AllocationOp("full", _shape(shape, dt), dt, dt.scalar(value, "the fill value"), name=name)


def dup(tensor: Tensor, name: str | None = None) -> AllocationOp:
    """An allocation op: a new tensor holding a copy of ``tensor``. Run with ``stream.run``."""
    if not isinstance(tensor, Tensor):
        raise SignatureError(
            diagnostic(
                f"sg.dup() copies a scopegraph Tensor, not {type(tensor).__name__}",
                help="for a numpy array use sg.from_numpy(array) (or dev.from_numpy); "
                "wrap another library's GPU array with sg.Tensor.from_dlpack first",
            )
        )
    check_name(name, "sg.dup()")
    tensor.check_alive()
    return AllocationOp("dup", tensor.shape, tensor.dtype, source=tensor, name=name)


def from_numpy(array: np.ndarray[Any, Any], name: str | None = None) -> AllocationOp:
    """An allocation op: a new tensor holding a copy of ``array`` as it is when the op runs (with
    ``stream.run``)."""
    check_name(name, "sg.from_numpy()")
    if not isinstance(array, np.ndarray):
        raise SignatureError(
            diagnostic(
                f"sg.from_numpy() takes a numpy array, not {type(array).__name__}",
                help="copy a scopegraph tensor with sg.dup(t); convert anything else with numpy.asarray(...) first",
            )
        )
    # The array itself: Device.from_numpy copies it when the op runs (refusing memory the device
    # lacks before it makes a contiguous copy).
    return AllocationOp("from_numpy", array.shape, as_dtype(array.dtype), source=array, name=name)
