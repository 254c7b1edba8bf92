"""Which FP8 backends count as installed: fp8sim's emulations stand in for TE and torchao; MS-AMP has none.

Everything asks through these functions (by module attribute), so a test can monkeypatch them to
play an environment without a backend.
"""

from __future__ import annotations

import importlib.util

__all__ = ["is_torchao_available", "is_transformer_engine_available", "is_msamp_available", "is_fp8_available"]


def _has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def is_torchao_available() -> bool:
    """fp8sim.torchao (torchao's float8 training, emulated) needs only torch."""
    return _has_torch()


def is_transformer_engine_available() -> bool:
    """fp8sim.pytorch (TransformerEngine's PyTorch modules, emulated) needs only torch."""
    return _has_torch()


def is_msamp_available() -> bool:
    """MS-AMP's O1/O2 numerics are not emulated, so MS-AMP never counts as installed."""
    return False


def is_fp8_available() -> bool:
    """accelerate's ``is_fp8_available``: any FP8 backend."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()
