"""Throughput of ``quantize_mx`` (MX, 32-element blocks) on 16M float32 elements, as ratios against
torchao 0.18 ``to_mx`` (eager, CPU) timed in the same run (see benchmarks/README.md).

Run: ``python benchmarks/bench_mx.py [--n 16777216] [--cols 4096] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable

import numpy as np

from fp8sim.scaling.mx import quantize_mx


def paired(anchor: Callable[[], object], case: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    """Run anchor and case alternately; return (best anchor time, best case time, median ratio of
    the paired runs), so load from other processes on a shared machine hits both sides alike."""
    anchor(), case()  # warm-up: builds the cast tables
    ta, tc = [], []
    for _ in range(repeat):
        for fn, out in ((anchor, ta), (case, tc)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return min(ta), min(tc), float(np.median(np.array(ta) / np.array(tc)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rep, cols = args.repeat, args.cols
    x = np.random.default_rng(0).standard_normal((args.n // cols, cols)).astype(np.float32)
    n = x.size

    logging.disable(logging.WARNING)  # torchao logs missing CUDA extensions on import
    import torch
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    t = torch.from_numpy(x)
    tb = t.to(torch.bfloat16)

    # the benchmark is of identical results: check them once
    s, d = to_mx(t, torch.float8_e4m3fn, 32)
    q = quantize_mx(x)
    assert np.array_equal(q.scales, s.view(torch.uint8).numpy()), "scales differ from torchao"
    assert np.array_equal(q.codes, d.view(torch.uint8).numpy()), "codes differ from torchao"

    e4m3, fp4, rceil = torch.float8_e4m3fn, torch.float4_e2m1fn_x2, ScaleCalculationMode.RCEIL
    floor = ScaleCalculationMode.FLOOR
    cases = [  # (fp8sim case, its quantize_mx call, torchao anchor: to_mx args, torch threads)
        ("e4m3 floor, last dim", lambda: quantize_mx(x), (t, e4m3, floor), 2),
        ("e4m3 floor, last dim", lambda: quantize_mx(x), (t, e4m3, floor), 1),
        ("e4m3 floor, dim 0 (columnwise)", lambda: quantize_mx(x, axis=0), (t, e4m3, floor), 2),
        ("e4m3 rceil, flavor=te", lambda: quantize_mx(x, scale_rule="rceil", flavor="te"), (t, e4m3, floor), 2),
        ("e4m3 rceil, flavor=torchao", lambda: quantize_mx(x, scale_rule="rceil"), (t, e4m3, rceil), 2),
        ("e4m3 floor, bf16 tensor input", lambda: quantize_mx(tb), (tb, e4m3, floor), 2),
        ("e2m1 floor (unpacked codes)", lambda: quantize_mx(x, "e2m1"), (t, fp4, floor), 2),
    ]
    print(f"n = {n:,} float32 elements ({x.shape[0]} x {cols}), {rep} paired runs; fp8sim is single-threaded numpy;")
    print("ratio = median of torchao time / fp8sim time over paired runs (>= 1.0x: not slower than torchao)\n")
    print(
        f"| {'quantize_mx case':<32} | {'torchao to_mx anchor':<40} | {'fp8sim ms':>9} | {'torchao ms':>10} | ratio |"
    )
    print(f"|{'-' * 34}|{'-' * 42}|{'-' * 11}|{'-' * 12}|-------|")
    for label, case, (data, elem, mode), threads in cases:
        torch.set_num_threads(threads)
        ta, tc, ratio = paired(lambda data=data, elem=elem, mode=mode: to_mx(data, elem, 32, mode), case, rep)
        dtype = str(data.dtype).removeprefix("torch.")
        anchor = f"{dtype}, {str(elem).removeprefix('torch.')}, {mode.name}, {threads} thr"
        print(f"| {label:<32} | {anchor:<40} | {tc * 1e3:9.1f} | {ta * 1e3:10.1f} | {ratio:4.2f}x |")


if __name__ == "__main__":
    main()
