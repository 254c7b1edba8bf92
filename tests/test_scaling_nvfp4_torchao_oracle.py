"""fp8sim's torchao NVFP4 flavour (``quantize_nvfp4(flavor="torchao")``, two-level and ``single_level``) against
torchao 0.18's own ``nvfp4_quantize`` (``torchao/prototype/mx_formats/nvfp4_tensor.py``) on inputs that reach
every clamp: zero blocks, blocks whose scale falls below E4M3's ``tiny`` (2^-6) or above 448, elements past +-6
after scaling, +-Inf, NaN with several payloads, bfloat16 and float32, 2-D and 3-D.  Zero tolerance; and the
emulation itself emits no numpy RuntimeWarning on such input (torchao emits none)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8sim.scaling.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from fp8sim.testing.oracles import require

torch = require("torch")
nv = require("torchao.prototype.mx_formats.nvfp4_tensor")


def _hard_input(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 12, shape, generator=g).float())
    rows = x.view(-1, shape[-1])
    rows[0, 0:16] = 0.0  # a zero block
    rows[0, 16:32] *= 2.0**-30  # tiny: block scale below 2^-6 before the global scale
    rows[1, 0:16] *= 2.0**40  # huge
    rows[1, 16] = float("inf")
    rows[1, 17] = -float("inf")
    if rows.shape[0] > 2:
        rows[2, 5] = float("nan")
        rows[2, 6] = -float("nan")
        rows[2, 40] = torch.tensor(0x7FC00123, dtype=torch.int32).view(torch.float32)
        rows[2, 20:32] = 3.0e38
    return x.to(dtype)


def _torchao(x: torch.Tensor, single_level: bool) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    pts = None if single_level else nv.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    s, d = nv.nvfp4_quantize(x, 16, pts)
    return unpack_uint4(d).numpy(), s.view(torch.uint8).numpy(), pts


@pytest.mark.parametrize("single_level", [False, True], ids=["two_level", "single_level"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("shape", "nan"), [((4, 64), False), ((3, 64), True), ((2, 3, 48), True)])
def test_torchao_flavour_equals_nvfp4_quantize_at_every_clamp(single_level: bool, dtype, shape, nan: bool) -> None:  # noqa: ANN001
    for seed in range(3):
        x = _hard_input(shape, dtype, seed)
        if not nan:
            x = torch.nan_to_num(x, nan=1.0, posinf=2.0**100, neginf=-(2.0**100)).to(dtype)
        want_codes, want_scales, pts = _torchao(x, single_level)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q = quantize_nvfp4(x, flavor="torchao", single_level=single_level)
        np.testing.assert_array_equal(q.codes, want_codes.reshape(q.codes.shape), err_msg=f"seed {seed}")
        np.testing.assert_array_equal(q.scales, want_scales.reshape(q.scales.shape), err_msg=f"seed {seed}")
        assert q.block == (1,) * (len(shape) - 1) + (16,) and q.shape == shape
        if single_level:
            assert q.global_scale is None and q.global_amax is None
        else:
            assert np.float32(q.global_scale).view(np.uint32) == pts.numpy().view(np.uint32)


@pytest.mark.parametrize("single_level", [False, True], ids=["two_level", "single_level"])
def test_torchao_flavour_numpy_input_equals_torch_input(single_level: bool) -> None:
    x = _hard_input((4, 64), torch.float32, 7)
    x = torch.nan_to_num(x, nan=1.0, posinf=2.0**100, neginf=-(2.0**100))
    want_codes, want_scales, _ = _torchao(x, single_level)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_nvfp4(x.numpy(), flavor="torchao", single_level=single_level)
        q.dequantize() if single_level else dequantize_nvfp4(q, "torchao")
    np.testing.assert_array_equal(q.codes, want_codes.reshape(q.codes.shape))
    np.testing.assert_array_equal(q.scales, want_scales.reshape(q.scales.shape))


def test_numpy_input_below_one_and_empty_numpy_input() -> None:
    """A numpy input's global amax is its own max|x| (no floor at 1), and an empty one has amax 0."""
    x = torch.linspace(-0.3, 0.2, 64).reshape(2, 32)
    want_codes, want_scales, pts = _torchao(x, False)
    q = quantize_nvfp4(x.numpy(), flavor="torchao")
    np.testing.assert_array_equal(q.codes, want_codes.reshape(q.codes.shape))
    np.testing.assert_array_equal(q.scales, want_scales.reshape(q.scales.shape))
    assert np.float32(q.global_scale).view(np.uint32) == pts.numpy().view(np.uint32)
    assert q.global_amax == np.float32(0.3)
    empty = quantize_nvfp4(np.zeros((0, 32), np.float32), flavor="torchao")
    assert empty.codes.shape == (0, 32) and empty.global_amax == 0.0


def _with_bits(x: torch.Tensor, bits: list[int]) -> torch.Tensor:
    flat = x.view(-1)
    for i, b in enumerate(bits):
        flat[3 + 5 * i] = torch.tensor(b, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return x


# quiet NaNs whose payloads sit on the rounding carry of torchao's bit cast (bit 21 and its neighbours)
_NAN_BITS = [0x7FE00000, 0x7FDFFFFF, 0x7FE00001, 0x7FDFFFFE, 0xFFE00000, 0xFFDFFFFF, 0x7FFFFFFF, 0xFFC00001]


@pytest.mark.parametrize("single_level", [False, True], ids=["two_level", "single_level"])
def test_nan_payloads_on_the_carry_and_zero_or_tiny_tensors_equal_torchao(single_level: bool) -> None:
    cases = [
        _with_bits(torch.randn(2, 64, generator=torch.Generator().manual_seed(1)), _NAN_BITS),
        torch.zeros(2, 32),
        torch.full((2, 32), 1e-44),
        torch.linspace(-1e-41, 1e-41, 64).reshape(2, 32),
    ]
    for x in cases:
        want_codes, want_scales, pts = _torchao(x, single_level)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q = quantize_nvfp4(x, flavor="torchao", single_level=single_level)
        np.testing.assert_array_equal(q.codes, want_codes.reshape(q.codes.shape))
        np.testing.assert_array_equal(q.scales, want_scales.reshape(q.scales.shape))
        if not single_level:
            assert np.float32(q.global_scale).view(np.uint32) == pts.numpy().view(np.uint32)
