"""The suite regenerates its inputs from names and seeds, so a capture stores outputs only: the committed
CPU capture (``reports/captures/cpu-torch2.13.fp8cap``, recorded by torch 2.13 and torchao 0.18 on an
x86-64 CPU) must still compare bit-exact, which pins every input it recorded; and ``f32_wide`` (not in
that capture) holds the points its docstring lists, built here from ml_dtypes' grids."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from fp8sim.native.compare import compare_capture
from fp8sim.native.suite import input_set
from fp8sim.testing.oracles import require

COMMITTED = Path(__file__).resolve().parents[1] / "reports" / "captures" / "cpu-torch2.13.fp8cap"


def test_the_committed_capture_still_compares_bit_exact() -> None:
    # casts of every input set and torchao's quantizers (its input): numpy and ml_dtypes alone reproduce them
    res = compare_capture(COMMITTED, infer="none", ops=["cast/e4m3/*", "cast/e5m2/*", "torchao/*"])
    assert res.meta["torch"] == "2.13.0+cpu" and res.meta["torchao"] == "0.18.0"
    kinds = [o.kind for o in res.ops]
    assert (kinds.count("cast"), kinds.count("torchao_float8")) == (6, 8)
    assert all(o.skipped is None and o.bit_exact == o.n > 0 for o in res.ops), [(o.name, o.rate) for o in res.ops]


def test_the_committed_capture_gemms_still_compare_bit_exact_with_torch() -> None:
    """The tensorwise GEMMs of K = 32 (their scales): the fallback's float32 matmul is torch's (its BLAS order);
    without torch fp8sim sums in numpy's order (``gemm/scaled_mm.py`` ``_matmul_f32``), which is not the
    capture's.  The capture was recorded on an AVX2 host (no AVX-512, no AMX: its meta); that this host's torch
    float32 matmul sums K = 32 in the same order on an AVX-512 CPU is assumed, not yet measured there."""
    require("torch")
    res = compare_capture(COMMITTED, infer="none", ops=["scaled_mm/*/tensorwise/*/*/64x64x32"])
    assert [o.kind for o in res.ops].count("scaled_mm") == 8
    assert all(o.skipped is None and o.bit_exact == o.n > 0 for o in res.ops), [(o.name, o.rate) for o in res.ops]


def _grid_and_ties(dt: type, top: int) -> np.ndarray:
    """Every 13th positive finite value of a 16-bit format and the midpoint above each (float32)."""
    codes = np.arange(0, top, 13, dtype=np.uint16)
    v = codes.view(dt).astype(np.float64)
    nxt = (codes + 1).view(dt).astype(np.float64)
    mids = (v + nxt) / 2
    return np.concatenate([v, mids[np.isfinite(mids)]]).astype(np.float32)


def test_f32_wide_holds_grid_points_ties_and_their_float32_neighbours_of_both_signs() -> None:
    x = input_set("f32_wide")
    have = set(x.view(np.uint32).tolist())
    for dt, top in ((ml_dtypes.bfloat16, 0x7F80), (np.float16, 0x7C00)):
        pts = _grid_and_ties(dt, top)
        up = np.nextafter(pts, np.float32(np.inf))
        down = np.nextafter(pts, np.float32(0))
        for p in (pts, up, down):
            for s in (p, -p):
                assert set(s.view(np.uint32).tolist()) <= have
    for special in (0.0, -0.0, np.inf, -np.inf):
        assert np.float32(special).view(np.uint32) in have
    assert np.isnan(x).any()


def test_a_cpu_capture_compared_without_torch_says_its_gemms_are_not_torchs_order(monkeypatch) -> None:  # noqa: ANN001
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    res = compare_capture(COMMITTED, infer="none", ops=["scaled_mm/e4m3xe4m3/tensorwise/fast/float32/64x64x32"])
    assert any(n.startswith("torch is not installed here: the fallback's float32 matmul") for n in res.notes)
