"""Shared by the accelerate tests: call-by-call outcomes, an in-process gloo world of one."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or (exception type, message); warnings are silenced (their tests check them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", fn()
        except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
            return type(exc).__name__, str(exc)


@contextmanager
def gloo_world_of_one() -> Iterator[None]:
    """A gloo process group of one rank in this process (``HashStore``), destroyed on exit."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
