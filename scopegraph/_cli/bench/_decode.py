"""Suite 7, the decode loop (seed 002): tokens per second for K = 1, 16 and 128 tokens generated
inside one ``graph.launch()`` (a device-side while loop over the seed's layer stack) against K
host-side launches of the one-token graph.

A third way is timed too: K launches where the host reads the loop's flag after each token to
decide whether to go on (a stop condition decided from device data without a device-side loop),
which costs a synchronisation per token.

Both sides run the same kernels per token (the layer stack, then ``append_row``, which stores the
token and moves the device-side counter on) and everything is inside the clock: the loop graph
resets its counter itself, the K-launch side resets it with one memset before its K launches.
Each row also records whether the two sides produced identical tokens. The three ways run in
interleaved rounds: each figure's best, median and spread; the plain figures (``loop_tok_s`` ...)
and their ratios are the medians, as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import CudaGraph, Device, Stream, While, memcpy, memset
from ..seed_model import Config, DecodeBuffers, LayerStack
from ._timing import Side, figure, interleaved, part

TOKENS = (1, 16, 128)
# The seed's size (bandwidth-bound), and a launch-bound size where launch overhead shows.
SIZES_CUDA = ((2048, 22), (512, 22))
SIZES_HOST = ((256, 4),)


def run(dev: Device, quick: bool) -> dict[str, Any]:
    rows = []
    sizes = SIZES_CUDA if dev.is_cuda else SIZES_HOST
    ks = TOKENS if not quick else (1, 16)
    total = (512 if dev.is_cuda else 64) if not quick else 32  # tokens per timed round, each way
    for d, n_layers in sizes if not quick else sizes[:1]:
        model = LayerStack(dev, Config(d=d, n_layers=n_layers))
        stream = dev.stream()
        x0 = np.random.default_rng(5).standard_normal(d).astype(np.float32)
        start = dev.from_numpy(x0, name="start")
        for k in ks:
            buf = model.decode_buffers(k)
            loop, one = model.record_decode_graph(stream, buf), model.record_token_graph(stream, buf)
            body = loop.nodes[-1].op
            assert isinstance(body, While)

            def k_launches(stream: Stream = stream, buf: DecodeBuffers = buf, one: CudaGraph = one, k: int = k) -> None:
                stream.run(memset(buf.position.mut(), 0))
                for _ in range(k):
                    one.launch()

            def host_decides(
                stream: Stream = stream, buf: DecodeBuffers = buf, one: CudaGraph = one, k: int = k
            ) -> None:
                stream.run(memset(buf.position.mut(), 0))
                for _ in range(k):
                    one.launch()
                    if not buf.flag.numpy()[0]:  # waits for the token, then reads `more`
                        break

            # Same start, both ways: identical tokens?
            stream.run(memcpy(model.hidden.mut(), start))
            loop.launch()
            loop.sync()
            in_one = buf.out.numpy()
            stream.run(memcpy(model.hidden.mut(), start))
            k_launches()
            one.sync()
            identical = bool(np.array_equal(in_one, buf.out.numpy()))

            calls = max(1, total // k)
            ways: dict[str, Side] = {
                "loop": (loop.launch, loop.sync, calls),
                "launches": (k_launches, one.sync, calls),
                "host_decides": (host_decides, one.sync, calls),
            }
            # Interleaved rounds of one timing of `calls` calls each; the plain figures are the medians.
            timed = interleaved(ways, rounds=5, inner=1)
            row: dict[str, Any] = {"d": d, "n_layers": n_layers, "k": k, "identical": identical}
            for way, timing in timed.items():
                row |= figure(f"{way}_tok_s", part(timing), scale=k, rate=True, plain="median")
            row["loop_over_launches"] = row["loop_tok_s"] / row["launches_tok_s"]
            row["loop_over_host_decides"] = row["loop_tok_s"] / row["host_decides_tok_s"]
            rows.append(row | {"body_nodes": len(body.body.nodes)})
            loop.close()
            one.close()
            for t in (buf.out, buf.position, buf.flag):
                t.free()
        for t in [*model.tensors(), start]:
            t.free()
    return {"rows": rows}
