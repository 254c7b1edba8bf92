"""The FP8 state of one GEMM: TE's delayed-scaling scalers (forward INPUT=0, WEIGHT=1, OUTPUT=2;
backward GRAD_OUTPUT=0, GRAD_INPUT=1), the cached FP8 weight, statistics; and ``fp8_meta``'s view."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..._util.upstream_quirk import UpstreamQuirkWarning
from ...recipe import CustomRecipe, DelayedScaling, Recipe
from ...scaling.delayed import DelayedScaler
from ..quantization import add_fp8_tensors_to_global_buffer
from ._fp8_params import block_operands_from_fp8_weight, is_fp8_weight, operand_from_fp8_weight
from ._operands import PER_TENSOR, Operand, quantize_operand

__all__ = ["_GemmState", "_ScalingMeta", "STALE_COPY_QUIRK"]

STALE_COPY_QUIRK = (
    "{module}: this module's delayed-scaling state was copied (copy.deepcopy or pickle) from a module already "
    "registered in TE's global amax buffer; TE copies fp8_meta with its 'buffer_index_and_autocast_key', so "
    "add_fp8_tensors_to_global_buffer returns early and the copy is never registered: its scales never update "
    "(they keep the values they had when copied). fp8sim reproduces that (quirk 'te-deepcopy-stale-scales'); "
    "for a copy that updates, copy the module before its first FP8 step, or build a new one and "
    "load_state_dict() the original's state"
)

_ROWWISE_MISSING = (  # TE storage/mxfp8_tensor_storage.py update_usage, and why it happens under FSDP2
    "Requested row-wise usage, but MXFP8Tensor is missing row-scaled FP8 data (FSDP2's backward all-gather "
    "carries the column-wise copy only, as TE's: a forward recomputed in the backward, e.g. activation "
    "checkpointing, of a layer resharded after forward needs fully_shard(..., reshard_after_forward=False))"
)


class _GemmState:
    """FP8 state of one GEMM: delayed-scaling scalers, the weight cache, statistics."""

    def __init__(self) -> None:
        self.fwd: DelayedScaler | None = None
        self.bwd: DelayedScaler | None = None
        self.weight_cache: tuple[Operand, Operand] | None = None
        self.group: Any = None
        self.calls = 0
        self.stats: dict | None = None
        self.key: tuple | None = None
        # kind -> hook(x, k_axis, seed): a sequence-parallel gather quantizes per shard (module/_tp_nvfp4.py)
        self.shard_hooks: dict = {}
        self.custom: tuple[list, list] | None = None  # CustomRecipe: (forward, backward) slot quantizers

    def ensure(self, recipe: Recipe, group: Any = None, owner: str = "module") -> None:
        """Delayed-scaling state for ``recipe``: created once, then carried over to a new
        DelayedScaling recipe as TE's ``set_meta_tensor`` does (scale kept, history cut or padded),
        and registered in TE's global buffer under the recipe and group."""
        if not isinstance(recipe, DelayedScaling):
            return
        if self.fwd is None:
            self.fwd = DelayedScaler(recipe, n=3, forward=True)
            self.bwd = DelayedScaler(recipe, n=2, forward=False)
        elif self.fwd.recipe == recipe and self.key == (repr(recipe), id(group)):
            if self.__dict__.get("copied_registered"):  # TE: the copied buffer key keeps the copy out
                self.copied_registered = False
                warnings.warn(
                    STALE_COPY_QUIRK.format(module=owner),
                    UpstreamQuirkWarning,
                    stacklevel=2,
                )
            return
        elif self.fwd.recipe != recipe:
            self.fwd.set_recipe(recipe)
            self.bwd.set_recipe(recipe)
        self.key = (repr(recipe), id(group))
        add_fp8_tensors_to_global_buffer(self.fwd, self.bwd, recipe, group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy and unpickling come through here: a copy of a registered state keeps its key
        # (TE: fp8_meta's buffer key), so it is never registered itself (STALE_COPY_QUIRK)
        self.__dict__.update(state)
        self.copied_registered = self.key is not None and self.fwd is not None

    @staticmethod
    def _per_tensor(recipe: Recipe) -> bool:
        return isinstance(recipe, PER_TENSOR)

    def _quantize(self, x: torch.Tensor, recipe: Recipe, kind: str, k_axis: int) -> Operand:
        self.calls += 1
        hook = self.__dict__.get("shard_hooks", {}).get(kind)  # a state unpickled from before has none
        if hook is not None:
            return hook(x, k_axis, self.calls)
        if isinstance(recipe, CustomRecipe):
            from ._custom import custom_operand

            fwd, bwd = self.custom
            return custom_operand(bwd[0] if kind == "grad" else fwd[0 if kind == "input" else 1], x, k_axis)
        scaler = self.bwd if kind == "grad" else self.fwd
        index = {"input": 0, "weight": 1, "grad": 0}[kind]
        return quantize_operand(x, recipe, kind, k_axis, scaler=scaler, index=index, seed=self.calls, stats=self.stats)

    def _weight_operands(self, w: torch.Tensor, recipe: Recipe, is_first_microbatch: bool | None) -> tuple:
        if is_first_microbatch is False and self.weight_cache is not None:
            return self.weight_cache  # TE reuses the cached FP8 weight and its old scale_inv
        if is_fp8_weight(w):  # an FP8 primary weight: its own codes and scale(s)
            if self._per_tensor(recipe):
                op = operand_from_fp8_weight(w)
                return op, op
            if type(w).__name__ == "MXFP8Tensor" and w._rowwise_data is None and w._columnwise_data is not None:
                raise RuntimeError(_ROWWISE_MISSING)
            row, col = block_operands_from_fp8_weight(w)  # no columnwise copy: None (base._linear asks for it)
            if col is None and self.dgrad_weight_in_backward(w):
                col = _ColumnwiseInBackward(w)
            return row, col
        row = self._quantize(w, recipe, "weight", 1)
        col = row if self._per_tensor(recipe) else self._quantize(w, recipe, "weight", 0)
        if is_first_microbatch is not None:
            self.weight_cache = (row, col)
        return row, col

    @staticmethod
    def dgrad_weight_in_backward(w: Any) -> bool:
        """Whether ``w`` is an FSDP2-gathered weight whose columnwise (dgrad) copy FSDP2 gathers in the
        backward (MXFP8 resharded after forward, ``tensor/_fsdp2_block.py``): TE ``linear.py`` asks for it
        there (``weight_fp8.update_usage(columnwise_usage=True)`` in backward, line 1051 at d0067d0)."""
        return bool(getattr(getattr(w, "_rowwise_data", None), "_fp8sim_fsdp_columnwise_in_backward", False))

    def _update_forward_scales(self) -> None:
        if self.fwd is not None:
            self.fwd.update(group=self.group)

    def _update_backward_scales(self) -> None:
        if self.bwd is not None:
            self.bwd.update(group=self.group)

    def state(self) -> dict[str, torch.Tensor]:
        if self.fwd is None:
            return {}
        return {
            "fwd_scale": torch.from_numpy(self.fwd.scale.copy()),
            "fwd_amax_history": torch.from_numpy(self.fwd.amax_history.copy()),
            "bwd_scale": torch.from_numpy(self.bwd.scale.copy()),
            "bwd_amax_history": torch.from_numpy(self.bwd.amax_history.copy()),
        }

    def load(self, st: dict[str, torch.Tensor]) -> list[tuple[Any, dict[str, Any]]]:
        """The (scaler, state) pairs to load for a GEMM's saved dict (scalers built as needed); the
        caller loads them all or none (:func:`fp8sim.scaling.delayed.load_state_dicts`)."""
        if not st:
            return []
        hist = st["fwd_amax_history"]
        if len(getattr(hist, "shape", ())) != 2:
            raise ValueError(f"fwd_amax_history must be a 2-d tensor (amax_history_len, 3); got {hist!r:.80}")
        recipe = self.fwd.recipe if self.fwd is not None else DelayedScaling(amax_history_len=int(hist.shape[0]))
        self.ensure(recipe)
        return [
            (self.fwd, {"scale": st["fwd_scale"], "amax_history": st["fwd_amax_history"]}),
            (self.bwd, {"scale": st["bwd_scale"], "amax_history": st["bwd_amax_history"]}),
        ]


class _ColumnwiseInBackward:
    """The dgrad operand of an FSDP2-managed MXFP8 weight, read from the parameter when the backward
    calls it: FSDP2's backward gather has then put the columnwise codes and scales into the same tensor
    object the forward saw (its forward gather carried the rowwise copy only, as TE's does)."""

    def __init__(self, weight: Any) -> None:
        self.weight = weight

    def __call__(self) -> Operand:
        w = self.weight
        if w._columnwise_data is None:
            raise RuntimeError("Requested column-wise usage, but MXFP8Tensor is missing column-scaled FP8 data")
        col = w.quantized_data(columnwise=True)
        return Operand(torch.from_numpy(col.dequantize()), col.fmt, qt=col)  # as block_operands_from_fp8_weight


class _ScalingMeta:
    """``fp8_meta["scaling_fwd"]``: ``scale``, ``amax_history`` and ``scale_inv`` (float32 tensors)."""

    def __init__(self, scale: torch.Tensor, amax_history: torch.Tensor) -> None:
        self.scale, self.amax_history = scale, amax_history

    @property
    def scale_inv(self) -> torch.Tensor:
        return torch.reciprocal(self.scale)
