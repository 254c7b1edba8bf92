"""accelerate's float8 all-gather flag reaches FSDP2 (issue 16, item 5, the part fp8sim covers).

``AORecipeKwargs()`` fills ``Float8LinearConfig.enable_fsdp_float8_all_gather`` from
``ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER`` (default True, accelerate's ``utils/dataclasses.py``);
``convert_model_to_fp8_ao`` then gives the converted Linears weights that FSDP2 gathers in float8.
On 2 gloo ranks under ``fully_shard``: with the flag every converted Linear's unsharded weight
carries the gathered float8 codes, without it none does, and the losses agree bit for bit (float32
params: the per-shard cast with the mesh-wide scale is the whole-tensor cast).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402


def _run(flag: str) -> dict:
    import os

    from torch.distributed.fsdp import fully_shard

    import fp8sim.accelerate as fa

    os.environ["ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"] = flag
    handler = fa.AORecipeKwargs()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
    fa.convert_model_to_fp8_ao(model, config=handler.config)  # first and last Linear stay high precision
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    gathered = []
    model[2].register_forward_pre_hook(lambda mod, args: gathered.append(hasattr(mod.weight, "_fp8sim_float8")))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(2):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step + 10 * dist.get_rank()))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"config_flag": handler.config.enable_fsdp_float8_all_gather, "gathered": gathered, "losses": losses}


def _worker(rank: int, world: int) -> dict:
    return {flag: _run(flag) for flag in ("true", "false")}


def test_the_accelerate_flag_switches_the_float8_all_gather_and_keeps_the_numerics() -> None:
    for r in ranks(_worker):
        on, off = r["true"], r["false"]
        assert on["config_flag"] is True and off["config_flag"] is False
        assert on["gathered"] == [True, True] and off["gathered"] == [False, False]
        assert on["losses"] == off["losses"]
