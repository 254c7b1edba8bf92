"""``fp8sim study``: train a small built-in model under every recipe on the CPU and compare.

The task is generated here: a fixed random teacher network maps heavy-tailed inputs to targets;
the student (LayerNormMLP blocks and a Linear head from ``fp8sim.pytorch``) learns it with Adam.
Each run starts from the same weights and sees the same batches, so the loss curves differ only by
the numerics.  An unsound set-up (E4M3 gradients with scaling disabled: small gradients underflow)
is included to show that the emulator tells good numerics from bad.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._util.args import as_int
from .._util.progress import Progress

__all__ = ["StudyResult", "run_study", "write_study", "plot_losses", "STUDY_RECIPES"]

STUDY_RECIPES = (
    "fp32",
    "bf16",
    "delayed_hybrid",
    "current",
    "mxfp8",
    "block",
    "nvfp4",
    "torchao_tensorwise",
    "torchao_rowwise",
    "unsound_e4m3_grads_unscaled",
)


@dataclass
class StudyResult:
    recipes: list[str]
    losses: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def final(self, name: str, window: int = 10) -> float:
        """Mean loss over the last ``window`` steps."""
        tail = self.losses[name][-window:]
        return sum(tail) / len(tail)

    def table(self) -> str:
        ref = self.final("fp32") if "fp32" in self.losses else float("nan")
        lines = [
            "| recipe | final loss | vs fp32 | overflow | underflow | delayed scales (min..max) | seconds |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.recipes:
            s = self.stats.get(r, {})
            n = max(s.get("elements", 0), 1)
            ovf = f"{s['overflow'] / n:.2e}" if "overflow" in s else "-"
            udf = f"{s['underflow'] / n:.2e}" if "underflow" in s else "-"
            sc = f"{s['scale_min']:.3g}..{s['scale_max']:.3g}" if "scale_min" in s else "-"
            loss = f"{self.final(r):.4g} | {self.final(r) / ref:.3f}x"
            lines.append(f"| {r} | {loss} | {ovf} | {udf} | {sc} | {self.seconds[r]:.1f} |")
        return "\n".join(lines)


def _recipe_for(name: str) -> Any:
    import torch

    from ..recipe import (
        DelayedScaling,
        Float8BlockScaling,
        Float8CurrentScaling,
        Format,
        MXFP8BlockScaling,
        NVFP4BlockScaling,
    )

    def no_scaling(amax: Any, old: Any, fp8_max: Any, recipe: Any) -> Any:
        return torch.ones_like(old)

    return {
        "delayed_hybrid": DelayedScaling(amax_history_len=16),
        "current": Float8CurrentScaling(),
        "mxfp8": MXFP8BlockScaling(),
        "block": Float8BlockScaling(),
        "nvfp4": NVFP4BlockScaling(),
        "unsound_e4m3_grads_unscaled": DelayedScaling(fp8_format=Format.E4M3, scaling_factor_compute_algo=no_scaling),
    }.get(name)


def _model(d: int, hidden: int, depth: int, torch: Any) -> Any:
    from .. import pytorch as te

    class Student(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(te.LayerNormMLP(d, hidden) for _ in range(depth))
            self.head = te.Linear(d, 16)

        def forward(self, x: Any) -> Any:
            for b in self.blocks:
                x = x + b(x)
            return self.head(x)

    return Student()


def run_study(
    recipes: tuple[str, ...] = STUDY_RECIPES,
    *,
    steps: int = 150,
    batch: int = 64,
    d: int = 64,
    hidden: int = 128,
    depth: int = 2,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
    threads: int | None = 1,
) -> StudyResult:
    """Train one student per recipe; returns loss curves and FP8 statistics.

    ``threads``: torch's intra-op threads while training (restored afterwards).  The default 1 is
    the fastest for matrices this small, and it keeps the run from slowing down tenfold on a busy
    machine, where torch's default of one thread per core oversubscribes the CPU; None keeps
    torch's setting."""
    from .._util.deps import require

    torch = require("torch", "fp8sim.study")
    from .. import pytorch as te

    unknown = [r for r in recipes if r not in STUDY_RECIPES]
    if unknown:
        raise ValueError(f"unknown study recipes {unknown}; known: {', '.join(STUDY_RECIPES)}")
    steps = as_int(steps, "steps", lo=1)
    threads = None if threads is None else as_int(threads, "threads", lo=1)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train_all(recipes, steps, batch, d, hidden, depth, lr, seed, progress, torch, te)
    finally:
        torch.set_num_threads(saved)


def _train_all(
    recipes: tuple[str, ...],
    steps: int,
    batch: int,
    d: int,
    hidden: int,
    depth: int,
    lr: float,
    seed: int,
    progress: bool,
    torch: Any,
    te: Any,
) -> StudyResult:
    torch.manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.Tanh(), torch.nn.Linear(4 * d, 16))
    gen = torch.Generator().manual_seed(seed + 1)
    data = []
    for _ in range(steps):
        x = torch.randn(batch, d, generator=gen) * torch.exp2(torch.randint(-3, 4, (batch, 1), generator=gen).float())
        with torch.no_grad():
            data.append((x, teacher(x) * 10))
    torch.manual_seed(seed + 2)
    init = _model(d, hidden, depth, torch).state_dict()
    result = StudyResult(list(recipes))
    bar = Progress(len(recipes) * steps, progress, prefix="study ")
    for name in recipes:
        model = _model(d, hidden, depth, torch)
        model.load_state_dict(init, strict=False)
        step_fn = _step_fn(name, model, torch, te)
        for m in model.modules():
            if hasattr(m, "collect_stats"):
                m.collect_stats(True)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        t0 = time.perf_counter()
        for x, y in data:
            opt.zero_grad()
            loss = step_fn(x, y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            bar.step(name)
        result.seconds[name] = time.perf_counter() - t0
        result.losses[name] = [v if math.isfinite(v) else float("nan") for v in losses]
        stats: dict[str, Any] = {}
        scales: list[float] = []
        for m in model.modules():
            for k, v in getattr(m, "fp8_stats", {}).items():
                stats[k] = stats.get(k, 0) + v
            for g in getattr(m, "fp8_gemms", {}).values():
                if g.fwd is not None:  # delayed scaling: the final INPUT/WEIGHT and GRAD_OUTPUT scales
                    scales += [float(g.fwd.scale[0]), float(g.fwd.scale[1]), float(g.bwd.scale[0])]
        if scales:
            stats["scale_min"], stats["scale_max"] = min(scales), max(scales)
        result.stats[name] = stats
    return result


def _step_fn(name: str, model: Any, torch: Any, te: Any) -> Callable[[Any, Any], Any]:
    mse = torch.nn.functional.mse_loss
    if name == "fp32":
        return lambda x, y: mse(model(x), y)
    if name == "bf16":

        def bf16(x: Any, y: Any) -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            return mse(out.float(), y)

        return bf16
    if name.startswith("torchao_"):
        from ..torchao import Float8LinearConfig, convert_to_float8_training

        head = torch.nn.Sequential(*[torch.nn.Linear(m.in_features, m.out_features) for m in [model.head]])
        head[0].weight, head[0].bias = model.head.weight, model.head.bias
        cfg = Float8LinearConfig.from_recipe_name(name.split("_", 1)[1])
        fp8_head = convert_to_float8_training(head, config=cfg)
        model.head = fp8_head  # torchao converts nn.Linear; the blocks stay in fp32
        return lambda x, y: mse(model(x), y)
    recipe = _recipe_for(name)

    def fp8(x: Any, y: Any) -> Any:
        with te.autocast(recipe=recipe):
            out = model(x)
        return mse(out, y)

    return fp8


def plot_losses(result: StudyResult, fig: Any = None) -> Any:
    """The loss curves (log scale) above each run's loss relative to fp32 (a 10-step running mean),
    one colour and line style per run, the unsound run thick and red; the legend beside the axes.
    Returns the matplotlib figure."""
    from .build import _plt

    plt = _plt()
    if fig is None:
        fig = plt.figure(figsize=(8.0, 6.4))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    styles = ["-", "--", "-.", (0, (5, 1)), (0, (3, 1, 1, 1))]
    palette = [c for j, c in enumerate(plt.get_cmap("tab10").colors) if j != 3]  # red marks the unsound run
    ref = _running_mean(result.losses["fp32"]) if "fp32" in result.losses else None
    for i, r in enumerate(result.recipes):
        unsound = r.startswith("unsound")
        kw = (
            {"color": "tab:red", "linewidth": 2.4, "linestyle": ":", "zorder": 5}
            if unsound
            else {"color": palette[i % len(palette)], "linewidth": 1.3, "linestyle": styles[i % len(styles)]}
        )
        top.plot(result.losses[r], label=r, **kw)
        if ref is not None:
            rel = [a / b if b > 0 else float("nan") for a, b in zip(_running_mean(result.losses[r]), ref, strict=True)]
            bottom.plot(rel, **kw)
    top.set_yscale("log")
    top.set_ylabel("training loss (MSE, log)")
    top.set_title("FP8 training study: loss per step (same weights and batches for every run)", fontsize=10)
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    bottom.axhline(1.0, color="black", linewidth=0.8)
    bottom.set_ylabel("loss / fp32 loss\n(10-step mean)")
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    return fig


def _running_mean(v: list[float], window: int = 10) -> list[float]:
    out, acc = [], []
    for x in v:
        acc.append(x)
        tail = acc[-window:]
        out.append(sum(tail) / len(tail))
    return out


def write_study(result: StudyResult, out_dir: str | Path, *, force: bool = False) -> Path:
    """Loss curves (CSV + PNG) and the table (Markdown) into ``out_dir``, built in a temporary folder
    and published whole; returns the README.md path."""
    from .build import _plt, publish_dir

    _plt()
    return publish_dir(out_dir, "study", lambda d: _write_study_into(result, d), force=force)


def _write_study_into(result: StudyResult, out: Path) -> Path:
    with open(out / "losses.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *result.recipes])
        for i in range(len(result.losses[result.recipes[0]])):
            w.writerow([i, *[f"{result.losses[r][i]:.6g}" for r in result.recipes]])
    from .build import _plt

    plt = _plt()
    fig = plot_losses(result)
    fig.savefig(out / "losses.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    text = "\n".join(
        [
            "# FP8 training study",
            "",
            "A residual MLP student (LayerNormMLP blocks + Linear head, fp8sim.pytorch) learns a fixed random teacher",
            "on heavy-tailed inputs; same initial weights and batches for every recipe.  Overflow and underflow are",
            "fractions of quantized elements that saturated or flushed to zero; delayed scales are the final INPUT,",
            "WEIGHT and GRAD_OUTPUT scales of every GEMM.",
            "",
            result.table(),
            "",
            "![loss curves](losses.png)",
            "",
        ]
    )
    path = out / "README.md"
    path.write_text(text)
    return path
