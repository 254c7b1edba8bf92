"""FP8 boundaries across TE's tensor-parallel collectives: a row-parallel ``fp8_output``, a column-parallel
``fp8_grad`` and an FP8 input to a column-parallel layer, as TE d0067d0 computes them.

TE hands the collective its quantized tensor (``module/linear.py`` 536-578: the row GEMM writes the output
with ``output_quantizer``, then ``allreduce`` / ``reduce_scatter_along_first_dim``; 1085-1132: the column
dgrad GEMM with ``grad_input_quantizer``, then the same two).  ``torch.distributed`` on a ``Float8Tensor``
runs through ``QuantizedTensor.__torch_dispatch__`` (``quantized_tensor.py`` 858-1028).  torch registers the
c10d ops without alias annotations (``c10d::allreduce_(Tensor[] tensors, ...)``, ``_schema.is_mutable`` is
False on torch 2.13), so they take the "default op" branch: the arguments are dequantized (to the tensor's
nominal dtype, the activation dtype) into new tensors and the collective runs on those.  Hence:

* ``allreduce`` (tensor parallel): the reduced sum lands in a temporary; the FP8 tensor keeps this rank's
  partial sum.  TE returns each rank's own FP8 partial output (row) or FP8 partial dgrad (column),
  unreduced; fp8sim reproduces that and warns (``UpstreamQuirkWarning``).  A torch that marks the op
  mutable would send TE down its re-quantizing branch instead: fp8sim refuses there.
* ``reduce_scatter_along_first_dim`` (sequence parallel): the output buffer is a plain
  ``torch.empty(.., dtype=inp.dtype)``, so the result is high precision: the sum over ranks of each rank's
  dequantized FP8 partial, with no FP8 data on it.  fp8sim's collectives already sum the dequantized
  partials; here the FP8 hand-off is kept off the result.
* a row-parallel bias is added after the collective (``gemm_bias_unfused_add``): ``Float8Tensor + bias``
  is a plain tensor, so the FP8 hand-off is dropped there too.
* the same holds under current scaling: each rank's partial (D in the activation dtype, cast with this rank's
  own amax: ``linear.py`` 351-355 and 809-825 give an amax reduction group to the input quantizer (column) and the
  grad-output quantizer (row, sequence parallel) only, never to the output or grad-input one) is what the collective
  meets, so the code below is recipe-agnostic.
* an FP8 input to a column-parallel layer under sequence parallel is gathered as it is
  (``distributed.py`` ``_all_gather_fp8`` 989-1080: no re-quantization; every rank's codes read with this
  rank's ``scale_inv``); without sequence parallel it is used as it is.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..._util.upstream_quirk import UpstreamQuirkWarning
from ...cast import decode
from ...collectives.quantized import gather_codes
from .._comm import get_distributed_world_size, reduce_scatter_along_first_dim
from ._fp8_handoff import FP8Handoff
from ._operands import Operand

__all__ = ["check_allreduce_keeps_fp8", "LocalDgrad", "GatherFP8Input", "drop_output_handoff"]

QUIRK = (
    "TE all-reduces a {what} that is a Float8Tensor through QuantizedTensor.__torch_dispatch__, which runs "
    "c10d.allreduce_ (not marked mutable) on a dequantized copy: the {what} stays this rank's unreduced FP8 "
    "partial sum; fp8sim reproduces that (quirk 'te-fp8-allreduce-noop')"
)


def _allreduce_is_mutable() -> bool:
    return bool(torch.ops.c10d.allreduce_.default._schema.is_mutable)


def check_allreduce_keeps_fp8(what: str) -> None:
    """Warn that TE's all-reduce of an FP8 ``what`` leaves it unreduced; refuse where this torch would make TE
    take the re-quantizing (mutable-op) branch instead."""
    if _allreduce_is_mutable():
        raise NotImplementedError(
            f"fp8sim: a tensor-parallel FP8 {what}: this torch marks c10d.allreduce_ mutable, so TE's "
            "QuantizedTensor would re-quantize the all-reduced sum; that is not emulated"
        )
    warnings.warn(QUIRK.format(what=what), UpstreamQuirkWarning, stacklevel=4)


def _gather_fp8(op: Any, shape: tuple, group: Any) -> FP8Handoff:
    """All-gather a per-tensor FP8 operand's codes along dim 0 (as float8 bytes); every rank's codes are
    read with this rank's ``scale_inv`` (TE ``_all_gather_fp8``)."""
    world = get_distributed_world_size(group)
    wire = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}.get(op.fmt.name)  # as float8 bytes: gloo refuses float8
    out = gather_codes(op.codes, group, wire)
    full = (shape[0] * world, *shape[1:])
    vals = decode(out, op.fmt).reshape(full)
    return FP8Handoff(vals, out.reshape(full), op.scale_inv, op.fmt)


class LocalDgrad(torch.autograd.Function):
    """Column parallel with ``fp8_grad`` (no sequence parallel): identity forward; backward: the FP8 dgrad as
    this rank computed it, since TE's all-reduce of the Float8Tensor does not change it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, dgrad: torch.Tensor) -> torch.Tensor:
        return dgrad


class GatherFP8Input(torch.autograd.Function):
    """Column + sequence parallel with an FP8 input: its codes all-gathered along dim 0 and read with this
    rank's ``scale_inv`` (``slot["input_fp8"]``: the gathered hand-off the GEMM uses); the dequantized values
    flow on.  Backward: dgrad reduce-scattered (TE ``reduce_scatter_along_first_dim``), high precision."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, h: FP8Handoff, group: Any, slot: dict) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        op = Operand(None, h.fmt, h.vals, h.codes, h.sinv)
        gathered = _gather_fp8(op, tuple(h.codes.shape), group)
        slot["input_fp8"] = gathered
        return gathered.dequant(x.dtype)

    @staticmethod
    def backward(ctx: Any, dgrad: torch.Tensor) -> tuple:
        return reduce_scatter_along_first_dim(dgrad, ctx.group)[0], None, None, None


def drop_output_handoff(module: Any) -> FP8Handoff | None:
    """The FP8 output the last GEMM call of ``module`` wrote, taken off the module so that the layer returns a
    plain tensor (TE: a reduce-scattered or bias-added Float8Tensor is high precision).  The GEMM's backward
    still reads the hand-off's ``grad`` (the gathered FP8 grad output under sequence parallel)."""
    opts = module.__dict__.pop("_last_opts", None)
    return None if opts is None else opts.out_handoff
