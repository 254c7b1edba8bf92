"""torchao-style FSDP2 float8 all-gather (``enable_fsdp_float8_all_gather=True``) on gloo, 2 and 4 ranks.

Oracle, written here from torchao 0.18's ``torchao/float8/fsdp_utils.py`` (``fsdp_pre_all_gather``:
``hp_tensor_to_float8_dynamic(..., reduce_amax=True, device_mesh=mesh)``, lines 240-262) and
``float8_utils.py`` (``amax_to_scale``, lines 32-53; ``tensor_to_amax``, lines 57-82): the
weight is split as FSDP2 splits it (``torch.chunk`` along dim 0; with 4 ranks the 6-row weight
leaves rank 3 an empty shard), each shard's ``max|w|`` is MAX-reduced, ``scale =
fl32(448 / max(fl64(amax), 1e-12))`` in float64, and each shard is cast
``RN(clip(fl32(w) * scale, +-448))`` by ml_dtypes; the gathered codes are the shards' codes in
rank order.  With ``precompute_float8_dynamic_scale_for_fsdp`` (``fsdp_utils.py`` lines 27-84)
the EPS clamp happens in float32 before the float64 division.  Every rank's gathered codes and
scale equal the oracle at every step, also under a bf16 ``MixedPrecisionPolicy`` (the float32
master weight is cast once, never through bf16).  With float32 params the training is
bit-identical to FSDP2 without float8 all-gather (the per-shard cast with the mesh-wide scale is
the whole-tensor cast).
"""

from __future__ import annotations

import io

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

import fp8sim.torchao as fao  # noqa: E402

STEPS, BATCH = 2, 8
SHAPES = ((16, 40), (40, 6), (6, 16))  # (in, out): weights 40x16, 6x40 (uneven, empty with 4 ranks), 16x6
RUNS = ("off", "ag", "ag_precompute", "ag_bf16")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (k, n) in enumerate(SHAPES):
        layers += [nn.Linear(k, n)] + ([nn.ReLU()] if i < len(SHAPES) - 1 else [])
    return nn.Sequential(*layers)


def _run(rank: int, world: int, run: str) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = fao.convert_to_float8_training(
        _model(), config=fao.Float8LinearConfig(enable_fsdp_float8_all_gather=run != "off")
    )
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if run == "ag_bf16" else MixedPrecisionPolicy()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for m in linears:
        fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    seen: list[list] = []

    def record(mod: nn.Module, args: tuple) -> None:  # runs after FSDP2's unshard (registered later)
        fp8 = getattr(mod.weight, "_fp8sim_float8", None)
        if fp8 is not None:
            seen[-1].append((fp8.codes.clone().numpy(), float(fp8.scale)))  # clone: .numpy() pins the storage

    for m in linears:
        m.register_forward_pre_hook(record)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, masters = [], []
    for step in range(STEPS):
        masters.append([m.weight.full_tensor().detach().numpy().copy() for m in linears])
        seen.append([])
        x = torch.randn(BATCH, SHAPES[0][0], generator=torch.Generator().manual_seed(10 * step + rank))
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if run == "ag_precompute":
            fao.precompute_float8_dynamic_scale_for_fsdp(model)
        losses.append(loss.item())
    params = [p.full_tensor().detach().numpy().copy() for p in model.parameters()]
    return {"losses": losses, "masters": masters, "seen": seen, "params": params}


def _worker(rank: int, world: int) -> dict:
    runs = RUNS if world == 2 else RUNS[:3]  # the bf16 policy is checked with 2 ranks only (cheaper)
    return {run: _run(rank, world, run) for run in runs}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    if request.param == 4:  # the 4-rank spawn is shared with the HSDP checks (_four_ranks.py)
        from _four_ranks import part

        return 4, part("torchao")
    return request.param, ranks(_worker, world_size=request.param)


def _oracle(w: np.ndarray, world: int, precomputed: bool) -> tuple[np.ndarray, np.float32]:
    shards = np.array_split(w, [min(i * -(-w.shape[0] // world), w.shape[0]) for i in range(1, world)])
    amax = max((np.abs(s).max() if s.size else np.float32(0)) for s in shards)
    if precomputed:  # clamp in float32, then float64
        scale = np.float32(448.0 / np.float64(np.maximum(np.float32(amax), np.float32(1e-12))))
    else:
        scale = np.float32(448.0 / max(np.float64(amax), 1e-12))
    parts = [np.clip(s.astype(np.float32) * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn) for s in shards]
    return np.concatenate(parts).view(np.uint8), scale


def test_every_rank_gathers_the_per_shard_casts_with_the_mesh_wide_scale(results: tuple) -> None:
    world, res = results
    for run in ("ag", "ag_precompute", "ag_bf16"):
        for rank, r in enumerate(res):
            if run not in r:
                continue
            seen, masters = r[run]["seen"], r[run]["masters"]
            for step in range(STEPS):
                assert len(seen[step]) == len(SHAPES), f"{run}: a Linear ran without a float8 weight"
                for layer, ((codes, scale), w) in enumerate(zip(seen[step], masters[step], strict=True)):
                    want_codes, want_scale = _oracle(w, world, run == "ag_precompute" and step > 0)
                    where = f"{run} rank {rank} step {step} layer {layer}"
                    assert np.float32(scale) == want_scale, f"{where}: scale {scale!r} != {want_scale!r}"
                    bad = np.flatnonzero(codes.ravel() != want_codes.ravel())
                    assert bad.size == 0, (
                        f"{where}: code {bad[0]} {codes.ravel()[bad[0]]:#04x} != {want_codes.ravel()[bad[0]]:#04x}"
                    )


def test_float8_all_gather_trains_bit_identical_to_the_high_precision_all_gather(results: tuple) -> None:
    world, res = results
    for rank, r in enumerate(res):
        for run in ("ag", "ag_precompute"):
            assert r[run]["losses"] == r["off"]["losses"], f"{run} rank {rank}"
            for a, b in zip(r[run]["params"], r["off"]["params"], strict=True):
                assert np.array_equal(a, b), f"{run} rank {rank}: parameters differ"


def test_the_bf16_policy_casts_the_float32_master_once(results: tuple) -> None:
    """Under param_dtype=bf16 the gathered codes are the single-rounding cast of the float32 master (the
    oracle above is float32); the bf16-gathered alternative rounds twice and differs somewhere."""
    world, res = results
    if world != 2:
        pytest.skip("run with 2 ranks")
    seen, masters = res[0]["ag_bf16"]["seen"], res[0]["ag_bf16"]["masters"]
    twice = 0
    for (codes, _), w in zip(seen[0], masters[0], strict=True):
        bf = w.astype(ml_dtypes.bfloat16).astype(np.float32)
        amax = np.float64(np.abs(bf).max())
        s = np.float32(448.0 / max(amax, 1e-12))
        twice += int(
            np.count_nonzero(np.clip(bf * s, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8) != codes)
        )
    assert twice > 0


def test_precompute_without_float8_weights_is_a_no_op_and_the_wrapper_keeps_the_weight() -> None:
    model = fao.convert_to_float8_training(_model())
    fao.precompute_float8_dynamic_scale_for_fsdp(model)  # no DTensor weights: nothing to do (torchao returns)
    wrapped = fao.convert_to_float8_training(
        _model(), config=fao.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    )
    plain = fao.convert_to_float8_training(_model())
    w = wrapped[0].weight
    assert isinstance(w, nn.Parameter) and isinstance(w, fao.WeightWithDynamicFloat8CastTensor)
    x = torch.randn(BATCH, SHAPES[0][0])
    assert torch.equal(wrapped(x), plain(x))  # without FSDP2 the wrapper is the plain weight
    buf = io.BytesIO()
    torch.save(wrapped.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)  # weights_only=True by default (torch >= 2.6)
    assert isinstance(state["0.weight"], fao.WeightWithDynamicFloat8CastTensor)
    assert torch.equal(state["0.weight"]._tensor, w._tensor)
    with pytest.raises(ValueError, match="Unsupported float8_dtype"):
        fao.WeightWithDynamicFloat8CastTensor(torch.zeros(2), None, torch.float16)
