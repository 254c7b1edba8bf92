"""TE ``GroupedLinear`` (``fp8sim.pytorch.GroupedLinear``).

TE is not installed here; the oracle is TE's definition in ``transformer_engine/pytorch/module/grouped_linear.py``
at NVIDIA/TransformerEngine d0067d0, written out in :func:`test_grouped_linear_matches_te_per_split_definition`
(``_GroupedLinear.forward`` / ``backward``): the input split by ``m_splits`` and each split quantized by its own
GEMM's input quantizer (820-827 ``_split_quantize``, ``_split_quantization.py`` 215-247: one quantizer per
split), each weight by its own (839-848), the bias in bf16 for an FP32 activation (854-856), one GEMM per
split (875-887); backward: the grad output split-quantized the same way with the bias gradient of each
split's high-precision rows (1315-1327; ``_split_quantization.py`` 350-357), dgrad ``dy_i @ W_i`` (1382-1393)
and wgrad ``dy_i^T @ x_i`` (1450-1469) per split.  The GEMMs run under ``accumulator="exact"`` and the
reference sums the exact FP8 products in Python integers (``tests/_gemm_reference.py``).  Outside
``autocast``: torch's ``F.linear`` per split.  Every recipe and two steps are also checked for consistency
with fp8sim's ``Linear`` per split (each with its own scaling state, as TE's per-GEMM meta); that check shares
``base._linear`` with the module, so it is not the oracle.  A small MoE trains under each.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import _gemm_reference as gref  # noqa: E402, I001
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


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


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


def _grouped_step(grouped, x, g, recipe, accumulator=None):
    x = x.clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe, accumulator=accumulator):
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


def _scaled_cast(x: torch.Tensor, fmt: str, scale: np.float32):
    """A delayed-scaling cast with a known scale: ``satfinite(RN(fl32(x) * scale))`` by ml_dtypes, values and
    ``scale_inv = fl32(1 / scale)``."""
    dt, fmax = gref._ML[fmt]
    q = np.clip(x.detach().float().numpy() * np.float32(scale), -fmax, fmax).astype(dt)
    return torch.from_numpy(q.astype(np.float32)), None, float(np.float32(1) / np.float32(scale))


@pytest.mark.parametrize("kind", ["current", "delayed"])
def test_grouped_linear_matches_te_per_split_definition(kind):
    """Float8CurrentScaling, or DelayedScaling(amax_history_len=1) (step 2 casts split ``i`` with ``fmax / amax``
    of split ``i``'s own step-1 tensors: TE's per-GEMM ``fp8_meta``), FP32 activations, splits (32, 0, 64, 32),
    two steps: TE's definition written in the module docstring, forward and every gradient bit for bit.  Each
    split's own amax matters: one scale over the whole input would give other bits."""
    grouped, _ = _modules()
    recipe = rc.Float8CurrentScaling() if kind == "current" else rc.DelayedScaling(amax_history_len=1)
    amax: dict = {}
    for step in range(2):
        x, g = _data(20 + step)
        with torch.no_grad():  # split 2's rows larger: a per-split amax differs from the whole input's
            x[32:96] *= 8
        got = _grouped_step(grouped, x, g, recipe, accumulator="exact")
        grouped.zero_grad()
        ys, dxs = [], []
        for i, (xi, gi) in enumerate(zip(torch.split(x, SPLITS), torch.split(g, SPLITS), strict=True)):
            w, b = getattr(grouped, f"weight{i}").detach(), getattr(grouped, f"bias{i}").detach()
            if xi.shape[0] == 0:  # no rows: no output, zero weight and bias gradients
                ys.append(torch.zeros(0, w.shape[0]))
                dxs.append(torch.zeros(0, w.shape[1]))
                assert_bit_exact(got[f"weight{i}"], torch.zeros_like(w))
                assert_bit_exact(got[f"bias{i}"], torch.zeros_like(b))
                continue
            if kind == "current":
                cast = [gref.current_scaling_cast(t, f) for t, f in ((xi, "e4m3"), (w, "e4m3"), (gi, "e5m2"))]
            else:
                fmax = (np.float32(448), np.float32(448), np.float32(57344))
                scales = [fmax[j] / amax[i][j] if step else np.float32(1) for j in range(3)]
                fmts = ("e4m3", "e4m3", "e5m2")
                cast = [_scaled_cast(t, f, s) for t, f, s in zip((xi, w, gi), fmts, scales, strict=True)]
                amax[i] = [np.float32(t.abs().max()) for t in (xi, w, gi)]
            (vx, _, sx), (vw, _, sw), (vg, _, sg) = cast
            ys.append(gref.epilogue(gref.rn_f32(vx, vw.t()), sx, sw, b.to(torch.bfloat16)))
            dxs.append(gref.epilogue(gref.rn_f32(vg, vw), sg, sw))
            assert_bit_exact(got[f"weight{i}"], gref.epilogue(gref.rn_f32(vg.t(), vx), sg, sx))
            assert_bit_exact(got[f"bias{i}"], gi.sum(0))  # TE: tensor_part.sum(dim=0) of the unquantized rows
        assert_bit_exact(got["y"], torch.cat(ys))
        assert_bit_exact(got["dx"], torch.cat(dxs))
        whole = gref.current_scaling_cast(x, "e4m3")[2]
        assert whole != gref.current_scaling_cast(x[:32], "e4m3")[2]  # the per-split scales are not the whole's


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_split_is_consistent_with_fp8sim_linear_with_its_own_scaling_state(name):
    """Every recipe, two steps: each split equals an fp8sim ``Linear`` with the same weights and its own scaling
    state (TE's per-GEMM meta).  A consistency check (both run ``base._linear``); the oracle is the test above."""
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
