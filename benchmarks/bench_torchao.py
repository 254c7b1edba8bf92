"""fp8sim.torchao against torchao itself on the CPU: one training step (forward + backward), ratios in one run.

- ``Float8Linear`` under ``torch.autocast("cpu", dtype=torch.bfloat16)``, tensorwise and rowwise, against
  torchao's ``Float8Linear(emulate=True)`` under the same autocast.
- ``MXFP8Linear(kernel_preference=EMULATED)`` against torchao's ``MXFP8Linear`` (EMULATED), bf16.

Run: ``python benchmarks/bench_torchao.py [--quick]`` (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from collections.abc import Callable

import torch

import fp8sim.torchao as fs


def _paired(ours: Callable[[], None], theirs: Callable[[], None], rounds: int = 5) -> float:
    """Best fp8sim time / best torchao time, the two alternating so load drifts hit both alike."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((ours, theirs)):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return best[0] / best[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    b, d = (256, 256) if args.quick else (2048, 1024)
    import torchao.float8 as ao
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear as AoMX
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP

    x = torch.randn(b, d, requires_grad=True)
    g = torch.randn(b, d)
    rows = []
    for recipe in ("tensorwise", "rowwise"):
        base = torch.nn.Sequential(torch.nn.Linear(d, d))
        cfg = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
        theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=cfg)
        ours = fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe))

        def step(model: torch.nn.Module) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = model(x)
            y.float().backward(g)

        step(ours), step(theirs)  # warm-up
        rows.append(
            (f"Float8Linear {recipe}, CPU autocast bf16", _paired(lambda m=ours: step(m), lambda m=theirs: step(m)))
        )
    xb, gb = x.detach().to(torch.bfloat16).requires_grad_(), g.to(torch.bfloat16)
    theirs = AoMX(d, d, kernel_preference=AoKP.EMULATED).to(torch.bfloat16)
    ours = fs.MXFP8Linear(d, d, kernel_preference="emulated").to(torch.bfloat16)
    ours.load_state_dict(theirs.state_dict())
    rows.append(("MXFP8Linear EMULATED, bf16", _paired(lambda: ours(xb).backward(gb), lambda: theirs(xb).backward(gb))))
    print(f"batch {b}, {d} -> {d}, forward + backward, best of 5 alternating; ratio = fp8sim time / torchao time\n")
    print("| case | fp8sim / torchao |\n|---|---:|")
    for name, r in rows:
        print(f"| {name} | {r:.2f}x |")


if __name__ == "__main__":
    main()
