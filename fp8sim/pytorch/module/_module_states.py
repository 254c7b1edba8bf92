"""A GEMM module's side of TE's ``fp8_meta`` recipe-state lifecycle (``module/_meta_states.py``): its new
states (TE ``set_meta_tensor``'s ``RecipeState.create`` with the module's roles), a ``CustomRecipe``'s slot
quantizers handed to its GEMMs, and the ``fp8_meta`` dict.  Under delayed scaling each GEMM keeps its own
:class:`~fp8sim.scaling.DelayedScaler`; the states view it.
"""

from __future__ import annotations

from typing import Any

from ...recipe import DelayedScaling, Recipe

__all__ = ["module_recipe_state", "delayed_state_view", "install_module_quantizers", "module_fp8_meta"]


def module_recipe_state(module: Any, fwd: bool, recipe: Recipe) -> Any:
    """A new recipe state of ``module`` for one direction (TE ``set_meta_tensor``'s ``RecipeState.create`` with
    the module's roles).  Delayed scaling: a view of the GEMM's own :class:`DelayedScaler` (one GEMM) or a
    snapshot of all of them in TE's layout (several GEMMs: each GEMM keeps its own state here)."""
    from .._recipe_state import RecipeState, wrap_scaler
    from ._custom import quantizer_roles

    mode, n = ("forward", 3) if fwd else ("backward", 2)
    gemms = list(module.fp8_gemms.values())
    if isinstance(recipe, DelayedScaling):
        for g in gemms:
            if g.fwd is None:  # called before this GEMM's first forward: its state is made now
                g.ensure(recipe, module.__dict__.get("_fp8_group"), type(module).__name__)
        if len(gemms) == 1:  # a new state object over the GEMM's scaler; the caller inherits the old tensors
            return wrap_scaler(gemms[0].fwd if fwd else gemms[0].bwd, mode)
        return delayed_state_view(module, fwd)
    return RecipeState.create(recipe, mode=mode, num_quantizers=n * len(gemms), roles=quantizer_roles(module, fwd))


def delayed_state_view(module: Any, fwd: bool) -> Any:
    """``fp8_meta["scaling_fwd"]`` / ``["scaling_bwd"]`` under delayed scaling: one GEMM's state is kept and
    viewed live (the same tensor objects from step to step); several GEMMs give a fresh snapshot."""
    import numpy as np
    import torch

    from .._recipe_state import DelayedScalingRecipeState, wrap_scaler

    key, mode = ("scaling_fwd", "forward") if fwd else ("scaling_bwd", "backward")
    scalers = [g.fwd if fwd else g.bwd for g in module.fp8_gemms.values()]
    if len(scalers) == 1:
        states = module._recipe_states()
        state = states.get(key)
        if not (isinstance(state, DelayedScalingRecipeState) and state.scaler is scalers[0]):
            state = states[key] = wrap_scaler(scalers[0], mode)
        state._resync()
        return state
    state = wrap_scaler(scalers[0], mode)
    state.scaler, state.num_quantizers = None, sum(sc.n for sc in scalers)
    state.scale = torch.from_numpy(np.concatenate([sc.scale for sc in scalers]))
    state.amax_history = torch.from_numpy(np.concatenate([sc.amax_history for sc in scalers], axis=1))
    return state


def install_module_quantizers(module: Any, key: str, state: Any) -> None:
    """A custom state's slot quantizers go to the module's GEMMs (GEMM ``i``: forward ``3i..3i+2``,
    backward ``2i..2i+1``); the built-in recipes' quantizers are made on demand (:func:`module_quantizers`)."""
    from .._recipe_state import CustomRecipeState
    from ..quantization import add_fp8_tensors_to_global_buffer

    if not isinstance(state, CustomRecipeState):
        return
    quantizers = state.make_quantizers()
    module.__dict__.setdefault("_custom_quantizers_by_key", {})[key] = quantizers
    fwd = key == "scaling_fwd"
    per = 3 if fwd else 2
    for i, g in enumerate(module.fp8_gemms.values()):
        slots = list(g.custom) if g.custom is not None else [None, None]
        slots[0 if fwd else 1] = quantizers[per * i : per * i + per]
        g.custom = tuple(slots)
    states = module._recipe_states()
    f, b = states.get("scaling_fwd"), state if not fwd else None
    if not fwd and isinstance(f, CustomRecipeState) and (f._ds_state or b._ds_state):  # as the built-in recipe's
        scalers = [s._ds_state.scaler if s._ds_state else None for s in (f, b)]
        add_fp8_tensors_to_global_buffer(*scalers, state.recipe, module.__dict__.get("_fp8_group"))


def module_fp8_meta(module: Any) -> dict[str, Any]:
    """TE's ``fp8_meta`` of ``module``: the recipe states of its last initialization, or, where its GEMMs hold
    delayed-scaling state (a delayed-scaling step, a loaded checkpoint), views of that state; and the position
    of its stash in the recompute buffer once a checkpointed FP8 forward made one."""
    from .._recipe_state import DelayedScalingRecipeState
    from .._recompute_state import RECOMPUTE_KEY

    gemms = list(module.fp8_gemms.values())
    meta: dict[str, Any] = {"num_gemms": len(gemms), "recipe": gemms[0].fwd.recipe if gemms[0].fwd else None}
    pos = gemms[0].__dict__.get("_recompute_fp8_meta", {}).get(RECOMPUTE_KEY)
    if pos is not None:  # a checkpointed FP8 forward stashed its state (kept per GEMM here)
        meta[RECOMPUTE_KEY] = pos
    states = module._recipe_states()
    fwd = states.get("scaling_fwd")
    if isinstance(fwd, DelayedScalingRecipeState) or isinstance(module._last_recipe, DelayedScaling) or fwd is None:
        if all(g.fwd is not None for g in gemms):
            meta["scaling_fwd"] = delayed_state_view(module, True)
            meta["scaling_bwd"] = delayed_state_view(module, False)
        return meta
    meta.update(recipe=fwd.recipe, scaling_fwd=fwd, scaling_bwd=states["scaling_bwd"])
    return meta
