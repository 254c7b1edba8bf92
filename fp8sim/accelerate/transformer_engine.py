"""accelerate's TransformerEngine helpers (``utils/transformer_engine.py``, spec 7.3, 7.4) on fp8sim.pytorch.

The TE modules are fp8sim's emulations (:class:`fp8sim.pytorch.Linear` / ``LayerNorm``) and the
recipes come from :mod:`fp8sim.recipe`, so no TransformerEngine and no GPU are needed.  Upstream
quirks are reproduced and warned about unless ``documented=True`` (see :data:`QUIRKS`).  fp8sim
extension: ``amax_reduction_group`` is passed on to :func:`fp8sim.pytorch.autocast` (upstream
passes none, so TE reduces over the default group, which is what None does here too).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import Any

from torch import nn

from ..recipe import DelayedScaling, Format, MXFP8BlockScaling, Recipe
from ._quirks import use_documented, warn_quirk

__all__ = [
    "convert_model",
    "has_transformer_engine_layers",
    "contextual_fp8_autocast",
    "apply_fp8_autowrap",
    "te_recipe_from_handler",
]


def _te() -> Any:
    from .. import pytorch as te

    return te


def _copy_params(dst: nn.Module, src: nn.Module, has_bias: bool) -> None:
    dst.weight.copy_(src.weight)
    if has_bias:
        dst.bias.copy_(src.bias)


def _reverse_quirk(name: str, module: nn.Module) -> dict[str, Any]:
    warn_quirk(
        "convert_model-reverse-params_dtype",
        f"converting {name!r} back passes params_dtype= to torch.nn, which raises TypeError",
        stacklevel=4,
    )
    return {"params_dtype": module.weight.dtype}


def convert_model(
    model: nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
    *,
    documented: bool | None = None,
) -> None:
    """Swap ``nn.Linear`` / ``nn.LayerNorm`` for fp8sim's TE ``Linear`` / ``LayerNorm`` in place (or back).

    Call it under ``torch.no_grad()``, as accelerate does.  Upstream quirks (reproduced unless
    ``documented``): the first Linear with a weight dim not divisible by 16 ends the conversion of
    its siblings ("convert_model-early-return"), and the reverse direction raises TypeError
    ("convert_model-reverse-params_dtype").
    """
    te = _te()
    doc = use_documented(documented)
    children = list(model.named_children())
    for i, (name, module) in enumerate(children):
        if isinstance(module, nn.Linear) and to_transformer_engine and _convert_linear:
            has_bias = module.bias is not None
            if any(d % 16 != 0 for d in module.weight.shape):
                if doc:
                    continue
                rest = [n for n, _ in children[i:]]
                warn_quirk(
                    "convert_model-early-return",
                    f"nn.Linear {name!r} has weight shape {tuple(module.weight.shape)}; {rest} stay unconverted",
                )
                return
            new = te.Linear(
                module.in_features,
                module.out_features,
                bias=has_bias,
                params_dtype=module.weight.dtype,
                device=module.weight.device,
            )
            _copy_params(new, module, has_bias)
            setattr(model, name, new)
        elif isinstance(module, nn.LayerNorm) and to_transformer_engine and _convert_ln:
            has_bias = module.bias is not None
            w = module.weight
            new = te.LayerNorm(module.normalized_shape[0], eps=module.eps, params_dtype=w.dtype, device=w.device)
            _copy_params(new, module, has_bias)
            setattr(model, name, new)
        elif isinstance(module, te.Linear) and not to_transformer_engine and _convert_linear:
            has_bias = module.bias is not None  # accelerate's test: TE's empty tensor for "no bias" passes it
            if doc:
                has_bias = bool(getattr(module, "use_bias", has_bias))
            dtype_kw = {"dtype": module.weight.dtype} if doc else _reverse_quirk(name, module)
            new = nn.Linear(module.in_features, module.out_features, bias=has_bias, **dtype_kw)
            _copy_params(new, module, has_bias)
            setattr(model, name, new)
        elif isinstance(module, te.LayerNorm) and not to_transformer_engine and _convert_ln:
            size = getattr(module, "normalized_shape", (module.hidden_size,))[0]
            dtype_kw = {"dtype": module.weight.dtype} if doc else _reverse_quirk(name, module)
            new = nn.LayerNorm(size, eps=module.eps, **dtype_kw)
            _copy_params(new, module, True)
            setattr(model, name, new)
        else:
            convert_model(
                module,
                to_transformer_engine=to_transformer_engine,
                _convert_linear=_convert_linear,
                _convert_ln=_convert_ln,
                documented=documented,
            )


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """True if ``model`` holds an fp8sim TE ``LayerNorm``, ``Linear`` or ``TransformerLayer`` (TE's test:
    ``LayerNormLinear`` and ``LayerNormMLP`` alone do not count)."""
    te = _te()
    classes = tuple(c for c in (te.LayerNorm, te.Linear, getattr(te, "TransformerLayer", None)) if c is not None)
    return any(isinstance(m, classes) for m in model.modules())


def contextual_fp8_autocast(
    model_forward: Callable, fp8_recipe: Recipe, use_during_eval: bool = False, *, amax_reduction_group: Any = None
) -> Callable:
    """A ``forward(self, *args, **kwargs)`` running ``model_forward`` under fp8sim's TE autocast, enabled when
    ``use_during_eval or self.training``; ``forward.__wrapped__`` is ``model_forward``."""
    from ..pytorch import autocast

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        enabled = use_during_eval or self.training
        with autocast(enabled=enabled, recipe=fp8_recipe, amax_reduction_group=amax_reduction_group):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward
    return forward


def te_recipe_from_handler(fp8_recipe_handler: Any, *, documented: bool | None = None) -> tuple[Recipe, bool]:
    """The fp8sim recipe accelerate builds from a TE (or FP8) recipe handler, and ``use_autocast_during_eval``.

    Only ``to_kwargs()`` reaches the recipe, so values equal to the documented defaults are dropped:
    upstream never forwards ``amax_compute_algo="most_recent"`` and TE's "max" applies
    ("amax_compute_algo-not-forwarded"; ``documented=True`` forwards it).
    """
    kwargs = fp8_recipe_handler.to_kwargs() if fp8_recipe_handler is not None else {}
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(Format, kwargs["fp8_format"])
    use_during_eval = kwargs.pop("use_autocast_during_eval", False)
    use_mxfp8 = kwargs.pop("use_mxfp8_block_scaling", False)
    if use_mxfp8:  # fp8sim emulates MXFP8 everywhere: check_mxfp8_support() is always (True, "")
        if "amax_compute_algo" in kwargs:
            raise ValueError("`amax_compute_algo` is not supported for MXFP8 block scaling.")
        if "amax_history_len" in kwargs:
            raise ValueError("`amax_history_len` is not supported for MXFP8 block scaling.")
        return MXFP8BlockScaling(**kwargs), use_during_eval
    algo = getattr(fp8_recipe_handler, "amax_compute_algo", None)
    if algo is not None and "amax_compute_algo" not in kwargs:
        if use_documented(documented):
            kwargs["amax_compute_algo"] = algo
        elif algo != "max":
            warn_quirk(
                "amax_compute_algo-not-forwarded",
                f"the handler says amax_compute_algo={algo!r}; the recipe uses TE's default 'max'",
                stacklevel=4,
            )
    return DelayedScaling(**kwargs), use_during_eval


def apply_fp8_autowrap(
    model: nn.Module,
    fp8_recipe_handler: Any,
    *,
    documented: bool | None = None,
    amax_reduction_group: Any = None,
) -> nn.Module:
    """Wrap ``model.forward`` in fp8sim's TE autocast with the recipe built from ``fp8_recipe_handler``
    (:func:`te_recipe_from_handler`).  A forward without ``__func__`` is assigned unbound, as upstream
    does ("autowrap-unbound-forward"), unless ``documented``."""
    recipe, use_during_eval = te_recipe_from_handler(fp8_recipe_handler, documented=documented)
    new_forward = contextual_fp8_autocast(
        model.forward, recipe, use_during_eval, amax_reduction_group=amax_reduction_group
    )
    if hasattr(model.forward, "__func__") or use_documented(documented):
        model.forward = MethodType(new_forward, model)
    else:
        warn_quirk(
            "autowrap-unbound-forward",
            f"{type(model).__name__}.forward has no __func__; its first argument will be taken as `self`",
        )
        model.forward = new_forward
    return model
