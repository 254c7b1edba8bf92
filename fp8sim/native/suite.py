"""What a capture records: deterministic input sets and the ``torch._scaled_mm`` case list.

Inputs are regenerated from names, seeds and shapes, so a capture stores only outputs.  Changing
a generator changes the meaning of old captures: bump ``SUITE_VERSION`` when you do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from ..cast import encode
from ..cast._tables import code_values
from ..formats import FORMATS

__all__ = ["SUITE_VERSION", "GemmCase", "input_set", "gemm_cases", "gemm_operands", "INPUT_SETS", "FLOAT_CASTS"]

SUITE_VERSION = 1
INPUT_SETS = ("f16_all", "bf16_all", "f32_special")  # the inputs of the FP8 casts
# the casts to the 16-bit floats (torch's ``.to(torch.bfloat16)``, ``.to(torch.float16)``) and their inputs
FLOAT_CASTS = {"bfloat16": ("f16_all", "f32_wide"), "float16": ("bf16_all", "f32_wide")}
ALL_INPUT_SETS = (*INPUT_SETS, "f32_wide")
_SPECIAL_FORMATS = ("e4m3", "e5m2", "e8m0", "e4m3fnuz", "e5m2fnuz", "e2m1", "e2m3", "e3m2")
"""The formats whose grids make up ``f32_special`` in suite version 1: fixed, so that a format added to
the registry (UE5M3) leaves old captures' inputs as they were."""


def input_set(name: str, seed: int = 0) -> np.ndarray:
    """float16 / bfloat16 (all 65,536 patterns) or float32 samples: random bit patterns plus every
    format's grid points, midpoints (ties), one float32 ulp either side, overflow edges, zeros,
    subnormals, +-Inf and NaN."""
    if name == "f16_all":
        return np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    if name == "bf16_all":
        return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    if name == "f32_wide":
        return _f32_wide(seed)
    if name != "f32_special":
        raise ValueError(f"unknown input set {name!r}; known: {', '.join(ALL_INPUT_SETS)}")
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 2**32, 1 << 15, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    for f in (FORMATS[n] for n in _SPECIAL_FORMATS):
        v = code_values(f)
        fin = np.unique(np.abs(v[np.isfinite(v)]))
        mids = (fin[1:] + fin[:-1]) / 2
        edges = [f.max * 1.0001, f.max * 1.5, f.max * 4, f.smallest_positive / 2, f.smallest_positive / 4]
        with np.errstate(over="ignore"):
            pts = np.concatenate([fin, mids, edges]).astype(np.float32)
        pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
        parts += [pts, -pts]
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-45], np.float32))
    return np.concatenate(parts).astype(np.float32)


def _f32_wide(seed: int) -> np.ndarray:
    """float32 samples for casts to bfloat16 and float16: random bit patterns, and every 13th positive
    finite value of each (a stride that visits both parities and every exponent) with the midpoints above
    them (ties), one float32 ulp either side, overflow edges, both signs; zeros, +-Inf and NaN."""
    rng = np.random.default_rng(seed + 1)
    parts = [rng.integers(0, 2**32, 1 << 14, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    for dt in (ml_dtypes.bfloat16, np.float16):
        top = np.uint16(0x7F80 if dt is ml_dtypes.bfloat16 else 0x7C00)  # +Inf: the codes below are finite
        codes = np.arange(0, int(top), 13, dtype=np.uint16)
        v, nxt = codes.view(dt).astype(np.float32), (codes + 1).view(dt).astype(np.float32)
        big = float(ml_dtypes.finfo(dt).max)
        mids = ((v.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)  # exact in float32
        with np.errstate(over="ignore"):  # bfloat16's max * 4 is float32's Inf
            edges = np.array([big * 1.001, big * 1.5, big * 4], np.float64).astype(np.float32)
        pts = np.concatenate([v, mids[np.isfinite(mids)], edges])
        pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
        parts += [pts, -pts]
    parts.append(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], np.float32))
    return np.concatenate(parts).astype(np.float32)


@dataclass(frozen=True)
class GemmCase:
    """One ``torch._scaled_mm`` call: shapes, formats, scale layout, fast accumulation, output."""

    m: int
    n: int
    k: int
    a_format: str
    b_format: str
    layout: str  # "tensorwise" or "rowwise"
    fast_accum: bool
    out_dtype: str  # "float32" or "bfloat16"
    seed: int

    @property
    def name(self) -> str:
        acc = "fast" if self.fast_accum else "split"
        return (
            f"scaled_mm/{self.a_format}x{self.b_format}/{self.layout}/{acc}/{self.out_dtype}/{self.m}x{self.n}x{self.k}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def gemm_cases(suite: str) -> list[GemmCase]:
    """The case list: ``quick`` (K up to 1024) or ``full`` (K up to 8192)."""
    if suite not in ("quick", "full"):
        raise ValueError(f"suite must be 'quick' or 'full', got {suite!r}")
    ks = (32, 256, 1024) if suite == "quick" else (32, 128, 512, 2048, 8192)
    mn = 32 if suite == "quick" else 64
    pairs = (("e4m3", "e4m3"), ("e5m2", "e4m3"))
    cases = []
    seed = 100
    for k in ks:
        for fa, fb in pairs:
            for fast in (True, False):
                for layout, outs in (("tensorwise", ("float32", "bfloat16")), ("rowwise", ("bfloat16",))):
                    for out in outs:
                        cases.append(GemmCase(mn, mn, k, fa, fb, layout, fast, out, seed))
                        seed += 1
    return cases


def gemm_operands(case: GemmCase) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a codes (M, K), b codes (K, N), scale_a, scale_b) regenerated from the case's seed; values
    are N(0, 1) scaled into each format's range with positive data in one column (sums grow)."""
    rng = np.random.default_rng(case.seed)
    fa, fb = FORMATS[case.a_format], FORMATS[case.b_format]
    a = rng.standard_normal((case.m, case.k)) * fa.max / 16
    b = rng.standard_normal((case.k, case.n)) * fb.max / 16
    b[:, 0] = np.abs(b[:, 0])
    a[0] = np.abs(a[0])
    ac = encode(a.astype(np.float32), fa, saturate=True)
    bc = encode(b.astype(np.float32), fb, saturate=True)
    if case.layout == "tensorwise":
        sa = np.float32(2.0 ** rng.integers(-8, -2) * (1 + rng.random()))
        sb = np.float32(2.0 ** rng.integers(-8, -2) * (1 + rng.random()))
        return ac, bc, np.array(sa, np.float32), np.array(sb, np.float32)
    sa = (rng.random((case.m, 1)) * 0.01 + 1e-3).astype(np.float32)
    sb = (rng.random((1, case.n)) * 0.01 + 1e-3).astype(np.float32)
    return ac, bc, sa, sb
