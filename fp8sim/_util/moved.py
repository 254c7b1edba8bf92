"""Module paths that moved when the loose modules got rooms (issue 25): the old dotted names keep
importing, as the very module objects of their new homes (``monkeypatch.setattr`` on either name
patches the same module; pickles that name the old path still load).

A meta-path finder answers only the old names below; ``fp8sim/__init__`` installs it.  The old
``fp8sim.distributed`` is deprecated (a DeprecationWarning): its name collided with TE's
``fp8sim.pytorch.distributed``.  The others are plain aliases.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MOVED", "install"]

# old dotted path -> new home
MOVED: dict[str, str] = {
    "fp8sim.shim": "fp8sim.run.shim",
    "fp8sim.study": "fp8sim.report.training_study",
    "fp8sim.conformance": "fp8sim.report.conformance",
    "fp8sim.conventions": "fp8sim.cast.conventions",
    "fp8sim.distributed": "fp8sim.collectives",
    "fp8sim.distributed.collectives": "fp8sim.collectives.wire",
    "fp8sim.distributed.groups": "fp8sim.collectives.groups",
    "fp8sim.distributed.spawn": "fp8sim.collectives.spawn",
    "fp8sim.distributed.study": "fp8sim.report.distributed_study",
}
_DEPRECATED = "fp8sim.distributed"


def _new_name(fullname: str) -> str | None:
    if fullname in MOVED:
        return MOVED[fullname]
    head, _, tail = fullname.rpartition(".")
    while head:  # a submodule of a moved package (fp8sim.distributed.wire) is found in its new home
        if head in MOVED:
            return f"{MOVED[head]}.{fullname[len(head) + 1 :]}"
        head, _, tail = head.rpartition(".")
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name before the path finder does (which would load a second copy of a moved
    package's submodule under the old name) and hands back the module at the new name."""

    def __init__(self) -> None:
        self._specs: dict[str, ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if not fullname.startswith("fp8sim.") or _new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = _new_name(spec.name)
        assert new is not None
        if spec.name == _DEPRECATED or spec.name.startswith(_DEPRECATED + "."):
            warnings.warn(
                f"{spec.name} is now {new} (fp8sim.distributed collided with TE's fp8sim.pytorch.distributed); "
                "the old name will be removed",
                DeprecationWarning,
                stacklevel=2,
            )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is already executed; the import system just set its ``__spec__`` to the old
        name's: the module keeps its own."""
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(type(f).__name__ == "_MovedFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def attribute(package: str, name: str) -> ModuleType:
    """``fp8sim.conventions`` and the other old names as attributes of their package (a module
    ``__getattr__``): imported on first use."""
    full = f"{package}.{name}"
    if full not in MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(full)
