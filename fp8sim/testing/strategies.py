"""Hypothesis strategies for FP8 tests: every code of a format, arrays of codes, floats at the
rounding-critical points of a format's grid, and valid TransformerEngine recipes.

Needs hypothesis (``pip install hypothesis``).  Shrinking goes toward zero codes and values and
toward the default recipe fields.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as _err:  # pragma: no cover - exercised only without hypothesis
    raise ImportError("fp8sim.testing.strategies needs hypothesis: pip install hypothesis") from _err

from ..formats import FloatFormat, get_format
from ..recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MMParams,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from . import _bits

__all__ = ["fp8_codes", "fp8_values", "fp8_arrays", "near_grid_values", "float_arrays_near_grid", "recipes"]

Shape = int | tuple[int, ...]


def _codes(f: FloatFormat, specials: bool) -> list[int]:
    return [c for c in range(f.num_codes) if specials or math.isfinite(f.code_value(c))]


def fp8_codes(fmt: str | FloatFormat, *, specials: bool = True) -> st.SearchStrategy[int]:
    """Every code of ``fmt`` (ints in ``[0, 2^bits)``); ``specials=False`` leaves out NaN and +-Inf
    codes.  -0 is not a special."""
    return st.sampled_from(_codes(get_format(fmt), specials))


def fp8_values(fmt: str | FloatFormat, *, specials: bool = True) -> st.SearchStrategy[float]:
    """The value of every code of ``fmt`` as a Python float (exact; -0.0 included, NaN and +-Inf
    unless ``specials=False``)."""
    f = get_format(fmt)
    return fp8_codes(f, specials=specials).map(f.code_value)


def fp8_arrays(
    fmt: str | FloatFormat, shape: Shape | st.SearchStrategy[Shape], *, specials: bool = True
) -> st.SearchStrategy[np.ndarray]:
    """uint8 numpy arrays of codes of ``fmt``; ``shape`` is an int, a tuple or a strategy of them.

    Half the draws pick each element on its own (Hypothesis' edge-seeking element choice, which
    shrinks toward code 0); the other half sweep the codes, ``codes[(start + step * i) % n]`` with a
    random start and a step coprime to ``n``, so that a run sees every code of the format."""
    codes = _codes(get_format(fmt), specials)
    each = hnp.arrays(np.uint8, shape, elements=st.sampled_from(codes), fill=st.nothing())
    return st.one_of(each, _sweeps(np.array(codes, np.uint8), shape))


@st.composite
def _sweeps(draw: Any, codes: np.ndarray, shape: Shape | st.SearchStrategy[Shape]) -> np.ndarray:
    shp = draw(shape) if isinstance(shape, st.SearchStrategy) else shape
    shp = (shp,) if isinstance(shp, (int, np.integer)) else tuple(shp)
    n = codes.size
    start = draw(st.integers(0, n - 1))
    step = draw(st.integers(1, max(n - 1, 1)).filter(lambda k: math.gcd(k, n) == 1))
    size = math.prod(shp)
    return codes[(start + step * np.arange(size, dtype=np.int64)) % n].reshape(shp)


@cache
def _near_grid(f: FloatFormat, dtype_name: str, specials: bool) -> np.ndarray:
    dtype = _dtype(dtype_name)
    enc = _bits.native_encoding(np.zeros(0, dtype), "dtype")
    pos = sorted({abs(f.code_value(c)) for c in _codes(f, False)})
    top = pos[-1]
    nxt = top + math.ldexp(1.0, math.frexp(top)[1] - 1 - f.mbits)  # the grid continued above max
    pts = np.array(pos + [nxt], np.float64)
    centers = np.concatenate([pts, (pts[:-1] + pts[1:]) / 2, [pts[0] / 2, f.smallest_positive / 4, 2 * top]])
    with np.errstate(over="ignore", invalid="ignore"):
        cast = centers.astype(dtype)
        ok = np.isfinite(cast.astype(np.float64)) & (cast.astype(np.float64) == centers)
    bits = _bits.native_bits(cast[ok], enc)
    o = _bits.ordered(enc, bits)
    near = np.concatenate([bits, _bits.from_ordered(enc, o - 1), _bits.from_ordered(enc, o + 1)])
    vals = np.concatenate([_bits.values(enc, near), [enc.max, _tiniest(dtype)]])
    vals = np.unique(np.abs(np.append(vals[np.isfinite(vals) & (vals >= 0)], 0.0)))
    both = np.concatenate([vals, -vals[vals > 0], [-0.0]])
    if specials:
        both = np.concatenate([both, [np.inf, -np.inf, np.nan]])
    key = np.where(np.isnan(both), np.inf, np.abs(both))
    return both[np.lexsort((np.isnan(both), np.signbit(both), key))].astype(dtype)


def _dtype(name: str) -> np.dtype:
    import ml_dtypes

    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    if name not in ("float16", "float32", "float64"):
        raise ValueError(f"dtype must be float16, bfloat16, float32 or float64; got {name!r}")
    return np.dtype(name)


def _tiniest(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).smallest_subnormal)


def near_grid_values(fmt: str | FloatFormat, dtype: Any = np.float32, *, specials: bool = True) -> np.ndarray:
    """The rounding-critical ``dtype`` values of ``fmt``, sorted from zero outward: every finite grid
    value, every midpoint between neighbours (also between 0 and the smallest value, and between
    max and the next grid point above it, the overflow threshold), one ``dtype`` ulp either side
    of each, a quarter of the smallest value, twice max, the dtype's max and smallest subnormal,
    both signs; +-Inf and NaN when ``specials``.  Points ``dtype`` cannot hold are left out."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return _near_grid(get_format(fmt), name, bool(specials)).copy()


def float_arrays_near_grid(
    fmt: str | FloatFormat,
    shape: Shape | st.SearchStrategy[Shape] = 64,
    dtype: Any = np.float32,
    *,
    specials: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``dtype`` (float16, bfloat16, float32, float64) whose elements are drawn from
    :func:`near_grid_values` (ties, one ulp beside them, overflow and underflow edges, both
    signs).  ``shape``: int, tuple or a strategy of them."""
    table = near_grid_values(fmt, dtype, specials=specials)
    index = hnp.arrays(np.intp, shape, elements=st.integers(0, table.size - 1), fill=st.nothing())
    return index.map(lambda i: table[i])


# -- recipes ----------------------------------------------------------------------------------

_FP8_FORMAT = st.sampled_from([Format.HYBRID, Format.E4M3])  # never pure E5M2
_BACKWARD = st.sampled_from([None, "high_precision", "dequantized"])
_SCOPES = ("none", "weights", "activations", "all")
_BLOCK_DIMS = ((1, 2, 1), (1, 1, 1), (2, 1, 1), (1, 1, 2))  # (x, w, grad): at most one 2-D operand


def _mm() -> st.SearchStrategy[MMParams]:
    return st.builds(MMParams, use_split_accumulator=st.booleans())


def _recipe_strategies(emulated_only: bool) -> dict[type, st.SearchStrategy[Recipe]]:
    delayed = st.builds(
        DelayedScaling,
        margin=st.integers(0, 8),
        fp8_format=_FP8_FORMAT,
        amax_history_len=st.integers(1, 1024),
        amax_compute_algo=st.sampled_from(["max", "most_recent"]),
        reduce_amax=st.booleans(),
        fp8_dpa=st.booleans(),
        fp8_mha=st.booleans(),
        backward_override=st.none(),
    )
    current = st.builds(
        Float8CurrentScaling,
        use_power_2_scales=st.booleans(),
        fp8_format=_FP8_FORMAT,
        fp8_gemm_fprop=_mm(),
        fp8_gemm_dgrad=_mm(),
        fp8_gemm_wgrad=_mm(),
        fp8_dpa=st.booleans(),
        fp8_mha=st.booleans(),
        backward_override=_BACKWARD,
    )
    mxfp8 = st.builds(
        MXFP8BlockScaling,
        margin=st.integers(0, 8),
        fp8_format=_FP8_FORMAT,
        fp8_dpa=st.booleans(),
        fp8_mha=st.booleans(),
        backward_override=_BACKWARD,
    )
    block = st.sampled_from(_BLOCK_DIMS).flatmap(
        lambda d: st.builds(
            Float8BlockScaling,
            use_f32_scales=st.booleans(),
            fp8_format=_FP8_FORMAT,
            x_block_scaling_dim=st.just(d[0]),
            w_block_scaling_dim=st.just(d[1]),
            grad_block_scaling_dim=st.just(d[2]),
            backward_override=_BACKWARD,
        )
    )
    nvfp4 = st.builds(
        NVFP4BlockScaling,
        disable_rht=st.booleans(),
        disable_stochastic_rounding=st.booleans(),
        disable_2d_quantization=st.booleans(),
        row_scaled_activation=st.just(False) if emulated_only else st.booleans(),
        nvfp4_4over6=st.just("none") if emulated_only else st.sampled_from(_SCOPES),
        nvfp4_4over6_e4m3_use_256=st.sampled_from(_SCOPES),
        nvfp4_4over6_err_mode=st.sampled_from(["MAE", "MSE"]),
        backward_override=_BACKWARD,
    )
    return {
        DelayedScaling: delayed,
        Float8CurrentScaling: current,
        MXFP8BlockScaling: mxfp8,
        Float8BlockScaling: block,
        NVFP4BlockScaling: nvfp4,
    }


def recipes(*kinds: type[Recipe], emulated_only: bool = False) -> st.SearchStrategy[Recipe]:
    """Valid recipe objects from ``fp8sim.recipe`` with random fields (E4M3 or HYBRID, never pure
    E5M2; at most one 2-D block operand; split accumulation where required; no FP8 attention for
    block scaling).  ``kinds``: restrict to these recipe classes (default: all five).
    ``emulated_only``: only settings ``assert_matches_emulator`` can emulate (NVFP4 without 4over6
    and without row-scaled activations)."""
    table = _recipe_strategies(bool(emulated_only))
    for k in kinds:
        if k not in table:
            raise ValueError(f"unknown recipe kind {k!r}; known: {', '.join(c.__name__ for c in table)}")
    return st.one_of(*(table[k] for k in (kinds or tuple(table))))
