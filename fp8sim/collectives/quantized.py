"""Quantized data across ranks: codes gathered along dim 0 as bytes, and the NVFP4 record of
:mod:`fp8sim.scaling` gathered as TE lays it out (``distributed.py`` ``_all_gather_nvfp4``).

The integrations (``fp8sim.pytorch``'s TE collectives and tensor-parallel modules) build on these;
nothing here knows a TE tensor class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..formats import E2M1, E4M3
from ..scaling.packing import pack_fp4, unpack_fp4
from ..scaling.quantized import QuantizedData
from .wire import all_gather_into_tensor

__all__ = ["world_rank", "max_over", "gather_codes", "swap_first_dims", "gather_nvfp4"]


def world_rank(group: Any) -> tuple[int, int]:
    """``(world size, rank)`` in ``group``."""
    return dist.get_world_size(group), dist.get_rank(group)


def max_over(value: float, group: Any) -> float:
    """The MAX of a float32 ``value`` over ``group`` (an amax reduction)."""
    t = torch.tensor([value], dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def gather_codes(codes: torch.Tensor, group: Any, wire: str | None = None) -> torch.Tensor:
    """Every rank's ``codes`` (uint8) concatenated along dim 0, carried as the byte-sized float dtype
    ``wire`` where this torch has it (e.g. "float8_e4m3fn"), else as uint8, through the byte-view
    collective."""
    world = dist.get_world_size(group)
    t = codes.contiguous()
    out = torch.empty((t.shape[0] * world, *t.shape[1:]), dtype=torch.uint8)
    dtype = getattr(torch, wire, None) if wire else None
    if dtype is not None:
        all_gather_into_tensor(out.view(dtype), t.view(dtype), group=group)
    else:
        all_gather_into_tensor(out, t, group=group)
    return out


def swap_first_dims(t: torch.Tensor, world: int) -> torch.Tensor:
    """TE ``_swap_first_dims``: ``(world * d0, d1)`` gathered along dim 0 -> ``(d0, world * d1)``."""
    d0 = t.shape[0] // world
    return t.reshape(world, d0, -1).transpose(0, 1).reshape(d0, -1)


def gather_nvfp4(q: QuantizedData, group: Any, columnwise: bool) -> QuantizedData:
    """Every rank's NVFP4 shard ``q``, gathered as TE gathers it: packed codes and E4M3 scales along dim 0
    (rowwise), or along dim 1 for the transposed columnwise copy; the global scale is this rank's."""
    world = dist.get_world_size(group)
    codes = gather_codes(pack_fp4(torch.from_numpy(q.codes)), group, "float4_e2m1fn_x2")
    scales = gather_codes(torch.from_numpy(np.ascontiguousarray(q.scales)), group, "float8_e4m3fn")
    if columnwise:
        codes, scales = swap_first_dims(codes, world), swap_first_dims(scales, world)
    c = unpack_fp4(codes).numpy()
    shape = (q.shape[0], q.shape[1] * world) if columnwise else (q.shape[0] * world, q.shape[1])
    return QuantizedData(
        c,
        scales.numpy(),
        E2M1,
        q.block,
        shape,
        q.dtype,
        scale_format=E4M3,
        global_scale=q.global_scale,
        global_amax=q.global_amax,
    )
