"""Device-side control flow: loops and branches inside one graph (DESIGN.md section 8).

    with CudaGraph.scope(stream) as s:
        s.record(sg.memset(remaining.mut(), 10))
        with s.while_(remaining, max_iterations=100) as body:   # while remaining != 0
            body.record(step[grid, block](x.mut(), ...))
            body.record(library.count_down_op(remaining.mut()))
        with s.if_(converged) as then:                          # if converged != 0
            then.record(...)
        with s.if_else(converged) as (then, otherwise):         # if / else
            then.record(...)
            otherwise.record(...)

``flag`` is a one-element ``i32`` tensor. A loop checks it before each iteration, the first
included, and stops when it is zero; a branch checks it once, when the graph reaches it. The GPU
decides: the whole loop is one node of the graph, replayed by one ``graph.launch()``.

Bodies follow the scope's rules. A :class:`Body` records GraphNode ops only (kernel launches,
memcpy, memset, captured regions (``body.capture(...)``), collectives, and nested loops and
branches: the node kinds a CUDA conditional body can hold, a captured region or collective being a
child graph; any other kind is refused when it is recorded), checks every op's borrows when the op
is built, and orders its ops by their data with a tracker of its own (a DAG inside the body). A
child graph must itself hold only kernel, memcpy, memset, empty, child-graph and conditional nodes:
a captured region whose capture holds anything else (an event record or wait, a host callback) is
refused when its ``with`` block ends, and a collective whose NCCL capture does when the scope builds
its graph (see ``scopegraph._capture`` and ``scopegraph._collectives``). Graph parameters
(``sg.Param``) work in bodies as at the top level. The
loop or branch is recorded into its owner, when its ``with`` block ends, as one
:class:`ControlNode` that borrows what its body borrows plus a read of ``flag``, so the outer DAG
orders it after the ops that produce what it reads and before those that use what it writes.
While a block is open its owner refuses ``record`` (an op recorded there would land *before*
the loop): record into the body handle.

On CUDA a conditional node (cuda.core ``create_condition`` / ``while_loop`` / ``if_then`` /
``if_else``) holds each body as a graph of its own. A one-thread kernel, :data:`sg_condition`,
copies ``flag != 0`` into the node's condition with ``cudaGraphSetConditional``: once just before
the conditional node, and for a loop once more at the end of every iteration, after the body's
last writes of ``flag``. The backend adds these kernels; they are not in ``graph.nodes`` or the
body's ``nodes``, only in the driver's own picture (``graph.to_dot(include_driver=True)``).

The host backend runs the same semantics in Python: a body is a sub-graph replayed, each
iteration, in a new random topological order, like the main graph.

Iteration bounds: ``max_iterations=N`` allows at most N iterations per run of the loop. If
``flag`` is still non-zero when iteration N+1 would start:

- on the host backend ``graph.launch()`` raises :class:`LoopLimitError` at once (the rest of the
  graph does not run);
- on the GPU the loop ends there (the condition kernel counts iterations in a small tensor the
  loop owns), the rest of the graph runs on whatever the body left, and the next
  ``graph.sync()`` raises :class:`LoopLimitError`. (``stream.sync()`` or reading a tensor does
  not check; the overrun stays recorded until a ``graph.sync()`` reports it, also when
  ``CudaGraph.scope(stream, into=graph)`` has meanwhile given the graph a new recording.) That
  report reads and resets the counters under the graph's lock, so a launch from another thread
  waits for it.

Without ``max_iterations`` the GPU loops until the body clears ``flag``: a body that never does
runs forever, the stream never drains and ``sync()`` never returns (the process must be killed).
"""

from __future__ import annotations

import copy
import operator
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

import numpy as np

from . import _scope
from ._borrow import Borrow
from ._capture import Captured, Region
from ._dtypes import i32, int32, u64
from ._errors import NotAGraphNodeError, ScopeGraphError, ScopeStateError, SignatureError, diagnostic
from ._kernel import KernelLaunch, kernel
from ._ops import GraphNode, Join, Memcpy, Memset, RecordedOnce
from ._params import note_params
from ._pdl import NONE, EdgeKinds
from ._scope import (
    RecordedNode,
    Scope,
    _not_a_graph_node,
    _State,
    end_inner,
    never_entered,
    not_open,
    unentered_in,
)
from ._stream import check_runnable
from ._tensor import Mut, Tensor
from ._tracker import ORDERS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from ._device import Device
    from ._stream import Stream

T_co = TypeVar("T_co", covariant=True)

CONDITION_SOURCE = r"""
// Declared here rather than included: NVRTC compiles scopegraph's kernels without the CUDA headers.
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(unsigned long long handle, unsigned value);

// Copies `*flag != 0` into a conditional node's condition. For a loop with an iteration bound,
// `count` is the loop's counter: count[0] the iterations begun in this run of the loop (reset by
// the launch before the loop, `first`), count[1] set to 1 when the bound stopped the loop.
extern "C" __global__ void sg_condition(unsigned long long handle, const int* flag, int* count, int limit, int first) {
    unsigned go = *flag != 0;
    if (count != nullptr && go) {
        int begun = first ? 0 : count[0];
        if (begun >= limit) {
            go = 0;
            count[1] = 1;
        } else {
            count[0] = begun + 1;
        }
    }
    cudaGraphSetConditional(handle, go);
}
"""


@kernel(CONDITION_SOURCE)
def sg_condition(handle: u64, flag: Tensor, count: Mut[Tensor], limit: i32, first: i32) -> None:
    """Sets a conditional node's condition from ``flag``. The CUDA backend launches it (one thread)
    before each conditional node and at the end of each loop iteration; users never record it."""


class LoopLimitError(ScopeGraphError):
    """A loop recorded with ``max_iterations=N`` still had a non-zero flag after N iterations."""


def _where(depth: int) -> tuple[str, int]:
    frame = sys._getframe(depth + 1)
    return frame.f_code.co_filename, frame.f_lineno


# What a CUDA conditional body can hold: kernel, memcpy, memset, empty, child-graph and conditional
# nodes. A captured region or a collective is a child graph, whose own nodes are checked when it is
# captured. Anything else is refused when recorded.
_BODY_KINDS: tuple[type[GraphNode], ...] = (KernelLaunch, Memcpy, Memset, Join, Captured)


class Body:
    """The ops of a loop body or of one side of a branch: ``body.record(op)`` and
    ``body.capture(...)`` work as ``s.record(op)`` and ``s.capture(...)`` do, with a dependency
    tracker of its own, and loops and branches nest (``body.while_``, ``body.if_``, ``body.if_else``)."""

    def __init__(self, root: Scope, kind: str, flag: Tensor, where: tuple[str, int]) -> None:
        # The scope recording the graph; dropped when the body closes (a graph holds its bodies, and
        # its scope holds the graph: no reference cycle keeps a dropped graph alive).
        self._root: Scope | None = root
        self.device: Device = root.stream.device
        self.kind = kind  # "loop body", "then" or "else"
        self.flag = flag
        self._where = where
        self._nodes: list[RecordedNode] = []
        self._edge_kinds = EdgeKinds(root.order)
        self._tracker = ORDERS[root.order](self._add_join)
        self._open = True
        self._inner: Block[object] | Region | None = None
        # Blocks made in this body and not entered yet (see Scope._unentered): the clean exit of the
        # block that holds the body refuses them; one that raises drops them with the body.
        self._unentered: dict[int, Block[object] | Region] = {}
        # The body nodes the end-of-iteration condition kernel waits for (the last writers of
        # `flag`), set when a loop body closes.
        self.condition_deps: frozenset[int] = frozenset()

    @property
    def opened_at(self) -> str:
        return f"{self._where[0]}:{self._where[1]}"

    @property
    def nodes(self) -> tuple[RecordedNode, ...]:
        """The body's ops in record order (a topological order of the body's DAG)."""
        return tuple(self._nodes)

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return f"<Body ({self.kind} of `{self.flag.name}`), {len(self._nodes)} nodes, {state}>"

    def record(self, op: GraphNode) -> RecordedNode:
        """Add ``op`` to the body; returns a handle naming the node. Only GraphNode ops that a
        conditional body can hold are accepted (kernel launches, memcpy, memset, collectives,
        loops, branches; captured regions come from ``body.capture``)."""
        self._check_recording("record into")
        if not isinstance(op, GraphNode):
            raise _not_a_graph_node(op)
        if not isinstance(op, (*_BODY_KINDS, ControlNode)):
            raise NotAGraphNodeError(
                diagnostic(
                    f"cannot record `{op.name}` ({type(op).__name__}) in a {self.kind}",
                    [
                        f"the {self.kind} was opened at {self.opened_at}",
                        "a CUDA conditional body holds only kernel launches, memcpy, memset, child graphs "
                        "(captured regions, collectives) and nested loops and branches",
                    ],
                    help="record this op outside the loop or branch, before or after it",
                )
            )
        root = self._root
        assert root is not None  # open
        check_runnable(op, root.stream)
        if type(op) is KernelLaunch:
            if op.params:
                note_params(root._params, op)  # one name, one parameter, in bodies as at the top level
        elif isinstance(op, RecordedOnce):
            op.take()
        borrows = op.borrows
        deps = self._tracker.add(borrows)
        root._pin.add(borrows)
        # Edges between PDL kernels may be programmatic inside a body too (scopegraph._pdl).
        programmatic = self._edge_kinds.of(op, deps, self._nodes) if getattr(root, "pdl", False) else NONE
        node = RecordedNode(len(self._nodes), op, deps, _where(1), programmatic)
        self._nodes.append(node)
        return node

    def capture(
        self,
        *,
        writes: Sequence[Mut[Tensor]],
        reads: Sequence[Tensor] = (),
        host: Callable[..., object] | None = None,
        via: str = "cuda",
        name: str = "capture",
        keep: Sequence[object] = (),
        mode: str = "thread_local",
    ) -> Region:
        """A captured region inside the body: see :meth:`Scope.capture`. Its node runs in every
        iteration of the loop (or when the branch is taken). On CUDA its capture may hold only the
        node kinds a conditional body can: kernels, copies, fills and child graphs (no event
        record or wait, no host callback), else the region is refused when its block ends."""
        return Region(self, writes, reads, host, via, name, keep, mode, _where(1))

    def while_(self, flag: Tensor, max_iterations: int | None = None) -> Block[Body]:
        """A loop nested in this body: see :meth:`Scope.while_`."""
        return Block(self, "while", flag, max_iterations, _where(1))

    def if_(self, flag: Tensor) -> Block[Body]:
        """A branch nested in this body: see :meth:`Scope.if_`."""
        return Block(self, "if", flag, None, _where(1))

    def if_else(self, flag: Tensor) -> Block[tuple[Body, Body]]:
        """A two-way branch nested in this body: see :meth:`Scope.if_else`."""
        return Block(self, "if_else", flag, None, _where(1))

    # -- internals ------------------------------------------------------------------------

    def _check_recording(self, what: str) -> None:
        if self._root is not None:
            self._root.check_thread()
        if not self._open:
            raise ScopeStateError(
                diagnostic(
                    f"cannot {what} a {self.kind} that is closed",
                    [f"the {self.kind} was opened at {self.opened_at}; its `with` block has ended"],
                    help=f"record inside the `with` block of the {self.kind}",
                )
            )
        if self._inner is not None:
            raise self._inner.busy(f"{what} the enclosing {self.kind}")

    def _add_join(self, index: int, deps: frozenset[int]) -> None:
        assert index == len(self._nodes)
        self._edge_kinds.join(index)
        self._nodes.append(RecordedNode(index, Join(), deps, self._nodes[-1]._where if self._nodes else self._where))

    def _close(self, loop: bool) -> None:
        self._open = False
        self._root = None
        self._edge_kinds.clear()
        if loop:
            # A read of `flag` after everything recorded: the tracker names its last writers.
            self.condition_deps = self._tracker.add([Borrow(self.flag, False, "flag")])


def _check_flag(flag: object, what: str) -> Tensor:
    if isinstance(flag, Mut):
        raise SignatureError(
            diagnostic(
                f"`{what}` reads its flag, but it got a mutable borrow (`{flag.tensor.name}.mut()`)",
                ["the body's ops may write the flag; the loop or branch itself only reads it"],
                help=f"pass `{flag.tensor.name}` without .mut()",
            )
        )
    if not isinstance(flag, Tensor):
        raise SignatureError(
            f"`{what}` takes its flag as a one-element sg.i32 tensor, not {type(flag).__name__}\n"
            "help: make one with dev.zeros((1,), sg.i32) and set it with sg.memset or a kernel"
        )
    flag.check_alive()
    if flag.dtype != int32 or flag.size != 1:
        raise SignatureError(
            diagnostic(
                f"`{what}` flag `{flag.name}` is {flag.dtype.name}{list(flag.shape)}",
                ["a flag is one int32 element: non-zero means run (or take the branch), zero means stop"],
                help="pass a one-element sg.i32 tensor, e.g. dev.zeros((1,), sg.i32) or a view t[i:i + 1]",
            )
        )
    return flag


class Branches(tuple[Body, Body]):
    """What ``with s.if_else(flag) as (then, otherwise):`` unpacks: the two bodies. Used as one
    body (``as then:``, then ``then.record(op)``) it says how to unpack it, where a plain tuple
    would raise an AttributeError about tuples."""

    __slots__ = ()

    if not TYPE_CHECKING:  # mypy reports such a use itself: a tuple has no `record`

        def __getattr__(self, name: str) -> object:
            if name.startswith("__") or not hasattr(Body, name):
                raise AttributeError(name)
            raise ScopeStateError(
                diagnostic(
                    f"`{name}` of the bodies of an if_else: it gives two, the `then` and the `else`",
                    ["`with s.if_else(flag) as then:` binds both to `then`"],
                    help="unpack them: `with s.if_else(flag) as (then, otherwise):`, then `then.record(op)` "
                    "and `otherwise.record(op)`",
                )
            )


class Block(Generic[T_co]):
    """The ``with`` block of a loop or branch: opens its bodies, and on a clean exit records the
    whole loop or branch into its owner as one ControlNode."""

    def __init__(
        self, owner: Scope | Body, kind: str, flag: Tensor, max_iterations: int | None, where: tuple[str, int]
    ) -> None:
        what = {"while": "while_", "if": "if_", "if_else": "if_else"}[kind]
        self.flag = _check_flag(flag, what)
        if max_iterations is not None:
            if (
                isinstance(max_iterations, (bool, np.bool_))
                or not isinstance(max_iterations, (int, np.integer))
                or not (0 <= max_iterations <= 2**31 - 1)
            ):
                raise SignatureError(
                    f"max_iterations={max_iterations!r} is not a whole number from 0 to 2**31 - 1\n"
                    "help: pass the most iterations the loop may run, or leave it out (no bound)"
                )
            max_iterations = operator.index(max_iterations)
        self.owner = owner
        self.kind = kind
        self.max_iterations = max_iterations
        self.where = where
        self.bodies: tuple[Body, ...] = ()
        self._entered = self._open = False
        # The scope's pin before the bodies added to it: undone if the block raises.
        # Where the root scope stood when the block opened: its pins, and how many parameter names
        # it knew (see _roll_back).
        self._mark: tuple[Scope, tuple[int, int], int] | None = None
        # Until entered, the scope's clean exit refuses it (see Scope._unentered).
        self._waiting = unentered_in(owner)
        self._waiting[id(self)] = self

    @property
    def location(self) -> str:
        return f"{self.where[0]}:{self.where[1]}"

    @property
    def description(self) -> str:
        return "loop" if self.kind == "while" else "branch"

    @property
    def usage(self) -> str:
        return {
            "while": "with s.while_(flag) as body:",
            "if": "with s.if_(flag) as then:",
            "if_else": "with s.if_else(flag) as (then, otherwise):",
        }[self.kind]

    def busy(self, what: str) -> ScopeStateError:
        label = self.description
        return ScopeStateError(
            diagnostic(
                f"cannot {what} while the {label} opened at {self.location} is recording",
                ["an op recorded there now would run before the whole loop or branch, not inside it"],
                help="record into the handle of the `with` block (`body.record(op)`, `body.capture(...)`), "
                "or after the block ends",
            )
        )

    def __enter__(self) -> T_co:
        owner = self.owner
        self._waiting.pop(id(self), None)  # tried: whatever happens now, it is not silently dropped
        if self._entered:
            raise ScopeStateError(
                "this loop or branch block was already used\nhelp: open a new one with s.while_(flag) or s.if_(flag)"
            )
        if isinstance(owner, Scope):
            _check_scope_open(owner)
            if owner._inner is not None:
                raise owner._inner.busy("open another loop or branch in the scope")
            root = owner
        else:
            owner._check_recording("open a loop or branch in")
            assert owner._root is not None  # open
            root = owner._root
        if self.flag.device is not root.stream.device:
            raise SignatureError(
                diagnostic(
                    f"flag `{self.flag.name}` is on {self.flag.device} but the scope records on {root.stream.device}",
                    help="make the flag on the stream's device",
                )
            )
        self.flag.check_alive()
        kinds = {"while": ("loop body",), "if": ("then",), "if_else": ("then", "else")}[self.kind]
        self.bodies = tuple(Body(root, k, self.flag, self.where) for k in kinds)
        # Body ops pin their memory and name their parameters as they are recorded (eager work on
        # it from then on must come before the first replay), so a block that raises takes both back.
        self._mark = (root, root._pin.mark(), len(root._params))
        owner._inner = self
        self._entered = self._open = True
        if self.kind == "if_else":
            return Branches(self.bodies)  # type: ignore[return-value]
        return self.bodies[0]  # type: ignore[return-value]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._open:  # an ExitStack unwinding twice, or a block never entered: record it once
            if exc_type is not None:
                return
            raise not_open(f"this {self.description} block", "with s.while_(flag) as body:")
        self._open = False
        owner = self.owner
        owner._inner = None
        unclosed = None
        for body in self.bodies:
            unclosed = end_inner(body, body.kind, exc_type) or unclosed
            body._close(loop=self.kind == "while")
        if unclosed is not None:
            self._roll_back()
            raise unclosed
        if exc_type is not None:
            # The loop is not recorded; the owner stays usable (the scope abandons it if the error
            # escapes), and the graph pins nothing of it.
            self._roll_back()
            return
        for body in self.bodies:
            if body._unentered:
                self._roll_back()
                raise never_entered(next(iter(body._unentered.values())))
        try:
            self._record()
        except BaseException:
            self._roll_back()  # refused as a whole (a freed flag, say): nothing of it stays pinned
            raise

    def _roll_back(self) -> None:
        """Take back what the bodies' ops pinned and the parameter names they brought."""
        assert self._mark is not None  # entered
        root, pins, params = self._mark
        root._pin.roll_back(pins)
        for name in list(root._params)[params:]:
            del root._params[name]

    def _record(self) -> None:
        """Record the whole loop or branch into its owner as one ControlNode."""
        owner = self.owner
        op: ControlNode
        if self.kind == "while":
            counter = None
            if self.max_iterations is not None:
                # The GPU's iteration count and overrun word (see sg_condition); the host counts in Python.
                counter = self.flag.device.zeros((2,), int32, name=f"loop_count@{self.where[1]}")
            op = While(self.flag, self.bodies[0], self.max_iterations, counter, self.location)
        else:
            op = If(self.flag, self.bodies[0], self.bodies[1] if len(self.bodies) > 1 else None, self.location)
        if isinstance(owner, Scope):
            start = len(owner._nodes)
            owner.record(op)
            for node in owner._nodes[start:]:  # the loop node, and a join the tracker put before it
                node._where = self.where
        else:
            owner.record(op)._where = self.where


def _check_scope_open(scope: Scope) -> None:
    if scope._state is not _State.OPEN:
        state = "not open yet" if scope._state is _State.NEW else "finished"
        raise ScopeStateError(
            diagnostic(
                f"cannot open a loop or branch in a scope that is {state}",
                [f"the scope was opened at {scope.opened_at}"],
                help="open it inside the `with CudaGraph.scope(stream) as s:` block",
            )
        )
    scope.check_thread()


def _aggregate(own: Sequence[Borrow], ops: Iterable[GraphNode]) -> list[Borrow]:
    """What a loop or branch borrows as a whole: its ``own`` borrows (the read of its flag, a
    loop's counter) and every borrow of the ``ops`` of its bodies (a range written anywhere counts
    as written)."""
    by_range: dict[tuple[int, int], Borrow] = {}
    for b in [*own, *(b for op in ops for b in op.borrows)]:
        key = (b.start, b.end)
        have = by_range.get(key)
        if have is None or (b.mutable and not have.mutable):
            by_range[key] = b
    return list(by_range.values())


class ControlNode(RecordedOnce):
    """A loop or branch as one node of the enclosing graph or body. It borrows what its bodies
    borrow plus a read of ``flag``. Not runnable eagerly: it runs inside a graph."""

    __slots__ = ("bodies", "flag", "own", "where")

    flag: Tensor
    bodies: tuple[Body, ...]
    where: str
    own: list[Borrow]  # what the node itself borrows: its flag, and a bounded loop's counter

    def _init(self, flag: Tensor, bodies: tuple[Body, ...], where: str, extra: Sequence[Borrow] = ()) -> None:
        self.flag = flag
        self.bodies = bodies
        self.where = where
        self.taken = False
        self.own = [Borrow(flag, False, "flag"), *extra]
        self.borrows = _aggregate(self.own, (n.op for b in bodies for n in b.nodes))
        self.device = flag.device

    def replaced(self, flag: Tensor, ops: Mapping[RecordedNode, GraphNode]) -> ControlNode:
        """This loop or branch reading ``flag``, with the body nodes in ``ops`` running their ops
        there (a rebind's plan, before it is made): a copy whose borrows are what it would borrow.
        The bodies are shared; the rebind then gives each body node its op (see ``scopegraph._update``)."""
        new = copy.copy(self)
        new.flag = flag
        new.own = [Borrow(flag, False, "flag"), *self.own[1:]]
        new.borrows = _aggregate(new.own, (ops.get(n, n.op) for b in self.bodies for n in b.nodes))
        return new

    def execute(self, stream: Stream) -> None:
        raise NotAGraphNodeError(
            diagnostic(
                f"cannot run `{self.name}` eagerly: a loop or branch runs only inside a graph",
                [f"it was recorded at {self.where}"],
                help="launch the graph that holds it (graph.launch())",
            )
        )

    def label(self) -> str:
        sizes = " | ".join(str(len(b.nodes)) for b in self.bodies)
        return f"{self.name}({self.flag.name}) [{sizes} nodes]"

    def dot(self, prefix: str, programmatic: bool) -> list[str]:
        """DOT lines drawing this node's bodies as clusters (``prefix`` is the node's own DOT name;
        ``programmatic``: whether the graph's edges between PDL kernels are programmatic)."""
        lines = [f"  {prefix} [shape=diamond];"]
        for body in self.bodies:
            lines += _dot_body(prefix, body, "  ", programmatic)
        return lines


class While(ControlNode):
    """``with s.while_(flag) as body``: runs ``body`` while ``flag`` is non-zero, checked before
    each iteration. ``max_iterations`` bounds it (see the module docstring); ``counter`` is the
    loop's own i32[2] tensor the GPU counts iterations in (None without a bound)."""

    __slots__ = ("body", "counter", "max_iterations")

    def __init__(
        self, flag: Tensor, body: Body, max_iterations: int | None, counter: Tensor | None, where: str
    ) -> None:
        self.body = body
        self.max_iterations = max_iterations
        self.counter = counter
        self._init(flag, (body,), where, [Borrow(counter, True, "loop count")] if counter is not None else [])

    @property
    def name(self) -> str:
        return "while"

    def label(self) -> str:
        bound = f", max {self.max_iterations}" if self.max_iterations is not None else ""
        return f"while({self.flag.name}{bound}) [{len(self.body.nodes)} nodes]"

    def limit_error(self, value: int) -> LoopLimitError:
        return LoopLimitError(
            diagnostic(
                f"the loop `while({self.flag.name})` recorded at {self.where} ran max_iterations={self.max_iterations} "
                f"iterations and `{self.flag.name}` is still non-zero" + (f" ({value})" if value else ""),
                ["the body must eventually write 0 to the flag (a kernel that counts it down or tests convergence)"],
                help="check the op that updates the flag, or raise max_iterations if the loop needs more iterations",
            )
        )


class If(ControlNode):
    """``with s.if_(flag) as then`` (``otherwise`` None) or ``with s.if_else(flag) as (then,
    otherwise)``: runs ``then`` if ``flag`` is non-zero, else ``otherwise``."""

    __slots__ = ("otherwise", "then")

    def __init__(self, flag: Tensor, then: Body, otherwise: Body | None, where: str) -> None:
        self.then = then
        self.otherwise = otherwise
        self._init(flag, (then,) if otherwise is None else (then, otherwise), where)

    @property
    def name(self) -> str:
        return "if" if self.otherwise is None else "if_else"


# -- a recording's nodes, bodies included -------------------------------------------------------


class Level(NamedTuple):
    """One level of a recording: the graph's own nodes, or one body's."""

    start: int  # the slot of its first node
    nodes: tuple[RecordedNode, ...]
    body: Body | None  # None for the graph's own nodes
    where: str  # "" for the graph's own nodes, else e.g. "the loop body of node 3"

    def name(self, index: int) -> str:
        """How messages name node ``index`` of this level."""
        return f"node {index} of {self.where}" if self.where else f"node {index}"


def levels(nodes: Sequence[RecordedNode]) -> tuple[list[RecordedNode], list[Level]]:
    """Every node of a recording, loop and branch bodies included, numbered by *slot*: the graph's
    own nodes first (slot i is node i), then each body's nodes, level by level (breadth first).
    A level's nodes have consecutive slots, and a loop's or branch's slot is smaller than its
    bodies'. The backends number their executables' nodes the same way: graph parameters and
    rebinds update nodes by slot (``Executable.update_node``)."""
    flat = list(nodes)
    found = [Level(0, tuple(nodes), None, "")]
    i = 0
    while i < len(found):
        level = found[i]
        i += 1
        for node in level.nodes:
            op = node.op
            if isinstance(op, ControlNode):
                for body in op.bodies:
                    inner = body.nodes
                    found.append(Level(len(flat), inner, body, f"the {body.kind} of {level.name(node.index)}"))
                    flat.extend(inner)
    return flat, found


# -- the entry points on Scope (registered below: ``_scope`` cannot import this module) --------


class Entry:
    """``Scope.while_``, ``Scope.if_`` and ``Scope.if_else`` delegate here."""

    @staticmethod
    def while_(scope: Scope, flag: Tensor, max_iterations: int | None, where: tuple[str, int]) -> Block[Body]:
        return Block(scope, "while", flag, max_iterations, where)

    @staticmethod
    def if_(scope: Scope, flag: Tensor, where: tuple[str, int]) -> Block[Body]:
        return Block(scope, "if", flag, None, where)

    @staticmethod
    def if_else(scope: Scope, flag: Tensor, where: tuple[str, int]) -> Block[tuple[Body, Body]]:
        return Block(scope, "if_else", flag, None, where)


_scope.control = Entry


# -- pictures --------------------------------------------------------------------------------


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _dot_body(prefix: str, body: Body, indent: str, programmatic: bool) -> list[str]:
    cluster = f"{prefix}_{'else' if body.kind == 'else' else 'then' if body.kind == 'then' else 'body'}"
    lines = [
        f'{indent}subgraph "cluster_{cluster}" {{',
        f'{indent}  label="{_dot_escape(f"{body.kind} of {body.flag.name}")}";',
        f"{indent}  style=rounded;",
    ]
    nodes = body.nodes
    for n in nodes:
        name = f"{cluster}_{n.index}"
        lines.append(f'{indent}  {name} [label="{_dot_escape(f"{n.index}: {n.op.label()}")}"];')
        if isinstance(n.op, ControlNode):
            lines.append(f"{indent}  {name} [shape=diamond];")
            for inner in n.op.bodies:
                lines += _dot_body(name, inner, indent + "  ", programmatic)
    lines.append(f"{indent}}}")
    for n in nodes:
        if not n.deps:  # where the body starts: dotted (dashed is for programmatic edges)
            lines.append(f"{indent}{prefix} -> {cluster}_{n.index} [style=dotted];")
        for d in sorted(n.deps):
            shared = _shared_tensors(nodes[d].op, n.op)
            attrs = [f'label="{_dot_escape(shared)}"'] if shared else []
            if programmatic and d in n.programmatic:  # as the CUDA backend builds the body
                attrs.append("style=dashed")
            label = f" [{', '.join(attrs)}]" if attrs else ""
            lines.append(f"{indent}{cluster}_{d} -> {cluster}_{n.index}{label};")
    return lines


def _shared_tensors(before: GraphNode, after: GraphNode) -> str:
    names: list[str] = []
    for a in after.borrows:
        for b in before.borrows:
            if (a.mutable or b.mutable) and a.overlaps(b) and b.tensor.name not in names:
                names.append(b.tensor.name)
    return ", ".join(names)
