"""Recording again into a graph (issue 9): ``CudaGraph.scope(stream, into=graph)`` updates the graph in
place when the topology matches ("whole") and instantiates it again when not ("rebuilt"), with
the results of a freshly recorded graph; refusals and failed recordings leave the graph as it was.
Also the bench suite that compares the ways of changing a graph (``bench --only update``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library

from .helpers import assert_stream_usable, child_env, pinned

N = 64


def chain(s: sg.Scope, x: sg.Tensor, y: sg.Tensor, scale: float, extra: int = 0) -> None:
    """x += 1; y += scale * x; then `extra` more x += 1 (a longer chain: a new topology)."""
    s.record(library.add_scalar_op(x.mut(), 1.0))
    s.record(library.axpy_op(y.mut(), x, scale))
    for _ in range(extra):
        s.record(library.add_scalar_op(x.mut(), 1.0))


def fresh(
    dev: sg.Device, x0: np.ndarray[Any, Any], y0: np.ndarray[Any, Any], scale: float, extra: int
) -> tuple[Any, Any]:
    x, y = dev.from_numpy(x0), dev.from_numpy(y0)
    with CudaGraph.scope(dev.stream()) as s:
        chain(s, x, y, scale, extra)
    with s.graph as g:
        g.launch()
        g.sync()
    return x.numpy(), y.numpy()


def test_recording_again_gives_a_fresh_graphs_results(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.from_numpy(np.arange(N, dtype=np.float32) % 7, name="x")
    y = sg_device.zeros((N,), name="y")
    with CudaGraph.scope(sg_stream) as s:
        chain(s, x, y, 1.0)
    graph = s.graph
    first_nodes = graph.nodes
    kinds = []
    plan = [(0.5, 0), (2.0, 0), (2.0, 0), (-1.0, 2), (3.0, 2), (0.25, 0), (1.0, 1), (1.5, 1)]
    for step, (scale, extra) in enumerate(plan):
        want = fresh(sg_device, x.numpy(), y.numpy(), scale, extra)
        with CudaGraph.scope(sg_stream, into=graph) as s2:
            chain(s2, x, y, scale, extra)
        assert s2.graph is graph
        kinds.append(graph.last_update)
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(x.numpy(), want[0], err_msg=f"step {step}")
        np.testing.assert_array_equal(y.numpy(), want[1], err_msg=f"step {step}")
        assert len(graph.nodes) == 2 + extra
    assert kinds == ["whole", "whole", "whole", "rebuilt", "whole", "rebuilt", "rebuilt", "whole"]
    # The earlier recording's handles still say where they were recorded, but no longer show an op
    # or edges as the graph's: those are the latest recording's (they went stale silently).
    assert [n.index for n in first_nodes] == [0, 1] and first_nodes[1].location.endswith("test_rerecord.py:28")
    for field in ("op", "deps", "programmatic"):
        with pytest.raises(sg.LifetimeError, match=r"(?s)node 1's handle, .* was replaced.*\nhelp: use graph.nodes"):
            getattr(first_nodes[1], field)
    assert repr(first_nodes[1]) == "<node 1 of a replaced recording>" and graph.nodes[1].op.label() == "axpy(mut y, x)"
    graph.close()


def test_recording_again_moves_pins_and_resets_params(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    a, b, out = (
        sg_device.full((N,), 1.0, name="a"),
        sg_device.full((N,), 2.0, name="b"),
        sg_device.zeros((N,), name="out"),
    )
    v = sg.Param("v", sg.f32, 10.0)
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_op(out.mut(), a, a))
        s.record(library.add_scalar[1, N](out.mut(), v, N))
    graph = s.graph
    graph.launch(v=1.0)
    assert pinned(a) and not pinned(b)
    with CudaGraph.scope(sg_stream, into=graph) as s2:
        s2.record(library.add_op(out.mut(), b, b))
        s2.record(library.add_scalar[1, N](out.mut(), v, N))
    assert graph.last_update == "whole"
    assert pinned(b) and not pinned(a)
    a.free()  # the graph no longer uses it
    assert graph.params == {"v": np.float32(10.0)}  # like a fresh recording
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), np.full(N, 14.0))
    graph.launch(v=0.5)
    graph.sync()
    np.testing.assert_array_equal(out.numpy(), np.full(N, 4.5))
    graph.close()
    assert not pinned(b) and not pinned(out)


def test_a_failed_recording_leaves_the_graph_unchanged(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x, other = sg_device.zeros((N,), name="x"), sg_device.zeros((N,), name="other")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    nodes = graph.nodes
    with pytest.raises(sg.NotAGraphNodeError), CudaGraph.scope(sg_stream, into=graph) as s2:
        s2.record(library.add_scalar_op(other.mut(), 5.0))
        s2.record(sg.zeros((4,)))  # type: ignore[arg-type]
    with pytest.raises(ZeroDivisionError), CudaGraph.scope(sg_stream, into=graph) as s3:
        s3.record(library.add_scalar_op(other.mut(), 5.0))
        _ = 1 / 0
    assert graph.nodes == nodes and graph.last_update is None
    assert pinned(x) and not pinned(other)
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(x.numpy(), np.ones(N))
    np.testing.assert_array_equal(other.numpy(), np.zeros(N))
    assert_stream_usable(sg_stream)
    graph.close()


@pytest.mark.parametrize("path", ["whole", "rebuilt"])
def test_a_failed_build_leaves_the_graph_unchanged(
    sg_device: sg.Device, sg_stream: sg.Stream, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    exe, nodes = graph.executable, graph.nodes

    def fail(*args: object) -> Any:
        raise sg.CudaError("cuGraphInstantiate", "CUDA_ERROR_OUT_OF_MEMORY", "injected")

    if path == "whole":
        monkeypatch.setattr(exe, "update_whole", fail)
    else:
        monkeypatch.setattr(sg_device.backend, "build", fail)
    with pytest.raises(sg.CudaError, match="injected"), CudaGraph.scope(sg_stream, into=graph) as s2:
        s2.record(library.add_scalar_op(x.mut(), 2.0))
        if path == "rebuilt":
            s2.record(library.add_scalar_op(x.mut(), 2.0))
    monkeypatch.undo()
    assert graph.executable is exe and graph.nodes == nodes and graph.last_update is None
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(x.numpy(), np.ones(N))
    assert_stream_usable(sg_stream)
    graph.close()


def test_into_refusals(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    with pytest.raises(sg.SignatureError, match="into= takes a CudaGraph, not Scope") as info:
        CudaGraph.scope(sg_stream, into=s)  # type: ignore[arg-type]
    assert "help:" in str(info.value)
    graph.close()
    with pytest.raises(sg.LifetimeError, match=r"cannot record into graph #\d+: it is closed"):
        CudaGraph.scope(sg_stream, into=graph)
    assert_stream_usable(sg_stream)


def test_one_recording_into_a_graph_at_a_time(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Two scopes recording into one graph (on two streams), or a rebind while one records into
    it: the scope's exit would replace the program either made, so both are refused, and the
    graph and both streams stay usable."""
    x, y = sg_device.zeros((N,), name="x"), sg_device.zeros((N,), name="y")
    other = sg_device.stream()
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    with CudaGraph.scope(sg_stream, into=graph) as again:
        again.record(library.add_scalar_op(x.mut(), 2.0))
        rival = CudaGraph.scope(other, into=graph)
        with pytest.raises(sg.ScopeStateError, match=rf"cannot record into graph #{graph.id}: another scope"):
            rival.__enter__()
        with pytest.raises(sg.ScopeStateError, match=rf"cannot rebind graph #{graph.id} while a scope records"):
            graph.rebind({x: y})
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(x.numpy(), 2.0)  # the recording that ran to its end
    graph.rebind({x: y})  # and once it has ended
    graph.launch()
    graph.sync()
    np.testing.assert_array_equal(y.numpy(), 2.0)
    graph.close()
    assert_stream_usable(sg_stream)
    assert_stream_usable(other)


def test_into_a_graph_of_another_device(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    from scopegraph._driver import cuda_device_count

    if cuda_device_count() == 0:
        pytest.skip("needs a second backend (a GPU)")
    x = sg_device.zeros((N,), name="x")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
    other = sg.device("host" if sg_device.is_cuda else "cuda").stream()
    with pytest.raises(sg.SignatureError, match=r"graph #\d+ lives on"), s.graph:
        CudaGraph.scope(other, into=s.graph)


def test_a_program_order_recording_is_a_new_topology(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    p, q = sg_device.zeros((N,), name="p"), sg_device.zeros((N,), name="q")
    with CudaGraph.scope(sg_stream) as s:
        s.record(library.fill_op(p.mut(), 1.0))
        s.record(library.fill_op(q.mut(), 2.0))
    with s.graph as graph:
        with CudaGraph.scope(sg_stream, order="program", into=graph) as s2:
            s2.record(library.fill_op(p.mut(), 3.0))
            s2.record(library.fill_op(q.mut(), 4.0))
        assert graph.last_update == "rebuilt" and graph.order == "program" and graph.edges == [(0, 1)]
        graph.launch()
        graph.sync()
        assert p.numpy()[0] == 3.0 and q.numpy()[0] == 4.0


def test_the_pdl_flag_changes_the_topology_only_where_edges_can_be_programmatic(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """DESIGN section 7: on the host backend and below sm_90 the flag changes nothing, so a
    re-recording with it toggled is still a whole-graph update there."""
    p = sg_device.zeros((N,), name="p")
    with CudaGraph.scope(sg_stream, pdl=True) as s:
        s.record(library.fill_op(p.mut(), 1.0))
        s.record(library.add_scalar_op(p.mut(), 1.0))
    with s.graph as graph:
        programmatic = graph.executable.pdl
        with CudaGraph.scope(sg_stream, pdl=False, into=graph) as s2:
            s2.record(library.fill_op(p.mut(), 3.0))
            s2.record(library.add_scalar_op(p.mut(), 1.0))
        assert graph.last_update == ("rebuilt" if programmatic else "whole")
        graph.launch()
        graph.sync()
        assert p.numpy()[0] == 4.0


def test_bench_update_suite_runs_on_the_host(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scopegraph",
            "bench",
            "--quick",
            "--only",
            "update",
            "--device",
            "host",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "bench.json").read_text())["update"]
    assert result["kernels"] == 20 and result["agree"] is True
    assert set(result["per_iteration_s"]) == {"no_graph", "recapture", "whole_update", "node_update", "rebind"}
    assert all(v > 0 for v in result["per_iteration_s"].values())
    table = (tmp_path / "bench.txt").read_text()
    assert "changing one kernel's argument every iteration" in table and "node update" in table


def test_body_handles_of_a_replaced_recording_fail_clearly_too(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Only the top-level handles were superseded: a loop body's kept showing its old op."""
    flag, y = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((N,), name="y")

    def program(s: sg.Scope) -> sg.RecordedNode:
        with s.while_(flag, max_iterations=4) as body:
            node = body.record(library.add_scalar_op(y.mut(), 1.0))
            body.record(library.count_down_op(flag.mut()))
        return node

    with CudaGraph.scope(sg_stream) as s:
        kept = program(s)
    graph = s.graph
    with CudaGraph.scope(sg_stream, into=graph) as s2:
        program(s2)
    with pytest.raises(sg.LifetimeError, match="names a node of a recording that was replaced"):
        assert kept.op is None
    graph.close()


def looped(s: sg.Scope, flag: sg.Tensor, x: sg.Tensor, y: sg.Tensor, scale: float, bound: int, extra: int = 0) -> None:
    """flag = 3; while flag (at most `bound` times): y += scale * x, flag -= 1; then if flag: x += 1
    (never), else: y += 1, plus `extra` more of it (a new topology of the branch's body)."""
    s.record(sg.memset(flag.mut(), 3))
    with s.while_(flag, max_iterations=bound) as body:
        body.record(library.axpy_op(y.mut(), x, scale))
        body.record(library.count_down_op(flag.mut()))
    with s.if_else(flag) as (then, otherwise):
        then.record(library.add_scalar_op(x.mut(), 1.0))
        for _ in range(1 + extra):
            otherwise.record(library.add_scalar_op(y.mut(), 1.0))


def test_recording_again_with_loops_and_branches_updates_in_place(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """A recording with loops and branches was always instantiated again. The same topology now
    goes in place (its nodes updated one by one: a new definition would bring new conditional
    handles), with the new recording's tensors, scalars, loop counter and bound; a body of another
    shape is rebuilt. Results match a freshly recorded graph's at each step."""
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    x = sg_device.from_numpy(np.arange(N, dtype=np.float32) % 5, name="x")
    ys = [sg_device.zeros((N,), name=f"y{i}") for i in range(2)]

    def fresh(y: sg.Tensor, scale: float, bound: int, extra: int) -> Any:
        copy = sg_device.from_numpy(y.numpy())
        with CudaGraph.scope(sg_stream) as s:
            looped(s, flag, x, copy, scale, bound, extra)
        with s.graph as g:
            g.launch()
            g.sync()
        return copy.numpy()

    with CudaGraph.scope(sg_stream) as s:
        looped(s, flag, x, ys[0], 1.0, 8)
    graph = s.graph
    plan = [(1, 2.0, 8, 0), (0, 0.5, 4, 0), (1, -1.0, 5, 1), (1, 3.0, 5, 1)]
    kinds = []
    for step, (which, scale, bound, extra) in enumerate(plan):
        y = ys[which]
        want = fresh(y, scale, bound, extra)
        with CudaGraph.scope(sg_stream, into=graph) as s2:
            looped(s2, flag, x, y, scale, bound, extra)
        kinds.append(graph.last_update)
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(y.numpy(), want, err_msg=f"step {step}")
        assert pinned(y) and not pinned(ys[1 - which])  # the pins moved with the recording
    assert kinds == ["whole", "whole", "rebuilt", "whole"]
    # The bound is the new recording's: 3 iterations past a bound of 2 stop the loop and say so.
    with CudaGraph.scope(sg_stream, into=graph) as s3:
        looped(s3, flag, x, ys[0], 1.0, 2, 1)
    assert graph.last_update == "whole"
    with pytest.raises(sg.LoopLimitError, match="max_iterations=2"):  # the host raises at once, a GPU at sync
        graph.launch()
        graph.sync()
    graph.close()
    assert_stream_usable(sg_stream)


def test_a_recording_with_loops_and_a_captured_region_is_rebuilt() -> None:
    """Node updates cannot change a captured region's child graph, and a recording with loops goes
    in place only by node updates: it is instantiated again (decided alike on every backend)."""
    dev = sg.device("host")
    stream = dev.stream()
    flag, y = dev.zeros((1,), sg.i32, name="flag"), dev.zeros((N,), name="y")

    def program(s: sg.Scope) -> None:
        with s.while_(flag) as body:
            body.record(library.count_down_op(flag.mut()))
        with s.capture(writes=[y.mut()], host=lambda out: out.fill(2.0)):
            pass

    with CudaGraph.scope(stream) as s:
        program(s)
    with s.graph as graph, CudaGraph.scope(stream, into=graph) as s2:
        program(s2)
    assert graph.last_update == "rebuilt"


@pytest.mark.parametrize("build_fails", [False, True])
def test_a_refused_node_update_of_a_looped_recording_leaves_the_graph_as_it_was(
    sg_device: sg.Device, sg_stream: sg.Stream, monkeypatch: pytest.MonkeyPatch, build_fails: bool
) -> None:
    """A recording with loops goes in by node updates; one the backend refuses part way (a driver
    may) puts back the ones made, and the recording is instantiated instead. If that fails too,
    the graph is exactly as it was: it runs and pins the old recording's tensors, not the new."""
    flag = sg_device.zeros((1,), sg.i32, name="flag")
    x = sg_device.from_numpy(np.arange(N, dtype=np.float32) % 5, name="x")
    y_old, y_new = sg_device.zeros((N,), name="y_old"), sg_device.zeros((N,), name="y_new")
    with CudaGraph.scope(sg_stream) as s:
        looped(s, flag, x, y_old, 1.0, 8)
    graph = s.graph
    exe = graph.executable
    real_update = exe.update_node
    updated: list[int] = []

    def refuse_the_sixth(index: int, op: Any, values: Any) -> None:
        updated.append(index)
        if len(updated) == 6:  # after the loop body's nodes: they would write y_new
            raise sg.CudaError("a node update", "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE")
        real_update(index, op, values)

    monkeypatch.setattr(exe, "update_node", refuse_the_sixth)
    if build_fails:

        def out_of_memory(*args: object) -> None:
            raise sg.CudaError("instantiating the graph", "CUDA_ERROR_OUT_OF_MEMORY")

        monkeypatch.setattr(sg_device.backend, "build", out_of_memory)
        with pytest.raises(sg.CudaError, match="OUT_OF_MEMORY"), CudaGraph.scope(sg_stream, into=graph) as s2:
            looped(s2, flag, x, y_new, 2.0, 8)
        assert graph.executable is exe and graph.last_update is None and pinned(y_old) and not pinned(y_new)
        assert updated[6:] == [0, 1, 2, 3, 4, 5]  # the updates made before the refusal, and the refused one, put back
    else:
        with CudaGraph.scope(sg_stream, into=graph) as s2:
            looped(s2, flag, x, y_new, 2.0, 8)
        assert graph.last_update == "rebuilt" and graph.executable is not exe and pinned(y_new) and not pinned(y_old)
    monkeypatch.undo()
    graph.launch()
    graph.sync()
    written, untouched = (y_old, y_new) if build_fails else (y_new, y_old)
    scale = 1.0 if build_fails else 2.0
    np.testing.assert_array_equal(written.numpy(), 3 * scale * (np.arange(N, dtype=np.float32) % 5) + 1)
    np.testing.assert_array_equal(untouched.numpy(), np.zeros(N, np.float32))
    graph.close()


def test_a_looped_graph_taken_in_place_takes_params_rebinds_and_more_recordings(
    sg_device: sg.Device, sg_stream: sg.Stream
) -> None:
    """After a loop's recording went in place, the graph's later changes act on it: a parameter in
    the loop's nested body, a rebind of the tensor it writes, and one more recording in place."""
    flag, inner = sg_device.zeros((1,), sg.i32, name="flag"), sg_device.zeros((1,), sg.i32, name="inner")
    x = sg_device.from_numpy(np.arange(N, dtype=np.float32) % 3, name="x")
    ys = [sg_device.zeros((N,), name=f"y{i}") for i in range(3)]

    def program(s: sg.Scope, y: sg.Tensor) -> None:
        """flag = 2; while flag: (inner = 2; while inner: y += scale * x, inner -= 1), flag -= 1."""
        s.record(sg.memset(flag.mut(), 2))
        with s.while_(flag, max_iterations=4) as outer:
            outer.record(sg.memset(inner.mut(), 2))
            with outer.while_(inner) as body:
                body.record(library.axpy[1, N](y.mut(), x, sg.Param("scale", sg.f32, 1.0), N))
                body.record(library.count_down_op(inner.mut()))
            outer.record(library.count_down_op(flag.mut()))

    def replay(graph: CudaGraph, scale: float | None = None) -> None:
        graph.launch() if scale is None else graph.launch(scale=scale)
        graph.sync()

    with CudaGraph.scope(sg_stream) as s:
        program(s, ys[0])
    graph = s.graph
    with CudaGraph.scope(sg_stream, into=graph) as s2:
        program(s2, ys[1])
    assert graph.last_update == "whole" and graph.params == {"scale": np.float32(1.0)}
    x_np = x.numpy()
    replay(graph, scale=0.5)  # 4 iterations in all: y1 = 4 * 0.5 * x
    graph.rebind({ys[1]: ys[2]})
    replay(graph)  # scale stays 0.5: y2 = 2 * x
    with CudaGraph.scope(sg_stream, into=graph) as s3:
        program(s3, ys[0])
    assert graph.last_update == "whole"
    replay(graph)  # scale back at its default: y0 = 4 * x
    for y, want in zip(ys, (4 * x_np, 2 * x_np, 2 * x_np), strict=True):
        np.testing.assert_array_equal(y.numpy(), want)
    assert pinned(ys[0]) and not pinned(ys[1]) and not pinned(ys[2])
    graph.close()
