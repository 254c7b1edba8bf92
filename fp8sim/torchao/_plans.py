"""The plans of a ``Float8Linear``'s GEMMs for ``fp8sim explain`` (:mod:`fp8sim.gemm.plans`)."""

from __future__ import annotations

from typing import Any

from ..gemm.plans import GemmPlan, current_recorder
from ..gemm.profiles import SplitKUnknownError

__all__ = ["record_gemm"]


def record_gemm(spec: Any, dims: tuple, fmts: tuple, layout: str, out: Any, acc: Any, prof: Any) -> bool:
    """The GEMM's plan for ``fp8sim explain`` (its profile's decision for tensorwise scales, a given split
    otherwise); True under a dry recorder (compute cheaply)."""
    rec = current_recorder()
    if rec is None:
        return False
    m, n, k = (int(d) for d in dims)
    out_name = str(out).removeprefix("torch.")
    split, scheme, source, note = 1, "none", "preset" if acc is not None else "default", ""
    if prof is not None:
        try:
            if layout == "tensorwise":
                d = prof.decide(m, n, k, out_name, spec.use_fast_accum, fmts[0], fmts[1])
                split, scheme, source, note = d.S, d.scheme, d.source, d.note
            else:
                keys = [key for key in ((m, n, k, out_name, spec.use_fast_accum), (m, n, k)) if key in prof.splits]
                if not keys:
                    raise SplitKUnknownError(
                        f"profile {prof.name!r} records the split-K of tensorwise-scaled calls only; this GEMM has "
                        f"rowwise scales: give its split with with_splits({{({m}, {n}, {k}): (S, scheme)}})"
                    )
                split, scheme = prof.splits[keys[0]]
                source = "override"
        except SplitKUnknownError as e:
            if not rec.dry:
                raise
            split, scheme, source, note = None, "?", "unknown", str(e)
    if acc is None:
        acc_name = "torchao emulate"
    elif prof is not None:
        acc_name = prof.accumulator_for(spec.use_fast_accum)
    elif isinstance(acc, str):
        acc_name = f"{acc}_{'fast' if spec.use_fast_accum else 'split'}" if acc != "blackwell" else acc
    else:
        acc_name = acc.name
    name = rec.name(spec.site) or type(spec.site).__name__
    rec.add(
        GemmPlan(
            name, "", spec.role, m, n, k, fmts[0], fmts[1], layout, out_name, spec.use_fast_accum, acc_name,
            None if prof is None else prof.name, split, scheme, source, note,
        )
    )  # fmt: skip
    return rec.dry and acc is not None
