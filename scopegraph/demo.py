"""``python -m scopegraph demo``: the seed's layer stack, recorded once, replayed in a token loop.

On a GPU it runs the seed's size (d=2048, 22 layers); on the host backend a small one, where
timings mean nothing. It validates graph replay against eager execution and a float64 numpy
reference, then compares eager and graph tokens per second.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from . import _ops
from ._device import Device, device
from .transformer import Config, LayerStack, reference_forward, relative_error


def progress(label: str, total: int, step: Callable[[], object], finish: Callable[[], object]) -> float:
    """Run ``step`` ``total`` times with a progress bar; returns seconds per step (after ``finish``)."""
    width, drawn = 30, -1
    t0 = time.perf_counter()
    for i in range(total):
        step()
        done = (i + 1) * width // total
        if done != drawn:
            drawn = done
            sys.stdout.write(f"\r  {label:<6} [{'#' * done}{'.' * (width - done)}] {i + 1}/{total}")
            sys.stdout.flush()
    finish()
    elapsed = time.perf_counter() - t0
    sys.stdout.write("\n")
    return elapsed / total


def main(device_spec: str | None = None, tokens: int | None = None, d: int | None = None, n_layers: int | None = None) -> int:
    dev: Device = device(device_spec)
    cfg = Config(d=d or (2048 if dev.is_cuda else 512), n_layers=n_layers or (22 if dev.is_cuda else 4))
    tokens = tokens or (512 if dev.is_cuda else 32)
    print(f"scopegraph demo on {dev}: {cfg.n_layers} layers of RMSNorm -> Q matvec -> O matvec -> residual add, d={cfg.d}")
    if dev.is_host:
        print("  (host backend: numpy stands in for the GPU, so the timings below mean nothing)")

    model = LayerStack(dev, cfg)
    stream = dev.stream()
    t0 = time.perf_counter()
    graph = model.record_graph(stream)
    print(f"  recorded and instantiated {len(graph.nodes)} nodes in {(time.perf_counter() - t0) * 1e3:.1f} ms "
          f"({len(graph.edges)} dependency edges)")

    # Validation: one token through graph replay, through eager ops, and through numpy float64.
    x0 = np.random.default_rng(7).standard_normal(cfg.d).astype(np.float32)
    new_input = dev.from_numpy(x0, name="embedding")
    graph.update(_ops.memcpy(model.hidden.mut(), new_input))
    graph.launch()
    graph.sync()
    replayed = model.hidden.numpy()
    stream.run(_ops.memcpy(model.hidden.mut(), new_input))
    ops = model.ops()
    model.run_eager(stream, ops)
    stream.sync()
    eager = model.hidden.numpy()
    want = reference_forward(model.host_weights, x0, cfg.eps)
    err_eager, err_ref = relative_error(replayed, eager), relative_error(replayed, want)
    ok = err_eager < 1e-5 and err_ref < 1e-4
    print(f"  validation: graph vs eager rel. error {err_eager:.2e}, graph vs float64 numpy {err_ref:.2e}: {'OK' if ok else 'FAILED'}")

    eager_s = progress("eager", max(4, tokens // 8), lambda: model.run_eager(stream, ops), stream.sync)
    graph_s = progress("graph", tokens, graph.launch, graph.sync)
    print(f"  eager: {1 / eager_s:10.1f} tokens/s  ({len(ops)} launches per token)")
    print(f"  graph: {1 / graph_s:10.1f} tokens/s  (1 launch per token)  -> {eager_s / graph_s:.2f}x")
    if dev.is_cuda:
        print(f"  weights streamed by the graph: {cfg.weight_bytes / graph_s / 1e9:.0f} GB/s")
    graph.close()
    return 0 if ok else 1
