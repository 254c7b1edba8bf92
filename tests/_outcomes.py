"""Shared by the accelerate tests that compare fp8sim with accelerate call by call."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or (exception type, message); warnings are silenced (their tests check them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", fn()
        except Exception as exc:  # noqa: BLE001 - the outcome is the comparison
            return type(exc).__name__, str(exc)
