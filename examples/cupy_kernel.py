"""A CuPy kernel between scopegraph kernels, all in one graph.

    square_plus = cupy.ElementwiseKernel("float32 v", "float32 r", "r = v * v + 1.0f", "square_plus")
    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(x.mut(), 0.5))                        # scopegraph: x += 0.5
        with s.capture(reads=[x], writes=[out.mut()], host=numpy_square_plus) as region:
            if region.capturing:
                with cupy.cuda.Stream.from_external(region.stream):
                    square_plus(cx, cout)                                    # CuPy, captured
        s.record(library.axpy_op(acc.mut(), out, 1.0))                       # scopegraph: acc += out

The region captures through cuda.core's graph builder on a stream scopegraph owns
(``region.handle`` is its ``cudaStream_t``), and becomes ONE child-graph node ordered by the
declared borrows. CuPy allocations inside the region are refused (CaptureError): write into the
declared arrays. On a GPU with CuPy the result is checked against CuPy eager; on the host backend
(or without CuPy) the region runs its host callable and is checked against numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

NDArray = np.ndarray[Any, np.dtype[Any]]


def numpy_square_plus(out: NDArray, x: NDArray) -> None:
    np.multiply(x, x, out=out)
    out += 1.0


def cupy_stream(cupy: Any, region: sg.Region) -> Any:
    """The region's stream as CuPy's current stream (CuPy 14: Stream.from_external; before: ExternalStream)."""
    if hasattr(cupy.cuda.Stream, "from_external"):
        return cupy.cuda.Stream.from_external(region.stream)
    return cupy.cuda.ExternalStream(region.handle)


def main() -> None:
    cupy: Any = None
    dev = sg.device()
    if dev.is_cuda:
        try:
            cupy = importlib.import_module("cupy")
        except ImportError:
            print("CuPy is not installed: running on the host backend instead")
            dev = sg.device("host")
    stream = dev.stream()
    x0 = np.linspace(-2, 2, 1 << 16, dtype=np.float32)
    x, out, acc = dev.from_numpy(x0, name="x"), dev.zeros(x0.shape, name="out"), dev.zeros(x0.shape, name="acc")
    if dev.is_cuda:
        cx, cout = cupy.from_dlpack(x), cupy.from_dlpack(out)
        square_plus = cupy.ElementwiseKernel("float32 v", "float32 r", "r = v * v + 1.0f", "square_plus")
        square_plus(cx, cout)  # compile (and load) before the scope: no compiling during capture
        stream.run(sg.memset(out.mut(), 0.0))

    with CudaGraph.scope(stream) as s:
        s.record(library.add_scalar_op(x.mut(), 0.5))
        with s.capture(reads=[x], writes=[out.mut()], name="square_plus", host=numpy_square_plus) as region:
            if region.capturing:
                region.hold(square_plus)  # the captured node launches this kernel's module: keep it alive
                with cupy_stream(cupy, region):
                    square_plus(cx, cout)
        s.record(library.axpy_op(acc.mut(), out, 1.0))

    with s.graph as graph:
        print(f"on {dev}: graph nodes: {', '.join(n.op.label() for n in graph.nodes)}")
        if dev.is_cuda:
            print("the region ran a CuPy ElementwiseKernel, captured as one child-graph node")
        else:
            print("the region runs its host callable (numpy) on the host backend")
        for _ in range(4):
            graph.launch()
        graph.sync()
        if dev.is_cuda:  # the same four steps in CuPy eager
            ex, eacc = cupy.asarray(x0), cupy.zeros(x0.shape, cupy.float32)
            for _ in range(4):
                ex += 0.5
                eacc += square_plus(ex)
            want, reference = cupy.asnumpy(eacc), "CuPy eager"
        else:
            want, reference = sum((x0 + 0.5 * k) ** 2 + 1 for k in range(1, 5)), "numpy"
        err = float(np.abs(acc.numpy() - want).max() / np.abs(want).max())
        print(f"4 replays: acc vs {reference}: max rel. error {err:.1e}: {'OK' if err < 1e-5 else 'FAILED'}")


if __name__ == "__main__":
    main()
