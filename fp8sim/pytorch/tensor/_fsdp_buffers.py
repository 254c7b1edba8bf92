"""TE 2.20's FSDP2 buffer protocol of the block-scaled storages (``fsdp_buffer_fields``,
``fsdp_extract_buffers``, ``fsdp_assign_gathered``: NVIDIA/TransformerEngine at d0067d0,
``tensor/storage/float8_blockwise_tensor_storage.py:530-667`` and ``mxfp8_tensor_storage.py:328-400``).

Each direction gathers its data and its scale-inv buffer along dim 0; the alignment padding of the
scales is stripped before the gather and put back after it.  Float8 block scaling: 2D (128x128) only,
the columnwise copy travels M-major (its uint8 codes transposed) and its scales transposed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["blockwise_fields", "blockwise_extract", "blockwise_assign", "mxfp8_fields", "mxfp8_extract", "mxfp8_assign"]

_BLOCK = 128  # TE ``_FSDP_BLOCK_LEN``
_MX = 32


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _mn(t: Any) -> tuple[int, int]:
    shape = tuple(t.size())
    return math.prod(shape[:-1]), (shape[-1] if shape else 1)


def blockwise_fields(t: Any) -> tuple[str, ...]:
    if not t._is_2D_scaled:
        raise NotImplementedError(
            "FSDP2 for Float8BlockwiseQTensor requires 2D block scaling (block_scaling_dim=2). 1D block scaling "
            "is not supported because its scale layout has M in dim1, which is incompatible with FSDP2 dim-0 "
            "all-gather."
        )
    fields: list[str] = []
    if t._rowwise_data is not None:
        fields += ["_rowwise_data", "_rowwise_scale_inv"]
    if t._columnwise_data is not None:
        fields += ["_columnwise_data", "_columnwise_scale_inv"]
    return tuple(fields)


def blockwise_extract(t: Any) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, Any]]:
    names = blockwise_fields(t)
    m, n = _mn(t)
    if m % _BLOCK:
        raise RuntimeError(
            f"FSDP2 cannot all-gather a 2-D Float8BlockwiseQTensor whose local flattened M dimension ({m}) is not "
            f"a multiple of {_BLOCK}; the shard boundary splits a block-scale tile. Choose aligned shard "
            "boundaries or use a supported non-blockwise recipe."
        )
    m_tiles, n_tiles = -(-m // _BLOCK), -(-n // _BLOCK)
    if t._rowwise_data is not None:
        return (t._rowwise_data, t._rowwise_scale_inv[:, :n_tiles].contiguous()), {
            "direction": "rowwise",
            "field_names": names,
        }
    data = t._columnwise_data.reshape(n, m).t().contiguous()  # N-major codes to M-major
    scale = t._columnwise_scale_inv.t().contiguous()[:m_tiles].contiguous()
    return (data, scale), {"direction": "columnwise", "field_names": names}


def blockwise_assign(t: Any, gathered: tuple, meta: dict[str, Any]) -> None:
    direction = meta["direction"]
    data, scale = gathered
    if direction not in ("rowwise", "columnwise"):
        raise RuntimeError(f"Invalid Float8Block FSDP gather direction: {direction!r}")
    if data is None or scale is None:
        raise RuntimeError("Float8Block FSDP gathered data and scale buffers must both be present.")
    m_full = math.prod(data.shape[:-1])
    last = data.size(-1) if data.dim() > 0 else 1
    expected = (-(-m_full // _BLOCK), -(-last // _BLOCK))
    if tuple(scale.shape) != expected:
        raise RuntimeError(
            "Float8Block FSDP gathered scale geometry does not match gathered data: "
            f"got scale shape {tuple(scale.shape)}, expected {expected} "
            f"for gathered data shape {tuple(data.shape)}."
        )
    if direction == "rowwise":
        pad = _round_up(expected[1], 4) - expected[1]
        t._rowwise_data = data
        t._rowwise_scale_inv = torch.nn.functional.pad(scale, (0, pad)) if pad else scale
        return
    t._columnwise_data = data.reshape(m_full, last).t().contiguous()  # back to N-major
    pad = _round_up(expected[0], 4) - expected[0]
    scale_t = scale.t().contiguous()
    t._columnwise_scale_inv = (torch.nn.functional.pad(scale_t, (0, pad)) if pad else scale_t).contiguous()


def mxfp8_fields(t: Any) -> tuple[str, ...]:
    fields: list[str] = []
    if t._rowwise_data is not None:
        fields += ["_rowwise_data", "_rowwise_scale_inv"]
    if t._columnwise_data is not None:
        fields += ["_columnwise_data", "_columnwise_scale_inv"]
    return tuple(fields)


def mxfp8_extract(t: Any) -> tuple[tuple, dict[str, Any]]:
    if t._with_gemm_swizzled_scales:
        raise NotImplementedError("FSDP2 is only supported for MXFP8Tensors with compact scales")
    names = mxfp8_fields(t)
    m = _mn(t)[0]
    out = []
    for name in names:
        buf = getattr(t, name)
        if name == "_rowwise_scale_inv" and buf is not None and buf.size(0) != m:
            buf = buf[:m]
        elif name == "_columnwise_scale_inv" and buf is not None and buf.size(0) != -(-m // _MX):
            buf = buf[: -(-m // _MX)]
        out.append(buf)
    return tuple(out), {"field_names": names}


def mxfp8_assign(t: Any, gathered: tuple, meta: dict[str, Any]) -> None:
    names = meta["field_names"]
    if len(names) != len(gathered):
        raise RuntimeError(
            f"MXFP8TensorStorage.fsdp_assign_gathered got {len(gathered)} buffers for {len(names)} fields"
        )
    for name, buf in zip(names, gathered, strict=True):
        align = {"_rowwise_scale_inv": 128, "_columnwise_scale_inv": 4}.get(name)
        if buf is not None and align is not None and buf.size(0) % align:
            buf = torch.nn.functional.pad(buf, (0, 0, 0, align - buf.size(0) % align))
        setattr(t, name, buf)
