"""fp8sim.accelerate's torchao helpers against accelerate 1.15's ``utils/ao.py`` with real torchao (spec 7.4).

The filters are pure functions, so accelerate's own are the oracle on the same inputs.  For
``convert_model_to_fp8_ao`` the oracle is accelerate's function converting with the installed
torchao: the same layers (by name) must become ``Float8Linear`` (fp8sim's, here).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
aao = require("accelerate.utils.ao")
torchao_linear = require("torchao.float8.float8_linear")

from torch import nn  # noqa: E402

import fp8sim.accelerate as fa  # noqa: E402
import fp8sim.torchao as fs  # noqa: E402


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(2)])
        self.odd = nn.Linear(64, 24)
        self.head = nn.Linear(24, 32)


def _models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "tower": Tower(),
        "sequential": nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 48), nn.Linear(48, 32), nn.Linear(32, 32)),
        "single_linear": nn.Linear(32, 32),
        "no_linear": nn.Sequential(nn.LayerNorm(16), nn.ReLU()),
    }


FILTERS: dict[str, Callable | None] = {
    "none": None,
    "first_and_last": "first_and_last",  # resolved per library below
    "custom": lambda module, fqn: "blocks.0" not in fqn,
}


@pytest.mark.parametrize("name", list(_models()))
def test_filters_match_accelerate_on_every_submodule(name: str) -> None:
    model = _models()[name]
    assert fa.find_first_last_linear_layers(model) == aao.find_first_last_linear_layers(model)
    first, last = aao.find_first_last_linear_layers(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.UpstreamQuirkWarning)
        for fqn, module in model.named_modules():
            for layers in ([first, last], [], [fqn]):
                assert fa.filter_linear_layers(module, fqn, layers) == aao.filter_linear_layers(module, fqn, layers)
            ours = fa.filter_first_and_last_linear_layers(module, fqn)
            assert ours == aao.filter_first_and_last_linear_layers(module, fqn), fqn


def _converted(model: nn.Module, cls: type) -> list[str]:
    return sorted(n for n, m in model.named_modules() if isinstance(m, cls))


@pytest.mark.parametrize("model_name", ["tower", "sequential", "single_linear"])
@pytest.mark.parametrize("filter_name", list(FILTERS))
def test_convert_model_to_fp8_ao_converts_the_layers_accelerate_converts(model_name: str, filter_name: str) -> None:
    model = _models()[model_name]
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    f = FILTERS[filter_name]
    ours_f = fa.filter_first_and_last_linear_layers if f == "first_and_last" else f
    theirs_f = aao.filter_first_and_last_linear_layers if f == "first_and_last" else f
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fa.convert_model_to_fp8_ao(ours, module_filter_func=ours_f)
        aao.convert_model_to_fp8_ao(theirs, module_filter_func=theirs_f)
    assert _converted(ours, fs.Float8Linear) == _converted(theirs, torchao_linear.Float8Linear)
    assert fa.has_ao_layers(ours) == aao.has_ao_layers(theirs)


def test_default_filter_skips_first_last_and_non_multiple_of_16_layers() -> None:
    """Spec 7.4: by default the first and last Linear and every Linear with a dim % 16 != 0 stay nn.Linear."""
    model = Tower()
    fa.convert_model_to_fp8_ao(model, config=fs.Float8LinearConfig.from_recipe_name("rowwise"))
    assert _converted(model, fs.Float8Linear) == ["blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2"]
    assert all(m.config.round_scales_to_power_of_2 for m in model.modules() if isinstance(m, fs.Float8Linear))


def test_first_and_last_filter_quirk_warns_and_documented_excludes_the_models_first_and_last() -> None:
    """Spec 7.4: as a module filter it sees one Linear at a time, so it excludes nothing but a root Linear."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    with pytest.warns(fa.UpstreamQuirkWarning, match="filter_first_and_last-as-filter"):
        fa.convert_model_to_fp8_ao(model, module_filter_func=fa.filter_first_and_last_linear_layers)
    assert _converted(model, fs.Float8Linear) == ["0", "1", "2"]
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32))
    fa.convert_model_to_fp8_ao(model, module_filter_func=fa.filter_first_and_last_linear_layers, documented=True)
    assert _converted(model, fs.Float8Linear) == ["1"]


def test_first_and_last_filter_warns_only_on_a_leaf_linear_and_names_the_remedy() -> None:
    """The quirk warning is for a non-root Linear seen alone; a container or a root Linear gets none."""
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fa.UpstreamQuirkWarning)
        assert fa.filter_first_and_last_linear_layers(model, "blocks") == aao.filter_first_and_last_linear_layers(
            model, "blocks"
        )
        assert fa.filter_first_and_last_linear_layers(model[0], "") == aao.filter_first_and_last_linear_layers(
            model[0], ""
        )
    with pytest.warns(fa.UpstreamQuirkWarning) as record:
        fa.filter_first_and_last_linear_layers(model[1], "1")
    message = str(record[0].message)
    remedy = "layer (convert_model_to_fp8_ao(..., documented=True) applies it to the whole model) (reproduced"
    assert "'1'" in message and remedy in message


def test_root_linear_is_not_converted_in_place() -> None:
    model = nn.Linear(32, 32)
    assert fa.convert_model_to_fp8_ao(model, module_filter_func=lambda m, fqn: True) is None
    assert type(model) is nn.Linear and not fa.has_ao_layers(model)
