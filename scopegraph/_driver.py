"""Is there a usable NVIDIA driver and GPU? Asked once per process.

With no driver, ``import cuda.core`` works but ``Device()`` raises, and a second
``ObjectCode.get_kernel()`` hangs forever; so nothing in scopegraph touches cuda.core's
device, stream or kernel objects unless this says a GPU is present.
"""

from __future__ import annotations

import functools


@functools.cache
def cuda_device_count() -> int:
    """Number of CUDA devices, 0 when cuda-python, the driver or a GPU is missing."""
    try:
        # cuda.bindings, not cuda.core: cuda.core has no query that answers "no driver"
        # without raising from deep inside Device(); cuInit's status says it directly.
        from cuda.bindings import driver
    except ImportError:
        return 0
    try:
        (status,) = driver.cuInit(0)
        if status != driver.CUresult.CUDA_SUCCESS:
            return 0
        status, count = driver.cuDeviceGetCount()
        return int(count) if status == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # a missing libcuda.so raises RuntimeError from the loader
        return 0


def driver_available() -> bool:
    return cuda_device_count() > 0
