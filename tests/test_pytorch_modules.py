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
    """Default accumulator: fprop, dgrad, wgrad are the exact products of the independently cast operands summed
    in float32 (``tests/_gemm_reference.py``: bits where every float32 order is exact, within gamma_K * sum|p|
    elsewhere, where BLAS's order is the contract), then ``fl32(sinv_a * sinv_b)``."""
    import _gemm_reference as gref

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
    inv = lambda s: float(1 / s)  # noqa: E731 - IEEE float32 reciprocal
    exact = gref.assert_default_accumulation(y, xq, wq.t(), inv(sx), inv(sw), "fprop")
    exact += gref.assert_default_accumulation(x.grad, gq, wq, inv(sg), inv(sw), "dgrad")
    exact += gref.assert_default_accumulation(m.weight.grad, gq.t(), xq, inv(sg), inv(sx), "wgrad")
    assert exact > 0


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
    """A LayerNormMLP step under each recipe stays near the float32 step (relative norm 0.1, 0.35 for NVFP4):
    a smoke test of the whole path at training scale.  Loose on purpose: FP8 rounding is the difference being
    measured, so bits are not the contract here; every recipe's bits are checked in the tests above."""
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
    with torch.autocast("cpu", dtype=torch.bfloat16), te.autocast(recipe=Float8CurrentScaling(), accumulator="exact"):
        y = m(x)
    assert y.dtype == torch.bfloat16
    xb, wb, bb = (t.detach().bfloat16().float() for t in (x, m.weight, m.bias))
    f448 = torch.tensor(448.0)
    sx, sw = f448 / xb.abs().max(), f448 / wb.abs().max()
    xq = _q(xb, sx, torch.float8_e4m3fn, 448)
    wq = _q(wb, sw, torch.float8_e4m3fn, 448)
    import _gemm_reference as gref  # the exact accumulator: the exact sum rounded once, not torch.matmul

    want = (torch.from_numpy(gref.rn_f32(xq, wq.t())) * ((1 / sx) * (1 / sw)) + bb).bfloat16()
    assert torch.equal(y, want)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and m.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("fmt", ["HYBRID", "E4M3"])
def test_delayed_scaling_fp8_format_picks_the_gradient_format(fmt: str) -> None:
    """``DelayedScaling(fp8_format=...)``: HYBRID casts gradients to E5M2, E4M3 to E4M3 (TE recipe docstring;
    spec 4.1-4.2); forward operands E4M3 either way.  First step, every scale 1: dgrad is the exact products of
    ``satfinite(dy)`` in the gradient format and the E4M3 weight, summed in float32."""
    import _gemm_reference as gref
    import ml_dtypes

    from fp8sim.recipe import Format

    torch.manual_seed(18)
    m = te.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    dy = torch.randn(16, 32) * 0.3
    with te.autocast(recipe=DelayedScaling(fp8_format=Format[fmt])):
        y = m(x)
    y.backward(dy)
    gdt, gmax = (ml_dtypes.float8_e5m2, 57344.0) if fmt == "HYBRID" else (ml_dtypes.float8_e4m3fn, 448.0)
    vg = torch.from_numpy(np.clip(dy.numpy(), -gmax, gmax).astype(gdt).astype(np.float32))
    vw = torch.from_numpy(
        np.clip(m.weight.detach().numpy(), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    )
    gref.assert_default_accumulation(x.grad, vg, vw, what="dgrad")
    other = ml_dtypes.float8_e4m3fn if fmt == "HYBRID" else ml_dtypes.float8_e5m2
    assert not np.array_equal(dy.numpy().astype(other).astype(np.float32), vg.numpy())


@pytest.mark.parametrize("dims", [(2, 1, 1), (1, 1, 2), (1, 1, 1)], ids=lambda d: "x{}w{}g{}".format(*d))
def test_float8_block_scaling_dims_pick_each_operands_tiles(dims: tuple[int, int, int]) -> None:
    """``Float8BlockScaling(x_block_scaling_dim, w_block_scaling_dim, grad_block_scaling_dim)``: each operand is
    cast with 128x128 tiles where its dim is 2, else 1x128 along the GEMM's reduction (128x1 for a reduction
    over rows: the weight in dgrad), by the scaling layer's TE blockwise quantizer (checked against TE's
    reference in test_pytorch_tensor_blockwise.py).  fprop and dgrad: those dequantized operands' exact products
    summed in float32 (``tests/_gemm_reference.py``: bits where every order is exact, within gamma_K * sum|p|
    elsewhere)."""
    import _gemm_reference as gref

    from fp8sim.scaling.block import quantize_block_scaling

    xd, wd, gd = dims
    recipe = Float8BlockScaling(x_block_scaling_dim=xd, w_block_scaling_dim=wd, grad_block_scaling_dim=gd)
    torch.manual_seed(16)
    m = te.Linear(256, 128, bias=False)
    with torch.no_grad():  # magnitudes that vary along rows and columns: 1x128 and 128x128 tiles differ
        m.weight.mul_(torch.logspace(-2, 2, 128)[:, None])
    g = torch.Generator().manual_seed(17)
    x = (torch.randn(128, 256, generator=g) * torch.logspace(-2, 2, 128)[:, None]).requires_grad_()
    dy = torch.randn(128, 128, generator=g) * torch.logspace(-4, 0, 128)[:, None]
    with te.autocast(recipe=recipe):
        y = m(x)
    y.backward(dy)
    w = m.weight.detach().numpy()

    def deq(t: np.ndarray, dim: int, columnwise: bool = False) -> torch.Tensor:
        q = quantize_block_scaling(t, "e4m3", block_dim=dim, columnwise=columnwise and dim == 1, pow2=True)
        return torch.from_numpy(q.dequantize())

    qx, qw_row = deq(x.detach().numpy(), xd), deq(w, wd)
    qg, qw_col = deq(dy.numpy(), gd), deq(w, wd, columnwise=True)
    n = gref.assert_default_accumulation(y, qx, qw_row.t(), what="fprop")
    n += gref.assert_default_accumulation(x.grad, qg, qw_col, what="dgrad")
    assert n > 0
    # the other tiling of each operand gives other operands: a dropped dim would fail the checks above
    assert not torch.equal(deq(x.detach().numpy(), 3 - xd), qx)
    assert not torch.equal(deq(w, 3 - wd), qw_row) and not torch.equal(deq(dy.numpy(), 3 - gd), qg)


def test_block_scaling_with_a_hardware_accumulator_accepts_partial_blocks_and_stays_near_the_default() -> None:
    """Float8BlockScaling with ``accumulator="hopper"`` and 40 rows (wgrad's K ends in a partial 128-block): the
    call and its backward run and the output stays within 1e-3 (relative norm) of the default accumulator's.
    Loose on purpose: the Hopper chain truncates where the default sums in float32, so bits differ; the bits of
    the block-scaled Hopper GEMM are checked in :func:`test_block_recipes_run_the_hardware_accumulators`."""
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
