"""nox sessions for fp8sim's CI (``pip install nox``; the ``test`` extra has it).

``nox -s oldest``: the numpy-only part of the suite (``-m "not torch and not slow"``) on the oldest
releases ``pyproject.toml`` allows, numpy and ml_dtypes at their floors (read from ``pyproject.toml``),
without torch: the lean install, in a fresh virtual environment under ``.nox/``.  ``FP8SIM_LEAN=1``
tells the suite that torch and what is built on it are absent by design (``fp8sim.testing.oracles``);
a missing numpy-only oracle (gfloat, an ml_dtypes dtype its release should have) still fails under CI.
The README's test command runs it after the main suite, which runs the newest pinned releases.

``nox -s ml_dtypes_sweep``: ``scripts/ml_dtypes_sweep.py`` (the conformance sweep and the core cast against
ml_dtypes) on ml_dtypes 0.5.0, 0.6.0 and 0.7.0 with torch; its results are in ``docs/versions.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["oldest"]

ROOT = Path(__file__).parent
LEAN_TOOLS = ("pytest>=8", "pytest-xdist==3.8.0", "hypothesis>=6.100", "gfloat==0.5.2")
"""The test tools and numpy-only oracles of the lean session (pins as in the ``test`` extra)."""


def floors(python_version: str | None = None) -> list[str]:
    """``name==floor`` for each ``name>=floor`` of pyproject.toml's [project] dependencies whose marker
    holds for ``python_version`` (default: the Python running nox, which the session's venv uses)."""
    from packaging.requirements import Requirement

    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    if deps is None:
        raise RuntimeError("pyproject.toml has no [project] dependencies list")
    env = None if python_version is None else {"python_version": python_version}
    pins = []
    for spec in re.findall(r'^\s*"([^"]+)"', deps.group(1), re.M):
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate(env):
            floor = next(s.version for s in req.specifier if s.operator == ">=")
            pins.append(f"{req.name}=={floor}")
    return pins


@nox.session
def oldest(session: nox.Session) -> None:
    """numpy-only tests on the oldest numpy and ml_dtypes pyproject.toml allows, no torch."""
    session.install(*floors(), *LEAN_TOOLS)
    session.install("--no-deps", "-e", ".")  # the floors stay as installed: no resolver upgrade
    session.run(
        "python", "-c", "import numpy, ml_dtypes; print('numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"
    )
    args = session.posargs or ["-n", "2"]
    session.run("python", "-m", "pytest", "-q", "-m", "not torch and not slow", *args, env={"FP8SIM_LEAN": "1"})


SWEEP_NUMPY = {"0.5.0": "numpy==1.26.4", "0.6.0": "numpy>=2,<3", "0.7.0": "numpy>=2,<3"}  # 0.6 dropped numpy 1.x


@nox.session
@nox.parametrize("ml_dtypes", list(SWEEP_NUMPY))
def ml_dtypes_sweep(session: nox.Session, ml_dtypes: str) -> None:
    """The issue-24 sweep against one ml_dtypes release (numpy and torch backends)."""
    session.install(f"ml_dtypes=={ml_dtypes}", SWEEP_NUMPY[ml_dtypes], "torch==2.13.0")
    session.install("--no-deps", "-e", ".")
    session.run("python", "scripts/ml_dtypes_sweep.py")
