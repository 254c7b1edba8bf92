"""Contracts of ``fp8sim.testing`` that its mutation run found unpinned (issue 30.1, ``reports/mutation.md``):
the Markdown of ``ComparisonResult.table``, the documented ranges of every ``recipes()`` field, the defaults
of the near-grid strategies, every option of ``emulate`` / ``assert_matches_emulator`` for NVFP4 and block
scaling, and error messages that name the argument and the allowed values.

Oracles: hand-computed ULP distances and shares (float32 bit patterns), TE's recipe field domains as the
strategies' docstring states them, TE's NVFP4 row-scaled and columnwise copies recomputed through
``fp8sim.scaling`` entry points other than the emulator's, and the messages' documented wording.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8sim.testing.oracles import require

hypothesis = require("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fp8sim.recipe import (  # noqa: E402
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from fp8sim.testing import compare, emulate  # noqa: E402
from fp8sim.testing.strategies import float_arrays_near_grid, near_grid_values, recipes  # noqa: E402

RUN = settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
F32 = np.float32


def _collect(strategy: st.SearchStrategy, examples: int) -> list:
    seen: list = []

    @settings(RUN, max_examples=examples)
    @given(strategy)
    def run(value: object) -> None:
        seen.append(value)

    run()
    return seen


# -- ComparisonResult.table ----------------------------------------------------------------------------------


def test_comparison_table_is_the_documented_markdown() -> None:
    """Six float32 elements: 1 = 1, 2 vs 2.5 (0x40000000 vs 0x40200000: 2,097,152 ULP), NaN vs 1, +0 vs -0
    (1 ULP: -0 sits just below +0), -0 = -0, 448 = 448.  Mean ULP over the five non-NaN pairs: 2,097,153 / 5."""
    a = np.array([1.0, 2.0, np.nan, 0.0, -0.0, 448.0], F32)
    e = np.array([1.0, 2.5, 1.0, -0.0, -0.0, 448.0], F32)
    r = compare(a, e)
    assert (r.size, r.matches, r.mismatches, r.max_ulp, r.nan_mismatches) == (6, 3, 3, 2_097_152, 1)
    assert r.mean_ulp == pytest.approx(2_097_153 / 5) and r.exact_fraction == 0.5
    want = """\
| compared as | float32 bit patterns |
|---|---|
| elements | 6 |
| bit-exact | 3 (50%) |
| max ULP | 2,097,152 |
| mean ULP | 4.194e+05 |
| NaN vs number | 1 |

| ULP distance | elements | share |
|---|---|---|
| 0 | 3 | 50% |
| 1 | 1 | 16.67% |
| >=1024 | 1 | 16.67% |
| NaN vs number | 1 | 16.67% |

| mismatch class | elements | share of mismatches |
|---|---|---|
| nan_inf | 1 | 33.33% |
| signed_zero | 1 | 33.33% |
| other | 1 | 33.33% |"""
    assert r.table() == want and str(r) == want


def test_comparison_table_of_equal_operands_has_no_class_table() -> None:
    r = compare(np.array([1.0, 2.0], F32), np.array([1.0, 2.0], F32))
    assert r.table().splitlines()[-1] == "| 0 | 2 | 100% |" and "mismatch class" not in r.table()
    assert compare(np.zeros(0, F32), np.zeros(0, F32)).exact_fraction == 1.0


def test_comparison_plot_title_states_the_exact_share_and_the_max_ulp(tmp_path) -> None:  # noqa: ANN001
    require("matplotlib")
    r = compare(np.array([1.0, 2.0], F32), np.array([1.0, 2.5], F32))
    fig = r.plot(tmp_path / "h.png")
    assert fig.axes[0].get_title() == "float32 bit patterns: 50.0000% bit-exact, max 2097152 ULP"
    assert (tmp_path / "h.png").stat().st_size > 0
    assert r.plot(title="mine").axes[0].get_title() == "mine"


# -- strategies ------------------------------------------------------------------------------------------------


def test_recipe_fields_cover_their_documented_domains() -> None:
    """``recipes()`` draws every field over its whole domain: both ends of the integer ranges (margin 0-8,
    amax_history_len 1-1024), every algorithm, both booleans, all backward overrides (delayed scaling: none),
    HYBRID and E4M3, every NVFP4 4over6 scope and error mode, the four block-dimension layouts."""
    drawn = _collect(recipes(), 600)
    by = {k: [r for r in drawn if type(r) is k] for k in (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling)}
    by[Float8BlockScaling] = [r for r in drawn if isinstance(r, Float8BlockScaling)]
    by[NVFP4BlockScaling] = [r for r in drawn if isinstance(r, NVFP4BlockScaling)]

    def seen(kind: type, field: str) -> set:
        return {getattr(r, field) for r in by[kind]}

    d = DelayedScaling
    assert {0, 8} <= seen(d, "margin") <= set(range(9))
    assert {1, 1024} <= seen(d, "amax_history_len") <= set(range(1, 1025))
    assert seen(d, "amax_compute_algo") == {"max", "most_recent"}
    assert seen(d, "backward_override") == {None}
    for kind in (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling):
        assert seen(kind, "fp8_format") == {Format.HYBRID, Format.E4M3}
        assert seen(kind, "fp8_dpa") == {False, True} and seen(kind, "fp8_mha") == {False, True}
    assert seen(d, "reduce_amax") == {False, True}
    for kind in (Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling):
        assert seen(kind, "backward_override") == {None, "high_precision", "dequantized"}
    c = Float8CurrentScaling
    assert seen(c, "use_power_2_scales") == {False, True}
    for gemm in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
        assert {p.use_split_accumulator for p in seen(c, gemm)} == {False, True}
    assert {0, 8} <= seen(MXFP8BlockScaling, "margin") <= set(range(9))
    b = Float8BlockScaling
    assert seen(b, "use_f32_scales") == {False, True} and seen(b, "fp8_format") == {Format.HYBRID, Format.E4M3}
    dims = {(r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) for r in by[b]}
    assert dims == {(1, 2, 1), (1, 1, 1), (2, 1, 1), (1, 1, 2)}
    n = NVFP4BlockScaling
    for flag in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "row_scaled_activation"):
        assert seen(n, flag) == {False, True}, flag
    scopes = {"none", "weights", "activations", "all"}
    assert seen(n, "nvfp4_4over6") == scopes and seen(n, "nvfp4_4over6_e4m3_use_256") == scopes
    assert seen(n, "nvfp4_4over6_err_mode") == {"MAE", "MSE"}


def test_emulated_only_recipes_keep_every_field_but_4over6_and_row_scaling() -> None:
    drawn = [r for r in _collect(recipes(NVFP4BlockScaling, emulated_only=True), 120)]
    assert {r.nvfp4_4over6 for r in drawn} == {"none"} and {r.row_scaled_activation for r in drawn} == {False}
    assert {r.disable_rht for r in drawn} == {False, True}
    assert {r.nvfp4_4over6_e4m3_use_256 for r in drawn} == {"none", "weights", "activations", "all"}


def test_recipes_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        recipes(int)
    assert str(info.value) == (
        "unknown recipe kind <class 'int'>; known: DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, "
        "Float8BlockScaling, NVFP4BlockScaling"
    )


def test_float_arrays_near_grid_defaults_and_specials() -> None:
    """Default shape 64 and dtype float32; ``specials=False`` never draws NaN or Inf, the default does."""
    plain = _collect(float_arrays_near_grid("e4m3"), 40)
    assert all(a.shape == (64,) and a.dtype == np.float32 for a in plain)
    assert any(not np.isfinite(a).all() for a in plain)
    finite = _collect(float_arrays_near_grid("e4m3", 64, specials=False), 40)
    assert all(np.isfinite(a).all() for a in finite)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_near_grid_values_hold_the_dtypes_smallest_subnormal(dtype: str) -> None:
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    table = near_grid_values("e4m3", dtype).astype(np.float64)
    tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)
    assert tiny in table and -tiny in table


def test_near_grid_values_refuse_other_dtypes_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as info:
        near_grid_values("e4m3", np.int32)
    assert str(info.value) == "dtype must be float16, bfloat16, float32 or float64; got 'int32'"


# -- emulate: NVFP4, block scaling, delayed scaling -------------------------------------------------------------


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def test_nvfp4_row_scaled_activation_is_the_row_scaled_input_copy() -> None:
    """``row_scaled_activation``: the input role's rowwise copy is TE's row-scaled NVFP4 cast (one global
    scale per row); other roles keep the recipe's settings; the columnwise input copy is refused."""
    require("torch")  # the NVFP4 Hadamard transform runs in torch
    from fp8sim.scaling.nvfp4 import quantize_nvfp4

    x = _x(16, 64)
    recipe = NVFP4BlockScaling(row_scaled_activation=True, disable_stochastic_rounding=True)
    got = emulate(recipe, x)
    want = quantize_nvfp4(x, flavor="te", row_scaled=True)
    assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)
    assert np.array_equal(np.asarray(got.global_scale), np.asarray(want.global_scale))
    assert np.asarray(want.global_scale).size == 16  # one per row
    plain = emulate(NVFP4BlockScaling(disable_stochastic_rounding=True), x)
    assert np.asarray(plain.global_scale).size == 1
    w = emulate(recipe, x, role="weight")
    assert w.block == (16, 16) and np.asarray(w.global_scale).size == 1
    with pytest.raises(ValueError, match="row_scaled_activation: only the rowwise input copy is emulated"):
        emulate(recipe, x, copy="columnwise")


def test_nvfp4_columnwise_copy_and_the_copy_option_is_checked() -> None:
    """``copy="columnwise"``: the role's columnwise copy (RHT on the input's wgrad copy unless disabled);
    any other ``copy`` names the two allowed values."""
    require("torch")  # the NVFP4 Hadamard transform runs in torch
    from fp8sim.scaling.nvfp4 import nvfp4_role_settings, quantize_nvfp4_role

    x = _x(16, 64, seed=1)
    recipe = NVFP4BlockScaling(disable_stochastic_rounding=True)
    s = nvfp4_role_settings("input", disable_rht=False, disable_stochastic_rounding=True, disable_2d_quantization=False)
    want = quantize_nvfp4_role(x, s).columnwise
    got = emulate(recipe, x, copy="columnwise")
    assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)
    assert not np.array_equal(
        got.codes,
        emulate(NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True), x, copy="columnwise").codes,
    )
    with pytest.raises(ValueError) as info:
        emulate(recipe, x, copy="both")
    assert str(info.value) == "copy must be 'rowwise' or 'columnwise', got 'both'"


def test_nvfp4_stochastic_rounding_takes_the_seed_and_4over6_is_named() -> None:
    require("torch")  # the NVFP4 Hadamard transform runs in torch
    x = _x(16, 64, seed=2)
    a = emulate(NVFP4BlockScaling(), x, role="grad", seed=1)
    b = emulate(NVFP4BlockScaling(), x, role="grad", seed=1)
    c = emulate(NVFP4BlockScaling(), x, role="grad", seed=2)
    assert np.array_equal(a.codes, b.codes) and not np.array_equal(a.codes, c.codes)
    nosr = emulate(NVFP4BlockScaling(disable_stochastic_rounding=True), x, role="grad", seed=1)
    assert np.array_equal(
        nosr.codes, emulate(NVFP4BlockScaling(disable_stochastic_rounding=True), x, role="grad").codes
    )
    with pytest.raises(ValueError) as info:
        emulate(NVFP4BlockScaling(nvfp4_4over6="weights"), x)
    assert str(info.value) == "NVFP4 4over6 (nvfp4_4over6='weights') is not emulated by fp8sim"


@pytest.mark.parametrize(("role", "dim_field"), [("input", "x"), ("weight", "w"), ("grad", "grad")])
def test_block_scaling_roles_take_their_block_dimension_format_and_pow2(role: str, dim_field: str) -> None:
    """Float8BlockScaling: the role's ``*_block_scaling_dim`` (2: 128x128 tiles), E5M2 for ``grad`` under
    HYBRID (E4M3, the recipe's default, for every role), the role's ``QParams.power_2_scale`` (TE sets the
    QParams at import, so ``use_f32_scales`` of an instance does not reach them); ``columnwise=True`` is the
    128x1 copy."""
    from fp8sim.scaling.block import quantize_block_scaling

    x = _x(128, 256, seed=3) * 7
    dims = {"x_block_scaling_dim": 1, "w_block_scaling_dim": 1, "grad_block_scaling_dim": 1}
    dims[f"{dim_field}_block_scaling_dim"] = 2
    for fmt_enum, grad_fmt in ((Format.E4M3, "e4m3"), (Format.HYBRID, "e5m2")):
        recipe = Float8BlockScaling(fp8_format=fmt_enum, **dims)
        qp = {"input": recipe.fp8_quant_fwd_inp, "weight": recipe.fp8_quant_fwd_weight}.get(
            role, recipe.fp8_quant_bwd_grad
        )
        got = emulate(recipe, x, role=role)
        fmt = grad_fmt if role == "grad" else "e4m3"
        want = quantize_block_scaling(x, fmt, block_dim=2, columnwise=False, pow2=qp.power_2_scale)
        assert got.block == (128, 128) and got.fmt.name == fmt
        assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)
        other = next(r for r in ("input", "weight", "grad") if r != role)  # a 1-D role: its 128x1 copy
        col = emulate(recipe, x, role=other, columnwise=True)
        ofmt = grad_fmt if other == "grad" else "e4m3"
        want = quantize_block_scaling(x, ofmt, block_dim=1, columnwise=True, pow2=qp.power_2_scale)
        assert col.block == (128, 1)
        assert np.array_equal(col.codes, want.codes) and np.array_equal(col.scales, want.scales)


def test_delayed_and_current_scaling_roles_pick_the_format() -> None:
    """HYBRID: E4M3 for input/weight, E5M2 for grad (its max 57344 bounds a scale-1 cast); E4M3 recipes keep
    E4M3 for the gradient; current scaling honours ``use_power_2_scales``."""
    x = np.array([[1000.0, -70000.0, 0.5, 3.0]], F32)
    assert emulate(DelayedScaling(), x, role="grad").fmt.name == "e5m2"
    assert emulate(DelayedScaling(), x, role="weight").fmt.name == "e4m3"
    assert emulate(DelayedScaling(fp8_format=Format.E4M3), x, role="grad").fmt.name == "e4m3"
    g = emulate(DelayedScaling(), x, role="grad", scale=0.5)
    assert float(g.scales.reshape(-1)[0]) == 2.0  # scale_inv of 0.5
    assert emulate(Float8CurrentScaling(), x, role="grad").fmt.name == "e5m2"
    p2 = emulate(Float8CurrentScaling(use_power_2_scales=True), x)
    s = float(np.asarray(p2.scales).reshape(-1)[0])
    assert s == 2.0 ** round(math.log2(s))
    assert float(np.asarray(emulate(Float8CurrentScaling(), x).scales).reshape(-1)[0]) != s


def test_mxfp8_axis_and_mxfma_options_reach_the_quantizer() -> None:
    from fp8sim.scaling.mx import quantize_mx

    x = _x(64, 64, seed=4)
    for axis in (-1, 0):
        for mxfma in (False, True):
            got = emulate(MXFP8BlockScaling(), x, axis=axis, mxfma=mxfma)
            want = quantize_mx(x, "e4m3", axis=axis, scale_rule="rceil", flavor="te", mxfma=mxfma)
            assert np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)
    assert emulate(MXFP8BlockScaling(), x, role="grad").fmt.name == "e4m3"  # TE's default format: E4M3
    assert emulate(MXFP8BlockScaling(fp8_format=Format.HYBRID), x, role="grad").fmt.name == "e5m2"


def test_unknown_options_and_recipes_name_what_is_accepted() -> None:
    x = _x(2, 32)
    with pytest.raises(TypeError) as info:
        emulate(MXFP8BlockScaling(), x, axes=0)
    assert str(info.value) == "unknown option(s) axes for MXFP8BlockScaling; accepted: role, axis, mxfma"
    with pytest.raises(ValueError) as info:
        emulate(MXFP8BlockScaling(), x, role="output")
    assert str(info.value) == "unknown role 'output'; known: input, weight, grad"
    with pytest.raises(TypeError) as info:
        emulate("cast", x, x, fmt="e4m3")
    assert str(info.value) == "'cast' takes one input tensor, got 2"
    with pytest.raises(TypeError) as info:
        emulate("cast", x)
    assert str(info.value) == "'cast' needs fmt= (e.g. fmt='e4m3')"
    with pytest.raises(ValueError) as info:
        emulate("cast", x, fmt="e4m3", rounding="stochastic")
    assert str(info.value) == "rounding='stochastic' needs seed= to be reproducible"
    with pytest.raises(ValueError) as info:
        emulate("cast", x, fmt="e4m3", convention="torchao", rounding="up", saturate=True)
    assert str(info.value) == "convention= fixes rounding and saturate; drop rounding, saturate"


def test_cast_defaults_are_nearest_even_and_saturating() -> None:
    """``"cast"`` without ``rounding``/``saturate``: RNE, saturating (an overflow lands on max, 0x7E)."""
    x = np.array([1000.0, 1.0625, -1e6], F32)  # 1.0625: the tie between 1.0 and 1.125 -> 1.0 (even)
    codes = emulate("cast", x, fmt="e4m3")
    assert codes.tolist() == [0x7E, 0x38, 0xFE]
    assert emulate("cast", x, fmt="e4m3", saturate=False).tolist()[0] == 0x7F  # NaN: no Inf in E4M3
    assert emulate("cast", x, fmt="e4m3", rounding="up").tolist()[1] == 0x39
    assert emulate("quantize", x, fmt="e4m3").tolist() == [448.0, 1.0, -448.0]


def test_scaled_mm_output_format_is_read_from_out_dtype_or_the_operand() -> None:
    """An FP8 output is compared as codes of its format: the option, the 7th positional input, else
    ``a_format``; a float output as floats."""
    from fp8sim.testing.emulator import _mm_out_format

    a = np.zeros((16, 16), np.uint8)
    assert _mm_out_format((a,), {"out_dtype": "float32"}) is None
    assert _mm_out_format((a,), {"out_dtype": "e5m2"}).name == "e5m2"
    assert _mm_out_format((a, a, 1, 1, None, None, "bfloat16"), {}) is None
    assert _mm_out_format((a, a, 1, 1, None, None, "e4m3"), {}).name == "e4m3"
    assert _mm_out_format((a,), {"a_format": "e5m2"}).name == "e5m2"


# -- reading operands as codes of a format ---------------------------------------------------------------------


def test_off_grid_values_are_refused_naming_the_element_its_bits_and_the_fix() -> None:
    """With ``fmt=``, a float that is not a value of the format is a ValueError naming the operand, the
    element's index (``[()]`` for a scalar), its value and bit pattern, and what to pass instead."""
    from fp8sim.testing import assert_bit_exact

    fix = "is not a value of e4m3: with fmt= pass codes or values on the e4m3 grid (e.g. fp8sim.quantize)"
    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.float32(0.3), np.float32(0.3), "e4m3")
    assert str(info.value) == f"actual[()] = 0.30000001192092896 (float32 0x3E99999A) {fix}"
    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.array([[1.0, 0.5]], F32), np.array([[1.0, 0.3]], F32), "e4m3")
    assert str(info.value) == f"expected[0, 1] = 0.30000001192092896 (float32 0x3E99999A) {fix}"
    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.array([3, 300]), np.array([3, 3]), "e4m3")
    assert str(info.value) == "actual holds code 300, out of range for e4m3: codes are 0..255"
    with pytest.raises(ValueError) as info:
        assert_bit_exact(np.array([3, 3]), np.array([-1, 3]), "e4m3")
    assert str(info.value) == "expected holds code -1, out of range for e4m3: codes are 0..255"


# -- the pytest plugin's gpu rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "capability", "reason"),
    [
        (False, None, "needs a CUDA device with float8 support; torch sees none"),
        (True, (8, 6), "needs compute capability >= 8.9 for float8; the device has 8.6"),
        (True, (8, 9), None),
        (True, (9, 0), None),
        (True, (7, 9), "needs compute capability >= 8.9 for float8; the device has 7.9"),
    ],
)
def test_gpu_skip_reason_needs_compute_capability_8_9(monkeypatch, available, capability, reason) -> None:  # noqa: ANN001
    """The ``gpu`` marker's rule: a CUDA device of compute capability >= 8.9 (Ada, Hopper, Blackwell)."""
    torch = require("torch")
    from fp8sim.testing.pytest_plugin import gpu_skip_reason

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    gpu_skip_reason.cache_clear()
    try:
        assert gpu_skip_reason() == reason
    finally:
        gpu_skip_reason.cache_clear()
