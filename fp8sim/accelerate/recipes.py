"""accelerate's FP8 recipe kwargs (spec 7.2, 7.3): same fields, order, defaults, ``ACCELERATE_FP8_*``
variables and messages, but no TransformerEngine, torchao or MS-AMP needed.

``AORecipeKwargs`` builds an :class:`fp8sim.torchao.Float8LinearConfig`; the TE kwargs become an
:mod:`fp8sim.recipe` recipe in :func:`fp8sim.accelerate.apply_fp8_autowrap`.  ``FP8RecipeKwargs``
reproduces upstream's ``opt_level`` quirk unless ``settings.documented`` is set (see ``_quirks``).
"""

from __future__ import annotations

import enum
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _available
from ._env import parse_flag_from_env
from ._quirks import use_documented, warn_quirk
from .handlers import KwargsHandler

__all__ = [
    "FP8BackendType",
    "AORecipeKwargs",
    "TERecipeKwargs",
    "MSAMPRecipeKwargs",
    "FP8RecipeKwargs",
    "FP8_FORMATS",
    "AMAX_COMPUTE_ALGORITHMS",
    "OPT_LEVELS",
    "BACKENDS",
]

ENV_PREFIX = "ACCELERATE_FP8_"
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGORITHMS = ("max", "most_recent")
OPT_LEVELS = ("O1", "O2")
BACKENDS = ("MSAMP", "TE")


class FP8BackendType(str, enum.Enum):
    """The FP8 backend of a run (case-sensitive values, as ``ACCELERATE_FP8_BACKEND`` takes them)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def _env(name: str, default: Any) -> Any:
    return os.environ.get(ENV_PREFIX + name, default)


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao float8 training: ``config`` (an fp8sim ``Float8LinearConfig``) and the filter deciding which
    ``nn.Linear`` to convert (None: all but the first and last, and those with a dim not divisible by 16).

    Without a config, ``pad_inner_dim`` and ``enable_fsdp_float8_all_gather`` default to
    ``ACCELERATE_FP8_PAD_INNER_DIM`` / ``ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER``, else True.
    """

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        if self.config is not None:
            return
        from ..torchao import Float8LinearConfig

        if self.pad_inner_dim is None:
            self.pad_inner_dim = parse_flag_from_env(ENV_PREFIX + "PAD_INNER_DIM", default=True)
        if self.enable_fsdp_float8_all_gather is None:
            self.enable_fsdp_float8_all_gather = parse_flag_from_env(
                ENV_PREFIX + "ENABLE_FSDP_FLOAT8_ALL_GATHER", default=True
            )
        self.config = Float8LinearConfig(
            pad_inner_dim=self.pad_inner_dim, enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather
        )


@dataclass
class TERecipeKwargs(KwargsHandler):
    """TransformerEngine recipe settings; each None field is filled from ``ACCELERATE_FP8_<FIELD>`` or the
    documented default (margin 0, interval 1, HYBRID, history 1024, "most_recent", no overrides, no MXFP8).

    Note: a value equal to the documented default never reaches the recipe (spec 7.3): see
    :func:`fp8sim.accelerate.apply_fp8_autowrap` for the ``amax_compute_algo`` consequence.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = parse_flag_from_env(ENV_PREFIX + "USE_AUTOCAST_DURING_EVAL")
        if self.margin is None:
            self.margin = int(_env("MARGIN", 0))
        if self.interval is None:
            self.interval = int(_env("INTERVAL", 1))
        if self.fp8_format is None:
            self.fp8_format = _env("FORMAT", "HYBRID")
        self.fp8_format = self.fp8_format.upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"`fp8_format` must be one of {' or '.join(FP8_FORMATS)}.")
        if self.amax_compute_algo is None:
            self.amax_compute_algo = _env("AMAX_COMPUTE_ALGO", "most_recent")
        self.amax_compute_algo = self.amax_compute_algo.lower()
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGORITHMS:
            raise ValueError(f"`amax_compute_algo` must be one of {' or '.join(AMAX_COMPUTE_ALGORITHMS)}")
        if self.amax_history_len is None:
            self.amax_history_len = int(_env("AMAX_HISTORY_LEN", 1024))
        if self.override_linear_precision is None:
            self.override_linear_precision = tuple(
                parse_flag_from_env(ENV_PREFIX + f"OVERRIDE_{gemm}") for gemm in ("FPROP", "DGRAD", "WGRAD")
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = parse_flag_from_env(ENV_PREFIX + "USE_MXFP8_BLOCK_SCALING")


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP settings: ``opt_level`` from ``ACCELERATE_FP8_OPT_LEVEL``, else "O2" (fp8sim cannot run MS-AMP)."""

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = _env("OPT_LEVEL", "O2")
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"`opt_level` must be one of {' or '.join(OPT_LEVELS)}")


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated union of the TE and MS-AMP kwargs plus ``backend`` ("TE" or "MSAMP"; fields: ``opt_level``,
    the TE fields, ``backend``).  As upstream, ``opt_level`` stays None unless ``settings.documented``."""

    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated and will be removed in Accelerate v2.0.0. "
            "Please use one of the proper FP8 recipe kwargs classes such as TERecipeKwargs or MSAMPRecipeKwargs "
            "instead.",
            FutureWarning,
            stacklevel=3,
        )
        default_backend = "msamp" if _available.is_msamp_available() else "te"
        if self.backend is None:
            self.backend = _env("BACKEND", default_backend)
        self.backend = self.backend.upper()
        if self.backend not in BACKENDS:
            raise ValueError("`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`.")
        super().__post_init__()  # TERecipeKwargs's only (MRO): the quirk
        if use_documented(None):
            MSAMPRecipeKwargs.__post_init__(self)
        elif self.opt_level is None and (self.backend == "MSAMP" or ENV_PREFIX + "OPT_LEVEL" in os.environ):
            warn_quirk("fp8recipekwargs-opt_level-unset", "FP8RecipeKwargs left `opt_level` None", stacklevel=4)
