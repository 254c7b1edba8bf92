"""Issue 18 item 10: recipe and block-layout arguments that used to misbehave are refused when given.

Each case failed differently before: ``block_size=2**40`` raised MemoryError while padding,
``pow2="no"`` was truthy (power-of-two scales), ``Float8BlockScaling(fp8_gemm_fprop=None)`` raised
AttributeError inside ``__post_init__``, ``DelayedScaling(margin=10**6)`` gave scale 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim import recipe as r
from fp8sim.scaling import quantize_block_scaling
from fp8sim.scaling.block import MAX_BLOCK_SIZE

X = np.linspace(-3, 3, 256, dtype=np.float32).reshape(2, 128)


@pytest.mark.parametrize("block_size", [2**40, MAX_BLOCK_SIZE + 1, 0, -128])
def test_block_size_out_of_range_is_refused_with_the_range(block_size: object) -> None:
    with pytest.raises(ValueError, match=rf"block_size must be an int in \[1, {MAX_BLOCK_SIZE}\]"):
        quantize_block_scaling(X, block_size=block_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_size", [1.5, 128.0, True, "128", None])
def test_block_size_of_another_type_is_a_type_error(block_size: object) -> None:
    """Issue 29.4: bools and floats are refused as every int argument refuses them."""
    with pytest.raises(TypeError, match="block_size must be an int, got"):
        quantize_block_scaling(X, block_size=block_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(("arg", "value"), [("pow2", "no"), ("pow2", 1), ("pow2", None), ("columnwise", "yes")])
def test_flags_must_be_bools(arg: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"{arg} must be True or False, got {value!r}"):
        quantize_block_scaling(X, **{arg: value})  # type: ignore[arg-type]


def test_block_dim_true_is_not_one() -> None:
    with pytest.raises(ValueError, match="block_dim must be 1"):
        quantize_block_scaling(X, block_dim=True)  # type: ignore[arg-type]


def test_valid_flags_still_work() -> None:
    """pow2=False keeps float32 scales: 448 / 3 is not a power of two (spec 5.3)."""
    q = quantize_block_scaling(X, pow2=np.bool_(False), block_size=MAX_BLOCK_SIZE)
    want = np.float32(1) / (np.float32(448) / np.float32(3))
    assert q.scales.shape == (2, 1) and float(q.scales[0, 0]) == float(want)


@pytest.mark.parametrize("gemm", ["fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"])
def test_float8_block_scaling_none_mmparams_is_a_validation_error(gemm: str) -> None:
    msg = rf"{gemm}\n  Input should be a dictionary or an instance of MMParams"
    with pytest.raises(r.RecipeValidationError, match=msg):
        r.Float8BlockScaling(**{gemm: None})
    with pytest.raises(r.RecipeValidationError, match=gemm):
        r.Float8CurrentScaling(**{gemm: None})


@pytest.mark.parametrize("margin", [10**6, -(10**6)])
def test_delayed_scaling_huge_margin_is_refused_before_any_step(margin: int) -> None:
    with pytest.raises(ValueError, match=r"margin must be an int in \[-127, 63\]"):
        r.DelayedScaling(margin=margin)


# -- issue 29.3: absurd sizes are refused against the input and a stated bound, before allocating ---------
def test_absurd_block_sizes_and_histories_are_value_errors_naming_the_argument() -> None:
    from fp8sim.recipe import DelayedScaling
    from fp8sim.scaling import DelayedScaler, quantize_mx
    from fp8sim.scaling.delayed import MAX_AMAX_HISTORY_LEN, MAX_QUANTIZERS
    from fp8sim.scaling.quantized import MAX_PADDED_ELEMENTS

    x = np.ones((4, 64), np.float32)
    for kw in (dict(pad=True), dict(flavor="te", scale_rule="rceil"), {}):
        with pytest.raises(ValueError, match=rf"block_size must be an int in \[1, {MAX_BLOCK_SIZE}\].*got {2**40}"):
            quantize_mx(x, "e4m3", block_size=2**40, **kw)
    tall = np.ones((1 << 20, 1), np.float32)  # a block of 1024 on a width-1 dim would pad to 2^30 elements
    with pytest.raises(ValueError, match=rf"block_size 1024 is larger than dimension 1.*up to {MAX_PADDED_ELEMENTS}"):
        quantize_mx(tall, block_size=1024, pad=True)
    with pytest.raises(ValueError, match="block_size 1024 is larger than dimension 1"):
        quantize_block_scaling(tall, block_size=1024)
    small = quantize_mx(x[:, :20], block_size=32, pad=True)  # a small block larger than its dim still pads
    assert small.padded_shape == (4, 32) and quantize_block_scaling(x[:, :20]).padded_shape == (4, 128)
    with pytest.raises(ValueError, match=rf"amax_history_len must be at most {MAX_AMAX_HISTORY_LEN}.*got {10**12}"):
        DelayedScaler(DelayedScaling(amax_history_len=10**12), n=2)
    with pytest.raises(ValueError, match=rf"n \(number of quantizers\) must be at most {MAX_QUANTIZERS}"):
        DelayedScaler(DelayedScaling(amax_history_len=4), n=10**12)
    s = DelayedScaler(DelayedScaling(amax_history_len=4), n=2)
    with pytest.raises(ValueError, match="amax_history_len must be at most"):
        s.set_recipe(DelayedScaling(amax_history_len=10**12))
    assert s.amax_history.shape == (4, 2)
    assert DelayedScaler(DelayedScaling(amax_history_len=MAX_AMAX_HISTORY_LEN), n=1).amax_history.shape[0] == 1 << 16
