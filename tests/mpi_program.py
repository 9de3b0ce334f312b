"""Multi-rank programs that tests/test_bootstrap_mpi.py starts under ``mpiexec -n N`` (one process
per rank, mpi4py's bootstrap):

    mpiexec -n 2 python tests/mpi_program.py OUT PROGRAM

Each rank writes its output, stdout and stderr, to ``OUT/rank<R>.txt``: mpiexec forwards the ranks'
output as it comes, so lines of different ranks run into each other. PROGRAM is one of:

- ``collectives``: tests/dist_program.py (every collective eagerly and in graphs, checked against
  numpy on every rank, and the mismatches it catches); the last line is ``rank R: ALL OK``;
- ``exchanges``: the bootstrap's allgather itself, with sizes that differ between ranks; the last
  line is ``rank R: ALL OK``;
- ``skips-a-scope``: the last rank records no graph where the others record one;
- ``leaves``: the last rank ends before the first collective, which the others wait for;
- ``not-running`` (one process, no mpiexec needed): init_distributed before MPI.Init() and a
  collective after MPI.Finalize().

The error programs print ``caught <class>: <message>`` for the error each rank gets.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph
from scopegraph._bootstrap import from_env

# Set by mpirun in every process it starts: Open MPI, MPICH and Intel MPI (PMI), PMIx launchers.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank as mpirun set it in the environment (0 without mpirun)."""
    return next((int(os.environ[name]) for name in RANK_VARIABLES if name in os.environ), 0)


def caught(err: Exception) -> None:
    print(f"caught {type(err).__name__}: {err}", flush=True)


def exchanges() -> int:
    boot = from_env()
    r, n = boot.rank, boot.world_size
    print(f"rank {r} of {n}: {boot.kind} bootstrap", flush=True)
    cases = {
        "nothing": (b"", [b""] * n),
        "one byte each": (bytes([r]), [bytes([k]) for k in range(n)]),
        "a size of its own": (bytes([r]) * (1000 * r + 1), [bytes([k]) * (1000 * k + 1) for k in range(n)]),
        "megabytes": (bytes([r]) * (3 << 20), [bytes([k]) * (3 << 20) for k in range(n)]),
    }
    failed = 0
    for what, (mine, want) in cases.items():
        got = boot.allgather(mine)
        ok = got == want
        failed += not ok
        print(f"rank {r}: {what}: {'ok' if ok else f'WRONG: got sizes {[len(g) for g in got]}'}", flush=True)
    boot.close()
    print(f"rank {r}: {'ALL OK' if not failed else f'FAILED ({failed})'}", flush=True)
    return 1 if failed else 0


def skips_a_scope() -> int:
    comm = sg.init_distributed()
    dev, stream = comm.device, comm.device.stream()
    x = dev.full((4,), 1.0, name="x")
    try:
        if comm.rank != comm.world_size - 1:
            with CudaGraph.scope(stream) as s:
                s.record(comm.all_reduce(x.mut()))
        comm.barrier()
        print("NOT CAUGHT", flush=True)
    except sg.CollectiveMismatchError as err:
        caught(err)
    # every rank made one exchange: the communicator still pairs them
    stream.run(comm.all_reduce(x.mut()))
    ok = bool(np.array_equal(x.numpy(), np.full(4, comm.world_size, np.float32)))
    print(f"after the mismatch: {'ok' if ok else f'WRONG: {x.numpy()}'}", flush=True)
    return 0 if ok else 1


def leaves() -> int:
    comm = sg.init_distributed()
    if comm.rank == comm.world_size - 1:
        print("leaving", flush=True)
        return 0
    x = comm.device.zeros((4,), name="x")
    stream = comm.device.stream()
    for _ in range(2):  # the first times out; the second is refused (the first is still pending)
        try:
            stream.run(comm.all_reduce(x.mut()))
            print("NOT CAUGHT", flush=True)
        except sg.DistributedError as err:
            caught(err)
    return 0


def not_running() -> int:
    """Before MPI_Init and after MPI_Finalize MPI aborts the process on any call: the bootstrap
    refuses first."""
    importlib.import_module("mpi4py").rc.initialize = False  # mpi4py is optional: not for mypy to find
    mpi = importlib.import_module("mpi4py.MPI")
    try:
        sg.init_distributed(bootstrap="mpi")
        print("NOT CAUGHT", flush=True)
    except sg.DistributedError as err:
        caught(err)
    mpi.Init()
    comm = sg.init_distributed(bootstrap="mpi")
    print(f"a world of {comm.world_size}", flush=True)
    mpi.Finalize()
    for start in (comm.barrier, lambda: sg.init_distributed(bootstrap="mpi")):
        try:
            start()
            print("NOT CAUGHT", flush=True)
        except sg.DistributedError as err:
            caught(err)
    return 0


def main() -> int:
    out, program = Path(sys.argv[1]), sys.argv[2]
    with open(out / f"rank{launched_rank()}.txt", "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    if program == "collectives":
        dist_program = importlib.import_module("dist_program")  # beside this file, on sys.path
        return int(dist_program.main())
    run = {"exchanges": exchanges, "skips-a-scope": skips_a_scope, "leaves": leaves, "not-running": not_running}
    return run[program]()


if __name__ == "__main__":
    sys.exit(main())
