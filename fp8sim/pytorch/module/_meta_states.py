"""TE's recipe-state lifecycle of ``fp8_meta`` (``module/base.py`` at d0067d0: ``fp8_meta_tensors_initialized``,
``output_quantizer_role`` / ``grad_input_quantizer_role``, ``set_meta_tensor``, ``init_fp8_meta_tensors``,
``init_fp8_metadata``), shared by the GEMM modules and ``DotProductAttention``.

``fp8_meta["scaling_fwd"]`` / ``["scaling_bwd"]`` are :class:`~fp8sim.pytorch.quantization.RecipeState` objects
that persist between steps.  ``init_fp8_meta_tensors(recipe)`` keeps a direction's state while
``fp8_meta_tensors_initialized`` holds and the state is of the recipe's kind (a ``CustomRecipeState`` only for
the same recipe object); otherwise it builds a new state, which inherits its predecessor's persistent
buffers (delayed scaling's ``scale`` and ``amax_history``, as tensor objects), and new quantizers.  Setting a
boundary role to a different value clears ``fp8_meta_tensors_initialized``, so the next
``init_fp8_meta_tensors`` rebuilds with the new roles.  A forward runs ``init_fp8_meta_tensors`` as TE's
``init_fp8_metadata`` does: on the first FP8 forward, after a forward outside FP8, or when the recipe no
longer compares equal to the last one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RecipeStateLifecycle"]

_KEYS = {True: "scaling_fwd", False: "scaling_bwd"}


class RecipeStateLifecycle:
    """Mixin: TE's ``fp8_meta`` recipe states and boundary roles.  Subclasses build a direction's state in
    :meth:`_new_recipe_state` and make and take its quantizers in :meth:`_install_quantizers`."""

    fp8_meta_tensors_initialized: bool = False  # TE: set by init_fp8_meta_tensors, cleared by a role change
    fp8_initialized: bool = False  # TE: set by an FP8 forward's init, cleared by a forward outside FP8
    _output_quantizer_role: Any = None
    _grad_input_quantizer_role: Any = None

    @property
    def output_quantizer_role(self) -> Any:
        """The :class:`QuantizerRole` of the forward output slots (a consumer's identity; None: unknown).
        A different value invalidates the recipe states (TE ``base.py`` ``output_quantizer_role``)."""
        return self._output_quantizer_role

    @output_quantizer_role.setter
    def output_quantizer_role(self, role: Any) -> None:
        self._set_role("_output_quantizer_role", role)

    @property
    def grad_input_quantizer_role(self) -> Any:
        """Backward counterpart of :attr:`output_quantizer_role` (the grad-input slots)."""
        return self._grad_input_quantizer_role

    @grad_input_quantizer_role.setter
    def grad_input_quantizer_role(self, role: Any) -> None:
        self._set_role("_grad_input_quantizer_role", role)

    def _set_role(self, attr: str, role: Any) -> None:
        if role == getattr(self, attr):  # QuantizerRole is a frozen dataclass: an equal role is no change
            return
        self.__dict__[attr] = role
        if self.fp8_meta_tensors_initialized:
            self.__dict__["fp8_meta_tensors_initialized"] = False

    # -- states --------------------------------------------------------------------------------------
    def _recipe_states(self) -> dict[str, Any]:
        return self.__dict__.setdefault("_fp8_recipe_states", {})

    def init_fp8_meta_tensors(self, recipe: Any) -> None:
        """Build or keep the forward and backward recipe states for ``recipe`` (TE's name)."""
        for fwd in (True, False):
            self._set_meta_state(fwd, recipe)
        self.__dict__["fp8_meta_tensors_initialized"] = True

    def _set_meta_state(self, fwd: bool, recipe: Any) -> None:
        """TE ``set_meta_tensor``: keep a valid state of the recipe's kind, else rebuild and inherit."""
        key = _KEYS[fwd]
        states = self._recipe_states()
        old = states.get(key)
        if self.fp8_meta_tensors_initialized and old is not None and _same_kind(old, recipe):
            return
        state = self._new_recipe_state(fwd, recipe)
        if old is not None:
            state.inherit_state_from(old)
        states[key] = state
        self._install_quantizers(key, state)

    def _init_fp8_metadata(self, recipe: Any, group: Any = None) -> None:
        """An FP8 forward's step (TE ``init_fp8_metadata``): (re)initialize unless done for an equal recipe."""
        self.__dict__["_fp8_group"] = group
        if self.fp8_initialized and recipe == self.__dict__.get("_fp8_meta_recipe"):
            return
        self.__dict__["_fp8_meta_recipe"] = recipe
        self.init_fp8_meta_tensors(recipe)
        self.__dict__["fp8_initialized"] = True

    def _fp8_forward_off(self) -> None:
        """A forward outside FP8 (TE ``init_fp8_metadata``: ``fp8_initialized = False``)."""
        self.__dict__["fp8_initialized"] = False

    def _new_recipe_state(self, fwd: bool, recipe: Any) -> Any:
        raise NotImplementedError

    def _install_quantizers(self, key: str, state: Any) -> None:
        raise NotImplementedError


def _same_kind(state: Any, recipe: Any) -> bool:
    """TE ``set_meta_tensor``'s early return: the state class matches the recipe's (a custom state: the
    same recipe object)."""
    from .. import _recipe_state as rs

    if recipe.custom():
        return isinstance(state, rs.CustomRecipeState) and state.recipe is recipe
    for test, cls in (
        (recipe.delayed, rs.DelayedScalingRecipeState),
        (recipe.mxfp8, rs.MXFP8BlockScalingRecipeState),
        (recipe.float8_current_scaling, rs.Float8CurrentScalingRecipeState),
        (recipe.float8_block_scaling, rs.Float8BlockScalingRecipeState),
        (recipe.nvfp4, rs.NVFP4BlockScalingRecipeState),
    ):
        if test():
            return isinstance(state, cls)
    return False
