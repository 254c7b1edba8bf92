"""The float16-accumulate candidates of the hardware table, counted again from the published real-GPU
vectors (``tests/data/hardware/``, Khattak & Mikaitis) with exact integer arithmetic: every FP8
product is a whole multiple of 2**-32, so each sum is an exact Python integer, and each candidate's
rounding to float16 (round to nearest, ties to even, past 65504 to Inf) is done here on the integer."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from fp8sim.native.hardware import F16_CANDIDATES, hardware_agreement

DATA = Path(__file__).resolve().parent / "data" / "hardware"
SHIFT = 32  # e5m2's smallest subnormal is 2**-16: its products are multiples of 2**-32
CASES = 400
_DT = {"E4M3": ml_dtypes.float8_e4m3fn, "E5M2": ml_dtypes.float8_e5m2}


def _units(x: float) -> int:
    """``x`` (a float whose value is a multiple of 2**-32) in units of 2**-32, exactly."""
    n = x * 2.0**SHIFT
    assert n == int(n)
    return int(n)


def _rn16(n: int) -> int:
    """n * 2**-32 rounded to float16 (ties to even), in units of 2**-32; None for an overflow to Inf."""
    if n == 0:
        return 0
    sign, a = (-1 if n < 0 else 1), abs(n)
    e = max(a.bit_length() - 1 - SHIFT, -14)  # exponent of the leading bit; float16 subnormals below 2**-14
    drop = SHIFT + e - 10  # float16 keeps 10 fraction bits: its ulp here is 2**(e - 10)
    q, r = divmod(a, 1 << drop)
    half = 1 << (drop - 1)
    if r > half or (r == half and q & 1):
        q += 1
    value = q << drop
    if value > 65504 << SHIFT:
        return None
    return sign * value


def _f16_units(c: float) -> int:
    return _units(float(np.float16(c)))


def _candidates(p: list[int], c: float) -> dict[str, int | None]:
    c16 = _f16_units(c)
    s = _rn16(sum(p))
    first = _rn16(sum(p[:16]) + c16)
    return {
        "RN16(RN16(sum of products) + RN16(c))": None if s is None else _rn16(s + c16),
        "RN16(exact sum + RN16(c))": _rn16(sum(p) + c16),
        "two k16 halves, RN16 each, c first": None if first is None else _rn16(sum(p[16:]) + first),
    }


def test_float16_candidates_agree_on_as_many_cases_as_an_exact_recount(tmp_path: Path) -> None:
    """The first CASES measurements of every set with float16 results (the recount is pure Python)."""
    for f in sorted(DATA.glob("*_E*.npz")):
        with np.load(f) as z:
            if "d16" in z.files:
                np.savez(tmp_path / f.name, **{k: z[k][:CASES] for k in z.files})
    rows = {(r.gpu, r.fmt, r.output, r.model): r for r in hardware_agreement(tmp_path)}
    assert set(F16_CANDIDATES) == set(_candidates([0] * 32, 0.0))
    counted = 0
    for f in sorted(tmp_path.glob("*_E*.npz")):
        gpu, stem = f.stem.split("_")
        z = np.load(f)
        # the published operands are FP8 values stored as float32: decode them through ml_dtypes' format
        a = z["a"].astype(_DT[stem]).astype(np.float64)
        b = z["b"].astype(_DT[stem]).astype(np.float64)
        assert np.array_equal(a, z["a"]) and np.array_equal(b, z["b"])
        want = z["d16"].view(np.float32)
        agree = dict.fromkeys(F16_CANDIDATES, 0)
        for i in range(len(want)):
            p = [_units(x * y) for x, y in zip(a[i].tolist(), b[i].tolist(), strict=True)]
            w = float(want[i])
            for name, got in _candidates(p, float(z["c"][i])).items():
                if got is None:
                    agree[name] += bool(np.isinf(w))
                else:
                    agree[name] += got == _units(w) if np.isfinite(w) else 0
        assert agree["RN16(exact sum + RN16(c))"] > 0
        for name, n in agree.items():
            row = rows[(gpu, stem.lower(), "float16", name)]
            assert (row.agree, row.total) == (n, len(want)), (gpu, stem, name)
        counted += 1
    assert counted == 5
