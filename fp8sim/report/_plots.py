"""The plots of the reports: matplotlib loaded on demand, a title on every figure, legends beside
the data, and the format-grid, GEMM-error and bit-exact-rate figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..formats import FORMATS

__all__ = ["plt_module", "save_figure", "plot_gemm_k", "plot_rates", "grid_plot", "grid_figure"]


def plt_module() -> Any:
    try:
        import matplotlib

        if "matplotlib.pyplot" not in sys.modules:  # keep the backend of a notebook or an application
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reports draw plots with matplotlib: pip install 'fp8sim[plot]'") from exc
    return plt


def save_figure(fig: Any, ax: Any, path: Path, title: str, legend: bool = False) -> Path:
    """Title on every figure; the legend outside the axes so that it never hides data."""
    plt = plt_module()
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_gemm_k(gemms: list[Any], path: Path) -> Path:
    plt = plt_module()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    # one series per (formats, accumulation) over float32-output tensorwise cases only, so that every
    # point is one case and the ULPs are float32 ULPs
    series: dict[str, dict[int, list[float]]] = {}
    for o in gemms:
        if o.extra["out_dtype"] != "float32" or o.extra["layout"] != "tensorwise":
            continue
        mode = "fast" if o.extra["fast_accum"] else "split"
        for who, key in (("native", "native_vs_exact_mean_ulp"), ("emulator", "emulator_vs_exact_mean_ulp")):
            label = f"{who} {o.extra['formats']} ({mode})"
            series.setdefault(label, {}).setdefault(o.extra["k"], []).append(o.extra[key])
    for label, byk in series.items():
        ks = sorted(byk)
        emu = label.startswith("emulator")
        ax.plot(
            ks,
            [np.mean(byk[k]) + 1e-3 for k in ks],
            marker="x" if emu else "o",
            markersize=7 if emu else 5,
            label=label,
            linestyle="--" if emu else "-",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K")
    ax.set_ylabel("mean ULP distance from the exact sum (+1e-3)")
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, ax, path, "GEMM output: distance from the exact sum against K", legend=bool(series))


def plot_rates(groups: dict[str, list[Any]], path: Path) -> Path:
    plt = plt_module()
    names = list(groups)
    rates = [min(o.rate for o in groups[g]) for g in names]
    fig, ax = plt.subplots(figsize=(7.0, 0.28 * len(names) + 1.4))
    ax.barh(range(len(names)), rates, color=["tab:green" if r == 1 else "tab:orange" for r in rates])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()  # first group on top, as in the table
    ax.set_xlim(0, 1)
    ax.set_xlabel("lowest bit-exact rate in the group")
    return save_figure(fig, ax, path, "Bit-exact rate per op group (green: every op bit-exact)")


def grid_plot(path: Path) -> None:
    """Save :func:`grid_figure` to ``path``."""
    plt = plt_module()
    fig = grid_figure()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def grid_figure() -> Any:
    """Each format's positive finite values on a log2 axis; E8M0 (2^-127 ... 2^127) on its own axis
    below, so that its range does not squash the others."""
    from ..cast._tables import code_values

    plt = plt_module()
    wide = [f for f in FORMATS.values() if f.ebits >= 8]
    narrow = [f for f in FORMATS.values() if f.ebits < 8]
    fig, axes = plt.subplots(
        2, 1, figsize=(7.0, 0.32 * len(FORMATS) + 2.2), gridspec_kw={"height_ratios": [len(narrow), len(wide) + 0.6]}
    )
    for ax, fmts in zip(axes, (narrow, wide), strict=True):
        for i, f in enumerate(fmts):
            v = code_values(f)
            pos = np.unique(v[np.isfinite(v) & (v > 0)])
            ax.scatter(pos, np.full(pos.size, i), s=5, marker="|" if pos.size > 200 else "o")
        ax.set_xscale("log", base=2)
        ax.set_yticks(range(len(fmts)))
        ax.set_yticklabels([f.name for f in fmts])
        ax.set_ylim(-0.6, len(fmts) - 0.4)
        ax.invert_yaxis()
        ax.grid(True, axis="x", alpha=0.3)
    axes[1].set_xlabel("positive finite values (log2 axis)")
    axes[1].set_title("formats with 8 exponent bits (own axis)", fontsize=8)
    fig.suptitle("Value grids of every format", fontsize=10)
    fig.tight_layout()
    return fig
