"""TE's pure-PyTorch reference quantizers and custom GEMM (``fp8sim.pytorch.custom_recipes``, TE 2.20.0.dev0
``pytorch/custom_recipes/``) against independent references: ``tests/_te_nvfp4_reference.py`` (TE's
``reference_nvfp4.py`` lines 49-71 and 651-760 rewritten in torch), references written here from TE's
source (line numbers at d0067d0), ml_dtypes casts and exact float64 arithmetic; and against fp8sim's
TE-kernel quantizers where TE's own tests (``tests/pytorch/nvfp4/test_nvfp4_quantize_exact.py``) assert the
two agree."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ml_dtypes = require("ml_dtypes")

from _te_nvfp4_reference import apply_rht, quantize_1x16  # noqa: E402

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.custom_recipes import quantizer_factory_zoo as zoo  # noqa: E402
from fp8sim.pytorch.custom_recipes.gemm import custom_gemm  # noqa: E402
from fp8sim.pytorch.custom_recipes.reference_current_scaling import (  # noqa: E402
    CurrentScalingQuantizerRef,
    current_scaling_ref_factory,
)
from fp8sim.pytorch.custom_recipes.reference_nvfp4 import (  # noqa: E402
    NVFP4QuantizerRef,
    nvfp4_ref_rht_2d_factory,
)
from fp8sim.pytorch.custom_recipes.reference_utils import Fp4Formats  # noqa: E402
from fp8sim.pytorch.tensor import Float8CurrentScalingQuantizer, NVFP4Quantizer, QuantizerRole  # noqa: E402

E2M1 = Fp4Formats.E2M1


def _ref(**kw):
    return NVFP4QuantizerRef(dtype=E2M1, **kw)


def _u8(t):
    return t.view(torch.uint8)


def _assert_bits(got, want, what):
    got, want = _u8(got.contiguous()), _u8(want.contiguous())
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got != want).nonzero()
    if len(diff):
        i = tuple(diff[0].tolist())
        raise AssertionError(f"{what}: first difference at {i}: got 0x{int(got[i]):02x}, want 0x{int(want[i]):02x}")


# -- NVFP4, 1x16 ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rht", [False, True])
def test_nvfp4_ref_1x16_both_copies_match_te_reference(dtype, rht):
    torch.manual_seed(1)
    x = torch.randn(48, 96, dtype=dtype) * 3
    r = _ref(with_rht=rht).quantize(x)
    data, scale, amax = quantize_1x16(x)
    _assert_bits(r.data, data, "rowwise data")
    _assert_bits(r.scale, scale, "rowwise scale")
    assert r.global_amax_row.tolist() == [amax.item()]
    xt = apply_rht(x.t().contiguous()) if rht else x.t().contiguous()
    data_t, scale_t, amax_t = quantize_1x16(xt)
    _assert_bits(r.data_t, data_t, "columnwise data")
    _assert_bits(r.scale_t, scale_t, "columnwise scale")
    assert r.global_amax_col.tolist() == [amax_t.item()]
    assert r.scale.dtype == torch.float8_e4m3fn and r.data.dtype == torch.uint8
    assert tuple(r.size()) == (48, 96)


def test_nvfp4_ref_rht_sign_mask_option():
    """``with_random_sign_mask=False`` uses H/4 without the signs (reference_nvfp4.py:399-419)."""
    torch.manual_seed(2)
    x = torch.randn(32, 64)
    r = _ref(with_rht=True, with_random_sign_mask=False).quantize(x)
    data_t, scale_t, _ = quantize_1x16(apply_rht(x.t().contiguous(), random_sign_mask=False))
    _assert_bits(r.data_t, data_t, "columnwise data")
    _assert_bits(r.scale_t, scale_t, "columnwise scale")
    signed = _ref(with_rht=True).quantize(x)
    assert not torch.equal(signed.data_t, r.data_t)  # negative control: the mask changes the bits


def test_nvfp4_ref_pads_columns_to_whole_blocks():
    """Columns padded with zeros to 16 (reference_nvfp4.py:790-812), codes trimmed, scales kept per block."""
    torch.manual_seed(3)
    x = torch.randn(16, 40)
    r = _ref(columnwise=False).quantize(x)
    xp = torch.nn.functional.pad(x, (0, 8))
    data, scale, _ = quantize_1x16(xp)
    _assert_bits(r.data, data[:, :20], "data")
    _assert_bits(r.scale, scale, "scale")


def test_nvfp4_ref_row_scaled_is_per_row_reference():
    """Row-scaled: each row quantized with its own global amax (reference_nvfp4.py:873-884, 716-717)."""
    torch.manual_seed(4)
    x = torch.randn(16, 64) * torch.logspace(-3, 3, 16)[:, None]
    r = _ref(row_scaled_nvfp4=True).quantize(x)
    for i in range(16):
        data, scale, amax = quantize_1x16(x[i : i + 1])
        _assert_bits(r.data[i : i + 1], data, f"row {i} data")
        _assert_bits(r.scale[i : i + 1], scale, f"row {i} scale")
        assert r.global_amax_row[i].item() == amax.item()
    for j in range(64):
        data, scale, amax = quantize_1x16(x[:, j][None].contiguous())
        _assert_bits(r.data_t[j : j + 1], data, f"column {j} data")
        assert r.global_amax_col[j].item() == amax.item()


def _quantize_16x16(x):
    """TE reference_nvfp4.py:668-681 and 720-760 (16x16 tiles, no 4over6), float32 torch."""
    m, n = x.shape
    tiles = x.unfold(0, 16, 16).unfold(1, 16, 16).float()
    vec_max = tiles.abs().amax(dim=(-1, -2)).repeat_interleave(16, dim=0).unsqueeze(-1)
    g_enc = torch.min(torch.tensor(2688.0) / x.abs().float().amax(), torch.tensor(torch.finfo(torch.float32).max))
    g_enc = torch.tensor(1.0) if g_enc == 0 else g_enc
    dec = torch.min(vec_max * (g_enc * torch.reciprocal(torch.tensor(6.0))), torch.tensor(3.4028234663852886e38))
    dec = dec.clamp(-448, 448).to(torch.float8_e4m3fn)
    enc = torch.min(1.0 / (dec.float() * (1.0 / g_enc)), torch.tensor(3.4028234663852886e38))
    v = (x.view(m, n // 16, 16).float() * enc).clamp(-6, 6).reshape(m, n)
    codes = torch.from_numpy(np.asarray(v.numpy(), ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF)
    codes[(v == 0) | v.isnan()] = 0  # cast_to_fp4x2 (reference_nvfp4.py:49-71): ±0 -> 0x0
    return codes[:, ::2] | (codes[:, 1::2] << 4), dec.squeeze(-1).view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nvfp4_ref_16x16_matches_te_reference_and_ml_dtypes(dtype):
    torch.manual_seed(5)
    x = torch.randn(32, 64, dtype=dtype)
    r = _ref(quant_tile_shape=(16, 16)).quantize(x)
    data, scale = _quantize_16x16(x)
    _assert_bits(r.data, data, "data")
    _assert_bits(r.scale, scale, "scale")
    data_t, scale_t = _quantize_16x16(x.t().contiguous())
    _assert_bits(r.data_t, data_t, "data_t")
    _assert_bits(r.scale_t, scale_t, "scale_t")


@pytest.mark.parametrize("two_d", [False, True], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nvfp4_ref_matches_fp8sim_kernel_quantizer(two_d, dtype):
    """TE's test_nvfp4_quantize_exact.py:121-240 asserts the kernel and the reference agree bit for bit."""
    torch.manual_seed(6)
    x = torch.randn(64, 128, dtype=dtype)
    r = _ref(quant_tile_shape=(16, 16) if two_d else (1, 16)).quantize(x)
    k = NVFP4Quantizer(
        fp4_dtype=DType.kFloat4E2M1, with_rht=False, with_post_rht_amax=False, with_2d_quantization=two_d
    )(x)
    _assert_bits(k._rowwise_data, r.data, "rowwise data")
    _assert_bits(k._rowwise_scale_inv[: r.scale.shape[0], : r.scale.shape[1]], r.scale, "rowwise scale")
    _assert_bits(k._columnwise_data, r.data_t, "columnwise data")
    _assert_bits(k._columnwise_scale_inv[: r.scale_t.shape[0], : r.scale_t.shape[1]], r.scale_t, "columnwise scale")
    assert torch.equal(k._amax_rowwise, r.global_amax_row) and torch.equal(k._amax_columnwise, r.global_amax_col)


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("e4m3_max", [448, 256])
def test_nvfp4_ref_4over6_matches_fp8sim_kernel_quantizer(mode, e4m3_max):
    torch.manual_seed(7)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    kw = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max, nvfp4_4over6_err_mode=mode)
    r = _ref(columnwise=False, **kw).quantize(x)
    k = NVFP4Quantizer(fp4_dtype=DType.kFloat4E2M1, rowwise=True, columnwise=False, with_rht=False, **kw)(x)
    _assert_bits(k._rowwise_data, r.data, "data")
    _assert_bits(k._rowwise_scale_inv[: r.scale.shape[0], : r.scale.shape[1]], r.scale, "scale")
    plain = _ref(columnwise=False).quantize(x)
    assert not torch.equal(plain.scale.view(torch.uint8), r.scale.view(torch.uint8))  # 4over6 changes scales


def _fast_math_picks(x, e4m3_max, mode):
    """The fast-math 4over6 choice per 1x16 block (reference_nvfp4.py:545-572), float32 numpy."""
    f32 = np.float32
    amax = f32(np.abs(x).max())
    s_enc = f32(min(f32(f32(6 * e4m3_max) / amax), np.finfo(f32).max))
    xb = x.reshape(x.shape[0], -1, 16)
    base = (np.abs(xb).max(-1) / f32(6)) * s_enc
    errs = []
    for cand in (base * f32(1.5), base):
        sf = np.minimum(cand, f32(448)).astype(ml_dtypes.float8_e4m3fn).astype(f32)
        inv = np.minimum(f32(1) / (sf * (f32(1) / s_enc)), np.finfo(f32).max)
        q = np.clip(xb * inv[..., None], -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(f32)
        err = np.zeros(sf.shape, f32)
        for i in range(16):
            d = q[..., i] * sf - xb[..., i] * s_enc
            err = err + (np.abs(d) if mode == "MAE" else d * d)
        errs.append(err)
    return errs[0] < errs[1]


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
def test_nvfp4_ref_4over6_fast_math_error_is_scaled_domain(mode):
    torch.manual_seed(8)
    x = torch.randn(64, 64)
    kw = dict(columnwise=False, nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode=mode)
    fast = _ref(nvfp4_4over6_err_use_fast_math=True, **kw).quantize(x)
    pick4 = _fast_math_picks(x.numpy(), 256, mode)
    plain_scale = _ref(columnwise=False).quantize(x * 1)  # unrelated quantizer: only to get shapes
    assert fast.scale.shape == plain_scale.scale.shape
    amax = np.float32(x.abs().max())
    s_enc = np.float32(np.float32(1536) / amax)
    base = (x.abs().reshape(64, 4, 16).amax(-1).numpy() / np.float32(6)) * s_enc
    want = np.where(pick4, np.minimum(base * np.float32(1.5), 448), np.minimum(base, 448))
    want = want.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(fast.scale.view(torch.uint8).numpy(), want)


# -- current scaling ------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_current_scaling_ref_matches_ml_dtypes_cast(fp8, dtype):
    """reference_current_scaling.py:159-197 and 322: scale = fl32(max / amax), data = cast(fl32(x) * scale)."""
    torch.manual_seed(9)
    x = torch.randn(32, 48, dtype=dtype) * 5
    r = CurrentScalingQuantizerRef(fp8).quantize(x)
    x32 = x.float().numpy()
    fmax = np.float32(torch.finfo(fp8).max)
    scale = np.float32(fmax / np.abs(x32).max())
    mld = ml_dtypes.float8_e4m3fn if fp8 == torch.float8_e4m3fn else ml_dtypes.float8_e5m2
    want = (x32 * scale).astype(mld).view(np.uint8)
    np.testing.assert_array_equal(r.data.view(torch.uint8).numpy(), want)
    assert r.scale.item() == np.float32(1) / scale
    np.testing.assert_array_equal(r.data_t.view(torch.uint8).numpy(), want.T)
    assert r.scale_t is r.scale


def test_current_scaling_ref_matches_fp8sim_kernel_quantizer():
    torch.manual_seed(10)
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    r = CurrentScalingQuantizerRef(torch.float8_e4m3fn).quantize(x)
    k = Float8CurrentScalingQuantizer(fp8_dtype=DType.kFloat8E4M3)(x)
    assert torch.equal(k._data.view(torch.uint8), r.data.view(torch.uint8))
    assert torch.equal(k._scale_inv.reshape(1), r.scale)


def test_current_scaling_ref_extremes_differ_from_kernel():
    """The reference (reference_current_scaling.py:174-195): scale Inf -> the input dtype's max; amax 0 -> 1."""
    tiny = torch.full((2, 16), 2.0**-133)  # 448 / amax overflows float32
    r = CurrentScalingQuantizerRef(torch.float8_e4m3fn).quantize(tiny)
    assert r.scale.item() == np.float32(1) / np.finfo(np.float32).max
    rb = CurrentScalingQuantizerRef(torch.float8_e4m3fn).quantize(torch.zeros(2, 16, dtype=torch.bfloat16))
    assert rb.scale.item() == 1.0
    bt = torch.full((2, 16), 2.0**-133, dtype=torch.float32).to(torch.bfloat16)
    if bt.abs().max() > 0:  # bf16 keeps 2^-133; 448/amax overflows, the bf16 max replaces Inf
        rbt = CurrentScalingQuantizerRef(torch.float8_e4m3fn).quantize(bt)
        assert rbt.scale.item() == np.float32(1) / np.float32(torch.finfo(torch.bfloat16).max)


def test_current_scaling_ref_pow2_and_eps():
    x = torch.tensor([[3.0, -1.0] * 8])
    r = CurrentScalingQuantizerRef(torch.float8_e4m3fn, pow_2_scales=True).quantize(x)
    assert r.scale.item() == 2.0**-7  # 448/3 = 149.3 -> 128
    e = CurrentScalingQuantizerRef(torch.float8_e4m3fn, eps=100.0).quantize(x)
    assert e.scale.item() == np.float32(1) / np.float32(np.float32(448) / np.float32(100))


# -- GEMMs ----------------------------------------------------------------------------------


def _exact_nvfp4_gemm(rx, rw, out_dtype):
    """reference_nvfp4.py:1183-1250 in float64 per block (exact) with float32 rounding per accumulation."""
    lut = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])

    def vals(p):
        p = p.numpy()
        return np.stack([lut[p & 0xF], lut[p >> 4]], -1).reshape(p.shape[0], -1)

    x, w = vals(rx.data), vals(rw.data)
    sx = rx.scale.float().numpy().astype(np.float64)
    sw = rw.scale.float().numpy().astype(np.float64)
    y = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for j in range(x.shape[1] // 16):
        part = x[:, 16 * j : 16 * j + 16] @ w[:, 16 * j : 16 * j + 16].T
        y = y + (np.outer(sx[:, j], sw[:, j]) * part).astype(np.float32)
    alpha = np.float32(np.float32(rx.global_amax_row.item() * rw.global_amax_row.item()) / np.float32(36 * 448**2))
    return torch.from_numpy(alpha * y).to(out_dtype)


def test_nvfp4_ref_gemm_through_general_gemm_matches_exact_blocks():
    from fp8sim.pytorch.cpp_extensions import general_gemm

    torch.manual_seed(11)
    x, w = torch.randn(16, 64, dtype=torch.bfloat16), torch.randn(24, 64, dtype=torch.bfloat16)
    q = _ref()
    rx, rw = q.quantize(x), q.quantize(w)
    y, *_ = general_gemm(rw, rx, out_dtype=torch.bfloat16)
    want = _exact_nvfp4_gemm(rx, rw, torch.bfloat16)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    y2, *_ = custom_gemm(rw, rx, None, torch.float32)
    assert torch.equal(y2, _exact_nvfp4_gemm(rx, rw, torch.float32))


def test_current_scaling_ref_gemm_is_scaled_mm():
    from fp8sim.gemm import scaled_mm

    torch.manual_seed(12)
    q = CurrentScalingQuantizerRef(torch.float8_e4m3fn)
    rx, rw = q.quantize(torch.randn(16, 32)), q.quantize(torch.randn(16, 32))
    y, *_ = custom_gemm(rw, rx, None, torch.float32)
    want = scaled_mm(rx.data, rw.data.t(), rx.scale, rw.scale, out_dtype=torch.float32, use_fast_accum=True)
    assert torch.equal(y, want)
    split = custom_gemm(rw, rx, None, torch.float32, use_split_accumulator=True)[0]
    want_split = scaled_mm(rx.data, rw.data.t(), rx.scale, rw.scale, out_dtype=torch.float32, use_fast_accum=False)
    assert torch.equal(split, want_split)


# -- factories, dispatch, refusals -------------------------------------------------------------


def test_factories_follow_roles():
    w = QuantizerRole(module_type="linear", tensor_type="weight", name="l")
    g = QuantizerRole(module_type="linear", tensor_type="grad_output", name="l")
    assert nvfp4_ref_rht_2d_factory(w).quant_tile_shape == (16, 16) and not nvfp4_ref_rht_2d_factory(w).with_rht
    assert nvfp4_ref_rht_2d_factory(None).with_rht and nvfp4_ref_rht_2d_factory(None).quant_tile_shape == (1, 16)
    assert current_scaling_ref_factory(g).dtype == torch.float8_e5m2
    assert current_scaling_ref_factory(w).dtype == torch.float8_e4m3fn
    assert type(zoo.mxfp8_fwd_nvfp4_bwd_factory(g)).__name__ == "NVFP4Quantizer"
    assert type(zoo.mxfp8_fwd_nvfp4_bwd_factory(None)).__name__ == "MXFP8Quantizer"
    hw = zoo.mxfp8_fwd_nvfp4_bwd_factory(w)  # TE: Hybrid(MXFP8, plain NVFP4 from the dequantized MXFP8)
    assert type(hw).__name__ == "HybridQuantizer" and hw.columnwise_source == "rowwise_dequantized"
    assert type(hw.rowwise_quantizer).__name__ == "MXFP8Quantizer" and not hw.columnwise_quantizer.with_rht


def test_refusals():
    x = torch.randn(16, 32)
    with pytest.raises(TypeError, match="Unsupported input dtype"):
        _ref().quantize(x.to(torch.float64))
    with pytest.raises(ValueError, match="Unsupported NVFP4 4over6 error mode"):
        _ref(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="max")
    with pytest.raises(ValueError, match="448 or 256"):
        _ref(nvfp4_use_4over6=True, nvfp4_e4m3_max=300)
    with pytest.raises(ValueError, match="requires rowwise usage"):
        _ref(rowwise=False, row_scaled_nvfp4=True)
    with pytest.raises(ValueError, match="1x16 tile"):
        _ref(quant_tile_shape=(16, 16), row_scaled_nvfp4=True).quantize(x)
    with pytest.raises(NotImplementedError, match="pow_2_scales"):
        _ref(pow_2_scales=True, quant_tile_shape=(1, 32)).quantize(x)
    with pytest.raises(TypeError, match="custom tensors"):
        custom_gemm(x, x)
    with pytest.raises(ValueError, match="Bias is not supported"):
        q = _ref()
        r = q.quantize(x)
        q.qgemm(r.data, r.data, None, torch.float32, r.scale.float(), r.scale.float(), bias=torch.zeros(16))


def test_reference_modules_resolve_under_the_shim():
    from fp8sim.run import shim

    was = shim.is_installed()
    shim.install(quiet=True)
    try:
        import importlib

        mod = importlib.import_module("transformer_engine.pytorch.custom_recipes.reference_nvfp4")
        assert mod.NVFP4QuantizerRef is NVFP4QuantizerRef
        cs = importlib.import_module("transformer_engine.pytorch.custom_recipes.reference_current_scaling")
        assert cs.CurrentScalingQuantizerRef is CurrentScalingQuantizerRef
        assert importlib.import_module("transformer_engine.pytorch.custom_recipes.gemm").custom_gemm is custom_gemm
    finally:
        if not was:
            shim.uninstall()
