"""``fp8sim study --distributed``: FP8 numerics across 2-4 CPU ranks (gloo), one small model each.

Three experiments, each reported per step:

* **FP8 vs bf16 all-gather** (FSDP2, torchao-style ``Float8Linear``, bf16 ``MixedPrecisionPolicy``):
  the losses with ``enable_fsdp_float8_all_gather`` on and off, and, for the bf16 all-gather, the
  share of weight codes that differ from the single-rounding cast of the float32 master weight
  (fp32 -> bf16 -> fp8 rounds twice; the float8 all-gather casts the master once);
* **per-rank vs group amax** (TE-style ``Linear``, ``DelayedScaling``, each rank its own batch):
  the largest relative difference between the ranks' input scales, ``reduce_amax`` on and off;
* **the wrong reduction group** (a column-parallel weight, one row block per rank, current
  scaling): amaxes reduced over the tensor-parallel group vs not reduced (each rank alone, as a
  data-parallel-only group would leave a TP shard): the spread of the shards' scales and the
  share of gathered outputs that differ from the one-process FP8 result.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._util.args import as_int
from .._util.atomic import atomic_file

__all__ = ["DistributedStudy", "run_distributed_study", "write_distributed_study"]

FORMAT_VERSION = 1


@dataclass
class DistributedStudy:
    """The per-step results of the three experiments (module docstring)."""

    world_size: int
    steps: int
    all_gather: dict[str, Any] = field(default_factory=dict)
    amax: dict[str, Any] = field(default_factory=dict)
    wrong_group: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """A markdown summary (one row per step)."""
        ag, am, wg = self.all_gather, self.amax, self.wrong_group
        lines = [
            f"# FP8 across {self.world_size} ranks (gloo, CPU)",
            "",
            "| step | loss fp8 AG | loss bf16 AG | codes != single rounding (bf16 AG) "
            "| scale spread reduce_amax=True | =False | TP scale spread right/wrong group "
            "| outputs != 1-process, right/wrong |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in range(self.steps):
            lines.append(
                f"| {s} | {ag['loss_fp8'][s]:.6g} | {ag['loss_bf16'][s]:.6g} | {ag['double_rounded_share'][s]:.4%} "
                f"| {am['spread_reduced'][s]:.3g} | {am['spread_per_rank'][s]:.3g} "
                f"| {wg['scale_spread_right'][s]:.3g} / {wg['scale_spread_wrong'][s]:.3g} "
                f"| {wg['output_mismatch_right'][s]:.2%} / {wg['output_mismatch_wrong'][s]:.2%} |"
            )
        return "\n".join(lines)


def _cast_e4m3(w: np.ndarray) -> np.ndarray:
    """torchao's tensorwise cast of one weight: codes of ``satfinite(RN(fl32(w) * fl32(448 / amax)))``."""
    import ml_dtypes

    w = np.asarray(w, np.float32)
    scale = np.float32(448.0 / max(float(np.abs(w).max()), 1e-12))
    return np.clip(w * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _fsdp_run(rank: int, float8_all_gather: bool, steps: int) -> tuple[list[float], list[list[np.ndarray]]]:
    import torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import fp8sim.torchao as fao

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    config = fao.Float8LinearConfig(enable_fsdp_float8_all_gather=float8_all_gather)
    fao.convert_to_float8_training(model, config=config)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for m in (model[0], model[2], model):
        fully_shard(m, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, masters = [], []
    for step in range(steps):
        masters.append([model[i].weight.full_tensor().detach().numpy().copy() for i in (0, 2)])
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
        loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(_global_mean(loss.item()))
    return losses, masters


def _global_mean(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item() / dist.get_world_size())


def _spread(values: Any) -> float:
    """max |v - v_0| / |v_0| over the ranks' values of one quantity."""
    v = np.asarray(values, np.float64)
    return float(np.max(np.abs(v - v[0])) / np.abs(v[0]))


def _all_values(value: float) -> list[float]:
    import torch
    import torch.distributed as dist

    out = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([value], dtype=torch.float64))
    return [float(o.item()) for o in out]


def _amax_run(rank: int, reduce_amax: bool, steps: int) -> list[float]:
    import torch
    import torch.distributed as dist

    import fp8sim.pytorch as te

    from ..recipe import DelayedScaling

    torch.manual_seed(0)
    m = te.Linear(64, 64)
    recipe = DelayedScaling(amax_history_len=4, reduce_amax=reduce_amax)
    spreads = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 64, generator=g) * (1 + rank)  # the ranks' batches differ in range
        with te.autocast(recipe=recipe, amax_reduction_group=dist.group.WORLD):
            out = m(x)
        out.square().mean().backward()
        spreads.append(_spread(_all_values(float(m.fp8_gemms["gemm"].fwd.scale[0]))))
    return spreads


def _wrong_group_run(rank: int, world: int, steps: int) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from ..cast import decode, encode
    from ..formats import get_format
    from ..scaling.current import compute_scale_from_amax

    fmt = get_format("e4m3")
    out: dict[str, list[float]] = {k: [] for k in ("scale_spread", "mismatch")}
    res = {"right": {k: [] for k in out}, "wrong": {k: [] for k in out}}
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        w = torch.randn(16 * world, 64, generator=g) * torch.linspace(0.1, 4, 16 * world).reshape(-1, 1)
        x = torch.randn(32, 64, generator=g)
        shard = w.chunk(world)[rank]

        def fp8_dequant(t: torch.Tensor, amax: float) -> torch.Tensor:
            scale = float(compute_scale_from_amax(np.float32(amax), fmt.max))
            return decode(encode(t * scale, fmt, saturate=True), fmt) / scale, scale

        whole, _ = fp8_dequant(w, float(w.abs().max()))
        want = x @ whole.t()
        for name in ("right", "wrong"):
            amax = shard.abs().max().reshape(1).clone()
            if name == "right":
                dist.all_reduce(amax, op=dist.ReduceOp.MAX)  # the tensor-parallel group: every shard of w
            deq, scale = fp8_dequant(shard, float(amax.item()))
            parts = [torch.empty(32, 16) for _ in range(world)]
            dist.all_gather(parts, (x @ deq.t()).contiguous())
            got = torch.cat(parts, dim=1)
            res[name]["scale_spread"].append(_spread(_all_values(scale)))
            res[name]["mismatch"].append(float((got != want).double().mean()))
    return {f"{k}_{name}": v for name, d in res.items() for k, v in d.items()}


def _worker(rank: int, world: int, steps: int) -> dict:
    fp8_losses, _ = _fsdp_run(rank, True, steps)
    bf16_losses, masters = _fsdp_run(rank, False, steps)
    share = []
    for ws in masters:
        diff = total = 0
        for w in ws:
            import ml_dtypes

            single = _cast_e4m3(w)
            double = _cast_e4m3(w.astype(ml_dtypes.bfloat16).astype(np.float32))
            diff, total = diff + int(np.count_nonzero(single != double)), total + single.size
        share.append(diff / total)
    return {
        "all_gather": {"loss_fp8": fp8_losses, "loss_bf16": bf16_losses, "double_rounded_share": share},
        "amax": {"spread_reduced": _amax_run(rank, True, steps), "spread_per_rank": _amax_run(rank, False, steps)},
        "wrong_group": _wrong_group_run(rank, world, steps),
    }


def run_distributed_study(world_size: int = 2, steps: int = 4, timeout: float = 300.0) -> DistributedStudy:
    """Run the three experiments on ``world_size`` (2-4) gloo ranks for ``steps`` steps."""
    from ..collectives.spawn import run_ranks

    if world_size not in (2, 3, 4):
        raise ValueError(f"world_size must be 2, 3 or 4, got {world_size!r}")
    steps = as_int(steps, "steps", lo=1)
    r0 = run_ranks(_worker, (steps,), world_size=world_size, timeout=timeout)[0]
    wg = r0["wrong_group"]
    return DistributedStudy(
        world_size,
        steps,
        all_gather=r0["all_gather"],
        amax=r0["amax"],
        wrong_group={
            "scale_spread_right": wg["scale_spread_right"],
            "scale_spread_wrong": wg["scale_spread_wrong"],
            "output_mismatch_right": wg["mismatch_right"],
            "output_mismatch_wrong": wg["mismatch_wrong"],
        },
    )


def write_distributed_study(study: DistributedStudy, out_dir: str, force: bool = False) -> str:
    """Write ``distributed.md`` and ``distributed.json`` (format version 1) atomically; returns the folder.
    An existing result is kept unless ``force``."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {ext: os.path.join(out_dir, f"distributed.{ext}") for ext in ("md", "json")}
    if not force and any(os.path.exists(p) for p in paths.values()):
        raise FileExistsError(f"{paths['json']} exists; pass --force to overwrite")
    payload = {"format_version": FORMAT_VERSION, **study.__dict__}
    texts = {"md": study.table() + "\n", "json": json.dumps(payload, indent=1) + "\n"}
    for ext, path in paths.items():
        with atomic_file(path, force=force) as f:
            f.write(texts[ext].encode())
    return out_dir
