"""MXFP8 linear training against torchao 0.18's own ``MXFP8Linear`` with ``KernelPreference.EMULATED``
(``torchao/prototype/moe_training/mxfp8_linear.py``, which runs on a CPU): forward, every gradient and
two SGD steps bit for bit; config and recipe names against ``torchao/prototype/moe_training/config.py``.
The AUTO path (CUDA kernels in torchao) against a reference written here from the same source.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao_mx = require("torchao.prototype.moe_training.mxfp8_linear")
ao_cfg = require("torchao.prototype.moe_training.config")

from torch import nn  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode as AoMode  # noqa: E402
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference as AoKP  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.cast import decode  # noqa: E402
from fp8sim.scaling.mx import quantize_mx  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


def _heavy(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))).to(dtype)


def _pair(dtype, wgrad_with_hp, mode, bias=True, out_features=96):
    """fp8sim's MXFP8Linear (EMULATED) and torchao's, 64 -> ``out_features``, with torchao's initial weights."""
    torch.manual_seed(0)
    theirs = ao_mx.MXFP8Linear(
        64, out_features, bias=bias, kernel_preference=AoKP.EMULATED, wgrad_with_hp=wgrad_with_hp,
        scale_calculation_mode=AoMode(mode),
    ).to(dtype)  # fmt: skip
    ours = fs.MXFP8Linear(
        64, out_features, bias=bias, kernel_preference="emulated", wgrad_with_hp=wgrad_with_hp,
        scale_calculation_mode=mode,
    ).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _step(model, x):
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.float().square().sum().backward()
    return {"output": y.detach(), "grad_input": x.grad, **{n: p.grad for n, p in model.named_parameters()}}


def _assert_equal(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert_bit_exact(got[k], want[k])


@pytest.mark.parametrize("mode", ["rceil", "floor"])
@pytest.mark.parametrize("wgrad_with_hp", [False, True], ids=["wgrad_mx", "wgrad_hp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mxfp8linear_emulated_equals_torchao(dtype, wgrad_with_hp, mode):
    ours, theirs = _pair(dtype, wgrad_with_hp, mode)
    x = _heavy((2, 32, 64), dtype, 1)
    _assert_equal(_step(ours, x), _step(theirs, x))


def test_two_sgd_steps_equal_torchao_and_loss_decreases():
    ours, theirs = _pair(torch.bfloat16, False, "rceil")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    target = torch.randn(64, 96, generator=g).to(torch.bfloat16)
    losses = {}
    for name, model in (("ours", ours), ("theirs", theirs)):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses[name] = []
        for _ in range(3):
            opt.zero_grad()
            loss = (model(x).float() - target.float()).square().mean()
            loss.backward()
            opt.step()
            losses[name].append(loss.detach())
    for a, b in zip(losses["ours"], losses["theirs"], strict=True):
        assert_bit_exact(a, b)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert_bit_exact(p.detach(), q.detach())
    assert losses["ours"][-1] < losses["ours"][0]


def test_recipe_names_and_config_defaults_equal_torchao():
    assert [(r.name, r.value) for r in fs.MXFP8TrainingRecipe] == [
        (r.name, r.value) for r in ao_cfg.MXFP8TrainingRecipe
    ]
    ours, theirs = fs.MXFP8TrainingOpConfig(), ao_cfg.MXFP8TrainingOpConfig()
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    for recipe in ao_cfg.MXFP8TrainingRecipe:
        a, b = fs.MXFP8TrainingOpConfig.from_recipe(recipe.value), ao_cfg.MXFP8TrainingOpConfig.from_recipe(recipe)
        for f in dataclasses.fields(theirs):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            assert getattr(va, "value", va) == getattr(vb, "value", vb), (recipe, f.name)
    with pytest.raises(ValueError, match="Unsupported MXFP8 recipe: mxfp8_floor; known: mxfp8_rceil"):
        fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_floor")


def test_convert_swaps_linears_and_keeps_parameters():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32))
    w = model[0].weight
    cfg = fs.MXFP8TrainingOpConfig.from_recipe("mxfp8_emulated_rceil")
    out = fs.convert_to_mxfp8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn != "2")
    assert isinstance(out[0], fs.MXFP8Linear) and type(out[2]) is nn.Linear and out[0].weight is w
    assert out[0].kernel_preference is fs.KernelPreference.EMULATED


def test_auto_kernel_forward_equals_block_scaled_reference():
    """AUTO: torchao calls ``torch._scaled_mm(a.qdata, b.qdata, blocked scales, out_dtype=torch.bfloat16)``
    (``mx_formats/mx_tensor.py`` ``_addmm_mx_dispatch``).  With the exact accumulator that is the exact sum
    of the decoded, block-scaled products rounded to float32 and then to bfloat16."""
    m = fs.MXFP8Linear(64, 16, bias=False, accumulator="exact").to(torch.bfloat16)  # AUTO casts bf16 only
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    got = m(x)
    qa = quantize_mx(x, "e4m3", scale_rule="rceil")
    qb = quantize_mx(m.weight.detach(), "e4m3", scale_rule="rceil")

    def values(q):
        return decode(q.codes, "e4m3").astype(np.float64) * np.repeat(
            decode(q.scales, "e8m0").astype(np.float64), 32, 1
        )

    exact = values(qa) @ values(qb).T  # products and sums of these magnitudes are exact in float64
    want = torch.from_numpy(exact.astype(np.float32)).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert_bit_exact(got.detach(), want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kernel_preference must be AUTO or EMULATED"):
        fs.MXFP8Linear(64, 32, kernel_preference="torch")
    with pytest.raises(ValueError, match="divisible by block_size 32"):
        fs.MXFP8Linear(64, 32, kernel_preference="emulated")(torch.randn(8, 64).requires_grad_()).sum().backward()
    with pytest.raises(TypeError, match="config must be"):
        fs.convert_to_mxfp8_training(nn.Linear(32, 32), config=copy.copy("rceil"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_mx_cast_in_torch_ops_equals_the_numpy_reference(mode: str, dtype: torch.dtype) -> None:
    """MXFP8Linear casts with torch ops (torchao's own definition, for speed); codes and E8M0 scales must be
    those of fp8sim's independent numpy reference ``quantize_mx(flavor="torchao")``: NaN and Inf blocks,
    zero blocks, subnormal-range and huge amaxes, values that overflow to the +-448 clamp."""
    from fp8sim.scaling.mx import quantize_mx
    from fp8sim.torchao.mx_linear import ScaleCalculationMode, _to_mx_in_torch_ops

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=gen) * torch.logspace(-40, 36, 256).clamp(max=3e38)
    x[0, 0], x[1, 40], x[2, 64:96], x[3, 100] = float("nan"), float("-inf"), 0.0, 1e-44
    x[4, 130] = 3.4e38
    x = x.to(dtype)
    got = _to_mx_in_torch_ops(x, ScaleCalculationMode(mode))
    ref = quantize_mx(x, "e4m3", axis=-1, scale_rule=mode, flavor="torchao")
    assert np.array_equal(got.scales, np.asarray(ref.scales))
    assert np.array_equal(got.codes, np.asarray(ref.codes))


def test_bf16_dequantize_in_torch_ops_equals_the_float32_product_rounded_once() -> None:
    """Every E4M3 code times E8M0 scales across the range (2^-127, 1, 2^127, NaN): the bf16 torch-op path
    gives the float32 product (ml_dtypes values) rounded to bf16 by torch, bit for bit."""
    import ml_dtypes

    from fp8sim.torchao.mx_linear import _dequantize_bf16
    from fp8sim.torchao.mx_linear import _mx_record as _MX

    codes = np.tile(np.arange(256, dtype=np.uint8), (6, 1))  # 6 rows x 256 codes = 8 blocks per row
    scales = np.array([0, 1, 127, 200, 254, 255], np.uint8)[:, None].repeat(8, axis=1)
    got = _dequantize_bf16(_MX(codes, scales))
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # 2^128 overflows where the NaN scale is masked
        sc = np.where(scales == 255, np.float32("nan"), np.ldexp(np.float32(1), scales.astype(np.int32) - 127))
        ref = (vals.reshape(6, 8, 32) * sc.astype(np.float32)[:, :, None]).reshape(6, 256)
    want = torch.from_numpy(ref).to(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


# -- issue 29.7: double backward through MX GEMMs is graphless in torchao 0.18: reproduced, with a warning ---
@pytest.mark.parametrize("wgrad_with_hp", [False, True], ids=["wgrad_mx", "wgrad_hp"])
def test_create_graph_gives_torchaos_graphless_gradients_and_warns(wgrad_with_hp: bool) -> None:
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    ours, theirs = _pair(torch.bfloat16, wgrad_with_hp, "rceil", bias=False)
    x = _heavy((32, 64), torch.bfloat16, 3).requires_grad_(True)
    for model in (theirs, ours):
        model.zero_grad()
    got, want = [], []
    for model, sink in ((theirs, want), (ours, got)):
        gs = torch.autograd.grad(model(x).float().square().sum(), (x, model.weight), create_graph=True)
        sink.append([(g.requires_grad, g.detach()) for g in gs])
    assert [r for r, _ in got[0]] == [r for r, _ in want[0]] == [False, wgrad_with_hp]
    for (_, g), (_, w) in zip(got[0], want[0], strict=True):
        assert_bit_exact(g, w)
    with pytest.warns(UpstreamQuirkWarning, match="torchao-double-backward-graphless"):
        torch.autograd.grad(ours(x).float().square().sum(), x, create_graph=True)
