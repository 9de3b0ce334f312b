import numpy as np

import scopegraph as sg
from scopegraph import CudaGraph, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))

with CudaGraph.scope(stream) as s:
    s.record(sg.zeros((4,), sg.f32))  # E: arg-type
    s.record(sg.dup(x))  # E: arg-type
    s.record(sg.from_numpy(np.zeros(4, np.float32)))  # E: arg-type
    s.record("memcpy")  # E: arg-type
    s.record(stream.run(sg.memcpy(y.mut(), x)))  # E: arg-type
    s.record(library.axpy[1, 16](y, x, 2.0, 16))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x.mut(), 2.0, 16))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x, 2.0))  # E: call-arg
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, 16, 1))  # E: call-arg
    s.record(library.axpy[1, 16](y.mut(), x, "2.0", 16))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, 16.0))  # E: arg-type
    s.record(library.axpy[1, 16](y.mut(), x, 2.0, m=16))  # E: call-arg
    s.record(sg.memcpy(y, x))  # E: arg-type
    s.record(sg.memcpy(y.mut(), x.mut()))  # E: arg-type

t: sg.Tensor = stream.run(sg.memcpy(y.mut(), x))  # E: assignment
n: int = stream.run(sg.zeros((4,)))  # E: assignment
m: sg.Mut[sg.Tensor] = x  # E: assignment
