"""Bad input found by a review against DESIGN.md: each test reproduced a foreign exception or a
silent overflow on the host backend before its fix, and now checks the ScopeGraphError."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph

from .helpers import assert_stream_usable, child_env


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


@sg.kernel("")
def _copies(out: sg.Mut[sg.Tensor], x: sg.Tensor) -> None:
    """Declares x read."""


@_copies.host
def _copies_host(out: Any, x: Any) -> None:
    x[:] = out  # the reference writes what the declaration says the kernel only reads


def test_a_host_reference_that_writes_a_read_tensor_is_a_borrow_error_naming_it() -> None:
    """The reference's write to a read-only view was a BoundsError whose help spoke of sizes."""
    dev = sg.device("host")
    out, x = dev.zeros((4,), name="out"), dev.zeros((4,), name="x")
    with pytest.raises(sg.BorrowError, match=r"(?s)wrote a tensor the kernel only reads.*x: x is a Tensor.*\nhelp: if"):
        dev.stream().run(_copies[1, 4](out.mut(), x))
    assert_stream_usable(dev.stream())


@sg.kernel("")
def _models(out: sg.Mut[sg.Tensor], how: sg.i32) -> None:
    """A kernel whose host reference (the user's numpy model of it) has bugs of its own."""


@_models.host
def _models_host(out: Any, how: Any) -> None:
    if how == 0:
        out[:] = out + None  # numpy's TypeError
    elif how == 1:
        out[:] = float("not a number")  # a ValueError that is no access past a view
    elif how == 2:
        out[:] = dict[str, float]()["missing"]
    else:
        out[:] = np.ones(5, np.float32)  # numpy's broadcast error: a shape the reference got wrong


@pytest.mark.parametrize(
    ("how", "error", "message"),
    [
        (0, sg.HostReferenceError, r"raised TypeError: unsupported operand"),
        (1, sg.HostReferenceError, r"raised ValueError: could not convert"),
        (2, sg.HostReferenceError, r"raised KeyError: 'missing'"),
        (-1, sg.BoundsError, r"failed: could not broadcast"),
    ],
    ids=["type", "value", "key", "shape"],
)
def test_a_host_reference_that_fails_on_its_own_is_a_host_reference_error(
    how: int, error: type[sg.ScopeGraphError], message: str
) -> None:
    """A TypeError or KeyError in a reference escaped bare, and a ValueError unrelated to sizes
    became a BoundsError whose help spoke of reading past a tensor; an access past a view (or
    views of shapes that differ) is still a BoundsError."""
    dev = sg.device("host")
    out = dev.zeros((4,), name="out")
    with pytest.raises(error, match=message) as info:
        dev.stream().run(_models[1, 4](out.mut(), how))
    text = str(info.value)
    assert "host reference of `_models`" in text and "out: out (4,)" in text and "\nhelp: " in text, text
    assert info.value.__cause__ is not None
    assert_stream_usable(dev.stream())


def _raising_check(grid: Any, block: Any, template_args: Any) -> str | None:
    raise RuntimeError("the check itself is broken")


@sg.kernel("", launch_check=_raising_check)
def _checked(out: sg.Mut[sg.Tensor]) -> None:
    """A kernel whose launch_check raises instead of returning its reason."""


def test_a_launch_check_that_raises_is_a_signature_error() -> None:
    with pytest.raises(sg.SignatureError, match=r"launch_check of `_checked` raised RuntimeError") as info:
        _checked[1, 32]
    assert isinstance(info.value.__cause__, RuntimeError) and "\nhelp: " in str(info.value)


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


def _refused(error: type[sg.ScopeGraphError], call: Any, match: str = "") -> str:
    """``call()`` raises ``error`` (exactly that family, never a foreign exception) with a help line."""
    with pytest.raises(error, match=match) as refused:
        call()
    message = str(refused.value)
    assert "\nhelp: " in message, message
    return message


def test_dtype_aliases_compare_equal_to_their_dtypes() -> None:
    """DESIGN.md section 1: "`t.dtype == sg.f32` is true for an f32 tensor, exactly as
    `t.dtype == sg.float32` is". It was False (sg.f32 is ``Annotated[float, float32]``)."""
    aliases = {
        sg.f16: sg.float16,
        sg.f32: sg.float32,
        sg.f64: sg.float64,
        sg.i8: sg.int8,
        sg.i16: sg.int16,
        sg.i32: sg.int32,
        sg.i64: sg.int64,
        sg.u8: sg.uint8,
        sg.u32: sg.uint32,
        sg.u64: sg.uint64,
    }
    for alias, dtype in aliases.items():
        assert dtype == alias and alias == dtype
        assert (dtype != alias, alias != dtype) == (False, False)
        for other in aliases.values():
            if other is not dtype:
                assert other != alias and alias != other and (other == alias, alias == other) == (False, False)
    t = sg.device("host").zeros((4,), sg.f32)
    assert t.dtype == sg.f32 and sg.f32 == t.dtype and t.dtype != sg.i32 and t.dtype == sg.float32
    assert t.dtype != "f32" and t.dtype != 3 and t.dtype != float  # only dtypes and their aliases
    assert len({sg.float32, t.dtype, sg.int32}) == 2  # hashing follows equality among DTypes
    # ... and between a dtype and its alias: sets and dicts keyed by either find the other
    assert all(hash(alias) == hash(dtype) for alias, dtype in aliases.items())
    keyed: dict[object, str] = {sg.f32: "float"}
    assert t.dtype in {sg.f32, sg.f64} and keyed[t.dtype] == "float" and len({sg.f32, t.dtype}) == 1
    assert sg.TensorSpec(sg.f32, rank=1) == sg.TensorSpec(sg.float32, rank=1)
    assert len({sg.TensorSpec(sg.f32), sg.TensorSpec(sg.float32), sg.TensorSpec("float32")}) == 1
    for copied in (pickle.loads(pickle.dumps(sg.f32)), copy.deepcopy(sg.f32)):  # the same alias again
        assert copied == sg.f32 and hash(copied) == hash(sg.f32) == hash(sg.float32)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"rank": "a"}, r"TensorSpec\(rank='a'\) is not a rank"),
        ({"rank": 1.5}, r"TensorSpec\(rank=1.5\) is not a rank"),
        ({"rank": -1}, r"TensorSpec\(rank=-1\) is not a rank"),
        ({"rank": True}, r"TensorSpec\(rank=True\) is not a rank"),
        ({"dtype": "banana"}, r"`'banana'` is not a dtype scopegraph supports"),
    ],
)
def test_a_bad_tensor_spec_is_refused_where_it_is_written(spec: dict[str, object], match: str) -> None:
    """A rank that is no count of dimensions escaped as numpy's ValueError at the first launch
    (rank="a"), was truncated (1.5) or made a kernel no launch could match (-1)."""
    with pytest.raises(sg.SignatureError, match=match) as info:
        sg.TensorSpec(**spec)  # type: ignore[arg-type]
    assert "help: " in str(info.value)


def test_array_valued_flags_are_signature_errors() -> None:
    """numpy's "truth value of an array is ambiguous" escaped from these flags."""
    dev = sg.device("host")
    stream, y = dev.stream(), dev.zeros((4,), name="y")
    with CudaGraph.scope(stream) as s:
        s.record(sg.memset(y.mut(), 1.0))
        for flags in ({"via": np.array([1, 2])}, {"mode": np.array([1, 2])}, {"name": 3}):
            with pytest.raises(sg.SignatureError, match=r"via=|mode=|name=3 names nothing"):
                s.capture(writes=[y.mut()], host=lambda y: None, **flags)
    with s.graph as graph, pytest.raises(sg.SignatureError, match="include_driver=array"):
        graph.to_dot(include_driver=np.array([1, 2]))  # type: ignore[arg-type]


def test_a_huge_int_scalar_is_refused_not_made_infinite() -> None:
    """DESIGN.md section 1: SignatureError for "a scalar its C type cannot hold exactly".
    ``10**400`` for an f32 became inf (and ``-10**400`` became +inf: float()'s OverflowError was
    turned into inf) in kernel arguments, fills, memsets and parameter defaults."""
    from scopegraph import library

    dev = sg.device("host")
    stream = dev.stream()
    x = dev.from_numpy(np.ones(4, np.float32), name="x")
    y = dev.zeros((4,), name="y")
    for huge in (10**400, -(10**400)):
        message = _refused(sg.SignatureError, lambda h=huge: library.axpy[1, 32](y.mut(), x, h, 4), "overflows")
        assert "sg.f32" in message and ("negative" in message) == (huge < 0)
        _refused(sg.SignatureError, lambda h=huge: stream.run(sg.memset(y.mut(), h)), "overflows")
        _refused(sg.SignatureError, lambda h=huge: dev.full((2,), h, sg.f64), "overflows sg.f64")
        _refused(sg.SignatureError, lambda h=huge: sg.Param("a", sg.f32, h), "overflows")
    assert np.isinf(dev.full((1,), float("-inf")).numpy()).all()  # an infinity asked for is kept
    np.testing.assert_array_equal(y.numpy(), 0)
    stream.run(library.axpy[1, 32](y.mut(), x, 2**100, 4))  # a big int a float holds (rounded)
    np.testing.assert_array_equal(y.numpy(), np.float32(2**100))
    assert_stream_usable(stream)


def test_an_int_a_float_type_cannot_hold_exactly_is_refused() -> None:
    """DESIGN.md section 1: "a scalar its C type cannot hold exactly". 16777217 became 16777216
    in an f32 (2**53 + 1 in an f64) without a word; a float's own rounding (0.1) stays accepted."""
    from scopegraph import library

    dev = sg.device("host")
    stream = dev.stream()
    x, y = dev.from_numpy(np.ones(4, np.float32), name="x"), dev.zeros((4,), name="y")
    become = "cannot hold exactly: it would become 16777216"
    _refused(sg.SignatureError, lambda: library.axpy[1, 32](y.mut(), x, 2**24 + 1, 4), become)
    _refused(sg.SignatureError, lambda: stream.run(sg.memset(y.mut(), 2**24 + 1)), become)
    _refused(sg.SignatureError, lambda: sg.Param("a", sg.f32, 2**24 + 1), become)
    _refused(sg.SignatureError, lambda: dev.full((1,), 2**53 + 1, sg.f64), "it would become 9007199254740992")
    under = "cannot hold exactly: it underflows to 0"
    _refused(sg.SignatureError, lambda: library.axpy[1, 32](y.mut(), x, 1e-50, 4), under)
    _refused(sg.SignatureError, lambda: dev.full((1,), -1e-46), under)
    stream.run(library.axpy[1, 32](y.mut(), x, 2**24, 4))  # exact
    stream.run(library.axpy[1, 32](y.mut(), x, 0.1, 4))  # a float, rounded as floats are
    stream.run(library.axpy[1, 32](y.mut(), x, 1e-40, 4))  # subnormal: rounded, not lost
    np.testing.assert_array_equal(y.numpy(), np.float32(2**24) + np.float32(0.1) + np.float32(1e-40))
    assert_stream_usable(stream)


def test_zeros_of_a_bool_tensor_are_false() -> None:
    """DESIGN.md section 1: dev.zeros / sg.zeros take any supported dtype; for bool they refused
    with "the fill value is 0, which sg.bool cannot hold exactly" (and sg.bool is no public name)."""
    dev = sg.device("host")
    stream = dev.stream()
    for dtype in (np.bool_, bool, "bool"):
        np.testing.assert_array_equal(dev.zeros((3,), dtype).numpy(), np.zeros(3, bool))
        np.testing.assert_array_equal(stream.run(sg.zeros((2, 2), dtype)).numpy(), np.zeros((2, 2), bool))
    message = _refused(sg.SignatureError, lambda: dev.full((2,), 2, bool), "bool cannot hold exactly")
    assert "sg.bool" not in message  # there is no sg.bool to pass
    assert repr(dev.zeros((1,), bool).dtype) == "bool"
    assert_stream_usable(stream)


def test_from_numpy_keeps_a_0d_shape() -> None:
    """``dev.from_numpy(np.array(3.0, np.float32)).shape`` was (1,) (numpy's ascontiguousarray
    makes 0-d arrays 1-d); sg.from_numpy too. A 0-d array stays 0-d, as dev.zeros(()) is."""
    dev = sg.device("host")
    stream = dev.stream()
    a = np.array(3.0, np.float32)
    for t in (dev.from_numpy(a), stream.run(sg.from_numpy(a))):
        assert t.shape == () and t.nbytes == 4
        assert t.numpy().shape == () and t.numpy() == 3.0


def test_bad_constructor_arguments_are_signature_errors() -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``sg.dup(np.zeros(3))`` raised
    AttributeError, ``dev.zeros((2,), "i4,,")`` numpy's SyntaxError, and ``name=5`` was accepted,
    to break graph.to_dot() later with a TypeError."""
    dev = sg.device("host")
    stream = dev.stream()
    bad: Any = np.zeros(3)
    _refused(sg.SignatureError, lambda: sg.dup(bad), "sg.dup")
    _refused(sg.SignatureError, lambda: sg.from_numpy([1.0, 2.0]), "numpy array")  # type: ignore[arg-type]
    _refused(sg.SignatureError, lambda: dev.zeros((2,), "i4,,"), "not a dtype")
    _refused(sg.SignatureError, lambda: stream.run(sg.zeros((2,), "i4,,")), "not a dtype")
    x = dev.zeros((4,), name="x")
    for name, message in ((5, "name=5"), ("", "name='': error messages and DOT pictures would show nothing")):
        _refused_names(dev, x, name, message)
    assert x.name == "x" and x.numpy().sum() == 0
    assert_stream_usable(stream)


def _refused_names(dev: sg.Device, x: sg.Tensor, name: Any, message: str) -> None:
    for make in (
        lambda: dev.zeros((4,), name=name),
        lambda: dev.empty((4,), name=name),
        lambda: dev.full((4,), 1.0, name=name),
        lambda: dev.from_numpy(np.zeros(4, np.float32), name=name),
        lambda: sg.zeros((4,), name=name),
        lambda: sg.empty((4,), name=name),
        lambda: sg.full((4,), 1.0, name=name),
        lambda: sg.dup(x, name=name),
        lambda: sg.from_numpy(np.zeros(4, np.float32), name=name),
        lambda: x.view((2, 2), name=name),
        lambda: sg.Tensor.from_dlpack(np.zeros(4, np.float32), name=name),
    ):
        _refused(sg.SignatureError, make, message)


def test_a_failed_host_allocation_is_an_out_of_memory_cuda_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN.md section 1: no foreign exception for bad input. ``dev.zeros((2**40,))`` (4 TiB,
    under the 2**48-byte limit) let numpy's MemoryError escape on the host backend; the CUDA
    backend reports the same failure as a CudaError (CUDA_ERROR_OUT_OF_MEMORY)."""
    dev = sg.device("host")
    stream = dev.stream()

    def no_memory(nbytes: int) -> tuple[object, int]:
        raise MemoryError(f"Unable to allocate {nbytes} bytes")

    with monkeypatch.context() as patch:  # numpy may overcommit: make the allocation fail for sure
        patch.setattr(dev.backend, "allocate", no_memory)
        makers: list[Callable[[], object]] = [lambda: dev.zeros((2**40,)), lambda: stream.run(sg.empty((2**30,)))]
        for make in makers:
            with pytest.raises(sg.CudaError) as refused:
                make()
            assert refused.value.result == "CUDA_ERROR_OUT_OF_MEMORY" and not refused.value.context_lost
            assert "\nhelp: " in str(refused.value) and "host" in str(refused.value)
    assert_stream_usable(stream)


def test_from_numpy_of_a_huge_broadcast_view_is_an_out_of_memory_cuda_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broadcast view of one element can stand for terabytes: ``dev.from_numpy`` and
    ``sg.from_numpy`` made it contiguous first, and numpy's MemoryError escaped. The tensor is now
    allocated first (refused as ``dev.zeros`` is); a host copy that fails after it frees the tensor
    and is refused the same way."""
    dev = sg.device("host")
    stream = dev.stream()
    huge = np.broadcast_to(np.float32(1), (2**40,))

    def no_memory(nbytes: int) -> tuple[object, int]:
        raise MemoryError(f"Unable to allocate {nbytes} bytes")

    with monkeypatch.context() as patch:
        patch.setattr(dev.backend, "allocate", no_memory)
        makers: list[Callable[[], object]] = [lambda: dev.from_numpy(huge), lambda: stream.run(sg.from_numpy(huge))]
        for make in makers:
            with pytest.raises(sg.CudaError) as refused:
                make()
            assert refused.value.result == "CUDA_ERROR_OUT_OF_MEMORY" and "\nhelp: " in str(refused.value)
    # The device has room (a small view stands in), the host copy does not: the tensor goes again.
    small = np.broadcast_to(np.float32(2), (3, 4))
    freed: list[sg.Tensor] = []
    real_empty, real_copy = dev.empty, np.ascontiguousarray

    def noting_empty(*args: Any, **kwargs: Any) -> sg.Tensor:
        freed.append(real_empty(*args, **kwargs))
        return freed[-1]

    def no_host_memory(array: Any, *args: Any, **kwargs: Any) -> Any:
        if array is small:
            raise MemoryError("Unable to allocate")
        return real_copy(array, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(dev, "empty", noting_empty)
        patch.setattr(np, "ascontiguousarray", no_host_memory)
        with pytest.raises(sg.CudaError, match="contiguous copy") as refused:
            dev.from_numpy(small)
        assert refused.value.result == "CUDA_ERROR_OUT_OF_MEMORY"
    assert len(freed) == 1
    with pytest.raises(sg.LifetimeError):
        freed[0].numpy()  # freed: nothing leaked
    assert_stream_usable(stream)
    assert dev.from_numpy(small).numpy().tolist() == [[2.0] * 4] * 3


def test_bools_are_refused_as_sizes_and_row_indices() -> None:
    """Grids, max_iterations and sg.Param refuse bools; shapes, views and row indices took True as 1
    (``x[True]`` was row 1, where numpy reads a mask)."""
    dev = sg.device("host")
    stream = dev.stream()
    x = dev.from_numpy(np.arange(8, dtype=np.float32).reshape(4, 2), name="x")
    yes: Any = True
    numpy_yes: Any = np.bool_(True)
    for call in (
        lambda: dev.zeros((yes,)),
        lambda: dev.zeros(yes),
        lambda: dev.empty((2, numpy_yes)),
        lambda: stream.run(sg.zeros((yes, 2))),
        lambda: x.view((yes, 8)),
        lambda: x[yes],
        lambda: x[yes:3],
    ):
        _refused(sg.SignatureError, call, "bool")
    assert x[1].shape == (2,) and x.view((1, 8)).shape == (1, 8) and dev.zeros((1,)).shape == (1,)
    np.testing.assert_array_equal(x.numpy(), np.arange(8).reshape(4, 2))
    assert_stream_usable(stream)


def test_a_dropped_wrapper_bridges_no_two_live_ones_made_before_it_was_dropped() -> None:
    """As below, with W3 made while W2 still bridged it to W1: no registration touches the region
    after W2 is dropped, so reading the region's members (the graph's pin) splits it."""
    import gc

    from scopegraph import library

    dev = sg.device("host")
    stream = dev.stream()
    big = np.zeros(100, np.float32)
    w1 = sg.Tensor.from_dlpack(big[0:50], name="w1")
    w2 = sg.Tensor.from_dlpack(big[25:75], name="w2")
    w3 = sg.Tensor.from_dlpack(big[60:100], name="w3")
    assert w1.allocation.region is w2.allocation.region is w3.allocation.region
    del w2
    gc.collect()
    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(w3.mut(), 1.0))
    with s.graph as graph:
        assert not w1.allocation.pins and w3.allocation.pins
        w1.free()
        graph.launch()
        graph.sync()
    np.testing.assert_array_equal(big[60:], 1.0)
    assert_stream_usable(stream)


def test_a_wrapper_joins_only_wrappers_it_overlaps_after_one_is_dropped() -> None:
    """DESIGN.md section 2: a graph pins the tensors it touches (and the wrappers of the same
    memory). W1 = big[0:50] and W2 = big[25:75] made one region spanning 0..75; W2 was dropped but
    the span stayed, so W3 = big[60:100], disjoint from W1, joined W1's region: a graph touching
    only W3 pinned W1, and W1.free() raised LifetimeError."""
    import gc

    from scopegraph import library

    dev = sg.device("host")
    stream = dev.stream()
    big = np.zeros(100, np.float32)
    w1 = sg.Tensor.from_dlpack(big[0:50], name="w1")
    w2 = sg.Tensor.from_dlpack(big[25:75], name="w2")
    assert w1.allocation.region is w2.allocation.region
    del w2
    gc.collect()
    w3 = sg.Tensor.from_dlpack(big[60:100], name="w3")
    assert w1.allocation.region is not w3.allocation.region
    with CudaGraph.scope(stream) as s:
        s.record(library.fill_op(w3.mut(), 1.0))
    with s.graph as graph:
        assert not w1.allocation.pins and w3.allocation.pins
        w1.free()  # the bug: LifetimeError, pinned by a graph that never touches it
        graph.launch()
        graph.sync()
    np.testing.assert_array_equal(big[60:], 1.0)
    # Overlaps still join through live wrappers: w4 bridges w3 and w5, and each is one memory.
    w5 = sg.Tensor.from_dlpack(big[20:40], name="w5")
    w4 = sg.Tensor.from_dlpack(big[30:70], name="w4")
    assert w3.allocation.region is w4.allocation.region is w5.allocation.region
    with pytest.raises(sg.BorrowError):
        library.add_op(w4.mut(), w3, w3)  # overlapping wrappers within one op
    w5.freeze()
    with pytest.raises(sg.BorrowError, match="frozen"):
        sg.memset(w4.mut(), 0.0)  # frozen through another wrapper of the same bytes
    assert_stream_usable(stream)


def test_importing_with_the_stream_a_scope_records_on_is_refused() -> None:
    """DESIGN.md section 2: every path that enqueues eager work on a stream is refused while a
    scope records on it; ``from_dlpack(stream=)`` makes that stream wait for the producer."""
    dev = sg.device("host")
    stream = dev.stream()
    with CudaGraph.scope(stream):
        with pytest.raises(sg.ScopeStateError, match="help:"):
            sg.Tensor.from_dlpack(np.zeros(4, np.float32), stream=stream)
        assert sg.Tensor.from_dlpack(np.zeros(4, np.float32), stream=dev.stream()).shape == (4,)
    assert_stream_usable(stream)


def test_dtype_none_is_refused_not_read_as_float64() -> None:
    dev = sg.device("host")
    for make in (lambda: dev.zeros((4,), None), lambda: sg.zeros((4,), None)):  # type: ignore[arg-type]
        with pytest.raises(sg.SignatureError, match="help: leave the dtype out"):
            make()


def test_graph_cache_takes_a_numpy_int_size() -> None:
    stream = sg.device("host").stream()
    cache: sg.GraphCache[int] = sg.GraphCache(stream, lambda s, key: None, maxsize=np.int64(4))
    assert cache.maxsize == 4 and type(cache.maxsize) is int
    with pytest.raises(sg.SignatureError, match="help:"):
        sg.GraphCache(stream, lambda s, key: None, maxsize=np.int64(0))


def test_a_bad_scopegraph_device_is_reported_as_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN.md section 1: SCOPEGRAPH_DEVICE overrides sg.device()'s None default. A bad value was
    reported as if the caller had passed it ("unknown device 'bogus'", help "(or None to pick)":
    the None just given); with no GPU, SCOPEGRAPH_DEVICE=cuda advised sg.device(), the call that
    had failed; and a blank value was refused although an empty one means "pick"."""
    from scopegraph._driver import cuda_device_count

    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "bogus")
    with pytest.raises(sg.SignatureError) as info:
        sg.device()
    message = str(info.value)
    assert message.startswith("SCOPEGRAPH_DEVICE='bogus' names no device"), message
    assert message.splitlines()[-1].startswith("help: set SCOPEGRAPH_DEVICE to"), message
    with pytest.raises(sg.SignatureError) as info:
        sg.device("tpu")  # a name the caller gives is the caller's: the variable plays no part
    assert "SCOPEGRAPH_DEVICE" not in str(info.value) and "help: " in str(info.value)

    count = cuda_device_count()
    monkeypatch.setenv("SCOPEGRAPH_DEVICE", "cuda" if count == 0 else f"cuda:{count}")
    with pytest.raises(sg.CudaError) as cuda_info:
        sg.device()
    headline, *_, help_line = str(cuda_info.value).splitlines()
    assert "named by SCOPEGRAPH_DEVICE" in headline, headline
    assert help_line.startswith(("help: unset SCOPEGRAPH_DEVICE", "help: set SCOPEGRAPH_DEVICE")), help_line
    assert "sg.device('host')" not in help_line, help_line

    monkeypatch.setenv("SCOPEGRAPH_DEVICE", " \t")
    blank = sg.device()
    monkeypatch.delenv("SCOPEGRAPH_DEVICE")
    assert blank is sg.device()


@pytest.mark.parametrize(("value", "warned"), [("abc", True), ("12", False), ("", False)])
def test_a_host_seed_that_is_no_number_is_named_not_ignored(value: str, warned: bool) -> None:
    """The seed is read when the host backend is imported: a warning, with the seed used instead."""
    done = subprocess.run(
        [sys.executable, "-c", "import scopegraph._backends._host as h; print(h.replay_seed)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(SCOPEGRAPH_HOST_SEED=value),
    )
    assert done.returncode == 0, done.stderr
    seed = done.stdout.strip()
    if warned:
        assert "SCOPEGRAPH_HOST_SEED='abc' is not a whole number" in done.stderr
        assert f"set SCOPEGRAPH_HOST_SEED={seed} to replay them" in done.stderr
    else:
        assert done.stderr == ""
        assert value == "" or seed == value


class _FreshArray:
    """Hands out a new array each time: its values, not memory to share."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray[Any, Any]:
        return np.zeros(4, np.float32)


@pytest.mark.parametrize("obj", [3, [1.0, 2.0], range(3), _FreshArray()], ids=["int", "list", "range", "fresh"])
def test_wrapping_what_has_no_memory_to_share_is_refused(obj: object) -> None:
    """from_dlpack wraps memory without a copy; numpy's asarray of a list or a number made a new
    array, so the "wrapper" was a copy and writes to it were lost."""
    with pytest.raises(sg.SignatureError, match="has no memory to share") as info:
        sg.Tensor.from_dlpack(obj)
    assert "dev.from_numpy" in str(info.value)
    shared = np.zeros(4, np.float32)

    class Holder:  # exports its own array, as a pandas Series does
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray[Any, Any]:
            return shared

    stream = sg.device("host").stream()
    buffer: Any = memoryview(shared)  # type: ignore[arg-type]
    for wrapped, value in ((buffer, 2.0), (Holder(), 3.0)):  # shared memory: wrapped
        t = sg.Tensor.from_dlpack(wrapped)
        stream.run(sg.memset(t.mut(), value))
        np.testing.assert_array_equal(shared, np.full(4, value, np.float32))


def test_node_kinds_scopegraph_does_not_make_are_refused_on_every_backend(sg_device: sg.Device) -> None:
    """A user's GraphNode subclass ran as nothing on the host and failed the graph build on a GPU;
    an sg.Captured made directly ran its host callable on the host and had no graph on a GPU."""
    dev = sg_device
    stream, x = dev.stream(), dev.zeros((4,), name="x")

    class Mine(sg.GraphNode):
        __slots__ = ()

        def __init__(self) -> None:
            self._claim([sg._borrow.Borrow(x, True, "x")])

        @property
        def name(self) -> str:
            return "mine"

    with pytest.raises(sg.NotAGraphNodeError, match="`Mine` is a GraphNode subclass that scopegraph does not define"):
        stream.run(Mine())
    with CudaGraph.scope(stream) as s:
        with pytest.raises(sg.NotAGraphNodeError, match="does not define") as info:
            s.record(Mine())
        assert "help: write the work as a kernel" in str(info.value)
        with pytest.raises(sg.NotAGraphNodeError, match=r"sg\.Captured is made by a captured region"):
            sg.Captured("direct", [x.mut()], [], lambda x: None, "here")
        s.record(sg.memset(x.mut(), 1.0))
    with s.graph as graph:
        graph.launch()
        np.testing.assert_array_equal(x.numpy(), 1.0)
    assert_stream_usable(stream)


def test_a_host_stream_does_not_claim_the_cuda_stream_protocol() -> None:
    """A host stream had __cuda_stream__, whose call raised AttributeError on None: other libraries
    test the protocol with hasattr, then call it."""
    assert not hasattr(sg.device("host").stream(), "__cuda_stream__")


def test_a_bare_graph_node_has_a_repr() -> None:
    """repr(sg.GraphNode()) raised AttributeError (its label reads borrows no constructor set)."""
    assert repr(sg.GraphNode()) == "<GraphNode: not an op>"


def test_a_one_dimensional_integer_array_is_a_shape_as_in_numpy() -> None:
    """dev.zeros(np.array([2, 4])) was refused while t.view(np.array([2, 4])) was accepted."""
    dev = sg.device("host")
    shape: Any = np.array([2, 4])
    assert dev.zeros(shape).shape == (2, 4) == dev.zeros((8,)).view(shape).shape
    for bad in (np.array([2.5, 4.0]), np.array([[2, 4]])):
        with pytest.raises(sg.SignatureError, match="is not an int or a tuple of ints"):
            dev.zeros(bad)  # type: ignore[arg-type]


class _NoData:
    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"typestr": "<f4", "version": 3, "shape": (4,)}  # no `data`


class _TooBig:
    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"typestr": "<f4", "version": 3, "shape": (2**62,), "data": (1 << 40, False)}


class _OddDevice:
    def __dlpack_device__(self) -> tuple[int]:
        return (2,)  # no device index

    def __dlpack__(self, **kwargs: Any) -> object:
        raise KeyError("stream")


class _Pinned:
    def __dlpack_device__(self) -> tuple[int, int]:
        return (3, 0)  # kDLCUDAHost: pinned host memory (torch's pin_memory())

    def __dlpack__(self, **kwargs: Any) -> object:
        raise AssertionError("not asked: refused by its device")


class _Managed:
    """CuPy's managed-memory array as scopegraph sees it: both interfaces, DLPack device 13."""

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"typestr": "<f4", "version": 3, "shape": (4,), "data": (0, False)}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (13, 0)  # kDLCUDAManaged

    def __dlpack__(self, **kwargs: Any) -> object:
        raise BufferError("a stand-in: no memory behind it")


def test_a_foreign_object_that_describes_its_memory_wrongly_is_a_signature_error() -> None:
    """A GPU audit found KeyError, OverflowError, IndexError and cuda.core's CUDAError escaping
    sg.Tensor.from_dlpack for producers that describe their memory wrongly (a float8 torch tensor,
    a __cuda_array_interface__ without `data` or of 2**62 elements), pinned host memory refused as
    "unknown device 'cuda:-1'" (or taken for cuda:0's), and TypeError and
    OverflowError escaping t.__dlpack__(stream=...) for a stream that is no handle."""
    for producer in (_NoData(), _TooBig(), _OddDevice(), _Pinned()):
        with pytest.raises(sg.SignatureError, match=f"cannot wrap {type(producer).__name__}") as refused:
            sg.Tensor.from_dlpack(producer)
        assert "\nhelp: " in str(refused.value)
    with pytest.raises(sg.SignatureError, match="pinned host memory, not a GPU's"):  # was `unknown device 'cuda:-1'`
        sg.Tensor.from_dlpack(_Pinned())
    with pytest.raises(sg.ScopeGraphError) as not_pinned:  # managed memory (CuPy's, 13) is no pinned memory
        sg.Tensor.from_dlpack(_Managed())
    assert "pinned" not in str(not_pinned.value)
    x = sg.device("host").zeros((4,), name="x")
    stream: Any
    for stream in ("a", 2**70, True, -2, 1.0):
        with pytest.raises(sg.SignatureError, match=r"__dlpack__\(stream=.*the consumer's stream is None or"):
            x.__dlpack__(stream=stream)
    assert x.numpy().shape == (4,) and x.__dlpack__(stream=None) is not None


_NAMED_SRC = 'namespace ns { __global__ void k(float* out) {} }\nextern "C" __global__ void k2(float* out) {}'


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("my kernel", r"name='my kernel'\): the kernel's C\+\+ name 'my kernel' is not a C\+\+ identifier"),
        ("1abc", "'1abc' is not a C\\+\\+ identifier"),
        ("a-b", "'a-b' is not a C\\+\\+ identifier"),
        ("k2 ", "'k2 ' is not a C\\+\\+ identifier"),
        ("ns::", "'ns::' is not a C\\+\\+ identifier"),
        ("ns:k", "'ns:k' is not a C\\+\\+ identifier"),
        ("k\u00e9", "is not a C\\+\\+ identifier"),  # NVRTC: "unrecognized token"
        ("int", "'int' is the C\\+\\+ keyword `int`, which nothing can be named"),
        ("new::k", "'new::k' has the C\\+\\+ keyword `new` in it"),
        ("k<3>", "'k<3>' has template arguments(.|\n)*help: pass name=\"k\" and .*kernel.generics\\('3'\\)"),
    ],
)
def test_a_kernel_name_that_no_cpp_function_can_have_is_refused_when_declared(name: str, match: str) -> None:
    """The host backend accepted any str as name= (NVRTC refused it only when a GPU compiled the kernel)."""

    def k(out: sg.Mut[sg.Tensor]) -> None: ...

    with pytest.raises(sg.SignatureError, match=match) as info:
        sg.kernel(_NAMED_SRC, name=name)(k)
    assert "\nhelp: " in str(info.value)


@pytest.mark.parametrize("name", ["k2", "_k2", "ns::k", "::k2", "a::b::c", "__k", "K_2"])
def test_kernel_names_nvrtc_can_find_are_accepted(name: str) -> None:
    def k(out: sg.Mut[sg.Tensor]) -> None: ...

    assert sg.kernel(_NAMED_SRC, name=name)(k).cpp_name == name


def test_a_function_whose_name_no_cpp_function_can_have_needs_name() -> None:
    """Without name=, the C++ name is the function's: a lambda's, or a C++ keyword, is refused."""

    def new(out: sg.Mut[sg.Tensor]) -> None: ...

    for fn, shown in (
        (lambda out: None, "'<lambda>' is not a C\\+\\+ identifier"),
        (new, "'new' is the C\\+\\+ keyword"),
    ):
        with pytest.raises(
            sg.SignatureError, match=f"without name=, the kernel's C\\+\\+ name is the function's, and {shown}"
        ):
            sg.kernel(_NAMED_SRC)(fn)
    assert sg.kernel(_NAMED_SRC, name="k2")(new).cpp_name == "k2"


def test_misaligned_foreign_memory_is_refused_on_the_host() -> None:
    """A float32 view of bytes at an odd address wrapped without complaint; on a GPU a kernel's
    misaligned load is a fault that ends the CUDA context, so every backend refuses it."""
    raw = np.zeros(17, np.uint8)
    with pytest.raises(sg.SignatureError, match=r"not a multiple of 4 bytes, the size of its elements \(f32\)"):
        sg.Tensor.from_dlpack(raw[1:17].view(np.float32), name="v")
    assert sg.Tensor.from_dlpack(raw[1:17], name="bytes").shape == (16,)  # 1-byte elements are never misaligned
    aligned = sg.Tensor.from_dlpack(raw[1:17].view(np.float32).copy(), name="copy")
    assert aligned.shape == (4,)
    assert_stream_usable(sg.device("host").stream())


@pytest.mark.sg_cuda
def test_misaligned_gpu_memory_is_refused_before_a_kernel_faults() -> None:
    cp = pytest.importorskip("cupy")
    raw = cp.zeros(17, cp.uint8)
    misaligned = raw[1:17].view(cp.float32)
    with pytest.raises(sg.SignatureError, match="not a multiple of 4 bytes"):
        sg.Tensor.from_dlpack(misaligned, name="v")
    assert_stream_usable(sg.device("cuda").stream())
