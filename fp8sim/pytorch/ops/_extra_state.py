"""A basic op's ``_extra_state`` in TE's format (TE 2.20.0.dev0 ``ops/op.py`` ``get_extra_state`` /
``set_extra_state``): a uint8 tensor holding the pickle of ``{mode: {"recipe", "scale_fwd" /
"amax_history_fwd" (or ``_bwd``), "extra_fp8_variables"}}`` for each direction with a stateful recipe,
empty otherwise.  Recipes are pickled under TE's class path and read back with the same restricted
unpickler and ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE`` opt-in as the modules' extra state."""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from .._extra_state_te import _RestrictedUnpickler, _TEPickler, is_stateless_recipe, should_load_extra_state_pickle

__all__ = ["op_extra_state", "load_op_extra_state"]

_PLAIN = (bool, int, float, str, tuple, list)


def op_extra_state(op: Any) -> torch.Tensor:
    metas = op._fp8_metas
    state: dict[str, Any] = {}
    for mode, suffix in (("forward", "fwd"), ("backward", "bwd")):
        meta = None if metas is None else metas.get(mode)
        if meta is None or is_stateless_recipe(meta["recipe"]):
            continue
        recipe = meta["recipe"]
        entry: dict[str, Any] = {"recipe": recipe}
        if recipe.delayed():
            rs = meta[f"scaling_{suffix}"]
            entry[f"scale_{suffix}"] = rs.scale.detach().clone()
            entry[f"amax_history_{suffix}"] = rs.amax_history.detach().clone()
        entry["extra_fp8_variables"] = {
            k: v for k, v in meta.items() if k != "buffer_index_and_autocast_key" and isinstance(v, _PLAIN)
        }
        state[mode] = entry
    if not state:
        return torch.empty(0, dtype=torch.uint8)
    buf = io.BytesIO()
    _TEPickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(state)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _copy_into(scaler: Any, attr: str, src: torch.Tensor) -> None:
    """TE ``copy_tensor``: copy in place, or replace the buffer when the shapes differ (TE's
    ``dst.data = torch.empty(src.size())``; quantizers built before keep the old buffer, as TE's do)."""
    import numpy as np

    src_np = src.detach().cpu().to(torch.float32).numpy()
    if src_np.shape != getattr(scaler, attr).shape:
        setattr(scaler, attr, np.array(src_np, np.float32))
    else:
        getattr(scaler, attr)[...] = src_np


def load_op_extra_state(op: Any, state: torch.Tensor | None) -> None:
    if state is None or state.numel() == 0:
        return
    data = state.detach().cpu().numpy().tobytes()
    if not should_load_extra_state_pickle(data, type(op).__name__):
        return
    loaded = _RestrictedUnpickler(io.BytesIO(data)).load()
    if not loaded:
        return
    from ..quantization import autocast

    for mode, suffix in (("forward", "fwd"), ("backward", "bwd")):
        if mode not in loaded:
            continue
        entry = loaded[mode]
        if op._fp8_metas is None or op._fp8_metas.get(mode) is None:
            with autocast(recipe=entry["recipe"]):  # TE builds the state inside autocast
                op.reset_recipe_state(recipe=entry["recipe"])
        meta = op._fp8_metas[mode]
        meta["recipe"] = entry["recipe"]
        meta.update(entry["extra_fp8_variables"])
        meta.pop("global_fp8_buffer_pos_fwd_recompute", None)
        if entry["recipe"].delayed():
            scaler = meta[f"scaling_{suffix}"].scaler
            _copy_into(scaler, "scale", entry[f"scale_{suffix}"])
            _copy_into(scaler, "amax_history", entry[f"amax_history_{suffix}"])
