"""``transformer_engine_torch`` (``tex``) under the shim, and the shim's footprint on disk (issue 27).

References are written from TE's source at d0067d0: ``common/include/transformer_engine/transformer_engine.h``
(``enum class DType``), ``pytorch/csrc/common.h`` (``FP8FwdTensors`` / ``FP8BwdTensors``) and
``pytorch/csrc/extensions/cast.cpp`` (``quantize``, ``dequantize``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import tempfile

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.run.shim as shim  # noqa: E402
from fp8sim.pytorch import Float8CurrentScalingQuantizer, MXFP8Quantizer  # noqa: E402

pytestmark = pytest.mark.skipif(
    not shim.is_installed() and importlib.util.find_spec("transformer_engine") is not None,
    reason="a real TransformerEngine is installed",
)


@pytest.fixture
def tex():  # noqa: ANN201
    was = shim.is_installed()
    shim.install(quiet=True)
    try:
        yield importlib.import_module("transformer_engine_torch")
    finally:
        if not was:
            shim.uninstall()


def test_install_writes_nothing_to_the_temp_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """The issue: every install() left a /tmp/fp8sim-te-* directory (71 after one test session)."""
    if shim.is_installed():
        pytest.skip("the shim is already installed in this process")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shim.install(quiet=True)
    try:
        assert importlib.metadata.version("transformer-engine") == shim.EMULATED_TE_VERSION
        dist = importlib.metadata.distribution("transformer_engine")  # PEP 503 names normalise alike
        assert dist.metadata["Name"] == "transformer-engine"
        assert os.listdir(tmp_path) == []
    finally:
        shim.uninstall()
    assert os.listdir(tmp_path) == []
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("transformer-engine")


def test_tex_enums_have_te_values(tex) -> None:  # noqa: ANN001
    # transformer_engine.h: kByte=0, kInt32=2, kFloat32=4, kFloat16=5, kBFloat16=6, kFloat8E4M3=7,
    # kFloat8E5M2=8, kFloat4E2M1=10; pybind.cpp 195-207: compared by integer value
    want = {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6}
    want |= {"kFloat8E4M3": 7, "kFloat8E5M2": 8, "kFloat4E2M1": 10}
    assert {k: int(getattr(tex.DType, k)) for k in want} == want
    assert tex.DType.kFloat8E4M3 == 7 and tex.DType.kFloat8E4M3 != 8
    te = importlib.import_module("transformer_engine.pytorch")
    assert tex.DType is te.DType
    # csrc/common.h lines 76-97
    fwd = [f"GEMM{g}_{s}" for g in (1, 2, 3) for s in ("INPUT", "WEIGHT", "OUTPUT")]
    bwd = [f"GRAD_{s}{g}" for g in (1, 2, 3) for s in ("OUTPUT", "INPUT")]
    assert [int(getattr(tex.FP8FwdTensors, n)) for n in fwd] == list(range(9))
    assert [int(getattr(tex.FP8BwdTensors, n)) for n in bwd] == list(range(6))


def test_tex_names_it_does_not_emulate(tex) -> None:  # noqa: ANN001
    with pytest.raises(NotImplementedError, match=r"transformer_engine_torch\.fused_attn_fwd is not emulated"):
        tex.fused_attn_fwd  # noqa: B018
    assert not hasattr(tex, "fused_attn_fwd")


def test_tex_quantize_is_the_quantizer_without_autograd(tex) -> None:  # noqa: ANN001
    """cast.cpp quantize: the input read contiguously, the quantizer's tensor returned detached."""
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    q = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3)
    out = tex.quantize(x.t(), q)  # non-contiguous
    assert not out.requires_grad and out.shape == (32, 64)
    # reference: per-tensor current scaling, scale = 448 / amax, RNE to E4M3 (fp8 cast of torch)
    xt = x.detach().t().contiguous()
    scale = torch.tensor(448.0) / xt.abs().max()
    want = (xt * scale).to(torch.float8_e4m3fn).float() * torch.reciprocal(scale)
    assert torch.equal(out.dequantize(), want)


def test_tex_quantize_into_output_and_noop(tex) -> None:  # noqa: ANN001
    torch.manual_seed(1)
    q = MXFP8Quantizer(tex.DType.kFloat8E4M3)
    a, b = torch.randn(32, 64), torch.randn(32, 64) * 4
    dst = tex.quantize(a, q)
    before = dst.dequantize().clone()
    assert tex.quantize(b, q, dst, torch.ones(1)) is dst and torch.equal(dst.dequantize(), before)
    assert tex.quantize(b, q, dst, torch.zeros(1)) is dst
    assert torch.equal(dst.dequantize(), q(b).dequantize()) and not torch.equal(dst.dequantize(), before)


def test_tex_dequantize_takes_a_te_dtype(tex) -> None:  # noqa: ANN001
    x = torch.randn(16, 32)
    t = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3)(x)
    got = tex.dequantize(t, tex.DType.kBFloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, t.dequantize().to(torch.bfloat16))
    with pytest.raises(ValueError, match="otype"):
        tex.dequantize(t, tex.DType.kFloat8E4M3)
