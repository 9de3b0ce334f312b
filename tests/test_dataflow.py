"""The DAG built from read and write sets, in dataflow and program order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._borrow import Borrow
from scopegraph._tracker import DataflowTracker, ProgramOrderTracker, without_implied


def test_independent_ops_get_no_edge_and_dependent_ones_do(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    a, b, c, d = (sg_device.zeros((32,), name=n) for n in "abcd")
    with CudaGraph.scope(sg_stream) as s:
        n0 = s.record(library.fill_op(a.mut(), 1.0))
        n1 = s.record(library.fill_op(b.mut(), 2.0))  # independent of n0
        n2 = s.record(library.add_op(c.mut(), a, b))  # reads a and b: RAW on n0, n1
        n3 = s.record(library.fill_op(a.mut(), 5.0))  # WAR on n2; its WAW on n0 is implied through n2
        n4 = s.record(library.add_scalar_op(d.mut(), 1.0))  # independent of everything
        n5 = s.record(library.add_op(b.mut(), c, a))  # RAW on n2, n3; WAR on n2 for b
    assert (n0.deps, n1.deps, n4.deps) == (frozenset(), frozenset(), frozenset())
    assert n2.deps == {0, 1}
    assert n3.deps == {2}
    assert n5.deps == {2, 3}
    with s.graph as g:
        assert g.edges == [(0, 2), (1, 2), (2, 3), (2, 5), (3, 5)]
        g.launch()
        g.sync()
        np.testing.assert_array_equal(c.numpy(), 3.0)
        np.testing.assert_array_equal(b.numpy(), 8.0)
        dot = g.to_dot()
        assert 'n2 -> n3 [label="a"' in dot and "fill(mut a)" in dot  # ", style=dashed" follows on sm_90+ (PDL)


def test_program_order_chains_everything(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    xs = [sg_device.zeros((8,), name=f"x{i}") for i in range(4)]
    with CudaGraph.scope(sg_stream, order="program") as s:
        for x in xs:
            s.record(library.fill_op(x.mut(), 1.0))
    with s.graph as g:
        assert g.edges == [(0, 1), (1, 2), (2, 3)]
        assert g.order == "program"


def test_views_order_by_overlap(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((4, 8), name="x")
    y = sg_device.zeros((8,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        w0 = s.record(library.fill_op(x[0].mut(), 1.0))
        w1 = s.record(library.fill_op(x[1].mut(), 2.0))  # disjoint rows: parallel
        r = s.record(library.add_op(y.mut(), x[0], x[1]))
        whole = s.record(sg.memset(x.mut(), 0.0))  # WAR on r only
    assert w1.deps == frozenset() and r.deps == {w0.index, w1.index} and whole.deps == {r.index}
    s.graph.close()


def _closure(deps: list[frozenset[int]]) -> list[set[int]]:
    reach: list[set[int]] = []
    for d in deps:
        r = set(d)
        for p in d:
            r |= reach[p]
        reach.append(r)
    return reach


Program = list[list[Borrow] | None]  # None: a join node the tracker inserted


def _conflict(first: list[Borrow], second: list[Borrow]) -> bool:
    return any((a.mutable or b.mutable) and a.overlaps(b) for a in first for b in second)


def dag_violations(ops: Program, deps: list[frozenset[int]]) -> list[str]:
    """Both directions of the dataflow contract, for ops in record order with their predecessors:

    - every pair of ops that touch a common byte, one of them writing, is ordered in the DAG;
    - every edge stems from a conflict: an edge between two ops joins conflicting ops, and an
      edge out of a join node leads to an op that conflicts with every op the join waits for
      (joins are where many readers meet one writer; see scopegraph/_tracker.py).
    """
    problems = []
    reach = _closure(deps)
    real = [i for i, op in enumerate(ops) if op is not None]
    for j, i in itertools.combinations(real, 2):
        if _conflict(ops[j], ops[i]) and j not in reach[i]:  # type: ignore[arg-type]
            problems.append(f"op {i} conflicts with op {j} but is not ordered after it")
    for n, preds in enumerate(deps):
        if ops[n] is None:
            continue
        for d in preds:
            sources = [d] if ops[d] is not None else sorted(deps[d])
            for src in sources:
                if ops[src] is None or not _conflict(ops[src], ops[n]):  # type: ignore[arg-type]
                    problems.append(f"edge {d} -> {n} does not stem from a conflict (through {src})")
    return problems


def _run_tracker(
    tracker_type: type[DataflowTracker] | type[ProgramOrderTracker], program: list[list[Borrow]]
) -> tuple[Program, list[frozenset[int]]]:
    ops: Program = []
    deps: list[frozenset[int]] = []

    def add_join(index: int, preds: frozenset[int]) -> None:
        assert index == len(ops)
        ops.append(None)
        deps.append(preds)

    tracker = tracker_type(add_join)
    for borrows in program:
        node_deps = tracker.add(borrows)
        ops.append(borrows)
        deps.append(node_deps)
        assert all(d < len(deps) - 1 for d in node_deps)
        if isinstance(tracker, DataflowTracker):
            assert _segments_overlapping(tracker) == []
    return ops, deps


def _segments_overlapping(tracker: DataflowTracker) -> list[tuple[int, int]]:
    """Starts of neighbouring segments that overlap, in the sorted map and the first touches'
    dict together (the tracker's state must be disjoint ranges, each in one of them)."""
    lone, ordered = tracker._lone, tracker._segments
    spans = sorted([(start, seg.end) for start, seg in lone.items()] + [(s, seg.end) for s, seg in ordered.items()])
    both = set(lone) & set(ordered)
    return [(a, b) for (a, a_end), (b, _) in itertools.pairwise(spans) if a_end > b] + [(s, s) for s in both]


ranges = st.tuples(st.integers(0, 2), st.integers(0, 15), st.integers(0, 8), st.booleans())


def _borrows(allocs: list[sg.Tensor], accesses: list[tuple[int, int, int, bool]]) -> list[Borrow]:
    return [Borrow(allocs[a][s : s + n], mut, f"p{i}") for i, (a, s, n, mut) in enumerate(accesses)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(ranges, min_size=1, max_size=3), min_size=1, max_size=40))
def test_dataflow_edges_are_exactly_the_conflicts(program: list[list[tuple[int, int, int, bool]]]) -> None:
    """Property, both directions: every conflicting pair of ops is ordered, and every edge stems
    from a conflict. Programs over three allocations, with empty ranges and many readers."""
    dev = sg.device("host")
    allocs = [dev.zeros((24,), sg.u8, name=f"a{i}") for i in range(3)]
    ops, deps = _run_tracker(DataflowTracker, [_borrows(allocs, accesses) for accesses in program])
    assert dag_violations(ops, deps) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ranges, min_size=1, max_size=3), min_size=1, max_size=30))
def test_dataflow_edges_are_exactly_the_conflicts_between_wrappers_of_one_memory(
    program: list[list[tuple[int, int, int, bool]]],
) -> None:
    """The same property over three wrappers of one numpy buffer, two of them overlapping: the
    tracker's first touch of an allocation (no lookup: nothing recorded can lie in its bytes) must
    not apply to memory that another wrapper shares."""
    memory = np.zeros(64, np.uint8)
    allocs = [sg.Tensor.from_dlpack(memory[a:b], name=f"w{a}") for a, b in ((0, 24), (12, 36), (40, 64))]
    ops, deps = _run_tracker(DataflowTracker, [_borrows(allocs, accesses) for accesses in program])
    assert dag_violations(ops, deps) == []


def test_a_first_touch_through_a_second_wrapper_waits_for_the_first() -> None:
    memory = np.zeros(16, np.float32)
    first, second = sg.Tensor.from_dlpack(memory, name="first"), sg.Tensor.from_dlpack(memory[8:], name="second")
    out = sg.device("host").zeros((8,), name="out")
    with CudaGraph.scope(sg.device("host").stream()) as s:
        write = s.record(library.fill_op(first.mut(), 2.0))
        read = s.record(sg.memcpy(out.mut(), second))
    assert read.deps == {write.index}
    with s.graph as g:
        g.launch()
        g.sync()
    np.testing.assert_array_equal(out.numpy(), 2.0)


def test_the_property_check_fails_for_wrong_trackers() -> None:
    """The property above can fail: the program-order tracker adds edges that stem from no
    conflict, and a tracker that returns no edges leaves conflicts unordered."""
    dev = sg.device("host")
    x, y = dev.zeros((8,), sg.u8, name="x"), dev.zeros((8,), sg.u8, name="y")
    program = [
        _borrows([x, y], [(0, 0, 8, True)]),
        _borrows([x, y], [(1, 0, 8, True)]),
        _borrows([x, y], [(0, 0, 8, False)]),
    ]
    ops, deps = _run_tracker(ProgramOrderTracker, program)
    assert dag_violations(ops, deps) == [
        "edge 0 -> 1 does not stem from a conflict (through 0)",
        "edge 1 -> 2 does not stem from a conflict (through 1)",
    ]
    assert dag_violations(ops, [frozenset()] * 3) == ["op 2 conflicts with op 0 but is not ordered after it"]
    ops, deps = _run_tracker(DataflowTracker, program)
    assert dag_violations(ops, deps) == [] and deps == [frozenset(), frozenset(), frozenset({0})]


def test_a_write_after_many_readers_waits_for_each_of_them(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """DESIGN section 4: a write depends on the last readers of what it writes, literally (no join
    node in graph.nodes), however many there are; a second write after those readers (another
    piece of the memory they read) waits for one join that stands for them."""
    x = sg_device.zeros((2, 4), name="x")
    outs = sg_device.zeros((100, 8), name="outs")
    with CudaGraph.scope(sg_stream) as s:
        reads = [s.record(sg.memcpy(outs[i].mut(), x.view((8,)))) for i in range(100)]
        first = s.record(sg.memset(x[0].mut(), 1.0))
    with s.graph as graph:
        assert first.deps == {r.index for r in reads} and len(graph.nodes) == 101
    with CudaGraph.scope(sg_stream) as s:
        reads = [s.record(sg.memcpy(outs[i].mut(), x.view((8,)))) for i in range(100)]
        first = s.record(sg.memset(x[0].mut(), 1.0))
        second = s.record(sg.memset(x[1].mut(), 2.0))
    with s.graph as graph:
        (join,) = [n for n in graph.nodes if isinstance(n.op, sg.Join)]
        assert first.deps == {r.index for r in reads} and second.deps == {join.index}
        assert join.deps == {r.index for r in reads}


@pytest.mark.parametrize("readers", [8, 9])
def test_an_op_that_reads_memory_twice_counts_as_one_reader(
    sg_device: sg.Device, sg_stream: sg.Stream, readers: int
) -> None:
    """The join is for more than 8 readers (DESIGN section 4): 8 ops that each read x twice
    (add(o, x, x)) are 8 readers, not 16, so two small writes after them make no join; 9 do."""
    x = sg_device.zeros((64,), name="x")
    outs = sg_device.zeros((readers, 32), name="outs")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
        for i in range(readers):
            s.record(library.add_op(outs[i].mut(), x[0:32], x[0:32]))
        s.record(sg.memset(x[0:16].mut(), 2.0))
        s.record(sg.memset(x[16:32].mut(), 3.0))
    with s.graph as graph:
        assert sum(isinstance(n.op, sg.Join) for n in graph.nodes) == (readers > 8)


def test_many_readers_meet_one_writer_in_a_join(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """2000 readers of x, then small writes of x's rows: the first write waits for each reader,
    the second makes one join node (which waits for the readers), every later write waits for
    that join alone."""
    x = sg_device.zeros((64, 4), name="x")
    outs = sg_device.full((2000, 256), 5.0, name="outs")
    with CudaGraph.scope(sg_stream) as s:
        for i in range(2000):
            s.record(sg.memcpy(outs[i].mut(), x))
        writes = [s.record(library.fill_op(x[r].mut(), 1.0)) for r in range(64)]
    graph = s.graph
    joins = [n for n in graph.nodes if isinstance(n.op, sg.Join)]
    assert len(joins) == 1 and len(joins[0].deps) == 2000
    assert len(writes[0].deps) == 2000  # the first write waits for each reader itself
    assert [w.deps for w in writes[1:3]] == [frozenset({joins[0].index})] * 2
    assert all(len(w.deps) == 1 for w in writes[1:])
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(x.numpy()[:, 0], 1.0)
    np.testing.assert_array_equal(outs.numpy(), 0.0)
    graph.close()


def test_partial_writes_touch_only_their_segment(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Row writes of one allocation get no edges between them; a whole read then waits for all."""
    x = sg_device.zeros((512, 2), name="x")
    total = sg_device.zeros((512, 2), name="total")
    with CudaGraph.scope(sg_stream) as s:
        rows = [s.record(library.fill_op(x[i].mut(), float(i))) for i in range(512)]
        copy = s.record(sg.memcpy(total.mut(), x))
    assert all(r.deps == frozenset() for r in rows)
    assert copy.deps == {r.index for r in rows}
    with s.graph as g:
        g.launch()
        g.sync()
        np.testing.assert_array_equal(total.numpy()[:, 1], np.arange(512, dtype=np.float32))


def test_empty_views_conflict_with_nothing(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((8,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        w = s.record(library.fill_op(x.mut(), 3.0))
        empty_copy = s.record(sg.memcpy(x[4:4].mut(), x[2:2]))  # 0 bytes: no conflict, no edge
        empty_set = s.record(sg.memset(x[8:8].mut(), 0.0))
        after = s.record(library.add_scalar_op(x.mut(), 1.0))
    assert empty_copy.deps == frozenset() and empty_set.deps == frozenset() and after.deps == {w.index}
    with s.graph as g:
        g.launch()
        g.sync()
        np.testing.assert_array_equal(x.numpy(), 4.0)


# -- the executable graph leaves implied edges out (without_implied) ------------------------------


def _never(n: int, d: int) -> bool:
    return False


def test_implied_edges_are_left_out_of_a_read_modify_write_chain() -> None:
    # The example above: node 5 waits for 2 and 3, and 3 waits for 2 alone.
    deps = [frozenset(d) for d in ([], [], [0, 1], [2], [], [2, 3])]
    assert without_implied(deps, _never) == [frozenset(d) for d in ([], [], [0, 1], [2], [], [3])]
    # The seed model's 4 kernels a layer (norm, W1, W2, x += b): each write-after-read edge skips
    # back over the chain, so the executable graph is a plain chain.
    layer: list[frozenset[int]] = [frozenset()]
    for i in range(1, 12):
        layer.append(frozenset({i - 1, i - 3} if i >= 3 else {i - 1}))
    assert without_implied(layer, _never) == [frozenset()] + [frozenset({i - 1}) for i in range(1, 12)]


def test_an_implied_edge_is_kept_where_asked() -> None:
    deps = [frozenset(d) for d in ([], [0], [1], [0, 2])]
    assert without_implied(deps, _never)[3] == {2}
    assert without_implied(deps, lambda n, d: (n, d) == (3, 0))[3] == {0, 2}


def test_a_fork_is_not_a_chain() -> None:
    # 1 and 2 both wait for 0 alone; 3 waits for 2. Node 4 waits for 1 and 3: 1 is no ancestor of
    # 3, so both edges stay (a chain grows only from its last node).
    deps = [frozenset(d) for d in ([], [0], [0], [2], [1, 3])]
    assert without_implied(deps, _never)[4] == {1, 3}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=1, max_value=6), max_size=4), max_size=40))
def test_leaving_implied_edges_out_keeps_every_ordering(back: list[list[int]]) -> None:
    deps = [frozenset(n - k for k in ks if n - k >= 0) for n, ks in enumerate(back)]
    reduced = without_implied(deps, _never)
    assert all(r <= d for r, d in zip(reduced, deps, strict=True))
    assert _closure(reduced) == _closure(deps)
