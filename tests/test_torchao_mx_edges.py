"""MXFP8 linear training edges against torchao 0.18's own ``MXFP8Linear`` with ``KernelPreference.EMULATED``
(``torchao/prototype/moe_training/mxfp8_linear.py``, runs on a CPU): the CEIL and EVEN scale modes (cast by
fp8sim's numpy ``quantize_mx``, not the torch-op path of RCEIL/FLOOR) and a bias whose dtype differs from the
output's (torchao: ``output + self.bias.to(output.dtype)``)."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao_mx = require("torchao.prototype.moe_training.mxfp8_linear")

from torch import nn  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode as AoMode  # noqa: E402
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pair(dtype: torch.dtype, mode: str, wgrad_with_hp: bool = False) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    theirs = ao_mx.MXFP8Linear(
        64, 32, bias=True, kernel_preference=AoKP.EMULATED, scale_calculation_mode=AoMode(mode),
        wgrad_with_hp=wgrad_with_hp,
    ).to(dtype)  # fmt: skip
    ours = fs.MXFP8Linear(
        64, 32, bias=True, kernel_preference="emulated", scale_calculation_mode=mode, wgrad_with_hp=wgrad_with_hp
    ).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _step(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.float().square().sum().backward()
    return {"output": y.detach(), "grad_input": x.grad, **{n: p.grad for n, p in model.named_parameters()}}


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert_bit_exact(got[k], want[k])


def _heavy(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))).to(dtype)


@pytest.mark.parametrize("mode", ["ceil", "even"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ceil_and_even_scale_modes_equal_torchao(dtype: torch.dtype, mode: str) -> None:
    ours, theirs = _pair(dtype, mode)
    x = _heavy((2, 32, 64), dtype, 1)
    _assert_equal(_step(ours, x), _step(theirs, x))


def test_bias_of_another_dtype_is_cast_to_the_output_dtype_like_torchao() -> None:
    ours, theirs = _pair(torch.bfloat16, "rceil")
    for m in (ours, theirs):
        m.bias = nn.Parameter(m.bias.detach().float())  # a float32 bias next to bf16 weights
    x = _heavy((32, 64), torch.bfloat16, 2)
    got, want = _step(ours, x), _step(theirs, x)
    assert want["output"].dtype == torch.bfloat16
    _assert_equal(got, want)


def test_create_graph_warning_names_the_graphless_gemms() -> None:
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    ours, _ = _pair(torch.bfloat16, "rceil")
    x = _heavy((32, 64), torch.bfloat16, 3).requires_grad_(True)
    with pytest.warns(UpstreamQuirkWarning, match=r"create_graph=True through torchao's MXFP8 GEMMs \(mx_mm\)"):
        torch.autograd.grad(ours(x).float().square().sum(), (x,), create_graph=True)
