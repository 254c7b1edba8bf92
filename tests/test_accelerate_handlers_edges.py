"""fp8sim.accelerate's handlers where the common cases cannot tell (accelerate 1.15 as the oracle).

Accelerators other than the CPU (HPU, XPU, MTIA) are played by faking what accelerate's and fp8sim's
checks look at; the FP8 backends' availability by monkeypatching both libraries' ``is_*_available``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from _outcomes import outcome

from fp8sim.testing.oracles import require

torch = require("torch")
adc = require("accelerate.utils.dataclasses")
aimports = require("accelerate.utils.imports")

import fp8sim.accelerate as fa  # noqa: E402
from fp8sim.accelerate import _available  # noqa: E402


@pytest.fixture(autouse=True)
def _no_fp8_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adc, "is_transformer_engine_available", lambda: True)
    for name in ("BACKEND", "OPT_LEVEL"):
        monkeypatch.delenv("ACCELERATE_FP8_" + name, raising=False)


_outcome = outcome


# -- is_fp8_available ---------------------------------------------------------------------------


@pytest.mark.parametrize("installed", [(), ("msamp",), ("te",), ("torchao",), ("te", "torchao"), ("msamp", "te")])
def test_is_fp8_available_is_true_when_any_one_backend_is_installed(
    installed: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's utils/imports.py:187-189: msamp or TE or torchao, each alone enough."""
    for module in (_available, aimports):
        monkeypatch.setattr(module, "is_msamp_available", lambda: "msamp" in installed)
        monkeypatch.setattr(module, "is_transformer_engine_available", lambda: "te" in installed)
        monkeypatch.setattr(module, "is_torchao_available", lambda: "torchao" in installed)
    assert bool(_available.is_fp8_available()) == bool(aimports.is_fp8_available()) == bool(installed)


# -- to_dict ------------------------------------------------------------------------------------


def test_to_dict_is_a_deep_copy_as_accelerates() -> None:
    """Editing what to_dict() returned must not edit the handler (accelerate: copy.deepcopy(self.__dict__))."""
    for cls in (fa.ProfileKwargs, adc.ProfileKwargs):
        handler = cls(activities=["cpu"], schedule_option={"wait": 1, "active": 1})
        d = handler.to_dict()
        d["activities"].append("cuda")
        d["schedule_option"]["wait"] = 5
        assert handler.activities == ["cpu"] and handler.schedule_option == {"wait": 1, "active": 1}, cls


# -- profiler activities on other accelerators ----------------------------------------------------


@pytest.fixture
def fake_hpu(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool, bool], None]:
    """Play Habana's stack: ``habana(True)`` makes habana_frameworks(.torch) findable and importable,
    ``hpu(True)`` gives torch an ``hpu`` namespace reporting a device."""
    real_find_spec = importlib.util.find_spec

    def install(habana: bool, hpu: bool) -> None:
        names = ("habana_frameworks", "habana_frameworks.torch") if habana else ()

        def find_spec(name: str, package: str | None = None) -> Any:
            if name in names:
                return importlib.machinery.ModuleSpec(name, None)
            return real_find_spec(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        for name in names:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        if hpu:
            monkeypatch.setattr(torch, "hpu", types.SimpleNamespace(is_available=lambda: True), raising=False)
        else:
            monkeypatch.delattr(torch, "hpu", raising=False)
        aimports.is_hpu_available.cache_clear()

    yield install
    aimports.is_hpu_available.cache_clear()


@pytest.mark.parametrize(("habana", "hpu"), [(True, True), (True, False), (False, True)])
def test_hpu_activity_exists_exactly_when_accelerate_sees_an_hpu(
    habana: bool, hpu: bool, fake_hpu: Callable[[bool, bool], None]
) -> None:
    """accelerate's ProfileKwargs._get_profiler_activity (dataclasses.py:561) offers "hpu" when is_hpu_available():
    habana_frameworks installed *and* torch.hpu reporting a device (imports.py:418-431)."""
    fake_hpu(habana, hpu)
    ours = _outcome(lambda: fa.ProfileKwargs(activities=["hpu"])._get_profiler_activity("hpu"))
    theirs = _outcome(lambda: adc.ProfileKwargs(activities=["hpu"])._get_profiler_activity("hpu"))
    assert ours == theirs
    assert (ours == ("ok", torch.profiler.ProfilerActivity.HPU)) == (habana and hpu)


@pytest.mark.parametrize("device", ["xpu", "mtia"])
def test_xpu_and_mtia_activities_exist_when_torch_reports_the_device(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's dataclasses.py:564-570: "xpu" / "mtia" when torch.xpu / torch.mtia report a device."""
    for available in (False, True):
        monkeypatch.setattr(getattr(torch, device), "is_available", lambda available=available: available)
        for activity in ("cpu", device):
            ours = _outcome(lambda a=activity: fa.ProfileKwargs()._get_profiler_activity(a))
            theirs = _outcome(lambda a=activity: adc.ProfileKwargs()._get_profiler_activity(a))
            assert ours == theirs, (available, activity)
        assert (ours[0] == "ok") is available
    assert ours == ("ok", getattr(torch.profiler.ProfilerActivity, device.upper()))


# -- the profiler build() makes ---------------------------------------------------------------------

PROFILE_ATTRS = ("activities", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def _trace_ready(prof: Any) -> None:
    pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"activities": ["cuda"]},
        {"on_trace_ready": _trace_ready, "profile_memory": True},
        {"with_stack": True, "with_flops": True, "with_modules": True, "record_shapes": True},
    ],
)
def test_profile_kwargs_build_passes_every_setting_on_as_accelerate(kwargs: dict) -> None:
    ours, theirs = fa.ProfileKwargs(**kwargs).build(), adc.ProfileKwargs(**kwargs).build()
    for attr in PROFILE_ATTRS:
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ours.on_trace_ready is theirs.on_trace_ready is kwargs.get("on_trace_ready")
    for attr, value in kwargs.items():
        if attr != "activities" and attr != "on_trace_ready":
            assert getattr(ours, attr) is value, attr
    if "activities" in kwargs:  # a CPU-only build's default is {CPU}: an explicit CUDA must reach the profiler
        assert ours.activities == {torch.profiler.ProfilerActivity.CUDA}


# -- FP8RecipeKwargs ------------------------------------------------------------------------------


def _quirks(fn: Callable[[], Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in record if w.category is fa.UpstreamQuirkWarning]


@pytest.mark.filterwarnings("ignore:FP8RecipeKwargs is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore::fp8sim.accelerate.UpstreamQuirkWarning")
@pytest.mark.parametrize("msamp", [False, True])
def test_fp8_recipe_kwargs_default_backend_is_msamp_when_msamp_is_installed(
    msamp: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's dataclasses.py:472: the backend defaults to MS-AMP when it is installed, else TE."""
    monkeypatch.setattr(_available, "is_msamp_available", lambda: msamp)
    monkeypatch.setattr(adc, "is_msamp_available", lambda: msamp)
    assert fa.FP8RecipeKwargs().backend == adc.FP8RecipeKwargs().backend == ("MSAMP" if msamp else "TE")


@pytest.mark.filterwarnings("ignore:FP8RecipeKwargs is deprecated:FutureWarning")
@pytest.mark.parametrize(
    ("kwargs", "opt_level_env", "warns"),
    [
        ({"backend": "MSAMP"}, None, True),  # MS-AMP would have run at opt_level "O2"
        ({"backend": "TE"}, "O1", True),  # the variable the user set is ignored
        ({"backend": "TE"}, None, False),  # TE never reads opt_level: nothing lost
        ({"backend": "MSAMP", "opt_level": "O1"}, None, False),  # set explicitly: kept
        ({"backend": "MSAMP", "opt_level": "O1"}, "O2", False),
    ],
)
def test_opt_level_quirk_warns_exactly_when_the_unset_opt_level_loses_something(
    kwargs: dict, opt_level_env: str | None, warns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if opt_level_env is not None:
        monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", opt_level_env)
    messages = _quirks(lambda: fa.FP8RecipeKwargs(**kwargs))
    assert len(messages) == warns
    assert _outcome(lambda: fa.FP8RecipeKwargs(**kwargs).opt_level) == ("ok", kwargs.get("opt_level"))
    assert adc.FP8RecipeKwargs(**kwargs).opt_level == kwargs.get("opt_level")
    if warns:
        assert "'fp8recipekwargs-opt_level-unset': FP8RecipeKwargs left `opt_level` None" in messages[0]
