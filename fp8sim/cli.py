"""The ``fp8sim`` command line: ``formats``, ``verify``, ``capture``, ``compare``, ``report``."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .formats import FORMATS


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    if args_in[:1] == ["run"]:  # everything after `run` belongs to the script (no option parsing here)
        from .shim import run

        return run(args_in[1:])
    ap = argparse.ArgumentParser(prog="fp8sim", description="Bit-exact FP8 emulator and numerics simulator.")
    ap.add_argument("--version", action="version", version=f"fp8sim {__version__}")
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("formats", help="print the table of formats")
    v = sub.add_parser("verify", help="conformance sweep against ml_dtypes, torch and the exact path")
    v.add_argument("--exhaustive", action="store_true", help="add all 2^32 float32 inputs for e4m3, e5m2, e8m0")
    v.add_argument("--format", action="append", dest="formats", choices=list(FORMATS), help="restrict to a format")
    v.add_argument("--no-torch", action="store_true", help="skip the torch backend and oracle")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c = sub.add_parser("capture", help="record native results (torch casts, _scaled_mm, torchao) on this machine")
    c.add_argument("--out", required=True, help="capture file to write (e.g. reports/captures/h200.fp8cap)")
    c.add_argument("--device", default="cpu", help="cpu or cuda[:index] (default cpu)")
    c.add_argument("--suite", default="quick", choices=["quick", "full"], help="quick: K up to 1024; full: up to 8192")
    c.add_argument("--force", action="store_true", help="overwrite an existing file")
    c.add_argument("--no-progress", action="store_true")
    m = sub.add_parser("compare", help="recompute a capture with the emulator and report the agreement")
    m.add_argument("file", help="a capture file from `fp8sim capture`")
    m.add_argument("--report", metavar="DIR", help="write report.md and plots into DIR")
    m.add_argument(
        "--require-bit-exact",
        metavar="OPS",
        default="",
        help="comma-separated globs of op names that must be 100%% bit-exact (e.g. 'cast/*'); exit 1 otherwise",
    )
    m.add_argument("--ops", metavar="GLOBS", default="", help="compare only these ops (comma-separated globs)")
    m.add_argument("--no-progress", action="store_true")
    r = sub.add_parser(
        "report", help="build the default report (the main job): formats, conformance, captures, studies"
    )
    r.add_argument("--out", default="reports/default", help="output folder (default reports/default)")
    r.add_argument("--captures", default="reports/captures", help="folder of .fp8cap files to include")
    r.add_argument("--quick", action="store_true", help="smaller sweeps (for tests)")
    r.add_argument("--no-progress", action="store_true")
    sub.add_parser(
        "run",
        help="run a script or module (e.g. pytest) with transformer_engine emulated by fp8sim: fp8sim run X.py ...",
    )
    st = sub.add_parser("study", help="train a small model under every recipe on the CPU; loss curves and a table")
    st.add_argument("--out", default="reports/study", help="output folder (default reports/study)")
    st.add_argument("--steps", type=int, default=150)
    st.add_argument("--recipes", default="", help="comma-separated subset of the study's recipes (default: all)")
    st.add_argument("--no-progress", action="store_true")
    st.add_argument(
        "--distributed", action="store_true", help="FP8 across 2-4 gloo ranks instead (all-gather, amax groups)"
    )
    st.add_argument("--world-size", type=int, default=2, help="ranks for --distributed (2-4, default 2)")
    st.add_argument("--force", action="store_true", help="overwrite an existing --distributed result")
    args = ap.parse_args(args_in)

    if args.command == "formats":
        from .report import formats_table

        print(formats_table())
        return 0
    if args.command == "verify":
        from .conformance import format_table, run

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
        from .native.capture import capture

        try:
            path = capture(
                args.out, device=args.device, suite=args.suite, force=args.force, progress=not args.no_progress
            )
        except (FileExistsError, RuntimeError, ImportError, ValueError) as exc:
            print(f"fp8sim capture: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
        return 0
    if args.command == "compare":
        from .native.compare import compare_capture
        from .native.fileformat import CaptureFileError

        try:
            only = [p for p in args.ops.split(",") if p] or None
            res = compare_capture(args.file, progress=not args.no_progress, ops=only)
        except (CaptureFileError, FileNotFoundError) as exc:
            print(f"fp8sim compare: {exc}", file=sys.stderr)
            return 2
        for o in res.ops:
            status = f"skipped: {o.skipped}" if o.skipped else f"{o.rate:9.4%} bit-exact, max ULP {o.max_ulp:g}"
            if "split_inference" in o.extra:  # which split-K reproduces a mismatching GEMM
                status += f"; {o.extra['split_inference']['text']}"
            print(f"{o.name:<64} {status}")
        if args.report:
            from .report import write_compare_report

            print(f"wrote {write_compare_report(res, args.report)}")
        patterns = [p for p in args.require_bit_exact.split(",") if p]
        bad = res.failing(patterns)
        for o in bad:
            print(f"NOT BIT-EXACT (required): {o.name}: {o.n - o.bit_exact} of {o.n} differ", file=sys.stderr)
        return 1 if bad else 0
    if args.command == "report":
        from .report import build_default_report

        path = build_default_report(args.out, quick=args.quick, progress=not args.no_progress, captures=args.captures)
        print(f"wrote {path}")
        return 0
    if args.command == "study" and args.distributed:
        from .distributed.study import run_distributed_study, write_distributed_study

        try:
            dres = run_distributed_study(args.world_size, steps=min(args.steps, 20))
            out = write_distributed_study(dres, args.out, force=args.force)
        except (ValueError, ImportError, FileExistsError) as exc:
            print(f"fp8sim study: {exc}", file=sys.stderr)
            return 2
        print(dres.table())
        print(f"wrote {out}")
        return 0
    if args.command == "study":
        from .study import STUDY_RECIPES, run_study, write_study

        recipes = tuple(r for r in args.recipes.split(",") if r) or STUDY_RECIPES
        try:
            res = run_study(recipes, steps=args.steps, progress=not args.no_progress)
        except (ValueError, ImportError) as exc:
            print(f"fp8sim study: {exc}", file=sys.stderr)
            return 2
        print(res.table())
        print(f"wrote {write_study(res, args.out)}")
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
