"""Random scopegraph programs for the differential fuzzer (tests/test_fuzz.py) and their runner.

A :class:`Program` is a few f32 allocations with random integer-valued contents, a few foreign
wrappers of parts of them (``sg.Tensor.from_dlpack`` of a view: the same memory seen through a
second tensor), some frozen ranges, and a list of ops over random views of all of these: library
``*_op`` helpers, raw library launches with in-range sizes, ``sg.memcpy`` and ``sg.memset``.
Optionally it ends in one op the ownership rules must refuse with ``BorrowError``:

- ``overlap``: the op's mutable borrow overlaps another borrow of the same op (refused when built);
- ``frozen``: the op writes memory frozen before it was built;
- ``late_freeze``: the op is built first and the memory it writes is frozen afterwards (refused
  when it is run or recorded, or already at ``freeze()`` when the open scope writes that memory).

Every op is kept as the Python expression that builds it, and the runner evaluates exactly that
text, so ``Program.code()`` is a runnable reproducer of what was tested. Each op is also
interpreted by a numpy model (:meth:`OpSpec.apply`), which is the oracle for eager execution and
for every replay; values are small integers, so every comparison is exact, on the GPU too.

:func:`run_program` runs one program on one device:

1. eagerly, op by op, on its own tensors (then the refused op: BorrowError, nothing changed);
2. recorded in a scope on fresh tensors; a program with a refused op must fail there with nothing
   run, nothing pinned and no graph, and is then recorded again without it;
3. the graph's edges must order every pair of ops that touch overlapping elements (one writing):
   a check that fails by itself when the tracker drops an edge;
4. the graph is replayed several times, each time from inputs reset with ``graph.update``, on
   the graph's stream or on another one, and compared with the model after each replay;
5. ``freeze()`` of a random view is refused exactly when the live graph writes that memory, and
   accepted after ``graph.close()``; nothing is pinned afterwards.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]

MAX_ROWS = 8
MAX_1D = 24
MAX_OPS = 12
REPLAYS = 3
VALUE = 8  # initial contents and fill values are integers in [-VALUE, VALUE]
BLOCKS = (32, 64, 256)

# The kernels a raw launch can use, with the kind of each parameter after `out`.
RAW_KERNELS: dict[str, tuple[str, ...]] = {
    "fill": ("value",),
    "add_scalar": ("value",),
    "add": ("tensor", "tensor"),
    "axpy": ("tensor", "alpha"),
}


# -- what a program is made of ------------------------------------------------------------------


@dataclass(frozen=True)
class Alloc:
    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class Alias:
    """``name = sg.Tensor.from_dlpack(source)``: a second tensor over elements start..end of an allocation."""

    name: str
    alloc: int
    start: int
    end: int
    source: str


@dataclass(frozen=True)
class Ref:
    """A tensor expression (``t0[1:3]``, ``a0[2:5]``, ``t1.view((-1,))[4:9]``) and the elements it covers."""

    alloc: int
    start: int
    end: int
    expr: str

    @property
    def size(self) -> int:
        return self.end - self.start

    def head(self, n: int) -> tuple[int, int, int]:
        """The first ``n`` elements, as (alloc, start, end)."""
        return self.alloc, self.start, self.start + n

    def hits(self, other: Ref) -> bool:
        """Overlap in at least one element (empty ranges overlap nothing)."""
        return overlap((self.alloc, self.start, self.end), (other.alloc, other.start, other.end))


def overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] == b[0] and max(a[1], b[1]) < min(a[2], b[2])


@dataclass(frozen=True)
class OpSpec:
    """One op: the expression that builds it, and what the model needs to run it."""

    kind: str  # fill, add_scalar, add, axpy, memcpy, memset, raw_fill, raw_add_scalar, raw_add, raw_axpy
    code: str
    out: Ref
    ins: tuple[Ref, ...]
    n: int  # elements the op touches at the start of each tensor
    value: float  # fill / memset / add_scalar value, or axpy's alpha

    def accesses(self) -> list[tuple[tuple[int, int, int], bool]]:
        """The element ranges the op touches, with whether it writes them."""
        return [(self.out.head(self.n), True)] + [(r.head(self.n), False) for r in self.ins]

    def apply(self, mem: list[NDArray]) -> None:
        """Run the op on the numpy model (flat f32 arrays, one per allocation)."""
        o, n = self.out, self.n
        dst = mem[o.alloc][o.start : o.start + n]
        srcs = [mem[r.alloc][r.start : r.start + n].copy() for r in self.ins]
        base = self.kind.removeprefix("raw_")
        if base in ("fill", "memset"):
            dst[...] = np.float32(self.value)
        elif base == "add_scalar":
            dst += np.float32(self.value)
        elif base == "add":
            dst[...] = srcs[0] + srcs[1]
        elif base == "axpy":
            dst += np.float32(self.value) * srcs[0]
        elif base == "memcpy":
            dst[...] = srcs[0]
        else:
            raise AssertionError(self.kind)


@dataclass(frozen=True)
class Refusal:
    """The op that must be refused with BorrowError, and (late_freeze) what is frozen after building it."""

    kind: str  # overlap, frozen, late_freeze
    op: OpSpec
    freeze: Ref | None = None


@dataclass(frozen=True)
class Program:
    allocs: tuple[Alloc, ...]
    seed: int
    aliases: tuple[Alias, ...]
    frozen: tuple[Ref, ...]
    ops: tuple[OpSpec, ...]
    refusal: Refusal | None
    launch_on_other: tuple[bool, ...]  # per replay: launch on a second stream instead of graph.stream
    final_freeze: Ref

    def initial(self) -> list[NDArray]:
        """Each allocation's initial contents, flat."""
        rng = np.random.default_rng(self.seed)
        return [rng.integers(-VALUE, VALUE + 1, a.size).astype(np.float32) for a in self.allocs]

    def model(self, ops: Sequence[OpSpec] | None = None) -> list[NDArray]:
        mem = self.initial()
        for op in self.ops if ops is None else ops:
            op.apply(mem)
        return mem

    def late_freeze_refused_in_scope(self) -> bool:
        """Whether the late freeze happens while the open scope already writes that memory."""
        r = self.refusal
        return r is not None and r.freeze is not None and any(op.out.hits(r.freeze) for op in self.ops)

    def final_freeze_refused(self) -> bool:
        """Whether the live graph writes what the final freeze() freezes."""
        return any(op.out.hits(self.final_freeze) for op in self.ops)

    def code(self) -> str:
        """A runnable reproducer."""
        init = self.initial()
        lines = [
            "import numpy as np",
            "import scopegraph as sg",
            "from scopegraph import CudaGraph, library",
            "dev = sg.device(...)  # the backend the test ran on",
            "stream, other = dev.stream(), dev.stream()",
        ]
        for a, values in zip(self.allocs, init, strict=True):
            data = "[" + ", ".join(str(int(v)) for v in values) + "]"
            lines.append(f'{a.name} = dev.from_numpy(np.array({data}, np.float32).reshape({a.shape}), name="{a.name}")')
        for al in self.aliases:
            lines.append(f'{al.name} = sg.Tensor.from_dlpack({al.source}, name="{al.name}")')
        for f in self.frozen:
            lines.append(f"{f.expr}.freeze()")
        lines.append("with CudaGraph.scope(stream) as s:")
        for i, op in enumerate(self.ops):
            lines.append(f"    s.record({op.code})  # node {i}")
        r = self.refusal
        if r is not None:
            if r.kind == "overlap":
                lines.append(f"    {r.op.code}  # must raise BorrowError when built: a mutable borrow overlaps another")
            elif r.kind == "frozen":
                lines.append(f"    s.record({r.op.code})  # must raise BorrowError: it writes frozen memory")
            else:
                assert r.freeze is not None
                lines.append(f"    op = {r.op.code}")
                if self.late_freeze_refused_in_scope():
                    lines.append(f"    {r.freeze.expr}.freeze()  # must raise BorrowError: the open scope writes it")
                else:
                    lines.append(f"    {r.freeze.expr}.freeze()")
                    lines.append("    s.record(op)  # must raise BorrowError: it writes frozen memory")
            lines.append("# ... then the same scope again without the refused op:")
        lines.append("graph = s.graph")
        lines.append(f"# replayed {len(self.launch_on_other)} times, each from the initial contents (graph.update):")
        for other in self.launch_on_other:
            lines.append("graph.launch(stream=other)" if other else "graph.launch()")
        verdict = "must raise BorrowError (the live graph writes it)" if self.final_freeze_refused() else "accepted"
        lines.append(f"{self.final_freeze.expr}.freeze()  # {verdict}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return "\n" + self.code() + "\n"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How hypothesis prints a falsifying example; the test's note() prints the code."""
        refused = self.refusal.kind if self.refusal else "none"
        printer.text(
            f"<Program: {len(self.allocs)} tensors, {len(self.ops)} ops, refused op: {refused}; code in the note below>"
        )

    def features(self) -> Counter[str]:
        """What this program exercises, for the coverage figures of the fuzz run."""
        c: Counter[str] = Counter(op.kind for op in self.ops)
        c["programs"] += 1
        c["ops"] += len(self.ops)
        c["refused:" + (self.refusal.kind if self.refusal else "none")] += 1
        all_ops = list(self.ops) + ([self.refusal.op] if self.refusal else [])
        exprs = [r.expr for op in all_ops for r in (op.out, *op.ins)]
        c["via alias"] += sum(e.startswith("a") for e in exprs)
        c["empty ops"] += sum(op.n == 0 for op in self.ops)
        c["aliases"] += len(self.aliases)
        c["frozen ranges"] += len(self.frozen)
        c["other-stream launches"] += sum(self.launch_on_other)
        c["final freeze refused"] += self.final_freeze_refused()
        c["dependent pairs"] += len(conflicting_pairs(self.ops))
        return c


def conflicting_pairs(ops: Sequence[OpSpec]) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, that touch a common element with at least one of them writing it."""
    pairs = []
    acc = [op.accesses() for op in ops]
    for j in range(len(ops)):
        for i in range(j):
            if any((wi or wj) and overlap(ri, rj) for ri, wi in acc[i] for rj, wj in acc[j]):
                pairs.append((i, j))
    return pairs


# -- generation ---------------------------------------------------------------------------------


class _Space:
    """The allocations, aliases and frozen ranges of a program being drawn; draws views of them."""

    def __init__(self, allocs: list[Alloc]) -> None:
        self.allocs = allocs
        self.aliases: list[Alias] = []
        self.frozen: list[Ref] = []

    @property
    def max_size(self) -> int:
        return max(a.size for a in self.allocs)

    def forms(self, k: int, s: int, e: int, aliases: bool = True) -> list[str]:
        """Expressions for elements s..e of allocation k, simplest first."""
        a = self.allocs[k]
        name, out = a.name, []
        if s == 0 and e == a.size:
            out.append(name)
        if not aliases:  # the source of an alias: 1-D, so that the alias indexes elements
            return (
                [f for f in out if len(a.shape) == 1]
                + [f"{name}.view((-1,))[{s}:{e}]"]
                + (
                    [f"{name}[{s // a.shape[1]}]"]
                    if len(a.shape) == 2 and s % a.shape[1] == 0 and e - s == a.shape[1]
                    else []
                )
            )
        if len(a.shape) == 1:
            out.append(f"{name}[{s}:{e}]")
        else:
            cols = a.shape[1]
            if s % cols == 0 and e % cols == 0:
                if e - s == cols:
                    out.append(f"{name}[{s // cols}]")
                out.append(f"{name}[{s // cols}:{e // cols}]")
                if e > s:
                    out.append(f"{name}[{s // cols}:{e // cols}].view((-1,))")
            out.append(f"{name}.view((-1,))[{s}:{e}]")
            if e - s >= 2 and (e - s) % 2 == 0:
                out.append(f"{name}.view((-1,))[{s}:{e}].view((2, {(e - s) // 2}))")
        if aliases:
            for al in self.aliases:
                if al.alloc == k and al.start <= s and e <= al.end:
                    out.append(al.name if (s, e) == (al.start, al.end) else f"{al.name}[{s - al.start}:{e - al.start}]")
        return out

    def ref(
        self,
        draw: st.DrawFn,
        n: int,
        avoid: Sequence[Ref] = (),
        writable: bool = False,
        touching: Ref | None = None,
        aliases: bool = True,
    ) -> Ref | None:
        """A view of ``n`` elements, not overlapping ``avoid`` (nor frozen ranges if ``writable``),
        overlapping ``touching`` if given; None when there is no such view."""
        cands: list[Ref] = []
        for k, a in enumerate(self.allocs):
            for s in range(a.size - n + 1):
                r = Ref(k, s, s + n, "")
                if any(r.hits(x) for x in avoid):
                    continue
                if writable and any(r.hits(f) for f in self.frozen):
                    continue
                if touching is not None and not r.hits(touching):
                    continue
                cands.append(r)
        if not cands:
            return None
        r = cands[draw(st.integers(0, len(cands) - 1))]
        expr = draw(st.sampled_from(self.forms(r.alloc, r.start, r.end, aliases)))
        return Ref(r.alloc, r.start, r.end, expr)


def _size(draw: st.DrawFn, sp: _Space, least: int = 0) -> int:
    """An element count: mostly small, so that several views fit in one allocation."""
    top = sp.max_size
    small = st.integers(1, min(top, 6))
    return draw(st.one_of(small, small, st.integers(least, top)))


def _value(draw: st.DrawFn) -> float:
    return float(draw(st.integers(-VALUE, VALUE)))


def _alpha(draw: st.DrawFn) -> float:
    return float(draw(st.sampled_from([1, -1, 2, -2, 0])))


def _helper_op(kind: str, out: Ref, ins: Sequence[Ref], value: float) -> OpSpec:
    """A library *_op helper, sg.memcpy or sg.memset over whole tensors."""
    o = out.expr
    code = {
        "fill": lambda: f"library.fill_op({o}.mut(), {value!r})",
        "add_scalar": lambda: f"library.add_scalar_op({o}.mut(), {value!r})",
        "add": lambda: f"library.add_op({o}.mut(), {ins[0].expr}, {ins[1].expr})",
        "axpy": lambda: f"library.axpy_op({o}.mut(), {ins[0].expr}, {value!r})",
        "memcpy": lambda: f"sg.memcpy({o}.mut(), {ins[0].expr})",
        "memset": lambda: f"sg.memset({o}.mut(), {value!r})",
    }[kind]()
    return OpSpec(kind, code, out, tuple(ins), out.size, value)


def _raw_op(draw: st.DrawFn, name: str, out: Ref, ins: Sequence[Ref], n: int, value: float) -> OpSpec:
    block = draw(st.sampled_from(BLOCKS))
    grid = max(1, -(-n // block)) + draw(st.integers(0, 1))
    args = [f"{out.expr}.mut()"]
    it = iter(ins)
    for kind in RAW_KERNELS[name]:
        args.append(next(it).expr if kind == "tensor" else repr(value))
    args.append(str(n))
    code = f"library.{name}[{grid}, {block}]({', '.join(args)})"
    return OpSpec("raw_" + name, code, out, tuple(ins), n, value)


def _valid_op(draw: st.DrawFn, sp: _Space) -> OpSpec | None:
    kind = draw(st.sampled_from(["add", "memcpy", "fill", "axpy", "raw", "add_scalar", "memset", "raw"]))
    if kind == "raw":
        name = draw(st.sampled_from(sorted(RAW_KERNELS)))
        out = sp.ref(draw, _size(draw, sp), writable=True)
        if out is None:
            return None
        ins: list[Ref] = []
        for p in RAW_KERNELS[name]:
            if p == "tensor":
                r = sp.ref(draw, _size(draw, sp), avoid=[out])
                if r is None:
                    return None
                ins.append(r)
        most = min([out.size] + [r.size for r in ins])
        n = draw(st.one_of(st.just(most), st.integers(0, most)))
        value = _alpha(draw) if name == "axpy" else _value(draw)
        return _raw_op(draw, name, out, ins, n, value)
    n = _size(draw, sp)
    out = sp.ref(draw, n, writable=True)
    if out is None:
        return None
    ins = []
    for _ in range({"add": 2, "axpy": 1, "memcpy": 1}.get(kind, 0)):
        r = sp.ref(draw, n, avoid=[out])
        if r is None:
            return None
        ins.append(r)
    return _helper_op(kind, out, ins, _alpha(draw) if kind == "axpy" else _value(draw))


def _overlap_op(draw: st.DrawFn, sp: _Space) -> OpSpec | None:
    """An op whose mutable borrow overlaps one of its shared borrows."""
    kind = draw(st.sampled_from(["memcpy", "add", "axpy", "raw_add"]))
    n = _size(draw, sp, 1)
    out = sp.ref(draw, n, writable=True)
    if out is None:
        return None
    bad = sp.ref(draw, n, touching=out)
    if bad is None:
        return None
    if kind in ("add", "raw_add"):
        other = sp.ref(draw, n, avoid=[out])
        if other is None:
            return None
        ins = [bad, other] if draw(st.booleans()) else [other, bad]
    else:
        ins = [bad]
    if kind == "raw_add":
        return _raw_op(draw, "add", out, ins, n, 0.0)
    return _helper_op(kind, out, ins, _alpha(draw) if kind == "axpy" else _value(draw))


def _writing_op(draw: st.DrawFn, sp: _Space, out: Ref) -> OpSpec | None:
    """An op that writes ``out`` (and reads nothing that overlaps it)."""
    kind = draw(st.sampled_from(["memset", "fill", "add_scalar", "memcpy", "raw_fill"]))
    if kind == "memcpy":
        src = sp.ref(draw, out.size, avoid=[out])
        if src is None:
            return None
        return _helper_op(kind, out, [src], 0.0)
    if kind == "raw_fill":
        return _raw_op(draw, "fill", out, [], draw(st.integers(1, out.size)), _value(draw))
    return _helper_op(kind, out, [], _value(draw))


@st.composite
def programs(draw: st.DrawFn, max_ops: int = MAX_OPS, replays: int = REPLAYS) -> Program:
    """Random programs; about one in three ends with an op that must be refused."""
    allocs = []
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            shape: tuple[int, ...] = (draw(st.integers(1, MAX_1D)),)
        else:
            shape = (draw(st.integers(1, MAX_ROWS)), draw(st.sampled_from([1, 2, 4])))
        allocs.append(Alloc(f"t{i}", shape))
    sp = _Space(allocs)
    seed = draw(st.integers(0, 2**16 - 1))
    for j in range(draw(st.integers(0, 2))):
        k = draw(st.integers(0, len(allocs) - 1))
        size = allocs[k].size
        s = draw(st.integers(0, size - 1))
        e = draw(st.integers(s + 1, size))
        source = draw(st.sampled_from(sp.forms(k, s, e, aliases=False)))
        sp.aliases.append(Alias(f"a{j}", k, s, e, source))
    refusal_kind = draw(st.sampled_from(["none", "none", "overlap", "frozen", "late_freeze"]))
    for _ in range(draw(st.integers(1 if refusal_kind == "frozen" else 0, 2))):
        f = sp.ref(draw, draw(st.integers(1, max(1, sp.max_size // 4))))
        if f is not None:
            sp.frozen.append(f)
    ops: list[OpSpec] = []
    length = draw(st.one_of(st.integers(0, max_ops), st.integers(max_ops // 2, max_ops)))
    for _ in range(2 * length):  # some draws find no view that fits (frozen memory, sizes)
        if len(ops) == length:
            break
        op = _valid_op(draw, sp)
        if op is not None:
            ops.append(op)
    refusal = None
    if refusal_kind == "overlap":
        op = _overlap_op(draw, sp)
        refusal = None if op is None else Refusal("overlap", op)
    elif refusal_kind == "frozen" and sp.frozen:
        target = draw(st.sampled_from(sp.frozen))
        out = sp.ref(draw, draw(st.integers(1, target.size)), touching=target)
        op = None if out is None else _writing_op(draw, sp, out)
        refusal = None if op is None else Refusal("frozen", op)
    elif refusal_kind == "late_freeze":
        out = sp.ref(draw, _size(draw, sp, 1), writable=True)
        op = None if out is None else _writing_op(draw, sp, out)
        if out is not None and op is not None:
            late = sp.ref(draw, _size(draw, sp, 1), touching=out)
            refusal = None if late is None else Refusal("late_freeze", op, late)
    final = sp.ref(draw, _size(draw, sp))
    assert final is not None  # n ranges over sizes that fit the largest allocation
    launch_on_other = tuple(draw(st.booleans()) for _ in range(replays))
    return Program(
        tuple(allocs), seed, tuple(sp.aliases), tuple(sp.frozen), tuple(ops), refusal, launch_on_other, final
    )


# -- running ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _compiled(code: str, mode: str) -> CodeType:
    return compile(code, "<fuzz program>", mode)


@dataclass
class TensorSet:
    """One copy of a program's tensors, with the names the program's code uses."""

    program: Program
    device: sg.Device
    tensors: list[sg.Tensor] = field(default_factory=list)
    aliases: list[sg.Tensor] = field(default_factory=list)
    frozen: list[Ref] = field(default_factory=list)
    ns: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ns.update(sg=sg, library=library, np=np)
        for a, values in zip(self.program.allocs, self.program.initial(), strict=True):
            t = self.device.from_numpy(values.reshape(a.shape), name=a.name)
            self.tensors.append(t)
            self.ns[a.name] = t
        for al in self.program.aliases:
            alias = sg.Tensor.from_dlpack(self.eval(al.source), name=al.name)
            self.aliases.append(alias)
            self.ns[al.name] = alias
        for f in self.program.frozen:
            self.freeze(f)

    def eval(self, code: str) -> Any:
        return eval(_compiled(code, "eval"), self.ns)

    def op(self, spec: OpSpec) -> sg.GraphNode:
        node = self.eval(spec.code)
        assert isinstance(node, sg.GraphNode)
        return node

    def freeze(self, ref: Ref) -> None:
        self.eval(ref.expr).freeze()
        self.frozen.append(ref)

    def read(self) -> list[NDArray]:
        return [t.numpy().reshape(-1) for t in self.tensors]

    def pinned(self) -> list[str]:
        return [t.name for t in self.tensors + self.aliases if t.allocation.pins]

    def free(self) -> None:
        """Drop the foreign wrappers, then free the tensors. (Freeing a tensor while a wrapper of
        it lives leaves the wrapper dangling; that is tested elsewhere, not by the fuzzer.)"""
        self.aliases.clear()
        self.ns.clear()
        for t in self.tensors:
            t.free()


def assert_memory(where: str, got: list[NDArray], want: list[NDArray], program: Program) -> None:
    for a, g, w in zip(program.allocs, got, want, strict=True):
        if not np.array_equal(g, w):
            bad = np.flatnonzero(g != w)
            raise AssertionError(
                f"{where}: `{a.name}` differs from the model at elements {bad.tolist()}\n"
                f"  got  {g.tolist()}\n  want {w.tolist()}"
            )


def assert_edges_order_conflicts(
    program: Program, nodes: Sequence[sg.RecordedNode], edges: list[tuple[int, int]]
) -> None:
    """Every pair of ops that touch a common element, one writing it, is ordered by the graph's edges."""
    succ: dict[int, list[int]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)

    @functools.cache
    def reach(a: int) -> frozenset[int]:
        out: set[int] = set()
        for b in succ.get(a, ()):
            out.add(b)
            out |= reach(b)
        return frozenset(out)

    for i, j in conflicting_pairs(program.ops):
        if nodes[j].index not in reach(nodes[i].index):
            raise AssertionError(
                f"missing dependency: node {j} ({program.ops[j].code}) must run after node {i} "
                f"({program.ops[i].code}); edges: {sorted(edges)}"
            )


def _reset_segments(program: Program, frozen: Sequence[Ref]) -> list[tuple[int, int, int]]:
    """The element ranges (alloc, start, end) that are not frozen: what a reset may rewrite."""
    out = []
    for k, a in enumerate(program.allocs):
        covered = np.zeros(a.size, bool)
        for f in frozen:
            if f.alloc == k:
                covered[f.start : f.end] = True
        s = 0
        while s < a.size:
            if covered[s]:
                s += 1
                continue
            e = s
            while e < a.size and not covered[e]:
                e += 1
            out.append((k, s, e))
            s = e
    return out


def _attempt_refused(
    ts: TensorSet, program: Program, submit: Callable[[sg.GraphNode], object], steps: list[str]
) -> None:
    """Build the program's refused op, freeze (late_freeze) and submit it (run or record). It must
    raise BorrowError; ``steps`` ends with the step that raised."""
    r = program.refusal
    assert r is not None
    steps.append("build")
    op = ts.op(r.op)
    if r.freeze is not None:
        steps.append("freeze")
        ts.freeze(r.freeze)
    steps.append("submit")
    submit(op)
    steps.append("accepted")


def _expect_refusal(
    info: pytest.ExceptionInfo[sg.BorrowError], program: Program, steps: list[str], want: set[str]
) -> None:
    r = program.refusal
    assert r is not None
    assert steps[-1] in want, f"{r.kind}: BorrowError raised at step {steps[-1]!r}, expected at {sorted(want)}"
    assert "help:" in str(info.value), f"BorrowError without a help line: {info.value}"


def run_program(device: sg.Device, stream: sg.Stream, other: sg.Stream, program: Program) -> None:
    prefix_model = program.model()
    initial = program.initial()
    r = program.refusal

    # 1. Eagerly, op by op.
    eager = TensorSet(program, device)
    for spec in program.ops:
        stream.run(eager.op(spec))
    if r is not None:
        steps: list[str] = []
        with pytest.raises(sg.BorrowError) as info:
            _attempt_refused(eager, program, stream.run, steps)
        want = {"overlap": {"build"}, "frozen": {"build", "submit"}, "late_freeze": {"submit"}}[r.kind]
        _expect_refusal(info, program, steps, want)
        del info
    stream.sync()
    assert_memory("eager", eager.read(), prefix_model, program)
    assert eager.pinned() == []
    eager.free()

    # 2. Recorded; a refused op fails the scope with nothing run, pinned or built.
    rep = TensorSet(program, device)
    if r is not None:
        steps = []
        with pytest.raises(sg.BorrowError) as info, CudaGraph.scope(stream) as failed:
            for spec in program.ops:
                failed.record(rep.op(spec))
            _attempt_refused(rep, program, failed.record, steps)
        if r.kind == "late_freeze" and program.late_freeze_refused_in_scope():
            want = {"freeze"}
        else:
            want = {"build"} if r.kind == "overlap" else {"build", "submit"}
        _expect_refusal(info, program, steps, want)
        del info
        assert stream.recording is None
        with pytest.raises(sg.ScopeStateError):
            failed.graph
        assert rep.pinned() == [], f"pinned after a failed scope: {rep.pinned()}"
        stream.sync()
        assert_memory("after the failed scope (nothing may run)", rep.read(), initial, program)

    with CudaGraph.scope(stream) as s:
        nodes = [s.record(rep.op(spec)) for spec in program.ops]
    graph = s.graph

    # 3. The graph orders every conflicting pair.
    assert_edges_order_conflicts(program, nodes, graph.edges)

    # 4. Replays from reset inputs, on the graph's stream or another one.
    sources = [device.from_numpy(v) for v in initial]
    segments = _reset_segments(program, rep.frozen)
    for k, on_other in enumerate(program.launch_on_other):
        for a, s0, e0 in segments:
            graph.update(sg.memcpy(rep.tensors[a].view((-1,))[s0:e0].mut(), sources[a][s0:e0]))
        if on_other:
            graph.launch(stream=other)
            other.sync()
        else:
            graph.launch()
            graph.sync()
        assert_memory(
            f"replay {k + 1} (on {'another stream' if on_other else 'graph.stream'})", rep.read(), prefix_model, program
        )

    # 5. freeze() is refused exactly while the live graph writes that memory.
    target = rep.eval(program.final_freeze.expr)
    if program.final_freeze_refused():
        with pytest.raises(sg.BorrowError):
            target.freeze()
        graph.close()
        target.freeze()  # the graph no longer writes it
    else:
        target.freeze()
        graph.close()
    assert rep.pinned() == [], f"pinned after graph.close(): {rep.pinned()}"
    del target, nodes, graph, s
    rep.free()
    for t in sources:
        t.free()
