"""fp8sim's recipe field validation against pydantic itself (spec 4.8; issue 13 point 14).

TE declares its recipes with ``pydantic.dataclasses.dataclass``; the oracle here is pydantic 2
validating dataclasses with TE's field declarations, copied from
``NVIDIA/TransformerEngine:transformer_engine/common/recipe/__init__.py`` at d0067d0 (``MMParams``
line 64, ``DelayedScaling`` 253-261, ``MXFP8BlockScaling`` 368-373, ``Float8BlockScaling`` 429-443).
Only the field types are mirrored (TE's ``__post_init__`` assertions are tested in test_recipe.py),
so a case compares what pydantic coerces a value to, or whether it refuses it, with fp8sim.
"""

from __future__ import annotations

import decimal
import fractions
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal, Optional, Union

import pytest

from fp8sim import recipe as r
from fp8sim.testing.oracles import require

pydantic = require("pydantic")
hypothesis = require("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic.dataclasses import dataclass as pyd_dataclass  # noqa: E402


class _Fmt(Enum):  # TE's Format values (line 29-50); members matched by value, as fp8sim's
    E2M1 = r.Format.E2M1.value
    E4M3 = r.Format.E4M3.value
    E5M2 = r.Format.E5M2.value
    HYBRID = r.Format.HYBRID.value


@pyd_dataclass(frozen=True)
class TeMMParams:
    use_split_accumulator: bool = True


@pyd_dataclass
class TeDelayedScaling:
    margin: int = 0
    fp8_format: _Fmt = _Fmt.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[Literal["max", "most_recent"], Callable] = "max"  # noqa: UP007
    scaling_factor_compute_algo: Optional[Callable] = None  # noqa: UP045
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None  # noqa: UP045


@pyd_dataclass
class TeMXFP8BlockScaling:
    margin: int = 0
    fp8_format: _Fmt = _Fmt.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None  # noqa: UP045
    enable_2d_quantization: bool = False


@pyd_dataclass
class TeFloat8BlockScaling:
    use_f32_scales: bool = False
    fp8_format: _Fmt = _Fmt.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: TeMMParams = TeMMParams(use_split_accumulator=True)


ORACLE = {r.DelayedScaling: TeDelayedScaling, r.MXFP8BlockScaling: TeMXFP8BlockScaling}


def _plain(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.name
    if hasattr(v, "use_split_accumulator"):
        return ("MMParams", v.use_split_accumulator)
    return v


def _outcome(cls: type, field: str, value: Any) -> tuple[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = cls(**{field: value})
    except pydantic.ValidationError as e:
        return "refused", e.errors()[0]["loc"][0]
    except r.RecipeValidationError as e:
        return "refused", str(e).splitlines()[1]  # the field name, as pydantic's loc
    got = _plain(getattr(obj, field))
    return "ok", (type(got).__name__, got)


CASES = [
    ("margin", "2"),
    ("margin", " 3 "),
    ("margin", "+5"),
    ("margin", "1_0"),
    ("margin", "2.0"),
    ("margin", "2.5"),
    ("margin", 2.0),
    ("margin", 2.5),
    ("margin", True),
    ("margin", b"2"),
    ("margin", None),
    ("margin", float("inf")),
    ("margin", float("nan")),
    ("margin", "1e1"),
    ("margin", [1]),
    ("margin", "\u0663"),  # an Arabic-Indic digit: Python's int() reads it, pydantic does not
    ("margin", "-_1"),
    ("margin", "1__0"),
    ("amax_history_len", 2.0**63),
    ("amax_history_len", 2.0**62),
    ("amax_history_len", 16.0),
    ("amax_history_len", 16.5),
    ("amax_history_len", "16"),
    ("reduce_amax", 1),
    ("reduce_amax", 0),
    ("reduce_amax", 2),
    ("reduce_amax", 1.0),
    ("reduce_amax", 0.5),
    ("reduce_amax", "yes"),
    ("reduce_amax", "Off"),
    ("reduce_amax", "t"),
    ("reduce_amax", "on "),
    ("reduce_amax", None),
    ("fp8_dpa", "false"),
    ("fp8_format", r.Format.E4M3.value),
    ("fp8_format", (448, 448)),
    ("fp8_format", "HYBRID"),
    ("fp8_format", 448),
    ("amax_compute_algo", "most_recent"),
    ("amax_compute_algo", "MAX"),
    ("amax_compute_algo", "mean"),
    ("amax_compute_algo", 3),
    ("scaling_factor_compute_algo", 3),
    ("scaling_factor_compute_algo", "f"),
    ("backward_override", 5),
]


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f}={v!r}" for f, v in CASES])
def test_delayed_scaling_coerces_and_refuses_as_pydantic(field: str, value: Any) -> None:
    assert _outcome(r.DelayedScaling, field, value) == _outcome(TeDelayedScaling, field, value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fp8_gemm_fprop", None),
        ("fp8_gemm_fprop", {"use_split_accumulator": 1}),
        ("fp8_gemm_fprop", {"use_split_accumulator": "yes"}),
        ("fp8_gemm_fprop", True),
        ("x_block_scaling_dim", "1"),
        ("x_block_scaling_dim", 1.0),
        ("use_f32_scales", "1"),
        ("use_f32_scales", "2"),
    ],
)
def test_float8_block_scaling_nested_mmparams_as_pydantic(field: str, value: Any) -> None:
    """Issue 18 item 10: ``fp8_gemm_fprop=None`` is a ValidationError in TE, not a later AttributeError."""
    assert _outcome(r.Float8BlockScaling, field, value) == _outcome(TeFloat8BlockScaling, field, value)


# pydantic-core also reads a sign after leading zeros ("0-1" is -1, "00-5" is -5, "0-0" is 0: it strips the
# zeros before its JSON number parser); fp8sim refuses such strings (a loud difference on garbage input, named
# in fp8sim/recipe/_fields.py), so the generated strings put a sign only first.
_NUMERIC_TEXT = st.builds(
    lambda sign, body: sign + body,
    st.sampled_from(["", "+", "-", " "]),
    st.text(alphabet="0123456789._ eE", max_size=5),
)
_SCALARS = st.one_of(
    st.integers(-200, 200),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    _NUMERIC_TEXT,
    st.booleans(),
    st.none(),
    st.sampled_from(["true", "FALSE", "yes", "No", "on", "OFF", "y", "f", b"1", b"0", b"12", "1.00", ".0", "1."]),
)


@settings(max_examples=300, deadline=None)
@given(value=_SCALARS, field=st.sampled_from(["margin", "fp8_dpa", "enable_2d_quantization", "fp8_mha"]))
def test_mxfp8_fields_coerce_as_pydantic_property(field: str, value: Any) -> None:
    """Law: for any scalar, fp8sim accepts a field value iff pydantic does, and stores the same value."""
    assert _outcome(r.MXFP8BlockScaling, field, value) == _outcome(TeMXFP8BlockScaling, field, value)


def test_a_sign_after_leading_zeros_is_refused_where_pydantic_reads_it() -> None:
    """The one known difference (see _NUMERIC_TEXT): pydantic-core accepts "0-1" as -1; fp8sim refuses it."""
    assert _outcome(TeMXFP8BlockScaling, "margin", "0-1") == ("ok", ("int", -1))
    assert _outcome(r.MXFP8BlockScaling, "margin", "0-1") == ("refused", "margin")


def test_unknown_arguments_are_ignored_as_pydantic_ignores_them() -> None:
    te = TeDelayedScaling(interval=3, override_linear_precision=(True, False, False))  # type: ignore[call-arg]
    assert not hasattr(te, "interval")
    with pytest.warns(UserWarning, match=r"interval=3\) has no effect"):
        ours = r.DelayedScaling(interval=3)
    assert not hasattr(ours, "interval")


def test_validation_error_is_a_value_error_as_pydantics_is() -> None:
    assert issubclass(pydantic.ValidationError, ValueError)
    assert issubclass(r.RecipeValidationError, ValueError)
    with pytest.raises(r.RecipeValidationError, match=r"1 validation error for DelayedScaling\nmargin\n"):
        r.DelayedScaling(margin=0.5)


@pyd_dataclass(frozen=True)
class TeQParams:  # TE's QParams fields (recipe/__init__.py lines 86-90)
    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


def _numpy(name: str, *args: Any) -> Any:
    np = require("numpy")
    return getattr(np, name)(*args)


_NUMBER_LIKE = [
    decimal.Decimal("1"),
    decimal.Decimal("0"),
    decimal.Decimal("2.5"),
    decimal.Decimal("1E+1"),
    fractions.Fraction(3, 1),
    fractions.Fraction(1, 2),
    ("float16", 1.0),
    ("float16", 0.5),
    ("bool_", True),
    ("int32", 1),
    ("array", 1),
    10**400,  # beyond the float range: pydantic refuses it for a float field (no OverflowError)
    "\uff11",  # a fullwidth digit: Python's float() reads it, pydantic does not
    "1e400",
]


@pytest.mark.parametrize("raw", _NUMBER_LIKE, ids=lambda v: repr(v)[:24])
@pytest.mark.parametrize(
    ("cls", "oracle", "field"),
    [
        (r.DelayedScaling, TeDelayedScaling, "margin"),
        (r.DelayedScaling, TeDelayedScaling, "reduce_amax"),
        (r.QParams, TeQParams, "amax_epsilon"),
        (r.QParams, TeQParams, "power_2_scale"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_number_like_objects_coerce_as_pydantic(cls: type, oracle: type, field: str, raw: Any) -> None:
    """pydantic-core's lax mode reads objects with ``__index__`` as ints and with ``__float__`` as
    floats (numpy scalars, Decimal, Fraction); an int beyond the float range is a ValidationError."""
    value = _numpy(*raw) if isinstance(raw, tuple) else raw
    want = _outcome(oracle, field, value)
    if field == "margin" and want[0] == "ok" and not r.MARGIN_RANGE[0] <= want[1][1] <= r.MARGIN_RANGE[1]:
        with pytest.raises(r.RecipeValidationError, match="margin must be an int in"):  # fp8sim's extra refusal
            cls(margin=value)
        return
    assert _outcome(cls, field, value) == want
