"""A multi-rank program that tests/test_collectives.py and tests/test_bootstrap_mpi.py launch:
one process per rank.

On the host backend (CI) it is started with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and
SCOPEGRAPH_BOOTSTRAP=socket, or by ``mpiexec -n N`` (the mpi bootstrap); on GPUs with
``torchrun --nproc-per-node 2`` (NCCL through nccl4py).
Every result is checked against numpy; each check prints one line, and the last line is
``rank R: ALL OK`` when every check passed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]
failed = 0


def check(rank: int, what: str, got: NDArray, want: NDArray) -> None:
    global failed
    ok = got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-6, atol=1e-6))
    failed += not ok
    print(f"rank {rank}: {what}: {'ok' if ok else f'WRONG: got {got}, want {want}'}", flush=True)


def total_of(arrays: list[NDArray]) -> NDArray:
    out = arrays[0].copy()
    for a in arrays[1:]:
        out = out + a
    return out


def main() -> int:
    comm = sg.init_distributed()
    dev, r, n = comm.device, comm.rank, comm.world_size
    stream = dev.stream()
    print(f"rank {r} of {n} on {dev} ({comm.bootstrap.kind} bootstrap)", flush=True)

    def mine(k: int) -> NDArray:
        return (np.arange(8, dtype=np.float32) + 10 * k).astype(np.float32)

    # -- eager ------------------------------------------------------------------------------
    x = dev.from_numpy(mine(r), name="x")
    stream.run(comm.all_reduce(x.mut()))
    stream.sync()
    check(r, "eager all_reduce (in place)", x.numpy(), total_of([mine(k) for k in range(n)]))

    src = dev.from_numpy(mine(r), name="src")
    top = dev.zeros((8,), name="top")
    stream.run(comm.all_reduce(top.mut(), src=src, op="max"))
    check(r, "eager all_reduce max", top.numpy(), mine(n - 1))

    gathered = dev.zeros((n * 8,), name="gathered")
    stream.run(comm.all_gather(gathered.mut(), src))
    check(r, "eager all_gather", gathered.numpy(), np.concatenate([mine(k) for k in range(n)]))

    big = dev.from_numpy(np.tile(mine(r), n), name="big")
    part = dev.zeros((8,), name="part")
    stream.run(comm.reduce_scatter(part.mut(), big))
    check(r, "eager reduce_scatter", part.numpy(), total_of([mine(k) for k in range(n)]))

    b = dev.from_numpy(mine(r), name="b")
    stream.run(comm.broadcast(b.mut(), root=n - 1))
    check(r, "eager broadcast", b.numpy(), mine(n - 1))

    # -- a graph: scopegraph kernels and collectives, ordered by their borrows ---------------
    h = dev.from_numpy(mine(r), name="h")
    total = dev.zeros((8,), name="total")
    z = dev.zeros((8,), name="z")
    everyone = dev.zeros((n * 8,), name="everyone")
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(h.mut(), 1.0))  # h += 1
        s.record(comm.all_reduce(total.mut(), src=h))  # total = sum over ranks of h
        s.record(library.axpy_op(z.mut(), total, 0.5))  # z += total / 2
        s.record(comm.all_gather(everyone.mut(), z))  # everyone = [z of rank 0, z of rank 1, ...]
    graph = s.graph
    print(f"rank {r}: graph nodes: {', '.join(node.op.label() for node in graph.nodes)}", flush=True)
    hs = [mine(k) for k in range(n)]
    zs: NDArray = np.zeros(8, np.float32)
    for step in range(3):
        graph.launch()
        graph.sync()
        hs = [v + 1 for v in hs]
        zs = zs + 0.5 * total_of(hs)
        check(r, f"graph replay {step}: all_reduce", total.numpy(), total_of(hs))
        check(r, f"graph replay {step}: all_gather", everyone.numpy(), np.concatenate([zs] * n))
    graph.close()

    # -- a graph of the other two: reduce_scatter and broadcast between kernels ----------------
    spread = dev.from_numpy(np.tile(mine(r), n), name="spread")
    piece, shared = dev.zeros((8,), name="piece"), dev.from_numpy(mine(r), name="shared")
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(spread.mut(), 1.0))  # spread += 1
        s.record(comm.reduce_scatter(piece.mut(), spread))  # piece = this rank's slice of the sum
        s.record(library.add_scalar_op(shared.mut(), float(r)))  # shared += rank
        s.record(comm.broadcast(shared.mut(), root=n - 1))  # shared = the last rank's
    spreads, last = [mine(k) for k in range(n)], mine(n - 1)
    with s.graph as graph:
        for step in range(3):
            graph.launch()
            graph.sync()
            spreads = [v + 1 for v in spreads]
            last = last + (n - 1)
            check(r, f"graph replay {step}: reduce_scatter", piece.numpy(), total_of(spreads))
            check(r, f"graph replay {step}: broadcast", shared.numpy(), last)

    # -- mismatches are errors on every rank, not hangs ---------------------------------------
    try:
        with CudaGraph.scope(stream) as s:
            s.record(comm.all_reduce(x.mut() if r == 0 else x[0:4].mut()))
        print(f"rank {r}: recorded mismatch: NOT CAUGHT", flush=True)
        failed_extra = 1
    except sg.CollectiveMismatchError as err:
        print(f"rank {r}: recorded mismatch caught: {str(err).splitlines()[0]}", flush=True)
        failed_extra = 0
    try:
        op = comm.all_reduce(x.mut()) if r == 0 else comm.broadcast(x.mut())
        stream.run(op)
        print(f"rank {r}: eager mismatch: NOT CAUGHT", flush=True)
        failed_extra += 1
    except sg.CollectiveMismatchError as err:
        print(f"rank {r}: eager mismatch caught: {str(err).splitlines()[0]}", flush=True)

    # the stream and the communicator still work
    one = dev.full((4,), 1.0, name="one")
    stream.run(comm.all_reduce(one.mut()))
    check(r, "after the mismatches", one.numpy(), np.full(4, n, np.float32))
    comm.barrier()
    comm.close()
    if failed or failed_extra:
        print(f"rank {r}: FAILED ({failed + failed_extra})", flush=True)
        return 1
    print(f"rank {r}: ALL OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
