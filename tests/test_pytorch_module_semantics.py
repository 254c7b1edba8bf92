"""fp8sim.pytorch modules against references written from TE's code (issue 13, semantics points).

TE sources cited are NVIDIA/TransformerEngine at d0067d0 (2.20.0.dev0).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import torch.nn.functional as F  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

torch.set_num_threads(1)
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _q(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, fmax: float) -> torch.Tensor:
    """torch's own FP8 cast after TE's saturating clamp, decoded to float32."""
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype).float()


def _exact_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The GEMM under ``accumulator="exact"`` (the FP8 tests here run under it): the exact sum of the products of
    the (dequantized) FP8 values rounded once to float32 (``tests/_gemm_reference.py``, Python integers), not
    the ``torch.matmul`` that ``module/_gemm.py`` runs by default."""
    import _gemm_reference as gref

    return torch.from_numpy(gref.rn_f32(a, b))


def _cs_scale(t: torch.Tensor, fmax: float) -> torch.Tensor:
    """Current scaling's float32 scale ``fp8_max / amax``."""
    return torch.tensor(fmax) / t.detach().float().abs().max()


# -- point 1 -------------------------------------------------------------------------------------
def test_frozen_first_module_does_not_take_the_backward_update_role() -> None:
    """TE module/linear.py (_Linear.forward, ``if fwd_args.fp8 and (input/weight/bias requires_grad)``):
    only a module with something to differentiate asks ``is_first_fp8_module``; the frozen first
    Linear leaves the role to the second, whose backward scales update after backward."""
    torch.manual_seed(1)
    frozen, trainable = te.Linear(16, 16), te.Linear(16, 16)
    frozen.requires_grad_(False)
    x = torch.randn(16, 16)  # no grad: the first module is entirely frozen
    g = torch.randn(16, 16) * 4
    recipe = DelayedScaling(amax_history_len=1)
    with te.autocast(recipe=recipe):
        y = trainable(frozen(x))
    y.backward(g)
    bwd = trainable.fp8_gemms["gemm"].bwd
    # HYBRID: gradients E5M2 (max 57344); margin 0; history of one: scale = 57344 / amax(g)
    assert bwd.scale[0] == np.float32(57344.0) / np.float32(g.abs().max())


# -- point 2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_changes_the_dgrad_and_wgrad_operands(override: str) -> None:
    """TE module/linear.py _linear_backward: with ``backward_override`` the backward runs without
    FP8 (``bwd_args.fp8 = False``): dgrad ``dy @ W`` on the original weight ("high_precision") or on
    the dequantized FP8 weight ("dequantized"); wgrad on the original or the dequantized input."""
    torch.manual_seed(2)
    m = te.Linear(32, 16, bias=False)
    x = (torch.randn(16, 32) * 3).requires_grad_()
    g = torch.randn(16, 16)
    with te.autocast(recipe=Float8CurrentScaling(backward_override=override)):
        y = m(x)
    y.backward(g)
    w = m.weight.detach()
    if override == "high_precision":
        w_used, x_used = w, x.detach()
    else:
        sx, sw = _cs_scale(x, 448), _cs_scale(w, 448)
        x_used = _q(x.detach(), sx, E4M3, 448) * (1 / sx)
        w_used = _q(w, sw, E4M3, 448) * (1 / sw)
    assert torch.equal(x.grad, torch.matmul(g, w_used))
    assert torch.equal(m.weight.grad, torch.matmul(g.t(), x_used))


# -- point 4 -------------------------------------------------------------------------------------
def _ln32(x: torch.Tensor, m: torch.nn.Module) -> torch.Tensor:
    """TE's normalization kernels compute in float32 (tests/pytorch/test_numerics.py TorchLayerNorm)."""
    w, b = m.layer_norm_weight.detach().float(), m.layer_norm_bias.detach().float()
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, 1e-5)


def test_delayed_scaling_takes_the_norm_amax_on_float32_values() -> None:
    """spec 0 "fused producers"; TE layernorm_linear.py ``with_quantized_norm``: under delayed scaling
    the LayerNorm kernel writes FP8 straight from float32, so the staged amax is the float32 one."""
    torch.manual_seed(4)
    m = te.LayerNormLinear(32, 16, params_dtype=torch.bfloat16)
    with torch.no_grad():
        m.layer_norm_weight.copy_(torch.rand(32) + 0.5)
    x = torch.randn(16, 32).to(torch.bfloat16)
    with te.autocast(recipe=DelayedScaling()):
        m(x)
    ln = _ln32(x, m)
    assert ln.abs().max() != ln.to(torch.bfloat16).float().abs().max()  # the test can tell them apart
    assert m.fp8_gemms["gemm"].fwd.amax_history[-1, 0] == np.float32(ln.abs().max())  # rolled after exit


def test_current_scaling_rounds_the_norm_output_first() -> None:
    """Current scaling: the norm output is rounded to bf16, then quantized with its own amax."""
    torch.manual_seed(5)
    m = te.LayerNormLinear(32, 16, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(16, 32).to(torch.bfloat16)
    with te.autocast(recipe=Float8CurrentScaling(), accumulator="exact"):
        y = m(x)
    ln = _ln32(x, m).to(torch.bfloat16)
    w = m.weight.detach()
    sx, sw = _cs_scale(ln, 448), _cs_scale(w, 448)
    want = _exact_mm(_q(ln, sx, E4M3, 448), _q(w, sw, E4M3, 448).t()) * ((1 / sx) * (1 / sw))
    assert torch.equal(y, want.to(torch.bfloat16))


def test_delayed_scaling_takes_the_activation_amax_on_float32_values() -> None:
    """TE's activation kernels quantize their float32 result (layernorm_mlp.py, fused act+cast):
    fc2's staged input amax is that of the float32 activation of the bf16 fc1 output."""
    torch.manual_seed(6)
    m = te.LayerNormMLP(32, 32, bias=False, activation="swiglu", normalization="RMSNorm", params_dtype=torch.bfloat16)
    x = torch.randn(16, 32).to(torch.bfloat16)
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(), accumulator="exact"):  # no update: amax stays
        m(x)
    ln = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)  # gamma = 1
    s1 = torch.tensor(1.0)
    fc1 = _exact_mm(_q(ln, s1, E4M3, 448), _q(m.fc1_weight.detach(), s1, E4M3, 448).t()).to(torch.bfloat16)
    a, b = fc1.float().chunk(2, -1)
    act = F.silu(a) * b  # test_fusible_ops.py: swiglu = silu(x1) * x2
    assert act.abs().max() != act.to(torch.bfloat16).float().abs().max()
    assert m.fp8_gemms["fc2"].fwd.amax_history[0, 0] == np.float32(act.abs().max())


# -- point 5 -------------------------------------------------------------------------------------
def test_calibration_overwrites_the_staged_amax_and_nan_passes() -> None:
    """TE tensor/float8_tensor.py Float8Quantizer.calibrate: ``amax.copy_(torch.max(-amin, amax))``."""
    m = te.Linear(16, 16)
    recipe = DelayedScaling()
    x = torch.randn(16, 16)
    x[0, 0] = 4.0
    with te.autocast(enabled=False, calibrating=True, recipe=recipe):
        m(x)
        m(x / 2)  # overwrites: 2.0, not max(4, 2)
    assert m.fp8_gemms["gemm"].fwd.amax_history[0, 0] == 2.0
    x[1, 1] = float("nan")
    with te.autocast(enabled=False, calibrating=True, recipe=recipe):
        m(x)
    assert np.isnan(m.fp8_gemms["gemm"].fwd.amax_history[0, 0])


def test_enabled_and_calibrating_computes_in_fp8() -> None:
    """TE linear.py: ``fp8`` is ``enabled``; calibration only where ``not fp8``."""
    torch.manual_seed(7)
    m = te.Linear(16, 16)
    x = torch.randn(16, 16)
    with te.autocast(recipe=Float8CurrentScaling(), calibrating=True):
        y_cal = m(x)
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    assert torch.equal(y_cal, y) and not torch.equal(y, F.linear(x, m.weight, m.bias))


# -- point 6 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm])
def test_norms_compute_in_float32_and_zero_centered_gamma_adds_one_in_float32(cls: type) -> None:
    """Reference: TE tests/pytorch/test_numerics.py TorchLayerNorm / TorchRMSNorm (lines 365-413),
    with TE's kernel rule that ``gamma + 1`` is formed in float32.  RMSNorm as TE's kernel computes it
    (common/normalization/rmsnorm/rmsnorm_fwd_kernels.cuh:72, :102, :114-119): ``rn = 1/cols``,
    ``rs = rsqrtf(rn * sum(x^2) + eps)``, ``z = g * (rs * x)``, all float32."""
    torch.manual_seed(8)
    m = cls(32, zero_centered_gamma=True, params_dtype=torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(torch.rand(32) * 0.02)  # 1 + gamma is not a bf16 number
        if m.bias is not None:
            m.bias.copy_(torch.randn(32) * 0.1)
    x = torch.randn(8, 32).to(torch.bfloat16).requires_grad_()
    y = m(x)
    g = torch.randn(8, 32).to(torch.bfloat16)
    y.backward(g)
    xr = x.detach().float().requires_grad_()
    w = (m.weight.detach().float() + 1).requires_grad_()
    if cls is te.LayerNorm:
        b = m.bias.detach().float().requires_grad_()
        ref = F.layer_norm(xr, (32,), w, b, 1e-5)
    else:
        rs = torch.rsqrt((1 / 32) * (xr * xr).sum(-1, keepdim=True) + 1e-5)
        ref = w * (rs * xr)
    ref.backward(g.float())
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), ref.to(torch.bfloat16).float(), rtol=0, atol=2**-7)
    assert torch.equal(y, ref.to(torch.bfloat16))
    if cls is te.LayerNorm:  # dgamma/dbeta in float32, rounded once to the parameter dtype
        assert torch.equal(m.weight.grad, w.grad.to(torch.bfloat16)) and torch.equal(
            m.bias.grad, b.grad.to(torch.bfloat16)
        )
        assert torch.equal(x.grad, xr.grad.to(torch.bfloat16))
    else:  # dgamma = sum over rows of dz * (rs * x) in float32, rounded once
        assert torch.equal(m.weight.grad, w.grad.to(torch.bfloat16))
    gamma_bf16 = (m.weight.detach() + 1).float()  # the old bf16 addition gives a different gamma
    assert not torch.equal(gamma_bf16, w.detach())


@pytest.mark.parametrize("module", ["LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP"])
def test_zero_centered_gamma_initialises_gamma_to_zero_so_the_norm_starts_as_the_plain_one(module: str) -> None:
    """TE layernorm_linear.py 1455 / layernorm_mlp.py 2084 ``init_method_constant(float(not
    zero_centered_gamma))``, ops/basic/layer_norm.py 161-164 (LayerNorm; RMSNorm alike): with
    ``zero_centered_gamma=True`` the stored gamma starts at 0, so ``gamma + 1`` is 1 and the fresh module
    gives the plain module's output; without it gamma starts at 1."""
    make = {
        "LayerNorm": lambda **kw: te.LayerNorm(32, **kw),
        "RMSNorm": lambda **kw: te.RMSNorm(32, **kw),
        "LayerNormLinear": lambda **kw: te.LayerNormLinear(32, 16, **kw),
        "LayerNormMLP": lambda **kw: te.LayerNormMLP(32, 16, **kw),
    }[module]
    x = torch.randn(8, 32)
    outs = []
    for zc in (True, False):
        torch.manual_seed(3)
        m = make(zero_centered_gamma=zc)
        gamma = m.weight if module in ("LayerNorm", "RMSNorm") else m.layer_norm_weight
        assert torch.equal(gamma.detach(), torch.full((32,), 0.0 if zc else 1.0))
        outs.append(m(x))
    assert torch.equal(outs[0], outs[1])


# -- point 7 -------------------------------------------------------------------------------------
def test_fp8_gemm_with_float32_activations_adds_the_bias_in_bf16() -> None:
    """TE linear.py _linear_forward_impl: ``bias_dtype = activation_dtype``, but "cuBLAS does not
    support FP8 GEMM with FP32 bias, so we cast to BF16"; the epilogue adds it before one rounding."""
    torch.manual_seed(9)
    m = te.Linear(32, 16)
    with torch.no_grad():
        m.bias.copy_(torch.randn(16) / 3)
    x = torch.randn(16, 32)
    with te.autocast(recipe=Float8CurrentScaling(), accumulator="exact"):
        y = m(x)
    w = m.weight.detach()
    sx, sw = _cs_scale(x, 448), _cs_scale(w, 448)
    gemm = _exact_mm(_q(x, sx, E4M3, 448), _q(w, sw, E4M3, 448).t()) * ((1 / sx) * (1 / sw))
    assert torch.equal(y, gemm + m.bias.detach().to(torch.bfloat16).float())
    assert not torch.equal(y, gemm + m.bias.detach())


# -- point 11 ------------------------------------------------------------------------------------
def test_fp8_shape_check_is_tes_valueerror_with_tes_rules() -> None:
    """TE utils.py assert_dim_for_fp8_exec(inputmat, weight): prod(leading) % 8 and last % 16 for
    each tensor, so out_features needs only % 8."""
    m = te.Linear(16, 24)  # weight (24, 16): 24 % 8 == 0
    with te.autocast(recipe=Float8CurrentScaling()):
        assert m(torch.randn(8, 16)).shape == (8, 24)
    with te.autocast(recipe=Float8CurrentScaling()), pytest.raises(ValueError) as e:
        te.Linear(16, 20)(torch.randn(8, 16))
    assert "but got tensor with dims=[20, 16] (product of leading dims = 20, last dim = 16)" in str(e.value)


# -- point 12 ------------------------------------------------------------------------------------
def test_constructors_follow_tes_positional_order_defaults_and_empty_bias() -> None:
    """TE linear.py Linear.__init__: (in, out, sequence_parallel, fuse_wgrad_accumulation, tp_group,
    tp_size, get_rng_state_tracker, rng_tracker_name, init_method, bias, ...); weights from
    ``init_method_normal(0.023)`` (utils.get_default_init_method); ``bias=False`` leaves an empty tensor."""
    m = te.Linear(16, 32, False)  # the third positional argument is sequence_parallel
    assert m.sequence_parallel is False and m.use_bias and m.bias.shape == (32,)
    torch.manual_seed(10)
    m = te.Linear(16, 32, bias=False)
    torch.manual_seed(10)
    want = torch.empty(32, 16).normal_(mean=0.0, std=0.023)
    assert torch.equal(m.weight.detach(), want)
    assert isinstance(m.bias, torch.Tensor) and m.bias.numel() == 0 and "bias" not in dict(m.named_parameters())
    ln = te.LayerNorm(normalized_shape=32)
    assert ln.normalized_shape == (32,) and torch.equal(ln.weight.detach(), torch.ones(32))
    lnl = te.LayerNormLinear(16, 16, 1e-6, False)  # (in, out, eps, sequence_parallel)
    assert lnl.eps == 1e-6 and lnl.use_bias
    mlp = te.LayerNormMLP(16, 32, 1e-5, False, True)  # (hidden, ffn, eps, sequence_parallel, return_bias)
    assert mlp.return_bias and not mlp.apply_bias
    with pytest.raises(RuntimeError, match="Neither `normalized_shape` nor `hidden_size`"):
        te.RMSNorm()


# -- point 13 ------------------------------------------------------------------------------------
def test_nvfp4_hadamard_transform_runs_in_bf16_inside_modules() -> None:
    """TE csrc/quantizer.cpp NVFP4Quantizer::quantize_impl (line 2632: "RHT is only supported for bfloat16
    input"): the columnwise (wgrad) operand is ``x^T`` transformed by TE's bf16 RHT matrix in bf16, its
    amax taken after the transform, then cast to NVFP4; the reference (tests/_te_nvfp4_reference.py) is
    written from TE's nvfp4_tensor.py get_rht_matrix and custom_recipes/reference_nvfp4.py."""
    from _te_nvfp4_reference import apply_rht, quantize_1x16

    from fp8sim.pytorch.module._operands import quantize_operand

    torch.manual_seed(11)
    x = torch.randn(32, 64).to(torch.bfloat16)
    recipe = NVFP4BlockScaling(disable_stochastic_rounding=True)
    op = quantize_operand(x, recipe, "input", 0)
    packed, scales, amax = quantize_1x16(apply_rht(x.t().contiguous()))
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(64, 32)
    assert np.array_equal(op.qt.codes, codes.numpy()) and np.array_equal(op.qt.scales, scales.numpy())
    assert np.float32(op.qt.global_amax) == np.float32(amax.item())
    f32 = quantize_1x16(apply_rht(x.float().t().contiguous()))  # the same transform in float32 differs
    assert not (torch.equal(f32[0], packed) and torch.equal(f32[1], scales))


# -- activations ---------------------------------------------------------------------------------
def _te_reference(name: str, x: torch.Tensor) -> torch.Tensor:
    """TE tests/pytorch/test_fusible_ops.py (activation test, "Plain PyTorch implementation", lines
    2247-2278) and the clamped SwiGLU test (lines 2552-2556, limit 7, alpha 1.702, offset 1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return {
        "gelu": lambda: F.gelu(x, approximate="tanh"),
        "geglu": lambda: F.gelu(x1, approximate="tanh") * x2,
        "glu": lambda: torch.sigmoid(x1) * x2,
        "qgelu": lambda: x * torch.sigmoid(1.702 * x),
        "qgeglu": lambda: x1 * torch.sigmoid(1.702 * x1) * x2,
        "relu": lambda: F.relu(x),
        "reglu": lambda: F.relu(x1) * x2,
        "srelu": lambda: F.relu(x) ** 2,
        "sreglu": lambda: F.relu(x1) ** 2 * x2,
        "silu": lambda: F.silu(x),
        "swiglu": lambda: F.silu(x1) * x2,
        "clamped_swiglu": lambda: x1.clamp(max=7.0) * torch.sigmoid(1.702 * x1.clamp(max=7.0)) * (x2.clamp(-7, 7) + 1),
    }[name]()


ACTS = "gelu geglu glu qgelu qgeglu relu reglu srelu sreglu silu swiglu clamped_swiglu".split()


@pytest.mark.parametrize("activation", ACTS)
def test_layernorm_mlp_activations_follow_tes_formulas(activation: str) -> None:
    """High-precision LayerNormMLP = fc2(act(fc1(LN(x)))) with TE's activation formulas."""
    torch.manual_seed(12)
    m = te.LayerNormMLP(16, 16, activation=activation)
    gated = activation.endswith("glu")
    assert m.fc1_weight.shape == ((32 if gated else 16), 16)
    x = torch.randn(8, 16) * 4
    ln = F.layer_norm(x, (16,), m.layer_norm_weight, m.layer_norm_bias, 1e-5)
    h = _te_reference(activation, F.linear(ln, m.fc1_weight, m.fc1_bias))
    assert torch.equal(m(x), F.linear(h, m.fc2_weight, m.fc2_bias))


def test_clamped_swiglu_activation_params_follow_tes_formula() -> None:
    """``activation_params`` (``limit``, ``alpha``, ``glu_linear_offset``) reach TE's clamped SwiGLU
    (test_fusible_ops.py's clamped SwiGLU reference with these values); other values than the defaults change
    the output."""
    torch.manual_seed(12)
    params = {"limit": 2.0, "alpha": 1.0, "glu_linear_offset": 0.5}
    m = te.LayerNormMLP(16, 16, activation="clamped_swiglu", activation_params=params)
    x = torch.randn(8, 16) * 4
    ln = F.layer_norm(x, (16,), m.layer_norm_weight, m.layer_norm_bias, 1e-5)
    x1, x2 = F.linear(ln, m.fc1_weight, m.fc1_bias).chunk(2, dim=-1)
    g = x1.clamp(max=2.0)
    h = g * torch.sigmoid(1.0 * g) * (x2.clamp(-2.0, 2.0) + 0.5)
    y = m(x)
    assert torch.equal(y, F.linear(h, m.fc2_weight, m.fc2_bias))
    default = _te_reference("clamped_swiglu", torch.cat([x1, x2], dim=-1))  # limit 7, alpha 1.702, offset 1
    assert not torch.equal(y, F.linear(default, m.fc2_weight, m.fc2_bias))


def test_activation_params_keep_the_float32_activation_of_bf16_modules() -> None:
    """TE's activation kernels compute in float32 whatever the input dtype, also with ``activation_params``:
    the default parameters given explicitly give the bits of the call without them (fp8sim ran the
    parametrised clamped SwiGLU in bf16)."""
    x = (torch.randn(16, 32, generator=torch.Generator().manual_seed(3)) * 3).bfloat16()
    outs = []
    for params in (None, {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}):
        torch.manual_seed(0)
        m = te.LayerNormMLP(32, 32, activation="clamped_swiglu", activation_params=params, params_dtype=torch.bfloat16)
        outs.append(m(x))
    assert torch.equal(outs[0], outs[1])


def test_unknown_activation_and_normalization_name_the_choices() -> None:
    with pytest.raises(ValueError, match="activation must be one of gelu, geglu"):
        te.LayerNormMLP(16, 32, activation="swish")
    with pytest.raises(AssertionError, match="Unsupported normalization type!.*known: LayerNorm, RMSNorm"):
        te.LayerNormLinear(16, 16, normalization="BatchNorm")


@pytest.mark.parametrize("activation", ACTS)
def test_mxfp8_layernorm_mlp_rounds_fc1_output_and_activation_to_bf16_before_their_mx_casts(activation: str) -> None:
    """MXFP8 ``LayerNormMLP`` (bf16, RMSNorm), forward, written from TE's flow (``module/_norm_gemm.py``'s
    docstring; TE layernorm_mlp.py: only delayed scaling fuses the norm/activation into the cast): the norm
    output rounded to bf16, cast to MXFP8 (1x32 blocks, TE's E8M0 rule, :func:`_mx1d`); fc1 on the MXFP8
    operands (``accumulator="exact"``: the exact sum rounded once, ``tests/_gemm_reference.py``) rounded to
    bf16; the activation (TE's formula) in float32 on that, rounded to bf16, cast to MXFP8; fc2 likewise.  Bit for
    bit, for every activation."""
    import _gemm_reference as gref

    torch.manual_seed(13)
    m = te.LayerNormMLP(32, 32, bias=False, activation=activation, normalization="RMSNorm", params_dtype=torch.bfloat16)
    x = (torch.randn(32, 32) * 3).to(torch.bfloat16)
    with torch.no_grad(), te.autocast(recipe=MXFP8BlockScaling(), accumulator="exact"):
        y = m(x)
    xf = x.float()
    ln = (m.layer_norm_weight.float() * (torch.rsqrt((1 / 32) * (xf * xf).sum(-1, keepdim=True) + 1e-5) * xf)).to(
        torch.bfloat16
    )

    def gemm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(gref.rn_f32(_mx1d(a.float()), _mx1d(w.detach().float()).t()))

    h = gemm(ln, m.fc1_weight).to(torch.bfloat16)
    a = _te_reference(activation, h.float()).to(torch.bfloat16)
    want = gemm(a, m.fc2_weight).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    assert not torch.equal(h.float(), gemm(ln, m.fc1_weight))  # the fc1 rounding is not a no-op on this data


# -- points 8 and 9 (hooked into the modules) -------------------------------------------------------
def test_unfused_update_rolls_the_history_of_every_registered_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE quantization.py reduce_and_update_fp8_tensors updates every scaler in the global buffer;
    the unfused path's _update_amax_history (``torch.roll(h, -1, 0)``, then row 0 = 0) rolls a
    module that did not run; the fused kernel leaves it (amax 0)."""
    te.FP8GlobalStateManager.reset()
    monkeypatch.setenv("NVTE_UNFUSED_FP8_UPDATE", "1")
    m1, m2 = te.Linear(16, 16), te.Linear(16, 16)
    recipe = DelayedScaling(amax_history_len=3)
    x = torch.ones(16, 16)
    x[0, 0] = 2.0
    with te.autocast(recipe=recipe):
        m1(x)
        m2(x * 2)
    assert m2.fp8_gemms["gemm"].fwd.amax_history[:, 0].tolist() == [0.0, 0.0, 4.0]
    with te.autocast(recipe=recipe):
        m1(x)  # m2 does not run
    assert m2.fp8_gemms["gemm"].fwd.amax_history[:, 0].tolist() == [0.0, 4.0, 0.0]
    te.FP8GlobalStateManager.reset()


def test_changing_amax_history_len_keeps_the_scale_and_cuts_the_history() -> None:
    """TE base.py adjust_amax_history_length: ``amax_history[:length].clone()`` or zero rows padded at
    the end; the scale is kept."""
    m = te.Linear(16, 16)
    x = torch.randn(16, 16)
    for _ in range(3):
        with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
            m(x * (_ + 1))
    st = m.fp8_gemms["gemm"].fwd
    scale, hist = st.scale.copy(), st.amax_history.copy()
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(amax_history_len=2)):
        m(x)
    assert np.array_equal(st.scale, scale) and np.array_equal(st.amax_history[1:], hist[1:2])
    with torch.no_grad(), te.autocast(recipe=DelayedScaling(amax_history_len=5)):
        m(x)
    assert st.amax_history.shape == (5, 3) and not st.amax_history[2:].any() and np.array_equal(st.scale, scale)


# -- point 14 inside modules: 2D MXFP8 weights --------------------------------------------------------
def _float_to_e8m0(amax: torch.Tensor) -> torch.Tensor:
    """TE tests/pytorch/test_mxfp8_2d_quantize.py _float_to_e8m0 (same ceil policy as TE), with the
    kernel's ``amax * max_norm_rcp`` (common/cast/mxfp8/quantize_mxfp8.cuh lines 440-441)."""
    val = (amax.to(torch.float32) * torch.tensor(1.0 / 448.0, dtype=torch.float32)).contiguous()
    u = val.view(torch.int32)
    exponent = ((u >> 23) & 0xFF).to(torch.int32)
    mantissa = u & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    exponent = torch.where(val == 0, torch.zeros_like(exponent), exponent + round_up.to(torch.int32))
    return exponent.to(torch.uint8)


def test_mxfp8_2d_weight_quantization_uses_one_scale_per_32x32_tile() -> None:
    """TE quantization.py MXFP8BlockScalingRecipeState.make_quantizers: with enable_2d_quantization the
    linear weight quantizer is 2D; reference _mxfp8_2d_quantize_reference (test_mxfp8_2d_quantize.py)."""
    torch.manual_seed(14)
    m = te.Linear(64, 64, bias=False)
    with torch.no_grad():
        m.weight.mul_(torch.logspace(-3, 3, 64)[:, None])  # scales differ across rows of a tile
    x = torch.randn(32, 64)
    with te.autocast(recipe=MXFP8BlockScaling(enable_2d_quantization=True), accumulator="exact"):
        y = m(x)
    w = m.weight.detach()
    blocks = w.view(2, 32, 2, 32).permute(0, 2, 1, 3)
    sinv = torch.pow(2.0, _float_to_e8m0(blocks.abs().amax(dim=(-1, -2))).to(torch.float32) - 127)
    wq = (blocks / sinv[:, :, None, None]).to(torch.float8_e4m3fn).float() * sinv[:, :, None, None]
    wq = wq.permute(0, 2, 1, 3).reshape(64, 64)
    xq = _mx1d(x)
    assert torch.equal(y, _exact_mm(xq, wq.t()))
    with te.autocast(recipe=MXFP8BlockScaling(), accumulator="exact"):
        assert not torch.equal(m(x), y)  # 1D weights differ: the test can tell them apart


def _mx1d(x: torch.Tensor) -> torch.Tensor:
    """1x32 MXFP8 blocks along the last dim (the input's rowwise copy), same E8M0 rule."""
    b = x.reshape(x.shape[0], -1, 32)
    sinv = torch.pow(2.0, _float_to_e8m0(b.abs().amax(-1)).to(torch.float32) - 127)[..., None]
    return ((b / sinv).to(torch.float8_e4m3fn).float() * sinv).reshape(x.shape)


def test_nvte_backward_override_env_sets_the_recipe_default_and_the_module_honours_it() -> None:
    """TE common/recipe/__init__.py: ``backward_override = os.getenv("NVTE_BACKWARD_OVERRIDE", None)``
    (read when the recipe module is imported); the modules then run the high-precision backward."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, fp8sim.pytorch as te\n"
        "from fp8sim.recipe import Float8CurrentScaling\n"
        "r = Float8CurrentScaling(); assert r.backward_override == 'high_precision', r\n"
        "torch.manual_seed(0); m = te.Linear(16, 16, bias=False)\n"
        "x = torch.randn(16, 16, requires_grad=True); g = torch.randn(16, 16)\n"
        "with te.autocast(recipe=r):\n    y = m(x)\n"
        "y.backward(g); assert torch.equal(x.grad, g @ m.weight.detach()); print('ok')\n"
    )
    env = {**os.environ, "NVTE_BACKWARD_OVERRIDE": "high_precision", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_plain_linear_gemms_round_once_as_cublas(dtype: torch.dtype) -> None:
    """Without FP8, TE's Linear runs each GEMM as one cuBLAS call with CUBLAS_COMPUTE_32F for bf16/fp16
    operands (common/gemm/cublaslt_gemm.cu 445-449): exact products, float32 sums, the bias added in the
    epilogue, one rounding to the output dtype; so the plain backward equals backward_override=
    "high_precision" bit for bit (TE tests/pytorch/test_backward_override.py 1116-1136, rtol=0 atol=0).
    fp8sim ran torch's CPU low-precision matmul, which rounds differently (1 ulp in some elements)."""
    torch.manual_seed(11)
    plain = te.Linear(96, 80, params_dtype=dtype)
    hp = te.Linear(96, 80, params_dtype=dtype)
    hp.load_state_dict(plain.state_dict())
    x = torch.randn(48, 96, dtype=dtype) * 4
    dy = torch.randn(48, 80, dtype=dtype)
    xp, xh = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = plain(xp)
    y.backward(dy)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
        yh = hp(xh)
    yh.backward(dy)
    assert torch.equal(xp.grad, xh.grad) and torch.equal(plain.weight.grad, hp.weight.grad)
    assert torch.equal(plain.bias.grad, hp.bias.grad)
    w, b = plain.weight.detach(), plain.bias.detach()
    # the cuBLAS model: float32 sums of the upcast operands (products of bf16/fp16 values are exact)
    assert torch.equal(y, (x.float() @ w.float().t() + b.float()).to(dtype))
    assert torch.equal(xp.grad, (dy.float() @ w.float()).to(dtype))
    assert torch.equal(plain.weight.grad, (dy.float().t() @ x.float()).to(dtype))
