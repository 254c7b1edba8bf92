"""fp8sim's float8 modules under FSDP2 (``fully_shard``) and DDP on 2 gloo ranks (issue 16, item 0).

Parameters keep torch-owned, resizable storage (fp8sim reads them through DLPack, not
``Tensor.numpy()``, which pins the storage and made FSDP2's ``free_storage`` fail with "Trying to
resize storage that is not resizable").  Oracle: the same process also trains an unwrapped copy
of the model on the same global batch as gradient accumulation over the ranks' micro-batches,
``grad = (g_0 + g_1) / 2`` (what DDP's and FSDP2's averaging computes for 2 ranks: one exact
addition and a division by a power of two), then the same SGD step.  That is the arithmetic both
runs share; one pass over the whole global batch is not, since dynamic scaling takes its amax
over the tensor it is given.  Losses and every parameter after every step are bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402

STEPS, LOCAL_BATCH, LR = 3, 16, 0.5
TORCHAO = ("tensorwise", "rowwise")
TE = ("Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling")
# per-rank state the accumulation oracle cannot share: delayed-scaling histories, the call counter that
# seeds NVFP4's stochastic rounding; these are checked FSDP2 against DDP instead
TE_STATEFUL = ("DelayedScaling", "NVFP4BlockScaling")
CONFIGS = [("torchao", r) for r in TORCHAO] + [("te", r) for r in TE]


def _model(kind: str, recipe: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "torchao":
        import fp8sim.torchao as fao

        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        return fao.convert_to_float8_training(m, config=fao.Float8LinearConfig.from_recipe_name(recipe))
    import fp8sim.pytorch as te

    return nn.Sequential(te.Linear(32, 64), nn.ReLU(), te.Linear(64, 32))


def _forward(model: nn.Module, kind: str, recipe: str, x: torch.Tensor) -> torch.Tensor:
    if kind == "torchao":
        return model(x)
    import fp8sim.pytorch as te
    from fp8sim import recipe as R

    with te.autocast(recipe=getattr(R, recipe)()):
        return model(x)


def _data(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(LOCAL_BATCH, 32, generator=g) * (1 + 3 * rank)  # the shards have different amaxes
    return x, torch.randn(LOCAL_BATCH, 32, generator=g)


def _params(model: nn.Module) -> list[np.ndarray]:
    out = []
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(full.detach().numpy().copy())
    return out


def _wrapped_run(kind: str, recipe: str, wrap: str, rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = _model(kind, recipe)
    if wrap == "fsdp":
        for layer in model:
            if list(layer.parameters()):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, params = [], []
    for step in range(STEPS):
        x, y = _data(step, rank)
        loss = nn.functional.mse_loss(_forward(model, kind, recipe, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        params.append(_params(model.module if wrap == "ddp" else model))
    storage_ok = all(p.to_local().untyped_storage().resizable() if wrap == "fsdp" else True for p in model.parameters())
    return {"losses": losses, "params": params, "storage_resizable": storage_ok}


def _reference_run(kind: str, recipe: str, world: int) -> dict:
    model = _model(kind, recipe)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, params = [], []
    for step in range(STEPS):
        grads, step_losses = [], []
        for r in range(world):
            x, y = _data(step, r)
            loss = nn.functional.mse_loss(_forward(model, kind, recipe, x), y)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            step_losses.append(loss.item())
            opt.zero_grad()
        for p, g0, g1 in zip(model.parameters(), *grads, strict=True):
            p.grad = (g0 + g1) / 2
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
        params.append(_params(model))
    return {"losses": losses, "params": params}


def _worker(rank: int, world: int) -> dict:
    out = {}
    for kind, recipe in CONFIGS:
        for wrap in ("fsdp", "ddp"):
            out[kind, recipe, wrap] = _wrapped_run(kind, recipe, wrap, rank)
        out[kind, recipe, "reference"] = _reference_run(kind, recipe, world)  # same process, same threads
    for recipe in TE_STATEFUL:
        for wrap in ("fsdp", "ddp"):
            out["te", recipe, wrap] = _wrapped_run("te", recipe, wrap, rank)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


@pytest.mark.parametrize("wrap", ["fsdp", "ddp"])
@pytest.mark.parametrize(("kind", "recipe"), CONFIGS)
def test_wrapped_training_is_bit_identical_to_gradient_accumulation(
    results: list[dict], kind: str, recipe: str, wrap: str
) -> None:
    for rank, res in enumerate(results):
        run, ref = res[kind, recipe, wrap], res[kind, recipe, "reference"]
        for step in range(STEPS):
            assert run["losses"][step] == ref["losses"][step][rank], f"rank {rank} step {step}: loss"
            for i, (got, want) in enumerate(zip(run["params"][step], ref["params"][step], strict=True)):
                bad = np.flatnonzero(got.ravel() != want.ravel())
                assert bad.size == 0, (
                    f"{kind}/{recipe}/{wrap} rank {rank} step {step} param {i}: {bad.size} differ, first at {bad[0]}: "
                    f"{got.ravel()[bad[0]]!r} vs {want.ravel()[bad[0]]!r}"
                )
        if wrap == "fsdp":
            assert run["storage_resizable"], "a sharded parameter lost its resizable storage"


@pytest.mark.parametrize("recipe", TE_STATEFUL)
def test_stateful_recipes_train_the_same_under_fsdp2_and_ddp(results: list[dict], recipe: str) -> None:
    for rank, res in enumerate(results):
        fsdp, ddp = res["te", recipe, "fsdp"], res["te", recipe, "ddp"]
        assert fsdp["losses"] == ddp["losses"] and np.isfinite(fsdp["losses"]).all(), f"rank {rank}"
        for step in range(STEPS):
            for i, (a, b) in enumerate(zip(fsdp["params"][step], ddp["params"][step], strict=True)):
                assert np.array_equal(a, b), f"{recipe} rank {rank} step {step} param {i}"
        assert fsdp["storage_resizable"]
    last = [r["te", recipe, "ddp"]["params"][-1] for r in results]
    for a, b in zip(*last, strict=True):
        assert np.array_equal(a, b), "DDP ranks hold different parameters"


def test_reading_a_parameter_leaves_its_storage_resizable() -> None:
    """The mechanism in one process: Tensor.numpy() pins a storage, fp8sim's reads do not."""
    import fp8sim.pytorch as te
    import fp8sim.torchao as fao
    from fp8sim import recipe as R

    pinned = torch.zeros(4)
    pinned.numpy()
    assert not pinned.untyped_storage().resizable()  # why torch-side reads matter

    lin = fao.convert_to_float8_training(nn.Sequential(nn.Linear(32, 32)))
    lin(torch.randn(16, 32)).sum().backward()
    mods = [te.Linear(32, 32) for _ in TE + TE_STATEFUL]
    for m, name in zip(mods, TE + TE_STATEFUL, strict=True):
        with te.autocast(recipe=getattr(R, name)()):
            m(torch.randn(32, 32)).sum().backward()
    for p in list(lin.parameters()) + [p for m in mods for p in m.parameters()]:
        assert p.untyped_storage().resizable()
