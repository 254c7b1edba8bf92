"""FSDP2 all-gather of block-scaled FP8 primary weights: ``MXFP8Tensor`` and ``Float8BlockwiseQTensor``
(TE: ``tensor/mxfp8_tensor.py`` and ``tensor/float8_blockwise_tensor.py``, ``fsdp_pre_all_gather`` /
``fsdp_post_all_gather`` and the ``__torch_dispatch__`` cases FSDP2 reaches).

``fully_shard`` shards a parameter by rows: ``split`` (torch.chunk), ``new_zeros`` of the padded shard
size, ``narrow`` (a no-op slice) and ``copy_``; DTensor views the shard (``view`` to its own shape) and
the unsharded parameter is ``as_strided`` to its own size.  Each stays a quantized tensor over the
shard's codes and scales where the shard is aligned to the scale blocks:

- MXFP8: shard rows a multiple of 32 (one columnwise scale row per 32 rows).  The shard gathers uint8
  codes and E8M0 scales with the row padding removed (rowwise scales ``[:M]``, columnwise ``[:M/32]``),
  rowwise in the forward and columnwise in the backward when resharded after forward, else rowwise
  plus the quantizer's columnwise usage; after the gather the scale rows are padded again to TE's
  multiples of 128 (rowwise) and 4 (columnwise).  A forward gather of rowwise codes only marks the
  gathered codes (``_fp8sim_fsdp_columnwise_in_backward``): the modules then take the dgrad operand
  in the backward (``module/_gemm_state.py``, TE ``linear.py`` backward ``update_usage(columnwise_usage=
  True)``), after FSDP2's backward gather has swapped the columnwise copy into the same tensor.  Both
  phases send two uint8 tensors of the same sizes (``M*ceil4(K/32) == (M/32)*ceil128(K)``), which FSDP2's
  once-allocated all-gather outputs require.  As in TE, a forward recomputed in the backward (activation
  checkpointing) then finds the columnwise copy only and raises TE's "missing row-scaled FP8 data";
  ``reshard_after_forward=False`` keeps the forward's gather of both copies for it.
- Float8BlockwiseQTensor: 128x128 blocks only, shard rows a multiple of 128; only the rowwise codes
  and float32 scales are gathered, the columnwise copy is the local transpose (TE
  ``_create_columnwise``).  1x128 blocks raise TE's NotImplementedError.

Where TE falls back to the high-precision values (a shard not aligned to the blocks, an uneven shard)
fp8sim raises NotImplementedError naming the class and FSDP2 instead: training would otherwise run in
other numerics without a word.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._fsdp2 import gather_usages, pad_dim, shard_dispatch

__all__ = ["dispatch", "fsdp_pre_all_gather", "fsdp_post_all_gather"]

_MX_ROWS = 32  # MXFP8_BLOCK_SCALING_SIZE
_BLOCK_ROWS = 128  # Float8BlockQuantizer.block_len
_ONE_D = (
    "FSDP2 is only supported for Float8BlockwiseQTensors with 2D block scaling "
    "(block_scaling_dim=2). 1D block scaling is not supported because the scale "
    "layout has M in dim1, which is incompatible with FSDP2 dim0 all-gather."
)  # TE float8_blockwise_tensor.py fsdp_pre_all_gather


def _is_mx(tensor: Any) -> bool:
    return type(tensor).__name__ == "MXFP8Tensor"


def _refuse(tensor: Any, why: str) -> None:
    raise NotImplementedError(
        f"{type(tensor).__name__} under FSDP2: {why}; TE would all-gather this weight in high precision, "
        "fp8sim refuses rather than train in other numerics"
    )


def _check(tensor: Any, shape: tuple[int, ...]) -> None:
    """Refuse a shard shape the FP8 all-gather cannot carry (see the module docstring)."""
    m, k = math.prod(shape[:-1]), shape[-1]
    if _is_mx(tensor):
        if tensor._with_gemm_swizzled_scales:
            raise NotImplementedError("FSDP2 is only supported for MXFP8Tensors with compact scales")
        if m % _MX_ROWS or k % _MX_ROWS:
            _refuse(tensor, f"a shard of shape {tuple(shape)} is not a multiple of {_MX_ROWS} in both dims")
        return
    if not tensor._is_2D_scaled:
        raise NotImplementedError(_ONE_D)
    if m % _BLOCK_ROWS:
        _refuse(tensor, f"a shard of {m} rows does not align to the 128x128 scale blocks")


def _new(tensor: Any, shape: tuple[int, ...], dtype: torch.dtype | None = None, **buffers: Any) -> Any:
    extra = {"with_gemm_swizzled_scales": False} if _is_mx(tensor) else {"is_2D_scaled": tensor._is_2D_scaled}
    return type(tensor)(
        shape=shape,
        dtype=tensor.dtype if dtype is None else dtype,
        device=tensor.device,
        fp8_dtype=tensor._fp8_dtype,
        quantizer=tensor._quantizer,
        **buffers,
        **extra,
    )


def _new_zeros(tensor: Any, shape: tuple[int, ...]) -> Any:
    """The padded shard FSDP2 copies into: zero codes and zero scales in TE's padded layouts, the
    tensor's usages; marked so that a partial ``narrow`` of it (an uneven shard) is refused."""
    _check(tensor, shape)
    q = tensor._quantizer
    buffers: dict[str, Any] = {}
    for usage in ("rowwise", "columnwise"):
        columnwise = usage == "columnwise"
        present = getattr(tensor, f"_{usage}_data") is not None
        data_shape = shape if (_is_mx(tensor) or not columnwise) else q.get_columnwise_shape(shape)
        scale_dtype = getattr(tensor, f"_{usage}_scale_inv").dtype if present else None
        buffers[f"{usage}_data"] = torch.zeros(data_shape, dtype=torch.uint8) if present else None
        buffers[f"{usage}_scale_inv"] = (
            torch.zeros(q.get_scale_shape(shape, columnwise), dtype=scale_dtype) if present else None
        )
    out = _new(tensor, shape, **buffers)
    out._fp8sim_fsdp_padded = True
    return out


def _split(tensor: Any, size: int) -> list[Any] | None:
    """TE's MXFP8 row split (and the same for 128x128 blocks): each piece over the split codes and
    scales, scale rows re-padded; None where the split is not aligned (the caller's fallback)."""
    rows = tensor.shape[0]
    mx = _is_mx(tensor)
    block = _MX_ROWS if mx else _BLOCK_ROWS
    if not isinstance(size, int) or size <= 0 or rows % size or size % block:
        return None
    if mx and tensor._with_gemm_swizzled_scales or not mx and not tensor._is_2D_scaled:
        return None
    n = rows // size
    row, col = tensor._rowwise_data, tensor._columnwise_data
    rs, cs = tensor._rowwise_scale_inv, tensor._columnwise_scale_inv
    pieces: dict[str, list[Any]] = {}
    pieces["rowwise_data"] = [None] * n if row is None else list(row.split(size, 0))
    if mx:
        pieces["columnwise_data"] = [None] * n if col is None else list(col.split(size, 0))
        pieces["rowwise_scale_inv"] = [None] * n if rs is None else [pad_dim(s, 0, 128) for s in rs.split(size, 0)]
        cs_rows = size // _MX_ROWS
        pieces["columnwise_scale_inv"] = [None] * n if cs is None else [pad_dim(s, 0, 4) for s in cs.split(cs_rows, 0)]
    else:  # columnwise codes are (K, M): split along dim 1; their scale grid is (K/128, M/128 padded to 4)
        b = size // _BLOCK_ROWS
        pieces["columnwise_data"] = [None] * n if col is None else [p.contiguous() for p in col.split(size, -1)]
        pieces["rowwise_scale_inv"] = [None] * n if rs is None else list(rs[: rows // _BLOCK_ROWS].split(b, 0))
        pieces["columnwise_scale_inv"] = (
            [None] * n if cs is None else [pad_dim(s, 1, 4) for s in cs[:, : rows // _BLOCK_ROWS].split(b, 1)]
        )
    shape = (size, *tensor.shape[1:])
    return [_new(tensor, shape, **{k: v[i] for k, v in pieces.items()}) for i in range(n)]


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """The FSDP2 ops on a block-scaled tensor, or ``NotImplemented`` for the class's other rules."""
    return shard_dispatch(func, args, kwargs, _new_zeros, _split, _refuse)


def fsdp_pre_all_gather(
    self: Any, mesh: Any, orig_size: torch.Size, contiguous_orig_stride: tuple, module: Any, mp_policy: Any
) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The shard's codes and scales to all-gather (see the module docstring), and the usages."""
    del contiguous_orig_stride, mp_policy
    _check(self, tuple(self.shape))
    world = mesh.size() if mesh is not None else 1
    if orig_size[0] != self.shape[0] * world:
        _refuse(self, f"uneven shards ({orig_size[0]} rows over {world} ranks)")
    rowwise, columnwise, resharded = gather_usages(module, self._quantizer.columnwise_usage)
    m = math.prod(self.shape[:-1])
    if not _is_mx(self):  # TE: the rowwise copy only; the columnwise one is its transpose
        if self._rowwise_data is None or self._rowwise_scale_inv is None:
            raise RuntimeError("Rowwise data must be available for FSDP2 all-gather with 2D block scaling.")
        scales = self._rowwise_scale_inv[: m // _BLOCK_ROWS]
        return (self._rowwise_data, scales), (self._fp8_dtype, True, rowwise, columnwise)
    sent: tuple[torch.Tensor, ...] = ()
    if rowwise:
        sent += (self._rowwise_data, self._rowwise_scale_inv[:m])
    if columnwise:
        if self._columnwise_data is None:
            raise RuntimeError("Requested column-wise usage, but MXFP8Tensor is missing column-scaled FP8 data")
        sent += (self._columnwise_data, self._columnwise_scale_inv[: m // _MX_ROWS])
    # resharded after forward: the backward gathers the columnwise copy (see the module docstring)
    return sent, (self._fp8_dtype, False, rowwise, columnwise, resharded)


def fsdp_post_all_gather(
    self: Any, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any, param_dtype: torch.dtype, *, out: Any = None
) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The unsharded tensor over the gathered codes and scales (or ``out`` with them swapped in)."""
    _, blockwise, rowwise, columnwise = metadata[:4]
    if blockwise:
        buffers = {"rowwise_data": all_gather_outputs[0], "rowwise_scale_inv": all_gather_outputs[1]}
        buffers.update(columnwise_data=None, columnwise_scale_inv=None)
    else:
        rd, rs = all_gather_outputs[:2] if rowwise else (None, None)
        cd, cs = all_gather_outputs[-2:] if columnwise else (None, None)
        buffers = {
            "rowwise_data": rd,
            "rowwise_scale_inv": None if rs is None else pad_dim(rs, 0, 128),
            "columnwise_data": cd,
            "columnwise_scale_inv": None if cs is None else pad_dim(cs, 0, 4),
        }
    data = buffers["rowwise_data"] if buffers["rowwise_data"] is not None else buffers["columnwise_data"]
    if out is not None:
        for key, value in buffers.items():
            setattr(out, "_" + key, value)
    else:  # the first gather: the unsharded tensor gets its own copy of the shard's quantizer
        out = _new(self, tuple(data.shape), param_dtype, **buffers)
    if blockwise:
        if columnwise:
            out._create_columnwise()
        out.update_usage(rowwise_usage=rowwise, columnwise_usage=columnwise)
    out._quantizer.set_usage(rowwise=rowwise, columnwise=columnwise)
    if not blockwise and out._rowwise_data is not None:  # does the backward gather the columnwise copy?
        # marked on the codes buffer: the parameter FSDP2 makes of the first gather's tensor (``as_strided``,
        # ``detach``) is another Python object over the same buffers; set on every gather, as the buffer is
        # reused by the next one, which may send other usages
        out._rowwise_data._fp8sim_fsdp_columnwise_in_backward = bool(metadata[4] and rowwise and not columnwise)
    return out, all_gather_outputs
