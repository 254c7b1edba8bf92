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
from _te_delayed import te_unfused_update

from fp8sim.recipe import DelayedScaling, Format
from fp8sim.scaling.delayed import FLT_MAX, DelayedScaler
from fp8sim.testing.oracles import require

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


@pytest.mark.torch
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
    with pytest.raises(ValueError, match=r"state\[.scale.\] must be finite and positive"):
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
    mp = require("torch.multiprocessing")
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


def _hard_amaxes() -> np.ndarray:
    rng = np.random.default_rng(0)
    mant = np.float32(1) + rng.integers(0, 2**23, 300).astype(np.float32) * np.float32(2**-23)
    exps = rng.integers(-140, 128, 300).astype(np.float32)
    vals = (mant * np.exp2(exps)).astype(np.float32)
    special = np.array([0, INF, NAN, 3, 1e-38, 1e-45, 2.2e-36, FLT_MAX, 1.0], np.float32)
    return np.concatenate([vals[np.isfinite(vals)], special])


@pytest.mark.torch
@pytest.mark.parametrize("margin", [0, 3, -3, -20, 63, -127])
@pytest.mark.parametrize("forward", [True, False])
def test_unfused_update_is_tes_eager_torch_code_bit_for_bit(margin: int, forward: bool) -> None:
    """Issue 13 point 8 / spec 0 (4.6): reciprocal then multiply, Inf -> FLT_MAX including after the
    margin divides, non-finite or zero amax keeps the old scale."""
    import torch

    amaxes = _hard_amaxes()
    recipe = DelayedScaling(margin=margin, amax_history_len=2, reduce_amax=False)
    s = DelayedScaler(recipe, n=amaxes.size, forward=forward, fused=False)
    s.scale[:] = np.float32(7.0)
    s.amax_history[0] = amaxes
    hist, scale = torch.zeros(2, amaxes.size), torch.full((amaxes.size,), 7.0)
    hist[0] = torch.from_numpy(amaxes)
    te_unfused_update(hist, scale, 448 if forward else 57344, recipe)
    s.update()
    got, want = s.scale.view(np.uint32), scale.numpy().view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"amax {amaxes[bad[0]]!r}: fp8sim {got[bad[0]]:#010x}, TE {want[bad[0]]:#010x}"
    assert np.array_equal(s.amax_history.view(np.uint32), hist.numpy().view(np.uint32))


def test_unfused_amax_3_is_the_reciprocal_multiply_value() -> None:
    """Spec 0: amax 3 gives 149.33334351 (reciprocal * 448), not the division's 149.33332825."""
    s = DelayedScaler(DelayedScaling(amax_history_len=1, reduce_amax=False), fused=False)
    s.record(0, np.array([3.0], np.float32))
    s.update()
    assert s.scale[0] == np.float32(149.33334351) != np.float32(448) / np.float32(3)


@pytest.mark.torch
def test_callables_get_the_live_history_and_fp8_max_as_a_python_number() -> None:
    """TE hands ``amax_compute_algo`` the history tensor itself and rolls it afterwards, so a callable
    returning a view of row 0 sees zeros by the time the scale is computed (the scale is kept);
    ``fp8_max`` is ``get_fp8_max``'s Python int (57344 for HYBRID backward)."""
    import torch

    seen = []

    def sf(amax, old, fp8_max, recipe):  # noqa: ANN001, ANN202
        seen.append((type(fp8_max), fp8_max, amax.tolist()))
        return (fp8_max / amax) / (2**recipe.margin)

    for algo in (lambda h: h[0], lambda h: h.max(dim=0).values):
        recipe = DelayedScaling(amax_history_len=3, amax_compute_algo=algo, reduce_amax=False)
        ours = DelayedScaler(recipe, n=2, forward=False)
        hist, scale = torch.zeros(3, 2), torch.ones(2)
        for step in (np.array([4.0, 2.0], np.float32), np.array([8.0, 0.0], np.float32)):
            ours.amax_history[0] = step
            hist[0] = torch.from_numpy(step)
            ours.update()
            te_unfused_update(hist, scale, 57344, recipe)
            assert np.array_equal(ours.scale, scale.numpy()) and np.array_equal(ours.amax_history, hist.numpy())
    assert DelayedScaler(DelayedScaling(amax_compute_algo=lambda h: h[0])).scale[0] == 1.0

    s = DelayedScaler(
        DelayedScaling(amax_history_len=2, scaling_factor_compute_algo=sf, reduce_amax=False), forward=False
    )
    s.record(0, np.array([2.0], np.float32))
    s.update()
    assert seen == [(int, 57344, [2.0])]


@pytest.mark.torch
def test_update_is_in_place_so_views_stay_live() -> None:
    """Issue 13 point 14: TE's fp8_meta ``scale``/``amax_history`` are updated in place."""
    import torch

    for fused in (True, False):
        s = DelayedScaler(DelayedScaling(amax_history_len=4, reduce_amax=False), n=2, fused=fused)
        scale, hist = s.scale, s.amax_history
        scale_t, hist_t = torch.from_numpy(s.scale), torch.from_numpy(s.amax_history)
        s.record(0, np.array([2.0], np.float32))
        s.update()
        assert s.scale is scale and s.amax_history is hist
        assert float(scale_t[0]) == 224.0 and float(hist_t[:, 0].max()) == 2.0
        s.load_state_dict({"scale": np.array([3.0, 5.0]), "amax_history": np.ones((4, 2))})
        assert s.scale is scale and float(scale_t[1]) == 5.0


def test_reduce_and_update_rolls_every_registered_unfused_module_not_only_those_that_ran() -> None:
    """Spec 0 (4.6): TE's unfused path walks every history in the global buffer; the fused kernel
    skips a module whose staging amax is 0 ("avoid roll for non-run modules")."""
    from fp8sim.scaling.delayed import reduce_and_update

    for fused, want_idle in ((False, [0.0, 1.0, 0.0]), (True, [0.0, 0.0, 1.0])):
        recipe = DelayedScaling(amax_history_len=3, reduce_amax=False)
        ran, idle = DelayedScaler(recipe, fused=fused), DelayedScaler(recipe, fused=fused)
        idle.amax_history[2, 0] = 1.0  # an earlier step's amax
        ran.record(0, np.array([2.0], np.float32))
        reduce_and_update([ran, idle])
        assert idle.amax_history[:, 0].tolist() == want_idle
        assert ran.amax_history[:, 0].tolist() == ([0, 0, 2] if fused else [0, 0, 2])
        assert ran.scale[0] == 224.0


@pytest.mark.torch
@pytest.mark.parametrize(("old_len", "new_len"), [(4, 2), (2, 5), (3, 3)])
def test_changing_amax_history_len_keeps_the_scale_and_cuts_or_pads_as_te(old_len: int, new_len: int) -> None:
    """Issue 13 point 9: TE ``module/base.py`` ``adjust_amax_history_length`` (lines 1049-1080):
    ``amax_history[:length].clone()`` or ``F.pad(amax_history, (0, 0, 0, extra_rows))``; the scale
    is not touched."""
    import torch
    import torch.nn.functional as F

    s = DelayedScaler(DelayedScaling(amax_history_len=old_len, reduce_amax=False), n=2)
    s.amax_history[:] = np.arange(old_len * 2, dtype=np.float32).reshape(old_len, 2) + 1
    s.scale[:] = [3.0, 5.0]
    ref = torch.from_numpy(s.amax_history.copy())
    ref = ref[:new_len].clone() if new_len < old_len else F.pad(ref, pad=(0, 0, 0, new_len - old_len))
    s.set_recipe(DelayedScaling(amax_history_len=new_len, margin=1, reduce_amax=False))
    assert np.array_equal(s.amax_history, ref.numpy()) and s.scale.tolist() == [3.0, 5.0]
    s.update()  # the new recipe's margin applies from now on
    assert s.scale[0] == np.float32(448 / 2) / np.float32(ref[:, 0].max().item())


# -- issue 29.2: a bad state names the missing or malformed key -----------------------------------
_GOOD = {"scale": np.array([2.0, 4.0], np.float32), "amax_history": np.ones((4, 2), np.float32)}


@pytest.mark.parametrize(
    ("state", "exc", "names"),
    [
        ({}, ValueError, "'scale'"),
        ({"scale": _GOOD["scale"]}, ValueError, "'amax_history'"),
        ({**_GOOD, "scale_inv": np.ones(2)}, ValueError, "'scale_inv'"),
        ({**_GOOD, "scale": "two"}, ValueError, "state['scale']"),
        ({**_GOOD, "scale": None}, ValueError, "state['scale']"),
        ({**_GOOD, "amax_history": np.ones((3, 2))}, ValueError, r"state['amax_history'] has shape (3, 2)"),
        ({**_GOOD, "amax_history": [[1, 2], [3]]}, ValueError, "state['amax_history']"),
        ({**_GOOD, "scale": np.array([1 + 1j, 2])}, ValueError, "state['scale']"),
        ([("scale", 1.0)], TypeError, "state must be a dict"),
    ],
    ids=["empty", "no history", "extra key", "string", "None", "wrong shape", "ragged", "complex", "not a dict"],
)
def test_load_state_dict_names_the_missing_or_malformed_key(state, exc, names) -> None:  # noqa: ANN001
    s = DelayedScaler(DelayedScaling(amax_history_len=4), n=2)
    s.load_state_dict(_GOOD)
    with pytest.raises(exc) as info:
        s.load_state_dict(state)
    assert names in str(info.value)
    assert s.scale.tolist() == [2.0, 4.0] and s.amax_history.tolist() == np.ones((4, 2)).tolist()  # untouched


def test_load_state_dict_takes_torch_tensors_of_any_float_dtype() -> None:
    torch = require("torch")
    s = DelayedScaler(DelayedScaling(amax_history_len=4), n=2)
    s.load_state_dict({"scale": torch.tensor([2.0, 4.0], dtype=torch.bfloat16), "amax_history": torch.ones(4, 2)})
    assert s.scale.tolist() == [2.0, 4.0]
