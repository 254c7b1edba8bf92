"""MXFP8, NVFP4 and MoE training semantics found untested by the second mutation sample (seed 31), against
torchao 0.18 itself run side by side, torch's own ops, or torchao's source (file and line cited).

- ``to_mx`` of blocks holding Inf, NaN, float32's largest values and tiny ones, every scale mode, float32 and
  bf16: the codes and scales of torchao's own ``to_mx``.
- ``MXFP8Linear`` (EMULATED, float32): an element at float32's largest value overflows to Inf when dequantized
  (RCEIL rounds it up to 2^8 x 2^120), as in torchao, without numpy warnings; a 0-D input gets torch's error.
- ``nvfp4_linear``: the stochastic-rounding seed drawn when none is given is the one torchao's
  ``nvfp4_linear`` draws from the same generator state; a float32 input is cast to bf16 first
  (``nvfp4_linear.py:90-91``).
- MoE: a weight converted with an MXFP8 config runs with it; ``create_graph=True`` is refused naming the GEMMs;
  FP8 rowwise refuses an expert dim N not a multiple of 16 as torchao does (``fp8_grouped_mm.py:88``) and,
  with ``accumulator=None`` (the device's), every GEMM is Hopper's fast accumulation as torchao asks
  (``use_fast_accum=True``, ``fp8_grouped_mm.py:184, 269, 317``); MXFP8 AUTO with ``accumulator=None`` gives the
  exact products of exactly representable data, as torch's own grouped mm (which accumulator ran is not asserted:
  on exact data they all agree).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao_mx_tensor = require("torchao.prototype.mx_formats.mx_tensor")
ao_mx_linear = require("torchao.prototype.moe_training.mxfp8_linear")
ao_nvfp4 = require("torchao.prototype.moe_training.nvfp4_training.nvfp4_linear")
ao_fp8_moe = require("torchao.prototype.moe_training.fp8_grouped_mm")

from test_torchao_nvfp4_training import M64, _heavy, _Ref  # noqa: E402
from torch import nn  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode as AoMode  # noqa: E402
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402
from fp8sim.torchao.moe import convert_to_moe_training, fp8_rowwise_grouped_mm, mxfp8_grouped_mm  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_FMAX = float(np.finfo(np.float32).max)


def _extreme_blocks(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(31)
    x = torch.randn(6, 64, generator=g)
    big = _FMAX if dtype == torch.float32 else 3.3e38  # bf16 rounds float32's largest value to Inf
    x[0, 0], x[0, 1], x[0, 2] = float("inf"), 1e38, -3e38  # an Inf block with huge finite neighbours
    x[1, 3], x[1, 4] = float("-inf"), 2.0**100
    x[2, 5] = float("nan")
    x[3, 0], x[3, 1] = big, -1.7e38  # largest finite amax
    x[4, :32] = 1e-40  # subnormal block
    x[5, :32] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("mode", ["floor", "rceil", "ceil", "even"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_to_mx_of_extreme_blocks_equals_torchaos_to_mx(dtype: torch.dtype, mode: str) -> None:
    from fp8sim.torchao.mx_linear import ScaleCalculationMode, _to_mx

    x = _extreme_blocks(dtype)
    scale, data = ao_mx_tensor.to_mx(x, torch.float8_e4m3fn, 32, AoMode(mode))
    got = _to_mx(x, ScaleCalculationMode(mode))
    assert np.array_equal(np.asarray(got.scales), scale.view(torch.uint8).numpy())
    assert np.array_equal(np.asarray(got.codes), data.view(torch.uint8).numpy())


def test_mxfp8_linear_float32_overflow_to_inf_is_torchaos_without_numpy_warnings() -> None:
    torch.manual_seed(0)
    theirs = ao_mx_linear.MXFP8Linear(64, 32, bias=False, kernel_preference=AoKP.EMULATED)
    ours = fs.MXFP8Linear(64, 32, bias=False, kernel_preference="emulated")
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    x[2, 7] = _FMAX  # RCEIL: scale 2^120, element 2^8 (rounded up): the dequantized value overflows to Inf
    with torch.no_grad():
        want = theirs(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = ours(x)
    assert torch.isinf(want[2]).any() or torch.isnan(want[2]).any()  # the overflow reaches the output
    assert_bit_exact(got, want)


def test_mxfp8_linear_of_a_0d_input_raises_torchs_linear_error() -> None:
    w = torch.ones(32, 64)
    with pytest.raises(RuntimeError) as torch_error:
        torch.nn.functional.linear(torch.tensor(1.0), w)
    with pytest.raises(RuntimeError) as ours:
        fs.MXFP8Linear(64, 32, kernel_preference="emulated")(torch.tensor(1.0))
    assert str(ours.value) == str(torch_error.value)


# -- NVFP4 ----------------------------------------------------------------------------------------


def test_nvfp4_linear_draws_torchaos_seed_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao ``nvfp4_linear.py:269-272``: ``sr_seed = torch.randint(-(2**63), 2**63 - 1, (1,), int64)``; its
    kernel (Triton) is replaced by a spy, torchao's own function draws the seed."""
    import sys

    ours_mod = sys.modules["fp8sim.torchao.nvfp4_linear"]  # the package's attribute is the function

    calls: list[int] = []

    class Spy:
        @staticmethod
        def apply(x, w, bias, seed, *rest):
            calls.append(int(seed.reshape(-1)[0]) & M64 if isinstance(seed, torch.Tensor) else seed)
            return torch.zeros(())

    signs = [1, -1] * 8
    x, w = torch.ones(128, 128, dtype=torch.bfloat16), torch.ones(128, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(ao_nvfp4, "nvfp4_mm_triton", Spy)
    monkeypatch.setattr(ours_mod, "_NVFP4MM", Spy)
    for fn in (ao_nvfp4.nvfp4_linear, fs.nvfp4_linear):
        torch.manual_seed(123)
        fn(x, w, None, sign_vector=signs)
    assert len(calls) == 2 and calls[0] == calls[1]


def test_nvfp4_linear_casts_a_float32_input_to_bf16_first() -> None:
    torch.manual_seed(0)
    m = fs.NVFP4Linear(128, 128, dtype=torch.bfloat16, accumulator="exact")
    x = _heavy((128, 128), 7).float() * (1 + 2.0**-12)  # not representable in bf16
    assert not torch.equal(x, x.to(torch.bfloat16).float())
    with torch.no_grad():
        got = m(x)
        want = _Ref.apply(x.to(torch.bfloat16), m.weight, m.bias, int(m._sr_seed) & M64, m.rht_sign_vector, m.sr_tile)
    assert_bit_exact(got, want)


# -- MoE ------------------------------------------------------------------------------------------

OFFS = [32, 64, 64, 128]


def _offs() -> torch.Tensor:
    return torch.tensor(OFFS, dtype=torch.int32)


def test_a_weight_converted_with_an_mxfp8_config_runs_with_it() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(128, 64, generator=g).to(torch.bfloat16)
    w_t = torch.randn(4, 96, 64, generator=g).to(torch.bfloat16).transpose(-2, -1)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="emulated", out_dtype=torch.float32)
    holder = nn.Module()
    holder.w = nn.Parameter(w_t.detach().clone())
    convert_to_moe_training(holder, config=cfg)
    with torch.no_grad():
        got = torch._grouped_mm(x, holder.w, offs=_offs())
    assert got.dtype == torch.float32
    assert_bit_exact(got, mxfp8_grouped_mm(x, w_t, _offs(), cfg))


@pytest.mark.parametrize("which", ["mxfp8", "fp8_rowwise"])
def test_create_graph_through_a_grouped_gemm_is_refused_naming_it(which: str) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(128, 64, generator=g, requires_grad=True)
    w_t = torch.randn(4, 64, 96, generator=g)
    if which == "mxfp8":
        cfg = fs.MXFP8TrainingOpConfig(kernel_preference="emulated")
        out, name = mxfp8_grouped_mm(x, w_t, _offs(), cfg), "the MXFP8 grouped GEMMs (MoE)"
    else:
        out, name = fp8_rowwise_grouped_mm(x, w_t, _offs()), "the float8 grouped GEMMs (MoE)"
    with pytest.raises(NotImplementedError, match=re.escape(f"through {name} is not emulated")):
        torch.autograd.grad(out.float().sum(), x, create_graph=True)


def test_fp8_rowwise_refuses_an_expert_dim_not_a_multiple_of_16_like_torchao() -> None:
    x = torch.randn(32, 32, dtype=torch.bfloat16)
    w_t = torch.randn(2, 8, 32, dtype=torch.bfloat16).transpose(-2, -1)  # K = 32, N = 8
    offs = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(AssertionError, match="B must have last 2 dims divisible by 16"):
        ao_fp8_moe._to_fp8_rowwise_then_scaled_grouped_mm(x, w_t, offs, pad_token_groups_for_grouped_mm=False)
    with pytest.raises(ValueError, match="divisible by 16"):
        fp8_rowwise_grouped_mm(x, w_t, offs)


def _grads(fn, x: torch.Tensor, w_t: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    x, w_t = x.clone().requires_grad_(True), w_t.detach().clone().requires_grad_(True)
    out = fn(x, w_t)
    out.backward(grad)
    return [out.detach(), x.grad, w_t.grad]


def test_fp8_rowwise_with_the_devices_accumulator_uses_fast_accumulation_in_every_gemm() -> None:
    """Two groups of 256 tokens: the wgrad GEMMs reduce over K = 256, long enough for Hopper's fast and
    split accumulation to differ (the forward and dgrad ones, K = 64 and 96, do not)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(512, 64, generator=g) * torch.exp(torch.randn(512, 64, generator=g))
    w_t = torch.randn(2, 96, 64, generator=g).transpose(-2, -1)
    grad = torch.randn(512, 96, generator=g).to(torch.bfloat16)
    offs = torch.tensor([256, 512], dtype=torch.int32)
    runs = {
        acc: _grads(lambda a, b, acc=acc: fp8_rowwise_grouped_mm(a, b, offs, accumulator=acc), x, w_t, grad)
        for acc in (None, "hopper_fast", "hopper_split")
    }
    for got, want in zip(runs[None], runs["hopper_fast"], strict=True):
        assert_bit_exact(got, want)
    assert not torch.equal(runs["hopper_fast"][2], runs["hopper_split"][2])  # the data tell the two apart


def test_mxfp8_auto_with_the_devices_accumulator_gives_exact_products_of_exact_data() -> None:
    """Entries in {-1, 0, 1}: every 32-block casts exactly (amax 1: scale 2^-8, element 2^8) and every
    product and sum is a small integer, so forward, dgrad and wgrad equal torch's own grouped mm."""
    g = torch.Generator().manual_seed(6)
    x = torch.randint(-1, 2, (128, 64), generator=g).to(torch.bfloat16)
    w_t = torch.randint(-1, 2, (4, 96, 64), generator=g).to(torch.bfloat16).transpose(-2, -1)
    grad = torch.randint(-1, 2, (128, 96), generator=g).to(torch.bfloat16)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto")
    got = _grads(lambda a, b: mxfp8_grouped_mm(a, b, _offs(), cfg, accumulator=None), x, w_t, grad)
    offs = _offs()
    want = [
        torch._grouped_mm(x, w_t, offs=offs),
        torch._grouped_mm(grad, w_t.transpose(-2, -1).contiguous(), offs=offs),
        torch._grouped_mm(grad.t(), x, offs=offs).transpose(-2, -1),
    ]
    for a, b in zip(got, want, strict=True):
        assert_bit_exact(a, b)
