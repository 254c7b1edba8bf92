"""``GroupedLinear`` as a fusible op (TE 2.20.0.dev0 ``ops/basic/grouped_linear.py``): ``num_groups``
linear layers, each applied to its slice of the input rows; the split sizes are the op's extra input.

fp8sim runs TE's "split-quantize" flow (``tex.split_quantize`` + ``general_grouped_gemm``): each group's
input, weight and grad output are quantized by that group's quantizers (forward ``input``/``weight`` slots
``2g``/``2g+1``, backward ``grad_output`` slot ``g``) and its GEMMs are the ones :class:`BasicLinear` runs,
the bias in the forward GEMM's float32 epilogue; the bias gradient is each group's float32 row sum.  TE's
graph-safe grouped-tensor path needs CUDA grouped-GEMM kernels (``is_op_fuser_grouped_tensor_path_supported``
is False here), so ``single_grouped_weight`` / ``single_grouped_bias`` raise TE's error for a device without
it.  ``scale_bias`` adds ``bias * scale`` per row (a second extra input); caller buffers for the output and
the grad input come through ``Sequential(op_kwargs={op: {OUTPUT_BUFFER_KEY / GRAD_INPUT_BUFFER_KEY: t}})``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ....recipe import Recipe
from ...quantization import FP8GlobalStateManager
from ...tensor import QuantizerRole
from .._common import (
    SUPPORTED_DTYPES,
    canonicalize_device,
    canonicalize_dtype,
    compute_dtype,
    get_accumulate_flag_in_param,
    get_dummy_wgrads_for_params,
    get_main_grad_from_param,
    is_quantized_tensor,
    maybe_dequantize,
    validate_or_alloc_output,
)
from .._gemm import GemmMode, ops_gemm
from ..op import BasicOperation, OperationContext
from .add_extra_input import _overrides

__all__ = ["GroupedLinear", "is_op_fuser_grouped_tensor_path_supported", "OUTPUT_BUFFER_KEY", "GRAD_INPUT_BUFFER_KEY"]

OUTPUT_BUFFER_KEY = "output"
GRAD_INPUT_BUFFER_KEY = "grad_input"


def is_op_fuser_grouped_tensor_path_supported(recipe: Recipe | None, dtype: Any) -> bool:  # noqa: ARG001
    """TE: whether the graph-safe grouped-tensor path (CUDA grouped GEMM kernels) serves ``recipe``; never here."""
    return False


class GroupedLinear(BasicOperation):
    """``num_groups`` linears ``y_g = x_g W_g^T (+ b_g)`` over the row splits given as the extra input."""

    num_extra_inputs = 1

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        rng_state_tracker_function: Callable[[], Any] | None = None,
        accumulate_into_main_grad: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        delay_wgrad_compute: bool = False,
        scale_bias: bool = False,
    ) -> None:
        self._scale_bias = scale_bias and bias
        if self._scale_bias:
            self.num_extra_inputs = 2
        super().__init__()
        self.num_groups, self.in_features, self.out_features = num_groups, in_features, out_features
        self.single_grouped_weight, self.single_grouped_bias = single_grouped_weight, single_grouped_bias and bias
        self.use_bias = bias
        self._delay_wgrad = delay_wgrad_compute
        self._wgrad_pending: list[Callable[[], None]] = []
        for name, value in (("number of groups", num_groups), ("input size", in_features)):
            if value <= 0:
                raise ValueError(f"Invalid {name} ({value})")
        if out_features <= 0:
            raise ValueError(f"Invalid output size ({out_features})")
        device, dtype = canonicalize_device(device), canonicalize_dtype(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"Supported dtypes are float32, float16, bfloat16 (got {dtype})")
        self._with_quantized_weight = FP8GlobalStateManager.with_fp8_parameters()
        if self._with_quantized_weight:
            self.reset_recipe_state(recipe=FP8GlobalStateManager.get_fp8_recipe())
        self._rng_state_tracker_function = rng_state_tracker_function
        for g in range(num_groups):
            w = torch.empty(out_features, in_features, device=device, dtype=dtype)
            self.register_parameter(f"weight{g}", torch.nn.Parameter(w))
        for g in range(num_groups):
            b = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
            self.register_parameter(f"bias{g}", b)
        if device.type != "meta":
            self.reset_parameters()
        self._accumulate_into_main_grad = accumulate_into_main_grad

    @property
    def has_bias(self) -> bool:
        return self.use_bias

    def num_quantizers(self, mode: str) -> int:
        return {"forward": 2 * self.num_groups, "backward": self.num_groups}.get(mode, 0)

    def get_quantizer_roles(self, mode: str) -> list[QuantizerRole] | None:
        name = getattr(self, "name", "") or ""
        if mode == "forward":
            pair = [QuantizerRole("linear", "input", name), QuantizerRole("linear", "weight", name)]
            return pair * self.num_groups
        if mode == "backward":
            return [QuantizerRole("linear", "grad_output", name)] * self.num_groups
        return None

    def _weights(self) -> list[torch.Tensor]:
        return [getattr(self, f"weight{g}") for g in range(self.num_groups)]

    def reset_parameters(self) -> None:
        """Kaiming-uniform weights (one packed buffer, as TE), zero biases; quantized in ``quantized_model_init``."""
        w0 = self.weight0
        device = w0.device if w0.device.type != "meta" else canonicalize_device(None)
        packed = torch.empty(self.num_groups, self.out_features, self.in_features, dtype=w0.dtype, device=device)
        weights = [packed[g] for g in range(self.num_groups)]
        for w in weights:
            if self._rng_state_tracker_function is not None:
                with self._rng_state_tracker_function().fork():
                    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            else:
                torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        if self._with_quantized_weight:
            quantizers = [self.get_quantizer("forward", 2 * g + 1) for g in range(self.num_groups)]
            if any(q is None for q in quantizers):
                raise RuntimeError(
                    "Tried to quantize weight with deferred initialization due to meta device, but no quantizer "
                    "was available. This is most likely because the weight was initialized within "
                    "quantized_model_init, but the forward pass was not performed within autocast."
                )
            for q in quantizers:
                q.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())
                q.internal = False
            with torch.no_grad():
                weights = [q(w) for q, w in zip(quantizers, weights, strict=True)]
        for g, w in enumerate(weights):
            setattr(self, f"weight{g}", w if isinstance(w, torch.nn.Parameter) else torch.nn.Parameter(w))
        if self.use_bias:
            packed_b = torch.zeros(self.num_groups, self.out_features, dtype=w0.dtype, device=device)
            for g in range(self.num_groups):
                setattr(self, f"bias{g}", torch.nn.Parameter(packed_b[g]))

    def pre_first_fuser_forward(self) -> None:
        super().pre_first_fuser_forward()
        if any(p.device.type == "meta" for p in self.parameters()):
            self.reset_parameters()
        ref = self.weight0
        for g, w in enumerate(self._weights()):
            for what, got, want in (("dtype", w.dtype, ref.dtype), ("device", w.device, ref.device)):
                if got != want:
                    raise RuntimeError(f"Weight {g} has invalid {what} (expected {want}, got {got}).")
            if w.requires_grad != ref.requires_grad:
                raise RuntimeError(
                    f"Weight {g} has requires_grad={w.requires_grad}, but expected requires_grad={ref.requires_grad}."
                )
        for g in range(self.num_groups):
            b = getattr(self, f"bias{g}")
            if self.use_bias and b is None:
                raise RuntimeError(f"Expected biases, but bias {g} is uninitialized")
            if not self.use_bias and b is not None:
                raise RuntimeError(f"Expected no biases, but bias {g} is initialized")

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        super().pre_fuser_forward(requires_grad=requires_grad)
        if not FP8GlobalStateManager.is_fp8_enabled():
            return
        weight_rg = requires_grad and self.weight0.requires_grad
        for g in range(self.num_groups):
            self.get_quantizer("forward", 2 * g).set_usage(rowwise=True, columnwise=weight_rg)
            self.get_quantizer("forward", 2 * g + 1).set_usage(rowwise=True, columnwise=requires_grad)
            self.get_quantizer("backward", g).set_usage(rowwise=True, columnwise=weight_rg)

    def reset_recipe_state(self, *, recipe: Recipe | None) -> None:
        super().reset_recipe_state(recipe=recipe)
        for g in range(getattr(self, "num_groups", 0)):
            inp, wq = self.get_quantizer("forward", 2 * g), self.get_quantizer("forward", 2 * g + 1)
            grad = self.get_quantizer("backward", g)
            for q in (inp, grad):
                if q is not None:
                    q.internal = True
            weight = getattr(self, f"weight{g}", None)
            if wq is not None:
                exposed = FP8GlobalStateManager.with_fp8_parameters() or getattr(self, "_with_quantized_weight", False)
                wq.internal = not (exposed or is_quantized_tensor(weight))
            if recipe is not None and recipe.float8_current_scaling():
                for q, qp in ((inp, recipe.fp8_quant_fwd_inp), (wq, recipe.fp8_quant_fwd_weight)):
                    q.force_pow_2_scales, q.amax_epsilon_scales = qp.power_2_scale, qp.amax_epsilon
                grad.force_pow_2_scales = recipe.fp8_quant_bwd_grad.power_2_scale
                grad.amax_epsilon_scales = recipe.fp8_quant_bwd_grad.amax_epsilon
            if wq is not None and is_quantized_tensor(weight):
                if weight._quantizer is not None:
                    wq.set_usage(rowwise=weight._quantizer.rowwise_usage, columnwise=weight._quantizer.columnwise_usage)
                weight.update_quantizer(wq.copy())

    def op_forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "forward").replace("{self.__class__.__name__}", type(self).__name__))

    def op_backward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "backward").replace("{self.__class__.__name__}", type(self).__name__))

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list]:
        if self._accumulate_into_main_grad and getattr(self.weight0, "main_grad", None) is None:
            raise RuntimeError("MAIN GRAD NOT FOUND" if not hasattr(self.weight0, "main_grad") else "MAIN GRAD IS NONE")
        ctx, n = basic_op_ctxs[0], self.num_groups
        input_rg, weight_rg = ctx.requires_grad, ctx.requires_grad and self.weight0.requires_grad
        fp8 = FP8GlobalStateManager.is_fp8_enabled()
        dtype = compute_dtype(input_, self.weight0.dtype)
        split_sizes = basic_op_extra_inputs[0][0]
        if int(split_sizes.numel()) != n:
            raise ValueError(f"Expected {n} splits, but got {int(split_sizes.numel())}.")
        if self.single_grouped_weight or self.single_grouped_bias:
            raise RuntimeError(
                "Single grouped parameters require the native grouped-tensor GroupedLinear path, "
                "which is unavailable for the current device, dtype, or quantization recipe. "
                "Disable single_grouped_weight/single_grouped_bias or use a supported grouped-"
                "tensor configuration."
            )
        splits = [int(s) for s in split_sizes.tolist()]
        mode = GemmMode.current()
        in_q = [self.get_quantizer("forward", 2 * g) if fp8 else None for g in range(n)]
        w_q = [self.get_quantizer("forward", 2 * g + 1) if fp8 else None for g in range(n)]
        ws = []
        for w, q in zip(self._weights(), w_q, strict=True):
            if not fp8:
                w = maybe_dequantize(w, dtype)
            elif not is_quantized_tensor(w):
                q.set_usage(rowwise=True, columnwise=input_rg)
                w = q(w)
            ws.append(w)
        x = maybe_dequantize(input_, dtype)
        xs = list(torch.split(x, splits))
        if fp8:
            for g, q in enumerate(in_q):
                q.set_usage(rowwise=True, columnwise=weight_rg)
                xs[g] = q(xs[g]) if splits[g] else None
        out = validate_or_alloc_output(
            basic_op_kwargs[0].get(OUTPUT_BUFFER_KEY), [*input_.shape[:-1], self.out_features], dtype, x.device
        )
        biases = [maybe_dequantize(getattr(self, f"bias{g}"), dtype) for g in range(n)] if self.use_bias else None
        use_gemm_bias = self.use_bias and not self._scale_bias
        for g, (out_g, x_g) in enumerate(zip(torch.split(out, splits), xs, strict=True)):
            if splits[g]:
                b = biases[g] if use_gemm_bias else None
                out_g.copy_(ops_gemm(ws[g], x_g, out_dtype=dtype, bias=b, mode=mode))
        if self._scale_bias:
            scales = basic_op_extra_inputs[0][1]
            for out_g, b, s in zip(torch.split(out, splits), biases, torch.split(scales, splits), strict=True):
                out_g.add_(b.unsqueeze(0) * s.unsqueeze(-1))
        if ctx.requires_grad:
            if fp8:
                for w, p in zip(ws, self._weights(), strict=True):
                    if input_rg and w is not p:
                        w.update_usage(rowwise_usage=False, columnwise_usage=True)
                for x_g in xs:
                    if weight_rg and x_g is not None:
                        x_g.update_usage(rowwise_usage=False, columnwise_usage=True)
            saved = [split_sizes] + (xs if weight_rg else [None] * n) + (ws if input_rg else [None] * n)
            if self._scale_bias:
                saved.append(basic_op_extra_inputs[0][1])
            ctx.save_for_backward(*saved)
            ctx.with_quantized_compute, ctx.dtype, ctx.gemm_mode = fp8, dtype, mode
            ctx.grad_output_quantizers = [self.get_quantizer("backward", g) if fp8 else None for g in range(n)]
            ctx.input_requires_grad, ctx.weight_requires_grad = input_rg, weight_rg
            ctx.dgrad_out = basic_op_kwargs[0].get(GRAD_INPUT_BUFFER_KEY)
        return out, [()]

    def fuser_backward(
        self, basic_op_ctxs: list[OperationContext], grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        ctx, n = basic_op_ctxs[0], self.num_groups
        split_sizes, xs, ws = ctx.saved_tensors[0], ctx.saved_tensors[1 : 1 + n], ctx.saved_tensors[1 + n : 1 + 2 * n]
        scales = ctx.saved_tensors[1 + 2 * n] if self._scale_bias else None
        splits = [int(s) for s in split_sizes.tolist()]
        dy = maybe_dequantize(grad_output, ctx.dtype)
        dys = list(torch.split(dy, splits))
        if ctx.with_quantized_compute:
            for g, q in enumerate(ctx.grad_output_quantizers):
                q.set_usage(rowwise=ctx.input_requires_grad, columnwise=ctx.weight_requires_grad)
                dys[g] = q(dys[g]) if splits[g] else None
        grad_biases, grad_scales = [None] * n, None
        if self.use_bias:  # TE's grouped dbias: a float32 row sum per group
            dy_groups = torch.split(dy.reshape(-1, dy.shape[-1]).float(), splits)
            if self._scale_bias:
                s32 = torch.split(scales.float(), splits)
                grad_biases = [(d * s.unsqueeze(-1)).sum(0).to(ctx.dtype) for d, s in zip(dy_groups, s32, strict=True)]
                biases = [getattr(self, f"bias{g}").float() for g in range(n)]
                grad_scales = torch.cat([(d * b).sum(-1) for d, b in zip(dy_groups, biases, strict=True)])
                grad_scales = grad_scales.to(scales.dtype)
            else:
                grad_biases = [d.sum(0).to(ctx.dtype) for d in dy_groups]
        grad_input = None
        if ctx.input_requires_grad:
            shape = [*grad_output.shape[:-1], self.in_features]
            grad_input = validate_or_alloc_output(getattr(ctx, "dgrad_out", None), shape, ctx.dtype, dy.device)
            for g, gi in enumerate(torch.split(grad_input, splits)):
                if splits[g]:
                    gi.copy_(ops_gemm(ws[g], dys[g], layout="NN", out_dtype=ctx.dtype, mode=ctx.gemm_mode))
        weight_grads: list[Any] = [None] * n
        if ctx.weight_requires_grad:
            weight_grads = self._wgrads(ctx, xs, dys, splits)
        if not self.use_bias:
            grad_params = weight_grads
        else:
            grad_params = weight_grads + grad_biases
        return grad_input, [grad_params], [(None, grad_scales) if self._scale_bias else (None,)]

    def _wgrads(self, ctx: OperationContext, xs: Any, dys: list, splits: list[int]) -> list:
        """The wgrad GEMMs (now, or at :meth:`backward_dw`) into new buffers or the weights' ``main_grad``."""
        weights = self._weights()
        accumulate = False
        if self._accumulate_into_main_grad:
            outs = [get_main_grad_from_param(w, op_label="GroupedLinear") for w in weights]
            accumulate = get_accumulate_flag_in_param(weights[0])
        else:
            outs = list(torch.empty(self.num_groups, self.out_features, self.in_features, dtype=ctx.dtype))

        @torch.no_grad()  # backward_dw runs it outside autograd's backward
        def run() -> None:
            for g, out in enumerate(outs):
                if splits[g]:
                    dw = ops_gemm(
                        xs[g],
                        dys[g],
                        layout="NT",
                        out_dtype=out.dtype,
                        accumulate=accumulate,
                        out=out,
                        mode=ctx.gemm_mode,
                    )
                    out.copy_(dw)
                elif not accumulate:
                    out.zero_()

        if self._delay_wgrad:
            self._wgrad_pending.append(lambda: (run(), self._set_delayed_grads(outs)))
            return [None] * self.num_groups
        run()
        if self._accumulate_into_main_grad:
            return get_dummy_wgrads_for_params(weights)
        return outs

    def _set_delayed_grads(self, outs: list) -> None:
        if self._accumulate_into_main_grad:
            return
        for w, dw in zip(self._weights(), outs, strict=True):
            w.grad = dw.to(w.dtype)

    def need_backward_dw(self) -> bool:
        """Whether :meth:`backward_dw` must run to finish the weight gradients (``delay_wgrad_compute``)."""
        return self._delay_wgrad

    def backward_dw(self) -> None:
        """Run the delayed wgrad GEMMs (TE ``delay_wgrad_compute``)."""
        pending, self._wgrad_pending = self._wgrad_pending, []
        for fn in pending:
            fn()
