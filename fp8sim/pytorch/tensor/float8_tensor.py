"""TE's per-tensor FP8: ``Float8Quantizer`` (delayed scaling), ``Float8CurrentScalingQuantizer``
and ``Float8Tensor`` (TE: ``pytorch/tensor/float8_tensor.py``, ``storage/float8_tensor_storage.py``).

Quantization is TE's kernel: ``_data = satfinite(RN(fl32(x) * scale))`` as uint8 codes,
``_scale_inv = 1/scale`` rounded once; a delayed-scaling quantizer folds ``max|x|`` (NaN skipped)
into its ``amax`` tensor in place; current scaling takes the scale from the tensor's own amax
(``compute_scale_from_amax``).  Columnwise usage adds ``_transpose``, the FP8 codes with the last
dim moved first (TE's layout where the GPU needs TN GEMMs); rowwise usage keeps ``_data``.
Dequantization is TE's CPU path: ``_data.view(fp8 dtype).float() * _scale_inv``, then the dtype.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..._util.tensors import numpy_view
from ...cast.numpy_backend import encode_scaled_with_amax
from ...formats import get_format
from ...scaling.amax import amax_nan_skipping
from ...scaling.current import compute_scale_from_amax
from ..constants import DType, TE_DType_To_Torch
from . import _fsdp2
from ._data_setter import data_property
from .quantized_tensor import QuantizedTensor, Quantizer, _check_high_precision
from .storage.float8_tensor_storage import Float8TensorStorage

__all__ = ["Float8Quantizer", "Float8CurrentScalingQuantizer", "Float8Tensor", "delayed_scaling_quantizers"]

_FORMATS = {DType.kFloat8E4M3: get_format("e4m3"), DType.kFloat8E5M2: get_format("e5m2")}


def _fp8_dtype(fp8_dtype: Any) -> DType:
    d = DType.cast(fp8_dtype)
    if d not in _FORMATS:
        raise ValueError(f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2, got {d!r}")
    return d


def _to_numpy32(tensor: torch.Tensor) -> np.ndarray:
    return numpy_view(tensor.to(dtype=torch.float32).contiguous())  # .numpy() pins a parameter's storage (FSDP2)


def _columnwise(data: torch.Tensor) -> torch.Tensor:
    """TE's ``_transpose``: logical shape ``(..., K)`` stored as ``(K, ...)``."""
    return data.movedim(-1, 0).contiguous() if data.dim() > 1 else data.clone()


def _make_tensor(
    q: Quantizer, src: torch.Tensor, codes: np.ndarray, scale_inv: np.float32, fp8_dtype: DType
) -> Float8Tensor:
    data = torch.from_numpy(codes.reshape(tuple(src.shape))).to(src.device)
    return Float8Tensor(
        shape=src.shape,
        dtype=src.dtype,
        data=data if q.rowwise_usage else None,
        fp8_scale_inv=torch.tensor([scale_inv], dtype=torch.float32, device=src.device),
        fp8_dtype=fp8_dtype,
        data_transpose=_columnwise(data) if q.columnwise_usage else None,
        quantizer=q,
        device=src.device,
    )


class Float8Quantizer(Quantizer):
    """Delayed scaling: cast with the given ``scale`` (a 1-element float32 tensor, usually a view of
    the recipe state), fold the amax into ``amax`` (1 element, in place)."""

    def __init__(
        self,
        scale: torch.Tensor,
        amax: torch.Tensor,
        fp8_dtype: DType | int,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.scale = scale
        self.amax = amax
        self.dtype = _fp8_dtype(fp8_dtype)

    def copy(self) -> Float8Quantizer:
        q = Float8Quantizer(
            self.scale, self.amax, self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage
        )
        q.internal = self.internal
        return q

    def quantize_impl(self, tensor: torch.Tensor) -> Float8Tensor:
        _check_high_precision(tensor, type(self).__name__)
        scale = np.float32(self.scale.detach().reshape(-1)[0].item())
        codes, amax = encode_scaled_with_amax(_to_numpy32(tensor), scale, _FORMATS[self.dtype], saturate=True)
        with torch.no_grad():  # TE's kernel: atomic max into the amax buffer
            self.amax.copy_(torch.fmax(self.amax, torch.tensor(float(amax), dtype=self.amax.dtype)))
        with np.errstate(divide="ignore"):
            scale_inv = np.float32(1) / scale
        return _make_tensor(self, tensor, codes, scale_inv, self.dtype)

    def calibrate(self, tensor: torch.Tensor) -> None:
        """TE's calibration: ``amax.copy_(max(-amin, amax))`` of ``tensor`` (overwrites; NaN passes)."""
        amin, amax = tensor.detach().aminmax()
        self.amax.copy_(torch.max(-amin, amax))

    def create_tensor_from_data(
        self, data: torch.Tensor, fake_dtype: torch.dtype = torch.float32, requires_grad: bool = False, **_: Any
    ) -> Float8Tensor:
        """A Float8Tensor over existing uint8 codes, with ``scale_inv = 1 / scale``."""
        if data.dtype not in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(f"data must be uint8 or an FP8 dtype, got {data.dtype}")
        return Float8Tensor(
            shape=data.shape,
            dtype=fake_dtype,
            data=data.view(torch.uint8),
            fp8_scale_inv=1 / self.scale.reshape(1).to(torch.float32),
            fp8_dtype=self.dtype,
            quantizer=self,
            requires_grad=requires_grad,
            device=data.device,
        )


class Float8CurrentScalingQuantizer(Quantizer):
    """Current scaling: the scale comes from this tensor's amax (all-reduced with MAX over
    ``amax_reduction_group`` when ``with_amax_reduction``), ``force_pow_2_scales`` rounds it down to
    a power of two, ``amax_epsilon`` floors the amax.  ``device``, ``use_existing_amax``, ``scale``
    and ``amax`` are accepted and ignored, as in TE."""

    def __init__(
        self,
        fp8_dtype: DType | int,
        device: Any = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        use_existing_amax: bool = False,
        with_amax_reduction: bool = False,
        amax_reduction_group: Any = None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
        scale: torch.Tensor | None = None,
        amax: torch.Tensor | None = None,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if use_existing_amax or scale is not None or amax is not None:
            warnings.warn(
                "Float8CurrentScalingQuantizer ignores `use_existing_amax`, `scale`, "
                "and `amax`; kept for backward compatibility and will be removed.",
                DeprecationWarning,
                stacklevel=2,
            )
        del device
        self.dtype = _fp8_dtype(fp8_dtype)
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = amax_epsilon

    def copy(self) -> Float8CurrentScalingQuantizer:
        q = Float8CurrentScalingQuantizer(
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            with_amax_reduction=self.with_amax_reduction,
            amax_reduction_group=self.amax_reduction_group,
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )
        q.internal = self.internal
        return q

    update_quantized = _fsdp2.current_scaling_update_quantized  # honours dst.amax_reduction_group (FSDP2)
    fsdp_reduces_amax = True  # FSDP2's pre-all-gather gives its shards the mesh's amax_reduction_group

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["amax_reduction_group"] = None  # process groups do not pickle
        return state

    def quantize_impl(self, tensor: torch.Tensor) -> Float8Tensor:
        _check_high_precision(tensor, type(self).__name__)
        x32 = _to_numpy32(tensor)
        return self._cast(tensor, x32, np.float32(amax_nan_skipping(x32)))

    def quantize_with_amax(self, tensor: torch.Tensor, amax: Any) -> Float8Tensor:
        """TE's C++ ``Float8CurrentScalingQuantizer::quantize_with_amax``: cast ``tensor`` with the scale of
        an amax its producer computed (TE's activation kernels take it on their float32 results before
        rounding them to the output dtype); all-reduced first when ``with_amax_reduction``."""
        _check_high_precision(tensor, type(self).__name__)
        return self._cast(tensor, _to_numpy32(tensor), np.float32(amax))

    def _cast(self, tensor: torch.Tensor, x32: np.ndarray, amax: np.float32) -> Float8Tensor:
        if self.with_amax_reduction:
            amax = _all_reduce_max(amax, self.amax_reduction_group)
        fmt = _FORMATS[self.dtype]
        scale = np.float32(compute_scale_from_amax(amax, fmt.max, pow2=self.force_pow_2_scales, eps=self.amax_epsilon))
        codes, _ = encode_scaled_with_amax(x32, scale, fmt, saturate=True)
        return _make_tensor(self, tensor, codes, np.float32(1) / scale, self.dtype)


def _all_reduce_max(amax: np.float32, group: Any) -> np.float32:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) <= 1:
        return amax
    t = torch.tensor([float(amax)], dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return np.float32(t.item())


class _Dequantize(torch.autograd.Function):
    """TE's ``_FromFloat8Func``: the gradient passes through in full precision."""

    @staticmethod
    def forward(ctx: Any, tensor: Float8Tensor, dtype: torch.dtype) -> torch.Tensor:  # noqa: ARG004
        return tensor._dequantize_impl(dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


class _Reshape(torch.autograd.Function):
    """TE's ``_ViewFunc`` / ``_ReshapeFunc`` (``tensor/float8_tensor.py``): the codes are viewed or
    reshaped; the transpose is kept only where its shape already is the new shape's columnwise one
    (so a real shape change drops it, and a columnwise-only tensor can only keep its shape)."""

    @staticmethod
    def forward(ctx: Any, tensor: Float8Tensor, shape: Sequence[int], view: bool) -> Float8Tensor:
        ctx.shape = tensor.shape
        if tensor._data is not None:
            data = tensor._data.view(*shape) if view else tensor._data.reshape(*shape)
            out_shape = data.shape
        else:
            data, out_shape = None, torch.empty(tensor.shape, device="meta").reshape(*shape).shape
        transpose = None if tensor._transpose_invalid else tensor._transpose
        if transpose is not None:
            if tuple(transpose.shape) != _columnwise_shape(out_shape):
                transpose = None
            else:
                transpose = transpose.view(*_columnwise_shape(out_shape))
        if data is None and transpose is None:
            raise NotImplementedError(
                "Float8Tensor view with columnwise-only data is only supported "
                "when the requested shape preserves the columnwise layout"
            )
        return tensor._rebuilt(out_shape, data, transpose)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad.reshape(ctx.shape), None, None


class Float8Tensor(Float8TensorStorage, QuantizedTensor):
    """FP8 data with one scale: ``_data`` (uint8 codes), ``_scale_inv`` (float32, shape [1]),
    ``_fp8_dtype`` (``DType``), ``_transpose`` (columnwise codes or None), ``_quantizer``."""

    _saved_fields = ("_data", "_transpose", "_scale_inv")
    data = data_property("requantize")  # TE: assigning .data casts to FP8
    amax_reduction_group: Any = None  # set by FSDP2 in fsdp_pre_all_gather (current scaling)
    fsdp_pre_all_gather = _fsdp2.fsdp_pre_all_gather
    fsdp_post_all_gather = _fsdp2.fsdp_post_all_gather
    untyped_storage = _fsdp2.untyped_storage  # TE's; FSDP2's meta-device flow reads it

    def _init(
        self,
        *,
        data: torch.Tensor | None,
        fp8_scale_inv: torch.Tensor,
        fp8_dtype: DType | int = DType.kFloat8E4M3,
        data_transpose: torch.Tensor | None = None,
        quantizer: Quantizer | None = None,
    ) -> None:
        if data is not None and data.dtype != torch.uint8:
            data = data.view(torch.uint8)
        self._data = data
        self._scale_inv = torch.as_tensor(fp8_scale_inv, dtype=torch.float32).reshape(-1)
        self._fp8_dtype = _fp8_dtype(fp8_dtype)
        self._transpose = data_transpose
        self._transpose_invalid = data_transpose is None
        self._quantizer = quantizer.copy() if quantizer is not None else None

    def get_metadata(self) -> dict[str, Any]:
        return {
            "data": self._data,
            "fp8_scale_inv": self._scale_inv,
            "fp8_dtype": self._fp8_dtype,
            "data_transpose": self._transpose,
            "quantizer": self._quantizer,
        }

    def _rebuilt(self, shape: Sequence[int], data: torch.Tensor | None, transpose: torch.Tensor | None) -> Float8Tensor:
        meta = self.get_metadata()
        meta.update(data=data, data_transpose=transpose)
        return Float8Tensor(shape=shape, dtype=self.dtype, device=self.device, **meta)

    def _dequantize_impl(self, dtype: torch.dtype) -> torch.Tensor:
        fp8 = TE_DType_To_Torch[self._fp8_dtype]
        if self._data is not None:
            if self._data.numel() == 0:
                return torch.empty_like(self._data, dtype=dtype)
            # the scale as a 0-d factor, so a 0-d tensor stays 0-d (TE's output has the input's shape)
            return (self._data.view(fp8).float() * self._scale_inv.to(self._data.device).reshape(())).to(dtype)
        if self._transpose is not None:
            out = (self._transpose.view(fp8).float() * self._scale_inv.reshape(())).to(dtype)
            return out.movedim(0, -1).contiguous() if out.dim() > 1 else out
        raise RuntimeError("Float8TensorStorage has neither rowwise nor columnwise data")

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = self.dtype if dtype is None else dtype
        if torch.is_grad_enabled() and self.requires_grad:
            return _Dequantize.apply(self, dtype)
        return self._dequantize_impl(dtype)

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._data is not None, "columnwise": not self._transpose_invalid}

    def _reset_caches(self) -> None:
        """TE's: mark the transpose stale after an in-place write of ``_data`` (a columnwise-only tensor's
        transpose is its data, so it stays valid)."""
        self._transpose_invalid = not (self._data is None and self._transpose is not None)

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Add or drop the rowwise / columnwise copies (the transpose is made from ``_data``)."""
        if columnwise_usage and self._transpose_invalid:
            if self._data is None:
                raise RuntimeError("Float8Tensor has no rowwise data to build the transpose from")
            self._transpose, self._transpose_invalid = _columnwise(self._data), False
        if rowwise_usage and self._data is None:  # TE (storage/float8_tensor_storage.py update_usage)
            raise RuntimeError("Cannot generate FP8 data, even from FP8 data transpose")
        if rowwise_usage is False:
            self._data = None
        if columnwise_usage is False:
            self._transpose, self._transpose_invalid = None, True

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """TE's Float8Tensor rules (``tensor/float8_tensor.py`` ``__torch_dispatch__``): slicing,
        indexing and ``split`` give Float8Tensors over the sliced codes (and transpose); ``copy_``
        between Float8Tensors copies the codes and ``_scale_inv`` into the destination's buffers."""
        kwargs = kwargs or {}
        if func in (torch.ops.aten.slice.Tensor, torch.ops.aten.select.int):
            return _slice(func, args, kwargs)
        if func == torch.ops.aten.split.Tensor and args[0]._data is not None:
            return _split(args, kwargs)
        if func == torch.ops.aten.new_zeros.default:
            return _new_zeros(args, kwargs)
        if func == torch.ops.aten.as_strided.default:
            return _fsdp2.as_strided(args[0], args, kwargs)
        if func == torch.ops.aten.view.default:  # TE: a Float8Tensor (DTensor.to_local views the shard)
            return _Reshape.forward(_fsdp2.NoCtx(), args[0], tuple(args[1]), True)
        if (
            func == torch.ops.aten.copy_.default
            and isinstance(args[0], Float8Tensor)
            and isinstance(args[1], Float8Tensor)
        ):
            dst, src = args[0], args[1]
            with torch.no_grad():
                if dst._data is not None:
                    dst._data.copy_(src._data.detach())
                dst._scale_inv.copy_(src._scale_inv.view(dst._scale_inv.size()))
                if dst._transpose is not None and not dst._transpose_invalid:
                    if not src._transpose_invalid:
                        dst._transpose.copy_(src._transpose)
                    else:  # TE's _create_transpose from the destination's own codes
                        dst._transpose.copy_(_columnwise(dst._data))
            return dst
        return super().__torch_dispatch__(func, types, args, kwargs)

    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> Float8Tensor:
        """TE's: ``self`` when the codes (and transpose) are contiguous, else a copy that is."""
        if all(t is None or t.is_contiguous(memory_format=memory_format) for t in (self._data, self._transpose)):
            return self
        data = None if self._data is None else self._data.contiguous(memory_format=memory_format)
        transpose = None
        if self._transpose is not None and not self._transpose_invalid:
            transpose = self._transpose.contiguous(memory_format=memory_format)
        return self._rebuilt(self.shape, data, transpose)

    def view(self, *shape: Any) -> Float8Tensor:  # type: ignore[override]
        return _Reshape.apply(self, _shape_arg(shape), True)

    def reshape(self, *shape: Any) -> Float8Tensor:  # type: ignore[override]
        return _Reshape.apply(self, _shape_arg(shape), False)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"Float8Tensor(fp8_dtype={self._fp8_dtype}, scale_inv={self._scale_inv.item()}, data={self.dequantize()})"
        )


def _columnwise_shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape) if len(shape) == 0 else (shape[-1], *shape[:-1])


def _slice(func: Any, args: tuple, kwargs: dict) -> Any:
    """TE's slice/select: the rowwise codes are sliced as the logical tensor; the transpose is sliced
    along the matching dimension (logical dim d is transpose dim d+1, the last one is dim 0)."""
    tensor = args[0]
    if tensor.dim() == 0:
        return func(tensor.dequantize(), *args[1:], **kwargs)
    data = func(tensor._data, *args[1:], **kwargs) if tensor._data is not None else None
    transpose = None
    if tensor._transpose is not None and not tensor._transpose_invalid:
        ndim = tensor.dim()
        dim = (args[1] if len(args) > 1 else 0) % ndim
        t_dim = 0 if dim == ndim - 1 else dim + 1
        transpose = func(tensor._transpose, t_dim, *args[2:], **kwargs)
        if func == torch.ops.aten.select.int and dim == ndim - 1 and transpose.dim() > 1:
            transpose = transpose.movedim(-1, 0).contiguous()
    if data is not None:
        shape = data.shape
    else:
        shape = func(torch.empty(tensor.shape, device="meta"), *args[1:], **kwargs).shape
        if transpose is None:
            raise RuntimeError("Float8Tensor slice/select requires rowwise or columnwise data")
        if tuple(transpose.shape) != _columnwise_shape(shape):
            raise RuntimeError(
                "Float8Tensor slice/select produced incompatible columnwise storage: "
                f"expected {_columnwise_shape(shape)}, got {tuple(transpose.shape)}"
            )
    return tensor._rebuilt(shape, data, transpose)


def _split(args: tuple, kwargs: dict) -> list[Float8Tensor]:
    """TE's split (FSDP2): each piece is a Float8Tensor over the split codes and transpose."""
    tensor = args[0]
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    pieces = torch.ops.aten.split.Tensor(tensor._data, args[1], dim)
    t_pieces: list[Any] = [None] * len(pieces)
    if tensor._transpose is not None and not tensor._transpose_invalid:
        t_dim = 0 if dim == tensor.dim() - 1 else dim + 1
        t_pieces = list(torch.ops.aten.split.Tensor(tensor._transpose, args[1], t_dim))
    return [tensor._rebuilt(p.shape, p, t) for p, t in zip(pieces, t_pieces, strict=True)]


def _new_zeros(args: tuple, kwargs: dict) -> Float8Tensor:
    """TE's new_zeros: zero codes (and a zero transpose where the source has one), a copy of
    ``_scale_inv``, the same quantizer; ``dtype`` is the nominal dtype."""
    tensor, size = args[0], tuple(args[1])
    dtype = kwargs.get("dtype") or tensor.dtype
    if tensor._data is None and (tensor._transpose is None or tensor._transpose_invalid):
        raise RuntimeError("Float8Tensor.new_zeros requires rowwise or columnwise data")
    # TE: the codes buffers' own new_zeros (their device, or the ``device`` asked for), the scale moved there
    opts = {k: v for k, v in kwargs.items() if k not in ("dtype", "layout", "requires_grad")}
    data = tensor._data.new_zeros(size, **opts) if tensor._data is not None else None
    transpose = None
    if tensor._transpose is not None and not tensor._transpose_invalid:
        transpose = tensor._transpose.new_zeros(_columnwise_shape(size), **opts)
    reference = data if data is not None else transpose
    scale_inv = tensor._scale_inv.detach().clone()
    if scale_inv.device != reference.device:
        scale_inv = scale_inv.to(reference.device)
    return Float8Tensor(
        shape=size,
        dtype=dtype,
        data=data,
        fp8_scale_inv=scale_inv,
        fp8_dtype=tensor._fp8_dtype,
        data_transpose=transpose,
        quantizer=tensor._quantizer,
        device=reference.device,
    )


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], Sequence | torch.Size):
        return tuple(shape[0])
    return tuple(shape)


def delayed_scaling_quantizers(scaler: Any, *, rowwise: bool = True, columnwise: bool = True) -> list[Float8Quantizer]:
    """TE's ``DelayedScalingRecipeState.make_quantizers`` over a :class:`fp8sim.scaling.DelayedScaler`:
    quantizer ``i`` reads ``scale[i]`` and writes ``amax_history[0][i]`` through live torch views of
    the scaler's arrays (rebuild them after ``set_recipe`` changes the history length, as TE does)."""
    from ..constants import DType as _D

    scale = torch.from_numpy(scaler.scale)
    hist = torch.from_numpy(scaler.amax_history)
    fp8 = _D.kFloat8E4M3 if scaler.fmt == _FORMATS[_D.kFloat8E4M3] else _D.kFloat8E5M2
    return [
        Float8Quantizer(scale[i], hist[0][i].reshape((1,)), fp8, rowwise=rowwise, columnwise=columnwise)
        for i in range(scaler.n)
    ]
