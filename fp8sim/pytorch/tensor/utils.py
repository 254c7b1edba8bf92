"""TE's helpers for quantized primary weights (TE: ``pytorch/tensor/utils.py``).

- ``clear_columnwise_cache``: drop the columnwise copy (FSDP2 frees it after use); ``is_custom``;
- ``replace_raw_data``: move a quantized tensor's raw buffer into a caller-given buffer (ZeRO packing);
- ``quantize_master_weights`` (and its deprecated name ``cast_master_weights_to_fp8``): write master
  weights (or a flat ``start_offset`` fragment of each, a data-parallel shard) into FP8 primary
  weights.  Emulated for per-tensor FP8 (delayed and current scaling) and 128x128 block scaling; the
  amax all-reduce over ``group`` runs when ``torch.distributed`` is initialized with more than one rank.
  MXFP8 (bf16 weights, both copies) and NVFP4 2D (16x16 tiles, the rowwise copy) too; 1x128 blocks as TE
  treats them (its 128x128-tile kernels, an ``UpstreamQuirkWarning``); ``fsdp_shard_model_weights`` raises
  ``NotImplementedError``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from ..._util.upstream_quirk import UpstreamQuirkWarning
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


def _magnitude(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` as TE's partial-amax kernels reduce it (``fmaxf(amax, fabs(x))``): NaN skipped (0), inf kept."""
    return x.abs().nan_to_num(nan=0.0, posinf=float("inf"))


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


def _blockwise(params: list, group: Any, manual: bool) -> None:
    """TE ``_cast_master_weights_to_fp8_blockwise_scaling`` (128x128 tiles): per tile, the amax of the
    shard's elements (``fp8_block_scaling_compute_partial_amax``: flat index ``i`` is row ``i // w``, column
    ``i % w``; NaN skipped; 0 where the shard has none), all-reduced, ``scale`` from it (FLT_MAX for an
    infinite one), ``scale_inv`` written over the whole rowwise scale buffer, the columnwise copy dropped
    (remade from the rowwise one when needed), then each shard element cast with its tile's scale
    (``fp8_block_scaling_partial_cast``; TE may also scribble on unsharded elements of the tiles it
    touches, which the all-gather overwrites; fp8sim writes only the shard)."""
    first = params[0][0]._get_quantizer()
    for model_weight, _, _ in params:
        q = model_weight._get_quantizer()
        for name, want, got in (
            ("block_len", first.block_len, q.block_len),
            ("fp8 dtype", first.dtype, q.dtype),
            ("force_pow_2_scales", first.force_pow_2_scales, q.force_pow_2_scales),
            ("amax_epsilon", first.amax_epsilon, q.amax_epsilon),
        ):
            if want != got:
                raise ValueError(f"All model weights must have the same {name}, expected {want} but got {got}")
        if model_weight.dim() != 2:
            raise ValueError(
                f"model_weight must be 2D for blockwise scaling, got {model_weight.dim()}D shape {model_weight.shape}"
            )
    b = first.block_len
    amaxes = [
        torch.zeros(w._get_quantizer().get_scale_shape(w.shape, False), dtype=torch.float32) for w, _, _ in params
    ]
    for (model_weight, master, start_offset), amax in zip(params, amaxes, strict=True):
        if master is None:
            continue
        rows, cols = _tile_index(model_weight, master, start_offset, b)
        flat = rows * amax.shape[1] + cols  # the kernel's amax[tile_h * stride_h + tile_w]
        if flat.numel() and int(flat.max()) >= amax.numel():  # 1x128 layouts narrower than the tile grid
            raise ValueError(
                f"quantize_master_weights: the 128x128 tiles of a {tuple(model_weight.shape)} weight do not fit "
                f"its {tuple(amax.shape)} scale buffer (TE's kernel would write past it)"
            )
        mag = _magnitude(master.detach().float().reshape(-1))
        amax.view(-1).scatter_reduce_(0, flat, mag, reduce="amax")
    packed = torch.cat([a.reshape(-1) for a in amaxes])
    _all_reduce_max(packed, group)
    offset = 0
    for (model_weight, master, start_offset), amax in zip(params, amaxes, strict=True):
        amax.copy_(packed[offset : offset + amax.numel()].view(amax.shape))
        offset += amax.numel()
        scale = torch.from_numpy(
            np.asarray(
                compute_scale_from_amax(
                    amax.numpy(), _FP8_MAX[first.dtype], pow2=first.force_pow_2_scales, eps=first.amax_epsilon
                )
            )
        )
        model_weight._rowwise_scale_inv.copy_(torch.reciprocal(scale))
        if not manual:
            model_weight.update_usage(rowwise_usage=True, columnwise_usage=False)
        if master is None:
            continue
        rows, cols = _tile_index(model_weight, master, start_offset, b)
        scaled = master.detach().float().reshape(-1) * scale.reshape(-1)[rows * scale.shape[1] + cols]
        fp8 = torch.float8_e4m3fn if first.dtype == DType.kFloat8E4M3 else torch.float8_e5m2
        fmax = _FP8_MAX[first.dtype]
        codes = scaled.clamp(-fmax, fmax).to(fp8).view(torch.uint8)  # the cast is satfinite; NaN stays NaN
        model_weight._rowwise_data.view(-1)[start_offset : start_offset + master.numel()] = codes


def _exp2f_rcp(codes: torch.Tensor) -> torch.Tensor:
    """TE ``util/ptx.cuh`` ``exp2f_rcp``: ``2^(127 - e)`` from bits (255 -> NaN, 254 -> 2^-127)."""
    e = codes.to(torch.int32)
    bits = (254 - e) << 23
    bits = torch.where(e == 254, torch.tensor(0x00400000, dtype=torch.int32), bits)
    bits = torch.where(e == 255, torch.tensor(0x7FFFFFFF, dtype=torch.int32), bits)
    return bits.view(torch.float32)


def _mxfp8(params: list, group: Any) -> None:
    """TE ``_cast_master_weights_to_fp8_mxfp8_scaling`` (``common/recipe/mxfp8_scaling.cu``): per 1x32 block
    (rowwise) and 32x1 block (columnwise) the amax of the shard's elements, kept in the model dtype (bf16
    only: ``multi_tensor_compute_scale_inv_e8m0``'s "amax should be bf16"), all-reduced, E8M0 scales
    ``float_to_e8m0(amax * fl32(1/448))`` (E4M3's limit whatever the element format) written over both
    whole scale buffers, then each shard element cast into both copies with ``x * exp2f_rcp(scale)``."""
    from ...scaling.mx import e8m0_scale_codes

    for model_weight, _, _ in params:
        if model_weight.dim() != 2:
            raise ValueError(
                f"model_weight must be 2D for MXFP8 scaling, got {model_weight.dim()}D shape {model_weight.shape}"
            )
        if model_weight._rowwise_scale_inv is None or model_weight._columnwise_scale_inv is None:
            raise ValueError("quantize_master_weights for MXFP8 needs both the rowwise and the columnwise copy")
        if model_weight.dtype != torch.bfloat16:
            raise RuntimeError("amax should be bf16")
    rows_amax = [torch.zeros(w._rowwise_scale_inv.shape, dtype=torch.bfloat16) for w, _, _ in params]
    cols_amax = [torch.zeros(w._columnwise_scale_inv.shape, dtype=torch.bfloat16) for w, _, _ in params]
    for (model_weight, master, start_offset), ra, ca in zip(params, rows_amax, cols_amax, strict=True):
        if master is None:
            continue
        r, c = _tile_index(model_weight, master, start_offset, 1)
        mag = _magnitude(master.detach().reshape(-1))
        ra.view(-1).scatter_reduce_(0, r * ra.shape[1] + c // 32, mag, reduce="amax")
        ca.view(-1).scatter_reduce_(0, (r // 32) * ca.shape[1] + c, mag, reduce="amax")
    packed = torch.cat([a.reshape(-1) for a in rows_amax + cols_amax])
    _all_reduce_max(packed, group)
    offset = 0
    for a in rows_amax + cols_amax:
        a.copy_(packed[offset : offset + a.numel()].view(a.shape))
        offset += a.numel()
    for (model_weight, master, start_offset), ra, ca in zip(params, rows_amax, cols_amax, strict=True):
        rs = torch.from_numpy(e8m0_scale_codes(ra.float().numpy(), "e4m3", "rceil", flavor="te"))
        cs = torch.from_numpy(e8m0_scale_codes(ca.float().numpy(), "e4m3", "rceil", flavor="te"))
        model_weight._rowwise_scale_inv.copy_(rs)
        model_weight._columnwise_scale_inv.copy_(cs)
        if master is None:
            continue
        r, c = _tile_index(model_weight, master, start_offset, 1)
        x = master.detach().reshape(-1).float()
        q = model_weight._get_quantizer()
        fp8 = torch.float8_e4m3fn if q.dtype == DType.kFloat8E4M3 else torch.float8_e5m2
        fmax = _FP8_MAX[q.dtype]
        end = start_offset + master.numel()
        for data, mult in (
            (model_weight._rowwise_data, _exp2f_rcp(rs)[r, c // 32]),
            (model_weight._columnwise_data, _exp2f_rcp(cs)[r // 32, c]),
        ):
            data.view(-1)[start_offset:end] = (x * mult).clamp(-fmax, fmax).to(fp8).view(torch.uint8)


def _nvfp4_2d(params: list, group: Any, manual: bool) -> None:
    """TE ``_cast_master_weights_to_nvfp4_2d`` (kernels in ``common/recipe/nvfp4.cu``): per 16x16 tile the
    amax of the shard's elements (NaN skipped) and per weight the shard's amax, both all-reduced (MAX);
    ``S_enc = fmin(2688 / amax, FLT_MAX)`` (1 for amax <= 0), tile scale ``fmin(tile_amax * fl32(S_enc *
    fl32(1/6)), FLT_MAX)`` written as E4M3 on every row of the tile (``nvfp4_fused_scale_kernel``: rows past
    the tiles get 0, at a row stride of the tile count, as TE writes them), ``_amax_rowwise`` = the amax;
    each shard element cast to E2M1 (RN, satfinite) times ``fl32(1 / fl32(e4m3(scale) / S_enc))`` into its
    nibble of ``_rowwise_data``; the columnwise copy is dropped (``update_usage``) unless ``manual``."""
    from ...cast import decode, encode
    from ...formats import E2M1, E4M3

    for model_weight, _, _ in params:
        if not model_weight._get_quantizer().with_2d_quantization:
            raise ValueError("NVFP4 2D quantization must be enabled.")
        if model_weight.dim() != 2:
            raise ValueError(f"Expected 2D model weight, got {model_weight.dim()}D")
    tiles = [torch.zeros(-(-w.shape[0] // 16), -(-w.shape[1] // 16)) for w, _, _ in params]
    amaxes = torch.zeros(len(params))
    for i, ((model_weight, master, start_offset), t) in enumerate(zip(params, tiles, strict=True)):
        if master is not None and master.numel():
            r, c = _tile_index(model_weight, master, start_offset, 16)
            mag = _magnitude(master.detach().reshape(-1).float())
            t.view(-1).scatter_reduce_(0, r * t.shape[1] + c, mag, reduce="amax")
            amaxes[i] = mag.max()
    packed = torch.cat([t.reshape(-1) for t in tiles])
    _all_reduce_max(packed, group)
    _all_reduce_max(amaxes, group)
    f32, flt_max = np.float32, np.float32(np.finfo(np.float32).max)
    offset = 0
    for i, (model_weight, master, start_offset) in enumerate(params):
        t = packed[offset : offset + tiles[i].numel()].view(tiles[i].shape).numpy()
        offset += tiles[i].numel()
        g = f32(amaxes[i].item())
        s_enc = f32(min(f32(f32(2688) / max(g, f32(np.finfo(np.float32).tiny))), flt_max)) if g > 0 else f32(1)
        with np.errstate(invalid="ignore"):  # an infinite amax: inf * 0 is NaN, and fminf(NaN, FLT_MAX) = FLT_MAX
            scale_val = np.fmin(t * f32(s_enc * (f32(1) / f32(6))), flt_max).astype(np.float32)
        e4m3 = encode(scale_val, E4M3, saturate=True)
        target = model_weight._rowwise_scale_inv
        rows_padded, tile_cols = target.shape[0], t.shape[1]
        full = np.zeros((rows_padded, tile_cols), np.uint8)
        n = min(rows_padded, 16 * t.shape[0])
        full[:n] = np.repeat(e4m3, 16, axis=0)[:n]
        target.view(-1)[: rows_padded * tile_cols] = torch.from_numpy(full.reshape(-1)).to(target.device)
        model_weight._amax_rowwise.copy_(torch.tensor([g]))
        if not manual:
            model_weight.update_usage(rowwise_usage=True, columnwise_usage=False)
        if master is None or not master.numel():
            continue
        s_enc = s_enc if s_enc > 0 else f32(1)
        s_dec = f32(1) / s_enc
        dec = decode(e4m3, E4M3)
        with np.errstate(divide="ignore", over="ignore"):
            enc = np.where(dec > 0, f32(1) / (dec * s_dec), flt_max)
        enc = np.fmin(enc, flt_max).astype(np.float32)
        r, c = _tile_index(model_weight, master, start_offset, 16)
        x = master.detach().reshape(-1).float().numpy()
        with np.errstate(over="ignore", invalid="ignore"):
            codes = torch.from_numpy(encode(x * enc[r.numpy(), c.numpy()], E2M1, saturate=True).astype(np.uint8))
        idx = torch.arange(start_offset, start_offset + master.numel())
        data = model_weight._rowwise_data.view(-1)
        lo, hi = idx % 2 == 0, idx % 2 == 1
        data[idx[lo] // 2] = (data[idx[lo] // 2] & 0xF0) | codes[lo]
        data[idx[hi] // 2] = (data[idx[hi] // 2] & 0x0F) | (codes[hi] << 4)


def _tile_index(model_weight: Any, master: torch.Tensor, start_offset: int | None, b: int) -> tuple:
    if start_offset is None or start_offset < 0 or start_offset + master.numel() > model_weight.numel():
        raise ValueError(
            f"start_offset {start_offset} with {master.numel()} master elements does not fit "
            f"model_weight numel ({model_weight.numel()})"
        )
    idx = torch.arange(start_offset, start_offset + master.numel())
    width = model_weight.shape[1]
    return (idx // width) // b, (idx % width) // b


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
    if fsdp_shard_model_weights is not None:
        raise NotImplementedError("quantize_master_weights with fsdp_shard_model_weights is not emulated by fp8sim")
    buckets: dict[str, list] = {"delayed": [], "current": [], "blockwise": [], "mxfp8": [], "nvfp4": []}
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
        elif isinstance(quantizer, Float8BlockQuantizer) and quantizer.block_scaling_dim == 2:  # 1x128: below
            buckets["blockwise"].append((model_weight, master, start_offset))
        elif isinstance(quantizer, MXFP8Quantizer):
            buckets["mxfp8"].append((model_weight, master, start_offset))
        elif isinstance(quantizer, NVFP4Quantizer):
            buckets["nvfp4"].append((model_weight, master, start_offset))
        elif isinstance(quantizer, Float8BlockQuantizer):  # 1x128: TE runs the same 128x128-tile kernels
            warnings.warn(
                "quantize_master_weights with 1x128 block scaling: TE computes 128x128-tile amaxes and scales "
                "and writes tile (i, j) at [i, j] of the 1x128 scale_inv layout (blocks along K, rows); "
                "fp8sim reproduces that",
                UpstreamQuirkWarning,
                stacklevel=2,
            )
            buckets["blockwise"].append((model_weight, master, start_offset))
        else:
            raise ValueError(f"quantize_master_weights for {type(quantizer)} is not supported yet")
    with torch.no_grad():
        if buckets["delayed"]:
            _delayed(buckets["delayed"], group)
        if buckets["current"]:
            _current(buckets["current"], group)
        if buckets["blockwise"]:
            _blockwise(buckets["blockwise"], group, manual_post_all_gather_processing)
        if buckets["mxfp8"]:
            _mxfp8(buckets["mxfp8"], group)
        if buckets["nvfp4"]:
            _nvfp4_2d(buckets["nvfp4"], group, manual_post_all_gather_processing)


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
