"""``python -m scopegraph info``: what scopegraph sees on this machine.

Versions of scopegraph and what it runs on, whether an NVIDIA driver answers, each GPU with its
architecture, the device ``sg.device()`` picks and why, NVRTC, and the kernel cache directory.
Nothing here needs a GPU: every driver query is made through ``cuda.bindings`` and any failure
is reported as a line, never raised.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .._device import DEVICE_ENV, env_device
from .args import device_spec


@dataclass
class Gpu:
    index: int
    name: str
    arch: str
    memory_bytes: int


@dataclass
class Driver:
    """What the CUDA driver said: ``error`` is None when it answered."""

    error: str | None = None
    cuda_version: str | None = None
    gpus: list[Gpu] = field(default_factory=list)


def _check(result: tuple[Any, ...], call: str) -> tuple[Any, ...]:
    """cuda.bindings returns (status, *values): the values, or a RuntimeError naming the status."""
    from cuda.bindings import driver

    status, *values = result
    if status != driver.CUresult.CUDA_SUCCESS:
        name = getattr(status, "name", str(status))
        raise RuntimeError(f"{call} returned {name}")
    return tuple(values)


def probe_driver() -> Driver:
    """Ask the driver (through cuda.bindings, never cuda.core) for its version and GPUs."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return Driver(error="cuda.bindings is not installed (pip install 'scopegraph[cuda]')")
    attr = driver.CUdevice_attribute
    try:
        _check(driver.cuInit(0), "cuInit")
        (version,) = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
        (count,) = _check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        gpus = []
        for i in range(int(count)):
            (dev,) = _check(driver.cuDeviceGet(i), "cuDeviceGet")
            (raw,) = _check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
            (major,) = _check(
                driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                "cuDeviceGetAttribute",
            )
            (minor,) = _check(
                driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                "cuDeviceGetAttribute",
            )
            (memory,) = _check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
            name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip()
            gpus.append(Gpu(i, name, f"sm_{major}{minor}", int(memory)))
    except Exception as exc:  # a missing libcuda.so raises from cuda.pathfinder's loader
        return Driver(error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    return Driver(cuda_version=f"{int(version) // 1000}.{int(version) % 1000 // 10}", gpus=gpus)


def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        status, major, minor = nvrtc.nvrtcVersion()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return f"not usable: nvrtcVersion returned {getattr(status, 'name', status)}"
        return f"{major}.{minor} (compiles kernels, with or without a GPU)"
    except Exception as exc:
        return f"not found: {type(exc).__name__}: {exc}".splitlines()[0]


def package_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def default_device(drv: Driver) -> tuple[str, str]:
    """The device ``sg.device()`` picks, and why (the same rule, stated without building it)."""
    chosen = env_device()  # blank counts as unset, as in sg.device()
    if chosen is not None:
        try:
            spec = device_spec(chosen)
        except argparse.ArgumentTypeError as exc:
            return "none", f"{DEVICE_ENV}={chosen!r} is set but is not a device ({exc}): sg.device() raises"
        if spec.startswith("cuda") and int(spec.partition(":")[2] or 0) >= len(drv.gpus):
            return spec, f"{DEVICE_ENV}={chosen} is set, but there is no such GPU: sg.device() raises"
        return spec, f"{DEVICE_ENV}={chosen} is set"
    if drv.gpus:
        return "cuda:0", f"a driver answered with {len(drv.gpus)} GPU(s)"
    if drv.error is None:
        return "host", "the driver answered but reports no GPU"
    return "host", "no NVIDIA driver or GPU: the numpy host backend stands in"


def _cache_line() -> str:
    from .._compile import cache_dir

    path = cache_dir()
    if not path.is_dir():
        return f"{path} (not created yet)"
    files = [p for p in path.rglob("*") if p.is_file()]
    return f"{path} ({len(files)} files, {sum(p.stat().st_size for p in files) / 1e6:.1f} MB)"


def lines() -> list[tuple[str, str]]:
    """The report as (name, value) pairs."""
    import numpy

    from .. import __version__

    drv = probe_driver()
    chosen, why = default_device(drv)
    rows = [
        ("scopegraph", f"{__version__} ({Path(__file__).resolve().parents[1]})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", numpy.__version__),
        ("cuda.core", package_version("cuda-core")),
        ("cuda.bindings", package_version("cuda-bindings")),
        ("nvrtc", nvrtc_version()),
        ("driver", f"CUDA {drv.cuda_version} driver API" if drv.error is None else f"none ({drv.error})"),
    ]
    if drv.gpus:
        rows += [(f"cuda:{g.index}", f"{g.name}, {g.arch}, {g.memory_bytes / 2**30:.1f} GiB") for g in drv.gpus]
    else:
        rows.append(("gpus", "none"))
    rows += [
        ("default device", f"{chosen} ({why})"),
        ("kernel cache", _cache_line()),
        ("torch", f"{package_version('torch')} (benchmark comparisons only)"),
        ("tqdm", f"{package_version('tqdm')} (progress bars in a terminal; plain lines otherwise)"),
    ]
    return rows


def main() -> int:
    rows = lines()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0
