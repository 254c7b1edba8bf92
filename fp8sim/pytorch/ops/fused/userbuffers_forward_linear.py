"""``UserbuffersForwardLinear`` (TE 2.20.0.dev0 ``ops/fused/userbuffers_forward_linear.py``): the forward GEMM
overlapped with its tensor-parallel communication through Userbuffers (peer-to-peer GPU buffers).
Not emulated: ``BasicLinear(userbuffers_options=...)``, which TE needs for this fusion, is refused, so the
fusion never applies; constructing the op is refused too."""

from __future__ import annotations

from typing import Any

from ..op import FusedOperation

__all__ = ["UserbuffersForwardLinear"]

_REFUSED = (
    "transformer_engine.pytorch.ops.fused.{} overlaps tensor-parallel communication with the GEMM through "
    "Userbuffers (CUDA peer-to-peer buffers); it is not emulated by fp8sim"
)


class UserbuffersForwardLinear(FusedOperation):
    """Refused (Userbuffers need CUDA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(_REFUSED.format(type(self).__name__))

    @staticmethod
    def fuse_forward_ops(ops: list, **unused: Any) -> list:
        """TE fuses only ops built with ``userbuffers_options``, which fp8sim refuses: nothing to fuse."""
        return ops
