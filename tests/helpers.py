"""Shared checks for the test suite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process, with this scopegraph importable: a child that
    runs a script (not ``-m``) or starts in another folder does not find an uninstalled checkout."""
    root = str(Path(sg.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def assert_stream_usable(stream: sg.Stream) -> None:
    """After an error: the stream is not left recording, and a valid graph built next replays correctly."""
    assert stream.recording is None
    dev = stream.device
    a = dev.from_numpy(np.arange(64, dtype=np.float32), name="check_a")
    out = dev.zeros((64,), name="check_out")
    with CudaGraph.scope(stream) as s:
        s.record(library.add_op(out.mut(), a, a))
        s.record(library.add_scalar_op(out.mut(), 1.0))
    with s.graph as graph:
        graph.launch()
        graph.sync()
        np.testing.assert_array_equal(out.numpy(), np.arange(64, dtype=np.float32) * 2 + 1)
    out.free()
    a.free()


def pinned(t: sg.Tensor) -> bool:
    return bool(t.allocation.pins)


def device_memory(device: sg.Device) -> dict[str, int]:
    """On CUDA: bytes in use and reserved in the device's memory pool (where scopegraph allocates),
    and the device's free memory. Empty on the host backend."""
    if not device.is_cuda:
        return {}
    from cuda.bindings import driver
    from cuda.core import Device as CoreDevice

    core: Any = CoreDevice(device.index)  # memory_resource is not in the stubs
    attrs = core.memory_resource.attributes
    err, free, _total = driver.cuMemGetInfo()
    assert int(err) == 0, f"cuMemGetInfo failed: {err}"
    return {
        "pool_used": int(attrs.used_mem_current),
        "pool_reserved": int(attrs.reserved_mem_current),
        "free": int(free),
    }


def cupy_on(region: sg.Region) -> Any:
    """CuPy's stream object for ``region.stream``, to make it CuPy's current stream
    (``Stream.from_external`` since CuPy 14, which deprecates ``ExternalStream``)."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    return from_external(region.stream) if from_external is not None else cupy.cuda.ExternalStream(region.handle)
