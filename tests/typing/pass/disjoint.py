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


with CudaGraph.scope(stream) as s:
    s.record(library.add[1, 16](y.mut(), x, x, 16))  # two shared borrows of one place
    s.record(library.axpy[1, 16](layer.a.mut(), layer.b, 1.0, 16))
    s.record(library.axpy[1, 16](bufs[0].mut(), bufs[1], 1.0, 16))
    s.record(swap[1, 1](bufs[0].mut(), bufs[1].mut()))
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
