"""The synthetic PDL chain (DESIGN.md section 7): kernels that each stream their own weights (8 MiB
in the benchmark) and depend on the kernel before them only through a small vector, recorded as
one chain with programmatic edges on and off. Used by the ``pdl`` suite and by tests/test_pdl.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import CudaGraph, Device, Mut, Stream, Tensor, i32, kernel
from ...library import SOURCE

NDArray = np.ndarray[Any, np.dtype[Any]]

CHAIN_SOURCE = (
    SOURCE
    + r"""
// out[b] = x[b] + sum(w[b * 4 * per4 : (b + 1) * 4 * per4]) for each block b: streams its own
// weights before the wait and depends on its predecessor only through x (one float per block).
extern "C" __global__ void chain_step(float* __restrict__ out, const float* __restrict__ x,
                                      const float* __restrict__ w, int per4) {
    pdl_launch_dependents();  // triggers at entry: the next kernel may start streaming at once
    const float4* w4 = reinterpret_cast<const float4*>(w) + (size_t)blockIdx.x * per4;
    float acc = 0.f;
#pragma unroll 8
    for (int i = threadIdx.x; i < per4; i += blockDim.x) {
        float4 v = __ldg(w4 + i);
        acc += (v.x + v.y) + (v.z + v.w);
    }
    pdl_wait();  // x comes from the kernel before
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = x[blockIdx.x] + acc;
}
"""
)


@kernel(
    CHAIN_SOURCE, touches={"out": "grid_x", "x": "grid_x", "w": "grid_x * per4 * 4"}, pdl=True, reads_before_wait=("w",)
)
def chain_step(out: Mut[Tensor], x: Tensor, w: Tensor, per4: i32) -> None:
    """out[b] = x[b] + sum of block b's slice of w (4 * per4 floats)."""


@chain_step.host
def _chain_step(out: NDArray, x: NDArray, w: NDArray, per4: np.int32) -> None:
    g = out.size
    out.reshape(-1)[:] = x.reshape(-1)[:g] + w.reshape(-1)[: g * 4 * int(per4)].reshape(g, -1).sum(
        axis=1, dtype=np.float32
    )


BLOCKS = 256
THREADS = 256


class Chain:
    """``length`` chain_step kernels, each over its own ``nbytes`` of weights (random, frozen)."""

    def __init__(self, dev: Device, length: int, nbytes: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        floats = nbytes // 4
        self.per4 = floats // (4 * BLOCKS)
        self.weights = [
            dev.from_numpy(rng.standard_normal(floats, dtype=np.float32), name=f"w{i}").freeze() for i in range(length)
        ]
        self.vectors = [dev.zeros((BLOCKS,), name=f"v{i}") for i in range(length + 1)]
        self.nbytes = floats * 4 * length

    def record(self, stream: Stream, pdl: bool = True) -> CudaGraph:
        with CudaGraph.scope(stream, pdl=pdl) as s:
            for i, w in enumerate(self.weights):
                s.record(chain_step[BLOCKS, THREADS](self.vectors[i + 1].mut(), self.vectors[i], w, self.per4))
        return s.graph

    def free(self) -> None:
        for t in [*self.weights, *self.vectors]:
            t.free()
