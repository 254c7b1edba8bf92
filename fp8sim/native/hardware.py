"""Native evidence from published real-GPU measurements: agreement of each candidate model.

The project's own GPU captures are compared by :mod:`fp8sim.native.compare`; until it has some,
the real-GPU dot products published by Khattak & Mikaitis (``tests/data/hardware/``, see its
README for provenance and licence) are its native evidence.  For every GPU, format and output type
(float32 / float16 accumulate) this module counts the cases on which each candidate model gives the
measured bits.  Ada's float16 accumulation is ``ada_mma`` with float16 output (every measured case);
the float16-accumulate rule of Hopper/Blackwell ``mma.sync`` is open: no candidate reproduces the
measurements, and the table says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ..gemm import dot_add

__all__ = ["HardwareRow", "F16_CANDIDATES", "hardware_agreement", "hardware_section", "default_data_dir"]

# (instruction model, c as published?) tried on every set for the float32-accumulate variant
_F32_MODELS = ("hopper_wgmma", "ada_mma", "blackwell_tcgen05", "blackwell_mma", "blackwell_mma_km")
# the model fp8sim uses per GPU (float32 accumulate) and where a float16-accumulate model is known
_EXPECTED = {"H100": "hopper_wgmma", "L40S": "ada_mma", "B200": "blackwell_mma", "Ada": "ada_mma"}
_EXPECTED_F16 = {"Ada": "ada_mma"}
_FORMATS = {"E4M3": ("e4m3", ml_dtypes.float8_e4m3fn), "E5M2": ("e5m2", ml_dtypes.float8_e5m2)}


def _rn16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def _rn16_sum_then_c(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    return _rn16(_rn16(p.sum(-1)) + _rn16(c))


def _rn16_exact(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    return _rn16(p.sum(-1) + _rn16(c))


def _rn16_halves_chained(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    first = _rn16(p[..., :16].sum(-1) + _rn16(c))
    return _rn16(p[..., 16:].sum(-1) + first)


# float16 accumulate: candidate rules, none validated (products of FP8 values and their sums of 32
# are exact in float64, so each candidate is evaluated exactly)
F16_CANDIDATES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "RN16(RN16(sum of products) + RN16(c))": _rn16_sum_then_c,
    "RN16(exact sum + RN16(c))": _rn16_exact,
    "two k16 halves, RN16 each, c first": _rn16_halves_chained,
}


@dataclass(frozen=True)
class HardwareRow:
    gpu: str
    fmt: str
    output: str
    model: str
    c: str
    agree: int
    total: int


def default_data_dir() -> Path:
    """``tests/data/hardware`` of the source checkout fp8sim runs from."""
    return Path(__file__).resolve().parents[2] / "tests" / "data" / "hardware"


def hardware_agreement(data_dir: str | Path | None = None) -> list[HardwareRow]:
    """One row per (GPU, format, output, candidate, c): cases agreeing bit for bit with the GPU."""
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    rows: list[HardwareRow] = []
    for f in sorted(d.glob("*_E*.npz")):
        gpu, stem = f.stem.split("_")
        if stem not in _FORMATS:
            continue
        fmt, dt = _FORMATS[stem]
        z = np.load(f)
        a, b = (z[x].astype(dt).view(np.uint8) for x in "ab")
        c = z["c"]
        n = len(c)
        kw = {"a_format": fmt, "b_format": fmt}
        for model in _F32_MODELS:
            for cname, cval in (("published", c), ("0", np.zeros_like(c))):
                got = dot_add(a, b, cval, model=model, **kw).view(np.uint32)
                rows.append(HardwareRow(gpu, fmt, "float32", model, cname, int((got == z["d32"]).sum()), n))
        if "d16" in z.files:
            want = z["d16"].view(np.float32).astype(np.float64)
            p = z["a"].astype(np.float64) * z["b"].astype(np.float64)
            for model in ("ada_mma", "hopper_wgmma", "blackwell_tcgen05"):  # fp8sim's float16-output variants
                got = dot_add(a, b, c.astype(np.float16), model=model, out_dtype="float16", **kw).astype(np.float64)
                rows.append(HardwareRow(gpu, fmt, "float16", model, "RN16(published)", int((got == want).sum()), n))
            for name, fn in F16_CANDIDATES.items():
                rows.append(HardwareRow(gpu, fmt, "float16", name, "RN16(published)", int((fn(p, c) == want).sum()), n))
    return rows


def hardware_section(data_dir: str | Path | None = None) -> list[str]:
    """Markdown lines for the default report: the agreement table, the float16 rule stated as open."""
    d = Path(data_dir) if data_dir is not None else default_data_dir()
    lines = ["", "## Native evidence: published real-GPU dot products", ""]
    if not d.is_dir():
        return lines + [f"No hardware data at `{d}` (it ships with the source checkout, `tests/data/hardware/`)."]
    rows = hardware_agreement(d)
    lines += [
        "`mma.sync m16n8k32` FP8 dot products measured on real GPUs by Khattak & Mikaitis (ACM TACO 2026;",
        "BSD-2-Clause, provenance in `tests/data/hardware/README.md`; Ada: an RTX 1000 Ada). Cases on which each",
        "candidate model gives the GPU's bits; **bold**: the model fp8sim uses for that GPU.",
        "",
        "| GPU | format | accumulate | candidate | c | agree |",
        "|---|---|---|---|---|---:|",
    ]
    for r in rows:
        used = (_EXPECTED if r.output == "float32" else _EXPECTED_F16).get(r.gpu) == r.model
        name = f"**{r.model}**" if used else r.model
        lines.append(f"| {r.gpu} | {r.fmt} | {r.output} | {name} | {r.c} | {r.agree:,}/{r.total:,} |")
    lines += [
        "",
        "The published H100 float32 outputs are those of c = 0 (not the published c); L40S, Ada and B200 use the",
        "published c. Ada's float16 accumulation is `ada_mma` with float16 output and c rounded to float16",
        "(`ada_fast_f16`).",
        "",
        "**Open:** the float16-accumulate rule of Hopper and Blackwell `mma.sync` is not known; no candidate above",
        "reproduces the measured float16 results, so fp8sim has no float16-accumulate model for them",
        "(`reports/hardware_f16_accumulate.md`).",
    ]
    return lines
