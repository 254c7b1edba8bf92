"""Packed ``thd`` attention: cross attention and max_seqlen against float64 math SDPA per sequence, and each check
of ``cu_seqlens`` / ``cu_seqlens_*_padded`` / ``max_seqlen_*`` with its whole message (TE's words where TE has the
check: ``transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py`` at d0067d0, lines
1784-1798, typo "cu_seqlens_q and cu_seqlens_q" included)."""

from __future__ import annotations

import re

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402

H, D = 2, 4


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _packed(t_q: int, t_kv: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t, H, D, generator=g, dtype=torch.float64) for t in (t_q, t_kv, t_kv)]


def _sdpa(q, k, v):
    """[s, h, d] float64 math SDPA, no mask."""
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(
        *(x.permute(1, 0, 2).unsqueeze(0) for x in (q, k, v)), scale=D**-0.5
    )
    return out[0].permute(1, 0, 2).reshape(q.shape[0], H * D)


def test_thd_cross_attention_attends_within_each_pair_of_sequences() -> None:
    """Sequence n's queries see sequence n's keys only; max_seqlen larger than needed changes nothing."""
    cu_q, cu_kv = _i32([0, 2, 5]), _i32([0, 4, 5])
    q, k, v = _packed(5, 5, seed=1)
    dpa = DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding", attention_type="cross")
    for max_q, max_kv in ((None, None), (7, 9)):
        out = dpa(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=max_q, max_seqlen_kv=max_kv)
        for (q0, q1), (k0, k1) in (((0, 2), (0, 4)), ((2, 5), (4, 5))):
            torch.testing.assert_close(out[q0:q1], _sdpa(q[q0:q1], k[k0:k1], v[k0:k1]), rtol=1e-13, atol=1e-14)
    # the same lengths for queries and keys: still cross attention
    out = dpa(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_q)
    torch.testing.assert_close(out[2:5], _sdpa(q[2:5], k[2:5], v[2:5]), rtol=1e-13, atol=1e-14)


def test_thd_sequences_may_be_empty() -> None:
    """``cu_seqlens`` is non-decreasing, not increasing: an empty sequence is allowed."""
    q, k, v = _packed(5, 5, seed=2)
    dpa = DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding")
    cu = _i32([0, 3, 3, 5])
    out = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    torch.testing.assert_close(out[3:5], _sdpa(q[3:5], k[3:5], v[3:5]), rtol=1e-13, atol=1e-14)


def _call(**kw):
    t_q, t_kv = kw.pop("t", (6, 6))
    q, k, v = _packed(t_q, t_kv)
    attention_type = kw.pop("attention_type", "self")
    mask = kw.pop("mask", "padding")
    dpa = DotProductAttention(H, D, qkv_format="thd", attn_mask_type=mask, attention_type=attention_type)
    return dpa(q, k, v, **kw)


CU = _i32([0, 2, 6])
CASES = [
    (dict(mask="causal", cu_seqlens_q=CU, cu_seqlens_kv=CU), AssertionError,
     "Attention mask type must be padding or padding_causal for qkv_format=thd!"),
    (dict(cu_seqlens_kv=CU), AssertionError, "cu_seqlens_q and cu_seqlens_kv can not be None when qkv_format = thd!"),
    (dict(cu_seqlens_q=CU), AssertionError, "cu_seqlens_q and cu_seqlens_kv can not be None when qkv_format = thd!"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=_i32([0, 2, 4, 6])), AssertionError,
     "cu_seqlens_q and cu_seqlens_q must both have shape [batch_size + 1]!"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=CU.long()), AssertionError,
     "cu_seqlens_q and cu_seqlens_q must both be in dtype torch.int32!"),
    (dict(cu_seqlens_q=_i32([0, 2, 5]), cu_seqlens_kv=CU, attention_type="cross", t=(6, 5)), ValueError,
     "cu_seqlens_kv ends at 6, beyond the tensor's 5 tokens"),
    (dict(cu_seqlens_q=_i32([1, 2, 6]), cu_seqlens_kv=_i32([1, 2, 6])), ValueError,
     "cu_seqlens_q must start at 0 and be non-decreasing; got [1, 2, 6]"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=CU, cu_seqlens_q_padded=_i32([0, 3, 2]), cu_seqlens_kv_padded=CU), ValueError,
     "cu_seqlens_q_padded must start at 0 and be non-decreasing; got [0, 3, 2]"),
    (dict(cu_seqlens_q=_i32([0, 2, 5]), cu_seqlens_kv=_i32([0, 2, 5]), cu_seqlens_q_padded=_i32([0, 3, 7]),
          cu_seqlens_kv_padded=_i32([0, 3, 6])), ValueError, "cu_seqlens_q ends at 7, beyond the tensor's 6 tokens"),
    (dict(cu_seqlens_q=_i32([0, 3, 5]), cu_seqlens_kv=_i32([0, 3, 5]), cu_seqlens_q_padded=_i32([0, 2, 5]),
          cu_seqlens_kv_padded=_i32([0, 3, 5])), ValueError,
     "cu_seqlens_q_padded leaves less room than cu_seqlens_q for some sequence"),
    (dict(cu_seqlens_q=_i32([0, 2, 5]), cu_seqlens_kv=_i32([0, 2, 5]), cu_seqlens_q_padded=_i32([0, 3, 5]),
          cu_seqlens_kv_padded=_i32([0, 3, 6])), ValueError,
     "cu_seqlens_q_padded leaves less room than cu_seqlens_q for some sequence"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=CU, max_seqlen_q=3), ValueError,
     "max_seqlen_q / max_seqlen_kv is smaller than the longest sequence in cu_seqlens"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=CU, max_seqlen_kv=3), ValueError,
     "max_seqlen_q / max_seqlen_kv is smaller than the longest sequence in cu_seqlens"),
    (dict(cu_seqlens_q=CU, cu_seqlens_kv=_i32([0, 3, 6])), ValueError,
     "self attention with qkv_format='thd' needs cu_seqlens_q == cu_seqlens_kv"),
]  # fmt: skip


@pytest.mark.parametrize(("kw", "exc", "message"), CASES)
def test_thd_checks_raise_with_the_whole_message(kw: dict, exc: type, message: str) -> None:
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        _call(**kw)


def test_thd_inputs_must_be_3d_with_tes_message() -> None:
    dpa = DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding")
    x = torch.randn(1, 6, H, D)
    with pytest.raises(AssertionError, match=r"^Queries, keys and values must be 3D tensors when qkv_format = thd!$"):
        dpa(x, x, x, cu_seqlens_q=CU, cu_seqlens_kv=CU)


@pytest.mark.parametrize(
    ("cu", "message"),
    [
        ([0, 4], "cu_seqlens_q must have shape [batch_size + 1] = [3]; got [2]"),
        ([[0, 2, 4]], "cu_seqlens_q must have shape [batch_size + 1] = [3]; got [1, 3]"),
    ],
)
def test_cu_seqlens_of_the_wrong_shape_for_a_padding_mask_are_named(cu, message: str) -> None:
    x = torch.randn(2, 4, H, D)
    dpa = DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="padding")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        dpa(x, x, x, cu_seqlens_q=_i32(cu))


def test_get_cu_seqlens_of_a_padding_mask_is_tes() -> None:
    """TE ``utils.py`` ``get_cu_seqlens`` (1975-1987): int32 ``[0, cumsum of the unpadded lengths]``."""
    from fp8sim.pytorch.attention.dot_product_attention.utils import get_cu_seqlens

    lengths, s = [3, 0, 5], 5
    mask = (torch.arange(s).view(1, s) >= torch.tensor(lengths).view(-1, 1)).view(3, 1, 1, s)
    got = get_cu_seqlens(mask)
    assert got.dtype == torch.int32 and got.tolist() == [0, 3, 3, 8]
