"""TE delayed scaling: per-quantizer scale and amax history, updated as TE 2.x updates them.

One :class:`DelayedScaler` holds the state of a group of ``n`` quantizers (e.g. a module's forward
INPUT, WEIGHT, OUTPUT): ``scale`` (float32, starts at 1), ``amax_history`` (float32, shape
``(amax_history_len, n)``, zeros), ``scale_inv`` (the correctly rounded float32 reciprocal, as the
cast kernel writes it).  Row 0 of the history is the live staging slot: quantizing (or
:meth:`record`) folds the tensor's amax into it, and :meth:`update` runs TE's update (spec 4.5, or
4.6 for callables).  So step 1 casts with scale 1, and step t with the amaxes up to step t-1.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._torch import is_torch_tensor
from ..cast.numpy_backend import encode_scaled_with_amax
from ..recipe import DelayedScaling, tensor_format
from .amax import amax_nan_skipping, as_float32, dtype_name
from .quantized import QuantizedTensor

__all__ = ["DelayedScaler", "FLT_MAX"]

FLT_MAX = np.float32(np.finfo(np.float32).max)


class DelayedScaler:
    """Delayed-scaling state for ``n`` quantizers of one direction (forward or backward).

    ``fused=None`` picks TE's choice: the fused kernel unless an algorithm is a callable or
    ``NVTE_UNFUSED_FP8_UPDATE=1``.  ``eager_division`` (unfused path only) computes
    ``fp8_max / amax`` as ``amax.reciprocal() * fp8_max`` like eager torch; the default is one IEEE
    division, as under TE's default ``torch.compile`` (spec 4.6, open question in section 10).
    """

    def __init__(
        self,
        recipe: DelayedScaling | None = None,
        n: int = 1,
        *,
        forward: bool = True,
        fused: bool | None = None,
        eager_division: bool = False,
    ) -> None:
        self.recipe = recipe if recipe is not None else DelayedScaling()
        if not isinstance(self.recipe, DelayedScaling):
            raise TypeError(f"recipe must be a DelayedScaling, got {type(self.recipe).__name__}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n (number of quantizers) must be an int >= 1, got {n!r}")
        self.n = n
        self.forward = forward
        self.fmt = tensor_format(self.recipe.fp8_format, forward)
        self.fp8_max = np.float32(self.fmt.max)
        if fused is None:
            callable_algo = callable(self.recipe.amax_compute_algo) or self.recipe.scaling_factor_compute_algo
            fused = not callable_algo and os.getenv("NVTE_UNFUSED_FP8_UPDATE", "0") != "1"
        elif fused and (callable(self.recipe.amax_compute_algo) or self.recipe.scaling_factor_compute_algo):
            raise ValueError("fused=True cannot run a callable amax_compute_algo or scaling_factor_compute_algo")
        self.fused = fused
        self.eager_division = eager_division
        self.scale = np.ones(n, np.float32)
        self.amax_history = np.zeros((self.recipe.amax_history_len, n), np.float32)

    @property
    def scale_inv(self) -> np.ndarray:
        """``__frcp_rn(scale)``: the float32 reciprocal, rounded once."""
        with np.errstate(divide="ignore"):
            return np.float32(1) / self.scale

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.n:
            raise IndexError(f"quantizer index {index} out of range for n={self.n}")

    def record(self, index: int, x: Any) -> np.float32:
        """Fold ``max|x|`` (NaN skipped, Inf kept) into the staging row; returns that amax."""
        self._check_index(index)
        amax = amax_nan_skipping(as_float32(x))
        self.amax_history[0, index] = np.fmax(self.amax_history[0, index], amax)
        return amax

    def quantize(self, index: int, x: Any) -> QuantizedTensor:
        """Cast ``x`` with the current scale, ``satfinite(RN(fl32(x) * scale))``, and record its amax.

        The result's scale is ``scale_inv`` (a per-tensor block covering the whole tensor).
        """
        self._check_index(index)
        x32 = as_float32(x)
        codes, amax = encode_scaled_with_amax(x32, self.scale[index], self.fmt, saturate=True)
        self.amax_history[0, index] = np.fmax(self.amax_history[0, index], amax)
        block = tuple(max(d, 1) for d in x32.shape)
        scales = np.full((1,) * x32.ndim, self.scale_inv[index], np.float32)
        return QuantizedTensor(codes, scales, self.fmt, block, x32.shape, dtype_name(x))

    def update(self, reduced_amax: np.ndarray | None = None, group: Any = None) -> None:
        """TE's scale update.  With ``recipe.reduce_amax`` and an initialised ``torch.distributed``
        group of more than one process, the staging row is first all-reduced with MAX (``group``:
        the process group, default WORLD).  ``reduced_amax`` passes an already reduced row."""
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
        self.scale = self._scale_from_amax(amax, division="ieee")

    def _update_unfused(self, reduced: np.ndarray | None) -> None:
        hist = self.amax_history
        if reduced is not None:
            hist[0] = np.asarray(reduced, np.float32)
        algo = self.recipe.amax_compute_algo
        if algo == "max":
            amax = np.max(hist, axis=0)  # torch.max: NaN propagates
        elif algo == "most_recent":
            amax = hist[0].copy()
        else:
            amax = _to_numpy(algo(_framework(hist.copy()))).astype(np.float32).reshape(self.n)
        sf_algo = self.recipe.scaling_factor_compute_algo
        if sf_algo is None:
            scale = self._scale_from_amax(amax, division="eager" if self.eager_division else "ieee")
        else:
            out = sf_algo(_framework(amax), _framework(self.scale.copy()), _framework(self.fp8_max), self.recipe)
            scale = _to_numpy(out).astype(np.float32).reshape(self.n)
        self.amax_history = np.roll(hist, -1, axis=0)
        self.amax_history[0] = 0
        self.scale = scale

    def _scale_from_amax(self, amax: np.ndarray, division: str) -> np.ndarray:
        scaled_max = np.float32(self.fp8_max * np.float32(2.0**-self.recipe.margin))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            if division == "eager":  # (fp8_max / amax) / 2^margin with / as reciprocal-multiply
                sf = (np.float32(1) / amax) * self.fp8_max
                sf = sf / np.float32(2.0**self.recipe.margin)
            else:
                sf = scaled_max / amax
        ok = np.isfinite(amax) & (amax > 0)
        sf = np.where(ok, sf, self.scale)
        return np.where(np.isinf(sf), FLT_MAX, sf).astype(np.float32)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"scale": self.scale.copy(), "amax_history": self.amax_history.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        scale = np.asarray(state["scale"], np.float32)
        hist = np.asarray(state["amax_history"], np.float32)
        if scale.shape != self.scale.shape or hist.shape != self.amax_history.shape:
            raise ValueError(
                f"state shapes scale {scale.shape}, amax_history {hist.shape} do not match "
                f"{self.scale.shape}, {self.amax_history.shape}"
            )
        if not np.isfinite(scale).all() or (scale <= 0).any():
            raise ValueError(f"scale must be finite and positive, got {scale}")
        self.scale, self.amax_history = scale.copy(), hist.copy()

    def __repr__(self) -> str:
        return (
            f"DelayedScaler(n={self.n}, fmt={self.fmt.name}, history_len={self.amax_history.shape[0]}, "
            f"algo={self.recipe.amax_compute_algo!r}, fused={self.fused}, scale={self.scale.tolist()})"
        )


def _framework(a: np.ndarray) -> Any:
    """What TE hands user callables: a torch tensor when torch is installed, else numpy."""
    try:
        import torch
    except ImportError:
        return a
    return torch.from_numpy(np.ascontiguousarray(a))


def _to_numpy(a: Any) -> np.ndarray:
    if is_torch_tensor(a):
        return a.detach().cpu().numpy()
    return np.asarray(a)


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
