"""Kernels: CUDA C++ source plus a Python signature that declares how each argument is used.

    @sg.kernel(SOURCE)
    def axpy(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i32) -> None: ...

``Mut[Tensor]`` parameters are written, ``Tensor`` parameters are read, scalar parameters carry
their C type. ``Annotated[Tensor, sg.TensorSpec(sg.f32, rank=2)]`` also pins dtype and rank.
Arguments are checked when the launch op is built (``axpy[grid, block](...)``), so the
traceback points at the user's line. The same declaration serves the CUDA backend (pointers
and typed scalars for cuda.core's ``launch``) and the host backend (numpy views for the
``@axpy.host`` reference).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, ParamSpec, get_args, get_origin, get_type_hints

import numpy as np

from ._dtypes import DType, as_dtype, dtype_of_annotation
from ._errors import SignatureError, diagnostic
from ._ops import GraphNode, borrowed_tensor
from ._borrow import Borrow
from ._params import Param
from ._tensor import Mut, Tensor

if TYPE_CHECKING:
    from ._stream import Stream

P = ParamSpec("P")

Dim = int | tuple[int] | tuple[int, int] | tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Constraints on a tensor parameter, used as ``Annotated[Tensor, TensorSpec(sg.f32, rank=1)]``."""

    dtype: Any = None
    rank: int | None = None

    def resolved_dtype(self) -> DType | None:
        return None if self.dtype is None else as_dtype(self.dtype)


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One declared parameter: ``kind`` is "mut", "shared" or "scalar"."""

    name: str
    kind: str
    dtype: DType | None
    rank: int | None

    def describe(self) -> str:
        if self.kind == "scalar":
            assert self.dtype is not None
            return f"{self.name}: sg.{self.dtype.name}"
        base = "Mut[Tensor]" if self.kind == "mut" else "Tensor"
        extra = [f"dtype {self.dtype.name}"] if self.dtype else []
        extra += [f"rank {self.rank}"] if self.rank is not None else []
        return f"{self.name}: {base}" + (f" ({', '.join(extra)})" if extra else "")


def _parse_param(name: str, annotation: object, kernel_name: str) -> KernelParam:
    spec = TensorSpec()
    if get_origin(annotation) is Annotated:
        args = get_args(annotation)
        specs = [m for m in args[1:] if isinstance(m, TensorSpec)]
        if specs:
            spec = specs[0]
            annotation = args[0]
    if get_origin(annotation) is Mut or annotation is Mut:
        return KernelParam(name, "mut", spec.resolved_dtype(), spec.rank)
    if annotation is Tensor:
        return KernelParam(name, "shared", spec.resolved_dtype(), spec.rank)
    scalar = dtype_of_annotation(annotation)
    if scalar is not None:
        return KernelParam(name, "scalar", scalar, None)
    raise SignatureError(
        diagnostic(
            f"kernel `{kernel_name}` parameter `{name}` has annotation {annotation!r}",
            ["kernel parameters are Mut[Tensor] (written), Tensor (read) or a scalar type (sg.f32, sg.i32, ...)"],
            help=f"annotate `{name}` with one of those",
        )
    )


def _parse_signature(fn: Callable[..., None], kernel_name: str) -> tuple[KernelParam, ...]:
    try:
        hints = get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise SignatureError(
            f"cannot resolve the annotations of kernel `{kernel_name}`: {exc}\n"
            "help: import every name the annotations use at module level (sg.f32, Tensor, Mut, ...)"
        ) from exc
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise SignatureError(
                f"kernel `{kernel_name}` parameter `{p.name}` is {p.kind.description}\n"
                "help: declare every kernel parameter as a plain positional parameter"
            )
        if p.name not in hints:
            raise SignatureError(f"kernel `{kernel_name}` parameter `{p.name}` has no annotation\nhelp: annotate it")
        params.append(_parse_param(p.name, hints[p.name], kernel_name))
    return tuple(params)


# What every CUDA GPU accepts (compute capability 5.0 and later); checked on every backend so a
# launch that the host backend runs is one a GPU runs too.
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SHARED_BYTES = 48 * 1024
_AXES = "xyz"


def _dim3(value: object, what: str, kernel_name: str) -> tuple[int, int, int]:
    if type(value) is int and 0 < value <= 1024:  # the common case, in users' inner loops
        return (value, 1, 1)
    dims = value if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise SignatureError(
            f"`{kernel_name}` {what} {value!r} is not 1 to 3 positive integers\n"
            f"help: launch as {kernel_name}[grid, block](...) with e.g. grid=(64,) and block=(256,)"
        )
    padded = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    limits = MAX_GRID if what == "grid" else MAX_BLOCK
    for axis, d, limit in zip(_AXES, padded, limits):
        if d > limit:
            raise SignatureError(
                f"`{kernel_name}` {what} {value!r}: {what}.{axis} = {d} exceeds the CUDA limit of {limit}\n"
                f"help: keep {what}.{axis} <= {limit}"
                + ("; spread the work over more blocks instead" if what == "block" else "; put the extra work in x, or loop in the kernel")
            )
    if what == "block" and padded[0] * padded[1] * padded[2] > MAX_THREADS_PER_BLOCK:
        raise SignatureError(
            f"`{kernel_name}` block {value!r} has {padded[0] * padded[1] * padded[2]} threads; "
            f"a block holds at most {MAX_THREADS_PER_BLOCK}\nhelp: use smaller blocks and more of them"
        )
    return padded  # type: ignore[return-value]


def _shared_bytes(value: object, kernel_name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_DYNAMIC_SHARED_BYTES:
        raise SignatureError(
            f"`{kernel_name}` dynamic shared memory {value!r} is not 0..{MAX_DYNAMIC_SHARED_BYTES} bytes\n"
            f"help: launch as {kernel_name}[grid, block, shared_bytes] with at most 48 KiB"
        )
    return int(value)


# Names a `touches` expression may use besides the kernel's scalar parameters.
LAUNCH_NAMES = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.Name, ast.Load, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)


@dataclass(frozen=True, slots=True)
class Touches:
    """How many elements a launch touches in its tensor parameters: expressions over the scalar
    parameters and the launch's grid and block sizes (``touches={"w": "n * k"}``), compiled
    into one function that computes them all."""

    params: tuple[int, ...]  # the tensor parameters' positions
    names: tuple[str, ...]
    expressions: tuple[str, ...]
    count: Callable[..., tuple[int, ...]]  # (*scalars, *grid, *block) -> one count per parameter


def _parse_touches(touches: Mapping[str, str], params: tuple[KernelParam, ...], kernel_name: str) -> Touches | None:
    if not touches:
        return None
    tensor_params = {p.name: i for i, p in enumerate(params) if p.kind != "scalar"}
    scalars = [p.name for p in params if p.kind == "scalar"]
    help = (
        f'map a tensor parameter ({", ".join(tensor_params) or "none declared"}) to an expression of '
        f'{", ".join(scalars + list(LAUNCH_NAMES))} with + - * //, e.g. touches={{"out": "n"}}'
    )
    sources = []
    for name, expression in touches.items():
        if name not in tensor_params:
            raise SignatureError(f"kernel `{kernel_name}`: touches names `{name}`, which is not a tensor parameter\nhelp: {help}")
        try:
            tree = ast.parse(str(expression), mode="eval")
        except SyntaxError:
            raise SignatureError(f"kernel `{kernel_name}`: touches[{name!r}] = {expression!r} is not an expression\nhelp: {help}") from None
        for node in ast.walk(tree):
            bad = (
                not isinstance(node, _ALLOWED_NODES)
                or (isinstance(node, ast.Name) and node.id not in scalars and node.id not in LAUNCH_NAMES)
                or (isinstance(node, ast.Constant) and (type(node.value) is not int))
            )
            if bad:
                what = f"`{node.id}`" if isinstance(node, ast.Name) else f"`{ast.unparse(node)}`" if isinstance(node, ast.expr) else type(node).__name__
                raise SignatureError(f"kernel `{kernel_name}`: touches[{name!r}] = {expression!r} uses {what}\nhelp: {help}")
        sources.append(ast.unparse(tree))
    # Only names, int constants and + - * // remain: evaluating it runs no other code.
    count = eval(f"lambda {', '.join(scalars + list(LAUNCH_NAMES))}: ({', '.join(sources)},)", {"__builtins__": {}})
    return Touches(tuple(tensor_params[n] for n in touches), tuple(touches), tuple(map(str, touches.values())), count)


def _check_pdl(pdl: bool, early: tuple[str, ...], params: tuple[KernelParam, ...], kernel_name: str) -> frozenset[str]:
    """``reads_before_wait`` names read-only tensor parameters of a ``pdl=True`` kernel."""
    if early and not pdl:
        raise SignatureError(
            f"kernel `{kernel_name}` names reads_before_wait={early!r} but is not declared pdl=True\n"
            "help: reads before griddepcontrol.wait only mean something for a PDL kernel: add pdl=True"
        )
    kinds = {p.name: p.kind for p in params}
    for name in early:
        if kinds.get(name) != "shared":
            what = "a Mut[Tensor] parameter (written)" if kinds.get(name) == "mut" else "not a tensor parameter"
            raise SignatureError(
                f"kernel `{kernel_name}`: reads_before_wait names `{name}`, which is {what}\n"
                f"help: name read-only Tensor parameters ({', '.join(n for n, k in kinds.items() if k == 'shared') or 'none declared'}); "
                "a PDL kernel writes nothing before it waits"
            )
    return frozenset(early)


class Kernel(Generic[P]):
    """A CUDA C++ kernel with its Python declaration. ``k[grid, block](*args)`` builds a launch op."""

    def __init__(
        self,
        fn: Callable[P, None],
        source: str,
        cpp_name: str,
        options: tuple[tuple[str, object], ...] = (),
        template_args: tuple[str, ...] = (),
        host_fn: Callable[..., None] | None = None,
        params: tuple[KernelParam, ...] | None = None,
        touches: Mapping[str, str] | Touches | None = None,
        pdl: bool = False,
        reads_before_wait: Sequence[str] | frozenset[str] = (),
    ) -> None:
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.source = source
        self.cpp_name = cpp_name
        self.options = options
        self.template_args = template_args
        self.host_fn = host_fn
        self.params = params if params is not None else _parse_signature(fn, cpp_name)
        # How many elements each launch touches per tensor parameter, checked when a launch is built.
        self.touches = touches if isinstance(touches, Touches) or touches is None else _parse_touches(touches, self.params, cpp_name)
        # Programmatic dependent launch (DESIGN.md section 7, scopegraph._pdl): the kernel waits
        # (griddepcontrol.wait) before it touches its predecessors' results; before the wait it
        # only reads the read-only parameters named in reads_before_wait (weights).
        self.pdl = pdl
        self.reads_before_wait = _check_pdl(
            pdl, (reads_before_wait,) if isinstance(reads_before_wait, str) else tuple(reads_before_wait), self.params, cpp_name
        )
        # Instantiations made by generics(), so each one compiles (and is cached) once.
        self._instances: dict[tuple[str, ...], Kernel[P]] = {}
        # Compiled per device by the CUDA backend: device key -> cuda.core Kernel.
        self.compiled: dict[object, object] = {}

    @property
    def name_expression(self) -> str:
        """The C++ expression NVRTC resolves: ``name`` or ``name<args>`` for a template."""
        if not self.template_args:
            return self.cpp_name
        return f"{self.cpp_name}<{', '.join(self.template_args)}>"

    def __repr__(self) -> str:
        sig = ", ".join(p.describe() for p in self.params)
        return f"<kernel {self.name_expression}({sig})>"

    def host(self, fn: Callable[..., None]) -> Callable[..., None]:
        """Register a numpy reference, used by the host backend: it gets numpy views of the tensors."""
        self.host_fn = fn
        for inst in self._instances.values():
            inst.host_fn = fn
        return fn

    def generics(self, *args: object) -> Kernel[P]:
        """The instantiation of a C++ template kernel with these template arguments."""
        key = tuple(_template_arg(a) for a in args)
        inst = self._instances.get(key)
        if inst is None:
            inst = Kernel(
                self.__wrapped__, self.source, self.cpp_name, self.options, key, self.host_fn, self.params, self.touches,
                self.pdl, self.reads_before_wait,
            )
            self._instances[key] = inst
        return inst

    def __getitem__(self, launch: tuple[Dim, Dim] | tuple[Dim, Dim, int]) -> Callable[P, KernelLaunch]:
        if not isinstance(launch, tuple) or len(launch) not in (2, 3):
            raise SignatureError(
                f"launch `{self.cpp_name}` as {self.cpp_name}[grid, block](...) or [grid, block, shared_bytes]"
            )
        grid = _dim3(launch[0], "grid", self.cpp_name)
        block = _dim3(launch[1], "block", self.cpp_name)
        return Launcher(self, grid, block, _shared_bytes(launch[2], self.cpp_name) if len(launch) == 3 else 0)


class Launcher(Generic[P]):
    """``kernel[grid, block]``: calling it with the kernel's arguments builds a KernelLaunch.

    Typed as ``Callable[P, KernelLaunch]`` so mypy's messages need no ``__call__``; the mypy
    plugin retypes it as ``Launcher[P]`` to name the kernel and check borrows in the call.
    """

    __slots__ = ("kernel", "grid", "block", "shmem")

    def __init__(self, kernel: Kernel[P], grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int) -> None:
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shmem = shmem

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> KernelLaunch:
        return KernelLaunch(self.kernel, self.grid, self.block, self.shmem, args, kwargs)

    def __repr__(self) -> str:
        return f"{self.kernel.name_expression}[{self.grid}, {self.block}]"


def _template_arg(arg: object) -> str:
    if isinstance(arg, bool):
        return "true" if arg else "false"
    if isinstance(arg, (int, np.integer)):
        return str(int(arg))
    if isinstance(arg, str):
        return arg
    return as_dtype(arg).ctype


def kernel(
    source: str,
    *,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    touches: Mapping[str, str] | None = None,
    pdl: bool = False,
    reads_before_wait: Sequence[str] = (),
) -> Callable[[Callable[P, None]], Kernel[P]]:
    """Declare a CUDA C++ kernel. The C++ name defaults to the Python function's name.

    ``options`` are cuda.core ``ProgramOptions`` fields (e.g. ``{"use_fast_math": True}``);
    the architecture is always the device's own.

    ``touches`` declares how much of each tensor a launch may touch, as an expression of the
    scalar parameters and ``grid_x``..``block_z``: ``touches={"out": "n", "w": "n * k"}``. Every
    launch is then checked (a launch that would reach past a tensor is a SignatureError), which
    is what keeps "disjoint views never conflict" true for a kernel that takes a size argument.

    ``pdl=True`` declares that the kernel is written for programmatic dependent launch: every
    thread executes ``griddepcontrol.wait`` before it writes memory, before it reads anything but
    the read-only parameters named in ``reads_before_wait`` (weights it may start loading early),
    and before it exits. An edge between two such kernels becomes programmatic on sm_90+ (the
    dependent starts while its predecessor runs; see ``scopegraph._pdl``); a kernel may also call
    ``griddepcontrol.launch_dependents`` to let its own dependents start early.
    """

    def wrap(fn: Callable[P, None]) -> Kernel[P]:
        return Kernel(
            fn, source, name or fn.__name__, tuple(sorted((options or {}).items())), touches=touches,
            pdl=pdl, reads_before_wait=reads_before_wait,
        )

    return wrap


_NO_PARAMS: tuple[tuple[int, Param[Any]], ...] = ()


class KernelLaunch(GraphNode):
    """One launch of a kernel: grid, block, shared memory and checked arguments."""

    __slots__ = ("kernel", "grid", "block", "shmem", "args", "native", "params")

    def __init__(
        self,
        kernel: Kernel[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shmem: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shmem = shmem
        # The backend's bound form of this launch, made once (see _backends/_cuda.py).
        self.native: Any = None
        # (position, sg.Param) of each scalar argument given as a graph parameter (see _params).
        self.params = _NO_PARAMS
        params = kernel.params
        if kwargs or len(args) != len(params):
            args = self._bind(args, kwargs)
        values: list[Any] = []
        borrows: list[Borrow] = []
        for param, arg in zip(params, args):
            kind = param.kind
            if kind == "scalar":
                values.append(self._scalar(param, arg))
                continue
            mutable = kind == "mut"
            if mutable and type(arg) is Mut:
                tensor = arg.tensor
            elif not mutable and isinstance(arg, Tensor):
                tensor = arg
            else:
                tensor = borrowed_tensor(arg, mutable, self.name, param.name, f"declared as {kernel!r}")
            if (param.dtype is not None and tensor.dtype != param.dtype) or (
                param.rank is not None and len(tensor.shape) != param.rank
            ):
                self._spec_error(param, tensor)
            values.append(tensor)
            borrows.append(Borrow(tensor, mutable, param.name))
        # Tensors for borrows, numpy scalars of the declared C type (or sg.Params) for the rest.
        self.args = tuple(values)
        if self.params:  # _scalar met a Param
            self.params = tuple((i, a) for i, a in enumerate(values) if type(a) is Param)
        touches = kernel.touches
        if touches is not None:
            self._check_touches(touches, self.resolved(None) if self.params else self.args)
        if borrows:
            self._claim(borrows)
        else:
            self.borrows = borrows
            self.device = None

    @property
    def name(self) -> str:
        return self.kernel.name_expression

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        names = [p.name for p in self.kernel.params]
        sig = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise SignatureError(
                diagnostic(
                    f"`{self.name}` takes {len(names)} arguments ({exc})",
                    [f"declared as {self.kernel!r}"],
                    help="pass one argument per declared parameter",
                )
            ) from None
        return tuple(bound.arguments[n] for n in names)

    def _scalar(self, param: KernelParam, arg: object) -> np.generic | Param[Any]:
        dtype = param.dtype
        assert dtype is not None
        if dtype.name == "bool":
            ok = isinstance(arg, (bool, np.bool_))
        elif isinstance(arg, bool):
            ok = False
        elif dtype.is_float:
            ok = isinstance(arg, (int, float, np.integer, np.floating))
        else:
            ok = isinstance(arg, (int, np.integer))
        if not ok:
            if type(arg) is Param:
                return self._param(param, arg)
            raise SignatureError(
                diagnostic(
                    f"`{self.name}` parameter `{param.name}` expects sg.{dtype.name}, got {type(arg).__name__} {arg!r}",
                    [f"declared as {self.kernel!r}"],
                    help=f"pass a {'float' if dtype.is_float else 'int'} for `{param.name}`",
                )
            )
        return dtype.scalar(arg, f"`{self.name}` argument `{param.name}`")

    def _param(self, param: KernelParam, arg: Param[Any]) -> Param[Any]:
        """A graph parameter for a scalar argument: it must have the declared C type."""
        if arg.dtype != param.dtype:
            assert param.dtype is not None
            raise SignatureError(
                diagnostic(
                    f"`{self.name}` parameter `{param.name}` expects sg.{param.dtype.name}, "
                    f"got {arg!r} of sg.{arg.dtype.name}",
                    [f"declared as {self.kernel!r}"],
                    help=f"declare the parameter as sg.Param({arg.name!r}, sg.{param.dtype.name}, ...)",
                )
            )
        self.params = ((-1, arg),)  # marks the launch as having parameters; __init__ lists them
        return arg

    def resolved(self, values: Mapping[str, np.generic] | None) -> tuple[Any, ...]:
        """The arguments with each sg.Param replaced by its value in ``values`` (default: its default)."""
        args = list(self.args)
        for i, p in self.params:
            args[i] = p.default if values is None else values.get(p.name, p.default)
        return tuple(args)

    def check_touches(self, args: tuple[Any, ...]) -> None:
        """Check the declared sizes (``touches=``) against resolved arguments (new parameter values)."""
        if self.kernel.touches is not None:
            self._check_touches(self.kernel.touches, args)

    def _check_touches(self, touches: Touches, args: tuple[Any, ...]) -> None:
        # Python ints: numpy's fixed-width arithmetic could wrap a product past the check.
        scalars = [a.item() for a in args if not isinstance(a, Tensor)]
        counts = touches.count(*scalars, *self.grid, *self.block)
        for position, need, name, expression in zip(touches.params, counts, touches.names, touches.expressions):
            tensor = self.args[position]
            if not 0 <= need <= tensor.size:
                raise SignatureError(
                    diagnostic(
                        f"`{self.name}` would touch {need} elements of `{name}`, but `{tensor.name}` has {tensor.size}",
                        [
                            f"declared: `{name}` touches {expression} elements",
                            f"launched as {self.name}[{self.grid}, {self.block}] with "
                            + ", ".join(f"{p.name}={a}" for p, a in zip(self.kernel.params, args) if p.kind == "scalar"),
                        ],
                        help=f"pass a size that fits `{tensor.name}` ({tensor.size} elements), or a larger tensor",
                    )
                )

    def _spec_error(self, param: KernelParam, tensor: Tensor) -> None:
        raise SignatureError(
            diagnostic(
                f"`{self.name}` parameter `{param.name}` got `{tensor.name}` of dtype {tensor.dtype.name} and rank {tensor.ndim}",
                [f"declared as {param.describe()}"],
                help="pass a tensor of the declared dtype, or view() it to the declared rank",
            )
        )
