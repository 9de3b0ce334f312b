"""Streams: where eager work runs in order, and what a scope records on.

Thread safety: a Stream may be used from several threads (CUDA orders the work it receives), but
one scope records from one thread; a stream that a scope records on refuses eager work from all
(but a GraphCache's scope for a miss: only from its own thread, see ``check_not_recording``).
"""

from __future__ import annotations

import itertools
import numbers
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex, TypeVar

from ._borrow import check_frozen
from ._errors import NotAGraphNodeError, ScopeStateError, SignatureError, diagnostic, not_copyable
from ._lifetime import hold
from ._ops import GraphNode, Op, not_an_op

if TYPE_CHECKING:
    from ._device import Device
    from ._scope import Scope

R = TypeVar("R")
_stream_ids = itertools.count(1)

# Set by ``_device`` on import: finds the Device for "cuda:N" (a hook, not an import, since
# devices make streams).
device_lookup: Callable[[Device | str], Device] | None = None


# The Stream of each CUDA stream: wrapping one twice (dev.stream().native, or a torch stream,
# passed to from_handle) gives the same Stream, so a scope recording on it refuses eager work
# through every wrapper. Keyed by device and handle; handles 0 and 1 both name the device's
# legacy default stream (handle 2, the per-thread default stream, is refused: see from_handle).
_by_handle: weakref.WeakValueDictionary[tuple[int, int], Stream] = weakref.WeakValueDictionary()
_by_handle_lock = threading.RLock()  # Stream() registers itself under it too
PER_THREAD_DEFAULT_STREAM = 2  # cudaStreamPerThread's handle


def _key(device: Device, handle: int) -> tuple[int, int]:
    return (device.index, 0 if handle in (0, 1) else handle)


class Stream:
    """An ordered queue of work on one device. ``run`` executes any op eagerly, in stream order."""

    __slots__ = ("__weakref__", "device", "foreign", "handle", "id", "last_work", "native", "recording")

    def __init__(self, device: Device, native: object) -> None:
        self.device = device
        # The backend's stream object (a cuda.core Stream on CUDA, None on the host backend).
        self.native = native
        # The scope recording on this stream, if any: eager work then would run before the graph.
        self.recording: Scope | None = None
        self.id = next(_stream_ids)
        # What was last submitted here (an op's name, or a graph's id), named if the GPU faults later.
        self.last_work: str | int = ""
        # Another library's stream (from_handle), which that library may capture into its own graph.
        self.foreign = False
        # The raw cudaStream_t (0 on the host backend), read once: cuda.core makes an object per read.
        self.handle = int(native.__cuda_stream__()[1]) if native is not None else 0  # type: ignore[attr-defined]
        if native is not None:
            with _by_handle_lock:
                _by_handle.setdefault(_key(device, self.handle), self)
            hold(native, self)

    # One Stream per CUDA stream (see from_handle): a copy is the stream itself.
    def __copy__(self) -> Stream:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Stream:
        return self

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:  # pickle
        raise not_copyable(f"stream #{self.id} on {self.device}", "make one in the other process: dev.stream()")

    def __repr__(self) -> str:
        return f"<Stream #{self.id} on {self.device}>"

    @property
    def __cuda_stream__(self) -> Callable[[], tuple[int, int]]:
        """The CUDA stream protocol, on a CUDA device only: a host backend stream has no CUDA
        stream, so ``hasattr(stream, "__cuda_stream__")`` is False there, as other libraries test."""
        if self.native is None:
            raise AttributeError(f"{self!r} is a host backend stream: it has no CUDA stream (__cuda_stream__)")
        return self.native.__cuda_stream__  # type: ignore[attr-defined,no-any-return]

    def check_not_recording(self, what: str) -> None:
        scope = self.recording
        if scope is None or (scope.opened_by and scope.thread != threading.get_ident()):
            return  # a GraphCache building a graph on another thread: its program is not this thread's
        by = f" by {scope.opened_by}" if scope.opened_by else ""
        raise ScopeStateError(
            diagnostic(
                f"cannot {what} on stream #{self.id} while a scope is recording on it",
                [
                    f"the scope was opened{by} at {scope.opened_at}",
                    "eager work here would run before the graph ever does",
                ],
                help="record the op with s.record(op), or run it on another stream or after the scope",
            )
        )

    @property
    def captured(self) -> bool:
        """Whether this stream is being captured into a CUDA graph now (PyTorch's
        ``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``): work on it then is
        refused (``captured_error``), as it would become part of a graph whose replays scopegraph
        never sees. A driver query: the hot paths ask it of another library's stream only
        (``foreign and captured``), the one kind another library captures."""
        return self.device.backend.captures(self.handle)

    def captured_error(self, what: str) -> ScopeStateError:
        """The refusal of ``what`` while ``captured`` (the checks race with a capture that begins
        at that moment, which nothing outside the capturing library can prevent)."""
        return ScopeStateError(
            diagnostic(
                f"cannot {what} on stream #{self.id}: another library is capturing it into a CUDA graph",
                [
                    "the work would become part of that graph, whose replays scopegraph does not see: it could "
                    "neither keep their memory alive nor order them after its own work"
                ],
                help="do it before or after the capture, or on a stream the capture does not use",
            )
        )

    def run(self, op: Op[R]) -> R:
        """Execute ``op`` now, in stream order. Allocation ops return their new Tensor."""
        if self.recording is not None:
            self.check_not_recording(f"run `{getattr(op, 'name', type(op).__name__)}`")
        if self.foreign and self.captured:
            raise self.captured_error(f"run `{getattr(op, 'name', type(op).__name__)}`")
        if isinstance(op, GraphNode):
            check_runnable(op, self)
        elif not isinstance(op, Op):
            raise NotAGraphNodeError(
                f"stream.run() takes an op (sg.memcpy, a kernel launch, sg.zeros, ...), not {type(op).__name__}\n"
                "help: build the op first, e.g. stream.run(sg.memcpy(dst.mut(), src))"
            )
        return op.execute(self)

    def sync(self) -> None:
        """Wait for all work submitted to this stream."""
        if self.foreign and self.captured:
            raise self.captured_error("synchronise")
        self.device.backend.sync_stream(self)

    @staticmethod
    def from_handle(obj: Any, device: Device | str | None = None) -> Stream:
        """Wrap a stream from another library (anything with ``__cuda_stream__``, e.g. a torch or
        CuPy stream, or a cuda.core Stream) without owning it, on the device the stream belongs to.
        A scopegraph Stream is returned as it is, and so is the one that already wraps the same
        CUDA stream (one stream, one recording state)."""
        get_device = device_lookup
        assert get_device is not None, "scopegraph._device registers the lookup on import"
        if isinstance(obj, Stream):
            return obj
        if not hasattr(obj, "__cuda_stream__"):
            raise SignatureError(
                diagnostic(
                    f"Stream.from_handle() got {type(obj).__name__}, which is not a CUDA stream",
                    ["a foreign stream is recognised by its __cuda_stream__ protocol"],
                    help="pass a torch.cuda.Stream, a cupy Stream, a cuda.core Stream or another object with "
                    "__cuda_stream__; for the host backend use sg.device('host').stream()",
                )
            )
        _check_protocol(obj)
        if int(obj.__cuda_stream__()[1]) == PER_THREAD_DEFAULT_STREAM:
            raise SignatureError(
                diagnostic(
                    f"Stream.from_handle() got the per-thread default stream (cudaStreamPerThread) from "
                    f"{type(obj).__name__}",
                    [
                        "its handle names a different stream in each thread, and scopegraph waits for a "
                        "stream from other threads (a free(), a replay on another stream): it would wait "
                        "for the wrong one"
                    ],
                    help="give the work a stream of its own: dev.stream(), torch.cuda.Stream() or "
                    "cupy.cuda.Stream(), and wrap that",
                )
            )
        dev = get_device("cuda" if device is None else device)
        if not dev.is_cuda:
            raise SignatureError(
                diagnostic(
                    f"Stream.from_handle() got device={device!r}, but a foreign stream needs a CUDA device",
                    [f"{type(obj).__name__} has __cuda_stream__: its work runs on a GPU, which {dev} is not"],
                    help='leave device= out (the stream\'s GPU is found from it) or name one ("cuda:N"); '
                    "for the host backend use sg.device('host').stream()",
                )
            )
        native, index = dev.backend.stream_from_handle(obj)
        if index != dev.index:
            if device is not None:
                raise SignatureError(
                    f"the stream belongs to cuda:{index}, not {dev}\n"
                    "help: leave device= out (it is found from the stream)"
                )
            dev = get_device(f"cuda:{index}")
        key = _key(dev, int(native.__cuda_stream__()[1]))  # type: ignore[attr-defined]
        with _by_handle_lock:  # one Stream, also when two threads wrap the stream at once
            known = _by_handle.get(key)
            if known is not None:
                return known
            wrapped = Stream(dev, native)  # which registers itself
            wrapped.foreign = True
            return wrapped


def _check_protocol(obj: Any) -> None:
    """``obj.__cuda_stream__()`` gives (version, handle), two ints, as the protocol says: cuda.core
    would refuse anything else with a RuntimeError (or crash on a handle that is no stream)."""
    try:
        answer = obj.__cuda_stream__()
        fits = (
            isinstance(answer, (tuple, list))
            and len(answer) == 2
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in answer)
        )
    except Exception as exc:  # the other library's own error: reported, not passed on
        answer, fits = f"an error ({type(exc).__name__}: {exc})", False
    if not fits:
        raise SignatureError(
            diagnostic(
                f"Stream.from_handle() got {type(obj).__name__}, whose __cuda_stream__() gave {answer!r}",
                ["the CUDA stream protocol's __cuda_stream__() returns (version, handle): two ints"],
                help="pass the stream object of torch, CuPy or cuda.core itself, or fix its __cuda_stream__",
            )
        )


def check_runnable(op: GraphNode, stream: Stream) -> None:
    """What must hold when a graph node is run or recorded: live memory, nothing frozen written
    (``freeze()`` may have come after the op was built), the stream's device."""
    try:
        borrows, device = op.borrows, op.device
    except AttributeError:  # a bare sg.GraphNode(): caught here, where a check costs nothing until it fails
        raise not_an_op(op) from None
    for b in borrows:
        alloc = b.alloc
        if alloc.freed or (b.mutable and alloc.region.frozen):
            b.tensor.check_alive()
            check_frozen(op.name, [b])  # the name only when a frozen region is in play
    if device is not stream.device and device is not None:
        raise SignatureError(
            diagnostic(
                f"`{op.name}` uses tensors on {op.device} but the stream is on {stream.device}",
                help="use a stream of the tensors' device (tensor.device.stream())",
            )
        )
    stream.device.backend.prepare(op)  # refuses node kinds scopegraph does not define, too
