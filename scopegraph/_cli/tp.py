"""Tensor parallelism: the seed's layer stack split over N processes, one GPU each (DESIGN.md section 10).

Each layer, on rank r of N (d divisible by N, shard = d / N):

    norm     = rms_norm(hidden, norm_w)            replicated (every rank has all of hidden)
    q_r      = wq[r*shard:(r+1)*shard, :] @ norm   column-parallel Q: this rank's rows of wq
    o_r      = wo[:, r*shard:(r+1)*shard] @ q_r    row-parallel O: this rank's columns of wo
    o        = all_reduce(o_r)                     the sum over ranks is wo @ wq @ norm
    residual = hidden + o;  hidden <- residual

so every rank streams 1/N of the weights per token, and each rank's whole forward pass, all-reduces
included, is ONE graph. ``python -m scopegraph demo --gpus N`` and ``bench --gpus N`` run it under
``torchrun --nproc-per-node N`` (on the host backend, any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT), check its tokens against the single-GPU model's and time both.
"""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .. import (
    Communicator,
    CudaError,
    CudaGraph,
    GraphNode,
    ScopeGraphError,
    Stream,
    init_distributed,
    library,
    memcpy,
)
from .args import UsageError
from .demo import check_fits, refusing_oom
from .progress import timed_loop
from .seed_model import Config, LayerStack, make_weights, reference_forward, relative_error

NDArray = np.ndarray[Any, np.dtype[Any]]
# What "equal within float tolerance" means for K tokens of the f32 model (rel. error of the hidden state).
TOLERANCE = 1e-4


@dataclass
class Shard:
    norm_w: Any
    wq: Any  # (shard, d): rows r*shard..(r+1)*shard of wq
    wo: Any  # (d, shard): columns r*shard..(r+1)*shard of wo, stored contiguously
    norm: Any
    q: Any
    o: Any
    residual: Any


class TensorParallelStack:
    """This rank's part of the seed model: frozen weight shards, buffers, the replicated hidden state."""

    def __init__(self, comm: Communicator, cfg: Config) -> None:
        n, r, d = comm.world_size, comm.rank, cfg.d
        if d % n:
            raise ValueError(f"d={d} is not divisible by {n} ranks")
        self.comm, self.cfg = comm, cfg
        dev = comm.device
        shard = d // n
        lo, hi = r * shard, (r + 1) * shard
        self.host_weights = make_weights(cfg)  # the same fixed-seed weights on every rank
        self.layers = [
            Shard(
                dev.from_numpy(nw, name=f"norm_w{i}").freeze(),
                dev.from_numpy(np.ascontiguousarray(wq[lo:hi, :]), name=f"wq{i}[rank {r}]").freeze(),
                dev.from_numpy(np.ascontiguousarray(wo[:, lo:hi]), name=f"wo{i}[rank {r}]").freeze(),
                dev.zeros((1, d), name=f"norm{i}"),
                dev.zeros((shard,), name=f"q{i}"),
                dev.zeros((d,), name=f"o{i}"),
                dev.zeros((d,), name=f"residual{i}"),
            )
            for i, (nw, wq, wo) in enumerate(self.host_weights)
        ]
        self.hidden = dev.zeros((d,), name="hidden")

    def ops(self) -> list[GraphNode]:
        """One forward pass: 5 kernels and copies a layer, as the seed records them, plus the all-reduce."""
        cfg, hidden, comm = self.cfg, self.hidden, self.comm
        ops: list[GraphNode] = []
        for s in self.layers:
            ops += [
                library.rms_norm_op(s.norm.mut(), hidden.view((1, cfg.d)), s.norm_w, cfg.eps),
                library.matvec_op(s.q.mut(), s.norm, s.wq),
                library.matvec_op(s.o.mut(), s.q, s.wo),
                comm.all_reduce(s.o.mut()),
                library.add_op(s.residual.mut(), hidden, s.o),
                memcpy(hidden.mut(), s.residual),
            ]
        return ops

    def record_graph(self, stream: Stream) -> CudaGraph:
        with CudaGraph.scope(stream) as s:
            for op in self.ops():
                s.record(op)
        return s.graph

    def run_eager(self, stream: Stream, ops: list[GraphNode]) -> None:
        for op in ops:
            stream.run(op)


@dataclass
class Figures:
    """What one measurement gives, as rank 0 sees it."""

    world: int
    d: int
    layers: int
    tokens: int
    nodes: int
    err_graph_vs_single: float
    err_eager_vs_single: float
    err_vs_float64: float
    tp_eager_tok_s: float
    tp_graph_tok_s: float
    single_eager_tok_s: float | None
    single_graph_tok_s: float | None

    @property
    def equal(self) -> bool:
        return max(self.err_graph_vs_single, self.err_eager_vs_single) < TOLERANCE


def measure(comm: Communicator, cfg: Config, tokens: int, check_tokens: int = 8, out: TextIO | None = None) -> Figures:
    """Validate the split model against the single-GPU one (run by rank 0 on its own device), then
    time eager and graph tokens per second for both. Collective over every rank of ``comm``."""
    r = comm.rank
    log: TextIO = (out or sys.stdout) if r == 0 else io.StringIO()
    dev = comm.device
    model = TensorParallelStack(comm, cfg)
    stream = dev.stream()
    ops = model.ops()
    x0 = np.random.default_rng(7).standard_normal(cfg.d).astype(np.float32)
    start = dev.from_numpy(x0, name="embedding")

    def run_tokens(step: Any, k: int) -> NDArray:
        stream.run(memcpy(model.hidden.mut(), start))
        for _ in range(k):
            step()
        stream.sync()
        return model.hidden.numpy()

    eager = run_tokens(lambda: model.run_eager(stream, ops), check_tokens)  # also sets up NCCL before capture
    graph = model.record_graph(stream)
    replayed = run_tokens(graph.launch, check_tokens)
    graph.sync()

    single_graph_s = single_eager_s = None
    err_graph = err_eager = err_ref = 0.0
    if r == 0:
        single = LayerStack(dev, cfg)
        one = single.record_graph(stream)
        stream.run(memcpy(single.hidden.mut(), start))
        for _ in range(check_tokens):
            one.launch()
        one.sync()
        want = single.hidden.numpy()
        err_graph, err_eager = relative_error(replayed, want), relative_error(eager, want)
        err_ref = relative_error(replayed, reference_forward(model.host_weights, x0, cfg.eps, check_tokens))
        single_ops = single.ops()
        single_eager_s = timed_loop(
            "1 GPU eager", max(4, tokens // 8), lambda: single.run_eager(stream, single_ops), stream.sync, out=log
        )
        single_graph_s = timed_loop("1 GPU graph", tokens, one.launch, one.sync, out=log)
        one.close()
    comm.barrier()  # the other ranks wait while rank 0 runs the single-GPU model alone

    checked, comm.check_eager = comm.check_eager, False  # timing: no bootstrap round trip per eager collective
    try:
        tp_eager_s = timed_loop(
            f"{comm.world_size} ranks eager",
            max(4, tokens // 8),
            lambda: model.run_eager(stream, ops),
            stream.sync,
            out=log,
        )
    finally:
        comm.check_eager = checked
    tp_graph_s = timed_loop(f"{comm.world_size} ranks graph", tokens, graph.launch, graph.sync, out=log)
    nodes = len(graph.nodes)
    graph.close()
    comm.barrier()
    return Figures(
        comm.world_size,
        cfg.d,
        cfg.n_layers,
        tokens,
        nodes,
        err_graph,
        err_eager,
        err_ref,
        1 / tp_eager_s,
        1 / tp_graph_s,
        None if single_eager_s is None else 1 / single_eager_s,
        None if single_graph_s is None else 1 / single_graph_s,
    )


def report(f: Figures, check_tokens: int = 8) -> list[str]:
    """The demo's lines for ``f`` (rank 0's view)."""
    ok = "OK" if f.equal else "FAILED"
    lines = [
        f"  validation: {check_tokens} tokens split over {f.world} ranks vs the single-GPU model: rel. error "
        f"{f.err_graph_vs_single:.2e} (graph), {f.err_eager_vs_single:.2e} (eager); vs float64 numpy "
        f"{f.err_vs_float64:.2e}: {ok}",
    ]
    if f.single_eager_tok_s is not None and f.single_graph_tok_s is not None:
        lines += [
            f"  1 GPU:    eager {f.single_eager_tok_s:10.1f} tokens/s, graph {f.single_graph_tok_s:10.1f} tokens/s",
            f"  {f.world} ranks:  eager {f.tp_eager_tok_s:10.1f} tokens/s, graph {f.tp_graph_tok_s:10.1f} tokens/s "
            f"({f.nodes} nodes a graph)  -> graph {f.tp_graph_tok_s / f.single_graph_tok_s:.2f}x, "
            f"eager {f.tp_eager_tok_s / f.single_eager_tok_s:.2f}x the 1-GPU figure",
        ]
    return lines


def ranks_match(comm: Communicator, gpus: int, command: str) -> bool:
    """Is there one process per requested GPU? When there is not, rank 0 raises the UsageError that
    says what to run (reported once, as the command line reports any mistake); the others return False."""
    if comm.world_size == gpus:
        return True
    if comm.rank == 0:
        raise UsageError(
            f"argument --gpus: {gpus} needs {gpus} processes, one per GPU, but this program has {comm.world_size}",
            f"run `torchrun --nproc-per-node {gpus} -m scopegraph {command} --gpus {gpus}`",
        )
    return False


def start(spec: str | None) -> Communicator:
    """``init_distributed(spec)`` for the command line: a launch that is not right (a variable of
    the launcher's environment missing, a busy port, no GPU) is a UsageError, its help line kept."""
    try:
        return init_distributed(spec)
    except CudaError as exc:  # as __main__ refuses a device it cannot have
        where = "argument --device" if spec is not None else "this rank's GPU"
        hint = "the info command lists the GPUs here; or use --device host"
        raise UsageError(f"{where}: {str(exc).splitlines()[0]}", hint) from None
    except ScopeGraphError as exc:
        raise UsageError.from_error(exc) from None


def check_split(widths: list[int], world: int, option: str) -> None:
    """Every model width must split evenly over the ranks (d / N rows of wq on each)."""
    bad = [d for d in widths if d % world]
    if bad:
        raise UsageError(
            f"argument {option}: d={bad[0]} does not split over {world} ranks; "
            + ("pass a --d that is a multiple of the rank count" if option == "--d" else "use 1, 2, 4 or 8 GPUs")
        )


def demo(spec: str | None, tokens: int | None, d: int | None, n_layers: int | None, gpus: int) -> int:
    """``python -m scopegraph demo --gpus N``: 0 when the split model's tokens equal the single-GPU model's.
    A size the ranks cannot split, or one too big for the memory, raises UsageError."""
    comm = start(spec)
    try:
        if not ranks_match(comm, gpus, "demo"):
            return 2
        dev = comm.device
        host = dev.is_host
        cfg = Config(d=d or (256 if host else 2048), n_layers=n_layers or 22)
        tokens = tokens or (32 if host else 512)
        check_split([cfg.d], comm.world_size, "--d")
        check_fits(dev, cfg)
        if comm.rank == 0:
            print(
                f"scopegraph demo, tensor parallel over {comm.world_size} ranks ({comm.bootstrap.kind} bootstrap, "
                f"rank 0 on {dev}): {cfg.n_layers} layers, d={cfg.d}; column-parallel Q, row-parallel O, "
                "one all-reduce a layer, each rank's forward pass one graph"
            )
            if host:
                print(
                    "  host backend: numpy stands in for the GPUs and the bootstrap for NCCL, "
                    "so the timings mean nothing"
                )
        with refusing_oom(dev, cfg):
            figures = measure(comm, cfg, tokens)
        if comm.rank == 0:
            for line in report(figures):
                print(line)
        return 0 if figures.equal or comm.rank != 0 else 1
    finally:
        comm.close()
