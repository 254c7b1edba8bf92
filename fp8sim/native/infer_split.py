"""Which split-K did the kernel use?  Search ``split_k=(S, scheme)`` for a captured ``_scaled_mm``.

cuBLAS picks a split per shape, dtype and workspace by a heuristic (mmaemu's recorded tables show
it is not a function of the shape alone), so a capture that does not match the unsplit model is
searched: S in 1..16 under every scheme of :mod:`fp8sim.gemm.splitk`, smallest S first.  The first
candidate that reproduces every output bit for bit is the match; otherwise the closest candidate
(most equal outputs) and its agreement are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..gemm import scaled_mm
from ..gemm.splitk import SCHEMES

__all__ = ["SplitInference", "infer_split", "split_groups_section"]


@dataclass(frozen=True)
class SplitInference:
    """``match``: the first ``(S, scheme)`` that reproduces the capture (None: none does);
    ``closest`` and ``agreement``: the best candidate and its fraction of equal outputs."""

    match: tuple[int, str] | None
    closest: tuple[int, str]
    agreement: float
    tried: int

    def describe(self) -> str:
        if self.match is not None:
            return f"matches with split_k={self.match!r}"
        return f"no candidate matches; closest split_k={self.closest!r} agrees on {self.agreement:.2%}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "match": list(self.match) if self.match else None,
            "closest": list(self.closest),
            "agreement": self.agreement,
            "tried": self.tried,
            "text": self.describe(),
        }


def _candidates(max_splits: int, schemes: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(1, "none")] + [(s, sc) for s in range(2, max_splits + 1) for sc in schemes]


def infer_split(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    bits: np.ndarray,
    *,
    accumulator: str,
    out_dtype: str,
    a_format: str,
    b_format: str,
    max_splits: int = 16,
    schemes: tuple[str, ...] = SCHEMES,
) -> SplitInference:
    """Search the split of a captured GEMM: ``a``/``b`` code arrays, ``bits`` the captured output's
    bit patterns (int32 for float32 output, int16 for bfloat16/float16)."""
    if max_splits < 1:
        raise ValueError(f"max_splits must be >= 1, got {max_splits}")
    bad = [s for s in schemes if s not in SCHEMES]
    if bad:
        raise ValueError(f"schemes must be among {', '.join(SCHEMES)}; got {bad}")
    kw = {"accumulator": accumulator, "out_dtype": out_dtype, "a_format": a_format, "b_format": b_format}
    want = np.asarray(bits).reshape(-1)
    best, best_eq, tried = (1, "none"), -1, 0
    for cand in _candidates(max_splits, schemes):
        got = np.ascontiguousarray(scaled_mm(a, b, scale_a, scale_b, split_k=cand, strict=False, **kw))
        eq = int((got.view(want.dtype).reshape(-1) == want).sum())
        tried += 1
        if eq == want.size:
            return SplitInference(cand, cand, 1.0, tried)
        if eq > best_eq:
            best, best_eq = cand, eq
    return SplitInference(None, best, best_eq / max(want.size, 1), tried)


def split_groups_section(ops: list[Any]) -> list[str]:
    """Markdown lines grouping compared GEMMs by inferred split (ops carrying ``split_inference``)."""
    groups: dict[str, list[str]] = {}
    for o in ops:
        inf = getattr(o, "extra", {}).get("split_inference")
        if inf is None:
            continue
        key = f"split_k=({inf['match'][0]}, {inf['match'][1]!r})" if inf["match"] else "no split matches"
        groups.setdefault(key, []).append(f"{o.name} ({inf['text']})" if not inf["match"] else o.name)
    if not groups:
        return []
    lines = ["", "## GEMMs by inferred split-K", "", "| inferred split | GEMMs |", "|---|---|"]
    for key, names in sorted(groups.items()):
        lines.append(f"| {key} | {'<br>'.join(names)} |")
    return lines
