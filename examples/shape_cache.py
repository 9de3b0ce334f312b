"""Requests of varying sizes served by a few bucketed graphs (seed 003: caching graphs by shape).

Each request has between 1 and 256 items. Its graph is the one for ``sg.bucket(n, BUCKETS)``,
and it takes the exact ``n`` as a parameter (``sg.Param``), so three graphs serve every size.
``sg.GraphCache`` records each one on first use; with room for two, the least recently used
one is evicted (and closed) when a third is needed.
"""

from __future__ import annotations

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

BUCKETS = (64, 128, 256)
BLOCK = 64


def main() -> None:
    dev = sg.device()
    stream = dev.stream()
    x = dev.zeros((256,), name="x")
    out = dev.zeros((256,), name="out")
    n = sg.Param("n", sg.i32, 0)  # the request's size: set at each launch

    def record(s: sg.Scope, bucket: int) -> None:
        """The program for one bucket: out[:n] = x[:n] + x[:n] + 1, launched for `bucket` items."""
        blocks = bucket // BLOCK
        s.record(library.add[blocks, BLOCK](out[0:bucket].mut(), x[0:bucket], x[0:bucket], n))
        s.record(library.add_scalar[blocks, BLOCK](out[0:bucket].mut(), 1.0, n))

    cache = sg.GraphCache(stream, record, maxsize=2)
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 257, 40)
    correct = 0
    for size in sizes:
        data = rng.standard_normal(256).astype(np.float32)
        graph: CudaGraph = cache.get(sg.bucket(int(size), BUCKETS))
        graph.update(sg.memcpy(x.mut(), dev.from_numpy(data)))  # this request's input, ordered before the replay
        graph.launch(n=int(size))
        graph.sync()
        correct += bool(np.array_equal(out.numpy()[:size], data[:size] + data[:size] + 1))
    print(f"on {dev}: {len(sizes)} requests, sizes {sizes.min()}..{sizes.max()}, buckets {BUCKETS}")
    print(f"hits={cache.hits} misses={cache.misses} evictions={cache.evictions} cached={cache.keys()}")
    print(f"results matching numpy: {correct}/{len(sizes)}")
    cache.clear()


if __name__ == "__main__":
    main()
