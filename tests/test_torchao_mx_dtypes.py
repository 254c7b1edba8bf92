"""Which input dtypes torchao's ``MXFP8Linear`` casts, and its refusals, against the installed torchao.

EMULATED's ``MXTensor.to_mx`` takes bfloat16 and float32 only (torchao 0.18 ``mx_formats/mx_tensor.py:225-228``);
AUTO casts dim0 with ``triton_to_mxfp8_dim0``, bfloat16 only (``mx_formats/kernels.py:860-862``), which needs
CUDA, so its message is checked against that source line, not run.
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
require("torchao")

from torchao.prototype.moe_training import mxfp8_linear as ao_mx  # noqa: E402
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _torchao_refusal(dtype: torch.dtype) -> str:
    m = ao_mx.MXFP8Linear(64, 32, bias=False, kernel_preference=AoKP.EMULATED).to(dtype)
    with pytest.raises(AssertionError) as info:
        m(torch.ones(4, 64, dtype=dtype))
    return str(info.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["f16", "f64"])
def test_emulated_refuses_what_torchaos_to_mx_refuses_with_its_message(dtype: torch.dtype) -> None:
    want = _torchao_refusal(dtype)
    ours = fs.MXFP8Linear(64, 32, bias=False, kernel_preference="emulated").to(dtype)
    with pytest.raises(AssertionError) as info:
        ours(torch.ones(4, 64, dtype=dtype))
    assert str(info.value) == want


def test_emulated_refuses_a_float16_weight_under_a_bfloat16_input() -> None:
    """torchao casts the weight with the same ``to_mx``: a float16 weight is refused even when the input passes."""
    theirs = ao_mx.MXFP8Linear(64, 32, bias=False, kernel_preference=AoKP.EMULATED).to(torch.float16)
    x = torch.ones(4, 64, dtype=torch.bfloat16)
    with pytest.raises(AssertionError) as info:
        theirs(x)
    ours = fs.MXFP8Linear(64, 32, bias=False, kernel_preference="emulated").to(torch.float16)
    with pytest.raises(AssertionError, match="^torch.float16 is not supported yet$"):
        ours(x)
    assert str(info.value) == "torch.float16 is not supported yet"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_emulated_casts_both_dtypes_torchao_casts(dtype: torch.dtype) -> None:
    theirs = ao_mx.MXFP8Linear(64, 32, bias=False, kernel_preference=AoKP.EMULATED).to(dtype)
    ours = fs.MXFP8Linear(64, 32, bias=False, kernel_preference="emulated").to(dtype)
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5)).to(dtype)
    assert torch.equal(
        ours(x).view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        theirs(x).view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_auto_refuses_all_but_bfloat16_with_the_triton_cast_message(dtype: torch.dtype) -> None:
    m = fs.MXFP8Linear(64, 32, bias=False).to(dtype)  # AUTO, torchao's default
    with pytest.raises(AssertionError, match=f"^only bfloat16 inputs are supported, got {dtype}$"):
        m(torch.ones(4, 64, dtype=dtype))
    assert m.to(torch.bfloat16)(torch.ones(4, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
