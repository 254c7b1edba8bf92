"""Exact dot products of narrow-float matrices, correctly rounded once to float32.

The products of two matrices of decoded FP8/FP4 values are split into exponent bands small enough
that each band-pair ``float64`` matmul is exact (every partial sum fits 53 bits whatever BLAS's
order); the few exact band results are combined error-free (``TwoSum`` distillation) and rounded
to float32 through round-to-odd, which makes the final rounding correct.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["exact_matmul_f32", "fma_f32", "round_sum_to_f32", "two_sum"]


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum: ``s + e == a + b`` exactly, ``s = fl(a + b)``."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _distill(terms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(hi, sign carrier) with ``hi`` the float64 nearest-ish head and the exact remainder's sign in
    the second array: repeated error-free vecsum until the tail vanishes or stabilises."""
    terms = [t.astype(np.float64, copy=False) for t in terms]
    for _ in range(len(terms) + 2):
        out = []
        acc = terms[0]
        for t in terms[1:]:
            acc, e = two_sum(acc, t)
            out.append(e)
        tail = [e for e in out if np.any(e != 0)]
        if not tail:
            return acc, np.zeros_like(acc)
        terms = tail + [acc]
    # the head is the last element; the remainder's sign is that of the sum of the tail, which is
    # exact to a sign after distillation (tail terms are non-overlapping)
    head = terms[-1]
    rem = np.zeros_like(head)
    for t in reversed(terms[:-1]):
        rem = np.where(rem == 0, t, rem)
    return head, rem


def round_sum_to_f32(hi: np.ndarray, rem: np.ndarray) -> np.ndarray:
    """float32 nearest-even of ``hi + rem`` where ``|rem|`` is below half an ulp of ``hi`` (only its
    sign matters): round to odd at 53 bits, then to float32."""
    hi = np.asarray(hi, np.float64)
    bits = hi.view(np.int64).copy()
    inexact = (rem != 0) & np.isfinite(hi) & (hi != 0)
    toward_zero = inexact & (np.signbit(rem) != np.signbit(hi))
    # truncate toward zero: step the magnitude down by one ulp where rem points toward zero
    bits = np.where(toward_zero, bits - 1, bits)
    bits = np.where(inexact, bits | 1, bits)  # sticky bit: make it odd
    ro = bits.view(np.float64)
    zero_hi = (hi == 0) & (rem != 0)  # tiny remainders on a zero head: rem itself is the value
    ro = np.where(zero_hi, rem, ro)
    with np.errstate(over="ignore"):
        return ro.astype(np.float32)


def _bands(v: np.ndarray, mbits: int, width: int) -> list[np.ndarray]:
    """Split a matrix into disjoint exponent bands of at most ``width`` binades (zeros elsewhere)."""
    mag = np.abs(v)
    nz = mag > 0
    if not nz.any():
        return [v]
    ex = np.frexp(mag)[1] - 1
    lo, hi = int(ex[nz].min()), int(ex[nz].max())
    if hi - lo + 1 <= width:
        return [v]
    out = []
    for start in range(lo, hi + 1, width):
        sel = nz & (ex >= start) & (ex < start + width)
        if sel.any():
            out.append(np.where(sel, v, 0.0))
    return out


def exact_matmul_f32(va: np.ndarray, vb: np.ndarray, mbits_a: int, mbits_b: int) -> np.ndarray:
    """float32 nearest-even of the exact ``va @ vb`` plus +0 for finite float64 matrices whose entries
    have at most ``mbits + 1`` significant bits (decoded narrow floats, possibly times powers of two).
    A zero result is +0, as the instruction ``D = A.B + C`` with ``C = +0`` gives it."""
    k = max(va.shape[-1], 1)
    # band-pair matmul exact when log2(k) + (Wa + Wb) + ma + mb + 2 <= 53
    budget = 53 - math.ceil(math.log2(k)) - mbits_a - mbits_b - 2
    if budget < 2:
        raise ValueError(f"K={k} is too long for an exact float64 band decomposition")
    wa = max(1, budget // 2)
    wb = max(1, budget - wa)
    parts = [np.matmul(pa, pb) for pa in _bands(va, mbits_a, wa) for pb in _bands(vb, mbits_b, wb)]
    if len(parts) == 1:
        with np.errstate(over="ignore"):
            out = parts[0].astype(np.float32)  # exact float64, one rounding
    else:
        hi, rem = _distill(parts)
        out = round_sum_to_f32(hi, rem)
    # D = A.B + C with C = +0: a zero sum is +0, whatever sign the BLAS's summation order gave it
    return out + np.float32(0)


def fma_f32(x: np.ndarray, s: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 fma(x, s, y): the exact x*s + y rounded once (float32 inputs)."""
    p = x.astype(np.float64) * s.astype(np.float64)  # exact: 24 x 24 bits
    hi, lo = two_sum(p, y.astype(np.float64))
    with np.errstate(invalid="ignore"):
        special = ~np.isfinite(hi)
    return np.where(special, hi.astype(np.float32), round_sum_to_f32(np.where(special, 0.0, hi), lo))
