"""torchao-style tensor parallelism of fp8sim Float8Linear on 2 gloo ranks (issue 16, item 3).

``parallelize_module(mlp, mesh, {"0": Float8ColwiseParallel(), "2": Float8RowwiseParallel()})``.
Oracle, from torchao 0.18's ``float8_tensor_parallel.py`` (the casts act on DTensors, so each
tensorwise amax is the amax of the whole logical tensor) and ``float8_utils.py`` ``amax_to_scale``
(lines 32-53): every operand is cast with ``scale = fl32(448 / max(fl64(max|T|), 1e-12))`` of the
*full* tensor T by ml_dtypes, dequantized as ``codes / scale`` in float32, and each rank's GEMM runs
on its shard (torch.mm, the layouts the module uses); the row-parallel output is the sum of the
two partial products plus the bias.  The forward output is bit-identical to that on both ranks,
and the gradients agree with a one-process Float8Linear run to float32 summation order.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402


def _mlp() -> nn.Sequential:
    import fp8sim.torchao as fao

    torch.manual_seed(0)
    return fao.convert_to_float8_training(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)))


def _deq(t: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``t`` cast with the scale of ``full`` (ml_dtypes), dequantized in float32."""
    scale = np.float32(448.0 / max(np.float64(full.detach().abs().max().item()), 1e-12))
    codes = np.clip(t.detach().numpy().astype(np.float32) * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return torch.from_numpy(codes.astype(np.float32) / scale)


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from fp8sim.torchao.tp import Float8ColwiseParallel, Float8RowwiseParallel

    full = _mlp()
    w1, b1, w2, b2 = (p.detach().clone() for p in full.parameters())
    mesh = init_device_mesh("cpu", (world,))
    tp = parallelize_module(_mlp(), mesh, {"0": Float8ColwiseParallel(), "2": Float8RowwiseParallel()})
    g = torch.Generator().manual_seed(5)
    x, target = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    y = tp(x)
    nn.functional.mse_loss(y, target).backward()

    rows = w1.chunk(world, 0)[rank]
    h_full = torch.relu(torch.mm(_deq(x, x), _deq(w1, w1).t()) + b1)  # what every rank's h is part of
    h = torch.relu(torch.mm(_deq(x, x), _deq(rows, w1).t()) + b1.chunk(world)[rank])
    partials = []
    for r in range(world):
        h_r = h_full.chunk(world, dim=1)[r]
        partials.append(torch.mm(_deq(h_r, h_full), _deq(w2.chunk(world, 1)[r], w2).t()))
    want = (partials[0] + partials[1]) + b2

    ref_y = full(x)
    nn.functional.mse_loss(ref_y, target).backward()
    return {
        "h_local_ok": bool(torch.equal(h, h_full.chunk(world, dim=1)[rank])),
        "y": y.detach().numpy().copy(),
        "want": want.numpy().copy(),
        "ref_y": ref_y.detach().numpy().copy(),
        "grad_w1": tp[0].weight.grad.numpy().copy(),
        "ref_grad_w1": full[0].weight.grad.chunk(world, 0)[rank].numpy().copy(),
        "grad_w2": tp[2].weight.grad.numpy().copy(),
        "ref_grad_w2": full[2].weight.grad.chunk(world, 1)[rank].numpy().copy(),
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


def test_tp_forward_is_the_per_shard_gemm_with_whole_tensor_scales(results: list[dict]) -> None:
    for rank, r in enumerate(results):
        assert r["h_local_ok"]
        bad = np.flatnonzero(r["y"].ravel() != r["want"].ravel())
        assert bad.size == 0, f"rank {rank}: {bad.size} outputs differ, first {r['y'].ravel()[bad[0]]!r}"
    assert np.array_equal(results[0]["y"], results[1]["y"])


def test_tp_training_matches_one_process_float8_to_summation_order(results: list[dict]) -> None:
    for r in results:
        np.testing.assert_allclose(r["y"], r["ref_y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r["grad_w1"], r["ref_grad_w1"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(r["grad_w2"], r["ref_grad_w2"], rtol=1e-4, atol=1e-6)


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
