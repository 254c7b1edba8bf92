"""Parameter construction shared by the modules: TE's splits, initialisers and empty biases."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..._util.args import as_int
from ..utils import get_default_init_method, init_method_constant

__all__ = [
    "split_names",
    "make_linear_params",
    "make_norm_params",
    "cat_params",
    "materialize_meta_parameter",
    "size_arg",
]


def size_arg(value: Any, name: str, *, none: bool = False) -> Any:
    """A module's size argument (features, heads, channels) as an int >= 1, before torch sees it (torch's
    ``empty()`` message names no argument); every integral type, bools and floats refused."""
    if none and value is None:
        return None
    return as_int(value, name, lo=1)


def split_names(parameters_split: Any, out_features: int) -> tuple[list[str], list[str], list[int]]:
    """TE ``Linear``'s parameter split: weight names, bias names and split sizes (``linear.py``)."""
    if parameters_split is None:
        return ["weight"], ["bias"], [out_features]
    if not parameters_split:
        raise ValueError("Cannot split weight buffer into 0 parameters")
    if isinstance(parameters_split, dict):
        names, sizes = list(parameters_split), [int(v) for v in parameters_split.values()]
    elif all(isinstance(n, str) for n in parameters_split):
        names = list(parameters_split)
        sizes = [out_features // len(names)] * len(names)
    else:
        raise TypeError("Invalid configuration for parameters split")
    if sum(sizes) != out_features:
        raise ValueError(f"Trying to split weight buffer (out_features={out_features}) with split sizes {sizes}")
    return [f"{n.rstrip('_')}_weight" for n in names], [f"{n.rstrip('_')}_bias" for n in names], sizes


def resolve_params_dtype(params_dtype: torch.dtype | None) -> torch.dtype:
    """TE's ``params_dtype`` default: ``torch.get_default_dtype()`` when None."""
    return params_dtype if params_dtype is not None else torch.get_default_dtype()


def make_linear_params(
    module: nn.Module,
    out_features: int,
    in_features: int,
    *,
    bias: bool,
    init_method: Callable | None,
    parameters_split: Any,
    dtype: torch.dtype,
    device: Any,
    prefix: str = "",
) -> tuple[list[str], list[str]]:
    """Register TE's weight (and bias) parameters on ``module``: one buffer, split into views; bias
    zero-initialised; without bias each bias name holds an empty tensor, as TE represents it."""
    init_method = init_method or get_default_init_method()
    wnames, bnames, sizes = split_names(parameters_split, out_features)
    wnames, bnames = [prefix + n for n in wnames], [prefix + n for n in bnames]
    if len(sizes) > 1 and getattr(module, "primary_weights_in_fp8", False):
        raise RuntimeError("Splitting QuantizedTensor into multiple params is not supported")  # TE linear.py
    weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
    bias_t = torch.empty(out_features, dtype=dtype, device=device) if bias else None
    bounds = [(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(len(sizes))]
    for wn, (a, b) in zip(wnames, bounds, strict=True):  # weights first: TE keeps them adjacent
        module.register_parameter(wn, nn.Parameter(weight[a:b]), init_fn=init_method)
    for bn, (a, b) in zip(bnames, bounds, strict=True):
        if bias_t is not None:
            module.register_parameter(bn, nn.Parameter(bias_t[a:b]), init_fn=init_method_constant(0.0))
        else:
            setattr(module, bn, torch.Tensor().to(dtype=dtype, device=device))
    return wnames, bnames


def make_norm_params(
    module: nn.Module,
    n: int,
    *,
    normalization: str,
    zero_centered_gamma: bool,
    dtype: torch.dtype,
    device: Any,
) -> None:
    """``layer_norm_weight`` (ones, zeros when zero-centred) and ``layer_norm_bias`` (LayerNorm only); TE's
    ``fwd_ln_sm_margin`` / ``bwd_ln_sm_margin`` / ``inf_ln_sm_margin`` from ``NVTE_{FWD,BWD,INF}_LAYERNORM_SM_MARGIN``
    (layernorm_linear.py 1589-1591: SMs the norm kernels leave free, which changes no value)."""
    for kind in ("fwd", "bwd", "inf"):
        setattr(module, f"{kind}_ln_sm_margin", int(os.getenv(f"NVTE_{kind.upper()}_LAYERNORM_SM_MARGIN", "0")))
    w = nn.Parameter(torch.empty(n, dtype=dtype, device=device))
    module.register_parameter("layer_norm_weight", w, init_fn=init_method_constant(float(not zero_centered_gamma)))
    if normalization == "LayerNorm":
        b = nn.Parameter(torch.empty(n, dtype=dtype, device=device))
        module.register_parameter("layer_norm_bias", b, init_fn=init_method_constant(0.0))
    else:
        module.layer_norm_bias = None


def cat_params(module: nn.Module, names: list[str]) -> torch.Tensor:
    """The full tensor of split parameters (TE's ``noop_cat``)."""
    ts = [getattr(module, n) for n in names]
    return ts[0] if len(ts) == 1 else torch.cat(ts)


def materialize_meta_parameter(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter:
    """TE ``base.py`` ``reset_parameters``: a parameter on ``meta`` is replaced by an uninitialised one on
    the device (fp8sim's is the CPU) before its ``init_fn`` runs; requires_grad and attributes carry over."""
    new = nn.Parameter(torch.empty_like(param, device="cpu"), requires_grad=param.requires_grad)
    new.__dict__.update(param.__dict__)
    nn.Module.register_parameter(module, name, new)
    return new
