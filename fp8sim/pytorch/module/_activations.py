"""The activations TE's ``LayerNormMLP`` accepts, with the formulas of TE's activation kernels.

Formulas as TE's own references write them (``tests/pytorch/test_fusible_ops.py``, the activation
test's "Plain PyTorch implementation"; ``clamped_swiglu`` as in ``module/layernorm_mlp.py``'s ONNX
path and ``test_fusible_ops.py``'s clamped SwiGLU test).  TE's kernels compute in float32 whatever
the input dtype; gated units (``*glu``) split the fc1 output in two halves, the first one gated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "GATED", "activation_fn"]


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = x.chunk(2, dim=-1)
    return a, b


def _qgelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _clamped_swiglu(x: torch.Tensor, limit: float = 7.0, alpha: float = 1.702, glu_linear_offset: float = 1.0):  # noqa: ANN202
    x_glu, x_linear = _halves(x)
    x_glu = x_glu.clamp(min=None, max=limit)
    x_linear = x_linear.clamp(min=-limit, max=limit)
    return x_glu * torch.sigmoid(alpha * x_glu) * (x_linear + glu_linear_offset)


ACTIVATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "geglu": lambda x: F.gelu(_halves(x)[0], approximate="tanh") * _halves(x)[1],
    "glu": lambda x: torch.sigmoid(_halves(x)[0]) * _halves(x)[1],
    "qgelu": _qgelu,
    "qgeglu": lambda x: _qgelu(_halves(x)[0]) * _halves(x)[1],
    "relu": F.relu,
    "reglu": lambda x: F.relu(_halves(x)[0]) * _halves(x)[1],
    "srelu": lambda x: F.relu(x) ** 2,
    "sreglu": lambda x: F.relu(_halves(x)[0]) ** 2 * _halves(x)[1],
    "silu": F.silu,
    "swiglu": lambda x: F.silu(_halves(x)[0]) * _halves(x)[1],
    "clamped_swiglu": _clamped_swiglu,
}
GATED = frozenset(n for n in ACTIVATIONS if n.endswith("glu"))


def activation_fn(name: str, params: dict[str, Any] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The float32 activation ``name`` (``params``: ``clamped_swiglu``'s ``limit``, ``alpha``,
    ``glu_linear_offset``; TE uses them for no other activation)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}; got {name!r}")
    fn = ACTIVATIONS[name]
    if name == "clamped_swiglu" and params:
        unknown = set(params) - {"limit", "alpha", "glu_linear_offset"}
        if unknown:
            raise ValueError(
                f"activation_params for clamped_swiglu: unknown {sorted(unknown)}; "
                "known: limit, alpha, glu_linear_offset"
            )
        return lambda x: _clamped_swiglu(x.float(), **params)  # float32 as every activation kernel
    return lambda x: fn(x.float())
