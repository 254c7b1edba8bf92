"""CI runs both dependency ends (issue 24 point 5): the README's test command is the entry point, the
main suite runs the newest pinned oracles, ``nox -s oldest`` the numpy-only part on the oldest releases
``pyproject.toml`` allows; ``.ci/run`` runs the command under ``CI=true``."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from fp8sim.testing.oracles import require

ROOT = Path(__file__).resolve().parents[1]


def _readme_command() -> str:
    text = (ROOT / "README.md").read_text()
    after = text.split("<!-- test-command -->", 1)[1]
    return next(line for line in after.splitlines() if line.startswith("python3 "))


@cache
def _noxfile():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    mod = importlib.util.module_from_spec(spec)
    require("nox")  # the test extra has it (a lean session does not)
    spec.loader.exec_module(mod)
    return mod


def test_ci_run_extracts_the_readme_command_and_sets_ci() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in script
    out = subprocess.run(
        ["bash", "-c", script.split('echo "+ $cmd"')[0] + 'printf "%s" "$cmd"'],
        cwd=ROOT / ".ci",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == _readme_command()
    assert out.endswith("&& python -m pytest -q -n 2 && nox -s oldest")


@pytest.mark.parametrize(
    ("python", "want"),
    [
        ("3.10", ["numpy==1.24", "ml_dtypes==0.5"]),
        ("3.11", ["numpy==1.24", "ml_dtypes==0.5"]),
        ("3.12", ["numpy==1.26", "ml_dtypes==0.5"]),  # numpy 1.24 and 1.25 have no wheels for 3.12
        ("3.13", ["numpy==2.1", "ml_dtypes==0.5"]),
        ("3.14", ["numpy==2.3.2", "ml_dtypes==0.5.3"]),
    ],
)
def test_oldest_session_pins_pyprojects_floors_for_each_python(python: str, want: list[str]) -> None:
    assert _noxfile().floors(python) == want


def test_oldest_session_tools_are_the_test_extras_pins() -> None:
    nf = _noxfile()
    text = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test\s*=\s*\[(.*?)\]", text, re.M | re.S).group(1)
    for tool in nf.LEAN_TOOLS:
        assert f'"{tool}"' in test_extra, f"{tool} differs from the test extra's pin"
    assert '"ml_dtypes==0.7.0"' in test_extra  # the newest end


def test_oldest_session_selects_the_numpy_only_part_in_a_lean_session() -> None:
    src = (ROOT / "noxfile.py").read_text()
    assert '"not torch and not slow"' in src and '{"FP8SIM_LEAN": "1"}' in src
    assert "torch" not in " ".join(_noxfile().LEAN_TOOLS)


def test_no_test_skips_on_a_missing_oracle_behind_ci() -> None:
    """Every oracle import in the suite goes through ``require`` (a failure under CI), never
    ``pytest.importorskip`` (a skip, so a broken oracle would give a green run: issue 24.6)."""
    name = "importor" + "skip"  # spelled apart so this file does not match itself
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if f"pytest.{name}(" in line
    ]
    assert not offenders, f"use fp8sim.testing.oracles.require instead of pytest.{name}: {offenders}"
