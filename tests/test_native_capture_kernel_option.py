"""``capture(torch_cpu_kernel=...)``: ``"auto"`` records the kernel this host's torch takes, ``"fallback"``
forces the fallback.  The host is played as an AMX-INT8 CPU with oneDNN built in and on; oracle: the routing
of torch 2.13 ``aten/src/ATen/native/Blas.cpp`` ``_scaled_mm_out_cpu`` (oneDNN for single-element scales of
one FP8 dtype on AMX-INT8 where oneDNN is enabled), as in tests/test_gemm_torch_cpu_meta.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm import torch_cpu  # noqa: E402
from fp8sim.gemm.torch_cpu import CPU_FLAGS  # noqa: E402
from fp8sim.native import capture as cap_mod  # noqa: E402
from fp8sim.native.fileformat import read_bundle  # noqa: E402
from fp8sim.native.suite import GemmCase  # noqa: E402


@pytest.mark.parametrize(("option", "kernel", "mkldnn"), [("auto", "onednn", "yes"), ("fallback", "fallback", "no")])
def test_auto_records_the_hosts_kernel_and_fallback_forces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, kernel: str, mkldnn: str
) -> None:
    monkeypatch.setattr(torch_cpu, "cpu_flags", lambda: {f: f in ("amx_int8", "avx512_f") for f in CPU_FLAGS})
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    case = GemmCase(16, 16, 32, "e4m3", "e4m3", "tensorwise", False, "float32", 5)
    monkeypatch.setattr(cap_mod, "gemm_cases", lambda suite: [case])
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # no torchao: one skipped op
    path = cap_mod.capture(tmp_path / "c.fp8cap", progress=False, torch_cpu_kernel=option)
    meta = read_bundle(path)[0]["meta"]
    assert (meta["torch_cpu_kernel"], meta["mkldnn_enabled"], meta["cpu_amx_int8"]) == (kernel, mkldnn, "yes")
    assert meta["torch_cpu_kernel_mixed"] == "fallback"  # mixed FP8 dtypes ask AMX-FP16, which this host lacks
