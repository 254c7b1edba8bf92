"""Where accelerate 1.15 does not do what its documentation says (spec 7.3, 7.4).

fp8sim reproduces upstream by default, so that a prediction matches what the real stack does, and
warns with an :class:`UpstreamQuirkWarning` naming the quirk.  ``documented=True`` on the helper,
``settings.documented = True`` or ``with documented_semantics():`` selects what the documentation
promises instead.  :data:`QUIRKS` lists every quirk by name.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from .._util.upstream_quirk import UpstreamQuirkWarning  # one class for every upstream fp8sim emulates

__all__ = ["UpstreamQuirkWarning", "QUIRKS", "settings", "documented_semantics"]

QUIRKS: dict[str, str] = {
    "amax_compute_algo-not-forwarded": (
        "TERecipeKwargs documents amax_compute_algo='most_recent' as its default, but to_kwargs() drops every value "
        "equal to that default, so the TE recipe is built with TE's own default 'max'."
    ),
    "convert_model-early-return": (
        "convert_model returns at the first nn.Linear with a weight dim not divisible by 16, so that layer and every "
        "later sibling (with its subtree) stay unconverted; documented: skip only that layer."
    ),
    "filter_first_and_last-as-filter": (
        "filter_first_and_last_linear_layers looks for the first and last Linear inside the module it is given; as a "
        "module_filter_fn that module is a single Linear, so it never excludes the model's first or last layer."
    ),
    "fp8recipekwargs-opt_level-unset": (
        "FP8RecipeKwargs.__post_init__ reaches TERecipeKwargs.__post_init__ only (MRO), so MSAMPRecipeKwargs's never "
        "runs: opt_level stays None (documented default 'O2' or ACCELERATE_FP8_OPT_LEVEL) and is not validated."
    ),
    "autowrap-unbound-forward": (
        "apply_fp8_autowrap assigns the wrapper as a plain function when model.forward has no __func__, so the first "
        "positional argument is taken as `self`; documented: bind the wrapper to the model."
    ),
    "ao-converted-weights-not-in-optimizer": (
        "with enable_fsdp_float8_all_gather=True (AORecipeKwargs' default) torchao's Float8Linear.from_float wraps "
        "each weight in a new Parameter, and Accelerator._prepare_ao re-points the optimizer only under FSDP2, so "
        "an optimizer built before prepare() never updates the converted layers' weights; documented: the "
        "optimizer holds the converted weights."
    ),
    "convert_model-reverse-params_dtype": (
        "convert_model(to_transformer_engine=False) passes params_dtype= to nn.Linear / nn.LayerNorm, which raises "
        "TypeError; documented: convert back with dtype=."
    ),
}


@dataclass
class _Settings:
    """Module-wide default for the ``documented`` switch of the accelerate helpers."""

    documented: bool = False


settings = _Settings()


@contextlib.contextmanager
def documented_semantics(enabled: bool = True) -> Iterator[None]:
    """Within the block, helpers without an explicit ``documented=`` follow accelerate's documentation."""
    saved = settings.documented
    settings.documented = enabled
    try:
        yield
    finally:
        settings.documented = saved


def use_documented(documented: bool | None) -> bool:
    return settings.documented if documented is None else bool(documented)


def warn_quirk(name: str, detail: str, stacklevel: int = 3) -> None:
    """Warn that upstream quirk ``name`` applied (``detail`` says where); the message names the switch."""
    if name not in QUIRKS:
        raise KeyError(f"unknown quirk {name!r}; known: {', '.join(QUIRKS)}")
    warnings.warn(
        f"accelerate quirk '{name}': {detail} (reproduced from accelerate 1.15; pass documented=True or set "
        "fp8sim.accelerate.settings.documented = True for the documented behaviour)",
        UpstreamQuirkWarning,
        stacklevel=stacklevel,
    )
