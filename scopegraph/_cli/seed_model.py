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

The decode loop (DESIGN.md section 8) generates K tokens in one ``graph.launch()``: the stack runs
inside ``with s.while_(flag)``, and each iteration ends with ``append_row``, which copies
``hidden`` into row ``position`` of an output buffer, moves the device-side token counter
``position`` on and sets ``flag = position < K``. The one-token graph records the same ops
without the loop, so K launches of it give the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import CudaGraph, Device, GraphNode, Stream, Tensor, i32, library, memcpy, memset

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


@dataclass
class DecodeBuffers:
    """What a decode loop writes: ``out`` (K, d), row i the hidden state after token i;
    ``position`` (i32[1]) the device-side token counter; ``flag`` (i32[1]) the loop's condition."""

    out: Tensor
    position: Tensor
    flag: Tensor

    @property
    def tokens(self) -> int:
        return self.out.shape[0]


# Per-layer ops of each form of LayerStack.ops(): (kernels, other nodes).
FORMS = {"seed": (4, 1), "kernels": (4, 0), "fused": (2, 0)}


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

    def tensors(self) -> list[Tensor]:
        """Every tensor of the stack: weights, buffers and the hidden state."""
        return [
            *(t for w in self.weights for t in (w.norm_w, w.wq, w.wo)),
            *(t for b in self.buffers for t in (b.norm, b.q, b.o, b.residual)),
            self.hidden,
        ]

    def ops(self, form: str = "seed") -> list[GraphNode]:
        """One forward pass. ``form`` (see FORMS): "seed", the graph nodes the seed records (5 a
        layer, a memcpy among them); "kernels", the same math in 4 kernels a layer as PyTorch runs
        it (rms_norm, 2 matvecs, an in-place residual add); "fused", 2 kernels a layer (RMSNorm
        fused into the first matvec, the residual add into the second)."""
        cfg, hidden = self.cfg, self.hidden
        ops: list[GraphNode] = []
        for w, b in zip(self.weights, self.buffers, strict=True):
            if form == "fused":
                ops += [
                    library.rms_norm_matvec_op(b.q.mut(), hidden, w.norm_w, w.wq, cfg.eps),
                    library.matvec_add_op(hidden.mut(), b.q, w.wo),
                ]
                continue
            ops += [
                library.rms_norm_op(b.norm.mut(), hidden.view((1, cfg.d)), w.norm_w, cfg.eps),
                library.matvec_op(b.q.mut(), b.norm, w.wq),
                library.matvec_op(b.o.mut(), b.q, w.wo),
            ]
            if form == "kernels":
                ops.append(library.axpy_op(hidden.mut(), b.o, 1.0))
            elif form == "seed":
                ops += [library.add_op(b.residual.mut(), hidden, b.o), memcpy(hidden.mut(), b.residual)]
            else:
                raise ValueError(f"form={form!r}: one of {', '.join(FORMS)}")
        return ops

    def record_graph(self, stream: Stream, order: str = "dataflow") -> CudaGraph:
        with CudaGraph.scope(stream, order=order) as s:
            for op in self.ops():
                s.record(op)
        return s.graph

    # -- the decode loop ---------------------------------------------------------------------

    def decode_buffers(self, tokens: int) -> DecodeBuffers:
        """An output buffer for ``tokens`` tokens and the loop's counter and flag."""
        dev = self.device
        return DecodeBuffers(
            dev.zeros((tokens, self.cfg.d), name="tokens"),
            dev.zeros((1,), i32, name="position"),
            dev.zeros((1,), i32, name="more"),
        )

    def token_ops(self, buf: DecodeBuffers) -> list[GraphNode]:
        """One token: a forward pass, then hidden -> out[position], position += 1, flag = position < K."""
        return [*self.ops(), library.append_row_op(buf.out.mut(), buf.position.mut(), buf.flag.mut(), self.hidden)]

    def record_token_graph(self, stream: Stream, buf: DecodeBuffers, order: str = "dataflow") -> CudaGraph:
        """The one-token graph: each launch generates the token at ``position`` (reset it to start over)."""
        with CudaGraph.scope(stream, order=order) as s:
            for op in self.token_ops(buf):
                s.record(op)
        return s.graph

    def record_decode_graph(self, stream: Stream, buf: DecodeBuffers, order: str = "dataflow") -> CudaGraph:
        """The decode loop: one launch generates all ``buf.tokens`` tokens from the current hidden state."""
        k = buf.tokens
        with CudaGraph.scope(stream, order=order) as s:
            s.record(memset(buf.position.mut(), 0))
            s.record(memset(buf.flag.mut(), int(k > 0)))
            with s.while_(buf.flag, max_iterations=k) as body:
                for op in self.token_ops(buf):
                    body.record(op)
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
    """‖got - want‖ / ‖want‖ (NaN anywhere counts as infinitely wrong)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if not np.all(np.isfinite(got64)):
        return float("inf")
    return float(np.linalg.norm(got64 - want64)) / (float(np.linalg.norm(want64)) or 1e-300)
