"""accelerate's torchao helpers (``utils/ao.py``, spec 7.4) on fp8sim.torchao.

By default (``module_filter_func=None``) :func:`convert_model_to_fp8_ao` leaves the model's first and
last ``nn.Linear`` and every Linear with a dim not divisible by 16 in high precision.
:func:`filter_first_and_last_linear_layers` reproduces its upstream quirk
("filter_first_and_last-as-filter"); ``documented=True`` makes ``convert_model_to_fp8_ao`` apply
it to the whole model instead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ._quirks import use_documented, warn_quirk

__all__ = [
    "find_first_last_linear_layers",
    "filter_linear_layers",
    "filter_first_and_last_linear_layers",
    "has_ao_layers",
    "convert_model_to_fp8_ao",
]


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The names of the first and last ``nn.Linear`` in ``model.named_modules()`` order (None if there is none)."""
    first = last = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            if first is None:
                first = name
            last = name
    return first, last


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """False for an ``nn.Linear`` with in or out features not divisible by 16 and for ``fqn in layers_to_filter``."""
    if isinstance(module, torch.nn.Linear) and (module.in_features % 16 != 0 or module.out_features % 16 != 0):
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """Upstream's filter: excludes the first and last Linear *of* ``module`` (so, used as a
    ``module_filter_fn`` on a leaf Linear, only a root Linear with fqn "" is excluded)."""
    first, last = find_first_last_linear_layers(module)
    if fqn and first == "":
        warn_quirk(
            "filter_first_and_last-as-filter",
            f"called on the single Linear {fqn!r}, it cannot exclude the model's first or last layer "
            "(convert_model_to_fp8_ao(..., documented=True) applies it to the whole model)",
        )
    return filter_linear_layers(module, fqn, layers_to_filter=[first, last])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """True if ``model`` holds an fp8sim.torchao ``Float8Linear``."""
    from ..torchao import Float8Linear

    return any(isinstance(m, Float8Linear) for m in model.modules())


def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Any = None,
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None,
    *,
    documented: bool | None = None,
) -> None:
    """Swap the ``nn.Linear`` layers of ``model`` for fp8sim.torchao ``Float8Linear`` in place.

    ``module_filter_func=None`` skips the first and last Linear (found on the whole model) and those
    with a dim not divisible by 16.  A root Linear is not converted (torchao returns a new module
    that accelerate discards).  ``config``: an fp8sim ``Float8LinearConfig`` (None: its defaults).
    """
    from ..torchao import convert_to_float8_training

    first, last = find_first_last_linear_layers(model)
    whole_model = partial(filter_linear_layers, layers_to_filter=[first, last])
    if module_filter_func is None:
        module_filter_func = whole_model
    elif module_filter_func is filter_first_and_last_linear_layers and use_documented(documented):
        module_filter_func = whole_model
    convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
