"""The stock kernels against independent numpy math, on every backend (CUDA vs its host reference)."""

from __future__ import annotations

import numpy as np

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
