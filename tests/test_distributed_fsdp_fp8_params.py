"""FP8 primary weights (``quantized_model_init``) under FSDP2 on 2 gloo ranks (issue 16, item 4).

TE gathers a ``Float8Tensor`` parameter as its uint8 codes (TE ``tensor/float8_tensor.py``
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, lines 938-1047 at d0067d0) and, for current
scaling, MAX-reduces the amax of the optimizer's in-place re-quantization over the mesh (line 963,
``update_quantized`` line 300), so every shard of a weight has one ``_scale_inv``.  One spawn runs
every check; the oracle is a single-process model built the same way (same seed, same quantized
weights), trained on the ranks' micro-batches with gradient accumulation ``(g_0 + g_1) / 2``
(FSDP2's averaging for 2 ranks: one exact addition, a division by a power of two).

- Float8CurrentScaling: the ranks see different micro-batches.  Losses, the reduce-scattered
  gradient shards, the weight codes and ``_scale_inv`` of every shard after every step are
  bit-identical to the reference's rows.
- The same Float8CurrentScaling run with ``fully_shard`` on the root alone (not resharded after
  forward: TE gathers rowwise plus the quantizer's columnwise usage once, line 985).
- DelayedScaling: both ranks see the same micro-batch and the reference takes one pass per step.
  The reference cannot take two passes over different micro-batches: each pass rolls the amax
  history, so its scales follow another trajectory than one pass per rank with a MAX-reduced amax.
- The all-gather payload: every ``all_gather_single`` FSDP2 issues carries uint8, as many bytes as
  the shard's FP8 codes plus 4 per float32 bias element (a high-precision gather would send 4 per
  weight element); the unsharded weight is a ``Float8Tensor`` whose codes and scale are the
  reference's.
- ``preserve_high_precision_init_val``: FSDP2 replaces the parameters; TE's own FSDP2 test carries
  the parameter attributes across (``tests/pytorch/distributed/fsdp2_tests/fsdp2_utils.py``
  ``save_custom_attrs``/``restore_custom_attrs``) and so does this one: the value is the
  initialisation of the same modules built without ``quantized_model_init``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import ranks  # noqa: E402
from torch import nn  # noqa: E402

STEPS, LOCAL_BATCH, LR = 3, 8, 0.5
RECIPES = ("Float8CurrentScaling", "DelayedScaling")
ROOT_ONLY = "Float8CurrentScaling/root-only"  # fully_shard on the root alone
RUNS = (*RECIPES, ROOT_ONLY)
SIZES = ((32, 64, True), (64, 32, False))  # in, out, bias


def _recipe(name: str):
    from fp8sim import recipe as R

    return getattr(R, name)()


def _model(recipe_name: str | None) -> nn.Module:
    import fp8sim.pytorch as te

    torch.manual_seed(0)
    if recipe_name is None:
        return nn.Sequential(te.Linear(32, 64, bias=True), nn.ReLU(), te.Linear(64, 32, bias=False))
    with te.quantized_model_init(recipe=_recipe(recipe_name), preserve_high_precision_init_val=True):
        return nn.Sequential(te.Linear(32, 64, bias=True), nn.ReLU(), te.Linear(64, 32, bias=False))


def _data(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(LOCAL_BATCH, 32, generator=g) * (1 + 3 * rank)  # the micro-batches have different amaxes
    return x, torch.randn(LOCAL_BATCH, 32, generator=g)


def _step(model: nn.Module, recipe, x: torch.Tensor, y: torch.Tensor, group=None) -> torch.Tensor:
    import fp8sim.pytorch as te

    with te.autocast(recipe=recipe, amax_reduction_group=group):
        out = model(x)
    loss = nn.functional.mse_loss(out, y)
    loss.backward()
    return loss


def _state(p: torch.Tensor) -> dict:
    """Codes and scale of a Float8Tensor (or the values of a plain tensor), as numpy."""
    if hasattr(p, "_data") and p._data is not None:
        return {"codes": p._data.clone().numpy(), "scale_inv": p._scale_inv.clone().numpy()}  # .numpy() pins storage
    return {"values": p.detach().clone().numpy()}


def _rows(full: dict, rank: int, world: int) -> dict:
    return {k: v if k == "scale_inv" else np.array_split(v, world, axis=0)[rank] for k, v in full.items()}


def _fsdp_run(recipe_name: str, rank: int, world: int, per_layer: bool = True) -> dict:
    from torch.distributed.fsdp import fully_shard

    same_batch = recipe_name == "DelayedScaling"
    recipe = _recipe(recipe_name)
    model = _model(recipe_name)
    attrs = {n: {k: v for k, v in vars(p).items() if not k.startswith("_")} for n, p in model.named_parameters()}
    for layer in model if per_layer else ():  # per layer: resharded after forward, gathered again in backward
        if list(layer.parameters()):
            fully_shard(layer)
    fully_shard(model)  # the root alone: not resharded after forward (rowwise + columnwise gathered once)
    for n, p in model.named_parameters():  # TE fsdp2_utils.restore_custom_attrs
        for k, v in attrs[n].items():
            setattr(p, k, v)
    hp_init = {n: p.get_high_precision_init_val().numpy().copy() for n, p in model.named_parameters() if "weight" in n}

    gathers: list[tuple[str, int]] = []
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    original = getattr(dist, name)

    def counting(output, inp, *args, **kwargs):
        gathers.append((str(inp.dtype), inp.numel()))
        return original(output, inp, *args, **kwargs)

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads, params = [], [], []
    setattr(dist, name, counting)
    try:
        for step in range(STEPS):
            x, y = _data(step, 0 if same_batch else rank)
            losses.append(_step(model, recipe, x, y, dist.group.WORLD).item())
            grads.append([p.grad._local_tensor.numpy().copy() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
            params.append([_state(p._local_tensor) for p in model.parameters()])
    finally:
        setattr(dist, name, original)
    shard_bytes = [
        sum(p._local_tensor.numel() * (1 if "weight" in n else 4) for n, p in layer.named_parameters())
        for layer in (model[0], model[2])
    ]
    if not per_layer:
        shard_bytes = [sum(shard_bytes)]  # one all-gather for the root's group
    weights = [p._local_tensor for n, p in model.named_parameters() if "weight" in n]
    resizable = all(w._data.untyped_storage().resizable() for w in weights)
    for unit in (model[0], model[2]) if per_layer else (model,):
        unit.unshard()
    unsharded = [(type(m.weight).__name__, _state(m.weight)) for m in (model[0], model[2])]
    return {
        "losses": losses,
        "grads": grads,
        "params": params,
        "gathers": gathers,
        "shard_bytes": shard_bytes,
        "unsharded": unsharded,
        "hp_init": hp_init,
        "storage_resizable": resizable,
    }


def _reference_run(recipe_name: str, world: int) -> dict:
    same_batch = recipe_name == "DelayedScaling"
    recipe = _recipe(recipe_name)
    model = _model(recipe_name)
    hp_init = {n: p.get_high_precision_init_val().numpy().copy() for n, p in model.named_parameters() if "weight" in n}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads, params = [], [], []
    for step in range(STEPS):
        if same_batch:
            losses.append([_step(model, recipe, *_data(step, 0)).item()] * world)
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
        else:
            micro, step_losses = [], []
            for r in range(world):
                step_losses.append(_step(model, recipe, *_data(step, r)).item())
                micro.append([p.grad.clone() for p in model.parameters()])
                opt.zero_grad()
            for p, g0, g1 in zip(model.parameters(), *micro, strict=True):
                p.grad = (g0 + g1) / 2
            losses.append(step_losses)
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        params.append([_state(p) for p in model.parameters()])
    plain = {n: p.detach().numpy().copy() for n, p in _model(None).named_parameters() if "weight" in n}
    return {"losses": losses, "grads": grads, "params": params, "hp_init": hp_init, "plain_init": plain}


def _worker(rank: int, world: int) -> dict:
    out = {}
    for recipe_name in RECIPES:
        out[recipe_name, "fsdp"] = _fsdp_run(recipe_name, rank, world)
        out[recipe_name, "reference"] = _reference_run(recipe_name, world)  # same process, same threads
    out[ROOT_ONLY, "fsdp"] = _fsdp_run("Float8CurrentScaling", rank, world, per_layer=False)
    out[ROOT_ONLY, "reference"] = out["Float8CurrentScaling", "reference"]
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return ranks(_worker, world_size=2)


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(got.ravel() != want.ravel()) if got.shape == want.shape else [0]
    assert got.shape == want.shape and len(bad) == 0, (
        f"{what}: shape {got.shape} vs {want.shape}, first difference at {bad[0]}: "
        f"{got.ravel()[bad[0]]!r} vs {want.ravel()[bad[0]]!r}"
    )


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_fp8_weights_train_bit_identically_to_one_process(results: list[dict], recipe_name: str) -> None:
    world = len(results)
    for rank, res in enumerate(results):
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        for step in range(STEPS):
            assert run["losses"][step] == ref["losses"][step][rank], f"rank {rank} step {step}: loss"
            for i, (got, want) in enumerate(zip(run["grads"][step], ref["grads"][step], strict=True)):
                _same(got, np.array_split(want, world, axis=0)[rank], f"rank {rank} step {step} grad {i}")
            for i, (got, want) in enumerate(zip(run["params"][step], ref["params"][step], strict=True)):
                want = _rows(want, rank, world)
                assert got.keys() == want.keys(), f"param {i}: {sorted(got)} vs {sorted(want)}"
                for k in got:
                    _same(got[k], want[k], f"{recipe_name} rank {rank} step {step} param {i} {k}")
        assert run["storage_resizable"], "a sharded FP8 parameter lost its resizable storage"


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_gathers_fp8_bytes_and_rebuilds_the_reference_weight(results: list[dict], recipe_name: str) -> None:
    for rank, res in enumerate(results):
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        assert run["gathers"], "no all-gather was recorded"
        for dtype, numel in run["gathers"]:
            assert dtype == "torch.uint8" and numel in run["shard_bytes"], (dtype, numel, run["shard_bytes"])
        for (cls, got), i in zip(run["unsharded"], (0, 2), strict=True):
            assert cls == "Float8Tensor", f"layer {i}: the gathered weight is a {cls}"
            want = ref["params"][-1][0 if i == 0 else 2]
            _same(got["codes"], want["codes"], f"rank {rank} layer {i} gathered codes")
            _same(got["scale_inv"], want["scale_inv"], f"rank {rank} layer {i} gathered scale_inv")


@pytest.mark.parametrize("recipe_name", RUNS)
def test_fsdp2_shards_of_a_weight_share_one_scale_on_every_rank(results: list[dict], recipe_name: str) -> None:
    r0, r1 = (res[recipe_name, "fsdp"] for res in results)
    for step in range(STEPS):
        for i, (a, b) in enumerate(zip(r0["params"][step], r1["params"][step], strict=True)):
            if "scale_inv" in a:
                _same(a["scale_inv"], b["scale_inv"], f"step {step} param {i}: rank 0 vs rank 1")


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_fsdp2_keeps_the_high_precision_init_val(results: list[dict], recipe_name: str) -> None:
    for res in results:
        run, ref = res[recipe_name, "fsdp"], res[recipe_name, "reference"]
        assert run["hp_init"].keys() == ref["plain_init"].keys()
        for n, want in ref["plain_init"].items():
            _same(run["hp_init"][n], want, f"{n} (FSDP2)")
            _same(ref["hp_init"][n], want, f"{n} (one process)")
