"""TE delayed scaling (spec 4.3-4.6): trajectories written out by hand from the spec.

Each table lists, per step, the amax the step records and then the history (rows 0..L-1, one
quantizer) and the scale after that step's update.  They were derived with pen and paper from the
fused kernel in spec 4.5 / the unfused path in 4.6, not by running fp8sim.
"""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest

from fp8sim.recipe import DelayedScaling, Format
from fp8sim.scaling.delayed import FLT_MAX, DelayedScaler

INF, NAN = math.inf, math.nan

# Fused, "max", L=3, margin 0, HYBRID forward (fp8_max 448).
FUSED_MAX = [
    (2.0, [0, 0, 2], 224.0),  # first run: window {0, 0, 2}
    (0.0, [0, 0, 2], 224.0),  # zero amax: no roll, scale kept
    (4.0, [0, 2, 4], 112.0),
    (1.0, [0, 4, 1], 112.0),  # max over {2, 4, 1}
    (INF, [0, 1, INF], 112.0),  # Inf amax keeps the old scale
    (1.0, [0, INF, 1], 112.0),  # ...while it stays in the window
    (0.5, [0, 1, 0.5], 112.0),
    (0.5, [0, 0.5, 0.5], 448.0),  # window {1, 0.5, 0.5}
]

# Same steps, "most_recent".
FUSED_MOST_RECENT = [
    (2.0, [0, 0, 2], 224.0),
    (0.0, [0, 0, 2], 224.0),
    (4.0, [0, 2, 4], 112.0),
    (1.0, [0, 4, 1], 448.0),
    (INF, [0, 1, INF], 448.0),
    (1.0, [0, INF, 1], 448.0),
    (0.5, [0, 1, 0.5], 896.0),
]


def _run(scaler: DelayedScaler, steps: list) -> None:
    for i, (amax, hist, scale) in enumerate(steps, 1):
        scaler.record(0, np.array([amax, -amax / 2], np.float32))
        scaler.update()
        got_h, got_s = scaler.amax_history[:, 0].tolist(), float(scaler.scale[0])
        assert got_h == hist and got_s == scale, f"step {i} (amax {amax}): history {got_h} scale {got_s}"


@pytest.mark.parametrize(("algo", "steps"), [("max", FUSED_MAX), ("most_recent", FUSED_MOST_RECENT)])
def test_fused_trajectory_history_3(algo: str, steps: list) -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=3, amax_compute_algo=algo, reduce_amax=False))
    assert s.fused
    _run(s, steps)


def test_fused_nan_amax_rolls_in_but_is_ignored_by_max() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=3, reduce_amax=False))
    s.record(0, np.array([2.0], np.float32))
    s.update()  # [0, 0, 2], 224
    s.update(reduced_amax=np.array([NAN], np.float32))  # last = NaN (NaN != 0): window {0, 2, NaN}
    assert s.amax_history[1:, 0].tolist()[0] == 2 and math.isnan(s.amax_history[2, 0])
    assert s.scale[0] == 224.0  # fmaxf ignores NaN: amax 2
    s.record(0, np.array([NAN, 1.0], np.float32))  # NaN elements are skipped by the amax
    assert s.amax_history[0, 0] == 1.0


def test_fused_history_1_margin_1_e4m3_and_flt_max() -> None:
    s = DelayedScaler(DelayedScaling(margin=1, fp8_format=Format.E4M3, amax_history_len=1, reduce_amax=False))
    steps = [(2.0, 112.0), (7.0, 32.0), (0.875, 256.0), (1e-40, float(FLT_MAX))]  # 224 / amax; 224/1e-40 overflows
    for amax, scale in steps:
        s.record(0, np.array([amax], np.float32))
        s.update()
        assert s.amax_history[:, 0].tolist() == [0.0]
        assert float(s.scale[0]) == scale


def test_backward_hybrid_uses_e5m2_max_and_first_step_casts_with_scale_1() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=2, reduce_amax=False), n=2, forward=False)
    assert s.fmt.name == "e5m2" and s.fp8_max == 57344
    q = s.quantize(1, np.array([1e6, -3.0, 0.5], np.float32))  # step 1: scale 1, satfinite
    assert q.dequantize().tolist() == [57344.0, -3.0, 0.5]
    s.update()
    assert s.scale.tolist() == [1.0, float(np.float32(57344 / 1e6))]  # 1e6 is exact in float32
    assert s.amax_history.tolist() == [[0.0, 0.0], [0.0, 1e6]]  # quantizer 0 did not run


def test_scale_inv_is_the_correctly_rounded_reciprocal() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False))
    s.record(0, np.array([3.0], np.float32))
    s.update()  # scale = fl32(448/3)
    from fractions import Fraction

    scale = Fraction(float(s.scale[0]))
    assert s.scale[0] == np.float32(float(Fraction(448, 3)))
    want = np.float32(float(1 / scale))  # correct rounding of the exact reciprocal (no tie here)
    assert s.scale_inv[0] == want


def test_unfused_callable_sees_pre_roll_history_and_always_rolls() -> None:
    seen: list[list[float]] = []

    def algo(h):  # noqa: ANN001, ANN202
        seen.append(h[:, 0].tolist())
        return h.max(dim=0).values

    s = DelayedScaler(DelayedScaling(amax_history_len=3, amax_compute_algo=algo, reduce_amax=False))
    assert not s.fused
    # step: recorded amax -> (history passed to the callable, history after, scale)
    steps = [
        (2.0, [2, 0, 0], [0, 0, 2], 224.0),
        (0.0, [0, 0, 2], [0, 2, 0], 224.0),  # no zero-amax skip: rolls; max over history is 2
        (4.0, [4, 2, 0], [0, 0, 4], 112.0),
    ]
    for amax, passed, after, scale in steps:
        s.record(0, np.array([amax], np.float32))
        s.update()
        assert seen[-1] == passed
        assert s.amax_history[:, 0].tolist() == after and float(s.scale[0]) == scale


def test_unfused_max_propagates_nan_and_keeps_the_scale() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=2, reduce_amax=False), fused=False)
    s.record(0, np.array([4.0], np.float32))
    s.update()
    assert s.scale[0] == 112.0 and s.amax_history[:, 0].tolist() == [0, 4]
    s.update(reduced_amax=np.array([NAN], np.float32))
    assert s.scale[0] == 112.0  # torch.max sees NaN -> non-finite -> old scale


def test_scaling_factor_compute_algo_replaces_the_formula() -> None:
    calls = []

    def sf(amax, old, fp8_max, recipe):  # noqa: ANN001, ANN202
        calls.append((float(amax[0]), float(old[0]), float(fp8_max), recipe.margin))
        return old * 2

    s = DelayedScaler(DelayedScaling(amax_history_len=2, scaling_factor_compute_algo=sf, reduce_amax=False))
    s.record(0, np.array([5.0], np.float32))
    s.update()
    s.update()
    assert calls == [(5.0, 1.0, 448.0, 0), (5.0, 2.0, 448.0, 0)]
    assert s.scale[0] == 4.0


def test_eager_division_is_reciprocal_multiply() -> None:
    """Spec pitfall 4: eager `fp8_max / amax` is `amax.reciprocal() * fp8_max` (two roundings)."""
    amaxes = np.float32(1.0) + np.arange(1, 2000, dtype=np.float32) * np.float32(2**-12)
    ieee = np.float32(448) / amaxes
    eager = (np.float32(1) / amaxes) * np.float32(448)
    idx = int(np.flatnonzero(ieee != eager)[0])  # such an amax exists
    for eager_flag, want in ((False, ieee[idx]), (True, eager[idx])):
        s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False), fused=False, eager_division=eager_flag)
        s.record(0, amaxes[idx : idx + 1])
        s.update()
        assert s.scale[0] == want


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n \\(number of quantizers\\) must be an int >= 1"):
        DelayedScaler(DelayedScaling(), n=0)
    with pytest.raises(TypeError, match="recipe must be a DelayedScaling"):
        DelayedScaler("delayed")  # type: ignore[arg-type]
    s = DelayedScaler(DelayedScaling(), n=2)
    with pytest.raises(IndexError, match="quantizer index 2 out of range for n=2"):
        s.record(2, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="scale must be finite and positive"):
        s.load_state_dict({"scale": np.array([np.nan, 1.0]), "amax_history": np.zeros((1024, 2))})
    with pytest.raises(TypeError, match="floating"):
        s.record(0, np.arange(3))


def _gloo_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        s = DelayedScaler(DelayedScaling(amax_history_len=2), n=2)
        s.record(0, np.array([2.0 if rank == 0 else 8.0], np.float32))
        s.record(1, np.array([0.0 if rank == 0 else 0.5], np.float32))
        s.update()
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.concatenate([s.scale, s.amax_history.ravel()]))
    finally:
        dist.destroy_process_group()


def test_reduce_amax_all_reduces_max_across_two_gloo_processes(tmp_path) -> None:  # noqa: ANN001
    mp = pytest.importorskip("torch.multiprocessing")
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(_gloo_worker, args=(2, init, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        got = np.load(tmp_path / f"rank{rank}.npy")
        # both ranks: amax MAX-reduced to (8, 0.5) -> scales 448/8, 448/0.5; history rolled
        assert got.tolist() == [56.0, 896.0, 0.0, 0.0, 8.0, 0.5], f"rank {rank}: {got}"


def _e4m3(v: float) -> int:
    """Oracle code: ml_dtypes' cast (exact grid values here, so rounding plays no part)."""
    return int(np.array(v, np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_quantize_records_the_nan_skipping_amax_and_casts_with_the_current_scale() -> None:
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False))
    s.scale[0] = np.float32(3.0)
    x = np.array([np.nan, -5.0, 2.0, -np.inf], np.float32)
    q = s.quantize(0, x)
    assert s.amax_history[0, 0] == np.inf  # Inf wins, NaN skipped
    q2 = s.quantize(0, np.array([np.nan, 0.5], np.float32))
    assert q2.codes[1] == _e4m3(1.5)
    assert q.codes.tolist()[1:] == [
        _e4m3(-15.0),
        _e4m3(6.0),
        0xFE,
    ]  # -Inf saturates to -448
    assert q.scales.reshape(-1)[0] == np.float32(1) / np.float32(3)
    s2 = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False))
    s2.quantize(0, np.array([np.nan, -7.0], np.float32))
    assert s2.amax_history[0, 0] == 7.0
