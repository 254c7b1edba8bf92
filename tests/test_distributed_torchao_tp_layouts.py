"""The other layouts of fp8sim's torchao tensor-parallel styles on 2 gloo ranks, against the default layouts.

``tests/test_distributed_torchao_tp.py`` checks the default ``Float8ColwiseParallel`` (Replicate in, Shard(-1)
out) and ``Float8RowwiseParallel`` (Shard(-1) in, Replicate out) bit for bit against a per-shard reference
written from torchao 0.18's ``float8_tensor_parallel.py``.  torchao casts DTensors, so every tensorwise scale is
the one of the whole logical tensor whatever its placement: each other layout must give the same GEMMs on the
same codes, so the same bits, only placed differently (torch's ``ColwiseParallel`` / ``RowwiseParallel`` /
``PrepareModuleInput`` define the placements):

- colwise ``output_layouts=Replicate()``: the default's shards all-gathered along the last dim;
- colwise ``input_layouts=Shard(0)`` (sequence parallel): each rank gives its half of the batch, the output is
  the default's, and the input gradient is this rank's half of the default's;
- ``PrepareFloat8ModuleInput()`` (Shard(0) -> Replicate) on the parent, default styles inside: the same;
- rowwise ``input_layouts=Replicate()``: the whole hidden state in, the default's output;
- rowwise ``output_layouts=Shard(0)``: this rank's half of the batch of the default's output.
"""

from __future__ import annotations

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


def _step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> dict:
    x = x.clone().requires_grad_(True)
    hs: list = []
    model[1].register_forward_hook(lambda mod, inp, out: hs.append(out.detach().clone()))
    y = model(x)
    nn.functional.mse_loss(y, target).backward()
    return {"x": x.grad, "h": hs[0], "y": y.detach(), **{n: p.grad for n, p in model.named_parameters()}}


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from fp8sim.torchao.tp import Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(5)
    x, target = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    half = slice(rank * 8, rank * 8 + 8)

    def build(col: object, row: object, prepare: bool = False) -> nn.Module:
        plan = {"0": col, "2": row, **({"": PrepareFloat8ModuleInput()} if prepare else {})}
        return parallelize_module(_mlp(), mesh, plan)

    base = _step(build(Float8ColwiseParallel(), Float8RowwiseParallel()), x, target)
    diffs = {}

    def compare(name: str, got: dict, want: dict) -> None:
        diffs[name] = {
            k: (
                tuple(got[k].shape),
                tuple(want[k].shape),
                -1 if got[k].shape != want[k].shape else int((got[k] != want[k]).sum()),
            )
            for k in want
        }

    # colwise Replicate out, rowwise Replicate in: the whole hidden state crosses between them
    col, row = Float8ColwiseParallel(output_layouts=Replicate()), Float8RowwiseParallel(input_layouts=Replicate())
    got = _step(build(col, row), x, target)
    parts = [torch.empty_like(base["h"]) for _ in range(world)]
    dist.all_gather(parts, base["h"].contiguous())
    h_full = torch.cat(parts, 1)
    compare("replicated hidden", got, {**base, "h": h_full})
    # sequence parallel input: each rank gives its half of the batch
    sp = build(Float8ColwiseParallel(input_layouts=Shard(0)), Float8RowwiseParallel())
    got = _step(sp, x[half], target)
    compare("colwise Shard(0) in", got, {**base, "x": base["x"][half]})
    got = _step(build(Float8ColwiseParallel(), Float8RowwiseParallel(), prepare=True), x[half], target)
    compare("PrepareFloat8ModuleInput", got, {**base, "x": base["x"][half]})
    # rowwise Shard(0) out: this rank's half of the batch (the loss is over that half)
    rs = build(Float8ColwiseParallel(), Float8RowwiseParallel(output_layouts=Shard(0)))
    y = rs(x)
    compare("rowwise Shard(0) out", {"y": y.detach()}, {"y": base["y"][half]})
    return diffs


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


@pytest.mark.parametrize(
    "layout", ["replicated hidden", "colwise Shard(0) in", "PrepareFloat8ModuleInput", "rowwise Shard(0) out"]
)
def test_each_layout_gives_the_default_layouts_bits_placed_as_torch_places_them(results: list[dict], layout: str):
    for rank, diffs in enumerate(results):
        bad = {k: v for k, v in diffs[layout].items() if v[2]}
        assert not bad, f"rank {rank}, {layout}: (shape, wanted shape, elements differing or -1) {bad}"
