"""``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)).prepare(model, optimizer)``'s
FP8 steps on CPU processes (accelerate 1.15 ``accelerator.py`` ``_prepare_ao``, ``_prepare_fsdp2``;
``utils/fsdp_utils.py`` ``fsdp2_prepare_model``).

accelerate shards a model with FSDP2 only on accelerator devices: on CPU ranks (``MULTI_CPU``) its
state ignores the plugin and ``prepare`` wraps the model in DDP.  :func:`prepare_fsdp2` replays
the accelerator path on any device:

* torchao backend: the Linears become fp8sim ``Float8Linear``; with
  ``AORecipeKwargs(config).enable_fsdp_float8_all_gather`` the optimizer gets accelerate's step
  post-hook ``precompute_float8_dynamic_scale_for_fsdp(model)`` (fp8sim's);
* the plugin's mixed precision is set as ``AcceleratorState`` does (``fp8`` gives a bf16
  ``MixedPrecisionPolicy``), then accelerate's own ``fsdp2_prepare_model`` applies ``fully_shard``
  (auto-wrap policy, then the root), and the optimizer's parameters are replaced by the sharded ones;
* no autocast wraps ``forward``: accelerate prepares an FSDP2 model without ``prepare_model``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["prepare_fsdp2", "check_fsdp_plugin"]

_log = logging.getLogger(__name__)


def check_fsdp_plugin(plugin: Any, optimizer: Any) -> None:
    """accelerate's refusals, in its words: FSDP1 is not emulated; FSDP2 needs the optimizer."""
    version = getattr(plugin, "fsdp_version", None)
    if version != 2:
        raise NotImplementedError(
            f"fsdp_plugin with fsdp_version={version!r}: fp8sim emulates FSDP2 only "
            "(FullyShardedDataParallelPlugin(fsdp_version=2))"
        )
    if optimizer is None:
        raise ValueError(
            "When using FSDP2, a model and optimizer must be passed together to `Accelerator.prepare()`"
            " as the optimizer needs to have its parameters modified after the model is converted."
        )


def register_float8_scale_precompute(model: torch.nn.Module, optimizer: Any, config: Any) -> None:
    """accelerate's ``_prepare_ao``: with float8 all-gather, precompute the weight scales after each step."""
    if not getattr(config, "enable_fsdp_float8_all_gather", False):
        return
    from ..torchao import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda *args, **kwargs: precompute_float8_dynamic_scale_for_fsdp(model))


def prepare_fsdp2(model: torch.nn.Module, optimizer: Any, plugin: Any, mixed_precision: str) -> torch.nn.Module:
    """Shard ``model`` with accelerate's ``fsdp2_prepare_model`` and point ``optimizer`` at the shards."""
    import torch.distributed as dist

    try:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    except ImportError as exc:  # pragma: no cover - the plugin itself comes from accelerate
        raise ImportError("an FSDP2 plugin needs accelerate: pip install accelerate") from exc

    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)  # AcceleratorState: fp8 -> bf16 MixedPrecisionPolicy
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    device = next(model.parameters()).device
    accelerator = SimpleNamespace(  # what fsdp2_prepare_model reads of the Accelerator
        state=SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=None,
        parallelism_config=None,
        mixed_precision=mixed_precision,
        is_main_process=rank == 0,
        device=device,
    )
    if mixed_precision != "no":
        _upcast_trainable_parameters(model, rank == 0)
    # accelerate maps the optimizer's parameters by storage: a float8 all-gather weight is a new
    # Parameter (WeightWithDynamicFloat8CastTensor) over the optimizer's tensor, kept in ``_tensor``
    names = {_storage_ptr(p): n for n, p in model.named_parameters()}
    model = fsdp2_prepare_model(accelerator, model)
    new = dict(model.named_parameters())
    missing = [n for n in names.values() if n not in new]
    if missing:
        raise KeyError(f"Parameters missing after FSDP2 wrapping: {missing}")
    for group in optimizer.param_groups:
        try:
            group["params"] = [new[names[_storage_ptr(p)]] for p in group["params"]]
        except KeyError as exc:  # accelerate's fsdp2_switch_optimizer_parameters refuses the same way
            raise KeyError(
                "A parameter in the optimizer couldn't be switched to its sharded version. This breaks the training. "
                "Please raise an issue on GitHub."
            ) from exc
    return model


def _upcast_trainable_parameters(model: torch.nn.Module, main_process: bool) -> None:
    """``fsdp2_prepare_model``'s upcast under mixed precision (accelerate 1.15, utils/fsdp_utils.py: trainable
    parameters that are not float32 become float32 master weights; none when the model holds bitsandbytes
    ``Params4bit``), done here because accelerate logs it through its logger, which raises without an initialised
    ``PartialState``.  Applied whatever accelerate is installed: the rule is 1.15's, the tests' pinned oracle."""
    params = list(model.named_parameters())
    if any(type(p).__name__ == "Params4bit" for _, p in params):
        return
    upcast = [n for n, p in params if p.requires_grad and p.dtype != torch.float32]
    for name in upcast:
        param = model.get_parameter(name)
        param.data = param.data.to(torch.float32)
    if main_process and upcast:
        _log.info(
            "FSDP2 upcast %d low-precision parameter(s) to float32 (mixed_precision != 'no'): %s", len(upcast), upcast
        )


def _storage_ptr(p: torch.Tensor) -> int:
    return getattr(p, "_tensor", p).data_ptr()
