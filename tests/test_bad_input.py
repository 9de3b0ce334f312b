"""Bad input found by a review against DESIGN.md: each test reproduced a foreign exception or a
silent overflow on the host backend before its fix, and now checks the ScopeGraphError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph


def test_zero_step_row_slice_raises_scopegraph_error() -> None:
    """DESIGN.md section 1: "No other exception type escapes the public API for bad input".
    ``t[::0]`` lets Python's ValueError from ``slice.indices`` escape from Tensor.__getitem__."""
    x = sg.device("host").zeros((8,))
    with pytest.raises(sg.ScopeGraphError, match="help"):
        x[::0]


def test_non_int_slice_bounds_raise_scopegraph_error() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``t["a":"b"]`` lets a raw
    TypeError from ``slice.indices`` escape from Tensor.__getitem__."""
    x = sg.device("host").zeros((8,))
    bad: Any = slice("a", "b")
    with pytest.raises(sg.ScopeGraphError, match="help"):
        x[bad]


def test_empty_with_overflowing_shape_is_refused() -> None:
    """DESIGN.md section 2: "A borrow claims exactly the tensor's bytes". Device.empty computes the
    byte size with ``np.prod(..., dtype=int64)``, which wraps: (2**32, 2**32) f32 allocates 0 bytes
    while the Tensor claims 2**66, and nothing refuses it."""
    dev = sg.device("host")
    with pytest.raises(sg.ScopeGraphError):
        t = dev.empty((2**32, 2**32), sg.f32)
        assert t.nbytes == t.allocation.nbytes  # pragma: no cover - reached only on the bug


def test_too_large_allocation_raises_scopegraph_error() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``dev.zeros((2**62,))`` lets
    numpy's ValueError ("Maximum allowed dimension exceeded") escape; ``dev.zeros((2**40, 2**40))``
    a ValueError from reshape."""
    dev = sg.device("host")
    with pytest.raises(sg.ScopeGraphError):
        dev.zeros((2**62,))
    with pytest.raises(sg.ScopeGraphError):
        dev.zeros((2**40, 2**40))


def test_device_with_non_string_spec_raises_scopegraph_error() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``sg.device(3)`` raises
    AttributeError ('int' object has no attribute 'strip')."""
    bad: Any = 3
    with pytest.raises(sg.ScopeGraphError, match="help"):
        sg.device(bad)


def test_scope_with_unhashable_order_raises_scopegraph_error() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``CudaGraph.scope(stream,
    order=[])`` raises TypeError (unhashable type) from the ORDERS lookup instead of the
    SignatureError that ``order=3`` gets."""
    stream = sg.device("host").stream()
    bad: Any = []
    with pytest.raises(sg.ScopeGraphError, match="help"):
        CudaGraph.scope(stream, order=bad)


def test_from_numpy_with_non_stream_raises_scopegraph_error() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``dev.from_numpy(arr, stream=3)``
    raises AttributeError ('int' object has no attribute 'recording')."""
    dev = sg.device("host")
    bad: Any = 3
    with pytest.raises(sg.ScopeGraphError, match="help"):
        dev.from_numpy(np.zeros(3, np.float32), stream=bad)


def test_write_to_read_only_foreign_array_is_refused_before_launch() -> None:
    """DESIGN.md sections 1 and 2: errors are ScopeGraphErrors, raised at record time and always
    before instantiation. A read-only numpy array wraps (sg.Tensor.from_dlpack) as a writable
    tensor; a memset into it records and instantiates, then the replay raises numpy's ValueError
    ("assignment destination is read-only") from graph.launch()."""
    dev = sg.device("host")
    stream = dev.stream()
    read_only = np.frombuffer(bytes(16), np.float32)
    with pytest.raises(sg.ScopeGraphError):
        w = sg.Tensor.from_dlpack(read_only)
        with CudaGraph.scope(stream) as s:
            s.record(sg.memset(w.mut(), 1.0))
        s.graph.launch()  # the bug: a raw ValueError here, after instantiation


@sg.kernel("", touches={"out": "n // k"})
def _chunks(out: sg.Mut[sg.Tensor], n: sg.i32, k: sg.i32) -> None:
    """Touches n // k elements of out."""


@_chunks.host
def _chunks_host(out: Any, n: Any, k: Any) -> None:
    pass


def test_a_declared_size_dividing_by_zero_is_a_signature_error() -> None:
    """A touches expression ``n // k`` with k = 0 let ZeroDivisionError escape, when the op was
    built and when a graph parameter took the value 0 at launch."""
    dev = sg.device("host")
    x = dev.zeros((16,))
    with pytest.raises(sg.SignatureError, match="divides by zero") as built:
        _chunks[1, 1](x.mut(), 16, 0)
    assert "help:" in str(built.value) and "k=0" in str(built.value)
    stream = dev.stream()
    k = sg.Param("k", sg.i32, 1)
    with CudaGraph.scope(stream) as s:
        s.record(_chunks[1, 1](x.mut(), 16, k))
    with s.graph as g, pytest.raises(sg.SignatureError, match="divides by zero"):
        g.launch(k=0)


def test_a_scalar_named_like_a_launch_size_is_refused_with_touches() -> None:
    """A scalar parameter named ``grid_x`` made the compiled touches function a SyntaxError
    (a duplicate argument) when the kernel was declared."""
    with pytest.raises(sg.SignatureError, match="grid_x") as refused:

        @sg.kernel("", touches={"out": "grid_x"})
        def clash(out: sg.Mut[sg.Tensor], grid_x: sg.i32) -> None: ...

    assert "help:" in str(refused.value)
