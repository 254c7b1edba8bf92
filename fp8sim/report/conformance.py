"""Conformance sweep: fp8sim's codes against ml_dtypes, torch and its own exact path.

Used by ``fp8sim verify``.  Every case is one (format, rounding, saturate, backend, input set)
row: the number of inputs compared and how many codes differ (two NaN codes count as equal).
Oracles:

- ``ml_dtypes``: ``astype`` (saturate=False) and clip-to-finfo-then-``astype`` (saturate=True),
  nearest-even only, against the ``ml_dtypes`` convention: the rule of the installed release
  (:func:`fp8sim.cast.conventions.ml_dtypes_rule`; from ml_dtypes 0.7 on it is the core cast itself).
  Formats the installed ml_dtypes lacks (UE5M3 before 0.7) have no such rows.
- ``torch``: the ``torch_eager`` convention against torch's own ``.to(float8)`` on the CPU.
- ``exact``: the float64 rounding algorithm (for every mode), against which the table, stochastic
  and torch paths are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from .._util.progress import Progress
from ..cast import ROUNDING_MODES, encode
from ..cast._rounding import round_codes
from ..cast._tables import code_values
from ..cast.conventions import CONVENTIONS, Convention, ml_dtypes_rule
from ..formats import FORMATS, FloatFormat

EXHAUSTIVE_FORMATS = ("e4m3", "e5m2", "e8m0", "ue5m3")
_CHUNK = 1 << 24


@dataclass
class Case:
    fmt: str
    rounding: str
    saturate: bool
    backend: str
    oracle: str
    inputs: str
    cases: int = 0
    mismatches: int = 0
    first: str = ""


def count_mismatches(got: np.ndarray, want: np.ndarray, fmt: FloatFormat) -> tuple[int, int]:
    """(number of differing codes, index of the first), NaN codes compared by class."""
    nan = np.isnan(code_values(fmt))
    bad = (got != want) & ~(nan[got] & nan[want])
    n = int(bad.sum())
    return n, int(np.argmax(bad)) if n else -1


def _ml_dtypes_codes(x: np.ndarray, fmt: FloatFormat, saturate: bool) -> np.ndarray:
    """ml_dtypes' codes: ``astype``, after clipping to finfo (in the input's float width) when saturating."""
    with np.errstate(invalid="ignore", over="ignore"):
        if saturate:
            fi = ml_dtypes.finfo(fmt.ml_dtype)
            wide = np.float64 if x.dtype == np.float64 else np.float32
            x = np.clip(x.astype(wide), wide(fi.min), wide(fi.max))
        return x.astype(fmt.ml_dtype).view(np.uint8)


def ml_dtypes_oracle() -> str:
    """The oracle's name in the rows: ``ml_dtypes <version> (<rule>)``."""
    return f"ml_dtypes {ml_dtypes.__version__} ({ml_dtypes_rule().convention})"


def _ml_convention(saturate: bool) -> Convention:
    return replace(CONVENTIONS["ml_dtypes"], saturate=saturate)


def _midpoints(fmt: FloatFormat) -> Iterator[np.ndarray]:
    """Every midpoint between neighbouring codes (and the half step above max) and one ulp on either
    side, signed: in float32, then in float64 (one float64 ulp off a midpoint: single rounding)."""
    v = code_values(fmt)
    fin = np.unique(np.abs(v[np.isfinite(v)]))
    step = fin[-1] - fin[-2] if fin.size > 1 else fin[-1]
    pts = np.concatenate([(fin[1:] + fin[:-1]) / 2, [fin[-1] + step / 2]])
    m32 = pts.astype(np.float32)
    x32 = np.concatenate([m32, np.nextafter(m32, np.float32(np.inf)), np.nextafter(m32, np.float32(0))])
    x64 = np.concatenate([pts, np.nextafter(pts, np.inf), np.nextafter(pts, 0.0)])
    yield np.concatenate([x32, -x32])
    yield np.concatenate([x64, -x64])


def _inputs(quick: bool) -> Iterator[tuple[str, Callable[[], Iterator[np.ndarray]]]]:
    def f16() -> Iterator[np.ndarray]:
        yield np.arange(1 << 16, dtype=np.uint16).view(np.float16)

    def bf16() -> Iterator[np.ndarray]:
        yield np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)

    def f32_sample() -> Iterator[np.ndarray]:
        rng = np.random.default_rng(20261129)
        yield rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)

    yield "float16 (all 65,536)", f16
    yield "bfloat16 (all 65,536)", bf16
    yield "float32 (1M random bit patterns)", f32_sample


def _f32_exhaustive() -> Iterator[np.ndarray]:
    for start in range(0, 1 << 32, _CHUNK):
        yield np.arange(start, start + _CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _torch() -> object | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def run(
    formats: tuple[str, ...] | None = None,
    exhaustive: bool = False,
    progress: bool = True,
    backends: tuple[str, ...] = ("numpy", "torch"),
) -> list[Case]:
    """Run the sweep; ``exhaustive`` adds all 2^32 float32 patterns for :data:`EXHAUSTIVE_FORMATS`."""
    torch = _torch() if "torch" in backends else None
    fmts = [FORMATS[n] for n in (formats or tuple(FORMATS))]
    sets = list(_inputs(quick=not exhaustive))
    jobs: list[tuple[FloatFormat, str, Callable[[], Iterator[np.ndarray]], int]] = []
    for f in fmts:
        for label, gen in sets:
            jobs.append((f, label, gen, 1))
        jobs.append((f, "code midpoints +-1 ulp (float32, float64)", lambda f=f: _midpoints(f), 1))
        if exhaustive and f.name in EXHAUSTIVE_FORMATS:
            jobs.append((f, "float32 (all 2^32)", _f32_exhaustive, (1 << 32) // _CHUNK))
    bar = Progress(sum(j[3] for j in jobs), progress)
    cases: list[Case] = []
    for f, label, gen, _ in jobs:
        rows: dict[tuple, Case] = {}
        offset = 0
        for x in gen():
            _check_chunk(x, f, label, torch, rows, exhaustive=label.endswith("2^32)"), offset=offset)
            offset += x.size
            bar.step(f"{f.name} {label}")
        cases.extend(rows.values())
    return cases


def _record(
    rows: dict, key: tuple, got: np.ndarray, want: np.ndarray, fmt: FloatFormat, x: np.ndarray, offset: int
) -> None:
    case = rows.setdefault(key, Case(fmt.name, *key))
    n, i = count_mismatches(got, want, fmt)
    case.cases += got.size
    if n and not case.mismatches:
        g, w = int(got.reshape(-1)[i]), int(want.reshape(-1)[i])
        case.first = f"x={x.reshape(-1)[i]!r} (#{offset + i}) got 0x{g:02x} want 0x{w:02x}"
    case.mismatches += n


def _check_chunk(
    x: np.ndarray, f: FloatFormat, label: str, torch: object | None, rows: dict, exhaustive: bool, offset: int
) -> None:
    x32 = x.astype(np.float32) if x.dtype not in (np.float16, np.float64) else x
    oracle = ml_dtypes_oracle()
    for sat in (False, True) if f.ml_dtype is not None else ():
        want = _ml_dtypes_codes(x, f, sat)
        conv = _ml_convention(sat)
        got = conv.encode(x, f)
        _record(rows, ("nearest_even", sat, "numpy", oracle, label), got, want, f, x, offset)
        if torch is not None:
            got_t = conv.encode(torch.from_numpy(x32), f).numpy()
            _record(rows, ("nearest_even", sat, "torch", oracle, label), got_t, want, f, x, offset)
    if exhaustive:
        return  # the 2^32 sweep checks nearest-even against ml_dtypes only (see module docstring)
    with np.errstate(invalid="ignore"):
        x64 = x.astype(np.float64)
    for mode in ROUNDING_MODES:
        for sat in (False, True):
            seed = 7 if mode == "stochastic" else None
            if mode == "stochastic":
                from ..cast._random import numpy_bits

                rbits = numpy_bits(7, 0, x64.size).astype(np.int64)
                ref = round_codes(np, x64, f, mode, sat, rbits).astype(np.uint8)
            else:
                ref = round_codes(np, x64, f, mode, sat).astype(np.uint8)
            got = encode(x, f, rounding=mode, saturate=sat, seed=seed)
            _record(rows, (mode, sat, "numpy", "exact", label), got, ref, f, x, offset)
            if torch is not None:
                got_t = encode(torch.from_numpy(x32), f, rounding=mode, saturate=sat, seed=seed).numpy()
                _record(rows, (mode, sat, "torch", "exact", label), got_t, ref, f, x, offset)
    if torch is not None and f.torch_dtype is not None:
        t = torch.from_numpy(x32)
        conv = CONVENTIONS["torch_eager"]
        want = t.to(f.torch_dtype).view(torch.uint8).numpy()
        _record(
            rows, ("nearest_even", None, "torch_eager", "torch", label), conv.encode(t, f).numpy(), want, f, x, offset
        )


def format_table(cases: list[Case]) -> str:
    """Markdown table of the sweep."""
    head = "| format | rounding | saturate | backend | oracle | inputs | cases | mismatches |"
    lines = [head, "|---|---|---|---|---|---|---:|---:|"]
    for c in cases:
        sat = "-" if c.saturate is None else str(c.saturate)
        row = (c.fmt, c.rounding, sat, c.backend, c.oracle, c.inputs, f"{c.cases:,}", f"{c.mismatches:,}")
        lines.append("| " + " | ".join(row) + " |")
    bad = [c for c in cases if c.mismatches]
    total = sum(c.cases for c in cases)
    lines.append("")
    lines.append(f"{len(cases)} rows, {total:,} comparisons, {sum(c.mismatches for c in cases):,} mismatches")
    for c in bad:
        lines.append(f"MISMATCH {c.fmt} {c.rounding} saturate={c.saturate} {c.backend} vs {c.oracle}: {c.first}")
    return "\n".join(lines)
