"""Machinery for the misuse catalogue (tests/test_misuse.py): a case table and one checker.

Every case is a step that must fail. The checker asserts what issue 8 asks of each failure:
the exact error class, a message that matches the case's patterns and has a ``help:`` line,
no graph built by the failing step, nothing left pinned, every scope the step opened left
without a graph, and the same streams able to run a valid graph afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import scopegraph as sg
from scopegraph import CudaGraph

from .helpers import assert_stream_usable, pinned

HELP = re.compile(r"^help: \S", re.M)


class UserBug(Exception):
    """An exception of the user's own code, raised inside a scope."""


class Ctx:
    """What a case's step gets: the device and stream under test, and trackers for the checks."""

    def __init__(self, device: sg.Device, stream: sg.Stream) -> None:
        self.device = device
        self.stream = stream
        self.tensors: list[sg.Tensor] = []
        self.streams: list[sg.Stream] = [stream]
        self.scopes: list[sg.Scope] = []  # opened by the step: none may end with a graph
        self.graphs: list[sg.CudaGraph] = []  # built as setup: closed before the pin check
        self.setup_builds = 0
        self.keep: list[object] = []  # foreign owners kept alive for the case
        self.user_exc: BaseException | None = None

    @property
    def on_host(self) -> bool:
        return self.device.is_host

    # -- tensors -------------------------------------------------------------------------

    def track(self, t: sg.Tensor) -> sg.Tensor:
        self.tensors.append(t)
        return t

    def zeros(self, shape: int | tuple[int, ...], name: str, dtype: Any = sg.float32) -> sg.Tensor:
        return self.track(self.device.zeros(shape, dtype, name=name))

    def full(self, n: int, value: float, name: str) -> sg.Tensor:
        return self.track(self.device.full((n,), value, name=name))

    def arange(self, n: int, name: str) -> sg.Tensor:
        return self.track(self.device.from_numpy(np.arange(n, dtype=np.float32), name=name))

    def foreign_owner(self, n: int = 16) -> Any:
        """Memory to wrap (kept alive for the case): a numpy array on the host backend, an sg
        tensor on CUDA (its views are wrapped as foreign memory is)."""
        owner: Any = np.arange(n, dtype=np.float32) if self.on_host else self.arange(n, "owner")
        self.keep.append(owner)
        return owner

    def foreign_pair(self, first: slice, second: slice, n: int = 16) -> tuple[sg.Tensor, sg.Tensor]:
        """Two scopegraph wrappers, made independently, of (parts of) one foreign allocation."""
        owner = self.foreign_owner(n)
        a = self.track(sg.Tensor.from_dlpack(owner[first], name="a"))
        b = self.track(sg.Tensor.from_dlpack(owner[second], name="b"))
        return a, b

    # -- streams, scopes, graphs ---------------------------------------------------------

    def other_stream(self) -> sg.Stream:
        s = self.device.stream()
        self.streams.append(s)
        return s

    def scope(self, stream: sg.Stream | None = None, order: str = "dataflow") -> sg.Scope:
        """A scope the step opens; it must end without a graph."""
        s = CudaGraph.scope(stream if stream is not None else self.stream, order=order)
        self.scopes.append(s)
        return s

    def graph(self, *ops: sg.GraphNode, stream: sg.Stream | None = None) -> sg.CudaGraph:
        """A valid graph built as setup (counted apart from the failing step's builds)."""
        st = stream if stream is not None else self.stream
        with CudaGraph.scope(st) as s:
            for op in ops:
                s.record(op)
        if st.device is self.device:
            self.setup_builds += 1
        self.graphs.append(s.graph)
        return s.graph


Step = Callable[[Ctx], object]
Check = Callable[[Ctx, BaseException], None]
ErrorName = str | type[BaseException]


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    error: ErrorName  # a name in `scopegraph` ("BorrowError"), or a class for the user's own errors
    match: tuple[str, ...]  # every pattern must be found in the message (re.I | re.S)
    step: Step
    host: tuple[ErrorName, tuple[str, ...]] | None = None  # a different expectation on the host backend
    only: str | None = None  # "host" or "cuda": the case means nothing on the other backend
    helpful: bool = True  # the message must carry a `help:` line (not for the user's own exceptions)
    exact: bool = True  # type(exc) is the class, not a subclass
    needs: tuple[str, ...] = ()  # modules to importorskip (torch, cupy)
    check: Check | None = None  # more assertions on the exception and the data


@dataclass
class Table:
    cases: list[Case] = field(default_factory=list)

    def case(
        self,
        error: ErrorName,
        *match: str,
        host: tuple[ErrorName, tuple[str, ...]] | None = None,
        only: str | None = None,
        helpful: bool = True,
        exact: bool = True,
        needs: tuple[str, ...] = (),
        check: Check | None = None,
    ) -> Callable[[Step], Step]:
        """Decorator: add the function as a case; its name is the id, its docstring says what it does."""

        def add(step: Step) -> Step:
            name = step.__name__
            assert name not in {c.id for c in self.cases}, f"duplicate case id {name}"
            self.cases.append(
                Case(name, (step.__doc__ or "").strip(), error, match, step, host, only, helpful, exact, needs, check)
            )
            return step

        return add

    def params(self) -> list[Any]:
        return [pytest.param(c, id=c.id) for c in self.cases]


def resolve(error: ErrorName) -> type[BaseException]:
    if isinstance(error, type):
        return error
    found = getattr(sg, error, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        pytest.fail(f"sg.{error} does not exist (the contract names it)")
    return found


@contextmanager
def counting_builds(device: sg.Device, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts backend graph builds (instantiations) on ``device``, like test_errors.py's `builds`."""
    calls: list[int] = []
    real = device.backend.build

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(device.backend, "build", counting)
        yield calls


def run_case(case: Case, device: sg.Device, stream: sg.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    if case.only is not None and case.only != device.kind:
        pytest.skip(f"`{case.id}` only means something on the {case.only} backend")
    for module in case.needs:
        pytest.importorskip(module)
    error_name, match = case.host if (case.host is not None and device.is_host) else (case.error, case.match)
    error = resolve(error_name)
    ctx = Ctx(device, stream)
    try:
        with counting_builds(device, monkeypatch) as builds:
            with pytest.raises(error) as info:
                case.step(ctx)
            built = len(builds)
        exc = info.value
        msg = str(exc)
        if case.exact:
            assert type(exc) is error, f"expected exactly {error.__name__}, got {type(exc).__name__}: {msg}"
        for pattern in match:
            assert re.search(pattern, msg, re.I | re.S), f"pattern {pattern!r} not found in the message:\n{msg}"
        if case.helpful:
            assert HELP.search(msg), f"the message has no `help:` line saying what to do:\n{msg}"
        if case.check is not None:
            case.check(ctx, exc)
        assert built == ctx.setup_builds, f"the failing step built {built - ctx.setup_builds} graph(s)"
        for scope in ctx.scopes:
            with pytest.raises(sg.ScopeStateError):
                scope.graph  # a failed scope has no graph, half-built or otherwise
    finally:
        for g in ctx.graphs:
            g.close()
    for t in ctx.tensors:
        assert not pinned(t), f"`{t.name}` is still pinned after the failure"
    for s in ctx.streams:
        assert_stream_usable(s)
