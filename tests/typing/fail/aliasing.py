from dataclasses import dataclass

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
bufs = [dev.zeros((16,)) for _ in range(2)]
by_name = {"y": dev.zeros((16,))}


@dataclass
class Layer:
    w: Tensor
    out: Tensor


@dataclass
class Buffers:
    norm: Tensor


layer = Layer(dev.zeros((16,)), dev.zeros((16,)))


@sg.kernel("")
def swap(a: Mut[Tensor], b: Mut[Tensor]) -> None: ...


@sg.kernel("")
def exchange(a: Mut[Tensor], a_in: Tensor, b: Mut[Tensor], b_in: Tensor) -> None: ...


def my_op(out: Mut[Tensor], src: Tensor) -> sg.Memcpy:
    return sg.memcpy(out, src)


class Model:
    def __init__(self) -> None:
        self.bufs = Buffers(dev.zeros((16,)))

    def record(self, s: sg.Scope) -> None:
        s.record(library.add_op(self.bufs.norm.mut(), self.bufs.norm, x))  # E: scopegraph-borrow
        s.record(library.add[1, 16](self.bufs.norm.mut(), x, self.bufs.norm, 16))  # E: scopegraph-borrow


with CudaGraph.scope(stream) as s:
    s.record(library.add[1, 16](y.mut(), y, x, 16))  # E: scopegraph-borrow
    s.record(library.axpy[1, 16](layer.w.mut(), layer.w, 1.0, 16))  # E: scopegraph-borrow
    s.record(library.axpy[1, 16](bufs[0].mut(), bufs[0], 1.0, 16))  # E: scopegraph-borrow
    s.record(library.axpy[1, 16](by_name["y"].mut(), by_name["y"], 1.0, 16))  # E: scopegraph-borrow
    for i in range(2):
        s.record(library.axpy[1, 16](bufs[i].mut(), bufs[i], 1.0, 16))  # E: scopegraph-borrow
        s.record(sg.memcpy(x[i : i + 8].mut(), y))
        s.record(sg.memcpy(x[0:8].mut(), x[0:8]))  # E: scopegraph-borrow
        s.record(library.axpy[1, 8](x[i:16].mut(), x[i:16], 1.0, 8))  # E: scopegraph-borrow
        with s.capture(writes=[bufs[i].mut()], reads=[bufs[i]], host=lambda a, b: None):  # E: scopegraph-borrow
            pass
    s.record(sg.memcpy(x.mut(), x))  # E: scopegraph-borrow
    s.record(sg.memcpy(sg.mut(y), y))  # E: scopegraph-borrow
    s.record(swap[1, 1](x.mut(), x.mut()))  # E: scopegraph-borrow
    s.record(swap[1, 1](bufs[1].mut(), sg.mut(bufs[1])))  # E: scopegraph-borrow
    s.record(library.rms_norm.generics(128)[1, 128](y.mut(), x, y, 1e-5, 16))  # E: scopegraph-borrow
    s.record(my_op(x.mut(), x))  # E: scopegraph-borrow
    s.record(library.matvec[1, 32](y.mut(), x, w=y, n=16, k=16))  # E: scopegraph-borrow
    s.record(sg.memcpy(src=y, dst=y.mut()))  # E: scopegraph-borrow
    s.record(exchange[1, 1](x.mut(), x, y.mut(), y))  # E: scopegraph-borrow, scopegraph-borrow
    with s.capture(writes=[y.mut()], reads=[y], host=print):  # E: scopegraph-borrow
        pass
    with s.capture(writes=[bufs[0].mut(), bufs[0].mut()], host=print):  # E: scopegraph-borrow
        pass
    with s.while_(dev.zeros((1,), sg.i32)) as body, body.capture(writes=[x.mut()], reads=(x,)):  # E: scopegraph-borrow
        pass

# The Mut constructor and the method through the class are mutable borrows too.
sg.memcpy(sg.Mut(y), y)  # E: scopegraph-borrow
library.add_op(Tensor.mut(y), y, x)  # E: scopegraph-borrow
