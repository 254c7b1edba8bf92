"""FP8 primary weights (``quantized_model_init``) for the block recipes, as TE builds and uses them.

References written from NVIDIA/TransformerEngine at d0067d0:

- ``pytorch/module/base.py`` ``reset_parameters`` (lines 1835-1895): the weight is initialised in
  high precision, a CPU copy is kept when ``preserve_high_precision_init_val``, then
  ``quantizer = self.quantizers["scaling_fwd"][fp8_meta_index]``,
  ``quantizer.set_usage(rowwise=True, columnwise=torch.is_grad_enabled())``, ``param = quantizer(param)``
  wrapped in ``nn.Parameter``;
- ``pytorch/quantization.py`` the weight slot's quantizer: ``MXFP8BlockScalingRecipeState.make_quantizers``
  (lines 1529-1549: ``MXFP8Quantizer(dtype, with_2d_quantization=...)`` for linear/grouped_linear weights),
  ``Float8BlockScalingRecipeState.make_quantizers`` (1611-1633: ``fp8_quant_fwd_weight``'s
  ``amax_epsilon`` / ``power_2_scale`` and ``w_block_scaling_dim``), ``NVFP4BlockScalingRecipeState``
  (1700-1745: ``fp4_quant_fwd_weight``'s RHT / 2D / stochastic rounding, no row scaling for weights);
- ``pytorch/quantized_tensor.py`` ``__torch_dispatch__`` (lines 1009-1022): an in-place op (an optimizer
  step) on a quantized tensor dequantizes the arguments, runs the op, and ``quantize_``s the written
  argument back with the tensor's own quantizer.

A module whose weights were quantized at init gives the bits of the same module with high-precision
weights: TE quantizes the high-precision weight with the same weight quantizer on every forward
(``linear.py``), and every block quantizer is deterministic except stochastic rounding (NVFP4
gradients draw hardware random bits in TE), which these tests turn off.
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    NVFP4Quantizer,
    NVFP4Tensor,
)
from fp8sim.recipe import Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling  # noqa: E402

torch.set_num_threads(1)

_NO_SR = dict(disable_stochastic_rounding=True)


def _te_weight_quantizer(recipe: object) -> object:
    """The forward weight slot's quantizer, written from TE ``quantization.py`` (see module docstring)."""
    e4m3 = DType.kFloat8E4M3
    if isinstance(recipe, MXFP8BlockScaling):
        return MXFP8Quantizer(e4m3, with_2d_quantization=recipe.enable_2d_quantization)
    if isinstance(recipe, Float8BlockScaling):
        qp = recipe.fp8_quant_fwd_weight
        return Float8BlockQuantizer(
            e4m3,
            rowwise=True,
            columnwise=True,
            amax_epsilon=qp.amax_epsilon,
            force_pow_2_scales=qp.power_2_scale,
            block_scaling_dim=recipe.w_block_scaling_dim,
        )
    qp = recipe.fp4_quant_fwd_weight
    return NVFP4Quantizer(
        with_rht=qp.random_hadamard_transform,
        with_post_rht_amax=qp.random_hadamard_transform,
        with_2d_quantization=qp.fp4_2d_quantization,
        stochastic_rounding=qp.stochastic_rounding,
    )


RECIPES = {
    "mxfp8": (MXFP8BlockScaling(), MXFP8Tensor),
    "mxfp8_2d": (MXFP8BlockScaling(enable_2d_quantization=True), MXFP8Tensor),
    "block": (Float8BlockScaling(), Float8BlockwiseQTensor),
    "block_1d_weights": (Float8BlockScaling(w_block_scaling_dim=1), Float8BlockwiseQTensor),
    "nvfp4": (NVFP4BlockScaling(**_NO_SR), NVFP4Tensor),
    "nvfp4_1d": (NVFP4BlockScaling(**_NO_SR, disable_2d_quantization=True), NVFP4Tensor),
}
_FIELDS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


def _assert_same_buffers(got: object, want: object) -> None:
    names = _FIELDS + (("_amax_rowwise", "_amax_columnwise") if isinstance(want, NVFP4Tensor) else ())
    for name in names:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            diff = (a != b).nonzero()
            if diff.numel():
                i = tuple(diff[0].tolist())
                raise AssertionError(f"{name}: first difference at {i}: {a[i].item()} != {b[i].item()}")


@pytest.mark.parametrize("name", list(RECIPES))
def test_block_primary_weight_is_the_weight_quantizer_applied_at_init(name: str) -> None:
    recipe, cls = RECIPES[name]
    torch.manual_seed(3)
    with te.quantized_model_init(recipe=recipe, preserve_high_precision_init_val=True):
        m = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)
    w = m.weight
    assert type(w) is torch.nn.Parameter or isinstance(w, torch.nn.Parameter)
    assert isinstance(w, cls) and w.dtype == torch.bfloat16 and w.shape == (32, 64)
    hp = w.get_high_precision_init_val()
    torch.manual_seed(3)
    assert hp.device.type == "cpu" and torch.equal(hp, torch.empty(32, 64).normal_(0, 0.023).to(torch.bfloat16))
    _assert_same_buffers(w, _te_weight_quantizer(recipe)(hp))
    w.clear_high_precision_init_val()
    assert w.get_high_precision_init_val() is None
    with torch.no_grad(), te.quantized_model_init(recipe=recipe):
        frozen = te.Linear(64, 32, bias=False)
    assert frozen.weight._rowwise_data is not None and frozen.weight._columnwise_data is None  # columnwise=grad


def test_mxfp8_primary_weight_values_match_an_e8m0_reference() -> None:
    """TE ``common/cast/mxfp8/quantize_mxfp8.cuh``: per 32 elements, ``e = float_to_e8m0(amax * fl32(1/448))``
    rounded up (lines 440-441), codes ``RN_sat(x * 2^(127 - e))`` in E4M3; dequantized ``code * 2^(e - 127)``."""
    torch.manual_seed(4)
    with te.quantized_model_init(recipe=MXFP8BlockScaling(), preserve_high_precision_init_val=True):
        m = te.Linear(64, 32, bias=False)
    x = m.weight.get_high_precision_init_val().numpy().reshape(32, 2, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32)
    val = (amax * np.float32(1 / 448)).astype(np.float32)
    exp = np.floor(np.log2(val)).astype(np.int32) + 127
    exp = exp + (val > np.ldexp(np.float32(1), exp - 127))  # ceil: up unless already a power of two
    scaled = (x * np.ldexp(np.float32(1), 127 - exp)).astype(np.float32)
    want = np.clip(scaled, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.ldexp(
        np.float32(1), exp - 127
    )
    got = m.weight.dequantize(dtype=torch.float32).detach().numpy().reshape(32, 2, 32)
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


def _modules(recipe: object) -> dict:
    return {
        "Linear": lambda: te.Linear(64, 32, params_dtype=torch.bfloat16),
        "LayerNormLinear": lambda: te.LayerNormLinear(64, 32, params_dtype=torch.bfloat16),
        "LayerNormMLP": lambda: te.LayerNormMLP(64, 32, params_dtype=torch.bfloat16),
        "GroupedLinear": lambda: te.GroupedLinear(2, 64, 32, params_dtype=torch.bfloat16),
    }


def _run(m: object, x: torch.Tensor, recipe: object, grouped: bool) -> tuple:
    x = x.detach().clone().requires_grad_()
    with te.autocast(recipe=recipe):
        y = m(x, [32, 32]) if grouped else m(x)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=torch.float32).reshape(y.shape).to(y.dtype))
    grads = [p.grad for _, p in sorted(m.named_parameters())]
    return y, x.grad, grads


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8_2d", "block", "nvfp4"])
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"])
def test_block_primary_weights_give_the_bits_of_high_precision_weights(name: str, module: str) -> None:
    recipe, cls = RECIPES[name]
    make = _modules(recipe)[module]
    torch.manual_seed(5)
    ref = make()
    torch.manual_seed(5)
    with te.quantized_model_init(recipe=recipe):
        fp8 = make()
    weights = [p for n, p in fp8.named_parameters() if "weight" in n and "layer_norm" not in n]
    assert weights and all(isinstance(p, cls) for p in weights)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got, want = _run(fp8, x, recipe, module == "GroupedLinear"), _run(ref, x, recipe, module == "GroupedLinear")
    for what, a, b in (("output", got[0], want[0]), ("dgrad", got[1], want[1])):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{module} {name} {what} differs"
    for i, (a, b) in enumerate(zip(got[2], want[2], strict=True)):
        assert a is not None and a.dtype == b.dtype and torch.equal(a, b), f"{module} {name} grad {i} differs"


@pytest.mark.parametrize("name", ["mxfp8", "block", "nvfp4"])
def test_optimizer_step_requantizes_the_block_primary_weight_in_place(name: str) -> None:
    """TE ``quantized_tensor.py`` lines 1009-1022: ``param.add_(grad, alpha=-lr)`` on a quantized tensor
    is ``dequantize`` -> the op in the nominal dtype -> ``quantize_`` into the same tensor."""
    recipe, cls = RECIPES[name]
    torch.manual_seed(7)
    with te.quantized_model_init(recipe=recipe):
        m = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)
    w = m.weight
    before = w.dequantize().detach().clone()
    ptr = w._rowwise_data.data_ptr()
    grad = torch.randn(32, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    w.grad = grad
    torch.optim.SGD([w], lr=0.5).step()
    assert isinstance(m.weight, cls) and m.weight is w and w._rowwise_data.data_ptr() == ptr
    _assert_same_buffers(w, _te_weight_quantizer(recipe)(before.add(grad, alpha=-0.5)))


def test_new_amax_history_len_hands_the_fp8_weight_the_rebuilt_quantizer() -> None:
    """TE ``module/base.py`` lines 1066-1083: when ``amax_history_len`` changes the history is cut or padded,
    the quantizers are rebuilt over the new buffers and ``_update_weight_quantizers`` gives each FP8 weight
    its new one, so a later in-place quantization (an optimizer step) folds its amax into the live history."""
    from fp8sim.recipe import DelayedScaling

    with te.quantized_model_init(recipe=DelayedScaling(amax_history_len=4)):
        m = te.Linear(32, 32, bias=False)
    x = torch.randn(32, 32)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
        m(x)
    with (
        pytest.warns(UserWarning, match="Quantizer is being updated"),
        te.autocast(recipe=DelayedScaling(amax_history_len=8)),
    ):
        m(x)
    state = m.fp8_gemms["gemm"].fwd
    assert state.amax_history.shape == (8, 3)
    with torch.no_grad():
        m.weight.copy_(torch.full((32, 32), 3.0))  # in place: re-quantized with the weight's quantizer
    assert state.amax_history[0, 1] == np.float32(3.0)  # the WEIGHT slot of the live history


@pytest.mark.parametrize("name", ["block", "nvfp4", "mxfp8", "block_1d_weights", "nvfp4_1d"])
def test_weights_built_without_grad_make_the_columnwise_copy_where_te_can(name: str) -> None:
    """TE ``linear.py`` backward (line 1051) calls ``weight_fp8.update_usage(columnwise_usage=True)``: 2D-tiled
    tensors make the columnwise copy from the rowwise one (``storage/float8_blockwise_tensor_storage.py``
    ``_create_columnwise`` 394-424, ``storage/nvfp4_tensor_storage.py`` 424-480), which equals quantizing with
    columnwise usage; MXFP8 and 1D tiles raise TE's errors (mxfp8 storage line 310, blockwise 478-483, NVFP4
    429)."""
    recipe, _ = RECIPES[name]
    torch.manual_seed(9)
    with torch.no_grad(), te.quantized_model_init(recipe=recipe, preserve_high_precision_init_val=True):
        m = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)
    assert m.weight._columnwise_data is None
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    errors = {
        "mxfp8": (RuntimeError, "MXFP8Tensor is missing column-scaled FP8 data"),
        "block_1d_weights": (AssertionError, "Cannot update to rowwise and columnwise usage."),
        "nvfp4_1d": (RuntimeError, "Cannot create columnwise data without 2D quantization enabled."),
    }
    if name in errors:
        exc, message = errors[name]
        with pytest.raises(exc, match=message), te.autocast(recipe=recipe):
            m(x)
        return
    with te.autocast(recipe=recipe):
        m(x).sum().backward()
    _assert_same_buffers(m.weight, _te_weight_quantizer(recipe)(m.weight.get_high_precision_init_val()))
