"""Named conventions against the real libraries they reproduce (spec sections 2.3 and 2.4)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import ml_dtype

import fp8sim
from fp8sim.cast.conventions import ML_DTYPES_RULES, ml_dtypes_rule
from fp8sim.formats import FORMATS
from fp8sim.report.conformance import count_mismatches
from fp8sim.testing.oracles import require

BITS16 = np.arange(1 << 16, dtype=np.uint16)


def _f32_sample() -> np.ndarray:
    rng = np.random.default_rng(5)
    pats = rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = (rng.standard_normal(1 << 16) * rng.choice([1e-6, 1e-2, 1.0, 300.0, 1e5], 1 << 16)).astype(np.float32)
    return np.concatenate([pats, normal])


def _assert_same(got: np.ndarray, want: np.ndarray, fmt: fp8sim.FloatFormat, x: np.ndarray, what: str) -> None:
    n, i = count_mismatches(np.asarray(got), np.asarray(want), fmt)
    assert n == 0, (
        f"{what} {fmt.name}: {n} codes differ; first x={np.asarray(x).reshape(-1)[i]!r} "
        f"got 0x{int(np.asarray(got).reshape(-1)[i]):02x} want 0x{int(np.asarray(want).reshape(-1)[i]):02x}"
    )


@pytest.mark.parametrize("name", list(FORMATS))
def test_ml_dtypes_convention_equals_astype_for_float16_bfloat16_float32(name: str) -> None:
    fmt = FORMATS[name]
    dt = ml_dtype(fmt)
    conv = fp8sim.CONVENTIONS["ml_dtypes"]
    for x in (BITS16.view(np.float16), BITS16.view(ml_dtypes.bfloat16), _f32_sample()):
        with np.errstate(invalid="ignore", over="ignore"):
            want = x.astype(dt).view(np.uint8)
        _assert_same(conv.encode(x, fmt), want, fmt, x, f"ml_dtypes {ml_dtypes.__version__}")


@pytest.mark.parametrize("name", list(FORMATS))
def test_ml_dtypes_convention_rounds_float64_arrays_like_the_installed_ml_dtypes(name: str) -> None:
    """Spec 2.5 pitfall 1: ml_dtypes before 0.7 casts float64 arrays through float32 (double rounding);
    0.7 rounds them once, as the core does.  One float64 hair off every midpoint separates the two."""
    fmt = FORMATS[name]
    dt = ml_dtype(fmt)
    vals = np.unique(np.abs(fmt_values(fmt)))
    mids = (vals[1:] + vals[:-1]) / 2
    x = np.concatenate([mids + mids * 2.0**-40, mids - mids * 2.0**-40, -(mids + mids * 2.0**-40)])
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(dt).view(np.uint8)
    _assert_same(fp8sim.CONVENTIONS["ml_dtypes"].encode(x, fmt), want, fmt, x, "ml_dtypes float64")
    core = fp8sim.encode(x, fmt, saturate=False)
    if ml_dtypes_rule().float64 == "via_float32":  # the core rounds the exact value once: differs on float32's ties
        assert (core != want).any(), "expected the core to differ from ml_dtypes' double rounding somewhere"
    else:
        _assert_same(core, want, fmt, x, f"core vs ml_dtypes {ml_dtypes.__version__} float64")


def test_ml_dtypes_convention_is_the_installed_release_rule() -> None:
    rule = ml_dtypes_rule()
    conv = fp8sim.CONVENTIONS["ml_dtypes"]
    named = fp8sim.CONVENTIONS[rule.convention]
    assert ml_dtypes.__version__ in conv.description and rule.convention in conv.description
    for attr in ("rounding", "saturate", "float64", "e8m0_ties", "e8m0_sliver", "overrides", "nan_codes"):
        assert getattr(conv, attr) == getattr(named, attr), attr


@pytest.mark.parametrize(
    "version, name",
    [("0.5.0", "ml_dtypes_0_5_0"), ("0.5.1", "ml_dtypes_0_5"), ("0.5.4", "ml_dtypes_0_5"), ("0.6.0", "ml_dtypes_0_6"),
     ("0.6.3", "ml_dtypes_0_6"), ("0.7.0", "ml_dtypes_0_7"), ("0.7.1rc1", "ml_dtypes_0_7"), ("0.9.0", "ml_dtypes_0_7")],
)  # fmt: skip
def test_ml_dtypes_rule_is_picked_by_release(version: str, name: str) -> None:
    assert ml_dtypes_rule(version).convention == name
    assert name in fp8sim.CONVENTIONS


# E8M0 inputs that separate the four ml_dtypes rules: exact ties with odd and even k, the lowest binade
# below, at and above its tie, and one float32 ulp beside each.  Expected codes read from each release's
# source (docs/versions.md): 0.5.0 ties to the even code; 0.5.1 - 0.6 tie up and send (2^-127, 2^-126) to
# 0x01; 0.7 ties up and rounds the lowest binade to nearest.
_E8M0_RULE_CASES = {
    # x: (0.5.0, 0.5.1-0.6, 0.7)
    1.5: (0x80, 0x80, 0x80),  # k = 0 even: 1.5 -> 2 (code 128 even) everywhere
    3.0: (0x80, 0x81, 0x81),  # k = 1 odd: ties-to-even keeps 2 (code 128)
    1.5 * 2.0**-127: (0x01, 0x01, 0x01),  # the lowest tie: sliver rule (0.5.0, 0.6) or tie up (0.7)
    1.25 * 2.0**-127: (0x01, 0x01, 0x00),
    1.0 * 2.0**-127 + 2.0**-149: (0x01, 0x01, 0x00),
    1.75 * 2.0**-127: (0x01, 0x01, 0x01),
    1.5 * 2.0**127: (0xFE, 0xFF, 0xFF),  # the top tie: even keeps max, up overflows to NaN
}


@pytest.mark.parametrize("rule", ML_DTYPES_RULES, ids=lambda r: r.convention)
def test_each_ml_dtypes_rule_gives_its_release_codes_on_e8m0_edges(rule) -> None:  # noqa: ANN001
    col = {"ml_dtypes_0_5_0": 0, "ml_dtypes_0_5": 1, "ml_dtypes_0_6": 1, "ml_dtypes_0_7": 2}[rule.convention]
    x = np.array(list(_E8M0_RULE_CASES), np.float32)
    want = np.array([v[col] for v in _E8M0_RULE_CASES.values()], np.uint8)
    got = fp8sim.CONVENTIONS[rule.convention].encode(x, "e8m0")
    _assert_same(got, want, fp8sim.E8M0, x, rule.convention)
    if ml_dtypes_rule().convention == rule.convention:  # the installed release agrees
        _assert_same(x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8), want, fp8sim.E8M0, x, "installed ml_dtypes")


def fmt_values(fmt: fp8sim.FloatFormat) -> np.ndarray:
    v = np.array([fmt.code_value(c) for c in range(fmt.num_codes)])
    return v[np.isfinite(v)]


def test_ml_dtypes_convention_rounds_python_floats_once_like_the_scalar_constructor() -> None:
    x = 1.0625 + 2.0**-40  # just above the E4M3 midpoint between 1.0 and 1.125
    want = int(np.array(ml_dtypes.float8_e4m3fn(x)).view(np.uint8))
    assert fp8sim.CONVENTIONS["ml_dtypes"].encode(x, "e4m3") == want == 0x39


def _torch_inputs(torch):  # noqa: ANN001, ANN202
    with np.errstate(invalid="ignore"):
        f64 = _f32_sample().astype(np.float64) * (1 + 2.0**-30)
    return [
        ("float16", torch.from_numpy(BITS16.view(np.int16)).view(torch.float16)),
        ("bfloat16", torch.from_numpy(BITS16.view(np.int16)).view(torch.bfloat16)),
        ("float32", torch.from_numpy(_f32_sample())),
        ("float64", torch.from_numpy(f64)),
    ]


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e8m0", "e4m3fnuz", "e5m2fnuz"])
def test_torch_eager_convention_equals_installed_torch_bit_for_bit(name: str) -> None:
    torch = require("torch")
    fmt = FORMATS[name]
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    conv = fp8sim.CONVENTIONS["torch_eager" if version >= (2, 13) else "torch_eager_legacy"]
    for label, x in _torch_inputs(torch):
        want = x.to(fmt.torch_dtype).view(torch.uint8).numpy()
        got = conv.encode(x, fmt).numpy()
        # torch_eager reproduces even the NaN codes: compare raw bits, not NaN classes
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (
            f"{conv.name} {name} {label}: {bad.size} differ; first x={x.reshape(-1)[bad[0]].item()!r} "
            f"got 0x{got[bad[0]]:02x} want 0x{want[bad[0]]:02x}"
        )


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"])
def test_torchao_convention_equals_to_fp8_saturated(name: str) -> None:
    torch = require("torch")
    fu = require("torchao.float8.float8_utils")
    fmt = FORMATS[name]
    for _, x in _torch_inputs(torch):
        want = fu.to_fp8_saturated(x, fmt.torch_dtype).view(torch.uint8).numpy()
        _assert_same(fp8sim.CONVENTIONS["torchao"].encode(x, fmt).numpy(), want, fmt, x.float().numpy(), "torchao")


# Spec section 2.3 (torch eager E4M3FN before pytorch#178817), written by hand.
LEGACY_E4M3 = [
    (448.0, 0x7E),
    (464.0, 0x7E),
    (464.5, 0x7F),
    (479.0, 0x7F),
    (480.0, 0x7F),
    (1e9, 0x7F),
    (-470.0, 0xFF),
    (float("inf"), 0x7F),
    (float("-inf"), 0xFF),
]


@pytest.mark.parametrize(("x", "code"), LEGACY_E4M3)
def test_torch_eager_legacy_e4m3_overflow_goes_to_nan(x: float, code: int) -> None:
    assert fp8sim.CONVENTIONS["torch_eager_legacy"].encode(np.float32(x), "e4m3") == code


# Spec section 2.4, TE float_to_e8m0 / PTX cvt.rp.satfinite.ue8m0x2 column, by hand.
SATFINITE_E8M0 = [
    (0.0, 0x00),
    (1.0, 0x7F),
    (1.0000001, 0x80),
    (1.5, 0x80),
    (3.0, 0x81),
    (float("inf"), 0xFE),
    (3.0e38, 0xFE),
    (float("nan"), 0xFF),
    (2.0**-127, 0x00),
    (2.0**-127 * 1.25, 0x01),
    (2.0**-130, 0x00),
]


@pytest.mark.parametrize(("x", "code"), SATFINITE_E8M0)
def test_satfinite_e8m0_rounds_up_and_saturates(x: float, code: int) -> None:
    assert fp8sim.get_convention("te").encode(np.float32(x), "e8m0") == code


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "e2m3", "e3m2"])
def test_satfinite_equals_gfloat_saturating_nearest_even(name: str) -> None:
    gfloat = require("gfloat")
    from gfloat import formats as gf

    fi = {
        "e4m3": gf.format_info_ocp_e4m3,
        "e5m2": gf.format_info_ocp_e5m2,
        "e2m1": gf.format_info_ocp_e2m1,
        "e2m3": gf.format_info_ocp_e2m3,
        "e3m2": gf.format_info_ocp_e3m2,
    }[name]
    fmt = FORMATS[name]
    vals = np.unique(np.abs(fmt_values(fmt)))
    mids = (vals[1:] + vals[:-1]) / 2
    x = np.concatenate([vals, mids, mids * (1 + 2.0**-20), mids * (1 - 2.0**-20), [fmt.max * 1.1, 1e30, np.inf]])
    x = np.concatenate([x, -x])
    want = np.array([gfloat.round_float(fi, float(v), gfloat.RoundMode.TiesToEven, sat=True) for v in x])
    got = fp8sim.get_convention("cuda").quantize(x, name).astype(np.float64)
    assert np.array_equal(got, want), f"first differing x={x[np.flatnonzero(got != want)[0]]}"


def test_unknown_convention_and_unsupported_format_are_named() -> None:
    with pytest.raises(ValueError, match="unknown convention 'numpy'; known: ml_dtypes, satfinite"):
        fp8sim.get_convention("numpy")
    with pytest.raises(ValueError, match="convention 'torch_eager' has no e2m1"):
        fp8sim.CONVENTIONS["torch_eager"].encode(np.float32(1.0), "e2m1")


def test_ue5m3_is_an_ml_dtypes_format_and_not_claimed_for_cuda() -> None:
    """UE5M3 (ml_dtypes >= 0.7's float8_e5m3fnu): the ml_dtypes conventions cover it; satfinite does not,
    CUDA's __nv_fp8_ue5m3 conversion not having been read."""
    x = np.array([-1.0, -0.0, 1e-9, 114688.0, 2e5, np.inf, np.nan], np.float32)
    want = [0xFF, 0x00, 0x00, 0xFE, 0xFF, 0xFF, 0xFF]  # negative -> NaN, -0 -> 0, overflow and Inf -> NaN
    assert list(fp8sim.CONVENTIONS["ml_dtypes_0_7"].encode(x, "ue5m3")) == want
    with pytest.raises(ValueError, match="convention 'satfinite' has no ue5m3; it covers: e4m3, e5m2"):
        fp8sim.CONVENTIONS["satfinite"].encode(x, "ue5m3")


def test_conventions_mapping_finds_aliases_as_get_convention_does() -> None:
    """``fp8sim.CONVENTIONS["te"]`` raised KeyError while ``get_convention("te")`` worked (issue 29 leftover):
    the mapping resolves the aliases, lists each preset once, and names the known ones for a bad key."""
    import fp8sim

    for alias in ("te", "cuda", "transformer_engine"):
        assert fp8sim.CONVENTIONS[alias] is fp8sim.CONVENTIONS["satfinite"] is fp8sim.get_convention(alias)
        assert alias in fp8sim.CONVENTIONS and alias not in list(fp8sim.CONVENTIONS)
    assert len(fp8sim.CONVENTIONS) == len(set(fp8sim.CONVENTIONS)) == len(list(fp8sim.CONVENTIONS.values()))
    with pytest.raises(KeyError, match=r"unknown convention 'nope'; known: ml_dtypes, .*\bte\b"):
        fp8sim.CONVENTIONS["nope"]
    assert {} not in fp8sim.CONVENTIONS  # an unhashable key is simply absent
    with pytest.raises(TypeError):
        fp8sim.CONVENTIONS["x"] = None  # read-only, as the MappingProxyType was
