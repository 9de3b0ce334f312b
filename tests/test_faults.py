"""Faults (issue 8): a kernel that writes far out of bounds surfaces as an `sg.CudaError` that
names the launch and says the CUDA context is lost (`context_lost` True), instead of a hang.

A sticky fault poisons the whole CUDA context, so each scenario runs in a child process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import child_env

pytestmark = pytest.mark.sg_cuda

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120
MARKER = "SG-FAULT-REPORT "

CHILD = r'''
import json, sys, time
import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor

SRC = r"""
extern "C" __global__ void sg_fault_wild_write(float* out, unsigned long long addr) {
    // addr is far from any allocation (0x10): an illegal address, a sticky fault.
    *reinterpret_cast<volatile float*>(addr) = out[0];
}
"""


@sg.kernel(SRC)
def sg_fault_wild_write(out: Mut[Tensor], addr: sg.u64) -> None: ...


def report(**fields):
    print("SG-FAULT-REPORT " + json.dumps(fields), flush=True)


mode = sys.argv[1]
dev = sg.device("cuda")
stream = dev.stream()
x = dev.zeros((16,), name="x")
start = time.monotonic()
first = second = None
try:
    if mode == "eager":
        stream.run(sg_fault_wild_write[1, 1](x.mut(), 0x10))
        stream.sync()
    else:
        with CudaGraph.scope(stream) as s:
            s.record(sg.memset(x.mut(), 1.0))
            s.record(sg_fault_wild_write[1, 1](x.mut(), 0x10))
        s.graph.launch()
        s.graph.sync()
except sg.CudaError as exc:
    first = exc
except BaseException as exc:
    report(caught=type(exc).__name__, message=str(exc), elapsed=time.monotonic() - start)
    raise SystemExit(3)
if first is None:
    report(caught=None, elapsed=time.monotonic() - start)
    raise SystemExit(2)
# After a sticky fault, later calls must fail too (a CudaError, not a hang or a foreign error).
try:
    x.numpy()
except sg.CudaError as exc:
    second = exc
except BaseException as exc:
    second = exc
report(
    caught=type(first).__name__,
    message=str(first),
    context_lost=getattr(first, "context_lost", None),
    result=getattr(first, "result", None),
    second=None if second is None else type(second).__name__,
    second_message=None if second is None else str(second),
    second_result=getattr(second, "result", None),
    second_context_lost=getattr(second, "context_lost", None),
    elapsed=time.monotonic() - start,
)
'''


def run_child(mode: str) -> tuple[dict[str, object], float, subprocess.CompletedProcess[str]]:
    env = child_env(PYTHONUNBUFFERED="1")
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, mode], env=env, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"the faulting child hung for {TIMEOUT_S} s (mode {mode}); output so far:\n{exc.stdout!r}\n{exc.stderr!r}"
        )
    wall = time.monotonic() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert lines, f"the child printed no report (rc {proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report: dict[str, object] = json.loads(lines[-1][len(MARKER) :])
    return report, wall, proc


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_out_of_bounds_write_is_a_cuda_error_that_says_the_context_is_lost(mode: str) -> None:
    report, wall, proc = run_child(mode)
    detail = f"report: {report}\nstderr:\n{proc.stderr}"
    assert report["caught"] == "CudaError", detail
    message = str(report["message"])
    # Names the launch: the kernel (eager), or the kernel or the graph launch that ran it (replay).
    names = r"sg_fault_wild_write" if mode == "eager" else r"sg_fault_wild_write|graph #?\d*"
    assert re.search(names, message), f"the message does not name the launch:\n{message}"
    assert re.search(r"context.{0,40}lost|lost.{0,40}context", message, re.I | re.S), (
        f"the message does not say the context is lost:\n{message}"
    )
    assert re.search(r"restart", message, re.I), f"the message does not say the process must restart:\n{message}"
    assert re.search(r"^help: \S", message, re.M), f"the message has no `help:` line:\n{message}"
    assert re.match(r"CUDA_ERROR_\w+", str(report["result"])), detail
    assert report["context_lost"] is True, detail
    # A later call (x.numpy()) fails promptly too, as a CudaError that also says the context is lost.
    later = (
        f"the call after the fault: {report.get('second')} {report.get('second_result')}: "
        f"{report.get('second_message')}"
    )
    assert report["second"] == "CudaError", later
    assert report["second_context_lost"] is True, later
    # The child exited by itself, well within the limit: no hang at the fault or at shutdown.
    assert proc.returncode == 0, f"the child exited with {proc.returncode}\n{detail}"
    assert wall < TIMEOUT_S / 2, f"the child took {wall:.0f} s"
