"""``precompute_float8_dynamic_scale_for_fsdp`` on 2 gloo ranks, side by side with torchao 0.18's own
(``torchao/float8/fsdp_utils.py`` lines 27-84, run on the same ranks with ``emulate=True``): after the call
every float8-all-gathered weight's local shard holds the precomputed scale torchao's holds, bit for bit
(one weight with a small amax, one with an ordinary one).  The scale is otherwise invisible in float32
training (the dynamic cast computes the same value), hence this direct check."""

from __future__ import annotations

import copy

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
require("torchao")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402


def _worker(rank: int, world: int) -> list[tuple]:
    import torchao.float8 as ao
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    import fp8sim.torchao as fao
    from fp8sim.torchao.fsdp import _local

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    with torch.no_grad():
        base[2].weight.mul_(1e-9)  # amax near torchao's EPS clamp (1e-12)
    ours = fao.convert_to_float8_training(
        copy.deepcopy(base), config=fao.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    )
    theirs = ao.convert_to_float8_training(
        copy.deepcopy(base), config=ao.Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=True)
    )
    for model in (ours, theirs):
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m)
        fully_shard(model)
    fao.precompute_float8_dynamic_scale_for_fsdp(ours)
    ao.precompute_float8_dynamic_scale_for_fsdp(theirs)
    out = []
    for a, b in zip(ours, theirs, strict=True):
        if isinstance(a, nn.Linear):
            got, want = _local(a.weight)._precomputed_scale, b.weight._local_tensor._precomputed_scale
            out.append((None if got is None else got.view(torch.int32).item(), want.view(torch.int32).item()))
    return out


def test_precomputed_scales_are_torchaos() -> None:
    for per_rank in ranks(_worker, world_size=2):
        assert len(per_rank) == 2
        for got, want in per_rank:
            assert got == want
