"""FP8 across processes on ``torch.distributed`` (any backend, gloo included): the collectives room,
below the integrations (``fp8sim.pytorch``, ``fp8sim.torchao`` and the studies use it).

:mod:`.wire` moves float8 and packed FP4 payloads as bytes and reduces float8 in fp8sim;
:mod:`.groups` builds the amax-reduction groups large frameworks use; :mod:`.spawn` runs a
function on N local CPU ranks with a deadline, naming the rank that failed.  Needs torch.
"""

from __future__ import annotations

try:
    import torch.distributed  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("fp8sim.collectives needs torch with torch.distributed (pip install torch)") from exc

from .groups import PRESETS, ParallelLayout, group_ranks, new_group
from .wire import (
    BYTE_DTYPES,
    all_gather,
    all_gather_into_tensor,
    all_gather_uneven,
    all_reduce,
    broadcast,
    reduce_scatter_tensor,
    wire_view,
)

__all__ = [
    "BYTE_DTYPES",
    "wire_view",
    "all_gather_into_tensor",
    "all_gather",
    "all_gather_uneven",
    "broadcast",
    "reduce_scatter_tensor",
    "all_reduce",
    "PRESETS",
    "ParallelLayout",
    "group_ranks",
    "new_group",
]
