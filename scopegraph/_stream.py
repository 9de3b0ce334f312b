"""Streams: where eager work runs in order, and what a scope records on."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import NotAGraphNodeError, ScopeStateError, SignatureError, diagnostic
from ._ops import GraphNode, Op

if TYPE_CHECKING:
    from ._device import Device
    from ._scope import Scope

R = TypeVar("R")
_stream_ids = itertools.count(1)


class Stream:
    """An ordered queue of work on one device. ``run`` executes any op eagerly, in stream order."""

    __slots__ = ("device", "native", "recording", "id", "__weakref__")

    def __init__(self, device: Device, native: object) -> None:
        self.device = device
        # The backend's stream object (a cuda.core Stream on CUDA, None on the host backend).
        self.native = native
        # The scope recording on this stream, if any: eager work then would run before the graph.
        self.recording: Scope | None = None
        self.id = next(_stream_ids)

    def __repr__(self) -> str:
        return f"<Stream #{self.id} on {self.device}>"

    def __cuda_stream__(self) -> tuple[int, int]:
        return self.native.__cuda_stream__()  # type: ignore[attr-defined,no-any-return]

    def check_not_recording(self, what: str) -> None:
        scope = self.recording
        if scope is not None:
            raise ScopeStateError(
                diagnostic(
                    f"cannot {what} on stream #{self.id} while a scope is recording on it",
                    [f"the scope was opened at {scope.opened_at}", "eager work here would run before the graph ever does"],
                    help="record the op with s.record(op), or run it on another stream or after the scope",
                )
            )

    def run(self, op: Op[R]) -> R:
        """Execute ``op`` now, in stream order. Allocation ops return their new Tensor."""
        if self.recording is not None:
            self.check_not_recording(f"run `{getattr(op, 'name', type(op).__name__)}`")
        if isinstance(op, GraphNode):
            check_runnable(op, self)
        elif not isinstance(op, Op):
            raise NotAGraphNodeError(
                f"stream.run() takes an op (sg.memcpy, a kernel launch, sg.zeros, ...), not {type(op).__name__}"
            )
        return op.execute(self)

    def sync(self) -> None:
        """Wait for all work submitted to this stream."""
        self.device.backend.sync_stream(self.native)

    @staticmethod
    def from_handle(obj: Any, device: Device | None = None) -> Stream:
        """Wrap a stream from another library (anything with ``__cuda_stream__``) without owning it."""
        from ._device import device as get_device

        dev = get_device(device if device is not None else ("cuda" if hasattr(obj, "__cuda_stream__") else "host"))
        return Stream(dev, dev.backend.stream_from_handle(obj))


def check_runnable(op: GraphNode, stream: Stream) -> None:
    """What must hold when a graph node is run or recorded: live memory, the stream's device."""
    for b in op.borrows:
        if b.alloc.freed:
            b.tensor.check_alive()
    device = op.device
    if device is not stream.device and device is not None:
        raise SignatureError(
            diagnostic(
                f"`{op.name}` uses tensors on {op.device} but the stream is on {stream.device}",
                help="use a stream of the tensors' device (tensor.device.stream())",
            )
        )
    stream.device.backend.prepare(op)
