"""GEMM plans (``fp8sim.gemm.plans``) on hand-built records: the recorder stack, the distinct plans with their
call counts, the ``fp8sim explain`` table (its layout written out literally below) and the versioned JSON.
The integrations that add plans are tested in tests/test_explain.py; this file needs neither TE nor torch."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from fp8sim.gemm.plans import PLANS_FORMAT, GemmPlan, PlanRecorder, current_recorder, record_plans
from fp8sim.gemm.profiles import PROFILES

RTX = "rtx4060_cublaslt_12_8"
FC1 = GemmPlan("fc1", "", "fprop", 16, 64, 32, "e4m3", "e4m3", "tensorwise", "bfloat16", True, "ada_fast", RTX, 3,
               "pairwise", "table")  # fmt: skip
QK = GemmPlan("attn", "gemm0", "QK^T", 8, 8, 64, "e4m3", "e5m2", "e4m3 1x32 blocks", "float32", None, "exact", None,
              1, "none", "cudnn", batch=4)  # fmt: skip
WGRAD = GemmPlan("fc2", "", "wgrad", 100, 200, 3000, "e5m2", "e4m3", "tensorwise", "bfloat16", False, "ada_split",
                 RTX, None, "", "unknown", note="no verified split for this shape. Ways out: see below")  # fmt: skip

TABLE = """\
module        role       M    N     K  operands                        out       accumulator      split       from     calls
------------  -------  ---  ---  ----  ------------------------------  --------  ---------------  ----------  -------  -----
fc1           fprop     16   64    32  e4m3 x e4m3                     bfloat16  ada_fast fast    3 pairwise  table        2
attn (gemm0)  QK^T x4    8    8    64  e4m3 x e5m2 (e4m3 1x32 blocks)  float32   exact            1           cudnn        1
fc2           wgrad    100  200  3000  e5m2 x e4m3                     bfloat16  ada_split split  ?           unknown      1"""  # noqa: E501


def test_record_plans_nests_and_restores_the_current_recorder() -> None:
    assert current_recorder() is None
    with record_plans() as outer:
        assert current_recorder() is outer and outer.dry is False and outer.plans == []
        with record_plans(dry=1, namer=lambda m: f"<{m}>") as inner:
            assert current_recorder() is inner and inner.dry is True
            assert inner.name("lin") == "<lin>" and outer.name("lin") is None
        assert current_recorder() is outer
        with pytest.raises(KeyError), record_plans():
            raise KeyError("a failing region still pops its recorder")
        assert current_recorder() is outer
    assert current_recorder() is None


def test_unique_counts_repeats_in_first_seen_order_and_lists_the_unknown() -> None:
    rec = PlanRecorder()
    for p in (FC1, QK, FC1, WGRAD, FC1):
        rec.add(p)
    assert rec.plans == [FC1, QK, FC1, WGRAD, FC1]
    assert rec.unique() == [(FC1, 3), (QK, 1), (WGRAD, 1)]
    assert rec.unknown == [WGRAD]
    assert FC1.key() == tuple(asdict(FC1).values()) and FC1.key() != replace(FC1, note="x").key()


def test_table_is_one_row_per_distinct_plan_then_profiles_and_ways_out() -> None:
    rec = PlanRecorder()
    for p in (FC1, QK, FC1, WGRAD):
        rec.add(p)
    lines = rec.table().split("\n")
    assert "\n".join(lines[:5]) == TABLE
    assert lines[5:] == [
        "",
        f"profile {RTX}: {PROFILES[RTX].description}",
        "",
        "1 GEMM(s) with a split-K the profile does not know (split ?):",
        "  fc2 wgrad: no verified split for this shape",
        f"Ways out: accumulator=get_profile('{RTX}').with_splits({{(100, 200, 3000): (S, scheme)}}) with the splits "
        "your GPU used ((1, 'none'): unsplit), or an instruction preset (unsplit GEMMs)",
    ]
    assert str(rec) == rec.table()


def test_table_names_a_users_profile_and_joins_every_unknown_shape_once() -> None:
    mine = replace(WGRAD, profile="my_gpu", module="fc3")
    other = replace(mine, m=7, module="fc4")
    rec = PlanRecorder()
    for p in (mine, other, replace(mine, role="dgrad")):
        rec.add(p)
    text = rec.table()
    assert "\nprofile my_gpu: a user's DeviceProfile" in text
    assert "\n3 GEMM(s) with a split-K the profile does not know (split ?):" in text
    assert (
        "Ways out: accumulator=get_profile('my_gpu').with_splits({(100, 200, 3000): (S, scheme), "
        "(7, 200, 3000): (S, scheme)}) with" in text
    )
    assert "  fc4 wgrad: no verified split for this shape\n  fc3 dgrad: no verified" in text


def test_table_without_profiles_or_unknowns_has_no_trailer() -> None:
    rec = PlanRecorder()
    rec.add(QK)
    assert rec.table().split("\n") == [
        "module        role     M  N   K  operands                        out      accumulator  split  from   calls",
        "------------  -------  -  -  --  ------------------------------  -------  -----------  -----  -----  -----",
        "attn (gemm0)  QK^T x4  8  8  64  e4m3 x e5m2 (e4m3 1x32 blocks)  float32  exact        1      cudnn      1",
    ]


def test_json_carries_the_format_version_and_the_call_counts() -> None:
    rec = PlanRecorder()
    for p in (FC1, FC1, QK):
        rec.add(p)
    assert PLANS_FORMAT == "fp8sim-gemm-plans/1"
    data = json.loads(rec.to_json())
    assert data == rec.to_dict()
    assert data["format"] == PLANS_FORMAT
    assert [d["calls"] for d in data["plans"]] == [2, 1]
    assert data["plans"][0] == {**asdict(FC1), "calls": 2}
    assert rec.to_json() == json.dumps(data, indent=1)
