"""Multi-process runs fail in bounded time and name the rank at fault (issue 16, reliability).

:func:`fp8sim.collectives.spawn.run_ranks` (through ``tests/_dist.py``) is checked on ranks that
raise mid-step while the peer waits in a collective, die without raising (``os._exit``), or hang;
and the two-rank gloo amax-reduction run (the scenario of ``tests/test_pytorch_modules.py``) is
repeated 20 times: every run must end cleanly, both ranks holding the same scales.  That run
aborted 3 times in 68 with "terminate called without an active exception" when ranks left with
live gloo threads (no barrier before ``destroy_process_group`` and interpreter teardown of torch's
threads, pytorch/pytorch#190489); ``run_ranks`` and ``fp8sim.accelerate.cpu_launcher`` now pass a
barrier, destroy the group and leave without that teardown.

Reproduced (issue 16, this session): two gloo ranks that make a second group with
``dist.new_group``, MAX-all-reduce on both groups and leave through the interpreter's normal exit
without ``destroy_process_group`` aborted with SIGABRT and that message in 2 of 42 runs; with
``destroy_process_group`` before the exit (with or without a barrier) 0 of 30 did.  The default
test below repeats exactly that collective pattern (world group plus a ``new_group``) 20 times
through ``run_ranks``; at that rate (about 1 in 20) it catches a spawn that leaves without
destroying its groups in about 3 of 5 sessions: a probabilistic regression test, not a
deterministic one.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from _dist import RankFailure, ranks  # noqa: E402

from fp8sim.collectives.spawn import run_ranks  # noqa: E402

BOUND_S = 30.0  # a failure must be reported well before the 120 s hang deadline


def _raises_mid_step(rank: int, world: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)  # step 1 completes on both ranks
    if rank == 1:
        raise ValueError("rank 1 broke in step 2")
    dist.all_reduce(t)  # rank 0 waits here for a peer that is gone


def _dies_mid_step(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        os._exit(1)  # the exit code of a rank that raised, but without an error report
    dist.all_reduce(torch.ones(4))


def _one_raises_one_dies(rank: int, world: int) -> None:
    dist.barrier()
    if rank == 1:
        os._exit(3)
    raise ValueError("rank 0's own error")


def _hangs(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(3600)
    dist.barrier()


def test_a_rank_that_raises_mid_step_is_named_and_the_others_stop() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"^rank 1 raised:(.|\n)*ValueError: rank 1 broke in step 2") as info:
        ranks(_raises_mid_step)
    assert info.value.ranks[0] == 1 and len(set(info.value.ranks)) == len(info.value.ranks)
    assert time.monotonic() - start < BOUND_S


def test_a_rank_that_dies_is_named_with_its_exit_code() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"^rank 0 died with exit code 1 without raising$") as info:
        ranks(_dies_mid_step)
    assert info.value.ranks[0] == 0 and len(set(info.value.ranks)) == len(info.value.ranks)
    assert time.monotonic() - start < BOUND_S


def test_a_rank_that_raised_is_named_before_one_that_died() -> None:
    with pytest.raises(RankFailure, match=r"^rank 0 raised:(.|\n)*ValueError: rank 0's own error"):
        ranks(_one_raises_one_dies)


def test_a_hung_rank_fails_at_the_deadline() -> None:
    with pytest.raises(RankFailure, match=r"did not finish within 5.0 s") as info:
        ranks(_hangs, timeout=5.0)
    assert 1 in info.value.ranks


_SET_IN_THE_PARENT = False  # a rank that imports this module afresh (spawn, forkserver) sees False


def _describe(rank: int, world: int) -> tuple:
    env = tuple(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    gloo = dist.group.WORLD._get_backend(torch.device("cpu"))  # the process group's own timeout, where exposed
    timeout = getattr(getattr(gloo, "options", None), "_timeout", None)
    return (
        rank,
        world,
        torch.get_num_threads(),
        multiprocessing.current_process().daemon,
        _SET_IN_THE_PARENT,
        env,
        dist.get_backend(),
        None if timeout is None else timeout.total_seconds(),
    )


def _pg_timeout(seconds: float) -> float | None:
    """What ``_describe`` reports for the process group's timeout on this torch (None: not exposed)."""
    opts = getattr(getattr(torch.distributed, "ProcessGroupGloo", None), "Options", None)
    return seconds if opts is not None and hasattr(opts, "_timeout") else None


def _folder_on_another_filesystem() -> str | None:
    """A new folder on another filesystem than the temporary folder's (/dev/shm where it is one), or None."""
    base = "/dev/shm"
    if not (os.path.isdir(base) and os.access(base, os.W_OK)):
        return None
    if os.stat(base).st_dev == os.stat(tempfile.gettempdir()).st_dev:
        return None
    return tempfile.mkdtemp(prefix="fp8sim_cwd_", dir=base)


def test_run_ranks_defaults_two_fresh_daemonic_single_threaded_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented defaults: 2 ranks, one torch thread each, started by "spawn" (a fresh interpreter: a
    forked rank would see the parent's change to this module); daemonic, so no rank outlives the test; a gloo
    process group with the run's timeout (60 s) and torchrun's environment variables.  Run from a working
    folder on another filesystem than the temporary one where there is one: the ranks' results stay inside the
    run's temporary folder (a move across filesystems would fail)."""
    monkeypatch.setattr(sys.modules[__name__], "_SET_IN_THE_PARENT", True)
    other = _folder_on_another_filesystem()
    if other is not None:
        monkeypatch.chdir(other)
    t = _pg_timeout(60.0)
    try:
        assert run_ranks(_describe) == [
            (0, 2, 1, True, False, ("0", "2", "0", "2"), "gloo", t),
            (1, 2, 1, True, False, ("1", "2", "1", "2"), "gloo", t),
        ]
        assert other is None or os.listdir(other) == []
    finally:
        if other is not None:
            shutil.rmtree(other, ignore_errors=True)


def test_run_ranks_forkserver_runs_a_world_of_one() -> None:
    got = run_ranks(_describe, world_size=1, start_method="forkserver", threads=2, timeout=42.0)
    assert got == [(0, 1, 2, True, False, ("0", "1", "0", "1"), "gloo", _pg_timeout(42.0))]


def _three_errors(rank: int, world: int) -> None:
    """After a barrier: rank 2 raises an error worded like a lost peer's, rank 1 its own 0.3 s later, rank 0
    its own 0.6 s later (all within the parent's 2 s grace)."""
    dist.barrier()
    if rank == 2:
        raise RuntimeError("Connection reset by peer (worded as gloo words a lost peer)")
    time.sleep(0.3 * (2 - rank))
    raise ValueError(f"rank {rank}'s own error")


def test_the_cause_is_the_earliest_own_error_not_a_peer_loss() -> None:
    """``run_ranks``: the rank named is the first whose error is its own, not a collective failing because a
    peer left (even an earlier one); every rank that raised is listed once, the cause first."""
    with pytest.raises(RankFailure) as info:
        ranks(_three_errors, world_size=3)
    assert str(info.value).startswith("rank 1 raised:\nTraceback"), str(info.value)[:200]
    assert "ValueError: rank 1's own error" in str(info.value)
    assert info.value.ranks == [1, 0, 2]


def test_run_ranks_arguments_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        run_ranks(_describe, world_size=0)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=f"timeout must be positive seconds, got {bad!r}"):
            run_ranks(_describe, timeout=bad)
    # a timeout of 1 s is valid: the start method is what this call gets wrong
    with pytest.raises(ValueError, match="start_method must be 'spawn' or 'forkserver', got 'fork'"):
        run_ranks(_describe, timeout=1.0, start_method="fork")


def _amax_run(rank: int, world: int) -> np.ndarray:
    """Two DelayedScaling steps of one te.Linear with amaxes MAX-reduced over the world group."""
    import fp8sim.pytorch as te
    from fp8sim.recipe import DelayedScaling

    torch.manual_seed(0)
    m = te.Linear(16, 16, bias=False)
    scales = []
    for step in range(2):
        x = (torch.rand(16, 16, generator=torch.Generator().manual_seed(10 * step + rank)) - 0.5) * (2 + 4 * rank)
        with te.autocast(recipe=DelayedScaling(amax_history_len=2), amax_reduction_group=dist.group.WORLD):
            y = m(x.requires_grad_())
        y.backward(torch.ones_like(y) * (1 + rank))
        st = m.fp8_gemms["gemm"]
        scales.append(np.concatenate([st.fwd.scale, st.bwd.scale]))
    return np.stack(scales)


_PRELOAD = ("numpy", "pytest", "fp8sim.pytorch", "fp8sim.recipe", "test_distributed_reliability")


def _amax_lifecycle(rank: int, world: int) -> np.ndarray:
    """The collective pattern of the amax run without the FP8 arithmetic: MAX-reductions of float32
    amax rows through fp8sim's delayed-scaling reduction, on the world group and a second gloo group."""
    from fp8sim.scaling.delayed import _all_reduce_max

    group = dist.new_group(backend="gloo")
    rows = [_all_reduce_max(np.full(3, rank + step, np.float32), g) for step in range(3) for g in (None, group)]
    return np.stack(rows)


def test_the_two_rank_amax_lifecycle_ends_cleanly_20_times_in_a_row() -> None:
    want = np.stack([np.full(3, 1 + step, np.float32) for step in range(3) for _ in range(2)])
    for i in range(20):
        # forkserver: torch, fp8sim and this module are imported once, not in every rank of every run
        r0, r1 = ranks(_amax_lifecycle, start_method="forkserver", preload=_PRELOAD)
        assert np.array_equal(r0, want) and np.array_equal(r1, want), f"run {i}"


@pytest.mark.slow
def test_the_two_rank_amax_run_ends_cleanly_20_times_in_a_row() -> None:
    """The full te.Linear run 20 times (each rank probes fp8sim's casts once: seconds per run)."""
    for i in range(20):
        r0, r1 = ranks(_amax_run, start_method="forkserver", preload=_PRELOAD)
        assert np.array_equal(r0, r1), f"run {i}: the ranks hold different scales"
