"""torchao float8 training edges against torchao 0.18 itself (``torchao/float8/``, ``torchao/utils.py``).

- ``Float8Linear`` on the meta device (shape tracing, deferred init): torchao's forward and backward run there.
- A gradient that arrives as an expanded view (``y.sum().backward()``: strides 0) casts and multiplies as
  torchao's ``emulate=True``.
- ``e4m3_dtype`` / ``e5m2_dtype`` follow torchao's ``is_MI300`` (a ROCm build on gfx940/941/942), checked
  with the device query monkeypatched for both.
- fp8sim's accumulator in ``extra_repr`` and in ``fp8sim explain``'s plan of a scaled GEMM.
"""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
ao = require("torchao.float8")
ao_utils = require("torchao.utils")

from torch import nn  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402
from fp8sim.torchao import config as fs_config  # noqa: E402

RECIPES = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]


def _pair(recipe: str, base: nn.Module) -> tuple[nn.Module, nn.Module]:
    cfg = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=cfg)
    ours = fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe))
    return ours, theirs


@pytest.mark.parametrize("recipe", RECIPES)
def test_forward_and_backward_on_the_meta_device_run_like_torchao(recipe: str) -> None:
    with torch.device("meta"):
        base = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8, bias=False))
    results = []
    for model in _pair(recipe, base):
        x = torch.empty(4, 8, 32, device="meta", requires_grad=True)
        y = model(x)
        y.sum().backward()
        grads = [x.grad, *(p.grad for p in model.parameters())]
        results.append([(t.device, t.dtype, tuple(t.shape)) for t in (y, *grads)])
    assert results[0] == results[1]
    assert results[0][0] == (torch.device("meta"), torch.float32, (4, 8, 8))


@pytest.mark.parametrize("recipe", RECIPES)
def test_an_expanded_output_gradient_gives_torchaos_bits(recipe: str) -> None:
    torch.manual_seed(3)
    base = nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 8))
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(6, 32, generator=g) * torch.exp(2 * torch.randn(6, 32, generator=g))
    got = []
    for model in _pair(recipe, base):
        x = x0.clone().requires_grad_(True)
        (model(x).sum() * 3).backward()  # the last Linear's grad_output: a 0-stride expanded view
        got.append([x.grad, *(p.grad for p in model.parameters())])
    for a, b in zip(*got, strict=True):
        assert_bit_exact(a, b)


@pytest.mark.parametrize(
    "arch", ["gfx940:sramecc+:xnack-", "gfx941", "gfx942:sramecc+:xnack-", "gfx90a:sramecc+:xnack-", "gfx1100"]
)
@pytest.mark.parametrize("hip", ["6.2.41133", None])
def test_mi300_detection_is_torchaos(monkeypatch: pytest.MonkeyPatch, arch: str, hip: str | None) -> None:
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(gcnArchName=arch))
    assert fs_config._is_mi300() is ao_utils.is_MI300()


def test_extra_repr_names_fp8sims_accumulator() -> None:
    assert "accumulator" not in fs.Float8Linear(16, 8).extra_repr()
    assert fs.Float8Linear(16, 8, accumulator="hopper").extra_repr().endswith(", accumulator=hopper")
    from fp8sim.gemm import get_accumulator

    acc = get_accumulator("dequantized_fp32")
    assert fs.Float8Linear(16, 8, accumulator=acc).extra_repr().endswith(f", accumulator={acc.name}")


@pytest.mark.parametrize(
    ("recipe", "scalings"),
    [("tensorwise", ["tensorwise"] * 3), ("rowwise", ["rowwise", "tensorwise", "tensorwise"])],
)
def test_explain_names_each_scaled_mm_calls_scaling(recipe: str, scalings: list[str]) -> None:
    """With a device accumulator each GEMM is torchao's ``addmm_float8_unwrapped`` (float8_ops.py): one
    ``torch._scaled_mm`` with one scale per operand (tensorwise), or per row of ``a`` and column of ``b``
    (rowwise) where ``use_fast_accum`` is set (the output GEMM's default); rowwise without it calls
    ``_scaled_mm`` with unit scales (a tensorwise call) and scales the result afterwards."""
    from fp8sim.gemm.plans import record_plans

    lin = fs.Float8Linear(64, 32, config=fs.Float8LinearConfig.from_recipe_name(recipe), accumulator="hopper")
    x = torch.randn(16, 64, requires_grad=True)
    with record_plans() as rec:
        lin(x).sum().backward()
    assert [(p.role, p.scaling) for p in rec.plans] == list(zip(["fprop", "dgrad", "wgrad"], scalings, strict=True))


class _Block(nn.Module):
    def __init__(self, accumulator: object, recipe: str = "tensorwise") -> None:
        super().__init__()
        cfg = fs.Float8LinearConfig.from_recipe_name(recipe)
        self.proj = fs.Float8Linear(64, 32, config=cfg, accumulator=accumulator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _plans(model: nn.Module, dry: bool = False) -> list:
    from fp8sim.pytorch import record_gemm_plans

    x = torch.randn(16, 64, requires_grad=True)
    with record_gemm_plans(model=model, dry=dry) as rec:
        model(x).sum().backward()
    return rec.plans


@pytest.mark.parametrize(
    ("accumulator", "names"),
    [
        (None, ["torchao emulate"] * 3),
        ("hopper", ["hopper_fast", "hopper_split", "hopper_split"]),
        ("blackwell", ["blackwell"] * 3),
        ("h200", ["hopper_fast", "hopper_split", "hopper_split"]),  # the profile's presets per use_fast_accum
    ],
)
def test_explain_names_the_module_path_and_each_gemms_accumulator(accumulator: object, names: list[str]) -> None:
    plans = _plans(_Block(accumulator), dry=True)
    assert [(p.module, p.role, p.accumulator) for p in plans] == [
        ("proj", role, name) for role, name in zip(["fprop", "dgrad", "wgrad"], names, strict=True)
    ]


def test_explain_of_a_profile_without_a_split_rule_names_each_gemms_formats() -> None:
    """torchao's default recipe casts grad_output to e5m2: dgrad is e5m2 x e4m3, wgrad e5m2 x e4m3
    (grad_output.t() @ input); the profile cannot decide, so the dry plan says which shape it lacks."""
    plans = _plans(_Block("h200"), dry=True)
    assert [(p.split, p.source) for p in plans] == [(None, "unknown")] * 3
    assert "(e4m3 x e4m3 -> float32" in plans[0].note
    assert "(e5m2 x e4m3 -> float32" in plans[1].note and "(e5m2 x e4m3 -> float32" in plans[2].note


def test_explain_of_rowwise_scales_with_a_profile_takes_only_given_splits() -> None:
    from fp8sim.gemm import get_profile
    from fp8sim.gemm.profiles import SplitKUnknownError

    fprop = _plans(_Block("h200", "rowwise"), dry=True)[0]  # rowwise scales with use_fast_accum
    assert (fprop.scaling, fprop.split, fprop.source) == ("rowwise", None, "unknown")
    assert "records the split-K of tensorwise-scaled calls only" in fprop.note
    with pytest.raises(SplitKUnknownError, match="with_splits"):
        _plans(_Block("h200", "rowwise"))
    given = get_profile("h200").with_splits({(16, 32, 64): (2, "contiguous")})
    fprop = _plans(_Block(given, "rowwise"), dry=True)[0]
    assert (fprop.split, fprop.scheme, fprop.source) == (2, "contiguous", "override")


@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_autocast_casts_the_input_first_like_torchao(monkeypatch: pytest.MonkeyPatch, recipe: str) -> None:
    """torchao's forward (float8_linear.py) casts the input to the CUDA autocast dtype when
    ``torch.is_autocast_enabled()`` (CUDA) is on; CUDA autocast is simulated for both libraries (a CPU host
    cannot turn it on), the CPU's left off."""
    cpu_dtype = torch.get_autocast_dtype

    def enabled(device_type: str | None = None) -> bool:
        return device_type in (None, "cuda")

    def dtype(device_type: str) -> torch.dtype:
        return torch.bfloat16 if device_type == "cuda" else cpu_dtype(device_type)

    torch.manual_seed(3)
    base = nn.Sequential(nn.Linear(32, 16))
    x0 = torch.randn(6, 32, generator=torch.Generator().manual_seed(5))
    runs = []
    for model in _pair(recipe, base):
        x = x0.clone().requires_grad_(True)
        with monkeypatch.context() as mp:
            mp.setattr(torch, "is_autocast_enabled", enabled)
            mp.setattr(torch, "get_autocast_dtype", dtype)
            mp.setattr(torch, "get_autocast_gpu_dtype", lambda: torch.bfloat16)
            y = model(x)
            y.float().square().sum().backward()
        runs.append([y.detach(), x.grad, *(p.grad for p in model.parameters())])
    assert runs[1][0].dtype == torch.bfloat16
    for a, b in zip(*runs, strict=True):
        assert a.dtype == b.dtype
        assert_bit_exact(a, b)


def test_a_high_precision_output_gemm_under_cpu_autocast_is_torchs_autocast_mm() -> None:
    """All operands DISABLED: every GEMM is a plain ``torch.mm`` (float8_linear.py), which CPU autocast runs
    in its dtype."""
    off = ao.CastConfig(scaling_type=ao.ScalingType.DISABLED)
    off_ours = fs.CastConfig(scaling_type=fs.ScalingType.DISABLED)
    torch.manual_seed(3)
    base = nn.Linear(32, 16)
    theirs = ao.convert_to_float8_training(
        nn.Sequential(copy.deepcopy(base)),
        config=ao.Float8LinearConfig(
            cast_config_input=off, cast_config_weight=off, cast_config_grad_output=off, emulate=True
        ),
    )
    ours = fs.convert_to_float8_training(
        nn.Sequential(copy.deepcopy(base)),
        config=fs.Float8LinearConfig(
            cast_config_input=off_ours, cast_config_weight=off_ours, cast_config_grad_output=off_ours
        ),
    )
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(5))
    outs = []
    for model in (ours, theirs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(model(x))
    assert outs[1].dtype == torch.bfloat16
    assert_bit_exact(outs[0], outs[1])
