"""TE's activation-recompute stash of delayed-scaling forward state (``quantization.py:785-845``).

A checkpointed forward stashes clones of ``fp8_meta["scaling_fwd"]``'s ``amax_history`` and
``scale`` in a FIFO of the global recompute buffer (its index in
``fp8_meta["global_fp8_buffer_pos_fwd_recompute"]``); the recompute keeps the current state aside,
loads the oldest stash in place, and restores the kept state afterwards.  Other recipes: no-ops.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..recipe import DelayedScaling

__all__ = ["RECOMPUTE_KEY", "stash", "load_stash", "restore"]
RECOMPUTE_KEY = "global_fp8_buffer_pos_fwd_recompute"


def _delayed(fp8_meta: dict[str, Any]) -> bool:
    """TE ``_has_delayed_scaling_state``: the ``fp8_meta`` recipe is delayed scaling."""
    return isinstance(fp8_meta.get("recipe"), DelayedScaling) and "scaling_fwd" in fp8_meta


def stash(fp8_meta: dict[str, Any], buffer: list) -> None:
    if not _delayed(fp8_meta):
        return
    fwd = fp8_meta["scaling_fwd"]
    if RECOMPUTE_KEY not in fp8_meta:
        buffer.append(deque())
        fp8_meta[RECOMPUTE_KEY] = len(buffer) - 1
    buffer[fp8_meta[RECOMPUTE_KEY]].append([fwd.amax_history.clone(), fwd.scale.clone()])


def load_stash(fp8_meta: dict[str, Any], buffer: list) -> None:
    if not _delayed(fp8_meta):
        return
    fwd = fp8_meta["scaling_fwd"]
    fp8_meta["updated_amax_history_fwd"] = fwd.amax_history.clone()
    fp8_meta["updated_scale_fwd"] = fwd.scale.clone()
    hist, scale = buffer[fp8_meta[RECOMPUTE_KEY]].popleft()
    fwd.amax_history.copy_(hist)
    fwd.scale.copy_(scale)


def restore(fp8_meta: dict[str, Any]) -> None:
    if not _delayed(fp8_meta):
        return
    fp8_meta["scaling_fwd"].amax_history.copy_(fp8_meta["updated_amax_history_fwd"])
    fp8_meta["scaling_fwd"].scale.copy_(fp8_meta["updated_scale_fwd"])
