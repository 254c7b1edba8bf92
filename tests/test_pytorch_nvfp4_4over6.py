"""TE's 4over6 NVFP4 in ``NVFP4Quantizer``, ``NVFP4Tensor.dequantize`` and the modules, against a reference
written here, one float32 operation at a time, from TE's sources (mirror commit d0067d0):

- ``common/cast/nvfp4/quantize_4over6_nvfp4.cuh``: ``compute_scale_pair`` (lines 123-145),
  ``accumulate_dequant_error`` (lines 185-197), ``reduce_group_sum_16`` (lines 347-356),
  ``quantize_stage_rowwise`` (lines 471-520: ``err_map4 < err_map6``, the 2D tile amax and error sum) and
  ``quantize_stage_colwise`` (lines 522-568: the same per column of 16 rows, i.e. the rowwise kernel on the
  transpose); the amax of ``core_nvfp4.cuh`` ``compute_global_encode_scaling_factor_FP4`` (lines 81-95);
- ``common/cast/nvfp4/dequantize_nvfp4.cuh`` ``dequantize_fp4_kernel`` (lines 64-79: ``factor_inv =
  1 / (6 * E4M3_MAX)``), ``csrc/quantizer.cpp`` (one amax copied to both copies, lines 2625-2650).

ml_dtypes' E4M3 / E2M1 casts (after TE's clamps) are the rounding oracle; codes are read from the packed
bytes here (element 2i in the low nibble, TE's ``fp4e2m1x2``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.recipe import NVFP4BlockScaling  # noqa: E402

F = np.float32
FMAX = np.finfo(np.float32).max


def _e4m3(v: np.float32) -> tuple[int, np.float32]:
    c = np.array(min(v, F(448)), np.float32).astype(ml_dtypes.float8_e4m3fn)
    return int(c.view(np.uint8)), F(c.astype(np.float32))


def _e2m1(v: np.float32) -> tuple[int, np.float32]:
    c = np.array(np.clip(v, F(-6), F(6)), np.float32).astype(ml_dtypes.float4_e2m1fn)
    return int(c.view(np.uint8)) & 0xF, F(c.astype(np.float32))


def _amax(vals) -> np.float32:
    a = F(0)
    for v in np.asarray(vals, np.float32).reshape(-1):
        a = F(np.fmax(a, abs(v)))
    return a


def _kernel(x: np.ndarray, g: np.float32, emax: int, mode: str, tile2d: bool, fast: bool = False):
    """TE's 4over6 kernel on the 2-D float32 ``x`` (blocks of 16 along the last dim), global amax ``g``:
    (codes, one scale per row and block).  ``fast``: ``Cfg::err_use_fast_math``, the error of
    ``accumulate_fp16_scaled_error_pair`` (lines 231-243): ``mul.rn.f16x2`` of the f16 E2M1 value and the
    f16 E4M3 scale (``cvt.rn.f16x2.e2m1x2`` / ``cvt.rn.f16x2.e4m3x2``), widened, minus ``fl32(x * S_enc)``."""
    rows, cols = x.shape
    num = F(6 * emax)
    s_enc = F(min(F(num / g), FMAX)) if g != 0 else F(1)
    s_enc = F(1) if s_enc == 0 else s_enc
    s_dec = F(F(1) / s_enc)
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((rows, cols // 16), np.uint8)
    for j in range(cols // 16):
        cand = {}  # row -> [(codes, scale_code, err)] for map4, map6
        for r in range(rows):
            blk = x[r, 16 * j : 16 * j + 16]
            bmax = _amax(x[r - r % 16 : r - r % 16 + 16, 16 * j : 16 * j + 16]) if tile2d else _amax(blk)
            base = F(F(bmax / F(6)) * s_enc)
            cand[r] = []
            for s_in in (F(min(F(base * F(1.5)), F(448))), F(min(base, F(448)))):
                sc, sf = _e4m3(s_in)
                with np.errstate(divide="ignore"):
                    inv = F(min(F(F(1) / F(sf * s_dec)), FMAX))
                err, cs = F(0), []
                for v in blk:
                    c, q = _e2m1(F(v * inv))
                    cs.append(c)
                    if fast:
                        cand_h = np.float16(np.float16(q) * np.float16(sf))  # numpy rounds the f16 product once
                        d = F(F(cand_h) - F(v * s_enc))
                    else:
                        d = F(F(F(F(q * sf) * g) / num) - v)
                    err = F(err + (abs(d) if mode == "MAE" else F(d * d)))
                cand[r].append((cs, sc, err))
        for r in range(rows):
            if tile2d:  # the shuffle-down tree over the tile's 16 rows
                e = [[cand[r - r % 16 + i][k][2] for i in range(16)] for k in (0, 1)]
                for k in (0, 1):
                    for half in (8, 4, 2, 1):
                        e[k] = [F(e[k][i] + e[k][i + half]) for i in range(half)]
                pick4 = e[0][0] < e[1][0]
            else:
                pick4 = cand[r][0][2] < cand[r][1][2]
            cs, sc, _ = cand[r][0 if pick4 else 1]
            codes[r, 16 * j : 16 * j + 16] = cs
            scales[r, j] = sc
    return codes, scales


def _unpack(packed: torch.Tensor) -> np.ndarray:
    b = packed.view(torch.uint8).numpy().astype(np.uint8)
    return np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)


def _dequant(codes: np.ndarray, scales: np.ndarray, g: np.float32, emax: int) -> np.ndarray:
    """``dequantize_fp4_kernel``: ``final = fl32(fl32(scale * amax) * fl32(1 / (6 * E4M3_MAX)))``."""
    factor_inv = F(F(1) / F(6 * emax))
    s = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    final = ((s * g).astype(np.float32) * factor_inv).astype(np.float32)
    vals = (codes & 0xF).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return (vals * np.repeat(final, 16, axis=1)).astype(np.float32)


def _x(shape, seed=3, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(1.5 * torch.randn(shape, generator=g))
    x[0, :16] = 0  # an all-zero block
    return x.to(dtype)


@pytest.mark.parametrize(
    "emax,mode,tile2d", [(256, "MAE", False), (448, "MSE", False), (256, "MSE", True), (448, "MAE", True)]
)
def test_nvfp4_quantizer_4over6_both_copies_and_dequantize_equal_te_kernel(emax: int, mode: str, tile2d: bool):
    x = _x((16, 48))
    q = te.NVFP4Quantizer(
        nvfp4_use_4over6=True, nvfp4_e4m3_max=emax, nvfp4_4over6_err_mode=mode, with_2d_quantization=tile2d
    )
    t = q(x)
    xf = x.float().numpy()
    g = _amax(xf)
    assert (t._nvfp4_use_4over6, t._nvfp4_e4m3_max) == (True, emax)
    plain = te.NVFP4Quantizer(nvfp4_e4m3_max=256)(x)  # nvfp4_tensor.py line 169: 448 unless 4over6
    assert (plain._nvfp4_use_4over6, plain._nvfp4_e4m3_max) == (False, 448)
    assert t._amax_rowwise.tolist() == [float(g)] and t._amax_columnwise.tolist() == [float(g)]
    for data, scale, src in (
        (t._rowwise_data, t._rowwise_scale_inv, xf),
        (t._columnwise_data, t._columnwise_scale_inv, np.ascontiguousarray(xf.T)),
    ):
        want_c, want_s = _kernel(src, g, emax, mode, tile2d)
        np.testing.assert_array_equal(_unpack(data.reshape(src.shape[0], -1)), want_c)
        np.testing.assert_array_equal(scale[: src.shape[0], : src.shape[1] // 16].numpy(), want_s)
    want_c, want_s = _kernel(xf, g, emax, mode, tile2d)
    want = torch.from_numpy(_dequant(want_c, want_s, g, emax)).to(torch.bfloat16)
    assert torch.equal(t.dequantize().view(torch.int16), want.view(torch.int16))
    wc, ws = _kernel(np.ascontiguousarray(xf.T), g, emax, mode, tile2d)
    t.update_usage(rowwise_usage=False)
    want_t = torch.from_numpy(np.ascontiguousarray(_dequant(wc, ws, g, emax).T)).to(torch.float32)
    assert torch.equal(t.dequantize(dtype=torch.float32), want_t)


def test_nvfp4_quantizer_4over6_row_scaled_uses_one_amax_per_row():
    """``ROW_SCALED_NVFP4``: ``global_amax = amax[global_row]`` (quantize_4over6_nvfp4.cuh line 493)."""
    x = _x((16, 32), seed=5, dtype=torch.float32)
    t = te.NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, row_scaled_nvfp4=True, columnwise=False)(x)
    xf = x.numpy()
    for r in range(16):
        g = _amax(xf[r])
        assert t._amax_rowwise[r].item() == float(g)
        c, s = _kernel(xf[r : r + 1], g, 256, "MAE", False)
        np.testing.assert_array_equal(_unpack(t._rowwise_data[r : r + 1]), c)
        np.testing.assert_array_equal(t._rowwise_scale_inv[r, :2].numpy(), s[0])


@pytest.mark.parametrize(
    "kw,shape,msg",
    [
        ({"row_scaled_nvfp4": True}, (16, 32), "Row-scaled NVFP4 transpose quantization is not supported with 4over6"),
        ({}, (8, 32), "NVFP4 4over6 columnwise or 2D quantization requires rows divisible by 16."),
        ({"with_2d_quantization": True, "rowwise": True, "columnwise": False}, (8, 32), "rows divisible by 16"),
        ({"with_2d_quantization": True, "rowwise": False}, (16, 32), "NVFP4 4over6 2D quantization requires rowwise"),
    ],
)
def test_nvfp4_quantizer_4over6_refuses_what_te_refuses(kw: dict, shape: tuple, msg: str):
    """TE ``dispatch/quantize.cuh`` lines 114-118 and ``quantize_4over6`` lines 655-667."""
    with pytest.raises(RuntimeError, match=msg):
        te.NVFP4Quantizer(nvfp4_use_4over6=True, **kw)(torch.randn(shape))


# 16-element blocks on which TE's exact and f16 candidate errors pick different scales with global amax
# _G (found by search; the test checks they do, with the reference above)
_G = 4.053129
_SPLIT = {
    "MAE": [1.2677323818206787, 0.8979771137237549, -0.10564436763525009, -0.21128873527050018,
            -0.8451549410820007, 1.056443691253662, 0.8979771137237549, -1.056443691253662, 0.528221845626831,
            0.42257747054100037, 0.6338661909103394, 0.42257747054100037, 0.2641109228134155,
            0.10564436763525009, -1.056443691253662, 0.5810440182685852],
    "MSE": [-1.2677323818206787, 0.3169330954551697, -1.1092658042907715, 1.2677323818206787,
            0.21128873527050018, 0.052822183817625046, 0.10564436763525009, -0.36975526809692383,
            -0.7923327684402466, -0.5810440182685852, 0.7395105361938477, -0.4753996431827545, -0.0,
            0.3169330954551697, 1.0036214590072632, 0.15846654772758484],
}  # fmt: skip


@pytest.mark.parametrize("mode,tile2d", [("MAE", False), ("MSE", False), ("MSE", True)])
def test_nvfp4_4over6_err_fast_math_env_takes_the_f16_error_as_te_kernel(monkeypatch, mode: str, tile2d: bool):
    """``csrc/quantizer.cpp`` lines 2692-2696: ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=1`` switches TE's kernel
    to the f16 candidate error (``_kernel(fast=True)``) for both copies.  Negative control: row 0's first
    block picks differently on the two error paths (1x16 cases), so ignoring the variable fails."""
    x = _x((32, 64), seed=11, dtype=torch.float32).clamp(-1, 1)
    x[0, :16] = torch.tensor(_SPLIT[mode])
    x[1, 16] = _G  # the global amax
    xf = x.numpy()
    g = _amax(xf)
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1")
    q = te.NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode=mode,
                          with_2d_quantization=tile2d)  # fmt: skip
    t = q(x)
    for data, scale, src in (
        (t._rowwise_data, t._rowwise_scale_inv, xf),
        (t._columnwise_data, t._columnwise_scale_inv, np.ascontiguousarray(xf.T)),
    ):
        want_c, want_s = _kernel(src, g, 256, mode, tile2d, fast=True)
        np.testing.assert_array_equal(_unpack(data.reshape(src.shape[0], -1)), want_c)
        np.testing.assert_array_equal(scale[: src.shape[0], : src.shape[1] // 16].numpy(), want_s)
    exact_c, exact_s = _kernel(xf, g, 256, mode, tile2d)
    if not tile2d:
        assert exact_s[0, 0] != _kernel(xf, g, 256, mode, tile2d, fast=True)[1][0, 0]
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "0")  # read on every cast, as TE's getenv
    np.testing.assert_array_equal(_unpack(q(x)._rowwise_data), exact_c)


@pytest.mark.parametrize("value", ["2", "yes", "-1"])
def test_nvfp4_4over6_err_fast_math_env_bad_value_is_an_error(monkeypatch, value: str) -> None:
    """TE ``getenv<bool>`` (``common/util/system.h``): ``istringstream >> bool`` takes 0 or 1, else
    "Invalid environment variable value"."""
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", value)
    with pytest.raises(ValueError, match="Invalid environment variable value"):
        te.NVFP4Quantizer(nvfp4_use_4over6=True)(torch.randn(16, 16))


@pytest.mark.parametrize("scope", ["weights", "activations", "all"])
def test_nvfp4_4over6_in_modules_equals_the_quantizer_reference(scope: str) -> None:
    """NVFP4BlockScaling(nvfp4_4over6=scope) (TE ``quantization.py`` NVFP4BlockScalingRecipeState: forward
    input/weight quantizers in the scope, E4M3 max 256 by default, the weight in 16x16 tiles): the forward
    of ``te.Linear`` is ``x_q @ w_q.T`` with each operand rebuilt from the raw codes and scales of TE's
    4over6 kernel (``_kernel`` here) and the plain one outside the scope, times ``fl32(1 / S_enc)``."""
    recipe = NVFP4BlockScaling(nvfp4_4over6=scope, disable_rht=True, disable_stochastic_rounding=True)
    torch.manual_seed(0)
    layer = te.Linear(32, 32, bias=False, params_dtype=torch.float32)
    x = _x((16, 32), seed=9, dtype=torch.float32).requires_grad_(True)
    with te.autocast(enabled=True, recipe=recipe):
        y = layer(x)
    dy = _x((16, 32), seed=10, dtype=torch.float32)
    y.backward(dy)

    def operand(v: np.ndarray, in_scope: bool, tile2d: bool) -> torch.Tensor:
        g = _amax(v)
        emax = 256 if in_scope else 448
        if in_scope:
            c, s = _kernel(v, g, emax, "MAE", tile2d)
        else:
            q = te.NVFP4Quantizer(with_2d_quantization=tile2d, columnwise=False)(torch.from_numpy(v))
            c, s = _unpack(q._rowwise_data), q._rowwise_scale_inv[: v.shape[0], : v.shape[1] // 16].numpy()
        s_enc = F(min(F(F(6 * emax) / g), FMAX))
        vals = (c & 0xF).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        sv = np.repeat(s.view(ml_dtypes.float8_e4m3fn).astype(np.float64), 16, axis=1)
        return torch.from_numpy((vals * sv * np.float64(F(F(1) / s_enc))).astype(np.float32))

    xq = operand(x.detach().numpy(), scope in ("activations", "all"), False)
    w = layer.weight.detach().numpy()
    wq = operand(w, scope in ("weights", "all"), True)
    # NVFP4 under the default accumulator: one float32 matmul of the dequantized operands (global scale
    # included), BLAS order; the operands are the test's own, torch's float32 matmul is the contract there
    assert torch.equal(y.detach(), xq @ wq.t())
    # dgrad: the weight's columnwise copy (the kernel on W^T, quantize_stage_colwise) and a plain 1x16 dy
    wq_col = operand(np.ascontiguousarray(w.T), scope in ("weights", "all"), True).t()
    assert torch.equal(x.grad, operand(dy.numpy(), False, False) @ wq_col)
