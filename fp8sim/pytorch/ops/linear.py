"""``Linear``: ``y = x W^T + b`` as a fused op over ``BasicLinear`` + ``Bias`` (+ the tensor-parallel
reduction) (TE 2.20.0.dev0 ``ops/linear.py``).  Row tensor parallelism: local GEMM, bias, then
``ReduceScatter`` (sequence parallel) or ``AllReduce``; column: the gather lives in ``BasicLinear``.
``weight`` and ``bias`` are registered on the fused op too, and left out of its ``state_dict`` as TE does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .basic import AllReduce, BasicLinear, Bias, ReduceScatter
from .op import FusedOperation

__all__ = ["Linear"]


class Linear(FusedOperation):
    """A drop-in ``torch.nn.Linear`` (``bias``, ``device``, ``dtype``) with TE's tensor-parallel options and
    ``accumulate_into_main_grad``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Callable[[], Any] | None = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        mode, group, size, sequence_parallel, local_in, local_out = BasicLinear._canonicalize_tensor_parallelism(
            mode=tensor_parallel_mode,
            process_group=tensor_parallel_group,
            sequence_parallel=sequence_parallel,
            in_features=in_features,
            out_features=out_features,
        )
        linear_kwargs: dict[str, Any] = dict(
            in_features=in_features,
            out_features=out_features,
            device=device,
            dtype=dtype,
            tensor_parallel_mode=mode,
            tensor_parallel_group=group,
            sequence_parallel=sequence_parallel,
            rng_state_tracker_function=rng_state_tracker_function,
            accumulate_into_main_grad=accumulate_into_main_grad,
        )
        bias_kwargs: dict[str, Any] = dict(
            size=out_features, device=device, dtype=dtype, tensor_parallel=mode is not None, tensor_parallel_group=group
        )
        ops: list = []
        bias_idx = None
        if mode == "row":  # local GEMM + bias, then the reduction
            linear_kwargs.update(
                in_features=local_in,
                out_features=local_out,
                tensor_parallel_mode=None,
                tensor_parallel_group=None,
                sequence_parallel=False,
            )
            ops.append(BasicLinear(**linear_kwargs))
            if bias:
                bias_idx = len(ops)
                bias_kwargs["size"] *= size
                ops.append(Bias(**bias_kwargs))
            ops.append(ReduceScatter(group) if sequence_parallel else AllReduce(group))
        else:
            ops.append(BasicLinear(**linear_kwargs))
            if bias:
                bias_idx = len(ops)
                ops.append(Bias(**bias_kwargs))
        super().__init__(ops)
        self._linear_idx, self._bias_idx = 0, bias_idx
        self.register_parameter("weight", self.basic_ops[0].weight)
        self.register_parameter("bias", None if bias_idx is None else self.basic_ops[bias_idx].bias)

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        """Register on the fused op and on the basic op that owns the parameter."""
        if name == "bias" and getattr(self, "_bias_idx", None) is None and param is not None:
            raise ValueError("Attempted to set bias parameter in Linear operation that does not have bias enabled")
        super().register_parameter(name, param)
        if name == "weight":
            self.basic_ops[self._linear_idx].weight = param
        elif name == "bias" and getattr(self, "_bias_idx", None) is not None:
            self.basic_ops[self._bias_idx].bias = param

    def state_dict(self, *, prefix: str = "", **kwargs: Any) -> dict[str, Any]:
        """The basic ops' entries only (TE drops the fused op's ``weight`` / ``bias`` aliases)."""
        sd = super().state_dict(prefix=prefix, **kwargs)
        sd.pop(f"{prefix}weight", None)
        sd.pop(f"{prefix}bias", None)
        return sd

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        if f"{prefix}weight" not in state_dict:
            state_dict[f"{prefix}weight"] = state_dict[f"{prefix}basic_ops.{self._linear_idx}.weight"]
        if f"{prefix}bias" not in state_dict:
            state_dict[f"{prefix}bias"] = (
                None if self._bias_idx is None else state_dict[f"{prefix}basic_ops.{self._bias_idx}.bias"]
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
