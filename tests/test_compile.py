"""NVRTC compiles every shipped kernel for sm_90 without a GPU (CI has none), and a broken
kernel is a CompileError carrying the log and the kernel's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cuda.core")

import cuda.core

import scopegraph as sg
from scopegraph import Mut, Tensor, library
from scopegraph._compile import _memory, compile_kernel


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOPEGRAPH_CACHE_DIR", str(tmp_path))
    _memory.clear()


@pytest.mark.parametrize("kernel", library.ALL_KERNELS, ids=lambda k: k.name_expression)
def test_every_library_kernel_compiles_for_sm_90(kernel: sg.Kernel) -> None:  # type: ignore[type-arg]
    code = compile_kernel(kernel, "sm_90")
    assert kernel.name_expression in code.symbol_mapping
    assert len(bytes(code.code)) > 0


def _nvrtc_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("NVRTC was asked to compile; the cache should have answered")

    monkeypatch.setattr(cuda.core, "Program", refuse)


def _counting_nvrtc(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Let NVRTC compile, recording each kernel it compiles."""
    compiled: list[str] = []
    real = cuda.core.Program

    def counting(code: str, code_type: str, options: Any = None) -> Any:
        compiled.append(options.name)
        return real(code, code_type, options)

    monkeypatch.setattr(cuda.core, "Program", counting)
    return compiled


def test_compile_cache_reuses_memory_and_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = compile_kernel(library.add, "sm_90")
    assert compile_kernel(library.add, "sm_90") is first
    # On disk: the cubin, byte for byte, and the symbol map beside it.
    entries = [f for f in (tmp_path / "kernels").rglob("*") if f.is_file() and "entries" in f.parts]
    assert len(entries) == 2
    assert bytes(first.code) in [f.read_bytes() for f in entries]
    # A new process: nothing in memory, and NVRTC must not run; only the disk can answer.
    _memory.clear()
    _nvrtc_unavailable(monkeypatch)
    again = compile_kernel(library.add, "sm_90")
    assert again is not first and bytes(again.code) == bytes(first.code)
    assert again.symbol_mapping.keys() == first.symbol_mapping.keys()


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
    first = compile_kernel(kernel, "sm_90")
    assert "from_header" in first.symbol_mapping
    assert compile_kernel(kernel, "sm_90") is first
    assert compile_kernel(_header_kernel(include_path=(one, str(two))), "sm_90") is first  # same key
    assert compiled == ["from_header"]
    # Unchanged headers: a fresh process finds the cubin on disk.
    _memory.clear()
    _nvrtc_unavailable(monkeypatch)
    assert bytes(compile_kernel(kernel, "sm_90").code) == bytes(first.code)


def test_single_include_dir_as_str_or_path(tmp_path: Path) -> None:
    one, two = _write_headers(tmp_path)
    (one / "sub").mkdir()
    (one / "sub" / "scale.h").write_text((two / "sub" / "scale.h").read_text())
    from_str = compile_kernel(_header_kernel(include_path=str(one)), "sm_90")
    assert compile_kernel(_header_kernel(include_path=one), "sm_90") is from_str


@pytest.mark.parametrize("edit", ["value.h", "sub/scale.h"])
def test_editing_a_header_recompiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    one, two = _write_headers(tmp_path)
    compiled = _counting_nvrtc(monkeypatch)
    kernel = _header_kernel(include_path=[one, two])
    first = compile_kernel(kernel, "sm_90")
    if edit == "value.h":
        _write_headers(tmp_path, value="3.0f")
    else:
        _write_headers(tmp_path, scale="5.0f")
    second = compile_kernel(kernel, "sm_90")
    assert second is not first and bytes(second.code) != bytes(first.code)
    assert compiled == ["from_header", "from_header"]
    # A new file under an include directory changes the key too (it may shadow another header).
    (one / "unrelated.h").write_text("// new\n")
    assert compile_kernel(kernel, "sm_90") is not second
    assert len(compiled) == 3


def test_pre_include(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "pre.h").write_text("#define PRE_VALUE 4.0f\n")
    source = 'extern "C" __global__ void pre(float* out) { out[0] = PRE_VALUE; }'

    @sg.kernel(source, options={"include_path": inc, "pre_include": "pre.h"})
    def pre(out: Mut[Tensor]) -> None: ...

    compiled = _counting_nvrtc(monkeypatch)
    first = compile_kernel(pre, "sm_90")
    assert compile_kernel(pre, "sm_90") is first
    (inc / "pre.h").write_text("#define PRE_VALUE 8.0f\n")
    assert bytes(compile_kernel(pre, "sm_90").code) != bytes(first.code)
    assert len(compiled) == 2


def test_pre_include_outside_the_include_path_is_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = tmp_path / "pre.h"
    header.write_text("#define PRE_VALUE 4.0f\n")
    source = 'extern "C" __global__ void pre(float* out) { out[0] = PRE_VALUE; }'

    @sg.kernel(source, options={"pre_include": [header]})
    def pre(out: Mut[Tensor]) -> None: ...

    first = compile_kernel(pre, "sm_90")
    header.write_text("#define PRE_VALUE 8.0f\n")
    assert bytes(compile_kernel(pre, "sm_90").code) != bytes(first.code)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"include_path": "/no/such/include/dir"}, "is not a directory"),
        ({"include_path": ["/no/such/include/dir"]}, "is not a directory"),
        ({"include_path": 5}, "bad compile option: include_path=5"),
        ({"include_path": []}, "bad compile option: include_path=[]"),
        ({"pre_include": [b"bytes.h"]}, "bad compile option: pre_include"),
        ({"create_pch": "k.pch"}, "create_pch cannot be cached"),
        ({"pch": True}, "pch cannot be cached"),
        ({"time": "t.csv"}, "time cannot be cached"),
        ({"use_pch": ""}, "bad compile option"),
        ({"std": "c++11"}, "bad compile option"),
        ({"name": "x/y"}, "bad compile option"),
        ({"extra_sources": [("a.ll", "b")]}, "extra_sources is only valid"),  # refused by the cache key
    ],
)
def test_bad_include_options_are_compile_errors(options: dict[str, object], message: str) -> None:
    @sg.kernel('extern "C" __global__ void k() {}', options=options)
    def k() -> None: ...

    with pytest.raises(sg.CompileError) as info:
        compile_kernel(k, "sm_90")
    assert message in str(info.value)
    assert "\nhelp: " in str(info.value)
    assert "fix the CUDA C++ source" not in str(info.value)


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


def test_bad_template_arguments_are_a_compile_error() -> None:
    with pytest.raises(sg.CompileError, match="rms_norm<33>"):
        compile_kernel(library.rms_norm.generics(33), "sm_90")  # static_assert: multiple of 32


def test_bad_option_is_a_compile_error() -> None:
    @sg.kernel('extern "C" __global__ void k() {}', options={"no_such_option": True})
    def k() -> None: ...

    with pytest.raises(sg.CompileError, match="bad compile option"):
        compile_kernel(k, "sm_90")
