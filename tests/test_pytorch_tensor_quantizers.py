"""A module's ``quantizers`` under NVFP4BlockScaling, as TE builds them.

Reference written from NVIDIA/TransformerEngine at d0067d0, ``pytorch/quantization.py``
``NVFP4BlockScalingRecipeState.make_quantizers`` (lines 1670-1750): per slot, the role's ``QParams``
(``fp4_quant_fwd_weight`` for weights, ``fp4_quant_bwd_grad`` for gradients, ``fp4_quant_fwd_inp``
otherwise) give ``with_rht = with_post_rht_amax = random_hadamard_transform``,
``with_2d_quantization = fp4_2d_quantization``, ``stochastic_rounding``; ``row_scaled_nvfp4`` only in
the forward pass for non-weights with ``row_scaled_activation``; 4over6 only for non-gradient slots in
the ``nvfp4_4over6`` scope, refusing RHT and stochastic rounding, with ``nvfp4_e4m3_max`` 256 in the
``nvfp4_4over6_e4m3_use_256`` scope.  The recipe's ``QParams`` are TE's ``common/recipe/__init__.py``
lines 595-609.  Slot roles: forward ``[input, weight, output]`` per GEMM, backward
``[grad_output, grad_input]`` (``RecipeState._slot_tensor_type`` positional fallback).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import NVFP4BlockScaling  # noqa: E402

torch.set_num_threads(1)


def _want(fwd: bool, role: str, *, rht: bool, sr: bool, two_d: bool, row_scaled: bool, scope: str) -> dict:
    """TE's NVFP4Quantizer arguments for one slot (module docstring), defaults ``disable_*=False``."""
    grad = not fwd
    weight = role == "weight"
    use_4over6 = (not grad) and (scope == "all" or (scope == "weights") == weight) and scope != "none"
    return {
        "with_rht": rht and not weight,
        "with_post_rht_amax": rht and not weight,
        "with_2d_quantization": two_d and weight,
        "stochastic_rounding": sr and grad,
        "row_scaled_nvfp4": fwd and not weight and row_scaled,
        "nvfp4_use_4over6": use_4over6,
    }


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"disable_rht": True, "row_scaled_activation": True},
        {"disable_stochastic_rounding": True, "disable_2d_quantization": True},
        {"disable_rht": True, "disable_stochastic_rounding": True, "nvfp4_4over6": "weights"},
    ],
    ids=["default", "row_scaled", "no_sr_no_2d", "4over6_weights"],
)
def test_nvfp4_module_quantizers_carry_tes_arguments_per_role(kw: dict) -> None:
    recipe = NVFP4BlockScaling(**kw)
    m = te.LayerNormMLP(32, 32)
    with te.autocast(recipe=recipe):  # a fresh module reports the active recipe's quantizers
        q = m.quantizers
    assert len(q["scaling_fwd"]) == 6 and len(q["scaling_bwd"]) == 4
    flags = dict(
        rht=not kw.get("disable_rht", False),
        sr=not kw.get("disable_stochastic_rounding", False),
        two_d=not kw.get("disable_2d_quantization", False),
        row_scaled=kw.get("row_scaled_activation", False),
        scope=kw.get("nvfp4_4over6", "none"),
    )
    for fwd, slots in ((True, q["scaling_fwd"]), (False, q["scaling_bwd"])):
        roles = ("input", "weight", "output") if fwd else ("grad_output", "grad_input")
        for i, quantizer in enumerate(slots):
            assert isinstance(quantizer, te.NVFP4Quantizer)
            want = _want(fwd, roles[i % len(roles)], **flags)
            got = {k: getattr(quantizer, k) for k in want}
            assert got == want, f"{'fwd' if fwd else 'bwd'} slot {i}: {got} != {want}"
            assert quantizer.rowwise_usage and quantizer.columnwise_usage
            e4m3_max = 256 if want["nvfp4_use_4over6"] else 448  # nvfp4_4over6_e4m3_use_256 defaults to "all"
            assert quantizer.nvfp4_e4m3_max == e4m3_max


def test_nvfp4_4over6_with_rht_is_refused_as_te_does() -> None:
    m = te.Linear(32, 32)
    recipe = NVFP4BlockScaling(nvfp4_4over6="activations", disable_stochastic_rounding=True)
    with te.autocast(recipe=recipe), pytest.raises(ValueError, match="NVFP4 4over6 quantization does not support RHT."):
        m.quantizers  # noqa: B018
    recipe = NVFP4BlockScaling(nvfp4_4over6="all", disable_rht=True)  # gradients never use 4over6: SR stays allowed
    with te.autocast(recipe=recipe):
        assert all(not q.nvfp4_use_4over6 and q.stochastic_rounding for q in m.quantizers["scaling_bwd"])


def test_output_and_grad_input_slots_follow_tes_dispatch() -> None:
    """TE ``quantization.py``: ``Float8BlockScalingRecipeState`` gives the forward ``output`` slot the input
    configuration (lines 1620-1625, ``x_block_scaling_dim``); ``Float8CurrentScalingRecipeState`` builds every
    slot with ``force_pow_2_scales=recipe.use_power_2_scales`` (lines 1487-1495), and ``linear.py``
    ``_customize_quantizers_float8_current_scaling`` (lines 2202-2228) then sets input, weight and grad_output
    from the class-level ``fp8_quant_*`` QParams, leaving output and grad_input as built."""
    from fp8sim.recipe import Float8BlockScaling, Float8CurrentScaling

    m = te.Linear(32, 32)
    with te.autocast(recipe=Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1)):
        fwd = m.quantizers["scaling_fwd"]
    assert [q.block_scaling_dim for q in fwd] == [2, 1, 2]
    recipe = Float8CurrentScaling(use_power_2_scales=True)
    with te.autocast(recipe=recipe):
        q = m.quantizers
    pow2 = recipe.fp8_quant_fwd_inp.power_2_scale  # a class attribute fixed at import, as in TE
    assert [x.force_pow_2_scales for x in q["scaling_fwd"]] == [pow2, pow2, True]
    assert [x.force_pow_2_scales for x in q["scaling_bwd"]] == [pow2, True]


def _ref_block_scale(amax: torch.Tensor, eps: float, pow2: bool) -> torch.Tensor:
    """TE ``common/recipe/recipe_common.cuh`` ``compute_scale_from_amax`` (lines 14-49), float32: an amax
    below ``epsilon`` becomes ``epsilon``; Inf/0/NaN give 1; ``448 / amax`` rounded once (Inf -> the input
    type's max); ``force_pow_2_scales`` keeps only sign and exponent bits."""
    eps32 = torch.tensor(eps, dtype=torch.float32)
    a = torch.where(amax < eps32, eps32, amax)
    special = torch.isinf(a) | (a == 0) | torch.isnan(a)
    scale = torch.tensor(448.0) / torch.where(special, torch.ones(()), a)
    scale = torch.where(torch.isinf(scale), torch.tensor(torch.finfo(torch.float32).max), scale)
    if pow2:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)  # 0xFF800000
    return torch.where(special, torch.ones(()), scale)


@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("dim", [1, 2])
def test_float8_block_quantizer_amax_epsilon_floors_each_block_amax(pow2: bool, dim: int) -> None:
    """TE ``quantize_transpose_{vector,square}_blockwise.cu``: each block's scale is
    ``compute_scale_from_types(amax, epsilon, pow_2_scaling)`` (vector lines 295/384, square 158/389)."""
    from fp8sim.pytorch.constants import DType

    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, 256, generator=g)
    x[:128, :128] *= 1e-6  # amax below epsilon: its scale comes from epsilon
    x[128:, 128:] = 0.0  # amax 0 < epsilon: epsilon too
    eps = 1e-3
    q = te.Float8BlockQuantizer(
        DType.kFloat8E4M3,
        rowwise=True,
        columnwise=False,
        amax_epsilon=eps,
        force_pow_2_scales=pow2,
        block_scaling_dim=dim,
    )
    t = q(x)
    if dim == 2:
        amax = x.abs().reshape(2, 128, 2, 128).amax(dim=(1, 3))
        scale = _ref_block_scale(amax, eps, pow2)
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        got_sinv = t._rowwise_scale_inv[:2, :2]
    else:
        amax = x.abs().reshape(256, 2, 128).amax(dim=-1)  # (rows, blocks)
        scale = _ref_block_scale(amax, eps, pow2)
        full = scale.repeat_interleave(128, 1)
        got_sinv = t._rowwise_scale_inv[:2, :256].t()  # TE stores 1x128 scales as [block, row]
    assert torch.equal(got_sinv, 1 / scale)
    want = (x * full).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(t._rowwise_data, want)
    assert q.copy().amax_epsilon == eps


def test_nvfp4_quantizer_rht_options_follow_tes_quantize_impl() -> None:
    """TE ``csrc/quantizer.cpp`` ``NVFP4Quantizer::quantize_impl`` (lines 2561-2650): ``with_post_rht_amax``
    matters only with RHT (without it the amax is the input's, for both copies); RHT with a pre-RHT amax,
    RHT of a non-bf16 input, 4over6 with RHT or stochastic rounding and row-scaled NVFP4 with RHT / 2D / SR /
    amax reduction are refused with TE's messages.  ``with_random_sign_mask=False`` (``nvfp4_tensor.py``
    ``get_rht_matrix``, sign mask 0): the columnwise copy is ``x^T`` times the unsigned ``H16/4`` in bf16."""
    from _te_nvfp4_reference import apply_rht, quantize_1x16

    x = (torch.randn(32, 64, generator=torch.Generator().manual_seed(12)) * 3).to(torch.bfloat16)
    plain, post = te.NVFP4Quantizer()(x), te.NVFP4Quantizer(with_post_rht_amax=True)(x)
    for name in ("_rowwise_data", "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise"):
        assert torch.equal(getattr(plain, name), getattr(post, name)), name
    for kw, message in (
        ({"with_rht": True}, "Pre-RHT amax is not supported yet. Use with_post_rht_amax=true instead."),
        ({"nvfp4_use_4over6": True, "with_rht": True}, "NVFP4 4over6 quantization does not support RHT."),
        ({"nvfp4_use_4over6": True, "stochastic_rounding": True}, "does not support stochastic rounding."),
        ({"row_scaled_nvfp4": True, "with_rht": True, "with_post_rht_amax": True}, "does not support RHT."),
        ({"row_scaled_nvfp4": True, "with_2d_quantization": True}, "does not support 2D quantization."),
        ({"row_scaled_nvfp4": True, "stochastic_rounding": True}, "does not support stochastic rounding."),
    ):
        with pytest.raises(RuntimeError, match=message.replace(".", r"\.")):
            te.NVFP4Quantizer(**kw)(x)
    with pytest.raises(RuntimeError, match="RHT is only supported for bfloat16 input, got dtype enum value 4"):
        te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)(x.float())
    t = te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, with_random_sign_mask=False)(x)
    packed, scales, amax = quantize_1x16(apply_rht(x.t().contiguous(), random_sign_mask=False))
    assert torch.equal(t._columnwise_data, packed) and torch.equal(t._columnwise_scale_inv[:64, :2], scales)
    assert torch.equal(t._amax_columnwise, amax.reshape(1))
    signed = te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)(x)
    assert not torch.equal(signed._columnwise_data, t._columnwise_data)
    want_signed = quantize_1x16(apply_rht(x.t().contiguous()))[0]
    assert torch.equal(signed._columnwise_data, want_signed)
