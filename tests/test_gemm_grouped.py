"""``fp8sim.gemm.grouped`` on its own (tests/test_torchao_moe.py covers the MoE paths): the 3d x 2d and empty
3d x 3d layouts against torch's CPU ``torch._grouped_mm``, ``out_dtype=float32`` (the CUDA kernel's wider output,
which torch's CPU kernel refuses) on sums exact in float32 but not in bfloat16, every argument check, and the
rowwise 2d x 2d ``scaled_grouped_mm`` against torch's CPU ``torch._scaled_mm`` per group (fallback kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm.grouped import grouped_mm, scaled_grouped_mm  # noqa: E402
from fp8sim.gemm.torch_cpu import fallback_kernel  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

BF16 = torch.bfloat16


def _offs(ends: list[int]) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=["bf16", "fp32"])
def test_3d_by_2d_groups_columns_as_torch_grouped_mm(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, 8, 64, generator=g).to(dtype)
    b = torch.randn(64, 40, generator=g).to(dtype)
    offs = _offs([16, 16, 32])  # group 1 empty; columns 32..39 belong to no group
    got = grouped_mm(a, b, offs=offs)
    want = torch._grouped_mm(a, b, offs=offs)
    assert got.shape == (8, 40) and got.dtype == dtype
    assert_bit_exact(got[:, :32], want[:, :32])
    assert (got[:, 32:] == 0).all()  # torch leaves them unwritten


def test_3d_by_3d_without_groups_is_an_empty_batch() -> None:
    a, b = torch.zeros(0, 8, 64, dtype=BF16), torch.zeros(0, 64, 16, dtype=BF16)
    got, want = grouped_mm(a, b), torch._grouped_mm(a, b)
    assert got.shape == want.shape == (0, 8, 16) and got.dtype == want.dtype == BF16
    got = grouped_mm(a, b, out_dtype=torch.float32)
    assert got.shape == (0, 8, 16) and got.dtype == torch.float32


def _exact_in_f32_not_bf16(shape: tuple, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Small integers (exact in bfloat16) whose products sum to integers past bfloat16's 8 bits."""
    x = np.random.default_rng(seed).integers(-15, 16, size=shape)
    return torch.tensor(x, dtype=BF16), x.astype(np.float64)


@pytest.mark.parametrize("layout", ["2dx3d", "2dx2d", "3dx2d", "3dx3d"])
def test_out_dtype_float32_keeps_sums_bfloat16_would_round(layout: str) -> None:
    """Every sum below is an integer under 2^24, exact in float32: the float32 output must equal numpy's
    float64 product exactly, while the bfloat16 output rounds some of them."""
    if layout == "2dx3d":
        (a, an), (b, bn), offs = _exact_in_f32_not_bf16((6, 32), 0), _exact_in_f32_not_bf16((2, 32, 5), 1), [2, 6]
        want = np.concatenate([an[:2] @ bn[0], an[2:] @ bn[1]])
    elif layout == "2dx2d":
        (a, an), (b, bn), offs = _exact_in_f32_not_bf16((4, 40), 2), _exact_in_f32_not_bf16((40, 5), 3), [24, 40]
        want = np.stack([an[:, :24] @ bn[:24], an[:, 24:] @ bn[24:]])
    elif layout == "3dx2d":
        (a, an), (b, bn), offs = _exact_in_f32_not_bf16((2, 4, 32), 4), _exact_in_f32_not_bf16((32, 6), 5), [2, 6]
        want = np.concatenate([an[0] @ bn[:, :2], an[1] @ bn[:, 2:]], axis=1)
    else:
        (a, an), (b, bn), offs = _exact_in_f32_not_bf16((2, 4, 32), 6), _exact_in_f32_not_bf16((2, 32, 5), 7), None
        want = an @ bn
    kw = {} if offs is None else {"offs": _offs(offs)}
    got = grouped_mm(a, b, out_dtype=torch.float32, **kw)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), want)
    narrow = grouped_mm(a, b, **kw)
    assert narrow.dtype == BF16 and not np.array_equal(narrow.float().numpy(), want)
    assert grouped_mm(a, b, out_dtype=BF16, **kw).dtype == BF16


@pytest.mark.parametrize(
    ("a", "b", "kw", "error", "message"),
    [
        (np.ones((4, 8)), torch.ones(2, 8, 4), {}, TypeError, "a and b must be torch tensors"),
        (torch.ones(4, 8), np.ones((2, 8, 4)), {}, TypeError, "a and b must be torch tensors"),
        (torch.ones(4, 8), torch.ones(2, 8, 4, dtype=BF16), {}, ValueError,
         "a and b must have the same dtype; got torch.float32 and torch.bfloat16"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {"offs": [2, 4], "bias": torch.ones(4)}, NotImplementedError,
         "bias is not supported by torch._grouped_mm yet"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {"offs": [2, 4], "out_dtype": torch.float16}, ValueError,
         "out_dtype must be None, torch.float32 or torch.float32 (for bf16/fp16 operands); got torch.float16"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {"offs": [2, 4], "out_dtype": torch.float32}, None, None),
        (torch.ones(4, 8, dtype=BF16), torch.ones(2, 8, 4, dtype=BF16), {"offs": [2, 4], "out_dtype": torch.float16},
         ValueError, "out_dtype must be None, torch.bfloat16 or torch.float32"),
        (torch.ones(2, 4, 8), torch.ones(2, 8, 4), {"offs": [2, 4]}, ValueError,
         "offs must be None for a 3d x 3d grouped mm (a batched mm)"),
        (torch.ones(2, 4, 8), torch.ones(3, 8, 4), {}, ValueError,
         "a and b must have the same number of groups; got 2 and 3"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {}, ValueError,
         "offs is required unless both a and b are 3d; got a 2d and b 3d"),
        (torch.ones(4, 8), torch.ones(2, 7, 4), {"offs": [2, 4]}, ValueError,
         "contraction dims differ: a (4, 8) and b (2, 7, 4)"),
        (torch.ones(4, 8), torch.ones(3, 8, 4), {"offs": [2, 4]}, ValueError, "offs has 2 groups, b has 3"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {"offs": [2, 5]}, ValueError,
         "offs must be non-decreasing and at most 4 (the size of a's dim 0); got [2, 5]"),
        (torch.ones(4, 8), torch.ones(2, 8, 4), {"offs": [3, 2]}, ValueError, "offs must be non-decreasing"),
        (torch.ones(4, 8), torch.ones(7, 4), {"offs": [2, 4]}, ValueError,
         "contraction dims differ: a (4, 8) and b (7, 4)"),
        (torch.ones(4, 8), torch.ones(8, 4), {"offs": [2, 9]}, ValueError,
         "offs must be non-decreasing and at most 8 (the size of the contraction dim); got [2, 9]"),
        (torch.ones(2, 4, 8), torch.ones(7, 4), {"offs": [2, 4]}, ValueError,
         "contraction dims differ: a (2, 4, 8) and b (7, 4)"),
        (torch.ones(3, 4, 8), torch.ones(8, 4), {"offs": [2, 4]}, ValueError, "offs has 2 groups, a has 3"),
        (torch.ones(2, 4, 8), torch.ones(8, 4), {"offs": [2, 5]}, ValueError,
         "offs must be non-decreasing and at most 4 (the size of b's dim 1); got [2, 5]"),
        (torch.ones(8), torch.ones(8, 4), {"offs": [2, 4]}, ValueError, "a and b must be 2d or 3d; got 1d and 2d"),
        (torch.ones(2, 4, 8), torch.ones(1, 2, 8, 4), {"offs": [2, 4]}, ValueError,
         "a and b must be 2d or 3d; got 3d and 4d"),
    ],
)  # fmt: skip
def test_arguments_are_checked_naming_them(a, b, kw: dict, error, message) -> None:  # noqa: ANN001
    if "offs" in kw:
        kw = {**kw, "offs": _offs(kw["offs"])}
    if error is None:
        assert grouped_mm(a, b, **kw).dtype == torch.float32
        return
    with pytest.raises(error) as err:
        grouped_mm(a, b, **kw)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "offs", [torch.tensor([2, 4]), torch.tensor([[2, 4]], dtype=torch.int32), [2, 4], torch.tensor([2.0, 4.0])]
)
def test_offs_must_be_a_1d_int32_tensor(offs) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=r"^offs must be a 1-D int32 tensor of group end offsets along a's dim 0"):
        grouped_mm(torch.ones(4, 8), torch.ones(2, 8, 4), offs=offs)


@pytest.mark.parametrize("m", [0, 3])
def test_an_empty_offs_is_no_group_as_torch_takes_it(m: int) -> None:
    a, b = torch.ones(m, 8), torch.ones(0, 8, 4)
    got, want = grouped_mm(a, b, offs=_offs([])), torch._grouped_mm(a, b, offs=_offs([]))
    assert got.shape == want.shape == (m, 4) and (got == 0).all()  # rows in no group: zero here


def test_scaled_2d_by_2d_rowwise_equals_torch_scaled_mm_per_group() -> None:
    """The wgrad layout with rowwise scales ``(G, M)`` and ``(G, N)``: group g is ``torch._scaled_mm`` of
    ``a[:, g]`` and ``b[g, :]`` with row g of each scale (torch's CPU fallback kernel, fp8sim's cpu_reference)."""
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(8, 96, generator=g) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(96, 16, generator=g) * 8).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(3, 8, generator=g) + 0.5, torch.rand(3, 16, generator=g) + 0.5
    ends = [32, 32, 80]  # an empty group; K past 80 belongs to none
    with fallback_kernel():
        got = scaled_grouped_mm(a, b, sa, sb, _offs(ends), accumulator="cpu_reference")
        assert got.shape == (3, 8, 16) and got.dtype == BF16
        for e, (s, t) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            if t > s:
                bt = b[s:t].t().contiguous().t()
                want = torch._scaled_mm(a[:, s:t].contiguous(), bt, sa[e, :, None], sb[e, None, :], out_dtype=BF16)
                assert_bit_exact(got[e], want)
            else:
                assert (got[e] == 0).all()
        f32 = scaled_grouped_mm(a, b, sa, sb, _offs(ends), out_dtype=torch.float32, accumulator="cpu_reference")
        want = torch._scaled_mm(a[:, :32].contiguous(), b[:32].t().contiguous().t(), sa[0, :, None], sb[0, None, :],
                                out_dtype=torch.float32)  # fmt: skip
        assert f32.dtype == torch.float32
        assert_bit_exact(f32[0], want)


def test_scaled_grouped_mm_refuses_other_layouts_naming_them() -> None:
    a = torch.zeros(2, 4, 32).to(torch.float8_e4m3fn)
    b = torch.zeros(32, 4).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^scaled_grouped_mm supports 2d x 3d and 2d x 2d .*got a 3d, b 2d, scales"):
        scaled_grouped_mm(a, b, torch.ones(2, 4), torch.ones(4), _offs([2, 4]))
    a2, b3 = torch.zeros(4, 32).to(torch.float8_e4m3fn), torch.zeros(3, 32, 4).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^offs has 2 groups, b has 3"):
        scaled_grouped_mm(a2, b3, torch.ones(4), torch.ones(3, 4), _offs([2, 4]))
    with pytest.raises(ValueError, match=r"^offs must be multiples of 32 for an MXFP8 2d x 2d grouped mm"):
        sa, sb = torch.full((4, 1), 127, dtype=torch.uint8), torch.full((1, 4), 127, dtype=torch.uint8)
        scaled_grouped_mm(a2, torch.zeros(32, 4).to(torch.float8_e4m3fn), sa, sb, _offs([16, 32]))
