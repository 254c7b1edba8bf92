"""TE's weight initialisation inside the RNG tracker's fork (``module/base.py`` ``reset_parameters``).

A GEMM weight registered with ``get_rng_state_tracker`` is initialised under
``get_rng_state_tracker().fork(rng_tracker_name)`` (the module's ``rng_tracker_name`` if set, else the
tracker's default name), every other parameter from the current generator, as TE does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["set_init_tracker", "run_init"]


def set_init_tracker(module: Any, names: Iterable[str], get_rng_state_tracker: Callable | None) -> None:
    """Record ``get_rng_state_tracker`` for the parameters ``names`` (TE: ``register_parameter``'s kwarg)."""
    trackers = module.__dict__.setdefault("_init_trackers", {})
    for name in names:
        trackers[name] = get_rng_state_tracker


def run_init(module: Any, name: str, init_fn: Callable, param: Any) -> None:
    """``init_fn(param)``, inside the fork of parameter ``name``'s tracker if it has one."""
    tracker = module.__dict__.get("_init_trackers", {}).get(name)
    if tracker is None:
        init_fn(param)
        return
    tracker_name = getattr(module, "rng_tracker_name", None)
    with tracker().fork(tracker_name) if tracker_name else tracker().fork():
        init_fn(param)
