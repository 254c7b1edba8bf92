"""Error of each accumulator against ``exact`` as K grows (for reports and notebooks).

The finding this reproduces (DeepSeek-V3 section 3.3, spec 9.2): Hopper's fast accumulation keeps
about 13 fraction bits along all of K, so its error grows with K, while promoting into float32
every 128 elements keeps it bounded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats import get_format
from .scaled_mm import scaled_mm

__all__ = ["ErrorVsK", "error_vs_k"]

DEFAULT_KS = (128, 256, 512, 1024, 2048, 4096, 8192)
DEFAULT_ACCUMULATORS = ("hopper_fast", "hopper_split", "ada_fast", "blackwell", "dequantized_fp32")


@dataclass
class ErrorVsK:
    """Relative errors ``||D - D_exact||_F / ||D_exact||_F`` (and the largest elementwise relative
    error) per accumulator and K."""

    ks: list[int]
    accumulators: list[str]
    rel_error: dict[str, list[float]] = field(default_factory=dict)
    max_rel_error: dict[str, list[float]] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """Markdown: one row per K, one column per accumulator (Frobenius relative error)."""
        head = "| K | " + " | ".join(self.accumulators) + " |"
        rows = [head, "|---:|" + "---:|" * len(self.accumulators)]
        for i, k in enumerate(self.ks):
            rows.append(f"| {k} | " + " | ".join(f"{self.rel_error[a][i]:.3e}" for a in self.accumulators) + " |")
        return "\n".join(rows)

    def plot(self, path: str | None = None) -> Any:
        """Log-log plot of the error against K; saved to ``path`` (PNG) when given.  Needs matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("plotting needs matplotlib: pip install 'fp8sim[plot]'") from exc
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for a in self.accumulators:
            ax.loglog(self.ks, self.rel_error[a], marker="o", label=a)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (reduction length)")
        ax.set_ylabel("relative error vs exact (Frobenius)")
        s = self.setup
        ax.set_title(f"{s.get('a_format')} x {s.get('b_format')}, {s.get('m')}x{s.get('n')}, {s.get('distribution')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _operand(rng: np.random.Generator, shape: tuple[int, int], fmt: str, distribution: str) -> np.ndarray:
    x = rng.standard_normal(shape)
    if distribution == "positive":
        x = np.abs(x)
    elif distribution != "normal":
        raise ValueError(f"distribution must be 'normal' or 'positive', got {distribution!r}")
    f = get_format(fmt)
    x = np.clip(x * (f.max / 8), -f.max, f.max).astype(np.float32)
    return x.astype(f.ml_dtype).view(np.uint8)


def error_vs_k(
    ks: tuple[int, ...] = DEFAULT_KS,
    accumulators: tuple[str, ...] = DEFAULT_ACCUMULATORS,
    *,
    m: int = 64,
    n: int = 64,
    a_format: str = "e4m3",
    b_format: str = "e4m3",
    distribution: str = "positive",
    seed: int = 0,
    progress: bool = False,
) -> ErrorVsK:
    """Run every accumulator on random ``m x K`` by ``K x n`` FP8 operands for each K.

    ``distribution``: "positive" (|N(0,1)|, the sums grow with K: the worst case for truncation) or
    "normal" (N(0,1), with cancellation).  The same operands (the first K columns of one draw) serve
    every accumulator, so the curves differ only by the summation.
    """
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive lengths, got {ks!r}")
    rng = np.random.default_rng(seed)
    kmax = max(ks)
    a_all = _operand(rng, (m, kmax), a_format, distribution)
    b_all = _operand(rng, (kmax, n), b_format, distribution)
    res = ErrorVsK(list(ks), list(accumulators))
    res.setup = {"m": m, "n": n, "a_format": a_format, "b_format": b_format, "distribution": distribution, "seed": seed}
    one = np.float32(1)
    for i, k in enumerate(ks):
        a, b = a_all[:, :k], b_all[:k]
        kw = {"out_dtype": "float32", "a_format": a_format, "b_format": b_format, "strict": False}
        ref = scaled_mm(a, b, one, one, accumulator="exact", **kw).astype(np.float64)
        norm = float(np.linalg.norm(ref)) or 1.0
        for acc in accumulators:
            d = scaled_mm(a, b, one, one, accumulator=acc, **kw).astype(np.float64)
            res.rel_error.setdefault(acc, []).append(float(np.linalg.norm(d - ref)) / norm)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.abs(d - ref) / np.abs(ref)
            res.max_rel_error.setdefault(acc, []).append(float(np.nanmax(np.where(np.isfinite(rel), rel, np.nan))))
        if progress:
            sys.stderr.write(f"\rerror_vs_k: K={k} ({i + 1}/{len(ks)})")
            sys.stderr.flush()
    if progress:
        sys.stderr.write("\n")
    return res
