"""What the modules save for ``recipe.backward_override``, in TE's layout (TE 2.20.0.dev0 at d0067d0).

TE ``module/linear.py`` ``_linear_forward_impl`` / ``_linear_setup_ctx`` (lines 590-786): the saved
tensors go through ``prepare_for_saving`` as ``[inputmat, weightmat, weight, bias]``, the objects to
restore into on ``ctx.tensor_objects``, the backward state on ``ctx.backward_objects`` (``LinearBwdArgs``).
Under "dequantized" the input and weight are the rowwise FP8 copies of fprop (the quantizers' storages,
columnwise dropped, lines 600-607), and the backward GEMMs read ``dequantize(dtype=activation_dtype)`` of
them (lines 1076-1081).  The references here are TE's test (tests/pytorch/test_backward_override.py,
``_compute_linear_backward_reference_from_saved_operands``) with exact GEMMs: ``dy`` one-hot per row and
column, so ``dx`` selects rows of the dequantized weight and ``dW`` rows of the dequantized input, whatever
the GEMM's accumulation (no fp8sim GEMM involved).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import fp8sim.pytorch as te
from fp8sim.pytorch.quantization import FP8GlobalStateManager
from fp8sim.pytorch.tensor import (
    Float8BlockwiseQTensorStorage,
    Float8TensorStorage,
    MXFP8TensorStorage,
    NVFP4TensorStorage,
    restore_from_saved,
)
from fp8sim.recipe import Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling

_NVFP4 = dict(disable_rht=True, disable_stochastic_rounding=True)  # TE's test make_recipe("nvfp4")
RECIPES = {
    "current": (lambda **kw: Float8CurrentScaling(**kw), Float8TensorStorage),
    "mxfp8": (lambda **kw: MXFP8BlockScaling(**kw), MXFP8TensorStorage),
    "block": (lambda **kw: Float8BlockScaling(**kw), Float8BlockwiseQTensorStorage),
    "nvfp4": (lambda **kw: NVFP4BlockScaling(**_NVFP4, disable_2d_quantization=True, **kw), NVFP4TensorStorage),
    "nvfp4_4over6": (
        lambda **kw: NVFP4BlockScaling(**_NVFP4, disable_2d_quantization=False, nvfp4_4over6="all", **kw),
        NVFP4TensorStorage,
    ),
}


@pytest.fixture(autouse=True)
def _reset() -> None:
    yield
    FP8GlobalStateManager.reset()


def _one_hot_dy(m: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``dy`` (m, n) with one 1 per row and at most one per column (m <= n), and the columns it picks."""
    perm = torch.randperm(n)[:m]
    dy = torch.zeros(m, n, dtype=dtype)
    dy[torch.arange(m), perm] = 1
    return dy, perm


def _check_rowwise_storage(t: object, cls: type) -> None:
    assert isinstance(t, cls) and not isinstance(t, torch.Tensor), type(t)
    if cls is not Float8TensorStorage:  # TE's per-tensor storage has _data / _transpose instead
        assert t._rowwise_data is not None and t._columnwise_data is None


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_linear_dequantized_saves_rowwise_storages_and_backward_reads_their_dequantize(
    name: str, dtype: torch.dtype
) -> None:
    make, cls = RECIPES[name]
    torch.manual_seed(0)
    lin = te.Linear(64, 96, bias=True, params_dtype=dtype)
    x = (torch.randn(32, 64) * 2).to(dtype).requires_grad_()
    with te.autocast(recipe=make(backward_override="dequantized")):
        y = lin(x)
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert len(saved) == 4
    x_st, w_st, w_orig, b = saved
    _check_rowwise_storage(x_st, cls)
    _check_rowwise_storage(w_st, cls)
    assert w_orig is lin.weight and b.shape == lin.bias.shape  # an fp32 bias goes through bf16 (cuBLAS)
    x_dq, w_dq = x_st.dequantize(dtype=dtype), w_st.dequantize(dtype=dtype)
    rowwise = x_st._data if cls is Float8TensorStorage else x_st._rowwise_data
    dy, perm = _one_hot_dy(32, 96, dtype)
    y.backward(dy)
    assert torch.equal(x.grad, w_dq[perm]), name
    dw_ref = torch.zeros(96, 64, dtype=dtype)
    dw_ref[perm] = x_dq
    assert torch.equal(lin.weight.grad, dw_ref), name
    # the saved buffers are the fprop codes, kept (TE's test: no requantization, no usage change)
    assert (x_st._data if cls is Float8TensorStorage else x_st._rowwise_data) is rowwise


def test_linear_dequantized_saved_mxfp8_input_decodes_as_codes_times_e8m0_scales() -> None:
    """The saved MXFP8 input is the fprop copy: E4M3 codes (ml_dtypes) times 2^(s - 127) per 32 along K."""
    torch.manual_seed(1)
    lin = te.Linear(64, 32, bias=False)
    x = torch.randn(32, 64) * 3
    with te.autocast(recipe=MXFP8BlockScaling(backward_override="dequantized")):
        y = lin(x.requires_grad_())
    x_st = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))[0]
    codes = x_st._rowwise_data.numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    s = x_st._rowwise_scale_inv[:32, :2].numpy().astype(np.float64)
    ref = codes * np.repeat(np.exp2(s - 127), 32, axis=1)
    assert np.array_equal(x_st.dequantize(dtype=torch.float32).numpy().astype(np.float64), ref)


def test_linear_high_precision_saves_the_original_input() -> None:
    """TE linear.py 303-305: "high_precision" forces ``save_original_input``: slot 0 is the input itself."""
    lin = te.Linear(64, 32)
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
        y = lin(x)
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert type(saved[0]) is torch.Tensor and torch.equal(saved[0], x.detach())


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_linear_backward_objects_show_tes_backward_state(override: str | None) -> None:
    """TE linear.py 762-771 and 1437-1444: an override turns ``fp8`` off, drops the grad-output quantizer
    and the backward reduce-and-update; without one the first module does both."""
    lin = te.Linear(64, 32)
    with te.autocast(recipe=Float8CurrentScaling(backward_override=override)):
        y = lin(torch.randn(32, 64, requires_grad=True))
    state = y.grad_fn.backward_objects
    assert state.backward_override == override
    assert state.fp8 is (override is None)
    assert state.reduce_and_update_bwd_fp8_tensors is (override is None)
    q = state.grad_output_quantizer
    assert (q is None) is (override is not None)
    if q is not None:
        assert type(q).__name__ == "Float8CurrentScalingQuantizer"


@pytest.mark.parametrize("name", ["current", "mxfp8", "nvfp4"])
def test_ops_linear_dequantized_saves_its_internal_quantizers_storages(name: str) -> None:
    """TE ops/basic/basic_linear.py: the input (and non-exposed weight) quantizers are ``internal=True``,
    so what the fuser saves under "dequantized" is their rowwise storage, and the backward GEMMs read
    its ``dequantize``."""
    import fp8sim.pytorch.ops as te_ops

    make, cls = RECIPES[name]
    torch.manual_seed(3)
    lin = te_ops.Linear(64, 96, bias=False, dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(recipe=make(backward_override="dequantized")):
        y = lin(x)
    x_st, w_st = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))[:2]
    _check_rowwise_storage(x_st, cls)
    _check_rowwise_storage(w_st, cls)
    x_dq, w_dq = x_st.dequantize(dtype=torch.bfloat16), w_st.dequantize(dtype=torch.bfloat16)
    dy, perm = _one_hot_dy(32, 96, torch.bfloat16)
    y.backward(dy)
    assert torch.equal(x.grad, w_dq[perm])
    dw_ref = torch.zeros(96, 64, dtype=torch.bfloat16)
    dw_ref[perm] = x_dq
    assert torch.equal(lin.weight.grad, dw_ref)
