"""The pytest plugin: opt-in only, and the host backend's seeded, reproducible replay order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, library
from scopegraph._backends import _host
from scopegraph._driver import cuda_device_count

ROOT = Path(__file__).resolve().parents[1]

FOREIGN_TEST = """
import pytest

@pytest.mark.cuda
def test_marked_cuda():
    pass
"""

OWN_MARKER_TEST = """
import pytest

@pytest.mark.sg_cuda
def test_needs_a_gpu():
    pass
"""

ORDER_TEST = """
import numpy as np
import scopegraph as sg
from scopegraph import CudaGraph, library

def test_orders():
    dev = sg.device("host")
    xs = [dev.zeros((4,)) for _ in range(6)]
    with CudaGraph.scope(dev.stream()) as s:
        nodes = [s.record(library.fill_op(x.mut(), float(i))) for i, x in enumerate(xs)]
    print("ORDERS", [s.graph.executable.order() for _ in range(3)])

def test_fails_on_a_device(sg_device):
    assert False

def test_fails_after_a_replay():
    dev = sg.device("host")
    x = dev.zeros((4,))
    with CudaGraph.scope(dev.stream()) as s:
        s.record(library.fill_op(x.mut(), 1.0))
    s.graph.launch()
    assert False
"""

# Fails using nothing of scopegraph, in a project that turned the plugin on.
FOREIGN_FAILURE = """
def test_fails():
    assert 1 == 2
"""


def _pytest(tmp: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "test_probe.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", *args, "test_probe.py"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_other_projects_keep_their_cuda_marker(tmp_path: Path) -> None:
    """Issue 13: the plugin changes nothing for tests that use neither its fixtures nor its own
    namespaced marker, with the plugin turned on too."""
    plain = _pytest(tmp_path, FOREIGN_TEST)
    assert "1 passed" in plain.stdout, plain.stdout
    opted_in = _pytest(tmp_path, FOREIGN_TEST, "-p", "scopegraph.pytest_plugin")
    assert "1 passed" in opted_in.stdout, opted_in.stdout


def test_the_plugins_own_marker_skips_without_a_gpu(tmp_path: Path) -> None:
    opted_in = _pytest(tmp_path, OWN_MARKER_TEST, "-p", "scopegraph.pytest_plugin", "--strict-markers")
    expected = "1 passed" if cuda_device_count() else "1 skipped"
    assert expected in opted_in.stdout, opted_in.stdout


def test_replay_order_is_seeded_shown_and_reproducible(tmp_path: Path) -> None:
    first = _pytest(tmp_path, ORDER_TEST, "-p", "scopegraph.pytest_plugin", "--sg-seed=1234")
    again = _pytest(tmp_path, ORDER_TEST, "-p", "scopegraph.pytest_plugin", "--sg-seed=1234")
    other = _pytest(tmp_path, ORDER_TEST, "-p", "scopegraph.pytest_plugin", "--sg-seed=99")
    assert "scopegraph host replay seed: 1234" in first.stdout
    assert "rerun with --sg-seed=1234 test_probe.py::test_fails_on_a_device[host]" in first.stdout
    assert "rerun with --sg-seed=1234 test_probe.py::test_fails_after_a_replay" in first.stdout
    orders = [next(line for line in run.stdout.splitlines() if "ORDERS" in line) for run in (first, again, other)]
    assert orders[0] == orders[1] != orders[2]


def test_a_test_that_uses_nothing_of_scopegraph_fails_as_without_the_plugin(tmp_path: Path) -> None:
    """Issue 13: the seed goes into the failure report of a test that uses the plugin's fixtures or
    marker, or replayed a host graph (above); a failure that has nothing to do with scopegraph is
    reported as it would be without the plugin."""
    plain = _pytest(tmp_path, FOREIGN_FAILURE)
    opted_in = _pytest(tmp_path, FOREIGN_FAILURE, "-p", "scopegraph.pytest_plugin", "--sg-seed=1234")
    assert "1 failed" in opted_in.stdout and "assert 1 == 2" in opted_in.stdout, opted_in.stdout
    assert "scopegraph host replay seed: 1234" in opted_in.stdout  # the session's header still says it
    assert "host replay seed 1234: rerun" not in opted_in.stdout, opted_in.stdout  # no section
    assert "scopegraph" not in plain.stdout
    sections = [line for line in opted_in.stdout.splitlines() if line.startswith("---")]
    assert sections == [line for line in plain.stdout.splitlines() if line.startswith("---")], opted_in.stdout


def test_each_replay_takes_another_valid_order() -> None:
    dev = sg.device("host")
    xs = [dev.zeros((4,), name=f"x{i}") for i in range(8)]
    total = dev.zeros((4,), name="total")
    with CudaGraph.scope(dev.stream()) as s:
        for i, x in enumerate(xs):
            s.record(library.fill_op(x.mut(), float(i)))
        for x in xs:
            s.record(library.axpy_op(total.mut(), x, 1.0))  # a chain after the independent fills
    with s.graph as g:
        executable = g.executable
        assert isinstance(executable, _host._HostGraph)
        _host.seed_replay_order(7)
        orders = [executable.order() for _ in range(20)]
        assert len({tuple(o) for o in orders}) > 10
        for order in orders:
            position = {node: i for i, node in enumerate(order)}
            assert all(position[d] < position[n.index] for n in g.nodes for d in n.deps)
        g.launch()
        np.testing.assert_array_equal(total.numpy(), sum(range(8)))


@pytest.mark.cuda
def test_this_suites_cuda_marker_is_the_plugins_sg_cuda(request: pytest.FixtureRequest) -> None:
    """tests/conftest.py maps this suite's `cuda` marker onto the plugin's: skipped without a GPU."""
    assert request.node.get_closest_marker("sg_cuda") is not None
    assert cuda_device_count() > 0
