"""Cast semantics the second sampled mutation run of ``cast`` (seed 31, reports/mutation_cast.md) found untested.

Oracles: the installed ml_dtypes' own casts (what its preset's description claims), ml_dtypes' decode of
codes, numpy's amax of the unscaled input, the spec's Fraction reference (``conftest.ref_encode_array``), and
the argument messages of ``fp8sim._util.args.as_int`` (the names and ranges a user reads).
"""

from __future__ import annotations

import re
import warnings

import ml_dtypes
import numpy as np
import pytest
from conftest import ref_encode_array

import fp8sim
from fp8sim.cast import conventions
from fp8sim.cast.e8m0 import encode_e8m0
from fp8sim.cast.numpy_backend import encode_scaled_with_amax
from fp8sim.cast.philox import philox4x32, te_philox_words
from fp8sim.cast.te_nvfp4_sr import te_philox_block_words

# float32 signalling NaNs (quiet bit clear): widening or multiplying them raises numpy's "invalid" flag
_SNAN = np.array([0x7F800001, 0xFF800001, 0x7FA00000], np.uint32).view(np.float32)


# -- ml_dtypes presets: what each description says ----------------------------------------------------------


def test_the_installed_ml_dtypes_preset_names_its_release_and_rule_and_notes_only_a_newer_release(monkeypatch):
    """A checked release: "rule <name>; " then the release's description, nothing in between; a release newer
    than the last one read says it is assumed unchanged (the rule of its predecessor)."""
    rule = conventions.ml_dtypes_rule(ml_dtypes.__version__)
    conv = conventions._installed_ml_dtypes()
    head = f"the installed ml_dtypes {ml_dtypes.__version__}: rule {rule.convention}; ml_dtypes {rule.releases} "
    if conventions._version_tuple(ml_dtypes.__version__) <= conventions._version_tuple(conventions.ML_DTYPES_VERIFIED):
        assert conv.description.startswith(head), conv.description
        assert "None" not in conv.description and "newer than" not in conv.description
    monkeypatch.setattr(ml_dtypes, "__version__", "9.1.0")
    newer = conventions._installed_ml_dtypes()
    newest = conventions.ML_DTYPES_RULES[-1]
    assert newer.description.startswith(
        f"the installed ml_dtypes 9.1.0: rule {newest.convention} (newer than {conventions.ML_DTYPES_VERIFIED}, "
    )
    assert "assumed unchanged" in newer.description and newer.e8m0_ties == newest.e8m0_ties


_CLAIMS = {  # each release's rule, read from its source (docs/versions.md): the words its description uses
    "ml_dtypes_0_5_0": ("E8M0 ties to the even code", "(2^-127, 2^-126) -> 2^-126", "through float32"),
    "ml_dtypes_0_5": ("E8M0 ties up", "(2^-127, 2^-126) -> 2^-126", "through float32"),
    "ml_dtypes_0_6": ("E8M0 ties up", "(2^-127, 2^-126) -> 2^-126", "through float32"),
    "ml_dtypes_0_7": ("E8M0 ties up", "(2^-127, 2^-126) to nearest", "rounded once"),
}


def test_each_ml_dtypes_release_preset_states_its_rule():
    for rule in conventions.ML_DTYPES_RULES:
        desc = conventions._ml_dtypes_preset(rule).description
        assert desc.startswith(f"ml_dtypes {rule.releases} astype / scalar constructor: nearest-even"), desc
        assert all(claim in desc for claim in _CLAIMS[rule.convention]), desc


def test_the_installed_preset_states_what_the_installed_ml_dtypes_does():
    """The three claims of the installed release's description, measured on ml_dtypes itself."""
    desc = conventions._ml_dtypes_preset(conventions.ml_dtypes_rule(ml_dtypes.__version__)).description
    e8 = np.array([3.0, 1.1 * 2.0**-127], np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    # 3.0 is the tie of 2.0 (code 128, even) and 4.0 (129): up -> 129, to the even code -> 128 (1.5 cannot tell:
    # its tie's upper code 128 is also the even one)
    assert ("E8M0 ties up" in desc) == (e8[0] == 129)
    assert ("E8M0 ties to the even code" in desc) == (e8[0] == 128)
    assert ("(2^-127, 2^-126) to nearest" in desc) == (e8[1] == 0)  # 1.1 * 2^-127 -> 2^-127 (code 0)
    # just below the E4M3 midpoint 1.1875: once -> 1.125 (0x39); through float32 it is the tie -> 1.25 (0x3A)
    once = np.array([1.1875 - 2.0**-30]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0] == 0x39
    assert ("float64 arrays rounded once" in desc) == once


def test_a_stochastic_convention_quantizes_with_its_seed():
    """``quantize(x, fmt, seed=s)``: the values of the seed-``s`` codes (decoded by ml_dtypes), reproducibly."""
    conv = conventions.Convention("sr", "stochastic, saturating", rounding="stochastic")
    x = np.linspace(-3, 3, 64, dtype=np.float32) + np.float32(0.01)
    got = conv.quantize(x, "e4m3", seed=11)
    want = fp8sim.encode(x, "e4m3", rounding="stochastic", seed=11).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(got, want) and np.array_equal(conv.quantize(x, "e4m3", seed=11), want)


# -- E8M0 with a tie or lowest-binade rule -------------------------------------------------------------------


@pytest.mark.parametrize(("ties", "sliver"), [("even", "nearest"), ("up", "up")])
def test_e8m0_rules_take_signalling_nans_without_a_warning(ties, sliver):
    """The rule's float64 copy of the input quiets signalling NaNs silently; they stay NaN (0xFF, ml_dtypes)."""
    with np.errstate(invalid="ignore"):  # ml_dtypes 0.5 flags the quieting of the oracle's own cast
        want = _SNAN.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes = encode_e8m0(_SNAN, ties=ties, sliver=sliver)
    assert codes.tolist() == want.tolist() == [0xFF] * 3


# -- the fused scaled cast of current / delayed scaling ---------------------------------------------------------

_DEEP = fp8sim.FloatFormat("x_e4m3_b140", 4, 3, 140, specials="none")  # no float32 table: the exact path


@pytest.mark.parametrize("fmt", ["e4m3", _DEEP], ids=["table", "exact"])
def test_the_amax_of_a_negative_largest_magnitude_is_its_absolute_value(fmt):
    f = fp8sim.get_format(fmt)
    x = np.array([[0.5, -7.25, 3.0], [np.nan, 1.0, -0.0]], np.float32)
    scale = np.float32(2.0**-130) if f is _DEEP else np.float32(2.0)
    codes, amax = encode_scaled_with_amax(x, scale, f)
    assert amax == np.float32(7.25)  # numpy: max |x| over the non-NaN values
    assert amax == np.nanmax(np.abs(x))
    with np.errstate(invalid="ignore"):
        prod = x * scale
    if f is _DEEP:
        assert codes.tolist() == ref_encode_array(prod, f, "nearest_even", True).tolist()
    else:
        assert codes.tolist() == prod.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist()


def test_the_fused_scaled_cast_takes_signalling_nans_without_a_warning():
    """A signalling NaN times the scale raises the "invalid" flag: silently NaN (0x7F | sign), amax skips it."""
    x = np.concatenate([_SNAN, np.array([-3.0], np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codes, amax = encode_scaled_with_amax(x, np.float32(4.0), fp8sim.get_format("e4m3"))
    with np.errstate(invalid="ignore"):
        want = (x * np.float32(4.0)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert codes.tolist() == want.tolist() == [0x7F, 0xFF, 0x7F, 0xD4] and amax == np.float32(3.0)


# -- argument messages of the random-word streams -----------------------------------------------------------


def test_philox_names_a_bad_key_and_a_negative_word_count():
    with pytest.raises(ValueError, match=r"^key must be integers with a last dim of 2"):
        philox4x32(np.zeros(4, np.uint32), np.zeros(3, np.uint32))
    with pytest.raises(ValueError, match=r"^count must be an int >= 0, got -1$"):
        te_philox_words(1, 0, -1)
    assert te_philox_words(1, 0, 0).shape == (0,)


def test_te_philox_block_words_bounds_name_the_argument_and_its_range():
    top = 2**64 - 1
    with pytest.raises(ValueError, match=re.escape(f"seed must be an int in [0, {top}], got {2**64}")):
        te_philox_block_words(2**64, 0, 4)
    with pytest.raises(ValueError, match=re.escape(f"block must be an int in [0, {top}], got -1")):
        te_philox_block_words(1, -1, 4)
    assert te_philox_block_words(top, top, 2).shape == (2, 4)


def test_stochastic_rounding_without_a_seed_draws_a_valid_fresh_seed_each_call():
    """``seed=None``: a fresh 64-bit seed per call (not reproducible), never one the seed check refuses."""
    x = np.linspace(-3, 3, 256, dtype=np.float32) + np.float32(0.01)
    draws = {fp8sim.encode(x, "e4m3", rounding="stochastic").tobytes() for _ in range(40)}
    assert len(draws) > 1


@pytest.mark.parametrize("bias", [130, 131, 133])
def test_formats_at_the_float32_table_limit_are_rounded_from_every_bit(bias):
    """E4M3 records whose half grid spacing is 2^-133 (bias 130: float32 bit 16 of a subnormal, the table's
    last exact bit), 2^-134 and 2^-136 (bits 15 and 13: below the table's upper 16 bits, which a sticky bit
    cannot resolve): every float32 subnormal bit pattern drawn is rounded as the spec's Fraction reference
    (``conftest.ref_encode_array``) says."""
    from conftest import assert_codes_equal

    deep = fp8sim.FloatFormat(f"x_e4m3_b{bias}", 4, 3, bias, specials="fn")
    rng = np.random.default_rng(bias)
    bits = rng.integers(0x00000001, 0x00800000, 3000, dtype=np.uint32)
    x = np.concatenate([bits, bits | 0x80000000]).view(np.float32)
    for rounding in ("nearest_even", "toward_zero", "up"):
        want = ref_encode_array(x, deep, rounding, True)
        assert_codes_equal(fp8sim.encode(x, deep, rounding=rounding), want, deep, x, rounding)
