"""NVRTC compiles every shipped kernel for sm_90 without a GPU (CI has none), and a broken
kernel is a CompileError carrying the log and the kernel's name."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cuda.core")

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


def test_compile_cache_reuses_memory_and_disk(tmp_path: Path) -> None:
    first = compile_kernel(library.add, "sm_90")
    assert compile_kernel(library.add, "sm_90") is first
    _memory.clear()
    again = compile_kernel(library.add, "sm_90")  # from disk
    assert again is not first and bytes(again.code) == bytes(first.code)
    assert any(tmp_path.rglob("*"))


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
