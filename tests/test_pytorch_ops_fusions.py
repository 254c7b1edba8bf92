"""``te.ops`` fusions and fused producers (TE 2.20.0.dev0 ``pytorch/ops/fused/*.py``, ``csrc/extensions``).

Each fusion TE applies changes where a value is rounded; each test builds data on which the fused and the
unfused roundings differ, checks fp8sim gives the fused bits (a reference written from TE's kernel, in
float64 / exact arithmetic) and that the unfused reference differs (the negative control).  High-precision
GEMMs are float32 matmuls of small multiples of 1/8, whose float32 sums are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
import fp8sim.pytorch.ops as te_ops  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

BF16 = torch.bfloat16


def _dyadic(*shape: int, seed: int, den: int = 8, lim: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-lim, lim + 1, shape, generator=g).double() / den).to(BF16)


def _ops_names(model: te_ops.Sequential, which: str) -> list[str]:
    return [type(op).__name__ for op, _ in getattr(model._module_groups[0], f"_{which}_ops")]


def _linear(n_in: int, n_out: int, seed: int) -> te_ops.BasicLinear:
    op = te_ops.BasicLinear(n_in, n_out, dtype=BF16)
    with torch.no_grad():
        op.weight.copy_(_dyadic(n_out, n_in, seed=seed))
    return op


def _exact_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of bf16 multiples of 1/8: exact in float64 (and in float32)."""
    return a.double() @ b.double()


def test_forward_linear_scale_add_accumulates_in_one_rounding_into_the_extra_input() -> None:
    """forward_linear_scale_add.py:78: ``extra += scale * (x W^T)`` as one GEMM (alpha, beta = 1), rounded
    once, written into the extra input's storage; unfused: round, scale, round, add, round."""
    linear = _linear(16, 8, seed=1)
    model = te_ops.Sequential(linear, te_ops.ConstantScale(0.3), te_ops.AddExtraInput(in_place=True))
    x, extra = _dyadic(4, 16, seed=2), _dyadic(4, 8, seed=3, den=1024)
    extra_in = extra.clone()
    y = model(x, extra_in)
    acc = _exact_gemm(x, linear.weight.detach().t())
    fused = (acc.float() * np.float32(0.3) + extra.float()).to(BF16)
    unfused = ((acc.to(BF16) * 0.3) + extra).to(BF16)
    assert _ops_names(model, "forward") == ["ForwardLinearScaleAdd"]
    assert not torch.equal(fused, unfused)
    assert torch.equal(y, fused) and y.data_ptr() == extra_in.data_ptr()


def test_forward_linear_bias_add_sums_gemm_bias_and_residual_in_float32() -> None:
    """forward_linear_bias_add.py:100: ``BasicLinear`` + ``Bias`` + in-place ``AddExtraInput`` as one GEMM with
    the bias in its epilogue and the residual accumulated (beta = 1), one rounding."""
    linear, bias = _linear(16, 8, seed=1), te_ops.Bias(8, dtype=BF16)
    with torch.no_grad():
        bias.bias.copy_(_dyadic(8, seed=4, den=256))
    model = te_ops.Sequential(linear, bias, te_ops.AddExtraInput(in_place=True))
    x, extra = _dyadic(4, 16, seed=2), _dyadic(4, 8, seed=3, den=1024)
    y = model(x, extra.clone())
    acc = _exact_gemm(x, linear.weight.detach().t())
    fused = (acc.float() + bias.bias.detach().float() + extra.float()).to(BF16)
    unfused = (acc.to(BF16) + bias.bias.detach()) + extra
    assert _ops_names(model, "forward") == ["ForwardLinearBiasAdd"]
    assert not torch.equal(fused, unfused) and torch.equal(y, fused)


@pytest.mark.parametrize(("dtype", "fused"), [(torch.bfloat16, True), (torch.float16, True), (torch.float32, False)])
def test_forward_linear_bias_fuses_only_for_half_precision_weights(dtype: torch.dtype, fused: bool) -> None:
    """forward_linear_bias_activation.py:181: cuBLAS's GEMM+bias epilogue only with fp16/bf16 output."""
    model = te_ops.Sequential(te_ops.BasicLinear(16, 8, dtype=dtype), te_ops.Bias(8, dtype=dtype))
    model(torch.randn(4, 16, dtype=dtype))
    names = _ops_names(model, "forward")
    assert names == (["ForwardLinearBiasActivation"] if fused else ["BasicLinear", "Bias"])


def test_backward_linear_add_accumulates_dgrad_into_the_extra_output_gradient() -> None:
    """backward_linear_add.py:74: in-place ``MakeExtraOutput`` + ``BasicLinear``: dgrad accumulated into the
    extra output's gradient (beta = 1), one rounding; unfused: dgrad rounded, then added in bf16."""
    linear = _linear(16, 8, seed=1)
    model = te_ops.Sequential(te_ops.MakeExtraOutput(in_place=True), linear)
    x = _dyadic(4, 16, seed=2).requires_grad_(True)
    y, residual = model(x)
    dy, dres = _dyadic(4, 8, seed=5), _dyadic(4, 16, seed=6, den=2048)
    torch.autograd.backward((y, residual), (dy, dres.clone()))
    acc = _exact_gemm(dy, linear.weight.detach())
    fused, unfused = (acc.float() + dres.float()).to(BF16), acc.to(BF16) + dres
    assert _ops_names(model, "backward") == ["BackwardLinearAdd"]
    assert not torch.equal(fused, unfused) and torch.equal(x.grad, fused)


def test_backward_linear_scale_applies_the_scale_as_gemm_alpha() -> None:
    """backward_linear_scale.py:84: dgrad and wgrad with ``alpha = scale`` on the float32 results; unfused:
    ``dy * scale`` rounded to bf16 before the GEMMs."""
    linear = _linear(16, 8, seed=1)
    model = te_ops.Sequential(linear, te_ops.ConstantScale(0.3))
    x = _dyadic(4, 16, seed=2).requires_grad_(True)
    dy = _dyadic(4, 8, seed=5)
    model(x).backward(dy)
    fused = (_exact_gemm(dy, linear.weight.detach()).float() * np.float32(0.3)).to(BF16)
    unfused = _exact_gemm((dy * 0.3), linear.weight.detach()).to(BF16)
    wfused = (_exact_gemm(dy.t(), x.detach()).float() * np.float32(0.3)).to(BF16)
    assert _ops_names(model, "backward") == ["BackwardLinearScale"]
    assert not torch.equal(fused, unfused)
    assert torch.equal(x.grad, fused) and torch.equal(linear.weight.grad, wfused)


def test_backward_add_rmsnorm_adds_the_extra_gradient_before_rounding() -> None:
    """backward_add_rmsnorm.py:78 (``tex.rmsnorm_bwd_add``): the extra output's gradient is added to the
    float32 dx; unfused: dx rounded, then ``MakeExtraOutput`` adds in bf16.  Rows of +-1 with eps = 0 make
    rsigma = 1 and every float32 step exact: ``dx = dy*g - y * mean(dy*g*y)`` (TE rmsnorm_bwd_kernels.cuh)."""
    norm = te_ops.RMSNorm(16, eps=0.0, dtype=BF16)
    model = te_ops.Sequential(te_ops.MakeExtraOutput(), norm)
    x = torch.where(_dyadic(4, 16, seed=7) >= 0, 1.0, -1.0).to(BF16).requires_grad_(True)
    y, residual = model(x)
    dy = _dyadic(4, 16, seed=8, den=64, lim=127)
    dres = _dyadic(4, 16, seed=9, den=4096)
    torch.autograd.backward((y, residual), (dy, dres))
    yd, dyd = x.detach().double(), dy.double()
    dx = dyd - yd * (dyd * yd).mean(-1, keepdim=True)
    fused, unfused = (dx + dres.double()).to(BF16), dx.to(BF16) + dres
    assert _ops_names(model, "backward") == ["BackwardAddRMSNorm"]
    assert not torch.equal(fused, unfused) and torch.equal(x.grad, fused)


def test_delayed_scaling_norm_output_is_cast_from_float32_without_rounding() -> None:
    """normalization.cpp:101 (``FULLY_FUSED`` for a ``Float8Quantizer``): the LayerNorm output goes from float32
    straight to FP8.  A row of +-1 with eps = 0 gives y = gamma + beta = 1.0625 + 2^-12 in float32: E4M3 (scale 1,
    the first step) rounds it up to 1.125, while bf16 first gives 1.0625, which E4M3 rounds to even (1.0)."""
    norm = te_ops.LayerNorm(32, eps=0.0, dtype=BF16)
    with torch.no_grad():
        norm.weight.fill_(1.0625)
        norm.bias.fill_(2.0**-12)
    model = te_ops.Sequential(norm, te_ops.Quantize())
    x = torch.where(torch.arange(32) % 2 == 0, 1.0, -1.0).repeat(32, 1).to(BF16)
    with te.autocast(recipe=DelayedScaling()):
        y = model(x)
    codes = y._data.view(torch.float8_e4m3fn).float()
    assert torch.equal(codes[0, ::2], torch.full((16,), 1.125))  # rounded twice it would be 1.0
    assert isinstance(y, te.Float8Tensor) and y.dtype == BF16


@pytest.mark.parametrize("recipe_name", ["current", "nvfp4", "nvfp4_rht"])
def test_activation_amax_is_taken_on_float32_values(recipe_name: str) -> None:
    """activation.cpp:38 (``FUSED_ACTIVATION_AMAX_FP8`` / ``_NVFP4``) and vectorized_pointwise.h:200: the kernel
    takes the amax of the float32 results, then the bf16 output is cast with it.  SReLU of 1 + 2^-7 is
    1 + 2^-6 + 2^-14 in float32, 1 + 2^-6 in bf16: the scale comes from the former.  An NVFP4 quantizer with
    RHT takes the ``UNFUSED`` path (activation.cpp:43): its amax is the bf16 output's."""
    import ml_dtypes

    x = torch.full((32, 32), 0.5, dtype=BF16)
    x[3, 5] = 1 + 2**-7
    amax32 = np.float32((1 + 2**-7) ** 2)
    amax16 = np.float32(torch.tensor(float(amax32)).to(BF16).item())
    recipe = {
        "current": Float8CurrentScaling(),
        "nvfp4": NVFP4BlockScaling(disable_rht=True),
        "nvfp4_rht": NVFP4BlockScaling(),
    }[recipe_name]
    with te.autocast(recipe=recipe):
        y = te_ops.Sequential(te_ops.SReLU(), te_ops.Quantize())(x)
    if recipe_name == "current":
        scale = np.float32(448) / amax32
        assert y._scale_inv.item() == np.float32(1) / scale != np.float32(1) / (np.float32(448) / amax16)
        ref = np.clip(x.float().square().to(BF16).float().numpy() * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        assert np.array_equal(y._data.view(torch.float8_e4m3fn).float().numpy(), ref.astype(np.float32))
    else:
        assert y._amax_rowwise.item() == (amax32 if recipe_name == "nvfp4" else amax16)


def test_mxfp8_activation_output_is_rounded_to_the_input_dtype_first() -> None:
    """quantize_mxfp8.cuh:242: the MXFP8 activation kernel truncates its float32 result to bf16 before the cast
    (delayed scaling's does not): the output equals ``MXFP8Quantizer`` of the bf16 activation."""
    x = _dyadic(32, 64, seed=11, den=1024, lim=4096)
    with te.autocast(recipe=MXFP8BlockScaling()):
        y = te_ops.Sequential(te_ops.SReLU(), te_ops.Quantize())(x)
    y32 = torch.relu(x.float()).square()
    ref = te.MXFP8Quantizer(te.DType.kFloat8E4M3)(y32.to(BF16))
    direct = te.MXFP8Quantizer(te.DType.kFloat8E4M3)(y32)
    assert not torch.equal(ref._rowwise_data, direct._rowwise_data)
    assert torch.equal(y._rowwise_data, ref._rowwise_data) and torch.equal(y._rowwise_scale_inv, ref._rowwise_scale_inv)
