"""Tensor parallelism for :class:`~fp8sim.torchao.Float8Linear`: torchao's ``Float8ColwiseParallel``,
``Float8RowwiseParallel`` and ``PrepareFloat8ModuleInput`` (``torchao/float8/float8_tensor_parallel.py``),
emulated with plain local shards on any backend (gloo included).

torchao casts DTensors, so every tensorwise amax is the amax of the whole logical tensor: the
weight shard's, the input's and the output gradient's amaxes are MAX-reduced over the TP mesh and
all ranks share each scale.  fp8sim keeps each rank's shard as an ordinary Parameter (not a
DTensor) and reduces the amax of every tensorwise cast inside the module over the mesh's group,
forward and backward.  A float8 all-gather of an input cast with the mesh-wide scale moves the
same codes as casting the gathered input, so inputs are gathered in high precision here.

* ``Float8ColwiseParallel``: weight and bias split along dim 0 (``torch.chunk``); input
  ``Replicate()`` (its gradient all-reduced) or ``Shard(0)`` (sequence parallel: all-gathered,
  gradient reduce-scattered); output ``Shard(-1)`` local, or ``Replicate()`` (all-gathered).
* ``Float8RowwiseParallel``: weight split along dim 1, bias kept whole and added once after the
  partial outputs are summed; input ``Shard(-1)`` (or ``Replicate()``: this rank's slice is
  taken); output ``Replicate()`` (all-reduce SUM) or ``Shard(0)`` (reduce-scatter).
* ``PrepareFloat8ModuleInput``: gathers a module's first input from ``Shard(0)`` to
  ``Replicate()`` once for every float8 user inside it.

Only tensorwise dynamic scaling of input and grad_output is supported, as in torchao
(``AssertionError("unsupported")``).  Needs ``torch.distributed``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from .config import ScalingGranularity, ScalingType
from .linear import _TP_AMAX_GROUP, Float8Linear, _Float8MatMul, _gemm_specs

__all__ = ["Float8ColwiseParallel", "Float8RowwiseParallel", "PrepareFloat8ModuleInput"]


class _AllReduceBackward(torch.autograd.Function):
    """Identity forward, gradient SUM-all-reduced (a replicated input feeding sharded weights)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _AllReduceForward(torch.autograd.Function):
    """Partial outputs SUM-all-reduced forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return g, None


class _Gather(torch.autograd.Function):
    """All-gather along ``dim`` forward; backward: this rank's slice of the SUM-reduced gradient
    (``reduce=True``: the gathered tensor feeds every rank's shard) or just the slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int, reduce: bool) -> torch.Tensor:  # type: ignore[override]
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x.contiguous()) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.dim, ctx.reduce, ctx.sizes = group, dim, reduce, [p.shape[dim] for p in parts]
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        g = g.contiguous().clone()
        if ctx.reduce:
            dist.all_reduce(g, group=ctx.group)
        me = dist.get_rank(ctx.group)
        return g.split(ctx.sizes, dim=ctx.dim)[me].contiguous(), None, None, None


class _ReduceScatter(torch.autograd.Function):
    """Partial outputs SUM-reduced, this rank keeps its slice along ``dim``; backward all-gathers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:  # type: ignore[override]
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        world, me = dist.get_world_size(group), dist.get_rank(group)
        ctx.group, ctx.dim = group, dim
        return x.chunk(world, dim=dim)[me].contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return _Gather.forward(ctx, g, ctx.group, ctx.dim, False), None, None


def _check_module(module: nn.Module) -> Float8Linear:
    if not isinstance(module, Float8Linear):
        raise ValueError(f"Expecting module to be Float8Linear but found {type(module)}")
    c = module.config
    ok = module.scaling_type_input is ScalingType.DYNAMIC and module.scaling_type_grad_output is ScalingType.DYNAMIC
    tensorwise = all(
        cc.scaling_granularity is ScalingGranularity.TENSORWISE
        for cc in (c.cast_config_input, c.cast_config_weight, c.cast_config_grad_output)
    )
    if not (ok and tensorwise):
        raise AssertionError("unsupported")
    return module


def _matmul(module: Float8Linear, x: torch.Tensor) -> torch.Tensor:
    """Float8Linear's GEMM without the bias (rowwise adds it after the reduction)."""
    gemms = _gemm_specs(module.config, module.accumulator, module)
    return _Float8MatMul.apply(x, module.weight.t(), module.config, gemms, None, None)


def _shard(t: torch.Tensor, dim: int, mesh: Any) -> nn.Parameter:
    part = t.detach().chunk(mesh.size(), dim=dim)[mesh.get_local_rank()].clone()
    return nn.Parameter(part, requires_grad=t.requires_grad)


def _one_of(layout: Any, allowed: tuple, what: str) -> Any:
    if not any(layout == a for a in allowed):
        raise ValueError(f"{what} must be one of {', '.join(map(str, allowed))}, got {layout}")
    return layout


class Float8ColwiseParallel(ParallelStyle):
    """Column-parallel Float8Linear (module docstring); torch's ``ColwiseParallel`` arguments."""

    def __init__(self, *, input_layouts: Any = None, output_layouts: Any = None, use_local_output: bool = True) -> None:
        self.input_layout = _one_of(input_layouts or Replicate(), (Replicate(), Shard(0)), "input_layouts")
        self.output_layout = _one_of(output_layouts or Shard(-1), (Shard(-1), Replicate()), "output_layouts")
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        m = _check_module(module)
        group = device_mesh.get_group()
        m.weight = _shard(m.weight, 0, device_mesh)
        if m.bias is not None:
            m.bias = _shard(m.bias, 0, device_mesh)
        in_layout, out_layout = self.input_layout, self.output_layout

        def forward(x: torch.Tensor) -> torch.Tensor:
            x = _Gather.apply(x, group, 0, True) if in_layout == Shard(0) else _AllReduceBackward.apply(x, group)
            token = _TP_AMAX_GROUP.set(group)
            try:
                y = Float8Linear.forward(m, x)
            finally:
                _TP_AMAX_GROUP.reset(token)
            return _Gather.apply(y, group, y.dim() - 1, False) if out_layout == Replicate() else y

        m.forward = forward
        return m


class Float8RowwiseParallel(ParallelStyle):
    """Row-parallel Float8Linear (module docstring); torch's ``RowwiseParallel`` arguments."""

    def __init__(self, *, input_layouts: Any = None, output_layouts: Any = None, use_local_output: bool = True) -> None:
        self.input_layout = _one_of(input_layouts or Shard(-1), (Shard(-1), Replicate()), "input_layouts")
        self.output_layout = _one_of(output_layouts or Replicate(), (Replicate(), Shard(0)), "output_layouts")
        self.use_local_output = use_local_output

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        m = _check_module(module)
        group = device_mesh.get_group()
        world, me = device_mesh.size(), device_mesh.get_local_rank()
        m.weight = _shard(m.weight, 1, device_mesh)
        in_layout, out_layout = self.input_layout, self.output_layout

        def forward(x: torch.Tensor) -> torch.Tensor:
            if in_layout == Replicate():
                x = x.chunk(world, dim=-1)[me]
            token = _TP_AMAX_GROUP.set(group)
            try:
                partial = _matmul(m, x)
            finally:
                _TP_AMAX_GROUP.reset(token)
            if out_layout == Shard(0):
                y = _ReduceScatter.apply(partial, group, 0)
            else:
                y = _AllReduceForward.apply(partial, group)
            return y if m.bias is None else y + m.bias.to(y.dtype)

        m.forward = forward
        return m


class PrepareFloat8ModuleInput(ParallelStyle):
    """Gather a module's first positional input ``Shard(0)`` -> ``Replicate()`` once (torchao casts it to
    float8 first; with the mesh-wide scale that is the same codes, module docstring)."""

    def __init__(
        self,
        *,
        input_layouts: Any = None,
        desired_input_layouts: Any = None,
        use_local_output: bool = False,
        float8_dtype: torch.dtype = torch.float8_e4m3fn,
        fwd_config_submodule_fqn: str | None = None,
    ) -> None:
        layouts = tuple(input_layouts) if isinstance(input_layouts, (list, tuple)) else (input_layouts,)
        desired = (
            tuple(desired_input_layouts)
            if isinstance(desired_input_layouts, (list, tuple))
            else (desired_input_layouts,)
        )
        self.input_layout = _one_of(layouts[0] or Shard(0), (Shard(0), Replicate()), "input_layouts")
        self.desired_layout = _one_of(desired[0] or Replicate(), (Replicate(),), "desired_input_layouts")
        if float8_dtype != torch.float8_e4m3fn:
            raise NotImplementedError("PrepareFloat8ModuleInput only support casting to float8_e4m3fn for now")
        self.fwd_config_submodule_fqn = fwd_config_submodule_fqn

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        group = device_mesh.get_group()
        if self.input_layout == Shard(0):

            def pre(mod: nn.Module, args: tuple) -> tuple:
                return (_Gather.apply(args[0], group, 0, False), *args[1:])

            module.register_forward_pre_hook(pre)
        return module
