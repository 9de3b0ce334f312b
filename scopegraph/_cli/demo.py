"""``python -m scopegraph demo``: the seed's layer stack, recorded once, replayed in a token loop.

On a GPU it runs the seed's size by default (22 layers, d=2048, 512 tokens). On the host backend
the default is smaller (22 layers, d=256, 32 tokens), because numpy stands in for the GPU and its
timings mean nothing; the output says so. It validates graph replay against eager execution and
a float64 numpy reference, then compares eager and graph tokens per second. A second section runs
the decode loop: min(tokens, 128) tokens inside one ``graph.launch()`` (a device-side while loop)
against as many launches of the one-token graph, checked identical and timed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import CudaError, Device, Stream, While, memcpy, memset
from .args import UsageError, size_text
from .progress import timed_loop
from .seed_model import Config, LayerStack, reference_forward, relative_error


@dataclass(frozen=True)
class Size:
    """A demo size: model width, layer count, timed tokens."""

    d: int
    layers: int
    tokens: int


SEED = Size(d=2048, layers=22, tokens=512)  # the seed's model, the default on a GPU
HOST = Size(d=256, layers=22, tokens=32)  # the default on the host backend: numpy is slow at d=2048
DECODE_MAX = 128  # tokens per launch in the decode-loop section (fewer when --tokens is smaller)


def default_size(dev: Device) -> Size:
    return SEED if dev.is_cuda else HOST


def memory_needed(dev: Device, cfg: Config) -> tuple[int, int]:
    """About how many bytes of host memory, and of GPU memory (0 on the host backend), the demo
    needs at ``cfg``: the weights in numpy (and, on the host backend, again as tensors), and the
    float64 copy of one matrix that the reference pass makes."""
    device_bytes = cfg.weight_bytes + 8 * cfg.d * (cfg.n_layers + DECODE_MAX)  # + buffers, decode rows
    host_bytes = cfg.weight_bytes + 8 * cfg.d * cfg.d
    return (host_bytes + device_bytes, 0) if dev.is_host else (host_bytes, device_bytes)


def _physical_memory() -> int | None:
    """This machine's RAM in bytes, None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _gpu_memory(dev: Device) -> int | None:
    from .info import probe_driver

    gpus = {gpu.index: gpu.memory_bytes for gpu in probe_driver().gpus}
    return gpus.get(dev.index)


def too_big(cfg: Config, what: str, need: int | None = None, have: int | None = None) -> UsageError:
    """The refusal of a model too big for ``what`` memory ("host", or a GPU's name)."""
    size = f"a model of {cfg.n_layers} layer{'s' * (cfg.n_layers != 1)} at d={cfg.d}"
    if need is not None and have is not None:
        problem = f"needs about {size_text(need)} of {what} memory, more than the {size_text(have)} there is"
    else:
        problem = f"does not fit in {what} memory"
    return UsageError(f"arguments --d/--layers: {size} {problem}; use a smaller --d or --layers")


def check_fits(dev: Device, cfg: Config) -> None:
    """Refuse (UsageError) a size whose weights cannot fit in this machine's memory or its GPU's."""
    host_need, gpu_need = memory_needed(dev, cfg)
    have = _physical_memory()
    if have is not None and host_need > have:
        raise too_big(cfg, "host", host_need, have)
    if gpu_need:
        have = _gpu_memory(dev)
        if have is not None and gpu_need > have:
            raise too_big(cfg, str(dev), gpu_need, have)


def main(dev: Device, tokens: int | None = None, d: int | None = None, n_layers: int | None = None) -> int:
    """Run the demo; 0 when the graph's output validates, 1 when it does not. A size that does
    not fit in memory raises UsageError (before anything runs, where it can be told)."""
    default = default_size(dev)
    cfg = Config(d=default.d if d is None else d, n_layers=default.layers if n_layers is None else n_layers)
    tokens = default.tokens if tokens is None else tokens
    check_fits(dev, cfg)
    with refusing_oom(dev, cfg):
        return _run(dev, cfg, tokens, d is None)


@contextlib.contextmanager
def refusing_oom(dev: Device, cfg: Config) -> Iterator[None]:
    """Running out of host or GPU memory, which check_fits cannot always foresee, is a UsageError too."""
    try:
        yield
    except MemoryError:
        raise too_big(cfg, "host") from None
    except CudaError as exc:
        if exc.result != "CUDA_ERROR_OUT_OF_MEMORY":
            raise
        raise too_big(cfg, str(dev)) from None


def _run(dev: Device, cfg: Config, tokens: int, default_width: bool) -> int:
    print(
        f"scopegraph demo on {dev}: {cfg.n_layers} layers of RMSNorm -> Q matvec -> O matvec -> residual add, d={cfg.d}"
    )
    if dev.is_host:
        print("  host backend: numpy stands in for the GPU, so the timings below mean nothing")
        if default_width:
            print(
                f"  (host default width d={HOST.d}; the seed's model is d={SEED.d}: "
                f"pass --d {SEED.d} for the full size)"
            )

    model = LayerStack(dev, cfg)
    stream = dev.stream()
    t0 = time.perf_counter()
    graph = model.record_graph(stream)
    print(
        f"  recorded and instantiated {len(graph.nodes)} nodes in {(time.perf_counter() - t0) * 1e3:.1f} ms "
        f"({len(graph.edges)} dependency edges)"
    )

    # Validation: one token through graph replay, through eager ops, and through numpy float64.
    x0 = np.random.default_rng(7).standard_normal(cfg.d).astype(np.float32)
    new_input = dev.from_numpy(x0, name="embedding")
    graph.update(memcpy(model.hidden.mut(), new_input))
    graph.launch()
    graph.sync()
    replayed = model.hidden.numpy()
    stream.run(memcpy(model.hidden.mut(), new_input))
    ops = model.ops()
    model.run_eager(stream, ops)
    stream.sync()
    eager = model.hidden.numpy()
    want = reference_forward(model.host_weights, x0, cfg.eps)
    err_eager, err_ref = relative_error(replayed, eager), relative_error(replayed, want)
    ok = err_eager < 1e-5 and err_ref < 1e-4
    print(
        f"  validation: graph vs eager rel. error {err_eager:.2e}, "
        f"graph vs float64 numpy {err_ref:.2e}: {'OK' if ok else 'FAILED'}"
    )

    eager_s = timed_loop("eager", max(4, tokens // 8), lambda: model.run_eager(stream, ops), stream.sync)
    graph_s = timed_loop("graph", tokens, graph.launch, graph.sync)
    print(f"  eager: {1 / eager_s:10.1f} tokens/s  ({len(ops)} launches per token)")
    print(f"  graph: {1 / graph_s:10.1f} tokens/s  (1 launch per token)  -> {eager_s / graph_s:.2f}x")
    if dev.is_cuda:
        print(f"  weights streamed by the graph: {cfg.weight_bytes / graph_s / 1e9:.0f} GB/s")
    graph.close()
    ok = decode(dev, model, stream, x0, tokens) and ok
    return 0 if ok else 1


def decode(dev: Device, model: LayerStack, stream: Stream, x0: np.ndarray[Any, Any], tokens: int) -> bool:
    """The decode loop: K tokens inside one launch (``s.while_`` on the device) against K launches
    of the one-token graph; True when both give identical tokens."""
    k = min(tokens, DECODE_MAX)
    buf = model.decode_buffers(k)
    start = dev.from_numpy(x0, name="embedding")
    loop, one = model.record_decode_graph(stream, buf), model.record_token_graph(stream, buf)
    body = loop.nodes[-1].op
    assert isinstance(body, While)
    print(f"  decode loop: {k} tokens per graph.launch(), a while loop of {len(body.body.nodes)} nodes on the device")
    loop.update(memcpy(model.hidden.mut(), start))
    loop.launch()
    loop.sync()
    in_one = buf.out.numpy()
    stream.run(memcpy(model.hidden.mut(), start))
    stream.run(memset(buf.position.mut(), 0))
    for _ in range(k):
        one.launch()
    one.sync()
    same = bool(np.array_equal(in_one, buf.out.numpy()))
    print(
        f"  validation: {k} tokens from one launch vs {k} launches of the one-token graph: "
        f"{'identical: OK' if same else 'DIFFERENT: FAILED'}"
    )

    def k_launches() -> None:
        stream.run(memset(buf.position.mut(), 0))
        for _ in range(k):
            one.launch()

    rounds = max(1, tokens // k)
    loop_s = timed_loop("loop", rounds, loop.launch, loop.sync, unit="round") / k
    launches_s = timed_loop("tokens", rounds, k_launches, one.sync, unit="round") / k
    many = f"{k} launches:"
    print(f"  decode, {'one launch:':<14}{1 / loop_s:10.1f} tokens/s  ({k} tokens per launch)")
    print(
        f"  decode, {many:<14}{1 / launches_s:10.1f} tokens/s  (1 token per launch)  "
        f"-> loop is {launches_s / loop_s:.2f}x"
    )
    loop.close()
    one.close()
    return same
