"""The issue-24 sweep against the installed ml_dtypes: ``nox -s ml_dtypes_sweep`` runs it on 0.5.0, 0.6.0 and
0.7.0 (``docs/versions.md`` records the results); ``python scripts/ml_dtypes_sweep.py`` runs it here.

Two counts per format, both policies, numpy and torch backends, on all float16 / bfloat16 inputs, 1M random
float32 patterns and every code midpoint +-1 ulp (float32 and float64):

- the ``ml_dtypes`` convention (the installed release's rule) against ml_dtypes: ``fp8sim.report.conformance``;
- fp8sim's core ``encode`` against ml_dtypes: zero from 0.7 on; before, the E8M0 rule differences the
  release's convention accounts for (and float64 double rounding).
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

import fp8sim
from fp8sim import conformance
from fp8sim.cast.conventions import ml_dtypes_rule


def _core_rows(torch: object | None) -> list[tuple[str, str, bool, str, int, int]]:
    """(format, backend, saturate, input width, comparisons, mismatches) of the core cast against ml_dtypes;
    input width "float64" for the float64 midpoint set, "<= float32" for every other input."""
    rows = []
    for f in fp8sim.FORMATS.values():
        if f.ml_dtype is None:
            continue
        makers = [gen for _, gen in conformance._inputs(quick=True)] + [lambda f=f: conformance._midpoints(f)]
        for sat in (False, True):
            counts: dict[tuple[str, str], list[int]] = {}
            for make in makers:
                for x in make():
                    want = conformance._ml_dtypes_codes(x, f, sat)
                    got = {"numpy": fp8sim.encode(x, f, saturate=sat)}
                    if torch is not None:
                        x32 = x.astype(np.float32) if x.dtype not in (np.float16, np.float64) else x
                        got["torch"] = fp8sim.encode(torch.from_numpy(x32), f, saturate=sat).numpy()
                    width = "float64" if x.dtype == np.float64 else "<= float32"
                    for backend, codes in got.items():
                        n, _ = conformance.count_mismatches(codes, want, f)
                        c = counts.setdefault((backend, width), [0, 0])
                        c[0] += codes.size
                        c[1] += n
            rows += [(f.name, b, sat, w, c[0], c[1]) for (b, w), c in counts.items()]
    return rows


def main() -> int:
    try:
        import torch
    except ImportError:
        torch = None
    t0 = time.time()
    rule = ml_dtypes_rule()
    print(f"## ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, torch {getattr(torch, '__version__', '-')}")
    print(f"\nrule `{rule.convention}`: {rule.summary}\n")
    cases = conformance.run(progress=False)
    oracle = conformance.ml_dtypes_oracle()
    conv = [c for c in cases if c.oracle == oracle]
    exact = [c for c in cases if c.oracle == "exact"]
    fmts = sorted({c.fmt for c in conv})
    print(f"- `ml_dtypes` convention vs ml_dtypes: {len(conv)} rows, {sum(c.cases for c in conv):,} comparisons, "
          f"**{sum(c.mismatches for c in conv):,} mismatches** ({len(fmts)} formats: {', '.join(fmts)})")  # fmt: skip
    print(f"- every mode vs the exact path: {len(exact)} rows, {sum(c.cases for c in exact):,} comparisons, "
          f"**{sum(c.mismatches for c in exact):,} mismatches**")  # fmt: skip
    core = _core_rows(torch)
    for width in ("<= float32", "float64"):
        rows = [r for r in core if r[3] == width]
        bad = [r for r in rows if r[5]]
        print(f"- core `encode` vs ml_dtypes, {width} inputs: {sum(r[4] for r in rows):,} comparisons, "
              f"**{sum(r[5] for r in rows):,} mismatches**"
              + "".join(f"\n  - {f} {b} saturate={s}: {m:,} of {n:,}" for f, b, s, _, n, m in bad))  # fmt: skip
    print(f"\n({time.time() - t0:.0f} s)")
    return 1 if any(c.mismatches for c in conv + exact) else 0


if __name__ == "__main__":
    sys.exit(main())
