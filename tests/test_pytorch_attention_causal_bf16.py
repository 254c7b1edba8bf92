"""Causal-safe MXFP8 attention: ``DotProductAttention(pv_bf16=True)`` (cuDNN-frontend PR#983: Q, K in
MXFP8, the ``P V`` GEMM on BF16 operands, O written in BF16) and ``dqkv_bf16=True`` (PR#1123, draft: the
backward's sequence-reduction GEMMs ``dV = P^T dO``, ``dQ = dS K``, ``dK = dS^T Q`` on BF16 operands,
``dP = dO V^T`` still MXFP8).

The leak they remove is TE#3248's: MXFP8 blocks V (for ``P V``) and K, Q, dO (for the backward GEMMs)
along the sequence in 32s, so a token after t shares an E8M0 scale with tokens <= t.  References here:
BF16 rounding by ml_dtypes, MX blocks with numpy bit operations (TE's RCEIL rule, spec section 3), exact
sums with Python integers where the case is built for it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.attention import DotProductAttention  # noqa: E402
from fp8sim.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling  # noqa: E402

torch.set_num_threads(1)
MX = MXFP8BlockScaling(fp8_dpa=True)
E4 = ml_dtypes.float8_e4m3fn


def bf16(x: torch.Tensor) -> torch.Tensor:
    """RN-even to BF16 by ml_dtypes, back to float32."""
    return torch.from_numpy(x.detach().float().numpy().astype(ml_dtypes.bfloat16).astype(np.float32))


def mx(x: torch.Tensor, axis: int) -> torch.Tensor:
    """MXFP8 E4M3 (TE flavour) dequantized: blocks of 32 along ``axis``, E8M0 by RCEIL of amax / 448."""
    a = np.moveaxis(x.detach().float().numpy(), axis, -1)
    blocks = a.reshape(*a.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True).astype(np.float32)
    bits = (amax * np.float32(np.float32(1) / np.float32(448))).astype(np.float32).view(np.uint32)
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    e = np.minimum(np.where(exp == 0, (man > 0x400000).astype(np.uint32), exp + (man != 0)).astype(np.int64), 254)
    inv = np.ldexp(np.float32(1), 127 - e).astype(np.float32)
    elem = np.clip(blocks * inv, -448, 448).astype(E4).astype(np.float32)
    out = (elem * np.ldexp(np.float32(1), e - 127).astype(np.float32)).reshape(a.shape)
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(out, -1, axis)))


def _bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.detach().float().contiguous(), want.detach().float().contiguous()
    eq = got.view(torch.int32) == want.view(torch.int32)
    if not bool(eq.all()):
        i = int((~eq).flatten().nonzero()[0])
        g, w = got.flatten()[i], want.flatten()[i]
        raise AssertionError(
            f"{what}: {int((~eq).sum())} differ; first at flat index {i}: got {float(g)!r} "
            f"(0x{int(g.view(torch.int32)) & 0xFFFFFFFF:08x}), want {float(w)!r} "
            f"(0x{int(w.view(torch.int32)) & 0xFFFFFFFF:08x})"
        )


def _dpa(h: int, d: int, **kw) -> DotProductAttention:  # noqa: ANN003
    return DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", **kw)


def _data(s: int, h: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, s, h, d, generator=g) * c for c in (1.5, 0.7, 2.0, 1e-3)]


# ---- what is BF16 ---------------------------------------------------------------------------------------------
def test_pv_bf16_rounds_p_keeps_v_in_bf16_and_writes_o_in_bf16_exact_case() -> None:
    """Q = K = 1 makes every causal row of P uniform, P[t, j] = fl32(1 / (t + 1)); V = k / 16 with 8-bit
    integers k (BF16-exact, not E4M3-exact).  Then every product BF16(P) * V and every partial sum is exact in
    float32, whatever the order, so O[t] = BF16(BF16(P[t]) * sum_j<=t k_j / 16) is computed with integers.
    Quantizing P to E4M3, V to MXFP8, or leaving P or O in float32 each changes O."""
    s, d = 128, 32
    rng = np.random.default_rng(0)
    kint = rng.integers(-127, 128, size=(s, d))
    q = torch.ones(1, s, 1, d)
    v = torch.from_numpy((kint / 16).astype(np.float32)).reshape(1, s, 1, d)
    with torch.no_grad(), te.autocast(recipe=MX):
        out = _dpa(1, d, pv_bf16=True)(q, q.clone(), v).reshape(s, d)
    want = np.empty((s, d), np.float32)
    for t in range(s):
        p_t = float(np.float32(np.float32(1) / np.float32(t + 1)).astype(ml_dtypes.bfloat16))
        exact = p_t * (kint[: t + 1].sum(axis=0) / 16)  # float64: exact (p_t has 8 bits, the sums 15)
        want[t] = exact.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    _bits_equal(out, torch.from_numpy(want), "O under pv_bf16")
    with torch.no_grad(), te.autocast(recipe=MX):
        plain = _dpa(1, d)(q, q.clone(), v).reshape(s, d)
    assert not torch.equal(plain, out)


def _reference(q, k, v, do, scale: float, pv_bf16: bool, dqkv_bf16: bool):  # noqa: ANN001
    """bhsd float32, causal, MXFP8 E4M3 everywhere (MXFP8BlockScaling's gradients are E4M3 too), P and dS
    unquantized under plain MXFP8 (``mxfp8_softmax="none"``); the options as the module docstring says."""
    s = q.shape[-2]
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    sc = torch.matmul(mx(q, -1), mx(k, -1).transpose(-1, -2)) * scale
    p = torch.softmax(sc.masked_fill(mask, float("-inf")), dim=-1)
    if pv_bf16:
        out = bf16(torch.matmul(bf16(p), bf16(v)))
    else:
        out = torch.matmul(p, mx(v, -2))
    do_r = mx(do, -1)
    dp = torch.matmul(do_r, mx(v, -1).transpose(-1, -2))
    ds = p * (dp - (do_r * out).sum(-1, keepdim=True))
    if dqkv_bf16:
        dv = torch.matmul(bf16(p).transpose(-1, -2), bf16(do))
        dq = torch.matmul(bf16(ds), bf16(k)) * scale
        dk = torch.matmul(bf16(ds).transpose(-1, -2), bf16(q)) * scale
    else:
        dv = torch.matmul(p.transpose(-1, -2), mx(do, -2))
        dq = torch.matmul(ds, mx(k, -2)) * scale
        dk = torch.matmul(ds.transpose(-1, -2), mx(q, -2)) * scale
    return out, (dq, dk, dv)


@pytest.mark.parametrize(("pv_bf16", "dqkv_bf16"), [(True, False), (False, True), (True, True)])
def test_options_forward_backward_bit_exact(pv_bf16: bool, dqkv_bf16: bool) -> None:
    s, h, d = 128, 1, 32
    q, k, v, do = _data(s, h, d, seed=5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with te.autocast(recipe=MX):
        out = _dpa(h, d, pv_bf16=pv_bf16, dqkv_bf16=dqkv_bf16)(*leaves)
    out.backward(do.reshape(out.shape))
    bh = lambda x: x.permute(0, 2, 1, 3)  # noqa: E731
    ref_out, ref_grads = _reference(*(bh(t) for t in (q, k, v, do)), d**-0.5, pv_bf16, dqkv_bf16)
    _bits_equal(bh(out.reshape(1, s, h, d)), ref_out, "O")
    for name, leaf, r in zip("QKV", leaves, ref_grads, strict=True):
        _bits_equal(bh(leaf.grad), r, f"d{name}")


# ---- the leak and its absence ----------------------------------------------------------------------------------
def _perturbed(q, k, v, t: int, factor: float):  # noqa: ANN001
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, t + 1 :] *= factor
    return q2, k2, v2


def _past(dpa: DotProductAttention, q, k, v, do, t: int):  # noqa: ANN001
    """O[:t+1] and dQ[:t+1] of one MXFP8 step."""
    q = q.clone().requires_grad_()
    with te.autocast(recipe=MX):
        out = dpa(q, k, v)
    out.backward(do.reshape(out.shape))
    return out[:, : t + 1].detach(), q.grad[:, : t + 1]


@settings(max_examples=12, deadline=None)
@given(t=st.integers(0, 126), factor=st.sampled_from([0.01, 3.0, 100.0]), seed=st.integers(0, 2**16))
def test_future_tokens_cannot_change_past_outputs_or_query_gradients_under_the_options(t, factor, seed) -> None:  # noqa: ANN001
    """Law: with pv_bf16, O[:t+1] is a function of tokens <= t only, bit for bit, whatever t and whatever
    happens after t; with dqkv_bf16 too, so is dQ[:t+1] (the backward GEMM that reduces over keys)."""
    q, k, v, do = _data(128, 1, 32, seed)
    dpa = _dpa(1, 32, pv_bf16=True, dqkv_bf16=True)
    o_a, dq_a = _past(dpa, q, k, v, do, t)
    o_b, dq_b = _past(dpa, *_perturbed(q, k, v, t, factor), do, t)
    _bits_equal(o_b, o_a, f"O[:{t + 1}] after the tokens after {t} changed")
    _bits_equal(dq_b, dq_a, f"dQ[:{t + 1}] after the tokens after {t} changed")


def test_plain_mxfp8_leaks_and_pv_bf16_does_not_on_te3248s_case() -> None:
    """TE#3248's reproduction: Q = K = 1, V = 0 but V[0, 0] = 2^-20; a future V[16, 0] = 1 in the same
    32-token block raises the block's E8M0 scale to 2^-8 and V[0, 0] flushes to 0 in E4M3, so O[0..15]
    drop to 0.  With pv_bf16, V is not block-scaled: O[t, 0] = BF16(BF16(1 / (t + 1)) * 2^-20), both times."""
    s, d = 128, 128
    q = torch.ones(s, 1, 1, d)
    v = torch.zeros_like(q)
    v[0, 0, 0, 0] = 2.0**-20
    v_future = v.clone()
    v_future[16, 0, 0, 0] = 1.0
    outs = {}
    for opt in (False, True):
        dpa = DotProductAttention(1, d, qkv_format="sbhd", attn_mask_type="causal", pv_bf16=opt)
        with torch.no_grad(), te.autocast(recipe=MX):
            outs[opt] = dpa(q, q.clone(), v)[:16, 0, 0], dpa(q, q.clone(), v_future)[:16, 0, 0]
    base, leaked = outs[False]
    assert bool((base > 0).all()) and bool((leaked == 0).all())  # the leak: every past row changed
    safe_base, safe_future = outs[True]
    _bits_equal(safe_future, safe_base, "O[:16] with pv_bf16")
    want = [np.float32(np.float32(1) / np.float32(t + 1)).astype(ml_dtypes.bfloat16) for t in range(16)]
    want = [np.float32(np.float32(w) * np.float32(2.0**-20)).astype(ml_dtypes.bfloat16) for w in want]
    _bits_equal(safe_base, torch.tensor([float(w) for w in want]), "O[:16, 0] with pv_bf16")


def test_plain_mxfp8_leaks_into_past_query_gradients_and_dqkv_bf16_does_not() -> None:
    """A spike in the keys after t = 47, inside t's 32-token block, moves the MXFP8 K blocked along the
    sequence (for dQ = dS K) and so dQ at t; the forward is unaffected (K is blocked along d for QK^T)."""
    q, k, v, do = _data(128, 1, 32, 0)
    k2 = k.clone()
    k2[:, 48:] *= 100.0
    for opt in (False, True):
        dpa = _dpa(1, 32, dqkv_bf16=opt)
        o_a, dq_a = _past(dpa, q, k, v, do, 47)
        o_b, dq_b = _past(dpa, q, k2, v, do, 47)
        _bits_equal(o_b, o_a, "O[:48]: K's forward blocks run along d")
        if opt:
            _bits_equal(dq_b, dq_a, "dQ[:48] with dqkv_bf16")
        else:
            assert not torch.equal(dq_a, dq_b)


def test_pv_bf16_is_an_mxfp8_option() -> None:
    q, k, v, _ = _data(128, 1, 32, 0)
    for recipe in (DelayedScaling(fp8_dpa=True), Float8CurrentScaling(fp8_dpa=True)):
        for kw in ({"pv_bf16": True}, {"dqkv_bf16": True}):
            with pytest.raises(NotImplementedError, match="options of MXFP8 attention.*" + type(recipe).__name__):
                with torch.no_grad(), te.autocast(recipe=recipe):
                    _dpa(1, 32, **kw)(q, k, v)
    with pytest.raises(TypeError, match="pv_bf16 must be True or False; got 'yes'"):
        _dpa(1, 32, pv_bf16="yes")
    with pytest.raises(TypeError, match="dqkv_bf16 must be True or False; got 1"):
        _dpa(1, 32, dqkv_bf16=1)
    hp = _dpa(1, 32)(q, k, v)  # outside FP8 autocast the options change nothing: float32 attention
    _bits_equal(_dpa(1, 32, pv_bf16=True, dqkv_bf16=True)(q, k, v), hp, "high precision with the options set")


def test_report_section_shows_the_leak_and_its_absence_on_the_same_inputs(tmp_path) -> None:  # noqa: ANN001
    require("matplotlib")
    from fp8sim.report.attention_leak import causal_leak_section

    lines = causal_leak_section(tmp_path, quick=True)  # t = 31, 47, 127: O columns, then dQ columns
    rows = {
        cells[1].strip(): [float(c) for c in cells[2:-1]]
        for cells in (line.split("|") for line in lines if line.startswith("| ") and "attention |" not in line)
    }
    assert rows["current scaling"][0] > 0 and rows["current scaling"][3] > 0  # the global amax moves everything
    assert rows["MXFP8"][1] > 0 and rows["MXFP8"][4] > 0  # t = 47 shares its block with later tokens
    assert rows["MXFP8"][0] == rows["MXFP8"][2] == 0  # block ends
    assert rows["MXFP8, pv_bf16"][:3] == [0, 0, 0] and rows["MXFP8, pv_bf16"][4] > 0
    assert rows["MXFP8, pv_bf16 + dqkv_bf16"] == [0] * 6
    assert "![attention leak](attention_leak.png)" in lines and (tmp_path / "attention_leak.png").stat().st_size > 5000
