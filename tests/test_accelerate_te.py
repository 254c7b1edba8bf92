"""fp8sim.accelerate's TransformerEngine helpers against accelerate 1.15's own (spec 7.3, 7.4).

The oracle is accelerate's ``utils/transformer_engine.py`` itself, run with fp8sim standing in for
TransformerEngine (``fp8sim.pytorch`` as ``transformer_engine.pytorch``, ``fp8sim.recipe`` as
``transformer_engine.common.recipe``, MXFP8 reported supported) and its TE availability check
bypassed.  So the modules, the recipe and each error must come out the same; where upstream
departs from its documentation fp8sim must warn, and ``documented=True`` must do what is documented.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from _outcomes import outcome

from fp8sim.testing.oracles import require

torch = require("torch")
ute = require("accelerate.utils.transformer_engine")
adc = require("accelerate.utils.dataclasses")

from torch import nn  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
import fp8sim.pytorch as fpt  # noqa: E402
import fp8sim.recipe as fr  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:fp8_autocast is deprecated:DeprecationWarning"),  # upstream calls TE's shim
    pytest.mark.filterwarnings("ignore::fp8sim.accelerate.UpstreamQuirkWarning"),  # asserted where it matters
]


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Any:
    """accelerate's TE helpers, running on fp8sim in place of transformer_engine."""
    pkg, common = types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.common")
    pt, fp8 = types.ModuleType("transformer_engine.pytorch"), types.ModuleType("transformer_engine.pytorch.fp8")
    pt.__dict__.update({name: getattr(fpt, name) for name in fpt.__all__})
    pt.TransformerLayer = type("TransformerLayer", (nn.Module,), {})  # TE has one; fp8sim does not
    fp8.check_mxfp8_support = lambda: (True, "")
    common.recipe, pkg.common, pkg.pytorch, pt.fp8 = fr, common, pt, fp8
    modules = {
        "transformer_engine": pkg,
        "transformer_engine.common": common,
        "transformer_engine.common.recipe": fr,
        "transformer_engine.pytorch": pt,
        "transformer_engine.pytorch.fp8": fp8,
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(ute, "is_transformer_engine_available", lambda: True)
    # accelerate's GatheredParameters asks for an AcceleratorState; without DeepSpeed ZeRO-3 it is a no-op
    monkeypatch.setattr(ute, "GatheredParameters", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(adc, "is_transformer_engine_available", lambda: True)
    return ute


_outcome = outcome


def _layout(model: nn.Module) -> list[tuple[str, str, list]]:
    """Every module's name, class and parameters (values), to compare two conversions exactly."""
    out = []
    for name, m in model.named_modules():
        params = [(n, p.dtype, p.detach().clone()) for n, p in m.named_parameters(recurse=False)]
        out.append((name, f"{type(m).__module__}.{type(m).__qualname__}", params))
    return out


def _same_layout(a: nn.Module, b: nn.Module) -> bool:
    la, lb = _layout(a), _layout(b)
    if [x[:2] for x in la] != [x[:2] for x in lb]:
        return False
    for (_, _, pa), (_, _, pb) in zip(la, lb, strict=True):
        if [(n, d) for n, d, _ in pa] != [(n, d) for n, d, _ in pb]:
            return False
        if not all(torch.equal(x, y) for (*_, x), (*_, y) in zip(pa, pb, strict=True)):
            return False
    return True


class Block(nn.Module):
    def __init__(self, odd: int = 16) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.up = nn.Linear(32, odd)
        self.down = nn.Linear(odd, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.ln(x))))


def _models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "all_multiples_of_16": nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 48)),
        "odd_linear_then_siblings": nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 20), nn.LayerNorm(20), Block()),
        "nested_odd_block": nn.Sequential(Block(odd=24), Block(), nn.Linear(32, 16)),
        "bf16_params": nn.Sequential(nn.Linear(32, 32, dtype=torch.bfloat16), nn.LayerNorm(32, dtype=torch.bfloat16)),
    }


# -- convert_model ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(_models()))
def test_convert_model_matches_accelerate_module_for_module(name: str, upstream: Any) -> None:
    model = _models()[name]
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
        fa.convert_model(ours)
        upstream.convert_model(theirs)
    assert _same_layout(ours, theirs)
    assert fa.has_transformer_engine_layers(ours) == upstream.has_transformer_engine_layers(theirs) is True


def test_convert_model_early_return_quirk_warns_and_documented_converts_the_rest(upstream: Any) -> None:
    """Spec 7.4: Linear(32, 20) ends the loop, so the LayerNorm and Block after it stay nn modules."""
    model = _models()["odd_linear_then_siblings"]
    with torch.no_grad(), pytest.warns(fa.UpstreamQuirkWarning, match="convert_model-early-return"):
        fa.convert_model(model)
    assert isinstance(model[0], fpt.Linear) and type(model[1]) is nn.Linear
    assert type(model[2]) is nn.LayerNorm and type(model[3].up) is nn.Linear

    model = _models()["odd_linear_then_siblings"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", fa.UpstreamQuirkWarning)
        fa.convert_model(model, documented=True)
    assert type(model[1]) is nn.Linear  # the odd one is skipped, the rest converted
    assert isinstance(model[2], fpt.LayerNorm) and isinstance(model[3].up, fpt.Linear)


def test_convert_model_outside_no_grad_fails_as_upstream(upstream: Any) -> None:
    ours, theirs = _models()["all_multiples_of_16"], _models()["all_multiples_of_16"]
    assert _outcome(lambda: fa.convert_model(ours)) == _outcome(lambda: upstream.convert_model(theirs))


def test_convert_model_back_raises_typeerror_as_upstream_and_documented_converts_back(upstream: Any) -> None:
    model = _models()["all_multiples_of_16"]
    with torch.no_grad():
        fa.convert_model(model)
        twin = copy.deepcopy(model)
        ours = _outcome(lambda: fa.convert_model(model, to_transformer_engine=False))
        theirs = _outcome(lambda: upstream.convert_model(twin, to_transformer_engine=False))
        assert ours == theirs and ours[0] == "TypeError"
        with pytest.warns(fa.UpstreamQuirkWarning, match="reverse-params_dtype"), pytest.raises(TypeError):
            fa.convert_model(model, to_transformer_engine=False)
        fa.convert_model(model, to_transformer_engine=False, documented=True)
    assert [type(m) for m in model] == [nn.Linear, nn.GELU, nn.LayerNorm, nn.Linear]
    assert torch.equal(model[0].weight, twin[0].weight)
    assert not fa.has_transformer_engine_layers(model)


def test_has_transformer_engine_layers_counts_only_linear_and_layernorm(upstream: Any) -> None:
    model = nn.Sequential(fpt.LayerNormMLP(32, 64))  # TE's test ignores LayerNormLinear / LayerNormMLP
    assert fa.has_transformer_engine_layers(model) is upstream.has_transformer_engine_layers(model) is False


# -- recipe and autowrap ------------------------------------------------------------------------

HANDLERS: dict[str, Callable[[], Any]] = {
    "none": lambda: None,
    "default": lambda: fa.TERecipeKwargs(),
    "explicit_most_recent": lambda: fa.TERecipeKwargs(amax_compute_algo="most_recent"),
    "max_e4m3_margin": lambda: fa.TERecipeKwargs(amax_compute_algo="max", fp8_format="e4m3", margin=2),
    "history_16": lambda: fa.TERecipeKwargs(amax_history_len=16),
    "interval_2": lambda: fa.TERecipeKwargs(interval=2),
    "wgrad_override": lambda: fa.TERecipeKwargs(override_linear_precision=(False, False, True)),
    "fprop_override": lambda: fa.TERecipeKwargs(override_linear_precision=(True, False, False)),
    "e5m2": lambda: fa.TERecipeKwargs(fp8_format="E5M2"),
    "mxfp8": lambda: fa.TERecipeKwargs(use_mxfp8_block_scaling=True),
    "mxfp8_e4m3_margin": lambda: fa.TERecipeKwargs(use_mxfp8_block_scaling=True, fp8_format="E4M3", margin=1),
    "mxfp8_with_algo": lambda: fa.TERecipeKwargs(use_mxfp8_block_scaling=True, amax_compute_algo="max"),
    "mxfp8_with_history": lambda: fa.TERecipeKwargs(use_mxfp8_block_scaling=True, amax_history_len=8),
    "fp8_recipe_kwargs": lambda: fa.FP8RecipeKwargs(margin=3, fp8_format="E4M3"),
}


def _as_upstream(handler: Any) -> Any:
    """The same settings as an accelerate handler."""
    if handler is None:
        return None
    cls = getattr(adc, type(handler).__name__)
    return cls(**{f.name: getattr(handler, f.name) for f in dataclasses.fields(handler)})


def _plain_recipe(recipe: Any) -> Any:
    fields = {f.name: getattr(recipe, f.name) for f in dataclasses.fields(recipe)}
    return type(recipe).__name__, {k: v.name if isinstance(v, enum.Enum) else v for k, v in fields.items()}


def _recipe_seen_by(wrap: Callable[[nn.Module], Any], training: bool = True) -> tuple[bool, Any]:
    """Wrap a tiny model, run it, and return (FP8 enabled?, the active recipe) as the layer saw them."""
    model = nn.Sequential(nn.Identity())
    seen: list = []
    model[0].register_forward_hook(lambda *_: seen.append((fpt.is_fp8_enabled(), _plain_recipe(fpt.get_recipe()))))
    wrap(model)
    model.train(training)
    model(torch.ones(2))
    return seen[0]


@pytest.mark.parametrize("name", list(HANDLERS))
def test_autowrap_builds_the_recipe_accelerate_builds(name: str, upstream: Any) -> None:
    def ours() -> Any:
        return _recipe_seen_by(lambda m: fa.apply_fp8_autowrap(m, HANDLERS[name]()))

    def theirs() -> Any:
        return _recipe_seen_by(lambda m: upstream.apply_fp8_autowrap(m, _as_upstream(HANDLERS[name]())))

    assert _outcome(ours) == _outcome(theirs)


def test_most_recent_is_never_forwarded_warns_and_documented_forwards_it(upstream: Any) -> None:
    """Spec 7.3: the documented default "most_recent" equals the env-free default, so to_kwargs drops it."""
    with pytest.warns(fa.UpstreamQuirkWarning, match="amax_compute_algo-not-forwarded"):
        recipe, _ = fa.te_recipe_from_handler(fa.TERecipeKwargs(amax_compute_algo="most_recent"))
    assert recipe.amax_compute_algo == "max"
    recipe, _ = fa.te_recipe_from_handler(fa.TERecipeKwargs(), documented=True)
    assert isinstance(recipe, fr.DelayedScaling) and recipe.amax_compute_algo == "most_recent"
    with fa.documented_semantics():
        assert _recipe_seen_by(lambda m: fa.apply_fp8_autowrap(m, fa.TERecipeKwargs()))[1][1]["amax_compute_algo"] == (
            "most_recent"
        )


@pytest.mark.parametrize(("training", "use_during_eval"), [(True, False), (False, False), (False, True)])
def test_fp8_autocast_is_off_in_eval_unless_asked(training: bool, use_during_eval: bool, upstream: Any) -> None:
    handler = fa.TERecipeKwargs(use_autocast_during_eval=use_during_eval)
    ours = _recipe_seen_by(lambda m: fa.apply_fp8_autowrap(m, handler), training)[0]
    theirs = _recipe_seen_by(lambda m: upstream.apply_fp8_autowrap(m, _as_upstream(handler)), training)[0]
    assert ours == theirs == (training or use_during_eval)


def test_contextual_fp8_autocast_keeps_the_original_as_wrapped() -> None:
    model = nn.Linear(16, 16)
    forward = fa.contextual_fp8_autocast(model.forward, fr.DelayedScaling())
    assert forward.__wrapped__ == model.forward
    out = forward(model, torch.ones(8, 16))  # fp8sim's TE autocast does not touch a plain nn.Linear
    assert torch.equal(out, model(torch.ones(8, 16)))


def test_unbound_forward_quirk_matches_upstream_and_documented_binds(upstream: Any) -> None:
    """Spec 7.4 (derived): without __func__ the wrapper is assigned unbound; the input becomes `self`."""

    def plain_model() -> nn.Module:
        model = nn.Linear(16, 16)
        inner = model.forward
        model.forward = lambda x: inner(x)  # no __func__
        return model

    ours, theirs = plain_model(), plain_model()
    with pytest.warns(fa.UpstreamQuirkWarning, match="autowrap-unbound-forward"):
        fa.apply_fp8_autowrap(ours, fa.TERecipeKwargs())
    upstream.apply_fp8_autowrap(theirs, _as_upstream(fa.TERecipeKwargs()))
    x = torch.ones(8, 16)
    assert _outcome(lambda: ours.forward(x)) == _outcome(lambda: theirs.forward(x))
    assert _outcome(lambda: ours.forward(x))[0] == "AttributeError"
    fixed = plain_model()
    fa.apply_fp8_autowrap(fixed, fa.TERecipeKwargs(), documented=True)
    assert fixed.forward(x).shape == (8, 16)


# -- what the common cases cannot tell ------------------------------------------------------------


def _mutmut_trampolines() -> bool:
    """mutmut wraps each mutated function in a trampoline (a frame more between the caller and a warning), so a
    stacklevel cannot be judged there; docs/mutation.md says how those mutants are judged."""
    return hasattr(sys.modules[fa.convert_model.__module__], "_mutmut_mutated")


def _quirk_warnings(fn: Callable[[], Any]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with contextlib.suppress(TypeError):  # the reverse quirk raises after warning
            fn()
    return [w for w in record if w.category is fa.UpstreamQuirkWarning]


def _trained(model: nn.Module) -> nn.Module:
    """Parameters away from their initial values (a LayerNorm starts at ones and zeros)."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype))
    return model


def test_convert_model_early_return_warning_names_the_layer_and_what_stays_unconverted() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 20), nn.LayerNorm(20), Block())
    with torch.no_grad():
        (w,) = _quirk_warnings(lambda: fa.convert_model(model))
    assert "nn.Linear '1' has weight shape (20, 32); ['1', '2', '3'] stay unconverted" in str(w.message)


def test_convert_model_keeps_layernorm_values_eps_and_outputs_as_accelerate(upstream: Any) -> None:
    """accelerate's transformer_engine.py:61-69: eps and the (trained) weight and bias carry over."""
    model = _trained(nn.Sequential(nn.LayerNorm(32, eps=1e-2), nn.Linear(32, 32), nn.LayerNorm(32, eps=0.5)))
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        fa.convert_model(ours)
        upstream.convert_model(theirs)
    assert _same_layout(ours, theirs)
    assert [m.eps for m in (ours[0], ours[2])] == [m.eps for m in (theirs[0], theirs[2])] == [1e-2, 0.5]
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ours(x), theirs(x)) and torch.equal(ours[0](x), model[0](x))


def test_convert_model_keeps_the_layers_on_the_models_device() -> None:
    """fp8sim extension (upstream builds on TE's default device): a meta-device model, as from
    accelerate's init_empty_weights, converts without touching memory and stays on meta."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 16))
    with torch.no_grad():
        fa.convert_model(model)
    assert [type(m) for m in model] == [fpt.Linear, fpt.LayerNorm, fpt.Linear]
    assert {p.device.type for p in model.parameters()} == {"meta"}


def _round_trip_model() -> nn.Module:
    inner = nn.Sequential(nn.Linear(32, 16, bias=False), nn.LayerNorm(16, eps=1e-3))
    return _trained(nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32, eps=0.25), inner))


def test_documented_convert_back_restores_the_original_modules_exactly() -> None:
    """Documented reverse conversion: the same nn classes, bias or not, eps, and values, nested layers too."""
    model = _round_trip_model()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        fa.convert_model(twin)
        assert fa.has_transformer_engine_layers(twin[2])
        fa.convert_model(twin, to_transformer_engine=False, documented=True)
    assert _same_layout(model, twin)
    assert [getattr(m, "eps", None) for m in model.modules()] == [getattr(m, "eps", None) for m in twin.modules()]
    assert twin[2][0].bias is None


def test_convert_back_of_a_layernorm_raises_upstreams_typeerror_and_names_the_layer(upstream: Any) -> None:
    """accelerate's transformer_engine.py:80-81 passes params_dtype= to nn.LayerNorm: TypeError (reverse quirk)."""
    model = nn.Sequential(nn.ReLU(), fpt.LayerNorm(32))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        ours = _outcome(lambda: fa.convert_model(model, to_transformer_engine=False))
        theirs = _outcome(lambda: upstream.convert_model(twin, to_transformer_engine=False))
        with pytest.warns(fa.UpstreamQuirkWarning) as record, pytest.raises(TypeError):
            fa.convert_model(model, to_transformer_engine=False)  # called here: the warning names this line
    assert ours == theirs and ours[0] == "TypeError"
    (w,) = [w for w in record if w.category is fa.UpstreamQuirkWarning]
    assert "converting '1' back passes params_dtype= to torch.nn, which raises TypeError" in str(w.message)
    if not _mutmut_trampolines():
        assert w.filename == __file__


def test_convert_back_of_a_linear_raises_upstreams_typeerror_and_names_the_layer(upstream: Any) -> None:
    """accelerate's transformer_engine.py passes params_dtype= to nn.Linear as well: TypeError (reverse quirk)."""
    model = nn.Sequential(nn.ReLU(), fpt.Linear(32, 32))
    twin = copy.deepcopy(model)
    with torch.no_grad():
        ours = _outcome(lambda: fa.convert_model(model, to_transformer_engine=False))
        theirs = _outcome(lambda: upstream.convert_model(twin, to_transformer_engine=False))
        with pytest.warns(fa.UpstreamQuirkWarning) as record, pytest.raises(TypeError):
            fa.convert_model(model, to_transformer_engine=False)
    assert ours == theirs and ours[0] == "TypeError"
    (w,) = [w for w in record if w.category is fa.UpstreamQuirkWarning]
    assert "converting '1' back passes params_dtype= to torch.nn, which raises TypeError" in str(w.message)


def test_documented_and_the_layer_switches_reach_nested_modules(upstream: Any) -> None:
    """documented=True skips an odd Linear inside a child too; _convert_linear / _convert_ln hold at every depth
    (accelerate's transformer_engine.py:86-93 passes them down)."""

    def nested() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Sequential(nn.Linear(32, 24), nn.Linear(32, 32), nn.LayerNorm(32)))

    model = nested()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", fa.UpstreamQuirkWarning)
        fa.convert_model(model, documented=True)
    assert [type(m) for m in model[0]] == [nn.Linear, fpt.Linear, fpt.LayerNorm]
    for switches in ({"_convert_linear": False}, {"_convert_ln": False}):
        ours, theirs = nested(), nested()
        del ours[0][0], theirs[0][0]  # upstream would stop at the odd Linear
        with torch.no_grad():
            fa.convert_model(ours, **switches)
            upstream.convert_model(theirs, **switches)
        assert _same_layout(ours, theirs), switches
        assert fa.has_transformer_engine_layers(ours), switches


def test_te_recipe_from_handler_says_false_for_eval_autocast_unless_asked() -> None:
    """accelerate's transformer_engine.py:164: use_autocast_during_eval defaults to False."""
    for handler in (None, fa.TERecipeKwargs(), fa.TERecipeKwargs(use_mxfp8_block_scaling=True)):
        assert fa.te_recipe_from_handler(handler)[1] is False
    assert fa.te_recipe_from_handler(fa.TERecipeKwargs(use_autocast_during_eval=True))[1] is True


def test_no_handler_builds_upstreams_recipe_without_a_quirk_warning(upstream: Any) -> None:
    """Without a handler nothing says amax_compute_algo, so nothing is lost: no warning, TE's defaults either way."""
    assert _quirk_warnings(lambda: fa.te_recipe_from_handler(None)) == []
    theirs = _recipe_seen_by(lambda m: upstream.apply_fp8_autowrap(m, None))
    for documented in (False, True):
        assert _recipe_seen_by(lambda m, d=documented: fa.apply_fp8_autowrap(m, None, documented=d)) == theirs


def test_autowrap_warnings_name_the_model_and_point_at_the_callers_line() -> None:
    model = nn.Linear(16, 16)
    inner = model.forward
    model.forward = lambda x: inner(x)  # no __func__
    (w,) = _quirk_warnings(lambda: fa.apply_fp8_autowrap(model, None))
    assert "Linear.forward has no __func__; its first argument will be taken as `self`" in str(w.message)
    with pytest.warns(fa.UpstreamQuirkWarning) as record:
        fa.apply_fp8_autowrap(nn.Linear(16, 16), fa.TERecipeKwargs())  # called here: the warning names this line
    (w,) = [w for w in record if w.category is fa.UpstreamQuirkWarning]
    assert "amax_compute_algo-not-forwarded" in str(w.message)
    if not _mutmut_trampolines():
        assert w.filename == __file__


def test_autowrap_runs_the_forward_under_the_given_amax_reduction_group() -> None:
    group = object()  # a stand-in: nothing registers an FP8 module here, so no collective runs
    seen: list = []
    model = nn.Sequential(nn.Identity())
    model[0].register_forward_hook(lambda *_: seen.append(fpt.FP8GlobalStateManager.get_fp8_group()))
    fa.apply_fp8_autowrap(model, None, amax_reduction_group=group)
    with torch.no_grad():
        model(torch.ones(2))
    assert seen == [group]
