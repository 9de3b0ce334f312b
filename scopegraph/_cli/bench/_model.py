"""Suite 2, the seed's model: tokens per second for n_layers = 1, 2, 4, 8, 22 at d=2048, eager
against graph replay, against the same math in PyTorch eager and PyTorch CUDA graphs, with the
memory bandwidth reached (weights read per token over time per token) against a device-to-device
copy in the same run."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import CudaGraph, Device, Mut, Tensor, i64, kernel, library, memcpy
from ..seed_model import Config, LayerStack
from ._timing import time_calls

LAYERS = (1, 2, 4, 8, 22)
# A launch-bound size (weights fit in L2), where graph replay's advantage shows in full.
SMALL_D = 512


@kernel(
    """extern "C" __global__ void copy4(float4* __restrict__ dst, const float4* __restrict__ src, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        dst[i] = __ldcs(src + i);
}"""
)
def copy4(dst: Mut[Tensor], src: Tensor, n4: i64) -> None:
    """dst = src, 16 bytes per thread per step: the bandwidth a plain copy kernel reaches."""


def copy_bandwidth(dev: Device, nbytes: int = 1 << 30) -> dict[str, float]:
    """Bytes per second a large device-to-device copy moves, counting reads and writes, both as a
    memcpy node (copy engines) and as a copy kernel (the SMs, like the matvec)."""
    a, b = dev.empty((nbytes // 4,), name="copy_a"), dev.empty((nbytes // 4,), name="copy_b")
    stream = dev.stream()
    sms = dev.backend.core.properties.multiprocessor_count  # type: ignore[attr-defined]
    result = {}
    for name, op in (("memcpy", memcpy(b.mut(), a)), ("kernel", copy4[sms * 8, 256](b.mut(), a, nbytes // 16))):
        with CudaGraph.scope(stream) as s:
            s.record(op)
        with s.graph as g:
            result[name] = 2 * nbytes / time_calls(g.launch, stream.sync, 10)["wall"]
    a.free()
    b.free()
    return result


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
    seed_d = 2048 if dev.is_cuda else 256
    tokens = 64 if quick else 256
    rows = []
    sizes = [(seed_d, n) for n in (LAYERS if not quick else (1, 4))] + ([(SMALL_D, 22)] if dev.is_cuda else [])
    for d, n_layers in sizes:
        cfg = Config(d=d, n_layers=n_layers)
        model = LayerStack(dev, cfg)
        stream = dev.stream()
        ops = model.ops()
        eager = time_calls(lambda: model.run_eager(stream, ops), stream.sync, max(2, tokens // 8))
        graph = model.record_graph(stream)
        replay = time_calls(graph.launch, stream.sync, tokens)
        graph.close()
        row: dict[str, Any] = {
            "d": d,
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
    result: dict[str, Any] = {"d": seed_d, "rows": rows}
    if dev.is_cuda:
        copies = copy_bandwidth(dev)
        copy = max(copies.values())
        mv = matvec_bandwidth(dev, seed_d, 44)
        result |= {
            "copy_bandwidth": copy,
            "copy_bandwidths": copies,
            "matvec_bandwidth": mv,
            "matvec_fraction_of_copy": mv / copy,
            "matvec_fraction_of_memcpy": mv / copies["memcpy"],
        }
        for row in rows:
            row["graph_fraction_of_copy"] = row["graph_bandwidth"] / copy
        result["eager_launch_floor_note"] = (
            "graph/eager is bounded by (eager time per token) / (weight bytes / bandwidth): "
            "with ~3.4 us per eager launch (cuda.core's own floor) and 110 launches per token, "
            "d=2048 x 22 layers can reach at most ~2.2x at full bandwidth"
        )
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
