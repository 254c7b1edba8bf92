"""TE's rotary position embeddings (``attention/rope.py``): ``RotaryPositionEmbedding`` and
``apply_rotary_pos_emb``, high precision (TE never quantizes them).

Frequencies are ``positions x base^(-2i/dim)`` in float32; non-interleaved embeddings repeat them as
``[f, f]``, interleaved as ``[f0, f0, f1, f1, ...]``.  Applying them computes ``cos``/``sin`` in float32,
casts to the tensor's dtype, and rotates the first ``freqs.shape[-1]`` channels:
``t * cos + rotate_half(t) * sin`` with ``rotate_half([x1, x2]) = [-x2, x1]`` (pairs for interleaved).
``fused=True`` is accepted and gives the same formula (TE's fused kernel is the same math in float32).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]


class RotaryPositionEmbedding(nn.Module):
    """TE ``RotaryPositionEmbedding(dim, rotary_percent=1.0, seq_len_interpolation_factor=None,
    pretrained_max_position_embeddings=None, rotary_base=10000.0, interleaved=False)``;
    ``forward(max_seq_len, offset=0)`` returns ``[max_seq_len, 1, 1, dim]`` float32 angles."""

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: int | None = None,
        pretrained_max_position_embeddings: int | None = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if rotary_percent < 1.0:
            dim = int(dim * rotary_percent)
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.rotary_base = rotary_base
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.interleaved = interleaved
        exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        with torch.autocast(device_type=self.inv_freq.device.type, enabled=False):
            seq = torch.arange(max_seq_len, dtype=self.inv_freq.dtype, device=self.inv_freq.device) + offset
            pretrained, factor = self.pretrained_max_position_embeddings, self.seq_len_interpolation_factor
            if pretrained is not None and factor is not None:
                # position interpolation: fixed by the factor, or dynamic beyond the trained range
                seq = seq * (1 / (max_seq_len / pretrained) if max_seq_len > pretrained * factor else 1 / factor)
            freqs = torch.outer(seq, self.inv_freq)
        if self.interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).reshape(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.reshape(emb.shape[0], 1, 1, emb.shape[1])


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    pairs = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1)
    return pairs.reshape(*x.shape)


def _rotate(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    rot = freqs.shape[-1]
    head, rest = t[..., :rot], t[..., rot:]
    return torch.cat((head * cos + _rotate_half(head, interleaved) * sin, rest), dim=-1)


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """TE ``apply_rotary_pos_emb``: rotate ``t`` (``[s, b, h, d]``, ``[b, s, h, d]`` or ``[t, h, d]``)
    by ``freqs`` (``[s2, 1, 1, d2]``, ``s2 >= s``, ``d2 <= d``); ``start_positions[i]`` offsets
    sequence i; ``thd`` needs ``cu_seqlens``.  Context parallelism (``cp_size > 1``) is not emulated."""
    if tensor_format not in ("sbhd", "bshd", "thd"):
        raise ValueError(f"Unsupported tensor_format: {tensor_format}.")
    if tensor_format == "thd" and cu_seqlens is None:
        raise AssertionError("cu_seqlens must not be None when tensor_format is 'thd'.")
    if cp_size != 1:
        raise NotImplementedError("fp8sim does not emulate context parallelism (cp_size > 1)")
    if freqs.shape[-1] > t.shape[-1]:
        raise ValueError(f"freqs has {freqs.shape[-1]} rotary channels, more than the tensor's {t.shape[-1]}")
    if tensor_format == "thd":
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        pieces = []
        for i, x in enumerate(torch.split(t, lens)):
            f = freqs[int(start_positions[i]) :] if start_positions is not None else freqs
            pieces.append(_rotate(x, f[: x.shape[0]].squeeze(1), interleaved))  # [s, 1, d]: heads broadcast
        return torch.cat(pieces)
    s = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    if start_positions is not None:
        if int(start_positions.max()) + s > freqs.shape[0]:
            raise AssertionError(f"Rotary Embeddings only suppported up to {freqs.shape[0]} sequence length!")
        freqs = torch.cat([freqs[int(i) : int(i) + s] for i in start_positions], dim=1)  # [s, b, 1, d]
    else:
        if s > freqs.shape[0]:
            raise AssertionError(f"Rotary Embeddings only suppported up to {freqs.shape[0]} sequence length!")
        freqs = freqs[:s]
    if tensor_format == "bshd":
        freqs = freqs.transpose(0, 1)
    return _rotate(t, freqs, interleaved)
