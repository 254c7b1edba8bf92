"""All 2^32 float32 bit patterns for e4m3, e5m2, e8m0 and ue5m3 against the installed ml_dtypes (nearest-even,
saturating and not, through the ``ml_dtypes`` convention of its release), on the numpy and torch backends;
and the whole conformance sweep (every format, mode, policy and backend; ``fp8sim verify``), the one
``docs/versions.md`` records for ml_dtypes 0.5.0, 0.6.0 and 0.7.0.  Slow: `pytest -m slow`."""

from __future__ import annotations

import pytest
from conftest import ml_dtype

from fp8sim.report import conformance


@pytest.mark.slow
@pytest.mark.parametrize("name", conformance.EXHAUSTIVE_FORMATS)
def test_all_float32_patterns_match_ml_dtypes(name: str) -> None:
    ml_dtype(name)  # UE5M3 needs ml_dtypes >= 0.7 (skipped with the reason before)
    backends = ("numpy", "torch")
    cases = [
        c
        for c in conformance.run(formats=(name,), exhaustive=True, progress=False, backends=backends)
        if c.inputs.endswith("2^32)")
    ]
    assert {c.backend for c in cases} >= {"numpy"}
    assert all(c.cases == 1 << 32 for c in cases)
    bad = [f"{c.rounding} saturate={c.saturate} {c.backend}: {c.mismatches} ({c.first})" for c in cases if c.mismatches]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_conformance_sweep_has_no_mismatch_against_the_installed_releases() -> None:
    """f16/bf16 (all), 1M random float32, code midpoints +-1 ulp (float32 and float64), every format the
    installed ml_dtypes has, both policies, numpy and torch backends (where torch is installed)."""
    cases = conformance.run(progress=False)
    assert any(c.oracle == conformance.ml_dtypes_oracle() for c in cases)
    bad = [f"{c.fmt} {c.rounding} sat={c.saturate} {c.backend} vs {c.oracle}: {c.first}" for c in cases if c.mismatches]
    assert not bad, "\n".join(bad[:20])
