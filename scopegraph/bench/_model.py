"""Suite 2, the seed's model: tokens per second for n_layers = 1, 2, 4, 8, 22 at d=2048, eager
against graph replay, against the same math in PyTorch eager and PyTorch CUDA graphs, with the
memory bandwidth reached (weights read per token over time per token) against a device-to-device
copy in the same run."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import library
from .._device import Device
from .._graph import CudaGraph
from ..transformer import Config, LayerStack
from ._timing import time_calls

LAYERS = (1, 2, 4, 8, 22)


def copy_bandwidth(dev: Device, nbytes: int = 1 << 30) -> float:
    """Bytes per second a large device-to-device memcpy moves, counting reads and writes."""
    from .._ops import memcpy

    a, b = dev.empty((nbytes // 4,), name="copy_a"), dev.empty((nbytes // 4,), name="copy_b")
    stream = dev.stream()
    with CudaGraph.scope(stream) as s:
        s.record(memcpy(b.mut(), a))
    with s.graph as g:
        t = time_calls(g.launch, stream.sync, 10)["wall"]
    a.free()
    b.free()
    return 2 * nbytes / t


def matvec_bandwidth(dev: Device, d: int, count: int) -> float:
    """Bytes per second of weights streamed by ``count`` back-to-back d x d matvecs in one graph."""
    rng = np.random.default_rng(0)
    weights = [dev.from_numpy(rng.standard_normal((d, d), dtype=np.float32)).freeze() for _ in range(count)]
    x, y = dev.from_numpy(rng.standard_normal(d, dtype=np.float32)), dev.zeros((d,))
    stream = dev.stream()
    with CudaGraph.scope(stream) as s:
        for w in weights:
            s.record(library.matvec_op(y.mut(), x, w))
    with s.graph as g:
        t = time_calls(g.launch, stream.sync, 20)["wall"]
    for w in weights:
        w.free()
    return count * d * d * 4 / t


def run(dev: Device, quick: bool) -> dict[str, Any]:
    d = 2048 if dev.is_cuda else 256
    tokens = 64 if quick else 256
    rows = []
    for n_layers in LAYERS if not quick else (1, 4):
        cfg = Config(d=d, n_layers=n_layers)
        model = LayerStack(dev, cfg)
        stream = dev.stream()
        ops = model.ops()
        eager = time_calls(lambda: model.run_eager(stream, ops), stream.sync, max(2, tokens // 8))
        graph = model.record_graph(stream)
        replay = time_calls(graph.launch, stream.sync, tokens)
        graph.close()
        row: dict[str, Any] = {
            "n_layers": n_layers,
            "sg_eager_tok_s": 1 / eager["wall"],
            "sg_graph_tok_s": 1 / replay["wall"],
            "graph_over_eager": eager["wall"] / replay["wall"],
            "weight_bytes": cfg.weight_bytes,
            "graph_bandwidth": cfg.weight_bytes / replay["wall"],
        }
        if dev.is_cuda:
            row |= _torch(model, tokens)
        rows.append(row)
        for t in [*(w for lw in model.weights for w in (lw.norm_w, lw.wq, lw.wo)), model.hidden]:
            t.free()
    result: dict[str, Any] = {"d": d, "rows": rows}
    if dev.is_cuda:
        copy = copy_bandwidth(dev)
        mv = matvec_bandwidth(dev, d, 44)
        result |= {"copy_bandwidth": copy, "matvec_bandwidth": mv, "matvec_fraction_of_copy": mv / copy}
        for row in rows:
            row["graph_fraction_of_copy"] = row["graph_bandwidth"] / copy
    return result


def _torch(model: LayerStack, tokens: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    cfg = model.cfg
    layers = [tuple(torch.from_numpy(a).cuda() for a in ws) for ws in model.host_weights]
    hidden = torch.zeros(cfg.d, device="cuda")

    def forward() -> None:
        for norm_w, wq, wo in layers:
            norm = hidden * torch.rsqrt(hidden.pow(2).mean() + cfg.eps) * norm_w
            hidden.add_(wo @ (wq @ norm))

    eager = time_calls(forward, torch.cuda.synchronize, max(2, tokens // 8))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward()
    replay = time_calls(g.replay, torch.cuda.synchronize, tokens)
    return {"torch_eager_tok_s": 1 / eager["wall"], "torch_graph_tok_s": 1 / replay["wall"]}
