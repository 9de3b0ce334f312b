"""Foreign work inside a graph: captured regions (DESIGN.md section 9).

    a_t, b_t, c_t = (torch.from_dlpack(t) for t in (a, b, c))      # foreign views, made before the scope
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(a.mut(), 1.0))
        with s.capture(reads=[a, b], writes=[c.mut()], via="torch", name="matmul",
                       host=lambda c, a, b: np.matmul(a, b, out=c)) as region:
            if region.capturing:                                   # False on the host backend
                torch.matmul(a_t, b_t, out=c_t)                    # runs on region.torch_stream
        s.record(library.axpy_op(y.mut(), c, 2.0))

The region declares what the foreign work reads (``reads=[t, ...]``) and writes (``writes=[t.mut(),
...]``). Those borrows are checked when ``s.capture(...)`` is called, like any op's (a write that
overlaps another declared tensor, or a write to a frozen tensor, is a BorrowError at that line), and
the whole region becomes ONE node of the scope's DAG, ordered by those borrows: after the ops that
write what it reads, before the ops that read or overwrite what it writes. Declaring less than the
work touches is the user's promise broken; scopegraph cannot see inside another library's kernels.

How the work is captured (``via=``):

- ``"cuda"`` (default): through cuda.core's graph builder on a capture stream of scopegraph's own
  (``stream.create_graph_builder().begin_building(mode)``). Launch the work on ``region.stream`` (a
  cuda.core Stream; ``region.handle`` is its ``cudaStream_t`` as an int, e.g. for
  ``cupy.cuda.ExternalStream(region.handle)``). The builder's ``graph_definition`` is embedded as a
  child-graph node (``GraphDefinition.embed``) when the scope builds its graph.
- ``"torch"``: through ``torch.cuda.graph(g, stream=..., capture_error_mode=mode)`` with
  ``g = torch.cuda.CUDAGraph(keep_graph=True)``; ``region.torch_stream`` is the capture stream (made
  current inside the region). PyTorch's private memory pool for the capture stays with ``g``, and
  ``g.raw_cuda_graph()`` becomes the child graph. cuBLAS is warmed up on the capture stream once
  per thread (PyTorch's cuBLAS handle is the thread's: it and its workspace are made before the
  thread's first capture, not during it).

What the region keeps alive as long as the scopegraph graph lives: the captured definition, the
torch ``CUDAGraph`` (its memory pool holds the work's temporaries), and whatever is passed as
``keep=[...]`` or to ``region.hold(obj)`` (a library's module or kernel object the captured nodes
point at). The graph holds its nodes' ops, the op holds these.

Refusals, each a :class:`CaptureError` (a ScopeGraphError) raised from the ``with`` block, with the
capture ended, so the scope's stream and the capture stream stay usable:

- an allocation during capture: CuPy's allocator is swapped for one that refuses while a region
  captures; PyTorch memory still allocated when the capture ends (a new tensor made inside the
  region: write into a declared tensor with ``out=`` instead); allocation nodes in a captured graph;
  a raw ``cudaMalloc`` or synchronising call (refused by the driver in the default
  ``mode="thread_local"``, which invalidates the capture);
- a capture that fails: anything the foreign library raises inside the region, and a capture the
  driver invalidated;
- work left on another stream: a stream that joined the capture (waited on the capture stream) and
  was not joined back (the capture stream must wait on it before the region ends).

On the host backend nothing is captured: ``region.capturing`` is False, the block should skip its
GPU work, and the node runs ``host`` instead, called with numpy views of the declared tensors, the
writes first (writable), then the reads (read-only): ``host(*writes, *reads)``. A region without
``host`` is refused on the host backend (NoHostReferenceError).

Regions never run at the same time as each other, even when their declared borrows would let
them: each also borrows its device's ``foreign scratch`` token mutably (not shown in its label), so
the regions of a recording form a chain in record order, and graphs that hold regions order their
replays as graphs sharing memory do. The libraries scopegraph captures keep scratch memory it
cannot see, per stream: cuBLAS's workspace is one buffer for every GEMM captured on a capture
stream, and two captured GEMMs run at once overwrite each other's partial sums.

Random numbers drawn by PyTorch inside a ``via="torch"`` region repeat on every replay:
PyTorch moves its generator's offset on in ``CUDAGraph.replay()``, and scopegraph replays the
captured graph inside its own. Draw them outside the region (a kernel of your own, or torch work
before the scope) if they must change between replays.

Collectives (``scopegraph._collectives``) are captured nodes too: their NCCL calls are captured
into a child graph when the scope builds its graph (they keep a token of their own).

In a loop or branch body (``body.capture(...)``, same arguments) the region's node runs in every
iteration, or when the branch is taken. A CUDA conditional body holds only kernel, memcpy, memset,
empty, child-graph and conditional nodes, child graphs included, so a capture holding anything
else (an event record or wait, a host callback) is a CaptureError when the region's block ends
(:func:`check_body_graph`), before anything is built.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _scope
from ._borrow import Borrow
from ._dtypes import int32
from ._errors import (
    NoHostReferenceError,
    NotAGraphNodeError,
    ScopeGraphError,
    ScopeStateError,
    SignatureError,
    diagnostic,
    host_code_failed,
)
from ._ops import GraphNode, borrowed_tensor
from ._scope import RecordedNode, Scope, _State, not_open, unentered_in
from ._tensor import Mut, Tensor

if TYPE_CHECKING:
    from cuda.core.graph import GraphDefinition

    from ._backends._cuda import CudaBackend
    from ._control import Body
    from ._device import Device
    from ._stream import Stream

NDArray = np.ndarray[Any, np.dtype[Any]]
# Binds a tensor to the host backend's numpy view of it (writable or not): passed in by the host
# backend, so this module does not import it.
ArrayOf = Callable[[Tensor, bool], NDArray]

VIAS = ("cuda", "torch")
MODES = ("thread_local", "global", "relaxed")


class CaptureError(ScopeGraphError):
    """A captured region failed: its work allocated memory, the capture failed or was invalidated,
    or work was left on a stream that was not joined back to the capture stream."""


def _check_host(host: object, what: str, arguments: list[str]) -> None:
    """``host`` must be callable as ``host(*writes, *reads)``: refused at the region's line, not
    at the first replay on the host backend."""
    if not callable(host):
        raise SignatureError(f"{what}: host= must be a callable, not {type(host).__name__}\nhelp: pass a function")
    try:
        signature = inspect.signature(host)
    except (TypeError, ValueError):  # a builtin without a signature: checked when it runs
        return
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise SignatureError(
            diagnostic(
                f"{what}: the host callable {getattr(host, '__name__', repr(host))}{signature} cannot take "
                f"the region's {len(arguments)} tensors ({exc})",
                ["the host backend calls it as host(*writes, *reads): " + (", ".join(arguments) or "no tensors")],
                help=f"give it {len(arguments)} positional parameters, the writes first, then the reads",
            )
        ) from None


_REGION = object()  # what Region passes to Captured: the only maker of one

# The borrow that orders captured regions after each other (see the module docstring): of a token
# per device, made on first use, which lives as long as the process (devices do too).
SCRATCH = "foreign scratch"
_scratch: dict[Device, Tensor] = {}
_scratch_lock = threading.Lock()


def scratch_token(device: Device) -> Tensor:
    """The ``foreign scratch`` token of ``device``: every captured region borrows it mutably."""
    with _scratch_lock:
        token = _scratch.get(device)
        if token is None:
            # Uninitialised (nothing reads it), and made without running an op on the setup stream,
            # which a scope may be recording on.
            token = _scratch[device] = device.empty((1,), int32, name=SCRATCH)
        return token


class Captured(GraphNode):
    """Foreign GPU work as one child-graph node: declared reads and writes, the captured graph
    (``definition``, set when the region's capture ends), what must stay alive with it (``kept``),
    and the host backend's stand-in (``host``). Not runnable eagerly: it runs inside a graph."""

    __slots__ = ("definition", "host", "kept", "label_name", "nodes_captured", "reads", "where", "writes")

    def __init__(
        self,
        name: str,
        writes: Sequence[Mut[Tensor]],
        reads: Sequence[Tensor],
        host: Callable[..., object] | None,
        where: str,
        *,
        region: object = None,
    ) -> None:
        if region is not _REGION:  # its captured graph would be missing on a GPU
            raise NotAGraphNodeError(
                diagnostic(
                    "sg.Captured is made by a captured region, not directly: its graph is what the region captures",
                    help="with s.capture(reads=[...], writes=[t.mut()], host=fn) as region: "
                    "launch the work on region.stream",
                )
            )
        self.label_name = name
        self.where = where
        what = f"capture:{name}"  # the op's label, as graph.nodes and DOT pictures show it
        lists = "reads= and writes= take lists of tensors"
        written = _listed(writes, "writes", what, lists, "writes=[c.mut()]")
        read = _listed(reads, "reads", what, lists, "reads=[a, b], or leave reads= out")
        self.writes = [borrowed_tensor(w, True, what, f"writes[{i}]") for i, w in enumerate(written)]
        self.reads = [borrowed_tensor(r, False, what, f"reads[{i}]") for i, r in enumerate(read)]
        if not self.writes:
            raise SignatureError(
                diagnostic(
                    f"{what} declares no writes",
                    ["foreign work that writes nothing scopegraph knows has no effect the graph can order"],
                    help="declare what the work writes: writes=[t.mut(), ...]",
                )
            )
        if host is not None:
            _check_host(
                host,
                what,
                [f"writes[{i}]" for i in range(len(self.writes))] + [f"reads[{i}]" for i in range(len(self.reads))],
            )
        self.host = host
        self.definition: GraphDefinition | None = None
        self.kept: list[object] = []
        self.nodes_captured = 0
        borrows = [Borrow(t, True, f"writes[{i}]") for i, t in enumerate(self.writes)]
        borrows += [Borrow(t, False, f"reads[{i}]") for i, t in enumerate(self.reads)]
        self._claim(borrows)  # (one device, checked here first)
        self.borrows.append(Borrow(scratch_token(self.writes[0].device), True, SCRATCH))

    @property
    def name(self) -> str:
        return f"capture:{self.label_name}"

    def execute(self, stream: Stream) -> None:
        raise NotAGraphNodeError(
            diagnostic(
                f"cannot run `{self.name}` eagerly: a captured region runs only inside a graph",
                [f"it was captured at {self.where}"],
                help="launch the graph that holds it (graph.launch()), or run the foreign work directly",
            )
        )

    def check_host(self) -> None:
        """The host backend needs ``host`` (called before the op is recorded there)."""
        if self.host is None:
            raise NoHostReferenceError(
                diagnostic(
                    f"captured region `{self.label_name}` has no host callable, so the host backend cannot run it",
                    [f"opened at {self.where}"],
                    help="pass host=fn to s.capture(...): fn(*writes, *reads) gets numpy views of the declared tensors",
                )
            )

    def host_thunk(self, array_of: ArrayOf) -> Callable[[], None]:
        """What the host backend runs for this node: ``host(*writes, *reads)`` on numpy views.
        An access past a view it makes, or a write to a declared read, becomes a BoundsError naming
        the region, and anything else it raises a HostReferenceError, as for a kernel's host
        reference (``_errors.host_code_failed``)."""
        fn = self.host
        assert fn is not None  # checked when recorded
        views = [array_of(t, True) for t in self.writes] + [array_of(t, False) for t in self.reads]

        def run() -> None:
            try:
                fn(*views)
            except ScopeGraphError:
                raise
            except Exception as exc:
                raise host_code_failed(
                    f"the host callable of captured region `{self.label_name}`",
                    exc,
                    [
                        f"opened at {self.where}",
                        *(
                            f"{'writes' if b.mutable else 'reads'} {b.tensor.name} {b.tensor.shape}"
                            for b in self.borrows
                            if b.param != SCRATCH
                        ),
                    ],
                    "the host callable reads or writes past a tensor it was given, writes one declared "
                    "in reads=, or combines views whose shapes differ; keep it to the declared views "
                    "(host(*writes, *reads)) and their shapes, and declare what it writes in writes=",
                ) from exc

        return run

    def body_refusal(self, refused: list[str]) -> CaptureError:
        """The error for a capture in a loop or branch body that holds the ``refused`` node kinds."""
        return CaptureError(
            diagnostic(
                f"captured region `{self.label_name}` is in a loop or branch body, but its capture holds "
                f"{', '.join(refused)} node(s), which a CUDA conditional body cannot run",
                [
                    f"opened at {self.where}",
                    BODY_HOLDS,
                    *body_kind_notes(refused),
                ],
                help="open the region outside the loop or branch (s.capture(...) before or after its block), "
                "or keep events, waits on other streams and host callbacks out of the region's work",
            )
        )

    def child(self, backend: Any) -> GraphDefinition:
        """The graph the CUDA backend embeds as this node (a collective captures it here)."""
        assert self.definition is not None, "a captured region sets its definition when its capture ends"
        return self.definition

    def run_cuda(self, backend: Any, native_stream: object) -> None:
        """Eager execution on the CUDA backend (collectives only; a region is refused before)."""
        raise AssertionError(f"`{self.name}` cannot run eagerly")

    def label(self) -> str:
        args = ", ".join(("mut " if b.mutable else "") + b.tensor.name for b in self.borrows if b.param != SCRATCH)
        size = f" [{self.nodes_captured} nodes]" if self.nodes_captured else ""
        return f"{self.name}({args}){size}"


def _listed(value: object, argument: str, what: str, takes: str, example: str) -> list[object]:
    """A list argument of a region (``reads=``, ``writes=``, ``keep=``): a list, tuple or other
    iterable, not one tensor, None or a number (a SignatureError saying what it ``takes``)."""
    if isinstance(value, (Mut, Tensor, str, bytes)) or not isinstance(value, Iterable):
        raise SignatureError(
            diagnostic(f"{what}: {takes}; {argument}= got {type(value).__name__} {value!r}", help=f"e.g. {example}")
        )
    return list(value)


# -- capture streams ------------------------------------------------------------------------

# One capture stream per backend and thread (a capture is per thread): made on first use, dropped
# after a failed capture (a fresh one is made next time).
_local = threading.local()


def capture_stream(backend: Any) -> Any:
    """A cuda.core stream of ``backend``'s device, private to scopegraph and to this thread."""
    streams: dict[int, Any] | None = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    found = streams.get(id(backend))
    if found is None:
        found = streams[id(backend)] = backend.create_stream()
    return found


def _drop_capture_stream(backend: Any) -> None:
    streams: dict[int, Any] | None = getattr(_local, "streams", None)
    if streams is not None:
        streams.pop(id(backend), None)


def node_types(graph_handle: Any) -> list[str]:
    """The driver's node types of a CUgraph, child graphs looked into (cuda.bindings: cuda.core
    cannot wrap a graph it did not make, such as PyTorch's)."""
    from cuda.bindings import driver

    found: list[str] = []
    todo = [graph_handle]
    while todo:
        graph = todo.pop()
        err, _, count = driver.cuGraphGetNodes(graph, 0)
        if err != driver.CUresult.CUDA_SUCCESS or not count:
            continue
        err, nodes, count = driver.cuGraphGetNodes(graph, count)
        if err != driver.CUresult.CUDA_SUCCESS:
            continue
        for node in nodes[:count]:
            err, kind = driver.cuGraphNodeGetType(node)
            if err != driver.CUresult.CUDA_SUCCESS:
                continue
            found.append(kind.name)
            if kind == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH:
                err, child = driver.cuGraphChildGraphNodeGetGraph(node)
                if err == driver.CUresult.CUDA_SUCCESS:
                    todo.append(child)
    return found


def check_no_allocation_nodes(what: str, where: str, graph_handle: Any) -> int:
    """Refuse a captured graph with memory allocation or free nodes; otherwise the number of nodes
    that do work (child graphs are looked into and not counted themselves: PyTorch's capture is one)."""
    kinds = node_types(graph_handle)
    allocs = [k for k in kinds if k.endswith(("MEM_ALLOC", "MEM_FREE"))]
    if allocs:
        raise CaptureError(
            diagnostic(
                f"{what} allocated memory during capture ({len(allocs)} allocation or free node(s))",
                [f"opened at {where}", "memory allocated inside a graph would not be the memory scopegraph tracks"],
                help="allocate before the scope and let the work write into declared tensors (e.g. out=)",
            )
        )
    return sum(not k.endswith("_TYPE_GRAPH") for k in kinds)


# What a CUDA conditional body (a loop's or a branch's) may hold, child graphs included (the driver's
# rule, cudaConditionalNodeParams): a capture with any other node kind cannot go in a body.
_TYPE = "CU_GRAPH_NODE_TYPE_"
BODY_NODE_KINDS = frozenset(_TYPE + k for k in ("KERNEL", "MEMCPY", "MEMSET", "EMPTY", "GRAPH", "CONDITIONAL"))
BODY_HOLDS = "a CUDA conditional body holds only kernel, memcpy, memset, empty, child-graph and conditional nodes"
# Why a capture usually holds the kinds a body cannot.
_WHY = {
    "EVENT_RECORD": "EVENT_RECORD / WAIT_EVENT: an event recorded or waited on with the external flag "
    "(cudaEventRecordWithFlags, cudaStreamWaitEvent with cudaEventWaitExternal), as libraries do to "
    "order their own streams",
    "HOST": "HOST: a host function launched on the stream (cudaLaunchHostFunc, a Python callback)",
    "EXT_SEMAS_SIGNAL": "EXT_SEMAS_SIGNAL / EXT_SEMAS_WAIT: an external semaphore",
    "BATCH_MEM_OP": "BATCH_MEM_OP: a stream memory operation (cuStreamWriteValue, cuStreamWaitValue)",
}
_SAME = {"WAIT_EVENT": "EVENT_RECORD", "EXT_SEMAS_WAIT": "EXT_SEMAS_SIGNAL"}


def body_refused_kinds(kinds: Iterable[str]) -> list[str]:
    """The node kinds (CUgraphNodeType names) among ``kinds`` that a conditional body cannot hold,
    without the prefix, sorted."""
    return sorted({k.removeprefix(_TYPE) for k in kinds if k not in BODY_NODE_KINDS})


def body_kind_notes(refused: Iterable[str]) -> list[str]:
    """What usually puts each of the ``refused`` kinds into a capture."""
    found = dict.fromkeys(_SAME.get(k, k) for k in refused)
    return [_WHY.get(k, f"{k}: a node kind a conditional body cannot run") for k in found]


def check_body_graph(op: Captured, graph_handle: Any) -> None:
    """Refuse, before anything is built, a captured graph that a loop or branch body cannot hold:
    the driver allows only kernel, memcpy, memset, empty, child-graph and conditional nodes there,
    and would refuse the whole graph when it is instantiated."""
    refused = body_refused_kinds(node_types(graph_handle))
    if refused:
        raise op.body_refusal(refused)


# -- the two ways of capturing ----------------------------------------------------------------


def _failed(headline: str, where: str, exc: BaseException, help: str) -> CaptureError:
    """The CaptureError for a capture that another library or the driver made fail: ``headline``
    and the cause, where the region was opened, what the driver's refusal usually means."""
    return CaptureError(diagnostic(f"{headline}: {_cause(exc)}", [f"opened at {where}", *_explain(exc)], help=help))


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _explain(exc: BaseException) -> list[str]:
    """Notes saying what a driver's refusal during capture usually means."""
    text = str(exc)
    notes = []
    if "UNJOINED" in text.upper() or "unjoined" in text:
        notes.append("work was left on another stream: a stream joined the capture and was not joined back")
    if "CAPTURE_UNSUPPORTED" in text.upper() or "not permitted when stream is capturing" in text:
        notes.append(
            "an allocation or a synchronising call (cudaMalloc, a copy to the host, .item(), sync) "
            "was made during capture"
        )
    if "INVALIDATED" in text.upper() or "invalidated" in text:
        notes.append("the driver invalidated the capture: an earlier call inside the region was not capturable")
    return notes


class _CoreCapture:
    """Capture through cuda.core's graph builder on a scopegraph capture stream."""

    def __init__(self, backend: Any, mode: str) -> None:
        self.backend = backend
        self.mode = mode
        self.stream = capture_stream(backend)
        self.builder: Any = None

    def begin(self) -> None:
        self.builder = self.stream.create_graph_builder()
        self.builder.begin_building(self.mode)

    def end(self, what: str, where: str) -> tuple[GraphDefinition, list[object]]:
        builder = self.builder
        self.builder = None
        try:
            builder.end_building()
        except Exception as exc:
            _drop_capture_stream(self.backend)
            with contextlib.suppress(Exception):
                builder.close()
            raise _failed(
                f"the capture of {what} failed when it ended",
                where,
                exc,
                "make every stream that joined the capture join back (capture stream waits on it) "
                "and keep the region's work capturable",
            ) from exc
        definition = builder.graph_definition
        builder.close()
        return definition, []

    def abort(self) -> None:
        builder = self.builder
        self.builder = None
        if builder is None:
            return
        with contextlib.suppress(Exception):
            builder.end_building()
        with contextlib.suppress(Exception):
            builder.close()
        _drop_capture_stream(self.backend)


_torch_streams: dict[int, Any] = {}
_torch_lock = threading.Lock()
# Held from the start of a PyTorch capture to its end: torch.cuda.graph synchronises the device
# when it starts, which a capture in progress on another thread does not survive, and its capture
# stream is one per device. So threads capture via="torch" one at a time.
_torch_captures = threading.Lock()
_torch_capturing = [0]  # the thread that holds _torch_captures (0: none)


# Per thread, by device: the capture stream this thread's cuBLAS handle was warmed up on.
_torch_warmed = threading.local()


def _torch_capture_stream(torch: Any, index: int) -> Any:
    """PyTorch's capture stream for device ``index`` (one per device)."""
    with _torch_lock:
        stream = _torch_streams.get(index)
        if stream is None:
            stream = _torch_streams[index] = torch.cuda.Stream(device=index)
        return stream


def _warm_cublas(torch: Any, index: int, stream: Any) -> None:
    """Make this thread's cuBLAS handle, and its workspace on ``stream``, before a capture there:
    PyTorch keeps a handle per thread and a workspace per handle and stream, and a capture that
    made them would fail (CUBLAS_STATUS_NOT_INITIALIZED) or allocate while capturing. Called with
    ``_torch_captures`` held: no other thread captures on ``stream`` meanwhile."""
    warmed: dict[int, Any] = _torch_warmed.__dict__.setdefault("streams", {})
    if warmed.get(index) is stream:
        return
    with torch.cuda.device(index), torch.cuda.stream(stream):
        a = torch.ones((2, 2), device=f"cuda:{index}")
        torch.mm(a, a)
        torch.addmm(a, a, a)
        torch.cuda.current_blas_handle()
    stream.synchronize()
    warmed[index] = stream


class _TorchCapture:
    """Capture through ``torch.cuda.graph`` with ``keep_graph=True`` (PyTorch's pool and warm-up)."""

    def __init__(self, index: int, mode: str, what: str, where: str) -> None:
        try:
            torch: Any = importlib.import_module("torch")  # optional: a user's mypy need not see torch
        except ImportError as exc:
            raise CaptureError(
                diagnostic(
                    f'{what} uses via="torch", but PyTorch is not installed',
                    [f"opened at {where}"],
                    help='install torch, or capture with via="cuda" (cuda.core)',
                )
            ) from exc
        self.torch = torch
        self.index = index
        self.mode = mode
        self.stream = _torch_capture_stream(torch, index)
        self.graph: Any = None
        self.context: Any = None
        self.before = 0
        self.capturing = False  # holds _torch_captures

    def begin(self) -> None:
        torch = self.torch
        if _torch_capturing[0] == threading.get_ident():  # it would wait for itself
            raise CaptureError(
                diagnostic(
                    'a via="torch" region is already capturing on this thread',
                    ["PyTorch captures one graph at a time per process (scopegraph lets threads take turns)"],
                    help='end that region first, or capture this work with via="cuda"',
                )
            )
        _torch_captures.acquire()
        _torch_capturing[0] = threading.get_ident()
        self.capturing = True
        try:
            self.stream = _torch_capture_stream(torch, self.index)  # a failed capture may have dropped it
            _warm_cublas(torch, self.index, self.stream)
            self.graph = torch.cuda.CUDAGraph(keep_graph=True)
            self.context = torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode=self.mode)
            self.context.__enter__()
        except BaseException:
            self._done()
            raise
        self.before = int(torch.cuda.memory_allocated(self.index))

    def _done(self) -> None:
        if self.capturing:
            self.capturing = False
            _torch_capturing[0] = 0
            _torch_captures.release()

    def _leave(self, exc: tuple[Any, Any, Any]) -> None:
        """End torch's capture context; if capture_end raises, still restore the current stream."""
        context = self.context
        self.context = None
        try:
            context.__exit__(*exc)
        except BaseException:
            inner = getattr(context, "stream_ctx", None)
            if inner is not None:
                with contextlib.suppress(Exception):
                    inner.__exit__(None, None, None)
            raise

    def end(self, what: str, where: str) -> tuple[GraphDefinition, list[object]]:
        from cuda.bindings import driver
        from cuda.core.graph import GraphDefinition

        try:
            self._leave((None, None, None))
        except Exception as exc:
            self._forget()
            raise _failed(
                f"the PyTorch capture of {what} failed when it ended",
                where,
                exc,
                "make every stream that joined the capture join back, and keep the region's work capturable",
            ) from exc
        finally:
            self._done()
        grown = int(self.torch.cuda.memory_allocated(self.index)) - self.before
        if grown > 0:
            self.graph = None
            raise CaptureError(
                diagnostic(
                    f"{what} allocated {grown} bytes during capture that are still in use",
                    [f"opened at {where}", "a tensor made inside the region is memory scopegraph does not track"],
                    help="allocate before the scope and write into a declared tensor (e.g. torch.matmul(a, b, out=c))",
                )
            )
        raw = int(self.graph.raw_cuda_graph())
        # The torch graph as the one child of a definition of our own, which the scope's graph
        # embeds (cuda.core cannot wrap a CUgraph it did not make: cuGraphAddChildGraphNode clones it).
        holder = GraphDefinition()
        err, _ = driver.cuGraphAddChildGraphNode(holder.handle, None, 0, driver.CUgraph(raw))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise CaptureError(
                f"embedding the PyTorch graph of {what} failed: {err.name}\nhelp: report this with the region's code"
            )
        return holder, [self.graph]

    def abort(self) -> None:
        try:
            if self.context is not None:
                with contextlib.suppress(Exception):
                    self._leave((None, None, None))
        finally:
            self._done()
        self._forget()

    def _forget(self) -> None:
        self.graph = None
        with _torch_lock:  # the stream may be left in a bad state: use a new one next time
            if _torch_streams.get(self.index) is self.stream:
                del _torch_streams[self.index]


# -- the region ------------------------------------------------------------------------------


class Region:
    """The ``with`` block of ``s.capture(...)``: see the module docstring."""

    def __init__(
        self,
        owner: Scope | Body,
        writes: Sequence[Mut[Tensor]],
        reads: Sequence[Tensor],
        host: Callable[..., object] | None,
        via: str,
        name: str,
        keep: Sequence[object],
        mode: str,
        where: tuple[str, int],
    ) -> None:
        self.where = where
        if not isinstance(via, str) or via not in VIAS:
            raise SignatureError(
                f'via={via!r} is not a way of capturing\nhelp: use via="cuda" (cuda.core) or via="torch"'
            )
        if not isinstance(mode, str) or mode not in MODES:
            raise SignatureError(f"mode={mode!r} is not a capture mode\nhelp: use one of {', '.join(MODES)}")
        if not isinstance(name, str) or not name.strip():
            raise SignatureError(
                f"name={name!r} names nothing\n"
                "help: name the region with a non-empty string (messages and the DOT picture show it)"
            )
        kept = _listed(
            keep,
            "keep",
            f"capture `{name}`",
            "keep= takes a list of objects to keep alive",
            "keep=[module, kernel], or region.hold(obj) inside the region",
        )
        # The scope, or the loop or branch body (scopegraph._control), the region's node is recorded into.
        self.owner = owner
        self.via = via
        self.mode = mode
        self.op = Captured(name, writes, reads, host, self.location, region=_REGION)
        device = owner.stream.device if isinstance(owner, Scope) else owner.device
        if self.op.device is not device:
            raise SignatureError(
                diagnostic(
                    f"capture `{name}` declares tensors on {self.op.device} but the scope records on {device}",
                    help="declare tensors of the scope stream's device",
                )
            )
        if device.is_host:
            self.op.check_host()
        self.op.kept.extend(kept)
        self.capturing = False
        # What the foreign work launches on (CUDA only): a cuda.core Stream and its handle, or
        # PyTorch's capture stream.
        self.stream: Any = None
        self.handle = 0
        self.torch_stream: Any = None
        self.node: RecordedNode | None = None
        self._capture: _CoreCapture | _TorchCapture | None = None
        # The backend holding frees back while this region captures, and the capturing thread.
        self._frees_deferred_by: tuple[CudaBackend, int] | None = None
        self._cupy: Any = None
        self._entered = self._open = False  # entered once; open until its exit
        # Until entered, the scope's clean exit refuses it (see Scope._unentered).
        self._waiting = unentered_in(owner)
        self._waiting[id(self)] = self

    @property
    def location(self) -> str:
        return f"{self.where[0]}:{self.where[1]}"

    @property
    def description(self) -> str:
        return f"captured region `{self.op.label_name}`"

    @property
    def usage(self) -> str:
        return "with s.capture(writes=[...], reads=[...]) as region:"

    def __repr__(self) -> str:
        return f"<Region `{self.op.label_name}` via {self.via}, {'capturing' if self.capturing else 'not capturing'}>"

    def hold(self, *objects: object) -> None:
        """Keep ``objects`` alive as long as the graph that holds this region lives."""
        self.op.kept.extend(objects)

    def busy(self, what: str) -> ScopeStateError:
        return ScopeStateError(
            diagnostic(
                f"cannot {what} while the captured region opened at {self.location} is open",
                ["an op recorded now would land before the region's node, not inside it"],
                help="launch the foreign work on the region's stream, or record after the region's `with` block",
            )
        )

    def __enter__(self) -> Region:
        owner = self.owner
        self._waiting.pop(id(self), None)  # tried: whatever happens now, it is not silently dropped
        if self._entered:
            raise ScopeStateError("this captured region was already used\nhelp: open a new one with s.capture(...)")
        if isinstance(owner, Scope):
            if owner._state is not _State.OPEN:
                raise ScopeStateError(
                    diagnostic(
                        "cannot open a captured region in a scope that is "
                        + ("not open yet" if owner._state is _State.NEW else "finished"),
                        [f"the scope was opened at {owner.opened_at}"],
                        help="open it inside the `with CudaGraph.scope(stream) as s:` block",
                    )
                )
            owner.check_thread()
            if owner._inner is not None:
                raise owner._inner.busy("open a captured region in the scope")
            device = owner.stream.device
        else:
            owner._check_recording("open a captured region in")
            device = owner.device
        for t in self.op.tensors:
            t.check_alive()
        self._entered = True
        if device.is_cuda:
            backend = cast("CudaBackend", device.backend)
            try:  # making the capture stream, or starting to capture on it, may fail
                if self.via == "torch":
                    self._capture = _TorchCapture(device.index, self.mode, f"`{self.op.label_name}`", self.location)
                else:
                    self._capture = _CoreCapture(backend, self.mode)
                self._refuse_cupy_allocations()
                # before the capture begins: a collection may run inside begin()
                self._frees_deferred_by = (backend, backend.defer_frees(every_thread=self.mode == "global"))
                self._capture.begin()
            except BaseException as exc:
                self._restore_cupy()
                self._resume_frees()
                self._capture = None
                if isinstance(exc, Exception) and not isinstance(exc, ScopeGraphError):
                    raise _failed(
                        f"the capture of captured region `{self.op.label_name}` could not start",
                        self.location,
                        exc,
                        "end any capture already running on this thread or its device (another "
                        "library's torch.cuda.graph or stream capture) before opening the region",
                    ) from exc
                raise
            if isinstance(self._capture, _TorchCapture):
                self.torch_stream = self._capture.stream
                self.handle = int(self._capture.stream.cuda_stream)
            else:
                self.stream = self._capture.stream
                self.handle = int(self._capture.stream.handle)
            self.capturing = True
        owner._inner = self
        self._open = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._open:  # an ExitStack unwinding twice, or a region never entered: record it once
            if exc_type is not None:
                return
            raise not_open("this captured region", "with s.capture(...) as region:")
        self._open = False
        owner = self.owner
        owner._inner = None
        capture, self._capture = self._capture, None
        self.capturing = False
        what = f"captured region `{self.op.label_name}`"
        try:
            if exc is not None:
                if capture is not None:
                    capture.abort()
                if isinstance(exc, Exception) and not isinstance(exc, ScopeGraphError):
                    # A CaptureError on every backend, so a program tested on the host fails alike on a GPU.
                    raise _failed(
                        f"the capture of {what} failed",
                        self.location,
                        exc,
                        "keep the region's work capturable: no allocation, no synchronisation, no copy to the "
                        "host; launch everything on the region's stream"
                        if capture is not None
                        else "fix the code inside the region (on the host backend nothing is captured: the "
                        "region's host callable stands for its work at each replay)",
                    ) from exc
                return  # not recorded; the scope stays usable (and abandons itself if the error escapes)
            if capture is not None:
                definition, kept = capture.end(what, self.location)
                self.op.nodes_captured = check_no_allocation_nodes(what, self.location, definition.handle)
                if self.op.nodes_captured == 0:
                    raise CaptureError(
                        diagnostic(
                            f"the {what} captured no GPU work",
                            [
                                f"opened at {self.location}",
                                "work launched on another stream ran eagerly when it was recorded, "
                                "and will not run at the graph's replays",
                            ],
                            help=(
                                "launch the work inside the `with` block on the region's stream: "
                                + (
                                    "torch ops on CUDA tensors (the capture stream is current)"
                                    if self.via == "torch"
                                    else "region.stream, or region.handle for a library that takes a raw stream"
                                )
                                + "; leave the region out if it has nothing to do on the GPU"
                            ),
                        )
                    )
                if not isinstance(owner, Scope):  # a loop or branch body: before anything is built
                    check_body_graph(self.op, definition.handle)
                self.op.definition = definition
                self.op.kept.extend(kept)
        finally:
            self._restore_cupy()
            self._resume_frees()
        if not isinstance(owner, Scope):
            self.node = owner.record(self.op)
            self.node._where = self.where
            return
        start = len(owner._nodes)
        self.node = owner.record(self.op)
        for node in owner._nodes[start:]:  # the region's node, and a join the tracker put before it
            node._where = self.where

    # -- CuPy: refuse its allocations while the region captures ----------------------------

    def _refuse_cupy_allocations(self) -> None:
        cupy = sys.modules.get("cupy")
        if cupy is None:
            return
        where = self.location
        name = self.op.label_name

        def refuse(size: int) -> Any:
            raise CaptureError(
                diagnostic(
                    f"CuPy allocated {size} bytes inside the captured region `{name}`",
                    [
                        f"opened at {where}",
                        "memory CuPy's pool hands out during capture is not memory scopegraph tracks: "
                        "the pool would give it to someone else while the graph still writes it",
                    ],
                    help="allocate before the scope and pass out= (or write into a declared array)",
                )
            )

        try:
            self._cupy = cupy.cuda.using_allocator(refuse)
            self._cupy.__enter__()
        except Exception:  # an old CuPy without using_allocator: the driver's refusal still applies
            self._cupy = None

    def _resume_frees(self) -> None:
        deferred, self._frees_deferred_by = self._frees_deferred_by, None
        if deferred is not None:
            backend, thread = deferred
            backend.resume_frees(thread)

    def _restore_cupy(self) -> None:
        context, self._cupy = self._cupy, None
        if context is not None:
            context.__exit__(None, None, None)


_scope.capture = Region  # `_scope` cannot import this module: it registers the class instead
