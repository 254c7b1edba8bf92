"""TE's example mixed-recipe ``qfactory`` functions (TE 2.20.0.dev0 ``pytorch/custom_recipes/
quantizer_factory_zoo.py``): a different recipe per module, tensor type or direction.  Illustrative, as TE
says: not tuned or validated recipes.

Each factory dispatches on the ``QuantizerRole`` exactly as TE's, with fp8sim's quantizers (MXFP8, NVFP4,
identity, current and delayed scaling) and ``HybridQuantizer`` (one quantizer for the rowwise copy, another
for the columnwise one: ``tensor/hybrid_tensor.py``).
"""

from __future__ import annotations

from typing import Any

from ..constants import DType
from .quantizer_factories import mxfp8_factory, nvfp4_factory

__all__ = [
    "high_precision_fwd_mxfp8_bwd_factory",
    "mxfp8_fwd_nvfp4_bwd_factory",
    "nvfp4_1d_weight_factory",
    "mxfp8_fwd_high_precision_bwd_factory",
    "nvfp4_row_scaled_fwd_mxfp8_bwd_factory",
    "nvfp4_row_scaled_fwd_high_precision_bwd_factory",
    "nvfp4_linear_fp8_dpa_factory",
]


def _hybrid(rowwise: Any, columnwise: Any, source: str = "original") -> Any:
    """TE's ``HybridQuantizer(rowwise_quantizer=..., columnwise_quantizer=..., columnwise_source=...)``."""
    from ..tensor.hybrid_tensor import HybridQuantizer

    return HybridQuantizer(rowwise_quantizer=rowwise, columnwise_quantizer=columnwise, columnwise_source=source)


def _linear(role: Any, *tensor_types: str) -> bool:
    return role is not None and role.module_type in ("linear", "grouped_linear") and role.tensor_type in tensor_types


def _identity() -> Any:
    from ..tensor import IdentityQuantizer

    return IdentityQuantizer()


def _plain_nvfp4_quantizer(*, row_scaled_nvfp4: bool = False) -> Any:
    """NVFP4 without RHT, stochastic rounding or 2D tiles."""
    from ..tensor import NVFP4Quantizer

    return NVFP4Quantizer(
        fp4_dtype=DType.kFloat4E2M1,
        with_rht=False,
        with_post_rht_amax=False,
        with_2d_quantization=False,
        stochastic_rounding=False,
        row_scaled_nvfp4=row_scaled_nvfp4,
    )


def high_precision_fwd_mxfp8_bwd_factory(role: Any) -> Any:
    """Linear ``grad_output``: MXFP8; every other slot: Hybrid(rowwise identity, columnwise MXFP8)."""
    if _linear(role, "grad_output"):
        return mxfp8_factory(role)
    return _hybrid(_identity(), mxfp8_factory(role))


def mxfp8_fwd_nvfp4_bwd_factory(role: Any) -> Any:
    """MXFP8 forward, NVFP4 backward: linear ``input`` Hybrid(MXFP8, NVFP4 from the original), ``weight``
    Hybrid(MXFP8, plain NVFP4 from the dequantized rowwise copy), ``grad_output`` NVFP4; else MXFP8."""
    if _linear(role, "input"):
        return _hybrid(mxfp8_factory(role), nvfp4_factory(role), "original")
    if _linear(role, "weight"):
        return _hybrid(mxfp8_factory(role), _plain_nvfp4_quantizer(), "rowwise_dequantized")
    if _linear(role, "grad_output"):
        return nvfp4_factory(role)
    return mxfp8_factory(role)


def nvfp4_1d_weight_factory(role: Any) -> Any:
    """NVFP4 with a 1-D-scaled linear weight (Hybrid of plain NVFP4, columnwise from the dequantized
    rowwise copy); every other slot :func:`nvfp4_factory`."""
    if _linear(role, "weight"):
        return _hybrid(_plain_nvfp4_quantizer(), _plain_nvfp4_quantizer(), "rowwise_dequantized")
    return nvfp4_factory(role)


def mxfp8_fwd_high_precision_bwd_factory(role: Any) -> Any:
    """MXFP8 forward, high-precision backward: linear ``input``/``weight`` Hybrid(MXFP8, identity from the
    dequantized copy), ``grad_output`` identity; else MXFP8."""
    if _linear(role, "input", "weight"):
        return _hybrid(mxfp8_factory(role), _identity(), "rowwise_dequantized")
    if _linear(role, "grad_output"):
        return _identity()
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_mxfp8_bwd_factory(role: Any) -> Any:
    """Row-scaled NVFP4 forward for ``GroupedLinear`` (input row-scaled, weight plain; MXFP8 columnwise from
    the dequantized copy), MXFP8 for everything else."""
    grouped = role is not None and role.module_type == "grouped_linear"
    if grouped and role.tensor_type == "input":
        return _hybrid(_plain_nvfp4_quantizer(row_scaled_nvfp4=True), mxfp8_factory(role), "rowwise_dequantized")
    if grouped and role.tensor_type == "weight":
        return _hybrid(_plain_nvfp4_quantizer(), mxfp8_factory(role), "rowwise_dequantized")
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_high_precision_bwd_factory(role: Any) -> Any:
    """Row-scaled NVFP4 forward, high-precision backward: linear ``input`` / ``weight`` Hybrid(row-scaled /
    plain NVFP4, identity from the dequantized copy), ``grad_output`` identity; else plain NVFP4."""
    if _linear(role, "input"):
        return _hybrid(_plain_nvfp4_quantizer(row_scaled_nvfp4=True), _identity(), "rowwise_dequantized")
    if _linear(role, "weight"):
        return _hybrid(_plain_nvfp4_quantizer(), _identity(), "rowwise_dequantized")
    if _linear(role, "grad_output"):
        return _identity()
    return _plain_nvfp4_quantizer()


def nvfp4_linear_fp8_dpa_factory(role: Any) -> Any:
    """NVFP4 for linear layers, FP8 for ``DotProductAttention`` (use with ``CustomRecipe(fp8_dpa=True)``):
    DPA ``s`` / ``dp`` delayed scaling (HYBRID, history 1, most_recent); other DPA roles and the DPA boundary
    hints (``dpa_output`` / ``dpa_grad_input`` in the name of a role without module type) current scaling,
    E5M2 for backward roles (``do``, ``dp``, ``dqkv``, ``dpa_grad_input``), else E4M3; everything else
    :func:`nvfp4_factory`."""
    from ...recipe import Format
    from ..quantization import DelayedScalingRequest
    from ..tensor import Float8CurrentScalingQuantizer

    dpa = role is not None and role.module_type == "dpa"
    boundary = (
        role is not None and not role.module_type and ("dpa_output" in role.name or "dpa_grad_input" in role.name)
    )
    if dpa and role.tensor_type in ("s", "dp"):
        return DelayedScalingRequest(
            fp8_format=Format.HYBRID, amax_history_len=1, amax_compute_algo="most_recent", reduce_amax=True
        )
    if dpa or boundary:
        bwd = (dpa and role.tensor_type in ("do", "dp", "dqkv")) or (boundary and "dpa_grad_input" in role.name)
        return Float8CurrentScalingQuantizer(fp8_dtype=DType.kFloat8E5M2 if bwd else DType.kFloat8E4M3, device="cuda")
    return nvfp4_factory(role)
