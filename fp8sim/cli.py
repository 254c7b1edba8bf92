"""The ``fp8sim`` command line: ``fp8sim formats``, ``fp8sim verify [--exhaustive]``."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .formats import FORMATS


def _fmt_float(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def _code(c: int | None) -> str:
    return "none" if c is None else f"0x{c:02x}"


def formats_table() -> str:
    """The format table as Markdown."""
    head = (
        "| format | aliases | bits | s/e/m | bias | max | min normal | min subnormal | eps | Inf | NaN | -0 "
        "| ml_dtypes | torch |"
    )
    lines = [head, "|" + "---|" * 14]
    for f in FORMATS.values():
        lines.append(
            f"| {f.name} | {', '.join(f.aliases)} | {f.bits} | {int(f.signed)}/{f.ebits}/{f.mbits} | {f.bias} "
            f"| {_fmt_float(f.max)} (0x{f.max_code:02x}) | {_fmt_float(f.min_normal)} | {_fmt_float(f.min_subnormal)} "
            f"| {_fmt_float(f.eps)} | {_code(f.inf_code)} "
            f"| {_code(f.nan_code)} | {'yes' if f.has_negative_zero else 'no'} "
            f"| {f.ml_dtypes_name or '-'} | {f.torch_name or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp8sim", description="Bit-exact FP8 emulator and numerics simulator.")
    ap.add_argument("--version", action="version", version=f"fp8sim {__version__}")
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("formats", help="print the table of formats")
    v = sub.add_parser("verify", help="conformance sweep against ml_dtypes, torch and the exact path")
    v.add_argument("--exhaustive", action="store_true", help="add all 2^32 float32 inputs for e4m3, e5m2, e8m0")
    v.add_argument("--format", action="append", dest="formats", choices=list(FORMATS), help="restrict to a format")
    v.add_argument("--no-torch", action="store_true", help="skip the torch backend and oracle")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = ap.parse_args(argv)

    if args.command == "formats":
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
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
