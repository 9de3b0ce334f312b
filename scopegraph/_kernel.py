"""Kernels: CUDA C++ source plus a Python signature that declares how each argument is used.

    @sg.kernel(SOURCE)
    def axpy(out: Mut[Tensor], x: Tensor, a: sg.f32, n: sg.i32) -> None: ...

``Mut[Tensor]`` parameters are written, ``Tensor`` parameters are read, scalar parameters carry
their C type. ``Annotated[Tensor, sg.TensorSpec(sg.f32, rank=2)]`` also pins dtype and rank.
Arguments are checked when the launch op is built (``axpy[grid, block](...)``), so the
traceback points at the user's line. The same declaration serves the CUDA backend (pointers
and typed scalars for cuda.core's ``launch``) and the host backend (numpy views for the
``@axpy.host`` reference). On its first launch the declaration is checked against the kernel's C++
one, where the source spells that out (``check_c_parameters``).
"""

from __future__ import annotations

import ast
import inspect
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    NamedTuple,
    ParamSpec,
    TypeVar,
    get_args,
    get_origin,
    get_type_hints,
)

import numpy as np

from ._borrow import Borrow
from ._compile import AN_INCLUDE, check_options, code_only, may_wait, without_comments
from ._dtypes import (
    ALL_DTYPES,
    DType,
    as_dtype,
    boolean,
    dtype_of_annotation,
    float16,
    float32,
    float64,
    int8,
    int16,
    uint8,
)
from ._errors import ScopeGraphError, SignatureError, diagnostic
from ._ops import GraphNode, borrowed_tensor
from ._params import Param
from ._tensor import MAX_DIMS, Mut, Tensor

P = ParamSpec("P")
# The kernel's name as a literal str type, for the mypy plugin (see Launcher).
Name = TypeVar("Name", covariant=True)

Dim = int | tuple[int] | tuple[int, int] | tuple[int, int, int]
# kernel(launch_check=): (grid, block, template_args) -> why that shape cannot run, or None.
LaunchCheck = Callable[[tuple[int, int, int], tuple[int, int, int], tuple[str, ...]], "str | None"]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Constraints on a tensor parameter, used as ``Annotated[Tensor, TensorSpec(sg.f32, rank=1)]``."""

    dtype: Any = None
    rank: int | None = None

    def __post_init__(self) -> None:
        # Checked here, so a bad spec is refused where it is written, and specs that say the
        # same compare and hash alike (TensorSpec(sg.f32) is TensorSpec(sg.float32)).
        if self.dtype is not None:
            object.__setattr__(self, "dtype", as_dtype(self.dtype))
        rank = self.rank
        if rank is not None and (type(rank) is not int or not 0 <= rank <= MAX_DIMS):
            raise SignatureError(
                diagnostic(
                    f"TensorSpec(rank={rank!r}) is not a rank",
                    help=f"give the number of dimensions as an int from 0 to {MAX_DIMS}, or leave rank out",
                )
            )


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
            return f"{self.name}: {self.dtype.spelling}"
        base = "Mut[Tensor]" if self.kind == "mut" else "Tensor"
        extra = [f"dtype {self.dtype.name}"] if self.dtype else []
        extra += [f"rank {self.rank}"] if self.rank is not None else []
        return f"{self.name}: {base}" + (f" ({', '.join(extra)})" if extra else "")


def _parse_param(name: str, annotation: object, kernel_name: str) -> KernelParam:
    spec = TensorSpec()
    if get_origin(annotation) is Annotated:
        args = get_args(annotation)
        specs = [m for m in args[1:] if isinstance(m, TensorSpec)]
        if len(specs) > 1:  # one would be silently dropped
            raise SignatureError(
                diagnostic(
                    f"kernel `{kernel_name}` parameter `{name}` has {len(specs)} TensorSpecs: "
                    f"{', '.join(map(repr, specs))}",
                    help="give one TensorSpec with every constraint, e.g. sg.TensorSpec(sg.f32, rank=2)",
                )
            )
        if specs:
            spec = specs[0]
            annotation = args[0]
    if get_origin(annotation) is Mut or annotation is Mut:
        # Exactly Mut[Tensor]: anything else in the brackets (Mut[int], Mut[sg.f32], Mut[Mut[Tensor]],
        # a TensorSpec inside) would be read as a written tensor with its meaning silently dropped.
        if get_args(annotation) != (Tensor,):
            raise SignatureError(
                diagnostic(
                    f"kernel `{kernel_name}` parameter `{name}` is annotated {annotation!r}",
                    ["a written (mutably borrowed) parameter is exactly Mut[Tensor]"],
                    help=f"annotate `{name}` as Mut[Tensor]; to pin its dtype or rank, "
                    "Annotated[Mut[Tensor], sg.TensorSpec(sg.f32, rank=1)]",
                )
            )
        return KernelParam(name, "mut", spec.dtype, spec.rank)
    if annotation is Tensor:
        return KernelParam(name, "shared", spec.dtype, spec.rank)
    scalar = dtype_of_annotation(annotation)
    if scalar is not None:
        return KernelParam(name, "scalar", scalar, None)
    if isinstance(annotation, DType):  # sg.float32, the dtype object, where its alias sg.f32 belongs
        raise SignatureError(
            diagnostic(
                f"kernel `{kernel_name}` parameter `{name}` is annotated with a dtype object "
                f"({annotation.numpy.name}), not a type",
                ["a scalar parameter's annotation is a type alias, so that mypy sees a float or an int"],
                help=f"annotate `{name}` with {annotation.spelling}",
            )
        )
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
    except Exception as exc:  # NameError for an unknown name; TypeError, SyntaxError for what is not a type
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
        if p.default is not p.empty:
            # mypy would accept a launch that leaves it out, and the launch would then be refused:
            # the binder takes one argument per parameter, as the CUDA kernel does.
            raise SignatureError(
                diagnostic(
                    f"kernel `{kernel_name}` parameter `{p.name}` has a default ({p.default!r})",
                    ["a CUDA kernel takes every argument at every launch"],
                    help=f"drop the default and pass `{p.name}` at launch; for a value that changes "
                    "between replays of a graph, pass an sg.Param",
                )
            )
        params.append(_parse_param(p.name, hints[p.name], kernel_name))
    return tuple(params)


# What every CUDA GPU accepts (compute capability 5.0 and later); checked on every backend so a
# launch that the host backend runs is one a GPU runs too.
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SHARED_BYTES = 48 * 1024
# What a kernel that opts in (``@sg.kernel(..., max_shared_bytes=N)``) may ask for: the most any
# GPU gives one block (sm_90 and sm_100: 227 KiB). Its own GPU's limit is checked when it is bound.
MAX_OPT_IN_SHARED_BYTES = 227 * 1024
_AXES = "xyz"


def _dim3(value: object, what: str, kernel_name: str) -> tuple[int, int, int]:
    if type(value) is int and 0 < value <= 1024:  # the common case, in users' inner loops
        return (value, 1, 1)
    dims = value if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims
    ):
        raise SignatureError(
            f"`{kernel_name}` {what} {value!r} is not 1 to 3 positive integers\n"
            f"help: launch as {kernel_name}[grid, block](...) with e.g. grid=(64,) and block=(256,)"
        )
    padded = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    limits = MAX_GRID if what == "grid" else MAX_BLOCK
    for axis, d, limit in zip(_AXES, padded, limits, strict=True):
        if d > limit:
            raise SignatureError(
                f"`{kernel_name}` {what} {value!r}: {what}.{axis} = {d} exceeds the CUDA limit of {limit}\n"
                f"help: keep {what}.{axis} <= {limit}"
                + (
                    "; spread the work over more blocks instead"
                    if what == "block"
                    else "; put the extra work in x, or loop in the kernel"
                )
            )
    if what == "block" and padded[0] * padded[1] * padded[2] > MAX_THREADS_PER_BLOCK:
        raise SignatureError(
            f"`{kernel_name}` block {value!r} has {padded[0] * padded[1] * padded[2]} threads; "
            f"a block holds at most {MAX_THREADS_PER_BLOCK}\nhelp: use smaller blocks and more of them"
        )
    return padded  # type: ignore[return-value]


def _shared_bytes(value: object, kernel: Kernel[Any]) -> int:
    limit = kernel.max_shared_bytes
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= limit:
        name = kernel.cpp_name
        raise SignatureError(
            f"`{name}` dynamic shared memory {value!r} is not 0..{limit} bytes\n"
            + (
                f"help: launch as {name}[grid, block, shared_bytes] with at most 48 KiB, or opt in to "
                f"more with @sg.kernel(..., max_shared_bytes=N) (up to {MAX_OPT_IN_SHARED_BYTES} bytes, "
                "as the GPU allows)"
                if limit == MAX_DYNAMIC_SHARED_BYTES
                else f"help: ask for at most the {limit} bytes its declaration allows (max_shared_bytes)"
            )
        )
    return int(value)


def _max_shared_bytes(value: object, kernel_name: str) -> int:
    """A declaration's ``max_shared_bytes``: the dynamic shared memory its launches may ask for."""
    if value is None:
        return MAX_DYNAMIC_SHARED_BYTES
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or not 0 < value <= MAX_OPT_IN_SHARED_BYTES
    ):
        raise SignatureError(
            f"`{kernel_name}` declares max_shared_bytes={value!r}, not 1..{MAX_OPT_IN_SHARED_BYTES} bytes\n"
            f"help: declare what its largest launch asks for; no GPU gives a block more than "
            f"{MAX_OPT_IN_SHARED_BYTES} bytes"
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
    for name in scalars:
        if name in LAUNCH_NAMES:
            raise SignatureError(
                f"kernel `{kernel_name}`: parameter `{name}` has the name touches expressions use for the launch's "
                f"{name.replace('_', ' ')}\nhelp: rename the parameter (e.g. `{name}_arg`), or leave touches out"
            )
    help = (
        f"map a tensor parameter ({', '.join(tensor_params) or 'none declared'}) to an expression of "
        f'{", ".join(scalars + list(LAUNCH_NAMES))} with + - * //, e.g. touches={{"out": "n"}}'
    )
    sources = []
    for name, expression in touches.items():
        if name not in tensor_params:
            raise SignatureError(
                f"kernel `{kernel_name}`: touches names `{name}`, which is not a tensor parameter\nhelp: {help}"
            )
        try:
            tree = ast.parse(str(expression), mode="eval")
        except SyntaxError:
            raise SignatureError(
                f"kernel `{kernel_name}`: touches[{name!r}] = {expression!r} is not an expression\nhelp: {help}"
            ) from None
        for node in ast.walk(tree):
            bad = (
                not isinstance(node, _ALLOWED_NODES)
                or (isinstance(node, ast.Name) and node.id not in scalars and node.id not in LAUNCH_NAMES)
                or (isinstance(node, ast.Constant) and (type(node.value) is not int))
            )
            if bad:
                what = (
                    f"`{node.id}`"
                    if isinstance(node, ast.Name)
                    else f"`{ast.unparse(node)}`"
                    if isinstance(node, ast.expr)
                    else type(node).__name__
                )
                raise SignatureError(
                    f"kernel `{kernel_name}`: touches[{name!r}] = {expression!r} uses {what}\nhelp: {help}"
                )
        sources.append(ast.unparse(tree))
    # Only names, int constants and + - * // remain: evaluating it runs no other code.
    count = eval(f"lambda {', '.join(scalars + list(LAUNCH_NAMES))}: ({', '.join(sources)},)", {"__builtins__": {}})
    return Touches(tuple(tensor_params[n] for n in touches), tuple(touches), tuple(map(str, touches.values())), count)


# Bytes of the C types a kernel's pointer parameters may point to, as nvcc and NVRTC lay them out
# on a 64-bit Linux host (LP64: `long` is 8 bytes). Integer types in any spelling (`long int`,
# `unsigned long long int`) and CUDA's vector types (`uint4`, `float3`, `longlong2`) are worked
# out by _c_type_bytes; typedefs and `using` aliases of these in the source too.
_C_SIZES = {
    **dict.fromkeys(("int8_t", "uint8_t", "bool"), 1),
    **dict.fromkeys(("int16_t", "uint16_t", "__half", "half", "__nv_bfloat16", "nv_bfloat16", "char16_t"), 2),
    **dict.fromkeys(
        ("int32_t", "uint32_t", "float", "char32_t", "wchar_t", "__half2", "half2", "__nv_bfloat162", "nv_bfloat162"), 4
    ),
    **dict.fromkeys(("int64_t", "uint64_t", "double", "size_t", "ptrdiff_t", "intptr_t", "uintptr_t"), 8),
}
_INTEGER_WORDS = frozenset(("signed", "unsigned", "short", "long", "int", "char"))
_VECTOR = re.compile(r"u?(char|short|int|longlong|long)([1-4])|(float|double)([1-4])")
_VECTOR_BASE = {"char": 1, "short": 2, "int": 4, "long": 8, "longlong": 8, "float": 4, "double": 8}
_QUALIFIERS = re.compile(r"\b(?:const|volatile|__restrict__|__restrict|restrict)\b")
_ALIASES = re.compile(r"\btypedef\s+([\w\s]+?)\s+(\w+)\s*;|\busing\s+(\w+)\s*=\s*([\w\s]+?)\s*;")


def _c_type_bytes(name: str, aliases: dict[str, int]) -> int | None:
    """Bytes of the C type ``name`` (qualifiers removed, words single-spaced); None if unknown."""
    known = _C_SIZES.get(name) or aliases.get(name)
    if known:
        return known
    words = name.split()
    if words and _INTEGER_WORDS.issuperset(words):
        return 1 if "char" in words else 2 if "short" in words else 8 if "long" in words else 4
    vector = _VECTOR.fullmatch(name)
    if vector:
        base, lanes = (vector[1], vector[2]) if vector[1] else (vector[3], vector[4])
        return _VECTOR_BASE[base] * int(lanes)
    return None


class CParam(NamedTuple):
    """One parameter of a kernel's C++ declaration, as the source spells it: a pointer (``type`` is
    what it points to, ``const`` whether that is const) or a value (``type`` is its type); ``name``
    is empty where the declaration leaves it out."""

    pointer: bool
    const: bool
    type: str
    name: str


class CDeclaration(NamedTuple):
    """A kernel's C++ declaration as its source spells it: its parameters (named, where one of its
    declarations names them all), and the sizes of the source's typedefs and ``using`` aliases of
    sized types, with the type each one names (an alias of an alias resolved)."""

    params: tuple[CParam, ...]
    aliases: dict[str, int]
    alias_targets: dict[str, str]

    def resolved(self, c_type: str) -> str:
        """``c_type`` itself, or the type the alias ``c_type`` names."""
        return self.alias_targets.get(c_type, c_type)

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters' names; empty where no declaration names them all."""
        names = tuple(p.name for p in self.params)
        return names if all(names) else ()

    def kind(self, c_type: str) -> str | None:
        """The kind of a value of ``c_type``: "f", "bf16", "b" (bool) or "i"; None for a type of no
        known size, or a vector type."""
        c_type = self.resolved(c_type)
        if c_type in ("__nv_bfloat16", "nv_bfloat16"):
            return "bf16"
        if c_type in _FLOAT_TYPES:
            return "f"
        if c_type == "bool":
            return "b"
        return "i" if _c_type_bytes(c_type, self.aliases) and not _VECTOR.fullmatch(c_type) else None


def declared_parameters(source: str, cpp_name: str) -> CDeclaration | None:
    """The non-template ``__global__`` declaration of ``cpp_name`` that ``source`` spells out (a
    forward declaration and the definition must agree, but for the names and the spelling of a
    type: ``unsigned`` and ``unsigned int``); None when there is no such declaration, or several
    that differ."""
    code = code_only(source)
    aliases: dict[str, int] = {}
    targets: dict[str, str] = {}
    for alias in _ALIASES.finditer(code):  # in source order: an alias of an earlier alias too
        target, name = (alias[1], alias[2]) if alias[2] else (alias[4], alias[3])
        bare = " ".join(_QUALIFIERS.sub(" ", target).split())
        size = _c_type_bytes(bare, aliases)
        if size:
            aliases[name] = size
            targets[name] = targets.get(bare, bare)
    found: dict[tuple[object, ...], tuple[CParam, ...]] = {}
    for call in re.finditer(rf"\b{re.escape(cpp_name)}\s*\(", code):
        start = max(code.rfind(mark, 0, call.start()) for mark in ";{}")
        head = code[start + 1 : call.start()]
        end = code.find(")", call.end())
        if _GLOBAL.search(head) and not _TEMPLATE.search(head) and end != -1 and "(" not in code[call.end() : end]:
            items = _top_level_items(code[call.end() : end])
            if [" ".join(item.split()) for item in items] == ["void"]:
                items = []  # `k(void)`: no parameters
            params = tuple(_c_param(item, aliases) for item in items)
            key = tuple(_canonical(p, aliases) for p in params)
            if key not in found or not all(p.name for p in found[key]):  # the one that names them, if any
                found[key] = params
    if len(found) != 1:
        return None
    (params,) = found.values()
    return CDeclaration(params, aliases, targets)


def _canonical(param: CParam, aliases: dict[str, int]) -> object:
    """What two declarations of one kernel must agree on for a parameter: a pointer's constness
    and pointee (sized where a rule sizes it), a value's size (any spelling; unknown types alike,
    as an unnamed one cannot be told from its name)."""
    size = _c_type_bytes(param.type, aliases)
    if param.pointer:
        return (True, param.const, size or param.type)
    return (False, size)


def _c_param(parameter: str, aliases: dict[str, int]) -> CParam:
    words = _QUALIFIERS.sub(" ", parameter.split("[")[0]).replace("*", " * ").split()
    if "*" in words:
        star = len(words) - words[::-1].index("*") - 1  # the last one
        pointee, after = words[:star], words[star + 1 :]
        const = "*" not in pointee and "const" in parameter[: parameter.rindex("*")].split()
        return CParam(True, const, " ".join(pointee), after[-1] if after else "")
    # A forward declaration may leave the name out: the last word is a name unless it is a type's.
    named = len(words) > 1 and not _is_type_word(words[-1], aliases)
    if "[" in parameter:  # `float x[]`: a pointer to float
        const = "const" in parameter.split("[")[0].split()
        return CParam(True, const, " ".join(words[:-1] if named else words), words[-1] if named else "")
    return CParam(False, False, " ".join(words[:-1] if named else words), words[-1] if named else "")


def _is_type_word(word: str, aliases: dict[str, int]) -> bool:
    return word in _INTEGER_WORDS or word in _C_SIZES or word in aliases or _VECTOR.fullmatch(word) is not None


_FLOAT_TYPES = frozenset(("float", "double", "__half", "half"))


def declared_pointee_bytes(source: str, cpp_name: str) -> tuple[int | str | None, ...]:
    """Per parameter of the declaration that ``declared_parameters`` reads: the bytes of what a
    pointer parameter points to; the spelling of a pointee type that cannot be sized (a struct, a
    typedef of one, a macro); None for anything else (a value, ``void*``, a pointer to pointers).
    Empty when the source spells no single such declaration."""
    declared = declared_parameters(source, cpp_name)
    if declared is None:
        return ()
    return tuple(_pointee_bytes(p, declared.aliases) for p in declared.params)


def _pointee_bytes(param: CParam, aliases: dict[str, int]) -> int | str | None:
    if not param.pointer or "*" in param.type or param.type == "void":
        return None
    return _c_type_bytes(param.type, aliases) or param.type


def c_declaration(kernel: Kernel[Any]) -> CDeclaration | None:
    """The kernel's C++ declaration where the source spells it out and nothing but the compiler
    could change it: None for a template's, or one that the preprocessor shapes."""
    if kernel.template_args:
        return None
    declared = declared_parameters(kernel.source, kernel.cpp_name)
    if declared is None or _preprocessed_parameters(kernel.source, kernel.cpp_name):
        return None
    return declared


def pointee_dtypes(params: tuple[KernelParam, ...], declared: CDeclaration | None) -> tuple[tuple[DType, ...], ...]:
    """Per Python parameter, the tensor dtypes its C++ pointer takes: ``float*`` an sg.f32 tensor,
    ``int*`` an sg.i32 or sg.u32 one, and any pointer an sg.u8 tensor, its bytes (``touches=``
    then counts the kernel's elements in them); empty where any dtype goes (a scalar, ``void*``,
    bytes, vector types, a type no rule knows) or the declarations do not line up
    (check_c_parameters says so)."""
    if declared is None or len(declared.params) != len(params):
        return ((),) * len(params)
    return tuple(
        () if p.kind == "scalar" else _pointee_dtypes(c, declared) for p, c in zip(params, declared.params, strict=True)
    )


def _pointee_dtypes(c: CParam, declared: CDeclaration) -> tuple[DType, ...]:
    if not c.pointer or "*" in c.type:
        return ()
    c_type = declared.resolved(c.type)
    if c_type in ("__half2", "half2"):
        return (float16,)
    if c_type in ("__nv_bfloat162", "nv_bfloat162"):
        return (int16,)  # pairs of bfloat16 bits
    if _VECTOR.fullmatch(c_type):
        return ()  # a vector type (uint4, float4) is as often 16 raw bytes of any dtype
    size, kind = _c_type_bytes(c_type, declared.aliases), declared.kind(c_type)
    if size is None or kind is None:
        return ()
    if kind == "bf16":
        return (int16,)  # its bits: no dtype is bfloat16
    if kind == "b":
        return (boolean, uint8, int8)
    if kind == "f":
        return {2: (float16,), 4: (float32,), 8: (float64,)}.get(size, ())
    if size == 1:  # char, uint8_t: bytes, of whatever a tensor holds
        return ()
    return tuple(d for d in ALL_DTYPES if d.numpy.kind in "iu" and d.itemsize == size)


def pointee_problem(dtype: DType, c: CParam, allowed: tuple[DType, ...], fix: str) -> tuple[str, str]:
    """What a tensor of ``dtype`` passed to the C++ pointer ``c`` (which takes ``allowed``) would
    do, and what to do instead: ``fix`` (``"pass a tensor of"``, ``"declare it"``) one of
    ``allowed``, or point the C++ parameter to ``dtype``."""
    takes = " or ".join(d.spelling for d in allowed)
    return (
        f"the C++ parameter is `{_spelling(c, named=True)}`: the kernel would read {dtype.spelling} elements "
        f"as `{c.type}`",
        f"{fix} {takes}, or make the C++ parameter point to {dtype.ctype} ({dtype.spelling})",
    )


def check_c_parameters(kernel: Kernel[Any], declared: CDeclaration | None) -> None:
    """The Python declaration against the C++ one (``declared``, c_declaration's answer): as many
    parameters, a pointer for each tensor and a value for each scalar, no ``Mut`` on a const pointer
    (the kernel cannot write it: most likely two parameters are swapped), a tensor's declared dtype
    one its pointer takes, and each scalar of the C type's size and kind. On a GPU a mismatch would
    pass a wrong parameter buffer; on the host backend it would run regardless. A type the rules do
    not know (a typedef of a pointer, a struct) is not judged. Nor is a declaration the source does
    not spell out, but for its name: a kernel the source never names is refused."""
    if declared is None:
        _check_named(kernel)
        return
    c_params = declared.params
    params = kernel.params
    spelled = f"__global__ void {kernel.cpp_name}({', '.join(_spelling(c, named=True) for c in c_params)})"
    python = f"def {kernel.__name__}({', '.join(p.describe() for p in params)})"
    if len(c_params) != len(params):
        raise SignatureError(
            diagnostic(
                f"kernel `{kernel.cpp_name}` is declared with {len(params)} parameter"
                f"{'' if len(params) == 1 else 's'} in Python and {len(c_params)} in its C++ source",
                [f"Python: {python}", f"C++:    {spelled}"],
                help="declare one Python parameter for each C++ parameter, in the same order",
            )
        )
    python_names = tuple(p.name for p in params)
    if declared.names and python_names != declared.names and sorted(python_names) == sorted(declared.names):
        raise SignatureError(
            diagnostic(
                f"kernel `{kernel.cpp_name}` names its parameters in another order in Python than in C++",
                [f"Python: {python}", f"C++:    {spelled}"],
                help="declare the Python parameters in the C++ order: arguments reach the kernel by position",
            )
        )
    for i, (p, c) in enumerate(zip(params, c_params, strict=True)):
        problem = _parameter_problem(p, c, declared)
        if problem is not None:
            raise SignatureError(
                diagnostic(
                    f"kernel `{kernel.cpp_name}`: parameter {i + 1}, `{p.name}`, {problem[0]}",
                    [f"Python: {python}", f"C++:    {spelled}"],
                    help=problem[1],
                )
            )


# The name of each __global__ function a source defines (after its return type and any
# __launch_bounds__(...)), for the message of a kernel it does not name.
_BOUNDS = r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*"  # one level of nested parentheses
_KERNEL_NAME = re.compile(rf"\b__global__\s+(?:{_BOUNDS})?(?:[\w:<>,\s*&]*?\s)?(?:{_BOUNDS})?(\w+)\s*\(")


def _check_named(kernel: Kernel[Any]) -> None:
    """Refuse a kernel whose source never names it (the host backend would run its reference; a
    GPU finds no such kernel to load), unless something the source does not show may define it:
    an included header (or one the options put before it), token pasting (``##``), a macro given
    in the options. An empty source is a declaration for the host backend alone (tests of a
    reference), not a misnamed kernel."""
    source = kernel.source
    option_code = any(name in ("define_macro", "pre_include") for name, _ in kernel.options)
    text = without_comments(source)  # a #define may be what names it
    if not code_only(source).strip() or "##" in source or AN_INCLUDE.search(text) or option_code:
        return
    name = kernel.cpp_name.rsplit("::", 1)[-1]
    if re.search(rf"\b{re.escape(name)}\b", text):
        return
    defined = sorted(set(_KERNEL_NAME.findall(code_only(source))))
    raise SignatureError(
        diagnostic(
            f"kernel `{kernel.cpp_name}` is not in its source",
            [f"the source defines {', '.join(f'`{k}`' for k in defined) if defined else 'no kernel'}"],
            help='name the C++ function: @sg.kernel(SOURCE, name="..."), or name the Python function after it',
        )
    )


def _parameter_problem(p: KernelParam, c: CParam, declared: CDeclaration) -> tuple[str, str] | None:
    """Why the Python parameter ``p`` cannot take the C++ parameter ``c``, and what to declare
    instead; None when it can."""
    size = None if c.pointer else _c_type_bytes(c.type, declared.aliases)
    if p.kind != "scalar" and size:
        return (
            f"is a {'Mut[Tensor]' if p.kind == 'mut' else 'Tensor'}, and the C++ parameter is `{c.type}`",
            f"declare `{p.name}` as the scalar the kernel takes, or make the C++ parameter a pointer",
        )
    if p.kind == "scalar" and c.pointer:
        return (
            f"is a scalar ({p.describe()}), and the C++ parameter is a pointer (`{_spelling(c)}`)",
            f"declare `{p.name}` as a Tensor (Mut[Tensor] if the kernel writes it), or make it a value in C++",
        )
    if p.kind == "mut" and c.const:
        return (
            f"is a Mut[Tensor], and the C++ parameter points to const data (`{_spelling(c)}`)",
            f"if the kernel reads `{p.name}`, declare it `Tensor`; if it writes it, drop the const "
            "(or check the order: are two parameters swapped?)",
        )
    if p.kind != "scalar" and p.dtype is not None:
        allowed = _pointee_dtypes(c, declared)
        if allowed and p.dtype not in allowed and p.dtype != uint8:
            what, fix = pointee_problem(p.dtype, c, allowed, "declare it")
            return f"is declared {p.dtype.spelling}, and {what}", fix
    if p.kind == "scalar" and size:
        return _scalar_problem(p, c.type, size, declared.kind(c.type))
    return None


def _scalar_problem(p: KernelParam, c_type: str, size: int, c_kind: str | None) -> tuple[str, str] | None:
    """Why a scalar declared ``p.dtype`` cannot carry a C++ value of ``c_type`` (``size`` bytes,
    kind ``c_kind``), and what to declare instead; None when it can. A C++ bool takes a
    1-byte integer too, and a bfloat16 its bits as an sg.i16 (no dtype is bfloat16)."""
    assert p.dtype is not None
    kind = {"u": "i"}.get(p.dtype.numpy.kind, p.dtype.numpy.kind)
    fits = p.dtype.itemsize == size and (c_kind in (None, kind) or (c_kind in ("b", "bf16") and kind == "i"))
    if fits:
        return None
    given = f"is {p.dtype.spelling} ({p.dtype.itemsize} byte{'' if p.dtype.itemsize == 1 else 's'})"
    suggestion = {
        "f": {2: "sg.f16", 4: "sg.f32", 8: "sg.f64"}.get(size),
        "bf16": "sg.i16 (the value's bits: no dtype is bfloat16)",
        "b": "sg.u8",
        "i": {1: "sg.i8 or sg.u8", 2: "sg.i16", 4: "sg.i32 or sg.u32", 8: "sg.i64 or sg.u64"}.get(size),
    }.get(c_kind or "")
    fix = f"declare `{p.name}` as {suggestion}" if suggestion else f"declare `{p.name}` with a dtype of {size} bytes"
    return f"{given}, and the C++ parameter is `{c_type}`", fix


def _preprocessed_parameters(source: str, cpp_name: str) -> bool:
    """Whether the preprocessor may change a declaration of ``cpp_name``: a directive inside its
    parameter list (an ``#if``, which options may decide), or a macro named there."""
    text = without_comments(source)
    macros = set(_DEFINED.findall(text))
    for call in re.finditer(rf"\b{re.escape(cpp_name)}\s*\(", text):
        end = text.find(")", call.end())
        span = text[call.end() : end if end != -1 else len(text)]
        if _DIRECTIVE.search(span) or macros.intersection(re.findall(r"\w+", span)):
            return True
    return False


_DEFINED = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#", re.M)


def _spelling(c: CParam, named: bool = False) -> str:
    spelled = f"{'const ' if c.const else ''}{c.type}*" if c.pointer else c.type
    return f"{spelled} {c.name}" if named and c.name else spelled


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
                "help: name read-only Tensor parameters ("
                f"{', '.join(n for n, k in kinds.items() if k == 'shared') or 'none declared'}); "
                "a PDL kernel writes nothing before it waits"
            )
    return frozenset(early)


# Distinct launch shapes remembered per kernel before the cache starts over.
_LAUNCHER_CACHE = 256


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
        max_shared_bytes: int | None = None,
        launch_check: LaunchCheck | None = None,
    ) -> None:
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.source = source
        self.cpp_name = cpp_name
        self.options = options
        self.template_args = template_args
        self.host_fn = host_fn
        # The launch's fields the reference takes as keyword-only parameters ("grid", "block",
        # "template_args").
        self.host_launch: tuple[str, ...] = () if host_fn is None else _host_launch(host_fn)
        self.params = params if params is not None else _parse_signature(fn, cpp_name)
        # How many elements each launch touches per tensor parameter, checked when a launch is built.
        self.touches = (
            touches
            if isinstance(touches, Touches) or touches is None
            else _parse_touches(touches, self.params, cpp_name)
        )
        # Programmatic dependent launch (DESIGN.md section 7, scopegraph._pdl): the kernel waits
        # (griddepcontrol.wait) before it touches its predecessors' results; before the wait it
        # only reads the read-only parameters named in reads_before_wait (weights).
        self.pdl = pdl
        # False for a pdl=True kernel whose text shows it never waits: the host backend refuses it
        # as compiling it for sm_90 would (see may_wait).
        self.may_wait = not pdl or may_wait(source, options)
        self.reads_before_wait = _check_pdl(
            pdl,
            (reads_before_wait,) if isinstance(reads_before_wait, str) else tuple(reads_before_wait),
            self.params,
            cpp_name,
        )
        # The dynamic shared memory a launch may ask for: 48 KiB, or what the declaration says; past
        # 48 KiB the CUDA backend raises the loaded kernel's limit, as far as its GPU allows.
        self.max_shared_bytes = _max_shared_bytes(max_shared_bytes, cpp_name)
        # What the kernel's code assumes of its launch shape (see kernel()): checked per shape.
        self.launch_check = launch_check
        # The C++ expression NVRTC resolves: ``name`` or ``name<args>`` for a template.
        self.name_expression = cpp_name if not template_args else f"{cpp_name}<{', '.join(template_args)}>"
        # See template_parameters. Both are set here, not first on a launch: an attribute added to
        # an instance later would cost every attribute read of it on the hot path (CPython keeps
        # the attributes of __init__ inline).
        self._template: str | None = None
        self._template_read = False
        # Launchers by launch shape (checked once per distinct shape; see __getitem__).
        self._launchers: dict[object, Launcher[P, str]] = {}
        # The argument binder generated from the declaration on the first launch (_make_binder).
        self._binder: Callable[..., None] | None = None
        # Instantiations made by generics(), so each one compiles (and is cached) once; and the
        # same by the arguments as given, where they are plain ints and strs (one dict lookup for
        # the usual call in an op helper, `k.generics(128)`, rather than a conversion to C++ text).
        self._instances: dict[tuple[str, ...], Kernel[P]] = {}
        self._instances_as_given: dict[tuple[object, ...], Kernel[P]] = {}
        # Every kernel rebuilt() from this one (generics() instances too): a host reference
        # registered later reaches them.
        self._derived: weakref.WeakSet[Kernel[P]] = weakref.WeakSet()
        self._touch_bytes: tuple[int | None, ...] | None = None  # see _touch_element_bytes
        # Loaded per device by the CUDA backend: backend -> its loaded form (the cuda.core Kernel
        # and the launch limits it was compiled to; see _backends/_cuda.py).
        self.compiled: dict[object, Any] = {}

    def __repr__(self) -> str:
        sig = ", ".join(p.describe() for p in self.params)
        return f"<kernel {self.name_expression}({sig})>"

    if not TYPE_CHECKING:  # mypy reports such a call itself: a Kernel is not callable

        def __call__(self, *args: object, **kwargs: object) -> None:
            launch = (
                f"{self.__name__}.generics(...)[grid, block]"
                if self.template_parameters
                else f"{self.__name__}[grid, block]"
            )
            raise SignatureError(
                diagnostic(
                    f"`{self.name_expression}` was called without a launch configuration",
                    ["a kernel runs as a grid of blocks of threads: the call needs both"],
                    help=f"launch it as {launch}(...), e.g. with enough threads for the elements it touches",
                )
            )

    @property
    def template_parameters(self) -> str | None:
        """For a C++ template kernel not instantiated by generics(), its template parameter list
        (``"<int BS>"``), so that a launch of it is refused on every backend (no GPU can compile
        it; the host reference would run it). Read from the source on the first launch, not at
        import, and then kept: building an op never reads it (see __getitem__)."""
        if not self._template_read:
            self._template = None if self.template_args else declared_template(self.source, self.cpp_name)
            self._template_read = True
        return self._template

    def host(self, fn: Callable[..., None]) -> Callable[..., None]:
        """Register a numpy reference, used by the host backend: it gets numpy views of the tensors
        (exactly each tensor's, read-only for ``Tensor`` parameters) and numpy scalars, one per
        declared parameter. A reference that declares keyword-only parameters ``grid`` and
        ``block`` also gets the launch's grid and block (3-tuples), to cover what the kernel's
        threads cover, and one that declares ``template_args`` the instantiation's template
        arguments (C++ text). Kernels rebuilt() or instantiated from this one get it too, unless
        they were given their own."""
        launch = _check_host(fn, self)
        inherited, pending = self.host_fn, [self]
        while pending:
            kernel = pending.pop()
            kernel.host_fn = fn
            kernel.host_launch = launch
            # Those derived kernels that still have what this one had: not one given its own since.
            pending.extend(k for k in list(kernel._derived) if k.host_fn is inherited)
        return fn

    def generics(self, *args: object) -> Kernel[P]:
        """The instantiation of a C++ template kernel with these template arguments."""
        # Only exact ints and strs key the fast path: True == 1.0 == 1 hash alike, and a bool
        # instantiates `true`, a float is refused; other kinds may not hash at all.
        if len(args) == 1:  # (the usual case: one block size, without a generator's cost)
            plain = type(args[0]) is int or type(args[0]) is str
        else:
            plain = all(type(a) is int or type(a) is str for a in args)
        if plain:
            inst = self._instances_as_given.get(args)
            if inst is not None:
                return inst
        key = tuple(_template_arg(a) for a in args)
        inst = self._instances.get(key)
        if inst is None:
            _check_template_args(self, args, key)
            inst = self._instances[key] = self.rebuilt(template_args=key)
        if plain:
            self._instances_as_given[args] = inst
        return inst

    def _touch_element_bytes(self) -> tuple[int | None, ...]:
        """Bytes of one element that each ``touches`` count counts: the parameter's dtype's, else
        what this kernel's C declaration points to (``float* out``: 4, ``uint4* out``: 16,
        whatever the tensor's dtype), else None, the tensor's own elements (a template
        instantiation, ``void*``, a declaration the source does not spell out). A pointee the
        source spells but no rule sizes (a struct) is a SignatureError: counting the tensor's
        elements could let the kernel reach past it. Read from the source on first use."""
        if self._touch_bytes is None:
            assert self.touches is not None  # asked for by the touches checks only
            pointees = () if self.template_args else declared_pointee_bytes(self.source, self.cpp_name)
            if len(pointees) != len(self.params):
                pointees = (None,) * len(self.params)
            sizes: list[int | None] = []
            for i in self.touches.params:
                dtype, pointee = self.params[i].dtype, pointees[i]
                if dtype is None and isinstance(pointee, str):
                    name = self.params[i].name
                    raise SignatureError(
                        diagnostic(
                            f"kernel `{self.cpp_name}`: touches counts elements of `{name}`, which points to "
                            f"`{pointee}`, a type scopegraph cannot size",
                            ["counting the tensor's own elements instead could let the kernel reach past it"],
                            help=f"give `{name}` a dtype, Annotated[Tensor, sg.TensorSpec(sg.f32)] (touches then "
                            "counts that dtype's elements), or declare it with a built-in C or CUDA vector type",
                        )
                    )
                sizes.append(dtype.itemsize if dtype is not None else pointee if isinstance(pointee, int) else None)
            self._touch_bytes = tuple(sizes)
        return self._touch_bytes

    def rebuilt(
        self,
        *,
        source: str | None = None,
        options: tuple[tuple[str, object], ...] | None = None,
        template_args: tuple[str, ...] | None = None,
    ) -> Kernel[P]:
        """The same declaration compiled from another source, with other options or template
        arguments (a separate kernel: compiled, cached and loaded on its own)."""
        derived = Kernel(
            self.__wrapped__,
            self.source if source is None else source,
            self.cpp_name,
            self.options if options is None else options,
            self.template_args if template_args is None else template_args,
            self.host_fn,
            self.params,
            self.touches,
            self.pdl,
            self.reads_before_wait,
            self.max_shared_bytes,
            self.launch_check,
        )
        self._derived.add(derived)
        return derived

    def __getitem__(self, launch: tuple[Dim, Dim] | tuple[Dim, Dim, int]) -> Callable[P, KernelLaunch]:
        # A launch shape made only of plain ints (or tuples of them) is checked once and its
        # Launcher reused. Only exact ints may hit the cache: True == 1.0 == 1 hash alike, and
        # bools and floats must still be refused by _dim3.
        plain = (
            type(launch) is tuple
            and 2 <= len(launch) <= 3
            and (
                (
                    type(launch[0]) is int and type(launch[1]) is int and type(launch[-1]) is int
                )  # [blocks, threads(, shared)]
                or all(type(d) is int or (type(d) is tuple and all(type(e) is int for e in d)) for d in launch)
            )
        )
        if plain:
            cached = self._launchers.get(launch)
            if cached is not None:
                return cached
        if self.template_parameters is not None:  # a launcher of it is never cached above
            raise SignatureError(
                diagnostic(
                    f"`{self.cpp_name}` is a C++ template kernel (template {self.template_parameters}), "
                    "launched without template arguments",
                    ["NVRTC cannot compile a template without them, so no GPU could run this launch"],
                    help=f"instantiate it first, one value per template parameter: "
                    f"{self.__name__}.generics(...)[grid, block](...)",
                )
            )
        if not isinstance(launch, tuple) or len(launch) not in (2, 3):
            raise SignatureError(
                diagnostic(
                    f"`{self.cpp_name}` was indexed with {launch!r}, not a launch configuration",
                    ["a launch configuration is [grid, block] or [grid, block, shared_bytes]"],
                    help=f"launch as {self.cpp_name}[grid, block](...) or "
                    f"{self.cpp_name}[grid, block, shared_bytes](...), e.g. {self.cpp_name}[64, 256](...)",
                )
            )
        grid = _dim3(launch[0], "grid", self.cpp_name)
        block = _dim3(launch[1], "block", self.cpp_name)
        if self.launch_check is not None:
            problem = _launch_problem(self, grid, block)
            if problem is not None:
                raise SignatureError(
                    diagnostic(
                        f"`{self.name_expression}` cannot run as [{grid}, {block}]: {problem}",
                        ["its declaration's launch_check refused the shape: the kernel's code assumes otherwise"],
                        help="launch it with a shape its check accepts (a library kernel's *_op helper picks one)",
                    )
                )
        launcher: Launcher[P, str] = Launcher(
            self, grid, block, _shared_bytes(launch[2], self) if len(launch) == 3 else 0
        )
        if plain:
            if len(self._launchers) >= _LAUNCHER_CACHE:
                self._launchers.clear()
            self._launchers[launch] = launcher
        return launcher


def _launch_problem(kernel: Kernel[Any], grid: tuple[int, int, int], block: tuple[int, int, int]) -> str | None:
    """What the declaration's ``launch_check`` says of this launch shape (None: it runs)."""
    assert kernel.launch_check is not None
    try:
        problem = kernel.launch_check(grid, block, kernel.template_args)
        if problem is None or (type(problem) is str and problem):
            return problem
        raise SignatureError(
            diagnostic(
                f"the launch_check of `{kernel.name_expression}` returned {problem!r} for [{grid}, {block}]",
                ["launch_check(grid, block, template_args) says why a shape cannot run (a str), or None"],
                help="return None for a shape the kernel runs, or the reason it cannot (a non-empty str)",
            )
        )
    except ScopeGraphError:
        raise
    except Exception as exc:
        raise SignatureError(
            diagnostic(
                f"the launch_check of `{kernel.name_expression}` raised {type(exc).__name__} "
                f"for [{grid}, {block}]: {exc}",
                ["launch_check(grid, block, template_args) says why a shape cannot run (a str), or None"],
                help="make the check return its reason instead of raising (its traceback is this error's cause)",
            )
        ) from exc


class Launcher(Generic[P, Name]):
    """``kernel[grid, block]``: calling it with the kernel's arguments builds a KernelLaunch.

    Typed as ``Callable[P, KernelLaunch]`` so mypy's messages need no ``__call__``; the mypy
    plugin retypes it as ``Launcher[P, Literal["axpy"] | str]``: the kernel's name travels in the type
    (a variable that holds the launcher keeps it too) to name the kernel in messages, and the call
    reaches the plugin's hooks, which check its borrows. ``Name`` means nothing at run time.
    """

    __slots__ = ("arity", "block", "grid", "kernel", "shmem")

    def __init__(self, kernel: Kernel[P], grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int) -> None:
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shmem = shmem
        self.arity = len(kernel.params)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> KernelLaunch:
        kernel = self.kernel
        binder = kernel._binder
        if kwargs or binder is None or len(args) != self.arity:
            return KernelLaunch(kernel, self.grid, self.block, self.shmem, args, kwargs)
        # KernelLaunch.__init__ inlined (the inner loop of eager code and of recording).
        op = _new_launch(KernelLaunch)
        op.kernel = kernel
        op.grid = self.grid
        op.block = self.block
        op.shmem = self.shmem
        op.native = None
        op.params = _NO_PARAMS
        binder(op, *args)
        return op

    def __repr__(self) -> str:
        return f"{self.kernel.name_expression}[{self.grid}, {self.block}]"


_GLOBAL = re.compile(r"\b__global__\b")
_TEMPLATE = re.compile(r"\btemplate\s*<")


def declared_template(source: str, cpp_name: str) -> str | None:
    """The template parameter list (``"<int BS>"``) when every ``__global__`` declaration of
    ``cpp_name`` in ``source`` is a template (``template <int BS> __global__ void name(...)``);
    None otherwise, and when the source does not spell the declaration out (a macro, an included
    header): the compiler has the last word there, as before."""
    found = declared_templates(source, cpp_name)
    return None if not found or None in found else found[0]


def declared_templates(source: str, cpp_name: str) -> list[str | None]:
    """The template parameter list of each ``__global__`` declaration of ``cpp_name`` that
    ``source`` spells out, in order (None for one that is no template)."""
    code = code_only(source)
    found: list[str | None] = []
    for call in re.finditer(rf"\b{re.escape(cpp_name)}\s*\(", code):
        # The declaration starts after the previous statement, block or brace.
        start = max(code.rfind(mark, 0, call.start()) for mark in ";{}")
        head = code[start + 1 : call.start()]
        if not _GLOBAL.search(head):
            continue  # a call, or a host or device function of that name
        template = _TEMPLATE.search(head)
        if template is None:
            found.append(None)  # a plain kernel of that name: launchable without generics()
            continue
        # To the matching ">": C++ wants a ">" inside a default argument in parentheses.
        depth, parens, at = 0, 0, template.end() - 1
        for at in range(template.end() - 1, len(head)):
            char = head[at]
            parens += {"(": 1, ")": -1}.get(char, 0)
            depth += {"<": 1, ">": -1}.get(char, 0) if parens == 0 else 0
            if depth == 0:
                break
        found.append(" ".join(head[template.end() - 1 : at + 1].split()))
    return found


def _check_template_args(kernel: Kernel[Any], args: tuple[object, ...], key: tuple[str, ...]) -> None:
    """generics() with as many arguments as the template declares (those with defaults may be left
    out), each of the kind its parameter takes (a dtype for ``typename T``, an int or bool for
    ``int N``), where the source spells the declaration out: the host backend would run any, and
    NVRTC refuses the launch only on a GPU. C++ text (a str) must be one argument's: no ``;``,
    braces or unbalanced brackets, which would splice code into the instantiation."""
    for arg, text in zip(args, key, strict=True):
        if isinstance(arg, str) and not _one_argument(text):
            raise SignatureError(
                diagnostic(
                    f"template argument {text!r} of `{kernel.cpp_name}` is not one C++ template argument",
                    ["C++ text is pasted into the instantiation as it is"],
                    help="pass each template argument on its own: an int or bool for a value parameter, a dtype "
                    '(sg.f32) for a type one, or C++ text, a comparison or shift in parentheses ("(64 >> 1)")',
                )
            )
    given = len(key)
    declarations = set(declared_templates(kernel.source, kernel.cpp_name))
    if len(declarations) != 1:  # none readable from the source, or overloads that may differ
        return
    (declared,) = declarations
    if declared is None:
        if not _c_linkage(kernel.source, kernel.cpp_name) and _TEMPLATE.search(code_only(kernel.source)):
            return  # a template somewhere: braces in its parameters (`int N = int{2}`) hide it from the scan
        raise SignatureError(
            diagnostic(
                f"`{kernel.cpp_name}` is not a C++ template kernel, and generics() got {given} template "
                f"argument{'' if given == 1 else 's'}",
                ["NVRTC would refuse the instantiation on a GPU (the host backend cannot tell)"],
                help=f"launch it as it is: {kernel.__name__}[grid, block](...)",
            )
        )
    if "..." in declared:  # a parameter pack: any count
        return
    parameters = _top_level_items(declared[1:-1])
    required = sum("=" not in p for p in parameters)
    if not required <= given <= len(parameters):
        wanted = f"{required}" if required == len(parameters) else f"{required} to {len(parameters)}"
        raise SignatureError(
            diagnostic(
                f"`{kernel.cpp_name}` is declared template {declared}: {wanted} template argument"
                f"{'' if wanted == '1' else 's'}, and generics() got {given}",
                help="pass one value per template parameter, in order "
                "(ints, bools, dtypes such as sg.f32, or C++ text)",
            )
        )
    for position, (arg, parameter) in enumerate(zip(args, parameters, strict=False)):
        takes_type = _TYPE_PARAMETER.fullmatch(parameter) is not None
        first_word = parameter.split()[0] if parameter.split() else ""
        takes_value = first_word in _INTEGER_WORDS or first_word in _C_SIZES or first_word in ("auto", "std::size_t")
        if isinstance(arg, str) or takes_type == takes_value:
            continue  # C++ text, or a parameter of another form (`std::integral T`, a template template one)
        gives_type = not isinstance(arg, (bool, np.bool_, int, np.integer))
        if takes_type != gives_type:
            raise SignatureError(
                diagnostic(
                    f"`{kernel.cpp_name}` is declared template {declared}: template parameter "
                    f"{position + 1}, `{' '.join(parameter.split())}`, takes a {'type' if takes_type else 'value'}, "
                    f"and generics() got {key[position]!r}",
                    ["NVRTC would refuse the instantiation on a GPU (the host backend cannot tell)"],
                    help="pass a dtype (sg.f32) for a type parameter, an int or bool for a value one",
                )
            )


# A template type parameter: `typename T`, `class T = float`, `typename... Ts` (not a value
# parameter whose type is spelled with typename: `typename std::enable_if<...>::type = 0`).
_TYPE_PARAMETER = re.compile(r"\s*(?:typename|class)\b\s*(?:\.\.\.)?\s*(?:\w+)?\s*(?:=.*)?", re.S)


def _one_argument(text: str) -> bool:
    """Whether C++ text can be one template argument: no statement or block, brackets balanced,
    and no `,` or `>` outside them that would end the argument (a comparison or a shift goes in
    parentheses: ``"(64 >> 1)"``)."""
    if not text.strip() or any(c in text for c in ";{}"):
        return False
    parens = angles = 0
    for char in text:
        parens += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if parens == 0:
            angles += {"<": 1, ">": -1}.get(char, 0)
            if angles < 0 or (char == "," and angles == 0):
                return False
        if parens < 0:
            return False
    return parens == 0 and angles == 0


def _c_linkage(source: str, name: str) -> bool:
    """Whether ``name`` is declared with C linkage, ``extern "C" __global__ ...`` or inside an
    ``extern "C" { ... }`` block: then it is certainly no template."""
    if re.search(rf'\bextern\s+"C"[^;{{}}]*\b{re.escape(name)}\s*\(', source):
        return True
    declared = re.search(rf"\b__global__\b[^;{{}}]*\b{re.escape(name)}\s*\(", source)
    if declared is None:
        return False
    for block in re.finditer(r'\bextern\s+"C"\s*\{', source[: declared.start()]):
        depth, at = 1, block.end()
        while depth and at < declared.start():
            depth += {"{": 1, "}": -1}.get(source[at], 0)
            at += 1
        if depth:  # still open where the kernel is declared
            return True
    return False


def _top_level_items(text: str) -> list[str]:
    """The comma-separated items of a template parameter list, not splitting inside <> (outside
    parentheses, where C++ reads < and > as comparisons: ``int A = (3 > 2)``), () or []."""
    items, angles, parens, start = [], 0, 0, 0
    for at, char in enumerate(text):
        parens += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        angles += {"<": 1, ">": -1}.get(char, 0) if parens == 0 else 0
        if char == "," and angles == 0 and parens == 0:
            items.append(text[start:at])
            start = at + 1
    last = text[start:]
    return [*items, last] if last.strip() or items else []


def _template_arg(arg: object) -> str:
    if isinstance(arg, (bool, np.bool_)):
        return "true" if arg else "false"
    if isinstance(arg, (int, np.integer)):
        return str(int(arg))
    if isinstance(arg, str):
        return arg
    if isinstance(arg, (float, np.generic)):  # a value that is no int: numpy would read its dtype
        raise SignatureError(
            diagnostic(
                f"template argument {arg!r} is neither an integer nor a type",
                help="pass an int or bool for a value parameter, a dtype (sg.f32) for a type one, "
                "or the C++ text of the argument as a str",
            )
        )
    return as_dtype(arg).ctype


def kernel(
    source: str,
    *,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    touches: Mapping[str, str] | None = None,
    pdl: bool = False,
    reads_before_wait: Sequence[str] = (),
    max_shared_bytes: int | None = None,
    launch_check: LaunchCheck | None = None,
) -> Callable[[Callable[P, None]], Kernel[P]]:
    """Declare a CUDA C++ kernel. The C++ name defaults to the Python function's name; either
    must be one NVRTC can find the kernel by, a C++ identifier or one qualified by namespaces
    (``ns::name``), without template arguments (``k.generics(...)`` gives those): any other is a
    SignatureError here, on every backend.

    ``options`` are cuda.core ``ProgramOptions`` fields (e.g. ``{"use_fast_math": True}``);
    the architecture is always the device's own. They are checked here as far as that needs
    neither a file nor a compile (the names, ``arch`` and ``name`` being scopegraph's, the types
    of the values): an option a GPU's compile would refuse is a CompileError when the kernel is
    declared, on every backend. The include directories and headers are checked at its first
    launch (they may be written after the declaration).

    ``touches`` declares how much of each tensor a launch may touch, as an expression of the
    scalar parameters and ``grid_x``..``block_z``: ``touches={"out": "n", "w": "n * k"}``. Every
    launch is then checked (a launch that would reach past a tensor is a SignatureError), which
    is what keeps "disjoint views never conflict" true for a kernel that takes a size argument.

    ``pdl=True`` declares that the kernel is written for programmatic dependent launch: every
    thread executes ``griddepcontrol.wait`` before it writes memory, before it reads anything but
    the read-only parameters named in ``reads_before_wait`` (weights it may start loading early),
    and before it exits. An edge between two such kernels becomes programmatic on sm_90+ (the
    dependent starts while its predecessor runs; see ``scopegraph._pdl``); a kernel may also call
    ``griddepcontrol.launch_dependents`` to let its own dependents start early. Compiling a
    ``pdl=True`` kernel for sm_90+ checks that its code executes ``griddepcontrol.wait`` (or
    ``cudaGridDependencySynchronize()``) somewhere in the kernel or the device functions it calls;
    one that never waits is a PdlWaitError when it is first launched or recorded. The check sees
    whether the wait is there, not whether it comes early enough or on every path.

    ``max_shared_bytes`` sets how much dynamic shared memory a launch may ask for (48 KiB if left
    out), checked when each launch is built; past 48 KiB it opts in to more (CUDA's
    ``cudaFuncAttributeMaxDynamicSharedMemorySize``). The GPU's own limit (227 KiB a block on sm_90, less
    on older GPUs, minus the kernel's static shared memory) is checked when a launch is run or
    recorded: past it is a LaunchResourceError.

    ``launch_check(grid, block, template_args)`` says why a launch shape cannot run the kernel (a
    str), or None when it can: for the rules its code assumes and no driver checks (whole warps, a
    block of the template's size, a one-dimensional grid). It runs once per launch shape, when
    the first op of that shape is built; a shape it refuses is a SignatureError there.
    """

    declared = _check_declaration(source, name, options, touches, pdl, reads_before_wait)
    if launch_check is not None and not callable(launch_check):
        raise SignatureError(
            diagnostic(
                f"@sg.kernel(..., launch_check={launch_check!r}): not a function",
                help="pass a function (grid, block, template_args) -> str | None, or leave it out",
            )
        )

    def wrap(fn: Callable[P, None]) -> Kernel[P]:
        if not inspect.isfunction(fn):
            raise SignatureError(
                diagnostic(
                    f"@sg.kernel(...) was applied to {type(fn).__name__} {fn!r}, not a function",
                    ["the decorated function's signature declares the kernel's parameters"],
                    help="decorate a Python function: @sg.kernel(SOURCE) then "
                    "def name(out: Mut[Tensor], x: Tensor, n: sg.i32) -> None: ...",
                )
            )
        problem = None if name is not None else _cpp_name_problem(fn.__name__)
        if problem is not None:
            raise SignatureError(
                diagnostic(
                    f"@sg.kernel(...) on `{fn.__qualname__}`: without name=, the kernel's C++ name is the "
                    f"function's, and {problem[0]}",
                    help=problem[1],
                )
            )
        made: Kernel[P] = Kernel(
            fn,
            source,
            name or fn.__name__,
            declared,
            touches=touches,
            pdl=pdl,
            reads_before_wait=reads_before_wait,
            max_shared_bytes=max_shared_bytes,
            launch_check=launch_check,
        )
        if declared:
            # Refused now where a GPU's compile would refuse them, as far as that needs no file:
            # the first launch checks the include directories and headers too.
            check_options(made, headers=False)
        return made

    return wrap


# A name NVRTC can find a kernel by: an identifier, or one qualified by its namespaces (ns::name,
# ::name), without template arguments (generics() gives those). NVRTC reads ASCII identifiers only.
_CPP_NAME = re.compile(r"(?:::)?[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*")
_CPP_KEYWORDS = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires return
    short signed sizeof static static_assert static_cast struct switch template this thread_local
    throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
    xor xor_eq""".split()  # noqa: SIM905  # the keywords of C++20
)


def _cpp_name_problem(name: str) -> tuple[str, str] | None:
    """Why ``name`` cannot be the C++ name of a kernel (completing "the kernel's C++ name ..."),
    with the help line's advice; None when it can be: a C++ identifier, or one qualified by
    namespaces (``ns::name``). NVRTC would refuse any other only when a GPU compiles it."""
    declared = (
        'pass name= the name the source gives the __global__ function, e.g. name="scale" for '
        "`__global__ void scale(...)`"
    )
    template = name.find("<")
    if template > 0 and name.endswith(">") and _CPP_NAME.fullmatch(name[:template]):
        return (
            f"{name!r} has template arguments, which are the launch's, not the name's",
            f'pass name="{name[:template]}" and instantiate the template when launching it: '
            f"kernel.generics({', '.join(repr(a.strip()) for a in _top_level_items(name[template + 1 : -1]))})"
            "[grid, block](...)",
        )
    if not _CPP_NAME.fullmatch(name):
        return (
            f"{name!r} is not a C++ identifier (letters, digits and _, not starting with a digit; "
            "ns::name for a kernel declared in a namespace)",
            declared,
        )
    keyword = next((part for part in name.split("::") if part in _CPP_KEYWORDS), None)
    if keyword is not None:
        what = f"is the C++ keyword `{keyword}`" if keyword == name else f"has the C++ keyword `{keyword}` in it"
        return f"{name!r} {what}, which nothing can be named", declared
    return None


def _check_declaration(
    source: object, name: object, options: object, touches: object, pdl: object, reads_before_wait: object
) -> tuple[tuple[str, object], ...]:
    """Refuse a ``@sg.kernel(...)`` argument of the wrong type (a SignatureError with help), when the
    kernel is declared; the options as the Kernel keeps them."""

    def refuse(argument: str, takes: str, help: str) -> SignatureError:
        return SignatureError(diagnostic(f"@sg.kernel(..., {argument}): {takes}", help=help))

    if not isinstance(source, str):
        raise refuse(
            f"source={type(source).__name__}",
            "the first argument is the kernel's CUDA C++ source",
            "pass the source as a str (e.g. read from a .cu file)",
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise refuse(
            f"name={name!r}",
            "name= takes the kernel's C++ name, a non-empty str",
            "pass the C++ function's name as a str, or leave name= out to use the Python function's name",
        )
    problem = None if name is None else _cpp_name_problem(name)
    if problem is not None:
        raise refuse(f"name={name!r}", f"the kernel's C++ name {problem[0]}", problem[1])
    if options is not None and (not isinstance(options, Mapping) or not all(isinstance(key, str) for key in options)):
        raise refuse(
            f"options={options!r}",
            "options= takes a mapping of cuda.core ProgramOptions fields to values",
            'pass a dict, e.g. options={"use_fast_math": True}',
        )
    if touches is not None and (
        not isinstance(touches, Mapping)
        or not all(
            isinstance(key, str) and (isinstance(value, str) or type(value) is int) for key, value in touches.items()
        )
    ):
        raise refuse(
            f"touches={touches!r}",
            "touches= takes a mapping of tensor parameter names to size expressions (str)",
            'pass a dict, e.g. touches={"out": "n", "w": "n * k"}',
        )
    if type(pdl) is not bool:
        raise refuse(
            f"pdl={pdl!r}",
            "pdl= takes True or False",
            "pdl=True only for a kernel written for programmatic dependent launch (it waits with "
            "griddepcontrol.wait before it reads its predecessors' outputs); else leave it out",
        )
    names = (reads_before_wait,) if isinstance(reads_before_wait, str) else reads_before_wait
    if not isinstance(names, (tuple, list, set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise refuse(
            f"reads_before_wait={reads_before_wait!r}",
            "reads_before_wait= takes the names of read-only Tensor parameters",
            'pass a tuple of parameter names (str), e.g. reads_before_wait=("w",)',
        )
    return tuple(sorted((options or {}).items()))  # keys are distinct strs: values are never compared


def _host_launch(fn: object) -> tuple[str, ...]:
    """The launch fields ("grid", "block", "template_args") a host reference declares as
    keyword-only parameters."""
    signature = _signature(fn)
    return () if signature is None else _launch_fields(signature)


def _signature(fn: object) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: positional arguments only
        return None


def _launch_fields(signature: inspect.Signature) -> tuple[str, ...]:
    parameters = signature.parameters
    return tuple(
        n
        for n in ("grid", "block", "template_args")
        if n in parameters and parameters[n].kind is inspect.Parameter.KEYWORD_ONLY
    )


def _check_host(fn: object, kernel: Kernel[Any]) -> tuple[str, ...]:
    """A host reference must be callable with one argument per declared parameter (and the launch
    fields it declares); returns those fields (see Kernel.host)."""
    name = kernel.__name__
    if not callable(fn):
        raise SignatureError(
            diagnostic(
                f"`{kernel.name_expression}` got {type(fn).__name__} {fn!r} as its host reference, not a function",
                [f"declared as {kernel!r}"],
                help=f"register a numpy function: @{name}.host then def _(...) with one parameter per kernel parameter",
            )
        )
    signature = _signature(fn)
    if signature is None:
        return ()  # cannot be checked before it runs
    launch = _launch_fields(signature)
    try:
        signature.bind(*kernel.params, **dict.fromkeys(launch))
    except TypeError as exc:
        raise SignatureError(
            diagnostic(
                f"the host reference {getattr(fn, '__name__', repr(fn))}{signature} of `{kernel.name_expression}` "
                f"cannot take its arguments ({exc})",
                [f"declared as {kernel!r}", "a reference gets one argument per kernel parameter, in order"],
                help=f"give the reference {len(kernel.params)} positional parameters "
                f"({', '.join(p.name for p in kernel.params) or 'none'}); "
                "keyword-only `grid` and `block` get the launch's, `template_args` a template's arguments",
            )
        ) from None
    return launch


_NO_PARAMS: tuple[tuple[int, Param[Any]], ...] = ()
_new_launch = object.__new__


# Numpy scalars made by the generated binders, by Python value, per scalar parameter: launches
# repeat the same few sizes, and a dict lookup is a tenth of a numpy conversion. Numpy scalars
# are immutable, so sharing one is safe. Bounded: a cache starts over past this many values.
_SCALAR_CACHE = 1024


def _make_binder(kernel: Kernel[Any], declared: CDeclaration | None) -> Callable[..., None]:
    """The function that checks and binds one launch's arguments, generated once per kernel from
    its declaration (building an op is the inner loop of eager code and of recording) and the
    dtypes each tensor's C++ pointer takes (``pointees``, see pointee_dtypes: for a tensor with no
    declared dtype, ``if t1.dtype is not K1_0 ...: op._pointee_error(P1, t1, K1, CP1)``, where
    CP1 is its C++ parameter in ``declared``, c_declaration's answer).

    For ``add(out: Mut[Tensor] (dtype f32), a: Tensor (dtype f32), n: sg.i32)`` with
    ``touches={"out": "n", "a": "n"}`` it reads::

        def bind(op, a0, a1, a2):
            # out: Mut[Tensor] (dtype f32)
            if type(a0) is Mut:
                t0 = a0.tensor
            else:
                t0 = borrowed_tensor(a0, True, NAME, 'out', DECLARED)
            if (t0.dtype is not D0 and t0.dtype != D0):
                op._spec_error(P0, t0)
            # a: Tensor (dtype f32)
            t1 = a1 if isinstance(a1, Tensor) else borrowed_tensor(a1, False, NAME, 'a', DECLARED)
            if (t1.dtype is not D1 and t1.dtype != D1):
                op._spec_error(P1, t1)
            # n: sg.i32
            if type(a2) is int and LO2 <= a2 <= HI2:
                v2 = C2.get(a2)
                if v2 is None:
                    v2 = cached(C2, a2, S2(a2))
                x2 = a2
            else:
                v2 = op._scalar(P2, a2)
                x2 = v2.item() if type(v2) is not Param else 0
            args = op.args = (t0, t1, v2)
            if op.params:
                op.params = tuple((i, v) for i, v in enumerate(args) if type(v) is Param)
                op._check_touches(TOUCHES, op.resolved(None))
            else:
                try:
                    fits = 0 <= (x2) and (x2) * 4 <= t0.nbytes and 0 <= (x2) and (x2) * 4 <= t1.nbytes
                except ZeroDivisionError:  # `//` by a zero argument: _check_touches says so
                    fits = False
                if not fits:
                    op._check_touches(TOUCHES, args)
            b0 = NEW(Borrow)
            b0.tensor = t0
            m0 = b0.alloc = t0._alloc
            s0 = b0.start = m0.address + t0.offset
            e0 = b0.end = s0 + t0.nbytes
            b0.mutable = True
            b0.param = 'out'
            b1 = NEW(Borrow)
            ...  (the same for `a`)
            borrows = [b0, b1]
            device = m0.device
            if (m1.device is not device or m0.freed or m1.freed or m0.region.frozen
                    or (s1 < e0 and s0 < e1)):
                op._claim(borrows)
            else:
                op.borrows = borrows
                op.device = device

    Every check and message is the general path's: the fast branches only accept what it
    accepts (a plain int in range, a float that cannot overflow, borrows that are plainly
    disjoint, alive, unfrozen and on one device); anything else goes through ``_scalar``,
    ``borrowed_tensor``, ``_spec_error``, ``_check_touches`` and ``_claim``, which raise where
    the general path does. The source is built from the parameters' positions and ``repr()`` of
    their names; everything else it uses comes in through the namespace below (``bind.__doc__``
    holds the source)."""
    params = kernel.params
    n = len(params)
    pointees = pointee_dtypes(params, declared)
    touches = kernel.touches
    # Scalars the touches expressions use get their Python value; the others pass 0 unread.
    used = (
        set()
        if touches is None
        else {
            node.id
            for e in touches.expressions
            for node in ast.walk(ast.parse(e, mode="eval"))
            if isinstance(node, ast.Name)
        }
    )
    ns: dict[str, Any] = {
        "Mut": Mut,
        "Tensor": Tensor,
        "Param": Param,
        "Borrow": Borrow,
        "borrowed_tensor": borrowed_tensor,
        "NAME": kernel.name_expression,
        "DECLARED": f"declared as {kernel!r}",
        "TOUCHES": kernel.touches,
        "cached": _cached,
        "NEW": object.__new__,
        "RAW": uint8,
    }
    lines = [f"def bind(op{''.join(f', a{i}' for i in range(n))}):"]
    borrows: list[tuple[int, bool, str]] = []  # (position, mutable, name)
    scalars: list[str] = []
    for i, p in enumerate(params):
        lines.append(f"    # {p.describe()}")
        ns[f"P{i}"] = p
        if p.kind == "scalar":
            dtype = p.dtype
            assert dtype is not None
            kind = dtype.numpy.kind
            ns[f"S{i}"], ns[f"C{i}"] = dtype.numpy.type, {}
            convert = [
                f"        v{i} = C{i}.get(a{i})",
                f"        if v{i} is None:",
                f"            v{i} = cached(C{i}, a{i}, S{i}(a{i}))",
            ]
            if kind in "iu":
                ns[f"LO{i}"], ns[f"HI{i}"] = (int(np.iinfo(dtype.numpy).min), int(np.iinfo(dtype.numpy).max))
                lines += [f"    if type(a{i}) is int and LO{i} <= a{i} <= HI{i}:", *convert]
                lines += [f"        x{i} = a{i}"] if p.name in used else []
            elif kind == "f":
                # Any Python float in [-max, max] converts without overflow (DType.scalar's check);
                # one that becomes 0 underflowed, and _scalar refuses it. Zero is left to _scalar:
                # 0.0 == -0.0 as dict keys, but the kernel sees their sign.
                ns[f"HI{i}"] = float(np.finfo(dtype.numpy).max)
                lines += [
                    f"    if type(a{i}) is float and -HI{i} <= a{i} <= HI{i} and a{i} != 0.0:",
                    f"        v{i} = C{i}.get(a{i})",
                    f"        if v{i} is None:",
                    f"            v{i} = S{i}(a{i})",
                    f"            v{i} = cached(C{i}, a{i}, v{i}) if v{i} else op._scalar(P{i}, a{i})",
                ]
                lines += [f"        x{i} = v{i}.item()"] if p.name in used else []
            else:
                lines += ["    if False:", "        pass"]
            lines += ["    else:", f"        v{i} = op._scalar(P{i}, a{i})"]
            if p.name in used:
                lines.append(f"        x{i} = v{i}.item() if type(v{i}) is not Param else 0")
            scalars.append(f"x{i}" if p.name in used else "0")
            continue
        mutable = p.kind == "mut"
        if mutable:
            lines += [
                f"    if type(a{i}) is Mut:",
                f"        t{i} = a{i}.tensor",
                "    else:",
                f"        t{i} = borrowed_tensor(a{i}, True, NAME, {p.name!r}, DECLARED)",
            ]
        else:
            shared = f"borrowed_tensor(a{i}, False, NAME, {p.name!r}, DECLARED)"
            lines.append(f"    t{i} = a{i} if isinstance(a{i}, Tensor) else {shared}")
        spec = []
        if p.dtype is not None:
            ns[f"D{i}"] = p.dtype
            spec.append(f"(t{i}.dtype is not D{i} and t{i}.dtype != D{i})")
        if p.rank is not None:
            spec.append(f"len(t{i}.shape) != {int(p.rank)}")
        if spec:
            lines += [f"    if {' or '.join(spec)}:", f"        op._spec_error(P{i}, t{i})"]
        if p.dtype is None and pointees[i]:  # (a declared one was checked against the pointer by check_c_parameters)
            assert declared is not None
            ns[f"K{i}"], ns[f"CP{i}"] = pointees[i], declared.params[i]
            ns.update({f"K{i}_{j}": d for j, d in enumerate(pointees[i])})
            unlike = [f"t{i}.dtype is not K{i}_{j}" for j in range(len(pointees[i]))] + [f"t{i}.dtype is not RAW"]
            lines += [f"    if {' and '.join(unlike)}:", f"        op._pointee_error(P{i}, t{i}, K{i}, CP{i})"]
        borrows.append((i, mutable, p.name))
    values = [f"v{i}" if p.kind == "scalar" else f"t{i}" for i, p in enumerate(params)]
    lines.append(f"    args = op.args = ({', '.join(values)}{',' if len(values) == 1 else ''})")
    lines += ["    if op.params:", "        op.params = tuple((i, v) for i, v in enumerate(args) if type(v) is Param)"]
    if touches is not None:
        # The expressions inline, over the binder's locals (they hold only names, int constants
        # and + - * //: see _parse_touches); Python ints, so no product wraps.
        local = {p.name: f"x{i}" for i, p in enumerate(params) if p.kind == "scalar"}
        local.update({name: f"{name[:-2]}[{'xyz'.index(name[-1])}]" for name in LAUNCH_NAMES})
        fits = []
        for pos, expression, element in zip(
            touches.params, touches.expressions, kernel._touch_element_bytes(), strict=True
        ):
            count = f"({_rename(expression, local)})"
            fits.append(  # a known element size: compare bytes
                f"0 <= {count} <= t{pos}.size"
                if element is None
                else f"0 <= {count} and {count} * {element} <= t{pos}.nbytes"
            )
        lines += [
            "        op._check_touches(TOUCHES, op.resolved(None))",
            "    else:",
            *[f"        {d} = op.{d}" for d in ("grid", "block") if any(n.startswith(d) for n in used)],
            "        try:",
            f"            fits = {' and '.join(fits)}",
            "        except ZeroDivisionError:  # `//` by a zero argument: _check_touches says so",
            "            fits = False",
            "        if not fits:",
            "            op._check_touches(TOUCHES, args)",
        ]
    if borrows:
        k = len(borrows)
        # Borrow.__init__ inlined (the same fields, computed the same way).
        for j, (i, m, name) in enumerate(borrows):
            lines += [
                f"    b{j} = NEW(Borrow)",
                f"    b{j}.tensor = t{i}",
                f"    m{j} = b{j}.alloc = t{i}._alloc",
                f"    s{j} = b{j}.start = m{j}.address + t{i}.offset",
                f"    e{j} = b{j}.end = s{j} + t{i}.nbytes",
                f"    b{j}.mutable = {m}",
                f"    b{j}.param = {name!r}",
            ]
        lines.append(f"    borrows = [{', '.join(f'b{j}' for j in range(k))}]")
        suspicious = [f"m{j}.device is not device" for j in range(1, k)]
        suspicious += [f"m{j}.freed" for j in range(k)]
        suspicious += [f"m{j}.region.frozen" for j, (_, m, _) in enumerate(borrows) if m]
        suspicious += [
            f"(s{j} < e{i} and s{i} < e{j})"
            for i in range(k)
            for j in range(i + 1, k)
            if borrows[i][1] or borrows[j][1]
        ]
        lines += [
            "    device = m0.device",
            f"    if {' or '.join(suspicious)}:",
            "        op._claim(borrows)  # raises, unless a closer look clears it (empty ranges, frozen elsewhere)",
            "    else:",
            "        op.borrows = borrows",
            "        op.device = device",
        ]
    else:
        lines += ["    op.borrows = []", "    op.device = None"]
    source = "\n".join(lines) + "\n"
    exec(source, ns)  # built from positions, validated names (repr) and the namespace above
    bind: Callable[..., None] = ns["bind"]
    bind.__doc__ = source
    return bind


def _rename(expression: str, names: Mapping[str, str]) -> str:
    """A touches expression with its names replaced by the binder's locals."""
    tree = ast.parse(expression, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = names[node.id]
    return ast.unparse(tree)


def _cached(cache: dict[object, np.generic], key: object, value: np.generic) -> np.generic:
    if len(cache) >= _SCALAR_CACHE:
        cache.clear()
    cache[key] = value
    return value


class KernelLaunch(GraphNode):
    """One launch of a kernel: grid, block, shared memory and checked arguments."""

    __slots__ = ("args", "block", "grid", "kernel", "native", "params", "shmem")

    # Tensors for borrows, numpy scalars of the declared C type (or sg.Params) for the rest: set
    # by the kernel's binder (_make_binder).
    args: tuple[Any, ...]

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
        if kwargs or len(args) != len(kernel.params):
            args = self._bind(args, kwargs)
        binder = kernel._binder
        # Sets args (tensors for borrows, numpy scalars of the declared C type or sg.Params for
        # the rest), params, borrows and device, with every check (see _make_binder).
        if binder is not None:
            binder(self, *args)
            return
        # The kernel's first launch: the declaration's checks, kept (with the binder) once one passes
        # them. This launch's own mistakes (a borrow, a size) are reported first: they are the
        # caller's line, the declaration's are the kernel's.
        if kernel.options:  # refused where a GPU's compile would refuse them, on every backend
            check_options(kernel)
        declared = c_declaration(kernel)
        binder = _make_binder(kernel, declared)
        binder(self, *args)
        check_c_parameters(kernel, declared)
        kernel._binder = binder

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
        if not dtype.takes_argument(arg):
            if type(arg) is Param:
                return self._param(param, arg)
            raise SignatureError(
                diagnostic(
                    f"`{self.name}` parameter `{param.name}` expects {dtype.spelling}, "
                    f"got {type(arg).__name__} {arg!r}",
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
                    f"`{self.name}` parameter `{param.name}` expects {param.dtype.spelling}, "
                    f"got {arg!r} of {arg.dtype.spelling}",
                    [f"declared as {self.kernel!r}"],
                    help=f"declare the parameter as sg.Param({arg.name!r}, {param.dtype.spelling}, ...)",
                )
            )
        self.params = ((-1, arg),)  # marks the launch as having parameters; __init__ lists them
        return arg

    def with_values(self, args: tuple[Any, ...]) -> KernelLaunch:
        """This launch with ``args`` (``resolved`` ones: values in place of its sg.Params) and no
        parameters: the same borrows and device, as the values change no tensor, and a bound form
        of its own (this launch's holds the defaults). ``graph.update`` runs it."""
        op = _new_launch(KernelLaunch)
        op.kernel, op.grid, op.block, op.shmem = self.kernel, self.grid, self.block, self.shmem
        op.borrows, op.device = self.borrows, self.device
        op.args = args
        op.native = None
        op.params = _NO_PARAMS
        return op

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
        try:
            counts = touches.count(*scalars, *self.grid, *self.block)
        except ZeroDivisionError:
            raise SignatureError(
                diagnostic(
                    f"`{self.name}`: a declared size ({', '.join(touches.expressions)}) divides by zero",
                    [self._launched_as(args)],
                    help="pass a non-zero value for the argument that the touches expression divides by",
                )
            ) from None
        for position, need, name, expression, element in zip(
            touches.params, counts, touches.names, touches.expressions, self.kernel._touch_element_bytes(), strict=True
        ):
            tensor = self.args[position]
            if element is None or element == tensor.dtype.itemsize:
                if not 0 <= need <= tensor.size:
                    raise SignatureError(
                        diagnostic(
                            f"`{self.name}` would touch {need} elements of `{name}`, but `{tensor.name}` has "
                            f"{tensor.size}",
                            [f"declared: `{name}` touches {expression} elements", self._launched_as(args)],
                            help=f"pass a size that fits `{tensor.name}` ({tensor.size} elements), or a larger tensor",
                        )
                    )
            elif not 0 <= need * element <= tensor.nbytes:
                raise SignatureError(
                    diagnostic(
                        f"`{self.name}` would touch {need} {element}-byte elements of `{name}` "
                        f"({need * element} bytes), but `{tensor.name}` has {tensor.nbytes} bytes "
                        f"({tensor.size} of {tensor.dtype.name})",
                        [
                            f"declared: `{name}` touches {expression} elements; `{name}` has no dtype, so they are "
                            f"the kernel's own, {element}-byte ones, as its C declaration points to",
                            self._launched_as(args),
                        ],
                        help=f"pass a tensor of at least {need * element} bytes; a count meant in "
                        f"`{tensor.name}`'s {tensor.dtype.itemsize}-byte elements must be in the kernel's",
                    )
                )

    def _launched_as(self, args: tuple[Any, ...]) -> str:
        scalars = ", ".join(
            f"{p.name}={a}" for p, a in zip(self.kernel.params, args, strict=True) if p.kind == "scalar"
        )
        return f"launched as {self.name}[{self.grid}, {self.block}] with {scalars}"

    def _pointee_error(self, param: KernelParam, tensor: Tensor, allowed: tuple[DType, ...], c: CParam) -> None:
        """Refuse ``tensor`` for a parameter whose C++ pointer ``c`` takes ``allowed`` dtypes, or raw
        bytes (an sg.u8 tensor); a dtype equal to one of them but another object (unpickled) passes."""
        if tensor.dtype in allowed or tensor.dtype == uint8:
            return
        what, fix = pointee_problem(tensor.dtype, c, allowed, "pass a tensor of")
        raise SignatureError(
            diagnostic(
                f"`{self.name}` parameter `{param.name}` got `{tensor.name}` of dtype {tensor.dtype.name}, and {what}",
                [f"declared as {self.kernel!r}", "on a GPU it would compute garbage; the host reference would not"],
                help=fix,
            )
        )

    def _spec_error(self, param: KernelParam, tensor: Tensor) -> None:
        raise SignatureError(
            diagnostic(
                f"`{self.name}` parameter `{param.name}` got `{tensor.name}` "
                f"of dtype {tensor.dtype.name} and rank {tensor.ndim}",
                [f"declared as {param.describe()}"],
                help="pass a tensor of the declared dtype, or view() it to the declared rank",
            )
        )
