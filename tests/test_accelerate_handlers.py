"""fp8sim.accelerate's kwargs handlers against the installed accelerate 1.15 (spec 7.1-7.3).

accelerate is the oracle for every handler class: field names in order, defaults, ``to_dict`` /
``to_kwargs``, the effect of each ``ACCELERATE_FP8_*`` variable, and each exception's type and
message.  Upstream's TE availability check is bypassed inside the test (monkeypatched in
``accelerate.utils.dataclasses``), so ``TERecipeKwargs`` / ``FP8RecipeKwargs`` run there too.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")
adc = require("accelerate.utils.dataclasses")
aenv = require("accelerate.utils.environment")

import fp8sim.accelerate as fa  # noqa: E402

CLASSES = (
    "AutocastKwargs",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "ProfileKwargs",
    "TERecipeKwargs",
    "MSAMPRecipeKwargs",
    "FP8RecipeKwargs",
    "AORecipeKwargs",
)
FP8_VARS = (
    "USE_AUTOCAST_DURING_EVAL",
    "MARGIN",
    "INTERVAL",
    "FORMAT",
    "AMAX_COMPUTE_ALGO",
    "AMAX_HISTORY_LEN",
    "OVERRIDE_FPROP",
    "OVERRIDE_DGRAD",
    "OVERRIDE_WGRAD",
    "USE_MXFP8_BLOCK_SCALING",
    "OPT_LEVEL",
    "BACKEND",
    "PAD_INNER_DIM",
    "ENABLE_FSDP_FLOAT8_ALL_GATHER",
)


@pytest.fixture(autouse=True)
def _upstream_te_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bypass accelerate's TE check where TERecipeKwargs runs it; start from no ACCELERATE_FP8_* variable."""
    monkeypatch.setattr(adc, "is_transformer_engine_available", lambda: True)
    for name in FP8_VARS:
        monkeypatch.delenv("ACCELERATE_FP8_" + name, raising=False)


# -- helpers ------------------------------------------------------------------------------------


def _plain(obj: Any) -> Any:
    """Nested plain data: dataclasses by class name and fields, enums by class name and value, dtypes as str."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__name__, {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, enum.Enum):
        return (type(obj).__name__, obj.value)
    if isinstance(obj, torch.dtype):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_plain(v) for v in obj])
    return obj


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", plain result) or (exception type, message); warnings are silenced (checked elsewhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", _plain(fn())
        except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
            return type(exc).__name__, str(exc)


def _both(name: str, build: Callable[[type], Any]) -> tuple[Any, Any]:
    return _outcome(lambda: build(getattr(fa, name))), _outcome(lambda: build(getattr(adc, name)))


def _default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return _plain(f.default)


# -- structure ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CLASSES)
def test_fields_in_order_and_defaults_match_accelerate(name: str) -> None:
    ours, theirs = dataclasses.fields(getattr(fa, name)), dataclasses.fields(getattr(adc, name))
    assert [f.name for f in ours] == [f.name for f in theirs]
    assert {f.name: _default_of(f) for f in ours} == {f.name: _default_of(f) for f in theirs}


@pytest.mark.parametrize("name", CLASSES)
def test_default_instance_to_dict_and_to_kwargs_match_accelerate(name: str) -> None:
    ours, theirs = _both(name, lambda cls: cls().to_dict())
    assert ours == theirs
    assert ours[0] == "ok"
    assert _both(name, lambda cls: cls().to_kwargs()) == (("ok", {}), ("ok", {}))


def test_fp8_recipe_kwargs_field_order_puts_opt_level_first_and_backend_last() -> None:
    names = [f.name for f in dataclasses.fields(fa.FP8RecipeKwargs)]
    assert names[0] == "opt_level" and names[-1] == "backend"  # dataclass reverse-MRO order (spec 7.2)


def test_handlers_are_kwargs_handlers_and_enums_behave_like_accelerate() -> None:
    for name in CLASSES:
        assert issubclass(getattr(fa, name), fa.KwargsHandler)
    ours, theirs = fa.DDPCommunicationHookType, adc.DDPCommunicationHookType
    assert ours.list() == theirs.list()
    assert [str(m) for m in ours] == [str(m) for m in theirs]
    for value in ("fp16", "bf16", "no", "power_sgd", "FP16", "int8"):
        assert (value in ours) == (value in theirs)
    assert [m.value for m in fa.FP8BackendType] == [m.value for m in adc.FP8BackendType]
    assert _outcome(lambda: fa.FP8BackendType("te")) == _outcome(lambda: adc.FP8BackendType("te"))


# -- to_kwargs ----------------------------------------------------------------------------------

TO_KWARGS_CASES = [
    ("AutocastKwargs", {"cache_enabled": True}),
    ("AutocastKwargs", {"enabled": True, "cache_enabled": None}),
    ("DistributedDataParallelKwargs", {"find_unused_parameters": True, "bucket_cap_mb": 25}),
    ("DistributedDataParallelKwargs", {"static_graph": True, "comm_hook": "fp16", "comm_state_option": {"a": 1}}),
    ("GradScalerKwargs", {"init_scale": 1024.0, "growth_interval": 2000}),
    ("InitProcessGroupKwargs", {"backend": "gloo"}),
    ("InitProcessGroupKwargs", {"timeout": timedelta(seconds=600)}),
    ("InitProcessGroupKwargs", {"backend": "nccl", "init_method": "file:///tmp/x"}),
    ("ProfileKwargs", {"activities": ["cpu"], "record_shapes": True, "output_trace_dir": "t"}),
    ("TERecipeKwargs", {"margin": 1, "amax_compute_algo": "max", "fp8_format": "e4m3"}),
    ("TERecipeKwargs", {"amax_compute_algo": "most_recent", "amax_history_len": 1024, "interval": 1}),
    ("TERecipeKwargs", {"override_linear_precision": (False, False, True), "use_mxfp8_block_scaling": True}),
    ("TERecipeKwargs", {"interval": 2, "use_autocast_during_eval": True}),
    ("MSAMPRecipeKwargs", {"opt_level": "O1"}),
    ("MSAMPRecipeKwargs", {"opt_level": "O2"}),
    ("FP8RecipeKwargs", {"backend": "msamp", "opt_level": "O1"}),
    ("FP8RecipeKwargs", {"backend": "te", "margin": 3, "amax_compute_algo": "MAX"}),
    ("AORecipeKwargs", {"pad_inner_dim": False}),
    ("AORecipeKwargs", {"enable_fsdp_float8_all_gather": True, "pad_inner_dim": True}),
]


@pytest.mark.parametrize(("name", "kwargs"), TO_KWARGS_CASES)
def test_to_kwargs_keeps_only_values_that_differ_from_the_env_free_defaults(name: str, kwargs: dict) -> None:
    ours, theirs = _both(name, lambda cls: (cls(**kwargs).to_dict(), cls(**kwargs).to_kwargs()))
    assert ours == theirs
    assert ours[0] == "ok"


def test_ao_recipe_kwargs_with_a_config_keeps_the_flags_none() -> None:
    from fp8sim.torchao import Float8LinearConfig

    handler = fa.AORecipeKwargs(config=Float8LinearConfig(pad_inner_dim=False))
    assert handler.pad_inner_dim is None and handler.enable_fsdp_float8_all_gather is None
    assert set(handler.to_kwargs()) == {"config", "pad_inner_dim", "enable_fsdp_float8_all_gather"}


def test_ddp_to_dict_drops_the_comm_fields() -> None:
    handler = fa.DistributedDataParallelKwargs(comm_hook=fa.DDPCommunicationHookType.BF16)
    assert "comm_hook" not in handler.to_dict() and handler.to_kwargs() == {}


# -- environment variables ----------------------------------------------------------------------

ENV_CASES = [
    ("TERecipeKwargs", "USE_AUTOCAST_DURING_EVAL", "yes"),
    ("TERecipeKwargs", "MARGIN", "2"),
    ("TERecipeKwargs", "INTERVAL", "4"),
    ("TERecipeKwargs", "FORMAT", "e4m3"),
    ("TERecipeKwargs", "FORMAT", "E5M2"),
    ("TERecipeKwargs", "AMAX_COMPUTE_ALGO", "MAX"),
    ("TERecipeKwargs", "AMAX_HISTORY_LEN", "16"),
    ("TERecipeKwargs", "OVERRIDE_FPROP", "1"),
    ("TERecipeKwargs", "OVERRIDE_DGRAD", "On"),
    ("TERecipeKwargs", "OVERRIDE_WGRAD", "TRUE"),
    ("TERecipeKwargs", "USE_MXFP8_BLOCK_SCALING", "t"),
    ("TERecipeKwargs", "USE_MXFP8_BLOCK_SCALING", "off"),
    ("MSAMPRecipeKwargs", "OPT_LEVEL", "O1"),
    ("FP8RecipeKwargs", "OPT_LEVEL", "O1"),
    ("FP8RecipeKwargs", "BACKEND", "msamp"),
    ("FP8RecipeKwargs", "BACKEND", "Te"),
    ("FP8RecipeKwargs", "MARGIN", "5"),
    ("AORecipeKwargs", "PAD_INNER_DIM", "0"),
    ("AORecipeKwargs", "ENABLE_FSDP_FLOAT8_ALL_GATHER", "false"),
    ("AORecipeKwargs", "PAD_INNER_DIM", "y"),
]


@pytest.mark.parametrize(("name", "var", "value"), ENV_CASES)
def test_environment_variable_sets_the_field_and_is_forwarded(
    name: str, var: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_" + var, value)
    ours, theirs = _both(name, lambda cls: (cls().to_dict(), cls().to_kwargs()))
    assert ours == theirs
    assert ours[0] == "ok"


def test_explicit_value_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_MARGIN", "7")
    monkeypatch.setenv("ACCELERATE_FP8_FORMAT", "E4M3")
    ours, theirs = _both("TERecipeKwargs", lambda cls: cls(margin=1).to_kwargs())
    assert ours == theirs == ("ok", {"margin": 1, "fp8_format": "E4M3"})


BAD_CASES = [
    ("TERecipeKwargs", {}, "FORMAT", "E5M3"),
    ("TERecipeKwargs", {}, "AMAX_COMPUTE_ALGO", "mean"),
    ("TERecipeKwargs", {}, "MARGIN", "one"),
    ("TERecipeKwargs", {}, "AMAX_HISTORY_LEN", "1.5"),
    ("TERecipeKwargs", {}, "USE_AUTOCAST_DURING_EVAL", "maybe"),
    ("TERecipeKwargs", {}, "OVERRIDE_WGRAD", "2"),
    ("TERecipeKwargs", {}, "USE_MXFP8_BLOCK_SCALING", ""),
    ("TERecipeKwargs", {"fp8_format": "fp8"}, None, None),
    ("TERecipeKwargs", {"amax_compute_algo": "Mean"}, None, None),
    ("MSAMPRecipeKwargs", {}, "OPT_LEVEL", "O3"),
    ("MSAMPRecipeKwargs", {"opt_level": "o1"}, None, None),
    ("FP8RecipeKwargs", {}, "BACKEND", "ao"),
    ("FP8RecipeKwargs", {"backend": "torchao"}, None, None),
    ("FP8RecipeKwargs", {"fp8_format": "E3M4"}, None, None),
    ("FP8RecipeKwargs", {}, "AMAX_COMPUTE_ALGO", "avg"),
    ("AORecipeKwargs", {}, "PAD_INNER_DIM", "nope"),
    ("AORecipeKwargs", {}, "ENABLE_FSDP_FLOAT8_ALL_GATHER", "2"),
    ("InitProcessGroupKwargs", {"timeout": None, "backend": None}, None, None),
]


@pytest.mark.parametrize(("name", "kwargs", "var", "value"), BAD_CASES)
def test_invalid_input_raises_accelerates_exception_and_message(
    name: str, kwargs: dict, var: str | None, value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if var is not None:
        monkeypatch.setenv("ACCELERATE_FP8_" + var, value)
    ours, theirs = _both(name, lambda cls: cls(**kwargs).to_dict())
    assert ours == theirs


@pytest.mark.parametrize("value", ["y", "YES", "t", "True", "on", "1", "n", "No", "F", "false", "OFF", "0", "x", ""])
def test_truth_values_match_accelerate(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _outcome(lambda: fa.str_to_bool(value)) == _outcome(lambda: aenv.str_to_bool(value))
    assert _outcome(lambda: fa.str_to_bool(value, to_bool=True)) == _outcome(lambda: aenv.str_to_bool(value, True))
    monkeypatch.setenv("FP8SIM_TEST_FLAG", value)
    assert _outcome(lambda: fa.parse_flag_from_env("FP8SIM_TEST_FLAG")) == _outcome(
        lambda: aenv.parse_flag_from_env("FP8SIM_TEST_FLAG")
    )


@pytest.mark.parametrize("value", ["yes", "off"])
def test_truth_values_have_accelerates_types(value: str) -> None:
    """1/0 by default and True/False with to_bool, as accelerate: equality alone cannot tell 1 from True."""
    theirs = [aenv.str_to_bool(value), aenv.str_to_bool(value, False), aenv.str_to_bool(value, True)]
    ours = [fa.str_to_bool(value), fa.str_to_bool(value, to_bool=False), fa.str_to_bool(value, to_bool=True)]
    assert [(type(v), v) for v in ours] == [(type(v), v) for v in theirs]


@pytest.mark.parametrize("value", [None, "fp8", "no"])
def test_parse_choice_from_env_matches_accelerate(value: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("FP8SIM_TEST_CHOICE", raising=False)
    else:
        monkeypatch.setenv("FP8SIM_TEST_CHOICE", value)
    from fp8sim.accelerate._env import parse_choice_from_env  # used by prepare; not re-exported

    assert parse_choice_from_env("FP8SIM_TEST_CHOICE") == aenv.parse_choice_from_env("FP8SIM_TEST_CHOICE")
    assert parse_choice_from_env("FP8SIM_TEST_CHOICE", "bf16") == aenv.parse_choice_from_env(
        "FP8SIM_TEST_CHOICE", "bf16"
    )


def test_clear_environment_empties_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP8SIM_TEST_VAR", "kept")
    with fa.clear_environment():
        assert dict(os.environ) == {}
        os.environ["FP8SIM_TEST_ADDED"] = "x"
    assert os.environ["FP8SIM_TEST_VAR"] == "kept" and "FP8SIM_TEST_ADDED" not in os.environ


# -- warnings -----------------------------------------------------------------------------------


def test_fp8_recipe_kwargs_emits_accelerates_future_warning() -> None:
    messages = []
    for cls in (fa.FP8RecipeKwargs, adc.FP8RecipeKwargs):
        with pytest.warns(FutureWarning) as record:
            cls()
        messages.append([str(w.message) for w in record if w.category is FutureWarning])
    assert messages[0] == messages[1] and len(messages[0]) == 1


def test_fp8_recipe_kwargs_warnings_point_at_the_callers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FutureWarning and the opt_level quirk warning name the user's line that built the kwargs (accelerate's
    FutureWarning names its own dataclasses.py)."""
    if hasattr(sys.modules[fa.FP8RecipeKwargs.__module__], "_mutmut_mutated"):
        # mutmut wraps each mutated function in a trampoline (a frame more per function between the caller and
        # the warning), so a stacklevel cannot be judged there; docs/mutation.md says how these mutants are run.
        pytest.skip("stacklevels are not observable under mutmut's trampolines")
    here = __file__
    with pytest.warns(FutureWarning) as record:
        fa.FP8RecipeKwargs()
    assert [w.filename for w in record if w.category is FutureWarning] == [here]
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    with pytest.warns((fa.UpstreamQuirkWarning, FutureWarning)) as record:
        fa.FP8RecipeKwargs(backend="MSAMP")
    assert [w.filename for w in record if w.category is fa.UpstreamQuirkWarning] == [here]
    assert [w.filename for w in record if w.category is FutureWarning] == [here]


@pytest.mark.filterwarnings("ignore:FP8RecipeKwargs is deprecated:FutureWarning")
def test_fp8_recipe_kwargs_opt_level_quirk_and_documented_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec 7.3: MSAMPRecipeKwargs.__post_init__ never runs, so opt_level stays None (upstream too)."""
    monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O1")
    with pytest.warns(fa.UpstreamQuirkWarning, match="fp8recipekwargs-opt_level-unset"):
        assert fa.FP8RecipeKwargs(backend="MSAMP").opt_level is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert adc.FP8RecipeKwargs(backend="MSAMP").opt_level is None
        with fa.documented_semantics():
            assert fa.FP8RecipeKwargs(backend="MSAMP").opt_level == "O1"
            monkeypatch.setenv("ACCELERATE_FP8_OPT_LEVEL", "O3")
            with pytest.raises(ValueError, match="`opt_level` must be one of O1 or O2"):
                fa.FP8RecipeKwargs()


def test_handlers_need_neither_te_nor_torchao_nor_msamp() -> None:
    """Spec 7: constructible without the libraries; fp8sim's emulations stand in (MS-AMP: no)."""
    assert fa.TERecipeKwargs().fp8_format == "HYBRID"
    assert type(fa.AORecipeKwargs().config).__module__.startswith("fp8sim.torchao")
    assert fa.MSAMPRecipeKwargs().opt_level == "O2"


# -- profiler -----------------------------------------------------------------------------------


def test_profile_kwargs_build_matches_accelerate() -> None:
    kwargs = {"activities": ["cpu"], "schedule_option": {"wait": 1, "warmup": 1, "active": 2}, "record_shapes": True}
    ours, theirs = fa.ProfileKwargs(**kwargs).build(), adc.ProfileKwargs(**kwargs).build()
    assert type(ours) is type(theirs) is torch.profiler.profile
    for attr in ("activities", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert [ours.schedule(i) for i in range(6)] == [theirs.schedule(i) for i in range(6)]
    bad = _both("ProfileKwargs", lambda cls: cls(activities=["tpu"]).build())
    assert bad[0] == bad[1] and bad[0][0] == "ValueError"


def test_profile_exports_the_chrome_trace_to_output_trace_dir(tmp_path: Any) -> None:
    handler = fa.ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path / "traces"))
    with fa.profile(handler) as prof:
        torch.ones(8, 8).matmul(torch.ones(8, 8))
    assert isinstance(prof, torch.profiler.profile)
    trace = json.loads((tmp_path / "traces" / "profile_0.json").read_text())
    assert any("matmul" in str(e.get("name", "")) for e in trace["traceEvents"])
