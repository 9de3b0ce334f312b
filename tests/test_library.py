"""The stock kernels against independent numpy math, on every backend (CUDA vs its host reference)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import library


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_kernels(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(0)
    n = 1000  # not a multiple of the block: the tail must be handled
    a_np, b_np = rand(rng, n), rand(rng, n)
    a, b = sg_device.from_numpy(a_np), sg_device.from_numpy(b_np)
    out = sg_device.from_numpy(np.full(n, np.nan, np.float32))  # poisoned: every element must be written
    sg_stream.run(library.add_op(out.mut(), a, b))
    sg_stream.sync()
    np.testing.assert_allclose(out.numpy(), a_np + b_np, rtol=1e-6)
    sg_stream.run(library.axpy_op(out.mut(), a, 3.0))
    sg_stream.run(library.add_scalar_op(out.mut(), 0.5))
    sg_stream.sync()
    np.testing.assert_allclose(out.numpy(), a_np + b_np + 3.0 * a_np + 0.5, rtol=1e-5, atol=1e-6)
    sg_stream.run(library.fill_op(out.mut(), -2.0))
    sg_stream.run(library.noop[1, 1]())
    sg_stream.sync()
    np.testing.assert_array_equal(out.numpy(), -2.0)


def test_rms_norm(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(1)
    x_np, w_np = rand(rng, 3, 300), rand(rng, 300)
    out = sg_device.from_numpy(np.full((3, 300), np.nan, np.float32))
    sg_stream.run(library.rms_norm_op(out.mut(), sg_device.from_numpy(x_np), sg_device.from_numpy(w_np), 1e-5))
    sg_stream.sync()
    x64 = x_np.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-5) * w_np
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def test_matvec_vector_and_scalar_paths(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    rng = np.random.default_rng(2)
    # vector path, scalar path, vector with a tail; the narrow build (k <= 512), with a tail
    for n, k in ((300, 1024), (70, 37), (5, 2048 + 4), (33, 512), (7, 260)):
        w_np, x_np = rand(rng, n, k), rand(rng, k)
        out = sg_device.from_numpy(np.full(n, np.nan, np.float32))
        sg_stream.run(library.matvec_op(out.mut(), sg_device.from_numpy(x_np), sg_device.from_numpy(w_np)))
        sg_stream.sync()
        want = w_np.astype(np.float64) @ x_np.astype(np.float64)
        got = out.numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5, (n, k)


def test_the_widest_rows_that_fit_shared_memory_run_everywhere(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """k = 12288 (48 KiB of x): rms_norm_matvec's static shared memory (its block sum) left no room
    to stage x, so the GPU refused the launch (LaunchResourceError) that the host ran; it now takes
    the unstaged path there, and the matvecs without static shared memory still stage x."""
    rng = np.random.default_rng(5)
    n, k = 8, 12288
    w_np, x_np, nw_np = rand(rng, n, k), rand(rng, k), rand(rng, k)
    w, x, nw = (sg_device.from_numpy(a) for a in (w_np, x_np, nw_np))
    out = sg_device.zeros((n,))
    fused = library.rms_norm_matvec_op(out.mut(), x, nw, w, 1e-5)
    assert fused.shmem == 0 and library.matvec_op(out.mut(), x, w).shmem == 4 * k
    sg_stream.run(fused)
    x64 = x_np.astype(np.float64)
    normed = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * nw_np
    want = w_np.astype(np.float64) @ normed
    assert np.linalg.norm(out.numpy() - want) / np.linalg.norm(want) < 1e-5


def test_matvec_ops_take_the_narrow_build_for_narrow_rows() -> None:
    dev = sg.device("host")
    for k, narrow in ((512, True), (516, False), (2048, False), (37, True)):
        w, x, out = dev.zeros((8, k)), dev.zeros((k,)), dev.zeros((8,))
        for op, kern in (
            (library.matvec_op(out.mut(), x, w), library.matvec),
            (library.matvec_add_op(out.mut(), x, w), library.matvec_add),
            (library.rms_norm_matvec_op(out.mut(), x, x, w, 1e-5), library.rms_norm_matvec),
        ):
            assert op.kernel is (library.narrow(kern) if narrow else kern), (k, kern.cpp_name)
    assert library.narrow(library.matvec) is library.narrow(library.matvec)  # built once
    assert library.narrow(library.matvec).options == (("define_macro", ("CHUNK", "4")),)


def test_references_follow_the_kernels_pointer_arithmetic_and_grid(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """Raw launches with odd shapes: each kernel indexes flat memory from each tensor's start and
    covers what its grid covers; the host references do exactly the same (hand-computed numpy)."""

    def run(op: sg.GraphNode, *outs: sg.Tensor) -> list[np.ndarray]:
        sg_stream.run(op)
        sg_stream.sync()
        return [t.numpy() for t in outs]

    rng = np.random.default_rng(3)
    # the matvec family reads w + row * k: the first n * k floats as an n x k matrix, whatever w's shape
    w_np, x_np, nw_np = rand(rng, 4, 8), rand(rng, 4), rand(rng, 4)
    w, x, nw = sg_device.from_numpy(w_np), sg_device.from_numpy(x_np), sg_device.from_numpy(nw_np)
    flat = w_np.reshape(-1)[:16].reshape(4, 4).astype(np.float64)
    out = sg_device.zeros((4,))
    (got,) = run(library.matvec[1, 256](out.mut(), x, w, 4, 4), out)
    np.testing.assert_allclose(got, flat @ x_np, rtol=1e-5, atol=1e-6)
    (got,) = run(library.matvec_add[1, 256](out.mut(), x, w, 4, 4), out)
    np.testing.assert_allclose(got, 2 * (flat @ x_np), rtol=1e-5, atol=1e-6)
    scale = 1 / np.sqrt(np.mean(x_np.astype(np.float64) ** 2) + 1e-5)
    (got,) = run(library.rms_norm_matvec[1, 256](out.mut(), x, nw, w, 1e-5, 4, 4), out)
    np.testing.assert_allclose(got, flat @ (x_np * nw_np) * scale, rtol=1e-5, atol=1e-6)

    # rms_norm: one block per row, so grid 1 normalises row 0 only and leaves row 1 as it was
    x2_np, g_np = rand(rng, 2, 256), rand(rng, 256)
    x2, g = sg_device.from_numpy(x2_np), sg_device.from_numpy(g_np)
    o2 = sg_device.from_numpy(np.full((2, 256), 7.0, np.float32))
    (got,) = run(library.rms_norm.generics(128)[1, 128](o2.mut(), x2, g, 1e-6, 256), o2)
    row = x2_np[0].astype(np.float64)
    np.testing.assert_allclose(got[0], row / np.sqrt(np.mean(row * row) + 1e-6) * g_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], 7.0)
    # ... and a row of 256 in tensors of 300 (touches: 1 * 256 <= 300) is a valid launch
    x3_np = rand(rng, 300)
    x3, o3 = sg_device.from_numpy(x3_np), sg_device.from_numpy(np.full(300, 7.0, np.float32))
    (got,) = run(library.rms_norm.generics(128)[1, 128](o3.mut(), x3, g, 1e-6, 256), o3)
    row = x3_np[:256].astype(np.float64)
    np.testing.assert_allclose(got[:256], row / np.sqrt(np.mean(row * row) + 1e-6) * g_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[256:], 7.0)

    # elementwise: thread i = blockIdx.x * blockDim.x + threadIdx.x handles element i < n, so a
    # grid of 1 x 32 threads touches the first 32 of n = 64
    a_np, b_np = rand(rng, 64), rand(rng, 64)
    a, b = sg_device.from_numpy(a_np), sg_device.from_numpy(b_np)
    e = sg_device.from_numpy(np.full(64, 7.0, np.float32))
    want = np.full(64, 7.0, np.float32)
    (got,) = run(library.fill[1, 32](e.mut(), 1.0, 64), e)
    want[:32] = 1.0
    np.testing.assert_array_equal(got, want)
    (got,) = run(library.add[1, 16](e.mut(), a, b, 64), e)
    want[:16] = a_np[:16] + b_np[:16]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (got,) = run(library.axpy[2, 8](e.mut(), a, 2.0, 64), e)
    want[:16] += 2.0 * a_np[:16]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (got,) = run(library.add_scalar[1, 8](e.mut(), 0.5, 64), e)
    want[:8] += 0.5
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_op_helpers_refuse_arguments_of_the_wrong_kind() -> None:
    """Every *_op helper: None, a numpy array, a number or a string for a tensor, a Mut where it
    reads and a Tensor where it writes are each a SignatureError with help, as for a kernel launch."""
    dev = sg.device("host")

    def t(*shape: int) -> sg.Tensor:
        return dev.zeros(shape)

    def flag() -> sg.Tensor:
        return dev.zeros((1,), sg.i32)

    helpers: dict[str, Callable[[], list[Any]]] = {
        "fill_op": lambda: [t(8).mut(), 1.0],
        "add_op": lambda: [t(8).mut(), t(8), t(8)],
        "axpy_op": lambda: [t(8).mut(), t(8), 2.0],
        "add_scalar_op": lambda: [t(8).mut(), 1.0],
        "rms_norm_op": lambda: [t(2, 8).mut(), t(2, 8), t(8), 1e-6],
        "matvec_op": lambda: [t(4).mut(), t(8), t(4, 8)],
        "matvec_add_op": lambda: [t(4).mut(), t(8), t(4, 8)],
        "rms_norm_matvec_op": lambda: [t(4).mut(), t(8), t(8), t(4, 8), 1e-6],
        "count_down_op": lambda: [flag().mut()],
        "append_row_op": lambda: [t(3, 8).mut(), flag().mut(), flag().mut(), t(8)],
    }
    for name, make in helpers.items():
        helper = getattr(library, name)
        assert isinstance(helper(*make()), sg.GraphNode), name
        for i, arg in enumerate(make()):
            wrong: list[object] = [None, np.zeros(8, np.float32), "x"]
            if isinstance(arg, (sg.Tensor, sg.Mut)):
                wrong += [3, arg.tensor if isinstance(arg, sg.Mut) else arg.mut()]
            for bad in wrong:
                args = make()
                args[i] = bad
                with pytest.raises(sg.SignatureError, match=r"(?m)^help: \S"):
                    helper(*args)


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (0,)])
def test_rms_norm_of_no_elements_is_no_work(sg_device: sg.Device, sg_stream: sg.Stream, shape: tuple[int, ...]) -> None:
    """Issue 8: zero-size ops record as no work (rms_norm_op refused rows of no elements, and
    asked for grid 0 when there were no rows)."""
    x, out, w = sg_device.zeros(shape, name="x"), sg_device.zeros(shape, name="out"), sg_device.zeros((8,), name="w")
    op = library.rms_norm_op(out.mut(), x, w, 1e-6)
    sg_stream.run(op)
    with sg.CudaGraph.scope(sg_stream) as s:
        s.record(library.rms_norm_op(out.mut(), x, w, 1e-6))
    with s.graph as g:
        g.launch()
        g.sync()
    assert out.numpy().shape == shape
    with pytest.raises(sg.SignatureError, match="help:"):
        library.rms_norm_op(sg_device.zeros(()).mut(), sg_device.zeros(()), w, 1e-6)
    if shape[-1]:  # weights too few for a row: refused with no rows too, as with rows
        with pytest.raises(sg.SignatureError, match="help:"):
            library.rms_norm_op(out.mut(), x, sg_device.zeros((shape[-1] - 1,), name="short"), 1e-6)


def test_the_library_is_an_attribute_of_the_package() -> None:
    """DESIGN section 3: `scopegraph.library` ships the kernels, and `import scopegraph as sg` is
    the documented import, so `sg.library.axpy` works without a second import."""
    import scopegraph

    assert scopegraph.library is library and "library" in scopegraph.__all__
    assert scopegraph.library.axpy is library.axpy
