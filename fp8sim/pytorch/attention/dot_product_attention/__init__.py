"""TE's ``attention/dot_product_attention`` package: the module, its backends and utilities."""

from .dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention"]
