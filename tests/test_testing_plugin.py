"""fp8sim.testing.pytest_plugin: inert unless enabled (``--fp8sim`` or ``fp8sim = true``), then a
``gpu`` marker (kept as the project declares it, if it does) and the ``fp8_recipe`` fixture; and
the README's example test file (docs/example_test_fp8.py) passes under pytest with the plugin.

Runs inner pytest sessions with the ``pytester`` fixture; the example runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import fp8sim
from fp8sim.testing.pytest_plugin import RECIPES, gpu_skip_reason

pytest_plugins = ["pytester"]

ROOT = Path(fp8sim.__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "example_test_fp8.py"
README_SECTION = ROOT / "docs" / "testing_in_ci.md"

SAMPLE = """
import pytest

def test_recipe(fp8_recipe):
    assert type(fp8_recipe).__module__ == "fp8sim.recipe"

@pytest.mark.gpu
def test_gpu():
    pass
"""


def _entry_point_installed() -> bool:
    eps = metadata.entry_points(group="pytest11")
    return any(ep.name == "fp8sim" and ep.value == "fp8sim.testing.pytest_plugin" for ep in eps)


@pytest.fixture
def load() -> list[str]:
    """Plugin arguments: none where fp8sim is pip-installed (the entry point loads it), else -p."""
    return [] if _entry_point_installed() else ["-p", "fp8sim.testing.pytest_plugin"]


def _enabled_outcomes(result: pytest.RunResult) -> None:
    gpu = {"skipped": 1} if gpu_skip_reason() else {"passed": 1}
    result.assert_outcomes(passed=len(RECIPES) + gpu.get("passed", 0), skipped=gpu.get("skipped", 0))
    for name in RECIPES:
        result.stdout.fnmatch_lines([f"*test_recipe?{name}? PASSED*"])


def test_entry_point_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nfp8sim = "fp8sim.testing.pytest_plugin"' in text


def test_plugin_is_inert_without_the_flag(pytester: pytest.Pytester, load: list[str]) -> None:
    pytester.makepyfile(SAMPLE)
    result = pytester.runpytest(*load)
    result.assert_outcomes(passed=1, errors=1)  # the gpu test runs; no fp8_recipe fixture
    result.stdout.fnmatch_lines(["*fixture 'fp8_recipe' not found*"])
    assert "fp8sim: plugin enabled" not in result.stdout.str()
    markers = pytester.runpytest(*load, "--markers").stdout.str()
    assert "compute capability >= 8.9" not in markers
    assert pytester.runpytest(*load, "--strict-markers").ret != 0  # gpu is not registered


def test_flag_enables_the_marker_and_the_fixture(pytester: pytest.Pytester, load: list[str]) -> None:
    pytester.makepyfile(SAMPLE)
    result = pytester.runpytest(*load, "--fp8sim", "--strict-markers", "-v")
    _enabled_outcomes(result)
    result.stdout.fnmatch_lines(["fp8sim: plugin enabled*"])
    markers = pytester.runpytest(*load, "--fp8sim", "--markers").stdout.str()
    assert "gpu: needs a CUDA device with float8 support" in markers


def test_ini_option_enables_the_plugin(pytester: pytest.Pytester, load: list[str]) -> None:
    pytester.makeini("[pytest]\nfp8sim = true\n")
    pytester.makepyfile(SAMPLE)
    _enabled_outcomes(pytester.runpytest(*load, "--strict-markers", "-v"))


def test_a_declared_gpu_marker_is_kept(pytester: pytest.Pytester, load: list[str]) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    gpu: the project's own gpu marker\n")
    pytester.makepyfile(SAMPLE)
    _enabled_outcomes(pytester.runpytest(*load, "--fp8sim", "--strict-markers", "-v"))
    markers = pytester.runpytest(*load, "--fp8sim", "--markers").stdout.str()
    assert "the project's own gpu marker" in markers and "compute capability >= 8.9" not in markers


def test_ini_option_false_keeps_the_plugin_inert(pytester: pytest.Pytester, load: list[str]) -> None:
    """``fp8sim = false`` is read as a bool (a non-empty string would be truthy)."""
    pytester.makeini("[pytest]\nfp8sim = false\n")
    pytester.makepyfile(SAMPLE)
    result = pytester.runpytest(*load)
    result.assert_outcomes(passed=1, errors=1)
    assert "fp8sim: plugin enabled" not in result.stdout.str()


def test_a_declared_gpu_marker_with_arguments_is_kept(pytester: pytest.Pytester, load: list[str]) -> None:
    """A marker line ``gpu(capability): ...`` declares ``gpu`` too: pytest's own marker syntax."""
    pytester.makeini("[pytest]\nmarkers =\n    gpu(capability): the project's own gpu marker\n")
    markers = pytester.runpytest(*load, "--fp8sim", "--markers").stdout.str()
    assert "the project's own gpu marker" in markers and "compute capability >= 8.9" not in markers


def test_only_gpu_marked_tests_are_skipped(pytester: pytest.Pytester, load: list[str]) -> None:
    """Other markers (here ``parametrize``, ``filterwarnings``) never trigger the gpu skip."""
    pytester.makepyfile(
        """
import pytest

@pytest.mark.parametrize("x", [1])
@pytest.mark.filterwarnings("ignore")
def test_cpu(x):
    pass
"""
    )
    pytester.runpytest(*load, "--fp8sim").assert_outcomes(passed=1)


def test_a_skipped_gpu_test_reports_why(pytester: pytest.Pytester, load: list[str]) -> None:
    reason = gpu_skip_reason()
    if reason is None:
        pytest.skip("this host has a float8-capable CUDA device: gpu tests run")
    pytester.makepyfile(SAMPLE)
    result = pytester.runpytest(*load, "--fp8sim", "-rs")
    result.stdout.fnmatch_lines([f"SKIPPED * {reason}"])


def test_help_documents_the_flag_and_the_ini_option(pytester: pytest.Pytester, load: list[str]) -> None:
    text = " ".join(pytester.runpytest(*load, "--help").stdout.str().split())  # unwrap the columns
    assert "fp8sim FP8 testing kit: --fp8sim enable fp8sim's plugin: the gpu marker and the fp8_recipe fixture" in text
    assert "fp8sim (bool): enable fp8sim's plugin (as --fp8sim)" in text


def test_loading_by_module_name_too_registers_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SAMPLE)
    _enabled_outcomes(pytester.runpytest("-p", "fp8sim.testing.pytest_plugin", "--fp8sim", "-v"))
    pytester.makeconftest('pytest_plugins = ["fp8sim.testing.pytest_plugin"]')
    _enabled_outcomes(pytester.runpytest("--fp8sim", "-v"))


def test_readme_section_shows_the_example_file() -> None:
    text = README_SECTION.read_text()
    assert text.startswith("## Test your FP8 code in CI")
    assert f"```python\n{EXAMPLE.read_text()}```" in text
    readme = (ROOT / "README.md").read_text()
    assert "(docs/testing_in_ci.md)" in readme  # the README points to the section (one copy, in docs/)


@pytest.mark.torch
def test_readme_example_runs_as_a_test(tmp_path: Path, load: list[str]) -> None:
    (tmp_path / "test_fp8.py").write_text(EXAMPLE.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "test_fp8.py", "--fp8sim", "-p", "no:cacheprovider", "-q", "-rs", *load]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert " passed" in out and "failed" not in out and "error" not in out.lower(), out
