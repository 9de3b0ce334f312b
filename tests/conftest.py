"""Shared fixtures. The suite opts in to scopegraph's pytest plugin, as a user's project does
(it is not registered globally)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import scopegraph as sg

pytest_plugins = ["scopegraph.pytest_plugin"]


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
