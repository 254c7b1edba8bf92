"""TE's eager (unfused) delayed-scaling update, written in torch from NVIDIA/TransformerEngine:
transformer_engine/pytorch/quantization.py at d0067d0: ``_update_amax_history`` (lines 1067-1074),
``_default_get_amax_and_update_history`` (1077-1089), ``_default_sf_compute`` (1092-1116),
``_compute_amax_and_update_history`` (1119-1132), ``_compute_scaling_factor`` (1135-1150),
``_amax_and_scale_update`` (1153-1166); ``get_fp8_max`` (306-312).  The reference of the delayed-scaling tests."""

from __future__ import annotations

from typing import Any


def te_unfused_update(hist: Any, scale: Any, fp8_max: float, recipe: Any) -> None:
    """Update ``hist`` (amax_history_len, n) and ``scale`` (n,) in place, as TE's eager path does."""
    import torch

    algo = recipe.amax_compute_algo
    if callable(algo):
        amax = algo(hist)
    elif algo == "max":
        amax = torch.max(hist, dim=0).values
    else:
        amax = hist[0].clone()
    if hist.shape[0] > 1:
        hist.copy_(torch.roll(hist, -1, 0))
    hist[0].fill_(0.0)
    if recipe.scaling_factor_compute_algo is not None:
        new = recipe.scaling_factor_compute_algo(amax, scale, fp8_max, recipe)
    else:
        sf = (fp8_max / amax) / (2**recipe.margin)
        sf = torch.where(amax > 0.0, sf, scale)
        sf = torch.where(torch.isfinite(amax), sf, scale)
        new = torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)
    scale.copy_(new)
