"""TE's tensor parallelism across processes for fp8sim's ``Linear`` (``module/linear.py``, ``distributed.py``).

Each rank holds one shard of the weight and runs its own FP8 GEMM; the collectives sit where TE puts them:

* ``parallel_mode="column"``: the weight's ``out_features / tp_size`` rows, output left split.  Backward:
  dgrad all-reduced (SUM) over ``tp_group``, or reduce-scattered along dim 0 with ``sequence_parallel``.
  With ``sequence_parallel`` the input (sharded along dim 0) is all-gathered before the GEMM; under a
  per-tensor recipe it is quantized first and gathered in FP8 (TE ``_all_gather_fp8``: the codes of
  every rank read with this rank's ``scale_inv``, "Assume scaling factors are identical across ranks").
* ``parallel_mode="row"``: the weight's ``in_features / tp_size`` columns; the GEMM output (activation
  dtype) is all-reduced, or reduce-scattered along dim 0 with ``sequence_parallel``, and the bias is
  added after the reduction (TE ``gemm_bias_unfused_add``).  With ``sequence_parallel`` the backward
  quantizes the local grad output and all-gathers it (in FP8 under a per-tensor recipe).

Amax reduction as TE: delayed scaling reduces its amax history over autocast's ``amax_reduction_group``
(TE's ``fp8_group``; None: the world), and TE refuses ``sequence_parallel`` without ``reduce_amax``;
current scaling reduces the amax of a sequence-parallel input (column) or grad output (row) over
``tp_group`` (``set_quantizer_amax_reduction_group``), every other amax stays local.  FP8 payloads travel
through :mod:`fp8sim.collectives` as byte views (gloo refuses float8).

FP8 boundaries (``fp8_output`` row-parallel, ``fp8_grad`` column-parallel, an FP8 input) meet the collectives
as TE's ``Float8Tensor`` does (``_tp_fp8_io``): an all-reduce leaves the FP8 tensor this rank's unreduced
partial (TE's dispatch; an ``UpstreamQuirkWarning``), a reduce-scatter returns the high-precision sum of the
dequantized FP8 partials, an FP8 input is gathered as it is.

Block recipes under sequence parallelism (TE ``distributed.py`` ``_all_gather_mxfp8``,
``_start_all_gather_fp8_blockwise``, ``_all_gather_nvfp4``): TE quantizes each rank's shard and gathers
data and scales, or, where the shard is not quantizable (rows or columns not a multiple of the block;
Float8Blockwise with 128x128 blocks), gathers in high precision and quantizes the whole.  The per-shard
path gives the codes and scales of the whole tensor: rowwise blocks run along K inside a row, and the
quantizable check puts every columnwise block (32, 128 or 16 rows) inside one shard; NVFP4's rowwise and
post-RHT columnwise amaxes are MAX-reduced over ``tp_group`` first (``with_amax_reduction``), i.e. the whole
tensor's.  fp8sim therefore gathers in high precision and quantizes the whole (test_distributed_te_tp.py
checks the per-shard path against it).  Not so under NVFP4 stochastic rounding (TE's default for the grad
output, or a column-parallel input whose QParams ask for it): each rank rounds its own shard (the GEMM
counter's seeds, alike on every rank), so the GEMM's two quantizations of the gathered tensor run per
shard (``_tp_nvfp4``: this rank's rows, the reduced amaxes, its GEMM's SR seeds, codes and scales gathered
as TE lays them), or, for a shard TE cannot quantize, on the whole tensor after TE's warning.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...recipe import DelayedScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling
from ...scaling.amax import amax_nan_skipping_tensor
from ...scaling.current import compute_scale_from_amax
from .. import _comm
from .._comm import get_distributed_world_size
from ..quantization import current_state, get_recipe
from . import _tp_fp8_io as fio
from ._fp8_handoff import FP8Handoff
from ._operands import PER_TENSOR, _role_qparams, cast_per_tensor
from ._tp_fp8_io import _gather_fp8

__all__ = [
    "divide",
    "get_distributed_world_size",
    "gather_along_first_dim",
    "reduce_scatter_along_first_dim",
    "allreduce",
    "tp_linear",
    "module_tp_linear",
]


# block recipes under sequence parallelism: a high-precision gather, then the whole tensor's quantization
_BLOCK = (MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling)


def divide(numerator: int, denominator: int) -> int:
    """TE ``utils.divide``: ``numerator // denominator``, refusing a remainder with TE's message."""
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def _split_per_rank(parameters_split: Any, out_features: int, tp_size: int) -> dict[str, int]:
    """TE linear.py: the split sizes of the full weight, each divided by ``tp_size`` (TE's error)."""
    from ._params import split_names

    names, _, sizes = split_names(parameters_split, out_features)
    for size in sizes:
        if size % tp_size != 0:
            raise RuntimeError(
                f"Attempting to distribute a parameter with out_features={size} "
                f"between {tp_size} tensor-parallel processes"
            )
    return {n.removesuffix("_weight"): size // tp_size for n, size in zip(names, sizes, strict=True)}


def shard_features(
    tp_size: int, parallel_mode: str | None, in_features: int, out_features: int, parameters_split: Any
) -> tuple[int, int, Any]:
    """TE linear.py / layernorm_linear.py: this rank's ``(in_features, out_features, parameters_split)``:
    column parallel divides the output features (each split of the full weight too), row the input ones."""
    if parallel_mode == "column":
        if parameters_split is not None:
            parameters_split = _split_per_rank(parameters_split, out_features, tp_size)
        out_features = divide(out_features, tp_size)
    elif parallel_mode == "row":
        in_features = divide(in_features, tp_size)
    return in_features, out_features, parameters_split


def gather_along_first_dim(inp: torch.Tensor, group: Any) -> torch.Tensor:
    """TE ``gather_along_first_dim`` for a plain tensor: every rank's ``inp`` concatenated along dim 0."""
    return _comm.gather_along_first_dim(inp, group)[0]


def reduce_scatter_along_first_dim(inp: torch.Tensor, group: Any) -> torch.Tensor:
    """TE ``reduce_scatter_along_first_dim``: the SUM over ranks, this rank's slice of dim 0 (TE's error)."""
    return _comm.reduce_scatter_along_first_dim(inp, group)[0]


def allreduce(inp: torch.Tensor, group: Any) -> torch.Tensor:
    """TE ``distributed.allreduce`` on a copy: the SUM over ranks, the input (an autograd value) left as it is."""
    if get_distributed_world_size(group) == 1:
        return inp
    return _comm.allreduce(inp.contiguous().clone(), group)[0]


# -- FP8 all-gather ----------------------------------------------------------------------------------
def _quantize_local(g: Any, x: torch.Tensor, recipe: Any, kind: str, group: Any) -> Any:
    """This rank's shard quantized as TE's quantizer would before the all-gather: delayed scaling with
    the slot's scale (its amax joins the staging row), current scaling with the amax MAX-reduced over
    ``group`` (TE ``with_amax_reduction``)."""
    x2 = x.reshape(-1, x.shape[-1])
    if isinstance(recipe, DelayedScaling):
        return g._quantize(x2, recipe, kind, 1)
    import torch.distributed as dist

    from ...recipe import tensor_format

    fmt = tensor_format(recipe.fp8_format, kind != "grad")
    amax = torch.tensor([amax_nan_skipping_tensor(x2)], dtype=torch.float32)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    qp = _role_qparams(recipe, kind)
    scale = compute_scale_from_amax(np.float32(amax.item()), fmt.max, pow2=qp.power_2_scale, eps=qp.amax_epsilon)
    return cast_per_tensor(x2, fmt, scale, g.stats)


def _fp8_per_tensor() -> Any:
    st = current_state()
    if not st.enabled:
        return None
    recipe = get_recipe()
    return recipe if isinstance(recipe, PER_TENSOR) else None


class _GatherInput(torch.autograd.Function):
    """Column + sequence parallel: the input all-gathered along dim 0 (FP8 under a per-tensor recipe: the
    dequantized values flow on, the codes ride in ``slot``); backward: dgrad reduce-scattered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: Any, name: str, slot: dict) -> torch.Tensor:  # type: ignore[override]
        ctx.group, ctx.dtype = module.tp_group, x.dtype
        recipe = _fp8_per_tensor()
        if recipe is None:  # NVFP4 with stochastic rounding: the GEMM quantizes each rank's shard (_tp_nvfp4)
            _nvfp4_shards(module, name, "input", tuple(x.shape))
            return gather_along_first_dim(x, module.tp_group)
        g = module.fp8_gemms[name]
        g.ensure(recipe, current_state().group)
        g.group = current_state().group
        op = _quantize_local(g, x, recipe, "input", module.tp_group)
        h = _gather_fp8(op, tuple(x.shape), module.tp_group)
        slot["input_fp8"] = h
        return h.dequant(x.dtype)

    @staticmethod
    def backward(ctx: Any, dgrad: torch.Tensor) -> tuple:
        return reduce_scatter_along_first_dim(dgrad, ctx.group), None, None, None


class _CopyToTP(torch.autograd.Function):
    """Column parallel without sequence parallel: identity forward, dgrad all-reduced backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, dgrad: torch.Tensor) -> tuple:
        return allreduce(dgrad, ctx.group), None


class _GradSlot:
    """Stands in for ``LinearOptions.out_handoff``: the backward reads the FP8 grad output from ``grad``."""

    grad: FP8Handoff | None = None


class _ReduceOutput(torch.autograd.Function):
    """Row parallel: the partial outputs all-reduced (or reduce-scattered with sequence parallel).
    Backward with sequence parallel: the local grad output all-gathered (in FP8 under a per-tensor
    recipe, handed to the GEMM's backward through ``slot``)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, module: Any, name: str, slot: _GradSlot, recipe: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.module, ctx.name, ctx.slot, ctx.recipe = module, name, slot, recipe
        ctx.block = get_recipe() if recipe is None and current_state().enabled else None
        if module.sequence_parallel:
            return reduce_scatter_along_first_dim(out, module.tp_group)
        return allreduce(out, module.tp_group)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        m = ctx.module
        if not m.sequence_parallel:
            return dy, None, None, None, None
        recipe = ctx.recipe
        if recipe is None or getattr(recipe, "backward_override", None) is not None:  # TE: a high-precision gather
            if ctx.block is not None:  # NVFP4 with stochastic rounding: per-shard quantization (_tp_nvfp4)
                _nvfp4_shards(m, ctx.name, "grad", tuple(dy.shape), ctx.block)
            return gather_along_first_dim(dy, m.tp_group), None, None, None, None
        op = _quantize_local(m.fp8_gemms[ctx.name], dy, recipe, "grad", m.tp_group)
        h = _gather_fp8(op, tuple(dy.shape), m.tp_group)
        ctx.slot.grad = h
        return h.dequant(dy.dtype), None, None, None, None


def check_tp_forward(module: Any) -> None:
    """TE ``prepare_forward``: a group for ``tp_size > 1``, and amax reduction for sequence parallel under
    delayed scaling (TE's messages)."""
    if module.tp_size > 1 and module.tp_group is None:
        raise RuntimeError(
            "Tensor parallel group not initialized. Call "
            "set_tensor_parallel_group() before forward pass when tp_size > 1."
        )
    recipe = get_recipe() if current_state().enabled else None
    if module.sequence_parallel and recipe is not None and not isinstance(recipe, (*PER_TENSOR, *_BLOCK)):
        raise NotImplementedError(f"fp8sim: sequence_parallel under {type(recipe).__name__} is not emulated")
    if module.sequence_parallel and getattr(recipe, "backward_override", None) == "high_precision":
        raise NotImplementedError(
            "fp8sim: sequence_parallel with backward_override='high_precision' (TE re-gathers the original input)"
        )
    if module.sequence_parallel and isinstance(recipe, DelayedScaling) and not recipe.reduce_amax:
        raise ValueError(
            "Amax reduction across tensor parallel group is necessary when using sequence parallelism with FP8."
        )


def _nvfp4_shards(module: Any, name: str, kind: str, shard_shape: tuple, recipe: Any = None) -> None:
    """GEMM ``name``'s quantizations of the gathered ``kind`` made per shard where TE's differ from the whole
    tensor's (NVFP4 stochastic rounding: each rank rounds its own shard, ``_tp_nvfp4``), else cleared."""
    from ._tp_nvfp4 import set_shard_hook

    g = module.fp8_gemms[name]
    if recipe is None:
        recipe = get_recipe() if current_state().enabled else None
    set_shard_hook(g, recipe, kind, shard_shape, module.tp_group)


def _check_gathered_sr(module: Any, mode: str) -> None:
    """TE's refusal of a row-scaled NVFP4 input with the amax reduction sequence parallel puts on it (column).
    NVFP4 stochastic rounding of a gathered tensor is emulated per shard (``_tp_nvfp4``)."""
    if not (module.sequence_parallel and current_state().enabled) or mode != "column":
        return
    recipe = get_recipe()
    if isinstance(recipe, NVFP4BlockScaling) and recipe.row_scaled_activation:
        raise RuntimeError("Row-scaled NVFP4 quantization does not support amax reduction.")


def tp_linear(
    module: Any, name: str, mode: str, inp: torch.Tensor, run: Any, bias: torch.Tensor | None, io: dict | None = None
) -> torch.Tensor:
    """``run(x, fp8_io)`` (GEMM ``name`` on this rank's shard, without the bias in row mode) wrapped in
    TE's TP collectives for ``mode`` ("column" or "row"); ``bias``: the row-parallel bias, added in the
    output's dtype after the reduction; ``io``: the caller's FP8 boundaries (``fp8_output``, ``fp8_grad``,
    an FP8 input), on this rank's side of the collectives, and where they meet one, as TE's
    ``Float8Tensor`` meets it (``_tp_fp8_io``)."""
    check_tp_forward(module)
    _check_gathered_sr(module, mode)
    if mode == "column":
        slot: dict = {}
        h_in = (io or {}).get("input_fp8")
        if module.sequence_parallel and (io or {}).get("input_q") is not None:
            # TE linear.py 378-419: the quantized input all-gathered as it is (gather_along_first_dim)
            raise NotImplementedError(
                f"fp8sim: a {type(io['input_q']).__name__} input to a column-parallel layer with "
                "sequence_parallel=True (TE all-gathers the block-scaled data as it is) is not emulated"
            )
        if module.sequence_parallel and h_in is not None and _fp8_per_tensor() is not None:
            x = fio.GatherFP8Input.apply(inp, h_in, module.tp_group, slot)  # TE gathers an FP8 input as it is
        elif module.sequence_parallel:
            x = _GatherInput.apply(inp, module, name, slot)
        elif (io or {}).get("fp8_grad") and torch.is_grad_enabled() and inp.requires_grad:
            fio.check_allreduce_keeps_fp8("dgrad")
            x = fio.LocalDgrad.apply(inp)
        else:
            x = _CopyToTP.apply(inp, module.tp_group)
        fp8_io = None
        if slot.get("input_fp8") is not None:
            fp8_io = {"input_fp8": slot["input_fp8"], "fp8_output": False, "fp8_grad": False}
        return run(x, _with_io(fp8_io, io))
    recipe = _fp8_per_tensor()
    gslot = _GradSlot()
    fp8_io = None
    if module.sequence_parallel and recipe is not None:
        fp8_io = {"input_fp8": None, "fp8_output": False, "fp8_grad": False, "out_handoff": gslot}
    fp8_out = bool(io and io.get("fp8_output"))
    if fp8_out and not module.sequence_parallel:
        if getattr(module, "symmetric_ar_type", None) not in (None, "nccl"):
            # TE distributed.py symmetric_all_reduce 2081-2090: the sum is copied back into the Float8Tensor,
            # i.e. re-quantized by its quantizer (quantized_tensor.py 889), unlike the plain all-reduce
            raise NotImplementedError(
                "fp8sim: fp8_output on a row-parallel layer with symmetric_ar_type="
                f"{module.symmetric_ar_type!r} (TE re-quantizes the reduced sum into the FP8 output) is not emulated"
            )
        fio.check_allreduce_keeps_fp8("output")
    part = run(inp, _with_io(fp8_io, io))
    if fp8_out and (module.sequence_parallel or bias is not None):  # TE returns a high-precision tensor
        h_out = fio.drop_output_handoff(module)
        gslot = h_out if h_out is not None else gslot  # its ``grad``: the gathered FP8 grad output
    if fp8_out and not module.sequence_parallel:
        out = part  # TE's all-reduce leaves the Float8Tensor as it is (``_tp_fp8_io``)
    else:
        out = _ReduceOutput.apply(part, module, name, gslot, recipe)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out


def _with_io(fp8_io: dict | None, io: dict | None) -> dict | None:
    """The collectives' FP8 options merged with the caller's.  The caller's boundaries are local to the rank
    (TE ``multi_head_attention.py``: the column-parallel QKV output and its FP8 grad, the row-parallel
    proj's FP8 input and FP8 dgrad are this rank's heads), so they pass through; an FP8 input the
    collectives gathered (column + sequence parallel) replaces the caller's local one."""
    if not io:
        return fp8_io
    merged = dict(fp8_io or {"input_fp8": None})
    merged.update(fp8_output=io["fp8_output"], fp8_grad=io["fp8_grad"])
    if io.get("input_fp8") is not None and merged.get("input_fp8") is None:
        merged["input_fp8"] = io["input_fp8"]
    merged["input_q"] = io.get("input_q")  # a block-scaled input is never gathered here (tp_linear refuses it)
    return merged


def module_tp_linear(
    module: Any, mode: str, name: str, x: torch.Tensor, w: torch.Tensor, b: Any, *args: Any, **kw: Any
) -> torch.Tensor:
    """``module._linear(name, x, w, b, *args, **kw)`` on this rank's shard in TE's collectives for ``mode``,
    with the caller's FP8 hand-offs (``fp8_io``) where TE puts them (:func:`tp_linear`)."""
    io = kw.pop("fp8_io", None)
    row = mode == "row"

    def run(xx: torch.Tensor, fp8_io: dict | None) -> torch.Tensor:
        return module._linear(name, xx, w, None if row else b, *args, **kw, fp8_io=fp8_io)

    return tp_linear(module, name, mode, x, run, b if row else None, io)
