"""Base classes of TE's fusible operations (TE 2.20.0.dev0 ``pytorch/ops/op.py``).

A :class:`BasicOperation` holds parameters and quantization state (one recipe state per direction,
:mod:`fp8sim.pytorch.ops._recipe_state`) and defines ``op_forward`` / ``op_backward``; a
:class:`FusedOperation` runs a run of basic ops as one (it owns no state).  The
:class:`~fp8sim.pytorch.ops.fuser.OperationFuser` calls ``fuser_forward`` / ``fuser_backward``, passing each
op the input quantizer of the op after it and the grad-output quantizer of the op before it, so that a
producer writes its output already quantized (TE's fused kernels).

Calling an op directly (``op(x)``) runs it through a one-op fuser, as TE does; ``ops/fuser.py`` hands
that fuser in when it is imported (``ops/__init__`` imports it), so this module does not import it back.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ...recipe import Recipe
from ..quantization import FP8GlobalStateManager, add_fp8_tensors_to_global_buffer
from ..tensor import QuantizerRole
from ._extra_state import load_op_extra_state, op_extra_state
from ._recipe_state import OpRecipeState

__all__ = ["OperationContext", "FusibleOperation", "BasicOperation", "FusedOperation"]

# ``OperationFuser`` (set by ops/fuser.py at import): what ``op(x)`` runs through
_FUSER: dict[str, Callable[..., Any]] = {}


def _run_in_fuser(ops: list, *args: Any, **kwargs: Any) -> Any:
    return _FUSER["cls"](ops)(*args, **kwargs)


@dataclasses.dataclass
class OperationContext:
    """What an op keeps from its forward for its backward (TE ``OperationContext``)."""

    saved_tensors: tuple | None = None
    to_save: tuple | None = None
    _saved_tensors_range: tuple[int, int] | None = None
    requires_grad: bool = True

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        """Tensors the backward reads back as ``saved_tensors`` (call it in the forward)."""
        self.to_save = tensors


class FusibleOperation(torch.nn.Module, metaclass=abc.ABCMeta):
    """A tensor operation the operation fuser runs (TE ``FusibleOperation``)."""

    @property
    @abc.abstractmethod
    def is_fused_op(self) -> bool:
        """Whether this op fuses one or more basic ops."""

    def pre_first_fuser_forward(self) -> None:
        """Called before the first fuser forward (deferred parameter initialisation)."""

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:  # noqa: ARG002 - TE's signature
        """Called before every fuser forward (quantizer usages)."""

    def get_input_quantizer(self) -> Any:
        """The quantizer the previous op may write its output with."""
        return None

    def get_grad_output_quantizer(self) -> Any:
        """The quantizer the next op may write its grad input with."""
        return None

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: Sequence[Sequence[torch.Tensor | None]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, Sequence[Sequence[torch.Tensor | None]]]:
        """Forward of this op for the fuser: ``(output, extra outputs per basic op)``."""
        raise NotImplementedError(f"Forward pass is not implemented for operation ({self.__class__.__name__})")

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: Sequence[Sequence[torch.Tensor | None]],
    ) -> tuple[torch.Tensor, Sequence[Sequence[torch.Tensor | None]], Sequence[Sequence[torch.Tensor | None]]]:
        """Backward for the fuser: ``(grad input, param grads per basic op, extra-input grads per basic op)``."""
        raise NotImplementedError(f"Backward pass is not implemented for operation ({self.__class__.__name__})")


def _extra_ops_message(op: BasicOperation, method: str) -> str:
    # TE's message has "{self.__class__.__name__}" without the f-prefix: the braces are printed as they are
    return (
        "{self.__class__.__name__} operation has "
        f"{op.num_extra_inputs} extra tensor inputs "
        f"and {op.num_extra_outputs} extra tensor outputs. "
        f"It should override `{method}` instead of `op_{method.split('_')[1]}`."
    )


class BasicOperation(FusibleOperation, metaclass=abc.ABCMeta):
    """A single tensor operation: parameters, quantizers and ``op_forward`` / ``op_backward``
    (TE ``BasicOperation``).  Extra tensor inputs and outputs (``num_extra_inputs`` /
    ``num_extra_outputs``) are public, or bound to named channels inside one fuser."""

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0

    def __init__(self) -> None:
        super().__init__()
        self._extra_input_channels: list[str | None] = [None] * self.num_extra_inputs
        self._extra_output_channels: list[str | None] = [None] * self.num_extra_outputs
        self._extra_output_to_caller: list[bool] = [True] * self.num_extra_outputs
        self._extra_tensor_channels_locked = False
        self._fp8_metas: dict[str, Any] | None = None
        self._quantizers: dict[str, list] | None = None

    # -- extra-tensor channels -------------------------------------------------------------------
    def _lock_extra_tensor_channels(self) -> None:
        self._extra_tensor_channels_locked = True

    def _check_extra_tensor_channels_unlocked(self) -> None:
        if self._extra_tensor_channels_locked:
            raise RuntimeError(
                f"Cannot change extra tensor channels of {type(self).__name__} because an "
                "OperationFuser has already captured its channel routing. Construct new "
                "operations, bind their channels, and build a new OperationFuser or Sequential."
            )

    def set_extra_input_channel(self, index: int, channel: str | None) -> BasicOperation:
        """Take extra input ``index`` from the earlier op whose extra output is bound to ``channel``
        (None: a public input again).  Bind before any fuser captures the op (``op(x)`` included)."""
        if not 0 <= index < self.num_extra_inputs:
            raise IndexError(
                f"Extra input index {index} is out of range for "
                f"{type(self).__name__} with {self.num_extra_inputs} extra inputs"
            )
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise ValueError("Extra input channel must be a non-empty string or None")
        self._check_extra_tensor_channels_unlocked()
        self._extra_input_channels[index] = channel
        return self

    def set_extra_output_channel(
        self, index: int, channel: str | None, *, output_to_caller: bool = True
    ) -> BasicOperation:
        """Bind extra output ``index`` to ``channel`` for later ops; ``output_to_caller=False`` keeps it
        inside the fuser (None: a public output again)."""
        if not 0 <= index < self.num_extra_outputs:
            raise IndexError(
                f"Extra output index {index} is out of range for "
                f"{type(self).__name__} with {self.num_extra_outputs} extra outputs"
            )
        if channel is not None and (not isinstance(channel, str) or not channel):
            raise ValueError("Extra output channel must be a non-empty string or None")
        if not isinstance(output_to_caller, bool):
            raise TypeError("output_to_caller must be a bool")
        if channel is None:
            output_to_caller = True
        self._check_extra_tensor_channels_unlocked()
        self._extra_output_channels[index] = channel
        self._extra_output_to_caller[index] = output_to_caller
        return self

    @property
    def is_fused_op(self) -> bool:
        return False

    # -- quantizers --------------------------------------------------------------------------------
    def num_quantizers(self, mode: str) -> int:  # noqa: ARG002 - TE's signature
        """Quantized tensors this op uses in ``mode`` ("forward" or "backward")."""
        return 0

    def get_quantizer_roles(self, mode: str) -> list[QuantizerRole] | None:  # noqa: ARG002
        """One :class:`QuantizerRole` per quantizer of ``mode``, or None (positional roles)."""
        return None

    def get_input_quantizer(self) -> Any:
        return self.get_quantizer("forward", 0) if self.num_quantizers("forward") > 0 else None

    def get_grad_output_quantizer(self) -> Any:
        return self.get_quantizer("backward", 0) if self.num_quantizers("backward") > 0 else None

    def get_quantizer(self, mode: str, index: int) -> Any:
        """Quantizer ``index`` of ``mode`` (None before a recipe state exists)."""
        if self._quantizers is None:
            return None
        return self._quantizers[mode][index]

    def _state(self, mode: str) -> OpRecipeState | None:
        meta = None if self._fp8_metas is None else self._fp8_metas.get(mode)
        if meta is None:
            return None
        return meta[FP8GlobalStateManager.get_meta_tensor_key(forward=mode == "forward")]

    def reset_recipe_state(self, *, recipe: Recipe | None) -> None:
        """Build the recipe state (TE: only when the recipe class changed; a new DelayedScaling keeps the
        scales and cuts or pads the amax history), then register delayed-scaling state in the global
        buffers inside FP8 autocast."""
        if recipe is None:
            self._fp8_metas = self._quantizers = None
            return
        group = FP8GlobalStateManager.get_fp8_group()
        states = [self._state(m) for m in ("forward", "backward")] if self._fp8_metas is not None else []
        fresh = self._quantizers is None or self._fp8_metas is None
        fresh = fresh or any(s is not None and not isinstance(recipe, type(s.recipe)) for s in states)
        if fresh:
            self._fp8_metas = {"forward": None, "backward": None}
            self._quantizers = {"forward": [], "backward": []}
            for mode in ("forward", "backward"):
                n = self.num_quantizers(mode)
                if n == 0:
                    continue
                roles = self.get_quantizer_roles(mode)
                if roles is not None and len(roles) != n:
                    raise AssertionError(f"Recipe roles must match number of quantizers ({len(roles)=} vs {n=})")
                state = OpRecipeState(recipe, mode=mode, num_quantizers=n, roles=roles)
                key = FP8GlobalStateManager.get_meta_tensor_key(forward=mode == "forward")
                self._fp8_metas[mode] = {key: state, "recipe": recipe, "fp8_group": group}
                self._quantizers[mode] = state.make_quantizers()
        else:
            for mode in ("forward", "backward"):
                state = self._state(mode)
                if state is None:
                    continue
                self._fp8_metas[mode]["recipe"], self._fp8_metas[mode]["fp8_group"] = recipe, group
                if recipe.delayed() and state.set_recipe(recipe):
                    self._quantizers[mode] = state.make_quantizers()  # new amax pointers, as TE
        if FP8GlobalStateManager.is_fp8_enabled() and not FP8GlobalStateManager.fp8_graph_capturing():
            fwd, bwd = (getattr(self._state(m), "scaler", None) for m in ("forward", "backward"))
            if fwd is not None or bwd is not None:
                add_fp8_tensors_to_global_buffer(fwd, bwd, recipe, group)

    @torch.no_grad()
    def _save_fp8_metas(self) -> dict[str, Any] | None:
        """Copies of the delayed-scaling ``scale`` and ``amax_history`` (TE, for recomputation)."""
        if self._fp8_metas is None:
            return None
        out: dict[str, Any] = {}
        for mode in ("forward", "backward"):
            state = self._state(mode)
            if state is None:
                continue
            key = FP8GlobalStateManager.get_meta_tensor_key(forward=mode == "forward")
            out[mode] = {}
            if state.scaler is not None:
                out[mode][key] = (state.scale.clone(), state.amax_history.clone())
        return out

    @torch.no_grad()
    def _load_fp8_metas(self, fp8_metas: dict[str, Any] | None) -> None:
        """Load what :meth:`_save_fp8_metas` copied."""
        if (self._fp8_metas is None) != (fp8_metas is None):
            raise AssertionError("Saved FP8 metadata does not match operation's FP8 metadata")
        for mode, saved in (fp8_metas or {}).items():
            state = self._state(mode)
            for _key, (scale, hist) in saved.items():
                state.scale.copy_(scale)
                state.amax_history.copy_(hist)

    # -- forward and backward ----------------------------------------------------------------------
    @abc.abstractmethod
    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Forward pass of the op."""

    @abc.abstractmethod
    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, Iterable]:
        """Backward pass: ``(grad input, param grads)``."""

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: Sequence[Sequence[torch.Tensor | None]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list[tuple]]:
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(_extra_ops_message(self, "fuser_forward"))
        out = self.op_forward(
            basic_op_ctxs[0],
            input_,
            prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
            next_op_input_quantizer=next_op_input_quantizer,
            **basic_op_kwargs[0],
        )
        return out, [()]

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: Sequence[Sequence[torch.Tensor | None]],
    ) -> tuple[torch.Tensor, list, list[tuple]]:
        if self.num_extra_inputs > 0 or self.num_extra_outputs > 0:
            raise RuntimeError(_extra_ops_message(self, "fuser_backward"))
        grad_input, grad_params = self.op_backward(basic_op_ctxs[0], grad_output)
        return grad_input, [grad_params], [()]

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, **kwargs: Any) -> Any:  # noqa: A002
        """Apply the op through a one-op fuser (which locks its extra-tensor channels)."""
        return _run_in_fuser([self], input, *extra_inputs, basic_op_kwargs=[kwargs])

    # -- checkpoints -------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """TE's op extra state: per direction the recipe, the delayed-scaling ``scale`` / ``amax_history``
        and ``extra_fp8_variables``, pickled into a uint8 tensor (empty for stateless recipes)."""
        return op_extra_state(self)

    def set_extra_state(self, state: torch.Tensor | None) -> None:
        """Load :meth:`get_extra_state`'s tensor (a stateful pickle needs TE's
        ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``, as TE)."""
        load_op_extra_state(self, state)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        # the extra state first: quantized parameters are cast with the scales it holds (TE)
        state_dict, prefix = args[0], args[1]
        key = prefix + torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX
        if key in state_dict:
            self.set_extra_state(state_dict[key])
        super()._load_from_state_dict(*args, **kwargs)


class FusedOperation(FusibleOperation):
    """A run of basic ops computed as one (TE ``FusedOperation``); it holds no state of its own."""

    def __init__(self, basic_ops: Iterable[FusibleOperation]) -> None:
        super().__init__()
        self.basic_ops = torch.nn.ModuleList(basic_ops)
        if len(self.basic_ops) == 0:
            raise ValueError(
                "Attempted to construct a fused operation without specifying its corresponding basic operations"
            )

    @property
    def is_fused_op(self) -> bool:
        return True

    def get_input_quantizer(self) -> Any:
        return self.basic_ops[0].get_input_quantizer()

    def get_grad_output_quantizer(self) -> Any:
        return self.basic_ops[-1].get_grad_output_quantizer()

    def pre_first_fuser_forward(self) -> None:
        for op in self.basic_ops:
            op.pre_first_fuser_forward()

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        for op in self.basic_ops:
            op.pre_fuser_forward(requires_grad=requires_grad)

    def forward(
        self,
        input: torch.Tensor,
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: list | None = None,  # noqa: A002
    ) -> Any:
        """Apply the fused op through a one-op fuser."""
        if basic_op_kwargs is None:
            basic_op_kwargs = [{} for _ in self.basic_ops]
        return _run_in_fuser([self], input, *extra_inputs, basic_op_kwargs=basic_op_kwargs)
