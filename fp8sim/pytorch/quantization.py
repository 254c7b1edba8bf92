"""``autocast`` and the FP8 global state, with TransformerEngine's semantics (spec 4.4, 4.9).

Inside ``autocast(enabled=True, recipe=...)`` the fp8sim modules quantize per the recipe.  Delayed
scaling updates the forward scales of every module that ran when the outermost ``autocast`` exits
(if grad is enabled), and the backward scales at the end of the backward pass of the first FP8
module of the region (which runs last).  ``calibrating=True`` records amaxes with high-precision
compute.  ``accumulator`` (an fp8sim extension) picks the GEMM model for the whole region.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..recipe import DelayedScaling, Recipe

__all__ = ["autocast", "fp8_autocast", "is_fp8_enabled", "is_calibrating", "get_recipe", "FP8State"]


@dataclass
class FP8State:
    enabled: bool = False
    calibrating: bool = False
    recipe: Recipe | None = None
    group: Any = None
    accumulator: str | None = None
    depth: int = 0
    modules: list[Any] = field(default_factory=list)  # modules that ran in the outermost region
    first_module: Any = None


_STATE = FP8State()


def is_fp8_enabled() -> bool:
    """True inside ``autocast(enabled=True)``."""
    return _STATE.enabled


def is_calibrating() -> bool:
    return _STATE.calibrating


def get_recipe() -> Recipe:
    """The active recipe (TE's default when none was given: DelayedScaling on this hardware)."""
    return _STATE.recipe if _STATE.recipe is not None else DelayedScaling()


def current_state() -> FP8State:
    return _STATE


def _register(module: Any, trainable: bool = True) -> bool:
    """Record that ``module`` ran in this region; True only for the region's first FP8 GEMM whose
    input, weight or bias requires grad (TE ``linear.py``: a frozen module never takes the role):
    its backward runs last and so triggers the backward scale updates."""
    if not any(m is module for m in _STATE.modules):
        _STATE.modules.append(module)
    if trainable and _STATE.first_module is None:
        _STATE.first_module = module
        return True
    return False


@contextlib.contextmanager
def autocast(
    enabled: bool = True,
    calibrating: bool = False,
    recipe: Recipe | None = None,
    amax_reduction_group: Any = None,
    _graph: bool = False,
    *,
    accumulator: str | None = None,
) -> Iterator[None]:
    """TE's ``transformer_engine.pytorch.autocast``: FP8 execution per ``recipe`` for fp8sim modules.

    ``recipe=None`` is TE's choice on hardware without MXFP8 or CC >= 12.0: ``DelayedScaling()`` (also
    in a nested region: TE does not inherit the outer recipe).  Forward scales update when the
    outermost region exits, if it was ``enabled``, not ``_graph`` and grad is enabled (TE).
    ``amax_reduction_group``: the ``torch.distributed`` group whose amaxes are MAX-reduced before
    delayed-scaling updates.  ``accumulator``: None for the fast fp32 path (exact products summed
    in float32), or a device ("hopper", "ada", "blackwell": fast/split per GEMM as the recipe says)
    or an fp8sim accumulator preset name for every GEMM.
    """
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp8sim.recipe recipe (DelayedScaling, ...), got {type(recipe).__name__}")
    import torch

    saved = (_STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.accumulator)
    outermost = _STATE.depth == 0
    if outermost:
        _STATE.modules, _STATE.first_module = [], None
    _STATE.enabled, _STATE.calibrating = bool(enabled), bool(calibrating)
    _STATE.recipe = recipe
    _STATE.group = amax_reduction_group
    _STATE.accumulator = accumulator if accumulator is not None else saved[4]  # fp8sim's knob is inherited
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        modules = list(_STATE.modules)
        _STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.accumulator = saved
        if _STATE.depth == 0:
            if enabled and not _graph and torch.is_grad_enabled():
                for m in modules:
                    m._update_forward_scales()
            _STATE.modules, _STATE.first_module = [], None


def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Recipe | None = None,
    fp8_group: Any = None,
    _graph: bool = False,
) -> Any:
    """Deprecated TE name for :func:`autocast` (``fp8_recipe`` -> ``recipe``, ``fp8_group`` ->
    ``amax_reduction_group``)."""
    warnings.warn(
        "fp8_autocast is deprecated and will be removed in a future release. "
        "Use autocast(enabled=..., calibrating=..., recipe=..., group=..., _graph=...) instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return autocast(
        enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group, _graph=_graph
    )
