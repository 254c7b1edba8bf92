"""``DotProductAttention``'s ``fp8_meta`` and ``quantizers`` (TE ``dot_product_attention.py`` at d0067d0:
``set_meta_tensor``, ``get_quantizer_roles``), through the recipe-state lifecycle of the modules
(``module/_meta_states.py``): 9 forward slots (QKV, O, S groups of 3) and 6 backward (dQKV, dO, dP groups of 2).

A ``CustomRecipe`` gets a ``CustomRecipeState`` built from ``qfactory`` with DPA's roles; delayed scaling a
state viewing the module's own :class:`~fp8sim.scaling.DelayedScaler` (kept, and live, between steps); current
scaling TE's ``[CS, DS]`` split (``set_meta_tensor`` with ``num_gemms = [2, 1]``): ``fp8_meta`` keeps the DS
half, 3 forward slots (S) and 2 backward (dP), with the DS recipe as ``fp8_meta["recipe"]``, and ``quantizers``
are 6 (4) current-scaling ones for QKV/O (dQKV/dO) followed by the DS half's.  The states appear once FP8
attention ran.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ....recipe import DelayedScaling, Recipe
from ..._recipe_state import DelayedScalingRecipeState

__all__ = [
    "dpa_ds_recipe",
    "dpa_recipe_state",
    "install_dpa_quantizers",
    "dpa_fp8_meta",
    "dpa_quantizers",
    "dpa_qkv_capabilities",
]

_SLOTS = {True: 9, False: 6}
_CS_SLOTS = {True: 6, False: 4}  # TE: current scaling's CS half (QKV, O groups; dQKV, dO groups)
_META_QKV = 2  # TE utils.py META_QKV (FP8FwdTensorIdx GEMM1_OUTPUT)


class _DSHalfState(DelayedScalingRecipeState):
    """TE's primary state under current scaling: the delayed-scaling half of ``[CS, DS]`` (``set_meta_tensor``
    with ``num_gemms = [2, 1]``), 3 forward slots (the S group) and 2 backward (the dP group).  fp8sim keeps
    one scaler of the 3-GEMM layout; this state views its last group's columns (the same memory)."""

    def _resync(self) -> None:
        sc, lo = self.scaler, _CS_SLOTS[self.mode == "forward"]
        if self.scale.data_ptr() != sc.scale[lo:].ctypes.data or self.scale.shape != sc.scale[lo:].shape:
            self.scale = torch.from_numpy(sc.scale)[lo:]
        hist = sc.amax_history[:, lo:]
        if self.amax_history.data_ptr() != hist.ctypes.data or self.amax_history.shape != hist.shape:
            self.amax_history = torch.from_numpy(sc.amax_history)[:, lo:]


def _ds_half(scaler: Any, fwd: bool) -> _DSHalfState:
    from ..._recipe_state import RecipeState, get_fp8_te_dtype

    state = _DSHalfState.__new__(_DSHalfState)
    RecipeState.__init__(state, scaler.recipe, mode=_mode(fwd), num_quantizers=scaler.n - _CS_SLOTS[fwd])
    state.dtype = get_fp8_te_dtype(scaler.recipe, fwd)
    state.scaler = scaler
    lo = _CS_SLOTS[fwd]
    state.scale, state.amax_history = torch.from_numpy(scaler.scale)[lo:], torch.from_numpy(scaler.amax_history)[:, lo:]
    return state


def dpa_ds_recipe(recipe: Recipe) -> DelayedScaling:
    """The delayed-scaling recipe TE builds for S and dP under current scaling (``NVTE_DPA_FP8DS_*``)."""
    return DelayedScaling(
        fp8_format=recipe.fp8_format,
        amax_history_len=int(os.getenv("NVTE_DPA_FP8DS_AMAX_HISTLEN", "1")),
        amax_compute_algo=os.getenv("NVTE_DPA_FP8DS_AMAX_ALGO", "most_recent"),
        reduce_amax=os.getenv("NVTE_DPA_FP8DS_REDUCE_AMAX", "1") == "1",
        fp8_dpa=recipe.fp8_dpa,
        fp8_mha=recipe.fp8_mha,
    )


def _mode(fwd: bool) -> str:
    return "forward" if fwd else "backward"


def dpa_recipe_state(module: Any, fwd: bool, recipe: Any) -> Any:
    """A new state of one direction for ``recipe``."""
    from ..._recipe_state import CustomRecipeState, RecipeState, wrap_scaler
    from .custom_recipe import dpa_quantizer_roles

    if recipe.custom():
        roles = dpa_quantizer_roles(module, fwd)
        return CustomRecipeState(recipe, mode=_mode(fwd), num_quantizers=_SLOTS[fwd], roles=roles)
    if recipe.delayed():
        module._ensure_state(recipe)
        return wrap_scaler(module.fwd if fwd else module.bwd, _mode(fwd))
    if recipe.float8_current_scaling():
        module._ensure_state(dpa_ds_recipe(recipe))
        return _ds_half(module.fwd if fwd else module.bwd, fwd)
    return RecipeState.create(recipe, mode=_mode(fwd), num_quantizers=_SLOTS[fwd])


def install_dpa_quantizers(module: Any, key: str, state: Any) -> None:
    """A custom state's slot quantizers are made now (TE's ``make_quantizers``); the others on demand."""
    from ..._recipe_state import CustomRecipeState

    if isinstance(state, CustomRecipeState):
        module.__dict__.setdefault("_dpa_quantizers", {})[key] = state.make_quantizers()


def _delayed_view(module: Any, key: str, state: Any) -> Any:
    """The kept delayed-scaling state, re-made where the module replaced its scaler (a new recipe)."""
    from ..._recipe_state import DelayedScalingRecipeState, wrap_scaler

    fwd = key == "scaling_fwd"
    scaler = module.fwd if fwd else module.bwd
    if isinstance(state, DelayedScalingRecipeState) and state.scaler is not scaler and scaler is not None:
        new = _ds_half(scaler, fwd) if isinstance(state, _DSHalfState) else wrap_scaler(scaler, _mode(fwd))
        state = module._recipe_states()[key] = new
    if isinstance(state, DelayedScalingRecipeState):
        state._resync()
    return state


def dpa_fp8_meta(module: Any) -> dict[str, Any]:
    """TE's ``fp8_meta`` of ``module``."""
    states = module._recipe_states()
    meta: dict[str, Any] = {"recipe": module.__dict__.get("_fp8_meta_recipe"), "num_gemms": 3}
    for key in ("scaling_fwd", "scaling_bwd"):
        if key in states:
            meta[key] = _delayed_view(module, key, states[key])
    if isinstance(meta.get("scaling_fwd"), _DSHalfState):  # TE: fp8_meta["recipe"] is the DS recipe of S / dP
        meta["recipe"] = meta["scaling_fwd"].recipe
    return meta


def dpa_quantizers(module: Any) -> dict[str, list]:
    """TE's ``quantizers`` of ``module``: empty before FP8 attention ran."""
    from ..._recipe_state import CustomRecipeState, Float8CurrentScalingRecipeState

    out: dict[str, list] = {"scaling_fwd": [], "scaling_bwd": []}
    recipe = module.__dict__.get("_fp8_meta_recipe")
    for fwd, key in ((True, "scaling_fwd"), (False, "scaling_bwd")):
        state = module._recipe_states().get(key)
        if state is None:
            continue
        if isinstance(state, CustomRecipeState):
            out[key] = list(module.__dict__["_dpa_quantizers"][key])
            continue
        qs = _delayed_view(module, key, state).make_quantizers()
        if recipe is not None and recipe.float8_current_scaling():  # TE: [CS for QKV/O, DS for S] (num_gemms 2, 1)
            n_cs = _CS_SLOTS[fwd]
            qs = Float8CurrentScalingRecipeState(recipe, mode=_mode(fwd), num_quantizers=n_cs).make_quantizers() + qs
        out[key] = qs
    return out


def dpa_qkv_capabilities(module: Any) -> tuple[bool, bool]:
    """TE ``get_qkv_quantization_capabilities`` (``dot_product_attention.py`` 1163-1214): FP8 metadata made for
    the active recipe, then ``(float8_current_scaling, mxfp8_scaling)`` read from the class of the QKV slot's
    quantizer; TE's RuntimeError where no QKV quantizer was made, its TypeError for another class."""
    from ...quantization import current_state, get_recipe
    from ...tensor import Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer, QuantizerRole

    st = current_state()
    if st.enabled:
        module._init_fp8_metadata(get_recipe(), st.group)
    else:
        module._fp8_forward_off()
    role = QuantizerRole(module_type="dpa", tensor_type="qkv", name=module.name or "")
    fwd = module.quantizers["scaling_fwd"]
    if len(fwd) <= _META_QKV:
        raise RuntimeError(f"DotProductAttention did not materialize the canonical QKV quantizer for {role}.")
    qkv = fwd[_META_QKV]
    for cls, caps in ((Float8CurrentScalingQuantizer, (True, False)), (MXFP8Quantizer, (False, True))):
        if isinstance(qkv, cls):
            return caps
    if isinstance(qkv, Float8Quantizer):
        return False, False
    raise TypeError(f"Unsupported CustomRecipe quantizer for {role}: {type(qkv).__name__}.")
