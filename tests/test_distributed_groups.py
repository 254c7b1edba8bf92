"""Amax-reduction group presets in Megatron-LM's rank layout (tp fastest, then cp, dp, pp;
``megatron/core/parallel_state.py``: ``order="tp-cp-ep-dp-pp"``, ``get_amax_reduction_group``).
Expected memberships are written out by hand for small layouts."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.collectives import PRESETS, ParallelLayout, group_ranks  # noqa: E402


def test_tp2_dp2_groups() -> None:
    layout = ParallelLayout(tp=2, dp=2)
    assert group_ranks(layout, "tp") == [[0, 1], [2, 3]]
    assert group_ranks(layout, "dp") == [[0, 2], [1, 3]]
    assert group_ranks(layout, "tp_dp") == [[0, 1, 2, 3]]


def test_tp2_cp2_dp2_groups() -> None:
    layout = ParallelLayout(tp=2, cp=2, dp=2)
    assert group_ranks(layout, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert group_ranks(layout, "cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert group_ranks(layout, "dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert group_ranks(layout, "tp_dp") == [[0, 1, 4, 5], [2, 3, 6, 7]]  # without cp: one per cp index
    assert group_ranks(layout, "tp_dp_cp") == [list(range(8))]


def test_pipeline_stages_never_share_an_amax_group() -> None:
    layout = ParallelLayout(tp=2, dp=2, pp=2)
    assert group_ranks(layout, "tp_dp_cp") == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_partitions_the_world(preset: str) -> None:
    layout = ParallelLayout(tp=2, cp=3, dp=2, pp=2)
    flat = sorted(r for g in group_ranks(layout, preset) for r in g)
    assert flat == list(range(layout.world_size))
    for r in range(layout.world_size):
        assert layout.rank(layout.coords(r)) == r


def test_bad_presets_and_sizes_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="unknown group preset 'tpdp'; known: tp, dp, cp"):
        group_ranks(ParallelLayout(), "tpdp")
    with pytest.raises(ValueError, match="tp must be an int >= 1, got 0"):
        ParallelLayout(tp=0)


def test_coords_accept_exactly_the_ranks_of_the_world() -> None:
    layout = ParallelLayout(tp=2, dp=2)
    assert [layout.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]  # tp fastest
    assert [layout.coords(r)["dp"] for r in range(4)] == [0, 0, 1, 1]
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=f"rank {bad} out of range for world size 4"):
            layout.coords(bad)


def _new_groups(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from fp8sim.collectives import new_group

    out: dict = {}
    layout = ParallelLayout(tp=2)
    for preset in ("tp", "dp"):
        g = new_group(layout, preset)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=g)
        out[preset] = (dist.get_process_group_ranks(g), t.item())
    errors = {}
    try:
        new_group(ParallelLayout(tp=4), "tp")
    except ValueError as exc:
        errors["layout"] = str(exc)
    try:  # torch's wheels never build MPI: the backend reaches dist.new_group only if it is passed on
        new_group(layout, "tp", backend="mpi")
    except RuntimeError as exc:
        errors["backend"] = str(exc)
    out["errors"] = errors
    return out


def test_new_group_gives_each_rank_its_own_group_of_the_preset() -> None:
    """Two gloo ranks, tp=2: "tp" is both ranks (the sum of rank + 1 is 3), "dp" each rank alone; a layout
    of another world size is refused before any group is made, and ``backend`` reaches ``dist.new_group``."""
    from _dist import ranks

    res = ranks(_new_groups, world_size=2)
    for rank, out in enumerate(res):
        assert out["tp"] == ([0, 1], 3.0)
        assert out["dp"] == ([rank], float(rank + 1))
        assert out["errors"]["layout"] == (
            "layout ParallelLayout(tp=4, cp=1, dp=1, pp=1) needs 4 ranks, the default group has 2"
        )
        assert "MPI" in out["errors"]["backend"]
