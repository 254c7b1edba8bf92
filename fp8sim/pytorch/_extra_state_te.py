"""TE's own ``_extra_state`` format, so module checkpoints move between TE and fp8sim both ways.

TE 2.x (``pytorch/module/base.py`` ``get_extra_state`` / ``set_extra_state``, ``pytorch/_extra_state.py``):

- no FP8 state yet (no FP8 step, no calibration, ``fp8_checkpoint`` off) or a stateless recipe
  (current scaling, MXFP8, block scaling, NVFP4): ``torch.empty(0, dtype=torch.uint8)``;
- otherwise ``torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)`` of a dict with
  ``recipe`` (the recipe object), for delayed scaling ``scale_fwd``, ``amax_history_fwd``,
  ``scale_bwd``, ``amax_history_bwd`` (CPU float32 tensors, one layout for all GEMMs of a module:
  forward slot ``3 * gemm + (input, weight, output)``, backward slot ``2 * gemm + (grad_output,
  grad_input)``), and ``extra_fp8_variables`` (the ``fp8_meta`` entries that are bool, int, float,
  str, tuple or list).

Loading a pickle can run code, so TE refuses a stateful payload unless
``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` (its advisory text is reused).  fp8sim's decoder is also
restricted: it resolves only the recipe classes (TE's module path is mapped to ``fp8sim.recipe``)
and torch's tensor-rebuild functions, and loads tensor storages with ``weights_only=True``.
Recipes are written under TE's module path, so TE unpickles them as its own classes.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from .. import recipe as _recipe

__all__ = [
    "UNSAFE_PICKLE_EXTRA_STATE_ENV",
    "TEExtraState",
    "encode_te_extra_state",
    "decode_te_extra_state",
    "is_te_extra_state",
    "extra_state_pickle_advisory",
    "scalers_to_te",
    "te_to_scalers",
    "CheckpointExtraStatePolicy",
    "recipe_extra_state_policy",
    "is_stateless_recipe",
    "unsafe_pickle_extra_state_enabled",
    "should_load_extra_state_pickle",
]

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
_TE_RECIPE_MODULE = "transformer_engine.common.recipe"
_DS_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_RECIPE_NAMES = (
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
    "CustomRecipe",
    "Format",
    "_FormatHelper",
    "MMParams",
    "QParams",
)
_STATELESS = ("Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling")
_EXTRA_TYPES = (bool, int, float, str, tuple, list)
_STRING_OPS = ("STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINUNICODE")


@dataclass
class TEExtraState:
    """A decoded TE ``_extra_state``: the recipe, the delayed-scaling tensors (None when absent),
    and ``extra_fp8_variables``."""

    recipe: _recipe.Recipe
    scale_fwd: torch.Tensor | None = None
    amax_history_fwd: torch.Tensor | None = None
    scale_bwd: torch.Tensor | None = None
    amax_history_bwd: torch.Tensor | None = None
    extra_fp8_variables: dict[str, Any] = field(default_factory=dict)


def extra_state_pickle_advisory(context: str) -> str:
    """TE's refusal message for a pickled extra state without the opt-in."""
    return (
        f"Refusing to load pickled Transformer Engine extra state for {context}. "
        "Delayed-scaling FP8 metadata can be stored as a Python pickle, and loading it "
        "can execute arbitrary code. Only enable unsafe loading if this checkpoint is from "
        f"a trusted source. To load it anyway, set {UNSAFE_PICKLE_EXTRA_STATE_ENV}=1."
    )


# -- TE ``_extra_state.py``'s policy helpers (``transformer_engine.pytorch._extra_state`` under ``fp8sim run``) --
class CheckpointExtraStatePolicy(Enum):
    """TE: how a recipe's pickled ``_extra_state`` is handled on load."""

    STATELESS = "stateless"
    STATEFUL_FP8_DELAYED_SCALING = "stateful_fp8_delayed_scaling"
    DYNAMIC = "dynamic"


# TE's map of first-party recipes to their policy; fp8sim's recipe classes are TE's under ``fp8sim run``, so a
# recipe pickled by plain ``pickle`` (class path ``fp8sim.recipe``) is classified as TE's
_POLICY_BY_NAME = {
    "DelayedScaling": CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING,
    **{n: CheckpointExtraStatePolicy.STATELESS for n in _STATELESS},
    "CustomRecipe": CheckpointExtraStatePolicy.DYNAMIC,
}
_RECIPE_POLICIES: dict[tuple[str, str], CheckpointExtraStatePolicy] = {
    (mod, n): p for mod in (_TE_RECIPE_MODULE, _recipe.__name__) for n, p in _POLICY_BY_NAME.items()
}


def recipe_extra_state_policy(recipe: _recipe.Recipe) -> CheckpointExtraStatePolicy | None:
    """TE: the policy of a first-party recipe (fp8sim's recipe classes stand for TE's), else None."""
    cls = type(recipe)
    return _RECIPE_POLICIES.get((cls.__module__, cls.__name__))


def is_stateless_recipe(recipe: _recipe.Recipe) -> bool:
    """TE: the recipe carries no extra state to checkpoint."""
    return recipe_extra_state_policy(recipe) is CheckpointExtraStatePolicy.STATELESS


def unsafe_pickle_extra_state_enabled() -> bool:
    """TE: ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``."""
    return os.getenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "0") == "1"


def should_load_extra_state_pickle(data: bytes, context: str) -> bool:
    """TE: False for an empty or stateless payload (ignore it), True when the unsafe opt-in is set,
    else ``RuntimeError`` with TE's advisory."""
    if not data or not _needs_unsafe_opt_in(data):
        return False
    if unsafe_pickle_extra_state_enabled():
        return True
    raise RuntimeError(extra_state_pickle_advisory(context))


# -- encoding -----------------------------------------------------------------------------------


class _TEPickler(pickle._Pickler):  # the pure-Python pickler lets save_global be overridden
    """Writes fp8sim's recipe classes under TE's module path (TE resolves them to its own)."""

    _names = {getattr(_recipe, n): n for n in _RECIPE_NAMES}

    def save_global(self, obj: Any, name: str | None = None) -> None:
        qual = self._names.get(obj)
        if qual is None:
            return super().save_global(obj, name)
        if self.proto >= 4:
            self.save(_TE_RECIPE_MODULE)
            self.save(qual)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{_TE_RECIPE_MODULE}\n{qual}\n".encode())
        self.memoize(obj)


def _cpu_f32(name: str, t: Any) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32 (TE's fp8_meta dtype), got {t.dtype}")
    return t.detach().to("cpu").clone()


def encode_te_extra_state(
    recipe: _recipe.Recipe | None,
    *,
    scale_fwd: Any = None,
    amax_history_fwd: Any = None,
    scale_bwd: Any = None,
    amax_history_bwd: Any = None,
    extra_fp8_variables: dict[str, Any] | None = None,
    fp8_checkpoint: bool = True,
) -> torch.Tensor:
    """TE's ``get_extra_state`` bytes.  ``fp8_checkpoint``: ``fp8_meta["fp8_checkpoint"] or fp8 or
    fp8_calibration``; False (or no recipe, or a stateless recipe) gives the empty uint8 tensor.
    The four delayed-scaling tensors are given together (delayed scaling) or not at all.  Only
    ``extra_fp8_variables`` entries of TE's kept types are stored, as TE filters ``fp8_meta``."""
    if not fp8_checkpoint or recipe is None or type(recipe).__name__ in _STATELESS:
        return torch.empty(0, dtype=torch.uint8)
    tensors = dict(zip(_DS_KEYS, (scale_fwd, amax_history_fwd, scale_bwd, amax_history_bwd), strict=True))
    given = [k for k, v in tensors.items() if v is not None]
    if given and len(given) != len(_DS_KEYS):
        raise ValueError(f"give all of {', '.join(_DS_KEYS)} or none; got only {', '.join(given)}")
    if recipe.delayed() and not given:
        raise ValueError(f"a DelayedScaling extra state needs {', '.join(_DS_KEYS)}")
    state: dict[str, Any] = {"recipe": recipe}
    for k, v in tensors.items():
        if v is not None:
            state[k] = _cpu_f32(k, v)
    extra = extra_fp8_variables or {}
    state["extra_fp8_variables"] = {
        k: v for k, v in extra.items() if k != "buffer_index_and_autocast_key" and isinstance(v, _EXTRA_TYPES)
    }
    buf = io.BytesIO()
    _TEPickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(state)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def scalers_to_te(fwd: list[Any], bwd: list[Any]) -> dict[str, torch.Tensor]:
    """The four delayed-scaling tensors in TE's one-layout-per-module form from per-GEMM
    :class:`fp8sim.scaling.DelayedScaler` lists (forward ones with 3 quantizers each: input, weight,
    output; backward ones with 2: grad_output, grad_input), concatenated along the quantizer axis."""
    out = {}
    for key, scalers, n in (("fwd", fwd, 3), ("bwd", bwd, 2)):
        if any(s.n != n for s in scalers):
            raise ValueError(f"{key} scalers must have {n} quantizers each, got {[s.n for s in scalers]}")
        out[f"scale_{key}"] = torch.from_numpy(_np_cat([s.scale for s in scalers], 0))
        out[f"amax_history_{key}"] = torch.from_numpy(_np_cat([s.amax_history for s in scalers], 1))
    return out


def te_to_scalers(state: TEExtraState, fwd: list[Any], bwd: list[Any]) -> None:
    """Copy a decoded state's delayed-scaling tensors into per-GEMM scalers, in place (the scalers
    must already have the checkpoint's history length: build them from ``state.recipe``)."""
    for key, scalers in (("fwd", fwd), ("bwd", bwd)):
        scale, hist = getattr(state, f"scale_{key}"), getattr(state, f"amax_history_{key}")
        if scale is None or hist is None:
            raise ValueError(f"the state has no delayed-scaling tensors (recipe {type(state.recipe).__name__})")
        start = 0
        for s in scalers:
            part = {"scale": scale[start : start + s.n], "amax_history": hist[:, start : start + s.n]}
            s.load_state_dict(part)
            start += s.n
        if start != scale.numel():
            raise ValueError(f"{key}: the state has {scale.numel()} quantizers, the module {start}")


def _np_cat(arrays: list[Any], axis: int) -> Any:
    import numpy as np

    return np.ascontiguousarray(np.concatenate(arrays, axis=axis))


# -- decoding -----------------------------------------------------------------------------------


def _storage_from_bytes(b: bytes) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        return torch.load(io.BytesIO(b), weights_only=True)


_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
    ("collections", "OrderedDict"): collections.OrderedDict,
}
for _n in _RECIPE_NAMES:
    for _mod in (_TE_RECIPE_MODULE, "fp8sim.recipe"):
        _SAFE_GLOBALS[(_mod, _n)] = getattr(_recipe, _n)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _SAFE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"_extra_state refers to {module}.{name}; fp8sim loads only TE recipe classes and tensors"
            ) from None


def _needs_unsafe_opt_in(data: bytes) -> bool:
    """TE's classification (``_extra_state.py``), without running the pickle: a payload with no
    global and no delayed-scaling key, or one naming only stateless recipes, is ignored (False);
    anything else needs the opt-in (True)."""
    try:
        strings: list[str] = []
        has_global = has_recipe = has_ds = stateful = False
        recipes: set[str] = set()
        for op, arg, _ in pickletools.genops(data):
            if op.name in _STRING_OPS:
                text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else arg
                strings.append(text)
                has_recipe |= text == "recipe"
                has_ds |= text in _DS_KEYS
                continue
            if op.name == "GLOBAL":
                ref = tuple(str(arg).split())
            elif op.name == "STACK_GLOBAL":
                ref = tuple(strings[-2:])
            else:
                continue
            has_global = True
            policy = _RECIPE_POLICIES.get(ref) if len(ref) == 2 else None
            if policy is not None:
                recipes.add(ref[1])
                stateful |= policy is CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING
    except Exception:  # noqa: BLE001 - unreadable: TE asks for the opt-in
        return True
    if not has_global and not has_ds:  # cannot construct anything: nothing to load
        return False
    return not has_recipe or stateful or has_ds or not recipes


def is_te_extra_state(state: Any) -> bool:
    """Whether ``state`` is in TE's format (a uint8 tensor, empty or a pickle), not fp8sim's dict."""
    return isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1


def decode_te_extra_state(
    state: Any, context: str = "module", *, allow_unsafe: bool | None = None
) -> TEExtraState | None:
    """TE's ``set_extra_state`` reading: None for None, an empty tensor or a payload TE ignores;
    else the decoded state.  A stateful pickle needs ``allow_unsafe`` (default: the environment
    variable ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``) or raises TE's RuntimeError.  A TE 1.x
    state without ``recipe`` gets ``DelayedScaling()`` and drops ``scale_inv_*``, as TE does."""
    if allow_unsafe is None:
        allow_unsafe = os.getenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "0") == "1"
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        if state.numel() == 0:
            return None
        data = state.detach().cpu().numpy().tobytes()
        if not _needs_unsafe_opt_in(data):
            return None
        if not allow_unsafe:
            raise RuntimeError(extra_state_pickle_advisory(context))
        try:
            raw = _RestrictedUnpickler(io.BytesIO(data)).load()
        except Exception as exc:
            raise ValueError(f"{context}: _extra_state is not a readable TE extra state ({exc})") from exc
    elif isinstance(state, io.BytesIO):  # TE's deprecated format
        if not allow_unsafe:
            raise RuntimeError(extra_state_pickle_advisory(context))
        state.seek(0)
        raw = torch.load(state, map_location="cpu", weights_only=False)
    else:
        raise RuntimeError("Unsupported checkpoint format.")
    if raw is None:
        return None
    if not isinstance(raw, dict) or "extra_fp8_variables" not in raw:
        raise ValueError(f"{context}: _extra_state is a pickle but not TE's state dict (keys: {_keys(raw)})")
    raw = dict(raw)
    if "recipe" not in raw:
        raw["recipe"] = _recipe.DelayedScaling()
        raw.pop("scale_inv_fwd", None)
        raw.pop("scale_inv_bwd", None)
    _check_state(raw, context)
    return TEExtraState(
        recipe=raw["recipe"],
        extra_fp8_variables=dict(raw["extra_fp8_variables"]),
        **{k: raw.get(k) for k in _DS_KEYS},
    )


def _check_state(raw: dict[str, Any], context: str) -> None:
    """The decoded dict's entries, each named when missing or malformed (ValueError)."""
    bad = f"{context}: _extra_state"
    if not isinstance(raw["recipe"], _recipe.Recipe):
        raise ValueError(f"{bad}['recipe'] must be a TE recipe object, got {type(raw['recipe']).__name__}")
    if not isinstance(raw["extra_fp8_variables"], dict):
        kind = type(raw["extra_fp8_variables"]).__name__
        raise ValueError(f"{bad}['extra_fp8_variables'] must be a dict, got {kind}")
    given = [k for k in _DS_KEYS if raw.get(k) is not None]
    if not given:
        return
    if len(given) != len(_DS_KEYS):
        missing = [k for k in _DS_KEYS if k not in given]
        raise ValueError(f"{bad} has {', '.join(given)} but is missing key(s) {', '.join(missing)}")
    for k in _DS_KEYS:
        t = raw[k]
        want = 1 if k.startswith("scale") else 2
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != want:
            got = f"a {t.dim()}-d {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{bad}[{k!r}] must be a {want}-d float32 tensor, got {got}")
    for d in ("fwd", "bwd"):
        scale, hist = raw[f"scale_{d}"], raw[f"amax_history_{d}"]
        if hist.shape[1] != scale.shape[0]:
            raise ValueError(
                f"{bad}['amax_history_{d}'] has shape {list(hist.shape)}: one column per quantizer of "
                f"'scale_{d}' (shape {list(scale.shape)}) expected"
            )
    if raw["amax_history_fwd"].shape[0] != raw["amax_history_bwd"].shape[0]:
        raise ValueError(
            f"{bad}['amax_history_fwd'] and ['amax_history_bwd'] have {raw['amax_history_fwd'].shape[0]} and "
            f"{raw['amax_history_bwd'].shape[0]} rows; one amax_history_len expected"
        )


def _keys(raw: Any) -> str:
    return ", ".join(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
