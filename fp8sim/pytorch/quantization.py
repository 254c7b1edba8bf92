"""``autocast`` and the FP8 global state, with TransformerEngine's semantics (spec 4.4, 4.9).

Inside ``autocast(enabled=True, recipe=...)`` the fp8sim modules quantize per the recipe.  Delayed
scaling updates the forward scales of every module that ran when the outermost ``autocast`` exits
(if grad is enabled), and the backward scales at the end of the backward pass of the first FP8
module of the region (which runs last).  ``calibrating=True`` records amaxes with high-precision
compute.  ``accumulator`` (an fp8sim extension) picks the GEMM model for the whole region.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..recipe import Recipe
from . import _recompute_state
from ._support import (  # noqa: F401 - TE's names live in quantization
    check_fp8_block_scaling_support,
    check_fp8_support,
    check_mxfp8_support,
    check_nvfp4_support,
    get_default_fp8_recipe,
    get_default_recipe,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
)
from .constants import get_fp8_torch_dtype

__all__ = [
    "get_fp8_torch_dtype",
    "autocast",
    "fp8_autocast",
    "is_fp8_enabled",
    "is_calibrating",
    "get_recipe",
    "FP8State",
    "FP8GlobalStateManager",
    "quantized_model_init",
    "fp8_model_init",
    "get_default_recipe",
    "get_default_fp8_recipe",
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_fp8_block_scaling_support",
    "is_fp8_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "is_fp8_block_scaling_available",
    "reduce_and_update_fp8_tensors",
    "get_align_size_for_quantization",
]


@dataclass
class FP8State:
    enabled: bool = False
    calibrating: bool = False
    recipe: Recipe | None = None
    group: Any = None
    accumulator: str | None = None
    depth: int = 0
    modules: list[Any] = field(default_factory=list)  # modules that ran in the outermost region
    first_module: Any = None
    graph: bool = False
    fp8_parameters: bool = False  # inside quantized_model_init
    parameters_recipe: Recipe | None = None
    high_precision_init_val: bool = False
    # TE's global amax buffers: (forward, autocast key) -> callables returning a DelayedScaler (None once a
    # weakly held one is gone), and the (recipe, group) of each key; kept until FP8GlobalStateManager.reset()
    buffers: dict[tuple[bool, str], list[Any]] = field(default_factory=dict)
    autocast_arguments: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    backward_token: Any = None  # the region whose backward update ran
    # activation recompute (TE ``fp8_tensors_recompute_buffer``): one FIFO of stashed forward states per
    # stashing GEMM; ``recompute_first``: TE's ``is_first_fp8_module`` while a forward is recomputed
    fp8_tensors_recompute_buffer: list = field(default_factory=list)
    recompute_first: bool = False
    skip_fp8_weight_update_tensor: Any = None


class _RecomputeRegion(list):
    """The modules of a recomputed forward (TE's recompute phase): every trainable module in it keeps
    ``is_first_fp8_module`` (TE ``linear.py`` ``_check_fp8_reduce_and_update``), so each one's backward
    updates the backward scales; no region-token skip applies."""


# TE ``distributed.py`` module globals: inside a checkpointed forward, and in its recompute phase
_RECOMPUTE = {"region": False, "phase": False}


_STATE = FP8State()


def is_fp8_enabled() -> bool:
    """True inside ``autocast(enabled=True)``."""
    return _STATE.enabled


def is_calibrating() -> bool:
    return _STATE.calibrating


def get_recipe() -> Recipe:
    """The active recipe (TE's default for the emulated device when none was given:
    DelayedScaling on the default hopper; see :func:`get_default_recipe`)."""
    return _STATE.recipe if _STATE.recipe is not None else get_default_recipe()


def current_state() -> FP8State:
    return _STATE


def _register(module: Any, trainable: bool = True) -> bool:
    """Record that ``module`` ran in this region; True only for the region's first FP8 GEMM whose
    input, weight or bias requires grad (TE ``linear.py``: a frozen module never takes the role):
    its backward runs last and so triggers the backward scale updates.  In a recomputed forward,
    each trainable module (its first GEMM) gets TE's kept ``is_first_fp8_module``."""
    new = not any(m is module for m in _STATE.modules)
    if new:
        _STATE.modules.append(module)
    if isinstance(_STATE.modules, _RecomputeRegion):
        return bool(trainable and new and _STATE.recompute_first)
    if trainable and _STATE.first_module is None:
        _STATE.first_module = module
        return True
    return False


def _autocast_key(recipe: Recipe, group: Any) -> str:
    """TE ``get_unique_autocast_key``: the recipe's repr and the group's identity."""
    return f"recipe={recipe!r},group={None if group is None else id(group)}"


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _strong_ref(scaler: Any) -> Any:
    return lambda: scaler


def add_fp8_tensors_to_global_buffer(fwd: Any, bwd: Any, recipe: Recipe, group: Any) -> None:
    """Register a GEMM's forward and backward DelayedScalers once in TE's global buffers.

    Under ``torch.distributed`` the buffers hold the scalers until ``FP8GlobalStateManager.reset()``, as
    TE's hold the amax tensors, so each key is all-reduced on every rank.  Held weakly (one process
    only), a dead module left them when the garbage collector freed it, a moment that differs between
    ranks: some ranks skipped its all-reduce and the others hung in it (issue 16).
    """
    import weakref

    key = _autocast_key(recipe, group)
    _STATE.autocast_arguments[key] = (recipe, group)
    for refs in _STATE.buffers.values():  # a scaler lives under one key: its latest recipe and group
        refs[:] = [r for r in refs if r() is not fwd and r() is not bwd]
    ref = _strong_ref if _distributed() else weakref.ref
    for forward, scaler in ((True, fwd), (False, bwd)):
        if scaler is not None:  # a fusible op may hold state for one direction only
            _STATE.buffers.setdefault((forward, key), []).append(ref(scaler))


def reduce_and_update_fp8_tensors(forward: bool = True, token: Any = None) -> None:
    """TE ``FP8GlobalStateManager.reduce_and_update_fp8_tensors``: update every registered scaler of
    one direction, whether or not its module ran (``token``: skip a second backward update for the
    same region)."""
    from ..scaling.delayed import reduce_and_update

    if token is not None and not isinstance(token, _RecomputeRegion):
        if _STATE.backward_token is token:
            return
        _STATE.backward_token = token
    for (fw, key), refs in list(_STATE.buffers.items()):
        if fw != forward:
            continue
        scalers = [r() for r in refs]
        refs[:] = [r for r, sc in zip(refs, scalers, strict=True) if sc is not None]  # dead (one process only)
        live = [sc for sc in scalers if sc is not None]
        if live:
            recipe, group = _STATE.autocast_arguments[key]
            reduce_and_update(live, group=group)


@contextlib.contextmanager
def autocast(
    enabled: bool = True,
    calibrating: bool = False,
    recipe: Recipe | None = None,
    amax_reduction_group: Any = None,
    _graph: bool = False,
    *,
    accumulator: str | None = None,
) -> Iterator[None]:
    """TE's ``transformer_engine.pytorch.autocast``: FP8 execution per ``recipe`` for fp8sim modules.

    ``recipe=None`` is TE's choice on hardware without MXFP8 or CC >= 12.0: ``DelayedScaling()`` (also
    in a nested region: TE does not inherit the outer recipe).  Forward scales update when the
    outermost region exits, if it was ``enabled``, not ``_graph`` and grad is enabled (TE).
    ``amax_reduction_group``: the ``torch.distributed`` group whose amaxes are MAX-reduced before
    delayed-scaling updates.  ``accumulator``: None for the fast fp32 path (exact products summed
    in float32), a device ("hopper", "ada", "blackwell": fast/split per GEMM as the recipe says),
    an fp8sim accumulator preset name for every GEMM, or a device profile (``fp8sim.gemm.PROFILES``,
    e.g. "h100_pcie_cublaslt_12_8_te", or a ``DeviceProfile``): every GEMM as that GPU's cuBLASLt
    computes it, split-K decided per GEMM shape (``module/_gemm.py``).
    """
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp8sim.recipe recipe (DelayedScaling, ...), got {type(recipe).__name__}")
    check_accumulator(accumulator)
    import torch

    saved = (_STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.accumulator)
    outermost = _STATE.depth == 0
    if outermost:
        _STATE.modules, _STATE.first_module = ([], None) if not _RECOMPUTE["phase"] else (_RecomputeRegion(), None)
        if _RECOMPUTE["phase"]:  # TE autocast_enter at depth 0 sets is_first_fp8_module
            _STATE.recompute_first = True
    _STATE.enabled, _STATE.calibrating = bool(enabled), bool(calibrating)
    _STATE.recipe = recipe
    _STATE.group = amax_reduction_group
    _STATE.accumulator = accumulator if accumulator is not None else saved[4]  # fp8sim's knob is inherited
    saved_graph, _STATE.graph = _STATE.graph, bool(_graph)
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        modules = list(_STATE.modules)
        _STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.accumulator = saved
        _STATE.graph = saved_graph
        if _STATE.depth == 0:
            if enabled and not _graph and torch.is_grad_enabled():
                reduce_and_update_fp8_tensors(forward=True)  # every registered module, as TE
                for m in modules:
                    if not getattr(m, "_te_global_buffer", False):
                        m._update_forward_scales()
            _STATE.modules, _STATE.first_module = [], None


def check_accumulator(accumulator: Any) -> None:
    """ValueError unless ``accumulator`` is None, a device, an accumulator preset or a device profile."""
    from ..gemm import ACCUMULATORS, Accumulator, DeviceProfile, is_profile

    if accumulator is None or isinstance(accumulator, (Accumulator, DeviceProfile)) or is_profile(accumulator):
        return
    if isinstance(accumulator, str) and (accumulator in ("hopper", "ada", "blackwell") or accumulator in ACCUMULATORS):
        return
    from ..gemm import PROFILES
    from ..gemm.profiles import mmaemu_hint

    raise ValueError(
        f"accumulator must be None, a device (hopper, ada, blackwell), an accumulator preset "
        f"({', '.join(ACCUMULATORS)}) or a device profile ({', '.join(PROFILES)}); got {accumulator!r}"
        + mmaemu_hint(accumulator)
    )


def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Recipe | None = None,
    fp8_group: Any = None,
    _graph: bool = False,
) -> Any:
    """Deprecated TE name for :func:`autocast` (``fp8_recipe`` -> ``recipe``, ``fp8_group`` ->
    ``amax_reduction_group``)."""
    warnings.warn(
        "fp8_autocast is deprecated and will be removed in a future release. "
        "Use autocast(enabled=..., calibrating=..., recipe=..., group=..., _graph=...) instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return autocast(
        enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group, _graph=_graph
    )


class FP8GlobalStateManager:
    """TE's ``FP8GlobalStateManager``: class methods over the process-global FP8 state."""

    @classmethod
    def reset(cls) -> None:
        """Reset the global state (TE: a fresh ``FP8GlobalState``)."""
        fresh = FP8State()
        for name in fresh.__dataclass_fields__:
            setattr(_STATE, name, getattr(fresh, name))

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return _STATE.enabled

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return _STATE.calibrating

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return _STATE.fp8_parameters

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        return _STATE.high_precision_init_val

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        return _STATE.graph

    @classmethod
    def get_fp8_recipe(cls) -> Recipe:
        """The active recipe, else the one of ``quantized_model_init``, else TE's default."""
        if _STATE.recipe is not None:
            return _STATE.recipe
        if _STATE.parameters_recipe is not None:
            return _STATE.parameters_recipe
        return get_default_fp8_recipe()

    @classmethod
    def get_fp8_group(cls) -> Any:
        return _STATE.group

    @classmethod
    def get_autocast_state(cls) -> tuple:
        return (_STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.graph)

    @classmethod
    def set_autocast_state(cls, state: tuple) -> None:
        _STATE.enabled, _STATE.calibrating, _STATE.recipe, _STATE.group, _STATE.graph = state

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True when no trainable FP8 module has run yet in the current outermost region."""
        return _STATE.first_module is None

    @staticmethod
    def get_meta_tensor_key(forward: bool = True) -> str:
        """TE: the ``fp8_meta`` key of a direction's scaling state."""
        return "scaling_fwd" if forward else "scaling_bwd"

    @staticmethod
    def get_fwd_bwd_key(forward: bool = True) -> str:
        return "forward" if forward else "backward"

    @classmethod
    def get_buffer_info(cls) -> str:
        """TE: the ``fp8_meta`` key of a module's position in the global buffers."""
        return "buffer_index_and_autocast_key"

    @staticmethod
    def get_unique_autocast_key(recipe: Recipe | None = None, group: Any = None) -> str:
        """TE: ``recipe=<repr>,group=<id or None>``."""
        return _autocast_key(recipe, group)

    @classmethod
    def get_key_in_buffer(cls, forward: bool, fp8_recipe: Recipe, fp8_group: Any) -> str:
        return f"{cls.get_fwd_bwd_key(forward)}_{cls.get_unique_autocast_key(fp8_recipe, fp8_group)}"

    @classmethod
    def split_key_in_buffer(cls, key: str) -> tuple[bool, str]:
        forward, autocast_key = key.split("_", 1)
        return forward == "forward", autocast_key

    @classmethod
    def reduce_and_update_fp8_tensors(cls, forward: bool = True) -> None:
        """TE: update every registered delayed-scaling state of one direction."""
        reduce_and_update_fp8_tensors(forward=forward)

    @staticmethod
    def reduce_tensor_across_group_op_max(tensor: Any, group: Any) -> None:
        """TE: in-place MAX all-reduce over ``group`` when ``torch.distributed`` is initialised."""
        import torch

        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=group, async_op=False)

    @classmethod
    def add_fp8_tensors_to_global_buffer(cls, fp8_meta: dict[str, Any]) -> None:
        raise NotImplementedError(
            "FP8GlobalStateManager.add_fp8_tensors_to_global_buffer: fp8sim modules register their "
            "delayed-scaling state themselves on their first FP8 forward; a TE fp8_meta dict cannot be registered"
        )

    @classmethod
    def set_skip_fp8_weight_update_tensor(cls, skip: bool) -> None:
        """TE: a one-element float32 flag (on the CPU here) read by CUDA-graphed weight casts."""
        import torch

        if _STATE.skip_fp8_weight_update_tensor is None:
            _STATE.skip_fp8_weight_update_tensor = torch.empty(1, dtype=torch.float32)
        _STATE.skip_fp8_weight_update_tensor.fill_(skip)

    @classmethod
    def get_skip_fp8_weight_update_tensor(cls) -> Any:
        return _STATE.skip_fp8_weight_update_tensor

    # -- activation recompute (TE quantization.py): the forward's scales replayed in the recompute --
    @classmethod
    def copy_forward_fp8_meta_tensors_for_recompute(cls, fp8_meta: dict[str, Any]) -> None:
        """TE: stash the delayed-scaling forward ``amax_history`` and ``scale`` for the recompute."""
        _recompute_state.stash(fp8_meta, _STATE.fp8_tensors_recompute_buffer)

    @classmethod
    def get_old_fp8_meta_tensors_for_recompute(cls, fp8_meta: dict[str, Any]) -> None:
        """TE: keep the current forward state aside and load the oldest stash in place."""
        _recompute_state.load_stash(fp8_meta, _STATE.fp8_tensors_recompute_buffer)

    @staticmethod
    def restore_fp8_meta_tensors(fp8_meta: dict[str, Any]) -> None:
        """TE: put back the state :meth:`get_old_fp8_meta_tensors_for_recompute` kept aside."""
        _recompute_state.restore(fp8_meta)

    is_fp8_available = staticmethod(check_fp8_support)
    is_mxfp8_available = staticmethod(check_mxfp8_support)
    is_nvfp4_available = staticmethod(check_nvfp4_support)
    is_fp8_block_scaling_available = staticmethod(check_fp8_block_scaling_support)


@contextlib.contextmanager
def quantized_model_init(
    enabled: bool = True, recipe: Recipe | None = None, preserve_high_precision_init_val: bool = False
) -> Iterator[None]:
    """TE ``quantized_model_init``: modules built inside hold quantized primary weights (see
    ``fp8sim.pytorch.module.base``); ``preserve_high_precision_init_val`` keeps the initial values
    (``weight.get_high_precision_init_val()`` / ``clear_high_precision_init_val()``)."""
    saved = (_STATE.fp8_parameters, _STATE.parameters_recipe, _STATE.high_precision_init_val)
    _STATE.fp8_parameters = bool(enabled)
    _STATE.parameters_recipe = get_default_fp8_recipe() if recipe is None else recipe
    _STATE.high_precision_init_val = bool(preserve_high_precision_init_val)
    try:
        yield
    finally:
        _STATE.fp8_parameters, _STATE.parameters_recipe, _STATE.high_precision_init_val = saved


@contextlib.contextmanager
def fp8_model_init(
    enabled: bool = True, recipe: Recipe | None = None, preserve_high_precision_init_val: bool = False
) -> Iterator[None]:
    """Deprecated TE name for :func:`quantized_model_init`."""
    warnings.warn(
        "fp8_model_init is deprecated and will be removed in a future release. "
        "Use quantized_model_init(enabled=..., recipe=..., preserve_high_precision_init_val=...) instead.",
        category=DeprecationWarning,
        stacklevel=3,
    )
    with quantized_model_init(enabled, recipe, preserve_high_precision_init_val):
        yield


# TE defines the custom-recipe request classes in quantization.py; fp8sim's live in tensor/custom_recipe.py,
# which imports this module, hence the lazy re-export
_CUSTOM_RECIPE_NAMES = ("QuantizerRole", "QuantizerRequest", "DelayedScalingRequest")
# TE's recipe-state classes live in _recipe_state.py (they build quantizers from tensor/, which imports this module)
_RECIPE_STATE_NAMES = (
    "RecipeState",
    "DelayedScalingRecipeState",
    "Float8CurrentScalingRecipeState",
    "MXFP8BlockScalingRecipeState",
    "Float8BlockScalingRecipeState",
    "NVFP4BlockScalingRecipeState",
    "CustomRecipeState",
    "_default_sf_compute",
)


def get_align_size_for_quantization(recipe: Recipe) -> int:
    """TE (quantization.py 262-278): the row alignment grouped quantized GEMMs pad to: the custom recipe's
    ``quantization_alignment``, 32 for MXFP8, 128 for NVFP4, 16 for the other recipes."""
    if recipe.custom():
        return recipe.quantization_alignment
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


def __getattr__(name: str) -> Any:
    if name in _CUSTOM_RECIPE_NAMES:
        from .tensor import custom_recipe

        return getattr(custom_recipe, name)
    if name in _RECIPE_STATE_NAMES:
        from . import _recipe_state

        return getattr(_recipe_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
