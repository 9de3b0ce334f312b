"""Every example runs, on the host backend here (and on the GPU in scripts/gpu-check)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scopegraph as sg

from .helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "quickstart.py": [],
    "transformer_layers.py": ["--d", "128", "--layers", "2", "--tokens", "4"],
    "dataflow.py": [],
    "safety.py": [],
    "shape_cache.py": [],
    "param_update.py": [],
    "decode_loop.py": ["--d", "64", "--layers", "2", "--tokens", "8"],
    "torch_matmul.py": [],
    "cupy_kernel.py": [],
}


# What each example claims, as lines (or regular expressions) its output must contain.
CLAIMS: dict[str, list[str]] = {
    "quickstart.py": [r"y = \[ 0\.  6\. 12\. 18\. 24\. 30\. 36\. 42\.\]", r"n0 \[label="],
    "safety.py": [
        r"--- allocating inside a graph: NotAGraphNodeError\ncannot record `sg.zeros` in a graph",
        r"--- aliasing a write with a read: BorrowError\ncannot borrow `x\[256:768\]` as immutable",
        r"--- writing frozen weights: BorrowError\ncannot borrow `weights` as mutable in `fill`: it is frozen",
        r"--- eager work on the recording stream: ScopeStateError\ncannot run `memset` on stream #\d+ while a scope",
        r"--- freeing a tensor a live graph uses: LifetimeError\ncannot free `x` while it is in use",
        r"the stream is still usable",
    ],
    "dataflow.py": [
        r"dataflow: 200 nodes, 4 root\(s\), 196 edges",
        r" program: 200 nodes, 1 root\(s\), 199 edges",
    ],
    "decode_loop.py": [
        r"2 layers, d=64, on \S+: decode graph = memset\(mut position, 0\),"
        r" memset\(mut more, 1\), while\(more, max 8\) \[11 nodes\]",
        r"8 tokens in one launch equal 8 launches of the one-token graph: yes; vs float64 numpy: \d\.\d\de-0[5-9]",
        r"one launch: +\d+\.\d tokens/s; 8 launches: +\d+\.\d tokens/s -> \d+\.\d\dx",
        r"--- a runaway loop: LoopLimitError\nthe loop `while\(stuck\)`"
        r" recorded at \S+decode_loop.py:\d+ ran max_iterations=3 iterations",
    ],
    "shape_cache.py": [
        r"40 requests, sizes 9\.\.245, buckets \(64, 128, 256\)",
        r"hits=30 misses=10 evictions=8 cached=\[256, 128\]",
        r"results matching numpy: 40/40",
    ],
    "param_update.py": [
        r"sg\.Param: 50 steps, last_update=nodes, graph\.params=\{'scale': 1\.5\}, matches eager: True",
        r"rebind: 50 steps, last_update=nodes, last node: axpy\(mut y, input1\), matches eager: True",
        r"into=: 50 steps, last_update=whole, matches eager: True",
    ],
    # On a GPU with PyTorch (CuPy) the region is captured and checked against PyTorch (CuPy) eager;
    # on the host backend it runs its host callable and is checked against numpy.
    "torch_matmul.py": [
        r"on \S+: graph nodes: add_scalar\(mut a\), capture:matmul\(mut c, a, b\)( \[\d+ nodes\])?, axpy\(mut y, c\)",
        r"the region (ran PyTorch's torch\.matmul \(cuBLAS\), captured as one child-graph node"
        r"|runs its host callable \(numpy\) on the host backend)",
        r"3 replays: y vs (PyTorch eager|numpy): max rel\. error \d\.\de[-+]\d\d: OK",
    ],
    "cupy_kernel.py": [
        r"on \S+: graph nodes: add_scalar\(mut x\), capture:square_plus\(mut out, x\)( \[\d+ nodes\])?,"
        r" axpy\(mut acc, out\)",
        r"the region (ran a CuPy ElementwiseKernel, captured as one child-graph node"
        r"|runs its host callable \(numpy\) on the host backend)",
        r"4 replays: acc vs (CuPy eager|numpy): max rel\. error \d\.\de[-+]\d\d: OK",
    ],
    "transformer_layers.py": [
        r"2 layers, d=128, on \S+: 10 graph nodes",
        r"graph vs eager: 0\.00e\+00; graph vs float64 numpy: \d\.\d\de-0[5-9]",
    ],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_and_shows_what_it_claims(name: str, sg_device: sg.Device) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *EXAMPLES[name]],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(SCOPEGRAPH_DEVICE=str(sg_device)),
    )
    assert done.returncode == 0, done.stderr
    assert "NOT CAUGHT" not in done.stdout
    for claim in CLAIMS[name]:
        assert re.search(claim, done.stdout), f"{name} should print {claim!r}; it printed:\n{done.stdout}"
    library = FOREIGN.get(name)
    if sg_device.is_cuda and library is not None and importlib.util.find_spec(library) is not None:
        # On a GPU with the library, the foreign work really was captured and checked against it.
        assert "captured as one child-graph node" in done.stdout and " eager: max rel. error" in done.stdout


# The examples whose region captures another library's work when that library is installed.
FOREIGN = {"torch_matmul.py": "torch", "cupy_kernel.py": "cupy"}


def test_every_example_is_tested() -> None:
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(EXAMPLES) == set(CLAIMS)


def test_demo_runs_on_the_host_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scopegraph", "demo", "--device", "host", "--tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation:" in done.stdout and "OK" in done.stdout and "tokens/s" in done.stdout
