"""MXFP8 linear training edges against torchao 0.18's own ``MXFP8Linear`` with ``KernelPreference.EMULATED``
(``torchao/prototype/moe_training/mxfp8_linear.py``, runs on a CPU): the CEIL and EVEN scale modes (cast by
fp8sim's numpy ``quantize_mx``, not the torch-op path of RCEIL/FLOOR) and a bias whose dtype differs from the
output's (torchao: ``output + self.bias.to(output.dtype)``)."""

from __future__ import annotations

import pytest
from test_torchao_mx_training import _assert_equal, _heavy, _step
from test_torchao_mx_training import _pair as _training_pair

from fp8sim.testing.oracles import require

torch = require("torch")
require("torchao.prototype.moe_training.mxfp8_linear")  # the oracle of every test here

from torch import nn  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pair(dtype: torch.dtype, mode: str, wgrad_with_hp: bool = False) -> tuple[nn.Module, nn.Module]:
    return _training_pair(dtype, wgrad_with_hp, mode, out_features=32)


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
