"""conftest.py for running TransformerEngine's own ``tests/pytorch`` files unchanged against fp8sim.

Copy it next to TE's test files as ``conftest.py`` and run them under the shim with CUDA mapped to the CPU::

    cp scripts/te_suite_conftest.py TE/tests/pytorch/conftest.py
    cd TE/tests/pytorch && fp8sim run --quiet --device-map cuda=cpu pytest -q -p no:cacheprovider test_fusible_ops.py

TE's shared ``tests/pytorch/utils.py`` imports attention internals at module level
(``InferenceParams``, ``dot_product_attention._attention_backends``, ``get_attention_backend``,
``AttentionParams``, ``AttentionLogging``, ``check_set_window_size``, ``FusedAttnBackend``) that only TE's
attention tests use.  Where fp8sim does not emulate one, this file puts a placeholder under its name so that
``utils.py`` imports, and any use of it raises ``NotImplementedError`` naming it; a name fp8sim emulates
(``check_set_window_size``, which ``utils.ModelConfig`` calls) is left as it is.  Nothing else is changed.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_PLACEHOLDERS = {
    "transformer_engine.pytorch": ["InferenceParams"],
    "transformer_engine.pytorch.attention.dot_product_attention.utils": [
        "get_attention_backend",
        "AttentionParams",
        "AttentionLogging",
        "check_set_window_size",
    ],
}
_MODULES = {
    "transformer_engine.pytorch.attention.dot_product_attention._attention_backends": [],
    "transformer_engine.pytorch.cpp_extensions.fused_attn": ["FusedAttnBackend"],
}


def _placeholder(dotted: str) -> type:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{dotted} is not emulated by fp8sim (placeholder from te_suite_conftest.py)")

    return type(dotted.rpartition(".")[2], (), {"__init__": refuse, "__call__": refuse})


def _install() -> None:
    if "transformer_engine" not in sys.modules and importlib.util.find_spec("transformer_engine") is None:
        return  # not under `fp8sim run`: nothing to stub
    for modname, names in _PLACEHOLDERS.items():
        mod = importlib.import_module(modname)
        for name in names:
            # the shim's modules resolve names through __getattr__, so ask hasattr, not vars(); a name fp8sim
            # emulates (check_set_window_size, ...) must stay the real one: ModelConfig calls it at import
            if not hasattr(mod, name):
                setattr(mod, name, _placeholder(f"{modname}.{name}"))
    for modname, names in _MODULES.items():
        mod = types.ModuleType(modname)
        mod.__path__ = []
        for name in names:
            setattr(mod, name, _placeholder(f"{modname}.{name}"))
        sys.modules[modname] = mod
        parent, _, leaf = modname.rpartition(".")
        setattr(importlib.import_module(parent), leaf, mod)


_install()
