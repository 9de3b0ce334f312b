"""The seed's example: a stack of RMSNorm -> Q matvec -> O matvec -> residual add layers,
recorded once with ``CudaGraph.scope`` and replayed in a token loop, each token's embedding
copied into the graph's fixed input buffer with ``graph.update(sg.memcpy(...))``.

The output is validated against scopegraph's eager path and against float64 numpy.
On the host backend (no GPU) the timings mean nothing.

    python examples/transformer_layers.py [--d 2048] [--layers 22] [--tokens 512]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph
from scopegraph.transformer import Config, LayerStack, reference_forward, relative_error


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--d", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None)
    args = parser.parse_args()
    dev = sg.device()
    cfg = Config(d=args.d or (2048 if dev.is_cuda else 256), n_layers=args.layers or (22 if dev.is_cuda else 4))
    tokens = args.tokens or (512 if dev.is_cuda else 16)
    stream = dev.stream()
    stack = LayerStack(dev, cfg)
    model = GraphModel(stack, stream)
    print(f"{cfg.n_layers} layers, d={cfg.d}, on {dev}: {len(model.graph.nodes)} graph nodes")

    rng = np.random.default_rng(cfg.seed + 1)
    embeddings = [dev.from_numpy(rng.standard_normal(cfg.d).astype(np.float32), name=f"token{i}") for i in range(4)]

    # Validate the first token three ways.
    out = model.forward(embeddings[0]).numpy()
    eager = LayerStack(dev, cfg)
    stream.run(sg.memcpy(eager.hidden.mut(), embeddings[0]))
    eager.run_eager(stream)
    stream.sync()
    want = reference_forward(stack.host_weights, embeddings[0].numpy(), cfg.eps)
    print(f"graph vs eager: {relative_error(out, eager.hidden.numpy()):.2e}; graph vs float64 numpy: {relative_error(out, want):.2e}")

    t0 = time.perf_counter()
    for i in range(tokens):
        model.forward(embeddings[i % len(embeddings)])
    model.graph.sync()
    per_token = (time.perf_counter() - t0) / tokens
    print(f"{tokens} tokens: {1 / per_token:.0f} tokens/s" + ("  (host backend: not a GPU timing)" if dev.is_host else ""))
    model.graph.close()


if __name__ == "__main__":
    main()
