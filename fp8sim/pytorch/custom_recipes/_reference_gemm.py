"""The GEMM of TE's NVFP4 reference quantizer (``reference_nvfp4.py`` ``NVFP4QuantizerRef.qgemm``, TE
2.20.0.dev0): block by block over K in float32, as the FP4 tensor core is modelled there."""

from __future__ import annotations

from typing import Any

import torch

from ...cast import decode
from ...formats import E2M1
from ...scaling.packing import unpack_fp4
from . import gemm

__all__ = ["nvfp4_reference_gemm"]


def _fp4_values(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Packed E2M1 bytes decoded to ``dtype`` (every E2M1 value is exact in float16/bfloat16)."""
    codes = unpack_fp4(packed.to("cpu")).numpy()
    return torch.from_numpy(decode(codes, E2M1)).to(packed.device, dtype)


def _setting(q: Any, name: str, default: Any) -> Any:
    return getattr(q, name, getattr(q, "_" + name, default))


def _alpha(quantizer: Any, gemm_type: gemm.GEMMType, qx: Any, qw: Any) -> torch.Tensor:
    if qx is None:
        raise ValueError("qresult_x is required for non-pow_2_scales NVFP4 GEMM (needed for global_amax)")
    if qw is None:
        raise ValueError("qresult_w is required for non-pow_2_scales NVFP4 GEMM (needed for global_amax)")
    if qx.global_amax_row is None:
        raise ValueError("qresult_x.global_amax_row must be set for non-pow_2_scales NVFP4 GEMM")
    if qw.global_amax_col is None:
        raise ValueError("qresult_w.global_amax_col must be set for non-pow_2_scales NVFP4 GEMM")
    maxes = []
    for q in (qx, qw):
        use = _setting(q, "nvfp4_use_4over6", quantizer.nvfp4_use_4over6)
        maxes.append(float(_setting(q, "nvfp4_e4m3_max", quantizer.nvfp4_e4m3_max)) if use else 448.0)
    factor = 36.0 * maxes[0] * maxes[1]
    wgrad = gemm_type == gemm.GEMMType.WGRAD
    partial = qx.global_amax_col * qw.global_amax_col if wgrad else qx.global_amax_row * qw.global_amax_row
    if partial.numel() > 1:  # a row-scaled operand: per output column for WGRAD, else per output row
        partial = partial.reshape(1, -1) if wgrad else partial.reshape(-1, 1)
    else:
        partial = partial.squeeze(-1)
    return torch.div(partial, factor)


def nvfp4_reference_gemm(
    quantizer: Any,
    qx: torch.Tensor,
    qw: torch.Tensor,
    out_dtype: torch.dtype,
    sx: torch.Tensor,
    sw: torch.Tensor,
    out: torch.Tensor | None,
    accumulate: bool,
    gemm_type: gemm.GEMMType,
    qresult_x: Any,
    qresult_w: Any,
) -> torch.Tensor:
    """``NVFP4QuantizerRef.qgemm`` without the bias check (see its docstring)."""
    x = _fp4_values(qx, out_dtype)
    w = _fp4_values(qw, out_dtype)
    pow2 = quantizer.pow_2_scales
    if pow2:  # E8M0 scales as uint8 exponents or float8_e8m0fnu

        def e8m0(s: torch.Tensor) -> torch.Tensor:
            return torch.exp2(s.to(torch.float32) - 127.0) if s.dtype == torch.uint8 else s.to(torch.float32)

        sx, sw = e8m0(sx), e8m0(sw)
        alpha = None
    else:
        alpha = _alpha(quantizer, gemm_type, qresult_x, qresult_w)
        sx, sw = sx.to(torch.float32), sw.to(torch.float32)
    m, k = x.shape
    n, k_w = w.shape
    if k != k_w:
        raise ValueError(f"K dimension mismatch between qx and qw: qx has K={k}, qw has K={k_w}")
    if k % 32:
        raise ValueError(f"K dimension must be divisible by 32, got K={k}")
    if n % 8:
        raise ValueError(f"N dimension must be divisible by 8, got N={n}")
    bl = 32 if pow2 else 16
    if sx.shape != (m, k // bl):
        raise ValueError(f"sx shape mismatch: expected ({m}, {k // bl}), got {sx.shape}")
    if sw.shape != (n, k // bl):
        raise ValueError(f"sw shape mismatch: expected ({n}, {k // bl}), got {sw.shape}")
    y = torch.zeros(m, n, dtype=torch.float32, device=qx.device)
    for j in range(k // bl):
        blk = slice(j * bl, (j + 1) * bl)
        # the block dot of E2M1 values is exact in float32, as is each scale product: one rounding per add
        part = x[:, blk].to(torch.float32) @ w[:, blk].to(torch.float32).T
        y += torch.outer(sx[:, j], sw[:, j]) * part
    if alpha is not None and k > 0:
        y = alpha * y
    if accumulate:
        if out is None:
            raise ValueError("Output tensor must be provided for accumulation.")
        y += out.to(torch.float32)
    elif out is not None:
        raise ValueError("Output tensor should be None when accumulate is False.")
    return y.to(out_dtype)
