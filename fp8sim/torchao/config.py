"""torchao float8 training configuration (spec 6.1), with torchao 0.18's field names, defaults and messages.

``Float8LinearConfig.__post_init__`` does what torchao's does, quirks included: it fills the three
``*_for_grad_*`` configs from their base configs, and it fills ``target_dtype=None`` of the
operands' ``CastConfig`` objects *in place* (input and weight e4m3, grad_output e5m2), so a default
``CastConfig`` instance shared between configs carries the dtype it was first given.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import torch

__all__ = [
    "ScalingType",
    "ScalingGranularity",
    "CastConfig",
    "Float8GemmConfig",
    "Float8LinearRecipeName",
    "Float8LinearConfig",
    "e4m3_dtype",
    "e5m2_dtype",
]

logger = logging.getLogger(__name__)


def _check(ok: bool, message: str) -> None:
    """torchao's ``assert ok, message``, kept under ``python -O`` and pytest's assertion rewriting."""
    if not ok:
        raise AssertionError(message)


def _is_mi300() -> bool:
    """torchao's ``is_MI300``: a ROCm build on a gfx940/941/942 device."""
    if not (torch.version.hip and torch.cuda.is_available()):
        return False
    arch = torch.cuda.get_device_properties(0).gcnArchName
    return any(a in arch for a in ("gfx940", "gfx941", "gfx942"))


# torchao's Float8TypeConfig: the OCP pair, or the fnuz pair on MI300.
e4m3_dtype: torch.dtype = torch.float8_e4m3fnuz if _is_mi300() else torch.float8_e4m3fn
e5m2_dtype: torch.dtype = torch.float8_e5m2fnuz if _is_mi300() else torch.float8_e5m2


class ScalingType(enum.Enum):
    """``DYNAMIC``: scale from the tensor's current amax; ``DISABLED``: keep the operand in high precision."""

    DYNAMIC = "dynamic"
    DISABLED = "disabled"

    def short_str(self) -> str:
        return "dyn" if self is ScalingType.DYNAMIC else "dis"


class ScalingGranularity(enum.Enum):
    """``TENSORWISE``: one scale per tensor; ``AXISWISE``: one scale per slice along the GEMM's reduction dim."""

    TENSORWISE = "tensorwise"
    AXISWISE = "axiswise"

    def short_str(self) -> str:
        return "ten" if self is ScalingGranularity.TENSORWISE else "axs"


@dataclass(frozen=True)
class CastConfig:
    """How one operand is cast to float8; ``target_dtype=None`` is filled in by :class:`Float8LinearConfig`."""

    scaling_type: ScalingType = ScalingType.DYNAMIC
    scaling_granularity: ScalingGranularity = ScalingGranularity.TENSORWISE
    target_dtype: torch.dtype | None = None

    def short_str(self) -> str:
        dtype = {e4m3_dtype: "e4m3", e5m2_dtype: "e5m2"}[self.target_dtype]
        return f"{self.scaling_type.short_str()}_{self.scaling_granularity.short_str()}_{dtype}"

    def __post_init__(self) -> None:
        if self.scaling_granularity is ScalingGranularity.AXISWISE:
            _check(
                self.scaling_type is ScalingType.DYNAMIC,
                "only dynamic scaling type is supported for axiswise scaling granularity",
            )
        dt = self.target_dtype
        _check(dt is None or (dt.is_floating_point and dt.itemsize == 1), "must specify a 8-bit floating-point dtype")


@dataclass(frozen=True)
class Float8GemmConfig:
    """One float8 GEMM; ``use_fast_accum`` is cuBLAS FAST_ACCUM (ignored by torchao's emulation)."""

    use_fast_accum: bool = False


class Float8LinearRecipeName(enum.Enum):
    """Named recipes: ``TENSORWISE`` (default config), ``ROWWISE`` (axiswise e4m3 everywhere, pow2 scales),
    ``ROWWISE_WITH_GW_HP`` (rowwise, grad_input weight tensorwise, grad_weight in high precision)."""

    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"
    ROWWISE_WITH_GW_HP = "rowwise_with_gw_hp"


@dataclass(frozen=True)
class Float8LinearConfig:
    """Float8 training of one ``nn.Linear``: a cast config per operand and use, a GEMM config per GEMM.

    ``cast_config_input`` / ``_weight`` / ``_grad_output`` serve both GEMMs an operand enters unless
    the matching ``*_for_grad_weight`` / ``*_for_grad_input`` / ``*_for_grad_weight`` config is given.
    ``force_recompute_fp8_weight_in_bwd`` is a deprecated no-op (it logs a warning).
    """

    cast_config_input: CastConfig = CastConfig()
    cast_config_input_for_grad_weight: CastConfig | None = None
    cast_config_weight: CastConfig = CastConfig()
    cast_config_weight_for_grad_input: CastConfig | None = None
    cast_config_grad_output: CastConfig = CastConfig()
    cast_config_grad_output_for_grad_weight: CastConfig | None = None
    gemm_config_output: Float8GemmConfig = Float8GemmConfig(use_fast_accum=True)
    gemm_config_grad_input: Float8GemmConfig = Float8GemmConfig()
    gemm_config_grad_weight: Float8GemmConfig = Float8GemmConfig()
    enable_fsdp_float8_all_gather: bool = False
    pad_inner_dim: bool = False
    emulate: bool = False
    force_recompute_fp8_weight_in_bwd: bool = False
    round_scales_to_power_of_2: bool = False

    def __post_init__(self) -> None:
        fill = object.__setattr__  # frozen after __post_init__, as torchao
        if self.cast_config_input_for_grad_weight is None:
            fill(self, "cast_config_input_for_grad_weight", self.cast_config_input)
        if self.cast_config_weight_for_grad_input is None:
            fill(self, "cast_config_weight_for_grad_input", self.cast_config_weight)
        if self.cast_config_grad_output_for_grad_weight is None:
            fill(self, "cast_config_grad_output_for_grad_weight", self.cast_config_grad_output)

        if self.cast_config_weight.scaling_granularity != ScalingGranularity.TENSORWISE:
            _check(
                not self.enable_fsdp_float8_all_gather,
                "enable_fsdp_float8_all_gather only supports tensorwise scaling granularity, "
                f"got {self.cast_config_weight.scaling_granularity}",
            )

        cc_i, cc_w, cc_go = self.cast_config_input, self.cast_config_weight, self.cast_config_grad_output
        cc_i_gw = self.cast_config_input_for_grad_weight
        cc_w_gi = self.cast_config_weight_for_grad_input
        cc_go_gw = self.cast_config_grad_output_for_grad_weight
        for cc1, cc2, gemm_name in (
            (cc_i, cc_w, "output"),
            (cc_go, cc_w_gi, "grad_input"),
            (cc_i_gw, cc_go_gw, "grad_weight"),
        ):
            disabled_1 = cc1.scaling_type is ScalingType.DISABLED
            disabled_2 = cc2.scaling_type is ScalingType.DISABLED
            _check(disabled_1 == disabled_2, f"incompatible operand precision for {gemm_name}")

        for cc1, cc2, operand_name, default_dtype in (
            (cc_i, cc_i_gw, "input", e4m3_dtype),
            (cc_w, cc_w_gi, "weight", e4m3_dtype),
            (cc_go, cc_go_gw, "grad_output", e5m2_dtype),
        ):
            if cc1.target_dtype is None:
                fill(cc1, "target_dtype", default_dtype)
            if cc2.target_dtype is None:
                fill(cc2, "target_dtype", default_dtype)
            _check(
                cc1.target_dtype == cc2.target_dtype,
                f"{operand_name} must be cast to the same dtype in both matmuls it's used in",
            )

        if self.force_recompute_fp8_weight_in_bwd:
            logger.warning(
                "`config.force_recompute_fp8_weight_in_bwd` is deprecated and will be removed in a future release. "
                "Please see https://github.com/pytorch/ao/issues/2251 for more details."
            )

    @staticmethod
    def from_recipe_name(recipe_name: Float8LinearRecipeName | str) -> Float8LinearConfig:
        """The config of a named recipe (spec 6.1); an unknown name raises torchao's AssertionError."""
        if type(recipe_name) is str:
            valid_names = [n.value for n in Float8LinearRecipeName]
            _check(recipe_name in valid_names, f"recipe_name {recipe_name} not in valid names {valid_names}")
            recipe_name = Float8LinearRecipeName(recipe_name)

        axiswise = ScalingGranularity.AXISWISE
        if recipe_name is Float8LinearRecipeName.TENSORWISE:
            return Float8LinearConfig()
        if recipe_name is Float8LinearRecipeName.ROWWISE:
            return Float8LinearConfig(
                cast_config_input=CastConfig(scaling_granularity=axiswise, target_dtype=e4m3_dtype),
                cast_config_weight=CastConfig(scaling_granularity=axiswise, target_dtype=e4m3_dtype),
                cast_config_grad_output=CastConfig(scaling_granularity=axiswise, target_dtype=e4m3_dtype),
                round_scales_to_power_of_2=True,
            )
        if recipe_name is Float8LinearRecipeName.ROWWISE_WITH_GW_HP:
            return Float8LinearConfig(
                cast_config_input=CastConfig(scaling_granularity=axiswise),
                cast_config_weight=CastConfig(scaling_granularity=axiswise),
                cast_config_grad_output=CastConfig(scaling_granularity=axiswise, target_dtype=e4m3_dtype),
                cast_config_input_for_grad_weight=CastConfig(scaling_type=ScalingType.DISABLED),
                cast_config_weight_for_grad_input=CastConfig(scaling_granularity=ScalingGranularity.TENSORWISE),
                cast_config_grad_output_for_grad_weight=CastConfig(
                    scaling_type=ScalingType.DISABLED, target_dtype=e4m3_dtype
                ),
                round_scales_to_power_of_2=True,
            )
        raise AssertionError(f"unknown recipe_name {recipe_name}")
