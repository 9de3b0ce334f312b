# cuda.bindings is used for two queries cuda.core lacks (driver presence, NVRTC version).
from typing import Any

from . import driver as driver
from . import nvrtc as nvrtc

__version__: str

# Incomplete: names not listed here are Any, so code beyond scopegraph's use still type-checks.
def __getattr__(name: str) -> Any: ...
