"""fp8sim.recipe against TransformerEngine's recipe definitions (spec 4.1, 4.8, 5.1-5.4).

Expected defaults and messages are copied by hand from TE's ``common/recipe/__init__.py``.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from fp8sim import recipe as r


def test_format_maxima() -> None:
    assert (r.Format.E4M3.value.max_fwd, r.Format.E4M3.value.max_bwd) == (448, 448)
    assert (r.Format.E5M2.value.max_fwd, r.Format.E5M2.value.max_bwd) == (57344, 57344)
    assert (r.Format.HYBRID.value.max_fwd, r.Format.HYBRID.value.max_bwd) == (448, 57344)
    assert (r.Format.E2M1.value.max_fwd, r.Format.E2M1.value.max_bwd) == (6, 6)


@pytest.mark.parametrize(
    ("fmt", "forward", "want"),
    [
        (r.Format.HYBRID, True, "e4m3"),
        (r.Format.HYBRID, False, "e5m2"),
        (r.Format.E4M3, False, "e4m3"),
        (r.Format.E4M3, True, "e4m3"),
        (r.Format.E2M1, True, "e2m1"),
    ],
)
def test_tensor_format_per_spec_4_2(fmt: r.Format, forward: bool, want: str) -> None:
    assert r.tensor_format(fmt, forward).name == want


def test_delayed_scaling_defaults() -> None:
    d = r.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo) == (0, r.Format.HYBRID, 1024, "max")
    assert (d.scaling_factor_compute_algo, d.reduce_amax, d.fp8_dpa, d.fp8_mha) == (None, True, False, False)
    assert d.backward_override is None
    assert r.DelayedScaling.delayed() and r.DelayedScaling.float8_per_tensor_scaling()
    assert not r.DelayedScaling.mxfp8()


def test_current_block_mx_nvfp4_defaults() -> None:
    c = r.Float8CurrentScaling()
    assert c.fp8_format == r.Format.HYBRID and c.use_power_2_scales is False
    assert (c.fp8_gemm_fprop, c.fp8_gemm_dgrad, c.fp8_gemm_wgrad) == (
        r.MMParams(False),
        r.MMParams(True),
        r.MMParams(True),
    )
    assert c.fp8_quant_fwd_inp == r.QParams(power_2_scale=False, amax_epsilon=0.0)
    m = r.MXFP8BlockScaling()
    assert (m.margin, m.fp8_format, m.fp8_dpa, m.fp8_mha) == (0, r.Format.E4M3, False, False)
    b = r.Float8BlockScaling()
    assert (b.use_f32_scales, b.fp8_format) == (False, r.Format.E4M3)
    assert (b.x_block_scaling_dim, b.w_block_scaling_dim, b.grad_block_scaling_dim) == (1, 2, 1)
    assert b.fp8_quant_fwd_weight.power_2_scale is True
    n = r.NVFP4BlockScaling()
    assert (n.fp4_format, n.fp8_format, n.nvfp4_4over6, n.nvfp4_4over6_e4m3_use_256) == (
        r.Format.E2M1,
        r.Format.E4M3,
        "none",
        "all",
    )
    # spec 5.4 per-role table: input RHT, weight 2-D, grad RHT + SR
    assert n.fp4_quant_fwd_inp == r.QParams(random_hadamard_transform=True)
    assert n.fp4_quant_fwd_weight == r.QParams(fp4_2d_quantization=True)
    assert n.fp4_quant_bwd_grad == r.QParams(random_hadamard_transform=True, stochastic_rounding=True)
    n2 = r.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    assert n2.fp4_quant_bwd_grad == r.QParams() and n2.fp4_quant_fwd_weight == r.QParams()


@pytest.mark.parametrize("cls", [r.DelayedScaling, r.Float8CurrentScaling, r.MXFP8BlockScaling, r.Float8BlockScaling])
def test_pure_e5m2_is_refused_with_te_message(cls: type) -> None:
    with pytest.raises(AssertionError, match=r"^Pure E5M2 training is not supported\.$"):
        cls(fp8_format=r.Format.E5M2)
    with pytest.raises(ValueError, match="Pure E5M2"):  # RecipeError is also a ValueError
        cls(fp8_format=r.Format.E5M2)


def test_backward_override_messages() -> None:
    with pytest.raises(AssertionError, match="NVTE_BACKWARD_OVERRIDE must be unset or one of"):
        r.Float8CurrentScaling(backward_override="fp32")
    with pytest.raises(AssertionError, match=r"Delayed scaling only supports backward_override=None\."):
        r.DelayedScaling(backward_override="high_precision")
    assert r.Float8CurrentScaling(backward_override="dequantized").backward_override == "dequantized"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x_block_scaling_dim": 3}, "Only 1D or 2D blocks supported for x"),
        ({"w_block_scaling_dim": 0}, "Only 1D or 2D blocks supported for w"),
        ({"grad_block_scaling_dim": 3}, "Only 1D or 2D blocks supported for grad"),
        ({"x_block_scaling_dim": 2}, "2D by 2D block gemm not supported."),
        ({"fp8_gemm_fprop": r.MMParams(False)}, "Split accumulator required for fprop."),
        ({"fp8_gemm_wgrad": r.MMParams(False)}, "Split accumulator required for wgrad."),
        ({"fp8_dpa": True}, "FP8 attention is not supported for Float8BlockScaling."),
    ],
)
def test_float8_block_scaling_validation_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(AssertionError) as info:
        r.Float8BlockScaling(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nvfp4_4over6": "some"}, "NVTE_NVFP4_4OVER6 must be one of: 'none', 'weights', 'activations', 'all'."),
        ({"nvfp4_4over6_err_mode": "L2"}, "NVTE_NVFP4_4OVER6_ERR_MODE must be one of: 'MAE', 'MSE'."),
        ({"fp8_format": r.Format.E5M2}, "Only E4M3 is supported for NVFP4 scaling"),
    ],
)
def test_nvfp4_validation_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(AssertionError) as info:
        r.NVFP4BlockScaling(**kwargs)
    assert str(info.value) == message


def test_bad_delayed_scaling_fields_name_the_argument() -> None:
    with pytest.raises(ValueError, match="amax_history_len must be >= 1, got -1"):
        r.DelayedScaling(amax_history_len=-1)
    with pytest.raises(ValueError, match="amax_compute_algo must be 'max', 'most_recent' or a callable; got 'mean'"):
        r.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="scaling_factor_compute_algo must be None or a callable"):
        r.DelayedScaling(scaling_factor_compute_algo="pow2")
    with pytest.raises(TypeError, match="margin must be an int"):
        r.DelayedScaling(margin=0.5)
    assert r.DelayedScaling(amax_compute_algo=lambda h: h[0]).amax_compute_algo is not None


def test_legacy_interval_warns_like_te_1_8_to_2_1() -> None:
    with pytest.warns(DeprecationWarning, match=r"`interval` argument is deprecated and unused\."):
        r.DelayedScaling(interval=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r.DelayedScaling()  # default -1: silent


def test_legacy_override_linear_precision() -> None:
    assert r.DelayedScaling(override_linear_precision=(False, False, False)).override_linear_precision.wgrad is False
    with pytest.warns(DeprecationWarning, match="override_linear_precision"):
        d = r.DelayedScaling(override_linear_precision=(False, False, True))
    assert d.override_linear_precision.wgrad is True
    with pytest.raises(AssertionError, match=r"^Only wgrad GEMM override is currently supported\.$"):
        r.DelayedScaling(override_linear_precision=(True, False, False))


ENV_PROBE = """
import fp8sim.recipe as r
c, b, n = r.Float8CurrentScaling(), r.Float8BlockScaling(), r.NVFP4BlockScaling()
print(c.use_power_2_scales, c.fp8_quant_fwd_inp.power_2_scale, b.use_f32_scales,
      b.fp8_quant_fwd_inp.power_2_scale, n.disable_rht, n.fp4_quant_fwd_inp.random_hadamard_transform,
      r.DelayedScaling.__dataclass_fields__['backward_override'].default)
"""


def test_environment_defaults_are_read_at_import() -> None:
    env = {
        "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES": "1",
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1",
        "NVTE_NVFP4_DISABLE_RHT": "1",
        "NVTE_BACKWARD_OVERRIDE": "dequantized",
        "PATH": "",
    }
    out = subprocess.run([sys.executable, "-c", ENV_PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "False", "True", "False", "dequantized"]


def test_use_f32_scales_field_does_not_reach_the_quantizer_qparams() -> None:
    """Spec 5.3 quirk: the QParams are fixed at import, so the field alone changes nothing."""
    b = r.Float8BlockScaling(use_f32_scales=True)
    assert b.fp8_quant_fwd_inp.power_2_scale is True
