"""``assert_matches_emulator``: how it reads what a kernel returned (issue 30.1, ``reports/mutation_testing.md``).

Scales given as Python floats or float64 (TE's ``scale_inv`` is float32: a float64 that float32 holds exactly
is that float32, anything else is refused as float64), the ULP budget reaching the scales, a lone data array
whose first dimension is 2 or 3 (not a ``(data, scales)`` tuple), the error naming the scales, and the output
format of ``scaled_mm`` (torch's rule: ``out_dtype`` defaults to ``mat1``'s dtype; float16 is a float output).

Oracles: TE current scaling written from the spec with ml_dtypes casts (clip to +-max, then ``astype``: RNE,
saturating; as in ``tests/test_testing_emulator.py``); an exact GEMM from float64 sums of FP8 products (exact:
at most 2 x 4 significant bits a product, 64 terms); float32 bit patterns written by hand.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.recipe import Float8CurrentScaling, Format, NVFP4BlockScaling
from fp8sim.testing import assert_matches_emulator
from fp8sim.testing.oracles import require

torch = require("torch")

F32 = np.float32


def _satfinite(x: np.ndarray, fmt: str) -> np.ndarray:
    dt = fp8sim.get_format(fmt).ml_dtype
    m = F32(ml_dtypes.finfo(dt).max)
    return np.clip(np.asarray(x, F32), -m, m).astype(dt).view(np.uint8)


def _te_current(x: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """TE's per-tensor current scaling to E4M3: scale = 448 / amax (float32), data = satfinite(x * scale)."""
    scale = F32(448) / np.abs(x).max()
    return _satfinite(x * scale, "e4m3"), F32(1) / scale


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 3).astype(F32)


def _raises(fn, *args, **kw) -> str:  # noqa: ANN001, ANN002, ANN003
    with pytest.raises(AssertionError) as info:
        fn(*args, **kw)
    return str(info.value)


RECIPE = Float8CurrentScaling(fp8_format=Format.E4M3)


# -- scales as Python floats / float64 ------------------------------------------------------------------------


def test_a_python_float_scale_inv_that_float32_holds_is_that_float32() -> None:
    x = _x(4, 32)
    data, scale_inv = _te_current(x)
    assert_matches_emulator((data, float(scale_inv)), RECIPE, x)
    assert_matches_emulator((data, np.float64([scale_inv])), RECIPE, x)


def test_a_float64_scale_inv_off_the_float32_grid_is_refused() -> None:
    """Half a float32 ULP above TE's scale_inv: float64 holds it, float32 does not; rounding it to float32
    would hide the difference."""
    x = _x(4, 32, seed=1)
    data, scale_inv = _te_current(x)
    half_ulp = (float(np.nextafter(scale_inv, F32(np.inf))) - float(scale_inv)) / 2
    off = float(scale_inv) + half_ulp * 0.5  # rounds back to scale_inv in float32
    assert F32(off) == scale_inv and off != float(scale_inv)
    msg = _raises(assert_matches_emulator, (data, off), RECIPE, x)
    assert "scales: dtype mismatch: actual is float64, expected is float32" in msg


def test_reading_a_float64_scale_raises_no_floating_point_warning() -> None:
    """1e300 overflows float32 and a float64 signalling NaN (0x7FF0000000000001) raises the invalid flag when
    narrowed: neither may leak a RuntimeWarning; both are plain mismatches."""
    x = _x(4, 32, seed=2)
    data, _ = _te_current(x)
    snan = np.array([0x7FF0000000000001], np.uint64).view(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "dtype mismatch: actual is float64" in _raises(assert_matches_emulator, (data, 1e300), RECIPE, x)
        assert "NaN vs number" in _raises(assert_matches_emulator, (data, snan), RECIPE, x)


def test_nvfp4_global_scale_as_a_python_float() -> None:
    """TE's NVFP4 global scale (``1 / s_enc``, float32) given as a Python float; an off-grid float64 is refused."""
    require("torch")  # the NVFP4 Hadamard transform runs in torch
    x = _x(16, 64, seed=3)
    q = fp8sim.testing.emulate(NVFP4BlockScaling(), x)
    amax = float(np.abs(x).max())
    s_dec = F32(1) / np.fmin(F32(6 * 448) / F32(amax), F32(np.finfo(F32).max))  # spec 5.4
    codes = q.codes[tuple(slice(0, n) for n in q.shape)]
    assert_matches_emulator((codes, q.scales, float(s_dec)), NVFP4BlockScaling(), x)
    msg = _raises(assert_matches_emulator, (codes, q.scales, float(s_dec) * (1 + 2.0**-40)), NVFP4BlockScaling(), x)
    assert "global scale: dtype mismatch: actual is float64" in msg


# -- the ULP budget reaches the scales ------------------------------------------------------------------------


def test_ulp_budget_applies_to_the_scales() -> None:
    x = _x(4, 32, seed=4)
    data, scale_inv = _te_current(x)
    one_up = np.nextafter(scale_inv, F32(np.inf))  # float32 pattern + 1: 1 ULP
    assert_matches_emulator((data, one_up), RECIPE, x, ulp_budget=1)
    assert "scales: not bit-exact" in _raises(assert_matches_emulator, (data, one_up), RECIPE, x)


# -- a lone data array is not a tuple ------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [2, 3])
def test_data_alone_with_two_or_three_rows(rows: int) -> None:
    x = _x(rows, 32, seed=5)
    data, _ = _te_current(x)
    assert_matches_emulator(data, RECIPE, x)
    assert_matches_emulator(torch.from_numpy(data).view(torch.float8_e4m3fn), RECIPE, x)


def test_scales_that_are_not_numbers_are_named() -> None:
    x = _x(2, 32, seed=6)
    data, _ = _te_current(x)
    with pytest.raises(TypeError) as info:
        assert_matches_emulator((data, np.array([True])), RECIPE, x)
    assert str(info.value) == "scales must hold numbers (float or integer codes), got dtype bool"
    with pytest.raises(TypeError) as info:
        assert_matches_emulator((data, "0.5"), RECIPE, x)
    assert str(info.value) == "scales must be an array, a tensor or a number, got str"


# -- scaled_mm's output format --------------------------------------------------------------------------------


def _operands(k: int, fa: str, fb: str, ints: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    if ints:  # small integers: every sum is an integer below 2048, exact in float16
        a, b = rng.integers(-4, 5, (16, k)).astype(F32), rng.integers(-4, 5, (k, 16)).astype(F32)
    else:
        a, b = rng.standard_normal((16, k)) * 8, rng.standard_normal((k, 16)) * 8
    return _satfinite(a, fa), _satfinite(b, fb)


def _exact(a: np.ndarray, b: np.ndarray, fa: str, fb: str) -> np.ndarray:
    va = a.view(fp8sim.get_format(fa).ml_dtype).astype(np.float64)
    vb = b.view(fp8sim.get_format(fb).ml_dtype).astype(np.float64)
    return va @ vb


def test_scaled_mm_output_defaults_to_mat1s_format() -> None:
    """torch._scaled_mm: ``out_dtype=None`` is ``mat1.dtype``; E4M3 x E5M2 gives an E4M3 output."""
    a, b = _operands(64, "e4m3", "e5m2")
    ta = torch.from_numpy(a).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e5m2).t()
    one = torch.tensor(1.0)
    want = _satfinite(_exact(a, b, "e4m3", "e5m2").astype(F32), "e4m3")
    out = torch.from_numpy(want).view(torch.float8_e4m3fn)
    assert_matches_emulator(out, "scaled_mm", ta, tb, one, one, accumulator="exact")


def test_scaled_mm_float16_output_and_six_positional_inputs() -> None:
    a, b = _operands(64, "e4m3", "e4m3", ints=True)
    want = _exact(a, b, "e4m3", "e4m3")
    assert np.abs(want).max() < 2048 and (want == np.round(want)).all()  # exact in float16
    one = F32(1)
    kw = dict(accumulator="exact", a_format="e4m3", b_format="e4m3")
    assert_matches_emulator(want.astype(np.float16), "scaled_mm", a, b, one, one, out_dtype="float16", **kw)
    assert_matches_emulator(want.astype(F32), "scaled_mm", a, b, one, one, None, None, out_dtype="float32", **kw)
    ta = torch.from_numpy(a).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt
    tone = torch.tensor(1.0)
    out = torch.from_numpy(want.astype(np.float16))
    assert_matches_emulator(out, "scaled_mm", ta, tb, tone, tone, None, None, torch.float16, accumulator="exact")


# -- the data: ULP budget, report length, the message's prefix ------------------------------------------------


def _bumped(data: np.ndarray, n: int) -> np.ndarray:
    """``data`` with the first ``n`` codes of magnitude below 448 (0x7E) one code further from zero: 1 ULP."""
    out = data.copy().reshape(-1)
    idx = np.flatnonzero((out & 0x7F) < 0x7E)[:n]
    out[idx] += 1
    return out.reshape(data.shape)


def test_ulp_budget_and_max_report_apply_to_the_data() -> None:
    x = _x(4, 32, seed=8)
    data, scale_inv = _te_current(x)
    bad = _bumped(data, 12)
    assert_matches_emulator((bad, scale_inv), RECIPE, x, ulp_budget=1)
    msg = _raises(assert_matches_emulator, (bad, scale_inv), RECIPE, x, max_report=3)
    assert msg.startswith("Float8CurrentScaling (role input, e4m3) data: not bit-exact: 12 of 128 elements differ")
    assert msg.count("]: actual") == 3 and msg.endswith("  ... and 9 more")


# -- the global scale -----------------------------------------------------------------------------------------


def _nvfp4_parts(x: np.ndarray, recipe: NVFP4BlockScaling) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = fp8sim.testing.emulate(recipe, x)
    return q.codes[tuple(slice(0, n) for n in q.shape)], q.scales, np.asarray(q.global_scale, F32)


def test_a_global_scale_is_read_in_any_shape_of_its_size() -> None:
    """TE's row-scaled NVFP4 input has one global scale per row (spec 5.4: ``s_dec`` of the row's amax):
    given flat, or as a column; a plain NVFP4 global scale given as a 1-element array."""
    require("torch")  # the NVFP4 Hadamard transform runs in torch
    x = _x(16, 64, seed=9)
    rows = NVFP4BlockScaling(row_scaled_activation=True, disable_stochastic_rounding=True)
    codes, scales, glob = _nvfp4_parts(x, rows)
    amax = np.abs(x).max(axis=1)
    s_dec = F32(1) / np.fmin(F32(6 * 448) / amax, F32(np.finfo(F32).max))
    assert np.array_equal(glob.reshape(-1).view(np.uint32), s_dec.view(np.uint32))  # the spec's rule, per row
    assert_matches_emulator((codes, scales, s_dec), rows, x)
    assert_matches_emulator((codes, scales, s_dec.reshape(16, 1)), rows, x)
    msg = _raises(assert_matches_emulator, (codes, scales, s_dec[:8]), rows, x)
    assert "global scale: shape mismatch: actual has shape (8,), expected (16, 1)" in msg
    plain = NVFP4BlockScaling()
    codes, scales, glob = _nvfp4_parts(x, plain)
    assert_matches_emulator((codes, scales, glob.reshape(1)), plain, x)
    assert_matches_emulator((codes, scales, glob.reshape(1, 1)), plain, x)


def test_ulp_budget_applies_to_the_global_scale() -> None:
    require("torch")
    x = _x(16, 64, seed=10)
    codes, scales, glob = _nvfp4_parts(x, NVFP4BlockScaling())
    up = np.nextafter(glob, F32(np.inf))
    assert_matches_emulator((codes, scales, up), NVFP4BlockScaling(), x, ulp_budget=1)
    msg = _raises(assert_matches_emulator, (codes, scales, up), NVFP4BlockScaling(), x)
    assert "global scale: not bit-exact" in msg


def test_a_global_scale_for_a_quantizer_without_one_and_a_global_scale_that_is_not_a_number() -> None:
    x = _x(4, 32, seed=11)
    data, scale_inv = _te_current(x)
    msg = _raises(assert_matches_emulator, (data, scale_inv, F32(1)), RECIPE, x)
    assert msg == "Float8CurrentScaling (role input, e4m3): a global scale was given, but this quantizer has none"
    require("torch")
    codes, scales, _ = _nvfp4_parts(_x(16, 64), NVFP4BlockScaling())
    with pytest.raises(TypeError) as info:
        assert_matches_emulator((codes, scales, np.array([True])), NVFP4BlockScaling(), _x(16, 64))
    assert str(info.value) == "global scale must hold numbers (float or integer codes), got dtype bool"


# -- messages of the recipe options ---------------------------------------------------------------------------


def test_recipe_messages_name_the_recipe_and_the_fix() -> None:
    from fp8sim.recipe import DelayedScaling
    from fp8sim.testing import emulate

    x = _x(16, 64, seed=12)
    with pytest.raises(TypeError) as info:
        emulate(DelayedScaling(), x, x)
    assert str(info.value) == "DelayedScaling takes one input tensor, got 2"
    with pytest.raises(TypeError) as info:
        emulate(DelayedScaling(), x, scales=2.0)
    assert str(info.value) == "unknown option(s) scales for DelayedScaling; accepted: role, scale"
    require("torch")
    with pytest.raises(ValueError) as info:
        emulate(NVFP4BlockScaling(), x, role="grad")
    assert str(info.value) == (
        "this role uses stochastic rounding: pass seed= (fp8sim's seeded SR; its bits are not TE's Philox bits, "
        "so a TE kernel can match it in distribution only), or disable_stochastic_rounding=True"
    )
    with pytest.raises(ValueError) as info:
        emulate(NVFP4BlockScaling(row_scaled_activation=True), x, copy="columnwise")
    assert str(info.value) == "row_scaled_activation: only the rowwise input copy is emulated"


# -- recipe defaults: current scaling's format and epsilon, MXFP8's axis and mxfma -----------------------------


def test_current_scaling_hybrid_input_is_e4m3_with_no_amax_epsilon() -> None:
    """HYBRID's input role is E4M3; TE's current scaling uses ``amax_epsilon`` 0 (QParams' default), so a tensor
    of amax 0.25 gets the scale 448 / 0.25 = 1792, not 448 / max(amax, eps)."""
    x = _x(4, 32, seed=13)
    x = x * F32(0.25) / np.abs(x).max()
    data, scale_inv = _te_current(x)
    assert scale_inv == F32(1) / F32(1792)
    assert_matches_emulator((data, scale_inv), Float8CurrentScaling(), x)


def _mx_ref(x32: np.ndarray, rcp: np.float32, fmt: str = "e4m3") -> tuple[np.ndarray, np.ndarray]:
    """TE MXFP8 RCEIL along the last axis (spec 5.2): ``d = fl32(amax * rcp)``, the E8M0 exponent is d's exponent
    rounded up, data = satfinite(x * 2^-e)."""
    blocks = x32.reshape(*x32.shape[:-1], x32.shape[-1] // 32, 32)
    d = np.abs(blocks).max(axis=-1) * rcp
    mant, ex = np.frexp(d)
    e = np.where(mant == 0.5, ex - 1, ex)
    data = _satfinite(blocks * np.exp2(-e)[..., None].astype(F32), fmt).reshape(x32.shape)
    return data, (e + 127).astype(np.uint8)


def test_mxfp8_default_axis_is_the_last_of_a_3d_input() -> None:
    from fp8sim.recipe import MXFP8BlockScaling

    x = _x(2, 64, 32, seed=14) * F32(50)
    data, scales = _mx_ref(x, F32(1.0 / 448.0))
    assert scales.shape == (2, 64, 1)
    assert_matches_emulator((data, scales), MXFP8BlockScaling(), x)


def test_mxfp8_mxfma_is_off_by_default_and_uses_the_fp16_constant_when_on() -> None:
    """float16 input, E5M2 (HYBRID's gradient): plain TE multiplies the amax by fl32(1/57344); the
    ``_ENABLE_MXFMA`` kernel by 1/57344 rounded to float16, 0x0125 = 293 * 2^-24 (spec 5.2), 0.15 % larger.
    A block amax in [57344 / 1.00146, 57344) * 2^j (57312 * 2^j; float16 spacing there is 32 * 2^j) lands on
    the next exponent with the constant only.  (For E4M3 the window above 448 * 2^j holds no bf16/fp16 value.)"""
    from fp8sim.recipe import MXFP8BlockScaling

    rng = np.random.default_rng(15)
    j = rng.integers(-8, 1, (16, 1))
    vals = rng.uniform(-1, 1, (16, 64)) * 40000 * np.exp2(j)
    vals[:8, 0] = 57312 * np.exp2(j[:8, 0])  # the window: first block of the first 8 rows
    xh = vals.astype(np.float16)
    x32 = xh.astype(F32)
    plain = _mx_ref(x32, F32(1.0 / 57344.0), "e5m2")
    mxfma = _mx_ref(x32, np.array([0x0125], np.uint16).view(np.float16).astype(F32)[0], "e5m2")
    assert (plain[1] != mxfma[1]).sum() == 8  # the constants differ exactly on those blocks
    recipe = MXFP8BlockScaling(fp8_format=Format.HYBRID)
    assert_matches_emulator(plain, recipe, xh, role="grad")
    assert_matches_emulator(mxfma, recipe, xh, role="grad", mxfma=True)


def test_more_recipe_messages_name_the_recipe_and_the_argument() -> None:
    from fp8sim.recipe import DelayedScaling
    from fp8sim.testing import emulate

    x = _x(4, 128, seed=16)
    with pytest.raises(TypeError) as info:
        emulate(Float8CurrentScaling(), x, axis=0)
    assert str(info.value) == "unknown option(s) axis for Float8CurrentScaling; accepted: role"
    with pytest.raises(TypeError) as info:
        emulate(fp8sim.recipe.Float8BlockScaling(), x, axis=0)
    assert str(info.value) == "unknown option(s) axis for Float8BlockScaling; accepted: role, columnwise"
    with pytest.raises(TypeError) as info:
        emulate(DelayedScaling(), x, scale="2")
    assert str(info.value) == "scale must be an array, a tensor or a number, got str"


# -- Float8BlockScaling: each role's QParams ------------------------------------------------------------------


def _block_ref(x: np.ndarray, pow2: bool) -> tuple[np.ndarray, np.ndarray]:
    """TE 1x128 block scaling to E4M3 (spec 5.3): scale = 448 / amax (float32), rounded down to a power of two
    when ``pow2``; data = satfinite(x * scale); scale_inv = 1 / scale."""
    blocks = x.reshape(x.shape[0], -1, 128)
    scale = F32(448) / np.abs(blocks).max(axis=-1)
    if pow2:
        scale = np.exp2(np.floor(np.log2(scale))).astype(F32)
    data = _satfinite(blocks * scale[..., None], "e4m3").reshape(x.shape)
    return data, (F32(1) / scale).astype(F32)


def test_block_scaling_takes_power_2_scale_from_the_roles_qparams() -> None:
    """TE reads ``recipe.fp8_quant_fwd_inp`` / ``fp8_quant_fwd_weight`` / ``fp8_quant_bwd_grad`` (class-level
    QParams) per role: a recipe whose input and weight QParams have ``power_2_scale=False`` gets float32 scales
    for those roles and power-of-two scales for the gradient."""
    from fp8sim.recipe import Float8BlockScaling, QParams

    class PerRole(Float8BlockScaling):
        fp8_quant_fwd_inp = QParams(power_2_scale=False, amax_epsilon=0.0)
        fp8_quant_fwd_weight = QParams(power_2_scale=False, amax_epsilon=0.0)
        fp8_quant_bwd_grad = QParams(power_2_scale=True, amax_epsilon=0.0)

    recipe = PerRole(fp8_format=Format.E4M3, w_block_scaling_dim=1)
    x = _x(4, 256, seed=17)
    f32, p2 = _block_ref(x, False), _block_ref(x, True)
    assert not np.array_equal(f32[1], p2[1])
    assert_matches_emulator(f32, recipe, x)
    assert_matches_emulator(f32, recipe, x, role="weight")
    assert_matches_emulator(p2, recipe, x, role="grad")


def test_unknown_ops_list_the_known_ones() -> None:
    from fp8sim.testing import emulate

    with pytest.raises(ValueError) as info:
        emulate("matmul", _x(2, 2))
    assert str(info.value) == (
        "unknown op 'matmul'; known: 'encode', 'quantize', 'cast', 'scaled_mm', or a recipe object (DelayedScaling(), "
        "Float8CurrentScaling(), MXFP8BlockScaling(), Float8BlockScaling(), NVFP4BlockScaling())"
    )


def test_nvfp4_options_and_unknown_recipes_are_named() -> None:
    from fp8sim.recipe import CustomRecipe
    from fp8sim.testing import emulate

    x = _x(16, 64, seed=18)
    with pytest.raises(TypeError) as info:
        emulate("quantize", x, fmt="e4m3", axis=0)
    accepted = "fmt, rounding, saturate, seed, convention"
    assert str(info.value) == f"unknown option(s) axis for 'quantize'; accepted: {accepted}"
    with pytest.raises(TypeError) as info:
        emulate(NVFP4BlockScaling(), x, axis=0, rows=1)
    assert str(info.value) == "unknown option(s) axis, rows for NVFP4BlockScaling; accepted: role, copy, seed"
    with pytest.raises(TypeError) as info:
        emulate(NVFP4BlockScaling(), x, axis=0)
    assert str(info.value) == "unknown option(s) axis for NVFP4BlockScaling; accepted: role, copy, seed"
    with pytest.raises(TypeError) as info:
        emulate(CustomRecipe(qfactory=lambda role: None), x)
    assert str(info.value) == (
        "no emulation for recipe CustomRecipe; supported: DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, "
        "Float8BlockScaling, NVFP4BlockScaling"
    )


def test_a_stochastic_convention_takes_the_seed() -> None:
    """A user ``Convention`` that rounds stochastically gets ``seed=``: the same seed gives the cast with
    ``rounding="stochastic"`` and that seed; another seed other codes; every code is one of the two E5M2
    neighbours of the input (ml_dtypes decodes the codes)."""
    from fp8sim.cast.conventions import Convention
    from fp8sim.testing import emulate

    x = _x(2000, seed=19)
    sr = Convention("sr", "a stochastic-rounding kernel", rounding="stochastic")
    got = emulate("cast", x, fmt="e5m2", convention=sr, seed=7)
    assert np.array_equal(got, emulate("cast", x, fmt="e5m2", rounding="stochastic", seed=7))
    assert not np.array_equal(got, emulate("cast", x, fmt="e5m2", convention=sr, seed=8))
    v = got.view(ml_dtypes.float8_e5m2).astype(np.float64)
    ax = np.abs(x.astype(np.float64))
    step = np.maximum(np.exp2(np.floor(np.log2(ax)) - 2), 2.0**-16)  # E5M2: 2 fraction bits, subnormal step 2^-16
    assert (np.abs(v - x) < step).all()


# -- the message's prefix and the report length, for every kind of op ----------------------------------------


def test_messages_name_the_op_format_and_role_and_list_max_report_elements() -> None:
    """12 codes one step off (1 ULP each): the default lists 10, ``max_report`` any other number, with or
    without a ULP budget; the prefix names the op and format, or the recipe, role and element format."""
    x = _x(4, 32, seed=20)
    want = _satfinite(x, "e4m3")
    bad = _bumped(want, 12)
    msg = _raises(assert_matches_emulator, bad, "cast", x, fmt="e4m3")
    assert msg.startswith("cast (e4m3): not bit-exact: 12 of 128 elements differ (9.375%), compared as e4m3 codes")
    assert msg.count("]: actual") == 10 and msg.endswith("  ... and 2 more")
    bad2 = _bumped(bad, 12)  # the same 12 codes two steps off
    msg = _raises(assert_matches_emulator, bad2, "cast", x, fmt="e4m3", ulp_budget=1, max_report=2)
    assert msg.startswith("cast (e4m3): not within 1 ULP: 12 of 128 elements")
    assert msg.count("]: actual") == 3 and msg.endswith("  ... and 10 more")  # the worst line and 2
    data, scale_inv = _te_current(x)
    msg = _raises(assert_matches_emulator, (_bumped(data, 12), scale_inv), RECIPE, x)
    assert msg.count("]: actual") == 10 and msg.endswith("  ... and 2 more")
    g = x * F32(2)  # HYBRID's gradient: E5M2, scale 1 (delayed scaling's first step)
    msg = _raises(
        assert_matches_emulator, _bumped(_satfinite(g, "e5m2"), 1), fp8sim.recipe.DelayedScaling(), g, role="grad"
    )
    assert msg.startswith("DelayedScaling (role grad, e5m2) data: not bit-exact: 1 of 128 elements differ")


def test_a_float_scaled_mm_output_is_named_by_the_op() -> None:
    a, b = _operands(64, "e4m3", "e4m3", ints=True)
    want = _exact(a, b, "e4m3", "e4m3").astype(F32)
    want[0, 0] = np.nextafter(want[0, 0], F32(np.inf))
    one = F32(1)
    kw = dict(accumulator="exact", a_format="e4m3", b_format="e4m3", out_dtype="float32")
    msg = _raises(assert_matches_emulator, want, "scaled_mm", a, b, one, one, **kw)
    assert msg.startswith("scaled_mm: not bit-exact: 1 of 256 elements differ")


def test_packed_fp4_tensors_are_refused_with_the_fix() -> None:
    from fp8sim.testing import assert_bit_exact

    packed = torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    with pytest.raises(TypeError) as info:
        assert_bit_exact(packed, np.zeros(8, np.uint8), "e2m1")
    assert str(info.value) == (
        "actual is packed FP4 (float4_e2m1fn_x2): unpack it first (fp8sim.scaling.packing.unpack_fp4) and pass "
        "fmt='e2m1'"
    )


def test_operands_that_are_not_numbers_are_named() -> None:
    from fp8sim.testing import assert_bit_exact

    for bad, what in ((torch.tensor([True]), "torch.bool"), (torch.tensor([1 + 2j]), "torch.complex64")):
        with pytest.raises(TypeError) as info:
            assert_bit_exact(bad, np.float32([1.0]))
        assert str(info.value) == f"actual must hold numbers (float or integer codes), got {what}"
    with pytest.raises(TypeError) as info:
        assert_bit_exact(np.float32([1.0]), None)
    assert str(info.value) == "expected must be an array, a tensor or a number, got NoneType"
    for bad, what in ((np.array([1 + 2j]), "complex128"), (np.array([True]), "bool"), (np.array([{}]), "object")):
        with pytest.raises(TypeError) as info:
            assert_bit_exact(bad, np.float32([1.0]))
        assert str(info.value) == f"actual must hold numbers (float or integer codes), got dtype {what}"
