"""Stock kernels: fill, add, axpy, add_scalar, noop, rms_norm, matvec, matvec_add, rms_norm_matvec,
count_down and append_row, each with a numpy reference.

The kernels are plain ``@sg.kernel`` declarations over ``kernels/library.cu``; launch them
directly (``add[grid, block](out.mut(), a, b, n)``) or through the ``*_op`` helpers, which pick
the grid and block from the tensors' shapes. Every kernel declares what it touches
(``touches=``), so a launch whose sizes reach past a tensor is a SignatureError when it is built,
however it is launched:

    s.record(library.matvec_op(q.mut(), norm, wq))

Most are written for programmatic dependent launch and declared ``pdl=True`` (the weights they
load before ``griddepcontrol.wait`` in ``reads_before_wait``): in a graph on an sm_90+ GPU they
start while the kernel before them finishes. ``kernels/library.cu`` explains the pattern; its
kernels are meant to be read as examples of it.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

import numpy as np

from . import _dtypes as dt
from ._errors import SignatureError, diagnostic
from ._kernel import KernelLaunch, TensorSpec, kernel
from ._ops import borrowed_tensor
from ._params import Param
from ._tensor import Mut, Tensor

SOURCE = resources.files(__package__).joinpath("kernels/library.cu").read_text()

F32 = Annotated[Tensor, TensorSpec(dt.float32)]
MutF32 = Annotated[Mut[Tensor], TensorSpec(dt.float32)]
F32Matrix = Annotated[Tensor, TensorSpec(dt.float32, rank=2)]
MutI32 = Annotated[Mut[Tensor], TensorSpec(dt.int32)]

NDArray = np.ndarray[Any, np.dtype[Any]]

ELEMENTWISE_BLOCK = 256
# axpy_op's blocks are larger: in the seed model's 4-kernel form the residual add sits on the
# critical path between two matvecs, and with fewer blocks it finishes sooner (H100, d=2048 x 22:
# +2% tokens/s against 256 threads; d=512 the same within noise; benchmarks/NOTES.md).
AXPY_BLOCK = 512
# matvec family: a block per 8 rows, its threads splitting the columns a float4 each, at most
# 512 threads (its __launch_bounds__; kernels/library.cu says why).
MATVEC_ROWS = 8
MATVEC_MAX_THREADS = 512
MATVEC_MAX_BLOCKS = 2**31 // MATVEC_ROWS


# What the kernels' code assumes of a launch shape, and no driver checks (kernel(launch_check=)):
# the raw kernels are public, and a shape they do not expect computes something else on a GPU
# (or, for a matvec under 32 threads, sums its rows with lanes that do not exist), while the host
# reference would compute the intended result.
Shape = tuple[int, int, int]


def one_dimensional(grid: Shape, block: Shape, template_args: tuple[str, ...]) -> str | None:
    """Indices from blockIdx.x and threadIdx.x only: more blocks or threads in y or z repeat them."""
    if grid[1:] != (1, 1) or block[1:] != (1, 1):
        return "its threads index by x only; grid and block must be one-dimensional"
    return None


def whole_warps(grid: Shape, block: Shape, template_args: tuple[str, ...]) -> str | None:
    """The matvec family: each row's sum is a butterfly of shuffles over whole warps (a partial
    warp would shuffle with lanes that do not exist), at most 512 threads (its __launch_bounds__),
    and at most MATVEC_MAX_BLOCKS blocks (block b's first row, 8 * b, is a C int: past them it
    wraps around to negative rows, out of bounds)."""
    threads = block[0]
    if threads % 32 or not 32 <= threads <= MATVEC_MAX_THREADS:
        return f"a block is whole warps of 32 threads, 32 to {MATVEC_MAX_THREADS} of them, not {threads}"
    if grid[0] > MATVEC_MAX_BLOCKS:
        return f"at most {MATVEC_MAX_BLOCKS} blocks ({MATVEC_ROWS} rows each: every row an int indexes), not {grid[0]}"
    return one_dimensional(grid, block, template_args)


def template_block(grid: Shape, block: Shape, template_args: tuple[str, ...]) -> str | None:
    """rms_norm<BS>: each block's BS threads cover a row; another block size skips or repeats elements."""
    try:
        size = int(template_args[0])
    except ValueError:  # C++ text such as "2 * 128": the compiler's to read
        return one_dimensional(grid, block, template_args)
    if block != (size, 1, 1):
        return f"rms_norm<{size}> runs in blocks of exactly {size} threads"
    return one_dimensional(grid, block, template_args)


@kernel(SOURCE, touches={"out": "n"}, pdl=True, launch_check=one_dimensional)
def fill(out: MutF32, value: dt.f32, n: dt.i32) -> None:
    """out[:n] = value"""


@kernel(SOURCE, touches={"out": "n", "a": "n", "b": "n"}, pdl=True, launch_check=one_dimensional)
def add(out: MutF32, a: F32, b: F32, n: dt.i32) -> None:
    """out[:n] = a[:n] + b[:n]"""


@kernel(SOURCE, touches={"out": "n", "x": "n"}, pdl=True, launch_check=one_dimensional)
def axpy(out: MutF32, x: F32, a: dt.f32, n: dt.i32) -> None:
    """out[:n] += a * x[:n]"""


@kernel(SOURCE, touches={"out": "n"}, pdl=True, launch_check=one_dimensional)
def add_scalar(out: MutF32, value: dt.f32, n: dt.i32) -> None:
    """out[:n] += value"""


@kernel(SOURCE)
def noop() -> None:
    """Nothing: the cost of a node itself."""


@kernel(
    SOURCE,
    touches={"out": "grid_x * d", "x": "grid_x * d", "w": "d"},
    pdl=True,
    reads_before_wait=("w",),
    launch_check=template_block,
)
def rms_norm(out: MutF32, x: F32, w: F32, eps: dt.f32, d: dt.i32) -> None:
    """Each of the grid's rows: out = x * rsqrt(mean(x**2) + eps) * w. Template argument: block size."""


@kernel(
    SOURCE, touches={"out": "n", "x": "k", "w": "n * k"}, pdl=True, reads_before_wait=("w",), launch_check=whole_warps
)
def matvec(out: MutF32, x: F32, w: F32Matrix, n: dt.i32, k: dt.i32) -> None:
    """out[:n] = w[:n, :k] @ x[:k]: 8 rows a block (ceil(n / 8) blocks), blocks of whole warps up to 512 threads."""


@kernel(
    SOURCE, touches={"out": "n", "x": "k", "w": "n * k"}, pdl=True, reads_before_wait=("w",), launch_check=whole_warps
)
def matvec_add(out: MutF32, x: F32, w: F32Matrix, n: dt.i32, k: dt.i32) -> None:
    """out[:n] += w[:n, :k] @ x[:k] (a matvec with the residual add fused in), launched as matvec is."""


@kernel(
    SOURCE,
    touches={"out": "n", "x": "k", "nw": "k", "w": "n * k"},
    pdl=True,
    reads_before_wait=("w",),
    launch_check=whole_warps,
)
def rms_norm_matvec(out: MutF32, x: F32, nw: F32, w: F32Matrix, eps: dt.f32, n: dt.i32, k: dt.i32) -> None:
    """out[:n] = w[:n, :k] @ (x[:k] * nw[:k]) * rsqrt(mean(x[:k]**2) + eps): RMSNorm fused into the matvec
    after it, launched as matvec is."""


@kernel(SOURCE, touches={"flag": "1"}, launch_check=one_dimensional)
def count_down(flag: MutI32) -> None:
    """flag[0] -= 1 (one thread): the counter of a loop ``with s.while_(flag)`` that runs flag times."""


@kernel(SOURCE, touches={"out": "limit * d", "position": "1", "flag": "1", "x": "d"}, launch_check=one_dimensional)
def append_row(out: MutF32, position: MutI32, flag: MutI32, x: F32, d: dt.i32, limit: dt.i32) -> None:
    """out[row, :d] = x[:d] for row = position[0] < limit; then position[0] += 1 and
    flag[0] = position[0] < limit. Launch one block: a decode loop's "emit this token"."""


# The references follow the kernels' pointer arithmetic and grids exactly: the tensors as the flat
# memory the kernel indexes (from each tensor's start, whatever its shape), and only what the
# launch's threads cover. The host backend hands each reference exactly its tensors' views, so an
# access past one is an error there, as it would be an illegal address on a GPU.
Launch = tuple[int, int, int]


def _covered(n: np.int32, grid: Launch, block: Launch) -> int:
    """The elements an elementwise kernel touches: i < n for i = blockIdx.x * blockDim.x + threadIdx.x."""
    threads = grid[0] * block[0]
    return int(n) if n < threads else threads


# The views a reference gets refuse slices past their ends (the host backend's HostView); what is
# cut out of them is within the tensor, and is computed with as a plain array (numpy's ufuncs are
# faster on one).


def _flat_vector(t: NDArray, n: int) -> NDArray:
    """The first ``n`` elements of ``t``'s memory, as a vector (``t`` itself when it is one)."""
    return (t if t.shape == (n,) else t.reshape(-1)[:n]).view(np.ndarray)


def _flat_matrix(t: NDArray, rows: int, cols: int) -> NDArray:
    """The first ``rows * cols`` elements of ``t``'s memory, row-major: what ``t + row * cols``
    indexes (``t`` itself when it has that shape)."""
    return (t if t.shape == (rows, cols) else t.reshape(-1)[: rows * cols].reshape(rows, cols)).view(np.ndarray)


@fill.host
def _fill(out: NDArray, value: np.float32, n: np.int32, *, grid: Launch, block: Launch) -> None:
    _flat_vector(out, _covered(n, grid, block)).fill(value)


@add.host
def _add(out: NDArray, a: NDArray, b: NDArray, n: np.int32, *, grid: Launch, block: Launch) -> None:
    m = _covered(n, grid, block)
    np.add(_flat_vector(a, m), _flat_vector(b, m), out=_flat_vector(out, m))


@axpy.host
def _axpy(out: NDArray, x: NDArray, a: np.float32, n: np.int32, *, grid: Launch, block: Launch) -> None:
    m = _covered(n, grid, block)
    flat = _flat_vector(out, m)
    np.add(flat, a * _flat_vector(x, m), out=flat)


@add_scalar.host
def _add_scalar(out: NDArray, value: np.float32, n: np.int32, *, grid: Launch, block: Launch) -> None:
    flat = _flat_vector(out, _covered(n, grid, block))
    np.add(flat, value, out=flat)


@noop.host
def _noop() -> None:
    pass


@rms_norm.host
def _rms_norm(out: NDArray, x: NDArray, w: NDArray, eps: np.float32, d: np.int32, *, grid: Launch) -> None:
    # One block per row: block b normalises x[b * d : (b + 1) * d] (x and out as flat memory);
    # scale = rsqrtf(sum(row ** 2) / d + eps).
    rows, d_ = grid[0], int(d)
    if d_ == 0:
        return  # no thread writes
    xr = _flat_matrix(x, rows, d_)
    scale = np.float32(1.0) / np.sqrt(np.add.reduce(xr * xr, axis=1, keepdims=True) / np.float32(d_) + eps)
    np.multiply(xr * scale, _flat_vector(w, d_), out=_flat_matrix(out, rows, d_))


def _matvec_rows_covered(n: np.int32, grid: Launch) -> int:
    """The matvec family's block b computes rows 8b .. 8b + 7 (kernels/library.cu): a grid of
    fewer than ceil(n / 8) blocks leaves the rest of out as it was."""
    return min(int(n), MATVEC_ROWS * grid[0])


@matvec.host
def _matvec(out: NDArray, x: NDArray, w: NDArray, n: np.int32, k: np.int32, *, grid: Launch) -> None:
    rows, k_ = _matvec_rows_covered(n, grid), int(k)
    np.matmul(_flat_matrix(w, rows, k_), _flat_vector(x, k_), out=_flat_vector(out, rows))


@matvec_add.host
def _matvec_add(out: NDArray, x: NDArray, w: NDArray, n: np.int32, k: np.int32, *, grid: Launch) -> None:
    rows, k_ = _matvec_rows_covered(n, grid), int(k)
    flat = _flat_vector(out, rows)
    np.add(flat, _flat_matrix(w, rows, k_) @ _flat_vector(x, k_), out=flat)


@rms_norm_matvec.host
def _rms_norm_matvec(
    out: NDArray, x: NDArray, nw: NDArray, w: NDArray, eps: np.float32, n: np.int32, k: np.int32, *, grid: Launch
) -> None:
    rows, k_ = _matvec_rows_covered(n, grid), int(k)
    v = _flat_vector(x, k_)
    # rsqrtf(sum(x ** 2) / k + eps); with k = 0 that is 0 / 0, a NaN, as on the GPU
    mean = np.add.reduce(v * v) / np.float32(k_) if k_ else np.float32(np.nan)
    scale = np.float32(1.0) / np.sqrt(mean + eps)
    np.multiply(_flat_matrix(w, rows, k_) @ (v * _flat_vector(nw, k_)), scale, out=_flat_vector(out, rows))


@count_down.host
def _count_down(flag: NDArray) -> None:
    flag.reshape(-1)[0] -= 1


@append_row.host
def _append_row(out: NDArray, position: NDArray, flag: NDArray, x: NDArray, d: np.int32, limit: np.int32) -> None:
    pos, fl, d_ = position.reshape(-1), flag.reshape(-1), int(d)
    row = int(pos[0])
    if 0 <= row < limit:
        out.reshape(-1)[row * d_ : (row + 1) * d_] = x.reshape(-1)[:d_]
    pos[0] = row + 1
    fl[0] = int(row + 1 < limit)


def _blocks(n: int, per_block: int) -> int:
    return max(1, -(-n // per_block))


def _written(out: Mut[Tensor], helper: str) -> Tensor:
    """The tensor a helper's ``out`` borrows mutably (a SignatureError if it is not a ``Mut``)."""
    return borrowed_tensor(out, True, helper, "out")


# A helper's scalar: a value (numpy's too, as a launch converts them), or an sg.Param a graph can
# change at launch(name=value).
Scalar = float | np.floating[Any] | np.integer[Any] | Param[float]


def _elementwise(out: Mut[Tensor], helper: str, block: int = ELEMENTWISE_BLOCK) -> tuple[int, int]:
    """(elements, blocks) of an elementwise launch over ``out``: one call on the hot path."""
    n = (out.tensor if type(out) is Mut else _written(out, helper)).size
    return n, -(-n // block) or 1


def fill_op(out: Mut[Tensor], value: Scalar) -> KernelLaunch:
    n, grid = _elementwise(out, "fill_op")
    return fill[grid, ELEMENTWISE_BLOCK](out, value, n)


def add_op(out: Mut[Tensor], a: Tensor, b: Tensor) -> KernelLaunch:
    n, grid = _elementwise(out, "add_op")
    # (Anything but a Tensor is the launch's to refuse; a shorter input its size check's too.)
    if type(a) is Tensor and a.size != n:
        raise _size_error("add_op", "a", a, n, "one for each element of `out`")
    if type(b) is Tensor and b.size != n:
        raise _size_error("add_op", "b", b, n, "one for each element of `out`")
    return add[grid, ELEMENTWISE_BLOCK](out, a, b, n)


def axpy_op(out: Mut[Tensor], x: Tensor, a: Scalar) -> KernelLaunch:
    n, grid = _elementwise(out, "axpy_op", AXPY_BLOCK)
    if type(x) is Tensor and x.size != n:
        raise _size_error("axpy_op", "x", x, n, "one for each element of `out`")
    return axpy[grid, AXPY_BLOCK](out, x, a, n)


def add_scalar_op(out: Mut[Tensor], value: Scalar) -> KernelLaunch:
    n, grid = _elementwise(out, "add_scalar_op")
    return add_scalar[grid, ELEMENTWISE_BLOCK](out, value, n)


def rms_norm_block(d: int) -> int:
    """Threads per row: about eight elements each (those it holds in registers; see
    kernels/library.cu), a multiple of 32, at least 128 and at most 1024."""
    return min(1024, max(128, -(-d // 256) * 32))


def rms_norm_op(out: Mut[Tensor], x: Tensor, w: Tensor, eps: Scalar) -> KernelLaunch:
    """Normalise each row of ``x`` (its last dimension is the model width)."""
    rows = borrowed_tensor(x, False, "rms_norm_op", "x")  # a SignatureError for anything but a Tensor
    if not rows.shape:
        raise SignatureError(
            "rms_norm_op normalises rows, but `x` is a scalar (shape ())\nhelp: pass x of shape (d,) or (rows, d)"
        )
    d = rows.shape[-1]
    written = out.tensor if type(out) is Mut else _written(out, "rms_norm_op")
    if written.size != rows.size:
        raise _size_error("rms_norm_op", "out", written, rows.size, f"a row for each row of `x`, shape {rows.shape}")
    weights = w if type(w) is Tensor else borrowed_tensor(w, False, "rms_norm_op", "w")
    if weights.size < d or (weights.size > d and rows.size):  # (an op of no elements reads none of them)
        raise _size_error("rms_norm_op", "w", weights, d, "the norm's weights, one for each element of a row of `x`")
    block = rms_norm_block(d)
    kernel = rms_norm.generics(block)
    if rows.size == 0:  # zero-size ops are no work: one block, rows of no elements
        return kernel[1, block](out, x, w, eps, 0)
    return kernel[rows.size // d, block](out, x, w, eps, d)


def _size_error(helper: str, param: str, got: Tensor, want: int, rule: str) -> SignatureError:
    """``param`` of ``helper`` (the tensor ``got``) must have ``want`` elements, as ``rule`` says."""
    return SignatureError(
        diagnostic(
            f"{helper} needs `{param}` of {want} elements ({rule}); `{got.name}` has shape {got.shape}, "
            f"{got.size} elements",
            help=f"pass `{param}` with {want} elements: slice or view the tensor you meant, or allocate one",
        )
    )


def _matrix(out: Mut[Tensor], x: Tensor, w: Tensor, helper: str) -> tuple[int, int, int, int]:
    """(n, k, grid, block) of a matvec-family launch over ``w`` of shape (n, k): a block per 8
    rows, a thread per float4 of a row (up to 512, one pass over a 2048-wide row); ``out`` must
    have n elements and ``x`` k (the kernels touch no more and no fewer)."""
    if borrowed_tensor(w, False, helper, "w").ndim != 2:
        raise SignatureError(f"{helper} needs a matrix `w`; `{w.name}` has shape {w.shape}\nhelp: view it as (n, k)")
    n, k = w.shape
    written = out.tensor if type(out) is Mut else _written(out, helper)
    if written.size != n:
        raise _size_error(helper, "out", written, n, f"one for each row of `w`, shape {w.shape}")
    read = x if type(x) is Tensor else borrowed_tensor(x, False, helper, "x")
    if read.size != k:
        raise _size_error(helper, "x", read, k, f"one for each column of `w`, shape {w.shape}")
    return n, k, _blocks(n, MATVEC_ROWS), matvec_block(k)


def matvec_block(k: int) -> int:
    """Threads a block for rows of k floats: whole warps, one float4 of the row each, 32 to 512."""
    return min(MATVEC_MAX_THREADS, 32 * max(1, -(-k // 128)))


def matvec_op(out: Mut[Tensor], x: Tensor, w: Tensor) -> KernelLaunch:
    """``out = w @ x`` for ``w`` of shape (n, k)."""
    n, k, grid, block = _matrix(out, x, w, "matvec_op")
    return matvec[grid, block](out, x, w, n, k)


def matvec_add_op(out: Mut[Tensor], x: Tensor, w: Tensor) -> KernelLaunch:
    """``out += w @ x`` for ``w`` of shape (n, k): a matvec and a residual add in one kernel."""
    n, k, grid, block = _matrix(out, x, w, "matvec_add_op")
    return matvec_add[grid, block](out, x, w, n, k)


def rms_norm_matvec_op(out: Mut[Tensor], x: Tensor, nw: Tensor, w: Tensor, eps: Scalar) -> KernelLaunch:
    """``out = w @ rms_norm(x, nw, eps)`` for ``w`` of shape (n, k): the RMSNorm of one row fused
    into the matvec after it."""
    n, k, grid, block = _matrix(out, x, w, "rms_norm_matvec_op")
    if type(nw) is Tensor and nw.size != k:
        raise _size_error("rms_norm_matvec_op", "nw", nw, k, "the norm's weights, one for each element of `x`")
    return rms_norm_matvec[grid, block](out, x, nw, w, eps, n, k)


def count_down_op(flag: Mut[Tensor]) -> KernelLaunch:
    """``flag[0] -= 1``: end a loop body with it to run the loop ``flag`` times."""
    return count_down[1, 1](flag)


def append_row_op(out: Mut[Tensor], position: Mut[Tensor], flag: Mut[Tensor], x: Tensor) -> KernelLaunch:
    """Write ``x`` into row ``position[0]`` of ``out`` (rows, x.size), advance ``position`` and set
    ``flag`` to ``position < rows``: the step that ends each iteration of a decode loop."""
    rows_out = _written(out, "append_row_op")
    d = borrowed_tensor(x, False, "append_row_op", "x").size
    if rows_out.ndim != 2 or rows_out.shape[1] != d:
        raise SignatureError(
            f"append_row_op needs `out` of shape (rows, {d}) for `x` of {d} elements; "
            f"`{rows_out.name}` has shape {rows_out.shape}\n"
            f"help: make out with dev.zeros((tokens, {d}))"
        )
    return append_row[1, min(1024, max(32, -(-d // 32) * 32))](out, position, flag, x, d, rows_out.shape[0])


ALL_KERNELS = (
    fill,
    add,
    axpy,
    add_scalar,
    noop,
    rms_norm.generics(rms_norm_block(2048)),
    matvec,
    matvec_add,
    rms_norm_matvec,
    count_down,
    append_row,
)
