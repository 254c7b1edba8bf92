"""``assert_within_ulp``, ``compare`` and the bit-pattern reader behind them: defaults and edges that the
mutation run of ``fp8sim.testing`` found unpinned (issue 30.1, ``reports/mutation_testing.md``).

Oracles: bit patterns and ULP distances written by hand (float32 1.0 is 0x3F800000; pattern + k is k ULP
above it), ml_dtypes' decoding of every code, and the documented wording of the messages.
"""

from __future__ import annotations

import numpy as np
import pytest
from _bit_helpers import f32, raises

from fp8sim.testing import assert_within_ulp, compare

ONE = 0x3F800000


# -- assert_within_ulp ----------------------------------------------------------------------------------------


def test_within_ulp_defaults_to_a_budget_of_zero_and_ten_reported() -> None:
    e = f32([ONE] * 13)
    a = f32([ONE] + [ONE + 1] * 12)
    msg = raises(assert_within_ulp, a, e)
    assert msg.startswith("not within 0 ULP: 12 of 13 elements (92.31%) are further apart (12 differ at all)")
    assert msg.count("]: actual") == 11  # the worst line and the first 10
    assert "first 10 (index:" in msg and msg.endswith("  ... and 2 more")


def test_within_ulp_worst_is_a_nan_against_a_number() -> None:
    e = f32([ONE, ONE, ONE])
    a = f32([ONE + 5, 0x7FC00000, ONE + 9])
    msg = raises(assert_within_ulp, a, e, ulp_budget=1)
    assert msg.splitlines()[1].startswith("worst: [1]: actual nan (float32 0x7FC00000)")
    assert "NaN vs number" in msg.splitlines()[1]


def test_within_ulp_worst_skips_equal_elements_at_budget_zero() -> None:
    """Budget 0: the only differing element (1 ULP, index 2) is the worst, not an equal element before it."""
    msg = raises(assert_within_ulp, f32([ONE, ONE, ONE + 1]), f32([ONE, ONE, ONE]), ulp_budget=0)
    assert msg.splitlines()[1] == (
        "worst: [2]: actual 1.0000001192092896 (float32 0x3F800001) | expected 1.0 (float32 0x3F800000) | 1 ULP"
    )


# -- ComparisonResult.table -----------------------------------------------------------------------------------


def test_table_always_lists_the_zero_bucket() -> None:
    r = compare(f32([ONE + 1, ONE + 2]), f32([ONE, ONE]))
    lines = r.table().splitlines()
    i = lines.index("| ULP distance | elements | share |")
    assert lines[i + 2 : i + 5] == ["| 0 | 0 | 0% |", "| 1 | 1 | 50% |", "| 2 | 1 | 50% |"]


# -- what a failure lists -------------------------------------------------------------------------------------


def test_integer_operands_are_shown_as_integers() -> None:
    """int32 -2 is 0xFFFFFFFE; integers are ordered by value: -2 and 5 are 7 apart."""
    msg = raises(assert_within_ulp, np.int32([1, -2]), np.int32([1, 5]))
    assert msg.endswith("  [1]: actual -2 (int32 0xFFFFFFFE) | expected 5 (int32 0x00000005) | 7 ULP")


def test_a_0d_operand_is_listed_at_index_parentheses_and_nan_has_no_ulp() -> None:
    msg = raises(assert_within_ulp, np.float32(np.nan), np.float32(1.0), ulp_budget=3)
    assert msg.endswith(
        "  (): actual nan (float32 0x7FC00000) | expected 1.0 (float32 0x3F800000) | ULP n/a (NaN vs number)"
    )


def test_values_given_with_fmt_show_their_own_bits_and_the_code_in_2d() -> None:
    """float32 1.125 is 0x3F900000 and E4M3 code 0x39; 1.0 is 0x3F800000 and 0x38 (1 ULP apart)."""
    a = np.array([[1.0, 1.0], [1.0, 1.125]], np.float32)
    e = np.array([[1.0, 1.0], [1.0, 1.0]], np.float32)
    msg = raises(assert_within_ulp, a, e, "e4m3")
    assert msg.endswith(
        "  [1, 1]: actual 1.125 (float32 0x3F900000, e4m3 0x39) | expected 1.0 (float32 0x3F800000, e4m3 0x38) | 1 ULP"
    )


def test_the_whole_failure_message_of_assert_bit_exact() -> None:
    """float32 1.0 = 0x3F800000, + 2 patterns = 1 + 2^-22 (repr 1.000000238418579); the default quiet NaN is
    0x7FC00000."""
    from fp8sim.testing import assert_bit_exact

    msg = raises(assert_bit_exact, f32([ONE, 0x7FC00000, ONE + 2]), f32([ONE, ONE, ONE]))
    assert msg == (
        "not bit-exact: 2 of 3 elements differ (66.67%), compared as float32 bit patterns (NaNs equal by class); "
        "max ULP distance 2; 1 NaN vs number\n"
        "first 2 (index: actual | expected | distance):\n"
        "  [1]: actual nan (float32 0x7FC00000) | expected 1.0 (float32 0x3F800000) | ULP n/a (NaN vs number)\n"
        "  [2]: actual 1.000000238418579 (float32 0x3F800002) | expected 1.0 (float32 0x3F800000) | 2 ULP"
    )
    only_nan = raises(assert_bit_exact, f32([0x7FC00000, ONE]), f32([ONE, ONE]))
    assert only_nan.splitlines()[0] == (
        "not bit-exact: 1 of 2 elements differ (50%), compared as float32 bit patterns (NaNs equal by class); "
        "1 NaN vs number"
    )
    none_listed = raises(assert_bit_exact, f32([ONE + 1, ONE + 1]), f32([ONE, ONE]), max_report=0)
    assert none_listed.splitlines()[1:] == ["first 0 (index: actual | expected | distance):", "  ... and 2 more"]


def test_table_of_empty_operands_has_zero_shares() -> None:
    r = compare(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert "| bit-exact | 0 (0%) |" in r.table() and "| 0 | 0 | 0% |" in r.table()


def test_assert_bit_exact_lists_ten_by_default() -> None:
    from fp8sim.testing import assert_bit_exact

    msg = raises(assert_bit_exact, f32([ONE + 1] * 12), f32([ONE] * 12))
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


def test_signed_ties_that_round_up_to_even() -> None:
    """E4M3 spaces [1, 2) by 1/8: 1.1875 lies halfway between 1.125 and 1.25 and rounds (to even) up to 1.25, so
    the other neighbour is below the rounded value; -1.1875 likewise on the negative side."""
    x = np.array([1.1875, -1.1875, 1.2])
    r = compare(np.uint8([0x39, 0xB9, 0x39]), np.uint8([0x3A, 0xBA, 0x3A]), "e4m3", inputs=x)
    assert (r.classes["tie"], r.classes["other"]) == (2, 1)


# -- _bits.from_ordered: the inverse of the ULP order ---------------------------------------------------------


def _value_order(name: str) -> list[int]:
    """The non-NaN codes of ``name`` sorted by ml_dtypes' value, -0 just below +0."""
    from conftest import ml_dtype

    import fp8sim

    fmt = fp8sim.get_format(name)
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        v = codes.view(ml_dtype(fmt)).astype(np.float64)
    ok = ~np.isnan(v)
    return codes[ok][np.lexsort((~np.signbit(v[ok]), v[ok]))].tolist()


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "e2m1"])
def test_from_ordered_steps_through_the_value_order_and_clips_past_the_ends(name: str) -> None:
    """Position 0 is +0; position k is k steps along the value order (-0 at -1 where the format has it); a
    position past either end is the pattern of largest magnitude of that sign (0x7F / 0xFF for 8 bits)."""
    import fp8sim
    from fp8sim.testing import _bits

    enc = _bits.format_encoding(fp8sim.get_format(name))
    order = _value_order(name)
    zero = order.index(0)
    pos = np.arange(-zero, len(order) - zero, dtype=np.int64)
    assert _bits.from_ordered(enc, pos).tolist() == order
    top = (1 << (enc.bits - 1)) - 1
    ends = _bits.from_ordered(enc, np.array([10_000, -10_000], np.int64)).tolist()
    assert ends == [top, top | (1 << (enc.bits - 1))]


# -- ComparisonResult.plot ------------------------------------------------------------------------------------


def test_plot_is_an_agg_figure_whose_tick_labels_fit(tmp_path) -> None:  # noqa: ANN001
    """The docstring's Agg canvas (pixels readable without pyplot), a wide 8 x 3.6 inch strip, and the rotated
    bucket labels inside the canvas (constrained layout)."""
    from fp8sim.testing.oracles import require

    require("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = compare(f32([ONE, ONE + 3]), f32([ONE, ONE])).plot()
    assert isinstance(fig.canvas, FigureCanvasAgg)
    fig.canvas.draw()
    assert np.asarray(fig.canvas.buffer_rgba()).shape == (360, 800, 4)  # 100 dpi
    assert tuple(fig.get_size_inches()) == (8.0, 3.6)
    renderer = fig.canvas.get_renderer()
    for label in fig.axes[0].get_xticklabels():
        box = label.get_window_extent(renderer)
        assert box.y0 >= 0 and box.x0 >= 0 and box.x1 <= 800, label.get_text()


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch) -> None:  # noqa: ANN001
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError) as info:
        compare(f32([ONE]), f32([ONE])).plot()
    assert str(info.value) == "ComparisonResult.plot needs matplotlib: pip install matplotlib"


def test_plot_draws_one_bar_per_bucket_coloured_by_kind() -> None:
    """One bar per histogram bucket at its count: green for bit-exact ("0"), red for NaN vs number, orange
    between; bucket labels under the bars, rotated 45 degrees and right-aligned under their bar; a symlog count
    axis linear up to 1 (a bucket of one element is a visible bar); axes named."""
    from fp8sim.testing.oracles import require

    require("matplotlib")
    from matplotlib.colors import to_rgba

    from fp8sim.testing import HISTOGRAM_BUCKETS

    r = compare(f32([ONE, ONE + 3, 0x7FC00000, ONE + 2000]), f32([ONE, ONE, ONE, ONE]))
    ax = r.plot().axes[0]
    bars = ax.patches
    assert [b.get_height() for b in bars] == [r.histogram[k] for k in HISTOGRAM_BUCKETS]
    colours = [b.get_facecolor() for b in bars]
    assert colours[0] == to_rgba("tab:green") and colours[-1] == to_rgba("tab:red")
    assert colours[1:-1] == [to_rgba("tab:orange")] * (len(HISTOGRAM_BUCKETS) - 2)
    ticks = ax.get_xticklabels()
    assert [t.get_text() for t in ticks] == list(HISTOGRAM_BUCKETS)
    assert {(t.get_rotation(), t.get_horizontalalignment()) for t in ticks} == {(45.0, "right")}
    assert ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh == 1
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("ULP distance", "elements")


def test_zero_and_the_smallest_normal_are_not_subnormal() -> None:
    """+0 and float32's smallest normal 2^-126 against 1.0 are ``other`` mismatches; 1e-40 is a subnormal."""
    r = compare(np.float32([0.0, 2.0**-126, 1e-40]), np.float32([1.0, 1.0, 1.0]))
    assert (r.classes["subnormal"], r.classes["other"]) == (1, 2)


def test_compare_ulp_is_inf_for_nan_against_a_number() -> None:
    r = compare(f32([0x7FC00000, ONE + 2, 0x7FC00001]), f32([ONE, ONE, 0xFFC00000]))
    assert r.ulp.tolist() == [np.inf, 2.0, 0.0]  # the NaN pair is equal by class


def test_mean_and_max_ulp_are_zero_without_a_comparable_pair() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mean of an empty selection
        nan = compare(f32([0x7FC00000]), f32([ONE]))
        empty = compare(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert (nan.mean_ulp, nan.max_ulp, empty.mean_ulp, empty.max_ulp) == (0.0, 0, 0.0, 0)


# -- compare(inputs=): reading the inputs ---------------------------------------------------------------------


def test_inputs_are_checked_and_named() -> None:
    a, e = f32([ONE, ONE + 1]), f32([ONE, ONE])
    with pytest.raises(ValueError) as info:
        compare(a, e, inputs=[1.0, 2.0, 3.0])
    assert str(info.value) == "inputs has 3 elements; actual and expected have 2"
    with pytest.raises(TypeError) as info:
        compare(a, e, inputs="1.0")
    assert str(info.value) == "inputs must be an array, a tensor or a number, got str"


def test_2d_inputs_classify_2d_operands_and_ulp_keeps_their_shape() -> None:
    """E4M3 (max 448, spacing 1/8 on [1, 2)): 1.0625 is a tie, 500 an overflow, 448 itself is no overflow (the
    mismatch there is a saturation: 448 is E4M3's max), 1.3 neither."""
    x = np.array([[1.0625, 500.0], [448.0, 1.3]], np.float32)
    e = np.uint8([[0x38, 0x7E], [0x7E, 0x3A]])
    a = np.uint8([[0x39, 0x7D], [0x7D, 0x3B]])
    r = compare(a, e, "e4m3", inputs=x)
    assert (r.classes["tie"], r.classes["overflow"], r.classes["saturation"], r.classes["other"]) == (1, 1, 1, 1)
    assert r.ulp.shape == (2, 2) and r.ulp.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_signalling_nan_inputs_raise_no_floating_point_warning() -> None:
    """float32 0x7F800001 is a signalling NaN: widening it raises the invalid flag, which must not leak."""
    import warnings

    x = np.array([0x7F800001, 0x3F880000], np.uint32).view(np.float32)  # sNaN, 1.0625
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compare(np.uint8([0x39, 0x39]), np.uint8([0x38, 0x38]), "e4m3", inputs=x)
    assert (r.classes["tie"], r.classes["other"]) == (1, 1)


def test_opposite_signs_are_not_a_signed_zero() -> None:
    r = compare(np.float32([1.0, 0.0]), np.float32([-1.0, -0.0]))
    assert (r.classes["signed_zero"], r.classes["other"]) == (1, 1)


def test_unreadable_operands_are_named() -> None:
    from fp8sim.testing import assert_bit_exact

    with pytest.raises(TypeError) as info:
        assert_bit_exact("1.0", np.float32([1.0]))
    assert str(info.value) == "actual must be an array, a tensor or a number, got str"
    with pytest.raises(TypeError) as info:
        assert_bit_exact(np.float32([1.0]), np.zeros(1, "V4"))
    assert str(info.value) == ("expected has dtype |V4, which fp8sim cannot read as bit patterns; pass fmt= or cast it")


def test_integer_codes_must_lie_in_the_format() -> None:
    """E4M3 has codes 0..255 and E2M1 0..15: 256 and 16 are out of range, and the message names the bad one even
    next to a code 0."""
    from fp8sim.testing import assert_bit_exact

    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.array([0, 256]), np.array([0, 0]), "e4m3")
    assert str(info.value) == "actual holds code 256, out of range for e4m3: codes are 0..255"
    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.array([0, 1]), np.array([0, 16]), "e2m1")
    assert str(info.value) == "expected holds code 16, out of range for e2m1: codes are 0..15"
    assert_bit_exact(np.array([0, 255]), np.array([0, 255]), "e4m3")


def test_infinities_are_values_of_formats_that_have_them() -> None:
    """E5M2 holds +-Inf (0x7C / 0xFC), so float infinities given with fmt="e5m2" are read as those codes, not
    refused as off-grid."""
    from fp8sim.testing import assert_bit_exact

    assert_bit_exact(np.float32([np.inf, -np.inf, 57344.0]), np.uint8([0x7C, 0xFC, 0x7B]), "e5m2")
    msg = raises(assert_bit_exact, np.float32([np.inf]), np.uint8([0x7B]), "e5m2")
    assert "actual inf (float32 0x7F800000, e5m2 0x7C) | expected 57344.0 (e5m2 0x7B) | 1 ULP" in msg


def test_mismatched_dtypes_say_how_to_compare_them() -> None:
    msg = raises(assert_within_ulp, np.float32([1.0]), np.float16([1.0]))
    assert msg == (
        "dtype mismatch: actual is float32, expected is float16; bit patterns of different dtypes cannot be "
        "compared: cast one of them, or pass fmt= to compare both as codes of a format"
    )


def test_big_endian_operands_are_read_by_value() -> None:
    """A big-endian float32 1.0 is bytes 3F 80 00 00 in memory; it is the pattern 0x3F800000 all the same."""
    from fp8sim.testing import assert_bit_exact

    big = np.array([1.0, 2.0], ">f4")
    assert big.tobytes()[:4] == b"\x3f\x80\x00\x00"
    assert_bit_exact(big, np.float32([1.0, 2.0]))
    msg = raises(assert_bit_exact, big, np.float32([1.0, 2.5]))
    assert "[1]: actual 2.0 (float32 0x40000000) | expected 2.5 (float32 0x40200000)" in msg
    assert_bit_exact(np.array([7, -3], ">i2"), np.int16([7, -3]))


def test_signalling_nan_operands_raise_no_floating_point_warning() -> None:
    """float32 0x7F800001 and float16 0x7C01 are signalling NaNs (widening them raises the invalid flag): equal to
    any NaN by class, a NaN against a number, and no RuntimeWarning."""
    import warnings

    h = np.array([0x7C01, 0x3C00], np.uint16).view(np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from fp8sim.testing import assert_bit_exact

        assert_bit_exact(f32([0x7F800001, ONE]), f32([0x7FC00000, ONE]))
        r = compare(f32([0x7F800001]), f32([ONE]))
        assert_bit_exact(h, np.array([0xFE00, 0x3C00], np.uint16).view(np.float16))
    assert r.nan_mismatches == 1


def test_compare_integer_operands() -> None:
    """int8: 127 is the largest value (a saturation), -2 and 5 are 7 apart, 0x80 is -128."""
    r = compare(np.int8([127, -2, -128]), np.int8([126, 5, -128]))
    assert r.encoding == "int8 bit patterns" and r.ulp.tolist() == [1.0, 7.0, 0.0]
    assert compare(np.int32([-2, -7, -1]), np.int32([-3, -1, -1])).ulp.tolist() == [1.0, 6.0, 0.0]
    assert (r.classes["saturation"], r.classes["other"]) == (1, 1)
    msg = raises(assert_within_ulp, np.int8([-128]), np.int8([127]))
    assert msg.endswith("  [0]: actual -128 (int8 0x80) | expected 127 (int8 0x7F) | 255 ULP")


def test_sub_byte_ml_dtypes_arrays_are_read_by_their_low_bits() -> None:
    """ml_dtypes stores FP4 / FP6 in a byte and decodes only the low 4 / 6 bits (bytes 0xFA and 0x0A are both
    float4_e2m1fn -1.0, code 0xA): without fmt= they compare as codes of their format."""
    import ml_dtypes

    from fp8sim.testing import assert_bit_exact

    fp4 = ml_dtypes.float4_e2m1fn
    assert np.uint8([0xFA]).view(fp4).astype(np.float32)[0] == -1.0
    assert_bit_exact(np.uint8([0xFA, 0x07]).view(fp4), np.uint8([0x0A, 0x07]).view(fp4))
    msg = raises(assert_bit_exact, np.uint8([0xFA]).view(fp4), np.uint8([0x0B]).view(fp4))
    assert msg.endswith("  [0]: actual -1.0 (e2m1 0xA) | expected -1.5 (e2m1 0xB) | 1 ULP")
    fp6 = ml_dtypes.float6_e3m2fn
    assert_bit_exact(np.uint8([0xE4]).view(fp6), np.uint8([0x24]).view(fp6))
