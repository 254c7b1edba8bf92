"""fp8sim.recipe against TransformerEngine's recipe definitions (spec 4.1, 4.8, 5.1-5.4).

Expected defaults and messages are copied by hand from TE's ``common/recipe/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from collections.abc import Callable

import pytest

from fp8sim import recipe as r
from fp8sim.testing.oracles import require


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


def test_amax_history_len_zero_is_accepted_as_te_accepts_it() -> None:
    """TE's DelayedScaling (common/recipe/__init__.py 255-270) has no check on amax_history_len; its
    state allocates torch.zeros(0, n) and building the quantizers reads amax_history[0][i]
    (pytorch/quantization.py 1436-1451): IndexError on the first FP8 step, not at construction."""
    d = r.DelayedScaling(amax_history_len=0)
    assert d.amax_history_len == 0 and "amax_history_len=0" in repr(d)
    from fp8sim.scaling.delayed import DelayedScaler

    with pytest.raises(IndexError, match="index 0 is out of bounds for dimension 0 with size 0"):
        DelayedScaler(d, n=3)
    with pytest.raises(IndexError, match="index 0 is out of bounds"):
        DelayedScaler(r.DelayedScaling(), n=3).set_recipe(d)


def test_bad_delayed_scaling_fields_name_the_argument() -> None:
    with pytest.raises(ValueError, match="amax_history_len must be >= 0, got -1"):
        r.DelayedScaling(amax_history_len=-1)
    with pytest.raises(r.RecipeValidationError, match=r"amax_compute_algo\n  Input should be 'max' or 'most_recent'"):
        r.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(r.RecipeValidationError, match=r"scaling_factor_compute_algo\n  Input should be callable"):
        r.DelayedScaling(scaling_factor_compute_algo="pow2")
    with pytest.raises(r.RecipeValidationError, match=r"margin\n  Input should be a valid integer"):
        r.DelayedScaling(margin=0.5)
    assert r.DelayedScaling(amax_compute_algo=lambda h: h[0]).amax_compute_algo is not None


@pytest.mark.parametrize("margin", [10**6, -(10**6), 64, -128])
def test_margin_out_of_range_is_refused_at_construction(margin: int) -> None:
    """Issue 18 item 10: TE computes ``fp8_max * powf(2, -margin)`` (``common/recipe/delayed_scaling.cu``
    line 300), 0 for margin 10**6 (scale 0, NaN outputs) and Inf below -127; the unfused update's
    ``tensor / 2**margin`` raises OverflowError from 64 on (``pytorch/quantization.py`` line 1111)."""
    with pytest.raises(r.RecipeValidationError, match=r"margin must be an int in \[-127, 63\]"):
        r.DelayedScaling(margin=margin)
    assert r.DelayedScaling(margin=63).margin == 63 and r.DelayedScaling(margin=-127).margin == -127


RECIPES = [r.DelayedScaling, r.Float8CurrentScaling, r.MXFP8BlockScaling, r.Float8BlockScaling, r.NVFP4BlockScaling]


@pytest.mark.torch
@pytest.mark.parametrize("cls", RECIPES)
@pytest.mark.parametrize("legacy", [{"interval": 2}, {"override_linear_precision": (True, False, False)}])
def test_legacy_fields_are_accepted_and_ignored_by_every_recipe(cls: type, legacy: dict) -> None:
    """Spec 0 / 4.8: TE 2.x's pydantic dataclasses ignore ``interval`` and ``override_linear_precision``."""
    from fp8sim.accelerate import UpstreamQuirkWarning

    (name,) = legacy
    with pytest.warns(UpstreamQuirkWarning, match=rf"{cls.__name__}\({name}=.*\) has no effect"):
        got = cls(**legacy)
    assert repr(got) == repr(cls())
    assert name not in {f.name for f in dataclasses.fields(got)}


def test_override_linear_precision_no_longer_changes_numerics() -> None:
    """TE 2.x runs wgrad in FP8 whatever ``override_linear_precision`` says (it is not a field): the
    same Linear steps with and without it give identical bits (fp8sim before this change ran wgrad
    in high precision for (False, False, True))."""
    torch = require("torch")
    import fp8sim.pytorch as te

    torch.set_num_threads(1)

    def steps(recipe: r.DelayedScaling) -> tuple:
        torch.manual_seed(0)
        layer = te.Linear(32, 16)
        x = torch.randn(8, 32, requires_grad=True)
        for _ in range(2):
            with te.autocast(enabled=True, recipe=recipe):
                y = layer(x)
            y.sum().backward()
        return y.detach(), x.grad, layer.weight.grad

    with pytest.warns(UserWarning):
        legacy = r.DelayedScaling(override_linear_precision=(False, False, True))
    for a, b in zip(steps(legacy), steps(r.DelayedScaling()), strict=True):
        assert torch.equal(a, b)


@pytest.mark.torch
def test_accelerate_fp8_override_env_neither_crashes_nor_changes_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ACCELERATE_FP8_OVERRIDE_FPROP=1`` made accelerate pass ``override_linear_precision=(True, ...)``,
    which fp8sim refused ("Only wgrad GEMM override"); TE 2.x ignores it."""
    import fp8sim.accelerate as fa

    for gemm in ("FPROP", "DGRAD", "WGRAD"):
        monkeypatch.setenv(f"ACCELERATE_FP8_OVERRIDE_{gemm}", "1")
    monkeypatch.setenv("ACCELERATE_FP8_INTERVAL", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recipe, _ = fa.te_recipe_from_handler(fa.TERecipeKwargs())
        mx, _ = fa.te_recipe_from_handler(fa.TERecipeKwargs(use_mxfp8_block_scaling=True))
    assert repr(recipe) == repr(r.DelayedScaling())
    assert repr(mx) == repr(r.MXFP8BlockScaling())


# TE's _make_repr, written from common/recipe/__init__.py at d0067d0 (QParams 96-101, MMParams 69,
# DelayedScaling 272-283, Float8CurrentScaling 320-333, MXFP8BlockScaling 381-388,
# Float8BlockScaling 469-485, NVFP4BlockScaling 611-626, CustomRecipe 702-708).
def _te_qparams(q: r.QParams) -> str:
    return (
        f"Qparams(\npower_2_scale={q.power_2_scale},\namax_epsilon={q.amax_epsilon},\n"
        f"random_hadamard_transform={q.random_hadamard_transform},\nstochastic_rounding={q.stochastic_rounding},\n"
        f"fp4_2d_quantization={q.fp4_2d_quantization}\n)"
    )


def _te_mm(m: r.MMParams) -> str:
    return f"MMParams(use_split_accumulator={m.use_split_accumulator})"


def _te_repr(x: r.Recipe) -> str:
    n = type(x).__name__
    if isinstance(x, r.DelayedScaling):
        return (
            f"recipe_type={n}, margin={x.margin}, format={x.fp8_format.name}, amax_history_len={x.amax_history_len}, "
            f"reduce_amax={x.reduce_amax}, fp8_dpa={x.fp8_dpa}, fp8_mha={x.fp8_mha}, "
            f"backward_override={x.backward_override}"
        )
    if isinstance(x, r.MXFP8BlockScaling):
        return (
            f"recipe_type={n}, margin={x.margin}, format={x.fp8_format.name}, backward_override={x.backward_override}, "
            f"enable_2d_quantization={x.enable_2d_quantization}"
        )
    if isinstance(x, r.NVFP4BlockScaling):
        return (
            f"recipe_type={n}, fp4_format={x.fp4_format.name}, fp8_format={x.fp8_format.name}, fp8_dpa={x.fp8_dpa}, "
            f"fp8_mha={x.fp8_mha}, backward_override={x.backward_override}, "
            f"row_scaled_activation={x.row_scaled_activation}, nvfp4_4over6={x.nvfp4_4over6}, "
            f"nvfp4_4over6_e4m3_use_256={x.nvfp4_4over6_e4m3_use_256}, "
            f"nvfp4_4over6_err_mode={x.nvfp4_4over6_err_mode}, "
            f"fp4_quant_fwd_inp={_te_qparams(x.fp4_quant_fwd_inp)}, "
            f"fp4_quant_fwd_weight={_te_qparams(x.fp4_quant_fwd_weight)}, "
            f"fp4_quant_bwd_grad={_te_qparams(x.fp4_quant_bwd_grad)}, "
        )
    if isinstance(x, r.CustomRecipe):
        return (
            f"recipe_type={n}, qfactory={x.qfactory}, backward_override={x.backward_override}, "
            f"quantization_alignment={x.quantization_alignment}"
        )
    head = f"recipe_type={n}, format={x.fp8_format.name}, "
    quant = (
        f"fp8_quant_fwd_inp={_te_qparams(x.fp8_quant_fwd_inp)}, "
        f"fp8_quant_fwd_weight={_te_qparams(x.fp8_quant_fwd_weight)}, "
        f"fp8_quant_bwd_grad={_te_qparams(x.fp8_quant_bwd_grad)}, "
    )
    dims = ""
    if isinstance(x, r.Float8BlockScaling):
        dims = (
            f"x_block_scaling_dim={x.x_block_scaling_dim}, w_block_scaling_dim={x.w_block_scaling_dim}, "
            f"grad_block_scaling_dim={x.grad_block_scaling_dim}, "
        )
    gemms = (
        f"fp8_gemm_fprop={_te_mm(x.fp8_gemm_fprop)}, fp8_gemm_dgrad={_te_mm(x.fp8_gemm_dgrad)}, "
        f"fp8_gemm_wgrad={_te_mm(x.fp8_gemm_wgrad)}, "
    )
    return (
        head
        + quant
        + dims
        + gemms
        + f"fp8_dpa={x.fp8_dpa}, fp8_mha={x.fp8_mha}, backward_override={x.backward_override}"
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: r.DelayedScaling(margin=2, fp8_format=r.Format.E4M3, amax_history_len=16),
        lambda: r.Float8CurrentScaling(),
        lambda: r.MXFP8BlockScaling(enable_2d_quantization=True),
        lambda: r.Float8BlockScaling(),
        lambda: r.NVFP4BlockScaling(disable_rht=True),
        lambda: r.CustomRecipe(qfactory=print, quantization_alignment=32),
    ],
)
def test_repr_is_tes(make: Callable[[], r.Recipe]) -> None:
    x = make()
    assert repr(x) == str(x) == _te_repr(x)


def test_mxfp8_enable_2d_quantization_field() -> None:
    """TE ``common/recipe/__init__.py`` line 373: a bool field, default False, coerced by pydantic."""
    assert r.MXFP8BlockScaling().enable_2d_quantization is False
    assert r.MXFP8BlockScaling(enable_2d_quantization=1).enable_2d_quantization is True


def test_custom_recipe_contract() -> None:
    """TE ``common/recipe/__init__.py`` lines 683-700: ``qfactory`` required, HYBRID, alignment > 0."""
    c = r.CustomRecipe(qfactory=lambda role: None)
    assert c.custom() and r.CustomRecipe.custom() and not r.DelayedScaling.custom()
    assert (c.fp8_format, c.quantization_alignment, c.fp8_dpa, c.backward_override) == (
        r.Format.HYBRID,
        128,
        False,
        None,
    )
    with pytest.raises(TypeError):
        r.CustomRecipe()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"^CustomRecipe quantization_alignment must be positive\.$"):
        r.CustomRecipe(qfactory=print, quantization_alignment=0)
    with pytest.raises(r.RecipeValidationError, match="qfactory"):
        r.CustomRecipe(qfactory=3)


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
