"""``fp8sim capture``: record native results (torch's float8 casts and its casts to bfloat16 and float16,
``torch._scaled_mm``, torchao's quantizers where installed) on this machine, with the metadata that says
what produced them."""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import platform
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .._util.outpaths import check_output_file
from .._util.progress import Progress
from ..formats import FORMATS
from .fileformat import write_bundle
from .suite import FLOAT_CASTS, INPUT_SETS, SUITE_VERSION, gemm_cases, gemm_operands, input_set

__all__ = ["capture", "device_metadata"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("fp8sim capture needs torch: pip install 'fp8sim[torch]'") from exc
    return torch


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_metadata(torch: Any, device: str) -> dict[str, Any]:
    """Device name, compute capability, driver/CUDA and library versions, date."""
    meta: dict[str, Any] = {
        "device": device,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchao": _version("torchao"),
        "transformer_engine": _version("transformer-engine") or _version("transformer_engine"),
        "fp8sim": __version__,
        "numpy": np.__version__,
    }
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        meta["device_name"] = torch.cuda.get_device_name(idx)
        meta["compute_capability"] = list(torch.cuda.get_device_capability(idx))
        meta["cuda"] = torch.version.cuda
        try:
            meta["driver"] = (
                ".".join(map(str, torch.cuda.driver_version())) if hasattr(torch.cuda, "driver_version") else None
            )
        except Exception:  # noqa: BLE001 - best effort
            meta["driver"] = None
    else:
        meta["device_name"] = platform.processor() or platform.machine()
        meta["compute_capability"] = None
        meta["cuda"] = None
        meta["driver"] = None
    return meta


def _to_torch(torch: Any, x: np.ndarray, device: str) -> Any:
    if x.dtype == np.float16:
        return torch.from_numpy(x.view(np.int16)).view(torch.float16).to(device)
    if x.dtype.itemsize == 2:  # bfloat16
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


TORCH_CPU_KERNELS = ("auto", "fallback")


def capture(
    out: str | Path,
    *,
    device: str = "cpu",
    suite: str = "quick",
    force: bool = False,
    progress: bool = True,
    torch_cpu_kernel: str = "auto",
) -> Path:
    """Record the suite on ``device`` ("cpu" or "cuda[:i]") into ``out`` (atomic; refuses to
    overwrite unless ``force``).  Returns the path.

    A CPU capture records what decides torch's CPU ``_scaled_mm`` kernel (:mod:`fp8sim.gemm.torch_cpu`):
    the CPU flags, whether oneDNN is enabled, its version and the kernel taken.  ``torch_cpu_kernel``:
    ``"auto"`` (the host's kernel) or ``"fallback"`` (oneDNN off while the GEMMs run, so that an
    AVX-512-FP16/AMX host records the fallback, which fp8sim reproduces bit for bit)."""
    if torch_cpu_kernel not in TORCH_CPU_KERNELS:
        raise ValueError(f"torch_cpu_kernel must be one of {', '.join(TORCH_CPU_KERNELS)}; got {torch_cpu_kernel!r}")
    torch = _torch()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: CUDA is not available on this machine")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:index]', got {device!r}")
    out = check_output_file(out, force=force)  # before the work, not after it
    cases = gemm_cases(suite)
    fmts = [f for f in FORMATS.values() if f.torch_dtype is not None]
    n_float = sum(len(sets) for sets in FLOAT_CASTS.values())
    bar = Progress(len(fmts) * len(INPUT_SETS) + n_float + len(cases) + 1, progress, prefix="capture ")
    arrays: dict[str, np.ndarray] = {}
    ops: list[dict[str, Any]] = []
    for f in fmts:
        for set_name in INPUT_SETS:
            x = _to_torch(torch, input_set(set_name), device)
            key = f"cast/{f.name}/{set_name}"
            arrays[key] = x.to(f.torch_dtype).view(torch.uint8).cpu().numpy()
            ops.append({"name": key, "kind": "cast", "format": f.name, "inputs": set_name, "seed": 0})
            bar.step(key)
    for name, sets in FLOAT_CASTS.items():  # the device's conversions to bfloat16 and float16
        for set_name in sets:
            x = _to_torch(torch, input_set(set_name), device)
            key = f"cast/{name}/{set_name}"
            arrays[key] = x.to(getattr(torch, name)).view(torch.int16).cpu().numpy().view(np.uint16)
            ops.append({"name": key, "kind": "cast_float", "format": name, "inputs": set_name, "seed": 0})
            bar.step(key)
    from ..gemm.torch_cpu import fallback_kernel, torch_cpu_kernel_meta

    kernel_meta: dict[str, Any] = {}
    with fallback_kernel() if torch_cpu_kernel == "fallback" else contextlib.nullcontext():
        if device == "cpu":
            kernel_meta = torch_cpu_kernel_meta()
        for case in cases:
            op = {"name": case.name, "kind": "scaled_mm", **case.to_dict()}
            try:
                arrays[case.name] = _run_scaled_mm(torch, case, device)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                op["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            ops.append(op)
            bar.step(case.name)
    _capture_torchao(torch, device, arrays, ops)
    bar.step("torchao")
    meta = {**device_metadata(torch, device), **kernel_meta}
    doc = {"meta": meta, "ops": ops, "suite": suite, "suite_version": SUITE_VERSION}
    return write_bundle(out, arrays, doc, force=force)


def _run_scaled_mm(torch: Any, case: Any, device: str) -> np.ndarray:
    a, b, sa, sb = gemm_operands(case)
    fa, fb = FORMATS[case.a_format].torch_dtype, FORMATS[case.b_format].torch_dtype
    at = torch.from_numpy(a).view(fa).to(device)
    bt = torch.from_numpy(np.ascontiguousarray(b.T)).view(fb).to(device).t()  # column-major, as cuBLASLt wants
    out_dtype = getattr(torch, case.out_dtype)
    d = torch._scaled_mm(
        at,
        bt,
        torch.from_numpy(sa).to(device),
        torch.from_numpy(sb).to(device),
        out_dtype=out_dtype,
        use_fast_accum=case.fast_accum,
    )
    d = d.cpu()
    return (d.view(torch.int32) if case.out_dtype == "float32" else d.view(torch.int16)).numpy()


TORCHAO_SEED = 7


def torchao_input() -> np.ndarray:
    """Heavy-tailed bfloat16-representable activations with a zero row, for torchao's quantizers."""
    import ml_dtypes

    rng = np.random.default_rng(TORCHAO_SEED)
    x = rng.standard_t(2, size=(64, 128)) * np.exp2(rng.integers(-6, 6, (64, 1)))
    x[5] = 0.0
    return x.astype(np.float32).astype(ml_dtypes.bfloat16)


def _capture_torchao(torch: Any, device: str, arrays: dict, ops: list) -> None:
    try:
        from torchao.float8 import float8_utils as fu
        from torchao.float8.config import ScalingGranularity
    except Exception:  # noqa: BLE001 - not installed, or fails to import on this machine
        ops.append({"name": "torchao", "kind": "torchao_float8", "skipped": "torchao is not installed"})
        return
    x = _to_torch(torch, torchao_input(), device)
    for fmt in ("e4m3", "e5m2"):
        dt = FORMATS[fmt].torch_dtype
        for gran, dim in (("tensorwise", None), ("axiswise", -1)):
            for pow2 in (False, True):
                key = f"torchao/{fmt}/{gran}/pow2={pow2}"
                g = ScalingGranularity.TENSORWISE if gran == "tensorwise" else ScalingGranularity.AXISWISE
                scale = fu.tensor_to_scale(
                    x, dt, scaling_granularity=g, axiswise_dim=dim, round_scales_to_power_of_2=pow2
                )
                data = fu.to_fp8_saturated(x.float() * scale, dt)
                arrays[key + "/codes"] = data.view(torch.uint8).cpu().numpy()
                arrays[key + "/scale"] = scale.float().cpu().numpy()
                ops.append({"name": key, "kind": "torchao_float8", "format": fmt, "granularity": gran, "pow2": pow2})
