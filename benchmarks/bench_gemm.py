"""Emulated FP8 GEMM speed, as ratios measured in one run (see benchmarks/README.md).

- ``hopper_fast`` on 512 x 512 x 4096: multiply-adds per second, and the ratio to the slow scalar
  reference of tests/test_gemm_instructions.py (timed on a few outputs, per multiply-add).
- ``dequantized_fp32`` and ``exact`` on 2048^3: time relative to ``torch.matmul`` on float32.
- torch's own CPU ``_scaled_mm`` at 512^3: time relative to ``torch.matmul``, and its ULP distance
  from ``exact`` (it is not a hardware reference: reported, never asserted).

- ``--torch-device DEV`` (e.g. ``cuda``): only the torch-ops chains (``backend="torch"``) on DEV:
  ``hopper_fast`` multiply-adds per second, the time ratio to ``torch.matmul`` on DEV, and the bits
  checked against the numpy path on a row slice (``scripts/gpu_session.sh`` runs it on CUDA).

Run: ``python benchmarks/bench_gemm.py [--quick] [--torch-device DEV]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from bench_cast import best_of

from fp8sim.gemm import INSTRUCTION_MODELS, scaled_mm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_gemm_instructions import reference  # noqa: E402  (the slow scalar reference)


def _codes(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--compiled", action="store_true", help="only the compiled-chain and mmaemu rows")
    ap.add_argument("--torch-device", help="only time the torch-ops chains on this device (e.g. cuda)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    if args.torch_device:
        _print(_torch_rows(args.torch_device, args.quick))
        return
    if args.compiled:
        _print(_compiled_rows(np.random.default_rng(0), args.quick))
        return
    rng = np.random.default_rng(0)
    one = np.float32(1)
    kw = {"a_format": "e4m3", "b_format": "e4m3", "out_dtype": "float32"}
    rows = []

    m, k = (128, 1024) if args.quick else (512, 4096)
    a, b = _codes(rng, (m, k)), _codes(rng, (k, m))
    scaled_mm(a[:16], np.ascontiguousarray(b[:, :16]), one, one, accumulator="hopper_fast", **kw)  # JIT warm-up
    t0 = time.perf_counter()
    scaled_mm(a, b, one, one, accumulator="hopper_fast", **kw)
    t_fast = time.perf_counter() - t0
    macs = m * m * k
    model = INSTRUCTION_MODELS["hopper_wgmma"]
    outs = 2
    t0 = time.perf_counter()
    for j in range(outs):
        acc = 0.0
        for t in range(0, k, 32):
            acc = reference(
                model, a[0, t : t + 32].tolist(), b[t : t + 32, j].tolist(), acc, "e4m3", "e4m3", None, None, "float32"
            )
    t_ref = (time.perf_counter() - t0) / (outs * k)  # seconds per multiply-add
    rows.append((f"hopper_fast {m}x{m}x{k}: M multiply-adds/s", f"{macs / t_fast / 1e6:.0f}", ">= 50"))
    rows.append(("hopper_fast vs scalar reference (per multiply-add)", f"{t_ref * macs / t_fast:.0f}x", ">= 1000x"))

    n = 512 if args.quick else 2048
    x, y = _codes(rng, (n, n)), _codes(rng, (n, n))
    xf, yf = torch.randn(n, n), torch.randn(n, n)
    t_mm = best_of(lambda: torch.matmul(xf, yf), 3)
    t_deq = best_of(lambda: scaled_mm(x, y, one, one, accumulator="dequantized_fp32", **kw), 3)
    t_ex = best_of(lambda: scaled_mm(x, y, one, one, accumulator="exact", **kw), 3)
    rows.append((f"dequantized_fp32 {n}^3 / torch.matmul fp32 (time)", f"{t_deq / t_mm:.2f}x", "<= 1.3x"))
    rows.append((f"exact {n}^3 / torch.matmul fp32 (time)", f"{t_ex / t_mm:.2f}x", "<= 3x"))

    s = 512
    xa = torch.from_numpy(x[:s, :s].copy()).view(torch.float8_e4m3fn)
    yb = torch.from_numpy(y[:s, :s].T.copy()).view(torch.float8_e4m3fn).t()
    t_sm = best_of(lambda: torch._scaled_mm(xa, yb, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32), 1)
    t_mm512 = best_of(lambda: torch.matmul(xf[:s, :s], yf[:s, :s]), 3)
    ref = scaled_mm(x[:s, :s], y[:s, :s], one, one, accumulator="exact", **kw)
    got = torch._scaled_mm(xa, yb, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32).numpy()
    ulp = np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    rows.append((f"torch CPU _scaled_mm {s}^3 / torch.matmul (time)", f"{t_sm / t_mm512:.0f}x", "(reported)"))
    rows.append(
        (
            f"torch CPU _scaled_mm {s}^3 vs exact: bit-exact / max ULP",
            f"{(ulp == 0).mean():.1%} / {int(ulp.max())}",
            "(reported)",
        )
    )

    rows += _compiled_rows(rng, args.quick)
    _print(rows)


def _print(rows: list[tuple[str, str, str]]) -> None:
    print("| case | result | target |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


def _torch_rows(device: str, quick: bool) -> list[tuple[str, str, str]]:
    """``hopper_fast`` through the torch-ops chains on ``device``: speed, ratio to torch.matmul, bits vs numpy."""
    import torch

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    rng = np.random.default_rng(1)
    m, k = (128, 1024) if quick else (512, 4096)
    a, b = _codes(rng, (m, k)), _codes(rng, (k, m))
    at = torch.from_numpy(a).view(torch.float8_e4m3fn).to(device)
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e4m3fn).to(device).t()
    one = torch.tensor(1.0, device=device)
    kw = {"out_dtype": torch.float32, "accumulator": "hopper_fast", "backend": "torch"}

    def run() -> None:
        scaled_mm(at, bt, one, one, **kw)
        sync()

    run()  # warm-up
    t = best_of(run, 2)
    xf, yf = torch.randn(m, k, device=device), torch.randn(k, m, device=device)

    def mm() -> None:
        torch.matmul(xf, yf)
        sync()

    mm()
    t_mm = best_of(mm, 3)
    rows_chk = 16
    got = scaled_mm(at[:rows_chk], bt, one, one, **kw).cpu().numpy()
    ref = scaled_mm(a[:rows_chk], b, np.float32(1), np.float32(1), accumulator="hopper_fast", a_format="e4m3",
                    b_format="e4m3", out_dtype="float32", backend="numpy")  # fmt: skip
    same = np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    name = f"{device} {m}x{m}x{k}"
    return [
        (f"hopper_fast torch-ops chains, {name}: M multiply-adds/s", f"{m * m * k / t / 1e6:.0f}", "(reported)"),
        (f"hopper_fast torch-ops chains / torch.matmul fp32, {name} (time)", f"{t / t_mm:.0f}x", "(reported)"),
        (f"torch-ops chains vs numpy path, {rows_chk} rows: bit-equal", "yes" if same else "NO", "yes"),
    ]


def _compiled_rows(rng: np.random.Generator, quick: bool) -> list[tuple[str, str, str]]:
    """The compiled chains (numba, extra ``fast``) against the numpy reference path and mmaemu's CPU path."""
    import os

    import torch

    rows = []
    one = np.float32(1)
    kw = {"a_format": "e4m3", "b_format": "e4m3", "out_dtype": "float32", "accumulator": "hopper_fast"}
    m, k = (64, 1024) if quick else (512, 4096)
    a, b = _codes(rng, (m, k)), _codes(rng, (k, m))
    times = {}
    for flag in ("1", "0"):
        os.environ["FP8SIM_NUMBA"] = flag
        scaled_mm(a[:16], np.ascontiguousarray(b[:, :16]), one, one, **kw)  # compile / warm up
        times[flag] = best_of(lambda: scaled_mm(a, b, one, one, **kw), 3 if flag == "1" else 1)
    os.environ.pop("FP8SIM_NUMBA")
    xf, yf = torch.randn(m, k), torch.randn(k, m)
    t_mm = best_of(lambda: torch.matmul(xf, yf), 3)
    macs = m * m * k
    shape = f"{m}x{m}x{k}"
    rows.append((f"hopper_fast {shape} compiled: M multiply-adds/s", f"{macs / times['1'] / 1e6:.0f}", ">= 1000"))
    rows.append((f"hopper_fast {shape} numpy path: M multiply-adds/s", f"{macs / times['0'] / 1e6:.0f}", "-"))
    rows.append(("hopper_fast compiled / numpy path (speed)", f"{times['0'] / times['1']:.2f}x", "(reported)"))
    rows.append((f"hopper_fast compiled / torch.matmul fp32 {shape} (time)", f"{times['1'] / t_mm:.0f}x", "(reported)"))
    try:
        import warnings

        import mmaemu
    except ImportError:
        return rows
    mq = 16 if quick else 64
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(mq, 1920, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = (torch.randn(5760, 1920, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn)
    sx, sw = torch.tensor(1 / 64), torch.tensor(1 / 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_mm = best_of(lambda: mmaemu.scaled_mm(x, w.t(), sx, sw, out_dtype=torch.bfloat16, use_fast_accum=True), 1)
    t_us = best_of(
        lambda: scaled_mm(x, w.t(), sx, sw, out_dtype=torch.bfloat16, use_fast_accum=True, accumulator="hopper_fast"), 2
    )
    rows.append((f"hopper_fast vs mmaemu 0.1.0 CPU, {mq}x5760x1920 bf16 (speed)", f"{t_mm / t_us:.1f}x", ">= 3x"))
    return rows


if __name__ == "__main__":
    main()
