"""The ``fp8sim explain`` table's layout edge cases (tests/test_gemm_plans.py has the common table): an
unnamed module keeps its blank first column, and a batch of two already shows as "x2"."""

from __future__ import annotations

from dataclasses import replace

from fp8sim.gemm.plans import GemmPlan, PlanRecorder

QK = GemmPlan("", "", "QK^T", 8, 8, 64, "e4m3", "e4m3", "tensorwise", "float32", None, "exact", None, 1, "none",
              "cudnn", batch=2)  # fmt: skip


def test_an_unnamed_module_and_a_batch_of_two() -> None:
    rec = PlanRecorder()
    rec.add(replace(QK, module="attn.core", batch=1))
    rec.add(QK)
    lines = rec.table().split("\n")
    assert lines[2] == "attn.core  QK^T     8  8  64  e4m3 x e4m3  float32  exact        1      cudnn      1"
    assert lines[3] == "           QK^T x2  8  8  64  e4m3 x e4m3  float32  exact        1      cudnn      1"
