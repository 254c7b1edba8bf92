"""Masks, sliding windows, ALiBi and layout conversions of TE's attention (``dot_product_attention/utils.py``).

Everything works on the internal layout ``[b, h, s, d]``; masks are boolean with True = masked out,
shaped ``[b or 1, 1, s_q, s_kv]`` as TE's ``get_full_mask`` builds them.
"""

from __future__ import annotations

import math
import warnings

import torch

from ...constants import AttnMaskTypes

__all__ = [
    "AttnMaskTypes",
    "QKVFormats",
    "AttnBiasTypes",
    "check_set_window_size",
    "get_full_mask",
    "get_alibi_bias",
    "get_cu_seqlens",
    "to_bhsd",
    "from_bhsd",
]

QKVFormats = ("sbhd", "bshd", "thd")
AttnBiasTypes = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")


def normalize_mask_type(attn_mask_type: str) -> str:
    """TE's spellings: ``"padding,causal"`` / ``"causal,padding"`` / ``"causal_padding"`` = ``"padding_causal"``."""
    t = attn_mask_type.replace(",", "_")
    if t == "causal_padding":
        t = "padding_causal"
    if t not in AttnMaskTypes:
        raise ValueError(f"Invalid attn_mask_type: {attn_mask_type!r}; allowed: {', '.join(AttnMaskTypes)}")
    return t


def check_set_window_size(attn_mask_type: str, window_size: tuple[int, int] | None = None) -> tuple[int, int]:
    """TE's window rule: causal types take (-1, 0) or (>=0, 0); the others (-1, -1) or (>=0, >=0).
    A fixable mismatch warns and is corrected, as in TE; an impossible one raises with TE's message."""
    orig = None if window_size is None else tuple(window_size)
    if "causal" in attn_mask_type:
        if orig is None:
            return (-1, 0)
        if orig == (-1, -1) or (orig[0] >= 0 and orig[1] != 0):
            warnings.warn(
                "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type, stacklevel=3
            )
            return (orig[0], 0)
        if orig != (-1, 0) and (orig[0] < 0 or orig[1] != 0):
            raise AssertionError("window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type)
        return orig
    if attn_mask_type in ("no_mask", "padding", "arbitrary"):
        if orig is None:
            return (-1, -1)
        if orig == (-1, 0):
            warnings.warn(
                "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type, stacklevel=3
            )
            return (-1, -1)
        if orig != (-1, -1) and (orig[0] < 0 or orig[1] < 0):
            raise AssertionError("window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type)
        return orig
    raise AssertionError("Invalid attn_mask_type: " + attn_mask_type)


def get_full_mask(
    sq: int,
    skv: int,
    attn_mask_type: str,
    attention_mask: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
    window_size: tuple[int, int] | None,
    attention_type: str,
    bottom_right_alignment: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """TE's ``get_full_mask``: (mask, actual_seqlens_q, actual_seqlens_kv).  Key j is visible to query i
    iff it lies in the window ``[i + off - left, i + off + right]``, where ``off`` is 0 (top-left
    alignment) or ``s_kv - s_q`` per sequence (bottom-right), combined with the padding mask."""
    if window_size is None:
        window_size = (-1, -1)
    if "causal" in attn_mask_type:
        window_size = (window_size[0], 0)
    left = skv if window_size[0] == -1 else window_size[0]
    right = sq if window_size[1] == -1 else window_size[1]
    seq_q = seq_kv = None
    if "padding" in attn_mask_type:
        if attention_type == "self":
            mq = mkv = attention_mask
        else:
            mq, mkv = attention_mask
        attention_mask = torch.logical_or(mq.squeeze(1).unsqueeze(3), mkv)  # [b, 1, sq, skv]
        m = attention_mask.logical_not()
        seq_q, seq_kv = m[:, 0, :, 0].sum(dim=1), m[:, 0, 0, :].sum(dim=1)
    diff = torch.arange(sq).view(1, 1, sq, 1) - torch.arange(skv).view(1, 1, 1, skv)
    if attn_mask_type == "causal_bottom_right" or (
        attn_mask_type in ("no_mask", "arbitrary") and bottom_right_alignment
    ):
        off = skv - sq
    elif attn_mask_type in ("causal", "padding_causal") or (
        attn_mask_type in ("no_mask", "padding", "arbitrary") and not bottom_right_alignment
    ):
        off = 0
    else:  # padding_causal_bottom_right, or padding with bottom-right alignment: per sequence
        off = (seq_kv - seq_q).view(-1, 1, 1, 1)
    swa = ~((diff + off - left <= 0) & ~(diff + off + right < 0))
    mask = swa if attention_mask is None else torch.logical_or(swa, attention_mask.bool())
    return mask, seq_q, seq_kv


def get_alibi_bias(
    num_heads: int,
    sq: int,
    skv: int,
    alibi_slopes: torch.Tensor | None,
    bottom_right_alignment: bool,
    seq_q: torch.Tensor | None = None,
    seq_kv: torch.Tensor | None = None,
) -> torch.Tensor:
    """TE's ``get_alibi``: ``-slope * |i - j + off|`` (float32), default slopes ``2^(-8k/n)`` as in ALiBi."""
    if alibi_slopes is None:
        n = 2 ** math.floor(math.log2(num_heads))
        m = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, 1 + n))
        if n < num_heads:
            m = torch.cat([m, torch.pow(2.0 ** (-4.0 / n), torch.arange(1, 1 + 2 * (num_heads - n), 2))])
        alibi_slopes = m.to(torch.float32)
    if alibi_slopes.dim() not in (1, 2):
        raise ValueError("ALiBi slopes cannot exceed 2 dimensions.")
    shape = (1, alibi_slopes.shape[0], 1, 1) if alibi_slopes.dim() == 1 else (*alibi_slopes.shape, 1, 1)
    bias = torch.arange(sq, dtype=torch.int32).view(1, 1, sq, 1) - torch.arange(skv, dtype=torch.int32).view(
        1, 1, 1, skv
    )
    if seq_q is None:
        if bottom_right_alignment:
            bias = bias + skv - sq
    else:
        bias = bias.expand(seq_q.shape[0], 1, sq, skv)
        if bottom_right_alignment:
            bias = bias + (seq_kv - seq_q).view(-1, 1, 1, 1)
    return (bias.abs().mul(-1) * alibi_slopes.float().view(shape)).to(torch.float32)


def get_cu_seqlens(mask: torch.Tensor) -> torch.Tensor:
    """cu_seqlens (int32, [b + 1]) of a ``[b, 1, 1, s]`` padding mask (True = padding)."""
    lens = mask.logical_not().reshape(mask.shape[0], -1).sum(dim=1)
    return torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)])


def to_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """sbhd or bshd -> bhsd (a view)."""
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def from_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """bhsd -> sbhd or bshd, heads merged: ``[s, b, h*d]`` / ``[b, s, h*d]`` as TE returns."""
    y = x.permute(2, 0, 1, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)
    return y.reshape(*y.shape[:2], -1)


def thd_to_bhsd(x: torch.Tensor, cu_seqlens: torch.Tensor, offsets: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """``[t, h, d]`` packed sequences -> zero-padded ``[b, h, max_seqlen, d]`` (sequence i: rows
    ``offsets[i] : offsets[i] + len_i``)."""
    b = cu_seqlens.shape[0] - 1
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    out = x.new_zeros(b, max_seqlen, *x.shape[1:])
    rows = [torch.arange(int(offsets[i]), int(offsets[i]) + lens[i]) for i in range(b)]
    for i in range(b):
        out[i, : lens[i]] = x[rows[i]]
    return out.permute(0, 2, 1, 3)


def bhsd_to_thd(x: torch.Tensor, cu_seqlens: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """Inverse of :func:`thd_to_bhsd`: ``[b, h, s, d]`` -> ``[total, h*d]``, rows outside every
    sequence zero (TE zero-fills them)."""
    b, h, _, d = x.shape
    y = x.permute(0, 2, 1, 3)
    out = x.new_zeros(total, h, d)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    pieces = []
    for i in range(b):
        start = int(offsets[i])
        pieces.append((start, y[i, : lens[i]]))
    idx = torch.cat([torch.arange(s, s + p.shape[0]) for s, p in pieces]) if pieces else torch.zeros(0, dtype=int)
    out = out.index_put((idx,), torch.cat([p for _, p in pieces]))
    return out.reshape(total, h * d)
