"""accelerate's general kwargs handlers (``utils/dataclasses.py``, spec 7.1, 7.2), same fields and defaults.

``KwargsHandler.to_kwargs()`` returns the fields whose value differs from a default instance built
with the environment cleared.  :func:`profile` is ``Accelerator.profile``: it builds the profiler
from a :class:`ProfileKwargs` and exports a Chrome trace to ``output_trace_dir``.
"""

from __future__ import annotations

import copy
import enum
import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ._env import clear_environment

__all__ = [
    "KwargsHandler",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "profile",
    "PROFILE_PATTERN_NAME",
]

PROFILE_PATTERN_NAME = "profile_{suffix}.json"


class KwargsHandler:
    """Mixin for a dataclass whose ``to_kwargs()`` returns only the fields that differ from the defaults."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from ``type(self)()`` built with ``os.environ`` emptied (spec 7.1)."""
        with clear_environment():
            default = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if default[k] != v}


class _EnumWithContains(enum.EnumMeta):
    """``value in Enum`` is True when ``Enum(value)`` succeeds."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=_EnumWithContains):
    """``str(member)`` is its value; ``list()`` lists the values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [str(m) for m in cls]


@dataclass
class AutocastKwargs(KwargsHandler):
    """Keywords for ``torch.autocast`` (under fp8 accelerate autocasts to bf16)."""

    enabled: bool = True
    cache_enabled: bool | None = None


class DDPCommunicationHookType(BaseEnum):
    """DDP communication hooks: none, fp16/bf16 gradient compression, (batched) PowerSGD."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Keywords for ``torch.nn.parallel.DistributedDataParallel``; ``comm_*`` pick a communication hook."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def to_dict(self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict:
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}

    def register_comm_hook(self, model: Any) -> None:
        """Register the configured hook (wrapped by ``comm_wrapper``) on a DDP ``model``."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks: dict[DDPCommunicationHookType, Callable] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers: dict[DDPCommunicationHookType, Callable] = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        hook, wrapper = hooks.get(self.comm_hook), wrappers.get(self.comm_wrapper)
        if hook and wrapper:
            hook = wrapper(hook)
        if hook:
            power_sgd = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
            state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option) if self.comm_hook in power_sgd else None
            model.register_comm_hook(state=state, hook=hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Keywords for ``torch.amp.GradScaler``."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Keywords for ``torch.distributed.init_process_group``; a None timeout becomes 600 s for nccl, else 1800 s."""

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is None:
            self.timeout = timedelta(seconds=1800 if self.backend != "nccl" else 600)


def _hpu_available() -> bool:
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    import torch

    return hasattr(torch, "hpu") and torch.hpu.is_available()


@dataclass
class ProfileKwargs(KwargsHandler):
    """Settings of ``torch.profiler.profile``; ``schedule_option`` feeds ``torch.profiler.schedule``.

    ``output_trace_dir`` is not passed to the profiler: :func:`profile` exports the Chrome trace there.
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def _get_profiler_activity(self, activity: str) -> Any:
        import torch

        known = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        if _hpu_available():
            known["hpu"] = torch.profiler.ProfilerActivity.HPU
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            known["xpu"] = torch.profiler.ProfilerActivity.XPU
        if hasattr(torch, "mtia") and torch.mtia.is_available():
            known["mtia"] = torch.profiler.ProfilerActivity.MTIA
        if activity not in known:
            raise ValueError(f"Invalid profiler activity: {activity}. Must be one of {list(known)}.")
        return known[activity]

    def build(self) -> Any:
        """A ``torch.profiler.profile`` with these settings."""
        import torch

        activities = None if self.activities is None else [self._get_profiler_activity(a) for a in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@contextmanager
def profile(profile_handler: ProfileKwargs | None = None, process_index: int | None = None) -> Iterator[Any]:
    """``Accelerator.profile``: profile the block; with ``output_trace_dir`` set, export the Chrome trace to
    ``output_trace_dir/profile_{process_index}.json`` (process index: the torch.distributed rank, else 0)."""
    handler = profile_handler or ProfileKwargs()
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    if process_index is None:
        import torch.distributed as dist

        process_index = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    trace = os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=process_index))
    profiler.export_chrome_trace(trace)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
