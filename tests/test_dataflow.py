"""The DAG built from read and write sets, in dataflow and program order."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._tensor import Borrow
from scopegraph._tracker import DataflowTracker


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
        assert 'n2 -> n3 [label="a"]' in dot and "fill(mut a)" in dot


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


ranges = st.tuples(st.integers(0, 2), st.integers(0, 15), st.integers(1, 8), st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ranges, min_size=1, max_size=3), min_size=1, max_size=25))
def test_dataflow_orders_every_conflicting_pair(program: list[list[tuple[int, int, int, bool]]]) -> None:
    """Property: for any program of ops over three allocations, each pair of ops that touch
    overlapping bytes with at least one write is ordered (transitively) in the DAG."""
    dev = sg.device("host")
    allocs = [dev.zeros((24,), sg.u8, name=f"a{i}") for i in range(3)]
    tracker = DataflowTracker()
    deps: list[frozenset[int]] = []
    ops: list[list[Borrow]] = []
    for accesses in program:
        borrows = [Borrow(allocs[a][s : s + n], mut, f"p{i}") for i, (a, s, n, mut) in enumerate(accesses)]
        deps.append(tracker.add(borrows))
        ops.append(borrows)
        assert all(d < len(deps) - 1 for d in deps[-1])
    reach = _closure(deps)
    for j, i in itertools.combinations(range(len(ops)), 2):
        conflict = any((a.mutable or b.mutable) and a.overlaps(b) for a in ops[j] for b in ops[i])
        if conflict:
            assert j in reach[i], f"op {i} must come after op {j}"
