"""The operation fuser: one autograd function over a pipeline of fusible ops (TE 2.20.0.dev0
``pytorch/ops/fuser.py``).

The fuser flattens its ops into basic ops, wires their extra-tensor channels, and on each call
(re)builds its fused pipelines when the recipe class, ``backward_override``, the first op that needs a
backward, or a delayed-scaling ``amax_history_len`` changed: every basic op's recipe state is reset, then
the registered fusions run in TE's three passes (joint forward-backward, forward-only, backward-only).
Each forward op gets the next op's input quantizer and the previous op's grad-output quantizer.  The
first FP8 fuser of an autocast region that needs a backward updates the backward delayed-scaling state at
the end of its backward (TE's ``is_first_fp8_module``); the forward state updates when the region exits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ...recipe import DelayedScaling, Recipe
from ..quantization import FP8GlobalStateManager, _register, current_state, reduce_and_update_fp8_tensors
from ..tensor.quantized_tensor import prepare_for_saving, restore_from_saved
from . import op as _op
from .op import BasicOperation, FusedOperation, FusibleOperation, OperationContext

__all__ = [
    "OperationFuser",
    "register_forward_fusion",
    "register_backward_fusion",
    "register_forward_backward_fusion",
]

OperationFusionFunction = Callable[..., list]


def _check_extra_outputs(fuser: OperationFuser, op: Any, idxs: list[int], outs: Sequence) -> None:
    if len(outs) != len(idxs):
        raise RuntimeError(
            f"Expected {type(op).__name__} to generate extra outputs for {len(idxs)} basic operations, "
            f"but got {len(outs)}"
        )
    for idx, ys in zip(idxs, outs, strict=True):
        expected = fuser._basic_ops[idx].num_extra_outputs
        if len(ys) != expected:
            raise RuntimeError(f"Expected op {idx} to generate {expected} extra outputs, but got {len(ys)}")
        for out_idx, y in enumerate(ys):
            if y is not None:
                continue
            if fuser._basic_op_extra_output_to_caller[idx][out_idx]:
                raise RuntimeError(f"Op {idx} extra output {out_idx} is public, but {type(op).__name__} returned None")
            if any(c not in idxs for c in fuser._basic_op_extra_output_consumers[idx][out_idx]):
                raise RuntimeError(
                    f"Op {idx} extra output {out_idx} is required by an operation outside its forward fusion, "
                    f"but {type(op).__name__} returned None"
                )


class _OperationFuserAutogradFunction(torch.autograd.Function):
    """Autograd over the whole pipeline (forward and backward may fuse differently)."""

    @staticmethod
    def forward(
        func_ctx: Any,
        input_: torch.Tensor,
        fuser: OperationFuser,
        basic_op_kwargs: list[dict[str, Any]],
        set_output_requires_grad: bool,
        *params_and_extra_inputs: torch.Tensor,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        n = fuser._num_basic_ops
        ctxs = [OperationContext() for _ in range(n)]
        extra_in = params_and_extra_inputs[len(fuser._flat_basic_op_params) :]
        op_extra_inputs: list[list[torch.Tensor | None]] = [[None] * op.num_extra_inputs for op in fuser._basic_ops]
        for t, (i, j) in zip(extra_in, fuser._external_extra_input_slots, strict=False):
            op_extra_inputs[i][j] = t
        x = input_
        extra_outputs: list[Sequence[torch.Tensor | None] | None] = [None] * n
        for op, idxs in fuser._forward_ops:
            for idx in idxs:
                ctxs[idx].requires_grad = idx >= fuser.first_op_requiring_backward
                for j, source in enumerate(fuser._basic_op_extra_input_sources[idx]):
                    if source is not None and source[0] not in idxs:  # a fused producer wires its own channel
                        op_extra_inputs[idx][j] = extra_outputs[source[0]][source[1]]
            first, last = idxs[0], idxs[-1]
            prev_q = fuser._basic_ops[first - 1].get_grad_output_quantizer() if first > 0 else None
            next_q = fuser._basic_ops[last + 1].get_input_quantizer() if last + 1 < n else None
            x, outs = op.fuser_forward(
                [ctxs[i] for i in idxs],
                x,
                basic_op_extra_inputs=[op_extra_inputs[i] for i in idxs],
                prev_op_grad_output_quantizer=prev_q,
                next_op_input_quantizer=next_q,
                basic_op_kwargs=[basic_op_kwargs[i] for i in idxs],
            )
            _check_extra_outputs(fuser, op, idxs, outs)
            for idx, ys in zip(idxs, outs, strict=True):
                for y in ys:
                    if y is not None and set_output_requires_grad and idx >= fuser.first_op_requiring_backward:
                        if y.is_floating_point():
                            y.requires_grad_(True)
                extra_outputs[idx] = ys
        public = [extra_outputs[i][j] for i, j in fuser._public_extra_output_slots]

        if func_ctx is not None:
            to_save: list[Any] = []
            for c in ctxs:
                start = len(to_save)
                to_save.extend(c.to_save or ())
                c.to_save, c._saved_tensors_range = None, (start, len(to_save))
            # TE fuser.py 226-228: storages give their buffers to save_for_backward, the objects stay on the ctx
            tensors_to_save, func_ctx.tensor_objects = prepare_for_saving(*to_save)
            func_ctx.save_for_backward(*tensors_to_save)
            st = current_state()
            first_module = False
            if fuser.first_op_requiring_backward < n and st.enabled:
                first_module = _register(fuser, True)
            func_ctx.region = st.modules
            func_ctx.fuser, func_ctx.basic_op_ctxs = fuser, ctxs
            func_ctx.backward_ops, func_ctx.basic_ops = fuser._backward_ops, fuser._basic_ops
            func_ctx.num_extra_outputs = len(public)
            func_ctx.is_first_module = first_module
        for t in itertools.chain((x,), (y for ys in extra_outputs if ys for y in ys if y is not None)):
            t._do_not_clear = True
        if set_output_requires_grad:
            x.requires_grad_(fuser.first_op_requiring_backward < n)
        return (x, *public) if public else x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(func_ctx: Any, grad_output: torch.Tensor, *grad_extra_outputs: torch.Tensor) -> tuple:
        fuser: OperationFuser = func_ctx.fuser
        ctxs, basic_ops = func_ctx.basic_op_ctxs, func_ctx.basic_ops
        saved = restore_from_saved(func_ctx.tensor_objects, list(func_ctx.saved_tensors))
        for c in ctxs:
            c.saved_tensors = tuple(saved[slice(*c._saved_tensors_range)])
            c._saved_tensors_range = None
        if len(grad_extra_outputs) != func_ctx.num_extra_outputs:
            raise ValueError(
                f"Expected grads for {func_ctx.num_extra_outputs} extra tensor outputs, "
                f"but got {len(grad_extra_outputs)}"
            )
        grads_out: list[list[torch.Tensor | None]] = [[None] * op.num_extra_outputs for op in basic_ops]
        for g, (i, j) in zip(grad_extra_outputs, fuser._public_extra_output_slots, strict=True):
            grads_out[i][j] = g
        dx = grad_output
        grad_params: list[Any] = [None] * len(basic_ops)
        grad_extra_inputs: list[Any] = [None] * len(basic_ops)
        channel_grads: dict[str, torch.Tensor] = {}
        for op, idxs in reversed(func_ctx.backward_ops):
            if all(not ctxs[i].requires_grad for i in idxs):
                dx = None
                break
            for idx in idxs:  # a channel's gradient sums its consumers' contributions
                for j, channel in enumerate(fuser._basic_op_extra_output_channels[idx]):
                    g = channel_grads.get(channel) if fuser._basic_op_extra_output_consumers[idx][j] else None
                    if g is not None:
                        grads_out[idx][j] = g if grads_out[idx][j] is None else grads_out[idx][j] + g
            dx, op_grad_params, op_grad_extra = op.fuser_backward(
                [ctxs[i] for i in idxs], dx, basic_op_grad_extra_outputs=[grads_out[i] for i in idxs]
            )
            for idx, dparams in zip(idxs, op_grad_params, strict=True):
                grad_params[idx] = dparams
                ctxs[idx].saved_tensors = None
            for idx, dxs in zip(idxs, op_grad_extra, strict=True):
                grad_extra_inputs[idx] = dxs
                for j, g in enumerate(dxs):
                    source = fuser._basic_op_extra_input_sources[idx][j]
                    if source is None or g is None or source[0] in idxs:
                        continue
                    channel = fuser._basic_op_extra_output_channels[source[0]][source[1]]
                    prev = channel_grads.get(channel)
                    channel_grads[channel] = g if prev is None else prev + g
        flat_params: list[Any] = []
        for idx, dparams in enumerate(grad_params):
            count = fuser._basic_op_num_params[idx]
            dparams = [None] * count if dparams is None else list(dparams)
            if len(dparams) != count:
                raise RuntimeError(f"Expected op {idx} to generate {count} param grads, but got {len(dparams)}")
            flat_params.extend(dparams)
        for idx, dxs in enumerate(grad_extra_inputs):
            count = basic_ops[idx].num_extra_inputs
            if dxs is None:
                grad_extra_inputs[idx] = (None,) * count
            elif len(dxs) != count:
                raise RuntimeError(f"Expected op {idx} to generate grads for {count} extra inputs, but got {len(dxs)}")
        flat_extra = [grad_extra_inputs[i][j] for i, j in fuser._external_extra_input_slots]
        if func_ctx.is_first_module and not FP8GlobalStateManager.fp8_graph_capturing():
            reduce_and_update_fp8_tensors(forward=False, token=func_ctx.region)
        return (dx, None, None, None, *flat_params, *flat_extra)


class OperationFuser:
    """Forward and backward of a pipeline of fusible ops (TE ``OperationFuser``)."""

    forward_backward_fusion_functions: list[OperationFusionFunction] = []
    forward_fusion_functions: list[OperationFusionFunction] = []
    backward_fusion_functions: list[OperationFusionFunction] = []
    _te_global_buffer = True  # its delayed-scaling state lives in TE's global buffers (quantization.py)

    def __init__(self, ops: list[FusibleOperation]) -> None:
        basic_ops: list[BasicOperation] = []
        for op in ops:
            basic_ops.extend(op.basic_ops if op.is_fused_op else [op])
        self._num_basic_ops = len(basic_ops)
        self._basic_ops = basic_ops
        self._basic_op_num_extra_inputs = [op.num_extra_inputs for op in basic_ops]
        self._basic_op_extra_input_sources: list[list[tuple[int, int] | None]] = [
            [None] * op.num_extra_inputs for op in basic_ops
        ]
        self._basic_op_extra_output_channels = [list(op._extra_output_channels) for op in basic_ops]
        self._basic_op_extra_output_to_caller = [list(op._extra_output_to_caller) for op in basic_ops]
        self._basic_op_extra_output_consumers: list[list[list[int]]] = [
            [[] for _ in range(op.num_extra_outputs)] for op in basic_ops
        ]
        self._external_extra_input_slots: list[tuple[int, int]] = []
        self._public_extra_output_slots: list[tuple[int, int]] = []
        self._wire_channels()
        self.num_extra_inputs = len(self._external_extra_input_slots)
        for op in basic_ops:
            op._lock_extra_tensor_channels()
        self._forward_ops: list[tuple[FusibleOperation, list[int]]] = []
        self._backward_ops: list[tuple[FusibleOperation, list[int]]] = []
        self.recipe_type: type | None = None
        self.first_op_requiring_backward = 0
        self.backward_override: str | None = None
        self._last_amax_history_len = 0
        self._basic_op_params = [list(op.parameters()) for op in basic_ops]
        self._basic_op_num_params = [len(p) for p in self._basic_op_params]
        self._flat_basic_op_params = [p for ps in self._basic_op_params for p in ps]

    def _wire_channels(self) -> None:
        ops = self._basic_ops
        producers: dict[str, tuple[int, int]] = {}
        for i, channels in enumerate(self._basic_op_extra_output_channels):
            for j, channel in enumerate(channels):
                if channel is None:
                    continue
                if channel in producers:
                    raise ValueError(
                        f"Extra tensor channel {channel!r} has multiple producers (ops {producers[channel][0]} and {i})"
                    )
                producers[channel] = (i, j)
        for i, op in enumerate(ops):
            for j, channel in enumerate(op._extra_input_channels):
                if channel is None:
                    self._external_extra_input_slots.append((i, j))
                    continue
                source = producers.get(channel)
                if source is None:
                    raise ValueError(
                        f"Extra tensor channel {channel!r} consumed by op {i} ({type(op).__name__}) has no producer"
                    )
                if source[0] >= i:
                    raise ValueError(
                        f"Extra tensor channel {channel!r} consumed by op {i} ({type(op).__name__}) "
                        "has no earlier producer"
                    )
                self._basic_op_extra_input_sources[i][j] = source
                self._basic_op_extra_output_consumers[source[0]][source[1]].append(i)
        for i, op in enumerate(ops):
            for j in range(op.num_extra_outputs):
                if self._basic_op_extra_output_to_caller[i][j]:
                    self._public_extra_output_slots.append((i, j))

    @staticmethod
    def _apply_fusions(ops: Iterable[FusibleOperation], funcs: Iterable[OperationFusionFunction], recipe: Any) -> list:
        out = list(ops)
        for func in funcs:
            out = func(out, recipe=recipe)
        return out

    @staticmethod
    def _map_to_basic_ops(fused_ops: Sequence[FusibleOperation], basic_ops: Sequence[BasicOperation]) -> list:
        """Each (maybe fused) op with the indices of the basic ops it covers; they must cover ``basic_ops`` in order."""

        def mismatch() -> RuntimeError:
            return RuntimeError(
                "Found mismatch after fusing operations "
                f"(basic_ops={[o.__class__.__name__ for o in basic_ops]}, "
                f"fused_ops={[o.__class__.__name__ for o in fused_ops]})"
            )

        out, idx = [], 0
        for op in fused_ops:
            covered = list(op.basic_ops) if isinstance(op, FusedOperation) else [op]
            idxs = []
            for b in covered:
                if idx >= len(basic_ops) or b is not basic_ops[idx]:
                    raise mismatch()
                idxs.append(idx)
                idx += 1
            out.append((op, idxs))
        if idx != len(basic_ops):
            raise mismatch()
        return out

    def maybe_fuse_ops(
        self, is_grad_enabled: bool, recipe: Recipe | None, input_: torch.Tensor, extra_inputs: list
    ) -> None:
        """Reset recipe states and fuse again when the fusion parameters changed."""
        n = self._num_basic_ops
        first = n
        if is_grad_enabled and input_.requires_grad:
            first = 0
        elif is_grad_enabled:
            for i in range(n):
                tensors = itertools.chain(self._basic_op_params[i], extra_inputs[i])
                if any(t is not None and t.requires_grad for t in tensors):
                    first = i
                    break
        override = recipe.backward_override if recipe is not None else None
        params = (type(recipe), first, override)
        stale = params != (self.recipe_type, self.first_op_requiring_backward, self.backward_override)
        if not stale and not (recipe is not None and recipe.delayed()):
            return
        if not stale and self._last_amax_history_len == recipe.amax_history_len:
            return
        for op in self._basic_ops:
            op.reset_recipe_state(recipe=recipe)
        if self.recipe_type is None:
            for op in self._basic_ops:
                op.pre_first_fuser_forward()
        joint = self._apply_fusions(self._basic_ops, OperationFuser.forward_backward_fusion_functions, recipe)
        fwd = self._apply_fusions(joint, OperationFuser.forward_fusion_functions, recipe)
        bwd = self._apply_fusions(joint, OperationFuser.backward_fusion_functions, recipe)
        self._forward_ops = self._map_to_basic_ops(fwd, self._basic_ops)
        self._backward_ops = self._map_to_basic_ops(bwd, self._basic_ops)
        self.recipe_type, self.first_op_requiring_backward, self.backward_override = params
        self._last_amax_history_len = recipe.amax_history_len if isinstance(recipe, DelayedScaling) else 0

    def __call__(
        self,
        input: torch.Tensor,
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: list | None = None,  # noqa: A002
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"Expected {self.num_extra_inputs} extra inputs but got {len(extra_inputs)}")
        if basic_op_kwargs is None:
            basic_op_kwargs = [{}] * self._num_basic_ops
        slots: list[list[torch.Tensor | None]] = [[None] * op.num_extra_inputs for op in self._basic_ops]
        for t, (i, j) in zip(extra_inputs, self._external_extra_input_slots, strict=True):
            slots[i][j] = t
        recipe = FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.is_fp8_enabled() else None
        grad = torch.is_grad_enabled()
        self.maybe_fuse_ops(grad, recipe, input, slots)
        for i, op in enumerate(self._basic_ops):
            op.pre_fuser_forward(requires_grad=i >= self.first_op_requiring_backward)
        args = (input, self, basic_op_kwargs, grad, *self._flat_basic_op_params, *extra_inputs)
        if not grad:  # inner ops may see non-leaf tensors: no requires_grad flags set
            return _OperationFuserAutogradFunction.forward(None, *args)
        return _OperationFuserAutogradFunction.apply(*args)


def register_forward_backward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Register a joint fusion ``func(ops, *, recipe) -> ops``: its fused op implements both passes,
    equivalent only as a pair.  Joint fusions run before the forward-only and backward-only passes."""
    _register_fusion(OperationFuser.forward_backward_fusion_functions, op_fusion_func, prepend)


def register_forward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Register a forward-only fusion ``func(ops, *, recipe) -> ops``: its forward must be interchangeable
    with the basic ops' (it saves what their backward reads)."""
    _register_fusion(OperationFuser.forward_fusion_functions, op_fusion_func, prepend)


def register_backward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Register a backward-only fusion ``func(ops, *, recipe) -> ops``: its backward must read what the
    basic ops' forward saved."""
    _register_fusion(OperationFuser.backward_fusion_functions, op_fusion_func, prepend)


def _register_fusion(funcs: list, func: OperationFusionFunction, prepend: bool) -> None:
    if prepend:
        funcs.insert(0, func)
    else:
        funcs.append(func)


_op._FUSER["cls"] = OperationFuser
