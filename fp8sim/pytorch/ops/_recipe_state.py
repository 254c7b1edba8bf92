"""The quantization state of one op and direction: TE 2.20.0.dev0 ``RecipeState.create(recipe, mode=,
num_quantizers=, roles=).make_quantizers()`` (``pytorch/quantization.py``), as the fusible ops use it.

Per recipe, as TE builds the slots:

- ``DelayedScaling``: one :class:`fp8sim.scaling.DelayedScaler` (``scale``, ``amax_history``) and one
  ``Float8Quantizer`` per slot over live views of it (``DelayedScalingRecipeState``);
- ``Float8CurrentScaling``: ``Float8CurrentScalingQuantizer(force_pow_2_scales=recipe.use_power_2_scales)``
  for every slot (the ops then set the per-role power-of-two flag, ``BasicLinear.reset_recipe_state``);
- ``MXFP8BlockScaling``: ``MXFP8Quantizer``, 2D (32x32) only for a forward slot whose role is a
  ``linear``/``grouped_linear`` weight under ``enable_2d_quantization``;
- ``Float8BlockScaling`` / ``NVFP4BlockScaling``: dispatched on the slot's ``tensor_type``, falling back to
  the positional roles ``input, weight, output`` / ``grad_output, grad_input`` (``_slot_tensor_type``);
- ``CustomRecipe``: the recipe's ``qfactory`` per role (``CustomRecipeState``).
"""

from __future__ import annotations

from typing import Any

import torch

from ...recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    tensor_format,
)

__all__ = ["OpRecipeState"]

_KNOWN_TENSOR_TYPES = ("input", "weight", "output", "grad_output", "grad_input")
_FWD_DEFAULTS = ("input", "weight", "output")
_BWD_DEFAULTS = ("grad_output", "grad_input")
_SUPPORTED = (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    Float8BlockScaling,
    NVFP4BlockScaling,
    CustomRecipe,
)


def _te_dtype(recipe: Recipe, forward: bool) -> Any:
    from ..constants import DType

    return DType.kFloat8E4M3 if tensor_format(recipe.fp8_format, forward).name == "e4m3" else DType.kFloat8E5M2


class OpRecipeState:
    """TE's ``RecipeState`` for ``num_quantizers`` slots of one direction (``mode``: "forward" or
    "backward").  ``scaler`` holds the delayed-scaling state (delayed recipes and custom recipes whose
    factory asked for it), else None."""

    def __init__(self, recipe: Recipe, *, mode: str, num_quantizers: int, roles: list | None = None) -> None:
        if mode not in ("forward", "backward"):
            raise RuntimeError(f"Unexpected recipe mode ({mode})")
        if roles is not None and len(roles) != num_quantizers:
            raise ValueError(f"RecipeState requires roles to match num_quantizers ({len(roles)=} vs {num_quantizers=})")
        if not isinstance(recipe, _SUPPORTED):
            raise ValueError(f"{type(recipe).__name__} is not supported")
        self.recipe, self.mode, self.num_quantizers, self.roles = recipe, mode, num_quantizers, roles
        self.scaler: Any = None
        if isinstance(recipe, DelayedScaling):
            from ...scaling.delayed import DelayedScaler

            self.scaler = DelayedScaler(recipe, n=num_quantizers, forward=mode == "forward")

    # -- TE's DelayedScalingRecipeState tensors: live float32 views of the scaler ----------------
    @property
    def scale(self) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.from_numpy(self.scaler.scale)

    @property
    def amax_history(self) -> torch.Tensor:
        with torch.inference_mode(False):
            return torch.from_numpy(self.scaler.amax_history)

    def _tensor_type(self, idx: int) -> str:
        """TE ``_slot_tensor_type``: the role's ``tensor_type`` when it is a known one, else positional."""
        role = self.roles[idx] if self.roles is not None else None
        tensor_type = getattr(role, "tensor_type", "") if role is not None else ""
        if tensor_type in _KNOWN_TENSOR_TYPES:
            return tensor_type
        defaults = _FWD_DEFAULTS if self.mode == "forward" else _BWD_DEFAULTS
        return defaults[idx % len(defaults)]

    def make_quantizers(self) -> list:
        """One quantizer per slot, as TE's ``make_quantizers`` builds them.  Built outside inference mode:
        TE's kernels write the amax buffers through raw pointers, so state made under ``torch.inference_mode``
        must stay writable when training resumes."""
        with torch.inference_mode(False):
            return self._make_quantizers()

    def _make_quantizers(self) -> list:
        r, n, forward = self.recipe, self.num_quantizers, self.mode == "forward"
        from ..tensor import Float8CurrentScalingQuantizer, MXFP8Quantizer, delayed_scaling_quantizers

        if isinstance(r, DelayedScaling):
            return delayed_scaling_quantizers(self.scaler)
        if isinstance(r, Float8CurrentScaling):
            dt = _te_dtype(r, forward)
            return [Float8CurrentScalingQuantizer(dt, force_pow_2_scales=r.use_power_2_scales) for _ in range(n)]
        if isinstance(r, MXFP8BlockScaling):
            dt = _te_dtype(r, forward)
            return [MXFP8Quantizer(dt, with_2d_quantization=self._mxfp8_2d(i)) for i in range(n)]
        if isinstance(r, Float8BlockScaling):
            return [self._block(self._tensor_type(i)) for i in range(n)]
        if isinstance(r, NVFP4BlockScaling):
            from ..module._quantizers import _nvfp4

            # TE applies 4over6 and row scaling to non-gradient slots; _nvfp4 reads that from ``forward``
            return [_nvfp4(r, not self._tensor_type(i).startswith("grad"), self._tensor_type(i)) for i in range(n)]
        return self._custom()

    def _mxfp8_2d(self, idx: int) -> bool:
        if self.mode == "backward" or not getattr(self.recipe, "enable_2d_quantization", False):
            return False
        role = self.roles[idx] if self.roles is not None else None
        if role is None:
            return False
        return role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight"

    def _block(self, tensor_type: str) -> Any:
        from ..tensor import Float8BlockQuantizer

        r = self.recipe
        if tensor_type == "weight":
            qp, dim, forward = r.fp8_quant_fwd_weight, r.w_block_scaling_dim, True
        elif tensor_type in ("grad_output", "grad_input"):
            qp, dim, forward = r.fp8_quant_bwd_grad, r.grad_block_scaling_dim, False
        else:
            qp, dim, forward = r.fp8_quant_fwd_inp, r.x_block_scaling_dim, True
        return Float8BlockQuantizer(
            _te_dtype(r, forward),
            rowwise=True,
            columnwise=True,
            amax_epsilon=qp.amax_epsilon,
            force_pow_2_scales=qp.power_2_scale,
            block_scaling_dim=dim,
        )

    def _custom(self) -> list:
        from ..tensor import custom_recipe_quantizers

        got = custom_recipe_quantizers(
            self.recipe, self.roles, mode=self.mode, num_quantizers=self.num_quantizers, existing=self.scaler
        )
        self.scaler = got.scaler
        return list(got.quantizers)

    def set_recipe(self, recipe: DelayedScaling) -> bool:
        """TE ``BasicOperation.reset_recipe_state`` for a new recipe of the same class: the delayed-scaling
        history is cut or zero-padded to the new ``amax_history_len`` (the scale kept); True when it was
        reallocated (the quantizers must then be rebuilt, as TE rebuilds them)."""
        if self.scaler is None or not isinstance(recipe, DelayedScaling):
            return False
        if self.scaler.amax_history.shape[0] == recipe.amax_history_len:
            return False
        self.scaler.set_recipe(recipe)
        return True
