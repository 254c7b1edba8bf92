"""Spawning gloo ranks for the multi-process tests: :func:`fp8sim.distributed.spawn.run_ranks` with
the test suite's limits (one thread per rank; a run that has not finished after 120 s fails: each run
takes a few seconds on 2 idle cores, the margin is for a machine shared with other work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fp8sim.distributed.spawn import RankFailure, run_ranks

__all__ = ["RankFailure", "ranks", "TIMEOUT_S"]

TIMEOUT_S = 120.0


def ranks(
    function: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = TIMEOUT_S,
    start_method: str = "spawn",
    preload: tuple[str, ...] = (),
) -> list[Any]:
    """``function(rank, world_size, *args)`` on ``world_size`` ranks; a hung or failing rank fails the test."""
    return run_ranks(function, args, world_size=world_size, timeout=timeout, start_method=start_method, preload=preload)
