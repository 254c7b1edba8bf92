"""Block-scale layouts of ``scaled_mm`` whose scales enter the MMA: the scale format and block size of each.

``mx`` (E8M0 per 32) and ``nvfp4`` (UE4M3 per 16) run the Blackwell block-scale instruction models; the NVFP4
variants (:mod:`fp8sim.scaling.nvfp4_variants`) ``nvfp4_ue5m3`` (UE5M3 per 16, TE PR#3325 on Rubin) and
``nvfp4_e4m3x32`` (E4M3 per 32, Triton PR#10941's VEC_SIZE=32) have no instruction model yet: they run the
``exact`` and ``dequantized_fp32`` accumulators only.  ``block_scale_format`` selects a variant, since uint8
scale codes of the same shape read either way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BLOCK_LAYOUTS", "BLOCK_SCALE_FORMATS", "resolve_block_layout", "check_variant_accumulator"]

BLOCK_LAYOUTS: dict[str, tuple[str, int]] = {
    "mx": ("e8m0", 32),
    "nvfp4": ("e4m3", 16),
    "nvfp4_ue5m3": ("ue5m3", 16),
    "nvfp4_e4m3x32": ("e4m3", 32),
}
BLOCK_SCALE_FORMATS = ("e8m0", "e4m3", "ue5m3")


def resolve_block_layout(
    layout: str, block_scale_format: Any, sa: Any, sb: Any, m: int, k: int, n: int, fp4: bool
) -> str:
    """The layout the scales are read as: the shape-inferred ``layout`` when ``block_scale_format`` is None,
    else the layout whose scale format it names and whose block size the scale shapes fit."""
    if block_scale_format is None:
        return layout
    if not isinstance(block_scale_format, str) or block_scale_format not in BLOCK_SCALE_FORMATS:
        raise ValueError(
            f"block_scale_format must be None or one of {', '.join(BLOCK_SCALE_FORMATS)}; "
            f"got {block_scale_format!r:.60}"
        )
    for name, (sf, bs) in BLOCK_LAYOUTS.items():
        kb = -(-k // bs)
        if sf == block_scale_format and (fp4 or name == "mx") and sa.shape == (m, kb) and sb.shape == (kb, n):
            if sa.dtype.kind == "u" and sb.dtype.kind == "u":
                return name
    raise ValueError(
        f"block_scale_format={block_scale_format!r} takes uint8 scale codes shaped (M, K/B) and (K/B, N) with "
        f"B = {' or '.join(str(bs) for sf, bs in BLOCK_LAYOUTS.values() if sf == block_scale_format)}"
        f"{'' if block_scale_format == 'e8m0' else ' and E2M1 operands'}; got scales {tuple(sa.shape)} "
        f"{sa.dtype} and {tuple(sb.shape)} {sb.dtype} for M={m} K={k} N={n}"
    )


def check_variant_accumulator(layout: str, kind: str) -> None:
    """Refuse a tensor-core accumulator for a layout no instruction model covers."""
    if layout in ("nvfp4_ue5m3", "nvfp4_e4m3x32") and kind == "tensor_core":
        raise NotImplementedError(
            f"{layout} block scales have no tensor-core instruction model (Rubin's block-scaled MMA is not "
            "modelled); use accumulator='exact' or 'dequantized_fp32'"
        )
