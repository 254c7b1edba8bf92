"""TE's ``module/fp8_unpadding.py``: ``Fp8Unpadding`` (defined with ``Fp8Padding`` in ``fp8_padding.py``)."""

from .fp8_padding import Fp8Unpadding

__all__ = ["Fp8Unpadding"]
