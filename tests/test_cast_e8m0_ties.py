"""The E8M0 tie and lowest-binade rules as options (``fp8sim.cast.e8m0.encode_e8m0``).

Oracles: the installed ml_dtypes' ``float8_e8m0fnu`` cast under the installed release's rule
(``fp8sim.cast.conventions.ml_dtypes_rule``; the default ``ties="up", sliver="nearest"`` is ml_dtypes 0.7's)
and gfloat's ``round_float(format_info_ocp_e8m0, v, RoundMode.TiesToEven)`` for ``ties="even"``
(``graphcore-research/gfloat:src/gfloat/round.py``, which breaks ties on the even code).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.cast import encode
from fp8sim.cast.e8m0 import encode_e8m0
from fp8sim.testing.oracles import require

gfloat = require("gfloat")
from gfloat.formats import format_info_ocp_e8m0  # noqa: E402

TIES = np.array([1.5 * 2.0**k for k in range(-127, 127)], np.float32)
"""Every exact E8M0 tie 1.5 * 2^k with both neighbours finite codes (k = -127 .. 126)."""


def _sample(n: int = 400) -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0x00400000, 0x7F7FFFFF, n, dtype=np.uint32)  # positive, 2^-127 .. FLT_MAX
    return np.concatenate([bits.view(np.float32), TIES, np.float32([1.5 * 2.0**127, np.nan])])


def _gfloat_even(x: np.ndarray) -> np.ndarray:
    fi = format_info_ocp_e8m0
    return np.array(
        [gfloat.encode_float(fi, gfloat.round_float(fi, float(v), gfloat.RoundMode.TiesToEven, sat=True)) for v in x],
        np.uint8,
    )


def test_installed_rule_equals_ml_dtypes_and_default_equals_encode():
    from fp8sim.cast.conventions import ml_dtypes_rule

    rule = ml_dtypes_rule()
    x = _sample()
    want = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    finite = x < np.float32(1.5 * 2.0**127)  # ml_dtypes does not saturate the top tie; encode(saturate=False) agrees
    got = encode_e8m0(x, ties=rule.e8m0_ties, sliver=rule.e8m0_sliver, saturate=False)
    assert np.array_equal(got, want), f"ml_dtypes {ml_dtypes.__version__} ({rule.convention})"
    sat = encode_e8m0(x, ties=rule.e8m0_ties, sliver=rule.e8m0_sliver)
    assert np.array_equal(sat[finite], want[finite])
    assert np.array_equal(encode_e8m0(x), encode(x, "e8m0"))


def test_installed_ml_dtypes_rounds_e8m0_ties_as_its_rule_says():
    """0.5.0 rounds exact ties to the even code, 0.5.1 and later up (docs/versions.md); if this fails after
    an upgrade, ml_dtypes has changed its rule and ``fp8sim.cast.conventions.ML_DTYPES_RULES`` needs a record."""
    from fp8sim.cast.conventions import ml_dtypes_rule

    rule = ml_dtypes_rule()
    codes = TIES.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    k = np.arange(-127, 127)
    up = k + 128
    want = np.where(k % 2 == 1, k + 127, up) if rule.e8m0_ties == "even" else up
    if rule.e8m0_sliver == "up" or rule.e8m0_ties == "up":
        want[0] = 1  # 1.5 * 2^-127: the lowest-binade rule (before 0.7) or the tie going up (0.7)
    assert np.array_equal(codes, want), f"ml_dtypes {ml_dtypes.__version__} ({rule.convention})"


def test_sliver_up_sends_the_lowest_binade_to_code_1():
    lo = np.float32(2.0**-127)
    x = np.array([np.nextafter(lo, np.float32(1)), 1.25 * lo, 1.5 * lo, np.nextafter(2 * lo, lo)], np.float32)
    assert list(encode_e8m0(x)) == [0, 0, 1, 1]
    assert list(encode_e8m0(x, sliver="up")) == [1, 1, 1, 1]
    assert list(encode_e8m0(x, ties="even")) == [0, 0, 0, 1]  # the tie 1.5 * 2^-127: code 0 is even
    assert list(encode_e8m0(x, ties="even", sliver="up")) == [1, 1, 1, 1]  # ml_dtypes 0.5.0
    assert encode_e8m0(float(x[1]), sliver="up") == 1 and isinstance(encode_e8m0(float(x[1])), int)


def test_ties_even_equals_gfloat_ties_to_even():
    x = _sample()
    assert np.array_equal(encode_e8m0(x, ties="even"), _gfloat_even(x))


def test_ties_even_differs_from_up_exactly_on_ties_with_odd_exponent():
    up, even = encode_e8m0(TIES), encode_e8m0(TIES, ties="even")
    k = np.arange(-127, 127)
    assert np.array_equal(up != even, k % 2 == 1)
    assert (even % 2 == 0).all()


def test_torch_input_gives_a_torch_result():
    torch = require("torch")
    t = torch.from_numpy(TIES)
    got = encode_e8m0(t, ties="even")
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), encode_e8m0(TIES, ties="even"))


def test_unknown_tie_rule_names_the_choices():
    with pytest.raises(ValueError, match="unknown ties 'away'; known: up, even"):
        encode_e8m0(TIES, ties="away")
    with pytest.raises(ValueError, match="unknown sliver 'down'; known: nearest, up"):
        encode_e8m0(TIES, sliver="down")


def test_ml_dtypes_ties_even_convention_differs_from_ml_dtypes_only_on_ties():
    from fp8sim.cast.conventions import get_convention

    x = _sample()
    even, plain = get_convention("ml_dtypes_ties_even"), get_convention("ml_dtypes_0_7")
    assert np.array_equal(even.encode(x, "e8m0"), encode_e8m0(x, ties="even", saturate=False))
    assert np.array_equal(plain.encode(x, "e8m0"), encode_e8m0(x, saturate=False))
    assert not np.array_equal(even.encode(TIES, "e8m0"), plain.encode(TIES, "e8m0"))
    assert np.array_equal(even.encode(x, "e4m3"), plain.encode(x, "e4m3"))  # other formats unchanged
