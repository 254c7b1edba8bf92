"""``fp8sim study --distributed``: the three experiments on 2 gloo ranks, 1 step (the test is about the claims).

Each claim of the study is checked against what the arithmetic says must happen: the float8
all-gather casts the float32 master once, so the bf16 all-gather (two roundings) differs on some
codes; with ``reduce_amax=True`` the ranks' scales agree, without it they do not (the batches
differ in range); amaxes reduced over the tensor-parallel group reproduce the one-process FP8
output exactly, per-shard amaxes do not.
"""

from __future__ import annotations

import json

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
dist = require("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from fp8sim.cli import main  # noqa: E402


def test_study_distributed_writes_a_versioned_report_with_the_expected_effects(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "study"
    assert main(["study", "--distributed", "--steps", "1", "--out", str(out)]) == 0
    data = json.loads((out / "distributed.json").read_text())
    assert data["format_version"] == 1 and data["world_size"] == 2 and data["steps"] == 1
    ag, am, wg = data["all_gather"], data["amax"], data["wrong_group"]
    assert all(0 < s < 0.5 for s in ag["double_rounded_share"])
    assert ag["loss_fp8"] != ag["loss_bf16"]
    assert am["spread_reduced"] == [0.0] and all(s > 0 for s in am["spread_per_rank"])
    assert wg["scale_spread_right"] == [0.0] and all(s > 0 for s in wg["scale_spread_wrong"])
    assert wg["output_mismatch_right"] == [0.0] and all(m > 0 for m in wg["output_mismatch_wrong"])
    assert "| step | loss fp8 AG" in (out / "distributed.md").read_text()
    assert main(["study", "--distributed", "--steps", "1", "--out", str(out)]) == 2  # kept without --force
    assert "pass --force" in capsys.readouterr().err


def test_study_distributed_rejects_a_bad_world_size(tmp_path, capsys) -> None:  # noqa: ANN001
    assert main(["study", "--distributed", "--world-size", "9", "--out", str(tmp_path)]) == 2
    assert "world_size must be 2, 3 or 4, got 9" in capsys.readouterr().err
