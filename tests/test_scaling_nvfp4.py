"""NVFP4 quantization (``docs/semantics.md`` 5.4 for TE, 6.3 for torchao).

Oracles, none of which share code with ``fp8sim.scaling.nvfp4``:

- ``te_oracle``: TE's reference semantics written from the spec 5.4 text in torch float32 ops.
  Its E4M3 cast is torch's ``.to(float8_e4m3fn)`` after a clamp to ±448, and its E2M1 cast is a
  ladder of comparisons built from the spec's tie list (ties go to the even code).
- ``rht_oracle``: the Hadamard matrix from ``H[i, j] = (-1)^popcount(i & j)`` (equal to Sylvester's
  construction), applied as TE's reference does: ``x.view(-1, 16) @ (D·H/4).to(x.dtype)``.
- torchao 0.18's own ``nvfp4_quantize`` / ``NVFP4Tensor.dequantize`` (skipped without torchao).

Comparisons are bit for bit; a failure names the first differing element, its input and both
codes in hex.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import fp8sim
from fp8sim.scaling import QuantizedData
from fp8sim.scaling.nvfp4 import (
    RHT_SIGNS,
    NVFP4QParams,
    apply_rht,
    dequantize_nvfp4,
    nvfp4_role_settings,
    quantize_nvfp4,
    quantize_nvfp4_role,
    rht_matrix,
)
from fp8sim.testing.oracles import require

torch = require("torch")

F32 = torch.float32
FLT_MAX = torch.tensor(torch.finfo(torch.float32).max)
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
SPEC_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # spec 5.4


# -- oracles ----------------------------------------------------------------------------------


def e2m1_ladder(v: torch.Tensor) -> torch.Tensor:
    """E2M1 RN codes from the spec 5.4 tie list: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4,
    5->4 (each tie goes to the even code); negatives get the sign bit, exact zeros +0 (TE's
    reference), so [-0.25, -0) gives -0 = 0x8."""
    a = v.abs()
    mag = (a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
    mag = mag + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int()
    return (mag + 8 * (v < 0).int()).to(torch.uint8)


def rht_oracle(x: torch.Tensor) -> torch.Tensor:
    i = torch.arange(16)
    parity = torch.tensor([[bin(int(a) & int(b)).count("1") % 2 for b in i] for a in i])
    h = 1.0 - 2.0 * parity.to(F32)
    m = torch.tensor(SPEC_SIGNS, dtype=F32)[:, None] * h * 0.25
    return (x.contiguous().view(-1, 16) @ m.to(x.dtype)).view(x.shape)


def te_oracle(x: torch.Tensor, tile=(1, 16), amax=None, kernel_zero_rule=True, row_scaled=False):
    """(scale codes, element codes, global decode scale) of TE NVFP4 for a 2-D tensor."""
    xf = x.float()
    m, n = xf.shape
    if amax is None:
        amax = xf.abs().amax(dim=1, keepdim=True) if row_scaled else xf.abs().max()
    amax = torch.as_tensor(amax, dtype=F32)
    s_enc = torch.minimum(torch.div(torch.tensor(2688.0), amax), FLT_MAX)
    one = (s_enc == 0) | (amax == 0) if kernel_zero_rule else (s_enc == 0)
    s_enc = torch.where(one, torch.tensor(1.0), s_enc)
    if tile == (1, 16):
        vec_max = xf.abs().view(m, n // 16, 16).amax(dim=-1)
    else:
        vec_max = xf.abs().view(m // 16, 16, n // 16, 16).amax(dim=(1, 3))
    mult = s_enc * torch.div(torch.tensor(1.0), torch.tensor(6.0))
    s_dec_b = torch.minimum(vec_max * mult, FLT_MAX)
    s8 = torch.clamp(s_dec_b, -448.0, 448.0).to(torch.float8_e4m3fn)
    s_dec = torch.div(torch.tensor(1.0), s_enc)
    enc = torch.minimum(torch.div(torch.tensor(1.0), s8.float() * s_dec), FLT_MAX)
    enc = enc.repeat_interleave(16, dim=-1)
    if tile == (16, 16):
        enc = enc.repeat_interleave(16, dim=0)
    v = torch.clamp(xf * enc, -6.0, 6.0)
    return s8.view(torch.uint8).numpy(), e2m1_ladder(v).numpy(), s_dec.numpy()


# -- helpers ----------------------------------------------------------------------------------


def assert_same(got, want, inputs, what: str) -> None:
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    if bad.size:
        i = int(bad[0])
        x = np.asarray(inputs, dtype=np.float64).reshape(-1)
        shown = f"input {x[i]!r}" if x.size == g.size else f"block/row {np.unravel_index(i, g.shape)}"
        raise AssertionError(
            f"{what}: {bad.size} of {g.size} differ; first at {np.unravel_index(i, g.shape)}, {shown}: "
            f"got 0x{int(g.reshape(-1)[i]):02X}, want 0x{int(w.reshape(-1)[i]):02X}"
        )


def assert_matches_oracle(q: QuantizedData, x: torch.Tensor, **oracle_kw) -> None:
    scales, codes, s_dec = te_oracle(x, **oracle_kw)
    xs = x.float().numpy()
    assert_same(q.scales, scales, xs, "E4M3 block scales")
    assert_same(q.codes, codes, xs, "E2M1 codes")
    g = np.asarray(q.global_scale, np.float32)
    assert np.array_equal(g.view(np.uint32), np.asarray(s_dec, np.float32).reshape(g.shape).view(np.uint32)), (
        f"global decode scale {g} != {s_dec}"
    )


def make(kind: str, shape=(32, 64), dtype=torch.bfloat16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(shape, generator=g)
    if kind == "random":
        x = r
    elif kind == "heavy":
        x = r * torch.exp(3.0 * torch.randn(shape, generator=g))
    elif kind == "zeros":
        x = torch.zeros(shape)
    elif kind == "tiny":
        x = r * (1e-38 if dtype == torch.float32 else 1e-36)
    elif kind == "huge":
        x = r * 3e37
    elif kind == "zero_blocks":
        x = r.clone()
        x.view(-1, 16)[::7] = 0.0
        x.view(-1, 64)[5] = 0.0
    else:
        raise ValueError(kind)
    return x.to(dtype)


KINDS = ("random", "heavy", "zeros", "tiny", "huge", "zero_blocks")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# -- TE flavour against the reference oracle --------------------------------------------------


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("tile", [(1, 16), (16, 16)], ids=["1x16", "16x16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_te_nvfp4_matches_reference_oracle_bit_for_bit(kind, dtype, tile, rht):
    x = make(kind, dtype=DTYPES[dtype])
    q = quantize_nvfp4(x, block_2d=tile == (16, 16), rht=rht)
    assert q.fmt == fp8sim.E2M1 and q.scale_format == fp8sim.E4M3 and q.block == tile
    assert q.shape == tuple(x.shape) and q.dtype == dtype.replace("bf16", "bfloat16").replace("fp32", "float32")
    assert_matches_oracle(q, rht_oracle(x) if rht else x, tile=tile)


@pytest.mark.parametrize("kind", KINDS)
def test_te_numpy_inputs_equal_torch_inputs(kind):
    import ml_dtypes

    x = make(kind)
    xn = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    for kw in ({}, {"rht": True}, {"block_2d": True}):
        a, b = quantize_nvfp4(x, **kw), quantize_nvfp4(xn, **kw)
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales), kw
        assert a.global_scale == b.global_scale and b.dtype == "bfloat16"
    f = quantize_nvfp4(x.float().numpy())
    assert_matches_oracle(f, x.float())


def test_te_zero_tensor_global_scale_kernel_vs_reference_rule():
    """Spec 5.4: the kernel maps global_amax == 0 to S_enc = 1; the Python reference keeps
    min(2688/0, FLT_MAX) = FLT_MAX.  Data are zero either way."""
    x = torch.zeros(16, 32)
    k = quantize_nvfp4(x)
    r = quantize_nvfp4(x, reference_zero_handling=True)
    assert k.global_scale == 1.0
    assert np.float32(r.global_scale) == np.float32(1) / np.finfo(np.float32).max
    assert_matches_oracle(r, x, kernel_zero_rule=False)
    for q in (k, r):
        assert not q.codes.any() and not q.scales.any()
        assert not q.dequantize().any()


def test_te_infinite_amax_gives_unit_global_scale():
    x = torch.randn(16, 32)
    x[3, 7] = float("inf")
    q = quantize_nvfp4(x)
    assert q.global_scale == 1.0  # S_enc = 2688/Inf = 0 -> 1 (both rules)
    assert q.scales.reshape(-1)[3 * 2] == 0x7E  # the Inf block saturates to 448


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
def test_te_row_scaled_uses_one_amax_per_row(dtype):
    x = make("heavy", shape=(16, 64), dtype=DTYPES[dtype])
    q = quantize_nvfp4(x, row_scaled=True)
    assert q.global_scale.shape == (16, 1)
    assert_matches_oracle(q, x, row_scaled=True)
    x3 = x.reshape(2, 8, 64)
    q3 = quantize_nvfp4(x3, row_scaled=True)
    assert q3.global_scale.shape == (2, 8, 1) and np.array_equal(q3.codes.reshape(16, 64), q.codes)


def test_te_given_global_amax_is_used_as_float32():
    x = make("random", dtype=torch.float32)
    amax = 2.0 * float(x.abs().max())
    assert_matches_oracle(quantize_nvfp4(x, global_amax=amax), x, amax=np.float32(amax))
    assert_matches_oracle(quantize_nvfp4(x, global_amax=torch.tensor(amax)), x, amax=np.float32(amax))


def test_te_3d_input_blocks_along_last_dim_and_tiles_over_last_two():
    x = make("heavy", shape=(2, 16, 64))
    q = quantize_nvfp4(x)
    assert q.block == (1, 1, 16) and q.scales.shape == (2, 16, 4)
    s, c, _ = te_oracle(x.reshape(32, 64))
    assert np.array_equal(q.scales.reshape(32, 4), s) and np.array_equal(q.codes.reshape(32, 64), c)
    q2 = quantize_nvfp4(x, block_2d=True)
    assert q2.block == (1, 16, 16) and q2.scales.shape == (2, 1, 4)
    s, c, _ = te_oracle(x.reshape(32, 64), tile=(16, 16))
    assert np.array_equal(q2.scales.reshape(2, 4), s) and np.array_equal(q2.codes.reshape(32, 64), c)


def test_e2m1_tie_cases_from_spec_5_4():
    """global_amax = 2688 gives S_enc = 1 and a block with amax 6 gets s_blk = 1 and enc = 1, so
    the block's values reach the E2M1 cast unchanged."""
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.1, -0.0, 0.0, -0.75, -5.0, -2.5, 0.3]
    want = [0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0x8, 0x0, 0x0, 0xA, 0xE, 0xC, 0x1]
    x = torch.tensor([vals] * 16, dtype=torch.float32)
    q = quantize_nvfp4(x, global_amax=2688.0)
    assert q.global_scale == 1.0 and (q.scales == 0x38).all()  # E4M3 1.0
    assert_same(q.codes[0], np.array(want, np.uint8), vals, "E2M1 ties")
    assert_same(e2m1_ladder(torch.tensor(vals)).numpy(), np.array(want, np.uint8), vals, "oracle ladder")


def hard_block_amaxes() -> torch.Tensor:
    """float32 block amaxes (just off 6 x an E4M3 midpoint) whose E4M3 scale differs between
    ``fl32(amax * fl32(1/6))`` and ``fl32(amax / 6)``: TE uses the first (spec 5.4), torchao on
    CPU the second (spec 6.3)."""
    v = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    base = ((v[:-1] + v[1:]) / 2 * 6).view(torch.int32)
    x = (base[:, None] + torch.arange(-8, 9, dtype=torch.int32)[None, :]).reshape(-1).view(F32)
    x = x[x > 0]
    mult = (x * torch.div(torch.tensor(1.0), torch.tensor(6.0))).to(torch.float8_e4m3fn).view(torch.uint8)
    div = torch.div(x, torch.tensor(6.0)).to(torch.float8_e4m3fn).view(torch.uint8)
    hard = x[mult != div]
    assert hard.numel() >= 8
    return hard


def _blocks_with_amax(amaxes: torch.Tensor) -> torch.Tensor:
    """A (16, 16 * len) float32 tensor whose row-0 block j has amax ``amaxes[j]``."""
    g = torch.Generator().manual_seed(4)
    x = torch.rand(16, amaxes.numel(), 16, generator=g) * 0.9 * amaxes[None, :, None]
    x[0, :, 3] = -amaxes
    return x.reshape(16, -1)


def test_te_block_scale_uses_reciprocal_multiply_on_hard_cases():
    x = _blocks_with_amax(hard_block_amaxes())
    q = quantize_nvfp4(x, global_amax=2688.0)  # S_enc = 1
    assert_matches_oracle(q, x, amax=2688.0)


def test_te_nan_input_is_skipped_by_amax_and_coded_zero():
    x = torch.randn(16, 32)
    x[2, 3] = float("nan")
    q = quantize_nvfp4(x)
    y = x.clone()
    y[2, 3] = 0.0
    r = quantize_nvfp4(y)
    assert q.global_scale == r.global_scale and np.array_equal(q.scales, r.scales)
    assert np.array_equal(q.codes, r.codes)  # the NaN element takes code 0, as in cast_to_fp4x2


# -- dequantization ---------------------------------------------------------------------------


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_te_dequantize_follows_dequantize_kernel(out):
    x = make("heavy", dtype=torch.float32)
    amax = x.abs().max()
    q = quantize_nvfp4(x)
    scales, codes, _ = te_oracle(x)
    final = (torch.from_numpy(scales).view(torch.float8_e4m3fn).float() * amax) * torch.tensor(1.0 / 2688.0, dtype=F32)
    want = E2M1_VALUES[torch.from_numpy(codes).long()] * final.repeat_interleave(16, dim=-1)
    want = want.to(getattr(torch, out)).float().numpy()
    got = dequantize_nvfp4(q, "te", global_amax=amax, out_dtype=out).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    exact = q.dequantize()  # rounded once from code * s_blk * fl32(1/S_enc): a different rule
    assert np.allclose(exact, dequantize_nvfp4(q, "te", global_amax=amax), rtol=2e-6, atol=0)


# -- torchao flavour --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchao_nvfp4():
    require("torchao")
    from torchao.prototype.mx_formats import nvfp4_tensor

    return nvfp4_tensor


@pytest.mark.parametrize("shape", [(32, 64), (2, 16, 32)], ids=["2d", "3d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("kind", KINDS)
def test_torchao_flavor_matches_nvfp4_quantize(torchao_nvfp4, kind, dtype, shape):
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    x = make(kind, shape=shape, dtype=DTYPES[dtype])
    pts = torchao_nvfp4.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    s, data = torchao_nvfp4.nvfp4_quantize(x, 16, pts)
    q = quantize_nvfp4(x, flavor="torchao")
    xs = x.float().numpy()
    assert_same(q.scales, s.view(torch.uint8).numpy().reshape(q.scales.shape), xs, "torchao E4M3 scales")
    assert_same(q.codes, unpack_uint4(data).numpy().reshape(q.codes.shape), xs, "torchao E2M1 codes")
    assert np.float32(q.global_scale).view(np.uint32) == pts.numpy().view(np.uint32)


def test_torchao_block_scale_divides_on_hard_cases(torchao_nvfp4):
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    x = _blocks_with_amax(hard_block_amaxes())
    pts = torchao_nvfp4.per_tensor_amax_to_scale(torch.tensor(2688.0))  # exactly 1
    s, data = torchao_nvfp4.nvfp4_quantize(x, 16, pts)
    q = quantize_nvfp4(x, flavor="torchao", global_amax=2688.0)
    assert_same(q.scales, s.view(torch.uint8).numpy(), x.numpy(), "torchao E4M3 scales (hard cases)")
    assert_same(q.codes, unpack_uint4(data).numpy(), x.numpy(), "torchao E2M1 codes (hard cases)")
    te = quantize_nvfp4(x, global_amax=2688.0)
    assert (te.scales != q.scales).any()  # the two rules really differ here


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_torchao_dequantize_matches_nvfp4tensor(torchao_nvfp4, out):
    x = make("heavy", dtype=torch.bfloat16)
    pts = torchao_nvfp4.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    t = torchao_nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
    want = t.dequantize(getattr(torch, out)).float().numpy()
    got = dequantize_nvfp4(quantize_nvfp4(x, flavor="torchao"), "torchao", out_dtype=out).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_torchao_zero_block_scale_is_clamped_to_2_pow_minus_6():
    x = make("zero_blocks", dtype=torch.float32)
    q = quantize_nvfp4(x, flavor="torchao")
    zero_blocks = (x.abs().view(32, 4, 16).amax(-1) == 0).numpy()
    assert zero_blocks.any() and (q.scales[zero_blocks] == 0x08).all()  # E4M3 2^-6


# -- random Hadamard transform ----------------------------------------------------------------


def test_rht_matrix_is_signed_sylvester_hadamard_over_4():
    m = rht_matrix()
    assert m.dtype == np.float32 and m.shape == (16, 16)
    assert set(np.unique(m)) == {np.float32(-0.25), np.float32(0.25)}
    h4 = 4.0 * m.astype(np.float64)
    assert np.array_equal(h4 @ h4.T, 16.0 * np.eye(16))  # orthogonal up to the scale
    parity = np.array([[bin(i & j).count("1") % 2 for j in range(16)] for i in range(16)])
    sylvester = 1.0 - 2.0 * parity
    assert list(h4[:, 0].astype(int)) == SPEC_SIGNS == list(RHT_SIGNS)  # H[:, 0] = 1: column 0 = signs
    assert np.array_equal(h4, np.array(SPEC_SIGNS)[:, None] * sylvester)


def _bf16_round_once(v: np.ndarray) -> np.ndarray:
    """float64 -> nearest bfloat16 (ties to even), one rounding, exact integer arithmetic."""
    m, e = np.frexp(v)  # v = m * 2^e, 0.5 <= |m| < 1
    sig = np.ldexp(np.abs(m), 8)
    lo = np.floor(sig)
    frac = sig - lo
    up = (frac > 0.5) | ((frac == 0.5) & (lo % 2 == 1))
    return np.sign(v) * np.ldexp(lo + up, e - 8)


def test_apply_rht_bf16_moderate_range_is_exact_sum_rounded_once():
    """Entries within [2^-4, 2^4): the float32 accumulation of 16 exact products is exact, so the
    bf16 result must be the exact dot product rounded once."""
    g = torch.Generator().manual_seed(1)
    mag = torch.exp2(torch.empty(64, 64).uniform_(-4, 4, generator=g))
    x = (mag * torch.sign(torch.randn(64, 64, generator=g))).to(torch.bfloat16)
    got = apply_rht(x)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    exact = x.double().numpy().reshape(-1, 16) @ rht_matrix().astype(np.float64)
    assert np.array_equal(got.double().numpy().reshape(-1, 16), _bf16_round_once(exact))


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
def test_apply_rht_is_te_reference_matmul_in_input_dtype(dtype):
    import ml_dtypes

    x = make("heavy", dtype=DTYPES[dtype])
    want = rht_oracle(x)
    got = apply_rht(x)
    assert got.dtype == x.dtype and torch.equal(
        got.view(torch.int16 if dtype == "bf16" else torch.int32),
        want.view(torch.int16 if dtype == "bf16" else torch.int32),
    )
    xn = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == "bf16" else x.numpy()
    gn = apply_rht(xn)
    assert isinstance(gn, np.ndarray) and gn.dtype == xn.dtype
    assert np.array_equal(gn.view(np.uint8), got.contiguous().view(torch.uint8).numpy())


def test_columnwise_global_amax_is_taken_after_rht():
    x = make("heavy", shape=(32, 64))
    c = quantize_nvfp4_role(x, "input")
    y = rht_oracle(x.t().contiguous())
    assert_matches_oracle(c.columnwise, y)
    assert c.columnwise.global_scale != quantize_nvfp4(x.t().contiguous()).global_scale


# -- stochastic rounding ----------------------------------------------------------------------


def _scaled_values(x: torch.Tensor) -> np.ndarray:
    """The clamped scaled values the E2M1 cast sees (oracle arithmetic)."""
    xf = x.float()
    s8, _, s_dec = te_oracle(x)
    enc = torch.minimum(
        1.0 / (torch.from_numpy(s8).view(torch.float8_e4m3fn).float() * torch.from_numpy(s_dec)), FLT_MAX
    )
    return torch.clamp(xf * enc.repeat_interleave(16, -1), -6.0, 6.0).numpy()


def test_stochastic_rounding_picks_a_grid_neighbour_and_keeps_scales():
    x = make("heavy", shape=(64, 64))
    rn = quantize_nvfp4(x)
    sr = quantize_nvfp4(x, stochastic=True, seed=7)
    assert np.array_equal(sr.scales, rn.scales) and sr.global_scale == rn.global_scale
    v = _scaled_values(x).astype(np.float64)
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = np.abs(v)
    lo = grid[np.searchsorted(grid, a, side="right") - 1]
    hi = grid[np.minimum(np.searchsorted(grid, a, side="left"), 7)]
    got = np.abs(fp8sim.decode(sr.codes, fp8sim.E2M1).astype(np.float64))
    ok = (got == lo) | (got == hi)
    assert ok.all(), f"{(~ok).sum()} codes are not a neighbour; first value {a[~ok][0]} -> {got[~ok][0]}"
    assert ((sr.codes >= 8) == (v < 0)).all()
    assert (sr.codes != rn.codes).any()


def test_stochastic_rounding_is_reproducible_by_seed():
    x = make("random", shape=(32, 64))
    a, b = quantize_nvfp4(x, stochastic=True, seed=11), quantize_nvfp4(x, stochastic=True, seed=11)
    c = quantize_nvfp4(x, stochastic=True, seed=12)
    assert np.array_equal(a.codes, b.codes) and not np.array_equal(a.codes, c.codes)


@pytest.mark.parametrize("value", [2.2, -0.3, 4.75, 0.1])
def test_stochastic_rounding_is_unbiased_in_mean(value):
    """Every block is [6, v, ..., v] with global_amax 2688, so enc = 1 and v reaches the cast
    unchanged; the mean of the decoded values must be v within 6 standard errors."""
    n_blocks = 4096
    x = torch.full((n_blocks, 16), value, dtype=torch.float32)
    x[:, 0] = 6.0
    q = quantize_nvfp4(x.reshape(256, 256), stochastic=True, seed=3, global_amax=2688.0)
    got = fp8sim.decode(q.codes, fp8sim.E2M1).reshape(n_blocks, 16)[:, 1:].astype(np.float64)
    grid = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = abs(value)
    lo, hi = grid[grid <= a][-1], grid[grid >= a][0]
    p = (a - lo) / (hi - lo)
    se = (hi - lo) * np.sqrt(p * (1 - p) / got.size)
    assert set(np.unique(np.abs(got))) <= {lo, hi}
    assert abs(got.mean() - np.float32(value)) < 6 * se, (got.mean(), value, se)


# -- role presets and the two copies ----------------------------------------------------------


def test_role_settings_follow_spec_table():
    assert nvfp4_role_settings("input") == NVFP4QParams(True, False, False)
    assert nvfp4_role_settings("weight") == NVFP4QParams(False, False, True)
    assert nvfp4_role_settings("grad") == NVFP4QParams(True, True, False)
    assert nvfp4_role_settings("grad", disable_rht=True, disable_stochastic_rounding=True) == NVFP4QParams()
    assert nvfp4_role_settings("weight", disable_2d_quantization=True) == NVFP4QParams()
    assert nvfp4_role_settings("input", disable_2d_quantization=True) == NVFP4QParams(True, False, False)


@pytest.mark.parametrize("role", ["input", "weight", "grad"])
def test_role_copies_are_both_quantized_from_the_input(role):
    x = make("heavy", shape=(2, 16, 64))
    c = quantize_nvfp4_role(x, role, seed=5 if role == "grad" else None)
    q = nvfp4_role_settings(role)
    tile = (16, 16) if q.fp4_2d_quantization else (1, 16)
    x2 = x.reshape(32, 64)
    xt = x2.t().contiguous()
    assert c.columnwise.shape == (64, 32) and c.rowwise.shape == (2, 16, 64)
    if role == "grad":
        assert np.array_equal(c.rowwise.codes, quantize_nvfp4(x, stochastic=True, seed=5).codes)
        assert np.array_equal(c.columnwise.codes, quantize_nvfp4(xt, rht=True, stochastic=True, seed=6).codes)
        assert_matches_oracle(quantize_nvfp4(x2), x2)  # scales/global come from the same rule
        s, _, g = te_oracle(rht_oracle(xt))
        assert np.array_equal(c.columnwise.scales, s) and np.float32(c.columnwise.global_scale) == g
        return
    s, codes, g = te_oracle(x2, tile=tile)
    assert np.array_equal(c.rowwise.scales.reshape(s.shape), s) and np.array_equal(
        c.rowwise.codes.reshape(32, 64), codes
    )
    assert_matches_oracle(c.columnwise, rht_oracle(xt) if q.random_hadamard_transform else xt, tile=tile)
    if role == "weight":  # 2-D tiles: the copies agree up to transposition
        assert np.array_equal(c.columnwise.codes, c.rowwise.codes.reshape(32, 64).T)
        assert np.array_equal(c.columnwise.scales, c.rowwise.scales.reshape(2, 4).T)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: quantize_nvfp4(torch.zeros(16, 32), flavor="mx"), ValueError, "unknown NVFP4 flavor 'mx'; known: te"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32, dtype=torch.float64)), TypeError, "float32, bfloat16, float16"),
        (lambda: quantize_nvfp4(np.zeros((16, 32), np.float16), flavor="torchao"), TypeError, "bfloat16"),
        (lambda: quantize_nvfp4([[0.0] * 32] * 16), TypeError, "numpy array or a torch tensor"),
        (lambda: quantize_nvfp4(torch.zeros(16, 40)), ValueError, "last dim 40 must be divisible by the NVFP4 block"),
        (lambda: quantize_nvfp4(torch.zeros(8, 32)), ValueError, "flattened first dim 8"),
        (lambda: quantize_nvfp4(torch.zeros(2, 8, 32), block_2d=True), ValueError, "dim -2 (8) must be divisible"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), flavor="torchao", rht=True), ValueError, "supports none of rht"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), seed=1), ValueError, "stochastic=True"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), block_2d=True, row_scaled=True), ValueError, "1x16"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), global_amax=-1.0), ValueError, "global_amax must be >= 0"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), global_amax=float("nan")), ValueError, "NaN not"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), global_amax=[1.0, 2.0]), ValueError, "single value"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), row_scaled=True, global_amax=[1.0]), ValueError, "per row (16)"),
        (lambda: quantize_nvfp4(torch.zeros(16, 32), rht=1), TypeError, "rht must be True or False"),
        (lambda: apply_rht(torch.zeros(4, 24)), ValueError, "Inner dimension 24 must be divisible by hadamard"),
        (lambda: nvfp4_role_settings("activation"), ValueError, "unknown NVFP4 role 'activation'; known: input"),
        (lambda: quantize_nvfp4_role(torch.zeros(16, 32), "input", seed=1), ValueError, "stochastic"),
        (lambda: quantize_nvfp4_role(torch.zeros(16, 32), 3), TypeError, "role must be one of"),
    ],
)
def test_bad_inputs_raise_with_actionable_message(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_dequantize_bad_arguments():
    q = quantize_nvfp4(torch.ones(16, 32))
    with pytest.raises(ValueError, match="pass global_amax="):
        dequantize_nvfp4(dataclasses.replace(q, global_amax=None), "te")
    with pytest.raises(ValueError, match="unknown out_dtype 'int8'"):
        dequantize_nvfp4(q, "torchao", out_dtype="int8")
    with pytest.raises(TypeError, match="NVFP4 QuantizedData"):
        dequantize_nvfp4("q")


def test_te_dequantize_uses_the_recorded_global_amax() -> None:
    x = np.random.default_rng(31).standard_normal((16, 32)).astype(np.float32) * 7
    q = quantize_nvfp4(x)
    assert q.global_amax == float(np.abs(x).max())
    assert np.array_equal(dequantize_nvfp4(q, "te"), dequantize_nvfp4(q, "te", global_amax=np.abs(x).max()))


def test_torchao_flavor_nan_elements_get_torchaos_codes() -> None:
    nv = require("torchao.prototype.mx_formats.nvfp4_tensor")
    for seed in range(12):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((2, 32)).astype(np.float32)
        x.reshape(-1)[rng.integers(0, 64, 3)] = [np.nan, -np.nan, np.uint32(0x7FC00123).view(np.float32)][seed % 3]
        for dt in (torch.float32, torch.bfloat16):
            t = torch.from_numpy(x).to(dt)
            ours = quantize_nvfp4(t, flavor="torchao", global_amax=5.0)
            s, d = nv.nvfp4_quantize(t, 16, nv.per_tensor_amax_to_scale(torch.tensor(5.0)))
            packed = d.view(torch.uint8).numpy()
            codes = np.stack([packed & 0xF, packed >> 4], -1).reshape(ours.codes.shape)
            assert np.array_equal(codes, ours.codes), (seed, dt)
            assert np.array_equal(s.view(torch.uint8).numpy().reshape(ours.scales.shape), ours.scales)
