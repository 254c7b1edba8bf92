"""``Sequential``: ``torch.nn.Sequential`` whose runs of fusible ops execute in one operation fuser
(TE 2.20.0.dev0 ``pytorch/ops/sequential.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .fuser import OperationFuser
from .op import BasicOperation, FusibleOperation

__all__ = ["Sequential"]


class Sequential(torch.nn.Module):
    """A container of modules; consecutive :class:`FusibleOperation` s form one fuser group.  Extra
    inputs are handed to the groups in order, extra outputs collected after the main output."""

    def __init__(self, *args: FusibleOperation | torch.nn.Module) -> None:
        super().__init__()
        self._module_groups: list | None = None
        self._last_global_state = None
        if len(args) == 1 and isinstance(args[0], dict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for module in args:
                self.append(module)

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        self._module_groups = None
        super().add_module(name, module)

    def _get_keys_by_idx(self, idx: int | slice) -> list[str]:
        keys = list(self._modules.keys())
        if isinstance(idx, slice):
            return keys[idx]
        if not -len(keys) <= idx < len(keys):
            raise IndexError(f"Attempted to access index {idx}, but there are {len(keys)} entries")
        return [keys[idx]]

    def _next_key(self) -> str:
        idx = 0
        for key in self._modules:
            try:
                idx = max(idx, int(key) + 1)
            except (ValueError, TypeError):
                pass
        return str(idx)

    def __getitem__(self, idx: slice | int) -> Sequential | torch.nn.Module:
        keys = self._get_keys_by_idx(idx)
        if isinstance(idx, slice):
            out = Sequential()
            out.extend(self._modules[k] for k in keys)
            return out
        return self._modules[keys[0]]

    def __setitem__(self, idx: int, module: torch.nn.Module) -> None:
        self._module_groups = None
        self._modules[self._get_keys_by_idx(idx)[0]] = module

    def __delitem__(self, idx: slice | int) -> None:
        self._module_groups = None
        for key in self._get_keys_by_idx(idx):
            del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def append(self, module: torch.nn.Module) -> Sequential:
        """Add a module at the end."""
        self.add_module(self._next_key(), module)
        return self

    def extend(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        """Add modules at the end."""
        for module in modules:
            self.append(module)
        return self

    def insert(self, idx: int, module: torch.nn.Module) -> Sequential:
        """Insert a module before position ``idx`` (the keys after it shift by one)."""
        self._module_groups = None
        keys = self._get_keys_by_idx(slice(idx, None))
        keys.append(self._next_key())
        for i in reversed(range(1, len(keys))):
            self._modules[keys[i]] = self._modules[keys[i - 1]]
        self._modules[keys[0]] = module
        return self

    def pop(self, idx: slice | int) -> torch.nn.Module:
        """Remove and return the module at ``idx``."""
        out = self[idx]
        del self[idx]
        return out

    def __iadd__(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        return self.extend(modules)

    def __add__(self, modules: Iterable[torch.nn.Module]) -> Sequential:
        out = Sequential()
        out.extend(self)
        out.extend(modules)
        return out

    @classmethod
    def _make_module_groups(cls, modules: Iterable[torch.nn.Module]) -> list:
        groups: list = []
        for module in modules:
            if isinstance(module, FusibleOperation):
                if not groups or not isinstance(groups[-1], list):
                    groups.append([])
                groups[-1].append(module)
            else:
                groups.append(module)
        return [OperationFuser(g) if isinstance(g, list) else g for g in groups]

    def forward(
        self,
        input: torch.Tensor,  # noqa: A002 - TE's name
        *extra_inputs: torch.Tensor,
        op_kwargs: dict[torch.nn.Module | int, dict[str, Any]] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run the groups in order.  ``op_kwargs``: keyword arguments for contained basic ops, keyed by
        the op or its index."""
        if self._module_groups is None:
            self._module_groups = self._make_module_groups(self._modules.values())
        group_kwargs = self._resolve_op_kwargs(op_kwargs)
        x, extra_outputs = input, []
        for group, kwargs in zip(self._module_groups, group_kwargs, strict=True):
            if isinstance(group, OperationFuser):
                k = group.num_extra_inputs
                xs, extra_inputs = (x, *extra_inputs[:k]), extra_inputs[k:]
                out = group(*xs, basic_op_kwargs=kwargs)
                if isinstance(out, tuple):
                    x = out[0]
                    extra_outputs.extend(out[1:])
                else:
                    x = out
            else:
                x = group(x)
        return (x, *extra_outputs) if extra_outputs else x

    def _resolve_op_kwargs(self, op_kwargs: dict | None) -> list:
        out: list = [None] * len(self._module_groups)
        if not op_kwargs:
            return out
        resolved: dict[int, dict[str, Any]] = {}
        for key, kwargs in op_kwargs.items():
            module = self[key] if isinstance(key, int) else key
            if not isinstance(module, BasicOperation):
                raise ValueError(
                    f"Attempted to provide forward kwargs to {type(module).__name__}, but "
                    "Sequential only allows providing forward kwargs to a BasicOperation."
                )
            resolved[id(module)] = kwargs
        for g, group in enumerate(self._module_groups):
            if isinstance(group, OperationFuser):
                out[g] = [resolved.pop(id(op), {}) for op in group._basic_ops]
        if resolved:
            raise ValueError("op_kwargs contains keys that are not in this Sequential")
        return out
