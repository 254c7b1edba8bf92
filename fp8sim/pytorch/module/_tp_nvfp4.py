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

import torch

from ...collectives.quantized import gather_nvfp4, max_over, world_rank
from ...formats import E2M1
from ...recipe import NVFP4BlockScaling
from ...scaling.amax import amax_nan_skipping_tensor
from ...scaling.nvfp4 import apply_rht, quantize_nvfp4
from ..tensor.nvfp4_tensor import is_nvfp4_quantizable
from ._operands import Operand
from ._quantizers import _4over6_scope

__all__ = ["set_shard_hook", "sr_gather_qparams"]

_FALLBACK = "Cannot quantize input tensor. Performing all-gather in high precision."  # TE's warnings


def sr_gather_qparams(recipe: Any, kind: str) -> Any:
    """The QParams of ``kind`` ("input": the column-parallel input, "grad": the row-parallel grad output)
    when ``recipe`` is NVFP4 and rounds that tensor stochastically, else None (the whole tensor's
    quantization after a high-precision gather is then TE's per-shard result, bit for bit)."""
    if not isinstance(recipe, NVFP4BlockScaling) or getattr(recipe, "backward_override", None) is not None:
        return None
    if kind == "input" and _4over6_scope(recipe.nvfp4_4over6, kind):  # the GEMM raises TE's 4over6 SR refusal
        return None
    qp = recipe.fp4_quant_bwd_grad if kind == "grad" else recipe.fp4_quant_fwd_inp
    if qp.stochastic_rounding:
        from ._quantizers import refuse_nvfp4_variant

        refuse_nvfp4_variant(recipe, "sequence/tensor-parallel NVFP4 with stochastic rounding (per-shard quantization)")
    return qp if qp.stochastic_rounding else None


def _shard_operand(local: torch.Tensor, qp: Any, k_axis: int, seed: int, group: Any) -> Operand:
    """The module's NVFP4 quantization of this rank's 2-D shard (``_operands._nvfp4``: RHT on the
    columnwise copy only, bf16 in for it) with the amax MAX-reduced over ``group``, gathered."""
    world, _ = world_rank(group)
    columnwise = k_axis == 0
    rht = qp.random_hadamard_transform and columnwise
    xt = local.detach().to(torch.bfloat16 if rht else torch.float32)  # TE's RHT kernel takes bf16
    xt = xt.t().contiguous() if columnwise else xt.contiguous()
    amax = max_over(amax_nan_skipping_tensor(apply_rht(xt) if rht else xt), group)
    q = quantize_nvfp4(
        xt,
        rht=rht,
        stochastic=qp.stochastic_rounding,
        seed=seed if qp.stochastic_rounding else None,
        block_2d=qp.fp4_2d_quantization,
        global_amax=amax,
    )
    full = gather_nvfp4(q, group, columnwise)
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
    if not is_nvfp4_quantizable(shard_shape, recipe.row_scaled_activation and kind == "input"):
        warnings.warn(_FALLBACK, stacklevel=3)
        return
    _, rank = world_rank(group)
    m = math.prod(shard_shape[:-1])
    hooks[kind] = _ShardHook(hooks, kind, qp, (rank * m, (rank + 1) * m), group)
