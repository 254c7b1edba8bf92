"""FP8 tensors handed between modules without a dequantize/requantize (TE passes ``Float8Tensor``s).

fp8sim's modules exchange ordinary tensors (the dequantized values in the activation dtype, so that
autograd and every other consumer see what TE's ``Float8Tensor`` dequantizes to) and attach the FP8
data, codes and ``scale_inv``, as :class:`FP8Handoff` under :data:`ATTR`.  A consumer that takes FP8
input (``Linear``, ``DotProductAttention``) uses the codes and scale as its operand and skips its own
quantizer, as TE does.  The backward goes the other way through ``grad``: the consumer's backward
stores the FP8 gradient it wrote (``fp8_grad=True``, DPA's dQKV) in the producer's handoff, and the
producer's backward uses it as its FP8 grad-output operand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...formats import FloatFormat
from ...recipe import DelayedScaling, tensor_format
from ...scaling.current import quantize_current_scaling
from ...scaling.quantized import QuantizedData
from ._operands import PER_TENSOR, Operand, quantize_operand
from ._quantized_input import check_input_scaling

__all__ = ["ATTR", "FP8Handoff", "attach", "handoff_of", "boundary_cast"]

ATTR = "_fp8sim_fp8"


@dataclass
class FP8Handoff:
    """Per-tensor FP8 data of a tensor: ``vals`` (decoded codes, float32), ``codes`` (uint8), both the
    tensor's shape, ``sinv`` (float32 ``scale_inv``) and ``fmt``.  ``grad``: the FP8 gradient (an
    FP8Handoff of the same shape) when the consumer's backward wrote one; ``on_grad``: where a
    consumer that splits the tensor (MultiheadAttention) sends its gradient parts instead."""

    vals: torch.Tensor
    codes: torch.Tensor
    sinv: float
    fmt: FloatFormat
    grad: FP8Handoff | None = None
    on_grad: Any = None
    qt: Any = None  # the QuantizedData record the codes came from, where there is one

    @classmethod
    def of_record(cls, q: QuantizedData, device: Any = None) -> FP8Handoff:
        """The hand-off of a per-tensor record (a TE ``Float8Tensor``'s ``quantized_data()``)."""
        op = Operand.of_per_tensor(q, device)
        return cls(op.vals, op.codes, op.scale_inv, q.fmt, qt=q)

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        """``fl32(vals * scale_inv)`` rounded to ``dtype`` (``Float8Tensor.dequantize(dtype=...)``)."""
        return (self.vals * torch.tensor(self.sinv, dtype=torch.float32)).to(dtype)

    def map(self, fn: Any) -> FP8Handoff:
        """The same data with ``fn`` (a layout change: view, permute, split part) applied to values and codes."""
        return FP8Handoff(fn(self.vals), fn(self.codes), self.sinv, self.fmt)


def attach(t: torch.Tensor, h: FP8Handoff) -> torch.Tensor:
    setattr(t, ATTR, h)
    return t


def handoff_of(t: Any) -> FP8Handoff | None:
    h = getattr(t, ATTR, None)
    return h if isinstance(h, FP8Handoff) and h.vals.shape == t.shape else None


def float8_input(t: Any) -> FP8Handoff | None:
    """A TE ``Float8Tensor`` (per-tensor FP8 data) as the hand-off of a module input: TE's GEMM modules
    use its codes and ``scale_inv`` and skip their INPUT quantizer (``linear.py``: a
    ``QuantizedTensorStorage`` input is not quantized again), so its amax joins no amax history."""
    from ..tensor.storage.float8_tensor_storage import Float8TensorStorage

    if not isinstance(t, Float8TensorStorage) or (t._data is None and t._transpose is None):
        return None
    return FP8Handoff.of_record(t.quantized_data(), t.device)


def fp8_boundaries(inp: Any, fp8_output: bool, fp8_grad: bool) -> dict | None:
    """The FP8-boundary options of one Linear/LayerNormLinear call (``LinearOptions`` fields), or None.
    Outside FP8 autocast TE ignores ``fp8_output``/``fp8_grad`` (``linear.py`` ``_get_quantizers``: no
    quantizers when FP8 is off), and so does fp8sim.  Inside, fp8sim emulates them under the per-tensor
    recipes (DelayedScaling, Float8CurrentScaling) and refuses them under the block recipes.  A TE quantized
    tensor input is used as it is: ``input_fp8`` (a ``Float8Tensor``) or ``input_q`` (MXFP8, FP8 block,
    NVFP4), its scaling mode checked against the recipe's weight as TE's GEMM checks it."""
    from ...recipe import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling, Recipe
    from ..quantization import current_state, get_recipe

    st = current_state()
    if not st.enabled:
        return None
    recipe: Recipe = get_recipe()
    if (fp8_output or fp8_grad) and not isinstance(recipe, PER_TENSOR):
        msg = (
            "transformer_engine.pytorch: FP8 outputs (fp8_output / fp8_grad) are emulated by fp8sim under"
            f" DelayedScaling and Float8CurrentScaling only; not under {type(recipe).__name__}"
        )
        if isinstance(recipe, (MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling)):
            # TE general_gemm takes these output quantizers (cpp_extensions/gemm.py 169-175) and casts the
            # GEMM output unfused (gemm.cpp 218-233, 392-396); the output is rowwise only (linear.py 520-521)
            # and fp8sim's hand-off carries one per-tensor scale
            msg += (
                " (TE writes the GEMM output in the activation dtype, then casts it with the block-scaled OUTPUT /"
                " GRAD_INPUT quantizer, rowwise only: a block-scaled FP8 hand-off is not emulated)"
            )
        raise NotImplementedError(msg)
    h, q_in = handoff_of(inp), None
    if h is None and check_input_scaling(inp, recipe):  # a TE quantized tensor: used as it is (_quantized_input)
        if isinstance(recipe, PER_TENSOR):
            h = float8_input(inp)
        else:
            q_in = inp
    if h is None and q_in is None and not (fp8_output or fp8_grad):
        return None
    return {"input_fp8": h, "input_q": q_in, "fp8_output": fp8_output, "fp8_grad": fp8_grad}


def boundary_cast(d: torch.Tensor, recipe: Any, forward: bool, scaler: Any, index: int, act: torch.dtype) -> Operand:
    """A GEMM result ``d`` (float32) written in FP8 by TE's ``general_gemm`` with an output quantizer: the
    OUTPUT slot (``forward``, fwd index 2) or the GRAD_INPUT slot (bwd index 1).

    Delayed scaling is fused (gemm.cpp 224-228: a ``Float8Quantizer`` with FP8 operands): cuBLAS takes the
    amax of its float32 result and casts it with the slot's scale.  Current scaling is unfused (gemm.cpp
    218-233, 392-396): the GEMM writes ``d`` in the activation dtype ``act``, then the slot's
    ``Float8CurrentScalingQuantizer`` (quantizer.cpp 980-1033) takes its amax, the scale (the recipe-wide
    ``use_power_2_scales``, amax epsilon 0: ``quantization.py`` ``Float8CurrentScalingRecipeState.make_quantizers``;
    ``linear.py`` ``_customize_quantizers_float8_current_scaling`` reconfigures only the input, weight and
    grad-output slots from the QParams) and casts."""
    if isinstance(recipe, DelayedScaling):
        return quantize_operand(d, recipe, "input" if forward else "grad", 1, scaler=scaler, index=index)
    fmt = tensor_format(recipe.fp8_format, forward)
    da = d.to(act)
    q = quantize_current_scaling(da.detach(), fmt, pow2=bool(recipe.use_power_2_scales), eps=0.0)
    return Operand.of_per_tensor(q, da.device)


def attach_output(module: Any, out: torch.Tensor, fp8_io: dict | None) -> torch.Tensor:
    """Attach the FP8 output the last GEMM call wrote (``fp8_output=True``) to its returned tensor."""
    opts = module.__dict__.pop("_last_opts", None)
    if fp8_io and fp8_io.get("fp8_output") and opts is not None and opts.out_handoff is not None:
        attach(out, opts.out_handoff)
    return out
