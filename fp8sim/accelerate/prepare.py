"""``Accelerator(mixed_precision="fp8", kwargs_handlers=[...]).prepare(model, optimizer)`` in one call (spec 7.5).

:func:`setup_fp8` replays ``Accelerator.__init__``'s handler checks and FP8 backend choice;
:func:`prepare_fp8` then converts the model (TE: fp8sim.pytorch modules, optimizer params remapped;
AO: fp8sim.torchao ``Float8Linear``), wraps ``forward`` as accelerate does (FP8 autocast outside the
fp32-outputs wrapper outside bf16 autocast) and, when ``torch.distributed`` runs more than one
process, wraps the model in ``DistributedDataParallel`` with the ``DistributedDataParallelKwargs``.
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch

from . import _available
from ._env import parse_choice_from_env
from ._quirks import use_documented, warn_quirk
from .ao import convert_model_to_fp8_ao
from .handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
)
from .recipes import AORecipeKwargs, FP8BackendType, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from .transformer_engine import apply_fp8_autowrap, convert_model

__all__ = ["FP8Setup", "setup_fp8", "prepare_fp8", "convert_outputs_to_fp32", "ConvertOutputsToFp32", "PRECISION_TYPES"]

PRECISION_TYPES = ["no", "fp8", "fp16", "bf16"]

_HANDLER_ATTRS: dict[type, str] = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
}


@dataclass
class FP8Setup:
    """What the Accelerator would hold: the mixed precision, one handler per slot, and the FP8 backend."""

    mixed_precision: str
    fp8_backend: FP8BackendType
    handlers: dict[str, KwargsHandler] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name in _HANDLER_ATTRS.values():
            return self.__dict__.get("handlers", {}).get(name)
        raise AttributeError(name)

    @property
    def fp8_enabled(self) -> bool:
        return self.mixed_precision == "fp8"


def _backend_from(handlers: dict[str, KwargsHandler], has_fp8_handler: bool) -> FP8BackendType:
    """``Accelerator.fp8_backend``: FP8RecipeKwargs.backend > AO > TE > MS-AMP > ``ACCELERATE_FP8_BACKEND``."""
    if has_fp8_handler:
        if "fp8_recipe_handler" in handlers:
            return FP8BackendType(handlers["fp8_recipe_handler"].backend)
        for attr, backend in (
            ("ao_recipe_handler", FP8BackendType.AO),
            ("te_recipe_handler", FP8BackendType.TE),
            ("msamp_recipe_handler", FP8BackendType.MSAMP),
        ):
            if attr in handlers:
                return backend
    return FP8BackendType(parse_choice_from_env("ACCELERATE_FP8_BACKEND", "NO"))


def setup_fp8(kwargs_handlers: Iterable[KwargsHandler] | None = None, mixed_precision: str | None = "fp8") -> FP8Setup:
    """Replay ``Accelerator(mixed_precision=..., kwargs_handlers=...)``: the same checks, messages and backend.

    ``mixed_precision=None`` reads ``ACCELERATE_MIXED_PRECISION`` (default "no").  Without an FP8
    handler, fp8 takes the backend of ``ACCELERATE_FP8_BACKEND`` or auto-detects torchao, then TE,
    then MS-AMP, fp8sim's emulations counting as installed.
    """
    if mixed_precision is not None:
        mixed_precision = str(mixed_precision)
        if mixed_precision not in PRECISION_TYPES:
            raise ValueError(f"Unknown mixed_precision mode: {mixed_precision}. Choose between {PRECISION_TYPES}")
    handlers: dict[str, KwargsHandler] = {}
    has_fp8_handler = False
    for handler in kwargs_handlers or ():
        if not isinstance(handler, KwargsHandler):  # upstream asserts
            raise AssertionError(
                f"Unsupported kwargs handler passed: {handler}, "
                "must be one that inherits `accelerate.utils.KwargsHandler`."
            )
        attr = _HANDLER_ATTRS[handler.__class__]
        if attr in handlers:
            raise ValueError(f"You can only pass one {handler.__class__} in `kwargs_handlers`.")
        handlers[attr] = handler
        has_fp8_handler = has_fp8_handler or "recipe_handler" in attr

    mp = parse_choice_from_env("ACCELERATE_MIXED_PRECISION", "no") if mixed_precision is None else mixed_precision
    mp = mp.lower()
    if mp == "fp8" and not _available.is_fp8_available():
        raise ValueError("Using `fp8` precision requires `transformer_engine` or `MS-AMP` to be installed.")
    if mp == "fp8" and not has_fp8_handler:
        backend = _backend_from(handlers, has_fp8_handler)
        defaults = {
            FP8BackendType.AO: ("ao_recipe_handler", AORecipeKwargs),
            FP8BackendType.TE: ("te_recipe_handler", TERecipeKwargs),
            FP8BackendType.MSAMP: ("msamp_recipe_handler", MSAMPRecipeKwargs),
        }
        if backend == FP8BackendType.NO:
            for available, slot in (
                (_available.is_torchao_available, FP8BackendType.AO),
                (_available.is_transformer_engine_available, FP8BackendType.TE),
                (_available.is_msamp_available, FP8BackendType.MSAMP),
            ):
                if available():
                    backend = slot
                    break
            else:
                raise ImportError(
                    "Tried to train with `fp8` and auto-detect backend, but no FP8-compatible backend was installed. "
                    "Valid backends are: `torchao`, `transformer-engine`, and `msamp`."
                )
        attr, cls = defaults[backend]
        handlers[attr] = cls()
        has_fp8_handler = True
    if has_fp8_handler and mp != "fp8":
        raise ValueError("Passing in an FP8 configuration requires setting `mixed_precision='fp8'`.")
    return FP8Setup(mp, _backend_from(handlers, has_fp8_handler), handlers)


def _to_fp32(data: Any) -> Any:
    if isinstance(data, (tuple, list)):
        items = [_to_fp32(o) for o in data]
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
            return type(data)(*items)
        return type(data)(items)
    if isinstance(data, Mapping):
        return type(data)({k: _to_fp32(v) for k, v in data.items()})
    if hasattr(data, "dtype") and data.dtype in (torch.float16, torch.bfloat16):
        return data.float()
    return data


class ConvertOutputsToFp32:
    """Calls ``model_forward`` and converts its fp16/bf16 outputs to fp32; refuses to be pickled, as upstream."""

    def __init__(self, model_forward: Callable) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision, please unwrap the model with "
            "`Accelerator.unwrap_model(model)` before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable) -> Callable:
    """accelerate's decorator: fp16/bf16 tensors in the (nested) outputs come back as fp32."""
    converter = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converter(*args, **kwargs)

    forward.__wrapped__ = converter
    return forward


def _device_of(model: torch.nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _distributed_type(model: torch.nn.Module, setup: FP8Setup) -> str:
    import torch.distributed as dist

    if not dist.is_available():
        return "NO"
    if not dist.is_initialized() and setup.init_handler is not None and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        from .launch import init_process_group

        init_process_group(int(os.environ.get("RANK", 0)), int(os.environ["WORLD_SIZE"]), setup.init_handler)
    if dist.is_initialized() and dist.get_world_size() > 1:
        return "MULTI_GPU" if _device_of(model).type == "cuda" else "MULTI_CPU"
    return "NO"


def _prepare_te(model: torch.nn.Module, optimizer: Any, documented: bool | None) -> None:
    if optimizer is None:
        raise ValueError(
            "You must pass a model and an optimizer together to `accelerate.prepare()` when using TransformerEngine."
        )
    old = dict(model.named_parameters())
    with torch.no_grad():
        convert_model(model, documented=documented)
    new = dict(model.named_parameters())
    mapping = {p: new[n] for n, p in old.items()}
    for group in optimizer.param_groups:
        group["params"] = [mapping[p] for p in group["params"]]


def _wrap_mixed_precision(model: torch.nn.Module, setup: FP8Setup) -> None:
    """``prepare_model``'s native-AMP step: bf16 autocast inside, fp32 outputs outside."""
    autocast_kwargs = setup.autocast_handler.to_kwargs() if setup.autocast_handler is not None else {}
    context = torch.autocast(device_type=_device_of(model).type, dtype=torch.bfloat16, **autocast_kwargs)
    model._original_forward = model.forward
    if setup.fp8_backend == FP8BackendType.MSAMP or not hasattr(model.forward, "__func__"):
        model.forward = convert_outputs_to_fp32(context(model.forward))
    else:
        model.forward = MethodType(context(model.forward.__func__), model)
        model.forward = MethodType(convert_outputs_to_fp32(model.forward.__func__), model)


def _converted_weights_and_the_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, before: dict[str, Any], documented: bool | None
) -> None:
    """Quirk ``ao-converted-weights-not-in-optimizer`` (accelerator.py ``_prepare_ao``: no re-pointing
    outside FSDP2): warn, or with ``documented`` hand the optimizer the converted Parameters."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    swaps = {
        id(old): new
        for name, new in model.named_parameters()
        if (old := before.get(name)) is not None and old is not new and id(old) in held
    }
    if not swaps:
        return
    if not use_documented(documented):
        warn_quirk(
            "ao-converted-weights-not-in-optimizer",
            f"{len(swaps)} converted weight(s) are Parameters the optimizer does not hold and stay at their initial "
            "values",
            stacklevel=4,
        )
        return
    for group in optimizer.param_groups:
        group["params"] = [swaps.get(id(p), p) for p in group["params"]]
    for p in [p for p in optimizer.state if id(p) in swaps]:
        optimizer.state[swaps[id(p)]] = optimizer.state.pop(p)


def prepare_fp8(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    kwargs_handlers: Iterable[KwargsHandler] | None = None,
    mixed_precision: str | None = "fp8",
    amax_reduction_group: Any = None,
    documented: bool | None = None,
    fsdp_plugin: Any = None,
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
    """Prepare ``model`` and ``optimizer`` as ``Accelerator(...).prepare`` does for FP8; returns both.

    Supports mixed precision "fp8", "bf16" and "no" on one process or under an initialised
    ``torch.distributed`` group (DDP).  ``amax_reduction_group``: the group TE-style delayed
    scaling all-reduces amaxes over (None: the default group, as upstream).  ``documented``: see
    :data:`fp8sim.accelerate.QUIRKS`.  MS-AMP raises NotImplementedError.  ``fsdp_plugin``:
    accelerate's ``FullyShardedDataParallelPlugin(fsdp_version=2)``, prepared as accelerate does on
    accelerator devices (:mod:`fp8sim.accelerate.fsdp2`; torchao backend or no FP8).
    """
    setup = setup_fp8(kwargs_handlers, mixed_precision)
    if fsdp_plugin is not None:
        return _prepare_fp8_fsdp2(model, optimizer, setup, fsdp_plugin, documented)
    if setup.mixed_precision == "fp16":
        raise NotImplementedError(
            "prepare_fp8 prepares fp8, bf16 and no mixed precision; fp16 needs accelerate's GradScaler "
            "training loop (use accelerate itself)"
        )
    backend = setup.fp8_backend
    if backend == FP8BackendType.MSAMP:
        raise NotImplementedError(
            "MS-AMP is not emulated: fp8sim has no counterpart of msamp.initialize(model, optimizer, opt_level=...) "
            "(O1: FP8 weights and FP8 weight gradients with scaling metadata; O2: also FP8/FP16 Adam states and "
            "master weights). Use the TE (TERecipeKwargs) or torchao (AORecipeKwargs) backend."
        )
    dist_type = _distributed_type(model, setup)
    if backend == FP8BackendType.TE:
        _prepare_te(model, optimizer, documented)
    elif backend == FP8BackendType.AO:
        ao = setup.ao_recipe_handler
        before = dict(model.named_parameters())
        convert_model_to_fp8_ao(
            model, config=ao.config, module_filter_func=ao.module_filter_func, documented=documented
        )
        if optimizer is not None:
            _converted_weights_and_the_optimizer(model, optimizer, before, documented)

    if dist_type != "NO" and amax_reduction_group is None:
        amax_reduction_group = torch.distributed.group.WORLD
    te_handler = setup.te_recipe_handler or setup.fp8_recipe_handler
    delayed_fp8_autocast = backend == FP8BackendType.TE and dist_type == "MULTI_GPU"
    if setup.mixed_precision in ("bf16", "fp8"):
        _wrap_mixed_precision(model, setup)
    if backend == FP8BackendType.TE and not delayed_fp8_autocast:
        model = apply_fp8_autowrap(model, te_handler, documented=documented, amax_reduction_group=amax_reduction_group)
    if dist_type != "NO":
        kwargs = setup.ddp_handler.to_kwargs() if setup.ddp_handler is not None else {}
        if dist_type == "MULTI_GPU":
            index = _device_of(model).index or 0
            kwargs = {"device_ids": [index], "output_device": index, **kwargs}
        model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        if setup.ddp_handler is not None:
            setup.ddp_handler.register_comm_hook(model)
    if delayed_fp8_autocast:
        model = apply_fp8_autowrap(model, te_handler, documented=documented, amax_reduction_group=amax_reduction_group)
    return model, optimizer


def _prepare_fp8_fsdp2(
    model: torch.nn.Module, optimizer: Any, setup: FP8Setup, plugin: Any, documented: bool | None
) -> tuple[torch.nn.Module, Any]:
    """accelerate's FSDP2 ``prepare``: ``_prepare_ao`` then ``_prepare_fsdp2`` (see :mod:`.fsdp2`)."""
    from .fsdp2 import check_fsdp_plugin, prepare_fsdp2, register_float8_scale_precompute

    check_fsdp_plugin(plugin, optimizer)
    if setup.mixed_precision == "fp16" or setup.fp8_backend not in (FP8BackendType.AO, FP8BackendType.NO):
        raise NotImplementedError(
            f"prepare_fp8 with an FSDP2 plugin emulates the torchao backend (AORecipeKwargs) and bf16 / no mixed "
            f"precision; got mixed_precision={setup.mixed_precision!r}, backend {setup.fp8_backend.value}"
        )
    if setup.fp8_backend == FP8BackendType.AO:
        ao = setup.ao_recipe_handler
        convert_model_to_fp8_ao(
            model, config=ao.config, module_filter_func=ao.module_filter_func, documented=documented
        )
        register_float8_scale_precompute(model, optimizer, ao.config)
    return prepare_fsdp2(model, optimizer, plugin, setup.mixed_precision), optimizer
