"""The same forms as fail/plugin_forms.py with nothing wrong: disjoint places, exact scalars."""

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar, overload

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
bufs = [dev.zeros((16,)) for _ in range(3)]


@sg.kernel("")
def swap(a: Mut[Tensor], b: Mut[Tensor]) -> None: ...


@overload
def copy_or_fill(out: Mut[Tensor], src: Tensor) -> sg.Memcpy: ...
@overload
def copy_or_fill(out: Mut[Tensor], src: float) -> sg.Memset: ...
def copy_or_fill(out: Mut[Tensor], src: Tensor | float) -> sg.Memcpy | sg.Memset:
    return sg.memcpy(out, src) if isinstance(src, Tensor) else sg.memset(out, src)


@functools.cache
def cached(out: Mut[Tensor], src: Tensor) -> sg.Memcpy:
    return sg.memcpy(out, src)


@functools.cache
def size_of(t: Tensor) -> int:  # a cached function that builds no node is left alone
    return t.size


def through(make: Callable[[Mut[Tensor], Tensor], sg.GraphNode]) -> None:
    stream.run(make(y.mut(), x))


def some_launch() -> sg.Kernel[[Mut[Tensor], Tensor, float, int]]:
    return library.axpy


with CudaGraph.scope(stream) as s:
    s.record(copy_or_fill(y.mut(), x))
    s.record(copy_or_fill(y.mut(), 1.0))
    s.record(cached(y.mut(), x))
    s.record(swap[1, 1](bufs[-1].mut(), bufs[0].mut()))
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, 16))
    s.record(library.axpy[1, 16](y.mut(), x, 2, n=16))  # an int for a float scalar is exact
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, int(True)))
    s.record(some_launch()[1, 16](y.mut(), x, 2.0, 16))

launch = library.axpy[1, 16] if size_of(x) else library.axpy[2, 16]
launch(y.mut(), x, 1.0, 16)
kernels = {"axpy": library.axpy}
kernels["axpy"][1, 16](y.mut(), x, 1.0, 16)
# One variable may hold launchers of several kernels of one signature.
scalar_op = library.fill[1, 16]
scalar_op = library.add_scalar[1, 16]
ops = [library.fill[1, 16], library.add_scalar[1, 16]]
ops.append(library.fill[2, 16])
scalar_op(y.mut(), 1.0, 16)
# A graph parameter stands wherever a scalar does, in the library's helpers too.
eps = sg.Param("eps", sg.f32, 1e-5)
with CudaGraph.scope(stream) as s:
    s.record(library.rms_norm_op(y.mut(), x, x, eps))
    s.record(library.axpy_op(y.mut(), x, eps))
    s.record(library.fill_op(y.mut(), eps))
    # The dtype makes the kind: an int default for an sg.f32 parameter, and an sg.i32 one's count.
    s.record(library.axpy[1, 16](y.mut(), x, sg.Param("a", sg.f32, 2), sg.Param("n", sg.i32, 16)))

# Generic helpers over ops, and over anything else.
T = TypeVar("T")
P = ParamSpec("P")


def call(f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return f(*args, **kwargs)


def like(model: Tensor, f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return f(*args, **kwargs)


stream.run(call(sg.memcpy, y.mut(), x))
stream.run(like(y, sg.memcpy, y.mut(), x))  # `model` does not reach the op
print(call(len, [x, x]), call(max, x.size, x.size))
stream.run(library.axpy_op(y.mut(), x, 2))  # an int for a float scalar is exact
print(library.rms_norm_block(256), library.AXPY_BLOCK)
