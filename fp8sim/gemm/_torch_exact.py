"""The exact sum of float64 terms rounded once to float32 (nearest even), in torch ops: the torch
twin of :func:`fp8sim.gemm._exact._distill` and :func:`~fp8sim.gemm._exact.round_sum_to_f32` for
the round-to-nearest instruction models (``blackwell_mma``) on any device.

Only IEEE float64 additions (TwoSum is error-free under round-to-nearest, which every torch device
uses for float64), integer operations on the bits and one float64 -> float32 conversion (correctly
rounded) are used, so the result is the correctly rounded sum on every device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rn_sum_f32"]


def _two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _distill(terms: Any) -> tuple[Any, Any]:
    """(head, remainder carrier) of the exact sum of ``terms`` ``[..., L]`` (finite float64): repeated
    error-free vecsum until every error term is zero, as the numpy reference does."""
    import torch

    cols = list(terms.unbind(-1))
    for _ in range(len(cols) + 2):
        acc, errs = cols[0], []
        for t in cols[1:]:
            acc, e = _two_sum(acc, t)
            errs.append(e)
        tail = [e for e in errs if bool((e != 0).any())]
        if not tail:
            return acc, torch.zeros_like(acc)
        cols = tail + [acc]
    head, rem = cols[-1], torch.zeros_like(cols[-1])
    for t in reversed(cols[:-1]):
        rem = torch.where(rem == 0, t, rem)
    return head, rem


def rn_sum_f32(terms: Any) -> Any:
    """float32 nearest-even of the exact sum of finite float64 ``terms`` along the last axis (round to
    odd at 53 bits from the distilled head and the remainder's sign, then one conversion)."""
    import torch

    hi, rem = _distill(terms)
    bits = hi.view(torch.int64)
    inexact = (rem != 0) & torch.isfinite(hi) & (hi != 0)
    toward_zero = inexact & (torch.signbit(rem) != torch.signbit(hi))
    bits = torch.where(toward_zero, bits - 1, bits)
    bits = torch.where(inexact, bits | 1, bits)  # sticky bit: round to odd
    ro = torch.where((hi == 0) & (rem != 0), rem, bits.view(torch.float64))
    return ro.to(torch.float32)


def _bands(v: Any, width: int) -> list:
    """``v`` split into disjoint exponent bands of at most ``width`` binades (zeros elsewhere), as
    :func:`fp8sim.gemm._exact._bands`; exponents from the float64 bits (the values are normal)."""
    import torch

    mag = v.abs()
    nz = mag > 0
    if not bool(nz.any()):
        return [v]
    ex = ((mag.view(torch.int64) >> 52) & 0x7FF) - 1023
    lo, hi = int(ex[nz].min()), int(ex[nz].max())
    if hi - lo + 1 <= width:
        return [v]
    out = []
    for start in range(lo, hi + 1, width):
        sel = nz & (ex >= start) & (ex < start + width)
        if bool(sel.any()):
            out.append(torch.where(sel, v, 0.0))
    return out


def exact_matmul_f32(va: Any, vb: Any, mbits_a: int, mbits_b: int) -> Any:
    """float32 nearest-even of the exact ``va @ vb`` plus +0 (float64 tensors of decoded narrow floats,
    NaN/Inf as IEEE matmul gives them; a zero result is +0, as ``D = A.B + C`` with ``C = +0`` gives it).
    Band-pair float64 matmuls are exact in any summation order (every partial sum fits 53 bits), so the
    device's BLAS cannot change the result; NaN payloads are the device's."""
    import math

    import torch

    fin_a, fin_b = torch.isfinite(va), torch.isfinite(vb)
    a0, b0 = torch.where(fin_a, va, 0.0), torch.where(fin_b, vb, 0.0)
    k = max(va.shape[-1], 1)
    budget = 53 - math.ceil(math.log2(k)) - mbits_a - mbits_b - 2
    if budget < 2:
        raise ValueError(f"K={k} is too long for an exact float64 band decomposition")
    wa = max(1, budget // 2)
    wb = max(1, budget - wa)
    parts = [pa @ pb for pa in _bands(a0, wa) for pb in _bands(b0, wb)]
    out = parts[0].to(torch.float32) if len(parts) == 1 else rn_sum_f32(torch.stack(parts, -1))
    out = out + 0.0  # D = A.B + C with C = +0: a zero sum is +0, whatever sign the BLAS's order gave it
    if not (bool(fin_a.all()) and bool(fin_b.all())):
        special = va @ vb
        out = torch.where(torch.isfinite(special), out, special.to(torch.float32))
    return out
