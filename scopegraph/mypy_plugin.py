"""scopegraph's mypy plugin: borrow checking of graph ops before the program runs.

Enable it in your mypy configuration::

    [mypy]
    plugins = scopegraph.mypy_plugin

What it checks
--------------
In every call that builds a graph node (a kernel launch ``k[grid, block](...)``, ``sg.memcpy``,
``sg.memset``, the ``scopegraph.library`` helpers, and any function, method, overload, local
function or callable parameter of yours whose type says it returns a ``GraphNode`` subclass or a
union of them, also through a decorator that keeps it a function, and ``functools.cache``; and a
generic helper whose call's type is an op, ``make(sg.memcpy, y.mut(), y)``), the
same *place* may not be passed both as a mutable borrow and as another argument. The check is
on the call that builds the op, so it holds wherever the op is recorded: ``s.record``, or
``body.record`` inside ``with s.while_(flag) as body:`` / ``s.if_`` / ``s.if_else`` (typed like
``Scope.record``)::

    s.record(add[g, b](y.mut(), y, x))
    # error: cannot borrow `y` as immutable because it is also borrowed as mutable  [scopegraph-borrow]
    # note: mutable borrow of `y` occurs here (argument 1)
    # note: immutable borrow of `y` occurs here (argument 2)

    s.record(swap[g, b](bufs[0].mut(), bufs[0].mut()))
    # error: cannot borrow `bufs[0]` as mutable more than once at a time  [scopegraph-borrow]

The same holds for the lists a captured region declares, ``s.capture(writes=[...], reads=[...])``
and ``body.capture(...)``. Notes name each argument as written (``argument 2``, ``argument
"src"``, ``writes[0]``), and every place in conflict gets its own error.

A place is a name (``x``), an attribute path (``layer.w``, ``self.bufs.norm``) or a subscript by
a literal or a name (``bufs[0]``, ``bufs[-1]``, ``cache["k"]``, ``layers[i]``), a slice among them
(``x[0:4]``, ``x[i:n]``); a mutable borrow is ``place.mut()``, ``sg.mut(place)``, ``sg.Mut(place)``
or ``Tensor.mut(place)``. Different
places (``l.a`` and ``l.b``, ``bufs[0]`` and ``bufs[1]``, ``bufs[i]`` and ``bufs[j]``) pass. A
call that assigns a name among its arguments (``:=``) has no places subscripted by a name; a
function called among them that rebinds a global the subscripts use is not seen (silence that
line).
The error code ``scopegraph-borrow`` can be silenced per line like any other
(``# type: ignore[scopegraph-borrow]`` on the call's first line silences its notes too).

It also names the kernel in mypy's messages for a launch (``Argument 1 to "axpy" has
incompatible type ...``), through a variable that holds ``axpy[grid, block]`` too (a kernel held
in a container is named by its place, ``kernels['axpy']``; one no expression names is "kernel
launch"). One variable may hold launchers of several kernels of one signature; it is named after
the first it was given. It lets a launch take a graph parameter or a numpy scalar where the
kernel takes a scalar, as a launch converts them: an ``sg.f32`` parameter accepts ``float``,
``sg.Param[float]``, or a numpy float or integer (``np.float32(0.5)``, ``np.int64(2)``), an
``sg.i32`` one ``int``, ``sg.Param[int]`` or a numpy integer (see ``scopegraph._params``;
``sg.Param("n", sg.i32, 1)`` is an ``sg.Param[int]`` wherever it stands, so it does not pass for
an ``sg.f32`` one; a numpy float, like a float, is not an int to mypy, though a launch takes one
whose value is integral). A ``bool`` for
an int or float scalar, which mypy's types let through (a bool is an int) and scopegraph refuses
when the launch is built, is an ``arg-type`` error, in a launch and in a ``scopegraph.library``
helper (``axpy_op(y.mut(), x, True)``).

What it cannot see
------------------
Aliases made by assignment (``z = y; add(y.mut(), z, ...)``), overlapping views
(``x[0:4].mut()`` with ``x[2:6]``, or with ``x``), subscripts by anything but a literal or a name
(``layers[i + 1]``, ``layers[self.i]``), names of one value (``layers[i]`` and ``layers[j]`` where
``i == j``), one element written two ways (``bufs[-1]`` and ``bufs[1]`` of a two-element list), a
callable that no name reaches (``ops["copy"](...)``,
``factory()(...)``, a property that returns a function), and anything computed at run time. The
runtime tracker checks the actual byte ranges of every op when it is built, so those still fail,
with a BorrowError at the line that builds the op. The two checks are complementary: the plugin finds the common
mistakes in CI before any code runs; the tracker is exact.

What plain typing already checks (no plugin needed): ``Scope.record`` accepts only
``GraphNode`` (recording ``sg.zeros(...)`` is an ``arg-type`` error), kernel arguments are typed
through ``ParamSpec`` (count, names, ``Mut[Tensor]`` against ``Tensor``, scalar kinds).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence

from mypy.errorcodes import ARG_TYPE, ErrorCode
from mypy.messages import MessageBuilder
from mypy.nodes import (
    ARG_NAMED,
    ARG_POS,
    AssignmentExpr,
    CallExpr,
    Decorator,
    Expression,
    FloatExpr,
    FuncDef,
    IndexExpr,
    IntExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    OpExpr,
    OverloadedFuncDef,
    RefExpr,
    SliceExpr,
    StarExpr,
    StrExpr,
    TupleExpr,
    TypeInfo,
    UnaryExpr,
    Var,
)
from mypy.plugin import FunctionContext, MethodContext, MethodSigContext, Plugin
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    LiteralType,
    NoneType,
    Overloaded,
    Parameters,
    Type,
    TypeOfAny,
    TypeVarType,
    UnionType,
    get_proper_type,
)

BORROW = ErrorCode("scopegraph-borrow", "Conflicting borrows of one place in one graph op", "scopegraph")

_GRAPH_NODE = "scopegraph._ops.GraphNode"
_OP = "scopegraph._ops.Op"
_LIBRARY = "scopegraph.library."
_KERNEL_GETITEM = "scopegraph._kernel.Kernel.__getitem__"
_LAUNCHER = "scopegraph._kernel.Launcher"
_LAUNCHER_CALL = "scopegraph._kernel.Launcher.__call__"
# functools.cache and functools.lru_cache wrap a function in an object whose __call__ returns the
# function's return type: a cached helper that builds a graph node is checked like the helper.
_LRU_CACHE_CALL = "functools._lru_cache_wrapper.__call__"
# A mutable borrow by a call of one argument: sg.mut(x), sg.Mut(x) (and Tensor.mut(x), by the class).
_MUT_FUNCTIONS = ("scopegraph._tensor.mut", "scopegraph._tensor.Mut")
_TENSOR = "scopegraph._tensor.Tensor"
# A captured region's node borrows what its writes= and reads= lists name (scopegraph._capture).
_CAPTURES = ("scopegraph._scope.Scope.capture", "scopegraph._control.Body.capture")
_PARAM = "scopegraph._params.Param"
_SCALARS = ("builtins.float", "builtins.int", "builtins.bool")
# The numpy scalars a launch converts (DType.scalar) where a kernel takes each of _SCALARS: a float
# takes numpy's floats and integers, an int numpy's integers, a bool numpy's bool.
_NUMPY_SCALARS = {
    "builtins.float": ("numpy.floating", "numpy.integer"),
    "builtins.int": ("numpy.integer",),
    "builtins.bool": ("numpy.bool",),
}
# What a launch is called in messages when its kernel cannot be named from the code.
_UNNAMED_LAUNCH = "kernel launch"


def place_of(expr: Expression, quoted: bool = False, by_name: bool = True) -> str | None:
    """``x``, ``a.b.c``, ``xs[0]``, ``xs[-1]``, ``d["k"]``, ``xs[i]`` or ``x[0:n]`` as text; None
    for anything that is not a place. A string key is in double quotes, as formatters write code,
    unless the text goes inside mypy's own double quotes (``quoted``): there ``d['k']``. Subscripts
    by a name (``xs[i]``, ``x[i:n]``) count only ``by_name``: among the arguments of one call a
    name holds one value, unless one of them assigns it (``:=``)."""
    if isinstance(expr, NameExpr):
        return expr.name
    if isinstance(expr, MemberExpr):
        base = place_of(expr.expr, quoted, by_name)
        return None if base is None else f"{base}.{expr.name}"
    if isinstance(expr, IndexExpr):
        index = expr.index
        if isinstance(index, StrExpr):
            key: str | None = repr(index.value) if quoted else json.dumps(index.value, ensure_ascii=False)
        elif isinstance(index, SliceExpr):
            key = _slice_text(index, by_name)
        else:
            key = _subscript(index, by_name)
        base = None if key is None else place_of(expr.base, quoted, by_name)
        return None if base is None else f"{base}[{key}]"
    return None


def _subscript(index: Expression, by_name: bool) -> str | None:
    """An int literal (``-1`` as Python writes it) or, ``by_name``, a name as text; else None."""
    if isinstance(index, IntExpr):
        return str(index.value)
    if isinstance(index, UnaryExpr) and index.op == "-" and isinstance(index.expr, IntExpr):
        return str(-index.expr.value)
    if by_name and isinstance(index, NameExpr):
        return index.name
    return None


def _slice_text(index: SliceExpr, by_name: bool) -> str | None:
    """``0:n`` or ``::2`` as written, when each bound given is one a subscript may be; else None."""
    texts: list[str] = []
    for bound in (index.begin_index, index.end_index, *([index.stride] if index.stride is not None else [])):
        text = "" if bound is None else _subscript(bound, by_name)
        if text is None:
            return None
        texts.append(text)
    return ":".join(texts)


def _may_assign(expr: Expression) -> bool:
    """Whether ``expr`` may assign a name of the caller (``:=``). Only the forms a call's arguments
    commonly take are looked into; any other (a comprehension) counts as one that may."""
    if isinstance(expr, (NameExpr, IntExpr, StrExpr, FloatExpr, LambdaExpr)):  # a lambda's := is its own
        return False
    if isinstance(expr, AssignmentExpr):
        return True
    if isinstance(expr, CallExpr):
        return _may_assign(expr.callee) or any(map(_may_assign, expr.args))
    if isinstance(expr, MemberExpr):
        return _may_assign(expr.expr)
    if isinstance(expr, IndexExpr):
        return _may_assign(expr.base) or _may_assign(expr.index)
    if isinstance(expr, SliceExpr):
        return any(_may_assign(e) for e in (expr.begin_index, expr.end_index, expr.stride) if e is not None)
    if isinstance(expr, (UnaryExpr, StarExpr)):
        return _may_assign(expr.expr)
    if isinstance(expr, OpExpr):
        return _may_assign(expr.left) or _may_assign(expr.right)
    if isinstance(expr, (ListExpr, TupleExpr)):
        return any(map(_may_assign, expr.items))
    return True


def borrow_of(expr: Expression, by_name: bool = True) -> tuple[str, bool] | None:
    """(place, is_mutable) for an argument expression that borrows a place, else None."""
    if isinstance(expr, CallExpr):
        callee = expr.callee
        if isinstance(callee, MemberExpr) and callee.name == "mut" and not expr.args:
            place = place_of(callee.expr, by_name=by_name)
            return None if place is None else (place, True)
        if len(expr.args) == 1 and (
            (isinstance(callee, RefExpr) and callee.fullname in _MUT_FUNCTIONS)
            or (  # Tensor.mut(x), through the class
                isinstance(callee, MemberExpr)
                and callee.name == "mut"
                and isinstance(callee.expr, RefExpr)
                and callee.expr.fullname == _TENSOR
            )
        ):
            place = place_of(expr.args[0], by_name=by_name)
            return None if place is None else (place, True)
        return None
    place = place_of(expr, by_name=by_name)
    return None if place is None else (place, False)


def check_graph_node_call(ctx: FunctionContext | MethodContext) -> Type:
    """A call whose type says it builds an op (other calls pass untouched): its borrows. Any op,
    not only a graph node: a generic helper's call may be typed by its context (``stream.run``
    takes an ``Op[R]``), and no op takes one place both mutably and again."""
    if _makes_graph_node(ctx.default_return_type, _OP):
        check_borrows(ctx)
    return ctx.default_return_type


def check_launch(ctx: MethodContext) -> Type:
    """A kernel launch (a ``Launcher``'s call): its borrows and its scalar arguments."""
    check_borrows(ctx)
    check_scalars(ctx)
    return ctx.default_return_type


def check_borrows(ctx: FunctionContext | MethodContext) -> None:
    """Report conflicting borrows among a graph-node call's arguments, in the order written."""
    report_conflicts(ctx, written_arguments(ctx))


def written_arguments(ctx: FunctionContext | MethodContext) -> list[tuple[str, Expression]]:
    """The call's arguments in the order written, each with its label in notes."""
    call = ctx.context
    if not isinstance(call, CallExpr):
        return [(f"argument {i}", arg) for i, arg in enumerate((a for group in ctx.args for a in group), start=1)]
    parts = zip(call.args, call.arg_kinds, call.arg_names, strict=True)
    return [
        (f'argument "{name}"' if name is not None else f"argument {position}", arg)
        for position, (arg, kind, name) in enumerate(parts, start=1)
        if kind in (ARG_POS, ARG_NAMED)  # *args and **kwargs name no place
    ]


def check_forwarding_helper(signature: CallableType, method: bool) -> Callable[[FunctionContext | MethodContext], Type]:
    """A generic helper that forwards ``*args: P.args, **kwargs: P.kwargs`` to the callable that
    builds its op (``make(sg.memcpy, y.mut(), y)``): when the call's type is an op, the borrows
    among the arguments that go to ``*args`` and ``**kwargs``, the only ones that reach the op."""
    kinds = signature.arg_kinds[1:] if method else signature.arg_kinds  # a method's call has no `self`
    names = signature.arg_names[1:] if method else signature.arg_names
    before_star = next((i for i, kind in enumerate(kinds) if kind.is_star()), len(kinds))
    own_names = {name for name, kind in zip(names, kinds, strict=True) if not kind.is_star()}

    def check(ctx: FunctionContext | MethodContext) -> Type:
        call = ctx.context
        if _makes_graph_node(ctx.default_return_type, _OP) and isinstance(call, CallExpr):
            forwarded = {
                id(arg)
                for position, (arg, kind, name) in enumerate(
                    zip(call.args, call.arg_kinds, call.arg_names, strict=True)
                )
                if (kind == ARG_POS and position >= before_star) or (kind == ARG_NAMED and name not in own_names)
            }
            report_conflicts(ctx, [(label, arg) for label, arg in written_arguments(ctx) if id(arg) in forwarded])
        return ctx.default_return_type

    return check


def check_capture(ctx: MethodContext) -> Type:
    """``s.capture(writes=[...], reads=[...])`` / ``body.capture(...)``: the region's node borrows
    what the two lists name, as a graph-node call borrows its arguments."""
    call = ctx.context
    if isinstance(call, CallExpr):
        listed: list[tuple[str, Expression]] = []
        for arg, name in zip(call.args, call.arg_names, strict=True):
            if name in ("writes", "reads") and isinstance(arg, (ListExpr, TupleExpr)):
                listed += [(f"{name}[{i}]", item) for i, item in enumerate(arg.items)]
        report_conflicts(ctx, listed)
    return ctx.default_return_type


def report_conflicts(ctx: FunctionContext | MethodContext, arguments: list[tuple[str, Expression]]) -> None:
    """One error for each place borrowed mutably and borrowed again among ``arguments`` (label, expression)."""
    seen: dict[str, tuple[bool, str, Expression]] = {}
    reported: set[str] = set()
    call = ctx.context  # every argument of the call, *args and other keywords too, may assign a name
    by_name = not any(map(_may_assign, call.args if isinstance(call, CallExpr) else [a for _, a in arguments]))
    for label, arg in arguments:
        borrow = borrow_of(arg, by_name)
        if borrow is None:
            continue
        place, mutable = borrow
        if place not in seen:
            seen[place] = (mutable, label, arg)
            continue
        was_mutable, first_label, first_arg = seen[place]
        if not (mutable or was_mutable) or place in reported:
            continue  # two shared borrows are fine
        reported.add(place)
        if mutable and was_mutable:
            ctx.api.fail(f"cannot borrow `{place}` as mutable more than once at a time", ctx.context, code=BORROW)
            _note(ctx, f"first mutable borrow of `{place}` occurs here ({first_label})", first_arg)
            _note(ctx, f"second mutable borrow of `{place}` occurs here ({label})", arg)
            continue
        # Worded as rustc does: the later borrow is the one refused.
        now, before = ("mutable", "immutable") if mutable else ("immutable", "mutable")
        ctx.api.fail(
            f"cannot borrow `{place}` as {now} because it is also borrowed as {before}", ctx.context, code=BORROW
        )
        _note(ctx, f"{before} borrow of `{place}` occurs here ({first_label})", first_arg)
        _note(ctx, f"{now} borrow of `{place}` occurs here ({label})", arg)


# The call is each note's origin, so that a `# type: ignore[scopegraph-borrow]` on the call's line
# silences the notes with the error, on whichever lines the arguments sit (a launch that a
# formatter spread over lines). mypy 1.x names the parameter `origin`, 2.x `origin_context`.
_ORIGIN = "origin_context" if "origin_context" in inspect.signature(MessageBuilder.note).parameters else "origin"


def _note(ctx: FunctionContext | MethodContext, message: str, at: Expression) -> None:
    ctx.api.msg.note(message, at, code=BORROW, **{_ORIGIN: ctx.context})  # type: ignore[arg-type]


def check_scalars(ctx: MethodContext) -> None:
    """A bool where a kernel takes an int or float scalar: mypy lets it through (a bool is an int),
    and scopegraph refuses it when the launch is built, so it is an ``arg-type`` error here too."""
    launcher = ctx.type
    declared = get_proper_type(launcher.args[0]) if isinstance(launcher, Instance) else None
    if isinstance(declared, Parameters):
        refuse_bools(ctx, declared.arg_types, _launch_name(launcher))


def check_library_helper(signature: CallableType, name: str) -> Callable[[FunctionContext], Type]:
    """A ``scopegraph.library`` helper (``axpy_op``): its borrows, and no bool where it takes a
    scalar (which becomes a kernel scalar)."""

    def check(ctx: FunctionContext) -> Type:
        check_borrows(ctx)
        refuse_bools(ctx, signature.arg_types, name)
        return ctx.default_return_type

    return check


def refuse_bools(ctx: FunctionContext | MethodContext, formals: Sequence[Type], name: str) -> None:
    """An ``arg-type`` error for each bool given where ``formals`` take an int or a float (alone, or
    in a union with ``sg.Param``)."""
    if len(formals) != len(ctx.args) or not isinstance(ctx.context, CallExpr):
        return
    for formal, actuals, types in zip(formals, ctx.args, ctx.arg_types, strict=True):
        scalar = _scalar_name(formal)
        if scalar is None:
            continue
        for actual, typ in zip(actuals, types, strict=True):
            given = get_proper_type(typ)
            if isinstance(given, LiteralType):
                given = given.fallback
            if isinstance(given, Instance) and given.type.fullname == "builtins.bool":
                # Numbered or named as mypy's own messages do.
                at = next((i for i, arg in enumerate(ctx.context.args) if arg is actual), None)
                if at is None:  # an argument unpacked from *args or **kwargs
                    continue
                keyword = ctx.context.arg_names[at]
                argument = f'"{keyword}"' if keyword is not None else str(at + 1)
                ctx.api.fail(
                    f'Argument {argument} to "{name}" has incompatible type "bool"; expected "{scalar}" '
                    "(a kernel scalar takes no bool: scopegraph refuses it when the launch is built)",
                    actual,
                    code=ARG_TYPE,
                )


def _scalar_name(formal: Type) -> str | None:
    """ "int" or "float" for a parameter that takes a kernel scalar (or an ``sg.Param`` of one)."""
    proper = get_proper_type(formal)
    items = [get_proper_type(t) for t in proper.items] if isinstance(proper, UnionType) else [proper]
    for item in items:
        if isinstance(item, Instance) and item.type.fullname in ("builtins.int", "builtins.float"):
            return item.type.name
    return None


def _kernel_name(expr: Expression) -> str | None:
    """The kernel's name from ``k[...]``, ``mod.k[...]`` or ``k.generics(...)[...]``; for a kernel
    held in a container, the place that holds it (``kernels['axpy']``: mypy quotes the name)."""
    if isinstance(expr, IndexExpr):
        expr = expr.base
    if isinstance(expr, CallExpr) and isinstance(expr.callee, MemberExpr) and expr.callee.name == "generics":
        expr = expr.callee.expr
    if isinstance(expr, (NameExpr, MemberExpr)):
        return expr.name
    return place_of(expr, quoted=True)


def _makes_graph_node(typ: Type, base: str = _GRAPH_NODE) -> bool:
    """A GraphNode (``base``) subclass, or a union of them (``sg.Memcpy | sg.Memset``, None allowed)."""
    proper = get_proper_type(typ)
    items = [get_proper_type(t) for t in proper.items] if isinstance(proper, UnionType) else [proper]
    nodes = [t for t in items if not isinstance(t, NoneType)]
    return bool(nodes) and all(isinstance(t, Instance) and t.type.has_base(base) for t in nodes)


def _may_make_graph_node(typ: Type | None) -> bool:
    """Whether calling something of this type may return a graph node (a function or an overload):
    one that returns a GraphNode, or a type variable (a generic helper, ``make(sg.memcpy, ...)``:
    the call's own return type decides)."""
    proper = get_proper_type(typ)
    if isinstance(proper, CallableType):
        return _makes_graph_node(proper.ret_type, _OP) or isinstance(get_proper_type(proper.ret_type), TypeVarType)
    if isinstance(proper, Overloaded):
        return any(_may_make_graph_node(item) for item in proper.items)
    return False


class ScopeGraphPlugin(Plugin):
    def _op_call_hook(self, fullname: str, method: bool) -> Callable[[FunctionContext | MethodContext], Type] | None:
        """The check of a call of the function, class, overload or variable ``fullname`` if it may
        build an op. The check looks at each call's own return type, so this may only err on the
        side of yes."""
        sym = self.lookup_fully_qualified(fullname)
        node = sym.node if sym is not None else None
        if isinstance(node, TypeInfo):
            return check_graph_node_call if node.has_base(_OP) else None
        if isinstance(node, Decorator):
            # The decorated type where mypy has it (a decorator may change what a call returns).
            typ = node.var.type or node.func.type
        elif isinstance(node, (FuncDef, OverloadedFuncDef, Var)):
            typ = node.type
        else:
            return None
        proper = get_proper_type(typ)
        generic = isinstance(proper, CallableType) and isinstance(get_proper_type(proper.ret_type), TypeVarType)
        if isinstance(proper, CallableType) and generic and any(kind.is_star() for kind in proper.arg_kinds):
            return check_forwarding_helper(proper, method)
        return check_graph_node_call if _may_make_graph_node(typ) else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        if fullname.startswith(_LIBRARY):
            sym = self.lookup_fully_qualified(fullname)
            helper = sym.node if sym is not None else None
            signature = helper.type if isinstance(helper, FuncDef) else None
            if isinstance(signature, CallableType) and _makes_graph_node(signature.ret_type):
                return check_library_helper(signature, fullname.removeprefix(_LIBRARY))
        # A bare name is a local (a parameter, a local function or variable), which cannot be
        # looked up: the hook looks at the call's own type instead.
        return check_graph_node_call if fullname.isidentifier() else self._op_call_hook(fullname, method=False)

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        if fullname == _KERNEL_GETITEM:
            return self._launcher_type
        if fullname == _LAUNCHER_CALL:
            return check_launch
        if fullname in _CAPTURES:
            return check_capture
        return check_graph_node_call if fullname == _LRU_CACHE_CALL else self._op_call_hook(fullname, method=True)

    def get_method_signature_hook(self, fullname: str) -> Callable[[MethodSigContext], CallableType] | None:
        return self._launch_signature if fullname == _LAUNCHER_CALL else None

    def _launch_signature(self, ctx: MethodSigContext) -> CallableType:
        """The kernel's name in messages, and ``sg.Param[T]`` and numpy's scalars accepted where it
        takes a scalar ``T``."""
        # No definition: mypy would point at Launcher.__call__ in scopegraph._kernel as where the
        # user's kernel is "defined" (a note under an unexpected keyword argument).
        signature = ctx.default_signature.copy_modified(name=_launch_name(ctx.type), definition=None)
        sym = self.lookup_fully_qualified(_PARAM)
        if sym is None or not isinstance(sym.node, TypeInfo):
            return signature
        return _accept_params(sym.node, self._numpy_scalars(), signature)

    def _numpy_scalars(self) -> dict[str, list[Instance]]:
        """_NUMPY_SCALARS as types, those that this program's numpy has."""
        found: dict[str, list[Instance]] = {}
        for scalar, names in _NUMPY_SCALARS.items():
            for name in names:
                sym = self.lookup_fully_qualified(name)
                if sym is not None and isinstance(sym.node, TypeInfo):
                    args = [AnyType(TypeOfAny.special_form)] * len(sym.node.defn.type_vars)
                    found.setdefault(scalar, []).append(Instance(sym.node, args))
        return found

    def _launcher_type(self, ctx: MethodContext) -> Type:
        """``k[grid, block]`` as ``Launcher[P, Literal["k"] | str]``: its call reaches the hooks
        above, and the kernel's name travels in the type, through variables too (mypy drops a
        callable's own name when it infers a variable's type)."""
        ret = get_proper_type(ctx.default_return_type)
        sym = self.lookup_fully_qualified(_LAUNCHER)
        if not isinstance(ret, CallableType) or sym is None or not isinstance(sym.node, TypeInfo):
            return ctx.default_return_type
        text = ctx.api.named_generic_type("builtins.str", [])
        name = _kernel_name(ctx.context) if isinstance(ctx.context, IndexExpr) else None
        return Instance(
            sym.node,
            [
                Parameters(ret.arg_types, ret.arg_kinds, ret.arg_names),
                # Literal["k"] | str, kept unsimplified: launchers of two kernels of one signature
                # are then one type to mypy, so one variable may hold either.
                text if name is None else UnionType([LiteralType(name, fallback=text), text]),
            ],
        )


def _launch_name(launcher: Type) -> str:
    """The kernel's name that ``Launcher[P, Literal["k"] | str]`` carries (see _launcher_type)."""
    proper = get_proper_type(launcher)
    name = get_proper_type(proper.args[1]) if isinstance(proper, Instance) and len(proper.args) == 2 else None
    if isinstance(name, UnionType):
        name = get_proper_type(name.items[0])
    return name.value if isinstance(name, LiteralType) and isinstance(name.value, str) else _UNNAMED_LAUNCH


def _accept_params(param: TypeInfo, numpy_scalars: dict[str, list[Instance]], signature: CallableType) -> CallableType:
    """A scalar parameter ``T`` (float, int, bool) also takes ``sg.Param[T]`` and numpy's scalars
    of its kind."""
    widened: list[Type] = []
    for typ in signature.arg_types:
        proper = get_proper_type(typ)
        if isinstance(proper, Instance) and proper.type.fullname in _SCALARS:
            typ = UnionType([typ, Instance(param, [typ]), *numpy_scalars.get(proper.type.fullname, ())])
        widened.append(typ)
    return signature.copy_modified(arg_types=widened)


def plugin(version: str) -> type[Plugin]:
    return ScopeGraphPlugin
