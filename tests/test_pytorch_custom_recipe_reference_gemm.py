"""TE's reference quantizers as the GEMM slots of ``te.Linear`` / ``te.LayerNormLinear`` under
``CustomRecipe(qfactory=nvfp4_ref_rht_2d_factory)`` and ``current_scaling_ref_factory``.

TE (commit d0067d0) hands tensors whose ``.custom`` is True to ``custom_recipes/gemm.py`` ``custom_gemm``
(``cpp_extensions/gemm.py`` lines 245-260): fprop ``qgemm(x.data, w.data)``, dgrad (layout "NN")
``qgemm(dy.data, w.data_t)``, wgrad (layout "NT") ``qgemm(dy.data_t, x.data_t)``; ``linear.py`` passes
``out_dtype=activation_dtype`` and the bias to the fprop GEMM.  The references below are written from
``reference_nvfp4.py`` ``NVFP4QuantizerRef.qgemm`` (lines 1075-1230: per 16-wide K block an exact product
times ``outer(sx, sw)``, float32 sums in K order, ``alpha = fl32(amax_x * amax_w) / (36 * 448 * 448)``
(row amaxes, column amaxes for WGRAD), ``fl32(alpha * y)``, one cast to ``out_dtype``) and from
``reference_current_scaling.py`` ``qgemm`` (``torch._scaled_mm`` with the bias: FP8 products summed
exactly, ``fl32(fl32(sx * sw) * acc)``, ``+ bias`` in float32, one rounding), computed in float64 on the
reference quantizers' own tensors (the quantizers are tested against TE's source elsewhere).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
import fp8sim.pytorch.ops as te_ops  # noqa: E402
from fp8sim.pytorch.custom_recipes.reference_current_scaling import current_scaling_ref_factory  # noqa: E402
from fp8sim.pytorch.custom_recipes.reference_nvfp4 import nvfp4_ref_rht_2d_factory  # noqa: E402
from fp8sim.pytorch.tensor import QuantizerRole  # noqa: E402
from fp8sim.recipe import CustomRecipe  # noqa: E402

F32 = np.float32
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def _role(tensor_type: str) -> QuantizerRole:
    return QuantizerRole(module_type="linear", tensor_type=tensor_type, name="")


def _fp4(packed: torch.Tensor) -> np.ndarray:
    b = packed.view(torch.uint8).cpu().numpy()
    return _E2M1[np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)]


def _nvfp4_gemm(qx, sx, qw, sw, amax_x, amax_w, out_dtype: torch.dtype) -> torch.Tensor:
    """``NVFP4QuantizerRef.qgemm`` in float64 + explicit float32 roundings."""
    x, w = _fp4(qx), _fp4(qw)
    sx = sx.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    sw = sw.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    y = np.zeros((x.shape[0], w.shape[0]), F32)
    for j in range(x.shape[1] // 16):
        blk = slice(16 * j, 16 * j + 16)
        term = np.outer(sx[:, j], sw[:, j]) * (x[:, blk] @ w[:, blk].T)  # exact in float64 and float32
        y = (y + term.astype(F32)).astype(F32)
    alpha = (F32(amax_x) * F32(amax_w)).astype(F32) / F32(36 * 448 * 448)
    return torch.from_numpy((F32(alpha) * y).astype(F32)).to(out_dtype)


def _linear(module_cls: type, bias: bool) -> torch.nn.Module:
    torch.manual_seed(5)
    return module_cls(64, 32, bias=bias, params_dtype=torch.bfloat16)


def _data(m: int = 32):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(m, 64, generator=g) * 2).to(torch.bfloat16)
    dy = (torch.randn(m, 32, generator=g) / 4).to(torch.bfloat16)
    return x, dy


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().view(torch.int16).numpy()


def test_linear_with_nvfp4_reference_factory_runs_te_reference_gemms() -> None:
    lin = _linear(te.Linear, bias=False)
    x, dy = _data()
    x.requires_grad_(True)
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=nvfp4_ref_rht_2d_factory)):
        y = lin(x)
    y.backward(dy)
    w = lin.weight.detach()
    qx = nvfp4_ref_rht_2d_factory(_role("input")).quantize(x.detach())
    qw = nvfp4_ref_rht_2d_factory(_role("weight")).quantize(w)
    qdy = nvfp4_ref_rht_2d_factory(_role("grad_output")).quantize(dy)
    bf = torch.bfloat16
    want_y = _nvfp4_gemm(qx.data, qx.scale, qw.data, qw.scale, qx.global_amax_row, qw.global_amax_row, bf)
    want_dx = _nvfp4_gemm(qdy.data, qdy.scale, qw.data_t, qw.scale_t, qdy.global_amax_row, qw.global_amax_row, bf)
    want_dw = _nvfp4_gemm(qdy.data_t, qdy.scale_t, qx.data_t, qx.scale_t, qdy.global_amax_col, qx.global_amax_col, bf)
    np.testing.assert_array_equal(_bits(y), _bits(want_y))
    np.testing.assert_array_equal(_bits(x.grad), _bits(want_dx))
    np.testing.assert_array_equal(_bits(lin.weight.grad), _bits(want_dw))


def test_linear_nvfp4_reference_gemm_refuses_a_bias_as_te() -> None:
    """``NVFP4QuantizerRef.qgemm``: "Bias is not supported in NVFP4QuantizerRef.qgemm"."""
    lin = _linear(te.Linear, bias=True)
    x, _ = _data()
    with pytest.raises(ValueError, match="Bias is not supported in NVFP4QuantizerRef.qgemm"):
        with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=nvfp4_ref_rht_2d_factory)):
            lin(x)


def test_layernorm_linear_with_nvfp4_reference_factory_runs_te_reference_gemm() -> None:
    mod = te.LayerNormLinear(64, 32, bias=False, params_dtype=torch.bfloat16, return_layernorm_output=True)
    x, _ = _data()
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=nvfp4_ref_rht_2d_factory)):
        y, ln_out = mod(x)
    qx = nvfp4_ref_rht_2d_factory(_role("input")).quantize(ln_out.detach())
    qw = nvfp4_ref_rht_2d_factory(_role("weight")).quantize(mod.weight.detach())
    want = _nvfp4_gemm(qx.data, qx.scale, qw.data, qw.scale, qx.global_amax_row, qw.global_amax_row, torch.bfloat16)
    np.testing.assert_array_equal(_bits(y), _bits(want))


def test_linear_with_current_scaling_reference_factory_adds_the_bias_inside_its_gemm() -> None:
    """Operands of 0 and +-7 (codes 0 and +-448, scales 2^-6): every accumulator sums them exactly, so the
    check is the epilogue: ``fl32(fl32(sx * sw) * acc) + bias`` rounded once to bf16 (``torch._scaled_mm``
    with a bf16 bias; adding the bias after a bf16 GEMM output would round twice)."""
    mod = _linear(te.Linear, bias=True)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        mod.weight.copy_(7 * torch.randint(-1, 2, (32, 64), generator=g))
        mod.weight[0, 0] = 7  # amax 7
        mod.bias.copy_(torch.linspace(-1, 1, 32))
    x = (7 * torch.randint(-1, 2, (32, 64), generator=g)).to(torch.bfloat16)
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=current_scaling_ref_factory)):
        y = mod(x)
    qx = current_scaling_ref_factory(_role("input")).quantize(x)
    qw = current_scaling_ref_factory(_role("weight")).quantize(mod.weight.detach())
    acc = (qx.data.float().numpy().astype(np.float64) @ qw.data.float().numpy().astype(np.float64).T).astype(F32)
    alpha = (F32(qx.scale.item()) * F32(qw.scale.item())).astype(F32)
    d = (alpha * acc).astype(F32)
    want = torch.from_numpy((d + mod.bias.detach().float().numpy()).astype(F32)).to(torch.bfloat16)
    twice = (torch.from_numpy(d).to(torch.bfloat16).float() + mod.bias.detach().float()).to(torch.bfloat16)
    assert not torch.equal(want, twice), "the data must tell one rounding from two"
    np.testing.assert_array_equal(_bits(y), _bits(want))


def test_ops_linear_with_nvfp4_reference_factory_runs_te_reference_gemms() -> None:
    """te.ops.Linear: TE's general_gemm hands custom tensors to custom_gemm (cpp_extensions/gemm.py 245-260),
    with grad=True for BasicLinear's dgrad / wgrad GEMMs (ops/basic/basic_linear.py 922-984)."""
    torch.manual_seed(5)
    lin = te_ops.Linear(64, 32, bias=False, dtype=torch.bfloat16)
    x, dy = _data()
    x.requires_grad_(True)
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=nvfp4_ref_rht_2d_factory)):
        y = lin(x)
    y.backward(dy)
    w = lin.weight.detach()
    qx = nvfp4_ref_rht_2d_factory(_role("input")).quantize(x.detach())
    qw = nvfp4_ref_rht_2d_factory(_role("weight")).quantize(w)
    qdy = nvfp4_ref_rht_2d_factory(_role("grad_output")).quantize(dy)
    bf = torch.bfloat16
    want_y = _nvfp4_gemm(qx.data, qx.scale, qw.data, qw.scale, qx.global_amax_row, qw.global_amax_row, bf)
    want_dx = _nvfp4_gemm(qdy.data, qdy.scale, qw.data_t, qw.scale_t, qdy.global_amax_row, qw.global_amax_row, bf)
    want_dw = _nvfp4_gemm(qdy.data_t, qdy.scale_t, qx.data_t, qx.scale_t, qdy.global_amax_col, qx.global_amax_col, bf)
    np.testing.assert_array_equal(_bits(y), _bits(want_y))
    np.testing.assert_array_equal(_bits(x.grad), _bits(want_dx))
    np.testing.assert_array_equal(_bits(lin.weight.grad), _bits(want_dw))
