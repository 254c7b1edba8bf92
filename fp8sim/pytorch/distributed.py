"""TE ``transformer_engine/pytorch/distributed.py``, single process: activation ``checkpoint``.

TE's ``checkpoint`` of a function with TE modules replays the forward in the backward pass with the
forward's FP8 state (recipe, scales, RNG), so the replay reproduces the forward exactly.  fp8sim keeps
the activations instead of recomputing them: outputs and gradients are those of TE, only the memory
trade is not emulated.  A module without TE modules goes to ``torch.utils.checkpoint`` as in TE.
Multi-process tensor parallelism (``distribute_saved_activations``) is the distributed emulation's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["checkpoint", "has_te_modules"]


def has_te_modules(network: Any) -> bool:
    """TE: a ``torch.nn.Module`` holds an fp8sim TE module; any other callable is assumed to."""
    from .module.base import TransformerEngineBaseModule

    if isinstance(network, torch.nn.Module):
        return any(isinstance(m, TransformerEngineBaseModule) for m in network.modules())
    return True


def _is_group_or_none(obj: Any) -> bool:
    if obj is None:
        return True
    group = getattr(torch.distributed, "ProcessGroup", None)
    return group is not None and isinstance(obj, group)


def checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """TE ``checkpoint(function, *args, distribute_saved_activations=False, get_rng_state_tracker=None,
    tp_group=None, use_reentrant=True, **kwargs)``: ``function(*args, **kwargs)``, TE's results."""
    use_reentrant = kwargs.pop("use_reentrant", True)
    distribute_saved_activations = kwargs.pop("distribute_saved_activations", False)
    kwargs.pop("tp_group", None)
    kwargs.pop("get_rng_state_tracker", None)
    # TE's backward compatibility: (distribute_saved_activations, get_rng_state_tracker, tp_group, *tensors)
    if len(args) > 3 and isinstance(args[0], bool) and callable(args[1]) and _is_group_or_none(args[2]):
        warnings.warn(
            "Passing non-tensor non-keyword arguments is deprecated and support will be removed in "
            "future releases of TransformerEngine. `distribute_saved_activations`, `tp_group`, and "
            "`get_rng_state_tracker` must be passed as keyword arguments to `checkpoint`.",
            DeprecationWarning,
            stacklevel=2,
        )
        distribute_saved_activations = args[0]
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
    if use_reentrant and distribute_saved_activations and not torch.distributed.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized. Call "
            "torch.distributed.init_process_group() before using "
            "distribute_saved_activations=True."
        )
    if context_fn is None:
        return function(*args, **kwargs)
    forward_ctx, _ = context_fn()
    with forward_ctx:
        return function(*args, **kwargs)
