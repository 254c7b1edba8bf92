"""torchao-style tensor parallelism of fp8sim Float8Linear on 2 gloo ranks (issue 16, item 3).

``parallelize_module(mlp, mesh, {"0": Float8ColwiseParallel(), "2": Float8RowwiseParallel()})``, one
training step of ``mse(fc2(relu(fc0(x))), target)``.  Oracle, from torchao 0.18's
``float8/float8_tensor_parallel.py`` (the input casts at lines 60 and 124 and the grad-output casts
``NoopFwToFloat8BwDynamic`` at 83 and 146 act on DTensors, so each tensorwise amax is the amax of the
whole logical tensor) and ``float8_utils.py`` ``amax_to_scale`` (lines 44-48: float64 amax, EPS clamp,
float32 scale): every operand is cast with ``scale = fl32(fmax / max(fl64(max|T|), 1e-12))`` of the
*full* tensor T by ml_dtypes, dequantized as ``codes / scale`` in float32, and each rank's GEMMs run on
its shard in the layouts torchao's ``float8_linear.py`` uses (torch.mm, float32).  The row-parallel
partial outputs are summed ``p_0 + p_1`` (a 2-rank all-reduce: one rounded float32 add, the same in
either order) before the bias; the backward of the column-parallel layer casts its shard of the
gradient with the amax of the whole gradient (both ranks' shards).  Output and every gradient are
bit-identical to that on both ranks.  (A one-process ``Float8Linear`` is not the oracle: its weight
and output-gradient casts see the same amaxes, but its GEMMs sum over the full inner dimension in one
torch.mm where TP sums two half-length GEMMs, so bits differ by float32 summation order.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402


def _mlp() -> nn.Sequential:
    import fp8sim.torchao as fao

    torch.manual_seed(0)
    return fao.convert_to_float8_training(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)))


def _deq(t: torch.Tensor, full: torch.Tensor, dt: type = ml_dtypes.float8_e4m3fn) -> torch.Tensor:
    """``t`` cast to ``dt`` with the scale of ``full`` (ml_dtypes), dequantized in float32."""
    fmax = float(ml_dtypes.finfo(dt).max)
    scale = np.float32(fmax / max(np.float64(full.detach().abs().max().item()), 1e-12))
    codes = np.clip(t.detach().numpy().astype(np.float32) * scale, -fmax, fmax).astype(dt)
    return torch.from_numpy(codes.astype(np.float32) / scale)


E5M2 = ml_dtypes.float8_e5m2


def _reference(x: torch.Tensor, target: torch.Tensor, params: list, world: int) -> dict:
    """The per-shard arithmetic of the module docstring, for every rank, in one process."""
    w1, b1, w2, b2 = params
    xd = _deq(x, x)
    w1s, b1s, w2s = w1.chunk(world, 0), b1.chunk(world), w2.chunk(world, 1)
    pre = [(torch.mm(xd, _deq(w1s[r], w1).t()) + b1s[r]).requires_grad_() for r in range(world)]
    h = [torch.relu(p) for p in pre]
    h_full = torch.cat(h, 1)
    hd = [_deq(h[r], h_full) for r in range(world)]
    partials = [torch.mm(hd[r], _deq(w2s[r], w2).t()) for r in range(world)]
    y = (partials[0] + partials[1]) + b2
    y_leaf = y.detach().requires_grad_()
    nn.functional.mse_loss(y_leaf, target).backward()
    dy = y_leaf.grad
    dyd = _deq(dy, dy, E5M2)
    dh = [torch.mm(dyd, _deq(w2s[r], w2)) for r in range(world)]
    for r in range(world):
        h[r].backward(dh[r])
    dpre = [p.grad for p in pre]
    dpre_full = torch.cat(dpre, 1)
    return {
        "h": [t.detach() for t in h],
        "y": y.detach(),
        "grad_w1": [torch.mm(_deq(dpre[r], dpre_full, E5M2).t(), xd) for r in range(world)],
        "grad_b1": [d.sum(0) for d in dpre],
        "grad_w2": [torch.mm(dyd.t(), hd[r]) for r in range(world)],
        "grad_b2": dy.sum(0),
    }


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from fp8sim.torchao.tp import Float8ColwiseParallel, Float8RowwiseParallel

    torch.set_num_threads(1)
    full = _mlp()
    params = [p.detach().clone() for p in full.parameters()]
    mesh = init_device_mesh("cpu", (world,))
    tp = parallelize_module(_mlp(), mesh, {"0": Float8ColwiseParallel(), "2": Float8RowwiseParallel()})
    g = torch.Generator().manual_seed(5)
    x, target = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    hs = []
    tp[1].register_forward_hook(lambda mod, inp, out: hs.append(out.detach().clone()))
    y = tp(x)
    nn.functional.mse_loss(y, target).backward()
    want = _reference(x, target, params, world)
    got = {
        "h": hs[0],
        "y": y.detach(),
        "grad_w1": tp[0].weight.grad,
        "grad_b1": tp[0].bias.grad,
        "grad_w2": tp[2].weight.grad,
        "grad_b2": tp[2].bias.grad,
    }
    mine = {k: (v[rank] if isinstance(v, list) else v) for k, v in want.items()}
    return {
        "diffs": {k: int((got[k] != mine[k]).sum()) for k in got},
        "y": y.detach().numpy().copy(),
        "want": mine["y"].numpy().copy(),
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


def test_tp_forward_is_the_per_shard_gemm_with_whole_tensor_scales(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        for k in ("h", "y"):
            assert r["diffs"][k] == 0, f"rank {rank}: {r['diffs'][k]} elements of {k} differ from the reference"
    assert np.array_equal(results[0]["y"], results[1]["y"])


def test_tp_training_step_gradients_are_bit_identical_to_the_per_shard_reference(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        bad = {k: n for k, n in r["diffs"].items() if n}
        assert not bad, f"rank {rank}: elements differing from the per-shard reference {bad}"


def test_styles_reject_what_torchao_rejects() -> None:
    import fp8sim.torchao as fao
    from fp8sim.torchao.tp import Float8ColwiseParallel, PrepareFloat8ModuleInput

    with pytest.raises(ValueError, match="Expecting module to be Float8Linear but found"):
        Float8ColwiseParallel()._apply(nn.Linear(4, 4), None)
    rowwise = fao.convert_to_float8_training(
        nn.Sequential(nn.Linear(16, 16)), config=fao.Float8LinearConfig.from_recipe_name("rowwise")
    )
    with pytest.raises(AssertionError, match="unsupported"):
        Float8ColwiseParallel()._apply(rowwise[0], None)
    with pytest.raises(NotImplementedError, match="only support casting to float8_e4m3fn"):
        PrepareFloat8ModuleInput(float8_dtype=torch.float8_e5m2)
