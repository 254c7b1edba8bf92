"""``te.ops.GroupedLinear`` (TE 2.20.0.dev0 ``ops/basic/grouped_linear.py``, its split-quantize flow
``_fuser_forward_split_quantize`` / ``_fuser_backward_split_quantize``), custom recipes and RNG-tracked
initialisation in the ops.

TE's grouped GEMM runs each group's GEMMs as ``general_gemm`` would with that group's quantizers
(``tex.split_quantize``), so the reference for every group is a one-process ``BasicLinear`` (+ ``Bias``)
with the group's weight on the group's rows; the grouped dbias is a float32 row sum per group.
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
import fp8sim.pytorch.ops as te_ops  # noqa: E402
from fp8sim.recipe import CustomRecipe, DelayedScaling, Float8CurrentScaling  # noqa: E402

BF16 = torch.bfloat16
SPLITS = [32, 0, 64, 32]


def _data(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


def _grouped(bias: bool = True, **kw) -> te_ops.GroupedLinear:
    op = te_ops.GroupedLinear(4, 32, 16, bias=bias, dtype=BF16, **kw)
    with torch.no_grad():
        for g in range(4):
            getattr(op, f"weight{g}").copy_(_data(16, 32, seed=10 + g))
            if bias:
                getattr(op, f"bias{g}").copy_(_data(16, seed=20 + g))
    return op


@pytest.mark.parametrize("recipe", [None, Float8CurrentScaling(), DelayedScaling()], ids=["hp", "current", "delayed"])
def test_grouped_linear_equals_per_group_linears(recipe) -> None:  # noqa: ANN001
    """Each group: its rows through ``BasicLinear`` + ``Bias`` (the bias in the GEMM epilogue), bit for bit."""
    op = _grouped()
    x, dy = _data(128, 32, seed=1).requires_grad_(True), _data(128, 16, seed=2)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = op(x, torch.tensor(SPLITS))
    y.backward(dy)
    start = 0
    for g, n in enumerate(SPLITS):
        ref = te_ops.Linear(32, 16, dtype=BF16)
        with torch.no_grad():
            ref.weight.copy_(getattr(op, f"weight{g}"))
            ref.bias.copy_(getattr(op, f"bias{g}"))
        xg = x.detach()[start : start + n].clone().requires_grad_(True)
        if n:
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                yg = ref(xg)
            yg.backward(dy[start : start + n])
            assert torch.equal(y[start : start + n], yg) and torch.equal(x.grad[start : start + n], xg.grad)
            assert torch.equal(getattr(op, f"weight{g}").grad, ref.weight.grad)
        else:
            assert torch.equal(getattr(op, f"weight{g}").grad, torch.zeros(16, 32, dtype=BF16))
        assert torch.equal(getattr(op, f"bias{g}").grad, dy[start : start + n].float().sum(0).to(BF16))
        start += n


def test_grouped_linear_delay_wgrad_and_main_grad() -> None:
    """grouped_linear.py:1634-1662: ``delay_wgrad_compute`` leaves wgrad to ``backward_dw()``;
    ``accumulate_into_main_grad`` adds it into each weight's ``main_grad`` (float32)."""
    x, dy = _data(128, 32, seed=1), _data(128, 16, seed=2)
    eager = _grouped(bias=False)
    eager(x.clone().requires_grad_(True), torch.tensor(SPLITS)).backward(dy)
    late = _grouped(bias=False, delay_wgrad_compute=True)
    late(x.clone().requires_grad_(True), torch.tensor(SPLITS)).backward(dy)
    assert late.need_backward_dw() and late.weight0.grad is None
    late.backward_dw()
    for g in range(4):
        assert torch.equal(getattr(late, f"weight{g}").grad, getattr(eager, f"weight{g}").grad)
    acc = _grouped(bias=False, accumulate_into_main_grad=True)
    for g in range(4):
        getattr(acc, f"weight{g}").main_grad = torch.ones(16, 32)
    acc(x.clone().requires_grad_(True), torch.tensor(SPLITS)).backward(dy)
    for g in range(4):
        want = (_ref_wgrad(x, dy, g) + 1).float()
        assert torch.equal(getattr(acc, f"weight{g}").main_grad, want)


def _ref_wgrad(x: torch.Tensor, dy: torch.Tensor, g: int) -> torch.Tensor:
    start = sum(SPLITS[:g])
    return dy[start : start + SPLITS[g]].float().t() @ x[start : start + SPLITS[g]].float()


def test_grouped_linear_scale_bias_adds_bias_times_the_row_scale() -> None:
    """grouped_linear.py:1290-1294: with ``scale_bias`` the GEMM has no bias and ``bias * scale`` is added per row
    (a second extra input); its gradient is ``sum(dy * bias)`` per row."""
    op = _grouped(scale_bias=True)
    plain = _grouped(bias=False)
    x = _data(128, 32, seed=1)
    scales = _data(128, seed=3).requires_grad_(True)
    y = op(x, torch.tensor(SPLITS), scales)
    bias_rows = torch.cat([getattr(op, f"bias{g}").detach().expand(n, 16) for g, n in enumerate(SPLITS)])
    assert torch.equal(y, plain(x, torch.tensor(SPLITS)) + bias_rows * scales.detach().unsqueeze(-1))
    dy = _data(128, 16, seed=4)
    y.backward(dy)
    assert torch.equal(scales.grad, (dy.float() * bias_rows.float()).sum(-1).to(BF16))


def test_custom_recipe_gets_te_roles_and_its_quantizers_are_used() -> None:
    """quantization.py ``CustomRecipeState``: ``qfactory(role)`` per slot with ``BasicLinear``'s roles
    (``linear``: input, weight / grad_output); the op then computes with those quantizers."""
    seen = []

    def qfactory(role):  # noqa: ANN001, ANN202
        seen.append((role.module_type, role.tensor_type))
        fwd = role.tensor_type != "grad_output"
        return te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3 if fwd else te.DType.kFloat8E5M2)

    x, dy = _data(32, 32, seed=5), _data(32, 16, seed=6)
    outs = []
    for recipe in (CustomRecipe(qfactory=qfactory), Float8CurrentScaling()):
        torch.manual_seed(0)
        op = te_ops.BasicLinear(32, 16, dtype=BF16)
        xi = x.clone().requires_grad_(True)
        with te.autocast(recipe=recipe):
            y = op(xi)
        y.backward(dy)
        outs.append((y, xi.grad, op.weight.grad))
    assert seen == [("linear", "input"), ("linear", "weight"), ("linear", "grad_output")]
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_rng_state_tracker_function_initialises_in_its_fork() -> None:
    """basic_linear.py:317-321: the weight is initialised inside ``rng_state_tracker_function().fork()``."""
    from fp8sim.pytorch.distributed import CudaRNGStatesTracker

    tracker = CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 1234)
    torch.manual_seed(0)
    a = te_ops.BasicLinear(32, 16, rng_state_tracker_function=lambda: tracker).weight.detach().clone()
    torch.manual_seed(0)
    b = te_ops.BasicLinear(32, 16).weight.detach()
    tracker2 = CudaRNGStatesTracker()
    tracker2.add("model-parallel-rng", 1234)
    torch.manual_seed(99)
    c = te_ops.BasicLinear(32, 16, rng_state_tracker_function=lambda: tracker2).weight.detach()
    assert torch.equal(a, c) and not torch.equal(a, b)
