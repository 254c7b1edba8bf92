"""TE's pure-PyTorch current-scaling reference (TE 2.20.0.dev0 ``pytorch/custom_recipes/
reference_current_scaling.py``): ``CurrentScalingQuantizerRef``, its ``CurrentScalingTensorRef`` and
``current_scaling_ref_factory``.

The reference's scale differs from the CUDA kernel's (``fp8sim.scaling.current.compute_scale_from_amax``)
only at the extremes, all float32::

    amax  = max(max|x|, eps)                    # NaN propagates (torch.amax)
    scale = fp8_max / amax; Inf -> finfo(x.dtype).max   # the INPUT dtype's max (bf16: 3.39e38)
    pow_2_scales: 2^(frexp(scale).exp - 1); amax == Inf -> 0
    amax == 0 -> 1;  amax == Inf -> 0;  amax NaN -> NaN  # the kernel gives 1 for all three
    data  = RN(fl32(x) * scale) cast as torch casts to float8 (e4m3fn: NaN 0x7F|sign; e5m2 likewise)
    scale (stored) = fl32(1 / scale)

The transposed copy is the rowwise data transposed, with the same scale.  ``qgemm`` runs fp8sim's
``torch._scaled_mm`` emulation (:func:`fp8sim.gemm.scaled_mm`, Hopper accumulators) where TE calls
``torch._scaled_mm``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ...scaling.current import compute_scale_from_amax, quantize_with_scale
from ..tensor.quantized_tensor import Quantizer
from . import gemm, reference_utils
from ._reference_tensor import ReferenceStorage

__all__ = ["current_scaling_ref_factory", "CurrentScalingTensorRef", "CurrentScalingQuantizerRef"]

_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def current_scaling_ref_factory(role: Any) -> CurrentScalingQuantizerRef:
    """``qfactory``: E5M2 for a ``grad_output`` role, E4M3 otherwise; both copies, no power-of-two scales."""
    grad = role is not None and role.tensor_type == "grad_output"
    dtype = torch.float8_e5m2 if grad else torch.float8_e4m3fn
    return CurrentScalingQuantizerRef(dtype=dtype, rowwise=True, columnwise=True, pow_2_scales=False, eps=0.0)


@dataclasses.dataclass(repr=False)
class CurrentScalingTensorRef(ReferenceStorage):
    """The reference's quantized tensor: ``data`` (torch float8, the 2-D view), ``scale`` (float32, one
    element: the dequantization scale), ``data_t`` / ``scale_t`` the transposed copy, ``dtype`` the input
    dtype, ``quant_dtype`` the float8 dtype, ``original_shape`` the input's shape."""

    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    data_t: torch.Tensor | None = None
    scale_t: torch.Tensor | None = None
    dtype: torch.dtype | None = None
    device: torch.device | None = None
    quant_dtype: torch.dtype | None = None
    original_shape: tuple[int, ...] | None = None
    _quantizer: Quantizer | None = None

    def size(self, *args: Any, **kwargs: Any) -> Any:
        """The 2-D data's size (from the transposed copy when the rowwise one is gone)."""
        if self.data is not None:
            return self.data.size(*args, **kwargs)
        size = self.data_t.size(*args, **kwargs)
        return torch.Size([size[-1], math.prod(size[:-1])])


def _reference_scale(
    x_dtype: torch.dtype, amax: torch.Tensor, quant_dtype: torch.dtype, *, eps: float, pow_2_scales: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scale, scale_inv, amax)`` by the reference's rules (module docstring), float32 of amax's shape."""
    a = np.maximum(amax.detach().to("cpu", torch.float32).numpy(), np.float32(eps))  # NaN stays NaN
    fp8_max = float(torch.finfo(quant_dtype).max)
    scale = compute_scale_from_amax(
        np.where(np.isfinite(a), a, 1), fp8_max, pow2=pow_2_scales, value_for_inf=float(torch.finfo(x_dtype).max)
    )
    # frexp's 2^(e-1) and the kernel's exponent mask agree on every normal float32 (scale >= 448 / FLT_MAX)
    scale = np.where(np.isnan(a), np.float32(np.nan), np.where(np.isinf(a), np.float32(0), scale))
    scale = np.where(a == 0, np.float32(1), scale).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = (np.float32(1) / scale).astype(np.float32)
    dev = amax.device
    return torch.from_numpy(scale).to(dev), torch.from_numpy(inv).to(dev), torch.from_numpy(a).to(dev)


class CurrentScalingQuantizerRef(Quantizer):
    """TE's reference current-scaling quantizer: ``dtype`` is ``torch.float8_e4m3fn`` or
    ``torch.float8_e5m2``; ``eps`` the amax floor; ``pow_2_scales`` rounds the scale down to a power of two.
    ``with_amax_reduction`` / ``amax_reduction_group``: all-reduce the amax (MAX) first."""

    def __init__(
        self,
        dtype: torch.dtype,
        rowwise: bool = True,
        columnwise: bool = True,
        pow_2_scales: bool = False,
        eps: float = 0.0,
    ) -> None:
        if dtype not in _FORMATS:
            raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2; got {dtype}")
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.internal = True
        self.dtype = dtype
        self.pow_2_scales = pow_2_scales
        self.eps = eps
        self.with_amax_reduction = False
        self.amax_reduction_group: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the process group (not picklable), as TE."""
        state = self.__dict__.copy()
        state["amax_reduction_group"] = None
        return state

    @property
    def custom(self) -> bool:
        """Always True: ``general_gemm`` dispatches this quantizer's tensors to :meth:`qgemm`."""
        return True

    @property
    def supports_allgather_fp8(self) -> bool:
        return True

    def copy(self) -> CurrentScalingQuantizerRef:
        return copy.copy(self)

    @classmethod
    def compute_scale(
        cls, x: torch.Tensor, quant_dtype: torch.dtype, eps: float = 0.0, pow_2_scales: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scale, scale_inv, amax)`` of ``x`` (one-element float32 tensors; an empty ``x`` has amax 0
        here, where TE reads an uninitialised ``torch.empty``)."""
        x32 = x.to(torch.float32)
        amax = torch.zeros(1, device=x.device) if x32.numel() == 0 else torch.amax(torch.abs(x32)).view(1)
        return _reference_scale(x.dtype, amax, quant_dtype, eps=eps, pow_2_scales=pow_2_scales)

    def _quantize(self, tensor: torch.Tensor) -> tuple[Any, Any, Any, Any]:
        if self.with_amax_reduction:
            assert self.amax_reduction_group is not None, (
                "amax_reduction_group must be set when with_amax_reduction is True"
            )
            x32 = tensor.to(torch.float32)
            amax = torch.zeros(1, device=tensor.device) if x32.numel() == 0 else torch.amax(torch.abs(x32)).view(1)
            torch.distributed.all_reduce(amax, group=self.amax_reduction_group, op=torch.distributed.ReduceOp.MAX)
            scale, scale_inv, _ = _reference_scale(
                tensor.dtype, amax, self.dtype, eps=self.eps, pow_2_scales=self.pow_2_scales
            )
        else:
            scale, scale_inv, _ = self.compute_scale(tensor, self.dtype, eps=self.eps, pow_2_scales=self.pow_2_scales)
        qx = self._cast(tensor, scale)
        qx_t, sx_t = (qx.t().contiguous(), scale_inv) if self.columnwise_usage else (None, None)
        if not self.rowwise_usage:
            return None, None, qx_t, sx_t
        return qx, scale_inv, qx_t, sx_t

    def _cast(self, tensor: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``(tensor.float() * scale).to(dtype)``: fp8sim's scaled cast, NaNs written as torch writes them."""
        s = np.float32(scale.to("cpu").numpy().reshape(-1)[0])
        x32 = tensor.detach().to("cpu", torch.float32).numpy()
        codes = quantize_with_scale(x32, s, _FORMATS[self.dtype]).codes.reshape(x32.shape)
        with np.errstate(invalid="ignore", over="ignore"):
            nan = np.isnan(x32 * s)
        if nan.any():  # torch casts NaN to 0x7F | sign for both float8 formats (ml_dtypes: E5M2 0x7E)
            sign = np.signbit(x32 * s).astype(np.uint8) << 7
            codes = np.where(nan, np.uint8(0x7F) | sign, codes).astype(np.uint8)
        return torch.from_numpy(np.ascontiguousarray(codes)).view(self.dtype).to(tensor.device)

    def quantize(self, tensor: torch.Tensor, **kwargs: Any) -> CurrentScalingTensorRef:  # type: ignore[override]
        """Quantize ``tensor`` (float32/float16/bfloat16; more than 2 dims are flattened to 2-D)."""
        del kwargs
        assert tensor.dtype in reference_utils.HIGH_PRECISION_FLOAT_DTYPES, "Unsupported input dtype."
        shape = tensor.shape
        if tensor.ndim > 2:
            tensor = tensor.view(-1, tensor.shape[-1])
        qx, sx, qx_t, sx_t = self._quantize(tensor)
        return CurrentScalingTensorRef(
            data=qx,
            scale=sx,
            data_t=qx_t,
            scale_t=sx_t,
            dtype=tensor.dtype,
            device=tensor.device,
            quant_dtype=self.dtype,
            _quantizer=self,
            original_shape=shape,
        )

    def quantize_impl(self, tensor: torch.Tensor) -> Any:
        return self.quantize(tensor)

    def __call__(self, tensor: torch.Tensor) -> CurrentScalingTensorRef:
        return self.quantize(tensor)

    def dequantize(self, tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``fl32(data) * scale``, cast to ``dtype`` when given."""
        out = tensor.to(torch.float32) * scale
        return out if dtype is None else out.to(dtype)

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
        """``qx @ qw.T`` with per-tensor scales through ``torch._scaled_mm`` (fp8sim's emulation); a bias
        enters the GEMM unless it or the output is float32 (cuBLAS takes no float32 bias), then it is added."""
        del gemm_type, qresult_x, qresult_w
        from ...gemm.scaled_mm import scaled_mm

        m, k = qx.shape
        n = qw.shape[0]
        if m == 0 or k == 0 or n == 0:
            if accumulate:
                assert out is not None
                y = out
            else:
                y = torch.zeros((m, n), dtype=out_dtype, device=qx.device)
            return y if bias is None else y + bias
        in_gemm = bias is not None and out_dtype != torch.float32 and bias.dtype != torch.float32
        y = scaled_mm(
            qx,
            qw.transpose(-1, -2),
            scale_a=sx,
            scale_b=sw,
            out_dtype=out_dtype,
            use_fast_accum=not m_params.use_split_accumulator,
            bias=bias if in_gemm else None,
        )
        if bias is not None and not in_gemm and bias.numel():
            y = y + bias
        if accumulate:
            assert out is not None, "Output tensor must be provided for accumulation."
            return out.add_(y)
        assert out is None, "Output tensor should be None when accumulate is False."
        return y

    def transpose_qresult(self, qresult: CurrentScalingTensorRef) -> CurrentScalingTensorRef:
        """Add the transposed copy to a rowwise-only result."""
        assert qresult.data_t is None
        assert qresult.scale_t is None
        assert qresult.data is not None
        qresult.data_t = qresult.data.transpose(-2, -1).contiguous()
        qresult.scale_t = qresult.scale
        return qresult

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
        dst.data, dst.scale, dst.data_t, dst.scale_t = self._quantize(src)
        dst.dtype, dst.quant_dtype, dst.original_shape = src.dtype, self.dtype, shape
        return dst

    def make_empty(  # type: ignore[override]
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        requires_grad: bool = False,
    ) -> CurrentScalingTensorRef:
        """A 2-D result with uninitialised data (``device`` None: ``"cuda"``, as TE)."""
        del requires_grad
        shape = tuple(shape)
        assert len(shape) == 2, "shape is not 2d"
        device = torch.device("cuda") if device is None else device
        qx = torch.empty(shape, dtype=self.dtype, device=device)
        sx = torch.empty(1, dtype=torch.float32, device=device)
        qx_t = sx_t = None
        if self.columnwise_usage:
            qx_t = torch.empty(shape[1], shape[0], dtype=self.dtype, device=device)
            sx_t = torch.empty(1, dtype=torch.float32, device=device)
        return CurrentScalingTensorRef(
            data=qx,
            scale=sx,
            data_t=qx_t,
            scale_t=sx_t,
            dtype=dtype,
            device=device,
            quant_dtype=self.dtype,
            _quantizer=self,
            original_shape=shape,
        )
