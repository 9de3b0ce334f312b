from __future__ import annotations

import numpy as np
import pytest

import scopegraph as sg


def test_constructors_and_attributes(sg_device: sg.Device) -> None:
    z = sg_device.zeros((4, 8), sg.f32, name="z")
    assert (z.shape, z.dtype, z.nbytes, z.device, z.name) == ((4, 8), sg.float32, 128, sg_device, "z")
    np.testing.assert_array_equal(z.numpy(), np.zeros((4, 8), np.float32))
    f = sg_device.full((3,), 2.5, sg.f64)
    np.testing.assert_array_equal(f.numpy(), [2.5, 2.5, 2.5])
    f.free()
    src = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = sg_device.from_numpy(src)
    assert t.dtype is sg.int32
    np.testing.assert_array_equal(t.numpy(), src)
    e = sg_device.empty(5, sg.u8)
    assert e.shape == (5,) and e.nbytes == 5


def test_allocation_ops_run_on_a_stream(sg_stream: sg.Stream) -> None:
    x = sg_stream.run(sg.zeros((16,), sg.f32, name="x"))
    assert isinstance(x, sg.Tensor) and x.name == "x"
    y = sg_stream.run(sg.full((16,), 3.0))
    z = sg_stream.run(sg.dup(y))
    w = sg_stream.run(sg.from_numpy(np.arange(16, dtype=np.float32)))
    e = sg_stream.run(sg.empty((2, 2), sg.i64))
    f = sg_stream.run(sg.full((2,), 1.5, sg.f64))  # 8-byte pattern that does not repeat: written from the host
    sg_stream.sync()
    np.testing.assert_array_equal(z.numpy(), np.full(16, 3.0, np.float32))
    np.testing.assert_array_equal(w.numpy(), np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(f.numpy(), [1.5, 1.5])
    assert e.shape == (2, 2) and x.numpy().sum() == 0


def test_views_share_memory(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    x = sg_device.from_numpy(np.arange(16, dtype=np.float32), name="x")
    v = x.view((4, 4))
    assert v.shape == (4, 4) and v.is_view and v.allocation is x.allocation
    assert x.view((-1, 8)).shape == (2, 8)
    rows = v[1:3]
    assert rows.shape == (2, 4) and rows.byte_range == (16, 48)
    # A view keeps its tensor's name; its rows are labelled as rows of the reshape (not x[1:3]).
    assert (v.name, rows.name, v[1].name) == ("x", "x.view((4, 4))[1:3]", "x.view((4, 4))[1]")
    assert x.view((16,))[1].name == "x[1]" and x.view((4, 4), name="grid")[1].name == "grid[1]"
    np.testing.assert_array_equal(rows.numpy(), np.arange(4, 12).reshape(2, 4))
    np.testing.assert_array_equal(v[-1].numpy(), [12, 13, 14, 15])
    sg_stream.run(sg.memset(rows.mut(), 0.0))
    sg_stream.sync()
    np.testing.assert_array_equal(x.numpy()[4:12], 0)
    with pytest.raises(sg.SignatureError, match="cannot view"):
        x.view((5, 3))
    with pytest.raises(sg.SignatureError, match="strided"):
        x[::2]
    with pytest.raises(IndexError):
        x[16]


def test_mut_and_freeze() -> None:
    dev = sg.device("host")
    x = dev.zeros((4,))
    m = x.mut()
    assert m.tensor is x and sg.mut(x).tensor is x
    before = x.frozen
    x.freeze()
    assert (before, x.frozen, x[0:2].frozen) == (False, True, True)
    with pytest.raises(sg.SignatureError, match="wraps a Tensor"):
        sg.Mut(3)  # type: ignore[type-var]


def test_dtypes_resolve() -> None:
    from scopegraph._dtypes import as_dtype

    assert as_dtype(sg.f32) is sg.float32
    assert as_dtype("f64") is sg.float64
    assert as_dtype(np.int32) is sg.int32
    with pytest.raises(sg.SignatureError, match="not a dtype"):
        as_dtype(complex)


def test_device_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sg.device("host") is sg.device("HOST")
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "host")
    assert sg.device() is sg.device("host")
    with pytest.raises(sg.SignatureError, match="unknown device"):
        sg.device("tpu")


def test_cuda_device_without_driver_is_a_clear_error() -> None:
    from scopegraph._driver import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has a GPU")
    with pytest.raises(sg.CudaError, match="no NVIDIA driver") as info:
        sg.device("cuda")
    assert info.value.result == "CUDA_ERROR_NO_DEVICE"
