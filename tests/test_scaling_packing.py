"""Sub-byte packing (spec section 1, "Storage"; ``fp8sim.scaling.packing`` docstring).

FP4: element 2i in the low nibble of byte i, checked exhaustively, against TE's reference formula
(``cast_to_fp4x2``: ``result[:, ::2] + result[:, 1::2] * 16``), torchao's ``pack_uint4`` and torch's
``float4_e2m1fn_x2`` view.  FP6: a little-endian 24-bit stream per four codes, checked over all
2^24 groups: the packed bytes of group n are n's three little-endian bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.scaling.packing import pack_fp4, pack_fp6, unpack_fp4, unpack_fp6
from fp8sim.testing.oracles import require

torch = require("torch")


def all_fp4_pairs() -> np.ndarray:
    """(256, 2) uint8: every (even, odd) element pair."""
    n = np.arange(256)
    return np.stack([n & 0xF, n >> 4], axis=-1).astype(np.uint8)


def test_pack_fp4_every_pair_low_nibble_first():
    pairs = all_fp4_pairs()
    packed = pack_fp4(pairs)
    assert packed.dtype == np.uint8 and packed.shape == (256, 1)
    assert np.array_equal(packed[:, 0], np.arange(256, dtype=np.uint8))
    assert np.array_equal(unpack_fp4(packed), pairs)


def test_unpack_fp4_every_byte_round_trips():
    b = np.arange(256, dtype=np.uint8).reshape(4, 4, 16)
    codes = unpack_fp4(b)
    assert codes.shape == (4, 4, 32) and codes.max() < 16
    assert np.array_equal(pack_fp4(codes), b)


def test_pack_fp4_matches_te_reference_formula():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    t = torch.from_numpy(codes)
    te = (t[:, ::2] + t[:, 1::2] * 16).numpy()  # reference_nvfp4.py cast_to_fp4x2
    assert np.array_equal(pack_fp4(codes), te)


def test_pack_fp4_torch_in_torch_out_and_float4_x2_view():
    codes = torch.from_numpy(all_fp4_pairs()).reshape(16, 32)
    packed = pack_fp4(codes)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8 and packed.shape == (16, 16)
    assert np.array_equal(packed.numpy(), pack_fp4(codes.numpy()))
    x2 = packed.view(torch.float4_e2m1fn_x2)  # one float4_e2m1fn_x2 element per packed byte
    assert x2.shape == packed.shape and torch.equal(x2.view(torch.uint8), packed)
    assert torch.equal(unpack_fp4(x2), codes.to(torch.uint8))
    assert torch.equal(unpack_fp4(packed), codes.to(torch.uint8))
    assert torch.equal(pack_fp4(codes.to(torch.int64)), packed)


def test_pack_fp4_matches_torchao_pack_uint4():
    require("torchao")
    from torchao.prototype.mx_formats.kernels import pack_uint4, unpack_uint4

    rng = np.random.default_rng(1)
    codes = torch.from_numpy(rng.integers(0, 16, (4, 8, 32)).astype(np.uint8))
    assert torch.equal(pack_fp4(codes), pack_uint4(codes))
    assert torch.equal(unpack_fp4(pack_uint4(codes)), unpack_uint4(pack_uint4(codes)))


def test_pack_fp6_every_group_is_a_little_endian_24_bit_word():
    n = np.arange(1 << 24, dtype=np.uint32)
    codes = np.stack([(n >> (6 * i)) & 0x3F for i in range(4)], axis=-1).astype(np.uint8)
    packed = pack_fp6(codes.reshape(-1))
    want = n.astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3].reshape(-1)
    assert packed.dtype == np.uint8 and packed.shape == (3 << 24,)
    assert np.array_equal(packed, want)
    assert np.array_equal(unpack_fp6(packed), codes.reshape(-1))


def test_pack_fp6_single_code_positions():
    """Code i of a group occupies bits 6i..6i+5 of the 24-bit group (hand-written)."""
    cases = {
        (0x3F, 0, 0, 0): (0x3F, 0x00, 0x00),
        (0, 0x3F, 0, 0): (0xC0, 0x0F, 0x00),
        (0, 0, 0x3F, 0): (0x00, 0xF0, 0x03),
        (0, 0, 0, 0x3F): (0x00, 0x00, 0xFC),
        (1, 2, 3, 4): (0x81, 0x30, 0x10),
    }
    for codes, want in cases.items():
        got = pack_fp6(np.array(codes, np.uint8))
        assert tuple(int(b) for b in got) == want, (codes, [hex(b) for b in got])


def test_pack_fp6_torch_matches_numpy():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 64, (3, 5, 16)).astype(np.uint8)
    t = pack_fp6(torch.from_numpy(codes))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.shape == (3, 5, 12)
    assert np.array_equal(t.numpy(), pack_fp6(codes))
    assert torch.equal(unpack_fp6(t), torch.from_numpy(codes))


def test_torchao_has_no_fp6_packing_helper():
    """The FP6 layout is fp8sim's own because torchao 0.18 has none to match; if this fails,
    torchao gained one and fp8sim should be checked against it."""
    require("torchao")
    from torchao.prototype.mx_formats import kernels

    assert not hasattr(kernels, "pack_uint6")


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: pack_fp4(np.zeros((2, 3), np.uint8)), ValueError, "last dim 3 must be even"),
        (lambda: pack_fp4(np.array([1, 16], np.uint8)), ValueError, "code 16 out of range; 4-bit codes"),
        (lambda: pack_fp4(np.array([-1, 2])), ValueError, "code -1 out of range"),
        (lambda: pack_fp4(torch.tensor([3, 17])), ValueError, "code 17 out of range"),
        (lambda: pack_fp4(np.zeros(4, np.float32)), TypeError, "integer dtype"),
        (lambda: pack_fp4(torch.zeros(4)), TypeError, "integer tensor"),
        (lambda: pack_fp4(np.uint8(3)), ValueError, "at least one dimension"),
        (lambda: pack_fp4(1.5), TypeError, "integer array or tensor"),
        (lambda: unpack_fp4(np.zeros(4, np.int32)), TypeError, "dtype uint8"),
        (lambda: unpack_fp4(torch.zeros(4, dtype=torch.int16)), TypeError, "uint8"),
        (lambda: pack_fp6(np.zeros((2, 6), np.uint8)), ValueError, "last dim 6 must be a multiple of 4"),
        (lambda: pack_fp6(np.array([0, 1, 2, 64], np.uint8)), ValueError, "code 64 out of range; 6-bit codes"),
        (lambda: unpack_fp6(np.zeros(4, np.uint8)), ValueError, "last dim 4 must be a multiple of 3"),
    ],
)
def test_bad_inputs_raise(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)
