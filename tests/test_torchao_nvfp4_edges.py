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


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


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


def test_blocks_far_below_the_amax_get_the_smallest_normal_e4m3_scale() -> None:
    """A block whose ``bmax / 6 * enc`` is below 2^-6 is scaled by 2^-6 (torchao's clamp), not by the
    subnormal E4M3 code its quotient would round to."""
    m = _module()
    x = _heavy((128, 128), 2).float()
    x[:, :16] *= 1e-6  # the first 1x16 block of every row: about 1e-6 of the tensor's amax
    x[0, 0] = 2.0**-10  # and one of them with a quotient between 2^-9 and 2^-6
    x = x.to(torch.bfloat16)
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
