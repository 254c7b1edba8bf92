"""``recipe.CustomRecipe``'s ``qfactory`` contract (TE: ``pytorch/quantization.py`` ``QuantizerRole``,
``QuantizerRequest``, ``DelayedScalingRequest``, ``CustomRecipeState.make_quantizers``,
``_handle_delayed_scaling_requests``).

``qfactory(role)`` is called once per tensor slot with a :class:`QuantizerRole` and returns a
quantizer, or a :class:`DelayedScalingRequest` for a delayed-scaling slot: all such requests of one
state must agree, and share one delayed-scaling state (a :class:`fp8sim.scaling.DelayedScaler`)
whose ``Float8Quantizer`` views replace them.  ``None`` is an error (TE's message).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ...recipe import CustomRecipe, DelayedScaling, Format
from ...scaling.delayed import DelayedScaler
from .float8_tensor import delayed_scaling_quantizers

__all__ = ["QuantizerRole", "QuantizerRequest", "DelayedScalingRequest", "CustomQuantizers", "custom_recipe_quantizers"]

_DS_FIELDS = (
    "fp8_format",
    "margin",
    "amax_history_len",
    "amax_compute_algo",
    "scaling_factor_compute_algo",
    "reduce_amax",
)


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """Which tensor slot asks for a quantizer: ``module_type`` ("linear", "grouped_linear", "dpa",
    ...), ``tensor_type`` ("input", "weight", "grad_output", ...), ``name`` (the module's name)."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __str__(self) -> str:
        parts = [
            f"{k}={v}"
            for k, v in (("module_type", self.module_type), ("tensor_type", self.tensor_type), ("name", self.name))
            if v
        ]
        return "|".join(parts) if parts else "QuantizerRole()"


@dataclasses.dataclass(frozen=True)
class QuantizerRequest:
    """Base of the requests a factory returns for quantizers that need state managed for it."""


@dataclasses.dataclass(frozen=True)
class DelayedScalingRequest(QuantizerRequest):
    """A ``Float8Quantizer`` with delayed-scaling state (TE's defaults)."""

    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable[..., Any] = "max"
    scaling_factor_compute_algo: Callable[..., Any] | None = None
    reduce_amax: bool = True


@dataclasses.dataclass
class CustomQuantizers:
    """The quantizers of one state (one per slot) and the delayed-scaling state shared by the
    slots that requested it (None when none did): update it with ``scaler.update()`` or
    ``fp8sim.scaling.delayed.reduce_and_update``."""

    quantizers: list[Any]
    scaler: DelayedScaler | None
    ds_slots: list[int] = dataclasses.field(default_factory=list)  # slot i <- scaler index ds_slots.index(i)


def custom_recipe_quantizers(
    recipe: CustomRecipe,
    roles: Sequence[QuantizerRole] | None,
    *,
    mode: str = "forward",
    num_quantizers: int | None = None,
    existing: DelayedScaler | None = None,
) -> CustomQuantizers:
    """TE's ``CustomRecipeState(recipe, mode=..., roles=...).make_quantizers()``.  Without ``roles``,
    ``num_quantizers`` bare ``QuantizerRole()`` are used (with TE's warning).  ``existing``: a
    delayed-scaling state to keep when it still fits (same size, dtype and history length), as TE
    reuses its predecessor's buffers."""
    if getattr(recipe, "qfactory", None) is None:
        raise ValueError("CustomRecipe requires `qfactory`.")
    if mode not in ("forward", "backward"):
        raise ValueError(f"mode must be 'forward' or 'backward', got {mode!r}")
    if roles is None:
        if num_quantizers is None:
            raise ValueError("give roles or num_quantizers")
        warnings.warn(
            "CustomRecipeState: no QuantizerRole list provided by the module/op. "
            "Falling back to bare QuantizerRole() defaults. "
            "Override get_quantizer_roles() to provide meaningful roles.",
            stacklevel=2,
        )
        roles = [QuantizerRole() for _ in range(num_quantizers)]
    raw = [recipe.qfactory(role) for role in roles]
    for i, q in enumerate(raw):
        if q is None:
            raise ValueError(
                f"CustomRecipe qfactory returned None for slot {i} "
                f"(role={roles[i]}). Every slot must return a Quantizer "
                "instance or a QuantizerRequest. For an intentional no-op "
                "(high-precision / unquantized) slot, return an "
                "IdentityQuantizer instead of None."
            )
    ds = [(i, r) for i, r in enumerate(raw) if isinstance(r, DelayedScalingRequest)]
    if not ds:
        return CustomQuantizers(raw, None)
    r0 = ds[0][1]
    for idx, req in ds[1:]:
        for name in _DS_FIELDS:
            v0, vi = getattr(r0, name), getattr(req, name)
            if v0 != vi:
                raise ValueError(
                    "All DelayedScalingRequests in one CustomRecipeState must match. "
                    f"Slot 0 has {name}={v0!r}, slot {idx} has {vi!r}."
                )
    inner = DelayedScaling(**{name: getattr(r0, name) for name in _DS_FIELDS})
    forward = mode == "forward"
    scaler = existing
    fits = (
        scaler is not None
        and scaler.n == len(ds)
        and scaler.forward == forward
        and scaler.fmt == DelayedScaler(inner, n=1, forward=forward).fmt
        and scaler.amax_history.shape[0] == inner.amax_history_len
    )
    if not fits:
        scaler = DelayedScaler(inner, n=len(ds), forward=forward)
    for (idx, _), q in zip(ds, delayed_scaling_quantizers(scaler), strict=True):
        raw[idx] = q
    return CustomQuantizers(raw, scaler, [idx for idx, _ in ds])
