"""The seed's example: a stack of RMSNorm -> Q matvec -> O matvec -> residual add layers,
recorded once with ``CudaGraph.scope`` and replayed in a token loop, each token's embedding
copied into the graph's fixed input buffer with ``graph.update(sg.memcpy(...))``.

Everything is written out here with the public API: frozen weights, preallocated buffers, the
five ops of a layer, the graph, the token loop. The output is validated against scopegraph's
eager path and against float64 numpy. On the host backend (no GPU) the timings mean nothing.

    python examples/transformer_layers.py [--d 2048] [--layers 22] [--tokens 512]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]
EPS = 1e-5


class LayerStack:
    """Weights (frozen: any later write to them is refused), one buffer per intermediate, and the
    hidden state that every layer reads and rewrites."""

    def __init__(self, dev: sg.Device, host_weights: list[tuple[NDArray, NDArray, NDArray]]) -> None:
        d = host_weights[0][0].shape[0]
        self.d = d
        self.weights = [
            (
                dev.from_numpy(nw, name=f"norm_w{i}").freeze(),
                dev.from_numpy(wq, name=f"wq{i}").freeze(),
                dev.from_numpy(wo, name=f"wo{i}").freeze(),
            )
            for i, (nw, wq, wo) in enumerate(host_weights)
        ]
        self.buffers = [
            (
                dev.zeros((1, d), name=f"norm{i}"),
                dev.zeros((d,), name=f"q{i}"),
                dev.zeros((d,), name=f"o{i}"),
                dev.zeros((d,), name=f"residual{i}"),
            )
            for i in range(len(host_weights))
        ]
        self.hidden = dev.zeros((d,), name="hidden")

    def ops(self) -> list[sg.GraphNode]:
        """One forward pass: per layer, exactly the five nodes the seed records."""
        hidden = self.hidden
        ops: list[sg.GraphNode] = []
        for (norm_w, wq, wo), (norm, q, o, residual) in zip(self.weights, self.buffers, strict=True):
            ops += [
                library.rms_norm_op(norm.mut(), hidden.view((1, self.d)), norm_w, EPS),  # norm = rms_norm(hidden)
                library.matvec_op(q.mut(), norm, wq),  # q = wq @ norm
                library.matvec_op(o.mut(), q, wo),  # o = wo @ q
                library.add_op(residual.mut(), hidden, o),  # residual = hidden + o
                sg.memcpy(hidden.mut(), residual),  # hidden <- residual
            ]
        return ops


class GraphModel:
    """The seed's ``Module`` pattern: one graph, a fixed input buffer, an output that the graph rewrites."""

    def __init__(self, stack: LayerStack, stream: sg.Stream) -> None:
        self.stack = stack
        with CudaGraph.scope(stream) as s:
            for op in stack.ops():
                s.record(op)
        self.graph = s.graph

    def forward(self, embedding: sg.Tensor) -> sg.Tensor:
        self.graph.update(sg.memcpy(self.stack.hidden.mut(), embedding))  # lands before the replay
        self.graph.launch()  # the whole forward pass: one driver call
        return self.stack.hidden


def make_weights(d: int, layers: int, seed: int = 0) -> list[tuple[NDArray, NDArray, NDArray]]:
    """Fixed-seed weights; matvec weights scaled by 1/sqrt(d) so activations stay near unit size."""
    rng = np.random.default_rng(seed)
    scale = np.float32(1.0 / np.sqrt(d))
    return [
        (
            (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            rng.standard_normal((d, d), dtype=np.float32) * scale,
            rng.standard_normal((d, d), dtype=np.float32) * scale,
        )
        for _ in range(layers)
    ]


def reference(weights: list[tuple[NDArray, NDArray, NDArray]], hidden: NDArray) -> NDArray:
    """The same math in float64 numpy, independent of scopegraph."""
    h = hidden.astype(np.float64)
    for norm_w, wq, wo in weights:
        norm = h / np.sqrt(np.mean(h * h) + EPS) * norm_w
        h = h + wo.astype(np.float64) @ (wq.astype(np.float64) @ norm)
    return h


def relative_error(got: NDArray, want: NDArray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--d", type=positive, default=None, help="model width (default: 2048 on a GPU, 256 on the host)"
    )
    parser.add_argument("--layers", type=positive, default=22, help="number of layers (default: 22)")
    parser.add_argument(
        "--tokens", type=positive, default=None, help="tokens to time (default: 512 on a GPU, 16 on the host)"
    )
    args = parser.parse_args()
    dev = sg.device()
    d = args.d or (2048 if dev.is_cuda else 256)
    tokens = args.tokens or (512 if dev.is_cuda else 16)
    host_weights = make_weights(d, args.layers)
    stream = dev.stream()
    stack = LayerStack(dev, host_weights)
    model = GraphModel(stack, stream)
    print(
        f"{args.layers} layers, d={d}, on {dev}: {len(model.graph.nodes)} graph nodes, {len(model.graph.edges)} edges"
    )

    rng = np.random.default_rng(1)
    embeddings = [dev.from_numpy(rng.standard_normal(d).astype(np.float32), name=f"token{i}") for i in range(4)]

    # Validate the first token three ways: graph replay, eager ops on a second stack, float64 numpy.
    out = model.forward(embeddings[0]).numpy()
    eager = LayerStack(dev, host_weights)
    stream.run(sg.memcpy(eager.hidden.mut(), embeddings[0]))
    for op in eager.ops():
        stream.run(op)
    stream.sync()
    want = reference(host_weights, embeddings[0].numpy())
    err_eager, err_ref = relative_error(out, eager.hidden.numpy().astype(np.float64)), relative_error(out, want)
    print(f"graph vs eager: {err_eager:.2e}; graph vs float64 numpy: {err_ref:.2e}")
    if err_eager > 1e-5 or err_ref > 1e-4:
        raise SystemExit("validation FAILED")

    t0 = time.perf_counter()
    for i in range(tokens):
        model.forward(embeddings[i % len(embeddings)])
    model.graph.sync()
    per_token = (time.perf_counter() - t0) / tokens
    print(
        f"{tokens} tokens: {1 / per_token:.0f} tokens/s" + ("  (host backend: not a GPU timing)" if dev.is_host else "")
    )
    model.graph.close()


if __name__ == "__main__":
    main()
