"""Stock kernels: fill, add, axpy, add_scalar, noop, rms_norm and matvec, each with a numpy reference.

The kernels are plain ``@sg.kernel`` declarations over ``kernels/library.cu``; launch them
directly (``add[grid, block](out.mut(), a, b, n)``) or through the ``*_op`` helpers, which pick
the grid and block from the tensors' shapes. Every kernel declares what it touches
(``touches=``), so a launch whose sizes reach past a tensor is a SignatureError when it is built,
however it is launched:

    s.record(library.matvec_op(q.mut(), norm, wq))
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

import numpy as np

from . import _dtypes as dt
from ._errors import SignatureError
from ._kernel import KernelLaunch, TensorSpec, kernel
from ._ops import borrowed_tensor
from ._tensor import Mut, Tensor

SOURCE = resources.files(__package__).joinpath("kernels/library.cu").read_text()

F32 = Annotated[Tensor, TensorSpec(dt.float32)]
MutF32 = Annotated[Mut[Tensor], TensorSpec(dt.float32)]
F32Matrix = Annotated[Tensor, TensorSpec(dt.float32, rank=2)]

NDArray = np.ndarray[Any, np.dtype[Any]]

ELEMENTWISE_BLOCK = 256
MATVEC_WARPS = 4


@kernel(SOURCE, touches={"out": "n"})
def fill(out: MutF32, value: dt.f32, n: dt.i32) -> None:
    """out[:n] = value"""


@kernel(SOURCE, touches={"out": "n", "a": "n", "b": "n"})
def add(out: MutF32, a: F32, b: F32, n: dt.i32) -> None:
    """out[:n] = a[:n] + b[:n]"""


@kernel(SOURCE, touches={"out": "n", "x": "n"})
def axpy(out: MutF32, x: F32, a: dt.f32, n: dt.i32) -> None:
    """out[:n] += a * x[:n]"""


@kernel(SOURCE, touches={"out": "n"})
def add_scalar(out: MutF32, value: dt.f32, n: dt.i32) -> None:
    """out[:n] += value"""


@kernel(SOURCE)
def noop() -> None:
    """Nothing: the cost of a node itself."""


@kernel(SOURCE, touches={"out": "grid_x * d", "x": "grid_x * d", "w": "d"})
def rms_norm(out: MutF32, x: F32, w: F32, eps: dt.f32, d: dt.i32) -> None:
    """Each of the grid's rows: out = x * rsqrt(mean(x**2) + eps) * w. Template argument: block size."""


@kernel(SOURCE, touches={"out": "n", "x": "k", "w": "n * k"})
def matvec(out: MutF32, x: F32, w: F32Matrix, n: dt.i32, k: dt.i32) -> None:
    """out[:n] = w[:n, :k] @ x[:k]"""


@fill.host
def _fill(out: NDArray, value: np.float32, n: np.int32) -> None:
    out.reshape(-1)[:n] = value


@add.host
def _add(out: NDArray, a: NDArray, b: NDArray, n: np.int32) -> None:
    np.add(a.reshape(-1)[:n], b.reshape(-1)[:n], out=out.reshape(-1)[:n])


@axpy.host
def _axpy(out: NDArray, x: NDArray, a: np.float32, n: np.int32) -> None:
    flat = out.reshape(-1)[:n]
    flat += a * x.reshape(-1)[:n]


@add_scalar.host
def _add_scalar(out: NDArray, value: np.float32, n: np.int32) -> None:
    flat = out.reshape(-1)[:n]
    flat += value


@noop.host
def _noop() -> None:
    pass


@rms_norm.host
def _rms_norm(out: NDArray, x: NDArray, w: NDArray, eps: np.float32, d: np.int32) -> None:
    rows = x.reshape(-1, d)
    scale = 1.0 / np.sqrt(np.mean(rows * rows, axis=1, dtype=np.float32, keepdims=True) + eps)
    out.reshape(-1, d)[...] = rows * scale.astype(np.float32) * w.reshape(-1)[:d]


@matvec.host
def _matvec(out: NDArray, x: NDArray, w: NDArray, n: np.int32, k: np.int32) -> None:
    out.reshape(-1)[:n] = w[:n, :k] @ x.reshape(-1)[:k]


def _blocks(n: int, per_block: int) -> int:
    return max(1, -(-n // per_block))


def _written(out: Mut[Tensor], helper: str) -> Tensor:
    """The tensor a helper's ``out`` borrows mutably (a SignatureError if it is not a ``Mut``)."""
    return borrowed_tensor(out, True, helper, "out")


def fill_op(out: Mut[Tensor], value: float) -> KernelLaunch:
    n = _written(out, "fill_op").size
    return fill[_blocks(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK](out, value, n)


def add_op(out: Mut[Tensor], a: Tensor, b: Tensor) -> KernelLaunch:
    n = _written(out, "add_op").size
    return add[_blocks(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK](out, a, b, n)


def axpy_op(out: Mut[Tensor], x: Tensor, a: float) -> KernelLaunch:
    n = _written(out, "axpy_op").size
    return axpy[_blocks(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK](out, x, a, n)


def add_scalar_op(out: Mut[Tensor], value: float) -> KernelLaunch:
    n = _written(out, "add_scalar_op").size
    return add_scalar[_blocks(n, ELEMENTWISE_BLOCK), ELEMENTWISE_BLOCK](out, value, n)


def rms_norm_block(d: int) -> int:
    """Threads per row: about two elements each, a multiple of 32, at most 1024."""
    return min(1024, max(32, -(-d // 64) * 32))


def rms_norm_op(out: Mut[Tensor], x: Tensor, w: Tensor, eps: float) -> KernelLaunch:
    """Normalise each row of ``x`` (its last dimension is the model width)."""
    d = borrowed_tensor(x, False, "rms_norm_op", "x").shape[-1] if x.shape else 0
    if d == 0:
        raise SignatureError(f"rms_norm_op needs rows of at least one element; `x` has shape {x.shape}\nhelp: pass x of shape (rows, d)")
    block = rms_norm_block(d)
    return rms_norm.generics(block)[x.size // d, block](out, x, w, eps, d)


def matvec_op(out: Mut[Tensor], x: Tensor, w: Tensor) -> KernelLaunch:
    """``out = w @ x`` for ``w`` of shape (n, k)."""
    if borrowed_tensor(w, False, "matvec_op", "w").ndim != 2:
        raise SignatureError(f"matvec_op needs a matrix `w`; `{w.name}` has shape {w.shape}\nhelp: view it as (n, k)")
    n, k = w.shape
    return matvec[_blocks(n, MATVEC_WARPS), 32 * MATVEC_WARPS](out, x, w, n, k)


ALL_KERNELS = (fill, add, axpy, add_scalar, noop, rms_norm.generics(rms_norm_block(2048)), matvec)
