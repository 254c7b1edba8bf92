"""TE's per-rank NVFP4 all-gather under sequence parallelism (``distributed.py`` ``_all_gather_nvfp4``).

With stochastic rounding the quantization of a gathered tensor is not the whole tensor's: TE quantizes each
rank's own shard (``quantizer(inp)``, the rowwise and the post-RHT columnwise amax MAX-reduced over
``tp_group`` first: ``with_amax_reduction``), each rank with its own generator state, then all-gathers the
packed E2M1 data and the E4M3 scales.  Rowwise data and scales are concatenated along dim 0; the
columnwise (transposed) data and scales are gathered along their dim 0 and de-interleaved
(``_swap_first_dims``: rank ``r``'s block of columns next to the others), the columnwise scales padded to
``(round_up(K, 128), round_up(M / 16, 4))`` with zeros (TE ``pad_columnwise_scale_inv``), the rowwise padding
rows zero (TE leaves them uninitialised).  The output's amaxes are this rank's, identical everywhere after
the reduction.  A shard TE cannot quantize (``NVFP4Quantizer.is_quantizable``: fewer than 2 dims, the last
dim or the product of the others not a multiple of 16, row scaling) is gathered in high precision and the
whole quantized, with TE's warning.

Two faces: :func:`all_gather_nvfp4` for an ``NVFP4Quantizer`` (its SR bits: fp8sim's counter or, with
``te_rng_generator``, TE's Philox stream with this rank's ``rng_state``), and :func:`set_shard_hook`, which
``module/_tp.py`` hands to a GEMM's state so that the module's own quantization of the gathered input
(column-parallel) or grad output (row-parallel) runs per shard, drawing its seeds from the GEMM's counter
at the point the whole-tensor quantization would have drawn them.  That counter advances alike on every rank,
so each rank's shard takes the bits of the same local positions (TE: each rank's own CUDA generator state;
the modules have no ``te_rng_generator``, TE's Philox bits are the quantizer face's).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from ...formats import E2M1, E4M3
from ...recipe import NVFP4BlockScaling
from ...scaling.nvfp4 import apply_rht, quantize_nvfp4
from ...scaling.packing import pack_fp4, unpack_fp4
from ...scaling.quantized import QuantizedTensor
from ._operands import Operand, nan_skipping_amax
from ._quantizers import _4over6_scope

__all__ = ["all_gather_nvfp4", "set_shard_hook", "sr_gather_qparams", "te_quantizable"]

_B = 16
_FALLBACK = "Cannot quantize input tensor. Performing all-gather in high precision."  # TE's warnings
_MISMATCH = "Input and quantizer do not have matching usages. Dequantizing and requantizing to NVFP4."


def te_quantizable(shape: tuple[int, ...], row_scaled: bool = False) -> bool:
    """TE ``NVFP4Quantizer.is_quantizable`` for a shard of ``shape``."""
    return not row_scaled and len(shape) >= 2 and shape[-1] % _B == 0 and math.prod(shape[:-1]) % _B == 0


def sr_gather_qparams(recipe: Any, kind: str) -> Any:
    """The QParams of ``kind`` ("input": the column-parallel input, "grad": the row-parallel grad output)
    when ``recipe`` is NVFP4 and rounds that tensor stochastically, else None (the whole tensor's
    quantization after a high-precision gather is then TE's per-shard result, bit for bit)."""
    if not isinstance(recipe, NVFP4BlockScaling) or getattr(recipe, "backward_override", None) is not None:
        return None
    if kind == "input" and _4over6_scope(recipe.nvfp4_4over6, kind):  # the GEMM raises TE's 4over6 SR refusal
        return None
    qp = recipe.fp4_quant_bwd_grad if kind == "grad" else recipe.fp4_quant_fwd_inp
    return qp if qp.stochastic_rounding else None


def _world_rank(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group)


def _max_over(value: float, group: Any) -> float:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _gather0(t: torch.Tensor, group: Any, world: int, wire: str) -> torch.Tensor:
    """Every rank's ``t`` (uint8) concatenated along dim 0, carried as ``wire`` (a byte-sized float
    dtype where this torch has it) through the byte-view collective."""
    from ...collectives import all_gather_into_tensor

    t = t.contiguous()
    out = torch.empty((t.shape[0] * world, *t.shape[1:]), dtype=torch.uint8)
    dtype = getattr(torch, wire, None)
    if dtype is not None:
        all_gather_into_tensor(out.view(dtype), t.view(dtype), group=group)
    else:
        all_gather_into_tensor(out, t, group=group)
    return out


def _swap_first_dims(t: torch.Tensor, world: int) -> torch.Tensor:
    """TE ``_swap_first_dims``: ``(world * d0, d1)`` gathered along dim 0 -> ``(d0, world * d1)``."""
    d0 = t.shape[0] // world
    return t.reshape(world, d0, -1).transpose(0, 1).reshape(d0, -1)


def _gather_copy(q: QuantizedTensor, group: Any, world: int, columnwise: bool) -> QuantizedTensor:
    """One copy of every rank's shard, gathered as TE gathers it: packed codes and E4M3 scales along
    dim 0 (rowwise), or along dim 1 for the transposed columnwise copy."""
    codes = _gather0(pack_fp4(torch.from_numpy(q.codes)), group, world, "float4_e2m1fn_x2")
    scales = _gather0(torch.from_numpy(np.ascontiguousarray(q.scales)), group, world, "float8_e4m3fn")
    if columnwise:
        codes, scales = _swap_first_dims(codes, world), _swap_first_dims(scales, world)
    c = unpack_fp4(codes).numpy()
    shape = (q.shape[0], q.shape[1] * world) if columnwise else (q.shape[0] * world, q.shape[1])
    return QuantizedTensor(
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


def _shard_operand(local: torch.Tensor, qp: Any, k_axis: int, seed: int, group: Any) -> Operand:
    """The module's NVFP4 quantization of this rank's 2-D shard (``_operands._nvfp4``: RHT on the
    columnwise copy only, bf16 in for it) with the amax MAX-reduced over ``group``, gathered."""
    world, _ = _world_rank(group)
    columnwise = k_axis == 0
    rht = qp.random_hadamard_transform and columnwise
    xt = local.detach().to(torch.bfloat16 if rht else torch.float32)  # TE's RHT kernel takes bf16
    xt = xt.t().contiguous() if columnwise else xt.contiguous()
    amax = _max_over(nan_skipping_amax(apply_rht(xt) if rht else xt), group)
    q = quantize_nvfp4(
        xt,
        rht=rht,
        stochastic=qp.stochastic_rounding,
        seed=seed if qp.stochastic_rounding else None,
        block_2d=qp.fp4_2d_quantization,
        global_amax=amax,
    )
    full = _gather_copy(q, group, world, columnwise)
    dq = torch.from_numpy(full.dequantize())
    return Operand(dq.t() if columnwise else dq, E2M1, qt=full, transposed=columnwise)


class _ShardHook:
    """This rank's rows of the gathered 2-D ``x`` quantized per shard and gathered, once per copy (rowwise
    ``k_axis=1``, columnwise ``k_axis=0``); it leaves the GEMM state once both are taken."""

    def __init__(self, owner: dict, kind: str, qp: Any, rows: tuple[int, int], group: Any) -> None:
        self.owner, self.kind, self.qp, self.rows, self.group = owner, kind, qp, rows, group
        self.left = {0, 1}

    def __call__(self, x: torch.Tensor, k_axis: int, seed: int) -> Operand:
        self.left.discard(k_axis)
        if not self.left:
            self.owner.pop(self.kind, None)
        return _shard_operand(x[self.rows[0] : self.rows[1]], self.qp, k_axis, seed, self.group)


def set_shard_hook(g: Any, recipe: Any, kind: str, shard_shape: tuple[int, ...], group: Any) -> None:
    """Make GEMM state ``g``'s next two quantizations of ``kind`` (the gathered tensor's rowwise and columnwise
    copies) per shard, where TE's result is not the whole tensor's (stochastic rounding); otherwise clear it.
    A shard TE cannot quantize keeps the high-precision gather (TE's warning)."""
    hooks = g.__dict__.setdefault("shard_hooks", {})
    hooks.pop(kind, None)
    qp = sr_gather_qparams(recipe, kind)
    if qp is None:
        return
    if not te_quantizable(shard_shape, recipe.row_scaled_activation and kind == "input"):
        warnings.warn(_FALLBACK, stacklevel=3)
        return
    _, rank = _world_rank(group)
    m = math.prod(shard_shape[:-1])
    hooks[kind] = _ShardHook(hooks, kind, qp, (rank * m, (rank + 1) * m), group)


def all_gather_nvfp4(inp: torch.Tensor, group: Any, quantizer: Any) -> Any:
    """TE ``_all_gather_nvfp4``: this rank's rows ``inp`` (high precision: ``quantizer(inp)`` on this rank,
    with ``with_amax_reduction`` and ``amax_reduction_group`` set as TE's layers set them; or an
    ``NVFP4Tensor``), data and scales of the quantizer's usages gathered and laid out as TE lays them, in an
    ``NVFP4Tensor`` of the gathered shape."""
    from ..tensor.nvfp4_tensor import NVFP4Tensor

    world, _ = _world_rank(group)
    shape = tuple(inp.shape)
    out_shape = (shape[0] * world, *shape[1:])
    if isinstance(inp, NVFP4Tensor):  # TE: its data as it is, unless the quantizer wants a copy it lacks
        local = inp
        if (quantizer.rowwise_usage and inp._rowwise_data is None) or (
            quantizer.columnwise_usage and inp._columnwise_data is None
        ):
            warnings.warn(_MISMATCH, stacklevel=2)
            local = quantizer(inp.dequantize(dtype=inp.dtype))
    elif not te_quantizable(shape, quantizer.row_scaled_nvfp4):
        from ._tp import gather_along_first_dim

        warnings.warn(_FALLBACK, stacklevel=2)
        return quantizer(gather_along_first_dim(inp, group))
    else:
        local = quantizer(inp)
    m, k = math.prod(shape[:-1]), shape[-1]
    names = ("rowwise_data", "rowwise_scale_inv", "amax_rowwise", "columnwise_data", "columnwise_scale_inv")
    fields: dict[str, Any] = dict.fromkeys((*names, "amax_columnwise"))
    if quantizer.rowwise_usage:
        data = _gather0(local._rowwise_data.reshape(m, k // 2), group, world, "float4_e2m1fn_x2")
        scales = _gather0(local._rowwise_scale_inv[:m], group, world, "float8_e4m3fn")
        sc = torch.zeros(quantizer.get_scale_shape(out_shape, False), dtype=torch.uint8)
        sc[: scales.shape[0]] = scales  # TE: the padding rows are make_empty's (uninitialised); fp8sim: 0
        fields.update(rowwise_data=data.reshape(*out_shape[:-1], k // 2), rowwise_scale_inv=sc)
        fields["amax_rowwise"] = local._amax_rowwise
    if quantizer.columnwise_usage:
        data = _swap_first_dims(_gather0(local._columnwise_data, group, world, "float4_e2m1fn_x2"), world)
        scales = local._columnwise_scale_inv[:k, : m // _B]
        scales = _swap_first_dims(_gather0(scales, group, world, "float8_e4m3fn"), world)
        sc = torch.zeros(quantizer.get_scale_shape(out_shape, True), dtype=torch.uint8)
        sc[:k, : scales.shape[1]] = scales  # TE pad_columnwise_scale_inv: zero padding
        fields.update(columnwise_data=data, columnwise_scale_inv=sc, amax_columnwise=local._amax_columnwise)
    return NVFP4Tensor(
        shape=out_shape,
        dtype=inp.dtype,
        device=inp.device,
        **fields,
        fp4_dtype=quantizer.dtype,
        quantizer=quantizer,
        with_2d_quantization=quantizer.with_2d_quantization,
        nvfp4_use_4over6=quantizer.nvfp4_use_4over6,
        nvfp4_e4m3_max=quantizer.nvfp4_e4m3_max,
    )
