"""TE's MXFP8 2D weight quantization (``fp8sim.scaling.mx.quantize_mx_2d_te``) against a reference written
here in torch from NVIDIA/TransformerEngine at d0067d0: ``common/cast/mxfp8/quantize_mxfp8.cuh`` lines 409-446
(``kIs2DBlockScaling``: one NaN-skipping ``fmaxf`` amax per 32x32 tile, then
``float_to_e8m0(amax_2d * max_norm_rcp)``); ``ptx::float_to_e8m0`` (``common/util/ptx_arch_spec.cuh`` lines
72-104: NaN 0xFF, Inf 0xFE, else the exponent rounded up when the mantissa is nonzero, not at 254, not for a
subnormal at most half an ulp; 0 for 0), as TE's ``tests/pytorch/test_mxfp8_2d_quantize.py`` ``float_to_e8m0``
also spells it; that file's ``quantize_mxfp8_2d_reference`` (zero padding to whole tiles, the tile's scale
repeated along the rowwise / columnwise scale axis).  The element cast is torch's own float8 conversion.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.formats import E4M3, E5M2
from fp8sim.scaling.mx import quantize_mx_2d_te
from fp8sim.testing.oracles import require

torch = require("torch")

_TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _e8m0_ceil_reference(amax: torch.Tensor, fmax: float) -> torch.Tensor:
    # the kernel multiplies by max_norm_rcp, the float32 constant 1/fmax (quantize_mxfp8.cuh line 441)
    val = amax.float() * torch.tensor(1.0 / fmax, dtype=torch.float32)
    bits = val.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    exponent = torch.where(val == 0, torch.zeros_like(exponent), exponent + up.to(torch.int32))
    # ptx_arch_spec.cuh lines 86-91: NaN -> 0xFF, Inf -> 0xFE before the bit rule
    exponent = torch.where(val.isinf(), torch.full_like(exponent, 0xFE), exponent)
    exponent = torch.where(val.isnan(), torch.full_like(exponent, 0xFF), exponent)
    return exponent.to(torch.uint8)


def _reference(x: np.ndarray, fmt_name: str, fmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes of the padded tensor, per-tile E8M0 codes)."""
    t = torch.from_numpy(x)
    rows, cols = t.shape
    t = torch.nn.functional.pad(t, (0, (-cols) % 32, 0, (-rows) % 32))
    pr, pc = t.shape
    mag = t.abs()
    mag = torch.where(mag.isnan(), torch.zeros_like(mag), mag)  # fmaxf from 0 skips NaN (lines 409-437)
    tiles = mag.view(pr // 32, 32, pc // 32, 32).amax(dim=(1, 3))
    e8m0 = _e8m0_ceil_reference(tiles, fmax)
    scale_inv = torch.pow(2.0, e8m0.float() - 127)
    full = scale_inv.repeat_interleave(32, 0).repeat_interleave(32, 1)
    # the kernel converts with cvt.rn.satfinite: clamp to +-max first (NaN stays NaN), then torch's RN cast
    codes = (t / full).clamp(-fmax, fmax).to(_TORCH_FP8[fmt_name]).view(torch.uint8)
    return codes, e8m0


def _weights(rows: int, cols: int) -> np.ndarray:
    """Random normal tiles at different magnitudes, a zero tile, tiles whose amax/fmax is subnormal (both
    sides of the half-ulp round-up rule) and tiles whose amax/fmax is a power of two (no round-up)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= np.exp2(rng.integers(-20, 20, (rows, 1))).astype(np.float32)
    tiles = [(r, c) for r in range(0, rows, 32) for c in range(0, cols, 32)]
    specials = [0.0, 448 * 2.0**-128, 448 * 2.0**-127 * 0.75, 448 * 2.0**-129, 448.0 * 4, 57344.0 * 2, 3.0]
    for (r, c), amax in zip(tiles, specials, strict=False):
        block = x[r : r + 32, c : c + 32]
        block *= np.float32(0.5 * amax) / max(np.abs(block).max(), np.float32(1e-30))
        block.flat[5] = -amax
    return x


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
@pytest.mark.parametrize("k_axis", [1, 0])
@pytest.mark.parametrize("shape", [(96, 160), (70, 45), (65, 130)])
def test_2d_quantization_equals_te_reference(fmt, k_axis: int, shape: tuple) -> None:  # noqa: ANN001
    x = _weights(*shape)
    q = quantize_mx_2d_te(x, fmt, k_axis)
    codes, e8m0 = _reference(x, fmt.name, fmt.max)
    rows, cols = shape
    pr, pc = -(-rows // 32) * 32, -(-cols // 32) * 32
    assert q.shape == shape and q.dtype == "float32" and q.fmt == fmt and q.scale_format.name == "e8m0"
    assert q.codes.shape == (pr, pc)
    np.testing.assert_array_equal(q.codes, codes.numpy())
    # one scale per tile, repeated along the other axis (TE's rowwise / columnwise scale layout)
    if k_axis == 1:
        assert q.block == (1, 32)
        want = e8m0.repeat_interleave(32, 0)
    else:
        assert q.block == (32, 1)
        want = e8m0.repeat_interleave(32, 1)
    np.testing.assert_array_equal(q.scales, want.numpy())
    got = q.dequantize()
    ref = (
        codes.view(_TORCH_FP8[fmt.name]).float()
        * torch.pow(2.0, e8m0.float() - 127).repeat_interleave(32, 0).repeat_interleave(32, 1)
    )[:rows, :cols]
    assert got.shape == shape
    np.testing.assert_array_equal(got.view(np.uint32), ref.numpy().view(np.uint32))


def test_e8m0_ceil_rule_edges() -> None:
    """The exponent rule tile by tile: exact powers of two keep their exponent, anything above rounds up,
    subnormal quotients round up only above half an ulp of the smallest normal, zero gives code 0."""
    fmax = 448.0
    rcp = np.float32(1.0 / fmax)
    quotients = np.array(
        [0.0, 1.0, 1.5, 2.0**-126, 2.0**-127, 2.0**-127 * 1.5, 2.0**-128, 3 * 2.0**-130, 2.0**100 * 1.25],
        np.float32,
    )
    amax = quotients / rcp  # amax * fl32(1/448) lands on (or next to) the quotient
    # quotients one ulp off the rule's edges: mantissa 1 above 1.0 (rounds up), subnormal mantissa 0x400001
    # (rounds up) and 0x400000 (does not)
    edges = np.array([0x3F800001, 0x00400001, 0x00400000], np.uint32)
    near = np.array([448.00003, 2.6331077e-36, 2.633107e-36], np.float32)
    assert ((near * rcp).astype(np.float32).view(np.uint32) == edges).all()
    amax = np.concatenate([amax, near])
    x = np.zeros((32, 32 * amax.size), np.float32)
    for i, a in enumerate(amax):
        x[3, 32 * i + 7] = a
    q = quantize_mx_2d_te(x, E4M3, 1)
    want = _e8m0_ceil_reference(torch.from_numpy(amax), fmax).numpy()
    np.testing.assert_array_equal(q.scales[0], want)
    assert q.scales[0, 0] == 0  # a zero tile
    assert q.scales[0, -3:].tolist() == [128, 1, 0]


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=lambda f: f.name)
def test_nonfinite_tiles_follow_te_nan_skipping_amax_and_inf_scale(fmt) -> None:  # noqa: ANN001
    """A NaN does not set its tile's scale (the kernel's amax is ``fmaxf``), an Inf gives scale code 0xFE (the
    Inf saturates to +-max, its neighbours flush), an all-NaN tile gets code 0 and NaN codes."""
    x = _weights(64, 96)
    clean_tile_code = _reference(x, fmt.name, fmt.max)[1][1, 1]
    x[40, 40] = np.nan  # tile (1, 1): the amax of the rest
    x[40, 70] = np.inf  # tile (1, 2)
    x[0:32, 32:64] = np.nan  # tile (0, 1): NaN only
    q = quantize_mx_2d_te(x, fmt, 1)
    codes, e8m0 = _reference(x, fmt.name, fmt.max)
    assert e8m0[1, 2] == 0xFE and e8m0[0, 1] == 0 and e8m0[1, 1] == clean_tile_code not in (0, 0xFF)
    np.testing.assert_array_equal(q.scales, e8m0.repeat_interleave(32, 0).numpy())
    # NaN by class: fp8sim's casts write ml_dtypes' E5M2 NaN code 0x7E, torch (and CUDA) 0x7F
    nan = codes.view(_TORCH_FP8[fmt.name]).float().isnan().numpy()
    assert nan[0:32, 32:64].all() and np.isnan(q.dequantize()[nan]).all()
    np.testing.assert_array_equal(q.codes[~nan], codes.numpy()[~nan])
    assert int(q.codes[40, 70]) == {"e4m3": 0x7E, "e5m2": 0x7B}[fmt.name]  # +max: the Inf saturates
