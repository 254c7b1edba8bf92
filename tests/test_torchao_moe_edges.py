"""MoE grouped GEMM edges (``torchao/prototype/moe_training/``).

- FP8 rowwise (``fp8_grouped_mm.py``, Triton-only in torchao, re-derived): an Inf in a token row gives that
  row torchao's scale of 0 (``max / Inf``), so the row's products are NaN (``Inf * 0``) and the other rows are
  untouched, without numpy warnings; argument errors name both ranks; a converted weight's grouped mm runs
  with the config it was converted with.
- MXFP8 (``mxfp8_grouped_mm.py``): a float32 ``out_dtype`` reaches the dgrad GEMM (torchao's own ``to_mx``
  casts, torch's grouped mm); ``wgrad_with_hp`` on the AUTO path is ``torch._grouped_mm(grad.t(), x, offs, out_dtype)``
  (``_compute_wgrad_sm100``), against torch's own grouped mm.
"""

from __future__ import annotations

import warnings

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao_mx = require("torchao.prototype.mx_formats.mx_tensor")

from torch import nn  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode as AoMode  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402
from fp8sim.torchao.moe import (  # noqa: E402
    Float8TrainingOpConfig,
    convert_to_moe_training,
    fp8_rowwise_grouped_mm,
    mxfp8_grouped_mm,  # noqa: E402
)

OFFS = [32, 64, 64, 128]  # four experts, one of them empty


def _offs() -> torch.Tensor:
    return torch.tensor(OFFS, dtype=torch.int32)


def _inputs(dtype: torch.dtype, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(128, 64, generator=g) * torch.exp(torch.randn(128, 64, generator=g))).to(dtype)
    w_t = torch.randn(4, 96, 64, generator=g).to(dtype).transpose(-2, -1)  # (E, K, N), column-major experts
    return x, w_t


def _run(fn, x: torch.Tensor, w_t: torch.Tensor) -> dict[str, torch.Tensor]:
    x, w_t = x.clone().requires_grad_(True), w_t.detach().clone().requires_grad_(True)
    out = fn(x, w_t)
    out.float().square().sum().backward()
    return {"output": out.detach(), "grad_x": x.grad, "grad_w_t": w_t.grad}


def test_an_inf_token_row_is_nan_and_leaves_the_others_without_numpy_warnings() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 32, generator=g)
    w_t = torch.randn(2, 32, 16, generator=g)
    offs = torch.tensor([16, 32], dtype=torch.int32)
    clean = fp8_rowwise_grouped_mm(x, w_t, offs)
    x[3, 5] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "invalid value" RuntimeWarning would be an error
        out = fp8_rowwise_grouped_mm(x, w_t, offs)
    assert torch.isnan(out[3]).all()
    keep = torch.arange(32) != 3
    assert torch.equal(out[keep], clean[keep])


def test_operand_rank_errors_name_both_ranks() -> None:
    with pytest.raises(ValueError, match=r"^x must be 2D and w_t 3D; got 3D and 3D$"):
        fp8_rowwise_grouped_mm(torch.ones(2, 16, 16), torch.ones(2, 16, 16), torch.tensor([2], dtype=torch.int32))


def test_a_converted_weight_runs_with_its_config() -> None:
    cfg = Float8TrainingOpConfig(out_dtype=torch.float32)
    x, w_t = _inputs(torch.bfloat16)
    holder = nn.Module()
    holder.w = nn.Parameter(w_t.detach().clone())
    convert_to_moe_training(holder, config=cfg)
    got = torch._grouped_mm(x, holder.w, offs=_offs())
    assert got.dtype == torch.float32
    assert_bit_exact(got, fp8_rowwise_grouped_mm(x, w_t, _offs(), cfg))


def test_mxfp8_emulated_float32_out_dtype_reaches_the_dgrad_gemm() -> None:
    """torchao's ``_compute_dgrad`` runs ``torch._grouped_mm(deq(grad), deq(w), out_dtype=out_dtype)`` on the
    bf16-dequantized ``to_mx`` casts (grad along N, experts along N).  torch's CPU grouped mm refuses a float32
    output of bf16 operands, so the reference takes the bf16 values to float32 first (exact) and uses torchao's
    own ``to_mx`` / ``to_dtype``."""
    x, w_t = _inputs(torch.float32, seed=4)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="emulated", out_dtype=torch.float32)
    x = x.clone().requires_grad_(True)
    out = mxfp8_grouped_mm(x, w_t, _offs(), cfg)
    assert out.dtype == torch.float32
    grad = torch.randn(128, 96, generator=torch.Generator().manual_seed(9))
    out.backward(grad)

    def deq(t: torch.Tensor) -> torch.Tensor:
        scale, data = ao_mx.to_mx(t.contiguous(), torch.float8_e4m3fn, 32, AoMode.RCEIL)
        return ao_mx.to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.bfloat16)

    w = deq(w_t.reshape(-1, 96)).reshape(4, 64, 96).transpose(-2, -1)  # (E, N, K)
    want = torch._grouped_mm(deq(grad).float(), w.float().contiguous(), offs=_offs())
    assert x.grad.dtype == torch.float32
    assert_bit_exact(x.grad, want)


def test_mxfp8_auto_wgrad_with_hp_is_torchs_grouped_mm_of_the_gradient() -> None:
    x, w_t = _inputs(torch.bfloat16, seed=5)
    cfg = fs.MXFP8TrainingOpConfig(kernel_preference="auto", wgrad_with_hp=True)
    got = _run(lambda a, b: mxfp8_grouped_mm(a, b, _offs(), cfg, accumulator="exact"), x, w_t)
    grad = (2 * got["output"].float()).to(torch.bfloat16)  # d(sum(out.float()^2))/d out, in bf16
    want = torch._grouped_mm(grad.t(), x, offs=_offs(), out_dtype=torch.bfloat16).transpose(-2, -1)
    assert_bit_exact(got["grad_w_t"], want)
