"""fp8sim.testing.oracles (issue 24 point 6): a missing oracle skips locally, with the install hint, and
fails under CI; a lean session (FP8SIM_LEAN=1) may lack torch and what needs it; a feature newer than the
installed release skips everywhere.  Inner pytest sessions run with the ``pytester`` fixture."""

from __future__ import annotations

import pytest

from fp8sim.testing import oracles

pytest_plugins = ["pytester"]

SAMPLE = """
import pytest
from fp8sim.testing.oracles import require, require_feature

def test_missing_module():
    require("fp8sim_no_such_oracle.sub", reason="oracle of nothing")

def test_missing_lean_package():
    require("gfloat.no_such_submodule")

def test_present():
    assert require("numpy").__name__ == "numpy"

def test_feature_newer_than_installed():
    require_feature("numpy", "no_such_feature", since="999.0")

def test_feature_missing_although_released():
    require_feature("numpy", "no_such_feature", since="1.0")
"""

MODULE_LEVEL = """
from fp8sim.testing.oracles import require

require("fp8sim_no_such_oracle")

def test_never_runs():
    pass
"""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("CI", "FP8SIM_LEAN"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_locally_a_missing_oracle_skips_with_the_install_hint(pytester: pytest.Pytester, env) -> None:  # noqa: ANN001
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*needs fp8sim_no_such_oracle.sub (oracle of nothing): it cannot be imported*"
            "install it: pip install fp8sim_no_such_oracle*",
            "*needs numpy.no_such_feature, added in numpy 999.0;*is installed*",
        ]
    )


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_missing_oracle_fails(pytester: pytest.Pytester, env, ci: str) -> None:  # noqa: ANN001
    env.setenv("CI", ci)
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    # a feature the installed release predates still skips: that release is meant to run
    result.assert_outcomes(passed=1, failed=3, skipped=1)
    result.stdout.fnmatch_lines([f"*missing oracle under CI={ci}: needs fp8sim_no_such_oracle.sub*"])
    result.stdout.fnmatch_lines(["*missing oracle under CI*numpy.no_such_feature*expected since 1.0*"])


def test_under_ci_a_module_level_missing_oracle_is_a_collection_error(pytester: pytest.Pytester, env) -> None:  # noqa: ANN001
    pytester.makepyfile(test_module=MODULE_LEVEL)
    local = pytester.runpytest("-p", "no:cacheprovider")
    local.assert_outcomes(skipped=1)
    env.setenv("CI", "true")
    ci = pytester.runpytest("-p", "no:cacheprovider")
    ci.assert_outcomes(errors=1)
    assert ci.ret != 0


def test_a_lean_session_may_lack_what_is_outside_the_lean_install(pytester: pytest.Pytester, env) -> None:  # noqa: ANN001
    """FP8SIM_LEAN=1 with CI: a package outside LEAN_PACKAGES skips (absent by design); a lean package
    (gfloat, numpy's features) still fails."""
    env.setenv("CI", "true")
    env.setenv("FP8SIM_LEAN", "1")
    pytester.makepyfile(test_sample=SAMPLE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=2, failed=2)
    result.stdout.fnmatch_lines(["*needs fp8sim_no_such_oracle.sub*absent by design in a lean session*"])


def test_ci_and_lean_flags_read_the_environment(env) -> None:  # noqa: ANN001
    assert not oracles.in_ci() and not oracles.lean_session()
    env.setenv("CI", "false")
    assert not oracles.in_ci()
    env.setenv("CI", "true")
    env.setenv("FP8SIM_LEAN", "1")
    assert oracles.in_ci() and oracles.lean_session()


def test_install_hint_is_the_test_extras_pin() -> None:
    from importlib import metadata

    try:
        reqs = metadata.requires("fp8sim") or []
    except metadata.PackageNotFoundError:
        pytest.skip("fp8sim is not pip-installed here: no extras to read")
    pins = [r.split(";")[0].replace(" ", "") for r in reqs if "extra" in r and "test" in r]
    gfloat = next(p for p in pins if p.startswith("gfloat"))
    assert oracles.install_hint("gfloat") == gfloat  # e.g. gfloat==0.5.2
    assert oracles.install_hint("not_a_dependency") == "not_a_dependency"
