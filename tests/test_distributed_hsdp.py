"""HSDP: FSDP2 over a 2-D device mesh (replicate x shard, 2 x 2 gloo ranks) with fp8sim's FP8 all-gathers.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))`` and ``fully_shard(m, mesh=mesh)``
(TE ``tests/pytorch/distributed/fsdp2_tests/run_fsdp2_model.py`` lines 187-210 at d0067d0): ranks 0, 1 hold
the two shards of replica 0, ranks 2, 3 those of replica 1.  FSDP2 hands the extensions the 1-D shard mesh
(torch ``_fully_shard/_fsdp_param.py`` ``_init_shard_mesh``: ``mesh[mesh_dim_names[-1]]``), so:

- torchao (``float8/fsdp_utils.py`` ``fsdp_pre_all_gather`` lines 228-251: ``tensor_to_amax(...,
  device_mesh=mesh)``, ``float8_utils.py`` line 75 ``mesh.get_group()``) MAX-reduces the weight amax over
  the shard group only; its ``precompute_float8_dynamic_scale_for_fsdp`` (lines 27-84) takes the inf-norm
  of DTensors placed ``(Replicate(), Shard(0))``, which is partial over the shard dim only, so its one
  all-reduce runs over the shard group too.  The oracle is torchao's own code: real torchao ``Float8Linear``
  weights, sharded the same way, with each replica's shards scaled differently (as no healthy run has
  them) so that a reduction over the wrong dims shows.
- TE (``tensor/float8_tensor.py`` line 963 and ``nvfp4_tensor.py`` line 595 ``mesh.get_group()``;
  ``module/base.py`` lines 1856-1862 ``get_group(mesh_dim="shard")``) reduces a current-scaling amax over
  the shard group as well.

The gradient of an HSDP step is FSDP2's (torch ``_fully_shard/_fsdp_collectives.py``
``_get_gradient_divide_factors`` lines 840-846: float32 gradients use ``ReduceOp.AVG``; ``foreach_reduce``
lines 617-686: a reduce-scatter over the shard group, then an all-reduce over the replicate group):
``((g0 + g1) / 2 + (g2 + g3) / 2) / 2`` for the micro-batch gradients ``g_r`` of ranks ``r``.  The one-process
reference applies exactly that to its four micro-batches (each sum is of two terms, so rank order does not
matter).  Checks, all in the one 4-rank spawn shared with ``test_distributed_torchao_fsdp.py``
(``_four_ranks.py``):

- torchao-style ``enable_fsdp_float8_all_gather`` (dynamic and precomputed scales): losses and the full
  parameters after every step bit-identical to one process; the gathered scale identical on all 4 ranks;
  the pre-all-gather codes and scale, and the precomputed scale, of each rank equal real torchao's.
- TE-style FP8 primary weights, Float8CurrentScaling (per tensor), MXFP8BlockScaling and NVFP4BlockScaling
  (blocks; NVFP4 with one micro-batch for all ranks, see ``test_distributed_fsdp_fp8_params``): losses,
  the reduce-scattered gradient shards and every buffer of every weight shard bit-identical to the
  reference's rows (``test_distributed_fsdp_fp8_params._rows``, 2 shards); scales identical on all 4
  ranks; the current-scaling and NVFP4 amax group is the rank's shard group.  Also TE's meta-device flow
  (``Float8CurrentScaling/meta``): each rank initialises its shard (values by shard index, so the replicas
  agree) and ``reset_parameters`` quantizes it with the amax MAX-reduced over the shard group (``base.py``
  lines 1856-1862); a reduction over the replicate group instead, or none, gives each shard its own scale.
- DelayedScaling (TE's default recipe, one micro-batch for all ranks), under ``autocast`` without a group
  (TE's own HSDP test) and with a data-parallel group over all 4 ranks: the same bit-identity and scales,
  and every amax all-reduce of the run spans all 4 ranks (TE's FSDP2 hooks reduce nothing under delayed
  scaling).  Issue 16's hang: a dead module's scalers left fp8sim's global buffer when each rank's garbage
  collector freed it, so ranks disagreed on which amax all-reduces to issue; ``_collected_on_some_ranks``
  makes that deterministic (it hung before the fix).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import test_distributed_fsdp_fp8_params as fp  # noqa: E402
import test_distributed_torchao_fsdp as aot  # noqa: E402
from _four_ranks import part  # noqa: E402
from torch import nn  # noqa: E402

STEPS = 2
MESH = (2, 2)  # replicate, shard
TE_RECIPES = ("Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling")
META = "Float8CurrentScaling/meta"  # TE's meta-device flow: each shard initialised and quantized on its rank
# DelayedScaling (TE's default recipe; one micro-batch for all ranks, see test_distributed_fsdp_fp8_params):
# autocast without a group as TE's own HSDP test runs it (run_fsdp2_model.py line 328: the default group),
# and with the data-parallel group a TE user passes (here a group object of its own over all 4 ranks)
DELAYED = ("DelayedScaling", "DelayedScaling/dp")
TE_RUNS = (*TE_RECIPES, META, *DELAYED)
AMAX_GROUPED = ("Float8CurrentScaling", "NVFP4BlockScaling", META)  # the shard's amax_reduction_group is set
AO_RUNS = ("ag", "ag_precompute")


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", MESH, mesh_dim_names=("replicate", "shard"))


def _shard_index(rank: int) -> int:
    return rank % MESH[1]


def _hsdp_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    """FSDP2's HSDP gradient (module docstring): AVG over each shard group, then AVG over the replicas."""
    g0, g1, g2, g3 = grads
    return ((g0 + g1) / 2 + (g2 + g3) / 2) / 2


def _x(step: int, rank: int) -> torch.Tensor:
    return torch.randn(aot.BATCH, aot.SHAPES[0][0], generator=torch.Generator().manual_seed(10 * step + rank))


# --- torchao-style float8 all-gather -------------------------------------------------------------------


def _ao_run(rank: int, run: str, mesh) -> dict:
    from torch.distributed.fsdp import fully_shard

    import fp8sim.torchao as fao

    config = fao.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    model = fao.convert_to_float8_training(aot._model(), config=config)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for m in linears:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    scales: list[list[float]] = []

    def record(mod: nn.Module, args: tuple) -> None:  # after FSDP2's unshard (registered later)
        scales[-1].append(float(mod.weight._fp8sim_float8.scale))

    for m in linears:
        m.register_forward_pre_hook(record)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, params = [], []
    for step in range(STEPS):
        scales.append([])
        loss = model(_x(step, rank)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if run == "ag_precompute":
            fao.precompute_float8_dynamic_scale_for_fsdp(model)
        losses.append(loss.item())
        params.append([p.full_tensor().detach().numpy().copy() for p in model.parameters()])
    return {"losses": losses, "params": params, "scales": scales}


def _ao_reference(world: int) -> dict:
    """One process, no FSDP: fp8sim's Float8Linear (the whole weight cast with its own amax: the per-shard
    casts with the shard-group amax gather to the same codes), the four micro-batches' gradients
    combined as FSDP2's HSDP combines them."""
    import fp8sim.torchao as fao

    model = fao.convert_to_float8_training(aot._model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, params = [], []
    for step in range(STEPS):
        micro, step_losses = [], []
        for r in range(world):
            loss = model(_x(step, r)).float().square().mean()
            loss.backward()
            step_losses.append(loss.item())
            micro.append([p.grad.clone() for p in model.parameters()])
            opt.zero_grad()
        for i, p in enumerate(model.parameters()):
            p.grad = _hsdp_mean([g[i] for g in micro])
        opt.step()
        opt.zero_grad()
        losses.append(step_losses)
        params.append([p.detach().numpy().copy() for p in model.parameters()])
    return {"losses": losses, "params": params}


def _ao_against_torchao(rank: int, mesh) -> dict:
    """fp8sim's and real torchao's weights under the same HSDP sharding, each replica's shards scaled by
    ``1 + replica``: both pre-all-gather casts (codes, scale) and both precomputed scales, per layer."""
    from torch.distributed.fsdp import fully_shard

    try:
        import torchao.float8 as tao
    except ImportError:  # the oracle is missing: the test skips (the spawn is shared, it must not fail)
        return None

    import fp8sim.torchao as fao

    replica = rank // MESH[1]
    models = {
        "fp8sim": fao.convert_to_float8_training(
            aot._model(), config=fao.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        ),
        "torchao": tao.convert_to_float8_training(
            aot._model(), config=tao.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        ),
    }
    out: dict = {}
    for name, model in models.items():
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        linears = [m for m in model if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for m in linears:
                m.weight._local_tensor._tensor.mul_(1 + replica)
        shard_mesh = mesh["shard"]
        casts = []
        for m in linears:
            local = m.weight._local_tensor
            if name == "torchao":  # torchao's old one-argument signature
                (data,), (scale,) = local.fsdp_pre_all_gather(shard_mesh)
                codes = data.view(torch.uint8)
            else:
                (codes,), (scale, _) = local.fsdp_pre_all_gather(
                    shard_mesh, m.weight.size(), m.weight.stride(), m, None
                )
            casts.append((codes.clone().numpy(), np.float32(scale.float().reshape(-1)[0].item())))
        (tao if name == "torchao" else fao).precompute_float8_dynamic_scale_for_fsdp(model)
        pre = [np.float32(m.weight._local_tensor._precomputed_scale.float().item()) for m in linears]
        out[name] = {"casts": casts, "precomputed": pre}
    return out


# --- TE-style FP8 primary weights ----------------------------------------------------------------------


def _recording_amax_reductions(reductions: list):
    """``fp8sim.scaling.delayed._all_reduce_max`` that appends ``(group ranks, numel)`` of each call."""
    import fp8sim.scaling.delayed as delayed

    original = delayed._all_reduce_max

    def recording(row: np.ndarray, group):
        ranks = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
        reductions.append((sorted(ranks), int(row.size)))
        return original(row, group)

    return original, recording


def _te_run(recipe_name: str, rank: int, mesh, group=None) -> dict:
    from torch.distributed.fsdp import fully_shard

    import fp8sim.scaling.delayed as delayed

    recipe = fp._recipe(recipe_name)
    dims = fp._dims(recipe_name)
    if recipe_name == META:  # the shard's values depend on its shard index only: the replicas are equal

        def init(w: torch.Tensor) -> None:
            w.copy_(fp._shard_values(tuple(w.shape), _shard_index(rank)))

        model = fp._model(recipe_name, dims, init, "meta")
    else:
        model = fp._model(recipe_name, dims)
    for layer in model:
        if list(layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if recipe_name == META:  # TE run_fsdp2_model.py lines 301-306; amax MAX-reduced over the shard group
        model.to_empty(device="cpu")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    opt = torch.optim.SGD(model.parameters(), lr=fp.LR)
    losses, grads, params, reductions = [], [], [], []
    same_batch = recipe_name.split("/")[0] in fp.SAME_BATCH
    original, delayed._all_reduce_max = _recording_amax_reductions(reductions)
    try:
        for step in range(STEPS):
            x, y = fp._data(step, 0 if same_batch else rank, dims)
            losses.append(fp._step(model, recipe, x, y, group).item())
            grads.append([p.grad._local_tensor.numpy().copy() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
            params.append([fp._state(p._local_tensor) for p in model.parameters()])
    finally:
        delayed._all_reduce_max = original
    groups = []
    for p in model.parameters():
        group = getattr(p._local_tensor, "amax_reduction_group", None)
        groups.append(None if group is None else sorted(dist.get_process_group_ranks(group)))
    return {"losses": losses, "grads": grads, "params": params, "amax_groups": groups, "reductions": reductions}


def _te_reference(recipe_name: str, world: int) -> dict:
    recipe = fp._recipe(recipe_name)
    dims = fp._dims(recipe_name)
    model = (
        fp._model(recipe_name, dims, fp._whole_init(MESH[1])) if recipe_name == META else fp._model(recipe_name, dims)
    )
    opt = torch.optim.SGD(model.parameters(), lr=fp.LR)
    losses, grads, params = [], [], []
    same_batch = recipe_name.split("/")[0] in fp.SAME_BATCH  # one pass: see test_distributed_fsdp_fp8_params
    for step in range(STEPS):
        micro, step_losses = [], []
        for r in range(1 if same_batch else world):
            step_losses.append(fp._step(model, recipe, *fp._data(step, r, dims)).item())
            micro.append([p.grad.clone() for p in model.parameters()])
            opt.zero_grad()
        if same_batch:  # four equal gradients: FSDP2's mean is the gradient itself
            micro, step_losses = micro * world, step_losses * world
        for i, p in enumerate(model.parameters()):
            p.grad = _hsdp_mean([g[i] for g in micro])
        losses.append(step_losses)
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        params.append([fp._state(p) for p in model.parameters()])
    return {"losses": losses, "grads": grads, "params": params}


def _collected_on_some_ranks(rank: int, group) -> list:
    """A delayed-scaling module that ran forward under ``amax_reduction_group=group`` and is then dropped; only the
    odd ranks' garbage collector frees it (a reference cycle: only the collector frees it) before another
    module's delayed-scaling step with the default group.  TE's global buffer keeps the dead module's amaxes
    (``quantization.py`` lines 552-559 at d0067d0: the tensors themselves, until ``reset``), so every rank
    all-reduces both keys, forward and backward: the ``(group ranks, numel)`` of each amax all-reduce."""
    import gc

    import fp8sim.pytorch as te
    import fp8sim.scaling.delayed as delayed
    from fp8sim.recipe import DelayedScaling

    te.FP8GlobalStateManager.reset()  # this check's keys only (it runs last)
    reductions: list = []
    original, delayed._all_reduce_max = _recording_amax_reductions(reductions)
    gc.disable()
    try:
        for step, amax_group in enumerate((group, None)):
            torch.manual_seed(0)
            model = te.Linear(16, 16, bias=False)
            model.__dict__["_cycle"] = model  # only the cyclic collector frees it
            with te.autocast(recipe=DelayedScaling(), amax_reduction_group=amax_group):
                out = model(torch.randn(8, 16, generator=torch.Generator().manual_seed(step)))
            if step:  # the first module takes no backward: nothing else (a backward's region) holds it
                out.square().mean().backward()
            del model, out
            if step == 0 and rank % 2:
                gc.collect()
    finally:
        gc.enable()
        delayed._all_reduce_max = original
    return reductions


def hsdp_worker(rank: int, world: int) -> dict:
    """Every HSDP run of this module on one rank of the 2 x 2 mesh, and the one-process references."""
    mesh = _mesh()
    out: dict = {"against_torchao": _ao_against_torchao(rank, mesh)}
    for run in AO_RUNS:
        out[run] = _ao_run(rank, run, mesh)
    dp_group = dist.new_group(list(range(world)))  # every rank, in the same order
    for recipe_name in TE_RUNS:
        group = {"DelayedScaling": None, "DelayedScaling/dp": dp_group}.get(recipe_name, dist.group.WORLD)
        out[recipe_name] = _te_run(recipe_name, rank, mesh, group)
    # every rank runs the references: a delayed-scaling autocast reduces its amaxes over the default group
    out["reference"] = {"ao": _ao_reference(world)}
    out["reference"].update({name: _te_reference(name, world) for name in TE_RUNS if name != DELAYED[1]})
    out["reference"][DELAYED[1]] = out["reference"][DELAYED[0]]  # one process: no group, the same reference
    out["collected_on_some_ranks"] = _collected_on_some_ranks(rank, mesh.get_group("shard"))
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return part("hsdp")


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    fp._same(np.asarray(got), np.asarray(want), what)


def test_hsdp_float8_casts_and_precomputed_scales_are_torchaos(results: list[dict]) -> None:
    """Real torchao as the oracle: each rank's pre-all-gather codes and scale and its precomputed scale
    equal torchao's bit for bit; the replicas' scales differ (their shards were scaled differently), so the
    amax was reduced over the shard group only."""
    if results[0]["against_torchao"] is None:
        pytest.skip("torchao is not installed")
    for rank, res in enumerate(results):
        got, want = res["against_torchao"]["fp8sim"], res["against_torchao"]["torchao"]
        pairs = zip(got["casts"], want["casts"], strict=True)
        for layer, ((codes, scale), (want_codes, want_scale)) in enumerate(pairs):
            assert scale == want_scale, f"rank {rank} layer {layer}: scale {scale!r} vs torchao {want_scale!r}"
            _same(codes[: want_codes.shape[0]], want_codes, f"rank {rank} layer {layer} codes")
        _same(np.array(got["precomputed"]), np.array(want["precomputed"]), f"rank {rank} precomputed scales")
    by_rank = [res["against_torchao"]["torchao"]["precomputed"] for res in results]
    assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3], by_rank  # one scale per shard group
    assert all(a != b for a, b in zip(by_rank[0], by_rank[2], strict=True)), by_rank  # no reduction over the replicas


@pytest.mark.parametrize("run", AO_RUNS)
def test_hsdp_float8_all_gather_trains_bit_identically_to_one_process(results: list[dict], run: str) -> None:
    for rank, res in enumerate(results):
        got, ref = res[run], res["reference"]["ao"]
        for step in range(STEPS):
            assert got["losses"][step] == ref["losses"][step][rank], f"{run} rank {rank} step {step}: loss"
            for i, (a, b) in enumerate(zip(got["params"][step], ref["params"][step], strict=True)):
                _same(a, b, f"{run} rank {rank} step {step} param {i}")
        assert got["scales"] == results[0][run]["scales"], f"{run}: rank {rank}'s gathered scales differ from rank 0's"


@pytest.mark.parametrize("recipe_name", TE_RUNS)
def test_hsdp_fp8_primary_weights_train_bit_identically_to_one_process(results: list[dict], recipe_name: str) -> None:
    for rank, res in enumerate(results):
        run, ref, shard = res[recipe_name], res["reference"][recipe_name], _shard_index(rank)
        for step in range(STEPS):
            assert run["losses"][step] == ref["losses"][step][rank], f"rank {rank} step {step}: loss"
            for i, (got, want) in enumerate(zip(run["grads"][step], ref["grads"][step], strict=True)):
                _same(got, np.array_split(want, MESH[1], axis=0)[shard], f"rank {rank} step {step} grad {i}")
            for i, (got, want) in enumerate(zip(run["params"][step], ref["params"][step], strict=True)):
                want = fp._rows(want, shard, MESH[1])
                assert got.keys() == want.keys(), f"param {i}: {sorted(got)} vs {sorted(want)}"
                for k in got:
                    _same(got[k], want[k], f"{recipe_name} rank {rank} step {step} param {i} {k}")


@pytest.mark.parametrize("recipe_name", TE_RUNS)
def test_hsdp_scales_are_identical_on_every_rank_and_reduced_over_the_shard_group(
    results: list[dict], recipe_name: str
) -> None:
    """Scales (per-tensor ``scale_inv``, current and delayed scaling; the block scales of each shard, equal
    on its replica; NVFP4's global amaxes) identical across ranks; a current-scaling or NVFP4 shard
    MAX-reduces its amax over its shard group (TE ``float8_tensor.py`` line 963, ``nvfp4_tensor.py`` line
    595, with FSDP2's shard mesh); delayed scaling's group: the test below."""
    for rank, res in enumerate(results):
        run = res[recipe_name]
        peer = results[rank ^ MESH[1]][recipe_name]  # the same shard on the other replica
        for step in range(STEPS):
            for i, (a, b) in enumerate(zip(run["params"][step], peer["params"][step], strict=True)):
                for key in a:
                    _same(a[key], b[key], f"rank {rank} vs {rank ^ MESH[1]} step {step} param {i} {key}")
                for key in a:  # per tensor: one scale (NVFP4: one global amax) for the whole weight, on all 4 ranks
                    if key == "scale_inv" or key.endswith("_amax"):
                        _same(a[key], results[0][recipe_name]["params"][step][i][key], f"step {step} param {i} {key}")
        if recipe_name in AMAX_GROUPED:
            shard_group = [rank - _shard_index(rank) + s for s in range(MESH[1])]
            weights = [g for g in run["amax_groups"] if g is not None]
            assert weights and all(g == shard_group for g in weights), (rank, run["amax_groups"])


@pytest.mark.parametrize("recipe_name", DELAYED)
def test_hsdp_delayed_scaling_reduces_amaxes_over_all_ranks_in_te_buffer_order(
    results: list[dict], recipe_name: str
) -> None:
    """Delayed scaling reduces the amax over autocast's group (the default group, or the data-parallel
    group passed), never FSDP2's shard group (TE's Float8Tensor FSDP2 hooks reduce nothing under delayed
    scaling: ``float8_tensor.py`` lines 961-963 at d0067d0 set a group for current scaling only).  Per step,
    one MAX all-reduce per buffer key at autocast exit (3 amaxes per module) and one at the end of the
    backward (2 per module), TE ``reduce_and_update_fp8_tensors`` (``quantization.py`` lines 656-684); the
    ``/dp`` run also reduces the first run's dead model (TE's buffer keeps its amaxes until ``reset``)."""
    keys = DELAYED.index(recipe_name) + 1
    world = list(range(len(results)))
    want = ([(world, 6)] * keys + [(world, 4)] * keys) * STEPS
    for rank, res in enumerate(results):
        assert res[recipe_name]["reductions"] == want, f"rank {rank}: {res[recipe_name]['reductions']}"


def test_delayed_scaling_reduces_a_dead_modules_amaxes_on_every_rank(results: list[dict]) -> None:
    """Issue 16's hang: a module's scalers stayed in the global buffer only until the garbage collector
    freed the module, so a rank that had collected it skipped that key's all-reduce and its peers waited
    in it (or, the sizes differing, gloo aborted).  ``_collected_on_some_ranks``: the dead module's keys are
    all-reduced on every rank, in the same order (TE ``quantization.py`` lines 552-559 and 656-684)."""
    for rank, res in enumerate(results):
        shard = sorted(r - _shard_index(r) + s for r in (rank,) for s in range(MESH[1]))
        world = list(range(len(results)))
        want = [(shard, 3), (shard, 3), (world, 3), (shard, 2), (world, 2)]
        assert res["collected_on_some_ranks"] == want, f"rank {rank}: {res['collected_on_some_ranks']}"


@pytest.mark.slow
def test_a_hung_run_fails_with_each_ranks_stack() -> None:
    """A hang (as issue 16's, before the fix) fails at the deadline with each rank's Python stack
    (``_dist.ranks``): the waiting rank's shows the collective it is in."""
    from _dist import RankFailure, ranks
    from test_distributed_reliability import _hangs

    with pytest.raises(RankFailure, match="did not finish within 8.0 s") as info:
        ranks(_hangs, timeout=8.0)
    message = str(info.value)
    rank0 = message.split("--- rank 0 ---")[1].split("--- rank 1 ---")[0]
    assert "in barrier" in rank0 and "in _hangs" in rank0, message
    assert "in _hangs" in message.split("--- rank 1 ---")[1], message
