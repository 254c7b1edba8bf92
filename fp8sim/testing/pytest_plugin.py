"""fp8sim's pytest plugin, opt-in: installed with fp8sim (entry point ``pytest11``) and inert until
enabled with ``--fp8sim`` on the command line or ``fp8sim = true`` in the pytest ini options.

Enabled, it adds:

- the ``gpu`` marker (unless the project already declares one): a marked test is skipped unless
  torch sees a CUDA device of compute capability >= 8.9 (float8 tensor cores: Ada, Hopper,
  Blackwell);
- the ``fp8_recipe`` fixture, parametrised over a fresh instance of each TransformerEngine recipe
  in :data:`RECIPES` (ids are the class names).

Without the entry point (e.g. fp8sim not pip-installed), load it with ``-p fp8sim.testing.pytest_plugin``.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import pytest

__all__ = ["RECIPES", "gpu_skip_reason"]

RECIPES: tuple[str, ...] = (
    "DelayedScaling",
    "Float8CurrentScaling",
    "MXFP8BlockScaling",
    "Float8BlockScaling",
    "NVFP4BlockScaling",
)
"""Classes of ``fp8sim.recipe`` the ``fp8_recipe`` fixture runs over, each built with defaults."""

_ENTRY_POINT = "fp8sim"
_GPU_MARKER = "gpu: needs a CUDA device with float8 support (compute capability >= 8.9); skipped elsewhere"


def pytest_plugin_registered(plugin: Any, plugin_name: str, manager: pytest.PytestPluginManager) -> None:
    """Load once: registered under one name (the entry point, or ``-p`` / ``pytest_plugins`` by module
    name), block the other, which would register this module a second time."""
    if plugin is sys.modules[__name__]:
        other = __name__ if plugin_name == _ENTRY_POINT else _ENTRY_POINT
        if manager.get_plugin(other) is None and not manager.is_blocked(other):
            manager.set_blocked(other)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fp8sim", "fp8sim FP8 testing kit")
    group.addoption(
        "--fp8sim",
        action="store_true",
        default=False,
        dest="fp8sim",
        help="enable fp8sim's plugin: the gpu marker and the fp8_recipe fixture",
    )
    parser.addini("fp8sim", type="bool", default=False, help="enable fp8sim's plugin (as --fp8sim)")


def _enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("fp8sim", default=False) or config.getini("fp8sim"))


def _declared_markers(config: pytest.Config) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}


def pytest_configure(config: pytest.Config) -> None:
    if not _enabled(config):
        return
    if "gpu" not in _declared_markers(config):
        config.addinivalue_line("markers", _GPU_MARKER)
    config.pluginmanager.register(_EnabledPlugin(), "fp8sim-enabled")


@cache
def gpu_skip_reason() -> str | None:
    """Why ``gpu`` tests are skipped here, or None when torch sees a CUDA device with compute
    capability >= 8.9."""
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA (pip install torch)"
    if not torch.cuda.is_available():
        return "needs a CUDA device with float8 support; torch sees none"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"needs compute capability >= 8.9 for float8; the device has {major}.{minor}"
    return None


class _EnabledPlugin:
    """What ``--fp8sim`` switches on (registered only when enabled)."""

    @pytest.fixture(params=RECIPES)
    def fp8_recipe(self, request: pytest.FixtureRequest) -> Any:
        """A fresh TransformerEngine recipe (``fp8sim.recipe``) with default fields, one per class
        in ``RECIPES``."""
        from .. import recipe

        return getattr(recipe, request.param)()

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.get_closest_marker("gpu") is not None:
            reason = gpu_skip_reason()
            if reason is not None:
                pytest.skip(reason)

    def pytest_report_header(self, config: pytest.Config) -> str:
        return "fp8sim: plugin enabled (gpu marker, fp8_recipe fixture)"
