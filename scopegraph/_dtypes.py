"""Element types. ``sg.f32`` and friends are ``typing.Annotated`` aliases: mypy sees ``float`` or
``int``, while at run time the annotation carries the C type a kernel parameter is passed as.

The same names serve as tensor dtypes (``dev.zeros((n,), sg.f32)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeAlias, Union, get_args, get_origin

import numpy as np

from ._errors import SignatureError, diagnostic


@dataclass(frozen=True, slots=True)
class DType:
    """One element type: its short name, numpy dtype and C++ spelling."""

    name: str
    numpy: np.dtype[Any]
    ctype: str

    @property
    def itemsize(self) -> int:
        return int(self.numpy.itemsize)

    @property
    def is_float(self) -> bool:
        return self.numpy.kind == "f"

    def takes_argument(self, value: object) -> bool:
        """Whether ``value`` has a Python type a kernel argument of this type takes: bools for
        bool, numbers for floats, integers (not floats, not bools) for integer types. Its range and
        exactness are :meth:`scalar`'s to check."""
        if self.name == "bool":
            return isinstance(value, (bool, np.bool_))
        if isinstance(value, (bool, np.bool_)):
            return False
        if self.numpy.kind == "f":
            return isinstance(value, (int, float, np.integer, np.floating))
        return isinstance(value, (int, np.integer))

    def scalar(self, value: object, what: str = "the value") -> np.generic:
        """``value`` as a numpy scalar of this type (cuda.core passes plain ints as pointers).

        Exactness is checked, never left to numpy: an integer type takes integers (or floats with
        an integral value) in its range, a float type takes any float that does not overflow it
        (rounding to the nearest representable value is accepted: 0.1 has no exact binary form in
        any float type) and only the integers it holds exactly (16777217 is not an sg.f32: it
        would become 16777216), and no non-zero value that would become 0 (1e-50 in an sg.f32);
        ``bool`` takes only bools. Anything else is a SignatureError
        naming ``what``."""
        kind = self.numpy.kind
        if type(value) is int and kind in "iu":  # the common case, in users' inner loops
            low, high = _INT_RANGE[self.name]
            if low <= value <= high:
                return self.numpy.type(value)  # type: ignore[no-any-return]
        problem = ""
        if kind == "b":
            if not isinstance(value, (bool, np.bool_)):
                problem = "bool takes True or False"
        elif not isinstance(value, (int, float, np.integer, np.floating, np.bool_)) or isinstance(
            value, (bool, np.bool_)
        ):
            problem = f"{self.spelling} takes {'a number' if kind == 'f' else 'an integer'}, not {type(value).__name__}"
        elif kind in "iu":
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                problem = f"{self.spelling} holds integers only"
            else:
                low, high = _INT_RANGE[self.name]
                if not low <= int(value) <= high:
                    problem = f"{self.spelling} holds {low}..{high}"
        else:
            try:
                converted = float(value)
            except OverflowError:  # an int beyond every float type (10**400): never inf, never -inf
                problem = f"it overflows {self.spelling} (largest {np.finfo(self.numpy).max})"
            else:
                with np.errstate(over="ignore"):
                    result = self.numpy.type(converted)
                if np.isinf(result) and not (
                    np.isinf(value) if isinstance(value, np.floating) else np.isinf(converted)
                ):
                    problem = f"it overflows {self.spelling} (largest {np.finfo(self.numpy).max})"
                elif isinstance(value, (int, np.integer)) and int(result) != int(value):
                    problem = f"it would become {int(result)}"
                elif result == 0 and value != 0:  # not `converted`: a longdouble may underflow a float too
                    problem = f"it underflows to 0 (smallest {np.finfo(self.numpy).smallest_subnormal})"
                else:
                    return result  # type: ignore[no-any-return]
        if problem:
            shown = repr(value)
            if type(value) is int and len(shown) > 40:  # 10**400: its 401 digits say nothing
                shown = f"{'a negative' if value < 0 else 'an'} integer of {len(shown.lstrip('-'))} digits"
            raise SignatureError(
                diagnostic(
                    f"{what} is {shown}, which {self.spelling} cannot hold exactly: {problem}",
                    help="pass True or False"
                    if kind == "b"
                    else f"pass a value of the declared type, or declare a wider type than {self.spelling}",
                )
            )
        return self.numpy.type(value)  # type: ignore[no-any-return]

    @property
    def spelling(self) -> str:
        """How messages name this type: its public name (``sg.f32``), or ``bool`` for the boolean
        type, which has no ``sg.`` name (pass ``bool`` or ``numpy.bool_`` as a dtype)."""
        return "bool" if self.name == "bool" else f"sg.{self.name}"

    def __eq__(self, other: object) -> bool:
        """Equal to the same dtype, and to the alias that names it: ``t.dtype == sg.f32`` (an
        ``Annotated[float, ...]`` naming float32) is ``t.dtype == sg.float32``; ``sg.f32 == t.dtype`` too,
        through this reflected method. Anything else is not a dtype: NotImplemented."""
        found = other if type(other) is DType else dtype_of_annotation(other)
        if found is None:
            return NotImplemented
        return found is self or (self.name, self.numpy, self.ctype) == (found.name, found.numpy, found.ctype)

    def __hash__(self) -> int:
        # Equal objects hash alike, the alias that names a dtype included: `sg.f32 in {t.dtype}`.
        alias = _ALIAS_HASHES.get(self.name)
        return hash((self.name, self.numpy, self.ctype)) if alias is None else alias

    def __repr__(self) -> str:
        return self.spelling


float16 = DType("f16", np.dtype(np.float16), "__half")
float32 = DType("f32", np.dtype(np.float32), "float")
float64 = DType("f64", np.dtype(np.float64), "double")
int8 = DType("i8", np.dtype(np.int8), "signed char")
int16 = DType("i16", np.dtype(np.int16), "short")
int32 = DType("i32", np.dtype(np.int32), "int")
int64 = DType("i64", np.dtype(np.int64), "long long")
uint8 = DType("u8", np.dtype(np.uint8), "unsigned char")
uint32 = DType("u32", np.dtype(np.uint32), "unsigned int")
uint64 = DType("u64", np.dtype(np.uint64), "unsigned long long")
boolean = DType("bool", np.dtype(np.bool_), "bool")

_INT_RANGE: dict[str, tuple[int, int]] = {}

ALL_DTYPES = (float16, float32, float64, int8, int16, int32, int64, uint8, uint32, uint64, boolean)
_BY_NUMPY = {d.numpy: d for d in ALL_DTYPES}
_INT_RANGE.update(
    {d.name: (int(np.iinfo(d.numpy).min), int(np.iinfo(d.numpy).max)) for d in ALL_DTYPES if d.numpy.kind in "iu"}
)
_BY_NAME = {d.name: d for d in ALL_DTYPES} | {str(d.numpy): d for d in ALL_DTYPES}


@dataclass(frozen=True, slots=True, eq=False)
class Names:
    """What an alias (``sg.f32``) carries: the DType it names. Not the DType itself: typing hashes
    an alias from its contents, and a DType must hash as its alias does (they compare equal), which
    it could not do while the alias's hash depended on its own. Equal by the dtype's name, so a
    pickled or copied alias is equal to (and hashes as) the alias."""

    dtype: DType

    def __eq__(self, other: object) -> bool:
        return type(other) is Names and other.dtype.name == self.dtype.name

    def __hash__(self) -> int:
        return hash(("scopegraph alias", self.dtype.name))

    def __repr__(self) -> str:
        return self.dtype.spelling


_NAMES = {d.name: Names(d) for d in (float16, float32, float64, int8, int16, int32, int64, uint8, uint32, uint64)}


f16 = Annotated[float, _NAMES["f16"]]
f32 = Annotated[float, _NAMES["f32"]]
f64 = Annotated[float, _NAMES["f64"]]
i8 = Annotated[int, _NAMES["i8"]]
i16 = Annotated[int, _NAMES["i16"]]
i32 = Annotated[int, _NAMES["i32"]]
i64 = Annotated[int, _NAMES["i64"]]
u8 = Annotated[int, _NAMES["u8"]]
u32 = Annotated[int, _NAMES["u32"]]
u64 = Annotated[int, _NAMES["u64"]]
# What each DType hashes as: its alias's hash (see Names).
_ALIAS_HASHES = {
    get_args(alias)[1].dtype.name: hash(alias) for alias in (f16, f32, f64, i8, i16, i32, i64, u8, u32, u64)
}

# What a user may pass where a dtype is expected: ``sg.f32`` (mypy sees ``type[float]``),
# a DType, a numpy dtype, a numpy scalar type (``np.float32``, ``np.bool_``) or a name.
DTypeLike: TypeAlias = Union[DType, type[float], type[int], type[bool], "type[np.generic]", "np.dtype[Any]", str]


def dtype_of_annotation(annotation: object) -> DType | None:
    """The DType an alias (``sg.f32``, or a user's ``Annotated[float, sg.float32]``) names, or None."""
    if get_origin(annotation) is Annotated:
        for meta in get_args(annotation)[1:]:
            if type(meta) is Names:
                return meta.dtype
            if isinstance(meta, DType):
                return meta
    return None


def as_dtype(like: object) -> DType:
    """Resolve anything a user may pass as a dtype; SignatureError says what is accepted."""
    if isinstance(like, DType):
        return like
    if like is None:  # numpy reads None as float64; scopegraph's default is sg.f32, so say which
        raise SignatureError(
            "dtype=None names no dtype\nhelp: leave the dtype out for sg.f32, or name one (sg.f32, sg.i32, ...)"
        )
    found = dtype_of_annotation(like)
    if found is not None:
        return found
    try:
        return _BY_NUMPY[np.dtype(like)]  # type: ignore[call-overload]
    except Exception:  # numpy's parser raises TypeError, ValueError, even SyntaxError ("i4,,")
        pass
    if isinstance(like, str) and like in _BY_NAME:
        return _BY_NAME[like]
    raise SignatureError(
        diagnostic(
            f"`{like!r}` is not a dtype scopegraph supports",
            help=f"use one of {', '.join(d.spelling for d in ALL_DTYPES)} (or the numpy dtype of one of them)",
        )
    )
