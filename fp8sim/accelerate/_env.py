"""accelerate's environment parsing (``utils/environment.py``): truth values, flags, a cleared environment."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["str_to_bool", "parse_flag_from_env", "parse_choice_from_env", "clear_environment"]

_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 (or True) for y/yes/t/true/on/1, 0 (or False) for n/no/f/false/off/0, any case; else ValueError."""
    value = value.lower()
    if value in _TRUE:
        return True if to_bool else 1
    if value in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The truth value of ``$key``, or of ``str(default)`` when it is unset."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """``$key`` as is, or ``default``."""
    return os.environ.get(key, str(default))


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Empty ``os.environ`` for the duration of the block; the previous environment comes back after it."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
