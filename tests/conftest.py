"""Shared fixtures. The suite opts in to scopegraph's pytest plugin, as a user's project does
(it is not registered globally)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import scopegraph as sg

pytest_plugins = ["scopegraph.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: this suite's own name for the plugin's sg_cuda (needs a GPU)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The plugin's GPU marker was `cuda` before it was namespaced (issue 13): a test of this suite
    # written with the old name still skips cleanly without a GPU. Other projects are untouched.
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.sg_cuda)


@pytest.fixture
def builds(sg_device: sg.Device, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts backend graph builds (instantiations) made during the test."""
    calls: list[int] = []
    real = sg_device.backend.build

    def counting(nodes: object, stream: sg.Stream) -> object:
        calls.append(1)
        return real(nodes, stream)  # type: ignore[arg-type]

    monkeypatch.setattr(sg_device.backend, "build", counting)
    yield calls
