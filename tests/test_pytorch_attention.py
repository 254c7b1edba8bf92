"""DotProductAttention in high precision against torch's math SDPA in float64.

The reference masks are written here from TE's definitions (``get_full_mask`` docstring in
``transformer_engine/pytorch/attention/dot_product_attention/utils.py``: query i sees keys
``[i + off - left, i + off + right]``, ``off = s_kv - s_q`` for bottom-right alignment, per sequence
for padding masks; causal = window (-1, 0); padded query rows are zero) with Python loops, and the
attention itself is ``torch.ops.aten._scaled_dot_product_attention_math``.
"""

from __future__ import annotations

import itertools

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402

torch.set_num_threads(1)


def _ref_mask(b, sq, skv, mask_type, window, seq_q, seq_kv, bottom_right):
    """True = attend (torch's convention), [b, 1, sq, skv]."""
    left, right = window if window is not None else (-1, -1)
    if "causal" in mask_type:
        right = 0
    out = torch.zeros(b, 1, sq, skv, dtype=torch.bool)
    for n in range(b):
        lq, lk = (seq_q[n], seq_kv[n]) if "padding" in mask_type else (sq, skv)
        if mask_type in ("causal", "padding_causal"):
            off = 0
        elif "padding" in mask_type:
            off = (lk - lq) if bottom_right else 0
        else:
            off = (skv - sq) if bottom_right else 0
        for i, j in itertools.product(range(lq), range(lk)):
            lo = -(10**9) if left == -1 else i + off - left
            hi = 10**9 if right == -1 else i + off + right
            out[n, 0, i, j] = lo <= j <= hi
    return out


def _ref_attention(q, k, v, allow, scale, bias=None):
    """bhsd float64 math SDPA; rows with no visible key are 0."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    attn = torch.zeros(allow.shape, dtype=torch.float64).masked_fill(~allow, float("-inf"))
    if bias is not None:
        attn = attn + bias.double()
    empty = ~allow.any(-1, keepdim=True)
    attn = attn.masked_fill(empty, 0.0)
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=attn, scale=scale)
    return out.masked_fill(empty, 0.0)


def _inputs(fmt, b, sq, skv, h, hg, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = {"bshd": lambda s, n: (b, s, n, d), "sbhd": lambda s, n: (s, b, n, d)}[fmt]
    return [
        torch.randn(*shape(s, n), generator=g, dtype=torch.float64).to(dtype)
        for s, n in ((sq, h), (skv, hg), (skv, hg))
    ]


def _bhsd(x, fmt):
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def _unmerge(out, fmt, h):
    out = out.reshape(*out.shape[:2], h, -1)
    return _bhsd(out, fmt)


MASKS = [
    "no_mask",
    "causal",
    "causal_bottom_right",
    "padding",
    "padding_causal",
    "padding_causal_bottom_right",
    "arbitrary",
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("hg", [4, 2, 1])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", MASKS)
def test_high_precision_matches_float64_math_sdpa(mask_type, fmt, hg, dtype):
    b, sq, skv, h, d = 2, 6, 9, 4, 8
    q, k, v = _inputs(fmt, b, sq, skv, h, hg, d, dtype)
    seq_q, seq_kv = [6, 3], [9, 5]
    attention_mask = None
    arb = None
    if "padding" in mask_type:
        mq = torch.arange(sq).view(1, sq) >= torch.tensor(seq_q).view(b, 1)
        mk = torch.arange(skv).view(1, skv) >= torch.tensor(seq_kv).view(b, 1)
        attention_mask = (mq.view(b, 1, 1, sq), mk.view(b, 1, 1, skv))
    elif mask_type == "arbitrary":
        arb = torch.rand(b, 1, sq, skv, generator=torch.Generator().manual_seed(3)) < 0.3
        attention_mask = arb
    dpa = DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask_type, attention_type="cross")
    out = dpa(q, k, v, attention_mask=attention_mask)
    allow = _ref_mask(b, sq, skv, mask_type, None, seq_q, seq_kv, bottom_right=True)
    if arb is not None:
        allow = allow & ~arb
    ref = _ref_attention(*(_bhsd(x, fmt).double() for x in (q, k, v)), allow, d**-0.5).to(dtype)
    got = _unmerge(out, fmt, h)
    assert got.dtype == dtype
    tol = {torch.float32: dict(rtol=2e-6, atol=1e-6), torch.float64: dict(rtol=1e-13, atol=1e-14)}[dtype]
    torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize(
    "window,mask_type,brd",
    [
        ((2, 1), "no_mask", None),
        ((2, 1), "no_mask", False),
        ((3, 0), "causal", None),
        ((1, 0), "causal_bottom_right", None),
        ((2, 2), "padding", None),
        ((2, 2), "padding", False),
        ((0, 0), "padding_causal", None),
    ],
)
def test_sliding_window_matches_reference(window, mask_type, brd):
    b, sq, skv, h, d = 2, 5, 7, 2, 4
    q, k, v = _inputs("bshd", b, sq, skv, h, h, d, torch.float64, seed=1)
    seq_q, seq_kv = [5, 4], [7, 3]
    mq = (torch.arange(sq).view(1, sq) >= torch.tensor(seq_q).view(b, 1)).view(b, 1, 1, sq)
    mk = (torch.arange(skv).view(1, skv) >= torch.tensor(seq_kv).view(b, 1)).view(b, 1, 1, skv)
    dpa = DotProductAttention(
        h,
        d,
        qkv_format="bshd",
        attn_mask_type=mask_type,
        window_size=window,
        attention_type="cross",
        bottom_right_diagonal=brd,
    )
    out = dpa(q, k, v, attention_mask=(mq, mk) if "padding" in mask_type else None)
    bottom_right = mask_type not in ("causal", "padding_causal") and (brd is None or brd)
    allow = _ref_mask(b, sq, skv, mask_type, window, seq_q, seq_kv, bottom_right)
    ref = _ref_attention(*(_bhsd(x, "bshd") for x in (q, k, v)), allow, d**-0.5)
    torch.testing.assert_close(_unmerge(out, "bshd", h), ref, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("mask_type", ["padding", "padding_causal"])
def test_thd_matches_per_sequence_reference(mask_type, padded):
    """Packed sequences: each sequence attends within itself; padding between sequences is skipped
    (``cu_seqlens_*_padded``) and its output rows are zero."""
    h, hg, d, lens = 4, 2, 8, [3, 5, 1]
    gaps = [1, 0, 2] if padded else [0, 0, 0]
    cu = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    cu_pad = torch.tensor([0, 4, 9, 12], dtype=torch.int32) if padded else None
    t = 12 if padded else 9
    g = torch.Generator().manual_seed(5)
    q = torch.randn(t, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(t, hg, d, generator=g, dtype=torch.float64)
    v = torch.randn(t, hg, d, generator=g, dtype=torch.float64)
    dpa = DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="thd", attn_mask_type=mask_type)
    out = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad)
    assert out.shape == (t, h * d)
    start = 0
    covered = torch.zeros(t, dtype=torch.bool)
    for n, gap in zip(lens, gaps, strict=True):
        rows = slice(start, start + n)
        qs, ks, vs = (x[rows].permute(1, 0, 2).unsqueeze(0) for x in (q, k, v))
        allow = _ref_mask(1, n, n, "causal" if "causal" in mask_type else "no_mask", None, None, None, True)
        ref = _ref_attention(qs, ks, vs, allow, d**-0.5)[0].permute(1, 0, 2).reshape(n, h * d)
        torch.testing.assert_close(out[rows], ref, rtol=1e-13, atol=1e-14)
        covered[rows] = True
        start += n + gap
    assert torch.all(out[~covered] == 0)


@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias", "alibi"])
def test_bias_types_match_reference(bias_type):
    b, s, h, d = 1, 6, 4, 8
    q, k, v = _inputs("bshd", b, s, s, h, h, d, torch.float64, seed=2)
    scale = 0.3
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", softmax_scale=scale)
    bias = torch.randn(1, h, s, s, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    allow = _ref_mask(b, s, s, "causal", None, None, None, False)
    qb, kb, vb = (_bhsd(x, "bshd") for x in (q, k, v))
    if bias_type == "alibi":
        # TE get_alibi: slopes 2^(-8 i / n) for n = 4 heads; bias = -slope * |i - j| (top-left for causal)
        slopes = torch.tensor([2.0 ** (-8.0 * i / h) for i in range(1, h + 1)], dtype=torch.float64)
        dist = (torch.arange(s).view(s, 1) - torch.arange(s).view(1, s)).abs().double()
        ref_bias = (-slopes.view(1, h, 1, 1) * dist).float().double()
        out = dpa(q, k, v, core_attention_bias_type="alibi")
        ref = _ref_attention(qb, kb, vb, allow, scale, ref_bias)
    else:
        out = dpa(q, k, v, core_attention_bias_type=bias_type, core_attention_bias=bias)
        # pre_scale: scale * (QK^T + bias) = scale QK^T + scale bias
        ref = _ref_attention(qb, kb, vb, allow, scale, bias * scale if bias_type == "pre_scale_bias" else bias)
    torch.testing.assert_close(_unmerge(out, "bshd", h), ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("init", "call"), [("causal", "no_mask"), ("no_mask", "causal")])
def test_forward_attn_mask_type_overrides_the_modules(init, call):
    """TE DotProductAttention.forward: ``attn_mask_type`` given to the call wins over the module's (the
    module's is used only when the call's is None)."""
    b, s, h, d = 1, 5, 2, 8
    q, k, v = _inputs("bshd", b, s, s, h, h, d, torch.float64, seed=6)
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=init)
    allow = _ref_mask(b, s, s, call, None, None, None, False)
    ref = _ref_attention(*(_bhsd(x, "bshd") for x in (q, k, v)), allow, d**-0.5)
    torch.testing.assert_close(_unmerge(dpa(q, k, v, attn_mask_type=call), "bshd", h), ref, rtol=1e-12, atol=1e-13)


def test_backward_matches_autograd_of_float64_reference():
    """Gradients of the explicit softmax backward equal autograd through math SDPA (GQA, causal)."""
    b, s, h, hg, d = 2, 5, 4, 2, 8
    q, k, v = (x.requires_grad_() for x in _inputs("sbhd", b, s, s, h, hg, d, torch.float64, seed=4))
    dpa = DotProductAttention(h, d, num_gqa_groups=hg, attn_mask_type="causal")
    out = dpa(q, k, v)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), go)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    allow = _ref_mask(b, s, s, "causal", None, None, None, False)
    ref = _ref_attention(*(_bhsd(x, "sbhd") for x in (q2, k2, v2)), allow, d**-0.5)
    ref = ref.permute(2, 0, 1, 3).reshape(s, b, -1)
    ref_grads = torch.autograd.grad(ref, (q2, k2, v2), go)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def test_dropout_zero_in_eval_and_scaled_in_training():
    torch.manual_seed(0)
    b, s, h, d = 1, 4, 2, 4
    q, k, v = _inputs("sbhd", b, s, s, h, h, d, torch.float32)
    dpa = DotProductAttention(h, d, attention_dropout=0.5, attn_mask_type="no_mask").eval()
    ref = DotProductAttention(h, d, attn_mask_type="no_mask")(q, k, v)
    torch.testing.assert_close(dpa(q, k, v), ref, rtol=0, atol=0)
    dpa.train()
    assert not torch.equal(dpa(q, k, v), ref)


# ---- bad input ------------------------------------------------------------------------------------------
def _dpa(**kw):
    return DotProductAttention(4, 8, **kw)


@pytest.mark.parametrize(
    "make,call,match",
    [
        (lambda: _dpa(num_gqa_groups=3), None, "divisible by the number of GQA groups"),
        (lambda: _dpa(attn_mask_type="causal_left"), None, "Invalid attn_mask_type"),
        (lambda: _dpa(qkv_format="bhsd"), None, "only supports qkv_format"),
        (lambda: _dpa(attn_mask_type="causal", window_size=(-2, 0)), None, r"window_size should be \(-1, 0\)"),
        (lambda: _dpa(attn_mask_type="no_mask", window_size=(2, -3)), None, r"window_size should be \(-1, -1\)"),
        (
            _dpa,
            lambda m: m(torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8)),
            "Keys and values must have num_gqa_group = 4",
        ),
        (
            lambda: _dpa(num_gqa_groups=2),
            lambda m: m(torch.randn(4, 2, 3, 8), torch.randn(4, 2, 2, 8), torch.randn(4, 2, 2, 8)),
            "num_attention_heads = 4",
        ),
        (
            _dpa,
            lambda m: m(torch.randn(4, 2, 4, 6), torch.randn(4, 2, 4, 6), torch.randn(4, 2, 4, 6)),
            "expected head_dim = 8",
        ),
        (
            _dpa,
            lambda m: m(torch.randn(4, 2, 4, 8), torch.randn(4, 2, 4, 8), torch.randn(3, 2, 4, 8)),
            "Keys and values must have the same batch size",
        ),
        (
            lambda: _dpa(qkv_format="thd"),
            lambda m: m(torch.randn(4, 4, 8), torch.randn(4, 4, 8), torch.randn(4, 4, 8)),
            "padding or padding_causal for qkv_format=thd",
        ),
        (
            lambda: _dpa(qkv_format="thd", attn_mask_type="padding"),
            lambda m: m(torch.randn(4, 4, 8), torch.randn(4, 4, 8), torch.randn(4, 4, 8)),
            "cu_seqlens_q and cu_seqlens_kv can not be None",
        ),
        (
            lambda: _dpa(qkv_format="thd", attn_mask_type="padding"),
            lambda m: m(
                *(torch.randn(4, 4, 8) for _ in range(3)),
                cu_seqlens_q=torch.tensor([0, 2, 4]),
                cu_seqlens_kv=torch.tensor([0, 2, 4]),
            ),
            "dtype torch.int32",
        ),
        (
            lambda: _dpa(qkv_format="thd", attn_mask_type="padding"),
            lambda m: m(
                *(torch.randn(4, 4, 8) for _ in range(3)),
                cu_seqlens_q=torch.tensor([0, 2, 6], dtype=torch.int32),
                cu_seqlens_kv=torch.tensor([0, 2, 6], dtype=torch.int32),
            ),
            "cu_seqlens_q ends at 6, beyond",
        ),
        (
            lambda: _dpa(qkv_format="thd", attn_mask_type="padding"),
            lambda m: m(
                *(torch.randn(4, 4, 8) for _ in range(3)),
                cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32),
                cu_seqlens_kv=torch.tensor([0, 3, 2], dtype=torch.int32),
            ),
            "non-decreasing",
        ),
        (
            lambda: _dpa(qkv_format="bshd", attn_mask_type="padding"),
            lambda m: m(*(torch.randn(2, 4, 4, 8) for _ in range(3))),
            "Please provide attention_mask for padding",
        ),
        (
            lambda: _dpa(qkv_format="bshd", attn_mask_type="padding"),
            lambda m: m(
                *(torch.randn(2, 4, 4, 8) for _ in range(3)), attention_mask=torch.zeros(2, 4, dtype=torch.bool)
            ),
            r"shape \[batch_size, 1, 1, seqlen\]",
        ),
        (
            lambda: _dpa(qkv_format="bshd", attn_mask_type="padding"),
            lambda m: m(
                *(torch.randn(2, 4, 4, 8) for _ in range(3)), cu_seqlens_q=torch.tensor([0, 5, 7], dtype=torch.int32)
            ),
            "longer than the tensor's sequence",
        ),
        (lambda: _dpa(qkv_format="bshd"), lambda m: m(*(torch.randn(2, 4, 8) for _ in range(3))), "must be 4D tensors"),
        (
            lambda: _dpa(qkv_format="bshd"),
            lambda m: m(*(torch.randn(2, 4, 4, 8) for _ in range(3)), core_attention_bias_type="post_scale_bias"),
            "core_attention_bias should not be None",
        ),
        (
            lambda: _dpa(qkv_format="bshd"),
            lambda m: m(*(torch.randn(2, 4, 4, 8) for _ in range(3)), alibi_slopes=torch.ones(4)),
            "must be alibi in order to use",
        ),
    ],
)
def test_bad_input_gets_te_message(make, call, match):
    with pytest.raises((AssertionError, ValueError), match=match):
        m = make()
        call(m)
