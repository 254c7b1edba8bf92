"""The default report's causal-leakage study of FP8 attention (TE#3248) and of the BF16 options that
remove the leak (cuDNN-frontend PR#983 ``pv_bf16``, PR#1123 ``dqkv_bf16``).

One causal ``DotProductAttention`` step per variant on fixed random Q, K, V, dO; then every token after
t is multiplied by 100 and the step is run again on the same module.  The study reports how far O and
dQ at positions ``<= t`` moved: exactly 0 is the causal law, anything else is the leak.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["VARIANTS", "causal_leak", "causal_leak_section"]

# (label, recipe kind, DotProductAttention options)
VARIANTS = (
    ("current scaling", "current", {}),
    ("MXFP8", "mxfp8", {}),
    ("MXFP8, pv_bf16", "mxfp8", {"pv_bf16": True}),
    ("MXFP8, pv_bf16 + dqkv_bf16", "mxfp8", {"pv_bf16": True, "dqkv_bf16": True}),
)


def _step(make: Any, recipe: Any, q: Any, k: Any, v: Any, do: Any) -> tuple[Any, Any]:
    """O and dQ of one step of a fresh module (current scaling's S/dP state starts the same each time)."""
    from ..pytorch.quantization import autocast

    dpa = make()
    q = q.clone().requires_grad_()
    with autocast(recipe=recipe):
        out = dpa(q, k, v)
    out.backward(do)
    return out.detach(), q.grad


def causal_leak(
    positions: tuple[int, ...] = (31, 47, 63, 100, 127), *, s: int = 128, heads: int = 2, dim: int = 64, seed: int = 3
) -> dict[str, dict[str, list[float]]]:
    """``{variant: {"O": [...], "dQ": [...]}}``: the largest change of O[:, :t+1] and of dQ[:, :t+1]
    (bshd) for each t in ``positions`` when only the tokens after t are multiplied by 100."""
    import torch

    from ..pytorch.attention import DotProductAttention
    from ..recipe import Float8CurrentScaling, MXFP8BlockScaling

    recipes = {"current": Float8CurrentScaling(fp8_dpa=True), "mxfp8": MXFP8BlockScaling(fp8_dpa=True)}
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, s, heads, dim, generator=g) for _ in range(4))
    do = do.reshape(1, s, heads * dim)
    out: dict[str, dict[str, list[float]]] = {}
    for label, kind, options in VARIANTS:

        def make(options: dict = options) -> Any:
            return DotProductAttention(heads, dim, qkv_format="bshd", attn_mask_type="causal", **options)

        o_base, dq_base = _step(make, recipes[kind], q, k, v, do)
        res: dict[str, list[float]] = {"O": [], "dQ": []}
        for t in positions:
            q2, k2, v2 = (x.clone() for x in (q, k, v))
            for x in (q2, k2, v2):
                x[:, t + 1 :] *= 100.0
            o, dq = _step(make, recipes[kind], q2, k2, v2, do)
            res["O"].append(float((o[:, : t + 1] - o_base[:, : t + 1]).abs().max()))
            res["dQ"].append(float((dq[:, : t + 1] - dq_base[:, : t + 1]).abs().max()))
        out[label] = res
    return out


def causal_leak_section(out: Path, quick: bool) -> list[str]:
    """Markdown lines (and ``attention_leak.png`` in ``out``) of the study; one line when torch is missing."""
    lines = ["", "## Causal leakage in FP8 attention", ""]
    try:
        import torch  # noqa: F401
    except ImportError:
        return lines + ["Not run: the study needs torch (`pip install 'fp8sim[torch]'`)."]
    positions = (31, 47, 127) if quick else (15, 31, 47, 63, 100, 127)
    res = causal_leak(positions)
    head = [f"O, t={t}" for t in positions] + [f"dQ, t={t}" for t in positions]
    lines += [
        "Causal attention must not let position t see tokens after t (TE#3248).  One `DotProductAttention` step",
        "(128 tokens, 2 heads of 64), then every token after t multiplied by 100 and the step run again: the",
        "largest change of the outputs O and of the query gradients dQ at positions <= t (0 = no leak).",
        "Current scaling leaks through its one amax; MXFP8 through the E8M0 scales that V (forward) and K (dQ)",
        "share with later tokens of their 32-token block (t = 31, 63, 127 end a block).  `pv_bf16` (cuDNN-frontend",
        "PR#983: P V on BF16 operands) removes the forward leak and `dqkv_bf16` (PR#1123) the backward one.",
        "",
        "| attention | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for label, r in res.items():
        lines.append(f"| {label} | " + " | ".join(f"{x:.2g}" for x in r["O"] + r["dQ"]) + " |")
    from ._plots import plt_module, save_figure

    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for label, r in res.items():
        for ax, key in zip(axes, ("O", "dQ"), strict=True):
            ax.plot(positions, [max(x, 1e-12) for x in r[key]], marker="o", label=label)
    for ax, key in zip(axes, ("O", "dQ"), strict=True):
        ax.set(yscale="log", xlabel="t (last unchanged position)", title=f"change of {key}[:t+1] (1e-12 = none)")
    save_figure(fig, axes[1], out / "attention_leak.png", "Future tokens leaking into causal FP8 attention", True)
    return lines + ["", "![attention leak](attention_leak.png)"]
