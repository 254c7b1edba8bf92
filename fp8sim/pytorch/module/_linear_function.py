"""The FP8 linear autograd function: fprop, dgrad and wgrad GEMMs on quantized operands.

Backward as TE's ``module/linear.py`` does it: ``recipe.backward_override`` "high_precision" runs
dgrad and wgrad on the unquantized weight and input, "dequantized" on the dequantized forward
operands, both with an unquantized gradient in the activation dtype and without updating backward
scales; ``fuse_wgrad_accumulation`` adds wgrad into ``weight.main_grad`` (float32 GEMM output);
``delay_wgrad_compute`` defers wgrad to ``backward_dw()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...recipe import DelayedScaling, Recipe, tensor_format
from ..quantization import current_state, reduce_and_update_fp8_tensors
from ..tensor.quantized_tensor import QuantizedTensorStorage, prepare_for_saving, restore_from_saved
from ._fp8_handoff import FP8Handoff, boundary_cast
from ._gemm import GemmSite, gemm
from ._gemm_plan import DEFAULT, out_name, record_plan
from ._operands import Operand
from ._quantized_input import input_operand
from ._saved_operands import rowwise_storage

__all__ = ["fp8_linear", "hp_linear", "LinearOptions", "LinearBwdArgs"]


@dataclass
class LinearOptions:
    """Per-call options of the FP8 linear function (what TE passes in ``LinearFwdArgs``)."""

    weight_param: Any = None  # the parameter object: ``main_grad`` lives there
    fuse_wgrad_accumulation: bool = False
    wgrad_store: list | None = None  # delay_wgrad_compute: (callable) entries for backward_dw
    save_original_input: bool = False
    # the output rounded to the activation dtype but held in float32, so that the consumer's gradient
    # reaches the GEMM unrounded (TE's fused dact+quantize under delayed scaling)
    output_fp32: bool = False
    # FP8 boundaries (TE ``Linear(fp8_output=, fp8_grad=)`` and a ``Float8Tensor`` input; per-tensor recipes):
    input_fp8: FP8Handoff | None = None  # the input's codes and scale_inv: the INPUT quantizer is skipped
    # a TE block-scaled tensor input (MXFP8, FP8 block, NVFP4): its rowwise copy for fprop, its columnwise
    # copy for wgrad, the INPUT quantizer skipped (``_quantized_input``)
    input_q: Any = None
    fp8_output: bool = False  # the output written in FP8 with the OUTPUT slot (fwd index 2)
    fp8_grad: bool = False  # dgrad written in FP8 with the GRAD_INPUT slot (bwd index 1)
    out_handoff: FP8Handoff | None = None  # set by forward when fp8_output; its ``grad`` feeds backward
    site: GemmSite | None = None  # which module GEMM this is (messages, plans)


def _gemm_out(recipe: Recipe, fused_fp8: bool, forward: bool, act: torch.dtype) -> Any:
    """The dtype TE's GEMM writes: FP8 where delayed scaling fuses the output cast into cuBLAS
    (``fp8_output`` / ``fp8_grad``; current scaling writes ``act`` and casts after), else ``act``."""
    if fused_fp8 and isinstance(recipe, DelayedScaling):
        return tensor_format(recipe.fp8_format, forward).name
    return act


def _hp_gemm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, site: Any = None, role: str = "") -> torch.Tensor:
    """A high-precision GEMM as cuBLAS runs it for bf16/fp16/fp32 operands: float32 accumulation,
    one rounding to ``dtype`` (its plan recorded for ``fp8sim explain``)."""
    if site is not None:
        fmt = out_name(dtype)
        gemm_name = "" if site.gemm == "gemm" else site.gemm
        record_plan(
            site.module, gemm_name, role, m=a.shape[0], n=b.shape[1], k=a.shape[1], a_format=fmt, b_format=fmt,
            scaling="high precision", out_dtype=fmt, use_fast_accum=None, accumulator=DEFAULT, profile=None,
            split=1, scheme="none", source="default", note="recipe.backward_override: not an FP8 GEMM",
        )  # fmt: skip
    return torch.matmul(a.to(dtype).float(), b.to(dtype).float())


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        inp: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        module: Any,
        recipe: Recipe,
        accumulator: str | None,
        is_first_microbatch: bool | None,
        first: bool,
        act_dtype: torch.dtype,
        opts: LinearOptions | None = None,
    ) -> torch.Tensor:
        opts = opts or LinearOptions()
        override = getattr(recipe, "backward_override", None)
        x = inp.reshape(-1, inp.shape[-1])
        per_tensor = module._per_tensor(recipe)
        h_in = opts.input_fp8 if per_tensor else None
        q_in = opts.input_q if not per_tensor else None
        if h_in is not None:  # TE: a Float8Tensor input is used as it is (no amax, no cast)
            k = x.shape[-1]
            x_row = Operand(None, h_in.fmt, h_in.vals.reshape(-1, k), h_in.codes.reshape(-1, k), h_in.sinv)
        elif q_in is not None:  # TE linear.py 423-424: any quantized input as it is, its rowwise copy
            x_row = input_operand(q_in, columnwise=False)
        else:
            x_row = module._quantize(x, recipe, "input", 1)
        w_row, w_col = module._weight_operands(weight, recipe, is_first_microbatch)
        custom = x_row.custom is not None  # TE's custom_gemm: the bias goes to the quantizer's qgemm
        out = gemm(
            x_row,
            w_row.t(),
            recipe,
            "fprop",
            accumulator,
            out_dtype=_gemm_out(recipe, opts.fp8_output, True, act_dtype),
            site=opts.site,
            bias=bias if custom else None,
        )
        if bias is not None and not custom:  # cuBLAS's epilogue: float32 sum with the (already cast) bias, one rounding
            out = out + bias.float()
        ctx.override = override
        if override is None:
            if q_in is not None:  # TE linear.py 1175-1177: the columnwise copy, asked for in the backward
                ctx.x_col = lambda: input_operand(q_in, columnwise=True)
            else:
                ctx.x_col = x_row if per_tensor else module._quantize(x, recipe, "input", 0)
            ctx.w_col = w_col
        else:
            _save_override_operands(ctx, override, inp, weight, bias, x_row, w_row, recipe, act_dtype)
        ctx.module, ctx.recipe, ctx.accumulator = module, recipe, accumulator
        ctx.first = first and override is None  # TE: no backward scale update with an override
        ctx.opts, ctx.is_first_microbatch = opts, is_first_microbatch
        ctx.has_bias, ctx.inp_shape, ctx.dtypes = bias is not None, inp.shape, (act_dtype, weight.dtype, inp.dtype)
        ctx.region = _region_modules() if ctx.first else []  # the live list: later modules join it
        ctx.backward_objects = LinearBwdArgs(override, ctx.first, opts.site, bias is not None, act_dtype, inp.shape)
        if opts.fp8_output:  # the result (bias included) cast with the OUTPUT slot, fused or not (boundary_cast)
            oq = boundary_cast(out, recipe, True, module.fwd, 2, act_dtype)
            shape = (*inp.shape[:-1], out.shape[-1])
            opts.out_handoff = FP8Handoff(oq.vals.reshape(shape), oq.codes.reshape(shape), oq.scale_inv, oq.fmt)
            out = oq.dequant()
        out = out.to(act_dtype)
        if opts.output_fp32:
            out = out.float()
        return out.reshape(*inp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        if torch.is_grad_enabled():  # create_graph=True: our GEMMs run outside autograd
            raise RuntimeError(
                "fp8sim.pytorch: create_graph=True (double backward) through an FP8 GEMM is not supported: "
                "the quantized GEMMs are not differentiable twice (neither are TransformerEngine's)"
            )
        with torch.autocast(grad_out.device.type, enabled=False):
            return _FP8Linear._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        module, recipe, acc, act = ctx.module, ctx.recipe, ctx.accumulator, ctx.dtypes[0]
        dy = grad_out.reshape(-1, grad_out.shape[-1])
        opts: LinearOptions = ctx.opts
        if ctx.override is None:
            h = opts.out_handoff.grad if opts.out_handoff is not None else None
            if h is not None and module._per_tensor(recipe):  # the consumer's FP8 gradient as it is
                n = dy.shape[-1]
                dy_row = Operand(None, h.fmt, h.vals.reshape(-1, n), h.codes.reshape(-1, n), h.sinv)
            else:
                dy_row = module._quantize(dy, recipe, "grad", 1)
            w_col = ctx.w_col() if callable(ctx.w_col) else ctx.w_col  # FSDP2: read in backward (_gemm_state)
            dgrad_out = _gemm_out(recipe, opts.fp8_grad, False, act)
            dgrad = gemm(dy_row, w_col, recipe, "dgrad", acc, out_dtype=dgrad_out, site=opts.site)
            if opts.fp8_grad:  # dgrad written in FP8 (GRAD_INPUT slot); the producer takes the codes
                gq = boundary_cast(dgrad, recipe, False, module.bwd, 1, act)
                if opts.input_fp8 is not None:
                    shape = ctx.inp_shape
                    opts.input_fp8.grad = FP8Handoff(
                        gq.vals.reshape(shape), gq.codes.reshape(shape), gq.scale_inv, gq.fmt
                    )
                dgrad = gq.dequant()
            dy_col = dy_row if module._per_tensor(recipe) else module._quantize(dy, recipe, "grad", 0)
            x_col = ctx.x_col
            if callable(x_col):  # a quantized input's columnwise copy, read where TE reads it: wgrad only
                x_col = x_col() if ctx.needs_input_grad[1] or opts.fuse_wgrad_accumulation else None

            main_grad = getattr(opts.weight_param, "main_grad", None) if opts.fuse_wgrad_accumulation else None
            wgrad_out = act if main_grad is None else main_grad.dtype  # TE linear.py: main_grad's dtype when fused

            def wgrad_fn(addend: torch.Tensor | None = None) -> torch.Tensor:
                return gemm(dy_col.t(), x_col, recipe, "wgrad", acc, out_dtype=wgrad_out, site=opts.site, addend=addend)

        else:
            dyh = dy.to(act)
            x_col, w_dgrad = _override_operands(ctx, act)
            dgrad = _hp_gemm(dyh, w_dgrad, act, opts.site, "dgrad")

            def wgrad_fn(addend: torch.Tensor | None = None) -> torch.Tensor:
                dw = _hp_gemm(dyh.t(), x_col, act, opts.site, "wgrad")
                return dw if addend is None else addend + dw

        dbias = dy.float().sum(0).to(ctx.dtypes[1]) if ctx.has_bias else None
        wgrad = _wgrad(ctx, wgrad_fn)
        if ctx.first:  # the first FP8 module's backward runs last: update every backward scale (spec 4.4)
            reduce_and_update_fp8_tensors(forward=False, token=ctx.region)
            for m in ctx.region:
                if not getattr(m, "_te_global_buffer", False):
                    m._update_backward_scales()
        return (dgrad.to(act).reshape(ctx.inp_shape), wgrad, dbias, None, None, None, None, None, None, None)


class LinearBwdArgs:
    """The backward's state as TE's ``LinearBwdArgs`` (``grad_fn.backward_objects``) shows it: ``fp8`` False,
    ``grad_output_quantizer`` None and no backward scale update under a ``backward_override`` (TE
    ``linear.py`` ``_linear_setup_ctx``); the quantizer is the module's grad-output slot, read when asked."""

    def __init__(
        self, override: str | None, first: bool, site: Any, use_bias: bool, act: torch.dtype, inp_shape: Any
    ) -> None:
        self.backward_override, self.fp8, self.reduce_and_update_bwd_fp8_tensors = override, override is None, first
        self.use_bias, self.activation_dtype, self.inp_shape, self._site = use_bias, act, inp_shape, site

    @property
    def grad_output_quantizer(self) -> Any:
        site = self._site
        if self.backward_override is not None or site is None or not hasattr(site.module, "quantizers"):
            return None
        names = list(getattr(site.module, "fp8_gemms", {site.gemm: None}))
        index = names.index(site.gemm) if site.gemm in names else 0
        return site.module.quantizers["scaling_bwd"][2 * index]


def _save_override_operands(
    ctx: Any, override: str, inp: torch.Tensor, weight: Any, bias: Any, x_row: Operand, w_row: Operand,
    recipe: Recipe, act: torch.dtype,
) -> None:  # fmt: skip
    """TE's saved tensors under a ``backward_override`` (``linear.py`` ``_linear_forward_impl``):
    ``[inputmat, weightmat, weight, bias]`` through ``prepare_for_saving``, ``inputmat`` the rowwise FP8
    storage of the input ("dequantized") or the input itself ("high_precision"), ``weightmat`` the rowwise
    FP8 storage of the weight.  Without a TE storage form (a custom recipe's slot) the dequantized values."""
    w_st = rowwise_storage(w_row, tuple(weight.shape), weight.dtype, recipe, "weight")
    if override == "dequantized":
        x_st = rowwise_storage(x_row, tuple(inp.shape), inp.dtype, recipe, "input")
        x_st = x_row.dequant().to(act).reshape(inp.shape) if x_st is None else x_st
        w_st = w_row.dequant().to(act) if w_st is None else w_st
    else:
        x_st = inp.detach()
    tensors, ctx.tensor_objects = prepare_for_saving(x_st, weight.detach() if w_st is None else w_st, weight, bias)
    ctx.save_for_backward(*tensors)


def _override_operands(ctx: Any, act: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, w)`` of the override's backward GEMMs from the saved tensors: the saved FP8 storages
    dequantized to the activation dtype (TE: ``dequantize(dtype=activation_dtype)``), or the original
    input and weight in the activation dtype."""
    x_s, w_s, w_orig, _ = restore_from_saved(ctx.tensor_objects, list(ctx.saved_tensors))
    if ctx.override == "dequantized":
        x, w = (t.dequantize(dtype=act) if isinstance(t, QuantizedTensorStorage) else t for t in (x_s, w_s))
    else:
        x, w = x_s.to(act), w_orig.detach().to(act)
    return x.reshape(-1, x.shape[-1]), w


def _wgrad(ctx: Any, wgrad_fn: Any) -> torch.Tensor | None:
    """wgrad now, into ``main_grad``, or deferred to ``backward_dw`` (TE ``linear.py`` backward)."""
    opts: LinearOptions = ctx.opts
    w = opts.weight_param
    if not ctx.needs_input_grad[1] and not opts.fuse_wgrad_accumulation:
        return None
    if w is not None and not w.requires_grad:  # TE linear.py 712/2008: no wgrad (nor main_grad) for a frozen weight
        return None
    if opts.wgrad_store is not None:
        opts.wgrad_store.append((wgrad_fn, ctx.dtypes[1]))
        return None
    if opts.fuse_wgrad_accumulation:
        main_grad = w.main_grad
        overwrite = ctx.is_first_microbatch is True or getattr(w, "overwrite_main_grad", False)
        # otherwise the GEMM accumulates into main_grad (beta = 1): C joins cuBLAS's float32 epilogue (gemm())
        dw = wgrad_fn() if overwrite else wgrad_fn(addend=main_grad.float())
        main_grad.copy_(dw.to(main_grad.dtype))
        if hasattr(w, "grad_added_to_main_grad"):  # Megatron-style DDP: a dummy gradient
            w.grad_added_to_main_grad = True
            return torch.zeros(w.shape, dtype=w.dtype, device=w.device)
        return None
    return wgrad_fn().to(ctx.dtypes[0])


class _HPLinear(torch.autograd.Function):
    """The high-precision linear as TE runs it without FP8: each GEMM one cuBLAS call with float32
    accumulation and one rounding to the output dtype (fprop: ``x W^T`` + bias in the epilogue; dgrad
    ``dy W``; wgrad ``dy^T x``, added into ``main_grad`` in float32 or deferred), so it agrees bit for bit
    with ``backward_override="high_precision"`` (torch's CPU bf16/fp16 matmul rounds otherwise)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, opts: LinearOptions, first_mb: Any):  # noqa: ANN205
        ctx.save_for_backward(x, w)
        ctx.opts, ctx.is_first_microbatch, ctx.has_bias = opts, first_mb, b is not None
        ctx.dtypes = (x.dtype, w.dtype, x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            out = torch.matmul(x.float(), w.float().t())
            if b is not None:
                out = out + b.float()
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x, w = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        with torch.autocast(dy.device.type, enabled=False):
            dgrad = _hp_gemm(dy2, w, dy.dtype).to(dy.dtype).reshape(*dy.shape[:-1], w.shape[-1])

            def wgrad_fn(addend: torch.Tensor | None = None) -> torch.Tensor:
                dw = _hp_gemm(dy2.t(), x2, dy.dtype)
                return dw if addend is None else addend + dw  # C joins the float32 epilogue (beta = 1)

            wgrad = _wgrad(ctx, wgrad_fn)
            dbias = dy2.float().sum(0).to(dy.dtype) if ctx.has_bias else None
        return dgrad, wgrad, dbias, None, None


hp_linear = _HPLinear.apply


def _region_modules() -> list:
    return current_state().modules


# fp8_linear(inp, weight, bias, gemm_state, recipe, accumulator, is_first_microbatch, first, act_dtype, opts)
# (``act_dtype``: output and dgrad dtype; the input may be a float32 producer output)
fp8_linear = _FP8Linear.apply
