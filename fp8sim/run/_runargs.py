"""``fp8sim run``: its own options, then what ``python`` would take (``SCRIPT.py``, ``-m MODULE``,
``-c CODE``), then the script's arguments, untouched.

``fp8sim run [--help] [OPTIONS] SCRIPT.py|-m MODULE|-c CODE|MODULE [ARGS...]``: a bare name that is
not a file but a module name runs as ``-m`` (``fp8sim run pytest tests/``).  A missing script is
refused as ``python`` refuses it (exit 2).  Options for the emulation are added to
:func:`run_parser`; the first argument that is not one of them starts the command line.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

__all__ = ["run_parser", "split_run_args", "run_command"]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PYTHON_STARTS = ("-m", "-c")


def run_parser() -> argparse.ArgumentParser:
    """The options of ``fp8sim run`` itself (those before the script or ``-m``)."""
    ap = argparse.ArgumentParser(
        prog="fp8sim run",
        usage="fp8sim run [-h] [OPTIONS] (SCRIPT.py | -m MODULE | -c CODE | MODULE) [ARGS ...]",
        description="Run a Python script or module with transformer_engine emulated by fp8sim (CPU, no CUDA). "
        "Everything from the script, -m or -c on is passed to python unchanged.",
        epilog="examples: fp8sim run train.py --steps 10; fp8sim run -m pytest tests/; fp8sim run pytest -q; "
        "fp8sim run --device-map cuda=cpu --scaled-mm hopper_fast train.py",
    )
    ap.add_argument(
        "--device-map",
        metavar="cuda=cpu",
        help="run scripts that hard-code CUDA (.cuda(), device='cuda', torch.cuda.is_available()) on the CPU",
    )
    ap.add_argument(
        "--scaled-mm",
        metavar="ACCUMULATOR|PROFILE",
        help="route every torch._scaled_mm call to fp8sim's scaled_mm with this accumulator or device profile",
    )
    ap.add_argument("--quiet", action="store_true", help="no banner (also FP8SIM_QUIET=1)")
    return ap


def split_run_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(fp8sim run's options, python's argument list) of ``fp8sim run ARGV``.  Raises SystemExit as
    argparse does for ``--help`` (0) and bad options (2)."""
    ap = run_parser()
    takes_value = {s for a in ap._actions if a.nargs != 0 for s in a.option_strings}
    i, own = 0, []
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a in _PYTHON_STARTS or a == "-":
            break
        n = 2 if a in takes_value else 1
        own += argv[i : i + n]
        i += n
    opts = ap.parse_args(own)
    rest = argv[i:]
    if not rest:
        ap.error("missing the script, -m MODULE or -c CODE to run")
    target = rest[0]
    if target in _PYTHON_STARTS or target == "-" or os.path.exists(target):
        return opts, rest
    if _MODULE.match(target) and not target.endswith(".py"):
        return opts, ["-m", *rest]  # fp8sim run pytest ...: as python -m pytest
    return opts, rest  # a missing file: run_command refuses it as python does


def run_command(argv: list[str]) -> int:
    """Parse ``fp8sim run ARGV`` and run it under the shim; the exit status is the script's."""
    try:
        opts, py_argv = split_run_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    target = py_argv[0]
    if target not in _PYTHON_STARTS and target != "-" and not os.path.exists(target):
        # python's own words for a missing script, and its exit status
        sys.stderr.write(
            f"fp8sim run: can't open file {os.path.abspath(target)!r}: [Errno 2] No such file or directory\n"
        )
        return 2
    from .._util.deps import MissingDependency, check

    try:
        check("torch", "fp8sim run")
    except MissingDependency as exc:
        sys.stderr.write(f"fp8sim run: {exc}\n")
        return 2
    from .shim import run

    own: list[str] = []  # the shim's own options go first; it stops reading them at the script
    if opts.device_map is not None:
        own += ["--device-map", opts.device_map]
    if opts.scaled_mm is not None:
        own += ["--scaled-mm", opts.scaled_mm]
    if opts.quiet:
        own.append("--quiet")
    return run([*own, *py_argv])
