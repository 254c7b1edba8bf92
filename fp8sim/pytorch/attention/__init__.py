"""TE's ``transformer_engine.pytorch.attention``: DotProductAttention, MultiheadAttention, rotary embeddings."""

from .dot_product_attention import DotProductAttention
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["DotProductAttention", "MultiheadAttention", "RotaryPositionEmbedding", "apply_rotary_pos_emb"]
