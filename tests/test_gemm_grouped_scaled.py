"""``scaled_grouped_mm``'s defaults and scale dtypes (tests/test_torchao_moe.py checks its numerics against
torchao and torch): without ``accumulator`` each group runs ``scaled_mm``'s default, Hopper's split-accumulate
preset (``use_fast_accum=False`` on ``device="hopper"``); MX scales may come as uint8 codes or as torch's
``float8_e8m0fnu`` (torchao's dtype), the same codes."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize(("device", "fast"), [("ada", False), ("ada", True), ("hopper", True)])
def test_device_and_use_fast_accum_pick_each_groups_preset(device: str, fast: bool) -> None:
    g = torch.Generator().manual_seed(6)
    a = (torch.randn(32, 512, generator=g) * 40).to(E4)
    b = (torch.randn(2, 512, 16, generator=g) * 40).to(E4)
    sa, sb = torch.rand(32, generator=g) + 0.5, torch.rand(2, 16, generator=g) + 0.5
    offs = torch.tensor([16, 32], dtype=torch.int32)
    got = scaled_grouped_mm(a, b, sa, sb, offs, out_dtype=torch.float32, use_fast_accum=fast, device=device)
    preset = f"{device}_{'fast' if fast else 'split'}"
    for e, s in enumerate((0, 16)):
        want = scaled_mm(a[s : s + 16], b[e].t().contiguous().t(), sa[s : s + 16, None], sb[e][None, :],
                         out_dtype=torch.float32, accumulator=preset, strict=False)  # fmt: skip
        assert torch.equal(got[s : s + 16], want), preset


def test_empty_dims_give_zeros_of_the_output_dtype() -> None:
    a = torch.zeros(8, 32).to(E4)
    got = scaled_grouped_mm(a, torch.zeros(2, 32, 0).to(E4), torch.ones(8), torch.ones(2, 0), _offs_of([4, 8]))
    assert got.shape == (8, 0) and got.dtype == torch.bfloat16
    a0, b2 = torch.zeros(0, 64).to(E4), torch.zeros(64, 16).to(E4)
    got = scaled_grouped_mm(a0, b2, torch.ones(2, 0), torch.ones(2, 16), _offs_of([32, 64]), out_dtype=torch.float32)
    assert got.shape == (2, 0, 16) and got.dtype == torch.float32
    sa, sb = torch.full((0, 2), 127, dtype=torch.uint8), torch.full((2, 16), 127, dtype=torch.uint8)
    got = scaled_grouped_mm(a0, b2, sa, sb, _offs_of([32, 64]))
    assert got.shape == (2, 0, 16) and got.dtype == torch.bfloat16


def test_mx_2d_by_2d_output_dtype_and_bad_offs_messages() -> None:
    a, b = torch.ones(4, 64).to(E4), torch.ones(64, 16).to(E4)
    sa, sb = torch.full((4, 2), 127, dtype=torch.uint8), torch.full((2, 16), 127, dtype=torch.uint8)
    out = scaled_grouped_mm(a, b, sa, sb, _offs_of([32, 64]), accumulator="exact")
    assert out.dtype == torch.bfloat16 and (out == 32).all()
    for scales, what in (
        ((sa, sb), "the contraction dim"),
        ((torch.ones(2, 4), torch.ones(2, 16)), "the contraction dim"),
    ):
        with pytest.raises(ValueError, match=rf"^offs must be non-decreasing and at most 64 \(the size of {what}\)"):
            scaled_grouped_mm(a, b, *scales, _offs_of([32, 96]))
    b3 = torch.ones(3, 64, 16).to(E4)
    with pytest.raises(ValueError, match=r"^offs must be non-decreasing and at most 4 \(the size of a's dim 0\)"):
        scaled_grouped_mm(a, b3, torch.ones(4), torch.ones(3, 16), _offs_of([2, 3, 5]))
    with pytest.raises(ValueError, match=r"^offs has 2 groups, b has 3$"):
        scaled_grouped_mm(a, b3, torch.ones(4), torch.ones(3, 16), _offs_of([2, 4]))


def _offs_of(ends: list[int]) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def test_a_single_output_column_is_computed() -> None:
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-8, 9, (8, 32), generator=g).float().to(E4)  # integers: every sum exact in float32
    b = torch.randint(-8, 9, (2, 32, 1), generator=g).float().to(E4)
    sa, sb = torch.ones(8), torch.ones(2, 1)
    got = scaled_grouped_mm(a, b, sa, sb, _offs_of([4, 8]), out_dtype=torch.float32, accumulator="exact")
    want = torch.cat([a[:4].float() @ b[0].float(), a[4:].float() @ b[1].float()])
    assert torch.equal(got, want) and (want != 0).any()
