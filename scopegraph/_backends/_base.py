"""What a backend provides: memory, streams, eager execution of ops, and executable graphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .._allocation import Allocation
    from .._ops import GraphNode
    from .._scope import RecordedNode
    from .._stream import Stream
    from .._tensor import Tensor


class Executable(Protocol):
    """A backend's instantiated graph."""

    # How many of its node updates were made as whole-graph updates (a driver that refuses node
    # updates inside loop and branch bodies); tells graph.last_update which kind happened.
    whole_updates: int
    # Whether its edges between PDL kernels are programmatic (sm_90+; scopegraph._pdl).
    pdl: bool

    def launch(self, stream: Stream) -> None: ...

    def close(self) -> None: ...

    # changes (scopegraph._params, _rebind): for the replays launched from now on
    def update_node(self, index: int, op: GraphNode, values: Mapping[str, np.generic]) -> None:
        """Node ``index`` runs ``op`` (the same kind of node) with these sg.Param values."""

    def update_whole(self, nodes: Sequence[RecordedNode]) -> bool:
        """Take a recording of the same topology; False if the backend refuses (then rebuild)."""

    # bounded loops (scopegraph._control): what a replay could not raise at once
    def after_sync(self, last: Stream) -> None:
        """graph.sync(), under the graph's lock: raise LoopLimitError for a loop a replay so far
        (the last one on ``last``) stopped at its bound."""

    def take_reports_of(self, replaced: Executable) -> None:
        """This executable replaces ``replaced`` (a recording into the graph rebuilt it): report
        what ``replaced``'s replays left unreported too."""


class Backend(Protocol):
    """The operations the device-independent layers need from a backend."""

    name: str

    # memory: allocate returns (storage, device address); retire releases storage once the
    # work `users` stand for (streams, marks) has finished (it must not raise: GC calls it)
    def allocate(self, nbytes: int) -> tuple[object, int]: ...
    def retire(self, storage: object, users: set[object], borrowed: bool) -> None: ...
    def read(self, alloc: Allocation, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
    def write(self, tensor: Tensor, array: np.ndarray[Any, Any], stream: Stream | None) -> None: ...

    # streams
    def create_stream(self) -> object: ...
    def stream_from_handle(self, obj: object) -> tuple[object, int]: ...
    def sync_stream(self, stream: Stream) -> None: ...
    def wait_stream(self, waiter: object, waited: object) -> None: ...
    def sync(self) -> None: ...

    # marks: what stands for the work queued on a stream so far, once nothing new of a holder will
    # be queued there (a closed graph's replays). `wait_stream` and `retire` take marks as well as
    # streams; a finished one can be dropped, and a mark lets its stream go (see _lifetime). Idle:
    # one of scopegraph's own streams with nothing left to run, an answer that may go stale
    def mark(self, stream: object) -> object: ...
    def finished(self, mark: object) -> bool: ...
    def idle(self, stream: object) -> bool: ...

    # whether another library captures the stream (a raw handle) into a CUDA graph now; and a
    # context in which calls that touch no stream it captures leave that capture valid
    def captures(self, handle: int) -> bool: ...
    def relaxed(self) -> AbstractContextManager[None]: ...

    # eager ops
    def prepare(self, op: GraphNode) -> None:
        """Check (and on CUDA, compile) an op before it is run or recorded."""

    def run(self, op: GraphNode, stream: Stream) -> None: ...

    # graphs
    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> Executable: ...

    # interop
    def ready_stream(self, alloc: Allocation) -> int | None: ...
    # writable: whether the tensor was mutable when the export began (Tensor.__dlpack__ reads it
    # once; an export of bytes frozen since is refused, see _allocation.Export)
    def dlpack(self, tensor: Tensor, stream: int | None, options: dict[str, Any], writable: bool) -> object: ...
    def dlpack_device(self) -> tuple[int, int]: ...
