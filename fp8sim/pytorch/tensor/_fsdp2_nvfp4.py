"""FSDP2 all-gather of ``NVFP4Tensor`` primary weights (TE: ``tensor/nvfp4_tensor.py``
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` and its ``__torch_dispatch__`` cases, d0067d0).

``fully_shard`` shards a parameter by rows (``split``, ``new_zeros`` of the padded shard, ``narrow``,
``copy_``; DTensor ``view``s the shard and ``as_strided``s the unsharded tensor).  With shard rows a
multiple of 16 (TE asserts ``shard_M % NVFP4_BLOCK_SCALING_SIZE == 0``) each piece stays an
``NVFP4Tensor``: packed rowwise codes ``(M_s, K/2)`` and E4M3 scales split by rows (re-padded to 128
rows), the columnwise codes ``(K, M/2)`` and scales split along dim 1 (scale columns re-padded to 4),
the amaxes copied (one per tensor: every shard keeps the whole weight's).

The gather carries TE's payload: the shard's packed FP4 bytes and its rowwise E4M3 scales with the row
padding removed; the amaxes travel as metadata (``pre_all_gather`` sets the shard's
``amax_reduction_group`` to the mesh's group, so the optimizer's in-place re-quantization of a shard
MAX-reduces its amax and every shard holds the same one).  After the gather the scale rows are padded
again and, where the quantizer has columnwise usage, the columnwise copy is made locally
(``_create_columnwise``: TE requires 2D quantization for it).  fp8sim refuses with NotImplementedError
where TE's hooks would assert or fall back: shard rows not a multiple of 16, uneven shards, a
columnwise usage without 2D quantization, row-scaled weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._fsdp2 import _param_group, pad_dim, shard_dispatch

__all__ = ["dispatch", "fsdp_pre_all_gather", "fsdp_post_all_gather"]

_B = 16  # NVFP4_BLOCK_SCALING_SIZE


def _refuse(why: str) -> None:
    raise NotImplementedError(
        f"NVFP4Tensor under FSDP2: {why}; TE would assert or all-gather this weight in high precision, "
        "fp8sim refuses rather than train in other numerics"
    )


def _problem(tensor: Any, shape: tuple[int, ...]) -> str | None:
    """Why a shard of ``shape`` cannot be gathered as NVFP4 (TE's asserts in ``fsdp_pre_all_gather``), or None."""
    m = math.prod(shape[:-1])
    if m % _B:
        return (
            f"FSDP2 requires shard_M ({m}) to be a multiple of NVFP4_BLOCK_SCALING_SIZE ({_B}). "
            "Adjust model dimensions or world size"
        )
    if tensor._amax_rowwise is not None and tensor._amax_rowwise.numel() != 1:
        return "row-scaled NVFP4 weights (one amax per row) are not gathered"
    if tensor._columnwise_data is not None and not tensor._with_2d_quantization:
        return "FSDP2 columnwise usage requires 2D quantization to be enabled"
    return None


def _check(tensor: Any, shape: tuple[int, ...]) -> None:
    why = _problem(tensor, shape)
    if why is not None:
        _refuse(why)


def _new(tensor: Any, shape: tuple[int, ...], dtype: torch.dtype | None = None, **buffers: Any) -> Any:
    return type(tensor)(
        shape=shape,
        dtype=tensor.dtype if dtype is None else dtype,
        device=tensor.device,
        fp4_dtype=tensor._fp4_dtype,
        quantizer=tensor._quantizer,
        with_2d_quantization=tensor._with_2d_quantization,
        nvfp4_use_4over6=tensor._nvfp4_use_4over6,
        nvfp4_e4m3_max=tensor._nvfp4_e4m3_max,
        **buffers,
    )


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _split(tensor: Any, size: int) -> list[Any] | None:
    rows = tensor.shape[0]
    if tensor.dim() != 2 or not isinstance(size, int) or size <= 0 or rows % size:
        return None
    if _problem(tensor, (size, *tensor.shape[1:])) is not None:
        return None  # TE's default (dequantized pieces); FSDP2's new_zeros of such a shard refuses
    n = rows // size
    rd, rs, cd, cs = (
        tensor._rowwise_data,
        tensor._rowwise_scale_inv,
        tensor._columnwise_data,
        tensor._columnwise_scale_inv,
    )
    pieces: dict[str, list[Any]] = {
        "rowwise_data": [None] * n if rd is None else list(rd.split(size, 0)),
        "rowwise_scale_inv": [None] * n if rs is None else [pad_dim(s, 0, 128) for s in rs[:rows].split(size, 0)],
        "columnwise_data": [None] * n if cd is None else [p.contiguous() for p in cd.split(size // 2, 1)],
        "columnwise_scale_inv": (
            [None] * n if cs is None else [pad_dim(s, 1, 4) for s in cs[:, : rows // _B].split(size // _B, 1)]
        ),
    }
    shape = (size, *tensor.shape[1:])
    return [
        _new(
            tensor,
            shape,
            **{k: v[i] for k, v in pieces.items()},
            amax_rowwise=_clone(tensor._amax_rowwise),
            amax_columnwise=_clone(tensor._amax_columnwise),
        )
        for i in range(n)
    ]


def _new_zeros(tensor: Any, shape: tuple[int, ...]) -> Any:
    """The padded shard FSDP2 copies into: zero codes, scales and amaxes in TE's layouts."""
    _check(tensor, shape)
    q = tensor._quantizer
    m, k = math.prod(shape[:-1]), shape[-1]
    buffers: dict[str, Any] = {}
    for usage, data_shape in (("rowwise", (*shape[:-1], k // 2)), ("columnwise", (k, m // 2))):
        present = getattr(tensor, f"_{usage}_data") is not None
        zeros = torch.zeros
        buffers[f"{usage}_data"] = zeros(data_shape, dtype=torch.uint8) if present else None
        scale_shape = q.get_scale_shape(shape, usage == "columnwise")
        buffers[f"{usage}_scale_inv"] = zeros(scale_shape, dtype=torch.uint8) if present else None
        buffers[f"amax_{usage}"] = zeros(1, dtype=torch.float32) if present else None
    out = _new(tensor, shape, **buffers)
    out._fp8sim_fsdp_padded = True
    return out


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """The FSDP2 ops on an ``NVFP4Tensor``, or ``NotImplemented`` for the class's other rules."""
    return shard_dispatch(func, args, kwargs, _new_zeros, _split, lambda _t, why: _refuse(why))


def fsdp_pre_all_gather(
    self: Any, mesh: Any, orig_size: torch.Size, contiguous_orig_stride: tuple, module: Any, mp_policy: Any
) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The shard's packed FP4 codes and rowwise E4M3 scales (row padding removed); the amaxes and the
    columnwise usage as metadata (TE: the amax is the same on every rank, not gathered)."""
    del contiguous_orig_stride, mp_policy
    if mesh is not None:  # one amax, hence one global scale, for all shards of this weight
        self.amax_reduction_group = mesh.get_group()
    _check(self, tuple(self.shape))
    world = mesh.size() if mesh is not None else 1
    if orig_size[0] != self.shape[0] * world:
        _refuse(f"uneven shards ({orig_size[0]} rows over {world} ranks)")
    if _param_group(module) is None:
        raise RuntimeError("FSDP state for this module has no parameter group; cannot determine reshard_after_forward.")
    if self._rowwise_data is None:
        raise RuntimeError(
            "FSDP2 requires rowwise data, but _rowwise_data is None. "
            "Ensure the NVFP4Quantizer was created with rowwise=True."
        )
    columnwise = self._quantizer.columnwise_usage
    if columnwise and not self._with_2d_quantization:
        _refuse("FSDP2 columnwise usage requires 2D quantization to be enabled")
    m = math.prod(self.shape[:-1])
    sent = (self._rowwise_data, self._rowwise_scale_inv[:m])
    return sent, (columnwise, self._amax_rowwise, self._amax_columnwise, self.shape[-1])


def fsdp_post_all_gather(
    self: Any, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, *, out: Any = None
) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The unsharded ``NVFP4Tensor`` (or ``out`` with the gathered buffers swapped in); the columnwise
    copy made locally from the gathered rowwise one."""
    columnwise, amax_rowwise, amax_columnwise, k = metadata
    data, scales = all_gather_outputs[:2]
    buffers = {
        "rowwise_data": data,
        "rowwise_scale_inv": pad_dim(scales, 0, 128),
        "amax_rowwise": amax_rowwise,
        "amax_columnwise": amax_columnwise,
    }
    if out is not None:
        for key, value in buffers.items():
            setattr(out, "_" + key, value)
    else:  # the first gather: the unsharded tensor gets its own copy of the shard's quantizer
        out = _new(self, (data.shape[0], k), param_dtype, columnwise_data=None, columnwise_scale_inv=None, **buffers)
    if columnwise:
        out._create_columnwise()
    out._quantizer.set_usage(rowwise=True, columnwise=columnwise)
    return out, all_gather_outputs
