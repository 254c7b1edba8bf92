"""TE's GEMM epilogue under a device profile (issue 26.2; docs/semantics.md 4.8).

From TE's ``general_gemm`` and cuBLASLt's epilogue: the accumulator ``acc`` (mmaemu's, the oracle) becomes
``fl32(alpha * acc + beta * C)`` in one float32 FMA with ``alpha = fl32(scale_inv_a * scale_inv_b)``
(``beta = 0`` unless accumulating: mmaemu ``model/epilogue.py``), the bias (BF16 for FP32 activations, TE
``module/linear.py`` 498-503) is added in float32 after it (``CUBLASLT_EPILOGUE_BIAS``), and the result is
rounded once to the output dtype.  wgrad into ``main_grad`` (``accumulate=True``, beta = 1, C = main_grad)
is that one FMA, where fp8sim used to round ``alpha * acc`` first and add ``main_grad`` after.  The references
below are written from those rules: torch's float32 add for the bias, an exact ``Fraction`` rounding for the
FMA."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
torch.set_num_threads(1)

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import Float8CurrentScaling  # noqa: E402

RTX_TE = "rtx4060_cublaslt_12_8_te"


def _mmaemu():  # noqa: ANN202
    return require("mmaemu")


def _cast(v: torch.Tensor, dtype: torch.dtype, fmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8CurrentScaling (``recipe_common.cuh``): ``scale = fl32(max / amax)``, satfinite RN,
    ``scale_inv = fl32(1 / scale)``."""
    v = v.detach().float()
    scale = torch.tensor(fmax) / v.abs().max()
    return (v * scale).clamp(-fmax, fmax).to(dtype), torch.tensor(1.0) / scale


def _rn32(x: Fraction) -> np.float32:
    """``x`` rounded to float32, nearest even, from exact comparisons with its float32 neighbours."""
    f = np.float32(float(x))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))
    return np.float32(best)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).numpy()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_bias_enters_in_float32_after_alpha_then_one_rounding(dtype: torch.dtype) -> None:
    """fprop of 16 x 4096 x 32 (split 3 pairwise on the RTX 4060, TE's workspace) with a bias."""
    mmaemu = _mmaemu()
    torch.manual_seed(21)
    m = te.Linear(4096, 32, params_dtype=dtype)
    with torch.no_grad():
        m.bias.copy_(torch.randn(32) * 4)
    x = torch.randn(16, 4096, dtype=dtype)
    with torch.no_grad(), te.autocast(recipe=Float8CurrentScaling(), accumulator=RTX_TE):
        y = m(x)
    (x8, sx), (w8, sw) = _cast(x, torch.float8_e4m3fn, 448.0), _cast(m.weight, torch.float8_e4m3fn, 448.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = mmaemu.scaled_mm(x8, w8.t(), sx, sw, out_dtype=torch.float32, use_fast_accum=True, profile="ada-te")
    bias = m.bias.detach().to(torch.bfloat16 if dtype == torch.float32 else dtype).float()  # linear.py 498-503
    want = (d + bias).to(dtype)  # float32 add, then the one conversion to the output dtype
    assert np.array_equal(_bits(y), _bits(want))
    if dtype == torch.float32:  # the FP32 bias really went through BF16
        assert not torch.equal(m.bias.detach(), m.bias.detach().bfloat16().float())


@pytest.mark.parametrize("delay", [False, True], ids=["now", "backward_dw"])
def test_wgrad_into_main_grad_is_one_fma_of_the_epilogue(delay: bool) -> None:
    """TE linear.py 1249-1262: wgrad with ``accumulate=True`` into main_grad (float32 output); cublaslt_gemm.cu
    820 (beta = 1) and 774 (``D = alpha * (A * B) + beta * C``).  wgrad 48 x 128 x 2048: split 3 pairwise."""
    mmaemu = _mmaemu()
    torch.manual_seed(22)
    t, i, o = 2048, 128, 48
    m = te.Linear(
        i, o, bias=False, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True, delay_wgrad_compute=delay
    )
    c = (torch.randn(o, i) * 3).float()
    m.weight.main_grad = c.clone()
    x = torch.randn(t, i, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, o, dtype=torch.bfloat16)
    with te.autocast(recipe=Float8CurrentScaling(), accumulator=RTX_TE):
        y = m(x)
    y.backward(dy)
    if delay:
        m.backward_dw()
    (dy8, sdy), (x8, sx) = _cast(dy, torch.float8_e5m2, 57344.0), _cast(x, torch.float8_e4m3fn, 448.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = mmaemu.accumulate(
            dy8.t().contiguous(), x8.t().contiguous(), use_fast_accum=False, profile="ada-te"
        ).numpy()  # 48 x 128, reduced over the 2048 tokens, main_grad's float32 output keys the split
    alpha = np.float32(sdy.item()) * np.float32(sx.item())
    want = np.array(
        [
            _rn32(Fraction(float(a)) * Fraction(float(alpha)) + Fraction(float(cc)))
            for a, cc in zip(acc.ravel(), c.numpy().ravel(), strict=True)
        ],
        np.float32,
    ).reshape(o, i)
    got = m.weight.main_grad.numpy()
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    two_roundings = ((acc * alpha).astype(np.float32) + c.numpy()).astype(np.float32)
    assert not np.array_equal(two_roundings.view(np.int32), want.view(np.int32))  # the test tells them apart


def test_general_gemm_accumulate_is_the_same_fma() -> None:
    """TE's ``general_gemm(..., accumulate=True, out=C)`` on per-tensor FP8 operands: one FMA with C (beta = 1),
    under an accumulator preset too (unsplit: mmaemu's ``splitk=1``)."""
    mmaemu = _mmaemu()
    from fp8sim.pytorch import DType, Float8Quantizer
    from fp8sim.pytorch.cpp_extensions import general_gemm

    torch.manual_seed(23)
    x, w = torch.randn(32, 256), torch.randn(64, 256)
    qx = Float8Quantizer(torch.tensor([3.0]), torch.zeros(1), DType.kFloat8E4M3)
    qw = Float8Quantizer(torch.tensor([5.0]), torch.zeros(1), DType.kFloat8E4M3)
    xq, wq = qx(x), qw(w)
    c = torch.randn(32, 64) * 4
    out = c.clone()
    general_gemm(wq, xq, out_dtype=torch.float32, accumulate=True, out=out, accumulator="hopper_split")
    x8, w8 = (x * 3.0).to(torch.float8_e4m3fn), (w * 5.0).to(torch.float8_e4m3fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = mmaemu.accumulate(x8, w8, use_fast_accum=False, profile="hopper", splitk=1).numpy()
    alpha = np.float32(np.float32(1 / 3.0) * np.float32(1 / 5.0))
    want = np.array(
        [
            _rn32(Fraction(float(a)) * Fraction(float(alpha)) + Fraction(float(cc)))
            for a, cc in zip(acc.ravel(), c.numpy().ravel(), strict=True)
        ],
        np.float32,
    ).reshape(acc.shape)
    assert np.array_equal(out.numpy().view(np.int32), want.view(np.int32))
