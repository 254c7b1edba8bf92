"""fp8sim.torchao against real torchao 0.18 where the two used to part (spec 0): CPU autocast in
``Float8Linear``, NaN codes and signs of the float8 and NVFP4 casts, NVFP4 single-level scaling, empty
tensors, 0-d input and ``torch.compile``.  Oracle: torchao's own classes on the same input; zero tolerance.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from fp8sim.gemm.torch_cpu import fallback_kernel
from fp8sim.testing.oracles import require

torch = require("torch")
ao = require("torchao.float8")
ao_scaling = require("torchao.float8.float8_scaling_utils")
ao_tensor = require("torchao.float8.float8_training_tensor")

from torch import nn  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.formats import get_format  # noqa: E402
from fp8sim.scaling.current import quantize_torchao  # noqa: E402
from fp8sim.scaling.mx import quantize_mx  # noqa: E402
from fp8sim.scaling.nvfp4 import quantize_nvfp4  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

RECIPES = ("tensorwise", "rowwise")
F8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # bit-exact: reductions split by thread


def _pair(recipe: str, dtype: torch.dtype = torch.float32, emulate: bool = True) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8, bias=False)).to(dtype)
    ao_cfg = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=ao_cfg)
    ours = fs.convert_to_float8_training(
        copy.deepcopy(base),
        config=fs.Float8LinearConfig.from_recipe_name(recipe),
        accumulator=None if emulate else "dequantized_fp32",
    )
    return ours, theirs


def _step(model: nn.Module, x: torch.Tensor, autocast: torch.dtype | None) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y = model(x)
    y.float().square().sum().backward()
    out = {"output": y.detach(), "grad_input": x.grad}
    out.update({n: p.grad for n, p in model.named_parameters()})
    return out


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert_bit_exact(got[key], want[key])


# -- CPU autocast (spec 0 "6.1") -------------------------------------------------------------------


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16], ids=["ac_bf16", "ac_fp16"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_float8linear_under_cpu_autocast_equals_torchao(recipe, autocast, model_dtype):
    """torchao ``float8_linear.py`` ``forward`` reads only CUDA autocast; under CPU autocast the float8
    operands' ``_to_copy`` (``float8_ops.py`` ``autocast_to_copy``) makes ``float8_mm`` return the
    float32 emulated GEMM ``.to(autocast dtype)``, and the bias is added in that dtype."""
    ours, theirs = _pair(recipe, model_dtype)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1)).to(model_dtype)
    want = _step(theirs, x, autocast)
    assert want["output"].dtype == autocast
    _assert_equal(_step(ours, x, autocast), want)


def test_float8linear_autocast_with_scaled_mm_equals_torchao_emulate_false():
    """``accumulator="dequantized_fp32"`` is torchao ``emulate=False`` (``torch._scaled_mm`` on the CPU)."""
    ours, theirs = _pair("tensorwise", emulate=False)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(2))
    with fallback_kernel():  # the kernel dequantized_fp32 models; AMX hosts run oneDNN (fp8sim.gemm.torch_cpu)
        want = _step(theirs, x, torch.bfloat16)
    _assert_equal(_step(ours, x, torch.bfloat16), want)


def test_rowwise_with_gw_hp_under_cpu_autocast_fails_in_backward_like_torchao():
    """torchao's high-precision grad_weight GEMM is a plain ``torch.mm(grad_output bf16, input fp32)``
    outside autocast (``float8_linear.py`` backward): both libraries give torch's dtype error."""
    ours, theirs = _pair("rowwise_with_gw_hp")
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(3))
    messages = []
    for model in (ours, theirs):
        with pytest.raises(RuntimeError) as info:
            _step(model, x, torch.bfloat16)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "same dtype" in messages[0]


# -- NaN codes and signs (spec 0 "6.2") ------------------------------------------------------------


def _nan_input(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[:3]
    flat[idx[0]] = float("nan")
    flat[idx[1]] = -float("nan")
    flat[idx[2]] = torch.tensor(0x7FC00123, dtype=torch.int32).view(torch.float32)
    return x.to(dtype)


@pytest.mark.parametrize("pow2", [False, True], ids=["scale", "pow2"])
@pytest.mark.parametrize("granularity", ["tensorwise", "axiswise"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_nan_codes_and_scale_bits_equal_torchao(dtype, fmt, granularity, pow2):
    """``hp_tensor_to_float8_dynamic`` (``float8_scaling_utils.py``): the amax is ``torch.max(torch.abs(x))``
    (float32 on this machine: NaN 0xFFFFFFFF, so scale and codes carry the sign), and torch's cast writes
    NaN as 0x7F|sign for E5M2 too (ml_dtypes writes 0x7E)."""
    gran = ao.ScalingGranularity(granularity)
    for seed in range(4):
        x = _nan_input((8, 40), dtype, seed)
        for dim in (-1, 0):
            t = ao_scaling.hp_tensor_to_float8_dynamic(
                x,
                F8[fmt],
                ao_tensor.LinearMMConfig(),
                scaling_granularity=gran,
                axiswise_dim=dim,
                round_scales_to_power_of_2=pow2,
            )
            q = quantize_torchao(x, get_format(fmt), granularity=granularity, axiswise_dim=dim,
                                 round_scales_to_power_of_2=pow2)  # fmt: skip
            want_codes = t._data.view(torch.uint8).numpy()
            assert np.array_equal(q.codes, want_codes), (seed, dim, q.codes[want_codes != q.codes][:4])
            want_scale = t._scale.numpy().view(np.uint32)
            assert np.array_equal(np.asarray(q.scales).reshape(want_scale.shape).view(np.uint32), want_scale)


def test_float32_nan_amax_has_torchs_sign_on_this_machine():
    """The fact the fix rests on, measured: torch's float32 max over |x| with a NaN returns 0xFFFFFFFF."""
    x = _nan_input((8, 40), torch.float32, 0)
    torch_amax = torch.max(torch.abs(x)).numpy().view(np.uint32)
    q = quantize_torchao(x, "e4m3")
    assert np.isnan(q.scales).all()
    want = ao.float8_utils.amax_to_scale(torch.max(torch.abs(x)), torch.float8_e4m3fn).numpy().view(np.uint32)
    assert q.scales.view(np.uint32).item() == want.item()
    assert torch_amax.item() >> 31 == want.item() >> 31


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("single_level", [False, True], ids=["two_level", "single_level"])
def test_nvfp4_torchao_nan_inputs_equal_nvfp4_quantize(single_level, dtype):
    """``nvfp4_tensor.py`` ``nvfp4_quantize``: per-tensor scale from ``torch.max(torch.abs(x))`` (its NaN
    bits), or ``per_tensor_scale=None`` (single level, ``x * (1.0 / fp8_scale)``)."""
    nv = require("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    for seed in range(6):
        x = _nan_input((4, 64), dtype, seed) if seed % 2 else torch.randn(4, 64).to(dtype)
        pts = None if single_level else nv.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
        s, d = nv.nvfp4_quantize(x, 16, pts)
        q = quantize_nvfp4(x, flavor="torchao", single_level=single_level)
        assert np.array_equal(q.codes, unpack_uint4(d).numpy().reshape(q.codes.shape)), seed
        assert np.array_equal(q.scales, s.view(torch.uint8).numpy().reshape(q.scales.shape)), seed
        if single_level:
            assert q.global_scale is None
        else:
            assert np.float32(q.global_scale).view(np.uint32) == pts.numpy().view(np.uint32)


def test_nvfp4_single_level_is_refused_outside_the_torchao_flavour():
    with pytest.raises(ValueError, match="per_tensor_scale=None"):
        quantize_nvfp4(torch.zeros(16, 16), single_level=True)
    with pytest.raises(ValueError, match="no global_amax"):
        quantize_nvfp4(torch.zeros(16, 16), flavor="torchao", single_level=True, global_amax=1.0)


# -- empty tensors (issue 18 item 9) ----------------------------------------------------------------


def test_axiswise_cast_of_empty_rows_equals_torchao():
    """Where torchao itself runs on an empty tensor (the reduced dim non-empty) the bits agree."""
    x = torch.zeros(0, 8)
    t = ao_scaling.hp_tensor_to_float8_dynamic(
        x, torch.float8_e4m3fn, ao_tensor.LinearMMConfig(), scaling_granularity=ao.ScalingGranularity.AXISWISE,
        axiswise_dim=-1,
    )  # fmt: skip
    q = quantize_torchao(x, "e4m3", granularity="axiswise", axiswise_dim=-1)
    assert q.codes.shape == (0, 8) and q.scales.shape == tuple(t._scale.shape)


@pytest.mark.parametrize("shape", [(0,), (0, 8), (4, 0)])
@pytest.mark.parametrize("granularity", ["tensorwise", "axiswise"])
def test_empty_torchao_casts_scale_an_amax_of_zero(shape, granularity):
    """An empty reduction has amax 0 (torch refuses it; fp8sim takes max's identity), so the scale is
    torchao's ``amax_to_scale`` of 0 (``float8_utils.py``: ``max / clamp(amax, min=1e-12)``)."""
    want = ao.float8_utils.amax_to_scale(torch.tensor(0.0), torch.float8_e4m3fn).item()
    q = quantize_torchao(torch.zeros(shape), "e4m3", granularity=granularity)
    assert q.codes.shape == shape and q.dequantize().shape == shape
    assert (np.asarray(q.scales) == np.float32(want)).all()


@pytest.mark.parametrize("recipe", RECIPES)
def test_float8linear_on_an_empty_batch_equals_nn_linear(recipe):
    """torchao 0.18 raises on a 0-row batch (``torch.max`` of an empty tensor); fp8sim returns what
    ``nn.Linear`` returns: an empty output and all-zero gradients."""
    ours, theirs = _pair(recipe)
    x = torch.zeros(0, 32)
    with pytest.raises((RuntimeError, IndexError)):
        _step(theirs, x, None)
    ref = copy.deepcopy(ours)
    for name, mod in list(ref.named_children()):
        if isinstance(mod, nn.Linear):
            plain = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            plain.weight, plain.bias = mod.weight, mod.bias
            setattr(ref, name, plain)
    _assert_equal(_step(ours, x, None), _step(ref, x, None))


def test_empty_mx_and_nvfp4_quantize():
    for axis in (0, -1):
        q = quantize_mx(np.zeros((32, 0), np.float32), axis=axis)
        assert q.codes.shape == (32, 0) and q.dequantize().shape == (32, 0)
    for single in (False, True):
        q = quantize_nvfp4(torch.zeros(0, 32), flavor="torchao", single_level=single)
        assert q.codes.shape == (0, 32) and q.scales.shape == (0, 2)
    assert quantize_nvfp4(torch.zeros(0, 32)).global_scale == 1.0  # TE: amax 0 -> S_enc 1


def test_empty_batches_through_te_current_and_delayed_scaling():
    """TE ``compute_scale_from_amax`` (``common/recipe/recipe_common.cuh``): amax 0 -> scale 1, so an empty
    batch keeps scale_inv 1 (the old code refused with an internal shape message)."""
    from fp8sim.scaling.current import quantize_current_scaling
    from fp8sim.scaling.delayed import DelayedScaler

    for shape in [(0, 16), (0,), (4, 0)]:
        q = quantize_current_scaling(np.zeros(shape, np.float32))
        assert q.codes.shape == shape and q.scales.reshape(-1).tolist() == [1.0]
        assert q.dequantize().shape == shape
        d = DelayedScaler().quantize(0, np.zeros(shape, np.float32))
        assert d.codes.shape == shape


# -- 0-d input and torch.compile (issue 18 item 11) ----------------------------------------------------


def test_float8linear_on_0d_input_raises_nn_linears_message():
    ours, _ = _pair("tensorwise")
    msgs = []
    for mod in (ours[0], nn.Linear(32, 16)):
        with pytest.raises(RuntimeError) as info:
            mod(torch.tensor(1.0))
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("recipe", RECIPES)
def test_torch_compile_of_float8linear_gives_eager_bits(recipe):
    """The emulated casts run in numpy: the forward is a compile graph break, so compiled == eager."""
    ours, _ = _pair(recipe)
    compiled_model = copy.deepcopy(ours)
    compiled = torch.compile(compiled_model, backend="aot_eager")
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(4))
    want = _step(ours, x, None)
    xg = x.clone().requires_grad_(True)
    y = compiled(xg)
    y.float().square().sum().backward()
    got = {"output": y.detach(), "grad_input": xg.grad}
    got.update({n: p.grad for n, p in compiled_model.named_parameters()})
    _assert_equal(got, want)


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("axiswise", [False, True], ids=["tensorwise", "axiswise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("target", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_float8linear_cast_in_torch_ops_equals_the_numpy_reference(target, dtype, axiswise, pow2) -> None:
    """Float8Linear casts with torch ops (torchao's own definition, for speed); its codes and scales must be
    those of fp8sim's independent numpy reference ``quantize_torchao`` (ml_dtypes encode), including
    NaN/Inf, overflow to the clamp, subnormals and zero rows."""
    from fp8sim.torchao.linear import _cast_in_torch_ops

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(24, 40, generator=gen) * torch.logspace(-12, 6, 40)
    x[3, 5], x[4, 6], x[5] = float("nan"), float("-inf"), 0.0
    x[6, :] = torch.tensor(1e-30)
    x = x.to(dtype)
    fmt = get_format("e4m3" if target == torch.float8_e4m3fn else "e5m2")
    got = _cast_in_torch_ops(x, target, fmt, axiswise, 0 if axiswise else -1, pow2)
    ref = quantize_torchao(x, fmt, granularity="axiswise" if axiswise else "tensorwise", axiswise_dim=0,
                           round_scales_to_power_of_2=pow2)  # fmt: skip
    assert np.array_equal(got.codes.numpy(), np.asarray(ref.codes))
    ref_scale = np.asarray(ref.scales, np.float32).reshape(got.scale.shape)
    assert np.array_equal(got.scale.numpy().view(np.uint32), ref_scale.view(np.uint32))
