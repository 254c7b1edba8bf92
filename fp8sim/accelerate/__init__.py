"""accelerate's kwargs handlers and FP8 preparation, emulated: no GPU, TransformerEngine, torchao or MS-AMP.

The handler classes keep accelerate 1.15's fields, defaults, ``ACCELERATE_FP8_*`` variables and
messages (spec section 7); the TE backend runs on :mod:`fp8sim.pytorch`, the torchao backend on
:mod:`fp8sim.torchao`.  ``prepare_fp8(model, optimizer, kwargs_handlers=[...])`` plays
``Accelerator(mixed_precision="fp8", kwargs_handlers=[...]).prepare(model, optimizer)``, and
:func:`cpu_launcher` runs it across processes.  Upstream quirks are reproduced with a warning;
``documented=True`` / ``settings.documented`` selects the documented behaviour (:data:`QUIRKS`).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("fp8sim.accelerate needs torch: pip install 'fp8sim[torch]'") from exc

from ._env import clear_environment, parse_flag_from_env, str_to_bool
from ._quirks import QUIRKS, UpstreamQuirkWarning, documented_semantics, settings
from .ao import (
    convert_model_to_fp8_ao,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    has_ao_layers,
)
from .handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    profile,
)
from .launch import cpu_launcher, init_process_group
from .prepare import FP8Setup, convert_outputs_to_fp32, prepare_fp8, setup_fp8
from .recipes import AORecipeKwargs, FP8BackendType, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from .transformer_engine import (
    apply_fp8_autowrap,
    contextual_fp8_autocast,
    convert_model,
    has_transformer_engine_layers,
    te_recipe_from_handler,
)

__all__ = [
    "KwargsHandler",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "profile",
    "FP8BackendType",
    "TERecipeKwargs",
    "AORecipeKwargs",
    "MSAMPRecipeKwargs",
    "FP8RecipeKwargs",
    "convert_model",
    "has_transformer_engine_layers",
    "contextual_fp8_autocast",
    "apply_fp8_autowrap",
    "te_recipe_from_handler",
    "find_first_last_linear_layers",
    "filter_linear_layers",
    "filter_first_and_last_linear_layers",
    "has_ao_layers",
    "convert_model_to_fp8_ao",
    "FP8Setup",
    "setup_fp8",
    "prepare_fp8",
    "convert_outputs_to_fp32",
    "init_process_group",
    "cpu_launcher",
    "str_to_bool",
    "parse_flag_from_env",
    "clear_environment",
    "QUIRKS",
    "UpstreamQuirkWarning",
    "settings",
    "documented_semantics",
]
