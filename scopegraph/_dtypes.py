"""Element types. ``sg.f32`` and friends are ``typing.Annotated`` aliases: mypy sees ``float`` or
``int``, while at run time the annotation carries the C type a kernel parameter is passed as.

The same names serve as tensor dtypes (``dev.zeros((n,), sg.f32)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeAlias, Union, get_args, get_origin

import numpy as np

from ._errors import SignatureError


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

    def scalar(self, value: object, what: str = "the value") -> np.generic:
        """``value`` as a numpy scalar of this type (cuda.core passes plain ints as pointers).

        Exactness is checked, never left to numpy: an integer type takes integers (or floats with
        an integral value) in its range, a float type takes any real number that does not
        overflow it (rounding to the nearest representable value is accepted; 0.1 has no exact
        binary form in any float type), ``bool`` takes only bools. Anything else is a
        SignatureError naming ``what``."""
        kind = self.numpy.kind
        if type(value) is int and kind in "iu":  # the common case, in users' inner loops
            low, high = _INT_RANGE[self.name]
            if low <= value <= high:
                return self.numpy.type(value)  # type: ignore[no-any-return]
        problem = ""
        if kind == "b":
            if not isinstance(value, (bool, np.bool_)):
                problem = "sg.bool takes True or False"
        elif not isinstance(value, (int, float, np.integer, np.floating, np.bool_)) or isinstance(
            value, (bool, np.bool_)
        ):
            problem = f"sg.{self.name} takes {'a number' if kind == 'f' else 'an integer'}, not {type(value).__name__}"
        elif kind in "iu":
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                problem = f"sg.{self.name} holds integers only"
            else:
                low, high = _INT_RANGE[self.name]
                if not low <= int(value) <= high:
                    problem = f"sg.{self.name} holds {low}..{high}"
        else:
            try:
                converted = float(value)
            except OverflowError:
                converted = float("inf")
            with np.errstate(over="ignore"):
                result = self.numpy.type(converted)
            if np.isinf(result) and not np.isinf(converted):
                problem = f"it overflows sg.{self.name} (largest {np.finfo(self.numpy).max})"
            else:
                return result  # type: ignore[no-any-return]
        if problem:
            raise SignatureError(
                f"{what} is {value!r}, which sg.{self.name} cannot hold exactly: {problem}\n"
                f"help: pass a value of the declared type, or declare a wider type than sg.{self.name}"
            )
        return self.numpy.type(value)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"sg.{self.name}"


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

f16 = Annotated[float, float16]
f32 = Annotated[float, float32]
f64 = Annotated[float, float64]
i8 = Annotated[int, int8]
i16 = Annotated[int, int16]
i32 = Annotated[int, int32]
i64 = Annotated[int, int64]
u8 = Annotated[int, uint8]
u32 = Annotated[int, uint32]
u64 = Annotated[int, uint64]

# What a user may pass where a dtype is expected: ``sg.f32`` (mypy sees ``type[float]``),
# a DType, a numpy dtype or its name.
DTypeLike: TypeAlias = Union[DType, type[float], type[int], type[bool], "np.dtype[Any]", str]


def dtype_of_annotation(annotation: object) -> DType | None:
    """The DType an ``Annotated[..., DType]`` alias carries, or None."""
    if get_origin(annotation) is Annotated:
        for meta in get_args(annotation)[1:]:
            if isinstance(meta, DType):
                return meta
    return None


def as_dtype(like: object) -> DType:
    """Resolve anything a user may pass as a dtype; SignatureError says what is accepted."""
    if isinstance(like, DType):
        return like
    found = dtype_of_annotation(like)
    if found is not None:
        return found
    try:
        return _BY_NUMPY[np.dtype(like)]  # type: ignore[call-overload]
    except (TypeError, KeyError):
        pass
    if isinstance(like, str) and like in _BY_NAME:
        return _BY_NAME[like]
    raise SignatureError(
        f"`{like!r}` is not a dtype scopegraph supports\n"
        f"help: use one of {', '.join('sg.' + d.name for d in ALL_DTYPES)}"
    )
