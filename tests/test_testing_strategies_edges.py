"""``fp8sim.testing.strategies``: edges that the mutation run of ``fp8sim.testing`` found unpinned (issue 30.1,
``reports/mutation_testing.md``).

Oracles: ml_dtypes' ``finfo`` and decoding of every code; the documented contents of ``near_grid_values``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

require("hypothesis")
from fp8sim.testing.strategies import near_grid_values  # noqa: E402


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_near_grid_values_of_a_format_without_zero_hold_the_dtypes_smallest_subnormal(dtype: str) -> None:
    """E8M0 has no zero code, so no grid point's neighbour is the dtype's smallest subnormal: the table adds it."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)
    table = near_grid_values("e8m0", dt).astype(np.float64)
    assert tiny in table and -tiny in table


def test_near_grid_values_refuse_a_dtype_name_numpy_reads_differently() -> None:
    """Only the four names: "bf16" or "f4" are refused with the allowed values, as "int32" is."""
    for name in ("bf16", "f4"):
        with pytest.raises(ValueError) as info:
            near_grid_values("e4m3", name)
        assert str(info.value) == f"dtype must be float16, bfloat16, float32 or float64; got {name!r}"


def test_float_arrays_near_grid_draw_each_element_on_its_own_over_the_whole_table() -> None:
    """E2M1's float32 table (117 values, from 0.0 out to the specials): 100 draws of 64 elements reach nearly
    every entry, the first and the last included, and an array holds many different values (each element is
    drawn, none is a fill)."""
    from hypothesis import HealthCheck, given, settings

    from fp8sim.testing.strategies import float_arrays_near_grid

    table = near_grid_values("e2m1", np.float32)
    seen: list[np.ndarray] = []

    @settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), max_examples=100)
    @given(float_arrays_near_grid("e2m1", 64))
    def run(a: np.ndarray) -> None:
        seen.append(a)

    run()

    def keys(a: np.ndarray) -> list[str]:
        return [float(v).hex() if v == v else "nan" for v in a.astype(np.float64)]

    drawn, want = set(keys(np.concatenate(seen))), keys(table)
    assert drawn <= set(want) and len(drawn) >= 0.9 * len(want)
    assert want[0] in drawn and want[-1] in drawn  # the first entry (0.0) and the last (-Inf)
    assert np.mean([np.unique(a.view(np.uint32)).size for a in seen]) > 20


def test_delayed_scaling_recipes_stay_valid_under_an_env_backward_override() -> None:
    """TE's ``NVTE_BACKWARD_OVERRIDE`` sets every recipe's default ``backward_override`` at import, and delayed
    scaling accepts only None: ``recipes()`` draws DelayedScaling with ``backward_override=None`` explicitly."""
    import os
    import subprocess
    import sys

    code = (
        "from hypothesis import given, settings, HealthCheck\n"
        "from fp8sim.recipe import DelayedScaling\n"
        "from fp8sim.testing.strategies import recipes\n"
        "seen = []\n"
        "@settings(database=None, derandomize=True, max_examples=10, suppress_health_check=list(HealthCheck))\n"
        "@given(recipes(DelayedScaling))\n"
        "def run(r):\n"
        "    seen.append(r.backward_override)\n"
        "run()\n"
        "assert seen and set(seen) == {None}, seen\n"
    )
    env = dict(os.environ, NVTE_BACKWARD_OVERRIDE="dequantized")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_fp8_arrays_mix_elementwise_draws_and_sweeps() -> None:
    """E4M3 has 256 codes: a sweep of 64 is 64 distinct codes ``(start + step * i) % 256`` with an odd step; an
    element-wise draw repeats codes (it shrinks toward code 0).  Both kinds appear."""
    from hypothesis import HealthCheck, given, settings

    from fp8sim.testing.strategies import fp8_arrays

    seen: list[np.ndarray] = []

    @settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), max_examples=60)
    @given(fp8_arrays("e4m3", 64))
    def run(a: np.ndarray) -> None:
        seen.append(a.astype(np.int64))

    run()

    def is_sweep(a: np.ndarray) -> bool:
        step = (a[1] - a[0]) % 256
        return step % 2 == 1 and bool((np.diff(a) % 256 == step).all())

    assert any(is_sweep(a) for a in seen)
    assert any(np.unique(a).size < a.size for a in seen)


def test_fp8_values_without_specials_are_finite() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fp8sim.testing.strategies import fp8_values

    seen: list[float] = []

    @settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), max_examples=20)
    @given(st.lists(fp8_values("e5m2", specials=False), min_size=256, max_size=256))
    def run(v: list[float]) -> None:
        seen.extend(v)

    run()
    finite = np.isfinite(np.array(seen))
    assert finite.all() and len({float(v).hex() for v in seen}) > 200  # E5M2 has 248 finite codes
