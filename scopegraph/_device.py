"""Devices and backend selection.

``sg.device()`` picks CUDA when a driver and a GPU exist and the host (numpy) backend
otherwise; ``SCOPEGRAPH_DEVICE`` overrides that default. One Device object exists per
device, so tensors compare devices by identity.
"""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

import numpy as np

from . import _stream
from ._allocation import Allocation, MemoryMap
from ._driver import cuda_device_count
from ._dtypes import DTypeLike, as_dtype, float32
from ._errors import CudaError, SignatureError, diagnostic, not_copyable
from ._lifetime import track
from ._ops import _shape
from ._ops import zeros as zeros_op
from ._stream import Stream
from ._tensor import Tensor, check_name

if TYPE_CHECKING:
    from ._backends._base import Backend


class Device:
    """A place tensors live and work runs: ``host`` or ``cuda:N``."""

    def __init__(self, kind: str, index: int, backend: Backend) -> None:
        self.kind = kind
        self.index = index
        self.backend = backend
        self.is_cuda = kind == "cuda"
        self.is_host = kind == "host"
        self._setup_stream: Stream | None = None
        # Live allocations by address: memory identity (see _allocation).
        self.memory = MemoryMap()

    # One Device per device (sg.device): a copy is the device itself.
    def __copy__(self) -> Device:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Device:
        return self

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:  # pickle
        raise not_copyable(f"device {self}", f"call sg.device({str(self)!r}) in the other process")

    def __repr__(self) -> str:
        return f"sg.device({str(self)!r})"

    def __str__(self) -> str:
        return "host" if self.is_host else f"cuda:{self.index}"

    def stream(self) -> Stream:
        """A new stream on this device."""
        return Stream(self, self.backend.create_stream())

    def sync(self) -> None:
        """Wait for all work on this device."""
        self.backend.sync()

    @property
    def setup_stream(self) -> Stream:
        """The stream eager constructors use; they wait for it, so their tensors are ready anywhere."""
        if self._setup_stream is None:
            self._setup_stream = self.stream()
        return self._setup_stream

    # -- eager constructors ---------------------------------------------------------------

    def empty(
        self, shape: int | tuple[int, ...] | list[int], dtype: DTypeLike = float32, name: str | None = None
    ) -> Tensor:
        """A new, uninitialised tensor."""
        check_name(name, "dev.empty()")
        dt = as_dtype(dtype)
        dims = _shape(shape, dt)  # also refuses sizes no device holds
        nbytes = math.prod(dims) * dt.itemsize  # Python ints: numpy's int64 would wrap silently
        try:
            storage, address = self.backend.allocate(nbytes)
        except MemoryError:
            # The host backend's numpy allocation: reported as the CUDA backend reports a failed
            # allocation (a CudaError with the driver's out-of-memory result).
            raise self._out_of_memory(nbytes, f"the {self} backend", f"a tensor of shape {dims} ({dt.name})") from None
        return Tensor(self.adopt(storage, address, nbytes, name, borrowed=False), 0, dims, dt)

    def _out_of_memory(self, nbytes: int, who: str, what: str) -> CudaError:
        return CudaError(
            f"allocating {nbytes} bytes on {self}",
            "CUDA_ERROR_OUT_OF_MEMORY",
            diagnostic(
                f"{who} could not allocate {nbytes} bytes for {what}",
                help="allocate less (check the shape), or free tensors the program no longer needs",
            ),
        )

    def adopt(self, storage: object, address: int, nbytes: int, name: str | None, borrowed: bool) -> Allocation:
        """An Allocation for memory at ``address`` (owned, or borrowed from another library),
        registered by address and released by the lifetime rules. (Its callers check ``name``.)"""
        alloc = Allocation(self, nbytes, storage, address, name, borrowed)
        track(alloc, self.memory)
        return alloc

    def zeros(
        self, shape: int | tuple[int, ...] | list[int], dtype: DTypeLike = float32, name: str | None = None
    ) -> Tensor:
        """A new tensor of zeros (False for a bool tensor)."""
        return self._run_setup(zeros_op(shape, dtype, name))

    def full(
        self,
        shape: int | tuple[int, ...] | list[int],
        value: float,
        dtype: DTypeLike = float32,
        name: str | None = None,
    ) -> Tensor:
        """A new tensor with every element ``value``."""
        from ._ops import full

        return self._run_setup(full(shape, value, dtype, name))

    def from_numpy(self, array: np.ndarray[Any, Any], name: str | None = None, stream: Stream | None = None) -> Tensor:
        """A new tensor holding a copy of ``array`` (copied on ``stream`` if given, and complete
        when this returns)."""
        if stream is not None:
            if not isinstance(stream, Stream):
                raise SignatureError(
                    f"dev.from_numpy(stream=) takes a scopegraph Stream, not {type(stream).__name__}\n"
                    "help: pass dev.stream(), or leave stream out"
                )
            if stream.recording is not None:
                stream.check_not_recording("copy an array to the device (dev.from_numpy)")
            if stream.foreign and stream.captured:
                raise stream.captured_error("copy an array to the device (dev.from_numpy)")
        if not isinstance(array, np.ndarray):
            raise SignatureError(
                f"dev.from_numpy() takes a numpy array, not {type(array).__name__}\n"
                "help: convert with numpy.asarray(...) first, or wrap a GPU array with sg.Tensor.from_dlpack"
            )
        # The tensor first: its dtype, and memory the device lacks (a broadcast view may stand for
        # terabytes), are refused before any host copy.
        tensor = self.empty(array.shape, array.dtype, name)
        try:
            arr = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d
        except MemoryError:
            tensor.free()
            raise self._out_of_memory(
                tensor.nbytes, "the host", f"a contiguous copy of the array to copy from (shape {array.shape})"
            ) from None
        self.backend.write(tensor, arr, stream)
        return tensor

    def _run_setup(self, op: Any) -> Tensor:
        stream = self.setup_stream
        tensor: Tensor = stream.run(op)
        stream.sync()
        return tensor


_devices: dict[str, Device] = {}
_lock = threading.Lock()


DEVICE_ENV = "SCOPEGRAPH_DEVICE"


def env_device() -> str | None:
    """The device ``SCOPEGRAPH_DEVICE`` names, or None where it is unset or blank (pick one)."""
    value = os.environ.get(DEVICE_ENV, "")
    return value if value.strip() else None


def device(spec: str | Device | None = None) -> Device:
    """``"cuda"``, ``"cuda:N"``, ``"host"``, or None: CUDA when a driver and GPU exist, else host.

    The ``SCOPEGRAPH_DEVICE`` environment variable overrides the None default (set but blank, it
    is unset).
    """
    if isinstance(spec, Device):
        return spec
    from_env = False
    if spec is None:
        named = env_device()
        from_env = named is not None
        spec = named if named is not None else ("cuda" if cuda_device_count() else "host")
    if not isinstance(spec, str):
        raise SignatureError(
            f"sg.device() takes a device name, not {type(spec).__name__} {spec!r}\n"
            'help: use "host", "cuda", "cuda:N", a Device, or None to pick'
        )
    key = spec.strip().lower()
    if key == "cuda":
        key = "cuda:0"
    with _lock:
        found = _devices.get(key)
        if found is None:
            found = _devices[key] = _make_device(key, spec, from_env)
    return found


def _make_device(key: str, spec: str, from_env: bool) -> Device:
    """The device ``key`` names (``spec`` as given: by the caller, or by SCOPEGRAPH_DEVICE when
    ``from_env``, which a refusal then names, with what to set it to)."""
    if key == "host":
        from ._backends._host import HostBackend

        return Device("host", 0, HostBackend())
    kind, _, index_text = key.partition(":")
    if kind != "cuda" or not index_text.isdigit():
        if from_env:
            raise SignatureError(
                diagnostic(
                    f"{DEVICE_ENV}={spec!r} names no device (sg.device() reads it when given no name)",
                    help=f'set {DEVICE_ENV} to "host", "cuda" or "cuda:N", or unset it to let sg.device() pick',
                )
            )
        raise SignatureError(f'unknown device {spec!r}\nhelp: use "host", "cuda" or "cuda:N" (or None to pick)')
    index = int(index_text)
    count = cuda_device_count()
    if index >= count:
        advice = ""  # CudaError's own (_errors.CUDA_ADVICE), unless the name came from the environment
        if from_env:
            advice = (
                f"unset {DEVICE_ENV} (sg.device() then picks the host backend when no GPU is found) or set it to host"
                if count == 0
                else f"set {DEVICE_ENV} to a GPU that exists (cuda:0..cuda:{count - 1}), or unset it"
            ) + "; `python -m scopegraph info` shows the driver and GPUs that scopegraph sees"
        raise CudaError(
            f"selecting device {spec!r}" + (f" (named by {DEVICE_ENV})" if from_env else ""),
            "CUDA_ERROR_NO_DEVICE" if count == 0 else "CUDA_ERROR_INVALID_DEVICE",
            "no NVIDIA driver or GPU was found"
            if count == 0
            else f"this machine has {count} CUDA device(s): cuda:0..cuda:{count - 1}",
            help=advice,
        )
    from ._backends._cuda import CudaBackend

    return Device("cuda", index, CudaBackend(index))


_stream.device_lookup = device
