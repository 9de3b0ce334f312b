"""pytest support for programs that use scopegraph.

A project opts in (nothing is registered for other projects): ``pytest_plugins =
["scopegraph.pytest_plugin"]`` in its top-level ``conftest.py``, or ``pytest -p
scopegraph.pytest_plugin``.

Fixtures:

- ``sg_device``: a Device, once per backend: ``host``, and ``cuda`` where a driver and GPU exist.
  Tests using it run on every backend; the CUDA run is marked ``sg_cuda`` and skips cleanly
  without a driver. ``--sg-backend=host`` (or ``cuda``) restricts the run to one backend.
- ``sg_stream``: a new stream on ``sg_device``.

Marker ``@pytest.mark.sg_cuda``: the test needs a GPU; it is skipped where no driver is present.
The marker is scopegraph's own (namespaced like the fixtures): a project's ``cuda`` marker, or any
other, means what it meant before.

Host replay order: the host backend replays graphs in a random valid topological order, so a
missing dependency edge fails a test instead of hiding behind record order. The order generator
is reseeded before each test from the session seed and the test's id; the seed is shown in the
report header and in the report of every failing test that uses the fixtures or the marker, or
replayed a host graph, and ``--sg-seed=N`` (or ``SCOPEGRAPH_HOST_SEED=N``) replays the same orders.
Other tests' reports are left as they were.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Generator, Iterator

import pytest

from ._backends import _host
from ._device import Device, device
from ._driver import cuda_device_count
from ._stream import Stream

BACKENDS = ("host", "cuda")
# The fixtures this plugin defines: a test that uses one (itself or through another fixture) is a
# scopegraph test.
FIXTURES = ("sg_device", "sg_stream")
# The replay-order seed each test started with (see pytest_runtest_setup).
_TEST_SEED = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sg-backend",
        action="append",
        choices=BACKENDS,
        default=None,
        help="run scopegraph's sg_device tests on this backend only (repeatable; default: all)",
    )
    parser.addoption(
        "--sg-seed",
        type=int,
        default=None,
        help="seed of the host backend's random replay orders (default: SCOPEGRAPH_HOST_SEED, else random)",
    )


_session_seed = 0


def pytest_configure(config: pytest.Config) -> None:
    global _session_seed
    config.addinivalue_line("markers", "sg_cuda: the test needs an NVIDIA driver and GPU; skipped without one")
    _session_seed = _host.seed_replay_order(config.getoption("--sg-seed"))


def pytest_report_header(config: pytest.Config) -> str:
    return f"scopegraph host replay seed: {_session_seed} (rerun with --sg-seed={_session_seed})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _seed_matters(item):
        report.sections.append(
            ("scopegraph", f"host replay seed {_session_seed}: rerun with --sg-seed={_session_seed} {item.nodeid}")
        )
    return report


def _seed_matters(item: pytest.Item) -> bool:
    """Whether the replay seed is part of ``item``'s story: it uses the plugin's fixtures or marker,
    or it drew host replay orders (a test that builds graphs on sg.device("host") itself). Other
    tests' failures are reported as if the plugin were not there (issue 13)."""
    if item.get_closest_marker("sg_cuda") is not None:
        return True
    if any(name in FIXTURES for name in getattr(item, "fixturenames", ())):
        return True
    seed = item.stash.get(_TEST_SEED, None)
    # The generator has moved on from where the test's seed put it: the test replayed a graph.
    return seed is not None and _host._order.getstate() != random.Random(seed).getstate()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sg_device" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--sg-backend") or BACKENDS
        params = [pytest.param(b, marks=[pytest.mark.sg_cuda] if b == "cuda" else [], id=b) for b in chosen]
        metafunc.parametrize("sg_device", params, indirect=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("sg_cuda") is not None and cuda_device_count() == 0:
        pytest.skip("needs an NVIDIA driver and GPU (none found)")
    # Each test's orders depend only on the seed and the test, not on which tests ran before.
    item.stash[_TEST_SEED] = _host.seed_replay_order(_session_seed ^ zlib.crc32(item.nodeid.encode()))


@pytest.fixture
def sg_device(request: pytest.FixtureRequest) -> Device:
    return device(getattr(request, "param", None))


@pytest.fixture
def sg_stream(sg_device: Device) -> Iterator[Stream]:
    stream = sg_device.stream()
    yield stream
    stream.sync()
