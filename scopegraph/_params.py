"""Graph parameters: ``sg.Param`` stands for a scalar kernel argument whose value a graph can change
between replays without being rebuilt.

    eps = sg.Param("eps", sg.f32, 1e-5)
    s.record(library.rms_norm.generics(256)[rows, 256](out.mut(), x, w, eps, d))
    graph.launch(eps=1e-6)          # updates the nodes that use `eps`, then replays

- A Param is passed wherever a kernel takes a scalar; its dtype must be the one the kernel
  declares. An op built with a Param runs eagerly (``stream.run``) with the default.
  ``graph.update(op)`` runs it as part of that graph's program: each Param whose name the graph
  has takes the graph's current value (whichever Param object the op was built with), checked
  against the op's sizes; a Param the graph does not have keeps its default; one of the graph's
  name but another dtype is a SignatureError (``ParamTable.for_update``).
- A graph starts with every parameter at its default, like a fresh recording. ``launch(name=v)``
  checks every value first (an unknown name, a value the dtype cannot hold exactly, or a size that
  would make a launch reach past a tensor is a SignatureError, and nothing is changed or
  launched), then updates only the nodes whose parameters changed, through the executable graph's
  node update, in loop and branch bodies too (on CUDA, should the driver refuse node updates
  inside conditional bodies, those become whole-graph updates: ``graph.last_update`` says
  "whole"). A value equal to the current one costs nothing. Values stay until changed again.
- Parameters are named per graph: one name, one parameter. Two Params with the same name in one
  scope must agree on dtype and default (else a SignatureError at ``record``).

With the scopegraph mypy plugin, a kernel's ``sg.f32`` parameter accepts a ``Param[float]`` and an
``sg.i32`` one a ``Param[int]``.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import numpy as np

from ._dtypes import DType, DTypeLike, as_dtype
from ._errors import SignatureError, diagnostic

if TYPE_CHECKING:
    from ._kernel import KernelLaunch
    from ._scope import RecordedNode

T = TypeVar("T", bound=float)

# Names graph.launch() takes itself.
RESERVED = frozenset({"self", "stream"})  # graph.launch(self, stream=None, **params)


def _argument(dtype: DType, value: object, what: str) -> np.generic:
    """``value`` as the kernel argument a parameter stands for: an integer parameter takes no
    float (not even 8.0), as a direct argument of the kernel does; the rest is ``scalar``'s check."""
    if isinstance(value, (float, np.floating)) and not dtype.takes_argument(value):
        raise SignatureError(
            diagnostic(
                f"{what} is float {value!r}, but the parameter is {dtype.spelling}",
                help="pass an int, as the kernel's own argument takes",
            )
        )
    return dtype.scalar(value, what)


class Param(Generic[T]):
    """A named scalar kernel argument whose value a graph can change at ``launch(name=value)``."""

    __slots__ = ("default", "dtype", "name")

    # The dtype decides the kind, as the kernel's own scalar does: sg.Param("n", sg.i32, 1) is a
    # Param[int] even where a Param[float] is expected (mypy would otherwise promote the int),
    # so an sg.i32 parameter in an sg.f32 slot is a type error, not only a run-time one.
    @overload
    def __init__(self: Param[int], name: str, dtype: type[int], default: int) -> None: ...
    @overload
    def __init__(self: Param[float], name: str, dtype: type[float], default: float) -> None: ...
    @overload
    def __init__(self, name: str, dtype: DTypeLike, default: T) -> None: ...
    def __init__(self, name: str, dtype: DTypeLike, default: float) -> None:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED:
            raise SignatureError(
                diagnostic(
                    f"sg.Param name {name!r} cannot be a keyword argument of graph.launch()",
                    ["graph.launch(name=value) sets a parameter, and `self` and `stream` are launch's own"],
                    help="name the parameter with a Python identifier other than `self` and `stream`, "
                    'e.g. sg.Param("eps", sg.f32, 1e-5)',
                )
            )
        self.name = name
        self.dtype: DType = as_dtype(dtype)
        # The value as the kernel receives it (a numpy scalar of the C type); checked exactly.
        self.default: np.generic = _argument(self.dtype, default, f"the default of parameter `{name}`")

    def __repr__(self) -> str:
        return f"sg.Param({self.name!r}, {self.dtype.spelling}, {self.default.item()!r})"

    def same_as(self, other: Param[Any]) -> bool:
        return self.dtype == other.dtype and _same_value(self.default, other.default)


def _same_value(a: np.generic, b: np.generic) -> bool:
    """Bitwise equality (so -0.0 and 0.0 differ, and a NaN equals itself): what the kernel would see."""
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def note_params(seen: dict[str, Param[Any]], op: KernelLaunch) -> None:
    """Check, at ``record``, that the op's parameters agree with those recorded before in the scope."""
    for _, param in op.params:
        known = seen.get(param.name)
        if known is None:
            seen[param.name] = param
        elif known is not param and not known.same_as(param):
            raise SignatureError(
                diagnostic(
                    f"two different parameters are named `{param.name}` in one scope",
                    [f"recorded before: {known!r}", f"`{op.name}` uses {param!r}"],
                    help="use one sg.Param object for every launch that shares the value, or give them different names",
                )
            )


class ParamTable:
    """A graph's parameters: their dtypes, current values and the nodes that use each one, by slot
    (loop and branch bodies included: see ``scopegraph._control.levels``)."""

    __slots__ = ("flat", "params", "users", "values")

    def __init__(self, flat: Sequence[RecordedNode]) -> None:
        self.flat = flat
        self.params: dict[str, Param[Any]] = {}
        self.users: dict[str, list[int]] = {}
        for slot, node in enumerate(flat):  # kernel launches have parameters
            params: tuple[tuple[int, Param[Any]], ...] = getattr(node.op, "params", ())
            if params:
                for _, param in params:
                    self.params.setdefault(param.name, param)
                    users = self.users.setdefault(param.name, [])
                    if not users or users[-1] != slot:
                        users.append(slot)
        self.values: dict[str, np.generic] = {name: p.default for name, p in self.params.items()}

    def check(self, graph_id: int, given: Mapping[str, object]) -> dict[str, np.generic]:
        """The values in ``given`` that differ from the current ones, each checked exactly.
        Raises before anything changes."""
        changed: dict[str, np.generic] = {}
        for name, value in given.items():
            param = self.params.get(name)
            if param is None:
                known = ", ".join(f"{p.name} ({p.dtype.spelling})" for p in self.params.values()) or "none"
                raise SignatureError(
                    diagnostic(
                        f"graph #{graph_id} has no parameter `{name}`",
                        [f"its parameters: {known}"],
                        help="pass a name an sg.Param of the recording has, e.g. graph.launch(eps=1e-6)",
                    )
                )
            scalar = _argument(param.dtype, value, f"parameter `{name}` of graph #{graph_id}")
            if not _same_value(scalar, self.values[name]):
                changed[name] = scalar
        return changed

    def affected(self, changed: Mapping[str, np.generic]) -> list[int]:
        """The slots of the nodes that use a changed parameter, in order."""
        if len(changed) == 1:
            (name,) = changed
            return self.users[name]
        return sorted({i for name in changed for i in self.users[name]})

    def plan(self, graph_id: int, given: Mapping[str, object]) -> tuple[dict[str, np.generic], list[int]] | None:
        """Check ``given`` (every value, and the sizes of every node that would change, before
        anything is updated): the parameter values after the change and the slots of the nodes to
        update, or None when no value changes. The caller updates them, then sets ``values``."""
        changed = self.check(graph_id, given)
        if not changed:
            return None
        values = self.values | changed
        slots = self.affected(changed)
        flat = self.flat
        for i in slots:
            op: KernelLaunch = flat[i].op  # type: ignore[assignment]
            if op.kernel.touches is not None:
                op.check_touches(op.resolved(values))
        return values, slots

    def for_update(self, graph_id: int, op: KernelLaunch) -> KernelLaunch:
        """``op`` (a launch with parameters) as ``graph.update(op)`` runs it: each sg.Param whose
        name the graph has takes the graph's current value, one it lacks keeps its default (the
        op is not part of the recording, so the graph has no value for it). ``op`` itself when
        that changes no argument; otherwise a copy with the values bound in place of the Params,
        its declared sizes checked with them. Raises, with nothing run, for a Param of the graph's
        name and another dtype, and for values that would make the op reach past its tensors."""
        values: dict[str, np.generic] = {}
        for _, param in op.params:
            known = self.params.get(param.name)
            if known is None:
                continue
            if known.dtype != param.dtype:
                raise SignatureError(
                    diagnostic(
                        f"graph #{graph_id} cannot run `{op.name}` with its parameter `{param.name}`: "
                        f"the graph's `{param.name}` is {known.dtype.spelling}, the op's is {param.dtype.spelling}",
                        [
                            f"the graph has {known!r}, now {self.values[param.name].item()!r}; the op uses {param!r}",
                            "graph.update(op) gives each sg.Param of the op the graph's value of that name",
                        ],
                        help="give the op's sg.Param another name (one the graph lacks keeps its default), "
                        "pass the value itself, or run the op with stream.run(op) for its default",
                    )
                )
            value = self.values[param.name]
            if not _same_value(value, param.default):
                values[param.name] = value
        if not values:
            return op  # every argument is the op's own: it runs as built, with its bound form
        args = op.resolved(values)
        try:
            op.check_touches(args)
        except SignatureError as exc:  # the same refusal, saying where the values came from
            headline, _, hint = str(exc).partition("\nhelp: ")
            given = ", ".join(f"{name}={value.item()!r}" for name, value in values.items())
            names = ", ".join(f"{name}=..." for name in values)
            raise SignatureError(
                diagnostic(
                    headline,
                    [f"graph.update() runs it with graph #{graph_id}'s current values: {given}"],
                    help=f"{hint}; or give the graph values that fit first (graph.launch({names})), or give "
                    "the op's sg.Param a name the graph lacks (it then keeps its default)",
                )
            ) from None
        return op.with_values(args)
