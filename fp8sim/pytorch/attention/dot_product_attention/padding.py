"""DotProductAttention's padded and packed inputs: padding masks from ``cu_seqlens``, their checks, and packed
``thd`` Q, K, V unpacked to the internal ``[b, h, s, d]`` layout (TE ``dot_product_attention.py`` /
``utils.py``: the same checks and messages)."""

from __future__ import annotations

from typing import Any

import torch

from . import utils

__all__ = ["padding_mask_from_cu_seqlens", "check_padding_mask", "thd_inputs", "check_cu_seqlens"]


def padding_mask_from_cu_seqlens(
    attention_type: str, qb: torch.Tensor, kb: torch.Tensor, cu_q: torch.Tensor | None, cu_kv: torch.Tensor | None
) -> Any:
    """The padding mask (``[b, 1, 1, s]``, True = padded; a (query, key/value) pair for cross attention) of
    ``[b, h, s, d]`` inputs whose sequences ``cu_seqlens_q`` / ``cu_seqlens_kv`` give."""
    if cu_q is None:
        raise AssertionError("Please provide attention_mask for padding!")
    cu_kv = cu_q if cu_kv is None else cu_kv
    b = qb.shape[0]
    for name, cu, s in (("cu_seqlens_q", cu_q, qb.shape[2]), ("cu_seqlens_kv", cu_kv, kb.shape[2])):
        check_cu_seqlens(name, cu, b)
        if int((cu[1:] - cu[:-1]).max()) > s:
            raise ValueError(f"{name} has a sequence longer than the tensor's sequence dimension ({s})")

    def pad(cu: torch.Tensor, s: int) -> torch.Tensor:
        lens = (cu[1 : b + 1] - cu[:b]).view(b, 1)
        return (torch.arange(s).view(1, s) >= lens).view(b, 1, 1, s)

    mq = pad(cu_q, qb.shape[2])
    return mq if attention_type == "self" else (mq, pad(cu_kv, kb.shape[2]))


def check_padding_mask(attention_type: str, mask: Any, b: int, sq: int, skv: int) -> None:
    """A padding ``attention_mask`` is a bool ``[b, 1, 1, s]`` tensor (a pair of them for cross attention)."""
    if mask is None:
        raise AssertionError("Please provide attention_mask for padding!")
    masks = (mask, mask) if attention_type == "self" else mask
    if attention_type == "cross" and (not isinstance(mask, (tuple, list)) or len(mask) != 2):
        raise ValueError("attention_mask for cross attention with a padding mask is a tuple (mask_q, mask_kv)")
    for name, m, s in (("query", masks[0], sq), ("key/value", masks[1], skv)):
        if m.dtype != torch.bool or tuple(m.shape) != (b, 1, 1, s):
            raise ValueError(
                f"attention_mask ({name}) for a padding mask must be a bool tensor of shape "
                f"[batch_size, 1, 1, seqlen] = {[b, 1, 1, s]}; got {m.dtype} {list(m.shape)}"
            )


def thd_inputs(attention_type, q, k, v, mask_type, cu_q, cu_kv, cu_q_pad, cu_kv_pad, max_q, max_kv) -> tuple:  # noqa: ANN001
    """Packed ``thd`` Q, K, V (TE's checks and messages) as ``[b, h, s, d]`` with their padding mask, and what
    the output needs to be packed back."""
    if not all(x.dim() == 3 for x in (q, k, v)):
        raise AssertionError("Queries, keys and values must be 3D tensors when qkv_format = thd!")
    if "padding" not in mask_type:
        raise AssertionError("Attention mask type must be padding or padding_causal for qkv_format=thd!")
    if cu_q is None or cu_kv is None:
        raise AssertionError("cu_seqlens_q and cu_seqlens_kv can not be None when qkv_format = thd!")
    if not (cu_q.shape == cu_kv.shape and cu_q.dim() == 1):
        raise AssertionError("cu_seqlens_q and cu_seqlens_q must both have shape [batch_size + 1]!")
    if cu_q.dtype != torch.int32 or cu_kv.dtype != torch.int32:
        raise AssertionError("cu_seqlens_q and cu_seqlens_q must both be in dtype torch.int32!")
    b = cu_q.shape[0] - 1
    off_q = (cu_q if cu_q_pad is None else cu_q_pad)[:-1]
    off_kv = (cu_kv if cu_kv_pad is None else cu_kv_pad)[:-1]
    for name, cu, pad, t in (
        ("cu_seqlens_q", cu_q, cu_q_pad, q.shape[0]),
        ("cu_seqlens_kv", cu_kv, cu_kv_pad, k.shape[0]),
    ):
        check_cu_seqlens(name, cu, b)
        end = cu if pad is None else pad
        if pad is not None:
            check_cu_seqlens(name + "_padded", pad, b)
            if bool(((pad[1:] - pad[:-1]) < (cu[1:] - cu[:-1])).any()):
                raise ValueError(f"{name}_padded leaves less room than {name} for some sequence")
        if int(end[-1]) > t:
            raise ValueError(f"{name} ends at {int(end[-1])}, beyond the tensor's {t} tokens")
    lens_q, lens_kv = cu_q[1:] - cu_q[:-1], cu_kv[1:] - cu_kv[:-1]
    sq = int(lens_q.max()) if max_q is None else max_q
    skv = int(lens_kv.max()) if max_kv is None else max_kv
    if int(lens_q.max()) > sq or int(lens_kv.max()) > skv:
        raise ValueError("max_seqlen_q / max_seqlen_kv is smaller than the longest sequence in cu_seqlens")
    qb = utils.thd_to_bhsd(q, cu_q, off_q, sq)
    kb = utils.thd_to_bhsd(k, cu_kv, off_kv, skv)
    vb = utils.thd_to_bhsd(v, cu_kv, off_kv, skv)
    mq = (torch.arange(sq).view(1, sq) >= lens_q.view(b, 1)).view(b, 1, 1, sq)
    mkv = (torch.arange(skv).view(1, skv) >= lens_kv.view(b, 1)).view(b, 1, 1, skv)
    mask = mq if attention_type == "self" and sq == skv and torch.equal(mq, mkv) else (mq, mkv)
    if attention_type == "self" and not isinstance(mask, torch.Tensor):
        raise ValueError("self attention with qkv_format='thd' needs cu_seqlens_q == cu_seqlens_kv")
    return qb, kb, vb, {"mask": mask, "cu_q": cu_q, "off_q": off_q}


def check_cu_seqlens(name: str, cu: torch.Tensor, b: int) -> None:
    """``cu_seqlens``: shape ``[b + 1]`` (or longer), from 0, non-decreasing."""
    if cu.dim() != 1 or cu.shape[0] < b + 1:
        raise ValueError(f"{name} must have shape [batch_size + 1] = [{b + 1}]; got {list(cu.shape)}")
    if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name} must start at 0 and be non-decreasing; got {cu.tolist()}")
