"""TE's ``Fp8Padding`` and ``Fp8Unpadding`` (``module/fp8_padding.py``, ``module/fp8_unpadding.py`` at d0067d0):
pad each row split of a grouped GEMM's input to the recipe's alignment with zero rows, and take the padding
off again (the gradients go the other way)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._tex import fused_multi_row_padding, fused_multi_row_unpadding
from ..quantization import get_align_size_for_quantization, get_recipe

__all__ = ["Fp8Padding", "Fp8Unpadding"]


def _rows(rows: list[int], inp: torch.Tensor, fill: Any) -> torch.Tensor:
    in_features = inp.shape[-1]
    out = torch.empty([sum(rows), in_features], dtype=inp.dtype, device=inp.device)
    fill(inp.contiguous().view(-1, in_features), out)
    return out


class _Pad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, m_splits: list[int], padded: list[int]) -> torch.Tensor:
        if ctx is not None:  # None: called directly under no_grad (TE keeps nothing then, fp8_padding.py:44)
            ctx.m_splits, ctx.padded = m_splits, padded
        return _rows(padded, inp, lambda i, o: fused_multi_row_padding(i, o, m_splits, padded))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        m_splits, padded = ctx.m_splits, ctx.padded
        return _rows(m_splits, grad, lambda i, o: fused_multi_row_unpadding(i, o, padded, m_splits)), None, None


class _Unpad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, m_splits: list[int], padded: list[int]) -> torch.Tensor:
        if ctx is not None:
            ctx.m_splits, ctx.padded = m_splits, padded
        return _rows(m_splits, inp, lambda i, o: fused_multi_row_unpadding(i, o, padded, m_splits))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        m_splits, padded = ctx.m_splits, ctx.padded
        return _rows(padded, grad, lambda i, o: fused_multi_row_padding(i, o, m_splits, padded)), None, None


class _Aligned(nn.Module):
    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms, self.align_size = num_gemms, align_size

    def _padded(self, m_splits: list[int]) -> list[int]:
        assert len(m_splits) == self.num_gemms, "Number of splits should match number of GEMMs."  # noqa: S101
        if self.align_size is None:  # TE: fixed from the recipe of the first forward
            self.align_size = get_align_size_for_quantization(get_recipe())
        a = self.align_size
        return [(m + a - 1) // a * a for m in m_splits]


class Fp8Padding(_Aligned):
    """``Fp8Padding(num_gemms, align_size=None)``; ``forward(inp, m_splits) -> (padded, padded_m_splits)``.
    ``align_size`` defaults to the active recipe's (32 MXFP8, 128 NVFP4, 16 otherwise, a custom recipe's
    ``quantization_alignment``), read on the first forward."""

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, list[int]]:
        padded = self._padded(list(m_splits))
        if list(m_splits) == padded:
            return inp, m_splits
        if torch.is_grad_enabled():
            return _Pad.apply(inp, list(m_splits), padded), padded
        return _Pad.forward(None, inp, list(m_splits), padded), padded


class Fp8Unpadding(_Aligned):
    """``Fp8Unpadding(num_gemms, align_size=None)``; ``forward(inp, m_splits)``: the rows of each padded
    split that ``m_splits`` keeps."""

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        padded = self._padded(list(m_splits))
        if list(m_splits) == padded:
            return inp
        if torch.is_grad_enabled():
            return _Unpad.apply(inp, list(m_splits), padded)
        return _Unpad.forward(None, inp, list(m_splits), padded)
