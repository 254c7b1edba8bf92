"""The torch-ops chains (``scaled_mm(backend=None | "torch")`` on a device) for the models beyond the
truncating tensorwise ones: ``blackwell_mma`` (exact sum, one nearest-even rounding), MX
(``blackwell`` with E8M0 scales per 32), NVFP4 (packed FP4, UE4M3 scales per 16) and TE's 1x128 by
128x128 blockwise scales (``hopper_split``).  Per case: multiply-adds per second on DEV, the time
ratio to ``torch.matmul`` fp32 there, and the bits against the numpy path on a row slice.

Run: ``python benchmarks/bench_gemm_torch_models.py --device cuda [--quick]`` (``scripts/gpu_session.sh``
runs it on CUDA; ``--device cpu --quick`` is its dry run).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

from fp8sim.gemm import scaled_mm


def _best(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cases(m: int, k: int, n: int, device: str) -> dict[str, tuple[Any, Any, Any, Any, str]]:
    import torch

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    e8 = torch.randint(120, 134, (m, k // 32), generator=g, dtype=torch.uint8)
    e8b = torch.randint(120, 134, (k // 32, n), generator=g, dtype=torch.uint8)
    cases = {
        "blackwell_mma, tensorwise": (x, w.t(), one, one, "blackwell_mma"),
        "blackwell (tcgen05), MX E8M0 per 32": (x, w.t(), e8, e8b, "blackwell"),
        "hopper_split, 1x128 by 128x128 blocks": (
            x, w.t(), torch.rand(m, -(-k // 128), generator=g) + 0.5,
            torch.rand(-(-k // 128), -(-n // 128), generator=g) + 0.5, "hopper_split",
        ),
    }  # fmt: skip
    if hasattr(torch, "float4_e2m1fn_x2"):
        xp = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        wp = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        sa = torch.randint(0x28, 0x48, (m, k // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        sb = torch.randint(0x28, 0x48, (k // 16, n), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        cases["blackwell (tcgen05), NVFP4 UE4M3 per 16"] = (xp, wp.t(), sa, sb, "blackwell")
    return {
        name: (a.to(device), b.to(device), s1.to(device) if s1.dim() else s1.to(device), s2.to(device), acc)
        for name, (a, b, s1, s2, acc) in cases.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args()
    import torch

    dev = args.device
    sm_module = importlib.import_module("fp8sim.gemm.scaled_mm")
    if torch.device(dev).type == "cpu":  # dry run: treat CPU tensors as device operands
        sm_module._keep_on_device = lambda a, b, backend: backend != "numpy"

    def sync() -> None:
        if torch.device(dev).type == "cuda":
            torch.cuda.synchronize()

    m, k, n = (32, 256, 32) if args.quick else (256, 2048, 256)
    print(f"| case ({dev}, {m}x{n}x{k}) | M multiply-adds/s | / torch.matmul fp32 (time) | bits = numpy path |")
    print("|---|---:|---:|:-:|")
    xf, yf = torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)

    def mm() -> None:
        torch.matmul(xf, yf)
        sync()

    t_mm = _best(mm, 3)
    for name, (a, b, sa, sb, acc) in _cases(m, k, n, dev).items():
        kw = {"out_dtype": torch.float32, "accumulator": acc, "strict": False}

        def run(a=a, b=b, sa=sa, sb=sb, kw=kw) -> None:  # noqa: ANN001
            scaled_mm(a, b, sa, sb, **kw)
            sync()

        t = _best(run, 1)
        rows = 8
        blocks = sa.dim() == 2 and sa.shape[0] == m
        got = scaled_mm(a[:rows], b, sa[:rows] if blocks else sa, sb, **kw).cpu()
        ref = scaled_mm(a[:rows].cpu(), b.cpu(), (sa[:rows] if blocks else sa).cpu(), sb.cpu(), backend="numpy", **kw)
        same = torch.equal(got.view(torch.int32), ref.view(torch.int32))
        print(f"| {name} | {m * n * k / t / 1e6:.1f} | {t / t_mm:.0f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
