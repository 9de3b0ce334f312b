"""scopegraph: safe, cheap CUDA graphs from Python.

import scopegraph as sg
from scopegraph import CudaGraph

dev = sg.device()
stream = dev.stream()
with CudaGraph.scope(stream) as s:
    s.record(sg.memcpy(y.mut(), x))
s.graph.launch()
"""

from . import (
    _interop,  # noqa: F401  (registers Tensor.from_dlpack's wrapper)
    library,
)
from ._bootstrap import DistributedError
from ._cache import GraphCache, bucket
from ._capture import Captured, CaptureError, Region  # also registers s.capture
from ._collectives import (  # also registers the check that every rank recorded the same collectives
    Collective,
    CollectiveMismatchError,
    Communicator,
    all_gather,
    all_reduce,
    broadcast,
    init_distributed,
    reduce_scatter,
)
from ._control import Body, ControlNode, If, LoopLimitError, While  # also registers s.while_, s.if_, s.if_else
from ._device import Device, device
from ._dtypes import (
    DType,
    f16,
    f32,
    f64,
    float16,
    float32,
    float64,
    i8,
    i16,
    i32,
    i64,
    int8,
    int16,
    int32,
    int64,
    u8,
    u32,
    u64,
    uint8,
    uint32,
    uint64,
)
from ._errors import (
    BorrowError,
    BoundsError,
    CompileError,
    CudaError,
    ExportArgumentError,
    ExportError,
    FrozenExportError,
    HostReferenceError,
    LaunchResourceError,
    LifetimeError,
    NoHostReferenceError,
    NotAGraphNodeError,
    NotCopyableError,
    PdlWaitError,
    ScopeGraphError,
    ScopeStateError,
    SignatureError,
)
from ._graph import CudaGraph
from ._kernel import Kernel, KernelLaunch, TensorSpec, kernel
from ._ops import AllocationOp, GraphNode, Join, Memcpy, Memset, Op, dup, empty, from_numpy, full, memcpy, memset, zeros
from ._params import Param
from ._scope import RecordedNode, Scope
from ._stream import Stream
from ._tensor import Mut, Tensor, mut
from ._version import __version__

__all__ = [
    "AllocationOp",
    "Body",
    "BorrowError",
    "BoundsError",
    "CaptureError",
    "Captured",
    "Collective",
    "CollectiveMismatchError",
    "Communicator",
    "CompileError",
    "ControlNode",
    "CudaError",
    "CudaGraph",
    "DType",
    "Device",
    "DistributedError",
    "ExportArgumentError",
    "ExportError",
    "FrozenExportError",
    "GraphCache",
    "GraphNode",
    "HostReferenceError",
    "If",
    "Join",
    "Kernel",
    "KernelLaunch",
    "LaunchResourceError",
    "LifetimeError",
    "LoopLimitError",
    "Memcpy",
    "Memset",
    "Mut",
    "NoHostReferenceError",
    "NotAGraphNodeError",
    "NotCopyableError",
    "Op",
    "Param",
    "PdlWaitError",
    "RecordedNode",
    "Region",
    "Scope",
    "ScopeGraphError",
    "ScopeStateError",
    "SignatureError",
    "Stream",
    "Tensor",
    "TensorSpec",
    "While",
    "__version__",
    "all_gather",
    "all_reduce",
    "broadcast",
    "bucket",
    "device",
    "dup",
    "empty",
    "f16",
    "f32",
    "f64",
    "float16",
    "float32",
    "float64",
    "from_numpy",
    "full",
    "i8",
    "i16",
    "i32",
    "i64",
    "init_distributed",
    "int8",
    "int16",
    "int32",
    "int64",
    "kernel",
    "library",
    "memcpy",
    "memset",
    "mut",
    "reduce_scatter",
    "u8",
    "u32",
    "u64",
    "uint8",
    "uint32",
    "uint64",
    "zeros",
]
