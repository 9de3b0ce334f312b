"""scopegraph's mypy plugin: borrow checking of graph ops before the program runs.

Enable it in your mypy configuration::

    [mypy]
    plugins = scopegraph.mypy_plugin

What it checks
--------------
In every call that builds a graph node (a kernel launch ``k[grid, block](...)``, ``sg.memcpy``,
``sg.memset``, the ``scopegraph.library`` helpers, and any function or method of yours whose
declared return type is a ``GraphNode`` subclass), the same *place* may not be passed both as a
mutable borrow and as another argument. The check is on the call that builds the op, so it holds
wherever the op is recorded: ``s.record``, or ``body.record`` inside ``with s.while_(flag) as
body:`` / ``s.if_`` / ``s.if_else`` (typed like ``Scope.record``)::

    s.record(add[g, b](y.mut(), y, x))
    # error: cannot borrow `y` as immutable because it is also borrowed as mutable  [scopegraph-borrow]
    # note: mutable borrow of `y` occurs here (argument 1)
    # note: immutable borrow of `y` occurs here (argument 2)

    s.record(swap[g, b](bufs[0].mut(), bufs[0].mut()))
    # error: cannot borrow `bufs[0]` as mutable more than once at a time  [scopegraph-borrow]

A place is a name (``x``), an attribute path (``layer.w``, ``self.bufs.norm``) or a subscript by
a literal (``bufs[0]``, ``cache["k"]``); a mutable borrow is ``place.mut()`` or
``sg.mut(place)``. Different places (``l.a`` and ``l.b``, ``bufs[0]`` and ``bufs[1]``) pass.
The error code ``scopegraph-borrow`` can be silenced per line like any other
(``# type: ignore[scopegraph-borrow]``).

It also names the kernel in mypy's messages for a launch (``Argument 1 to "axpy" has
incompatible type ...``), and lets a launch take a graph parameter where the kernel takes a
scalar: an ``sg.f32`` parameter accepts ``float`` or ``sg.Param[float]``, an ``sg.i32`` one
``int`` or ``sg.Param[int]`` (see ``scopegraph._params``).

What it cannot see
------------------
Aliases made by assignment (``z = y; add(y.mut(), z, ...)``), overlapping views
(``x[0:4].mut()`` with ``x[2:6]``), and anything computed at run time. The runtime tracker checks
the actual byte ranges of every op when it is built, so those still fail, with a BorrowError at
the line that builds the op. The two checks are complementary: the plugin finds the common
mistakes in CI before any code runs; the tracker is exact.

What plain typing already checks (no plugin needed): ``Scope.record`` accepts only
``GraphNode`` (recording ``sg.zeros(...)`` is an ``arg-type`` error), kernel arguments are typed
through ``ParamSpec`` (count, names, ``Mut[Tensor]`` against ``Tensor``, scalar kinds).
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.errorcodes import ErrorCode
from mypy.nodes import (
    CallExpr,
    Decorator,
    Expression,
    FuncDef,
    IndexExpr,
    IntExpr,
    MemberExpr,
    NameExpr,
    OverloadedFuncDef,
    RefExpr,
    StrExpr,
    TypeInfo,
)
from mypy.plugin import FunctionContext, MethodContext, MethodSigContext, Plugin
from mypy.types import CallableType, Instance, Parameters, ProperType, Type, UnionType, get_proper_type

BORROW = ErrorCode("scopegraph-borrow", "Conflicting borrows of one place in one graph op", "scopegraph")

_GRAPH_NODE = "scopegraph._ops.GraphNode"
_KERNEL_GETITEM = "scopegraph._kernel.Kernel.__getitem__"
_LAUNCHER = "scopegraph._kernel.Launcher"
_LAUNCHER_CALL = "scopegraph._kernel.Launcher.__call__"
_MUT_FUNCTIONS = ("scopegraph._tensor.mut",)
_PARAM = "scopegraph._params.Param"
_SCALARS = ("builtins.float", "builtins.int", "builtins.bool")


def place_of(expr: Expression) -> str | None:
    """``x``, ``a.b.c``, ``xs[0]`` or ``d["k"]`` as text; None for anything that is not a place."""
    if isinstance(expr, NameExpr):
        return expr.name
    if isinstance(expr, MemberExpr):
        base = place_of(expr.expr)
        return None if base is None else f"{base}.{expr.name}"
    if isinstance(expr, IndexExpr) and isinstance(expr.index, (IntExpr, StrExpr)):
        base = place_of(expr.base)
        return None if base is None else f"{base}[{expr.index.value!r}]"
    return None


def borrow_of(expr: Expression) -> tuple[str, bool] | None:
    """(place, is_mutable) for an argument expression that borrows a place, else None."""
    if isinstance(expr, CallExpr):
        callee = expr.callee
        if isinstance(callee, MemberExpr) and callee.name == "mut" and not expr.args:
            place = place_of(callee.expr)
            return None if place is None else (place, True)
        if isinstance(callee, RefExpr) and callee.fullname in _MUT_FUNCTIONS and len(expr.args) == 1:
            place = place_of(expr.args[0])
            return None if place is None else (place, True)
        return None
    place = place_of(expr)
    return None if place is None else (place, False)


def check_borrows(ctx: FunctionContext | MethodContext) -> Type:
    """Report the first conflicting pair of borrows among a graph-node call's arguments."""
    seen: dict[str, tuple[bool, int, Expression]] = {}
    args = [arg for group in ctx.args for arg in group]
    for position, arg in enumerate(args, start=1):
        borrow = borrow_of(arg)
        if borrow is None:
            continue
        place, mutable = borrow
        if place not in seen:
            seen[place] = (mutable, position, arg)
            continue
        was_mutable, first_position, first_arg = seen[place]
        if not (mutable or was_mutable):
            continue  # two shared borrows are fine
        if mutable and was_mutable:
            ctx.api.fail(f"cannot borrow `{place}` as mutable more than once at a time", ctx.context, code=BORROW)
            ctx.api.msg.note(
                f"first mutable borrow of `{place}` occurs here (argument {first_position})", first_arg, code=BORROW
            )
            ctx.api.msg.note(f"second mutable borrow of `{place}` occurs here (argument {position})", arg, code=BORROW)
        else:
            now, before = ("mutable", "immutable") if mutable else ("immutable", "mutable")
            ctx.api.fail(
                f"cannot borrow `{place}` as {now} because it is also borrowed as {before}", ctx.context, code=BORROW
            )
            for kind, pos, where in sorted(
                ((now, position, arg), (before, first_position, first_arg)), key=lambda t: t[1]
            ):
                ctx.api.msg.note(f"{kind} borrow of `{place}` occurs here (argument {pos})", where, code=BORROW)
        break
    return ctx.default_return_type


def _kernel_name(expr: Expression) -> str | None:
    """The kernel's name from ``k[...]``, ``mod.k[...]`` or ``k.generics(...)[...]``."""
    if isinstance(expr, IndexExpr):
        expr = expr.base
    if isinstance(expr, CallExpr) and isinstance(expr.callee, MemberExpr) and expr.callee.name == "generics":
        expr = expr.callee.expr
    if isinstance(expr, (NameExpr, MemberExpr)):
        return expr.name
    return None


def _is_graph_node(typ: ProperType) -> bool:
    return isinstance(typ, Instance) and typ.type.has_base(_GRAPH_NODE)


class ScopeGraphPlugin(Plugin):
    def _returns_graph_node(self, fullname: str) -> bool:
        sym = self.lookup_fully_qualified(fullname)
        node = sym.node if sym is not None else None
        if isinstance(node, TypeInfo):
            return node.has_base(_GRAPH_NODE)
        func = node.func if isinstance(node, Decorator) else node
        if not isinstance(func, (FuncDef, OverloadedFuncDef)):
            return False
        typ = get_proper_type(func.type)
        return isinstance(typ, CallableType) and _is_graph_node(get_proper_type(typ.ret_type))

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        return check_borrows if self._returns_graph_node(fullname) else None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        if fullname == _KERNEL_GETITEM:
            return self._launcher_type
        if fullname == _LAUNCHER_CALL or self._returns_graph_node(fullname):
            return check_borrows
        return None

    def get_method_signature_hook(self, fullname: str) -> Callable[[MethodSigContext], CallableType] | None:
        return self._launch_signature if fullname == _LAUNCHER_CALL else None

    def _launch_signature(self, ctx: MethodSigContext) -> CallableType:
        """The kernel's name in messages, and ``sg.Param[T]`` accepted where it takes a scalar ``T``."""
        signature = _name_the_kernel(ctx)
        sym = self.lookup_fully_qualified(_PARAM)
        if sym is None or not isinstance(sym.node, TypeInfo):
            return signature
        return _accept_params(sym.node, signature)

    def _launcher_type(self, ctx: MethodContext) -> Type:
        """``k[grid, block]`` as ``Launcher[P]``, so the call it makes reaches the hooks above."""
        ret = get_proper_type(ctx.default_return_type)
        if not isinstance(ret, CallableType):
            return ctx.default_return_type
        sym = self.lookup_fully_qualified(_LAUNCHER)
        if sym is None or not isinstance(sym.node, TypeInfo):
            return ctx.default_return_type
        return Instance(sym.node, [Parameters(ret.arg_types, ret.arg_kinds, ret.arg_names)])


def _name_the_kernel(ctx: MethodSigContext) -> CallableType:
    context = ctx.context
    name = _kernel_name(context.callee) if isinstance(context, CallExpr) else None
    return ctx.default_signature.copy_modified(name=name) if name else ctx.default_signature


def _accept_params(param: TypeInfo, signature: CallableType) -> CallableType:
    """A scalar parameter ``T`` (float, int, bool) also takes ``sg.Param[T]``."""
    widened: list[Type] = []
    for typ in signature.arg_types:
        proper = get_proper_type(typ)
        if isinstance(proper, Instance) and proper.type.fullname in _SCALARS:
            typ = UnionType([typ, Instance(param, [typ])])
        widened.append(typ)
    return signature.copy_modified(arg_types=widened)


def plugin(version: str) -> type[Plugin]:
    return ScopeGraphPlugin
