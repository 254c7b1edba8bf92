"""TE's helpers for quantized primary weights (TE: ``pytorch/tensor/utils.py``).

- ``clear_columnwise_cache``: drop the columnwise copy (FSDP2 frees it after use); ``is_custom``;
- ``replace_raw_data``: move a quantized tensor's raw buffer into a caller-given buffer (ZeRO packing);
- ``quantize_master_weights`` (and its deprecated name ``cast_master_weights_to_fp8``): write master
  weights (or a flat ``start_offset`` fragment of each, a data-parallel shard) into FP8 primary
  weights.  Emulated for per-tensor FP8 (delayed and current scaling); the amax all-reduce over
  ``group`` runs when ``torch.distributed`` is initialized with more than one rank.  The block-scaled
  paths (blockwise, MXFP8, NVFP4 2D) and ``fsdp_shard_model_weights`` raise ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...scaling.current import compute_scale_from_amax
from ..constants import DType
from .float8_blockwise_tensor import Float8BlockQuantizer, Float8BlockwiseQTensor
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .identity_tensor import IdentityTensor
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor

__all__ = [
    "replace_raw_data",
    "quantize_master_weights",
    "cast_master_weights_to_fp8",
    "clear_columnwise_cache",
    "is_custom",
]

_FP8_MAX = {DType.kFloat8E4M3: 448.0, DType.kFloat8E5M2: 57344.0}


def _swap(tensor: Any, attr: str, new_raw_data: torch.Tensor) -> None:
    old = getattr(tensor, attr)
    if old is None:
        raise RuntimeError(f"{type(tensor).__name__} has no data")
    if old.dtype != new_raw_data.dtype:
        raise ValueError(
            f"The data types of raw data don't match: old dtype={old.dtype}, new dtype={new_raw_data.dtype}"
        )
    new_raw_data.detach().copy_(old)
    setattr(tensor, attr, new_raw_data)


def replace_raw_data(tensor: Any, new_raw_data: torch.Tensor) -> None:
    """Copy ``tensor``'s raw data (``_data``, ``_rowwise_data`` or ``_hp_data``) into ``new_raw_data`` and
    make that the tensor's buffer; values and other attributes are unchanged (TE ``utils.py``)."""
    if isinstance(tensor, Float8Tensor):
        _swap(tensor, "_data", new_raw_data)
    elif isinstance(tensor, Float8BlockwiseQTensor | NVFP4Tensor):
        _swap(tensor, "_rowwise_data", new_raw_data)
    elif isinstance(tensor, IdentityTensor):
        _swap(tensor, "_hp_data", new_raw_data)
    elif isinstance(tensor, MXFP8Tensor):
        raise NotImplementedError("replace_raw_data for MXFP8Tensor is not supported yet")
    else:
        raise ValueError(f"replace_raw_data for {type(tensor)} is not supported yet")


def _all_reduce_max(t: torch.Tensor, group: Any) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)


def _fragment(model_weight: Float8Tensor, master: torch.Tensor, start_offset: int | None) -> torch.Tensor:
    """The uint8 codes of ``model_weight`` that ``master`` (flat) covers, as a view (TE's offsets checks)."""
    if start_offset is None:
        raise ValueError("start_offset must not be None when master_weight is provided")
    if start_offset < 0:
        raise ValueError(f"start_offset must be non-negative, got {start_offset}")
    end = start_offset + master.numel()
    if end > model_weight.numel():
        raise ValueError(
            f"end_offset ({end}) exceeds model_weight numel ({model_weight.numel()}), "
            f"start_offset={start_offset}, master_weight numel={master.numel()}"
        )
    if model_weight._data is None:
        raise NotImplementedError("quantize_master_weights for a columnwise-only Float8Tensor is not emulated")
    return model_weight._data.view(-1)[start_offset:end]


def _cast_into(codes: torch.Tensor, master: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fp8: DType) -> None:
    """Quantize ``master`` with ``scale`` into the ``codes`` view (TE: ``Float8Quantizer.update_quantized``
    on a Float8Tensor over those bytes), folding its amax into ``amax``."""
    q = Float8Quantizer(scale, amax, fp8, rowwise=True, columnwise=False)
    dst = q.create_tensor_from_data(codes.view(1, -1), master.dtype)
    q.update_quantized(master.reshape(1, -1), dst)


def _delayed(params: list, group: Any) -> None:
    """TE ``_cast_master_weights_to_fp8_delayed_scaling``: each fragment cast with the quantizer's current
    scale (its amax folded into the quantizer's amax), amaxes all-reduced, then ``_scale_inv = 1/scale``."""
    amaxes, scales, scale_invs = [], [], []
    for model_weight, master, start_offset in params:
        model_weight._reset_caches()
        quantizer = model_weight._get_quantizer()
        amaxes.append(quantizer.amax.view(1))
        scales.append(quantizer.scale.view(1))
        scale_invs.append(model_weight._scale_inv.view(1))
        if master is None:  # this shard of the master weight lives on another rank
            continue
        _cast_into(
            _fragment(model_weight, master, start_offset), master, quantizer.scale, quantizer.amax, quantizer.dtype
        )
    if amaxes:
        packed = torch.cat(amaxes)
        _all_reduce_max(packed, group)
        for a, v in zip(amaxes, packed, strict=True):
            a.copy_(v.view(1))
        with torch.no_grad():
            for s, si in zip(scales, scale_invs, strict=True):
                si.copy_(torch.reciprocal(s.to(torch.float32)))


def _current(params: list, group: Any) -> None:
    """TE ``_cast_master_weights_to_fp8_current_scaling``: amax of each master shard (0 where absent),
    all-reduced, scale from it (``force_pow_2_scales``, ``amax_epsilon`` of the first weight; all must
    agree), ``_scale_inv`` updated for every weight, then each fragment cast with that scale."""
    first = params[0][0]._get_quantizer()
    fp8, pow2, eps = first.dtype, first.force_pow_2_scales, first.amax_epsilon
    amaxes = torch.zeros(len(params), dtype=torch.float32)
    for i, (model_weight, master, _) in enumerate(params):
        q = model_weight._get_quantizer()
        for name, want, got in (
            ("fp8 dtype", fp8, q.dtype),
            ("force_pow_2_scales", pow2, q.force_pow_2_scales),
            ("amax_epsilon", eps, q.amax_epsilon),
        ):
            if want != got:
                raise ValueError(f"All model weights must have the same {name}, expected {want} but got {got}")
        if master is not None and master.numel():
            a = master.detach().float().abs()
            amaxes[i] = torch.where(torch.isnan(a), torch.zeros((), dtype=a.dtype), a).max()
    _all_reduce_max(amaxes, group)
    for (model_weight, master, start_offset), amax in zip(params, amaxes, strict=True):
        scale = np.float32(compute_scale_from_amax(np.float32(amax.item()), _FP8_MAX[fp8], pow2=pow2, eps=eps))
        scale_t = torch.tensor([scale], dtype=torch.float32)
        with torch.no_grad():
            model_weight._scale_inv.view(1).copy_(torch.reciprocal(scale_t))
        model_weight._reset_caches()
        if master is None:
            continue
        codes = _fragment(model_weight, master, start_offset)
        _cast_into(codes, master, scale_t, torch.zeros(1, dtype=torch.float32), model_weight._fp8_dtype)


def quantize_master_weights(
    model_weights: list,
    master_weights: list,
    start_offsets: list,
    group: Any,
    fsdp_shard_model_weights: list | None = None,
    manual_post_all_gather_processing: bool = False,
) -> None:
    """Write ``master_weights[i]`` (cast to ``model_weights[i].dtype`` first, as TE does for numerical
    consistency) into the flat elements ``start_offsets[i]:`` of the quantized ``model_weights[i]``;
    a None master weight is a shard held by another rank.  Clears ``_high_precision_init_val``."""
    del manual_post_all_gather_processing  # fp8sim rebuilds caches on use
    if fsdp_shard_model_weights is not None:
        raise NotImplementedError("quantize_master_weights with fsdp_shard_model_weights is not emulated by fp8sim")
    buckets: dict[str, list] = {"delayed": [], "current": []}
    for model_weight, master, start_offset in zip(model_weights, master_weights, start_offsets, strict=True):
        if hasattr(model_weight, "clear_high_precision_init_val"):
            model_weight.clear_high_precision_init_val()
        if master is not None:
            master = master.to(model_weight.dtype)
        quantizer = model_weight._get_quantizer()
        if isinstance(quantizer, Float8Quantizer):
            buckets["delayed"].append((model_weight, master, start_offset))
        elif isinstance(quantizer, Float8CurrentScalingQuantizer):
            buckets["current"].append((model_weight, master, start_offset))
        elif isinstance(quantizer, Float8BlockQuantizer | MXFP8Quantizer | NVFP4Quantizer):
            raise NotImplementedError(
                f"quantize_master_weights for {type(quantizer).__name__} (TE's partial-cast kernels) is not "
                "emulated by fp8sim; per-tensor FP8 (Float8Quantizer, Float8CurrentScalingQuantizer) is"
            )
        else:
            raise ValueError(f"quantize_master_weights for {type(quantizer)} is not supported yet")
    with torch.no_grad():
        if buckets["delayed"]:
            _delayed(buckets["delayed"], group)
        if buckets["current"]:
            _current(buckets["current"], group)


def cast_master_weights_to_fp8(
    model_weights: list,
    master_weights: list,
    start_offsets: list,
    group: Any,
    fsdp_shard_model_weights: list | None = None,
    manual_post_all_gather_processing: bool = False,
) -> None:
    """Deprecated TE name of :func:`quantize_master_weights`."""
    quantize_master_weights(
        model_weights, master_weights, start_offsets, group, fsdp_shard_model_weights, manual_post_all_gather_processing
    )


def clear_columnwise_cache(tensor: Any) -> None:
    """Drop ``tensor``'s columnwise data and scales (or its FP8 transpose) where it has them (TE ``utils.py``)."""
    for name in ("_columnwise_data", "_columnwise_scale_inv", "_transpose"):
        if hasattr(tensor, name):
            setattr(tensor, name, None)
    if hasattr(tensor, "_transpose_invalid"):
        tensor._transpose_invalid = True


def is_custom(x: Any = None) -> bool:
    """Whether a quantizer or storage is marked ``custom``; False for None and any ``torch.Tensor`` (TE's
    rule, so quantized tensors, being tensors, are never custom)."""
    from .quantized_tensor import QuantizedTensorStorage, Quantizer

    if x is None or isinstance(x, torch.Tensor):
        return False
    if not isinstance(x, Quantizer | QuantizedTensorStorage):
        raise AssertionError("Object must be a Quantizer or QuantizedTensorStorage instance")
    return bool(getattr(x, "custom", False))
