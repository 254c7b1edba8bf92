"""fp8sim.testing.oracles called in this process: the exact skip/fail outcome objects pytest receives
(message, ``allow_module_level``, ``pytrace``), version checks of ``require_feature`` against fake modules whose
version is known, and the flags' spelling rules.  test_testing_oracles.py runs the same API in inner sessions."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import pytest

from fp8sim.testing import oracles

NO_SUCH = "fp8sim_no_such_oracle_q"
CI_TAIL = ".  A missing oracle must not skip the checks it backs; locally this is a skip"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("CI", "FP8SIM_LEAN"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Install a module ``fp8sim_fake_oracle`` (no distribution of that name) with ``__version__``."""

    def make(version: str | None) -> str:
        mod = types.ModuleType("fp8sim_fake_oracle")
        if version is not None:
            mod.__version__ = version
        monkeypatch.setitem(sys.modules, "fp8sim_fake_oracle", mod)
        return "fp8sim_fake_oracle"

    return make


def _outcome(call, *args, **kwargs):  # noqa: ANN001,ANN002,ANN003,ANN202
    """What ``call`` raised as a pytest outcome (a skip or a failure), or what it returned: a wrong skip must
    fail this test, not skip it."""
    try:
        return call(*args, **kwargs)
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        return exc


def _import_error(name: str) -> str:
    try:
        __import__(name)
    except ImportError as exc:
        return str(exc)
    raise AssertionError(f"{name} imports")


@pytest.mark.parametrize("value", ["TRUE", " Yes ", "On"])
def test_flags_ignore_case_and_spaces(env, value: str) -> None:  # noqa: ANN001
    env.setenv("CI", value)
    env.setenv("FP8SIM_LEAN", value)
    assert oracles.in_ci() and oracles.lean_session()


def test_install_hint_normalises_the_name_as_pip_does(env) -> None:  # noqa: ANN001
    try:
        metadata.requires("fp8sim")
    except metadata.PackageNotFoundError:
        pytest.skip("fp8sim is not pip-installed here: no extras to read")
    pin = oracles.install_hint("ml_dtypes")
    assert pin.startswith("ml") and "==" in pin  # the test extra pins ml_dtypes
    for spelling in ("ml-dtypes", "ML.dtypes", "ml__dtypes"):
        assert oracles.install_hint(spelling) == pin, spelling


def test_a_missing_oracle_without_reason_skips_with_the_exact_message(env) -> None:  # noqa: ANN001
    with pytest.raises(pytest.skip.Exception) as info:
        oracles.require(NO_SUCH)
    want = f"needs {NO_SUCH}: it cannot be imported ({_import_error(NO_SUCH)}); install it: pip install {NO_SUCH}"
    assert info.value.msg == want
    assert info.value.allow_module_level  # require() may stand at a test module's top


def test_under_ci_the_failure_names_the_oracle_without_a_traceback(env) -> None:  # noqa: ANN001
    env.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as info:
        oracles.require(NO_SUCH, reason="the R oracle")
    msg = f"needs {NO_SUCH} (the R oracle): it cannot be imported ({_import_error(NO_SUCH)}); install it: pip install "
    assert info.value.msg == f"missing oracle under CI=true: {msg}{NO_SUCH}{CI_TAIL}"
    assert not info.value.pytrace  # pytest then prints the message alone


def test_a_lean_session_skip_may_stand_at_module_level(env) -> None:  # noqa: ANN001
    env.setenv("CI", "true")
    env.setenv("FP8SIM_LEAN", "1")
    with pytest.raises(pytest.skip.Exception) as info:
        oracles.require(NO_SUCH)
    assert info.value.msg.endswith("[absent by design in a lean session, FP8SIM_LEAN=1]")
    assert info.value.allow_module_level


def test_require_feature_returns_a_present_attribute(env) -> None:  # noqa: ANN001
    import numpy as np  # a lean dependency: always installed

    assert _outcome(oracles.require_feature, "numpy", "float64", since="99.0") is np.float64


def test_require_feature_passes_its_reason_to_the_import(env) -> None:  # noqa: ANN001
    with pytest.raises(pytest.skip.Exception) as info:
        oracles.require_feature(NO_SUCH, "x", since="1.0", reason="the R oracle")
    assert info.value.msg.startswith(f"needs {NO_SUCH} (the R oracle): it cannot be imported")


@pytest.mark.parametrize(
    ("installed", "since", "older"),
    [
        ("1.4.0", "1.5", True),
        ("1.5.0", "1.5.0", False),  # the release named in ``since`` has it: its absence is an error
        ("2.7+cu128", "2.7.1", True),  # a local version's digits are not part of the release
        ("1.2.3.4", "1.2.3.5", False),  # releases compare by their first three numbers
    ],
)
def test_require_feature_skips_only_releases_older_than_since(  # noqa: ANN001
    env, fake, installed: str, since: str, older: bool
) -> None:
    env.setenv("CI", "true")
    name = fake(installed)
    got = _outcome(oracles.require_feature, name, "feat", since=since, reason="the R oracle")
    if older:
        assert isinstance(got, pytest.skip.Exception), got
        assert got.msg == f"needs {name}.feat (the R oracle), added in {name} {since}; {installed} is installed"
        assert got.allow_module_level
    else:
        assert isinstance(got, pytest.fail.Exception), got
        assert f"needs {name}.feat (the R oracle): {name} {installed} has no feat (expected since {since})" in got.msg


def test_require_feature_reads_the_distribution_version_when_the_module_has_none(env, fake) -> None:  # noqa: ANN001
    version = metadata.version("numpy")
    with pytest.raises(pytest.skip.Exception) as info:
        oracles.require_feature("numpy.linalg", "no_such_feature", since="999.0")  # numpy.linalg: no __version__
    assert info.value.msg.endswith(f"; {version} is installed")
    name = fake(None)  # neither a __version__ nor a distribution: treated as missing
    with pytest.raises(pytest.skip.Exception) as info:
        oracles.require_feature(name, "feat", since="1.0")
    assert f"{name} None has no feat" in info.value.msg
