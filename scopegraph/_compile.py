"""Kernel compilation through cuda.core's ``Program`` (NVRTC), with two caches.

- In memory: one ObjectCode per cache key, for the life of the process.
- On disk: cuda.core's ``FileStreamProgramCache`` under ``$SCOPEGRAPH_CACHE_DIR`` (default
  ``~/.cache/scopegraph/kernels``), keyed by ``make_program_cache_key``, which pins the source,
  options, architecture, name expressions and NVRTC version. Next to each cubin it keeps the
  name expression's mangled symbol, which ``from_cubin`` needs to find template kernels. An entry
that cannot be read back (a symbols file that is not what was written, a cubin cut short) is a
miss: compiled again and overwritten.

Headers are part of the key: a kernel compiled with ``include_path`` and ``pre_include`` options
is keyed by the contents of every file under each include directory (relative path and bytes)
and by the pre-included names, so editing a header recompiles and an unchanged one is a hit.
Options that write files while compiling, or read a precompiled header, cannot be cached and
are refused.

Compiling to ``cubin`` for an explicit architecture needs no driver, so CI (no GPU) compiles
every shipped kernel; loading the result (``get_kernel``) is the CUDA backend's business.

A ``pdl=True`` kernel compiled for sm_90 or later is checked to wait (DESIGN.md section 7): the
PTX that NVRTC made on the way to the cubin (read from the same program, no second compile) must
have ``griddepcontrol.wait`` in the kernel's entry point or in a device function reachable from
it (``call`` targets and other references, through ``.func`` bodies). If not, the kernel is
refused with a PdlWaitError before anything is loaded. The verdict is kept with the cubin, in
memory and in the symbols entry on disk, so the check runs once per cache key; a cubin without a
verdict (compiled for a ``pdl=False`` twin, or by an older scopegraph) is compiled once more.
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
import os
import re
import threading
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ._errors import CompileError, PdlWaitError, ScopeGraphError, diagnostic

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache

    from ._kernel import Kernel

_memory: dict[bytes, ObjectCode] = {}
# The PDL wait check's verdicts by cache key (True: the entry point reaches griddepcontrol.wait);
# only for pdl=True kernels compiled for sm_90+. A verdict is a function of the key alone.
_waits: dict[bytes, bool] = {}
_lock = threading.Lock()

# Options that write a file as a side effect of compiling (a cache hit would skip it), or read a
# precompiled header whose contents the key cannot see.
_UNCACHEABLE = ("create_pch", "time", "fdevice_time_trace", "pch", "use_pch", "pch_dir")


class _BadCompileInput(CompileError):
    """A kernel cannot be compiled for a reason NVRTC's log does not give (unusable options, or no
    PTX for the pdl=True wait check): ``log`` says why."""

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


def _header_digest(kernel: Kernel[Any], include_path: list[str], pre_include: list[str], reached: list[str]) -> bytes:
    """SHA-256 over every file under each include directory (sorted relative path and bytes), the
    pre-included names (with the file's bytes where the name is a file outside them) and the
    headers included from elsewhere (``_reached_headers``: path and bytes)."""
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
    for header in reached:
        put("header", header.encode())
        try:
            put("header_bytes", Path(header).read_bytes())
        except OSError:
            continue  # gone since it was found: NVRTC will say so
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


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)', re.M)


def _reached_headers(source: str, include_path: list[str], pre_include: list[str], from_cwd: bool) -> list[str]:
    """The header files the preprocessor would open for ``source`` (and the ``pre_include``
    headers), followed through the headers themselves, where they lie outside the include
    directories (whose whole contents are hashed anyway): a quoted include found from the working
    directory (NVRTC's directory for a source without a path, unless no_source_include), an
    absolute one, or one reached with ``..``. Conditional compilation is ignored (a header under an
    #if that is off is hashed too); a computed include (``#include MACRO``) is not followed."""
    roots = [os.path.realpath(d) + os.sep for d in include_path]
    try:
        cwd: str | None = os.getcwd() if from_cwd else None
    except OSError:  # the working directory was removed: NVRTC cannot search it either
        cwd = None
    found: dict[str, None] = {}
    seen: set[str] = set()
    pending: list[tuple[str, str | None]] = [(source, cwd)]
    pending += [(f'#include "{name}"', cwd) for name in pre_include]

    def located(name: str, places: list[str]) -> str | None:
        for place in places:
            try:
                path = os.path.realpath(os.path.join(place, name))
                if path in seen or os.path.isfile(path):
                    return path
            except (OSError, ValueError):  # a name too long, a NUL byte: NVRTC will say so
                continue
        return None

    while pending:
        text, here = pending.pop()
        for quoted, angled in _INCLUDE.findall(text):
            places = ([here] if quoted and here is not None else []) + include_path
            file = located(quoted or angled, [""] if os.path.isabs(quoted or angled) else places)
            if file is None or file in seen:
                continue  # a system header (or one NVRTC reports missing), or seen already
            seen.add(file)
            if not any(file.startswith(root) for root in roots):
                found[file] = None
            try:
                with open(file, encoding="utf-8", errors="replace") as header:
                    pending.append((header.read(), os.path.dirname(file)))
            except OSError:
                continue  # unreadable: NVRTC will say so
    return list(found)


# A real architecture: a cubin is compiled for one (a virtual compute_XX gives no cubin).
_ARCH = re.compile(r"sm_\d{2,3}[af]?")


def _options(kernel: Kernel[Any], arch: str, headers: bool = True) -> tuple[ProgramOptions, bytes | None]:
    """The ProgramOptions for ``kernel`` and the digest of the headers they pull in (None without
    any, and with ``headers=False``, which reads no file: the include directories are not looked
    for, and no header is read)."""
    from cuda.core import ProgramOptions

    if type(arch) is not str or not _ARCH.fullmatch(arch):
        raise _BadCompileInput(
            kernel,
            f"arch={arch!r} is not a GPU architecture",
            'name a real architecture as NVRTC does: "sm_90" (Hopper), "sm_80", "sm_100a", ... '
            "(a cubin needs one; compute_XX names a virtual one)",
        )
    given: dict[str, Any] = dict(kernel.options)
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
    chosen = [name for name in ("arch", "name") if name in given]
    if chosen:
        raise _BadCompileInput(
            kernel,
            f"bad compile option: {', '.join(chosen)} is scopegraph's to choose",
            "drop it: the architecture is the GPU's (or compile_kernel's arch=), the name the kernel's",
        )
    if given.get("std") is None:
        given["std"] = "c++17"
    _check_option_types(kernel, given, ProgramOptions)
    try:
        options = ProgramOptions(arch=arch, name=kernel.cpp_name, **given)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _BadCompileInput(
            kernel,
            f"bad compile option: {exc}",
            "use the fields of cuda.core.ProgramOptions, e.g. {'use_fast_math': True}",
        ) from None
    if not headers:
        try:
            options.as_bytes("nvrtc", "cubin")  # what the cache key reads: cuda.core's own checks of the values
        except (TypeError, ValueError, RuntimeError) as exc:
            raise _BadCompileInput(kernel, f"bad compile option: {exc}", "drop the option named above") from None
        return options, None
    reached = _reached_headers(kernel.source, include_path, pre_include, not given.get("no_source_include"))
    extra = (
        _header_digest(kernel, include_path, pre_include, reached) if include_path or pre_include or reached else None
    )
    return options, extra


@functools.cache
def _field_types(fields: type) -> dict[str, Any]:
    """ProgramOptions' field types, evaluated once; none where this cuda.core's annotations cannot
    be evaluated (then NVRTC is left to judge the values, as before)."""
    try:
        return typing.get_type_hints(fields)
    except Exception:
        return {}


def _check_option_types(kernel: Kernel[Any], given: dict[str, Any], fields: type) -> None:
    """Each option's value is of a type its ProgramOptions field takes (its outer type: a list's
    items are left to NVRTC): ProgramOptions keeps any value, and NVRTC then refuses the one it
    cannot read as a compile error of the source, and only on a GPU."""
    hints = _field_types(fields)
    for name, value in given.items():
        if value is None or name not in hints:  # an unknown name: ProgramOptions refuses it
            continue
        kinds = {typing.get_origin(t) or t for t in typing.get_args(hints[name]) or (hints[name],)}
        if isinstance(value, (bool, np.bool_)):
            fits = bool in kinds  # True is an int to Python, not a count to NVRTC
        elif isinstance(value, numbers.Integral):
            fits = int in kinds
        else:
            fits = any(isinstance(value, k) for k in kinds if isinstance(k, type))
        if not fits:
            raise _BadCompileInput(
                kernel,
                f"bad compile option: {name}={value!r} is not {hints[name]}",
                f"pass {name} as cuda.core.ProgramOptions declares it ({hints[name]}), or leave it out",
            )


def check_options(kernel: Kernel[Any], headers: bool = True) -> None:
    """Refuse ``kernel``'s compile options as a GPU would, without compiling (the host backend
    runs references, but a program it passes must not fail on a GPU for its options). Does
    nothing without cuda.core, which then cannot compile on any backend.

    ``@sg.kernel`` checks a kernel's options with ``headers=False`` when it is declared: the
    names (cuda.core's ProgramOptions fields, not ``arch`` or ``name``, nothing uncacheable) and
    the values' types, which need no file, NVRTC or GPU. The include directories and headers are
    checked at the first launch (``headers=True``): they may be written after the declaration."""
    try:
        _options(kernel, "sm_90", headers)
    except ImportError:
        return


# Comments and string or character literals (blanked), then preprocessor lines (dropped): what is
# left are the declarations and code that the source-reading checks read.
_NOT_CODE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_PREPROCESSOR = re.compile(r"^[ \t]*#[^\n]*", re.M)


def may_wait(source: str, options: tuple[tuple[str, object], ...]) -> bool:
    """Whether a kernel compiled from ``source`` with ``options`` may execute
    ``griddepcontrol.wait``, as far as the text shows: False only when the source and the options
    (a macro's value) name neither ``cudaGridDependencySynchronize`` nor a ``griddepcontrol``
    instruction other than ``launch_dependents`` (the wait may be spelled in pieces, as
    ``"griddepcontrol" ".wait;"`` or through a stringizing macro) and the source includes nothing
    (a header may wait). Comments do not count: a wait commented out is none. The host backend,
    which compiles nothing, refuses a ``pdl=True`` kernel of which this is False; on sm_90+ the
    PTX check is exact."""
    code = _uncommented(source)
    return (
        _A_WAIT.search(code + repr(options)) is not None
        or AN_INCLUDE.search(code) is not None
        or "include" in repr(options)  # a header put before the source (pre_include)
    )


_A_WAIT = re.compile(r"cudaGridDependencySynchronize|griddepcontrol(?!\.launch_dependents)")


def _uncommented(source: str) -> str:
    """``source`` without its comments; string literals kept (an asm statement spells the wait in one)."""
    return _NOT_CODE.sub(lambda m: " " if m[0][0] == "/" else m[0], source)


def without_comments(source: str) -> str:
    """``source`` without comments, string and character literals; preprocessor lines kept."""
    return _NOT_CODE.sub(" ", source)


@functools.lru_cache(maxsize=16)
def code_only(source: str) -> str:
    """``source`` without comments, string and character literals, and preprocessor lines."""
    return _PREPROCESSOR.sub(" ", _NOT_CODE.sub(" ", source))


# NVRTC declares neither without the CUDA runtime headers, though DESIGN section 7 names the first
# as a way to wait: a source that calls one and includes nothing gets these definitions (the
# instructions the headers' own emit; none below sm_90, which has no programmatic edges), and
# `#line 1` keeps NVRTC's line numbers those of the user's source.
_PDL_NAMES = r"(?:cudaGridDependencySynchronize|cudaTriggerProgrammaticLaunchCompletion)\s*\("
_PDL_CALLS = re.compile(rf"\b{_PDL_NAMES}")
_PDL_DEFINED = re.compile(rf"\bvoid\s+{_PDL_NAMES}")
AN_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b", re.M)
_PDL_PRELUDE = """#if __CUDA_ARCH__ >= 900
#define SG_PDL_ASM(instruction) asm volatile(instruction ::: "memory")
#else
#define SG_PDL_ASM(instruction)
#endif
static __device__ __forceinline__ void cudaGridDependencySynchronize() { SG_PDL_ASM("griddepcontrol.wait;"); }
static __device__ __forceinline__ void cudaTriggerProgrammaticLaunchCompletion() {
    SG_PDL_ASM("griddepcontrol.launch_dependents;");
}
#undef SG_PDL_ASM
#line 1
"""


def program_source(kernel: Kernel[Any]) -> str:
    """The source NVRTC compiles for ``kernel``: its own, after _PDL_PRELUDE where it calls the two
    and neither includes nor defines anything that could declare them."""
    source = kernel.source
    if dict(kernel.options).get("pre_include") or not _PDL_CALLS.search(source):
        return source
    if _PDL_DEFINED.search(code_only(source)) or AN_INCLUDE.search(without_comments(source)):
        return source
    return _PDL_PRELUDE + source


def _cache_key(kernel: Kernel[Any], arch: str) -> tuple[ProgramOptions, bytes]:
    from cuda.core.utils import make_program_cache_key

    options, extra = _options(kernel, arch)
    try:
        key = make_program_cache_key(
            code=program_source(kernel),
            code_type="c++",
            options=options,
            target_type="cubin",
            name_expressions=(kernel.name_expression,),
            extra_digest=extra,
        )
    except (TypeError, ValueError, RuntimeError) as exc:  # an option the cache cannot key (cuda.core's as_bytes)
        raise _BadCompileInput(kernel, f"bad compile option: {exc}", "drop the option named above") from None
    return options, key


def compile_kernel(kernel: Kernel[Any], arch: str) -> ObjectCode:
    """The compiled module holding ``kernel.name_expression`` for ``arch`` (e.g. ``"sm_90"``).

    A ``pdl=True`` kernel that never executes ``griddepcontrol.wait`` is a PdlWaitError on sm_90+
    (see the module docstring); the refusal is cached like the cubin."""
    options, key = _cache_key(kernel, arch)
    check = kernel.pdl and _has_pdl(arch)
    with _lock:
        found = _memory.get(key)
        waits = _waits.get(key) if check else True
        if found is None or waits is None:
            disk = _disk_cache(cache_dir())
            if disk is not None:
                loaded, verdict = _load(disk, key)
                if found is None:
                    found = loaded
                if waits is None:
                    waits = verdict
            if found is None or waits is None:
                found, waits = _compile(kernel, options, disk, key, check)
            _memory[key] = found
            if check:
                _waits[key] = waits
    if not waits:
        raise PdlWaitError(kernel.name_expression, arch)
    return found


def _has_pdl(arch: str) -> bool:
    """Whether programmatic edges exist for ``arch``: sm_90 (Hopper) and later."""
    number = re.search(r"\d+", arch)
    return number is not None and int(number.group()) >= 90


# In the symbols entry on disk, next to the name expressions: the PDL check's verdict. No name
# expression can be this (it names no kernel), and an older reader takes it for one more symbol.
# The suffix versions the check: a changed check must not trust verdicts an older one cached.
_VERDICT = "griddepcontrol.wait check 1"
_VERDICTS = {"reached": True, "missing": False}


def _load(disk: FileStreamProgramCache, key: bytes) -> tuple[ObjectCode | None, bool | None]:
    """The cached module (None: not on disk, or not readable as written) and the PDL check's
    verdict (None: never checked)."""
    from cuda.core import ObjectCode

    try:
        cubin, symbols = disk.get(key), disk.get(key + b".symbols")
        names = None if cubin is None or symbols is None else json.loads(symbols)
    except (OSError, ValueError):  # ValueError: JSONDecodeError, UnicodeDecodeError (a garbled entry)
        return None, None
    if (
        cubin is None
        or not isinstance(names, dict)
        or not all(isinstance(name, str) and isinstance(sym, str) for name, sym in names.items())
        or not _whole_elf(cubin)
    ):
        return None, None
    verdict = _VERDICTS.get(names.pop(_VERDICT, ""))
    # The same form NVRTC's own result carries: name expression -> mangled name as bytes.
    mapping = {name: sym.encode() for name, sym in names.items()}
    return ObjectCode.from_cubin(cubin, symbol_mapping=mapping), verdict


def _whole_elf(data: bytes) -> bool:
    """Whether ``data`` is an ELF64 file (a cubin) whose program and section header tables fit in
    it. A cubin cut short on disk is then a miss, not a module that the driver refuses to load in
    every process until the cache is cleared."""
    if len(data) < 64 or data[:5] != b"\x7fELF\x02":  # ELFCLASS64: the header is 64 bytes
        return False
    order: Literal["little", "big"] = "little" if data[5] == 1 else "big"

    def field(at: int, size: int) -> int:
        return int.from_bytes(data[at : at + size], order)

    program_end = field(0x20, 8) + field(0x36, 2) * field(0x38, 2)  # e_phoff + e_phentsize * e_phnum
    section_end = field(0x28, 8) + field(0x3A, 2) * field(0x3C, 2)  # e_shoff + e_shentsize * e_shnum
    return max(program_end, section_end) <= len(data)


def _compile(
    kernel: Kernel[Any], options: ProgramOptions, disk: FileStreamProgramCache | None, key: bytes, check: bool
) -> tuple[ObjectCode, bool]:
    """Compile with NVRTC; with ``check``, also whether the entry point reaches griddepcontrol.wait."""
    from cuda.core import Program

    program: Any = None  # kept for the PTX; the check reads it from the same NVRTC program
    try:
        program = Program(program_source(kernel), "c++", options)
        code = program.compile("cubin", name_expressions=(kernel.name_expression,))
    except Exception as exc:  # cuda.core raises NVRTCError (a RuntimeError) carrying the log
        # Freed now, not by the cycle collector through the traceback's frame: cuda.core's
        # Program.__dealloc__ fails on an object the collector has already cleared.
        program = None
        raise CompileError(
            kernel.name_expression, str(exc), [f"arch={options.arch}", *(f"{k}={v}" for k, v in kernel.options)]
        ) from None
    symbols = {name: sym.decode() if isinstance(sym, bytes) else sym for name, sym in code.symbol_mapping.items()}
    waits = True
    if check:
        waits = reaches_wait(
            _ptx(kernel, options, program), symbols.get(kernel.name_expression) or kernel.name_expression
        )
        symbols[_VERDICT] = "reached" if waits else "missing"
    if disk is not None:
        try:
            disk[key] = code
            disk[key + b".symbols"] = json.dumps(symbols).encode()
        except OSError:
            pass
    return code, waits


def _ptx(kernel: Kernel[Any], options: ProgramOptions, program: Any) -> str:
    """The PTX NVRTC generated for the cubin just compiled (NVRTC keeps it; nothing is recompiled)."""
    # cuda.bindings: cuda.core's Program returns only the code type it was asked for; a second
    # compile("ptx") would double the NVRTC time, and cuda.core 1.2 checks the driver first.
    from cuda.bindings import nvrtc

    handle = program.handle
    err, size = nvrtc.nvrtcGetPTXSize(handle)
    buffer = bytearray(size)
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        (err,) = nvrtc.nvrtcGetPTX(handle, buffer)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise _BadCompileInput(
            kernel,
            f"NVRTC did not return the PTX that the pdl=True wait check reads ({err}, arch={options.arch})",
            "report this with the kernel's source; declaring the kernel without pdl=True skips the check",
        )
    return buffer.rstrip(b"\0").decode(errors="replace")


# PTX lexing for the wait check: comments, the header directives (no semicolon; .file holds a
# quoted path), the definitions' names, and identifiers.
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_HEADER = re.compile(r"^[ \t]*\.(?:version|target|address_size|file)\b[^\n]*", re.M)
_FUNCTION = re.compile(r"\.(entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
_VARIABLE = re.compile(r"([A-Za-z_$%][\w$]*)\s*(?:\[[^\]]*\]\s*)*(?:=|;)")
_IDENTIFIER = re.compile(r"[A-Za-z_$%][\w$]*")
_WAIT = re.compile(r"\bgriddepcontrol\.wait\b")


def _definitions(ptx: str) -> tuple[dict[str, str], dict[str, str]]:
    """The module's top-level definitions, by name: (entries, device functions and variables), each
    with its text (a function's body; a variable's initializer). Declarations without a body
    (``.extern .func f(...);``) count as empty definitions."""
    text = _HEADER.sub("", _COMMENTS.sub("", ptx))
    entries: dict[str, str] = {}
    others: dict[str, str] = {}
    depth, start, closes = 0, 0, True
    for mark in re.finditer(r"[{};]", text):
        char, at = mark.group(), mark.start()
        if char == "{":
            if depth == 0:  # a function body ends at its brace; a variable's {initializer} at the ';'
                closes = "=" not in text[start:at]
            depth += 1
            continue
        if char == "}":
            depth -= 1
            if depth > 0 or not closes:
                continue
        elif depth > 0:
            continue
        item, start = text[start : at + 1], at + 1
        function = _FUNCTION.search(item)
        if function is not None:
            table = entries if function.group(1) == "entry" else others
            table[function.group(2)] = table.get(function.group(2), "") + item[function.end() :]
        else:
            variable = _VARIABLE.search(item)
            if variable is not None:
                others[variable.group(1)] = others.get(variable.group(1), "") + item[variable.end() :]
    return entries, others


def reaches_wait(ptx: str, entry: str) -> bool:
    """Whether ``griddepcontrol.wait`` is in the PTX of ``entry`` (a ``.entry``'s mangled name) or of
    a device function it reaches: ``call`` targets, and every other ``.func`` or module variable
    (a function-pointer table) that reachable code names, followed transitively. Other kernels
    (``.entry``) are not followed: launching a child kernel that waits is not waiting. Presence is
    the test, not control flow: a wait in a branch, or after the first read, still counts."""
    entries, others = _definitions(ptx)
    body = entries.get(entry)
    if body is None:
        return False
    seen: set[str] = set()
    todo = [body]
    while todo:
        text = todo.pop()
        if _WAIT.search(text):
            return True
        for name in set(_IDENTIFIER.findall(text)) - seen:
            if name in others:
                seen.add(name)
                todo.append(others[name])
    return False
