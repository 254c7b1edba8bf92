"""MX block scaling (``fp8sim.scaling.mx``) against torchao 0.18 ``to_mx`` and the spec.

Semantics checked (``docs/semantics.md`` sections 3, 5.2, 6.3), all with zero tolerance:
- flavor ``torchao`` equals ``torchao.prototype.mx_formats.mx_tensor.to_mx`` (eager, CPU) bit for
  bit: scale codes exactly, element codes exactly (FP8 NaNs by class; FP4/FP6 have no NaN, so their
  codes exactly too), for FLOOR/CEIL/EVEN/RCEIL x E4M3/E5M2/E2M3/E3M2/E2M1, on normal,
  heavy-tailed, zero, fp32-subnormal, Inf/NaN and directed-amax blocks;
- ``e8m0_scale_codes`` equals an independent scalar reference of each spec 3 rule (``math.frexp``
  and Fractions; ``nearest`` against torch's own E8M0 cast) and hand-written spec tables;
- flavor ``te`` equals a scalar reference of spec 5.2 (NaN-skipping amax, RCEIL, satfinite RN via
  clamp + ml_dtypes) and the spec's hand-written edge cases, including ``_ENABLE_MXFMA``;
- round trips, row/column copies from the high-precision input, padding, N-d axes, input kinds and
  error messages.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_codes_equal

import fp8sim
from fp8sim.scaling.mx import (
    MX_ELEM_FORMATS,
    SCALE_RULES,
    e8m0_scale_codes,
    quantize_mx,
    quantize_mx_rowwise_columnwise,
)
from fp8sim.testing.oracles import require

ELEMS = tuple(f.name for f in MX_ELEM_FORMATS)  # e4m3, e5m2, e2m3, e3m2, e2m1
TORCHAO_RULES = ("floor", "ceil", "rceil", "even")
FLT_MAX = float(np.finfo(np.float32).max)
E8M0_NAN = 0xFF


def bits32(v: Any) -> np.ndarray:
    return np.asarray(v, np.float32).view(np.uint32)


def assert_scales_equal(got: np.ndarray, want: np.ndarray, amax: np.ndarray, what: str) -> None:
    """Scale codes equal; on failure report the first differing block's amax (value and bits)."""
    got, want = np.asarray(got, np.int64), np.asarray(want, np.int64)
    assert got.shape == want.shape, f"{what}: scales shape {got.shape} != {want.shape}"
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    if bad.size:
        i = int(bad[0])
        a = np.asarray(amax, np.float32).reshape(-1)[i]
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} scale codes differ; first at block {i}: amax {float(a)!r} "
            f"(0x{int(bits32(a)):08X}): got 0x{got.reshape(-1)[i]:02X}, want 0x{want.reshape(-1)[i]:02X}"
        )


# -- inputs ---------------------------------------------------------------------------------


def directed_amaxes() -> np.ndarray:
    """Block amaxes at the rules' decision points: powers of two and their neighbours, every
    element max times 2^k and its neighbours (RCEIL's d = 2^k, where torchao's float32 log2 rounds),
    1.5 * 2^k (nearest ties), EVEN's carry points, the fp32 subnormal range and the top."""
    vals: list[float] = [0.0, 2.0**-149, 2.0**-127, 1.5 * 2.0**-127, 2.0**-126, FLT_MAX]
    for k in range(-140, 128, 3):
        vals += [2.0**k, 1.5 * 2.0**k, 1.9375 * 2.0**k, 1.75 * 2.0**k]
    for m in (448.0, 57344.0, 7.5, 28.0, 6.0):
        for k in (-130, -127, -126, -120, -60, -10, -4, -1, 0, 1, 3, 4, 10, 64, 100, 110):
            vals.append(m * 2.0**k)
    v = np.array([x for x in vals if x <= FLT_MAX], np.float32)
    b = v.view(np.uint32).astype(np.int64)
    nb = np.concatenate([b, b + 1, b + 2, b + 11, b + 12, b + 23, b - 1, b - 2])
    nb = nb[(nb >= 0) & (nb < 0x7F800000)]
    return np.unique(nb).astype(np.uint32).view(np.float32)


@cache
def mx_inputs() -> dict[str, np.ndarray]:
    """2-D float32 inputs whose last dim is a multiple of 32 (one block per 32 elements)."""
    rng = np.random.default_rng(20261129)
    normal = rng.standard_normal((32, 256)).astype(np.float32)
    heavy = rng.standard_t(1.5, (64, 256)) * np.exp2(rng.integers(-150, 120, (64, 8)).repeat(32, axis=1))
    heavy = np.clip(heavy, -FLT_MAX, FLT_MAX).astype(np.float32)
    lognormal = np.clip(rng.lognormal(0.0, 20.0, (16, 128)), 0, FLT_MAX) * rng.choice([-1, 1], (16, 128))
    lognormal = lognormal.astype(np.float32)
    special = rng.standard_normal((24, 64)).astype(np.float32)
    special[0, :32] = 0.0  # zero block
    special[1, :32] = -0.0
    special[2, :32] = rng.standard_normal(32).astype(np.float32) * np.float32(2.0**-140)  # subnormal amax
    special[3, :32] = np.float32(2.0**-149) * rng.integers(-(1 << 22), 1 << 22, 32)
    special[4, 5] = np.inf  # Inf amax
    special[5, 7] = -np.inf
    special[6, 0] = np.nan  # NaN amax
    special[7, 3] = -np.nan
    special[8, [1, 9]] = [np.inf, np.nan]
    special[9, :32] = np.nan  # all-NaN block
    special[10, :32] = np.inf
    special[11, 0] = FLT_MAX  # EVEN carries into exponent 255
    special[12, 2] = -3.0e38
    special[13, :3] = [np.inf, -3.0e38, 2.0**100]  # Inf amax with big finite neighbours
    nan_bits = special[14].view(np.uint32)
    nan_bits[[0, 33]] = [0x7FFFFFFF, 0xFFC12345]  # NaN payloads
    nan_bits[[34, 40]] = [0x7F800001, 0xFFE00000]
    amax = directed_amaxes()
    amax = np.resize(amax, (amax.size + 31) // 32 * 32)
    directed = np.zeros((amax.size, 32), np.float32)
    directed[:, 0] = amax
    directed[:, 1] = -amax / np.float32(3)
    directed[:, 2] = amax * np.float32(0.51)
    return {
        "normal": normal,
        "heavy_tailed": heavy,
        "lognormal": lognormal,
        "special": special,
        "directed": directed.reshape(-1, 64),
    }


# -- torchao oracle -------------------------------------------------------------------------


def torchao_to_mx(x: np.ndarray, elem: str, rule: str, torch_dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """(scale codes, unpacked element codes) from torchao ``to_mx``."""
    torch = require("torch")
    mx_tensor = require("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    elem_dtype = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "e2m3": "fp6_e2m3",
        "e3m2": "fp6_e3m2",
        "e2m1": torch.float4_e2m1fn_x2,
    }[elem]
    t = torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, torch_dtype))
    scale, data = mx_tensor.to_mx(t, elem_dtype, 32, ScaleCalculationMode(rule))
    scale = scale.view(torch.uint8).numpy()
    codes = data.view(torch.uint8)
    if elem == "e2m1":  # packed two per byte, element 2i in the low nibble
        codes = torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(*codes.shape[:-1], -1)
    return scale, codes.numpy()


def test_torchao_to_mx_signature_is_the_one_emulated() -> None:
    require("torch")
    mx_tensor = require("torchao.prototype.mx_formats.mx_tensor")
    import inspect

    params = list(inspect.signature(mx_tensor.to_mx).parameters)
    assert params[:4] == ["data_hp", "elem_dtype", "block_size", "scaling_mode"]


@pytest.mark.parametrize("rule", TORCHAO_RULES)
@pytest.mark.parametrize("elem", ELEMS)
def test_torchao_flavor_matches_to_mx_bit_for_bit(elem: str, rule: str) -> None:
    for name, x in mx_inputs().items():
        want_s, want_c = torchao_to_mx(x, elem, rule)
        q = quantize_mx(x, elem, scale_rule=rule, flavor="torchao")
        amax = np.abs(x).reshape(x.shape[0], -1, 32).max(axis=-1)
        assert_scales_equal(q.scales, want_s, amax, f"{name} {elem} {rule}")
        assert_codes_equal(q.codes, want_c, elem, x, f"{name} {rule}")


@pytest.mark.parametrize("elem", ("e4m3", "e2m1"))
def test_torchao_flavor_matches_to_mx_on_bfloat16_input(elem: str) -> None:
    x = mx_inputs()["heavy_tailed"].astype(ml_dtypes.bfloat16)
    for rule in TORCHAO_RULES:
        want_s, want_c = torchao_to_mx(x.astype(np.float32), elem, rule, torch_dtype="bfloat16")
        q = quantize_mx(x, elem, scale_rule=rule)
        assert q.dtype == "bfloat16"
        amax = np.abs(x.astype(np.float32)).reshape(x.shape[0], -1, 32).max(axis=-1)
        assert_scales_equal(q.scales, want_s, amax, f"bf16 {elem} {rule}")
        assert_codes_equal(q.codes, want_c, elem, x.astype(np.float32), f"bf16 {rule}")


def test_torchao_edge_blocks_as_measured() -> None:
    """torchao 0.18 (measured against to_mx above; spec 3 'Edge cases' says 0xFF for every rule, which
    holds for NaN only): an Inf amax under FLOOR is exponent 255 in the arithmetic, E4M3 code
    255 - 8 = 247, and the Inf element saturates; a NaN amax gives 0xFF and finite elements +-0."""
    x = np.zeros((3, 32), np.float32)
    x[0, :2] = [np.inf, 1.0]
    x[1, :3] = [np.nan, 3.0, -2.0]
    x[2, 0] = np.inf
    q = quantize_mx(x, "e4m3")
    assert q.scales[:, 0].tolist() == [247, E8M0_NAN, 247]
    assert q.codes[0, :2].tolist() == [0x7E, 0x00]
    assert q.codes[1, 1:3].tolist() == [0x00, 0x80] and q.codes[1, 0] & 0x7F == 0x7F
    r = quantize_mx(x, "e4m3", scale_rule="rceil")
    assert r.scales[:, 0].tolist() == [0xFE, E8M0_NAN, 0xFE]
    assert np.isnan(q.dequantize()[1]).all()


def test_torchao_rceil_uses_float32_log2_not_the_bit_rule() -> None:
    """torchao's eager RCEIL is ceil(log2(fl32(amax/448))) with float32 log2; just above 448 * 2^10,
    d = 2^10 (1 + 2^-23) and log2(d) rounds to 10 exactly, so torchao keeps 2^10 where the NVIDIA
    bit rule (spec 3) takes 2^11."""
    amax = np.nextafter(np.float32(448 * 2.0**10), np.float32(np.inf))
    assert int(e8m0_scale_codes(amax, "e4m3", "rceil", flavor="ocp")) == 127 + 11
    assert int(e8m0_scale_codes(amax, "e4m3", "rceil", flavor="torchao")) == 127 + 10
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = amax
    assert quantize_mx(x, scale_rule="rceil").scales[0, 0] == 127 + 10
    assert quantize_mx(x, scale_rule="rceil", flavor="te").scales[0, 0] == 127 + 11


# -- scale rules: independent reference (spec 3) --------------------------------------------


def ref_scale_code(amax: float, elem: str, rule: str) -> int:
    """Spec 3 rule of one amax (flavor 'ocp'), by exact arithmetic."""
    fmt = fp8sim.get_format(elem)
    emax, mbits, mx = fmt.emax, fmt.mbits, Fraction(fmt.max)
    if math.isnan(amax):
        return 0xFF
    if math.isinf(amax):
        return 0xFE if rule == "rceil" else 0xFF
    if amax == 0:
        return 0
    a = Fraction(amax)
    fexp = max(math.frexp(amax)[1] - 1, -126)  # float32 exponent (subnormals: -126 with F = 0)
    if rule in ("floor", "ceil", "even"):
        biased = fexp + 127 if amax >= 2.0**-126 else 0
        if rule == "ceil" and a != Fraction(2) ** fexp:
            biased += 1
        if rule == "even" and amax >= 2.0**-126 and a / Fraction(2) ** fexp >= 2 - Fraction(1, 2 ** (mbits + 1)):
            biased += 1
        if rule == "even" and amax < 2.0**-126 and a >= Fraction(2) ** -126 * (1 - Fraction(1, 2 ** (mbits + 1))):
            biased = 1  # a subnormal amax rounds up into the smallest normal binade
        return min(max(biased - 127 - emax, -127), 127) + 127
    if rule == "rceil":
        d = float(np.float32(amax) * np.float32(1.0 / fmt.max))
        if d == 0:
            return 0
        if d < 2.0**-126:
            return int(Fraction(d) > Fraction(2) ** -127)
        k = math.frexp(d)[1] - 1
        return min(k + 127 + (Fraction(d) != Fraction(2) ** k), 254)
    # nearest: torch's own E8M0 cast of fl32(amax / max)
    torch = require("torch")
    d = float(np.float32(a / mx))
    return int(torch.tensor(d, dtype=torch.float32).to(torch.float8_e8m0fnu).view(torch.uint8))


@pytest.mark.parametrize("rule", SCALE_RULES)
@pytest.mark.parametrize("elem", ELEMS)
def test_e8m0_scale_codes_match_exact_reference(elem: str, rule: str) -> None:
    rng = np.random.default_rng(7)
    rand = rng.integers(0, 0x7F800000, 300, dtype=np.uint32).view(np.float32)
    amax = np.concatenate([directed_amaxes(), rand, np.float32([np.inf, np.nan])])
    if rule == "nearest":
        amax = amax[::4]  # the torch oracle is a per-element call
    got = e8m0_scale_codes(amax, elem, rule)
    want = np.array([ref_scale_code(float(a), elem, rule) for a in amax])
    assert_scales_equal(got, want, amax, f"{elem} {rule}")


# spec 3 (E4M3, emax 8, max 448; E2M1 emax 2, mbits 1), by hand: amax -> code per rule
E4M3_TABLE = [  # amax, floor, ceil, even, rceil, nearest
    (448.0, 127, 128, 127, 127, 127),  # spec 3 example: FLOOR and RCEIL 2^0, CEIL 2^1
    (256.0, 127, 127, 127, 127, 126),  # d = 0.571: nearest rounds down to 2^-1
    (257.0, 127, 128, 127, 127, 126),
    (300.0, 127, 128, 127, 127, 126),  # 0.67 < 0.75
    (480.0, 127, 128, 127, 128, 127),  # significand 1.875 < 1.9375: EVEN keeps
    (496.0, 127, 128, 128, 128, 127),  # 1.9375: EVEN carries
    (671.0, 128, 129, 128, 128, 127),
    (672.0, 128, 129, 128, 128, 128),  # d = 1.5: nearest ties up
    (1.0, 119, 119, 119, 119, 118),
    (0.0, 0, 0, 0, 0, 0),  # zero block
    (2.0**-126, 0, 0, 0, 0, 0),  # clamps to 2^-127
    (448 * 2.0**-127, 0, 1, 0, 0, 0),  # F = 8: FLOOR -127; RCEIL: d = 2^-127 (mantissa 0x400000)
    (448 * 1.5 * 2.0**-127, 1, 2, 1, 1, 1),  # RCEIL: subnormal d, mantissa 0x600000 > 0x400000
    (FLT_MAX, 246, 247, 247, 247, 246),  # EVEN/CEIL: exponent 255 is a carry, not Inf
    (math.inf, 0xFF, 0xFF, 0xFF, 0xFE, 0xFF),  # RCEIL caps at 0xFE (TE)
    (math.nan, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF),
]


@pytest.mark.parametrize("row", E4M3_TABLE, ids=lambda r: repr(r[0]))
def test_e8m0_scale_codes_e4m3_spec_table(row: tuple) -> None:
    amax, *want = row
    got = [int(e8m0_scale_codes(np.float32(amax), "e4m3", rule)) for rule in SCALE_RULES]
    assert got == want, f"amax {amax}: rules {SCALE_RULES}"


def test_e8m0_scale_codes_even_uses_the_element_mantissa_width() -> None:
    """spec 3 EVEN: amax + 2^(22 - mbits), mantissa cleared.  E2M1 (mbits 1): 6 = 1.5 * 4 keeps
    2^(2-2), 7 = 1.75 * 4 carries; FLOOR takes 2^0 for both."""
    got = e8m0_scale_codes(np.float32([6.0, 7.0]), "e2m1", "even")
    assert got.tolist() == [127, 128]
    assert e8m0_scale_codes(np.float32([6.0, 7.0]), "e2m1", "floor").tolist() == [127, 127]


def test_e8m0_scale_codes_flavors_on_non_finite_amax() -> None:
    amax = np.float32([np.inf, np.nan, 1.0])
    assert e8m0_scale_codes(amax, "e4m3", "floor").tolist() == [0xFF, 0xFF, 119]
    assert e8m0_scale_codes(amax, "e4m3", "floor", flavor="torchao").tolist() == [247, 0xFF, 119]
    assert e8m0_scale_codes(amax, "e5m2", "ceil", flavor="torchao").tolist() == [240, 0xFF, 112]
    assert e8m0_scale_codes(amax, "e4m3", "rceil", flavor="te").tolist() == [0xFE, 0xFF, 119]
    assert e8m0_scale_codes(amax, "e4m3", "rceil", flavor="torchao").tolist() == [0xFE, 0xFF, 119]


# -- TE flavor (spec 5.2) ------------------------------------------------------------------


def ref_te_block(block: np.ndarray, fmt: fp8sim.FloatFormat, rcp: np.float32) -> tuple[int, np.ndarray]:
    """spec 5.2 for one block, by hand: NaN-skipping amax, RCEIL, x * 2^(127-e), clamp, ml_dtypes RN."""
    finite_or_inf = block[~np.isnan(block)]
    amax = np.float32(np.max(np.abs(finite_or_inf), initial=np.float32(0)))
    if np.isinf(amax):
        e = 0xFE
    else:
        d = float(np.float32(amax * rcp))
        if d == 0:
            e = 0
        elif d < 2.0**-126:
            e = int(Fraction(d) > Fraction(2) ** -127)
        else:
            k = math.frexp(d)[1] - 1
            e = min(k + 127 + (Fraction(d) != Fraction(2) ** k), 254)
    r = np.float32(math.ldexp(1.0, 127 - e))
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.clip(block * r, -fmt.max, fmt.max)
    return e, y.astype(fmt.ml_dtype).view(np.uint8)


@pytest.mark.parametrize("elem", ("e4m3", "e5m2"))
def test_te_flavor_matches_scalar_reference(elem: str) -> None:
    fmt = fp8sim.get_format(elem)
    rcp = np.float32(1.0 / fmt.max)
    for name in ("heavy_tailed", "special", "directed"):
        x = mx_inputs()[name]
        q = quantize_mx(x, elem, scale_rule="rceil", flavor="te")
        blocks = x.reshape(-1, 32)
        ref = [ref_te_block(b, fmt, rcp) for b in blocks]
        want_s = np.array([e for e, _ in ref]).reshape(q.scales.shape)
        want_c = np.stack([c for _, c in ref]).reshape(x.shape)
        assert_scales_equal(q.scales, want_s, x.reshape(q.scales.shape + (32,))[..., 0], f"te {name} {elem}")
        assert_codes_equal(q.codes, want_c, elem, x, f"te {name}")


def test_te_spec_cases() -> None:
    """spec 3 'Element cast' / 'Edge cases' and 5.2, by hand (E4M3)."""
    x = np.zeros((5, 32), np.float32)
    x[0, :2] = [448.0, 1.0]  # amax 448: RCEIL 2^0
    x[1, :3] = [np.inf, -1000.0, 2.0]  # Inf amax: 0xFE, Inf -> max, others flush
    x[2, :3] = [np.nan, 448.0, -1.0]  # NaN element: skipped by fmaxf, only it is NaN
    x[4, :2] = [-np.inf, np.nan]
    q = quantize_mx(x, scale_rule="rceil", flavor="te")
    assert q.scales[:, 0].tolist() == [127, 0xFE, 127, 0, 0xFE]  # row 3: zero block -> 0x00
    assert q.codes[0, :2].tolist() == [0x7E, 0x38]
    assert q.codes[1, :3].tolist() == [0x7E, 0x80, 0x00]
    assert q.codes[2, 0] & 0x7F == 0x7F and q.codes[2, 1:3].tolist() == [0x7E, 0xB8]
    assert (q.codes[3] == 0).all()
    assert q.codes[4, 0] == 0xFE and q.codes[4, 1] & 0x7F == 0x7F
    deq = q.dequantize()
    assert deq[0, 0] == 448.0 and deq[2, 1] == 448.0 and np.isnan(deq[2, 0]) and np.isnan(deq[2, 1:]).sum() == 0
    t = quantize_mx(x, scale_rule="floor")  # torchao on the same data: the NaN poisons the block
    assert t.scales[2, 0] == E8M0_NAN and t.scales[0, 0] == 127
    assert quantize_mx(x, scale_rule="ceil").scales[0, 0] == 128


def test_te_zero_block_uses_2_to_127_multiplier() -> None:
    """Code 0x00 multiplies by exactly 2^127 in TE (spec 2.4 'Decoding'); torchao by 2^126 (FLOOR,
    its scale is clamped to >= 2^-126) or 1.0 (RCEIL)."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = np.float32(448 * 2.0**-127)  # d = 2^-127 -> code 0x00
    te = quantize_mx(x, scale_rule="rceil", flavor="te")
    assert te.scales[0, 0] == 0 and te.codes[0, 0] == 0x7E  # 448
    assert quantize_mx(x, scale_rule="floor").codes[0, 0] == 0x76  # 224
    assert quantize_mx(x, scale_rule="rceil").codes[0, 0] == 0x00


def test_mxfma_constants_are_the_spec_bit_patterns() -> None:
    """spec 5.2: bf16 0x3B12 / 0x3792, fp16 0x1892 / 0x0125 for E4M3 / E5M2."""
    from fp8sim.scaling.mx import _mxfma_constant

    def half_bits(v: np.float32, dt: Any) -> int:
        return int(np.array(v).astype(dt).view(np.uint16))

    assert half_bits(_mxfma_constant(fp8sim.E4M3, "bfloat16"), ml_dtypes.bfloat16) == 0x3B12
    assert half_bits(_mxfma_constant(fp8sim.E5M2, "bfloat16"), ml_dtypes.bfloat16) == 0x3792
    assert half_bits(_mxfma_constant(fp8sim.E4M3, "float16"), np.float16) == 0x1892
    assert half_bits(_mxfma_constant(fp8sim.E5M2, "float16"), np.float16) == 0x0125


def test_mxfma_changes_only_fp16_to_e5m2() -> None:
    """spec 5.2: with _ENABLE_MXFMA, fp16 amax 57312 -> E5M2 code 128 instead of 127."""
    x = np.zeros((1, 32), np.float16)
    x[0, 0] = 57312.0
    kw = dict(scale_rule="rceil", flavor="te")
    assert quantize_mx(x, "e5m2", **kw).scales[0, 0] == 127
    assert quantize_mx(x, "e5m2", mxfma=True, **kw).scales[0, 0] == 128
    assert int(e8m0_scale_codes(np.float16(57312), "e5m2", "rceil", flavor="te", mxfma_dtype="float16")) == 128
    xb = x.astype(ml_dtypes.bfloat16)
    assert quantize_mx(xb, "e5m2", mxfma=True, **kw).scales[0, 0] == quantize_mx(xb, "e5m2", **kw).scales[0, 0]
    assert quantize_mx(x.astype(np.float32), "e5m2", mxfma=True, **kw).scales[0, 0] == 127  # fp32: generic kernel
    # exhaustively over positive finite fp16 / bf16 amaxes, only fp16 -> E5M2 differs
    h = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16)
    b = np.arange(1, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16)
    for elem in ("e4m3", "e5m2"):
        for amax, dt in ((h, "float16"), (b, "bfloat16")):
            plain = e8m0_scale_codes(amax, elem, "rceil", flavor="te")
            fma = e8m0_scale_codes(amax, elem, "rceil", flavor="te", mxfma_dtype=dt)
            differs = int((plain != fma).sum())
            assert (differs > 0) == (elem == "e5m2" and dt == "float16"), f"{elem} {dt}: {differs} differ"


# -- round trips, layouts, inputs ------------------------------------------------------------


ROUND_TRIP_CASES = [(e, "floor", "torchao") for e in ELEMS] + [(e, "rceil", "torchao") for e in ELEMS]
ROUND_TRIP_CASES += [(e, "rceil", "te") for e in ("e4m3", "e5m2")]  # TE MXFP8 has FP8 elements only


@pytest.mark.parametrize(("elem", "rule", "flavor"), ROUND_TRIP_CASES)
def test_dequantize_round_trip_of_representable_blocks(elem: str, rule: str, flavor: str) -> None:
    """Blocks v * 2^k with v on the element grid and one |v| = max: the scale is 2^k and
    dequantize gives x back exactly."""
    fmt = fp8sim.get_format(elem)
    rng = np.random.default_rng(11)
    grid = np.array([fmt.code_value(c) for c in range(fmt.num_codes)])
    grid = grid[np.isfinite(grid)]
    v = rng.choice(grid, (40, 64))
    v[:, ::32] = fmt.max * rng.choice([-1, 1], (40, 2))
    k = rng.integers(-100, 100, (40, 2)).repeat(32, axis=1)
    x = (v * np.exp2(k)).astype(np.float32)
    assert np.array_equal(x.astype(np.float64), v * np.exp2(k))
    q = quantize_mx(x, elem, scale_rule=rule, flavor=flavor)
    assert np.array_equal(q.scales.astype(np.int64), k[:, ::32] + 127)
    assert np.array_equal(q.dequantize().view(np.uint32), x.view(np.uint32))


def test_rowwise_and_columnwise_both_come_from_the_high_precision_input() -> None:
    """spec 5.2: a row with one huge element flushes its small neighbours in the rowwise copy;
    the columnwise copy, taken from x (not from the rowwise codes), keeps them."""
    x = np.full((32, 64), 1.3, np.float32)
    x[0, 0] = 448.0 * 2.0**12
    for flavor, rule in (("torchao", "floor"), ("te", "rceil")):
        row, col = quantize_mx_rowwise_columnwise(x, "e4m3", scale_rule=rule, flavor=flavor)
        assert row.block == (1, 32) and col.block == (32, 1)
        assert row.scales.shape == (32, 2) and col.scales.shape == (1, 64)
        assert row.dequantize()[0, 1] == 0.0
        assert col.dequantize()[0, 1] == np.float32(1.3).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        from_row = quantize_mx(row.dequantize(), axis=0, scale_rule=rule, flavor=flavor)
        assert not np.array_equal(from_row.codes, col.codes)
        same = quantize_mx(x.T.copy(), scale_rule=rule, flavor=flavor)
        assert np.array_equal(col.codes, same.codes.T) and np.array_equal(col.scales, same.scales.T)


def test_any_axis_of_an_nd_input_equals_moving_it_last() -> None:
    x = mx_inputs()["special"].reshape(4, 6, 64).transpose(0, 2, 1).copy()  # (4, 64, 6)
    for rule, flavor in (("floor", "torchao"), ("even", "torchao"), ("rceil", "te")):
        q = quantize_mx(x, "e5m2", axis=1, scale_rule=rule, flavor=flavor)
        ref = quantize_mx(np.moveaxis(x, 1, -1).copy(), "e5m2", scale_rule=rule, flavor=flavor)
        assert q.block == (1, 32, 1) and q.scales.shape == (4, 2, 6) and q.shape == x.shape
        assert np.array_equal(q.codes, np.moveaxis(ref.codes, -1, 1))
        assert np.array_equal(q.scales, np.moveaxis(ref.scales, -1, 1))
    big = np.random.default_rng(2).standard_normal((64, 9000)).astype(np.float32)  # chunked along columns
    q = quantize_mx(big, axis=0, block_size=16)
    ref = quantize_mx(big.T.copy(), block_size=16)
    assert np.array_equal(q.codes, ref.codes.T) and np.array_equal(q.scales, ref.scales.T)


def test_torchao_refuses_and_te_pads_a_partial_block() -> None:
    x = np.random.default_rng(3).standard_normal((4, 40)).astype(np.float32)
    with pytest.raises(ValueError, match=r"dimension 1 of shape \(4, 40\) has size 40.*divisible by block_size 32"):
        quantize_mx(x)
    with pytest.raises(ValueError, match="pad=True"):
        quantize_mx(x, flavor="torchao", pad=False)
    zero_padded = np.concatenate([x, np.zeros((4, 24), np.float32)], axis=1)
    for kw in (dict(pad=True), dict(flavor="te", scale_rule="rceil")):
        q = quantize_mx(x, **kw)
        ref = quantize_mx(zero_padded, **{**kw, "pad": False})
        assert q.shape == (4, 40) and q.padded_shape == (4, 64)
        assert np.array_equal(q.codes, ref.codes) and np.array_equal(q.scales, ref.scales)
        assert np.array_equal(q.dequantize(), ref.dequantize()[:, :40])
    with pytest.raises(ValueError, match="dimension 0"):
        quantize_mx(x.T.copy(), axis=0)
    assert quantize_mx(x.T.copy(), axis=0, pad=True).scales.shape == (2, 4)


def test_input_kinds_convert_exactly() -> None:
    x = mx_inputs()["heavy_tailed"][:8]
    xb = x.astype(ml_dtypes.bfloat16)
    xh = np.clip(x, -60000, 60000).astype(np.float16)
    for arr, name in ((xb, "bfloat16"), (xh, "float16"), (x, "float32"), (x.astype(np.float64), "float64")):
        q = quantize_mx(arr, "e3m2", scale_rule="even")
        ref = quantize_mx(arr.astype(np.float32), "e3m2", scale_rule="even")
        assert q.dtype == name and np.array_equal(q.codes, ref.codes) and np.array_equal(q.scales, ref.scales)
    torch = require("torch")
    for arr, dt in ((xb, torch.bfloat16), (x, torch.float32), (xh, torch.float16)):
        t = torch.from_numpy(arr.astype(np.float32)).to(dt)
        q = quantize_mx(t, "e4m3")
        ref = quantize_mx(arr.astype(np.float32), "e4m3")
        assert q.dtype == str(dt).removeprefix("torch.") and np.array_equal(q.codes, ref.codes)
    assert quantize_mx(torch.from_numpy(x).t(), "e4m3", axis=0).codes.shape == (256, 8)  # non-contiguous view


BAD_CALLS = [
    (dict(scale_rule="round"), ValueError, "unknown scale_rule 'round'; known: floor, ceil, even, rceil, nearest"),
    (dict(flavor="cuda"), ValueError, "unknown flavor 'cuda'; known: torchao, te"),
    (dict(elem_format="e4m4"), ValueError, "unknown format 'e4m4'"),
    (dict(elem_format="e4m3fnuz"), ValueError, "not an MX element format; MX element formats: e4m3, e5m2"),
    (dict(block_size=0), ValueError, r"block_size must be an int in \[1, 65536\] \(MX uses 32\), got 0"),
    (dict(block_size=-32), ValueError, r"block_size must be an int in \[1, 65536\]"),
    (dict(block_size=32.0), TypeError, "block_size must be an int, got float"),
    (dict(block_size=True), TypeError, "block_size must be an int, got True"),
    (dict(axis=2), ValueError, r"axis 2 is out of range for a 2-d input; allowed: -2..1"),
    (dict(axis=-3), ValueError, "out of range"),
    (dict(axis=0.0), TypeError, "axis must be an int"),
    (dict(flavor="te"), ValueError, "scale_rule='rceil' only; got 'floor'"),
    (dict(flavor="te", scale_rule="rceil", elem_format="e2m1"), ValueError, "supports elem_format e4m3, e5m2"),
    (dict(mxfma=True), ValueError, "flavor='te'"),
    (dict(mxfma=1), TypeError, "mxfma must be True or False"),
    (dict(pad="yes"), TypeError, "pad must be True, False or None"),
]


@pytest.mark.parametrize(("kw", "exc", "msg"), BAD_CALLS, ids=lambda v: repr(v)[:40])
def test_bad_arguments_name_the_argument_and_allowed_values(kw: dict, exc: type, msg: str) -> None:
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(exc, match=msg):
        quantize_mx(x, **kw)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="dtype float32, bfloat16 or float16; got int64"):
        quantize_mx(np.zeros((2, 32), np.int64))
    with pytest.raises(TypeError, match="got bool"):
        quantize_mx(np.zeros((2, 32), bool))
    with pytest.raises(TypeError, match="must be a float array or tensor"):
        quantize_mx("1.0")
    with pytest.raises(ValueError, match="float32 cannot hold exactly"):
        quantize_mx(np.full((1, 32), 0.1))
    with pytest.raises(ValueError, match="out of range for a 0-d input"):
        quantize_mx(np.float32(1.0))
    with pytest.raises(ValueError, match="takes a 2-D tensor"):
        quantize_mx_rowwise_columnwise(np.zeros((2, 2, 32), np.float32))
    with pytest.raises(ValueError, match="unknown rule 'up'"):
        e8m0_scale_codes(np.float32(1.0), "e4m3", "up")
    with pytest.raises(ValueError, match="unknown flavor 'nv'; known: ocp, torchao, te"):
        e8m0_scale_codes(np.float32(1.0), "e4m3", "floor", flavor="nv")
    with pytest.raises(ValueError, match="mxfma_dtype must be None or one of bfloat16, float16"):
        e8m0_scale_codes(np.float32(1.0), "e4m3", "rceil", flavor="te", mxfma_dtype="float32")
    torch = require("torch")
    with pytest.raises(TypeError, match="got torch.int32"):
        quantize_mx(torch.zeros(2, 32, dtype=torch.int32))


def test_empty_and_result_metadata() -> None:
    q = quantize_mx(np.zeros((0, 64), np.float32), "e2m1")
    assert q.codes.shape == (0, 64) and q.scales.shape == (0, 2)
    q = quantize_mx(np.ones((3, 64), np.float32), "e2m1", block_size=16)
    assert q.fmt is fp8sim.E2M1 and q.scale_format is fp8sim.E8M0 and q.block == (1, 16)
    assert q.codes.dtype == np.uint8 and q.scales.dtype == np.uint8 and q.scales.shape == (3, 4)
    assert (q.dequantize() == 1.0).all()
