"""DotProductAttention's ALiBi bias and its padding masks built from ``cu_seqlens``, per sequence, against
float64 math SDPA (``torch.ops.aten._scaled_dot_product_attention_math``).

ALiBi as TE defines it (``transformer_engine/pytorch/attention/dot_product_attention/utils.py`` at d0067d0,
``get_alibi``, lines 1925-1965): n = the largest power of two <= h; slopes ``2^(-8 j / n)`` for j = 1..n, then
for h > n the odd powers ``2^(-4 j / n)``, j = 1, 3, ..., 2 (h - n) - 1; per-batch slopes may be ``[b, h]``;
the bias of query i and key j is ``-slope * |i - j + off|`` with ``off = s_kv - s_q`` (bottom-right, no
padding), ``actual_kv - actual_q`` per sequence (bottom-right with padding) or 0 (top-left).
"""

from __future__ import annotations

import re

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402

torch.set_num_threads(1)


def _te_default_slopes(h: int) -> list[float]:
    """TE utils.py 1925-1932, in Python floats."""
    n = 1
    while n * 2 <= h:
        n *= 2
    slopes = [2.0 ** (-8.0 * j / n) for j in range(1, n + 1)]
    return slopes + [2.0 ** (-4.0 * j / n) for j in range(1, 2 * (h - n), 2)]


def _sdpa(q, k, v, scale, bias=None):
    """[h, sq, d] x [h, skv, d] float64 math SDPA with an additive float bias."""
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        attn_mask=None if bias is None else bias.unsqueeze(0),
        scale=scale,
    )
    return out[0]


def _alibi(slopes_h: torch.Tensor, lq: int, lk: int, off: int) -> torch.Tensor:
    """[h, lq, lk]: -slope * |i - j + off| in float64 from float32 slopes."""
    i = torch.arange(lq).view(lq, 1)
    j = torch.arange(lk).view(1, lk)
    dist = (i - j + off).abs().double()
    return -slopes_h.double().view(-1, 1, 1) * dist


def _qkv(b, sq, skv, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g, dtype=torch.float64) for s in (sq, skv, skv)]


def _per_sequence(out, q, k, v, lens_q, lens_kv, scale, slopes=None, bottom_right=True):
    """out ([b, sq, h*d], bshd) against each sequence's own attention; rows past a query's length are zero."""
    b, sq, h, d = q.shape
    got = out.reshape(b, sq, h, d)
    for n in range(b):
        lq, lk = lens_q[n], lens_kv[n]
        qs, ks, vs = (x[n, :length].permute(1, 0, 2) for x, length in ((q, lq), (k, lk), (v, lk)))
        bias = None
        if slopes is not None:
            bias = _alibi(slopes[n] if slopes.dim() == 2 else slopes, lq, lk, (lk - lq) if bottom_right else 0)
        ref = _sdpa(qs, ks, vs, scale, bias).permute(1, 0, 2)
        torch.testing.assert_close(got[n, :lq], ref, rtol=1e-6, atol=1e-7)
        assert torch.all(got[n, lq:] == 0)


# -- ALiBi -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("brd", [None, False])
@pytest.mark.parametrize("h", [12, 4])
def test_alibi_default_slopes_and_alignment_are_tes(h: int, brd) -> None:
    """No padding, s_q != s_kv: TE's default slopes (12 heads: 8 powers of 2^-1, then 4 odd powers of 2^-1/2)
    and the offset s_kv - s_q under bottom-right alignment (the no_mask default), 0 under top-left (s_kv <= s_q + 1:
    TE's top-left no_mask window reaches s_q keys to the right of the diagonal, all of them here)."""
    b, sq, skv, d, scale = 2, 3, 4, 4, 0.5
    q, k, v = _qkv(b, sq, skv, h, d, seed=11)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=scale)
    out = dpa(q, k, v, core_attention_bias_type="alibi", bottom_right_diagonal=brd)
    slopes = torch.tensor(_te_default_slopes(h), dtype=torch.float32)
    assert len(slopes) == h
    _per_sequence(out, q, k, v, [sq] * b, [skv] * b, scale, slopes, bottom_right=brd is None)


def test_alibi_per_batch_slopes_with_padding_take_each_sequences_offset() -> None:
    """``[b, h]`` slopes and a cross-attention padding mask: sequence n's bias is its own slopes times
    ``|i - j + actual_kv - actual_q|`` (bottom-right, the padding default)."""
    b, sq, skv, h, d, scale = 2, 4, 6, 3, 4, 0.7
    q, k, v = _qkv(b, sq, skv, h, d, seed=12)
    lens_q, lens_kv = [4, 2], [3, 6]
    slopes = torch.tensor([[0.5, 0.25, 0.125], [1.0, 0.3, 0.05]], dtype=torch.float32)
    mq = (torch.arange(sq).view(1, sq) >= torch.tensor(lens_q).view(b, 1)).view(b, 1, 1, sq)
    mk = (torch.arange(skv).view(1, skv) >= torch.tensor(lens_kv).view(b, 1)).view(b, 1, 1, skv)
    dpa = DotProductAttention(
        h, d, qkv_format="bshd", attn_mask_type="padding", attention_type="cross", softmax_scale=scale
    )
    out = dpa(q, k, v, attention_mask=(mq, mk), core_attention_bias_type="alibi", alibi_slopes=slopes)
    _per_sequence(out, q, k, v, lens_q, lens_kv, scale, slopes)


def test_alibi_per_batch_slopes_without_padding() -> None:
    """``[b, h]`` slopes without a padding mask: each batch row its own slopes, offset s_kv - s_q."""
    b, sq, skv, h, d, scale = 2, 2, 4, 2, 4, 0.6
    q, k, v = _qkv(b, sq, skv, h, d, seed=13)
    slopes = torch.tensor([[0.5, 0.125], [0.9, 0.02]], dtype=torch.float32)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=scale)
    out = dpa(q, k, v, core_attention_bias_type="alibi", alibi_slopes=slopes)
    _per_sequence(out, q, k, v, [sq] * b, [skv] * b, scale, slopes)


def test_alibi_slopes_of_three_dimensions_get_tes_message() -> None:
    q, k, v = _qkv(1, 2, 2, 2, 4, seed=14)
    dpa = DotProductAttention(2, 4, qkv_format="bshd", attn_mask_type="no_mask")
    with pytest.raises(ValueError, match=r"^ALiBi slopes cannot exceed 2 dimensions\.$"):
        dpa(q, k, v, core_attention_bias_type="alibi", alibi_slopes=torch.ones(1, 1, 2))


# -- padding masks from cu_seqlens (bshd / sbhd) -------------------------------------------------------------


def test_cross_attention_padding_from_cu_seqlens_q_and_kv() -> None:
    """No ``attention_mask``: the query and key/value lengths come from ``cu_seqlens_q`` / ``cu_seqlens_kv``
    (a sequence may fill the whole sequence dimension)."""
    b, sq, skv, h, d = 2, 5, 6, 2, 4
    q, k, v = _qkv(b, sq, skv, h, d, seed=15)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding", attention_type="cross")
    cu_q = torch.tensor([0, 5, 7], dtype=torch.int32)
    cu_kv = torch.tensor([0, 3, 9], dtype=torch.int32)
    out = dpa(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    _per_sequence(out, q, k, v, [5, 2], [3, 6], d**-0.5)


def test_self_attention_padding_takes_cu_seqlens_q_for_both_and_ignores_entries_past_the_batch() -> None:
    """``cu_seqlens_kv`` None: the keys' lengths are the queries'; entries past ``b + 1`` are not read."""
    b, s, h, d = 2, 5, 2, 4
    q, k, v = _qkv(b, s, s, h, d, seed=16)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding")
    out = dpa(q, k, v, cu_seqlens_q=torch.tensor([0, 5, 7, 7], dtype=torch.int32))
    _per_sequence(out, q, k, v, [5, 2], [5, 2], d**-0.5)


@pytest.mark.parametrize(
    ("cu_q", "cu_kv", "match"),
    [
        ([0, 6, 7], [0, 3, 9], r"^cu_seqlens_q has a sequence longer than the tensor's sequence dimension \(5\)$"),
        ([0, 5, 7], [0, 7, 9], r"^cu_seqlens_kv has a sequence longer than the tensor's sequence dimension \(6\)$"),
        ([1, 5, 7], [0, 3, 9], r"^cu_seqlens_q must start at 0 and be non-decreasing"),
        ([0, 5, 7], [0, 3, 2], r"^cu_seqlens_kv must start at 0 and be non-decreasing"),
    ],
)
def test_bad_cu_seqlens_for_a_padding_mask_are_named(cu_q, cu_kv, match) -> None:
    q, k, v = _qkv(2, 5, 6, 2, 4, seed=17)
    dpa = DotProductAttention(2, 4, qkv_format="bshd", attn_mask_type="padding", attention_type="cross")
    with pytest.raises(ValueError, match=match):
        dpa(
            q,
            k,
            v,
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32),
            cu_seqlens_kv=torch.tensor(cu_kv, dtype=torch.int32),
        )


def test_padding_without_mask_or_cu_seqlens_gets_tes_message() -> None:
    q, k, v = _qkv(2, 3, 3, 2, 4, seed=18)
    dpa = DotProductAttention(2, 4, qkv_format="bshd", attn_mask_type="padding")
    with pytest.raises(AssertionError, match=r"^Please provide attention_mask for padding!$"):
        dpa(q, k, v)


def _mask(b: int, s: int) -> torch.Tensor:
    return torch.zeros(b, 1, 1, s, dtype=torch.bool)


@pytest.mark.parametrize(
    ("attention_type", "mask", "message"),
    [
        ("cross", _mask(2, 3), "attention_mask for cross attention with a padding mask is a tuple (mask_q, mask_kv)"),
        (
            "cross",
            (_mask(2, 3), _mask(2, 5), _mask(2, 5)),
            "attention_mask for cross attention with a padding mask is a tuple (mask_q, mask_kv)",
        ),
        (
            "cross",
            (torch.zeros(2, 3, dtype=torch.bool), _mask(2, 5)),
            "attention_mask (query) for a padding mask must be a bool tensor of shape [batch_size, 1, 1, seqlen] = "
            "[2, 1, 1, 3]; got torch.bool [2, 3]",
        ),
        (
            "cross",
            (_mask(2, 3), _mask(2, 5).float()),
            "attention_mask (key/value) for a padding mask must be a bool tensor of shape [batch_size, 1, 1, seqlen] = "
            "[2, 1, 1, 5]; got torch.float32 [2, 1, 1, 5]",
        ),
    ],
)
def test_bad_padding_masks_are_named_with_the_expected_shape(attention_type, mask, message: str) -> None:
    q, k, v = _qkv(2, 3, 5, 2, 4, seed=19)
    dpa = DotProductAttention(2, 4, qkv_format="bshd", attn_mask_type="padding", attention_type=attention_type)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        dpa(q, k, v, attention_mask=mask)
