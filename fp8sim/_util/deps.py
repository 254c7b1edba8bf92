"""Optional dependencies: one line that names the pip command when one is missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["MissingDependency", "require", "check", "EXTRAS"]

EXTRAS = {"torch": "torch", "matplotlib": "plot", "torchao": "test", "accelerate": "test"}


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message is one line with the pip command."""


def check(module: str, what: str) -> None:
    """Raise MissingDependency unless ``module`` is installed, without importing it (``fp8sim run``
    only hands torch to a child interpreter: importing it here would cost seconds per run)."""
    if importlib.util.find_spec(module) is None:
        raise MissingDependency(f"{what} needs {module}: pip install 'fp8sim[{EXTRAS.get(module, module)}]'")


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` for ``what`` (e.g. ``"fp8sim study"``) or raise MissingDependency."""
    check(module, what)
    return importlib.import_module(module)
