"""All 2^32 float32 bit patterns for e4m3, e5m2 and e8m0 against ml_dtypes (nearest-even,
saturating and not), on the numpy and torch backends.  Slow: `pytest -m slow`."""

from __future__ import annotations

import pytest

from fp8sim.report import conformance


@pytest.mark.slow
@pytest.mark.parametrize("name", conformance.EXHAUSTIVE_FORMATS)
def test_all_float32_patterns_match_ml_dtypes(name: str) -> None:
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
