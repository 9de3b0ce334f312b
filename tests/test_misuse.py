"""The misuse catalogue (issue 8): ways to get scopegraph wrong, written from the contract
(DESIGN.md sections 1-4). Each case is one parametrised id; tests/misuse_helpers.py checks, for
every one: the exact error class, the message (patterns and a `help:` line), that the failing step
built no graph and left nothing pinned, and that the same stream then runs a valid graph.

`MISUSE` runs on every backend (host, and CUDA where a GPU exists) through `sg_device`;
`CUDA_MISUSE` needs a GPU (foreign wrappers from torch/cupy, mixing devices).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import pickle
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library
from scopegraph._driver import cuda_device_count

from .misuse_helpers import Case, Ctx, Table, UserBug, run_case

NDArray = np.ndarray[Any, np.dtype[Any]]

MISUSE = Table()
CUDA_MISUSE = Table()
case = MISUSE.case
cuda_case = CUDA_MISUSE.case

# `touches=` is new in issue 8; reach it through Any so this module imports (and type-checks)
# whether or not the core has it yet.
kernel_with_touches: Any = sg.kernel


# -- kernels the cases use ---------------------------------------------------------------------

SCALE_SRC = r"""
extern "C" __global__ void misuse_scale(float* out, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}
"""


@sg.kernel(SCALE_SRC)
def misuse_scale(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None:
    """out[:n] = 2 * x[:n]"""


@misuse_scale.host
def _misuse_scale(out: NDArray, x: NDArray, n: np.int32) -> None:
    out[:n] = 2 * x[:n]


SCALARS_SRC = r"""
extern "C" __global__ void misuse_scalars(float* out, int count, unsigned int mask, float gain) {
    out[0] = gain * (float)count + (float)mask;
}
"""


@sg.kernel(SCALARS_SRC)
def misuse_scalars(out: Mut[Tensor], count: sg.i32, mask: sg.u32, gain: sg.f32) -> None:
    """out[0] = gain * count + mask"""


@misuse_scalars.host
def _misuse_scalars(out: NDArray, count: np.int32, mask: np.uint32, gain: np.float32) -> None:
    out[0] = gain * count + mask


# NVRTC rejects this (an undeclared name). No host reference: the host backend cannot run it.
BROKEN_SRC = r"""
extern "C" __global__ void misuse_broken(float* out) {
    out[0] = undeclared_in_misuse_broken;
}
"""


@sg.kernel(BROKEN_SRC)
def misuse_broken(out: Mut[Tensor]) -> None:
    """Does not compile."""


LAST_SRC = r"""
extern "C" __global__ void misuse_last(float* out, int n) { out[n - 1] = 1.0f; }
"""


@sg.kernel(LAST_SRC)
def misuse_last(out: Mut[Tensor], n: sg.i32) -> None:
    """out[n - 1] = 1 (no touches= declaration, so only the host reference can catch a bad n)."""


@misuse_last.host
def _misuse_last(out: NDArray, n: np.int32) -> None:
    out[n - 1] = 1.0


COPY_SRC = r"""
extern "C" __global__ void misuse_copy_n(float* out, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}
"""


def misuse_copy_n(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None:
    """out[:n] = x[:n]; declared with touches= in the cases that use it."""


def _copy_n_host(out: NDArray, x: NDArray, n: np.int32) -> None:
    out[:n] = x[:n]


FILL_GRID_SRC = r"""
extern "C" __global__ void misuse_fill_grid(float* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f; }
"""


def misuse_fill_grid(out: Mut[Tensor]) -> None:
    """out[i] = 1 for every thread i of the grid."""


def _fill_grid_host(out: NDArray) -> None:
    out[...] = 1.0


STATIC_SHARED_SRC = r"""
extern "C" __global__ void misuse_static_shared(float* out) {
    __shared__ float staged[256];  // 1 KiB of static shared memory
    extern __shared__ float dynamic[];
    staged[threadIdx.x] = dynamic[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = staged[255 - threadIdx.x];
}
"""


@sg.kernel(STATIC_SHARED_SRC)
def misuse_static_shared(out: Mut[Tensor]) -> None:
    """out = reversed dynamic shared memory (its content does not matter here); 1 KiB static."""


@sg.kernel(STATIC_SHARED_SRC, name="misuse_static_shared", max_shared_bytes=227 * 1024)
def misuse_static_shared_opted_in(out: Mut[Tensor]) -> None:
    """misuse_static_shared, declared to opt in to the most shared memory any GPU gives a block."""


def touches_kernel(touches: dict[str, str]) -> Any:
    """misuse_copy_n declared with ``touches``; the host reference is attached."""
    k = kernel_with_touches(COPY_SRC, touches=touches)(misuse_copy_n)
    k.host(_copy_n_host)
    return k


# -- the user's own exceptions inside the block, compile errors ------------------------------


def _user_exception_unchanged(c: Ctx, exc: BaseException) -> None:
    assert exc is c.user_exc, "the user's exception must propagate unchanged"
    assert exc.__context__ is None and exc.__cause__ is None, "nothing else may be raised while it propagates"
    assert (c.tensors[0].numpy() == 0).all(), "the failed scope must not have run its records"


@case(UserBug, r"user code failed after three records", helpful=False, check=_user_exception_unchanged)
def user_exception_after_records(c: Ctx) -> None:
    """The user's code raises inside the `with` block after three records."""
    x, y = c.zeros(16, "x"), c.zeros(16, "y")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(library.add_op(y.mut(), x, x))
        s.record(library.add_scalar_op(y.mut(), 1.0))
        c.user_exc = UserBug("user code failed after three records")
        raise c.user_exc


@case(KeyboardInterrupt, r"interrupted while recording", helpful=False, check=_user_exception_unchanged)
def keyboard_interrupt_after_records(c: Ctx) -> None:
    """A KeyboardInterrupt (a BaseException, not an Exception) arrives inside the block after records."""
    x = c.zeros(16, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(library.add_scalar_op(x.mut(), 1.0))
        c.user_exc = KeyboardInterrupt("interrupted while recording")
        raise c.user_exc


def _compile_error_details(c: Ctx, exc: BaseException) -> None:
    if isinstance(exc, sg.CompileError):
        assert exc.kernel_name == "misuse_broken"
        assert "undeclared_in_misuse_broken" in exc.log


@case(
    "CompileError",
    r"`misuse_broken`",
    r"undeclared_in_misuse_broken",
    host=("NoHostReferenceError", (r"`misuse_broken`", r"no host reference")),
    check=_compile_error_details,
)
def compile_error_on_third_kernel(c: Ctx) -> None:
    """The third kernel recorded does not compile (CUDA: CompileError at record; host: it has no reference)."""
    x, y = c.arange(16, "x"), c.zeros(16, "y")
    with c.scope() as s:
        s.record(library.add_op(y.mut(), x, x))
        s.record(library.axpy_op(y.mut(), x, 2.0))
        s.record(misuse_broken[1, 1](y.mut()))


# -- NotAGraphNodeError ------------------------------------------------------------------------


@case("NotAGraphNodeError", r"allocat")
def record_allocation_after_records(c: Ctx) -> None:
    """An allocation op recorded after valid records."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(sg.full((4,), 2, sg.i32))  # type: ignore[arg-type]


@case("NotAGraphNodeError", r"GraphNode", r"Tensor")
def record_a_tensor(c: Ctx) -> None:
    """A tensor passed to s.record instead of an op."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(x)  # type: ignore[arg-type]


@case("NotAGraphNodeError", r"GraphNode", r"RecordedNode")
def record_a_recorded_node(c: Ctx) -> None:
    """The handle s.record returned, recorded again."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        node = s.record(sg.memset(x.mut(), 1.0))
        s.record(node)  # type: ignore[arg-type]


@case("NotAGraphNodeError", r"GraphNode")
def record_a_launcher_not_called(c: Ctx) -> None:
    """`kernel[grid, block]` recorded without calling it with arguments."""
    x = c.zeros(64, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(library.fill[1, 64])  # type: ignore[arg-type]


@case("SignatureError", r"`axpy` was called without a launch configuration", r"help: launch it as axpy\[grid, block\]")
def call_a_kernel_without_a_launch_shape(c: Ctx) -> None:
    """`axpy(y.mut(), x, 2.0, 8)`: a kernel called as a function, with no [grid, block]."""
    x, y = c.zeros(8, "x"), c.zeros(8, "y")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(library.axpy(y.mut(), x, 2.0, 8))  # type: ignore[operator]


@case("NotAGraphNodeError", r"stream\.run\(\) takes an op")
def run_a_launcher_not_called(c: Ctx) -> None:
    """`kernel[grid, block]` given to stream.run without calling it."""
    c.stream.run(library.fill[1, 64])  # type: ignore[arg-type]


@case("NotAGraphNodeError", r"`Op\(\)`", r"real op")
def run_a_bare_op(c: Ctx) -> None:
    """stream.run(sg.Op()): the base class, which no op constructor built."""
    c.stream.run(sg.Op())


@case("NotAGraphNodeError", r"`GraphNode\(\)`", r"real op")
def run_a_bare_graph_node(c: Ctx) -> None:
    """stream.run(sg.GraphNode()): a GraphNode that names no tensors."""
    c.stream.run(sg.GraphNode())


@case("NotAGraphNodeError", r"`GraphNode\(\)`", r"real op")
def record_a_bare_graph_node(c: Ctx) -> None:
    """s.record(sg.GraphNode()) after a valid record."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(sg.GraphNode())


# -- BorrowError: aliasing in one op -----------------------------------------------------------


@case("BorrowError", r"cannot borrow `x`", r"misuse_scale")
def alias_whole_tensor_in_user_kernel(c: Ctx) -> None:
    """A user kernel that reads and writes the same tensor, recorded third."""
    x, y = c.arange(16, "x"), c.zeros(16, "y")
    with c.scope() as s:
        s.record(library.add_op(y.mut(), x, x))
        s.record(misuse_scale[1, 16](y.mut(), x, 16))
        s.record(misuse_scale[1, 16](x.mut(), x, 16))  # type: ignore[scopegraph-borrow]  # the runtime check under test


@case("BorrowError", r"x\[4:12\]", r"`add`")
def alias_overlapping_views_in_library_op(c: Ctx) -> None:
    """add_op writing x[0:8] while reading x[4:12]."""
    x, y = c.arange(16, "x"), c.arange(16, "y")
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        s.record(library.add_op(x[0:8].mut(), x[4:12], y[0:8]))


@case("BorrowError", r"`b`|`a`", r"memcpy")
def alias_two_foreign_wrappers(c: Ctx) -> None:
    """Two wrappers of one foreign allocation (made by two from_dlpack calls) in one memcpy."""
    a, b = c.foreign_pair(slice(0, 16), slice(0, 16))
    sg.memcpy(a.mut(), b)


@case("BorrowError", r"`b`|`a`", r"misuse_scale")
def alias_overlapping_foreign_views(c: Ctx) -> None:
    """Wrappers of overlapping parts (elements 0..8 and 4..12) of one foreign allocation, in one kernel."""
    a, b = c.foreign_pair(slice(0, 8), slice(4, 12))
    with c.scope() as s:
        s.record(misuse_scale[1, 8](a.mut(), b, 8))


@case("BorrowError", r"memcpy")
def alias_wrapper_of_an_sg_tensor(c: Ctx) -> None:
    """An sg tensor and a from_dlpack wrapper of that same tensor in one memcpy."""
    x = c.arange(16, "x")
    w = c.track(sg.Tensor.from_dlpack(x, name="w"))
    sg.memcpy(x.mut(), w)


# -- BorrowError: frozen memory --------------------------------------------------------------


def _w_untouched(c: Ctx, exc: BaseException) -> None:
    np.testing.assert_array_equal(c.tensors[0].numpy(), 1.0)


@case("BorrowError", r"`w`", r"frozen", check=_w_untouched)
def frozen_op_built_before_freeze_then_run(c: Ctx) -> None:
    """An op that writes w, built before w.freeze(), run eagerly after it."""
    w = c.full(16, 1.0, "w")
    op = sg.memset(w.mut(), 0.0)
    w.freeze()
    c.stream.run(op)


@case("BorrowError", r"`w`", r"frozen")
def frozen_op_built_before_freeze_then_recorded(c: Ctx) -> None:
    """A kernel launch that writes w, built before w.freeze(), recorded after it."""
    w, y = c.full(16, 1.0, "w"), c.zeros(16, "y")
    op = library.fill_op(w.mut(), 0.0)
    w.freeze()
    with c.scope() as s:
        s.record(library.add_op(y.mut(), w, w))
        s.record(op)


@case("BorrowError", r"`w`", r"frozen")
def frozen_view_then_write_whole(c: Ctx) -> None:
    """Part of w frozen (w[0:4]); a kernel writing all of w recorded."""
    w = c.full(16, 1.0, "w")
    w[0:4].freeze()
    with c.scope() as s:
        s.record(library.fill_op(w.mut(), 0.0))


@case("BorrowError", r"frozen")
def frozen_memory_through_a_second_wrapper(c: Ctx) -> None:
    """Foreign memory frozen through one wrapper, written through another wrapper of it."""
    a, b = c.foreign_pair(slice(0, 16), slice(0, 16))
    a.freeze()
    sg.memset(b.mut(), 0.0)


@case("BorrowError", r"`b`", r"frozen")
def frozen_memory_written_after_the_freezing_wrapper_is_dropped(c: Ctx) -> None:
    """Foreign memory frozen through wrapper `a`; `a` dropped; written through wrapper `b` of part
    of it, made while `a` lived (the freeze is the memory's, not the wrapper's)."""
    owner = c.foreign_owner()
    a = sg.Tensor.from_dlpack(owner[0:16], name="a").freeze()  # not tracked: the case drops it
    b = c.track(sg.Tensor.from_dlpack(owner[4:12], name="b"))
    del a
    gc.collect()
    sg.memset(b.mut(), 0.0)


def _alias_untouched(c: Ctx, exc: BaseException) -> None:
    np.testing.assert_array_equal(c.tensors[0].numpy(), 1.0)


@case("BorrowError", r"`alias`", r"frozen", check=_alias_untouched)
def frozen_tensor_written_through_a_wrapper_after_it_is_dropped(c: Ctx) -> None:
    """alias = sg.Tensor.from_dlpack(w); an op writing alias built; w frozen and dropped; the op run."""
    w = c.device.full((16,), 1.0, name="w")
    alias = c.track(sg.Tensor.from_dlpack(w, name="alias"))
    op = sg.memset(alias.mut(), 0.0)
    w.freeze()
    del w
    gc.collect()
    c.stream.run(op)


def _w_not_frozen(c: Ctx, exc: BaseException) -> None:
    assert not any(t.frozen for t in c.tensors), "a refused freeze() must not leave the tensor frozen"


@case("BorrowError", r"`w`", r"graph", check=_w_not_frozen)
def freeze_while_a_graph_writes(c: Ctx) -> None:
    """w.freeze() while a live graph writes w."""
    w = c.zeros(16, "w")
    c.graph(sg.memset(w.mut(), 1.0))
    w.freeze()


@case("BorrowError", r"w\[4:12\]|`w`", r"graph", check=_w_not_frozen)
def freeze_view_while_a_graph_writes_an_overlap(c: Ctx) -> None:
    """w[4:12].freeze() while a live graph writes w[0:8]."""
    w = c.zeros(16, "w")
    c.graph(library.fill_op(w[0:8].mut(), 1.0))
    w[4:12].freeze()


@case("BorrowError", r"`w`", r"scope", check=_w_not_frozen)
def freeze_while_the_open_scope_writes(c: Ctx) -> None:
    """w.freeze() inside a scope that has recorded a write to w."""
    w = c.zeros(16, "w")
    with c.scope() as s:
        s.record(sg.memset(w.mut(), 1.0))
        w.freeze()


# -- LifetimeError ---------------------------------------------------------------------------


def _x_still_alive(c: Ctx, exc: BaseException) -> None:
    np.testing.assert_array_equal(c.tensors[0].numpy(), 1.0)


@case("LifetimeError", r"`x`", r"graph", check=_x_still_alive)
def free_while_a_graph_pins(c: Ctx) -> None:
    """x.free() while a live graph uses x."""
    x = c.full(16, 1.0, "x")
    c.graph(library.add_scalar_op(x.mut(), 1.0))
    x.free()


@case("LifetimeError", r"`x`", r"another tensor wraps the same memory")
def free_while_a_wrapper_of_the_memory_lives(c: Ctx) -> None:
    """x.free() while a DLPack wrapper of x's memory (frozen through the wrapper) is alive."""
    x = c.full(16, 1.0, "x")
    wrapper = sg.Tensor.from_dlpack(x, name="wrapper").freeze()
    c.keep.append(wrapper)
    x.free()


@case("LifetimeError", r"freed", r"`x`")
def use_after_free_in_a_scope(c: Ctx) -> None:
    """A kernel reading a freed tensor, built and recorded after a valid record."""
    x, y, z = c.zeros(16, "x"), c.zeros(16, "y"), c.zeros(16, "z")
    x.free()
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        s.record(library.add_op(z.mut(), x, y))


@case("LifetimeError", r"freed")
def use_after_free_through_a_view(c: Ctx) -> None:
    """A view made before its tensor was freed, written after."""
    x = c.zeros(16, "x")
    v = x[0:4]
    x.free()
    sg.memset(v.mut(), 0.0)


@case("LifetimeError", r"closed")
def launch_a_graph_closed_by_its_with_block(c: Ctx) -> None:
    """A graph used as a context manager (which closes it), launched after the block."""
    x = c.zeros(16, "x")
    with c.graph(sg.memset(x.mut(), 1.0)) as g:
        pass
    g.launch()


@case("LifetimeError", r"closed")
def to_dot_of_a_closed_graph(c: Ctx) -> None:
    """graph.to_dot() after graph.close()."""
    x = c.zeros(16, "x")
    g = c.graph(sg.memset(x.mut(), 1.0))
    g.close()
    g.to_dot()


# -- SignatureError: sizes ---------------------------------------------------------------------


@case("SignatureError", r"a16|`a`", r"\b64\b")
def add_op_inputs_smaller_than_out(c: Ctx) -> None:
    """library.add_op with a 64-float out and 16-float inputs."""
    out, a, b = c.zeros(64, "out"), c.zeros(16, "a16"), c.zeros(16, "b16")
    library.add_op(out.mut(), a, b)


@case("SignatureError", r"out8|`out`", r"\b32\b")
def matvec_op_out_too_small(c: Ctx) -> None:
    """library.matvec_op with w of shape (32, 16) and an 8-float out."""
    out, x, w = c.zeros(8, "out8"), c.zeros(16, "x"), c.zeros((32, 16), "w")
    library.matvec_op(out.mut(), x, w)


@case("SignatureError", r"x16|`x`", r"\b32\b")
def matvec_op_x_too_small(c: Ctx) -> None:
    """library.matvec_op with w of shape (8, 32) and a 16-float x."""
    out, x, w = c.zeros(8, "out"), c.zeros(16, "x16"), c.zeros((8, 32), "w")
    with c.scope() as s:
        s.record(library.matvec_op(out.mut(), x, w))


@case("SignatureError", r"out12|`out`", r"\b8\b")
def matvec_op_out_larger_than_w_has_rows(c: Ctx) -> None:
    """library.matvec_op with w of shape (8, 16) and a 12-float out: 4 of its floats would stay as they were."""
    out, x, w = c.zeros(12, "out12"), c.zeros(16, "x"), c.zeros((8, 16), "w")
    library.matvec_op(out.mut(), x, w)


@case("SignatureError", r"x24|`x`", r"\b16\b")
def rms_norm_matvec_op_x_longer_than_w_rows(c: Ctx) -> None:
    """library.rms_norm_matvec_op with w of shape (8, 16) and a 24-float x (and norm weights)."""
    out, x, w = c.zeros(8, "out"), c.zeros(24, "x24"), c.zeros((8, 16), "w")
    library.rms_norm_matvec_op(out.mut(), x, c.zeros(24, "nw"), w, 1e-5)


@case("SignatureError", r"out4x16|`out`", r"\b32\b")
def rms_norm_op_out_with_more_rows_than_x(c: Ctx) -> None:
    """library.rms_norm_op of x (2, 16) into out (4, 16): two rows of out would stay as they were."""
    out, x = c.zeros((4, 16), "out4x16"), c.zeros((2, 16), "x")
    library.rms_norm_op(out.mut(), x, c.zeros(16, "nw"), 1e-5)


@case("SignatureError", r"b64|`b`", r"\b16\b")
def add_op_input_longer_than_out(c: Ctx) -> None:
    """library.add_op of a 16-float out from a 16-float a and a 64-float b: 48 floats of b unread."""
    library.add_op(c.zeros(16, "out").mut(), c.zeros(16, "a"), c.zeros(64, "b64"))


@case("SignatureError", r"x32|`x`", r"\b16\b")
def axpy_op_x_longer_than_out(c: Ctx) -> None:
    """library.axpy_op into a 16-float out from a 32-float x."""
    library.axpy_op(c.zeros(16, "out").mut(), c.zeros(32, "x32"), 2.0)


@case("SignatureError", r"nw24|`nw`", r"\b16\b")
def rms_norm_matvec_op_norm_weights_longer_than_x(c: Ctx) -> None:
    """library.rms_norm_matvec_op with w of shape (8, 16), a 16-float x and 24 norm weights."""
    out, x, w = c.zeros(8, "out"), c.zeros(16, "x"), c.zeros((8, 16), "w")
    library.rms_norm_matvec_op(out.mut(), x, c.zeros(24, "nw24"), w, 1e-5)


@case("SignatureError", r"w32|`w`", r"\b16\b")
def rms_norm_op_weights_longer_than_a_row(c: Ctx) -> None:
    """library.rms_norm_op of rows of 16 with 32 norm weights."""
    library.rms_norm_op(c.zeros((2, 16), "out").mut(), c.zeros((2, 16), "x"), c.zeros(32, "w32"), 1e-5)


@case("SignatureError", r"out2x16|`out`", r"\b0 elements")
def rms_norm_op_of_no_rows_into_an_out_with_elements(c: Ctx) -> None:
    """library.rms_norm_op of x with no rows (0, 16) into out (2, 16): out would stay as it was."""
    library.rms_norm_op(c.zeros((2, 16), "out2x16").mut(), c.zeros((0, 16), "x"), c.zeros(16, "w"), 1e-5)


@case("SignatureError", r"a16|`a`", r"\b64\b")
def raw_add_launch_size_exceeds_inputs(c: Ctx) -> None:
    """A raw launch of library.add whose size argument (64) exceeds its 16-float inputs."""
    out, a, b = c.zeros(64, "out"), c.zeros(16, "a16"), c.zeros(16, "b16")
    library.add[1, 256](out.mut(), a, b, 64)


@case("SignatureError", r"x\[0:32\]|`out`", r"\b64\b")
def raw_fill_on_a_view_claims_more(c: Ctx) -> None:
    """library.fill on the view x[0:32] with n=64 (it would write the disjoint x[32:64] too)."""
    x, y = c.zeros(64, "x"), c.zeros(64, "y")
    with c.scope() as s:
        s.record(library.fill_op(x[32:64].mut(), 2.0))
        s.record(library.fill_op(y.mut(), 1.0))
        s.record(library.fill[1, 64](x[0:32].mut(), 1.0, 64))


@case("SignatureError", r"out16|`out`", r"\b32\b")
def user_kernel_touches_n_exceeded(c: Ctx) -> None:
    """A user kernel declared touches={"out": "n", "x": "n"}, launched with n=32 on a 16-float out."""
    k = touches_kernel({"out": "n", "x": "n"})
    out, x = c.zeros(16, "out16"), c.zeros(32, "x")
    k[1, 32](out.mut(), x, 32)


@case("SignatureError", r"out|`o128`", r"\b256\b")
def user_kernel_touches_grid_exceeded(c: Ctx) -> None:
    """A kernel declared touches={"out": "grid_x * block_x"}, launched [4, 64] on 128 floats."""
    k: Any = kernel_with_touches(FILL_GRID_SRC, touches={"out": "grid_x * block_x"})(misuse_fill_grid)
    k.host(_fill_grid_host)
    out = c.zeros(128, "o128")
    with c.scope() as s:
        s.record(k[2, 64](out.mut()))
        s.record(k[4, 64](out.mut()))


@case("SignatureError", r"misuse_copy_n", r"\by\b")
def bad_touches_unknown_parameter(c: Ctx) -> None:
    """touches= names a parameter the kernel does not have."""
    touches_kernel({"y": "n"})


@case("SignatureError", r"misuse_copy_n", r"`n`|\bn\b")
def bad_touches_on_a_scalar(c: Ctx) -> None:
    """touches= declares a size for a scalar parameter."""
    touches_kernel({"out": "n", "n": "n"})


@case("SignatureError", r"misuse_copy_n", r"\bm\b")
def bad_touches_unknown_name(c: Ctx) -> None:
    """touches= uses a name that is neither a scalar parameter nor a launch dimension."""
    touches_kernel({"out": "m * 2"})


@case("SignatureError", r"misuse_copy_n")
def bad_touches_not_an_expression(c: Ctx) -> None:
    """touches= holds something that does not parse as an expression."""
    touches_kernel({"out": "n +"})


@case("SignatureError", r"misuse_copy_n")
def bad_touches_calls_code(c: Ctx) -> None:
    """touches= holds a function call, not arithmetic over scalars and launch dimensions."""
    touches_kernel({"out": "__import__('os').getpid()"})


# -- SignatureError: launch configurations (checked on every backend) -----------------------------


@case("SignatureError", r"\b1024\b")
def block_of_2048_threads(c: Ctx) -> None:
    """A block of 2048 threads."""
    x = c.zeros(64, "x")
    library.fill[1, 2048](x.mut(), 1.0, 64)


@case("SignatureError", r"\b1024\b|\b2048\b")
def block_32_32_2(c: Ctx) -> None:
    """A block (32, 32, 2): each dimension is fine, the product is 2048 threads."""
    x = c.zeros(64, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 0.0))
        s.record(library.fill[1, (32, 32, 2)](x.mut(), 1.0, 64))


@case("SignatureError", r"\b64\b")
def block_z_of_65(c: Ctx) -> None:
    """A block (1, 1, 65): block z is at most 64."""
    library.fill[1, (1, 1, 65)]


@case("SignatureError", r"65535")
def grid_y_of_70000(c: Ctx) -> None:
    """A grid y of 70000 (at most 65535)."""
    library.fill[(1, 70000), 32]


@case("SignatureError", r"2147483647|2\*\*31")
def grid_x_of_2_pow_31(c: Ctx) -> None:
    """A grid x of 2**31 (at most 2**31 - 1)."""
    library.fill[2**31, 32]


@case("SignatureError", r"1\.5")
def grid_of_1_5(c: Ctx) -> None:
    """A grid of 1.5 blocks."""
    library.fill[1.5, 32]  # type: ignore[index]


@case("SignatureError", r"True|bool")
def grid_of_true(c: Ctx) -> None:
    """A grid of True (a bool is not a block count)."""
    library.fill[True, 32]


@case("SignatureError", r"'4'|\"4\"|str")
def block_of_a_string(c: Ctx) -> None:
    """A block of "4"."""
    library.fill[1, "4"]  # type: ignore[index]


@case("SignatureError", r"48 ?KiB|49152|shared")
def dynamic_shared_memory_of_64_kib(c: Ctx) -> None:
    """64 KiB of dynamic shared memory (at most 48 KiB without opting in)."""
    x = c.zeros(64, "x")
    library.fill[1, 64, 64 * 1024](x.mut(), 1.0, 64)


# -- SignatureError: scalars -------------------------------------------------------------------


@case("SignatureError", r"count", r"i32")
def scalar_2_pow_40_into_i32(c: Ctx) -> None:
    """2**40 for an i32 parameter."""
    out = c.zeros(1, "out")
    misuse_scalars[1, 1](out.mut(), 2**40, 0, 1.0)


@case("SignatureError", r"count", r"i32")
def scalar_1_5_into_i32(c: Ctx) -> None:
    """1.5 for an i32 parameter, in a scope."""
    out = c.zeros(1, "out")
    with c.scope() as s:
        s.record(misuse_scalars[1, 1](out.mut(), 1, 0, 1.0))
        s.record(misuse_scalars[1, 1](out.mut(), 1.5, 0, 1.0))  # type: ignore[arg-type]


@case("SignatureError", r"mask", r"u32")
def scalar_minus_1_into_u32(c: Ctx) -> None:
    """-1 for a u32 parameter."""
    out = c.zeros(1, "out")
    misuse_scalars[1, 1](out.mut(), 1, -1, 1.0)


@case("SignatureError", r"gain", r"f32")
def scalar_1e39_into_f32(c: Ctx) -> None:
    """1e39 for an f32 parameter (beyond float32's range)."""
    out = c.zeros(1, "out")
    misuse_scalars[1, 1](out.mut(), 1, 0, 1e39)


@case("SignatureError", r"1\.5", r"i32")
def memset_1_5_into_i32(c: Ctx) -> None:
    """sg.memset of 1.5 into an i32 tensor (it would store 1)."""
    xi = c.zeros(4, "xi", sg.int32)
    sg.memset(xi.mut(), 1.5)


@case("SignatureError", r"300", r"u8")
def memset_300_into_u8(c: Ctx) -> None:
    """sg.memset of 300 into a u8 tensor."""
    xb = c.zeros(4, "xb", sg.uint8)
    sg.memset(xb.mut(), 300)


# -- SignatureError: memcpy sizes, argument counts and kinds ---------------------------------------


@case("SignatureError", r"memcpy sizes differ")
def memcpy_size_mismatch_after_records(c: Ctx) -> None:
    """A memcpy of 8 floats into a (4, 4) view, recorded after valid records."""
    x, y = c.zeros(16, "x"), c.zeros(16, "y")
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        s.record(sg.memcpy(x.mut(), y))
        s.record(sg.memcpy(x.view((4, 4)).mut(), y[0:8]))


@case("SignatureError", r"x\.mut\(\)")
def memset_of_a_shared_tensor(c: Ctx) -> None:
    """sg.memset(x, 0.0): a Tensor where a Mut is expected."""
    x = c.zeros(4, "x")
    sg.memset(x, 0.0)  # type: ignore[arg-type]


@case("SignatureError", r"without \.mut\(\)|only reads")
def memcpy_source_passed_mutably(c: Ctx) -> None:
    """sg.memcpy(x.mut(), y.mut()): a Mut where a Tensor is expected."""
    x, y = c.zeros(4, "x"), c.zeros(4, "y")
    sg.memcpy(x.mut(), y.mut())  # type: ignore[arg-type]


@case("SignatureError", r"takes 3 arguments")
def kernel_with_too_many_arguments(c: Ctx) -> None:
    """library.fill launched with an extra argument, in a scope."""
    x = c.zeros(64, "x")
    with c.scope() as s:
        s.record(library.fill[1, 64](x.mut(), 1.0, 64, 5))  # type: ignore[call-arg]


@case("SignatureError", r"count|takes 3 arguments")
def kernel_with_an_unknown_keyword(c: Ctx) -> None:
    """library.fill launched with a keyword it does not declare."""
    x = c.zeros(64, "x")
    library.fill[1, 64](out=x.mut(), value=1.0, count=64)  # type: ignore[call-arg]


@case("SignatureError", r"ndarray")
def numpy_array_as_a_tensor_argument(c: Ctx) -> None:
    """A numpy array passed where a kernel reads a Tensor."""
    out, b = c.zeros(64, "out"), c.zeros(64, "b")
    library.add_op(out.mut(), np.zeros(64, np.float32), b)  # type: ignore[arg-type]


@case("SignatureError", r"ndarray")
def mut_of_a_numpy_array(c: Ctx) -> None:
    """sg.mut() of something that is not a Tensor."""
    sg.mut(np.zeros(4, np.float32))  # type: ignore[type-var]


# -- ScopeStateError: eager work on a recording stream (every path), scope state --------------------


@case("ScopeStateError", r"recording")
def eager_run_on_the_recording_stream_after_records(c: Ctx) -> None:
    """stream.run(kernel launch) on the stream a scope records on, after records."""
    x, y = c.zeros(64, "x"), c.zeros(64, "y")
    with c.scope() as s:
        s.record(library.fill_op(x.mut(), 1.0))
        s.record(library.add_op(y.mut(), x, x))
        c.stream.run(library.fill_op(x.mut(), 2.0))


@case("ScopeStateError", r"recording")
def eager_from_numpy_onto_the_recording_stream(c: Ctx) -> None:
    """dev.from_numpy(arr, stream=s) while a scope records on s."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        c.track(c.device.from_numpy(np.ones(4, np.float32), name="late", stream=c.stream))


@case("ScopeStateError", r"recording")
def graph_update_while_its_stream_records(c: Ctx) -> None:
    """graph.update(op) while a new scope records on the graph's stream."""
    x, y = c.zeros(4, "x"), c.zeros(4, "y")
    g = c.graph(sg.memset(x.mut(), 1.0))
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        g.update(sg.memset(x.mut(), 2.0))


@case("ScopeStateError", r"recording")
def graph_launch_onto_the_recording_stream(c: Ctx) -> None:
    """graph.launch(stream=s) of a graph built on another stream, while a scope records on s."""
    x, y = c.zeros(4, "x"), c.zeros(4, "y")
    g = c.graph(sg.memset(x.mut(), 1.0), stream=c.other_stream())
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        g.launch(stream=c.stream)


@case("ScopeStateError", r"cannot read `x\[2:4\]` with numpy\(\): the open scope at .* records a write to it")
def numpy_of_memory_the_recording_scope_writes(c: Ctx) -> None:
    """x.numpy() (a view of it) while the open scope records a write to x: the copy would hold the
    contents from before the graph. Reading memory the scope does not write stays allowed."""
    x, y = c.zeros(4, "x"), c.zeros(4, "y")
    with c.scope() as s:
        s.record(library.add_op(x.mut(), y, y))
        np.testing.assert_array_equal(y.numpy(), np.zeros(4, np.float32))
        x[2:4].numpy()


@case("ScopeStateError", r"another scope is recording")
def nested_scope_on_one_stream_after_records(c: Ctx) -> None:
    """A second scope (order="program") opened on the stream an open scope records on."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        with c.scope(order="program") as inner:
            inner.record(sg.memset(x.mut(), 2.0))


@case("ScopeStateError", r"s\.graph")
def graph_read_inside_the_block_after_records(c: Ctx) -> None:
    """s.graph read inside the block, after records."""
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(sg.memset(x.mut(), 2.0))
        s.graph


@case("ScopeStateError", r"finished|ended")
def record_after_a_failed_scope(c: Ctx) -> None:
    """s.record after the scope ended with an exception the user caught."""
    x = c.zeros(4, "x")
    s = c.scope()
    try:
        with s:
            s.record(sg.memset(x.mut(), 1.0))
            raise UserBug("first attempt")
    except UserBug:
        pass
    s.record(sg.memset(x.mut(), 2.0))


@case("ScopeStateError", r"Stream")
def scope_given_a_device(c: Ctx) -> None:
    """CudaGraph.scope(dev): a device where a stream is expected."""
    CudaGraph.scope(c.device)  # type: ignore[arg-type]


@case("SignatureError", r"bogus")
def scope_order_bogus(c: Ctx) -> None:
    """CudaGraph.scope(stream, order="bogus")."""
    with c.scope(order="bogus"):
        pass


@case("SignatureError", r"Stream|stream")
def graph_launch_on_a_non_stream(c: Ctx) -> None:
    """graph.launch(stream="s"): not a stream."""
    x = c.zeros(4, "x")
    g = c.graph(sg.memset(x.mut(), 1.0))
    g.launch(stream="s")  # type: ignore[arg-type]


@case("SignatureError", r"__cuda_stream__|stream")
def stream_from_handle_of_an_object(c: Ctx) -> None:
    """sg.Stream.from_handle(object()): not a stream of any library."""
    sg.Stream.from_handle(object())


class _ForeignStream:
    """What torch's and CuPy's streams look like to from_handle (no GPU needed to refuse it)."""

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)


@case("SignatureError", r"device='host'", r"needs a CUDA device")
def stream_from_handle_on_the_host_device(c: Ctx) -> None:
    """sg.Stream.from_handle(torch_like_stream, device="host"): foreign streams run on a GPU."""
    sg.Stream.from_handle(_ForeignStream(), device="host")


class _BrokenStream:
    """A __cuda_stream__ that breaks the protocol (cuda.core raised a RuntimeError, a CudaError here)."""

    def __cuda_stream__(self) -> object:
        return "nonsense"


@case("SignatureError", r"__cuda_stream__\(\) gave 'nonsense'", r"\(version, handle\): two ints")
def stream_from_handle_of_a_broken_protocol(c: Ctx) -> None:
    """sg.Stream.from_handle(obj) whose __cuda_stream__() does not give (version, handle)."""
    sg.Stream.from_handle(_BrokenStream())


class _PerThreadStream:
    """A wrapper of cudaStreamPerThread, as cupy.cuda.Stream.ptds is (its handle is 2)."""

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 2)


@case("SignatureError", r"per-thread default stream \(cudaStreamPerThread\)", r"a stream of its own")
def stream_from_handle_of_the_per_thread_default_stream(c: Ctx) -> None:
    """sg.Stream.from_handle(cupy.cuda.Stream.ptds): a different stream in each thread, which
    scopegraph would wait for from the wrong thread."""
    sg.Stream.from_handle(_PerThreadStream())


@case("SignatureError", r"gpu:0")
def unknown_device_string(c: Ctx) -> None:
    """sg.device("gpu:0")."""
    sg.device("gpu:0")


# -- SignatureError: tensors, views, dtypes ----------------------------------------------------------


@case("SignatureError", r"\(3, 5\)")
def view_to_a_wrong_shape(c: Ctx) -> None:
    """x.view((3, 5)) of 16 elements."""
    c.zeros(16, "x").view((3, 5))


@case("SignatureError", r"-1")
def view_with_two_inferred_dims(c: Ctx) -> None:
    """x.view((-1, -1))."""
    c.zeros(16, "x").view((-1, -1))


@case("SignatureError", r"strided")
def strided_row_slice(c: Ctx) -> None:
    """x[::2]: scopegraph tensors are contiguous."""
    c.zeros(16, "x")[::2]


# SignatureError or a subclass: a subclass that is also an IndexError would keep `for row in t` working.
@case("SignatureError", r"\b16\b", r"`x`", exact=False)
def row_index_out_of_range(c: Ctx) -> None:
    """x[16] of a 16-row tensor (no foreign IndexError may escape)."""
    c.zeros(16, "x")[16]


@case("SignatureError", r"complex64")
def zeros_of_an_unsupported_dtype(c: Ctx) -> None:
    """dev.zeros with a dtype scopegraph does not support."""
    c.device.zeros((4,), "complex64")


@case("SignatureError", r"-4|negative")
def zeros_of_a_negative_shape(c: Ctx) -> None:
    """dev.zeros((-4,))."""
    c.device.zeros((-4,))


@case("SignatureError", r"65 dimensions", r"at most \d+")
def zeros_with_65_dimensions(c: Ctx) -> None:
    """dev.zeros((1,) * 65): more dimensions than numpy holds (no foreign ValueError may escape)."""
    c.device.zeros((1,) * 65)


@case("SignatureError", r"no elements", r"9223372036854775808")
def zeros_of_no_elements_with_a_size_of_2_pow_63(c: Ctx) -> None:
    """dev.zeros((2**63, 0)): no elements, but a size past numpy's index range."""
    c.device.zeros((2**63, 0))


@case("SignatureError", r"`x`", r"65 dimensions")
def view_with_65_dimensions(c: Ctx) -> None:
    """x.view((1,) * 65) of a one-element x."""
    c.zeros(1, "x").view((1,) * 65)


@case("SignatureError", r"`x`", r"no elements", r"18446744073709551616")
def view_of_no_elements_with_a_size_of_2_pow_64(c: Ctx) -> None:
    """x.view((2**64, 0)) of an empty x: accepted, it failed later in numpy() and every op on it."""
    c.zeros(0, "x").view((2**64, 0))


@case("SignatureError", r"object|'O'")
def from_numpy_of_an_object_array(c: Ctx) -> None:
    """dev.from_numpy of an array of Python objects."""
    c.device.from_numpy(np.array([object(), object()]))


# -- SignatureError: kernel declarations -----------------------------------------------------------


@case("SignatureError", r"`n`", r"no annotation")
def kernel_parameter_without_annotation(c: Ctx) -> None:
    """@sg.kernel on a function whose second parameter has no annotation."""

    def k(out: Mut[Tensor], n) -> None: ...  # type: ignore[no-untyped-def]

    sg.kernel(SCALE_SRC, name="misuse_scale")(k)


@case("SignatureError", r"`rest`")
def kernel_with_varargs(c: Ctx) -> None:
    """@sg.kernel on a function with *args."""

    def k(out: Mut[Tensor], *rest: Tensor) -> None: ...

    sg.kernel(SCALE_SRC, name="misuse_scale")(k)


@case("SignatureError", r"NoSuchTensorType")
def kernel_with_an_unresolvable_annotation(c: Ctx) -> None:
    """@sg.kernel on a function annotated with a name that does not exist."""

    def k(out: NoSuchTensorType) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    sg.kernel(SCALE_SRC, name="misuse_scale")(k)


@case("SignatureError", r"complex64")
def kernel_tensorspec_with_an_unknown_dtype(c: Ctx) -> None:
    """A TensorSpec naming a dtype scopegraph does not support."""

    def k(out: Annotated[Mut[Tensor], sg.TensorSpec("complex64")]) -> None: ...

    sg.kernel(SCALE_SRC, name="misuse_scale")(k)


# -- SignatureError: what @sg.kernel(...) and k.host(...) are given, checked when declared ----------


def _scale_signature(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None:
    """misuse_scale's declaration, for the cases below that declare it again with bad arguments."""


@case("SignatureError", r"pdl='no'", r"True or False")
def kernel_pdl_not_a_bool(c: Ctx) -> None:
    """@sg.kernel(SRC, pdl="no"): a truthy non-bool would make the kernel a PDL one (programmatic edges)."""
    sg.kernel(SCALE_SRC, name="misuse_scale", pdl="no")(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"touches='n'", r"mapping")
def kernel_touches_a_str(c: Ctx) -> None:
    """@sg.kernel(SRC, touches="n"): touches= maps parameter names to expressions."""
    sg.kernel(SCALE_SRC, name="misuse_scale", touches="n")(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"touches=\[", r"mapping")
def kernel_touches_a_list_of_pairs(c: Ctx) -> None:
    """@sg.kernel(SRC, touches=[("out", "n")]): a list of pairs, not a mapping."""
    sg.kernel(SCALE_SRC, name="misuse_scale", touches=[("out", "n")])(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"options=\['fast'\]", r"ProgramOptions")
def kernel_options_a_list(c: Ctx) -> None:
    """@sg.kernel(SRC, options=["fast"]): options= maps ProgramOptions fields to values."""
    sg.kernel(SCALE_SRC, name="misuse_scale", options=["fast"])(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"reads_before_wait=5", r"names")
def kernel_reads_before_wait_a_number(c: Ctx) -> None:
    """@sg.kernel(SRC, pdl=True, reads_before_wait=5): not parameter names."""
    sg.kernel(SCALE_SRC, name="misuse_scale", pdl=True, reads_before_wait=5)(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"name=3", r"C\+\+ name")
def kernel_name_a_number(c: Ctx) -> None:
    """@sg.kernel(SRC, name=3): the C++ name is a str."""
    sg.kernel(SCALE_SRC, name=3)(_scale_signature)  # type: ignore[arg-type]


@case("SignatureError", r"name='misuse scale'", r"not a C\+\+ identifier", r"__global__ function")
def kernel_name_not_a_cpp_identifier(c: Ctx) -> None:
    """@sg.kernel(SRC, name="misuse scale"): NVRTC would refuse it, but only when a GPU compiles it."""
    sg.kernel(SCALE_SRC, name="misuse scale")(_scale_signature)


@case("SignatureError", r"name='misuse_scale<4>'", r"template arguments", r"generics\('4'\)")
def kernel_name_with_template_arguments(c: Ctx) -> None:
    """@sg.kernel(SRC, name="k<4>"): template arguments are the launch's (generics())."""
    sg.kernel(SCALE_SRC, name="misuse_scale<4>")(_scale_signature)


@case("SignatureError", r"`delete`", r"without name=", r"C\+\+ keyword", r"name=")
def kernel_function_named_like_a_cpp_keyword(c: Ctx) -> None:
    """@sg.kernel(SRC) on `def delete(...)`: the default C++ name is a keyword no function can have."""

    def delete(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None: ...

    sg.kernel(SCALE_SRC)(delete)


@case("SignatureError", r"applied to int 42", r"not a function")
def kernel_decorating_a_number(c: Ctx) -> None:
    """sg.kernel(SRC)(42): the decorator applied to something that is not a function."""
    sg.kernel(SCALE_SRC)(42)  # type: ignore[arg-type]


@case("SignatureError", r"applied to type", r"not a function")
def kernel_decorating_a_class(c: Ctx) -> None:
    """sg.kernel(SRC)(int): a class has no kernel signature."""
    sg.kernel(SCALE_SRC)(int)  # type: ignore[arg-type]


@case("SignatureError", r"`misuse_scale` got int 5 as its host reference")
def kernel_host_reference_a_number(c: Ctx) -> None:
    """k.host(5): refused when registered, not a TypeError at the first run."""
    k = sg.kernel(SCALE_SRC, name="misuse_scale")(_scale_signature)
    x = c.zeros(16, "x")
    k.host(5)  # type: ignore[arg-type]
    c.stream.run(k[1, 16](x.mut(), x, 16))  # type: ignore[scopegraph-borrow]  # not reached


@case("SignatureError", r"host reference", r"cannot take its arguments", r"3 positional parameters")
def kernel_host_reference_of_the_wrong_arity(c: Ctx) -> None:
    """k.host(fn) with a reference of two parameters for a kernel of three."""
    k = sg.kernel(SCALE_SRC, name="misuse_scale")(_scale_signature)
    k.host(lambda out, x: None)


@case("SignatureError", r"indexed with 1\b", r"\[grid, block\]")
def launch_configuration_of_one_value(c: Ctx) -> None:
    """library.fill[1]: a grid without a block."""
    library.fill[1]  # type: ignore[index]


@case("SignatureError", r"indexed with \(1, 2, 3, 4\)", r"shared_bytes")
def launch_configuration_of_four_values(c: Ctx) -> None:
    """library.fill[1, 2, 3, 4]: one value too many."""
    library.fill[1, 2, 3, 4]  # type: ignore[index]


# -- SignatureError: the library's *_op helpers given the wrong kind of argument ---------------------


@case("SignatureError", r"rms_norm_op", r"`x` expects Tensor, got NoneType")
def rms_norm_op_given_none(c: Ctx) -> None:
    """library.rms_norm_op(y.mut(), None, w, eps)."""
    y, w = c.zeros(16, "y"), c.zeros(16, "w")
    library.rms_norm_op(y.mut(), None, w, 1e-6)  # type: ignore[arg-type]


@case("SignatureError", r"rms_norm_op", r"only reads `x`", r"without \.mut\(\)")
def rms_norm_op_x_mutably_borrowed(c: Ctx) -> None:
    """library.rms_norm_op(out.mut(), x.mut(), w, eps): a Mut where the helper reads."""
    out, x, w = c.zeros((2, 8), "out"), c.zeros((2, 8), "x"), c.zeros(8, "w")
    library.rms_norm_op(out.mut(), x.mut(), w, 1e-6)  # type: ignore[arg-type]


# -- SignatureError: captured regions given the wrong kind of argument ------------------------------


def _capture(c: Ctx, **kwargs: Any) -> None:
    x = c.zeros(4, "x")
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        with s.capture(host=lambda *views: None, **kwargs):
            pass


@case("SignatureError", r"writes= got NoneType", r"writes=\[")
def capture_writes_none(c: Ctx) -> None:
    """s.capture(writes=None)."""
    _capture(c, writes=None)


@case("SignatureError", r"reads= got int 3")
def capture_reads_a_number(c: Ctx) -> None:
    """s.capture(writes=[y.mut()], reads=3)."""
    _capture(c, writes=[c.zeros(4, "y").mut()], reads=3)


@case("SignatureError", r"reads= got NoneType", r"leave reads= out")
def capture_reads_none(c: Ctx) -> None:
    """s.capture(writes=[y.mut()], reads=None)."""
    _capture(c, writes=[c.zeros(4, "y").mut()], reads=None)


@case("SignatureError", r"keep= takes a list", r"int 5")
def capture_keep_a_number(c: Ctx) -> None:
    """s.capture(writes=[y.mut()], keep=5)."""
    _capture(c, writes=[c.zeros(4, "y").mut()], keep=5)


@case("SignatureError", r"host callable .* cannot take the region's 2 tensors", r"writes\[0\], reads\[0\]")
def capture_host_callable_of_the_wrong_arity(c: Ctx) -> None:
    """s.capture(writes=[y.mut()], reads=[x], host=lambda y: ...): the host backend calls host(y, x)."""
    x, y = c.zeros(4, "x"), c.zeros(4, "y")
    with c.scope() as s, s.capture(writes=[y.mut()], reads=[x], host=lambda y: None):
        pass


@case("ScopeStateError", r"scope ended while the captured region `late` opened at .* was still open")
def scope_ends_with_a_region_open(c: Ctx) -> None:
    """A region entered through an ExitStack and never ended before the scope's own end."""
    y = c.zeros(4, "y")
    regions = contextlib.ExitStack()
    c.keep.append(regions)
    with c.scope() as s:
        s.record(sg.memset(y.mut(), 1.0))
        regions.enter_context(s.capture(writes=[y.mut()], host=lambda y: None, name="late"))


@case("ScopeStateError", r"scope ended while the loop opened at .* was still open")
def scope_ends_with_a_loop_open(c: Ctx) -> None:
    """A s.while_ block entered through an ExitStack and never ended before the scope's own end."""
    y, flag = c.zeros(4, "y"), c.zeros(1, "flag", sg.i32)
    blocks = contextlib.ExitStack()
    c.keep.append(blocks)
    with c.scope() as s:
        body = blocks.enter_context(s.while_(flag))
        body.record(sg.memset(y.mut(), 1.0))


# -- NotCopyableError: copies and pickles of device state ------------------------------------------


def _graph_still_replays(c: Ctx, exc: BaseException) -> None:
    (graph,) = c.graphs
    graph.launch()
    graph.sync()
    assert not graph.closed


@case("NotCopyableError", r"cannot copy or pickle tensor `w`", r"sg\.dup")
def deepcopy_a_tensor(c: Ctx) -> None:
    """copy.deepcopy of a tensor (as of a model that holds its weights)."""
    copy.deepcopy({"w": c.zeros(4, "w")})


@case("NotCopyableError", r"cannot copy or pickle graph #\d+", r"share the graph", check=_graph_still_replays)
def copy_a_graph(c: Ctx) -> None:
    """copy.copy of a graph: the copy would share its executable, and closing one would leave the
    other replaying a destroyed graph."""
    x = c.zeros(4, "x")
    copy.copy(c.graph(library.add_scalar_op(x.mut(), 1.0)))


@case("NotCopyableError", r"cannot copy or pickle stream", r"dev\.stream\(\)")
def pickle_a_stream(c: Ctx) -> None:
    """pickle.dumps of a stream (to send it to another process)."""
    pickle.dumps(c.stream)


@case("NotCopyableError", r"cannot copy or pickle a GraphCache", r"share the cache")
def deepcopy_a_graph_cache(c: Ctx) -> None:
    """copy.deepcopy of a GraphCache."""
    copy.deepcopy(sg.GraphCache(c.stream, lambda s, key: None))


# -- host backend: a reference that reads or writes out of range ------------------------------------


@case("BoundsError", r"misuse_last", only="host")
def host_reference_index_out_of_range(c: Ctx) -> None:
    """A kernel without touches= whose host reference indexes past its 16-float tensor (n=32)."""
    x = c.zeros(16, "x")
    c.stream.run(misuse_last[1, 1](x.mut(), 32))


SCALE_BY_SRC = r"""
extern "C" __global__ void misuse_scale_by(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


@sg.kernel(SCALE_BY_SRC)
def misuse_scale_by(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i32) -> None:
    """out[:n] = a * x[:n] (README's `scale`; no touches=, so only the host reference can catch a bad n)."""


@misuse_scale_by.host
def _misuse_scale_by(out: NDArray, x: NDArray, a: np.float32, n: np.int32) -> None:
    out[:n] = a * x[:n]


def _buf_untouched(c: Ctx, exc: BaseException) -> None:
    np.testing.assert_array_equal(c.tensors[0].numpy(), np.arange(16, dtype=np.float32))


@case("BoundsError", r"misuse_scale_by", r"\[:8\]", r"buf\[0:4\]", only="host", check=_buf_untouched)
def host_reference_slices_past_its_views(c: Ctx) -> None:
    """n=8 on the 4-float views buf[0:4] and buf[8:12]: on a GPU the kernel writes buf[4:8] (outside
    the borrow) and reads buf[12:16]; numpy's slices would clip to the views and succeed silently."""
    buf = c.arange(16, "buf")
    c.stream.run(misuse_scale_by[1, 32](buf[0:4].mut(), buf[8:12], 2.0, 8))


def test_host_views_refuse_slices_past_their_ends() -> None:
    """What a host reference gets (the host backend's HostView): numpy's meaning for every index,
    except that a slice reaching past the end of its axis is an IndexError, not a clipped view."""
    from scopegraph._backends._host import HostView

    a = np.arange(12, dtype=np.float32).view(HostView)
    m = a.reshape(3, 4)
    assert type(m) is HostView and type(a[2:5]) is HostView  # views stay strict
    # in range, and numpy's own meanings: negative indices and starts, empty slices at the end, masks
    assert a[:12].shape == (12,) and a[12:].shape == (0,) and a[-12:].shape == (12,) and a[-1] == 11
    assert a[11::-1].shape == (12,) and a[np.int32(2) : np.int64(5)].tolist() == [2.0, 3.0, 4.0]
    assert m[1:3, :4].shape == (2, 4) and m[..., :4].shape == (3, 4) and m[None, :3].shape == (1, 3, 4)
    assert m[np.array([True, False, True]), :4].shape == (2, 4)
    refused: list[Callable[[], object]] = [
        lambda: a[:13],
        lambda: a[13:],
        lambda: a[12::-1],
        lambda: a[:: np.int32(1)][: np.int32(20)],
        lambda: m[:, :5],
        lambda: m[..., :5],
        lambda: m[:4],
        lambda: m[None, :, :5],
        lambda: a[2:][:11],  # a view of a view is checked against its own end
        lambda: a[-13:],  # the last 13 of 12: before the start
    ]
    for bad in refused:
        with pytest.raises(IndexError, match="reaches past axis"):
            bad()
    with pytest.raises(IndexError, match="reaches past axis 0"):
        a[:13] = 1.0
    with pytest.raises(IndexError):
        a[12]  # numpy's own check
    # numpy's operations work; what they compute is a plain array, an `out=` view stays itself
    assert type(a * 2) is np.ndarray and type(m @ np.ones(4, np.float32)) is np.ndarray
    assert type(a.sum()) is np.float32 and type(np.mean(m, axis=1)) is np.ndarray
    flat = a.reshape(-1)[:4]
    flat += 1
    assert type(flat) is HostView and a[:5].tolist() == [1.0, 2.0, 3.0, 4.0, 4.0]
    # .flat stays numpy's: numpy's own functions slice it past the end (and get it clipped)
    wide = np.zeros((3, 5), np.float32).view(HostView)
    np.fill_diagonal(wide, 1.0)
    assert wide.trace() == 3.0


# -- GPU only: foreign wrappers from torch and cupy, mixing devices ---------------------------------


@cuda_case("BorrowError", r"memcpy", needs=("torch",))
def torch_two_wrappers_in_one_memcpy(c: Ctx) -> None:
    """Two sg.Tensor.from_dlpack wrappers of one torch tensor in one memcpy."""
    import torch

    t = torch.arange(16, dtype=torch.float32, device="cuda")
    c.keep.append(t)
    a, b = c.track(sg.Tensor.from_dlpack(t, name="a")), c.track(sg.Tensor.from_dlpack(t, name="b"))
    sg.memcpy(a.mut(), b)


@cuda_case("BorrowError", r"misuse_scale", needs=("torch",))
def torch_overlapping_views_in_one_kernel(c: Ctx) -> None:
    """Wrappers of t[0:8] and t[4:12] of one torch tensor, in one recorded kernel."""
    import torch

    t = torch.arange(16, dtype=torch.float32, device="cuda")
    c.keep.append(t)
    a, b = c.track(sg.Tensor.from_dlpack(t[0:8], name="a")), c.track(sg.Tensor.from_dlpack(t[4:12], name="b"))
    with c.scope() as s:
        s.record(misuse_scale[1, 8](a.mut(), b, 8))


@cuda_case("BorrowError", r"memcpy", needs=("torch",))
def torch_round_trip_of_an_sg_tensor(c: Ctx) -> None:
    """An sg tensor, handed to torch and wrapped back: the same memory in one memcpy."""
    import torch

    x = c.arange(16, "x")
    t = torch.from_dlpack(x)
    c.keep.append(t)
    back = c.track(sg.Tensor.from_dlpack(t, name="back"))
    sg.memcpy(x.mut(), back)


@cuda_case("BorrowError", r"frozen", needs=("torch",))
def torch_frozen_then_written_through_another_wrapper(c: Ctx) -> None:
    """torch memory frozen through one wrapper, written through a second wrapper in a scope."""
    import torch

    t = torch.ones(16, dtype=torch.float32, device="cuda")
    c.keep.append(t)
    c.track(sg.Tensor.from_dlpack(t, name="a")).freeze()
    b = c.track(sg.Tensor.from_dlpack(t, name="b"))
    with c.scope() as s:
        s.record(library.fill_op(b.mut(), 0.0))


@cuda_case("BorrowError", r"`b`", r"frozen", needs=("torch",))
def torch_frozen_through_a_wrapper_since_dropped(c: Ctx) -> None:
    """torch memory frozen through wrapper `a`, `a` dropped, written through wrapper `b` made before."""
    import torch

    t = torch.ones(16, dtype=torch.float32, device="cuda")
    c.keep.append(t)
    a = sg.Tensor.from_dlpack(t, name="a").freeze()  # not tracked: the case drops it
    b = c.track(sg.Tensor.from_dlpack(t, name="b"))
    del a
    gc.collect()
    with c.scope() as s:
        s.record(library.fill_op(b.mut(), 0.0))


@cuda_case("BorrowError", r"memcpy", needs=("cupy",))
def cupy_two_wrappers_in_one_memcpy(c: Ctx) -> None:
    """Two wrappers of one cupy array in one memcpy."""
    import cupy

    arr = cupy.arange(16, dtype=cupy.float32)
    c.keep.append(arr)
    a, b = c.track(sg.Tensor.from_dlpack(arr, name="a")), c.track(sg.Tensor.from_dlpack(arr, name="b"))
    sg.memcpy(a.mut(), b)


@cuda_case("SignatureError", r"device|host")
def kernel_mixing_host_and_cuda_tensors(c: Ctx) -> None:
    """library.add_op with a CUDA out and a host-backend input."""
    out, b = c.zeros(16, "out"), c.zeros(16, "b")
    host_a = c.track(sg.device("host").zeros((16,), name="host_a"))
    library.add_op(out.mut(), host_a, b)


@cuda_case("SignatureError", r"host", r"cuda")
def record_a_host_op_into_a_cuda_scope(c: Ctx) -> None:
    """A memset of a host-backend tensor recorded on a CUDA stream."""
    x = c.zeros(4, "x")
    host_x = c.track(sg.device("host").zeros((4,), name="host_x"))
    with c.scope() as s:
        s.record(sg.memset(x.mut(), 1.0))
        s.record(sg.memset(host_x.mut(), 1.0))


@cuda_case("SignatureError", r"host", r"cuda")
def launch_a_host_graph_on_a_cuda_stream(c: Ctx) -> None:
    """A graph built on the host backend launched with stream= a CUDA stream."""
    host = sg.device("host")
    host_stream = host.stream()
    c.streams.append(host_stream)
    host_x = c.track(host.zeros((4,), name="host_x"))
    g = c.graph(sg.memset(host_x.mut(), 1.0), stream=host_stream)
    g.launch(stream=c.stream)


@cuda_case("SignatureError", r"cuda:0", r"cuda:1")
def memcpy_between_two_gpus(c: Ctx) -> None:
    """A memcpy from a cuda:1 tensor into a cuda:0 tensor."""
    if cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    x = c.zeros(4, "x")
    y = c.track(sg.device("cuda:1").zeros((4,), name="y"))
    sg.memcpy(x.mut(), y)


@cuda_case("LaunchResourceError", r"misuse_static_shared", r"48128", r"static shared memory")
def dynamic_shared_memory_past_what_static_leaves(c: Ctx) -> None:
    """48 KiB of dynamic shared memory for a kernel with 1 KiB static: within the 48 KiB that
    the launch shape allows, past what the compiled kernel can have (the driver refuses it)."""
    out = c.zeros(256, "out")
    with c.scope() as s:
        s.record(misuse_static_shared[1, 256, 48 * 1024](out.mut()))


@cuda_case("LaunchResourceError", r"misuse_static_shared", r"232448", r"opts in")
def opted_in_shared_memory_past_what_the_gpu_gives(c: Ctx) -> None:
    """227 KiB of dynamic shared memory for a kernel that opts in to it (max_shared_bytes) but has
    1 KiB of static shared memory: within the declaration, past what the GPU gives one block."""
    out = c.zeros(256, "out")
    c.stream.run(misuse_static_shared_opted_in[1, 256, 227 * 1024](out.mut()))


@case("FrozenExportError", r"`w` is frozen", r"copy=False")
def dlpack_default_export_of_a_frozen_tensor(c: Ctx) -> None:
    """A consumer's default DLPack import of frozen weights (torch's would be a writable alias)."""
    w = c.full(16, 1.0, "w").freeze()
    w.__dlpack__(max_version=(1, 0))


@case("SignatureError", r"max_shared_bytes", r"232448")
def shared_memory_past_what_the_declaration_opts_in_to(c: Ctx) -> None:
    """232449 bytes of dynamic shared memory for a kernel that opts in to 227 KiB."""
    out = c.zeros(256, "out")
    misuse_static_shared_opted_in[1, 256, 227 * 1024 + 1](out.mut())


@case("SignatureError", r"max_shared_bytes", r"no GPU")
def declaring_more_shared_memory_than_any_gpu_has(c: Ctx) -> None:
    """A kernel declared with max_shared_bytes of 256 KiB (no GPU gives a block that much)."""
    sg.kernel(STATIC_SHARED_SRC, max_shared_bytes=256 * 1024)(misuse_static_shared.__wrapped__)


@case("SignatureError", r"`matvec` cannot run as", r"32 to 512 of them, not 1024")
def block_past_the_kernels_launch_bounds(c: Ctx) -> None:
    """library.matvec (__launch_bounds__(512, 2), which its launch_check states) with 1024 threads
    a block: refused on every backend when the op is built (the kernel's own LaunchResourceError
    on a GPU would come only when it runs; tests/test_cuda.py has that one)."""
    out, x, w = c.zeros(8, "out"), c.zeros(16, "x"), c.zeros((8, 16), "w")
    c.stream.run(library.matvec[1, 1024](out.mut(), x, w, 8, 16))


# -- the runners -----------------------------------------------------------------------------------


def test_the_catalogue_has_at_least_40_cases() -> None:
    ids = [c.id for c in MISUSE.cases + CUDA_MISUSE.cases]
    assert len(ids) == len(set(ids))
    assert len(MISUSE.cases) >= 40
    assert all(c.what for c in MISUSE.cases + CUDA_MISUSE.cases)


# -- the checker can fail: each of these breaks one rule, and run_case must notice -----------------

LEAKED: list[sg.CudaGraph] = []


def _no_help(c: Ctx) -> None:
    raise sg.SignatureError("bad input without a hint")


def _subclass(c: Ctx) -> None:
    raise sg.NoHostReferenceError("a subclass\nhelp: expect the subclass")


def _builds(c: Ctx) -> None:
    x = c.zeros(4, "x")
    with CudaGraph.scope(c.stream) as s:
        s.record(sg.memset(x.mut(), 1.0))
    LEAKED.append(s.graph)
    raise sg.SignatureError("after a build\nhelp: none")


def _pins(c: Ctx) -> None:
    x = c.zeros(4, "x")
    LEAKED.append(c.graph(sg.memset(x.mut(), 1.0)))
    c.graphs.clear()  # hide it from the checker, which would close it
    raise sg.SignatureError("leaves a pin\nhelp: none")


def _wrong_message(c: Ctx) -> None:
    raise sg.SignatureError("something else\nhelp: none")


@pytest.mark.parametrize(
    "broken, complaint",
    [
        (Case("no_help", "", "SignatureError", (), _no_help), "help:"),
        (Case("subclass", "", "SignatureError", (), _subclass), "expected exactly SignatureError"),
        (Case("builds", "", "SignatureError", (), _builds), "built 1 graph"),
        (Case("pins", "", "SignatureError", (), _pins), "still pinned"),
        (Case("message", "", "SignatureError", (r"the right words",), _wrong_message), "not found in the message"),
    ],
    ids=["no_help", "subclass", "builds", "pins", "message"],
)
def test_the_checker_catches_a_broken_case(broken: Case, complaint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = sg.device("host")
    try:
        with pytest.raises(AssertionError, match=complaint):
            run_case(broken, dev, dev.stream(), monkeypatch)
    finally:
        for g in LEAKED:
            g.close()
        LEAKED.clear()


@pytest.mark.parametrize("case", MISUSE.params())
def test_misuse(case: Case, sg_device: sg.Device, sg_stream: sg.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    run_case(case, sg_device, sg_stream, monkeypatch)


@pytest.mark.sg_cuda
@pytest.mark.parametrize("case", CUDA_MISUSE.params())
def test_misuse_cuda(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = sg.device("cuda")
    stream = dev.stream()
    try:
        run_case(case, dev, stream, monkeypatch)
    finally:
        stream.sync()


def test_a_copy_of_a_stream_or_a_device_is_itself(sg_device: sg.Device, sg_stream: sg.Stream) -> None:
    """One Stream per CUDA stream and one Device per device (a second wrapper of a recording stream
    would take eager work unrefused): copies return the object itself, as a deep copy of a model
    holding them needs; pickling them is refused (see the cases above)."""
    for obj in (sg_device, sg_stream):
        assert copy.copy(obj) is obj and copy.deepcopy([obj])[0] is obj
