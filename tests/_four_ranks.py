"""The one 4-rank spawn the default suite pays for: torchao's 1-D FSDP2 runs
(``test_distributed_torchao_fsdp._worker``) and the HSDP runs (``test_distributed_hsdp.hsdp_worker``)
share it, so 4 processes start (and import torch) once per test process instead of twice."""

from __future__ import annotations

import functools

from _dist import ranks

__all__ = ["four_ranks"]


def _worker(rank: int, world: int) -> dict:
    import test_distributed_hsdp
    import test_distributed_torchao_fsdp

    return {
        "torchao": test_distributed_torchao_fsdp._worker(rank, world),
        "hsdp": test_distributed_hsdp.hsdp_worker(rank, world),
    }


@functools.cache
def four_ranks() -> list[dict]:
    """Each rank's ``{"torchao": ..., "hsdp": ...}`` results, spawned once per process."""
    return ranks(_worker, world_size=4)
