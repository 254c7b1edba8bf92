"""TE's public collectives (``transformer_engine/pytorch/distributed.py``) on any backend, gloo included.

Names, signatures, defaults, return values and messages are TE's: the collectives return ``(out, handle)``
with ``handle`` None unless ``async_op=True``; one rank (or no initialised ``torch.distributed``) skips the
communication.  float8 and packed-FP4 payloads travel as byte views (:mod:`fp8sim.collectives`: gloo refuses
float8).  A collective that fp8sim computes itself (a float8 reduce-scatter) is synchronous; its handle is
already complete.  ``gather_along_first_dim`` with a ``quantizer`` follows TE's dispatch: per-tensor FP8
(``_all_gather_fp8``: the local shard quantized rowwise, the codes gathered, this rank's ``scale_inv`` kept),
MXFP8 (``_all_gather_mxfp8``: the shard quantized and data and scales gathered; a shard that cannot be
quantized gathered in high precision and the whole quantized, with TE's warning), NVFP4 (``_all_gather_nvfp4``,
``module/_tp_nvfp4``), Float8Block (``_start_all_gather_fp8_blockwise``, see :func:`_all_gather_fp8_blockwise`);
any other quantizer: TE's high-precision fallback (a warning, then the whole quantized).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

__all__ = [
    "get_distributed_world_size",
    "get_distributed_rank",
    "set_tensor_model_parallel_attributes",
    "split_tensor_into_1d_equal_chunks",
    "gather_split_1d_tensor",
    "reduce_scatter_along_first_dim",
    "gather_along_first_dim",
    "allreduce",
    "symmetric_all_reduce",
]

# TE distributed.py _MODEL_PARALLEL_ATTRIBUTE_DEFAULTS
_TP_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride")
_SYMMETRIC_KINDS = ("multimem_all_reduce", "two_shot", "one_shot")
_UNSUPPORTED = "Attempting to all-gather an unsupported quantized tensor. Falling back to high-precision all-gather."
_MX_FALLBACK = "Cannot quantize input tensor. Performing all-gather in high precision."
_MX_MISMATCH = "Input and quantizer do not have matching usages. Dequantizing and requantizing to MXFP8."
_NVFP4_BLOCK = 16
_NVFP4_FALLBACK = "Cannot quantize input tensor. Performing all-gather in high precision."
_NVFP4_MISMATCH = "Input and quantizer do not have matching usages. Dequantizing and requantizing to NVFP4."


class _Done:
    """The handle of a collective fp8sim ran synchronously: ``wait()`` returns at once."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def get_distributed_world_size(group: Any = None) -> int:
    """TE: the size of ``group`` (None: the world); 1 without an initialised ``torch.distributed``."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group=group)


def get_distributed_rank(group: Any = None) -> int:
    """TE: this process's rank in ``group``; TE's RuntimeError without an initialised ``torch.distributed``."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "torch.distributed is not initialized. Call torch.distributed.init_process_group() "
            "before calling get_distributed_rank()."
        )
    return dist.get_rank(group=group)


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    """TE: set ``tensor_model_parallel``, ``partition_dim``, ``partition_stride`` (refused if any is set)."""
    for attribute in _TP_ATTRIBUTES:
        if hasattr(tensor, attribute):
            raise RuntimeError(
                f"Tensor already has attribute '{attribute}' set. Cannot set "
                "tensor model parallel attributes on a tensor that already has them."
            )
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


def split_tensor_into_1d_equal_chunks(tensor: torch.Tensor, tp_group: Any, new_buffer: bool = False) -> torch.Tensor:
    """TE: this rank's ``numel // world`` elements of the flattened ``tensor`` (a view, or a copy with
    ``new_buffer``); TE drops a remainder."""
    size = torch.numel(tensor) // get_distributed_world_size(tp_group)
    start = size * get_distributed_rank(tp_group)
    data = tensor.view(-1)[start : start + size]
    return data.clone() if new_buffer else data


def gather_split_1d_tensor(tensor: torch.Tensor, tp_group: Any) -> torch.Tensor:
    """TE: every rank's 1D chunk concatenated in rank order (the inverse of the split)."""
    from ..collectives import all_gather_into_tensor

    out = torch.empty(
        torch.numel(tensor) * get_distributed_world_size(tp_group), dtype=tensor.dtype, device=tensor.device
    )
    all_gather_into_tensor(out, tensor.reshape(-1), group=tp_group)
    return out


def reduce_scatter_along_first_dim(
    inp: torch.Tensor, tp_group: Any, async_op: bool = False, output: torch.Tensor | None = None
) -> tuple[torch.Tensor, Any]:
    """TE: the SUM over ``tp_group`` of ``inp``, this rank's ``1 / world`` of dim 0, in ``output`` if given."""
    from ..collectives import BYTE_DTYPES, reduce_scatter_tensor

    world = get_distributed_world_size(tp_group)
    if world == 1:
        return inp, None
    dim_size = list(inp.size())
    if dim_size[0] % world != 0:
        raise ValueError(
            "First dimension of the tensor should be divisible by tensor parallel size, "
            f"but got dim_size[0]={dim_size[0]} and world_size={world} "
            f"(remainder={dim_size[0] % world})."
        )
    dim_size[0] //= world
    if output is None:
        output = torch.empty(dim_size, dtype=inp.dtype, device=inp.device)
    if inp.dtype in BYTE_DTYPES:  # fp8sim reduces float8 itself (synchronously)
        reduce_scatter_tensor(output, inp.contiguous(), group=tp_group)
        return output, _Done() if async_op else None
    handle = _dist().reduce_scatter_tensor(output, inp.contiguous(), group=tp_group, async_op=async_op)
    return output, handle


def _gather_bytes(out: torch.Tensor, inp: torch.Tensor, group: Any, async_op: bool) -> Any:
    """``all_gather_into_tensor`` of any dtype's bytes (byte views: no numerics), TE's handle."""
    from ..collectives import wire_view

    return _dist().all_gather_into_tensor(wire_view(out), wire_view(inp.contiguous()), group=group, async_op=async_op)


def _gather_plain(inp: torch.Tensor, group: Any, async_op: bool, out_shape: list[int]) -> tuple[torch.Tensor, Any]:
    out = torch.empty(out_shape, dtype=inp.dtype, device=inp.device)
    return out, _gather_bytes(out, inp, group, async_op)


def _all_gather_fp8(inp: Any, group: Any, async_op: bool, quantizer: Any, out_shape: list[int]) -> tuple[Any, Any]:
    """TE ``_all_gather_fp8``: quantize rowwise only, gather the codes, keep this rank's ``scale_inv``
    ("Assume scaling factors are identical across ranks"); the transpose made after the gather where the
    quantizer asks for columnwise data and TE's GPU needs it (``is_non_tn_fp8_gemm_supported``)."""
    from .tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor, _columnwise
    from .tensor.storage.float8_tensor_storage import Float8TensorStorage
    from .utils import is_non_tn_fp8_gemm_supported

    fp8_quantizers = (Float8Quantizer, Float8CurrentScalingQuantizer)
    if quantizer is not None and not isinstance(quantizer, fp8_quantizers):
        raise ValueError(f"Got non-FP8 quantizer ({quantizer.__class__.__name__})")
    if not isinstance(inp, Float8TensorStorage):
        if not isinstance(quantizer, fp8_quantizers):
            raise TypeError(
                "Expected quantizer to be Float8Quantizer or Float8CurrentScalingQuantizer "
                f"when input is not Float8TensorStorage, but got {type(quantizer).__name__}."
            )
        row, col = quantizer.rowwise_usage, quantizer.columnwise_usage
        quantizer.set_usage(rowwise=True, columnwise=False)  # TE: the transpose cannot be gathered
        try:
            inp = quantizer(inp)
        finally:
            quantizer.set_usage(rowwise=row, columnwise=col)
    if inp._data is None:
        raise RuntimeError("Float8TensorStorage is not supported yet without Quantizer")
    data = torch.empty(out_shape, dtype=torch.uint8, device=inp._data.device)
    handle = _gather_bytes(data, inp._data, group, async_op)
    transpose = None
    if quantizer is not None and quantizer.columnwise_usage and not is_non_tn_fp8_gemm_supported():
        if handle is not None:
            handle.wait()
            handle = None
        transpose = _columnwise(data)
    out = Float8Tensor(
        shape=out_shape,
        dtype=inp.dtype,
        data=data,
        fp8_scale_inv=inp._scale_inv,  # TE: this rank's
        fp8_dtype=inp._fp8_dtype,
        data_transpose=transpose,
        quantizer=quantizer if quantizer is not None else inp._quantizer,
        device=data.device,
    )
    return out, handle


def _gather_rows(t: torch.Tensor, rows: int, group: Any, world: int, pad_to: tuple[int, ...]) -> torch.Tensor:
    """The first ``rows`` rows of ``t`` (scales without TE's padding) gathered, zero-padded to ``pad_to``."""
    src = t[:rows].contiguous()
    out = torch.empty((rows * world, *src.shape[1:]), dtype=src.dtype, device=src.device)
    _gather_bytes(out, src, group, False)
    full = torch.zeros(pad_to, dtype=src.dtype, device=src.device)
    full[: out.shape[0], : out.shape[1]] = out
    return full


def _all_gather_mxfp8(inp: Any, group: Any, quantizer: Any, out_shape: list[int]) -> tuple[Any, Any]:
    """TE ``_all_gather_mxfp8``: each rank's shard quantized (or an ``MXFP8Tensor`` as it is), rowwise and
    columnwise data and unpadded scales gathered along dim 0, the scales re-padded (zeros) to TE's shapes."""
    from .tensor.mxfp8_tensor import MXFP8Tensor

    world = get_distributed_world_size(group)
    if not isinstance(inp, MXFP8Tensor) and not quantizer.is_quantizable(inp):
        warnings.warn(_MX_FALLBACK, stacklevel=3)
        from .tensor.storage.quantized_tensor_storage import QuantizedTensorStorage

        if isinstance(inp, QuantizedTensorStorage):
            inp = inp.dequantize()
        out, _ = _gather_plain(inp, group, False, out_shape)
        return quantizer(out), None
    if not isinstance(inp, MXFP8Tensor):
        inp = quantizer(inp)
    elif (quantizer.rowwise_usage and inp._rowwise_data is None) or (
        quantizer.columnwise_usage and inp._columnwise_data is None
    ):
        warnings.warn(_MX_MISMATCH, stacklevel=3)
        inp = quantizer(inp.dequantize(dtype=inp.dtype))
    m = math.prod(inp.shape[:-1])
    bufs: dict[str, Any] = {}
    for usage, rows in (("rowwise", m), ("columnwise", m // 32)):
        if not getattr(quantizer, f"{usage}_usage"):
            bufs[f"{usage}_data"] = bufs[f"{usage}_scale_inv"] = None
            continue
        data = getattr(inp, f"_{usage}_data")
        gathered = torch.empty(out_shape, dtype=torch.uint8, device=data.device)
        _gather_bytes(gathered, data.reshape(inp.shape), group, False)
        bufs[f"{usage}_data"] = gathered
        pad = quantizer.get_scale_shape(tuple(out_shape), usage == "columnwise")
        bufs[f"{usage}_scale_inv"] = _gather_rows(getattr(inp, f"_{usage}_scale_inv"), rows, group, world, pad)
    out = MXFP8Tensor(
        shape=tuple(out_shape),
        dtype=inp.dtype,
        device=inp.device,
        fp8_dtype=inp._fp8_dtype,
        quantizer=quantizer,
        with_gemm_swizzled_scales=False,
        **bufs,
    )
    return out, None


def _all_gather_fp8_blockwise(inp: Any, group: Any, quantizer: Any, out_shape: list[int]) -> Any:
    """TE ``_start_all_gather_fp8_blockwise`` for a high-precision ``inp``: a shard TE cannot quantize
    (``is_quantizable``: >= 2 dims, last dim and the product of the others multiples of 128) or 2D blocks:
    TE's warning, a high-precision gather, the whole quantized.  Else TE quantizes each shard and gathers
    data and scales; every 1x128 rowwise block lies in one row and every 128x1 columnwise block inside one
    shard (its rows are a multiple of 128), so that is the whole tensor's quantization, which fp8sim returns
    (tests/_te_tp_attention.py ``_per_shard_then_gather`` checks the equality).  An already-quantized
    ``Float8BlockwiseQTensor`` is not gathered as it is (not emulated)."""
    from .tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from .tensor.storage.quantized_tensor_storage import QuantizedTensorStorage

    if quantizer is None:
        raise ValueError("Quantizer is missing")
    if not isinstance(quantizer, Float8BlockQuantizer):
        raise ValueError(f"Got non-FP8 blockwise quantizer ({quantizer.__class__.__name__})")
    if isinstance(inp, QuantizedTensorStorage):
        raise NotImplementedError("fp8sim: gather_along_first_dim of a Float8BlockwiseQTensor is not emulated")
    shape = tuple(inp.shape)
    quantizable = len(shape) >= 2 and shape[-1] % 128 == 0 and math.prod(shape[:-1]) % 128 == 0
    if not quantizable or quantizer.block_scaling_dim != 1:
        warnings.warn(_MX_FALLBACK, stacklevel=3)
    out, _ = _gather_plain(inp, group, False, out_shape)
    return quantizer(out)


def gather_along_first_dim(
    inp: Any,
    process_group: Any,
    async_op: bool = False,
    quantizer: Any = None,
    output_tensor: torch.Tensor | None = None,
    external_coalescing: bool = False,
) -> tuple[Any, Any]:
    """TE: every rank's ``inp`` concatenated along dim 0 (rank order); with ``quantizer`` (or a quantized
    ``inp``) the gathered tensor is quantized as TE gathers it (module docstring).  ``output_tensor``: the
    buffer of a plain gather (with a quantizer: not emulated); ``external_coalescing`` (TE: the caller's
    coalescing manager batches the collectives) changes nothing here, each collective runs as it is issued."""
    del external_coalescing
    from .tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from .tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
    from .tensor.mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
    from .tensor.nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
    from .tensor.storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
    from .tensor.storage.float8_tensor_storage import Float8TensorStorage
    from .tensor.storage.quantized_tensor_storage import QuantizedTensorStorage

    if output_tensor is not None and (quantizer is not None or isinstance(inp, QuantizedTensorStorage)):
        raise NotImplementedError("fp8sim: gather_along_first_dim with output_tensor= and a quantized gather")
    world = get_distributed_world_size(process_group)
    if world == 1:
        if quantizer is not None and not isinstance(inp, QuantizedTensorStorage):
            inp = quantizer(inp)
        return inp, None
    out_shape = list(inp.size())
    out_shape[0] *= world
    if isinstance(inp, Float8TensorStorage) or isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        return _all_gather_fp8(inp, process_group, async_op, quantizer, out_shape)
    if isinstance(inp, MXFP8Tensor) or isinstance(quantizer, MXFP8Quantizer):
        if not isinstance(quantizer, MXFP8Quantizer):
            raise TypeError(f"Expected MXFP8Quantizer for MXFP8 all-gather, but got {type(quantizer).__name__}.")
        out, _ = _all_gather_mxfp8(inp, process_group, quantizer, out_shape)
        return out, _Done() if async_op else None
    if isinstance(inp, Float8BlockwiseQTensorStorage) or isinstance(quantizer, Float8BlockQuantizer):
        return _all_gather_fp8_blockwise(inp, process_group, quantizer, out_shape), _Done() if async_op else None
    if isinstance(inp, NVFP4Tensor) or isinstance(quantizer, NVFP4Quantizer):
        if not isinstance(quantizer, NVFP4Quantizer):
            raise TypeError(f"Expected NVFP4Quantizer for NVFP4 all-gather, but got {type(quantizer).__name__}.")
        return _all_gather_nvfp4(inp, process_group, quantizer), _Done() if async_op else None
    if quantizer is not None:
        warnings.warn(_UNSUPPORTED, stacklevel=2)
        if isinstance(inp, QuantizedTensorStorage):
            inp = inp.dequantize()
        out, _ = _gather_plain(inp, process_group, False, out_shape)
        return quantizer(out), _Done() if async_op else None
    if isinstance(inp, QuantizedTensorStorage):  # TE: "Dequantize quantized tensor if not supported"
        warnings.warn(_UNSUPPORTED, stacklevel=2)
        inp = inp.dequantize()
    if output_tensor is None:
        return _gather_plain(inp, process_group, async_op, out_shape)
    return output_tensor, _gather_bytes(output_tensor, inp, process_group, async_op)


def _all_gather_nvfp4(inp: torch.Tensor, group: Any, quantizer: Any) -> Any:
    """TE ``_all_gather_nvfp4``: this rank's rows ``inp`` (high precision: ``quantizer(inp)`` on this rank,
    with ``with_amax_reduction`` and ``amax_reduction_group`` set as TE's layers set them; or an
    ``NVFP4Tensor``), data and scales of the quantizer's usages gathered and laid out as TE lays them, in an
    ``NVFP4Tensor`` of the gathered shape."""
    from ..collectives.quantized import gather_codes, swap_first_dims, world_rank
    from .tensor.nvfp4_tensor import NVFP4Tensor, is_nvfp4_quantizable

    world, _ = world_rank(group)
    shape = tuple(inp.shape)
    out_shape = (shape[0] * world, *shape[1:])
    if isinstance(inp, NVFP4Tensor):  # TE: its data as it is, unless the quantizer wants a copy it lacks
        local = inp
        if (quantizer.rowwise_usage and inp._rowwise_data is None) or (
            quantizer.columnwise_usage and inp._columnwise_data is None
        ):
            warnings.warn(_NVFP4_MISMATCH, stacklevel=2)
            local = quantizer(inp.dequantize(dtype=inp.dtype))
    elif not is_nvfp4_quantizable(shape, quantizer.row_scaled_nvfp4):
        warnings.warn(_NVFP4_FALLBACK, stacklevel=2)
        return quantizer(gather_along_first_dim(inp, group)[0])
    else:
        local = quantizer(inp)
    m, k = math.prod(shape[:-1]), shape[-1]
    names = ("rowwise_data", "rowwise_scale_inv", "amax_rowwise", "columnwise_data", "columnwise_scale_inv")
    fields: dict[str, Any] = dict.fromkeys((*names, "amax_columnwise"))
    if quantizer.rowwise_usage:
        data = gather_codes(local._rowwise_data.reshape(m, k // 2), group, "float4_e2m1fn_x2")
        scales = gather_codes(local._rowwise_scale_inv[:m], group, "float8_e4m3fn")
        sc = torch.zeros(quantizer.get_scale_shape(out_shape, False), dtype=torch.uint8)
        sc[: scales.shape[0]] = scales  # TE: the padding rows are make_empty's (uninitialised); fp8sim: 0
        fields.update(rowwise_data=data.reshape(*out_shape[:-1], k // 2), rowwise_scale_inv=sc)
        fields["amax_rowwise"] = local._amax_rowwise
    if quantizer.columnwise_usage:
        data = swap_first_dims(gather_codes(local._columnwise_data, group, "float4_e2m1fn_x2"), world)
        scales = local._columnwise_scale_inv[:k, : m // _NVFP4_BLOCK]
        scales = swap_first_dims(gather_codes(scales, group, "float8_e4m3fn"), world)
        sc = torch.zeros(quantizer.get_scale_shape(out_shape, True), dtype=torch.uint8)
        sc[:k, : scales.shape[1]] = scales  # TE pad_columnwise_scale_inv: zero padding
        fields.update(columnwise_data=data, columnwise_scale_inv=sc, amax_columnwise=local._amax_columnwise)
    return NVFP4Tensor(
        shape=out_shape,
        dtype=inp.dtype,
        device=inp.device,
        **fields,
        fp4_dtype=quantizer.dtype,
        quantizer=quantizer,
        with_2d_quantization=quantizer.with_2d_quantization,
        nvfp4_use_4over6=quantizer.nvfp4_use_4over6,
        nvfp4_e4m3_max=quantizer.nvfp4_e4m3_max,
    )


def allreduce(inp: torch.Tensor, tp_group: Any = None, async_op: bool = False) -> tuple[torch.Tensor, Any]:
    """TE: ``inp`` SUM-reduced over ``tp_group`` in place (a float8 ``inp`` by fp8sim, synchronously)."""
    from ..collectives import BYTE_DTYPES, all_reduce

    if get_distributed_world_size(tp_group) == 1:
        return inp, None
    if inp.dtype in BYTE_DTYPES:
        all_reduce(inp, group=tp_group)
        return inp, _Done() if async_op else None
    return inp, _dist().all_reduce(inp, group=tp_group, async_op=async_op)


def symmetric_all_reduce(
    inp: torch.Tensor, tp_group: Any = None, async_op: bool = False, all_reduce_type: str = "multimem_all_reduce"
) -> tuple[torch.Tensor, Any]:
    """TE: ``inp`` SUM-reduced over ``tp_group`` in place, synchronous only.  "nccl" is the plain
    all-reduce; "multimem_all_reduce", "two_shot" and "one_shot" (symmetric memory on NVLink) give the
    same sum here: the order in which NVLink multimem hardware adds the ranks' values is not modelled."""
    if async_op:
        raise RuntimeError(f"Async symmetric ops are not supported yet, but async_op={async_op!r} was passed.")
    if get_distributed_world_size(tp_group) == 1:
        return inp, None
    if all_reduce_type != "nccl" and all_reduce_type not in _SYMMETRIC_KINDS:
        raise TypeError(f"All reduce type {all_reduce_type} is not supported.")
    out, _ = allreduce(inp, tp_group)
    return out, None
