import scopegraph as sg
from scopegraph import CudaGraph, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
flag = dev.zeros((1,), sg.i32)

with CudaGraph.scope(stream) as s:
    with s.while_(flag, max_iterations=10) as body:
        body.record(library.add[1, 16](y.mut(), y, x, 16))  # E: scopegraph-borrow
        body.record(sg.memcpy(x.mut(), x))  # E: scopegraph-borrow
        body.record(sg.zeros((4,)))  # E: arg-type
        body.record(library.axpy[1, 16](y, x, 2.0, 16))  # E: arg-type
        with body.if_(flag) as then:
            then.record(library.axpy[1, 16](x.mut(), x, 1.0, 16))  # E: scopegraph-borrow
    with s.while_(flag.mut()) as body:  # E: arg-type
        pass
    with s.while_(flag, max_iterations="3") as body:  # E: arg-type
        pass
    with s.if_else(flag) as (then, otherwise):
        then.record(sg.memset(y.mut(), 0.0))
        otherwise.record(sg.dup(y))  # E: arg-type
    with s.if_(flag) as (a, b):  # E: misc
        pass
