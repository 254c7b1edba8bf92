"""fp8sim.pytorch: TE-style modules and autocast (issue 5; spec 4.2-4.9)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import (  # noqa: E402
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)


def _with_amax(shape: tuple, amax: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g) - 0.5) * amax  # |t| < amax / 2
    t[0, 0] = -amax
    return t


# Hand-computed from spec 4.3-4.5 (fused update, history 2, HYBRID): per step the input amax a,
# the grad amax g, then the forward (INPUT, WEIGHT) and backward (GRAD_OUTPUT) scales and histories
# after that step.  The weight's amax is 0.5 throughout; unused slots stay at scale 1.
STEPS = [
    (2.0, 8.0, (224.0, 896.0), ([0, 2], [0, 0.5]), 7168.0, [0, 8]),
    (4.0, 0.5, (112.0, 896.0), ([0, 4], [0, 0.5]), 7168.0, [0, 0.5]),
    (1.0, 2.0, (112.0, 896.0), ([0, 1], [0, 0.5]), 28672.0, [0, 2]),
]


def test_delayed_scaling_trajectory_and_update_timing_inside_a_module() -> None:
    m = te.Linear(16, 16, bias=False)
    with torch.no_grad():
        m.weight.copy_(_with_amax((16, 16), 0.5, 0))
    recipe = DelayedScaling(amax_history_len=2, reduce_amax=False)
    for i, (a, g, fwd_scales, fwd_hist, bwd_scale, bwd_hist) in enumerate(STEPS):
        x = _with_amax((16, 16), a, i + 1).requires_grad_()
        with te.autocast(recipe=recipe):
            y = m(x)
            state = m.fp8_gemms["gemm"]
            if i == 0:
                assert state.fwd.scale.tolist() == [1.0, 1.0, 1.0]  # step 1 casts with scale 1
        bwd_before = state.bwd.scale.copy()
        y.backward(_with_amax((16, 16), g, 100 + i))
        assert state.fwd.scale.tolist()[:2] == list(fwd_scales) and state.fwd.scale[2] == 1.0
        assert state.fwd.amax_history[:, 0].tolist() == fwd_hist[0]
        assert state.fwd.amax_history[:, 1].tolist() == fwd_hist[1]
        assert state.bwd.scale.tolist() == [bwd_scale, 1.0], f"step {i + 1}"
        assert state.bwd.amax_history[:, 0].tolist() == bwd_hist
        assert not np.array_equal(bwd_before, state.bwd.scale) or i == 1  # updated at the end of backward


def _q(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, fmax: float) -> torch.Tensor:
    """Independent oracle: torch's own cast after a clamp (satfinite), decoded to float32."""
    return (t * scale).clamp(-fmax, fmax).to(dtype).float()


def test_hybrid_current_scaling_gemms_equal_an_independent_computation() -> None:
    torch.manual_seed(3)
    m = te.Linear(32, 16, bias=False)
    x = (torch.randn(16, 32) * 3).requires_grad_()
    g = torch.randn(16, 16) * 1e-3
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    y.backward(g)
    f448, f57344 = torch.tensor(448.0), torch.tensor(57344.0)
    sx, sw, sg = f448 / x.detach().abs().max(), f448 / m.weight.detach().abs().max(), f57344 / g.abs().max()
    xq = _q(x.detach(), sx, torch.float8_e4m3fn, 448)
    wq = _q(m.weight.detach(), sw, torch.float8_e4m3fn, 448)
    gq = _q(g, sg, torch.float8_e5m2, 57344)  # HYBRID: gradients in E5M2
    inv = lambda s: 1 / s  # noqa: E731 - IEEE float32 reciprocal
    assert torch.equal(y.detach(), torch.matmul(xq, wq.t()) * (inv(sx) * inv(sw)))
    assert torch.equal(x.grad, torch.matmul(gq, wq) * (inv(sg) * inv(sw)))
    assert torch.equal(m.weight.grad, torch.matmul(gq.t(), xq) * (inv(sg) * inv(sx)))


def test_outside_autocast_modules_are_plain_layers() -> None:
    torch.manual_seed(4)
    m = te.LayerNormLinear(32, 16)
    x = torch.randn(8, 32)
    ln = torch.nn.functional.layer_norm(x, (32,), m.layer_norm_weight, m.layer_norm_bias, 1e-5)
    assert torch.equal(m(x), torch.nn.functional.linear(ln, m.weight, m.bias))
    with te.autocast(enabled=False):
        assert torch.equal(m(x), torch.nn.functional.linear(ln, m.weight, m.bias))


def test_calibrating_records_amaxes_without_fp8_compute() -> None:
    """TE updates forward scales only when an *enabled* outermost region exits: calibration stages
    the amaxes, and the next FP8 step's update uses them (TE quantization.py autocast_exit)."""
    m = te.Linear(16, 16)
    x = _with_amax((16, 16), 3.0, 5)
    recipe = DelayedScaling(amax_history_len=4)
    with te.autocast(enabled=False, calibrating=True, recipe=recipe):
        y = m(x)
    assert torch.equal(y, torch.nn.functional.linear(x, m.weight, m.bias))
    st = m.fp8_gemms["gemm"].fwd
    assert st.amax_history[0, 0] == 3.0 and st.scale[0] == 1.0
    with te.autocast(recipe=recipe):
        m(x * 0.5)  # amax 1.5 joins the staged 3.0
    assert st.amax_history[-1, 0] == 3.0 and st.scale[0] == np.float32(448.0 / 3.0)


def test_disabled_or_graph_outer_region_does_not_update_and_nested_recipe_none_is_te_default() -> None:
    m = te.Linear(16, 16)
    x = _with_amax((16, 16), 2.0, 6)
    with te.autocast(enabled=False), te.autocast(recipe=DelayedScaling()):
        m(x)
    assert m.fp8_gemms["gemm"].fwd.scale[0] == 1.0  # the outermost region was not enabled
    with te.autocast(recipe=DelayedScaling(), _graph=True):
        m(x)
    assert m.fp8_gemms["gemm"].fwd.scale[0] == 1.0
    with te.autocast(recipe=Float8CurrentScaling()), te.autocast():
        assert isinstance(te.get_recipe(), DelayedScaling)  # TE: recipe=None means the default recipe


def test_is_first_microbatch_caches_the_weight_and_its_scale() -> None:
    torch.manual_seed(6)
    m = te.Linear(16, 16, bias=False)
    x = torch.randn(16, 16)
    with te.autocast(recipe=Float8CurrentScaling()):
        y1 = m(x, is_first_microbatch=True)
        with torch.no_grad():
            m.weight.mul_(2)
        y2 = m(x, is_first_microbatch=False)  # reuses the cached FP8 weight
        y3 = m(x, is_first_microbatch=None)  # re-quantizes
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)


def test_state_dict_round_trip_keeps_the_fp8_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1")  # TE's opt-in for delayed-scaling pickles
    m = te.LayerNormMLP(32, 64)
    recipe = DelayedScaling(amax_history_len=3)
    for _ in range(2):
        x = torch.randn(16, 32, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = m(x)
        y.sum().backward()
    sd = m.state_dict()
    assert "_extra_state" in sd
    m2 = te.LayerNormMLP(32, 64)
    m2.load_state_dict(sd)
    for name in ("fc1", "fc2"):
        a, b = m.fp8_gemms[name], m2.fp8_gemms[name]
        assert np.array_equal(a.fwd.scale, b.fwd.scale) and np.array_equal(a.bwd.amax_history, b.bwd.amax_history)
    x = torch.randn(16, 32)
    with te.autocast(recipe=recipe), torch.no_grad():
        assert torch.equal(m(x), m2(x))


def test_no_grad_inference_does_not_update_forward_scales() -> None:
    m = te.Linear(16, 16)
    with torch.no_grad(), te.autocast(recipe=DelayedScaling()):
        y = m(torch.randn(16, 16))
    assert y.shape == (16, 16) and m.fp8_gemms["gemm"].fwd.scale.tolist() == [1.0, 1.0, 1.0]


def test_bad_arguments_raise_upstream_messages() -> None:
    with pytest.raises(AssertionError, match="Pure E5M2 training is not supported."):
        DelayedScaling(fp8_format=Format.E5M2)
    m = te.Linear(20, 16)
    # TE utils.py assert_dim_for_fp8_exec: a ValueError naming the product of leading dims and the last dim
    with te.autocast(recipe=DelayedScaling()), pytest.raises(ValueError, match="FP8 execution requires"):
        m(torch.randn(16, 20))
    with pytest.raises(TypeError, match="recipe must be an fp8sim.recipe recipe"):
        with te.autocast(recipe="delayed"):
            pass
    with pytest.raises(ValueError, match="activation must be one of"):
        te.LayerNormMLP(16, 32, activation="swish")


def test_fp8_autocast_is_the_deprecated_alias() -> None:
    m = te.Linear(16, 16)
    with pytest.warns(DeprecationWarning, match="fp8_autocast is deprecated"):
        ctx = te.fp8_autocast(enabled=True, fp8_recipe=Float8CurrentScaling())
    with ctx:
        assert te.is_fp8_enabled()
        m(torch.randn(16, 16))
    assert not te.is_fp8_enabled()


def test_hardware_accumulator_per_module_matches_scaled_mm() -> None:
    from fp8sim.gemm import scaled_mm

    torch.manual_seed(8)
    m = te.Linear(64, 16, bias=False, accumulator="hopper")
    x = torch.randn(16, 64)
    with te.autocast(recipe=Float8CurrentScaling()), torch.no_grad():
        y = m(x)
    sx = np.float32(448) / np.float32(x.abs().max())
    sw = np.float32(448) / np.float32(m.weight.detach().abs().max())

    # oracle codes from ml_dtypes after a clamp (satfinite), independent of fp8sim's cast
    xc = np.clip(x.numpy() * sx, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    wc = np.clip(m.weight.detach().numpy() * sw, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    want = scaled_mm(
        xc,
        wc.T,
        np.float32(1) / sx,
        np.float32(1) / sw,
        out_dtype="float32",
        accumulator="hopper_fast",
        a_format="e4m3",
        b_format="e4m3",
        strict=False,
    )
    assert np.array_equal(y.numpy(), want)


@pytest.mark.parametrize(
    "recipe",
    [DelayedScaling(), Float8CurrentScaling(), MXFP8BlockScaling(), Float8BlockScaling(), NVFP4BlockScaling()],
    ids=lambda r: type(r).__name__,
)
def test_every_recipe_trains_a_step_close_to_high_precision(recipe) -> None:  # noqa: ANN001
    torch.manual_seed(9)
    m = te.LayerNormMLP(64, 128)
    x = torch.randn(32, 64, requires_grad=True)
    ref = m(x)
    ref.square().mean().backward()
    ref_grad = m.fc1_weight.grad.clone()
    m.zero_grad()
    x.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # delayed scaling needs one step to calibrate
            m.zero_grad()
            with te.autocast(recipe=recipe):
                y = m(x)
            y.square().mean().backward()
    tol = 0.35 if isinstance(recipe, NVFP4BlockScaling) else 0.1
    assert torch.isfinite(y).all() and torch.isfinite(m.fc1_weight.grad).all()
    assert (y - ref).norm() / ref.norm() < tol
    assert (m.fc1_weight.grad - ref_grad).norm() / ref_grad.norm() < 2 * tol


@pytest.mark.parametrize(
    ("recipe", "acc"),
    [(MXFP8BlockScaling(), "blackwell"), (Float8BlockScaling(), "hopper"), (NVFP4BlockScaling(), "blackwell")],
    ids=["mxfp8", "block", "nvfp4"],
)
def test_block_recipes_run_the_hardware_accumulators(recipe, acc: str) -> None:  # noqa: ANN001
    from fp8sim.gemm import scaled_mm
    from fp8sim.scaling import quantize_block_scaling, quantize_mx, quantize_nvfp4

    torch.manual_seed(10)
    m = te.Linear(256, 128, bias=False)
    x = torch.randn(128, 256)
    with te.autocast(recipe=recipe, accumulator=acc), torch.no_grad():
        y = m(x)
    w = m.weight.detach()
    if isinstance(recipe, MXFP8BlockScaling):
        qx = quantize_mx(x.numpy(), "e4m3", scale_rule="rceil", flavor="te")
        qw = quantize_mx(w.numpy(), "e4m3", scale_rule="rceil", flavor="te")
        want = scaled_mm(
            qx.codes,
            qw.codes.T,
            qx.scales,
            qw.scales.T,
            out_dtype="float32",
            accumulator="blackwell",
            a_format="e4m3",
            b_format="e4m3",
            strict=False,
        )
    elif isinstance(recipe, Float8BlockScaling):
        qx, qw = quantize_block_scaling(x.numpy()), quantize_block_scaling(w.numpy(), block_dim=2)
        want = scaled_mm(
            qx.codes,
            qw.codes.T,
            qx.scales,
            qw.scales.T,
            out_dtype="float32",
            accumulator="hopper_split",
            a_format="e4m3",
            b_format="e4m3",
            strict=False,
        )
    else:
        qx, qw = quantize_nvfp4(x.numpy()), quantize_nvfp4(w.numpy(), block_2d=True)
        sw = np.repeat(qw.scales, 16, axis=0)  # 16x16 weight tiles as one 1x16 scale per row
        want = scaled_mm(
            qx.codes,
            qw.codes.T,
            qx.scales,
            sw.T,
            out_dtype="float32",
            accumulator="blackwell",
            a_format="e2m1",
            b_format="e2m1",
            strict=False,
        )
        want = want * np.float32(np.float32(qx.global_scale) * np.float32(qw.global_scale))
    assert np.array_equal(y.numpy(), want)


def _module_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        m = te.Linear(16, 16, bias=False)  # same weights on both ranks
        recipe = DelayedScaling(amax_history_len=2)
        scales = []
        for step in range(2):
            x = _with_amax((16, 16), 2.0 if rank == 0 else 6.0 + step, 10 + rank).requires_grad_()
            with te.autocast(recipe=recipe, amax_reduction_group=dist.group.WORLD):
                y = m(x)
            y.backward(_with_amax((16, 16), 1.0 if rank == 0 else 4.0, 20 + rank))
            st = m.fp8_gemms["gemm"]
            scales.append(np.concatenate([st.fwd.scale, st.bwd.scale]))
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.stack(scales))
        dist.barrier()  # issue 16: no rank tears down its gloo pairs while the peer still uses them
    finally:
        dist.destroy_process_group()


def test_amax_reduction_group_makes_both_ranks_share_scales(tmp_path) -> None:  # noqa: ANN001
    mp = require("torch.multiprocessing")
    mp.spawn(_module_worker, args=(2, f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=2, join=True)
    r0, r1 = np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy")
    assert np.array_equal(r0, r1)
    # step 1: input amax MAX-reduced to 6 -> 448/6; grad amax to 4 -> 57344/4; step 2: history max 7
    assert r0[0, 0] == np.float32(448) / np.float32(6) and r0[0, 3] == np.float32(57344 / 4)
    assert r0[1, 0] == np.float32(448) / np.float32(7)


def test_under_bf16_autocast_activations_are_bf16_and_the_output_is_rounded_once() -> None:
    """TE takes the autocast dtype as the activation dtype: input, weight and bias are cast to bf16
    before quantization and the float32 GEMM result is rounded to bf16 once."""
    torch.manual_seed(12)
    m = te.Linear(32, 16)
    x = torch.randn(16, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), te.autocast(recipe=Float8CurrentScaling()):
        y = m(x)
    assert y.dtype == torch.bfloat16
    xb, wb, bb = (t.detach().bfloat16().float() for t in (x, m.weight, m.bias))
    f448 = torch.tensor(448.0)
    sx, sw = f448 / xb.abs().max(), f448 / wb.abs().max()
    xq = _q(xb, sx, torch.float8_e4m3fn, 448)
    wq = _q(wb, sw, torch.float8_e4m3fn, 448)
    want = (torch.matmul(xq, wq.t()) * ((1 / sx) * (1 / sw)) + bb).bfloat16()
    assert torch.equal(y, want)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and m.weight.grad.dtype == torch.float32


def test_block_scaling_with_a_hardware_accumulator_takes_partial_blocks() -> None:
    torch.manual_seed(15)
    m = te.Linear(256, 128)
    x = torch.randn(40, 256, requires_grad=True)  # 40 rows: partial 128-row blocks in wgrad
    with te.autocast(recipe=Float8BlockScaling()):
        ref = m(x)
    with te.autocast(recipe=Float8BlockScaling(), accumulator="hopper"):
        y = m(x)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(m.weight.grad).all()
    assert ((y - ref).norm() / ref.norm()).item() < 1e-3
