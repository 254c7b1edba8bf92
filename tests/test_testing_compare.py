"""fp8sim.testing: assert_bit_exact, assert_within_ulp and compare.

Oracles: bit patterns written as literals; ULP distances as rank differences in the list of a
dtype's non-NaN patterns sorted by value (-0 before +0), built from ml_dtypes' decoding; tie and
overflow classes from hand-picked inputs (E4M3 grid spacing 1/8 on [1, 2), spec section 1).
"""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from _bit_helpers import f32, raises
from conftest import ml_dtype

import fp8sim
from fp8sim.testing import HISTOGRAM_BUCKETS, assert_bit_exact, assert_within_ulp, compare
from fp8sim.testing.oracles import require

torch = require("torch")


# -- assert_bit_exact ---------------------------------------------------------------------------


def test_flipped_bit_is_reported_with_index_hex_and_ulp() -> None:
    expected = np.tile(f32([0x3F800000, 0x40490FDB, 0xC2F60000]), 8).reshape(4, 6)
    actual = expected.copy()
    actual.view(np.uint32)[2, 4] ^= 1  # expected[2, 4] is 0x40490FDB (pi)
    msg = raises(assert_bit_exact, actual, expected)
    assert "1 of 24 elements differ (4.167%)" in msg
    assert "[2, 4]: actual" in msg
    assert "(float32 0x40490FDA)" in msg and "(float32 0x40490FDB)" in msg
    assert "| 1 ULP" in msg
    assert "3.1415925" in msg and "3.1415927" in msg  # both values in decimal


def test_identical_inputs_pass_and_nans_are_equal_by_class() -> None:
    a = f32([0x7FC00000, 0xFFC00001, 0x7F800001, 0x00000000, 0x80000000, 0x7F800000])
    b = f32([0xFFFFFFFF, 0x7FC00000, 0x7FBFFFFF, 0x00000000, 0x80000000, 0x7F800000])
    assert_bit_exact(a, b)
    assert_bit_exact(a.copy(), a)
    h = np.array([0x7E00, 0xFC01, 0x3C00], np.uint16).view(np.float16)
    assert_bit_exact(h, np.array([0xFE00, 0x7C02, 0x3C00], np.uint16).view(np.float16))
    # E5M2 NaN codes 0x7D and 0xFE are both NaN; compared as codes of the format
    assert_bit_exact(np.array([0x7D, 0x3C], np.uint8), np.array([0xFE, 0x3C], np.uint8), "e5m2")


def test_signed_zeros_differ_by_one_ulp() -> None:
    msg = raises(assert_bit_exact, np.float32([0.0]), np.float32([-0.0]))
    assert "0x00000000" in msg and "0x80000000" in msg and "1 ULP" in msg


def test_nan_against_number_is_reported() -> None:
    msg = raises(assert_bit_exact, f32([0x7FC00000]), f32([0x3F800000]))
    assert "NaN vs number" in msg and "0x7FC00000" in msg


def test_torch_tensors_are_read_as_their_bits() -> None:
    exp = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    act = exp.clone()
    act.view(torch.int16)[1, 0] += 1  # 3.0 is bfloat16 0x4040
    msg = raises(assert_bit_exact, act, exp)
    assert "[1, 0]: actual 3.015625 (bfloat16 0x4041) | expected 3.0 (bfloat16 0x4040) | 1 ULP" in msg
    # a transposed (non-contiguous) tensor against numpy, and requires_grad
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t().requires_grad_()
    assert_bit_exact(x, np.arange(6, dtype=np.float32).reshape(2, 3).T)
    # float8 tensors without fmt: their own codes; with fmt: against uint8 codes
    f8 = torch.tensor([1.0, -448.0, 0.001953125]).to(torch.float8_e4m3fn)
    assert_bit_exact(f8, f8.clone())
    assert_bit_exact(f8, np.array([0x38, 0xFE, 0x01], np.uint8), "e4m3")
    msg = raises(assert_bit_exact, f8, np.array([0x38, 0xFE, 0x02], np.uint8), "e4m3")
    assert "[2]: actual 0.001953125 (e4m3 0x01) | expected 0.00390625 (e4m3 0x02) | 1 ULP" in msg


def test_fmt_takes_codes_and_grid_values_and_refuses_the_rest() -> None:
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert_bit_exact(values, codes, "e4m3")
    assert_bit_exact(values.astype(ml_dtypes.bfloat16), codes.astype(np.int64), fmt="e4m3")
    msg = raises(assert_bit_exact, values, np.roll(codes, 1), "e4m3")
    assert "(float32 0x00000000, e4m3 0x00) | expected" in msg and "(e4m3 0xFF)" in msg
    with pytest.raises(ValueError, match=r"actual\[3\] = 0.3 .* is not a value of e4m3"):
        assert_bit_exact(np.float64([0, 1, 2, 0.3]), np.zeros(4, np.uint8), "e4m3")
    with pytest.raises(ValueError, match="holds code 300, out of range for e4m3"):
        assert_bit_exact(np.array([300]), np.array([0]), "e4m3")
    with pytest.raises(ValueError, match="not a value of e2m1"):  # FP4 has no NaN
        assert_bit_exact(np.float32([np.nan]), np.zeros(1, np.uint8), "e2m1")


def test_shape_and_dtype_mismatches_are_assertion_errors() -> None:
    assert "shape mismatch: actual has shape (3,), expected (1, 3)" in raises(
        assert_bit_exact, np.zeros(3, np.float32), np.zeros((1, 3), np.float32)
    )
    assert "dtype mismatch: actual is float32, expected is float16" in raises(
        assert_bit_exact, np.zeros(3, np.float32), np.zeros(3, np.float16)
    )


def test_max_report_limits_the_listed_elements() -> None:
    e = np.zeros(40, np.float16)
    a = e.copy()
    a[::2] = 1
    msg = raises(assert_bit_exact, a, e, max_report=3)
    assert "20 of 40 elements differ (50%)" in msg
    assert msg.count("]: actual") == 3 and "[0]:" in msg and "[4]:" in msg and "... and 17 more" in msg


# -- ULP distance -------------------------------------------------------------------------------


def _rank_table(values: np.ndarray) -> np.ndarray:
    """Rank of each pattern in the value-sorted list of non-NaN patterns (-0 before +0); -1 for NaN."""
    with np.errstate(invalid="ignore"):
        v = values.astype(np.float64)
    ok = ~np.isnan(v)
    order = np.lexsort((~np.signbit(v[ok]), v[ok]))
    rank = np.full(v.size, -1, np.int64)
    rank[np.flatnonzero(ok)[order]] = np.arange(order.size)
    return rank


@pytest.mark.parametrize("name", list(fp8sim.FORMATS))
def test_ulp_distance_is_the_rank_difference_for_every_code_pair(name: str) -> None:
    fmt = fp8sim.get_format(name)
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    rank = _rank_table(codes.view(ml_dtype(fmt)).astype(np.float32))
    ok = codes[rank >= 0]
    a, b = np.repeat(ok, ok.size), np.tile(ok, ok.size)
    r = compare(a, b, name)
    np.testing.assert_array_equal(r.ulp, np.abs(rank[a] - rank[b]).astype(np.float64))
    assert r.max_ulp == ok.size - 1


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_ulp_distance_is_the_rank_difference_for_16_bit_floats(dtype: type) -> None:
    pats = np.arange(1 << 16, dtype=np.uint16)
    rank = _rank_table(pats.view(dtype))
    ok = pats[rank >= 0]
    rng = np.random.default_rng(5)
    a, b = rng.choice(ok, 50_000), rng.choice(ok, 50_000)
    a[:3], b[:3] = [0x8000, 0x8001, 0x7BFF], [0x0000, 0x0001, 0x7C00]
    r = compare(a.view(dtype), b.view(dtype))
    np.testing.assert_array_equal(r.ulp, np.abs(rank[a] - rank[b]).astype(np.float64))


def test_ulp_distance_in_float32_and_across_zero() -> None:
    a = f32([0x80000001, 0x7F7FFFFF, 0x3F800003, 0xFF800000])
    r = compare(a, f32([0x00000001, 0x7F800000, 0x3F800000, 0x7F800000]))
    np.testing.assert_array_equal(r.ulp, [3, 1, 3, 2 * 0x7F800000 + 1])
    # fnuz formats have no -0: -min and +min subnormal are 2 steps apart
    assert compare(np.uint8([0x81]), np.uint8([0x01]), "e4m3fnuz").max_ulp == 2


# -- assert_within_ulp --------------------------------------------------------------------------


def test_ulp_budget_passes_within_and_reports_the_worst_beyond() -> None:
    e = np.full(8, 1.0, np.float32)
    a = e.copy()
    a.view(np.uint32)[[1, 5, 6]] += np.uint32([1, 3, 2])
    assert_within_ulp(a, e, ulp_budget=3)
    msg = raises(assert_within_ulp, a, e, ulp_budget=1)
    assert "not within 1 ULP: 2 of 8 elements (25%) are further apart (3 differ at all)" in msg
    assert msg.splitlines()[1].startswith("worst: [5]: actual 1.0000003576278687 (float32 0x3F800003)")
    nan = e.copy()
    nan[0] = np.nan
    assert "NaN vs number" in raises(assert_within_ulp, nan, e, ulp_budget=1 << 30)
    with pytest.raises(ValueError, match="ulp_budget must be an int >= 0"):
        assert_within_ulp(e, e, ulp_budget=-1)


# -- compare ------------------------------------------------------------------------------------


def test_histogram_buckets_on_crafted_distances() -> None:
    d = [0, 0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1023, 1024, 5000]
    a = (np.uint32(0x3F800000) + np.array(d, np.uint32)).view(np.float32)
    a = np.append(a, np.float32(np.nan))
    e = np.full(a.size, 1.0, np.float32)
    r = compare(a, e)
    want = dict.fromkeys(HISTOGRAM_BUCKETS, 0)
    want.update({"0": 2, "1": 1, "2": 1, "3-4": 2, "5-8": 2, "9-16": 2, "17-32": 1})
    want.update({"513-1023": 1, ">=1024": 2, "NaN vs number": 1})
    assert r.histogram == want
    assert (r.size, r.matches, r.mismatches, r.max_ulp, r.nan_mismatches) == (15, 2, 13, 5000, 1)
    assert r.mean_ulp == pytest.approx(sum(d) / len(d))
    assert r.exact_fraction == pytest.approx(2 / 15)


def _classified_e4m3() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [  # (input, expected value, actual value): E4M3 spacing is 1/8 on [1, 2), 32 on [256, 448]
        (1.0, 1.0, 1.0),  # equal
        (1.0625, 1.0, 1.125),  # tie: the midpoint of 1 and 1.125
        (500.0, 448.0, np.nan),  # overflow: beyond max
        (2.0, 2.0, np.nan),  # NaN
        (430.0, 416.0, 448.0),  # saturation
        (-1e-4, -0.0, 0.0),  # signed zero
        (2.0**-9, 2.0**-9, 0.0),  # subnormal flushed
        (3.3, 3.25, 3.5),  # other
        (1.0625 + 2.0**-20, 1.125, 1.0),  # other: just above the midpoint
    ]
    x, e, a = (np.array(c, np.float32) for c in zip(*rows, strict=True))
    return x, e, a


def test_mismatch_classes_with_inputs() -> None:
    x, e, a = _classified_e4m3()
    r = compare(a, e, "e4m3", inputs=x)
    assert r.classes == {
        "overflow": 1,
        "tie": 1,
        "nan_inf": 1,
        "saturation": 1,
        "signed_zero": 1,
        "subnormal": 1,
        "other": 2,
    }
    assert r.mismatches == 8 and r.nan_mismatches == 2


def test_mismatch_classes_without_inputs() -> None:
    x, e, a = _classified_e4m3()
    r = compare(a, e, "e4m3")
    assert r.classes == {"nan_inf": 2, "saturation": 1, "signed_zero": 1, "subnormal": 1, "other": 3}


def test_ties_on_a_wide_dtype_grid() -> None:
    x = np.float32([1 + 2.0**-8, 1 + 2.0**-8 + 2.0**-20, 3.0])  # bfloat16 spacing on [1, 2) is 2^-7
    e = np.float32([1.0, 1 + 2.0**-7, 3.0]).astype(ml_dtypes.bfloat16)
    a = np.float32([1 + 2.0**-7, 1.0, 3.0]).astype(ml_dtypes.bfloat16)
    r = compare(a, e, inputs=x)
    assert r.classes["tie"] == 1 and r.classes["other"] == 1


def test_table_is_markdown() -> None:
    x, e, a = _classified_e4m3()
    text = str(compare(a, e, "e4m3", inputs=x))
    assert text.startswith("| compared as | e4m3 codes |\n|---|---|\n| elements | 9 |")
    assert "| bit-exact | 1 (11.11%) |" in text
    assert "| ULP distance | elements | share |" in text and "| NaN vs number | 2 | 22.22% |" in text
    assert "| tie | 1 | 12.5% |" in text
    assert text == compare(a, e, "e4m3", inputs=x).table()


def test_plot_writes_a_png(tmp_path) -> None:  # noqa: ANN001
    require("matplotlib")
    from matplotlib.figure import Figure

    x, e, a = _classified_e4m3()
    path = tmp_path / "ulp.png"
    fig = compare(a, e, "e4m3", inputs=x).plot(path)
    assert isinstance(fig, Figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_import_needs_only_numpy_and_ml_dtypes() -> None:
    code = (
        "import sys, fp8sim.testing; "
        "heavy = [m for m in ('torch', 'hypothesis', 'matplotlib', 'pytest') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
