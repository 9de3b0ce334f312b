"""NVRTC compiles every shipped kernel for sm_90 without a GPU (CI has none), and a broken
kernel is a CompileError carrying the log and the kernel's name. The caches answer without
NVRTC, header contents are part of the key, and bad options are CompileErrors."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

pytest.importorskip("cuda.core")

import cuda.core

import scopegraph as sg
from scopegraph import Mut, Tensor, library
from scopegraph._compile import _memory, _waits, compile_kernel

if TYPE_CHECKING:
    from cuda.core import ObjectCode


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOPEGRAPH_CACHE_DIR", str(tmp_path))
    _memory.clear()


@dataclass(frozen=True, eq=False)
class Built:
    """A compiled module that is safe inside an ``assert``. On failure pytest reprs every value in
    the expression, and ObjectCode's repr loads the module through the driver, which fails
    without one and then hangs (DESIGN.md, 11); so tests hold this and never the ObjectCode."""

    _code: ObjectCode = field(repr=False)

    @property
    def cubin(self) -> bytes:
        return bytes(self._code.code)

    @property
    def symbols(self) -> list[str]:
        return sorted(self._code.symbol_mapping)

    def same_object(self, other: Built) -> bool:
        return self._code is other._code


def build(kernel: sg.Kernel) -> Built:  # type: ignore[type-arg]
    return Built(compile_kernel(kernel, "sm_90"))


# Every rms_norm block rms_norm_op may pick (a multiple of 32 from 128 to 1024), not only the seed's.
RMS_NORM_BLOCKS = sorted({library.rms_norm_block(d) for d in range(1, 40_000, 7)})


@pytest.mark.parametrize(
    "kernel",
    [*library.ALL_KERNELS, *(library.rms_norm.generics(b) for b in RMS_NORM_BLOCKS)],
    ids=lambda k: k.name_expression,
)
def test_every_library_kernel_compiles_for_sm_90(kernel: sg.Kernel) -> None:  # type: ignore[type-arg]
    code = build(kernel)
    assert kernel.name_expression in code.symbols
    assert len(code.cubin) > 0


@pytest.mark.parametrize("name", ["ns::k", "ns::inner::k", "::top", "ns::tk"])
def test_a_name_qualified_by_namespaces_compiles(name: str) -> None:
    """@sg.kernel(name=) refuses what no C++ function can be named (tests/test_bad_input.py), but not a
    kernel declared in a namespace: NVRTC finds it by its qualified name, a template one too."""
    source = (
        "namespace ns { __global__ void k(float* out) {} namespace inner { __global__ void k(float* out) {} }\n"
        "template <int N> __global__ void tk(float* out) { out[0] = N; } }\n"
        "__global__ void top(float* out) {}"
    )

    def k(out: Mut[Tensor]) -> None: ...

    kernel = sg.kernel(source, name=name)(k)
    launched = kernel.generics(3) if name == "ns::tk" else kernel
    assert launched.name_expression in build(launched).symbols


def _nvrtc_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("NVRTC was asked to compile; the cache should have answered")

    monkeypatch.setattr(cuda.core, "Program", refuse)


def _counting_nvrtc(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Let NVRTC compile, recording the name of each kernel it compiles."""
    compiled: list[str] = []
    real = cuda.core.Program

    def counting(code: str, code_type: str, options: Any = None) -> Any:
        compiled.append(options.name)
        return real(code, code_type, options)

    monkeypatch.setattr(cuda.core, "Program", counting)
    return compiled


def test_compile_cache_reuses_memory_and_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _counting_nvrtc(monkeypatch)
    first = build(library.add)
    assert build(library.add).same_object(first)
    assert compiled == ["add"]
    # On disk: the cubin, byte for byte, and the symbol map beside it.
    entries = [f.read_bytes() for f in (tmp_path / "kernels").rglob("*") if f.is_file() and "entries" in f.parts]
    assert len(entries) == 2
    assert first.cubin in entries
    # A new process: nothing in memory, and NVRTC must not run; only the disk can answer.
    _memory.clear()
    _nvrtc_unavailable(monkeypatch)
    again = build(library.add)
    assert not again.same_object(first)
    assert again.cubin == first.cubin
    assert again.symbols == first.symbols == ["add"]


def _entries(root: Path) -> tuple[Path, Path]:
    """The one cached kernel's (cubin, symbols) files on disk."""
    files = [f for f in (root / "kernels").rglob("*") if f.is_file() and "entries" in f.parts]
    cubins = [f for f in files if f.read_bytes().startswith(b"\x7fELF")]
    assert len(files) == 2 and len(cubins) == 1, files
    return cubins[0], next(f for f in files if f != cubins[0])


CORRUPTIONS = {
    "symbols cut short": lambda cubin, symbols: (cubin, symbols[: len(symbols) // 2]),
    "symbols not utf-8": lambda cubin, symbols: (cubin, b"\xff\xfe" + symbols),
    "symbols not a map": lambda cubin, symbols: (cubin, b'["add"]'),
    "a symbol of another type": lambda cubin, symbols: (cubin, b'{"add": 1}'),
    "cubin cut short": lambda cubin, symbols: (cubin[: len(cubin) - 16], symbols),
    "cubin cut to its header": lambda cubin, symbols: (cubin[:64], symbols),
    "cubin empty": lambda cubin, symbols: (b"", symbols),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_an_entry_that_cannot_be_read_back_is_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corrupt: Callable[[bytes, bytes], tuple[bytes, bytes]]
) -> None:
    """An entry on disk that cannot be read back (either of its two files) is compiled again and
    overwritten, not a JSONDecodeError out of compile_kernel or a cubin the driver refuses."""
    compiled = _counting_nvrtc(monkeypatch)
    first = build(library.add)
    cubin_file, symbols_file = _entries(tmp_path)
    cubin, symbols = corrupt(cubin_file.read_bytes(), symbols_file.read_bytes())
    cubin_file.write_bytes(cubin)
    symbols_file.write_bytes(symbols)
    _memory.clear()
    again = build(library.add)
    assert compiled == ["add", "add"]
    assert again.cubin == first.cubin and again.symbols == ["add"]
    # Overwritten: a new process reads it back without NVRTC.
    _memory.clear()
    _nvrtc_unavailable(monkeypatch)
    assert build(library.add).cubin == first.cubin


def test_a_garbled_wait_check_verdict_is_checked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict of a pdl=True kernel's wait check, garbled on disk, is no verdict (compiled and
    checked again), never a PdlWaitError for a kernel that waits."""
    compiled = _counting_nvrtc(monkeypatch)
    build(library.fill)
    _, symbols_file = _entries(tmp_path)
    symbols = json.loads(symbols_file.read_bytes())
    assert symbols.pop("griddepcontrol.wait check 1") == "reached"
    symbols_file.write_text(json.dumps({**symbols, "griddepcontrol.wait check 1": "garbled"}))
    _memory.clear()
    _waits.clear()
    build(library.fill)
    assert compiled == ["fill", "fill"]


HEADER_KERNEL = """
#include "value.h"
#include "sub/scale.h"
extern "C" __global__ void from_header(float* out) { out[0] = VALUE * SCALE; }
"""


def _header_kernel(**options: object) -> sg.Kernel:  # type: ignore[type-arg]
    @sg.kernel(HEADER_KERNEL, options=options)
    def from_header(out: Mut[Tensor]) -> None: ...

    return from_header


def _write_headers(tmp_path: Path, value: str = "1.0f", scale: str = "2.0f") -> tuple[Path, Path]:
    """inc_one/value.h and inc_two/sub/scale.h."""
    one, two = tmp_path / "inc_one", tmp_path / "inc_two"
    (two / "sub").mkdir(parents=True, exist_ok=True)
    one.mkdir(exist_ok=True)
    (one / "value.h").write_text(f"#define VALUE {value}\n")
    (two / "sub" / "scale.h").write_text(f"#define SCALE {scale}\n")
    return one, two


def test_include_path_kernel_compiles_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = _write_headers(tmp_path)
    compiled = _counting_nvrtc(monkeypatch)
    kernel = _header_kernel(include_path=[str(one), two])  # a str and a Path, the second nested
    first = build(kernel)
    assert first.symbols == ["from_header"]
    assert build(kernel).same_object(first)
    assert build(_header_kernel(include_path=(one, str(two)))).same_object(first)  # the same key
    assert compiled == ["from_header"]
    # Unchanged headers: a fresh process finds the cubin on disk.
    _memory.clear()
    _nvrtc_unavailable(monkeypatch)
    assert build(kernel).cubin == first.cubin


def test_single_include_dir_as_str_or_path(tmp_path: Path) -> None:
    one, two = _write_headers(tmp_path)
    (one / "sub").mkdir()
    (one / "sub" / "scale.h").write_text((two / "sub" / "scale.h").read_text())
    from_str = build(_header_kernel(include_path=str(one)))
    assert build(_header_kernel(include_path=one)).same_object(from_str)


@pytest.mark.parametrize("edit", ["value.h", "sub/scale.h"])
def test_editing_a_header_recompiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    one, two = _write_headers(tmp_path)
    compiled = _counting_nvrtc(monkeypatch)
    kernel = _header_kernel(include_path=[one, two])
    first = build(kernel)
    if edit == "value.h":
        _write_headers(tmp_path, value="3.0f")
    else:
        _write_headers(tmp_path, scale="5.0f")
    second = build(kernel)
    assert second.cubin != first.cubin
    assert compiled == ["from_header", "from_header"]


@pytest.mark.parametrize(
    "where", ["working directory", "absolute path", "outside the include path", "through a pre_include"]
)
def test_editing_a_header_found_outside_the_include_path_recompiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """NVRTC also finds a quoted include in the working directory (a source without a path), by an
    absolute path, and by `..` from a header in the include path: such headers are in the cache
    key too (before, the second compile took the stale cubin from the disk cache)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.chdir(outside)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "bridge.h").write_text('#include "../outside/value.h"\n')
    cases: dict[str, tuple[str, dict[str, object]]] = {
        "working directory": ('"value.h"', {}),
        "absolute path": (f'"{outside / "value.h"}"', {}),
        "outside the include path": ('"bridge.h"', {"include_path": inc}),
        "through a pre_include": ("", {"pre_include": str(inc / "bridge.h")}),
    }
    include, options = cases[where]
    source = (f"#include {include}\n" if include else "") + (
        'extern "C" __global__ void from_header(float* out) { out[0] = VALUE; }\n'
    )

    def kernel() -> sg.Kernel:  # type: ignore[type-arg]
        @sg.kernel(source, options=options)
        def from_header(out: Mut[Tensor]) -> None: ...

        return from_header

    (outside / "value.h").write_text("#define VALUE 1.0f\n")
    first = build(kernel())
    _memory.clear()  # a new process: only the disk cache is left
    (outside / "value.h").write_text("#define VALUE 3.0f\n")
    second = build(kernel())
    assert second.cubin != first.cubin


@pytest.mark.parametrize("trouble", ["removed working directory", "include name too long"])
def test_a_header_search_that_meets_os_trouble_leaves_it_to_nvrtc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trouble: str
) -> None:
    """The cache key's header search never raises OSError itself (before: FileNotFoundError for a
    removed working directory even without any include, ENAMETOOLONG for a long name)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    if trouble == "removed working directory":
        gone.rmdir()
        source = 'extern "C" __global__ void k() {}'
    else:
        source = '#if 0\n#include "' + "a" * 300 + '.h"\n#endif\nextern "C" __global__ void k() {}'

    @sg.kernel(source)
    def k() -> None: ...

    assert build(k).symbols


def test_std_is_an_option_like_the_others() -> None:
    @sg.kernel('extern "C" __global__ void k() {}', options={"std": "c++20"})
    def k() -> None: ...

    assert build(k).symbols


def test_renaming_a_header_recompiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes under other names: inc_one/value.h shadows inc_two/value.h until it is renamed."""
    one, two = _write_headers(tmp_path)
    (two / "value.h").write_text("#define VALUE 3.0f\n")
    compiled = _counting_nvrtc(monkeypatch)
    kernel = _header_kernel(include_path=[one, two])
    first = build(kernel)
    (one / "value.h").rename(one / "old_value.h")
    second = build(kernel)
    assert second.cubin != first.cubin
    assert len(compiled) == 2


def test_pre_include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "pre.h").write_text("#define PRE_VALUE 4.0f\n")
    source = 'extern "C" __global__ void pre(float* out) { out[0] = PRE_VALUE; }'

    @sg.kernel(source, options={"include_path": inc, "pre_include": "pre.h"})
    def pre(out: Mut[Tensor]) -> None: ...

    compiled = _counting_nvrtc(monkeypatch)
    first = build(pre)
    assert build(pre).same_object(first)
    (inc / "pre.h").write_text("#define PRE_VALUE 8.0f\n")
    assert build(pre).cubin != first.cubin
    assert compiled == ["pre", "pre"]


def test_pre_include_outside_the_include_path_is_hashed(tmp_path: Path) -> None:
    header = tmp_path / "pre.h"
    header.write_text("#define PRE_VALUE 4.0f\n")
    source = 'extern "C" __global__ void pre(float* out) { out[0] = PRE_VALUE; }'

    @sg.kernel(source, options={"pre_include": [header]})
    def pre(out: Mut[Tensor]) -> None: ...

    first = build(pre).cubin
    header.write_text("#define PRE_VALUE 8.0f\n")
    assert build(pre).cubin != first


@pytest.mark.parametrize(
    ("options", "message", "when"),
    [
        # Refused when compiled (or first launched): whether a directory exists is the file system's.
        ({"include_path": "/no/such/include/dir"}, "is not a directory", "compiled"),
        ({"include_path": ["/no/such/include/dir"]}, "is not a directory", "compiled"),
        ({"include_path": 5}, "bad compile option: include_path=5", "declared"),
        ({"include_path": []}, "bad compile option: include_path=[]", "declared"),
        ({"include_path": ""}, "bad compile option: include_path=''", "declared"),  # not the whole working directory
        ({"pre_include": [b"bytes.h"]}, "bad compile option: pre_include", "declared"),
        ({"create_pch": "k.pch"}, "create_pch cannot be cached", "declared"),
        ({"pch": True}, "pch cannot be cached", "declared"),
        ({"time": "t.csv"}, "time cannot be cached", "declared"),
        ({"use_pch": ""}, "bad compile option", "declared"),
        ({"name": "x/y"}, "bad compile option: name is scopegraph's to choose", "declared"),
        ({"arch": "sm_80"}, "bad compile option: arch is scopegraph's to choose", "declared"),
        ({"define_macro": 5}, "bad compile option: define_macro=5 is not str | tuple[str, str]", "declared"),
        ({"define_macro": ("VALUE",)}, "bad compile option: Expected define_macro", "declared"),  # cuda.core's
        # Values of a type the field does not take: NVRTC refused them on a GPU only, as a source error.
        ({"max_register_count": "lots"}, "bad compile option: max_register_count='lots' is not int | None", "declared"),
        ({"max_register_count": True}, "bad compile option: max_register_count=True is not int | None", "declared"),
        ({"use_fast_math": 1}, "bad compile option: use_fast_math=1 is not bool | None", "declared"),
        ({"no_such_option": True}, "unexpected keyword argument 'no_such_option'", "declared"),
        ({"extra_sources": [("a.ll", "b")]}, "extra_sources is only valid", "compiled"),  # refused by the cache key
    ],
)
def test_bad_include_options_are_compile_errors(options: dict[str, object], message: str, when: str) -> None:
    """Each is a CompileError with help; those that need no file and no compile are refused when
    the kernel is declared, on every backend (before: at its first launch, or its compile)."""

    def declared() -> sg.Kernel[[]]:
        @sg.kernel('extern "C" __global__ void k() {}', options=options)
        def k() -> None: ...

        return k

    with pytest.raises(sg.CompileError) as info:
        k = declared()
        assert when == "compiled", f"{options} was not refused when the kernel was declared"
        compile_kernel(k, "sm_90")
    assert message in str(info.value)
    assert "\nhelp: " in str(info.value)
    assert "fix the CUDA C++ source" not in str(info.value)


def test_options_that_need_the_file_system_are_checked_at_the_first_launch(tmp_path: Path) -> None:
    """An include directory may be written after the kernel is declared (a build step, a test's
    tmp_path): declaring reads no file; the first launch on the host backend finds it, or not."""
    later = tmp_path / "generated"

    @sg.kernel(
        '#include "value.h"\nextern "C" __global__ void k(float* out) { out[0] = VALUE; }',
        options={"include_path": later},
    )
    def k(out: Mut[Tensor]) -> None: ...

    k.host(lambda out: out.fill(1.0))
    dev = sg.device("host")
    stream, y = dev.stream(), dev.zeros((1,), name="y")
    with pytest.raises(sg.CompileError, match="is not a directory"):
        stream.run(k[1, 1](y.mut()))
    later.mkdir()
    (later / "value.h").write_text("#define VALUE 1.0f\n")
    stream.run(k[1, 1](y.mut()))
    np.testing.assert_array_equal(y.numpy(), 1.0)


def test_unreadable_header_is_a_compile_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = _write_headers(tmp_path)

    def unreadable(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.raises(sg.CompileError, match="cannot read the headers"):
        compile_kernel(_header_kernel(include_path=[one, two]), "sm_90")


def test_broken_kernel_is_a_compile_error() -> None:
    @sg.kernel('extern "C" __global__ void broken(float* out) { out[0] = undefined_name; }')
    def broken(out: Mut[Tensor]) -> None: ...

    with pytest.raises(sg.CompileError) as info:
        compile_kernel(broken, "sm_90")
    err = info.value
    assert err.kernel_name == "broken"
    assert "undefined_name" in err.log and "identifier" in err.log
    assert "help:" in str(err)
    assert "\0" not in err.log and "\0" not in str(err)  # NVRTC's log is a C string


@pytest.mark.parametrize("arch", ["sm_bogus", "", "90", "sm_90 -G", "compute_90", "sm_9"])
def test_an_architecture_nvrtc_would_not_know_is_refused_as_such(arch: str) -> None:
    """It was NVRTC's error, with the help to fix the kernel's source."""
    with pytest.raises(sg.CompileError, match=f"arch={arch!r} is not a GPU architecture") as info:
        compile_kernel(library.fill, arch)
    message = str(info.value)
    assert "fix the CUDA C++ source" not in message
    assert 'help: name a real architecture as NVRTC does: "sm_90"' in message


def test_bad_template_arguments_are_a_compile_error() -> None:
    with pytest.raises(sg.CompileError, match="rms_norm<33>"):
        compile_kernel(library.rms_norm.generics(33), "sm_90")  # static_assert: multiple of 32


def test_the_host_backend_refuses_compile_options_a_gpu_refuses() -> None:
    """The host runs the reference and compiles nothing, but a program it passes must not fail on
    a GPU for its options: they are checked (not compiled) when the kernel first runs there."""

    def declared(options: Mapping[str, object]) -> sg.Kernel[[Mut[Tensor]]]:
        @sg.kernel('extern "C" __global__ void k(float* out) {}', options=options)
        def k(out: Mut[Tensor]) -> None: ...

        k.host(lambda out: out.fill(1.0))
        return k

    dev = sg.device("host")
    stream, y = dev.stream(), dev.zeros((4,), name="y")
    for options, message in (({"no_such_option": True}, "no_such_option"), ({"arch": "sm_80"}, "arch is scopegraph's")):
        with pytest.raises(sg.CompileError, match=message):
            stream.run(declared(options)[1, 1](y.mut()))
    stream.run(declared({"use_fast_math": True})[1, 1](y.mut()))
    np.testing.assert_array_equal(y.numpy(), 1.0)
