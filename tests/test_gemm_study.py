"""``error_vs_k``'s documented defaults and setup record, and what its plot labels (cheap: one K of 16)."""

from __future__ import annotations

import numpy as np

from fp8sim.gemm.study import error_vs_k
from fp8sim.testing.oracles import require


def test_defaults_are_recorded_in_the_setup_and_the_operands_are_m_by_n() -> None:
    r = error_vs_k(ks=(16,), accumulators=("dequantized_fp32",))
    assert r.ks == [16] and r.accumulators == ["dequantized_fp32"]
    want = {"m": 64, "n": 64, "a_format": "e4m3", "b_format": "e4m3", "distribution": "positive", "seed": 0}
    assert r.setup == want
    # positive operands: no cancellation, so float32 accumulation of 16 exact products stays within 16 ulps
    assert 0 <= r.rel_error["dequantized_fp32"][0] < 16 * 2.0**-24
    assert np.isfinite(r.max_rel_error["dequantized_fp32"][0])


def test_the_plot_names_its_axes_and_the_setup() -> None:
    require("matplotlib")
    r = error_vs_k(ks=(16, 32), accumulators=("hopper_fast",), m=4, n=8, a_format="e5m2", distribution="normal")
    ax = r.plot().axes[0]
    assert ax.get_xlabel() == "K (reduction length)"
    assert ax.get_ylabel() == "relative error vs exact (Frobenius)"
    assert ax.get_title() == "e5m2 x e4m3, 4x8, normal"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["hopper_fast"]
