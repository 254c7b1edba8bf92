"""Run a function on N local CPU ranks with a deadline; a rank that raises, dies or hangs is named.

:func:`run_ranks` starts ``world_size`` processes (``spawn``), each with a gloo process group on a
``file://`` store and ``function(rank, world_size, *args)``.  It returns the results in rank order
or raises :class:`RankFailure`: the first rank that raised (its traceback), died (its exit code)
or, past ``timeout`` seconds, every rank still running.  The surviving ranks are then stopped, so a
failure never leaves a rank waiting in a collective.  Each rank's process group has the same
``timeout``, so a collective whose peer is gone also fails inside the rank.

A finished rank waits at a barrier, destroys its process group and leaves with ``os._exit``: a
rank whose gloo threads are torn down by the interpreter's exit while a peer still talks to it can
abort with "terminate called without an active exception".
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .._util.args import as_int

__all__ = ["RankFailure", "run_ranks"]

_POLL_S = 0.02
_GRACE_S = 2.0  # how long the other ranks get to report their own error once one has failed


class RankFailure(RuntimeError):
    """A rank raised, died or did not finish in time; ``ranks`` lists the ranks at fault."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def _entry(rank: int, world: int, tmp: str, function: Callable, args: tuple, timeout: float, threads: int) -> None:
    import torch
    import torch.distributed as dist

    code = 0
    try:
        torch.set_num_threads(threads)
        for key, value in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", rank), ("LOCAL_WORLD_SIZE", world)):
            os.environ[key] = str(value)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{os.path.join(tmp, 'store')}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
        )
        result = function(rank, world, *args)
        part = os.path.join(tmp, f"result_{rank}.part")
        torch.save(result, part)
        os.replace(part, os.path.join(tmp, f"result_{rank}.pt"))
        dist.barrier()  # nobody tears down its gloo pairs while a peer still uses them
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent, which names this rank
        with open(os.path.join(tmp, f"error_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown of torch's threads (module docstring)


def run_ranks(
    function: Callable[..., Any],
    args: tuple = (),
    world_size: int = 2,
    timeout: float = 60.0,
    threads: int = 1,
    start_method: str = "spawn",
    preload: tuple[str, ...] = (),
) -> list[Any]:
    """``function(rank, world_size, *args)`` on ``world_size`` gloo ranks; results in rank order.

    ``function`` must be picklable (module level).  Raises :class:`RankFailure` naming the rank
    that raised or died, or the ranks still running after ``timeout`` seconds.  ``start_method``:
    "spawn" (default, everywhere), or "forkserver" (POSIX), whose server imports torch and the
    ``preload`` modules once, so that repeated runs start in a fraction of the time.
    """
    import multiprocessing as mp

    import torch

    world_size = as_int(world_size, "world_size", lo=1)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "fp8sim.collectives.spawn", *preload])
    with tempfile.TemporaryDirectory(prefix="fp8sim_ranks_") as tmp:
        procs = [
            ctx.Process(target=_entry, args=(r, world_size, tmp, function, args, timeout, threads), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            failed = _wait(procs, time.monotonic() + timeout)
            if failed is not None:
                raise _failure(failed, procs, tmp, timeout)
            return [torch.load(os.path.join(tmp, f"result_{r}.pt"), weights_only=False) for r in range(world_size)]
        finally:
            _stop(procs)


def _wait(procs: list, deadline: float) -> list[int] | None:
    """None when every rank exited 0, else the ranks at fault (failed ones, or the unfinished at the deadline)."""
    while True:
        codes = [p.exitcode for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            grace = time.monotonic() + _GRACE_S  # let a rank that raised first report before its peers time out
            while time.monotonic() < grace and any(p.exitcode is None for p in procs):
                time.sleep(_POLL_S)
            return [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            return [r for r, c in enumerate(codes) if c is None]
        time.sleep(_POLL_S)


def _failure(ranks: list[int], procs: list, tmp: str, timeout: float) -> RankFailure:
    errors, when = {}, {}
    for r in ranks:
        path = os.path.join(tmp, f"error_{r}.txt")
        if os.path.exists(path):
            with open(path) as f:
                errors[r] = f.read()
            when[r] = os.stat(path).st_mtime_ns
    died = [r for r in ranks if r not in errors and procs[r].exitcode not in (None, 0)]
    own = [r for r in errors if not _is_peer_loss(errors[r])]
    if own or (errors and not died):
        # the cause: a rank whose error is not a collective failing because a peer left; then the earliest
        first = min(errors, key=lambda r: (_is_peer_loss(errors[r]), when[r], r))
        msg = f"rank {first} raised:\n{errors[first]}"
        return RankFailure(msg, [first] + [r for r in errors if r != first])
    if died:
        r = died[0]
        return RankFailure(f"rank {r} died with exit code {procs[r].exitcode} without raising", died + list(errors))
    return RankFailure(f"ranks {ranks} did not finish within {timeout} s (hung?)", ranks)


_PEER_LOSS = ("gloo/transport", "Connection reset by peer", "Connection closed by peer", "Timed out", "timed out")


def _is_peer_loss(error: str) -> bool:
    """True for the error a collective raises when its peer has gone (not the peer's own error)."""
    return any(marker in error for marker in _PEER_LOSS)


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
