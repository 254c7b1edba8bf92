"""DotProductAttention edges of the attention core (``backends._Attention``) and its module state.

- Dropout in training (TE's unfused attention, ``dot_product_attention/backends.py`` UnfusedDotProductAttention:
  ``dropout(softmax(scale QK^T)) V`` with ``torch.nn.Dropout``'s ``keep / (1 - p)``): forward and every gradient
  against autograd through torch's own ops in float64 with the same keep mask (``rand_like(P) >= p`` drawn from
  the same seed).
- FP8 attention (delayed scaling) with a NaN in Q: that query row of that head is NaN, every other output
  element is the clean run's (torch's float8 cast keeps the NaN; per-tensor scales come from the history).
- ``fp8sim explain`` of an FP8 attention step: the six cuDNN GEMMs with their shapes (``m x k @ k x n``) and
  no GEMM name (``GemmPlan.gemm``: "" for a module's single GEMM set).
- ``_extra_state`` after a delayed-scaling FP8 step, as TE writes it (``module/base.py`` ``get_extra_state``:
  recipe, scales, amax histories, ``extra_fp8_variables``; DotProductAttention's ``num_gemms`` is 3), read back
  with fp8sim's TE-format decoder (tested against blobs built as TE builds them in
  ``tests/test_pytorch_tensor_extra_state.py``).
- Masks against float64 math SDPA per sequence (the helpers of ``tests/test_pytorch_attention_alibi_padding.py``):
  ``padding_causal_bottom_right`` aligns each sequence by its own lengths; "causal" forces top-left alignment of
  the window and of ALiBi (TE sets ``bottom_right_diagonal = False``); refusals with their whole messages.
"""

from __future__ import annotations

import pytest
from test_pytorch_attention_alibi_padding import _alibi, _per_sequence, _sdpa
from test_pytorch_attention_alibi_padding import _qkv as _qkv64

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim import recipe  # noqa: E402
from fp8sim.pytorch._extra_state_te import decode_te_extra_state  # noqa: E402


def test_dropout_forward_and_gradients_equal_torch_ops_with_the_same_mask() -> None:
    b, s, h, d, p = 2, 5, 2, 4, 0.5
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, s, h, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dpa = te.DotProductAttention(h, d, attention_dropout=p, attn_mask_type="no_mask", qkv_format="bshd")
    torch.manual_seed(7)
    out = dpa(q, k, v)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v), go)

    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    qb, kb, vb = (t.permute(0, 2, 1, 3) for t in (q2, k2, v2))
    probs = torch.softmax(qb @ kb.transpose(-1, -2) * d**-0.5, dim=-1)
    torch.manual_seed(7)
    keep = torch.rand_like(probs) >= p
    ref = ((probs * keep / (1 - p)) @ vb).permute(0, 2, 1, 3).reshape(b, s, h * d)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)
    for got, want in zip(grads, torch.autograd.grad(ref, (q2, k2, v2), go), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def _fp8_step(dpa: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    with te.autocast(enabled=True, recipe=recipe.DelayedScaling(fp8_dpa=True, amax_history_len=4)):
        return dpa(q, k, v, qkv_format="bshd")


def _dpa() -> torch.nn.Module:
    return te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")


def _qkv(skv: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, s, 2, 16, generator=g).to(torch.bfloat16) for s in (8, skv, skv)]


def test_a_nan_in_q_makes_only_its_own_row_nan_in_fp8_attention() -> None:
    q, k, v = _qkv()
    clean = _fp8_step(_dpa(), q, k, v).reshape(1, 8, 2, 16)
    q[0, 3, 1, 5] = float("nan")
    out = _fp8_step(_dpa(), q, k, v).reshape(1, 8, 2, 16)
    assert bool(torch.isnan(out[0, 3, 1]).all())
    rest = torch.ones_like(out, dtype=torch.bool)
    rest[0, 3, 1] = False
    assert torch.equal(out[rest], clean[rest])


def test_explain_lists_the_six_fp8_attention_gemms_with_their_shapes() -> None:
    dpa = _dpa()
    q, k, v = (t.requires_grad_(True) for t in _qkv(skv=6))
    with te.record_gemm_plans(model=dpa) as rec:
        _fp8_step(dpa, q, k, v).float().sum().backward()
    sq, skv, d = 8, 6, 16
    want = {"QK^T": (sq, skv, d), "PV": (sq, d, skv), "dV": (skv, d, sq), "dP": (sq, skv, d), "dQ": (sq, d, skv)}
    want["dK"] = (skv, d, sq)
    got = {p.role: (p.m, p.n, p.k) for p in rec.plans}
    assert got == want
    assert all(p.gemm == "" and p.batch == 2 and p.scaling == "tensorwise" for p in rec.plans)


def test_dpa_extra_state_is_tes_with_its_fp8_variables() -> None:
    dpa = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="causal")
    assert dpa.get_extra_state().numel() == 0  # no FP8 step yet: empty, as TE
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    _fp8_step(dpa, q, k, v).float().sum().backward()
    state = decode_te_extra_state(dpa.get_extra_state(), "DotProductAttention", allow_unsafe=True)
    assert state.extra_fp8_variables == {"fp8_checkpoint": True, "num_gemms": 3}
    assert tuple(state.scale_fwd.shape) == (9,) and tuple(state.amax_history_bwd.shape) == (4, 6)


# -- masks and messages of DotProductAttention.forward (TE dot_product_attention.py) ---------------------------


def test_padding_causal_bottom_right_aligns_each_sequence_by_its_own_lengths() -> None:
    """One query per sequence (the others padding): bottom-right causal lets it see every key of its sequence
    (offset ``actual_kv - actual_q`` per sequence, TE's get_full_mask)."""
    b, sq, skv, h, d = 2, 3, 5, 2, 4
    q, k, v = _qkv64(b, sq, skv, h, d, seed=21)
    lens_q, lens_kv = [1, 1], [4, 5]
    mq = (torch.arange(sq).view(1, sq) >= torch.tensor(lens_q).view(b, 1)).view(b, 1, 1, sq)
    mk = (torch.arange(skv).view(1, skv) >= torch.tensor(lens_kv).view(b, 1)).view(b, 1, 1, skv)
    dpa = te.DotProductAttention(
        h, d, qkv_format="bshd", attn_mask_type="padding_causal_bottom_right", attention_type="cross"
    )
    out = dpa(q, k, v, attention_mask=(mq, mk))
    _per_sequence(out, q, k, v, lens_q, lens_kv, d**-0.5)


def test_causal_alibi_is_aligned_top_left_even_when_the_module_says_bottom_right() -> None:
    """TE: ``attn_mask_type`` "causal" forces ``bottom_right_diagonal = False``, so with s_q < s_kv the causal
    window and the ALiBi distances ``|i - j|`` both start at the top-left corner, and the flag changes no bit.
    (Under a top-left causal mask a bottom-right ALiBi offset only adds a constant to each row, which softmax
    removes in exact arithmetic: the float64 check cannot see it, the float32 bits can.)"""
    b, sq, skv, h, d, scale = 1, 4, 6, 2, 4, 0.5
    q, k, v = _qkv64(b, sq, skv, h, d, seed=22)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float32)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", softmax_scale=scale)
    out = dpa(q, k, v, core_attention_bias_type="alibi", alibi_slopes=slopes, bottom_right_diagonal=True)
    bias = _alibi(slopes, sq, skv, 0)
    bias = bias.masked_fill(torch.arange(skv).view(1, skv) > torch.arange(sq).view(sq, 1), float("-inf"))
    ref = _sdpa(*(x[0].permute(1, 0, 2) for x in (q, k, v)), scale, bias).permute(1, 0, 2)
    torch.testing.assert_close(out.reshape(b, sq, h, d)[0], ref, rtol=1e-6, atol=1e-7)
    q32, k32, v32 = (x.float() for x in _qkv64(2, 16, 24, h, d, seed=23))
    slopes = torch.tensor([0.7, 0.3], dtype=torch.float32)
    outs = [
        dpa(q32, k32, v32, core_attention_bias_type="alibi", alibi_slopes=slopes, bottom_right_diagonal=flag)
        for flag in (True, False, None)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def _raises(kind: type, message: str, fn) -> None:  # noqa: ANN001
    with pytest.raises(kind) as info:
        fn()
    assert str(info.value) == message


def test_refusals_have_whole_messages() -> None:
    q, k, v = _qkv64(1, 2, 2, 2, 8, seed=23)
    _raises(
        NotImplementedError,
        "fp8sim emulates softmax_type='vanilla' only; got 'off-by-one'",
        lambda: te.DotProductAttention(2, 8, softmax_type="off-by-one"),
    )
    _raises(
        AssertionError, "attention_type both not supported", lambda: te.DotProductAttention(2, 8, attention_type="both")
    )
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask")
    _raises(
        NotImplementedError,
        "fp8sim does not emulate KV caching (inference_params)",
        lambda: dpa(q, k, v, inference_params=object()),
    )
    _raises(
        AssertionError,
        "core_attention_bias must be None when core_attention_bias_type is alibi!",  # TE's words
        lambda: dpa(q, k, v, core_attention_bias_type="alibi", core_attention_bias=torch.zeros(1, 2, 2, 2)),
    )
    arbitrary = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="arbitrary")
    _raises(AssertionError, "attention_mask must be given for attn_mask_type='arbitrary'", lambda: arbitrary(q, k, v))
    wide = te.DotProductAttention(2, 16, qkv_format="bshd", attn_mask_type="no_mask")
    _raises(AssertionError, "Keys have head_dim = 8, but expected head_dim = 16!", lambda: wide(q, k, v))
