"""Kernel compilation through cuda.core's ``Program`` (NVRTC), with two caches.

- In memory: one ObjectCode per cache key, for the life of the process.
- On disk: cuda.core's ``FileStreamProgramCache`` under ``$SCOPEGRAPH_CACHE_DIR`` (default
  ``~/.cache/scopegraph/kernels``), keyed by ``make_program_cache_key``, which pins the source,
  options, architecture, name expressions and NVRTC version. Next to each cubin it keeps the
  name expression's mangled symbol, which ``from_cubin`` needs to find template kernels.

Headers are part of the key: a kernel compiled with ``include_path`` and ``pre_include`` options
is keyed by the contents of every file under each include directory (relative path and bytes)
and by the pre-included names, so editing a header recompiles and an unchanged one is a hit.
Options that write files while compiling, or read a precompiled header, cannot be cached and
are refused.

Compiling to ``cubin`` for an explicit architecture needs no driver, so CI (no GPU) compiles
every shipped kernel; loading the result (``get_kernel``) is the CUDA backend's business.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import CompileError, ScopeGraphError, diagnostic

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache

    from ._kernel import Kernel

_memory: dict[bytes, ObjectCode] = {}
_lock = threading.Lock()

# Options that write a file as a side effect of compiling (a cache hit would skip it), or read a
# precompiled header whose contents the key cannot see.
_UNCACHEABLE = ("create_pch", "time", "fdevice_time_trace", "pch", "use_pch", "pch_dir")


class _BadCompileInput(CompileError):
    """A kernel's compile options are unusable before NVRTC runs: ``log`` says why."""

    def __init__(self, kernel: Kernel[Any], problem: str, help: str) -> None:
        self.kernel_name = kernel.name_expression
        self.log = problem
        ScopeGraphError.__init__(
            self, diagnostic(f"cannot compile kernel `{kernel.name_expression}`: {problem}", help=help)
        )


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


def _path_list(kernel: Kernel[Any], name: str, value: object) -> list[str]:
    """``include_path`` / ``pre_include`` as NVRTC takes them: one str or Path, or a list or tuple of them."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    paths = [os.fspath(v) for v in items if isinstance(v, (str, os.PathLike))]
    if not items or len(paths) != len(items) or not all(isinstance(p, str) and p for p in paths):
        raise _BadCompileInput(
            kernel,
            f"bad compile option: {name}={value!r}",
            f"pass {name} as a non-empty str or pathlib.Path, or a non-empty list of them",
        )
    return [str(p) for p in paths]


def _header_digest(kernel: Kernel[Any], include_path: list[str], pre_include: list[str]) -> bytes:
    """SHA-256 over every file under each include directory (sorted relative path and bytes) and
    the pre-included names (with the file's bytes where the name is a file outside them)."""
    digest = hashlib.sha256()

    def put(label: str, payload: bytes) -> None:
        digest.update(label.encode())
        digest.update(len(payload).to_bytes(8, "big"))
        digest.update(payload)

    for directory in include_path:
        root = Path(directory)
        if not root.is_dir():
            raise _BadCompileInput(
                kernel,
                f"include_path {directory!r} is not a directory",
                "pass the directories that hold the kernel's headers; a relative path is resolved "
                f"from the working directory ({os.getcwd()})",
            )
        put("include_dir", directory.encode())
        try:
            files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
            for relative, file in files:
                put("file", relative.encode())
                put("bytes", file.read_bytes())
        except OSError as exc:
            raise _BadCompileInput(
                kernel,
                f"cannot read the headers under include_path {directory!r}: {exc}",
                "make every file under the include directories readable, or point include_path at a narrower directory",
            ) from None
    for name in pre_include:
        put("pre_include", name.encode())
        try:
            if Path(name).is_file():  # found from the working directory, not through include_path
                put("pre_include_bytes", Path(name).read_bytes())
        except OSError as exc:
            raise _BadCompileInput(
                kernel, f"cannot read pre_include {name!r}: {exc}", "make the header readable"
            ) from None
    return digest.digest()


def _options(kernel: Kernel[Any], arch: str) -> tuple[ProgramOptions, bytes | None]:
    """The ProgramOptions for ``kernel`` and the digest of the headers they pull in (None without any)."""
    from cuda.core import ProgramOptions

    given = dict(kernel.options)
    refused = [name for name in _UNCACHEABLE if given.get(name) not in (None, False)]
    if refused:
        raise _BadCompileInput(
            kernel,
            f"bad compile option: {', '.join(refused)} cannot be cached",
            "scopegraph caches every compiled kernel; drop the option (precompiled headers and "
            "compile-time traces are not supported)",
        )
    include_path = (
        _path_list(kernel, "include_path", given["include_path"]) if given.get("include_path") is not None else []
    )
    pre_include = (
        _path_list(kernel, "pre_include", given["pre_include"]) if given.get("pre_include") is not None else []
    )
    given.update({"include_path": include_path or None, "pre_include": pre_include or None})
    try:
        options = ProgramOptions(arch=arch, std="c++17", name=kernel.cpp_name, **given)
    except (TypeError, ValueError) as exc:
        raise _BadCompileInput(
            kernel,
            f"bad compile option: {exc}",
            "use the fields of cuda.core.ProgramOptions, e.g. {'use_fast_math': True}",
        ) from None
    extra = _header_digest(kernel, include_path, pre_include) if include_path or pre_include else None
    return options, extra


def _cache_key(kernel: Kernel[Any], arch: str) -> tuple[ProgramOptions, bytes]:
    from cuda.core.utils import make_program_cache_key

    options, extra = _options(kernel, arch)
    try:
        key = make_program_cache_key(
            code=kernel.source,
            code_type="c++",
            options=options,
            target_type="cubin",
            name_expressions=(kernel.name_expression,),
            extra_digest=extra,
        )
    except (TypeError, ValueError) as exc:  # an option the cache cannot key
        raise _BadCompileInput(kernel, f"bad compile option: {exc}", "drop the option named above") from None
    return options, key


def compile_kernel(kernel: Kernel[Any], arch: str) -> ObjectCode:
    """The compiled module holding ``kernel.name_expression`` for ``arch`` (e.g. ``"sm_90"``)."""
    options, key = _cache_key(kernel, arch)
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


def _compile(
    kernel: Kernel[Any], options: ProgramOptions, disk: FileStreamProgramCache | None, key: bytes
) -> ObjectCode:
    from cuda.core import Program

    try:
        code = Program(kernel.source, "c++", options).compile("cubin", name_expressions=(kernel.name_expression,))
    except Exception as exc:  # cuda.core raises NVRTCError (a RuntimeError) carrying the log
        raise CompileError(
            kernel.name_expression, str(exc), [f"arch={options.arch}", *(f"{k}={v}" for k, v in kernel.options)]
        ) from None
    if disk is not None:
        symbols = {name: sym.decode() if isinstance(sym, bytes) else sym for name, sym in code.symbol_mapping.items()}
        try:
            disk[key] = code
            disk[key + b".symbols"] = json.dumps(symbols).encode()
        except OSError:
            pass
    return code
