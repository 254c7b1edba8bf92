"""The upstream-quirk warning of fp8sim's accelerate layer (``fp8sim/accelerate/_quirks.py``): its message, the
switch it names, where it points, and the error for a quirk name that does not exist."""

from __future__ import annotations

import inspect
import sys
import warnings

import pytest

from fp8sim.testing.oracles import require

require("torch")  # fp8sim.accelerate needs torch

from fp8sim.accelerate import _quirks  # noqa: E402
from fp8sim.accelerate._quirks import (  # noqa: E402
    QUIRKS,
    UpstreamQuirkWarning,
    documented_semantics,
    settings,
    warn_quirk,
)

_NAMES = (
    "amax_compute_algo-not-forwarded",
    "convert_model-early-return",
    "filter_first_and_last-as-filter",
    "fp8recipekwargs-opt_level-unset",
    "autowrap-unbound-forward",
    "ao-converted-weights-not-in-optimizer",
    "convert_model-reverse-params_dtype",
)


def test_the_quirk_list_is_the_documented_one() -> None:
    assert tuple(QUIRKS) == _NAMES
    assert all(text.strip() for text in QUIRKS.values())


def test_an_unknown_quirk_is_a_key_error_listing_the_known_names() -> None:
    with pytest.raises(KeyError) as info:
        warn_quirk("no-such-quirk", "here")
    assert info.value.args == ("unknown quirk 'no-such-quirk'; known: " + ", ".join(_NAMES),)


def test_the_warning_names_the_quirk_the_place_and_the_switch() -> None:
    with pytest.warns(UpstreamQuirkWarning) as record:
        warn_quirk("convert_model-early-return", "in model.layer3")
    assert [str(w.message) for w in record] == [
        "accelerate quirk 'convert_model-early-return': in model.layer3 (reproduced from accelerate 1.15; pass "
        "documented=True or set fp8sim.accelerate.settings.documented = True for the documented behaviour)"
    ]


def _library_function() -> int:
    """Stands for an fp8sim helper that hits a quirk on its caller's behalf (default stacklevel)."""
    warn_quirk("convert_model-early-return", "here")
    return inspect.currentframe().f_lineno


def test_the_default_stacklevel_names_the_line_that_called_the_helper() -> None:
    if hasattr(_quirks, "_mutmut_mutated"):
        # mutmut's trampoline is a frame more between the helper and warn_quirk (docs/mutation.md)
        pytest.skip("stacklevels are not observable under mutmut's trampolines")
    with pytest.warns(UpstreamQuirkWarning) as record:
        line = inspect.currentframe().f_lineno + 1
        _library_function()
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)]


def test_an_explicit_stacklevel_is_used() -> None:
    if hasattr(_quirks, "_mutmut_mutated"):
        pytest.skip("stacklevels are not observable under mutmut's trampolines")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        warn_quirk("convert_model-early-return", "here", stacklevel=2)
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)]


def test_documented_semantics_switches_the_module_default_and_restores_it() -> None:
    assert settings.documented is False and _quirks.use_documented(None) is False
    with documented_semantics():
        assert settings.documented is True and _quirks.use_documented(None) is True
        assert _quirks.use_documented(False) is False
        with documented_semantics(False):
            assert _quirks.use_documented(None) is False
        assert _quirks.use_documented(None) is True
    assert settings.documented is False and _quirks.use_documented(1) is True
    with pytest.raises(RuntimeError), documented_semantics():
        raise RuntimeError("the switch is restored on error too")
    assert settings.documented is False
    assert sys.modules["fp8sim.accelerate"].settings is settings
