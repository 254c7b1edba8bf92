"""Sub-byte storage: FP4 codes two per byte, FP6 codes four per three bytes.

fp8sim keeps element codes unpacked (one code per uint8, as ml_dtypes does); these helpers convert
to and from the packed layouts that kernels and checkpoints use.  Packing runs along the last axis
and works on numpy arrays and torch tensors alike (a torch input gives a torch uint8 tensor on the
same device).

- **FP4** (spec section 1): element ``2i`` goes in the **low** nibble of byte ``i`` and element
  ``2i+1`` in the high nibble, the layout of torch ``float4_e2m1fn_x2``, TE's
  ``cast_to_fp4x2`` and torchao's ``pack_uint4``.  A packed torch tensor can be reinterpreted with
  ``packed.view(torch.float4_e2m1fn_x2)``.
- **FP6**: a little-endian bit stream.  Codes ``c0..c3`` of each group of four form the 24-bit
  word ``c0 | c1 << 6 | c2 << 12 | c3 << 18`` (code ``i`` in bits ``6i..6i+5``), stored low byte
  first.  torchao 0.18 has no FP6 packing helper (its MX FP6 data stay one code per byte, and
  ``pack_uint6`` is not in the package), so there is no upstream layout to match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_array
from .._util.tensors import is_torch_tensor

__all__ = ["pack_fp4", "unpack_fp4", "pack_fp6", "unpack_fp6"]


def _codes_u8(codes: Any, bits: int, arg: str) -> Any:
    """``codes`` as uint8 (numpy array or torch tensor), checked to lie in ``[0, 2^bits)``."""
    limit = 1 << bits
    if is_torch_tensor(codes):
        import torch

        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"{arg} must be an integer tensor of {bits}-bit codes, got {codes.dtype}")
        if codes.ndim == 0:
            raise ValueError(f"{arg} must have at least one dimension to pack along")
        if codes.numel():
            lo, hi = int(codes.min()), int(codes.max())
            if lo < 0 or hi >= limit:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{arg}: code {bad} out of range; {bits}-bit codes must be in [0, {limit - 1}]")
        return codes.to(torch.uint8)
    if isinstance(codes, (bool, float, complex, str)) or codes is None:
        raise TypeError(f"{arg} must be an integer array or tensor, got {type(codes).__name__}")
    arr = as_array(codes, arg)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{arg} must have an integer dtype, got {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError(f"{arg} must have at least one dimension to pack along")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{arg}: code {bad} out of range; {bits}-bit codes must be in [0, {limit - 1}]")
    return arr.astype(np.uint8)


def _packed_u8(packed: Any, arg: str) -> Any:
    """``packed`` bytes as uint8 (a torch ``float4_e2m1fn_x2`` tensor is reinterpreted)."""
    if is_torch_tensor(packed):
        import torch

        if packed.dtype == getattr(torch, "float4_e2m1fn_x2", None):
            packed = packed.view(torch.uint8)
        if packed.dtype != torch.uint8:
            raise TypeError(f"{arg} must be a uint8 (or float4_e2m1fn_x2) tensor, got {packed.dtype}")
        if packed.ndim == 0:
            raise ValueError(f"{arg} must have at least one dimension to unpack along")
        return packed
    if isinstance(packed, (bool, float, complex, str)) or packed is None:
        raise TypeError(f"{arg} must be a uint8 array or tensor, got {type(packed).__name__}")
    arr = as_array(packed, arg)
    if arr.dtype != np.uint8:
        raise TypeError(f"{arg} must have dtype uint8, got {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError(f"{arg} must have at least one dimension to unpack along")
    return arr


def _check_last_dim(x: Any, multiple: int, arg: str, what: str) -> None:
    n = x.shape[-1]
    if n % multiple:
        raise ValueError(f"{arg}: last dim {n} must be {what} (shape {tuple(x.shape)})")


def _interleave(parts: list[Any]) -> Any:
    """Stack equally shaped arrays along a new last axis and merge it into the last dim."""
    first = parts[0]
    shape = (*first.shape[:-1], first.shape[-1] * len(parts))
    if is_torch_tensor(first):
        import torch

        return torch.stack(parts, dim=-1).reshape(shape)
    return np.stack(parts, axis=-1).reshape(shape)


def pack_fp4(codes: Any) -> Any:
    """Pack 4-bit codes two per byte along the last axis: element ``2i`` in the low nibble.

    ``codes``: integers in ``[0, 16)`` (numpy array or torch tensor); the last dim must be even.
    Returns uint8 of the same kind with the last dim halved.
    """
    c = _codes_u8(codes, 4, "codes")
    _check_last_dim(c, 2, "codes", "even to pack two FP4 codes per byte")
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: Any) -> Any:
    """Inverse of :func:`pack_fp4`: uint8 codes in ``[0, 16)`` with the last dim doubled."""
    p = _packed_u8(packed, "packed")
    return _interleave([p & 0x0F, p >> 4])


def pack_fp6(codes: Any) -> Any:
    """Pack 6-bit codes four per three bytes along the last axis (little-endian bit stream, see
    the module docstring).

    ``codes``: integers in ``[0, 64)``; the last dim must be a multiple of 4.  Returns uint8 of
    the same kind with the last dim scaled by 3/4.
    """
    c = _codes_u8(codes, 6, "codes")
    _check_last_dim(c, 4, "codes", "a multiple of 4 to pack four FP6 codes per three bytes")
    c0, c1, c2, c3 = c[..., 0::4], c[..., 1::4], c[..., 2::4], c[..., 3::4]
    b0 = c0 | ((c1 & 0x03) << 6)
    b1 = (c1 >> 2) | ((c2 & 0x0F) << 4)
    b2 = (c2 >> 4) | (c3 << 2)
    return _interleave([b0, b1, b2])


def unpack_fp6(packed: Any) -> Any:
    """Inverse of :func:`pack_fp6`: uint8 codes in ``[0, 64)``; the last dim of ``packed`` must be
    a multiple of 3 and is scaled by 4/3."""
    p = _packed_u8(packed, "packed")
    _check_last_dim(p, 3, "packed", "a multiple of 3 (three bytes per four FP6 codes)")
    b0, b1, b2 = p[..., 0::3], p[..., 1::3], p[..., 2::3]
    c0 = b0 & 0x3F
    c1 = (b0 >> 6) | ((b1 & 0x0F) << 2)
    c2 = (b1 >> 4) | ((b2 & 0x03) << 4)
    c3 = b2 >> 2
    return _interleave([c0, c1, c2, c3])
