"""The host backend: numpy memory, ops run at once, graphs replayed in a random dependency order.

It runs the same records the CUDA backend would, with each kernel's ``@k.host`` reference, so
the whole library (and users' graph programs) can be tested on machines without a GPU.

- Streams are synchronous here: work runs when it is submitted, so there is no stream ordering
  and no deferred release to keep.
- A replay runs the nodes in a *random valid topological order* of the DAG, a new one each
  replay, drawn from a seeded generator (:func:`seed_replay_order`; ``SCOPEGRAPH_HOST_SEED``,
  or the pytest plugin's ``--sg-seed``). A missing dependency edge therefore shows up as a wrong
  result in tests, reproducibly, instead of hiding behind record order.
- A reference gets exactly each tensor's view (read-only for shared borrows), as a
  :class:`HostView`: a numpy array whose indexing refuses slices past the view (numpy would clip
  them silently). An access past the view the reference makes (numpy's IndexError, its
  broadcast errors) becomes a BoundsError naming the launch; a write to a read-only
  view, a BorrowError; anything else it raises, a HostReferenceError (the exception its cause).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from graphlib import TopologicalSorter
from typing import TYPE_CHECKING, Any

import numpy as np

from .._allocation import Export
from .._capture import Captured
from .._control import Body, ControlNode, While, levels
from .._errors import (
    BorrowError,
    NoHostReferenceError,
    PdlWaitError,
    ScopeGraphError,
    diagnostic,
    host_code_failed,
)
from .._kernel import KernelLaunch
from .._ops import GraphNode, Memcpy, Memset, unknown_kind
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._allocation import Allocation
    from .._scope import RecordedNode
    from .._stream import Stream
    from ._base import Executable

NDArray = np.ndarray[Any, np.dtype[Any]]

_order = random.Random()
_order_lock = threading.Lock()
replay_seed = 0


def seed_replay_order(seed: int | None = None) -> int:
    """Reseed the generator of host replay orders (None: ``SCOPEGRAPH_HOST_SEED``, else random).
    Returns the seed, so a failure can be reproduced."""
    global replay_seed
    if seed is None:
        env = os.environ.get("SCOPEGRAPH_HOST_SEED", "").strip()
        if env.lstrip("-").isdigit():
            seed = int(env)
        else:
            seed = random.SystemRandom().randrange(2**32)
            if env:  # read when scopegraph is imported, so a warning rather than an error
                warnings.warn(
                    f"SCOPEGRAPH_HOST_SEED={env!r} is not a whole number: host replay orders use the random "
                    f"seed {seed} (set SCOPEGRAPH_HOST_SEED={seed} to replay them)",
                    stacklevel=2,
                )
    replay_seed = seed
    with _order_lock:
        _order.seed(seed)
    return seed


seed_replay_order()


_getitem = np.ndarray.__getitem__
_setitem = np.ndarray.__setitem__


class HostView(np.ndarray[Any, np.dtype[Any]]):
    """A host reference's numpy view of a tensor, strict where numpy is lenient: indexing it with
    a slice that starts or stops past the end of its axis (``out[:n]`` with ``n`` larger than the
    view), or starts before its beginning (``x[-n:]``), is an IndexError, because on a GPU that
    access would reach past the tensor. Integer indices (numpy checks those itself; negative ones
    count from the end), index arrays and ``...`` keep numpy's meaning, and every numpy operation
    works as on any array. Views of it (``reshape``, slices) are HostViews too; what numpy
    computes from it (``a * x``, ``w @ x``) is a plain array. ``.flat`` stays numpy's, which clips
    a slice to the end: numpy's own functions rely on that (``np.fill_diagonal`` of a wide matrix
    slices ``a.flat`` past it). So does a plain ndarray made from it (``np.asarray(out)``,
    ``out.view(np.ndarray)``): numpy hands those out, and its functions make them internally, so
    the check stops there.
    """

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        if type(key) is slice or type(key) is tuple:
            _check_index(key, self.shape)
        return _getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(key) is slice or type(key) is tuple:
            _check_index(key, self.shape)
        _setitem(self, key, value)

    def __array_wrap__(self, array: Any, context: Any = None, return_scalar: bool = False) -> Any:
        # Results of ufuncs (a fresh ndarray) stay plain; an `out=` HostView is returned as itself.
        return array[()] if return_scalar else array


def _check_index(key: slice | tuple[Any, ...], shape: tuple[int, ...]) -> None:
    """Refuse a slice of ``key`` that reaches past its axis of ``shape`` (an IndexError)."""
    items = (key,) if type(key) is slice else key
    axis = 0
    for position, item in enumerate(items):
        if type(item) is slice:
            if axis < len(shape):
                _check_slice(item, shape[axis], axis, shape)
            axis += 1
        elif item is Ellipsis:  # the items after it index the last axes
            axis = len(shape) - sum(_axes_of(rest) for rest in items[position + 1 :])
        else:
            axis += _axes_of(item)


def _axes_of(item: object) -> int:
    """How many axes of the array an index item consumes (None and a bool: none; a boolean mask: its rank)."""
    if item is None or isinstance(item, (bool, np.bool_)):
        return 0
    if isinstance(item, np.ndarray) and item.dtype == np.bool_:
        return item.ndim
    return 1


def _check_slice(item: slice, length: int, axis: int, shape: tuple[int, ...]) -> None:
    start, stop, step = item.start, item.stop, item.step
    if step is None or step > 0:  # a start before the axis (x[-100:] of 12) is past it too
        bad = (start is not None and not -length <= start <= length) or (stop is not None and stop > length)
    else:
        bad = start is not None and start >= length
    if bad:
        text = f"{'' if start is None else start}:{'' if stop is None else stop}{'' if step is None else f':{step}'}"
        raise IndexError(
            f"slice [{text}] reaches past axis {axis} of the view of shape {shape}, which has {length} elements"
        )


def _array(tensor: Tensor, writable: bool, cls: type[NDArray] = np.ndarray) -> NDArray:
    """A numpy view of exactly a tensor's bytes (read-only for shared borrows), of class ``cls``."""
    storage: NDArray = tensor.allocation.storage  # type: ignore[assignment]
    view = cls(tensor.shape, tensor.dtype.numpy, storage, tensor.offset)
    if not writable:
        view.setflags(write=False)
    return view


class _Exported:
    """A host tensor's numpy view as the base of a DLPack export: the consumer's array keeps it,
    and with it an Export of the allocation (free() refuses while it lives, and freeze() while it
    is writable, as on a GPU)."""

    def __init__(self, tensor: Tensor, writable: bool) -> None:
        self.view = view = _array(tensor, writable)
        self.__array_interface__ = view.__array_interface__
        self.export = Export.of(tensor, writable)


def _host_view(tensor: Tensor, writable: bool) -> NDArray:
    """What a host reference gets for a tensor: its exact view, as a HostView."""
    return _array(tensor, writable, HostView)


_NO_LAUNCH: dict[str, tuple[int, int, int] | tuple[str, ...]] = {}
_GRID_AND_BLOCK = ("grid", "block")


_NO_BODIES: dict[Body, _HostGraph] = {}


def _thunk(
    op: GraphNode, values: Mapping[str, np.generic] | None = None, bodies: Mapping[Body, _HostGraph] = _NO_BODIES
) -> Callable[[], None]:
    """Bind an op to numpy views once, so replay only calls functions. ``values``: the graph's
    parameter values (default: each sg.Param's default); a change binds the node again.
    ``bodies``: the sub-graphs that run loop and branch bodies (a graph's, see _HostGraph.load)."""
    if isinstance(op, Memcpy):
        dst, src = _array(op.dst, True).reshape(-1), _array(op.src, False).reshape(-1)
        return lambda: np.copyto(dst, src)
    if isinstance(op, Memset):
        dst, value = _array(op.dst, True), op.value
        return lambda: dst.fill(value)
    if isinstance(op, ControlNode):
        return _control_thunk(op, [bodies[b] for b in op.bodies])
    if isinstance(op, Captured):  # a captured region's host callable, or a collective over the bootstrap
        return op.host_thunk(_host_view)
    if not isinstance(op, KernelLaunch):
        return lambda: None  # a join: nothing to do
    fn = op.kernel.host_fn
    assert fn is not None
    borrows = iter(op.borrows)  # one per tensor argument, in order
    args = op.resolved(values) if op.params else op.args
    bound = tuple(_host_view(a, next(borrows).mutable) if isinstance(a, Tensor) else a for a in args)
    # The launch's grid and block, and a template's arguments, for a reference that declares them
    # (keyword-only `grid`, `block`, `template_args`).
    names = op.kernel.host_launch
    if not names:
        launch = _NO_LAUNCH
    elif names == _GRID_AND_BLOCK:  # the library's references (eager runs bind each time: keep it cheap)
        launch = {"grid": op.grid, "block": op.block}
    else:
        launch = {name: op.kernel.template_args if name == "template_args" else getattr(op, name) for name in names}

    def run() -> None:
        try:
            fn(*bound, **launch)
        except ScopeGraphError:
            raise
        except Exception as exc:
            if not (isinstance(exc, ValueError) and "read-only" in str(exc)):  # numpy's "destination is read-only"
                raise _reference_failed(op, exc) from exc
            raise BorrowError(
                diagnostic(
                    f"the host reference of `{op.name}` wrote a tensor the kernel only reads (its view is read-only)",
                    [
                        f"launched as {op.name}[{op.grid}, {op.block}]",
                        *(
                            f"{b.param}: {b.tensor.name} is a Tensor parameter (read)"
                            for b in op.borrows
                            if not b.mutable
                        ),
                    ],
                    help="if the kernel writes it, declare the parameter Mut[Tensor] and pass tensor.mut() "
                    "(scopegraph orders writers after readers only if it knows); otherwise fix the reference",
                )
            ) from exc

    return run


def _reference_failed(op: KernelLaunch, exc: Exception) -> ScopeGraphError:
    return host_code_failed(
        f"the host reference of `{op.name}`",
        exc,
        [
            f"launched as {op.name}[{op.grid}, {op.block}]",
            *(f"{b.param}: {b.tensor.name} {b.tensor.shape}" for b in op.borrows),
        ],
        "the launch reads or writes past a tensor it was given (on a GPU: an illegal address), "
        "or combines views whose shapes differ; check its size arguments and shapes, or declare "
        "the sizes with @sg.kernel(..., touches=...)",
    )


def _control_thunk(op: ControlNode, bodies: list[_HostGraph]) -> Callable[[], None]:
    """A loop or branch: its bodies are sub-graphs, each run replayed in a new random order."""
    flag = _array(op.flag, False).reshape(-1)
    if isinstance(op, While):
        body, limit = bodies[0], op.max_iterations

        def loop() -> None:
            done = 0
            while flag[0]:
                if limit is not None and done >= limit:
                    raise op.limit_error(int(flag[0]))
                body.replay()
                done += 1

        return loop
    then, otherwise = bodies[0], (bodies[1] if len(bodies) > 1 else None)

    def branch() -> None:
        if flag[0]:
            then.replay()
        elif otherwise is not None:
            otherwise.replay()

    return branch


class _HostGraph:
    """An instantiated host graph, or one loop or branch body of it: the ops' thunks and the DAG
    they are replayed in."""

    def __init__(self, thunks: list[Callable[[], None]], deps: list[frozenset[int]]) -> None:
        self.thunks = thunks
        self.deps = deps
        self._lock = threading.Lock()
        # A graph's (not a body's): where each node runs, by slot (scopegraph._control.levels): the
        # graph or body sub-graph, and the node's index there; and the sub-graph of each body.
        self.places: list[tuple[_HostGraph, int]] = []
        self.bodies: dict[Body, _HostGraph] = {}
        # The sub-graphs of each loop's or branch's bodies, by the loop's slot: a node update may
        # bring the same loop from a new recording (into=), whose bodies then run in them.
        self.body_graphs: dict[int, list[_HostGraph]] = {}

    def load(self, nodes: Sequence[RecordedNode]) -> _HostGraph:
        """Bind the recording's nodes, bodies included, each to its sub-graph (parameters at their defaults)."""
        flat, found = levels(nodes)
        graphs = [self] + [_HostGraph([], [n.deps for n in level.nodes]) for level in found[1:]]
        self.deps = [n.deps for n in nodes]
        self.bodies = {level.body: g for level, g in zip(found, graphs, strict=True) if level.body is not None}
        for level, g in zip(found, graphs, strict=True):
            g.thunks = [_thunk(n.op, None, self.bodies) for n in level.nodes]
        self.places = [(g, i) for level, g in zip(found, graphs, strict=True) for i in range(len(level.nodes))]
        self.body_graphs = {
            slot: [self.bodies[b] for b in rec.op.bodies]
            for slot, rec in enumerate(flat)
            if isinstance(rec.op, ControlNode)
        }
        return self

    def order(self) -> list[int]:
        """A random topological order of the DAG, drawn from the seeded replay generator."""
        sorter = TopologicalSorter(dict(enumerate(self.deps)))
        sorter.prepare()
        ready: list[int] = []
        order: list[int] = []
        with _order_lock:
            while sorter.is_active():
                ready.extend(sorter.get_ready())
                pick = _order.randrange(len(ready))
                ready[pick], ready[-1] = ready[-1], ready[pick]
                node = ready.pop()
                order.append(node)
                sorter.done(node)
        return order

    def launch(self, stream: Stream) -> None:
        with self._lock:
            self.replay()

    def replay(self) -> None:
        """Run every node once, in a new random topological order (a loop body: once per iteration)."""
        thunks = self.thunks
        for i in self.order():
            thunks[i]()

    def close(self) -> None:
        self.thunks = []
        self.deps = []
        self.places = []
        self.bodies = {}
        self.body_graphs = {}

    # -- changes (scopegraph._params and _rebind): what the CUDA backend does with node and whole-graph updates

    def update_node(self, index: int, op: GraphNode, values: Mapping[str, np.generic]) -> None:
        """Make the node of slot ``index`` (in a body too: scopegraph._control.levels) run ``op``
        (the same kind of node) with these parameter values. A loop or branch keeps its bodies'
        sub-graphs and reads its (new) flag."""
        graph, i = self.places[index]
        if isinstance(op, ControlNode):  # its bodies (a new recording's, after into=) run in its sub-graphs
            graphs = self.body_graphs[index]
            for body in [b for b, g in self.bodies.items() if g in graphs]:
                del self.bodies[body]
            self.bodies.update(zip(op.bodies, graphs, strict=True))
        graph.thunks[i] = _thunk(op, values, self.bodies)

    def update_whole(self, nodes: Sequence[RecordedNode]) -> bool:
        """Take a new recording of the same topology (the caller compared it)."""
        self.load(nodes)
        return True

    whole_updates = 0  # node updates are never whole-graph updates here (scopegraph._update.update_executable)
    pdl = False  # the host backend has no programmatic edges

    # A loop past its bound raises at launch here: nothing is left to report.
    def after_sync(self, last: Stream) -> None:
        pass

    def take_reports_of(self, replaced: Executable) -> None:
        pass


class HostBackend:
    name = "host"

    def allocate(self, nbytes: int) -> tuple[object, int]:
        storage = np.empty(nbytes, np.uint8)
        return storage, int(storage.ctypes.data)

    def retire(self, storage: object, users: set[object], borrowed: bool) -> None:
        pass  # host work is finished when it returns; numpy frees the array with its last reference

    def read(self, alloc: Allocation, offset: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        storage: NDArray = alloc.storage  # type: ignore[assignment]
        return storage[offset : offset + nbytes].copy()

    def write(self, tensor: Tensor, array: NDArray, stream: Stream | None) -> None:
        _array(tensor, True)[...] = array.reshape(tensor.shape)

    def create_stream(self) -> object:
        return None

    def stream_from_handle(self, obj: object) -> tuple[object, int]:
        raise AssertionError("the host backend has no foreign streams")  # Stream.from_handle asks CUDA

    def sync_stream(self, stream: Stream) -> None:
        pass

    def wait_stream(self, waiter: object, waited: object) -> None:
        pass

    def mark(self, stream: object) -> object:
        return stream  # host work has finished when it returns: it keeps no stream bookkeeping

    def finished(self, mark: object) -> bool:
        return False

    def idle(self, stream: object) -> bool:
        return False

    def captures(self, handle: int) -> bool:
        return False

    def relaxed(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sync(self) -> None:
        pass

    def prepare(self, op: GraphNode) -> None:
        if type(op) is KernelLaunch:
            if op.kernel.host_fn is None:
                raise NoHostReferenceError(
                    diagnostic(
                        f"kernel `{op.name}` has no host reference, so the host backend cannot run it",
                        [f"declared as {op.kernel!r}"],
                        help=f"add a numpy reference with @{op.kernel.__name__}.host, or run on a CUDA device",
                    )
                )
            if not op.kernel.may_wait:  # what an sm_90 GPU refuses, the host refuses too
                raise PdlWaitError(
                    op.kernel.name_expression,
                    "host",
                    found="its source has neither griddepcontrol.wait nor cudaGridDependencySynchronize() "
                    "and includes nothing that could: compiled for sm_90 or later it is refused the same way",
                )
        elif not op.built_in:  # off the hot path: kernel launches are scopegraph's own kind
            raise unknown_kind(op)
        elif isinstance(op, Captured):  # a region needs its host callable here (scopegraph._capture)
            op.check_host()

    def run(self, op: GraphNode, stream: Stream) -> None:
        _thunk(op)()

    def build(self, nodes: Sequence[RecordedNode], stream: Stream) -> _HostGraph:
        return _HostGraph([], []).load(nodes)

    def ready_stream(self, alloc: Allocation) -> int | None:
        return None

    def dlpack(self, tensor: Tensor, stream: int | None, options: dict[str, Any], writable: bool) -> object:
        # numpy flags a read-only array's versioned (DLPack 1.x) capsule read-only and makes the copy
        # for copy=True; Tensor.__dlpack__ refuses the frozen exports that could not carry the flag.
        return np.asarray(_Exported(tensor, writable)).__dlpack__(**options)

    def dlpack_device(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU
