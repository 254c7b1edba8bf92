"""The rank side of test_explain.py's tensor-parallel case: a column- then row-parallel ``Linear`` pair with
sequence parallelism on 2 gloo ranks, explained under the RTX 4060 TE profile and then run under it."""

from __future__ import annotations

import torch
import torch.distributed as dist

T, H, F = 32, 64, 128  # tokens (whole sequence), hidden, ffn


def explain_tp_worker(rank: int, world: int) -> dict:
    import fp8sim.pytorch as te
    from fp8sim.gemm import get_profile
    from fp8sim.recipe import DelayedScaling

    torch.set_num_threads(1)
    tp = dist.new_group(list(range(world)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        te.Linear(H, F, tp_group=tp, parallel_mode="column", sequence_parallel=True, params_dtype=torch.bfloat16),
        te.Linear(F, H, tp_group=tp, parallel_mode="row", sequence_parallel=True, params_dtype=torch.bfloat16),
    )
    x = torch.randn(T // world, H, dtype=torch.bfloat16, requires_grad=True)  # this rank's sequence shard
    prof = get_profile("rtx4060_cublaslt_12_8_te")
    dry = te.explain(model, x, recipe=DelayedScaling(), accumulator=prof)
    given = prof.with_splits({(p.m, p.n, p.k): (1, "none") for p in dry.unknown})
    run = te.explain(model, x, recipe=DelayedScaling(), accumulator=given, compute=True)
    rows = lambda rec: [(p.module, p.role, p.m, p.n, p.k, p.split, p.source) for p in rec.plans]  # noqa: E731
    return {"dry": rows(dry), "run": rows(run), "grad": bool(torch.isfinite(x.grad.float()).all())}
