"""``scaled_grouped_mm``'s defaults and scale dtypes (tests/test_torchao_moe.py checks its numerics against
torchao and torch): without ``accumulator`` each group runs ``scaled_mm``'s default, Hopper's split-accumulate
preset (``use_fast_accum=False`` on ``device="hopper"``); MX scales may come as uint8 codes or as torch's
``float8_e8m0fnu`` (torchao's dtype), the same codes."""

from __future__ import annotations

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm import scaled_mm  # noqa: E402
from fp8sim.gemm.grouped import scaled_grouped_mm  # noqa: E402

E4 = torch.float8_e4m3fn
OFFS = [16, 16, 48]


def _offs() -> torch.Tensor:
    return torch.tensor(OFFS, dtype=torch.int32)


def test_default_accumulator_is_hoppers_split_preset_per_group() -> None:
    g = torch.Generator().manual_seed(4)
    a = (torch.randn(48, 512, generator=g) * 40).to(E4)
    b = (torch.randn(3, 512, 16, generator=g) * 40).to(E4)
    sa, sb = torch.rand(48, generator=g) + 0.5, torch.rand(3, 16, generator=g) + 0.5
    got = scaled_grouped_mm(a, b, sa, sb, _offs(), out_dtype=torch.float32)
    fast = scaled_grouped_mm(a, b, sa, sb, _offs(), out_dtype=torch.float32, use_fast_accum=True)
    assert not torch.equal(got, fast)  # the sums tell the two presets apart
    for e, (s, t) in enumerate(zip([0, *OFFS[:-1]], OFFS, strict=True)):
        if t > s:
            bt = b[e].t().contiguous().t()
            want = scaled_mm(a[s:t], bt, sa[s:t, None], sb[e][None, :], out_dtype=torch.float32,
                             accumulator="hopper_split", strict=False)  # fmt: skip
            assert torch.equal(got[s:t], want)


def test_mx_scales_as_e8m0_dtype_equal_their_uint8_codes() -> None:
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(48, 64, generator=g) * 8).to(E4)
    b = (torch.randn(3, 64, 16, generator=g) * 8).to(E4)
    sa = torch.randint(120, 132, (48, 2), generator=g, dtype=torch.uint8)
    sb = torch.randint(120, 132, (3, 2, 16), generator=g, dtype=torch.uint8)
    codes = scaled_grouped_mm(a, b, sa, sb, _offs(), accumulator="exact")
    typed = scaled_grouped_mm(a, b, sa.view(torch.float8_e8m0fnu), sb.view(torch.float8_e8m0fnu), _offs(),
                              accumulator="exact")  # fmt: skip
    assert torch.equal(codes.view(torch.int16), typed.view(torch.int16))
