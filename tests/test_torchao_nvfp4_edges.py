"""NVFP4 linear training edges (``torchao/prototype/moe_training/nvfp4_training/``).

The forward against the reference of ``tests/test_torchao_nvfp4_training.py`` (written from torchao's
source: ``_nvfp4_quantize`` clamps each block's scale to ``[E4M3 tiny = 2^-6, 448]``, ``nvfp4_mm_triton``
flattens the input to ``(-1, K)``), forward only (no stochastic-rounding draws): cheap.  Construction against
torchao's real ``NVFP4Linear`` (buffer devices, ``from_linear`` keeping an NVFP4Linear's sign vector).
"""

from __future__ import annotations

import pytest
from test_torchao_nvfp4_training import M64, _heavy, _Ref

from fp8sim.testing.oracles import require

torch = require("torch")
ao_train = require("torchao.prototype.moe_training.nvfp4_training.nvfp4_training")

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _module(n_in: int = 128, n_out: int = 128, **kw) -> fs.NVFP4Linear:
    torch.manual_seed(0)
    return fs.NVFP4Linear(n_in, n_out, dtype=torch.bfloat16, accumulator="exact", **kw)


def _reference_forward(m: fs.NVFP4Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _Ref.apply(x, m.weight, m.bias, int(m._sr_seed) & M64, m.rht_sign_vector, m.sr_tile)


def test_forward_of_a_3d_input_whose_sequence_is_not_k_equals_reference() -> None:
    m = _module()
    x = _heavy((2, 64, 128), 1)  # M = 128 tokens, K = 128, a middle dim of 64
    with torch.no_grad():
        got = m(x)
    assert got.shape == (2, 64, 128)
    assert_bit_exact(got, _reference_forward(m, x))


def test_a_block_scale_below_the_smallest_normal_e4m3_is_raised_to_it() -> None:
    """``enc = 2688 / amax = 1`` (amax 2688): a block whose max is 18 * 2^-9 has ``bmax / 6 * enc = 3 * 2^-9``,
    below E4M3's smallest normal 2^-6, so torchao's clamp gives the block the scale 2^-6 (the element
    ``18 * 2^-9 * 64 = 2.25`` rounds to 2, dequantized 2^-5); the subnormal code 3 * 2^-9 it would round to
    otherwise would hold the element exactly (6 * 3 * 2^-9)."""
    m = _module()
    x = (torch.rand(128, 128, generator=torch.Generator().manual_seed(2)) - 0.5).to(torch.bfloat16)
    x[5, 20] = 2688.0
    x[0, :16] = 0.0
    x[0, 0] = 18 * 2.0**-9
    with torch.no_grad():
        got = m(x)
    assert_bit_exact(got, _reference_forward(m, x))


def test_nvfp4_linear_default_accumulator_is_blackwell() -> None:
    m = _module()
    x = _heavy((128, 128), 3)
    sv = m.rht_sign_vector
    with torch.no_grad():
        default = fs.nvfp4_linear(x, m.weight, sign_vector=sv, sr_seed=m._sr_seed)
        blackwell = fs.nvfp4_linear(x, m.weight, sign_vector=sv, sr_seed=m._sr_seed, accumulator="blackwell")
    assert_bit_exact(default, blackwell)


def test_out_features_must_be_positive() -> None:
    with pytest.raises(ValueError, match="out_features"):
        fs.NVFP4Linear(128, 0)
    with pytest.raises(ValueError, match="in_features"):
        fs.NVFP4Linear(0, 128)


def test_buffers_are_made_on_the_given_device_like_torchao() -> None:
    theirs = ao_train.NVFP4Linear(128, 256, device="meta")
    ours = fs.NVFP4Linear(128, 256, device="meta")
    for name in ("_sr_seed", "_rht_sign_vector"):
        assert getattr(ours, name).device == getattr(theirs, name).device == torch.device("meta"), name
        assert getattr(ours, name).dtype == getattr(theirs, name).dtype, name


def test_from_linear_of_an_nvfp4_linear_keeps_its_sign_vector_like_torchao() -> None:
    torch.manual_seed(5)
    ours = fs.NVFP4Linear(128, 128)
    theirs = ao_train.NVFP4Linear(128, 128, rht_sign_vector=ours.rht_sign_vector)
    torch.manual_seed(6)  # a fresh draw would give other signs
    again_theirs = ao_train.NVFP4Linear.from_linear(theirs)
    torch.manual_seed(6)
    again_ours = fs.NVFP4Linear.from_linear(ours)
    assert again_theirs.rht_sign_vector == theirs.rht_sign_vector
    assert again_ours.rht_sign_vector == ours.rht_sign_vector
    assert again_ours.weight is ours.weight
