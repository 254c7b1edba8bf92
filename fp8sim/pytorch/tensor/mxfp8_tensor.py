"""TE's ``MXFP8Quantizer`` and ``MXFP8Tensor`` (TE: ``pytorch/tensor/mxfp8_tensor.py``).

Numerics are ``fp8sim.scaling.quantize_mx(..., scale_rule="rceil", flavor="te")`` (TE's
``quantize_mxfp8.cuh``): blocks of 32 along the last dim (rowwise) and along the flattened first
dims (columnwise), each copy from the high-precision input.  Layouts are TE's (``get_scale_shape``):
data in the logical shape for both copies, E8M0 scale codes (uint8) of shape
``(round_up(M, 128), round_up(K / 32, 4))`` rowwise and ``(round_up(M / 32, 4), round_up(K, 128))``
columnwise, with ``M = prod(shape[:-1])``, ``K = shape[-1]``; the scales are not swizzled.
``with_2d_quantization`` (weights under ``MXFP8BlockScaling(enable_2d_quantization=True)``): one
scale per 32x32 tile (``float_to_e8m0(tile_amax * fl32(1/max))``), written on each row of the tile
in the rowwise scales and each column in the columnwise ones, so both copies have the same codes
(``quantize_mxfp8.cuh``, ``kIs2DBlockScaling``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._util.tensors import numpy_view
from ...formats import get_format
from ...scaling.mx import quantize_mx
from ..constants import MXFP8_BLOCK_SCALING_SIZE, DType, TE_DType_To_Torch
from . import _fsdp2_block
from ._blockwise import BlockScaledTensor, check_usage, flatten_2d, padded, round_up
from ._data_setter import data_property
from .quantized_tensor import Quantizer, _check_high_precision
from .storage.mxfp8_tensor_storage import MXFP8TensorStorage

__all__ = ["MXFP8Quantizer", "MXFP8Tensor"]

_B = MXFP8_BLOCK_SCALING_SIZE
_FORMATS = {DType.kFloat8E4M3: get_format("e4m3"), DType.kFloat8E5M2: get_format("e5m2")}


def _e8m0_values(codes: torch.Tensor) -> torch.Tensor:
    """2^(e-127) as float32, built from bits (0x00 -> 2^-127, 0xFF -> NaN), as TE's ``exp2f_rcp``."""
    e = codes.to(torch.int32)
    bits = torch.where(e == 0, torch.tensor(0x00400000, dtype=torch.int32), e << 23)
    bits = torch.where(e == 255, torch.tensor(0x7FC00000, dtype=torch.int32), bits)
    return bits.view(torch.float32)


class MXFP8Quantizer(Quantizer):
    """MXFP8 with E8M0 scales per 32 elements (``fp8_dtype`` E4M3 or E5M2)."""

    def __init__(
        self,
        fp8_dtype: DType | int,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        with_2d_quantization: bool = False,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = DType.cast(fp8_dtype)
        if self.dtype not in _FORMATS:
            raise ValueError(f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2, got {self.dtype!r}")
        self.with_2d_quantization = with_2d_quantization

    def copy(self) -> MXFP8Quantizer:
        q = MXFP8Quantizer(self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        q.with_2d_quantization = self.with_2d_quantization
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return q

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        m, k = flatten_2d(inp.shape)
        return inp.dim() >= 2 and m % _B == 0 and k % _B == 0

    def get_scale_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, int]:
        m, k = flatten_2d(shape)
        if columnwise:
            return round_up(m // _B, 4), round_up(k, 128)
        return round_up(m, 128), round_up(k // _B, 4)

    def quantize_impl(self, tensor: torch.Tensor) -> MXFP8Tensor:
        _check_high_precision(tensor, type(self).__name__)
        check_usage(self)
        if not self.is_quantizable(tensor):
            raise ValueError(
                f"MXFP8 quantization needs a tensor of >= 2 dims whose last dim and product of the other dims "
                f"are multiples of {_B}; got shape {tuple(tensor.shape)}"
            )
        m, k = flatten_2d(tensor.shape)
        x = numpy_view(tensor.to(dtype=torch.float32).reshape(m, k))  # .numpy() pins the storage (FSDP2)
        fmt = _FORMATS[self.dtype]
        if self.with_2d_quantization:
            row_codes, row_scales, col_codes, col_scales = self._quantize_2d(x, fmt)
        else:
            kw = dict(block_size=_B, scale_rule="rceil", flavor="te")
            r = quantize_mx(x, fmt, axis=-1, **kw) if self.rowwise_usage else None
            c = quantize_mx(x, fmt, axis=0, **kw) if self.columnwise_usage else None
            row_codes, row_scales = (r.codes, r.scales) if r else (None, None)
            col_codes, col_scales = (c.codes, c.scales) if c else (None, None)
        shape = tuple(tensor.shape)
        dev = tensor.device

        def data(codes: np.ndarray | None) -> torch.Tensor | None:
            return None if codes is None else torch.from_numpy(codes).reshape(shape).to(dev)

        def scales(s: np.ndarray | None, columnwise: bool) -> torch.Tensor | None:
            if s is None:
                return None
            return padded(s, self.get_scale_shape(shape, columnwise), torch.uint8).to(dev)

        return MXFP8Tensor(
            shape=shape,
            dtype=tensor.dtype,
            device=dev,
            rowwise_data=data(row_codes) if self.rowwise_usage else None,
            rowwise_scale_inv=scales(row_scales, False) if self.rowwise_usage else None,
            columnwise_data=data(col_codes) if self.columnwise_usage else None,
            columnwise_scale_inv=scales(col_scales, True) if self.columnwise_usage else None,
            fp8_dtype=self.dtype,
            quantizer=self,
        )

    @staticmethod
    def _quantize_2d(x: np.ndarray, fmt: object) -> tuple:
        """One E8M0 scale per 32x32 tile: the tile's 1024 elements quantized as one MX block."""
        m, k = x.shape
        tiles = x.reshape(m // _B, _B, k // _B, _B).transpose(0, 2, 1, 3).reshape(-1, _B * _B)
        q = quantize_mx(tiles, fmt, axis=-1, block_size=_B * _B, scale_rule="rceil", flavor="te")
        codes = q.codes.reshape(m // _B, k // _B, _B, _B).transpose(0, 2, 1, 3).reshape(m, k)
        tile_scales = q.scales.reshape(m // _B, k // _B)
        row_scales = np.repeat(tile_scales, _B, axis=0)  # (M, K/32)
        col_scales = np.repeat(tile_scales, _B, axis=1)  # (M/32, K)
        return codes, row_scales, codes, col_scales


class MXFP8Tensor(MXFP8TensorStorage, BlockScaledTensor):
    """MXFP8 data: ``_rowwise_data`` / ``_columnwise_data`` (uint8 codes, logical shape),
    ``_rowwise_scale_inv`` / ``_columnwise_scale_inv`` (uint8 E8M0, TE's padded shapes),
    ``_fp8_dtype``, ``_with_gemm_swizzled_scales`` (False: fp8sim keeps compact scales)."""

    _extra_fields = ("with_gemm_swizzled_scales",)
    data = data_property("requantize")  # TE: assigning .data casts to MXFP8
    fsdp_pre_all_gather = _fsdp2_block.fsdp_pre_all_gather
    fsdp_post_all_gather = _fsdp2_block.fsdp_post_all_gather

    def _create_columnwise(self) -> None:
        """TE (``storage/mxfp8_tensor_storage.py`` ``update_usage``): only the quantization makes it."""
        raise RuntimeError("Requested column-wise usage, but MXFP8Tensor is missing column-scaled FP8 data")

    def _build_default_quantizer(self) -> MXFP8Quantizer:
        """TE ``mxfp8_tensor.py``: an ``MXFP8Quantizer`` of the tensor's FP8 dtype."""
        return MXFP8Quantizer(self._fp8_dtype)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """TE's MXFP8 ``split`` (FSDP2): along dim 0 in multiples of 32 rows the pieces stay MXFP8Tensors
        (data and scales split, scales re-padded to TE's 128 / 4 rows; ``_fsdp2_block``); any other split
        dequantizes."""
        kwargs = kwargs or {}
        out = _fsdp2_block.dispatch(func, args, kwargs)  # FSDP2's new_zeros, split, narrow, view, as_strided
        if out is not NotImplemented:
            return out
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _view_refusal(self, shape: tuple[int, ...], view: bool) -> tuple[type | None, str] | None:
        """TE (``mxfp8_tensor.py`` ``_ViewFunc``/``_ReshapeFunc``): the last dim must stay; a view
        warns and dequantizes, a reshape raises."""
        if shape[-1] == self.shape[-1]:
            return None
        dims = f"(attempted to reshape dims={tuple(self.shape)} to {shape})"
        if not view:
            return RuntimeError, f"MXFP8Tensor does not support reshaping inner dimension {dims}"
        return None, (
            f"MXFP8Tensor does not support reshaping inner dimension. {dims}"
            "If you are using this for FSDP2 without compiled_autograd_enabled,"
            "then ignore this warning. Since this view is not going to be used anywhere. "
        )

    def _values(self, data: torch.Tensor, scale_inv: torch.Tensor, columnwise: bool) -> torch.Tensor:
        m, k = flatten_2d(self.shape)
        fp8 = TE_DType_To_Torch[self._fp8_dtype]
        vals = data.reshape(m, k).view(fp8).float()
        if columnwise:
            s = _e8m0_values(scale_inv[: m // _B, :k]).repeat_interleave(_B, dim=0)
        else:
            s = _e8m0_values(scale_inv[:m, : k // _B]).repeat_interleave(_B, dim=1)
        return (vals * s).reshape(self.shape)

    def _dequantize_rowwise(self) -> torch.Tensor:
        return self._values(self._rowwise_data, self._rowwise_scale_inv, False)

    def _dequantize_columnwise(self) -> torch.Tensor:
        return self._values(self._columnwise_data, self._columnwise_scale_inv, True)
