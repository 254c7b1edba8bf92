"""Multi-process CPU runs driven by :class:`InitProcessGroupKwargs`, as accelerate's MULTI_CPU state sets them up.

:func:`init_process_group` initialises ``torch.distributed`` with the handler's ``to_kwargs()``
(backend: gloo, or MPI when asked for and built in; accelerate's message when another backend is
asked for).  :func:`cpu_launcher` runs ``function(*args)`` in ``num_processes`` spawned processes
with a ``file://`` rendezvous in a temporary directory and returns each rank's result.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from .handlers import InitProcessGroupKwargs

__all__ = ["init_process_group", "cpu_launcher"]


def init_process_group(rank: int, world_size: int, init_handler: InitProcessGroupKwargs | None = None) -> str:
    """Initialise the default CPU process group of ``world_size`` processes; returns the backend used.

    ``init_handler.to_kwargs()`` is forwarded (init_method, timeout); a non-default backend other
    than the CPU one raises accelerate's ``ValueError("Your assigned backend ... is not available, please use ...")``.
    Without an ``init_method``, torch's ``env://`` applies (MASTER_ADDR / MASTER_PORT).
    """
    import torch.distributed as dist

    kwargs = init_handler.to_kwargs() if init_handler is not None else {}
    requested = kwargs.pop("backend", None)
    backend = "mpi" if requested in (None, "mpi") and dist.is_mpi_available() else "gloo"
    if requested is not None and backend != requested:
        raise ValueError(f"Your assigned backend {requested} is not available, please use {backend}")
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    return backend


def _entry(
    rank: int, world_size: int, handler: InitProcessGroupKwargs, function: Callable, args: tuple, out_dir: str
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    for key, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", rank)):
        os.environ[key] = str(value)
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    init_process_group(rank, world_size, handler)
    try:
        result = function(*args)
        torch.save(result, os.path.join(out_dir, f"result_{rank}.pt"))
        dist.barrier()  # no rank tears down its gloo pairs while a peer still uses them
    finally:
        dist.destroy_process_group()
    # leave without the interpreter's teardown of torch's threads, which can abort a gloo rank with
    # "terminate called without an active exception" (pytorch/pytorch#190489)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cpu_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    num_processes: int = 2,
    init_handler: InitProcessGroupKwargs | None = None,
) -> list[Any]:
    """Run ``function(*args)`` on ``num_processes`` CPU ranks and return their results, rank order.

    ``function`` must be picklable (defined at module level); each rank uses one thread and an
    initialised process group (``init_handler``, default ``InitProcessGroupKwargs(backend="gloo")``;
    without an ``init_method`` a ``file://`` store in a temporary directory).  Results travel by
    ``torch.save``; an exception in a rank is raised here.
    """
    import torch
    import torch.multiprocessing as mp

    handler = init_handler if init_handler is not None else InitProcessGroupKwargs(backend="gloo")
    with tempfile.TemporaryDirectory(prefix="fp8sim_launch_") as tmp:
        if handler.init_method is None:
            handler = dataclasses.replace(handler, init_method=f"file://{os.path.join(tmp, 'rendezvous')}")
        mp.spawn(_entry, args=(num_processes, handler, function, args, tmp), nprocs=num_processes, join=True)
        return [torch.load(os.path.join(tmp, f"result_{r}.pt"), weights_only=False) for r in range(num_processes)]
