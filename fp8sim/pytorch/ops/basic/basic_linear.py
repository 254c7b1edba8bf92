"""``BasicLinear``: ``y = x W^T`` as a fusible op (TE 2.20.0.dev0 ``ops/basic/basic_linear.py``).

Quantizers: forward input and weight, backward grad output (roles ``linear``/``input``, ``weight``,
``grad_output``); the output and grad-input quantizers are the neighbouring ops'.  Under
``Float8CurrentScaling`` the per-role ``power_2_scale`` of the recipe's ``QParams`` applies, but not
their ``amax_epsilon``: TE sets it on an attribute its quantizer does not read (``amax_epsilon_scales``),
so the recipe-wide epsilon (0) stays in force; fp8sim reproduces that with an ``UpstreamQuirkWarning``.
Tensor parallelism (``tensor_parallel_mode`` "column" / "row", ``sequence_parallel``) runs TE's
collectives over ``torch.distributed``; Userbuffers overlap is refused.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ...._util.upstream_quirk import UpstreamQuirkWarning
from ...quantization import FP8GlobalStateManager
from ...tensor import QuantizerRole
from .._common import (
    SUPPORTED_DTYPES,
    canonicalize_device,
    canonicalize_dtype,
    compute_dtype,
    devices_match,
    get_accumulate_flag_in_param,
    get_dummy_wgrads_for_params,
    get_main_grad_from_param,
    is_quantized_tensor,
)
from .._gemm import GemmMode
from ..op import BasicOperation, OperationContext
from ._linear_gemms import linear_backward, linear_forward

__all__ = ["BasicLinear"]


def _canonicalize_tp(
    mode: str | None, group: Any, sequence_parallel: bool, in_features: int, out_features: int
) -> tuple[str | None, Any, int, bool, int, int]:
    """TE ``_canonicalize_tensor_parallelism``: ``(mode, group, size, sequence_parallel, local_in, local_out)``."""
    size = 1 if mode is None else torch.distributed.get_world_size(group)
    if size == 1:
        mode, group, sequence_parallel = None, None, False
    local_in, local_out = in_features, out_features
    if mode == "column":
        if out_features % size != 0:
            raise ValueError(
                f"Invalid configuration for tensor parallelism ({mode=}, {out_features=}, group_size={size})"
            )
        local_out //= size
    elif mode == "row":
        if in_features % size != 0:
            raise ValueError(
                f"Invalid configuration for tensor parallelism ({mode=}, {in_features=}, group_size={size})"
            )
        local_in //= size
    elif mode is not None:
        raise ValueError(f'Supported modes for tensor parallelism are `None`, "row", and "column" (got {mode=})')
    return mode, group, size, sequence_parallel, local_in, local_out


class BasicLinear(BasicOperation):
    """``y = x W^T`` (``torch.nn.Linear`` without bias).  ``accumulate_into_main_grad``: wgrad is added into
    ``weight.main_grad`` (overwritten when the weight has ``overwrite_main_grad=True``)."""

    _functional_forward = staticmethod(linear_forward)
    _functional_backward = staticmethod(linear_backward)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Callable[[], Any] | None = None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if userbuffers_options is not None:
            raise NotImplementedError(
                "BasicLinear(userbuffers_options=...): Userbuffers communication overlap needs CUDA "
                "(peer-to-peer GPU buffers) and is not emulated by fp8sim"
            )
        self.in_features, self.out_features = in_features, out_features
        device, dtype = canonicalize_device(device), canonicalize_dtype(dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"Supported dtypes are float32, float16, bfloat16 (got {dtype})")
        (
            self.tensor_parallel_mode,
            self.tensor_parallel_group,
            self.tensor_parallel_size,
            self.sequence_parallel,
            self.local_in_features,
            self.local_out_features,
        ) = _canonicalize_tp(tensor_parallel_mode, tensor_parallel_group, sequence_parallel, in_features, out_features)
        self._with_quantized_weight = FP8GlobalStateManager.with_fp8_parameters()
        if self._with_quantized_weight:
            self.reset_recipe_state(recipe=FP8GlobalStateManager.get_fp8_recipe())
        weight = torch.empty(self.local_out_features, self.local_in_features, device=device, dtype=dtype)
        self.register_parameter("weight", torch.nn.Parameter(weight))
        self._rng_state_tracker_function = rng_state_tracker_function
        if weight.device.type != "meta":
            self.reset_parameters()
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self._userbuffers_options = userbuffers_options

    @classmethod
    def _canonicalize_tensor_parallelism(
        cls, *, mode: str | None, process_group: Any, sequence_parallel: bool, in_features: int, out_features: int
    ) -> tuple[str | None, Any, int, bool, int, int]:
        """TE: ``(mode, group, group_size, sequence_parallel, local_in_features, local_out_features)``."""
        return _canonicalize_tp(mode, process_group, sequence_parallel, in_features, out_features)

    def num_quantizers(self, mode: str) -> int:
        return {"forward": 2, "backward": 1}.get(mode, 0)

    def get_quantizer_roles(self, mode: str) -> list[QuantizerRole] | None:
        name = getattr(self, "name", "") or ""
        if mode == "forward":
            return [QuantizerRole("linear", "input", name), QuantizerRole("linear", "weight", name)]
        if mode == "backward":
            return [QuantizerRole("linear", "grad_output", name)]
        return None

    def reset_parameters(self) -> None:
        """Kaiming-uniform init (``a=sqrt(5)``, as ``torch.nn.Linear``), in the RNG tracker's fork when given;
        quantized with the weight quantizer inside ``quantized_model_init``."""
        weight = self.weight
        device = weight.device if weight.device.type != "meta" else canonicalize_device(None)
        if is_quantized_tensor(weight):
            weight = torch.empty(weight.size(), dtype=weight.dtype, device=device)
        elif not devices_match(weight.device, device):
            weight = torch.empty_like(weight, device=device)
        if self._rng_state_tracker_function is not None:
            with self._rng_state_tracker_function().fork():
                torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        else:
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        if self._with_quantized_weight:
            quantizer = self.get_quantizer("forward", 1)
            if quantizer is None:
                raise RuntimeError(
                    "Tried to quantize weight with deferred initialization "
                    "due to meta device, but no quantizer was available. "
                    "This is most likely because the weight was initialized "
                    "within quantized_model_init, but the forward pass was not "
                    "performed within autocast."
                )
            quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())
            quantizer.internal = False
            with torch.no_grad():
                weight = quantizer(weight)
        self.weight = weight if isinstance(weight, torch.nn.Parameter) else torch.nn.Parameter(weight)

    def pre_first_fuser_forward(self) -> None:
        super().pre_first_fuser_forward()
        if self.weight.device.type == "meta":
            self.reset_parameters()

    def pre_fuser_forward(self, *, requires_grad: bool) -> None:
        super().pre_fuser_forward(requires_grad=requires_grad)
        if not FP8GlobalStateManager.is_fp8_enabled():
            return
        columnwise = requires_grad and self.weight.requires_grad
        if FP8GlobalStateManager.get_fp8_recipe().backward_override is not None:
            columnwise = False
        self.get_quantizer("forward", 0).set_usage(rowwise=True, columnwise=columnwise)
        self.get_quantizer("forward", 1).set_usage(rowwise=True, columnwise=requires_grad)
        self.get_quantizer("backward", 0).set_usage(rowwise=True, columnwise=columnwise)

    def reset_recipe_state(self, *, recipe: Any) -> None:
        super().reset_recipe_state(recipe=recipe)
        inp, grad, weight_q = (self.get_quantizer(m, i) for m, i in (("forward", 0), ("backward", 0), ("forward", 1)))
        if inp is not None:
            inp.internal = True
            inp.optimize_for_gemm = not (self.tensor_parallel_mode == "column" and self.sequence_parallel)
        if grad is not None:
            grad.internal = True
            grad.optimize_for_gemm = not (self.tensor_parallel_mode == "row" and self.sequence_parallel)
        weight = getattr(self, "weight", None)
        if weight_q is not None:
            exposed = FP8GlobalStateManager.with_fp8_parameters() or getattr(self, "_with_quantized_weight", False)
            weight_q.internal = not (exposed or is_quantized_tensor(weight))
        if recipe is not None and recipe.float8_current_scaling():
            for q, qp in (
                (inp, recipe.fp8_quant_fwd_inp),
                (weight_q, recipe.fp8_quant_fwd_weight),
                (grad, recipe.fp8_quant_bwd_grad),
            ):
                q.force_pow_2_scales = qp.power_2_scale
                q.amax_epsilon_scales = qp.amax_epsilon  # TE's attribute: the quantizer reads ``amax_epsilon``
                if qp.amax_epsilon:
                    warnings.warn(
                        f"te.ops: Float8CurrentScaling QParams amax_epsilon={qp.amax_epsilon} has no effect on "
                        "BasicLinear's quantizers in TE 2.20 (set as `amax_epsilon_scales`, which the quantizer "
                        "does not read); fp8sim reproduces that",
                        UpstreamQuirkWarning,
                        stacklevel=2,
                    )
        if weight_q is not None and is_quantized_tensor(weight):
            if weight._quantizer is not None:  # keep the usages the weight was made with
                weight_q.set_usage(
                    rowwise=weight._quantizer.rowwise_usage, columnwise=weight._quantizer.columnwise_usage
                )
            weight.update_quantizer(weight_q.copy())

    def _fp8_args(self) -> tuple[bool, str | None]:
        fp8 = FP8GlobalStateManager.is_fp8_enabled()
        return fp8, FP8GlobalStateManager.get_fp8_recipe().backward_override if fp8 else None

    def _save_linear_ctx(
        self, ctx: OperationContext, input_: Any, x_local: Any, w: Any, fp8: bool, override: str | None, **kw: Any
    ) -> None:
        """What TE saves for the linear backward (shared with the fused forwards)."""
        if override == "high_precision":
            saved_x = input_ if kw["weight_requires_grad"] else None
            saved_w = self.weight if kw["input_requires_grad"] else None
        else:
            saved_x, saved_w = x_local, w
        if override == "dequantized":  # TE: its internal quantizers' results are storages, not tensors
            saved_x = _as_internal(saved_x, kw.get("input_quantizer"))
            saved_w = _as_internal(saved_w, kw.get("weight_quantizer"))
        ctx.save_for_backward(saved_x, saved_w)
        ctx.with_quantized_compute = fp8 and override is None
        ctx.backward_override = override
        for key, value in kw.items():
            setattr(ctx, key, value)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        input_rg = ctx.requires_grad
        weight_rg = ctx.requires_grad and self.weight.requires_grad
        fp8, override = self._fp8_args()
        dtype = compute_dtype(input_, self.weight.dtype)
        mode = GemmMode.current()
        quantizers = dict(
            input_quantizer=self.get_quantizer("forward", 0),
            weight_quantizer=self.get_quantizer("forward", 1),
            grad_output_quantizer=self.get_quantizer("backward", 0),
            grad_input_quantizer=prev_op_grad_output_quantizer,
        )
        out, x_local, w = linear_forward(
            input_,
            self.weight,
            dtype=dtype,
            tensor_parallel_mode=self.tensor_parallel_mode,
            tensor_parallel_group=self.tensor_parallel_group,
            sequence_parallel=self.sequence_parallel,
            with_quantized_compute=fp8,
            backward_override=override,
            input_quantizer=quantizers["input_quantizer"],
            weight_quantizer=quantizers["weight_quantizer"],
            output_quantizer=next_op_input_quantizer,
            input_requires_grad=input_rg,
            weight_requires_grad=weight_rg,
            gemm_mode=mode,
        )
        if ctx.requires_grad:
            self._save_linear_ctx(
                ctx, input_, x_local, w, fp8, override, dtype=dtype, gemm_mode=mode,
                input_requires_grad=input_rg, weight_requires_grad=weight_rg, **quantizers,
            )  # fmt: skip
        return out

    def _main_grad(self, ctx: OperationContext) -> tuple[torch.Tensor | None, bool]:
        """Megatron-LM wgrad fusion: ``(main_grad to write into, accumulate?)``."""
        if not (ctx.weight_requires_grad and self._accumulate_into_main_grad):
            return None, False
        main_grad = get_main_grad_from_param(self.weight, op_label="BasicLinear")
        return main_grad.detach(), get_accumulate_flag_in_param(self.weight)

    def _linear_backward(self, ctx: OperationContext, grad_output: Any, **kw: Any) -> tuple[Any, Any]:
        """The backward GEMMs from what the forward saved (shared with the fused backwards)."""
        x_local, w = ctx.saved_tensors
        grad_weight, accumulate = self._main_grad(ctx)
        kw.setdefault("dtype", ctx.dtype)
        dx, dw = linear_backward(
            grad_output,
            x_local,
            w,
            input_requires_grad=ctx.input_requires_grad,
            weight_requires_grad=ctx.weight_requires_grad,
            grad_weight=grad_weight,
            accumulate_into_grad_weight=accumulate,
            tensor_parallel_mode=self.tensor_parallel_mode,
            tensor_parallel_group=self.tensor_parallel_group,
            sequence_parallel=self.sequence_parallel,
            with_quantized_compute=ctx.with_quantized_compute,
            input_quantizer=ctx.input_quantizer,
            weight_quantizer=ctx.weight_quantizer,
            grad_output_quantizer=ctx.grad_output_quantizer,
            grad_input_quantizer=ctx.grad_input_quantizer,
            gemm_mode=getattr(ctx, "gemm_mode", None),  # a custom fused forward may not set it
            **kw,
        )
        if accumulate:  # added into main_grad: autograd gets TE's dummy gradient (overwriting returns main_grad)
            dw = get_dummy_wgrads_for_params([self.weight])[0]
        return dx, dw

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        dx, dw = self._linear_backward(ctx, grad_output)
        return dx, [dw]


def _as_internal(t: Any, quantizer: Any) -> Any:
    """What TE's ``internal=True`` quantizer returned for ``t``: its storage (fp8sim's quantizers give the
    full tensor; the storage view shares its buffers)."""
    from ...tensor.quantized_tensor import QuantizedTensor
    from ...tensor.storage.quantized_tensor_storage import as_storage

    if isinstance(t, QuantizedTensor) and getattr(quantizer, "internal", False):
        return as_storage(t)
    return t
