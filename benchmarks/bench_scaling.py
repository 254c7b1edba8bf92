"""Per-tensor delayed-scaling quantize (amax + scale + cast) against the bare ``encode``, 16M
float32 elements, ratios in one run (see benchmarks/README.md).

Run: ``python benchmarks/bench_scaling.py [--n N] [--repeat R]``
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_cast import best_of

import fp8sim
from fp8sim.recipe import DelayedScaling
from fp8sim.scaling.current import quantize_current_scaling
from fp8sim.scaling.delayed import DelayedScaler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
    scaler = DelayedScaler(DelayedScaling(reduce_amax=False))
    scaler.scale[:] = np.float32(37.5)
    rep = args.repeat
    anchor = best_of(lambda: fp8sim.encode(x, "e4m3"), rep)
    rows = [
        ("bare encode(x, e4m3)  [anchor E]", anchor),
        ("DelayedScaler.quantize (amax + scale + cast)", best_of(lambda: scaler.quantize(0, x), rep)),
        ("quantize_current_scaling (amax, then scale + cast)", best_of(lambda: quantize_current_scaling(x), rep)),
    ]
    print(f"n = {args.n:,} float32 elements, best of {args.repeat}; ratio = anchor time / time\n")
    print(f"| {'case':<52} | ratio vs E |")
    print(f"|{'-' * 54}|-----------:|")
    for name, t in rows:
        print(f"| {name:<52} | {anchor / t:9.2f}x |")


if __name__ == "__main__":
    main()
