"""torch's CPU ``_scaled_mm`` is two kernels: which one a call takes, and what each computes.

Routing (torch 2.13, ``aten/src/ATen/native/Blas.cpp`` ``_scaled_mm_out_cpu``): when torch is built
with oneDNN, oneDNN is enabled (``torch.backends.mkldnn.enabled``; ``torch.backends.mkldnn.flags(
enabled=False)`` turns it off), both scales are single elements, and cpuinfo reports AMX-INT8 (both
operands of one FP8 dtype) or AMX-FP16 (mixed FP8 dtypes), the call runs ``mkldnn_scaled_mm``
(``aten/src/ATen/native/mkldnn/Linear.cpp``): oneDNN's FP8 matmul.  Everywhere else it runs
``_scaled_mm_out_cpu_emulated``, the *fallback*.  (Before the single-element gate, torch routed every
scale layout by the CPU flags alone.)

What each computes (``fp8sim.gemm.scaled_mm`` models both, ``docs/semantics.md`` 8.3):

- fallback (accumulator ``cpu_reference``): float32 scales only (tensorwise or rowwise), each operand
  dequantized (``a.float() * scale_a``), one float32 matmul, ``+ bias``, FP8 output ``* (1 / scale_result)``
  then torch's ``.to()`` (E4M3 saturates since torch 2.13, E5M2 overflows to Inf); ``scale_result`` is
  read only when ``out_dtype`` is given;
- oneDNN (accumulator ``cpu_onednn``): scales of any float dtype (``item<float>()``: bfloat16 and float16
  are accepted, float64 is rounded to float32), tensorwise only; the unscaled products summed by oneDNN,
  times ``fl32(scale_a * scale_b)`` (oneDNN precomputes the product, ``cpu/scale_utils.hpp``), ``+ bias``,
  ``/ scale_result``, FP8 output by oneDNN's non-saturating nearest-even conversion (E4M3 overflow ->
  NaN, E5M2 -> Inf; ``src/common/float8.cpp``).  oneDNN sums in its own blocked order (AMX tiles, K
  split per thread), which fp8sim does not reproduce: its float32 matmul stands in, so results agree
  exactly only where the sum is exact (e.g. small integers), never by claim.  torch reads ``out_dtype``
  unchecked there when ``scale_result`` is given without it (undefined behaviour): fp8sim refuses that.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CPU_FLAGS",
    "cpu_flags",
    "onednn_version",
    "torch_cpu_kernel",
    "torch_cpu_kernel_meta",
    "kernel_of_capture",
    "fallback_kernel",
]

CPU_FLAGS = ("amx_int8", "amx_fp16", "amx_bf16", "avx512_fp16", "avx512_bf16", "avx512_f")
"""The CPU features recorded with a capture; ``amx_int8`` and ``amx_fp16`` decide the kernel."""

Kernel = Literal["onednn", "fallback"]
_FORCED = [0]  # depth of fallback_kernel() contexts


@cache
def cpu_flags() -> dict[str, bool]:
    """The CPU features of :data:`CPU_FLAGS` as torch's cpuinfo reports them (probed once), else as
    ``/proc/cpuinfo`` lists them; all False where neither can be read (not x86, no torch)."""
    try:
        import torch

        caps = torch._C._cpu._get_cpu_capability()  # cpuinfo: what _scaled_mm_out_cpu asks (torch >= 2.5)
        return {f: bool(caps.get(f, False)) for f in CPU_FLAGS}
    except (ImportError, AttributeError, RuntimeError):
        pass
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return dict.fromkeys(CPU_FLAGS, False)
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return {f: _PROC_NAMES.get(f, f) in have for f in CPU_FLAGS}


_PROC_NAMES = {"avx512_f": "avx512f"}  # /proc/cpuinfo spells a few features differently from cpuinfo


@cache
def onednn_version() -> str | None:
    """The oneDNN (MKL-DNN) version torch was built with, None without torch or oneDNN."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    m = re.search(r"(?:MKL-DNN|oneDNN)[^\n]*?v(\d+\.\d+(?:\.\d+)?)", torch.__config__.show())
    return m.group(1) if m else None


def _mkldnn_enabled() -> bool:
    """Whether oneDNN is on for ``_scaled_mm`` calls now (off inside :func:`fallback_kernel`)."""
    if _FORCED[0]:
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)


def torch_cpu_kernel(
    *,
    mixed_dtypes: bool = False,
    tensorwise: bool = True,
    flags: dict[str, bool] | None = None,
    mkldnn_enabled: bool | None = None,
) -> Kernel:
    """Which kernel torch's CPU ``_scaled_mm`` runs for a call: ``"onednn"`` or ``"fallback"``.

    ``mixed_dtypes``: the operands have different FP8 dtypes; ``tensorwise``: both scales are single
    elements.  ``flags`` (default: :func:`cpu_flags` of this host) and ``mkldnn_enabled`` (default:
    torch's setting now, so ``torch.backends.mkldnn.flags(enabled=False)`` is seen) describe another host."""
    f = cpu_flags() if flags is None else flags
    on = _mkldnn_enabled() if mkldnn_enabled is None else mkldnn_enabled
    amx = f.get("amx_fp16", False) if mixed_dtypes else f.get("amx_int8", False)
    return "onednn" if on and tensorwise and amx else "fallback"


@contextmanager
def fallback_kernel() -> Iterator[None]:
    """A context in which torch's CPU ``_scaled_mm`` runs the fallback on any host, and nothing else
    changes: each ``torch._scaled_mm`` call runs with oneDNN off (``torch.backends.mkldnn.enabled``),
    which is restored around it, so float32 ops that oneDNN would also run (GELU, ...) keep their
    kernel.  ``torch_cpu_kernel()`` says ``"fallback"`` inside.  ``ONEDNN_MAX_CPU_ISA=AVX2`` is no
    substitute: torch still routes by the CPU flags and oneDNN then fails to create the primitive."""
    import torch

    native = torch._scaled_mm

    def scaled_mm_on_the_fallback(*args: Any, **kwargs: Any) -> Any:
        prev = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            return native(*args, **kwargs)
        finally:
            torch.backends.mkldnn.enabled = prev

    torch._scaled_mm = scaled_mm_on_the_fallback
    _FORCED[0] += 1
    try:
        yield
    finally:
        _FORCED[0] -= 1
        torch._scaled_mm = native


def torch_cpu_kernel_meta() -> dict[str, Any]:
    """What decides the kernel on this host, as capture metadata (strings): each flag of
    :data:`CPU_FLAGS` as ``cpu_<flag>`` ("yes"/"no"), ``mkldnn_enabled``, ``onednn`` (its version) and
    ``torch_cpu_kernel`` / ``torch_cpu_kernel_mixed`` (tensorwise calls with one / two FP8 dtypes)."""
    meta: dict[str, Any] = {f"cpu_{k}": "yes" if v else "no" for k, v in cpu_flags().items()}
    meta["mkldnn_enabled"] = "yes" if _mkldnn_enabled() else "no"
    meta["onednn"] = onednn_version()
    meta["torch_cpu_kernel"] = torch_cpu_kernel()
    meta["torch_cpu_kernel_mixed"] = torch_cpu_kernel(mixed_dtypes=True)
    return meta


def kernel_of_capture(meta: dict[str, Any], mixed_dtypes: bool, tensorwise: bool) -> Kernel | None:
    """The kernel a CPU capture's ``_scaled_mm`` call took, from its metadata; None for a capture that
    predates the record (fp8sim before issue 24) or is not a CPU capture."""
    if meta.get("device", "cpu") != "cpu" or "torch_cpu_kernel" not in meta:
        return None
    flags = {f: meta.get(f"cpu_{f}") == "yes" for f in CPU_FLAGS}
    return torch_cpu_kernel(
        mixed_dtypes=mixed_dtypes,
        tensorwise=tensorwise,
        flags=flags,
        mkldnn_enabled=meta.get("mkldnn_enabled") == "yes",
    )
