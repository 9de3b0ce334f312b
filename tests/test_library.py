"""The stock kernels against independent numpy math, on every backend (CUDA vs its host reference)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import library
from scopegraph._cli.seed_model import relative_error

NDArray = np.ndarray[Any, np.dtype[Any]]


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
    # vector path (one pass, several passes), scalar path (k % 4 != 0), vector with a tail of
    # rows and of columns, narrow rows (a block of one warp)
    for n, k in ((300, 1024), (70, 37), (5, 2048 + 4), (33, 512), (7, 260), (9, 64), (3, 12288)):
        w_np, x_np = rand(rng, n, k), rand(rng, k)
        out = sg_device.from_numpy(np.full(n, np.nan, np.float32))
        sg_stream.run(library.matvec_op(out.mut(), sg_device.from_numpy(x_np), sg_device.from_numpy(w_np)))
        sg_stream.sync()
        want = w_np.astype(np.float64) @ x_np.astype(np.float64)
        got = out.numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5, (n, k)


def _matvec_family(
    w: sg.Tensor, x: sg.Tensor, nw: sg.Tensor, outs: tuple[sg.Tensor, sg.Tensor, sg.Tensor], launch: Any = None
) -> list[sg.KernelLaunch]:
    """matvec, matvec_add and rms_norm_matvec into outs, through the helpers or as launch[grid, block]."""
    n, k = w.shape
    out, acc, normed = outs
    if launch is None:
        return [
            library.matvec_op(out.mut(), x, w),
            library.matvec_add_op(acc.mut(), x, w),
            library.rms_norm_matvec_op(normed.mut(), x, nw, w, 1e-5),
        ]
    return [
        library.matvec[launch](out.mut(), x, w, n, k),
        library.matvec_add[launch](acc.mut(), x, w, n, k),
        library.rms_norm_matvec[launch](normed.mut(), x, nw, w, 1e-5, n, k),
    ]


def _matvec_family_wants(w: NDArray, x: NDArray, nw: NDArray, acc: NDArray) -> list[NDArray]:
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    scaled = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * nw
    return [w64 @ x64, acc + w64 @ x64, w64 @ scaled]


@pytest.mark.parametrize("unaligned", ["x", "nw", "w"])
def test_matvecs_of_an_unaligned_tensor_take_the_scalar_path(
    sg_device: sg.Device, sg_stream: sg.Stream, unaligned: str
) -> None:
    """One tensor one float into its allocation (not 16-byte aligned): the float4 loads would fault
    or read the wrong floats, so each matvec-family kernel that reads it takes its scalar loop
    (the weights it loaded before the wait unused)."""
    rng = np.random.default_rng(3)
    n, k = 20, 256
    host = {"w": rand(rng, n, k), "x": rand(rng, k), "nw": rand(rng, k)}
    dev = {}
    for name, a in host.items():
        if name == unaligned:  # the same values, from the second float of a larger allocation
            whole = sg_device.from_numpy(np.concatenate([[np.float32(7.0)], a.reshape(-1)]))
            dev[name] = whole[1:].view(a.shape)
        else:
            dev[name] = sg_device.from_numpy(a)
    acc = rand(rng, n)
    outs = (sg_device.zeros((n,)), sg_device.from_numpy(acc), sg_device.zeros((n,)))
    for op in _matvec_family(dev["w"], dev["x"], dev["nw"], outs):
        sg_stream.run(op)
    sg_stream.sync()
    for got, want in zip(outs, _matvec_family_wants(host["w"], host["x"], host["nw"], acc), strict=True):
        assert relative_error(got.numpy(), want) < 1e-5, unaligned


@pytest.mark.parametrize(("n", "k", "grid", "block"), [(40, 2048, 5, 32), (21, 1928, 3, 96), (20, 2050, 3, 512)])
def test_raw_matvec_launches_of_other_blocks(
    sg_device: sg.Device, sg_stream: sg.Stream, n: int, k: int, grid: int, block: int
) -> None:
    """Blocks smaller than the helpers' (a 2048-wide row in 16 passes of one warp; 3 warps, not a
    power of two, in 5 passes with a tail) and the scalar loop over 16 warps (k % 4 != 0)."""
    rng = np.random.default_rng(4)
    w, x, nw, acc = rand(rng, n, k), rand(rng, k), rand(rng, k), rand(rng, n)
    outs = (sg_device.zeros((n,)), sg_device.from_numpy(acc), sg_device.zeros((n,)))
    dw, dx, dnw = (sg_device.from_numpy(a) for a in (w, x, nw))
    for op in _matvec_family(dw, dx, dnw, outs, launch=(grid, block)):
        sg_stream.run(op)
    sg_stream.sync()
    for got, want in zip(outs, _matvec_family_wants(w, x, nw, acc), strict=True):
        assert relative_error(got.numpy(), want) < 1e-5, (n, k, block)


@pytest.mark.parametrize("grid", [2, 9])
def test_a_matvec_family_grid_computes_the_rows_of_its_blocks(
    sg_device: sg.Device, sg_stream: sg.Stream, grid: int
) -> None:
    """20 rows, `out` the first 20 floats of 80 filled with NaN: 2 blocks compute rows 0..15 and
    leave the rest; 9 blocks (more than ceil(20 / 8)) compute all 20 rows and touch nothing past
    them. On a GPU as in the host references."""
    rng = np.random.default_rng(5)
    n, k = 20, 64
    w, x, nw, acc = rand(rng, n, k), rand(rng, k), rand(rng, k), rand(rng, n)
    buffers = [sg_device.from_numpy(np.full(80, np.nan, np.float32)) for _ in range(3)]
    sg_stream.run(sg.memcpy(buffers[1][:n].mut(), sg_device.from_numpy(acc)))
    outs = (buffers[0][:n], buffers[1][:n], buffers[2][:n])
    dw, dx, dnw = (sg_device.from_numpy(a) for a in (w, x, nw))
    for op in _matvec_family(dw, dx, dnw, outs, launch=(grid, 64)):
        sg_stream.run(op)
    sg_stream.sync()
    rows = min(n, 8 * grid)
    for buffer, want, before in zip(buffers, _matvec_family_wants(w, x, nw, acc), (None, acc, None), strict=True):
        got = buffer.numpy()
        assert relative_error(got[:rows], want[:rows]) < 1e-5, grid
        if before is None:
            assert np.isnan(got[rows:]).all(), grid
        else:
            np.testing.assert_array_equal(got[rows:n], before[rows:])
            assert np.isnan(got[n:]).all()


@pytest.mark.parametrize(("n", "k"), [(0, 16), (5, 0)])
def test_empty_matvecs_agree_with_the_host(sg_device: sg.Device, sg_stream: sg.Stream, n: int, k: int) -> None:
    """No rows: nothing written. No columns: a matvec is 0, matvec_add adds 0, and rms_norm_matvec
    is 0 / 0 = NaN (its mean of no squares), on every backend."""
    acc = np.arange(n, dtype=np.float32)
    outs = (sg_device.from_numpy(np.full(n, 3.0, np.float32)), sg_device.from_numpy(acc), sg_device.zeros((n,)))
    w, x = sg_device.zeros((n, k)), sg_device.zeros((k,))
    for op in _matvec_family(w, x, x, outs):
        sg_stream.run(op)
    sg_stream.sync()
    out, added, normed = (t.numpy() for t in outs)
    np.testing.assert_array_equal(out, np.zeros(n))
    np.testing.assert_array_equal(added, acc)
    assert np.isnan(normed).all()


def test_the_matvec_constants_are_the_kernels() -> None:
    """library.py's MATVEC_ROWS and MATVEC_MAX_THREADS (the host references' rows, the launch
    check's bound) are the source's own."""
    assert f"#define MATVEC_ROWS {library.MATVEC_ROWS}\n" in library.SOURCE
    assert f"#define MATVEC_MAX_THREADS {library.MATVEC_MAX_THREADS}\n" in library.SOURCE
    assert "__launch_bounds__(MATVEC_MAX_THREADS, 2)" in library.SOURCE


def test_matvec_ops_give_a_thread_a_float4_of_each_row() -> None:
    """The *_op helpers launch a block per 8 rows with a thread per float4 of a row, in whole
    warps, at most 512 threads (one pass over a row of 2048 floats), and no shared memory."""
    dev = sg.device("host")
    for n, k, grid, block in (
        (8, 512, 1, 128),
        (9, 2048, 2, 512),
        (2048, 4096, 256, 512),
        (3, 37, 1, 32),
        (1, 0, 1, 32),
    ):
        w, x, out = dev.zeros((n, k)), dev.zeros((k,)), dev.zeros((n,))
        for op in (
            library.matvec_op(out.mut(), x, w),
            library.matvec_add_op(out.mut(), x, w),
            library.rms_norm_matvec_op(out.mut(), x, x, w, 1e-5),
        ):
            assert (op.grid, op.block, op.shmem) == ((grid, 1, 1), (block, 1, 1), 0), (n, k, op.kernel.cpp_name)


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
