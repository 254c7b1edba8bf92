"""Run unchanged TransformerEngine code on fp8sim: ``fp8sim run SCRIPT`` or ``fp8sim.run.shim.install()``.

``install()`` makes ``import transformer_engine`` and its submodules resolve to fp8sim's emulation:
``transformer_engine.pytorch[.X.Y]`` is ``fp8sim.pytorch[.X.Y]`` wherever fp8sim has that module
(``module.linear``, ``quantization``, ``utils``, ``constants``, ``tensor.float8_tensor``, ...),
``transformer_engine.pytorch.fp8`` is TE's legacy alias of ``quantization``,
``transformer_engine.common.recipe`` is ``fp8sim.recipe``, and TE's C++ extension
``transformer_engine_torch`` (``tex``) is ``fp8sim.pytorch._tex``.  It registers a
``transformer-engine`` distribution (served by its import hook from memory: nothing is written to
disk) so that libraries that look TE up (``importlib.util.find_spec``,
``importlib.metadata.version("transformer-engine")``, accelerate's ``is_transformer_engine_available``)
see it as installed.  A TE name or submodule fp8sim does not emulate raises :class:`NotEmulatedError`
or :class:`NotEmulatedModuleError` (``NotImplementedError`` subclasses that are also an
``AttributeError`` / ``ImportError``, so ``hasattr`` and ``try: import`` probes keep working) naming
it with its dotted path.

It never activates on ``import fp8sim``; ``uninstall()`` undoes it.  It says once on stderr that TE
is emulated, only in the process that installs it explicitly or runs ``fp8sim run`` (never in the
child interpreters ``fp8sim run`` starts), and not at all with ``quiet=True``, ``fp8sim run --quiet``
or ``FP8SIM_QUIET=1``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import types
from typing import Any

__all__ = ["install", "uninstall", "is_installed", "EMULATED_TE_VERSION", "NotEmulatedError", "NotEmulatedModuleError"]

EMULATED_TE_VERSION = "2.20.0"  # TE main at d0067d0 (2.20.0.dev0) plus PR#3394 (recompute metadata)
_ROOT = "transformer_engine"
_TEX = "transformer_engine_torch"  # TE's C++ extension, imported by TE code as ``tex``
# TE modules whose fp8sim counterpart has another name (TE's legacy aliases included)
_ALIASES = {
    "transformer_engine.pytorch.fp8": "fp8sim.pytorch.quantization",
    "transformer_engine.common.recipe": "fp8sim.recipe",
    "transformer_engine.pytorch.float8_tensor": "fp8sim.pytorch.tensor.float8_tensor",
    "transformer_engine.pytorch.quantized_tensor": "fp8sim.pytorch.tensor.quantized_tensor",
    "transformer_engine.pytorch._extra_state": "fp8sim.pytorch._extra_state_te",
    _TEX: "fp8sim.pytorch._tex",
}
_PACKAGES = ("transformer_engine", "transformer_engine.common")  # emulated namespaces without a counterpart
# TE classes that libraries test with isinstance: a placeholder that refuses construction when fp8sim
# has no emulation (accelerate's has_transformer_engine_layers reads te.TransformerLayer)
_ISINSTANCE_TARGETS = ("TransformerLayer", "DotProductAttention", "MultiheadAttention", "GroupedLinear")
_state: dict[str, Any] = {"finder": None, "announced": False, "names": []}


class NotEmulatedError(NotImplementedError, AttributeError):
    """A TransformerEngine name fp8sim does not emulate (an AttributeError too, so ``hasattr`` works)."""


class NotEmulatedModuleError(NotImplementedError, ImportError):
    """A TransformerEngine module fp8sim does not emulate (an ImportError too, so ``try: import`` works)."""

    def __init__(self, msg: str, name: str | None = None) -> None:
        super().__init__(msg)
        self.name = name


def _not_emulated(dotted: str) -> NotEmulatedError:
    return NotEmulatedError(f"{dotted} is not emulated by fp8sim")


def _target(name: str) -> str | None:
    """The fp8sim module emulating TE module ``name`` (None: a bare emulated namespace)."""
    if name in _ALIASES:
        return _ALIASES[name]
    if name == "transformer_engine.pytorch" or name.startswith("transformer_engine.pytorch."):
        return "fp8sim.pytorch" + name[len("transformer_engine.pytorch") :]
    return None


def _emulated_name(name: str) -> bool:
    return name in (_ROOT, _TEX) or name.startswith((_ROOT + ".", _TEX + "."))


def _exists(modname: str) -> bool:
    try:
        return importlib.util.find_spec(modname) is not None
    except (ImportError, ValueError):
        return False


def _placeholder(dotted: str) -> type:
    class NotEmulated:  # isinstance target only
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise _not_emulated(dotted)

    NotEmulated.__name__ = NotEmulated.__qualname__ = dotted.rpartition(".")[2]
    return NotEmulated


def _build(name: str) -> types.ModuleType:
    from .. import __version__

    target_name = _target(name)
    target = importlib.import_module(target_name) if target_name is not None else None
    mod = types.ModuleType(name, getattr(target, "__doc__", None))
    mod.__fp8sim_emulation__ = target_name or __version__
    mod.__path__ = []  # every emulated module may have emulated submodules
    if name == _ROOT:
        mod.__version__ = EMULATED_TE_VERSION
    if target is not None and hasattr(target, "__all__"):
        mod.__all__ = list(target.__all__)
    if name == "transformer_engine.pytorch":
        for cls in _ISINSTANCE_TARGETS:
            if not hasattr(target, cls):
                setattr(mod, cls, _placeholder(f"{name}.{cls}"))

    def __getattr__(attr: str) -> Any:  # noqa: N807 - PEP 562 module hook
        if attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        if target is not None and hasattr(target, attr):
            return getattr(target, attr)
        sub = f"{name}.{attr}"
        tgt = _target(sub)
        if tgt is not None and _exists(tgt):
            return importlib.import_module(sub)
        raise _not_emulated(sub)

    mod.__getattr__ = __getattr__
    mod.__dir__ = lambda: sorted(set(dir(target) if target is not None else []) | set(vars(mod)))
    return mod


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _build(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        _state["names"].append(module.__name__)
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not _emulated_name(fullname):
            return None
        tgt = _target(fullname)
        if fullname not in _PACKAGES and (tgt is None or not _exists(tgt)):
            raise NotEmulatedModuleError(f"{fullname} is not emulated by fp8sim", name=fullname)
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        spec.submodule_search_locations = []
        return spec

    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        """``importlib.metadata``'s hook: the emulated ``transformer-engine`` distribution."""
        name = getattr(context, "name", None)
        if name is None or _normalized(name) == "transformer_engine":
            return [_Distribution()]
        return []


def _normalized(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


class _Distribution(importlib.metadata.Distribution):
    """The ``transformer-engine`` distribution, served from memory (no file on disk to clean up)."""

    _FILES = {
        "METADATA": (
            f"Metadata-Version: 2.1\nName: transformer-engine\nVersion: {EMULATED_TE_VERSION}\n"
            "Summary: TransformerEngine emulated by fp8sim (no CUDA needed)\n"
        ),
        "top_level.txt": f"{_ROOT}\n{_TEX}\n",
    }

    def read_text(self, filename: str) -> str | None:
        return self._FILES.get(filename)

    def locate_file(self, path: Any) -> Any:
        return None


def is_installed() -> bool:
    return _state["finder"] is not None


def _banner() -> str:
    return (
        f"fp8sim: transformer_engine is emulated by fp8sim (reports as transformer-engine {EMULATED_TE_VERSION}; "
        "CPU, no CUDA; FP8SIM_QUIET=1 silences this)\n"
    )


def install(quiet: bool = False) -> None:
    """Make ``transformer_engine`` resolve to fp8sim (idempotent).  ``FP8SIM_DEVICE_MAP=cuda=cpu``
    also routes CUDA to the CPU (see :mod:`fp8sim.run._device_map`)."""
    if is_installed():
        return
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    _state["finder"] = finder
    importlib.invalidate_caches()
    device_map = os.getenv("FP8SIM_DEVICE_MAP")
    if device_map:
        from ._device_map import install as install_device_map
        from ._device_map import parse_device_map

        install_device_map(parse_device_map(device_map))
    if not quiet and not _state["announced"] and os.getenv("FP8SIM_QUIET", "0") != "1":
        sys.stderr.write(_banner())
        _state["announced"] = True


def uninstall() -> None:
    """Undo :func:`install`: remove the finder, the distribution and the emulated modules."""
    finder = _state["finder"]
    if finder is None:
        return
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in list(sys.modules):
        if _emulated_name(name):
            sys.modules.pop(name, None)
    _state["finder"] = None
    _state["names"] = []
    importlib.invalidate_caches()


_USAGE = (
    "usage: fp8sim run [--device-map cuda=cpu] [--scaled-mm ACCUMULATOR|PROFILE] [--quiet] SCRIPT.py|MODULE [ARGS...]\n"
)


def run(argv: list[str]) -> int:
    """``fp8sim run [--device-map cuda=cpu] [--quiet] SCRIPT|MODULE [ARGS...]``: run a Python file (or
    a module, e.g. ``pytest``) in a child interpreter where the shim is installed at start-up (also
    in its own child processes).  The banner is printed here, once; ``--device-map cuda=cpu`` runs
    scripts that hard-code CUDA on the CPU (an emulation convenience)."""
    import subprocess

    argv = list(argv)
    env = dict(os.environ)
    quiet = env.get("FP8SIM_QUIET", "0") == "1"
    scaled_mm_line = None
    while argv and argv[0].startswith("--"):
        opt = argv.pop(0)
        if opt == "--quiet":
            quiet = True
        elif opt == "--device-map" or opt.startswith("--device-map="):
            value = opt.partition("=")[2] if "=" in opt else (argv.pop(0) if argv else "")
            from ._device_map import parse_device_map

            try:
                parse_device_map(value)
            except ValueError as exc:
                sys.stderr.write(f"fp8sim run: {exc}\n")
                return 2
            env["FP8SIM_DEVICE_MAP"] = value
        elif opt == "--scaled-mm" or opt.startswith("--scaled-mm="):
            from ..gemm.emulate import split_scaled_mm_option  # torch._scaled_mm emulated too

            try:
                rest, scaled_mm_line = split_scaled_mm_option([opt, *argv])
            except ValueError as exc:
                sys.stderr.write(f"fp8sim run: {exc}\n")
                return 2
            argv = rest
        elif opt == "--":
            break
        else:
            sys.stderr.write(f"fp8sim run: unknown option {opt!r}\n{_USAGE}")
            return 2
    if not argv:
        sys.stderr.write(_USAGE)
        return 2
    if not quiet:
        sys.stderr.write(_banner())
    boot = tempfile.mkdtemp(prefix="fp8sim-run-")
    try:
        with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
            f.write("import fp8sim.run.shim\nfp8sim.run.shim.install(quiet=True)\n" + (scaled_mm_line or ""))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH", "")) if p)
        target = argv[0]
        explicit = os.path.exists(target) or target.startswith("-")  # a script, or python's own -m / -c
        cmd = [sys.executable, *argv] if explicit else [sys.executable, "-m", *argv]
        return subprocess.call(cmd, env=env)
    finally:
        shutil.rmtree(boot, ignore_errors=True)
