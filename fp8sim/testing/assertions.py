"""Bit-level comparison of two arrays or tensors: ``assert_bit_exact`` and ``compare``.

Both read their operands as bit patterns (see ``fp8sim.testing`` for the rules): of the operands'
own dtype, or, with ``fmt``, as codes of that format.  Two NaNs are equal whatever their sign and
payload; everything else is equal only when the bit patterns are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._util.args import as_int
from ..formats import FloatFormat
from . import _bits
from ._bits import Encoding, Side

__all__ = ["assert_bit_exact", "compare", "ComparisonResult", "HISTOGRAM_BUCKETS", "MISMATCH_CLASSES"]

_UPPER = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1023], np.float64)
HISTOGRAM_BUCKETS: tuple[str, ...] = (
    "0",
    "1",
    "2",
    "3-4",
    "5-8",
    "9-16",
    "17-32",
    "33-64",
    "65-128",
    "129-256",
    "257-512",
    "513-1023",
    ">=1024",
    "NaN vs number",
)
"""Labels of :attr:`ComparisonResult.histogram`: ULP distances, and NaN against a non-NaN."""

MISMATCH_CLASSES: tuple[str, ...] = ("overflow", "tie", "nan_inf", "saturation", "signed_zero", "subnormal", "other")
"""Classes of differing elements, in priority order (each mismatch counts once, in the first class
it fits); ``overflow`` and ``tie`` need ``inputs=``."""


@dataclass(frozen=True)
class _Pair:
    enc: Encoding
    a: Side
    e: Side
    av: np.ndarray  # float64 values, flat
    ev: np.ndarray
    equal: np.ndarray
    nan_mismatch: np.ndarray
    ulp: np.ndarray  # uint64, flat; 0 where either is NaN
    shape: tuple[int, ...]


def _pair(actual: Any, expected: Any, fmt: str | FloatFormat | None) -> _Pair:
    f = _bits.fmt_or_none(fmt)
    a = _bits.read(actual, f, "actual")
    e = _bits.read(expected, f, "expected")
    if a.bits.shape != e.bits.shape:
        raise AssertionError(f"shape mismatch: actual has shape {a.bits.shape}, expected {e.bits.shape}")
    if a.enc != e.enc:
        raise AssertionError(
            f"dtype mismatch: actual is {a.enc.name}, expected is {e.enc.name}; bit patterns of different dtypes "
            "cannot be compared: cast one of them, or pass fmt= to compare both as codes of a format"
        )
    enc = a.enc
    ab, eb = a.bits.reshape(-1), e.bits.reshape(-1)
    an, en = _bits.isnan(enc, ab), _bits.isnan(enc, eb)
    both_nan = an & en
    ulp = np.where(an | en, np.uint64(0), _bits.ulp_distance(enc, ab, eb))
    return _Pair(
        enc,
        a,
        e,
        _bits.values(enc, ab),
        _bits.values(enc, eb),
        (ab == eb) | both_nan,
        an ^ en,
        ulp,
        tuple(a.bits.shape),
    )


def _describe(side: Side, value: float, i: int, enc: Encoding) -> str:
    code = _bits.hex_of(enc, int(side.bits.reshape(-1)[i]))
    shown = int(value) if enc.kind == "int" else float(value)
    if side.shown is None:
        return f"{shown!r} ({enc.name} {code})"
    raw = _bits.hex_of(side.shown, int(side.shown_bits.reshape(-1)[i]))
    return f"{shown!r} ({side.shown.name} {raw}, {enc.name} {code})"


def _ulp_text(p: _Pair, i: int) -> str:
    if p.nan_mismatch[i]:
        return "ULP n/a (NaN vs number)"
    return f"{int(p.ulp[i])} ULP"


def _lines(p: _Pair, idx: np.ndarray) -> list[str]:
    out = []
    for i in idx:
        i = int(i)
        where = list(map(int, np.unravel_index(i, p.shape))) if p.shape else "()"
        out.append(
            f"  {where}: actual {_describe(p.a, p.av[i], i, p.enc)} | "
            f"expected {_describe(p.e, p.ev[i], i, p.enc)} | {_ulp_text(p, i)}"
        )
    return out


def _max_ulp(p: _Pair, mask: np.ndarray) -> int:
    sel = mask & ~p.nan_mismatch
    return int(p.ulp[sel].max()) if sel.any() else 0


def _failure(p: _Pair, bad: np.ndarray, max_report: int, budget: int | None = None) -> str:
    n, total = int(bad.sum()), bad.size
    if budget is None:
        head = f"not bit-exact: {n} of {total} elements differ ({_bits.pct(n, total)})"
    else:
        diff = int((~p.equal).sum())
        head = (
            f"not within {budget} ULP: {n} of {total} elements ({_bits.pct(n, total)}) are further apart "
            f"({diff} differ at all)"
        )
    head += f", compared as {p.enc.describe()} (NaNs equal by class)"
    if (bad & ~p.nan_mismatch).any():
        head += f"; max ULP distance {_max_ulp(p, bad)}"
    nans = int((bad & p.nan_mismatch).sum())
    if nans:
        head += f"; {nans} NaN vs number"
    idx = np.flatnonzero(bad)[: max(int(max_report), 0)]
    lines = [head, f"first {idx.size} (index: actual | expected | distance):", *_lines(p, idx)]
    if n > idx.size:
        lines.append(f"  ... and {n - idx.size} more")
    return "\n".join(lines)


def assert_bit_exact(actual: Any, expected: Any, fmt: str | FloatFormat | None = None, *, max_report: int = 10) -> None:
    """Assert that ``actual`` and ``expected`` hold the same bit patterns, element by element.

    Operands: numpy arrays, torch tensors (any device; moved to the CPU), Python numbers or lists;
    same shape required.  Without ``fmt`` both must have the same dtype (float16, bfloat16, float32,
    float64, an ml_dtypes / torch float8 or FP4/FP6 dtype, or an integer dtype) and its bit patterns
    are compared.  With ``fmt`` each operand may be integer codes of ``fmt`` or floats whose values
    lie on ``fmt``'s grid (any float dtype; otherwise ValueError), and the codes are compared.  NaNs
    compare equal by class (any sign, any payload); -0 and +0 differ.

    On failure raises AssertionError with the count and share of differing elements, and for the
    first ``max_report`` of them the multi-dimensional index, both values in decimal and hex (the
    operand's own bit pattern, and its code in ``fmt``) and their ULP distance: the number of steps
    between the two patterns among the encoding's ordered non-NaN patterns (-0 just below +0).
    Shape and dtype mismatches raise AssertionError too.
    """
    p = _pair(actual, expected, fmt)
    bad = ~p.equal
    if bad.any():
        raise AssertionError(_failure(p, bad, max_report))


def assert_within_ulp(
    actual: Any, expected: Any, fmt: str | FloatFormat | None = None, *, ulp_budget: int = 0, max_report: int = 10
) -> None:
    """As :func:`assert_bit_exact`, but elements up to ``ulp_budget`` ULPs apart pass.  A NaN
    against a number always fails.  The message leads with the worst element."""
    ulp_budget = as_int(ulp_budget, "ulp_budget", lo=0)
    p = _pair(actual, expected, fmt)
    bad = ~p.equal & (p.nan_mismatch | (p.ulp > np.uint64(ulp_budget)))
    if not bad.any():
        return
    score = np.where(p.nan_mismatch, np.inf, p.ulp.astype(np.float64))
    worst = int(np.argmax(np.where(bad, score, -1.0)))
    head, rest = _failure(p, bad, max_report, int(ulp_budget)).split("\n", 1)
    worst_line = "worst: " + _lines(p, np.array([worst]))[0].lstrip()
    raise AssertionError(f"{head}\n{worst_line}\n{rest}")


# -- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ComparisonResult:
    """How far ``actual`` is from ``expected``, element by element (see :func:`compare`).

    ``histogram`` counts every element by ULP distance (:data:`HISTOGRAM_BUCKETS`; equal elements
    and NaN pairs are 0); ``classes`` counts the differing elements by where they sit
    (:data:`MISMATCH_CLASSES`).  ``max_ulp`` and ``mean_ulp`` leave out NaN-vs-number pairs, which
    ``nan_mismatches`` counts.  ``ulp`` holds each element's distance (float64, inf for NaN vs
    number) in the operands' shape.
    """

    size: int
    matches: int
    max_ulp: int
    mean_ulp: float
    nan_mismatches: int
    histogram: dict[str, int]
    classes: dict[str, int]
    encoding: str
    ulp: np.ndarray = field(repr=False)

    @property
    def mismatches(self) -> int:
        return self.size - self.matches

    @property
    def exact_fraction(self) -> float:
        """Share of bit-exact elements (1.0 for empty operands)."""
        return self.matches / self.size if self.size else 1.0

    def table(self) -> str:
        """The result as Markdown tables: summary, ULP histogram, mismatch classes."""
        rows = [
            f"| compared as | {self.encoding} |",
            "|---|---|",
            f"| elements | {self.size:,} |",
            f"| bit-exact | {self.matches:,} ({_bits.pct(self.matches, self.size)}) |",
            f"| max ULP | {self.max_ulp:,} |",
            f"| mean ULP | {self.mean_ulp:.4g} |",
            f"| NaN vs number | {self.nan_mismatches:,} |",
            "",
            "| ULP distance | elements | share |",
            "|---|---|---|",
        ]
        rows += [f"| {k} | {v:,} | {_bits.pct(v, self.size)} |" for k, v in self.histogram.items() if v or k == "0"]
        if self.mismatches:
            rows += ["", "| mismatch class | elements | share of mismatches |", "|---|---|---|"]
            rows += [f"| {k} | {v:,} | {_bits.pct(v, self.mismatches)} |" for k, v in self.classes.items() if v]
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()

    def plot(self, path: Any = None, *, title: str | None = None) -> Any:
        """Bar chart of :attr:`histogram` (log count axis) as a matplotlib Figure, saved to ``path``
        when given (format from the suffix).  Uses no pyplot state (Agg canvas)."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as err:
            raise ImportError("ComparisonResult.plot needs matplotlib: pip install matplotlib") from err
        fig = Figure(figsize=(8, 3.6), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        labels = list(self.histogram)
        counts = [self.histogram[k] for k in labels]
        colors = ["tab:green"] + ["tab:orange"] * (len(labels) - 2) + ["tab:red"]
        ax.bar(range(len(labels)), counts, color=colors)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        if any(counts):
            ax.set_yscale("symlog", linthresh=1)
        ax.set_xlabel("ULP distance")
        ax.set_ylabel("elements")
        ax.set_title(title or f"{self.encoding}: {self.exact_fraction:.4%} bit-exact, max {self.max_ulp} ULP")
        if path is not None:
            fig.savefig(path)
        return fig


def compare(
    actual: Any, expected: Any, fmt: str | FloatFormat | None = None, *, inputs: Any = None
) -> ComparisonResult:
    """Statistics of how ``actual`` differs from ``expected`` (operands as :func:`assert_bit_exact`).

    Each differing element gets one class, the first that fits, in this order:

    - ``overflow``: ``|input| >`` the largest finite value of the encoding (needs ``inputs``);
    - ``tie``: the input lies exactly halfway between two adjacent finite values of the encoding
      (``fmt``, else the operands' dtype), so the rounding's tie rule decides (needs ``inputs``);
    - ``nan_inf``: either value is NaN or +-Inf;
    - ``saturation``: either value is +-max of the encoding (``fmt``'s max, else the dtype's);
    - ``signed_zero``: +0 against -0;
    - ``subnormal``: either value is subnormal in the encoding (a flush to zero lands here);
    - ``other``.

    ``inputs``: the high-precision values the results were rounded from (any float array of the
    same size), e.g. ``x * scale`` for a scaled cast.
    """
    p = _pair(actual, expected, fmt)
    n = p.equal.size
    bad = ~p.equal
    finite = ~p.nan_mismatch
    ulp_f = np.where(p.nan_mismatch, np.inf, p.ulp.astype(np.float64))
    bucket = np.searchsorted(_UPPER, ulp_f, side="left")
    counts = np.bincount(np.where(p.nan_mismatch, len(_UPPER) + 1, bucket), minlength=len(HISTOGRAM_BUCKETS))
    histogram = {k: int(c) for k, c in zip(HISTOGRAM_BUCKETS, counts, strict=True)}
    classes = _classify(p, bad, inputs)
    return ComparisonResult(
        size=n,
        matches=int(p.equal.sum()),
        max_ulp=_max_ulp(p, np.ones(n, bool)),
        mean_ulp=float(p.ulp[finite].astype(np.float64).mean()) if finite.any() else 0.0,
        nan_mismatches=int(p.nan_mismatch.sum()),
        histogram=histogram,
        classes=classes,
        encoding=p.enc.describe(),
        ulp=ulp_f.reshape(p.shape),
    )


def _classify(p: _Pair, bad: np.ndarray, inputs: Any) -> dict[str, int]:
    enc, av, ev = p.enc, p.av, p.ev
    tests: dict[str, np.ndarray] = {}
    if inputs is not None:
        x = _bits.to_numpy(inputs, "inputs")
        if x.size != bad.size:
            raise ValueError(f"inputs has {x.size} elements; actual and expected have {bad.size}")
        with np.errstate(invalid="ignore", over="ignore"):
            x = x.astype(np.float64).reshape(-1)
            tests["overflow"] = np.abs(x) > enc.max
        tests["tie"] = _bits.midpoint(enc, x)
    with np.errstate(invalid="ignore"):
        tests["nan_inf"] = ~np.isfinite(av) | ~np.isfinite(ev)
        tests["saturation"] = (np.abs(av) == enc.max) | (np.abs(ev) == enc.max)
        tests["signed_zero"] = (av == 0) & (ev == 0) & (np.signbit(av) != np.signbit(ev))
        tests["subnormal"] = _bits.is_subnormal(enc, av) | _bits.is_subnormal(enc, ev)
    left = bad.copy()
    out: dict[str, int] = {}
    for name in MISMATCH_CLASSES:
        if name in ("overflow", "tie") and inputs is None:
            continue
        hit = left & tests[name] if name != "other" else left
        out[name] = int(hit.sum())
        left &= ~hit
    return out
