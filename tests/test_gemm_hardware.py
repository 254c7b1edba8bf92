"""Instruction models against real-GPU measurements (``tests/data/hardware/``, Khattak & Mikaitis,
ACM TACO 2026, ``north-numerical-computing/MATLAB-tensor-core`` commit b12b5a7 ``model_validation/``)
and the Blackwell ``mma.sync`` rounding on constructed ties (exact-rational oracle)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fp8sim.gemm import dot_add, scaled_mm
from fp8sim.native.hardware import hardware_agreement, hardware_section

DATA = Path(__file__).parent / "data" / "hardware"
E4 = ml_dtypes.float8_e4m3fn


def _set(gpu: str) -> dict:
    z = np.load(DATA / f"{gpu}_E4M3.npz")
    return {k: z[k] for k in z.files}


def _codes(v: np.ndarray) -> np.ndarray:
    c = np.asarray(v, np.float32).astype(E4)
    assert np.array_equal(c.astype(np.float32), np.asarray(v, np.float32)), "value not representable in E4M3"
    return c.view(np.uint8)


def _first_diff(got: np.ndarray, want: np.ndarray) -> str:
    i = int(np.argmax(got != want))
    return f"case {i}: got {got[i]:#010x}, GPU {want[i]:#010x}"


@pytest.mark.parametrize(
    ("gpu", "model", "use_c"),
    [("B200", "blackwell_mma", True), ("H100", "hopper_wgmma", False), ("L40S", "ada_mma", True)],
)
def test_instruction_model_reproduces_every_measured_float32_output(gpu: str, model: str, use_c: bool) -> None:
    """B200 legacy mma.sync: exact sum rounded once (nearest even); H100 measured with c = 0."""
    z = _set(gpu)
    c = z["c"] if use_c else np.zeros_like(z["c"])
    got = dot_add(_codes(z["a"]), _codes(z["b"]), c, model=model).view(np.uint32)
    assert np.array_equal(got, z["d32"]), _first_diff(got, z["d32"])


def test_tcgen05_model_is_not_the_b200_mma_sync() -> None:
    z = _set("B200")
    got = dot_add(_codes(z["a"]), _codes(z["b"]), z["c"], model="blackwell_tcgen05").view(np.uint32)
    assert (got == z["d32"]).sum() == 3207


def _f32_rne(x: Fraction) -> np.float32:
    """Nearest-even float32 of an exact rational (normal range), independent of fp8sim."""
    w = np.float32(float(x))  # within one ulp
    cands = [np.nextafter(w, np.float32(-np.inf)), w, np.nextafter(w, np.float32(np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - x), int(np.array(v).view(np.uint32)) & 1))


# (c, products as (a, b) E4M3 value pairs): exact ties and ties broken by a sticky product
TIES = [
    (64.0, [(2.0**-9, 2.0**-9)]),  # 64 + 2^-18: half an ulp, even -> 64
    (64.0 + 2.0**-17, [(2.0**-9, 2.0**-9)]),  # odd + half -> up
    (-(64.0 + 2.0**-17), [(-(2.0**-9), 2.0**-9)]),  # the same, negative
    (1024.0, [(2.0**-7, 2.0**-7), (2.0**-9, 2.0**-9)]),  # half an ulp plus a sticky product -> up
    (1024.0, [(2.0**-7, -(2.0**-7)), (2.0**-9, 2.0**-9)]),  # below half (crosses the binade down) -> nearest
    (2.0**24, [(1.0, 1.0)]),  # 2^24 + 1: tie at ulp 2 -> even
    (2.0**24, [(1.0, 1.0), (2.0**-9, 2.0**-9)]),  # just above the tie -> up
    (0.0, [(448.0, 448.0), (448.0, -448.0), (2.0**-9, 2.0**-9)]),  # full cancellation leaves the tiny product
]


@pytest.mark.parametrize(("c", "pairs"), TIES)
def test_blackwell_mma_rounds_the_exact_sum_once_to_nearest_even(c: float, pairs: list) -> None:
    a = np.zeros(32, np.float32)
    b = np.zeros(32, np.float32)
    for i, (x, y) in enumerate(pairs):
        a[i], b[i] = x, y
    exact = Fraction(float(np.float32(c))) + sum(Fraction(x) * Fraction(y) for x, y in pairs)
    want = _f32_rne(exact)
    got = dot_add(_codes(a), _codes(b), np.float32(c), model="blackwell_mma")
    assert got.view(np.uint32) == np.array(want).view(np.uint32), (float(got), float(want))


def test_blackwell_mma_chain_in_scaled_mm_is_one_rounding_per_instruction() -> None:
    """``accumulator="blackwell_mma"``: each k32 instruction rounds (exact products + previous D) once."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 96)) * 30).astype(np.float32).astype(E4).view(np.uint8)
    b = (rng.standard_normal((96, 4)) * 0.02).astype(np.float32).astype(E4).view(np.uint8)
    got = scaled_mm(a, b, np.float32(1), np.float32(1), out_dtype="float32", accumulator="blackwell_mma",
                    a_format="e4m3", b_format="e4m3", strict=False)  # fmt: skip
    va, vb = a.view(E4).astype(np.float64), b.view(E4).astype(np.float64)
    for i in range(3):
        for j in range(4):
            d = np.float32(0)
            for k0 in range(0, 96, 32):
                s = Fraction(float(d)) + sum(Fraction(va[i, t]) * Fraction(vb[t, j]) for t in range(k0, k0 + 32))
                d = _f32_rne(s) if s != 0 else np.float32(0)
            assert got[i, j] == d, (i, j)


def test_blackwell_mma_refuses_float16_accumulation_as_open() -> None:
    with pytest.raises(ValueError, match="float16 accumulation is not modelled"):
        dot_add(np.zeros(32, np.uint8), np.zeros(32, np.uint8), 0.0, model="blackwell_mma", out_dtype="float16")


def test_hardware_table_lists_every_set_and_states_the_float16_rule_open() -> None:
    rows = {(r.gpu, r.fmt, r.output, r.model, r.c): r.agree for r in hardware_agreement(DATA)}
    assert rows[("B200", "e4m3", "float32", "blackwell_mma", "published")] == 5000
    assert rows[("B200", "e5m2", "float32", "blackwell_mma", "published")] == 4999
    assert rows[("B200", "e4m3", "float32", "blackwell_mma_km", "published")] == 4754
    assert rows[("H100", "e4m3", "float32", "hopper_wgmma", "0")] == 5000
    assert rows[("L40S", "e4m3", "float32", "ada_mma", "published")] == 5000
    for fmt in ("e4m3", "e5m2"):
        assert rows[("Ada", fmt, "float32", "ada_mma", "published")] == 5000
        assert rows[("Ada", fmt, "float16", "ada_mma", "RN16(published)")] == 5000
    f16 = [v for (g, _, out, _, _), v in rows.items() if out == "float16" and g in ("H100", "B200")]
    assert f16 and max(f16) < 5000  # no candidate reproduces the Hopper/Blackwell float16 vectors (open rule)
    text = "\n".join(hardware_section(DATA))
    assert "**Open:**" in text and "| B200 | e4m3 | float32 | **blackwell_mma** | published | 5,000/5,000 |" in text
    assert "| Ada | e5m2 | float16 | **ada_mma** | RN16(published) | 5,000/5,000 |" in text
