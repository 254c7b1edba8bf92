"""The ``fp8sim`` command line: ``formats``, ``verify``, ``capture``, ``compare``, ``report``,
``study``, ``run``, ``explain``.

Exit status: 0 success, 1 a check failed (mismatches, a gate), 2 a usage or path error (one line
naming the argument, the path and the reason, printed before any work), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable

from . import __version__
from .formats import FORMATS


class UsageError(Exception):
    """A bad argument, path or missing dependency: one line on stderr, exit 2."""


def _int_range(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range; allowed: {lo} ... {hi}")
        return v

    parse.__name__ = "integer"
    return parse


def _device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: cpu, cuda, cuda:N")
    return text


_NO_PROGRESS = "no progress bar on stderr (bars are drawn only when stderr is a terminal)"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand but ``run`` (whose arguments belong to the script)."""
    from .report.training_study import STUDY_RECIPES

    ap = argparse.ArgumentParser(prog="fp8sim", description="Bit-exact FP8 emulator and numerics simulator.")
    ap.add_argument("--version", action="version", version=f"fp8sim {__version__}")
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("formats", help="print the table of formats")
    v = sub.add_parser("verify", help="conformance sweep against ml_dtypes, torch and the exact path")
    v.add_argument("--exhaustive", action="store_true", help="add all 2^32 float32 inputs for e4m3, e5m2, e8m0, ue5m3")
    v.add_argument("--format", action="append", dest="formats", choices=list(FORMATS), help="restrict to a format")
    v.add_argument("--no-torch", action="store_true", help="skip the torch backend and oracle")
    v.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    c = sub.add_parser("capture", help="record native results (torch casts, _scaled_mm, torchao) on this machine")
    c.add_argument("--out", required=True, help="capture file to write (e.g. reports/captures/h200.fp8cap)")
    c.add_argument("--device", default="cpu", type=_device, help="cpu, cuda or cuda:N (default cpu)")
    c.add_argument("--suite", default="quick", choices=["quick", "full"], help="quick: K up to 1024; full: up to 8192")
    c.add_argument("--force", action="store_true", help="overwrite an existing file")
    c.add_argument(
        "--torch-cpu-kernel",
        default="auto",
        choices=["auto", "fallback"],
        help="CPU _scaled_mm kernel: auto (this host's: oneDNN on AMX hosts) or fallback (oneDNN off; bit-exact "
        "to fp8sim on every host)",
    )
    c.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    m = sub.add_parser("compare", help="recompute a capture with the emulator and report the agreement")
    m.add_argument("file", help="a capture file from `fp8sim capture`")
    m.add_argument("--report", metavar="DIR", help="write report.md and plots into DIR (replaced whole)")
    m.add_argument(
        "--require-bit-exact",
        metavar="OPS",
        default="",
        help="comma-separated globs of op names that must be 100%% bit-exact (e.g. 'cast/*'); exit 1 otherwise, "
        "also when a glob matches no op or only skipped ones",
    )
    m.add_argument(
        "--ops", metavar="GLOBS", default="", help="compare only these ops (comma-separated globs; each must match)"
    )
    m.add_argument(
        "--infer",
        choices=["auto", "all", "none"],
        default="auto",
        help="name the rounding rule / accumulator that explains each op's outputs: auto (every cast, the GEMMs "
        "the device's accumulator misses; default), all, none",
    )
    m.add_argument("--force", action="store_true", help="replace a --report folder fp8sim did not write")
    m.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    r = sub.add_parser(
        "report", help="build the default report (the main job): formats, conformance, captures, studies"
    )
    r.add_argument("--out", default=DEFAULT_REPORT, help=f"output folder, replaced whole (default {DEFAULT_REPORT})")
    r.add_argument(
        "--captures",
        default=None,
        help="folder of .fp8cap files to include (default reports/captures, skipped where there is none)",
    )
    r.add_argument("--quick", action="store_true", help="smaller sweeps (for tests)")
    r.add_argument("--force", action="store_true", help="replace an --out folder fp8sim did not write")
    r.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    sub.add_parser(
        "run",
        help="run a script or module (e.g. pytest) with transformer_engine emulated by fp8sim: "
        "fp8sim run [OPTIONS] SCRIPT.py|-m MODULE|MODULE [ARGS...] (fp8sim run --help)",
    )
    st = sub.add_parser("study", help="train a small model under every recipe on the CPU; loss curves and a table")
    st.add_argument("--out", default=DEFAULT_STUDY, help=f"output folder, replaced whole (default {DEFAULT_STUDY})")
    st.add_argument(
        "--steps",
        type=_int_range(1, 100_000),
        default=150,
        help="training steps per recipe (1 ... 100000, default 150)",
    )
    st.add_argument(
        "--recipes",
        default="",
        help=f"comma-separated subset of the study's recipes (default all): {', '.join(STUDY_RECIPES)}",
    )
    st.add_argument("--force", action="store_true", help="replace an --out folder fp8sim did not write")
    st.add_argument("--no-progress", action="store_true", help=_NO_PROGRESS)
    st.add_argument(
        "--distributed", action="store_true", help="FP8 across 2-4 gloo ranks instead (all-gather, amax groups)"
    )
    st.add_argument("--world-size", type=int, default=2, help="ranks for --distributed (2-4, default 2)")
    from .run.explain import add_arguments

    ex = sub.add_parser(
        "explain",
        help="list every GEMM of a training step (or a TE script) under a recipe and an accumulator or device "
        "profile: shapes, formats, accumulator, split-K and where it was decided",
    )
    add_arguments(ex)
    return ap


DEFAULT_REPORT = "reports/latest"  # untracked (.gitignore): the main job never dirties the checkout
DEFAULT_STUDY = "reports/latest-study"  # untracked too
_COMMANDS = ("formats", "verify", "capture", "compare", "report", "run", "study", "explain")


def main(argv: list[str] | None = None) -> int:
    from ._util.atomic import install_signal_cleanup

    args_in = sys.argv[1:] if argv is None else list(argv)
    install_signal_cleanup()  # SIGTERM removes this process's temporary files
    command = args_in[0] if args_in else ""
    prog = f"fp8sim {command}" if command in _COMMANDS else "fp8sim"
    try:
        if command == "run":  # everything after the run options belongs to the script
            from .run._runargs import run_command

            return run_command(args_in[1:])
        return _dispatch(build_parser().parse_args(args_in))
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _check(fn: Callable, *args: object, **kw: object) -> object:
    """Run a pre-flight check; its OutputPathError or MissingDependency becomes a UsageError."""
    from ._util.deps import MissingDependency
    from ._util.outpaths import OutputPathError

    try:
        return fn(*args, **kw)
    except (OutputPathError, MissingDependency) as exc:
        raise UsageError(str(exc)) from None


def _dispatch(args: argparse.Namespace) -> int:
    from ._util.deps import require
    from ._util.outpaths import check_output_dir, check_output_file

    if args.command == "formats":
        from .report.build import formats_table

        print(formats_table())
        return 0
    if args.command == "verify":
        from .report.conformance import format_table, run

        backends = ("numpy",) if args.no_torch else ("numpy", "torch")
        if "torch" in backends:
            try:
                import torch  # noqa: F401
            except ImportError:
                print(
                    "torch is not installed: checking the numpy backend only (pip install 'fp8sim[torch]')",
                    file=sys.stderr,
                )
                backends = ("numpy",)
        cases = run(
            formats=tuple(args.formats) if args.formats else None,
            exhaustive=args.exhaustive,
            progress=not args.no_progress,
            backends=backends,
        )
        print(format_table(cases))
        return 1 if any(c.mismatches for c in cases) else 0
    if args.command == "capture":
        _check(require, "torch", "fp8sim capture")
        _check(check_output_file, args.out, force=args.force)
        from .native.capture import capture

        try:
            path = capture(
                args.out,
                device=args.device,
                suite=args.suite,
                force=args.force,
                progress=not args.no_progress,
                torch_cpu_kernel=args.torch_cpu_kernel,
            )
        except (FileExistsError, RuntimeError, ImportError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        print(f"wrote {path}")
        return 0
    if args.command == "compare":
        return _compare(args)
    if args.command == "report":
        _check(require, "matplotlib", "fp8sim report")
        _check(check_output_dir, args.out, force=args.force)
        if args.captures is None:  # outside a checkout there are no bundled captures: not an error
            args.captures = "reports/captures"
        elif not os.path.isdir(args.captures):
            raise UsageError(f"--captures {args.captures}: no such folder")
        from .report.build import build_default_report

        path = build_default_report(
            args.out, quick=args.quick, progress=not args.no_progress, captures=args.captures, force=args.force
        )
        print(f"wrote {path}")
        return 0
    if args.command == "study" and args.distributed:
        from .report.distributed_study import run_distributed_study, write_distributed_study

        _check(require, "torch", "fp8sim study --distributed")
        try:
            dres = run_distributed_study(args.world_size, steps=min(args.steps, 20))
            out = write_distributed_study(dres, args.out, force=args.force)
        except (ValueError, FileExistsError) as exc:
            raise UsageError(str(exc)) from None
        print(dres.table())
        print(f"wrote {out}")
        return 0
    if args.command == "study":
        from .report.training_study import STUDY_RECIPES, run_study, write_study

        recipes = tuple(r for r in args.recipes.split(",") if r) or STUDY_RECIPES
        unknown = [r for r in recipes if r not in STUDY_RECIPES]
        if unknown:
            raise UsageError(f"--recipes: unknown {', '.join(unknown)}; known: {', '.join(STUDY_RECIPES)}")
        _check(require, "torch", "fp8sim study")
        _check(require, "matplotlib", "fp8sim study")
        _check(check_output_dir, args.out, force=args.force)
        res = run_study(recipes, steps=args.steps, progress=not args.no_progress)
        print(res.table())
        print(f"wrote {write_study(res, args.out, force=args.force)}")
        return 0
    if args.command == "explain":
        from .gemm.profiles import SplitKUnknownError
        from .run.explain import ExplainUsageError, run_explain

        _check(require, "torch", "fp8sim explain")
        try:
            return int(_check(run_explain, args))
        except ExplainUsageError as exc:
            raise UsageError(str(exc)) from None
        except SplitKUnknownError as exc:  # --compute met a GEMM the profile cannot decide
            print(f"fp8sim explain: {exc}", file=sys.stderr)
            return 1
    build_parser().print_help()
    print(f"fp8sim: a command is required; one of {', '.join(_COMMANDS)}", file=sys.stderr)
    return 2


def _compare(args: argparse.Namespace) -> int:
    from ._util.deps import require
    from ._util.outpaths import check_input_file, check_output_dir
    from .native.compare import compare_capture
    from .native.fileformat import CaptureFileError

    if not os.path.lexists(args.file):
        raise UsageError(f"{args.file}: no such file")
    _check(check_input_file, args.file)
    if args.report:
        _check(require, "matplotlib", "fp8sim compare --report")
        _check(check_output_dir, args.report, force=args.force)
    only = [p for p in args.ops.split(",") if p]
    required = [p for p in args.require_bit_exact.split(",") if p]
    try:
        res = compare_capture(args.file, progress=not args.no_progress, ops=only or None, infer=args.infer)
    except CaptureFileError as exc:
        raise UsageError(str(exc)) from None
    for o in res.ops:
        status = f"skipped: {o.skipped}" if o.skipped else f"{o.rate:9.4%} bit-exact, max ULP {o.max_ulp:g}"
        for key, what in (("rule_inference", "rule"), ("accumulator_inference", "accumulator")):
            if key in o.extra:  # which rounding rule / accumulator explains the outputs
                status += f"; {what}: {o.extra[key]['text']}"
        if "split_inference" in o.extra:  # which split-K reproduces a mismatching GEMM
            status += f"; {o.extra['split_inference']['text']}"
        print(f"{o.name:<64} {status}")
    for note in res.notes:
        print(f"NOTE: {note}")
    if args.report:
        from .report.build import write_compare_report

        print(f"wrote {write_compare_report(res, args.report, force=args.force)}")
    problems = res.vacuous(only, "--ops") + res.vacuous(required, "--require-bit-exact")
    for msg in problems:
        print(f"GATE FAILED: {msg}", file=sys.stderr)
    bad = res.failing(required)
    for o in bad:
        print(f"NOT BIT-EXACT (required): {o.name}: {o.n - o.bit_exact} of {o.n} differ", file=sys.stderr)
    print(res.summary())
    return 1 if bad or problems else 0


if __name__ == "__main__":
    sys.exit(main())
