"""TE's recipe-state classes, alignment and padding helpers (issue 27), against TE's source at d0067d0:
``pytorch/quantization.py`` (``_default_sf_compute`` 1092-1116, ``RecipeState`` 1179-1394, the subclasses
1397-1751, ``CustomRecipeState`` 1853-1996, ``get_align_size_for_quantization`` 262-278),
``module/fp8_padding.py`` / ``fp8_unpadding.py`` and ``common/util/padding.cu`` (zero padding rows)."""

from __future__ import annotations

import warnings

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402
from fp8sim.pytorch import quantization as q  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import DelayedScalingRequest, IdentityQuantizer, QuantizerRole  # noqa: E402


def _role(tensor_type: str, module_type: str = "linear") -> QuantizerRole:
    return QuantizerRole(module_type=module_type, tensor_type=tensor_type, name="t")


def test_default_sf_compute_follows_tes_four_cases() -> None:
    """amax 0, NaN or Inf keep the old scale; a tiny amax gives FLT_MAX; else (fp8_max / amax) / 2^margin,
    where torch's ``float / tensor`` is fl32(fl32(1 / amax) * fp8_max) (spec 4.6: eager and torch.compile
    agree), written out here in numpy float32."""
    import numpy as np

    amax = torch.tensor([0.0, float("nan"), float("inf"), 1e-45, 3.0, 1000.0])
    scale = torch.full((6,), 7.0)
    out = q._default_sf_compute(amax, scale, 448.0, 1)
    assert out is scale

    def ref(a: float) -> float:
        return float((np.float32(1) / np.float32(a)) * np.float32(448) / np.float32(2))

    want = [7.0, 7.0, 7.0, float(np.finfo(np.float32).max), ref(3.0), ref(1000.0)]
    assert out.tolist() == want
    assert ref(3.0) != float(np.float32(448 / 3) / 2)  # the reciprocal route differs from one division here


def test_create_picks_the_state_class_of_the_recipe() -> None:
    cases = [
        (recipe.DelayedScaling(), "DelayedScalingRecipeState"),
        (recipe.Float8CurrentScaling(), "Float8CurrentScalingRecipeState"),
        (recipe.MXFP8BlockScaling(), "MXFP8BlockScalingRecipeState"),
        (recipe.Float8BlockScaling(), "Float8BlockScalingRecipeState"),
        (recipe.NVFP4BlockScaling(), "NVFP4BlockScalingRecipeState"),
        (recipe.CustomRecipe(qfactory=lambda role: IdentityQuantizer()), "CustomRecipeState"),
    ]
    for r, name in cases:
        state = q.RecipeState.create(r, mode="forward", num_quantizers=3)
        assert type(state).__name__ == name and isinstance(state, q.RecipeState)
    with pytest.raises(ValueError, match=r"RecipeState requires roles to match num_quantizers"):
        q.Float8CurrentScalingRecipeState(recipe.Float8CurrentScaling(), mode="forward", num_quantizers=3, roles=[])


def test_delayed_scaling_state_quantizers_view_its_buffers() -> None:
    """quantization.py 1436-1451: scale ones, history zeros; quantizer i reads scale[i] and writes
    amax_history[0][i]; HYBRID backward slots are E5M2."""
    r = recipe.DelayedScaling(amax_history_len=4)
    fwd = q.DelayedScalingRecipeState(r, mode="forward", num_quantizers=3)
    assert fwd.scale.tolist() == [1.0] * 3 and fwd.amax_history.shape == (4, 3)
    qs = fwd.make_quantizers()
    fwd.scale[1] = 2.0
    qs[1](torch.tensor([[-5.0, 3.0]]))
    assert fwd.amax_history[0].tolist() == [0.0, 5.0, 0.0] and qs[1].scale.item() == 2.0
    bwd = q.DelayedScalingRecipeState(r, mode="backward", num_quantizers=2)
    assert {x.dtype for x in bwd.make_quantizers()} == {DType.kFloat8E5M2}
    other = q.DelayedScalingRecipeState(r, mode="forward", num_quantizers=3)
    assert other.inherit_state_from(fwd) and other.scale is fwd.scale
    assert not other.inherit_state_from(bwd)  # shapes differ


def test_block_and_nvfp4_states_dispatch_on_roles_then_positions() -> None:
    """1261-1292: a known tensor_type wins; an empty / unknown one or a None slot falls back to
    [input, weight, output] / [grad_output, grad_input] by position."""
    fb = recipe.Float8BlockScaling()
    roles = [QuantizerRole(), QuantizerRole(module_type="dpa", tensor_type="qkv"), None, _role("weight")]
    dims = [
        x.block_scaling_dim
        for x in q.Float8BlockScalingRecipeState(fb, mode="forward", num_quantizers=4, roles=roles).make_quantizers()
    ]
    assert dims == [fb.x_block_scaling_dim, fb.w_block_scaling_dim, fb.x_block_scaling_dim, fb.w_block_scaling_dim]
    bwd = q.Float8BlockScalingRecipeState(fb, mode="backward", num_quantizers=2).make_quantizers()
    assert [x.block_scaling_dim for x in bwd] == [fb.grad_block_scaling_dim] * 2
    nv = recipe.NVFP4BlockScaling()
    fwd = q.NVFP4BlockScalingRecipeState(nv, mode="forward", num_quantizers=3).make_quantizers()
    assert [x.with_rht for x in fwd] == [True, False, True]  # weights: no RHT, 2D tiles
    assert [x.with_2d_quantization for x in fwd] == [False, True, False]
    grads = q.NVFP4BlockScalingRecipeState(nv, mode="backward", num_quantizers=2).make_quantizers()
    assert all(x.stochastic_rounding for x in grads)


def test_mxfp8_state_2d_only_for_linear_weight_roles() -> None:
    """1529-1549: with enable_2d_quantization, 2D blocks for forward slots whose role is a linear /
    grouped_linear weight; not by position (no roles: none are 2D)."""
    r = recipe.MXFP8BlockScaling(enable_2d_quantization=True)
    roles = [_role("input"), _role("weight"), _role("weight", "grouped_linear"), _role("weight", "dpa")]
    got = [
        x.with_2d_quantization
        for x in q.MXFP8BlockScalingRecipeState(r, mode="forward", num_quantizers=4, roles=roles).make_quantizers()
    ]
    assert got == [False, True, True, False]
    assert not any(
        x.with_2d_quantization
        for x in q.MXFP8BlockScalingRecipeState(r, mode="forward", num_quantizers=3).make_quantizers()
    )


def test_current_scaling_state_uses_the_recipe_wide_pow2_setting() -> None:
    r = recipe.Float8CurrentScaling(use_power_2_scales=True)
    qs = q.Float8CurrentScalingRecipeState(r, mode="backward", num_quantizers=2).make_quantizers()
    assert all(x.force_pow_2_scales and x.dtype == DType.kFloat8E5M2 for x in qs)


def test_custom_recipe_state_passes_roles_and_shares_delayed_scaling() -> None:
    """1910-1950: qfactory(roles[i]) as given (a None slot is None); DelayedScalingRequest slots share one
    inner delayed-scaling state, kept by inherit_state_from; no roles: bare QuantizerRole() with TE's warning."""
    seen = []

    def factory(role):  # noqa: ANN001, ANN202
        seen.append(role)
        return DelayedScalingRequest(amax_history_len=8) if role is not None else IdentityQuantizer()

    r = recipe.CustomRecipe(qfactory=factory)
    state = q.CustomRecipeState(r, mode="forward", num_quantizers=3, roles=[_role("input"), _role("weight"), None])
    qs = state.make_quantizers()
    assert seen[2] is None and type(qs[2]).__name__ == "IdentityQuantizer"
    assert state._has_delayed_scaling and state.amax_history.shape == (8, 2)
    qs[0](torch.tensor([[2.0, -9.0]]))
    assert state.amax_history[0].tolist() == [9.0, 0.0]
    again = q.CustomRecipeState(r, mode="forward", num_quantizers=3, roles=[_role("input"), _role("weight"), None])
    assert again.inherit_state_from(state)
    again.make_quantizers()
    assert again.amax_history is state.amax_history
    with pytest.warns(UserWarning, match="no QuantizerRole list provided"):
        q.CustomRecipeState(r, mode="forward", num_quantizers=1).make_quantizers()
    assert seen[-1] == QuantizerRole()


def test_align_size_per_recipe() -> None:
    assert q.get_align_size_for_quantization(recipe.MXFP8BlockScaling()) == 32
    assert q.get_align_size_for_quantization(recipe.NVFP4BlockScaling()) == 128
    for r in (recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.Float8BlockScaling()):
        assert q.get_align_size_for_quantization(r) == 16
    custom = recipe.CustomRecipe(qfactory=lambda role: IdentityQuantizer(), quantization_alignment=64)
    assert q.get_align_size_for_quantization(custom) == 64


def test_fp8_padding_pads_each_split_with_zero_rows_and_unpadding_inverts_it() -> None:
    torch.manual_seed(0)
    x = torch.randn(3 + 20 + 0, 8, requires_grad=True)
    pad = te.Fp8Padding(3, align_size=16)
    y, splits = pad(x, [3, 20, 0])
    assert splits == [16, 32, 0] and y.shape == (48, 8)
    want = torch.zeros(48, 8)
    want[0:3], want[16:36] = x.detach()[0:3], x.detach()[3:23]
    assert torch.equal(y, want)
    g = torch.randn(48, 8)
    y.backward(g)
    assert torch.equal(x.grad, torch.cat([g[0:3], g[16:36]]))
    unpad = te.Fp8Unpadding(3, align_size=16)
    z = unpad(y.detach().requires_grad_(), [3, 20, 0])
    assert torch.equal(z, x.detach())
    same, kept = pad(x, [16, 0, 7])[0], None
    assert kept is None and same.shape == (32, 8)
    assert pad(x[:32].detach(), [16, 16, 0])[0].data_ptr() == x[:32].data_ptr()  # aligned: no copy


def test_fp8_padding_takes_the_alignment_of_the_active_recipe() -> None:
    pad = te.Fp8Padding(1)
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        _, splits = pad(torch.randn(5, 32), [5])
    assert pad.align_size == 32 and splits == [32]


def test_grouped_linear_single_param_flags_are_gated_as_te() -> None:
    """utils.py 189-218: without NVTE_GROUPED_LINEAR_SINGLE_PARAM the flags fall back to False with TE's
    warning; with it, fp8sim refuses (TE's GroupedTensor parameters and grouped GEMM are not emulated), and
    is_module_grouped_tensor_path_supported answers False, so TE code takes the per-split path."""
    with pytest.warns(UserWarning, match="NVTE_GROUPED_LINEAR_SINGLE_PARAM environment variable is not set"):
        m = te.GroupedLinear(2, 32, 16, single_grouped_weight=True, single_grouped_bias=True, use_grouped_tensor=True)
    assert m.single_grouped_weight is False and hasattr(m, "weight0")
    with pytest.raises(TypeError, match="use_grouped_tensor must be a bool or None"):
        te.GroupedLinear(2, 32, 16, use_grouped_tensor="yes")
    mp = pytest.MonkeyPatch()
    mp.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(NotImplementedError, match="single grouped parameters"):
                te.GroupedLinear(2, 32, 16, single_grouped_weight=True)
    finally:
        mp.undo()
    from fp8sim.pytorch.module import is_module_grouped_tensor_path_supported

    assert is_module_grouped_tensor_path_supported(recipe.MXFP8BlockScaling(), torch.bfloat16) is False
    # TE's explicit packing (grouped_linear.py make_grouped_weights): refused with the same message, not an
    # AttributeError; defer_init=True returns at once as in TE
    m.make_grouped_weights(defer_init=True)
    with pytest.raises(NotImplementedError, match="single grouped parameters"):
        m.make_grouped_weights()


def test_module_fp8_meta_under_custom_recipe_shows_the_delayed_scaling_slots_state() -> None:
    """TE's test_custom_recipe_ds_multi_step reads ``module.fp8_meta["scaling_fwd"].amax_history``: under a
    CustomRecipe it is the CustomRecipeState whose amax_history is its DelayedScalingRequest slots' shared
    state (quantization.py CustomRecipeState).  After one step the amaxes of x and W sit in the last row,
    rolled there by _update_amax_history (quantization.py 1077-1088: roll by -1, row 0 zeroed)."""
    from fp8sim.recipe import CustomRecipe, Format

    torch.manual_seed(0)
    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    rec = CustomRecipe(qfactory=lambda role: DelayedScalingRequest(fp8_format=Format.HYBRID))
    x = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=True, recipe=rec):
        y = m(x)
    y.float().sum().backward()
    meta = m.fp8_meta
    assert meta["recipe"] is rec
    hist = meta["scaling_fwd"].amax_history
    assert torch.all(hist[0] == 0)
    assert hist[-1, 0].item() == x.abs().max().item() and hist[-1, 1].item() == m.weight.abs().max().item()
    assert meta["scaling_bwd"].amax_history[-1, 0].item() == 1.0  # dy = ones
