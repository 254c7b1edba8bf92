"""TE ``GroupedLinear`` (``fp8sim.pytorch.GroupedLinear``).

TE is not installed here; the oracle is TE's definition in ``transformer_engine/pytorch/module/grouped_linear.py``
(``_GroupedLinear.forward``: the input split by ``m_splits``, one GEMM per split with that GEMM's own FP8
meta/quantizers, outputs concatenated): outside ``autocast`` torch's ``F.linear`` per split, inside it one
fp8sim ``Linear`` per split with the same weights (each with its own scaling state, as TE's per-GEMM meta),
bit for bit, forward and every gradient, for every recipe and two steps.  A small MoE trains under each.
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from torch import nn  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe as rc  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

RECIPES = {
    "delayed": lambda: rc.DelayedScaling(),
    "current": lambda: rc.Float8CurrentScaling(),
    "mxfp8": lambda: rc.MXFP8BlockScaling(),
    "block": lambda: rc.Float8BlockScaling(),
    "nvfp4": lambda: rc.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True),
}
SPLITS = [32, 0, 64, 32]


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _modules(k: int = 128, n: int = 128, bias: bool = True):
    torch.manual_seed(0)
    grouped = te.GroupedLinear(len(SPLITS), k, n, bias=bias)
    singles = []
    for i in range(len(SPLITS)):
        lin = te.Linear(k, n, bias=bias)
        with torch.no_grad():
            lin.weight.copy_(getattr(grouped, f"weight{i}"))
            if bias:
                getattr(grouped, f"bias{i}").normal_()
                lin.bias.copy_(getattr(grouped, f"bias{i}"))
        singles.append(lin)
    return grouped, singles


def _grouped_step(grouped, x, g, recipe):
    x = x.clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = grouped(x, SPLITS)
    y.backward(g)
    return {"y": y.detach(), "dx": x.grad, **{n: p.grad.clone() for n, p in grouped.named_parameters()}}


def _singles_step(singles, x, g, recipe, bias=True):
    x = x.clone().requires_grad_(True)
    outs = []
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        for lin, part in zip(singles, torch.split(x, SPLITS), strict=True):
            if part.shape[0] == 0:
                outs.append(nn.functional.linear(part, lin.weight, lin.bias))  # TE runs no GEMM for an empty split
            else:
                outs.append(lin(part))
    y = torch.cat(outs)
    y.backward(g)
    got = {"y": y.detach(), "dx": x.grad}
    for i, lin in enumerate(singles):
        got[f"weight{i}"] = lin.weight.grad.clone() if lin.weight.grad is not None else torch.zeros_like(lin.weight)
        if bias:
            got[f"bias{i}"] = lin.bias.grad.clone() if lin.bias.grad is not None else torch.zeros_like(lin.bias)
    return got


def _data(seed: int, rows: int = 128, k: int = 128, n: int = 128):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen), torch.randn(rows, n, generator=gen)


def test_outside_autocast_equals_f_linear_per_split():
    grouped, _ = _modules()
    x, g = _data(1)
    got = _grouped_step(grouped, x, g, None)
    xs = x.clone().requires_grad_(True)
    ws = [getattr(grouped, f"weight{i}").detach().clone().requires_grad_(True) for i in range(4)]
    bs = [getattr(grouped, f"bias{i}").detach().clone().requires_grad_(True) for i in range(4)]
    y = torch.cat([nn.functional.linear(p, w, b) for p, w, b in zip(torch.split(xs, SPLITS), ws, bs, strict=True)])
    y.backward(g)
    assert_bit_exact(got["y"], y.detach())
    assert_bit_exact(got["dx"], xs.grad)
    for i in range(4):
        assert_bit_exact(got[f"weight{i}"], ws[i].grad)
        assert_bit_exact(got[f"bias{i}"], bs[i].grad)


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_split_is_a_te_linear_with_its_own_scaling_state(name):
    grouped, singles = _modules()
    for step in range(2):  # the second step sees the first step's delayed-scaling updates
        x, g = _data(10 + step)
        got = _grouped_step(grouped, x, g, RECIPES[name]())
        want = _singles_step(singles, x, g, RECIPES[name]())
        for lin in singles:
            lin.zero_grad()
        grouped.zero_grad()
        assert got.keys() == want.keys()
        for k in want:
            try:
                assert_bit_exact(got[k], want[k])
            except AssertionError as exc:
                raise AssertionError(f"step {step} {k}: {exc}") from None


class _MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.router = nn.Linear(128, 4, bias=False)
        self.fc1 = te.GroupedLinear(4, 128, 128)
        self.fc2 = te.GroupedLinear(4, 128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # capacity routing: tokens ranked by the router, fixed splits (multiples of 32)
            order = torch.argsort(self.router(x)[:, 0], stable=True)
        splits = SPLITS
        h = torch.relu(self.fc1(x[order], splits))
        y = self.fc2(h, splits)
        return torch.empty_like(y).index_copy_(0, order, y)


@pytest.mark.parametrize("name", ["delayed", "current", "mxfp8"])
def test_small_moe_trains_under_each_recipe(name):
    model = _MoE()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    gen = torch.Generator().manual_seed(2)
    x, target = torch.randn(128, 128, generator=gen), torch.randn(128, 128, generator=gen) * 0.1
    losses = []
    for _ in range(5):
        opt.zero_grad()
        with te.autocast(recipe=RECIPES[name]()):
            loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
    assert losses[-1] < losses[0]


def test_parameters_have_te_names_and_arguments_are_checked():
    m = te.GroupedLinear(3, 32, 16)
    assert [n for n, _ in m.named_parameters()] == ["weight0", "bias0", "weight1", "bias1", "weight2", "bias2"]
    with pytest.raises(ValueError, match=r"Number of splits \(2\) should match number of GEMMs \(3\)"):
        m(torch.randn(4, 32), [2, 2])
    with pytest.raises(ValueError, match="sum to the 4 input rows"):
        m(torch.randn(4, 32), [2, 2, 2])
    with pytest.raises(ValueError, match="num_gemms must be"):
        te.GroupedLinear(0, 32, 16)
    out, biases = te.GroupedLinear(2, 32, 16, return_bias=True)(torch.randn(4, 32), [1, 3])
    assert out.shape == (4, 16) and len(biases) == 2
