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


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _nvfp4_fields(t: object, rows: int, cols: int) -> tuple:
    """(element values code * block scale, float32 (rows,)) from a TE NVFP4 tensor's rowwise buffers, decoded
    here: two E2M1 codes per byte (element 2i in the low nibble), E4M3 block scales per 16, amax per row or one."""
    import ml_dtypes
    import numpy as np

    packed = t._rowwise_data.reshape(rows, cols // 2).numpy()
    nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(rows, cols)
    vals = np.where(nib & 8, -1.0, 1.0) * np.asarray(_E2M1)[nib & 7]
    blk = t._rowwise_scale_inv[:rows, : cols // 16].numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    amax = np.broadcast_to(t._amax_rowwise.reshape(-1).numpy().astype(np.float32), (rows,))
    return vals * np.repeat(blk, 16, axis=1), amax


def test_row_scaled_nvfp4_forward_factory_runs_the_row_scaled_input_in_the_module_gemm() -> None:
    """TE's zoo ``nvfp4_row_scaled_fwd_high_precision_bwd_factory``: the Linear's input is row-scaled NVFP4 (one
    global amax per row, ``NVFP4Quantizer(row_scaled_nvfp4=True)``), the weight plain NVFP4.  With a 0/1 weight
    (output j is input column 2j: one product per element) the forward is ``fl32(D * fl32(g_x[row] * g_w))``,
    D = code * block scale products, ``g = 1 / fl32(6 * 448 / amax)``: the global factors after the sum, as TE's
    NVFP4 GEMM reference (tests/pytorch/nvfp4/test_nvfp4_gemm_exact.py) applies them, per row here.  Decoded
    in the test from the tensors' buffers.  fp8sim refused the row-scaled input here before (as a weight)."""
    import numpy as np

    from fp8sim.pytorch.custom_recipes.quantizer_factory_zoo import (
        nvfp4_row_scaled_fwd_high_precision_bwd_factory,
    )

    m = te.Linear(64, 32, bias=False, params_dtype=torch.float32)
    with torch.no_grad():
        m.weight.zero_()
        m.weight[torch.arange(32), 2 * torch.arange(32)] = 1.0
    torch.manual_seed(0)
    x = torch.randn(32, 64) * torch.logspace(-3, 3, 32).unsqueeze(1)  # rows far apart: one global scale each
    recipe = CustomRecipe(qfactory=nvfp4_row_scaled_fwd_high_precision_bwd_factory)
    with te.autocast(recipe=recipe, accumulator="exact"):  # the block-scaled GEMM (the default sums dequantized)
        y = m(x)
    row_q = te.NVFP4Quantizer(with_rht=False, with_post_rht_amax=False, row_scaled_nvfp4=True, columnwise=False)
    dx, ax = _nvfp4_fields(row_q(x), 32, 64)
    dw, aw = _nvfp4_fields(_plain_nvfp4()(m.weight.detach()), 32, 64)
    assert len(set(ax.tolist())) == 32 and set(aw.tolist()) == {1.0}
    d = (dx @ dw.T).astype(np.float32)  # one nonzero product per element: exact
    gx = np.float32(1) / (np.float32(6 * 448) / ax)
    gw = np.float32(1) / (np.float32(6 * 448) / aw[0])
    want = (d * (gx * gw)[:, None].astype(np.float32)).astype(np.float32)
    assert np.array_equal(y.detach().numpy().view(np.uint32), want.view(np.uint32))
