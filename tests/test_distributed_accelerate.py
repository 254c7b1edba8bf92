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

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
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


def _data(step: int, rank: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(step + 10 * rank))


def _plugin_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))


def _plugin_run() -> dict | None:
    """``prepare_fp8`` with accelerate's FSDP2 plugin (float32 MixedPrecisionPolicy, float8 all-gather)."""
    try:
        from accelerate.utils import FullyShardedDataParallelPlugin
    except ImportError:
        return None
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    import fp8sim.accelerate as fa

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, mixed_precision_policy=MixedPrecisionPolicy(param_dtype=torch.float32)
    )
    model = _plugin_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    handler = fa.AORecipeKwargs(enable_fsdp_float8_all_gather=True)
    model, opt = fa.prepare_fp8(model, opt, kwargs_handlers=[handler], fsdp_plugin=plugin)
    gathered, precomputed, losses = [], [], []
    model[2].register_forward_pre_hook(lambda mod, args: gathered.append(hasattr(mod.weight, "_fp8sim_float8")))
    for step in range(2):
        loss = model(_data(step, dist.get_rank())).square().mean()
        loss.backward()
        opt.step()  # accelerate's post-hook precomputes the float8 scales here
        opt.zero_grad()
        precomputed.append(model[2].weight._local_tensor._precomputed_scale is not None)
        losses.append(loss.item())
    optimizer_sharded = all(isinstance(p, torch.distributed.tensor.DTensor) for p in opt.param_groups[0]["params"])
    return {
        "losses": losses,
        "gathered": gathered,
        "precomputed": precomputed,
        "fsdp": isinstance(model, FSDPModule),
        "optimizer_sharded": optimizer_sharded,
    }


def _plugin_reference(world: int) -> list[list[float]]:
    """One process: accelerate's torchao conversion, gradient accumulation over the ranks' micro-batches."""
    import fp8sim.accelerate as fa

    model = _plugin_model()
    fa.convert_model_to_fp8_ao(model, config=fa.AORecipeKwargs(enable_fsdp_float8_all_gather=True).config)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(2):
        grads, step_losses = [], []
        for r in range(world):
            loss = model(_data(step, r)).square().mean()
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            step_losses.append(loss.item())
            opt.zero_grad()
        for p, g0, g1 in zip(model.parameters(), *grads, strict=True):
            p.grad = (g0 + g1) / 2
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
    return losses


def _worker(rank: int, world: int) -> dict:
    out = {flag: _run(flag) for flag in ("true", "false")}
    out["plugin"] = _plugin_run()
    out["reference"] = _plugin_reference(world)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker)


def test_the_accelerate_flag_switches_the_float8_all_gather_and_keeps_the_numerics(results: list[dict]) -> None:
    for r in results:
        on, off = r["true"], r["false"]
        assert on["config_flag"] is True and off["config_flag"] is False
        assert on["gathered"] == [True, True] and off["gathered"] == [False, False]
        assert on["losses"] == off["losses"]


def test_prepare_fp8_with_the_fsdp2_plugin_matches_one_process(results: list[dict]) -> None:
    """accelerate's FSDP2 prepare (``_prepare_ao``'s precompute hook, ``fsdp2_prepare_model``) on CPU
    ranks: the converted Linear is gathered in float8, its scale is precomputed after each step, the
    optimizer holds the sharded parameters, and the losses are the one-process gradient accumulation's."""
    if results[0]["plugin"] is None:
        pytest.skip("accelerate is needed for its FSDP2 plugin")
    for rank, r in enumerate(results):
        run = r["plugin"]
        assert run["fsdp"] and run["optimizer_sharded"]
        assert run["gathered"] == [True, True] and run["precomputed"] == [True, True]
        assert run["losses"] == [step[rank] for step in r["reference"]], (run["losses"], r["reference"])


@pytest.mark.parametrize(
    ("plugin", "handler", "optimizer", "error", "match"),
    [
        ({"fsdp_version": 1}, "ao", True, NotImplementedError, "fsdp_version=1: fp8sim emulates FSDP2 only"),
        ({"fsdp_version": 2}, "ao", False, ValueError, "a model and optimizer must be passed together"),
        ({"fsdp_version": 2}, "te", True, NotImplementedError, "emulates the torchao backend"),
    ],
)
def test_prepare_fp8_refuses_what_its_fsdp2_path_does_not_emulate(plugin, handler, optimizer, error, match) -> None:
    from types import SimpleNamespace

    import fp8sim.accelerate as fa

    model = _plugin_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5) if optimizer else None
    kwargs = [fa.AORecipeKwargs() if handler == "ao" else fa.TERecipeKwargs()]
    with pytest.raises(error, match=match):
        fa.prepare_fp8(model, opt, kwargs_handlers=kwargs, fsdp_plugin=SimpleNamespace(**plugin))
