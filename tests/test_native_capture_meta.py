"""``fp8sim capture``'s record of what produced a capture (device, versions, date), its refusals, and what it
writes when a call fails or torchao is missing (issue 30: mutation testing of ``fp8sim.native``).

References: the standard library (``platform``, ``importlib.metadata``, ``datetime``) and the installed
packages' own version strings; a CUDA device is played by a stand-in torch whose answers are known."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.native import capture as cap_mod
from fp8sim.native.fileformat import read_bundle
from fp8sim.native.suite import GemmCase
from fp8sim.testing.oracles import require

torch = require("torch")


def _version_or_none(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_cpu_metadata_names_this_host_and_the_installed_versions() -> None:
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    meta = cap_mod.device_metadata(torch, "cpu")
    after = dt.datetime.now(dt.timezone.utc)
    assert meta["device"] == "cpu"
    assert meta["python"] == platform.python_version() and meta["platform"] == platform.platform()
    assert meta["torch"] == torch.__version__ and meta["numpy"] == np.__version__
    assert meta["fp8sim"] == fp8sim.__version__
    assert meta["torchao"] == _version_or_none("torchao")
    te = _version_or_none("transformer-engine") or _version_or_none("transformer_engine")
    assert meta["transformer_engine"] == te
    assert meta["device_name"] == (platform.processor() or platform.machine())
    assert (meta["compute_capability"], meta["cuda"], meta["driver"]) == (None, None, None)
    when = dt.datetime.fromisoformat(meta["date"])
    assert when.utcoffset() == dt.timedelta(0) and before <= when <= after
    assert "." not in meta["date"]  # whole seconds


def test_a_missing_distribution_is_recorded_as_none() -> None:
    assert cap_mod._version("no-such-distribution-fp8sim") is None
    assert cap_mod._version("numpy") == importlib.metadata.version("numpy")


def _fake_cuda_torch(driver: object) -> SimpleNamespace:
    calls: list = []
    cuda = SimpleNamespace(
        get_device_name=lambda i: calls.append(("name", i)) or f"Planted GPU {i}",
        get_device_capability=lambda i: calls.append(("cc", i)) or (9, 0),
        is_available=lambda: True,
    )
    if driver is not None:
        cuda.driver_version = driver
    fake = SimpleNamespace(__version__="2.13.0+cu130", device=torch.device, cuda=cuda,
                           version=SimpleNamespace(cuda="13.0"), calls=calls)  # fmt: skip
    return fake


def test_cuda_metadata_names_the_device_of_the_index_asked_for() -> None:
    fake = _fake_cuda_torch(lambda: (580, 65, 6))
    meta = cap_mod.device_metadata(fake, "cuda:1")
    assert meta["device"] == "cuda:1" and meta["torch"] == "2.13.0+cu130"
    assert meta["device_name"] == "Planted GPU 1" and meta["compute_capability"] == [9, 0]
    assert meta["cuda"] == "13.0" and meta["driver"] == "580.65.6"
    assert fake.calls == [("name", 1), ("cc", 1)]
    fake0 = _fake_cuda_torch(lambda: (580, 65, 6))
    assert cap_mod.device_metadata(fake0, "cuda")["device_name"] == "Planted GPU 0" and fake0.calls[0] == ("name", 0)


def test_cuda_metadata_driver_is_none_when_torch_cannot_say() -> None:
    assert cap_mod.device_metadata(_fake_cuda_torch(None), "cuda")["driver"] is None  # no driver_version

    def boom() -> tuple:
        raise RuntimeError("no driver API")

    assert cap_mod.device_metadata(_fake_cuda_torch(boom), "cuda")["driver"] is None


def test_to_torch_keeps_every_bit_pattern_of_each_input_dtype() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    h = cap_mod._to_torch(torch, bits.view(np.float16), "cpu")
    assert h.dtype == torch.float16 and np.array_equal(h.view(torch.int16).numpy().view(np.uint16), bits)
    b = cap_mod._to_torch(torch, bits.view(ml_dtypes.bfloat16), "cpu")
    assert b.dtype == torch.bfloat16 and np.array_equal(b.view(torch.int16).numpy().view(np.uint16), bits)
    f = np.array([1.5, -0.0, np.inf], np.float32)[::2]  # not contiguous
    t = cap_mod._to_torch(torch, f, "cpu")
    assert t.dtype == torch.float32 and np.array_equal(t.numpy(), [1.5, np.inf])


def test_capture_refuses_a_device_it_cannot_use_before_writing(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    out = tmp_path / "x.fp8cap"
    with pytest.raises(ValueError, match=r"device must be 'cpu' or 'cuda\[:index\]', got 'tpu'"):
        cap_mod.capture(out, device="tpu", progress=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="--device cuda:0: CUDA is not available on this machine"):
        cap_mod.capture(out, device="cuda:0", progress=False)
    assert not list(tmp_path.iterdir())
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"fp8sim capture needs torch: pip install 'fp8sim\[torch\]'"):
        cap_mod._torch()


def test_a_failing_gemm_and_a_missing_torchao_are_recorded_as_skipped(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A call torch refuses is kept as a skipped op with the first line of the error; no torchao: one skipped
    op.  Everything else is captured as on any CPU, and compares bit-exact."""
    cases = [GemmCase(16, 16, 32, "e4m3", "e4m3", "tensorwise", True, "float32", 5),
             GemmCase(16, 16, 32, "e5m2", "e4m3", "rowwise", False, "bfloat16", 6)]  # fmt: skip
    monkeypatch.setattr(cap_mod, "gemm_cases", lambda suite: cases)
    real = cap_mod._run_scaled_mm

    def run(t, case, device):  # noqa: ANN001, ANN202
        if case.seed == 6:
            raise NotImplementedError("no kernel for this\nsecond line " + "x" * 300)
        return real(t, case, device)

    monkeypatch.setattr(cap_mod, "_run_scaled_mm", run)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    path = cap_mod.capture(tmp_path / "c.fp8cap", suite="full", progress=False, torch_cpu_kernel="fallback")
    header, arrays = read_bundle(path)
    assert header["suite"] == "full" and header["suite_version"] == 1
    ops = {o["name"]: o for o in header["ops"]}
    assert ops[cases[1].name]["skipped"] == "NotImplementedError: no kernel for this"
    assert ops["torchao"] == {"name": "torchao", "kind": "torchao_float8", "skipped": "torchao is not installed"}
    assert ops[cases[0].name] == {"name": cases[0].name, "kind": "scaled_mm", **cases[0].to_dict()}
    assert ops["cast/e4m3/f32_special"] == {"name": "cast/e4m3/f32_special", "kind": "cast", "format": "e4m3",
                                            "inputs": "f32_special", "seed": 0}  # fmt: skip
    assert ops["cast/float16/f32_wide"]["kind"] == "cast_float"
    assert arrays[cases[0].name].dtype == np.int32 and cases[1].name not in arrays
    meta = header["meta"]
    assert meta["device"] == "cpu" and meta["torch_cpu_kernel"] == "fallback" and meta["mkldnn_enabled"] == "no"
    from fp8sim.native.compare import compare_capture

    res = compare_capture(path, infer="none")
    done = [o for o in res.ops if o.skipped is None]
    assert done and all(o.bit_exact == o.n > 0 for o in done), [(o.name, o.rate) for o in done if o.rate < 1]
    assert res.summary().endswith(", 2 skipped")
