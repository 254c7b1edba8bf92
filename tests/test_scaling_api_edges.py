"""Public scaling entry points at their edges: ``quantize_with_scale`` (default format, saturation, scale 0),
``quantize_mx_rowwise_columnwise`` (every argument reaches both copies, the input's dtype kept, messages name
``x``), the NVFP4-variant record helpers (3-D records, messages), and the package's old-name ``__getattr__``.
Oracles: ml_dtypes' casts, values by hand, and for the two MX copies :func:`quantize_mx` along each axis (the
documented contract: "arguments as quantize_mx", each copy from the high-precision input)."""

from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import pytest

import fp8sim.scaling
from fp8sim.formats import E2M1, E4M3
from fp8sim.scaling.current import quantize_current_scaling, quantize_torchao, quantize_with_scale
from fp8sim.scaling.mx import quantize_mx, quantize_mx_rowwise_columnwise
from fp8sim.scaling.nvfp4_variants import dequantize_nvfp4_variant, nvfp4_variant_of, quantize_nvfp4_variant
from fp8sim.scaling.quantized import QuantizedData
from fp8sim.scaling.swizzle import to_blocked, with_blocked_scales
from fp8sim.testing.oracles import require

torch = require("torch")


def test_quantize_with_scale_defaults_to_e4m3_saturates_and_rounds_scale_inv_once() -> None:
    x = np.array([0.1, -1.7, 3.0, 500.0, -1e30, np.nan, 0.0], np.float32)
    q = quantize_with_scale(torch.from_numpy(x).to(torch.bfloat16), 7.0)
    xb = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    want = np.clip(xb * np.float32(7.0), -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(q.codes, want)
    assert q.fmt == E4M3 and q.dtype == "bfloat16" and q.shape == (7,) and q.block == (7,)
    assert q.scales.dtype == np.float32 and q.scales.tolist() == [np.float32(1) / np.float32(7)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q0 = quantize_with_scale(np.ones(2, np.float32), 0.0, "e5m2")
    assert q0.scales.tolist() == [np.inf] and q0.codes.tolist() == [0, 0]


def _mx_input(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-8, 8, (64, 1), generator=g))
    x[0, 0] = x[0, 40] = 57312.0  # mxfma's case (spec 5.2): fp16 amax 57312 -> E5M2 scale 128, not 127
    return x.to(dtype)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"elem_format": "e5m2", "flavor": "te", "scale_rule": "rceil", "mxfma": True},
        {"elem_format": "e2m1", "block_size": 16, "scale_rule": "even"},
        {"flavor": "torchao", "pad": True},
    ],
    ids=["defaults", "te-mxfma-e5m2", "fp4-16-even", "torchao-pad"],
)
def test_rowwise_columnwise_copies_are_quantize_mx_along_each_axis(kw: dict) -> None:
    x = _mx_input(torch.float16 if kw.get("mxfma") else torch.bfloat16)
    row, col = quantize_mx_rowwise_columnwise(x, **kw)
    for got, axis in ((row, -1), (col, 0)):
        want = quantize_mx(x, axis=axis, **kw)
        assert got.dtype == want.dtype == str(x.dtype).removeprefix("torch.") and got.block == want.block
        np.testing.assert_array_equal(got.codes, want.codes)
        np.testing.assert_array_equal(got.scales, want.scales)
    if kw.get("mxfma"):  # the option changes this input's codes: it reached the copies
        plain = quantize_mx_rowwise_columnwise(x, **{**kw, "mxfma": False})
        assert row.scales[0, 0] == col.scales[0, 0] == 128
        assert plain[0].scales[0, 0] == plain[1].scales[0, 0] == 127


def test_rowwise_columnwise_pad_reaches_both_copies_and_messages_name_x() -> None:
    x = np.ones((40, 48), np.float32)  # 40 rows: the columnwise copy needs padding
    with pytest.raises(ValueError):
        quantize_mx_rowwise_columnwise(x, flavor="torchao")
    row, col = quantize_mx_rowwise_columnwise(x, flavor="torchao", pad=True)
    assert col.codes.shape == (64, 48) and row.codes.shape == (40, 64)
    with pytest.raises(TypeError, match=r"pad must be True, False or None, got 'yes'"):
        quantize_mx_rowwise_columnwise(x, flavor="torchao", pad="yes")
    with pytest.raises(TypeError, match=r"^x must be a float array or tensor, got str"):
        quantize_mx_rowwise_columnwise("x")
    with pytest.raises(ValueError, match=r"takes a 2-D tensor; got shape \(48,\)"):
        quantize_mx_rowwise_columnwise(np.ones(48, np.float32))


def test_nvfp4_variant_helpers_on_3d_records_and_their_messages() -> None:
    x = np.linspace(-5, 5, 2 * 3 * 32, dtype=np.float32).reshape(2, 3, 32)
    for name in ("e4m3x16", "ue5m3x16", "e4m3x32"):
        q = quantize_nvfp4_variant(x, name)
        assert q.block[-1] in (16, 32) and len(q.block) == 3 and nvfp4_variant_of(q) == name
        assert dequantize_nvfp4_variant(q).dtype == np.float32
    plain = QuantizedData(np.zeros((4, 16), np.uint8), np.ones((4, 1), np.float32), E2M1, (1, 16), (4, 16), "float32")
    with pytest.raises(TypeError, match=r"not an NVFP4 variant record: QuantizedData\(fmt=e2m1"):
        nvfp4_variant_of(plain)
    scalar = QuantizedData(np.zeros((), np.uint8), np.ones((), np.uint8), E2M1, (), (), "float32", scale_format=E4M3)
    with pytest.raises(TypeError, match="not an NVFP4 variant record"):
        nvfp4_variant_of(scalar)
    with pytest.raises(TypeError, match="qt must be a QuantizedData, got ndarray"):
        dequantize_nvfp4_variant(np.zeros(16))
    q = quantize_nvfp4_variant(x)
    with pytest.raises(ValueError, match=r"unknown out_dtype 'float64'; known: float32, bfloat16, float16"):
        dequantize_nvfp4_variant(q, out_dtype="float64")


def test_nvfp4_variant_dequantize_of_extreme_global_amax_warns_nothing() -> None:
    q = quantize_nvfp4_variant(np.array([[0.0] * 8 + [6.0] * 8], np.float32), "e4m3x16")
    big = QuantizedData(q.codes, q.scales, q.fmt, q.block, q.shape, q.dtype, scale_format=q.scale_format,
                        global_amax=np.float32(np.inf))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dequantize_nvfp4_variant(big)
    assert np.isnan(out[0, :8]).all() and np.isinf(out[0, 8:]).all()  # 0 * inf, 6 * inf
    huge = dataclasses.replace(big, global_amax=np.float32(3e38))  # fl32(s_blk * amax) overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dequantize_nvfp4_variant(huge)
    assert np.isinf(out[0, 8:]).all()


def test_nvfp4_variant_dequantize_crops_a_padded_record_to_its_shape() -> None:
    codes = np.zeros((4, 32), np.uint8)
    codes[:, :20] = 0x2  # E2M1 1.0
    scales = np.full((4, 2), 0x38, np.uint8)  # E4M3 1.0
    qt = QuantizedData(codes, scales, E2M1, (1, 16), (4, 20), "float32", scale_format=E4M3, global_amax=2688.0)
    out = dequantize_nvfp4_variant(qt)  # final = fl32(1 * 2688) * fl32(1 / 2688)
    assert out.shape == (4, 20)
    assert (out == np.float32(2688) * (np.float32(1) / np.float32(2688))).all()


def test_old_record_name_warns_with_the_package_name_and_unknown_names_raise() -> None:
    with pytest.warns(DeprecationWarning, match=r"fp8sim\.scaling\.QuantizedTensor is now fp8sim\.scaling\.Quant"):
        assert fp8sim.scaling.QuantizedTensor is QuantizedData
    with pytest.raises(AttributeError, match="module 'fp8sim.scaling' has no attribute 'nope'"):
        fp8sim.scaling.nope  # noqa: B018


@pytest.mark.parametrize(("pow2", "eps"), [(False, 0.0), (True, 0.0), (False, 1000.0), (True, 1000.0)])
def test_quantize_current_scaling_uses_pow2_and_eps_and_saturates_inf(pow2: bool, eps: float) -> None:
    """TE's current scaling (``common/recipe/recipe_common.cuh`` ``compute_scale_from_amax``): amax 3 ->
    scale 448/3, or its power of two 128 (``pow2``), or 448/1000 when ``eps`` = 1000 exceeds the amax; an Inf
    element saturates to +-448 (satfinite)."""
    x = np.array([3.0, -1.25, 0.5, 0.0], np.float32)
    scale = np.float32(448) / np.float32(max(3.0, eps))
    if pow2:
        scale = np.float32(2.0 ** np.floor(np.log2(scale)))
    q = quantize_current_scaling(torch.from_numpy(x).to(torch.bfloat16), pow2=pow2, eps=eps)
    assert q.fmt == E4M3 and q.dtype == "bfloat16"
    assert q.scales.reshape(-1)[0] == np.float32(1) / scale
    want = (x * scale).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(q.codes, want)
    qi = quantize_current_scaling(np.array([np.inf, -np.inf, 1.0], np.float32), "e4m3")
    assert qi.codes[:2].tolist() == [0x7E, 0xFE]


def test_nvfp4_variant_float16_output_is_one_rn_cast_of_the_float32_output() -> None:
    x = np.linspace(-6, 6, 64, dtype=np.float32).reshape(2, 32)
    q = quantize_nvfp4_variant(x, "ue5m3x16")
    q = dataclasses.replace(q, global_amax=np.float32(1e9))  # dequantizes past float16's max
    f32 = dequantize_nvfp4_variant(q, out_dtype="float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f16 = dequantize_nvfp4_variant(q, out_dtype="float16")
    assert f16.dtype == np.float16 and f16.shape == (2, 32)
    want = torch.from_numpy(f32).half().numpy()
    np.testing.assert_array_equal(f16.view(np.uint16), want.view(np.uint16))
    assert np.isinf(f16).any() and np.isfinite(f32).all()


def test_swizzle_needs_block_scale_codes_and_transposes_columnwise_scales() -> None:
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    col = quantize_mx(x, axis=0, swizzle=True)  # scales (2, 256): swizzled as the (256, 2) transpose
    want = to_blocked(
        np.ascontiguousarray(col.scales.T)
    )  # to_blocked: checked against torchao's in test_scaling_swizzle
    np.testing.assert_array_equal(col.blocked_scales, want)
    tensorwise = quantize_torchao(np.ones((4, 8), np.float32), "e4m3", granularity="axiswise", axiswise_dim=-1)
    assert tensorwise.scales.ndim == 2 and tensorwise.scale_format is None
    with pytest.raises(ValueError, match=r"swizzle=True needs a 2-D tensor with MX/NVFP4 block scales; got scales"):
        with_blocked_scales(tensorwise)
