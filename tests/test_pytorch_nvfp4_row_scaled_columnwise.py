"""The columnwise copy of a row-scaled NVFP4 tensor (``NVFP4Quantizer(row_scaled_nvfp4=True)``).

Reference written here from TransformerEngine 2.20 (commit d0067d0):
- ``common/cast/dispatch/quantize.cuh`` (NVTE_NVFP4_1D_SCALING): a row-scaled tensor with a columnwise copy
  needs bf16 input and both dims multiples of 32; ``compute_columnwise_amax`` fills one amax per column.
- ``common/cast/nvfp4/specialized/quantize_transpose_nvfp4_tuned_1D.cuh`` ``colwise_scaling`` with
  ``ROW_SCALED_NVFP4``: block (16 rows of column c) encoded with
  ``S_enc = compute_global_encode_scaling_factor_FP4(amax_col[c])``; ``S_dec_b = e4m3(fminf(block_amax *
  fl32(S_enc * (1/6)), FLT_MAX))`` (``core_nvfp4.cuh`` ``compute_decoding_scaling_factor``); coefficient
  ``fminf(1 / fl32(float(S_dec_b) * fl32(1 / S_enc)), FLT_MAX)`` (``compute_nvfp4_scaling_coefficient<float>``);
  code ``cvt.rn.satfinite.e2m1(fl32(x * coefficient))`` (``ptx_arch_spec.cuh``
  ``mul_cvt_bf16_to_fp4_8x_round_to_nearest<float>``).
- ``core_nvfp4.cuh`` ``compute_global_encode_scaling_factor_FP4``: ``fminf(448 * 6 / amax, FLT_MAX)``, 1 when
  the amax or the result is 0.
- ``dequantize_nvfp4.cuh`` ``dequantize_fp4_kernel`` (``ROW_SCALED_NVFP4``): ``amax[y]`` of the copy's row.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer  # noqa: E402

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def _input(rows: int = 64, cols: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(27)
    # column magnitudes over 2^-12 .. 2^12, so one scalar amax and per-column amaxes give different codes
    mag = torch.pow(2.0, torch.linspace(-12, 12, cols))
    return (torch.randn(rows, cols, generator=g) * mag).to(torch.bfloat16)


def _global_encode(amax: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        s = np.fmin(F32(448 * 6) / amax, FLT_MAX).astype(F32)
    return np.where((amax == 0) | (s == 0), F32(1), s).astype(F32)


def _e2m1(v: np.ndarray) -> np.ndarray:
    """cvt.rn.satfinite.e2m1: clamp to +-6, round to nearest even (ml_dtypes), the 4-bit code."""
    return np.clip(v, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


def _te_columnwise(x_bf16: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes (cols, rows), uint8 scales (cols, rows / 16), amax per column) from the kernel steps above."""
    xt = x_bf16.float().numpy().T.astype(F32)  # (cols, rows): row c of the copy is column c of x
    amax = np.abs(xt).max(axis=1).astype(F32)
    s_enc = _global_encode(amax)[:, None]
    blocks = xt.reshape(xt.shape[0], -1, 16)
    block_amax = np.abs(blocks).max(axis=2)
    s_dec_b = np.fmin(block_amax * (s_enc * F32(1 / 6)).astype(F32), FLT_MAX).astype(F32)
    scales = np.minimum(s_dec_b, F32(448)).astype(ml_dtypes.float8_e4m3fn)
    with np.errstate(divide="ignore"):
        coeff = np.fmin(F32(1) / (scales.astype(F32) * (F32(1) / s_enc)).astype(F32), FLT_MAX).astype(F32)
    codes = _e2m1((blocks * coeff[..., None]).astype(F32)).reshape(xt.shape)
    return codes, scales.view(np.uint8), amax


def _unpack(packed: torch.Tensor) -> np.ndarray:
    p = packed.numpy()
    return np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)


def test_row_scaled_columnwise_copy_has_one_amax_per_column_as_te_tuned_kernel() -> None:
    x = _input()
    t = NVFP4Quantizer(row_scaled_nvfp4=True)(x)
    codes, scales, amax = _te_columnwise(x)
    np.testing.assert_array_equal(t._amax_columnwise.numpy(), amax)
    np.testing.assert_array_equal(t._columnwise_scale_inv[: codes.shape[0], : codes.shape[1] // 16].numpy(), scales)
    got = _unpack(t._columnwise_data)
    bad = np.argwhere(got != codes)
    if bad.size:
        i = tuple(bad[0])
        pytest.fail(f"first differing code at {i}: got {got[i]:#x}, TE {codes[i]:#x} (x = {float(x.t()[i])})")


def test_row_scaled_columnwise_dequantizes_with_each_column_amax() -> None:
    x = _input()
    t = NVFP4Quantizer(row_scaled_nvfp4=True)(x)
    t.update_usage(rowwise_usage=False)
    codes, scales, amax = _te_columnwise(x)
    final = (scales.view(ml_dtypes.float8_e4m3fn).astype(F32) * amax[:, None]).astype(F32) * F32(1 / (6 * 448))
    vals = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    want = (vals * np.repeat(final.astype(F32), 16, axis=1)).astype(F32).T
    np.testing.assert_array_equal(t.dequantize(dtype=torch.float32).numpy(), want)


@pytest.mark.parametrize(
    "dtype,shape", [(torch.float32, (64, 96)), (torch.float16, (64, 96)), (torch.bfloat16, (48, 96))], ids=str
)
def test_row_scaled_columnwise_needs_bf16_and_multiples_of_32(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = torch.ones(shape, dtype=dtype)
    with pytest.raises(RuntimeError, match="requires BF16 input and dimensions that are multiples of 32"):
        NVFP4Quantizer(row_scaled_nvfp4=True)(x)
    NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=False)(x)  # the rowwise-only kernel takes any of them
