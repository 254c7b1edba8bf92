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


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layernorm_bwd_is_float32_layernorm_gradient_from_saved_statistics(tex, dtype, zero_centered_gamma) -> None:  # noqa: ANN001
    """normalization.cpp 13-60: ``layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma)``
    -> ``[dx, dgamma, dbeta]`` shaped like x / gamma / gamma; the kernel works in float32 with gamma + 1
    when zero-centred.  Reference: torch autograd through F.layer_norm in float32, rounded once."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 40, generator=gen).to(dtype)
    gamma = (torch.randn(40, generator=gen) * 0.1).to(dtype)
    dz = torch.randn(6, 40, generator=gen).to(dtype)
    eps = 1e-5
    x32 = x.float().requires_grad_(True)
    g32 = gamma.float().requires_grad_(True)
    b32 = torch.zeros(40, requires_grad=True)
    y = torch.nn.functional.layer_norm(x32, (40,), g32 + 1 if zero_centered_gamma else g32, b32, eps)
    ref = torch.autograd.grad(y, (x32, g32, b32), dz.float())
    mu = x.float().mean(-1)
    rsigma = torch.rsqrt(x.float().var(-1, unbiased=False) + eps)
    dx, dgamma, dbeta = tex.layernorm_bwd(dz, x, mu, rsigma, gamma, 0, zero_centered_gamma)
    assert (dx.dtype, dgamma.dtype, dbeta.dtype) == (dtype, dtype, dtype)
    # statistics computed apart may differ from F.layer_norm's in the last bit: compare at float32 accuracy
    torch.testing.assert_close(dx, ref[0].to(dtype), rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5)
    torch.testing.assert_close(dgamma, ref[1].to(dtype), rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5)
    torch.testing.assert_close(dbeta, dz.double().sum(0).to(dtype))  # dbeta = the sum of dz over the rows


def test_layernorm_bwd_from_the_forwards_own_statistics_is_bit_exact(tex) -> None:  # noqa: ANN001
    """With the statistics torch's LayerNorm forward saved, the gradient equals autograd's bit for bit."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=gen)
    gamma, beta = torch.randn(64, generator=gen), torch.zeros(64)
    dz = torch.randn(5, 64, generator=gen)
    _, mean, rstd = torch.native_layer_norm(x, [64], gamma, beta, 1e-5)
    xg, gg = x.clone().requires_grad_(True), gamma.clone().requires_grad_(True)
    ref = torch.autograd.grad(torch.nn.functional.layer_norm(xg, (64,), gg, beta, 1e-5), (xg, gg), dz)
    dx, dgamma, _ = tex.layernorm_bwd(dz, x, mean.view(-1), rstd.view(-1), gamma, 8, False)
    assert torch.equal(dx, ref[0]) and torch.equal(dgamma, ref[1])


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_bwd_from_the_forwards_rsigma_is_autograds_gradient_bit_for_bit(
    tex, dtype, zero_centered_gamma
) -> None:  # noqa: ANN001
    """normalization.cpp 216-257: ``rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)`` ->
    ``[dx, dgamma]`` (float32 kernel, gamma + 1 when zero-centred).  Reference: torch's autograd through the
    float32 RMSNorm expression, rounded once."""
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(7, 48, generator=gen) * 3).to(dtype)
    gamma = (torch.randn(48, generator=gen) * 0.5).to(dtype)
    dz = torch.randn(7, 48, generator=gen).to(dtype)
    x32, g32 = x.float().requires_grad_(True), gamma.float().requires_grad_(True)
    rsigma = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)
    y = x32 * rsigma * (g32 + 1 if zero_centered_gamma else g32)
    ref = torch.autograd.grad(y, (x32, g32), dz.float())
    dx, dgamma = tex.rmsnorm_bwd(dz, x, rsigma.detach().view(-1), gamma, 0, zero_centered_gamma)
    assert (dx.dtype, dgamma.dtype) == (dtype, dtype)
    assert torch.equal(dx, ref[0].to(dtype)) and torch.equal(dgamma, ref[1].to(dtype))


def test_cpp_extensions_reexports_the_extensions_functions(tex) -> None:  # noqa: ANN001
    """TE's cpp_extensions/__init__.py does ``from transformer_engine_torch import *``: TE's
    test_backward_override.py imports ``general_gemm, layernorm_bwd`` from there."""
    from transformer_engine.pytorch.cpp_extensions import general_gemm, layernorm_bwd

    assert layernorm_bwd is tex.layernorm_bwd and callable(general_gemm)
