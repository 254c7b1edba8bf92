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

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.quantization import FP8GlobalStateManager  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8BlockwiseQTensorStorage,
    Float8TensorStorage,
    MXFP8TensorStorage,
    NVFP4TensorStorage,
    restore_from_saved,
)
from fp8sim.recipe import Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

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


# TE module/grouped_linear.py ``_GroupedLinear.forward`` (lines 893-1000): one autograd node whose saved
# tensors are ``[*inputmats, *weights_fp8, *saved_weights, *biases]``; "dequantized" keeps each split's rowwise
# FP8 input and weight (update_usage rowwise only, lines 905-913), "high_precision" forces
# ``save_original_input`` (lines 658-661): the whole input in slot 0, None in the other input slots, and the
# original weights in ``saved_weights`` (lines 920-926).
GROUPED = {k: RECIPES[k] for k in ("current", "mxfp8", "block", "nvfp4")}


@pytest.mark.parametrize("name", list(GROUPED))
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_grouped_linear_dequantized_saves_tes_layout_and_backward_reads_their_dequantize(name: str, bias: bool) -> None:
    make, cls = GROUPED[name]
    splits = [32, 32, 64] if name == "nvfp4" else [64, 0, 32, 32]  # TE: NVFP4 splits of 64 rows
    n = len(splits)
    torch.manual_seed(5)
    mod = te.GroupedLinear(n, 64, 96, bias=bias, params_dtype=torch.bfloat16)
    x = (torch.randn(sum(splits), 64) * 2).to(torch.bfloat16).requires_grad_()
    with te.autocast(recipe=make(backward_override="dequantized")):
        y = mod(x, splits)
    assert type(y.grad_fn).__name__ == "_GroupedLinearBackward"
    assert y.grad_fn.backward_override == "dequantized"
    assert not y.grad_fn.fp8 and not y.grad_fn.reduce_and_update_bwd_fp8_tensors
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert len(saved) == 4 * n
    for t in saved[: 2 * n]:
        _check_rowwise_storage(t, cls)
    assert all(t is None for t in saved[2 * n : 3 * n])
    assert [t is None for t in saved[3 * n :]] == [not bias] * n
    assert [t.size(0) for t in saved[:n]] == splits
    x_dq = [t.dequantize(dtype=torch.bfloat16) for t in saved[:n]]
    w_dq = [t.dequantize(dtype=torch.bfloat16) for t in saved[n : 2 * n]]
    dys, perms = zip(*(_one_hot_dy(m, 96, torch.bfloat16) for m in splits), strict=True)
    dy = torch.cat(dys)
    y.backward(dy)
    assert torch.equal(x.grad, torch.cat([w[p] for w, p in zip(w_dq, perms, strict=True)]))
    for i in range(n):
        dw_ref = torch.zeros(96, 64, dtype=torch.bfloat16)
        dw_ref[perms[i]] = x_dq[i]
        assert torch.equal(getattr(mod, f"weight{i}").grad, dw_ref), i
        if bias:
            assert torch.equal(getattr(mod, f"bias{i}").grad, dys[i].sum(0)), i


def test_grouped_linear_high_precision_saves_the_whole_input_in_slot_0_and_the_weights() -> None:
    mod = te.GroupedLinear(2, 64, 32, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
        y = mod(x, [32, 32])
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert type(saved[0]) is torch.Tensor and torch.equal(saved[0], x.detach()) and saved[1] is None
    for t in saved[2:4]:
        _check_rowwise_storage(t, Float8TensorStorage)
    assert all(torch.equal(t, getattr(mod, f"weight{i}").detach()) for i, t in enumerate(saved[4:6]))


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_grouped_linear_grad_fn_shows_tes_backward_state(override: str | None) -> None:
    """TE grouped_linear.py 967-1000: an override turns ``fp8`` and the backward reduce-and-update off."""
    mod = te.GroupedLinear(2, 64, 32)
    with te.autocast(recipe=Float8CurrentScaling(backward_override=override)):
        y = mod(torch.randn(64, 64, requires_grad=True), [32, 32])
    assert y.grad_fn.backward_override == override
    assert y.grad_fn.fp8 is (override is None)
    assert y.grad_fn.reduce_and_update_bwd_fp8_tensors is (override is None)


def _norm_autograd_reference(
    normalization: str, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, d_ln: torch.Tensor
) -> torch.Tensor:
    """dx of the float32 norm by torch's autograd (F.layer_norm, or RMSNorm as torch ops), in bf16."""
    x32 = x.detach().float().requires_grad_()
    if normalization == "LayerNorm":
        y = torch.nn.functional.layer_norm(x32, (x.shape[-1],), gamma.float(), beta.float(), 1e-5)
    else:
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma.float()
    (dx,) = torch.autograd.grad(y, x32, d_ln.float())
    return dx.to(torch.bfloat16)


@pytest.mark.parametrize("name", ["current", "mxfp8", "block", "nvfp4"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_dequantized_saves_tes_layout_and_the_norm_backward_reads_it(
    name: str, normalization: str
) -> None:
    """TE layernorm_linear.py 526-537 (saved ``[inputmat, weightmat, weight, bias, ln_weight, ln_out, mu,
    rsigma]``), 768-772 / 853-857 (the backward GEMMs read the dequantized ln_out and weight) and 1139-1163
    (dx: the norm backward from the saved statistics).  Reference: one-hot ``dy`` picks rows of the
    dequantized weight (d ln_out) and of the dequantized ln_out (dW); dx is torch's autograd of the float32
    norm fed that d ln_out."""
    make, cls = RECIPES[name]
    torch.manual_seed(7)
    mod = te.LayerNormLinear(64, 96, bias=True, params_dtype=torch.bfloat16, normalization=normalization)
    with torch.no_grad():
        mod.layer_norm_weight.normal_(1, 0.2)
        if mod.layer_norm_bias is not None:
            mod.layer_norm_bias.normal_()
    x = (torch.randn(2, 16, 64) * 3 + 1).to(torch.bfloat16).requires_grad_()
    with te.autocast(recipe=make(backward_override="dequantized")):
        y = mod(x)
    assert type(y.grad_fn).__name__ == "_FP8LinearBackward"
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert len(saved) == 8
    inputmat, w_st, w_orig, b, ln_w, ln_st, mu, rsigma = saved
    assert type(inputmat) is torch.Tensor and torch.equal(inputmat, x.detach().reshape(32, 64))
    _check_rowwise_storage(w_st, cls)
    _check_rowwise_storage(ln_st, cls)
    assert w_orig is mod.weight and torch.equal(b, mod.bias.detach())
    assert ln_w.dtype == torch.bfloat16 and torch.equal(ln_w, mod.layer_norm_weight.detach())
    x64 = x.detach().double().reshape(32, 64)
    if normalization == "LayerNorm":
        assert mu.dtype == torch.float32 and mu.shape == (32,)
        assert torch.allclose(mu.double(), x64.mean(-1), rtol=1e-6, atol=1e-6)
        var = x64.var(-1, unbiased=False)
    else:
        assert mu is None
        var = x64.pow(2).mean(-1)
    assert rsigma.dtype == torch.float32 and rsigma.shape == (32,)
    assert torch.allclose(rsigma.double(), (var + 1e-5).rsqrt(), rtol=1e-5)
    ln_dq, w_dq = ln_st.dequantize(dtype=torch.bfloat16), w_st.dequantize(dtype=torch.bfloat16)
    dy, perm = _one_hot_dy(32, 96, torch.bfloat16)
    y.backward(dy.reshape(2, 16, 96))
    d_ln = w_dq[perm]
    dx_ref = _norm_autograd_reference(normalization, x.reshape(32, 64), ln_w, mod.layer_norm_bias, d_ln)
    assert torch.equal(x.grad.reshape(32, 64), dx_ref)
    dw_ref = torch.zeros(96, 64, dtype=torch.bfloat16)
    dw_ref[perm] = ln_dq.reshape(32, 64)
    assert torch.equal(mod.weight.grad, dw_ref)


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_layernorm_linear_grad_fn_is_one_function_with_tes_backward_state(override: str | None) -> None:
    """TE layernorm_linear.py 591-612: the norm and the GEMM are one autograd node; an override turns ``fp8``,
    the grad-output quantizer and the backward reduce-and-update off.  "high_precision" saves ln_out itself."""
    mod = te.LayerNormLinear(64, 32)
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling(backward_override=override)):
        y = mod(x)
    nexts = [f for f, _ in y.grad_fn.next_functions]  # x, weight, bias, ..., ln_weight, ln_bias: no norm node
    assert nexts[0].variable is x and nexts[1].variable is mod.weight
    assert nexts[-2].variable is mod.layer_norm_weight and nexts[-1].variable is mod.layer_norm_bias
    state = y.grad_fn.backward_objects
    assert state.backward_override == override and state.fp8 is (override is None)
    assert state.reduce_and_update_bwd_fp8_tensors is (override is None)
    assert (state.grad_output_quantizer is None) is (override is not None)
    if override == "high_precision":
        ln_out = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))[5]
        ref = torch.nn.functional.layer_norm(x.detach(), (64,), mod.layer_norm_weight, mod.layer_norm_bias)
        assert type(ln_out) is torch.Tensor and torch.equal(ln_out, ref.detach().reshape(32, 64))


def test_layernorm_linear_sm_margins_come_from_tes_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """TE layernorm_linear.py 1589-1591 (and layernorm_mlp.py 2172-2174): the norm kernels' SM margins."""
    monkeypatch.setenv("NVTE_BWD_LAYERNORM_SM_MARGIN", "8")
    for mod in (te.LayerNormLinear(64, 32), te.LayerNormMLP(64, 32)):
        assert (mod.fwd_ln_sm_margin, mod.bwd_ln_sm_margin, mod.inf_ln_sm_margin) == (0, 8, 0)


def test_grouped_linear_takes_splits_of_any_row_count_as_te_does() -> None:
    """TE grouped_linear.py quantizes the splits without ``assert_dim_for_fp8_exec`` (TE's own test runs
    ``[1, 31, 0, 96]`` under current scaling on Blackwell): a 1-row split runs, and its backward reads the
    dequantized saved operands as every split's does."""
    splits = [1, 31, 0, 96]
    mod = te.GroupedLinear(4, 64, 128, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(128, 64, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="dequantized")):
        y = mod(x, splits)
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    w_dq = [t.dequantize(dtype=torch.bfloat16) for t in saved[4:8]]
    dys, perms = zip(*(_one_hot_dy(m, 128, torch.bfloat16) for m in splits), strict=True)
    y.backward(torch.cat(dys))
    assert torch.equal(x.grad, torch.cat([w[p] for w, p in zip(w_dq, perms, strict=True)]))


def test_grouped_linear_high_precision_without_input_grad_saves_no_weights_and_still_trains() -> None:
    """TE grouped_linear.py 920-926: the original weights are saved only when the input needs a gradient;
    the weight gradients (one-hot ``dy``: rows of the input) need none of them."""
    mod = te.GroupedLinear(2, 64, 96, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    with te.autocast(recipe=Float8CurrentScaling(backward_override="high_precision")):
        y = mod(x, [32, 32])
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert saved[4] is None and saved[5] is None
    (dy0, p0), (dy1, p1) = _one_hot_dy(32, 96, torch.bfloat16), _one_hot_dy(32, 96, torch.bfloat16)
    y.backward(torch.cat([dy0, dy1]))
    for i, (p, rows) in enumerate(((p0, x[:32]), (p1, x[32:]))):
        ref = torch.zeros(96, 64, dtype=torch.bfloat16)
        ref[p] = rows
        assert torch.equal(getattr(mod, f"weight{i}").grad, ref), i
