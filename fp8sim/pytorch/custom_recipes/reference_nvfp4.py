"""TE's pure-PyTorch NVFP4 reference (TE 2.20.0.dev0 ``pytorch/custom_recipes/reference_nvfp4.py``):
``NVFP4QuantizerRef``, its ``NVFP4TensorRef``, ``nvfp4_ref_rht_2d_factory`` and the reference ``qgemm``.

The bits come from fp8sim's scaling layer: :func:`fp8sim.scaling.nvfp4.quantize_nvfp4` (``flavor="te"``,
the reference's zero rule) and, for 4over6, :func:`fp8sim.scaling.nvfp4_4over6.quantize_nvfp4_4over6`
(the reference's codes and, with ``nvfp4_4over6_err_use_fast_math``, its scaled-domain error).  As the
reference: a 2-D view of the input; the rowwise copy from the input, the columnwise copy from its
transpose (after the RHT ``x @ D·H/4`` when ``with_rht``, without ``D`` when ``with_random_sign_mask`` is
False); a global amax per copy, ``torch.max|.|`` (one per row when ``row_scaled_nvfp4``); zero padding to
whole tiles, the codes trimmed back.  ``data`` / ``data_t`` are uint8, two E2M1 codes per byte (even
element low); ``scale`` / ``scale_t`` ``torch.float8_e4m3fn``, one per 16 elements, shape ``(rows,
ceil(cols/16))`` (16x16 tiles: every row of a tile repeats the tile's scale, rows padded to 16).

Not emulated: ``pow_2_scales=True`` (the reference's MXFP4 mode: TE 2.20's ``_quantize`` reads a variable
it never sets in that mode and fails); NaN inputs (the scaling layer skips NaN in amaxes, the reference
propagates them).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import torch

from ...scaling.nvfp4 import RHT_SIGNS, quantize_nvfp4, rht_matrix
from ...scaling.nvfp4_4over6 import quantize_nvfp4_4over6
from ...scaling.packing import pack_fp4
from ..tensor.quantized_tensor import Quantizer
from . import gemm, reference_utils
from ._reference_tensor import ReferenceStorage

__all__ = ["nvfp4_ref_rht_2d_factory", "NVFP4TensorRef", "NVFP4QuantizerRef", "get_wgrad_sign_vector"]


def nvfp4_ref_rht_2d_factory(role: Any) -> NVFP4QuantizerRef:
    """``qfactory``: a linear / grouped-linear weight in 16x16 tiles without RHT, every other slot 1x16
    blocks with RHT on the columnwise copy."""
    weight = role is not None and role.module_type in ("linear", "grouped_linear") and role.tensor_type == "weight"
    return NVFP4QuantizerRef(
        dtype=reference_utils.Fp4Formats.E2M1,
        quant_tile_shape=(16, 16) if weight else (1, 16),
        pow_2_scales=False,
        with_rht=not weight,
    )


def get_wgrad_sign_vector() -> torch.Tensor:
    """The RHT's 16 fixed signs (float32)."""
    return torch.tensor(RHT_SIGNS, dtype=torch.float32)


@dataclasses.dataclass(repr=False)
class NVFP4TensorRef(ReferenceStorage):
    """The reference's NVFP4 tensor: packed ``data`` / ``data_t``, E4M3 ``scale`` / ``scale_t``, the float32
    global amaxes of each copy (``global_amax_row``, ``global_amax_col``: shape ``(1,)``, or one per row
    when row-scaled), the 4over6 settings the GEMM reads, and ``original_shape``."""

    _kind = "FP4"
    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    data_t: torch.Tensor | None = None
    scale_t: torch.Tensor | None = None
    global_amax_row: torch.Tensor | None = None
    global_amax_col: torch.Tensor | None = None
    nvfp4_use_4over6: bool = False
    nvfp4_e4m3_max: int = 448
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    quant_dtype: Any = None
    original_shape: tuple[int, ...] | None = None
    _quantizer: Quantizer | None = None

    def size(self, *args: Any, **kwargs: Any) -> torch.Size:
        """The logical (unpacked) shape, ``original_shape``."""
        del args, kwargs
        if self.original_shape is None:
            raise RuntimeError("NVFP4TensorRef.size() called but original_shape has not been set")
        return torch.Size(self.original_shape)


def _pad16(x: torch.Tensor) -> torch.Tensor:
    m, n = x.shape
    return torch.nn.functional.pad(x, (0, -n % 16, 0, -m % 16)) if (m % 16 or n % 16) else x


class NVFP4QuantizerRef(Quantizer):
    """TE's reference NVFP4 quantizer (argument names, defaults and refusals as TE's).  ``quant_tile_shape``
    ``(1, 16)`` or ``(16, 16)``; ``row_scaled_nvfp4``: one global amax per row (1x16, rowwise usage);
    ``nvfp4_use_4over6`` with ``nvfp4_e4m3_max`` (448 or 256), ``nvfp4_4over6_err_mode`` ("MAE"/"MSE") and
    ``nvfp4_4over6_err_use_fast_math``; ``with_rht`` / ``with_random_sign_mask``: the columnwise RHT."""

    def __init__(
        self,
        dtype: reference_utils.Fp4Formats,
        rowwise: bool = True,
        columnwise: bool = True,
        pow_2_scales: bool = False,
        eps: float = 0.0,
        quant_tile_shape: tuple[int, int] = (1, 16),
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        nvfp4_4over6_err_use_fast_math: bool = False,
        with_rht: bool = False,
        with_random_sign_mask: bool = True,
    ) -> None:
        mode = nvfp4_4over6_err_mode.upper()
        if row_scaled_nvfp4 and not rowwise:
            raise ValueError("Row-scaled NVFP4 reference quantization requires rowwise usage.")
        if nvfp4_use_4over6:
            if mode not in ("MAE", "MSE"):
                raise ValueError(f"Unsupported NVFP4 4over6 error mode: {mode}.")
            if pow_2_scales:
                raise ValueError("4over6 is only supported for NVFP4 (non-pow2) mode.")
            if tuple(quant_tile_shape) not in ((1, 16), (16, 16)):
                raise ValueError("4over6 reference quantization only supports 1x16 or 16x16 tiles.")
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.internal = True
        self.dtype = dtype
        self.pow_2_scales = pow_2_scales
        self.eps = eps
        self.quant_tile_shape = quant_tile_shape
        self.row_scaled_nvfp4 = row_scaled_nvfp4
        self.nvfp4_use_4over6 = nvfp4_use_4over6
        self.nvfp4_e4m3_max = nvfp4_e4m3_max if nvfp4_use_4over6 else 448
        if self.nvfp4_e4m3_max not in (448, 256):
            raise ValueError("nvfp4_e4m3_max must be 448 or 256.")
        self.nvfp4_4over6_err_mode = mode
        self.nvfp4_4over6_err_use_fast_math = nvfp4_4over6_err_use_fast_math
        self.with_rht = with_rht
        self.with_random_sign_mask = with_random_sign_mask

    @property
    def custom(self) -> bool:
        """Always True: ``general_gemm`` dispatches this quantizer's tensors to :meth:`qgemm`."""
        return True

    @property
    def supports_allgather_fp8(self) -> bool:
        return False

    @property
    def supports_dequantize(self) -> bool:
        return False

    @property
    def is_data_t_transposed_in_memory(self) -> bool:
        raise NotImplementedError(
            "NVFP4QuantizerRef.is_data_t_transposed_in_memory is not implemented for FP4 quantization"
        )

    def transpose_qresult(self, qresult: Any) -> Any:
        raise NotImplementedError("Transpose qresult is not implemented for FP4.")

    def copy(self) -> NVFP4QuantizerRef:
        return copy.copy(self)

    def _apply_rht(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (last dim a multiple of 16) times the 16x16 RHT matrix, in ``x``'s dtype (no-op without RHT)."""
        if not self.with_rht:
            return x
        n = self.quant_tile_shape[1]
        if x.shape[-1] % n:
            raise ValueError(f"Inner dimension {x.shape[-1]} must be divisible by hadamard dimension {n}")
        m = torch.from_numpy(rht_matrix(bool(self.with_random_sign_mask))).to(x.device, x.dtype)
        return (x.contiguous().view(-1, n) @ m).view(x.shape)

    def _blockwise(self, x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One copy of 2-D ``x``: packed codes ``(m, n/2)`` and E4M3 scales (module docstring)."""
        m, n = x.shape
        two_d = tuple(self.quant_tile_shape) == (16, 16)
        xp = _pad16(x)
        a = amax.detach().to("cpu", torch.float32)
        if self.row_scaled_nvfp4:  # padded rows are zero: amax 0
            a = torch.nn.functional.pad(a.reshape(-1), (0, xp.shape[0] - m))
        if self.nvfp4_use_4over6:
            q = quantize_nvfp4_4over6(
                xp.to("cpu"),
                err_mode=self.nvfp4_4over6_err_mode,
                e4m3_max=self.nvfp4_e4m3_max,
                global_amax=a.numpy(),
                block_2d=two_d,
                row_scaled=self.row_scaled_nvfp4,
                reference_zero_handling=True,
                err_fast_math=bool(self.nvfp4_4over6_err_use_fast_math),
            )
        else:
            q = quantize_nvfp4(
                xp.to("cpu"),
                flavor="te",
                block_2d=two_d,
                row_scaled=self.row_scaled_nvfp4,
                global_amax=a,
                reference_zero_handling=True,
            )
        scales = np.repeat(q.scales, 16, axis=0) if two_d else q.scales[:m]
        data = pack_fp4(torch.from_numpy(np.ascontiguousarray(q.codes[:m, :n])))
        sc = torch.from_numpy(np.ascontiguousarray(scales)).view(torch.float8_e4m3fn)
        return data.to(x.device), sc.to(x.device)

    def _quantize(self, tensor: torch.Tensor) -> tuple[Any, Any, Any, Any, Any, Any]:
        """``(data, scale, data_t, scale_t, global_amax_row, global_amax_col)`` of 2-D ``tensor``."""
        if self.pow_2_scales:
            if tuple(self.quant_tile_shape) != (1, 32):
                raise ValueError(f"MXFP4 only supports 1x32 tile shape, got {self.quant_tile_shape}")
            if self.row_scaled_nvfp4:
                raise ValueError("Row-scaled NVFP4 is only supported for NVFP4 (non-pow2) mode.")
            raise NotImplementedError(
                "NVFP4QuantizerRef(pow_2_scales=True) is not emulated: TE 2.20's reference fails in this mode "
                "(its _quantize never defines the rowwise input for MXFP4)"
            )
        if tuple(self.quant_tile_shape) not in ((1, 16), (16, 16)):
            raise ValueError(f"NVFP4 only supports 1x16 or 16x16 tile shape, got {self.quant_tile_shape}")
        if self.row_scaled_nvfp4 and tuple(self.quant_tile_shape) != (1, 16):
            raise ValueError(f"Row-scaled NVFP4 only supports NVFP4 1x16 tile shape, got {self.quant_tile_shape}")
        col_input = self._apply_rht(tensor.t().contiguous())
        if self.row_scaled_nvfp4:
            amax_row = torch.max(torch.abs(tensor), dim=1).values.to(torch.float32)
            amax_col = torch.max(torch.abs(col_input), dim=1).values.to(torch.float32)
        else:
            amax_row = torch.max(torch.abs(tensor)).to(torch.float32).view(1)
            amax_col = torch.max(torch.abs(col_input)).to(torch.float32).view(1)
        if not self.columnwise_usage:
            amax_col = amax_row
        qx = sx = qx_t = sx_t = None
        if self.rowwise_usage:
            qx, sx = self._blockwise(tensor, amax_row)
        if self.columnwise_usage:
            qx_t, sx_t = self._blockwise(col_input, amax_col)
        return qx, sx, qx_t, sx_t, amax_row, amax_col

    def quantize(self, tensor: torch.Tensor, **kwargs: Any) -> NVFP4TensorRef:  # type: ignore[override]
        """Quantize ``tensor`` (float32/float16/bfloat16; more than 2 dims are flattened to 2-D)."""
        del kwargs
        if tensor.dtype not in reference_utils.HIGH_PRECISION_FLOAT_DTYPES:
            raise TypeError(
                f"Unsupported input dtype {tensor.dtype}, expected one of {reference_utils.HIGH_PRECISION_FLOAT_DTYPES}"
            )
        shape = tensor.shape
        if tensor.ndim > 2:
            tensor = tensor.view(-1, tensor.shape[-1])
        qx, sx, qx_t, sx_t, amax_row, amax_col = self._quantize(tensor)
        return NVFP4TensorRef(
            data=qx,
            scale=sx,
            data_t=qx_t,
            scale_t=sx_t,
            global_amax_row=amax_row,
            global_amax_col=amax_col,
            nvfp4_use_4over6=self.nvfp4_use_4over6,
            nvfp4_e4m3_max=self.nvfp4_e4m3_max,
            dtype=tensor.dtype,
            device=tensor.device,
            quant_dtype=self.dtype,
            _quantizer=self,
            original_shape=shape,
        )

    def quantize_impl(self, tensor: torch.Tensor) -> Any:
        return self.quantize(tensor)

    def __call__(self, tensor: torch.Tensor) -> NVFP4TensorRef:
        return self.quantize(tensor)

    def update_quantized(  # type: ignore[override]
        self, src: torch.Tensor, dst: Any, *, noop_flag: torch.Tensor | None = None
    ) -> Any:
        """Quantize ``src`` into ``dst``'s fields (skipped when ``noop_flag`` is nonzero)."""
        if noop_flag is not None and noop_flag.item() != 0:
            return dst
        src = src.contiguous()
        shape = src.shape
        if src.ndim > 2:
            src = src.view(-1, src.shape[-1])
        dst.data, dst.scale, dst.data_t, dst.scale_t, dst.global_amax_row, dst.global_amax_col = self._quantize(src)
        dst.nvfp4_use_4over6, dst.nvfp4_e4m3_max = self.nvfp4_use_4over6, self.nvfp4_e4m3_max
        dst.dtype, dst.quant_dtype, dst.original_shape = src.dtype, self.dtype, shape
        return dst

    def qgemm(
        self,
        qx: torch.Tensor,
        qw: torch.Tensor,
        m_params: gemm.MMParams,
        out_dtype: torch.dtype,
        sx: torch.Tensor,
        sw: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
        gemm_type: gemm.GEMMType = gemm.GEMMType.FPROP,
        qresult_x: Any = None,
        qresult_w: Any = None,
    ) -> torch.Tensor:
        """The reference FP4 GEMM ``y = alpha * sum_k outer(sx[:, k], sw[:, k]) * (X_k @ W_k^T)`` over
        16-wide K blocks, float32, blocks added in K order (each block product is exact), then
        ``+ out`` when accumulating and one cast to ``out_dtype``.  ``alpha = amax_x * amax_w / (36 *
        E_x * E_w)`` from the operands' global amaxes (rowwise for FPROP/DGRAD, columnwise for WGRAD; a
        row-scaled operand's vector broadcasts over rows, or over columns for WGRAD)."""
        from ._reference_gemm import nvfp4_reference_gemm

        del m_params
        if bias is not None:
            raise ValueError("Bias is not supported in NVFP4QuantizerRef.qgemm")
        return nvfp4_reference_gemm(self, qx, qw, out_dtype, sx, sw, out, accumulate, gemm_type, qresult_x, qresult_w)
