from dataclasses import dataclass

import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, Mut, Tensor, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
bufs = [dev.zeros((16,)) for _ in range(2)]


@dataclass
class Layer:
    a: Tensor
    b: Tensor


layer = Layer(dev.zeros((16,)), dev.zeros((16,)))


@sg.kernel("")
def swap(a: Mut[Tensor], b: Mut[Tensor]) -> None: ...


@sg.kernel("")
def shifted(a: Mut[Tensor], step: sg.i32, b: Tensor) -> None: ...


with CudaGraph.scope(stream) as s:
    s.record(library.add[1, 16](y.mut(), x, x, 16))  # two shared borrows of one place
    s.record(library.axpy[1, 16](layer.a.mut(), layer.b, 1.0, 16))
    s.record(library.axpy[1, 16](bufs[0].mut(), bufs[1], 1.0, 16))
    s.record(swap[1, 1](bufs[0].mut(), bufs[1].mut()))
    for i in range(1):
        j = i + 1
        s.record(swap[1, 1](bufs[i].mut(), bufs[j].mut()))  # different names: the tracker decides
        s.record(sg.memcpy(x[0:8].mut(), x[8:16]))  # different slices (overlap is the tracker's)
        # A name assigned among the arguments may differ between them: no place (the tracker decides).
        s.record(shifted[1, 1](bufs[i].mut(), (i := i + 1), bufs[i]))
        i = 0
        s.record(shifted[1, 1](bufs[i].mut(), *((i := i + 1),), bufs[i]))  # in *args too
        with s.capture(writes=[bufs[i].mut()], keep=[(i := 0)], reads=[bufs[i]], host=lambda a, b: None):
            pass  # in another keyword too
    s.record(sg.memcpy(x.mut(), y))
    s.record(sg.memset(y.mut(), 0.0))
    s.record(library.axpy[1, 16](out=x.mut(), x=y, a=2, n=16))  # an int where f32 is declared is fine
    s.record(library.rms_norm.generics(128)[1, 128](y.mut(), x, x, 1e-5, 16))
    node: sg.RecordedNode = s.record(library.noop[1, 1]())

graph: CudaGraph = s.graph
graph.launch()
graph.update(sg.memcpy(x.mut(), y))
z: sg.Tensor = stream.run(sg.zeros((4,), sg.f32))
w: sg.Tensor = stream.run(sg.from_numpy(np.ones(4, np.float32)))
stream.run(library.add_op(x.mut(), y, y))
arr: np.ndarray = x.numpy()
with graph:
    pass
