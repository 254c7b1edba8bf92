"""NVFP4 in the TE modules: edges the mutation sample of ``fp8sim/pytorch/module`` found untested (issue 30).

References: TE at d0067d0 (2.20.0.dev0) and the TE references in tests/_te_nvfp4_reference.py and
tests/test_pytorch_nvfp4_4over6.py (both written from TE's source).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import NVFP4BlockScaling  # noqa: E402

torch.set_num_threads(1)


def _te_nvfp4_slot(recipe: NVFP4BlockScaling, forward: bool, tensor_type: str) -> dict:
    """TE quantization.py:1693-1745 (``NVFP4BlockScalingRecipeState.make_quantizers``), one slot's settings."""
    grad = tensor_type in ("grad_output", "grad_input")
    qp = recipe.fp4_quant_bwd_grad if grad else recipe.fp4_quant_fwd_weight if tensor_type == "weight" else None
    qp = qp or recipe.fp4_quant_fwd_inp
    scope = {"all": True, "weights": tensor_type == "weight", "activations": tensor_type != "weight", "none": False}
    use = not grad and scope[recipe.nvfp4_4over6]
    return {
        "rowwise_usage": True,
        "columnwise_usage": True,
        "nvfp4_use_4over6": use,
        "nvfp4_e4m3_max": 256 if use and scope[recipe.nvfp4_4over6_e4m3_use_256] else 448,
        "row_scaled_nvfp4": forward and tensor_type != "weight" and recipe.row_scaled_activation,
        "with_rht": qp.random_hadamard_transform,
        "stochastic_rounding": qp.stochastic_rounding,
    }


@pytest.mark.parametrize(
    ("four_over_six", "use_256"), [("all", "weights"), ("weights", "weights"), ("activations", "all"), ("all", "none")]
)
def test_nvfp4_module_quantizers_are_tes_per_slot(four_over_six: str, use_256: str) -> None:
    """Every slot of ``module.quantizers`` under NVFP4 (4over6 scopes, E4M3 256 scopes, row-scaled activations)
    is configured as TE's ``make_quantizers`` configures it."""
    recipe = NVFP4BlockScaling(
        nvfp4_4over6=four_over_six,
        nvfp4_4over6_e4m3_use_256=use_256,
        row_scaled_activation=True,
        disable_rht=True,
        disable_stochastic_rounding=True,
    )
    m = te.Linear(32, 32)
    with te.autocast(recipe=recipe):
        m(torch.randn(32, 32))
    q = m.quantizers
    roles = [("scaling_fwd", True, t) for t in ("input", "weight", "output")]
    roles += [("scaling_bwd", False, t) for t in ("grad_output", "grad_input")]
    for i, (key, fwd, t) in enumerate(roles):
        slot = q[key][i if fwd else i - 3]
        got = {k: getattr(slot, k) for k in _te_nvfp4_slot(recipe, fwd, t)}
        assert got == _te_nvfp4_slot(recipe, fwd, t), (key, t)


@pytest.mark.parametrize("recipe", [NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)])
def test_nvfp4_primary_weight_dgrad_under_a_device_accumulator_is_the_high_precision_weights(recipe) -> None:  # noqa: ANN001
    """TE ``quantized_model_init``: the weight's columnwise NVFP4 copy, stored (K, N), is the dgrad operand
    transposed; on a device accumulator (codes and block scales into the GEMM model) its bits are those of
    the same module quantizing its high-precision weights in the GEMM (TE's weight quantizer in both)."""
    torch.manual_seed(5)
    ref = te.Linear(64, 32, params_dtype=torch.bfloat16)
    torch.manual_seed(5)
    with te.quantized_model_init(recipe=recipe):
        fp8 = te.Linear(64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    grads = []
    for m in (fp8, ref):
        xr = x.clone().requires_grad_(True)
        with te.autocast(recipe=recipe, accumulator="blackwell"):
            y = m(xr)
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(y.dtype))
        grads.append(xr.grad)
    assert torch.equal(grads[0].view(torch.int16), grads[1].view(torch.int16))


@pytest.mark.parametrize("variant", ["e4m3x16", "ue5m3x16"])
def test_nvfp4_gradient_stochastic_rounding_is_seeded_and_applied(variant: str) -> None:
    """TE's NVFP4 grad quantizer rounds stochastically (``fp4_quant_bwd_grad``) with a Philox seed per call, so a
    step repeated on an identical module gives the same bits, and they differ from round-to-nearest."""

    def step(recipe: NVFP4BlockScaling) -> tuple:
        torch.manual_seed(11)
        lin = te.Linear(64, 32)
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(12), requires_grad=True)
        with te.autocast(recipe=recipe):
            lin(x).backward(torch.randn(32, 32, generator=torch.Generator().manual_seed(13)))
        return x.grad, lin.weight.grad

    kw = {"disable_rht": True, "fp8sim_nvfp4_variant": variant}
    first, again = step(NVFP4BlockScaling(**kw)), step(NVFP4BlockScaling(**kw))
    nearest = step(NVFP4BlockScaling(**kw, disable_stochastic_rounding=True))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], nearest[0]) and not torch.equal(first[1], nearest[1])


def test_nvfp4_hadamard_operand_of_a_float32_tensor_is_that_of_its_bf16_rounding() -> None:
    """TE's RHT kernel takes bf16 only (csrc/quantizer.cpp:2632, "RHT is only supported for bfloat16 input");
    fp8sim rounds a float32 wgrad operand to bf16 first, so it quantizes as TE's reference does the bf16 tensor
    (tests/_te_nvfp4_reference.py, from TE's nvfp4_tensor.py get_rht_matrix and reference_nvfp4.py)."""
    import numpy as np
    from _te_nvfp4_reference import apply_rht, quantize_1x16

    from fp8sim.pytorch.module._operands import quantize_operand

    torch.manual_seed(11)
    x = torch.randn(32, 64)
    assert not torch.equal(x, x.to(torch.bfloat16).float())
    op = quantize_operand(x, NVFP4BlockScaling(disable_stochastic_rounding=True), "input", 0)
    packed, scales, amax = quantize_1x16(apply_rht(x.to(torch.bfloat16).t().contiguous()))
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(64, 32)
    assert np.array_equal(op.qt.codes, codes.numpy()) and np.array_equal(op.qt.scales, scales.numpy())
    assert np.float32(op.qt.global_amax) == np.float32(amax.item())


def test_nvfp4_4over6_module_operands_read_the_fast_math_error_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE csrc/quantizer.cpp:2692-2696: ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1`` switches the 4over6 kernel to the
    f16 candidate error, for the modules' operands too; reference: TE's kernel as written in
    tests/test_pytorch_nvfp4_4over6.py (``_kernel``), whose data picks differently on the two error paths."""
    from test_pytorch_nvfp4_4over6 import _G, _SPLIT, _amax, _kernel, _x

    from fp8sim.pytorch.module._operands import quantize_operand

    x = _x((32, 64), seed=11, dtype=torch.float32).clamp(-1, 1)
    x[0, :16] = torch.tensor(_SPLIT["MAE"])
    x[1, 16] = _G
    recipe = NVFP4BlockScaling(
        nvfp4_4over6="all", disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True
    )
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    op = quantize_operand(x, recipe, "input", 1)
    codes, scales = _kernel(x.numpy(), _amax(x.numpy()), 256, "MAE", False, fast=True)
    assert (op.qt.codes == codes).all() and (op.qt.scales == scales).all()
    assert not (codes == _kernel(x.numpy(), _amax(x.numpy()), 256, "MAE", False)[0]).all()
