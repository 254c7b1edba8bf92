"""``prepare_fp8`` against ``accelerate.Accelerator(...).prepare`` itself (spec 7.5).

The oracle is accelerate 1.15's Accelerator on this CPU with fp8sim standing in for the FP8
libraries (``fp8sim.pytorch`` / ``fp8sim.recipe`` as TransformerEngine, ``fp8sim.torchao`` as
``torchao.float8``; availability checks bypassed).  A model prepared both ways must train and
evaluate bit for bit alike, with the same wrappers in the same order; backend choice and every
error must match upstream's.
"""

from __future__ import annotations

import copy
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
accelerate = require("accelerate")
acc_mod = require("accelerate.accelerator")
adc = require("accelerate.utils.dataclasses")
astate = require("accelerate.state")
ute = require("accelerate.utils.transformer_engine")

from torch import nn  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
import fp8sim.pytorch as fpt  # noqa: E402
import fp8sim.recipe as fr  # noqa: E402
import fp8sim.torchao as fs  # noqa: E402
from fp8sim.accelerate import _available  # noqa: E402

ENV = ("ACCELERATE_FP8_BACKEND", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """A factory for real Accelerators running on fp8sim; accelerate's singletons are reset afterwards."""
    te, common = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.common")
    pt, fp8 = types.ModuleType("transformer_engine.pytorch"), types.ModuleType("transformer_engine.pytorch.fp8")
    pt.__dict__.update({name: getattr(fpt, name) for name in fpt.__all__})
    pt.TransformerLayer = type("TransformerLayer", (nn.Module,), {})
    fp8.check_mxfp8_support = lambda: (True, "")
    common.recipe, te.common, te.pytorch, pt.fp8 = fr, common, pt, fp8
    ao = types.ModuleType("torchao.float8")
    ao.__dict__.update({name: getattr(fs, name) for name in fs.__all__})
    modules = {
        "transformer_engine": te,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": fr,
        "transformer_engine.pytorch": pt,
        "transformer_engine.pytorch.fp8": fp8,
        "torchao.float8": ao,
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for module in (acc_mod, ute, adc, astate):
        for name in ("is_transformer_engine_available", "is_fp8_available"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda: True)
    astate.AcceleratorState._reset_state(True)
    astate.GradientState._reset_state()
    yield lambda **kwargs: accelerate.Accelerator(**kwargs)
    astate.AcceleratorState._reset_state(True)
    astate.GradientState._reset_state()


def _upstream_handlers(handlers: list) -> list:
    """The same handlers as accelerate classes (fields copied; no re-validation surprises)."""
    out = []
    for h in handlers:
        cls = getattr(adc, type(h).__name__)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            out.append(cls(**{k: v for k, v in vars(h).items() if k in cls.__dataclass_fields__}))
    return out


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = [nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)]
    model = nn.Sequential(*layers, nn.Linear(16, 8))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _run(model: nn.Module, optimizer: Any, backward: Callable, steps: int = 3) -> list[torch.Tensor]:
    """Train a few steps, then evaluate: the losses and the eval output."""
    gen = torch.Generator().manual_seed(1)
    out = []
    model.train()
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        out.append(loss.detach())
    model.eval()
    with torch.no_grad():
        out.append(model(torch.randn(8, 32, generator=gen)))
    return out


def _wrapper_chain(forward: Any) -> list[str]:
    """The forward wrappers, outermost first: a function by its code's qualified name, else by its class."""
    names = []
    while forward is not None:
        func = getattr(forward, "__func__", forward)
        code = getattr(func, "__code__", None)
        name = code.co_qualname if code is not None else type(func).__name__
        # mutmut's trampolines rename a mutated function x_NAME__mutmut_orig: the chain is the same
        names.append(re.sub(r"^x_(\w+?)__mutmut_orig\b", r"\1", name))
        forward = getattr(func, "__wrapped__", None)
    return names


def _all(module: nn.Module, fqn: str) -> bool:
    return True


ORACLE_CASES: dict[str, tuple[str, Callable[[], list], dict[str, str]]] = {
    "te_default": ("fp8", lambda: [fa.TERecipeKwargs()], {}),
    "te_history_e4m3": ("fp8", lambda: [fa.TERecipeKwargs(amax_history_len=4, fp8_format="E4M3", margin=1)], {}),
    "te_eval_autocast": ("fp8", lambda: [fa.TERecipeKwargs(use_autocast_during_eval=True)], {}),
    "te_mxfp8": ("fp8", lambda: [fa.TERecipeKwargs(use_mxfp8_block_scaling=True)], {}),
    "te_no_bf16_autocast": ("fp8", lambda: [fa.TERecipeKwargs(), fa.AutocastKwargs(enabled=False)], {}),
    "te_from_env": ("fp8", lambda: [], {"ACCELERATE_FP8_BACKEND": "TE"}),
    "fp8_recipe_kwargs_te": ("fp8", lambda: [fa.FP8RecipeKwargs(backend="te", amax_history_len=8)], {}),
    "ao_default": ("fp8", lambda: [fa.AORecipeKwargs()], {}),
    "ao_auto_detected": ("fp8", lambda: [], {}),
    "ao_rowwise_all_layers": (
        "fp8",
        lambda: [fa.AORecipeKwargs(config=fs.Float8LinearConfig.from_recipe_name("rowwise"), module_filter_func=_all)],
        {},
    ),
    "bf16": ("bf16", lambda: [], {}),
    "no": ("no", lambda: [], {}),
    "no_with_te_env": ("no", lambda: [], {"ACCELERATE_FP8_BACKEND": "TE"}),  # upstream converts anyway
}


@pytest.mark.parametrize("case", list(ORACLE_CASES))
def test_prepare_fp8_trains_and_evaluates_bit_for_bit_like_accelerator(
    case: str, upstream: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed_precision, handlers, env = ORACLE_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    warnings.simplefilter("ignore")  # FP8RecipeKwargs, TE's fp8_autocast and quirk warnings: checked elsewhere

    model, opt = _model()
    acc = upstream(mixed_precision=mixed_precision, kwargs_handlers=_upstream_handlers(handlers()))
    ref_model, ref_opt = acc.prepare(model, opt)
    ref = _run(ref_model, ref_opt, acc.backward)

    model, opt = _model()
    ours_model, ours_opt = fa.prepare_fp8(model, opt, kwargs_handlers=handlers(), mixed_precision=mixed_precision)
    ours = _run(ours_model, ours_opt, lambda loss: loss.backward())

    assert [type(m).__name__ for m in ours_model.modules()] == [type(m).__name__ for m in ref_model.modules()]
    assert _wrapper_chain(ours_model.forward) == _wrapper_chain(ref_model.forward)
    for step, (r, o) in enumerate(zip(ref, ours, strict=True)):
        message = f"step {step}: accelerate {r.flatten()[:4]}, fp8sim {o.flatten()[:4]}"
        assert r.dtype == o.dtype and torch.equal(r, o), message


def test_wrapping_order_is_fp8_autocast_then_fp32_outputs_then_bf16_autocast() -> None:
    """Spec 7.5: fp8_autocast ⊃ convert_outputs_to_fp32 ⊃ torch.autocast(bf16) ⊃ forward."""
    model, opt = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
        model, _ = fa.prepare_fp8(model, opt, kwargs_handlers=[fa.TERecipeKwargs()])
    chain = _wrapper_chain(model.forward)
    assert chain == [
        "contextual_fp8_autocast.<locals>.forward",
        "convert_outputs_to_fp32.<locals>.forward",
        "ConvertOutputsToFp32",
        "autocast_decorator.<locals>.decorate_autocast",
        "Sequential.forward",
    ]
    seen: list = []
    model[6].register_forward_hook(  # the last Linear stays an nn.Linear (dims not multiples of 16)
        lambda m, i, o: seen.append((fpt.is_fp8_enabled(), torch.is_autocast_enabled("cpu"), o.dtype))
    )
    assert model(torch.randn(8, 32)).dtype == torch.float32  # bf16 inside, fp32 outside
    assert seen == [(True, True, torch.bfloat16)]


def test_prepared_model_trains_with_fp8_and_evaluates_without_unless_asked() -> None:
    for use_during_eval in (False, True):
        model, opt = _model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
            handler = fa.TERecipeKwargs(use_autocast_during_eval=use_during_eval, amax_history_len=2)
            model, opt = fa.prepare_fp8(model, opt, kwargs_handlers=[handler])
        assert isinstance(model[0], fpt.Linear) and isinstance(model[2], fpt.LayerNorm)
        assert isinstance(model[5], fpt.Linear) and type(model[6]) is nn.Linear  # (16, 8): dims not multiples of 16
        assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
        seen: list = []
        model[0].register_forward_hook(lambda *_, seen=seen: seen.append(fpt.is_fp8_enabled()))
        before = model[0].weight.detach().clone()
        losses = _run(model, opt, lambda loss: loss.backward(), steps=4)
        assert not torch.equal(before, model[0].weight) and all(torch.isfinite(v).all() for v in losses)
        assert model[0].fp8_gemms["gemm"].fwd.scale[0] != 1.0  # delayed scaling ran
        assert seen == [True] * 4 + [use_during_eval]


# -- backend selection and errors ----------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
            return type(exc).__name__, re.sub(r"<class '[\w.]+\.(\w+)'>", r"<class '\1'>", str(exc))
        return "ok", ""


BACKEND_CASES: dict[str, tuple[Callable[[], list], dict[str, str], str]] = {
    "te_handler": (lambda: [fa.TERecipeKwargs()], {}, "TE"),
    "ao_handler": (lambda: [fa.AORecipeKwargs()], {}, "AO"),
    "msamp_handler": (lambda: [fa.MSAMPRecipeKwargs()], {}, "MSAMP"),
    "ao_beats_te": (lambda: [fa.TERecipeKwargs(), fa.AORecipeKwargs()], {}, "AO"),
    "te_beats_msamp": (lambda: [fa.MSAMPRecipeKwargs(), fa.TERecipeKwargs()], {}, "TE"),
    "fp8_recipe_kwargs_first": (lambda: [fa.AORecipeKwargs(), fa.FP8RecipeKwargs(backend="MSAMP")], {}, "MSAMP"),
    "handler_beats_env": (lambda: [fa.TERecipeKwargs()], {"ACCELERATE_FP8_BACKEND": "AO"}, "TE"),
    "env_te": (lambda: [], {"ACCELERATE_FP8_BACKEND": "TE"}, "TE"),
    "env_msamp": (lambda: [], {"ACCELERATE_FP8_BACKEND": "MSAMP"}, "MSAMP"),
    "auto_detect": (lambda: [], {}, "AO"),
}


@pytest.mark.parametrize("case", list(BACKEND_CASES))
def test_fp8_backend_selection_matches_accelerator(
    case: str, upstream: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers, env, expected = BACKEND_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = upstream(mixed_precision="fp8", kwargs_handlers=_upstream_handlers(handlers())).fp8_backend
        ours = fa.setup_fp8(handlers(), "fp8").fp8_backend
    assert ours.value == theirs.value == expected


def _two_te() -> list:
    return [fa.TERecipeKwargs(), fa.TERecipeKwargs(margin=1)]


ERROR_CASES: dict[str, tuple[str | None, Callable[[], list], dict[str, str]]] = {
    "two_handlers_of_one_class": ("fp8", _two_te, {}),
    "two_ddp_handlers": ("no", lambda: [fa.DistributedDataParallelKwargs(), fa.DistributedDataParallelKwargs()], {}),
    "not_a_handler": ("fp8", lambda: [{"margin": 1}], {}),
    "unknown_backend_env": ("fp8", lambda: [], {"ACCELERATE_FP8_BACKEND": "te"}),
    "unknown_backend_env_without_fp8": ("no", lambda: [], {"ACCELERATE_FP8_BACKEND": "TORCHAO"}),
    "fp8_handler_without_fp8": ("bf16", lambda: [fa.TERecipeKwargs()], {}),
    "unknown_mixed_precision": ("fp4", lambda: [], {}),
    "upper_case_mixed_precision": ("FP8", lambda: [], {}),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_setups_raise_accelerators_exception_and_message(
    case: str, upstream: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed_precision, handlers, env = ERROR_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    up_handlers = handlers() if case == "not_a_handler" else _upstream_handlers(handlers())
    theirs = _outcome(lambda: upstream(mixed_precision=mixed_precision, kwargs_handlers=up_handlers))
    ours = _outcome(lambda: fa.setup_fp8(handlers(), mixed_precision))
    assert ours == theirs and ours[0] != "ok"


def test_no_installed_backend_raises_accelerates_import_error(
    upstream: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("is_torchao_available", "is_transformer_engine_available", "is_msamp_available"):
        monkeypatch.setattr(acc_mod, name, lambda: False)
        monkeypatch.setattr(_available, name, lambda: False)
    monkeypatch.setattr(_available, "is_fp8_available", lambda: True)
    theirs = _outcome(lambda: upstream(mixed_precision="fp8"))
    assert _outcome(lambda: fa.prepare_fp8(*_model())) == theirs
    assert theirs[0] == "ImportError" and "auto-detect backend" in theirs[1]
    monkeypatch.setattr(_available, "is_fp8_available", lambda: False)
    assert _outcome(lambda: fa.prepare_fp8(*_model())) == (
        "ValueError",
        "Using `fp8` precision requires `transformer_engine` or `MS-AMP` to be installed.",
    )


def test_te_backend_needs_the_optimizer_too() -> None:
    model, _ = _model()
    with pytest.raises(ValueError, match="You must pass a model and an optimizer together"):
        fa.prepare_fp8(model, None, kwargs_handlers=[fa.TERecipeKwargs()])


@pytest.mark.parametrize("handler", [fa.MSAMPRecipeKwargs, lambda: fa.FP8RecipeKwargs(backend="MSAMP")])
def test_msamp_backend_says_what_is_not_emulated(handler: Callable[[], Any]) -> None:
    model, opt = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
        handlers = [handler()]
    with pytest.raises(NotImplementedError, match=r"MS-AMP is not emulated.*msamp\.initialize.*O1.*O2"):
        fa.prepare_fp8(model, opt, kwargs_handlers=handlers)
    assert type(model[0]) is nn.Linear  # nothing was touched


def test_fp16_is_not_played() -> None:
    with pytest.raises(NotImplementedError, match="fp16"):
        fa.prepare_fp8(*_model(), mixed_precision="fp16")


def test_documented_switch_reaches_every_helper_in_prepare() -> None:
    """documented=True: "most_recent" reaches the recipe and an odd Linear no longer stops the conversion."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 24), nn.LayerNorm(24))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fa.UpstreamQuirkWarning)
        model, opt = fa.prepare_fp8(model, opt, kwargs_handlers=[fa.TERecipeKwargs()], documented=True)
    seen: list = []
    model[0].register_forward_hook(lambda *_: seen.append(fpt.get_recipe().amax_compute_algo))
    model(torch.randn(16, 32)).sum().backward()
    assert seen == ["most_recent"]
    assert type(model[1]) is nn.Linear and isinstance(model[2], fpt.LayerNorm)
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


def test_ao_backend_converts_the_model_in_place() -> None:
    model, opt = _model()
    twin = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
        fa.prepare_fp8(model, opt, kwargs_handlers=[fa.AORecipeKwargs()])
    assert fa.has_ao_layers(model) and not fa.has_ao_layers(twin)


def _converted_weights(model: nn.Module) -> list[torch.Tensor]:
    return [m.weight.detach().clone() for m in model.modules() if fa.has_ao_layers(m) and hasattr(m, "weight")]


def test_default_ao_recipe_leaves_the_converted_weights_out_of_the_optimizer_as_accelerate_does(
    upstream: Callable[..., Any],
) -> None:
    """Quirk ``ao-converted-weights-not-in-optimizer``: accelerate 1.15 ``Accelerator._prepare_ao``
    (accelerator.py:2077-2103) re-points the optimizer only under FSDP2, and torchao 0.18
    ``Float8Linear.from_float`` (float8_linear.py:326) wraps the weight in a new Parameter when
    ``enable_fsdp_float8_all_gather`` (AORecipeKwargs' default): the real Accelerator never updates
    the converted weights.  fp8sim reproduces that with a warning; ``documented=True`` trains them."""
    warnings.simplefilter("ignore", FutureWarning)
    model, opt = _model()
    acc = upstream(mixed_precision="fp8", kwargs_handlers=_upstream_handlers([fa.AORecipeKwargs()]))
    ref_model, ref_opt = acc.prepare(model, opt)
    start = _converted_weights(ref_model)
    _run(ref_model, ref_opt, acc.backward)
    assert start and all(torch.equal(a, b) for a, b in zip(start, _converted_weights(ref_model), strict=True))

    model, opt = _model()
    with pytest.warns(fa.UpstreamQuirkWarning, match="ao-converted-weights-not-in-optimizer"):
        fa.prepare_fp8(model, opt, kwargs_handlers=[fa.AORecipeKwargs()])
    start = _converted_weights(model)
    _run(model, opt, lambda loss: loss.backward())
    assert all(torch.equal(a, b) for a, b in zip(start, _converted_weights(model), strict=True))

    model, opt = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", fa.UpstreamQuirkWarning)
        fa.prepare_fp8(model, opt, kwargs_handlers=[fa.AORecipeKwargs()], documented=True)
    start = _converted_weights(model)
    _run(model, opt, lambda loss: loss.backward())
    assert not any(torch.equal(a, b) for a, b in zip(start, _converted_weights(model), strict=True))
