"""numpy E2M1 codes with flat uint8 scales in the 128x4 blocked layout are read as NVFP4 (16-wide blocks,
``fp8sim.scaling.swizzle.unswizzle_mm_scales``), even where 32-wide blocks would fit the same size (K = 64:
4 and 2 blocks both pad to 4 columns).  Oracle of the layout: torchao's own ``to_blocked``; the flat call equals
the call with the plain (M, K/16) and (K/16, N) scales."""

from __future__ import annotations

import numpy as np

import fp8sim.gemm as g
from fp8sim.testing.oracles import require


def test_flat_blocked_scales_of_fp4_codes_are_nvfp4() -> None:
    torch = require("torch")
    to_blocked = require("torchao.prototype.mx_formats.utils").to_blocked
    rng = np.random.default_rng(8)
    m, k, n = 32, 64, 16
    a = rng.integers(0, 16, (m, k), dtype=np.uint8)
    b = rng.integers(0, 16, (k, n), dtype=np.uint8)
    sa = rng.integers(0x30, 0x40, (m, k // 16), dtype=np.uint8)  # UE4M3 codes 0.25 ... 0.94
    sb = rng.integers(0x30, 0x40, (k // 16, n), dtype=np.uint8)
    flat_a = to_blocked(torch.from_numpy(sa)).reshape(-1).numpy()
    flat_b = to_blocked(torch.from_numpy(np.ascontiguousarray(sb.T))).reshape(-1).numpy()
    kw = {"out_dtype": "float32", "a_format": "e2m1", "b_format": "e2m1", "accumulator": "blackwell"}
    plain = g.scaled_mm(a, b, sa, sb, **kw)
    flat = g.scaled_mm(a, b, flat_a, flat_b, **kw)
    assert np.abs(plain).max() > 0
    np.testing.assert_array_equal(flat.view(np.uint32), plain.view(np.uint32))
