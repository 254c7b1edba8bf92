"""TE delayed scaling: per-quantizer scale and amax history, updated as TE 2.x updates them.

One :class:`DelayedScaler` holds the state of a group of ``n`` quantizers (e.g. a module's forward
INPUT, WEIGHT, OUTPUT): ``scale`` (float32, starts at 1), ``amax_history`` (float32, shape
``(amax_history_len, n)``, zeros), ``scale_inv`` (the correctly rounded float32 reciprocal, as the
cast kernel writes it).  Row 0 of the history is the live staging slot: quantizing (or
:meth:`record`) folds the tensor's amax into it, and :meth:`update` runs TE's update (spec 4.5, or
4.6 for callables).  So step 1 casts with scale 1, and step t with the amaxes up to step t-1.

``update`` writes ``scale`` and ``amax_history`` in place (TE's ``fp8_meta`` tensors are updated in
place and quantizers hold views of them): ``torch.from_numpy(scaler.scale)`` stays live.  TE updates
every module registered in its global amax buffer at once: :func:`reduce_and_update` is that step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._util.args import as_array, as_bool, as_int
from .._util.tensors import is_torch_tensor
from ..cast.numpy_backend import encode_scaled_with_amax
from ..recipe import DelayedScaling, Format, tensor_format
from .amax import amax_nan_skipping, as_float32, dtype_name
from .quantized import QuantizedData

__all__ = [
    "DelayedScaler",
    "FLT_MAX",
    "MAX_AMAX_HISTORY_LEN",
    "MAX_QUANTIZERS",
    "load_state_dicts",
    "reduce_and_update",
]

FLT_MAX = np.float32(np.finfo(np.float32).max)
MAX_AMAX_HISTORY_LEN = 1 << 16  # 64x TE's default of 1024; the history is allocated up front
MAX_QUANTIZERS = 1 << 12


def _check_sizes(history_len: int, n: int) -> None:
    if history_len > MAX_AMAX_HISTORY_LEN:
        raise ValueError(
            f"amax_history_len must be at most {MAX_AMAX_HISTORY_LEN} (TE's default is 1024; the history is "
            f"allocated up front), got {history_len}"
        )
    if n > MAX_QUANTIZERS:
        raise ValueError(f"n (number of quantizers) must be at most {MAX_QUANTIZERS}, got {n}")


def _te_fp8_max(recipe: DelayedScaling, forward: bool) -> int:
    """TE's ``get_fp8_max``: the Python number (448 or 57344) the unfused path and callables get."""
    if recipe.fp8_format == Format.E4M3 or (recipe.fp8_format == Format.HYBRID and forward):
        return Format.E4M3.value.max_fwd
    return Format.E5M2.value.max_fwd


def _check_history_len(recipe: DelayedScaling) -> None:
    """TE accepts ``DelayedScaling(amax_history_len=0)`` but its state has no amax row: building the
    quantizers (``amax_history[0][i]``, ``quantization.py`` ``DelayedScalingRecipeState``) fails."""
    if recipe.amax_history_len == 0:
        raise IndexError(
            "index 0 is out of bounds for dimension 0 with size 0: DelayedScaling(amax_history_len=0) has no "
            "amax history row to record into (TE fails the same way when it builds the quantizers)"
        )


class DelayedScaler:
    """Delayed-scaling state for ``n`` quantizers of one direction (forward or backward).

    ``fused=None`` picks TE's choice: the fused kernel unless an algorithm is a callable or
    ``NVTE_UNFUSED_FP8_UPDATE=1``.  ``eager_division`` (unfused path only) computes
    ``fp8_max / amax`` as ``amax.reciprocal() * fp8_max``, as eager torch does and as
    ``torch.compile`` gives on a CPU (spec 0, 4.6); ``False`` divides once in IEEE.
    """

    def __init__(
        self,
        recipe: DelayedScaling | None = None,
        n: int = 1,
        *,
        forward: bool = True,
        fused: bool | None = None,
        eager_division: bool = True,
    ) -> None:
        self.recipe = recipe if recipe is not None else DelayedScaling()
        if not isinstance(self.recipe, DelayedScaling):
            raise TypeError(f"recipe must be a DelayedScaling, got {type(self.recipe).__name__}")
        _check_history_len(self.recipe)
        n = as_int(n, "n (number of quantizers)", lo=1)
        _check_sizes(self.recipe.amax_history_len, n)
        self.n = n
        self.forward = as_bool(forward, "forward")
        # The quantization dtype is fixed when the state is created (TE's RecipeState.dtype).
        self.fmt = tensor_format(self.recipe.fp8_format, forward)
        self._fused_arg = as_bool(fused, "fused", none=True)
        self.fused = self._pick_fused(fused)
        self.eager_division = as_bool(eager_division, "eager_division")
        self.scale = np.ones(n, np.float32)
        self.amax_history = np.zeros((self.recipe.amax_history_len, n), np.float32)

    def _pick_fused(self, fused: bool | None) -> bool:
        callable_algo = callable(self.recipe.amax_compute_algo) or callable(self.recipe.scaling_factor_compute_algo)
        if fused is None:
            return not callable_algo and os.getenv("NVTE_UNFUSED_FP8_UPDATE", "0") != "1"
        if fused and callable_algo:
            raise ValueError("fused=True cannot run a callable amax_compute_algo or scaling_factor_compute_algo")
        return fused

    @property
    def fp8_max(self) -> np.float32:
        """FP8_MAX of the current recipe, as the update uses it."""
        return np.float32(tensor_format(self.recipe.fp8_format, self.forward).max)

    @property
    def scale_inv(self) -> np.ndarray:
        """``__frcp_rn(scale)``: the float32 reciprocal, rounded once."""
        with np.errstate(divide="ignore"):
            return np.float32(1) / self.scale

    def set_recipe(self, recipe: DelayedScaling) -> None:
        """Continue with another DelayedScaling recipe, as TE's ``set_meta_tensor`` does mid-training
        (``module/base.py``): the scale is kept, the history is cut to its first ``amax_history_len``
        rows or padded with zero rows at the end (``adjust_amax_history_length``; a new array then),
        the quantization dtype stays the one the state was created with, and later updates use the
        new recipe's margin, algorithms and FP8_MAX."""
        if not isinstance(recipe, DelayedScaling):
            raise TypeError(f"recipe must be a DelayedScaling, got {type(recipe).__name__}")
        _check_history_len(recipe)
        _check_sizes(recipe.amax_history_len, self.n)
        length, cur = recipe.amax_history_len, self.amax_history.shape[0]
        if length < cur:
            self.amax_history = self.amax_history[:length].copy()
        elif length > cur:
            self.amax_history = np.pad(self.amax_history, ((0, length - cur), (0, 0)))
        self.recipe = recipe
        self.fused = self._pick_fused(self._fused_arg)

    def _check_index(self, index: int) -> int:
        index = as_int(index, "index")
        if not 0 <= index < self.n:
            raise IndexError(f"quantizer index {index} out of range for n={self.n}")
        return index

    def record(self, index: int, x: Any) -> np.float32:
        """Fold ``max|x|`` (NaN skipped, Inf kept) into the staging row; returns that amax."""
        index = self._check_index(index)
        amax = amax_nan_skipping(as_float32(x))
        self.amax_history[0, index] = np.fmax(self.amax_history[0, index], amax)
        return amax

    def quantize(self, index: int, x: Any) -> QuantizedData:
        """Cast ``x`` with the current scale, ``satfinite(RN(fl32(x) * scale))``, and record its amax.

        The result's scale is ``scale_inv`` (a per-tensor block covering the whole tensor).
        """
        index = self._check_index(index)
        x32 = as_float32(x)
        codes, amax = encode_scaled_with_amax(x32, self.scale[index], self.fmt, saturate=True)
        self.amax_history[0, index] = np.fmax(self.amax_history[0, index], amax)
        block = tuple(max(d, 1) for d in x32.shape)
        scales = np.full((1,) * x32.ndim, self.scale_inv[index], np.float32)
        return QuantizedData(codes, scales, self.fmt, block, x32.shape, dtype_name(x))

    def update(self, reduced_amax: np.ndarray | None = None, group: Any = None) -> None:
        """TE's scale update, in place.  With ``recipe.reduce_amax`` and an initialised
        ``torch.distributed`` group of more than one process, the staging row is first all-reduced
        with MAX (``group``: the process group, default WORLD).  ``reduced_amax`` passes an already
        reduced row."""
        if reduced_amax is not None:
            reduced_amax = _reduced_row(reduced_amax, self.n)
        if reduced_amax is None and self.recipe.reduce_amax:
            reduced_amax = _all_reduce_max(self.amax_history[0], group)
        if self.fused:
            self._update_fused(reduced_amax)
        else:
            self._update_unfused(reduced_amax)

    def _update_fused(self, reduced: np.ndarray | None) -> None:
        hist = self.amax_history
        last = hist[0].copy()
        if reduced is not None:
            reduced = np.asarray(reduced, np.float32)
            last = np.where(reduced != 0, reduced, last)
        run = last != 0  # "avoid roll for non-run modules" (NaN != 0: rolls)
        window = np.concatenate([hist[1:], last[None, :]])  # a_0 .. a_{L-1}
        amax = np.fmax.reduce(window, axis=0, initial=np.float32(0))
        new = window.copy()
        new[0] = 0
        hist[:, run] = new[:, run]
        amax = np.where(run, amax, np.float32(0))
        if self.recipe.amax_compute_algo == "most_recent":
            amax = last
        # scaled_max = fp8_max * powf(2, -margin), then one IEEE division (common/recipe/delayed_scaling.cu)
        scaled_max = np.float32(self.fp8_max * np.float32(2.0**-self.recipe.margin))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            sf = scaled_max / amax
        self.scale[...] = self._finish(amax, sf)

    def _finish(self, amax: np.ndarray, sf: np.ndarray) -> np.ndarray:
        ok = np.isfinite(amax) & (amax > 0)
        sf = np.where(ok, sf, self.scale)
        return np.where(np.isinf(sf), FLT_MAX, sf).astype(np.float32)

    def _update_unfused(self, reduced: np.ndarray | None) -> None:
        if reduced is not None:
            self.amax_history[0] = np.asarray(reduced, np.float32)
        try:
            import torch
        except ImportError:
            return self._update_unfused_numpy()
        # TE's _amax_and_scale_update (pytorch/quantization.py) on torch views of the state, so a
        # callable sees (and may alias) the live history and scale exactly as under TE.
        hist, scale = torch.from_numpy(self.amax_history), torch.from_numpy(self.scale)
        algo, sf_algo = self.recipe.amax_compute_algo, self.recipe.scaling_factor_compute_algo
        if algo == "max":
            amax = torch.max(hist, dim=0).values  # NaN propagates
        elif algo == "most_recent":
            amax = hist[0].clone()
        else:
            amax = algo(hist)
        if hist.shape[0] > 1:  # the history rolls before the scale is computed (amax may be a view)
            hist.copy_(torch.roll(hist, -1, 0))
        hist[0].fill_(0.0)
        fp8_max = _te_fp8_max(self.recipe, self.forward)
        if sf_algo is not None:
            sf = sf_algo(amax, scale, fp8_max, self.recipe)
        else:
            if self.eager_division:
                sf = (fp8_max / amax) / (2**self.recipe.margin)  # torch: amax.reciprocal() * fp8_max
            else:
                sf = torch.full_like(amax, fp8_max).div(amax) / (2**self.recipe.margin)
            sf = torch.where(amax > 0.0, sf, scale)
            sf = torch.where(torch.isfinite(amax), sf, scale)
            sf = torch.where(torch.isinf(sf), torch.full_like(sf, float(FLT_MAX)), sf)
        scale.copy_(sf)
        return None

    def _update_unfused_numpy(self) -> None:
        """Without torch: the same steps on numpy arrays (callables get numpy arrays)."""
        hist = self.amax_history
        algo, sf_algo = self.recipe.amax_compute_algo, self.recipe.scaling_factor_compute_algo
        if algo == "max":
            amax = np.max(hist, axis=0)
        elif algo == "most_recent":
            amax = hist[0].copy()
        else:
            amax = np.asarray(algo(hist))
        hist[...] = np.roll(hist, -1, axis=0)
        hist[0] = 0
        fp8_max = _te_fp8_max(self.recipe, self.forward)
        if sf_algo is not None:
            self.scale[...] = np.asarray(sf_algo(amax, self.scale, fp8_max, self.recipe), np.float32)
            return
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            a = amax.astype(np.float32)
            sf = (np.float32(1) / a) * np.float32(fp8_max) if self.eager_division else np.float32(fp8_max) / a
            sf = sf / np.float32(2.0**self.recipe.margin)
        self.scale[...] = self._finish(a, sf)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"scale": self.scale.copy(), "amax_history": self.amax_history.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy a saved state (:meth:`state_dict`: ``scale`` of shape ``(n,)`` and ``amax_history`` of
        shape ``(amax_history_len, n)``, numpy arrays or torch tensors) into this one, in place.  A
        missing, unexpected or malformed key is a ValueError (TypeError for a non-dict) naming it."""
        scale, hist = self._checked_state(state)
        self.scale[...], self.amax_history[...] = scale, hist

    def _checked_state(self, state: Any) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(state, Mapping):
            raise TypeError(
                f"state must be a dict with keys {_STATE_KEYS} (a state_dict()); got {type(state).__name__}"
            )
        missing = [k for k in _STATE_KEYS if k not in state]
        unexpected = sorted(map(repr, set(state) - set(_STATE_KEYS)))
        if missing or unexpected:
            what = [f"missing key(s) {missing}"] if missing else []
            what += [f"unexpected key(s) {', '.join(unexpected)}"] if unexpected else []
            raise ValueError(f"DelayedScaler state: {'; '.join(what)}; a state has exactly the keys {_STATE_KEYS}")
        want = {"scale": self.scale.shape, "amax_history": self.amax_history.shape}
        scale, hist = (_state_array(state[k], k, want[k]) for k in _STATE_KEYS)
        if not np.isfinite(scale).all() or (scale <= 0).any():
            raise ValueError(f"state['scale'] must be finite and positive, got {scale}")
        return scale, hist

    def __repr__(self) -> str:
        return (
            f"DelayedScaler(n={self.n}, fmt={self.fmt.name}, history_len={self.amax_history.shape[0]}, "
            f"algo={self.recipe.amax_compute_algo!r}, fused={self.fused}, scale={self.scale.tolist()})"
        )


def load_state_dicts(pairs: Sequence[tuple[DelayedScaler, Any]]) -> None:
    """``scaler.load_state_dict(state)`` for each pair, all or nothing: every state is checked
    before any scaler changes (a module's forward and backward state load together)."""
    checked = [(scaler, scaler._checked_state(state)) for scaler, state in pairs]
    for scaler, (scale, hist) in checked:
        scaler.scale[...], scaler.amax_history[...] = scale, hist


def reduce_and_update(scalers: Sequence[DelayedScaler], group: Any = None) -> None:
    """TE's ``FP8GlobalStateManager.reduce_and_update_fp8_tensors`` for the scalers of one
    direction and recipe: every registered module, whether or not it ran this step.  The staging
    rows are concatenated and all-reduced once (``reduce_amax``, more than one process), then each
    scaler updates; the fused kernel leaves a scaler whose amax is 0 alone, the unfused path rolls
    every history."""
    scalers = list(scalers)
    if not scalers:
        return
    rows = np.concatenate([s.amax_history[0] for s in scalers])
    reduced = _all_reduce_max(rows, group) if scalers[0].recipe.reduce_amax else None
    start = 0
    for s in scalers:
        part = None if reduced is None else reduced[start : start + s.n]
        start += s.n
        if s.fused:
            s._update_fused(part)
        else:
            s._update_unfused(part)


_STATE_KEYS = ("scale", "amax_history")


def _reduced_row(value: Any, n: int) -> np.ndarray:
    """``reduced_amax``: one real amax per quantizer, shape ``(n,)``, as float32."""
    arr = value.detach().cpu().float().numpy() if is_torch_tensor(value) else as_array(value, "reduced_amax")
    if arr.dtype.kind not in "iuf" or arr.shape != (n,):
        raise ValueError(f"reduced_amax must be {n} real amaxes (shape ({n},)), got {arr.dtype} of shape {arr.shape}")
    return arr.astype(np.float32)


def _state_array(value: Any, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """``state[key]`` as a float32 array of ``shape``, or ValueError naming the key."""
    try:
        arr = value.detach().cpu().float().numpy() if is_torch_tensor(value) else np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"state[{key!r}] must be a float32 array of shape {shape}: {exc}") from None
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"state[{key!r}] must be a float32 array of shape {shape}; got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(
            f"state[{key!r}] has shape {arr.shape}; this DelayedScaler's is {shape} "
            "(amax_history_len, n): the state comes from another recipe or module"
        )
    with np.errstate(over="ignore"):  # beyond float32 becomes Inf, which the caller refuses by name
        return arr.astype(np.float32)


def _all_reduce_max(row: np.ndarray, group: Any) -> np.ndarray | None:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) <= 1:
        return None
    t = torch.from_numpy(row.copy())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.numpy()
