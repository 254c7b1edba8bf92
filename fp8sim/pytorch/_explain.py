"""``explain``: every GEMM of one training step, as a table (``fp8sim explain``'s Python face).

What mmaemu's ``explain`` says about one ``scaled_mm`` call, for a whole program: for each GEMM the module
that runs it, its role (fprop, dgrad, wgrad; attention's QK^T, PV, dV, dP, dQ, dK), M/N/K, operand formats
and scaling, output dtype, accumulator, split-K and where the decision came from (the profile's table, its
envelope, a split given with ``with_splits``).  By default the step runs on fp8sim's cheap default path while
each plan is the one the requested accumulator or profile would run (``compute=True`` runs it, and an unknown
split raises instead of being listed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..gemm.plans import PlanRecorder, record_plans
from ..recipe import Recipe
from .quantization import autocast

__all__ = ["explain", "record_gemm_plans"]


def _namer(model: Any) -> Callable[[Any], str | None]:
    names = {}
    if model is not None:  # the path in the model; the root by TE's name= (else its class)
        names = {id(m): n or getattr(m, "name", None) or type(m).__name__ for n, m in model.named_modules()}
    return lambda m: names.get(id(m))


@contextlib.contextmanager
def record_gemm_plans(model: Any = None, dry: bool = False) -> Iterator[PlanRecorder]:
    """Record the plan of every GEMM fp8sim's TE modules, ``general_gemm``, FP8 attention and torchao's
    ``Float8Linear`` run inside (modules named by their path in ``model`` where given); ``dry=True`` computes
    them on the cheap default path and lists unknown splits instead of raising.  Yields the
    :class:`~fp8sim.gemm.plans.PlanRecorder` (``.table()``, ``.plans``, ``.to_dict()``)."""
    with record_plans(dry=dry, namer=_namer(model)) as rec:
        yield rec


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(out, dict):
        return _first_tensor(list(out.values()))
    return None


def _call(model: Any, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def explain(
    model: Any,
    inputs: Any,
    *,
    recipe: Recipe | None = None,
    accumulator: Any = None,
    compute: bool = False,
    backward: bool = True,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> PlanRecorder:
    """One step of ``model`` on ``inputs`` (a tensor, a tuple of positional arguments or a dict of keyword
    arguments) inside ``autocast(recipe=recipe, accumulator=accumulator)``, then, with ``backward``, the
    backward of ``loss(output)`` (default: the float32 sum of the first tensor of the output).  Returns the
    recorder of every GEMM's plan; ``print(explain(...))`` prints the table."""
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an fp8sim.recipe recipe (DelayedScaling, ...), got {type(recipe).__name__}")
    with record_gemm_plans(model, dry=not compute) as rec:
        with autocast(enabled=True, recipe=recipe, accumulator=accumulator):
            out = _call(model, inputs)
        if backward:
            y = loss(out) if loss is not None else _first_tensor(out)
            if not isinstance(y, torch.Tensor) or not y.requires_grad:
                raise ValueError(
                    "explain: backward=True needs an output (or loss(output)) that requires grad; the model's "
                    f"first output is {type(y).__name__}"
                    + ("" if y is None else " without grad")
                    + ": pass backward=False for the forward GEMMs only"
                )
            (y.float().sum() if loss is None else y).backward()
    return rec
