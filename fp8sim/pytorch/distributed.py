"""TE ``transformer_engine/pytorch/distributed.py``, single process: activation ``checkpoint``.

TE's ``checkpoint`` runs the function without keeping its activations and recomputes the forward in
the backward pass.  Each delayed-scaling GEMM stashes its forward ``scale`` and ``amax_history`` in
the checkpointed forward (``copy_forward_fp8_meta_tensors_for_recompute``), loads the stash for the
recompute (``get_old_fp8_meta_tensors_for_recompute``) and puts the updated state back after it
(``restore_fp8_meta_tensors``), so the recompute casts with the same scales and its amaxes are
dropped.  The CPU (and CUDA) RNG state, and fp8sim's per-GEMM stochastic-rounding counter, are
replayed too.  ``use_reentrant=True`` runs the forward under ``no_grad`` and differentiates the
recompute; ``use_reentrant=False`` keeps the forward's graph and recomputes on the first unpacked
saved tensor (fp8sim's FP8 GEMMs keep their quantized operands on their autograd context, so only
torch ops' saved tensors are traded for compute).  A function without TE modules goes to
``torch.utils.checkpoint`` as in TE.  ``distribute_saved_activations`` only moves memory between
ranks: in one process it is accepted and changes nothing.

TE's public collectives (``_comm``), its ``CudaRNGStatesTracker`` (``_rng_tracker``) and the recompute
markers (``_recompute``, beside the per-GEMM FP8 state replay the modules call there) are re-exported here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ._comm import (
    allreduce,
    gather_along_first_dim,
    gather_split_1d_tensor,
    get_distributed_rank,
    get_distributed_world_size,
    reduce_scatter_along_first_dim,
    set_tensor_model_parallel_attributes,
    split_tensor_into_1d_equal_chunks,
    symmetric_all_reduce,
)
from ._recompute import (
    _amp_contexts,
    _detach,
    _rng_states,
    _set_rng_states,
    activation_recompute_forward,
    in_fp8_activation_recompute_phase,
    is_fp8_activation_recompute_enabled,
)
from ._rng_tracker import (
    CudaRNGStatesTracker,
    get_all_rng_states,
    graph_safe_rng_available,
    initialize_affine_weight_gpu,
    set_all_rng_states,
)
from .quantization import FP8GlobalStateManager, current_state

__all__ = [
    "checkpoint",
    "has_te_modules",
    "activation_recompute_forward",
    "is_fp8_activation_recompute_enabled",
    "in_fp8_activation_recompute_phase",
    "use_reentrant_activation_recompute",
    "get_activation_recompute_contexts",
    "get_distributed_world_size",
    "get_distributed_rank",
    "set_tensor_model_parallel_attributes",
    "initialize_affine_weight_gpu",
    "split_tensor_into_1d_equal_chunks",
    "gather_split_1d_tensor",
    "reduce_scatter_along_first_dim",
    "gather_along_first_dim",
    "allreduce",
    "symmetric_all_reduce",
    "CudaRNGStatesTracker",
    "get_all_rng_states",
    "set_all_rng_states",
    "graph_safe_rng_available",
]
_USE_REENTRANT = {"value": True}


def use_reentrant_activation_recompute() -> bool:
    """TE: the ``use_reentrant`` of the last :func:`checkpoint` call."""
    return _USE_REENTRANT["value"]


def get_activation_recompute_contexts() -> tuple[activation_recompute_forward, activation_recompute_forward]:
    """TE: the contexts of the checkpointed forward and of its recompute."""
    return activation_recompute_forward(True, False), activation_recompute_forward(True, True)


# -- checkpoint ------------------------------------------------------------------------------------
def has_te_modules(network: Any) -> bool:
    """TE: a ``torch.nn.Module`` holds a TE module (LayerNorm, RMSNorm, a GEMM module, attention,
    TransformerLayer); any other callable is assumed to."""
    if isinstance(network, torch.nn.Module):
        return any(isinstance(m, _te_classes()) for m in network.modules())
    return True


def _te_classes() -> tuple[type, ...]:
    from .attention import DotProductAttention, MultiheadAttention
    from .module import LayerNorm, RMSNorm
    from .module.base import TransformerEngineBaseModule
    from .transformer import TransformerLayer

    return (LayerNorm, RMSNorm, TransformerEngineBaseModule, DotProductAttention, MultiheadAttention, TransformerLayer)


def _is_group_or_none(obj: Any) -> bool:
    if obj is None:
        return True
    group = getattr(torch.distributed, "ProcessGroup", None)
    return group is not None and isinstance(obj, group)


def _fp8_region() -> tuple[bool, Any, Any]:
    st = current_state()
    return st.enabled, (FP8GlobalStateManager.get_fp8_recipe() if st.enabled else None), st.accumulator


def _recompute_autocast(fp8: tuple[bool, Any, Any]) -> Any:
    from .quantization import autocast

    return autocast(enabled=fp8[0], recipe=fp8[1], accumulator=fp8[2])


def _noop_context_fn() -> tuple[Any, Any]:
    return contextlib.nullcontext(), contextlib.nullcontext()


class _CheckpointFunction(torch.autograd.Function):
    """TE's reentrant checkpoint: forward without grad, recompute and differentiate in backward."""

    @staticmethod
    def forward(ctx: Any, run_function: Callable, tracker: Any, context_fn: Callable, kwargs: dict, *args: Any) -> Any:
        ctx.run_function, ctx.tracker, ctx.kwargs = run_function, tracker, kwargs
        ctx.rng = _rng_states(tracker)
        forward_ctx, ctx.recompute_ctx = context_fn()
        ctx.amp = _amp_contexts()
        # a checkpoint no backward can reach (no input needs grad) is no recompute region: it keeps an
        # enclosing checkpoint's phase and stashes nothing (TE 2.20, distributed.py:376)
        region = activation_recompute_forward(True, False) if any(ctx.needs_input_grad) else contextlib.nullcontext()
        with torch.no_grad(), forward_ctx, region:
            outputs = run_function(*args, **kwargs)
        ctx.inputs = [None if torch.is_tensor(a) else a for a in args]
        ctx.save_for_backward(*[a if torch.is_tensor(a) else None for a in args])
        ctx.fp8 = _fp8_region()
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("Checkpointing is not compatible with .grad(), please use .backward() if possible")
        inputs = tuple(t if t is not None else a for t, a in zip(ctx.saved_tensors, ctx.inputs, strict=True))
        bwd_rng = _rng_states(ctx.tracker)
        _set_rng_states(ctx.rng, ctx.tracker)
        detached = tuple(_detach(x) for x in inputs)
        with contextlib.ExitStack() as stack:
            for c in (torch.enable_grad(), ctx.recompute_ctx, *ctx.amp, activation_recompute_forward(True, True)):
                stack.enter_context(c)
            stack.enter_context(_recompute_autocast(ctx.fp8))
            outputs = ctx.run_function(*detached, **ctx.kwargs)
        _set_rng_states(bwd_rng, ctx.tracker)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=False) if torch.is_tensor(o) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, None, None) + tuple(x.grad if isinstance(x, torch.Tensor) else None for x in detached)


class _Frame:
    """TE ``_CheckpointFrame``: forward RNG states and the recomputed saved tensors."""

    def __init__(self, recompute_fn: Callable, tracker: Any) -> None:
        self.recompute_fn, self.tracker = recompute_fn, tracker
        self.recomputed: list = []
        self.count = 0
        self.fwd_rng = _rng_states(tracker)


class _RecomputeTrigger(torch.autograd.Function):
    """Saves one empty tensor behind each output, so the non-reentrant recompute starts with the
    function's backward even where fp8sim's FP8 GEMMs save nothing through ``save_for_backward``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.new_empty(0))
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        ctx.saved_tensors  # noqa: B018 -- the unpack runs the recompute
        return grad


def _with_trigger(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return _RecomputeTrigger.apply(out) if out.requires_grad else out
    if isinstance(out, tuple | list):
        return type(out)(_with_trigger(o) for o in out)
    return out


def _non_reentrant(function: Callable, args: tuple, kwargs: dict, tracker: Any, context_fn: Callable) -> Any:
    user_forward_ctx, user_recompute_ctx = context_fn()
    te_forward_ctx, te_recompute_ctx = get_activation_recompute_contexts()
    amp, fp8 = _amp_contexts(), _fp8_region()

    def recompute_fn() -> None:
        with contextlib.ExitStack() as stack:
            for c in (torch.enable_grad(), te_recompute_ctx, user_recompute_ctx, *amp, _recompute_autocast(fp8)):
                stack.enter_context(c)
            _with_trigger(function(*args, **kwargs))

    frame = _Frame(recompute_fn, tracker)

    def _keep(x: torch.Tensor) -> torch.Tensor:  # TE _recomputation_hook: the recompute's saved tensors
        frame.recomputed.append(x.detach())
        return x.detach()

    def pack(x: torch.Tensor) -> int:
        del x
        frame.count += 1
        return frame.count - 1

    def unpack(idx: int) -> torch.Tensor:
        if not frame.recomputed:
            bwd_rng = _rng_states(tracker)
            _set_rng_states(frame.fwd_rng, tracker)
            with torch.autograd.graph.saved_tensors_hooks(_keep, lambda x: x):
                frame.recompute_fn()
            _set_rng_states(bwd_rng, tracker)
        out, frame.recomputed[idx] = frame.recomputed[idx], None
        return out

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), te_forward_ctx, user_forward_ctx:
        return _with_trigger(function(*args, **kwargs))


def checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """TE ``checkpoint(function, *args, distribute_saved_activations=False, get_rng_state_tracker=None,
    tp_group=None, use_reentrant=True, **kwargs)``: ``function(*args, **kwargs)`` with its forward
    recomputed in the backward pass under the forward's FP8 state.  Under ``torch.compile`` it runs
    eagerly behind a graph break (TE decorates it with ``torch._disable_dynamo``)."""
    if torch.compiler.is_compiling():
        import sys

        return sys.modules["torch._dynamo"].disable(_checkpoint, recursive=True)(function, *args, **kwargs)
    return _checkpoint(function, *args, **kwargs)


def _checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    _USE_REENTRANT["value"] = use_reentrant = kwargs.pop("use_reentrant", True)
    distribute_saved_activations = kwargs.pop("distribute_saved_activations", False)
    kwargs.pop("tp_group", None)
    tracker = kwargs.pop("get_rng_state_tracker", None)
    # TE's backward compatibility: (distribute_saved_activations, get_rng_state_tracker, tp_group, *tensors)
    if len(args) > 3 and isinstance(args[0], bool) and callable(args[1]) and _is_group_or_none(args[2]):
        warnings.warn(
            "Passing non-tensor non-keyword arguments is deprecated and support will be removed in "
            "future releases of TransformerEngine. `distribute_saved_activations`, `tp_group`, and "
            "`get_rng_state_tracker` must be passed as keyword arguments to `checkpoint`.",
            DeprecationWarning,
            stacklevel=2,
        )
        distribute_saved_activations, tracker = args[0], args[1]
        args = args[3:]
    context_fn = kwargs.pop("context_fn", None)
    determinism_check = kwargs.pop("determinism_check", "default")
    debug = kwargs.pop("debug", False)
    if not has_te_modules(function):
        extra = {} if context_fn is None else {"context_fn": context_fn}
        return torch.utils.checkpoint.checkpoint(
            function,
            *args,
            use_reentrant=use_reentrant,
            determinism_check=determinism_check,
            debug=debug,
            **extra,
            **kwargs,
        )
    context_fn = context_fn or _noop_context_fn
    if not torch.is_grad_enabled():  # no backward, no recompute: run the function in its forward context
        with context_fn()[0]:  # (TE 2.20, distributed.py:750)
            return function(*args, **kwargs)
    if use_reentrant:
        if distribute_saved_activations and not torch.distributed.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized. Call "
                "torch.distributed.init_process_group() before using "
                "distribute_saved_activations=True."
            )
        return _CheckpointFunction.apply(function, tracker, context_fn, kwargs, *args)
    if distribute_saved_activations:
        warnings.warn(
            "`distribute_saved_activations=True` has no effect when `use_reentrant=False`. "
            "The non-reentrant checkpoint implementation does not manually store forward "
            "inputs for the activation recompute in the backward pass, and instead leverages "
            "the autograd engine's pack/unpack hooks.",
            stacklevel=2,
        )
    return _non_reentrant(function, args, kwargs, tracker, context_fn)
