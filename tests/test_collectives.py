"""Collectives across processes (issue 12, DESIGN.md section 10): a 2-process program on the host
backend over scopegraph's own socket bootstrap, checked against numpy (CI, no GPU); the checks
every rank agrees on; the tensor-parallel seed model; and, with 2 GPUs, the same program on NCCL
under torchrun."""

from __future__ import annotations

import contextlib
import http.server
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, _bootstrap, library
from scopegraph._bootstrap import SingleBootstrap, SocketBootstrap
from scopegraph._driver import cuda_device_count

from .helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "dist_program.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    args: list[str], n: int = 2, timeout: float = 120, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Start ``n`` processes of ``python args`` as torchrun would (RANK, WORLD_SIZE, MASTER_*), on
    the host backend with the socket bootstrap; wait for all of them."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env(
                **{
                    "SCOPEGRAPH_DEVICE": "host",
                    "SCOPEGRAPH_BOOTSTRAP": "socket",
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(n),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "SCOPEGRAPH_DIST_TIMEOUT": "60",
                    **(env or {}),
                }
            ),
        )
        for r in range(n)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def test_a_two_process_program_on_the_host_backend() -> None:
    ranks = run_ranks([str(PROGRAM)])
    for r, done in enumerate(ranks):
        assert done.returncode == 0, f"rank {r}:\n{done.stdout}\n{done.stderr}"
        out = done.stdout
        assert f"rank {r}: ALL OK" in out
        assert f"rank {r}: graph replay 2: all_gather: ok" in out
        assert (
            f"rank {r}: graph replay 2: reduce_scatter: ok" in out and f"rank {r}: graph replay 2: broadcast: ok" in out
        )
        assert (
            f"rank {r}: recorded mismatch caught: rank {r} of 2: "
            "the ranks disagree on the collectives of the recorded graph" in out
        )
        assert f"rank {r}: eager mismatch caught" in out
        assert "all_reduce(mut total, h, sum) on comm0" in out


def test_three_ranks() -> None:
    ranks = run_ranks([str(PROGRAM)], n=3)
    for r, done in enumerate(ranks):
        assert done.returncode == 0 and f"rank {r}: ALL OK" in done.stdout, done.stdout + done.stderr


def test_a_rank_that_dies_is_an_error_not_a_hang(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys\n"
        "import scopegraph as sg\n"
        "comm = sg.init_distributed()\n"
        "x = comm.device.zeros((4,))\n"
        "if comm.rank == 1:\n"
        "    sys.exit(3)\n"
        "try:\n"
        "    comm.device.stream().run(comm.all_reduce(x.mut()))\n"
        "except sg.DistributedError as err:\n"
        "    print('caught:', str(err).splitlines()[0])\n"
    )
    ranks = run_ranks([str(script)], env={"SCOPEGRAPH_DIST_TIMEOUT": "20"}, timeout=60)
    assert ranks[1].returncode == 3
    assert "caught: rank 0 lost its connection to the other ranks" in ranks[0].stdout, ranks[0].stdout + ranks[0].stderr


def test_the_tensor_parallel_demo_matches_the_single_model() -> None:
    ranks = run_ranks(
        ["-m", "scopegraph", "demo", "--device", "host", "--gpus", "2", "--d", "64", "--layers", "2", "--tokens", "4"]
    )
    for r, done in enumerate(ranks):
        assert done.returncode == 0, f"rank {r}:\n{done.stdout}\n{done.stderr}"
    out = ranks[0].stdout
    assert "tensor parallel over 2 ranks (socket bootstrap" in out
    assert "8 tokens split over 2 ranks vs the single-GPU model" in out and ": OK" in out
    assert "2 ranks:  eager" in out and "(12 nodes a graph)" in out
    assert ranks[1].stdout == ""  # only rank 0 reports


def test_the_demo_refuses_a_wrong_process_count() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scopegraph", "demo", "--device", "host", "--gpus", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(SCOPEGRAPH_BOOTSTRAP="single"),
    )
    assert done.returncode == 2
    assert "2 needs 2 processes" in done.stderr and "torchrun --nproc-per-node 2" in done.stderr


# -- in one process: a world of one, and the checks made when ops are built --------------------


def one_rank() -> sg.Communicator:
    return sg.Communicator(sg.device("host"), SingleBootstrap())


def test_a_world_of_one() -> None:
    comm = one_rank()
    dev = comm.device
    stream = dev.stream()
    x = dev.from_numpy(np.arange(6, dtype=np.float32), name="x")
    g = dev.zeros((6,), name="g")
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(x.mut(), 1.0))
        s.record(comm.all_reduce(x.mut()))
        s.record(sg.all_gather(g.mut(), x, comm))
        s.record(library.add_scalar_op(x.mut(), 1.0))
    graph = s.graph
    labels = [n.op.label() for n in graph.nodes]
    assert labels[1:3] == [f"all_reduce(mut x, sum) on comm{comm.id}", f"all_gather(mut g, x) on comm{comm.id}"]
    graph.launch()
    np.testing.assert_array_equal(g.numpy(), np.arange(6) + 1)
    np.testing.assert_array_equal(x.numpy(), np.arange(6) + 2)
    graph.close()
    comm.close()
    with pytest.raises(sg.DistributedError, match="is closed"):
        comm.all_reduce(x.mut())


def test_one_collective_op_recorded_into_two_graphs() -> None:
    """A collective is built by the user like a kernel launch: unlike a loop or a branch (which
    its `with` block records once), it may go into several graphs."""
    comm = one_rank()
    stream = comm.device.stream()
    x = comm.device.from_numpy(np.arange(4, dtype=np.float32), name="x")
    reduce = comm.all_reduce(x.mut())
    graphs = []
    for _ in range(2):
        with CudaGraph.scope(stream) as s:
            s.record(reduce)
            s.record(library.add_scalar_op(x.mut(), 1.0))
        graphs.append(s.graph)
    for graph in graphs:
        graph.launch()
        graph.close()
    np.testing.assert_array_equal(x.numpy(), np.arange(4) + 2)
    comm.close()


def test_collectives_of_one_communicator_are_chained() -> None:
    comm = one_rank()
    dev = comm.device
    a, b = dev.zeros((4,), name="a"), dev.zeros((4,), name="b")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(comm.all_reduce(a.mut()))
        s.record(comm.all_reduce(b.mut()))  # independent data, but NCCL needs the same order on every rank
    nodes = s.graph.nodes
    assert nodes[1].deps == {0}
    s.graph.close()


def test_collectives_of_two_communicators_are_chained_too() -> None:
    """Every rank must issue them in one order, whichever communicator each belongs to: NCCL
    calls of two communicators on parallel branches could deadlock, and the host backend's
    shuffled replay order paired one rank's first all-reduce with another's second."""
    first, second = one_rank(), one_rank()
    dev = first.device
    a, b = dev.zeros((4,), name="a"), dev.zeros((4,), name="b")
    with CudaGraph.scope(dev.stream()) as s:
        s.record(first.all_reduce(a.mut()))
        s.record(second.all_reduce(b.mut()))
    assert s.graph.nodes[1].deps == {0}
    s.graph.close()


_PLACES = """
import scopegraph as sg
comm = sg.init_distributed()
dev, stream = comm.device, comm.device.stream()
x = dev.full((4,), float(comm.rank + 1), name="x")
root_src = dev.full((4,), 7.0, name="w")
src = root_src if comm.rank == 0 else None  # in place on rank 1, out of place on rank 0
stream.run(comm.all_reduce(x.mut(), src))
total = x.numpy()
with sg.CudaGraph.scope(stream) as s:
    s.record(comm.broadcast(x.mut(), root=0, src=src))  # the source matters on the root only
s.graph.launch()
print("rank", comm.rank, total.tolist(), x.numpy().tolist())
"""


def test_ranks_may_differ_in_where_their_data_is() -> None:
    """In place on one rank and out of place on another is one collective to NCCL (and a
    broadcast's source is the root's business): not a mismatch."""
    for r, done in enumerate(run_ranks(["-c", _PLACES])):
        assert done.returncode == 0, done.stderr
        assert f"rank {r} [9.0, 9.0, 9.0, 9.0] [7.0, 7.0, 7.0, 7.0]" in done.stdout


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda c, d: c.all_gather(d.zeros((3,)).mut(), d.zeros((2,))), "sizes do not fit a world of 1"),
        (lambda c, d: c.reduce_scatter(d.zeros((2,)).mut(), d.zeros((3,))), "world_size \\* dst.size = 2"),
        (lambda c, d: c.all_reduce(d.zeros((2,)).mut(), d.zeros((2,), sg.i32)), "`dst` is f32 but `src` is i32"),
        (lambda c, d: c.all_reduce(d.zeros((2,)).mut(), op="mean"), "op='mean' is not a reduction"),
        (lambda c, d: c.all_reduce(d.zeros((2,), sg.i32).mut(), op="avg"), "op='avg' needs a floating-point dtype"),
        (lambda c, d: c.broadcast(d.zeros((2,)).mut(), root=1), "root=1 is not a rank of 1"),
        (lambda c, d: c.all_reduce(d.zeros((2,))), "needs a mutable borrow"),
        (lambda c, d: c.all_reduce(d.zeros((2,), sg.i16).mut()), "cannot move i16 data"),
        (lambda c, d: sg.all_reduce(d.zeros((2,)).mut(), "comm"), "needs a Communicator, not str"),  # type: ignore[arg-type]
        (lambda c, d: c.all_gather(d.zeros((2,)).mut(), None), "`all_gather` got src=None"),
        (lambda c, d: c.reduce_scatter(d.zeros((2,)).mut(), None), "`reduce_scatter` got src=None"),
    ],
)
def test_collectives_check_their_arguments(make: object, message: str) -> None:
    comm = one_rank()
    with pytest.raises(sg.SignatureError, match=message):
        make(comm, comm.device)  # type: ignore[operator]


def test_aliasing_in_a_collective_is_a_borrow_error() -> None:
    comm = one_rank()
    x = comm.device.zeros((8,), name="x")
    with pytest.raises(sg.BorrowError, match="cannot borrow `x\\[2:6\\]` as immutable"):
        comm.all_reduce(x[0:4].mut(), src=x[2:6])
    # The whole tensor as both (it was taken as in place, which is src=None): the same rule.
    for src in (x, x[:]):
        with pytest.raises(sg.BorrowError, match=r"(?s)cannot borrow `x.*` as immutable.*leave src out"):
            comm.all_reduce(x.mut(), src)
    comm.device.stream().run(comm.all_reduce(x.mut()))


def test_a_collective_in_a_loop_body_runs_every_iteration() -> None:
    """A collective is a child graph, which loop and branch bodies hold (DESIGN.md sections 8 and
    10): the host backend runs it in every iteration. Two ranks: tests/test_bodies.py."""
    comm = one_rank()
    dev = comm.device
    flag, x = dev.zeros((1,), sg.i32, name="flag"), dev.zeros((4,), name="x")
    g = dev.zeros((4,), name="g")
    calls: list[int] = []
    original = comm.agree

    def agree(what: str, program: list[str], data: bytes = b"") -> list[bytes]:
        calls.append(len(program))
        return original(what, program, data)

    comm.agree = agree  # type: ignore[method-assign]
    with CudaGraph.scope(dev.stream()) as s:
        s.record(sg.memset(flag.mut(), 3))
        with s.while_(flag) as body:
            body.record(library.add_scalar_op(x.mut(), 1.0))
            body.record(comm.all_gather(g.mut(), x))
            body.record(library.count_down_op(flag.mut()))
    loop = s.graph.nodes[1].op
    assert isinstance(loop, sg.While)
    assert loop.body.nodes[1].op.label() == f"all_gather(mut g, x) on comm{comm.id}"
    calls.clear()
    s.graph.launch()
    assert calls == [1, 1, 1]  # one exchange an iteration
    np.testing.assert_array_equal(g.numpy(), np.full(4, 3.0))
    s.graph.close()


@pytest.mark.parametrize(
    ("ranks", "messages"),
    [
        (
            [(0, 2), (1, 3)],
            {
                0: r"rank 0 runs with WORLD_SIZE=2, but rank 1 connected with WORLD_SIZE=3",
                1: r"rank 1 runs with WORLD_SIZE=3, but rank 0 runs with WORLD_SIZE=2",
            },
        ),
        (
            [(0, 3), (1, 3), (1, 3)],
            {0: r"but a second rank connected as rank 1", 1: r"rank 0 refused the ranks that connected"},
        ),
    ],
    ids=["world-sizes", "one-rank-twice"],
)
def test_ranks_started_in_different_worlds_fail_on_every_rank(
    ranks: list[tuple[int, int]], messages: dict[int, str]
) -> None:
    """Before, rank 0 summed over its own world and the others over theirs: a silent wrong result,
    or a struct.error."""
    port = free_port()
    errors: list[tuple[int, BaseException | None]] = []

    def start(rank: int, world: int) -> None:
        try:
            SocketBootstrap(rank, world, "127.0.0.1", port, timeout=10.0).close()
        except BaseException as exc:
            errors.append((rank, exc))
        else:
            errors.append((rank, None))

    threads = [threading.Thread(target=start, args=r) for r in ranks]
    for t in threads:
        t.start()
        time.sleep(0.05)  # rank 0 listens first
    for t in threads:
        t.join(30)
    assert len(errors) == len(ranks)
    for rank, exc in errors:
        assert isinstance(exc, sg.DistributedError), (rank, exc)
        assert re.search(messages[rank], str(exc)) and "help: start every rank with the same WORLD_SIZE" in str(exc)


def test_socket_bootstrap_times_out_without_peers() -> None:
    with pytest.raises(sg.DistributedError, match="timed out after 1 s waiting for 1 rank\\(s\\) to connect"):
        SocketBootstrap(0, 2, "127.0.0.1", free_port(), timeout=1.0)
    with pytest.raises(sg.DistributedError, match="timed out after 1 s connecting to rank 0"):
        SocketBootstrap(1, 2, "127.0.0.1", free_port(), timeout=1.0)
    with pytest.raises(sg.DistributedError, match=r"timed out after 0\.5 s waiting"):  # not rounded to "0 s"
        SocketBootstrap(0, 2, "127.0.0.1", free_port(), timeout=0.5)


# -- two GPUs: the same program on NCCL, under torchrun ----------------------------------------


def _torchrun_two_gpus(*args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2`` of ``args`` on this machine's first two GPUs (skips with fewer)."""
    if cuda_device_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytest.importorskip("torch")
    pytest.importorskip("nccl.core")
    env = child_env(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env.pop("SCOPEGRAPH_DEVICE", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.sg_cuda
def test_a_two_process_program_on_two_gpus() -> None:
    done = _torchrun_two_gpus(str(PROGRAM))
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(2):
        assert f"rank {r}: ALL OK" in done.stdout
        assert f"rank {r} of 2 on cuda:{r} (torch bootstrap)" in done.stdout


@pytest.mark.sg_cuda
def test_the_tensor_parallel_demo_matches_the_one_gpu_model() -> None:
    """Issue 12: the seed model split over 2 GPUs (NCCL all-reduces inside each rank's graph) gives
    the 1-GPU model's tokens, within float tolerance (the demo validates and says OK). No --d:
    torchrun's own parser reads it as an abbreviation of its options."""
    done = _torchrun_two_gpus("-m", "scopegraph", "demo", "--gpus", "2", "--layers", "2", "--tokens", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"validation: .* split over 2 ranks vs the single-GPU model: .*: OK", done.stdout), done.stdout


def test_nccl_calls_carry_pointers_counts_and_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCCL calls a collective makes (checked here with stand-ins for nccl4py, so CI covers them):
    nccl4py's low-level bindings with each buffer's address, NCCL's count, dtype and reduction, the
    communicator's handle and the stream's."""
    import enum
    import types

    calls: list[tuple[object, ...]] = []
    low = types.ModuleType("nccl.bindings.nccl")
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        setattr(low, name, lambda *args, _n=name: calls.append((_n, *args)))

    class DataType(enum.IntEnum):
        FLOAT32 = 7
        INT32 = 2

        @classmethod
        def from_numpy_dtype(cls, dtype: np.dtype[Any]) -> DataType:
            return {"float32": cls.FLOAT32, "int32": cls.INT32}[dtype.name]

    core = types.ModuleType("nccl.core")
    core.NcclDataType = DataType  # type: ignore[attr-defined]
    core.SUM, core.PROD, core.MAX, core.MIN, core.AVG = 0, 1, 2, 3, 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nccl.core", core)
    monkeypatch.setitem(sys.modules, "nccl.bindings.nccl", low)

    class Stream:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0xABC)

    comm = one_rank()
    comm._nccl = types.SimpleNamespace(_comm="HANDLE")
    dev = comm.device
    x, y = dev.zeros((6,), name="x"), dev.zeros((6,), sg.i32, name="y")
    src, out = dev.zeros((6,), name="src"), dev.zeros((6,), name="out")
    comm.all_reduce(x.mut(), op="max")._issue(Stream())
    comm.all_reduce(y.mut())._issue(Stream())
    comm.all_gather(out.mut(), src)._issue(Stream())
    comm.reduce_scatter(out.mut(), src, op="avg")._issue(Stream())
    comm.broadcast(out.mut(), root=0, src=src)._issue(Stream())
    assert calls == [
        ("all_reduce", x.data_ptr, x.data_ptr, 6, 7, 2, "HANDLE", 0xABC),
        ("all_reduce", y.data_ptr, y.data_ptr, 6, 2, 0, "HANDLE", 0xABC),
        ("all_gather", src.data_ptr, out.data_ptr, 6, 7, "HANDLE", 0xABC),
        ("reduce_scatter", src.data_ptr, out.data_ptr, 6, 7, 4, "HANDLE", 0xABC),
        ("broadcast", src.data_ptr, out.data_ptr, 6, 7, 0, "HANDLE", 0xABC),
    ]


# -- bad input and a bad launch environment: a ScopeGraphError that names what to fix ----------


def test_init_distributed_refuses_arguments_of_the_wrong_type() -> None:
    with pytest.raises(sg.SignatureError, match=r"takes a bootstrap's name or a Bootstrap, not int 5\nhelp: pass"):
        sg.init_distributed("host", bootstrap=5)  # type: ignore[arg-type]
    for timeout in ("x", 0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(sg.SignatureError, match=r"timeout= takes a positive number of seconds(.|\n)*help: "):
            sg.init_distributed("host", bootstrap="single", timeout=timeout)  # type: ignore[arg-type]
    assert sg.init_distributed("host", bootstrap="single", check_eager=np.bool_(False)).check_eager is False  # type: ignore[arg-type]
    for check_eager in ("no", 0, None):
        with pytest.raises(sg.SignatureError, match=r"check_eager=\) takes True or False(.|\n)*help: "):
            sg.init_distributed("host", bootstrap="single", check_eager=check_eager)  # type: ignore[arg-type]
    with pytest.raises(sg.DistributedError, match=r"bootstrap='tcp' is not a bootstrap\nhelp: use one of"):
        sg.init_distributed("host", bootstrap="tcp")
    assert sg.init_distributed("host", bootstrap="single", timeout=5).world_size == 1


def _socket_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Rank 0 of 2 over the socket bootstrap, as torchrun would set it up, with ``env`` on top."""
    for name in ("SCOPEGRAPH_BOOTSTRAP_PORT", "SCOPEGRAPH_DIST_TIMEOUT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    base = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)


def test_the_socket_bootstrap_names_the_variable_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy or impossible port, an address not of this machine, a variable that is not a number:
    each a DistributedError whose help line names the environment variable, never an OSError,
    OverflowError or ValueError (and never a wait for the timeout)."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        _socket_env(monkeypatch, MASTER_PORT=str(busy.getsockname()[1]))
        with pytest.raises(sg.DistributedError, match=r"cannot listen on 127\.0\.0\.1:\d+(.|\n)*help: set MASTER_PORT"):
            sg.init_distributed("host", bootstrap="socket")
    cases = [
        ({"MASTER_PORT": "99999"}, r"MASTER_PORT='99999' is not a TCP port\nhelp: set MASTER_PORT"),
        ({"SCOPEGRAPH_BOOTSTRAP_PORT": "0"}, r"SCOPEGRAPH_BOOTSTRAP_PORT='0' is not a TCP port\nhelp: set SCOPEGRAP"),
        ({"MASTER_ADDR": "192.0.2.1"}, r"cannot listen on 192\.0\.2\.1:\d+(.|\n)*help: set MASTER_ADDR"),
        ({"RANK": "first"}, r"RANK is 'first', not a whole number\nhelp: .*set RANK"),
        ({"WORLD_SIZE": "0"}, r"a world of 0 processes\nhelp: set WORLD_SIZE"),
        (
            {"SCOPEGRAPH_DIST_TIMEOUT": "soon"},
            r"SCOPEGRAPH_DIST_TIMEOUT='soon' is not a timeout\nhelp: set SCOPEGRAPH_DIS",
        ),
    ]
    for env, message in cases:
        _socket_env(monkeypatch, **env)
        with pytest.raises(sg.DistributedError, match=message):
            sg.init_distributed("host", bootstrap="socket")
    _socket_env(monkeypatch, LOCAL_RANK="one")
    with pytest.raises(sg.DistributedError, match=r"LOCAL_RANK='one' is not a process index\nhelp: set LOCAL_RANK"):
        sg.init_distributed("cuda", bootstrap=SingleBootstrap())


def test_another_program_on_the_bootstrap_port_is_not_taken_for_a_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A web server on MASTER_PORT answered rank 1, which read "HTTP" as rank 0's WORLD_SIZE
    (1213486160) and blamed the launch environment; a stray client made rank 0 abort, and one that
    said nothing held it until the timeout."""
    with http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as web:
        threading.Thread(target=web.handle_request, daemon=True).start()
        with pytest.raises(sg.DistributedError, match=r"is not scopegraph's rank 0(.|\n)*help: set MASTER_PORT"):
            SocketBootstrap(1, 2, "127.0.0.1", web.server_address[1], timeout=10.0)
    monkeypatch.setattr(_bootstrap, "_HELLO_SECONDS", 0.2)
    port = free_port()
    ranks: list[Any] = []

    def connect() -> socket.socket:
        deadline = time.monotonic() + 10
        while True:
            try:
                return socket.create_connection(("127.0.0.1", port))
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.02)

    def stray_then_rank() -> None:
        with connect() as silent, connect() as stray:
            stray.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n")  # a whole hello's bytes
            ranks.append(SocketBootstrap(1, 2, "127.0.0.1", port, timeout=10.0))
            assert silent.fileno() >= 0  # held open, silent, until rank 1 is in

    helper = threading.Thread(target=stray_then_rank, daemon=True)
    helper.start()
    root = SocketBootstrap(0, 2, "127.0.0.1", port, timeout=10.0)
    helper.join(10)
    try:
        assert len(ranks) == 1 and root.world_size == 2
    finally:
        root.close()
        for rank in ranks:
            rank.close()


def test_clients_that_come_and_go_do_not_stretch_rank_0s_timeout() -> None:
    """Each accept restarted the full timeout: a client connecting silently every 0.3 s kept a
    rank 0 with a 1 s timeout waiting without end."""
    port = free_port()
    stop = threading.Event()

    def pester() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                stop.wait(0.3)

    threading.Thread(target=pester, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(sg.DistributedError, match="waiting for 1 rank"):
            SocketBootstrap(0, 2, "127.0.0.1", port, timeout=1.0)
    finally:
        stop.set()
    assert time.monotonic() - started < 4


def test_the_tensor_parallel_demo_refuses_a_width_the_ranks_cannot_split() -> None:
    ranks = run_ranks(["-m", "scopegraph", "demo", "--device", "host", "--gpus", "2", "--d", "65", "--layers", "1"])
    for done in ranks:
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "argument --d: d=65 does not split over 2 ranks" in done.stderr
