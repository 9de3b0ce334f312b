"""Collectives across processes: all-reduce, all-gather, reduce-scatter, broadcast (DESIGN.md section 10).

    comm = sg.init_distributed()                 # one process per GPU, e.g. under torchrun
    dev, stream = comm.device, comm.device.stream()
    x = dev.zeros((1024,), name="x")
    stream.run(comm.all_reduce(x.mut()))         # eager: x = sum of every rank's x
    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(x.mut(), float(comm.rank)))
        s.record(comm.all_reduce(x.mut()))       # one child-graph node with NCCL's work in it
        s.record(comm.all_gather(g.mut(), x))    # g: world_size * x.size elements

Each collective is a GraphNode with borrows like any op's: it writes ``dst`` (``.mut()``) and reads
``src`` (``src=None`` means in place), so the DAG orders it after the ops that produce what it
sends and before the ops that use what it receives. Each also borrows its device's ordering token
mutably, so the collectives of a process form a chain in record order, whichever communicator
they belong to: NCCL needs every rank to issue them in the same order (two communicators' calls
on parallel branches could deadlock), and the host backend's random replay order would otherwise
reorder independent ones.

On CUDA a collective runs on NCCL through NVIDIA's ``nccl4py`` (``nccl.core.Communicator``; its
calls take a cuda.core stream or graph builder): eagerly on the stream, and in a graph as a captured
child-graph node (the NCCL call captured with cuda.core's graph builder when the scope builds its
graph, then embedded). NCCL's unique id travels over the bootstrap (``scopegraph._bootstrap``):
torch.distributed under torchrun, mpi4py, or scopegraph's own TCP exchange.

Collectives may be recorded into loop and branch bodies (``body.record(comm.all_reduce(...))``).
On CUDA a body can hold NCCL's capture only when it is made of kernels: NCCL adds an event record
and an event wait to each captured collective while its graph mixing support is on (the default),
so a collective in a body is refused with a CaptureError when the scope builds its graph, on every
rank, unless ``NCCL_GRAPH_MIXING_SUPPORT=0`` (``Collective.body_refusal``; README "Other libraries'
work, and several GPUs"). Every rank must run such a loop the same number of times.

On the host backend the same collectives run across processes over the bootstrap itself: every
rank sends its bytes, every rank computes the result in rank order (so all ranks get bit-identical
sums). Multi-rank programs are thereby testable in CI without GPUs.

Mismatches that can be detected are errors, not hangs (:class:`CollectiveMismatchError`):

- when a scope that recorded collectives ends, the ranks exchange the list of collectives each
  recorded (kind, dtype, sizes, op, root) before anything is built or captured; a difference
  names the first collective that differs and each rank's version;
- eager collectives exchange their description first (``comm.check_eager``, on by default; turn
  it off for timing: it adds one bootstrap round trip per eager collective on CUDA), and on the
  host backend every exchange carries it;
- a rank that never arrives (crashed, or ran a different number of scopes) times out in the
  bootstrap (``SCOPEGRAPH_DIST_TIMEOUT``) with a DistributedError.

What is not detected: ranks replaying *different* graphs that were recorded identically, or
passing different data. Every rank must record the same program.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _scope
from ._bootstrap import KINDS as BOOTSTRAPS
from ._bootstrap import Bootstrap, DistributedError, check_timeout, from_env
from ._borrow import Borrow, aliasing_error
from ._capture import BODY_HOLDS, ArrayOf, Captured, CaptureError, body_kind_notes, capture_stream
from ._control import ControlNode
from ._device import Device, device, env_device
from ._driver import cuda_device_count
from ._dtypes import int32
from ._errors import CudaError, SignatureError, diagnostic
from ._ops import borrowed_tensor
from ._tensor import Mut, Tensor

if TYPE_CHECKING:
    from cuda.core.graph import GraphDefinition

    from ._scope import RecordedNode
    from ._stream import Stream

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
REDUCTIONS = ("sum", "prod", "max", "min", "avg")
_NUMPY_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
# dtypes NCCL reduces and moves (the host backend takes the same, so a program runs on both)
_SUPPORTED = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64")
_ids = itertools.count()
# Whether any collective was ever built in this process: scopes skip the rank check until one is.
_made = False
# The ordering token of each device's collectives (see the module docstring); devices live as
# long as the process.
_tokens: dict[Device, Tensor] = {}
_tokens_lock = threading.Lock()


class CollectiveMismatchError(DistributedError):
    """Ranks recorded or ran different collectives (a program that would hang or corrupt data)."""


class Communicator:
    """The processes of one program, one device each: builds collective ops (``all_reduce``,
    ``all_gather``, ``reduce_scatter``, ``broadcast``). Make it with :func:`init_distributed`."""

    def __init__(self, device: Device, bootstrap: Bootstrap, check_eager: bool = True) -> None:
        self.device = device
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.world_size = bootstrap.world_size
        self.id = next(_ids)
        # Borrowed mutably by every collective on this device, of any communicator: they form a
        # chain in record order.
        with _tokens_lock:
            token = _tokens.get(device)
            if token is None:
                token = _tokens[device] = device.zeros((1,), int32, name="collectives")
        self.token = token
        self.check_eager = check_eager
        self._nccl: Any = None
        self._closed = False

    def __repr__(self) -> str:
        where = f"rank {self.rank} of {self.world_size} on {self.device}"
        return f"<Communicator #{self.id}: {where}, {self.bootstrap.kind} bootstrap>"

    # -- ops --------------------------------------------------------------------------------

    def all_reduce(self, dst: Mut[Tensor], src: Tensor | None = None, op: str = "sum") -> Collective:
        """``dst`` = the reduction (``op``: sum, prod, max, min, avg) over every rank's ``src``
        (``dst`` itself when ``src`` is None: in place). Same dtype and size on every rank."""
        return Collective(self, "all_reduce", dst, src, op)

    def all_gather(self, dst: Mut[Tensor], src: Tensor) -> Collective:
        """``dst`` (``world_size * src.size`` elements) = every rank's ``src``, in rank order."""
        return Collective(self, "all_gather", dst, src)

    def reduce_scatter(self, dst: Mut[Tensor], src: Tensor, op: str = "sum") -> Collective:
        """``dst`` = this rank's block of the reduction over every rank's ``src``
        (``world_size * dst.size`` elements): block ``rank``."""
        return Collective(self, "reduce_scatter", dst, src, op)

    def broadcast(self, dst: Mut[Tensor], root: int = 0, src: Tensor | None = None) -> Collective:
        """``dst`` = rank ``root``'s ``src`` (its ``dst`` when ``src`` is None: in place)."""
        return Collective(self, "broadcast", dst, src, root=root)

    # -- exchanges over the bootstrap ---------------------------------------------------------

    def exchange(self, header: dict[str, Any], data: bytes = b"") -> list[tuple[dict[str, Any], bytes]]:
        """Every rank's (header, data), in rank order: one allgather over the bootstrap."""
        self._check_open()
        raw = json.dumps(header, sort_keys=True).encode()
        parts = self.bootstrap.allgather(len(raw).to_bytes(4, "big") + raw + data)
        out = []
        for part in parts:
            n = int.from_bytes(part[:4], "big")
            out.append((json.loads(part[4 : 4 + n]), part[4 + n :]))
        return out

    def agree(self, what: str, program: list[str], data: bytes = b"") -> list[bytes]:
        """Exchange ``data`` along with ``program`` (a list of collective descriptions); raise
        CollectiveMismatchError on every rank if any rank's ``what`` or ``program`` differs."""
        got = self.exchange({"what": what, "program": program}, data)
        mine = {"what": what, "program": program}
        if any(h != mine for h, _ in got):
            raise self._mismatch(what, [h for h, _ in got])
        return [d for _, d in got]

    def _mismatch(self, what: str, headers: list[dict[str, Any]]) -> CollectiveMismatchError:
        programs = [(h.get("what"), h.get("program", [])) for h in headers]
        notes = []
        kinds = {p[0] for p in programs}
        if len(kinds) > 1:
            notes += [f"rank {r} is at: {p[0]}" for r, p in enumerate(programs)]
        else:
            longest = max(len(p[1]) for p in programs)
            first = next(i for i in range(longest) if len({p[1][i] if i < len(p[1]) else None for p in programs}) > 1)
            notes.append(f"collective #{first} differs:")
            notes += [
                f"rank {r}: {p[1][first] if first < len(p[1]) else '(nothing: it recorded ' + str(len(p[1])) + ')'}"
                for r, p in enumerate(programs)
            ]
        return CollectiveMismatchError(
            diagnostic(
                f"rank {self.rank} of {self.world_size}: the ranks disagree on the collectives of {what}",
                notes,
                help="every rank must record (or run) the same collectives in the same order, with the same dtypes "
                "and sizes; make rank-dependent code choose data, not which collectives run",
            )
        )

    def barrier(self) -> None:
        """Wait until every rank has reached this call (over the bootstrap; no GPU work)."""
        self.agree("a barrier", [])

    # -- NCCL (CUDA) -------------------------------------------------------------------------

    def nccl(self) -> Any:
        """The nccl4py Communicator, made on first use (a collective call: every rank makes it)."""
        if self._nccl is None:
            self._check_open()
            try:
                nccl = importlib.import_module("nccl.core")  # nccl4py: optional, and untyped
            except ImportError as exc:
                raise DistributedError(
                    "collectives on CUDA need NVIDIA's nccl4py\nhelp: pip install nccl4py (it brings NCCL), "
                    "or run on the host backend"
                ) from exc
            backend: Any = self.device.backend
            backend.make_current()
            uid = bytes(nccl.get_unique_id()) if self.rank == 0 else b""
            uid = self.agree("NCCL's unique id", [], uid)[0]
            try:
                self._nccl = nccl.Communicator.init(self.world_size, self.rank, nccl.UniqueId.from_bytes(uid))
            except Exception as exc:
                raise DistributedError(
                    f"rank {self.rank}: NCCL could not make a communicator: {exc}\nhelp: see NCCL_DEBUG=INFO"
                ) from exc
            backend.core.set_current()  # whatever NCCL's set-up made current, this rank's device is current again
        return self._nccl

    def close(self) -> None:
        """Refuse new collectives and release the bootstrap. NCCL's own communicator is left to the
        end of the process: graphs captured from it (and garbage-collected later) still refer to it,
        and destroying it first would leave them pointing at freed state."""
        if self._closed:
            return
        self._closed = True
        self.bootstrap.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DistributedError(
                f"communicator #{self.id} is closed\nhelp: make a new one with sg.init_distributed()"
            )

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Cai:
    """A device pointer as ``__cuda_array_interface__``, which nccl4py reads (pointer, count, dtype)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t: Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": (t.size,),
            "typestr": t.dtype.numpy.str,
            "data": (t.allocation.address + t.offset, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class Collective(Captured):
    """One collective of one communicator: a captured child-graph node in a graph, a NCCL call
    (or, on the host backend, an exchange over the bootstrap) when run eagerly."""

    __slots__ = ("comm", "dst", "kind", "op", "root", "src")

    def __init__(
        self, comm: Communicator, kind: str, dst: Mut[Tensor], src: Tensor | None, op: str = "sum", root: int = 0
    ) -> None:
        if not isinstance(comm, Communicator):
            raise SignatureError(
                f"`{kind}` needs a Communicator, not {type(comm).__name__}\nhelp: comm = sg.init_distributed()"
            )
        comm._check_open()
        global _made
        _made = True
        self.comm = comm
        self.kind = kind
        self.dst = borrowed_tensor(dst, True, kind, "dst")
        if src is None and kind in ("all_gather", "reduce_scatter"):  # in place only where dst is src
            part = "contributes (dst.size // world_size elements)" if kind == "all_gather" else "reduces"
            raise SignatureError(
                f"`{kind}` got src=None: it has no in-place form here, its src and dst differ in size\n"
                f"help: pass the tensor this rank {part} as src"
            )
        self.src = self.dst if src is None else borrowed_tensor(src, False, kind, "src")
        if op not in REDUCTIONS:
            raise SignatureError(f"`{kind}`: op={op!r} is not a reduction\nhelp: use one of {', '.join(REDUCTIONS)}")
        self.op = op
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < comm.world_size:
            raise SignatureError(
                f"`{kind}`: root={root!r} is not a rank of {comm.world_size}\nhelp: pass 0..{comm.world_size - 1}"
            )
        self.root = int(root)
        self._check_sizes()
        self.label_name = kind
        self.where = ""
        self.host = None
        self.definition = None
        self.kept = []
        self.nodes_captured = 0
        self.writes = [self.dst]
        self.reads = [] if src is None else [self.src]
        borrows = [Borrow(self.dst, True, "dst")]
        if src is not None:  # `dst` itself too: in place is src=None (NCCL's sendbuff == recvbuff)
            borrows.append(Borrow(self.src, False, "src"))
        if src is not None and borrows[0].overlaps(borrows[1]):
            raise aliasing_error(
                kind,
                borrows[0],
                borrows[1],
                help=f"for an in-place {kind}, leave src out: {kind}(x.mut()) reads and writes x; "
                "otherwise give dst and src separate buffers",
            )
        borrows.append(Borrow(comm.token, True, "comm"))
        self._claim(borrows)
        if self.device is not comm.device:
            raise SignatureError(
                diagnostic(
                    f"`{kind}` uses tensors on {self.device}, but the communicator's rank runs on {comm.device}",
                    help="make the tensors on comm.device",
                )
            )

    def _check_sizes(self) -> None:
        dst, src, n = self.dst, self.src, self.comm.world_size
        if dst.dtype != src.dtype:
            raise SignatureError(
                f"`{self.kind}`: `dst` is {dst.dtype.name} but `src` is {src.dtype.name}\nhelp: use one dtype"
            )
        if dst.dtype.numpy.name not in _SUPPORTED:
            raise SignatureError(
                f"`{self.kind}` cannot move {dst.dtype.name} data\nhelp: use one of {', '.join(_SUPPORTED)}"
            )
        if self.op == "avg" and dst.dtype.numpy.kind != "f":
            raise SignatureError(
                f"`{self.kind}`: op='avg' needs a floating-point dtype, not {dst.dtype.name}\nhelp: use 'sum'"
            )
        want = {"all_reduce": src.size, "broadcast": src.size, "all_gather": n * src.size}.get(self.kind)
        if self.kind == "reduce_scatter":
            ok, rule = src.size == n * dst.size, f"`src` needs world_size * dst.size = {n * dst.size} elements"
        else:
            ok, rule = dst.size == want, f"`dst` needs {want} elements"
        if not ok:
            raise SignatureError(
                diagnostic(
                    f"`{self.kind}` sizes do not fit a world of {n}",
                    [
                        f"`dst` is `{dst.name}`: {dst.size} elements",
                        f"`src` is `{src.name}`: {src.size} elements",
                        rule,
                    ],
                    help="size the buffers for comm.world_size ranks",
                )
            )

    @property
    def name(self) -> str:
        return self.kind

    def label(self) -> str:
        src = "" if self.src is self.dst else f", {self.src.name}"
        extra = (
            f", root={self.root}" if self.kind == "broadcast" else (f", {self.op}" if self.kind != "all_gather" else "")
        )
        return f"{self.kind}(mut {self.dst.name}{src}{extra}) on comm{self.comm.id}"

    def signature(self) -> str:
        """What every rank must agree on: kind, dtype, sizes, reduction and root (not whether a
        rank's call is in place: NCCL allows ranks to differ there, and a broadcast's ``src``
        matters on the root only)."""
        dt = self.dst.dtype.name
        if self.kind == "broadcast":
            detail = f"root={self.root}"
        elif self.kind == "all_gather":
            detail = ""
        else:
            detail = self.op
        return f"{self.kind} {detail} {dt}[{self.src.size}] -> {dt}[{self.dst.size}]".replace("  ", " ")

    def execute(self, stream: Stream) -> None:
        stream.device.backend.run(self, stream)

    def check_host(self) -> None:
        pass  # the host backend runs collectives itself

    # -- host backend ----------------------------------------------------------------------

    def host_thunk(self, array_of: ArrayOf) -> Callable[[], None]:
        comm, kind, n = self.comm, self.kind, self.comm.world_size
        dst = array_of(self.dst, True).reshape(-1)
        src = dst if self.src is self.dst else array_of(self.src, False).reshape(-1)
        dtype = dst.dtype
        program = [self.signature()]
        sends = kind != "broadcast" or comm.rank == self.root

        def run() -> None:
            parts = comm.agree("an eager or replayed collective", program, src.tobytes() if sends else b"")
            if kind == "broadcast":
                np.copyto(dst, np.frombuffer(parts[self.root], dtype))
                return
            arrays = [np.frombuffer(p, dtype) for p in parts]
            if kind == "all_gather":
                np.copyto(dst, np.concatenate(arrays))
                return
            total = _reduce(self.op, arrays, n)
            if kind == "all_reduce":
                np.copyto(dst, total)
            else:
                size = dst.size
                np.copyto(dst, total[comm.rank * size : (comm.rank + 1) * size])

        return run

    # -- CUDA backend -------------------------------------------------------------------------

    def _issue(self, stream: Any) -> None:
        """The NCCL call on a cuda.core stream or graph builder (both give ``__cuda_stream__``).

        Through nccl4py's low-level bindings with explicit pointers, counts and dtype, on the
        communicator's own handle: the Communicator methods infer each buffer's device from the
        pointer, and on a second GPU that inference reported device 0 for scopegraph's (memory-pool)
        allocations, so they refused valid buffers. nccl4py 0.6's methods make exactly these calls
        after their checks; scopegraph has made its own (sizes, dtypes, devices) when the op was built."""
        nccl = importlib.import_module("nccl.core")
        comm = self.comm.nccl()
        handle = getattr(comm, "_comm", None)
        if handle is None:  # another nccl4py: its public calls, with the pointers as CUDA array interfaces
            self._issue_public(nccl, comm, stream)
            return
        low = importlib.import_module("nccl.bindings.nccl")
        stream_ptr = int(stream.__cuda_stream__()[1])
        dtype = int(nccl.NcclDataType.from_numpy_dtype(self.dst.dtype.numpy))
        reduction = int(getattr(nccl, self.op.upper()))
        src, dst = self.src.data_ptr, self.dst.data_ptr
        if self.kind == "all_reduce":
            low.all_reduce(src, dst, self.src.size, dtype, reduction, handle, stream_ptr)
        elif self.kind == "all_gather":
            low.all_gather(src, dst, self.src.size, dtype, handle, stream_ptr)
        elif self.kind == "reduce_scatter":
            low.reduce_scatter(src, dst, self.dst.size, dtype, reduction, handle, stream_ptr)
        else:
            low.broadcast(src, dst, self.dst.size, dtype, self.root, handle, stream_ptr)

    def _issue_public(self, nccl: Any, comm: Any, stream: Any) -> None:
        dst, src = _Cai(self.dst), (_Cai(self.src) if self.src is not self.dst else None)
        reduction = getattr(nccl, self.op.upper())
        if self.kind == "all_reduce":
            comm.allreduce(src if src is not None else dst, dst, reduction, stream=stream)
        elif self.kind == "all_gather":
            comm.allgather(src, dst, stream=stream)
        elif self.kind == "reduce_scatter":
            comm.reduce_scatter(src, dst, reduction, stream=stream)
        else:
            comm.broadcast(src if src is not None else dst, dst, self.root, stream=stream)

    def run_cuda(self, backend: Any, native_stream: object) -> None:
        if self.comm.check_eager:
            self.comm.agree("an eager collective", [self.signature()])
        try:
            self._issue(native_stream)
        except CudaError:
            raise
        except Exception as exc:
            raise _nccl_error(self, "running", exc) from exc

    def child(self, backend: Any) -> GraphDefinition:
        """Capture the NCCL call into a graph of its own (cuda.core's graph builder), for the
        scope's graph to embed. Every rank does this at the same point (its scope's clean exit)."""
        self.comm.nccl()
        builder = capture_stream(backend).create_graph_builder()
        builder.begin_building("relaxed")
        try:
            self._issue(builder)
        except Exception as exc:
            try:
                builder.end_building()
            finally:
                builder.close()
            raise _nccl_error(self, "capturing", exc) from exc
        builder.end_building()
        definition: GraphDefinition = builder.graph_definition
        builder.close()
        self.definition = definition  # kept with the op, like a region's
        return definition

    def body_refusal(self, refused: list[str]) -> CaptureError:
        """The error for a collective in a loop or branch body whose NCCL capture holds node kinds
        a conditional body cannot (see the README's "collectives in loops")."""
        events = any("EVENT" in k for k in refused)
        notes = [f"rank {self.comm.rank}: NCCL's capture of `{self.label()}` holds {', '.join(refused)} node(s)"]
        if events:
            notes.append(
                "NCCL records and waits on an event around every captured collective while its graph mixing "
                "support is on (NCCL_GRAPH_MIXING_SUPPORT=1, the default), to order graphs against eager calls"
            )
        if "HOST" in refused:
            notes.append(
                "NCCL adds a host callback when a collective needs its proxy thread (a network transport: "
                "ranks on different machines, or GPUs without peer access)"
            )
        notes += [n for n in body_kind_notes(refused) if not n.startswith(("EVENT_RECORD", "HOST"))]
        notes.append(BODY_HOLDS)
        fix = (
            "set NCCL_GRAPH_MIXING_SUPPORT=0 in every rank's environment before its first collective (NCCL "
            "then needs each graph's replays not to overlap eager collectives or other graphs on the "
            "communicator: order them, e.g. graph.sync() before eager collectives), or "
            if events and "HOST" not in refused
            else ""
        )
        return CaptureError(
            diagnostic(
                f"rank {self.comm.rank}: `{self.kind}` is in a loop or branch body, but NCCL's capture of it cannot "
                "run there",
                notes,
                help=fix + "record the collective outside the loop or branch",
            )
        )


def _nccl_error(op: Collective, doing: str, exc: Exception) -> DistributedError:
    return DistributedError(
        diagnostic(
            f"rank {op.comm.rank}: {doing} `{op.label()}` on NCCL failed: {exc}",
            help="set NCCL_DEBUG=WARN for NCCL's reason; every rank must run the same collectives",
        )
    )


def _reduce(op: str, arrays: list[np.ndarray[Any, Any]], n: int) -> np.ndarray[Any, Any]:
    """The reduction in rank order (the same bits on every rank)."""
    if op == "avg":
        total = arrays[0].copy()
        for a in arrays[1:]:
            total += a
        return total / total.dtype.type(n)  # type: ignore[no-any-return]
    fn = _NUMPY_REDUCE[op]
    total = arrays[0].copy()
    for a in arrays[1:]:
        fn(total, a, out=total)
    return total


# -- the check that every rank recorded the same collectives ---------------------------------


def check_recorded(nodes: Sequence[RecordedNode]) -> None:
    """Run when a scope ends cleanly, before its graph is built: the ranks of each communicator
    exchange the collectives they recorded, in record order, loop and branch bodies included (each
    named with the bodies it is in); any difference is an error on every rank
    (CollectiveMismatchError), raised before NCCL captures anything."""
    if not _made:
        return
    programs: dict[int, tuple[Communicator, list[str]]] = {}
    for op, inside in _collectives_in(nodes, ""):
        entry = programs.get(op.comm.id)
        if entry is None:
            entry = programs[op.comm.id] = (op.comm, [])
        entry[1].append(inside + op.signature())
    for comm, program in (programs[k] for k in sorted(programs)):
        comm.agree("the recorded graph", program)


def _collectives_in(nodes: Sequence[RecordedNode], inside: str) -> Iterator[tuple[Collective, str]]:
    """The collectives of a recording in record order, each with the bodies it is in ("in a loop
    body: ", nested ones in turn): a collective that one rank runs in a loop and another once is a
    mismatch too."""
    for node in nodes:
        op = node.op
        if type(op) is Collective:
            yield op, inside
        elif isinstance(op, ControlNode):
            for body in op.bodies:
                yield from _collectives_in(body.nodes, f"{inside}in a {body.kind}: ")


_scope.finishing.append(check_recorded)


# -- set-up ---------------------------------------------------------------------------------


def init_distributed(
    dev: Device | str | None = None,
    bootstrap: Bootstrap | str | None = None,
    check_eager: bool = True,
    timeout: float | None = None,
) -> Communicator:
    """This process's Communicator, from the launcher's environment (torchrun, mpirun, or
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): see ``scopegraph._bootstrap``.

    ``dev`` defaults to this rank's GPU, ``cuda:LOCAL_RANK`` (one process per GPU), when GPUs exist
    and ``SCOPEGRAPH_DEVICE`` does not say otherwise, else the host backend. A bare ``"cuda"`` also
    means this rank's GPU."""
    timeout = check_timeout(timeout)
    if not isinstance(check_eager, (bool, np.bool_)):  # "no" would be truthy: the checks silently on
        raise SignatureError(
            f"init_distributed(check_eager=) takes True or False, not {check_eager!r}\n"
            "help: pass check_eager=False to skip the per-call agreement check of eager collectives"
        )
    if bootstrap is None or isinstance(bootstrap, str):
        boot = from_env(bootstrap, timeout)
    elif all(hasattr(bootstrap, name) for name in ("rank", "world_size", "kind", "allgather", "close")):
        boot = bootstrap
    else:
        raise SignatureError(
            f"init_distributed(bootstrap=) takes a bootstrap's name or a Bootstrap, not {type(bootstrap).__name__} "
            f"{bootstrap!r}\nhelp: pass one of {', '.join(BOOTSTRAPS)}, an object with rank, world_size, kind, "
            "allgather() and close(), or leave it out to pick from the launcher's environment"
        )
    try:
        return Communicator(device(_rank_device(dev, boot.rank)), boot, bool(check_eager))
    except BaseException:
        if boot is not bootstrap:  # made here: let its port go
            boot.close()
        raise


def _rank_device(dev: Device | str | None, rank: int) -> Device | str:
    """The device of ``rank`` (see init_distributed): a bare "cuda" is this rank's GPU."""
    spec = dev if dev is not None else env_device() or ("cuda" if cuda_device_count() else "host")
    if isinstance(spec, str) and spec.strip().lower() == "cuda":
        local = _local_rank(rank)
        count = cuda_device_count()
        if count and local >= count:
            raise DistributedError(
                f"rank {rank} (local rank {local}) has no GPU of its own: this machine has {count}\n"
                "help: start at most one process per GPU (torchrun --nproc-per-node N with N <= the GPU count)"
            )
        spec = f"cuda:{local}"
    return spec


def _local_rank(rank: int) -> int:
    """This process's index among the processes of its machine: ``LOCAL_RANK`` (torchrun sets it), else ``rank``."""
    text = os.environ.get("LOCAL_RANK", "").strip()
    if not text:
        return rank
    if not (text.isdigit() and text.isascii()):
        raise DistributedError(
            f"LOCAL_RANK={text!r} is not a process index\n"
            "help: set LOCAL_RANK to this process's index on its machine (0, 1, ...; torchrun sets it), or unset it"
        )
    return int(text)


def all_reduce(dst: Mut[Tensor], comm: Communicator, src: Tensor | None = None, op: str = "sum") -> Collective:
    """``comm.all_reduce(dst, src, op)``."""
    return Collective(comm, "all_reduce", dst, src, op)


def all_gather(dst: Mut[Tensor], src: Tensor, comm: Communicator) -> Collective:
    """``comm.all_gather(dst, src)``."""
    return Collective(comm, "all_gather", dst, src)


def reduce_scatter(dst: Mut[Tensor], src: Tensor, comm: Communicator, op: str = "sum") -> Collective:
    """``comm.reduce_scatter(dst, src, op)``."""
    return Collective(comm, "reduce_scatter", dst, src, op)


def broadcast(dst: Mut[Tensor], comm: Communicator, root: int = 0, src: Tensor | None = None) -> Collective:
    """``comm.broadcast(dst, root, src)``."""
    return Collective(comm, "broadcast", dst, src, root=root)
