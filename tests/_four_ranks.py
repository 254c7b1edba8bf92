"""The one 4-rank spawn the default suite pays for: torchao's 1-D FSDP2 runs
(``test_distributed_torchao_fsdp._worker``) and the HSDP runs (``test_distributed_hsdp.hsdp_worker``)
share it, so 4 processes start (and import torch) once per test process instead of twice."""

from __future__ import annotations

import functools

from _dist import ranks

__all__ = ["four_ranks", "part"]


def _worker(rank: int, world: int) -> dict:
    """Both parts' results; a part that raises (the same on every rank, as every rank runs the same code)
    leaves its traceback, so the other part's tests still report their own results."""
    import traceback

    import test_distributed_hsdp
    import test_distributed_torchao_fsdp

    out: dict = {}
    for key, fn in (("torchao", test_distributed_torchao_fsdp._worker), ("hsdp", test_distributed_hsdp.hsdp_worker)):
        try:
            out[key] = fn(rank, world)
        except Exception:  # noqa: BLE001 - reported by part() in the parent
            out[key] = _Failed(f"rank {rank}, the {key} part raised:\n{traceback.format_exc()}")
    return out


class _Failed(str):
    """A part's traceback in place of its results."""


@functools.cache
def four_ranks() -> list[dict]:
    """Each rank's ``{"torchao": ..., "hsdp": ...}`` results, spawned once per process."""
    return ranks(_worker, world_size=4)


def part(key: str) -> list:
    """Every rank's results of one part; the test fails with the rank's traceback if that part raised."""
    import pytest

    got = [r[key] for r in four_ranks()]
    for res in got:
        if isinstance(res, _Failed):
            pytest.fail(str(res), pytrace=False)
    return got
