"""A testing kit for FP8 code: bit-exact assertions, comparison statistics, fp8sim as the oracle,
Hypothesis strategies and an opt-in pytest plugin.

- :func:`assert_bit_exact`, :func:`assert_within_ulp`: element-by-element bit-pattern checks with
  a failure message that names the differing indices, values, hex patterns and ULP distances.
- :func:`compare` -> :class:`ComparisonResult`: exact share, ULP histogram, where mismatches sit;
  Markdown table (``str()``) and a histogram plot (matplotlib).
- :func:`assert_matches_emulator` / :func:`emulate`: recompute a cast, a TE recipe's quantizer or a
  ``scaled_mm`` with fp8sim and check a result against it.
- ``fp8sim.testing.strategies``: Hypothesis strategies (imports hypothesis).
- ``fp8sim.testing.pytest_plugin``: ``--fp8sim`` / ``fp8sim = true`` enables a ``gpu`` marker and an
  ``fp8_recipe`` fixture.
- ``fp8sim.testing.oracles``: ``require`` / ``require_feature`` import a test's oracle, or skip with the
  install hint; under ``CI=true`` a missing oracle fails (imports pytest).

Importing this package needs only numpy and ml_dtypes.
"""

from __future__ import annotations

from .assertions import (
    HISTOGRAM_BUCKETS,
    MISMATCH_CLASSES,
    ComparisonResult,
    assert_bit_exact,
    assert_within_ulp,
    compare,
)
from .emulator import CAST_OPS, assert_matches_emulator, emulate

__all__ = [
    "assert_bit_exact",
    "assert_within_ulp",
    "compare",
    "ComparisonResult",
    "HISTOGRAM_BUCKETS",
    "MISMATCH_CLASSES",
    "assert_matches_emulator",
    "emulate",
    "CAST_OPS",
]
