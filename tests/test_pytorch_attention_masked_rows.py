"""A query whose every key is masked: cuDNN zero-fills its output row (TE's fused attention; ``backends.py``
docstring), so its dQ row is zero and nothing becomes NaN, in the high-precision path and in the F16 backward
that follows an FP8 forward (``NVTE_FP8_DPA_BWD=0``: P recomputed as ``exp(S - LSE)`` with the forward's
log-sum-exp, which is ``-inf`` for such a row)."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402
from fp8sim.recipe import DelayedScaling  # noqa: E402


@pytest.mark.parametrize("fp8", [False, True])
def test_a_fully_masked_query_row_gives_zero_output_and_zero_dq(monkeypatch, fp8: bool) -> None:
    monkeypatch.setenv("NVTE_FP8_DPA_BWD", "0")
    b, s, h, d = 2, 4, 4, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, s, h, d, generator=g).requires_grad_() for _ in range(3))
    do = torch.randn(b, s, h * d, generator=g)
    mask = torch.zeros(b, 1, s, s, dtype=torch.bool)
    mask[:, :, 1, :] = True  # query 1 sees no key
    mask[:, :, 2, 3] = True
    dpa = DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="arbitrary")
    with te.autocast(enabled=fp8, recipe=DelayedScaling(fp8_dpa=True)):
        out = dpa(q, k, v, attention_mask=mask)
    out.backward(do)
    assert torch.all(out.view(b, s, h, d)[:, 1] == 0)
    for name, grad in (("dQ", q.grad), ("dK", k.grad), ("dV", v.grad)):
        assert bool(torch.isfinite(grad).all()), name
    assert torch.all(q.grad[:, 1] == 0)
    assert bool((q.grad[:, 0] != 0).any())
