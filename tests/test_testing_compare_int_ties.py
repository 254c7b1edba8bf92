"""``compare(..., inputs=)`` on integer operands (an int8 quantizer's output, say): an input halfway between two
consecutive integers is a ``tie``, as the docstring states for any encoding (before: never, for integers).

Oracle: hand-picked inputs; the halfway points of int8 are k + 0.5 for k in -128..126.
"""

from __future__ import annotations

import numpy as np

from fp8sim.testing import compare


def test_integer_results_at_half_integers_are_ties() -> None:
    x = np.array([2.5, -2.5, 126.5, -126.5, 3.0, 2.25, np.nan, np.inf, 200.5])
    expected = np.int8([2, -2, 126, -126, 3, 2, 0, 127, 127])
    actual = expected + np.int8([1, -1, 1, -1, 1, 1, 1, -1, -1])  # every element differs
    r = compare(actual, expected, inputs=x)
    assert r.classes["overflow"] == 2  # inf and 200.5: beyond int8's 127
    assert r.classes["tie"] == 4  # 2.5, -2.5, 126.5, -126.5
    assert r.classes["other"] == 3  # 3.0, 2.25 and NaN
