"""A PyTorch matmul (cuBLAS) between scopegraph kernels, all in one graph.

    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(a.mut(), 1.0))                    # scopegraph: a += 1
        with s.capture(reads=[a, b], writes=[c.mut()], via="torch", host=numpy_matmul) as region:
            if region.capturing:
                torch.matmul(ta, tb, out=tc)                             # PyTorch, captured
        s.record(library.axpy_op(y.mut(), c, 2.0))                       # scopegraph: y += 2c

The region declares what the matmul reads and writes, so the graph orders it after ``a += 1`` and
before ``y += 2c`` (borrow errors in that declaration are caught at the ``s.capture`` line), and
PyTorch's captured work becomes ONE child-graph node. ``ta``, ``tb``, ``tc`` are PyTorch views of
the scopegraph tensors (DLPack, no copy), made before the scope. On a GPU with PyTorch the result
is checked against PyTorch eager; on the host backend (or without PyTorch) the region runs its
host callable, numpy's matmul, and the result is checked against numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]


def numpy_matmul(c: NDArray, a: NDArray, b: NDArray) -> None:
    """The host backend's stand-in: writes first, then reads."""
    np.matmul(a, b, out=c)


def main() -> None:
    torch: Any = None
    dev = sg.device()
    if dev.is_cuda:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            print("PyTorch is not installed: running on the host backend instead")
            dev = sg.device("host")
    stream = dev.stream()
    rng = np.random.default_rng(0)
    A = rng.standard_normal((256, 128), dtype=np.float32)
    B = rng.standard_normal((128, 64), dtype=np.float32)
    a, b = dev.from_numpy(A, name="a"), dev.from_numpy(B, name="b")
    c, y = dev.zeros((256, 64), name="c"), dev.zeros((256, 64), name="y")
    views = [torch.from_dlpack(t) for t in (a, b, c)] if dev.is_cuda else []

    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(a.mut(), 1.0))
        with s.capture(reads=[a, b], writes=[c.mut()], via="torch", name="matmul", host=numpy_matmul) as region:
            if region.capturing:
                ta, tb, tc = views
                torch.matmul(ta, tb, out=tc)
        s.record(library.axpy_op(y.mut(), c, 2.0))

    with s.graph as graph:
        print(f"on {dev}: graph nodes: {', '.join(n.op.label() for n in graph.nodes)}")
        if dev.is_cuda:
            print("the region ran PyTorch's torch.matmul (cuBLAS), captured as one child-graph node")
        else:
            print("the region runs its host callable (numpy) on the host backend")
        for _ in range(3):
            graph.launch()
        graph.sync()
        if dev.is_cuda:  # the same three steps in PyTorch eager
            ta_eager, tb_eager = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda()
            want_t = torch.zeros((256, 64), device="cuda")
            for _ in range(3):
                ta_eager += 1
                want_t += 2 * torch.matmul(ta_eager, tb_eager)
            want, reference = want_t.cpu().numpy(), "PyTorch eager"
        else:
            want, reference = sum(2 * ((A + k) @ B) for k in range(1, 4)), "numpy"
        err = float(np.abs(y.numpy() - want).max() / np.abs(want).max())
        print(f"3 replays: y vs {reference}: max rel. error {err:.1e}: {'OK' if err < 1e-3 else 'FAILED'}")


if __name__ == "__main__":
    main()
