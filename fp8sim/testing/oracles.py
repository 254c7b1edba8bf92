"""Import a test's oracle, or skip; under CI, a missing oracle fails instead.

A test that compares fp8sim with another library (torch, torchao, gfloat, mmaemu, accelerate, an
ml_dtypes dtype, ...) proves nothing when that library is missing: ``pytest.importorskip`` would turn
a broken install into a green run.  :func:`require` and :func:`require_feature` decide in one place:

- locally, a missing oracle skips the test (or the module) with the install hint: the requirement
  fp8sim's ``test`` extra pins (``pip install torchao==0.18.0``);
- under CI (the ``CI`` environment variable set to ``true``, ``1`` or ``yes``, as GitHub Actions,
  GitLab and most CI services set it), it fails the test, or the module's collection;
- in a lean session (``FP8SIM_LEAN=1``: only numpy, ml_dtypes and the test tools, as ``nox -s oldest``
  runs the suite) every package outside :data:`LEAN_PACKAGES` (torch and what is built on it) is
  absent by design and skips, CI or not;
- a feature newer than the installed release (``require_feature("ml_dtypes", "float8_e5m3fnu",
  since="0.7.0")`` on ml_dtypes 0.6) skips with the reason, CI or not: that version is meant to run.
"""

from __future__ import annotations

import importlib
import os
import re
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any

import pytest

__all__ = ["LEAN_PACKAGES", "in_ci", "lean_session", "install_hint", "require", "require_feature"]

LEAN_PACKAGES = ("numpy", "ml_dtypes", "pytest", "xdist", "hypothesis", "gfloat")
"""What a lean session (``FP8SIM_LEAN=1``) has installed: a missing one of these is still an error in CI."""

_TRUE = ("1", "true", "yes", "on")


def in_ci() -> bool:
    """True when the ``CI`` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in _TRUE


def lean_session() -> bool:
    """True when ``FP8SIM_LEAN`` declares the lean install (numpy and ml_dtypes; no torch)."""
    return os.environ.get("FP8SIM_LEAN", "").strip().lower() in _TRUE


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def _test_requirements() -> dict[str, str]:
    """fp8sim's ``test`` extra as {normalised name: requirement}; empty when fp8sim is not installed."""
    try:
        reqs = metadata.requires("fp8sim") or []
    except metadata.PackageNotFoundError:
        return {}
    out = {}
    for req in reqs:
        spec, _, marker = req.partition(";")
        if re.search(r"""extra\s*==\s*["']test["']""", marker):
            name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
            if name:
                out[_norm(name.group(1))] = spec.strip().replace(" ", "")
    return out


def install_hint(package: str) -> str:
    """``pip install`` argument for ``package`` (a top-level import name): the pinned requirement of
    fp8sim's ``test`` extra where it has one."""
    return _test_requirements().get(_norm(package), package)


def _top(name: str) -> str:
    return name.split(".")[0]


def _missing(name: str, detail: str, reason: str | None) -> None:
    top = _top(name)
    why = f" ({reason})" if reason else ""
    msg = f"needs {name}{why}: {detail}; install it: pip install {install_hint(top)}"
    if lean_session() and top not in LEAN_PACKAGES:
        pytest.skip(f"{msg} [absent by design in a lean session, FP8SIM_LEAN=1]", allow_module_level=True)
    if in_ci():
        pytest.fail(
            f"missing oracle under CI={os.environ.get('CI')}: {msg}.  A missing oracle must not skip the checks it "
            "backs; locally this is a skip",
            pytrace=False,
        )
    pytest.skip(msg, allow_module_level=True)


def require(name: str, *, reason: str | None = None) -> ModuleType:
    """Import and return module ``name`` (e.g. ``"torchao.float8"``); where it cannot be imported, skip
    the test or module, or fail under CI (module docstring).  ``reason`` says what it is the oracle for."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        _missing(name, f"it cannot be imported ({exc})", reason)
        raise  # unreachable: _missing always raises


def _version(module: ModuleType, top: str) -> str | None:
    v = getattr(module, "__version__", None)
    if v:
        return str(v)
    try:
        return metadata.version(top)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def require_feature(module: str, attr: str, *, since: str, reason: str | None = None) -> Any:
    """``getattr(require(module), attr)``.  Where the attribute is missing: skip (CI too) if the installed
    release is older than ``since``, the first release with it; otherwise as a missing oracle."""
    mod = require(module, reason=reason)
    if hasattr(mod, attr):
        return getattr(mod, attr)
    version = _version(mod, _top(module))
    if version is not None and _release(version) < _release(since):
        why = f" ({reason})" if reason else ""
        pytest.skip(
            f"needs {module}.{attr}{why}, added in {module} {since}; {version} is installed", allow_module_level=True
        )
    _missing(f"{module}.{attr}", f"{module} {version} has no {attr} (expected since {since})", reason)
