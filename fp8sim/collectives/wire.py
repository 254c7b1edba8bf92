"""Collectives for float8 and packed FP4 tensors on any ``torch.distributed`` backend.

gloo (and MPI) refuse float8 tensors (``RuntimeError: Invalid scalar type``).  A byte-sized float
(``float8_e4m3fn``, ``float8_e5m2``, their ``fnuz`` variants, ``float8_e8m0fnu``,
``float4_e2m1fn_x2``) travels here as its ``uint8`` view, so gathers and broadcasts move the codes
unchanged.  Other dtypes go to ``torch.distributed`` as they are.

Reductions of float8 codes are done by fp8sim, not the backend: every rank's contribution is
decoded exactly, reduced in float64 in rank order (SUM, MAX or MIN) and rounded once to the
output dtype (round to nearest even, non-saturating: the same as ``float64 -> float8`` in
ml_dtypes), so the result does not depend on the backend's reduction order.  NCCL's native FP8
reductions round after every hop; they are not emulated.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..cast import decode, encode
from ..formats import get_format

__all__ = [
    "BYTE_DTYPES",
    "wire_view",
    "all_gather_into_tensor",
    "all_gather",
    "all_gather_uneven",
    "broadcast",
    "reduce_scatter_tensor",
    "all_reduce",
]


def _byte_dtypes() -> dict[torch.dtype, str | None]:
    """The byte-sized float dtypes this torch has, with their fp8sim format (None: packed FP4)."""
    names = {
        "float8_e4m3fn": "e4m3",
        "float8_e5m2": "e5m2",
        "float8_e4m3fnuz": "e4m3fnuz",
        "float8_e5m2fnuz": "e5m2fnuz",
        "float8_e8m0fnu": "e8m0",  # torch >= 2.7
        "float4_e2m1fn_x2": None,  # torch >= 2.8: two E2M1 codes per byte
    }
    return {getattr(torch, n): f for n, f in names.items() if hasattr(torch, n)}


BYTE_DTYPES: dict[torch.dtype, str | None] = _byte_dtypes()
_OPS = ("SUM", "MAX", "MIN")


def wire_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor a backend can carry: the ``uint8`` view of a byte-sized float, else ``t`` itself."""
    return t.view(torch.uint8) if t.dtype in BYTE_DTYPES else t


def _check_same_dtype(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{what}: output dtype {a.dtype} differs from input dtype {b.dtype}")


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group: Any = None) -> None:
    """``dist.all_gather_into_tensor`` for any dtype: ``output`` holds every rank's ``input``, rank order."""
    _check_same_dtype(output, input, "all_gather_into_tensor")
    dist.all_gather_into_tensor(wire_view(output), wire_view(input.contiguous()), group=group)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None) -> None:
    """``dist.all_gather`` for any dtype (equal shapes on every rank)."""
    for out in tensor_list:
        _check_same_dtype(out, tensor, "all_gather")
    wires = [wire_view(t) for t in tensor_list]
    dist.all_gather(wires, wire_view(tensor.contiguous()), group=group)


def all_gather_uneven(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same trailing shape, any length of dim 0, empty included), rank order.

    The lengths are exchanged first, each payload is padded to the longest, gathered as bytes and cut back.
    """
    if tensor.dim() == 0:
        raise ValueError("all_gather_uneven needs a tensor with at least one dimension, got a 0-dim tensor")
    world = dist.get_world_size(group)
    n = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    lengths = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(lengths, n, group=group)
    sizes = [int(x.item()) for x in lengths]
    wire = wire_view(tensor.contiguous())
    padded = wire.new_zeros((max(sizes), *wire.shape[1:]))
    padded[: wire.shape[0]] = wire
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [o[:s].view(tensor.dtype) for o, s in zip(out, sizes, strict=True)]


def broadcast(tensor: torch.Tensor, src: int, group: Any = None) -> None:
    """``dist.broadcast`` for any dtype: every rank's ``tensor`` becomes ``src``'s, bit for bit."""
    if not tensor.is_contiguous():
        raise ValueError("broadcast needs a contiguous tensor (it is written in place)")
    dist.broadcast(wire_view(tensor), src=src, group=group)


def _op_name(op: Any) -> str:
    for name in _OPS:
        if op == getattr(dist.ReduceOp, name):
            return name
    raise ValueError(f"op must be ReduceOp.SUM, ReduceOp.MAX or ReduceOp.MIN for float8 tensors, got {op}")


def _fmt(dtype: torch.dtype, arg: str) -> Any:
    name = BYTE_DTYPES.get(dtype)
    if name is None:
        raise TypeError(f"{arg} dtype {dtype} cannot be reduced: packed FP4 holds two values per byte")
    return get_format(name)


def _reduce_rows(stacked: torch.Tensor, op: str, out_dtype: torch.dtype) -> torch.Tensor:
    """Reduce dim 0 of float8 ``stacked`` (rank order) in float64; one rounding to ``out_dtype``."""
    values = decode(stacked.view(torch.uint8), _fmt(stacked.dtype, "input")).to(torch.float64)
    acc = values[0].clone()
    for v in values[1:]:  # rank order, not torch.sum's pairwise order
        acc = acc + v if op == "SUM" else (torch.maximum(acc, v) if op == "MAX" else torch.minimum(acc, v))
    if out_dtype in BYTE_DTYPES:
        return encode(acc, _fmt(out_dtype, "output"), saturate=False).view(out_dtype)
    return acc.to(out_dtype)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None) -> None:
    """``dist.reduce_scatter_tensor``; a float8 ``input`` is reduced by fp8sim (module docstring).

    ``output`` may be float8 (one rounding) or a wider float (float32, bfloat16, ...: the float64 result cast).
    """
    op = dist.ReduceOp.SUM if op is None else op
    if input.dtype not in BYTE_DTYPES:
        dist.reduce_scatter_tensor(output, input, op=op, group=group)
        return
    name = _op_name(op)
    world = dist.get_world_size(group)
    if input.shape[0] != output.shape[0] * world or input.shape[1:] != output.shape[1:]:
        raise ValueError(
            f"reduce_scatter_tensor: input shape {list(input.shape)} must be world_size ({world}) "
            f"times output shape {list(output.shape)} along dim 0"
        )
    gathered = torch.empty((world, *input.shape), dtype=input.dtype, device=input.device)
    all_gather_into_tensor(gathered.view(-1, *input.shape[1:]), input, group=group)
    mine = gathered.view(world, world, *output.shape)[:, dist.get_rank(group)]
    wire_view(output).copy_(wire_view(_reduce_rows(mine, name, output.dtype)))


def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
    """``dist.all_reduce``; a float8 tensor is reduced by fp8sim (module docstring) and written back in place."""
    op = dist.ReduceOp.SUM if op is None else op
    if tensor.dtype not in BYTE_DTYPES:
        dist.all_reduce(tensor, op=op, group=group)
        return
    name = _op_name(op)
    world = dist.get_world_size(group)
    gathered = torch.empty((world, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
    rows = tensor.reshape(-1, *tensor.shape[1:])  # gloo gathers a 0-dim tensor only as a row of one
    all_gather_into_tensor(gathered.view(-1, *rows.shape[1:]), rows, group=group)
    wire_view(tensor).copy_(wire_view(_reduce_rows(gathered, name, tensor.dtype)))
