"""Hardware stochastic rounding (PTX ``cvt.rs.satfinite.*x4.f32``) and Philox4x32-10.

Oracles: Random123's published known-answer vectors for Philox4x32-10 (``tests/kat_vectors`` of the
Random123 distribution, Salmon et al. SC'11); TE's ``philox4x32_native_state`` counter/key layout written
here from ``transformer_engine/common/util/curanddx.hpp`` (``init``, ``generate4``); gfloat's
``round_float(..., RoundMode.StochasticFastest, sat=True, srbits, srnumbits)``
(``graphcore-research/gfloat:src/gfloat/round.py``), which is the PTX ".rs" carry rule, fed with the
random bits the PTX ISA (cvt, "rbits") assigns to each operand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.cast.philox import philox4x32, te_philox_words
from fp8sim.cast.ptx_sr import encode_ptx_rs, ptx_rs_bits
from fp8sim.testing.oracles import require

gfloat = require("gfloat")
from gfloat import formats as gf  # noqa: E402

KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]
FORMATS = {
    "e4m3": gf.format_info_ocp_e4m3,
    "e5m2": gf.format_info_ocp_e5m2,
    "e2m3": gf.format_info_ocp_e2m3,
    "e3m2": gf.format_info_ocp_e3m2,
    "e2m1": gf.format_info_ocp_e2m1,
}


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox4x32_10_known_answers(ctr, key, want):
    assert tuple(int(v) for v in philox4x32(np.array(ctr), np.array(key))) == want


def test_philox_vectorizes_over_counters():
    ctrs = np.array([k[0] for k in KAT], np.uint64)
    keys = np.array([k[1] for k in KAT], np.uint64)
    assert [tuple(int(v) for v in row) for row in philox4x32(ctrs, keys)] == [k[2] for k in KAT]


def _te_reference(seed: int, subsequence: int, offset: int, count: int) -> list[int]:
    """curanddx.hpp: ctr = 0; key = (seed lo, seed hi); skip_subsequence adds to (z, w); skip_offset adds
    to (x, y) with carry; generate4 returns round(ctr) and increments ctr (x first, carrying up)."""
    ctr = (subsequence << 64) + offset
    out: list[int] = []
    while len(out) < count:
        c = [(ctr >> (32 * j)) & 0xFFFFFFFF for j in range(4)]
        out += [int(v) for v in philox4x32(np.array(c), np.array([seed & 0xFFFFFFFF, seed >> 32]))]
        ctr = (ctr + 1) % 2**128
    return out[:count]


@pytest.mark.parametrize(
    "seed,subsequence,offset",
    [(0, 0, 0), (0x123456789ABCDEF0, 3, 7), (2**64 - 1, 0, 2**64 - 2), (5, 2**63, 2**32 - 1)],
)
def test_te_philox_words_follow_curanddx_state(seed, subsequence, offset):
    want = _te_reference(seed, subsequence, offset, 13)
    assert [int(v) for v in te_philox_words(seed, offset, 13, subsequence=subsequence)] == want


def test_te_philox_words_large_draw_equals_small_draws():
    big = te_philox_words(99, 2**64 - 3, 4 * 5000)
    assert np.array_equal(big[:40], te_philox_words(99, 2**64 - 3, 40))
    assert np.array_equal(big[-8:], np.array(_te_reference(99, 0, 2**64 - 3 + 4998, 8), np.uint32))


def _gfloat_rs(x: np.ndarray, name: str, bits: np.ndarray) -> np.ndarray:
    fi, r = FORMATS[name], 8 if name == "e2m1" else 16
    out = []
    for v, b in zip(x.reshape(-1), bits.reshape(-1), strict=True):
        if np.isnan(v):  # satfinite NaN -> NaN (gfloat drops its sign), or +MAX_NORM without NaN (TE ptx.cuh)
            out.append(gfloat.encode_float(fi, fi.max) if fi.num_nans == 0 else 0x7F)
            continue
        rv = gfloat.round_float(fi, float(v), gfloat.RoundMode.StochasticFastest, sat=True, srbits=int(b), srnumbits=r)
        out.append(gfloat.encode_float(fi, rv))
    return np.array(out, np.uint8).reshape(x.shape)


def _inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 18, n))).astype(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30, 2.0**-149]
    return x


@pytest.mark.parametrize("name", list(FORMATS))
def test_cvt_rs_equals_carry_rule_with_ptx_bit_assignment(name):
    rng = np.random.default_rng(1)
    x = _inputs(rng, 800)
    words = rng.integers(0, 2**32, x.size // 4, dtype=np.uint64).astype(np.uint32)
    got = encode_ptx_rs(x, name, words)
    assert np.array_equal(got, _gfloat_rs(x, name, ptx_rs_bits(words, name)))


def test_fp8_operand_pairs_share_their_half_word():
    """PTX: for .e4m3x4/.e5m2x4 the upper 16 bits serve a and b, the lower 16 bits e and f; in memory
    order (TE passes {x3, x2, x1, x0}) x0, x1 take the low half and x2, x3 the high half."""
    bits = ptx_rs_bits(np.array([0xABCD1234], np.uint32), "e4m3")
    assert bits.tolist() == [[0x1234, 0x1234, 0xABCD, 0xABCD]]
    bits4 = ptx_rs_bits(np.array([0xA1B2C3D4], np.uint32), "e2m1")
    assert bits4.tolist() == [[0xD4, 0xB2, 0xC3, 0xA1]]  # f = [7:0], e = [23:16], b = [15:8], a = [31:24]


def test_halfway_value_rounds_up_exactly_when_the_carry_happens():
    """1 + 1/16 lies halfway between E4M3 1.0 and 1.125: the discarded bits read 0x8000 (top 16), so a
    random half-word >= 0x8000 carries out and rounds away."""
    x = np.full(4, 1.0625, np.float32)
    lo = encode_ptx_rs(x, "e4m3", np.array([0x7FFF7FFF], np.uint32))
    hi = encode_ptx_rs(x, "e4m3", np.array([0x80008000], np.uint32))
    assert (lo == 0x38).all() and (hi == 0x39).all()


@settings(max_examples=30, deadline=None)
@given(st.floats(0.25, 5.75, width=32), st.sampled_from(["e4m3", "e2m1"]))
def test_stochastic_rounding_is_unbiased_over_all_random_words(v, name):
    """Averaged over every value of its r random bits, the rounded value equals the input up to the
    truncation of the discarded bits to r bits (PTX uses only r bits: limited-precision SR)."""
    from fp8sim.cast import decode

    r = 8 if name == "e2m1" else 16
    u = np.arange(2**r, dtype=np.uint32)
    word = (u << 24) if name == "e2m1" else (u << 16)  # feeds element x3 (operand a)
    x = np.zeros((u.size, 4), np.float32)
    x[:, 3] = v
    mean = decode(encode_ptx_rs(x, name, word)[:, 3], name).astype(np.float64).mean()
    step = 0.5 if name == "e2m1" and v < 2 else (1.0 if name == "e2m1" and v < 4 else 2.0)
    if name == "e4m3":
        step = 2.0 ** (np.floor(np.log2(v)) - 3)
    assert abs(mean - np.float64(v)) <= step * 2.0**-r


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"no \.e8m0x4 destination"):
        encode_ptx_rs(np.zeros(4, np.float32), "e8m0", np.zeros(1, np.uint32))
    with pytest.raises(TypeError, match="float32"):
        encode_ptx_rs(np.zeros(4), "e4m3", np.zeros(1, np.uint32))
    with pytest.raises(ValueError, match="multiple of 4"):
        encode_ptx_rs(np.zeros(6, np.float32), "e4m3", np.zeros(1, np.uint32))
    with pytest.raises(ValueError, match="one word per group of four: 2 words"):
        encode_ptx_rs(np.zeros(8, np.float32), "e4m3", np.zeros(1, np.uint32))
    with pytest.raises(ValueError, match="rounds must be"):
        philox4x32(np.zeros(4, np.uint32), np.zeros(2, np.uint32), rounds=0)
    with pytest.raises(ValueError, match="seed must be an int"):
        te_philox_words(-1, 0, 4)
