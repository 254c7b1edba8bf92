"""The kernel torch's CPU ``_scaled_mm`` takes, decided for *another* host (capture metadata, given flags) and
for this one with its CPU flags or oneDNN state played (monkeypatched), so every branch runs on any x86-64.

Oracle: the routing of torch 2.13 ``aten/src/ATen/native/Blas.cpp`` ``_scaled_mm_out_cpu``: oneDNN only where
oneDNN is built in and enabled (``at::globalContext().userEnabledMkldnn()``), both scales are single elements,
and the CPU has AMX-INT8 (one FP8 dtype) or AMX-FP16 (mixed FP8 dtypes); a flag absent from a record is a
CPU without it.  Capture metadata stores each flag and setting as "yes"/"no" (``fp8sim.native`` reads them
back with ``== "yes"``)."""

from __future__ import annotations

import sys

import pytest

from fp8sim.gemm import torch_cpu
from fp8sim.gemm.torch_cpu import CPU_FLAGS, fallback_kernel, kernel_of_capture, torch_cpu_kernel, torch_cpu_kernel_meta
from fp8sim.testing.oracles import require

torch = require("torch")


@pytest.mark.parametrize(
    ("flags", "mixed", "want"),
    [
        ({}, False, "fallback"),
        ({}, True, "fallback"),
        ({"amx_fp16": True}, False, "fallback"),  # one FP8 dtype asks AMX-INT8 only
        ({"amx_int8": True}, True, "fallback"),  # mixed dtypes ask AMX-FP16 only
        ({"amx_int8": True}, False, "onednn"),
        ({"amx_fp16": True}, True, "onednn"),
    ],
)
def test_a_flag_missing_from_the_record_is_a_cpu_without_it(flags: dict, mixed: bool, want: str) -> None:
    assert torch_cpu_kernel(mixed_dtypes=mixed, flags=flags, mkldnn_enabled=True) == want


def _host(monkeypatch: pytest.MonkeyPatch, **have: bool) -> None:
    monkeypatch.setattr(torch_cpu, "cpu_flags", lambda: {f: have.get(f, False) for f in CPU_FLAGS})


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
@pytest.mark.parametrize(("fp16", "mixed_kernel"), [(False, "fallback"), (True, "onednn")])
def test_meta_of_an_amx_host_with_onednn_on(monkeypatch: pytest.MonkeyPatch, fp16: bool, mixed_kernel: str) -> None:
    _host(monkeypatch, amx_int8=True, amx_fp16=fp16, avx512_f=True)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    meta = torch_cpu_kernel_meta()
    want_flags = {f"cpu_{f}": "yes" if f in ("amx_int8", "avx512_f") or (fp16 and f == "amx_fp16") else "no"
                  for f in CPU_FLAGS}  # fmt: skip
    assert {k: v for k, v in meta.items() if k.startswith("cpu_")} == want_flags
    assert meta["mkldnn_enabled"] == "yes"
    assert meta["torch_cpu_kernel"] == "onednn" and meta["torch_cpu_kernel_mixed"] == mixed_kernel
    with fallback_kernel():
        off = torch_cpu_kernel_meta()
    assert off["mkldnn_enabled"] == "no" and off["torch_cpu_kernel"] == off["torch_cpu_kernel_mixed"] == "fallback"
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert torch_cpu_kernel_meta()["mkldnn_enabled"] == "no" and torch_cpu_kernel() == "fallback"


def test_onednn_not_built_in_is_the_fallback_even_when_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch, amx_int8=True, amx_fp16=True)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    assert torch_cpu_kernel() == "fallback"
    assert torch_cpu_kernel_meta()["mkldnn_enabled"] == "no"


def test_without_torch_the_host_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    _host(monkeypatch, amx_int8=True)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert torch_cpu_kernel() == "fallback"


AMX = {"torch_cpu_kernel": "onednn", "cpu_amx_int8": "yes", "cpu_amx_fp16": "no", "mkldnn_enabled": "yes"}


@pytest.mark.parametrize(
    ("meta", "mixed", "tensorwise", "want"),
    [
        (AMX, False, True, "onednn"),  # no "device": a CPU capture
        ({**AMX, "device": "cpu"}, False, True, "onednn"),
        ({**AMX, "device": "CPU"}, False, True, None),
        ({**AMX, "device": "cuda:0"}, False, True, None),
        (AMX, False, False, "fallback"),  # rowwise
        (AMX, True, True, "fallback"),
        ({**AMX, "cpu_amx_fp16": "yes"}, True, True, "onednn"),
        ({**AMX, "mkldnn_enabled": "no"}, False, True, "fallback"),  # the capture's setting, not this host's
        ({k: v for k, v in AMX.items() if k != "mkldnn_enabled"}, False, True, "fallback"),
        ({k: v for k, v in AMX.items() if k != "torch_cpu_kernel"}, False, True, None),  # predates the record
    ],
)
def test_kernel_of_capture_reads_the_captures_own_record(meta: dict, mixed: bool, tensorwise: bool, want) -> None:  # noqa: ANN001
    with pytest.MonkeyPatch.context() as mp:  # this host with oneDNN on: the capture's record must decide
        mp.setattr(torch.backends.mkldnn, "enabled", True)
        assert kernel_of_capture(meta, mixed_dtypes=mixed, tensorwise=tensorwise) == want
