"""Run unchanged TransformerEngine code on fp8sim: ``fp8sim run SCRIPT`` or ``fp8sim.shim.install()``.

``install()`` makes ``import transformer_engine`` (``.pytorch``, ``.pytorch.fp8``, ``.common``,
``.common.recipe``) resolve to fp8sim's emulation, and registers a ``transformer-engine``
distribution so that libraries that look TE up (``importlib.util.find_spec``,
``importlib.metadata.version("transformer-engine")``, accelerate's ``is_transformer_engine_available``)
see it as installed.  It never activates on ``import fp8sim``; it says once on stderr that TE is
emulated; ``uninstall()`` undoes it.  TE features fp8sim does not emulate raise NotImplementedError
naming the feature.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import shutil
import sys
import tempfile
import types
from typing import Any

__all__ = ["install", "uninstall", "is_installed", "EMULATED_TE_VERSION"]

EMULATED_TE_VERSION = "2.18.0"
_NAMES = (
    "transformer_engine",
    "transformer_engine.pytorch",
    "transformer_engine.pytorch.fp8",
    "transformer_engine.common",
    "transformer_engine.common.recipe",
)
_state: dict[str, Any] = {"finder": None, "dist_dir": None, "announced": False}


def _not_emulated(feature: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"transformer_engine {feature} is not emulated by fp8sim")

    return fail


class TransformerLayer:  # noqa: D101 - isinstance target for accelerate's has_transformer_engine_layers
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("transformer_engine.pytorch.TransformerLayer is not emulated by fp8sim")


def _build(name: str) -> types.ModuleType:
    from . import __version__
    from . import pytorch as fp8_pt
    from . import recipe as fp8_recipe

    mod = types.ModuleType(name)
    mod.__fp8sim_emulation__ = __version__
    if name == "transformer_engine":
        mod.__version__ = EMULATED_TE_VERSION
        mod.__path__ = []  # a package
    elif name == "transformer_engine.pytorch":
        mod.__path__ = []
        for attr in fp8_pt.__all__:
            setattr(mod, attr, getattr(fp8_pt, attr))
        mod.fp8_model_init = _fp8_model_init
        mod.TransformerLayer = TransformerLayer
        for feature in ("DotProductAttention", "MultiheadAttention", "GroupedLinear", "Fp8Padding", "Fp8Unpadding"):
            setattr(mod, feature, _not_emulated(f"pytorch.{feature}"))
    elif name == "transformer_engine.pytorch.fp8":
        mod.fp8_autocast = fp8_pt.fp8_autocast
        mod.autocast = fp8_pt.autocast
        mod.check_fp8_support = lambda: (True, "")
        mod.check_mxfp8_support = lambda: (True, "")  # fp8sim emulates MXFP8 everywhere
        mod.check_fp8_block_scaling_support = lambda: (True, "")
        mod.check_nvfp4_support = lambda: (True, "")
    elif name == "transformer_engine.common":
        mod.__path__ = []
    elif name == "transformer_engine.common.recipe":
        for attr in fp8_recipe.__all__:
            setattr(mod, attr, getattr(fp8_recipe, attr))
    return mod


def _fp8_model_init(enabled: bool = True, recipe: Any = None, preserve_high_precision_init_val: bool = False) -> Any:
    """TE's ``fp8_model_init``: FP8 primary weights are not emulated; ``enabled=False`` is a no-op."""
    import contextlib

    if enabled:
        raise NotImplementedError(
            "transformer_engine.pytorch.fp8_model_init (FP8 primary weights) is not emulated by fp8sim"
        )
    return contextlib.nullcontext()


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _build(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAMES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname.count(".") < 2)
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations = []
        return spec


def _dist_dir() -> str:
    d = tempfile.mkdtemp(prefix="fp8sim-te-")
    info = os.path.join(d, f"transformer_engine-{EMULATED_TE_VERSION}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(
            f"Metadata-Version: 2.1\nName: transformer-engine\nVersion: {EMULATED_TE_VERSION}\n"
            "Summary: TransformerEngine emulated by fp8sim (no CUDA needed)\n"
        )
    return d


def is_installed() -> bool:
    return _state["finder"] is not None


def install(quiet: bool = False) -> None:
    """Make ``transformer_engine`` resolve to fp8sim (idempotent)."""
    if is_installed():
        return
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    d = _dist_dir()
    sys.path.append(d)
    _state["finder"], _state["dist_dir"] = finder, d
    importlib.invalidate_caches()
    if not quiet and not _state["announced"]:
        sys.stderr.write(
            f"fp8sim: transformer_engine is emulated by fp8sim (reports as transformer-engine {EMULATED_TE_VERSION}; "
            "CPU, no CUDA)\n"
        )
        _state["announced"] = True


def uninstall() -> None:
    """Undo :func:`install`: remove the finder, the distribution and the emulated modules."""
    finder, d = _state["finder"], _state["dist_dir"]
    if finder is None:
        return
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    if d in sys.path:
        sys.path.remove(d)
    shutil.rmtree(d, ignore_errors=True)
    for name in _NAMES:
        sys.modules.pop(name, None)
    _state["finder"] = _state["dist_dir"] = None
    importlib.invalidate_caches()


def run(argv: list[str]) -> int:
    """``fp8sim run SCRIPT|MODULE [ARGS...]``: run a Python file (or a module, e.g. ``pytest``) in a
    child interpreter where the shim is installed at start-up (also in its own child processes)."""
    import subprocess

    if not argv:
        sys.stderr.write("usage: fp8sim run SCRIPT.py|MODULE [ARGS...]\n")
        return 2
    boot = tempfile.mkdtemp(prefix="fp8sim-run-")
    try:
        with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
            f.write("import fp8sim.shim\nfp8sim.shim.install()\n")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH", "")) if p)
        target = argv[0]
        explicit = os.path.exists(target) or target.startswith("-")  # a script, or python's own -m / -c
        cmd = [sys.executable, *argv] if explicit else [sys.executable, "-m", *argv]
        return subprocess.call(cmd, env=env)
    finally:
        shutil.rmtree(boot, ignore_errors=True)
