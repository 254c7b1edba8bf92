"""Edges of the TE modules that the mutation sample of ``fp8sim/pytorch/module`` found untested (issue 30).

References: TE at d0067d0 (2.20.0.dev0), torch's own ops, and exact arithmetic (small integers, so a GEMM
in any summation order is exact and equals the float64 product).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, Format  # noqa: E402

torch.set_num_threads(1)


def _ints(*shape: int, seed: int) -> torch.Tensor:
    """Small integers in float32: every product and sum below is exact."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).float()


def test_gated_activation_splits_the_last_dim_of_a_3d_input() -> None:
    """TE linear.py:586 and layernorm_mlp.py: leading dims are flattened, the gated unit halves the feature
    dim: a (seq, batch, hidden) input gives the (seq * batch, hidden) result, bit for bit."""
    torch.manual_seed(1)
    mlp = te.LayerNormMLP(16, 8, activation="swiglu")
    x = torch.randn(3, 2, 16)
    assert torch.equal(mlp(x).reshape(6, 16), mlp(x.reshape(6, 16)))


@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm])
def test_a_norm_over_one_feature_is_accepted_and_computes_as_torch(cls: type) -> None:
    """TE layernorm.py:61 takes any ``normalized_shape`` >= 1; over one feature LayerNorm is beta (x - mean
    is 0) and RMSNorm is ``x / sqrt(x^2 + eps)`` (torch.nn.functional.rms_norm)."""
    x = torch.tensor([[-3.0], [0.5], [2.0]])
    m = cls(1)
    want = (
        torch.nn.functional.layer_norm(x, (1,), eps=1e-5)
        if cls is te.LayerNorm
        else torch.nn.functional.rms_norm(x, (1,), eps=1e-5)
    )
    assert m.normalized_shape == (1,) and torch.equal(m(x), want)


def test_a_bad_norm_size_is_named_by_the_argument_given() -> None:
    """The error names ``normalized_shape``, or the deprecated ``hidden_size`` (TE layernorm.py:66-82) it came as."""
    with pytest.raises(ValueError, match=r"^normalized_shape must be an int >= 1, got 0$"):
        te.LayerNorm(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=r"^hidden_size must be an int >= 1, got 0$"):
            te.RMSNorm(hidden_size=0)


def test_layernorm_mlp_refuses_userbuffers_with_the_whole_reason() -> None:
    want = (
        "transformer_engine.pytorch.LayerNormMLP: Userbuffers (ub_overlap_* / ub_bulk_*: TE's overlap of "
        "tensor-parallel communication with the GEMMs) needs CUDA: peer-to-peer buffers shared by several "
        "GPUs; it is not emulated by fp8sim"
    )
    with pytest.raises(NotImplementedError, match=f"^{re.escape(want)}$"):
        te.LayerNormMLP(16, 16, ub_bulk_wgrad=True)


def test_layernorm_mlp_return_bias_without_a_bias_returns_none() -> None:
    """TE layernorm_mlp.py:2344 and 2467: ``fc2_bias`` is None without ``bias``; ``return_bias`` returns it."""
    torch.manual_seed(2)
    mlp = te.LayerNormMLP(16, 32, bias=False, return_bias=True)
    x = torch.randn(4, 16)
    out, bias = mlp(x)
    plain = te.LayerNormMLP(16, 32, bias=False)
    plain.load_state_dict(mlp.state_dict())
    assert bias is None and torch.equal(out, plain(x))


def test_layernorm_mlp_tensor_parallel_shards_the_ffn_dim() -> None:
    """TE layernorm_mlp.py:2033: ``size_per_partition = divide(ffn_hidden_size, tp_size)``; fc1 is twice that for
    a gated activation, fc2 takes it in."""
    mlp = te.LayerNormMLP(16, 32, tp_size=2, set_parallel_mode=True, activation="swiglu")
    assert mlp.fc1_weight.shape == (32, 16) and mlp.fc2_weight.shape == (16, 16)
    assert te.LayerNormMLP(16, 32, tp_size=4, set_parallel_mode=True).fc1_weight.shape == (8, 16)


@pytest.mark.parametrize("first_microbatch", [None, True, False])
def test_high_precision_linear_without_bias_and_main_grad_follow_is_first_microbatch(first_microbatch) -> None:  # noqa: ANN001
    """Without FP8: TE linear.py:1230-1236, ``accumulate_wgrad_into_param_main_grad`` is
    ``fuse_wgrad_accumulation and not is_first_microbatch`` (accumulate when it is None); a module without a
    bias returns no bias gradient.  Oracle: exact float64 products of small integers."""
    m = te.Linear(16, 8, bias=False, fuse_wgrad_accumulation=True)
    w, x, g = _ints(8, 16, seed=3), _ints(4, 16, seed=4), _ints(4, 8, seed=5)
    with torch.no_grad():
        m.weight.copy_(w)
    m.weight.main_grad = torch.ones(8, 16)
    xr = x.clone().requires_grad_(True)
    y = m(xr, is_first_microbatch=first_microbatch)
    assert torch.equal(y.double(), x.double() @ w.double().t())
    y.backward(g)
    dw = g.double().t() @ x.double()
    want = dw if first_microbatch else 1 + dw
    assert m.weight.grad is None and torch.equal(m.weight.main_grad.double(), want)
    assert torch.equal(xr.grad.double(), g.double() @ w.double())


def test_calibration_records_the_amax_of_one_element_tensors() -> None:
    """TE linear.py (``fp8_calibration``): the input's and the weight's amax go to the staging history row,
    also for tensors of one element: |x| and |w|."""
    m = te.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(2.0)
    with te.autocast(enabled=False, calibrating=True, recipe=DelayedScaling()):
        m(torch.tensor([[-3.0]]))
    assert m.fp8_gemms["gemm"].fwd.amax_history[0, :2].tolist() == [3.0, 2.0]


@pytest.mark.parametrize("make", [lambda: te.Linear(16, 16), lambda: te.LayerNormMLP(16, 16)])
def test_fp8_meta_states_carry_their_direction(make) -> None:  # noqa: ANN001
    """TE quantization.py ``DelayedScalingRecipeState``: ``scaling_fwd`` is the forward state (HYBRID: E4M3),
    ``scaling_bwd`` the backward one (E5M2), for one GEMM and for several."""
    m = make()
    with te.autocast(recipe=DelayedScaling(fp8_format=Format.HYBRID)):
        m(torch.randn(16, 16))
    fwd, bwd = m.fp8_meta["scaling_fwd"], m.fp8_meta["scaling_bwd"]
    assert (fwd.mode, fwd.dtype, bwd.mode, bwd.dtype) == ("forward", DType.kFloat8E4M3, "backward", DType.kFloat8E5M2)


def test_rmsnorm_layernorm_linear_is_tes_rmsnorm_then_the_fp8_linear() -> None:
    """TE layernorm_linear.py (``normalization="RMSNorm"``): the float32 RMSNorm of TE's kernel
    (rmsnorm_fwd_kernels.cuh: ``rs = rsqrt(mean(x^2) + eps)``, ``z = g * (rs * x)``), rounded to bf16 under current
    scaling, then the FP8 GEMM; its backward is the norm's, whose autograd (``te.RMSNorm``: torch's own ops)
    gives the reference input and gamma gradients from the same norm-output gradient."""
    torch.manual_seed(6)
    m = te.LayerNormLinear(32, 16, bias=False, normalization="RMSNorm", params_dtype=torch.bfloat16)
    norm, lin = te.RMSNorm(32, params_dtype=torch.bfloat16), te.Linear(32, 16, bias=False, params_dtype=torch.bfloat16)
    with torch.no_grad():
        m.layer_norm_weight.copy_(torch.rand(32) + 0.5)
        norm.weight.copy_(m.layer_norm_weight)
        lin.weight.copy_(m.weight)
    x = torch.randn(8, 32).to(torch.bfloat16)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    g = torch.randn(8, 16).to(torch.bfloat16)
    with te.autocast(recipe=Float8CurrentScaling()):
        y = m(xs[0])
        ln = norm(xs[1])
        ref = lin(ln)
    x32 = x.float()
    rs = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.equal(ln, (m.layer_norm_weight.detach().float() * (rs * x32)).to(torch.bfloat16))
    assert torch.equal(y, ref)
    y.backward(g)
    ref.backward(g)
    assert torch.equal(xs[0].grad, xs[1].grad) and torch.equal(m.layer_norm_weight.grad, norm.weight.grad)


def test_grouped_linear_refuses_tensor_parallel_sizes() -> None:
    """TE grouped_linear.py:1710-1736 shards the features by ``tp_size`` but leaves the communication to the
    caller; fp8sim refuses ``tp_size > 1`` for GroupedLinear rather than build unsharded weights."""
    with pytest.raises(NotImplementedError, match=r"GroupedLinear with tp_size=2 is not emulated across processes"):
        te.GroupedLinear(2, 16, 32, tp_size=2, parallel_mode="column")


def test_layernorm_linear_casts_the_norm_parameters_to_the_autocast_dtype() -> None:
    """TE layernorm_linear.py:189: ``ln_weight = cast_if_needed(ln_weight, activation_dtype)`` (and the bias):
    float32 parameters under ``torch.autocast(bf16)`` enter the float32 norm as bf16 values."""
    torch.manual_seed(9)
    m = te.LayerNormLinear(32, 16, return_layernorm_output=True)
    with torch.no_grad():
        m.layer_norm_weight.copy_(torch.rand(32) + 0.5)
        m.layer_norm_bias.copy_(torch.randn(32) * 0.1)
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, ln = m(x)
    w, b = (p.detach().to(torch.bfloat16).float() for p in (m.layer_norm_weight, m.layer_norm_bias))
    want = torch.nn.functional.layer_norm(x.to(torch.bfloat16).float(), (32,), w, b, 1e-5).to(torch.bfloat16)
    assert torch.equal(ln, want)
    unrounded = torch.nn.functional.layer_norm(
        x.to(torch.bfloat16).float(), (32,), m.layer_norm_weight.detach(), m.layer_norm_bias.detach(), 1e-5
    ).to(torch.bfloat16)
    assert not torch.equal(ln, unrounded)  # the test can tell them apart


def test_fp8sims_per_gemm_extra_state_dict_loads_every_scaler() -> None:
    """fp8sim's per-GEMM ``_extra_state`` dict (``set_extra_state``): each GEMM's forward and backward scale and
    amax history are loaded as given, for every GEMM of the module."""
    mlp = te.LayerNormMLP(16, 16)
    state = {
        name: {
            "fwd_scale": torch.tensor([2.0, 4.0, 1.0]) * (i + 1),
            "fwd_amax_history": torch.full((3, 3), 0.5 + i),
            "bwd_scale": torch.tensor([8.0, 1.0]) * (i + 1),
            "bwd_amax_history": torch.full((3, 2), 0.25 + i),
        }
        for i, name in enumerate(("fc1", "fc2"))
    }
    mlp.set_extra_state(state)
    for name, st in state.items():
        g = mlp.fp8_gemms[name]
        assert g.fwd.scale.tolist() == st["fwd_scale"].tolist() and g.bwd.scale.tolist() == st["bwd_scale"].tolist()
        assert g.fwd.amax_history.tolist() == st["fwd_amax_history"].tolist()
        assert g.bwd.amax_history.tolist() == st["bwd_amax_history"].tolist()


@pytest.mark.parametrize(
    ("make", "gemms"),
    [
        (lambda: te.Linear(32, 16), [("", 32, 16)]),
        (lambda: te.LayerNormMLP(32, 64), [("fc2", 64, 32), ("fc1", 32, 64)]),
    ],
)
def test_backward_override_gemms_are_recorded_as_high_precision_plans(make, gemms) -> None:  # noqa: ANN001
    """``fp8sim explain``'s plans (fp8sim/gemm/plans.py ``GemmPlan``) under ``backward_override="high_precision"``:
    every FP8 fprop named by its module GEMM ("" for a module of one GEMM), and each dgrad (M tokens, N in, K out)
    and wgrad (M out, N in, K tokens) a high-precision bf16 GEMM of that GEMM."""
    from fp8sim.gemm.plans import record_plans

    m = make().to(torch.bfloat16)
    x = torch.randn(8, 32).to(torch.bfloat16).requires_grad_()
    with record_plans() as rec:
        with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
            y = m(x)
        y.float().sum().backward()
    got = [(p.gemm, p.role, p.m, p.n, p.k, p.a_format, p.b_format, p.scaling, p.out_dtype) for p in rec.plans]
    fprops = [(g, "fprop", 8, o, i, "e4m3", "e4m3", "tensorwise", "bfloat16") for g, i, o in reversed(gemms)]
    hp = ("bfloat16", "bfloat16", "high precision", "bfloat16")
    back = []
    for g, i, o in gemms:
        back += [(g, "dgrad", 8, i, o, *hp), (g, "wgrad", o, i, 8, *hp)]
    assert got == fprops + back


def test_ada_accumulator_runs_fprop_fast_and_the_gradients_split() -> None:
    """``accumulator="ada"`` picks per GEMM as TE's module constants (base.py ``_2X_ACC_*``): fprop the fast Ada
    chain, dgrad and wgrad the split one; the gradients are those of the ``ada_split`` preset named directly."""
    from fp8sim.gemm.plans import record_plans

    torch.manual_seed(10)
    m = te.Linear(32, 16)
    x, g = torch.randn(64, 32), torch.randn(64, 16)
    grads = []
    for acc in ("ada", "ada_split"):
        xr = x.clone().requires_grad_(True)
        with record_plans() as rec:
            with te.autocast(recipe=Float8CurrentScaling(), accumulator=acc):
                y = m(xr)
            y.backward(g)
        grads.append(xr.grad)
        if acc == "ada":
            assert [(p.role, p.accumulator) for p in rec.plans] == [
                ("fprop", "ada_fast"), ("dgrad", "ada_split"), ("wgrad", "ada_split")
            ]  # fmt: skip
    assert torch.equal(grads[0], grads[1])


def test_get_dummy_wgrad_zeroes_only_on_request() -> None:
    """TE module/base.py:134-148: ``zero=False`` by default, the cached buffer is handed back as it is."""
    from fp8sim.pytorch.module import base

    a = base.get_dummy_wgrad([5, 3], torch.float32)
    a.fill_(5.0)
    assert torch.equal(base.get_dummy_wgrad([5, 3], torch.float32), torch.full((5, 3), 5.0))
    assert torch.equal(base.get_dummy_wgrad([5, 3], torch.float32, zero=True), torch.zeros(5, 3))


def test_grouped_linear_make_grouped_weights_refuses_unless_deferred() -> None:
    """TE grouped_linear.py:1868-1874: ``defer_init=False`` by default; deferred, it returns at once."""
    m = te.GroupedLinear(2, 16, 16)
    assert m.make_grouped_weights(defer_init=True) is None
    with pytest.raises(NotImplementedError):
        m.make_grouped_weights()


def test_fp8_unpadding_backward_pads_the_gradient_with_zero_rows_and_runs_without_grad() -> None:
    """TE fp8_unpadding.py: the forward keeps the first ``m_splits[i]`` rows of each padded split; its backward
    pads the gradient back with zero rows (``fused_multi_row_padding``); under ``no_grad`` the same rows."""
    torch.manual_seed(0)
    y = torch.randn(48, 8, requires_grad=True)  # splits [3, 20, 0] padded to [16, 32, 0]
    unpad = te.Fp8Unpadding(3, align_size=16)
    z = unpad(y, [3, 20, 0])
    keep = torch.cat([y.detach()[0:3], y.detach()[16:36]])
    assert torch.equal(z, keep)
    g = torch.randn(23, 8)
    z.backward(g)
    want = torch.zeros(48, 8)
    want[0:3], want[16:36] = g[0:3], g[3:23]
    assert torch.equal(y.grad, want)
    with torch.no_grad():  # inference: fp8sim raised AttributeError here (a ctx of None) before the fix
        assert torch.equal(unpad(y, [3, 20, 0]), keep)
        padded, splits = te.Fp8Padding(3, align_size=16)(keep, [3, 20, 0])
        rows = torch.zeros(48, 8)
        rows[0:3], rows[16:36] = keep[0:3], keep[3:23]
        assert splits == [16, 32, 0] and torch.equal(padded, rows)


def test_the_backward_gemms_write_tes_output_dtypes() -> None:
    """TE linear.py: an ``fp8_output`` fprop is written with the forward OUTPUT quantizer (HYBRID: E4M3) and
    (line 1091) an ``fp8_grad`` dgrad is written by the GEMM with the grad-input quantizer, a backward
    one (HYBRID: E5M2) under delayed scaling; linear.py:1250-1251: a fused wgrad is written in ``main_grad``'s
    dtype.  The plans (``fp8sim explain``) name the dtype each GEMM writes."""
    from fp8sim.gemm.plans import record_plans

    m = te.Linear(32, 16, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True)
    m.weight.main_grad = torch.zeros(16, 32)
    x = torch.randn(16, 32).to(torch.bfloat16).requires_grad_()
    with record_plans() as rec:
        with te.autocast(recipe=DelayedScaling(fp8_format=Format.HYBRID)):
            y = m(x, fp8_output=True, fp8_grad=True)
        y.float().sum().backward()
    assert [(p.role, p.out_dtype) for p in rec.plans] == [
        ("fprop", "e4m3"),
        ("dgrad", "e5m2"),
        ("wgrad", "float32"),
    ]


@pytest.mark.parametrize("first_microbatch", [True, False])
def test_high_precision_backward_override_accumulates_wgrad_into_main_grad(first_microbatch: bool) -> None:
    """TE linear.py:1230-1236 also under ``backward_override="high_precision"`` (its wgrad GEMM takes the original
    input and gradient): accumulated into ``main_grad`` unless ``is_first_microbatch``.  Exact integers."""
    m = te.Linear(16, 8, bias=False, fuse_wgrad_accumulation=True)
    x, g = _ints(16, 16, seed=6), _ints(16, 8, seed=7)
    m.weight.main_grad = torch.ones(8, 16)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
        y = m(x, is_first_microbatch=first_microbatch)
    y.backward(g)
    dw = g.double().t() @ x.double()
    assert torch.equal(m.weight.main_grad.double(), dw if first_microbatch else 1 + dw)


def test_a_weight_that_overwrites_main_grad_is_not_accumulated_into() -> None:
    """TE linear.py:751 and 1256-1259: ``weight.overwrite_main_grad = True`` (Megatron) makes the wgrad GEMM write
    ``main_grad`` instead of accumulating into it, whatever ``is_first_microbatch``.  Exact integers."""
    m = te.Linear(16, 8, bias=False, fuse_wgrad_accumulation=True)
    x, g = _ints(16, 16, seed=8), _ints(16, 8, seed=9)
    m.weight.main_grad = torch.ones(8, 16)
    m.weight.overwrite_main_grad = True
    m(x).backward(g)
    assert torch.equal(m.weight.main_grad.double(), g.double().t() @ x.double())


def test_only_the_regions_first_grouped_linear_updates_the_backward_scales() -> None:
    """TE grouped_linear.py:978-981: ``reduce_and_update_bwd_fp8_tensors`` is set under FP8 for the region's first
    module only (``is_first_fp8_module``): a second GroupedLinear in the same region leaves it False."""
    a, b = te.GroupedLinear(2, 32, 32), te.GroupedLinear(2, 32, 32)
    x = torch.randn(64, 32, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling()):
        h = a(x, [32, 32])
        y = b(h, [32, 32])
    assert h.grad_fn.fp8 and h.grad_fn.reduce_and_update_bwd_fp8_tensors
    assert y.grad_fn.fp8 and not y.grad_fn.reduce_and_update_bwd_fp8_tensors


def test_sequence_parallel_refuses_a_high_precision_backward_override_before_any_collective() -> None:
    """fp8sim refuses ``sequence_parallel`` with ``backward_override="high_precision"`` (TE re-gathers the original
    input in backward, not emulated) in the forward's checks, before the module touches its (here unusable) group."""
    m = te.Linear(32, 64, tp_size=2, parallel_mode="column", sequence_parallel=True)
    m.set_tensor_parallel_group(object())
    want = "fp8sim: sequence_parallel with backward_override='high_precision' (TE re-gathers the original input)"
    with pytest.raises(NotImplementedError, match=f"^{re.escape(want)}$"):
        with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
            m(torch.randn(16, 32))


@pytest.fixture
def group_of_one():  # noqa: ANN201
    """A gloo group of this process alone: TE's collectives over it are identities."""
    import tempfile

    dist = require("torch.distributed")
    own = not dist.is_initialized()
    if own:
        with tempfile.NamedTemporaryFile(delete=False) as f:
            store = dist.FileStore(f.name, 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if dist.get_world_size() != 1:
        pytest.fail("a process group of several ranks is already initialised in this process")
    try:
        yield dist.new_group([0])
    finally:
        if own:
            dist.destroy_process_group()


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["column", "row"])
def test_a_tensor_parallel_linear_over_one_rank_is_the_local_linear_of_its_shard(group_of_one, mode, sp) -> None:  # noqa: ANN001
    """TE linear.py with ``tp_size=2`` and a group of one rank: the column layer's copy/all-gather and the row layer's
    all-reduce/reduce-scatter are identities, the row layer adds its bias after the reduction: output and every
    gradient are those of a plain Linear holding the same shard (``tp_size`` 2 keeps the shapes of one of two)."""
    torch.manual_seed(0)
    m = te.Linear(32, 64, tp_size=2, parallel_mode=mode, sequence_parallel=sp)
    m.set_tensor_parallel_group(group_of_one)
    ref = te.Linear(m.weight.shape[1], m.weight.shape[0])
    with torch.no_grad():
        ref.weight.copy_(m.weight)
        ref.bias.copy_(m.bias)
    x = torch.randn(16, m.weight.shape[1])
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    with te.autocast(recipe=Float8CurrentScaling()):
        ys = [m(xs[0]), ref(xs[1])]
    assert torch.equal(ys[0], ys[1])
    for y in ys:
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
    assert torch.equal(xs[0].grad, xs[1].grad) and torch.equal(m.weight.grad, ref.weight.grad)
    assert torch.equal(m.bias.grad, ref.bias.grad)


def test_custom_recipe_boundary_roles_reach_the_factory() -> None:
    """TE linear.py:1816-1840 ``get_quantizer_roles``: the output slot takes ``output_quantizer_role`` and the
    grad-input slot ``grad_input_quantizer_role`` (the consumers' identities) when they are set."""
    from fp8sim.pytorch.constants import DType as D
    from fp8sim.pytorch.tensor import QuantizerRole
    from fp8sim.recipe import CustomRecipe

    seen: list = []

    def qfactory(role):  # noqa: ANN001, ANN202
        seen.append(role)
        return te.Float8CurrentScalingQuantizer(D.kFloat8E4M3)

    lin = te.Linear(32, 32, name="proj")
    out_role, gi_role = QuantizerRole("linear", "input", "next"), QuantizerRole("linear", "grad_output", "prev")
    lin.output_quantizer_role, lin.grad_input_quantizer_role = out_role, gi_role
    with te.autocast(recipe=CustomRecipe(qfactory=qfactory)):
        lin(torch.randn(16, 32))
    r = QuantizerRole
    assert seen == [r("linear", "input", "proj"), r("linear", "weight", "proj"), out_role,
                    r("linear", "grad_output", "proj"), gi_role]  # fmt: skip


def test_block_scaled_gemm_plans_name_their_blocks() -> None:
    """The plan's ``scaling`` (``fp8sim explain``) of block-scaled GEMMs: MXFP8 scales 1x32 blocks (TE
    MXFP8BlockScaling); Float8BlockScaling the input 1x128 and the weight 128x128 tiles (its default dims 1 and 2)."""
    from fp8sim.gemm.plans import record_plans
    from fp8sim.recipe import Float8BlockScaling, MXFP8BlockScaling

    for recipe, want in ((MXFP8BlockScaling(), "1x32 blocks"), (Float8BlockScaling(), "1x128 blocks x 128x128 blocks")):
        with record_plans() as rec:
            with te.autocast(recipe=recipe):
                te.Linear(128, 128)(torch.randn(128, 128))
        assert [p.scaling for p in rec.plans] == [want]


def test_delayed_scaling_fp8_output_stages_the_output_amax_in_the_output_slot() -> None:
    """TE linear.py (``fp8_output``): under delayed scaling the GEMM output goes through the forward OUTPUT slot
    (index 2), whose amax is the output's before the cast: that of the same module's high-precision output."""
    torch.manual_seed(0)
    a, b = te.Linear(16, 16), te.Linear(16, 16)
    b.load_state_dict(a.state_dict())
    x = torch.randn(16, 16)
    with te.autocast(recipe=DelayedScaling()):
        y = a(x)
    with te.autocast(recipe=DelayedScaling()):
        b(x, fp8_output=True)
    assert b.fp8_gemms["gemm"].fwd.amax_history[-1, 2] == y.abs().max().item()
    assert a.fp8_gemms["gemm"].fwd.amax_history[-1, 2] == 0.0  # without fp8_output the slot stays unused


def test_collected_statistics_count_current_scaling_underflows() -> None:
    """``collect_stats``/``fp8_stats``: every quantized element, and the nonzero ones the cast flushes to zero;
    current scaling (scale = 448 / amax, TE's) leaves 1e-10 beside 1000 far below E4M3's 2^-9 subnormal."""
    m = te.Linear(16, 16)
    m.collect_stats()
    x = torch.full((16, 16), 1e-10)
    x[0, 0] = 1000.0
    with torch.no_grad():
        m.weight.fill_(1.0)
    with te.autocast(recipe=Float8CurrentScaling()):
        m(x)
    assert m.fp8_stats == {"elements": 512, "overflow": 0, "underflow": 255}


@pytest.mark.parametrize("trainable", ["bias", "layer_norm_weight", "layer_norm_bias"])
def test_a_module_trainable_only_through_its_bias_or_norm_takes_the_backward_update_role(trainable: str) -> None:
    """TE layernorm_linear.py:592: ``requires_grad(inp, ln_weight, ln_bias, weight, bias)`` decides whether the
    module asks ``is_first_fp8_module``; one trainable bias or norm parameter is enough, so its backward updates
    the backward scales (HYBRID E5M2 max 57344, margin 0, history of one: scale = 57344 / amax(grad))."""
    torch.manual_seed(1)
    m = te.LayerNormLinear(16, 16)
    m.requires_grad_(False)
    getattr(m, trainable).requires_grad_(True)
    g = torch.randn(16, 16) * 4
    with te.autocast(recipe=DelayedScaling(amax_history_len=1)):
        y = m(torch.randn(16, 16))
    y.backward(g)
    assert m.fp8_gemms["gemm"].bwd.scale[0] == np.float32(57344.0) / np.float32(g.abs().max().item())


def test_a_frozen_fp8_primary_weight_gets_its_columnwise_copy_for_the_input_gradient() -> None:
    """TE linear.py:1051: a block-scaled FP8 weight made without grad holds its rowwise copy only; when the input
    needs a gradient (the weight frozen) the dgrad asks ``update_usage(columnwise_usage=True)``, made from the
    rowwise 128x128 tiles, and the input gradient is that of the same module with high-precision weights."""
    from fp8sim.recipe import Float8BlockScaling

    recipe = Float8BlockScaling()
    torch.manual_seed(5)
    ref = te.Linear(128, 128, bias=False)
    torch.manual_seed(5)
    with torch.no_grad(), te.quantized_model_init(recipe=recipe):
        fp8 = te.Linear(128, 128, bias=False)
    assert fp8.weight.get_usages() == {"rowwise": True, "columnwise": False}
    x = torch.randn(128, 128)
    grads = []
    for m in (fp8, ref):
        m.weight.requires_grad_(False)
        xr = x.clone().requires_grad_(True)
        with te.autocast(recipe=recipe):
            y = m(xr)
        y.backward(torch.ones_like(y))
        grads.append(xr.grad)
    assert fp8.weight.get_usages()["columnwise"] and torch.equal(grads[0], grads[1])


def test_a_factory_returning_no_quantizer_names_the_accepted_ones() -> None:
    """A ``CustomRecipe`` factory must return a TE quantizer (TE's ``qfactory`` contract): anything else is a
    TypeError naming what came back and, with TE's class names, what the modules take."""
    from fp8sim.recipe import CustomRecipe

    want = (
        "CustomRecipe qfactory returned object; fp8sim's modules take TE quantizers "
        "(Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, "
        "NVFP4Quantizer, IdentityQuantizer), custom quantizers (.custom True) or a DelayedScalingRequest"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(want)}$"):
        with te.autocast(recipe=CustomRecipe(qfactory=lambda role: object())):
            te.Linear(16, 16)(torch.randn(16, 16))
