"""The seed's layer stack, the model that ``python -m scopegraph demo`` and ``bench`` run: layers of
RMSNorm -> Q matvec -> O matvec -> residual add, with the hidden state carried in one fixed buffer
(``hidden``) that the graph rewrites. Private: it is a workload for the command line and the tests,
not a model library; ``examples/transformer_layers.py`` is the same stack written out for users.

Each layer records, exactly as the seed's ``CudaGraph::scope`` example does::

    norm     = rms_norm(hidden, w.norm_w)
    q        = wq @ norm
    o        = wo @ q
    residual = hidden + o
    hidden  <- residual            (memcpy)

The demo, the benchmarks and the tests build it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import CudaGraph, Device, GraphNode, Stream, Tensor, library, memcpy

NDArray = np.ndarray[Any, np.dtype[Any]]


@dataclass(frozen=True)
class Config:
    """Model size: the seed uses d=2048 and 22 layers."""

    d: int = 2048
    n_layers: int = 22
    eps: float = 1e-5
    seed: int = 0

    @property
    def weight_bytes(self) -> int:
        """Bytes of matvec weights one forward pass reads."""
        return 2 * self.n_layers * self.d * self.d * 4


@dataclass
class LayerWeights:
    norm_w: Tensor
    wq: Tensor
    wo: Tensor


@dataclass
class LayerBuffers:
    norm: Tensor
    q: Tensor
    o: Tensor
    residual: Tensor


class LayerStack:
    """Weights (frozen), pre-allocated buffers and the hidden state, on one device."""

    def __init__(self, device: Device, cfg: Config) -> None:
        self.device = device
        self.cfg = cfg
        self.host_weights = make_weights(cfg)
        self.weights = [
            LayerWeights(
                device.from_numpy(nw, name=f"norm_w{i}").freeze(),
                device.from_numpy(wq, name=f"wq{i}").freeze(),
                device.from_numpy(wo, name=f"wo{i}").freeze(),
            )
            for i, (nw, wq, wo) in enumerate(self.host_weights)
        ]
        d = cfg.d
        self.buffers = [
            LayerBuffers(
                device.zeros((1, d), name=f"norm{i}"),
                device.zeros((d,), name=f"q{i}"),
                device.zeros((d,), name=f"o{i}"),
                device.zeros((d,), name=f"residual{i}"),
            )
            for i in range(cfg.n_layers)
        ]
        self.hidden = device.zeros((d,), name="hidden")

    def ops(self) -> list[GraphNode]:
        """One forward pass, as the graph nodes the seed records."""
        cfg, hidden = self.cfg, self.hidden
        ops: list[GraphNode] = []
        for w, b in zip(self.weights, self.buffers):
            ops += [
                library.rms_norm_op(b.norm.mut(), hidden.view((1, cfg.d)), w.norm_w, cfg.eps),
                library.matvec_op(b.q.mut(), b.norm, w.wq),
                library.matvec_op(b.o.mut(), b.q, w.wo),
                library.add_op(b.residual.mut(), hidden, b.o),
                memcpy(hidden.mut(), b.residual),
            ]
        return ops

    def record_graph(self, stream: Stream, order: str = "dataflow") -> CudaGraph:
        with CudaGraph.scope(stream, order=order) as s:
            for op in self.ops():
                s.record(op)
        return s.graph

    def run_eager(self, stream: Stream, ops: list[GraphNode] | None = None) -> None:
        """One forward pass op by op (the non-graph path)."""
        for op in ops if ops is not None else self.ops():
            stream.run(op)


def make_weights(cfg: Config) -> list[tuple[NDArray, NDArray, NDArray]]:
    """Fixed-seed weights; matvec weights scaled by 1/sqrt(d) so activations stay near unit size."""
    rng = np.random.default_rng(cfg.seed)
    scale = np.float32(1.0 / np.sqrt(cfg.d))
    return [
        (
            (1.0 + 0.1 * rng.standard_normal(cfg.d)).astype(np.float32),
            (rng.standard_normal((cfg.d, cfg.d), dtype=np.float32) * scale),
            (rng.standard_normal((cfg.d, cfg.d), dtype=np.float32) * scale),
        )
        for _ in range(cfg.n_layers)
    ]


def reference_forward(
    weights: list[tuple[NDArray, NDArray, NDArray]], hidden: NDArray, eps: float, steps: int = 1
) -> NDArray:
    """The same math in float64 numpy, independent of scopegraph: ``steps`` passes over the stack."""
    h = hidden.astype(np.float64)
    for _ in range(steps):
        for norm_w, wq, wo in weights:
            norm = h / np.sqrt(np.mean(h * h) + eps) * norm_w
            h = h + wo.astype(np.float64) @ (wq.astype(np.float64) @ norm)
    return h


def relative_error(got: NDArray, want: NDArray) -> float:
    """‖got − want‖ / ‖want‖ (NaN anywhere counts as infinitely wrong)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.all(np.isfinite(got64)):
        return float("inf")
    return float(np.linalg.norm(got64 - want64)) / (float(np.linalg.norm(want64)) or 1e-300)
