"""fp8sim.testing.strategies: every code of every format is drawn; near-grid floats hold every
midpoint, its one-ulp neighbours and the range edges; recipes are valid and cover all five kinds.

Oracles: code values from ml_dtypes' decoding; midpoints and neighbours computed here from those
values (neighbours by stepping the dtype's bit pattern); recipe validity by rebuilding each recipe
(``dataclasses.replace`` reruns TE's checks).  Runs are derandomized.
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

hypothesis = require("hypothesis")
from conftest import ml_dtype  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fp8sim  # noqa: E402
from fp8sim.recipe import (  # noqa: E402
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from fp8sim.testing import assert_matches_emulator, emulate  # noqa: E402
from fp8sim.testing.strategies import (  # noqa: E402
    float_arrays_near_grid,
    fp8_arrays,
    fp8_codes,
    fp8_values,
    near_grid_values,
    recipes,
)

NAMES = list(fp8sim.FORMATS)
RUN = settings(database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


def _ml_values(name: str) -> np.ndarray:
    fmt = fp8sim.get_format(name)
    with np.errstate(invalid="ignore"):
        return np.arange(fmt.num_codes, dtype=np.uint8).view(ml_dtype(fmt)).astype(np.float64)


def _key(v: float) -> str:
    return "nan" if math.isnan(v) else float(v).hex()


def _collect(strategy: st.SearchStrategy, examples: int) -> list:
    seen: list = []

    @settings(RUN, max_examples=examples)
    @given(strategy)
    def run(value: object) -> None:
        seen.append(value)

    run()
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_fp8_arrays_draw_every_code(name: str) -> None:
    codes = set()
    for a in _collect(fp8_arrays(name, 64), 60):
        assert a.dtype == np.uint8 and a.shape == (64,)
        codes.update(a.tolist())
    assert codes == set(range(fp8sim.get_format(name).num_codes))


@pytest.mark.parametrize("name", NAMES)
def test_fp8_codes_and_values_cover_the_format(name: str) -> None:
    vals = _ml_values(name)

    def drawn(strategy: st.SearchStrategy) -> list:
        return [c for batch in _collect(st.lists(strategy, min_size=256, max_size=256), 25) for c in batch]

    assert set(drawn(fp8_codes(name))) == set(range(vals.size))
    assert set(drawn(fp8_codes(name, specials=False))) == set(np.flatnonzero(np.isfinite(vals)).tolist())
    assert {_key(v) for v in drawn(fp8_values(name))} == {_key(v) for v in vals}


def test_fp8_arrays_take_int_tuple_or_strategy_shapes() -> None:
    assert all(a.shape == (3, 5) for a in _collect(fp8_arrays("e4m3", (3, 5)), 5))
    shapes = {a.shape for a in _collect(fp8_arrays("e2m1", st.tuples(st.integers(1, 3), st.integers(1, 3))), 30)}
    assert len(shapes) > 1 and all(len(s) == 2 for s in shapes)
    assert all(a.max(initial=0) < 16 for a in _collect(fp8_arrays("e2m1", 8), 10))


def _step(x: np.ndarray, dtype: type, k: int) -> np.ndarray:
    """The dtype value k patterns away in magnitude (positive x only)."""
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    return (x.astype(dtype).view(bits) + np.array(k, dtype=np.int64).astype(bits)).view(dtype)


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "e8m0"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_near_grid_values_hold_midpoints_neighbours_and_edges(name: str, dtype: type) -> None:
    vals = _ml_values(name)
    grid = np.unique(np.abs(vals[np.isfinite(vals)]))
    top = grid[-1]
    nxt = top + (top - grid[-2]) if name != "e8m0" else 2 * top  # the grid continued above max
    pts = np.concatenate([[0.0] if grid[0] > 0 else [], grid, [nxt]])
    mids = (pts[:-1] + pts[1:]) / 2
    table = near_grid_values(name, dtype)
    assert table.dtype == np.dtype(dtype)
    have = {_key(v) for v in table.astype(np.float64)}
    want = np.concatenate([grid, mids])
    want = want[want.astype(dtype).astype(np.float64) == want]  # what the dtype can hold
    up, down = (_step(want, dtype, k).astype(np.float64) for k in (1, -1))
    for v in np.concatenate([want, up, down]):
        if v != 0:
            assert _key(v) in have and _key(-v) in have, (name, v)
    assert {"nan", _key(math.inf), _key(-math.inf), _key(0.0), _key(-0.0)} <= have
    assert _key(float(ml_dtypes.finfo(dtype).max)) in have  # the dtype's overflow edge
    assert not np.isnan(near_grid_values(name, dtype, specials=False).astype(np.float64)).any()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_float_arrays_near_grid_draw_from_the_table(dtype: type) -> None:
    table = {_key(v) for v in near_grid_values("e4m3", dtype).astype(np.float64)}
    arrays = _collect(float_arrays_near_grid("e4m3", (2, 8), dtype), 40)
    assert all(a.dtype == np.dtype(dtype) and a.shape == (2, 8) for a in arrays)
    flat = np.concatenate([a.reshape(-1).astype(np.float64) for a in arrays])
    assert {_key(v) for v in flat} <= table
    assert (flat > 0).any() and (flat < 0).any()


@settings(RUN, max_examples=40)
@given(x=float_arrays_near_grid("e5m2", 64))
def test_ml_dtypes_satfinite_matches_fp8sim_at_ties_and_edges(x: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):
        kernel = np.clip(x, -57344, 57344).astype(ml_dtypes.float8_e5m2)
    assert_matches_emulator(kernel, "cast", x, fmt="e5m2")


def test_recipes_are_valid_and_cover_every_kind() -> None:
    drawn = _collect(recipes(), 150)
    kinds = {type(r) for r in drawn}
    assert kinds == {DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling}
    for r in drawn:
        dataclasses.replace(r)  # reruns TE's validation
        assert r.fp8_format != Format.E5M2
        if isinstance(r, Float8BlockScaling):
            dims = (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim)
            assert set(dims) <= {1, 2} and dims.count(2) <= 1
    assert any(isinstance(r, NVFP4BlockScaling) and r.nvfp4_4over6 != "none" for r in drawn)
    only = _collect(recipes(NVFP4BlockScaling, MXFP8BlockScaling), 30)
    assert {type(r) for r in only} == {NVFP4BlockScaling, MXFP8BlockScaling}
    with pytest.raises(ValueError, match="unknown recipe kind"):
        recipes(int)


@pytest.mark.torch
@settings(RUN, max_examples=30)
@given(recipe=recipes(emulated_only=True))
def test_emulated_only_recipes_all_emulate(recipe: object) -> None:
    x = np.random.default_rng(0).standard_normal((16, 128)).astype(np.float32)
    assert_matches_emulator(emulate(recipe, x), recipe, x)
