"""Updating an instantiated graph in place: rebinding its tensors, and the checks and bookkeeping
that keep the ownership rules true when a graph changes without being rebuilt.

``graph.rebind({old: new})`` moves every node argument that lies in ``old``'s bytes to the same
bytes of ``new`` (so views of ``old`` become the same views of ``new``). It is planned in full
before anything changes:

1. ``old`` and ``new`` are live tensors of one dtype, shape and device, the keys do not overlap,
   and the graph uses every key (else SignatureError, or LifetimeError for a freed tensor); an
   argument that straddles ``old``'s edge cannot move and is a SignatureError too.
2. Each node that uses ``old`` is built again with the new tensors, so the in-op rules run again:
   a node whose new arguments alias each other, or that would write frozen memory, is a
   BorrowError; declared sizes (``touches=``) are checked again.
3. Between nodes, the graph's edges were made for the old addresses. Two nodes that now touch
   the same bytes, one of them writing, must already be ordered by the DAG (one an ancestor of
   the other), else the rebind created aliasing the graph cannot see: a BorrowError.

Only then are the executable's nodes updated (node updates on CUDA, new bindings on the host), the
records changed and the pin moved (:func:`repin`). A refusal leaves the graph exactly as it was.

Recording again into a graph (``CudaGraph.scope(stream, into=graph)``) compares the new
recording's :func:`topology` with the graph's: the same node kinds and edges is a whole-graph
update, anything else a new executable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._errors import BorrowError, SignatureError, diagnostic
from ._kernel import KernelLaunch
from ._ops import GraphNode, Join, Memcpy, Memset
from ._tensor import Mut, Tensor

if TYPE_CHECKING:
    from ._allocation import Allocation
    from ._borrow import Borrow
    from ._lifetime import Pin
    from ._scope import RecordedNode


# -- rebind ------------------------------------------------------------------------------


def plan_rebind(graph_id: int, nodes: Sequence[RecordedNode], mapping: Mapping[Tensor, Tensor]) -> dict[int, GraphNode]:
    """The new op of every node that uses a rebound tensor (steps 1 and 2 of the module docstring)."""
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
    for node in nodes:
        moved: dict[int, Tensor] = {}
        for k, b in enumerate(node.op.borrows):
            for m, (old, new, start, end) in enumerate(moves):
                if b.tensor is old or (b.start < end and start < b.end and b.alloc.device is old.device):
                    if not (start <= b.start and b.end <= end):
                        raise SignatureError(
                            diagnostic(
                                f"cannot rebind `{old.name}`: node {node.index} (`{node.op.name}`) "
                                f"uses `{b.tensor.name}`, "
                                "which extends beyond it",
                                [b.describe()],
                                help=f"rebind the tensor `{b.tensor.name}` is a view of, as a whole",
                            )
                        )
                    moved[k] = _moved(b.tensor, old, new, b.start - start)
                    used[m] = True
        if moved:
            changes[node.index] = _rebuilt(graph_id, node, moved)
    for (old, _, _, _), was_used in zip(moves, used, strict=True):
        if not was_used:
            raise SignatureError(
                diagnostic(
                    f"graph #{graph_id} does not use `{old.name}`, so it cannot be rebound",
                    help="rebind a tensor the graph's nodes use (see graph.nodes)",
                )
            )
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


def _rebuilt(graph_id: int, node: RecordedNode, moved: dict[int, Tensor]) -> GraphNode:
    """The node's op built again with some tensors replaced (borrow index -> tensor): the op's own
    checks (aliasing, frozen, sizes) run again."""
    op = node.op
    borrows = op.borrows

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
    raise SignatureError(
        diagnostic(
            f"graph #{graph_id} cannot rebind node {node.index} (`{op.name}`): "
            f"a {type(op).__name__} node cannot be updated in place",
            [f"it uses {', '.join(f'`{t.name}`' for t in moved.values())}"],
            help="record the graph again with the new tensors: CudaGraph.scope(stream, into=graph)",
        )
    )


def check_order(
    graph_id: int, nodes: Sequence[RecordedNode], changes: Mapping[int, GraphNode], ancestors: Sequence[int]
) -> None:
    """Step 3: every pair of nodes that conflicts after the rebind (same bytes, one writes) is
    already ordered by the DAG. ``ancestors[i]`` is the bit set of node i's ancestors."""

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
                                f"rebinding would make nodes {first} and {then} of graph #{graph_id} share memory "
                                "that the graph does not order",
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


# -- pins --------------------------------------------------------------------------------


def repin(pin: Pin, borrows: Iterable[Borrow]) -> None:
    """Make ``pin`` hold exactly what ``borrows`` touch. Allocations no longer used lose the pin (their
    release then waits for the replays so far, as at close); newly used ones gain it, and the next
    replay waits for the eager work already queued on them."""
    held: dict[int, Allocation] = {}
    writes: list[int] = []
    for b in borrows:
        alloc = b.alloc
        if b.mutable and b.start != b.end:
            writes += (b.start, b.end)
        if alloc.id in held:
            continue
        for a in alloc.aliases() if len(alloc.region.members) > 1 else (alloc,):
            held[a.id] = a
    key = id(pin)
    for aid, a in pin.allocations.items():
        if aid not in held:
            a.pins.pop(key, None)
            a.users |= pin.replayed_on
    for aid, a in held.items():
        if aid not in pin.allocations:
            a.pins[key] = pin
            pin.pending |= a.users
    pin.allocations = held
    pin.writes = writes


def all_borrows(nodes: Sequence[RecordedNode]) -> Iterable[Borrow]:
    for node in nodes:
        yield from node.op.borrows


# -- re-recording ------------------------------------------------------------------------


def topology(nodes: Sequence[RecordedNode]) -> tuple[tuple[str, frozenset[int], frozenset[int]], ...] | None:
    """What a whole-graph update needs to match: each node's kind (as the backends build it) and
    edges, programmatic ones apart (scopegraph._pdl). None for a graph with device-side loops or
    branches, which is always instantiated again."""
    shape: list[tuple[str, frozenset[int], frozenset[int]]] = []
    for node in nodes:
        op = node.op
        if type(op) is KernelLaunch:
            kind = "kernel"
        elif isinstance(op, (Memcpy, Memset)):
            kind = ("memcpy" if isinstance(op, Memcpy) else "memset") if op.dst.nbytes else "empty"
        elif isinstance(op, Join):
            kind = "empty"
        elif hasattr(op, "bodies"):  # a ControlNode (scopegraph._control): conditional handles are per definition
            return None
        else:
            kind = type(op).__name__
        shape.append((kind, node.deps, node.programmatic))
    return tuple(shape)
