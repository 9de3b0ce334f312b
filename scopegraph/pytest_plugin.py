"""pytest support for programs that use scopegraph (registered through the ``pytest11`` entry point).

Fixtures:

- ``sg_device``: a Device, once per backend: ``host``, and ``cuda`` where a driver and GPU exist.
  Tests using it run on every backend; the CUDA run is marked ``cuda`` and skips cleanly without
  a driver. ``--sg-backend=host`` (or ``cuda``) restricts the run to one backend.
- ``sg_stream``: a new stream on ``sg_device``.

Marker ``@pytest.mark.cuda``: the test needs a GPU; it is skipped where no driver is present.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._device import Device, device
from ._driver import cuda_device_count
from ._stream import Stream

BACKENDS = ("host", "cuda")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sg-backend",
        action="append",
        choices=BACKENDS,
        default=None,
        help="run scopegraph's sg_device tests on this backend only (repeatable; default: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: the test needs an NVIDIA driver and GPU; skipped without one")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sg_device" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--sg-backend") or BACKENDS
        params = [pytest.param(b, marks=[pytest.mark.cuda] if b == "cuda" else [], id=b) for b in chosen]
        metafunc.parametrize("sg_device", params, indirect=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is not None and cuda_device_count() == 0:
        pytest.skip("needs an NVIDIA driver and GPU (none found)")


@pytest.fixture
def sg_device(request: pytest.FixtureRequest) -> Device:
    return device(getattr(request, "param", None))


@pytest.fixture
def sg_stream(sg_device: Device) -> Iterator[Stream]:
    stream = sg_device.stream()
    yield stream
    stream.sync()
