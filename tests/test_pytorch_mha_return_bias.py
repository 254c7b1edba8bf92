"""``MultiheadAttention(return_bias=True)`` against TE's rule, with float64 references written here.

TE ``attention/multi_head_attention.py`` (d0067d0): ``proj`` is built with ``return_bias=return_bias``
(line 474; every QKV projection with ``return_bias=False``, lines 381-444), so the output projection leaves
its bias out of the GEMM and ``forward`` returns ``(attention_output, attention_bias)``, then
``layernorm_output`` with ``return_layernorm_output`` (lines 1236-1245).  Without ``return_bias`` TE adds the
bias in the GEMM's epilogue: the float32 accumulator plus the bias, one rounding to the activation dtype.  So
in float32 ``out + bias`` equals the ``return_bias=False`` output bit for bit, and in bfloat16 it need not
(the user's sum rounds twice).
"""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402

HIDDEN, HEADS = 32, 4


def _pair(dtype: torch.dtype, **kw: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights twice, ``return_bias`` False and True, with a non-zero ``proj`` bias (TE inits it to 0)."""
    torch.manual_seed(0)
    plain = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0, params_dtype=dtype, **kw)
    with torch.no_grad():
        plain.proj.bias.copy_(torch.randn(HIDDEN) * 4)
    rb = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0, params_dtype=dtype, return_bias=True, **kw)
    rb.load_state_dict(plain.state_dict())
    return plain, rb


def test_return_bias_leaves_proj_bias_unadded_and_returns_it_before_ln_out() -> None:
    """float32: ``(out, bias, ln_out)`` in TE's order; ``out + bias`` is the ``return_bias=False`` output bit
    for bit (float32 epilogue sum = the user's float32 sum); the gradients match (dy = 1: exact sums)."""
    plain, rb = _pair(torch.float32, input_layernorm=True, return_layernorm_output=True)
    assert rb.return_bias and rb.proj.return_bias and not rb.proj.apply_bias
    assert not rb.layernorm_qkv.return_bias  # TE: the QKV GEMM keeps its bias
    x = torch.randn(6, 2, HIDDEN)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ln = plain(x1)
    o, b, ln2 = rb(x2)
    assert b.dtype == torch.float32 and torch.equal(b, rb.proj.bias)
    assert b.requires_grad  # the returned bias is the parameter, so the user's add trains it
    assert torch.equal(ln2, ln)
    assert not torch.equal(o, out)  # negative control: the bias is really left out
    assert torch.equal(o + b, out)
    out.sum().backward()
    (o + b).sum().backward()
    assert torch.equal(x2.grad, x1.grad)
    grads = dict(plain.named_parameters())
    for name, p in rb.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name


def test_return_bias_without_bias_returns_none() -> None:
    """TE's ``Linear``: ``bias=False, return_bias=True`` returns ``(out, None)`` (test_custom_recipe.py's
    ``attn_out, _ = tl2_mha(h)``)."""
    m = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0, bias=False, return_bias=True)
    out, b = m(torch.randn(4, 2, HIDDEN))
    assert b is None and out.shape == (4, 2, HIDDEN)


@pytest.mark.parametrize("return_bias", [False, True])
def test_bf16_output_follows_te_epilogue_rule(return_bias: bool) -> None:
    """bfloat16: with ``proj``'s weight picking pairs of context columns the float32 accumulator is exact,
    so TE's rule is written in float64: ``bf16(fp32(acc + b))`` without ``return_bias`` (bias in the
    epilogue, one rounding), ``bf16(acc)`` with it; the user's ``bf16(out) + b`` rounds twice and differs."""
    plain, rb = _pair(torch.bfloat16)
    for m in (plain, rb):
        with torch.no_grad():  # out[:, i] = ctx[:, i] + ctx[:, i + 1 mod n]
            w = torch.eye(HIDDEN) + torch.roll(torch.eye(HIDDEN), 1, dims=1)
            m.proj.weight.copy_(w.to(torch.bfloat16))
    m = rb if return_bias else plain
    seen = []
    m.proj.register_forward_pre_hook(lambda _mod, args: seen.append(args[0].detach()))
    x = torch.randn(6, 2, HIDDEN, dtype=torch.bfloat16)
    res = m(x)
    ctx = seen[0].double()
    acc = ctx + torch.roll(ctx, -1, dims=-1)
    assert torch.equal(acc.float().double(), acc), "precondition: the float32 accumulator is exact"
    b64 = rb.proj.bias.detach().double()
    if return_bias:
        o, b = res
        assert b.dtype == torch.bfloat16 and torch.equal(b, rb.proj.bias)
        assert torch.equal(o, acc.float().bfloat16())
        with_bias = plain(x)
        assert torch.equal(with_bias, (acc + b64).float().bfloat16())
        assert not torch.equal(o + b, with_bias)  # double rounding: why bf16 out + bias is not bit-exact
    else:
        assert torch.equal(res, (acc + b64).float().bfloat16())
