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

__all__ = ["ATTR", "FP8Handoff", "attach", "handoff_of"]

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


def fp8_boundaries(inp: Any, fp8_output: bool, fp8_grad: bool) -> dict | None:
    """The FP8-boundary options of one Linear/LayerNormLinear call (``LinearOptions`` fields), or None.
    TE ignores ``fp8_output``/``fp8_grad`` outside FP8 autocast; fp8sim emulates them under delayed
    scaling (the recipe TE's MultiheadAttention asks them under) and refuses them elsewhere."""
    from ...recipe import DelayedScaling
    from ..quantization import current_state, get_recipe

    st = current_state()
    recipe = get_recipe() if st.enabled else None
    if (fp8_output or fp8_grad) and not isinstance(recipe, DelayedScaling):
        # TE ignores them outside FP8 autocast; fp8sim refuses rather than ignore a request it cannot honour
        raise NotImplementedError(
            "transformer_engine.pytorch: FP8 outputs (fp8_output / fp8_grad) are emulated by fp8sim inside"
            f" autocast under DelayedScaling only; got {type(recipe).__name__ if st.enabled else 'FP8 disabled'}"
        )
    if not st.enabled:
        return None
    h = handoff_of(inp)
    if h is None and not (fp8_output or fp8_grad):
        return None
    return {"input_fp8": h, "fp8_output": fp8_output, "fp8_grad": fp8_grad}


def attach_output(module: Any, out: torch.Tensor, fp8_io: dict | None) -> torch.Tensor:
    """Attach the FP8 output the last GEMM call wrote (``fp8_output=True``) to its returned tensor."""
    opts = module.__dict__.pop("_last_opts", None)
    if fp8_io and fp8_io["fp8_output"] and opts is not None and opts.out_handoff is not None:
        attach(out, opts.out_handoff)
    return out
