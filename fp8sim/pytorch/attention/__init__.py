"""TE's ``transformer_engine.pytorch.attention``: DotProductAttention, MultiheadAttention, rotary embeddings."""

from .dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention"]
