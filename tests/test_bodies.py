"""Loop and branch bodies hold what the scope holds (DESIGN.md sections 5, 8, 9 and 10): captured
regions (``body.capture``) and collectives are child graphs recorded into bodies, graph parameters
(``sg.Param``) in bodies take ``graph.launch(name=value)``, and ``graph.rebind`` moves what bodies
use, with the same checks as at the top level; every refusal leaves the graph as it was. On CUDA, a
capture a conditional body cannot hold (events, host callbacks: NCCL's by default) is refused
before anything is built."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._bootstrap import SingleBootstrap
from scopegraph._driver import cuda_device_count

from .helpers import assert_stream_usable, child_env, pinned
from .test_capture import foreign_scale, scale_region
from .test_collectives import free_port, run_ranks
from .test_control import collatz, copy_int
from .test_params import spy

NDArray = np.ndarray[Any, np.dtype[Any]]
N = 256


def i32(dev: sg.Device, value: int, name: str) -> sg.Tensor:
    return dev.from_numpy(np.array([value], np.int32), name=name)


# -- captured regions in bodies ------------------------------------------------------------------


def test_a_region_in_a_loop_body_runs_every_iteration(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x0 = np.arange(N, dtype=np.float32)
    src, x = dev.from_numpy(x0, name="src"), dev.zeros((N,), name="x")
    y, acc = dev.zeros((N,), name="y"), dev.zeros((N,), name="acc")
    flag = dev.zeros((1,), sg.i32, name="flag")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memcpy(x.mut(), src))
        s.record(sg.memset(acc.mut(), 0.0))
        s.record(sg.memset(flag.mut(), 3))
        with s.while_(flag, max_iterations=10) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))  # x += 1
            region = scale_region(body, y, x, 2.0)  # y = 2x (foreign)
            body.record(library.axpy_op(acc.mut(), y, 1.0))  # acc += y
            body.record(library.count_down_op(flag.mut()))
        s.record(library.add_scalar_op(y.mut(), 0.5))  # after the loop: it writes what the loop wrote
    graph = s.graph
    loop = graph.nodes[3]
    assert isinstance(loop.op, sg.While)
    assert region.node is loop.op.body.nodes[1] and region.node.deps == {0}
    assert loop.op.body.nodes[2].deps == {1}
    assert graph.nodes[4].deps == {3}
    assert "capture:scale(mut y, x)" in graph.to_dot()
    for _ in range(3):
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(x.numpy(), x0 + 3)
        np.testing.assert_array_equal(acc.numpy(), 2 * (3 * x0 + 6))
        np.testing.assert_array_equal(y.numpy(), 2 * (x0 + 3) + 0.5)
    graph.close()
    assert not pinned(y)


def test_a_region_in_a_branch_runs_only_when_the_branch_is_taken(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x = dev.from_numpy(np.arange(N, dtype=np.float32), name="x")
    y = dev.zeros((N,), name="y")
    cond = i32(dev, 1, "cond")
    with CudaGraph.scope(sg_stream) as s, s.if_else(cond) as (then, otherwise):
        scale_region(then, y, x, 3.0, name="triple")
        scale_region(otherwise, y, x, -1.0, name="negate")
    with s.graph as graph:
        for taken in (1, 0, 1):
            sg_stream.run(sg.memset(cond.mut(), taken))
            graph.launch()
            graph.sync()
            np.testing.assert_array_equal(y.numpy(), np.arange(N) * (3.0 if taken else -1.0))


def test_capturing_around_a_body_is_refused_and_names_body_capture(sg_stream: sg.Stream, builds: list[int]) -> None:
    dev = sg_stream.device
    x, y = dev.zeros((N,), name="x"), dev.zeros((N,), name="y")
    flag = dev.zeros((1,), sg.i32, name="flag")
    copy: dict[str, Any] = {"reads": [x], "writes": [y.mut()], "host": lambda o, i: np.copyto(o, i)}
    with CudaGraph.scope(sg_stream) as s, s.while_(flag) as body:
        with pytest.raises(sg.ScopeStateError, match=r"cannot open a captured region in the scope while the loop") as e:
            s.capture(**copy).__enter__()
        assert "body.capture(...)" in str(e.value) and "help:" in str(e.value)
        with body.capture(**copy) as region:
            with pytest.raises(
                sg.ScopeStateError, match=r"cannot record into the enclosing loop body while the captured region"
            ):
                body.record(library.add_scalar_op(x.mut(), 1.0))
            with pytest.raises(sg.ScopeStateError, match=r"open a loop or branch in the enclosing loop body while"):
                body.if_(flag).__enter__()
            if region.capturing:
                foreign_scale(region, y, x, 1.0)
    assert builds == [1]
    with pytest.raises(sg.ScopeStateError, match=r"cannot open a captured region in a loop body that is closed"):
        body.capture(**copy).__enter__()
    s.graph.close()
    assert_stream_usable(sg_stream)


def test_a_region_left_open_in_a_body_fails_the_loop_and_pins_nothing(sg_stream: sg.Stream, builds: list[int]) -> None:
    """Entered through an ExitStack and never ended: the loop's block ends with a ScopeStateError,
    the capture is ended (the capture stream stays usable), and nothing stays pinned."""
    dev = sg_stream.device
    x, y = dev.zeros((N,), name="x"), dev.zeros((N,), name="y")
    flag = dev.zeros((1,), sg.i32, name="flag")
    stack = contextlib.ExitStack()
    with (
        pytest.raises(
            sg.ScopeStateError,
            match=r"the loop body ended while the captured region `capture` opened at .* was still",
        ),
        CudaGraph.scope(sg_stream) as s,
        s.while_(flag) as body,
    ):
        body.record(library.add_scalar_op(x.mut(), 1.0))
        region = stack.enter_context(body.capture(reads=[x], writes=[y.mut()], host=lambda o, i: None))
        if region.capturing:
            foreign_scale(region, y, x, 1.0)
    assert builds == [] and not region.capturing
    assert not pinned(x) and not pinned(y) and not pinned(flag)
    assert_stream_usable(sg_stream)
    test_a_region_in_a_branch_runs_only_when_the_branch_is_taken(sg_stream)  # capturing works again


@pytest.mark.sg_cuda
def test_a_capture_a_conditional_body_cannot_hold_is_refused_at_the_region() -> None:
    """An event recorded with the external flag is an EVENT_RECORD node: fine in the scope's own
    graph, refused in a body when the region's block ends (the driver would refuse the whole graph
    when it is instantiated)."""
    from cuda.bindings import driver

    sg_device = sg.device("cuda")
    sg_stream = sg_device.stream()
    x, y = sg_device.zeros((N,), name="x"), sg_device.zeros((N,), name="y")
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    err, event = driver.cuEventCreate(0)
    assert err == driver.CUresult.CUDA_SUCCESS
    record = driver.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(sg.CaptureError) as info, s.while_(flag) as body:
            with body.capture(reads=[x], writes=[y.mut()], name="evented") as region:
                foreign_scale(region, y, x, 2.0)
                (err,) = driver.cuEventRecordWithFlags(event, driver.CUstream(region.handle), record)
                assert err == driver.CUresult.CUDA_SUCCESS
            pytest.fail("the region was accepted")
        text = str(info.value)
        assert "captured region `evented` is in a loop or branch body, but its capture holds EVENT_RECORD" in text
        assert "cudaEventRecordWithFlags" in text and "help: open the region outside the loop or branch" in text
        assert any(
            str(e.path).endswith("test_bodies.py") and "body.capture(" in str(e.statement) for e in info.traceback
        )
        s.record(library.add_scalar_op(x.mut(), 1.0))  # the scope goes on
    assert [n.op.label() for n in s.graph.nodes] == ["add_scalar(mut x)"]
    s.graph.close()
    driver.cuEventDestroy(event)
    assert_stream_usable(sg_stream)


@pytest.mark.parametrize(
    ("kinds", "says"),
    [
        (["EVENT_RECORD", "WAIT_EVENT"], "EVENT_RECORD / WAIT_EVENT: an event recorded or waited on"),
        (["HOST"], "HOST: a host function launched on the stream"),
        (["MEM_ALLOC"], "MEM_ALLOC: a node kind a conditional body cannot run"),
    ],
    ids=["events", "host", "other"],
)
def test_what_a_body_cannot_hold_is_named(monkeypatch: pytest.MonkeyPatch, kinds: list[str], says: str) -> None:
    """The refusal of a capture in a body names each node kind and what usually makes it (the
    driver's node types are stood in for: no GPU needed)."""
    from scopegraph import _capture

    dev = sg.device("host")
    y = dev.zeros((4,), name="y")
    op = sg.Captured("fetch", [y.mut()], [], None, "user.py:7", region=_capture._REGION)
    found = ["CU_GRAPH_NODE_TYPE_KERNEL", "CU_GRAPH_NODE_TYPE_GRAPH"] + [f"CU_GRAPH_NODE_TYPE_{k}" for k in kinds]
    monkeypatch.setattr(_capture, "node_types", lambda handle: found)
    with pytest.raises(sg.CaptureError) as info:
        _capture.check_body_graph(op, object())
    text = str(info.value)
    assert f"its capture holds {', '.join(sorted(kinds))} node(s)" in text
    assert says in text and "opened at user.py:7" in text and "\nhelp: " in text
    monkeypatch.setattr(_capture, "node_types", lambda handle: [*found[:2], "CU_GRAPH_NODE_TYPE_CONDITIONAL"])
    _capture.check_body_graph(op, object())  # what a body holds passes


# -- collectives in bodies -----------------------------------------------------------------------


def one_rank() -> sg.Communicator:
    return sg.Communicator(sg.device("host"), SingleBootstrap())


@pytest.mark.parametrize("mixing", [True, False], ids=["events", "host-callback"])
def test_the_cuda_backend_checks_a_collective_in_a_body_when_it_captures_it(
    monkeypatch: pytest.MonkeyPatch, mixing: bool
) -> None:
    """A collective is captured when the scope builds its graph; in a body its capture is checked
    then, before anything is instantiated, and the refusal says what to do about NCCL (checked
    here with the CUDA backend's node building and stand-ins for NCCL's capture)."""
    from scopegraph import _capture
    from scopegraph._backends._cuda import CudaBackend

    comm = one_rank()
    x = comm.device.zeros((4,), name="x")
    op = comm.all_reduce(x.mut())
    kinds = ["KERNEL", "EVENT_RECORD", "WAIT_EVENT"] if mixing else ["KERNEL", "HOST"]
    monkeypatch.setattr(_capture, "node_types", lambda handle: [f"CU_GRAPH_NODE_TYPE_{k}" for k in kinds])
    monkeypatch.setattr(sg.Collective, "child", lambda self, backend: types.SimpleNamespace(handle="captured"))
    parent = types.SimpleNamespace(embed=lambda child: ("child node", child.handle))
    made: Any = CudaBackend._add_node(None, parent, op, False)  # type: ignore[arg-type]
    assert made == ("child node", "captured")
    with pytest.raises(sg.CaptureError) as info:
        CudaBackend._add_node(None, parent, op, True)  # type: ignore[arg-type]
    text = str(info.value)
    assert "rank 0: `all_reduce` is in a loop or branch body, but NCCL's capture of it cannot run there" in text
    if mixing:
        assert "holds EVENT_RECORD, WAIT_EVENT node(s)" in text and "graph mixing support is on" in text
        assert "help: set NCCL_GRAPH_MIXING_SUPPORT=0 in every rank's environment" in text
    else:
        assert "NCCL adds a host callback when a collective needs its proxy thread" in text
        assert "help: record the collective outside the loop or branch" in text
    comm.close()


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
_LOOP_PROGRAM = """
import os, sys
import numpy as np
import scopegraph as sg
from scopegraph import CudaGraph, library
comm = sg.init_distributed()
dev, stream = comm.device, comm.device.stream()
x = dev.full((8,), float(comm.rank + 1), name="x")
flag = dev.zeros((1,), sg.i32, name="flag")
outside = comm.rank == 1 and os.environ.get("SG_TEST_MISMATCH") == "1"
try:
    with CudaGraph.scope(stream) as s:
        s.record(sg.memset(flag.mut(), 3))
        with s.while_(flag, max_iterations=8) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            if not outside:
                body.record(comm.all_reduce(x.mut()))
            body.record(library.count_down_op(flag.mut()))
        if outside:
            s.record(comm.all_reduce(x.mut()))
    s.graph.launch()
    s.graph.sync()
    print(f"rank {comm.rank} result {x.numpy().tolist()}")  # one string: ranks print at once under torchrun
except sg.ScopeGraphError as exc:
    print(f"rank {comm.rank} refused {type(exc).__name__} " + str(exc).replace(chr(10), " | "))
"""


def test_a_loop_with_an_all_reduce_in_its_body_on_two_host_ranks() -> None:
    """The decode loop of a tensor-parallel model in miniature: x += 1 then x = sum over ranks, three
    times, inside one graph launch: (1+1 + 2+1) = 5, then 2 * 6 = 12, then 2 * 13 = 26."""
    for r, done in enumerate(run_ranks(["-c", _LOOP_PROGRAM])):
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"rank {r} result [26.0, 26.0, 26.0, 26.0, 26.0, 26.0, 26.0, 26.0]" in done.stdout, done.stdout


def test_a_collective_in_a_body_on_one_rank_and_outside_on_another_is_a_mismatch() -> None:
    for r, done in enumerate(run_ranks(["-c", _LOOP_PROGRAM], env={"SG_TEST_MISMATCH": "1"})):
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert f"rank {r} refused CollectiveMismatchError" in out, out
        assert "rank 0: in a loop body: all_reduce sum f32[8] -> f32[8]" in out
        assert "rank 1: all_reduce sum f32[8] -> f32[8]" in out


@pytest.mark.sg_cuda
def test_a_loop_with_an_all_reduce_in_its_body_on_two_gpus(tmp_path: Path) -> None:
    """NCCL under torchrun: with NCCL's graph mixing support on (its default) every captured
    collective holds an event record and an event wait, which a conditional body cannot hold, so
    the scope is refused before anything is built, on every rank, naming the fix; with
    NCCL_GRAPH_MIXING_SUPPORT=0 the loop runs NCCL's kernels in every iteration."""
    if cuda_device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("torch")
    pytest.importorskip("nccl.core")
    program = tmp_path / "loop.py"
    program.write_text(_LOOP_PROGRAM)
    outputs = {}
    for mixing in ("1", "0"):
        env = child_env(NCCL_NVLS_ENABLE="0", NCCL_GRAPH_MIXING_SUPPORT=mixing)
        env.pop("SCOPEGRAPH_DEVICE", None)
        done = subprocess.run(
            [*TORCHRUN, str(free_port()), str(program)],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        outputs[mixing] = done.stdout
    for r in range(2):
        assert f"rank {r} refused CaptureError rank {r}: `all_reduce` is in a loop or branch body" in outputs["1"]
        assert f"rank {r} result [26.0, 26.0, 26.0, 26.0, 26.0, 26.0, 26.0, 26.0]" in outputs["0"], outputs["0"]
    assert "NCCL_GRAPH_MIXING_SUPPORT=0" in outputs["1"], outputs["1"]


# -- graph parameters in bodies ------------------------------------------------------------------


def param_program(s: sg.Scope, x: sg.Tensor, y: sg.Tensor, flag: sg.Tensor, cond: sg.Tensor, a: Any, b: Any) -> None:
    """y += a * x at the top; a loop of 3: x += a, then, when ``cond``, y += b; y += 0.5 after."""
    s.record(library.axpy[1, N](y.mut(), x, a, N))
    s.record(sg.memset(flag.mut(), 3))
    with s.while_(flag, max_iterations=5) as body:
        body.record(library.add_scalar[1, N](x.mut(), a, N))
        with body.if_(cond) as then:
            then.record(library.add_scalar[1, N](y.mut(), b, N))
        body.record(library.count_down_op(flag.mut()))
    s.record(library.add_scalar_op(y.mut(), 0.5))


def fresh_param_run(dev: sg.Device, x0: NDArray, y0: NDArray, a: float, b: float) -> tuple[NDArray, NDArray]:
    """One replay of the program freshly recorded with literal values, on the host backend."""
    host = sg.device("host")
    x, y = host.from_numpy(x0), host.from_numpy(y0)
    flag, cond = host.zeros((1,), sg.i32), i32(host, 1, "cond")
    with CudaGraph.scope(host.stream()) as s:
        param_program(s, x, y, flag, cond, a, b)
    with s.graph as g:
        g.launch()
    return x.numpy(), y.numpy()


def param_graph(
    sg_device: sg.Device, sg_stream: sg.Stream, seed: int
) -> tuple[CudaGraph, NDArray, NDArray, sg.Tensor, sg.Tensor]:
    """param_program recorded on random inputs: the graph, the inputs, and x and y."""
    rng = np.random.default_rng(seed)
    x0, y0 = rng.integers(-8, 8, N).astype(np.float32), rng.integers(-8, 8, N).astype(np.float32)
    x, y = sg_device.from_numpy(x0, name="x"), sg_device.from_numpy(y0, name="y")
    flag, cond = sg_device.zeros((1,), sg.i32, name="flag"), i32(sg_device, 1, "cond")
    a, b = sg.Param("a", sg.f32, 1.0), sg.Param("b", sg.f32, 2.0)
    with CudaGraph.scope(sg_stream) as s:
        param_program(s, x, y, flag, cond, a, b)
    return s.graph, x0, y0, x, y


def test_parameters_in_bodies_give_a_fresh_graphs_results(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    graph, x0, y0, x, y = param_graph(sg_device, sg_stream, 5)
    assert graph.params == {"a": np.float32(1.0), "b": np.float32(2.0)}
    calls = spy(graph)
    # slots: 0-3 the graph's nodes (2: the loop), 4-6 the loop body (5: the branch), 7 the branch's node
    for step, (va, vb) in enumerate([(1.0, 2.0), (0.5, 2.0), (0.5, -3.0), (2.0, 4.0), (2.0, 4.0)]):
        sg_stream.run(sg.memcpy(x.mut(), sg_device.from_numpy(x0)))
        sg_stream.run(sg.memcpy(y.mut(), sg_device.from_numpy(y0)))
        calls.clear()
        graph.launch(a=va, b=vb)
        graph.sync()
        want_x, want_y = fresh_param_run(sg_device, x0, y0, va, vb)
        np.testing.assert_array_equal(x.numpy(), want_x, err_msg=f"step {step}")
        np.testing.assert_array_equal(y.numpy(), want_y, err_msg=f"step {step}")
        expected = [[], [0, 4], [7], [0, 4, 7], []][step]
        assert sorted(calls) == expected, step
    assert graph.params == {"a": np.float32(2.0), "b": np.float32(4.0)}
    assert graph.last_update == "nodes"  # on CUDA too: the driver takes node updates inside conditional bodies
    graph.close()


@pytest.mark.sg_cuda
def test_where_the_driver_refuses_node_updates_in_bodies_a_whole_graph_update_takes_them() -> None:
    """Should a driver refuse a node update inside a conditional body (the H200's driver takes
    them), the update is made as a whole-graph update from the graph's own definition (same
    conditional handles), which also carries every node update made before it: none is lost."""
    sg_device = sg.device("cuda")
    sg_stream = sg_device.stream()
    graph, x0, y0, x, y = param_graph(sg_device, sg_stream, 6)
    exe: Any = graph.executable

    class Refusing:
        def update(self, **params: Any) -> None:
            raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED (a stand-in for the driver)")

    exe._views[exe.nodes[7]] = Refusing()  # the branch's node: its node update is refused
    for step, (va, vb, kind) in enumerate([(0.5, 2.0, "nodes"), (0.5, -3.0, "whole"), (2.0, -3.0, "whole")]):
        sg_stream.run(sg.memcpy(x.mut(), sg_device.from_numpy(x0)))
        sg_stream.run(sg.memcpy(y.mut(), sg_device.from_numpy(y0)))
        graph.launch(a=va, b=vb)
        graph.sync()
        assert graph.last_update == kind, step
        want_x, want_y = fresh_param_run(sg_device, x0, y0, va, vb)
        np.testing.assert_array_equal(x.numpy(), want_x, err_msg=f"step {step}")
        np.testing.assert_array_equal(y.numpy(), want_y, err_msg=f"step {step}")
    assert not exe.body_node_updates and exe.whole_updates == 2
    graph.close()


def test_a_refused_node_update_in_a_body_becomes_a_whole_graph_update_keeping_earlier_ones() -> None:
    """The CUDA executable's update path, with stand-ins for cuda.core's graph and nodes (so CI runs
    it): the graph's own nodes take node updates; once the driver refuses one inside a conditional
    body, updates there are whole-graph updates from the graph's definition, whose nodes first take
    every node update made since it was last in step, so no earlier update is undone."""
    from scopegraph._backends._cuda import _CudaExecutable

    running: dict[int, dict[str, Any]] = {}  # what the executable's nodes run, by node

    class Node:  # a definition node
        def __init__(self, i: int) -> None:
            self.i, self.params = i, {"args": ("built", i)}

        def update(self, **params: Any) -> None:
            self.params = params

    class View:  # an executable-node view
        def __init__(self, node: Node, refuse: bool) -> None:
            self.node, self.refuse = node, refuse

        def update(self, **params: Any) -> None:
            if self.refuse:
                raise RuntimeError("CUDA_ERROR_INVALID_VALUE (a stand-in)")
            running[self.node.i] = params

    nodes = [Node(i) for i in range(4)]  # 0, 1: the graph's own; 2, 3: in a loop body

    class Graph:
        def __getitem__(self, node: Node) -> View:
            return View(node, refuse=node.i >= 2)

        def update(self, definition: list[Node]) -> None:
            running.update({n.i: n.params for n in definition})

    backend = types.SimpleNamespace(keep_current=lambda: None)
    exe = _CudaExecutable(backend, Graph(), nodes, nodes, 2)  # type: ignore[arg-type]
    exe._unsynced = {}
    exe._set(nodes[0], {"args": ("a", 1)}, 0)
    assert running == {0: {"args": ("a", 1)}} and exe.whole_updates == 0
    exe._set(nodes[2], {"args": ("b", 1)}, 2)  # refused: a whole-graph update
    assert not exe.body_node_updates and exe.whole_updates == 1
    assert running[0] == {"args": ("a", 1)} and running[2] == {"args": ("b", 1)}
    exe._set(nodes[0], {"args": ("a", 2)}, 0)  # a node update again
    exe._set(nodes[3], {"args": ("c", 1)}, 3)  # straight to a whole-graph update
    assert exe.whole_updates == 2
    assert running == {
        0: {"args": ("a", 2)},
        1: {"args": ("built", 1)},
        2: {"args": ("b", 1)},
        3: {"args": ("c", 1)},
    }


def test_a_refused_whole_graph_update_is_rolled_back_in_the_definition_too() -> None:
    """Stand-ins as above, with a driver that refuses one whole-graph update: the caller's roll-back
    (update_executable) sets the failing node's old parameters again, so the definition does not
    keep the refused change, and later updates in bodies work (before, each was refused too)."""
    from scopegraph._backends._cuda import _CudaExecutable
    from scopegraph._update import update_executable

    running: dict[int, dict[str, Any]] = {}

    class Node:
        def __init__(self, i: int) -> None:
            self.i, self.params = i, {"args": ("built", i)}

        def update(self, **params: Any) -> None:
            self.params = params

    class View:
        def update(self, **params: Any) -> None:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE (a stand-in)")  # no node updates in bodies

    class Graph:
        def __getitem__(self, node: Node) -> View:
            return View()

        def update(self, definition: list[Node]) -> None:
            if any(n.params["args"][0] == "bad" for n in definition):
                raise RuntimeError("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (a stand-in)")
            running.update({n.i: n.params for n in definition})

    nodes = [Node(i) for i in range(4)]  # 0, 1: the graph's own; 2, 3: in a loop body
    exe = _CudaExecutable(types.SimpleNamespace(keep_current=lambda: None), Graph(), nodes, nodes, 2)  # type: ignore[arg-type]
    exe._unsynced = {}

    def update_node(index: int, op: Any, values: Any) -> None:
        exe._set(nodes[index], {"args": (op, index)}, index)

    exe.update_node = update_node  # type: ignore[method-assign]
    flat: Any = [types.SimpleNamespace(op=f"old{i}") for i in range(4)]
    with pytest.raises(RuntimeError, match="UPDATE_FAILURE"):
        update_executable(exe, flat, [2], {}, {}, {2: cast(Any, "bad")})
    assert nodes[2].params == {"args": ("old2", 2)}  # put back in the definition
    assert update_executable(exe, flat, [3], {}, {}, {3: cast(Any, "new")}) == "whole"
    assert running[3] == {"args": ("new", 3)} and running[2] == {"args": ("old2", 2)}


def test_a_parameter_that_would_make_a_body_node_reach_past_its_tensor_is_refused(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    out, flag = sg_device.zeros((8,), name="out"), sg_device.zeros((1,), sg.i32, name="flag")
    n = sg.Param("n", sg.i32, 8)
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag) as body:
            body.record(library.add_scalar[1, 32](out.mut(), 1.0, n))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        with pytest.raises(sg.SignatureError, match=r"add_scalar"):
            graph.launch(n=9)
        assert graph.params == {"n": np.int32(8)} and graph.last_update is None
        graph.launch(n=4)
        graph.sync()
        np.testing.assert_array_equal(out.numpy(), [2, 2, 2, 2, 0, 0, 0, 0])


# -- rebinding what bodies use -------------------------------------------------------------------


def rebind_program(s: sg.Scope, inp: sg.Tensor, acc: sg.Tensor, tmp: sg.Tensor, flag: sg.Tensor, a: Any) -> None:
    """tmp = 2 inp; a loop of 2: acc += a * tmp, and a branch on the flag (taken each time):
    inp[0:32] += 1; acc += 1 after the loop."""
    s.record(library.add_op(tmp.mut(), inp, inp))
    s.record(sg.memset(flag.mut(), 2))
    with s.while_(flag, max_iterations=4) as body:
        body.record(library.axpy[1, N](acc.mut(), tmp, a, N))
        with body.if_(flag) as then:
            then.record(library.add_scalar_op(inp[0:32].mut(), 1.0))
        body.record(library.count_down_op(flag.mut()))
    s.record(library.add_scalar_op(acc.mut(), 1.0))


def rebind_reference(inp: NDArray, acc: NDArray, a: float) -> tuple[NDArray, NDArray]:
    host = sg.device("host")
    i, c, t, f = host.from_numpy(inp), host.from_numpy(acc), host.zeros((N,)), host.zeros((1,), sg.i32)
    with CudaGraph.scope(host.stream()) as s:
        rebind_program(s, i, c, t, f, a)
    with s.graph as g:
        g.launch()
    return i.numpy(), c.numpy()


def test_rebinding_what_bodies_use_gives_a_fresh_graphs_results(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(7)
    inputs = [sg_device.from_numpy(rng.integers(-8, 8, N).astype(np.float32), name=f"in{i}") for i in range(3)]
    accs = [sg_device.from_numpy(rng.integers(-8, 8, N).astype(np.float32), name=f"acc{i}") for i in range(2)]
    tmp, flag = sg_device.zeros((N,), name="tmp"), sg_device.zeros((1,), sg.i32, name="flag")
    a = sg.Param("a", sg.f32, 2.0)
    with CudaGraph.scope(sg_stream) as s:
        rebind_program(s, inputs[0], accs[0], tmp, flag, a)
    graph = s.graph
    graph.launch(a=0.5)  # a parameter value survives rebinds of the nodes that use it
    graph.sync()
    current_in, current_acc = inputs[0], accs[0]
    for step in range(6):
        new_in, new_acc = inputs[(step + 1) % 3], accs[(step + 1) % 2]
        want_in, want_acc = rebind_reference(new_in.numpy(), new_acc.numpy(), 0.5)
        graph.rebind({current_in: new_in, current_acc: new_acc})
        assert graph.last_update == "nodes"
        assert pinned(new_in) and pinned(new_acc) and not pinned(current_in) and not pinned(current_acc)
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(new_in.numpy(), want_in, err_msg=f"step {step}")
        np.testing.assert_array_equal(new_acc.numpy(), want_acc, err_msg=f"step {step}")
        current_in, current_acc = new_in, new_acc
    loop = graph.nodes[2].op
    assert isinstance(loop, sg.While)
    assert loop.body.nodes[0].op.label() == f"axpy(mut {current_acc.name}, tmp)"
    branch = loop.body.nodes[1].op
    assert isinstance(branch, sg.If)
    assert branch.then.nodes[0].op.label() == f"add_scalar(mut {current_in.name}[0:32])"
    # The loop as a whole borrows what its body now uses (the outer DAG's view of it).
    assert {b.tensor.name for b in loop.borrows} == {"flag", "loop_count@" + loop.where.rsplit(":", 1)[1], "tmp"} | {
        current_acc.name,
        f"{current_in.name}[0:32]",
    }
    graph.close()


def test_rebinding_a_loops_flag_moves_its_condition_too(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """The kernels that set the loop's condition read the new flag: were they left on the old one
    (5 here), the loop would overrun its bound."""
    flag, flag2 = i32(sg_device, 0, "flag"), i32(sg_device, 5, "flag2")
    x = sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 3))
        with s.while_(flag, max_iterations=4) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        graph.rebind({flag: flag2})
        sg_stream.run(sg.memset(flag.mut(), 5))
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(x.numpy(), np.full(N, 3.0))
        assert flag2.numpy()[0] == 0 and flag.numpy()[0] == 5
        assert graph.nodes[1].op.label() == "while(flag2, max 4) [2 nodes]"
        assert 'label="loop body of flag2"' in graph.to_dot()
        assert pinned(flag2) and not pinned(flag)


def test_rebinding_the_flag_of_a_branch_with_empty_bodies(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A graph whose only loop or branch holds nothing still has condition kernels to move (on
    CUDA the rebind met a KeyError, reported as a CudaError)."""
    flag, flag2, x = i32(sg_device, 1, "flag"), i32(sg_device, 0, "flag2"), sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
        with s.if_(flag):
            pass
    with s.graph as graph:
        graph.rebind({flag: flag2})
        graph.launch()
        graph.sync()
        assert graph.nodes[1].op.label().startswith("if(flag2") and pinned(flag2) and not pinned(flag)
        np.testing.assert_array_equal(x.numpy(), np.full(N, 1.0))


def test_a_branch_that_raises_takes_back_its_parameter_names(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """The branch is not recorded, so neither is its parameter: another parameter of that name is
    not 'a second parameter named v' afterwards."""
    flag, x = i32(sg_device, 1, "flag"), sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        with pytest.raises(RuntimeError, match="abandoned"), s.if_(flag) as then:
            then.record(library.add_scalar[1, N](x.mut(), sg.Param("v", sg.f32, 1.0), N))
            raise RuntimeError("abandoned")
        s.record(library.add_scalar[1, N](x.mut(), sg.Param("v", sg.f32, 2.0), N))
    with s.graph as graph:
        assert graph.params == {"v": 2.0}
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(x.numpy(), np.full(N, 2.0))


def refused_setup(dev: sg.Device, stream: sg.Stream) -> tuple[CudaGraph, dict[str, sg.Tensor]]:
    """0: z += 10 (unordered with the loop); 1: flag = 1; 2: a loop, 8 iterations: 0: p += 1;
    1: q += 1 (unordered with 0); 2: collatz(n, steps, flag), the flag's only writer; 3: seen = steps
    (after 2, through steps)."""
    t = {
        "z": dev.zeros((N,), name="z"),
        "p": dev.zeros((N,), name="p"),
        "q": dev.zeros((N,), name="q"),
        "flag": dev.zeros((1,), sg.i32, name="flag"),
        "n": i32(dev, 6, "n"),
        "steps": dev.zeros((1,), sg.i32, name="steps"),
        "seen": dev.zeros((1,), sg.i32, name="seen"),
        "frozen": dev.zeros((N,), name="frozen").freeze(),
    }
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(t["z"].mut(), 10.0))
        s.record(sg.memset(t["flag"].mut(), 1))
        with s.while_(t["flag"], max_iterations=8) as body:
            body.record(library.add_scalar_op(t["p"].mut(), 1.0))
            body.record(library.add_scalar_op(t["q"].mut(), 1.0))
            body.record(collatz[1, 1](t["n"].mut(), t["steps"].mut(), t["flag"].mut()))
            body.record(copy_int[1, 1](t["seen"].mut(), t["steps"]))
    return s.graph, t


def replay(graph: CudaGraph, t: dict[str, sg.Tensor], stream: sg.Stream) -> list[NDArray]:
    stream.run(sg.memset(t["n"].mut(), 6))  # 6 3 10 5 16 8 4 2 1: 8 iterations
    stream.run(sg.memset(t["steps"].mut(), 0))
    for name in ("z", "p", "q"):
        stream.run(sg.memset(t[name].mut(), 0.0))
    graph.launch()
    graph.sync()
    return [t[name].numpy() for name in ("z", "p", "q", "steps", "seen", "flag")]


@pytest.mark.parametrize(
    ("case", "error", "message"),
    [
        ("alias in a node", sg.BorrowError, r"cannot borrow `seen` as immutable"),
        ("unordered in the body", sg.BorrowError, r"nodes 0 and 1 of the loop body of node 2 of graph #\d+ share"),
        ("unordered with the loop", sg.BorrowError, r"nodes 0 and 2 of graph #\d+ share memory"),
        ("a new writer of the flag", sg.BorrowError, r"node 3 of the loop body of node 2 \(`copy_int`\) of graph"),
        ("the flag onto a writer", sg.BorrowError, r"node 3 of the loop body of node 2 \(`copy_int`\) of graph"),
        ("frozen", sg.BorrowError, r"cannot borrow `frozen` as mutable"),
        ("the loop's counter", sg.SignatureError, r"it is the iteration counter of the loop \(node 2\)"),
        ("the counter with the flag", sg.SignatureError, r"rebind `loop_count@\d+`: it is the iteration counter"),
    ],
)
def test_refused_rebinds_in_bodies_leave_the_graph_as_it_was(
    sg_device: sg.Device, sg_stream: sg.Stream, case: str, error: type[Exception], message: str
) -> None:
    graph, t = refused_setup(sg_device, sg_stream)
    before = replay(graph, t, sg_stream)
    np.testing.assert_array_equal(before[1], np.full(N, 8.0))  # p: 8 iterations
    loop = graph.nodes[2].op
    assert isinstance(loop, sg.While) and loop.counter is not None
    mapping = {
        "alias in a node": {t["steps"]: t["seen"]},  # copy_int(seen.mut(), seen)
        "unordered in the body": {t["q"]: t["p"]},
        "unordered with the loop": {t["p"]: t["z"]},
        "a new writer of the flag": {t["seen"]: t["flag"]},  # copy_int writes the flag after its last writer
        "the flag onto a writer": {t["flag"]: t["seen"]},  # the flag becomes what copy_int (unchanged) writes
        "frozen": {t["p"]: t["frozen"]},
        "the loop's counter": {loop.counter: sg_device.zeros((2,), sg.i32)},
        # was accepted, the counter silently left where it was
        "the counter with the flag": {
            t["flag"]: sg_device.zeros((1,), sg.i32),
            loop.counter: sg_device.zeros((2,), sg.i32),
        },
    }[case]
    labels = [n.op.label() for n in graph.nodes]
    body_labels = [n.op.label() for n in loop.body.nodes]
    held = [name for name, x in t.items() if pinned(x)]
    with pytest.raises(error, match=message) as info:
        graph.rebind(mapping)
    assert "\nhelp: " in str(info.value)
    assert [n.op.label() for n in graph.nodes] == labels and graph.nodes[2].op is loop
    assert [n.op.label() for n in loop.body.nodes] == body_labels and loop.body.flag is t["flag"]
    assert [name for name, x in t.items() if pinned(x)] == held and graph.last_update is None
    after = replay(graph, t, sg_stream)
    for got, want in zip(after, before, strict=True):
        np.testing.assert_array_equal(got, want)
    graph.close()


def test_a_view_in_a_body_that_straddles_the_rebound_tensor_is_refused(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    p, flag = sg_device.zeros((N,), name="p"), sg_device.zeros((1,), sg.i32, name="flag")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 1))
        with s.while_(flag) as body:
            body.record(library.add_scalar_op(p[0:16].mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        with pytest.raises(
            sg.SignatureError,
            match=r"cannot rebind `p\[8:256\]`: node 0 of the loop body of node 1 \(`add_scalar`\) uses `p\[0:16\]`",
        ):
            graph.rebind({p[8:N]: sg_device.zeros((N - 8,))})
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(p.numpy()[:17], [1.0] * 16 + [0.0])


def test_a_region_in_a_body_is_not_rebound_and_the_message_names_the_old_tensor(sg_stream: sg.Stream) -> None:
    dev = sg_stream.device
    x, y = dev.from_numpy(np.ones(N, np.float32), name="x"), dev.zeros((N,), name="y")
    flag = dev.zeros((1,), sg.i32, name="flag")
    with CudaGraph.scope(sg_stream) as s:
        s.record(sg.memset(flag.mut(), 1))
        with s.while_(flag) as body:
            scale_region(body, y, x, 2.0)
            body.record(library.count_down_op(flag.mut()))
    with s.graph as graph:
        with pytest.raises(
            sg.SignatureError,
            match=r"cannot rebind node 0 of the loop body of node 1 \(`capture:scale`\): a Captured node cannot",
        ) as info:
            graph.rebind({x: dev.zeros((N,), name="x2")})
        assert "it uses `x`" in str(info.value) and "x2" not in str(info.value)
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(y.numpy(), np.full(N, 2.0))
