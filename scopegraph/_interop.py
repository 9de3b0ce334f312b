"""Wrapping other libraries' tensors (PyTorch, CuPy, numpy, ...) without a copy.

cuda.core's ``StridedMemoryView`` reads DLPack and ``__cuda_array_interface__`` for device
memory; numpy's ``from_dlpack``/``asarray`` serve the host backend. The result is *borrowed*:
scopegraph keeps the foreign object alive but never frees its memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._device import device
from ._dtypes import as_dtype
from ._errors import SignatureError, diagnostic
from ._tensor import Allocation, Tensor


def tensor_from_foreign(obj: Any, name: str | None = None) -> Tensor:
    """A borrowed Tensor over ``obj``'s memory (device memory, or host memory on the host backend)."""
    is_device = hasattr(obj, "__cuda_array_interface__") or (
        hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] in (2, 3)  # kDLCUDA, kDLCUDAHost
    )
    if not is_device:
        arr = np.from_dlpack(obj) if hasattr(obj, "__dlpack__") else np.asarray(obj)
        if not arr.flags.c_contiguous:
            raise _not_contiguous(name)
        dev = device("host")
        storage = arr.reshape(-1).view(np.uint8)
        alloc = Allocation(dev, arr.nbytes, storage, name, borrowed=True)
        return Tensor(alloc, 0, arr.shape, as_dtype(arr.dtype))

    from cuda.core import Buffer
    from cuda.core.utils import StridedMemoryView

    view = StridedMemoryView.from_any_interface(obj, stream_ptr=-1)
    dtype = as_dtype(view.dtype)
    shape = tuple(view.shape)
    strides = view.strides
    expected = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
    if strides is not None and any(s != e for s, e, d in zip(strides, expected, shape) if d != 1):
        raise _not_contiguous(name)
    dev = device(f"cuda:{view.device_id}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = Buffer.from_handle(view.ptr, max(nbytes, 1), owner=obj)
    alloc = Allocation(dev, nbytes, buf, name, borrowed=True)
    return Tensor(alloc, 0, shape, dtype)


def _not_contiguous(name: str | None) -> SignatureError:
    return SignatureError(
        diagnostic(
            f"cannot wrap `{name or 'the tensor'}`: it is not contiguous",
            help="make it contiguous first (e.g. torch's .contiguous() or numpy.ascontiguousarray)",
        )
    )
