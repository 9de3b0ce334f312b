"""Wrapping other libraries' tensors (PyTorch, CuPy, numpy, ...) without a copy.

cuda.core's ``StridedMemoryView`` reads DLPack and ``__cuda_array_interface__`` for device
memory; numpy's ``from_dlpack``/``asarray`` serve the host backend. The result is *borrowed*:
scopegraph keeps the foreign object alive (until the GPU work that used it has finished) but never
frees its memory. Wrappers of the same memory are one allocation to the ownership rules, because
those rules work on device addresses (``_allocation``).

Streams are exchanged both ways: importing passes a consumer stream to the producer (DLPack's
``stream=``, or the ``stream`` field of ``__cuda_array_interface__``) so its pending writes are
visible; exporting (``Tensor.__dlpack__``, ``__cuda_array_interface__``) makes the consumer's
stream wait for the work queued on the tensor's memory. While PyTorch captures a graph, whose
capture no stream outside it may join, an import of a PyTorch tensor asks for no stream, and an
export to a capturing stream waits for that work on the host (``CudaBackend.dlpack``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from . import _tensor
from ._borrow import Borrow
from ._device import device
from ._dtypes import DType, as_dtype
from ._errors import ScopeGraphError, SignatureError, diagnostic
from ._lifetime import note_eager_use, queued_on
from ._stream import Stream
from ._tensor import Tensor, check_name

KDL_CUDA = 2  # DLPack's device type of CUDA device memory
KDL_CUDA_HOST = 3  # pinned host memory: refused (13, managed memory, is device memory to cuda.core)


def tensor_from_foreign(obj: Any, name: str | None = None, stream: Stream | None = None) -> Tensor:
    """A borrowed Tensor over ``obj``'s memory (device memory, or host memory on the host backend).
    Read-only memory (a read-only numpy array, a read-only DLPack export) comes back frozen."""
    check_name(name, "sg.Tensor.from_dlpack()")
    if stream is not None and not isinstance(stream, Stream):
        raise SignatureError(
            f"from_dlpack(stream=) takes a scopegraph Stream, not {type(stream).__name__}\n"
            "help: pass dev.stream() or sg.Stream.from_handle(obj), or leave stream out"
        )
    if stream is not None and stream.recording is not None:  # the producer's wait is eager work there
        stream.check_not_recording("import an array with from_dlpack(stream=)")
    if isinstance(obj, Tensor):
        return _wrap_scopegraph(obj, name)
    try:
        is_device = hasattr(obj, "__cuda_array_interface__") or (
            hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] in (2, 3)  # kDLCUDA, kDLCUDAHost
        )
        if not is_device:
            return _wrap_host(obj, name)
        return _wrap_device(obj, name, stream)
    except (ScopeGraphError, AssertionError, MemoryError, RecursionError, Warning):
        raise  # ours, the interpreter's limits, and warnings made errors: not the object's description
    except Exception as exc:  # the producer refused, or described memory no device has (its own error, or the driver's)
        raise SignatureError(
            diagnostic(
                f"cannot wrap {type(obj).__name__} as a scopegraph tensor: {exc}",
                help="pass an object that supports DLPack or __cuda_array_interface__ (a torch, CuPy or numpy array)",
            )
        ) from exc


def _wrap_scopegraph(source: Tensor, name: str | None) -> Tensor:
    """Another wrapper of a scopegraph tensor's memory, made without an export (which a frozen
    tensor refuses). Like any two wrappers of one buffer it shares the source's region, so the
    bytes frozen there are frozen through it too (also once the source is dropped: the region
    keeps them), and no others become frozen."""
    source.check_alive()
    if source.device.is_cuda:
        from cuda.core import Buffer

        storage: object = Buffer.from_handle(source.data_ptr, max(source.nbytes, 1), owner=source)
    else:
        # A numpy slice keeps the memory alive by itself (its base), as the owner does on CUDA.
        whole: np.ndarray[Any, np.dtype[np.uint8]] = source.allocation.storage  # type: ignore[assignment]
        storage = whole[source.offset : source.offset + source.nbytes]
    alloc = source.device.adopt(storage, source.data_ptr, source.nbytes, name, borrowed=True)
    return Tensor(alloc, 0, source.shape, source.dtype)


def _has_memory(obj: Any) -> bool:
    """Whether numpy can view ``obj``'s own memory (an array, an object exporting an array or a
    buffer), rather than build an array from its values (a list, a number)."""
    if isinstance(obj, (list, tuple, range, int, float, complex, str, np.generic)):
        return False
    if hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__"):
        return True
    try:
        memoryview(obj)  # the buffer protocol
    except TypeError:
        pass
    else:
        return True
    if not hasattr(obj, "__array__"):
        return False
    try:  # an object that hands out its own array gives the same memory twice, not a new copy
        return bool(np.shares_memory(np.asarray(obj), np.asarray(obj)))
    except Exception:  # the object's __array__ failed: numpy will say so when it is asked again
        return True


def _wrap_host(obj: Any, name: str | None) -> Tensor:
    if not _has_memory(obj):
        raise SignatureError(
            diagnostic(
                f"cannot wrap {type(obj).__name__} as a scopegraph tensor: it has no memory to share, "
                "so writes to the wrapper would be lost",
                help="pass an array (numpy, torch, CuPy), or copy the values with dev.from_numpy(np.asarray(obj))",
            )
        )
    arr = np.from_dlpack(obj) if hasattr(obj, "__dlpack__") else np.asarray(obj)
    if not arr.flags.c_contiguous:
        raise _not_contiguous(name)
    dev = device("host")
    dtype = as_dtype(arr.dtype)
    _check_aligned(int(arr.ctypes.data), dtype, arr.nbytes, name)
    storage = arr.reshape(-1).view(np.uint8)
    alloc = dev.adopt(storage, int(arr.ctypes.data), arr.nbytes, name, borrowed=True)
    tensor = Tensor(alloc, 0, arr.shape, dtype)
    return tensor if arr.flags.writeable else tensor.freeze()  # read-only memory is frozen memory


def _wrap_device(obj: Any, name: str | None, stream: Stream | None) -> Tensor:
    from cuda.core import Buffer
    from cuda.core.utils import StridedMemoryView

    if stream is not None and not stream.device.is_cuda:
        raise SignatureError(f"cannot import GPU memory on {stream}\nhelp: pass a stream of a CUDA device, or none")
    # Where the producer must make its writes visible: the given stream, or the memory stream of
    # the array's device, which is then waited for so the wrapper is ready on every stream.
    dlpack_device = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else None
    if dlpack_device is not None and dlpack_device[0] == KDL_CUDA_HOST:
        raise _pinned(obj)
    index = int(dlpack_device[1]) if dlpack_device is not None else _cai_device(obj)
    on_a_gpu = index is not None
    if stream is not None and on_a_gpu and stream.device.index != index:
        raise SignatureError(
            diagnostic(
                f"cannot import memory of cuda:{index} on {stream} (of {stream.device})",
                ["the stream would order work of another GPU than the memory's"],
                help=f"pass a stream of cuda:{index}, the memory's device, or none",
            )
        )
    consumer = stream if stream is not None else device(f"cuda:{index or 0}").setup_stream
    if _torch_captures(obj):
        # PyTorch synchronises the device before its capture begins, and nothing it captures runs
        # now: there is nothing to wait for, and a wait would join `consumer` to its capture.
        view = StridedMemoryView.from_any_interface(obj, stream_ptr=-1)
    else:
        with consumer.device.backend.relaxed():  # (another thread's capture stays valid)
            view = StridedMemoryView.from_any_interface(obj, stream_ptr=consumer.handle)
            if stream is None:
                consumer.sync()
    dtype = as_dtype(view.dtype)
    shape = tuple(view.shape)
    strides = view.strides
    expected = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    if strides is not None and any(s != e for s, e, d in zip(strides, expected, shape, strict=True) if d != 1):
        raise _not_contiguous(name)
    if view.device_id < 0:  # a __cuda_array_interface__ over pinned host memory
        raise _pinned(obj)
    dev = device(f"cuda:{view.device_id}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    _check_aligned(int(view.ptr), dtype, nbytes, name)
    buf = Buffer.from_handle(view.ptr, max(nbytes, 1), owner=obj)
    alloc = dev.adopt(buf, int(view.ptr), nbytes, name, borrowed=True)
    tensor = Tensor(alloc, 0, shape, dtype)
    if stream is not None:
        # The producer's writes are complete on `stream` only: like eager work there, the next
        # replay of a graph over this memory (a graph recorded from now on, too) waits for it.
        imported = [Borrow(tensor, False, "import")]
        note_eager_use(imported, stream.native, dev.backend)
        queued_on(imported, stream.native)
    return tensor.freeze() if view.readonly else tensor  # read-only memory is frozen memory


def _torch_captures(obj: Any) -> bool:
    """Whether ``obj`` is a PyTorch tensor and PyTorch captures a CUDA graph on its current stream
    (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def _cai_device(obj: Any) -> int | None:
    """The device of a ``__cuda_array_interface__`` pointer (the interface does not say); None
    when the driver cannot tell (a null pointer of an empty array)."""
    from cuda.bindings import driver

    # cuda.bindings: cuda.core has no pointer-attribute query.
    ptr = obj.__cuda_array_interface__["data"][0]
    err, ordinal = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    return int(ordinal) if err == driver.CUresult.CUDA_SUCCESS else None


def _pinned(obj: object) -> SignatureError:
    return SignatureError(
        diagnostic(
            f"cannot wrap {type(obj).__name__} as a scopegraph tensor: its memory is pinned host memory, not a GPU's",
            ["scopegraph tensors live on one device, whose streams order their work"],
            help="copy it to the GPU first (torch's .cuda(), or dev.from_numpy(np.asarray(obj)))",
        )
    )


def _check_aligned(address: int, dtype: DType, nbytes: int, name: str | None) -> None:
    """Memory a kernel reads as ``dtype`` starts at a multiple of its size: on a GPU a misaligned
    load or store is a fault that ends the CUDA context (a foreign array sliced at a byte offset,
    say); refused on every backend, as what runs on the host runs on a GPU."""
    if nbytes and address % dtype.itemsize:
        raise SignatureError(
            diagnostic(
                f"cannot wrap {f'`{name}`' if name else 'the array'}: its memory starts at {address:#x}, "
                f"not a multiple of {dtype.itemsize} bytes, the size of its elements ({dtype.name})",
                ["a GPU cannot load or store misaligned elements: the kernel would fault"],
                help="wrap an aligned copy (numpy's .copy(), torch's .clone(), CuPy's .copy()), "
                "or view the bytes with a dtype of 1-byte elements",
            )
        )


def _not_contiguous(name: str | None) -> SignatureError:
    return SignatureError(
        diagnostic(
            f"cannot wrap `{name or 'the tensor'}`: it is not contiguous",
            help="make it contiguous first (e.g. torch's .contiguous() or numpy.ascontiguousarray)",
        )
    )


_tensor.foreign_wrapper = tensor_from_foreign
