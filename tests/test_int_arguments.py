"""Issue 29.4: one rule for integer arguments across the public API.

Every integral type ``operator.index`` takes (numpy integers of any width, 0-d integer arrays and
tensors) gives the same result as the Python int; ``True``/``False`` and floats (even integral ones
such as ``128.0``) are a TypeError naming the argument, never silently an int.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import fp8sim
from fp8sim.cast.philox import philox4x32, te_philox_words
from fp8sim.gemm.splitk import check_split_k
from fp8sim.recipe import DelayedScaling
from fp8sim.scaling import DelayedScaler, quantize_block_scaling, quantize_mx, quantize_torchao
from fp8sim.scaling.swizzle import from_blocked, to_blocked
from fp8sim.testing.assertions import assert_within_ulp
from fp8sim.testing.oracles import require

X = np.linspace(-3, 3, 512, dtype=np.float32).reshape(4, 128)


def _result(v: object) -> object:
    if hasattr(v, "codes"):
        return (v.codes.tolist(), np.asarray(v.scales).tolist(), v.block)
    if isinstance(v, DelayedScaler):
        return v.amax_history.shape
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


# (call taking the argument, argument name, a valid int)


def _parallel_layout():  # noqa: ANN202
    """``fp8sim.collectives`` needs torch.distributed: imported when its case runs (the lean session has no torch)."""
    require("torch")
    from fp8sim.collectives.groups import ParallelLayout

    return ParallelLayout


CASES: list[tuple[Callable[[object], object], str, int]] = [
    (lambda v: quantize_block_scaling(X, block_size=v), "block_size", 64),
    (lambda v: quantize_mx(X, block_size=v), "block_size", 32),
    (lambda v: quantize_mx(X, axis=v), "axis", 1),
    (lambda v: quantize_torchao(X, granularity="axiswise", axiswise_dim=v), "axiswise_dim", 0),
    (lambda v: DelayedScaler(DelayedScaling(amax_history_len=4), n=v), "n (number of quantizers)", 3),
    (lambda v: fp8sim.encode(X, "e4m3", rounding="stochastic", seed=v), "seed", 7),
    (lambda v: philox4x32(np.zeros((2, 4), np.uint32), np.ones(2, np.uint32), rounds=v), "rounds", 7),
    (lambda v: te_philox_words(1, 2, v), "count", 8),
    (lambda v: check_split_k((v, "serial")), "split_k's S", 2),
    (lambda v: from_blocked(to_blocked(np.ones((4, 4), np.uint8)), v, 4), "rows", 4),
    (lambda v: assert_within_ulp(np.float32(1), np.float32(1), ulp_budget=v), "ulp_budget", 1),
    (lambda v: _parallel_layout()(tp=v).world_size, "tp", 2),
]
IDS = [f"{name}#{i}" for i, (_, name, _) in enumerate(CASES)]


def _integral_kinds(v: int) -> list[object]:
    kinds = [np.int64(v), np.int32(v), np.uint8(v) if v >= 0 else np.int8(v), np.array(v)]
    try:
        import torch

        kinds.append(torch.tensor(v))
    except ImportError:
        pass
    return kinds


@pytest.mark.parametrize(("call", "name", "value"), CASES, ids=IDS)
def test_every_integral_type_gives_the_int_result(call: Callable, name: str, value: int) -> None:
    want = _result(call(value))
    for v in _integral_kinds(value):
        assert _result(call(v)) == want, f"{name}={v!r} ({type(v).__name__})"


@pytest.mark.parametrize(("call", "name", "value"), CASES, ids=IDS)
def test_bools_and_floats_are_type_errors_naming_the_argument(call: Callable, name: str, value: int) -> None:
    bad: list[object] = [True, np.bool_(True), float(value), np.float32(value), str(value)]
    try:
        import torch

        bad += [torch.tensor(True), torch.tensor(float(value))]
    except ImportError:
        pass
    for v in bad:
        with pytest.raises(TypeError, match=re.escape(f"{name} must be an int, got")) as info:
            call(v)
        assert "Traceback" not in str(info.value)


def test_grouped_linear_num_gemms_takes_numpy_ints_and_refuses_bools() -> None:
    te = require("fp8sim.pytorch")
    assert te.GroupedLinear(np.int64(2), 16, 16).num_gemms == 2
    with pytest.raises(TypeError, match="num_gemms must be an int, got True"):
        te.GroupedLinear(True, 16, 16)
    with pytest.raises(TypeError, match="num_gemms must be an int, got float"):
        te.GroupedLinear(2.0, 16, 16)
