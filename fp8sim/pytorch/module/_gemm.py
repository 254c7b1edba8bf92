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

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...gemm._exact import fma_f32
from ...recipe import Float8BlockScaling, Recipe
from ._operands import Operand

__all__ = ["gemm", "GemmSite", "out_name"]

# TE module constants for recipes without fp8_gemm_* fields (spec 4.7): fprop fast, dgrad/wgrad split
_SPLIT = {"fprop": False, "dgrad": True, "wgrad": True}
_OUT_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class GemmSite:
    """Which GEMM of which module this is (``gemm``: the module's GEMM name, e.g. "fc1", "gemm0")."""

    module: Any
    gemm: str = "gemm"

    def label(self) -> str:
        """TE's ``name=`` of the module where it has one, else its class; plus the GEMM of a multi-GEMM module."""
        m = self.module
        base = getattr(m, "name", None) or type(m).__name__
        return base if self.gemm == "gemm" else f"{base}.{self.gemm}"


def out_name(dtype: Any) -> str:
    """The output dtype name a profile's split decision is keyed by (a format name for FP8 outputs)."""
    if isinstance(dtype, str):
        return dtype
    if dtype is None:
        return "float32"
    if dtype not in _OUT_NAMES:
        raise ValueError(f"GEMM output dtype must be float32, bfloat16, float16 or an FP8 format; got {dtype}")
    return _OUT_NAMES[dtype]


def _split_for(recipe: Recipe, which: str) -> bool:
    params = getattr(recipe, f"fp8_gemm_{which}", None)
    if params is not None:
        return bool(params.use_split_accumulator)
    if isinstance(recipe, Float8BlockScaling):
        return True
    return _SPLIT[which]


def _preset(accumulator: str, recipe: Recipe, which: str) -> str:
    if accumulator in ("hopper", "ada", "blackwell"):
        split = _split_for(recipe, which)
        if accumulator == "blackwell":
            return "blackwell_split" if split else "blackwell"
        return f"{accumulator}_{'split' if split else 'fast'}"
    return accumulator


def _what(site: GemmSite | None, which: str) -> str:
    return f"the {which} GEMM" + ("" if site is None else f" of {site.label()!r}")


def _scaling(op: Operand) -> str:
    if op.vals is not None:
        return "tensorwise"
    qt = op.qt
    block = getattr(qt, "block", None)
    return f"{qt.fmt.name} {'x'.join(str(b) for b in block)} blocks" if block is not None else "block-scaled"


def _profile_choice(prof: Any, a: Operand, b: Operand, m: int, n: int, k: int, out: str, fast: bool, what: str) -> Any:
    """The profile's split decision for this GEMM: a split given with ``with_splits``, else its table for
    per-tensor scales (block-scaled GEMMs need a given split: no block-scaled cuBLASLt call was recorded)."""
    from ...gemm.profiles import SplitChoice, SplitKUnknownError

    for key in ((m, n, k, out, fast), (m, n, k)):
        if key in prof.splits:
            s, scheme = prof.splits[key]
            return SplitChoice(s, scheme, "override", "given with DeviceProfile.with_splits")
    if os.environ.get("NVTE_EXT_MARGIN_SM") is not None:
        # TE csrc/extensions/gemm.cpp: math SMs = sm_count - NVTE_EXT_MARGIN_SM (default sm_count: 0, no target)
        # becomes CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, which changes cuBLASLt's choice; none was recorded with one
        raise SplitKUnknownError(
            f"NVTE_EXT_MARGIN_SM is set: TE then asks cuBLASLt for an SM-count target, and profile {prof.name!r} "
            f"recorded no decision with one ({what}: M={m} N={n} K={k}); unset NVTE_EXT_MARGIN_SM or give the "
            "split with with_splits"
        )
    if a.vals is not None and b.vals is not None:
        return prof.decide(m, n, k, out, fast, a.fmt.name, b.fmt.name, what=what)
    raise SplitKUnknownError(
        f"profile {prof.name!r} records cuBLASLt's split-K for per-tensor scaled FP8 GEMMs only; {what} has "
        f"{_scaling(a)} x {_scaling(b)} scales (M={m} N={n} K={k}, -> {out}, use_fast_accum={fast}). Ways out: "
        f"accumulator=get_profile({prof.name!r}).with_splits({{({m}, {n}, {k}): (1, 'none')}}) if your GPU does "
        "not split it, or an instruction preset"
    )


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
) -> torch.Tensor:
    """``a @ b`` (float32 result, the scales applied; the bias and the output rounding are the caller's).
    ``which``: "fprop", "dgrad" or "wgrad"; ``out_dtype``: the dtype TE's GEMM writes (a profile's split
    decision depends on it); ``site``: the module GEMM, for messages.  See the module docstring for
    ``accumulator``.  ``addend``: ``C`` of an accumulating GEMM (TE's ``accumulate=True``, beta = 1: wgrad
    into ``main_grad``), float32; cuBLASLt's epilogue ``alpha * acc + beta * C`` is one float32 FMA, so with
    an accumulator (not None) and per-tensor scales the result is ``fma(acc, fl32(sa * sb), C)``, rounded
    once; the default path and block scales add it after (two roundings)."""
    per_tensor = a.vals is not None and b.vals is not None
    if accumulator is None:
        if per_tensor:
            alpha = torch.tensor(np.float32(a.scale_inv) * np.float32(b.scale_inv), dtype=torch.float32)
            out = torch.matmul(a.vals, b.vals) * alpha
        else:
            out = torch.matmul(a.dq, b.dq)
        return out if addend is None else out + addend
    from ...gemm import scaled_mm
    from ...gemm.profiles import get_profile, is_profile

    split_k, epilogue = None, "alpha"
    if is_profile(accumulator):
        prof = get_profile(accumulator)
        fast = not _split_for(recipe, which)
        m, k = (a.codes.shape if per_tensor else a.dq.shape)[-2:]
        n = (b.codes if per_tensor else b.dq).shape[-1]
        choice = _profile_choice(prof, a, b, m, n, k, out_name(out_dtype), fast, _what(site, which))
        preset, split_k, epilogue = prof.accumulator_for(fast), choice.split_k, prof.epilogue
    else:
        preset = _preset(accumulator, recipe, which)
    if not per_tensor:
        if split_k is not None and split_k[0] > 1:
            raise ValueError(f"split_k applies to per-tensor scaled GEMMs; {_what(site, which)} is block-scaled")
        out = _block_gemm(a, b, recipe, preset)
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


def _block_gemm(a: Operand, b: Operand, recipe: Recipe, preset: str) -> torch.Tensor:
    """Block-scaled GEMM through ``fp8sim.gemm.scaled_mm``: MX (E8M0 per 32), 1x128/128x128 (float32
    scale_inv per block) and NVFP4 (UE4M3 per 16, the global scales applied after the sum)."""
    from ...gemm import scaled_mm

    ac, sa = _codes_and_scales(a)
    bc, sb = _codes_and_scales(b)
    out = scaled_mm(
        ac, bc, sa, sb, out_dtype="float32", accumulator=preset, a_format=a.fmt, b_format=b.fmt, strict=False
    )
    if a.qt.global_scale is not None:  # NVFP4: the per-tensor factors after the sum, as TE's GEMM reference
        alpha = np.float32(np.float32(a.qt.global_scale) * np.float32(b.qt.global_scale))
        out = (out * alpha).astype(np.float32)
    return torch.from_numpy(out)
