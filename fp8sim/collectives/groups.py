"""Process-group presets for FP8 amax reduction, in Megatron-LM's rank layout.

Large frameworks number ranks with tensor parallelism fastest, then context, data and pipeline
parallelism (Megatron-LM's default order "tp-cp-ep-dp-pp", expert parallelism left out here)::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

and reduce FP8 amaxes over one of (Megatron ``parallel_state.get_amax_reduction_group``):

* ``"tp"``: the tensor-parallel group (``tp_only_amax_red=True``): the shards of one tensor;
* ``"tp_dp"``: tensor x data parallel (the default without context parallelism): every replica of
  the layer in this pipeline stage;
* ``"tp_dp_cp"``: tensor x data x context parallel (``with_context_parallel=True``).

A group that is too small (per-rank amaxes under tensor parallelism) gives the shards of one
tensor different scales; one that is too large only costs communication.  :func:`group_ranks`
is pure; :func:`new_group` creates the groups (every rank must call it, in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._util.args import as_int

__all__ = ["PRESETS", "ParallelLayout", "group_ranks", "new_group"]

PRESETS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "dp": ("dp",),
    "cp": ("cp",),
    "tp_cp": ("tp", "cp"),
    "tp_dp": ("tp", "dp"),
    "tp_dp_cp": ("tp", "cp", "dp"),
}
_ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of the parallel dimensions; their product is the world size."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in _ORDER:
            object.__setattr__(self, name, as_int(getattr(self, name), name, lo=1))

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (tp fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        out = {}
        for name in _ORDER:
            size = getattr(self, name)
            out[name], rank = rank % size, rank // size
        return out

    def rank(self, coords: dict[str, int]) -> int:
        r = 0
        for name in reversed(_ORDER):
            r = r * getattr(self, name) + coords[name]
        return r


def _dims(preset: str) -> tuple[str, ...]:
    if preset not in PRESETS:
        raise ValueError(f"unknown group preset {preset!r}; known: {', '.join(PRESETS)}")
    return PRESETS[preset]


def group_ranks(layout: ParallelLayout, preset: str) -> list[list[int]]:
    """Every group of ``preset`` as sorted rank lists (a partition of the world), lowest rank first."""
    dims = _dims(preset)
    groups: dict[tuple, list[int]] = {}
    for r in range(layout.world_size):
        c = layout.coords(r)
        key = tuple(c[n] for n in _ORDER if n not in dims)
        groups.setdefault(key, []).append(r)
    return sorted(groups.values())


def new_group(layout: ParallelLayout, preset: str, backend: str | None = None) -> Any:
    """This rank's group of ``preset`` (creating every group of the preset, as ``dist.new_group`` needs)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    if world != layout.world_size:
        raise ValueError(f"layout {layout} needs {layout.world_size} ranks, the default group has {world}")
    me, mine = dist.get_rank(), None
    for ranks in group_ranks(layout, preset):
        g = dist.new_group(ranks=ranks, backend=backend)
        if me in ranks:
            mine = g
    return mine
