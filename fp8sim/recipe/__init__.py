"""TransformerEngine's recipe classes, constructible with no GPU and without TE installed.

Same class and field names, defaults, environment variables, validation messages and ``repr`` as
``transformer_engine.common.recipe`` (TE 2.x at d0067d0; spec sections 4.1, 4.8, 5.1-5.4).
Environment-derived defaults are read once, at import time, as TE does.

TE's recipes are pydantic dataclasses, so fields are coerced as pydantic's lax mode does
(``margin="2"`` -> 2, ``amax_history_len=16.0`` -> 16, ``reduce_amax=1`` -> True) and a value it
cannot coerce raises :class:`RecipeValidationError` (a ``ValueError``, as pydantic's
``ValidationError`` is).  TE's ``assert``-based checks raise :class:`RecipeError`, both an
``AssertionError`` (what TE raises) and a ``ValueError``.  Keyword arguments that are not fields are
ignored, as pydantic ignores them, with an ``UpstreamQuirkWarning``: the legacy ``interval``
(TE 1.8-2.1) and ``override_linear_precision`` (TE <= 1.13) are accepted by every recipe and have
no effect (spec section 0, 4.8).  fp8sim refuses more than TE where TE would fail later: a
``margin`` outside [-127, 63] and a negative ``amax_history_len`` (``0`` is accepted, as TE accepts
it; a module then fails on its first FP8 step, as TE's does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from ..formats import FloatFormat, get_format
from ._fields import RecipeValidationError, te_dataclass, validate_fields

__all__ = [
    "Format",
    "MMParams",
    "QParams",
    "Recipe",
    "RecipeError",
    "RecipeValidationError",
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
    "CustomRecipe",
    "tensor_format",
    "MARGIN_RANGE",
]

_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")
_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_4OVER6_ERR_MODES = ("MAE", "MSE")
NVFP4_VARIANTS = ("e4m3x16", "ue5m3x16", "e4m3x32")
"""Values of the fp8sim extension field ``NVFP4BlockScaling.fp8sim_nvfp4_variant`` (``scaling.nvfp4_variants``)."""
_ENV_BACKWARD_OVERRIDE = os.getenv("NVTE_BACKWARD_OVERRIDE", None)
MARGIN_RANGE = (-127, 63)
"""Margins fp8sim accepts.  TE's fused update computes ``fp8_max * powf(2, -margin)``: 0 for huge margins
(scale 0, NaN outputs), Inf below -127; its unfused update divides a tensor by the Python int
``2**margin``, which torch 2.13 refuses (OverflowError) from margin 64 on."""


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


def _fmt_name(fmt: Format) -> str:
    return str(fmt).split(".")[1]


@te_dataclass(frozen=True)
class MMParams:
    """GEMM options: ``use_split_accumulator=False`` is cuBLASLt FAST_ACCUM=1 (spec 4.7)."""

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        validate_fields(self)

    def __repr__(self) -> str:
        return f"MMParams(use_split_accumulator={self.use_split_accumulator})"


@te_dataclass(frozen=True)
class QParams:
    """Quantization parameters of one tensor role."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self) -> None:
        validate_fields(self)

    def __repr__(self) -> str:  # TE's spelling, "Qparams" and one field per line
        return (
            f"Qparams(\npower_2_scale={self.power_2_scale},\namax_epsilon={self.amax_epsilon},\n"
            f"random_hadamard_transform={self.random_hadamard_transform},\n"
            f"stochastic_rounding={self.stochastic_rounding},\nfp4_2d_quantization={self.fp4_2d_quantization}\n)"
        )


_TYPES = {"Format": Format, "MMParams": MMParams}


class Recipe:
    """Base class; the classmethods say which family a recipe belongs to, as TE's do.  ``repr`` is
    TE's: ``recipe_type=<class>, <field>=<value>, ...``."""

    def _make_repr(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self._make_repr()

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
        return issubclass(cls, CustomRecipe)


def _check_common(recipe: Any) -> None:
    """Field coercion (pydantic), then TE's shared assertions."""
    validate_fields(recipe, _TYPES)
    _check(recipe.fp8_format != Format.E5M2, "Pure E5M2 training is not supported.")
    _check_backward_override(recipe)


def _check_backward_override(recipe: Any) -> None:
    _check(
        recipe.backward_override in _BACKWARD_OVERRIDES,
        "NVTE_BACKWARD_OVERRIDE must be unset or one of: 'high_precision', 'dequantized'.",
    )


class _OverrideLinearPrecision(NamedTuple):
    fprop: bool = False
    dgrad: bool = False
    wgrad: bool = False


@te_dataclass
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

    # Not a field (TE 2.x has none): always "no override", for code that still reads it.
    override_linear_precision = _OverrideLinearPrecision()

    def __post_init__(self) -> None:
        _check_common(self)
        _check(self.backward_override is None, "Delayed scaling only supports backward_override=None.")
        lo, hi = MARGIN_RANGE
        if not lo <= self.margin <= hi:
            raise RecipeValidationError(
                f"margin must be an int in [{lo}, {hi}] (TE's scale update fails outside it), got {self.margin}"
            )
        if self.amax_history_len < 0:  # TE fails later, allocating torch.zeros(amax_history_len, n)
            raise RecipeValidationError(f"amax_history_len must be >= 0, got {self.amax_history_len}")

    def fp8_max(self, forward: bool) -> float:
        """FP8_MAX of the forward or backward tensors (448 or 57344)."""
        return tensor_format(self.fp8_format, forward).max

    def _make_repr(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, margin={self.margin}, format={_fmt_name(self.fp8_format)}, "
            f"amax_history_len={self.amax_history_len}, reduce_amax={self.reduce_amax}, "
            f"fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}, backward_override={self.backward_override}"
        )


_CS_POW2 = os.getenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0") == "1"


@te_dataclass
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
        _check_common(self)

    def _make_repr(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, format={_fmt_name(self.fp8_format)}, "
            f"fp8_quant_fwd_inp={self.fp8_quant_fwd_inp}, fp8_quant_fwd_weight={self.fp8_quant_fwd_weight}, "
            f"fp8_quant_bwd_grad={self.fp8_quant_bwd_grad}, fp8_gemm_fprop={self.fp8_gemm_fprop}, "
            f"fp8_gemm_dgrad={self.fp8_gemm_dgrad}, fp8_gemm_wgrad={self.fp8_gemm_wgrad}, "
            f"fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}, backward_override={self.backward_override}"
        )


@te_dataclass
class MXFP8BlockScaling(Recipe):
    """MXFP8: blocks of 32 with E8M0 scales (RCEIL), rowwise and columnwise copies each from the
    high-precision input (spec 5.2).  ``margin`` exists and is unused, as in TE.
    ``enable_2d_quantization``: weights get one scale per 32x32 tile."""

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE
    enable_2d_quantization: bool = False

    def __post_init__(self) -> None:
        _check_common(self)

    def _make_repr(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, margin={self.margin}, format={_fmt_name(self.fp8_format)}, "
            f"backward_override={self.backward_override}, enable_2d_quantization={self.enable_2d_quantization}"
        )


_BS_F32 = os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") == "1"


@te_dataclass
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
        validate_fields(self, _TYPES)
        for name in ("x", "w", "grad"):
            _check(getattr(self, f"{name}_block_scaling_dim") in (1, 2), f"Only 1D or 2D blocks supported for {name}")
        dims = (self.x_block_scaling_dim, self.w_block_scaling_dim, self.grad_block_scaling_dim)
        for i in range(3):
            for j in range(i + 1, 3):
                _check(not (dims[i] == 2 and dims[j] == 2), "2D by 2D block gemm not supported.")
        for gemm in ("fprop", "dgrad", "wgrad"):
            _check(getattr(self, f"fp8_gemm_{gemm}").use_split_accumulator, f"Split accumulator required for {gemm}.")
        _check(not self.fp8_dpa and not self.fp8_mha, "FP8 attention is not supported for Float8BlockScaling.")
        _check_common(self)

    def _make_repr(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, format={_fmt_name(self.fp8_format)}, "
            f"fp8_quant_fwd_inp={self.fp8_quant_fwd_inp}, fp8_quant_fwd_weight={self.fp8_quant_fwd_weight}, "
            f"fp8_quant_bwd_grad={self.fp8_quant_bwd_grad}, x_block_scaling_dim={self.x_block_scaling_dim}, "
            f"w_block_scaling_dim={self.w_block_scaling_dim}, grad_block_scaling_dim={self.grad_block_scaling_dim}, "
            f"fp8_gemm_fprop={self.fp8_gemm_fprop}, fp8_gemm_dgrad={self.fp8_gemm_dgrad}, "
            f"fp8_gemm_wgrad={self.fp8_gemm_wgrad}, fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}, "
            f"backward_override={self.backward_override}"
        )


def _env_flag(name: str) -> bool:
    return os.getenv(name, "0") == "1"


@te_dataclass
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 elements, E4M3 scales per 16, an fp32 global scale; RHT for inputs and grads,
    stochastic rounding for grads, 16x16 weight tiles (spec 5.4).  Per-role QParams are set in
    ``__post_init__`` from the ``disable_*`` flags, as in TE.

    ``fp8sim_nvfp4_variant`` (an fp8sim extension, not a TE field): ``"e4m3x16"`` (TE's NVFP4, default),
    ``"ue5m3x16"`` (UE5M3 scales per 16, as TE PR#3325's ``fp8_format=Format.UE5M3`` prototype) or
    ``"e4m3x32"`` (E4M3 scales per 32, Triton's VEC_SIZE=32; needs ``disable_2d_quantization=True``).  The
    variants run in the modules' GEMMs; 4over6 and row-scaled activations refuse them, as do TE's quantizer
    objects (te.ops, FP8 primary weights).  ``repr`` names the field only when it is not the default."""

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
    fp8sim_nvfp4_variant: str = "e4m3x16"

    def __post_init__(self) -> None:
        validate_fields(self, _TYPES)
        _check_nvfp4_variant(self)
        _check(self.fp4_format == Format.E2M1, "Only E2M1 is supported for NVFP4 scaling")
        _check(self.fp8_format == Format.E4M3, "Only E4M3 is supported for NVFP4 scaling")
        _check_backward_override(self)
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

    def _make_repr(self) -> str:  # TE's ends with ", "
        return (
            f"recipe_type={type(self).__name__}, fp4_format={_fmt_name(self.fp4_format)}, "
            f"fp8_format={_fmt_name(self.fp8_format)}, fp8_dpa={self.fp8_dpa}, fp8_mha={self.fp8_mha}, "
            f"backward_override={self.backward_override}, row_scaled_activation={self.row_scaled_activation}, "
            f"nvfp4_4over6={self.nvfp4_4over6}, nvfp4_4over6_e4m3_use_256={self.nvfp4_4over6_e4m3_use_256}, "
            f"nvfp4_4over6_err_mode={self.nvfp4_4over6_err_mode}, fp4_quant_fwd_inp={self.fp4_quant_fwd_inp}, "
            f"fp4_quant_fwd_weight={self.fp4_quant_fwd_weight}, fp4_quant_bwd_grad={self.fp4_quant_bwd_grad}, "
        ) + ("" if self.fp8sim_nvfp4_variant == "e4m3x16" else f"fp8sim_nvfp4_variant={self.fp8sim_nvfp4_variant}, ")


def _check_nvfp4_variant(r: Any) -> None:
    """The fp8sim extension field: a known variant, and none of the options the variants do not combine with."""
    v = r.fp8sim_nvfp4_variant
    if not isinstance(v, str) or v not in NVFP4_VARIANTS:
        raise RecipeValidationError(f"fp8sim_nvfp4_variant must be one of {', '.join(NVFP4_VARIANTS)}; got {v!r}")
    if v == "e4m3x16":
        return
    scale = "UE5M3 scales" if v == "ue5m3x16" else "E4M3 scales per 32"
    _check(r.nvfp4_4over6 == "none", f"NVFP4 4over6 quantization is incompatible with {scale}.")
    _check(not r.row_scaled_activation, f"fp8sim_nvfp4_variant={v!r}: row-scaled NVFP4 is not emulated with {scale}")
    _check(
        v != "e4m3x32" or r.disable_2d_quantization,
        "fp8sim_nvfp4_variant='e4m3x32' has no 16x16 weight tiles: pass disable_2d_quantization=True",
    )


@te_dataclass
class CustomRecipe(Recipe):
    """A recipe whose quantizers come from ``qfactory(role) -> Quantizer | QuantizerRequest``, called
    once per tensor slot with a ``QuantizerRole(module_type, tensor_type, name)`` (TE's contract;
    see ``fp8sim.pytorch.tensor.custom_recipe_quantizers``).  ``fp8_format`` only names the dtypes TE
    internals read; ``quantization_alignment`` must be positive."""

    qfactory: Callable[..., Any]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = _ENV_BACKWARD_OVERRIDE
    quantization_alignment: int = 128

    def __post_init__(self) -> None:
        validate_fields(self, _TYPES)
        _check_backward_override(self)
        if self.quantization_alignment <= 0:
            raise ValueError("CustomRecipe quantization_alignment must be positive.")

    def _make_repr(self) -> str:
        return (
            f"recipe_type={type(self).__name__}, qfactory={self.qfactory}, "
            f"backward_override={self.backward_override}, quantization_alignment={self.quantization_alignment}"
        )
