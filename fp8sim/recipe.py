"""TransformerEngine's recipe classes, constructible with no GPU and without TE installed.

Same class and field names, defaults, environment variables and validation messages as
``transformer_engine.common.recipe`` (TE 2.x; spec sections 4.1, 4.8, 5.1-5.4).  Environment-derived
defaults are read once, at import time, as TE does.  TE's ``assert``-based checks raise
:class:`RecipeError`, which is both an ``AssertionError`` (what TE raises) and a ``ValueError``.

Legacy fields still load: ``DelayedScaling(interval=...)`` (TE 1.8-2.1) warns that it is deprecated
and unused, and ``override_linear_precision`` (TE <= 1.13) accepts ``(False, False, False)`` and
``(False, False, True)`` (wgrad in high precision), with a DeprecationWarning since TE 2.0 removed it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from .formats import FloatFormat, get_format

__all__ = [
    "Format",
    "MMParams",
    "QParams",
    "Recipe",
    "RecipeError",
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
    "tensor_format",
]

_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")
_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_4OVER6_ERR_MODES = ("MAE", "MSE")
_ENV_BACKWARD_OVERRIDE = os.getenv("NVTE_BACKWARD_OVERRIDE", None)


class RecipeError(AssertionError, ValueError):
    """A recipe validation failure: TE's assertion message, catchable as either exception."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RecipeError(message)


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(Enum):
    """FP8/FP4 formats of a recipe: E4M3, E5M2, HYBRID (E4M3 forward, E5M2 backward), E2M1."""

    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


def tensor_format(fp8_format: Format, forward: bool) -> FloatFormat:
    """The element format of a forward (input, weight, output) or backward (gradient) tensor:
    E4M3 iff the recipe format is E4M3, or HYBRID and the tensor is a forward one (spec 4.2)."""
    if not isinstance(fp8_format, Format):
        raise TypeError(f"fp8_format must be a recipe.Format, got {fp8_format!r}")
    if fp8_format is Format.E2M1:
        return get_format("e2m1")
    if fp8_format is Format.E4M3 or (fp8_format is Format.HYBRID and forward):
        return get_format("e4m3")
    return get_format("e5m2")


@dataclass(frozen=True)
class MMParams:
    """GEMM options: ``use_split_accumulator=False`` is cuBLASLt FAST_ACCUM=1 (spec 4.7)."""

    use_split_accumulator: bool = True


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of one tensor role."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False


class _OverrideLinearPrecision(NamedTuple):
    fprop: bool = False
    dgrad: bool = False
    wgrad: bool = False


class Recipe:
    """Base class; the classmethods say which family a recipe belongs to, as TE's do."""

    @classmethod
    def nvfp4(cls) -> bool:
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        return False


def _check_common(fp8_format: Any, backward_override: Any) -> None:
    if not isinstance(fp8_format, Format):
        raise TypeError(f"fp8_format must be one of Format.E4M3, Format.HYBRID; got {fp8_format!r}")
    _check(fp8_format != Format.E5M2, "Pure E5M2 training is not supported.")
    _check(
        backward_override in _BACKWARD_OVERRIDES,
        "NVTE_BACKWARD_OVERRIDE must be unset or one of: 'high_precision', 'dequantized'.",
    )


def _check_bool(obj: Any, *names: str) -> None:
    for n in names:
        if not isinstance(getattr(obj, n), bool):
            raise TypeError(f"{n} must be a bool, got {getattr(obj, n)!r}")


@dataclass
class DelayedScaling(Recipe):
    """Delayed scaling: each tensor is cast with the scale computed from the amax history of
    previous steps; ``new_scale = (FP8_MAX / amax) / 2^margin`` (see fp8sim.scaling.delayed)."""

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable[..., Any] = "max"
    scaling_factor_compute_algo: Callable[..., Any] | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE
    # Legacy (TE <= 2.1 / <= 1.13); accepted so that old configs load.
    interval: int = -1
    override_linear_precision: tuple[bool, bool, bool] = field(default_factory=_OverrideLinearPrecision)

    def __post_init__(self) -> None:
        _check_common(self.fp8_format, self.backward_override)
        _check(self.backward_override is None, "Delayed scaling only supports backward_override=None.")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int):
            raise TypeError(f"margin must be an int, got {self.margin!r}")
        if isinstance(self.amax_history_len, bool) or not isinstance(self.amax_history_len, int):
            raise TypeError(f"amax_history_len must be an int, got {self.amax_history_len!r}")
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")
        algo = self.amax_compute_algo
        if not (callable(algo) or algo in ("max", "most_recent")):
            raise ValueError(f"amax_compute_algo must be 'max', 'most_recent' or a callable; got {algo!r}")
        sf = self.scaling_factor_compute_algo
        if sf is not None and not callable(sf):
            raise ValueError(f"scaling_factor_compute_algo must be None or a callable; got {sf!r}")
        _check_bool(self, "reduce_amax", "fp8_dpa", "fp8_mha")
        olp = _OverrideLinearPrecision(*self.override_linear_precision)
        _check(olp in ((False, False, False), (False, False, True)), "Only wgrad GEMM override is currently supported.")
        self.override_linear_precision = olp
        if olp.wgrad:
            warnings.warn(
                "`override_linear_precision` was removed in TransformerEngine 2.0; fp8sim honours "
                "(False, False, True) by running the wgrad GEMM in high precision, as TE 1.x did.",
                DeprecationWarning,
                stacklevel=3,
            )
        if self.interval >= 0:
            warnings.warn(
                "`interval` argument is deprecated and unused. It will be removed in an upcoming release.",
                DeprecationWarning,
                stacklevel=3,
            )

    def fp8_max(self, forward: bool) -> float:
        """FP8_MAX of the forward or backward tensors (448 or 57344)."""
        return tensor_format(self.fp8_format, forward).max


_CS_POW2 = os.getenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0") == "1"


@dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor current scaling: each tensor's own amax gives its scale (spec 5.1).  The
    ``fp8_quant_*`` QParams are class attributes fixed from the environment at import, as in TE."""

    use_power_2_scales: bool = _CS_POW2
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE

    fp8_quant_fwd_inp = QParams(power_2_scale=_CS_POW2, amax_epsilon=0.0)
    fp8_quant_fwd_weight = QParams(power_2_scale=_CS_POW2, amax_epsilon=0.0)
    fp8_quant_bwd_grad = QParams(power_2_scale=_CS_POW2, amax_epsilon=0.0)

    def __post_init__(self) -> None:
        _check_common(self.fp8_format, self.backward_override)
        _check_bool(self, "use_power_2_scales", "fp8_dpa", "fp8_mha")


@dataclass
class MXFP8BlockScaling(Recipe):
    """MXFP8: blocks of 32 with E8M0 scales (RCEIL), rowwise and columnwise copies each from the
    high-precision input (spec 5.2).  ``margin`` exists and is unused, as in TE."""

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE

    def __post_init__(self) -> None:
        _check_common(self.fp8_format, self.backward_override)


_BS_F32 = os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") == "1"


@dataclass
class Float8BlockScaling(Recipe):
    """FP8 block scaling (DeepSeek-style): 1x128 (dim 1) or 128x128 (dim 2) blocks, pow2 scales
    unless NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 at import (spec 5.3: the ``use_f32_scales`` field
    does not reach the quantizers, whose QParams are fixed at import)."""

    use_f32_scales: bool = _BS_F32
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE

    fp8_quant_fwd_inp = QParams(power_2_scale=not _BS_F32, amax_epsilon=0.0)
    fp8_quant_fwd_weight = QParams(power_2_scale=not _BS_F32, amax_epsilon=0.0)
    fp8_quant_bwd_grad = QParams(power_2_scale=not _BS_F32, amax_epsilon=0.0)

    def __post_init__(self) -> None:
        for name in ("x", "w", "grad"):
            _check(getattr(self, f"{name}_block_scaling_dim") in (1, 2), f"Only 1D or 2D blocks supported for {name}")
        dims = (self.x_block_scaling_dim, self.w_block_scaling_dim, self.grad_block_scaling_dim)
        for i in range(3):
            for j in range(i + 1, 3):
                _check(not (dims[i] == 2 and dims[j] == 2), "2D by 2D block gemm not supported.")
        for gemm in ("fprop", "dgrad", "wgrad"):
            _check(getattr(self, f"fp8_gemm_{gemm}").use_split_accumulator, f"Split accumulator required for {gemm}.")
        _check(not self.fp8_dpa and not self.fp8_mha, "FP8 attention is not supported for Float8BlockScaling.")
        _check_common(self.fp8_format, self.backward_override)


def _env_flag(name: str) -> bool:
    return os.getenv(name, "0") == "1"


@dataclass
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 elements, E4M3 scales per 16, an fp32 global scale; RHT for inputs and grads,
    stochastic rounding for grads, 16x16 weight tiles (spec 5.4).  Per-role QParams are set in
    ``__post_init__`` from the ``disable_*`` flags, as in TE."""

    disable_rht: bool = _env_flag("NVTE_NVFP4_DISABLE_RHT")
    disable_stochastic_rounding: bool = _env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")
    disable_2d_quantization: bool = _env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")
    row_scaled_activation: bool = _env_flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION")
    nvfp4_4over6: str = os.getenv("NVTE_NVFP4_4OVER6", "none")
    nvfp4_4over6_e4m3_use_256: str = os.getenv("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all")
    nvfp4_4over6_err_mode: str = os.getenv("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE").upper()
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE

    def __post_init__(self) -> None:
        _check(self.fp4_format == Format.E2M1, "Only E2M1 is supported for NVFP4 scaling")
        _check(self.fp8_format == Format.E4M3, "Only E4M3 is supported for NVFP4 scaling")
        _check(
            self.backward_override in _BACKWARD_OVERRIDES,
            "NVTE_BACKWARD_OVERRIDE must be unset or one of: 'high_precision', 'dequantized'.",
        )
        _check(
            self.nvfp4_4over6 in _4OVER6_SCOPES,
            "NVTE_NVFP4_4OVER6 must be one of: 'none', 'weights', 'activations', 'all'.",
        )
        _check(
            self.nvfp4_4over6_e4m3_use_256 in _4OVER6_SCOPES,
            "NVTE_NVFP4_4OVER6_E4M3_USE_256 must be one of: 'none', 'weights', 'activations', 'all'.",
        )
        _check(
            self.nvfp4_4over6_err_mode in _4OVER6_ERR_MODES, "NVTE_NVFP4_4OVER6_ERR_MODE must be one of: 'MAE', 'MSE'."
        )
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = QParams(
            random_hadamard_transform=not self.disable_rht,
            stochastic_rounding=not self.disable_stochastic_rounding,
        )
