"""GEMM plans: what each GEMM of a program does, recorded while it runs (``fp8sim explain``).

A :class:`GemmPlan` is one GEMM's shape, operand formats and scaling, output dtype, accumulator and split-K
decision with where the decision came from; the integrations (TE modules, ``general_gemm``, FP8 attention,
torchao's ``Float8Linear``) add one to the active :class:`PlanRecorder` for every GEMM they run inside
:func:`record_plans`.  A dry recorder (``dry=True``) asks the integrations to compute each GEMM on the cheap
default path while the plan is still that of the requested accumulator or profile, and to record an unknown
split-K as a plan (``source="unknown"``, the reason in ``note``) instead of raising.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GemmPlan", "PlanRecorder", "record_plans", "current_recorder", "PLANS_FORMAT"]

PLANS_FORMAT = "fp8sim-gemm-plans/1"

# where a split decision comes from: a profile's table / envelope / live query (mmaemu's), a split given
# with DeviceProfile.with_splits, none to take (zero-size), no split-K model (a preset, the default path),
# cuDNN (FP8 attention: not cuBLAS), or unknown (SplitKUnknownError under a dry recorder)
SOURCES = ("table", "envelope", "live-query", "override", "rule", "zero-size", "preset", "default", "cudnn", "unknown")


@dataclass(frozen=True)
class GemmPlan:
    """One GEMM: ``out[M, N] = a[M, K] @ b[K, N]`` (torch's orientation, the one the split tables are keyed
    by) with ``a_format``/``b_format`` and ``scaling`` (e.g. "tensorwise", "e4m3 1x32 blocks"),
    ``out_dtype``, ``use_fast_accum`` (None where it does not apply), ``accumulator`` (the preset that runs
    it), ``profile`` (its name, or None), ``split`` (S; None when unknown) and ``scheme``, ``source`` (see
    ``SOURCES``) and ``note``.  ``module`` and ``gemm`` name it (``gemm``: "fc1", "gemm0", ... or "");
    ``role`` is "fprop", "dgrad", "wgrad", or an attention GEMM ("QK^T", "PV", "dV", "dP", "dQ", "dK");
    ``batch``: how many such GEMMs one call runs (attention's batch x heads)."""

    module: str
    gemm: str
    role: str
    m: int
    n: int
    k: int
    a_format: str
    b_format: str
    scaling: str
    out_dtype: str
    use_fast_accum: bool | None
    accumulator: str
    profile: str | None
    split: int | None
    scheme: str
    source: str
    note: str = ""
    batch: int = 1

    def key(self) -> tuple:
        return tuple(asdict(self).values())


@dataclass
class PlanRecorder:
    """The plans recorded in one :func:`record_plans` region, in order (every call, repeats included).
    ``namer`` maps an integration's module object to its name (the explain step's qualified names)."""

    dry: bool = False
    namer: Callable[[Any], str | None] | None = None
    plans: list[GemmPlan] = field(default_factory=list)

    def name(self, module: Any) -> str | None:
        return None if self.namer is None else self.namer(module)

    def add(self, plan: GemmPlan) -> None:
        self.plans.append(plan)

    def unique(self) -> list[tuple[GemmPlan, int]]:
        """Each distinct plan once, in first-seen order, with how many calls it had."""
        seen: dict[tuple, list] = {}
        for p in self.plans:
            entry = seen.setdefault(p.key(), [p, 0])
            entry[1] += 1
        return [(p, n) for p, n in seen.values()]

    @property
    def unknown(self) -> list[GemmPlan]:
        """The plans whose split-K decision the profile does not know."""
        return [p for p, _ in self.unique() if p.source == "unknown"]

    def table(self) -> str:
        """A fixed-width text table, one row per distinct plan, then the notes of the unknown ones."""
        head = ("module", "role", "M", "N", "K", "operands", "out", "accumulator", "split", "from", "calls")
        rows = [head]
        for p, n in self.unique():
            name = p.module + (f" ({p.gemm})" if p.gemm else "")
            split = "?" if p.split is None else (str(p.split) if p.split == 1 else f"{p.split} {p.scheme}")
            ops = f"{p.a_format} x {p.b_format}" + ("" if p.scaling == "tensorwise" else f" ({p.scaling})")
            acc = p.accumulator + ("" if p.use_fast_accum is None else (" fast" if p.use_fast_accum else " split"))
            role = p.role + (f" x{p.batch}" if p.batch > 1 else "")
            rows.append((name, role, str(p.m), str(p.n), str(p.k), ops, p.out_dtype, acc, split, p.source, str(n)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        numeric = {2, 3, 4, 10}

        def line(r: tuple) -> str:
            cells = (c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            return "  ".join(cells).rstrip()

        lines = [line(r) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        profiles = sorted({p.profile for p in self.plans if p.profile})
        for name in profiles:
            lines.append(f"\nprofile {name}: {_description(name)}")
        unknown = self.unknown
        if unknown:
            lines.append(f"\n{len(unknown)} GEMM(s) with a split-K the profile does not know (split ?):")
            lines += [f"  {p.module} {p.role}: {p.note.split('. Ways out')[0]}" for p in unknown]
            for name in sorted({p.profile for p in unknown if p.profile}):
                shapes = ", ".join(dict.fromkeys(f"({p.m}, {p.n}, {p.k}): (S, scheme)" for p in unknown))
                lines.append(
                    f"Ways out: accumulator=get_profile({name!r}).with_splits({{{shapes}}}) with the splits your GPU "
                    "used ((1, 'none'): unsplit), or an instruction preset (unsplit GEMMs)"
                )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The distinct plans with their call counts, under a format version (``PLANS_FORMAT``)."""
        return {"format": PLANS_FORMAT, "plans": [{**asdict(p), "calls": n} for p, n in self.unique()]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        return self.table()


_STACK: list[PlanRecorder] = []


def current_recorder() -> PlanRecorder | None:
    """The innermost active recorder, or None."""
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def record_plans(dry: bool = False, namer: Callable[[Any], str | None] | None = None) -> Iterator[PlanRecorder]:
    """Record the plan of every GEMM the integrations run inside (see the module docstring)."""
    rec = PlanRecorder(dry=bool(dry), namer=namer)
    _STACK.append(rec)
    try:
        yield rec
    finally:
        # by identity: recorders are dataclasses, and list.remove would drop an equal outer one
        del _STACK[max(i for i, r in enumerate(_STACK) if r is rec)]


def _description(profile: str) -> str:
    from .profiles import PROFILES

    p = PROFILES.get(profile)
    return p.description if p is not None else "a user's DeviceProfile"
