"""TE's recipe-state classes (``pytorch/quantization.py`` at d0067d0, lines 1092-1996): the builders of a
module's quantizers, one state per direction, re-exported by :mod:`fp8sim.pytorch.quantization`.

``RecipeState.create(recipe, mode=..., num_quantizers=..., roles=...)`` picks the class for the recipe;
``make_quantizers()`` returns one quantizer per slot.  Slot dispatch follows TE: a slot's
:class:`QuantizerRole` when it names a known ``tensor_type``, else the positional pattern (forward
``input, weight, output``; backward ``grad_output, grad_input``).  The delayed-scaling state keeps its
``scale`` and ``amax_history`` in a :class:`fp8sim.scaling.DelayedScaler` (the tensors here are live
views of its arrays, as TE's quantizers view TE's buffers).  ``device`` is accepted and unused (the CPU).
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from ..recipe import DelayedScaling, Recipe
from ..scaling.delayed import DelayedScaler
from .constants import get_fp4_te_dtype, get_fp8_te_dtype

__all__ = [
    "RecipeState",
    "DelayedScalingRecipeState",
    "Float8CurrentScalingRecipeState",
    "MXFP8BlockScalingRecipeState",
    "Float8BlockScalingRecipeState",
    "NVFP4BlockScalingRecipeState",
    "CustomRecipeState",
    "_default_sf_compute",
]


def _default_sf_compute(
    amax: torch.Tensor,
    scale: torch.Tensor,
    fp8_max: float,
    margin: int,
    _fp32_max: float = torch.finfo(torch.float32).max,
) -> torch.Tensor:
    """TE's default scale update, in place: ``(fp8_max / amax) / 2**margin`` where ``amax`` is positive
    and finite, else the previous scale; an infinite result becomes FLT_MAX."""
    sf = (fp8_max / amax) / (2**margin)  # torch: reciprocal(amax) * fp8_max, as TE's eager path
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, _fp32_max), sf)
    scale.copy_(sf)
    return scale


def _role_cls() -> Any:
    from .tensor.custom_recipe import QuantizerRole

    return QuantizerRole


class RecipeState(abc.ABC):
    """State for one direction of a recipe: builds its quantizers (TE's ``RecipeState``)."""

    _persistent_state_buffers: tuple[str, ...] = ()
    _KNOWN_TENSOR_TYPES = ("input", "weight", "output", "grad_output", "grad_input")
    _FWD_DEFAULT_TENSOR_TYPES = ("input", "weight", "output")
    _BWD_DEFAULT_TENSOR_TYPES = ("grad_output", "grad_input")

    def __init__(
        self,
        recipe: Recipe,
        *,
        mode: str,
        num_quantizers: int = 1,
        device: torch.device | None = None,
        roles: list | None = None,
    ) -> None:
        self._validate_roles(roles, num_quantizers)
        self.recipe, self.mode, self.num_quantizers, self.roles = recipe, mode, num_quantizers, roles
        self.device = torch.device("cpu") if device is None else device

    @staticmethod
    def _validate_roles(roles: list | None, num_quantizers: int) -> None:
        if roles is not None and len(roles) != num_quantizers:
            raise ValueError(f"RecipeState requires roles to match num_quantizers ({len(roles)=} vs {num_quantizers=})")

    def _slot_role(self, idx: int) -> Any:
        """The slot's role, or a bare ``QuantizerRole()`` when none was given."""
        if self.roles is not None and self.roles[idx] is not None:
            return self.roles[idx]
        return _role_cls()()

    def _slot_tensor_type(self, idx: int) -> str:
        """The role's ``tensor_type`` when it is a known one, else the positional default."""
        tensor_type = self._slot_role(idx).tensor_type
        if tensor_type in self._KNOWN_TENSOR_TYPES:
            return tensor_type
        defaults = self._FWD_DEFAULT_TENSOR_TYPES if self.mode == "forward" else self._BWD_DEFAULT_TENSOR_TYPES
        return defaults[idx % len(defaults)]

    @staticmethod
    def create(
        recipe: Recipe,
        *,
        mode: str,
        num_quantizers: int = 1,
        device: torch.device | None = None,
        roles: list | None = None,
    ) -> RecipeState:
        """The state class for ``recipe`` (TE's ``RecipeState.create``)."""
        for test, cls in (
            (recipe.delayed, DelayedScalingRecipeState),
            (recipe.mxfp8, MXFP8BlockScalingRecipeState),
            (recipe.float8_current_scaling, Float8CurrentScalingRecipeState),
            (recipe.float8_block_scaling, Float8BlockScalingRecipeState),
            (recipe.nvfp4, NVFP4BlockScalingRecipeState),
            (recipe.custom, CustomRecipeState),
        ):
            if test():
                return cls(recipe, mode=mode, num_quantizers=num_quantizers, device=device, roles=roles)
        raise ValueError(f"{recipe.__class__.__name__} is not supported")

    @abc.abstractmethod
    def make_quantizers(self) -> list:
        """One quantizer per slot."""

    def inherit_state_from(self, other: RecipeState) -> bool:
        """Rebind this state's persistent buffers to ``other``'s (same class, shapes and dtypes): True
        when something was inherited."""
        if type(self) is not type(other) or not self._persistent_state_buffers:
            return False
        for name in self._persistent_state_buffers:
            src, dst = getattr(other, name), getattr(self, name)
            if src.shape != dst.shape or src.dtype != dst.dtype:
                return False
        for name in self._persistent_state_buffers:
            setattr(self, name, getattr(other, name))
        return True


class DelayedScalingRecipeState(RecipeState):
    """Per-tensor delayed scaling: ``scale`` (ones) and ``amax_history`` (zeros, ``amax_history_len`` rows)."""

    _persistent_state_buffers = ("scale", "amax_history")

    def __init__(self, recipe: DelayedScaling, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self.dtype = get_fp8_te_dtype(recipe, self.mode == "forward")
        self.scaler = DelayedScaler(recipe, n=self.num_quantizers, forward=self.mode == "forward")
        self.scale = torch.from_numpy(self.scaler.scale)
        self.amax_history = torch.from_numpy(self.scaler.amax_history)

    def make_quantizers(self) -> list:
        from .tensor.float8_tensor import Float8Quantizer

        return [
            Float8Quantizer(self.scale[i], self.amax_history[0][i].reshape((1,)), self.dtype)
            for i in range(self.num_quantizers)
        ]

    def inherit_state_from(self, other: RecipeState) -> bool:
        """TE's rebind to the predecessor's ``scale`` and ``amax_history`` tensor objects; their arrays are
        its :class:`DelayedScaler`'s, so that scaler comes along."""
        if not super().inherit_state_from(other):
            return False
        self.scaler = other.scaler
        return True

    def _resync(self) -> None:
        """View the scaler's current arrays again where they were replaced (a new ``amax_history_len``) or the
        views lost them (``copy.deepcopy`` copies the tensors and the arrays apart)."""
        sc = self.scaler
        if sc is None:  # a multi-GEMM module's snapshot
            return
        if self.scale.data_ptr() != sc.scale.ctypes.data or self.scale.shape != sc.scale.shape:
            self.scale = torch.from_numpy(sc.scale)
        if self.amax_history.data_ptr() != sc.amax_history.ctypes.data or (
            self.amax_history.shape != sc.amax_history.shape
        ):
            self.amax_history = torch.from_numpy(sc.amax_history)


class Float8CurrentScalingRecipeState(RecipeState):
    """Per-tensor current scaling: no state; every slot gets the recipe's ``use_power_2_scales``."""

    def __init__(self, recipe: Recipe, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self.dtype = get_fp8_te_dtype(recipe, self.mode == "forward")

    def make_quantizers(self) -> list:
        from .tensor.float8_tensor import Float8CurrentScalingQuantizer

        return [
            Float8CurrentScalingQuantizer(self.dtype, force_pow_2_scales=self.recipe.use_power_2_scales)
            for _ in range(self.num_quantizers)
        ]


class MXFP8BlockScalingRecipeState(RecipeState):
    """MXFP8: no state; 2D (32x32) blocks for the forward ``weight`` slots of linear / grouped_linear
    roles when the recipe enables them."""

    def __init__(self, recipe: Recipe, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self.dtype = get_fp8_te_dtype(recipe, self.mode == "forward")

    def make_quantizers(self) -> list:
        from .tensor.mxfp8_tensor import MXFP8Quantizer

        if self.mode not in ("forward", "backward"):
            raise RuntimeError(f"Unexpected recipe mode ({self.mode})")

        def two_d(idx: int) -> bool:
            if self.mode == "backward" or not self.recipe.enable_2d_quantization:
                return False
            role = self._slot_role(idx)
            return role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight"

        return [MXFP8Quantizer(self.dtype, with_2d_quantization=two_d(i)) for i in range(self.num_quantizers)]


class Float8BlockScalingRecipeState(RecipeState):
    """FP8 block scaling: per slot type, the weight, gradient or input (also output) settings."""

    def __init__(self, recipe: Recipe, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self.qx_dtype = self.qw_dtype = get_fp8_te_dtype(recipe, True)
        self.qgrad_dtype = get_fp8_te_dtype(recipe, False)

    def make_quantizers(self) -> list:
        from .tensor.float8_blockwise_tensor import Float8BlockQuantizer

        r = self.recipe
        if self.mode not in ("forward", "backward"):
            raise AssertionError(f"Unexpected mode {self.mode}")

        def make(tensor_type: str) -> Float8BlockQuantizer:
            if tensor_type == "weight":
                qp, dtype, dim = r.fp8_quant_fwd_weight, self.qw_dtype, r.w_block_scaling_dim
            elif tensor_type in ("grad_output", "grad_input"):
                qp, dtype, dim = r.fp8_quant_bwd_grad, self.qgrad_dtype, r.grad_block_scaling_dim
            else:
                qp, dtype, dim = r.fp8_quant_fwd_inp, self.qx_dtype, r.x_block_scaling_dim
            return Float8BlockQuantizer(
                fp8_dtype=dtype,
                rowwise=True,
                columnwise=True,
                amax_epsilon=qp.amax_epsilon,
                force_pow_2_scales=qp.power_2_scale,
                block_scaling_dim=dim,
            )

        return [make(self._slot_tensor_type(i)) for i in range(self.num_quantizers)]


class NVFP4BlockScalingRecipeState(RecipeState):
    """NVFP4: per slot type, the weight, gradient or input settings (RHT, 2D tiles, stochastic rounding,
    4over6 scope, row-scaled activations), as the modules configure them (``module/_quantizers.py``)."""

    def __init__(self, recipe: Recipe, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self.dtype = get_fp4_te_dtype(recipe)

    def make_quantizers(self) -> list:
        from .module._quantizers import _nvfp4

        if self.mode not in ("forward", "backward"):
            raise RuntimeError(f"Unexpected recipe mode ({self.mode})")
        forward = self.mode == "forward"
        return [_nvfp4(self.recipe, forward, self._slot_tensor_type(i)) for i in range(self.num_quantizers)]


class CustomRecipeState(RecipeState):
    """``CustomRecipe``: ``qfactory(role)`` per slot; the ``DelayedScalingRequest`` slots share one
    :class:`DelayedScalingRecipeState` (``_ds_state``), kept across rebuilds via :meth:`inherit_state_from`."""

    def __init__(self, recipe: Recipe, **kwargs: Any) -> None:
        super().__init__(recipe, **kwargs)
        self._ds_state: DelayedScalingRecipeState | None = None
        self._ds_slots: list[int] = []  # the slots of the DelayedScalingRequests, in _ds_state's order
        self._ds_state_to_inherit: DelayedScalingRecipeState | None = None
        if getattr(recipe, "qfactory", None) is None:
            raise ValueError("CustomRecipe requires `qfactory`.")

    def make_quantizers(self) -> list:
        from .tensor.custom_recipe import custom_recipe_quantizers

        existing, self._ds_state_to_inherit = self._ds_state_to_inherit, None
        out = custom_recipe_quantizers(
            self.recipe,
            self.roles,  # TE hands a slot's None role to the factory as it is
            mode=self.mode,
            num_quantizers=self.num_quantizers,
            existing=None if existing is None else existing.scaler,
        )
        self._ds_state, self._ds_slots = None, out.ds_slots
        if out.scaler is not None:
            if existing is not None and existing.scaler is out.scaler:
                self._ds_state = existing
            else:
                self._ds_state = wrap_scaler(out.scaler, self.mode, self.device)
        return out.quantizers

    def inherit_state_from(self, other: RecipeState) -> bool:
        """Stash ``other``'s delayed-scaling sub-state for the next :meth:`make_quantizers` to reuse."""
        if not isinstance(other, CustomRecipeState) or other._ds_state is None:
            return False
        self._ds_state_to_inherit = other._ds_state
        return True

    @property
    def _has_delayed_scaling(self) -> bool:
        return self._ds_state is not None

    @property
    def amax_history(self) -> torch.Tensor | None:
        return self._ds_state.amax_history if self._ds_state else None

    @property
    def scale(self) -> torch.Tensor | None:
        return self._ds_state.scale if self._ds_state else None

    @property
    def _inner_delayed_scaling_recipe(self) -> DelayedScaling | None:
        return self._ds_state.recipe if self._ds_state else None


def wrap_scaler(scaler: DelayedScaler, mode: str, device: Any = None) -> DelayedScalingRecipeState:
    """A :class:`DelayedScalingRecipeState` over an existing scaler (its arrays, not copies)."""
    state = DelayedScalingRecipeState.__new__(DelayedScalingRecipeState)
    RecipeState.__init__(state, scaler.recipe, mode=mode, num_quantizers=scaler.n, device=device)
    state.dtype = get_fp8_te_dtype(scaler.recipe, mode == "forward")
    state.scaler = scaler
    state.scale, state.amax_history = torch.from_numpy(scaler.scale), torch.from_numpy(scaler.amax_history)
    return state
