"""``DelayedScaler`` without torch (``import fp8sim`` needs only numpy), its state round trip, its repr, and the
amax all-reduce helper's process-group cases.

The unfused update must give TE's results when torch is absent: the reference is TE's eager update written
in torch from NVIDIA/TransformerEngine:transformer_engine/pytorch/quantization.py at d0067d0
(``_default_get_amax_and_update_history`` lines 1077-1089, ``_default_sf_compute`` 1092-1116,
``_compute_scaling_factor`` 1135-1150, ``_amax_and_scale_update`` 1153-1166; ``get_fp8_max`` 306-312), run
before torch is hidden from fp8sim.
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pytest
from _te_delayed import te_unfused_update

from fp8sim.recipe import DelayedScaling, Format
from fp8sim.scaling.delayed import FLT_MAX, DelayedScaler, _all_reduce_max, load_state_dicts
from fp8sim.testing.oracles import require

torch = require("torch")

INF, NAN = math.inf, math.nan


def _amaxes() -> np.ndarray:
    rng = np.random.default_rng(3)
    mant = np.float32(1) + rng.integers(0, 2**23, 200).astype(np.float32) * np.float32(2**-23)
    vals = (mant * np.exp2(rng.integers(-140, 128, 200))).astype(np.float32)
    special = np.array([0, INF, NAN, 3, 1e-38, 1e-45, FLT_MAX, 1.0, -2.0], np.float32)
    return np.concatenate([vals[np.isfinite(vals)], special])


def _sf_plus(amax, scale, fp8_max, recipe):  # noqa: ANN001, ANN202 - numpy arrays or torch tensors alike
    return scale * 2 + recipe.margin + (fp8_max == 448) + (amax[:1] > 0)


def _second_row(h):  # noqa: ANN001, ANN202
    return h[1] * 1


@pytest.mark.parametrize(
    ("kw", "forward"),
    [
        ({"amax_compute_algo": "max", "margin": 0}, True),
        ({"amax_compute_algo": "max", "margin": 3, "fp8_format": Format.E4M3}, False),
        ({"amax_compute_algo": "most_recent", "margin": -2}, True),
        ({"amax_compute_algo": "max", "margin": -127}, False),
        ({"amax_compute_algo": _second_row}, True),
        ({"scaling_factor_compute_algo": _sf_plus, "margin": 1}, True),
    ],
    ids=["max", "e4m3-bwd-margin3", "most_recent", "hybrid-bwd-margin-127", "callable-algo", "callable-sf"],
)
def test_unfused_update_without_torch_is_tes_update(monkeypatch, kw: dict, forward: bool) -> None:  # noqa: ANN001
    amaxes = _amaxes()
    recipe = DelayedScaling(amax_history_len=3, reduce_amax=False, **kw)
    s = DelayedScaler(recipe, n=amaxes.size, forward=forward, fused=False)
    rng = np.random.default_rng(5)
    older = rng.permutation(amaxes)
    s.amax_history[0], s.amax_history[1], s.amax_history[2] = amaxes, older, np.float32(2.5)
    s.scale[:] = np.float32(7.0)
    hist, scale = torch.from_numpy(s.amax_history.copy()), torch.from_numpy(s.scale.copy())
    fp8_max = 448 if (forward or kw.get("fp8_format") == Format.E4M3) else 57344  # HYBRID: E5M2 backward
    te_unfused_update(hist, scale, fp8_max, recipe)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # amax 0, 1e-45, Inf, NaN: no floating-point warnings
        s.update()
    assert isinstance(s.scale, np.ndarray) and s.scale.dtype == np.float32
    got, want = s.scale.view(np.uint32), scale.numpy().view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"amax {amaxes[bad[0]]!r}: fp8sim {s.scale[bad[0]]!r}, TE {scale[bad[0]].item()!r}"
    np.testing.assert_array_equal(s.amax_history.view(np.uint32), hist.numpy().view(np.uint32))


def test_unfused_ieee_division_without_torch(monkeypatch) -> None:  # noqa: ANN001
    """``eager_division=False``: one IEEE float32 division ``fp8_max / amax``, then the margin."""
    amaxes = _amaxes()
    s = DelayedScaler(
        DelayedScaling(amax_history_len=1, margin=2, reduce_amax=False),
        n=amaxes.size,
        fused=False,
        eager_division=False,
    )
    s.amax_history[0] = amaxes
    monkeypatch.setitem(sys.modules, "torch", None)
    s.update()
    with np.errstate(all="ignore"):
        sf = (np.float32(448) / amaxes) / np.float32(4)
    ok = np.isfinite(amaxes) & (amaxes > 0)
    want = np.where(ok, np.where(np.isinf(sf), FLT_MAX, sf), np.float32(1)).astype(np.float32)
    np.testing.assert_array_equal(s.scale.view(np.uint32), want.view(np.uint32))
    assert s.amax_history.tolist() == [[0.0] * amaxes.size]
    assert s.scale[np.flatnonzero(amaxes == 3)[0]] == np.float32(448) / np.float32(3) / np.float32(4)


def test_state_dict_is_a_copy_and_load_state_dicts_is_all_or_nothing() -> None:
    a = DelayedScaler(DelayedScaling(amax_history_len=2, reduce_amax=False), n=2)
    b = DelayedScaler(DelayedScaling(amax_history_len=3, reduce_amax=False), n=1)
    a.scale[:] = [2.0, 4.0]
    a.amax_history[:] = [[1.0, 2.0], [3.0, 4.0]]
    state = a.state_dict()
    assert sorted(state) == ["amax_history", "scale"]
    assert state["scale"].tolist() == [2.0, 4.0] and state["amax_history"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    a.scale[0] = 8.0
    a.amax_history[0, 0] = 9.0
    assert state["scale"][0] == 2.0 and state["amax_history"][0, 0] == 1.0  # a copy, not a view
    good_b = {"scale": np.array([5.0], np.float32), "amax_history": np.array([[1.0], [2.0], [3.0]], np.float32)}
    bad_a = {"scale": np.array([1.0], np.float32), "amax_history": np.zeros((2, 2), np.float32)}
    with pytest.raises(ValueError, match="scale"):
        load_state_dicts([(b, good_b), (a, bad_a)])
    assert b.scale.tolist() == [1.0] and b.amax_history.tolist() == [[0.0], [0.0], [0.0]]  # nothing loaded
    load_state_dicts([(b, good_b), (a, state)])
    assert b.scale.tolist() == [5.0] and b.amax_history[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert a.scale.tolist() == [2.0, 4.0] and a.amax_history.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_repr_names_the_state() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent"), n=2, fused=False)
    s.scale[:] = [1.5, 2.0]
    assert repr(s) == ("DelayedScaler(n=2, fmt=e4m3, history_len=4, algo='most_recent', fused=False, scale=[1.5, 2.0])")


def test_all_reduce_max_is_a_no_op_without_a_group_of_two(monkeypatch) -> None:  # noqa: ANN001
    from _outcomes import gloo_world_of_one

    row = np.array([1.0, 5.0], np.float32)
    assert _all_reduce_max(row, None) is None  # no process group
    with gloo_world_of_one():
        assert _all_reduce_max(row, None) is None  # a world of one has nothing to reduce
    monkeypatch.setitem(sys.modules, "torch", None)
    assert _all_reduce_max(row, None) is None


def test_all_reduce_max_reduces_in_a_group_of_two() -> None:
    """torch's ``fake`` backend plays rank 1 of two: the row goes through ``all_reduce`` and comes back as a
    new float32 array, the input untouched."""
    dist = require("torch.distributed")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    calls = []
    real = dist.all_reduce

    def spy(t, op=dist.ReduceOp.SUM, group=None, async_op=False):  # noqa: ANN001, ANN202
        calls.append((t.clone(), op, group))
        return real(t, op=op, group=group, async_op=async_op)

    row = np.array([1.0, 5.0, 0.25], np.float32)
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        dist.all_reduce = spy
        group = dist.new_group([0, 1])
        out = _all_reduce_max(row, group)
    finally:
        dist.all_reduce = real
        dist.destroy_process_group()
    assert out is not None and out is not row and out.dtype == np.float32 and out.tolist() == [1.0, 5.0, 0.25]
    out[0] = 9.0
    assert row[0] == 1.0
    assert len(calls) == 1
    sent, op, g = calls[0]
    assert sent.tolist() == [1.0, 5.0, 0.25] and op == dist.ReduceOp.MAX and g is group
