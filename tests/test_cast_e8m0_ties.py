"""The E8M0 tie rule as an option (``fp8sim.cast.e8m0.encode_e8m0``).

Oracles: ml_dtypes' ``float8_e8m0fnu`` cast for ``ties="up"`` (its behaviour at the pinned 0.6.0) and
gfloat's ``round_float(format_info_ocp_e8m0, v, RoundMode.TiesToEven)`` for ``ties="even"``
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


def test_default_ties_up_equals_ml_dtypes_and_encode():
    x = _sample()
    want = x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    finite = x < np.float32(1.5 * 2.0**127)  # ml_dtypes does not saturate the top tie; encode(saturate=False) agrees
    assert np.array_equal(encode_e8m0(x, saturate=False), want)
    assert np.array_equal(encode_e8m0(x)[finite], want[finite])
    assert np.array_equal(encode_e8m0(x), encode(x, "e8m0"))


def test_ml_dtypes_0_6_0_rounds_e8m0_ties_up():
    """The pinned ml_dtypes (0.6.0) rounds every exact tie up; if this fails after an upgrade, ml_dtypes
    has taken the nearest-even change and the default of ``encode_e8m0`` must be revisited."""
    if ml_dtypes.__version__ != "0.6.0":
        pytest.skip(f"checks ml_dtypes 0.6.0's rule; installed {ml_dtypes.__version__}")
    codes = TIES.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(codes, np.arange(-127, 127) + 128)


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


def test_ml_dtypes_ties_even_convention_differs_from_ml_dtypes_only_on_ties():
    from fp8sim.conventions import get_convention

    x = _sample()
    even, plain = get_convention("ml_dtypes_ties_even"), get_convention("ml_dtypes")
    assert np.array_equal(even.encode(x, "e8m0"), encode_e8m0(x, ties="even", saturate=False))
    assert np.array_equal(plain.encode(x, "e8m0"), x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
    assert np.array_equal(even.encode(x, "e4m3"), plain.encode(x, "e4m3"))  # other formats unchanged
