"""Edges of per-tensor, block, delayed and MX scaling (``fp8sim.scaling``) that the main oracle tests do not reach.
References, zero tolerance:

- torchao 0.18's own ``tensor_to_scale`` / ``to_fp8_saturated`` / ``amax_to_scale`` (``torchao/float8/float8_utils.py``)
  and ``to_mx`` (``torchao/prototype/mx_formats/mx_tensor.py``), run by torch on this machine;
- TE's FP8 block scaling cast (spec 5.3; ``common/transpose/quantize_transpose_vector_blockwise.cu``): the scale from
  ``compute_scale_from_amax`` (``recipe_common.cuh``: ``fdiv_rn(fp8_max, amax)`` in float32), then ``x * scale`` in
  float32 and one RN satfinite cast, here ml_dtypes' cast of the float32 product;
- TE's delayed scaling state (``pytorch/quantization.py``): ``amax_history[0][i]`` of an empty history raises torch's
  own IndexError; ``NVTE_UNFUSED_FP8_UPDATE=1`` picks the unfused ``_amax_and_scale_update``, which rolls the history
  on every update, where the fused kernel (``common/recipe/delayed_scaling.cu``) leaves a history whose staging amax
  is 0 alone.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.recipe import DelayedScaling  # noqa: E402
from fp8sim.scaling.block import quantize_block_scaling  # noqa: E402
from fp8sim.scaling.current import compute_scale_from_amax, quantize_torchao, torchao_amax_to_scale  # noqa: E402
from fp8sim.scaling.delayed import DelayedScaler  # noqa: E402
from fp8sim.scaling.mx import quantize_mx  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

F32 = np.float32
SNAN32 = np.array([0x7F800001], np.uint32).view(np.float32)[0]
SNAN64 = np.array([0x7FF0000000000001], np.uint64).view(np.float64)


# -- current scaling --------------------------------------------------------------------------------------------


def test_amax_must_be_real_and_may_be_bfloat16() -> None:
    with pytest.raises(TypeError, match=r"^amax must be real numbers \(a float, an array or a tensor\), got complex"):
        compute_scale_from_amax(np.array([1.0 + 2.0j]), 448.0)
    with pytest.raises(TypeError, match=r"^amax must be real numbers"):
        compute_scale_from_amax(np.array([True]), 448.0)
    amax = np.array([3.0, 0.1], ml_dtypes.bfloat16)
    want = F32(448) / amax.astype(F32)  # fdiv_rn in float32 of the bfloat16 amax widened exactly
    np.testing.assert_array_equal(compute_scale_from_amax(amax, 448.0), want)


def test_torchao_amax_to_scale_propagates_a_signalling_nan_without_a_warning() -> None:
    fu = require("torchao.float8.float8_utils")
    want = fu.amax_to_scale(torch.from_numpy(SNAN64.copy()), torch.float8_e4m3fn).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for pow2 in (False, True):
            got = torchao_amax_to_scale(SNAN64, "e4m3", round_scales_to_power_of_2=pow2)
            assert np.isnan(got).all() and np.isnan(want).all()


def test_a_float32_signalling_nan_amax_gives_a_nan_scale_without_a_warning() -> None:
    """torchao widens the amax with ``amax.to(torch.float64)``, which quiets a signalling NaN silently; fp8sim's
    numpy widening raised 'invalid value encountered in cast' (fixed)."""
    fu = require("torchao.float8.float8_utils")
    amax = np.array([SNAN32, 2.0], F32)
    want = fu.amax_to_scale(torch.from_numpy(amax.copy()), torch.float8_e4m3fn).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torchao_amax_to_scale(amax, "e4m3")
        te = compute_scale_from_amax(amax, 448.0)
    assert np.isnan(got[0]) and np.isnan(want[0]) and got[1] == want[1]
    np.testing.assert_array_equal(te, [F32(1), F32(224)])  # TE: a NaN amax gives scale 1


def test_torchao_tensorwise_nan_codes_of_a_small_tensor_equal_torchao() -> None:
    """On a short tensor numpy keeps the NaN element's sign in ``x * scale`` where torch's kernel keeps the NaN
    scale's: the codes must be torch's (exactly, not by NaN class)."""
    fu = require("torchao.float8.float8_utils")
    from torchao.float8.config import ScalingGranularity

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
    x[1, 3] = float("nan")
    for dtype in (torch.float32, torch.bfloat16):
        xt = x.to(dtype)
        scale = fu.tensor_to_scale(xt, torch.float8_e4m3fn, scaling_granularity=ScalingGranularity.TENSORWISE)
        want = fu.to_fp8_saturated(xt.float() * scale, torch.float8_e4m3fn).view(torch.uint8).numpy()
        np.testing.assert_array_equal(quantize_torchao(xt, "e4m3").codes, want)


# -- FP8 block scaling ------------------------------------------------------------------------------------------


def _double_rounding_input() -> tuple[np.ndarray, F32]:
    """A 1x128 block of amax 3 with an element whose float32 product with the scale is exactly the E4M3 midpoint
    1.0625 while the exact product lies above it."""
    scale = F32(448) / F32(3)
    v = F32(F32(1.0625) / scale)
    for _ in range(64):
        if F32(v * scale) == F32(1.0625) and float(v) * float(scale) > 1.0625:
            break
        v = np.nextafter(v, F32(np.inf))
    else:
        raise AssertionError("no double-rounding element found")
    x = np.zeros((1, 128), F32)
    x[0, 0], x[0, 1] = 3.0, v
    return x, scale


def test_block_scaling_multiplies_in_float32_then_rounds_once() -> None:
    x, scale = _double_rounding_input()
    want = (x * scale).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # TE: float32 product, then RN satfinite
    assert want[0, 1] == 0x38  # the float32 tie rounds to even (1.0), the exact product would give 1.125
    q = quantize_block_scaling(x, "e4m3", pow2=False)
    assert q.scales.reshape(-1)[0] == F32(1) / scale
    np.testing.assert_array_equal(q.codes, want)


# -- delayed scaling --------------------------------------------------------------------------------------------


def test_empty_amax_history_raises_torchs_own_index_error() -> None:
    with pytest.raises(IndexError) as torch_error:
        torch.zeros(0, 1)[0]
    with pytest.raises(IndexError) as ours:
        DelayedScaler(DelayedScaling(amax_history_len=0))
    msg = str(ours.value)
    assert msg.startswith(str(torch_error.value) + ": DelayedScaling(amax_history_len=0) has no amax history row")


def test_nvte_unfused_fp8_update_rolls_an_idle_history(monkeypatch: pytest.MonkeyPatch) -> None:
    def history_after_two_updates() -> list[float]:
        s = DelayedScaler(DelayedScaling(amax_history_len=3))
        s.record(0, np.array([2.0], F32))
        s.update()
        s.update()  # no amax recorded since the last update
        return s.amax_history[:, 0].tolist()

    monkeypatch.delenv("NVTE_UNFUSED_FP8_UPDATE", raising=False)
    assert history_after_two_updates() == [0.0, 0.0, 2.0]  # fused: an idle quantizer's history stays
    monkeypatch.setenv("NVTE_UNFUSED_FP8_UPDATE", "1")
    assert DelayedScaler(DelayedScaling()).fused is False
    assert history_after_two_updates() == [0.0, 2.0, 0.0]  # unfused: rolled once more, row 0 zeroed


# -- MX ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["rceil", "floor"])
def test_mx_block_with_a_signalling_nan_equals_to_mx_without_a_warning(rule: str) -> None:
    mx_tensor = require("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    x = np.random.default_rng(4).standard_normal((2, 64)).astype(F32)
    x[0, 5] = SNAN32
    scale, data = mx_tensor.to_mx(torch.from_numpy(x.copy()), torch.float8_e4m3fn, 32, ScaleCalculationMode(rule))
    want_s, want_c = scale.view(torch.uint8).numpy(), data.view(torch.uint8).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_mx(x, "e4m3", scale_rule=rule, flavor="torchao")
    np.testing.assert_array_equal(q.scales.reshape(-1), want_s.reshape(-1))
    assert q.scales.reshape(-1)[0] == 0xFF
    nan = (want_c & 0x7F) == 0x7F  # E4M3 NaN codes, compared by class
    np.testing.assert_array_equal((q.codes & 0x7F) == 0x7F, nan)
    np.testing.assert_array_equal(q.codes[~nan], want_c[~nan])
