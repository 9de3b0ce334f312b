"""What breaks graphs (seed 001), caught before anything is instantiated.

Each mistake below would corrupt memory or replay stale addresses with a stream-capture API;
scopegraph raises a specific error at the line that makes it, and the stream stays usable.
"""

from __future__ import annotations

from collections.abc import Callable

import scopegraph as sg
from scopegraph import CudaGraph, library


def attempt(title: str, step: Callable[[sg.Scope], object], stream: sg.Stream) -> None:
    try:
        with CudaGraph.scope(stream) as s:
            step(s)
    except sg.ScopeGraphError as err:
        print(f"--- {title}: {type(err).__name__}\n{err}\n")
    else:
        print(f"--- {title}: NOT CAUGHT (the graph was built)\n")


def main() -> None:
    dev = sg.device()
    stream = dev.stream()
    x = dev.zeros((1024,), name="x")
    y = dev.zeros((1024,), name="y")
    weights = dev.zeros((1024,), name="weights").freeze()

    attempt("allocating inside a graph", lambda s: s.record(sg.zeros((1024,))), stream)  # type: ignore[arg-type]
    attempt("aliasing a write with a read", lambda s: s.record(sg.memcpy(x[0:512].mut(), x[256:768])), stream)
    attempt("writing frozen weights", lambda s: s.record(library.fill_op(weights.mut(), 0.0)), stream)
    attempt("eager work on the recording stream", lambda s: stream.run(sg.memset(y.mut(), 1.0)), stream)

    with CudaGraph.scope(stream) as s:
        s.record(library.add_op(y.mut(), x, x))
    try:
        x.free()
    except sg.LifetimeError as err:
        print(f"--- freeing a tensor a live graph uses: LifetimeError\n{err}\n")
    s.graph.close()
    x.free()  # fine now
    print("the stream is still usable:", stream)


if __name__ == "__main__":
    main()
