"""Every example runs, on the host backend here (and on the GPU in scripts/gpu-check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import scopegraph as sg

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "quickstart.py": [],
    "transformer_layers.py": ["--d", "128", "--layers", "2", "--tokens", "4"],
    "dataflow.py": [],
    "safety.py": [],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name: str, sg_device: sg.Device) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *EXAMPLES[name]],
        capture_output=True, text=True, timeout=300, env={**os.environ, "SCOPEGRAPH_DEVICE": str(sg_device)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_every_example_is_tested() -> None:
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(EXAMPLES)


def test_demo_runs_on_the_host_backend() -> None:
    done = subprocess.run([sys.executable, "-m", "scopegraph", "demo", "--device", "host", "--tokens", "8"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation:" in done.stdout and "OK" in done.stdout and "tokens/s" in done.stdout
