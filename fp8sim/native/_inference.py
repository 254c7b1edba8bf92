"""The answer of the rule inferences (:mod:`fp8sim.native.infer_rounding`, :mod:`fp8sim.native.infer_gemm`):
candidates with the fraction of outputs each explains, a verdict, and the compare report's section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate", "Inference", "inference_section"]


@dataclass(frozen=True)
class Candidate:
    """One explanation and the fraction of compared elements it reproduces; ``params``: its settings."""

    name: str
    fraction: float
    deterministic: bool = True
    params: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Inference:
    """Candidates best first (``n`` elements compared) and notes (e.g. on NaN inputs)."""

    what: str
    n: int
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = ()

    @property
    def matches(self) -> tuple[Candidate, ...]:
        """The deterministic candidates that explain every element."""
        return tuple(c for c in self.candidates if c.deterministic and c.fraction == 1.0)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def describe(self) -> str:
        if not self.candidates:
            return f"no {self.what} candidate could be evaluated"
        m = self.matches
        if m:
            text = f"explained by {m[0].name}"
            if len(m) > 1:
                text += f" (equally: {', '.join(c.name for c in m[1:])}: the data do not tell them apart)"
            return text
        closest = self.best
        det = next((c for c in self.candidates if c.deterministic), None)
        sr = [c for c in self.candidates if not c.deterministic and c.fraction == 1.0]
        if sr:
            tail = f"; closest deterministic: {det.name} explains {det.fraction:.2%}" if det is not None else ""
            return f"stochastic-rounding compatible ({sr[0].name}: every output is one of its two neighbours){tail}"
        return f"no {self.what} candidate explains every output; closest: {closest.name} ({closest.fraction:.2%})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "n": self.n,
            "matches": [c.name for c in self.matches],
            "candidates": [{"name": c.name, "fraction": c.fraction, **c.params} for c in self.candidates],
            "notes": list(self.notes),
            "text": self.describe(),
        }

    def table(self, top: int | None = None) -> str:
        """Markdown: every candidate (or the ``top`` best) and the fraction it explains."""
        rows = ["| candidate | explains |", "|---|---:|"]
        rows += [f"| {c.name} | {c.fraction:.4%} |" for c in self.candidates[:top]]
        return "\n".join(rows)


def inference_section(ops: list[Any]) -> list[str]:
    """Markdown lines: every compared op that carries an inference (``rule_inference`` or
    ``accumulator_inference`` in its extra) with the verdict and its three best candidates."""
    rows = []
    for o in ops:
        for key in ("rule_inference", "accumulator_inference"):
            inf = getattr(o, "extra", {}).get(key)
            if inf is None:
                continue
            top = ", ".join(f"{c['name']} {c['fraction']:.2%}" for c in inf["candidates"][:3]) or "-"
            notes = ("<br>" + "<br>".join(inf["notes"])) if inf["notes"] else ""
            rows.append(f"| {o.name} | {inf['text']}{notes} | {top} |")
    if not rows:
        return []
    head = ["", "## Rules inferred from the outputs", ""]
    head += [
        "For each op, the rounding rule, format and saturation (casts) or the accumulator preset or device",
        "profile (GEMMs) that reproduce the captured outputs, with the fraction of outputs each candidate explains.",
        "",
        "| op | verdict | best candidates |",
        "|---|---|---|",
    ]
    return head + rows
