"""DotProductAttention's FP8 boundaries: FP8 O for the consumer, its FP8 dO, FP8 dQ, dK, dV back.

TE ``attention/dot_product_attention/backends.py`` ``FusedAttnFunc``: ``is_output_fp8`` (O as a
Float8Tensor), a Float8Tensor ``d_out`` used as it is, and dQ, dK, dV returned in FP8 when the inputs
were FP8 (``is_input_fp8``).  fp8sim carries the FP8 data beside the tensors (``module._fp8_handoff``).
"""

from __future__ import annotations

import torch

from ....recipe import tensor_format
from ...module._fp8_handoff import FP8Handoff, attach
from ...module._operands import Operand
from ...quantization import get_recipe
from . import utils
from .backends import AttentionConfig, Quantizer

__all__ = ["attach_fp8_output", "send_dqkv"]


def attach_fp8_output(out: torch.Tensor, cfg: AttentionConfig, fmt: str, heads: int) -> torch.Tensor:
    """``fp8_output=True``: O in FP8 for the consumer (TE ``FusedAttnFunc``: delayed scaling keeps
    cuDNN's FP8 O; current scaling quantizes the F16 O with the O quantizer's current amax); the FP8
    dO that the consumer's backward writes (``Linear(fp8_grad=True)``) replaces the dO cast."""
    oq = cfg.saved.get("oq")
    if oq is not None:
        h = FP8Handoff(utils.from_bhsd(oq.vals, fmt), utils.from_bhsd(oq.codes, fmt), oq.scale_inv, oq.fmt)
    else:
        o_cast = cfg.saved.get("o_cast") or Quantizer("current", tensor_format(get_recipe().fp8_format, True))
        (cq,) = o_cast(out)
        h = FP8Handoff(cq.vals, cq.codes, cq.scale_inv, cq.fmt)
        out = out + (h.dequant(out.dtype) - out).detach()  # the value TE's Float8Tensor O dequantizes to
    shape4 = (*out.shape[:2], heads, -1)

    def dO() -> Operand | None:
        g = h.grad
        if g is None:
            return None
        vals, codes = (utils.to_bhsd(t.reshape(shape4), fmt) for t in (g.vals, g.codes))
        return Operand(None, g.fmt, vals, codes, g.sinv)

    cfg.do_in = dO
    return attach(out, h)


def send_dqkv(hs: list, d: list, fmt: str) -> None:
    """The FP8 dQ, dK, dV (``[b, h, s, d]``) back to the producers of FP8 Q, K, V, in their layout."""
    back = (lambda t: t.permute(2, 0, 1, 3)) if fmt == "sbhd" else (lambda t: t.permute(0, 2, 1, 3))
    grads = [FP8Handoff(back(g.vals), back(g.codes), g.scale_inv, g.fmt) for g in d]
    if hs[0].on_grad is not None:
        hs[0].on_grad(*grads)
    else:
        for h, g in zip(hs, grads, strict=True):
            h.grad = g
