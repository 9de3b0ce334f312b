from os import PathLike
from typing import Any

import numpy

from . import Buffer, ObjectCode, ProgramOptions

class StridedMemoryView:
    ptr: int
    device_id: int
    readonly: bool
    @classmethod
    def from_any_interface(cls, obj: object, stream_ptr: int | None = None) -> StridedMemoryView: ...
    @classmethod
    def from_buffer(
        cls,
        buffer: Buffer,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        *,
        dtype: numpy.dtype[Any] | None = None,
        is_readonly: bool = False,
    ) -> StridedMemoryView: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...] | None: ...
    @property
    def dtype(self) -> numpy.dtype[Any] | None: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object: ...

class FileStreamProgramCache:
    def __init__(self, path: str | PathLike[str] | None = None, *, max_size_bytes: int | None = None) -> None: ...
    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None: ...
    def __setitem__(self, key: bytes | str, value: bytes | ObjectCode) -> None: ...

def make_program_cache_key(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions,
    target_type: str,
    name_expressions: tuple[str, ...] = ...,
    extra_digest: bytes | None = None,
) -> bytes: ...

# Incomplete: names not listed here are Any, so code beyond scopegraph's use still type-checks.
def __getattr__(name: str) -> Any: ...
