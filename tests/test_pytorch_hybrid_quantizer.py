"""TE's ``HybridQuantizer`` (issue 27), against TE's source at d0067d0: ``tensor/hybrid_tensor.py`` (constructor
checks 81-129, ``quantize_impl`` 202-228: the columnwise copy from the input or from the rowwise copy dequantized
to its dtype), ``tensor/storage/hybrid_tensor_storage.py`` (``dequantize``: rowwise first) and
``cpp_extensions/gemm.py`` ``_unwrap_tensor`` (each GEMM reads the sub-storage of its direction), exercised through
TE's ``custom_recipes/quantizer_factory_zoo.py`` ``mxfp8_fwd_nvfp4_bwd_factory``.

The module GEMMs are checked against runs that use the sub-quantizers directly: the forward against an all-MXFP8
recipe, wgrad against an all-NVFP4 recipe (same input and gradient quantizers), dgrad against a Linear whose
weight is the MXFP8-dequantized weight, quantized by plain NVFP4 (TE's ``rowwise_dequantized`` weight)."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.custom_recipes.quantizer_factories import mxfp8_factory, nvfp4_factory  # noqa: E402
from fp8sim.pytorch.custom_recipes.quantizer_factory_zoo import mxfp8_fwd_nvfp4_bwd_factory  # noqa: E402
from fp8sim.pytorch.tensor import DelayedScalingRequest, HybridQuantizer, QuantizerRole  # noqa: E402
from fp8sim.recipe import CustomRecipe  # noqa: E402


def _mx() -> te.MXFP8Quantizer:
    return te.MXFP8Quantizer(te.DType.kFloat8E4M3)


def _plain_nvfp4() -> te.NVFP4Quantizer:
    return te.NVFP4Quantizer(with_rht=False, with_post_rht_amax=False, with_2d_quantization=False)


def test_constructor_checks_and_pinned_directions() -> None:
    q = _mx()
    with pytest.raises(ValueError, match="distinct rowwise and columnwise"):
        HybridQuantizer(rowwise_quantizer=q, columnwise_quantizer=q)
    with pytest.raises(TypeError, match="nested QuantizerRequest"):
        HybridQuantizer(rowwise_quantizer=_mx(), columnwise_quantizer=DelayedScalingRequest())
    with pytest.raises(TypeError, match="concrete Quantizer instances"):
        HybridQuantizer(rowwise_quantizer=_mx(), columnwise_quantizer=object())
    with pytest.raises(ValueError, match="columnwise_source must be one of"):
        HybridQuantizer(rowwise_quantizer=_mx(), columnwise_quantizer=_mx(), columnwise_source="rowwise")
    h = HybridQuantizer(rowwise_quantizer=_mx(), columnwise_quantizer=_plain_nvfp4())
    assert h.rowwise_quantizer.get_usages() == {"rowwise": True, "columnwise": False}
    assert h.columnwise_quantizer.get_usages() == {"rowwise": False, "columnwise": True}


@pytest.mark.parametrize("source", ["original", "rowwise_dequantized"])
def test_quantize_builds_each_copy_from_its_source(source: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    h = HybridQuantizer(rowwise_quantizer=_mx(), columnwise_quantizer=_plain_nvfp4(), columnwise_source=source)
    out = h.quantize(x)
    row_alone = _mx().quantize(x)
    assert torch.equal(
        out.rowwise_sub_storage.dequantize(dtype=torch.float32), row_alone.dequantize(dtype=torch.float32)
    )
    src = x if source == "original" else row_alone.dequantize(dtype=torch.bfloat16)
    col_q = _plain_nvfp4()
    col_q.set_usage(rowwise=False, columnwise=True)  # its columnwise copy (blocks along the other axis)
    col_alone = col_q.quantize(src)
    assert torch.equal(
        out.columnwise_sub_storage.dequantize(dtype=torch.float32), col_alone.dequantize(dtype=torch.float32)
    )
    assert torch.equal(out.dequantize(), row_alone.dequantize(dtype=torch.bfloat16))  # rowwise first
    out.update_usage(rowwise_usage=False)
    assert out.get_usages() == {"rowwise": False, "columnwise": True}
    with pytest.raises(RuntimeError, match="no rowwise sub-storage"):
        out.update_usage(rowwise_usage=True)


def _run(factory, w: torch.Tensor, x: torch.Tensor) -> tuple:  # noqa: ANN001
    lin = te.Linear(128, 128, bias=False, params_dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    xx = x.clone().requires_grad_()
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=factory)):
        out = lin(xx)
    out.float().sum().backward()
    return out.detach(), xx.grad, lin.weight.grad


def test_mxfp8_fwd_nvfp4_bwd_gemms_read_the_direction_they_need() -> None:
    torch.manual_seed(1)
    w = torch.randn(128, 128, dtype=torch.bfloat16) * 0.1
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    out, dx, dw = _run(mxfp8_fwd_nvfp4_bwd_factory, w, x)
    out_mx, _, _ = _run(mxfp8_factory, w, x)
    assert torch.equal(out, out_mx)  # fprop: MXFP8 rowwise input and weight
    _, _, dw_nv = _run(nvfp4_factory, w, x)
    assert torch.equal(dw, dw_nv)  # wgrad: NVFP4 input (from the original) and gradient, columnwise

    def dgrad_factory(role: QuantizerRole):  # the weight already MXFP8-dequantized: plain NVFP4
        return _plain_nvfp4() if role is not None and role.tensor_type == "weight" else nvfp4_factory(role)

    w_dq = _mx().quantize(w).dequantize(dtype=torch.bfloat16)
    _, dx_ref, _ = _run(dgrad_factory, w_dq, x)
    assert torch.equal(dx, dx_ref)  # dgrad: NVFP4 columnwise weight from the dequantized MXFP8 weight
    assert not torch.equal(dx, _run(dgrad_factory, w, x)[1])  # the source matters


@pytest.mark.parametrize(
    "name",
    ["mxfp8_fwd_nvfp4_bwd_factory", "high_precision_fwd_mxfp8_bwd_factory", "mxfp8_fwd_high_precision_bwd_factory"],
)
def test_ops_linear_takes_the_hybrid_copies_as_the_module(name: str) -> None:
    """``te.ops.Linear`` saves the hybrid input for wgrad and its GEMMs take each direction's sub-storage
    (TE ``_unwrap_tensor``): bit for bit the module's results (checked against the sub-quantizers above)."""
    import fp8sim.pytorch.custom_recipes.quantizer_factory_zoo as zoo
    import fp8sim.pytorch.ops as te_ops

    torch.manual_seed(2)
    w = torch.randn(128, 128, dtype=torch.bfloat16) * 0.1
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    op = te_ops.Linear(128, 128, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        op.weight.copy_(w)
    xx = x.clone().requires_grad_()
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=getattr(zoo, name))):
        out = op(xx)
    out.float().sum().backward()
    ref = _run(getattr(zoo, name), w, x)
    for got, want in zip((out.detach(), xx.grad, op.weight.grad), ref, strict=True):
        assert torch.equal(got, want)
