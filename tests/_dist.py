"""Spawning gloo ranks for the multi-process tests: :func:`fp8sim.collectives.spawn.run_ranks` with
the test suite's limits (one thread per rank; a run that has not finished after 120 s fails: each run
takes a few seconds on 2 idle cores, the margin is for a machine shared with other work).  A run that
hangs fails with each rank's Python stacks, dumped by ``faulthandler`` just before the deadline, so
the failure says which collective each rank waits in."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fp8sim.collectives.spawn import RankFailure, run_ranks

__all__ = ["RankFailure", "ranks", "TIMEOUT_S"]

TIMEOUT_S = 120.0


def _dumping_stacks(rank: int, world: int, function: Callable, folder: str, dump_at: float, *args: Any) -> Any:
    """``function(rank, world, *args)`` with every thread's stack written to ``folder`` at ``dump_at``
    (``time.time()``), unless it returns first."""
    import faulthandler

    with open(os.path.join(folder, f"stacks_{rank}.txt"), "w") as f:
        if dump_at - time.time() > 0:
            faulthandler.dump_traceback_later(dump_at - time.time(), file=f)
        try:
            return function(rank, world, *args)
        finally:
            faulthandler.cancel_dump_traceback_later()


def ranks(
    function: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = TIMEOUT_S,
    start_method: str = "spawn",
    preload: tuple[str, ...] = (),
) -> list[Any]:
    """``function(rank, world_size, *args)`` on ``world_size`` ranks; a hung or failing rank fails the test."""
    with tempfile.TemporaryDirectory(prefix="fp8sim_stacks_") as folder:
        dump_at = time.time() + timeout - min(5.0, timeout / 5)  # before the deadline stops the ranks
        try:
            return run_ranks(
                _dumping_stacks,
                (function, folder, dump_at, *args),
                world_size=world_size,
                timeout=timeout,
                start_method=start_method,
                preload=preload,
            )
        except RankFailure as e:
            if "did not finish" not in str(e):
                raise
            stacks = []
            for r in e.ranks:
                path = Path(folder, f"stacks_{r}.txt")
                text = path.read_text().strip() if path.exists() else ""
                stacks.append(f"--- rank {r} ---\n{text or '(no stack dumped)'}")
            raise RankFailure(f"{e}\n" + "\n".join(stacks), e.ranks) from e
