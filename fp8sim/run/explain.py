"""``fp8sim explain``: the plan of every GEMM of a model's training step, or of a TE script's run.

``fp8sim explain [OPTIONS] TARGET [ARGS ...]`` with TARGET

* ``MODULE:CALLABLE`` or ``FILE.py:CALLABLE``: a callable (no arguments) returning ``(model, inputs)``;
  ``inputs`` is a tensor, a tuple of positional arguments or a dict of keyword arguments.  One forward inside
  ``autocast(recipe=--recipe, accumulator=--accumulator)`` and the backward of the float32 sum of the first
  output (``--forward-only``: none) run; one row per GEMM, modules named by their path in the model.
* ``SCRIPT.py``: the script runs in this process with ``transformer_engine`` emulated (as under ``fp8sim
  run``), ``ARGS`` as its ``sys.argv[1:]``; its own ``autocast`` regions name the recipe, ``--accumulator``
  applies to all of them; one row per distinct GEMM with its number of calls.

TE is emulated in both forms, so the callable's module may ``import transformer_engine.pytorch as te``.
By default the GEMMs run on fp8sim's cheap default path while each row is the plan of ``--accumulator``
(``--compute``: run them with it; an unknown split-K then stops the run).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import runpy
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["RECIPES", "ExplainUsageError", "add_arguments", "run_explain"]

RECIPES = ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling")


class ExplainUsageError(Exception):
    """A bad TARGET, option or callable result: one line, exit status 2."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``fp8sim explain``'s options and positionals."""
    ap.add_argument(
        "target",
        metavar="TARGET",
        help="MODULE:CALLABLE or FILE.py:CALLABLE returning (model, inputs), or SCRIPT.py to run",
    )
    ap.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments (SCRIPT.py only)")
    ap.add_argument(
        "--recipe",
        choices=RECIPES,
        default=None,
        help="the recipe of the step (MODULE:CALLABLE only; default DelayedScaling; a script names its own)",
    )
    ap.add_argument(
        "--accumulator",
        metavar="PROFILE|PRESET|DEVICE",
        default=None,
        help="a device profile (e.g. h100_pcie_cublaslt_12_8_te), accumulator preset or device (hopper, ada, "
        "blackwell); default: fp8sim's default path (exact products, float32 sum)",
    )
    ap.add_argument(
        "--compute",
        action="store_true",
        help="compute the GEMMs with --accumulator (slow; an unknown split-K stops the run) instead of the cheap "
        "default path",
    )
    ap.add_argument("--forward-only", action="store_true", help="no backward step (MODULE:CALLABLE only)")
    ap.add_argument("--json", metavar="FILE", help="also write the plans to FILE (format fp8sim-gemm-plans/1)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing --json FILE")


@contextlib.contextmanager
def _emulated_te() -> Iterator[None]:
    """``transformer_engine`` resolves to fp8sim inside (the shim, as ``fp8sim run`` installs it)."""
    from .shim import install, is_installed, uninstall

    mine = not is_installed()
    if mine:
        install(quiet=True)
    try:
        yield
    finally:
        if mine:
            uninstall()


def _load_callable(target: str) -> Any:
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise ExplainUsageError(f"TARGET {target}: no such file {where!r}")
        namespace = runpy.run_path(where, run_name="__fp8sim_explain__")
    else:
        try:
            namespace = vars(importlib.import_module(where))
        except ImportError as exc:
            raise ExplainUsageError(f"TARGET {target}: cannot import module {where!r}: {exc}") from None
    fn = namespace.get(name)
    if not callable(fn):
        raise ExplainUsageError(f"TARGET {target}: {where} has no callable {name!r}")
    return fn


def _model_and_inputs(target: str) -> tuple[Any, Any]:
    import torch

    got = _load_callable(target)()
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], torch.nn.Module)):
        raise ExplainUsageError(
            f"TARGET {target}: the callable must return (model, inputs) with model a torch.nn.Module; "
            f"got {type(got).__name__}"
        )
    return got[0], got[1]


def _check(args: argparse.Namespace) -> str:
    """The TARGET's kind ("callable" or "script"), or ExplainUsageError."""
    from ..pytorch.quantization import check_accumulator

    try:
        check_accumulator(args.accumulator)
    except ValueError as exc:
        raise ExplainUsageError(f"--accumulator: {exc}") from None
    target = args.target
    if ":" in target and not os.path.exists(target):
        if args.args:
            raise ExplainUsageError(f"ARGS {' '.join(args.args)!r}: only a SCRIPT.py takes arguments")
        return "callable"
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ExplainUsageError(f"TARGET {target}: no such file")
        if args.recipe is not None:
            raise ExplainUsageError("--recipe applies to MODULE:CALLABLE; a script's autocast names its own recipe")
        if args.forward_only:
            raise ExplainUsageError("--forward-only applies to MODULE:CALLABLE; a script runs its own steps")
        return "script"
    raise ExplainUsageError(f"TARGET {target!r}: expected MODULE:CALLABLE, FILE.py:CALLABLE or SCRIPT.py")


def _run_script(path: str, argv: list[str], accumulator: Any, compute: bool) -> tuple[Any, int]:
    from ..pytorch._explain import record_gemm_plans
    from ..pytorch.quantization import current_state

    st = current_state()
    saved_acc, saved_argv = st.accumulator, sys.argv
    st.accumulator = accumulator  # every autocast region of the script inherits it
    status = 0
    try:
        with record_gemm_plans(dry=not compute) as rec:
            sys.argv = [path, *argv]
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        st.accumulator, sys.argv = saved_acc, saved_argv
    return rec, status


def run_explain(args: argparse.Namespace) -> int:
    """Run ``fp8sim explain`` (parsed ``args``); print the table; the exit status (a script's own if it failed)."""
    from .._util.outpaths import check_output_file

    kind = _check(args)
    if args.json:
        check_output_file(args.json, force=args.force)
    with _emulated_te():
        if kind == "script":
            rec, status = _run_script(args.target, args.args, args.accumulator, args.compute)
        else:
            from .. import recipe as recipes
            from ..pytorch._explain import explain

            model, inputs = _model_and_inputs(args.target)
            recipe = getattr(recipes, args.recipe or "DelayedScaling")()
            rec = explain(
                model,
                inputs,
                recipe=recipe,
                accumulator=args.accumulator,
                compute=args.compute,
                backward=not args.forward_only,
            )
            status = 0
    print(rec.table() if rec.plans else "no GEMM ran under fp8sim's TE modules, general_gemm, FP8 attention or torchao")
    if args.json:
        from .._util.atomic import atomic_file

        with atomic_file(args.json, force=args.force) as f:
            f.write((rec.to_json() + "\n").encode())
        print(f"wrote {args.json}")
    return status
