"""fp8sim.torchao against installed torchao 0.18 (spec 6.1, 6.2): configs, module swap, and every
output and gradient bit for bit.

torchao is the oracle: its ``Float8LinearConfig`` for defaults and messages, its
``convert_to_float8_training`` for which modules are swapped, and its ``Float8Linear`` with
``emulate=True`` (float32 dequantize-then-mm, runs on the CPU) for the arithmetic; with
``emulate=False`` on the CPU it calls ``torch._scaled_mm``, the oracle for fp8sim's
``accumulator="dequantized_fp32"`` path.  Zero tolerance throughout.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import io
import logging
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from fp8sim.gemm.torch_cpu import fallback_kernel
from fp8sim.testing.oracles import require

torch = require("torch")
ao = require("torchao.float8")
ao_config = require("torchao.float8.config")
ao_linear = require("torchao.float8.float8_linear")

from torch import nn  # noqa: E402

import fp8sim.torchao as fs  # noqa: E402
from fp8sim.testing import assert_bit_exact  # noqa: E402

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
DTYPES = (torch.float32, torch.bfloat16)


# -- helpers ------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    """A config as nested plain data: dataclasses by class name and fields, enums by class, name, value."""
    if dataclasses.is_dataclass(obj):
        return (type(obj).__name__, {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, enum.Enum):
        return (type(obj).__name__, obj.name, obj.value)
    return obj


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
        return type(exc).__name__, str(exc)
    return "ok", ""


def _mirror(lib: Any, build: Callable[[Any], Any]) -> Callable[[], Any]:
    return lambda: build(lib)


def _model(dtype: torch.dtype, k: int, n: int, seed: int) -> nn.Module:
    """A nested model: a biased Linear, a ReLU, an unbiased Linear, and a biased Linear in a submodule."""
    torch.manual_seed(seed)
    block = nn.Sequential(nn.Linear(n, 24), nn.GELU())
    return nn.Sequential(nn.Linear(k, n), nn.ReLU(), nn.Linear(n, n, bias=False), block).to(dtype)


def _heavy_tailed(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Finite, NaN-free values spread over ~40 binades (log-normal magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(3.0 * torch.randn(shape, generator=g))
    return x.to(dtype)


def _ao_config(recipe: str, emulate: bool) -> Any:
    return dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)


def _run(model: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """Forward, backward with ``grad``; the output, the input gradient and every parameter gradient."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(grad)
    out = {"output": y.detach(), "grad_input": x.grad}
    out.update({f"{name}.grad": p.grad for name, p in model.named_parameters()})
    return out


def _assert_runs_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        try:
            assert_bit_exact(got[key], want[key])
        except AssertionError as exc:
            raise AssertionError(f"{key}: {exc}") from None


# -- configs (spec 6.1) -------------------------------------------------------------------------


def test_enums_have_torchao_names_and_values() -> None:
    for ours, theirs in (
        (fs.ScalingType, ao_config.ScalingType),
        (fs.ScalingGranularity, ao_config.ScalingGranularity),
        (fs.Float8LinearRecipeName, ao_config.Float8LinearRecipeName),
    ):
        assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]
    for member in [*fs.ScalingType, *fs.ScalingGranularity]:
        assert member.short_str() == getattr(ao_config, type(member).__name__)(member.value).short_str()


@pytest.mark.parametrize("cls", ["CastConfig", "Float8GemmConfig", "Float8LinearConfig"])
def test_config_defaults_and_field_order_equal_torchao(cls: str) -> None:
    ours, theirs = getattr(fs, cls)(), getattr(ao, cls)()
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    assert _plain(ours) == _plain(theirs)
    assert type(ours).__dataclass_params__.frozen == type(theirs).__dataclass_params__.frozen


@pytest.mark.parametrize("recipe", RECIPES)
def test_from_recipe_name_equals_torchao(recipe: str) -> None:
    want = _plain(ao.Float8LinearConfig.from_recipe_name(recipe))
    assert _plain(fs.Float8LinearConfig.from_recipe_name(recipe)) == want
    assert _plain(fs.Float8LinearConfig.from_recipe_name(fs.Float8LinearRecipeName(recipe))) == want


def test_post_init_fills_target_dtypes_in_place_like_torchao() -> None:
    """torchao writes the default dtypes into the CastConfig objects it is given (spec 6.1)."""
    for lib in (fs, ao):
        ci, cgo = lib.CastConfig(), lib.CastConfig()
        cfg = lib.Float8LinearConfig(cast_config_input=ci, cast_config_grad_output=cgo)
        assert ci.target_dtype == torch.float8_e4m3fn and cgo.target_dtype == torch.float8_e5m2
        assert cfg.cast_config_input_for_grad_weight is ci and cfg.cast_config_grad_output_for_grad_weight is cgo


BAD_CONFIGS: dict[str, Callable[[Any], Any]] = {
    "axiswise_needs_dynamic": lambda L: L.CastConfig(
        scaling_type=L.ScalingType.DISABLED, scaling_granularity=L.ScalingGranularity.AXISWISE
    ),
    "target_dtype_not_8bit_float": lambda L: L.CastConfig(target_dtype=torch.float16),
    "target_dtype_int8": lambda L: L.CastConfig(target_dtype=torch.int8),
    "fsdp_all_gather_needs_tensorwise_weight": lambda L: L.Float8LinearConfig(
        cast_config_weight=L.CastConfig(scaling_granularity=L.ScalingGranularity.AXISWISE),
        enable_fsdp_float8_all_gather=True,
    ),
    "incompatible_output": lambda L: L.Float8LinearConfig(
        cast_config_input=L.CastConfig(scaling_type=L.ScalingType.DISABLED)
    ),
    "incompatible_grad_input": lambda L: L.Float8LinearConfig(
        cast_config_weight_for_grad_input=L.CastConfig(scaling_type=L.ScalingType.DISABLED)
    ),
    "incompatible_grad_weight": lambda L: L.Float8LinearConfig(
        cast_config_input_for_grad_weight=L.CastConfig(scaling_type=L.ScalingType.DISABLED)
    ),
    "input_dtype_mismatch": lambda L: L.Float8LinearConfig(
        cast_config_input=L.CastConfig(target_dtype=torch.float8_e5m2),
        cast_config_input_for_grad_weight=L.CastConfig(target_dtype=torch.float8_e4m3fn),
    ),
    "grad_output_dtype_mismatch": lambda L: L.Float8LinearConfig(
        cast_config_grad_output_for_grad_weight=L.CastConfig(target_dtype=torch.float8_e4m3fn)
    ),
    "unknown_recipe": lambda L: L.Float8LinearConfig.from_recipe_name("rowwise_fast"),
    "unknown_recipe_enum_value": lambda L: L.Float8LinearRecipeName("mxfp8"),
    "good_config_all_disabled": lambda L: L.Float8LinearConfig(
        cast_config_input=L.CastConfig(scaling_type=L.ScalingType.DISABLED),
        cast_config_weight=L.CastConfig(scaling_type=L.ScalingType.DISABLED),
        cast_config_grad_output=L.CastConfig(scaling_type=L.ScalingType.DISABLED),
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_validation_raises_torchao_exception_and_message(case: str) -> None:
    build = BAD_CONFIGS[case]
    want = _outcome(_mirror(ao, build))
    assert _outcome(_mirror(fs, build)) == want
    assert (want[0] == "ok") == case.startswith("good")


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        fs.Float8LinearConfig().emulate = True  # type: ignore[misc]


def test_force_recompute_fp8_weight_in_bwd_logs_torchao_deprecation(caplog: pytest.LogCaptureFixture) -> None:
    messages = []
    for lib in (ao, fs):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            lib.Float8LinearConfig(force_recompute_fp8_weight_in_bwd=True)
        messages.append([(r.levelname, r.getMessage()) for r in caplog.records])
    assert messages[0] == messages[1] and len(messages[0]) == 1


# -- module swap --------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32, bias=False)) for _ in range(2)]
        )
        self.attn = nn.MultiheadAttention(32, 2)  # out_proj is an nn.Linear subclass
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 8)


def _swap_log(lib: Any, model: nn.Module) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def keep(mod: nn.Module, fqn: str) -> bool:
        calls.append((type(mod).__name__, fqn))
        return "blocks.1" not in fqn and fqn != "head"

    out = lib.convert_to_float8_training(model, module_filter_fn=keep, config=lib.Float8LinearConfig(emulate=True))
    swapped = [(name, type(m).__name__) for name, m in out.named_modules() if isinstance(m, nn.Linear)]
    return calls, swapped


def test_convert_swaps_the_same_modules_in_the_same_order_as_torchao() -> None:
    torch.manual_seed(0)
    base = _Net()
    want_calls, want = _swap_log(ao, copy.deepcopy(base))
    got_calls, got = _swap_log(fs, copy.deepcopy(base))
    assert got_calls == want_calls  # post-order, Linears only, called as (module, fqn)
    assert [n for n, t in got if t == "Float8Linear"] == [n for n, t in want if t == "Float8Linear"]
    assert [n for n, t in got if t != "Float8Linear"] == [n for n, t in want if t != "Float8Linear"]
    assert {n for n, t in got if t == "Float8Linear"} == {"embed", "blocks.0.0", "blocks.0.2", "attn.out_proj"}


def test_convert_root_linear_is_returned_not_swapped_in_place() -> None:
    lin = nn.Linear(16, 8)
    out = fs.convert_to_float8_training(lin)
    assert type(out) is fs.Float8Linear and type(lin) is nn.Linear
    assert out.weight is lin.weight and out.bias is lin.bias  # shares the Parameters, as torchao
    kept = fs.convert_to_float8_training(lin, module_filter_fn=lambda m, fqn: False)
    assert kept is lin and type(kept) is nn.Linear


def test_root_linear_with_children_raises_torchao_message() -> None:
    class LinearWithChild(nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)
            self.extra = nn.ReLU()

    mod = LinearWithChild()
    want = _outcome(lambda: ao.convert_to_float8_training(mod))
    assert want[0] == "AssertionError"
    assert _outcome(lambda: fs.convert_to_float8_training(mod)) == want


def test_extra_repr_matches_torchao() -> None:
    for recipe in RECIPES:
        lin = nn.Linear(16, 8)
        ours = fs.convert_to_float8_training(lin, config=fs.Float8LinearConfig.from_recipe_name(recipe))
        theirs = ao.convert_to_float8_training(lin, config=ao.Float8LinearConfig.from_recipe_name(recipe))
        assert ours.extra_repr() == theirs.extra_repr().rstrip('"')  # torchao's ends with a stray quote


# -- arithmetic against torchao emulate=True (spec 6.2) -----------------------------------------

# (in_features, out_features, input shape, heavy-tailed input)
SHAPES = [
    (32, 48, (8, 32), False),
    (64, 16, (2, 8, 64), False),
    (33, 20, (5, 33), True),
    (128, 96, (3, 11, 128), True),
]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("k", "n", "shape", "heavy"), SHAPES, ids=["8x32x48", "2x8x64x16", "5x33x20-heavy", "3x11x128x96-heavy"]
)
def test_forward_and_every_gradient_equal_torchao_emulate(
    recipe: str, dtype: torch.dtype, k: int, n: int, shape: tuple[int, ...], heavy: bool
) -> None:
    base = _model(dtype, k, n, seed=k * 100 + n)
    x = _heavy_tailed(shape, dtype, seed=1) if heavy else torch.randn(shape, generator=torch.Generator().manual_seed(1))
    x = x.to(dtype)
    grad = _heavy_tailed((*shape[:-1], 24), dtype, seed=2)
    want = _run(ao.convert_to_float8_training(copy.deepcopy(base), config=_ao_config(recipe, True)), x, grad)
    ours = fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe))
    assert sum(isinstance(m, fs.Float8Linear) for m in ours.modules()) == 3
    _assert_runs_equal(_run(ours, x, grad), want)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("special", ["nan", "inf", "zeros"])
def test_nan_inf_and_zero_inputs_propagate_like_torchao(recipe: str, special: str) -> None:
    """amax NaN -> NaN scale; amax Inf -> scale 0 (Inf * 0 = NaN); amax 0 -> scale 448e12 (spec 6.2)."""
    base = _model(torch.float32, 32, 16, seed=11)
    x = torch.zeros(6, 32) if special == "zeros" else torch.randn(6, 32, generator=torch.Generator().manual_seed(4))
    if special != "zeros":
        x[2, 5] = float(special)
    grad = _heavy_tailed((6, 24), torch.float32, seed=8)
    want = _run(ao.convert_to_float8_training(copy.deepcopy(base), config=_ao_config(recipe, True)), x, grad)
    ours = fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe))
    _assert_runs_equal(_run(ours, x, grad), want)


def test_input_without_grad_and_no_grad_inference_equal_torchao() -> None:
    base = _model(torch.bfloat16, 32, 32, seed=7)
    x = torch.randn(6, 32).to(torch.bfloat16)
    ours = fs.convert_to_float8_training(copy.deepcopy(base))
    theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=_ao_config("tensorwise", True))
    with torch.no_grad():
        y_ours, y_theirs = ours(x), theirs(x)
    assert not y_ours.requires_grad
    assert_bit_exact(y_ours, y_theirs)
    for model in (ours, theirs):
        model(x).float().square().sum().backward()  # x needs no gradient; the weights do
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert_bit_exact(p.grad, q.grad)


def test_state_dict_round_trips_with_nn_linear_and_torchao() -> None:
    base = _model(torch.float32, 16, 32, seed=3)
    ours = fs.convert_to_float8_training(copy.deepcopy(base))
    theirs = ao.convert_to_float8_training(copy.deepcopy(base), config=_ao_config("tensorwise", True))
    assert list(ours.state_dict()) == list(base.state_dict()) == list(theirs.state_dict())
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    plain = _model(torch.float32, 16, 32, seed=99)
    plain.load_state_dict(torch.load(buf))
    fresh = fs.convert_to_float8_training(_model(torch.float32, 16, 32, seed=98))
    fresh.load_state_dict(theirs.state_dict())
    for sd in (plain.state_dict(), fresh.state_dict()):
        for key, value in base.state_dict().items():
            assert_bit_exact(sd[key], value)
    x = torch.randn(4, 16)
    assert_bit_exact(fresh(x), theirs(x))


def test_unsupported_target_dtype_raises_torchao_message_at_cast() -> None:
    def build(lib: Any) -> Callable[[], Any]:
        cc = lib.CastConfig(target_dtype=torch.float8_e8m0fnu)
        cfg = lib.Float8LinearConfig(cast_config_input=cc, cast_config_input_for_grad_weight=cc, emulate=True)
        model = lib.convert_to_float8_training(nn.Sequential(nn.Linear(16, 16)), config=cfg)
        return lambda: model(torch.randn(2, 16))

    want = _outcome(build(ao))
    assert want == ("ValueError", "Unsupported float8_dtype: torch.float8_e8m0fnu")
    assert _outcome(build(fs)) == want


# -- fp8sim accumulators (spec 6.2 addmm_float8_unwrapped, 9.2) -----------------------------------


# (input shape, in_features, pad_inner_dim)
CPU_SCALED_MM_CASES = [((2, 8, 32), 32, False), ((2, 8, 40), 40, True), ((5, 33), 33, False)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("shape", "k", "pad"), CPU_SCALED_MM_CASES, ids=["2x8x32", "2x8x40-pad", "5x33"])
def test_dequantized_fp32_accumulator_equals_torchao_cpu_scaled_mm(
    request: pytest.FixtureRequest, recipe: str, dtype: torch.dtype, shape: tuple[int, ...], k: int, pad: bool
) -> None:
    """accumulator="dequantized_fp32" runs torchao's non-emulated GEMM glue (reciprocal scales, tensorwise
    scales expanded against axiswise ones, rowwise post-scaling, the bf16 detour, pad_inner_dim) through
    fp8sim.gemm.scaled_mm; torchao emulate=False on the CPU calls torch._scaled_mm with the same operands."""
    base = _model(dtype, k, 48, seed=5)
    x = _heavy_tailed(shape, dtype, seed=3)
    grad = _heavy_tailed((*shape[:-1], 24), dtype, seed=4)
    ao_cfg = dataclasses.replace(_ao_config(recipe, False), pad_inner_dim=pad)
    with fallback_kernel():  # the kernel dequantized_fp32 models; AMX hosts run oneDNN (fp8sim.gemm.torch_cpu)
        want = _run(ao.convert_to_float8_training(copy.deepcopy(base), config=ao_cfg), x, grad)
    cfg = dataclasses.replace(fs.Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=pad)
    ours = fs.convert_to_float8_training(copy.deepcopy(base), config=cfg, accumulator="dequantized_fp32")
    _assert_runs_equal(_run(ours, x, grad), want)


@pytest.mark.parametrize("pad", [False, True])
def test_pad_inner_dim_pads_each_gemms_k_as_torchao(pad: bool) -> None:
    """``Float8LinearConfig(pad_inner_dim=True)``: torchao's ``preprocess_addmm`` pads both operands' inner
    dimension with ``pad_tensor_for_matmul`` (to a multiple of 16) before ``torch._scaled_mm``; the GEMM plans
    fp8sim records carry that K (fprop K = 40, dgrad 24, wgrad 20: none a multiple of 16)."""
    from fp8sim.pytorch import record_gemm_plans

    pad_fn = require("torchao.float8.float8_utils").pad_tensor_for_matmul
    cfg = dataclasses.replace(fs.Float8LinearConfig(), pad_inner_dim=pad)
    lin = fs.Float8Linear.from_float(nn.Linear(40, 24, bias=False), config=cfg, accumulator="hopper")
    x = torch.randn(20, 40, requires_grad=True)
    with record_gemm_plans(model=lin, dry=True) as rec:
        lin(x).sum().backward()
    raw = {"fprop": 40, "dgrad": 24, "wgrad": 20}
    want = {r: pad_fn(torch.zeros(1, k), dims=1).shape[1] if pad else k for r, k in raw.items()}
    assert {p.role: p.k for p in rec.plans} == want
    assert not pad or all(want[r] != raw[r] for r in raw)


def test_hopper_accumulator_uses_fast_for_output_and_split_for_gradients() -> None:
    """accumulator="hopper" follows each GEMM's use_fast_accum (spec 4.7): output fast, both
    gradient GEMMs split (K = 192 and 160 rows, so promotion every 128 matters); the attribute can be
    changed after conversion."""
    base = nn.Linear(256, 192).to(torch.bfloat16)
    x = _heavy_tailed((160, 256), torch.bfloat16, seed=5)
    grad = _heavy_tailed((160, 192), torch.bfloat16, seed=6)
    model = fs.convert_to_float8_training(copy.deepcopy(base), accumulator="hopper")
    runs = {"hopper": _run(model, x, grad)}
    for acc in ("hopper_fast", "hopper_split", None):
        model.accumulator = acc
        model.weight.grad = model.bias.grad = None
        runs[acc] = _run(model, x, grad)
    assert_bit_exact(runs["hopper"]["output"], runs["hopper_fast"]["output"])
    for key in ("grad_input", "weight.grad", "bias.grad"):
        assert_bit_exact(runs["hopper"][key], runs["hopper_split"][key])
    for key in ("output", "grad_input", "weight.grad"):  # the checks above are not vacuous
        assert not torch.equal(runs["hopper_fast"][key], runs["hopper_split"][key]), key
        assert not torch.equal(runs["hopper_fast"][key], runs[None][key]), key


def test_unknown_accumulator_raises_fp8sim_message() -> None:
    with pytest.raises(ValueError, match="unknown accumulator 'hopper_slow'; known: exact"):
        fs.convert_to_float8_training(nn.Linear(4, 4), accumulator="hopper_slow")


def test_importable_and_runs_without_torchao() -> None:
    code = (
        "import sys; sys.modules['torchao'] = None\n"
        "import torch, fp8sim.torchao as fs\n"
        "m = fs.convert_to_float8_training(torch.nn.Sequential(torch.nn.Linear(16, 8)),"
        " config=fs.Float8LinearConfig.from_recipe_name('rowwise'))\n"
        "m(torch.randn(4, 16, requires_grad=True)).sum().backward()\n"
        "assert not [k for k in sys.modules if k.startswith('torchao') and sys.modules[k] is not None]\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_import_without_torch_raises_a_clear_error() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import fp8sim.torchao\nexcept ImportError as e:\n    print(e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "fp8sim.torchao needs torch (pip install torch); torchao itself is not required"


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["no_autocast", "ac_bf16"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_two_steps_on_3d_input_equal_torchao_bits(recipe: str, autocast: torch.dtype | None) -> None:
    """A 3-D input whose flattened rows (200) are no multiple of 16, two optimizer steps: output and every
    gradient bit-equal to torchao's ``Float8Linear(emulate=True)`` (``float8_linear.py``,
    ``matmul_with_hp_or_float8_args``).  Covers the casts fp8sim keeps from the forward for the backward
    (tensorwise) and the transposed operands it casts through their contiguous transpose."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(96, 80), nn.Linear(80, 48))
    cfg = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    models = [
        fs.convert_to_float8_training(copy.deepcopy(base), config=fs.Float8LinearConfig.from_recipe_name(recipe)),
        ao.convert_to_float8_training(copy.deepcopy(base), config=cfg),
    ]
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in models]
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        x0 = torch.randn(4, 50, 96, generator=gen)
        got = []
        for m, opt in zip(models, opts, strict=True):
            x = x0.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                y = m(x)
            opt.zero_grad()
            y.float().square().mean().backward()
            got.append([y.detach(), x.grad, *(p.grad.clone() for p in m.parameters())])
            opt.step()
        for ours, theirs in zip(*got, strict=True):
            assert ours.dtype == theirs.dtype
            assert_bit_exact(ours, theirs)


def test_autocast_dtype_is_read_per_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """The output dtype follows the autocast of the input's device type (``torch.get_autocast_dtype``,
    torch >= 2.4); without that API, torch's older CPU/CUDA functions give the same answer."""
    from fp8sim.torchao import linear

    assert linear._autocast_dtype("cpu") is None
    with torch.autocast("cpu", dtype=torch.float16):
        assert linear._autocast_dtype("cpu") is torch.float16
        assert linear._autocast_dtype("cuda") is None
        assert linear._autocast_dtype("not_a_device") is None
        with monkeypatch.context() as mp:
            mp.delattr(torch, "get_autocast_dtype")
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch 2.4+ deprecates the old functions
                assert linear._autocast_dtype("cpu") is torch.float16
                assert linear._autocast_dtype("cuda") is None


# -- issue 29.7: double backward (create_graph=True) as torchao 0.18 does it -------------------------------
def _double_backward(convert: Callable, recipe: str, wrt: str) -> dict:
    """First gradients with create_graph=True, then a second backward; what happened, and the grads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32))
    convert(model, recipe)
    x = torch.randn(16, 32, requires_grad=True)
    w = model[0].weight
    inputs = {"x": (x,), "w": (w,), "both": (x, w)}[wrt]
    gs = torch.autograd.grad(model(x).square().sum(), inputs, create_graph=True)
    out: dict = {"requires_grad": [g.requires_grad for g in gs], "first": [g.detach() for g in gs]}
    try:
        sum(g.square().sum() for g in gs).backward()
    except Exception as e:  # noqa: BLE001 - torchao's exception is the oracle
        out["error"] = (type(e), str(e))
    else:
        out["second"] = (x.grad, w.grad)
    return out


@pytest.mark.parametrize("emulate", [True, False], ids=["emulate", "scaled_mm"])
@pytest.mark.parametrize("wrt", ["x", "w", "both"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_double_backward_builds_torchaos_graph_then_raises_its_error(recipe: str, wrt: str, emulate: bool) -> None:
    """torchao 0.18 records its backward float8 ``mm`` (the gradient has a graph); the second backward then
    asserts in ``float8_mm``.  A high-precision GEMM (``rowwise_with_gw_hp``'s wgrad) differentiates twice.
    The values are compared with torchao's emulate=True arithmetic (fp8sim's default); emulate=False (its
    CPU ``torch._scaled_mm``) only for what happens."""

    def theirs(m: nn.Module, r: str) -> None:
        ao.convert_to_float8_training(m, config=_ao_config(r, emulate))

    def ours(m: nn.Module, r: str) -> None:
        fs.convert_to_float8_training(m, config=fs.Float8LinearConfig.from_recipe_name(r))

    want, got = _double_backward(theirs, recipe, wrt), _double_backward(ours, recipe, wrt)
    assert got["requires_grad"] == want["requires_grad"] == [True] * len(want["first"])
    assert ("error" in got) == ("error" in want)
    if "error" in want:
        assert got["error"] == want["error"]
    if emulate:
        for g, w in zip(got["first"], want["first"], strict=True):
            assert_bit_exact(g, w)
        for g, w in zip(got.get("second", ()), want.get("second", ()), strict=True):
            assert_bit_exact(g, w)
