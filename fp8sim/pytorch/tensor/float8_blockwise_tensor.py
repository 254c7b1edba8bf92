"""TE's ``Float8BlockQuantizer`` and ``Float8BlockwiseQTensor`` (TE:
``pytorch/tensor/float8_blockwise_tensor.py``).

Numerics are ``fp8sim.scaling.quantize_block_scaling`` (TE's ``quantize_transpose_{vector,square}_
blockwise.cu``), over the 2-D view ``(M, K) = (prod(shape[:-1]), shape[-1])``.  Layouts are TE's
(``get_scale_shape``, ``get_columnwise_shape``): rowwise data in the logical shape; columnwise data
transposed, ``(K, *shape[:-1])``; float32 scale_inv of shape

- 1x128 (``block_scaling_dim=1``): rowwise ``(ceil(K/128), round_up(M, 4))`` (scale of row ``m``,
  block ``j`` at ``[j, m]``), columnwise (128x1 blocks) ``(ceil(M/128), round_up(K, 4))``;
- 128x128: rowwise ``(ceil(M/128), round_up(ceil(K/128), 4))``, columnwise the transposed grid
  ``(ceil(K/128), round_up(ceil(M/128), 4))``, and the columnwise codes are the rowwise codes
  transposed (one scale per tile).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._util.tensors import numpy_view
from ...formats import get_format
from ...scaling.block import quantize_block_scaling
from ..constants import DType, TE_DType_To_Torch
from . import _fsdp2_block
from ._blockwise import _FSDP_NOTE, BlockScaledTensor, check_usage, flatten_2d, padded, round_up
from ._data_setter import data_property
from .quantized_tensor import Quantizer, _check_high_precision
from .storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensor"]

_FORMATS = {DType.kFloat8E4M3: get_format("e4m3"), DType.kFloat8E5M2: get_format("e5m2")}
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class Float8BlockQuantizer(Quantizer):
    """FP8 with one float32 scale per 1x128 (``block_scaling_dim=1``) or 128x128 (``2``) block;
    ``force_pow_2_scales`` rounds scales down to powers of two, ``amax_epsilon`` floors the amax."""

    def __init__(
        self,
        fp8_dtype: DType | int,
        *,
        rowwise: bool,
        columnwise: bool,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp8_dtype)
        if self.dtype not in _FORMATS:
            raise ValueError(f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2, got {self.dtype!r}")
        if block_scaling_dim not in (1, 2):
            raise RuntimeError(f"Only 1D or 2D blocks are supported, but got block_scaling_dim={block_scaling_dim}")
        self.block_len = 128
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = amax_epsilon
        self.block_scaling_dim = block_scaling_dim

    def copy(self) -> Float8BlockQuantizer:
        q = Float8BlockQuantizer(
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            amax_epsilon=self.amax_epsilon,
            force_pow_2_scales=self.force_pow_2_scales,
            block_scaling_dim=self.block_scaling_dim,
        )
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return q

    def get_scale_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, int]:
        m, k = flatten_2d(shape)
        b = self.block_len
        if self.block_scaling_dim == 2:
            sm, sk = -(-m // b), -(-k // b)
            return (sk, round_up(sm, 4)) if columnwise else (sm, round_up(sk, 4))
        return (-(-m // b), round_up(k, 4)) if columnwise else (-(-k // b), round_up(m, 4))

    def get_columnwise_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[-1], *shape[:-1]) if len(shape) else ()

    def quantize_impl(self, tensor: torch.Tensor) -> Float8BlockwiseQTensor:
        _check_high_precision(tensor, type(self).__name__)
        check_usage(self)
        shape = tuple(tensor.shape)
        m, k = flatten_2d(shape)
        x = tensor.detach().to(device="cpu").reshape(m, k)
        x = numpy_view(x) if tensor.dtype == torch.float32 else _as_ml_dtypes(x)  # .numpy() pins the storage
        fmt, pow2, dim = _FORMATS[self.dtype], self.force_pow_2_scales, self.block_scaling_dim
        eps = float(np.float32(self.amax_epsilon))  # TE passes it to the kernel as a float
        rd = rs = cd = cs = None
        if dim == 2:
            q = quantize_block_scaling(x, fmt, block_dim=2, pow2=pow2, eps=eps)
            codes = torch.from_numpy(np.ascontiguousarray(q.codes[:m, :k]))
            if self.rowwise_usage:
                rd, rs = codes.reshape(shape), padded(q.scales, self.get_scale_shape(shape, False), torch.float32)
            if self.columnwise_usage:
                cd = codes.t().contiguous().reshape(self.get_columnwise_shape(shape))
                cs = padded(q.scales.T, self.get_scale_shape(shape, True), torch.float32)
        else:
            if self.rowwise_usage:
                q = quantize_block_scaling(x, fmt, block_dim=1, pow2=pow2, eps=eps)
                rd = torch.from_numpy(np.ascontiguousarray(q.codes[:m, :k])).reshape(shape)
                rs = padded(q.scales.T, self.get_scale_shape(shape, False), torch.float32)
            if self.columnwise_usage:
                q = quantize_block_scaling(x, fmt, block_dim=1, columnwise=True, pow2=pow2, eps=eps)
                cd = torch.from_numpy(np.ascontiguousarray(q.codes[:m, :k].T)).reshape(self.get_columnwise_shape(shape))
                cs = padded(q.scales, self.get_scale_shape(shape, True), torch.float32)
        dev = tensor.device
        return Float8BlockwiseQTensor(
            shape=shape,
            dtype=tensor.dtype,
            device=dev,
            rowwise_data=None if rd is None else rd.to(dev),
            rowwise_scale_inv=None if rs is None else rs.to(dev),
            columnwise_data=None if cd is None else cd.to(dev),
            columnwise_scale_inv=None if cs is None else cs.to(dev),
            fp8_dtype=self.dtype,
            quantizer=self,
            is_2D_scaled=dim == 2,
        )


def _as_ml_dtypes(x: torch.Tensor) -> np.ndarray:
    """bfloat16/float16 as numpy (ml_dtypes bfloat16) so the block code sees the input dtype (its
    ``value_for_inf`` is the input dtype's max)."""
    import ml_dtypes

    if x.dtype == torch.float16:
        return x.numpy()
    return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


class Float8BlockwiseQTensor(Float8BlockwiseQTensorStorage, BlockScaledTensor):
    """FP8 block-scaled data: ``_rowwise_data`` (logical shape), ``_columnwise_data`` (transposed),
    float32 ``_rowwise_scale_inv`` / ``_columnwise_scale_inv`` in TE's layouts, ``_fp8_dtype``,
    ``_is_2D_scaled``."""

    _extra_fields = ("is_2D_scaled",)
    data = data_property("strict")  # TE: assigning .data quantizes into this tensor (same size and stride)
    fsdp_pre_all_gather = _fsdp2_block.fsdp_pre_all_gather
    fsdp_post_all_gather = _fsdp2_block.fsdp_post_all_gather

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The FSDP2 ops (``_fsdp2_block``); the rest run on the dequantized values."""
        kwargs = kwargs or {}
        out = _fsdp2_block.dispatch(func, args, kwargs)
        if out is not NotImplemented:
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _view_refusal(self, shape: tuple[int, ...], view: bool) -> tuple[type | None, str] | None:
        """TE (``float8_blockwise_tensor.py`` ``_ViewFunc``/``_ReshapeFunc``): 1x128 blocks keep the
        last dim, 128x128 blocks the last two; otherwise a warning and the dequantized values."""
        kept = 2 if self._is_2D_scaled else 1
        if len(shape) >= kept and shape[-kept:] == tuple(self.shape)[-kept:]:
            return None
        what = "the last 2 dimensions " if self._is_2D_scaled else "the last dimension "
        verb = "view " if view else "reshaping "
        return None, (
            f"{'2D' if self._is_2D_scaled else '1D'} scaled Float8BlockwiseQTensor does not support {verb}{what}"
            f"(attempted to {'view' if view else 'reshape'} dims={tuple(self.shape)} to {shape}). {_FSDP_NOTE}"
        )

    def _viewed(self, shape: tuple[int, ...], view: bool) -> Float8BlockwiseQTensor:
        if shape == tuple(self.shape):  # TE returns the tensor itself
            return self
        return super()._viewed(shape, view)

    def _create_columnwise(self) -> None:
        """TE ``storage/float8_blockwise_tensor_storage.py`` ``_create_columnwise`` (2D only): the rowwise
        codes transposed, the tile scales transposed into the columnwise layout."""
        if not self._is_2D_scaled:  # 1x128 rowwise and 128x1 columnwise scales differ
            raise AssertionError("Cannot update to rowwise and columnwise usage.")
        m, k = flatten_2d(self.shape)
        codes = self._rowwise_data.reshape(m, k).t().contiguous()
        self._columnwise_data = codes.reshape(self._data_shape(tuple(self.shape), True))
        sm, sk = -(-m // 128), -(-k // 128)
        rs = self._rowwise_scale_inv
        cs = torch.zeros(sk, round_up(sm, 4), dtype=rs.dtype, device=rs.device)
        cs[:, :sm] = rs[:sm, :sk].t()
        self._columnwise_scale_inv = cs

    def _data_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, ...]:
        return (shape[-1], *shape[:-1]) if columnwise else shape

    def _grid(self, data2d: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """``data2d`` (rows x cols) times its block scales, float32."""
        fp8 = TE_DType_To_Torch[self._fp8_dtype]
        vals = data2d.view(fp8).float()
        b = 128
        if self._is_2D_scaled:
            s = scale[: -(-rows // b), : -(-cols // b)]
            s = s.repeat_interleave(b, 0)[:rows].repeat_interleave(b, 1)[:, :cols]
        else:  # stored (blocks along cols, rows)
            s = scale[: -(-cols // b), :rows].t().repeat_interleave(b, 1)[:, :cols]
        return vals * s

    def _dequantize_rowwise(self) -> torch.Tensor:
        m, k = flatten_2d(self.shape)
        return self._grid(self._rowwise_data.reshape(m, k), self._rowwise_scale_inv, m, k).reshape(self.shape)

    def _dequantize_columnwise(self) -> torch.Tensor:
        m, k = flatten_2d(self.shape)
        t = self._grid(self._columnwise_data.reshape(k, m), self._columnwise_scale_inv, k, m)
        return t.t().reshape(self.shape)
