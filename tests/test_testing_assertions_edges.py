"""``assert_within_ulp``, ``compare`` and the bit-pattern reader behind them: defaults and edges that the
mutation run of ``fp8sim.testing`` found unpinned (issue 30.1, ``reports/mutation_testing.md``).

Oracles: bit patterns and ULP distances written by hand (float32 1.0 is 0x3F800000; pattern + k is k ULP
above it), ml_dtypes' decoding of every code, and the documented wording of the messages.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing import assert_within_ulp, compare


def _f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


def _raises(fn, *args, **kw) -> str:  # noqa: ANN001, ANN002, ANN003
    with pytest.raises(AssertionError) as info:
        fn(*args, **kw)
    return str(info.value)


ONE = 0x3F800000


# -- assert_within_ulp ----------------------------------------------------------------------------------------


def test_within_ulp_defaults_to_a_budget_of_zero_and_ten_reported() -> None:
    e = _f32([ONE] * 13)
    a = _f32([ONE] + [ONE + 1] * 12)
    msg = _raises(assert_within_ulp, a, e)
    assert msg.startswith("not within 0 ULP: 12 of 13 elements (92.31%) are further apart (12 differ at all)")
    assert msg.count("]: actual") == 11  # the worst line and the first 10
    assert "first 10 (index:" in msg and msg.endswith("  ... and 2 more")


def test_within_ulp_worst_is_a_nan_against_a_number() -> None:
    e = _f32([ONE, ONE, ONE])
    a = _f32([ONE + 5, 0x7FC00000, ONE + 9])
    msg = _raises(assert_within_ulp, a, e, ulp_budget=1)
    assert msg.splitlines()[1].startswith("worst: [1]: actual nan (float32 0x7FC00000)")
    assert "NaN vs number" in msg.splitlines()[1]


def test_within_ulp_worst_skips_equal_elements_at_budget_zero() -> None:
    """Budget 0: the only differing element (1 ULP, index 2) is the worst, not an equal element before it."""
    msg = _raises(assert_within_ulp, _f32([ONE, ONE, ONE + 1]), _f32([ONE, ONE, ONE]), ulp_budget=0)
    assert msg.splitlines()[1] == (
        "worst: [2]: actual 1.0000001192092896 (float32 0x3F800001) | expected 1.0 (float32 0x3F800000) | 1 ULP"
    )


# -- ComparisonResult.table -----------------------------------------------------------------------------------


def test_table_always_lists_the_zero_bucket() -> None:
    r = compare(_f32([ONE + 1, ONE + 2]), _f32([ONE, ONE]))
    lines = r.table().splitlines()
    i = lines.index("| ULP distance | elements | share |")
    assert lines[i + 2 : i + 5] == ["| 0 | 0 | 0% |", "| 1 | 1 | 50% |", "| 2 | 1 | 50% |"]


# -- what a failure lists -------------------------------------------------------------------------------------


def test_integer_operands_are_shown_as_integers() -> None:
    """int32 -2 is 0xFFFFFFFE; integers are ordered by value: -2 and 5 are 7 apart."""
    msg = _raises(assert_within_ulp, np.int32([1, -2]), np.int32([1, 5]))
    assert msg.endswith("  [1]: actual -2 (int32 0xFFFFFFFE) | expected 5 (int32 0x00000005) | 7 ULP")


def test_a_0d_operand_is_listed_at_index_parentheses_and_nan_has_no_ulp() -> None:
    msg = _raises(assert_within_ulp, np.float32(np.nan), np.float32(1.0), ulp_budget=3)
    assert msg.endswith(
        "  (): actual nan (float32 0x7FC00000) | expected 1.0 (float32 0x3F800000) | ULP n/a (NaN vs number)"
    )


def test_values_given_with_fmt_show_their_own_bits_and_the_code_in_2d() -> None:
    """float32 1.125 is 0x3F900000 and E4M3 code 0x39; 1.0 is 0x3F800000 and 0x38 (1 ULP apart)."""
    a = np.array([[1.0, 1.0], [1.0, 1.125]], np.float32)
    e = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    msg = _raises(assert_within_ulp, a, e, "e4m3")
    assert msg.endswith(
        "  [1, 1]: actual 1.125 (float32 0x3F900000, e4m3 0x39) | expected 1.0 (float32 0x3F800000, e4m3 0x38) | 1 ULP"
    )


def test_the_whole_failure_message_of_assert_bit_exact() -> None:
    """float32 1.0 = 0x3F800000, + 2 patterns = 1 + 2^-22 (repr 1.000000238418579); the default quiet NaN is
    0x7FC00000."""
    from fp8sim.testing import assert_bit_exact

    msg = _raises(assert_bit_exact, _f32([ONE, 0x7FC00000, ONE + 2]), _f32([ONE, ONE, ONE]))
    assert msg == (
        "not bit-exact: 2 of 3 elements differ (66.67%), compared as float32 bit patterns (NaNs equal by class); "
        "max ULP distance 2; 1 NaN vs number\n"
        "first 2 (index: actual | expected | distance):\n"
        "  [1]: actual nan (float32 0x7FC00000) | expected 1.0 (float32 0x3F800000) | ULP n/a (NaN vs number)\n"
        "  [2]: actual 1.000000238418579 (float32 0x3F800002) | expected 1.0 (float32 0x3F800000) | 2 ULP"
    )
    only_nan = _raises(assert_bit_exact, _f32([0x7FC00000, ONE]), _f32([ONE, ONE]))
    assert only_nan.splitlines()[0] == (
        "not bit-exact: 1 of 2 elements differ (50%), compared as float32 bit patterns (NaNs equal by class); "
        "1 NaN vs number"
    )
    none_listed = _raises(assert_bit_exact, _f32([ONE + 1, ONE + 1]), _f32([ONE, ONE]), max_report=0)
    assert none_listed.splitlines()[1:] == ["first 0 (index: actual | expected | distance):", "  ... and 2 more"]


def test_table_of_empty_operands_has_zero_shares() -> None:
    r = compare(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert "| bit-exact | 0 (0%) |" in r.table() and "| 0 | 0 | 0% |" in r.table()


def test_assert_bit_exact_lists_ten_by_default() -> None:
    from fp8sim.testing import assert_bit_exact

    msg = _raises(assert_bit_exact, _f32([ONE + 1] * 12), _f32([ONE] * 12))
    assert msg.count("]: actual") == 10 and msg.endswith("  ... and 2 more")


# -- compare(inputs=): ties on unsigned formats, wide dtypes, and inputs far off the grid ---------------------


def test_ties_on_unsigned_formats() -> None:
    """E8M0 holds 2^-127..2^127 (code 127 = 1.0): 1.5, 3.0, 0.75 and 1.5 * 2^-127 lie halfway between two
    neighbours; 1.25 does not, nor 2^-128 (below the smallest value, no neighbour there).  UE5M3 spaces [1, 2) by
    1/8 (code 120 = 1.0): 1.0625 (rounds down to even 1.0) and 1.1875 (rounds up to 1.25) are ties, 1.1 is not."""
    x = np.array([1.5, 3.0, 1.25, 2.0**-128, 1.5 * 2.0**-127, 0.75])
    expected = np.uint8([127, 128, 127, 0, 0, 126])
    r = compare(expected + np.uint8(1), expected, "e8m0", inputs=x)
    assert r.classes == {"overflow": 0, "tie": 4, "nan_inf": 0, "saturation": 0, "signed_zero": 0, "subnormal": 0,
                         "other": 2}  # fmt: skip
    x = np.array([1.0625, 1.1875, 1.1])
    r = compare(np.uint8([121, 121, 120]), np.uint8([120, 122, 121]), "ue5m3", inputs=x)
    assert (r.classes["tie"], r.classes["other"]) == (2, 1)


def test_inputs_far_off_the_grid_raise_no_floating_point_warning() -> None:
    """float16 (max 65504; 2^-25 is halfway between 0 and the smallest subnormal 2^-24): +-Inf, 1e308 and 65520
    are overflows, 2^-25 a tie, NaN and 1.5 neither; E4M3 (max 448) with 1e308: an overflow.  No RuntimeWarning."""
    import warnings

    x = np.array([np.nan, np.inf, -np.inf, 1e308, 65520.0, 2.0**-25, 1.5])
    e = np.full(x.size, 1.0, np.float16)
    a = np.full(x.size, 1.0009765625, np.float16)  # 1 + 2^-10: one float16 ULP above
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compare(a, e, inputs=x)
        r8 = compare(np.uint8([0x39, 0x39]), np.uint8([0x38, 0x38]), "e4m3", inputs=np.array([1e308, -1e308]))
    assert (r.classes["overflow"], r.classes["tie"], r.classes["other"]) == (4, 1, 2)
    assert r8.classes["overflow"] == 2


def test_float64_operands_have_no_ties() -> None:
    """A float64 input is itself a float64 value, so it never lies strictly between two of them."""
    x = np.array([1.0 + 2.0**-52, 1.5, 2.0])
    r = compare(np.array([1.0, 1.5, 2.0]) + 2.0**-50, np.array([1.0, 1.5, 2.0]), inputs=x)
    assert (r.classes["tie"], r.classes["other"]) == (0, 3)
