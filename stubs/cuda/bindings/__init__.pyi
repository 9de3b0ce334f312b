# cuda.bindings is used for two queries cuda.core lacks (driver presence, NVRTC version).
from . import driver as driver
from . import nvrtc as nvrtc

__version__: str
