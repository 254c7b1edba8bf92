"""torchao's ``float8_linear_utils``: swapping ``nn.Linear`` modules for :class:`Float8Linear`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ..gemm import Accumulator
from .config import Float8LinearConfig
from .linear import Float8Linear, _check_accumulator

__all__ = ["swap_linear_layers", "convert_to_float8_training"]


def swap_linear_layers(
    module: nn.Module,
    from_float_func: Callable[[nn.Linear], nn.Linear],
    *,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Replace each ``nn.Linear`` (subclasses included) passing ``module_filter_fn(module, fqn)``,
    children before parents; a root Linear is returned converted, not changed in place."""
    if isinstance(module, nn.Linear) and (module_filter_fn is None or module_filter_fn(module, "")):
        if len(list(module.children())) > 0:
            raise AssertionError(f"Does not support a root nn.Linear with children: {module}")
        return from_float_func(module)

    def visit(mod: nn.Module, fqn: str, parent: nn.Module | None) -> None:
        for name, child in mod.named_children():
            visit(child, f"{fqn}.{name}" if fqn else name, mod)
        if isinstance(mod, nn.Linear) and (module_filter_fn is None or module_filter_fn(mod, fqn)):
            if parent is None:  # only a filter that changes its answer for the root gets here
                raise AssertionError(f"Linear root module should return early: {mod}")
            setattr(parent, fqn.split(".")[-1], from_float_func(mod))

    visit(module, "", None)
    return module


def convert_to_float8_training(
    module: nn.Module,
    *,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
    config: Float8LinearConfig | None = None,
    accumulator: str | Accumulator | None = None,
) -> nn.Module:
    """Swap the ``nn.Linear`` modules of ``module`` for :class:`Float8Linear` (torchao's semantics:
    post-order, filter called as ``(module, fqn)`` for Linears only, a root Linear returned)."""
    config = Float8LinearConfig() if config is None else config
    _check_accumulator(accumulator)
    return swap_linear_layers(
        module,
        lambda m: Float8Linear.from_float(m, config=config, accumulator=accumulator),
        module_filter_fn=module_filter_fn,
    )
