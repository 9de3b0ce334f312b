"""Exporting frozen tensors through DLPack: no consumer gets a writable alias by default.

torch 2.11 and CuPy 14 take a capsule flagged read-only (DLPack 1.x) as a writable array, so the
flag alone would not protect frozen weights: a frozen export is refused unless the consumer asks
for ``copy=False`` (an alias flagged read-only, the caller's promise) or ``copy=True``. Mutable
tensors export as before. The capsule-level tests run on every backend; the numpy ones on the
host; the torch and CuPy ones need a GPU (marked ``cuda``)."""

from __future__ import annotations

import ctypes
import pickle
from typing import Any, cast

import numpy as np
import pytest

import scopegraph as sg

NDArray = np.ndarray[Any, np.dtype[Any]]

READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
VERSIONED = (1, 0)

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


# DLManagedTensorVersioned: DLPackVersion (two uint32), manager_ctx, deleter, uint64 flags, then
# the DLTensor, whose first field is the data pointer.
_FLAGS = 8 + 2 * ctypes.sizeof(ctypes.c_void_p)


def capsule_flags(capsule: object) -> int:
    """The ``flags`` of a versioned capsule's DLManagedTensorVersioned (left unconsumed)."""
    assert _get_name(capsule) == b"dltensor_versioned"
    return ctypes.c_uint64.from_address(_get_pointer(capsule, b"dltensor_versioned") + _FLAGS).value


def capsule_data(capsule: object) -> int:
    """The data pointer of a versioned capsule's tensor (left unconsumed)."""
    managed = _get_pointer(capsule, b"dltensor_versioned")
    return ctypes.c_void_p.from_address(managed + _FLAGS + 8).value or 0


def export_kwargs(dev: sg.Device, **kwargs: Any) -> dict[str, Any]:
    """What a consumer passes to __dlpack__: on a GPU, a stream (-1: no ordering needed here)."""
    return {"stream": -1, **kwargs} if dev.is_cuda else kwargs


def weights(dev: sg.Device) -> sg.Tensor:
    return dev.from_numpy(np.arange(16, dtype=np.float32), name="w").freeze()


# -- every backend: what the capsule says ------------------------------------------------------


def test_a_frozen_alias_is_flagged_read_only(sg_device: sg.Device) -> None:
    w = weights(sg_device)
    capsule = w.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED, copy=False))
    assert capsule_flags(capsule) & READ_ONLY


def test_a_mutable_tensor_exports_writable_as_before(sg_device: sg.Device) -> None:
    x = sg_device.zeros((16,), name="x")
    assert not capsule_flags(x.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED))) & READ_ONLY
    assert _get_name(x.__dlpack__(**export_kwargs(sg_device))) == b"dltensor"  # unversioned still allowed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_version": VERSIONED}, r"without copy=False or copy=True"),
        ({"max_version": VERSIONED, "copy": None}, r"without copy=False or copy=True"),
        ({}, r"as an unversioned DLPack capsule"),
        ({"copy": False}, r"as an unversioned DLPack capsule"),
        ({"max_version": (0, 8), "copy": False}, r"as an unversioned DLPack capsule"),
    ],
    ids=["versioned-default", "versioned-copy-None", "legacy", "legacy-copy-False", "max-version-0.8"],
)
def test_a_frozen_export_that_could_be_written_is_refused(
    sg_device: sg.Device, kwargs: dict[str, Any], message: str
) -> None:
    w = weights(sg_device)
    with pytest.raises(sg.FrozenExportError, match=message) as info:
        w.__dlpack__(**export_kwargs(sg_device, **kwargs))
    assert isinstance(info.value, sg.BorrowError) and isinstance(info.value, BufferError)
    text = str(info.value)
    assert "`w` is frozen" in text and "\nhelp: " in text and "copy=True" in text
    np.testing.assert_array_equal(w.numpy(), np.arange(16, dtype=np.float32))


def test_a_view_is_refused_exactly_when_it_overlaps_frozen_bytes(sg_device: sg.Device) -> None:
    x = sg_device.zeros((16,), name="x")
    x[4:8].freeze()
    assert not capsule_flags(x[0:4].__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED))) & READ_ONLY
    for overlapping in (x[6:10], x):
        with pytest.raises(sg.FrozenExportError):
            overlapping.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED))
        alias = overlapping.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED, copy=False))
        assert capsule_flags(alias) & READ_ONLY


def test_freeze_is_refused_while_a_writable_export_of_those_bytes_lives(sg_device: sg.Device) -> None:
    """Another library's writable alias may write the memory whatever scopegraph says: freeze()
    waits for it to go (the tensor froze, and its bytes then changed through the alias). An export
    of other bytes, and a read-only one, do not stand in the way. (A capsule not yet consumed is
    such an export: it holds the memory as the consumer's array would.)"""
    x = sg_device.zeros((16,), name="x")
    capsule = x[0:8].__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED))
    with pytest.raises(sg.BorrowError, match="holds a writable zero-copy export") as info:
        x[4:12].freeze()
    assert "\nhelp: " in str(info.value) and not x.frozen
    x[8:16].freeze()
    del capsule
    x.freeze()
    alias = x.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED, copy=False))
    x[0:4].freeze()  # again, with a read-only alias alive
    assert capsule_flags(alias) & READ_ONLY and x.allocation.writable_exports == []


def test_copy_true_exports_a_writable_copy_of_its_own(sg_device: sg.Device) -> None:
    """What the help line names: copy=True gives memory of the consumer's own, frozen or not (on a
    GPU scopegraph makes the copy: cuda.core exports only aliases)."""
    for t in (weights(sg_device), sg_device.from_numpy(np.arange(16, dtype=np.float32), name="x")):
        capsule = t.__dlpack__(**export_kwargs(sg_device, max_version=VERSIONED, copy=np.True_))
        assert not capsule_flags(capsule) & READ_ONLY and capsule_data(capsule) not in (0, t.data_ptr)


@pytest.mark.parametrize(
    "kwargs",
    [{"copy": "yes"}, {"copy": 1}, {"max_version": 1}, {"max_version": "1.0"}, {"max_version": [1, 0]}],
    ids=["copy-str", "copy-int", "version-int", "version-str", "version-list"],
)
def test_odd_export_arguments_are_a_signature_error(sg_device: sg.Device, kwargs: dict[str, Any]) -> None:
    for t in (weights(sg_device), sg_device.zeros((16,), name="x")):
        with pytest.raises(sg.SignatureError, match=r"copy is None or a bool"):
            t.__dlpack__(**export_kwargs(sg_device, **kwargs))


def test_wrapping_a_scopegraph_tensor_keeps_exactly_its_frozen_bytes_frozen(sg_device: sg.Device) -> None:
    """sg.Tensor.from_dlpack of a scopegraph tensor: a wrapper of the same bytes, no export (which a
    frozen one refuses); its frozen bytes stay frozen through it, and nothing else becomes frozen
    (a wrapper of a partly frozen view must not freeze the rest of the view)."""
    w = weights(sg_device)
    wrapped = sg.Tensor.from_dlpack(w, name="wrapped")
    assert wrapped.frozen and wrapped.data_ptr == w.data_ptr
    np.testing.assert_array_equal(wrapped.numpy(), np.arange(16, dtype=np.float32))
    x = sg_device.zeros((16,), name="x")
    x[4:8].freeze()
    part = sg.Tensor.from_dlpack(x[2:6], name="part")
    assert part.data_ptr == x[2:6].data_ptr and part[2:4].frozen and not part[0:2].frozen
    assert not x[2:4].frozen
    stream = sg_device.stream()
    stream.run(sg.memset(x[2:4].mut(), 1.0))
    stream.run(sg.memset(part[0:2].mut(), 2.0))
    with pytest.raises(sg.BorrowError, match="frozen"):
        sg.memset(part[2:4].mut(), 3.0)
    np.testing.assert_array_equal(x.numpy()[:6], [0, 0, 2, 2, 0, 0])


def test_the_error_survives_pickling() -> None:
    error = sg.FrozenExportError.refusing("w", "dlpack")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is sg.FrozenExportError and str(again) == str(error)


# -- the host backend: numpy, which honours the read-only flag ----------------------------------


@pytest.fixture
def host() -> sg.Device:
    return sg.device("host")


def numpy_import(tensor: sg.Tensor, **kwargs: Any) -> NDArray:
    """``numpy.from_dlpack`` (whose stubs accept only a ``__dlpack__`` that takes ``stream=None``)."""
    return np.from_dlpack(cast(Any, tensor), **kwargs)


def test_numpy_alias_of_a_frozen_tensor_is_read_only(host: sg.Device) -> None:
    w = weights(host)
    alias = numpy_import(w, copy=False)
    assert alias.ctypes.data == w.data_ptr and not alias.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        alias[0] = 42.0
    np.testing.assert_array_equal(w.numpy(), np.arange(16, dtype=np.float32))


def test_numpy_default_import_of_a_frozen_tensor_is_refused(host: sg.Device) -> None:
    with pytest.raises(sg.FrozenExportError, match=r"without copy=False or copy=True"):
        numpy_import(weights(host))


def test_numpy_copy_of_a_frozen_tensor_is_writable_and_separate(host: sg.Device) -> None:
    w = weights(host)
    copy = numpy_import(w, copy=True)
    assert copy.flags.writeable and copy.ctypes.data != w.data_ptr
    copy[0] = 42.0
    assert w.numpy()[0] == 0.0


def test_numpy_alias_of_a_mutable_tensor_is_writable_and_shared(host: sg.Device) -> None:
    x = host.zeros((16,), name="x")
    alias = numpy_import(x)
    assert alias.flags.writeable and alias.ctypes.data == x.data_ptr
    alias[3] = 7.0
    assert x.numpy()[3] == 7.0


def test_numpy_view_of_the_unfrozen_part_stays_writable(host: sg.Device) -> None:
    x = host.zeros((16,), name="x")
    x[4:8].freeze()
    head = numpy_import(x[0:4])
    head[:] = 1.0
    np.testing.assert_array_equal(x.numpy()[:8], [1, 1, 1, 1, 0, 0, 0, 0])
    assert not numpy_import(x[2:6], copy=False).flags.writeable


# -- a GPU: torch and CuPy, which ignore the read-only flag -------------------------------------


@pytest.fixture
def cuda() -> sg.Device:
    return sg.device("cuda")


@pytest.mark.sg_cuda
def test_torch_gets_no_writable_alias_of_a_frozen_tensor(cuda: sg.Device) -> None:
    torch = pytest.importorskip("torch")
    w = weights(cuda)
    with pytest.raises(sg.FrozenExportError, match=r"without copy=False"):
        torch.from_dlpack(w)
    alias = torch.from_dlpack(w, copy=False)  # the caller's explicit promise; the capsule says read-only
    assert alias.data_ptr() == w.data_ptr and alias.sum().item() == 120.0
    copy = torch.from_dlpack(w, copy=True)  # the help line's writable copy
    assert copy.data_ptr() != w.data_ptr
    copy += 1.0
    torch.cuda.synchronize()
    assert copy.sum().item() == 136.0
    np.testing.assert_array_equal(w.numpy(), np.arange(16, dtype=np.float32))


@pytest.mark.sg_cuda
def test_cupy_gets_no_writable_alias_of_a_frozen_tensor(cuda: sg.Device) -> None:
    cp = pytest.importorskip("cupy")
    w = weights(cuda)
    with pytest.raises(sg.FrozenExportError, match=r"without copy=False"):
        cp.from_dlpack(w)
    alias = cp.from_dlpack(w, copy=False)
    assert alias.data.ptr == w.data_ptr and float(alias.sum()) == 120.0
    with pytest.raises(sg.FrozenExportError, match=r"through __cuda_array_interface__"):
        cp.asarray(w)  # the interface's read-only field, which CuPy ignores
    copy = cp.from_dlpack(w, copy=True)
    copy += 1.0
    assert copy.data.ptr != w.data_ptr and float(copy.sum()) == 136.0
    np.testing.assert_array_equal(w.numpy(), np.arange(16, dtype=np.float32))


@pytest.mark.sg_cuda
def test_torch_round_trips_a_mutable_tensor_without_a_copy(cuda: sg.Device) -> None:
    torch = pytest.importorskip("torch")
    x = cuda.zeros((16,), name="x")
    t = torch.from_dlpack(x)
    assert t.data_ptr() == x.data_ptr
    t.fill_(3.0)
    torch.cuda.synchronize()
    assert x.numpy().tolist() == [3.0] * 16


@pytest.mark.sg_cuda
def test_torch_imports_onto_the_tensors_own_device_when_it_names_it(cuda: sg.Device) -> None:
    """torch.from_dlpack(x, device="cuda:0") asks for dl_device=(2, 0), the tensor's own: cuda.core's
    BufferError ("dl_device other than None") escaped; another device is an ExportError."""
    torch = pytest.importorskip("torch")
    x = cuda.zeros((16,), name="x")
    t = torch.from_dlpack(x, device=f"cuda:{cuda.index}")
    assert t.data_ptr() == x.data_ptr
    with pytest.raises(sg.ExportError, match="exports it only there"):
        x.__dlpack__(dl_device=(1, 0))  # the host


@pytest.mark.sg_cuda
def test_cupy_round_trips_a_mutable_tensor_without_a_copy(cuda: sg.Device) -> None:
    cp = pytest.importorskip("cupy")
    x = cuda.zeros((16,), name="x")
    a = cp.from_dlpack(x)
    assert a.data.ptr == x.data_ptr == cp.asarray(x).data.ptr
    a += 3.0
    cp.cuda.runtime.deviceSynchronize()
    assert x.numpy().tolist() == [3.0] * 16


# -- free() while a zero-copy export lives -----------------------------------------------------


def test_free_is_refused_while_a_numpy_alias_lives(host: sg.Device) -> None:
    x = host.full((16,), 1.0, name="x")
    alias = numpy_import(x)
    copy = numpy_import(x, copy=True)  # a copy aliases nothing
    with pytest.raises(sg.LifetimeError, match=r"(?s)another library's array still aliases.*\nhelp: drop those"):
        x.free()
    del alias
    x.free()
    assert copy[0] == 1.0


@pytest.mark.sg_cuda
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_free_is_refused_while_a_gpu_alias_lives(cuda: sg.Device, library: str) -> None:
    """Without the refusal the next allocation took the same memory and torch's or CuPy's array
    read it (measured on an H100)."""
    lib = pytest.importorskip(library)
    x = cuda.full((1 << 16,), 1.0, name="x")
    alias = lib.from_dlpack(x)
    with pytest.raises(sg.LifetimeError, match="another library's array still aliases"):
        x.free()
    assert float(alias[0]) == 1.0
    del alias
    x.free()


@pytest.mark.sg_cuda
def test_a_gpu_export_racing_a_freeze_is_refused(cuda: sg.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread freezes the tensor while its unversioned export (which cannot say
    "read-only") waits for the tensor's work: the export is refused. The backend read `frozen`
    again after the wait and asked for a read-only alias, whose flag cuda.core drops from such a
    capsule: torch or CuPy would have got a writable alias of frozen memory."""
    x = cuda.zeros((16,), name="x")
    settle = cuda.backend._settle  # type: ignore[attr-defined]

    def frozen_meanwhile(*args: Any) -> Any:
        x.freeze()
        return settle(*args)

    monkeypatch.setattr(cuda.backend, "_settle", frozen_meanwhile)
    with pytest.raises(sg.BorrowError, match="it was frozen meanwhile"):
        x.__dlpack__()
    assert x.frozen and x.allocation.exports == 0 and x.allocation.writable_exports == []


def test_freeze_is_refused_while_a_numpy_alias_lives(host: sg.Device) -> None:
    x = host.zeros((4,), name="x")
    alias = numpy_import(x)
    with pytest.raises(sg.BorrowError, match="writable zero-copy export"):
        x.freeze()
    alias[0] = 99.0  # still the user's to write, as the refusal left it
    del alias
    np.testing.assert_array_equal(x.freeze().numpy(), [99.0, 0.0, 0.0, 0.0])


FREEZE_BESIDE_A_COLLECTED_EXPORT = """
import gc, os, threading, time
import numpy as np
import scopegraph as sg

dev = sg.device("host")
x, y = dev.zeros((16,), name="x"), dev.zeros((16,), name="y")
cycle = [np.from_dlpack(x)]  # a writable export of x, collected only by the garbage collector
cycle.append(cycle)
del cycle
gc.disable()
held = threading.Event()

def register_collecting() -> None:  # as MemoryMap.register, when an allocation there collects
    with dev.memory._lock:
        held.set()
        time.sleep(0.3)  # meanwhile the other thread calls y.freeze()
        gc.collect()  # the export's finalizer runs here

threading.Thread(target=register_collecting, daemon=True).start()
held.wait()
freezer = threading.Thread(target=y.freeze, daemon=True)
freezer.start()
freezer.join(5)
print("deadlocked" if freezer.is_alive() else "froze", flush=True)
os._exit(0)
"""


def test_a_freeze_beside_a_collected_export_does_not_deadlock() -> None:
    """freeze() held the exports' lock while it waited for the memory map's, and garbage
    collection under the memory map's lock (in register) ran an export's finalizer, which waits
    for the exports' lock: a lock-order inversion. The memory map's lock comes first now."""
    import subprocess
    import sys

    from .helpers import child_env

    done = subprocess.run(
        [sys.executable, "-c", FREEZE_BESIDE_A_COLLECTED_EXPORT],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "froze", done.stdout + done.stderr


@pytest.mark.parametrize(
    ("meanwhile", "error", "message"),
    [("free", sg.LifetimeError, "it was freed meanwhile"), ("freeze", sg.BorrowError, "it was frozen meanwhile")],
)
def test_an_export_racing_a_free_or_a_freeze_is_refused(
    host: sg.Device, monkeypatch: pytest.MonkeyPatch, meanwhile: str, error: type[Exception], message: str
) -> None:
    """Another thread frees or freezes the tensor after the export checked it (alive, mutable) and
    before the export holds it (played here from inside the export): the export is refused, not an
    alias of freed memory, nor a writable alias of frozen memory."""
    from scopegraph._backends import _host

    x = host.full((16,), 1.0, name="x")
    view_of = _host._array

    def changed_meanwhile(tensor: sg.Tensor, writable: bool) -> NDArray:
        getattr(x, meanwhile)()
        return view_of(tensor, writable)

    monkeypatch.setattr(_host, "_array", changed_meanwhile)
    with pytest.raises(error, match=message):
        numpy_import(x)
    assert x.allocation.exports == 0 and x.allocation.writable_exports == []


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ({"dl_device": (2, 0)}, r"lives on host \(DLPack device \(1, 0\)\), and scopegraph exports it only there"),
        ({"dl_device": "cpu"}, r"dl_device is a \(device type, device id\) tuple"),
        ({"dl_device": np.array([1, 0])}, "dl_device is a"),
        ({"bogus": 1}, "takes stream, copy, max_version and dl_device only"),
    ],
)
def test_an_export_the_tensor_cannot_make_is_a_buffer_error_with_help(asked: dict[str, Any], message: str) -> None:
    """numpy's own BufferError (or TypeError) escaped for another device or an unknown argument;
    now an ExportError, which DLPack consumers still see as the BufferError they expect, and for
    an unknown argument also the TypeError they take to mean an older producer (and ask again)."""
    t = sg.device("host").zeros((4,), name="t")
    with pytest.raises(sg.ExportError, match=message) as caught:
        t.__dlpack__(**asked)
    assert isinstance(caught.value, BufferError) and "help:" in str(caught.value)
    assert isinstance(caught.value, TypeError) == ("bogus" in asked)
    assert np.from_dlpack(cast(Any, t)).shape == (4,)  # its own device: exported
    assert t.__dlpack__(dl_device=(1, 0)) is not None
