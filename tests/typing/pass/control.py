import scopegraph as sg
from scopegraph import CudaGraph, library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
flag = dev.zeros((1,), sg.i32)

with CudaGraph.scope(stream) as s:
    with s.while_(flag, max_iterations=10) as body:
        b: sg.Body = body
        node: sg.RecordedNode = body.record(library.axpy[1, 16](y.mut(), x, 2.0, 16))
        body.record(library.count_down_op(flag.mut()))
        with body.while_(flag) as inner:
            inner.record(sg.memcpy(x.mut(), y))
        with body.if_(flag) as then:
            then.record(sg.memset(y.mut(), 0.0))
    with s.if_else(flag) as (then, otherwise):
        then.record(library.add[1, 16](y.mut(), x, x, 16))
        otherwise.record(library.add[1, 16](x.mut(), y, y, 16))
    nodes: tuple[sg.RecordedNode, ...] = body.nodes

loop = s.graph.nodes[0].op
if isinstance(loop, sg.While):
    bound: int | None = loop.max_iterations
    inner_nodes: tuple[sg.RecordedNode, ...] = loop.body.nodes
try:
    s.graph.launch()
except sg.LoopLimitError as exc:
    err: sg.ScopeGraphError = exc
