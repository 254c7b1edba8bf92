"""Per-instruction tensor-core models (spec 9.1) against the MMA-Sim golden vectors and a slow,
readable Python reference written here with integers and fractions."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fp8sim.gemm import INSTRUCTION_MODELS, InstructionModel, dot_add

# In-repo copy of shared/golden/mma (see its README: MMA-Sim per-instruction results).
GOLDEN = Path(__file__).parent / "data" / "golden" / "mma"

SETS = {
    "hopper_wgmma_f32_e4m3_e4m3": ("hopper_wgmma", "e4m3", "e4m3", "float32"),
    "hopper_wgmma_f32_e5m2_e4m3": ("hopper_wgmma", "e5m2", "e4m3", "float32"),
    "hopper_wgmma_f32_e5m2_e5m2": ("hopper_wgmma", "e5m2", "e5m2", "float32"),
    "hopper_wgmma_f16_e4m3_e4m3": ("hopper_wgmma", "e4m3", "e4m3", "float16"),
    "ada_mma_f32_e4m3_e4m3": ("ada_mma", "e4m3", "e4m3", "float32"),
    "blackwell_tcgen05_f32_e4m3_e4m3": ("blackwell_tcgen05", "e4m3", "e4m3", "float32"),
    "blackwell_mxf8f6f4_e4m3": ("blackwell_mxf8f6f4", "e4m3", "e4m3", "float32"),
    "blackwell_mxf4nvf4_nvfp4": ("blackwell_mxf4nvf4", "e2m1", "e2m1", "float32"),
}


def _first_mismatch(got: np.ndarray, want: np.ndarray, z: dict) -> str:
    i = int(np.flatnonzero(got != want)[0])
    return (
        f"{int((got != want).sum())} of {want.size} differ; case {i} (distribution {int(z['dist'][i])}): "
        f"got 0x{int(got[i]):08x} want 0x{int(want[i]):08x}"
    )


@pytest.mark.parametrize("stem", list(SETS))
def test_golden_set_bit_exact(stem: str) -> None:
    model, fa, fb, out = SETS[stem]
    meta = json.loads((GOLDEN / f"{stem}.json").read_text())
    assert meta["instruction"]["n_fractional_bits"] == INSTRUCTION_MODELS[model].frac_bits
    z = dict(np.load(GOLDEN / f"{stem}.npz"))
    kw = {"scale_a": z["scale_a"], "scale_b": z["scale_b"]} if "scale_a" in z else {}
    d = dot_add(z["a"], z["b"], z["c"], model=model, a_format=fa, b_format=fb, out_dtype=out, **kw)
    got = d.view(np.uint16 if out == "float16" else np.uint32)
    assert np.array_equal(got, z["d"]), _first_mismatch(got, z["d"], z)


def test_golden_chain_of_16_wgmma_bit_exact_at_every_step() -> None:
    z = dict(np.load(GOLDEN / "hopper_wgmma_chain_e4m3.npz"))
    acc = z["c"]
    for j in range(16):
        acc = dot_add(z["a"][:, 32 * j : 32 * j + 32], z["b"][:, 32 * j : 32 * j + 32], acc, model="hopper_wgmma")
        assert np.array_equal(acc.view(np.uint32), z["d_steps"][:, j]), f"step {j}: " + _first_mismatch(
            acc.view(np.uint32), z["d_steps"][:, j], z
        )
    assert np.array_equal(acc.view(np.uint32), z["d"])


# ---- the slow reference ----------------------------------------------------------------------

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}


def _val(code: int, name: str) -> float:
    return float(np.array([code], np.uint8).view(ML[name]).astype(np.float64)[0])


def _split(v: float, emin: int) -> tuple[Fraction, int]:
    """v = s * 2^e with e = max(floor(log2|v|), emin); zero -> (±0, -126) handled by the caller."""
    e = max(math.frexp(abs(v))[1] - 1, emin)
    return Fraction(v) / Fraction(2) ** e, e


def _emin(name: str) -> int:
    return int(math.log2(float(ml_dtypes.finfo(ML[name]).tiny)))


def reference(
    m: InstructionModel,
    a: list[int],
    b: list[int],
    c: float,
    fa: str,
    fb: str,
    sa: list[int] | None,
    sb: list[int] | None,
    out: str,
) -> float:
    """One instruction (or one half) in Python integers; returns the float result."""
    va, vb = [_val(x, fa) for x in a], [_val(x, fb) for x in b]
    exact = sum(x * y for x, y in zip(va, vb, strict=True)) + c  # float64: only used for specials
    terms: list[tuple[Fraction, int, bool]] = []  # (significand, exponent, sign bit)
    nan_scale = (m.scale_format == "ue4m3" and any((s & 0x7F) == 0x7F for s in sa + sb)) or (
        m.scale_format == "e8m0" and any(s == 0xFF for s in sa + sb)
    )
    if nan_scale or math.isnan(exact):
        return math.nan
    if math.isinf(exact):
        return exact
    if m.scale_format == "ue4m3":
        for g in range(len(sa)):
            gsum = sum(
                Fraction(x) * Fraction(y)
                for x, y in zip(va[16 * g : 16 * g + 16], vb[16 * g : 16 * g + 16], strict=True)
            )
            ssa, ssb = _val(sa[g] & 0x7F, "e4m3"), _val(sb[g] & 0x7F, "e4m3")
            (fa_s, ea), (fb_s, eb) = [(Fraction(0), -126) if s == 0 else _split(s, -6) for s in (ssa, ssb)]
            terms.append((gsum * fa_s * fb_s, ea + eb, gsum < 0))
    else:
        for i, (x, y) in enumerate(zip(va, vb, strict=True)):
            sx, ex = (Fraction(0), -126) if x == 0 else _split(x, _emin(fa))
            sy, ey = (Fraction(0), -126) if y == 0 else _split(y, _emin(fb))
            extra = (sa[i // 32] - 127 + sb[i // 32] - 127) if m.scale_format == "e8m0" else 0
            terms.append((sx * sy, ex + ey + extra, math.copysign(1, x) * math.copysign(1, y) < 0))
    c_emin = -14 if out == "float16" else -126
    sc, ec = (Fraction(0), c_emin) if c == 0 else _split(c, c_emin)
    terms.append((sc, ec, math.copysign(1, c) < 0))
    big_e = max(e for _, e, _ in terms)
    n = m.frac_bits
    total = sum(int(s * Fraction(2) ** (n + e - big_e)) for s, e, _ in terms)  # int() truncates toward 0
    if total == 0:
        return -0.0 if all(neg for _, _, neg in terms) else 0.0
    value = Fraction(total) * Fraction(2) ** (big_e - n)
    if out == "float16":
        with np.errstate(over="ignore"):  # overflow to Inf is the expected float16 result
            return float(np.float16(float(value)))  # value < 2^53 ulps: exact in float64, then one RN
    ex = math.floor(math.log2(abs(value)))
    while Fraction(2) ** ex > abs(value):
        ex -= 1
    while Fraction(2) ** (ex + 1) <= abs(value):
        ex += 1
    if ex > 127:
        return math.copysign(math.inf, value)
    qe = max(ex - m.out_mbits, -126 - m.out_mbits)
    return float(int(value / Fraction(2) ** qe) * Fraction(2) ** qe)


def _random_case(rng: np.random.Generator, m: InstructionModel, fa: str, fb: str, out: str):  # noqa: ANN202
    ncode = 16 if fa == "e2m1" else 256
    a = rng.integers(0, ncode, m.k).tolist()
    b = rng.integers(0, ncode, m.k).tolist()
    if rng.random() < 0.5:  # mostly-finite, moderate range
        finite = [c for c in range(ncode) if math.isfinite(_val(c, fa)) and abs(_val(c, fa)) < 64]
        a = rng.choice(finite, m.k).tolist()
        b = rng.choice(finite, m.k).tolist()
    c = float(rng.choice([0.0, -0.0, 1e-40, -3.5, 1e3, 2.0**-130, float(rng.standard_normal() * 10)]))
    if out == "float16":
        c = float(np.float16(c))
    sa = sb = None
    if m.scale_format == "e8m0":
        sa, sb = (rng.integers(110, 140, m.k // 32).tolist() for _ in range(2))
    elif m.scale_format == "ue4m3":
        sa, sb = (rng.integers(0, 0x7F, m.k // 16).tolist() for _ in range(2))
    return a, b, np.float32(c).item() if out == "float32" else c, sa, sb


CASES = [
    ("hopper_wgmma", "e4m3", "e4m3", "float32"),
    ("hopper_wgmma", "e5m2", "e4m3", "float32"),
    ("hopper_wgmma", "e4m3", "e4m3", "float16"),
    ("ada_mma", "e4m3", "e4m3", "float32"),
    ("blackwell_tcgen05", "e5m2", "e5m2", "float32"),
    ("blackwell_mxf8f6f4", "e4m3", "e4m3", "float32"),
    ("blackwell_mxf4nvf4", "e2m1", "e2m1", "float32"),
]


@pytest.mark.parametrize(("model", "fa", "fb", "out"), CASES)
def test_vectorised_model_equals_the_slow_reference(model: str, fa: str, fb: str, out: str) -> None:
    m = INSTRUCTION_MODELS[model]
    rng = np.random.default_rng(sum(map(ord, model + fa + out)))
    for _ in range(60):
        a, b, c, sa, sb = _random_case(rng, m, fa, fb, out)
        kw = {"scale_a": np.array(sa), "scale_b": np.array(sb)} if sa is not None else {}
        got = dot_add(np.array(a), np.array(b), np.array(c), model=m, a_format=fa, b_format=fb, out_dtype=out, **kw)
        half = m.k // m.halves
        want = c
        for h in range(m.halves):
            sl = slice(h * half, (h + 1) * half)
            want = reference(m, a[sl], b[sl], want, fa, fb, sa, sb, out)
        gv, wv = float(got), want
        assert (math.isnan(gv) and math.isnan(wv)) or (gv == wv and math.copysign(1, gv) == math.copysign(1, wv)), (
            f"{model} a={a} b={b} c={c!r} scales={sa},{sb}: got {gv!r} want {wv!r}"
        )


def test_model_parameters_are_data_and_a_new_device_is_one_record() -> None:
    m = InstructionModel("wide_hopper", 32, 40, 23)  # a hypothetical device that keeps 40 bits
    a = np.full((1, 32), 0x38, np.uint8)  # 1.0
    b = np.full((1, 32), 0x38, np.uint8)
    assert dot_add(a, b, np.float32([2.0**-15]), model=m).tolist() == [32.0 + 2.0**-15]
    assert dot_add(a, b, np.float32([2.0**-15]), model="hopper_wgmma").tolist() == [32.0]  # truncated


def test_bad_arguments() -> None:
    a = np.zeros((2, 32), np.uint8)
    with pytest.raises(ValueError, match="unknown instruction model 'volta'"):
        dot_add(a, a, np.zeros(2, np.float32), model="volta")
    with pytest.raises(ValueError, match=r"same shape \[\.\.\., 32\]"):
        dot_add(a[:, :16], a[:, :16], np.zeros(2, np.float32), model="hopper_wgmma")
    with pytest.raises(ValueError, match="needs scale_a and scale_b"):
        dot_add(a, a, np.zeros(2, np.float32), model="blackwell_mxf8f6f4")
    with pytest.raises(TypeError, match="integer codes"):
        dot_add(a.astype(np.float32), a, np.zeros(2, np.float32), model="hopper_wgmma")
    with pytest.raises(ValueError, match="codes outside"):
        dot_add(
            np.full((2, 64), 16),
            np.zeros((2, 64), np.uint8),
            np.zeros(2, np.float32),
            model="blackwell_mxf4nvf4",
            a_format="e2m1",
            b_format="e2m1",
            scale_a=np.zeros((2, 4), np.uint8),
            scale_b=np.zeros((2, 4), np.uint8),
        )
