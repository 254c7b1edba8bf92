"""TE-style modules: ``Linear``, ``LayerNorm``, ``LayerNormLinear``, ``LayerNormMLP``.

Outside ``autocast`` they are plain layers.  Inside, every GEMM quantizes its operands per the
active recipe (forward tensors in the forward format, gradients in the backward one: E5M2 under
HYBRID) and runs on the emulated GEMM.  Each GEMM owns TE's delayed-scaling state: forward slots
INPUT=0, WEIGHT=1, OUTPUT=2 and backward slots GRAD_OUTPUT=0, GRAD_INPUT=1, saved in the
``state_dict`` as ``_extra_state``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..recipe import DelayedScaling, Recipe
from ..scaling.delayed import DelayedScaler
from ._linear import fp8_linear
from ._operands import PER_TENSOR, Operand, nan_skipping_amax, quantize_operand
from .quantization import _register, current_state, get_recipe

__all__ = ["Linear", "LayerNorm", "LayerNormLinear", "LayerNormMLP"]


def _check_dims(x: torch.Tensor, weight: torch.Tensor) -> None:
    flat = math.prod(x.shape[:-1])
    if flat % 8 or x.shape[-1] % 16 or weight.shape[0] % 16:
        raise AssertionError(
            "FP8 execution requires the product of all dimensions except the last to be divisible by 8 and "
            f"the last dimension to be divisible by 16, but got tensor with dims={list(x.shape)} "
            f"(weight {list(weight.shape)})"
        )


class _GemmState:
    """FP8 state of one GEMM: delayed-scaling scalers, the weight cache, statistics."""

    def __init__(self) -> None:
        self.fwd: DelayedScaler | None = None
        self.bwd: DelayedScaler | None = None
        self.weight_cache: tuple[Operand, Operand] | None = None
        self.group: Any = None
        self.calls = 0
        self.stats: dict | None = None

    def ensure(self, recipe: Recipe) -> None:
        if not isinstance(recipe, DelayedScaling):
            return
        if self.fwd is None or self.fwd.recipe != recipe:
            old = (self.fwd, self.bwd)
            self.fwd = DelayedScaler(recipe, n=3, forward=True)
            self.bwd = DelayedScaler(recipe, n=2, forward=False)
            for new, prev in zip((self.fwd, self.bwd), old, strict=True):
                if prev is not None and prev.amax_history.shape == new.amax_history.shape:
                    new.scale, new.amax_history = prev.scale, prev.amax_history

    @staticmethod
    def _per_tensor(recipe: Recipe) -> bool:
        return isinstance(recipe, PER_TENSOR)

    @staticmethod
    def _wgrad_high_precision(recipe: Recipe) -> bool:
        return isinstance(recipe, DelayedScaling) and recipe.override_linear_precision.wgrad

    def _quantize(self, x: torch.Tensor, recipe: Recipe, kind: str, k_axis: int) -> Operand:
        self.calls += 1
        scaler = self.bwd if kind == "grad" else self.fwd
        index = {"input": 0, "weight": 1, "grad": 0}[kind]
        return quantize_operand(x, recipe, kind, k_axis, scaler=scaler, index=index, seed=self.calls, stats=self.stats)

    def _weight_operands(self, w: torch.Tensor, recipe: Recipe, is_first_microbatch: bool | None) -> tuple:
        if is_first_microbatch is False and self.weight_cache is not None:
            return self.weight_cache  # TE reuses the cached FP8 weight and its old scale_inv
        row = self._quantize(w, recipe, "weight", 1)
        col = row if self._per_tensor(recipe) else self._quantize(w, recipe, "weight", 0)
        if is_first_microbatch is not None:
            self.weight_cache = (row, col)
        return row, col

    def _update_forward_scales(self) -> None:
        if self.fwd is not None:
            self.fwd.update(group=self.group)

    def _update_backward_scales(self) -> None:
        if self.bwd is not None:
            self.bwd.update(group=self.group)

    def state(self) -> dict[str, torch.Tensor]:
        if self.fwd is None:
            return {}
        return {
            "fwd_scale": torch.from_numpy(self.fwd.scale.copy()),
            "fwd_amax_history": torch.from_numpy(self.fwd.amax_history.copy()),
            "bwd_scale": torch.from_numpy(self.bwd.scale.copy()),
            "bwd_amax_history": torch.from_numpy(self.bwd.amax_history.copy()),
        }

    def load(self, st: dict[str, torch.Tensor]) -> None:
        if not st:
            return
        hist_len = st["fwd_amax_history"].shape[0]
        recipe = self.fwd.recipe if self.fwd is not None else DelayedScaling(amax_history_len=hist_len)
        self.ensure(recipe)
        self.fwd.load_state_dict({"scale": st["fwd_scale"].numpy(), "amax_history": st["fwd_amax_history"].numpy()})
        self.bwd.load_state_dict({"scale": st["bwd_scale"].numpy(), "amax_history": st["bwd_amax_history"].numpy()})


class _FP8Base(nn.Module):
    """Shared FP8 plumbing: named GEMM states, registration with autocast, ``_extra_state``."""

    _gemm_names: tuple[str, ...] = ("gemm",)

    def __init__(self, accumulator: str | None = None) -> None:
        super().__init__()
        self.accumulator = accumulator
        self.fp8_gemms = {n: _GemmState() for n in self._gemm_names}

    def collect_stats(self, enabled: bool = True) -> None:
        """Count overflowing and underflowing elements of every quantized operand (see ``fp8_stats``)."""
        for g in self.fp8_gemms.values():
            g.stats = {} if enabled else None

    @property
    def fp8_stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.fp8_gemms.values():
            for k, v in (g.stats or {}).items():
                out[k] = out.get(k, 0) + v
        return out

    def _update_forward_scales(self) -> None:
        for g in self.fp8_gemms.values():
            g._update_forward_scales()

    def _update_backward_scales(self) -> None:
        for g in self.fp8_gemms.values():
            g._update_backward_scales()

    def _linear(
        self, name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, is_first_microbatch: bool | None
    ) -> torch.Tensor:
        st = current_state()
        g = self.fp8_gemms[name]
        if st.enabled and not st.calibrating:
            recipe = get_recipe()
            _check_dims(x, w)
            g.ensure(recipe)
            g.group = st.group
            first = _register(self)
            acc = st.accumulator if st.accumulator is not None else self.accumulator
            dev = x.device.type
            if torch.is_autocast_enabled(dev):  # TE: activations, weights and output in the autocast dtype
                act = torch.get_autocast_dtype(dev)
                x, w = x.to(act), w.to(act)
                b = None if b is None else b.to(act)
            with torch.autocast(dev, enabled=False):  # our float32 GEMMs must not run in bf16
                return fp8_linear(x, w, b, g, recipe, acc, is_first_microbatch, first)
        if st.calibrating:
            recipe = get_recipe()
            if isinstance(recipe, DelayedScaling):
                g.ensure(recipe)
                g.group = st.group
                _register(self)
                for idx, t in ((0, x), (1, w)):
                    g.fwd.amax_history[0, idx] = np.fmax(g.fwd.amax_history[0, idx], np.float32(nan_skipping_amax(t)))
        return F.linear(x, w, b)

    def get_extra_state(self) -> dict[str, Any]:
        return {n: g.state() for n, g in self.fp8_gemms.items()}

    def set_extra_state(self, state: Any) -> None:
        if not state:
            return
        for n, st in state.items():
            self.fp8_gemms[n].load(st)


def _weight(rows: int, cols: int, dtype: torch.dtype, device: Any) -> nn.Parameter:
    w = nn.Parameter(torch.empty(rows, cols, dtype=dtype, device=device))
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's initialisation
    return w


def _bias(n: int, bias: bool, dtype: torch.dtype, device: Any) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(n, dtype=dtype, device=device)) if bias else None


def _ln_params(n: int, zero_centered_gamma: bool, dtype: torch.dtype, device: Any) -> tuple[nn.Parameter, nn.Parameter]:
    """LayerNorm gamma (ones, or zeros when zero-centred: gamma + 1 is applied) and beta."""
    init = torch.zeros if zero_centered_gamma else torch.ones
    return nn.Parameter(init(n, dtype=dtype, device=device)), nn.Parameter(torch.zeros(n, dtype=dtype, device=device))


def _layer_norm(
    inp: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float, zero_centered: bool
) -> torch.Tensor:
    return F.layer_norm(inp, (gamma.shape[0],), gamma + 1 if zero_centered else gamma, beta, eps)


class Linear(_FP8Base):
    """TE ``Linear(in_features, out_features, bias=True)``: ``y = x W^T + b``; FP8 inside autocast.

    ``accumulator``: the GEMM model for this module when autocast names none (None: exact products
    summed in float32; "hopper", "ada", "blackwell" or an fp8sim accumulator preset).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: Any = "cpu",
        accumulator: str | None = None,
    ) -> None:
        super().__init__(accumulator)
        dtype = params_dtype or torch.get_default_dtype()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _weight(out_features, in_features, dtype, device)
        self.bias = _bias(out_features, bias, dtype, device)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        return self._linear("gemm", inp, self.weight, self.bias, is_first_microbatch)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LayerNorm(nn.Module):
    """TE ``LayerNorm(hidden_size, eps=1e-5, zero_centered_gamma=False)`` (high precision)."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        *,
        zero_centered_gamma: bool = False,
        params_dtype: torch.dtype | None = None,
        device: Any = "cpu",
    ) -> None:
        super().__init__()
        dtype = params_dtype or torch.get_default_dtype()
        self.hidden_size, self.eps, self.zero_centered_gamma = hidden_size, eps, zero_centered_gamma
        self.weight, self.bias = _ln_params(hidden_size, zero_centered_gamma, dtype, device)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return _layer_norm(inp, self.weight, self.bias, self.eps, self.zero_centered_gamma)


class LayerNormLinear(_FP8Base):
    """TE ``LayerNormLinear``: LayerNorm (high precision) then an FP8 ``Linear``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        return_layernorm_output: bool = False,
        zero_centered_gamma: bool = False,
        params_dtype: torch.dtype | None = None,
        device: Any = "cpu",
        accumulator: str | None = None,
    ) -> None:
        super().__init__(accumulator)
        dtype = params_dtype or torch.get_default_dtype()
        self.in_features, self.out_features, self.eps = in_features, out_features, eps
        self.return_layernorm_output, self.zero_centered_gamma = return_layernorm_output, zero_centered_gamma
        self.layer_norm_weight, self.layer_norm_bias = _ln_params(in_features, zero_centered_gamma, dtype, device)
        self.weight = _weight(out_features, in_features, dtype, device)
        self.bias = _bias(out_features, bias, dtype, device)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        ln = _layer_norm(inp, self.layer_norm_weight, self.layer_norm_bias, self.eps, self.zero_centered_gamma)
        out = self._linear("gemm", ln, self.weight, self.bias, is_first_microbatch)
        return (out, ln) if self.return_layernorm_output else out


_ACTIVATIONS = {"gelu": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, "silu": F.silu}


class LayerNormMLP(_FP8Base):
    """TE ``LayerNormMLP``: LayerNorm, FP8 ``fc1``, activation, FP8 ``fc2`` (two FP8 GEMM states)."""

    _gemm_names = ("fc1", "fc2")

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        activation: str = "gelu",
        return_layernorm_output: bool = False,
        zero_centered_gamma: bool = False,
        params_dtype: torch.dtype | None = None,
        device: Any = "cpu",
        accumulator: str | None = None,
    ) -> None:
        super().__init__(accumulator)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(_ACTIVATIONS)}; got {activation!r}")
        dtype = params_dtype or torch.get_default_dtype()
        self.hidden_size, self.ffn_hidden_size, self.eps, self.activation = (
            hidden_size,
            ffn_hidden_size,
            eps,
            activation,
        )
        self.return_layernorm_output, self.zero_centered_gamma = return_layernorm_output, zero_centered_gamma
        self.layer_norm_weight, self.layer_norm_bias = _ln_params(hidden_size, zero_centered_gamma, dtype, device)
        self.fc1_weight = _weight(ffn_hidden_size, hidden_size, dtype, device)
        self.fc2_weight = _weight(hidden_size, ffn_hidden_size, dtype, device)
        self.fc1_bias = _bias(ffn_hidden_size, bias, dtype, device)
        self.fc2_bias = _bias(hidden_size, bias, dtype, device)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None) -> Any:
        ln = _layer_norm(inp, self.layer_norm_weight, self.layer_norm_bias, self.eps, self.zero_centered_gamma)
        h = _ACTIVATIONS[self.activation](self._linear("fc1", ln, self.fc1_weight, self.fc1_bias, is_first_microbatch))
        out = self._linear("fc2", h, self.fc2_weight, self.fc2_bias, is_first_microbatch)
        return (out, ln) if self.return_layernorm_output else out
