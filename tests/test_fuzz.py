"""Differential fuzzing: random programs recorded and replayed must equal eager execution.

The programs and the runner live in tests/fuzz_programs.py (see its docstring for what a program
is and what is checked). Each backend runs its own budget of programs, derandomised and without
an example database, so a CI run is reproducible: 2000 on the host backend, 1000 on CUDA (the
GPU script runs the cuda case). ``SCOPEGRAPH_FUZZ_EXAMPLES`` overrides both.

A failure shrinks to a small program and prints it as runnable code (``note``), e.g.::

    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(t0[0:2].mut(), 1.0))  # node 0
        s.record(sg.memcpy(t1[0:2].mut(), a0[1:3]))  # node 1
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings

import scopegraph as sg

from .fuzz_programs import (
    Alias,
    Alloc,
    OpSpec,
    Program,
    Ref,
    Refusal,
    assert_edges_order_conflicts,
    conflicting_pairs,
    programs,
    run_program,
)

BUDGET = {"host": 2000, "cuda": 1000}


def _budget(device: sg.Device) -> int:
    override = os.environ.get("SCOPEGRAPH_FUZZ_EXAMPLES")
    return int(override) if override else BUDGET["cuda" if device.is_cuda else "host"]


def test_fuzz_replay_equals_eager(sg_device: sg.Device) -> None:
    stream, other = sg_device.stream(), sg_device.stream()
    seen: Counter[str] = Counter()

    @settings(
        max_examples=_budget(sg_device),
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.generate, Phase.shrink),  # no explain phase: its tracer makes shrinking crawl
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(programs())
    def check(program: Program) -> None:
        note(f"program (on {sg_device}):\n{program.code()}")
        run_program(sg_device, stream, other, program)
        seen.update(program.features())

    check()
    stream.sync()
    other.sync()
    print(f"\nfuzz[{sg_device}]: " + ", ".join(f"{k} {v}" for k, v in sorted(seen.items())))
    # The generator must keep exercising what the fuzzer is for (checked on full-size runs).
    budget = _budget(sg_device)
    assert seen["programs"] >= budget
    if budget < 500:
        return
    for feature in (
        "refused:overlap",
        "refused:frozen",
        "refused:late_freeze",
        "other-stream launches",
        "final freeze refused",
    ):
        assert seen[feature] >= budget // 20, f"only {seen[feature]} programs with {feature}"
    for feature in ("via alias", "empty ops", "dependent pairs", "raw_add", "raw_axpy", "memcpy", "memset"):
        assert seen[feature] >= budget // 10, f"only {seen[feature]} uses of {feature}"


# -- the runner's own checks, on hand-written programs ----------------------------------------


def _ref(alloc: int, start: int, end: int, expr: str) -> Ref:
    return Ref(alloc, start, end, expr)


def _chain_program() -> Program:
    """t1 = t0 + t0; t2 = t1 (via an alias of t1); t0 = 5: RAW, RAW through an alias, and WAR."""
    t0, t1, t2 = _ref(0, 0, 4, "t0"), _ref(1, 0, 4, "t1"), _ref(2, 0, 4, "t2")
    a0 = _ref(1, 0, 4, "a0")
    ops = (
        OpSpec("add", "library.add_op(t1.mut(), t0, t0)", t1, (t0, t0), 4, 0.0),
        OpSpec("memcpy", "sg.memcpy(t2.mut(), a0)", t2, (a0,), 4, 0.0),
        OpSpec("fill", "library.fill_op(t0.mut(), 5.0)", t0, (), 4, 5.0),
    )
    return Program(
        (Alloc("t0", (4,)), Alloc("t1", (2, 2)), Alloc("t2", (4,))),
        seed=1,
        aliases=(Alias("a0", 1, 0, 4, "t1"),),
        frozen=(),
        ops=ops,
        refusal=None,
        launch_on_other=(False, True, False),
        final_freeze=_ref(1, 2, 4, "t1[1:2]"),
    )


def test_hand_written_program_runs_and_its_model_is_right(sg_device: sg.Device) -> None:
    program = _chain_program()
    t0 = program.initial()[0]
    want = program.model()
    np.testing.assert_array_equal(want[1], t0 + t0)
    np.testing.assert_array_equal(want[2], t0 + t0)
    np.testing.assert_array_equal(want[0], 5.0)
    assert conflicting_pairs(program.ops) == [(0, 1), (0, 2)]
    assert program.final_freeze_refused()
    run_program(sg_device, sg_device.stream(), sg_device.stream(), program)
    assert "s.record(sg.memcpy(t2.mut(), a0))  # node 1" in program.code()


def test_edge_check_catches_a_missing_edge() -> None:
    program = _chain_program()

    class Node:
        def __init__(self, index: int) -> None:
            self.index = index

    nodes = [Node(i) for i in range(3)]
    assert_edges_order_conflicts(program, nodes, [(0, 1), (0, 2)])  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match=r"missing dependency: node 1 .* must run after node 0"):
        assert_edges_order_conflicts(program, nodes, [(0, 2)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "refusal",
    [
        Refusal(
            "overlap",
            OpSpec("memcpy", "sg.memcpy(t0[0:2].mut(), a0)", _ref(0, 0, 2, "t0[0:2]"), (_ref(0, 1, 3, "a0"),), 2, 0.0),
        ),
        Refusal("frozen", OpSpec("memset", "sg.memset(t1[1:2].mut(), 1.0)", _ref(1, 2, 4, "t1[1:2]"), (), 2, 1.0)),
        Refusal(
            "late_freeze",
            OpSpec("fill", "library.fill_op(t2[0:2].mut(), 1.0)", _ref(2, 0, 2, "t2[0:2]"), (), 2, 1.0),
            _ref(2, 1, 3, "t2[1:3]"),
        ),
        Refusal(  # freezing memory that the open scope writes
            "late_freeze",
            OpSpec("fill", "library.fill_op(t0[2:4].mut(), 1.0)", _ref(0, 2, 4, "t0[2:4]"), (), 2, 1.0),
            _ref(0, 1, 3, "t0[1:3]"),
        ),
    ],
    ids=["overlap-through-alias", "frozen", "late-freeze", "late-freeze-while-scope-writes"],
)
def test_hand_written_refusals(sg_device: sg.Device, refusal: Refusal) -> None:
    t0, t1, t2 = _ref(0, 0, 4, "t0"), _ref(1, 0, 4, "t1"), _ref(2, 0, 4, "t2")
    program = Program(
        (Alloc("t0", (4,)), Alloc("t1", (2, 2)), Alloc("t2", (4,))),
        seed=2,
        aliases=(Alias("a0", 0, 1, 3, "t0[1:3]"),),
        frozen=(_ref(1, 2, 4, "t1[1]"),),
        ops=(OpSpec("memcpy", "sg.memcpy(t0.mut(), t2)", t0, (t2,), 4, 0.0),),
        refusal=refusal,
        launch_on_other=(True, False),
        final_freeze=t1,
    )
    assert not program.final_freeze_refused()
    run_program(sg_device, sg_device.stream(), sg_device.stream(), program)
