"""``UserbuffersBackwardLinear`` (TE 2.20.0.dev0 ``ops/fused/userbuffers_backward_linear.py``): refused,
as :mod:`.userbuffers_forward_linear` (Userbuffers need CUDA)."""

from __future__ import annotations

from typing import Any

from ..op import FusedOperation
from .userbuffers_forward_linear import _REFUSED

__all__ = ["UserbuffersBackwardLinear"]


class UserbuffersBackwardLinear(FusedOperation):
    """Refused (Userbuffers need CUDA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_REFUSED.format(type(self).__name__))

    @staticmethod
    def fuse_backward_ops(ops: list, **unused: Any) -> list:
        """Nothing to fuse without ``userbuffers_options`` (refused by ``BasicLinear``)."""
        return ops
