"""Field validation of TE's recipe dataclasses, as pydantic 2 (lax mode) does it, without pydantic.

TE declares its recipes with ``pydantic.dataclasses.dataclass`` (``common/recipe/__init__.py``), so
a recipe accepts what pydantic's lax mode coerces (``margin="2"`` -> 2, ``amax_history_len=16.0`` ->
16, ``reduce_amax=1`` -> True, a ``dict`` for an ``MMParams`` field), refuses the rest with a
``ValidationError`` (a ``ValueError``), and ignores keyword arguments that are not fields.  The
coercion rules below are pydantic-core's for the field types TE uses; the messages reuse pydantic's
words.  Assignment after construction is not validated (pydantic's default).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import numbers
import operator
import warnings
from collections.abc import Callable
from typing import Any

from .._util.upstream_quirk import UpstreamQuirkWarning

__all__ = ["RecipeValidationError", "te_dataclass", "validate_fields"]

_TRUE = ("1", "on", "t", "true", "y", "yes")
_FALSE = ("0", "off", "f", "false", "n", "no")
_LEGACY = {
    "interval": "TE 1.8-2.1 (removed; TE 2.x has no amax update interval)",
    "override_linear_precision": "TE <= 1.13 (removed in TE 2.0; every GEMM runs in the recipe's precision)",
}


class RecipeValidationError(ValueError):
    """A recipe field failed validation (what pydantic's ``ValidationError`` is to TE's recipes)."""


class _Invalid(Exception):
    def __init__(self, message: str, kind: str) -> None:
        self.message, self.kind = message, kind


def _number_like(v: Any) -> int | float | None:
    """pydantic-core's lax fallback for other objects: ``__index__`` reads as an int, else
    ``__float__`` as a float (numpy scalars and 0-d arrays, Decimal, Fraction); None if neither."""
    if isinstance(v, bytes | str | bytearray):
        return None
    if hasattr(type(v), "__index__"):
        try:
            return operator.index(v)
        except TypeError:
            pass
    if hasattr(type(v), "__float__"):
        try:
            return float(v)
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def _int(v: Any) -> int:
    """pydantic's lax int.  Known difference: pydantic-core also reads a sign after leading zeros ("0-1" as
    -1, "00-5" as -5); fp8sim refuses such strings."""
    if isinstance(v, bool | numbers.Integral):
        return int(v)
    if not isinstance(v, float | bytes | str | bytearray):
        n = _number_like(v)
        if n is None:
            raise _Invalid("Input should be a valid integer", "int_type")
        v = n
        if isinstance(v, int):
            return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Invalid("Input should be a finite number", "finite_number")
        if v != int(v):
            raise _Invalid("Input should be a valid integer, got a number with a fractional part", "int_from_float")
        if not -(2.0**63) < v < 2.0**63:  # pydantic-core converts floats through i64
            raise _Invalid("Unable to parse input string as an integer, exceeded maximum size", "int_parsing_size")
        return int(v)
    if isinstance(v, bytes | str):
        s = (v.decode("latin-1") if isinstance(v, bytes) else v).strip()
        if not s.isascii():  # Python's int() also reads other scripts' digits; pydantic does not
            raise _Invalid("Input should be a valid integer, unable to parse string as an integer", "int_parsing")
        whole, dot, frac = s.partition(".")
        try:
            if dot and frac and frac.strip("0") == "" and whole not in ("", "+", "-"):
                return int(whole)  # "2.0" and "2.00" parse, "2.5" does not (pydantic-core str_as_int)
            return int(s)
        except ValueError:
            raise _Invalid(
                "Input should be a valid integer, unable to parse string as an integer", "int_parsing"
            ) from None
    raise _Invalid("Input should be a valid integer", "int_type")


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if not isinstance(v, numbers.Integral | float | bytes | str):
        n = _number_like(v)
        v = v if n is None else n
    if isinstance(v, numbers.Integral | float):
        if v in (0, 1):
            return bool(v)
        kind = "bool_parsing" if isinstance(v, numbers.Integral) else "bool_type"
        raise _Invalid("Input should be a valid boolean, unable to interpret input", kind)
    if isinstance(v, bytes | str):
        s = (v.decode() if isinstance(v, bytes) else v).lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise _Invalid("Input should be a valid boolean, unable to interpret input", "bool_parsing")
    raise _Invalid("Input should be a valid boolean", "bool_type")


def _float(v: Any) -> float:
    if not isinstance(v, bool | numbers.Real | bytes | str):
        n = _number_like(v)
        v = v if n is None else n
    if isinstance(v, bool | numbers.Real):
        try:
            return float(v)
        except OverflowError:  # an int beyond the float range
            raise _Invalid("Input should be a valid number", "float_type") from None
    if isinstance(v, bytes | str):
        s = v.decode() if isinstance(v, bytes) else v
        try:
            if not s.isascii():  # Python's float() also reads other scripts' digits; pydantic does not
                raise ValueError(s)
            return float(s)
        except ValueError:
            msg = "Input should be a valid number, unable to parse string as a number"
            raise _Invalid(msg, "float_parsing") from None
    raise _Invalid("Input should be a valid number", "float_type")


def _str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode()
    raise _Invalid("Input should be a valid string", "string_type")


def _callable(v: Any) -> Any:
    if callable(v):
        return v
    raise _Invalid("Input should be callable", "callable_type")


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else inner(v)


def _algo(v: Any) -> Any:
    if isinstance(v, str) and v in ("max", "most_recent"):
        return v
    if callable(v):
        return v
    raise _Invalid("Input should be 'max' or 'most_recent', or callable", "literal_error")


def _enum(cls: type[enum.Enum]) -> Callable[[Any], Any]:
    def coerce(v: Any) -> Any:
        if isinstance(v, cls):
            return v
        try:
            return cls(v)  # by value, as pydantic's enum validator
        except (ValueError, TypeError):
            allowed = " or ".join(repr(m.value) for m in cls)
            raise _Invalid(f"Input should be {allowed}", "enum") from None

    return coerce


def _nested(cls: type) -> Callable[[Any], Any]:
    def coerce(v: Any) -> Any:
        if isinstance(v, cls):
            return v
        if isinstance(v, dict):
            return cls(**v)
        raise _Invalid(f"Input should be a dictionary or an instance of {cls.__name__}", "dataclass_type")

    return coerce


_BY_ANNOTATION: dict[str, Callable[[Any], Any]] = {
    "int": _int,
    "bool": _bool,
    "float": _float,
    "str": _str,
    "str | None": _optional(_str),
    "Callable[..., Any]": _callable,
    "Callable[..., Any] | None": _optional(_callable),
    "str | Callable[..., Any]": _algo,
}


def validate_fields(obj: Any, types: dict[str, type] | None = None) -> None:
    """Coerce every field of the dataclass ``obj`` in place, or raise :class:`RecipeValidationError`
    listing every failing field as pydantic does.  ``types`` resolves annotations naming classes
    (an Enum is matched by value, a dataclass accepts a dict)."""
    errors = []
    for f in dataclasses.fields(obj):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        cls = (types or {}).get(ann)
        if cls is not None:
            coerce = _enum(cls) if issubclass(cls, enum.Enum) else _nested(cls)
        else:
            coerce = _BY_ANNOTATION.get(ann)
        if coerce is None:
            continue
        value = getattr(obj, f.name)
        try:
            object.__setattr__(obj, f.name, coerce(value))
        except _Invalid as e:
            errors.append(
                f"{f.name}\n  {e.message} [type={e.kind}, input_value={value!r}, input_type={type(value).__name__}]"
            )
    if errors:
        n = len(errors)
        head = f"{n} validation error{'s' if n > 1 else ''} for {type(obj).__name__}"
        raise RecipeValidationError("\n".join([head, *errors]))


def te_dataclass(cls: type | None = None, *, frozen: bool = False) -> Any:
    """``dataclass(repr=False)`` whose ``__init__`` ignores keyword arguments that are not fields, as
    TE's pydantic dataclasses do, with an :class:`UpstreamQuirkWarning` naming each (so a typo or a
    TE 1.x argument such as ``interval`` is not silently dropped)."""
    if cls is None:
        return functools.partial(te_dataclass, frozen=frozen)
    cls = dataclasses.dataclass(repr=False, frozen=frozen)(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in [k for k in kwargs if k not in names]:
            value = kwargs.pop(key)
            origin = _LEGACY.get(key, "not a field")
            warnings.warn(
                f"{cls.__name__}({key}={value!r}) has no effect: {origin}; TransformerEngine's pydantic "
                "recipe dataclasses ignore unknown arguments, and so does fp8sim",
                UpstreamQuirkWarning,
                stacklevel=2,
            )
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
