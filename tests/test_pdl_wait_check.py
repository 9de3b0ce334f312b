"""A ``pdl=True`` kernel must wait (DESIGN.md section 7): compiled for sm_90+, its entry point or a
device function it calls must contain ``griddepcontrol.wait``, or it is a PdlWaitError. NVRTC
compiles for sm_90 without a GPU, so all of this runs in CI; the check reads the PTX NVRTC made
for the cubin, its verdict is cached with the cubin (memory and disk), and below sm_90 it does not
run. The last test records such a kernel on an sm_90+ GPU."""

from __future__ import annotations

import importlib
import pathlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("cuda.core")

import cuda.core
from cuda.bindings import nvrtc

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library
from scopegraph import _compile as compile_module
from scopegraph._cli.bench._chain import chain_step
from scopegraph._compile import _memory, _waits, compile_kernel, reaches_wait
from scopegraph._errors import CompileError, PdlWaitError, ScopeGraphError

from .helpers import assert_stream_usable

try:
    nvrtc.nvrtcVersion()
except Exception:  # cuda.bindings without libnvrtc: nothing here can compile
    pytest.skip("NVRTC is not installed", allow_module_level=True)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOPEGRAPH_CACHE_DIR", str(tmp_path))
    _memory.clear()
    _waits.clear()


def new_process() -> None:
    """Forget what this process compiled and checked: only the disk cache can answer."""
    _memory.clear()
    _waits.clear()


def declare(source: str, name: str, pdl: bool = True, **options: object) -> sg.Kernel[Any]:
    def body(out: Mut[Tensor], n: sg.i32) -> None: ...

    body.__name__ = name
    return sg.kernel(source, touches={"out": "n"}, pdl=pdl, options=options)(body)


def refused(kernel: sg.Kernel[Any], arch: str = "sm_90") -> PdlWaitError:
    with pytest.raises(PdlWaitError) as info:
        compile_kernel(kernel, arch)
    return info.value


def accepted(kernel: sg.Kernel[Any], arch: str = "sm_90") -> None:
    """Compiles, and the wait check (sm_90+) passed; never returns the ObjectCode (see test_compile's Built)."""
    assert compile_kernel(kernel, arch) is not None


# -- kernels ----------------------------------------------------------------------------------------

FORGETS = r"""
extern "C" __global__ void forgets(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}
"""

INLINE_ASM = r"""
extern "C" __global__ void inline_wait(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (i < n) out[i] += 1.0f;
}
"""

RUNTIME_API = r"""
#include <cuda_device_runtime_api.h>
extern "C" __global__ void runtime_wait(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    cudaGridDependencySynchronize();
    if (i < n) out[i] += 1.0f;
}
"""

# The wait two calls deep, in functions the compiler must not inline; and a waiting function that
# only another kernel calls.
NOINLINE = r"""
__device__ __noinline__ void really_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __noinline__ void wait_for_predecessors(int* dummy) { really_wait(); if (dummy) *dummy = 0; }
__device__ __noinline__ void other_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

extern "C" __global__ void helper_wait(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    wait_for_predecessors(nullptr);
    if (i < n) out[i] += 1.0f;
}

extern "C" __global__ void other_kernel_waits(float* out, int n) {
    other_wait();
    out[0] = n;
}

extern "C" __global__ void next_to_a_waiting_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}
"""

TEMPLATE = r"""
template <int SCALE, bool WAIT>
__global__ void scaled(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) out[i] *= SCALE;
}
"""

# Only the presence of the wait is checked: one on a branch never taken, or one after the read,
# passes. And a wait written only in an asm comment is no wait.
BRANCH = r"""
extern "C" __global__ void waits_in_a_branch(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < 0) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) out[i] += 1.0f;
}
extern "C" __global__ void waits_too_late(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? out[i] : 0.0f;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) out[i] = v + 1.0f;
}
extern "C" __global__ void waits_in_a_comment(float* out, int n) {
    asm volatile("// griddepcontrol.wait;" ::: "memory");
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}
"""


def ptx_of(kernel: sg.Kernel[Any]) -> str:
    """The PTX the check reads, compiled the way compile_kernel compiles."""
    options, _ = compile_module._cache_key(kernel, "sm_90")
    program: Any = cuda.core.Program(compile_module.program_source(kernel), "c++", options)
    program.compile("cubin", name_expressions=(kernel.name_expression,))
    return compile_module._ptx(kernel, options, program)


# -- refused ---------------------------------------------------------------------------------------


def test_a_pdl_kernel_that_never_waits_is_refused() -> None:
    kernel = declare(FORGETS, "forgets")
    error = refused(kernel)
    assert type(error) is PdlWaitError
    assert isinstance(error, CompileError) and isinstance(error, ScopeGraphError)
    assert (error.kernel_name, error.arch) == ("forgets", "sm_90")
    message = str(error)
    headline, *_, help_line = message.splitlines()
    assert headline.startswith("kernel `forgets` is declared pdl=True but never waits for its predecessors")
    assert "sm_90" in headline
    assert "   | a programmatic edge starts it while its predecessors still run" in message
    assert help_line.startswith("help: call cudaGridDependencySynchronize()")
    assert "griddepcontrol.wait" in help_line and "in every thread" in help_line
    assert help_line.endswith("or drop pdl=True")
    assert kernel.compiled == {}  # nothing was loaded


def test_the_same_kernel_without_pdl_compiles() -> None:
    accepted(declare(FORGETS, "forgets", pdl=False))


def test_a_wait_in_another_kernel_or_in_a_function_it_does_not_call_is_not_a_wait() -> None:
    # The module has waits (in other_wait and really_wait), but not on this entry point's paths.
    assert "griddepcontrol.wait" in ptx_of(declare(NOINLINE, "next_to_a_waiting_kernel"))
    refused(declare(NOINLINE, "next_to_a_waiting_kernel"))
    accepted(declare(NOINLINE, "other_kernel_waits"))


def test_a_wait_in_an_asm_comment_is_not_a_wait() -> None:
    kernel = declare(BRANCH, "waits_in_a_comment")
    assert "// griddepcontrol.wait" in ptx_of(kernel)
    refused(kernel)


def test_a_templated_kernel_that_never_waits_is_refused_by_its_name_expression() -> None:
    kernel = declare(TEMPLATE, "scaled").generics(2, False)
    assert refused(kernel).kernel_name == "scaled<2, false>"


# -- accepted --------------------------------------------------------------------------------------


def test_a_kernel_waiting_through_inline_asm_passes() -> None:
    accepted(declare(INLINE_ASM, "inline_wait"))


def test_a_kernel_waiting_through_cudaGridDependencySynchronize_passes() -> None:
    pathfinder = importlib.import_module("cuda.pathfinder")
    headers = pathfinder.find_nvidia_header_directory("cudart")
    if headers is None or not (pathlib.Path(headers) / "crt" / "host_defines.h").is_file():
        # Some installs (the GPU machine's torch wheels) ship cuda_device_runtime_api.h without
        # the crt/ headers it includes.
        pytest.skip("the CUDA runtime headers (cuda_device_runtime_api.h and crt/) are not installed")
    kernel = declare(RUNTIME_API, "runtime_wait", include_path=headers)
    assert "griddepcontrol.wait" in ptx_of(kernel)
    accepted(kernel)


def test_cudaGridDependencySynchronize_needs_no_include() -> None:
    """DESIGN section 7 names cudaGridDependencySynchronize() as a way to wait, but NVRTC declares
    it (and cudaTriggerProgrammaticLaunchCompletion) only through the CUDA runtime headers, which
    a GPU machine may not have: a source that includes nothing gets scopegraph's definitions,
    and NVRTC's line numbers stay those of the source."""
    wait = "    cudaGridDependencySynchronize();"
    source = RUNTIME_API.replace("#include <cuda_device_runtime_api.h>\n", "")
    source = source.replace(wait, "    cudaTriggerProgrammaticLaunchCompletion();\n" + wait)
    kernel = declare(source, "runtime_wait")
    ptx = ptx_of(kernel)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    accepted(kernel)
    for arch in ("sm_80", "sm_90"):  # no programmatic edges below sm_90: nothing to emit there
        compile_kernel(kernel, arch)
    broken = declare(source.replace("out[i] += 1.0f;", "out[i] += undeclared;"), "runtime_wait")
    with pytest.raises(sg.CompileError, match=r"\(6\): error: identifier \"undeclared\" is undefined"):
        compile_kernel(broken, "sm_90")
    # A source that defines them itself (the usual NVRTC workaround) gets no second definition; an
    # include in a comment is no include.
    own = 'static __device__ void cudaGridDependencySynchronize() { asm volatile("griddepcontrol.wait;"); }'
    accepted(declare(own + "\n" + source.replace("cudaTriggerProgrammaticLaunchCompletion();", ""), "runtime_wait"))
    accepted(declare("// #include <cuda_device_runtime_api.h> is not needed\n" + source, "runtime_wait"))


def test_a_kernel_waiting_inside_a_noinline_device_function_passes() -> None:
    kernel = declare(NOINLINE, "helper_wait")
    entries, functions = compile_module._definitions(ptx_of(kernel))
    # The wait is not in the entry: it is two calls away, in .func bodies.
    assert "griddepcontrol.wait" not in entries["helper_wait"] and "call" in entries["helper_wait"]
    assert [name for name, body in functions.items() if "griddepcontrol.wait" in body] == [
        "_Z11really_waitv",
        "_Z10other_waitv",
    ]
    accepted(kernel)


def test_a_templated_kernel_that_waits_passes() -> None:
    kernel = declare(TEMPLATE, "scaled")
    accepted(kernel.generics(3, True))
    assert compile_module._waits and all(_waits.values())


def test_presence_is_the_check_not_control_flow() -> None:
    # Documented limits: the check catches a kernel that never waits, not one that waits too late.
    accepted(declare(BRANCH, "waits_in_a_branch"))
    accepted(declare(BRANCH, "waits_too_late"))


PDL_KERNELS = [k for k in library.ALL_KERNELS if k.pdl] + [chain_step]


def test_the_library_has_pdl_kernels() -> None:
    assert len(PDL_KERNELS) > 4


@pytest.mark.parametrize("kernel", PDL_KERNELS, ids=lambda k: k.name_expression)
def test_every_shipped_pdl_kernel_passes(kernel: sg.Kernel[Any]) -> None:
    accepted(kernel)
    (verdict,) = _waits.values()
    assert verdict is True


# -- below sm_90 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_below_sm_90_nothing_is_checked(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_ptx(*args: object) -> str:
        raise AssertionError("the PTX was read below sm_90")

    monkeypatch.setattr(compile_module, "_ptx", no_ptx)
    accepted(declare(FORGETS, "forgets"), arch)
    accepted(declare(INLINE_ASM, "inline_wait"), arch)  # the wait is compiled out here
    assert _waits == {}


def test_every_arch_from_sm_90_is_checked() -> None:
    assert all(map(compile_module._has_pdl, ["sm_90", "sm_90a", "sm_100", "sm_103a", "sm_120"]))
    assert not any(map(compile_module._has_pdl, ["sm_75", "sm_80", "sm_87", "sm_89"]))


# -- costs and caches ------------------------------------------------------------------------------


class Counters:
    """Counts NVRTC compiles and wait checks; either can be forbidden."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compiles: list[str] = []
        self.checks: list[str] = []
        self.monkeypatch = monkeypatch
        real_program, real_check = cuda.core.Program, compile_module.reaches_wait
        self.real_load = compile_module._load

        def program(code: str, code_type: str, options: Any = None) -> Any:
            self.compiles.append(options.name)
            return real_program(code, code_type, options)

        def check(ptx: str, entry: str) -> bool:
            self.checks.append(entry)
            return real_check(ptx, entry)

        monkeypatch.setattr(cuda.core, "Program", program)
        monkeypatch.setattr(compile_module, "reaches_wait", check)

    def forbid(self, disk: bool = False) -> None:
        """From now on NVRTC and the check must not run; with ``disk``, the disk cache must not be read
        either (only memory may answer); ``disk=False`` allows it again."""

        def refuse(*args: object, **kwargs: object) -> Any:
            raise AssertionError("compiled, checked or read again; a cache should have answered")

        self.monkeypatch.setattr(cuda.core, "Program", refuse)
        self.monkeypatch.setattr(compile_module, "reaches_wait", refuse)
        self.monkeypatch.setattr(compile_module, "_load", refuse if disk else self.real_load)


def test_a_refusal_is_cached_in_memory_and_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = declare(FORGETS, "forgets")
    counters = Counters(monkeypatch)
    first = refused(kernel)
    assert (counters.compiles, counters.checks) == (["forgets"], ["forgets"])
    counters.forbid(disk=True)
    again = refused(kernel)  # memory
    assert again is not first and str(again) == str(first)  # a fresh error each time
    new_process()
    counters.forbid()
    assert str(refused(kernel)) == str(first)  # disk
    assert _waits == {next(iter(_memory)): False}


def test_a_verdict_that_passed_is_cached_in_memory_and_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = declare(TEMPLATE, "scaled").generics(4, True)
    counters = Counters(monkeypatch)
    accepted(kernel)
    assert counters.checks == ["_Z6scaledILi4ELb1EEvPfi"]  # the mangled entry, from the name-expression map
    counters.forbid(disk=True)
    accepted(kernel)  # memory
    new_process()
    counters.forbid()
    accepted(kernel)  # disk
    # A pdl=False twin (same source, name and options: the same key) reuses the cubin, no check.
    accepted(declare(TEMPLATE, "scaled", pdl=False).generics(4, True))


def test_only_pdl_kernels_pay_for_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    counters = Counters(monkeypatch)
    accepted(declare(INLINE_ASM, "inline_wait", pdl=False))
    assert (counters.compiles, counters.checks, _waits) == (["inline_wait"], [], {})


def test_a_cubin_cached_without_a_verdict_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pdl=False twin puts the cubin in memory and on disk without a verdict; the pdl=True kernel
    # with the same key cannot use it unchecked: one more compile, then the verdict is on disk.
    counters = Counters(monkeypatch)
    accepted(declare(FORGETS, "forgets", pdl=False))
    refused(declare(FORGETS, "forgets"))
    assert (counters.compiles, counters.checks) == (["forgets", "forgets"], ["forgets"])
    new_process()
    accepted(declare(FORGETS, "forgets", pdl=False))  # from disk
    new_process()
    counters.forbid()
    refused(declare(FORGETS, "forgets"))
    accepted(declare(FORGETS, "forgets", pdl=False))


def test_the_disk_holds_the_verdict_beside_the_symbols(tmp_path: Path) -> None:
    accepted(declare(FORGETS, "forgets", pdl=False))
    entries = sorted(f.read_bytes() for f in tmp_path.rglob("*") if f.is_file() and "entries" in f.parts)
    assert len(entries) == 2 and b'{"forgets": "forgets"}' in entries
    refused(declare(FORGETS, "forgets"))
    entries = sorted(f.read_bytes() for f in tmp_path.rglob("*") if f.is_file() and "entries" in f.parts)
    assert len(entries) == 2 and b'{"forgets": "forgets", "griddepcontrol.wait check 1": "missing"}' in entries


# -- the PTX walk ----------------------------------------------------------------------------------

PTX = """
.version 9.0
.target sm_90
.address_size 64
.file 1 "/tmp/{odd}.cu"

.extern .func (.param .b32 func_retval0) vprintf(.param .b64 a, .param .b64 b);
.global .align 8 .u64 table[2] = {f_waits, f_plain};
.func (.param .b32 func_retval0) f_waits(.param .b32 x)
{
    { // callseq 0, 0
    griddepcontrol.wait;
    }
    ret;
}
.func f_plain()
{
    ret;
}
.visible .entry by_call(.param .u64 p)
{
    { // callseq 1
    call.uni (retval0), f_waits, (param0);
    } // callseq 1
    ret;
}
.visible .entry by_table(.param .u64 p)
.maxntid 256, 1, 1
{
    ld.global.u64 %rd1, [table+8];
    call (retval0), %rd1, (param0), prototype_0;
    ret;
}
.visible .entry plain(.param .u64 p)
{
    call.uni f_plain, ();
    // griddepcontrol.wait;
    /* griddepcontrol.wait; */
    ret;
}
.visible .entry launches_a_waiting_kernel(.param .u64 p)
{
    mov.u64 %rd1, by_call;
    ret;
}
"""


@pytest.mark.parametrize(
    ("entry", "waits"),
    [
        ("by_call", True),
        ("by_table", True),  # an indirect call through a table naming f_waits: followed
        ("plain", False),  # comments are no code
        ("launches_a_waiting_kernel", False),  # another kernel waiting is not this one waiting
        ("missing", False),
    ],
)
def test_the_ptx_walk(entry: str, waits: bool) -> None:
    assert reaches_wait(PTX, entry) is waits


# -- on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.sg_cuda
def test_recording_a_pdl_kernel_that_never_waits_fails_before_anything_is_built() -> None:
    dev = sg.device("cuda")
    if not getattr(dev.backend, "pdl", False):
        pytest.skip("the wait check runs for sm_90+ GPUs")
    stream = dev.stream()
    out = dev.from_numpy(np.zeros(64, np.float32), name="out")
    kernel = declare(FORGETS, "forgets")
    with pytest.raises(PdlWaitError, match="never waits"), CudaGraph.scope(stream) as s:
        s.record(library.fill_op(out.mut(), 1.0))
        s.record(kernel[1, 64](out.mut(), 64))
    with pytest.raises(sg.ScopeStateError, match="ended with an exception"):
        s.graph
    assert kernel.compiled == {}
    with pytest.raises(PdlWaitError):
        stream.run(kernel[1, 64](out.mut(), 64))
    assert_stream_usable(stream)
