"""FP8 training speed on the CPU: batch 4096, 2048 -> 2048, forward + backward, ratios in one run.

fp8sim ``Linear`` under DelayedScaling (exact products summed in float32) against ``torch.nn.Linear``
in float32 and against torchao's ``Float8Linear(emulate=True)``; then ``LayerNormMLP`` (RMSNorm,
swiglu; hidden 1024, ffn 2048, batch 2048) against the same MLP built from torch modules in
float32 and with torchao's emulated ``Float8Linear`` layers (see benchmarks/README.md).

Run: ``python benchmarks/bench_training.py [--quick]``
"""

from __future__ import annotations

import argparse

import torch
from bench_cast import best_of

import fp8sim.pytorch as te
from fp8sim.recipe import DelayedScaling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    b, d = (512, 512) if args.quick else (4096, 2048)
    x = torch.randn(b, d, requires_grad=True)
    g = torch.randn(b, d)
    ref = torch.nn.Linear(d, d)
    m = te.Linear(d, d)
    recipe = DelayedScaling()

    def run_ref() -> None:
        ref(x).backward(g)

    def run_fp8() -> None:
        with te.autocast(recipe=recipe):
            y = m(x)
        y.backward(g)

    rows = [("torch.nn.Linear fp32 [anchor]", best_of(run_ref, 3))]
    rows.append(("fp8sim Linear, DelayedScaling", best_of(run_fp8, 3)))
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        ao = convert_to_float8_training(
            torch.nn.Sequential(torch.nn.Linear(d, d)), config=Float8LinearConfig(emulate=True)
        )

        def run_ao() -> None:
            ao(x).backward(g)

        rows.append(("torchao Float8Linear(emulate=True), tensorwise", best_of(run_ao, 3)))
    except Exception as exc:  # noqa: BLE001 - torchao missing or failing here
        print(f"(torchao not measured: {exc})")
    anchor = rows[0][1]
    print(f"batch {b}, {d} -> {d}, forward + backward, best of 3; ratio = time / anchor time\n")
    print("| case | time ratio |\n|---|---:|")
    for name, t in rows:
        print(f"| {name} | {t / anchor:.2f}x |")
    if len(rows) == 3:
        print(f"\nfp8sim / torchao emulate: {rows[1][1] / rows[2][1]:.2f}x (target <= 1.0x)")
    mlp_rows(args.quick)


class _TorchMLP(torch.nn.Module):
    """RMSNorm, fc1 (2 x ffn), swiglu, fc2 in torch modules: the reference for LayerNormMLP."""

    def __init__(self, h: int, f: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(h, eps=1e-5)
        self.fc1, self.fc2 = torch.nn.Linear(h, 2 * f), torch.nn.Linear(f, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc1(self.norm(x)).chunk(2, -1)
        return self.fc2(torch.nn.functional.silu(a) * b)


def mlp_rows(quick: bool) -> None:
    b, h, f = (256, 256, 512) if quick else (2048, 1024, 2048)
    x = torch.randn(b, h, requires_grad=True)
    g = torch.randn(b, h)
    ref = _TorchMLP(h, f)
    m = te.LayerNormMLP(h, f, normalization="RMSNorm", activation="swiglu")
    recipe = DelayedScaling()

    def run_ref() -> None:
        ref(x).backward(g)

    def run_fp8() -> None:
        with te.autocast(recipe=recipe):
            y = m(x)
        y.backward(g)

    rows = [("torch RMSNorm + Linear + swiglu + Linear fp32 [anchor]", best_of(run_ref, 3))]
    rows.append(("fp8sim LayerNormMLP(RMSNorm, swiglu), DelayedScaling", best_of(run_fp8, 3)))
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        ao = convert_to_float8_training(_TorchMLP(h, f), config=Float8LinearConfig(emulate=True))

        def run_ao() -> None:
            ao(x).backward(g)

        rows.append(("the same MLP with torchao Float8Linear(emulate=True)", best_of(run_ao, 3)))
    except Exception as exc:  # noqa: BLE001 - torchao missing or failing here
        print(f"(torchao not measured: {exc})")
    anchor = rows[0][1]
    print(f"\nbatch {b}, hidden {h}, ffn {f}, forward + backward, best of 3\n")
    print("| case | time ratio |\n|---|---:|")
    for name, t in rows:
        print(f"| {name} | {t / anchor:.2f}x |")


if __name__ == "__main__":
    main()
