"""Updating an instantiated graph in place: rebinding its tensors, and the checks and bookkeeping
that keep the ownership rules true when a graph changes without being rebuilt.

``graph.rebind({old: new})`` moves every node argument that lies in ``old``'s bytes to the same
bytes of ``new`` (so views of ``old`` become the same views of ``new``), in loop and branch bodies
too (a loop's or branch's own flag as well). It is planned in full before anything changes:

1. ``old`` and ``new`` are live tensors of one dtype, shape and device, the keys do not overlap,
   and the graph uses every key (else SignatureError, or LifetimeError for a freed tensor); an
   argument that straddles ``old``'s edge cannot move and is a SignatureError too.
2. Each node that uses ``old`` is built again with the new tensors, so the in-op rules run again:
   a node whose new arguments alias each other, or that would write frozen memory, is a
   BorrowError; declared sizes (``touches=``) are checked again. A loop or branch whose bodies
   change borrows, as a whole, what its bodies then borrow.
3. Between nodes, the graph's edges were made for the old addresses. Two nodes of one level (the
   graph's own nodes, or one body's) that now touch the same bytes, one of them writing, must
   already be ordered by that level's DAG (one an ancestor of the other), else the rebind created
   aliasing the graph cannot see: a BorrowError. A body node against the rest of the graph is
   checked as its loop or branch, one node of the level around it. In a loop's body, a node that
   now writes the loop's flag must come before the end-of-iteration condition kernel, which waits
   only for the flag's writers of the recording.

Only then are the executable's nodes updated (node updates on CUDA, new bindings on the host), the
records changed and the pin moved (:func:`scopegraph._lifetime.repin`). A refusal leaves the graph exactly as it was.

Nodes are addressed by *slot* (``scopegraph._control.levels``): the graph's own nodes first, then
the bodies' nodes. Graph parameters (``scopegraph._params``) update nodes the same way
(:func:`update_executable`).

Recording again into a graph (``CudaGraph.scope(stream, into=graph)``) compares the new
recording's :func:`topology` with the graph's: the same node kinds and edges (bodies included)
is a whole-graph update, anything else a new executable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._borrow import Borrow
from ._control import ControlNode, Level, levels
from ._errors import BorrowError, CudaError, SignatureError, diagnostic
from ._kernel import KernelLaunch
from ._ops import GraphNode, Join, Memcpy, Memset
from ._params import ParamTable
from ._pdl import check_programmatic, executable_deps
from ._tensor import Mut, Tensor

if TYPE_CHECKING:
    import numpy as np

    from ._backends._base import Executable
    from ._control import Body
    from ._scope import RecordedNode


class Structure:
    """A recording's nodes, bodies included, by slot (``flat``) and by level, with each level's
    ancestor sets and executable edges, made when a rebind first needs them."""

    def __init__(self, nodes: Sequence[RecordedNode]) -> None:
        self.flat, self.levels = levels(nodes)
        # The slot of the loop or branch each body belongs to.
        self.owner: dict[Body, int] = {}
        for slot, node in enumerate(self.flat):
            if isinstance(node.op, ControlNode):
                for body in node.op.bodies:
                    self.owner[body] = slot
        self._ancestors: dict[int, list[int]] = {}
        self._direct: dict[int, list[frozenset[int]]] = {}

    def ancestors(self, level: Level) -> list[int]:
        found = self._ancestors.get(level.start)
        if found is None:
            found = self._ancestors[level.start] = ancestors(level.nodes)
        return found

    def direct(self, level: Level) -> list[frozenset[int]]:
        """The level's edges as the backends build them (scopegraph._pdl.executable_deps)."""
        found = self._direct.get(level.start)
        if found is None:
            found = self._direct[level.start] = executable_deps(level.nodes)
        return found


# -- rebind ------------------------------------------------------------------------------


def plan_rebind(graph_id: int, structure: Structure, mapping: Mapping[Tensor, Tensor]) -> dict[int, GraphNode]:
    """The new op of every node, by slot, that uses a rebound tensor, and of every loop or branch
    whose bodies do (steps 1 and 2 of the module docstring)."""
    if not isinstance(mapping, Mapping):
        raise SignatureError(
            f"graph.rebind() takes a mapping {{old: new}}, not {type(mapping).__name__}\n"
            "help: e.g. graph.rebind({x: x2})"
        )
    moves: list[tuple[Tensor, Tensor, int, int]] = []  # old, new, old's absolute byte range
    for old, new in mapping.items():
        _check_pair(graph_id, old, new)
        start = old.allocation.address + old.offset
        moves.append((old, new, start, start + old.nbytes))
    for i, (one, _, a0, a1) in enumerate(moves):
        for other, _, b0, b1 in moves[i + 1 :]:
            if one.device is other.device and ((a0 < b1 and b0 < a1) or one is other):
                raise SignatureError(
                    diagnostic(
                        f"graph.rebind() got overlapping tensors to move: `{one.name}` and `{other.name}`",
                        help="move the whole tensor once (its views in the graph move with it)",
                    )
                )
    used = [False] * len(moves)
    changes: dict[int, GraphNode] = {}
    for level in structure.levels:
        for node in level.nodes:
            op = node.op
            # A loop or branch moves its own tensors (its flag); its bodies' nodes move theirs.
            borrows = op.own if isinstance(op, ControlNode) else op.borrows
            moved: dict[int, Tensor] = {}
            for k, b in enumerate(borrows):
                for m, (old, new, start, end) in enumerate(moves):
                    if b.tensor is old or (b.start < end and start < b.end and b.alloc.device is old.device):
                        if not (start <= b.start and b.end <= end):
                            raise SignatureError(
                                diagnostic(
                                    f"cannot rebind `{old.name}`: {level.name(node.index)} (`{op.name}`) "
                                    f"uses `{b.tensor.name}`, which extends beyond it",
                                    [b.describe()],
                                    help=f"rebind the tensor `{b.tensor.name}` is a view of, as a whole",
                                )
                            )
                        moved[k] = _moved(b.tensor, old, new, b.start - start)
                        used[m] = True
            if moved:
                changes[level.start + node.index] = _rebuilt(graph_id, level.name(node.index), op, borrows, moved)
    for (old, _, _, _), was_used in zip(moves, used, strict=True):
        if not was_used:
            raise SignatureError(
                diagnostic(
                    f"graph #{graph_id} does not use `{old.name}`, so it cannot be rebound",
                    help="rebind a tensor the graph's nodes use (see graph.nodes)",
                )
            )
    # Each loop or branch whose bodies change borrows what they will: deepest levels first, so a
    # nested loop's new borrows are known before the loop around it gathers them.
    flat = structure.flat
    for level in reversed(structure.levels):
        end = level.start + len(level.nodes)
        if level.body is None or not any(level.start <= slot < end for slot in changes):
            continue
        owner = structure.owner[level.body]
        control = changes.get(owner, flat[owner].op)
        assert isinstance(control, ControlNode)
        changes[owner] = control.replaced(control.flag, {flat[slot]: op for slot, op in changes.items()})
    return changes


def _check_pair(graph_id: int, old: object, new: object) -> None:
    if not isinstance(old, Tensor) or not isinstance(new, Tensor):
        raise SignatureError(
            f"graph.rebind() maps tensors to tensors, got {type(old).__name__}: {type(new).__name__}\n"
            "help: e.g. graph.rebind({x: x2}) with two sg.Tensors of the same dtype, shape and device"
        )
    old.check_alive()
    new.check_alive()
    if old.dtype != new.dtype or old.shape != new.shape or old.device is not new.device:
        raise SignatureError(
            diagnostic(
                f"cannot rebind `{old.name}` to `{new.name}` in graph #{graph_id}: they differ",
                [
                    f"`{old.name}`: {old.dtype.name}{list(old.shape)} on {old.device}",
                    f"`{new.name}`: {new.dtype.name}{list(new.shape)} on {new.device}",
                ],
                help="rebind to a tensor of the same dtype, shape and device; for other shapes record again "
                "(CudaGraph.scope(stream, into=graph)) or keep one graph per shape (sg.GraphCache)",
            )
        )


def _moved(arg: Tensor, old: Tensor, new: Tensor, delta: int) -> Tensor:
    """``arg`` (within ``old``'s bytes, ``delta`` bytes in) as the same bytes of ``new``."""
    if arg is old or (delta == 0 and arg.nbytes == old.nbytes and arg.dtype == new.dtype and arg.shape == new.shape):
        return new
    name = arg.name
    name = new.name + name[len(old.name) :] if name.startswith(old.name) else f"{new.name}+{delta}B"
    return Tensor(new.allocation, new.offset + delta, arg.shape, arg.dtype, name, new)


def _rebuilt(graph_id: int, name: str, op: GraphNode, borrows: list[Borrow], moved: dict[int, Tensor]) -> GraphNode:
    """``op`` (named ``name``) built again with some of its ``borrows`` moved (index -> new tensor):
    the op's own checks (aliasing, frozen, sizes) run again."""

    def arg(k: int) -> Tensor:
        return moved.get(k, borrows[k].tensor)

    if type(op) is KernelLaunch:
        args: list[Any] = []
        k = 0
        for param, value in zip(op.kernel.params, op.args, strict=True):
            if param.kind == "scalar":
                args.append(value)
                continue
            tensor = arg(k)
            args.append(Mut(tensor) if param.kind == "mut" else tensor)
            k += 1
        return KernelLaunch(op.kernel, op.grid, op.block, op.shmem, tuple(args), {})
    if isinstance(op, Memcpy):
        return Memcpy(Mut(arg(0)), arg(1))
    if isinstance(op, Memset):
        return Memset(Mut(arg(0)), op.value.item())
    old = ", ".join(f"`{borrows[k].tensor.name}`" for k in moved)
    if isinstance(op, ControlNode):
        if set(moved) != {0}:  # besides the flag, a bounded loop's own iteration counter would move
            counter = ", ".join(f"`{borrows[k].tensor.name}`" for k in moved if k != 0)
            raise SignatureError(
                diagnostic(
                    f"graph #{graph_id} cannot rebind {counter}: it is the iteration counter of the loop "
                    f"({name}), which scopegraph made for max_iterations=",
                    help="rebind the tensors the loop's flag and body use; the counter stays the loop's",
                )
            )
        return op.replaced(moved[0], {})
    raise SignatureError(
        diagnostic(
            f"graph #{graph_id} cannot rebind {name} (`{op.name}`): "
            f"a {type(op).__name__} node cannot be updated in place",
            [f"it uses {old}"],
            help="record the graph again with the new tensors: CudaGraph.scope(stream, into=graph)",
        )
    )


def check_rebind(graph_id: int, structure: Structure, changes: Mapping[int, GraphNode]) -> None:
    """Step 3 of the module docstring, level by level: the order of the nodes that now share
    memory, programmatic edges (scopegraph._pdl), and a loop's flag."""
    flat = structure.flat
    for level in structure.levels:
        end = level.start + len(level.nodes)
        local = {slot - level.start: op for slot, op in changes.items() if level.start <= slot < end}
        if not local:
            continue
        found = structure.ancestors(level)
        check_order(graph_id, level.nodes, local, found, level.where)
        try:
            check_programmatic(graph_id, level.nodes, local, found, structure.direct(level))
        except SignatureError as exc:
            if level.where:
                exc.add_note(f"the nodes are in {level.where}")
            raise
        if level.body is not None and level.body.kind == "loop body":
            owner = structure.owner[level.body]
            loop, was = changes.get(owner, flat[owner].op), flat[owner].op
            assert isinstance(loop, ControlNode) and isinstance(was, ControlNode)
            _check_flag_writers(graph_id, level, local, found, loop.flag, loop.flag is not was.flag)


def _check_flag_writers(
    graph_id: int,
    level: Level,
    changes: Mapping[int, GraphNode],
    ancestors: Sequence[int],
    flag: Tensor,
    moved: bool,
) -> None:
    """In a loop's body, whatever writes the loop's flag must be ordered before the condition
    kernel at the end of each iteration: one of the flag's last writers of the recording
    (``condition_deps``) or an ancestor of one. Checked for the changed nodes, and for every node
    when the flag itself moved."""
    assert level.body is not None
    last = level.body.condition_deps
    read = Borrow(flag, False, "flag")
    candidates = range(len(level.nodes)) if moved else sorted(changes)
    for i in candidates:
        op = changes.get(i, level.nodes[i].op)
        if i in last or any((ancestors[d] >> i) & 1 for d in last):
            continue
        for b in op.borrows:
            if b.mutable and b.overlaps(read):
                raise BorrowError(
                    diagnostic(
                        f"rebinding would make {level.name(i)} (`{op.name}`) of graph #{graph_id} write the "
                        f"loop's flag `{flag.name}`, unordered with the check of the flag that ends each iteration",
                        [b.describe(), "the loop's edges were made for the old tensors"],
                        help="rebind to memory the loop does not use as its flag, or record the graph again "
                        "(CudaGraph.scope(stream, into=graph))",
                    )
                )


def check_order(
    graph_id: int,
    nodes: Sequence[RecordedNode],
    changes: Mapping[int, GraphNode],
    ancestors: Sequence[int],
    where: str = "",
) -> None:
    """Step 3 in one level (``nodes``; ``where``: which body, "" for the graph's own nodes): every
    pair of nodes that conflicts after the rebind (same bytes, one writes) is already ordered by
    the level's DAG. ``ancestors[i]`` is the bit set of node i's ancestors."""

    def borrows_of(i: int) -> list[Borrow]:
        op = changes.get(i)
        return (op if op is not None else nodes[i].op).borrows

    by_alloc: dict[int, list[tuple[int, Borrow]]] = {}
    for node in nodes:
        for b in borrows_of(node.index):
            if b.start != b.end:
                by_alloc.setdefault(b.alloc.id, []).append((node.index, b))
    for i, op in changes.items():
        for nb in op.borrows:
            if nb.start == nb.end:
                continue
            for alias in nb.alloc.aliases():
                for j, mb in by_alloc.get(alias.id, ()):
                    if j == i or not (nb.mutable or mb.mutable) or not nb.overlaps(mb):
                        continue
                    first, then = (j, i) if j < i else (i, j)
                    if not (ancestors[then] >> first) & 1:
                        a, b = (mb, nb) if j < i else (nb, mb)
                        raise BorrowError(
                            diagnostic(
                                f"rebinding would make nodes {first} and {then} of "
                                + (f"{where} of " if where else "")
                                + f"graph #{graph_id} share memory that the graph does not order",
                                [
                                    f"node {first} (`{nodes[first].op.name}`): {a.describe()}",
                                    f"node {then} (`{nodes[then].op.name}`): {b.describe()}",
                                    "the graph's edges were made for the old tensors: "
                                    "these two nodes could run at once",
                                ],
                                help="rebind to memory the graph does not otherwise use, or record the graph again "
                                "(CudaGraph.scope(stream, into=graph)) so that its edges follow the new data",
                            )
                        )


def ancestors(nodes: Sequence[RecordedNode]) -> list[int]:
    """Each node's ancestors in the DAG as a bit set (deps always point to earlier nodes)."""
    sets: list[int] = []
    for node in nodes:
        bits = 0
        for d in node.deps:
            bits |= sets[d] | (1 << d)
        sets.append(bits)
    return sets


# -- updating the executable -------------------------------------------------------------


def update_executable(
    exe: Executable,
    flat: Sequence[RecordedNode],
    slots: Iterable[int],
    values: Mapping[str, np.generic],
    before: Mapping[str, np.generic],
    ops: Mapping[int, GraphNode] | None = None,
) -> str:
    """Make the executable's node of each slot in ``slots`` run its new op (``ops[slot]``; without
    ``ops``, the op it records, with new parameter ``values``): all or nothing (on a failure part
    way, what was changed is put back, best effort, with the ops of ``flat`` and the ``before``
    values). Returns what the update was: "nodes", or "whole" when the backend made whole-graph
    updates instead (the CUDA backend does for nodes in loop and branch bodies if the driver refuses
    node updates there)."""
    wholes = exe.whole_updates
    done: list[int] = []
    try:
        for slot in slots:
            done.append(slot)  # the failing one too: a refused whole-graph update left its change in the definition
            exe.update_node(slot, flat[slot].op if ops is None else ops[slot], values)
    except BaseException:
        for slot in done:
            try:
                exe.update_node(slot, flat[slot].op, before)
            except Exception:
                continue  # the first error is the one to report
        raise
    return "whole" if exe.whole_updates != wholes else "nodes"


def commit(flat: Sequence[RecordedNode], changes: Mapping[int, GraphNode]) -> None:
    """The records take the ops the executable now runs: the user's handles show them."""
    for slot, op in changes.items():
        flat[slot].op = op
        if isinstance(op, ControlNode):
            for body in op.bodies:
                body.flag = op.flag


# -- pins --------------------------------------------------------------------------------


def all_borrows(nodes: Sequence[RecordedNode]) -> Iterable[Borrow]:
    for node in nodes:
        yield from node.op.borrows


# -- re-recording ------------------------------------------------------------------------


Shape = tuple[tuple[object, frozenset[int], frozenset[int]], ...]  # a node's (kind, edges, programmatic edges)


def topology(nodes: Sequence[RecordedNode], programmatic: bool) -> Shape | None:
    """What taking a new recording in place needs to match: each node's kind (as the backends build
    it) and edges, programmatic ones apart (scopegraph._pdl) where the backend makes them
    (``programmatic``: on the host and below sm_90 the pdl flag changes nothing), and each loop's
    or branch's kind, bound and bodies. None for a recording that is always instantiated again: one
    with loops or branches goes in by node updates (:func:`take_in_place`), which a captured
    region's or a collective's child graph cannot take."""
    if any(isinstance(n.op, ControlNode) for n in nodes):
        updatable = (Memcpy, Memset, Join, ControlNode)
        if not all(type(n.op) is KernelLaunch or isinstance(n.op, updatable) for n in levels(nodes)[0]):
            return None
    return _shape(nodes, programmatic)


def _shape(nodes: Sequence[RecordedNode], programmatic: bool) -> Shape:
    shape = []
    for node in nodes:
        op = node.op
        kind: object
        if type(op) is KernelLaunch:
            kind = "kernel"
        elif isinstance(op, (Memcpy, Memset)):
            kind = ("memcpy" if isinstance(op, Memcpy) else "memset") if op.dst.nbytes else "empty"
        elif isinstance(op, Join):
            kind = "empty"
        elif isinstance(op, ControlNode):  # its bodies, and where a loop's body sets the condition again
            bounded = getattr(op, "max_iterations", None) is not None
            kind = (op.name, bounded, tuple((_shape(b.nodes, programmatic), b.condition_deps) for b in op.bodies))
        else:
            kind = type(op).__name__
        shape.append((kind, node.deps, node.programmatic if programmatic else frozenset()))
    return tuple(shape)


def take_in_place(exe: Executable, old: ParamTable, nodes: Sequence[RecordedNode]) -> bool:
    """Make ``exe`` run ``nodes``, a recording of its topology (the caller compared them), with its
    parameters at their defaults; ``old`` is the graph's table (its recording and current values).
    False when the backend refuses, with ``exe`` as it was: the caller instantiates the recording.
    A recording with loops or branches goes in by node updates, slot by slot and all or nothing
    (:func:`update_executable`): a new definition would bring new conditional handles, which the
    executable's condition kernels do not name."""
    if not any(isinstance(n.op, ControlNode) for n in nodes):
        return exe.update_whole(nodes)
    flat, _ = levels(nodes)
    ops = {slot: rec.op for slot, rec in enumerate(flat)}
    try:
        update_executable(exe, old.flat, ops, ParamTable(flat).values, old.values, ops)
    except CudaError:
        return False
    return True
