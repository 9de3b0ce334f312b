"""Kernel compilation through cuda.core's ``Program`` (NVRTC), with two caches.

- In memory: one ObjectCode per cache key, for the life of the process.
- On disk: cuda.core's ``FileStreamProgramCache`` under ``$SCOPEGRAPH_CACHE_DIR`` (default
  ``~/.cache/scopegraph/kernels``), keyed by ``make_program_cache_key``, which pins the source,
  options, architecture, name expressions and NVRTC version. Next to each cubin it keeps the
  name expression's mangled symbol, which ``from_cubin`` needs to find template kernels.

Compiling to ``cubin`` for an explicit architecture needs no driver, so CI (no GPU) compiles
every shipped kernel; loading the result (``get_kernel``) is the CUDA backend's business.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import CompileError

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache

    from ._kernel import Kernel

_memory: dict[bytes, ObjectCode] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    root = os.environ.get("SCOPEGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "scopegraph")
    return Path(root) / "kernels"


@functools.cache
def _disk_cache(path: Path) -> FileStreamProgramCache | None:
    from cuda.core.utils import FileStreamProgramCache

    try:
        return FileStreamProgramCache(path, max_size_bytes=256 << 20)
    except OSError:
        return None  # an unwritable cache only costs recompiles


def _options(kernel: Kernel[Any], arch: str) -> ProgramOptions:
    from cuda.core import ProgramOptions

    try:
        return ProgramOptions(arch=arch, std="c++17", name=kernel.cpp_name, **dict(kernel.options))
    except TypeError as exc:
        raise CompileError(kernel.name_expression, f"bad compile option: {exc}") from None


def compile_kernel(kernel: Kernel[Any], arch: str) -> ObjectCode:
    """The compiled module holding ``kernel.name_expression`` for ``arch`` (e.g. ``"sm_90"``)."""
    from cuda.core.utils import make_program_cache_key

    options = _options(kernel, arch)
    key = make_program_cache_key(
        code=kernel.source, code_type="c++", options=options, target_type="cubin", name_expressions=(kernel.name_expression,)
    )
    with _lock:
        found = _memory.get(key)
        if found is None:
            disk = _disk_cache(cache_dir())
            found = _memory[key] = (disk is not None and _load(disk, key)) or _compile(kernel, options, disk, key)
    return found


def _load(disk: FileStreamProgramCache, key: bytes) -> ObjectCode | None:
    from cuda.core import ObjectCode

    cubin, symbols = disk.get(key), disk.get(key + b".symbols")
    if cubin is None or symbols is None:
        return None
    # The same form NVRTC's own result carries: name expression -> mangled name as bytes.
    mapping = {name: sym.encode() for name, sym in json.loads(symbols).items()}
    return ObjectCode.from_cubin(cubin, symbol_mapping=mapping)


def _compile(kernel: Kernel[Any], options: ProgramOptions, disk: FileStreamProgramCache | None, key: bytes) -> ObjectCode:
    from cuda.core import Program

    try:
        code = Program(kernel.source, "c++", options).compile("cubin", name_expressions=(kernel.name_expression,))
    except Exception as exc:  # cuda.core raises NVRTCError (a RuntimeError) carrying the log
        raise CompileError(kernel.name_expression, str(exc), [f"arch={options.arch}", *(f"{k}={v}" for k, v in kernel.options)]) from None
    if disk is not None:
        symbols = {name: sym.decode() if isinstance(sym, bytes) else sym for name, sym in code.symbol_mapping.items()}
        try:
            disk[key] = code
            disk[key + b".symbols"] = json.dumps(symbols).encode()
        except OSError:
            pass
    return code
