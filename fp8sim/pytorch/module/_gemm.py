"""TE's ``general_gemm``, emulated: one FP8 GEMM on two quantized operands (float32 result).

``accumulator`` picks the arithmetic: None (exact FP8 products summed in float32), an fp8sim preset, a
device name (``"hopper"``, ``"ada"``, ``"blackwell"``: fast or split per GEMM as the recipe says) or a
device profile (:mod:`fp8sim.gemm.profiles`, e.g. ``"h100_pcie_cublaslt_12_8_te"``): then each GEMM is
computed as that GPU's cuBLASLt call would compute it, with the split-K decision for its own
``(M, N, K)``, output dtype, fast/split accumulation and operand formats, the profile's partial-sum order
and epilogue.  An unknown split raises :class:`~fp8sim.gemm.SplitKUnknownError` naming the GEMM (module,
fprop/dgrad/wgrad, shape) and the ways out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...gemm._exact import fma_f32
from ...recipe import Recipe
from ._gemm_plan import GemmSite, out_name, resolve
from ._operands import Operand

__all__ = ["gemm", "GemmSite", "out_name"]


def gemm(
    a: Operand,
    b: Operand,
    recipe: Recipe,
    which: str,
    accumulator: Any,
    *,
    out_dtype: Any = None,
    site: GemmSite | None = None,
    addend: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a @ b`` (float32 result, the scales applied; the bias and the output rounding are the caller's).
    ``which``: "fprop", "dgrad" or "wgrad"; ``out_dtype``: the dtype TE's GEMM writes (a profile's split
    decision depends on it); ``site``: the module GEMM, for messages and plans.  See the module docstring
    for ``accumulator``.  ``addend``: ``C`` of an accumulating GEMM (TE's ``accumulate=True``, beta = 1:
    wgrad into ``main_grad``), float32; cuBLASLt's epilogue ``alpha * acc + beta * C`` is one float32 FMA,
    so with an accumulator (not None) and per-tensor scales the result is ``fma(acc, fl32(sa * sb), C)``,
    rounded once; the default path and block scales add it after (two roundings).  ``bias``: only for
    custom operands (:func:`_custom_gemm`), where it enters the quantizer's ``qgemm``; else the caller's."""
    if a.custom is not None or b.custom is not None:
        return _custom_gemm(a, b, which, out_dtype, addend, bias)
    if bias is not None:
        raise ValueError("gemm(bias=...) is for custom operands; the caller adds the bias otherwise")
    if a.high_precision or b.high_precision:
        return _high_precision_gemm(a, b, which, addend)
    per_tensor = a.vals is not None and b.vals is not None
    preset, split_k, epilogue = resolve(a, b, recipe, which, accumulator, out_dtype, site)
    if preset is None:
        if per_tensor:
            alpha = torch.tensor(np.float32(a.scale_inv) * np.float32(b.scale_inv), dtype=torch.float32)
            out = torch.matmul(a.vals, b.vals) * alpha
        else:
            out = torch.matmul(a.dq, b.dq)
        return out if addend is None else out + addend
    from ...gemm import scaled_mm

    if not per_tensor:
        if split_k is not None and split_k[0] > 1:
            raise ValueError(f"split_k applies to per-tensor scaled GEMMs; the {which} GEMM is block-scaled")
        out = _block_gemm(a, b, preset)
        return out if addend is None else out + addend
    sa, sb = np.float32(a.scale_inv), np.float32(b.scale_inv)
    fused = addend is not None
    out = scaled_mm(
        a.codes.contiguous().numpy(),
        b.codes.contiguous().numpy(),
        np.float32(1) if fused else sa,  # the raw sum (times 1, exact) when C joins the epilogue's FMA
        np.float32(1) if fused else sb,
        out_dtype="float32",
        accumulator=preset,
        a_format=a.fmt,
        b_format=b.fmt,
        strict=False,
        split_k=split_k,
        epilogue=epilogue,
    )
    if fused:
        c = addend.detach().float().cpu().numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            if epilogue == "alpha":
                out = fma_f32(out, np.float32(sa * sb), c)
            else:  # "sequential": fl32(acc * sa), then the FMA with sb
                out = fma_f32((out * sa).astype(np.float32), sb, c)
    return torch.from_numpy(np.ascontiguousarray(out, np.float32))


def _high_precision_gemm(a: Operand, b: Operand, which: str, addend: torch.Tensor | None) -> torch.Tensor:
    """Two ``IdentityQuantizer`` operands (a ``CustomRecipe``'s high-precision slots): cuBLAS's GEMM in their
    dtype, products summed in float32 (TE ``general_gemm`` takes them as plain tensors)."""
    if not (a.high_precision and b.high_precision):
        raise TypeError(
            f"the {which} GEMM got one IdentityQuantizer (high-precision) operand and one quantized operand; "
            "cuBLAS takes both quantized or both high precision: return IdentityQuantizer for both slots"
        )
    out = torch.matmul(a.dq, b.dq)
    return out if addend is None else out + addend


# layout, grad, use_split_accumulator (TE module/base.py _2X_ACC_*: a CustomRecipe has no fp8_gemm_* to override)
_CUSTOM_LAYOUT = {"fprop": ("TN", False, False), "dgrad": ("NN", True, True), "wgrad": ("NT", True, True)}


def _custom_gemm(
    a: Operand, b: Operand, which: str, out_dtype: Any, addend: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """``a @ b`` of two custom tensors as TE's ``general_gemm`` runs it: ``custom_gemm(A, B, layout, grad)``
    with cuBLAS's operand order (``A`` = ``b``'s tensor: the weight for fprop/dgrad, the input for wgrad),
    so the quantizer's ``qgemm`` takes ``(x.data, w.data)``, ``(dy.data, w.data_t)`` or
    ``(dy.data_t, x.data_t)``, split accumulation as TE's Linear asks (fprop no, dgrad/wgrad yes); its
    result is in ``out_dtype`` (returned widened to float32, exact)."""
    from ..custom_recipes.gemm import custom_gemm

    if addend is not None:  # TE's custom_gemm drops out= and accumulate=: main_grad would never see the GEMM
        raise NotImplementedError(
            "fuse_wgrad_accumulation with a custom-quantizer GEMM: TE's custom_gemm ignores out/accumulate"
        )
    if not isinstance(out_dtype, torch.dtype):
        raise NotImplementedError(f"a custom-quantizer GEMM writes a torch dtype; the {which} GEMM asks {out_dtype!r}")
    layout, grad, split = _CUSTOM_LAYOUT[which]
    out = custom_gemm(
        b.custom, a.custom, out_dtype=out_dtype, layout=layout, bias=bias, use_split_accumulator=split, grad=grad
    )[0]
    return out.reshape(-1, out.shape[-1]).float()


def _codes_and_scales(op: Operand) -> tuple[np.ndarray, np.ndarray]:
    """Element codes and block scales of an operand as ``scaled_mm`` wants them: ``a`` (M, K) with
    scales (M, K/block) or (M/128, K/128); ``b`` (K, N) with scales (K/block, N) or (K/128, N/128)."""
    qt = op.qt
    codes = qt.codes[tuple(slice(0, n) for n in qt.shape)]  # scaled_mm takes partial edge blocks itself
    scales = qt.scales
    if qt.fmt.name == "e2m1" and qt.block[-2:] == (16, 16):  # NVFP4 16x16 weight tiles: one 1x16 scale per row
        scales = np.repeat(scales, 16, axis=-2)
    if op.transposed:
        codes, scales = codes.T, scales.T
    return np.ascontiguousarray(codes), np.ascontiguousarray(scales)


def _block_gemm(a: Operand, b: Operand, preset: Any) -> torch.Tensor:
    """Block-scaled GEMM through ``fp8sim.gemm.scaled_mm``: MX (E8M0 per 32), 1x128/128x128 (float32
    scale_inv per block) and NVFP4 (UE4M3 per 16, the global scales applied after the sum)."""
    from ...gemm import scaled_mm

    ac, sa = _codes_and_scales(a)
    bc, sb = _codes_and_scales(b)
    sf = a.qt.scale_format
    variant = sf is not None and (sf.name == "ue5m3" or (sf.name == "e4m3" and a.qt.block[-1] == 32))
    out = scaled_mm(
        ac, bc, sa, sb, out_dtype="float32", accumulator=preset, a_format=a.fmt, b_format=b.fmt, strict=False,
        block_scale_format=sf.name if variant else None,  # the NVFP4 variants (fp8sim_nvfp4_variant)
    )  # fmt: skip
    if a.qt.global_scale is not None:  # NVFP4: the per-tensor factors after the sum, as TE's GEMM reference
        alpha = np.float32(np.float32(a.qt.global_scale) * np.float32(b.qt.global_scale))
        out = (out * alpha).astype(np.float32)
    return torch.from_numpy(out)
