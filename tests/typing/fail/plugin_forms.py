"""The forms of graph-node calls the plugin checks besides plain functions, and launches named
through a variable or a container; and a bool where a kernel takes an int or float scalar."""

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar, overload

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
bufs = [dev.zeros((16,)) for _ in range(2)]
flag = True
P = ParamSpec("P")
N = TypeVar("N", bound=sg.GraphNode)
T = TypeVar("T")


@sg.kernel("")
def swap(a: Mut[Tensor], b: Mut[Tensor]) -> None: ...


@overload
def copy_or_fill(out: Mut[Tensor], src: Tensor) -> sg.Memcpy: ...
@overload
def copy_or_fill(out: Mut[Tensor], src: float) -> sg.Memset: ...
def copy_or_fill(out: Mut[Tensor], src: Tensor | float) -> sg.Memcpy | sg.Memset:
    return sg.memcpy(out, src) if isinstance(src, Tensor) else sg.memset(out, src)


def either(out: Mut[Tensor], src: Tensor) -> sg.Memcpy | sg.Memset:
    return sg.memcpy(out, src)


@functools.cache
def cached(out: Mut[Tensor], src: Tensor) -> sg.Memcpy:
    return sg.memcpy(out, src)


def copies(declared: Callable[P, None]) -> Callable[P, sg.Memcpy]:
    """A decorator that makes a node-building function of a declaration (its type says so)."""
    raise NotImplementedError


@copies
def declared_copy(out: Mut[Tensor], src: Tensor) -> None: ...


def through(make: Callable[[Mut[Tensor], Tensor], sg.GraphNode]) -> None:
    def local(out: Mut[Tensor], src: Tensor) -> sg.Memcpy:
        return sg.memcpy(out, src)

    stream.run(make(y.mut(), y))  # E: scopegraph-borrow
    stream.run(local(x.mut(), x))  # E: scopegraph-borrow


with CudaGraph.scope(stream) as s:
    s.record(copy_or_fill(y.mut(), y))  # E: scopegraph-borrow
    s.record(either(y.mut(), y))  # E: scopegraph-borrow
    s.record(cached(y.mut(), y))  # E: scopegraph-borrow
    s.record(declared_copy(y.mut(), y))  # E: scopegraph-borrow
    s.record(swap[1, 1](bufs[-1].mut(), bufs[-1].mut()))  # E: scopegraph-borrow
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, True))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x, flag, 16))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, n=flag))  # E: arg-type

launch = library.axpy[1, 16]
launch(y.mut(), x, 1.0)  # E: call-arg
launch(y.mut(), y, 1.0, 16)  # E: scopegraph-borrow
kernels = {"axpy": library.axpy}
kernels["axpy"][1, 16](y.mut(), x, 1.0)  # E: call-arg


def some_kernel() -> sg.Kernel[[Mut[Tensor], Tensor, float, int]]:
    return library.axpy


some_kernel()[1, 16](y.mut(), x, 1.0)  # E: call-arg


# Generic helpers: the call's own type says it builds an op.
def make(f: Callable[P, N], *args: P.args, **kwargs: P.kwargs) -> N:
    return f(*args, **kwargs)


def call(f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return f(*args, **kwargs)


def like(model: Tensor, f: Callable[P, N], *args: P.args, **kwargs: P.kwargs) -> N:
    return f(*args, **kwargs)


stream.run(make(sg.memcpy, x.mut(), x))  # E: scopegraph-borrow
stream.run(like(y, sg.memcpy, dst=x.mut(), src=x))  # E: scopegraph-borrow
stream.run(call(sg.memcpy, y.mut(), y))  # E: scopegraph-borrow
stream.run(call(library.add_op, bufs[1].mut(), x, bufs[1]))  # E: scopegraph-borrow

# A bool where a library helper takes a scalar (it becomes a kernel scalar).
stream.run(library.axpy_op(y.mut(), x, flag))  # E: arg-type
stream.run(library.fill_op(y.mut(), value=False))  # E: arg-type

# A parameter's dtype makes its kind: sg.i32 where the kernel takes an sg.f32 is refused at run time,
# and so here (mypy would promote the int otherwise), and the reverse.
library.axpy[1, 16](y.mut(), x, sg.Param("a", sg.i32, 2), 16)  # E: arg-type
library.axpy[1, 16](y.mut(), x, 2.0, sg.Param("n", sg.f32, 16.0))  # E: arg-type

# numpy scalars pass where a launch converts them (pass/numpy_scalars.py), but not every one: a
# numpy float for an int is an error as a float is (a launch takes one only with an integral
# value), and numpy's bool is no number (a launch refuses it).
library.axpy[1, 16](y.mut(), x, 2.0, np.float32(16))  # E: arg-type
library.axpy[1, 16](y.mut(), x, np.bool_(True), 16)  # E: arg-type
library.axpy_op(y.mut(), x, np.bool_(True))  # E: arg-type
