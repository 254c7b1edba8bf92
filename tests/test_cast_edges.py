"""Cast edges that the core cast tests do not reach (issue 30's mutation sample of ``fp8sim.cast``).

Oracles: torch's own ``.to(float8)`` (a convention's codes); TE's ``philox4x32_native_state`` counter
layout written here from ``transformer_engine/common/util/curanddx.hpp`` (``init(seed, subsequence,
offset)``: counter ``subsequence * 2^64 + offset``; ``generate4`` returns the words of the counter and adds
1, carrying through all 128 bits), with Philox4x32-10 itself checked against Random123's known answers in
``tests/test_cast_ptx_sr.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.cast.conventions import CONVENTIONS
from fp8sim.cast.philox import philox4x32, te_philox_words
from fp8sim.testing.oracles import require


def test_a_convention_keeps_the_kind_of_a_numpy_scalar_and_of_a_0d_array():
    """A convention that rewrites codes (torch's E5M2 NaN code 0x7F) returns what ``encode`` returns for
    the input: a numpy scalar for a numpy scalar, a 0-d array for a 0-d array, a list's array for a list."""
    torch = require("torch")
    want = int(torch.tensor([float("nan")]).to(torch.float8_e5m2).view(torch.uint8)[0])
    conv = CONVENTIONS["torch_eager"]
    scalar = conv.encode(np.float32(np.nan), "e5m2")
    assert isinstance(scalar, np.uint8) and not isinstance(scalar, np.ndarray) and scalar == want
    zero_d = conv.encode(np.array(np.nan, np.float32), "e5m2")
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d.dtype == np.uint8 and zero_d == want
    assert conv.encode(float("nan"), "e5m2") == want and isinstance(conv.encode(float("nan"), "e5m2"), int)
    # one rewrite only (E8M0's zero rule; E5M2 above rewrites twice, NaN of either sign)
    zero = int(torch.tensor([0.0]).to(torch.float8_e8m0fnu).view(torch.uint8)[0])
    scalar = conv.encode(np.float32(0.0), "e8m0")
    assert isinstance(scalar, np.uint8) and not isinstance(scalar, np.ndarray) and scalar == zero


def _curanddx_words(seed: int, subsequence: int, offset: int, start: int, count: int) -> list[int]:
    """Words ``start .. start+count-1`` of the stream, one 128-bit counter per four words."""
    out: list[int] = []
    block = start // 4
    ctr = ((subsequence << 64) + offset + block) % 2**128
    while len(out) < (start - 4 * block) + count:
        words = np.array([(ctr >> (32 * j)) & 0xFFFFFFFF for j in range(4)], np.uint64)
        key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint64)
        out += [int(v) for v in philox4x32(words, key)]
        ctr = (ctr + 1) % 2**128
    return out[start - 4 * block :][:count]


@pytest.mark.parametrize("subsequence,offset", [(1, 5), (3, 2**64 - 4100), (2**64 - 1, 2**64 - 2)])
def test_large_draws_on_an_odd_subsequence_follow_the_128_bit_counter(subsequence, offset):
    """A draw of more than 4096 counters (numpy's two-halves path) on a subsequence with bit 0 set, and with
    the offset carrying into the subsequence half (and past 2^128)."""
    seed = 0x0123456789ABCDEF
    n = 4 * 4100
    got = te_philox_words(seed, offset, n, subsequence=subsequence)
    for start in (0, 4 * 4095, n - 8):
        want = _curanddx_words(seed, subsequence, offset, start, 8)
        assert [int(v) for v in got[start : start + 8]] == want, (subsequence, offset, start)


def test_te_nvfp4_sr_words_bounds_name_the_argument_and_its_range():
    """Exact messages: the argument, its allowed range (seed: TE's 64-bit ``rng_state`` word; offset: up to
    2^64 - 9 so that the 8 blocks a thread draws stay below 2^64; rows/cols below 2^62)."""
    from fp8sim.cast.te_nvfp4_sr import te_nvfp4_sr_words

    cases = [
        ((2**62, 4, 1, 0), rf"^rows must be an int in \[0, {2**62 - 1}\], got {2**62}$"),
        ((4, 2**62, 1, 0), rf"^cols must be an int in \[0, {2**62 - 1}\], got {2**62}$"),
        ((4, 4, -1, 0), rf"^seed must be an int in \[0, {2**64 - 1}\], got -1$"),
        ((4, 4, 2**64, 0), rf"^seed must be an int in \[0, {2**64 - 1}\], got {2**64}$"),
        ((4, 4, 1, 2**64 - 8), rf"^offset must be an int in \[0, {2**64 - 9}\], got {2**64 - 8}$"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            te_nvfp4_sr_words(*args)
    te_message = (
        r"^at least one of rowwise or columnwise must be True \(TE: 'At least one of return_identity "
        r"or return_transpose must be true\.'\)$"
    )
    with pytest.raises(ValueError, match=te_message):
        te_nvfp4_sr_words(4, 4, 1, 0, rowwise=False, columnwise=False)


def test_te_nvfp4_sr_words_of_an_empty_tensor_are_empty():
    """A tensor with no rows (TE quantizes empty tensors without launching): words of shape (0, cols/4) and
    (cols, 0); the largest offset and seed are accepted."""
    from fp8sim.cast.te_nvfp4_sr import te_nvfp4_sr_words

    rw, cw = te_nvfp4_sr_words(0, 8, 2**64 - 1, 2**64 - 9)
    assert rw.shape == (0, 2) and cw.shape == (8, 0) and rw.dtype == cw.dtype == np.uint32


def test_ptx_rs_bits_keep_the_word_array_shape():
    """``ptx_rs_bits`` of a (2, 3) word array is (2, 3, 4): per word, memory order x0..x3 = operands f, e, b,
    a (PTX ISA cvt "rbits": for .e4m3x4 a and b take rbits[31:16], e and f rbits[15:0]; for .e2m1x4 a, b the
    upper bytes of the halves and e, f the lower bytes, as fp8sim.cast.ptx_sr assigns them)."""
    from fp8sim.cast.ptx_sr import ptx_rs_bits

    words = np.arange(6, dtype=np.uint64).reshape(2, 3) * 0x01020304 + 0x8070605
    got = ptx_rs_bits(words.astype(np.uint32), "e4m3")
    assert got.shape == (2, 3, 4)
    for w, g in zip(words.reshape(-1), got.reshape(-1, 4), strict=True):
        w = int(w)
        assert g.tolist() == [w & 0xFFFF, w & 0xFFFF, w >> 16, w >> 16]
    got = ptx_rs_bits(words.astype(np.uint32), "e2m1")
    assert got.shape == (2, 3, 4)
    for w, g in zip(words.reshape(-1), got.reshape(-1, 4), strict=True):
        w = int(w)
        assert g.tolist() == [w & 0xFF, (w >> 16) & 0xFF, (w >> 8) & 0xFF, w >> 24]


def test_a_stochastic_convention_passes_its_seed():
    """A user's Convention with ``rounding="stochastic"``: ``encode(x, fmt, seed=s)`` is the core stochastic
    cast with that seed (reproducible; another seed gives other codes)."""
    import fp8sim
    from fp8sim.cast.conventions import Convention

    conv = Convention("sr", "stochastic, saturating", rounding="stochastic")
    x = np.linspace(-3, 3, 64, dtype=np.float32) + np.float32(0.01)
    got = conv.encode(x, "e4m3", seed=7)
    assert np.array_equal(got, fp8sim.encode(x, "e4m3", rounding="stochastic", seed=7))
    assert not np.array_equal(got, fp8sim.encode(x, "e4m3", rounding="stochastic", seed=8))


def test_the_presets_mapping_lists_its_presets_and_the_installed_rule_is_described():
    """``repr(CONVENTIONS)`` names each preset once (aliases are not presets); the installed ml_dtypes
    preset's description states the release's rule (E8M0 ties, lowest binade, float64 arrays)."""
    import ml_dtypes

    from fp8sim.cast.conventions import ml_dtypes_rule

    assert repr(CONVENTIONS) == f"CONVENTIONS({list(CONVENTIONS)})"
    assert "te" not in list(CONVENTIONS) and "satfinite" in list(CONVENTIONS)
    desc = CONVENTIONS["ml_dtypes"].description
    rule = ml_dtypes_rule(ml_dtypes.__version__)
    assert f"the installed ml_dtypes {ml_dtypes.__version__}: rule {rule.convention}" in desc
    assert desc.endswith(rule.summary) and "float64 arrays" in desc


def test_torch_conventions_take_lists_and_keep_0d_arrays_for_e8m0():
    """torch's E8M0 cast ignores the sign (``unsigned_negative="abs"``): a list input is cast as an array
    (it raised TypeError from ``abs(list)``) and a 0-d array stays a 0-d array (numpy's abs returned a
    scalar); codes as torch's own ``.to(float8_e8m0fnu)``."""
    torch = require("torch")
    values = [0.5, -1.0, 0.0, 3.0]
    want = torch.tensor(values).to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
    for name in ("torch_eager", "torch_eager_legacy"):
        conv = CONVENTIONS[name]
        got = conv.encode(values, "e8m0")
        assert isinstance(got, np.ndarray) and got.tolist() == want
        zero_d = conv.encode(np.array(-1.0, np.float32), "e8m0")
        assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and zero_d == want[1]


def test_decode_of_empty_wide_unsigned_tensors_and_of_a_non_integer_names_the_type():
    """torch's uint16/uint32/uint64 codes are decoded through int64 (torch has no min/max for them); an empty
    one gives an empty float32 tensor.  A code that is no integer is refused by its type's name."""
    torch = require("torch")
    import fp8sim

    for name in ("uint16", "uint32", "uint64"):
        if hasattr(torch, name):
            out = fp8sim.decode(torch.empty((0, 3), dtype=getattr(torch, name)), "e4m3")
            assert out.shape == (0, 3) and out.dtype == torch.float32
    with pytest.raises(TypeError, match=r"^codes must be integers \(int, integer array or tensor\); got str$"):
        fp8sim.decode("7", "e4m3")


def test_the_exact_path_widens_signalling_nans_without_a_warning():
    """A format whose grid reaches below float32 bit 16 is cast through float64 (no table): float32 signalling
    NaNs are quieted there without numpy's "invalid value" warning, and stay NaN of their sign."""
    import warnings

    import fp8sim

    deep = fp8sim.FloatFormat("x_e4m3_b140", 4, 3, 140, specials="fn")
    snan = np.array([0x7F800001, 0xFF800001, 0x7FA00000], np.uint32).view(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes = fp8sim.encode(snan, deep)
    assert codes.tolist() == [0x7F, 0xFF, 0x7F]


def test_seeds_that_differ_only_in_their_high_word_give_different_streams():
    """All 64 bits of a stochastic-rounding seed count: seeds ``j * 2^32`` (low word 0) give pairwise different
    random bits, as do seeds that differ in one high bit."""
    from fp8sim.cast._random import numpy_bits

    streams = {tuple(numpy_bits(j << 32, 0, 8).tolist()) for j in range(64)}
    assert len(streams) == 64
    flips = {tuple(numpy_bits(5 | (1 << (32 + b)), 0, 8).tolist()) for b in range(32)}
    assert len(flips) == 32 and tuple(numpy_bits(5, 0, 8).tolist()) not in flips


def test_a_format_below_float32_bit_16_is_rounded_from_every_bit():
    """A record whose half grid spacing (2^-144) lies below float32 bit 16 (weight >= 2^-133 there) cannot use
    the 2^17-entry float32 table (upper 16 bits and a sticky bit): float32 inputs whose low bits decide the
    rounding are rounded exactly, as the spec's Fraction reference (``conftest.ref_encode_array``) says (numpy
    and torch)."""
    from conftest import assert_codes_equal, ref_encode_array

    import fp8sim

    deep = fp8sim.FloatFormat("x_e4m3_b140", 4, 3, 140, specials="fn")
    rng = np.random.default_rng(7)
    bits = rng.integers(0x00000001, 0x00800000, 2000, dtype=np.uint32)  # float32 subnormals: DEEP's low range
    x = np.concatenate([bits, bits | 0x80000000]).view(np.float32)
    torch = require("torch")
    for rounding in ("nearest_even", "toward_zero", "up"):
        want = ref_encode_array(x, deep, rounding, True)
        assert_codes_equal(fp8sim.encode(x, deep, rounding=rounding), want, deep, x, rounding)
        got = fp8sim.encode(torch.from_numpy(x), deep, rounding=rounding)
        assert_codes_equal(got, want, deep, x, f"{rounding} torch float32")
