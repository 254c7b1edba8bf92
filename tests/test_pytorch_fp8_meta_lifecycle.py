"""TE's ``fp8_meta`` recipe-state lifecycle of the modules (issue 27), against TE's source at d0067d0:
``module/base.py`` (``fp8_meta_tensors_initialized`` 905, ``output_quantizer_role`` /
``grad_input_quantizer_role`` setters 984-1006, ``set_meta_tensor`` 1106-1175 with ``inherit_state_from``,
``init_fp8_meta_tensors`` 1311-1316, ``init_fp8_metadata`` 1545) and ``quantization.py``
(``RecipeState.inherit_state_from``, ``CustomRecipeState._ds_state``)."""

from __future__ import annotations

import copy

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402
from fp8sim.pytorch.quantization import CustomRecipeState, DelayedScalingRecipeState  # noqa: E402
from fp8sim.pytorch.tensor import DelayedScalingRequest, QuantizerRole  # noqa: E402

_DPA_QKV = QuantizerRole(module_type="dpa", tensor_type="qkv", name="core")


def _step(m: torch.nn.Module, rec: recipe.Recipe) -> None:
    x = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=True, recipe=rec):
        m(x).float().sum().backward()


def test_role_setter_clears_initialized_only_on_a_different_role() -> None:
    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    assert m.fp8_meta_tensors_initialized is False and m.output_quantizer_role is None
    m.output_quantizer_role = _DPA_QKV  # before any state: nothing to invalidate
    assert m.fp8_meta_tensors_initialized is False
    _step(m, recipe.DelayedScaling(amax_history_len=4))
    assert m.fp8_meta_tensors_initialized is True
    m.output_quantizer_role = QuantizerRole(module_type="dpa", tensor_type="qkv", name="core")  # equal: kept
    assert m.fp8_meta_tensors_initialized is True
    m.grad_input_quantizer_role = _DPA_QKV
    assert m.fp8_meta_tensors_initialized is False and m.grad_input_quantizer_role == _DPA_QKV


def test_rebuild_after_a_role_change_keeps_the_delayed_scaling_tensors() -> None:
    """TE: the rebuilt state is a new object whose ``scale`` / ``amax_history`` are the old tensor objects,
    so written values survive and the module's GEMM keeps casting with them."""
    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    rec = recipe.DelayedScaling(amax_history_len=4)
    _step(m, rec)
    before = m.fp8_meta["scaling_fwd"]
    assert isinstance(before, DelayedScalingRecipeState) and m.fp8_meta["scaling_fwd"] is before
    before.scale.fill_(2.0)
    before.amax_history.fill_(3.0)
    m.output_quantizer_role = _DPA_QKV
    m.init_fp8_meta_tensors(rec)
    after = m.fp8_meta["scaling_fwd"]
    assert after is not before and m.fp8_meta_tensors_initialized
    assert after.scale is before.scale and after.amax_history is before.amax_history
    assert float(m.fp8_gemms["gemm"].fwd.scale[0]) == 2.0  # the tensors are the GEMM's own state
    m.init_fp8_meta_tensors(rec)  # initialized and of the recipe's kind: kept
    assert m.fp8_meta["scaling_fwd"] is after


def test_fp8_meta_state_follows_the_scaler_after_deepcopy() -> None:
    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    _step(m, recipe.DelayedScaling(amax_history_len=4))
    m.fp8_meta["scaling_fwd"]  # cached view
    c = copy.deepcopy(m)
    c.fp8_meta["scaling_fwd"].scale.fill_(5.0)
    assert float(c.fp8_gemms["gemm"].fwd.scale[1]) == 5.0 and float(m.fp8_gemms["gemm"].fwd.scale[1]) != 5.0


def test_output_quantizer_role_reaches_the_qfactory() -> None:
    seen: list = []

    def qfactory(role):  # noqa: ANN001, ANN202
        seen.append(role)
        return te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)

    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    m.output_quantizer_role = _DPA_QKV
    rec = recipe.CustomRecipe(qfactory=qfactory)
    with te.autocast(enabled=True, recipe=rec):
        m(torch.randn(8, 32, dtype=torch.bfloat16))
    assert seen[2] == _DPA_QKV  # forward slot 2: the GEMM's output
    seen.clear()
    m.output_quantizer_role = None
    m.init_fp8_meta_tensors(rec)  # invalidated: the factory is asked again, with the new role
    assert len(seen) == 5 and seen[2] is None


def test_custom_state_is_in_fp8_meta_and_its_delayed_scaling_state_survives_a_rebuild() -> None:
    m = te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    plain = recipe.CustomRecipe(qfactory=lambda role: te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3))
    _step(m, plain)
    state = m.fp8_meta["scaling_fwd"]
    assert isinstance(state, CustomRecipeState) and not state._has_delayed_scaling and state.recipe is plain
    assert len(m.quantizers["scaling_fwd"]) == 3

    rec = recipe.CustomRecipe(qfactory=lambda role: DelayedScalingRequest(amax_history_len=8))
    _step(m, rec)
    before = m.fp8_meta["scaling_fwd"]
    inner = before._ds_state
    inner.amax_history.fill_(7.0)
    m.output_quantizer_role = _DPA_QKV
    m.init_fp8_meta_tensors(rec)
    after = m.fp8_meta["scaling_fwd"]
    assert after is not before and after._ds_state is inner and bool(after.amax_history.eq(7.0).all())


# -- DotProductAttention: 9 forward (QKV, O, S) and 6 backward (dQKV, dO, dP) slots ----------------------------
# TE dot_product_attention.py set_meta_tensor / get_quantizer_roles; the [CS, DS] split of current scaling.


def _dpa_step(dpa: torch.nn.Module, rec: recipe.Recipe) -> None:
    q, k, v = (torch.randn(1, 16, 2, 16, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with te.autocast(enabled=True, recipe=rec):
        out = dpa(q, k, v, qkv_format="bshd")
    out.float().sum().backward()


def test_dpa_custom_recipe_state_and_slot_quantizers() -> None:
    from fp8sim.pytorch.tensor import Float8Quantizer

    def factory(role):  # noqa: ANN001, ANN202
        if role.module_type == "dpa" and role.tensor_type in ("s", "dp"):
            return DelayedScalingRequest(amax_history_len=1, amax_compute_algo="most_recent")
        return te.Float8CurrentScalingQuantizer(
            te.DType.kFloat8E5M2 if role.tensor_type == "do" or "grad" in role.name else te.DType.kFloat8E4M3
        )

    dpa = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal", name="core")
    assert dpa.quantizers == {"scaling_fwd": [], "scaling_bwd": []} and "scaling_fwd" not in dpa.fp8_meta
    rec = recipe.CustomRecipe(qfactory=factory, fp8_dpa=True)
    _dpa_step(dpa, rec)
    state = dpa.fp8_meta["scaling_fwd"]
    assert isinstance(state, CustomRecipeState) and state._has_delayed_scaling and state._ds_slots == [6, 7, 8]
    fwd, bwd = dpa.quantizers["scaling_fwd"], dpa.quantizers["scaling_bwd"]
    assert [type(x).__name__ for x in fwd] == ["Float8CurrentScalingQuantizer"] * 6 + ["Float8Quantizer"] * 3
    assert len(bwd) == 6 and all(isinstance(x, Float8Quantizer) for x in bwd[4:])
    inner = state._ds_state
    dpa.output_quantizer_role = QuantizerRole(module_type="linear", tensor_type="input", name="proj")
    assert not dpa.fp8_meta_tensors_initialized
    dpa.init_fp8_meta_tensors(rec)
    assert dpa.fp8_meta["scaling_fwd"] is not state and dpa.fp8_meta["scaling_fwd"]._ds_state is inner


def test_dpa_delayed_and_current_scaling_fp8_meta() -> None:
    from fp8sim.pytorch.tensor import Float8CurrentScalingQuantizer, Float8Quantizer

    dpa = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    _dpa_step(dpa, recipe.DelayedScaling(fp8_dpa=True, amax_history_len=4))
    st = dpa.fp8_meta["scaling_fwd"]
    assert isinstance(st, DelayedScalingRecipeState) and dpa.fp8_meta["scaling_fwd"] is st
    assert tuple(st.scale.shape) == (9,) and tuple(dpa.fp8_meta["scaling_bwd"].amax_history.shape) == (4, 6)
    st.scale[8] = 4.0  # the S slot: the module's own state
    assert float(dpa.fwd.scale[8]) == 4.0 and float(dpa.quantizers["scaling_fwd"][8].scale) == 4.0

    cs = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    _dpa_step(cs, recipe.Float8CurrentScaling(fp8_dpa=True))
    fwd, bwd = cs.quantizers["scaling_fwd"], cs.quantizers["scaling_bwd"]
    assert all(isinstance(x, Float8CurrentScalingQuantizer) for x in fwd[:6] + bwd[:4])
    assert all(type(x) is Float8Quantizer for x in fwd[6:] + bwd[4:])  # S and dP: TE's delayed half
    assert isinstance(cs.fp8_meta["scaling_fwd"], DelayedScalingRecipeState)


def test_dpa_current_scaling_fp8_meta_is_tes_delayed_half() -> None:
    """TE ``dot_product_attention.py`` ``set_meta_tensor`` (1218-1290): under current scaling ``recipe = [CS, DS]``,
    ``num_gemms = [2, 1]``, so ``fp8_meta`` holds the DS state of 3 forward / 2 backward slots (S; dP) and
    ``quantizers`` are the CS state's 6 / 4 followed by the DS state's 3 / 2; ``fp8_meta["recipe"]`` is the DS
    recipe (``init_fp8_metadata``: ``fp8_recipe_dpa = fake_recipes[1]``)."""
    from fp8sim.pytorch.tensor import Float8CurrentScalingQuantizer, Float8Quantizer

    cs = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    _dpa_step(cs, recipe.Float8CurrentScaling(fp8_dpa=True))
    fwd, bwd = cs.fp8_meta["scaling_fwd"], cs.fp8_meta["scaling_bwd"]
    assert (fwd.num_quantizers, bwd.num_quantizers) == (3, 2)
    assert tuple(fwd.scale.shape) == (3,) and tuple(fwd.amax_history.shape) == (1, 3)
    assert tuple(bwd.scale.shape) == (2,) and tuple(bwd.amax_history.shape) == (1, 2)
    assert isinstance(cs.fp8_meta["recipe"], recipe.DelayedScaling)
    qf, qb = cs.quantizers["scaling_fwd"], cs.quantizers["scaling_bwd"]
    assert [type(q) for q in qf] == [Float8CurrentScalingQuantizer] * 6 + [Float8Quantizer] * 3
    assert [type(q) for q in qb] == [Float8CurrentScalingQuantizer] * 4 + [Float8Quantizer] * 2
    assert float(fwd.scale[2]) != 1.0 and float(bwd.scale[1]) != 1.0  # S (META_S) and dP: updated from their amax
    assert float(fwd.scale[0]) == 1.0 == float(bwd.scale[0])  # unused slots of the S / dP groups
    fwd.scale[2] = 4.0  # TE's DS slot 2 is META_S = 8 of the 9 quantizers: the state S is cast with
    assert float(cs.quantizers["scaling_fwd"][8].scale) == 4.0 and float(cs.fwd.scale[8]) == 4.0


def test_fp8_meta_names_the_recompute_stash_of_a_checkpointed_fp8_forward() -> None:
    """TE ``quantization.py`` ``copy_forward_fp8_meta_tensors_for_recompute``: the module's ``fp8_meta`` gets
    ``global_fp8_buffer_pos_fwd_recompute``; a module outside FP8 in the same checkpoint gets none."""
    te.FP8GlobalStateManager.reset()
    plain = te.Linear(16, 16, bias=False)
    fp8 = te.Linear(16, 16, bias=False)

    def body(x: torch.Tensor) -> torch.Tensor:
        y = plain(x)
        with te.autocast(enabled=True, recipe=recipe.DelayedScaling()):
            return fp8(y)

    x = torch.randn(16, 16, requires_grad=True)
    te.checkpoint(body, x, use_reentrant=False).sum().backward()
    assert "global_fp8_buffer_pos_fwd_recompute" not in plain.fp8_meta
    assert isinstance(fp8.fp8_meta["global_fp8_buffer_pos_fwd_recompute"], int)
